"""``F.ctc_loss`` compiled (frontend/ctc_loss.py) against eager: the loss
with lengths that vary per call (target length 0, repeated labels,
``input_length < T``, infeasible alignments under ``zero_infinity``),
padded and concatenated targets, every reduction, a blank other than 0;
the gradient with respect to ``log_probs`` itself (torch's backward adds
``exp(log_probs)``); and a tiny Wav2Vec2ForCTC trained three AdamW steps.

Tolerances: float32; the recursion sums in another order than torch's
kernel, so losses and gradients match to ``1e-5`` relative."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import hloalias

RTOL, ATOL = 1e-5, 1e-5
T, N, C, S = 14, 4, 6, 5


def _log_probs(seed: int, steps: int = T, batch: int = N) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(steps, batch, C, generator=generator).log_softmax(-1)


def _targets() -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    targets = torch.randint(1, C, (N, S), generator=generator)
    targets[1] = torch.tensor([2, 2, 3, 3, 3])  # repeats: a blank must separate them
    return targets


#: (input_lengths, target_lengths) per call of one compiled function.
LENGTHS = [
    ([14, 9, 11, 3], [5, 5, 0, 2]),
    ([14, 14, 1, 7], [0, 3, 1, 5]),  # the last sample cannot align: infinite loss
    ([5, 12, 14, 0], [2, 4, 5, 0]),  # input_length 0 with an empty target: loss 0
]


def _concatenated(targets: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([targets[i, : int(target_lengths[i])] for i in range(targets.shape[0])])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_loss_equals_eager_as_lengths_vary(reduction: str, zero_infinity: bool) -> None:
    def f(lp: torch.Tensor, t: torch.Tensor, il: torch.Tensor, tl: torch.Tensor) -> torch.Tensor:
        return F.ctc_loss(lp, t, il, tl, reduction=reduction, zero_infinity=zero_infinity)

    targets = _targets()
    example = (_log_probs(0), targets, torch.tensor(LENGTHS[0][0]), torch.tensor(LENGTHS[0][1]))
    compiled = hloalias.compile(f, list(example))
    for seed, (input_lengths, target_lengths) in enumerate(LENGTHS):
        args = (_log_probs(seed), targets, torch.tensor(input_lengths), torch.tensor(target_lengths))
        torch.testing.assert_close(compiled(*args), f(*args), rtol=RTOL, atol=ATOL)


def test_concatenated_targets_other_blank_and_unbatched() -> None:
    targets = _targets()
    blank = C - 1
    padded = torch.where(targets == blank, torch.zeros_like(targets), targets)

    def concatenated(lp: torch.Tensor, t: torch.Tensor, il: torch.Tensor, tl: torch.Tensor) -> torch.Tensor:
        return F.ctc_loss(lp, t, il, tl, blank=blank, reduction="none", zero_infinity=True)

    def unbatched(lp: torch.Tensor, t: torch.Tensor, il: torch.Tensor, tl: torch.Tensor) -> torch.Tensor:
        return F.ctc_loss(lp[:, 0], t[0], il[0], tl[0], reduction="sum")

    for f in (concatenated, unbatched):
        compiled = None
        for seed, (input_lengths, target_lengths) in enumerate(LENGTHS):
            # The concatenated layout has sum(target_lengths) elements, a
            # static total; eager's unbatched targets hold exactly their length.
            il, tl = torch.tensor(input_lengths), torch.tensor([5, 3, 0, 2])
            t = _concatenated(padded, tl) if f is concatenated else padded
            args = (_log_probs(seed), t, il, tl)
            compiled = compiled or hloalias.compile(f, list(args))
            torch.testing.assert_close(compiled(*args), f(*args), rtol=RTOL, atol=ATOL)


def _sgd_on(model: torch.nn.Module, step: Callable[..., torch.Tensor]) -> tuple[Callable[..., torch.Tensor], Any]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)

    def train(*batch: Any) -> torch.Tensor:
        loss = step(*batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return train, optimizer


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gradient_with_respect_to_log_probs_equals_eager(reduction: str) -> None:
    """``log_probs`` as the parameter (no ``log_softmax`` after it): SGD
    with lr 1 leaves ``log_probs - grad``, torch's gradient, which holds
    ``exp(log_probs)`` for ``t < input_length`` besides the posterior."""

    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.log_probs = torch.nn.Parameter(_log_probs(3))

    weights = torch.linspace(0.5, 2.0, N)

    def step_of(holder: Holder) -> Callable[..., torch.Tensor]:
        def step(t: torch.Tensor, il: torch.Tensor, tl: torch.Tensor) -> torch.Tensor:
            loss = F.ctc_loss(holder.log_probs, t, il, tl, reduction=reduction, zero_infinity=True)
            return loss if reduction == "mean" else (loss * weights).sum()

        return step

    eager_holder, holder = Holder(), Holder()
    eager_train, _ = _sgd_on(eager_holder, step_of(eager_holder))
    train_fn, optimizer = _sgd_on(holder, step_of(holder))
    batches = [(_targets(), torch.tensor(il), torch.tensor(tl)) for il, tl in LENGTHS]
    train = hloalias.compile_training_step(train_fn, holder, optimizer, batches[0])
    for batch in batches:
        torch.testing.assert_close(train(*batch), eager_train(*batch).detach(), rtol=RTOL, atol=ATOL)
        train.write_back()
        torch.testing.assert_close(holder.log_probs.detach(), eager_holder.log_probs.detach(), rtol=RTOL, atol=ATOL)


def test_tiny_wav2vec2_for_ctc_trains_like_eager() -> None:
    """Wav2Vec2's CTC fine-tuning step as users write it (HF's own loss
    path reads ``labels.max()`` on the host): three AdamW steps."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Wav2Vec2Config(
        vocab_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2, mask_time_prob=0.0, layerdrop=0.0, hidden_dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
        hidden_act="gelu", pad_token_id=0,
    )
    torch.manual_seed(0)
    eager_model = transformers.Wav2Vec2ForCTC(config).train()
    model = copy.deepcopy(eager_model)

    def step_of(m: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
        def step(audio: torch.Tensor, labels: torch.Tensor, il: torch.Tensor, tl: torch.Tensor) -> torch.Tensor:
            log_probs = m(audio).logits.log_softmax(-1).transpose(0, 1)
            loss = F.ctc_loss(log_probs, labels, il, tl, blank=0, zero_infinity=True)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        return step

    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(5)
    audio_length, batch = 400, 2
    frames = int(eager_model._get_feat_extract_output_lengths(torch.tensor(audio_length)))
    batches = []
    for target_lengths in ([4, 2], [0, 5], [3, 3]):
        audio = torch.randn(batch, audio_length, generator=generator)
        labels = torch.randint(1, config.vocab_size, (batch, 5), generator=generator)
        batches.append((audio, labels, torch.tensor([frames, frames - 7]), torch.tensor(target_lengths)))
    train = hloalias.compile_training_step(step_of(model, opt), model, opt, batches[0])
    for data in batches:
        eager_loss = step_of(eager_model, eager_opt)(*data)
        torch.testing.assert_close(train(*data), eager_loss.detach(), rtol=1e-4, atol=1e-5)
    train.write_back()
    eager_state, state = eager_model.state_dict(), model.state_dict()
    for key in eager_state:
        torch.testing.assert_close(state[key], eager_state[key], rtol=1e-4, atol=1e-5, msg=key)


def test_lengths_given_as_lists() -> None:
    """``aten.ctc_loss.IntList``: the lengths are constants of the program."""

    def f(lp: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.ctc_loss(lp, t, [14, 9, 11, 3], [5, 5, 0, 2], reduction="sum")

    args = (_log_probs(0), _targets())
    torch.testing.assert_close(hloalias.compile(f, list(args))(*args), f(*args), rtol=RTOL, atol=ATOL)
