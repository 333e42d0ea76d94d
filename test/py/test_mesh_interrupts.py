"""A Ctrl-C at any point of a call of a program on a mesh (SPMD over
XLA's forced host devices), of a training step on a mesh, and of
``hloalias.checkpoint``'s save and load of sharded state leaves the
module's state and the caller's tensors as they were before the
interrupted operation or as it leaves them (eager's values after it), the
same for every tensor of the operation: never part of it, never a lost
update.  Nothing stays held or switched (the state lock, torch's
function-subclass and grad modes), and the next operation works and
gives eager's result.

Deterministic: the interrupt is delivered at the k-th point where Python
checks for signals in the runtime's files, for every k, by calling the
SIGINT handler as Python does (test/py/interrupt_points.py)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias import Mesh, interrupts
from hloalias.runtime import (
    assembly,
    checkpoint,
    execution,
    executable as executable_module,
    ownership,
    sharding,
    state,
    training,
)
from interrupt_points import sweep
from test_checkpoint_save import write_as_two_processes

#: The call path on a mesh: binding and checks, placement, execution and
#: commit, the state store, the outputs.
CALL_FILES = {f.__file__ for f in (executable_module, execution, sharding, state, assembly, ownership)}
TRAIN_FILES = CALL_FILES | {training.__file__}
CHECKPOINT_FILES = CALL_FILES | {checkpoint.__file__, training.__file__}
#: A save reads the state (reads are swept below and in
#: test_lagging_interrupts.py): its own steps and the step's.
SAVE_FILES = {checkpoint.__file__, training.__file__, executable_module.__file__, interrupts.__file__}
MESH = Mesh((2,), ("dp",))


def _torch_modes() -> dict[str, Any]:
    return {
        "grad": torch.is_grad_enabled(),
        "torch function": torch._C._is_torch_function_enabled(),
        "function modes": torch._C._len_torch_function_stack(),
    }


def _check_released(lock: Any, modes: dict[str, Any], where: Any) -> None:
    """Nothing left held or switched: another thread can take the state
    lock (an RLock a cut-short call still held would block it) and torch's
    modes are the caller's."""
    assert not lock._is_owned(), f"the state lock is still held after {where}"
    assert _torch_modes() == modes, f"torch's modes changed after {where}"


def _close(actual: Any, expected: Any, where: Any) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual), torch.as_tensor(expected), rtol=1e-5, atol=1e-5, msg=lambda m: f"{where}: {m}"
    )


class Stateful(torch.nn.Module):
    """A counter, a sharded cache updated in place, and a caller tensor the
    forward writes (``out``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("cache", torch.zeros(8, 8))

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.lin(x)
        self.cache.add_(h)
        out.add_(h * 2)
        return h + self.cache


SHARDINGS = {"x": ("dp", None), "out": ("dp", None), "cache": ("dp", None)}


def _inputs(seed: int) -> torch.Tensor:
    return torch.randn(8, 8, generator=torch.Generator().manual_seed(seed))


class _Twin:
    """A program on the mesh and eager's module, a call apart at most:
    ``calls`` is how many calls each has seen."""

    def __init__(self) -> None:
        self.eager, self.model = Stateful(), Stateful()
        self.out, self.eager_out = torch.zeros(8, 8), torch.zeros(8, 8)
        self.exe = hloalias.compile(self.model, (_inputs(0), torch.zeros(8, 8)), mesh=MESH, shardings=SHARDINGS)
        self.calls = 0
        self.lock = self.exe._group.lock
        self.modes = _torch_modes()

    def eager_call(self) -> torch.Tensor:
        with torch.no_grad():
            result = self.eager(_inputs(self.calls), self.eager_out)
        self.calls += 1
        return result

    def check(self, where: Any) -> None:
        """The module's state and ``out`` are eager's before the call or
        after it, all of them; a next call gives eager's result."""
        _check_released(self.lock, self.modes, where)
        seen = int(self.model.calls)  # a bare read: whatever the calls left
        assert seen in (self.calls, self.calls + 1), (where, seen, self.calls)
        # The program's call count (named by a consumed buffer's error)
        # counts every call whose effects were committed, this one included.
        assert self.exe._calls == seen, (where, self.exe._calls, seen)
        if seen == self.calls + 1:
            self.eager_call()  # the interrupted call counts
        model, device = self.model.state_dict(), self.exe.state_dict()
        for name, value in self.eager.state_dict().items():
            _close(model[name], value, f"{name} after {where}")
            _close(device[name], value, f"{name} (device) after {where}")
        _close(self.out, self.eager_out, f"the caller's tensor after {where}")
        x = _inputs(self.calls)
        _close(self.exe(x, self.out), self.eager_call(), f"the next call after {where}")
        _close(self.out, self.eager_out, f"the caller's tensor after the call after {where}")


def test_a_mesh_call_interrupted_anywhere_is_all_or_nothing() -> None:
    """The state written in place is donated to the run (aliased to its
    new value): cut after the run, the old buffers are gone."""
    twin = _Twin()
    twin.exe(_inputs(0), twin.out)  # the state lags the module's tensors
    twin.eager_call()

    def run(_: None) -> None:
        twin.exe(_inputs(twin.calls), twin.out)

    points = sweep(lambda: None, run, lambda _, where: twin.check(where), CALL_FILES)
    names = {name for name, _, _ in points}
    assert {"run_mesh", "_MeshCommit.run"} <= names, sorted(names)
    assert all(slot.array is not None for slot in twin.exe._slots.values())


def _trainer() -> tuple[torch.nn.Module, torch.optim.Optimizer, Callable[..., torch.Tensor]]:
    torch.manual_seed(0)
    # One parameter and its three Adam entries: every loop over slots runs
    # more than once, and the sweep stays short.
    model = torch.nn.Linear(8, 8, bias=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = (model(x) - y).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return model, optimizer, step


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + seed)
    return torch.randn(8, 8, generator=generator), torch.randn(8, 8, generator=generator)


class _TrainTwin:
    """A training step on the mesh and eager's, ``steps`` apart at most one."""

    def __init__(self) -> None:
        self.model, self.optimizer, step = _trainer()
        self.eager, self.eager_optimizer, self.eager_step = _trainer()
        self.train = hloalias.compile_training_step(
            step, self.model, self.optimizer, _batch(0), mesh=MESH, shardings={0: ("dp", None), 1: ("dp", None)}
        )
        self.steps = 0
        self.lock = self.train.executable._group.lock
        self.modes = _torch_modes()

    def eager_call(self) -> torch.Tensor:
        result = self.eager_step(*_batch(self.steps))
        self.steps += 1
        return result

    def step_count(self) -> int:
        """Adam's step count for the first parameter: the module's own
        (a bare read, copied in from the device if the calls left it)."""
        entries = self.optimizer.state[next(iter(self.model.parameters()))]
        return int(entries["step"]) if "step" in entries else 0

    def device_steps(self) -> tuple[int, dict[str, Any]]:
        """Adam's step count on the device, and the step's state."""
        device = self.train.state_dict()
        return int(device["optimizer"]["state"][0]["step"]), device

    def check_state(self, where: Any, device: dict[str, Any]) -> None:
        """The model and optimizer, as eager code reads them and as the
        step holds them (``device``), are eager's."""
        model, optimizer = self.model.state_dict(), self.optimizer.state_dict()["state"]
        for name, value in self.eager.state_dict().items():
            _close(model[name], value, f"{name} after {where}")
            _close(device["model"][name], value, f"{name} (device) after {where}")
        for key, entries in self.eager_optimizer.state_dict()["state"].items():
            for entry, value in entries.items():
                _close(optimizer[key][entry], value, f"{key}.{entry} after {where}")
                _close(device["optimizer"]["state"][key][entry], value, f"{key}.{entry} (device) after {where}")

    def check(self, where: Any) -> None:
        _check_released(self.lock, self.modes, where)
        # The device's step count first: an eager read must agree with it.
        device_steps, device = self.device_steps()
        seen = self.step_count()
        assert seen == device_steps, f"eager code reads step {seen}, the device holds {device_steps}, after {where}"
        assert seen in (self.steps, self.steps + 1), (where, seen, self.steps)
        assert self.train.executable._calls == seen, (where, self.train.executable._calls, seen)
        if seen == self.steps + 1:
            self.eager_call()
        self.check_state(where, device)
        batch = _batch(self.steps)
        _close(self.train(*batch), self.eager_call(), f"the next step after {where}")


def test_a_mesh_training_step_interrupted_anywhere_is_all_or_nothing() -> None:
    twin = _TrainTwin()
    twin.train(*_batch(0))
    twin.eager_call()

    def run(_: None) -> None:
        twin.train(*_batch(twin.steps))

    points = sweep(lambda: None, run, lambda _, where: twin.check(where), TRAIN_FILES)
    names = {name for name, _, _ in points}
    assert {"TrainingStep.__call__", "run_mesh"} <= names, sorted(names)


def test_a_checkpoint_save_interrupted_anywhere_changes_no_state(tmp_path: Any) -> None:
    """The state is read, never changed; the directory holds exactly the
    earlier checkpoint or exactly the new one (the save is renamed into
    place whole), nothing the save staged is left beside it, and a save
    after the interrupt writes the state.  The earlier checkpoint is one
    of two processes (test_checkpoint_save.py): before, a save cut after
    its shard file left it beside the earlier metadata and the earlier
    second file, which ``load`` refused or read as a mix."""
    twin = _TrainTwin()
    twin.train(*_batch(0))
    twin.eager_call()
    target = tmp_path / "root" / "ckpt"
    checkpoint.save(twin.train, tmp_path / "first")
    old = checkpoint.read(tmp_path / "first")
    new: dict[str, torch.Tensor] = {}
    seen: set[str] = set()

    def prepare() -> None:
        twin.train(*_batch(twin.steps))  # the state moves on from the earlier checkpoint
        twin.eager_call()
        write_as_two_processes(old, target)
        checkpoint.save(twin.train, tmp_path / "fresh")
        new.clear()
        new.update(checkpoint.read(tmp_path / "fresh"))

    def run(_: None) -> None:
        checkpoint.save(twin.train, target)

    def check(_: None, where: Any) -> None:
        _check_released(twin.lock, twin.modes, where)
        twin.check_state(where, twin.train.state_dict())
        now = checkpoint.read(target)
        assert sorted(os.listdir(target.parent)) == [target.name], (where, os.listdir(target.parent))
        assert sorted(now) == sorted(old) == sorted(new), where
        if all(torch.equal(value, old[name]) for name, value in now.items()):
            seen.add("old")
        else:
            for name, value in now.items():
                assert torch.equal(value, new[name]), f"the checkpoint's {name} is a mix after {where}"
            seen.add("new")

    points = sweep(prepare, run, check, SAVE_FILES)
    assert any(name == "save" for name, _, _ in points), points
    assert seen == {"old", "new"}, seen
    # A save after the sweep's writes the state.
    twin.train(*_batch(twin.steps))
    twin.eager_call()
    checkpoint.save(twin.train, target)
    checkpoint.load(twin.train, target)
    twin.check_state("the last save", twin.train.state_dict())


def test_a_checkpoint_load_interrupted_anywhere_is_all_or_nothing(tmp_path: Any) -> None:
    """The state is the one before the load or the checkpoint's, every
    tensor of it, as eager code and the step read it; the next step
    continues from that one."""
    twin = _TrainTwin()
    twin.train(*_batch(0))
    twin.eager_call()
    target = tmp_path / "ckpt"
    checkpoint.save(twin.train, target)
    at_save = (copy.deepcopy(twin.eager.state_dict()), copy.deepcopy(twin.eager_optimizer.state_dict()), twin.steps)

    def prepare() -> None:
        twin.train(*_batch(twin.steps))  # one step past the checkpoint
        twin.eager_call()

    def run(_: None) -> None:
        checkpoint.load(twin.train, target)

    def check(_: None, where: Any) -> None:
        _check_released(twin.lock, twin.modes, where)
        device_steps, device = twin.device_steps()
        assert twin.step_count() == device_steps, where
        assert device_steps in (at_save[2], twin.steps), (where, device_steps)
        if device_steps == at_save[2]:  # loaded: eager resumes from the checkpoint
            twin.eager.load_state_dict(at_save[0])
            # A copy: torch's Adam keeps the loaded step tensors and counts in them.
            twin.eager_optimizer.load_state_dict(copy.deepcopy(at_save[1]))
            twin.steps = at_save[2]
        twin.check_state(where, device)
        batch = _batch(twin.steps)
        _close(twin.train(*batch), twin.eager_call(), f"the next step after {where}")

    points = sweep(prepare, run, check, CHECKPOINT_FILES)
    assert any(name == "load" for name, _, _ in points), points


def test_a_read_after_mesh_calls_interrupted_anywhere_loses_nothing() -> None:
    """A bare read copies what the calls left on the devices into the
    module's tensor (gathered); cut anywhere, the module reads the calls'
    values next, and the calls after continue from them.  (A mesh
    training step's reads, through its hooks, are swept by the checks of
    the sweeps above.)"""
    twin = _Twin()

    def prepare() -> None:
        twin.exe(_inputs(twin.calls), twin.out)
        twin.eager_call()

    def check(_: None, where: Any) -> None:
        _check_released(twin.lock, twin.modes, where)
        model, device = twin.model.state_dict(), twin.exe.state_dict()
        for name, value in twin.eager.state_dict().items():
            _close(model[name], value, f"{name} after {where}")
            _close(device[name], value, f"{name} (device) after {where}")

    assert sweep(prepare, lambda _: twin.model.cache * 1, check, CALL_FILES)
    twin.check("the sweep")


def _cut_as_it_returns(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """``Executable.<method>`` runs, then a Ctrl-C is delivered as it
    returns (what one checked at the return of its call raises), once."""
    real = getattr(executable_module.Executable, method)

    def cut(self: Any, *args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(executable_module.Executable, method, real)
        real(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(executable_module.Executable, method, cut)


def test_a_first_mesh_training_step_cut_as_its_program_returns_is_read_by_eager_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step's first call: the optimizer's entries have no host tensors
    a stale mark could route a read through, so only the step's own flag
    (``_host_lags``) has eager reads copy the device state in.  A Ctrl-C
    as the program's call returned skipped it: the optimizer read step 0
    and zero moments, the device held step 1."""
    twin = _TrainTwin()
    _cut_as_it_returns(monkeypatch, "__call__")
    with pytest.raises(KeyboardInterrupt):
        twin.train(*_batch(0))
    twin.check("a Ctrl-C as the first step's program returned")


def test_a_checkpoint_load_into_a_new_step_cut_as_it_returns_is_read_by_eager_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``checkpoint.load`` into a step that never ran, cut as the device
    took the checkpoint: eager code read the compile-time state."""
    saved = _TrainTwin()
    saved.train(*_batch(0))
    saved.eager_call()
    checkpoint.save(saved.train, tmp_path / "ckpt")
    twin = _TrainTwin()
    _cut_as_it_returns(monkeypatch, "load_state_dict")
    with pytest.raises(KeyboardInterrupt):
        checkpoint.load(twin.train, tmp_path / "ckpt")
    # The checkpoint's state is one step on: eager resumes from it.
    twin.eager.load_state_dict(saved.eager.state_dict())
    twin.eager_optimizer.load_state_dict(copy.deepcopy(saved.eager_optimizer.state_dict()))
    twin.steps = 1
    assert twin.step_count() == 1
    twin.check_state("a Ctrl-C as the load returned", twin.train.state_dict())
    _close(twin.train(*_batch(1)), twin.eager_call(), "the next step")


def test_a_step_load_state_dict_cut_as_the_device_took_it_loads_the_rest_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``train.load_state_dict(state)`` cut as the device took the state:
    the optimizer's hyperparameters (``param_groups``) and the host's
    lag go with it.  They were set after the device load, so the step
    went on with the new moments and the old learning rate, and eager
    code read the compile-time state."""
    saved = _TrainTwin()
    saved.train(*_batch(0))
    saved.eager_call()
    state = saved.train.state_dict()
    state["optimizer"]["param_groups"][0]["lr"] = 0.05
    twin = _TrainTwin()
    _cut_as_it_returns(monkeypatch, "load_state_dict")
    with pytest.raises(KeyboardInterrupt):
        twin.train.load_state_dict(state)
    assert twin.optimizer.param_groups[0]["lr"] == 0.05
    twin.eager.load_state_dict(saved.eager.state_dict())
    eager_state = copy.deepcopy(saved.eager_optimizer.state_dict())
    eager_state["param_groups"][0]["lr"] = 0.05
    twin.eager_optimizer.load_state_dict(eager_state)
    twin.steps = 1
    assert twin.step_count() == 1
    twin.check_state("a Ctrl-C as the load returned", twin.train.state_dict())
    _close(twin.train(*_batch(1)), twin.eager_call(), "the next step")
