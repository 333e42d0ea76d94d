"""Constant-folded arithmetic (issue 25, item 3): values known at import
are computed with torch's rules, not torch-mlir's fixed-width folds."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import hloalias
from hloalias.frontend import importer


def _fill_true_then_add(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x.fill_(True)
    return x + x


CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], torch.dtype]] = {
    "bool_fill_add": (_fill_true_then_add, torch.bool),
    "bool_ones_like_add": (lambda x: torch.ones_like(x) + torch.ones_like(x), torch.bool),
    "bool_less_than": (lambda x: torch.full_like(x, True) < torch.full_like(x, False), torch.bool),
    "bool_greater_than": (lambda x: torch.full_like(x, False) > torch.full_like(x, True), torch.bool),
    "int64_floor_divide": (lambda x: torch.full_like(x, -7) // torch.full_like(x, 3), torch.int64),
    "int32_floor_divide": (lambda x: torch.full_like(x, 2**31 - 1) // torch.full_like(x, -5), torch.int32),
    "int8_floor_divide": (lambda x: torch.full_like(x, -128) // torch.full_like(x, -3), torch.int8),
    "uint8_compare": (lambda x: torch.full_like(x, 255) < torch.full_like(x, 3), torch.uint8),
    "float_remainder": (lambda x: torch.remainder(torch.full_like(x, -7.5), 2.0), torch.float32),
    "folded_then_used": (lambda x: (torch.ones_like(x) + torch.ones_like(x)) & x, torch.bool),
    "int_chain_with_input": (lambda x: x + torch.full_like(x, -9) // 2 * 3, torch.int64),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_constant_arithmetic_equals_eager(name: str) -> None:
    f, dtype = CASES[name]
    x = torch.tensor([0, 1, 0], dtype=dtype)
    assert torch.equal(hloalias.compile(f, (x,))(x), f(x))


def test_upstream_folds_bool_addition_as_i1(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch-mlir folds ``True + True`` in ``i1`` (wraps to False); pinned
    with our folding off (if it fails, upstream folds as torch now)."""
    monkeypatch.setattr(importer, "fold_constants", lambda graph: False)
    x = torch.zeros(3, dtype=torch.bool)
    raw = hloalias.compile(lambda x: torch.ones_like(x) + torch.ones_like(x), (x,))
    assert raw(x).tolist() == [False, False, False]


def test_a_splat_constant_stays_one_scalar() -> None:
    """A large folded constant is ``full`` of one value in the module (a
    splat), not a literal of every element."""
    x = torch.zeros(256, 256, dtype=torch.int32)
    text = hloalias.import_torch(lambda x: x + torch.full_like(x, -7) // 2, (x,)).text
    assert "dense<-4> : tensor<256x256xi32>" in text


def test_random_ops_are_not_folded() -> None:
    x = torch.zeros(64)
    executable = hloalias.compile(lambda x: x + torch.rand(64), (x,))
    assert not torch.equal(executable(x), executable(x))
