// A 3->3-channel 3x3 convolution's kernel: OIHW 3x3x3x3 stored HWIO is
// 3x3x3x3 again, so @main's type does not change while its calling
// convention does (issue 24, item 6).  The pass says so on the module
// (hloalias.state_form = "stored"); --xla-compile, a path to XLA for other
// consumers, refuses such a module unless --allow-stored-state.
//
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(permute-conv-kernel-state)' | filecheck %s
// A rerun decides the same (the attribute stays).
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(permute-conv-kernel-state, permute-conv-kernel-state)' | filecheck %s
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(permute-conv-kernel-state)' --xla-compile --allow-stored-state 2>&1 >/dev/null | filecheck %s --check-prefix=ALLOWED
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(permute-conv-kernel-state)' --xla-compile 2>&1 | filecheck %s --check-prefix=REFUSED
// The kernel kept in torch's layout: no attribute, --xla-compile as before.
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(permute-conv-kernel-state{layouts=conv.weight:torch})' --xla-compile 2>&1 | filecheck %s --check-prefix=TORCH

func.func @main(%w: tensor<3x3x3x3xf32> {hloalias.kind = "parameter", hloalias.name = "conv.weight"}, %x: tensor<1x3x8x8xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> tensor<1x3x8x8xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x3x8x8xf32>, tensor<3x3x3x3xf32>) -> tensor<1x3x8x8xf32>
  return %0 : tensor<1x3x8x8xf32>
}

// CHECK: module attributes {hloalias.state_form = "stored"}
// CHECK-LABEL: func.func @main(%arg0: tensor<3x3x3x3xf32> {hloalias.kind = "parameter", hloalias.name = "conv.weight", hloalias.stored_permutation = array<i64: 2, 3, 1, 0>}

// ALLOWED: xla: argument_bytes=

// REFUSED-NOT: Traceback
// REFUSED: error: {{.*}}hloalias.state_form is "stored": some state argument of @main is in hloalias's stored layout (permute-conv-kernel-state), not torch's{{.*}}--allow-stored-state

// TORCH-NOT: hloalias.state_form
// TORCH: xla: argument_bytes=
// TORCH-NOT: hloalias.state_form
