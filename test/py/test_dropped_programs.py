"""A program dropped before anyone read what its calls left keeps those
values for the module (runtime/state.py ``_keep_alive_while_lagging``).

A training step made inside a function that returns is collected with
its device buffers; the module's tensors, marked stale, used to get their
class back with the values of before the first call: every step lost,
silently."""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable

import torch

import hloalias
from hloalias.runtime import state


def _step_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


class _Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n += 1
        return x + self.n


def _train_in_a_function(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int) -> None:
    train = hloalias.compile_training_step(_step_of(model, opt), model, opt, (x,))
    for _ in range(steps):
        train(x)


def test_a_training_step_dropped_after_its_calls_keeps_the_models_training() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    eager_model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-2)
    x = torch.randn(3, 4)
    _train_in_a_function(model, opt, x, 3)
    gc.collect()
    eager_step = _step_of(eager_model, eager_opt)
    for _ in range(3):
        eager_step(x)
    for got, want in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(opt.state[p]["exp_avg"], eager_opt.state[q]["exp_avg"], rtol=1e-5, atol=1e-6)
    # A new step goes on from there.
    _train_in_a_function(model, opt, x, 2)
    gc.collect()
    for _ in range(2):
        eager_step(x)
    for got, want in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_dropped_forward_program_keeps_its_buffer_updates() -> None:
    counter = _Counter()

    def run() -> None:
        exe = hloalias.compile(counter, (torch.zeros(4),))
        for _ in range(3):
            exe(torch.zeros(4))

    run()
    gc.collect()
    assert counter.n.item() == 3.0
    assert counter.state_dict()["n"].item() == 3.0


def test_the_kept_buffers_go_once_read_or_when_the_tensor_dies() -> None:
    counter = _Counter()

    def run(module: _Counter) -> None:
        exe = hloalias.compile(module, (torch.zeros(4),))
        exe(torch.zeros(4))

    run(counter)
    gc.collect()
    assert len(state._KEPT_WHILE_LAGGING.get(counter.n) or ()) == 1  # type: ignore[no-untyped-call]
    assert float(counter.n) == 1.0  # the read copies it in ...
    assert state._KEPT_WHILE_LAGGING.get(counter.n) is None  # type: ignore[no-untyped-call]  # ... and lets it go

    other = _Counter()
    run(other)
    gc.collect()
    before = len(state._KEPT_WHILE_LAGGING)
    del other
    gc.collect()
    assert len(state._KEPT_WHILE_LAGGING) == before - 1
