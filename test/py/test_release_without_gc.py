"""A dropped executable is freed by reference counting alone: ``del exe``
with the cyclic GC off frees the ``Executable`` and the device buffers
only it holds (no reference cycle through its native call path, plan or
hooks), so host memory and device memory do not wait for a GC.  Checked
for a function, a module with state, a training step and ``hloalias.jit``,
on the native call path and the Python one (``HLOALIAS_NATIVE``, read when
an executable is made).  The ``torch.compile`` backend's graphs are held
by torch's own structures (AOTAutograd's ``CompiledFunction`` class, dynamo's
caches) until those go: not checked here."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import pytest
import torch

import hloalias


@pytest.fixture(params=["1", "0"], ids=["native", "python"])
def call_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("HLOALIAS_NATIVE", request.param)
    # Warm up what a first use loads (a lazily imported module may keep
    # the frames of the import in a cached traceback): not this test's.
    torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    gc.collect()
    yield request.param


class _Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return self.lin(x) + self.count


def _freed_without_gc(make: Callable[[], tuple[Any, list[Any]]]) -> None:
    """``make()`` returns what the caller would hold and the objects that
    must die with it; with the GC off, dropping the holder frees them and
    every device array made meanwhile."""
    gc.collect()
    arrays = len(jax.live_arrays())
    gc.disable()
    try:
        holder, objects = make()
        references = [weakref.ref(obj) for obj in objects]
        del objects
        assert len(jax.live_arrays()) >= arrays
        gc.collect()  # the compile's own garbage (the GC was off meanwhile)
        gc.set_debug(gc.DEBUG_SAVEALL)
        del holder
        alive = [type(ref()).__name__ for ref in references if ref() is not None]
        assert alive == [], f"kept alive by a reference cycle: {alive}"
        assert len(jax.live_arrays()) == arrays
        # Nor a cycle left among what they held (the dispatch with its
        # loaded program, jaxlib's fast-path function).
        gc.collect()
        cyclic = sorted({type(obj).__qualname__ for obj in gc.garbage})
        assert cyclic == [], f"freed only by the cyclic GC: {cyclic}"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_a_function_executable(call_path: str) -> None:
    def make() -> tuple[Any, list[Any]]:
        x = torch.ones(4)
        exe = hloalias.compile(lambda v: v * 2 + 1, (x,))
        torch.testing.assert_close(exe(x), torch.full((4,), 3.0))
        assert (exe._lane is not None) == (call_path == "1")
        return exe, [exe]

    _freed_without_gc(make)


def test_a_module_state_executable_and_its_state_buffers(call_path: str) -> None:
    def make() -> tuple[Any, list[Any]]:
        model = _Counter()
        x = torch.ones(2, 4)
        exe = hloalias.compile(model, (x,))
        exe(x)
        exe(x)
        assert (exe._lane is not None) == (call_path == "1")
        return (exe, model), [exe, model]

    _freed_without_gc(make)


def test_a_training_step(call_path: str) -> None:
    def make() -> tuple[Any, list[Any]]:
        model = _Counter()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.ones(2, 4)

        def train(batch: torch.Tensor) -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(batch).sum()
            loss.backward()
            optimizer.step()
            return loss

        step = hloalias.compile_training_step(train, model, optimizer, (x,))
        step(x)
        step(x)
        return (step, model, optimizer, train), [step, step.executable, model]

    _freed_without_gc(make)


def test_a_jit_and_its_executables(call_path: str) -> None:
    def make() -> tuple[Any, list[Any]]:
        model = _Counter()
        jitted = hloalias.jit(model)
        for rows in (2, 3, 2):
            jitted(torch.ones(rows, 4))
        assert len(jitted.executables) == 2
        return (jitted, model), [jitted, *jitted.executables, model]

    _freed_without_gc(make)
