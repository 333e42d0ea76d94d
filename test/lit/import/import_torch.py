# RUN: %PYTHON %s | filecheck %s

"""hloalias.import_torch: the StableHLO (or torch dialect) module a torch
program becomes, with the signature recorded in IR attributes
(hloalias/attributes.py): each argument's kind and name, each result's role,
and for a mutation the argument whose new value it is."""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch

import hloalias


def run(test: Callable[[], None]) -> Callable[[], None]:
    """Print the test's name for CHECK-LABEL, run it, then free what it made."""
    print(f"\nTEST: {test.__name__}", flush=True)
    test()
    gc.collect()
    return test


# CHECK-LABEL: TEST: seed_example
# x is returned as is and through a view; both stay plain user outputs here
# (removing them is eliminate-view-results' job).
# CHECK:      func.func @main(%arg0: tensor<1024xf32> {hloalias.kind = "user_input", hloalias.name = "x"})
# CHECK-SAME:   -> (tensor<1024xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output", hloalias.storage = "arg:0"}, tensor<2x512xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output", hloalias.storage = "arg:0"}) {
# CHECK-NEXT:   %0 = stablehlo.reshape %arg0 : (tensor<1024xf32>) -> tensor<2x512xf32>
# CHECK-NEXT:   return %arg0, %0 : tensor<1024xf32>, tensor<2x512xf32>
@run
def seed_example() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x[0:1024]
        return x, a.view(2, 512)

    print(hloalias.import_torch(f, (torch.randn(1024),)).text)


# CHECK-LABEL: TEST: buffer_updated_in_place
# The buffer comes first and its new value is result 0, a mutation of
# argument 0; the user output (x * the new count) follows.
# CHECK:      func.func @main(%arg0: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "count"}, %arg1: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "x"})
# CHECK-SAME:   -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", hloalias.storage = "arg:0"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output", hloalias.storage = "new:0"}) {
# CHECK:        %[[NEW_COUNT:[0-9]+]] = stablehlo.add %arg0, %{{.*}} : tensor<4xf32>
# CHECK-NEXT:   %[[OUT:[0-9]+]] = stablehlo.multiply %arg1, %[[NEW_COUNT]] : tensor<4xf32>
# CHECK-NEXT:   return %[[NEW_COUNT]], %[[OUT]] : tensor<4xf32>, tensor<4xf32>
@run
def buffer_updated_in_place() -> None:
    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.count.add_(1)
            return x * self.count

    print(hloalias.import_torch(Counter(), (torch.randn(4),)).text)


# CHECK-LABEL: TEST: user_input_mutated
# A user input updated in place gets a mutation result too; the output is
# computed from its new value.
# CHECK:      func.func @main(%arg0: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "x"})
# CHECK-SAME:   -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", hloalias.storage = "arg:0"}, tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output", hloalias.storage = "new:0"}) {
# CHECK:        %[[DOUBLED:[0-9]+]] = stablehlo.multiply %arg0, %{{.*}} : tensor<4xf32>
# CHECK:        %[[OUT:[0-9]+]] = stablehlo.add %[[DOUBLED]], %{{.*}} : tensor<4xf32>
# CHECK-NEXT:   return %[[DOUBLED]], %[[OUT]] : tensor<4xf32>, tensor<4xf32>
@run
def user_input_mutated() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + 1

    print(hloalias.import_torch(f, (torch.randn(4),)).text)


# CHECK-LABEL: TEST: parameter_only_read
# Parameters (with their qualified names), then lifted tensor constants, then
# user inputs; nothing is mutated, so there is no mutation result.
# CHECK:      func.func @main(
# CHECK-SAME:   %arg0: tensor<3x4xf32> {hloalias.kind = "parameter", hloalias.name = "proj.weight"},
# CHECK-SAME:   %arg1: tensor<3xf32> {hloalias.kind = "parameter", hloalias.name = "proj.bias"},
# CHECK-SAME:   %arg2: tensor<3xf32> {hloalias.kind = "constant", hloalias.name = "scale"},
# CHECK-SAME:   %arg3: tensor<2x4xf32> {hloalias.kind = "user_input", hloalias.name = "x"})
# CHECK-SAME:   -> (tensor<2x3xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output", hloalias.storage = "new:0"}) {
# CHECK-NOT:  hloalias.mutates
# CHECK:      stablehlo.dot_general %arg3
# CHECK-NOT:  hloalias.mutates
# CHECK:      return
@run
def parameter_only_read() -> None:
    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 3)
            self.scale = torch.tensor([1.0, 2.0, 3.0])  # not registered: a lifted constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) * self.scale

    print(hloalias.import_torch(Scaled(), (torch.randn(2, 4),)).text)


# CHECK-LABEL: TEST: update_through_view
# x[1:3].add_(1) updates x itself: the new x (a scatter of the updated
# slice into x) is a mutation result, and the sum reads the new x.
# CHECK:      func.func @main(%arg0: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "x"})
# CHECK-SAME:   -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", hloalias.storage = "arg:0"}, tensor<f32> {hloalias.output = 0 : i64, hloalias.role = "user_output", hloalias.storage = "new:0"}) {
# CHECK:        stablehlo.slice %arg0 [1:3]
# CHECK:        %[[NEW_X:[0-9]+]] = "stablehlo.scatter"(%arg0,
# CHECK:        %[[SUM:[0-9]+]] = stablehlo.reduce(%[[NEW_X]] init:
# CHECK-NEXT:   return %[[NEW_X]], %[[SUM]] : tensor<4xf32>, tensor<f32>
@run
def update_through_view() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x[1:3].add_(1)
        return x.sum()

    print(hloalias.import_torch(f, (torch.randn(4),)).text)


# CHECK-LABEL: TEST: static_kv_cache
# The cache is a buffer updated at the positions given by the index input;
# the returned rows are sliced from the *new* cache.
# CHECK:      func.func @main(
# CHECK-SAME:   %arg0: tensor<1x16x4xf32> {hloalias.kind = "buffer", hloalias.name = "k_cache"},
# CHECK-SAME:   %arg1: tensor<1x2x4xf32> {hloalias.kind = "user_input", hloalias.name = "k"},
# The index input carries the range eager's index_copy_ accepts (checked on
# every call before the program runs: XLA would drop an out-of-range row):
# CHECK-SAME:   %arg2: tensor<2xi64> {hloalias.index_ranges = [{high = 16 : i64, low = 0 : i64, op = "aten.index_copy", where = "{{.*}}.py:{{[0-9]+}} in forward: self.k_cache.index_copy_(1, pos, k)"}], hloalias.kind = "user_input", hloalias.name = "pos"})
# CHECK-SAME:   -> (tensor<1x16x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", hloalias.storage = "arg:0"}, tensor<1x8x4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output", hloalias.storage = "arg:0"}) {
# The index_put index_copy_ decomposes to is normalized as x[:, pos] = k's
# (issue 25), though the runtime refuses index_copy_'s negative positions:
# CHECK:        stablehlo.compare LT, %arg2, %{{.*}}, SIGNED
# CHECK:        %[[POS:[0-9]+]] = stablehlo.select
# CHECK:        stablehlo.reshape %[[POS]] : (tensor<2xi64>) -> tensor<2x1xi64>
# CHECK:        %[[CACHE:[0-9]+]] = "stablehlo.scatter"(%arg0, %{{.*}}, %arg1)
# CHECK:        %[[ROWS:[0-9]+]] = stablehlo.slice %[[CACHE]] [0:1, 0:8, 0:4]
# CHECK-NEXT:   return %[[CACHE]], %[[ROWS]] : tensor<1x16x4xf32>, tensor<1x8x4xf32>
@run
def static_kv_cache() -> None:
    class KVCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("k_cache", torch.zeros(1, 16, 4))

        def forward(self, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            self.k_cache.index_copy_(1, pos, k)
            return self.k_cache[:, :8]

    program = hloalias.import_torch(KVCache(), (torch.randn(1, 2, 4), torch.tensor([3, 4])))
    print(program.text)


# CHECK-LABEL: TEST: torch_stage
# Stopping at the torch dialect keeps value-semantic torch tensors and the
# same signature attributes.
# CHECK:      func.func @main(%arg0: !torch.vtensor<[1024],f32> {hloalias.kind = "user_input", hloalias.name = "x"})
# CHECK-SAME:   -> (!torch.vtensor<[1024],f32> {hloalias.output = 0 : i64, hloalias.role = "user_output", hloalias.storage = "arg:0"}, !torch.vtensor<[2,512],f32> {hloalias.output = 1 : i64, hloalias.role = "user_output", hloalias.storage = "arg:0"}) {
# CHECK:        %[[VIEW:[0-9]+]] = torch.aten.view %arg0, %{{.*}} : !torch.vtensor<[1024],f32>, !torch.list<int> -> !torch.vtensor<[2,512],f32>
# CHECK-NEXT:   return %arg0, %[[VIEW]]
# CHECK:      stage: torch
@run
def torch_stage() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x[0:1024].view(2, 512)

    program = hloalias.import_torch(f, (torch.randn(1024),), stage=hloalias.Stage.TORCH)
    print(program.text)
    print(f"stage: {program.stage.value}")


# CHECK-LABEL: TEST: dynamic_shapes_rejected
# CHECK: TorchImportError: input 'x' has dynamic dimension 0 ({{s[0-9]+}}): hloalias compiles static shapes only
@run
def dynamic_shapes_rejected() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    batch = torch.export.Dim("batch")
    try:
        hloalias.import_torch(f, (torch.randn(8),), dynamic_shapes={"x": {0: batch}})
    except hloalias.TorchImportError as error:
        print(f"{type(error).__name__}: {error}")


# CHECK-LABEL: TEST: constant_outputs_stay_off_main
# Python constants among the outputs are not results of @main (the runtime
# returns them as they are); the tensor keeps user output position 0.
# CHECK:      func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "user_input", hloalias.name = "x"})
# CHECK-SAME:   -> (tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output", hloalias.storage = "new:0"}) {
# CHECK:      constant outputs: {1: 3, 2: None}
@run
def constant_outputs_stay_off_main() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, int, None]:
        return x.sin(), 3, None

    program = hloalias.import_torch(f, (torch.randn(8),))
    print(program.text)
    print(f"constant outputs: {program.signature.constant_outputs}")


# CHECK-LABEL: TEST: non_tensor_return_rejected
# A value computed on the device but returned as a Python number cannot be a
# result of @main.
# CHECK: TorchImportError: result output:1 is SymFloat, not a tensor: hloalias programs return tensors only
@run
def non_tensor_return_rejected() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, float]:
        return x.sin(), x.sum().item()

    try:
        hloalias.import_torch(f, (torch.randn(8),))
    except hloalias.TorchImportError as error:
        print(f"{type(error).__name__}: {error}")
