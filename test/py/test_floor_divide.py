"""Floor division of floats as eager's CPU kernel (frontend/decompositions.py
``div_mode``): torch-mlir's ``floor(x / y)`` rounded the quotient before
the floor (``1.0 // 0.1`` gave 10.0, eager 9.0), and its infinities and
float16/bfloat16 steps were not eager's."""

from __future__ import annotations

import pytest
import torch

import hloalias

INF, NAN = float("inf"), float("nan")


def _same(ours: torch.Tensor, eager: torch.Tensor) -> bool:
    return ours.dtype == eager.dtype and torch.equal(ours.isnan(), eager.isnan()) and torch.equal(
        ours.nan_to_num(0.0), eager.nan_to_num(0.0)
    ) and torch.equal(ours.signbit() & ~ours.isnan(), eager.signbit() & ~eager.isnan())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_random_quotients_are_eager_s(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    a = (torch.randn(4096) * 10).to(dtype)
    b = torch.randn(4096).to(dtype)

    def op(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a // b, torch.div(a, b, rounding_mode="floor"), torch.floor_divide(a, b)

    for ours, eager in zip(hloalias.jit(op)(a, b), op(a, b)):
        assert _same(ours, eager)


def test_rounded_quotients_zeros_and_infinities() -> None:
    a = torch.tensor([1.0, 1.0, 0.6, -INF, INF, 1.0, -1.0, 0.0, -0.0, 5.0, NAN, 7.0, -7.0])
    b = torch.tensor([0.1, -0.1, 0.2, 2.0, -1.0, 0.0, 0.0, 3.0, 3.0, INF, 1.0, -2.0, 2.0])

    def op(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a // b, a // 0.1

    ours, eager = hloalias.jit(op)(a, b), op(a, b)
    assert _same(ours[0], eager[0]) and _same(ours[1], eager[1])
    assert eager[0][0].item() == 9.0  # the case torch-mlir's floor(x / y) gave 10.0


def test_integer_floor_division_is_unchanged() -> None:
    a, b = torch.tensor([7, -7, 7, -7]), torch.tensor([2, 2, -2, -2])
    assert torch.equal(hloalias.jit(lambda a, b: a // b)(a, b), a // b)
