// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(scatter-to-dynamic-update-slice)' | filecheck %s
// Idempotent: a second run finds no scatter left.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(scatter-to-dynamic-update-slice, scatter-to-dynamic-update-slice)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(scatter-to-dynamic-update-slice)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The report counts rewritten and guarded scatters.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(scatter-to-dynamic-update-slice)' --print-reports 2>&1 >/dev/null | filecheck %s --check-prefix=REPORT

// XLA-COUNT-4: xla: argument_bytes={{[0-9]+}}
// REPORT: scatter-to-dynamic-update-slice: 1 scatters are dynamic-update-slices (0 guarded against out-of-bounds indices)
// REPORT: scatter-to-dynamic-update-slice: 1 scatters are dynamic-update-slices (1 guarded against out-of-bounds indices)
// REPORT: scatter-to-dynamic-update-slice: 1 scatters are dynamic-update-slices (1 guarded against out-of-bounds indices)
// REPORT: scatter-to-dynamic-update-slice: 1 scatters are dynamic-update-slices (0 guarded against out-of-bounds indices)

// cache[:, 3:4].copy_(new[:, None]) as torch-mlir lowers it: a constant
// index in bounds -> the plain dynamic_update_slice.
func.func @main(%cache: tensor<2x8x4xf32>, %new: tensor<2x4xf32>) -> tensor<2x8x4xf32> {
  %c = stablehlo.constant dense<3> : tensor<1x1xi64>
  %0 = stablehlo.reshape %new : (tensor<2x4xf32>) -> tensor<2x1x4xf32>
  %1 = "stablehlo.scatter"(%cache, %c, %0) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    stablehlo.return %upd : tensor<f32>
  }) : (tensor<2x8x4xf32>, tensor<1x1xi64>, tensor<2x1x4xf32>) -> tensor<2x8x4xf32>
  return %1 : tensor<2x8x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<2x8x4xf32>, %arg1: tensor<2x4xf32>)
// CHECK-DAG:     %[[ZERO:.+]] = stablehlo.constant dense<0> : tensor<i64>
// CHECK-DAG:     %[[THREE:.+]] = stablehlo.constant dense<3> : tensor<i64>
// CHECK:         %[[U:.+]] = stablehlo.reshape %arg1 : (tensor<2x4xf32>) -> tensor<2x1x4xf32>
// CHECK-NOT:     stablehlo.scatter
// CHECK-NOT:     stablehlo.select
// CHECK:         %[[R:.+]] = stablehlo.dynamic_update_slice %arg0, %[[U]], %[[ZERO]], %[[THREE]], %[[ZERO]] : (tensor<2x8x4xf32>, tensor<2x1x4xf32>, tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<2x8x4xf32>
// CHECK:         return %[[R]]

// -----

// cache.index_copy_(1, pos, new) after window-scatter-indices: a dynamic
// index. Out of bounds, scatter skips the window while a dynamic-update-slice
// clamps, so the window read at the (clamped) start is written back unless
// 0 <= pos <= 8 - 1.
func.func @main(%cache: tensor<2x8x4xf32>, %new: tensor<2x1x4xf32>, %pos: tensor<1x1xi64>) -> tensor<2x8x4xf32> {
  %1 = "stablehlo.scatter"(%cache, %pos, %new) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    stablehlo.return %upd : tensor<f32>
  }) : (tensor<2x8x4xf32>, tensor<1x1xi64>, tensor<2x1x4xf32>) -> tensor<2x8x4xf32>
  return %1 : tensor<2x8x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<2x8x4xf32>, %arg1: tensor<2x1x4xf32>, %arg2: tensor<1x1xi64>)
// CHECK-DAG:     %[[LIMIT:.+]] = stablehlo.constant dense<7> : tensor<i64>
// CHECK-DAG:     %[[ZERO:.+]] = stablehlo.constant dense<0> : tensor<i64>
// CHECK:         %[[FLAT:.+]] = stablehlo.reshape %arg2 : (tensor<1x1xi64>) -> tensor<1xi64>
// CHECK:         %[[PIECE:.+]] = stablehlo.slice %[[FLAT]] [0:1]
// CHECK:         %[[POS:.+]] = stablehlo.reshape %[[PIECE]] : (tensor<1xi64>) -> tensor<i64>
// CHECK:         %[[GE:.+]] = stablehlo.compare GE, %[[POS]], %[[ZERO]], SIGNED
// CHECK:         %[[LE:.+]] = stablehlo.compare LE, %[[POS]], %[[LIMIT]], SIGNED
// CHECK:         %[[FITS:.+]] = stablehlo.and %[[GE]], %[[LE]] : tensor<i1>
// CHECK:         %[[OLD:.+]] = stablehlo.dynamic_slice %arg0, %[[ZERO]], %[[POS]], %[[ZERO]], sizes = [2, 1, 4]
// CHECK:         %[[W:.+]] = stablehlo.select %[[FITS]], %arg1, %[[OLD]] : tensor<i1>, tensor<2x1x4xf32>
// CHECK:         %[[R:.+]] = stablehlo.dynamic_update_slice %arg0, %[[W]], %[[ZERO]], %[[POS]], %[[ZERO]]
// CHECK:         return %[[R]]

// -----

// Two i32 index components in front (index_vector_dim = 0), mapped to
// operand dims 2 and 0 in that order; the window is 1x2x3.
func.func @main(%x: tensor<5x6x7xf32>, %idx: tensor<2xi32>, %u: tensor<2x3xf32>) -> tensor<5x6x7xf32> {
  %1 = "stablehlo.scatter"(%x, %idx, %u) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [2, 0], index_vector_dim = 0>}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    stablehlo.return %upd : tensor<f32>
  }) : (tensor<5x6x7xf32>, tensor<2xi32>, tensor<2x3xf32>) -> tensor<5x6x7xf32>
  return %1 : tensor<5x6x7xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<5x6x7xf32>, %arg1: tensor<2xi32>, %arg2: tensor<2x3xf32>)
// CHECK:         %[[U:.+]] = stablehlo.reshape %arg2 : (tensor<2x3xf32>) -> tensor<1x2x3xf32>
// CHECK:         %[[D2:.+]] = stablehlo.reshape {{.+}} : (tensor<1xi32>) -> tensor<i32>
// CHECK:         %[[D0:.+]] = stablehlo.reshape {{.+}} : (tensor<1xi32>) -> tensor<i32>
// CHECK:         stablehlo.dynamic_slice %arg0, %[[D0]], %{{.+}}, %[[D2]], sizes = [1, 2, 3]
// CHECK:         stablehlo.dynamic_update_slice %arg0, %{{.+}}, %[[D0]], %{{.+}}, %[[D2]] : (tensor<5x6x7xf32>, tensor<1x2x3xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<5x6x7xf32>

// -----

// bf16, a window as large as the operand along dim 1, the index at the
// largest start that fits: the plain dynamic_update_slice.
func.func @main(%x: tensor<4x3xbf16>, %u: tensor<1x3xbf16>) -> tensor<4x3xbf16> {
  %c = stablehlo.constant dense<[[3, 0]]> : tensor<1x2xi64>
  %1 = "stablehlo.scatter"(%x, %c, %u) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<bf16>, %upd: tensor<bf16>):
    stablehlo.return %upd : tensor<bf16>
  }) : (tensor<4x3xbf16>, tensor<1x2xi64>, tensor<1x3xbf16>) -> tensor<4x3xbf16>
  return %1 : tensor<4x3xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x3xbf16>, %arg1: tensor<1x3xbf16>)
// CHECK-DAG:     %[[ZERO:.+]] = stablehlo.constant dense<0> : tensor<i64>
// CHECK-DAG:     %[[THREE:.+]] = stablehlo.constant dense<3> : tensor<i64>
// CHECK-NOT:     stablehlo.select
// CHECK:         stablehlo.dynamic_update_slice %arg0, %arg1, %[[THREE]], %[[ZERO]] : (tensor<4x3xbf16>, tensor<1x3xbf16>, tensor<i64>, tensor<i64>) -> tensor<4x3xbf16>
