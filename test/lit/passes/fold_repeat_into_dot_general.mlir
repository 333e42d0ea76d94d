// exact-scales-only=false also moves scales that are not powers of two.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-repeat-into-dot-general{exact-scales-only=false})' | filecheck %s
// Idempotent: a second run finds no repeated operand left.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-repeat-into-dot-general{exact-scales-only=false}, fold-repeat-into-dot-general{exact-scales-only=false})' | filecheck %s
// exact-scales-only (the default): a scale that is no constant power of two is applied to the
// unrepeated source instead of moving onto the dot's result; chunk-bytes as the CPU pipeline sets it.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-repeat-into-dot-general{chunk-bytes=262144})' | filecheck %s --check-prefix=EXACT
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-repeat-into-dot-general{chunk-bytes=262144}, fold-repeat-into-dot-general{chunk-bytes=262144})' | filecheck %s --check-prefix=EXACT
// The pass's default (chunk-bytes=0): a scaled source is never read in chunks.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-repeat-into-dot-general)' | filecheck %s --check-prefix=NOCHUNK
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-repeat-into-dot-general{exact-scales-only=false})' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(fold-repeat-into-dot-general{chunk-bytes=262144})' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA

// XLA-COUNT-8: xla: argument_bytes={{[0-9]+}}

// GQA decode, q @ k^T under SDPA as torch-mlir lowers it: K repeated from 2
// KV heads to 4 heads (repeat_kv), transposed, scaled by sqrt(1/sqrt(16)).
// The dot reads the cache itself, the group a free dim of q; the scale (a
// power of two) moves onto the scores.
func.func @main(%q: tensor<1x4x1x16xf32>, %k: tensor<1x2x8x16xf32>) -> tensor<4x1x8xf32> {
  %r = stablehlo.reshape %k : (tensor<1x2x8x16xf32>) -> tensor<1x2x1x8x16xf32>
  %b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3, 4] : (tensor<1x2x1x8x16xf32>) -> tensor<1x2x2x8x16xf32>
  %h = stablehlo.reshape %b : (tensor<1x2x2x8x16xf32>) -> tensor<1x4x8x16xf32>
  %t = stablehlo.transpose %h, dims = [0, 1, 3, 2] : (tensor<1x4x8x16xf32>) -> tensor<1x4x16x8xf32>
  %c = stablehlo.constant dense<5.000000e-01> : tensor<f32>
  %s = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<1x4x16x8xf32>
  %m = stablehlo.multiply %t, %s : tensor<1x4x16x8xf32>
  %q3 = stablehlo.reshape %q : (tensor<1x4x1x16xf32>) -> tensor<4x1x16xf32>
  %k3 = stablehlo.reshape %m : (tensor<1x4x16x8xf32>) -> tensor<4x16x8xf32>
  %d = stablehlo.dot_general %q3, %k3, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x1x16xf32>, tensor<4x16x8xf32>) -> tensor<4x1x8xf32>
  return %d : tensor<4x1x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<1x4x1x16xf32>, %arg1: tensor<1x2x8x16xf32>)
// CHECK-NOT:     broadcast_in_dim %{{.*}} -> tensor<1x2x2x8x16xf32>
// CHECK-NOT:     transpose
// CHECK:         %[[Q:.+]] = stablehlo.reshape %{{.+}} : (tensor<4x1x16xf32>) -> tensor<2x2x1x16xf32>
// CHECK:         %[[K:.+]] = stablehlo.reshape %arg1 : (tensor<1x2x8x16xf32>) -> tensor<2x8x16xf32>
// CHECK:         %[[D:.+]] = stablehlo.dot_general %[[Q]], %[[K]], batching_dims = [0] x [0], contracting_dims = [3] x [2] : (tensor<2x2x1x16xf32>, tensor<2x8x16xf32>) -> tensor<2x2x1x8xf32>
// CHECK:         %[[R:.+]] = stablehlo.reshape %[[D]] : (tensor<2x2x1x8xf32>) -> tensor<4x1x8xf32>
// CHECK:         %[[S:.+]] = stablehlo.broadcast_in_dim %{{.+}}, dims = [] : (tensor<f32>) -> tensor<4x1x8xf32>
// CHECK:         %[[M:.+]] = stablehlo.multiply %[[R]], %[[S]] : tensor<4x1x8xf32>
// CHECK:         return %[[M]]
// EXACT-LABEL: func.func @main(%arg0: tensor<1x4x1x16xf32>, %arg1: tensor<1x2x8x16xf32>)
// EXACT:         stablehlo.dot_general %{{.+}}, %{{.+}}, batching_dims = [0] x [0], contracting_dims = [3] x [2] : (tensor<2x2x1x16xf32>, tensor<2x8x16xf32>)

// -----

// GQA, p @ v: V repeated, the group a free dim of the probabilities.
func.func @main(%p: tensor<4x3x8xf32>, %v: tensor<1x2x8x16xf32>) -> tensor<4x3x16xf32> {
  %r = stablehlo.reshape %v : (tensor<1x2x8x16xf32>) -> tensor<1x2x1x8x16xf32>
  %b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3, 4] : (tensor<1x2x1x8x16xf32>) -> tensor<1x2x2x8x16xf32>
  %h = stablehlo.reshape %b : (tensor<1x2x2x8x16xf32>) -> tensor<1x4x8x16xf32>
  %v3 = stablehlo.reshape %h : (tensor<1x4x8x16xf32>) -> tensor<4x8x16xf32>
  %d = stablehlo.dot_general %p, %v3, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x3x8xf32>, tensor<4x8x16xf32>) -> tensor<4x3x16xf32>
  return %d : tensor<4x3x16xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x3x8xf32>, %arg1: tensor<1x2x8x16xf32>)
// CHECK-NOT:     broadcast_in_dim
// CHECK:         %[[P:.+]] = stablehlo.reshape %arg0 : (tensor<4x3x8xf32>) -> tensor<2x2x3x8xf32>
// CHECK:         %[[V:.+]] = stablehlo.reshape %arg1 : (tensor<1x2x8x16xf32>) -> tensor<2x8x16xf32>
// CHECK:         %[[D:.+]] = stablehlo.dot_general %[[P]], %[[V]], batching_dims = [0] x [0], contracting_dims = [3] x [1] : (tensor<2x2x3x8xf32>, tensor<2x8x16xf32>) -> tensor<2x2x3x16xf32>
// CHECK:         %[[R:.+]] = stablehlo.reshape %[[D]] : (tensor<2x2x3x16xf32>) -> tensor<4x3x16xf32>
// CHECK:         return %[[R]]
// EXACT-LABEL: func.func @main(%arg0: tensor<4x3x8xf32>, %arg1: tensor<1x2x8x16xf32>)
// EXACT:         stablehlo.dot_general %{{.+}}, %{{.+}}, batching_dims = [0] x [0], contracting_dims = [3] x [1]

// -----

// A scale that is no power of two (head_dim 64: sqrt(1/8)) moves with
// exact-scales-only=false; the default applies it to the unrepeated source
// (exact) and folds the repeat and the transpose all the same.
func.func @main(%q: tensor<4x1x64xf32>, %k: tensor<2x8x64xf32>, %c: tensor<f32>) -> tensor<4x1x8xf32> {
  %r = stablehlo.reshape %k : (tensor<2x8x64xf32>) -> tensor<2x1x8x64xf32>
  %b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3] : (tensor<2x1x8x64xf32>) -> tensor<2x2x8x64xf32>
  %h = stablehlo.reshape %b : (tensor<2x2x8x64xf32>) -> tensor<4x8x64xf32>
  %t = stablehlo.transpose %h, dims = [0, 2, 1] : (tensor<4x8x64xf32>) -> tensor<4x64x8xf32>
  %s = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<4x64x8xf32>
  %m = stablehlo.multiply %t, %s : tensor<4x64x8xf32>
  %d = stablehlo.dot_general %q, %m, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x1x64xf32>, tensor<4x64x8xf32>) -> tensor<4x1x8xf32>
  return %d : tensor<4x1x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x1x64xf32>, %arg1: tensor<2x8x64xf32>, %arg2: tensor<f32>)
// CHECK-NOT:     transpose
// CHECK:         %[[D:.+]] = stablehlo.dot_general %{{.+}}, %arg1, batching_dims = [0] x [0], contracting_dims = [3] x [2] : (tensor<2x2x1x64xf32>, tensor<2x8x64xf32>) -> tensor<2x2x1x8xf32>
// CHECK:         %[[R:.+]] = stablehlo.reshape %[[D]] : (tensor<2x2x1x8xf32>) -> tensor<4x1x8xf32>
// CHECK:         %[[S:.+]] = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<4x1x8xf32>
// CHECK:         stablehlo.multiply %[[R]], %[[S]]
// EXACT-LABEL: func.func @main(%arg0: tensor<4x1x64xf32>, %arg1: tensor<2x8x64xf32>, %arg2: tensor<f32>)
// EXACT-NOT:     transpose
// EXACT:         %[[ES:.+]] = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<2x8x64xf32>
// EXACT:         %[[EK:.+]] = stablehlo.multiply %arg1, %[[ES]] : tensor<2x8x64xf32>
// EXACT:         %[[ED:.+]] = stablehlo.dot_general %{{.+}}, %[[EK]], batching_dims = [0] x [0], contracting_dims = [3] x [2] : (tensor<2x2x1x64xf32>, tensor<2x8x64xf32>) -> tensor<2x2x1x8xf32>
// EXACT:         %[[ER:.+]] = stablehlo.reshape %[[ED]] : (tensor<2x2x1x8xf32>) -> tensor<4x1x8xf32>
// EXACT-NEXT:    return %[[ER]]

// -----

// Never fires: a repeat along the contracting dim (every product counted
// twice), a batched dot without a repeat, and a repeated operand on the left
// with free dims of its own (the result's dim order would change).
func.func @main(%a: tensor<2x3x16xf32>, %x: tensor<2x5x8xf32>, %y: tensor<2x8x6xf32>, %k: tensor<2x7x5xf32>, %w: tensor<4x3x5xf32>) -> (tensor<2x3x5xf32>, tensor<2x5x6xf32>, tensor<4x7x3xf32>) {
  %r = stablehlo.reshape %x : (tensor<2x5x8xf32>) -> tensor<2x5x1x8xf32>
  %b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3] : (tensor<2x5x1x8xf32>) -> tensor<2x5x2x8xf32>
  %h = stablehlo.reshape %b : (tensor<2x5x2x8xf32>) -> tensor<2x5x16xf32>
  %d0 = stablehlo.dot_general %a, %h, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x3x16xf32>, tensor<2x5x16xf32>) -> tensor<2x3x5xf32>
  %d1 = stablehlo.dot_general %x, %y, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x5x8xf32>, tensor<2x8x6xf32>) -> tensor<2x5x6xf32>
  %kr = stablehlo.reshape %k : (tensor<2x7x5xf32>) -> tensor<2x1x7x5xf32>
  %kb = stablehlo.broadcast_in_dim %kr, dims = [0, 1, 2, 3] : (tensor<2x1x7x5xf32>) -> tensor<2x2x7x5xf32>
  %kh = stablehlo.reshape %kb : (tensor<2x2x7x5xf32>) -> tensor<4x7x5xf32>
  %d2 = stablehlo.dot_general %kh, %w, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<4x7x5xf32>, tensor<4x3x5xf32>) -> tensor<4x7x3xf32>
  return %d0, %d1, %d2 : tensor<2x3x5xf32>, tensor<2x5x6xf32>, tensor<4x7x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         %[[B:.+]] = stablehlo.broadcast_in_dim %{{.+}} -> tensor<2x5x2x8xf32>
// CHECK:         %[[H:.+]] = stablehlo.reshape %[[B]]
// CHECK:         stablehlo.dot_general %arg0, %[[H]], batching_dims = [0] x [0], contracting_dims = [2] x [2]
// CHECK:         stablehlo.dot_general %arg1, %arg2, batching_dims = [0] x [0], contracting_dims = [2] x [1]
// CHECK:         %[[KB:.+]] = stablehlo.broadcast_in_dim %{{.+}} -> tensor<2x2x7x5xf32>
// CHECK:         %[[KH:.+]] = stablehlo.reshape %[[KB]]
// CHECK:         stablehlo.dot_general %[[KH]], %arg4, batching_dims = [0] x [0], contracting_dims = [2] x [2]

// -----

// Never fires on a cache a one-row dynamic_update_slice writes (the CPU backend
// would duplicate that write into the reshape the dot reads; run
// widen-one-row-updates first).
func.func @main(%p: tensor<4x3x8xf32>, %v: tensor<1x2x8x16xf32>, %row: tensor<1x2x1x16xf32>, %i: tensor<i64>) -> (tensor<1x2x8x16xf32>, tensor<4x3x16xf32>) {
  %z = stablehlo.constant dense<0> : tensor<i64>
  %u = stablehlo.dynamic_update_slice %v, %row, %z, %z, %i, %z : (tensor<1x2x8x16xf32>, tensor<1x2x1x16xf32>, tensor<i64>, tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<1x2x8x16xf32>
  %r = stablehlo.reshape %u : (tensor<1x2x8x16xf32>) -> tensor<1x2x1x8x16xf32>
  %b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3, 4] : (tensor<1x2x1x8x16xf32>) -> tensor<1x2x2x8x16xf32>
  %h = stablehlo.reshape %b : (tensor<1x2x2x8x16xf32>) -> tensor<4x8x16xf32>
  %d = stablehlo.dot_general %p, %h, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x3x8xf32>, tensor<4x8x16xf32>) -> tensor<4x3x16xf32>
  return %u, %d : tensor<1x2x8x16xf32>, tensor<4x3x16xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x3x8xf32>, %arg1: tensor<1x2x8x16xf32>
// CHECK:         stablehlo.broadcast_in_dim %{{.+}} -> tensor<1x2x2x8x16xf32>
// CHECK:         stablehlo.dot_general %arg0, %{{.+}}, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x3x8xf32>, tensor<4x8x16xf32>)
// EXACT-LABEL: func.func @main(%arg0: tensor<4x3x8xf32>, %arg1: tensor<1x2x8x16xf32>
// EXACT:         stablehlo.broadcast_in_dim %{{.+}} -> tensor<1x2x2x8x16xf32>

// -----

// A decode step's q @ k^T at head_dim 64 over a 1024-long cache of 4 KV heads:
// the scaled cache (1 MiB) is larger than chunk-bytes (256 KiB) and than the
// scores, so with chunk-bytes=262144 (the CPU pipeline's) the exact default
// reads it in 4 chunks of 256 positions: the
// first before a while loop (its dot padded to the scores' shape), the other
// three in it, each sliced, scaled and written into the scores (the same
// products: one chunk's scaled copy alive instead of the whole cache's).  A
// second run finds the loop's dots reading no repeat.  exact-scales-only=false
// moves the scale onto the scores and needs no copy, so no loop; with
// chunk-bytes=0 (the pass's default) the whole cache is scaled.
func.func @main(%q: tensor<8x1x64xf32>, %k: tensor<1x4x1024x64xf32>, %c: tensor<f32>) -> tensor<8x1x1024xf32> {
  %r = stablehlo.reshape %k : (tensor<1x4x1024x64xf32>) -> tensor<1x4x1x1024x64xf32>
  %b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3, 4] : (tensor<1x4x1x1024x64xf32>) -> tensor<1x4x2x1024x64xf32>
  %h = stablehlo.reshape %b : (tensor<1x4x2x1024x64xf32>) -> tensor<1x8x1024x64xf32>
  %t = stablehlo.transpose %h, dims = [0, 1, 3, 2] : (tensor<1x8x1024x64xf32>) -> tensor<1x8x64x1024xf32>
  %s = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<1x8x64x1024xf32>
  %m = stablehlo.multiply %t, %s : tensor<1x8x64x1024xf32>
  %k3 = stablehlo.reshape %m : (tensor<1x8x64x1024xf32>) -> tensor<8x64x1024xf32>
  %d = stablehlo.dot_general %q, %k3, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<8x1x64xf32>, tensor<8x64x1024xf32>) -> tensor<8x1x1024xf32>
  return %d : tensor<8x1x1024xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8x1x64xf32>, %arg1: tensor<1x4x1024x64xf32>, %arg2: tensor<f32>)
// CHECK-NOT:     stablehlo.while
// CHECK:         stablehlo.dot_general %{{.+}}, %{{.+}}, batching_dims = [0] x [0], contracting_dims = [3] x [2] : (tensor<4x2x1x64xf32>, tensor<4x1024x64xf32>)
// EXACT-LABEL: func.func @main(%arg0: tensor<8x1x64xf32>, %arg1: tensor<1x4x1024x64xf32>, %arg2: tensor<f32>)
// EXACT-DAG:     %[[ONE:.+]] = stablehlo.constant dense<1> : tensor<i64>
// EXACT-DAG:     %[[SIZE:.+]] = stablehlo.constant dense<256> : tensor<i64>
// EXACT-DAG:     %[[COUNT:.+]] = stablehlo.constant dense<4> : tensor<i64>
// EXACT-DAG:     %[[ZERO:.+]] = stablehlo.constant dense<0> : tensor<i64>
// EXACT-NOT:     transpose
// EXACT:         %[[Q:.+]] = stablehlo.reshape %arg0 : (tensor<8x1x64xf32>) -> tensor<4x2x1x64xf32>
// EXACT:         %[[K:.+]] = stablehlo.reshape %arg1 : (tensor<1x4x1024x64xf32>) -> tensor<4x1024x64xf32>
// EXACT:         %[[K0:.+]] = stablehlo.slice %[[K]] [0:4, 0:256, 0:64]
// EXACT:         %[[C0:.+]] = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<4x256x64xf32>
// EXACT:         %[[M0:.+]] = stablehlo.multiply %[[K0]], %[[C0]] : tensor<4x256x64xf32>
// EXACT:         %[[D0:.+]] = stablehlo.dot_general %[[Q]], %[[M0]], batching_dims = [0] x [0], contracting_dims = [3] x [2] : (tensor<4x2x1x64xf32>, tensor<4x256x64xf32>) -> tensor<4x2x1x256xf32>
// EXACT:         %[[P:.+]] = stablehlo.pad %[[D0]], %{{.+}}, low = [0, 0, 0, 0], high = [0, 0, 0, 768], interior = [0, 0, 0, 0]
// EXACT:         %[[W:.+]]:5 = stablehlo.while(%[[I:.+]] = %[[ONE]], %[[A:.+]] = %[[P]], %[[QA:.+]] = %[[Q]], %[[KA:.+]] = %[[K]], %[[CA:.+]] = %arg2)
// EXACT:         stablehlo.compare LT, %[[I]], %[[COUNT]], SIGNED
// EXACT:         } do {
// EXACT:         %[[S:.+]] = stablehlo.multiply %[[I]], %[[SIZE]] : tensor<i64>
// EXACT:         %[[KC:.+]] = stablehlo.dynamic_slice %[[KA]], %[[ZERO]], %[[S]], %[[ZERO]], sizes = [4, 256, 64]
// EXACT:         %[[F:.+]] = stablehlo.broadcast_in_dim %[[CA]], dims = [] : (tensor<f32>) -> tensor<4x256x64xf32>
// EXACT:         %[[M:.+]] = stablehlo.multiply %[[KC]], %[[F]] : tensor<4x256x64xf32>
// EXACT:         %[[D:.+]] = stablehlo.dot_general %[[QA]], %[[M]], batching_dims = [0] x [0], contracting_dims = [3] x [2] : (tensor<4x2x1x64xf32>, tensor<4x256x64xf32>) -> tensor<4x2x1x256xf32>
// EXACT:         %[[U:.+]] = stablehlo.dynamic_update_slice %[[A]], %[[D]], %[[ZERO]], %[[ZERO]], %[[ZERO]], %[[S]]
// EXACT:         %[[NEXT:.+]] = stablehlo.add %[[I]], %[[ONE]] : tensor<i64>
// EXACT:         stablehlo.return %[[NEXT]], %[[U]], %[[QA]], %[[KA]], %[[CA]]
// EXACT:         %[[R:.+]] = stablehlo.reshape %[[W]]#1 : (tensor<4x2x1x1024xf32>) -> tensor<8x1x1024xf32>
// EXACT-NEXT:    return %[[R]]
// NOCHUNK-LABEL: func.func @main(%arg0: tensor<8x1x64xf32>, %arg1: tensor<1x4x1024x64xf32>, %arg2: tensor<f32>)
// NOCHUNK-NOT:   stablehlo.while
// NOCHUNK:       %[[NS:.+]] = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<1x4x1024x64xf32>
// NOCHUNK:       stablehlo.multiply %arg1, %[[NS]] : tensor<1x4x1024x64xf32>

// -----

// Not in chunks: a cache length that is no multiple of 256 (1000), and a
// prefill's scores (64 queries x 1024 keys x 8 heads, 2 MiB) larger than its
// scaled cache (1 MiB): the whole source is scaled, as before.
func.func @main(%q: tensor<8x1x64xf32>, %k: tensor<1x4x1000x64xf32>, %qp: tensor<8x64x64xf32>, %kp: tensor<1x4x1024x64xf32>, %c: tensor<f32>) -> (tensor<8x1x1000xf32>, tensor<8x64x1024xf32>) {
  %r = stablehlo.reshape %k : (tensor<1x4x1000x64xf32>) -> tensor<1x4x1x1000x64xf32>
  %b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3, 4] : (tensor<1x4x1x1000x64xf32>) -> tensor<1x4x2x1000x64xf32>
  %h = stablehlo.reshape %b : (tensor<1x4x2x1000x64xf32>) -> tensor<8x1000x64xf32>
  %t = stablehlo.transpose %h, dims = [0, 2, 1] : (tensor<8x1000x64xf32>) -> tensor<8x64x1000xf32>
  %s = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<8x64x1000xf32>
  %m = stablehlo.multiply %t, %s : tensor<8x64x1000xf32>
  %d = stablehlo.dot_general %q, %m, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<8x1x64xf32>, tensor<8x64x1000xf32>) -> tensor<8x1x1000xf32>
  %rp = stablehlo.reshape %kp : (tensor<1x4x1024x64xf32>) -> tensor<1x4x1x1024x64xf32>
  %bp = stablehlo.broadcast_in_dim %rp, dims = [0, 1, 2, 3, 4] : (tensor<1x4x1x1024x64xf32>) -> tensor<1x4x2x1024x64xf32>
  %hp = stablehlo.reshape %bp : (tensor<1x4x2x1024x64xf32>) -> tensor<8x1024x64xf32>
  %tp = stablehlo.transpose %hp, dims = [0, 2, 1] : (tensor<8x1024x64xf32>) -> tensor<8x64x1024xf32>
  %sp = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<8x64x1024xf32>
  %mp = stablehlo.multiply %tp, %sp : tensor<8x64x1024xf32>
  %dp = stablehlo.dot_general %qp, %mp, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<8x64x64xf32>, tensor<8x64x1024xf32>) -> tensor<8x64x1024xf32>
  return %d, %dp : tensor<8x1x1000xf32>, tensor<8x64x1024xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8x1x64xf32>, %arg1: tensor<1x4x1000x64xf32>
// CHECK-NOT:     stablehlo.while
// EXACT-LABEL: func.func @main(%arg0: tensor<8x1x64xf32>, %arg1: tensor<1x4x1000x64xf32>
// EXACT-NOT:     stablehlo.while
// EXACT:         %[[S1:.+]] = stablehlo.broadcast_in_dim %arg4, dims = [] : (tensor<f32>) -> tensor<1x4x1000x64xf32>
// EXACT:         %[[M1:.+]] = stablehlo.multiply %arg1, %[[S1]] : tensor<1x4x1000x64xf32>
// EXACT:         %[[K1:.+]] = stablehlo.reshape %[[M1]] : (tensor<1x4x1000x64xf32>) -> tensor<4x1000x64xf32>
// EXACT:         stablehlo.dot_general %{{.+}}, %[[K1]], batching_dims = [0] x [0], contracting_dims = [3] x [2] : (tensor<4x2x1x64xf32>, tensor<4x1000x64xf32>)
// EXACT-NOT:     stablehlo.while
// EXACT:         %[[S2:.+]] = stablehlo.broadcast_in_dim %arg4, dims = [] : (tensor<f32>) -> tensor<1x4x1024x64xf32>
// EXACT:         %[[M2:.+]] = stablehlo.multiply %arg3, %[[S2]] : tensor<1x4x1024x64xf32>
// EXACT:         %[[K2:.+]] = stablehlo.reshape %[[M2]] : (tensor<1x4x1024x64xf32>) -> tensor<4x1024x64xf32>
// EXACT:         stablehlo.dot_general %{{.+}}, %[[K2]], batching_dims = [0] x [0], contracting_dims = [3] x [2] : (tensor<4x2x64x64xf32>, tensor<4x1024x64xf32>)

// -----

// A bf16 cache upcast to f32 after the repeat (torch's SDPA math on bf16):
// the convert commutes with the repeat, so it and the scale (even a power
// of two, with either option) are applied to the unrepeated cache, in the
// chain's order, and both dots read the converted cache; no chunks (the CPU backend
// would hoist the convert out of the loop).
func.func @main(%q: tensor<4x1x16xf32>, %k: tensor<1x2x8x16xbf16>, %p: tensor<4x1x8xf32>) -> (tensor<4x1x8xf32>, tensor<4x1x16xf32>) {
  %r = stablehlo.reshape %k : (tensor<1x2x8x16xbf16>) -> tensor<1x2x1x8x16xbf16>
  %b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3, 4] : (tensor<1x2x1x8x16xbf16>) -> tensor<1x2x2x8x16xbf16>
  %h = stablehlo.reshape %b : (tensor<1x2x2x8x16xbf16>) -> tensor<1x4x8x16xbf16>
  %f = stablehlo.convert %h : (tensor<1x4x8x16xbf16>) -> tensor<1x4x8x16xf32>
  %t = stablehlo.transpose %f, dims = [0, 1, 3, 2] : (tensor<1x4x8x16xf32>) -> tensor<1x4x16x8xf32>
  %c = stablehlo.constant dense<5.000000e-01> : tensor<f32>
  %s = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<1x4x16x8xf32>
  %m = stablehlo.multiply %t, %s : tensor<1x4x16x8xf32>
  %k3 = stablehlo.reshape %m : (tensor<1x4x16x8xf32>) -> tensor<4x16x8xf32>
  %d = stablehlo.dot_general %q, %k3, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x1x16xf32>, tensor<4x16x8xf32>) -> tensor<4x1x8xf32>
  %v3 = stablehlo.reshape %f : (tensor<1x4x8x16xf32>) -> tensor<4x8x16xf32>
  %o = stablehlo.dot_general %p, %v3, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x1x8xf32>, tensor<4x8x16xf32>) -> tensor<4x1x16xf32>
  return %d, %o : tensor<4x1x8xf32>, tensor<4x1x16xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x1x16xf32>, %arg1: tensor<1x2x8x16xbf16>, %arg2: tensor<4x1x8xf32>)
// CHECK-NOT:     broadcast_in_dim %{{.*}} -> tensor<1x2x2x8x16xbf16>
// CHECK-NOT:     transpose
// CHECK-NOT:     stablehlo.while
// CHECK:         %[[F:.+]] = stablehlo.convert %arg1 : (tensor<1x2x8x16xbf16>) -> tensor<1x2x8x16xf32>
// CHECK:         %[[M:.+]] = stablehlo.multiply %[[F]], %{{.+}} : tensor<1x2x8x16xf32>
// CHECK:         %[[K:.+]] = stablehlo.reshape %[[M]] : (tensor<1x2x8x16xf32>) -> tensor<2x8x16xf32>
// CHECK:         stablehlo.dot_general %{{.+}}, %[[K]], batching_dims = [0] x [0], contracting_dims = [3] x [2] : (tensor<2x2x1x16xf32>, tensor<2x8x16xf32>) -> tensor<2x2x1x8xf32>
// CHECK:         %[[FV:.+]] = stablehlo.convert %arg1 : (tensor<1x2x8x16xbf16>) -> tensor<1x2x8x16xf32>
// CHECK:         %[[V:.+]] = stablehlo.reshape %[[FV]] : (tensor<1x2x8x16xf32>) -> tensor<2x8x16xf32>
// CHECK:         stablehlo.dot_general %{{.+}}, %[[V]], batching_dims = [0] x [0], contracting_dims = [3] x [1] : (tensor<2x2x1x8xf32>, tensor<2x8x16xf32>) -> tensor<2x2x1x16xf32>
// EXACT-LABEL: func.func @main(%arg0: tensor<4x1x16xf32>, %arg1: tensor<1x2x8x16xbf16>, %arg2: tensor<4x1x8xf32>)
// EXACT-NOT:     transpose
// EXACT:         %[[EF:.+]] = stablehlo.convert %arg1 : (tensor<1x2x8x16xbf16>) -> tensor<1x2x8x16xf32>
// EXACT:         %[[EM:.+]] = stablehlo.multiply %[[EF]], %{{.+}} : tensor<1x2x8x16xf32>
// EXACT:         stablehlo.dot_general
// EXACT:         stablehlo.convert %arg1 : (tensor<1x2x8x16xbf16>) -> tensor<1x2x8x16xf32>
