// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(alias-donated-buffers)' --print-alias-report -o %t 2>&1 | filecheck %s --check-prefix=REPORT
// RUN: filecheck %s --input-file=%t
// A second run keeps every alias the first one made (as existing
// tf.aliasing_output, with its recorded origin) and changes nothing.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(alias-donated-buffers, alias-donated-buffers)' | filecheck %s
//
// The report goes to stderr, one block per chunk, in chunk order; the IR is
// checked separately from %t.

// Inferred: the mutated buffer aliases its new value (result 0); the user
// input is not donated.
func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "count"}, %arg1: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
  %1 = stablehlo.multiply %0, %arg1 : tensor<8xf32>
  return %0, %1 : tensor<8xf32>, tensor<8xf32>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "inferred", hloalias.kind = "buffer", hloalias.name = "count", tf.aliasing_output = 0 : i32},
// CHECK-SAME:    %arg1: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"})
// CHECK-SAME:    -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {

// REPORT:      alias-donated-buffers: 1 aliases, 32 bytes saved
// REPORT-NEXT:   alias   arg 0 'count' -> result 0  32 bytes  (inferred)
// REPORT-NEXT: alias-donated-buffers:

// -----

// Explicit from the IR: a jax.buffer_donor argument takes the first free
// result of its exact type (result 1, not the 4xf32 result 0) and becomes a
// fixed alias.
func.func @main(%arg0: tensor<4xf32> {hloalias.kind = "parameter", hloalias.name = "w"}, %arg1: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x", jax.buffer_donor = true}) -> (tensor<4xf32>, tensor<8xf32>) {
  %0 = stablehlo.negate %arg0 : tensor<4xf32>
  %1 = stablehlo.negate %arg1 : tensor<8xf32>
  return %0, %1 : tensor<4xf32>, tensor<8xf32>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<4xf32> {hloalias.kind = "parameter", hloalias.name = "w"},
// CHECK-SAME:    %arg1: tensor<8xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "x", tf.aliasing_output = 1 : i32})
// CHECK-NOT:     jax.buffer_donor

// REPORT-SAME:   1 aliases, 32 bytes saved
// REPORT-NEXT:   alias   arg 1 'x' -> result 1  32 bytes  (explicit)
// REPORT-NEXT: alias-donated-buffers:

// -----

// Both: a mutated buffer that is also an explicit donor counts once, with
// origin "both".
func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "b", jax.buffer_donor = true}) -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}) {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "both", hloalias.kind = "buffer", hloalias.name = "b", tf.aliasing_output = 0 : i32})

// REPORT-SAME:   1 aliases, 32 bytes saved
// REPORT-NEXT:   alias   arg 0 'b' -> result 0  32 bytes  (both)
// REPORT-NEXT: alias-donated-buffers:

// -----

// An explicit donor with no result of its type keeps jax.buffer_donor, so
// XLA may still reuse it; it gets no hloalias.donation.
func.func @main(%arg0: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "x", jax.buffer_donor = true}) -> tensor<2xf32> {
  %0 = stablehlo.slice %arg0 [0:2] : (tensor<4xf32>) -> tensor<2xf32>
  %1 = stablehlo.negate %0 : tensor<2xf32>
  return %1 : tensor<2xf32>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<4xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "x", hloalias.unused_donation = "no free result of type tensor<4xf32>", jax.buffer_donor = true})
// CHECK-SAME:    -> (tensor<2xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {

// REPORT-SAME:   0 aliases, 0 bytes saved
// REPORT-NEXT:   unused  arg 0 'x' (explicit): no free result of type tensor<4xf32>; kept as jax.buffer_donor
// REPORT-NEXT: alias-donated-buffers:

// -----

// A mutation whose new value has another type (f32 -> f64) cannot alias.
func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "acc"}) -> (tensor<8xf64> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}) {
  %0 = stablehlo.convert %arg0 : (tensor<8xf32>) -> tensor<8xf64>
  return %0 : tensor<8xf64>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "inferred", hloalias.kind = "buffer", hloalias.name = "acc", hloalias.unused_donation = "its new value (result 0, tensor<8xf64>) differs in type from tensor<8xf32>"})
// CHECK-SAME:    -> (tensor<8xf64> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}) {

// REPORT-SAME:   0 aliases, 0 bytes saved
// REPORT-NEXT:   unused  arg 0 'acc' (inferred): its new value (result 0, tensor<8xf64>) differs in type from tensor<8xf32>
// REPORT-NEXT: alias-donated-buffers:

// -----

// Aliases already in the IR are kept as they are (even crossing), with the
// origin recorded in hloalias.donation or, without one, "explicit".
func.func @main(%arg0: tensor<8xf32> {hloalias.donation = "inferred", hloalias.name = "a", tf.aliasing_output = 1 : i32}, %arg1: tensor<8xf32> {hloalias.name = "b", tf.aliasing_output = 0 : i32}) -> (tensor<8xf32>, tensor<8xf32>) {
  %0 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
  %1 = stablehlo.subtract %arg0, %arg1 : tensor<8xf32>
  return %0, %1 : tensor<8xf32>, tensor<8xf32>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "inferred", hloalias.name = "a", tf.aliasing_output = 1 : i32},
// CHECK-SAME:    %arg1: tensor<8xf32> {hloalias.donation = "explicit", hloalias.name = "b", tf.aliasing_output = 0 : i32})

// REPORT-SAME:   2 aliases, 64 bytes saved
// REPORT-NEXT:   alias   arg 0 'a' -> result 1  32 bytes  (inferred)
// REPORT-NEXT:   alias   arg 1 'b' -> result 0  32 bytes  (explicit)
// REPORT-NEXT: alias-donated-buffers:

// -----

// An existing alias wins over an inferred one for the same result: the
// mutated buffer's new value is already written into x's buffer.
func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "b"}, %arg1: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x", tf.aliasing_output = 0 : i32}) -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<8xf32>) {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  %1 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
  return %0, %1 : tensor<8xf32>, tensor<8xf32>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "inferred", hloalias.kind = "buffer", hloalias.name = "b", hloalias.unused_donation = "result 0 is already aliased to argument 1"},
// CHECK-SAME:    %arg1: tensor<8xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "x", tf.aliasing_output = 0 : i32})

// REPORT-SAME:   1 aliases, 32 bytes saved
// REPORT-NEXT:   alias   arg 1 'x' -> result 0  32 bytes  (explicit)
// REPORT-NEXT:   unused  arg 0 'b' (inferred): result 0 is already aliased to argument 1
// REPORT-NEXT: alias-donated-buffers:

// -----

// Explicit donors are served in argument order: the first takes the only
// result of their type, the second stays a plain donor.
func.func @main(%arg0: tensor<8xf32> {hloalias.name = "p", jax.buffer_donor = true}, %arg1: tensor<8xf32> {hloalias.name = "q", jax.buffer_donor = true}) -> tensor<8xf32> {
  %0 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "explicit", hloalias.name = "p", tf.aliasing_output = 0 : i32},
// CHECK-SAME:    %arg1: tensor<8xf32> {hloalias.donation = "explicit", hloalias.name = "q", hloalias.unused_donation = "no free result of type tensor<8xf32>", jax.buffer_donor = true})

// REPORT-SAME:   1 aliases, 32 bytes saved
// REPORT-NEXT:   alias   arg 0 'p' -> result 0  32 bytes  (explicit)
// REPORT-NEXT:   unused  arg 1 'q' (explicit): no free result of type tensor<8xf32>; kept as jax.buffer_donor
// REPORT-NEXT: alias-donated-buffers:

// -----

// The runtime rebuilds removed results from an argument's buffer after the
// call, so that buffer must survive: neither the base of a view nor an
// argument returned unchanged is donated, and their jax.buffer_donor is
// dropped (XLA must not reuse them either).
func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x", jax.buffer_donor = true}, %arg1: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "y", jax.buffer_donor = true}) -> tensor<8xf32> attributes {hloalias.removed_results = [{base = "arg:0", chain = ["slice [0:4:1]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:1", sizes = array<i64: 4>, strides = array<i64: 1>}, {base = "arg:1", chain = [], dtype = f32, offset = 0 : i64, reason = "pass_through", result = "output:2", sizes = array<i64: 8>, strides = array<i64: 1>}]} {
  %0 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "x", hloalias.unused_donation = "its old value is the base of rebuilt view output:1"},
// CHECK-SAME:    %arg1: tensor<8xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "y", hloalias.unused_donation = "it is returned unchanged (output:2, rebuilt from its buffer after the call)"})
// CHECK-SAME:    -> (tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [{base = "arg:0",

// REPORT-SAME:   0 aliases, 0 bytes saved
// REPORT-NEXT:   unused  arg 0 'x' (explicit): its old value is the base of rebuilt view output:1
// REPORT-NEXT:   unused  arg 1 'y' (explicit): it is returned unchanged (output:2, rebuilt from its buffer after the call)
// REPORT-NEXT: alias-donated-buffers:

// -----

// An argument that @main itself still returns (a real result, not a removed
// one) needs nothing after the call, so it may be donated: here its buffer
// simply holds result 0, itself.
func.func @main(%arg0: tensor<8xf32> {hloalias.name = "a", jax.buffer_donor = true}) -> (tensor<8xf32>, tensor<8xf32>) {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  return %arg0, %0 : tensor<8xf32>, tensor<8xf32>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<8xf32> {hloalias.donation = "explicit", hloalias.name = "a", tf.aliasing_output = 0 : i32})

// REPORT-SAME:   1 aliases, 32 bytes saved
// REPORT-NEXT:   alias   arg 0 'a' -> result 0  32 bytes  (explicit)
// REPORT-NOT:  alias-donated-buffers:
