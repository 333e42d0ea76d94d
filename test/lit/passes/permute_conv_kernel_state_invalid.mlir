// Malformed fixed layouts, and a recorded permutation that breaks the IR
// contract, are errors naming the culprit; each chunk fails on its own.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state{layouts=w:1.0})' 2>&1 | filecheck %s
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state{layouts=w:2.3.x})' 2>&1 | filecheck %s --check-prefix=SPEC
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state{layouts=w})' 2>&1 | filecheck %s --check-prefix=ENTRY
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(permute-conv-kernel-state{layouts=w:torch,w:torch})' 2>&1 | filecheck %s --check-prefix=TWICE

// CHECK-NOT: Traceback
// SPEC: error: permute-conv-kernel-state: layouts entry 'w:2.3.x': '2.3.x' is neither 'torch' nor a layout written P0.P1... or P0.P1.../R0.R1...
// ENTRY: error: permute-conv-kernel-state: layouts entry 'w' is not NAME:torch or NAME:P0.P1...
// TWICE: error: permute-conv-kernel-state: layouts names 'w' twice

// CHECK: error: permute-conv-kernel-state: layout '1.0' of 'w' is not a permutation (and sorted distinct reversed dimensions) of the dimensions of tensor<4x4x1x1xf32>
func.func @main(%w: tensor<4x4x1x1xf32> {hloalias.kind = "parameter", hloalias.name = "w"}, %x: tensor<2x4x2x2xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> tensor<2x4x2x2xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x2x2xf32>, tensor<4x4x1x1xf32>) -> tensor<2x4x2x2xf32>
  return %0 : tensor<2x4x2x2xf32>
}

// -----

// CHECK: error: permute-conv-kernel-state: 'w' is already stored as permute(0, 1); cannot store it as '1.0'
func.func @main(%w: tensor<4x2xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_permutation = array<i64: 0, 1>}) -> tensor<4x2xf32> {
  return %w : tensor<4x2xf32>
}

// -----

// CHECK: error: argument 0 ('w'): 'hloalias.stored_permutation' = [0, 0] is not a permutation (and sorted distinct reversed dimensions) of the dimensions of tensor<4x2xf32>
func.func @main(%w: tensor<4x2xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_permutation = array<i64: 0, 0>}) -> tensor<4x2xf32> {
  %0 = stablehlo.negate %w : tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}

// -----

// CHECK: error: argument 0 ('x'): 'hloalias.stored_permutation' = [1, 0] is on a user_input: only module state is stored permuted
func.func @main(%x: tensor<4x2xf32> {hloalias.kind = "user_input", hloalias.name = "x", hloalias.stored_permutation = array<i64: 1, 0>}) -> tensor<4x2xf32> {
  %0 = stablehlo.negate %x : tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}

// -----

// CHECK: error: argument 0 ('m'): 'hloalias.stored_permutation' = [1, 0] is on an argument XLA overwrites: only read-only state is stored permuted
func.func @main(%m: tensor<4x4xf32> {hloalias.kind = "buffer", hloalias.name = "m", hloalias.stored_permutation = array<i64: 1, 0>}) -> (tensor<4x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}) {
  %0 = stablehlo.negate %m : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// CHECK: error: argument 0 ('w'): 'hloalias.stored_permutation' = [1, 0] is on the base of a rebuilt view: the view needs torch's layout
func.func @main(%w: tensor<4x4xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_permutation = array<i64: 1, 0>}) -> (tensor<4x4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [{base = "arg:0", chain = [], dtype = f32, offset = 0 : i64, reason = "pass_through", result = "output:1", sizes = array<i64: 4, 4>, strides = array<i64: 4, 1>}]} {
  %0 = stablehlo.negate %w : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// CHECK: error: argument 0: 'hloalias.stored_permutation' must be an array<i64>, got "2310"
func.func @main(%w: tensor<4x4xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_permutation = "2310"}) -> tensor<4x4xf32> {
  return %w : tensor<4x4xf32>
}

// -----

// CHECK: error: argument 0 ('w'): 'hloalias.stored_permutation' = [1, 0] is on a sharded argument: its sharding is in torch's dimensions
func.func @main(%w: tensor<4x4xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_permutation = array<i64: 1, 0>, mhlo.sharding = "{replicated}"}) -> tensor<4x4xf32> {
  %0 = stablehlo.negate %w : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}

// -----

// CHECK: error: argument 0: 'hloalias.stored_reversed' needs 'hloalias.stored_permutation' beside it
func.func @main(%w: tensor<4x4xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_reversed = array<i64: 0>}) -> tensor<4x4xf32> {
  return %w : tensor<4x4xf32>
}

// -----

// CHECK: error: argument 0 ('w'): 'hloalias.stored_permutation' = [1, 0], 'hloalias.stored_reversed' = [1, 0] is not a permutation (and sorted distinct reversed dimensions) of the dimensions of tensor<4x4xf32>
func.func @main(%w: tensor<4x4xf32> {hloalias.kind = "parameter", hloalias.name = "w", hloalias.stored_permutation = array<i64: 1, 0>, hloalias.stored_reversed = array<i64: 1, 0>}) -> tensor<4x4xf32> {
  %0 = stablehlo.negate %w : tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}
