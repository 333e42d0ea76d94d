"""The garbage collector around traces (frontend/tracing_lock.py): objects
that existed before a trace are frozen while it runs and unfrozen after,
so a full collection during the trace scans only what the trace made; a
process that turned the collector off or froze objects itself keeps its
own arrangement."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

import hloalias


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
