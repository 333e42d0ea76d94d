// Bad input gives `file:line:col: error: message` on stderr and exit status 1,
// never a Python traceback.  With --split-input-file every chunk is processed
// on its own, line numbers count from the top of the whole file, and the good
// chunks are still printed.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(eliminate-view-results)' 2>&1 >/dev/null | filecheck %s --check-prefix=ERR
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(eliminate-view-results)' 2>/dev/null | filecheck %s --check-prefix=OUT

// ERR-NOT: Traceback

// A good chunk.
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %arg0 : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// OUT:      module {
// OUT-NEXT:   func.func @main(%arg0: tensor<4xf32>) -> (tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
// OUT-NEXT:     %0 = stablehlo.negate %arg0 : tensor<4xf32>

// -----

// Malformed MLIR: an undefined value.
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  // ERR: diagnostics.mlir:[[# @LINE + 1]]:25: error: use of undeclared SSA value name
  %0 = stablehlo.negate %arg1 : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// An op of a dialect nobody registered.
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  // ERR-NEXT: diagnostics.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: operation being parsed with an unregistered dialect
  %0 = "frob.twiddle"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A verifier error reports the op's own location, and its note.
func.func @main(%arg0: tensor<4xf32>) -> tensor<8xf32> {
  %0 = stablehlo.negate %arg0 : tensor<4xf32>
  // ERR-NEXT: diagnostics.mlir:[[# @LINE + 2]]:3: error: type of return operand 0 ('tensor<4xf32>') doesn't match function result type ('tensor<8xf32>') in function @main
  // ERR-NEXT: diagnostics.mlir:[[# @LINE + 1]]:3: note: see current operation
  return %0 : tensor<4xf32>
}

// -----

// hloalias passes work on @main.
// ERR-NEXT: diagnostics.mlir: error: module has no 'func.func @main': hloalias passes work on @main
func.func @other(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  return %arg0 : tensor<4xf32>
}

// -----

// Dynamic shapes are rejected with the culprit named.
// ERR-NEXT: diagnostics.mlir:[[# @LINE + 1]]:1: error: result 0 of @main has dynamic shape tensor<?xf32>: only static shapes are supported
func.func @main(%arg0: tensor<?xf32>) -> tensor<?xf32> {
  %0 = stablehlo.negate %arg0 : tensor<?xf32>
  return %0 : tensor<?xf32>
}

// An empty chunk is an error of its own, at the line where it starts.
// ERR-NEXT: diagnostics.mlir:[[# @LINE + 2]]:1: error: empty input: expected an MLIR module
// -----
// -----

// A good chunk at the end is still processed and printed after the first.
func.func @main(%arg0: tensor<2xf32>) -> tensor<1xf32> {
  %0 = stablehlo.slice %arg0 [1:2] : (tensor<2xf32>) -> tensor<1xf32>
  return %0 : tensor<1xf32>
}
// OUT:      // -----
// OUT-NEXT: module {
// OUT-NEXT:   func.func @main(%arg0: tensor<2xf32>) attributes {hloalias.removed_results = [{base = "arg:0", chain = ["slice [1:2:1]"], dtype = f32, offset = 1 : i64, reason = "view", result = "output:0", sizes = array<i64: 1>, strides = array<i64: 1>}]} {
// OUT-NOT:  // -----
// ERR-NOT:  error
