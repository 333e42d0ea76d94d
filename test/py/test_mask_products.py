"""``x * mask`` (a boolean mask, or one converted to a float) computes
eager's value: ``-0.0`` where a negative ``x`` meets False, NaN where an
infinity or NaN does.  XLA's algebraic simplifier rewrites
``multiply(x, convert(pred))`` as ``select(pred, x, 0)`` (+0.0 in both
places); the importer writes such products as ``where(mask, x, x * 0)``
(frontend/importer.py ``_mask_products_as_selects``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import hloalias

X = torch.tensor([[-1.5, 2.0, float("inf"), float("nan")], [float("-inf"), -0.25, 3.0, -2.0]])
MASK = torch.tensor([[False, False, False, False], [False, True, False, True]])


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan()), (got, want)
    assert torch.equal(torch.signbit(got), torch.signbit(want)), (got, want)
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), (got, want)


PROGRAMS: dict[str, Callable[..., torch.Tensor]] = {
    "bool_mask": lambda x, m: x * m,
    "mask_first": lambda x, m: m * x,
    "float_mask": lambda x, m: x * m.float(),
    "to_dtype_mask": lambda x, m: x * m.to(x.dtype),
    "broadcast_row_mask": lambda x, m: x * m[1],
    "in_place": lambda x, m: x.mul_(m),
    "comparison": lambda x, m: x * (x > 1.0),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_mask_product_matches_eager_bits(name: str) -> None:
    program = PROGRAMS[name]
    want = program(X.clone(), MASK.clone())
    exe = hloalias.compile(program, (X.clone(), MASK.clone()))
    _same_bits(exe(X.clone(), MASK.clone()), want)


def test_mask_product_through_torch_compile() -> None:
    def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return hidden * mask.unsqueeze(-1).to(hidden.dtype)

    hidden = X.unsqueeze(0).expand(2, 2, 4).contiguous()
    mask = torch.tensor([[True, False], [False, False]])
    compiled = torch.compile(masked_mean, backend="hloalias")
    _same_bits(compiled(hidden, mask), masked_mean(hidden, mask))


def test_mask_product_in_float64() -> None:
    x, m = X.double(), MASK
    exe = hloalias.compile(lambda a, b: a * b, (x, m))
    _same_bits(exe(x, m), x * m)
