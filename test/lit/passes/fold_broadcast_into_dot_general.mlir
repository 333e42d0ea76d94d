// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-broadcast-into-dot-general)' | filecheck %s
// Idempotent: a second run finds no batch broadcast left.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-broadcast-into-dot-general, fold-broadcast-into-dot-general)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-broadcast-into-dot-general)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-broadcast-into-dot-general{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// XLA-COUNT-4: xla: argument_bytes={{[0-9]+}}
// ERR: fold_broadcast_into_dot_general.mlir: error: fold-broadcast-into-dot-general: unknown option 'bogus' (options: none)

// BERT's attention output projection under SDPA, as torch-mlir lowers it:
// x @ W^T with W^T broadcast to the batch -> one dot that contracts W's own dim.
func.func @main(%w: tensor<8x4xf32>, %x: tensor<2x3x4xf32>) -> tensor<2x3x8xf32> {
  %t = stablehlo.transpose %w, dims = [1, 0] : (tensor<8x4xf32>) -> tensor<4x8xf32>
  %b = stablehlo.broadcast_in_dim %t, dims = [1, 2] : (tensor<4x8xf32>) -> tensor<2x4x8xf32>
  %r = stablehlo.reshape %b : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %i = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2] : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %d = stablehlo.dot_general %x, %i, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x3x4xf32>, tensor<2x4x8xf32>) -> tensor<2x3x8xf32>
  return %d : tensor<2x3x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<2x3x4xf32>)
// CHECK-NOT:     broadcast_in_dim
// CHECK-NOT:     transpose
// CHECK:         %[[D:.+]] = stablehlo.dot_general %arg1, %arg0, contracting_dims = [2] x [1] : (tensor<2x3x4xf32>, tensor<8x4xf32>) -> tensor<2x3x8xf32>
// CHECK-NEXT:    return %[[D]]

// -----

// A broadcast weight on the left with no free dims of its own: v^T x per batch.
func.func @main(%v: tensor<4xf32>, %x: tensor<2x4x5xf32>) -> tensor<2x5xf32> {
  %b = stablehlo.broadcast_in_dim %v, dims = [1] : (tensor<4xf32>) -> tensor<2x4xf32>
  %d = stablehlo.dot_general %b, %x, batching_dims = [0] x [0], contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<2x4x5xf32>) -> tensor<2x5xf32>
  return %d : tensor<2x5xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4xf32>, %arg1: tensor<2x4x5xf32>)
// CHECK-NOT:     broadcast_in_dim
// CHECK:         stablehlo.dot_general %arg0, %arg1, contracting_dims = [0] x [1] : (tensor<4xf32>, tensor<2x4x5xf32>) -> tensor<2x5xf32>

// -----

// Not folded: the broadcast is also returned, so it stays materialized anyway.
func.func @main(%w: tensor<4x8xf32>, %x: tensor<2x3x4xf32>) -> (tensor<2x3x8xf32>, tensor<2x4x8xf32>) {
  %b = stablehlo.broadcast_in_dim %w, dims = [1, 2] : (tensor<4x8xf32>) -> tensor<2x4x8xf32>
  %d = stablehlo.dot_general %x, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x3x4xf32>, tensor<2x4x8xf32>) -> tensor<2x3x8xf32>
  return %d, %b : tensor<2x3x8xf32>, tensor<2x4x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<2x3x4xf32>)
// CHECK:         %[[B:.+]] = stablehlo.broadcast_in_dim %arg0, dims = [1, 2]
// CHECK:         stablehlo.dot_general %arg1, %[[B]], batching_dims = [0] x [0], contracting_dims = [2] x [1]

// -----

// Not folded: a broadcast that also expands a size-1 dim (the source is not
// the weight the dot contracts), and one whose batch dim is not the other
// side's leading dim (the result order would change).
func.func @main(%w: tensor<1x8xf32>, %x: tensor<2x3x4xf32>, %u: tensor<4x8xf32>, %y: tensor<3x2x4xf32>) -> (tensor<2x3x8xf32>, tensor<2x3x8xf32>) {
  %b = stablehlo.broadcast_in_dim %w, dims = [1, 2] : (tensor<1x8xf32>) -> tensor<2x4x8xf32>
  %d = stablehlo.dot_general %x, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x3x4xf32>, tensor<2x4x8xf32>) -> tensor<2x3x8xf32>
  %c = stablehlo.broadcast_in_dim %u, dims = [1, 2] : (tensor<4x8xf32>) -> tensor<2x4x8xf32>
  %e = stablehlo.dot_general %y, %c, batching_dims = [1] x [0], contracting_dims = [2] x [1] : (tensor<3x2x4xf32>, tensor<2x4x8xf32>) -> tensor<2x3x8xf32>
  return %d, %e : tensor<2x3x8xf32>, tensor<2x3x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<1x8xf32>
// CHECK:         %[[B:.+]] = stablehlo.broadcast_in_dim %arg0, dims = [1, 2]
// CHECK:         stablehlo.dot_general %arg1, %[[B]], batching_dims = [0] x [0]
// CHECK:         %[[C:.+]] = stablehlo.broadcast_in_dim %arg2, dims = [1, 2]
// CHECK:         stablehlo.dot_general %arg3, %[[C]], batching_dims = [1] x [0]
