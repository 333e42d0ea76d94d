"""LayerNorm lowered in eager's CPU kernel type (issue 29): torch's
decomposition goes through ``var_mean``, which torch-mlir computes in
float64, and XLA:CPU kept a float64 copy of the normalized activation in
temp (137,216 bytes for a 2x256x32 input, twice its size).
``hloalias.frontend.decompositions.native_layer_norm`` computes in float32
(float64 for float64 inputs)."""

from __future__ import annotations

import pytest
import torch

import hloalias


def test_layer_norm_keeps_no_float64_copy() -> None:
    torch.manual_seed(0)
    model = torch.nn.LayerNorm(32).eval()
    with torch.no_grad():
        model.weight.normal_()
        model.bias.normal_()
    x = torch.randn(2, 256, 32)
    exe = hloalias.compile(model, (x,))
    assert "2x256x32xf64" not in exe.mlir  # (a float64 scalar eps remains, converted once)
    assert exe.memory_stats["temp_bytes"] == 4_096
    with torch.no_grad():
        torch.testing.assert_close(exe(x), model(x))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_layer_norm_dtypes_equal_eager(dtype: torch.dtype) -> None:
    """float64 stays float64; bf16 computes in float32 and rounds once."""
    torch.manual_seed(1)
    model = torch.nn.LayerNorm([4, 8]).to(dtype).eval()
    x = torch.randn(3, 4, 8, dtype=dtype) * 5 + 2
    exe = hloalias.compile(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(exe(x), model(x))
