"""Bessel and Airy functions torch-mlir cannot lower, in aten ops it
lowers, computed in float64 and cast back to the input's floating dtype.

Each is a convergent power series where it is accurate in float64 and an
asymptotic expansion beyond (the formulas of the NIST Digital Library of
Mathematical Functions, DLMF, cited by equation; torch's CPU kernels use
Cephes' rational approximations of the same functions, so results agree
to float32 rounding, not bit for bit):

- ``special.bessel_j0/j1`` and ``bessel_y0/y1``: the series DLMF 10.2.2
  and 10.8.1 for ``|x| <= 12`` (largest term ~5e3: absolute error
  ~1e-12), Hankel's expansion DLMF 10.17.3-4 above (14 terms; its
  smallest term at x = 12 is ~1e-10);
- ``special.modified_bessel_k0/k1`` and the ``scaled_`` forms
  (``exp(x) K(x)``): the series DLMF 10.31.1 for ``x <= 9``, the expansion
  DLMF 10.40.2 above;
- ``special.spherical_bessel_j0``: ``sin(x)/x``, its Taylor series near 0;
- ``special.airy_ai``: the Maclaurin series DLMF 9.4.1 for
  ``-8 <= x <= 6``, the expansions DLMF 9.7.5 (x > 6) and 9.7.9 (x < -8).

Edges follow eager: ``J`` and ``Y`` are NaN at infinities, ``Y`` is -inf
at 0 and NaN below, ``K`` is +inf at 0
and NaN below, NaN stays NaN."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

_EULER_GAMMA = 0.57721566490153286061


def _result_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()


def _digamma_integer(m: int) -> float:
    """psi(m) for a positive integer m: -gamma + H_{m-1}."""
    return -_EULER_GAMMA + sum(1.0 / j for j in range(1, m))


def _series_j(x: torch.Tensor, n: int, terms: int = 40) -> torch.Tensor:
    """J_n(x) = sum_k (-x^2/4)^k (x/2)^n / (k! (n+k)!) (DLMF 10.2.2)."""
    quarter_square = -(x * x) / 4.0
    term = torch.pow(x / 2.0, n) / math.factorial(n)
    total = term
    for k in range(1, terms):
        term = term * quarter_square / (k * (k + n))
        total = total + term
    return total


def _series_y(x: torch.Tensor, n: int, terms: int = 40) -> torch.Tensor:
    """Y_n(x), x > 0, DLMF 10.8.1."""
    half = x / 2.0
    finite = torch.zeros_like(x)
    for k in range(n):
        finite = finite + math.factorial(n - k - 1) / math.factorial(k) * torch.pow(half * half, k)
    finite = -torch.pow(half, -n) / math.pi * finite
    logarithmic = 2.0 / math.pi * torch.log(half) * _series_j(x, n)
    quarter_square = -(x * x) / 4.0
    power = torch.ones_like(x) / math.factorial(n)  # (-x^2/4)^k / (k! (n+k)!)
    tail = (_digamma_integer(1) + _digamma_integer(n + 1)) * power
    for k in range(1, terms):
        power = power * quarter_square / (k * (k + n))
        tail = tail + (_digamma_integer(k + 1) + _digamma_integer(n + k + 1)) * power
    return finite + logarithmic - torch.pow(half, n) / math.pi * tail


def _hankel_terms(n: int, count: int) -> list[float]:
    """a_k(n) = (4n^2 - 1)(4n^2 - 9)...(4n^2 - (2k-1)^2) / (k! 8^k)."""
    mu = 4.0 * n * n
    terms = [1.0]
    for k in range(1, count):
        terms.append(terms[-1] * (mu - (2 * k - 1) ** 2) / (k * 8.0))
    return terms


def _hankel(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(J_n, Y_n) for large x > 0 (DLMF 10.17.3-4)."""
    a = _hankel_terms(n, 28)
    inverse = 1.0 / x
    p = torch.zeros_like(x)
    q = torch.zeros_like(x)
    for k in reversed(range(0, 28, 2)):  # P = sum (-1)^(k/2) a_k / x^k over even k
        p = p * inverse * inverse + (-1) ** (k // 2) * a[k]
    for k in reversed(range(1, 28, 2)):  # Q = sum (-1)^((k-1)/2) a_k / x^k over odd k
        q = q * inverse * inverse + (-1) ** ((k - 1) // 2) * a[k]
    q = q * inverse
    chi = x - (n / 2.0 + 0.25) * math.pi
    scale = torch.sqrt(2.0 / (math.pi * x))
    return scale * (p * torch.cos(chi) - q * torch.sin(chi)), scale * (p * torch.sin(chi) + q * torch.cos(chi))


_J_SWITCH = 12.0


def _bessel_j_wide(x: torch.Tensor, n: int) -> torch.Tensor:
    ax = torch.abs(x)
    small = torch.minimum(ax, torch.full_like(ax, _J_SWITCH))
    large = torch.maximum(ax, torch.full_like(ax, _J_SWITCH))
    result = torch.where(ax <= _J_SWITCH, _series_j(small, n), _hankel(large, n)[0])
    if n == 1:
        result = torch.where(x < 0, -result, result)
    return torch.where(torch.isnan(x), x, result)  # +-inf: NaN (cos(inf)), as eager


def _bessel_y_wide(x: torch.Tensor, n: int) -> torch.Tensor:
    small = torch.clamp(x, min=1e-300, max=_J_SWITCH)
    large = torch.maximum(x, torch.full_like(x, _J_SWITCH))
    result = torch.where(x <= _J_SWITCH, _series_y(small, n), _hankel(large, n)[1])
    result = torch.where(x == 0, torch.full_like(x, -math.inf), result)  # +inf: NaN, as eager
    result = torch.where(x < 0, torch.full_like(x, math.nan), result)
    return torch.where(torch.isnan(x), x, result)


_K_SWITCH = 9.0


def _series_k(x: torch.Tensor, n: int, terms: int = 40) -> torch.Tensor:
    """K_n(x), x > 0, DLMF 10.31.1 (I_n's series inline)."""
    half = x / 2.0
    quarter_square = x * x / 4.0
    finite = torch.zeros_like(x)
    for k in range(n):
        finite = finite + math.factorial(n - k - 1) / math.factorial(k) * torch.pow(-quarter_square, k)
    finite = 0.5 * torch.pow(half, -n) * finite
    power = torch.ones_like(x) / math.factorial(n)  # (x^2/4)^k / (k! (n+k)!)
    bessel_i = power
    tail = (_digamma_integer(1) + _digamma_integer(n + 1)) * power
    for k in range(1, terms):
        power = power * quarter_square / (k * (k + n))
        bessel_i = bessel_i + power
        tail = tail + (_digamma_integer(k + 1) + _digamma_integer(n + k + 1)) * power
    bessel_i = bessel_i * torch.pow(half, n)
    sign = (-1.0) ** n
    return finite - sign * torch.log(half) * bessel_i + sign * 0.5 * torch.pow(half, n) * tail


def _asymptotic_k_scaled(x: torch.Tensor, n: int) -> torch.Tensor:
    """exp(x) K_n(x) for large x (DLMF 10.40.2)."""
    a = _hankel_terms(n, 24)
    inverse = 1.0 / x
    total = torch.zeros_like(x)
    for k in reversed(range(24)):
        total = total * inverse + a[k]
    return torch.sqrt(math.pi / (2.0 * x)) * total


def _bessel_k_wide(x: torch.Tensor, n: int, scaled: bool) -> torch.Tensor:
    small = torch.clamp(x, min=1e-300, max=_K_SWITCH)
    large = torch.maximum(x, torch.full_like(x, _K_SWITCH))
    series = _series_k(small, n)
    if scaled:
        series = series * torch.exp(small)
    asymptotic = _asymptotic_k_scaled(large, n)
    if not scaled:
        asymptotic = asymptotic * torch.exp(-large)
    result = torch.where(x <= _K_SWITCH, series, asymptotic)
    result = torch.where(x == math.inf, torch.zeros_like(x), result)
    result = torch.where(x == 0, torch.full_like(x, math.inf), result)
    result = torch.where(x < 0, torch.full_like(x, math.nan), result)
    return torch.where(torch.isnan(x), x, result)


def _spherical_j0_wide(x: torch.Tensor) -> torch.Tensor:
    square = x * x
    series = 1.0 - square / 6.0 * (1.0 - square / 20.0 * (1.0 - square / 42.0 * (1.0 - square / 72.0)))
    safe = torch.where(torch.abs(x) < 0.5, torch.ones_like(x), x)
    result = torch.where(torch.abs(x) < 0.5, series, torch.sin(safe) / safe)
    return torch.where(torch.isinf(x), torch.zeros_like(x), result)


# Ai(0) and -Ai'(0) (DLMF 9.2.3-4).
_AI0 = 0.355028053887817239260
_AI0_PRIME = 0.258819403792806798405


def _airy_u(count: int) -> list[float]:
    """u_k of DLMF 9.7.2: u_k = (6k-5)(6k-3)(6k-1) / ((2k-1) 216 k) u_{k-1}."""
    u = [1.0]
    for k in range(1, count):
        u.append(u[-1] * (6 * k - 5) * (6 * k - 3) * (6 * k - 1) / ((2 * k - 1) * 216.0 * k))
    return u


def _airy_ai_wide(x: torch.Tensor) -> torch.Tensor:
    inner = torch.clamp(x, min=-8.0, max=6.0)
    cube = inner * inner * inner
    f_term = torch.ones_like(x)
    g_term = inner.clone()
    f_total, g_total = f_term, g_term
    for k in range(1, 40):  # DLMF 9.4.1: Ai = Ai(0) f - (-Ai'(0)) g
        f_term = f_term * cube / ((3 * k - 1) * (3 * k))
        g_term = g_term * cube / ((3 * k) * (3 * k + 1))
        f_total, g_total = f_total + f_term, g_total + g_term
    series = _AI0 * f_total - _AI0_PRIME * g_total
    u = _airy_u(16)
    right = torch.maximum(x, torch.full_like(x, 6.0))
    zeta = 2.0 / 3.0 * right * torch.sqrt(right)
    total = torch.zeros_like(x)
    for k in reversed(range(16)):
        total = total * (-1.0 / zeta) + u[k]
    decaying = torch.exp(-zeta) / (2.0 * math.sqrt(math.pi) * torch.pow(right, 0.25)) * total
    left = torch.maximum(-x, torch.full_like(x, 8.0))
    zeta = 2.0 / 3.0 * left * torch.sqrt(left)
    even = torch.zeros_like(x)
    odd = torch.zeros_like(x)
    for k in reversed(range(8)):
        even = even * (-1.0 / (zeta * zeta)) + u[2 * k]
        odd = odd * (-1.0 / (zeta * zeta)) + u[2 * k + 1]
    odd = odd / zeta
    phase = zeta - math.pi / 4.0
    oscillating = (torch.cos(phase) * even + torch.sin(phase) * odd) / (math.sqrt(math.pi) * torch.pow(left, 0.25))
    result = torch.where(x > 6.0, decaying, torch.where(x < -8.0, oscillating, series))
    result = torch.where(torch.isinf(x), torch.full_like(x, math.nan), result)
    return torch.where(torch.isnan(x), x, result)


def _elementwise(wide: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def function(x: torch.Tensor) -> torch.Tensor:
        return wide(x.to(torch.float64)).to(_result_dtype(x))

    return function


def bessel_decompositions() -> dict[Any, Callable[..., Any]]:
    """The table of this module's functions by aten op."""
    return {
        aten.special_bessel_j0.default: _elementwise(lambda x: _bessel_j_wide(x, 0)),
        aten.special_bessel_j1.default: _elementwise(lambda x: _bessel_j_wide(x, 1)),
        aten.special_bessel_y0.default: _elementwise(lambda x: _bessel_y_wide(x, 0)),
        aten.special_bessel_y1.default: _elementwise(lambda x: _bessel_y_wide(x, 1)),
        aten.special_modified_bessel_k0.default: _elementwise(lambda x: _bessel_k_wide(x, 0, False)),
        aten.special_modified_bessel_k1.default: _elementwise(lambda x: _bessel_k_wide(x, 1, False)),
        aten.special_scaled_modified_bessel_k0.default: _elementwise(lambda x: _bessel_k_wide(x, 0, True)),
        aten.special_scaled_modified_bessel_k1.default: _elementwise(lambda x: _bessel_k_wide(x, 1, True)),
        aten.special_spherical_bessel_j0.default: _elementwise(_spherical_j0_wide),
        aten.special_airy_ai.default: _elementwise(_airy_ai_wide),
    }
