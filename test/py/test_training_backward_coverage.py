"""Training steps through operators whose backward torch-mlir cannot
lower: interpolation of every mode (``nn.Upsample``, Segformer's and
UperNet's decoders), ``grid_sample``, replication padding, average pooling
(plain, padded, ceil mode, divisor override; 1-, 2- and 3-d), adaptive
average and max pooling, 3-d max pooling, transposed convolutions (UNet and
VAE decoders) and ``F.unfold``/``F.fold``.  Each step trains two SGD steps
equal to eager's, parameters (gradients through the operator, and the
operator's own weights where it has them) and losses.  Every case failed
to import before (``upsample_bilinear2d_backward``, ``avg_pool2d_backward``,
``convolution_backward`` of a transposed convolution...), or, for
``F.unfold``, to capture."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import hloalias


class _Chain(torch.nn.Module):
    """A pointwise convolution (so every operator gets an input gradient)
    followed by the operators under test."""

    def __init__(self, channels: int, dims: int, *ops: Callable[[torch.Tensor], torch.Tensor] | torch.nn.Module) -> None:
        super().__init__()
        conv = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)[dims - 1]
        self.mix = conv(channels, channels, 1)
        self.ops = torch.nn.ModuleList(op for op in ops if isinstance(op, torch.nn.Module))
        self.calls = list(ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mix(x)
        for op in self.calls:
            x = op(x)
        return x


class _GridSample(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.grid = torch.nn.Parameter(torch.linspace(-0.9, 0.9, 2 * 4 * 3 * 2).reshape(2, 4, 3, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(x, self.grid, mode="bilinear", padding_mode="border", align_corners=False)


CASES: dict[str, tuple[Callable[[], torch.nn.Module], tuple[int, ...]]] = {
    "interpolate_2d": (lambda: _Chain(
        3, 2,
        torch.nn.Upsample(size=(7, 9), mode="bilinear"),
        lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=True),
        lambda x: F.interpolate(x, size=(5, 6), mode="bicubic"),
        torch.nn.Upsample(scale_factor=2, mode="nearest"),
        lambda x: F.interpolate(x, size=(7, 5), mode="nearest-exact"),
        lambda x: F.interpolate(x, size=(4, 3), mode="bilinear"),  # downsampling
    ), (2, 3, 5, 4)),
    "interpolate_1d_3d": (lambda: torch.nn.Sequential(
        _Chain(3, 1, lambda x: F.interpolate(x, size=11, mode="linear"),
               lambda x: F.interpolate(x, size=6, mode="nearest")),
        torch.nn.Unflatten(2, (2, 3)),
        lambda_module(lambda x: x.unsqueeze(-1).expand(-1, -1, -1, -1, 2)),
        _Chain(3, 3, lambda x: F.interpolate(x, size=(3, 5, 4), mode="trilinear"),
               lambda x: F.interpolate(x, scale_factor=2, mode="nearest")),
    ), (2, 3, 5)),
    "grid_sample_and_replicate_pad": (lambda: _Chain(
        3, 2, _GridSample(), torch.nn.ReplicationPad2d((1, 2, 2, 1)),
        lambda x: F.pad(x.flatten(2), (2, 1), mode="replicate"),
    ), (2, 3, 5, 4)),
    "average_pooling": (lambda: _Chain(
        3, 2,
        torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False),
        torch.nn.AvgPool2d(3, 2, 1, ceil_mode=True),
        lambda x: F.avg_pool2d(x, 2, 1, divisor_override=3),
        lambda x: F.avg_pool2d(x[0], 2, 1).unsqueeze(0),  # unbatched
        lambda x: F.avg_pool1d(x.flatten(2), 3, 2, 1),
    ), (2, 3, 9, 7)),
    "average_pooling_3d": (lambda: _Chain(3, 3, torch.nn.AvgPool3d(2, 1, 1)), (1, 3, 4, 4, 2)),
    # Windows of different sizes (8 -> 3, 6 -> 4): the forward did not lower either.
    "uneven_adaptive_max_pooling": (lambda: _Chain(
        3, 2, lambda x: F.adaptive_max_pool2d(x, (3, 4)), lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
    ), (2, 3, 8, 6)),
    "adaptive_and_3d_max_pooling": (lambda: _Chain(
        3, 2,
        lambda x: F.adaptive_avg_pool2d(x, (3, 3)) + F.adaptive_avg_pool2d(x, (4, 2)).sum() * 0.1
        + F.adaptive_max_pool2d(x, (3, 2)).mean() + F.max_pool3d(x.unsqueeze(1), 2).mean(),
    ), (2, 3, 7, 5)),
    "transposed_convolutions": (lambda: torch.nn.Sequential(
        torch.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),
        torch.nn.ConvTranspose2d(4, 4, 3, stride=1, padding=2, dilation=2, groups=2, bias=False),
        torch.nn.Flatten(2),
        torch.nn.ConvTranspose1d(4, 2, 3, stride=2),
        lambda_module(lambda x: x.unflatten(2, (x.shape[2], 1, 1))),
        torch.nn.ConvTranspose3d(2, 2, (1, 2, 2), stride=(1, 2, 1)),
    ), (2, 3, 5, 4)),
    "unfold_and_fold": (lambda: _Chain(
        3, 2, lambda x: F.fold(F.unfold(x, 2), (5, 4), 2) + F.unfold(x, 2, stride=1).sum() * 0.01,
    ), (2, 3, 5, 4)),
}


class lambda_module(torch.nn.Module):  # noqa: N801 - reads as the lambda it wraps
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[[torch.Tensor], torch.Tensor]:
    def step(x: torch.Tensor) -> torch.Tensor:
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_through_the_operator_equals_eager(case: str) -> None:
    factory, shape = CASES[case]
    torch.manual_seed(0)
    model = factory()
    eager_model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.5)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    train = hloalias.compile_training_step(_step(model, opt), model, opt, (x,))
    eager_step = _step(eager_model, eager_opt)
    for _ in range(2):
        torch.testing.assert_close(train(x), eager_step(x).detach(), rtol=1e-5, atol=1e-6)
    moved = False
    for (name, value), before in zip(model.named_parameters(), factory_parameters(factory)):
        torch.testing.assert_close(value.detach(), dict(eager_model.named_parameters())[name].detach(),
                                   rtol=1e-5, atol=1e-6, msg=name)
        moved = moved or not torch.equal(value.detach(), before)
    assert moved  # the steps trained something: gradients flowed through the operators


def factory_parameters(factory: Callable[[], torch.nn.Module]) -> list[torch.Tensor]:
    """The initial parameters (the same seed as the test's model)."""
    torch.manual_seed(0)
    return [p.detach().clone() for p in factory().parameters()]
