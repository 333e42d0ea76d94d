"""torch's orthogonal polynomials (``special.chebyshev_polynomial_t/u/v/w``,
their ``shifted_`` forms, ``hermite_polynomial_h/he``,
``laguerre_polynomial_l``, ``legendre_polynomial_p``) in aten ops
torch-mlir lowers: each polynomial's three-term recurrence (DLMF 18.9.1,
18.9.2 and 18.9.8 ff.) in the result dtype, as eager's kernels run it
(the same overflow to inf, and inf - inf to NaN, for large degrees), and
the Chebyshev polynomials inside ``(-1, 1)`` by their trigonometric forms
in float64 (eager switches to those forms above a small degree).

The degree ``n`` is truncated to an integer, as eager's kernels do; a
negative degree gives 0.  A degree given as a number unrolls exactly ``n``
steps.  A degree given as a tensor is a value the program does not know
when it is compiled: the recurrence is unrolled :data:`MAX_TENSOR_DEGREE`
steps and each element takes the step of its degree; a larger degree
gives NaN (as eager's Hermite polynomials do above 128 in float32, the
same bound), documented in docs/refusals.md."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch

aten = torch.ops.aten

#: torch.broadcast_tensors, typed (torch leaves it untyped).
_broadcast_tensors = cast(Callable[..., tuple[torch.Tensor, ...]], torch.broadcast_tensors)

#: Steps unrolled for a degree given as a tensor (eager's float32 bound of
#: the Hermite polynomials).
MAX_TENSOR_DEGREE = 128

# name -> (argument map: x -> y, first polynomial of y: P_1(y),
#          next(y, k, P_k, P_{k-1}) -> P_{k+1}).
Step = Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor], torch.Tensor]


def _chebyshev(y: torch.Tensor, k: int, current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    return 2.0 * y * current - previous


def _hermite_h(y: torch.Tensor, k: int, current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    return 2.0 * y * current - 2.0 * k * previous


def _hermite_he(y: torch.Tensor, k: int, current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    return y * current - k * previous


def _laguerre(y: torch.Tensor, k: int, current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    return (((2 * k) + (1.0 - y)) * current - k * previous) / (k + 1)


def _legendre(y: torch.Tensor, k: int, current: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    return ((2 * k + 1) * y * current - k * previous) / (k + 1)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _shifted(x: torch.Tensor) -> torch.Tensor:
    return 2.0 * x - 1.0


_FAMILIES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor], Step]] = {
    "t": (_identity, lambda y: y, _chebyshev),
    "u": (_identity, lambda y: 2.0 * y, _chebyshev),
    "v": (_identity, lambda y: 2.0 * y - 1.0, _chebyshev),
    "w": (_identity, lambda y: 2.0 * y + 1.0, _chebyshev),
    "shifted_t": (_shifted, lambda y: y, _chebyshev),
    "shifted_u": (_shifted, lambda y: 2.0 * y, _chebyshev),
    "shifted_v": (_shifted, lambda y: 2.0 * y - 1.0, _chebyshev),
    "shifted_w": (_shifted, lambda y: 2.0 * y + 1.0, _chebyshev),
    "h": (_identity, lambda y: 2.0 * y, _hermite_h),
    "he": (_identity, lambda y: y, _hermite_he),
    "l": (_identity, lambda y: 1.0 - y, _laguerre),
    "p": (_identity, lambda y: y, _legendre),
}


def _chebyshev_trigonometric(family: str, y: torch.Tensor, degree: torch.Tensor) -> torch.Tensor:
    """The Chebyshev polynomials of ``|y| < 1`` (float64) by their
    trigonometric forms (DLMF 18.5.1-4), ``theta = acos(y)``."""
    theta = torch.acos(torch.clamp(y, -1.0, 1.0))
    kind = family.removeprefix("shifted_")
    if kind == "t":
        return torch.cos(degree * theta)
    if kind == "u":
        return torch.sin((degree + 1) * theta) / torch.sin(theta)
    if kind == "v":
        return torch.cos((degree + 0.5) * theta) / torch.cos(theta / 2)
    return torch.sin((degree + 0.5) * theta) / torch.sin(theta / 2)


def _evaluate(family: str, x: Any, n: Any) -> torch.Tensor:
    """The recurrence runs in the result dtype, as eager's (the same
    overflow to inf and NaN); Chebyshev polynomials inside ``(-1, 1)``,
    where the recurrence loses accuracy with the degree, take the
    trigonometric form in float64 (eager: its own threshold of degree)."""
    dtype = torch.result_type(x, n)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    argument, first, step = _FAMILIES[family]
    if not isinstance(x, torch.Tensor):
        x = torch.full(n.shape, float(x), dtype=dtype)
    y = argument(x.to(dtype))
    if not isinstance(n, torch.Tensor):
        degree = int(n)
        if degree < 0:
            return torch.zeros_like(y)
        previous, current = torch.ones_like(y), first(y)
        if degree == 0:
            return previous
        for k in range(1, degree):
            previous, current = current, step(y, k, current, previous)
        if family in _CHEBYSHEV:
            wide = argument(x.to(torch.float64))
            trigonometric = _chebyshev_trigonometric(family, wide, torch.full_like(wide, float(degree))).to(dtype)
            current = torch.where(torch.abs(y) < 1, trigonometric, current)
        return current
    degree_tensor = torch.trunc(n.to(dtype))
    y, degree_tensor = _broadcast_tensors(y, degree_tensor)
    previous, current = torch.ones_like(y), first(y)
    result = torch.where(degree_tensor == 0, previous, torch.zeros_like(y))
    result = torch.where(degree_tensor == 1, current, result)
    for k in range(1, MAX_TENSOR_DEGREE):
        previous, current = current, step(y, k, current, previous)
        result = torch.where(degree_tensor == k + 1, current, result)
    if family in _CHEBYSHEV:
        wide = argument(x.to(torch.float64))
        trigonometric = _chebyshev_trigonometric(family, wide, degree_tensor.to(torch.float64)).to(dtype)
        result = torch.where((torch.abs(y) < 1) & (degree_tensor >= 0), trigonometric, result)
    too_high = (degree_tensor > MAX_TENSOR_DEGREE) | torch.isnan(degree_tensor)
    return torch.where(too_high, torch.full_like(result, math.nan), result)


def _polynomial(family: str) -> Callable[..., torch.Tensor]:
    def polynomial(x: Any, n: Any) -> torch.Tensor:
        return _evaluate(family, x, n)

    return polynomial


_CHEBYSHEV = frozenset(("t", "u", "v", "w", "shifted_t", "shifted_u", "shifted_v", "shifted_w"))

_OPS = {
    "t": "special_chebyshev_polynomial_t",
    "u": "special_chebyshev_polynomial_u",
    "v": "special_chebyshev_polynomial_v",
    "w": "special_chebyshev_polynomial_w",
    "shifted_t": "special_shifted_chebyshev_polynomial_t",
    "shifted_u": "special_shifted_chebyshev_polynomial_u",
    "shifted_v": "special_shifted_chebyshev_polynomial_v",
    "shifted_w": "special_shifted_chebyshev_polynomial_w",
    "h": "special_hermite_polynomial_h",
    "he": "special_hermite_polynomial_he",
    "l": "special_laguerre_polynomial_l",
    "p": "special_legendre_polynomial_p",
}


def polynomial_decompositions() -> dict[Any, Callable[..., Any]]:
    """The table of this module's functions by aten op (the tensor, the
    ``x_scalar`` and the ``n_scalar`` overloads)."""
    table: dict[Any, Callable[..., Any]] = {}
    for family, name in _OPS.items():
        packet = getattr(aten, name)
        for overload in ("default", "x_scalar", "n_scalar"):
            table[getattr(packet, overload)] = _polynomial(family)
    return table
