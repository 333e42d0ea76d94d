// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state)' | filecheck %s
// Idempotent: a permuted kernel is already in the layout its convolution reads.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state, permute-conv-kernel-state)' | filecheck %s
// XLA accepts every module the pass produces; the first chunk's temp is the
// activation relayout only (without the pass: 34816 bytes, the weight copy too).
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state)' --xla-compile --allow-stored-state 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(canonicalize)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=BEFORE
// The report names what was permuted.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state)' --print-reports 2>&1 >/dev/null | filecheck %s --check-prefix=REPORT

// XLA: xla: argument_bytes=26624 output_bytes=16384 alias_bytes=0 temp_bytes=16384 total_bytes=59392
// XLA-COUNT-4: xla: argument_bytes={{[0-9]+}}
// XLA-NEXT: xla: argument_bytes=2367488 output_bytes=8192 alias_bytes=0 temp_bytes=8192 total_bytes=2383872
// BEFORE: xla: argument_bytes=26624 output_bytes=16384 alias_bytes=0 temp_bytes=34816 total_bytes=77824
// BEFORE-COUNT-4: xla: argument_bytes={{[0-9]+}}
// BEFORE-NEXT: xla: argument_bytes=2367488 output_bytes=8192 alias_bytes=0 temp_bytes=2367488 total_bytes=4743168
// REPORT: permute-conv-kernel-state: 1 state arguments stored permuted
// REPORT-NEXT: 'conv.weight' (argument 0): permute(2, 3, 1, 0); 1 convolution kernel use(s)

// nn.Conv2d's OIHW weight as torch-mlir lowers it: stored HWIO, the
// convolution reads the kernel's dimensions where they now are.
func.func @main(%w: tensor<32x16x3x3xf32> {hloalias.kind = "parameter", hloalias.name = "conv.weight"}, %x: tensor<2x16x8x8xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> tensor<2x32x8x8xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x16x8x8xf32>, tensor<32x16x3x3xf32>) -> tensor<2x32x8x8xf32>
  return %0 : tensor<2x32x8x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<3x3x16x32xf32> {hloalias.kind = "parameter", hloalias.name = "conv.weight", hloalias.stored_permutation = array<i64: 2, 3, 1, 0>}, %arg1: tensor<2x16x8x8xf32> {hloalias.kind = "user_input", hloalias.name = "x"})
// CHECK-NOT:     transpose
// CHECK:         stablehlo.convolution(%arg1, %arg0) dim_numbers = [b, f, 0, 1]x[0, 1, i, o]->[b, f, 0, 1]{{.*}} : (tensor<2x16x8x8xf32>, tensor<3x3x16x32xf32>) -> tensor<2x32x8x8xf32>

// -----

// One weight read by two convolutions that agree (a buffer), a depthwise
// kernel (feature_group_count = channels) and a 1-d kernel: all permuted.
func.func @main(%w: tensor<8x8x1x1xf32> {hloalias.kind = "buffer", hloalias.name = "w"}, %d: tensor<8x1x3x3xf32> {hloalias.kind = "constant", hloalias.name = "dw"}, %k: tensor<4x8x5xf32> {hloalias.kind = "parameter", hloalias.name = "k"}, %x: tensor<1x8x4x4xf32> {hloalias.kind = "user_input", hloalias.name = "x"}, %s: tensor<1x8x9xf32> {hloalias.kind = "user_input", hloalias.name = "s"}) -> (tensor<1x8x4x4xf32>, tensor<1x4x5xf32>) {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x4x4xf32>, tensor<8x8x1x1xf32>) -> tensor<1x8x4x4xf32>
  %1 = stablehlo.convolution(%0, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x4x4xf32>, tensor<8x8x1x1xf32>) -> tensor<1x8x4x4xf32>
  %2 = stablehlo.convolution(%1, %d) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 8 : i64} : (tensor<1x8x4x4xf32>, tensor<8x1x3x3xf32>) -> tensor<1x8x4x4xf32>
  %3 = stablehlo.convolution(%s, %k) dim_numbers = [b, f, 0]x[o, i, 0]->[b, f, 0], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x9xf32>, tensor<4x8x5xf32>) -> tensor<1x4x5xf32>
  return %2, %3 : tensor<1x8x4x4xf32>, tensor<1x4x5xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<1x1x8x8xf32> {{{.*}}hloalias.stored_permutation = array<i64: 2, 3, 1, 0>}, %arg1: tensor<3x3x1x8xf32> {{{.*}}hloalias.stored_permutation = array<i64: 2, 3, 1, 0>}, %arg2: tensor<5x8x4xf32> {{{.*}}hloalias.stored_permutation = array<i64: 2, 1, 0>}, %arg3
// CHECK:         %[[A:.+]] = stablehlo.convolution(%arg3, %arg0) dim_numbers = [b, f, 0, 1]x[0, 1, i, o]->[b, f, 0, 1]
// CHECK:         %[[B:.+]] = stablehlo.convolution(%[[A]], %arg0) dim_numbers = [b, f, 0, 1]x[0, 1, i, o]->[b, f, 0, 1]
// CHECK:         stablehlo.convolution(%[[B]], %arg1) dim_numbers = [b, f, 0, 1]x[0, 1, i, o]->[b, f, 0, 1]{{.*}}feature_group_count = 8
// CHECK:         stablehlo.convolution(%arg4, %arg2) dim_numbers = [b, f, 0]x[0, i, o]->[b, f, 0]

// -----

// Never permuted: a weight that is also returned (a torch view of it needs
// torch's layout), a weight the program updates (its new value is written
// back in torch's layout), a donated one, a user input used as a kernel, the
// kernel of a batch-grouped convolution, and one read by two convolutions
// that want different layouts.  One already in HWIO order stays as it is.
func.func @main(%w: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "returned"}, %m: tensor<4x4x1x1xf32> {hloalias.kind = "buffer", hloalias.name = "mutated"}, %n: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "donated", jax.buffer_donor = true}, %u: tensor<4x4x1x1xf32> {hloalias.kind = "user_input", hloalias.name = "u"}, %g: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "grouped"}, %t: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "two_layouts"}, %h: tensor<1x1x4x4xf32> {hloalias.kind = "parameter", hloalias.name = "hwio"}, %x: tensor<2x4x2x2xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<4x4x1x1xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}, tensor<4x4x1x1xf32> {hloalias.mutates = 1 : i64, hloalias.role = "mutation"}, tensor<2x4x2x2xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x2x2xf32>
  %1 = stablehlo.convolution(%0, %m) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x2x2xf32>
  %2 = stablehlo.convolution(%1, %n) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x2x2xf32>
  %3 = stablehlo.convolution(%2, %u) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x2x2xf32>
  %4 = stablehlo.convolution(%3, %g) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 2 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<1x4x2x2xf32>
  %5 = stablehlo.convolution(%3, %t) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x2x2xf32>
  %6 = stablehlo.convolution(%5, %t) dim_numbers = [b, f, 0, 1]x[i, o, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x2x2xf32>
  %7 = stablehlo.convolution(%6, %h) dim_numbers = [b, f, 0, 1]x[0, 1, i, o]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<1x1x4x4xf32>) -> tensor<2x4x2x2xf32>
  %8 = stablehlo.negate %m : tensor<4x4x1x1xf32>
  return %w, %8, %7 : tensor<4x4x1x1xf32>, tensor<4x4x1x1xf32>, tensor<2x4x2x2xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "returned"}, %arg1: tensor<4x4x1x1xf32> {hloalias.kind = "buffer", hloalias.name = "mutated"}, %arg2: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "donated", jax.buffer_donor = true}, %arg3: tensor<4x4x1x1xf32> {hloalias.kind = "user_input", hloalias.name = "u"}, %arg4: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "grouped"}, %arg5: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "two_layouts"}, %arg6: tensor<1x1x4x4xf32> {hloalias.kind = "parameter", hloalias.name = "hwio"}, %arg7
// CHECK-NOT:     stored_permutation
// CHECK-NOT:     transpose

// -----

// The base of a rebuilt view keeps torch's layout even when its only
// remaining use is a kernel.
func.func @main(%w: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "w"}, %x: tensor<2x4x2x2xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<2x4x2x2xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [{base = "arg:0", chain = ["slice [0:2:1]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:1", sizes = array<i64: 2, 4, 1, 1>, strides = array<i64: 4, 1, 1, 1>}]} {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x2x2xf32>
  return %0 : tensor<2x4x2x2xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "w"}, %arg1
// CHECK-NOT:     stored_permutation

// -----

// A layout recorded by an earlier run is kept as it is.
func.func @main(%w: tensor<3x3x2x4xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_permutation = array<i64: 2, 3, 1, 0>}, %x: tensor<1x2x4x4xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<1x4x2x2xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[0, 1, i, o]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x2x4x4xf32>, tensor<3x3x2x4xf32>) -> tensor<1x4x2x2xf32>
  return %0 : tensor<1x4x2x2xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<3x3x2x4xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_permutation = array<i64: 2, 3, 1, 0>}
// CHECK:         stablehlo.convolution(%arg1, %arg0) dim_numbers = [b, f, 0, 1]x[0, 1, i, o]->[b, f, 0, 1]

// -----

// A 3x3 kernel on a 2x2 map (HF ResNet's last stage at 64x64 pixels): XLA
// swaps the operands and reads the kernel reversed, a 2.36 MB copy (the
// BEFORE run above).  Stored HWIO and flipped along H and W, read with
// window_reversal: XLA's reverse cancels, temp is the 8192-byte relayout.
func.func @main(%w: tensor<256x256x3x3xf32> {hloalias.kind = "parameter", hloalias.name = "w"}, %x: tensor<2x256x2x2xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> tensor<2x256x2x2xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x256x2x2xf32>, tensor<256x256x3x3xf32>) -> tensor<2x256x2x2xf32>
  return %0 : tensor<2x256x2x2xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<3x3x256x256xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_permutation = array<i64: 2, 3, 1, 0>, hloalias.stored_reversed = array<i64: 0, 1>}
// CHECK:         stablehlo.convolution(%arg1, %arg0) dim_numbers = [b, f, 0, 1]x[0, 1, i, o]->[b, f, 0, 1], window = {stride = [1, 1], pad = {{\[\[}}1, 1], [1, 1]], rhs_dilate = [1, 1], reverse = [true, true]}
