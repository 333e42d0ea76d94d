// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-transpose-into-dot-general)' | filecheck %s
// Idempotent: a second run finds no transposed operand left.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-transpose-into-dot-general, fold-transpose-into-dot-general)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-transpose-into-dot-general)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-transpose-into-dot-general{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// XLA-COUNT-6: xla: argument_bytes={{[0-9]+}}
// ERR: fold_transpose_into_dot_general.mlir: error: fold-transpose-into-dot-general: unknown option 'bogus' (options: none)

// nn.Linear as torch-mlir lowers it: x @ W^T contracts W's own dim 1 instead.
func.func @main(%w: tensor<4x8xf32>, %x: tensor<2x8xf32>) -> tensor<2x4xf32> {
  %0 = stablehlo.transpose %w, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %1 = stablehlo.dot_general %x, %0, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
  return %1 : tensor<2x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<2x8xf32>)
// CHECK-NOT:     stablehlo.transpose
// CHECK:         %[[DOT:.+]] = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [1] : (tensor<2x8xf32>, tensor<4x8xf32>) -> tensor<2x4xf32>
// CHECK-NEXT:    return %[[DOT]]

// -----

// A transposed left operand: W^T @ x.
func.func @main(%w: tensor<8x4xf32>, %x: tensor<8x2xf32>) -> tensor<4x2xf32> {
  %0 = stablehlo.transpose %w, dims = [1, 0] : (tensor<8x4xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.dot_general %0, %x, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>
  return %1 : tensor<4x2xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<8x2xf32>)
// CHECK-NOT:     stablehlo.transpose
// CHECK:         stablehlo.dot_general %arg0, %arg1, contracting_dims = [0] x [0] : (tensor<8x4xf32>, tensor<8x2xf32>) -> tensor<4x2xf32>

// -----

// Batched: the batch dimension is remapped through the permutation too.
func.func @main(%k: tensor<3x4x8xf32>, %q: tensor<3x2x8xf32>) -> tensor<3x2x4xf32> {
  %0 = stablehlo.transpose %k, dims = [0, 2, 1] : (tensor<3x4x8xf32>) -> tensor<3x8x4xf32>
  %1 = stablehlo.dot_general %q, %0, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<3x2x8xf32>, tensor<3x8x4xf32>) -> tensor<3x2x4xf32>
  return %1 : tensor<3x2x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<3x4x8xf32>, %arg1: tensor<3x2x8xf32>)
// CHECK-NOT:     stablehlo.transpose
// CHECK:         stablehlo.dot_general %arg1, %arg0, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<3x2x8xf32>, tensor<3x4x8xf32>) -> tensor<3x2x4xf32>

// -----

// Not folded: the two free dimensions would swap places in the result.
func.func @main(%a: tensor<4x5x8xf32>, %x: tensor<2x8xf32>) -> tensor<2x5x4xf32> {
  %0 = stablehlo.transpose %a, dims = [2, 1, 0] : (tensor<4x5x8xf32>) -> tensor<8x5x4xf32>
  %1 = stablehlo.dot_general %x, %0, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x5x4xf32>) -> tensor<2x5x4xf32>
  return %1 : tensor<2x5x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x5x8xf32>, %arg1: tensor<2x8xf32>)
// CHECK:         %[[T:.+]] = stablehlo.transpose %arg0, dims = [2, 1, 0]
// CHECK:         stablehlo.dot_general %arg1, %[[T]], contracting_dims = [1] x [0]

// -----

// A transpose that is also returned stays for that use; the dot reads W.
func.func @main(%w: tensor<4x8xf32>, %x: tensor<2x8xf32>) -> (tensor<2x4xf32>, tensor<8x4xf32>) {
  %0 = stablehlo.transpose %w, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %1 = stablehlo.dot_general %x, %0, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
  return %1, %0 : tensor<2x4xf32>, tensor<8x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<2x8xf32>)
// CHECK-DAG:     %[[T:.+]] = stablehlo.transpose %arg0, dims = [1, 0]
// CHECK-DAG:     %[[DOT:.+]] = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [1]
// CHECK:         return %[[DOT]], %[[T]]

// -----

// Precision and other attributes of the dot are kept.
func.func @main(%w: tensor<4x8xf32>, %x: tensor<2x8xf32>) -> tensor<2x4xf32> {
  %0 = stablehlo.transpose %w, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %1 = stablehlo.dot_general %x, %0, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
  return %1 : tensor<2x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<2x8xf32>)
// CHECK:         stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST]
