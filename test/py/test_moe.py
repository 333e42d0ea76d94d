"""Hugging Face mixture-of-experts models with their default experts code
(issue 29): ``grouped_mm_experts_forward`` sorts the token-expert pairs,
counts them per expert with ``torch.histc`` and multiplies each group by
its expert through ``transformers::grouped_mm_fallback`` (the custom op it
calls when ``torch.export`` traces float32 weights).  torch-mlir lowers
neither; ``hloalias.frontend.decompositions`` lowers both."""

from __future__ import annotations

import pytest
import torch

import hloalias
from hloalias.frontend.decompositions import custom_op_decompositions, grouped_mm

transformers = pytest.importorskip("transformers")
moe = pytest.importorskip("transformers.integrations.moe")

TOL = 1e-4


def _tiny_mixtral() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=128,
    )
    return transformers.MixtralForCausalLM(config).eval()


def test_grouped_mm_equals_the_library_loop() -> None:
    """Empty groups, one group holding every row, rows past the last
    offset (zero in the library's loop) and a transposed weight view."""
    torch.manual_seed(1)
    rows = torch.randn(10, 6)
    weight = torch.randn(4, 5, 6).transpose(1, 2)  # [E, K, N] as a view, as the experts pass it
    for counts in ([3, 0, 4, 3], [0, 0, 10, 0], [2, 2, 0, 3], [0, 0, 0, 0]):
        offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
        expected = torch.ops.transformers.grouped_mm_fallback(rows, weight, offsets)
        torch.testing.assert_close(grouped_mm(rows, weight, offsets), expected)


def test_custom_op_table_names_the_loaded_op() -> None:
    assert custom_op_decompositions() == {torch.ops.transformers.grouped_mm_fallback.default: grouped_mm}


def test_mixtral_default_experts_equals_eager() -> None:
    """MixtralForCausalLM called as its docs show; on the old code the
    import fails (``transformers.grouped_mm_fallback`` not lowered)."""
    model = _tiny_mixtral()
    assert model.config._experts_implementation == "grouped_mm"
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(ids).logits
    exe = hloalias.compile(model, (ids,))
    torch.testing.assert_close(torch.as_tensor(exe(ids).logits), expected, rtol=TOL, atol=TOL)
    stats = exe.memory_stats
    # One [experts, rows, 2 x intermediate] product stack is the largest
    # temporary (4 x 64 x 256 f32); the per-expert weight slices and their
    # products are no longer copied (816,592 bytes with a loop of products).
    assert stats["argument_bytes"] == 1_150_528
    assert stats["temp_bytes"] == 274_896
