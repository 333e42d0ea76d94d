// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(one-hot-scatter-as-select)' | filecheck %s
// Idempotent: nothing is left to rewrite on a second run.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(one-hot-scatter-as-select, one-hot-scatter-as-select)' | filecheck %s
// XLA accepts every module the pass produces.
// RUN: hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(one-hot-scatter-as-select)' --xla-compile 2>&1 >/dev/null | filecheck %s --check-prefix=XLA
// The pass has no options: any is an error.
// RUN: not hloalias-opt %s --split-input-file --pass-pipeline='builtin.module(one-hot-scatter-as-select{bogus=1})' 2>&1 | filecheck %s --check-prefix=ERR

// XLA-COUNT-3: xla: argument_bytes={{[0-9]+}}
// ERR: one_hot_scatter_as_select.mlir: error: one-hot-scatter-as-select: unknown option 'bogus' (options: none)

// nll_loss_backward + _log_softmax_backward_data as a training step captures
// them: -1 scattered at (i, t_i), times a per-row scale, summed per row.
func.func @main(%t: tensor<4xi64>, %s: tensor<4x1xf32>, %lsm: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %zeros = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  %minus = stablehlo.constant dense<-1.0> : tensor<4x1xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %rows = stablehlo.iota dim = 0 : tensor<4x1x1xi64>
  %cols = stablehlo.reshape %t : (tensor<4xi64>) -> tensor<4x1x1xi64>
  %idx = stablehlo.concatenate %rows, %cols, dim = 2 : (tensor<4x1x1xi64>, tensor<4x1x1xi64>) -> tensor<4x1x2xi64>
  %hot = "stablehlo.scatter"(%zeros, %idx, %minus) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    stablehlo.return %new : tensor<f32>
  }) : (tensor<4x8xf32>, tensor<4x1x2xi64>, tensor<4x1xf32>) -> tensor<4x8xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %g = stablehlo.multiply %hot, %sb : tensor<4x8xf32>
  %sum = stablehlo.reduce(%g init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  %sumb = stablehlo.broadcast_in_dim %sum, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
  %e = stablehlo.exponential %lsm : tensor<4x8xf32>
  %es = stablehlo.multiply %e, %sumb : tensor<4x8xf32>
  %r = stablehlo.subtract %g, %es : tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4xi64>, %arg1: tensor<4x1xf32>, %arg2: tensor<4x8xf32>)
// CHECK-NOT:     stablehlo.scatter
// CHECK-DAG:     %[[IOTA:.+]] = stablehlo.iota dim = 1 : tensor<4x8xi64>
// CHECK-DAG:     %[[T:.+]] = stablehlo.broadcast_in_dim %{{.+}}, dims = [0] : (tensor<4xi64>) -> tensor<4x8xi64>
// CHECK:         %[[EQ:.+]] = stablehlo.compare  EQ, %[[IOTA]], %[[T]],  SIGNED
// CHECK:         %[[HOT:.+]] = stablehlo.select %[[EQ]], %{{.+}}, %{{.+}} : tensor<4x8xi1>, tensor<4x8xf32>
// CHECK:         %[[G:.+]] = stablehlo.multiply %[[HOT]], %{{.+}} : tensor<4x8xf32>
// CHECK-NOT:     stablehlo.reduce
// CHECK:         %[[GE:.+]] = stablehlo.compare  GE, %{{.+}}, %{{.+}},  SIGNED : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi1>
// CHECK:         %[[LT:.+]] = stablehlo.compare  LT, %{{.+}}, %{{.+}},  SIGNED : (tensor<4xi64>, tensor<4xi64>) -> tensor<4xi1>
// CHECK:         %[[IN:.+]] = stablehlo.and %[[GE]], %[[LT]] : tensor<4xi1>
// CHECK:         %[[UB:.+]] = stablehlo.multiply %{{.+}}, %{{.+}} : tensor<4xf32>
// CHECK:         %[[SUM:.+]] = stablehlo.select %[[IN]], %[[UB]], %{{.+}} : tensor<4xi1>, tensor<4xf32>
// CHECK:         stablehlo.broadcast_in_dim %[[SUM]], dims = [0]
// CHECK-NOT:     stablehlo.reduce
// CHECK:         return

// -----

// Not rewritten: rows that are not an iota (a row may be scattered twice),
// a non-zero operand, an accumulating body.
func.func @main(%r: tensor<4x1x1xi64>, %t: tensor<4x1x1xi64>, %u: tensor<4x1xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %zeros = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  %ones = stablehlo.constant dense<1.0> : tensor<4x8xf32>
  %rows = stablehlo.iota dim = 0 : tensor<4x1x1xi64>
  %i0 = stablehlo.concatenate %r, %t, dim = 2 : (tensor<4x1x1xi64>, tensor<4x1x1xi64>) -> tensor<4x1x2xi64>
  %i1 = stablehlo.concatenate %rows, %t, dim = 2 : (tensor<4x1x1xi64>, tensor<4x1x1xi64>) -> tensor<4x1x2xi64>
  %a = "stablehlo.scatter"(%zeros, %i0, %u) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    stablehlo.return %new : tensor<f32>
  }) : (tensor<4x8xf32>, tensor<4x1x2xi64>, tensor<4x1xf32>) -> tensor<4x8xf32>
  %b = "stablehlo.scatter"(%ones, %i1, %u) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    stablehlo.return %new : tensor<f32>
  }) : (tensor<4x8xf32>, tensor<4x1x2xi64>, tensor<4x1xf32>) -> tensor<4x8xf32>
  %c = "stablehlo.scatter"(%zeros, %i1, %u) <{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>}> ({
  ^bb0(%old: tensor<f32>, %new: tensor<f32>):
    %s = stablehlo.add %old, %new : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }) : (tensor<4x8xf32>, tensor<4x1x2xi64>, tensor<4x1xf32>) -> tensor<4x8xf32>
  return %a, %b, %c : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4x1x1xi64>
// CHECK-NOT:     stablehlo.select
// CHECK-COUNT-3: stablehlo.scatter
// CHECK-NOT:     stablehlo.select
// CHECK:         return

// -----

// A one-hot select (as the first rewrite writes it) summed over the rows
// (dimension 0), and summed over the columns times a value that varies
// along them: both reduces stay.
func.func @main(%t: tensor<4xi64>, %u: tensor<4xf32>, %v: tensor<4x8xf32>) -> (tensor<8xf32>, tensor<4xf32>) {
  %zeros = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %iota = stablehlo.iota dim = 1 : tensor<4x8xi64>
  %tb = stablehlo.broadcast_in_dim %t, dims = [0] : (tensor<4xi64>) -> tensor<4x8xi64>
  %eq = stablehlo.compare EQ, %iota, %tb, SIGNED : (tensor<4x8xi64>, tensor<4x8xi64>) -> tensor<4x8xi1>
  %ub = stablehlo.broadcast_in_dim %u, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
  %hot = stablehlo.select %eq, %ub, %zeros : tensor<4x8xi1>, tensor<4x8xf32>
  %g = stablehlo.multiply %hot, %ub : tensor<4x8xf32>
  %down = stablehlo.reduce(%g init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
  %h = stablehlo.multiply %hot, %v : tensor<4x8xf32>
  %across = stablehlo.reduce(%h init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
  return %down, %across : tensor<8xf32>, tensor<4xf32>
}
// CHECK-LABEL: func.func @main(%arg0: tensor<4xi64>
// CHECK-COUNT-2: stablehlo.reduce
// CHECK:         return
