"""returned-matvec-as-reduce, measured by XLA: a language-model head on one
token (GPT-2's logits) is written straight into its output buffer instead
of computed in temp and copied, and results match eager."""

from __future__ import annotations

import torch

import hloalias
from hloalias.passes import ReturnedMatvecAsReduce
from hloalias.pipeline import DEFAULT_PIPELINE

HIDDEN, VOCAB = 64, 5000
WITH_OPTION = DEFAULT_PIPELINE.replace("window-scatter-indices,", "window-scatter-indices, returned-matvec-as-reduce,")


class Head(torch.nn.Module):
    """``lm_head`` of a decoder on one token."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def test_logits_are_not_copied() -> None:
    torch.manual_seed(0)
    model = Head()
    hidden = torch.randn(1, 1, HIDDEN)
    program = hloalias.import_torch(model, (hidden,))
    assert ReturnedMatvecAsReduce().apply(program).rewritten == 1
    default = hloalias.compile(model, (hidden,))
    option = hloalias.compile(model, (hidden,), pipeline=WITH_OPTION)
    logits_bytes = VOCAB * 4
    arguments = VOCAB * HIDDEN * 4 + HIDDEN * 4
    # XLA:CPU computes the one-row dot in temp and copies it into the output.
    assert default.memory_stats["temp_bytes"] == logits_bytes
    assert option.memory_stats["temp_bytes"] == 0
    assert option.memory_stats["total_bytes"] == arguments + logits_bytes
    for _ in range(2):
        torch.testing.assert_close(option(hidden), model(hidden))
        hidden = torch.randn(1, 1, HIDDEN)


def test_option_is_not_in_the_default_pipeline() -> None:
    """It changes the summation order, so it is opt-in."""
    assert ReturnedMatvecAsReduce.name not in DEFAULT_PIPELINE
