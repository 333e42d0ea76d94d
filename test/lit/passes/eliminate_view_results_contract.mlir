// eliminate-view-results and the IR contract: canonical result attributes,
// reruns over recorded bases, and dead code judged by MLIR's side-effect
// interfaces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(eliminate-view-results{dead-results=2})' | filecheck %s
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(eliminate-view-results, eliminate-view-results{dead-results=0})' 2>&1 >/dev/null | filecheck %s --check-prefix=AGAIN

// Hand-written IR with only hloalias.output on some results and nothing on
// the last: output numbers are kept (not replaced by positions) and every
// kept result gets both hloalias.role and hloalias.output.
// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32>)
// CHECK-SAME:    -> (tensor<8xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"})
// CHECK-SAME:    attributes {hloalias.removed_results = [{reason = "dead", result = "output:2"}, {base = "output:1", chain = ["slice [0:4:1]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 4>, strides = array<i64: 1>}]}
// CHECK-NEXT:    %0 = stablehlo.add %arg0, %arg0 : tensor<8xf32>
// CHECK-NEXT:    return %0 : tensor<8xf32>
// The first run made output:1 the base of output:0; a rerun may not drop it.
// AGAIN: error: eliminate-view-results: result 0 (output:1) cannot be dead: an earlier run recorded it as the base of output:0
func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32> {hloalias.output = 1 : i64}, tensor<4xf32> {hloalias.output = 0 : i64}, tensor<8xf32>) {
  %0 = stablehlo.add %arg0, %arg0 : tensor<8xf32>
  %1 = stablehlo.slice %0 [0:4] : (tensor<8xf32>) -> tensor<4xf32>
  %2 = stablehlo.multiply %arg0, %arg0 : tensor<8xf32>
  return %0, %1, %2 : tensor<8xf32>, tensor<4xf32>, tensor<8xf32>
}

// -----

// A role without an output number is the user output at its position; a
// mutation named only by hloalias.mutates is a mutation.
// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32>)
// CHECK-SAME:    -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<8xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"})
func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32> {hloalias.mutates = 0 : i64}, tensor<8xf32> {hloalias.role = "user_output"}, tensor<8xf32> {hloalias.output = 2 : i64}) {
  %0 = stablehlo.add %arg0, %arg0 : tensor<8xf32>
  %1 = stablehlo.multiply %arg0, %arg0 : tensor<8xf32>
  %2 = stablehlo.subtract %arg0, %arg0 : tensor<8xf32>
  return %0, %1, %2 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// Only the dead result used these ops.  The pure ones go; the case whose
// branch has a side-effecting custom_call stays (MLIR's greedy driver asks
// the side-effect interfaces, recursively), and so does its predicate.
// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32>, %arg1: tensor<i32>)
// CHECK-SAME:    -> (tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<8xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"})
// CHECK-NOT:     stablehlo.sine
// CHECK:         "stablehlo.case"(%arg1)
// CHECK:         stablehlo.custom_call @log_side_effect
// CHECK-NOT:     stablehlo.sine
// CHECK:         return
func.func @main(%arg0: tensor<8xf32>, %arg1: tensor<i32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  %1 = stablehlo.exponential %arg0 : tensor<8xf32>
  %2 = "stablehlo.case"(%arg1) ({
    %s = stablehlo.custom_call @log_side_effect(%arg0) {has_side_effect = true} : (tensor<8xf32>) -> tensor<8xf32>
    stablehlo.return %s : tensor<8xf32>
  }, {
    stablehlo.return %arg0 : tensor<8xf32>
  }) : (tensor<i32>) -> tensor<8xf32>
  %3 = stablehlo.sine %arg0 : tensor<8xf32>
  return %0, %1, %3 : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
}
