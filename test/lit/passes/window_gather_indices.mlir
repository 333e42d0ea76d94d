// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(window-gather-indices)' | filecheck %s
// Idempotent: a windowed gather is not rewritten again.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(window-gather-indices, window-gather-indices)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(window-gather-indices)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The values equal the per-element gather's: test/py/test_gather_bytes.py
// runs both on XLA.

// XLA-COUNT-3: xla: argument_bytes={{[0-9]+}}

// torch.gather(scores, 2, rel) as torch-mlir lowers it (DeBERTa-v2's c2p):
// per-element indices (iota over dims 0 and 1, rel broadcast along dim 0).
// Dim 0 becomes a window; rel varies along dim 1, so dim 1 stays an index.
func.func @main(%scores: tensor<2x4x8xf32>, %rel: tensor<1x4x4xi64>) -> tensor<2x4x4xf32> {
  %b = stablehlo.broadcast_in_dim %rel, dims = [0, 1, 2] : (tensor<1x4x4xi64>) -> tensor<2x4x4xi64>
  %i0 = stablehlo.iota dim = 0 : tensor<2x4x4x1xi64>
  %i1 = stablehlo.iota dim = 1 : tensor<2x4x4x1xi64>
  %r = stablehlo.reshape %b : (tensor<2x4x4xi64>) -> tensor<2x4x4x1xi64>
  %idx = stablehlo.concatenate %i0, %i1, %r, dim = 3 : (tensor<2x4x4x1xi64>, tensor<2x4x4x1xi64>, tensor<2x4x4x1xi64>) -> tensor<2x4x4x3xi64>
  %g = "stablehlo.gather"(%scores, %idx) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1, 2], start_index_map = [0, 1, 2], index_vector_dim = 3>, slice_sizes = array<i64: 1, 1, 1>}> : (tensor<2x4x8xf32>, tensor<2x4x4x3xi64>) -> tensor<2x4x4xf32>
  return %g : tensor<2x4x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<2x4x8xf32>, %arg1: tensor<1x4x4xi64>)
// CHECK:         %[[I:.+]] = stablehlo.concatenate {{.+}} dim = 2 : (tensor<4x4x1xi64>, tensor<4x4x1xi64>) -> tensor<4x4x2xi64>
// CHECK:         "stablehlo.gather"(%arg0, %[[I]]) <{dimension_numbers = #stablehlo.gather<offset_dims = [0], collapsed_slice_dims = [1, 2], start_index_map = [1, 2], index_vector_dim = 2>, slice_sizes = array<i64: 2, 1, 1>}> : (tensor<2x4x8xf32>, tensor<4x4x2xi64>) -> tensor<2x4x4xf32>

// -----

// An arange broadcast along a dimension (not an iota of the index shape)
// is a window too; both leading dims become windows over dims 0 and 1.
func.func @main(%x: tensor<3x5x8xf32>, %col: tensor<8xi64>) -> tensor<3x5x8xf32> {
  %a3 = stablehlo.iota dim = 0 : tensor<3xi64>
  %b0 = stablehlo.broadcast_in_dim %a3, dims = [0] : (tensor<3xi64>) -> tensor<3x5x8xi64>
  %c0 = stablehlo.reshape %b0 : (tensor<3x5x8xi64>) -> tensor<3x5x8x1xi64>
  %i1 = stablehlo.iota dim = 1 : tensor<3x5x8x1xi64>
  %b2 = stablehlo.broadcast_in_dim %col, dims = [2] : (tensor<8xi64>) -> tensor<3x5x8xi64>
  %c2 = stablehlo.reshape %b2 : (tensor<3x5x8xi64>) -> tensor<3x5x8x1xi64>
  %idx = stablehlo.concatenate %c0, %i1, %c2, dim = 3 : (tensor<3x5x8x1xi64>, tensor<3x5x8x1xi64>, tensor<3x5x8x1xi64>) -> tensor<3x5x8x3xi64>
  %g = "stablehlo.gather"(%x, %idx) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1, 2], start_index_map = [0, 1, 2], index_vector_dim = 3>, slice_sizes = array<i64: 1, 1, 1>}> : (tensor<3x5x8xf32>, tensor<3x5x8x3xi64>) -> tensor<3x5x8xf32>
  return %g : tensor<3x5x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<3x5x8xf32>, %arg1: tensor<8xi64>)
// CHECK:         %[[I:.+]] = stablehlo.concatenate {{.+}} dim = 1 : (tensor<8x1xi64>) -> tensor<8x1xi64>
// CHECK:         "stablehlo.gather"(%arg0, %[[I]]) <{dimension_numbers = #stablehlo.gather<offset_dims = [0, 1], collapsed_slice_dims = [2], start_index_map = [2], index_vector_dim = 1>, slice_sizes = array<i64: 3, 5, 1>}> : (tensor<3x5x8xf32>, tensor<8x1xi64>) -> tensor<3x5x8xf32>

// -----

// Never fires: a general index tensor (no component is an iota), and an
// iota along a dimension every other component varies along.
func.func @main(%x: tensor<2x8xf32>, %idx: tensor<2x4x2xi64>, %rel: tensor<2x4xi64>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
  %g = "stablehlo.gather"(%x, %idx) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 2>, slice_sizes = array<i64: 1, 1>}> : (tensor<2x8xf32>, tensor<2x4x2xi64>) -> tensor<2x4xf32>
  %i0 = stablehlo.iota dim = 0 : tensor<2x4x1xi64>
  %r = stablehlo.reshape %rel : (tensor<2x4xi64>) -> tensor<2x4x1xi64>
  %idx2 = stablehlo.concatenate %i0, %r, dim = 2 : (tensor<2x4x1xi64>, tensor<2x4x1xi64>) -> tensor<2x4x2xi64>
  %h = "stablehlo.gather"(%x, %idx2) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 2>, slice_sizes = array<i64: 1, 1>}> : (tensor<2x8xf32>, tensor<2x4x2xi64>) -> tensor<2x4xf32>
  return %g, %h : tensor<2x4xf32>, tensor<2x4xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-NOT:     offset_dims
// CHECK:         "stablehlo.gather"(%arg0, %arg1) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 2>
// CHECK:         "stablehlo.gather"(%arg0, %{{.+}}) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0, 1], start_index_map = [0, 1], index_vector_dim = 2>
// CHECK-NOT:     offset_dims
