"""A batch norm that torch runs in train mode updates its running
statistics in place without counting a version (``F.batch_norm(x, rm, rv,
training=True)``, ``torch.batch_norm``, ``torch.native_batch_norm``,
``aten._native_batch_norm_legit``, ``aten._batch_norm_with_update``: their
``_version`` stays).  Called eagerly on statistics that no call left stale
(those of an eval-mode forward program, or ones eager code read since the
last call), nothing that hloalias hooks runs: the next call must still read
the new statistics, as eager would.  runtime/running_stats.py: the state a
program feeds to a batch norm, whatever its name, and every
``running_mean``/``running_var`` is compared by value at every call.

Before, the next call ran on the device's old statistics (the eval
program's output off by ~4e-2 here, the statistics after a training step
by ~0.1); a module without ``num_batches_tracked`` kept a forward pre-hook
of hloalias's through ``torch.save(model)``, so loading the pickle needed
hloalias installed."""

from __future__ import annotations

import copy
import io
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import hloalias
from hloalias.runtime import state as state_module
from interrupt_points import sweep
from test_runtime_transaction import PATHS, compile_on

TOL = 1e-5
MOMENTUM = 0.5

aten = torch.ops.aten

#: Each way of running a train-mode batch norm on given statistics in place.
UPDATES: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]] = {
    "F.batch_norm": lambda x, rm, rv: F.batch_norm(x, rm, rv, training=True, momentum=MOMENTUM),
    "torch.batch_norm": lambda x, rm, rv: torch.batch_norm(x, None, None, rm, rv, True, MOMENTUM, 1e-5, False),
    "torch.native_batch_norm": lambda x, rm, rv: torch.native_batch_norm(x, None, None, rm, rv, True, MOMENTUM, 1e-5),
    "aten._native_batch_norm_legit": lambda x, rm, rv: aten._native_batch_norm_legit(
        x, None, None, rm, rv, True, MOMENTUM, 1e-5
    ),
    "aten._batch_norm_with_update": lambda x, rm, rv: aten._batch_norm_with_update(
        x, None, None, rm, rv, MOMENTUM, 1e-5
    ),
}


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.bn.running_mean, self.bn.running_var


class _NamedNorm(torch.nn.Module):
    """Statistics under other names, fed to ``F.batch_norm``; no counter."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.register_buffer("mu", torch.zeros(features))
        self.register_buffer("sigma2", torch.ones(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.mu, self.sigma2, training=self.training, momentum=0.2)


class NamedStatsCNN(SmallCNN):
    def __init__(self) -> None:
        super().__init__()
        self.bn = _NamedNorm(4)  # type: ignore[assignment]

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.bn.mu, self.bn.sigma2  # type: ignore[return-value]


MODELS: dict[str, Callable[[], SmallCNN]] = {"running_mean": SmallCNN, "other-names": NamedStatsCNN}


def _x(seed: int) -> torch.Tensor:
    return torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(seed))


def _update_eagerly(model: SmallCNN, update: str, x: torch.Tensor) -> None:
    with torch.no_grad():
        UPDATES[update](model.conv(x), *model.stats())


@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("path", PATHS)
def test_eval_program_reads_statistics_updated_without_a_version(
    update: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the calls after each update off by ~4e-2."""
    reference = SmallCNN().eval()
    model = copy.deepcopy(reference)
    x = _x(1)
    exe = compile_on(path, monkeypatch, model, (x,))
    for i in range(3):
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
        versions = [t._version for t in model.stats()]
        for m in (model, reference):
            _update_eagerly(m, update, x * 2 + i)
        assert [t._version for t in model.stats()] == versions  # torch counted nothing
    torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)


@pytest.mark.parametrize("model_kind", sorted(MODELS))
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_statistics_under_any_name_read_in(
    model_kind: str, path: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward program in either mode; before each update eager code
    reads the statistics (so a train-mode program's calls left nothing
    stale).  Before: off by ~4e-2 (eval), the statistics by ~0.1 (train)."""
    reference = MODELS[model_kind]()
    getattr(reference, mode)()
    model = copy.deepcopy(reference)
    x = _x(2)
    exe = compile_on(path, monkeypatch, model, (x,), lane=False)
    for i in range(3):
        with torch.no_grad():
            torch.testing.assert_close(exe(x + i), reference(x + i), atol=TOL, rtol=TOL)
        for ours, theirs in zip(model.stats(), reference.stats()):
            torch.testing.assert_close(ours * 1, theirs, atol=TOL, rtol=TOL)  # a read: nothing stale now
        for m in (model, reference):
            _update_eagerly(m, "F.batch_norm", x * 2 + i)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[name], atol=TOL, rtol=TOL, msg=name)


def _step_fn(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


@pytest.mark.parametrize("path", PATHS)
def test_training_step_reads_statistics_updated_after_a_read(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``state_dict()`` brings the steps' statistics in (they agree), then
    eager ``F.batch_norm`` updates them uncounted.  Before: the statistics
    after the next steps off by ~0.1."""
    reference = SmallCNN()
    model = copy.deepcopy(reference)
    opt, reference_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    y = torch.randn(4, 2, generator=torch.Generator().manual_seed(3))
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, (_x(3), y))
    reference_step = _step_fn(reference, reference_opt)
    for i in range(3):
        train(_x(3 + i), y)
        reference_step(_x(3 + i), y)
        model.state_dict()
        for m in (model, reference):
            _update_eagerly(m, "F.batch_norm", _x(10 + i))
    train(_x(3), y)
    reference_step(_x(3), y)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, reference.state_dict()[name], atol=TOL, rtol=TOL, msg=name)


def test_no_upload_without_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compare reads nothing in when the statistics are unchanged:
    reads that copy the calls' values in (``state_dict()``, a bare read)
    leave the tensor equal to the snapshot."""
    model = SmallCNN()
    x = _x(4)
    exe = hloalias.compile(model, (x,))
    refreshed: list[str] = []
    original = state_module._StateSlot.refresh_from_torch

    def counting(slot: state_module._StateSlot, name: str) -> None:
        refreshed.append(name)
        original(slot, name)

    monkeypatch.setattr(state_module._StateSlot, "refresh_from_torch", counting)
    for _ in range(3):
        with torch.no_grad():
            exe(x)
        model.state_dict()
        exe(x)
        model.bn.running_var.sum()
        model.bn.running_mean.sum()  # both read: neither is stale
    assert refreshed == []
    _update_eagerly(model, "torch.batch_norm", x)
    exe(x)
    assert sorted(refreshed) == ["bn.running_mean", "bn.running_var"]


class _Uncounted(torch.nn.Module):
    """A norm module without ``num_batches_tracked``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(6, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.bn.num_batches_tracked = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x))


_LOAD_WITHOUT_HLOALIAS = """
import io, sys, types, torch
sys.modules["hloalias"] = None  # not importable
# The model's class, without this test module (which imports hloalias).
tests = sys.modules[sys.argv[1]] = types.ModuleType(sys.argv[1])
tests._Uncounted = type("_Uncounted", (torch.nn.Module,), {"__module__": sys.argv[1]})
model = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=False)
print(type(model).__name__, len(model.bn._forward_pre_hooks))
"""


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_saved_model_loads_without_hloalias(mode: str) -> None:
    """Before: the forward pre-hook on the counter-less norm module was
    pickled by reference to hloalias (``ModuleNotFoundError`` on load)."""
    model = _Uncounted()
    getattr(model, mode)()
    x = torch.randn(8, 6)
    exe = hloalias.compile(model, (x,))
    with torch.no_grad():
        exe(x)
    assert not any(
        getattr(hook, "__module__", "").startswith("hloalias")
        for module in model.modules() if module is not model
        for hook in module._forward_pre_hooks.values()
    )
    buffer = io.BytesIO()
    torch.save(model, buffer)
    loaded = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_HLOALIAS, __name__], input=buffer.getvalue(), capture_output=True, timeout=300
    )
    assert loaded.returncode == 0, loaded.stderr.decode()[-2000:]
    assert loaded.stdout.decode().split() == ["_Uncounted", "0"]


# -- Ctrl-C -------------------------------------------------------------------------

FILES = {state_module.__file__}


@pytest.mark.parametrize("path", PATHS)
def test_a_call_interrupted_anywhere_still_reads_the_update(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that finds the statistics changed, interrupted at any point
    of runtime/state.py: the next call still reads them (an upload may be
    repeated, none is missed)."""
    reference = SmallCNN().eval()
    model = copy.deepcopy(reference)
    x = _x(5)
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    rounds = [0]

    def prepare() -> None:
        rounds[0] += 1
        for m in (model, reference):
            _update_eagerly(m, "F.batch_norm", x * 2 + rounds[0])

    def check(_: None, where: Any) -> None:
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL, msg=lambda m: f"{m} after {where}")

    points = sweep(prepare, lambda _: exe(x), check, FILES)
    assert any("refresh_from_torch" in name for name, _, _ in points), points


def test_a_read_interrupted_anywhere_then_updated_is_read_in() -> None:
    """A train-mode program's statistics lag; a read that copies them in
    (``state_dict()``) is interrupted at any point of runtime/state.py,
    then eager ``F.batch_norm`` updates them: the next call reads the
    update, whether the read finished or not."""
    reference = SmallCNN().train()
    model = copy.deepcopy(reference)
    x = _x(6)
    exe = hloalias.compile(model, (x,))
    rounds = [0]

    def prepare() -> None:
        rounds[0] += 1
        with torch.no_grad():
            exe(x)
            reference(x)

    def check(_: None, where: Any) -> None:
        for m in (model, reference):
            _update_eagerly(m, "F.batch_norm", x * 2 + rounds[0])
        with torch.no_grad():
            torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL, msg=lambda m: f"{m} after {where}")
        for name, value in model.state_dict().items():
            torch.testing.assert_close(
                value, reference.state_dict()[name], atol=TOL, rtol=TOL, msg=lambda m, n=name: f"{n}: {m} after {where}"
            )

    points = sweep(prepare, lambda _: model.state_dict(), check, FILES)
    assert any("_record_snapshot" in name for name, _, _ in points), points
