// The pass has no options, and checks the IR contract on entry: errors
// name the culprit.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(reduce-window-in-conv-layout{bogus=1})' 2>&1 | filecheck %s --check-prefix=OPT
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(reduce-window-in-conv-layout)' 2>&1 | filecheck %s

// OPT: error: reduce-window-in-conv-layout: unknown option 'bogus' (options: none)
// CHECK-NOT: Traceback
// CHECK: error: argument 0 ('x'): 'tf.aliasing_output' = 3 is out of range; @main has 1 results
func.func @main(%x: tensor<1x8x8x8xf32> {hloalias.name = "x", tf.aliasing_output = 3 : i32}) -> tensor<1x8x8x8xf32> {
  return %x : tensor<1x8x8x8xf32>
}
