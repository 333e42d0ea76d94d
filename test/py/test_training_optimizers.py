"""Every ``torch.optim`` optimizer of a plain training step against eager
over three steps, from fresh state (created by hloalias, or by the
optimizer's constructor) and from state an eager step made.

Adagrad scales its update by a step-dependent rate, ``addcdiv_(grad, std,
value=-clr)``, where ``clr`` is a 0-d tensor in the trace (the step count
is a traced tensor): torch reads it on the host, which the capture
refused before the fix; the graph now multiplies by the 0-d tensor.
RAdam, NAdam, Adamax, Adadelta and RMSprop got their initial state built
by the capture (before: "run one eager step first").  ``foreach=True``
was a TorchImportError (no lowering for ``aten._foreach_add.Scalar``);
the capture traces the per-tensor update, torch's default on CPU.  ASGD and Rprop
start from the lr of their first step, which a scheduler may still
change after compiling: without state they are refused with a
TrainingCaptureError naming the optimizer.

Tolerances: rounding only (float32 tensors where eager computes some
scalars in double): rtol 1e-5, atol 1e-6."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.frontend.training import TrainingCaptureError

O = torch.optim
RTOL, ATOL = 1e-5, 1e-6


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def _step_fn(model: torch.nn.Module, optimizer: O.Optimizer) -> Callable[..., torch.Tensor]:
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


OPTIMIZERS: dict[str, Callable[[Any], O.Optimizer]] = {
    "adagrad": lambda p: O.Adagrad(p, lr=1e-2),
    "adagrad_lr_decay_weight_decay": lambda p: O.Adagrad(p, lr=1e-2, lr_decay=0.1, weight_decay=0.1),
    "adagrad_maximize_initial_accumulator": lambda p: O.Adagrad(
        p, lr=1e-2, lr_decay=0.05, initial_accumulator_value=0.1, maximize=True
    ),
    "adamax": lambda p: O.Adamax(p, lr=1e-2),
    "nadam": lambda p: O.NAdam(p, lr=1e-2),
    "nadam_decoupled": lambda p: O.NAdam(p, lr=1e-2, decoupled_weight_decay=True, weight_decay=0.1),
    "radam": lambda p: O.RAdam(p, lr=1e-2),
    "adadelta": lambda p: O.Adadelta(p, lr=1.0),
    "rmsprop": lambda p: O.RMSprop(p, lr=1e-2),
    "rmsprop_momentum_centered": lambda p: O.RMSprop(p, lr=1e-2, momentum=0.5, centered=True),
    "sgd_nesterov": lambda p: O.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    "asgd": lambda p: O.ASGD(p, lr=1e-2),
    # foreach=True (eager runs the list ops): traced per tensor, the same formula.
    "adam_foreach": lambda p: O.Adam(p, lr=1e-2, foreach=True),
    "adagrad_foreach": lambda p: O.Adagrad(p, lr=1e-2, lr_decay=0.1, foreach=True),
    "sgd_nesterov_foreach": lambda p: O.SGD(p, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
    "rprop": lambda p: O.Rprop(p, lr=1e-2),
}
#: Optimizers whose initial state depends on the first step's lr.
NEED_STATE = {"asgd", "rprop"}


def _train_both(make: Callable[[Any], O.Optimizer], warm: bool) -> None:
    eager_model, model = _model(), _model()
    eager_opt, opt = make(eager_model.parameters()), make(model.parameters())
    batches = _batches()
    if warm:
        for m, o in ((eager_model, eager_opt), (model, opt)):
            _step_fn(m, o)(*batches[0])
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    for batch in batches[1:]:
        eager_loss = _step_fn(eager_model, eager_opt)(*batch)
        torch.testing.assert_close(train(*batch), eager_loss.detach(), rtol=RTOL, atol=ATOL)
    train.write_back()
    for (name, value), expected in zip(model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(value.detach(), expected.detach(), rtol=RTOL, atol=ATOL, msg=name)
    for index, (p, eager_p) in enumerate(zip(model.parameters(), eager_model.parameters())):
        assert set(opt.state[p]) == set(eager_opt.state[eager_p]), index
        for key, expected in eager_opt.state[eager_p].items():
            torch.testing.assert_close(
                torch.as_tensor(opt.state[p][key]), torch.as_tensor(expected), rtol=RTOL, atol=ATOL,
                msg=f"{index}.{key}",
            )


@pytest.mark.parametrize("name", sorted(set(OPTIMIZERS) - NEED_STATE))
def test_from_fresh_state_equals_eager(name: str) -> None:
    _train_both(OPTIMIZERS[name], warm=False)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_after_an_eager_step_equals_eager(name: str) -> None:
    _train_both(OPTIMIZERS[name], warm=True)


@pytest.mark.parametrize("name", sorted(NEED_STATE))
def test_without_state_is_refused_naming_the_optimizer(name: str) -> None:
    model = _model()
    opt = OPTIMIZERS[name](model.parameters())
    with pytest.raises(TrainingCaptureError, match=f"{type(opt).__name__} has no state.*run one eager step"):
        hloalias.compile_training_step(_step_fn(model, opt), model, opt, _batches()[0])
    assert not opt.state


def test_float64_parameters_take_lr_as_a_double() -> None:
    """lr reaches a float64 model's update as eager's Python float does:
    unrounded.  It was a float32 input, and lr=1e-2 (2.2e-8 off in float32)
    moved every float64 parameter by a different amount than eager
    (Whisper's float64 training drifted 1e-11 from eager in 3 SGD steps;
    its gradients agreed to 5e-13 relative)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).double()
    twin = torch.nn.Linear(8, 4).double()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(16, 8, dtype=torch.float64)

    def make(m: torch.nn.Module) -> tuple[Callable[..., torch.Tensor], O.Optimizer]:
        optimizer = O.SGD(m.parameters(), lr=1e-2)

        def step(x: torch.Tensor) -> torch.Tensor:
            loss = m(x).pow(2).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        return step, optimizer

    eager_step, _ = make(model)
    compiled_step, optimizer = make(twin)
    train = hloalias.compile_training_step(compiled_step, twin, optimizer, (x,))
    for _ in range(2):
        eager_step(x)
        train(x)
    train.write_back()
    for eager, compiled in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-14)
