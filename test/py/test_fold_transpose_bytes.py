"""fold-transpose-into-dot-general, measured by XLA: ``nn.Linear`` no longer
costs a transposed copy of its weight in temporary memory, and results are
unchanged."""

from __future__ import annotations

import torch

import hloalias
from hloalias.passes import FoldTransposeIntoDotGeneral
from hloalias.pipeline import DEFAULT_PIPELINE

WITHOUT_FOLD = "builtin.module(eliminate-view-results, alias-donated-buffers)"
SIDE = 1024
WEIGHT_BYTES = SIDE * SIDE * 4


def test_default_pipeline_runs_the_fold_first() -> None:
    assert DEFAULT_PIPELINE.startswith(f"builtin.module({FoldTransposeIntoDotGeneral.name},")


def test_linear_weight_is_not_copied() -> None:
    """A 1024x1024 Linear on one row: without the fold XLA:CPU keeps a 4 MiB
    transposed weight in temp; with it, temp is the 4 KiB dot output."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(SIDE, SIDE)
    x = torch.randn(1, SIDE)
    folded = hloalias.compile(linear, (x,))
    unfolded = hloalias.compile(linear, (x,), pipeline=WITHOUT_FOLD)
    assert unfolded.memory_stats["temp_bytes"] >= WEIGHT_BYTES
    assert folded.memory_stats["temp_bytes"] < WEIGHT_BYTES // 100
    arguments = WEIGHT_BYTES + SIDE * 4 + SIDE * 4  # weight, bias, input
    assert folded.memory_stats["argument_bytes"] == arguments
    assert folded.memory_stats["total_bytes"] <= arguments + 2 * SIDE * 4
    expected = linear(x)
    torch.testing.assert_close(folded(x), expected)
    torch.testing.assert_close(unfolded(x), expected)


def test_attention_matches_eager() -> None:
    """Batched dots (q @ k^T) fold through their batch dimensions exactly."""
    torch.manual_seed(1)
    attention = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    q = torch.randn(2, 5, 32)

    def attend(q: torch.Tensor) -> torch.Tensor:
        return attention(q, q, q, need_weights=False)[0]

    program = hloalias.import_torch(attend, (q,))
    assert FoldTransposeIntoDotGeneral().apply(program).folded >= 1
    exe = hloalias.compile(attend, (q,))
    torch.testing.assert_close(exe(q), attend(q))
