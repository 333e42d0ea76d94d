"""Kept gradients a training step sets to None again
(``TrainingStep._show_cleared_grads``, ``_StateSlot.show_grad_cleared``).

Gradient accumulation with two steps of one model: ``micro`` runs
``backward()`` only (its gradients are kept on the device), ``final``
runs ``backward()``, ``optimizer.step()`` and ``optimizer.zero_grad()``,
which sets every ``.grad`` to None.  The gradients are slots of both
steps, and a slot holds zeros where eager has None: before, ``p.grad``
read zeros after ``final``, and an eager ``optimizer.step()`` with
momentum then moved every parameter (by 0.07 in the lead's run) where
eager's skips the gradients that are None."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import hloalias

X = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
Y = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[Any, Any]:
    def micro(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y) / 2
        loss.backward()
        return loss

    def final(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y) / 2
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return micro, final


def _pair() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, Any, torch.nn.Module, torch.optim.Optimizer, Any, Any]:
    model = _model()
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    micro, final = _steps(model, opt)
    compiled_micro = hloalias.compile_training_step(micro, model, opt, (X[:4], Y[:4]))
    compiled_final = hloalias.compile_training_step(final, model, opt, (X[4:], Y[4:]))
    reference_micro, reference_final = _steps(reference, reference_opt)
    return model, opt, compiled_micro, compiled_final, reference, reference_opt, reference_micro, reference_final


def _assert_same(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)
        assert (p.grad is None) == (q.grad is None), (name, p.grad, q.grad)
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("path", ("native", "python"))
def test_grads_read_none_after_the_step_that_clears_them(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    model, _, micro, final, reference, _, reference_micro, reference_final = _pair()
    for i in range(3):
        torch.testing.assert_close(micro(X[:4] + i, Y[:4]), reference_micro(X[:4] + i, Y[:4]))
        _assert_same(model, reference)  # accumulated: .grad set, equal to eager's
        torch.testing.assert_close(final(X[4:], Y[4:]), reference_final(X[4:], Y[4:]))
        _assert_same(model, reference)  # cleared: .grad is None


def test_an_eager_optimizer_step_after_the_clearing_step_matches_eager() -> None:
    model, opt, micro, final, reference, reference_opt, reference_micro, reference_final = _pair()
    micro(X[:4], Y[:4])
    reference_micro(X[:4], Y[:4])
    final(X[4:], Y[4:])
    reference_final(X[4:], Y[4:])
    opt.step()  # every .grad is None: eager's skips every parameter
    reference_opt.step()
    _assert_same(model, reference)


def test_an_eager_backward_after_the_clearing_step_is_accumulated_into() -> None:
    model, _, micro, final, reference, _, reference_micro, reference_final = _pair()
    micro(X[:4], Y[:4])
    reference_micro(X[:4], Y[:4])
    final(X[4:], Y[4:])
    reference_final(X[4:], Y[4:])
    for m in (model, reference):  # eager code fills the gradients from None
        torch.nn.functional.mse_loss(m(X[:2]), Y[:2]).backward()
    _assert_same(model, reference)
    micro(X[:4], Y[:4])
    reference_micro(X[:4], Y[:4])
    _assert_same(model, reference)
