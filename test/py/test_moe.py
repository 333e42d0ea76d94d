"""Hugging Face mixture-of-experts models with their default experts code
(issue 29): ``grouped_mm_experts_forward`` sorts the token-expert pairs,
counts them per expert with ``torch.histc`` and multiplies each group by
its expert through ``transformers::grouped_mm_fallback`` (the custom op it
calls when ``torch.export`` traces float32 weights).  torch-mlir lowers
neither; ``hloalias.frontend.decompositions`` lowers both."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hloalias
from hloalias.frontend.decompositions import custom_op_decompositions, grouped_mm, grouped_mm_backward

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


def test_grouped_mm_backward_equals_the_library_loop() -> None:
    torch.manual_seed(3)
    rows, grad = torch.randn(10, 6), torch.randn(10, 5)
    weight = torch.randn(4, 5, 6).transpose(1, 2)
    for counts in ([3, 0, 4, 3], [0, 0, 10, 0], [2, 2, 0, 3], [0, 0, 0, 0]):
        offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
        expected = torch.ops.transformers.grouped_mm_fallback_backward(rows, weight, offsets, grad)
        for got, want in zip(grouped_mm_backward(rows, weight, offsets, grad), expected):
            torch.testing.assert_close(got, want)


def test_custom_op_table_names_the_loaded_ops() -> None:
    namespace = torch.ops.transformers
    table = {op: entry for op, entry in custom_op_decompositions().items() if op.namespace == "transformers"}
    assert table == {
        namespace.grouped_mm_fallback.default: grouped_mm,
        namespace.grouped_mm_fallback_backward.default: grouped_mm_backward,
    }


def test_mixtral_training_step_equals_eager() -> None:
    """A training step through the default experts: autograd records
    ``grouped_mm_fallback_backward``, which the step's capture did not
    lower (nor the forward op: it lacked the custom-op entries)."""
    ids = torch.randint(0, 512, (2, 8), generator=torch.Generator().manual_seed(4))

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = _tiny_mixtral().train()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
        def step(batch: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = model(batch, labels=batch).loss
            loss.backward()
            opt.step()
            return loss
        return step

    eager_model, eager_opt = build()
    model, opt = build()
    compiled = hloalias.compile_training_step(step_of(model, opt), model, opt, (ids,))
    eager_step = step_of(eager_model, eager_opt)
    for _ in range(2):
        torch.testing.assert_close(compiled(ids), eager_step(ids), rtol=TOL, atol=TOL)
    compiled.write_back()
    # Adam divides by the root of the second moment: a gradient near zero
    # (an expert few tokens reach) turns float-order differences into
    # update differences of up to ~lr / 40.
    for got, want in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(got, want, rtol=TOL, atol=1e-3)


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
