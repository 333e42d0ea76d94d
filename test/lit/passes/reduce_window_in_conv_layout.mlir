// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(reduce-window-in-conv-layout)' | filecheck %s
// AGAIN: a second run finds the pools already in convolution order.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(reduce-window-in-conv-layout, reduce-window-in-conv-layout)' | filecheck %s
// XLA accepts every module; the first chunk (ResNet's stem at 224x224,
// batch 2) drops the 6.4 MB relayout of the convolution output and keeps
// what the pool needs: the convolution output and the pool's own output.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(reduce-window-in-conv-layout)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(canonicalize)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=BEFORE
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(reduce-window-in-conv-layout)' --print-reports 2>&1 >/dev/null | filecheck %s --check-prefix=REPORT

// XLA: xla: argument_bytes=1241856 output_bytes=1605632 alias_bytes=0 temp_bytes=8028160 total_bytes=10875648
// XLA-COUNT-2: xla: argument_bytes={{[0-9]+}}
// BEFORE: xla: argument_bytes=1241856 output_bytes=1605632 alias_bytes=0 temp_bytes=12845056 total_bytes=15692544
// REPORT: reduce-window-in-conv-layout: 1 reduce_window ops run in convolution order
// REPORT: reduce-window-in-conv-layout: 1 reduce_window ops run in convolution order
// REPORT: reduce-window-in-conv-layout: 0 reduce_window ops run in convolution order

// Conv -> ReLU -> 3x3/2 max-pool, NCHW as torch-mlir lowers it: the pool
// reads a transpose to the convolution's NHWC order; its window moves along.
func.func @main(%w: tensor<64x3x7x7xf32>, %x: tensor<2x3x224x224xf32>) -> tensor<2x64x56x56xf32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<2x64x112x112xf32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [2, 2], pad = [[3, 3], [3, 3]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x3x224x224xf32>, tensor<64x3x7x7xf32>) -> tensor<2x64x112x112xf32>
  %1 = stablehlo.maximum %0, %cst : tensor<2x64x112x112xf32>
  %2 = "stablehlo.reduce_window"(%1, %ninf) <{padding = dense<[[0, 0], [0, 0], [1, 1], [1, 1]]> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 1, 3, 3>, window_strides = array<i64: 1, 1, 2, 2>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %m = stablehlo.maximum %a, %b : tensor<f32>
    stablehlo.return %m : tensor<f32>
  }) : (tensor<2x64x112x112xf32>, tensor<f32>) -> tensor<2x64x56x56xf32>
  return %2 : tensor<2x64x56x56xf32>
}
// CHECK-LABEL: func.func @main(
// CHECK:         %[[C:.+]] = stablehlo.convolution
// CHECK:         %[[R:.+]] = stablehlo.maximum %[[C]]
// CHECK:         %[[T:.+]] = stablehlo.transpose %[[R]], dims = [0, 2, 3, 1] : (tensor<2x64x112x112xf32>) -> tensor<2x112x112x64xf32>
// CHECK:         %[[P:.+]] = "stablehlo.reduce_window"(%[[T]], %{{.+}}) <{padding = dense<{{\[\[}}0, 0], [1, 1], [1, 1], [0, 0]]> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 3, 3, 1>, window_strides = array<i64: 1, 2, 2, 1>}>
// CHECK:         stablehlo.maximum
// CHECK:         }) : (tensor<2x112x112x64xf32>, tensor<f32>) -> tensor<2x56x56x64xf32>
// CHECK:         %[[B:.+]] = stablehlo.transpose %[[P]], dims = [0, 3, 1, 2] : (tensor<2x56x56x64xf32>) -> tensor<2x64x56x56xf32>
// CHECK:         return %[[B]]

// -----

// Through BatchNorm's broadcast arithmetic (per-channel scale and shift):
// the convolution is found behind the elementwise chain.
func.func @main(%w: tensor<8x3x3x3xf32>, %s: tensor<8xf32>, %x: tensor<1x3x8x8xf32>) -> tensor<1x8x4x4xf32> {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x8x8xf32>, tensor<8x3x3x3xf32>) -> tensor<1x8x8x8xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<8xf32>) -> tensor<1x8x8x8xf32>
  %2 = stablehlo.multiply %1, %0 : tensor<1x8x8x8xf32>
  %3 = stablehlo.add %2, %1 : tensor<1x8x8x8xf32>
  %4 = "stablehlo.reduce_window"(%3, %ninf) <{window_dimensions = array<i64: 1, 1, 2, 2>, window_strides = array<i64: 1, 1, 2, 2>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %m = stablehlo.maximum %a, %b : tensor<f32>
    stablehlo.return %m : tensor<f32>
  }) : (tensor<1x8x8x8xf32>, tensor<f32>) -> tensor<1x8x4x4xf32>
  return %4 : tensor<1x8x4x4xf32>
}
// CHECK-LABEL: func.func @main(
// CHECK:         %[[T:.+]] = stablehlo.transpose %{{.+}}, dims = [0, 2, 3, 1]
// CHECK:         "stablehlo.reduce_window"(%[[T]], %{{.+}}) <{window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>}>
// CHECK:         stablehlo.transpose %{{.+}}, dims = [0, 3, 1, 2]

// -----

// Left alone: a pool of a user input (no convolution computed it: its
// layout is the caller's), a pool over the feature dimension, a pool whose
// convolution already computes in NHWC order, and a variadic reduce_window.
func.func @main(%w: tensor<8x3x3x3xf32>, %x: tensor<1x3x8x8xf32>, %h: tensor<3x3x3x8xf32>, %y: tensor<1x8x8x3xf32>) -> (tensor<1x3x4x4xf32>, tensor<1x4x8x8xf32>, tensor<1x4x4x8xf32>, tensor<1x8x4x4xf32>, tensor<1x8x4x4xf32>) {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = "stablehlo.reduce_window"(%x, %ninf) <{window_dimensions = array<i64: 1, 1, 2, 2>, window_strides = array<i64: 1, 1, 2, 2>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %m = stablehlo.maximum %a, %b : tensor<f32>
    stablehlo.return %m : tensor<f32>
  }) : (tensor<1x3x8x8xf32>, tensor<f32>) -> tensor<1x3x4x4xf32>
  %c = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x8x8xf32>, tensor<8x3x3x3xf32>) -> tensor<1x8x8x8xf32>
  %1 = "stablehlo.reduce_window"(%c, %ninf) <{window_dimensions = array<i64: 1, 2, 1, 1>, window_strides = array<i64: 1, 2, 1, 1>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %m = stablehlo.maximum %a, %b : tensor<f32>
    stablehlo.return %m : tensor<f32>
  }) : (tensor<1x8x8x8xf32>, tensor<f32>) -> tensor<1x4x8x8xf32>
  %n = stablehlo.convolution(%y, %h) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x8x8x3xf32>, tensor<3x3x3x8xf32>) -> tensor<1x8x8x8xf32>
  %2 = "stablehlo.reduce_window"(%n, %ninf) <{window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %m = stablehlo.maximum %a, %b : tensor<f32>
    stablehlo.return %m : tensor<f32>
  }) : (tensor<1x8x8x8xf32>, tensor<f32>) -> tensor<1x4x4x8xf32>
  %3:2 = "stablehlo.reduce_window"(%c, %c, %ninf, %zero) <{window_dimensions = array<i64: 1, 1, 2, 2>, window_strides = array<i64: 1, 1, 2, 2>}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %p: tensor<f32>, %q: tensor<f32>):
    %m = stablehlo.maximum %a, %p : tensor<f32>
    %s = stablehlo.add %b, %q : tensor<f32>
    stablehlo.return %m, %s : tensor<f32>, tensor<f32>
  }) : (tensor<1x8x8x8xf32>, tensor<1x8x8x8xf32>, tensor<f32>, tensor<f32>) -> (tensor<1x8x4x4xf32>, tensor<1x8x4x4xf32>)
  return %0, %1, %2, %3#0, %3#1 : tensor<1x3x4x4xf32>, tensor<1x4x8x8xf32>, tensor<1x4x4x8xf32>, tensor<1x8x4x4xf32>, tensor<1x8x4x4xf32>
}
// CHECK-LABEL: func.func @main(
// CHECK-NOT:     stablehlo.transpose
