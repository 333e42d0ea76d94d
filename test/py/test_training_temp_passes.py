"""The training pipeline's temp passes on a tiny GPT-2's training step:
``recompute-shared-activations`` (``gelu_new``'s ``1 + tanh(y)`` is not kept
from the forward to the backward; same bits), ``one-hot-scatter-as-select``
(the cross-entropy backward's one-hot is not materialized) and
``recompute-for-late-readers`` (the GELU and LayerNorm outputs the weight
gradients read, the LayerNorm weights' broadcasts and the attention
probabilities' second shape are not kept from the forward to the backward;
same bits).  The pipeline's default ``min-saved-bytes`` floor leaves this
model's values (4-16 KiB) alone: its step is the step without that pass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.runtime.training import TRAINING_PIPELINE

RECOMPUTE = "recompute-shared-activations"
ONE_HOT = "one-hot-scatter-as-select"
LATE = "recompute-for-late-readers"


def _step(model: Any, opt: torch.optim.Optimizer) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(ids: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss  # type: ignore[no-any-return]

    return step


def test_training_temp_passes_on_tiny_gpt2() -> None:
    transformers = pytest.importorskip("transformers")
    assert f"{RECOMPUTE}, {ONE_HOT}, {LATE}, " in TRAINING_PIPELINE
    pipelines = {
        "default": TRAINING_PIPELINE,
        "late readers": TRAINING_PIPELINE.replace(f"{LATE}, ", f"{LATE}{{min-saved-bytes=0}}, "),
        "no kept reshapes": TRAINING_PIPELINE.replace(
            f"{LATE}, ", f"{LATE}{{kept-reshapes=false min-saved-bytes=0}}, "),
        "without late readers": TRAINING_PIPELINE.replace(f"{LATE}, ", ""),
        "without one-hot": TRAINING_PIPELINE.replace(f"{ONE_HOT}, {LATE}, ", ""),
        "without both": TRAINING_PIPELINE.replace(f"{RECOMPUTE}, {ONE_HOT}, {LATE}, ", ""),
    }
    config = transformers.GPT2Config(
        vocab_size=512, n_positions=16, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )

    def model_of() -> Any:
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(config).train()

    torch.manual_seed(1)
    ids = torch.randint(0, 512, (2, 16))
    eager = model_of()
    eager_step = _step(eager, torch.optim.AdamW(eager.parameters(), lr=1e-3))
    steps, models = {}, {}
    for key, pipeline in pipelines.items():
        model = model_of()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        steps[key] = hloalias.compile_training_step(_step(model, opt), model, opt, (ids,), pipeline=pipeline)
        models[key] = model
    temp = {key: step.memory_stats["temp_bytes"] for key, step in steps.items()}
    # recompute-shared-activations: two f32[2,16,128] buffers fewer (16,384
    # bytes each), each layer's 1 + tanh(y).  one-hot-scatter-as-select:
    # 65,600 bytes fewer, the f32[32,512] one-hot's 65,536 among them.
    # recompute-for-late-readers with no floor: 23,660 bytes fewer here, all
    # from its recomputed copies (on bench/training's 4x64-token GPT-2:
    # 7,517,764 -> 5,811,416 without kept reshapes, 5,287,128 with them, with
    # the default floor too: its values are 128-512 KiB).  The default floor
    # (64 KiB) copies nothing here: the same temp as without the pass.
    assert temp == {"default": 297220, "late readers": 273560, "no kept reshapes": 273560,
                    "without late readers": 297220, "without one-hot": 362820, "without both": 395588}
    for _ in range(2):
        expected = eager_step(ids).detach()
        losses = {key: step(ids) for key, step in steps.items()}
        # Same ops on the same values: bit-identical.
        torch.testing.assert_close(losses["without one-hot"], losses["without both"], rtol=0, atol=0)
        torch.testing.assert_close(losses["no kept reshapes"], losses["without late readers"], rtol=0, atol=0)
        torch.testing.assert_close(losses["default"], losses["without late readers"], rtol=0, atol=0)
        # XLA may evaluate the log-softmax backward's exp in another kernel
        # once it is a loop rather than a reduction fusion: last bits only.
        torch.testing.assert_close(losses["late readers"], losses["without both"], rtol=1e-6, atol=0)
        # A kept reshape read by softmax's backward: XLA fuses that reader
        # otherwise and may sum its row sums in another order.
        torch.testing.assert_close(losses["late readers"], losses["without late readers"], rtol=1e-6, atol=0)
        torch.testing.assert_close(losses["late readers"], expected, rtol=1e-5, atol=1e-5)
    for step in steps.values():
        step.write_back()
    params = {key: dict(model.named_parameters()) for key, model in models.items()}
    for name, p in eager.named_parameters():
        torch.testing.assert_close(params["without one-hot"][name], params["without both"][name], rtol=0, atol=0,
                                   msg=name)
        torch.testing.assert_close(params["no kept reshapes"][name], params["without late readers"][name], rtol=0,
                                   atol=0, msg=name)
        # As test_training's GPT-2 compares a step with eager's (AdamW
        # normalizes each gradient: a last-bit change moves a tiny one's update).
        torch.testing.assert_close(params["late readers"][name], p.detach(), rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(params["default"][name], params["without late readers"][name], rtol=0, atol=0,
                                   msg=name)
