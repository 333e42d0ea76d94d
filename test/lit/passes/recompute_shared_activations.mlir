// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-shared-activations)' | filecheck %s
// Idempotent: the copies it made are not copied again on a second run.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-shared-activations, recompute-shared-activations)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-shared-activations)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-shared-activations{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// XLA-COUNT-5: xla: argument_bytes={{[0-9]+}}
// ERR: recompute_shared_activations.mlir: error: recompute-shared-activations: unknown option 'bogus' (options: none)

// gelu_new as a training step reads it: the forward's 0.5 x (1 + t), the
// backward's g (1 + t) and g (1 - t^2).  Both later readers recompute.
func.func @main(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %one = stablehlo.constant dense<1.0> : tensor<4x8xf32>
  %half = stablehlo.constant dense<0.5> : tensor<4x8xf32>
  %y = stablehlo.multiply %x, %half : tensor<4x8xf32>
  %t = stablehlo.tanh %y : tensor<4x8xf32>
  %a = stablehlo.add %t, %one : tensor<4x8xf32>
  %h = stablehlo.multiply %y, %a : tensor<4x8xf32>
  %ga = stablehlo.multiply %g, %a : tensor<4x8xf32>
  %tt = stablehlo.multiply %t, %t : tensor<4x8xf32>
  %d = stablehlo.subtract %ga, %tt : tensor<4x8xf32>
  return %h, %d : tensor<4x8xf32>, tensor<4x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>)
// CHECK:         %[[Y:.+]] = stablehlo.multiply %arg0,
// CHECK:         %[[T:.+]] = stablehlo.tanh %[[Y]] : tensor<4x8xf32>
// CHECK:         %[[A:.+]] = stablehlo.add %[[T]], %[[ONE:.+]] : tensor<4x8xf32>
// CHECK:         %[[H:.+]] = stablehlo.multiply %[[Y]], %[[A]]
// CHECK:         %[[B1:.+]] = stablehlo.optimization_barrier %[[Y]] : tensor<4x8xf32>
// CHECK:         %[[T1:.+]] = stablehlo.tanh %[[B1]] : tensor<4x8xf32>
// CHECK:         %[[A1:.+]] = stablehlo.add %[[T1]], %[[ONE]] : tensor<4x8xf32>
// CHECK:         %[[GA:.+]] = stablehlo.multiply %arg1, %[[A1]]
// CHECK:         %[[B2:.+]] = stablehlo.optimization_barrier %[[Y]] : tensor<4x8xf32>
// CHECK:         %[[T2:.+]] = stablehlo.tanh %[[B2]] : tensor<4x8xf32>
// CHECK:         %[[TT:.+]] = stablehlo.multiply %[[T2]], %[[T2]]
// CHECK-NOT:     optimization_barrier
// CHECK:         %[[D:.+]] = stablehlo.subtract %[[GA]], %[[TT]]
// CHECK:         return %[[H]], %[[D]]

// -----

// SiLU: x * logistic(x) in the forward, the backward reads logistic(x).
func.func @main(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %s = stablehlo.logistic %x : tensor<4x8xf32>
  %o = stablehlo.multiply %x, %s : tensor<4x8xf32>
  %d = stablehlo.multiply %g, %s : tensor<4x8xf32>
  return %o, %d : tensor<4x8xf32>, tensor<4x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>)
// CHECK:         %[[S:.+]] = stablehlo.logistic %arg0
// CHECK:         %[[O:.+]] = stablehlo.multiply %arg0, %[[S]]
// CHECK:         %[[B:.+]] = stablehlo.optimization_barrier %arg0
// CHECK:         %[[S1:.+]] = stablehlo.logistic %[[B]]
// CHECK:         %[[D:.+]] = stablehlo.multiply %arg1, %[[S1]]
// CHECK:         return %[[O]], %[[D]]

// -----

// Not rewritten: one reader (even reading it twice), an expensive op that
// is not an activation (exp), a value more than two ops above the tanh.
func.func @main(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %t = stablehlo.tanh %x : tensor<4x8xf32>
  %tt = stablehlo.multiply %t, %t : tensor<4x8xf32>
  %e = stablehlo.exponential %x : tensor<4x8xf32>
  %e1 = stablehlo.multiply %e, %g : tensor<4x8xf32>
  %e2 = stablehlo.add %e, %g : tensor<4x8xf32>
  %u = stablehlo.tanh %g : tensor<4x8xf32>
  %u1 = stablehlo.negate %u : tensor<4x8xf32>
  %u2 = stablehlo.negate %u1 : tensor<4x8xf32>
  %u3 = stablehlo.negate %u2 : tensor<4x8xf32>
  %r1 = stablehlo.multiply %u3, %e1 : tensor<4x8xf32>
  %r2 = stablehlo.multiply %u3, %e2 : tensor<4x8xf32>
  return %tt, %r1, %r2 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>)
// CHECK-NOT:     optimization_barrier
// CHECK:         stablehlo.tanh %arg0
// CHECK-NOT:     optimization_barrier
// CHECK:         stablehlo.exponential %arg0
// CHECK-NOT:     optimization_barrier
// CHECK:         stablehlo.tanh %arg1
// CHECK-NOT:     stablehlo.tanh
// CHECK-NOT:     stablehlo.exponential
// CHECK-NOT:     optimization_barrier
// CHECK:         return

// -----

// A reader inside a nested region: left as it is.
func.func @main(%p: tensor<i1>, %x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %t = stablehlo.tanh %x : tensor<4x8xf32>
  %a = stablehlo.add %t, %t : tensor<4x8xf32>
  %r = "stablehlo.if"(%p) ({
    %n = stablehlo.negate %t : tensor<4x8xf32>
    stablehlo.return %n : tensor<4x8xf32>
  }, {
    stablehlo.return %x : tensor<4x8xf32>
  }) : (tensor<i1>) -> tensor<4x8xf32>
  return %a, %r : tensor<4x8xf32>, tensor<4x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<i1>, %arg1: tensor<4x8xf32>)
// CHECK-NOT:     optimization_barrier
// CHECK-COUNT-1: stablehlo.tanh
// CHECK-NOT:     optimization_barrier
// CHECK:         return

// -----

// An op with attributes on the path (compare): its copy keeps them.
func.func @main(%x: tensor<4x8xf32>, %z: tensor<4x8xf32>) -> (tensor<4x8xi1>, tensor<4x8xi1>) {
  %s = stablehlo.logistic %x : tensor<4x8xf32>
  %c = stablehlo.compare GT, %s, %z, FLOAT : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xi1>
  %n = stablehlo.not %c : tensor<4x8xi1>
  %a = stablehlo.and %c, %n : tensor<4x8xi1>
  return %n, %a : tensor<4x8xi1>, tensor<4x8xi1>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>)
// CHECK:         %[[S:.+]] = stablehlo.logistic %arg0
// CHECK:         %[[C:.+]] = stablehlo.compare  GT, %[[S]], %arg1,  FLOAT
// CHECK:         %[[N:.+]] = stablehlo.not %[[C]]
// CHECK:         %[[B:.+]] = stablehlo.optimization_barrier %arg0
// CHECK:         %[[S1:.+]] = stablehlo.logistic %[[B]]
// CHECK:         %[[C1:.+]] = stablehlo.compare  GT, %[[S1]], %arg1,  FLOAT
// CHECK:         %[[A:.+]] = stablehlo.and %[[C1]], %[[N]]
// CHECK:         return %[[N]], %[[A]]
