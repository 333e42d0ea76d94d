// A malformed mhlo.sharding is an error naming the argument, not a traceback.
// RUN: not hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results)' 2>&1 | filecheck %s

// CHECK-NOT: Traceback
// CHECK: eliminate_view_results_sharding_invalid.mlir:6:1: error: argument 0: 'mhlo.sharding' must be a string, got 3 : i64
func.func @main(%arg0: tensor<8x4xf32> {hloalias.kind = "buffer", hloalias.name = "table", mhlo.sharding = 3 : i64}) -> tensor<4x4xf32> {
  %0 = stablehlo.slice %arg0 [2:6, 0:4] : (tensor<8x4xf32>) -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}
