"""Module attributes given another tensor where torch's registration hooks
cannot say which slot it replaces (runtime/state.py: ``StateWatch.attach``,
``Executable._follow_attachments``).

A tensor registered under a name whose tensor was deleted first (``del
m.bias; m.bias = nn.Parameter(...)``), a submodule deleted and registered
again, and a plain tensor attribute given another tensor (``m.scale = t``,
which no hook sees): before, each call after ran on the device's copy of
the old tensor, silently (off by 0.37, 1.5 and 3.4 in the lead's runs).
A forward program now follows each as eager does; a training step
refuses a replaced parameter, naming it (its optimizer holds the old one),
and follows a buffer or plain attribute as the forward does; a plain
attribute given a non-tensor is refused where eager would fail."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import hloalias
from hloalias.errors import ExecutionError
from hloalias.runtime import executable as executable_module, state as state_module

from interrupt_points import sweep

PATHS = ("native", "python")
X = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))


class Scaled(torch.nn.Module):
    """A linear layer times a plain (unregistered) tensor attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def _compiled(model: torch.nn.Module, path: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    exe = hloalias.compile(model, (X,))
    exe(X)
    return exe


def _delete_and_set_bias(m: Scaled) -> None:
    del m.lin.bias
    m.lin.bias = torch.nn.Parameter(torch.full((4,), 0.5))


def _delete_and_set_submodule(m: Scaled) -> None:
    del m.lin
    m.lin = torch.nn.Linear(4, 4)


def _set_plain_attribute(m: Scaled) -> None:
    m.scale = torch.full((4,), 3.0)


def _delete_and_register_buffer(m: Scaled) -> None:
    del m.scale
    m.register_buffer("scale", torch.full((4,), -2.0))


EDITS = {
    "del+set parameter": _delete_and_set_bias,
    "del+set submodule": _delete_and_set_submodule,
    "plain attribute": _set_plain_attribute,
    "del plain, register buffer": _delete_and_register_buffer,
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_forward_program_follows_the_attribute(edit: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(1)
    model = Scaled()
    exe = _compiled(model, path, monkeypatch)
    EDITS[edit](model)
    torch.testing.assert_close(exe(X), model(X), rtol=1e-5, atol=1e-5)
    # And the new tensor is watched as any other: an in-place edit is read.
    with torch.no_grad():
        model.scale.mul_(2) if isinstance(model.scale, torch.Tensor) else None
        model.lin.weight.add_(1)
    torch.testing.assert_close(exe(X), model(X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_a_plain_attribute_held_elsewhere_is_followed(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old tensor outlives the attribute (the caller holds it): no death
    to hear of, so the per-call check of plain attributes finds it."""
    model = Scaled()
    exe = _compiled(model, path, monkeypatch)
    old = model.scale
    model.scale = torch.full((4,), 3.0)
    torch.testing.assert_close(exe(X), model(X), rtol=1e-5, atol=1e-5)
    model.scale = old
    torch.testing.assert_close(exe(X), model(X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: setattr(m, "scale", 2.0), "module state 'scale' was removed from the module"),
        (lambda m: setattr(m, "scale", torch.ones(5)), r"module state 'scale' is now torch.float32 \[5\]"),
    ],
    ids=["plain attribute made a float", "plain attribute of another shape"],
)
def test_an_attribute_gone_or_changed_is_refused(
    edit: Any, message: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Scaled()
    exe = _compiled(model, path, monkeypatch)
    edit(model)
    with pytest.raises(ExecutionError, match=message):
        exe(X)


def test_a_module_compiled_as_a_temporary_keeps_running() -> None:
    """Its tensors die with it: that is no removal to refuse."""
    exe = hloalias.compile(Scaled(), (X,))
    first = exe(X)
    torch.testing.assert_close(exe(X), first, rtol=0, atol=0)


def _step_fn(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).square().sum()
        loss.backward()
        opt.step()
        return loss

    return step


def test_a_training_step_refuses_a_replaced_parameter_naming_it() -> None:
    model = Scaled()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, (X,))
    train(X)
    EDITS["del+set parameter"](model)
    with pytest.raises(
        ExecutionError,
        match="module state 'lin.bias' was replaced .* a training step follows no replaced parameter "
        r"\(its optimizer holds the old one",
    ):
        train(X)


class Counted(Scaled):
    """:class:`Scaled` plus a buffer it reads (``shift``) and one the forward
    writes (``total``): state no optimizer holds."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("shift", torch.zeros(4))
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.total.add_(x.mean(0))
        return super().forward(x) + self.shift * self.total


def _replace_plain(m: Counted, i: int) -> None:
    m.scale = torch.full((4,), 1.5 + i)


def _replace_read_buffer(m: Counted, i: int) -> None:
    m.shift = torch.full((4,), 0.25 * (i + 1))


def _replace_written_buffer(m: Counted, i: int) -> None:
    m.total = torch.full((4,), -1.0 - i)


def _delete_and_register_buffer_again(m: Counted, i: int) -> None:
    del m.shift
    m.register_buffer("shift", torch.full((4,), 0.5 - i))


REPLACEMENTS = {
    "plain attribute": _replace_plain,
    "read buffer": _replace_read_buffer,
    "written buffer": _replace_written_buffer,
    "del+register buffer": _delete_and_register_buffer_again,
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("edit", sorted(REPLACEMENTS))
def test_a_training_step_reads_a_replaced_buffer_or_plain_attribute(
    edit: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No optimizer holds a buffer or a plain tensor attribute: the step
    reads the new one by name, as eager's next step does, and the replaced
    tensor keeps what the steps left in it.  Before, each was refused with
    a message about the optimizer."""
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    torch.manual_seed(3)
    reference = Counted()
    model = copy.deepcopy(reference)
    opt, reference_opt = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, reference))
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, (X,))
    reference_step = _step_fn(reference, reference_opt)
    for i in range(3):
        torch.testing.assert_close(train(X), reference_step(X), rtol=1e-5, atol=1e-5)
        olds = (model.total, model.shift, model.scale)
        reference_olds = (reference.total, reference.shift, reference.scale)
        REPLACEMENTS[edit](model, i)
        REPLACEMENTS[edit](reference, i)
        for old, reference_old in zip(olds, reference_olds):
            torch.testing.assert_close(old, reference_old, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(train(X), reference_step(X), rtol=1e-5, atol=1e-5)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(model.scale, reference.scale, rtol=0, atol=0)


def test_a_training_step_runs_on_when_nothing_was_replaced() -> None:
    reference = Scaled()
    model = copy.deepcopy(reference)
    opt, reference_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference))
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, (X,))
    reference_step = _step_fn(reference, reference_opt)
    torch.nn.Linear(2, 2)  # a registration anywhere makes every program look its names up again
    for _ in range(3):
        torch.testing.assert_close(train(X), reference_step(X), rtol=1e-6, atol=1e-6)


FILES = {state_module.__file__, executable_module.__file__}


def test_a_call_interrupted_anywhere_then_run_again_follows() -> None:
    """A Ctrl-C at any point of a call that looks the names up again leaves
    the lookup unrecorded: the next call redoes it and follows."""
    model = Scaled()
    exe = hloalias.compile(model, (X,))
    exe(X)
    rounds = [0]

    def prepare() -> None:
        rounds[0] += 1
        del model.lin.bias
        model.lin.bias = torch.nn.Parameter(torch.full((4,), float(rounds[0])))
        model.scale = torch.full((4,), float(rounds[0]))

    def check(_: None, where: Any) -> None:
        torch.testing.assert_close(exe(X), model(X), rtol=1e-5, atol=1e-5, msg=lambda m: f"{m} after {where}")

    points = sweep(prepare, lambda _: exe(X), check, FILES)
    assert any("_follow_attachments" in name for name, _, _ in points), points


def _delete_bias(m: Scaled) -> None:
    del m.lin.bias


def _bias_set_to_none(m: Scaled) -> None:
    m.lin.bias = None


def _delete_submodule(m: Scaled) -> None:
    del m.lin


REMOVALS = {"del parameter": _delete_bias, "parameter set to None": _bias_set_to_none, "del submodule": _delete_submodule}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("edit", sorted(REMOVALS))
def test_a_removal_alone_is_refused(edit: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``del m.lin.bias`` (eager: an AttributeError), ``m.lin.bias = None``
    (eager: no bias added) and ``del m.lin``, with nothing registered
    after: torch calls no hook, so the program ran on the old tensors,
    silently.  Counted now (``state._count_removal``): the next call looks
    the names up again and refuses, naming the tensor, before anything runs."""
    model = Scaled()
    exe = _compiled(model, path, monkeypatch)
    before = {name: value.clone() for name, value in exe.state_dict().items()}
    REMOVALS[edit](model)
    with pytest.raises(ExecutionError, match=r"module state 'lin\.(bias|weight)' was removed from the module"):
        exe(X)
    after = {name: slot.torch_value(exe._slot_array(name)) for name, slot in exe._watched}
    assert all(torch.equal(after[name], before[name]) for name in after)

