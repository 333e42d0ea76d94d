// Aliasing attributes that make no sense are rejected, naming the argument;
// every chunk fails on its own and the others still run.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(alias-donated-buffers)' 2>&1 | filecheck %s

// CHECK-NOT: Traceback

// CHECK: error: argument 0 ('arg0'): 'tf.aliasing_output' = 2 is out of range; @main has 1 results
func.func @main(%arg0: tensor<8xf32> {tf.aliasing_output = 2 : i32}) -> tensor<8xf32> {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: error: argument 0 ('x'): 'tf.aliasing_output' = 0 pairs tensor<8xf32> with result of type tensor<8xi32>
func.func @main(%arg0: tensor<8xf32> {hloalias.name = "x", tf.aliasing_output = 0 : i32}) -> tensor<8xi32> {
  %0 = stablehlo.bitcast_convert %arg0 : (tensor<8xf32>) -> tensor<8xi32>
  %1 = stablehlo.negate %0 : tensor<8xi32>
  return %1 : tensor<8xi32>
}

// -----

// CHECK-NEXT: error: argument 1 ('b'): 'tf.aliasing_output' = 0, but argument 0 ('a') already aliases result 0
func.func @main(%arg0: tensor<8xf32> {hloalias.name = "a", tf.aliasing_output = 0 : i32}, %arg1: tensor<8xf32> {hloalias.name = "b", tf.aliasing_output = 0 : i32}) -> (tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// An alias on an argument whose old value the runtime still needs (it is the
// base of a removed view) would make the rebuilt view read overwritten data.
// CHECK-NEXT: error: argument 0 ('x'): tf.aliasing_output = 0, but its old value is the base of rebuilt view output:1
func.func @main(%arg0: tensor<8xf32> {hloalias.name = "x", tf.aliasing_output = 0 : i32}) -> tensor<8xf32> attributes {hloalias.removed_results = [{base = "arg:0", chain = ["slice [0:4:1]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:1", sizes = array<i64: 4>, strides = array<i64: 1>}]} {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// The one valid chunk is still printed.
// CHECK-NEXT: module {
// CHECK-NEXT:   func.func @main(%arg0: tensor<8xf32> {hloalias.donation = "explicit", hloalias.name = "ok", tf.aliasing_output = 0 : i32}) -> (tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
func.func @main(%arg0: tensor<8xf32> {hloalias.name = "ok", jax.buffer_donor = true}) -> tensor<8xf32> {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  return %0 : tensor<8xf32>
}
