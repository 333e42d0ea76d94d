// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(narrow-scatter-indices)' | filecheck %s
// Idempotent: a second run finds no 64-bit scatter indices left.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(narrow-scatter-indices, narrow-scatter-indices)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(narrow-scatter-indices)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(narrow-scatter-indices{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// XLA-COUNT-4: xla: argument_bytes={{[0-9]+}}
// ERR: narrow_scatter_indices.mlir: error: narrow-scatter-indices: unknown option 'bogus' (options: none)

// last[:2] = rows: constant int64 indices, clamped to [-1, 4] and converted.
func.func @main(%last: tensor<4x8xf32>, %rows: tensor<2x8xf32>) -> tensor<4x8xf32> {
  %idx = stablehlo.constant dense<[[0], [1]]> : tensor<2x1xi64>
  %0 = "stablehlo.scatter"(%last, %idx, %rows) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    stablehlo.return %new : tensor<f32>
  }) : (tensor<4x8xf32>, tensor<2x1xi64>, tensor<2x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-DAG:     %[[LOW:.+]] = stablehlo.constant dense<-1> : tensor<i64>
// CHECK-DAG:     %[[HIGH:.+]] = stablehlo.constant dense<4> : tensor<i64>
// CHECK:         %[[C:.+]] = stablehlo.clamp %[[LOW]], %{{.+}}, %[[HIGH]] : (tensor<i64>, tensor<2x1xi64>, tensor<i64>) -> tensor<2x1xi64>
// CHECK:         %[[N:.+]] = stablehlo.convert %[[C]] : (tensor<2x1xi64>) -> tensor<2x1xi32>
// CHECK:         "stablehlo.scatter"(%arg0, %[[N]], %arg1)
// CHECK:         (tensor<4x8xf32>, tensor<2x1xi32>, tensor<2x8xf32>) -> tensor<4x8xf32>

// -----

// Two addressed dimensions (16 and 3): the bound is the larger.
func.func @main(%x: tensor<16x3x2xf32>, %idx: tensor<5x2xi64>, %u: tensor<5x2xf32>) -> tensor<16x3x2xf32> {
  %0 = "stablehlo.scatter"(%x, %idx, %u) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    %s = stablehlo.add %old, %new : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<16x3x2xf32>, tensor<5x2xi64>, tensor<5x2xf32>) -> tensor<16x3x2xf32>
  return %0 : tensor<16x3x2xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-DAG:     stablehlo.constant dense<16> : tensor<i64>
// CHECK:         stablehlo.convert %{{.+}} : (tensor<5x2xi64>) -> tensor<5x2xi32>
// CHECK:         stablehlo.add
// CHECK:         (tensor<16x3x2xf32>, tensor<5x2xi32>, tensor<5x2xf32>) -> tensor<16x3x2xf32>

// -----

// Already 32-bit: left alone.
func.func @main(%x: tensor<4xf32>, %idx: tensor<1x1xi32>, %u: tensor<1xf32>) -> tensor<4xf32> {
  %0 = "stablehlo.scatter"(%x, %idx, %u) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    stablehlo.return %new : tensor<f32>
  }) : (tensor<4xf32>, tensor<1x1xi32>, tensor<1xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-NOT:     stablehlo.clamp
// CHECK:         (tensor<4xf32>, tensor<1x1xi32>, tensor<1xf32>) -> tensor<4xf32>

// -----

// Variadic: the indices are the middle operand.
func.func @main(%a: tensor<4xf32>, %b: tensor<4xi32>, %idx: tensor<2x1xi64>, %ua: tensor<2xf32>, %ub: tensor<2xi32>) -> (tensor<4xf32>, tensor<4xi32>) {
  %0:2 = "stablehlo.scatter"(%a, %b, %idx, %ua, %ub) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%oa: tensor<f32>, %ob: tensor<i32>, %na: tensor<f32>, %nb: tensor<i32>):
    stablehlo.return %na, %nb : tensor<f32>, tensor<i32>
  }) : (tensor<4xf32>, tensor<4xi32>, tensor<2x1xi64>, tensor<2xf32>, tensor<2xi32>) -> (tensor<4xf32>, tensor<4xi32>)
  return %0#0, %0#1 : tensor<4xf32>, tensor<4xi32>
}
// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.convert %{{.+}} : (tensor<2x1xi64>) -> tensor<2x1xi32>
// CHECK:         (tensor<4xf32>, tensor<4xi32>, tensor<2x1xi32>, tensor<2xf32>, tensor<2xi32>) -> (tensor<4xf32>, tensor<4xi32>)
