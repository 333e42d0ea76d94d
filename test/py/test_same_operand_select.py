"""``where(c, a, a)`` that broadcasts ``a``: torch-mlir folds it to ``a``
unbroadcast; the lowering failed, or a full sum of it silently came out of
one element (frontend/importer.py, ``_same_operand_selects_expanded``).  Reached by users through
``scatter_reduce(..., include_self=False)`` of a constant source, which
TAPAS's cell selection computes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import hloalias
from hloalias.errors import TorchImportError
from hloalias.frontend import importer


def _same_input(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, s, s).sum(1)


def _same_constant(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    zeros = torch.zeros(1, 24)
    return torch.where(x > 0, zeros, zeros).sum(1) + s.sum()


def _scatter_sum_of_zeros(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    index = (x[0].abs() * 10).long() % 64
    return torch.zeros(64).scatter_reduce(0, index, torch.zeros(24), reduce="sum", include_self=False)


def _scatter_mean_of_zeros(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    index = (x[0].abs() * 10).long() % 64
    return torch.full((64,), 2.0).scatter_reduce(0, index, torch.zeros(24), reduce="mean", include_self=False)


def _sum_of_one_value(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    # The silent case: the folded select was one element, its sum 1.5
    # where eager's is 1.5 * 64 * 24 (no error: the sum's types agree).
    return torch.where(x > 0.25, torch.full((1,), 1.5), torch.full((1,), 1.5)).sum()


CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum_of_one_value": _sum_of_one_value,
    "same_input": _same_input,
    "same_constant": _same_constant,
    "scatter_sum_of_zeros": _scatter_sum_of_zeros,
    "scatter_mean_of_zeros": _scatter_mean_of_zeros,
}


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(64, 24), torch.randn(1, 24)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_select_between_one_value_equals_eager(name: str) -> None:
    x, s = _inputs()
    f = CASES[name]
    torch.testing.assert_close(hloalias.compile(f, (x, s))(x, s), f(x, s))


def test_a_returned_select_is_a_new_tensor() -> None:
    """The rewrite is an ``expand`` of ``s``; eager's ``where`` returns new
    memory, and so must the call (no view of the caller's ``s``)."""
    x, s = _inputs()

    def f(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, s, s)

    out = hloalias.compile(f, (x, s))(x, s)
    assert torch.equal(out, f(x, s))
    assert out.untyped_storage().data_ptr() != s.untyped_storage().data_ptr()
    out.add_(1.0)
    assert torch.equal(s, _inputs()[1])


def test_upstream_folds_the_select_unbroadcast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pins torch-mlir's fold: when this fails, the rewrite may go."""
    monkeypatch.setattr(importer, "_same_operand_selects_expanded", lambda graph: False)
    x, s = _inputs()

    def not_cached(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:  # not _same_input: a cache hit
        return torch.where(x < 0, s, s).sum(1)

    with pytest.raises(TorchImportError, match="lowering to the"):
        hloalias.compile(not_cached, (x, s))
