// Options the pass does not have, or a value its option cannot take, are errors.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(fold-repeat-into-dot-general{bogus=1})' 2>&1 | filecheck %s
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(fold-repeat-into-dot-general{exact-scales-only=maybe})' 2>&1 | filecheck %s --check-prefix=VALUE

// CHECK: fold_repeat_into_dot_general_invalid.mlir: error: fold-repeat-into-dot-general: unknown option 'bogus' (options: exact-scales-only)
// VALUE: fold-repeat-into-dot-general: option 'exact-scales-only' expects true or false, got 'maybe'

func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  return %x : tensor<2x3xf32>
}
