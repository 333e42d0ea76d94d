// On a device mesh, a view of module state placed by mhlo.sharding stays a
// result: the state lives in shards on the devices, the host has nothing to
// view.  A view of a user input (the caller's tensor) is still rebuilt.
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results)' --print-reports 2>&1 | filecheck %s
// Rerun: nothing more to remove, the state view still kept.
// RUN: hloalias-opt %s --pass-pipeline='builtin.module(eliminate-view-results, eliminate-view-results)' | filecheck %s --check-prefix=AGAIN

// CHECK: eliminate-view-results: 1 results removed
// CHECK-NEXT: output:1: rebuilt as a view of arg:1 (view: slice [0:2:1])
// CHECK-NEXT: kept on device: output:0
// CHECK-NEXT: output:0: kept on the devices: it views state 'table', which lives in shards on the mesh (no host storage to view)
// AGAIN-LABEL: func.func @main
// AGAIN-SAME: -> (tensor<4x4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"})
// AGAIN: %[[VIEW:.*]] = stablehlo.slice %arg0 [2:6, 0:4]
// AGAIN: return %[[VIEW]]
func.func @main(%arg0: tensor<8x4xf32> {hloalias.kind = "buffer", hloalias.name = "table", mhlo.sharding = "{devices=[2,1]<=[2]}"},
                %arg1: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "x", mhlo.sharding = "{replicated}"})
    -> (tensor<4x4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"}, tensor<2xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
  %0 = stablehlo.slice %arg0 [2:6, 0:4] : (tensor<8x4xf32>) -> tensor<4x4xf32>
  %1 = stablehlo.slice %arg1 [0:2] : (tensor<4xf32>) -> tensor<2xf32>
  return %0, %1 : tensor<4x4xf32>, tensor<2xf32>
}
