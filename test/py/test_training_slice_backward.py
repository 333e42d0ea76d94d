"""The training capture's ``slice_backward``: a zero pad of the gradient
(``constant_pad_nd``, a ``stablehlo.pad`` that fuses) instead of torch's
``slice_scatter`` into zeros (a ``stablehlo.scatter`` with one index per
position, a kernel of its own on XLA:CPU); same values bit for bit."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

import hloalias
from hloalias.frontend.backward_decompositions import capture_decompositions, slice_backward_as_pad

aten = torch.ops.aten

# (input sizes, dim, start, end, step): negative dims and starts, ends past
# the dimension (``x[..., 3:]`` traces end = 2**63 - 1), empty slices.
SLICES = [
    ((4, 6), 1, 0, 3, 1),
    ((4, 6), 1, 3, 9223372036854775807, 1),
    ((4, 6), -1, -2, 9223372036854775807, 1),
    ((4, 6), 0, 1, 3, 1),
    ((2, 3, 8), 2, 2, 6, 1),
    ((2, 3, 8), -2, -3, -1, 1),
    ((2, 3, 8), 2, 5, 5, 1),
    ((2, 3, 8), 2, 1, 8, 2),  # step 2: torch's own decomposition
]


@pytest.mark.parametrize("sizes, dim, start, end, step", SLICES)
def test_slice_backward_as_pad_equals_torch(sizes: tuple[int, ...], dim: int, start: int, end: int, step: int) -> None:
    x = torch.zeros(sizes)
    forward = aten.slice.Tensor(x, dim, start, end, step)
    grad = torch.randn(forward.shape, generator=torch.Generator().manual_seed(0))
    if grad.numel():
        grad[(0,) * grad.dim()] = -0.0
    expected = aten.slice_backward.default(grad, list(sizes), dim, start, end, step)
    got = slice_backward_as_pad(grad, list(sizes), dim, start, end, step)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert torch.equal(got, expected)
    assert torch.equal(got.signbit(), expected.signbit())


def test_the_capture_table_pads_slice_gradients() -> None:
    assert capture_decompositions()[aten.slice_backward.default] is slice_backward_as_pad


class _RotateHalf(torch.nn.Module):
    """Llama's ``rotate_half`` on a projection: two slices of one activation
    whose gradients the backward adds."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        rotated = torch.cat((-h[..., 4:], h[..., :4]), dim=-1)
        return self.head(h * 0.5 + rotated * 0.25 + h[:, 1:3].sum(-1, keepdim=True))


def _step_of(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def test_sliced_activations_train_like_eager_without_a_scatter() -> None:
    eager = _RotateHalf()
    model = copy.deepcopy(eager)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(5, 8, generator=generator), torch.randn(5, 3, generator=generator)) for _ in range(3)]
    train = hloalias.compile_training_step(_step_of(model, opt), model, opt, batches[0])
    text = str(train.executable.mlir)
    assert "stablehlo.scatter" not in text
    assert "stablehlo.pad" in text
    for x, y in batches:
        eager_loss = _step_of(eager, eager_opt)(x, y)
        torch.testing.assert_close(train(x, y), eager_loss.detach(), rtol=1e-5, atol=1e-6)
    train.write_back()
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=1e-4, atol=1e-5, msg=key)
