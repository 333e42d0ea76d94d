"""fold-repeat-into-dot-general with widen-one-row-updates, measured by XLA
on an HF Llama with grouped-query attention (4 heads over 2 KV heads,
head_dim 16) stepped as transformers' static-cache export recipe runs it:
the repeated, transposed K and the repeated V that ``repeat_kv`` + SDPA
leave in temp are gone (the dots read the cache in place), the step's
results are bit-identical to the pipeline without the passes (the SDPA
scale, 0.5, is a power of two) and equal eager."""

from __future__ import annotations

import copy

import pytest
import torch

import hloalias
from hloalias.pipeline import CPU_PIPELINE, DEFAULT_PIPELINE

PASS = "fold-repeat-into-dot-general"
WIDEN = "widen-one-row-updates"
# The CPU pipeline's element (with its chunk-bytes option).
FOLD = next(element for element in CPU_PIPELINE[len("builtin.module("):-1].split(", ") if element.startswith(PASS))
WITHOUT = CPU_PIPELINE.replace(f" {WIDEN}, {FOLD},", "")
FOLD_ONLY = CPU_PIPELINE.replace(f" {WIDEN},", "")
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


# Temp without the passes: K repeated to all heads and transposed (4 x 16 x
# L f32) plus V repeated (4 x L x 16 f32) plus the step's activations.  With
# them: the scores and the step's activations only; no cache-sized value.
# fold-repeat-into-dot-general alone leaves the step as it was: the cache
# write is a one-row update, which XLA:CPU would duplicate into the reshape
# the folded dots read (widen-one-row-updates makes it a two-row one).
@pytest.mark.parametrize(("cache_len", "temp_without", "temp_with"), [
    (256, 135_168, 8_320),
    (4096, 2_162_688, 147_456),
])
def test_gqa_decode_step_reads_the_cache_unrepeated(cache_len: int, temp_without: int, temp_with: int) -> None:
    model = _llama_step(cache_len)
    args = (torch.tensor([[7]]), torch.tensor([17]))
    eager = copy.deepcopy(model)
    expected = eager(*args)
    without, result_without = _run(model, args, WITHOUT)
    fold_only, _ = _run(model, args, FOLD_ONLY)
    folded, result = _run(model, args, CPU_PIPELINE)
    kv_head_cache_bytes = KV_HEADS * cache_len * HEAD_DIM * 4
    assert without.memory_stats["temp_bytes"] == temp_without
    assert fold_only.memory_stats["temp_bytes"] == temp_without
    assert folded.memory_stats["temp_bytes"] == temp_with
    assert temp_with < kv_head_cache_bytes
    repeated = f"-> tensor<1x{KV_HEADS}x{HEADS // KV_HEADS}x{cache_len}x{HEAD_DIM}xf32>"
    assert without.mlir.count(repeated) == 2 and folded.mlir.count(repeated) == 0
    assert torch.equal(result, result_without)
    torch.testing.assert_close(result, expected)
    state = folded.state_dict()
    for name, value in eager.state_dict().items():
        if "cache" in name:
            torch.testing.assert_close(state[name], value, rtol=0, atol=0)


class _Qwen2Step(torch.nn.Module):
    """A Qwen2 (biased q/k/v projections) stepped as the Llama above."""

    def __init__(self, cache_len: int) -> None:
        super().__init__()
        import transformers
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            vocab_size=256, hidden_size=HEADS * HEAD_DIM, intermediate_size=128, num_hidden_layers=1,
            num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=cache_len,
            bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )).eval()
        model.generation_config = transformers.GenerationConfig(
            use_cache=True, cache_implementation="static",
            cache_config={"batch_size": 1, "max_cache_len": cache_len},
            bos_token_id=0, eos_token_id=0, pad_token_id=0)
        self.inner = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=cache_len)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.inner(input_ids=input_ids, cache_position=cache_position)
        return logits


def test_qwen2_decode_step_reads_the_cache_unrepeated() -> None:
    model = _Qwen2Step(256)
    args = (torch.tensor([[7]]), torch.tensor([17]))
    expected = copy.deepcopy(model)(*args)
    without, result_without = _run(model, args, WITHOUT)
    folded, result = _run(model, args, CPU_PIPELINE)
    assert without.memory_stats["temp_bytes"] == 135_168
    assert folded.memory_stats["temp_bytes"] == 8_320
    assert torch.equal(result, result_without)
    torch.testing.assert_close(result, expected)


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


def test_default_pipeline_widens_then_folds() -> None:
    assert f"bitcast-overwrite-scatter, {WIDEN}, {PASS}," in DEFAULT_PIPELINE
    # Chunks of a scaled cache only where their bits were measured: XLA:CPU.
    assert f"{WIDEN}, {PASS}{{chunk-bytes=262144}}," in CPU_PIPELINE


_ONE_ROW_WRITE = """
func.func @main(%cache: tensor<1x2x8x4xf32>, %row: tensor<1x2x1x4xf32>, %i: tensor<i64>, %q: tensor<2x3x4xf32>) -> (tensor<1x2x8x4xf32>, tensor<2x3x8xf32>) {
  %z = stablehlo.constant dense<0> : tensor<i64>
  %u = stablehlo.dynamic_update_slice %cache, %row, %z, %z, %i, %z : (tensor<1x2x8x4xf32>, tensor<1x2x1x4xf32>, tensor<i64>, tensor<i64>, tensor<i64>, tensor<i64>) -> tensor<1x2x8x4xf32>
  %k = stablehlo.reshape %u : (tensor<1x2x8x4xf32>) -> tensor<2x8x4xf32>
  %d = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x3x4xf32>, tensor<2x8x4xf32>) -> tensor<2x3x8xf32>
  return %u, %d : tensor<1x2x8x4xf32>, tensor<2x3x8xf32>
}
"""


def test_widened_write_equals_the_one_row_write_at_every_start() -> None:
    from hloalias.mlir import new_context, parse_module, print_module
    from hloalias.passes import WidenOneRowUpdates
    from hloalias.runtime.ownership import array_to_torch, torch_to_device
    from hloalias.runtime.pjrt import compile_module, device_for

    module = parse_module(_ONE_ROW_WRITE, new_context())
    assert WidenOneRowUpdates().apply(module).widened == 1
    widened = print_module(module)
    assert "tensor<1x2x2x4xf32>" in widened
    assert WidenOneRowUpdates().apply(module).widened == 0
    device = device_for("cpu")
    one_row, two_rows = compile_module(_ONE_ROW_WRITE, device), compile_module(widened, device)
    torch.manual_seed(5)
    cache, row, q = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 1, 4), torch.randn(2, 3, 4)
    for start in (-(2**63), -5, -1, 0, 3, 6, 7, 8, 100, 2**63 - 1):
        on_device = [torch_to_device(a, device, owned=False) for a in (cache, row, torch.tensor(start), q)]
        expected = [array_to_torch(a) for a in one_row.execute(on_device)]
        got = [array_to_torch(a) for a in two_rows.execute(on_device)]
        for a, b in zip(got, expected):
            assert torch.equal(a, b), start
        written = min(max(start, 0), 7)
        assert torch.equal(expected[0][:, :, written], row[:, :, 0]), start  # the case does what it says


def test_gqa_decode_head_dim_64_scales_the_cache_unrepeated() -> None:
    """head_dim 64: SDPA's scale on K (64 ** -0.25) is no power of two, so
    it may not move onto the scores exactly; the exact default applies it
    to the unrepeated cache instead.  K's repeat and transpose leave temp
    (one scaled copy of a layer's K cache, 131,072 bytes, stays), and the
    step is bit-identical to the pipeline without the passes."""
    from bench.models import LlamaDecodeConfig, LlamaDecodeStep

    heads, kv_heads, head_dim, cache_len = 4, 2, 64, 256
    model = LlamaDecodeStep(LlamaDecodeConfig(
        vocab_size=256, hidden_size=heads * head_dim, intermediate_size=128, layers=1,
        heads=heads, kv_heads=kv_heads, max_cache_len=cache_len,
    ))
    args = (torch.tensor([[7]]), torch.tensor([17]))
    expected = copy.deepcopy(model)(*args)
    without, result_without = _run(model, args, WITHOUT)
    folded, result = _run(model, args, CPU_PIPELINE)
    assert without.memory_stats["temp_bytes"] == 528_384
    assert folded.memory_stats["temp_bytes"] == 135_168
    repeated = f"-> tensor<1x{kv_heads}x{heads // kv_heads}x{cache_len}x{head_dim}xf32>"
    assert without.mlir.count(repeated) == 2 and folded.mlir.count(repeated) == 0
    assert torch.equal(result, result_without)
    torch.testing.assert_close(result, expected)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_gqa_decode_long_cache_reads_the_scaled_cache_in_chunks(family: str) -> None:
    """head_dim 64, cache 4096: the exact default's scaled copy of a layer's
    K cache (2 KV heads x 4096 x 64 f32, 2 MiB) is larger than chunk-bytes
    (256 KiB) and than the scores, so the pass scales and reads it in 8
    chunks of 512 positions in a while loop: temp holds one chunk's scaled
    copy instead of the whole (with chunk-bytes=0, as before the loop:
    2,162,688 bytes).  Bit-identical to the pipeline without the passes.
    Qwen2 (biased q/k/v) and Mistral (sliding window 4096) built with the
    same sizes and recipe fold the same way."""
    from bench.models import LlamaDecodeConfig, LlamaDecodeStep

    heads, kv_heads, head_dim, cache_len = 4, 2, 64, 4096
    model = LlamaDecodeStep(LlamaDecodeConfig(
        vocab_size=256, hidden_size=heads * head_dim, intermediate_size=128, layers=1,
        heads=heads, kv_heads=kv_heads, max_cache_len=cache_len, family=family,
    ))
    args = (torch.tensor([[7]]), torch.tensor([17]))
    expected = copy.deepcopy(model)(*args)
    without, result_without = _run(model, args, WITHOUT)
    chunked, result = _run(model, args, CPU_PIPELINE)
    assert without.memory_stats["temp_bytes"] == 8_454_144
    assert chunked.memory_stats["temp_bytes"] == 336_032
    assert chunked.memory_stats["temp_bytes"] < kv_heads * cache_len * head_dim * 4 // 4
    assert "stablehlo.while" in chunked.mlir
    assert torch.equal(result, result_without)
    torch.testing.assert_close(result, expected)
    if family == "llama":
        whole, result_whole = _run(model, args, CPU_PIPELINE.replace(FOLD, PASS))
        assert whole.memory_stats["temp_bytes"] == 2_162_688
        assert "stablehlo.while" not in whole.mlir
        assert torch.equal(result_whole, result_without)


_SCALED_SCORES = """
func.func @main(%q: tensor<8x1x64xf32>, %k: tensor<1x4xLx64xf32>, %c: tensor<f32>) -> tensor<8x1xLxf32> {
  %r = stablehlo.reshape %k : (tensor<1x4xLx64xf32>) -> tensor<1x4x1xLx64xf32>
  %b = stablehlo.broadcast_in_dim %r, dims = [0, 1, 2, 3, 4] : (tensor<1x4x1xLx64xf32>) -> tensor<1x4x2xLx64xf32>
  %h = stablehlo.reshape %b : (tensor<1x4x2xLx64xf32>) -> tensor<1x8xLx64xf32>
  %t = stablehlo.transpose %h, dims = [0, 1, 3, 2] : (tensor<1x8xLx64xf32>) -> tensor<1x8x64xLxf32>
  %s = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<1x8x64xLxf32>
  %m = stablehlo.multiply %t, %s : tensor<1x8x64xLxf32>
  %k3 = stablehlo.reshape %m : (tensor<1x8x64xLxf32>) -> tensor<8x64xLxf32>
  %d = stablehlo.dot_general %q, %k3, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<8x1x64xf32>, tensor<8x64xLxf32>) -> tensor<8x1xLxf32>
  return %d : tensor<8x1xLxf32>
}
"""


@pytest.mark.parametrize("cache_len", [1024, 4096])
def test_chunked_scores_equal_the_unrewritten_dot(cache_len: int) -> None:
    """The scores read in chunks are bit-identical to the unrewritten
    repeat + transpose + scale + dot and to the whole scaled cache, over
    random caches and queries of several magnitudes and scales (64 ** -0.25
    and others that are no power of two)."""
    from hloalias.mlir import new_context, parse_module, print_module
    from hloalias.passes import FoldRepeatIntoDotGeneral
    from hloalias.runtime.ownership import array_to_torch, torch_to_device
    from hloalias.runtime.pjrt import compile_module, device_for

    text = _SCALED_SCORES.replace("xLx", f"x{cache_len}x")

    def rewritten(chunk_bytes: int) -> str:
        module = parse_module(text, new_context())
        report = FoldRepeatIntoDotGeneral(chunk_bytes=chunk_bytes).apply(module)
        assert (report.folded, report.chunked) == (1, 1 if chunk_bytes else 0)
        return print_module(module)

    device = device_for("cpu")
    chunked_text = rewritten(262144)
    assert "stablehlo.while" in chunked_text
    programs = [compile_module(t, device) for t in (text, rewritten(0), chunked_text)]
    generator = torch.Generator().manual_seed(3)
    for trial, scale in enumerate((64 ** -0.25, 0.1, 1 / 3, 0.7)):
        q = torch.randn(8, 1, 64, generator=generator) * 10.0 ** (trial - 1)
        k = torch.randn(1, 4, cache_len, 64, generator=generator) * 10.0 ** (1 - trial)
        inputs = [torch_to_device(a, device, owned=False) for a in (q, k, torch.tensor(scale))]
        unrewritten, whole, chunked = (array_to_torch(p.execute(inputs)[0]) for p in programs)
        assert torch.equal(chunked, unrewritten), scale
        assert torch.equal(whole, unrewritten), scale
        torch.testing.assert_close(chunked, torch.einsum("hd,hld->hl", q[:, 0],
                                                          (k[0] * scale).repeat_interleave(2, 0))[:, None])


def test_gqa_decode_bf16_cache_reads_the_cache_unrepeated() -> None:
    """A bf16 model (cache bf16 too) at head_dim 64, cache 4096: torch's
    SDPA math upcasts the repeated K and V to f32; the pass applies the
    convert (and K's scale) to the unrepeated cache, so the dots read one
    f32 copy of each KV-head cache instead of the repeated f32 K and V.
    Not in chunks (XLA:CPU would hoist the convert out of the loop).
    Bit-identical to the pipeline without the passes."""
    from bench.models import LlamaDecodeConfig, LlamaDecodeStep

    heads, kv_heads, head_dim, cache_len = 4, 2, 64, 4096
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = LlamaDecodeStep(LlamaDecodeConfig(
            vocab_size=256, hidden_size=heads * head_dim, intermediate_size=128, layers=1,
            heads=heads, kv_heads=kv_heads, max_cache_len=cache_len,
        ))
    finally:
        torch.set_default_dtype(torch.float32)
    assert {value.dtype for value in model.state_dict().values()} == {torch.bfloat16}
    args = (torch.tensor([[7]]), torch.tensor([17]))
    expected = copy.deepcopy(model)(*args)
    without, result_without = _run(model, args, WITHOUT)
    folded, result = _run(model, args, CPU_PIPELINE)
    assert without.memory_stats["temp_bytes"] == 10_363_904
    assert folded.memory_stats["temp_bytes"] == 6_169_600
    repeated = f"-> tensor<1x{kv_heads}x{heads // kv_heads}x{cache_len}x{head_dim}xbf16>"
    assert without.mlir.count(repeated) == 2 and folded.mlir.count(repeated) == 0
    assert "stablehlo.while" not in folded.mlir
    assert torch.equal(result, result_without)
    # Eager runs torch's fused bf16 attention kernel, hloalias (with or
    # without the passes, the same bits) SDPA's math in f32 with bf16 casts.
    torch.testing.assert_close(result, expected, atol=1e-2, rtol=0)
