// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(order-in-place-updates)' | filecheck %s
// Idempotent: a second run finds every read already ordered before its write.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(order-in-place-updates, order-in-place-updates)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(order-in-place-updates)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(order-in-place-updates{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// XLA-COUNT-8: xla: argument_bytes={{[0-9]+}}
// ERR: order_in_place_updates.mlir: error: order-in-place-updates: unknown option 'bogus' (options: none)

// A training step's last layer: the forward reads w (y = x w^T), the
// update reads dW, which depends on y, and the backward also reads w for
// the input gradient dx = dy w, which the update does not depend on.  The
// subtract moves into an if whose predicate reads dx: same value in both
// branches, and dx now comes before the write.
func.func @main(%w: tensor<4x4xf32> {hloalias.kind = "buffer", hloalias.name = "w", tf.aliasing_output = 0 : i32}, %x: tensor<2x4xf32> {hloalias.kind = "user_input", hloalias.name = "x"}, %dy: tensor<2x4xf32> {hloalias.kind = "user_input", hloalias.name = "dy"}) -> (tensor<4x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<2x4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %dx = stablehlo.dot_general %dy, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %dw = stablehlo.dot_general %y, %x, contracting_dims = [0] x [0] : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
  %new = stablehlo.subtract %w, %dw : tensor<4x4xf32>
  return %new, %dx : tensor<4x4xf32>, tensor<2x4xf32>
}
// CHECK-LABEL: func.func @main(
// CHECK:         %[[Y:.+]] = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [1]
// CHECK-NEXT:    %[[DX:.+]] = stablehlo.dot_general %arg2, %arg0, contracting_dims = [1] x [0]
// CHECK-NEXT:    %[[DW:.+]] = stablehlo.dot_general %[[Y]], %arg1
// CHECK-NEXT:    %[[ONE:.+]] = stablehlo.slice %[[DX]] [0:1, 0:1]
// CHECK-NEXT:    %[[S:.+]] = stablehlo.reshape %[[ONE]] : (tensor<1x1xf32>) -> tensor<f32>
// CHECK-NEXT:    %[[P:.+]] = stablehlo.compare  EQ, %[[S]], %[[S]]
// CHECK-NEXT:    %[[NEW:.+]] = "stablehlo.if"(%[[P]]) ({
// CHECK-NEXT:      %[[A:.+]] = stablehlo.subtract %arg0, %[[DW]]
// CHECK-NEXT:      stablehlo.return %[[A]]
// CHECK-NEXT:    }, {
// CHECK-NEXT:      %[[B:.+]] = stablehlo.subtract %arg0, %[[DW]]
// CHECK-NEXT:      stablehlo.return %[[B]]
// CHECK-NEXT:    })
// CHECK-NOT:     stablehlo.if
// CHECK:         return %[[NEW]], %[[DX]]

// -----

// Every read of w is an ancestor of the update: nothing to order.
func.func @main(%w: tensor<4x4xf32> {hloalias.kind = "buffer", hloalias.name = "w", tf.aliasing_output = 0 : i32}, %x: tensor<2x4xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<4x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<2x4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %dw = stablehlo.dot_general %y, %x, contracting_dims = [0] x [0] : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
  %new = stablehlo.subtract %w, %dw : tensor<4x4xf32>
  return %new, %y : tensor<4x4xf32>, tensor<2x4xf32>
}
// CHECK-LABEL: func.func @main(
// CHECK-NOT:     stablehlo.if
// CHECK:         return

// -----

// Not aliased (no tf.aliasing_output): XLA writes the new value elsewhere anyway.
func.func @main(%w: tensor<4x4xf32> {hloalias.kind = "buffer", hloalias.name = "w"}, %dy: tensor<2x4xf32> {hloalias.kind = "user_input", hloalias.name = "dy"}) -> (tensor<4x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<2x4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %dx = stablehlo.dot_general %dy, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %new = stablehlo.add %w, %w : tensor<4x4xf32>
  return %new, %dx : tensor<4x4xf32>, tensor<2x4xf32>
}
// CHECK-LABEL: func.func @main(
// CHECK-NOT:     stablehlo.if
// CHECK:         return

// -----

// Two unordered readers (an int32 one too): one predicate over both.
func.func @main(%w: tensor<4xi32> {hloalias.kind = "buffer", hloalias.name = "w", tf.aliasing_output = 0 : i32}, %d: tensor<4xi32> {hloalias.kind = "user_input", hloalias.name = "d"}) -> (tensor<4xi32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xi32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<4xi32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
  %a = stablehlo.multiply %w, %d : tensor<4xi32>
  %b = stablehlo.add %w, %d : tensor<4xi32>
  %new = stablehlo.subtract %w, %d : tensor<4xi32>
  return %new, %a, %b : tensor<4xi32>, tensor<4xi32>, tensor<4xi32>
}
// CHECK-LABEL: func.func @main(
// CHECK:         stablehlo.compare  EQ
// CHECK:         stablehlo.compare  EQ
// CHECK:         %[[P:.+]] = stablehlo.or
// CHECK-NEXT:    "stablehlo.if"(%[[P]])
// CHECK-NOT:     stablehlo.if

// -----

// One SSA value is the new value of two aliased arguments (a.copy_(z);
// b.copy_(z.clone()), the clone folded away).  Its op has two uses, so it
// stays where it is: XLA copies it into one of the two buffers anyway.
// (The pass used to move the op for the first result and erase it while
// the second still used it: a segfault, exit 139.)
func.func @main(%a: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "a", tf.aliasing_output = 0 : i32}, %b: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "b", tf.aliasing_output = 1 : i32}, %z: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "z"}) -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.mutates = 1 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %old = stablehlo.add %a, %b : tensor<4xf32>
  %z2 = stablehlo.multiply %z, %z : tensor<4xf32>
  return %z2, %z2, %old : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
// CHECK-LABEL: func.func @main(
// CHECK-NEXT:    %[[OLD:.+]] = stablehlo.add %arg0, %arg1
// CHECK-NEXT:    %[[Z2:.+]] = stablehlo.multiply %arg2, %arg2
// CHECK-NEXT:    return %[[Z2]], %[[Z2]], %[[OLD]]

// -----

// The same, and the value is also a user output: three uses, left alone.
func.func @main(%a: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "a", tf.aliasing_output = 0 : i32}, %z: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "z"}) -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<4xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
  %old = stablehlo.negate %a : tensor<4xf32>
  %z2 = stablehlo.multiply %z, %z : tensor<4xf32>
  return %z2, %old, %z2 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
// CHECK-LABEL: func.func @main(
// CHECK-NOT:     stablehlo.if
// CHECK:         return

// -----

// The old value is read inside a branch of an if.  Only the if's result is
// visible at the return: the predicate reads it (it used to read the
// multiply inside the branch, which does not dominate the return: invalid IR).
func.func @main(%w: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "w", tf.aliasing_output = 0 : i32}, %d: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "d"}, %p: tensor<i1> {hloalias.kind = "user_input", hloalias.name = "p"}) -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %r = "stablehlo.if"(%p) ({
    %m = stablehlo.multiply %w, %d : tensor<4xf32>
    stablehlo.return %m : tensor<4xf32>
  }, {
    stablehlo.return %d : tensor<4xf32>
  }) : (tensor<i1>) -> tensor<4xf32>
  %new = stablehlo.subtract %d, %d : tensor<4xf32>
  return %new, %r : tensor<4xf32>, tensor<4xf32>
}
// CHECK-LABEL: func.func @main(
// CHECK:         %[[R:.+]] = "stablehlo.if"(%arg2)
// CHECK:         stablehlo.multiply %arg0, %arg1
// CHECK:         %[[ONE:.+]] = stablehlo.slice %[[R]] [0:1]
// CHECK-NEXT:    %[[S:.+]] = stablehlo.reshape %[[ONE]]
// CHECK-NEXT:    %[[P:.+]] = stablehlo.compare  EQ, %[[S]], %[[S]]
// CHECK-NEXT:    %[[NEW:.+]] = "stablehlo.if"(%[[P]])
// CHECK:         return %[[NEW]], %[[R]]

// -----

// Read inside a while body (and its condition), and inside a case branch:
// the while and the case are the readers; the predicate reads the first
// result of each whose type it can probe (the while's is the i64 counter).
func.func @main(%w: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "w", tf.aliasing_output = 0 : i32}, %d: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "d"}, %k: tensor<i32> {hloalias.kind = "user_input", hloalias.name = "k"}) -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<4xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
  %zero = stablehlo.constant dense<0> : tensor<i64>
  %loop:2 = stablehlo.while(%i = %zero, %acc = %d) : tensor<i64>, tensor<4xf32>
  cond {
    %limit = stablehlo.constant dense<3> : tensor<i64>
    %lt = stablehlo.compare LT, %i, %limit : (tensor<i64>, tensor<i64>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  } do {
    %one = stablehlo.constant dense<1> : tensor<i64>
    %next = stablehlo.add %i, %one : tensor<i64>
    %sum = stablehlo.add %acc, %w : tensor<4xf32>
    stablehlo.return %next, %sum : tensor<i64>, tensor<4xf32>
  }
  %c = "stablehlo.case"(%k) ({
    %n = stablehlo.negate %w : tensor<4xf32>
    stablehlo.return %n : tensor<4xf32>
  }, {
    stablehlo.return %d : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  %new = stablehlo.multiply %d, %d : tensor<4xf32>
  return %new, %loop#1, %c : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}
// CHECK-LABEL: func.func @main(
// CHECK:         %[[LOOP:.+]]:2 = stablehlo.while
// CHECK:         %[[C:.+]] = "stablehlo.case"(%arg2)
// CHECK:         %[[NEW:.+]] = "stablehlo.if"
// CHECK-NEXT:      stablehlo.multiply %arg1, %arg1
// CHECK:         return %[[NEW]], %[[LOOP]]#1, %[[C]]
