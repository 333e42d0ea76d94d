"""A compiled function's closure and globals (``frontend/closure_tensors.py``,
``runtime/module_modes.py``).

``torch.export`` of a plain function lifts what the function reaches other
than through its arguments as constants.  Before these checks a model's
parameters reached from a ``lambda`` or a ``functools.partial`` were aliases
with version counters of their own, so an in-place write to the model (an
eager optimizer step) was never seen and the program kept the compile-time
weights; and a global or closure name rebound to another tensor or value
(``w = torch.zeros(4, 4)``, ``scale = 3.0``) ran the old one.  Each test here
returned the stale value on that code."""

from __future__ import annotations

import functools

import pytest
import torch

import hloalias
from hloalias.errors import ExecutionError

torch.manual_seed(0)
_MODEL = torch.nn.Linear(4, 4)
_WEIGHT = torch.randn(4, 4)
_SCALE = 2.0


def _x() -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(1))


def _apply(model: torch.nn.Module, x: torch.Tensor, scale: float) -> torch.Tensor:
    return model(x) * scale


@pytest.mark.parametrize("how", ["lambda", "partial"])
def test_an_in_place_write_to_a_model_the_function_reaches_is_followed(how: str) -> None:
    model = torch.nn.Linear(4, 4)
    fn = (lambda x: model(x) + 1) if how == "lambda" else functools.partial(_apply, model, scale=2.0)
    jitted, exe = hloalias.jit(fn), hloalias.compile(fn, (_x(),))
    with torch.no_grad():
        torch.testing.assert_close(jitted(_x()), fn(_x()))
        model.weight.mul_(2)  # an eager optimizer step does the same
        model.bias.add_(1)
        torch.testing.assert_close(jitted(_x()), fn(_x()))
        torch.testing.assert_close(exe(_x()), fn(_x()))


def test_an_eager_training_step_between_calls_of_a_compiled_predictor_is_seen() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    predict = hloalias.jit(lambda x: model(x).squeeze(-1))
    for _ in range(2):
        optimizer.zero_grad()
        model(_x()).pow(2).sum().backward()
        optimizer.step()
        with torch.no_grad():
            torch.testing.assert_close(predict(_x()), model(_x()).squeeze(-1))


def _uses_global_weight(x: torch.Tensor) -> torch.Tensor:
    return x @ _WEIGHT * _SCALE


def test_a_rebound_global_tensor_or_value_is_refused_by_an_executable_and_recompiled_by_jit() -> None:
    global _WEIGHT, _SCALE
    saved = _WEIGHT, _SCALE
    try:
        exe, jitted = hloalias.compile(_uses_global_weight, (_x(),)), hloalias.jit(_uses_global_weight)
        torch.testing.assert_close(jitted(_x()), _uses_global_weight(_x()))
        _WEIGHT = torch.zeros(4, 4)
        with pytest.raises(ExecutionError, match=r"name '_WEIGHT' of _uses_global_weight's enclosing scope was the tensor float32\[4, 4\]"):
            exe(_x())
        torch.testing.assert_close(jitted(_x()), _uses_global_weight(_x()))
        _SCALE = 3.0
        with pytest.raises(ExecutionError, match=r"name '_SCALE'"):
            exe(_x())
        _WEIGHT = torch.ones(4, 4)
        torch.testing.assert_close(jitted(_x()), _uses_global_weight(_x()))
        assert jitted.stats.compiles == 3
    finally:
        _WEIGHT, _SCALE = saved


def test_a_rebound_closure_value_is_followed_by_jit() -> None:
    temperature = 1.0

    def sample(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x / temperature, dim=-1)

    jitted = hloalias.jit(sample)
    torch.testing.assert_close(jitted(_x()), sample(_x()))
    temperature = 0.5
    torch.testing.assert_close(jitted(_x()), sample(_x()))
    assert jitted.stats.compiles == 2


def test_a_module_global_rebound_to_another_model_is_refused() -> None:
    global _MODEL
    saved = _MODEL
    try:
        exe = hloalias.compile(lambda x: _MODEL(x), (_x(),))
        _MODEL = torch.nn.Linear(4, 4)
        with pytest.raises(ExecutionError, match=r"name '_MODEL'"):
            exe(_x())
    finally:
        _MODEL = saved
