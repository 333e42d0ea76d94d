"""A Ctrl-C at any point of the state store (runtime/state.py) during a
call, a read or a write-back keeps the keep-alive of lagging slots whole
(``_keep_alive_while_lagging``): a slot whose buffer holds a value its
tensor does not is kept by that tensor (so a dropped program loses no
state) and marks it stale (so a read copies it in), and a slot that
agrees with its tensor is not kept (nothing leaks).  The module's state
after each interrupt is the one before the interrupted operation or the
one after it, the same seen from the module and from the program, and a
program dropped afterwards leaves the module every call's update.

Deterministic: the interrupt is delivered at the k-th point where Python
checks for signals in runtime/state.py (and in the write-backs), for
every k, by calling the SIGINT handler as Python does
(test/py/interrupt_points.py)."""

from __future__ import annotations

import copy
import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.runtime import executable as executable_module, state, training as training_module
from interrupt_points import sweep

FILES = {state.__file__}
#: Reads and write-backs: with the write-backs' own code.
READ_FILES = FILES | {executable_module.__file__, training_module.__file__}
PATHS = ["native", "python"]


class _Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n += 1
        return x + self.n


def _kept(tensor: torch.Tensor) -> list[Any]:
    return list(state._KEPT_WHILE_LAGGING.get(tensor) or ())  # type: ignore[no-untyped-call]


def _check_kept(slot: Any, where: Any, read: bool = False) -> None:
    """A lagging slot is kept by its tensor, which is marked stale; no slot
    is kept twice.  One that agrees with its tensor is not kept once the
    tensor was ``read`` (right after an interrupt it may be, with its
    tensor marked stale: the next read lets it go)."""
    tensor = slot.source()
    kept = _kept(tensor)
    assert len({id(s) for s in kept}) == len(kept), where
    held = any(s is slot for s in kept)
    if slot.lags:
        assert held, f"a lagging slot not kept alive (its state is lost with the program) after {where}"
        assert state.is_stale(tensor), f"a lagging slot's tensor not marked stale (a read is stale) after {where}"
    elif read:
        assert not held, f"a slot that agrees with its tensor still kept alive after a read (a leak) after {where}"
    elif held:
        assert state.is_stale(tensor), f"a slot kept that its tensor's next read would not let go (a leak) after {where}"


def _compile(path: str, monkeypatch: pytest.MonkeyPatch, *args: Any) -> hloalias.Executable:
    with monkeypatch.context() as patch:
        patch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
        return hloalias.compile(*args)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("start", ["agreeing", "lagging"])
def test_a_call_interrupted_anywhere_keeps_the_lagging_state(
    path: str, start: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``start``: the call finds the slot agreeing with its tensor (it
    starts lagging in this call) or lagging already."""
    counter = _Counter()
    exe = _compile(path, monkeypatch, counter, (torch.zeros(2),))
    slot = exe._slots["n"]
    done = [0.0]

    def prepare() -> float:
        if start == "agreeing":
            done[0] = float(counter.n)  # a read: the slot agrees with the tensor
        else:
            exe(torch.zeros(2))
            done[0] += 1
        assert slot.lags == (start == "lagging")
        return done[0]

    def check(before: float, where: Any) -> None:
        _check_kept(slot, where)
        seen = exe.state_dict()["n"].item()
        assert seen in (before, before + 1), (where, before, seen)
        _check_kept(slot, where)
        read = float(counter.n)  # a bare read of the module's tensor
        assert read == seen, f"the module reads {read}, the program {seen}, after {where}"
        _check_kept(slot, where, read=True)
        done[0] = read

    points = sweep(prepare, lambda _: exe(torch.zeros(2)), check, FILES)
    assert any(name.endswith("_set_lags") for name, _, _ in points) == (start == "agreeing"), points
    # Dropped now, the program leaves the module its last value and goes.
    exe(torch.zeros(2))
    slot_ref = weakref.ref(slot)
    del exe, slot
    gc.collect()
    assert slot_ref() is not None  # kept by the lagging tensor
    assert counter.n.item() == done[0] + 1
    gc.collect()
    assert slot_ref() is None and not _kept(counter.n)


@pytest.mark.parametrize("read", ["bare", "state_dict", "write_back", "eager_forward"])
def test_a_read_interrupted_anywhere_keeps_the_lagging_state(read: str) -> None:
    counter = _Counter()
    exe = hloalias.compile(counter, (torch.zeros(2),))
    slot = exe._slots["n"]
    done = [0.0]
    reads: dict[str, Callable[[], Any]] = {
        "bare": lambda: counter.n.sum(),
        "state_dict": counter.state_dict,
        "write_back": exe.write_back,
        "eager_forward": lambda: counter(torch.zeros(2)),
    }

    def prepare() -> float:
        exe(torch.zeros(2))
        done[0] += 1
        assert slot.lags
        return done[0]

    def check(after_call: float, where: Any) -> None:
        _check_kept(slot, where)
        # An eager forward that ran counts one more (eager's own update).
        value = float(counter.n)
        assert value in (after_call, after_call + 1), (where, after_call, value)
        _check_kept(slot, where, read=True)
        assert exe.state_dict()["n"].item() == value, where
        done[0] = value

    points = sweep(prepare, lambda _: reads[read](), check, READ_FILES)
    assert points
    exe(torch.zeros(2))
    del exe, slot
    gc.collect()
    assert counter.n.item() == done[0] + 1


def _step_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@pytest.mark.parametrize("read", ["write_back", "bare"])
def test_a_training_write_back_interrupted_anywhere_keeps_the_lagging_state(read: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 3)
    train = hloalias.compile_training_step(_step_of(model, opt), model, opt, (x,))
    eager_step = _step_of(eager, eager_opt)
    slots = list(train.executable._slots.values())

    def prepare() -> None:
        train(x)
        eager_step(x)

    def run(_: None) -> None:
        if read == "write_back":
            train.write_back()
        else:
            model.weight.sum()

    def check(_: None, where: Any) -> None:
        for slot in slots:
            if slot.source() is not None:
                _check_kept(slot, where)
        for got, want in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(got, want, msg=lambda m: f"{where}: {m}")
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(opt.state[p]["momentum_buffer"], eager_opt.state[q]["momentum_buffer"])
        for slot in slots:  # the reads left every slot whole too
            if slot.source() is not None:
                _check_kept(slot, where, read=slot.grad_of is None)

    assert sweep(prepare, run, check, READ_FILES)
    train(x)
    eager_step(x)
    del train, slots
    gc.collect()
    for got, want in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(got, want)
