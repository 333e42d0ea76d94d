// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(elementwise-in-producer-shape{bogus=1})' 2>&1 | filecheck %s

// CHECK: elementwise_in_producer_shape_invalid.mlir: error: elementwise-in-producer-shape: unknown option 'bogus' (options: none)

func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  return %x : tensor<2x3xf32>
}
