// Aliasing the pass cannot trust is an error naming the argument, checked
// before the pass changes anything; each chunk fails on its own and the
// pass never crashes (exit 1 with a diagnostic, not a signal).
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(order-in-place-updates)' 2>&1 >/dev/null | filecheck %s

// CHECK-NOT: Traceback
// CHECK: order_in_place_updates_invalid.mlir:8:1: error: argument 0: 'tf.aliasing_output' must be an integer, got the boolean true
func.func @main(%w: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "w", tf.aliasing_output = true}, %d: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "d"}) -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %r = stablehlo.multiply %w, %d : tensor<4xf32>
  %new = stablehlo.subtract %d, %d : tensor<4xf32>
  return %new, %r : tensor<4xf32>, tensor<4xf32>
}

// -----

// CHECK-NEXT: order_in_place_updates_invalid.mlir:17:1: error: argument 0 ('w'): 'tf.aliasing_output' = 2 is out of range; @main has 2 results
func.func @main(%w: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "w", tf.aliasing_output = 2 : i32}, %d: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "d"}) -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %r = stablehlo.multiply %w, %d : tensor<4xf32>
  %new = stablehlo.subtract %d, %d : tensor<4xf32>
  return %new, %r : tensor<4xf32>, tensor<4xf32>
}

// -----

// Two arguments alias the one result that both return.
// CHECK-NEXT: order_in_place_updates_invalid.mlir:27:1: error: argument 1 ('b'): 'tf.aliasing_output' = 0, but argument 0 ('a') already aliases result 0
func.func @main(%a: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "a", tf.aliasing_output = 0 : i32}, %b: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "b", tf.aliasing_output = 0 : i32}, %z: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "z"}) -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.mutates = 1 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %old = stablehlo.add %a, %b : tensor<4xf32>
  %z2 = stablehlo.multiply %z, %z : tensor<4xf32>
  return %z2, %z2, %old : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
