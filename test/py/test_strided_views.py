"""``strided_view_of``: row-major view geometry carried onto a caller's
tensor with another layout, checked element by element against torch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hloalias.runtime.strided_views import strided_view_of

ViewOf = Callable[[torch.Tensor], torch.Tensor]

CASES: dict[str, tuple[Callable[[], torch.Tensor], ViewOf]] = {
    "row_of_transpose": (lambda: torch.arange(12.0).reshape(3, 4).t(), lambda t: t[1]),
    "channels_last_slice": (
        lambda: torch.arange(96.0).reshape(2, 3, 4, 4).to(memory_format=torch.channels_last),
        lambda t: t[:, :1],
    ),
    "channels_last_flatten_space": (
        lambda: torch.arange(96.0).reshape(2, 3, 4, 4).to(memory_format=torch.channels_last),
        lambda t: t[0].flatten(1),
    ),
    "channels_last_permute": (
        lambda: torch.arange(96.0).reshape(2, 3, 4, 4).to(memory_format=torch.channels_last),
        lambda t: t.permute(0, 2, 3, 1),
    ),
    "strided_slice_of_slice": (lambda: torch.arange(48.0).reshape(6, 8)[::2, 1::3], lambda t: t[1:]),
    "select_then_unsqueeze": (lambda: torch.arange(24.0).reshape(2, 3, 4).transpose(0, 2), lambda t: t[2].unsqueeze(0)),
    "empty": (lambda: torch.arange(12.0).reshape(3, 4).t(), lambda t: t[4:]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_view_of_caller_holds_the_row_major_views_elements(name: str) -> None:
    make_caller, view_of = CASES[name]
    caller = make_caller()
    assert not caller.is_contiguous() or name == "empty"
    expected = view_of(caller.contiguous())
    got = strided_view_of(caller, tuple(expected.shape), tuple(expected.stride()), expected.storage_offset())
    assert got is not None
    assert torch.equal(got, expected)
    assert got.untyped_storage().data_ptr() == caller.untyped_storage().data_ptr()
    # Where eager can take the same view of the caller, it is the same view.
    eager = view_of(caller)
    if eager.numel():
        moving = [d for d, n in enumerate(eager.shape) if n > 1]  # a size-1 dim's stride is free
        assert [got.stride(d) for d in moving] == [eager.stride(d) for d in moving]
        assert got.storage_offset() == eager.storage_offset()
    # A write through it reaches the caller, as through eager's view.
    got.fill_(-1.0)
    assert torch.equal(view_of(caller), torch.full_like(expected, -1.0))


def test_elements_no_strided_view_holds_give_none() -> None:
    """Row-major elements 2..5 of a transposed 3x4 are at storage positions
    8, 1, 5, 9: not affine, so no view of the caller holds them."""
    caller = torch.arange(12.0).reshape(3, 4).t()
    assert strided_view_of(caller, (4,), (1,), 2) is None


def test_out_of_range_geometry_gives_none() -> None:
    caller = torch.arange(12.0).reshape(3, 4).t()
    assert strided_view_of(caller, (4,), (1,), 10) is None
    assert strided_view_of(caller, (2,), (-1,), 3) is None
