// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(window-gather-indices{bogus=1})' 2>&1 | filecheck %s

// CHECK: window_gather_indices_invalid.mlir: error: window-gather-indices: unknown option 'bogus' (options: none)

func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  return %x : tensor<2x3xf32>
}
