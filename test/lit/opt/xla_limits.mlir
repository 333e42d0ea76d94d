// A module XLA cannot take is a diagnostic and exit status 1, not a process
// abort: a static tensor whose element count overflows 64 bits makes XLA
// terminate the process, so hloalias-opt checks extents before compiling.
// RUN: not hloalias-opt %s --split-input-file --xla-compile 2>&1 >/dev/null | filecheck %s

// CHECK-NOT: terminate called
// CHECK: xla_limits.mlir:8:1: error: block argument 0 of 'func.func' has type tensor<4294967296x4294967296x2xf32>, whose size overflows 64 bits
func.func @main(%arg0: tensor<4294967296x4294967296x2xf32>) -> tensor<4294967296x4294967296x2xf32> {
  %0 = stablehlo.negate %arg0 : tensor<4294967296x4294967296x2xf32>
  return %0 : tensor<4294967296x4294967296x2xf32>
}

// -----

// The bytes, not only the count: 2^61 f32 elements are 2^63 bytes.
// CHECK: xla_limits.mlir:18:8: error: result 0 of 'stablehlo.broadcast_in_dim' has type tensor<2305843009213693952xf32>, whose size overflows 64 bits
func.func @main(%arg0: tensor<f32>) -> tensor<f32> {
  %0 = stablehlo.broadcast_in_dim %arg0, dims = [] : (tensor<f32>) -> tensor<2305843009213693952xf32>
  %1 = stablehlo.broadcast_in_dim %arg0, dims = [] : (tensor<f32>) -> tensor<2305843009213693952xf32>
  return %arg0 : tensor<f32>
}

// -----

// The good chunk still compiles.
// CHECK: xla: argument_bytes=16 output_bytes=16 alias_bytes=0 temp_bytes=0 total_bytes=32
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %arg0 : tensor<4xf32>
  return %0 : tensor<4xf32>
}
