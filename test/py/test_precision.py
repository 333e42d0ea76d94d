"""bf16 intermediates (issue 25, item 5): by default every intermediate is
rounded to its dtype as eager rounds it (XLA's
``xla_allow_excess_precision=false``); ``excess_precision=True`` lets XLA
keep fused intermediates in f32 (docs/precision.md)."""

from __future__ import annotations

import torch

import hloalias
from hloalias.pipeline import DEFAULT_PIPELINE


def _matmul_silu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # The matmul's bf16 result feeds silu and a multiply: eager rounds the
    # matmul and silu results to bf16, an f32 intermediate does not.
    return torch.nn.functional.silu(x @ y) * y


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(64, 64, generator=generator).bfloat16(),
        torch.randn(64, 64, generator=generator).bfloat16(),
    )


def test_default_rounds_bf16_intermediates_as_eager() -> None:
    x, y = _inputs()
    assert torch.equal(hloalias.compile(_matmul_silu, (x, y))(x, y), _matmul_silu(x, y))


def test_excess_precision_is_an_option_and_differs() -> None:
    x, y = _inputs()
    # The default pipeline: on one CPU device compile adds
    # accumulate-bf16-dots-in-f32, whose explicit converts XLA keeps, so
    # this chain would round as eager even with excess precision allowed.
    excess = hloalias.compile(_matmul_silu, (x, y), excess_precision=True, pipeline=DEFAULT_PIPELINE)
    exact = hloalias.compile(_matmul_silu, (x, y), excess_precision=False, pipeline=DEFAULT_PIPELINE)
    # One cache entry each: the setting is part of the compile's key.
    assert excess._loaded is not exact._loaded
    assert not torch.equal(excess(x, y), _matmul_silu(x, y))
    assert torch.equal(exact(x, y), _matmul_silu(x, y))
