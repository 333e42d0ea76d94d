// hloalias passes mix with upstream ones (cse, canonicalize) in one
// pipeline, and --mlir-print-ir-after-all dumps the IR after each of them, in
// order, to stderr.
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(cse, eliminate-view-results, canonicalize, alias-donated-buffers)' --mlir-print-ir-after-all -o %t 2>&1 | filecheck %s --check-prefix=DUMP
// RUN: filecheck %s --input-file=%t

// x is returned unchanged, two identical reshapes of x feed a computation and
// one of them is returned.
func.func @main(%arg0: tensor<4x8xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<4x8xf32>, tensor<32xf32>, tensor<32xf32>) {
  %0 = stablehlo.reshape %arg0 : (tensor<4x8xf32>) -> tensor<32xf32>
  %1 = stablehlo.reshape %arg0 : (tensor<4x8xf32>) -> tensor<32xf32>
  %2 = stablehlo.exponential %0 : tensor<32xf32>
  %3 = stablehlo.add %1, %2 : tensor<32xf32>
  return %arg0, %3, %1 : tensor<4x8xf32>, tensor<32xf32>, tensor<32xf32>
}

// cse merges the two reshapes, so the returned one is the same value that
// feeds the computation.
// DUMP:      // -----// IR Dump After {{CSE.*}}: cse //----- //
// DUMP-NEXT: module {
// DUMP-NEXT:   func.func @main(%arg0: tensor<4x8xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<4x8xf32>, tensor<32xf32>, tensor<32xf32>) {
// DUMP-NEXT:     %0 = stablehlo.reshape %arg0 : (tensor<4x8xf32>) -> tensor<32xf32>
// DUMP-NEXT:     %1 = stablehlo.exponential %0 : tensor<32xf32>
// DUMP-NEXT:     %2 = stablehlo.add %0, %1 : tensor<32xf32>
// DUMP-NEXT:     return %arg0, %2, %0 : tensor<4x8xf32>, tensor<32xf32>, tensor<32xf32>

// eliminate-view-results then takes out the pass-through and the view; the
// reshape op itself stays, since the computation still needs it.
// DUMP:      // -----// IR Dump After eliminate-view-results: eliminate-view-results //----- //
// DUMP-NEXT: module {
// DUMP-NEXT:   func.func @main(%arg0: tensor<4x8xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<32xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [
// DUMP-SAME:     {base = "arg:0", chain = [], dtype = f32, offset = 0 : i64, reason = "pass_through", result = "output:0", sizes = array<i64: 4, 8>, strides = array<i64: 8, 1>},
// DUMP-SAME:     {base = "arg:0", chain = ["reshape 32"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:2", sizes = array<i64: 32>, strides = array<i64: 1>}]} {
// DUMP-NEXT:     %0 = stablehlo.reshape %arg0 : (tensor<4x8xf32>) -> tensor<32xf32>
// DUMP-NEXT:     %1 = stablehlo.exponential %0 : tensor<32xf32>
// DUMP-NEXT:     %2 = stablehlo.add %0, %1 : tensor<32xf32>
// DUMP-NEXT:     return %2 : tensor<32xf32>

// DUMP:      // -----// IR Dump After {{Canonicalizer.*}}: canonicalize
// DUMP:      // -----// IR Dump After alias-donated-buffers: alias-donated-buffers //----- //
// DUMP-NOT:  IR Dump After

// x's old value is the base of rebuilt results: it is not donated.
// CHECK:      module {
// CHECK-NEXT:   func.func @main(%arg0: tensor<4x8xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<32xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [
// CHECK-NEXT:     %0 = stablehlo.reshape %arg0 : (tensor<4x8xf32>) -> tensor<32xf32>
// CHECK-NEXT:     %1 = stablehlo.exponential %0 : tensor<32xf32>
// CHECK-NEXT:     %2 = stablehlo.add %0, %1 : tensor<32xf32>
// CHECK-NEXT:     return %2 : tensor<32xf32>
