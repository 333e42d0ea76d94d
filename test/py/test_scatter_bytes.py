"""bitcast-overwrite-scatter and window-scatter-indices, measured by XLA:
index_copy_ into a bf16 cache no longer costs two f32 copies of the cache in
temp, a per-slice index_copy_ no longer materializes per-element indices,
and results equal eager's."""

from __future__ import annotations

import copy

import torch

import hloalias
from hloalias.passes import BitcastOverwriteScatter, WindowScatterIndices
from hloalias.pipeline import DEFAULT_PIPELINE

REST = "eliminate-view-results, alias-donated-buffers"
ROWS, HEADS, DIM = 512, 4, 16
CACHE_BYTES = ROWS * HEADS * DIM * 2
# arguments (cache, 40 indices, 40 rows) + the f32 sum and tuple table + temp
TOTAL_WITH_PASS = (CACHE_BYTES + 40 * 8 + 40 * HEADS * DIM * 2) + 20 + (CACHE_BYTES + 5216)


class RowWrites(torch.nn.Module):
    """Ten ``index_copy_`` of 4 rows each into a bf16 cache."""

    cache: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(ROWS, HEADS, DIM, dtype=torch.bfloat16))

    def forward(self, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        for i in range(10):
            self.cache.index_copy_(0, index[4 * i : 4 * i + 4], rows[4 * i : 4 * i + 4])
        return self.cache[:2].float().sum()


def test_bf16_index_copy_runs_on_integers() -> None:
    torch.manual_seed(0)
    model = RowWrites()
    index = torch.randperm(ROWS)[:40]
    rows = torch.randn(40, HEADS, DIM, dtype=torch.bfloat16)
    program = hloalias.import_torch(model, (index, rows))
    assert BitcastOverwriteScatter().apply(program).rewritten == 10
    plain = hloalias.compile(model, (index, rows), pipeline=f"builtin.module({REST})")
    rewritten = hloalias.compile(model, (index, rows))
    # Without the pass XLA:CPU scatters in f32: two f32 copies of the cache.
    assert plain.memory_stats["temp_bytes"] >= 4 * CACHE_BYTES
    # With it: one i16 copy of the cache (XLA:CPU materializes bitcast_convert).
    assert rewritten.memory_stats["temp_bytes"] == CACHE_BYTES + 5216
    assert rewritten.memory_stats["total_bytes"] == TOTAL_WITH_PASS
    eager = copy.deepcopy(model)
    for _ in range(2):
        torch.testing.assert_close(rewritten(index, rows), eager(index, rows))
        assert torch.equal(rewritten.state_dict()["cache"], eager.cache)
        index = torch.randperm(ROWS)[:40]
        rows = torch.randn(40, HEADS, DIM, dtype=torch.bfloat16)


class KVStep(torch.nn.Module):
    """Write k at the step's slot of an 8x256x64 cache, advance the step, score q."""

    step: torch.Tensor
    k_cache: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("step", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("k_cache", torch.zeros(8, 256, 64))

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        slot = torch.remainder(self.step, 256)
        self.k_cache.index_copy_(1, slot, k)
        self.step.add_(1)
        return q @ self.k_cache.transpose(1, 2)


def test_index_copy_takes_one_index_per_slice() -> None:
    torch.manual_seed(1)
    model = KVStep()
    q, k = torch.randn(8, 1, 64), torch.randn(8, 1, 64)
    program = hloalias.import_torch(model, (q, k))
    assert WindowScatterIndices().apply(program).windowed == 1
    plain = hloalias.compile(model, (q, k), pipeline=f"builtin.module({REST})")
    windowed = hloalias.compile(model, (q, k))
    # The 8x1x64x3 i64 per-element index (12,288 bytes) is gone; what is
    # left is the 8x1x256 scores computed in a transposed layout, then copied.
    assert plain.memory_stats["temp_bytes"] == 12296
    assert windowed.memory_stats["temp_bytes"] == 8 * 256 * 4
    assert windowed.memory_stats["total_bytes"] == 544800
    eager = copy.deepcopy(model)
    for _ in range(3):
        q, k = torch.randn(8, 1, 64), torch.randn(8, 1, 64)
        torch.testing.assert_close(windowed(q, k), eager(q, k))
        state = windowed.state_dict()
        assert torch.equal(state["k_cache"], eager.k_cache) and torch.equal(state["step"], eager.step)


def test_default_pipeline_has_the_scatter_passes() -> None:
    assert BitcastOverwriteScatter.name in DEFAULT_PIPELINE
    assert WindowScatterIndices.name in DEFAULT_PIPELINE
