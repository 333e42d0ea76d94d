"""A Ctrl-C at any point of the watch of host random draws
(frontend/host_random.py) or of the traced program leaves the caller's
random generators and every patched function as they were: numpy's and
Python's drawing functions are the originals again, the global
generators are at their states before the trace (a refused one, or one
cut short after a draw), and torch's tracing flags and the optimizer are
back.  Deterministic: the interrupt is delivered at every point where
Python checks for signals (test/py/interrupt_points.py)."""

from __future__ import annotations

import gc
import random
from typing import Any

import numpy as np
import pytest
import torch

import hloalias
from hloalias.errors import TorchImportError
from hloalias.frontend import host_random, tracing_lock
from hloalias.frontend.training import TrainingCaptureError
from interrupt_points import sweep


def _attributes() -> dict[tuple[str, str], Any]:
    return {
        (module.__name__, name): getattr(module, name)
        for module in (random, np.random)
        for name in dir(module)
        if not name.startswith("_")
    }


def _generator_states() -> tuple[Any, Any]:
    state = np.random.get_state()
    return random.getstate(), (state[0], state[1].tolist(), *state[2:])


class _Before:
    def __init__(self) -> None:
        random.seed(3)
        np.random.seed(3)
        self.random = _generator_states()
        self.attributes = _attributes()


def _check_put_back(before: _Before, where: Any) -> None:
    now = _attributes()
    changed = sorted(key for key, value in before.attributes.items() if now.get(key) is not value)
    assert not changed, f"left patched after {where}: {changed}"
    assert _generator_states() == before.random, f"generators not put back after {where}"


def _draws() -> float:
    """The traced program's host draws (numpy's, and Python's used)."""
    mask = np.random.rand(3)
    p = random.random()
    if p < 2.0:
        return float(mask.sum()) + p
    return 0.0


def test_an_interrupt_anywhere_in_the_watch_puts_everything_back() -> None:
    def run(_: _Before) -> None:
        with pytest.raises(TorchImportError, match="draws random numbers on the host"):
            with host_random.refuse_host_random_draws():
                _draws()

    points = sweep(_Before, run, _check_put_back, {host_random.__file__, __file__})
    names = {name for name, _, _ in points}
    # The sweep went through the patching, the draws, the put-backs.
    assert {"refuse_host_random_draws", "_draws"} <= names, sorted(names)
    assert any("draw" in name and name != "_draws" for name in names), sorted(names)


def test_an_error_in_the_trace_after_a_draw_puts_the_generators_back() -> None:
    before = _Before()
    with pytest.raises(ZeroDivisionError):
        with host_random.refuse_host_random_draws():
            np.random.rand(2)
            1 / 0
    _check_put_back(before, "a ZeroDivisionError in the trace")


def _torch_state() -> dict[str, Any]:
    return {
        "compiling": torch.compiler._is_compiling_flag,
        "grad": torch.is_grad_enabled(),
        "tracing depth": tracing_lock._depth,
        "frozen": gc.get_freeze_count(),
        "function modes": torch._C._len_torch_function_stack(),
        "is_grad_enabled": torch.is_grad_enabled,
    }


def test_an_interrupt_anywhere_in_a_traced_training_step_puts_everything_back() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    groups = [dict(group) for group in opt.param_groups]
    torch_before = _torch_state()

    def step(x: torch.Tensor) -> torch.Tensor:
        drop = int(np.random.choice(4))  # a host draw picks a feature to drop
        loss = model(x)[:, drop].square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def run(_: _Before) -> None:
        with pytest.raises(TrainingCaptureError, match="draws random numbers on the host"):
            hloalias.compile_training_step(step, model, opt, (torch.randn(2, 4),))

    def check(before: _Before, where: Any) -> None:
        _check_put_back(before, where)
        assert _torch_state() == torch_before, where
        assert not opt.state, where
        assert [dict(group) for group in opt.param_groups] == groups, where
        for key, value in model.state_dict().items():
            assert torch.equal(value, weights[key]), (where, key)

    points = sweep(_Before, run, check, {__file__})
    assert {"test_an_interrupt_anywhere_in_a_traced_training_step_puts_everything_back.<locals>.step"} <= {
        name for name, _, _ in points
    }
