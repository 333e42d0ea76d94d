"""``recompute-shared-activations`` in the training pipeline: a tiny GPT-2's
training step (``gelu_new``: ``0.5 x (1 + tanh(y))``) keeps no ``tanh``
buffer from the forward to the backward, and computes the same bits as the
step without the pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.runtime.training import TRAINING_PIPELINE

PASS = "recompute-shared-activations"


def _step(model: Any, opt: torch.optim.Optimizer) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(ids: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss  # type: ignore[no-any-return]

    return step


def test_recompute_shared_activations_drops_the_saved_tanh() -> None:
    transformers = pytest.importorskip("transformers")
    assert PASS in TRAINING_PIPELINE
    without = TRAINING_PIPELINE.replace(f"{PASS}, ", "")
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )

    def model_of() -> Any:
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(config).train()

    torch.manual_seed(1)
    ids = torch.randint(0, 64, (2, 16))
    eager = model_of()
    eager_step = _step(eager, torch.optim.AdamW(eager.parameters(), lr=1e-3))
    steps, models = [], []
    for pipeline in (TRAINING_PIPELINE, without):
        model = model_of()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        steps.append(hloalias.compile_training_step(_step(model, opt), model, opt, (ids,), pipeline=pipeline))
        models.append(model)
    with_pass, without_pass = steps
    # Two f32[2,16,128] buffers fewer (16,384 bytes each): each layer's
    # 1 + tanh(y), which the backward now recomputes inside its own loop.
    assert without_pass.memory_stats["temp_bytes"] == 243652
    assert with_pass.memory_stats["temp_bytes"] == 210884
    for _ in range(2):
        expected = eager_step(ids).detach()
        got, reference = with_pass(ids), without_pass(ids)
        torch.testing.assert_close(got, reference, rtol=0, atol=0)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for step in steps:
        step.write_back()
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
