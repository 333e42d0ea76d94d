// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits)' | filecheck %s
// AGAIN: a second run changes nothing.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits, store-state-as-bits)' | filecheck %s
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(store-state-as-bits)' --print-reports 2>&1 >/dev/null | filecheck %s --check-prefix=REPORT

// XLA-COUNT-9: xla: argument_bytes={{[0-9]+}}
// REPORT: store-state-as-bits: 1 state arguments stored as bits
// REPORT-NEXT: 'cache' (argument 0): bf16 as i16, read and written
// REPORT: store-state-as-bits: 1 state arguments stored as bits
// REPORT-NEXT: 'table' (argument 0): f16 as i16, read
// REPORT: store-state-as-bits: 0 state arguments stored as bits
// REPORT: store-state-as-bits: 0 state arguments stored as bits
// REPORT: store-state-as-bits: 0 state arguments stored as bits
// REPORT: store-state-as-bits: 0 state arguments stored as bits
// REPORT: store-state-as-bits: 1 state arguments stored as bits
// REPORT-NEXT: 'cache' (argument 0, user input): bf16 as i16, read and written
// REPORT: store-state-as-bits: 0 state arguments stored as bits
// REPORT: store-state-as-bits: 1 state arguments stored as bits
// REPORT-NEXT: 'kv' (argument 0, user input): bf16 as i16, read and written

// What bitcast-overwrite-scatter leaves for an index_copy_ into a bf16
// buffer: the cache, its new value and their alias become i16, both casts go;
// the float read of the new value keeps a cast of the integer result.
func.func @main(%cache: tensor<8x4xbf16> {hloalias.kind = "buffer", hloalias.name = "cache", tf.aliasing_output = 0 : i32}, %index: tensor<3x1xi64> {hloalias.kind = "user_input", hloalias.name = "index"}, %rows: tensor<3x4xbf16> {hloalias.kind = "user_input", hloalias.name = "rows"}) -> (tensor<8x4xbf16> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", hloalias.storage = "arg:0"}, tensor<8x4xbf16> {hloalias.output = 0 : i64, hloalias.role = "user_output", hloalias.storage = "new:0"}) {
  %0 = stablehlo.bitcast_convert %cache : (tensor<8x4xbf16>) -> tensor<8x4xi16>
  %1 = stablehlo.bitcast_convert %rows : (tensor<3x4xbf16>) -> tensor<3x4xi16>
  %2 = "stablehlo.scatter"(%0, %index, %1) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<i16>, %new: tensor<i16>):
    stablehlo.return %new : tensor<i16>
  }) : (tensor<8x4xi16>, tensor<3x1xi64>, tensor<3x4xi16>) -> tensor<8x4xi16>
  %3 = stablehlo.bitcast_convert %2 : (tensor<8x4xi16>) -> tensor<8x4xbf16>
  %4 = stablehlo.negate %3 : tensor<8x4xbf16>
  return %3, %4 : tensor<8x4xbf16>, tensor<8x4xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8x4xi16> {hloalias.kind = "buffer", hloalias.name = "cache", hloalias.stored_bits_of = bf16, tf.aliasing_output = 0 : i32}
// CHECK-SAME:    -> (tensor<8x4xi16> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", hloalias.storage = "arg:0"}, tensor<8x4xbf16>
// CHECK-NOT:     stablehlo.bitcast_convert %arg0
// CHECK:         %[[S:.+]] = "stablehlo.scatter"(%arg0, %arg1, %{{.+}})
// CHECK:         %[[F:.+]] = stablehlo.bitcast_convert %[[S]] : (tensor<8x4xi16>) -> tensor<8x4xbf16>
// CHECK-NEXT:    %[[N:.+]] = stablehlo.negate %[[F]]
// CHECK-NEXT:    return %[[S]], %[[N]] : tensor<8x4xi16>, tensor<8x4xbf16>

// -----

// Read-only state read only as bits: stored as bits, no new value.
func.func @main(%table: tensor<4x2xf16> {hloalias.kind = "parameter", hloalias.name = "table"}) -> tensor<4x2xi16> {
  %0 = stablehlo.bitcast_convert %table : (tensor<4x2xf16>) -> tensor<4x2xi16>
  %1 = stablehlo.add %0, %0 : tensor<4x2xi16>
  return %1 : tensor<4x2xi16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x2xi16> {hloalias.kind = "parameter", hloalias.name = "table", hloalias.stored_bits_of = f16}) -> (tensor<4x2xi16>
// CHECK-NEXT:    stablehlo.add %arg0, %arg0 : tensor<4x2xi16>

// -----

// Read as float anywhere: left alone (storing bits would add a cast).
func.func @main(%cache: tensor<8x4xbf16> {hloalias.kind = "buffer", hloalias.name = "cache"}) -> (tensor<8x4xi16>, tensor<8x4xbf16>) {
  %0 = stablehlo.bitcast_convert %cache : (tensor<8x4xbf16>) -> tensor<8x4xi16>
  %1 = stablehlo.negate %cache : tensor<8x4xbf16>
  return %0, %1 : tensor<8x4xi16>, tensor<8x4xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8x4xbf16> {hloalias.kind = "buffer", hloalias.name = "cache"})
// CHECK-NEXT:    stablehlo.bitcast_convert %arg0 : (tensor<8x4xbf16>) -> tensor<8x4xi16>

// -----

// A user input, and a state whose new value is computed in float: left alone.
func.func @main(%x: tensor<8xbf16> {hloalias.kind = "user_input", hloalias.name = "x"}, %s: tensor<8xbf16> {hloalias.kind = "buffer", hloalias.name = "s", tf.aliasing_output = 0 : i32}) -> (tensor<8xbf16> {hloalias.mutates = 1 : i64, hloalias.role = "mutation"}, tensor<8xi16>) {
  %0 = stablehlo.bitcast_convert %x : (tensor<8xbf16>) -> tensor<8xi16>
  %1 = stablehlo.bitcast_convert %s : (tensor<8xbf16>) -> tensor<8xi16>
  %2 = stablehlo.add %0, %1 : tensor<8xi16>
  %3 = stablehlo.bitcast_convert %2 : (tensor<8xi16>) -> tensor<8xbf16>
  %4 = stablehlo.negate %3 : tensor<8xbf16>
  return %4, %2 : tensor<8xbf16>, tensor<8xi16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8xbf16> {hloalias.kind = "user_input", hloalias.name = "x"}, %arg1: tensor<8xbf16> {hloalias.kind = "buffer", hloalias.name = "s", tf.aliasing_output = 0 : i32})

// -----

// A returned view of the state (a rebuilt view's base): keeps torch's dtype.
func.func @main(%cache: tensor<8xbf16> {hloalias.kind = "buffer", hloalias.name = "cache"}) -> tensor<8xi16> attributes {hloalias.removed_results = [{base = "arg:0", chain = ["slice [0:2:1]"], dtype = bf16, offset = 0 : i64, reason = "view", result = "output:1", sizes = array<i64: 2>, strides = array<i64: 1>}]} {
  %0 = stablehlo.bitcast_convert %cache : (tensor<8xbf16>) -> tensor<8xi16>
  return %0 : tensor<8xi16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8xbf16> {hloalias.kind = "buffer", hloalias.name = "cache"})

// -----

// Sharded state keeps torch's dtype.
func.func @main(%cache: tensor<8xbf16> {hloalias.kind = "buffer", hloalias.name = "cache", mhlo.sharding = "{replicated}"}) -> tensor<8xi16> {
  %0 = stablehlo.bitcast_convert %cache : (tensor<8xbf16>) -> tensor<8xi16>
  return %0 : tensor<8xi16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8xbf16> {hloalias.kind = "buffer", hloalias.name = "cache", mhlo.sharding = "{replicated}"})

// -----

// A user input written in place (index_copy_ into a donated bf16 tensor,
// aliased to its own new value): stored as bits like state; the caller's
// tensor keeps bf16 (the runtime hands XLA its int16 view).
func.func @main(%cache: tensor<8x4xbf16> {hloalias.kind = "user_input", hloalias.name = "cache", tf.aliasing_output = 0 : i32}, %index: tensor<3x1xi64> {hloalias.kind = "user_input", hloalias.name = "index"}, %rows: tensor<3x4xbf16> {hloalias.kind = "user_input", hloalias.name = "rows"}) -> (tensor<8x4xbf16> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", hloalias.storage = "arg:0"}, tensor<f32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.bitcast_convert %cache : (tensor<8x4xbf16>) -> tensor<8x4xi16>
  %1 = stablehlo.bitcast_convert %rows : (tensor<3x4xbf16>) -> tensor<3x4xi16>
  %2 = "stablehlo.scatter"(%0, %index, %1) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
  ^bb0(%old: tensor<i16>, %new: tensor<i16>):
    stablehlo.return %new : tensor<i16>
  }) : (tensor<8x4xi16>, tensor<3x1xi64>, tensor<3x4xi16>) -> tensor<8x4xi16>
  %3 = stablehlo.bitcast_convert %2 : (tensor<8x4xi16>) -> tensor<8x4xbf16>
  %4 = stablehlo.slice %3 [0:1, 0:1] : (tensor<8x4xbf16>) -> tensor<1x1xbf16>
  %5 = stablehlo.convert %4 : (tensor<1x1xbf16>) -> tensor<1x1xf32>
  %6 = stablehlo.reshape %5 : (tensor<1x1xf32>) -> tensor<f32>
  return %3, %6 : tensor<8x4xbf16>, tensor<f32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8x4xi16> {hloalias.kind = "user_input", hloalias.name = "cache", hloalias.stored_bits_of = bf16, tf.aliasing_output = 0 : i32}
// CHECK-SAME:    -> (tensor<8x4xi16> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", hloalias.storage = "arg:0"}, tensor<f32>
// CHECK-NOT:     stablehlo.bitcast_convert %arg0
// CHECK:         %[[S:.+]] = "stablehlo.scatter"(%arg0, %arg1, %{{.+}})
// CHECK:         %[[F:.+]] = stablehlo.bitcast_convert %[[S]] : (tensor<8x4xi16>) -> tensor<8x4xbf16>
// CHECK-NEXT:    stablehlo.slice %[[F]]
// CHECK:         return %[[S]], %{{.+}} : tensor<8x4xi16>, tensor<f32>

// -----

// A mutated user input not aliased to its new value (no donation): its
// buffer is not written in place, so it keeps the caller's dtype.
func.func @main(%cache: tensor<8xbf16> {hloalias.kind = "user_input", hloalias.name = "cache"}) -> (tensor<8xbf16> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}) {
  %0 = stablehlo.bitcast_convert %cache : (tensor<8xbf16>) -> tensor<8xi16>
  %1 = stablehlo.add %0, %0 : tensor<8xi16>
  %2 = stablehlo.bitcast_convert %1 : (tensor<8xi16>) -> tensor<8xbf16>
  return %2 : tensor<8xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8xbf16> {hloalias.kind = "user_input", hloalias.name = "cache"})
// CHECK-NEXT:    stablehlo.bitcast_convert %arg0 : (tensor<8xbf16>) -> tensor<8xi16>

// -----

// A user input written in place that is also a rebuilt view's base (a
// decoder returns its cache object): stored as bits, since the runtime
// rebuilds its views from the caller's tensor, which keeps bf16.
func.func @main(%kv: tensor<8xbf16> {hloalias.kind = "user_input", hloalias.name = "kv", tf.aliasing_output = 0 : i32}) -> (tensor<8xbf16> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", hloalias.storage = "arg:0"}) attributes {hloalias.removed_results = [{base = "mutation:0", chain = [], dtype = bf16, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 8>, strides = array<i64: 1>}]} {
  %0 = stablehlo.bitcast_convert %kv : (tensor<8xbf16>) -> tensor<8xi16>
  %1 = stablehlo.add %0, %0 : tensor<8xi16>
  %2 = stablehlo.bitcast_convert %1 : (tensor<8xi16>) -> tensor<8xbf16>
  return %2 : tensor<8xbf16>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<8xi16> {hloalias.kind = "user_input", hloalias.name = "kv", hloalias.stored_bits_of = bf16, tf.aliasing_output = 0 : i32}) -> (tensor<8xi16>
// CHECK-NEXT:    %[[A:.+]] = stablehlo.add %arg0, %arg0 : tensor<8xi16>
// CHECK-NEXT:    return %[[A]] : tensor<8xi16>
