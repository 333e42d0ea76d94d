"""fold-broadcast-into-dot-general, measured by XLA: a Linear applied to a
non-contiguous 3-d activation (BERT's attention output under SDPA) no
longer costs one copy of its weight per batch in temp, and results are
unchanged."""

from __future__ import annotations

import torch

import hloalias
from hloalias.passes import FoldBroadcastIntoDotGeneral
from hloalias.pipeline import DEFAULT_PIPELINE

WITHOUT = "builtin.module(fold-transpose-into-dot-general, eliminate-view-results, alias-donated-buffers)"
BATCH, TOKENS, SIDE = 2, 8, 256
WEIGHT_BYTES = SIDE * SIDE * 4


class HeadsThenProjection(torch.nn.Module):
    """Heads merged through a transpose, then ``nn.Linear``: torch lowers the
    Linear to a batched matmul against the weight broadcast to the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(SIDE, SIDE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.transpose(1, 2).reshape(BATCH, TOKENS, SIDE))


def test_broadcast_weight_is_not_copied() -> None:
    torch.manual_seed(0)
    model = HeadsThenProjection()
    x = torch.randn(BATCH, SIDE, TOKENS)
    program = hloalias.import_torch(model, (x,))
    report = FoldBroadcastIntoDotGeneral().apply(program)
    assert (report.folded, report.transposes_folded) == (1, 1)
    unfolded = hloalias.compile(model, (x,), pipeline=WITHOUT)
    folded = hloalias.compile(model, (x,))
    output_bytes = BATCH * TOKENS * SIDE * 4
    arguments = WEIGHT_BYTES + SIDE * 4 + BATCH * SIDE * TOKENS * 4
    # Without the fold: the transposed weight broadcast to [B, 256, 256].
    assert unfolded.memory_stats["temp_bytes"] == BATCH * WEIGHT_BYTES
    # With it: only the dot's output before the bias is added.
    assert folded.memory_stats["temp_bytes"] == output_bytes
    assert folded.memory_stats["total_bytes"] == arguments + 2 * output_bytes
    expected = model(x)
    torch.testing.assert_close(folded(x), expected)
    torch.testing.assert_close(unfolded(x), expected)


def test_default_pipeline_folds_broadcasts_after_transposes() -> None:
    assert "fold-transpose-into-dot-general, fold-broadcast-into-dot-general" in DEFAULT_PIPELINE
