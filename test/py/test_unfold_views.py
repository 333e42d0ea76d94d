"""``unfold`` windows: writes through them and returned views.

torch's functionalization rebuilds a tensor written through ``unfold``
windows with ``unfold_backward``, which zeroes every element no window
covers (pytorch/pytorch#198102, also under ``torch.compile``): hloalias
refuses such writes, naming the op, on every path that functionalizes
(``compile``, ``jit``'s dynamic path, the dynamo backend, the training
capture), and keeps writes through windows that tile their dimension.
Non-overlapping windows come back as real views of their base."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import hloalias
from hloalias.errors import TorchImportError
from hloalias.frontend.decompositions import unfold
from hloalias.frontend.training import TrainingCaptureError


def _gapped(b: torch.Tensor) -> torch.Tensor:
    b = b.clone()
    b.unfold(1, 1, 2).add_(1.0)  # columns 0 and 2; 1 and 3 stay
    return b


def _tail(x: torch.Tensor) -> torch.Tensor:
    x.unfold(1, 3, 3)[:, 0].mul_(2.0)  # windows [0, 3) only: column 3 stays
    return x.sum()


def _overlap(b: torch.Tensor) -> torch.Tensor:
    b = b.clone()
    b.unfold(1, 2, 1).add_(1.0)
    return b


def _tiled(b: torch.Tensor) -> torch.Tensor:
    b = b.clone()
    b.unfold(1, 2, 2).add_(1.0)
    return b


@pytest.mark.parametrize("program", [_gapped, _tail, _overlap], ids=lambda p: p.__name__)
def test_write_through_windows_that_do_not_tile_is_refused(program: Callable[..., torch.Tensor]) -> None:
    x = torch.arange(8.0).reshape(2, 4)
    before = x.clone()
    with pytest.raises(TorchImportError, match=r"writes in place through `unfold\(1, .*198102"):
        hloalias.compile(program, (x,))
    assert torch.equal(x, before)


def test_write_through_windows_that_do_not_tile_is_refused_by_the_dynamo_backend() -> None:
    torch._dynamo.reset()
    with pytest.raises(TorchImportError, match=r"unfold\(1, 1, 2\)"):
        torch.compile(_gapped, backend="hloalias")(torch.arange(8.0).reshape(2, 4))


class _Buffered(torch.nn.Module):
    def __init__(self, step: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("b", torch.arange(4.0))
        self.step = step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.b.unfold(0, 1, self.step)[:, 0].add_(1.0)
        return self.lin(x).sum() + self.b.sum()


def _train(model: _Buffered) -> hloalias.TrainingStep:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return hloalias.compile_training_step(step, model, optimizer, (torch.randn(2, 4),))


def test_training_step_writing_through_gapped_windows_is_refused() -> None:
    with pytest.raises(TrainingCaptureError, match=r"unfold\(0, 1, 2\).*test_unfold_views.py"):
        _train(_Buffered(2))


def test_training_step_writing_through_tiling_windows_matches_eager() -> None:
    model = _Buffered(1)
    train = _train(model)
    train(torch.randn(2, 4))
    train.write_back()
    assert torch.equal(model.b, torch.arange(4.0) + 1)


def test_write_through_tiling_windows_matches_eager() -> None:
    x = torch.arange(8.0).reshape(2, 4)
    assert torch.equal(hloalias.compile(_tiled, (x,))(x), _tiled(x))


def test_non_overlapping_windows_come_back_as_views() -> None:
    def windows(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.unfold(0, 2, 2), x.unfold(1, 1, 3), x.unfold(-1, 2, 2)

    x = torch.randn(6, 5)
    for got, expected in zip(hloalias.compile(windows, (x,))(x), windows(x)):
        assert torch.equal(got, expected)
        assert got.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_unfold_decomposition_matches_eager() -> None:
    for length in range(0, 8):
        for size in range(0, length + 1):
            for step in (1, 2, 3, 5):
                x = torch.arange(2.0 * length * 3).reshape(2, length, 3)
                assert torch.equal(unfold(x, 1, size, step), x.unfold(1, size, step)), (length, size, step)
