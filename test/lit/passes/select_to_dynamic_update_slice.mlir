// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(select-to-dynamic-update-slice)' | filecheck %s
// Idempotent: a second run finds no masked select left.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(select-to-dynamic-update-slice, select-to-dynamic-update-slice)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(select-to-dynamic-update-slice)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA

// XLA-COUNT-3: xla: argument_bytes={{[0-9]+}}

// cache[:, 3].copy_(new) as torch-mlir lowers select_scatter: the mask is
// arange(8) (a dynamic_iota of a computed, constant length, * 1 + 0) == 3.
func.func @main(%arg0: tensor<2x8x4xf32>, %arg1: tensor<2x4xf32>) -> tensor<2x8x4xf32> {
  %c = stablehlo.constant dense<3> : tensor<1x8x1xi64>
  %c_0 = stablehlo.constant dense<0> : tensor<8xi64>
  %c_1 = stablehlo.constant dense<1> : tensor<8xi64>
  %c_3 = stablehlo.constant dense<1> : tensor<i64>
  %c_4 = stablehlo.constant dense<8> : tensor<i64>
  %0 = stablehlo.convert %c_3 : (tensor<i64>) -> tensor<f64>
  %1 = stablehlo.convert %c_4 : (tensor<i64>) -> tensor<f64>
  %2 = stablehlo.divide %1, %0 : tensor<f64>
  %3 = stablehlo.ceil %2 : tensor<f64>
  %4 = stablehlo.convert %3 : (tensor<f64>) -> tensor<i64>
  %5 = stablehlo.reshape %4 : (tensor<i64>) -> tensor<1xi64>
  %6 = stablehlo.dynamic_iota %5, dim = 0 : (tensor<1xi64>) -> tensor<8xi64>
  %7 = stablehlo.multiply %6, %c_1 : tensor<8xi64>
  %8 = stablehlo.add %7, %c_0 : tensor<8xi64>
  %9 = stablehlo.reshape %8 : (tensor<8xi64>) -> tensor<1x8x1xi64>
  %10 = stablehlo.compare EQ, %9, %c, SIGNED : (tensor<1x8x1xi64>, tensor<1x8x1xi64>) -> tensor<1x8x1xi1>
  %11 = stablehlo.reshape %arg1 : (tensor<2x4xf32>) -> tensor<2x1x4xf32>
  %12 = stablehlo.broadcast_in_dim %11, dims = [0, 1, 2] : (tensor<2x1x4xf32>) -> tensor<2x8x4xf32>
  %13 = stablehlo.broadcast_in_dim %10, dims = [0, 1, 2] : (tensor<1x8x1xi1>) -> tensor<2x8x4xi1>
  %14 = stablehlo.select %13, %12, %arg0 : tensor<2x8x4xi1>, tensor<2x8x4xf32>
  return %14 : tensor<2x8x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<2x8x4xf32>, %arg1: tensor<2x4xf32>)
// CHECK-DAG:     %[[K:.+]] = stablehlo.constant dense<3> : tensor<i64>
// CHECK-DAG:     %[[ZERO:.+]] = stablehlo.constant dense<0> : tensor<i64>
// CHECK:         %[[T:.+]] = stablehlo.broadcast_in_dim {{.+}} -> tensor<2x8x4xf32>
// CHECK:         %[[U:.+]] = stablehlo.slice %[[T]] [0:2, 3:4, 0:4] : (tensor<2x8x4xf32>) -> tensor<2x1x4xf32>
// CHECK-NOT:     stablehlo.select
// CHECK:         %[[R:.+]] = stablehlo.dynamic_update_slice %arg0, %[[U]], %[[ZERO]], %[[K]], %[[ZERO]]
// CHECK:         return %[[R]]

// -----

// The constant on the left, a static iota broadcast along dim 0 of a 2-D
// select on i32, operands swapped in the compare.
func.func @main(%x: tensor<5x3xi32>, %t: tensor<5x3xi32>) -> tensor<5x3xi32> {
  %k = stablehlo.constant dense<4> : tensor<5xi32>
  %i = stablehlo.iota dim = 0 : tensor<5xi32>
  %m = stablehlo.compare EQ, %k, %i : (tensor<5xi32>, tensor<5xi32>) -> tensor<5xi1>
  %b = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<5xi1>) -> tensor<5x3xi1>
  %r = stablehlo.select %b, %t, %x : tensor<5x3xi1>, tensor<5x3xi32>
  return %r : tensor<5x3xi32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<5x3xi32>, %arg1: tensor<5x3xi32>)
// CHECK:         %[[U:.+]] = stablehlo.slice %arg1 [4:5, 0:3] : (tensor<5x3xi32>) -> tensor<1x3xi32>
// CHECK:         stablehlo.dynamic_update_slice %arg0, %[[U]], %{{.+}}, %{{.+}} : (tensor<5x3xi32>, tensor<1x3xi32>, tensor<i64>, tensor<i64>) -> tensor<5x3xi32>

// -----

// The mask built at full shape by an iota along dim 1 (no broadcast).
func.func @main(%x: tensor<2x6xf32>, %t: tensor<2x6xf32>) -> tensor<2x6xf32> {
  %k = stablehlo.constant dense<0> : tensor<2x6xi64>
  %i = stablehlo.iota dim = 1 : tensor<2x6xi64>
  %m = stablehlo.compare EQ, %i, %k : (tensor<2x6xi64>, tensor<2x6xi64>) -> tensor<2x6xi1>
  %r = stablehlo.select %m, %t, %x : tensor<2x6xi1>, tensor<2x6xf32>
  return %r : tensor<2x6xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<2x6xf32>, %arg1: tensor<2x6xf32>)
// CHECK:         %[[U:.+]] = stablehlo.slice %arg1 [0:2, 0:1] : (tensor<2x6xf32>) -> tensor<2x1xf32>
// CHECK:         stablehlo.dynamic_update_slice %arg0, %[[U]]
