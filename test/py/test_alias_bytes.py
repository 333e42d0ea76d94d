"""``alias-donated-buffers`` (issue: alias-donated-buffers): inferred and
explicit donors become XLA input/output aliases.  Byte figures are XLA's
own, read through PJRT, and exact; alias counts come from the report."""

from __future__ import annotations

import warnings

import pytest
import torch

import hloalias
from hloalias.passes import AliasReport

MIB = 2**20
PLAIN_PIPELINE = "builtin.module(canonicalize)"
LEARNING_RATE = 0.1
SIDE = 1024  # a SIDE x SIDE f32 tensor is 4 MiB


def sgd_step(w: torch.Tensor, g: torch.Tensor) -> tuple[()]:
    """In-place SGD on a weight handed in as an input."""
    w.sub_(LEARNING_RATE * g)
    return ()


class TwoWeightSGD(torch.nn.Module):
    """Two 4 MiB weights held as module state, updated in place from
    gradients given as inputs (buffers; parameters are covered by
    test_in_place_sgd_of_a_parameter_under_no_grad)."""

    w1: torch.Tensor
    w2: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("w1", torch.randn(SIDE, SIDE))
        self.register_buffer("w2", torch.randn(SIDE, SIDE))

    def forward(self, g1: torch.Tensor, g2: torch.Tensor) -> tuple[()]:
        self.w1.sub_(LEARNING_RATE * g1)
        self.w2.sub_(LEARNING_RATE * g2)
        return ()


def double(x: torch.Tensor) -> torch.Tensor:
    """A fresh result of x's type: the partner of an explicit donation."""
    return x * 2


def big() -> torch.Tensor:
    """A 4 MiB f32 tensor."""
    return torch.randn(SIDE, SIDE)


def small() -> torch.Tensor:
    """A 16-byte f32 tensor, for counting aliases."""
    return torch.randn(4)


# -- bytes ------------------------------------------------------------------------

def test_in_place_sgd_on_two_4mib_tensors_needs_8mib() -> None:
    """``w.sub_(lr * g)`` with w and g 4 MiB each: w's new value goes into
    w's buffer, so XLA needs the two arguments and nothing more."""
    exe = hloalias.compile(sgd_step, (big(), big()))
    assert exe.memory_stats == {
        "argument_bytes": 8 * MIB,
        "output_bytes": 4 * MIB,
        "alias_bytes": 4 * MIB,
        "temp_bytes": 0,
        "total_bytes": 8 * MIB,
    }
    assert [(a["argument"], a["origin"]) for a in exe.aliases] == [("w", "inferred")]


def test_in_place_sgd_plain_pipeline_needs_12mib() -> None:
    """Plain torch-mlir -> XLA writes w's new value to a third buffer."""
    exe = hloalias.compile(sgd_step, (big(), big()), pipeline=PLAIN_PIPELINE)
    assert exe.memory_stats["alias_bytes"] == 0
    assert exe.memory_stats["total_bytes"] == 12 * MIB


def test_in_place_sgd_of_two_state_weights() -> None:
    """Two 4 MiB weights and their two gradients: 16 MiB of arguments, both
    new weights written in place.  The 16 extra output bytes are the
    pointer table (2 x 8) of XLA's 2-result tuple, measured."""
    exe = hloalias.compile(TwoWeightSGD(), (big(), big()))
    stats = exe.memory_stats
    assert stats["argument_bytes"] == 16 * MIB
    assert stats["alias_bytes"] == 8 * MIB
    assert stats["output_bytes"] == 8 * MIB + 2 * 8
    assert stats["total_bytes"] == 16 * MIB + 16
    assert [(a["argument"], a["origin"]) for a in exe.aliases] == [("w1", "inferred"), ("w2", "inferred")]

    plain = hloalias.compile(TwoWeightSGD(), (big(), big()), pipeline=PLAIN_PIPELINE)
    assert plain.memory_stats["total_bytes"] == 24 * MIB + 16


def test_in_place_sgd_of_a_parameter_under_no_grad() -> None:
    """SGD as people write it: ``with torch.no_grad(): self.w.sub_(lr * g)``
    on an ``nn.Parameter``; the executable's state must follow eager."""

    class ParameterSGD(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, g: torch.Tensor) -> tuple[()]:
            with torch.no_grad():
                self.w.sub_(LEARNING_RATE * g)
            return ()

    module = ParameterSGD()
    g = torch.randn(4, 4)
    exe = hloalias.compile(module, (g,))
    assert [(a["argument"], a["origin"]) for a in exe.aliases] == [("w", "inferred")]
    expected = module.w.detach() - LEARNING_RATE * g
    exe(g)
    torch.testing.assert_close(exe.state_dict()["w"], expected)


def test_in_place_update_returning_nothing() -> None:
    """An in-place step written the natural way, with no return statement."""

    def sgd_without_return(w: torch.Tensor, g: torch.Tensor) -> None:
        w.sub_(LEARNING_RATE * g)

    w, g = torch.randn(4, 4), torch.randn(4, 4)
    expected = w - LEARNING_RATE * g
    exe = hloalias.compile(sgd_without_return, (w.clone(), g))
    assert exe(w, g) is None
    torch.testing.assert_close(w, expected)


def test_explicitly_donated_input_holds_the_result() -> None:
    """``y = x * 2`` with x donated: 4 MiB; plain torch-mlir: 8 MiB."""
    x = big()
    donated = hloalias.compile(double, (x,), donate=(0,))
    assert donated.memory_stats["total_bytes"] == 4 * MIB
    assert donated.memory_stats["alias_bytes"] == 4 * MIB
    assert donated.aliases == [
        {"argument": "x", "arg_index": 0, "result": 0, "origin": "explicit", "bytes": 4 * MIB}
    ]
    plain = hloalias.compile(double, (x,), pipeline=PLAIN_PIPELINE)
    assert plain.memory_stats["total_bytes"] == 8 * MIB
    assert plain.memory_stats["alias_bytes"] == 0


# -- alias counts and origins ---------------------------------------------------------

def two_in_place(t1: torch.Tensor, t2: torch.Tensor) -> torch.Tensor:
    """Two inputs mutated in place after being read."""
    t3 = t1 + t2
    t1 *= 2
    t2 += 2
    return t3


def one_in_place(t0: torch.Tensor, t1: torch.Tensor) -> torch.Tensor:
    """One input mutated in place, one read only."""
    t2 = t0 + t1
    t1 += 2
    return t2


def only_in_place(t0: torch.Tensor) -> tuple[()]:
    """The only result is the input's new value."""
    t0 += 2
    return ()


def _alias_summary(exe: hloalias.Executable) -> list[tuple[str, str]]:
    return [(a["argument"], a["origin"]) for a in exe.aliases]


def _report(exe: hloalias.Executable) -> AliasReport:
    """The executable's alias report; the default pipeline always has one."""
    assert exe.alias_report is not None
    return exe.alias_report


def test_two_mutated_inputs_give_two_inferred_aliases() -> None:
    """``t3 = t1 + t2; t1 *= 2; t2 += 2``: both mutated inputs alias their
    new values; the fresh t3 has no donor."""
    exe = hloalias.compile(two_in_place, (small(), small()))
    assert _alias_summary(exe) == [("t1", "inferred"), ("t2", "inferred")]
    assert _report(exe).unused == ()
    assert _report(exe).bytes_saved == 2 * 16
    assert exe.memory_stats["alias_bytes"] == 2 * 16


def test_inferred_and_explicit_aliases_combine() -> None:
    """``t2 = t0 + t1; t1 += 2`` with t0 donated: t1 aliases its new value
    (inferred), t0 holds the fresh t2 (explicit)."""
    exe = hloalias.compile(one_in_place, (small(), small()), donate=("t0",))
    assert sorted(_alias_summary(exe)) == [("t0", "explicit"), ("t1", "inferred")]
    assert exe.memory_stats["alias_bytes"] == 2 * 16
    results = {a["argument"]: a["result"] for a in exe.aliases}
    assert results["t0"] != results["t1"]


def test_donating_a_mutated_input_counts_once_as_both() -> None:
    """``t0 += 2`` with t0 donated: one alias, origin ``both``, no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        exe = hloalias.compile(only_in_place, (small(),), donate=(0,))
    assert _alias_summary(exe) == [("t0", "both")]
    assert _report(exe).bytes_saved == 16
    assert "(both)" in _report(exe).to_text()


def test_unusable_explicit_donation_warns() -> None:
    """A donated input with no result of its type cannot be aliased: a
    UserWarning names it and the report says why."""

    def reduce_rows(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x * y).sum(0)

    with pytest.warns(UserWarning, match="Some donated buffers were not usable") as caught:
        exe = hloalias.compile(reduce_rows, (torch.randn(4, 4), torch.randn(4, 4)), donate=("y",))
    assert any("'y'" in str(w.message) for w in caught)
    assert exe.aliases == []
    (unused,) = _report(exe).unused
    assert (unused.arg_name, unused.origin) == ("y", "explicit")
    # No 4x4 result to alias: y stays a jax.buffer_donor XLA may use.
    assert "no free result" in unused.reason and unused.kept_as_donor


# -- the executable cache -----------------------------------------------------------------

def test_same_aliasing_shares_a_cache_key(fresh_cache: None) -> None:
    """Configurations that end in the same module share one XLA compile:
    donating x with explicit donation switched off, or with user inputs
    excluded from donation, is not donating at all."""
    x = small()
    not_donated = hloalias.compile(double, (x,))
    assert not not_donated.cache_hit
    explicit_off = hloalias.compile(
        double, (x,), donate=(0,),
        pipeline="builtin.module(eliminate-view-results, alias-donated-buffers{explicit=false})",
    )
    with pytest.warns(UserWarning, match="Some donated buffers were not usable"):
        excluded = hloalias.compile(
            double, (x,), donate=(0,),
            pipeline="builtin.module(eliminate-view-results, "
            "alias-donated-buffers{exclude-kinds=user_input})",
        )
    assert not_donated.cache_key == explicit_off.cache_key == excluded.cache_key
    assert explicit_off.cache_hit and excluded.cache_hit
    assert explicit_off.memory_stats == not_donated.memory_stats
    assert (hloalias.cache_stats().misses, hloalias.cache_stats().hits) == (1, 2)


def test_different_aliasing_gives_different_cache_keys(fresh_cache: None) -> None:
    """Donating x changes the module's aliasing, hence its key: no hit."""
    x = small()
    not_donated = hloalias.compile(double, (x,))
    donated = hloalias.compile(double, (x,), donate=(0,))
    assert not_donated.cache_key != donated.cache_key
    assert not donated.cache_hit
    assert (hloalias.cache_stats().misses, hloalias.cache_stats().hits) == (2, 0)
    assert donated.memory_stats["alias_bytes"] == 16
    assert not_donated.memory_stats["alias_bytes"] == 0


def test_second_compile_is_a_cache_hit(fresh_cache: None) -> None:
    """Compiling the same program twice compiles once; both run correctly."""
    first = hloalias.compile(two_in_place, (small(), small()))
    second = hloalias.compile(two_in_place, (small(), small()))
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert first.cache_key == second.cache_key
    assert (hloalias.cache_stats().misses, hloalias.cache_stats().hits) == (1, 1)
    for exe in (first, second):
        t1, t2 = small(), small()
        eager_t1, eager_t2 = t1.clone(), t2.clone()
        expected = two_in_place(eager_t1, eager_t2)
        torch.testing.assert_close(exe(t1, t2), expected)
        torch.testing.assert_close((t1, t2), (eager_t1, eager_t2))
