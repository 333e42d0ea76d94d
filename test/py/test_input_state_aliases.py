"""A caller's input that shares memory with the state a program holds,
where the program writes one of them (``Executable._check_state_aliases``).

Eager has each see the other's update: ``a.mul_(2)`` on ``a = m.bias``
then ``m(x)`` reads the doubled bias; a buffer the program updates and
then an input viewing it reads the update.  The program reads each from
a buffer of its own, so before, such a call returned eager's value before
the write, silently (off by up to 0.34 in the lead's run).  It is refused
now, naming both, as two inputs sharing written memory are; read-only
sharing stays allowed."""

from __future__ import annotations

import copy

import pytest
import torch

import hloalias
from hloalias.errors import ExecutionError

PATHS = ("native", "python")


class Counter(torch.nn.Module):
    """Adds ``x`` into a buffer and returns ``x`` times it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x)
        return x * self.total


@pytest.mark.parametrize("path", PATHS)
def test_an_input_written_in_place_that_is_a_closed_over_parameter_is_refused(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    model = torch.nn.Linear(4, 4)

    def double_then_run(a: torch.Tensor) -> torch.Tensor:
        a.mul_(2)
        return model(torch.ones(1, 4))

    exe = hloalias.compile(double_then_run, (torch.ones(4),))
    before = model.bias.detach().clone()
    with torch.no_grad(), pytest.raises(ExecutionError, match="input 'a' shares memory with a tensor the function reads"):
        exe(model.bias)
    torch.testing.assert_close(model.bias.detach(), before, rtol=0, atol=0)  # nothing ran
    with torch.no_grad():
        exe(model.bias.clone())  # separate memory runs


@pytest.mark.parametrize("path", PATHS)
def test_an_input_viewing_a_buffer_the_program_writes_is_refused(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    model = Counter()
    exe = hloalias.compile(model, (torch.ones(4),))
    exe(torch.ones(4))
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ExecutionError, match="input 'x' shares memory with module state 'total' and the program writes that"):
        exe(model.total)
    with pytest.raises(ExecutionError, match="module state 'total'"):
        exe(model.total.view(2, 2).view(4))  # a view of it
    torch.testing.assert_close(model.state_dict()["total"], state["total"], rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_sharing_that_nothing_writes_runs_as_eager(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    model = torch.nn.Linear(4, 4)
    exe = hloalias.compile(lambda a: model(a.unsqueeze(0)), (torch.ones(4),))
    with torch.no_grad():
        torch.testing.assert_close(exe(model.bias), model(model.bias.unsqueeze(0)))


def test_a_replaced_buffer_is_checked_under_its_new_memory() -> None:
    model = Counter()
    exe = hloalias.compile(model, (torch.ones(4),))
    exe(torch.ones(4))
    old = model.total
    model.total = torch.zeros(4)
    with pytest.raises(ExecutionError, match="module state 'total'"):
        exe(model.total)
    exe(old)  # no longer the state: its memory is the caller's own


class Halves(torch.nn.Module):
    """Two buffers in one storage (views of one tensor); the program writes
    the first only, and the second is registered (and so listed) after it."""

    def __init__(self) -> None:
        super().__init__()
        whole = torch.zeros(8)
        self.register_buffer("a", whole[:4])
        self.register_buffer("b", whole[4:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.a.add_(x)
        return x * self.a + self.b


@pytest.mark.parametrize("path", PATHS)
def test_a_written_buffer_sharing_a_storage_with_a_read_one_is_seen(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The storage is written when any state tensor in it is: before, the
    entry of the last one listed ('b', read only) hid the write of 'a', and
    ``exe(m.a)`` ran on a copy, silently (eager: the add doubles ``x`` too)."""
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    model = Halves()
    exe = hloalias.compile(model, (torch.ones(4),))
    exe(torch.ones(4))
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ExecutionError, match="input 'x' shares memory with module state 'a' and the program writes that"):
        exe(model.a)
    with pytest.raises(ExecutionError, match="module state 'a'"):
        exe(model.b)  # the other half: the same storage, which the program writes
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0)
