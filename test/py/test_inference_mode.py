"""``torch.inference_mode()`` around hloalias: calls inside it are ordinary
calls; module state made inside it has no version counter, so hloalias
cannot see torch's edits of it and refuses it by name (never a raw torch
error, never an abort); and the runtime's own tensors stay ordinary tensors
when its first load happens inside it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import hloalias
from hloalias.errors import CompileError, ExecutionError


class _Cache(torch.nn.Module):
    """One row of a cache written per call, a step counter, a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(3, 4))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(0, self.step.view(1), self.linear(x).unsqueeze(0))
        self.step += 1
        return self.cache.sum(0)


def _twins() -> tuple[_Cache, _Cache]:
    torch.manual_seed(0)
    model, eager = _Cache(), _Cache()
    eager.load_state_dict(model.state_dict())
    return model, eager


def test_calls_inside_inference_mode_equal_eager_and_update_state() -> None:
    model, eager = _twins()
    x = torch.randn(4)
    with torch.inference_mode():
        exe = hloalias.compile(model, (x,))
        got = [exe(x), exe(x)]
        want = [eager(x), eager(x)]
        model.cache.zero_()  # the user's edit between calls is the newest value
        eager.cache.zero_()
        got.append(exe(x))
        want.append(eager(x))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert torch.equal(model.state_dict()["step"], eager.step)


@pytest.mark.parametrize("entry", ["compile", "jit"])
def test_module_state_made_inside_inference_mode_is_refused_by_name(entry: str) -> None:
    with torch.inference_mode():
        model = _Cache()
        x = torch.randn(4)
        with pytest.raises(CompileError, match="module state 'cache' is an inference tensor"):
            if entry == "compile":
                hloalias.compile(model, (x,))
            else:
                hloalias.jit(model)(x)


def test_state_replaced_by_an_inference_tensor_is_refused_at_the_next_call() -> None:
    model, _ = _twins()
    x = torch.randn(4)
    exe = hloalias.compile(model, (x,))
    exe(x)
    with torch.inference_mode():
        model.cache = torch.zeros(3, 4)
    with pytest.raises(ExecutionError, match="module state 'cache' was given an inference tensor"):
        exe(x)


def test_a_first_load_inside_inference_mode_leaves_no_inference_tensors_behind() -> None:
    # The runtime's sentinel for removed state, made while its module loads,
    # was an inference tensor when the first compile ran inside inference
    # mode: the state check then aborted the process (a C++ exception
    # through the native check) once a module tensor was replaced.
    code = textwrap.dedent("""
        import torch, hloalias
        from hloalias.errors import ExecutionError

        class Cache(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("cache", torch.zeros(3))

            def forward(self, x):
                self.cache.add_(x)
                return self.cache * 2

        with torch.inference_mode():
            pass
        model = Cache()
        x = torch.ones(3)
        with torch.inference_mode():
            exe = hloalias.compile(model, (x,))  # the process's first load of the runtime
        exe(x)
        model.cache = None
        try:
            exe(x)
        except ExecutionError as error:
            print("refused:", error)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: module state 'cache' was removed from the module" in done.stdout
