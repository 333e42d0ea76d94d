"""The issue-15 passes against eager PyTorch on small random programs:
``index_copy_``/``index_put_`` (overwrite and accumulate) into buffers of
several dtypes and ranks, and matmuls against weights that torch broadcasts
to a batch, each compiled with the default pipeline and with the opt-in
``returned-matvec-as-reduce``.  Every program is checked after two calls
(results and the mutated buffer)."""

from __future__ import annotations

import copy
import random

import pytest
import torch

import hloalias
from hloalias.pipeline import DEFAULT_PIPELINE

WITH_OPTION = DEFAULT_PIPELINE.replace("window-scatter-indices,", "window-scatter-indices, returned-matvec-as-reduce,")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class IndexWrite(torch.nn.Module):
    """``buf.index_copy_(dim, idx, src)`` or ``buf.index_put_`` of rows, then a read of ``buf``."""

    buf: torch.Tensor

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, dim: int, mode: str) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(shape, dtype=dtype))
        self.dim, self.mode = dim, mode

    def forward(self, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        if self.mode == "copy":
            self.buf.index_copy_(self.dim, index, source)
        else:  # index_put_ takes tensor indices only: rows (dim 0)
            self.buf.index_put_((index,), source, accumulate=self.mode == "accumulate")
        return self.buf.float().sum(dim=self.dim) * 0.5


def _index_case(seed: int) -> tuple[IndexWrite, torch.Tensor, torch.Tensor, torch.Generator]:
    rng = random.Random(seed)
    rank = rng.choice([2, 3])
    shape = tuple(rng.choice([3, 4, 8]) for _ in range(rank))
    # Every mode meets every dtype; index_copy_ mostly along an inner dim
    # (the per-element indices window-scatter-indices rewrites).
    mode = ["copy", "put", "accumulate", "copy"][seed % 4]
    dim = (seed // 2) % rank if mode == "copy" else 0
    dtype = DTYPES[(seed // 4) % len(DTYPES)]
    count = rng.randint(min(2, shape[dim]), shape[dim])
    generator = torch.Generator().manual_seed(seed)
    index = torch.randperm(shape[dim], generator=generator)[:count]
    if mode == "accumulate" and count > 1:
        index[-1] = index[0]  # duplicates are well defined when accumulating
    source_shape = list(shape)
    source_shape[dim] = count
    source = (torch.randint(-8, 8, source_shape, generator=generator) / 4).to(dtype)
    return IndexWrite(shape, dtype, dim, mode), index, source, generator


@pytest.mark.parametrize("seed", range(12))
def test_index_writes_match_eager(seed: int) -> None:
    module, index, source, generator = _index_case(seed)
    for pipeline in (DEFAULT_PIPELINE, WITH_OPTION):
        eager = copy.deepcopy(module)
        exe = hloalias.compile(copy.deepcopy(module), (index, source), pipeline=pipeline)
        for _ in range(2):
            torch.testing.assert_close(exe(index, source), eager(index, source))
            assert torch.equal(exe.state_dict()["buf"], eager.buf), module.mode
            index = index[torch.randperm(len(index), generator=generator)] if module.mode != "accumulate" else index


class BatchedWeight(torch.nn.Module):
    """``x @ W.t()`` on a 3-d (sometimes non-contiguous) ``x``, optionally on one row."""

    def __init__(self, inner: int, outer: int, transposed_input: bool) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(inner, outer)
        self.transposed_input = transposed_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.transposed_input:
            x = x.transpose(1, 2)
        return torch.matmul(x, self.proj.weight.t()) + self.proj.bias


@pytest.mark.parametrize("seed", range(8))
def test_batched_weight_matmuls_match_eager(seed: int) -> None:
    rng = random.Random(100 + seed)
    batch, rows, inner, outer = rng.choice([1, 2, 3]), rng.choice([1, 4]), rng.choice([4, 8]), rng.choice([5, 8])
    transposed = rng.random() < 0.5
    torch.manual_seed(seed)
    module = BatchedWeight(inner, outer, transposed)
    shape = (batch, inner, rows) if transposed else (batch, rows, inner)
    x = torch.randn(shape)
    expected = module(x)
    for pipeline in (DEFAULT_PIPELINE, WITH_OPTION):
        exe = hloalias.compile(module, (x,), pipeline=pipeline)
        torch.testing.assert_close(exe(x), expected)
