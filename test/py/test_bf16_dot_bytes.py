"""accumulate-bf16-dots-in-f32, measured by XLA: bf16 Linears on XLA:CPU no
longer hold an f32 copy of every weight in temp, and results are unchanged
up to the dot library's summation order."""

from __future__ import annotations

import copy

import torch

import hloalias
from hloalias.pipeline import CPU_PIPELINE, DEFAULT_PIPELINE

PASS = "accumulate-bf16-dots-in-f32"
WITHOUT = CPU_PIPELINE.replace(f" {PASS},", "")
SIDE, LAYERS, BATCH = 512, 4, 2


class Bf16Linears(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(SIDE, SIDE, bias=False) for _ in range(LAYERS)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_bf16_weights_are_not_upcast_in_temp() -> None:
    torch.manual_seed(0)
    model = Bf16Linears().to(torch.bfloat16)
    x = torch.randn(BATCH, SIDE, dtype=torch.bfloat16)
    expected = model(x)
    without = hloalias.compile(copy.deepcopy(model), (x,), pipeline=WITHOUT)
    with_pass = hloalias.compile(copy.deepcopy(model), (x,), pipeline=CPU_PIPELINE)
    weight_f32_bytes = SIDE * SIDE * 4
    # Without: every weight converted to f32 up front, plus two f32 activations.
    assert without.memory_stats["temp_bytes"] == LAYERS * weight_f32_bytes + 2 * BATCH * SIDE * 4
    # With: one f32 dot result (2 x 512 f32) at a time.
    assert with_pass.memory_stats["temp_bytes"] == 4_096
    assert f"-> tensor<{BATCH}x{SIDE}xf32>" in with_pass.mlir
    torch.testing.assert_close(with_pass(x), expected)
    torch.testing.assert_close(with_pass(x), without(x))


def test_cpu_pipeline_runs_the_pass_and_the_default_does_not() -> None:
    assert f"alias-donated-buffers, {PASS}," in CPU_PIPELINE
    assert PASS not in DEFAULT_PIPELINE


class Bf16BiasedLinears(torch.nn.Module):
    """Linears with a bias: torch-mlir lowers them as ``addmm`` in f32."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(SIDE, SIDE) for _ in range(LAYERS)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_biased_bf16_linears_read_their_weights_unconverted() -> None:
    """The f32 dot of converted bf16 operands (``addmm``) reads the bf16
    values; on the old pass every weight's f32 copy stayed in temp."""
    torch.manual_seed(0)
    model = Bf16BiasedLinears().to(torch.bfloat16)
    x = torch.randn(BATCH, SIDE, dtype=torch.bfloat16)
    expected = model(x)
    without = hloalias.compile(copy.deepcopy(model), (x,), pipeline=WITHOUT)
    with_pass = hloalias.compile(copy.deepcopy(model), (x,), pipeline=CPU_PIPELINE)
    weight_f32_bytes = SIDE * SIDE * 4
    # Without: every weight converted to f32 up front, plus two f32 activations.
    assert without.memory_stats["temp_bytes"] == LAYERS * weight_f32_bytes + 2 * BATCH * SIDE * 4
    # With: one f32 dot result (2 x 512 f32) at a time, as for Linears without a bias.
    assert with_pass.memory_stats["temp_bytes"] == 4_096
    assert "stablehlo.transpose" not in with_pass.mlir
    torch.testing.assert_close(with_pass(x), expected)
    torch.testing.assert_close(with_pass(x), without(x))
