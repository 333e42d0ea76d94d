// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(widen-one-row-updates{bogus=1})' 2>&1 | filecheck %s

// CHECK: widen_one_row_updates_invalid.mlir: error: widen-one-row-updates: unknown option 'bogus' (options: none)

func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  return %x : tensor<2x3xf32>
}
