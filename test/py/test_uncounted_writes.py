"""Writes to module state that torch does not count in the tensor's
``_version``: through ``.data`` (a tensor with a version counter of its
own), ``.numpy()``, ``__array__``, ``__dlpack__`` and the storage
(``untyped_storage()``, ``storage()``).  Everyday code writes so (weight
init, a manual SGD step ``p.data.add_(-lr * p.grad)``, an EMA
``ema.data.mul_(d).add_(p.data, alpha=1 - d)``, a load through numpy); the
next call must run on the written values, as eager does, on both call paths,
for forward programs and training steps, also where a step left the tensor
stale (its read-in must happen first).  runtime/state.py: a tensor a state
slot stands for gets a class that marks its slots when one of these is
taken (``_WatchedTensorHook``).

Before: every call after such a write ran on the device's old copy (the
first test's outputs off by ~0.3), the training step's state kept none of
the writes."""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hloalias
from hloalias.runtime import state as state_module
from interrupt_points import sweep
from test_runtime_transaction import PATHS, compile_on

TOL = 1e-5


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


def _through_storage(t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def _through_typed_storage(t: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        storage = t.storage()
    with torch.no_grad():
        return torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.shape, t.stride())


def _numpy_write(array: np.ndarray) -> None:
    array *= np.float32(0.5)
    array += np.float32(0.25)


#: Each escape hatch, writing ``t = t * 0.5 + 0.25`` through what it
#: returns; and whether it applies to a tensor that requires grad.
ESCAPES: dict[str, tuple[Callable[[torch.Tensor], None], bool]] = {
    "data": (lambda t: t.data.mul_(0.5).add_(0.25), True),
    "numpy(force=True)": (lambda t: _numpy_write(t.numpy(force=True)), True),
    "numpy": (lambda t: _numpy_write(t.numpy()), False),
    "__array__": (lambda t: _numpy_write(np.asarray(t)), False),
    "__dlpack__": (lambda t: torch.from_dlpack(t).mul_(0.5).add_(0.25), False),
    "untyped_storage": (lambda t: _through_storage(t).mul_(0.5).add_(0.25), True),
    "storage": (lambda t: _through_typed_storage(t).mul_(0.5).add_(0.25), True),
}


def _write(model: Net, escape: str) -> None:
    """Write every tensor of ``model`` the escape applies to through it."""
    write, on_params = ESCAPES[escape]
    for t in ([model.fc.weight, model.fc.bias] if on_params else []) + [model.scale]:
        write(t)


def _write_counted(model: Net) -> None:
    with torch.no_grad():
        for t in (model.fc.weight, model.fc.bias, model.scale):
            t.mul_(0.5).add_(0.25)


def _x(seed: int, rows: int = 2) -> torch.Tensor:
    return torch.randn(rows, 4, generator=torch.Generator().manual_seed(seed))


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("escape", sorted(ESCAPES))
@pytest.mark.parametrize("path", PATHS)
def test_forward_program_reads_uncounted_writes(escape: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = Net()
    model = copy.deepcopy(reference)
    x = _x(1)
    exe = compile_on(path, monkeypatch, model, (x,))
    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
        _write(model, escape)
        if ESCAPES[escape][1]:
            _write_counted(reference)
        else:
            with torch.no_grad():
                reference.scale.mul_(0.5).add_(0.25)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)


def _step_fn(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def _training_pair(path: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Net, Net, Any, Callable[..., Any]]:
    reference = Net()
    model = copy.deepcopy(reference)
    opt, reference_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, (_x(2, 8), torch.randn(8, 3)))
    return model, reference, train, _step_fn(reference, reference_opt)


@pytest.mark.parametrize("escape", sorted(ESCAPES))
@pytest.mark.parametrize("path", PATHS)
def test_training_step_reads_uncounted_writes_to_stale_state(
    escape: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After each step the parameters are stale (their values are on the
    device): the escape first brings the step's values in, then its write
    reaches the next step."""
    model, reference, train, reference_step = _training_pair(path, monkeypatch)
    y = torch.randn(8, 3, generator=torch.Generator().manual_seed(9))
    for i in range(3):
        train(_x(3 + i, 8), y)
        reference_step(_x(3 + i, 8), y)
        assert state_module.is_stale(model.fc.weight)
        _write(model, escape)
        if ESCAPES[escape][1]:
            _write_counted(reference)
        else:
            with torch.no_grad():
                reference.scale.mul_(0.5).add_(0.25)
    train(_x(3, 8), y)
    reference_step(_x(3, 8), y)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[name], atol=TOL, rtol=TOL, msg=name)


@pytest.mark.parametrize("path", PATHS)
def test_data_alias_held_across_calls_is_watched(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``w = p.data`` kept by user code (an EMA helper) and written after
    later calls: its own version counter is watched from the escape on."""
    reference = Net()
    model = copy.deepcopy(reference)
    x = _x(4)
    exe = compile_on(path, monkeypatch, model, (x,))
    weight, reference_weight = model.fc.weight.data, reference.fc.weight.data
    array = model.scale.numpy()
    for i in range(3):
        with torch.no_grad():
            torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
        weight.mul_(0.5)
        reference_weight.mul_(0.5)
        array += np.float32(i)
        with torch.no_grad():
            reference.scale.add_(i)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)


@pytest.mark.parametrize("path", PATHS)
def test_aliases_taken_before_compiling_are_compared_by_value(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``w = p.data`` and ``a = b.detach().numpy()`` kept from before
    compiling: no escape is taken after, but the storage's reference count
    shows the memory shared, so those tensors (and only those) are
    compared by value at every call."""
    reference = Net()
    model = copy.deepcopy(reference)
    weight, array = model.fc.weight.data, model.scale.detach().numpy()
    x = _x(13)
    exe = compile_on(path, monkeypatch, model, (x,))
    compared = {name for name, slot in exe._watched if slot.snapshot is not None}
    assert compared == {"fc.weight", "scale"}, compared
    for i in range(3):
        with torch.no_grad():
            torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
        weight.mul_(0.5)
        array += np.float32(i + 1)
        with torch.no_grad():
            reference.fc.weight.mul_(0.5)
            reference.scale.add_(i + 1)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)


@pytest.mark.parametrize("path", PATHS)
def test_manual_sgd_loop_matches_eager(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled forward serves inference between manual SGD steps
    ``p.data.add_(-lr * p.grad)`` that eager code runs on the same module."""
    model = Net()
    reference = copy.deepcopy(model)
    x, y = _x(5, 8), torch.randn(8, 3, generator=torch.Generator().manual_seed(5))
    exe = compile_on(path, monkeypatch, model, (x,))
    for _ in range(4):
        with torch.no_grad():
            torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
        for m in (model, reference):
            F.mse_loss(m(x), y).backward()
            for p in m.parameters():
                p.data.add_(-0.1 * p.grad)
                p.grad = None
        for ours, theirs in zip(model.parameters(), reference.parameters()):
            assert _bits_equal(ours.detach(), theirs.detach())
    with torch.no_grad():
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)


@pytest.mark.parametrize("path", PATHS)
def test_ema_of_a_training_step_matches_eager(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An EMA model (a compiled forward) updated through ``.data`` from a
    compiled training step's parameters, which the steps left stale."""
    model, reference, train, reference_step = _training_pair(path, monkeypatch)
    ema, reference_ema = copy.deepcopy(model), copy.deepcopy(reference)
    x, y = _x(6, 8), torch.randn(8, 3, generator=torch.Generator().manual_seed(6))
    with monkeypatch.context() as patch:
        patch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
        ema_exe = hloalias.compile(ema, (x,))
    decay = 0.9
    for i in range(4):
        train(_x(10 + i, 8), y)
        reference_step(_x(10 + i, 8), y)
        for e, m in ((ema, model), (reference_ema, reference)):
            for ema_p, p in zip(e.parameters(), m.parameters()):
                ema_p.data.mul_(decay).add_(p.data, alpha=1 - decay)
        with torch.no_grad():
            torch.testing.assert_close(ema_exe(x), reference_ema(x), atol=TOL, rtol=TOL)
    # The EMA over the step's parameters is eager's, to the bit, where the
    # parameters are (they came from the device: XLA's update may round
    # differently from torch's, so the two models are compared up to TOL).
    check = copy.deepcopy(ema)
    for e in (check, ema):
        for ema_p, p in zip(e.parameters(), model.parameters()):
            ema_p.data.mul_(decay).add_(p.data, alpha=1 - decay)
    assert all(_bits_equal(a.detach(), b.detach()) for a, b in zip(check.parameters(), ema.parameters()))
    with torch.no_grad():
        torch.testing.assert_close(ema_exe(x), check(x), atol=TOL, rtol=TOL)
    ema_exe.write_back()
    assert all(_bits_equal(a.detach(), b.detach()) for a, b in zip(check.parameters(), ema.parameters()))


def test_no_upload_without_an_escape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls, counted writes, reads and hloalias's own uses of the
    tensors read nothing in beyond what torch counted; an escape reads its
    tensor in once."""
    model = Net()
    x = _x(7)
    exe = hloalias.compile(model, (x,))
    refreshed: list[str] = []
    original = state_module._StateSlot.refresh_from_torch

    def counting(slot: state_module._StateSlot, name: str) -> None:
        refreshed.append(name)
        original(slot, name)

    assert not [name for name, slot in exe._watched if slot.snapshot is not None]  # nothing compared by value
    monkeypatch.setattr(state_module._StateSlot, "refresh_from_torch", counting)
    for _ in range(3):
        with torch.no_grad():
            exe(x)
        model.state_dict()
        (model.fc.weight * 1).sum()
        copy.deepcopy(model)
        pickle.dumps(model)
    assert refreshed == []
    model.fc.weight.data.mul_(2)
    with torch.no_grad():
        exe(x)
        exe(x)
    assert refreshed == ["fc.weight"]


def test_watched_class_is_invisible() -> None:
    """The watched class keeps ops plain (no ``__torch_function__``),
    ``isinstance`` and copies/pickles of the plain classes."""
    model = Net()
    exe = hloalias.compile(model, (_x(8),))
    exe(_x(8))
    weight, scale = model.fc.weight, model.scale
    assert type(weight) is not torch.nn.Parameter and isinstance(weight, torch.nn.Parameter)
    assert type(weight).__torch_function__ is torch._C._disabled_torch_function_impl  # type: ignore[comparison-overlap]
    assert type(weight + 1) is torch.Tensor and type(scale * 2) is torch.Tensor and type(weight.data) is torch.Tensor
    assert type(copy.deepcopy(weight)) is torch.nn.Parameter and type(copy.deepcopy(scale)) is torch.Tensor
    assert type(pickle.loads(pickle.dumps(scale))) is torch.Tensor
    copied = copy.deepcopy(model)
    assert type(copied.fc.weight) is torch.nn.Parameter and type(copied.scale) is torch.Tensor
    # Where torch takes foreach kernels (off on CPU), it still takes them.
    from torch.optim.optimizer import _foreach_supported_types
    from torch.utils._foreach_utils import _foreach_supported_types as _util_foreach_types

    assert type(weight) in _foreach_supported_types and type(scale) in _util_foreach_types
    model.fc.weight.grad = torch.ones(3, 4)
    model.fc.bias.grad = torch.ones(3)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.step()
    model.load_state_dict(Net().state_dict())
    with torch.no_grad():
        torch.testing.assert_close(exe(_x(8)), model(_x(8)), atol=TOL, rtol=TOL)


_LOAD_WITHOUT_HLOALIAS = """
import io, sys, types, torch
sys.modules["hloalias"] = None  # not importable
tests = sys.modules[sys.argv[1]] = types.ModuleType(sys.argv[1])
tests.Net = type("Net", (torch.nn.Module,), {"__module__": sys.argv[1]})
data = sys.stdin.buffer.read()
model = torch.load(io.BytesIO(data[: int(sys.argv[2])]), weights_only=False)
state = torch.load(io.BytesIO(data[int(sys.argv[2]):]))
print(type(model.fc.weight).__name__, type(model.scale).__name__, type(state["fc.weight"]).__name__)
print(float(model.fc.weight.sum()), float(state["fc.weight"].sum()))
"""


def test_saved_model_and_state_dict_load_without_hloalias() -> None:
    model = Net()
    x = _x(9)
    exe = hloalias.compile(model, (x,))
    exe(x)
    model.fc.weight.data.mul_(2)
    exe(x)
    whole, state = io.BytesIO(), io.BytesIO()
    torch.save(model, whole)
    torch.save(model.state_dict(keep_vars=True), state)
    loaded = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_HLOALIAS, __name__, str(len(whole.getvalue()))],
        input=whole.getvalue() + state.getvalue(), capture_output=True, timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr.decode()[-2000:]
    lines = loaded.stdout.decode().splitlines()
    assert lines[0].split() == ["Parameter", "Tensor", "Parameter"]
    expected = float(model.fc.weight.detach().sum())
    assert [float(v) for v in lines[1].split()] == [expected, expected]


@pytest.mark.parametrize("escape", ["data", "__array__"])
def test_mesh_program_reads_uncounted_writes(escape: str) -> None:
    """A program on a mesh (its state in a group of its own, sharded):
    the same marks reach its slots."""
    reference = Net()
    model = copy.deepcopy(reference)
    x = _x(12, 4)
    exe = hloalias.compile(model, (x,), mesh=hloalias.Mesh((2,), ("dp",)), shardings={"x": ("dp", None)})
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
        _write(model, escape)
        if ESCAPES[escape][1]:
            _write_counted(reference)
        else:
            with torch.no_grad():
                reference.scale.mul_(0.5).add_(0.25)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)


# -- Ctrl-C -------------------------------------------------------------------------

FILES = {state_module.__file__}


@pytest.mark.parametrize("path", PATHS)
def test_a_call_interrupted_anywhere_still_reads_the_write(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``.data`` write, then a call interrupted at any point of
    runtime/state.py (the escape's marks and the read-in): the next call
    still reads the write (an upload may repeat, none is missed)."""
    reference = Net()
    model = copy.deepcopy(reference)
    x = _x(10)
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    rounds = [0]

    def prepare() -> None:
        rounds[0] += 1
        model.fc.weight.data.mul_(0.5).add_(rounds[0])
        with torch.no_grad():
            reference.fc.weight.mul_(0.5).add_(rounds[0])

    def check(_: None, where: Any) -> None:
        with torch.no_grad():
            torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL, msg=lambda m: f"{m} after {where}")

    points = sweep(prepare, lambda _: exe(x), check, FILES)
    assert any("refresh_from_torch" in name for name, _, _ in points), points


def test_an_escape_interrupted_anywhere_loses_no_write() -> None:
    """The escape itself (a stale parameter's read-in, then the marks)
    interrupted at any point: either the alias never reached the caller,
    or the next call reads what was written through it."""
    reference = Net()
    model = copy.deepcopy(reference)
    opt, reference_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    x, y = _x(11, 8), torch.randn(8, 3, generator=torch.Generator().manual_seed(11))
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, (x, y))
    reference_step = _step_fn(reference, reference_opt)
    rounds = [0]

    def prepare() -> None:
        rounds[0] += 1
        train(x, y)
        reference_step(x, y)

    def escape(_: None) -> torch.Tensor:
        return model.fc.weight.data

    def check(alias: torch.Tensor | None, where: Any) -> None:
        if alias is not None:
            alias.add_(1.0)
            with torch.no_grad():
                reference.fc.weight.add_(1.0)
        train(x, y)
        reference_step(x, y)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(
                value, reference.state_dict()[name], atol=TOL, rtol=TOL, msg=lambda m, n=name: f"{n}: {m} after {where}"
            )

    points = sweep(prepare, escape, check, FILES)
    assert any("host_may_change" in name for name, _, _ in points), points


# -- written while a call's value was on the device -----------------------------------


class Accumulating(torch.nn.Module):
    """A forward program that writes a buffer: after a call the buffer's
    value is on the device, and the module's tensor lags it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x.mean(0)[:3])
        return self.fc(x) * self.total


@pytest.mark.parametrize("path", PATHS)
def test_a_data_alias_written_after_a_forward_call_applies_to_its_value(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``w = m.total.data`` kept, a call updates ``total`` on the device,
    then ``w`` is written: the write applies to the call's value, as
    eager's does (the alias is marked stale with its tensor, and its first
    op copies the calls' value in).  Before: the next call read the host's
    pre-call value, written, over the call's update (off by ~0.2)."""
    reference = Accumulating()
    model = copy.deepcopy(reference)
    x = _x(20)
    exe = compile_on(path, monkeypatch, model, (x,))
    alias, reference_alias = model.total.data, reference.total.data
    for i in range(3):
        with torch.no_grad():
            torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
        assert state_module.is_stale(alias)
        alias.mul_(0.5).add_(i)
        reference_alias.mul_(0.5).add_(i)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
    torch.testing.assert_close(model.total, reference.total, atol=TOL, rtol=TOL)


def test_a_torch_compiled_graph_reads_a_data_alias_of_lagging_state() -> None:
    """A graph of another backend that dynamo traced on the stale alias
    brings it in before each run (``bring_up_to_date`` finds its slot
    through ``_ALIAS_SLOTS``), as it does for the tensor itself."""
    torch._dynamo.reset()
    reference = Accumulating()
    model = copy.deepcopy(reference)
    x = _x(25)
    exe = hloalias.compile(model, (x,))
    alias, reference_alias = model.total.data, reference.total.data
    doubled = torch.compile(lambda t: t * 2 + 1, backend="eager")
    for _ in range(3):
        with torch.no_grad():
            exe(x)
            reference(x)
        assert state_module.is_stale(alias)
        torch.testing.assert_close(doubled(alias), reference_alias * 2 + 1, atol=TOL, rtol=TOL)


def test_a_stale_alias_written_with_an_interrupt_anywhere_is_exact() -> None:
    """``alias.add_(1)`` on a ``.data`` alias a call left stale, with a
    Ctrl-C at every point of runtime/state.py (its read-in, the class
    given back): the next call sees either no write or the write applied
    to the call's value, never one applied to the value from before it,
    and never a refusal (the read-in is no write behind the stale mark)."""
    reference = [Accumulating()]
    model = copy.deepcopy(reference[0])
    x = _x(26)
    exe = hloalias.compile(model, (x,))
    alias = model.total.data

    def prepare() -> None:
        with torch.no_grad():
            exe(x)
            reference[0](x)

    def check(_: None, where: Any) -> None:
        added = copy.deepcopy(reference[0])
        with torch.no_grad():
            added.total.add_(1.0)
            got = exe(x)
            expected = {"without": reference[0](x), "with": added(x)}
        matches = [name for name, value in expected.items() if torch.allclose(got, value, atol=TOL, rtol=TOL)]
        assert matches, f"neither with nor without the write after {where}"
        if matches[0] == "with":
            reference[0] = added  # both made the call exe made

    points = sweep(prepare, lambda _: alias.add_(1.0), check, FILES)
    assert any("copy_to_source" in name or "refresh_stale" in name for name, _, _ in points), points


@pytest.mark.parametrize("path", PATHS)
def test_a_data_alias_written_after_a_training_step_applies_to_its_value(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a training step's parameters, with ``w = p.data`` taken
    before the first step and kept (off by ~0.1 before)."""
    model, reference, train, reference_step = _training_pair(path, monkeypatch)
    aliases = [p.data for p in model.parameters()]
    reference_aliases = [p.data for p in reference.parameters()]
    y = torch.randn(8, 3, generator=torch.Generator().manual_seed(21))
    for i in range(3):
        torch.testing.assert_close(train(_x(21 + i, 8), y), reference_step(_x(21 + i, 8), y), atol=TOL, rtol=TOL)
        for alias, reference_alias in zip(aliases, reference_aliases):
            alias.mul_(0.5).add_(0.1)
            reference_alias.mul_(0.5).add_(0.1)
    torch.testing.assert_close(train(_x(30, 8), y), reference_step(_x(30, 8), y), atol=TOL, rtol=TOL)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[name], atol=TOL, rtol=TOL, msg=name)


@pytest.mark.parametrize("path", PATHS)
def test_an_array_written_after_a_forward_call_is_refused(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept ``numpy()`` array cannot be marked: a write through it while
    the buffer's value is on the device applied to the value from before
    the call.  The next call refuses, naming the buffer, before anything
    changes; ``write_back()`` puts the calls' value over that write, and a
    write after it is read as eager's.  Before: read in, over the call's
    update, silently."""
    reference = Accumulating()
    model = copy.deepcopy(reference)
    x = _x(22)
    exe = compile_on(path, monkeypatch, model, (x,))
    array = model.total.numpy()
    with torch.no_grad():
        exe(x)
        reference(x)
    array += np.float32(1)
    device_before = _device_values(exe)
    with torch.no_grad(), pytest.raises(hloalias.ExecutionError, match="module state 'total' was written in place while"):
        exe(x)
    assert all(_bits_equal(value, device_before[name]) for name, value in _device_values(exe).items())
    exe.write_back()
    torch.testing.assert_close(model.total, reference.total, atol=TOL, rtol=TOL)
    array += np.float32(1)
    with torch.no_grad():
        reference.total.add_(1)
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)


def _device_values(exe: Any) -> dict[str, torch.Tensor]:
    """The device state without reading torch's tensors in (``state_dict()``
    would refuse, as the call does)."""
    return {name: exe._slots[name].torch_value(exe._slot_array(name)).clone() for name, _ in exe._watched}


@pytest.mark.parametrize("path", PATHS)
def test_an_array_written_after_a_training_step_is_refused(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, reference, train, reference_step = _training_pair(path, monkeypatch)
    array = model.fc.weight.numpy(force=True)  # kept across the step
    y = torch.randn(8, 3, generator=torch.Generator().manual_seed(23))
    train(_x(23, 8), y)
    reference_step(_x(23, 8), y)
    array *= np.float32(0.5)
    device_before = _device_values(train.executable)
    with pytest.raises(hloalias.ExecutionError, match="module state 'fc.weight' was written in place while"):
        train(_x(24, 8), y)
    after = _device_values(train.executable)
    assert all(_bits_equal(value, device_before[name]) for name, value in after.items() if value.dtype == torch.float32)
    train.write_back()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[name], atol=TOL, rtol=TOL, msg=name)
    array *= np.float32(0.5)
    with torch.no_grad():
        reference.fc.weight.mul_(0.5)
    torch.testing.assert_close(train(_x(24, 8), y), reference_step(_x(24, 8), y), atol=TOL, rtol=TOL)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[name], atol=TOL, rtol=TOL, msg=name)


# -- transformers -------------------------------------------------------------------


def test_gpt2_ema_through_data_and_save_pretrained(tmp_path: Any) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=16,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    source = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    exe = hloalias.compile(model, (ids,), {"use_cache": False})

    def logits() -> torch.Tensor:
        out = exe(ids, use_cache=False)
        return out["logits"] if isinstance(out, dict) else out.logits

    with torch.no_grad():
        torch.testing.assert_close(logits(), model(ids, use_cache=False).logits, atol=1e-4, rtol=1e-4)
        for ema_p, p in zip(model.parameters(), source.parameters()):
            ema_p.data.mul_(0.5).add_(p.data, alpha=0.5)
        torch.testing.assert_close(logits(), model(ids, use_cache=False).logits, atol=1e-4, rtol=1e-4)
        model.apply(model._init_weights)
        torch.testing.assert_close(logits(), model(ids, use_cache=False).logits, atol=1e-4, rtol=1e-4)
    model.save_pretrained(tmp_path)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    for name, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[name]), name


def test_a_trace_sees_the_plain_classes_and_the_watched_ones_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """hloalias's own traces (an export at a new shape, a training step's
    capture) run on the plain classes (runtime/state.py:
    ``traced_as_plain``): torch's tracing is slower on another class, and
    the trace's reads are no user's escapes.  Before, the second export saw
    the watched class.  After the trace, even one that fails, the tensors
    are watched again."""
    from hloalias.runtime import executable as executable_module

    model = torch.nn.Linear(4, 4)
    hloalias.compile(model, (torch.randn(2, 4),))
    watched = type(model.weight)
    assert watched is not torch.nn.Parameter and isinstance(model.weight, torch.nn.Parameter)
    seen: list[type] = []
    original = executable_module.import_cached

    def spying(*args: Any, **kwargs: Any) -> Any:
        seen.append(type(model.weight))
        return original(*args, **kwargs)

    monkeypatch.setattr(executable_module, "import_cached", spying)
    hloalias.compile(model, (torch.randn(3, 4),))
    assert seen == [torch.nn.Parameter]
    assert type(model.weight) is watched

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the trace failed")

    monkeypatch.setattr(executable_module, "import_cached", failing)
    with pytest.raises(RuntimeError, match="the trace failed"):
        hloalias.compile(model, (torch.randn(5, 4),))
    assert type(model.weight) is watched
    monkeypatch.setattr(executable_module, "import_cached", original)
    from hloalias.runtime import training as training_module

    capture = training_module.capture_training_step

    def spying_capture(*args: Any, **kwargs: Any) -> Any:
        seen.append(type(model.weight))
        return capture(*args, **kwargs)

    monkeypatch.setattr(training_module, "capture_training_step", spying_capture)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    seen.clear()
    hloalias.compile_training_step(step, model, opt, (torch.randn(2, 4),))
    assert seen == [torch.nn.Parameter]
    assert type(model.weight) is not torch.nn.Parameter
