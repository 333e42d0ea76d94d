// Sharding-aware donation: on a device mesh an argument's buffer holds one
// shard, so it is aliased only to a result with the same mhlo.sharding.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(alias-donated-buffers)' --print-alias-report 2>&1 | filecheck %s
// Rerun: the pass keeps its own aliases.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(alias-donated-buffers, alias-donated-buffers)' | filecheck %s --check-prefix=IR

// Mutated state whose new value has its sharding: aliased (inferred).
// CHECK: alias-donated-buffers: 1 aliases, 128 bytes saved
// CHECK-NEXT: alias   arg 0 'cache' -> result 0  128 bytes  (inferred)
// IR-LABEL: func.func @main
// IR-SAME: hloalias.donation = "inferred", hloalias.kind = "buffer", hloalias.name = "cache", mhlo.sharding = "{devices=[2,1]<=[2]}", tf.aliasing_output = 0 : i32
func.func @main(%arg0: tensor<8x4xf32> {hloalias.kind = "buffer", hloalias.name = "cache", mhlo.sharding = "{devices=[2,1]<=[2]}"}) -> (tensor<8x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", mhlo.sharding = "{devices=[2,1]<=[2]}"}) {
  %0 = stablehlo.negate %arg0 : tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

// The new value is placed differently: reported with both shardings, not aliased.
// CHECK: alias-donated-buffers: 0 aliases, 0 bytes saved
// CHECK-NEXT: unused  arg 0 'cache' (inferred): its new value (result 0) is placed as {devices=[1,2]<=[2]}, the argument as {devices=[2,1]<=[2]}
// IR-LABEL: func.func @main
// IR-NOT: tf.aliasing_output
func.func @main(%arg0: tensor<8x4xf32> {hloalias.kind = "buffer", hloalias.name = "cache", mhlo.sharding = "{devices=[2,1]<=[2]}"}) -> (tensor<8x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", mhlo.sharding = "{devices=[1,2]<=[2]}"}) {
  %0 = stablehlo.negate %arg0 : tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

// An explicit donor is paired with the result of its sharding, skipping an
// earlier result of the same type placed by the partitioner; the second
// donor has no partner of its placement and stays a buffer donor.
// CHECK: alias-donated-buffers: 1 aliases, 128 bytes saved
// CHECK-NEXT: alias   arg 0 'x' -> result 1  128 bytes  (explicit)
// CHECK-NEXT: unused  arg 1 'y' (explicit): no free result of type tensor<8x4xf32> with its sharding {replicated} (result 0: chosen by the partitioner); kept as jax.buffer_donor
// IR-LABEL: func.func @main
// IR-SAME: %arg0: tensor<8x4xf32> {{{.*}}tf.aliasing_output = 1 : i32}
// IR-SAME: %arg1: tensor<8x4xf32> {{{.*}}jax.buffer_donor = true
func.func @main(%arg0: tensor<8x4xf32> {hloalias.name = "x", jax.buffer_donor = true, mhlo.sharding = "{devices=[2,1]<=[2]}"}, %arg1: tensor<8x4xf32> {hloalias.name = "y", jax.buffer_donor = true, mhlo.sharding = "{replicated}"}) -> (tensor<8x4xf32>, tensor<8x4xf32> {mhlo.sharding = "{devices=[2, 1]<=[2]}"}) {
  %0 = stablehlo.add %arg0, %arg1 : tensor<8x4xf32>
  %1 = stablehlo.negate %arg0 : tensor<8x4xf32>
  return %0, %1 : tensor<8x4xf32>, tensor<8x4xf32>
}
