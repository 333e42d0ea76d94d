"""In-place edits of ``optimizer.state`` between calls of a compiled
training step (``opt.state[p]["exp_avg"].zero_()``, a scheduler-like
``exp_avg_sq.mul_(0.5)``): the next call reads them, as eager's next
step does.  ``write_back()`` (and ``optimizer.state_dict()``) copy the
device state into the optimizer's own tensors in place, so they stay the
objects the user holds and edits of them are seen.  Before the fix the
edits were silently lost (write_back put new tensors into
``optimizer.state``; the device state never looked at them).

Three steps with an edit after the first; parameters and optimizer state
equal eager's to 1e-6 (rounding only)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias

TOL = 1e-6


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def _step_fn(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def _batches(count: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 4, generator=generator), torch.randn(5, 2, generator=generator)) for _ in range(count)]


def _edit_adam(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    first, last = list(model.parameters())[0], list(model.parameters())[-1]
    with torch.no_grad():
        optimizer.state[first]["exp_avg"].zero_()
        optimizer.state[first]["exp_avg_sq"].mul_(0.5)
        optimizer.state[last]["exp_avg"].add_(0.25)


def _assert_equal(
    eager_model: torch.nn.Module, eager_opt: torch.optim.Optimizer, model: torch.nn.Module, opt: torch.optim.Optimizer
) -> None:
    for (name, value), expected in zip(model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(value.detach(), expected.detach(), rtol=TOL, atol=TOL, msg=name)
    for index, (p, eager_p) in enumerate(zip(model.parameters(), eager_model.parameters())):
        assert opt.state[p].keys() == eager_opt.state[eager_p].keys()
        for key, expected in eager_opt.state[eager_p].items():
            torch.testing.assert_close(opt.state[p][key], expected, rtol=TOL, atol=TOL, msg=f"{index}.{key}")


def _pair(make: Callable[..., torch.optim.Optimizer]) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.nn.Module, torch.optim.Optimizer]:
    eager_model, model = _model(), _model()
    return eager_model, make(eager_model.parameters()), model, make(model.parameters())


ADAM = lambda p: torch.optim.Adam(p, lr=1e-2)  # noqa: E731


def _both_step(
    train: Callable[..., torch.Tensor], eager_model: torch.nn.Module, eager_opt: torch.optim.Optimizer,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """The eager step and the compiled one on each batch."""
    for batch in batches:
        _step_fn(eager_model, eager_opt)(*batch)
        train(*batch)


def test_an_edit_after_write_back_is_read_by_the_next_call() -> None:
    eager_model, eager_opt, model, opt = _pair(ADAM)
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _step_fn(eager_model, eager_opt)(*batches[0])
    train(*batches[0])
    train.write_back()
    first = list(model.parameters())[0]
    held = opt.state[first]["exp_avg"]
    _edit_adam(eager_opt, eager_model)
    _edit_adam(opt, model)
    for batch in batches[1:3]:
        _step_fn(eager_model, eager_opt)(*batch)
        train(*batch)
    train.write_back()
    # The same tensor object, holding the trained value.
    assert opt.state[first]["exp_avg"] is held
    _assert_equal(eager_model, eager_opt, model, opt)


def test_an_edit_of_state_the_optimizer_had_at_compile_time_is_read() -> None:
    """Warmed optimizer (state before compiling): the slots stand for its
    tensors from the start, so an edit before the first write_back counts."""
    make = lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True)  # noqa: E731
    eager_model, eager_opt, model, opt = _pair(make)
    batches = _batches()
    for m, o in ((eager_model, eager_opt), (model, opt)):
        _step_fn(m, o)(*batches[0])
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _edit_adam(eager_opt, eager_model)
    _edit_adam(opt, model)
    for batch in batches[1:4]:
        _step_fn(eager_model, eager_opt)(*batch)
        train(*batch)
    train.write_back()
    _assert_equal(eager_model, eager_opt, model, opt)


def test_an_edit_after_optimizer_state_dict_is_read() -> None:
    """``optimizer.state_dict()`` copies the device state in first (no
    write_back): into the same tensors, which are then edited."""
    eager_model, eager_opt, model, opt = _pair(ADAM)
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _step_fn(eager_model, eager_opt)(*batches[0])
    train(*batches[0])
    checkpoint = opt.state_dict()
    first = list(model.parameters())[0]
    assert checkpoint["state"][0]["exp_avg"] is opt.state[first]["exp_avg"]
    _edit_adam(eager_opt, eager_model)
    _edit_adam(opt, model)
    for batch in batches[1:3]:
        _step_fn(eager_model, eager_opt)(*batch)
        train(*batch)
    train.write_back()
    _assert_equal(eager_model, eager_opt, model, opt)


def test_an_edit_of_tensors_loaded_by_optimizer_load_state_dict_is_read() -> None:
    eager_model, eager_opt, model, opt = _pair(ADAM)
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _step_fn(eager_model, eager_opt)(*batches[0])
    train(*batches[0])
    saved = {k: v for k, v in eager_opt.state_dict().items()}
    saved["state"] = {i: {k: v.clone() for k, v in s.items()} for i, s in saved["state"].items()}
    opt.load_state_dict(saved)  # the post-hook loads the device state
    _edit_adam(eager_opt, eager_model)
    _edit_adam(opt, model)
    for batch in batches[1:3]:
        _step_fn(eager_model, eager_opt)(*batch)
        train(*batch)
    train.write_back()
    _assert_equal(eager_model, eager_opt, model, opt)


def test_sgd_momentum_buffer_scaled_between_calls() -> None:
    make = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    eager_model, eager_opt, model, opt = _pair(make)
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _step_fn(eager_model, eager_opt)(*batches[0])
    train(*batches[0])
    train.write_back()
    for m, o in ((eager_model, eager_opt), (model, opt)):
        with torch.no_grad():
            for p in m.parameters():
                o.state[p]["momentum_buffer"].mul_(0.1)
    for batch in batches[1:3]:
        _step_fn(eager_model, eager_opt)(*batch)
        train(*batch)
    train.write_back()
    _assert_equal(eager_model, eager_opt, model, opt)


@pytest.mark.parametrize("write_back", [True, False], ids=["write_back", "no_edit"])
def test_reading_state_after_steps_equals_eager(write_back: bool) -> None:
    """Without edits, the state read after write_back equals eager's (and
    a second write_back leaves the same objects)."""
    eager_model, eager_opt, model, opt = _pair(ADAM)
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    for batch in batches[:3]:
        _step_fn(eager_model, eager_opt)(*batch)
        train(*batch)
        if write_back:
            train.write_back()
    train.write_back()
    held = {id(t) for s in opt.state.values() for t in s.values()}
    train.write_back()
    assert held == {id(t) for s in opt.state.values() for t in s.values()}
    _assert_equal(eager_model, eager_opt, model, opt)


def test_an_eager_step_between_compiled_calls_continues_the_device_state() -> None:
    """An eager ``optimizer.step()`` between calls first gets the state
    the steps left (the optimizer's step pre-hook), updates it in place,
    and the next call reads that.  Before: eager Adam started from empty
    state (step 1 again) and the compiled step never saw its update."""
    eager_model, eager_opt, model, opt = _pair(ADAM)
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _step_fn(eager_model, eager_opt)(*batches[0])
    train(*batches[0])
    _step_fn(eager_model, eager_opt)(*batches[1])
    _step_fn(model, opt)(*batches[1])  # eager, between compiled calls
    _step_fn(eager_model, eager_opt)(*batches[2])
    train(*batches[2])
    train.write_back()
    _assert_equal(eager_model, eager_opt, model, opt)


def _replace_state(edit: str, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    first = list(model.parameters())[0]
    if edit == "clear":
        optimizer.state.clear()
    elif edit == "new_state_dict_object":
        optimizer.state = collections.defaultdict(dict)
    elif edit == "one_parameter_afresh":
        optimizer.state[first] = {}
    elif edit == "one_entry":
        optimizer.state[first]["exp_avg"] = torch.full_like(first, 0.125)
    elif edit == "step_count":
        optimizer.state[first]["step"] = torch.tensor(1.0)


@pytest.mark.parametrize(
    "edit", ["clear", "new_state_dict_object", "one_parameter_afresh", "one_entry", "step_count"]
)
@pytest.mark.parametrize("write_back_first", [False, True], ids=["lagging", "written_back"])
def test_state_eager_code_replaced_between_calls_is_read(edit: str, write_back_first: bool) -> None:
    """Eager code puts new state in place of the optimizer's between calls
    (resetting Adam's moments, ``optimizer.state.clear()`` for a warm
    restart): the next call starts from it, as eager's next step does, and
    the entries nobody replaced go on from the device.  Before, only
    in-place edits were read: calls went on from the old moments and step
    counts (and ``optimizer.state`` was empty after calls, so
    ``opt.state[p]["exp_avg"]`` raised KeyError where eager has it)."""
    eager_model, eager_opt, model, opt = _pair(ADAM)
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _both_step(train, eager_model, eager_opt, batches[:2])
    if write_back_first:
        train.write_back()
    _replace_state(edit, eager_opt, eager_model)
    _replace_state(edit, opt, model)
    _both_step(train, eager_model, eager_opt, batches[2:4])
    train.write_back()
    _assert_equal(eager_model, eager_opt, model, opt)


def test_state_the_step_cannot_take_is_refused_and_nothing_changes() -> None:
    """A replaced entry of another shape: ExecutionError naming it, and the
    device state is what the calls left (a later fix of the entry runs on)."""
    eager_model, eager_opt, model, opt = _pair(ADAM)
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _both_step(train, eager_model, eager_opt, batches[:2])
    train.write_back()
    first = list(model.parameters())[0]
    held = opt.state[first]["exp_avg"]
    opt.state[first]["exp_avg"] = torch.zeros(7)
    refusal = r"^a replaced optimizer state entry: optimizer.state\[.exp_avg.\] of parameter 0"
    with pytest.raises(hloalias.ExecutionError, match=refusal):
        train(*batches[2])
    opt.state[first]["exp_avg"] = held
    _both_step(train, eager_model, eager_opt, batches[2:4])
    train.write_back()
    _assert_equal(eager_model, eager_opt, model, opt)


def test_optimizer_state_holds_every_entry_after_calls_as_eager() -> None:
    """After compiled calls ``optimizer.state`` has the keys eager's has
    (their values are the last copied ones until write_back)."""
    eager_model, eager_opt, model, opt = _pair(ADAM)
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _both_step(train, eager_model, eager_opt, batches[:1])
    for p, eager_p in zip(model.parameters(), eager_model.parameters()):
        assert opt.state[p].keys() == eager_opt.state[eager_p].keys()


def _replace_first_exp_avg(*pairs: tuple[torch.nn.Module, torch.optim.Optimizer]) -> None:
    """Put a new tensor in place of the first parameter's ``exp_avg``, in
    each (model, optimizer) pair."""
    for m, o in pairs:
        first = list(m.parameters())[0]
        o.state[first]["exp_avg"] = torch.full_like(first, 0.001)


@pytest.mark.parametrize("then", ["optimizer_state_dict", "eager_step", "write_back"])
def test_a_replaced_entry_survives_the_copies_to_the_host(then: str) -> None:
    """An entry replaced between calls, then a copy of the device state to
    the host (``optimizer.state_dict()``'s hook, an eager step's hook,
    ``write_back()``): the replacement is the newest value, so the device
    takes it and the copy keeps it.  The copies overwrote it with the
    device's older value (the replacement was lost)."""
    eager_model, eager_opt, model, opt = _pair(ADAM)
    batches = _batches(5)
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _both_step(train, eager_model, eager_opt, batches[:2])
    _replace_first_exp_avg((eager_model, eager_opt), (model, opt))
    first = list(model.parameters())[0]
    if then == "optimizer_state_dict":
        torch.testing.assert_close(opt.state_dict()["state"][0]["exp_avg"], torch.full_like(first, 0.001))
    elif then == "eager_step":
        _step_fn(eager_model, eager_opt)(*batches[2])
        _step_fn(model, opt)(*batches[2])
    else:
        train.write_back()
        torch.testing.assert_close(opt.state[first]["exp_avg"], torch.full_like(first, 0.001))
    _both_step(train, eager_model, eager_opt, batches[3:5])
    train.write_back()
    _assert_equal(eager_model, eager_opt, model, opt)


@pytest.mark.parametrize("where", ["loading", "watching"])
def test_a_replaced_entry_is_read_after_a_call_interrupted_while_adopting_it(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a call loads a replaced entry onto the device, or after
    the load but before the slot watches the new tensor: nothing ran, and
    the next call adopts the replacement (again) and equals eager."""
    eager_model, eager_opt, model, opt = _pair(ADAM)
    batches = _batches(4)
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    _both_step(train, eager_model, eager_opt, batches[:2])
    _replace_first_exp_avg((eager_model, eager_opt), (model, opt))
    owner: Any = type(train.executable) if where == "loading" else type(train)
    name = "load_state_dict" if where == "loading" else "_note_source"
    original = getattr(owner, name)

    def interrupted(*args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(owner, name, original)
        raise KeyboardInterrupt

    monkeypatch.setattr(owner, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(*batches[2])
    _both_step(train, eager_model, eager_opt, batches[2:4])
    train.write_back()
    _assert_equal(eager_model, eager_opt, model, opt)
