// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-distance=3 min-saved-bytes=0})' | filecheck %s
// Idempotent: the copies it made are not copied again on a second run.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-distance=3 min-saved-bytes=0}, recompute-for-late-readers{min-distance=3 min-saved-bytes=0})' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-distance=3 min-saved-bytes=0})' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// With the default distance (16 ops) every reader here is near: nothing changes.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-saved-bytes=0})' | filecheck %s --check-prefix=NEAR
// With the default min-saved-bytes (64 KiB) every value here is small: nothing changes.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-distance=3})' | filecheck %s --check-prefix=NEAR
// The floor is inclusive: the first case's f32[4,16] (256 bytes) is copied
// at min-saved-bytes=256, the second case's f32[4,8] broadcast (128) is not.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-distance=3 min-saved-bytes=256})' | filecheck %s --check-prefix=FLOOR
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-distance=3 min-saved-bytes=257})' | filecheck %s --check-prefix=ABOVE
// Without kept-reshapes the probabilities' elementwise reader is left alone.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-distance=3 kept-reshapes=false min-saved-bytes=0})' | filecheck %s --check-prefix=NOKEPT
// Bad options are errors naming the option.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-distance=0})' 2>&1 | filecheck %s --check-prefix=ZERO
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-saved-bytes=-1})' 2>&1 | filecheck %s --check-prefix=NEGATIVE

// XLA-COUNT-5: xla: argument_bytes={{[0-9]+}}
// NEAR-NOT: stablehlo.case
// NEAR-NOT: optimization_barrier
// ERR: recompute_for_late_readers.mlir: error: recompute-for-late-readers: unknown option 'bogus' (options: kept-reshapes, max-ops, min-distance, min-saved-bytes)
// ZERO: error: recompute-for-late-readers: min-distance must be at least 1, got 0
// NEGATIVE: error: recompute-for-late-readers: min-saved-bytes must be at least 0, got -1
// FLOOR-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8x16xf32>, %arg2: tensor<16x8xf32>, %arg3: tensor<4x8xf32>)
// FLOOR:         stablehlo.case
// FLOOR-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8xf32>, %arg2: tensor<4x8xf32>)
// FLOOR-NOT:     optimization_barrier
// FLOOR:         return
// ABOVE-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8x16xf32>, %arg2: tensor<16x8xf32>, %arg3: tensor<4x8xf32>)
// ABOVE-NOT:     stablehlo.case
// ABOVE:         return

// A Linear's input that the backward reads again for the weight gradient
// (dW = a^T g), an activation of the previous Linear's output h, which the
// backward keeps anyway (its derivative reads h): the dW dot reads a copy
// computed from h in a case whose index waits for g2, the dot's other operand.
func.func @main(%x: tensor<4x8xf32>, %w1: tensor<8x16xf32>, %w2: tensor<16x8xf32>, %g: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4x16xf32>) {
  %h = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  %t = stablehlo.tanh %h : tensor<4x16xf32>
  %a = stablehlo.multiply %h, %t : tensor<4x16xf32>
  %y = stablehlo.dot_general %a, %w2, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  %g1 = stablehlo.negate %g : tensor<4x8xf32>
  %g2 = stablehlo.negate %g1 : tensor<4x8xf32>
  %g3 = stablehlo.negate %g2 : tensor<4x8xf32>
  %dw = stablehlo.dot_general %a, %g3, contracting_dims = [0] x [0] : (tensor<4x16xf32>, tensor<4x8xf32>) -> tensor<16x8xf32>
  %dh = stablehlo.multiply %h, %h : tensor<4x16xf32>
  return %y, %dw, %dh : tensor<4x8xf32>, tensor<16x8xf32>, tensor<4x16xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8x16xf32>, %arg2: tensor<16x8xf32>, %arg3: tensor<4x8xf32>)
// CHECK:         %[[H:.+]] = stablehlo.dot_general %arg0, %arg1
// CHECK:         %[[T:.+]] = stablehlo.tanh %[[H]]
// CHECK:         %[[A:.+]] = stablehlo.multiply %[[H]], %[[T]]
// CHECK:         %[[Y:.+]] = stablehlo.dot_general %[[A]], %arg2
// CHECK:         %[[G1:.+]] = stablehlo.negate %arg3
// CHECK:         %[[G2:.+]] = stablehlo.negate %[[G1]]
// CHECK:         %[[G3:.+]] = stablehlo.negate %[[G2]]
// CHECK:         %[[E:.+]] = stablehlo.slice %[[G3]] [0:1, 0:1]
// CHECK:         %[[S:.+]] = stablehlo.reshape %[[E]] : (tensor<1x1xf32>) -> tensor<f32>
// CHECK:         %[[NE:.+]] = stablehlo.compare  NE, %[[S]], %[[S]]
// CHECK:         %[[I:.+]] = stablehlo.convert %[[NE]] : (tensor<i1>) -> tensor<i32>
// CHECK:         %[[C:.+]] = "stablehlo.case"(%[[I]]) ({
// CHECK:           %[[T1:.+]] = stablehlo.tanh %[[H]]
// CHECK:           %[[A1:.+]] = stablehlo.multiply %[[H]], %[[T1]]
// CHECK:           stablehlo.return %[[A1]]
// CHECK:         }, {
// CHECK:           %[[T2:.+]] = stablehlo.tanh %[[H]]
// CHECK:           %[[A2:.+]] = stablehlo.multiply %[[H]], %[[T2]]
// CHECK:           stablehlo.return %[[A2]]
// CHECK:         })
// CHECK:         %[[DW:.+]] = stablehlo.dot_general %[[C]], %[[G3]], contracting_dims = [0] x [0]
// CHECK:         return %[[Y]], %[[DW]],

// -----

// A weight broadcast to the activation's shape, read by the forward's
// x * w and the backward's g * w: the later reader gets its own broadcast
// over a barrier (XLA fuses it there); the forward keeps the original.
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8xf32>, %g: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %b = stablehlo.broadcast_in_dim %w, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
  %f = stablehlo.multiply %x, %b : tensor<4x8xf32>
  %g1 = stablehlo.negate %g : tensor<4x8xf32>
  %g2 = stablehlo.negate %g1 : tensor<4x8xf32>
  %g3 = stablehlo.negate %g2 : tensor<4x8xf32>
  %k = stablehlo.multiply %g3, %b : tensor<4x8xf32>
  return %f, %k : tensor<4x8xf32>, tensor<4x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8xf32>, %arg2: tensor<4x8xf32>)
// CHECK:         %[[B:.+]] = stablehlo.broadcast_in_dim %arg1, dims = [1]
// CHECK:         %[[F:.+]] = stablehlo.multiply %arg0, %[[B]]
// CHECK:         %[[G1:.+]] = stablehlo.negate %arg2
// CHECK:         %[[G2:.+]] = stablehlo.negate %[[G1]]
// CHECK:         %[[G3:.+]] = stablehlo.negate %[[G2]]
// CHECK:         %[[W:.+]] = stablehlo.optimization_barrier %arg1 : tensor<8xf32>
// CHECK:         %[[B1:.+]] = stablehlo.broadcast_in_dim %[[W]], dims = [1]
// CHECK:         %[[K:.+]] = stablehlo.multiply %[[G3]], %[[B1]]
// CHECK:         return %[[F]], %[[K]]

// -----

// Attention probabilities: the batch matmuls read them as [4, 4, 4]
// (reshaped), softmax's backward as [2, 2, 4, 4].  The backward's
// elementwise reader reads the matmul operand reshaped back: one buffer.
// (The scores are not read later: nothing recomputes the probabilities.)
func.func @main(%q: tensor<4x4x4xf32>, %v: tensor<4x4x4xf32>, %d: tensor<4x4x4xf32>) -> (tensor<4x4x4xf32>, tensor<4x4x4xf32>, tensor<2x2x4x4xf32>) {
  %s3 = stablehlo.dot_general %q, %q, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<4x4x4xf32>, tensor<4x4x4xf32>) -> tensor<4x4x4xf32>
  %s = stablehlo.reshape %s3 : (tensor<4x4x4xf32>) -> tensor<2x2x4x4xf32>
  %p = stablehlo.exponential %s : tensor<2x2x4x4xf32>
  %p3 = stablehlo.reshape %p : (tensor<2x2x4x4xf32>) -> tensor<4x4x4xf32>
  %o = stablehlo.dot_general %p3, %v, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x4x4xf32>, tensor<4x4x4xf32>) -> tensor<4x4x4xf32>
  %d1 = stablehlo.negate %d : tensor<4x4x4xf32>
  %d2 = stablehlo.negate %d1 : tensor<4x4x4xf32>
  %d3 = stablehlo.negate %d2 : tensor<4x4x4xf32>
  %dv = stablehlo.dot_general %p3, %d3, batching_dims = [0] x [0], contracting_dims = [1] x [1] : (tensor<4x4x4xf32>, tensor<4x4x4xf32>) -> tensor<4x4x4xf32>
  %dp = stablehlo.reshape %d3 : (tensor<4x4x4xf32>) -> tensor<2x2x4x4xf32>
  %ds = stablehlo.multiply %dp, %p : tensor<2x2x4x4xf32>
  return %o, %dv, %ds : tensor<4x4x4xf32>, tensor<4x4x4xf32>, tensor<2x2x4x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x4x4xf32>, %arg1: tensor<4x4x4xf32>, %arg2: tensor<4x4x4xf32>)
// CHECK:         %[[P:.+]] = stablehlo.exponential
// CHECK:         %[[P3:.+]] = stablehlo.reshape %[[P]] : (tensor<2x2x4x4xf32>) -> tensor<4x4x4xf32>
// CHECK:         %[[O:.+]] = stablehlo.dot_general %[[P3]], %arg1
// CHECK:         %[[D1:.+]] = stablehlo.negate %arg2
// CHECK:         %[[D2:.+]] = stablehlo.negate %[[D1]]
// CHECK:         %[[D3:.+]] = stablehlo.negate %[[D2]]
// CHECK:         %[[DV:.+]] = stablehlo.dot_general %[[P3]], %[[D3]], batching_dims
// CHECK:         %[[DP:.+]] = stablehlo.reshape %[[D3]]
// CHECK:         %[[K:.+]] = stablehlo.optimization_barrier %[[P3]] : tensor<4x4x4xf32>
// CHECK:         %[[P4:.+]] = stablehlo.reshape %[[K]] : (tensor<4x4x4xf32>) -> tensor<2x2x4x4xf32>
// CHECK:         %[[DS:.+]] = stablehlo.multiply %[[DP]], %[[P4]]
// CHECK:         return %[[O]], %[[DV]], %[[DS]]
// NOKEPT-LABEL:  func.func @main(%arg0: tensor<4x4x4xf32>, %arg1: tensor<4x4x4xf32>, %arg2: tensor<4x4x4xf32>)
// NOKEPT-NOT:    optimization_barrier
// NOKEPT-NOT:    stablehlo.case
// NOKEPT:        %[[P:.+]] = stablehlo.exponential
// NOKEPT-NOT:    optimization_barrier
// NOKEPT-NOT:    stablehlo.case
// NOKEPT:        stablehlo.multiply %{{.+}}, %[[P]] :
// NOKEPT-NOT:    optimization_barrier
// NOKEPT:        return

// -----

// Not rewritten: a chain whose input nothing reads later (the dot's result
// would be kept longer), a cheap chain read by a later elementwise op (XLA
// fuses it there anyway), a returned value, readers near each other.
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>, %g: tensor<4x8xf32>) -> (tensor<8x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %h = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %t = stablehlo.tanh %h : tensor<4x8xf32>
  %y = stablehlo.dot_general %t, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %c = stablehlo.multiply %x, %x : tensor<4x8xf32>
  %c1 = stablehlo.add %c, %y : tensor<4x8xf32>
  %r = stablehlo.negate %g : tensor<4x8xf32>
  %r1 = stablehlo.multiply %r, %y : tensor<4x8xf32>
  %g1 = stablehlo.negate %r1 : tensor<4x8xf32>
  %g2 = stablehlo.negate %g1 : tensor<4x8xf32>
  %g3 = stablehlo.negate %g2 : tensor<4x8xf32>
  %dw = stablehlo.dot_general %t, %g3, contracting_dims = [0] x [0] : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  %c2 = stablehlo.multiply %c, %g3 : tensor<4x8xf32>
  %r2 = stablehlo.add %r, %g3 : tensor<4x8xf32>
  return %dw, %c2, %r, %r2 : tensor<8x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<4x8xf32>)
// CHECK-NOT:     stablehlo.case
// CHECK-NOT:     optimization_barrier
// CHECK:         return

// -----

// A reshape of the value that is defined after the elementwise reader is
// not read by it (it would be used before it is defined).
func.func @main(%q: tensor<4x4x4xf32>, %d: tensor<2x2x4x4xf32>) -> (tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<4x4x4xf32>) {
  %s3 = stablehlo.dot_general %q, %q, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<4x4x4xf32>, tensor<4x4x4xf32>) -> tensor<4x4x4xf32>
  %s = stablehlo.reshape %s3 : (tensor<4x4x4xf32>) -> tensor<2x2x4x4xf32>
  %p = stablehlo.exponential %s : tensor<2x2x4x4xf32>
  %a = stablehlo.multiply %p, %p : tensor<2x2x4x4xf32>
  %d1 = stablehlo.negate %d : tensor<2x2x4x4xf32>
  %d2 = stablehlo.negate %d1 : tensor<2x2x4x4xf32>
  %d3 = stablehlo.negate %d2 : tensor<2x2x4x4xf32>
  %b = stablehlo.multiply %d3, %p : tensor<2x2x4x4xf32>
  %p3 = stablehlo.reshape %p : (tensor<2x2x4x4xf32>) -> tensor<4x4x4xf32>
  %o = stablehlo.dot_general %p3, %q, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x4x4xf32>, tensor<4x4x4xf32>) -> tensor<4x4x4xf32>
  return %a, %b, %o : tensor<2x2x4x4xf32>, tensor<2x2x4x4xf32>, tensor<4x4x4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x4x4xf32>, %arg1: tensor<2x2x4x4xf32>)
// CHECK-NOT:     optimization_barrier
// CHECK:         return
