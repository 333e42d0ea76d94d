"""What a compile leaves for the garbage collector: MLIR objects (an op,
so its module and context) must not sit in reference cycles of hloalias's
own making, where only a collection frees them; they die when their last
reference goes.  Counted with the collector off (``gc.DEBUG_SAVEALL``
keeps what a collection finds), never by memory size."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import hloalias
from hloalias.passes import EliminateViewResults


@pytest.fixture(autouse=True)
def _collector_as_found() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.set_debug(0)
    gc.garbage.clear()
    if enabled:
        gc.enable()


def _cyclic_garbage() -> list[Any]:
    """What a collection finds unreachable now (the collector is off)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    found = list(gc.garbage)
    gc.set_debug(0)
    gc.garbage.clear()
    return found


def _views(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x, x[0:8].view(2, 4)


def _ours(objects: list[Any]) -> list[str]:
    names = []
    for obj in objects:
        module = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
        if isinstance(module, str) and (module.startswith("hloalias.passes") or module.startswith("torch_mlir")):
            names.append(f"{module}.{getattr(obj, '__qualname__', type(obj).__qualname__)}")
    return names


def test_eliminating_view_results_leaves_no_cycle_holding_the_module() -> None:
    program = hloalias.import_torch(_views, (torch.randn(16),))
    module: Any = program.torch_mlir_module
    gc.collect()
    gc.disable()
    report = EliminateViewResults().apply(module)
    assert report.removed, "the pass planned removals (its planning ran)"
    del report
    assert _ours(_cyclic_garbage()) == []


def _compile_new_length(length: int) -> None:
    x = torch.randn(length)
    exe = hloalias.compile(lambda t: t * 2 + 1, (x,))
    torch.testing.assert_close(exe(x), x * 2 + 1)


def test_torchs_fake_tensor_cache_is_emptied_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setenv("HLOALIAS_CACHE", "0")  # every compile traces
    monkeypatch.setenv("HLOALIAS_FAKE_CACHE_ENTRIES", "0")  # unbounded: torch's own behaviour
    FakeTensorMode.cache_clear()
    _compile_new_length(7)
    filled = len(FakeTensorMode.cache)
    assert filled > 0, "the trace cached fake dispatches"
    monkeypatch.setenv("HLOALIAS_FAKE_CACHE_ENTRIES", str(filled))
    _compile_new_length(9)  # new shapes: new entries, past the bound
    assert len(FakeTensorMode.cache) == 0
    monkeypatch.setenv("HLOALIAS_FAKE_CACHE_ENTRIES", str(10 * filled))
    _compile_new_length(11)
    assert 0 < len(FakeTensorMode.cache) <= 10 * filled
