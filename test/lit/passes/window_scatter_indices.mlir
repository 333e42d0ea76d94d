// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(window-scatter-indices)' | filecheck %s
// Idempotent: a windowed scatter is not rewritten again.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(window-scatter-indices, window-scatter-indices)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(window-scatter-indices)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(window-scatter-indices{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// XLA-COUNT-4: xla: argument_bytes={{[0-9]+}}
// ERR: window_scatter_indices.mlir: error: window-scatter-indices: unknown option 'bogus' (options: none)

// cache.index_copy_(1, pos, k) as torch-mlir lowers it: per-element indices
// (arange over dims 0 and 2, pos broadcast) -> windows over dims 0 and 2.
func.func @main(%cache: tensor<4x16x8xf32>, %pos: tensor<1x1xi64>, %k: tensor<4x1x8xf32>) -> tensor<4x16x8xf32> {
  %one4 = stablehlo.constant dense<1> : tensor<4xi64>
  %zero4 = stablehlo.constant dense<0> : tensor<4xi64>
  %i4 = stablehlo.iota dim = 0 : tensor<4xi64>
  %m4 = stablehlo.multiply %i4, %one4 : tensor<4xi64>
  %a4 = stablehlo.add %m4, %zero4 : tensor<4xi64>
  %r4 = stablehlo.reshape %a4 : (tensor<4xi64>) -> tensor<4x1x1xi64>
  %b0 = stablehlo.broadcast_in_dim %r4, dims = [0, 1, 2] : (tensor<4x1x1xi64>) -> tensor<4x1x8xi64>
  %c0 = stablehlo.reshape %b0 : (tensor<4x1x8xi64>) -> tensor<4x1x8x1xi64>
  %b1 = stablehlo.broadcast_in_dim %pos, dims = [1, 2] : (tensor<1x1xi64>) -> tensor<4x1x8xi64>
  %c1 = stablehlo.reshape %b1 : (tensor<4x1x8xi64>) -> tensor<4x1x8x1xi64>
  %i8 = stablehlo.iota dim = 0 : tensor<8xi64>
  %b2 = stablehlo.broadcast_in_dim %i8, dims = [2] : (tensor<8xi64>) -> tensor<4x1x8xi64>
  %c2 = stablehlo.reshape %b2 : (tensor<4x1x8xi64>) -> tensor<4x1x8x1xi64>
  %idx = stablehlo.concatenate %c0, %c1, %c2, dim = 3 : (tensor<4x1x8x1xi64>, tensor<4x1x8x1xi64>, tensor<4x1x8x1xi64>) -> tensor<4x1x8x3xi64>
  %0 = "stablehlo.scatter"(%cache, %idx, %k) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1, 2], scatter_dims_to_operand_dims = [0, 1, 2], index_vector_dim = 3>, unique_indices = false}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    stablehlo.return %new : tensor<f32>
  }) : (tensor<4x16x8xf32>, tensor<4x1x8x3xi64>, tensor<4x1x8xf32>) -> tensor<4x16x8xf32>
  return %0 : tensor<4x16x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x16x8xf32>, %arg1: tensor<1x1xi64>, %arg2: tensor<4x1x8xf32>)
// CHECK:         %[[I:.+]] = stablehlo.concatenate {{.+}} dim = 1 : (tensor<1x1xi64>) -> tensor<1x1xi64>
// CHECK:         "stablehlo.scatter"(%arg0, %[[I]], %arg2) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>, unique_indices = false}>
// CHECK:         stablehlo.return
// CHECK:         (tensor<4x16x8xf32>, tensor<1x1xi64>, tensor<4x1x8xf32>) -> tensor<4x16x8xf32>

// -----

// An accumulating combiner is kept as is: elements map to the same places.
func.func @main(%cache: tensor<16x8xf32>, %pos: tensor<3xi64>, %k: tensor<3x8xf32>) -> tensor<16x8xf32> {
  %b0 = stablehlo.broadcast_in_dim %pos, dims = [0] : (tensor<3xi64>) -> tensor<3x8xi64>
  %c0 = stablehlo.reshape %b0 : (tensor<3x8xi64>) -> tensor<3x8x1xi64>
  %i8 = stablehlo.iota dim = 0 : tensor<8xi64>
  %b1 = stablehlo.broadcast_in_dim %i8, dims = [1] : (tensor<8xi64>) -> tensor<3x8xi64>
  %c1 = stablehlo.reshape %b1 : (tensor<3x8xi64>) -> tensor<3x8x1xi64>
  %idx = stablehlo.concatenate %c0, %c1, dim = 2 : (tensor<3x8x1xi64>, tensor<3x8x1xi64>) -> tensor<3x8x2xi64>
  %0 = "stablehlo.scatter"(%cache, %idx, %k) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    %s = stablehlo.add %old, %new : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<16x8xf32>, tensor<3x8x2xi64>, tensor<3x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<16x8xf32>, %arg1: tensor<3xi64>, %arg2: tensor<3x8xf32>)
// CHECK:         %[[I:.+]] = stablehlo.concatenate {{.+}} dim = 1 : (tensor<3x1xi64>) -> tensor<3x1xi64>
// CHECK:         "stablehlo.scatter"(%arg0, %[[I]], %arg2) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}>
// CHECK:         stablehlo.add
// CHECK:         (tensor<16x8xf32>, tensor<3x1xi64>, tensor<3x8xf32>) -> tensor<16x8xf32>

// -----

// Not rewritten: a general index tensor varies along every update dimension.
func.func @main(%cache: tensor<16x8xf32>, %rows: tensor<3x8xi64>, %k: tensor<3x8xf32>) -> tensor<16x8xf32> {
  %c0 = stablehlo.reshape %rows : (tensor<3x8xi64>) -> tensor<3x8x1xi64>
  %i8 = stablehlo.iota dim = 0 : tensor<8xi64>
  %b1 = stablehlo.broadcast_in_dim %i8, dims = [1] : (tensor<8xi64>) -> tensor<3x8xi64>
  %c1 = stablehlo.reshape %b1 : (tensor<3x8xi64>) -> tensor<3x8x1xi64>
  %idx = stablehlo.concatenate %c0, %c1, dim = 2 : (tensor<3x8x1xi64>, tensor<3x8x1xi64>) -> tensor<3x8x2xi64>
  %0 = "stablehlo.scatter"(%cache, %idx, %k) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    stablehlo.return %new : tensor<f32>
  }) : (tensor<16x8xf32>, tensor<3x8x2xi64>, tensor<3x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<16x8xf32>, %arg1: tensor<3x8xi64>, %arg2: tensor<3x8xf32>)
// CHECK:         "stablehlo.scatter"({{.+}}) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>}>
// CHECK:         (tensor<16x8xf32>, tensor<3x8x2xi64>, tensor<3x8xf32>) -> tensor<16x8xf32>

// -----

// Not rewritten: the arange is strided (x * 2), so it does not enumerate a window.
func.func @main(%cache: tensor<16x16xf32>, %pos: tensor<3xi64>, %k: tensor<3x8xf32>) -> tensor<16x16xf32> {
  %b0 = stablehlo.broadcast_in_dim %pos, dims = [0] : (tensor<3xi64>) -> tensor<3x8xi64>
  %c0 = stablehlo.reshape %b0 : (tensor<3x8xi64>) -> tensor<3x8x1xi64>
  %two = stablehlo.constant dense<2> : tensor<8xi64>
  %i8 = stablehlo.iota dim = 0 : tensor<8xi64>
  %s8 = stablehlo.multiply %i8, %two : tensor<8xi64>
  %b1 = stablehlo.broadcast_in_dim %s8, dims = [1] : (tensor<8xi64>) -> tensor<3x8xi64>
  %c1 = stablehlo.reshape %b1 : (tensor<3x8xi64>) -> tensor<3x8x1xi64>
  %idx = stablehlo.concatenate %c0, %c1, dim = 2 : (tensor<3x8x1xi64>, tensor<3x8x1xi64>) -> tensor<3x8x2xi64>
  %0 = "stablehlo.scatter"(%cache, %idx, %k) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    stablehlo.return %new : tensor<f32>
  }) : (tensor<16x16xf32>, tensor<3x8x2xi64>, tensor<3x8xf32>) -> tensor<16x16xf32>
  return %0 : tensor<16x16xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<16x16xf32>, %arg1: tensor<3xi64>, %arg2: tensor<3x8xf32>)
// CHECK:         "stablehlo.scatter"({{.+}}) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>}>
