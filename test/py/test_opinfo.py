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
from typing import Any

import pytest

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
