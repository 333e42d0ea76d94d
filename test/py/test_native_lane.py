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


def _elf_section_names(path: str) -> set[str]:
    """Section names of a 64-bit little-endian ELF file (the header fields
    of the ELF specification; no tool needed)."""
    import struct

    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path} is not a 64-bit LE ELF file"
    section_offset, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)

    def header(index: int) -> tuple[int, int]:  # (sh_name, sh_offset)
        base = section_offset + index * entry_size
        name, = struct.unpack_from("<I", data, base)
        offset, = struct.unpack_from("<Q", data, base + 0x18)
        return name, offset

    names_offset = header(names_index)[1]
    found = set()
    for index in range(count):
        start = names_offset + header(index)[0]
        found.add(data[start:data.index(b"\0", start)].decode())
    return found


def test_the_native_library_is_built_without_debug_info() -> None:
    # Every process reads and hashes the library for the program cache's
    # key (runtime/source_key.py) before its first compile: DWARF made it
    # ~25x larger than its code.
    from hloalias.runtime import _lane as native

    sections = _elf_section_names(native.__file__)
    assert ".text" in sections
    assert not {name for name in sections if name.startswith(".debug_")}, sorted(sections)


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


# -- the step tables: each row kind, and the lane executing it -------------------------------


def test_the_plans_tables_carry_each_inputs_row_and_each_arguments_source() -> None:
    """What the lane does with each input is the row the plan built: the
    cache (written in place) from its runtime buffer, at offset 0, all of
    its storage, under eager's write refusals; ``new`` from the import
    cache with no flags; both with their dtype, shape and row-major
    strides; the arguments in @main order from the sources table, which
    the Python path's argument list reads too."""
    from hloalias.runtime import plan as plan_module

    exe = hloalias.compile(kv_update, (torch.zeros(3, 5, 4), torch.zeros(3, 4)))
    assert exe._plan is not None
    steps = plan_module._NativeSteps.of(exe, exe._plan)
    cache_row, new_row = steps.inputs
    written = plan_module.ZERO_OFFSET | plan_module.WHOLE_STORAGE | plan_module.WRITE_REFUSALS
    assert cache_row[:8] == (0, 0, plan_module.BACKED, written, torch.float32, (3, 5, 4), (20, 4, 1), 240)
    assert new_row == (1, 1, plan_module.IMPORT, 0, torch.float32, (3, 4), (4, 1), 48, -1)
    assert steps.sources == exe._plan.sources == (-1, -2)
    assert steps.outputs == ((exe._plan.outputs[0].position, torch.float32, (3, 4), (4, 1), 48),)
    module = StateKV()
    stateful = hloalias.compile(module, (torch.zeros(3, 4), torch.tensor([0])))
    assert stateful._plan is not None
    steps = plan_module._NativeSteps.of(stateful, stateful._plan)
    assert steps.sources == stateful._plan.sources == (0, -1, -2)
    ((kind, argument, result, slot, state),) = steps.commits
    assert (kind, argument, state) == (plan_module.SET_SLOT, 0, 0) and slot is stateful._slots["cache"]


@pytest.mark.parametrize("case", ["dtype", "shape", "device-like layout"])
def test_an_input_off_its_row_is_refused_with_the_python_paths_error(
    case: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tensor that does not meet its row leaves the call to the Python
    path before anything runs: the error is the Python path's, word for
    word, and nothing changed."""
    example = (torch.zeros(3, 5, 4), torch.zeros(3, 4))
    native = hloalias.compile(kv_update, example)
    python = python_path(monkeypatch, kv_update, example)
    wrong = {
        "dtype": torch.zeros(3, 4, dtype=torch.float64),
        "shape": torch.zeros(4, 3),
        "device-like layout": torch.zeros(3, 4).to_sparse(),
    }[case]
    errors = []
    for exe in (native, python):
        cache = torch.zeros(3, 5, 4)
        exe(cache, torch.ones(3, 4))
        with pytest.raises(ExecutionError) as raised:
            exe(cache, wrong)
        errors.append(str(raised.value))
        assert torch.equal(cache[:, 2], torch.ones(3, 4))
    assert errors[0] == errors[1] and "'new'" in errors[0]
    assert counts(native)["fallbacks"] == 2  # the first call (re-seating the cache) and this one


def test_strides_are_checked_against_the_row_as_torch_checks_contiguity() -> None:
    """The row's strides are row-major: a transposed input leaves the call
    to the Python path (which copies it), an odd stride along a dimension of
    size 1 is never stepped along and the lane takes it, as it takes an
    empty input whatever its strides."""
    exe = hloalias.compile(lambda x: x * 2, (torch.zeros(3, 1, 4),))
    base = torch.arange(12.0)
    odd = base.as_strided((3, 1, 4), (4, 7, 1))
    assert odd.is_contiguous()
    start = counts(exe)
    assert torch.equal(exe(odd), odd * 2)
    assert counts(exe)["calls"] == start["calls"] + 1
    transposed = torch.arange(12.0).reshape(4, 1, 3).permute(2, 1, 0)
    assert torch.equal(exe(transposed), transposed * 2)
    assert counts(exe)["fallbacks"] == start["fallbacks"] + 1
    empty = hloalias.compile(lambda x, y: y + x.sum(), (torch.zeros(0, 3), torch.zeros(2)))
    got = empty(torch.zeros(3, 0).t(), torch.ones(2))
    assert torch.equal(got, torch.ones(2)) and counts(empty)["calls"] == 1


def test_a_written_input_over_more_storage_than_its_row_is_copied_back_by_the_python_path() -> None:
    """``WHOLE_STORAGE``: the runtime buffer lent to a written input must be
    all of its storage; a tensor at the start of a larger storage is not
    backed by it, and the Python path writes its new value back."""
    exe = hloalias.compile(kv_update, (torch.zeros(3, 5, 4), torch.zeros(3, 4)))
    larger = torch.zeros(3 * 5 * 4 + 8)
    cache = larger[: 3 * 5 * 4].view(3, 5, 4)
    start = counts(exe)["fallbacks"]
    exe(cache, torch.ones(3, 4))
    exe(cache, torch.full((3, 4), 2.0))
    assert counts(exe)["fallbacks"] == start + 2
    assert torch.equal(cache[:, 2], torch.full((3, 4), 2.0)) and cache.data_ptr() == larger.data_ptr()


def test_a_malformed_table_is_refused_when_the_lane_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane checks every operand of its tables once, when it is built:
    a row that names no argument, state position or input row is an error
    then, never a wrong call."""
    import dataclasses

    from hloalias.runtime import plan as plan_module

    real = plan_module._NativeSteps.of
    bad_rows = {
        "source": lambda steps: dataclasses.replace(steps, sources=(-1, -1)),
        "input": lambda steps: dataclasses.replace(steps, inputs=(steps.inputs[0][:1] + (7,) + steps.inputs[0][2:],) + steps.inputs[1:]),
        "pair": lambda steps: dataclasses.replace(steps, pairs=((0, 5),)),
        "output": lambda steps: dataclasses.replace(steps, outputs=(steps.outputs[0][:3] + ((1,),) + steps.outputs[0][4:],)),
        # An index range on a float input, and one whose low is above its high.
        "range": lambda steps: dataclasses.replace(steps, ranges=((0, 0, 4),)),
    }
    for what, change in bad_rows.items():
        monkeypatch.setattr(plan_module._NativeSteps, "of", staticmethod(lambda exe, plan: change(real(exe, plan))))
        monkeypatch.setattr(lane_module, "_NativeSteps", plan_module._NativeSteps)
        with pytest.raises(ValueError, match=f"malformed {what} row"):
            hloalias.compile(kv_update, (torch.zeros(3, 5, 4), torch.zeros(3, 4)))


def test_the_python_path_checks_torchs_edits_of_state_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-call check of the module's tensors is ``_lane.first_changed``
    also with ``HLOALIAS_NATIVE=0`` (the same check as the Python loop,
    ``test_module_state_sync.py``): a torch edit is seen on the next call."""
    module = AccumulateRows()
    exe = python_path(monkeypatch, module, (torch.ones(8),))
    assert exe._state_watch._first_changed is executable_module._lane.first_changed
    exe(torch.ones(8))
    module.buf.mul_(0).add_(10)
    exe(torch.ones(8))
    assert torch.equal(exe.state_dict()["buf"], torch.full((8,), 11.0))


def test_the_python_paths_argument_list_reads_the_sources_table() -> None:
    """``_CallPlan.arguments`` builds any @main order from the sources
    table the lane reads (torch.export puts state first; the table does not
    assume it)."""
    from hloalias.runtime import plan as plan_module

    plan = plan_module._CallPlan.__new__(plan_module._CallPlan)
    plan.state_arrays = ["s0", "s1"]  # type: ignore[list-item]
    plan.stored_layouts = ()
    plan.state_first = False
    plan.sources = (-1, 0, -2, 1)
    assert plan.arguments(None, ["u0", "u1"]) == ["u0", "s0", "u1", "s1"]  # type: ignore[arg-type, list-item]


class ReadsState(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w


def test_a_call_left_to_the_python_path_checks_torchs_edits_once_per_run() -> None:
    """For a program with no effect the check of the module's tensors runs
    during each run: a call the lane leaves before running (a DeviceTensor
    input) is checked once, by the Python path's run; a run the lane drops
    on old state is followed by the lane's own bring-up-to-date, so the
    Python path's run is the only other one and sees the new value."""
    module = ReadsState()
    exe = hloalias.compile(module, (torch.zeros(4),))
    assert exe._lane is not None and exe._watch_late
    checks = []
    real = exe._state_watch._first_changed

    def counting(*args: Any) -> int:
        checks.append(1)
        result: int = real(*args)
        return result

    exe._state_watch._first_changed = counting
    on_device = exe.to_device(torch.zeros(4))
    assert torch.equal(exe(on_device), torch.ones(4)) and len(checks) == 1
    with torch.no_grad():
        module.w.mul_(3)
    checks.clear()
    start = counts(exe)
    assert torch.equal(exe(torch.zeros(4)), torch.full((4,), 3.0))
    # The lane's (a change, seen twice: StateWatch.changed looks again on
    # rebuilt tuples before it reports one; its run dropped), then the
    # Python path's run's.
    assert len(checks) == 3
    assert counts(exe)["fallbacks"] == start["fallbacks"] + 1
    checks.clear()
    assert torch.equal(exe(torch.zeros(4)), torch.full((4,), 3.0)) and len(checks) == 1
    assert counts(exe)["calls"] == start["calls"] + 1


def test_a_build_of_an_older_interface_is_refused_and_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build of ``_lane.cpp`` from before ``first_differing`` (interface
    8, which it was added to without a new number): the runtime used it,
    the batch-norm statistics' per-call compare silently fell back to
    Python (``getattr``), and a build with it and one without carried the
    same number.  Now such a build is stale as a whole: every call and
    check on the Python path, ``explain()`` and a warning say so."""
    import types

    from hloalias.config import NativePathWarning
    from hloalias.runtime import state

    assert lane_module._LANE_ABI_VERSION > 8
    real = lane_module._lane
    stale = types.SimpleNamespace(
        ABI_VERSION=8, Lane=getattr(real, "Lane", None), first_changed=getattr(real, "first_changed", None),
        values_in_range=getattr(real, "values_in_range", None),
    )
    monkeypatch.setattr(lane_module, "_lane", stale)
    refusal = lane_module._build_refusal()
    assert refusal is not None
    assert "interface version 8" in refusal and f"needs {lane_module._LANE_ABI_VERSION}" in refusal
    assert "scripts/venv.sh" in refusal
    assert lane_module.native_first_differing() is None
    assert lane_module.native_first_changed() is None
    assert lane_module.native_values_in_range() is None
    monkeypatch.setenv("HLOALIAS_NATIVE", "1")
    with pytest.warns(NativePathWarning, match="interface version 8"):
        lane_module.warn_if_stale()
    exe = hloalias.compile(torch.nn.BatchNorm1d(3), (torch.randn(4, 3),))
    assert exe._lane is None
    assert "stale" in exe.explain()
    assert exe._state_watch._first_differing is state._first_differing_in_python
    monkeypatch.setenv("HLOALIAS_NATIVE", "0")  # the user chose the Python path: nothing to say
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", NativePathWarning)
        lane_module.warn_if_stale()


def test_a_current_build_compares_natively() -> None:
    assert lane_module.native_first_differing() is lane_module._lane.first_differing
    exe = hloalias.compile(torch.nn.BatchNorm1d(3), (torch.randn(4, 3),))
    assert exe._state_watch._first_differing is lane_module._lane.first_differing


#: A process whose extension is a stale build (interface 8) with a wait
#: policy and a DLPack guard that record their use: what a call uses of it.
_STALE_BUILD = """
import json, os, sys, types, warnings
calls = []

class Waiter:
    polling = True
    def __init__(self, spin):
        calls.append("Waiter")
    def __call__(self, results):
        calls.append("wait")
        for result in results:
            result.block_until_ready()

def guard_dlpack(capsule):
    calls.append("guard_dlpack")
    return capsule

stale = types.ModuleType("hloalias.runtime._lane")
stale.ABI_VERSION = 8
stale.Waiter = Waiter
stale.guard_dlpack = guard_dlpack
stale.drain_releases = lambda: 0
sys.modules["hloalias.runtime._lane"] = stale
os.environ["HLOALIAS_NATIVE"] = "1"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    import hloalias
    from hloalias.runtime import ownership, pjrt
    exe = hloalias.compile(lambda x: x * 2, (torch.zeros(4),))
    out = exe(torch.ones(4))
print(json.dumps({
    "calls": calls, "out": out.tolist(), "waiter": repr(pjrt.NativeWaiter), "guard": repr(ownership._guard_dlpack),
    "warned": [str(w.message) for w in caught if type(w.message).__name__ == "NativePathWarning"],
}))
"""


def test_a_stale_build_s_waiter_and_dlpack_guard_are_not_used() -> None:
    """The wait policy (``_lane.Waiter``) and the DLPack release guard
    (``_lane.guard_dlpack``) of a build of another interface are refused
    as its ``Lane`` is: every call waits and imports in Python, with the
    one stale-build warning.  Before, pjrt and ownership took them from
    any build, so a stale extension still ran them."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _STALE_BUILD], capture_output=True, text=True, timeout=600, check=False,
        env={k: v for k, v in os.environ.items() if k != "HLOALIAS_NATIVE"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["out"] == [2.0] * 4
    assert seen["calls"] == [], seen
    assert seen["waiter"] == "None" and seen["guard"] == "None", seen
    assert len(seen["warned"]) == 1 and "interface version 8" in seen["warned"][0], seen["warned"]


def test_a_current_build_s_waiter_and_dlpack_guard_are_used() -> None:
    from hloalias.runtime import pjrt

    assert pjrt.native_build() is lane_module._lane
    assert pjrt.NativeWaiter is lane_module._lane.Waiter
    assert ownership._guard_dlpack is lane_module._lane.guard_dlpack
