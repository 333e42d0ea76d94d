// --verify-diagnostics as mlir-opt has it: each diagnostic must be announced
// by an `expected-*` comment on its line (or @+N / @-N / @above / @below /
// @LINE / @unknown), and each comment must be met; then the exit status is 0.
// RUN: hloalias-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(eliminate-view-results)'
// mlir-opt's single-dash spelling, as downstream suites write it:
// RUN: hloalias-opt %s -split-input-file -verify-diagnostics -pass-pipeline='builtin.module(eliminate-view-results)'

// A chunk without diagnostics and without comments passes.
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %arg0 : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %arg1 : tensor<4xf32> // expected-error {{use of undeclared SSA value name}}
  return %0 : tensor<4xf32>
}

// -----

// expected-error@+1 {{'hloalias.removed_results' must be an array of dictionaries, got 3 : i64}}
func.func @main(%arg0: tensor<8xf32>) -> tensor<8xf32> attributes {hloalias.removed_results = 3} {
  return %arg0 : tensor<8xf32>
}

// -----

func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32> {hloalias.output = -1 : i64}) {
  return %arg0 : tensor<8xf32>
}
// expected-error@-3 {{'hloalias.output' is -1, expected a position >= 0}}

// -----

// expected-error@below {{operation being parsed with an unregistered dialect}}
%0 = "nodialect.op"() : () -> tensor<4xf32>
