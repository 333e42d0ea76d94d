"""The native call path (runtime/_lane.cpp, ``Executable._lane``): it runs
the calls of the common kind, its results are the Python path's, and every
call it does not take falls back to that path before anything changes.

Every other runtime test drives the lane too (it is on by default);
``scripts/test.sh`` also runs the runtime suites with ``HLOALIAS_NATIVE=0``
so the Python path stays covered on its own."""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hloalias
from hloalias.errors import ExecutionError
from hloalias.runtime import executable as executable_module, lane as lane_module, ownership

NATIVE = executable_module._lane is not None

pytestmark = pytest.mark.skipif(
    not NATIVE and os.environ.get("HLOALIAS_REQUIRE_NATIVE") != "1", reason="the native call path is not built here"
)


def test_the_native_call_path_is_built_where_required() -> None:
    # scripts/venv.sh requires it (HLOALIAS_REQUIRE_NATIVE=1): CI must not
    # silently measure and test only the Python path, nor a stale build.
    assert NATIVE
    assert lane_module._build_refusal() is None


def kv_update(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    cache[:, 2].copy_(new)
    return new * 2


def counts(exe: hloalias.Executable) -> dict[str, int]:
    assert exe._lane is not None, "this executable has no native lane"
    result: dict[str, int] = exe._lane.counts
    return result


def python_path(monkeypatch: pytest.MonkeyPatch, *args: Any, **kwargs: Any) -> hloalias.Executable:
    """``hloalias.compile`` with the native path off for the executable."""
    with monkeypatch.context() as patch:
        patch.setenv("HLOALIAS_NATIVE", "0")
        exe = hloalias.compile(*args, **kwargs)
    assert exe._lane is None
    return exe


def test_kv_calls_run_natively_in_place_and_match_eager_and_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    example = (torch.zeros(3, 5, 4), torch.zeros(3, 4))
    native = hloalias.compile(kv_update, example)
    python = python_path(monkeypatch, kv_update, example)
    caches = [torch.zeros(3, 5, 4) for _ in range(3)]
    native(caches[0], torch.zeros(3, 4))  # the first call re-seats the cache onto a runtime buffer
    python(caches[1], torch.zeros(3, 4))
    address = caches[0].data_ptr()
    before = counts(native)
    for step in range(4):
        new = torch.randn(3, 4)
        eager_out = kv_update(caches[2], new)
        native_out = native(caches[0], new)
        python_out = python(caches[1], new)
        assert torch.equal(native_out, eager_out) and torch.equal(python_out, eager_out)
        assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[2])
    assert counts(native)["calls"] == before["calls"] + 4
    assert counts(native)["fallbacks"] == before["fallbacks"]
    assert caches[0].data_ptr() == address  # XLA wrote the cache in place every call
    assert native.host_copies == {} and python.host_copies == {}


class StateKV(torch.nn.Module):
    cache: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(3, 5, 4))

    def forward(self, new: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.cache.index_copy_(1, position, new.unsqueeze(1))
        return new.sum(0), {"total": self.cache.sum(), "first": self.cache[:, 0] + 0}


def test_state_updates_commit_natively_with_nested_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    eager, module, other = StateKV(), StateKV(), StateKV()
    example = (torch.zeros(3, 4), torch.tensor([0]))
    native = hloalias.compile(module, example)
    python = python_path(monkeypatch, other, example)
    for step in range(5):
        new, position = torch.randn(3, 4), torch.tensor([step % 5])
        expected = eager(new, position)
        for exe in (native, python):
            got = exe(new, position=position)  # a keyword too: bound, then the lane
            assert torch.equal(got[0], expected[0])
            assert set(got[1]) == {"total", "first"}
            torch.testing.assert_close(got[1]["total"], expected[1]["total"])
            assert torch.equal(got[1]["first"], expected[1]["first"])
    assert counts(native)["calls"] == 5 and counts(native)["fallbacks"] == 0
    assert torch.equal(native.state_dict()["cache"], eager.cache)
    assert torch.equal(python.state_dict()["cache"], eager.cache)


def test_calls_the_lane_does_not_take_fall_back_with_the_python_paths_results_and_errors() -> None:
    exe = hloalias.compile(kv_update, (torch.zeros(3, 5, 4), torch.zeros(3, 4)))
    cache = torch.zeros(3, 5, 4)
    exe(cache, torch.zeros(3, 4))
    start = counts(exe)["fallbacks"]
    # A read-only input that is not contiguous: copied by the Python path.
    strided = torch.randn(4, 3).t()
    assert torch.equal(exe(cache, strided), strided * 2) and torch.equal(cache[:, 2], strided)
    # A written input that requires grad: refused, as eager refuses it.
    leaf = torch.zeros(3, 5, 4, requires_grad=True)
    with pytest.raises(ExecutionError, match="leaf tensor that requires grad"):
        exe(leaf, torch.ones(3, 4))
    # Inputs whose bytes overlap where one is written: refused before running.
    with pytest.raises(ExecutionError, match="share memory"):
        exe(cache, cache[:, 0])
    # Another dtype: the Python path's error, naming the input.
    with pytest.raises(ExecutionError, match="new"):
        exe(cache, torch.zeros(3, 4, dtype=torch.float64))
    # A DeviceTensor input.
    new = exe.to_device(torch.ones(3, 4))
    assert torch.equal(exe(cache, new), torch.full((3, 4), 2.0))
    assert counts(exe)["fallbacks"] == start + 5
    assert torch.equal(cache[:, 2], torch.ones(3, 4)) and torch.equal(leaf, torch.zeros(3, 5, 4))


class Recording(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_an_active_dispatch_mode_takes_the_python_path() -> None:
    exe = hloalias.compile(kv_update, (torch.zeros(3, 5, 4), torch.zeros(3, 4)))
    cache, new = torch.zeros(3, 5, 4), torch.ones(3, 4)
    exe(cache, new)
    start = counts(exe)["fallbacks"]
    with Recording():
        out = exe(cache, new)
    assert torch.equal(out, new * 2)
    assert counts(exe)["fallbacks"] == start + 1


def test_results_that_are_not_the_usual_ones_are_committed_by_the_python_path() -> None:
    # XLA writing a donated buffer's result elsewhere (test_runtime_trust's stand-in).
    from test_runtime_trust import _NotInPlace, _run_not_in_place

    exe = hloalias.compile(kv_update, (torch.zeros(3, 5, 4), torch.zeros(3, 4)))
    cache = torch.zeros(3, 5, 4)
    exe(cache, torch.zeros(3, 4))
    _run_not_in_place(exe, _NotInPlace(exe._loaded, exe._result_keys.index("mutation:0")))
    address = cache.data_ptr()
    out = exe(cache, torch.ones(3, 4))
    assert counts(exe)["finished_in_python"] == 1
    assert cache.data_ptr() != address  # moved onto the new buffer, as the Python path does
    assert torch.equal(cache[:, 2], torch.ones(3, 4)) and torch.equal(out, torch.full((3, 4), 2.0))


class AccumulateRows(torch.nn.Module):
    buf: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.buf.add_(x.reshape(-1, 8).sum(0))
        return x * 2 if x.dim() == 1 else self.buf[0:4]


def test_a_held_view_of_state_from_another_executable_stays_live_under_the_lane() -> None:
    module = AccumulateRows()
    viewing = hloalias.compile(module, (torch.ones(1, 8),))  # returns a view of the state
    writing = hloalias.compile(module, (torch.ones(8),))  # returns a result: the lane's kind
    assert viewing._lane is None and writing._lane is not None
    held = viewing(torch.ones(1, 8))
    writing(torch.ones(8))  # the state's buffer cannot be donated while held: XLA writes elsewhere
    assert counts(writing)["finished_in_python"] == 1
    assert torch.equal(held, torch.full((4,), 2.0))  # the new value was copied into the held buffer
    assert writing.host_copies == {"buf": 1}


def test_a_failed_execution_raises_and_changes_nothing() -> None:
    module = StateKV()
    exe = hloalias.compile(module, (torch.zeros(3, 4), torch.tensor([0])))
    exe(torch.ones(3, 4), torch.tensor([1]))
    before = exe.state_dict()["cache"]
    assert exe._plan is not None
    real = exe._plan.dispatch

    def lost(arrays: Any) -> Any:
        raise RuntimeError("device lost")

    failing = exe._plan.new_dispatch(exe)
    failing.entry, failing.run = None, lost
    exe._plan.dispatch = failing
    with pytest.raises(ExecutionError, match="XLA execution failed: device lost"):
        exe(torch.full((3, 4), 7.0), torch.tensor([2]))
    exe._plan.dispatch = real
    assert torch.equal(exe.state_dict()["cache"], before)
    exe(torch.full((3, 4), 7.0), torch.tensor([2]))
    assert torch.equal(exe.state_dict()["cache"][:, 2], torch.full((3, 4), 7.0))


def donate(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def test_a_result_fed_back_as_a_donor_is_left_as_it_was_and_outlives_the_executable() -> None:
    exe = hloalias.compile(donate, (torch.zeros(64),), donate_argnums=[0])
    y = exe(torch.zeros(64))
    first = y
    for _ in range(5):
        y = exe(y)
    # A donated torch tensor is left as it was, wherever it came from.
    assert torch.equal(first, torch.ones(64)) and counts(exe)["calls"] >= 5
    expected = torch.zeros(64)
    for _ in range(6):
        expected = expected * 2 + 1
    reference = weakref.ref(exe)
    del exe
    gc.collect()
    assert reference() is None  # the lane does not keep its executable alive
    assert torch.equal(y, expected)  # the result keeps its buffer


def _many_results() -> Iterator[torch.Tensor]:
    exe = hloalias.compile(lambda x: x + 1, (torch.zeros(16),))
    x = torch.zeros(16)
    for _ in range(300):
        yield exe(x)


def test_result_tensors_keep_their_buffers_and_free_them_when_dropped() -> None:
    held = list(_many_results())
    assert all(torch.equal(t, torch.ones(16)) for t in held)
    registry = ownership._BACKINGS
    live = sum(1 for reference in registry.values() if reference() is not None)
    assert live >= len(held)
    del held
    gc.collect()
    assert sum(1 for reference in registry.values() if reference() is not None) < live


def test_the_native_wait_is_the_python_wait() -> None:
    from hloalias.runtime import _lane as native
    from hloalias.runtime.ownership import torch_to_device
    from hloalias.runtime.pjrt import wait_ready

    a = torch.randn(256, 256)
    exe = hloalias.compile(lambda x: x @ x, (a,))
    arrays = [torch_to_device(a, exe.device, owned=False)]
    assert exe._plan is not None
    results = exe._plan.dispatch.run(arrays)
    assert native.wait_ready(results, 10**9) is True  # polled to the end, within a second
    assert native.wait_ready(results, 0) is True and wait_ready(results, spin_ns=0)  # ready already: in time
    torch.testing.assert_close(torch.from_dlpack(results[0]), a @ a, rtol=1e-4, atol=1e-3)


def test_explain_names_the_call_path_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    exe = hloalias.compile(kv_update, (torch.zeros(3, 5, 4), torch.zeros(3, 4)))
    cache = torch.zeros(3, 5, 4)
    for _ in range(3):
        exe(cache, torch.ones(3, 4))
    assert (
        "call path: native (hloalias.runtime._lane); calls so far: 2 run natively, 1 left to the Python path"
        in exe.explain()
    )
    module = AccumulateRows()
    viewing = hloalias.compile(module, (torch.ones(1, 8),))
    assert "call path: Python (an output is a rebuilt view, a constant or empty)" in viewing.explain()
    assert "call path: Python (HLOALIAS_NATIVE=0)" in python_path(monkeypatch, kv_update, (cache, torch.ones(3, 4))).explain()



def test_a_stale_build_takes_the_python_path_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build of runtime/_lane.cpp whose interface number is not the one
    runtime/lane.py expects (an older source) is not used: every call takes
    the Python path with eager's results, and explain() says how to rebuild."""
    monkeypatch.setattr(lane_module, "_LANE_ABI_VERSION", lane_module._LANE_ABI_VERSION + 1)
    exe = hloalias.compile(kv_update, (torch.zeros(3, 5, 4), torch.zeros(3, 4)))
    assert exe._lane is None
    line = next(line for line in exe.explain().splitlines() if line.startswith("call path:"))
    assert "call path: Python (the native call path's build is stale" in line
    assert f"this runtime needs {lane_module._LANE_ABI_VERSION}" in line and "scripts/venv.sh" in line
    cache, eager_cache = torch.zeros(3, 5, 4), torch.zeros(3, 5, 4)
    out = exe(cache, torch.ones(3, 4))
    assert torch.equal(out, kv_update(eager_cache, torch.ones(3, 4))) and torch.equal(cache, eager_cache)


class _OldLane:
    """A Lane from an older build: another constructor."""

    def __init__(self, *args: Any) -> None:
        raise TypeError(f"function takes exactly 22 arguments ({len(args)} given)")


def test_a_build_without_an_interface_number_or_with_another_constructor_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A build from before the interface number (no ``ABI_VERSION``), and
    one whose ``Lane`` takes other arguments: the Python path, not a raw
    ``TypeError`` at compile."""
    monkeypatch.setattr(lane_module, "_lane", type("OldBuild", (), {"Lane": _OldLane}))
    exe = hloalias.compile(lambda x: x * 2, (torch.zeros(4),))
    assert exe._lane is None and "interface version none" in exe.explain()
    assert torch.equal(exe(torch.ones(4)), torch.full((4,), 2.0))
    numbered = type("Build", (), {"Lane": _OldLane, "ABI_VERSION": lane_module._LANE_ABI_VERSION})
    monkeypatch.setattr(lane_module, "_lane", numbered)
    exe = hloalias.compile(lambda x: x * 3, (torch.zeros(4),))
    assert exe._lane is None
    assert "the native call path's build does not match this runtime (function takes exactly 22" in exe.explain()
    assert torch.equal(exe(torch.ones(4)), torch.full((4,), 3.0))

def test_executables_sharing_state_see_each_others_updates_under_the_lane() -> None:
    # Each lane refills its plan's cached state list after its commit; the
    # other executable's list was dropped by the commit and is rebuilt.
    eager, module = AccumulateRows(), AccumulateRows()
    one = hloalias.compile(module, (torch.ones(8),))
    two = hloalias.compile(module, (torch.ones(16),))  # also 1-D: returns x * 2, the lane's kind
    assert one._lane is not None and two._lane is not None
    for step in range(6):
        x = torch.full((8,), float(step)) if step % 3 else torch.full((16,), float(step))
        exe = one if x.numel() == 8 else two
        assert torch.equal(exe(x), eager(x))
        assert torch.equal(one.state_dict()["buf"], eager.buf)
    assert counts(one)["calls"] + counts(two)["calls"] == 6
