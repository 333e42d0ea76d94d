"""Negative indices (issue 25, item 1) and torch's ``remainder``: every op
that accepts an index counted from the end equals eager, with the index in
a list (a lifted constant) or in a tensor known only at run time; the
upstream behaviour (torch-mlir's StableHLO lowering clamps) is pinned by
importing with the normalization switched off."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.frontend import importer

X = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
IDX = torch.tensor([-1, 0, -3])


def _setitem(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[:, i] = -1.0
    return y


def _index_put_accumulate(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x.clone().index_put_((i,), torch.ones(3, 4, 5)[: i.numel()], accumulate=True)


CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[Any, ...]]] = {
    "list_index": (lambda x: x[..., [-2], :], (X,)),
    "list_index_two": (lambda x: x[[-1, 0], [-2, 1]], (X,)),
    "tensor_index": (lambda x, i: x[i], (X, IDX)),
    "tensor_index_dim1": (lambda x, i: x[:, i], (X, IDX)),
    "two_tensor_indices": (lambda x, i: x[i, i.flip(0)], (X, IDX)),
    "setitem": (_setitem, (X, IDX)),
    "index_put_accumulate": (_index_put_accumulate, (X, torch.tensor([-1, -1, 0]))),
    "index_fill": (lambda x, i: x.clone().index_fill_(2, i, 7.0), (X, IDX)),
    "take": (lambda x, i: x.take(i), (X, torch.tensor([-1, -60, 5]))),
    "take_along_dim": (
        lambda x, i: torch.take_along_dim(x, i, 2),
        (X, torch.tensor([-1, 0, -5, 2]).expand(3, 4, 4).contiguous()),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_negative_indices_equal_eager(name: str) -> None:
    f, args = CASES[name]
    executable = hloalias.compile(f, args)
    assert torch.equal(executable(*args), f(*args))


def test_run_time_index_changes_sign_between_calls() -> None:
    f = lambda x, i: x[:, i]  # noqa: E731
    executable = hloalias.compile(f, (X, torch.tensor([0, 1])))
    for values in ([0, 1], [-1, -4], [3, -2]):
        index = torch.tensor(values)
        assert torch.equal(executable(X, index), f(X, index))


def test_upstream_lowering_clamps_negative_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch-mlir's StableHLO lowering feeds -1 to stablehlo.gather, which
    clamps it to 0: this pins that (if it fails, upstream normalizes now
    and our rewrite is redundant, not wrong)."""
    monkeypatch.setattr(importer, "normalize_indices", lambda graph, constants: False)
    # The program cache keys hloalias's sources, not a patched function: the
    # unnormalized program must not be stored for the identical lambda below.
    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "0")
    f = lambda x, i: x[:, i] * 1.0  # noqa: E731
    raw = hloalias.compile(f, (X, IDX))
    assert torch.equal(raw(X, IDX), X[:, torch.tensor([0, 0, 0])])
    monkeypatch.undo()
    g = lambda x, i: x[:, i] * 1.0  # noqa: E731
    assert torch.equal(hloalias.compile(g, (X, IDX))(X, IDX), g(X, IDX))


def test_non_negative_constant_index_is_not_rewritten() -> None:
    """A constant index known to be non-negative keeps its plain form (the
    scatter passes match it); a run-time index gets the select."""
    constant = hloalias.import_torch(lambda x: x[:, [1, 2]] * 1.0, (X,)).text
    runtime = hloalias.import_torch(lambda x, i: x[:, i] * 1.0, (X, IDX)).text
    assert "stablehlo.select" not in constant
    assert "stablehlo.select" in runtime


REMAINDERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "int_scalar": lambda a: torch.remainder(a, 3),
    "int_negative_divisor": lambda a: torch.remainder(a, -3),
    "int_operator": lambda a: a % 4,
    "int_tensor": lambda a: torch.remainder(a, a.flip(0) * 2 - 9),
    "float_scalar": lambda a: torch.remainder(a.float() + 0.5, 3.0),
    "float_negative_divisor": lambda a: torch.remainder(a.float() - 0.25, -2.5),
}


@pytest.mark.parametrize("name", sorted(REMAINDERS))
def test_remainder_takes_the_divisors_sign(name: str) -> None:
    f = REMAINDERS[name]
    a = torch.tensor([-7, -3, -1, 0, 1, 5, 7, 8])
    assert torch.equal(hloalias.compile(f, (a,))(a), f(a))


def test_upstream_remainder_is_fmod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importer, "normalize_indices", lambda graph, constants: False)
    # The program cache keys hloalias's sources, not a patched function: the
    # unnormalized program must not be stored for the identical lambda below.
    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "0")
    a = torch.tensor([-7, -1, 5])
    assert hloalias.compile(lambda a: torch.remainder(a, 3), (a,))(a).tolist() == [-1, -1, 2]
