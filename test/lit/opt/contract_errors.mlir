// IR that breaks the contract of hloalias/attributes.py is a
// `file:line:col: error:` naming the attribute and the argument or result,
// exit status 1, never a Python traceback: in every hloalias pass (the
// contract is checked on entry and exit) and before --xla-compile.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(eliminate-view-results)' 2>&1 >/dev/null | filecheck %s
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(alias-donated-buffers)' 2>&1 >/dev/null | filecheck %s
// RUN: not hloalias-opt %s --split-input-file --xla-compile 2>&1 >/dev/null | filecheck %s

// CHECK-NOT: Traceback

// CHECK: contract_errors.mlir:12:1: error: 'hloalias.removed_results' must be an array of dictionaries, got 3 : i64
func.func @main(%arg0: tensor<8xf32>) -> tensor<8xf32> attributes {hloalias.removed_results = 3} {
  return %arg0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:19:1: error: 'hloalias.removed_results' entry 0 must be a dictionary, got 1 : i64
func.func @main(%arg0: tensor<8xf32>) -> tensor<8xf32> attributes {hloalias.removed_results = [1]} {
  return %arg0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:26:1: error: 'hloalias.removed_results' entry 0 lacks 'reason'
func.func @main(%arg0: tensor<8xf32>) -> tensor<8xf32> attributes {hloalias.removed_results = [{result = "output:1"}]} {
  return %arg0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:33:1: error: 'hloalias.removed_results' entry 0: 'base' must be a string, got 3 : i64
func.func @main(%arg0: tensor<8xf32>) -> tensor<8xf32> attributes {hloalias.removed_results = [{result = "output:1", reason = "view", base = 3}]} {
  return %arg0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:40:1: error: 'hloalias.removed_results' entry 0: 'base' is 'arg:x', expected 'output:N', 'mutation:I' or 'arg:I'
func.func @main(%arg0: tensor<8xf32>) -> tensor<8xf32> attributes {hloalias.removed_results = [{result = "output:1", reason = "view", base = "arg:x"}]} {
  return %arg0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:47:1: error: result 0 of @main: 'hloalias.output' is -1, expected a position >= 0
func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32> {hloalias.output = -1 : i64}) {
  return %arg0 : tensor<8xf32>
}

// -----

// A rebuild whose base is a result that is not kept (here: a dead one).
// CHECK-NEXT: contract_errors.mlir:55:1: error: 'hloalias.removed_results' entry 1 (output:2): 'base' is output:1, which is a removed result: a base must be kept
func.func @main(%arg0: tensor<8xf32>) -> tensor<8xf32> attributes {hloalias.removed_results = [{reason = "dead", result = "output:1"}, {base = "output:1", chain = [], dtype = f32, offset = 0 : i64, reason = "duplicate", result = "output:2", sizes = array<i64: 8>, strides = array<i64: 1>}]} {
  return %arg0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:62:1: error: result 1 of @main has result key output:0, like result 0 of @main
func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32> {hloalias.output = 0 : i64}, tensor<8xf32> {hloalias.output = 0 : i64}) {
  return %arg0, %arg0 : tensor<8xf32>, tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:69:1: error: result 0 of @main: 'hloalias.mutates' is 3; @main has 1 arguments
func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32> {hloalias.role = "mutation", hloalias.mutates = 3 : i64}) {
  return %arg0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:76:1: error: argument 0: 'tf.aliasing_output' must be an integer, got "zero"
func.func @main(%arg0: tensor<8xf32> {tf.aliasing_output = "zero"}) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:83:1: error: argument 0: 'hloalias.kind' is 'weights', expected one of parameter, buffer, constant, user_input, rng_key
func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "weights"}) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}

// -----

// A boolean is an i1 integer whose signed value is -1: it is named as the
// boolean it is, not reported as an out-of-range index -1.
// CHECK-NEXT: contract_errors.mlir:92:1: error: argument 0: 'tf.aliasing_output' must be an integer, got the boolean true
func.func @main(%arg0: tensor<8xf32> {tf.aliasing_output = true}) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:99:1: error: result 0 of @main: 'hloalias.output' must be an integer, got the boolean false
func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32> {hloalias.output = false}) {
  return %arg0 : tensor<8xf32>
}

// -----

// The key random ops draw from (frontend/random_key.py): tensor<2xi64>, last, only read.
// CHECK-NEXT: contract_errors.mlir:107:1: error: argument 1 ('rng_key'): 'hloalias.kind' = 'rng_key' has type tensor<2xi32>, expected tensor<2xi64>
func.func @main(%arg0: tensor<8xf32>, %arg1: tensor<2xi32> {hloalias.kind = "rng_key", hloalias.name = "rng_key"}) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:114:1: error: argument 0 ('rng_key'): 'hloalias.kind' = 'rng_key' is not @main's last argument
func.func @main(%arg0: tensor<2xi64> {hloalias.kind = "rng_key", hloalias.name = "rng_key"}, %arg1: tensor<8xf32>) -> tensor<8xf32> {
  return %arg1 : tensor<8xf32>
}

// -----

// CHECK-NEXT: contract_errors.mlir:121:1: error: argument 1 ('rng_key'): 'hloalias.kind' = 'rng_key' is written, donated or stored in another form: a key is only read
func.func @main(%arg0: tensor<8xf32>, %arg1: tensor<2xi64> {hloalias.kind = "rng_key", hloalias.name = "rng_key", tf.aliasing_output = 0 : i32}) -> tensor<2xi64> {
  return %arg1 : tensor<2xi64>
}

// -----

// On a mesh spanning processes the key is one row per device, split one row per device.
// CHECK-NEXT: contract_errors.mlir:129:1: error: argument 1 ('rng_key'): 'hloalias.kind' = 'rng_key' has type tensor<4x2xi64> (one key per device) and sharding {replicated}, expected {devices=[4,1]<=[4]}: each device holds its process's key
func.func @main(%arg0: tensor<8xf32>, %arg1: tensor<4x2xi64> {hloalias.kind = "rng_key", hloalias.name = "rng_key", mhlo.sharding = "{replicated}"}) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}
