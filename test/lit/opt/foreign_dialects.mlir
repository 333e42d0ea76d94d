// chlo ops parse and stay; Shardy (sdy) ops and attributes parse through
// jaxlib's MLIR and are carried as unregistered operations; an unknown
// dialect needs --allow-unregistered-dialect, as in mlir-opt.
// RUN: hloalias-opt %s --split-input-file --allow-unregistered-dialect --pass-pipeline='builtin.module(eliminate-view-results)' | filecheck %s
// RUN: not hloalias-opt %s --split-input-file 2>&1 >/dev/null | filecheck %s --check-prefix=ERR
// RUN: hloalias-opt --version | filecheck %s --check-prefix=VERSION
// RUN: hloalias-opt %s --split-input-file --allow-unregistered-dialect --mlir-timing --pass-pipeline='builtin.module(canonicalize, eliminate-view-results)' 2>&1 >/dev/null | filecheck %s --check-prefix=TIMING

// CHECK-LABEL: func.func @main
// CHECK: chlo.erf %arg0 : tensor<4xf32> -> tensor<4xf32>
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = chlo.erf %arg0 : tensor<4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// CHECK: "sdy.mesh"() <{mesh = #sdy.mesh<["x"=1]>, sym_name = "mesh"}>
// CHECK: func.func @main(%arg0: tensor<4x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>})
module {
  sdy.mesh @mesh = <["x"=1]>
  func.func @main(%arg0: tensor<4x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}) -> tensor<4x3xf32> {
    %0 = stablehlo.sine %arg0 : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}

// -----

// ERR: foreign_dialects.mlir:[[# @LINE + 3]]:22: error: operation being parsed with an unregistered dialect
// CHECK: "mydialect.op"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "mydialect.op"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// VERSION: hloalias-opt (hloalias {{[0-9]+\.[0-9]+\.[0-9]+}}); torch-mlir 20261001, jaxlib {{.*}}, torch {{.*}}

// TIMING: Execution time report
// TIMING: Total Execution Time: {{[0-9.]+}} seconds
// TIMING: ----Wall Time----  ----Name----
// TIMING-NEXT: ({{ *[0-9.]+}}%)  canonicalize
// TIMING-NEXT: ({{ *[0-9.]+}}%)  eliminate-view-results
// TIMING-NEXT: (100.0%)  Total
