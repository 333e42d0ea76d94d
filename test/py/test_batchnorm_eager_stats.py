"""A train-mode batch norm that torch runs between calls (an eager
forward, a ``torch.compile`` graph of another backend) updates the
module's ``running_mean``/``running_var`` in place without counting a
version: aten's ``native_batch_norm`` schema does not mark them written.
The next call reads them in all the same (runtime/state.py:
``_StateSlot.counted_by``: the module's ``num_batches_tracked``, which the
forward counts with ``add_``, stands in for them), as eager would, for a
training step and for a forward program, in train and eval mode.  Before,
the calls ran on the device's old statistics: ``running_mean`` off by
~0.1 after five rounds here, the eval program's output by ~4e-3.

A norm module with running statistics and no ``num_batches_tracked``
(deleted, a custom module) and ``F.batch_norm`` called on statistics a
call left stale are read in too (runtime/running_stats.py: the statistics
are compared by value at every call); before, both ran the next calls on
the device's old statistics.  ``F.batch_norm`` on statistics no call left
stale: test_batchnorm_unversioned_stats.py."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import hloalias
from hloalias.runtime import state as state_module

from test_runtime_transaction import PATHS, compile_on

TOL = 1e-5


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def _step_fn(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def _batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, 6, 6, generator=generator), torch.randn(4, 2, generator=generator)) for _ in range(count)]


def _assert_same_state(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], atol=TOL, rtol=TOL, msg=lambda m, n=name: f"{n}: {m}")


_EAGER_FORWARDS: dict[str, Callable[[torch.nn.Module, torch.Tensor], Any]] = {
    "module": lambda model, x: model(x),
    "submodule": lambda model, x: model.bn(model.conv(x)),
    "dynamo-eager": lambda model, x: torch.compile(model, backend="eager")(x),
    # Counts nothing: seen by the stale statistics' hook (running_stats.py).
    "functional": lambda model, x: F.batch_norm(
        model.conv(x), model.bn.running_mean, model.bn.running_var, training=True
    ),
}


@pytest.mark.parametrize("forward", sorted(_EAGER_FORWARDS))
@pytest.mark.parametrize("path", PATHS)
def test_eager_train_forwards_between_training_steps_are_read_in(
    forward: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch._dynamo.reset()
    reference = SmallCNN()
    model = copy.deepcopy(reference)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _batches(6)
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    reference_step = _step_fn(reference, reference_opt)
    run_eagerly = _EAGER_FORWARDS[forward]
    for x, y in batches[:3]:
        train(x, y)
        reference_step(x, y)
        with torch.no_grad():
            run_eagerly(model, x + 1)
            run_eagerly(reference, x + 1)
    for x, y in batches[3:]:
        train(x, y)
        reference_step(x, y)
    _assert_same_state(model, reference)


@pytest.mark.parametrize("path", PATHS)
def test_eager_train_forward_between_forward_program_calls_is_read_in(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = SmallCNN()
    model = copy.deepcopy(reference)
    x = torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(2))
    exe = compile_on(path, monkeypatch, model, (x,), lane=False)
    for i in range(3):
        torch.testing.assert_close(exe(x + i), reference(x + i), atol=TOL, rtol=TOL)
        with torch.no_grad():
            model(x * 2)
            reference(x * 2)
    torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
    _assert_same_state(model, reference)


@pytest.mark.parametrize("path", PATHS)
def test_eval_program_reads_statistics_of_eager_training(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = SmallCNN().eval()
    model = copy.deepcopy(reference)
    x = torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(3))
    exe = compile_on(path, monkeypatch, model, (x,), lane=False)
    for i in range(3):
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
        model.train()
        reference.train()
        with torch.no_grad():
            model(x * 2 + i)
            reference(x * 2 + i)
        model.eval()
        reference.eval()
    torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)


def test_statistics_are_not_uploaded_again_without_an_eager_train_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads that bring the state in (an eval-mode eager forward,
    ``state_dict()``) count ``num_batches_tracked`` through a copy, not as
    torch's write: the next steps upload nothing."""
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _batches(4)
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    refreshed: list[str] = []
    original = state_module._StateSlot.refresh_from_torch

    def counting(slot: state_module._StateSlot, name: str) -> None:
        refreshed.append(name)
        original(slot, name)

    monkeypatch.setattr(state_module._StateSlot, "refresh_from_torch", counting)
    for x, y in batches:
        train(x, y)
        model.eval()
        with torch.no_grad():
            model(x)
        model.train()
        model.state_dict()
    assert refreshed == []
    # And an eager train-mode forward uploads the statistics it changed.
    with torch.no_grad():
        model(batches[0][0])
    train(*batches[0])
    assert sorted(refreshed) == sorted(  # named as the module holds them
        f"bn.{name}" for name in ("num_batches_tracked", "running_mean", "running_var")
    )


class _CustomNorm(torch.nn.Module):
    """Running statistics and no ``num_batches_tracked``."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, training=self.training, momentum=0.2)


class _Uncounted(torch.nn.Module):
    def __init__(self, custom: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(6, 4)
        if custom:
            self.bn: torch.nn.Module = _CustomNorm(4)
        else:
            self.bn = torch.nn.BatchNorm1d(4)
            self.bn.num_batches_tracked = None
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.fc(x))))


_UNCOUNTED_FORWARDS: dict[str, Callable[[torch.nn.Module, torch.Tensor], Any]] = {
    "module": lambda model, x: model(x),
    "submodule": lambda model, x: model.bn(model.fc(x)),
    "dynamo-eager": lambda model, x: torch.compile(model, backend="eager")(x),
    "functional": lambda model, x: F.batch_norm(
        model.fc(x), model.bn.running_mean, model.bn.running_var, training=True
    ),
}


def _uncounted_batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=generator), torch.randn(8, 2, generator=generator)) for _ in range(count)]


@pytest.mark.parametrize("custom", [False, True], ids=["no-counter", "custom-norm"])
@pytest.mark.parametrize("forward", sorted(_UNCOUNTED_FORWARDS))
@pytest.mark.parametrize("path", PATHS)
def test_uncounted_statistics_updated_between_training_steps_are_read_in(
    custom: bool, forward: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``running_mean`` off by ~0.1 after the steps that followed."""
    torch._dynamo.reset()
    reference = _Uncounted(custom)
    model = copy.deepcopy(reference)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _uncounted_batches(4)
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    reference_step = _step_fn(reference, reference_opt)
    run_eagerly = _UNCOUNTED_FORWARDS[forward]
    for x, y in batches[:2]:
        train(x, y)
        reference_step(x, y)
        with torch.no_grad():
            run_eagerly(model, x + 1)
            run_eagerly(reference, x + 1)
    for x, y in batches[2:]:
        train(x, y)
        reference_step(x, y)
    _assert_same_state(model, reference)


@pytest.mark.parametrize("custom", [False, True], ids=["no-counter", "custom-norm"])
@pytest.mark.parametrize("path", PATHS)
def test_eval_program_reads_uncounted_statistics_of_eager_training(
    custom: bool, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the eval program's output off by ~5e-2."""
    reference = _Uncounted(custom).eval()
    model = copy.deepcopy(reference)
    x = _uncounted_batches(1)[0][0]
    exe = compile_on(path, monkeypatch, model, (x,), lane=False)
    for i in range(2):
        torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)
        for m in (model, reference):
            m.train()
            with torch.no_grad():
                m(x * 2 + i)
            m.eval()
    torch.testing.assert_close(exe(x), reference(x), atol=TOL, rtol=TOL)


def test_uncounted_statistics_need_no_hook() -> None:
    """A module without a counter gets no hook (its statistics are compared
    by value), and an eval-mode eager forward uploads nothing."""
    model = _Uncounted(custom=False).eval()
    x = _uncounted_batches(1)[0][0]
    exe = hloalias.compile(model, (x,))
    again = hloalias.compile(model, (x,))
    assert len(model.bn._forward_pre_hooks) == 0
    torch.testing.assert_close(exe(x), again(x))
    with torch.no_grad():
        model(x)  # eval: nothing to read in
    refreshed: list[str] = []
    original = state_module._StateSlot.refresh_from_torch
    try:
        state_module._StateSlot.refresh_from_torch = lambda slot, name: (refreshed.append(name), original(slot, name))[1]  # type: ignore[method-assign]
        exe(x)
    finally:
        state_module._StateSlot.refresh_from_torch = original  # type: ignore[method-assign]
    assert refreshed == []
