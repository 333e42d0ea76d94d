// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(accumulate-bf16-dots-in-f32{bogus=1})' 2>&1 | filecheck %s

// CHECK: accumulate_bf16_dots_in_f32_invalid.mlir: error: accumulate-bf16-dots-in-f32: unknown option 'bogus' (options: none)

func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  return %x : tensor<2x3xf32>
}
