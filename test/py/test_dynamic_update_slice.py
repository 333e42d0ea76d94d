"""scatter-to-dynamic-update-slice and select-to-dynamic-update-slice: one-slice
cache writes (``slice_scatter``, ``select_scatter``, a one-row ``index_copy_``)
run as ``stablehlo.dynamic_update_slice`` with eager's results, an
out-of-bounds dynamic index leaves the operand as XLA's scatter does, and
writes of several rows stay scatters."""

from __future__ import annotations

import copy

import pytest
import torch

import hloalias
from hloalias.mlir import new_context, parse_module, print_module
from hloalias.passes import ScatterToDynamicUpdateSlice, SelectToDynamicUpdateSlice
from hloalias.pipeline import DEFAULT_PIPELINE
from hloalias.runtime.executable import Executable
from hloalias.runtime.ownership import array_to_torch, torch_to_device
from hloalias.runtime.pjrt import compile_module, device_for

SHAPE = (3, 16, 8)


class SliceWrite(torch.nn.Module):
    """``cache[:, 5:6].copy_(new)``: slice_scatter, a constant index."""

    def forward(self, cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        cache[:, 5:6].copy_(new[:, None])
        return new * 2


class SelectWrite(torch.nn.Module):
    """``cache[:, 5].copy_(new)``: select_scatter, a whole-tensor masked select."""

    def forward(self, cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        cache[:, 5].copy_(new)
        return new * 2


class RowCopy(torch.nn.Module):
    """``cache.index_copy_(1, pos, new)`` with ``pos`` a call argument."""

    def forward(self, cache: torch.Tensor, new: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(1, pos, new)
        return cache[:, 14:] * 2


def _ops(executable: Executable) -> str:
    """The executable's final StableHLO as text."""
    return str(executable.mlir)


def _check_write(model: torch.nn.Module, *extra: torch.Tensor) -> str:
    torch.manual_seed(0)
    cache, new = torch.randn(SHAPE), torch.randn(SHAPE[0], SHAPE[2])
    executable = hloalias.compile(model, (cache.clone(), new, *extra))
    eager_cache = cache.clone()
    for _ in range(2):
        new = torch.randn(SHAPE[0], SHAPE[2])
        result = executable(cache, new, *extra)
        expected = model(eager_cache, new, *extra)
        assert torch.equal(result, expected)
        assert torch.equal(cache, eager_cache)
    return _ops(executable)


def test_slice_scatter_with_a_constant_index_is_an_update_slice() -> None:
    text = _check_write(SliceWrite())
    assert "stablehlo.dynamic_update_slice" in text
    assert "stablehlo.scatter" not in text and "stablehlo.select" not in text


def test_select_scatter_is_an_update_slice() -> None:
    text = _check_write(SelectWrite())
    assert "stablehlo.dynamic_update_slice" in text
    assert "stablehlo.select" not in text and "iota" not in text


class NegativeSelectWrite(torch.nn.Module):
    """``cache[:, -2] = new``: setitem with a negative Python int."""

    def forward(self, cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        cache[:, -2] = new
        return new * 2


def test_select_scatter_with_a_negative_index_matches_eager() -> None:
    text = _check_write(NegativeSelectWrite())
    assert "stablehlo.dynamic_update_slice" in text and "stablehlo.select" not in text


def test_one_row_index_copy_with_a_dynamic_index_matches_eager() -> None:
    torch.manual_seed(1)
    model = RowCopy()
    cache = torch.randn(SHAPE)
    executable = hloalias.compile(model, (cache.clone(), torch.randn(3, 1, 8), torch.tensor([0])))
    text = _ops(executable)
    assert "stablehlo.dynamic_update_slice" in text and "stablehlo.scatter" not in text
    eager_cache = cache.clone()
    for position in (0, 15, 7, 15, 3):
        new = torch.randn(3, 1, 8)
        pos = torch.tensor([position])
        assert torch.equal(executable(cache, new, pos), model(eager_cache, new, pos))
        assert torch.equal(cache, eager_cache)


def test_one_row_index_copy_with_a_lifted_constant_index_matches_eager() -> None:
    class ConstantRow(torch.nn.Module):
        def forward(self, cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            cache.index_copy_(1, torch.tensor([11]), new[:, None])
            return new * 2

    text = _check_write(ConstantRow())
    assert "stablehlo.dynamic_update_slice" in text and "stablehlo.scatter" not in text


def test_two_row_index_copy_stays_a_scatter() -> None:
    torch.manual_seed(2)
    model = RowCopy()
    cache = torch.randn(SHAPE)
    pos = torch.tensor([4, 9])
    program = hloalias.import_torch(model, (cache.clone(), torch.randn(3, 2, 8), pos))
    assert ScatterToDynamicUpdateSlice().apply(program).rewritten == 0
    executable = hloalias.compile(model, (cache.clone(), torch.randn(3, 2, 8), pos))
    text = _ops(executable)
    # (the op's name: 'pos' carries its source line, in this file, as hloalias.index_ranges)
    assert "stablehlo.scatter" in text and "stablehlo.dynamic_update_slice" not in text
    eager_cache = cache.clone()
    for positions in ([4, 9], [9, 9], [0, 15]):
        new = torch.randn(3, 2, 8)
        index = torch.tensor(positions)
        assert torch.equal(executable(cache, new, index), model(eager_cache, new, index))
        assert torch.equal(cache, eager_cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_index_copy_temp_bytes(dtype: torch.dtype) -> None:
    """f32: the guarded update slice needs no temp (XLA's own expansion of the
    scatter took 65 bytes).  bf16: XLA:CPU upcasts a bf16 ``dynamic_slice``,
    which costs one bf16 cache copy (768 bytes; XLA's expansion of the bf16
    scatter costs 769); before, bitcast-overwrite-scatter ran the write on
    i16 and XLA:CPU materialized the cache's bitcast."""
    torch.manual_seed(3)
    model = RowCopy()
    cache = torch.randn(SHAPE).to(dtype)
    new, pos = torch.randn(3, 1, 8).to(dtype), torch.tensor([6])
    executable = hloalias.compile(model, (cache.clone(), new, pos))
    assert "bitcast_convert" not in _ops(executable)
    assert executable.memory_stats["temp_bytes"] == (0 if dtype == torch.float32 else 768)
    eager_cache = cache.clone()
    assert torch.equal(executable(cache, new, pos), model(eager_cache, new, pos))
    assert torch.equal(cache, eager_cache)


# One window of a scatter at a dynamic start (operand dim 1; a window two
# rows tall along dim 1 when ROWS == 2), as the StableHLO level sees it.
_SCATTER = """
func.func @main(%cache: tensor<3x16x8xf32>, %new: tensor<3xROWSx8xf32>, %pos: tensor<2xi64>) -> tensor<3x16x8xf32> {
  %0 = "stablehlo.scatter"(%cache, %pos, %new) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0, 1, 2], scatter_dims_to_operand_dims = [1, 2], index_vector_dim = 0>}> ({
  ^bb0(%old: tensor<f32>, %upd: tensor<f32>):
    stablehlo.return %upd : tensor<f32>
  }) : (tensor<3x16x8xf32>, tensor<2xi64>, tensor<3xROWSx8xf32>) -> tensor<3x16x8xf32>
  return %0 : tensor<3x16x8xf32>
}
"""


@pytest.mark.parametrize("rows", [1, 2])
def test_out_of_bounds_dynamic_index_matches_xla_scatter(rows: int) -> None:
    text = _SCATTER.replace("ROWS", str(rows))
    module = parse_module(text, new_context())
    report = ScatterToDynamicUpdateSlice().apply(module)
    assert (report.rewritten, report.guarded) == (1, 1)
    rewritten = print_module(module)
    assert "stablehlo.scatter" not in rewritten
    device = device_for("cpu")
    scatter, update_slice = compile_module(text, device), compile_module(rewritten, device)
    torch.manual_seed(4)
    cache, new = torch.randn(SHAPE), torch.randn(3, rows, 8)
    starts = [(-1, 0), (-100, 0), (0, 0), (16 - rows, 0), (16 - rows + 1, 0), (16, 0), (2**40, 0)]
    starts += [(3, -1), (3, 1), (3, 7), (-(2**63), 0), (2**63 - 1, 0)]
    for start in starts:
        arguments = [cache, new, torch.tensor(list(start))]
        on_device = [torch_to_device(a, device, owned=False) for a in arguments]
        expected = array_to_torch(scatter.execute(on_device)[0])
        got = array_to_torch(update_slice.execute(on_device)[0])
        assert torch.equal(got, expected), start
        in_bounds = 0 <= start[0] <= 16 - rows and start[1] == 0
        assert torch.equal(expected, cache) != in_bounds, start  # the case does what it says


def test_select_rewrite_keeps_the_values_of_the_select() -> None:
    text = """
func.func @main(%x: tensor<5x3xi32>, %t: tensor<5x3xi32>) -> tensor<5x3xi32> {
  %k = stablehlo.constant dense<4> : tensor<5xi32>
  %i = stablehlo.iota dim = 0 : tensor<5xi32>
  %m = stablehlo.compare EQ, %k, %i : (tensor<5xi32>, tensor<5xi32>) -> tensor<5xi1>
  %b = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<5xi1>) -> tensor<5x3xi1>
  %r = stablehlo.select %b, %t, %x : tensor<5x3xi1>, tensor<5x3xi32>
  return %r : tensor<5x3xi32>
}
"""
    module = parse_module(text, new_context())
    assert SelectToDynamicUpdateSlice().apply(module).rewritten == 1
    device = device_for("cpu")
    x, t = torch.arange(15, dtype=torch.int32).reshape(5, 3), -torch.arange(15, dtype=torch.int32).reshape(5, 3)
    on_device = [torch_to_device(a, device, owned=False) for a in (x, t)]
    expected = x.clone()
    expected[4] = t[4]
    for module_text in (text, print_module(module)):
        assert torch.equal(array_to_torch(compile_module(module_text, device).execute(on_device)[0]), expected)


def test_default_pipeline_runs_both_before_bitcast_overwrite_scatter() -> None:
    names = [name.strip() for name in DEFAULT_PIPELINE[len("builtin.module(") : -1].split(",")]
    position = names.index
    assert position("window-scatter-indices") < position("scatter-to-dynamic-update-slice")
    assert position("scatter-to-dynamic-update-slice") < position("bitcast-overwrite-scatter")
    assert position("select-to-dynamic-update-slice") < position("bitcast-overwrite-scatter")


def test_one_row_index_copy_into_module_state_matches_eager() -> None:
    class StateRow(torch.nn.Module):
        cache: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(SHAPE))

        def forward(self, new: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            self.cache.index_copy_(1, pos, new)
            return self.cache[:, :4].sum()

    torch.manual_seed(5)
    model = StateRow()
    eager = copy.deepcopy(model)
    new, pos = torch.randn(3, 1, 8), torch.tensor([2])
    executable = hloalias.compile(model, (new, pos))
    assert "stablehlo.dynamic_update_slice" in _ops(executable)
    for position in (2, 15, 0):
        new, pos = torch.randn(3, 1, 8), torch.tensor([position])
        torch.testing.assert_close(executable(new, pos), eager(new, pos))
        assert torch.equal(executable.state_dict()["cache"], eager.cache)
