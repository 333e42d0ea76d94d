// Input for cli.mlir: %arg1 on line 3 is undefined.
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %arg1 : tensor<4xf32>
  return %0 : tensor<4xf32>
}
