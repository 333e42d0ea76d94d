"""``window-gather-indices`` on what torch-mlir lowers ``torch.gather`` to
(issue 29): DeBERTa-v2's relative-position attention gathers its c2p/p2c
scores along the last dimension with a position index the same for every
batch-head; torch-mlir builds every element's full index, an s64 tensor of
the result's shape x 3 that XLA:CPU keeps in temp.  With the pass the
batch-head dimension is a slice window and the index is one per position."""

from __future__ import annotations

import torch

import hloalias
from hloalias.pipeline import CPU_PIPELINE

WITHOUT = CPU_PIPELINE.replace(" window-gather-indices,", "")


class RelativeGather(torch.nn.Module):
    """DeBERTa-v2's c2p gather: scores [B*H, L, 2L] read at a clamped
    relative position per (query, key), the same for every batch-head; two
    layers' scores share the index (XLA then materializes it once)."""

    relative: torch.Tensor

    def __init__(self, length: int) -> None:
        super().__init__()
        positions = torch.arange(length)
        self.register_buffer("relative", positions[:, None] - positions[None, :])

    def forward(self, scores: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        span = scores.shape[-1] // 2
        index = torch.clamp(self.relative + span, 0, 2 * span - 1)
        index = index.unsqueeze(0).expand(scores.shape[0], -1, -1)
        first = torch.gather(scores, -1, index)
        return torch.gather(other * first.sum(), -1, index)


def test_gather_takes_one_index_per_position() -> None:
    model = RelativeGather(64).eval()
    generator = torch.Generator().manual_seed(0)
    args = (torch.randn(8, 64, 128, generator=generator), torch.randn(8, 64, 128, generator=generator))
    before = hloalias.compile(model, args, pipeline=WITHOUT)
    after = hloalias.compile(model, args)
    # the shared s64[8,64,64,3] index (786,432 bytes) -> s64[64,64,2] (65,536)
    assert before.memory_stats["temp_bytes"] == 1_048_576
    assert after.memory_stats["temp_bytes"] == 327_680
    expected = model(*args)
    assert "window-gather-indices" in CPU_PIPELINE
    got = after(*args)
    assert torch.equal(got, before(*args))
    torch.testing.assert_close(got, expected)  # eager sums `first` in another order
