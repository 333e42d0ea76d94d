"""Module attributes given another tensor where torch's registration hooks
cannot say which slot it replaces (runtime/state.py: ``StateWatch.attach``,
``Executable._follow_attachments``).

A tensor registered under a name whose tensor was deleted first (``del
m.bias; m.bias = nn.Parameter(...)``), a submodule deleted and registered
again, and a plain tensor attribute given another tensor (``m.scale = t``,
which no hook sees): before, each call after ran on the device's copy of
the old tensor, silently (off by 0.37, 1.5 and 3.4 in the lead's runs).
A forward program now follows each as eager does; a training step
refuses it, naming the attribute, as it refuses any replaced tensor; a
plain attribute given a non-tensor is refused where eager would fail."""

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


@pytest.mark.parametrize(
    ("edit", "name"), [("plain attribute", "scale"), ("del+set parameter", "lin.bias")], ids=["plain", "parameter"]
)
def test_a_training_step_refuses_the_replacement_naming_it(edit: str, name: str) -> None:
    model = Scaled()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, (X,))
    train(X)
    EDITS[edit](model)
    with pytest.raises(ExecutionError, match=f"module state '{name}' was replaced .* a training step follows no"):
        train(X)


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
