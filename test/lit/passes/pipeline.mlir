// The default pipeline with an explicit donation of every argument named x.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(eliminate-view-results, alias-donated-buffers{donate=x})' --print-alias-report -o %t 2>&1 | filecheck %s --check-prefix=REPORT
// RUN: filecheck %s --input-file=%t

// The seed example, def f(x): a = x[0:1024]; return x, a.view(2, 512), as
// hloalias.import_torch prints it.  Both results are rebuilt from x on the
// host, so x's buffer must survive the call and the donation is refused.
module {
  func.func @main(%arg0: tensor<1024xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<1024xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<2x512xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
    %0 = stablehlo.reshape %arg0 : (tensor<1024xf32>) -> tensor<2x512xf32>
    return %arg0, %0 : tensor<1024xf32>, tensor<2x512xf32>
  }
}

// CHECK-LABEL: func.func @main(%arg0: tensor<1024xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "x", hloalias.unused_donation = "it is returned unchanged (output:0, rebuilt from its buffer after the call)"}) attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "arg:0", chain = [], dtype = f32, offset = 0 : i64, reason = "pass_through", result = "output:0", sizes = array<i64: 1024>, strides = array<i64: 1>},
// CHECK-SAME:    {base = "arg:0", chain = ["reshape 2x512"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:1", sizes = array<i64: 2, 512>, strides = array<i64: 512, 1>}]} {
// CHECK-NEXT:    return{{$}}

// REPORT:      alias-donated-buffers: 0 aliases, 0 bytes saved
// REPORT-NEXT:   unused  arg 0 'x' (explicit): it is returned unchanged (output:0, rebuilt from its buffer after the call)
// REPORT-NEXT: alias-donated-buffers:

// -----

// A static KV cache: the new entries x are written at position pos, and the
// first 8 rows are returned, as `self.k_cache[:, :8]` after the update.  The
// returned rows are a view of the cache's new value (base "mutation:0"),
// which XLA writes in place into k_cache's buffer; x has no result of its
// type and stays a plain donor.
func.func @main(%arg0: tensor<1x16x4xf32> {hloalias.kind = "buffer", hloalias.name = "k_cache"}, %arg1: tensor<1x2x4xf32> {hloalias.kind = "user_input", hloalias.name = "x"}, %arg2: tensor<i64> {hloalias.kind = "user_input", hloalias.name = "pos"}) -> (tensor<1x16x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<1x8x4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %c = stablehlo.constant dense<0> : tensor<i64>
  %0 = stablehlo.dynamic_update_slice %arg0, %arg1, %c, %arg2, %c : (tensor<1x16x4xf32>, tensor<1x2x4xf32>, tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<1x16x4xf32>
  %1 = stablehlo.slice %0 [0:1, 0:8, 0:4] : (tensor<1x16x4xf32>) -> tensor<1x8x4xf32>
  return %0, %1 : tensor<1x16x4xf32>, tensor<1x8x4xf32>
}

// CHECK-LABEL: func.func @main(
// CHECK-SAME:    %arg0: tensor<1x16x4xf32> {hloalias.donation = "inferred", hloalias.kind = "buffer", hloalias.name = "k_cache", tf.aliasing_output = 0 : i32},
// CHECK-SAME:    %arg1: tensor<1x2x4xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "x", hloalias.unused_donation = "no free result of type tensor<1x2x4xf32>", jax.buffer_donor = true},
// CHECK-SAME:    %arg2: tensor<i64> {hloalias.kind = "user_input", hloalias.name = "pos"})
// CHECK-SAME:    -> (tensor<1x16x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"})
// CHECK-SAME:    attributes {hloalias.removed_results = [
// CHECK-SAME:    {base = "mutation:0", chain = ["slice [0:1:1, 0:8:1, 0:4:1]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 1, 8, 4>, strides = array<i64: 64, 4, 1>}]} {
// CHECK:         %[[UPDATED:.*]] = stablehlo.dynamic_update_slice %arg0, %arg1
// CHECK-NOT:     stablehlo.slice
// CHECK:         return %[[UPDATED]] : tensor<1x16x4xf32>

// REPORT-SAME:   1 aliases, 256 bytes saved
// REPORT-NEXT:   alias   arg 0 'k_cache' -> result 0  256 bytes  (inferred)
// REPORT-NEXT:   unused  arg 1 'x' (explicit): no free result of type tensor<1x2x4xf32>; kept as jax.buffer_donor
