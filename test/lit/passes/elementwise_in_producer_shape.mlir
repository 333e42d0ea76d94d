// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(elementwise-in-producer-shape)' | filecheck %s
// Idempotent: a region already in its producer's shape has no reshapes left.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(elementwise-in-producer-shape, elementwise-in-producer-shape)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(elementwise-in-producer-shape)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The values equal the unrewritten program's bit for bit, and XLA writes
// the activation in place: test/py/test_elementwise_shape_bytes.py.

// XLA-COUNT-3: xla: argument_bytes={{[0-9]+}}

// A Linear on [2, 4, 8] with a bias and an activation, then the next
// Linear (Swin's MLP as torch-mlir lowers it): the first dot computes
// [8, 6] (its lhs free dims merged), the bias, the splat scale, the
// constant subexpression and tanh run in [8, 6], and no reshape is left
// between the two dots.
func.func @main(%x: tensor<2x4x8xf32>, %w1: tensor<6x8xf32>, %b1: tensor<6xf32>, %w2: tensor<3x6xf32>) -> tensor<8x3xf32> {
  %half = stablehlo.constant dense<5.000000e-01> : tensor<2x4x6xf32>
  %two = stablehlo.constant dense<2.000000e+00> : tensor<2x4x6xf32>
  %lo = stablehlo.constant dense<-4.000000e+00> : tensor<f32>
  %hi = stablehlo.constant dense<4.000000e+00> : tensor<f32>
  %d = stablehlo.dot_general %x, %w1, contracting_dims = [2] x [1] : (tensor<2x4x8xf32>, tensor<6x8xf32>) -> tensor<2x4x6xf32>
  %same = stablehlo.reshape %d : (tensor<2x4x6xf32>) -> tensor<2x4x6xf32>
  %bb = stablehlo.broadcast_in_dim %b1, dims = [2] : (tensor<6xf32>) -> tensor<2x4x6xf32>
  %h = stablehlo.add %same, %bb : tensor<2x4x6xf32>
  %s = stablehlo.rsqrt %two : tensor<2x4x6xf32>
  %t = stablehlo.multiply %h, %s : tensor<2x4x6xf32>
  %c = stablehlo.clamp %lo, %t, %hi : (tensor<f32>, tensor<2x4x6xf32>, tensor<f32>) -> tensor<2x4x6xf32>
  %th = stablehlo.tanh %c : tensor<2x4x6xf32>
  %g = stablehlo.multiply %th, %half : tensor<2x4x6xf32>
  %r = stablehlo.reshape %g : (tensor<2x4x6xf32>) -> tensor<8x6xf32>
  %y = stablehlo.dot_general %r, %w2, contracting_dims = [1] x [1] : (tensor<8x6xf32>, tensor<3x6xf32>) -> tensor<8x3xf32>
  return %y : tensor<8x3xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<2x4x8xf32>, %arg1: tensor<6x8xf32>, %arg2: tensor<6xf32>, %arg3: tensor<3x6xf32>)
// CHECK:         %[[L:.+]] = stablehlo.reshape %arg0 : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
// CHECK:         %[[D:.+]] = stablehlo.dot_general %[[L]], %arg1, contracting_dims = [1] x [1] : (tensor<8x8xf32>, tensor<6x8xf32>) -> tensor<8x6xf32>
// CHECK-NOT:     tensor<2x4x6xf32>
// CHECK:         %[[B:.+]] = stablehlo.broadcast_in_dim %{{.+}}, dims = [1] : (tensor<6xf32>) -> tensor<8x6xf32>
// CHECK:         %[[H:.+]] = stablehlo.add %[[D]], %[[B]] : tensor<8x6xf32>
// CHECK:         stablehlo.rsqrt %{{.+}} : tensor<8x6xf32>
// CHECK:         stablehlo.clamp %{{.+}}, %{{.+}}, %{{.+}} : (tensor<f32>, tensor<8x6xf32>, tensor<f32>) -> tensor<8x6xf32>
// CHECK:         %[[T:.+]] = stablehlo.tanh %{{.+}} : tensor<8x6xf32>
// CHECK:         %[[G:.+]] = stablehlo.multiply %[[T]], %{{.+}} : tensor<8x6xf32>
// CHECK:         stablehlo.dot_general %[[G]], %arg3, contracting_dims = [1] x [1] : (tensor<8x6xf32>, tensor<3x6xf32>) -> tensor<8x3xf32>
// CHECK-NOT:     tensor<2x4x6xf32>

// -----

// A reshape out of [8, 6] whose elementwise result is reshaped back, with
// a second exit: both read the region computed in [8, 6].
func.func @main(%a: tensor<8x6xf32>) -> (tensor<8x6xf32>, tensor<48xf32>) {
  %r = stablehlo.reshape %a : (tensor<8x6xf32>) -> tensor<2x4x6xf32>
  %e = stablehlo.exponential %r : tensor<2x4x6xf32>
  %back = stablehlo.reshape %e : (tensor<2x4x6xf32>) -> tensor<8x6xf32>
  %back2 = stablehlo.reshape %e : (tensor<2x4x6xf32>) -> tensor<8x6xf32>
  %n = stablehlo.negate %back2 : tensor<8x6xf32>
  %flat = stablehlo.reshape %n : (tensor<8x6xf32>) -> tensor<48xf32>
  return %back, %flat : tensor<8x6xf32>, tensor<48xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8x6xf32>)
// CHECK:         %[[E:.+]] = stablehlo.exponential %arg0 : tensor<8x6xf32>
// CHECK:         %[[N:.+]] = stablehlo.negate %[[E]] : tensor<8x6xf32>
// CHECK:         %[[F:.+]] = stablehlo.reshape %[[N]] : (tensor<8x6xf32>) -> tensor<48xf32>
// CHECK:         return %[[E]], %[[F]]

// -----

// Never fires: a region value with another use (the exponential is also
// returned), an input of shape B computed otherwise (a block argument), and
// a broadcast along a dimension the reshape splits.
func.func @main(%a: tensor<8x6xf32>, %b: tensor<2x4x6xf32>, %v: tensor<4xf32>) -> (tensor<8x6xf32>, tensor<2x4x6xf32>, tensor<8x6xf32>, tensor<8x6xf32>) {
  %r = stablehlo.reshape %a : (tensor<8x6xf32>) -> tensor<2x4x6xf32>
  %e = stablehlo.exponential %r : tensor<2x4x6xf32>
  %back = stablehlo.reshape %e : (tensor<2x4x6xf32>) -> tensor<8x6xf32>
  %s = stablehlo.add %r, %b : tensor<2x4x6xf32>
  %back2 = stablehlo.reshape %s : (tensor<2x4x6xf32>) -> tensor<8x6xf32>
  %bv = stablehlo.broadcast_in_dim %v, dims = [1] : (tensor<4xf32>) -> tensor<2x4x6xf32>
  %m = stablehlo.multiply %r, %bv : tensor<2x4x6xf32>
  %back3 = stablehlo.reshape %m : (tensor<2x4x6xf32>) -> tensor<8x6xf32>
  return %back, %e, %back2, %back3 : tensor<8x6xf32>, tensor<2x4x6xf32>, tensor<8x6xf32>, tensor<8x6xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         stablehlo.exponential %{{.+}} : tensor<2x4x6xf32>
// CHECK:         stablehlo.add %{{.+}}, %arg1 : tensor<2x4x6xf32>
// CHECK:         stablehlo.multiply %{{.+}}, %{{.+}} : tensor<2x4x6xf32>
// CHECK-NOT:     tensor<8x6xf32> = stablehlo
