// Fixed dtypes (what the runtime passes for module state whose device
// buffer exists already): bits honoured for state read or written as float
// through casts; torch's dtype kept where the state must have it.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits{dtypes=c:bits,t:torch,u:bits,absent:bits})' | filecheck %s
// AGAIN: a second run with the same dtypes changes nothing.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits{dtypes=c:bits,t:torch,u:bits,absent:bits}, store-state-as-bits{dtypes=c:bits,t:torch,u:bits})' | filecheck %s
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits{dtypes=c:bits,t:torch,u:bits})' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits{dtypes=c:bits,t:torch,u:bits})' --print-reports 2>&1 >/dev/null | filecheck %s --check-prefix=REPORT

// XLA-COUNT-2: xla: argument_bytes={{[0-9]+}}
// REPORT: store-state-as-bits: 1 state arguments stored as bits
// REPORT-NEXT: 'c' (argument 0): bf16 as i16, read and written; 1 float use(s) through a bitcast_convert
// REPORT-NEXT: 'u' kept in torch's dtype despite its fixed dtype: it is a user input not written in place (aliased to its own new value)
// REPORT: store-state-as-bits: 0 state arguments stored as bits

// 'c' is read and updated as float: stored as bits, a cast back feeds the
// add and a cast of the new value is returned.  't' would be stored as bits
// on its own but is fixed to torch's dtype; 'u' is a user input.
func.func @main(%c: tensor<4xbf16> {hloalias.kind = "buffer", hloalias.name = "c", tf.aliasing_output = 0 : i32}, %t: tensor<4xbf16> {hloalias.kind = "buffer", hloalias.name = "t"}, %u: tensor<4xbf16> {hloalias.kind = "user_input", hloalias.name = "u"}) -> (tensor<4xbf16> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xi16> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.add %c, %u : tensor<4xbf16>
  %1 = stablehlo.bitcast_convert %t : (tensor<4xbf16>) -> tensor<4xi16>
  return %0, %1 : tensor<4xbf16>, tensor<4xi16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4xi16> {hloalias.kind = "buffer", hloalias.name = "c", hloalias.stored_bits_of = bf16, tf.aliasing_output = 0 : i32}, %arg1: tensor<4xbf16> {hloalias.kind = "buffer", hloalias.name = "t"}, %arg2: tensor<4xbf16> {hloalias.kind = "user_input", hloalias.name = "u"})
// CHECK-SAME:    -> (tensor<4xi16> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xi16> {hloalias.output = 0 : i64, hloalias.role = "user_output"})
// CHECK-NEXT:    %[[F:.+]] = stablehlo.bitcast_convert %arg0 : (tensor<4xi16>) -> tensor<4xbf16>
// CHECK-NEXT:    %[[A:.+]] = stablehlo.add %[[F]], %arg2 : tensor<4xbf16>
// CHECK-NEXT:    %[[T:.+]] = stablehlo.bitcast_convert %arg1 : (tensor<4xbf16>) -> tensor<4xi16>
// CHECK-NEXT:    %[[N:.+]] = stablehlo.bitcast_convert %[[A]] : (tensor<4xbf16>) -> tensor<4xi16>
// CHECK-NEXT:    return %[[N]], %[[T]] : tensor<4xi16>, tensor<4xi16>

// -----

// A fixed 'bits' for state that is a rebuilt view's base: kept (reported).
func.func @main(%c: tensor<8xf32> {hloalias.kind = "parameter", hloalias.name = "c"}) -> tensor<8xf32> attributes {hloalias.removed_results = [{base = "arg:0", chain = ["slice [0:2:1]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:1", sizes = array<i64: 2>, strides = array<i64: 1>}]} {
  %0 = stablehlo.negate %c : tensor<8xf32>
  return %0 : tensor<8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "parameter", hloalias.name = "c"})
