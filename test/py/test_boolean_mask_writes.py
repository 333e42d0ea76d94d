"""Writes through a boolean mask.

``x[mask] = value`` with one value for every selected element
(``x[x < 0] = 0``, ``scores[pad] = -inf``, ``h[mask] = embedding``) is a
``where`` (frontend/decompositions.py ``index_put_by_mask``): torch-mlir
wrote it as ``nonzero`` and a scatter of a data-dependent number of rows,
which failed with "cannot lower aten.tensor".  A selection the program
computes with (``x[mask] = y[mask]``, ``x[mask] += 1``) has a size that
depends on the mask's values: it is refused naming its line and what to
write instead."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.errors import TorchImportError


def _clamp_negative(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[y < 0] = 0
    return y


def _fill_rows(h: torch.Tensor, mask: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
    out = h.clone()
    out[mask] = embedding  # Wav2Vec2's SpecAugment: one vector for every masked frame
    return out


def _pad_scores(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    scores = x @ x.transpose(-1, -2)
    scores[pad] = float("-inf")
    return scores.softmax(-1)


def _after_leading_slice(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[:, mask] = 7.0
    return y


def _accumulate(x: torch.Tensor, mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.index_put(x, [None, mask], value, True)


def _in_place_on_input(x: torch.Tensor) -> torch.Tensor:
    x[x > 1] = 1.0
    return x


_gen = torch.Generator().manual_seed(0)
_X = torch.randn(3, 4, 5, generator=_gen)
_MASK34 = torch.rand(3, 4, generator=_gen) > 0.5
_MASK45 = torch.rand(4, 5, generator=_gen) > 0.5
_PAD = torch.zeros(3, 4, 4, dtype=torch.bool)
_PAD[:, :, -1] = True

CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]] = {
    "clamp_negative": (_clamp_negative, (_X,)),
    "fill_rows_with_a_vector": (_fill_rows, (_X, _MASK34, torch.randn(5, generator=_gen))),
    "pad_scores_with_minus_infinity": (_pad_scores, (_X, _PAD)),
    "mask_after_a_leading_slice": (_after_leading_slice, (_X, _MASK45)),
    "accumulate": (_accumulate, (_X, _MASK45, torch.tensor(2.5))),
    "integer_tensor": (_clamp_negative, ((_X * 10).to(torch.int32),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mask_write_of_one_value_equals_eager(name: str) -> None:
    f, inputs = CASES[name]
    expected = f(*[t.clone() for t in inputs])
    actual = hloalias.compile(f, [t.clone() for t in inputs])(*[t.clone() for t in inputs])
    if name == "pad_scores_with_minus_infinity":  # XLA's softmax rounds differently
        torch.testing.assert_close(actual, expected)
    else:  # a where writes the very values
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_mask_write_on_an_input_updates_it_in_place() -> None:
    x = _X.clone()
    expected = _in_place_on_input(_X.clone())
    exe = hloalias.compile(_in_place_on_input, (x.clone(),))
    result = exe(x)
    torch.testing.assert_close(x, expected, rtol=0, atol=0)
    assert result.data_ptr() == x.data_ptr()


def test_mask_write_through_torch_compile() -> None:
    compiled = torch.compile(_pad_scores, backend="hloalias", fullgraph=True)
    torch.testing.assert_close(compiled(_X, _PAD), _pad_scores(_X, _PAD))


def _trains_like_eager(
    model: torch.nn.Module, optimizer: Callable[..., torch.optim.Optimizer], batches: list[tuple[torch.Tensor, torch.Tensor]],
    parameter_tolerance: float,
) -> None:
    """A compiled step of ``model`` (loss: the mean square of its output)
    equals eager over ``batches``: losses, then parameters."""
    eager_model = copy.deepcopy(model)

    def step_of(module: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
        def step(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            loss = module(x, mask).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step

    opt = optimizer(model.parameters())
    eager_step = step_of(eager_model, optimizer(eager_model.parameters()))
    train = hloalias.compile_training_step(step_of(model, opt), model, opt, batches[0])
    for x, mask in batches:
        torch.testing.assert_close(train(x, mask), eager_step(x, mask), rtol=1e-5, atol=1e-6)
    train.write_back()
    for got, want in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(got, want, rtol=10 * parameter_tolerance, atol=parameter_tolerance)


def test_training_step_through_a_masked_fill_equals_eager() -> None:
    class Scores(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k = torch.nn.Linear(5, 5), torch.nn.Linear(5, 5)

        def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
            scores = self.q(x) @ self.k(x).transpose(-1, -2)
            scores[pad] = float("-inf")
            return scores.softmax(-1).sum(-2)

    torch.manual_seed(0)
    _trains_like_eager(Scores(), lambda p: torch.optim.SGD(p, lr=0.1), [(_X, _PAD)] * 3, 1e-6)


def test_training_a_value_written_through_a_mask_equals_eager() -> None:
    """Wav2Vec2's SpecAugment writes a learned vector over the masked frames
    (``h[mask] = masked_spec_embed``).  The vector's gradient is
    ``grad[mask]`` summed over the frames: a selection of data-dependent
    size that torch-mlir lowered to an invalid gather."""

    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(5, 5)
            self.embed = torch.nn.Parameter(torch.randn(5))

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            h = self.lin(x)
            h[mask] = self.embed
            return h

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(5)
    batches = [(_X, torch.rand(3, 4, generator=generator) > 0.5) for _ in range(3)]  # a new mask each step
    # Adam scales float noise up.
    _trains_like_eager(Masked(), lambda p: torch.optim.AdamW(p, lr=0.1), batches, 1e-5)


def _copy_selected(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    h = x.clone()
    h[mask] = y[mask]
    return h


def _add_selected(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    h = x.clone()
    h[mask] += 1
    return h


@pytest.mark.parametrize(
    "f, inputs, line",
    [
        (_copy_selected, (_X, _X * 2, _MASK34), r"h\[mask\] = y\[mask\]"),
        (_add_selected, (_X, _MASK34), r"h\[mask\] \+= 1"),
    ],
)
def test_selection_the_program_computes_with_is_refused_naming_its_line(
    f: Callable[..., Any], inputs: tuple[torch.Tensor, ...], line: str
) -> None:
    before = [t.clone() for t in inputs]
    with pytest.raises(TorchImportError, match=r"selects elements by a boolean mask .* at .*test_boolean_mask_writes\.py:\d+ in \w+: " + line):
        hloalias.compile(f, inputs)
    for got, want in zip(inputs, before):
        assert torch.equal(got, want)
