"""torch's comparisons in torch-mlir's StableHLO (frontend/comparisons.py):
its sorts and arg-reductions compared floats with ordered comparisons, so a
NaN in a slice gave other indices (and values) than eager's, silently; its
comparisons of booleans did not compile."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias

NAN = float("nan")

_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "argmax": lambda x: x.argmax(),
    "argmax_dim1": lambda x: x.argmax(1),
    "argmax_dim0_keepdim": lambda x: x.argmax(0, keepdim=True),
    "argmin_dim1": lambda x: x.argmin(1),
    "max_dim1": lambda x: tuple(x.max(1)),
    "min_dim0": lambda x: tuple(x.min(0)),
    "sort": lambda x: tuple(x.sort(1)),
    "sort_descending": lambda x: tuple(x.sort(1, descending=True)),
    "argsort_dim0": lambda x: x.argsort(0),
    "msort": lambda x: x.msort(),
    "topk_values": lambda x: x.topk(2, 1).values,
    "topk_smallest_values": lambda x: x.topk(2, 1, largest=False).values,
    "median_dim1": lambda x: tuple(x.median(1)),
}

# A NaN in the middle, two NaNs, an infinity beside a NaN, an all-NaN row.
_X = torch.tensor([
    [1.0, NAN, 3.0, NAN, -2.0],
    [2.0, 0.5, -1.0, 4.0, 4.0],
    [float("inf"), NAN, 0.0, -float("inf"), 1.0],
    [NAN, NAN, NAN, NAN, NAN],
])


def _same(ours: Any, eager: Any) -> bool:
    if isinstance(eager, tuple):
        return len(ours) == len(eager) and all(_same(a, b) for a, b in zip(ours, eager))
    return ours.dtype == eager.dtype and ours.shape == eager.shape and torch.equal(
        torch.nan_to_num(ours, nan=7.0), torch.nan_to_num(eager, nan=7.0)
    ) and torch.equal(ours.isnan(), eager.isnan()) if ours.is_floating_point() else torch.equal(ours, eager)


@pytest.mark.parametrize("name", sorted(_OPS))
def test_nans_order_as_in_eager(name: str) -> None:
    op = _OPS[name]
    assert _same(hloalias.jit(op)(_X), op(_X))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_widths(dtype: torch.dtype) -> None:
    x = _X.to(dtype)

    def op(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.argmax(1), x.argmin(1), x.sort(1).indices

    assert _same(hloalias.jit(op)(x), op(x))


def test_ties_without_nan_keep_their_order() -> None:
    x = torch.tensor([[1.0, 0.0, 1.0, 0.0, 1.0, 2.0, 2.0], [3.0] * 7])

    def op(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.sort(1).indices, x.sort(1, descending=True).indices, x.argmax(1), x.argmin(1)

    assert _same(hloalias.jit(op)(x), op(x))


def test_a_compiled_module_with_nan_logits_picks_eager_tokens() -> None:
    # Greedy decoding's argmax over logits with a NaN (an overflowed row).
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 6)
    features = torch.randn(3, 4)
    features[1, 2] = NAN
    exe = hloalias.compile(lambda f: head(f).argmax(-1), (features,))
    assert torch.equal(exe(features), head(features).argmax(-1))


def test_comparisons_of_booleans_compile_and_order_false_below_true() -> None:
    a, b = torch.tensor([1.0, -1.0, 2.0, -2.0]), torch.tensor([1.0, 1.0, -1.0, -1.0])

    def op(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p, q = a > 0, b > 0
        return p != q, p == q, p < q, p >= q, torch.maximum(p.int(), q.int()), torch.stack([p, q]).sort(0).values

    assert _same(hloalias.jit(op)(a, b), op(a, b))
