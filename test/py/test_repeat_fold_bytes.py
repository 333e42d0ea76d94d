"""fold-repeat-into-dot-general, measured by XLA on an HF Llama with
grouped-query attention (4 heads over 2 KV heads, head_dim 16) stepped as
transformers' static-cache export recipe runs it: the repeated, transposed
K copy ``repeat_kv`` + SDPA leave in temp shrinks to one transposed copy of
the cache itself, the step's results are bit-identical to the pipeline
without the pass (the SDPA scale, 0.5, is a power of two) and equal eager."""

from __future__ import annotations

import copy

import pytest
import torch

import hloalias
from hloalias.pipeline import CPU_PIPELINE, DEFAULT_PIPELINE

PASS = "fold-repeat-into-dot-general"
WITHOUT = CPU_PIPELINE.replace(f" {PASS},", "")
HEAD_DIM, HEADS, KV_HEADS = 16, 4, 2


def _llama_step(cache_len: int) -> torch.nn.Module:
    from bench.models import LlamaDecodeConfig, LlamaDecodeStep

    return LlamaDecodeStep(LlamaDecodeConfig(
        vocab_size=256, hidden_size=HEADS * HEAD_DIM, intermediate_size=128, layers=1,
        heads=HEADS, kv_heads=KV_HEADS, max_cache_len=cache_len,
    ))


def _run(model: torch.nn.Module, args: tuple[torch.Tensor, ...], pipeline: str) -> tuple[hloalias.Executable, torch.Tensor]:
    module = copy.deepcopy(model)
    exe = hloalias.compile(module, args, pipeline=pipeline)
    return exe, exe(*args)


# Temp without the pass: K repeated to all heads and transposed (4 x 16 x L
# f32) plus V repeated (4 x L x 16 f32) plus the step's small activations.
# With it: K transposed once per KV head (2 x 16 x L f32); V keeps its
# repeat (its dot would read the updated cache through a reshape, into
# which XLA:CPU duplicates the in-place cache update: the pass leaves it).
@pytest.mark.parametrize(("cache_len", "temp_without", "temp_with"), [
    (256, 135_168, 102_400),
    (4096, 2_162_688, 1_638_400),
])
def test_gqa_decode_step_drops_the_repeated_k(cache_len: int, temp_without: int, temp_with: int) -> None:
    model = _llama_step(cache_len)
    args = (torch.tensor([[7]]), torch.tensor([17]))
    eager = copy.deepcopy(model)
    expected = eager(*args)
    without, result_without = _run(model, args, WITHOUT)
    folded, result = _run(model, args, CPU_PIPELINE)
    k_bytes = KV_HEADS * cache_len * HEAD_DIM * 4
    assert without.memory_stats["temp_bytes"] == temp_without
    assert folded.memory_stats["temp_bytes"] == temp_with
    assert temp_without - temp_with == k_bytes  # a whole-heads K copy became a KV-heads one
    repeated = f"-> tensor<1x{KV_HEADS}x{HEADS // KV_HEADS}x{cache_len}x{HEAD_DIM}xf32>"
    assert without.mlir.count(repeated) == 2 and folded.mlir.count(repeated) == 1
    assert torch.equal(result, result_without)
    torch.testing.assert_close(result, expected)
    state = folded.state_dict()
    for name, value in eager.state_dict().items():
        if "cache" in name:
            torch.testing.assert_close(state[name], value, rtol=0, atol=0)


def test_gqa_prefill_reads_kv_unrepeated() -> None:
    """512 tokens into a 1024-token cache: the cache is written by a scatter
    there, and both K and V are read unrepeated."""
    model = _llama_step(1024)
    args = (torch.randint(0, 256, (1, 512), generator=torch.Generator().manual_seed(0)), torch.arange(512))
    expected = copy.deepcopy(model)(*args)
    without, result_without = _run(model, args, WITHOUT)
    folded, result = _run(model, args, CPU_PIPELINE)
    assert without.memory_stats["temp_bytes"] == 19_267_584
    assert folded.memory_stats["temp_bytes"] == 18_874_368
    repeated = f"-> tensor<1x{KV_HEADS}x{HEADS // KV_HEADS}x1024x{HEAD_DIM}xf32>"
    assert without.mlir.count(repeated) == 2 and folded.mlir.count(repeated) == 0
    assert torch.equal(result, result_without)
    torch.testing.assert_close(result, expected)


def test_default_pipeline_folds_repeats() -> None:
    assert f"bitcast-overwrite-scatter, {PASS}," in DEFAULT_PIPELINE
