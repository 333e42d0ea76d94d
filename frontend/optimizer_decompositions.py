"""Decompositions the training capture uses for optimizer operators.

An optimizer step is traced per parameter (torch's ``foreach`` is off for
CPU tensors), so every operator it calls costs the trace once per
parameter.  Adam and AdamW call ``exp_avg.lerp_(grad, 1 - beta1)`` with a
Python weight; torch's reference decomposition (the importer's table)
turns the weight into a 0-d tensor and picks the formula with
``where(weight.abs() >= 0.5, ...)`` twice: ten traced operators, most of
the trace's time in the reference's type-promotion wrappers.

:func:`lerp_scalar` makes the same choice on the host, where the weight
is known, and emits the three operators that remain after XLA folds the
constant selects: ``coeff * (end - start) + base`` with ``coeff`` and
``base`` what the reference picks and ``coeff`` the same float32/float64
value the reference computes.  The program XLA compiles computes the same
values bit for bit (tested against the reference).  Any other case
(another dtype, broadcasting, a tensor or complex weight, a weight outside
``[-2, 2]``) goes to the reference decomposition unchanged.

``exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)`` and
``param.addcdiv_(exp_avg, denom)`` trace the reference's own operators
(``self + value * tensor1 * tensor2``, ``self + value * tensor1 /
tensor2``: the same nodes, tested) without its type-promotion and ``out``
wrappers, which do nothing for operands of one floating dtype, shape and
layout; other operands go to the reference."""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable
from typing import Any

import torch

from hloalias.frontend.importer import _decomposition_table

aten = torch.ops.aten

#: Largest |weight| handled on the host: float32(weight) - 1 is then exact
#: in double and rounds once to float32, as the reference's float32
#: subtraction does.
_HOST_WEIGHT_LIMIT = 2.0


@functools.cache
def optimizer_decompositions() -> dict[Any, Callable[..., Any]]:
    """(Built once and shared: callers must not modify it.)  The table the
    training capture adds to its decompositions; see the module docstring."""
    return {aten.lerp.Scalar: lerp_scalar, aten.addcmul.default: addcmul, aten.addcdiv.default: addcdiv}


def _as_dtype(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype`` (float32 or float64) on the host."""
    if dtype == torch.float32:
        return float(struct.unpack("f", struct.pack("f", value))[0])
    return value


def lerp_scalar(start: torch.Tensor, end: torch.Tensor, weight: Any) -> torch.Tensor:
    """``aten.lerp.Scalar``: the reference decomposition's arithmetic with
    its constant selects made on the host (module docstring)."""
    fast = (
        isinstance(weight, (int, float))
        and not isinstance(weight, bool)
        and math.isfinite(weight)
        and abs(weight) <= _HOST_WEIGHT_LIMIT
        and start.dtype in (torch.float32, torch.float64)
        and end.dtype == start.dtype
        and start.shape == end.shape
        and start.stride() == end.stride()
        and start.is_contiguous()
    )
    if not fast:
        return _decomposition_table()[aten.lerp.Scalar](start, end, weight)  # type: ignore[no-any-return]
    coeff = _as_dtype(float(weight), start.dtype)  # the reference's start.new_full((), weight)
    if abs(coeff) >= 0.5:
        # The reference's (weight - 1) in start's dtype: exact in double
        # for |weight| <= 2, then rounded once.
        coeff, base = _as_dtype(coeff - 1.0, start.dtype), end
    else:
        base = start
    return aten.add.Tensor(aten.mul.Tensor(aten.sub.Tensor(end, start), coeff), base)  # type: ignore[no-any-return]


def _plain_operands(value: Any, *tensors: torch.Tensor) -> bool:
    """Operands the reference's wrappers leave as they are: one float32 or
    float64 dtype, one shape and contiguous layout, a real Python value."""
    first = tensors[0]
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and first.dtype in (torch.float32, torch.float64)
        and first.is_contiguous()
        and all(t.dtype == first.dtype and t.shape == first.shape and t.stride() == first.stride() for t in tensors)
    )


def addcmul(self: torch.Tensor, tensor1: torch.Tensor, tensor2: torch.Tensor, *, value: Any = 1) -> torch.Tensor:
    """``aten.addcmul``: the reference's ``self + value * tensor1 * tensor2``."""
    if not _plain_operands(value, self, tensor1, tensor2):
        return _decomposition_table()[aten.addcmul.default](self, tensor1, tensor2, value=value)  # type: ignore[no-any-return]
    return aten.add.Tensor(self, aten.mul.Tensor(aten.mul.Tensor(tensor1, value), tensor2))  # type: ignore[no-any-return]


def addcdiv(self: torch.Tensor, tensor1: torch.Tensor, tensor2: torch.Tensor, *, value: Any = 1) -> torch.Tensor:
    """``aten.addcdiv``: the reference's ``self + value * tensor1 / tensor2``."""
    if not _plain_operands(value, self, tensor1, tensor2):
        return _decomposition_table()[aten.addcdiv.default](self, tensor1, tensor2, value=value)  # type: ignore[no-any-return]
    return aten.add.Tensor(self, aten.div.Tensor(aten.mul.Tensor(tensor1, value), tensor2))  # type: ignore[no-any-return]
