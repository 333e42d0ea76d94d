// The default min-saved-bytes (64 KiB): a value of 65,536 bytes is copied
// for its late reader, one of 65,280 bytes keeps its buffer.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-distance=3})' | filecheck %s
// Running it again changes nothing more.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(recompute-for-late-readers{min-distance=3}, recompute-for-late-readers{min-distance=3})' | filecheck %s

// f32[64,256]: 65,536 bytes, the floor itself.
func.func @main(%x: tensor<64x8xf32>, %w1: tensor<8x256xf32>, %w2: tensor<256x8xf32>, %g: tensor<64x8xf32>) -> (tensor<64x8xf32>, tensor<256x8xf32>, tensor<64x256xf32>) {
  %h = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x8xf32>, tensor<8x256xf32>) -> tensor<64x256xf32>
  %t = stablehlo.tanh %h : tensor<64x256xf32>
  %a = stablehlo.multiply %h, %t : tensor<64x256xf32>
  %y = stablehlo.dot_general %a, %w2, contracting_dims = [1] x [0] : (tensor<64x256xf32>, tensor<256x8xf32>) -> tensor<64x8xf32>
  %g1 = stablehlo.negate %g : tensor<64x8xf32>
  %g2 = stablehlo.negate %g1 : tensor<64x8xf32>
  %g3 = stablehlo.negate %g2 : tensor<64x8xf32>
  %dw = stablehlo.dot_general %a, %g3, contracting_dims = [0] x [0] : (tensor<64x256xf32>, tensor<64x8xf32>) -> tensor<256x8xf32>
  %dh = stablehlo.multiply %h, %h : tensor<64x256xf32>
  return %y, %dw, %dh : tensor<64x8xf32>, tensor<256x8xf32>, tensor<64x256xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<64x8xf32>, %arg1: tensor<8x256xf32>
// CHECK:         %[[C:.+]] = "stablehlo.case"
// CHECK-COUNT-2:   stablehlo.tanh
// CHECK:         stablehlo.dot_general %[[C]],
// CHECK-NOT:     stablehlo.case
// CHECK:         return

// -----

// f32[64,255]: 65,280 bytes, below the floor.
func.func @main(%x: tensor<64x8xf32>, %w1: tensor<8x255xf32>, %w2: tensor<255x8xf32>, %g: tensor<64x8xf32>) -> (tensor<64x8xf32>, tensor<255x8xf32>, tensor<64x255xf32>) {
  %h = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<64x8xf32>, tensor<8x255xf32>) -> tensor<64x255xf32>
  %t = stablehlo.tanh %h : tensor<64x255xf32>
  %a = stablehlo.multiply %h, %t : tensor<64x255xf32>
  %y = stablehlo.dot_general %a, %w2, contracting_dims = [1] x [0] : (tensor<64x255xf32>, tensor<255x8xf32>) -> tensor<64x8xf32>
  %g1 = stablehlo.negate %g : tensor<64x8xf32>
  %g2 = stablehlo.negate %g1 : tensor<64x8xf32>
  %g3 = stablehlo.negate %g2 : tensor<64x8xf32>
  %dw = stablehlo.dot_general %a, %g3, contracting_dims = [0] x [0] : (tensor<64x255xf32>, tensor<64x8xf32>) -> tensor<255x8xf32>
  %dh = stablehlo.multiply %h, %h : tensor<64x255xf32>
  return %y, %dw, %dh : tensor<64x8xf32>, tensor<255x8xf32>, tensor<64x255xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<64x8xf32>, %arg1: tensor<8x255xf32>
// CHECK-NOT:     stablehlo.case
// CHECK:         %[[A:.+]] = stablehlo.multiply
// CHECK-NOT:     stablehlo.case
// CHECK:         stablehlo.dot_general %[[A]], %{{.+}}, contracting_dims = [0] x [0]
// CHECK:         return
