// --xla-compile compiles each chunk with XLA (PJRT CPU) and prints its memory
// figures to stderr, one line per chunk: total = argument + output - alias + temp.
// RUN: hloalias-opt %s --split-input-file --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=PLAIN
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(eliminate-view-results, alias-donated-buffers)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=PASSES

// The seed example, def f(x): a = x[0:1024]; return x, a.view(2, 512), as
// imported.  Without the passes XLA materializes both 4 KiB outputs (plus a
// 16-byte table of the two output pointers); with them both are rebuilt as
// views of x on the host and only x's 4096 bytes remain on the device.
module {
  func.func @main(%arg0: tensor<1024xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> (tensor<1024xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<2x512xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
    %0 = stablehlo.reshape %arg0 : (tensor<1024xf32>) -> tensor<2x512xf32>
    return %arg0, %0 : tensor<1024xf32>, tensor<2x512xf32>
  }
}

// PLAIN:       xla: argument_bytes=4096 output_bytes=8208 alias_bytes=0 temp_bytes=0 total_bytes=12304
// PASSES:      xla: argument_bytes=4096 output_bytes=0 alias_bytes=0 temp_bytes=0 total_bytes=4096

// -----

// A static KV cache (256 bytes) updated in place with 2 new rows, returning
// its first 8 rows.  Plain: a new 256-byte cache plus a 128-byte copy of the
// rows (and a 16-byte pointer table).  With the passes the rows are a view of
// the new cache and the new cache is written into the old one's buffer (XLA
// reports the 256 aliased bytes), so nothing beyond the arguments is needed.
func.func @main(%arg0: tensor<1x16x4xf32> {hloalias.kind = "buffer", hloalias.name = "k_cache"}, %arg1: tensor<1x2x4xf32> {hloalias.kind = "user_input", hloalias.name = "x"}, %arg2: tensor<i64> {hloalias.kind = "user_input", hloalias.name = "pos"}) -> (tensor<1x16x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, tensor<1x8x4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}) {
  %c = stablehlo.constant dense<0> : tensor<i64>
  %0 = stablehlo.dynamic_update_slice %arg0, %arg1, %c, %arg2, %c : (tensor<1x16x4xf32>, tensor<1x2x4xf32>, tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<1x16x4xf32>
  %1 = stablehlo.slice %0 [0:1, 0:8, 0:4] : (tensor<1x16x4xf32>) -> tensor<1x8x4xf32>
  return %0, %1 : tensor<1x16x4xf32>, tensor<1x8x4xf32>
}

// PLAIN-NEXT:  xla: argument_bytes=296 output_bytes=400 alias_bytes=0 temp_bytes=0 total_bytes=696
// PASSES-NEXT: xla: argument_bytes=296 output_bytes=256 alias_bytes=256 temp_bytes=0 total_bytes=296
