// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(accumulate-bf16-dots-in-f32)' | filecheck %s
// Idempotent: a dot with an f32 result is left as it is.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(accumulate-bf16-dots-in-f32, accumulate-bf16-dots-in-f32)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(accumulate-bf16-dots-in-f32)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA

// XLA-COUNT-4: xla: argument_bytes={{[0-9]+}}

// A bf16 Linear as torch-mlir lowers it: the dot produces f32, one convert after.
func.func @main(%w: tensor<8x4xbf16>, %x: tensor<2x4xbf16>) -> tensor<2x8xbf16> {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<2x4xbf16>, tensor<8x4xbf16>) -> tensor<2x8xbf16>
  return %d : tensor<2x8xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8x4xbf16>, %arg1: tensor<2x4xbf16>)
// CHECK:         %[[D:.+]] = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [1] : (tensor<2x4xbf16>, tensor<8x4xbf16>) -> tensor<2x8xf32>
// CHECK:         %[[C:.+]] = stablehlo.convert %[[D]] : (tensor<2x8xf32>) -> tensor<2x8xbf16>
// CHECK:         return %[[C]]

// -----

// Never fires: f16 (the CPU backend converts its operands either way), f32, a
// mixed-type dot, and a bf16 dot that already produces f32.
func.func @main(%a: tensor<2x4xf16>, %b: tensor<4x3xf16>, %c: tensor<2x4xf32>, %d: tensor<4x3xf32>, %e: tensor<2x4xbf16>, %f: tensor<4x3xbf16>) -> (tensor<2x3xf16>, tensor<2x3xf32>, tensor<2x3xf32>) {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x4xf16>, tensor<4x3xf16>) -> tensor<2x3xf16>
  %1 = stablehlo.dot_general %c, %d, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %2 = stablehlo.dot_general %e, %f, contracting_dims = [1] x [0] : (tensor<2x4xbf16>, tensor<4x3xbf16>) -> tensor<2x3xf32>
  return %0, %1, %2 : tensor<2x3xf16>, tensor<2x3xf32>, tensor<2x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-NOT:     stablehlo.convert
// CHECK:         stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<2x4xf16>, tensor<4x3xf16>) -> tensor<2x3xf16>
// CHECK:         stablehlo.dot_general %arg2, %arg3
// CHECK:         stablehlo.dot_general %arg4, %arg5, contracting_dims = [1] x [0] : (tensor<2x4xbf16>, tensor<4x3xbf16>) -> tensor<2x3xf32>
// CHECK-NOT:     stablehlo.convert

// -----

// A bf16 Linear with a bias as torch-mlir lowers `addmm`: input and
// transposed weight converted to f32, an f32 dot, the bias added in f32.
// The dot reads the bf16 values, and the transpose the convert hid is folded.
func.func @main(%w: tensor<8x4xbf16>, %b: tensor<8xbf16>, %x: tensor<2x4xbf16>) -> tensor<2x8xbf16> {
  %t = stablehlo.transpose %w, dims = [1, 0] : (tensor<8x4xbf16>) -> tensor<4x8xbf16>
  %xf = stablehlo.convert %x : (tensor<2x4xbf16>) -> tensor<2x4xf32>
  %tf = stablehlo.convert %t : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %d = stablehlo.dot_general %xf, %tf, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x8xf32>) -> tensor<2x8xf32>
  %bf = stablehlo.convert %b : (tensor<8xbf16>) -> tensor<8xf32>
  %bb = stablehlo.broadcast_in_dim %bf, dims = [1] : (tensor<8xf32>) -> tensor<2x8xf32>
  %s = stablehlo.add %d, %bb : tensor<2x8xf32>
  %r = stablehlo.convert %s : (tensor<2x8xf32>) -> tensor<2x8xbf16>
  return %r : tensor<2x8xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8x4xbf16>, %arg1: tensor<8xbf16>, %arg2: tensor<2x4xbf16>)
// CHECK-NOT:     stablehlo.transpose
// CHECK:         %[[D:.+]] = stablehlo.dot_general %arg2, %arg0, contracting_dims = [1] x [1] : (tensor<2x4xbf16>, tensor<8x4xbf16>) -> tensor<2x8xf32>
// CHECK:         stablehlo.add %[[D]]

// -----

// Never fires: one operand not converted (an f32 argument), an operand
// converted from f16.
func.func @main(%x: tensor<2x4xbf16>, %y: tensor<4x3xf32>, %h: tensor<4x3xf16>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {
  %xf = stablehlo.convert %x : (tensor<2x4xbf16>) -> tensor<2x4xf32>
  %hf = stablehlo.convert %h : (tensor<4x3xf16>) -> tensor<4x3xf32>
  %0 = stablehlo.dot_general %xf, %y, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  %1 = stablehlo.dot_general %xf, %hf, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
  return %0, %1 : tensor<2x3xf32>, tensor<2x3xf32>
}
// CHECK-LABEL: func.func @main
// CHECK:         %[[XF:.+]] = stablehlo.convert %arg0 : (tensor<2x4xbf16>) -> tensor<2x4xf32>
// CHECK:         %[[HF:.+]] = stablehlo.convert %arg2 : (tensor<4x3xf16>) -> tensor<4x3xf32>
// CHECK:         stablehlo.dot_general %[[XF]], %arg1
// CHECK:         stablehlo.dot_general %[[XF]], %[[HF]]
