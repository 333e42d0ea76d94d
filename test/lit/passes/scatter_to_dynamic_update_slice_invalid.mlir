// Scatters the pass must leave alone: each stays a scatter.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(scatter-to-dynamic-update-slice)' | filecheck %s
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(scatter-to-dynamic-update-slice)' --print-reports 2>&1 >/dev/null | filecheck %s --check-prefix=REPORT
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(scatter-to-dynamic-update-slice{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// REPORT-COUNT-8: scatter-to-dynamic-update-slice: 0 scatters are dynamic-update-slices (0 guarded against out-of-bounds indices)
// REPORT-NOT: scatter-to-dynamic-update-slice: 1
// ERR: scatter_to_dynamic_update_slice_invalid.mlir: error: scatter-to-dynamic-update-slice: unknown option 'bogus' (options: none)

// Two index vectors (index_copy_ of two rows): order and duplicates matter.
func.func @main(%cache: tensor<2x8x4xf32>, %new: tensor<2x2x4xf32>, %pos: tensor<2x1xi64>) -> tensor<2x8x4xf32> {
  %1 = "stablehlo.scatter"(%cache, %pos, %new) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    stablehlo.return %upd : tensor<f32>
  }) : (tensor<2x8x4xf32>, tensor<2x1xi64>, tensor<2x2x4xf32>) -> tensor<2x8x4xf32>
  return %1 : tensor<2x8x4xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         "stablehlo.scatter"
// CHECK-NOT:     dynamic_update_slice

// -----

// A combiner that computes (index_add_ of one row).
func.func @main(%cache: tensor<2x8x4xf32>, %new: tensor<2x1x4xf32>, %pos: tensor<1x1xi64>) -> tensor<2x8x4xf32> {
  %1 = "stablehlo.scatter"(%cache, %pos, %new) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    %s = stablehlo.add %old, %upd : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<2x8x4xf32>, tensor<1x1xi64>, tensor<2x1x4xf32>) -> tensor<2x8x4xf32>
  return %1 : tensor<2x8x4xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         "stablehlo.scatter"
// CHECK:         stablehlo.add
// CHECK-NOT:     dynamic_update_slice

// -----

// A region that keeps the old value.
func.func @main(%cache: tensor<2x8x4xf32>, %new: tensor<2x1x4xf32>, %pos: tensor<1x1xi64>) -> tensor<2x8x4xf32> {
  %1 = "stablehlo.scatter"(%cache, %pos, %new) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    stablehlo.return %old : tensor<f32>
  }) : (tensor<2x8x4xf32>, tensor<1x1xi64>, tensor<2x1x4xf32>) -> tensor<2x8x4xf32>
  return %1 : tensor<2x8x4xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         "stablehlo.scatter"
// CHECK-NOT:     dynamic_update_slice

// -----

// A constant index out of bounds: XLA skips the write; left to the scatter.
func.func @main(%cache: tensor<2x8x4xf32>, %new: tensor<2x1x4xf32>) -> tensor<2x8x4xf32> {
  %c = stablehlo.constant dense<8> : tensor<1x1xi64>
  %1 = "stablehlo.scatter"(%cache, %c, %new) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    stablehlo.return %upd : tensor<f32>
  }) : (tensor<2x8x4xf32>, tensor<1x1xi64>, tensor<2x1x4xf32>) -> tensor<2x8x4xf32>
  return %1 : tensor<2x8x4xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         "stablehlo.scatter"
// CHECK-NOT:     dynamic_update_slice

// -----

// Batching dimensions.
func.func @main(%x: tensor<2x8x4xf32>, %idx: tensor<2x1xi64>, %u: tensor<2x4xf32>) -> tensor<2x8x4xf32> {
  %1 = "stablehlo.scatter"(%x, %idx, %u) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [1], input_batching_dims = [0], scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    stablehlo.return %upd : tensor<f32>
  }) : (tensor<2x8x4xf32>, tensor<2x1xi64>, tensor<2x4xf32>) -> tensor<2x8x4xf32>
  return %1 : tensor<2x8x4xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         "stablehlo.scatter"
// CHECK-NOT:     dynamic_update_slice

// -----

// Unsigned indices.
func.func @main(%cache: tensor<2x8x4xf32>, %new: tensor<2x1x4xf32>, %pos: tensor<1x1xui64>) -> tensor<2x8x4xf32> {
  %1 = "stablehlo.scatter"(%cache, %pos, %new) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    stablehlo.return %upd : tensor<f32>
  }) : (tensor<2x8x4xf32>, tensor<1x1xui64>, tensor<2x1x4xf32>) -> tensor<2x8x4xf32>
  return %1 : tensor<2x8x4xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         "stablehlo.scatter"
// CHECK-NOT:     dynamic_update_slice

// -----

// Variadic: two operands written through one index.
func.func @main(%a: tensor<8xf32>, %b: tensor<8xi32>, %pos: tensor<1xi64>, %ua: tensor<1xf32>, %ub: tensor<1xi32>) -> (tensor<8xf32>, tensor<8xi32>) {
  %1:2 = "stablehlo.scatter"(%a, %b, %pos, %ua, %ub) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%oa: tensor<f32>, %ob: tensor<i32>, %na: tensor<f32>, %nb: tensor<i32>):
    stablehlo.return %na, %nb : tensor<f32>, tensor<i32>
  }) : (tensor<8xf32>, tensor<8xi32>, tensor<1xi64>, tensor<1xf32>, tensor<1xi32>) -> (tensor<8xf32>, tensor<8xi32>)
  return %1#0, %1#1 : tensor<8xf32>, tensor<8xi32>
}
// CHECK-LABEL: func.func @main
// CHECK:         "stablehlo.scatter"
// CHECK-NOT:     dynamic_update_slice

// -----

// A dynamic batch: the window's extent is not known.
func.func @main(%cache: tensor<?x8x4xf32>, %new: tensor<?x1x4xf32>, %pos: tensor<1x1xi64>) -> tensor<?x8x4xf32> {
  %1 = "stablehlo.scatter"(%cache, %pos, %new) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 2], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    stablehlo.return %upd : tensor<f32>
  }) : (tensor<?x8x4xf32>, tensor<1x1xi64>, tensor<?x1x4xf32>) -> tensor<?x8x4xf32>
  return %1 : tensor<?x8x4xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         "stablehlo.scatter"
// CHECK-NOT:     dynamic_update_slice
