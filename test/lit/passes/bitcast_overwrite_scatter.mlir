// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(bitcast-overwrite-scatter)' | filecheck %s
// Idempotent: a second run finds no float overwrite scatter left.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(bitcast-overwrite-scatter, bitcast-overwrite-scatter)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(bitcast-overwrite-scatter)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(bitcast-overwrite-scatter{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// XLA-COUNT-5: xla: argument_bytes={{[0-9]+}}
// ERR: bitcast_overwrite_scatter.mlir: error: bitcast-overwrite-scatter: unknown option 'bogus' (options: none)

// index_copy_ of 3 rows into a bf16 cache: runs on i16.
func.func @main(%cache: tensor<16x4xbf16>, %idx: tensor<3x1xi64>, %rows: tensor<3x4xbf16>) -> tensor<16x4xbf16> {
  %0 = "stablehlo.scatter"(%cache, %idx, %rows) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<bf16>, %new: tensor<bf16>):
    stablehlo.return %new : tensor<bf16>
  }) : (tensor<16x4xbf16>, tensor<3x1xi64>, tensor<3x4xbf16>) -> tensor<16x4xbf16>
  return %0 : tensor<16x4xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<16x4xbf16>, %arg1: tensor<3x1xi64>, %arg2: tensor<3x4xbf16>)
// CHECK-DAG:     %[[C:.+]] = stablehlo.bitcast_convert %arg0 : (tensor<16x4xbf16>) -> tensor<16x4xi16>
// CHECK-DAG:     %[[U:.+]] = stablehlo.bitcast_convert %arg2 : (tensor<3x4xbf16>) -> tensor<3x4xi16>
// CHECK:         %[[S:.+]] = "stablehlo.scatter"(%[[C]], %arg1, %[[U]])
// CHECK:         ^bb0(%{{.+}}: tensor<i16>, %[[NEW:.+]]: tensor<i16>):
// CHECK-NEXT:      stablehlo.return %[[NEW]] : tensor<i16>
// CHECK:         }) : (tensor<16x4xi16>, tensor<3x1xi64>, tensor<3x4xi16>) -> tensor<16x4xi16>
// CHECK:         %[[R:.+]] = stablehlo.bitcast_convert %[[S]] : (tensor<16x4xi16>) -> tensor<16x4xbf16>
// CHECK:         return %[[R]]

// -----

// Two f16 scatters in a row pass integers along: no bitcast pair between them.
func.func @main(%cache: tensor<16x4xf16>, %idx: tensor<2x1xi64>, %rows: tensor<2x4xf16>) -> tensor<16x4xf16> {
  %0 = "stablehlo.scatter"(%cache, %idx, %rows) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f16>, %new: tensor<f16>):
    stablehlo.return %new : tensor<f16>
  }) : (tensor<16x4xf16>, tensor<2x1xi64>, tensor<2x4xf16>) -> tensor<16x4xf16>
  %1 = "stablehlo.scatter"(%0, %idx, %rows) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f16>, %new: tensor<f16>):
    stablehlo.return %new : tensor<f16>
  }) : (tensor<16x4xf16>, tensor<2x1xi64>, tensor<2x4xf16>) -> tensor<16x4xf16>
  return %1 : tensor<16x4xf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<16x4xf16>
// CHECK:         %[[A:.+]] = "stablehlo.scatter"
// CHECK:         -> tensor<16x4xi16>
// CHECK-NOT:     bitcast_convert %[[A]]
// CHECK:         %[[B:.+]] = "stablehlo.scatter"(%[[A]],
// CHECK:         -> tensor<16x4xi16>
// CHECK:         %[[R:.+]] = stablehlo.bitcast_convert %[[B]] : (tensor<16x4xi16>) -> tensor<16x4xf16>
// CHECK:         return %[[R]]

// -----

// Not rewritten: the combiner adds (index_put_ with accumulate=True).
func.func @main(%cache: tensor<16x4xbf16>, %idx: tensor<3x1xi64>, %rows: tensor<3x4xbf16>) -> tensor<16x4xbf16> {
  %0 = "stablehlo.scatter"(%cache, %idx, %rows) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<bf16>, %new: tensor<bf16>):
    %s = stablehlo.add %old, %new : tensor<bf16>
    stablehlo.return %s : tensor<bf16>
  }) : (tensor<16x4xbf16>, tensor<3x1xi64>, tensor<3x4xbf16>) -> tensor<16x4xbf16>
  return %0 : tensor<16x4xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<16x4xbf16>
// CHECK-NOT:     bitcast_convert
// CHECK:         stablehlo.add {{.+}} : tensor<bf16>
// CHECK:         -> tensor<16x4xbf16>

// -----

// Not rewritten: the region keeps the old value (not an overwrite).
func.func @main(%cache: tensor<16x4xbf16>, %idx: tensor<3x1xi64>, %rows: tensor<3x4xbf16>) -> tensor<16x4xbf16> {
  %0 = "stablehlo.scatter"(%cache, %idx, %rows) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<bf16>, %new: tensor<bf16>):
    stablehlo.return %old : tensor<bf16>
  }) : (tensor<16x4xbf16>, tensor<3x1xi64>, tensor<3x4xbf16>) -> tensor<16x4xbf16>
  return %0 : tensor<16x4xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<16x4xbf16>
// CHECK-NOT:     bitcast_convert
// CHECK:         -> tensor<16x4xbf16>

// -----

// Not rewritten: f32 (XLA scatters it natively) and a one-index bf16 scatter
// (XLA makes it an in-place dynamic-update-slice).
func.func @main(%cache: tensor<16x4xf32>, %idx: tensor<3x1xi64>, %rows: tensor<3x4xf32>, %h: tensor<16x4xbf16>, %one: tensor<1x1xi64>, %row: tensor<1x4xbf16>) -> (tensor<16x4xf32>, tensor<16x4xbf16>) {
  %0 = "stablehlo.scatter"(%cache, %idx, %rows) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    stablehlo.return %new : tensor<f32>
  }) : (tensor<16x4xf32>, tensor<3x1xi64>, tensor<3x4xf32>) -> tensor<16x4xf32>
  %1 = "stablehlo.scatter"(%h, %one, %row) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<bf16>, %new: tensor<bf16>):
    stablehlo.return %new : tensor<bf16>
  }) : (tensor<16x4xbf16>, tensor<1x1xi64>, tensor<1x4xbf16>) -> tensor<16x4xbf16>
  return %0, %1 : tensor<16x4xf32>, tensor<16x4xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<16x4xf32>
// CHECK-NOT:     bitcast_convert
// CHECK:         return
