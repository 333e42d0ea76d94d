"""``hloalias.compile`` is ahead of time: the program is traced under the
default dtype of the compile (``torch.get_default_dtype()``: a dtype-less
``torch.ones(3)``, an integer division) and a call under another default
dtype runs it as compiled, with no warning, as jax's
``jax.jit(f).lower(x).compile()`` keeps the ``jax_enable_x64`` of its
lowering (docs/runtime.md, "The default dtype is the one the program was
traced under").  ``Executable.default_dtype`` and ``explain()`` name it;
``hloalias.jit`` traces again under the new default."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

import hloalias


@pytest.fixture
def default_dtype() -> Iterator[None]:
    before = torch.get_default_dtype()
    yield
    torch.set_default_dtype(before)


def _plus_ones(x: torch.Tensor) -> torch.Tensor:
    return x + torch.ones(3)


def _half(i: torch.Tensor) -> torch.Tensor:
    return i / 2


def test_a_call_under_another_default_dtype_runs_the_program_as_compiled(default_dtype: None) -> None:
    torch.set_default_dtype(torch.float32)
    plus = hloalias.compile(_plus_ones, (torch.zeros(3),))
    half = hloalias.compile(_half, (torch.arange(3),))
    assert plus.default_dtype is torch.float32 and half.default_dtype is torch.float32
    assert "default dtype: torch.float32 (traced under it" in plus.explain()
    torch.set_default_dtype(torch.float64)
    x = torch.zeros(3, dtype=torch.float32)
    assert _plus_ones(x).dtype is torch.float64 and _half(torch.arange(3)).dtype is torch.float64  # eager now
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plus(x)
        halves = half(torch.arange(3))
    assert out.dtype is torch.float32 and torch.equal(out, torch.ones(3, dtype=torch.float32))
    assert halves.dtype is torch.float32 and torch.equal(halves, torch.tensor([0.0, 0.5, 1.0], dtype=torch.float32))
    # Compiled under float64, it says so; hloalias.jit traces for the default of the call.
    again = hloalias.compile(_plus_ones, (x,))
    assert again.default_dtype is torch.float64 and again(x).dtype is torch.float64
    assert "default dtype: torch.float64" in again.explain()
    assert hloalias.jit(_plus_ones)(x).dtype is torch.float64


def test_a_program_not_traced_from_torch_names_no_default_dtype() -> None:
    from hloalias.runtime.foreign import compile_stablehlo

    text = """
    func.func @main(%arg0: tensor<3xf32>) -> tensor<3xf32> {
      %0 = stablehlo.add %arg0, %arg0 : tensor<3xf32>
      return %0 : tensor<3xf32>
    }
    """
    exe = compile_stablehlo(text)
    assert exe.default_dtype is None and "default dtype:" not in exe.explain()
