"""``elementwise-in-producer-shape`` on a transformer MLP (issue 29): a
Linear on [batch, tokens, features], exact GELU, the next Linear (Swin's
and BERT's MLP).  torch-mlir computes the bias and GELU in three dimensions
between the dots' two-dimensional products; XLA:CPU then fuses GELU as a
loop that reads the product through a bitcast and writes a second buffer of
the product's size.  Computed in the product's own shape, XLA writes GELU
in place."""

from __future__ import annotations

import torch

import hloalias
from hloalias.pipeline import CPU_PIPELINE

WITHOUT = CPU_PIPELINE.replace(" elementwise-in-producer-shape,", "")


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 128)
        self.fc2 = torch.nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def test_gelu_between_linears_is_written_in_place() -> None:
    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(2, 256, 32, generator=torch.Generator().manual_seed(1))
    before = hloalias.compile(model, (x,), pipeline=WITHOUT)
    after = hloalias.compile(model, (x,))
    # GELU no longer takes a buffer of its own beside the f32[512,128] product
    assert before.memory_stats["temp_bytes"] == 524_288
    assert after.memory_stats["temp_bytes"] == 327_680
    assert "elementwise-in-producer-shape" in CPU_PIPELINE
    got = after(x)
    assert torch.equal(got, before(x))  # same bits: a reshape moves no value
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))
