"""The garbage collector around traces (frontend/tracing_lock.py): objects
that existed before a trace are frozen while it runs and unfrozen after,
so a full collection during the trace scans only what the trace made; a
process that turned the collector off or froze objects itself keeps its
own arrangement."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
import torch

import hloalias
from hloalias.frontend import tracing_lock
from interrupt_points import sweep


@pytest.fixture(autouse=True)
def _collector_as_found(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HLOALIAS_CACHE", "0")  # every compile traces
    hloalias.clear_cache()
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def _compile_recording_freeze_count() -> list[int]:
    seen: list[int] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        seen.append(gc.get_freeze_count())  # runs while torch traces it
        return x * 3 + 1

    x = torch.randn(5)
    exe = hloalias.compile(f, (x,))
    torch.testing.assert_close(exe(x), x * 3 + 1)
    return seen


def test_objects_before_a_trace_are_frozen_during_it_and_unfrozen_after() -> None:
    assert gc.get_freeze_count() == 0
    seen = _compile_recording_freeze_count()
    assert seen and all(count > 0 for count in seen)
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()


def test_training_capture_freezes_during_the_trace_only() -> None:
    seen: list[int] = []
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        seen.append(gc.get_freeze_count())
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    hloalias.compile_training_step(step, model, optimizer, (torch.randn(3, 4),))
    assert seen and all(count > 0 for count in seen)
    assert gc.get_freeze_count() == 0


def test_a_disabled_collector_is_left_disabled_and_nothing_frozen() -> None:
    gc.disable()
    seen = _compile_recording_freeze_count()
    assert seen and all(count == 0 for count in seen)
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_objects_the_process_froze_itself_stay_frozen() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    seen = _compile_recording_freeze_count()
    # Frozen objects that die leave the count; nothing is added or unfrozen.
    assert seen and all(0 < count <= frozen for count in seen)
    assert 0 < gc.get_freeze_count() <= frozen


# -- cyclic garbage over repeated traces ------------------------------------
#
# Before these, every compile's cyclic garbage (a retired MLIR context among
# it) was young when the next trace froze it, re-entered the oldest
# generation uncounted at the unfreeze, and a full collection that ran in a
# trace skipped it: over 2,000 compiles no full collection ever reached it
# (bench/RESULTS-runtime.md, "Host memory over many compiles").


class _Cycle:
    """Cyclic garbage the collector alone can free; a weakref tells."""

    def __init__(self) -> None:
        self.me = self


def _cyclic_garbage() -> "weakref.ref[_Cycle]":
    cycle = _Cycle()
    ref = weakref.ref(cycle)
    del cycle
    return ref


def _old_cyclic_garbage() -> "weakref.ref[_Cycle]":
    """Cyclic garbage in the oldest generation (a survivor of the middle
    one): only a full collection frees it."""
    keep = _Cycle()
    ref = weakref.ref(keep)
    gc.collect(1)  # held: it survives into the oldest generation
    del keep
    return ref


def test_young_cyclic_garbage_is_collected_when_a_trace_starts() -> None:
    gc.collect()
    ref = _cyclic_garbage()  # young: made after the last collection
    alive_in_trace: list[bool] = []
    with tracing_lock.tracing():
        alive_in_trace.append(ref() is not None)
        assert gc.get_freeze_count() > 0
    assert alive_in_trace == [False]


def test_no_full_collection_runs_frozen_and_one_runs_after_the_trace() -> None:
    with tracing_lock.tracing():  # the tracing libraries load (and collect) outside the test
        pass
    full: list[bool] = []  # per full collection: whether it ran in the trace
    inside = [False]

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(inside[0])

    gc.collect()
    # Enough surviving objects, made and promoted in the trace, that the
    # interpreter calls for a full collection (more than a quarter of those
    # that survived the last one).
    count = len(gc.get_objects())
    ref = _old_cyclic_garbage()
    thresholds = gc.get_threshold()
    gc.callbacks.append(record)
    try:
        with tracing_lock.tracing():
            inside[0] = True
            kept = [[] for _ in range(count)]
            inside[0] = False
        assert gc.get_threshold() == thresholds
        assert full == [], "a full collection ran while objects were frozen"
        del kept
        for _ in range(200):  # the full collection the thresholds call for runs now
            if full:
                break
            churn = [[[]] for _ in range(10_000)]
            del churn
    finally:
        gc.callbacks.remove(record)
    assert full == [False]
    assert ref() is None


def test_an_interrupt_anywhere_in_tracing_leaves_nothing_frozen_by_the_next_trace() -> None:
    thresholds = gc.get_threshold()

    def prepare() -> None:
        return None

    def run(_: None) -> None:
        gc.enable()  # sweep turns it off; tracing() freezes only when it is on
        with tracing_lock.tracing():
            with tracing_lock.tracing():
                pass

    def check(_: None, where: object) -> None:
        gc.enable()
        with tracing_lock.tracing():  # finishes a clean-up an interrupt cut short
            assert gc.get_freeze_count() > 0, where
        assert gc.get_freeze_count() == 0, where
        assert gc.get_threshold() == thresholds, where
        assert tracing_lock._depth == 0 and not tracing_lock._frozen, where
        assert tracing_lock._thresholds is None, where

    points = sweep(prepare, run, check, {tracing_lock.__file__})
    names = {name for name, _, _ in points}
    assert {"_freeze", "_unfreeze", "tracing"} <= names, sorted(names)
