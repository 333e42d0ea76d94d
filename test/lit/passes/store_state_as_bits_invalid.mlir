// Malformed fixed dtypes, and a recorded stored_bits_of that breaks the IR
// contract, are errors naming the culprit; each chunk fails on its own.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits{dtypes=c:torch})' 2>&1 | filecheck %s
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits{dtypes=c:i16})' 2>&1 | filecheck %s --check-prefix=ENTRY
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits{dtypes=c:bits,c:torch})' 2>&1 | filecheck %s --check-prefix=TWICE

// CHECK-NOT: Traceback
// ENTRY: error: store-state-as-bits: dtypes entry 'c:i16' is not NAME:torch or NAME:bits
// TWICE: error: store-state-as-bits: dtypes names 'c' twice

// CHECK: error: store-state-as-bits: 'c' is already stored as bits of bf16; cannot store it in torch's dtype
func.func @main(%c: tensor<4xi16> {hloalias.kind = "buffer", hloalias.name = "c", hloalias.stored_bits_of = bf16}) -> tensor<4xi16> {
  return %c : tensor<4xi16>
}

// -----

// CHECK: error: argument 0 ('c'): 'hloalias.stored_bits_of' = bf16, but its new value (result 0) has type tensor<4xbf16>: state and new value are stored alike
func.func @main(%c: tensor<4xi16> {hloalias.kind = "buffer", hloalias.name = "c", hloalias.stored_bits_of = bf16}) -> (tensor<4xbf16> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}) {
  %0 = stablehlo.bitcast_convert %c : (tensor<4xi16>) -> tensor<4xbf16>
  return %0 : tensor<4xbf16>
}

// -----

// CHECK: error: argument 0 ('c'): 'hloalias.stored_bits_of' = bf16 is on the base of a rebuilt view: the view needs torch's dtype
func.func @main(%c: tensor<4xi16> {hloalias.kind = "buffer", hloalias.name = "c", hloalias.stored_bits_of = bf16}) -> tensor<4xi16> attributes {hloalias.removed_results = [{base = "arg:0", chain = ["slice [0:2:1]"], dtype = bf16, offset = 0 : i64, reason = "view", result = "output:1", sizes = array<i64: 2>, strides = array<i64: 1>}]} {
  return %c : tensor<4xi16>
}

// -----

// CHECK: error: argument 0 ('c'): 'hloalias.stored_bits_of' = f16 is on a sharded argument
func.func @main(%c: tensor<4xi16> {hloalias.kind = "buffer", hloalias.name = "c", hloalias.stored_bits_of = f16, mhlo.sharding = "{replicated}"}) -> tensor<4xi16> {
  return %c : tensor<4xi16>
}

// -----

// CHECK: error: argument 0 ('c'): 'hloalias.stored_bits_of' = bf16 is on an argument also stored permuted ('hloalias.stored_permutation')
func.func @main(%c: tensor<4x2xi16> {hloalias.kind = "parameter", hloalias.name = "c", hloalias.stored_bits_of = bf16, hloalias.stored_permutation = array<i64: 1, 0>}) -> tensor<4x2xi16> {
  return %c : tensor<4x2xi16>
}

// -----

// CHECK: error: argument 0 ('c'): 'hloalias.stored_bits_of' = bf16 is on a user_input not aliased to its own new value: only module state and user inputs written in place are stored as bits
func.func @main(%c: tensor<4xi16> {hloalias.kind = "user_input", hloalias.name = "c", hloalias.stored_bits_of = bf16}) -> (tensor<4xi16> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}) {
  return %c : tensor<4xi16>
}
