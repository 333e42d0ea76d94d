// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(returned-matvec-as-reduce)' | filecheck %s
// Idempotent: nothing is left to rewrite on a second run.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(returned-matvec-as-reduce, returned-matvec-as-reduce)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(returned-matvec-as-reduce)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(returned-matvec-as-reduce{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// XLA-COUNT-4: xla: argument_bytes={{[0-9]+}}
// ERR: returned_matvec_as_reduce.mlir: error: returned-matvec-as-reduce: unknown option 'bogus' (options: none)

// GPT-2's logits: one row times the transposed embedding, reshaped and returned.
func.func @main(%x: tensor<1x8xf32>, %w: tensor<16x8xf32>) -> tensor<1x1x16xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<1x8xf32>, tensor<16x8xf32>) -> tensor<1x16xf32>
  %1 = stablehlo.reshape %0 : (tensor<1x16xf32>) -> tensor<1x1x16xf32>
  return %1 : tensor<1x1x16xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<1x8xf32>, %arg1: tensor<16x8xf32>)
// CHECK-NOT:     dot_general
// CHECK-DAG:     %[[X:.+]] = stablehlo.broadcast_in_dim %arg0, dims = [0, 2] : (tensor<1x8xf32>) -> tensor<1x16x8xf32>
// CHECK-DAG:     %[[W:.+]] = stablehlo.broadcast_in_dim %arg1, dims = [1, 2] : (tensor<16x8xf32>) -> tensor<1x16x8xf32>
// CHECK:         %[[M:.+]] = stablehlo.multiply %[[X]], %[[W]] : tensor<1x16x8xf32>
// CHECK:         %[[R:.+]] = stablehlo.reduce(%[[M]] init: %{{.+}}) applies stablehlo.add across dimensions = [2] : (tensor<1x16x8xf32>, tensor<f32>) -> tensor<1x16xf32>
// CHECK:         %[[S:.+]] = stablehlo.reshape %[[R]] : (tensor<1x16xf32>) -> tensor<1x1x16xf32>
// CHECK:         return %[[S]]

// -----

// Not rewritten: a matrix-matrix product, a dot whose result is computed on,
// and an integer dot.
func.func @main(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %v: tensor<1x8xf32>, %i: tensor<1x8xi32>, %j: tensor<16x8xi32>) -> (tensor<4x16xf32>, tensor<1x16xf32>, tensor<1x16xi32>) {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %1 = stablehlo.dot_general %v, %w, contracting_dims = [1] x [1] : (tensor<1x8xf32>, tensor<16x8xf32>) -> tensor<1x16xf32>
  %2 = stablehlo.add %1, %1 : tensor<1x16xf32>
  %3 = stablehlo.dot_general %i, %j, contracting_dims = [1] x [1] : (tensor<1x8xi32>, tensor<16x8xi32>) -> tensor<1x16xi32>
  return %0, %2, %3 : tensor<4x16xf32>, tensor<1x16xf32>, tensor<1x16xi32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>
// CHECK-NOT:     stablehlo.reduce
// CHECK-COUNT-3: stablehlo.dot_general
// CHECK-NOT:     stablehlo.reduce
// CHECK:         return

// -----

// The vector on the right: W x with x of shape 8x1.
func.func @main(%w: tensor<16x8xf32>, %x: tensor<8x1xf32>) -> tensor<16x1xf32> {
  %0 = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<16x8xf32>, tensor<8x1xf32>) -> tensor<16x1xf32>
  return %0 : tensor<16x1xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<16x8xf32>, %arg1: tensor<8x1xf32>)
// CHECK-NOT:     dot_general
// CHECK:         %[[R:.+]] = stablehlo.reduce({{.+}}) applies stablehlo.add across dimensions = [2] : (tensor<16x1x8xf32>, tensor<f32>) -> tensor<16x1xf32>
// CHECK:         return %[[R]]

// -----

// One query against a KV cache per head: batched, rewritten too.
func.func @main(%q: tensor<2x1x8xf32>, %k: tensor<2x16x8xf32>) -> tensor<2x1x16xf32> {
  %0 = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x1x8xf32>, tensor<2x16x8xf32>) -> tensor<2x1x16xf32>
  return %0 : tensor<2x1x16xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<2x1x8xf32>, %arg1: tensor<2x16x8xf32>)
// CHECK-NOT:     dot_general
// CHECK-DAG:     stablehlo.broadcast_in_dim %arg0, dims = [0, 1, 3] : (tensor<2x1x8xf32>) -> tensor<2x1x16x8xf32>
// CHECK-DAG:     stablehlo.broadcast_in_dim %arg1, dims = [0, 2, 3] : (tensor<2x16x8xf32>) -> tensor<2x1x16x8xf32>
// CHECK:         %[[R:.+]] = stablehlo.reduce({{.+}}) applies stablehlo.add across dimensions = [3] : (tensor<2x1x16x8xf32>, tensor<f32>) -> tensor<2x1x16xf32>
// CHECK:         return %[[R]]
