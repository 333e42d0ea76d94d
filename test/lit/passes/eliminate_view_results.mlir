// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(eliminate-view-results)' | filecheck %s
// The pass is idempotent: a second run finds nothing more to remove and
// appends nothing to hloalias.removed_results.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(eliminate-view-results, eliminate-view-results)' | filecheck %s
//
// Each record is {base, chain, dtype, offset, reason, result, sizes, strides}
// (a dictionary prints its keys sorted); sizes/strides/offset are in elements
// of a contiguous row-major base, as Tensor.as_strided takes them.

// A slice of an argument, and a strided one: x[0:1024] and x[1024:2048:2].
func.func @main(%arg0: tensor<2048xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<1024xf32>, tensor<512xf32>) {
  %0 = stablehlo.slice %arg0 [0:1024] : (tensor<2048xf32>) -> tensor<1024xf32>
  %1 = stablehlo.slice %arg0 [1024:2048:2] : (tensor<2048xf32>) -> tensor<512xf32>
  return %0, %1 : tensor<1024xf32>, tensor<512xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<2048xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = ["slice [0:1024:1]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 1024>, strides = array<i64: 1>},
// CHECK-SAME:    {base = "arg:0", chain = ["slice [1024:2048:2]"], dtype = f32, offset = 1024 : i64, reason = "view", result = "output:1", sizes = array<i64: 512>, strides = array<i64: 2>}]} {
// CHECK-NEXT:    return{{$}}
// CHECK-NEXT:  }

// -----

// A two-dimensional slice: x[1:3, 2:6] starts at element 1*8 + 2.
func.func @main(%arg0: tensor<4x8xf32>) -> tensor<2x4xf32> {
  %0 = stablehlo.slice %arg0 [1:3, 2:6] : (tensor<4x8xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = ["slice [1:3:1, 2:6:1]"], dtype = f32, offset = 10 : i64, reason = "view", result = "output:0", sizes = array<i64: 2, 4>, strides = array<i64: 8, 1>}]} {
// CHECK-NEXT:    return{{$}}

// -----

// reshape of a contiguous argument: x.view(32).
func.func @main(%arg0: tensor<4x8xf32>) -> tensor<32xf32> {
  %0 = stablehlo.reshape %arg0 : (tensor<4x8xf32>) -> tensor<32xf32>
  return %0 : tensor<32xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = ["reshape 32"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 32>, strides = array<i64: 1>}]} {
// CHECK-NEXT:    return{{$}}

// -----

// transpose permutes sizes and strides: x.t() of a 4x8 has strides (1, 8).
func.func @main(%arg0: tensor<4x8xf32>) -> tensor<8x4xf32> {
  %0 = stablehlo.transpose %arg0, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = ["transpose [1, 0]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 8, 4>, strides = array<i64: 1, 8>}]} {
// CHECK-NEXT:    return{{$}}

// -----

// broadcast_in_dim is x.expand(2, 4, 8): the new and the size-1 dimensions
// get stride 0, the others keep theirs.
func.func @main(%arg0: tensor<1x8xf32>) -> tensor<2x4x8xf32> {
  %0 = stablehlo.broadcast_in_dim %arg0, dims = [1, 2] : (tensor<1x8xf32>) -> tensor<2x4x8xf32>
  return %0 : tensor<2x4x8xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<1x8xf32>) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = ["expand [1, 2] -> 2x4x8"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 2, 4, 8>, strides = array<i64: 0, 0, 1>}]} {
// CHECK-NEXT:    return{{$}}

// -----

// bitcast_convert between equal widths is x.view(torch.int32).
func.func @main(%arg0: tensor<4x8xf32>) -> tensor<4x8xi32> {
  %0 = stablehlo.bitcast_convert %arg0 : (tensor<4x8xf32>) -> tensor<4x8xi32>
  return %0 : tensor<4x8xi32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = ["view dtype i32"], dtype = i32, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 4, 8>, strides = array<i64: 8, 1>}]} {
// CHECK-NEXT:    return{{$}}

// -----

// A bitcast to a narrower type (f32 -> 2 x f16) is x.view(torch.float16)
// before its reshape: a trailing dimension of the width ratio, strides and
// offset counted in f16 elements.
func.func @main(%arg0: tensor<4x8xf32>) -> tensor<4x8x2xf16> {
  %0 = stablehlo.bitcast_convert %arg0 : (tensor<4x8xf32>) -> tensor<4x8x2xf16>
  return %0 : tensor<4x8x2xf16>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = ["view dtype f16"], dtype = f16, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 4, 8, 2>, strides = array<i64: 16, 2, 1>}]} {
// CHECK-NEXT:    return{{$}}

// -----

// A bitcast to a wider type (4 x i8 -> f32) drops the trailing dimension of
// the ratio: a view when that dimension is dense and aligned.
func.func @main(%arg0: tensor<4x8x4xi8>) -> tensor<4x8xf32> {
  %0 = stablehlo.bitcast_convert %arg0 : (tensor<4x8x4xi8>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8x4xi8>) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = ["view dtype f32"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 4, 8>, strides = array<i64: 8, 1>}]} {
// CHECK-NEXT:    return{{$}}

// -----

// ... and not a view when the bytes are misaligned for the wider type
// (offset 1 byte): the result stays and nothing is recorded.
func.func @main(%arg0: tensor<4x9xi8>) -> tensor<4xf32> {
  %0 = stablehlo.slice %arg0 [0:4, 1:5] : (tensor<4x9xi8>) -> tensor<4x4xi8>
  %1 = stablehlo.bitcast_convert %0 : (tensor<4x4xi8>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x9xi8>) -> (tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
// CHECK:         stablehlo.bitcast_convert

// -----

// A chain slice -> reshape -> reshape composes into one record whose chain
// lists every op; the layout is that of x[1:3] (offset 8, contiguous rows).
func.func @main(%arg0: tensor<4x8xf32>) -> tensor<2x8xf32> {
  %0 = stablehlo.slice %arg0 [1:3, 0:8] : (tensor<4x8xf32>) -> tensor<2x8xf32>
  %1 = stablehlo.reshape %0 : (tensor<2x8xf32>) -> tensor<16xf32>
  %2 = stablehlo.reshape %1 : (tensor<16xf32>) -> tensor<2x8xf32>
  return %2 : tensor<2x8xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = ["slice [1:3:1, 0:8:1]", "reshape 16", "reshape 2x8"], dtype = f32, offset = 8 : i64, reason = "view", result = "output:0", sizes = array<i64: 2, 8>, strides = array<i64: 8, 1>}]} {
// CHECK-NEXT:    return{{$}}
// CHECK-NOT:     stablehlo.

// -----

// Identity views feeding a computation are folded away even though they are
// not results (canonicalize leaves them).
func.func @main(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.slice %arg0 [0:4, 0:8] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.reshape %0 : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %2 = stablehlo.transpose %1, dims = [0, 1] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %3 = stablehlo.broadcast_in_dim %2, dims = [0, 1] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %4 = stablehlo.bitcast_convert %3 : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %5 = stablehlo.add %4, %4 : tensor<4x8xf32>
  return %5 : tensor<4x8xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) -> (tensor<4x8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
// CHECK-NEXT:    %0 = stablehlo.add %arg0, %arg0 : tensor<4x8xf32>
// CHECK-NEXT:    return %0 : tensor<4x8xf32>

// -----

// An identity view that *is* a result folds to the argument itself, so the
// result is a pass-through (empty chain), not a view.
func.func @main(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.transpose %arg0, dims = [0, 1] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.slice %0 [0:4, 0:8] : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = [], dtype = f32, offset = 0 : i64, reason = "pass_through", result = "output:0", sizes = array<i64: 4, 8>, strides = array<i64: 8, 1>}]} {
// CHECK-NEXT:    return{{$}}

// -----

// An argument returned unchanged is a pass-through; the computed result stays.
func.func @main(%arg0: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<4xf32>, tensor<4xf32>) {
  %0 = stablehlo.negate %arg0 : tensor<4xf32>
  return %0, %arg0 : tensor<4xf32>, tensor<4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = [], dtype = f32, offset = 0 : i64, reason = "pass_through", result = "output:1", sizes = array<i64: 4>, strides = array<i64: 1>}]} {
// CHECK-NEXT:    %0 = stablehlo.negate %arg0 : tensor<4xf32>
// CHECK-NEXT:    return %0 : tensor<4xf32>

// -----

// Duplicates: the later copy of a computed value is rebuilt from the first
// (base "output:1"); a second copy of a pass-through rebases onto the
// argument itself.
func.func @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
  return %arg0, %0, %0, %arg0 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4xf32>) -> (tensor<4xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = [], dtype = f32, offset = 0 : i64, reason = "pass_through", result = "output:0", sizes = array<i64: 4>, strides = array<i64: 1>},
// CHECK-SAME:    {base = "output:1", chain = [], dtype = f32, offset = 0 : i64, reason = "duplicate", result = "output:2", sizes = array<i64: 4>, strides = array<i64: 1>},
// CHECK-SAME:    {base = "arg:0", chain = [], dtype = f32, offset = 0 : i64, reason = "duplicate", result = "output:3", sizes = array<i64: 4>, strides = array<i64: 1>}]} {
// CHECK-NEXT:    %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
// CHECK-NEXT:    return %0 : tensor<4xf32>

// -----

// A view of a computed result that stays is rebuilt from that result
// (base "output:0"); the reshape is erased.
func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32>, tensor<2x4xf32>) {
  %0 = stablehlo.add %arg0, %arg0 : tensor<8xf32>
  %1 = stablehlo.reshape %0 : (tensor<8xf32>) -> tensor<2x4xf32>
  return %0, %1 : tensor<8xf32>, tensor<2x4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32>) -> (tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "output:0", chain = ["reshape 2x4"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:1", sizes = array<i64: 2, 4>, strides = array<i64: 4, 1>}]} {
// CHECK-NEXT:    %0 = stablehlo.add %arg0, %arg0 : tensor<8xf32>
// CHECK-NEXT:    return %0 : tensor<8xf32>

// -----

// A view of a mutated buffer's new value is rebuilt from the mutation result
// (base "mutation:0"), like self.cache[:2] after an in-place update.
func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "cache"}) -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<2xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  %1 = stablehlo.slice %0 [2:4] : (tensor<8xf32>) -> tensor<2xf32>
  return %0, %1 : tensor<8xf32>, tensor<2xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "cache"}) -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "mutation:0", chain = ["slice [2:4:1]"], dtype = f32, offset = 2 : i64, reason = "view", result = "output:0", sizes = array<i64: 2>, strides = array<i64: 1>}]} {
// CHECK-NEXT:    %0 = stablehlo.negate %arg0 : tensor<8xf32>
// CHECK-NEXT:    return %0 : tensor<8xf32>

// -----

// A slice of a computed value that is not itself returned has no storage to
// view: it stays a real result.
func.func @main(%arg0: tensor<8xf32>) -> tensor<4xf32> {
  %0 = stablehlo.multiply %arg0, %arg0 : tensor<8xf32>
  %1 = stablehlo.slice %0 [2:6] : (tensor<8xf32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32>) -> (tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
// CHECK-NEXT:    %0 = stablehlo.multiply %arg0, %arg0 : tensor<8xf32>
// CHECK-NEXT:    %1 = stablehlo.slice %0 [2:6] : (tensor<8xf32>) -> tensor<4xf32>
// CHECK-NEXT:    return %1 : tensor<4xf32>

// -----

// x.t().reshape(32) is a copy in PyTorch (x.t().view(32) raises): the
// reshape of a non-contiguous view stays a real result.
func.func @main(%arg0: tensor<4x8xf32>) -> tensor<32xf32> {
  %0 = stablehlo.transpose %arg0, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %1 = stablehlo.reshape %0 : (tensor<8x4xf32>) -> tensor<32xf32>
  return %1 : tensor<32xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) -> (tensor<32xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
// CHECK-NEXT:    %0 = stablehlo.transpose %arg0, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:    %1 = stablehlo.reshape %0 : (tensor<8x4xf32>) -> tensor<32xf32>
// CHECK-NEXT:    return %1 : tensor<32xf32>

// -----

// The transpose is a view (removed) but the reshape of it is not, even
// though its operand is itself a result.
func.func @main(%arg0: tensor<4x8xf32>) -> (tensor<8x4xf32>, tensor<32xf32>) {
  %0 = stablehlo.transpose %arg0, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
  %1 = stablehlo.reshape %0 : (tensor<8x4xf32>) -> tensor<32xf32>
  return %0, %1 : tensor<8x4xf32>, tensor<32xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4x8xf32>) -> (tensor<32xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = ["transpose [1, 0]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 8, 4>, strides = array<i64: 1, 8>}]} {
// CHECK-NEXT:    %0 = stablehlo.transpose %arg0, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
// CHECK-NEXT:    %1 = stablehlo.reshape %0 : (tensor<8x4xf32>) -> tensor<32xf32>
// CHECK-NEXT:    return %1 : tensor<32xf32>

// -----

// A view of the *old* value of a mutated buffer must stay: after the call
// the buffer's storage holds the new value.
func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "count"}) -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  %1 = stablehlo.slice %arg0 [0:4] : (tensor<8xf32>) -> tensor<4xf32>
  return %0, %1 : tensor<8xf32>, tensor<4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "count"}) -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
// CHECK-NEXT:    %0 = stablehlo.negate %arg0 : tensor<8xf32>
// CHECK-NEXT:    %1 = stablehlo.slice %arg0 [0:4] : (tensor<8xf32>) -> tensor<4xf32>
// CHECK-NEXT:    return %0, %1 : tensor<8xf32>, tensor<4xf32>

// -----

// The same holds for an argument already aliased to a result
// (tf.aliasing_output): its storage is overwritten by that result.
func.func @main(%arg0: tensor<8xf32> {tf.aliasing_output = 0 : i32}) -> (tensor<8xf32>, tensor<4xf32>) {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  %1 = stablehlo.slice %arg0 [0:4] : (tensor<8xf32>) -> tensor<4xf32>
  return %0, %1 : tensor<8xf32>, tensor<4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32> {tf.aliasing_output = 0 : i32}) -> (tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<4xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
// CHECK-NEXT:    %0 = stablehlo.negate %arg0 : tensor<8xf32>
// CHECK-NEXT:    %1 = stablehlo.slice %arg0 [0:4] : (tensor<8xf32>) -> tensor<4xf32>
// CHECK-NEXT:    return %0, %1 : tensor<8xf32>, tensor<4xf32>

// -----

// ... and for a donor XLA may reuse for any result (jax.buffer_donor).
func.func @main(%arg0: tensor<8xf32> {jax.buffer_donor = true}) -> (tensor<8xf32>, tensor<4xf32>) {
  %0 = stablehlo.negate %arg0 : tensor<8xf32>
  %1 = stablehlo.slice %arg0 [0:4] : (tensor<8xf32>) -> tensor<4xf32>
  return %0, %1 : tensor<8xf32>, tensor<4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32> {jax.buffer_donor = true}) -> (tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<4xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
// CHECK-NEXT:    %0 = stablehlo.negate %arg0 : tensor<8xf32>
// CHECK-NEXT:    %1 = stablehlo.slice %arg0 [0:4] : (tensor<8xf32>) -> tensor<4xf32>
// CHECK-NEXT:    return %0, %1 : tensor<8xf32>, tensor<4xf32>

// -----

// A donor returned unchanged is not a pass-through (the donated storage may
// be reused), so it stays a real result holding the old value; a view of the
// donor is then rebuilt from that result, not from the argument.
func.func @main(%arg0: tensor<8xf32> {jax.buffer_donor = true}) -> (tensor<8xf32>, tensor<4xf32>) {
  %0 = stablehlo.slice %arg0 [0:4] : (tensor<8xf32>) -> tensor<4xf32>
  return %arg0, %0 : tensor<8xf32>, tensor<4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32> {jax.buffer_donor = true}) -> (tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "output:0", chain = ["slice [0:4:1]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:1", sizes = array<i64: 4>, strides = array<i64: 1>}]} {
// CHECK-NEXT:    return %arg0 : tensor<8xf32>

// -----

// Only the overwritten argument is protected: a view of another one in the
// same function is still removed.
func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "count"}, %arg1: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<4xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
  %1 = stablehlo.slice %arg0 [4:8] : (tensor<8xf32>) -> tensor<4xf32>
  %2 = stablehlo.slice %arg1 [4:8] : (tensor<8xf32>) -> tensor<4xf32>
  return %0, %1, %2 : tensor<8xf32>, tensor<4xf32>, tensor<4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "count"}, %arg1: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"})
// CHECK-SAME:    -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"})
// CHECK-SAME:    attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:1", chain = ["slice [4:8:1]"], dtype = f32, offset = 4 : i64, reason = "view", result = "output:1", sizes = array<i64: 4>, strides = array<i64: 1>}]} {
// CHECK-NEXT:    %0 = stablehlo.add %arg0, %arg1 : tensor<8xf32>
// CHECK-NEXT:    %1 = stablehlo.slice %arg0 [4:8] : (tensor<8xf32>) -> tensor<4xf32>
// CHECK-NEXT:    return %0, %1 : tensor<8xf32>, tensor<4xf32>

// -----

// hloalias.storage (from the importer) separates a copy from a view of the
// same value: `return x, x.clone(), x.t().contiguous(), x.t()` is x four
// times in StableHLO, but only x and x.t() share x's storage in eager.
func.func @main(%arg0: tensor<2x3xf32>) -> (tensor<2x3xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output", hloalias.storage = "arg:0"}, tensor<2x3xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output", hloalias.storage = "new:0"}, tensor<3x2xf32> {hloalias.output = 2 : i64, hloalias.role = "user_output", hloalias.storage = "new:1"}, tensor<3x2xf32> {hloalias.output = 3 : i64, hloalias.role = "user_output", hloalias.storage = "arg:0"}) {
  %0 = stablehlo.transpose %arg0, dims = [1, 0] : (tensor<2x3xf32>) -> tensor<3x2xf32>
  return %arg0, %arg0, %0, %0 : tensor<2x3xf32>, tensor<2x3xf32>, tensor<3x2xf32>, tensor<3x2xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<2x3xf32>)
// CHECK-SAME:    -> (tensor<2x3xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output", hloalias.storage = "new:0"}, tensor<3x2xf32> {hloalias.output = 2 : i64, hloalias.role = "user_output", hloalias.storage = "new:1"})
// CHECK-SAME:    attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = [], dtype = f32, offset = 0 : i64, reason = "pass_through", result = "output:0", sizes = array<i64: 2, 3>, strides = array<i64: 3, 1>},
// CHECK-SAME:    {base = "arg:0", chain = ["transpose [1, 0]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:3", sizes = array<i64: 3, 2>, strides = array<i64: 1, 3>}]} {
// CHECK:         return %arg0, %0 : tensor<2x3xf32>, tensor<3x2xf32>

// -----

// Mutation results always stay, even when equal to an input or to each
// other (`x.copy_(y)`, two equal `fill_`): the runtime writes them back.
func.func @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<4xf32>) -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.mutates = 2 : i64, hloalias.role = "mutation"}, tensor<4xf32> {hloalias.mutates = 1 : i64, hloalias.role = "mutation"}) {
  %0 = stablehlo.constant dense<1.500000e+00> : tensor<4xf32>
  return %arg1, %0, %0 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// CHECK-LABEL: func.func @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<4xf32>)
// CHECK-NOT:     hloalias.removed_results
// CHECK:         return %arg1, %cst, %cst : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
