// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(widen-one-row-updates)' | filecheck %s
// Idempotent: a widened update has as many non-1 dims as its result.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(widen-one-row-updates, widen-one-row-updates)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(widen-one-row-updates)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The values equal the one-row write's at every start (clamped ones too):
// test/py/test_repeat_fold_bytes.py runs both on XLA.

// XLA-COUNT-3: xla: argument_bytes={{[0-9]+}}

// A decode step's cache write, read by a dot: two rows from s = clamp(0, c,
// N-2) are written, the new row at c - s, the other row its old value.
func.func @main(%cache: tensor<1x2x8x4xf32>, %row: tensor<1x2x1x4xf32>, %i: tensor<i64>, %q: tensor<2x3x4xf32>) -> (tensor<1x2x8x4xf32>, tensor<2x3x8xf32>) {
  %z = stablehlo.constant dense<0> : tensor<i64>
  %u = stablehlo.dynamic_update_slice %cache, %row, %z, %z, %i, %z : (tensor<1x2x8x4xf32>, tensor<1x2x1x4xf32>, tensor<i64>, tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<1x2x8x4xf32>
  %k = stablehlo.reshape %u : (tensor<1x2x8x4xf32>) -> tensor<2x8x4xf32>
  %d = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x3x4xf32>, tensor<2x8x4xf32>) -> tensor<2x3x8xf32>
  return %u, %d : tensor<1x2x8x4xf32>, tensor<2x3x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<1x2x8x4xf32>, %arg1: tensor<1x2x1x4xf32>, %arg2: tensor<i64>, %arg3: tensor<2x3x4xf32>)
// CHECK-DAG:     %[[ZERO:.+]] = stablehlo.constant dense<0> : tensor<i64>
// CHECK-DAG:     %[[LAST:.+]] = stablehlo.constant dense<7> : tensor<i64>
// CHECK-DAG:     %[[PENULT:.+]] = stablehlo.constant dense<6> : tensor<i64>
// CHECK:         %[[C:.+]] = stablehlo.clamp %[[ZERO]], %arg2, %[[LAST]]
// CHECK:         %[[S:.+]] = stablehlo.clamp %[[ZERO]], %[[C]], %[[PENULT]]
// CHECK:         %[[OFF:.+]] = stablehlo.subtract %[[C]], %[[S]]
// CHECK:         %[[OLD:.+]] = stablehlo.dynamic_slice %arg0, %{{.+}}, %{{.+}}, %[[S]], %{{.+}}, sizes = [1, 2, 2, 4]
// CHECK:         %[[NEW:.+]] = stablehlo.broadcast_in_dim %arg1, dims = [0, 1, 2, 3] : (tensor<1x2x1x4xf32>) -> tensor<1x2x2x4xf32>
// CHECK:         %[[IOTA:.+]] = stablehlo.iota dim = 2 : tensor<1x2x2x4xi64>
// CHECK:         %[[OFFS:.+]] = stablehlo.broadcast_in_dim %[[OFF]], dims = []
// CHECK:         %[[EQ:.+]] = stablehlo.compare EQ, %[[IOTA]], %[[OFFS]]
// CHECK:         %[[ROWS:.+]] = stablehlo.select %[[EQ]], %[[NEW]], %[[OLD]]
// CHECK:         %[[U:.+]] = stablehlo.dynamic_update_slice %arg0, %[[ROWS]], %{{.+}}, %{{.+}}, %[[S]], %{{.+}} : (tensor<1x2x8x4xf32>, tensor<1x2x2x4xf32>
// CHECK:         stablehlo.reshape %[[U]]
// CHECK-NOT:     dynamic_update_slice

// -----

// Never fires: a one-row write nothing dots over, and a write of several
// rows (its update has as many non-1 dims as the result).
func.func @main(%cache: tensor<2x8x4xf32>, %row: tensor<2x1x4xf32>, %rows: tensor<2x3x4xf32>, %i: tensor<i64>, %q: tensor<2x3x4xf32>) -> (tensor<2x8x4xf32>, tensor<2x3x8xf32>) {
  %z = stablehlo.constant dense<0> : tensor<i64>
  %a = stablehlo.dynamic_update_slice %cache, %row, %z, %i, %z : (tensor<2x8x4xf32>, tensor<2x1x4xf32>, tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<2x8x4xf32>
  %b = stablehlo.dynamic_update_slice %cache, %rows, %z, %i, %z : (tensor<2x8x4xf32>, tensor<2x3x4xf32>, tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<2x8x4xf32>
  %d = stablehlo.dot_general %q, %b, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x3x4xf32>, tensor<2x8x4xf32>) -> tensor<2x3x8xf32>
  return %a, %d : tensor<2x8x4xf32>, tensor<2x3x8xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-NOT:     dynamic_slice
// CHECK:         stablehlo.dynamic_update_slice %arg0, %arg1, {{.+}} : (tensor<2x8x4xf32>, tensor<2x1x4xf32>
// CHECK:         stablehlo.dynamic_update_slice %arg0, %arg2, {{.+}} : (tensor<2x8x4xf32>, tensor<2x3x4xf32>
// CHECK-NOT:     dynamic_slice

// -----

// A bf16 cache a dot reads through a convert to f32 (SDPA's upcast): the
// write is widened all the same.
func.func @main(%cache: tensor<1x2x8x4xbf16>, %row: tensor<1x2x1x4xbf16>, %i: tensor<i64>, %q: tensor<2x3x4xf32>) -> (tensor<1x2x8x4xbf16>, tensor<2x3x8xf32>) {
  %z = stablehlo.constant dense<0> : tensor<i64>
  %u = stablehlo.dynamic_update_slice %cache, %row, %z, %z, %i, %z : (tensor<1x2x8x4xbf16>, tensor<1x2x1x4xbf16>, tensor<i64>, tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<1x2x8x4xbf16>
  %c = stablehlo.convert %u : (tensor<1x2x8x4xbf16>) -> tensor<1x2x8x4xf32>
  %k = stablehlo.reshape %c : (tensor<1x2x8x4xf32>) -> tensor<2x8x4xf32>
  %d = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x3x4xf32>, tensor<2x8x4xf32>) -> tensor<2x3x8xf32>
  return %u, %d : tensor<1x2x8x4xbf16>, tensor<2x3x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<1x2x8x4xbf16>
// CHECK:         %[[U:.+]] = stablehlo.dynamic_update_slice %arg0, %{{.+}} : (tensor<1x2x8x4xbf16>, tensor<1x2x2x4xbf16>
// CHECK:         stablehlo.convert %[[U]]
