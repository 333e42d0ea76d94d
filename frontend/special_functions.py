"""Special functions torch-mlir cannot lower, written in aten ops it
lowers (``log``, ``exp``, ``sin``, ``tan``, ``erf``, arithmetic), computed in
float64 and cast back to the input's floating dtype:

- ``lgamma``: Lanczos' approximation (g = 7, 9 terms), reflection below 1/2;
- ``digamma``: ten steps of the recurrence then the asymptotic series,
  reflection below 1/2;
- ``polygamma(n, x)``, ``n >= 1``, and ``special.zeta(s, q)``: the Hurwitz
  zeta function by Euler-Maclaurin summation (forty direct terms, six
  Bernoulli corrections: accurate for ``q >= -30``),
  ``polygamma(n, x) = (-1)^(n+1) n! zeta(n+1, x)``;
- ``erfinv``: Giles' single-precision approximation refined by two Newton
  steps on ``erf``;
- ``i0``, ``special.i0e``, ``i1``, ``i1e``, ``modified_bessel_i0/i1``: the
  power series up to ``|x| = 30``, Hankel's asymptotic expansion above;
- ``special.ndtri``: ``sqrt(2) erfinv(2p - 1)``;
- ``igamma``/``igammac`` (regularized incomplete gamma P, Q): series
  below ``x = a + 1``, continued fraction above, accurate for ``a`` up to
  ~400;
- ``special.erfcx``: ``exp(x^2) erfc(x)`` directly below 2, a continued
  fraction above (``special.log_ndtr``'s decomposition uses it);
- ``erfc``: ``1 - erf`` (absolute error ~1e-16 in float64, so a relative
  error that grows where erfc underflows float32's precision of 1 - erf:
  x > ~5).

Poles and edges follow eager: ``lgamma`` is +inf at 0 and the negative
integers, ``digamma`` is -inf at 0 and NaN at the negative integers,
``zeta(s, q)`` is +inf for ``s == 1`` and NaN for ``s < 1``; NaN stays NaN.
:func:`special_decompositions` is the table
:mod:`hloalias.frontend.decompositions` adds."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch

from hloalias.frontend.bessel_functions import bessel_decompositions
from hloalias.frontend.orthogonal_polynomials import polynomial_decompositions

aten = torch.ops.aten

#: torch.broadcast_tensors, typed (torch leaves it untyped).
_broadcast_tensors = cast(Callable[..., tuple[torch.Tensor, ...]], torch.broadcast_tensors)

_LANCZOS_G = 7.0
_LANCZOS = (
    0.99999999999980993,
    676.5203681218851,
    -1259.1392167224028,
    771.32342877765313,
    -176.61502916214059,
    12.507343278686905,
    -0.13857109526572012,
    9.9843695780195716e-6,
    1.5056327351493116e-7,
)
# B_2k for k = 1..6.
_BERNOULLI = (1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66, -691.0 / 2730)


def _result_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()


def _wide(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def _nonpositive_integer(x: torch.Tensor) -> torch.Tensor:
    return (x <= 0) & (x == torch.floor(x))


def _lgamma_wide(x: torch.Tensor) -> torch.Tensor:
    reflect = x < 0.5
    y = torch.where(reflect, 1.0 - x, x)  # y >= 1/2
    z = y - 1.0
    series = torch.full_like(z, _LANCZOS[0])
    for i in range(1, len(_LANCZOS)):
        series = series + _LANCZOS[i] / (z + i)
    t = z + _LANCZOS_G + 0.5
    positive = 0.5 * math.log(2 * math.pi) + (z + 0.5) * torch.log(t) - t + torch.log(series)
    reflected = math.log(math.pi) - torch.log(torch.abs(torch.sin(math.pi * x))) - positive
    result = torch.where(reflect, reflected, positive)
    result = torch.where(_nonpositive_integer(x) | torch.isinf(x), torch.full_like(x, math.inf), result)
    return torch.where(torch.isnan(x), x, result)


def lgamma(x: torch.Tensor) -> torch.Tensor:
    return _lgamma_wide(_wide(x)).to(_result_dtype(x))


def _digamma_wide(x: torch.Tensor) -> torch.Tensor:
    reflect = x < 0.5
    y = torch.where(reflect, 1.0 - x, x)
    shift = torch.zeros_like(y)
    for _ in range(10):
        shift = shift - 1.0 / y
        y = y + 1.0
    inverse_square = 1.0 / (y * y)
    tail = torch.zeros_like(y)
    for k in reversed(range(1, len(_BERNOULLI) + 1)):  # sum_k B_2k / (2k y^2k), Horner in 1/y^2
        tail = (tail + _BERNOULLI[k - 1] / (2 * k)) * inverse_square
    positive = torch.log(y) - 0.5 / y - tail + shift
    reflected = positive - math.pi / torch.tan(math.pi * x)
    result = torch.where(reflect, reflected, positive)
    result = torch.where(_nonpositive_integer(x), torch.full_like(x, math.nan), result)
    result = torch.where(x == 0, torch.full_like(x, -math.inf), result)
    result = torch.where(x == math.inf, x, result)
    return torch.where(torch.isnan(x), x, result)


def digamma(x: torch.Tensor) -> torch.Tensor:
    return _digamma_wide(_wide(x)).to(_result_dtype(x))


def _zeta_wide(s: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Hurwitz zeta: sum_{k<N} (q+k)^-s + (q+N)^(1-s)/(s-1) + (q+N)^-s/2
    + sum_j B_2j/(2j)! s(s+1)...(s+2j-2) (q+N)^(-s-2j+1)."""
    terms = 40  # direct terms: accurate for q >= -30 (polygamma of negative x)
    total = torch.zeros_like(q)
    for k in range(terms):
        total = total + torch.pow(q + k, -s)
    a = q + terms
    total = total + torch.pow(a, 1.0 - s) / (s - 1.0) + 0.5 * torch.pow(a, -s)
    rising = s  # s (s+1) ... (s+2j-2)
    factorial = 2.0  # (2j)!
    power = torch.pow(a, -s - 1.0)
    for j in range(1, len(_BERNOULLI) + 1):
        total = total + _BERNOULLI[j - 1] / factorial * rising * power
        rising = rising * (s + 2 * j - 1) * (s + 2 * j)
        factorial = factorial * (2 * j + 1) * (2 * j + 2)
        power = power / (a * a)
    total = torch.where(s == 1, torch.full_like(total, math.inf), total)
    total = torch.where(s < 1, torch.full_like(total, math.nan), total)
    # A pole at q = 0, -1, ...; other q <= 0 only for integer s (Cephes').
    total = torch.where(_nonpositive_integer(q) & (s > 1), torch.full_like(total, math.inf), total)
    total = torch.where((q <= 0) & (s != torch.floor(s)), torch.full_like(total, math.nan), total)
    return torch.where(torch.isnan(s) | torch.isnan(q), torch.full_like(total, math.nan), total)


def zeta(s: Any, q: Any) -> torch.Tensor:
    dtype = torch.result_type(s, q)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    s_wide = torch.as_tensor(s).to(torch.float64) if not isinstance(s, torch.Tensor) else _wide(s)
    q_wide = torch.as_tensor(q).to(torch.float64) if not isinstance(q, torch.Tensor) else _wide(q)
    return _zeta_wide(s_wide, q_wide).to(dtype)


def zeta_self_scalar(s: float, q: torch.Tensor) -> torch.Tensor:
    return _zeta_wide(torch.full_like(_wide(q), float(s)), _wide(q)).to(_result_dtype(q))


def zeta_other_scalar(s: torch.Tensor, q: float) -> torch.Tensor:
    return _zeta_wide(_wide(s), torch.full_like(_wide(s), float(q))).to(_result_dtype(s))


def polygamma(n: int, x: torch.Tensor) -> torch.Tensor:
    if n == 0:
        return digamma(x)
    wide = _wide(x)
    sign = 1.0 if n % 2 == 1 else -1.0
    value = sign * math.factorial(n) * _zeta_wide(torch.full_like(wide, float(n + 1)), wide)
    return value.to(_result_dtype(x))


def mvlgamma(x: torch.Tensor, p: int) -> torch.Tensor:
    wide = _wide(x)
    total = torch.full_like(wide, p * (p - 1) / 4 * math.log(math.pi))
    for j in range(p):
        total = total + _lgamma_wide(wide - j / 2)
    return total.to(_result_dtype(x))


_GILES_CENTRAL = (
    2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941,
)
_GILES_TAIL = (
    -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
    -0.0076224613, 0.00943887047, 1.00167406, 2.83297682,
)


def erfinv(x: torch.Tensor) -> torch.Tensor:
    wide = _wide(x)
    w = -torch.log((1.0 - wide) * (1.0 + wide))
    central = w < 5.0
    wc = w - 2.5
    wt = torch.sqrt(w) - 3.0
    pc = torch.full_like(wide, _GILES_CENTRAL[0])
    pt = torch.full_like(wide, _GILES_TAIL[0])
    for c, t in zip(_GILES_CENTRAL[1:], _GILES_TAIL[1:]):
        pc = pc * wc + c
        pt = pt * wt + t
    y = torch.where(central, pc, pt) * wide
    for _ in range(2):  # Newton on erf(y) = x
        step = (torch.erf(y) - wide) / (2.0 / math.sqrt(math.pi) * torch.exp(-y * y))
        y = torch.where(torch.isfinite(y), y - step, y)
    y = torch.where(wide == 1.0, torch.full_like(y, math.inf), y)
    y = torch.where(wide == -1.0, torch.full_like(y, -math.inf), y)
    y = torch.where(torch.abs(wide) > 1.0, torch.full_like(y, math.nan), y)
    return y.to(_result_dtype(x))


def erfc(x: torch.Tensor) -> torch.Tensor:
    return (1.0 - torch.erf(_wide(x))).to(_result_dtype(x))


def ndtri(p: torch.Tensor) -> torch.Tensor:
    """The inverse of the standard normal CDF: sqrt(2) erfinv(2p - 1)."""
    return (math.sqrt(2.0) * _wide(erfinv(2.0 * _wide(p) - 1.0))).to(_result_dtype(p))


def _erfcx_wide(x: torch.Tensor) -> torch.Tensor:
    """``exp(x^2) erfc(x)``: ``exp(x^2) (1 - erf(x))`` below 2 (erfc >= 0.004
    there: float64's ``1 - erf`` keeps 13 digits), above it the continued
    fraction of DLMF 7.9.2, ``erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x +
    1/(x + (3/2)/(x + ...))))``, 60 levels evaluated from the tail."""
    below = torch.minimum(x, torch.full_like(x, 2.0))
    direct = torch.exp(below * below) * (1.0 - torch.erf(below))
    above = torch.maximum(x, torch.full_like(x, 2.0))
    fraction = above
    for level in reversed(range(1, 61)):
        fraction = above + (level / 2.0) / fraction
    continued = 1.0 / (math.sqrt(math.pi) * fraction)
    result = torch.where(x < 2.0, direct, continued)
    result = torch.where(x == math.inf, torch.zeros_like(x), result)
    return torch.where(torch.isnan(x), x, result)


def erfcx(x: torch.Tensor) -> torch.Tensor:
    return _erfcx_wide(_wide(x)).to(_result_dtype(x))


_IGAMMA_SERIES_TERMS = 160
_IGAMMA_FRACTION_LEVELS = 80


def _igamma_wide(a: torch.Tensor, x: torch.Tensor, upper: bool) -> torch.Tensor:
    """The regularized incomplete gamma functions P(a, x) (``upper``
    False) and Q(a, x) = 1 - P: the series DLMF 8.11.4 for ``x < a + 1``,
    the continued fraction DLMF 8.9.2 (Legendre's) above, each for the one
    of P, Q it does not lose to cancellation (as Cephes' igam/igamc).  A
    fixed number of terms (160 series terms, 80 fraction levels: each
    unrolled, so compile time grows with them) matches eager to float32's
    tolerance for ``a`` up to ~400; eager switches to Temme's expansion
    for larger ``a``."""
    a, x = _broadcast_tensors(a, x)
    positive_a = torch.where(a > 0, a, torch.ones_like(a))
    positive_x = torch.where(x > 0, x, torch.ones_like(x))
    # x^a e^-x / Gamma(a), the factor both expansions share.
    prefactor = torch.exp(positive_a * torch.log(positive_x) - positive_x - _lgamma_wide(positive_a))
    use_series = positive_x < positive_a + 1.0
    # Series: P = prefactor / a * sum_n x^n / ((a+1)...(a+n)).
    term = torch.ones_like(a)
    total = torch.ones_like(a)
    for n in range(1, _IGAMMA_SERIES_TERMS):
        term = term * positive_x / (positive_a + n)
        total = total + term
    series_p = prefactor * total / positive_a
    # Continued fraction: Q = prefactor / (x + 1 - a - 1(1-a)/(x + 3 - a - 2(2-a)/(x + 5 - a - ...))).
    fraction = positive_x + (2 * _IGAMMA_FRACTION_LEVELS + 1) - positive_a
    for k in reversed(range(1, _IGAMMA_FRACTION_LEVELS + 1)):
        fraction = positive_x + (2 * k - 1) - positive_a - k * (k - positive_a) / fraction
    fraction_q = prefactor / fraction
    p = torch.where(use_series, series_p, 1.0 - fraction_q)
    q = torch.where(use_series, 1.0 - series_p, fraction_q)
    result = q if upper else p
    lower_edge, upper_edge = (1.0, 0.0) if upper else (0.0, 1.0)
    # Edges as eager's: x = 0 -> P = 0; x = inf -> P = 1; a = 0 -> P = 1
    # (x > 0); a = inf -> P = 0; a < 0, x < 0, (0, 0), (inf, inf) -> NaN.
    result = torch.where(x == 0, torch.full_like(result, lower_edge), result)
    result = torch.where(x == math.inf, torch.full_like(result, upper_edge), result)
    result = torch.where((a == 0) & (x > 0), torch.full_like(result, upper_edge), result)
    result = torch.where((a == math.inf) & (x < math.inf), torch.full_like(result, lower_edge), result)
    invalid = (a < 0) | (x < 0) | ((a == 0) & (x == 0)) | ((a == math.inf) & (x == math.inf))
    invalid = invalid | torch.isnan(a) | torch.isnan(x)
    return torch.where(invalid, torch.full_like(result, math.nan), result)


def _igamma(upper: bool) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def igamma(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.result_type(a, x)
        if not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        return _igamma_wide(_wide(a), _wide(x), upper).to(dtype)

    return igamma


def _bessel_i_wide(x: torch.Tensor, order: int, scaled: bool) -> torch.Tensor:
    """``I_0``/``I_1`` (times ``exp(-|x|)`` when ``scaled``): the power
    series for ``|x| <= 30`` (60 terms), Hankel's asymptotic expansion
    (8 terms) above."""
    ax = torch.abs(x)
    small = torch.minimum(ax, torch.full_like(ax, 30.0))
    half_square = (small / 2) ** 2
    term = torch.ones_like(ax) if order == 0 else small / 2
    total = term
    for k in range(1, 60):
        term = term * half_square / (k * (k + order))
        total = total + term
    series = total * torch.exp(-small) if scaled else total
    large = torch.maximum(ax, torch.full_like(ax, 30.0))
    mu = 4.0 * order * order
    factor = torch.ones_like(ax)
    expansion = torch.ones_like(ax)
    for k in range(1, 9):
        factor = -factor * (mu - (2 * k - 1) ** 2) / (k * 8.0 * large)
        expansion = expansion + factor
    asymptotic = expansion / torch.sqrt(2 * math.pi * large)
    if not scaled:
        asymptotic = asymptotic * torch.exp(large)
    result = torch.where(ax <= 30.0, series, asymptotic)
    if order == 1:
        result = torch.where(x < 0, -result, result)
    return torch.where(torch.isnan(x), x, result)


def _bessel_i(order: int, scaled: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    def bessel(x: torch.Tensor) -> torch.Tensor:
        return _bessel_i_wide(_wide(x), order, scaled).to(_result_dtype(x))

    return bessel


def special_decompositions() -> dict[Any, Callable[..., Any]]:
    """The table of this module's functions by aten op, with those of
    :mod:`~hloalias.frontend.bessel_functions` and
    :mod:`~hloalias.frontend.orthogonal_polynomials`."""
    return {
        **bessel_decompositions(),
        **polynomial_decompositions(),
        aten.lgamma.default: lgamma,
        aten.digamma.default: digamma,
        aten.polygamma.default: polygamma,
        aten.mvlgamma.default: mvlgamma,
        aten.special_zeta.default: zeta,
        aten.special_zeta.self_scalar: zeta_self_scalar,
        aten.special_zeta.other_scalar: zeta_other_scalar,
        aten.erfinv.default: erfinv,
        aten.erfc.default: erfc,
        aten.special_ndtri.default: ndtri,
        aten.special_erfcx.default: erfcx,
        aten.igamma.default: _igamma(upper=False),
        aten.igammac.default: _igamma(upper=True),
        aten.i0.default: _bessel_i(0, scaled=False),
        aten.special_i0e.default: _bessel_i(0, scaled=True),
        aten.special_i1.default: _bessel_i(1, scaled=False),
        aten.special_i1e.default: _bessel_i(1, scaled=True),
        aten.special_modified_bessel_i0.default: _bessel_i(0, scaled=False),
        aten.special_modified_bessel_i1.default: _bessel_i(1, scaled=False),
    }
