// A hand-written alias across placements is rejected, naming both shardings.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(alias-donated-buffers)' 2>&1 | filecheck %s

// CHECK-NOT: Traceback
// CHECK: alias_donated_buffers_sharding_invalid.mlir:6:1: error: argument 0 ('cache'): 'tf.aliasing_output' = 0 pairs sharding {devices=[2,1]<=[2]} with result sharding chosen by the partitioner: a buffer holds one shard
func.func @main(%arg0: tensor<8x4xf32> {hloalias.name = "cache", mhlo.sharding = "{devices=[2,1]<=[2]}", tf.aliasing_output = 0 : i32}) -> tensor<8x4xf32> {
  %0 = stablehlo.negate %arg0 : tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
