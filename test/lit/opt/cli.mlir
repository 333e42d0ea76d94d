// Command-line behaviour of hloalias-opt outside the passes themselves.

// --list-passes names both passes with their options.
// RUN: hloalias-opt --list-passes | filecheck %s --check-prefix=LIST
// LIST:      alias-donated-buffers: Attach
// LIST-NEXT:   inferred:
// LIST-NEXT:   explicit:
// LIST-NEXT:   donate:
// LIST-NEXT:   exclude-kinds: {{.*}}parameter, buffer, constant, user_input
// LIST:      eliminate-view-results: Remove view, pass-through, duplicate and dead results
// LIST-NEXT:   dead-results:

// A pass nobody registered is named in the error, and nothing is printed.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results, frobnicate)' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// UNKNOWN-NOT: Traceback
// UNKNOWN:     cli.mlir: error: unknown pass or bad options in pipeline element 'frobnicate'
// UNKNOWN-SAME: 'frobnicate' does not refer to a registered pass or pass pipeline
// UNKNOWN-NOT: module

// A pipeline not anchored on builtin.module is refused.
// RUN: not hloalias-opt %s --pass-pipeline='eliminate-view-results' 2>&1 | filecheck %s --check-prefix=ANCHOR
// ANCHOR-NOT: Traceback
// ANCHOR:     cli.mlir: error: pipeline must have the form 'builtin.module(...)', got 'eliminate-view-results'

// An empty file is an error at its first line; bad input exits with status 1.
// RUN: echo -n > %t.empty.mlir
// RUN: %PYTHON %S/../Inputs/exit_status.py hloalias-opt %t.empty.mlir 2>&1 | filecheck %s --check-prefix=EMPTY
// EMPTY-NOT:  Traceback
// EMPTY:      empty.mlir:1:1: error: empty input: expected an MLIR module
// EMPTY-NEXT: exit status: 1

// Input from stdin (named <stdin> in diagnostics), output to a file with -o:
// stdout stays empty.
// RUN: hloalias-opt - --pass-pipeline='builtin.module(eliminate-view-results)' -o %t.out.mlir < %s | %PYTHON -c "import sys; sys.exit(bool(sys.stdin.read()))"
// RUN: filecheck %s --check-prefix=FILE --input-file=%t.out.mlir
// RUN: %PYTHON %S/../Inputs/exit_status.py hloalias-opt < %S/Inputs/undefined_value.mlir 2>&1 | filecheck %s --check-prefix=STDIN
// FILE:      module {
// FILE-NEXT:   func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [
// FILE-SAME:     {base = "arg:0", chain = ["reshape 2x4"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:1", sizes = array<i64: 2, 4>, strides = array<i64: 4, 1>}]} {
// FILE-NEXT:     %0 = stablehlo.exponential %arg0 : tensor<8xf32>
// FILE-NEXT:     return %0 : tensor<8xf32>
// STDIN:      <stdin>:3:25: error: use of undeclared SSA value name
// STDIN-NEXT: exit status: 1

func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32>, tensor<2x4xf32>) {
  %0 = stablehlo.exponential %arg0 : tensor<8xf32>
  %1 = stablehlo.reshape %arg0 : (tensor<8xf32>) -> tensor<2x4xf32>
  return %0, %1 : tensor<8xf32>, tensor<2x4xf32>
}
