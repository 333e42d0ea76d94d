"""Frozen parameters in a training step (fine-tuning's usual recipe:
``model.embeddings.requires_grad_(False)`` then ``AdamW(model.parameters())``).

Eager gives a frozen parameter no gradient, so the optimizer skips it: no
update, no weight decay, no state.  The capture made every parameter
require grad, so frozen weights were trained and decayed (0.03 off after
three AdamW steps, no error).  Unfreezing after compiling (gradual
unfreezing) captures the step again, the state staying on the device.
Each test fails on the code before the fix.

Tolerances as test_training.py's (float32, rounding only)."""

from __future__ import annotations

import pytest
import torch

import hloalias

RTOL, ATOL = 1e-5, 1e-6


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x).relu())


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer):  # type: ignore[no-untyped-def]
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(6, 8, generator=generator), torch.randn(6, 4, generator=generator)


OPTIMIZERS = {
    "adamw_weight_decay": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "sgd_momentum_weight_decay": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, weight_decay=0.1),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_frozen_parameter_in_the_optimizer_is_left_alone(name: str) -> None:
    model, eager = _Net(), _Net()
    for m in (model, eager):
        m.embed.requires_grad_(False)
    frozen = model.embed.weight.detach().clone()
    optimizer, eager_optimizer = OPTIMIZERS[name](model.parameters()), OPTIMIZERS[name](eager.parameters())
    train = hloalias.compile_training_step(_step(model, optimizer), model, optimizer, _batch(0))
    for seed in range(3):
        torch.testing.assert_close(train(*_batch(seed)), _step(eager, eager_optimizer)(*_batch(seed)).detach(),
                                   rtol=RTOL, atol=ATOL)
    train.write_back()
    torch.testing.assert_close(model.embed.weight, frozen, rtol=0, atol=0)
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=RTOL, atol=ATOL, msg=key)
    # Eager creates no optimizer state for a frozen parameter: a checkpoint
    # holds the same entries (there were zeros for the frozen ones).
    assert sorted(optimizer.state_dict()["state"]) == sorted(eager_optimizer.state_dict()["state"])
    assert model.embed.weight not in optimizer.state


def test_a_frozen_parameter_needs_no_state_an_optimizer_cannot_start() -> None:
    """Rprop's state starts from its first step's lr, so hloalias needs one
    eager step first; a frozen parameter gets no state from it, and the
    capture asked for its state anyway (refused)."""
    model, eager = _Net(), _Net()
    for m in (model, eager):
        m.embed.requires_grad_(False)
    optimizer, eager_optimizer = torch.optim.Rprop(model.parameters(), lr=1e-2), torch.optim.Rprop(eager.parameters(), lr=1e-2)
    _step(model, optimizer)(*_batch(9))
    _step(eager, eager_optimizer)(*_batch(9))
    train = hloalias.compile_training_step(_step(model, optimizer), model, optimizer, _batch(0))
    for seed in range(2):
        torch.testing.assert_close(train(*_batch(seed)), _step(eager, eager_optimizer)(*_batch(seed)).detach(),
                                   rtol=RTOL, atol=ATOL)
    train.write_back()
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=RTOL, atol=ATOL, msg=key)


def test_unfreezing_after_compiling_trains_the_unfrozen_layer_as_eager() -> None:
    """Two steps with the first layer frozen, then ``requires_grad_(True)``
    and two more: the step is captured again and equals eager, whose
    optimizer starts the unfrozen layer's state at that step."""
    model, eager = _Net(), _Net()
    for m in (model, eager):
        m.embed.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-2, weight_decay=0.1)
    train = hloalias.compile_training_step(_step(model, optimizer), model, optimizer, _batch(0))
    for seed in range(4):
        if seed == 2:
            for m in (model, eager):
                m.embed.requires_grad_(True)
        loss = train(*_batch(seed))
        torch.testing.assert_close(loss, _step(eager, eager_optimizer)(*_batch(seed)).detach(), rtol=RTOL, atol=ATOL)
    train.write_back()
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=RTOL, atol=ATOL, msg=key)
    assert float(optimizer.state[model.embed.weight]["step"]) == 2.0
