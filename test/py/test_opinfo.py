"""torch's OpInfo database as hloalias's conformance suite.

Every entry of ``op_db`` runs its first float32 CPU sample compiled and
eager (``opinfo_sweep.py`` says how and what is compared).  The outcome
must be what ``opinfo_expected_refusals.txt`` says:

- an op listed there must be refused with the listed reason class, and an
  op listed there that now compiles and matches fails the test too: take
  it off the list, which may only shrink;
- every other op must match eager (or be an excluded random op whose
  dtypes and shapes match, or have no float32 sample);
- a wrong value, or an error that is no :class:`hloalias.HloaliasError`,
  fails whatever the list says.  (A process crash fails the run.)"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch

import hloalias
import opinfo_sweep

EXPECTED_PATH = os.path.join(os.path.dirname(__file__), "opinfo_expected_refusals.txt")


def read_expected(path: str = EXPECTED_PATH) -> dict[str, str]:
    """``name -> reason class`` from the list (``name<space>reason`` lines,
    ``#`` comments)."""
    expected: dict[str, str] = {}
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, reason = line.partition(" ")
            assert reason.strip(), f"{path}:{number}: '{line}' has no reason class"
            assert name not in expected, f"{path}:{number}: '{name}' listed twice"
            expected[name] = reason.strip()
    return expected


EXPECTED = read_expected()
OPS = {opinfo_sweep.case_name(op): op for op in opinfo_sweep.all_ops()}


def test_expected_refusals_name_existing_ops() -> None:
    stale = sorted(set(EXPECTED) - set(OPS))
    assert not stale, f"opinfo_expected_refusals.txt lists ops op_db does not have: {stale}"


def check(outcome: opinfo_sweep.Outcome, expected: str | None) -> None:
    """Fail unless ``outcome`` is what the list (``expected``: the listed
    reason class, None when unlisted) allows."""
    name = outcome.name
    if outcome.status in ("wrong", "error"):
        pytest.fail(f"{name}: {outcome.status} ({outcome.reason}): {outcome.detail}")
    if outcome.status == "refused":
        if expected is None:
            pytest.fail(f"{name}: newly refused ({outcome.reason}): {outcome.detail}")
        assert outcome.reason == expected, (
            f"{name}: refused as {outcome.reason}, the list says {expected}: {outcome.detail}"
        )
        return
    assert expected is None, (
        f"{name}: {outcome.status} now, listed as refused ({expected}): take it off "
        "opinfo_expected_refusals.txt"
    )


@pytest.mark.parametrize("name", sorted(OPS))
def test_opinfo_float32(name: str) -> None:
    check(opinfo_sweep.run_case(OPS[name]), EXPECTED.get(name))


def _outcome(status: str, reason: str = "") -> opinfo_sweep.Outcome:
    return opinfo_sweep.Outcome("op", "torch", status, reason, "detail", 0.0)


@pytest.mark.parametrize(
    "outcome, expected, fails",
    [
        (_outcome("pass"), None, False),
        (_outcome("excluded"), None, False),
        (_outcome("untestable", "no-sample"), None, False),
        (_outcome("refused", "lowering:aten.x"), "lowering:aten.x", False),
        (_outcome("refused", "lowering:aten.x"), None, True),  # new refusal
        (_outcome("refused", "lowering:aten.y"), "lowering:aten.x", True),  # reason changed
        (_outcome("pass"), "lowering:aten.x", True),  # listed but passes: the list must shrink
        (_outcome("wrong"), None, True),
        (_outcome("wrong"), "lowering:aten.x", True),
        (_outcome("error", "RuntimeError"), None, True),
    ],
)
def test_check_enforces_the_list(outcome: opinfo_sweep.Outcome, expected: str | None, fails: bool) -> None:
    failed: Any = None
    try:
        check(outcome, expected)
    except (AssertionError, pytest.fail.Exception) as error:
        failed = error
    assert (failed is not None) == fails, failed


# --- the lowerings the sweep found missing or wrong, one program each ----------------------


def _matches_eager(f: Any, *inputs: torch.Tensor) -> None:
    expected = f(*[t.clone() for t in inputs])
    actual = hloalias.compile(f, [t.clone() for t in inputs])(*[t.clone() for t in inputs])
    assert opinfo_sweep._compare(expected, actual, "output") is None, (expected, actual)


def test_logsumexp_of_a_scalar_with_keepdim_in_a_child_process() -> None:
    """torch-mlir's StableHLO lowering of a keepdim reduction of a 0-d
    tensor segfaulted, taking the process along: run where a crash is
    seen as a crash."""
    program = (
        "import torch, hloalias\n"
        "x = torch.tensor(1.5)\n"
        "f = lambda x: (torch.logsumexp(x, (0,), keepdim=True), torch.sum(x, 0, keepdim=True),\n"
        "               torch.amax(x, (0,), True), torch.mean(x, 0, True), torch.std(x, 0, keepdim=True),\n"
        "               torch.linalg.vector_norm(x, 2.0, [], True))\n"
        "got, want = hloalias.compile(f, (x,))(x), f(x)\n"
        "assert all(g.shape == w.shape and torch.allclose(g, w, equal_nan=True) for g, w in zip(got, want)), (got, want)\n"
        "print('same')\n"
    )
    child = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600)
    assert child.returncode == 0 and "same" in child.stdout, (child.returncode, child.stderr[-2000:])


def test_logcumsumexp_keeps_small_terms_beside_large_ones() -> None:
    x = torch.tensor([[0.0, -100.0, 50.0, -1000.0, 80.0, float("-inf"), 3.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]])
    _matches_eager(lambda t: torch.logcumsumexp(t, 1), x)
    _matches_eager(lambda t: torch.logcumsumexp(t, 0), x)


def test_cummax_cummin_nan_and_ties_as_eager() -> None:
    x = torch.tensor([1.0, 3.0, 3.0, float("nan"), 2.0, float("nan"), 5.0, -1.0])
    _matches_eager(lambda t: torch.cummax(t, 0), x)
    _matches_eager(lambda t: torch.cummin(t, 0), x)
    _matches_eager(lambda t: torch.cummax(t, 1), torch.tensor([[2.0, 2.0, 1.0, 4.0], [0.0, -1.0, 0.0, 0.0]]))


def test_sort_based_reductions() -> None:
    x = torch.tensor([[3.0, 1.0, 2.0, 5.0, 4.0], [1.0, float("nan"), 0.0, 2.0, 7.0]])
    _matches_eager(lambda t: torch.median(t, 1), x)
    _matches_eager(lambda t: torch.nanmedian(t, 1), x)
    _matches_eager(lambda t: torch.median(t[0]), x)
    _matches_eager(lambda t: torch.kthvalue(t[0], 2), x)
    _matches_eager(lambda t: torch.mode(t, 1), torch.tensor([[1.0, 3.0, 3.0, 2.0, 1.0, 3.0], [2.0, 1.0, 1.0, 2.0, 0.0, 5.0]]))


def test_scatter_and_index_reduce() -> None:
    base = torch.arange(12.0).reshape(4, 3)
    index = torch.tensor([[0, 1, 0], [3, 3, 1], [0, 2, 2]])
    src = torch.tensor([[2.0, -1.0, 4.0], [0.5, 3.0, -2.0], [7.0, 1.0, 1.5]])
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            _matches_eager(lambda b, i, s: b.scatter_reduce(0, i, s, reduce, include_self=include_self), base, index, src)
    _matches_eager(lambda b, s: b.index_reduce(0, torch.tensor([0, 3, 0]), s, "amax"), base, src)


def test_views_pools_and_elementwise() -> None:
    x = torch.randn(2, 3, 9, 9, generator=torch.Generator().manual_seed(0))
    _matches_eager(lambda t: torch.diagonal(t, 1, 2, 3), x)
    _matches_eager(lambda t, s: torch.diagonal_scatter(t, s, -2, 2, 3), x, torch.ones(2, 3, 7))
    _matches_eager(lambda t: t.unfold(2, 3, 2), x)
    _matches_eager(lambda t: torch.nn.functional.avg_pool2d(t, 3, 2, 1, ceil_mode=True, divisor_override=2), x)
    _matches_eager(lambda t: torch.nn.functional.avg_pool2d(t, 3, 2, 1, ceil_mode=True), x)
    _matches_eager(lambda t: torch.nn.functional.max_pool2d(t, 3, 2, ceil_mode=True, return_indices=True), x)
    _matches_eager(lambda t: torch.nn.functional.adaptive_avg_pool1d(t[0], 4), x)
    _matches_eager(lambda t: torch.cdist(t[0, 0], t[1, 0]), x)
    _matches_eager(lambda a, b: torch.isclose(a, b, rtol=0.1, atol=0.5), x, x + 0.3)
    _matches_eager(lambda t: torch.cumprod(t, 3), x)
    _matches_eager(lambda t: torch.argmax(t), x)
    _matches_eager(lambda t: torch.histc(t, bins=7, min=-1.0, max=2.0), x)
    _matches_eager(lambda t: torch.histc(t, bins=5), x)
    _matches_eager(lambda t: torch.nn.functional.pad(t, (1, 2, 2, 0), mode="circular"), x)
    _matches_eager(lambda t: torch.nn.functional.pad(t[0], (3, 1), mode="circular"), x)
    _matches_eager(lambda t: torch.nn.functional.pdist(t[0, 0]), x)
    _matches_eager(lambda t: torch.nn.functional.adaptive_avg_pool3d(t, (2, 4, 3)), x)
    _matches_eager(lambda t: torch.empty_like(t).fill_(2.0) + t, x)


def test_special_functions() -> None:
    x = torch.tensor([-8.4784, -2.5, -0.5735, 0.1, 0.5, 1.0, 2.0, 3.6116, 12.0, 40.0])
    for f in (torch.lgamma, torch.digamma, torch.special.i0e, torch.special.i1, torch.i0):
        _matches_eager(f, x)
    for n in (1, 2, 4):
        _matches_eager(lambda t: torch.polygamma(n, t), x)
    _matches_eager(torch.erfinv, torch.tensor([-0.999, -0.5, 0.0, 0.3, 0.9, 0.99999]))


def test_sparse_input_is_refused_by_name() -> None:
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(hloalias.TorchImportError, match="input 0.*sparse"):
        hloalias.compile(lambda t: t * 2, (sparse,))
    with pytest.raises(hloalias.TorchImportError, match="output 0.*sparse"):
        hloalias.compile(lambda t: t.to_sparse(), (torch.eye(3),))
