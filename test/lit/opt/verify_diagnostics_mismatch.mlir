// A diagnostic nobody expected, and an expectation nothing produced, each
// fail --verify-diagnostics with mlir-opt's wording and exit status 1.
// RUN: not hloalias-opt %s --split-input-file --verify-diagnostics 2>&1 >/dev/null | filecheck %s

// CHECK-NOT: Traceback

// CHECK: verify_diagnostics_mismatch.mlir:[[# @LINE + 2]]:25: error: unexpected error: use of undeclared SSA value name
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %arg1 : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// CHECK-NEXT: verify_diagnostics_mismatch.mlir:[[# @LINE + 1]]:4: error: expected error "something else" was not produced
// expected-error@+1 {{something else}}
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  return %arg0 : tensor<4xf32>
}

// -----

// A message matched on the wrong line is unexpected there and not produced here.
// CHECK-NEXT: verify_diagnostics_mismatch.mlir:[[# @LINE + 4]]:25: error: unexpected error: use of undeclared SSA value name
// CHECK-NEXT: verify_diagnostics_mismatch.mlir:[[# @LINE + 1]]:4: error: expected error "use of undeclared" was not produced
// expected-error@+3 {{use of undeclared}}
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %arg1 : tensor<4xf32>
  return %0 : tensor<4xf32>
}
