// Selects the pass must leave alone: each stays a select.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(select-to-dynamic-update-slice)' | filecheck %s
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(select-to-dynamic-update-slice{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// ERR: select_to_dynamic_update_slice_invalid.mlir: error: select-to-dynamic-update-slice: unknown option 'bogus' (options: none)

// NE: every slice but one.
func.func @main(%x: tensor<5x3xf32>, %t: tensor<5x3xf32>) -> tensor<5x3xf32> {
  %k = stablehlo.constant dense<2> : tensor<5x3xi64>
  %i = stablehlo.iota dim = 0 : tensor<5x3xi64>
  %m = stablehlo.compare NE, %i, %k : (tensor<5x3xi64>, tensor<5x3xi64>) -> tensor<5x3xi1>
  %r = stablehlo.select %m, %t, %x : tensor<5x3xi1>, tensor<5x3xf32>
  return %r : tensor<5x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.select
// CHECK-NOT:     dynamic_update_slice

// -----

// k out of range: no element is selected.
func.func @main(%x: tensor<5x3xf32>, %t: tensor<5x3xf32>) -> tensor<5x3xf32> {
  %k = stablehlo.constant dense<5> : tensor<5x3xi64>
  %i = stablehlo.iota dim = 0 : tensor<5x3xi64>
  %m = stablehlo.compare EQ, %i, %k : (tensor<5x3xi64>, tensor<5x3xi64>) -> tensor<5x3xi1>
  %r = stablehlo.select %m, %t, %x : tensor<5x3xi1>, tensor<5x3xf32>
  return %r : tensor<5x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.select
// CHECK-NOT:     dynamic_update_slice

// -----

// A non-splat constant: one index per column.
func.func @main(%x: tensor<5x3xf32>, %t: tensor<5x3xf32>) -> tensor<5x3xf32> {
  %k = stablehlo.constant dense<[[0, 1, 2]]> : tensor<1x3xi64>
  %kb = stablehlo.broadcast_in_dim %k, dims = [0, 1] : (tensor<1x3xi64>) -> tensor<5x3xi64>
  %i = stablehlo.iota dim = 0 : tensor<5x3xi64>
  %m = stablehlo.compare EQ, %i, %kb : (tensor<5x3xi64>, tensor<5x3xi64>) -> tensor<5x3xi1>
  %r = stablehlo.select %m, %t, %x : tensor<5x3xi1>, tensor<5x3xf32>
  return %r : tensor<5x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.select
// CHECK-NOT:     dynamic_update_slice

// -----

// A strided arange (* 2): the mask is not coordinate == k.
func.func @main(%x: tensor<5x3xf32>, %t: tensor<5x3xf32>) -> tensor<5x3xf32> {
  %k = stablehlo.constant dense<2> : tensor<5xi64>
  %two = stablehlo.constant dense<2> : tensor<5xi64>
  %i = stablehlo.iota dim = 0 : tensor<5xi64>
  %s = stablehlo.multiply %i, %two : tensor<5xi64>
  %m = stablehlo.compare EQ, %s, %k : (tensor<5xi64>, tensor<5xi64>) -> tensor<5xi1>
  %b = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<5xi1>) -> tensor<5x3xi1>
  %r = stablehlo.select %b, %t, %x : tensor<5x3xi1>, tensor<5x3xf32>
  return %r : tensor<5x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.select
// CHECK-NOT:     dynamic_update_slice

// -----

// A mask broadcast from size 1 along the compared dimension: true everywhere or nowhere.
func.func @main(%x: tensor<5x3xf32>, %t: tensor<5x3xf32>) -> tensor<5x3xf32> {
  %k = stablehlo.constant dense<0> : tensor<1xi64>
  %i = stablehlo.iota dim = 0 : tensor<1xi64>
  %m = stablehlo.compare EQ, %i, %k : (tensor<1xi64>, tensor<1xi64>) -> tensor<1xi1>
  %b = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<1xi1>) -> tensor<5x3xi1>
  %r = stablehlo.select %b, %t, %x : tensor<5x3xi1>, tensor<5x3xf32>
  return %r : tensor<5x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.select
// CHECK-NOT:     dynamic_update_slice

// -----

// A scalar predicate.
func.func @main(%p: tensor<i1>, %x: tensor<5x3xf32>, %t: tensor<5x3xf32>) -> tensor<5x3xf32> {
  %r = stablehlo.select %p, %t, %x : tensor<i1>, tensor<5x3xf32>
  return %r : tensor<5x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.select
// CHECK-NOT:     dynamic_update_slice

// -----

// A narrow (i8) iota, which may wrap.
func.func @main(%x: tensor<5x3xf32>, %t: tensor<5x3xf32>) -> tensor<5x3xf32> {
  %k = stablehlo.constant dense<2> : tensor<5x3xi8>
  %i = stablehlo.iota dim = 0 : tensor<5x3xi8>
  %m = stablehlo.compare EQ, %i, %k : (tensor<5x3xi8>, tensor<5x3xi8>) -> tensor<5x3xi1>
  %r = stablehlo.select %m, %t, %x : tensor<5x3xi1>, tensor<5x3xf32>
  return %r : tensor<5x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.select
// CHECK-NOT:     dynamic_update_slice

// -----

// A dynamic extent.
func.func @main(%x: tensor<?x3xf32>, %t: tensor<?x3xf32>, %m: tensor<?x3xi1>) -> tensor<?x3xf32> {
  %r = stablehlo.select %m, %t, %x : tensor<?x3xi1>, tensor<?x3xf32>
  return %r : tensor<?x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.select
// CHECK-NOT:     dynamic_update_slice
