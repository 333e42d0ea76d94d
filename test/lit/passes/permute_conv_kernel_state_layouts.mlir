// Fixed layouts (what the runtime passes for module state whose device
// buffer exists already): honoured for read-only state whatever its uses,
// torch's layout kept where the program writes the state.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state{layouts=w:2.3.1.0,v:torch,m:2.3.1.0,absent:1.0,f:2.3.1.0/0.1})' | filecheck %s
// AGAIN: a second run with the same layouts changes nothing.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state{layouts=w:2.3.1.0,v:torch,m:2.3.1.0,absent:1.0,f:2.3.1.0/0.1}, permute-conv-kernel-state{layouts=w:2.3.1.0,v:torch,m:2.3.1.0,f:2.3.1.0/0.1})' | filecheck %s
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state{layouts=w:2.3.1.0,v:torch,m:2.3.1.0,f:2.3.1.0/0.1})' --xla-compile --allow-stored-state 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state{layouts=w:2.3.1.0,v:torch,m:2.3.1.0,f:2.3.1.0/0.1})' --print-reports 2>&1 >/dev/null | filecheck %s --check-prefix=REPORT

// XLA-COUNT-3: xla: argument_bytes={{[0-9]+}}
// REPORT: permute-conv-kernel-state: 1 state arguments stored permuted
// REPORT-NEXT: 'w' (argument 0): permute(2, 3, 1, 0); 1 convolution kernel use(s), 1 other use(s) through a transpose
// REPORT-NEXT: 'm' kept in torch's layout despite its fixed layout: the program writes or donates it

// 'w' is a kernel and also added to: stored as fixed, the add reads a
// transpose back to torch's layout.  'v' would be permuted on its own but
// is fixed to torch's layout; 'm' is updated, so it cannot be permuted.
func.func @main(%w: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "w"}, %v: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "v"}, %m: tensor<4x4x1x1xf32> {hloalias.kind = "buffer", hloalias.name = "m", tf.aliasing_output = 0 : i32}, %x: tensor<2x4x2x2xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<4x4x1x1xf32> {hloalias.mutates = 2 : i64, hloalias.role = "mutation"}, tensor<2x4x2x2xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x2x2xf32>
  %1 = stablehlo.convolution(%0, %v) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x2x2xf32>
  %2 = stablehlo.add %m, %w : tensor<4x4x1x1xf32>
  return %2, %1 : tensor<4x4x1x1xf32>, tensor<2x4x2x2xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<1x1x4x4xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_permutation = array<i64: 2, 3, 1, 0>}, %arg1: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "v"}, %arg2: tensor<4x4x1x1xf32> {hloalias.kind = "buffer", hloalias.name = "m", tf.aliasing_output = 0 : i32}, %arg3
// CHECK-NEXT:    %[[T:.+]] = stablehlo.transpose %arg0, dims = [3, 2, 0, 1] : (tensor<1x1x4x4xf32>) -> tensor<4x4x1x1xf32>
// CHECK:         %[[C:.+]] = stablehlo.convolution(%arg3, %arg0) dim_numbers = [b, f, 0, 1]x[0, 1, i, o]->[b, f, 0, 1]
// CHECK:         stablehlo.convolution(%[[C]], %arg1) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]
// CHECK:         stablehlo.add %arg2, %[[T]]

// -----

// A fixed layout for a dense user: the value is the same, read through a transpose.
func.func @main(%w: tensor<2x3x4x5xf32> {hloalias.kind = "constant", hloalias.name = "w"}) -> tensor<2x3x4x5xf32> {
  %0 = stablehlo.negate %w : tensor<2x3x4x5xf32>
  return %0 : tensor<2x3x4x5xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x5x3x2xf32> {hloalias.kind = "constant", hloalias.name = "w", hloalias.stored_permutation = array<i64: 2, 3, 1, 0>})
// CHECK-NEXT:    %[[T:.+]] = stablehlo.transpose %arg0, dims = [3, 2, 0, 1] : (tensor<4x5x3x2xf32>) -> tensor<2x3x4x5xf32>
// CHECK-NEXT:    stablehlo.negate %[[T]]

// -----

// A fixed flipped layout for a dense user: reverse, then transpose back.
func.func @main(%f: tensor<2x3x4x5xf32> {hloalias.kind = "parameter", hloalias.name = "f"}) -> tensor<2x3x4x5xf32> {
  %0 = stablehlo.negate %f : tensor<2x3x4x5xf32>
  return %0 : tensor<2x3x4x5xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x5x3x2xf32> {hloalias.kind = "parameter", hloalias.name = "f", hloalias.stored_permutation = array<i64: 2, 3, 1, 0>, hloalias.stored_reversed = array<i64: 0, 1>})
// CHECK-NEXT:    %[[R:.+]] = stablehlo.reverse %arg0, dims = [0, 1] : tensor<4x5x3x2xf32>
// CHECK-NEXT:    %[[T:.+]] = stablehlo.transpose %[[R]], dims = [3, 2, 0, 1] : (tensor<4x5x3x2xf32>) -> tensor<2x3x4x5xf32>
// CHECK-NEXT:    stablehlo.negate %[[T]]
