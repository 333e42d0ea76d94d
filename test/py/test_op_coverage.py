"""The lowerings behind the OpInfo refusals this list lost
(frontend/bessel_functions.py, orthogonal_polynomials.py,
special_functions.py, op_coverage.py), each compiled and compared with
eager on inputs wider than OpInfo's first sample: the switch points of
the series, the edges (0, infinities, NaN), several degrees."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

import hloalias
import opinfo_sweep
from hloalias.frontend import op_coverage

special = torch.special


def _matches_eager(f: Any, *inputs: torch.Tensor) -> None:
    expected = f(*[t.clone() for t in inputs])
    actual = hloalias.compile(f, [t.clone() for t in inputs])(*[t.clone() for t in inputs])
    problem = opinfo_sweep._compare(expected, actual, "output")
    assert problem is None, problem


_EDGES = [0.0, 1e-8, -1e-8, 0.5, -0.5, 5.99, 6.01, -7.99, -8.01, 8.99, 9.01, 11.99, 12.01, math.inf, -math.inf, math.nan]


def test_bessel_airy_and_erfcx_over_their_ranges() -> None:
    x = torch.cat([torch.linspace(-40.0, 40.0, 801), torch.tensor(_EDGES)])
    functions = (
        special.bessel_j0, special.bessel_j1, special.bessel_y0, special.bessel_y1,
        special.modified_bessel_k0, special.modified_bessel_k1,
        special.scaled_modified_bessel_k0, special.scaled_modified_bessel_k1,
        special.spherical_bessel_j0, special.airy_ai, special.erfcx, special.log_ndtr,
    )
    _matches_eager(lambda t: tuple(f(t) for f in functions), x)


def test_orthogonal_polynomials_of_tensor_and_number_degrees() -> None:
    x = torch.cat([torch.linspace(-1.5, 1.5, 31), torch.tensor([1.0, -1.0, 0.0, 0.999, -0.999])])
    x = x.repeat(8)
    n = torch.tensor([-1.0, 0.0, 1.0, 2.7, 5.0, 9.0, 17.0, 40.0]).repeat_interleave(36)
    functions = (
        special.chebyshev_polynomial_t, special.chebyshev_polynomial_u,
        special.chebyshev_polynomial_v, special.chebyshev_polynomial_w,
        special.shifted_chebyshev_polynomial_t, special.shifted_chebyshev_polynomial_u,
        special.shifted_chebyshev_polynomial_v, special.shifted_chebyshev_polynomial_w,
        special.hermite_polynomial_h, special.hermite_polynomial_he,
        special.laguerre_polynomial_l, special.legendre_polynomial_p,
    )
    _matches_eager(lambda t, d: tuple(f(t, d) for f in functions), x, n)
    _matches_eager(lambda t: tuple(f(t, 7) for f in functions), x[:36])


def test_incomplete_gamma() -> None:
    a = torch.tensor([0.1, 0.5, 1.0, 2.5, 10.0, 30.0, 150.0, 0.0, -1.0, 3.0, math.inf, math.nan])
    x = torch.tensor([0.05, 2.0, 0.3, 3.5, 9.0, 45.0, 140.0, 1.0, 1.0, 0.0, 2.0, 1.0])
    _matches_eager(lambda p, q: (torch.igamma(p, q), torch.igammac(p, q)), a, x)


def test_nextafter_and_frexp_bit_exact() -> None:
    x = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.75, -6.5, 3.4e38, 1.5e-38, math.inf, -math.inf, math.nan, 2.0])
    y = torch.tensor([1.0, -1.0, 0.0, -2.0, -1.0, -10.0, math.inf, 0.0, 0.0, 0.0, 1.0, 2.0])
    f = lambda a, b: (torch.nextafter(a, b), *torch.frexp(a))  # noqa: E731
    expected = f(x, y)
    actual = hloalias.compile(f, (x, y))(x, y)
    for got, want in zip(actual, expected):
        assert got.dtype == want.dtype and torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), (got, want)


def test_histograms_with_weights_and_density() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, generator=g)
    w = torch.rand(200, generator=g)
    _matches_eager(lambda t, v: tuple(torch.histogram(t, 7, range=(-1.0, 1.5), weight=v, density=True)), x, w)
    _matches_eager(lambda t: tuple(torch.histogram(t, 5)), torch.tensor([2.0, 2.0, 2.0]))
    points = torch.randn(50, 3, generator=g)
    _matches_eager(lambda t: tuple(torch.histogramdd(t, [2, 3, 4], density=True)), points)


def test_embedding_bag_with_padding_index() -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(10, 4, generator=g)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 4, 4])
    per_sample = torch.rand(8, generator=g)
    for mode in ("sum", "mean", "max"):
        sample_weights = per_sample if mode == "sum" else None
        _matches_eager(
            lambda w, p=sample_weights, m=mode: torch.nn.functional.embedding_bag(
                indices, w, offsets, mode=m, per_sample_weights=p, padding_idx=2
            ),
            weight,
        )


def test_segment_reduce() -> None:
    data = torch.tensor([[1.0, -2.0], [5.0, 0.5], [2.0, 2.0], [3.0, -1.0], [4.0, 7.0]])
    lengths = torch.tensor([2, 0, 3, 0])
    for reduce in ("sum", "mean", "max", "min", "prod"):
        _matches_eager(lambda d, r=reduce: torch.ops.aten.segment_reduce(d, r, lengths=lengths), data)
        _matches_eager(
            lambda d, r=reduce: torch.ops.aten.segment_reduce(d, r, offsets=torch.tensor([0, 2, 2, 5]), initial=1.5),
            data,
        )


def test_fractional_max_pool_with_given_samples() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 11, generator=g)
    samples = torch.rand(2, 3, 2, generator=g)
    _matches_eager(lambda t, s: torch.ops.aten.fractional_max_pool2d(t, [2, 3], [4, 5], s), x, samples)
    x3 = torch.randn(1, 2, 7, 8, 9, generator=g)
    samples3 = torch.rand(1, 2, 3, generator=g)
    _matches_eager(lambda t, s: torch.ops.aten.fractional_max_pool3d(t, [2, 3, 2], [3, 4, 5], s), x3, samples3)


def test_grid_sampler_3d_modes_and_paddings() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 6, generator=g)
    grid = torch.rand(2, 3, 4, 2, 3, generator=g) * 2.6 - 1.3
    for mode in ("bilinear", "nearest"):
        for padding in ("zeros", "border", "reflection"):
            for corners in (False, True):
                _matches_eager(
                    lambda t, p, m=mode, q=padding, a=corners: torch.nn.functional.grid_sample(
                        t, p, mode=m, padding_mode=q, align_corners=a
                    ),
                    x,
                    grid,
                )


def test_antialiased_bilinear_resizing() -> None:
    x = torch.randn(2, 3, 10, 20, generator=torch.Generator().manual_seed(0))
    for size in ((3, 3), (17, 41), (4, 30)):
        for corners in (False, True):
            _matches_eager(
                lambda t, s=size, a=corners: torch.nn.functional.interpolate(
                    t, size=s, mode="bilinear", align_corners=a, antialias=True
                ),
                x,
            )
    _matches_eager(
        lambda t: torch.nn.functional.interpolate(t, scale_factor=(0.5, 0.25), mode="bilinear", antialias=True), x
    )


def test_random_ops_draw_from_their_distributions() -> None:
    """XLA's THREE_FRY bits are not eager's (both follow torch's seed):
    compared by distribution (bounds far outside sampling noise at these
    sizes)."""
    mean, std = torch.full((20000,), 2.0), torch.full((20000,), 3.0)
    probabilities = torch.tensor([[0.1, 0.0, 0.6, 0.3]])

    def draws(m: torch.Tensor, s: torch.Tensor, p: torch.Tensor) -> Any:
        return (
            torch.normal(m, s),
            torch.normal(1.0, 0.5, (20000,)),
            torch.randint_like(m, 3, 9),
            torch.multinomial(p, 20000, replacement=True),
            torch.multinomial(p.expand(500, 4), 3),
        )

    normal, normal_numbers, integers, with_replacement, without = hloalias.compile(draws, (mean, std, probabilities))(
        mean, std, probabilities
    )
    assert abs(normal.mean().item() - 2.0) < 0.15 and abs(normal.std().item() - 3.0) < 0.15
    assert abs(normal_numbers.mean().item() - 1.0) < 0.03 and abs(normal_numbers.std().item() - 0.5) < 0.03
    assert integers.dtype == torch.float32 and integers.min() == 3 and integers.max() == 8
    assert torch.equal(integers, integers.floor())
    frequencies = torch.bincount(with_replacement.reshape(-1), minlength=4).float() / 20000
    assert torch.allclose(frequencies, probabilities[0], atol=0.02), frequencies
    assert without.shape == (500, 3) and bool((without != 1).all())  # probability 0: never drawn
    distinct = (without[:, 0] != without[:, 1]) & (without[:, 0] != without[:, 2]) & (without[:, 1] != without[:, 2])
    assert bool(distinct.all())


def test_linalg_error_checks_and_their_effect_tokens_are_dropped() -> None:
    class Inverse(torch.nn.Module):
        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return torch.linalg.inv(a)

    exported = torch.export.export(Inverse(), (torch.eye(3),)).run_decompositions()
    assert any(spec.kind.name == "TOKEN" for spec in exported.graph_signature.input_specs)
    cleaned = op_coverage.remove_error_checks(exported)
    assert not any(spec.kind.name == "TOKEN" for spec in cleaned.graph_signature.input_specs)
    assert not any(spec.kind.name == "TOKEN" for spec in cleaned.graph_signature.output_specs)
    targets = {node.target for node in cleaned.graph.nodes}
    assert torch.ops.higher_order.with_effects not in targets
    assert torch.ops.aten._linalg_check_errors.default not in targets
    assert torch.ops.aten.linalg_inv_ex.default in targets


def test_uint8_constants_lower() -> None:
    _matches_eager(
        lambda t: ((t > 0).to(torch.uint8) + torch.full((4,), 200, dtype=torch.uint8), torch.zeros((2, 0), dtype=torch.uint8)),
        torch.tensor([1.0, -1.0, 0.5, 0.0]),
    )


_LATE_REGISTERED_CHILD = """
import sys, warnings
import torch, hloalias
warnings.simplefilter("ignore")
MODULE = "torch.nn.modules.linear_cross_entropy"
g = torch.Generator().manual_seed(0)
x, w, target = torch.randn(6, 5, generator=g), torch.randn(7, 5, generator=g), torch.tensor([0, 3, 6, 2, 2, 1])
hloalias.compile(lambda a: a * 2 + 1, (x,))(x)
assert MODULE not in sys.modules, "a plain compile imported " + MODULE
options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=4)
f = lambda a, b: torch.nn.functional.linear_cross_entropy(a, b, target, reduction="sum", options=options)
got = hloalias.compile(f, (x, w))(x, w)  # the trace itself imports MODULE
assert MODULE in sys.modules
torch.testing.assert_close(got, f(x, w))  # XLA sums in its own order: not bitwise
print("OK")
"""


def test_an_op_registered_during_the_trace_is_decomposed() -> None:
    # torch registers the chunked linear_cross_entropy ops on the first
    # chunked call, inside the trace: the trace is taken again with their
    # entries (a fresh process, where nothing imported them before).
    done = subprocess.run([sys.executable, "-c", _LATE_REGISTERED_CHILD], env=dict(os.environ),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("OK")


def test_chunked_linear_cross_entropy_and_resize_as() -> None:
    g = torch.Generator().manual_seed(0)
    x, w, target = torch.randn(6, 5, generator=g), torch.randn(7, 5, generator=g), torch.tensor([0, 3, 6, 2, 2, 1])
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=4)
    for reduction in ("mean", "sum", "none"):
        _matches_eager(
            lambda a, b, r=reduction: torch.nn.functional.linear_cross_entropy(a, b, target, reduction=r, options=options),
            x,
            w,
        )
    _matches_eager(lambda a, b: a.clone().resize_as_(b) * 2, torch.randn(4, 6, generator=g), torch.randn(3, 5, generator=g))


@pytest.mark.parametrize("name", ["nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d"])
def test_random_pools_are_excluded_with_a_reason(name: str) -> None:
    assert "random" in opinfo_sweep.EXCLUDED[name]


def _bit_equal(f: Any, *inputs: torch.Tensor) -> None:
    """Compiled equals eager in dtype, shape, values and the sign of zero
    (NaN where eager has NaN)."""
    expected = f(*[t.clone() for t in inputs])
    actual = hloalias.compile(f, [t.clone() for t in inputs])(*[t.clone() for t in inputs])
    assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape)
    nan = expected.isnan() if expected.is_floating_point() else torch.zeros_like(expected, dtype=torch.bool)
    assert torch.equal(actual.isnan() if actual.is_floating_point() else nan, nan)
    assert torch.equal(actual[~nan], expected[~nan])
    if expected.is_floating_point():
        assert torch.equal(actual[~nan].signbit(), expected[~nan].signbit())


_DIVIDENDS = [-2.5, 2.5, -7.0, 1.0, 1.0, 5.0, -0.0, 1e30, math.inf, math.nan, 0.3, -1e-20]
_DIVISORS = [0.1, -0.75, 3.0, -0.0, 0.0, math.inf, 2.5, -2.5, 1e-30, 7.0, 0.1, 3.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fmod_is_exact(dtype: torch.dtype) -> None:
    """torch-mlir lowers fmod as ``x - trunc(x / y) * y``, which rounds:
    ``fmod(-2.5, 0.1)`` gave 1.4e-16 where eager gives -0.1 (silently).
    hloalias's decomposition is exact: signs of zero, infinities and NaN
    as eager's too; a number divisor (``fmod.Scalar``, which did not lower)
    and an integer tensor by a float number promote as eager does."""
    x, y = torch.tensor(_DIVIDENDS, dtype=dtype), torch.tensor(_DIVISORS, dtype=dtype)
    _bit_equal(torch.fmod, x, y)
    _bit_equal(lambda x: x.fmod(0.1), x)
    _bit_equal(lambda x: torch.fmod(x, -0.75), x)


def test_fmod_and_shifts_by_numbers_of_integer_tensors() -> None:
    """``fmod.Scalar`` and the scalar shifts (``i >> 1``, ``i << 3``,
    ``torch.bitwise_right_shift(i, 2)``) did not lower."""
    i = torch.arange(-12, 12)
    for tensor in (i, i.to(torch.int32), (i + 12).to(torch.uint8)):
        _bit_equal(lambda t: t.fmod(5), tensor)
        _bit_equal(lambda t: t.fmod(-3), tensor)
        _bit_equal(lambda t: t.fmod(1.5), tensor)  # the default float dtype, as eager
        _bit_equal(lambda t: t >> 1, tensor)
        _bit_equal(lambda t: t << 3, tensor)
        _bit_equal(lambda t: torch.bitwise_right_shift(t, 2), tensor)
        _bit_equal(lambda t: torch.bitwise_left_shift(t, 2), tensor)


def test_searchsorted_in_one_sequence() -> None:
    """``searchsorted`` in a 1-D sequence (bucketize by it) did not lower;
    both sides, int32 results."""
    boundaries = torch.tensor([-1.0, 0.0, 0.0, 1.0, 2.5])
    x = torch.tensor([[-2.0, -1.0, 0.0], [0.5, 1.0, 3.0]])
    _bit_equal(lambda t: torch.searchsorted(boundaries, t), x)
    _bit_equal(lambda t: torch.searchsorted(boundaries, t, right=True), x)
    _bit_equal(lambda t: torch.searchsorted(boundaries, t, side="right", out_int32=True), x)


@pytest.mark.parametrize(
    "resize",
    [
        lambda t: torch.nn.functional.interpolate(t, scale_factor=2, mode="nearest"),
        lambda t: torch.nn.functional.interpolate(t, scale_factor=(1.5, 0.7), mode="nearest"),
        lambda t: torch.nn.functional.interpolate(t, size=(9, 4)),
        torch.nn.Upsample(scale_factor=2),
    ],
    ids=["scale_2", "fractional_scales", "size", "Upsample"],
)
def test_nearest_upsampling_in_2d(resize: Any) -> None:
    """2-D nearest resizing (``F.interpolate``'s and ``nn.Upsample``'s
    default mode: UNet and FPN upsampling) did not lower: torch-mlir turned
    ``upsample_nearest2d.vec`` into an op its StableHLO lowering lacks."""
    images = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    _bit_equal(resize, images)
    _bit_equal(resize, images.to(memory_format=torch.channels_last))
