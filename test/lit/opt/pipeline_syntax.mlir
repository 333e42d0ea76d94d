// The pipeline is read token by token: text after a pass, a nested pipeline
// under one of hloalias's passes and unbalanced brackets are errors naming
// the offending text, never silently dropped.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers{donate=x}junk)' 2>&1 | filecheck %s --check-prefix=JUNK
// JUNK-NOT: Traceback
// JUNK: error: unexpected 'junk' after 'alias-donated-buffers{donate=x}' in pipeline 'builtin.module(alias-donated-buffers{donate=x}junk)'
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results(canonicalize))' 2>&1 | filecheck %s --check-prefix=NESTED
// NESTED: error: pass 'eliminate-view-results' takes no nested pipeline: 'eliminate-view-results(canonicalize)'
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(canonicalize) cse' 2>&1 | filecheck %s --check-prefix=TRAILING
// TRAILING: error: unexpected 'cse' after 'builtin.module(...)'
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(canonicalize,,cse)' 2>&1 | filecheck %s --check-prefix=EMPTY
// EMPTY: error: expected a pass name at ',cse)'
// Upstream nesting and options are still handed to MLIR as written.
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(func.func(cse, canonicalize{max-iterations=2}), alias-donated-buffers{donate=x})' | filecheck %s --check-prefix=OK
// OK: tf.aliasing_output = 0

func.func @main(%arg0: tensor<4xf32> {hloalias.name = "x"}) -> tensor<4xf32> {
  %0 = stablehlo.negate %arg0 : tensor<4xf32>
  return %0 : tensor<4xf32>
}
