// Options of eliminate-view-results apply to every chunk of a file, so the
// dead-results cases and the option errors share this one module.
//
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results{dead-results=1,2})' | filecheck %s --check-prefix=DEAD
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results{dead-results=3}, eliminate-view-results{dead-results=2})' | filecheck %s --check-prefix=DEADVIEW
//
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results{dead-results=x})' 2>&1 | filecheck %s --check-prefix=ERR-VALUE
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results{dead-result=1})' 2>&1 | filecheck %s --check-prefix=ERR-UNKNOWN
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results{dead-results=4})' 2>&1 | filecheck %s --check-prefix=ERR-RANGE
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results{dead-results=0})' 2>&1 | filecheck %s --check-prefix=ERR-MUTATION
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results{dead-results=1,1})' 2>&1 | filecheck %s --check-prefix=ERR-TWICE

func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "buf"}, %arg1: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<8xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}, tensor<4xf32> {hloalias.output = 2 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
  %1 = stablehlo.multiply %arg1, %arg1 : tensor<8xf32>
  %2 = stablehlo.exponential %1 : tensor<8xf32>
  %3 = stablehlo.custom_call @log_tensor(%arg1) {has_side_effect = true} : (tensor<8xf32>) -> tensor<8xf32>
  %4 = stablehlo.slice %arg1 [0:4] : (tensor<8xf32>) -> tensor<4xf32>
  return %0, %2, %3, %4 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<4xf32>
}

// Results 1 and 2 (user outputs 0 and 1) are dead: they leave the signature
// with a bare record (nothing to rebuild), the ops only they needed are
// erased, but the side-effecting custom_call stays.  Dead records come first,
// then the view of x.
// DEAD-LABEL: func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "buf"}, %arg1: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"})
// DEAD-SAME:    -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"})
// DEAD-SAME:    attributes {hloalias.removed_results = [
// DEAD-SAME:    {reason = "dead", result = "output:0"}, {reason = "dead", result = "output:1"},
// DEAD-SAME:    {base = "arg:1", chain = ["slice [0:4:1]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:2", sizes = array<i64: 4>, strides = array<i64: 1>}]} {
// DEAD-NEXT:    %0 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
// DEAD-NEXT:    %1 = stablehlo.custom_call @log_tensor(%arg1) {has_side_effect = true} : (tensor<8xf32>) -> tensor<8xf32>
// DEAD-NEXT:    return %0 : tensor<8xf32>

// A dead view is "dead", not "view".  dead-results counts positions in the
// signature the pass sees: after the first run removed result 3, the second
// run's result 2 is the custom_call's, user output 1, whose op stays all the
// same.  The keys in the records are stable: "output:2", then "output:1".
// DEADVIEW-LABEL: func.func @main(
// DEADVIEW-SAME:    -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"})
// DEADVIEW-SAME:    attributes {hloalias.removed_results = [{reason = "dead", result = "output:2"}, {reason = "dead", result = "output:1"}]} {
// DEADVIEW-NEXT:    %0 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
// DEADVIEW-NEXT:    %1 = stablehlo.multiply %arg1, %arg1 : tensor<8xf32>
// DEADVIEW-NEXT:    %2 = stablehlo.exponential %1 : tensor<8xf32>
// DEADVIEW-NEXT:    %3 = stablehlo.custom_call @log_tensor(%arg1)
// DEADVIEW-NEXT:    return %0, %2 : tensor<8xf32>, tensor<8xf32>

// ERR-VALUE-NOT: Traceback
// ERR-VALUE: eliminate-view-results: option 'dead-results' expects a comma-separated list of integers, got 'x'
// ERR-VALUE-NOT: module

// ERR-UNKNOWN-NOT: Traceback
// ERR-UNKNOWN: eliminate-view-results: unknown option 'dead-result' (options: dead-results)
// ERR-UNKNOWN-NOT: module

// ERR-RANGE-NOT: Traceback
// ERR-RANGE: eliminate_view_results_options.mlir:{{[0-9]+}}:1: error: eliminate-view-results: dead-results names result 4, but @main has 4 results
// ERR-RANGE-NOT: module

// ERR-MUTATION-NOT: Traceback
// ERR-MUTATION: error: eliminate-view-results: result 0 is the new value of mutated argument 0 ('buf') and cannot be dead
// ERR-MUTATION-NOT: module

// ERR-TWICE-NOT: Traceback
// ERR-TWICE: error: eliminate-view-results: dead-results names result 1 twice
