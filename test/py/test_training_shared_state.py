"""One state store per model (issue 24, items 4 and 5): every training
step and inference executable of a model reads and updates the same device
buffers, so steps compiled for two batch sizes, a backward-only step
alternating with a stepping one (gradient accumulation) and an inference
executable compiled from the model all see each other's updates, as eager
would; and ``hloalias.compile`` of a forward that trains refuses it,
naming ``compile_training_step``.

Tolerances as test_training.py's (float32, rounding only)."""

from __future__ import annotations

import copy

import pytest
import torch

import hloalias
from hloalias.errors import TorchImportError

RTOL, ATOL = 1e-5, 1e-6


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batch(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, 8, generator=generator), torch.randn(size, 4, generator=generator)


def _assert_params_equal(eager: torch.nn.Module, compiled: dict[str, torch.Tensor]) -> None:
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(compiled[name], value, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")


def test_two_steps_of_one_model_continue_each_others_progress() -> None:
    """The DataLoader's smaller last batch: a step for batch 6 and one for
    batch 4, alternating; parameters and momentum equal eager's."""
    model, eager = _mlp(), _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)

    def make_step(m: torch.nn.Module, opt: torch.optim.Optimizer):  # type: ignore[no-untyped-def]
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        return step

    full = hloalias.compile_training_step(make_step(model, optimizer), model, optimizer, _batch(6, 0))
    last = hloalias.compile_training_step(make_step(model, optimizer), model, optimizer, _batch(4, 0))
    eager_step = make_step(eager, eager_optimizer)
    for seed in range(4):
        for train, size in ((full, 6), (last, 4)):
            x, y = _batch(size, seed)
            loss = train(x, y)
            torch.testing.assert_close(loss, eager_step(x, y).detach(), rtol=1e-5, atol=1e-6)
    for train in (full, last):
        state = train.state_dict()
        _assert_params_equal(eager, state["model"])
        eager_momentum = eager_optimizer.state_dict()["state"]
        for index, entries in state["optimizer"]["state"].items():
            torch.testing.assert_close(entries["momentum_buffer"], eager_momentum[index]["momentum_buffer"], rtol=RTOL, atol=ATOL)
    last.write_back()
    _assert_params_equal(eager, model.state_dict())


@pytest.mark.parametrize("backward_first", [True, False], ids=["backward-step-compiled-first", "stepping-step-compiled-first"])
def test_backward_every_micro_batch_and_a_step_every_k_equals_eager(backward_first: bool) -> None:
    """Gradient accumulation with two compiled steps: one that only
    accumulates gradients, one that accumulates, steps and zeroes them
    (k = 3 micro-batches).  Whichever is compiled first, the stepping step
    reads the accumulated gradients."""
    model, eager = _mlp(), _mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    eager_optimizer = torch.optim.Adam(eager.parameters(), lr=0.01)

    def accumulate_fn(m: torch.nn.Module):  # type: ignore[no-untyped-def]
        def accumulate(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(m(x), y) / 3
            loss.backward()
            return loss

        return accumulate

    def step_fn(m: torch.nn.Module, opt: torch.optim.Optimizer):  # type: ignore[no-untyped-def]
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(m(x), y) / 3
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        return step

    example = _batch(5, 0)
    if backward_first:
        accumulate = hloalias.compile_training_step(accumulate_fn(model), model, optimizer, example)
        stepping = hloalias.compile_training_step(step_fn(model, optimizer), model, optimizer, example)
    else:
        stepping = hloalias.compile_training_step(step_fn(model, optimizer), model, optimizer, example)
        accumulate = hloalias.compile_training_step(accumulate_fn(model), model, optimizer, example)
    eager_accumulate, eager_step = accumulate_fn(eager), step_fn(eager, eager_optimizer)
    seed = 0
    for _ in range(3):  # three optimizer steps of k = 3 micro-batches
        for micro in range(3):
            x, y = _batch(5, seed)
            seed += 1
            if micro < 2:
                loss, expected = accumulate(x, y), eager_accumulate(x, y)
            else:
                loss, expected = stepping(x, y), eager_step(x, y)
            torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6)
    _assert_params_equal(eager, stepping.state_dict()["model"])
    _assert_params_equal(eager, accumulate.state_dict()["model"])


def test_an_inference_executable_shares_the_training_state() -> None:
    model, eager = _mlp(), _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)
    x_infer = torch.randn(3, 8)
    infer = hloalias.compile(model, (x_infer,))
    before = infer(x_infer).clone()

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    train = hloalias.compile_training_step(step, model, optimizer, _batch(6, 0))
    for seed in range(3):
        x, y = _batch(6, seed)
        train(x, y)
        loss = torch.nn.functional.mse_loss(eager(x), y)
        loss.backward()
        eager_optimizer.step()
        eager_optimizer.zero_grad()
    with torch.no_grad():
        expected = eager(x_infer)
    got = infer(x_infer)
    assert not torch.allclose(got, before)
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
    # One device buffer per parameter: the inference executable's state is the step's.
    _assert_params_equal(eager, infer.state_dict())
    later = hloalias.compile(model, (torch.randn(2, 8),))  # compiled after training: trained weights
    torch.testing.assert_close(later(x_infer[:2]), expected[:2], rtol=RTOL, atol=ATOL)


class _TrainsInForward(torch.nn.Module):
    def __init__(self, step: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 2)
        self.opt = torch.optim.SGD(self.lin.parameters(), lr=0.1)
        self.step = step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        loss = self.lin(x).square().sum()
        if self.step:
            loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss.detach()


@pytest.mark.parametrize("backward", [True, False], ids=["backward-and-step", "step-only"])
def test_compile_of_a_forward_that_trains_names_compile_training_step(backward: bool) -> None:
    module = _TrainsInForward(step=backward)
    before = copy.deepcopy(module.state_dict())
    with pytest.raises(TorchImportError, match="compile_training_step"):
        hloalias.compile(module, (torch.randn(3, 4),))
    for name, value in module.state_dict().items():
        assert torch.equal(value, before[name]), name
    # Eager training elsewhere is untouched by the refusal.
    eager = _TrainsInForward()
    eager(torch.randn(3, 4))
