"""``adaptive_max_pool2d`` whose windows differ in size (``8 -> 3``):
torch-mlir lowered it as a ``max_pool2d`` with a fixed stride and
refused ("only support cases with fixed stride size").  It is now a
gather of each window (frontend/decompositions.py); values and the flat
``H x W`` indices equal eager's, ties included (eager's first maximum in
row-major order).  Even windows and ``1 x 1`` outputs keep their path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hloalias

CASES = {
    "uneven_8x6_to_3x2": ((2, 3, 8, 6), (3, 2)),
    "uneven_5x7_to_3x4": ((2, 3, 5, 7), (3, 4)),
    "unbatched": ((3, 8, 6), (3, 2)),
    "even": ((2, 3, 8, 6), (4, 3)),
    "global": ((2, 3, 7, 5), (1, 1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_values_and_indices_equal_eager(case: str) -> None:
    shape, out = CASES[case]

    class Pool(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return F.adaptive_max_pool2d(x, out, return_indices=True)  # type: ignore[no-any-return]

    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    x[..., 0, 0] = x[..., 0, 1]  # a tie: the first in row-major order wins
    expected = Pool()(x)
    got = hloalias.compile(Pool(), (x,))(x)
    assert torch.equal(got[0], expected[0])
    assert torch.equal(got[1], expected[1])
