// Options the pass does not have, or a value its option cannot take, are errors.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(fold-repeat-into-dot-general{bogus=1})' 2>&1 | filecheck %s
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(fold-repeat-into-dot-general{exact-scales-only=maybe})' 2>&1 | filecheck %s --check-prefix=VALUE
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(fold-repeat-into-dot-general{chunk-bytes=-1})' 2>&1 | filecheck %s --check-prefix=NEGATIVE
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(fold-repeat-into-dot-general{chunk-bytes=big})' 2>&1 | filecheck %s --check-prefix=INTEGER

// CHECK: fold_repeat_into_dot_general_invalid.mlir: error: fold-repeat-into-dot-general: unknown option 'bogus' (options: chunk-bytes, exact-scales-only)
// VALUE: fold-repeat-into-dot-general: option 'exact-scales-only' expects true or false, got 'maybe'
// NEGATIVE: fold-repeat-into-dot-general: option 'chunk-bytes' must be >= 0, got -1
// INTEGER: fold-repeat-into-dot-general: option 'chunk-bytes' expects an integer, got 'big'

func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  return %x : tensor<2x3xf32>
}
