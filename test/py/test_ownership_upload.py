"""Owned uploads are finished when they return (runtime/ownership.py
``owned_upload``): the copy into PJRT's buffer has completed and PJRT
holds no reference to the caller's memory, so the caller may write its
tensor at once without changing the uploaded value.

PJRT's copies are asynchronous (on CPU a large one runs on the worker
thread); before the fix ``d = to_device(t); t.add_(1)`` uploaded the
incremented values in most runs.  These tests write right after each
upload, for small and large tensors, several times each: on the old code
at least one of the large uploads read the written values (the checks do
not depend on timing: on the fixed code every one holds whatever the
machine's load)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.runtime.ownership import torch_to_device
from hloalias.runtime.pjrt import device_for

# Elements: 16 floats, 1 MiB, 16 MiB and 64 MiB of float32.
SIZES = [16, 1 << 18, 1 << 22, 1 << 24]
REPEATS = 3


def _sizes_and_repeats() -> list[tuple[int, int]]:
    # The 64 MiB size once (its uploads dominate the file's time).
    return [(size, 1 if size == SIZES[-1] else REPEATS) for size in SIZES]


def _pattern(numel: int) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.float32) % 251


@pytest.mark.parametrize("numel,repeats", _sizes_and_repeats())
def test_to_device_keeps_the_value_it_was_given(numel: int, repeats: int) -> None:
    for _ in range(repeats):
        tensor = _pattern(numel)
        want = tensor.clone()
        on_device = hloalias.to_device(tensor)
        tensor.add_(1)  # at once: the upload must not see this
        assert torch.equal(on_device.to_torch(), want)


def test_owned_upload_is_ready_and_holds_no_reference_to_the_source() -> None:
    device = device_for(None)
    for _ in range(REPEATS):
        tensor = _pattern(SIZES[-2])
        users = tensor._use_count()
        array = torch_to_device(tensor, device, owned=True)
        # Both checked at once, without waiting: the upload itself waited.
        assert array.is_ready()
        assert tensor._use_count() == users, "PJRT still holds an import of the caller's tensor"


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _executables(monkeypatch: pytest.MonkeyPatch, fn: Callable[..., Any], example: tuple[Any, ...]) -> list[Any]:
    """``fn`` compiled for the native call path (where built) and for the
    Python path (``HLOALIAS_NATIVE=0``)."""
    native = hloalias.compile(fn, example)
    with monkeypatch.context() as patch:
        patch.setenv("HLOALIAS_NATIVE", "0")
        python = hloalias.compile(fn, example)
    assert python._lane is None
    return [native, python]


@pytest.mark.parametrize("numel,repeats", _sizes_and_repeats())
def test_executable_to_device_keeps_the_value_on_both_call_paths(
    monkeypatch: pytest.MonkeyPatch, numel: int, repeats: int,
) -> None:
    example = (torch.zeros(numel),)
    for exe in _executables(monkeypatch, _double, example):
        for _ in range(repeats):
            tensor = _pattern(numel)
            want = tensor * 2
            on_device = exe.to_device(tensor, "x")
            tensor.add_(1)
            assert torch.equal(exe(on_device), want)


class _BigBuffer(torch.nn.Module):
    def __init__(self, numel: int) -> None:
        super().__init__()
        self.register_buffer("big", _pattern(numel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.big[:4]


def test_compile_time_state_upload_is_finished_on_both_call_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    # The module's state is uploaded when it is compiled; a process that
    # exited with that (64 MiB) copy in flight could abort in PJRT's teardown.
    module = _BigBuffer(SIZES[-1])
    users = module.big._use_count()
    for exe in _executables(monkeypatch, module, (torch.zeros(4),)):
        assert module.big._use_count() == users, "PJRT still holds an import of the module's buffer"
        assert torch.equal(exe(torch.zeros(4)), module.big[:4])


def test_training_step_to_device_keeps_the_value() -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    rows = SIZES[-2] // 4
    train = hloalias.compile_training_step(step, model, optimizer, (torch.zeros(rows, 4), torch.zeros(rows, 1)))
    for _ in range(REPEATS):
        tensor = _pattern(SIZES[-2]).view(rows, 4)
        want = tensor.clone()
        on_device = train.to_device(tensor, "x")
        tensor.add_(1)
        assert torch.equal(on_device.to_torch(), want)
