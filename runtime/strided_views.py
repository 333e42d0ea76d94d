"""Row-major view geometry carried onto a tensor laid out otherwise.

``eliminate-view-results`` records a removed view result as sizes, strides
and an offset in elements of its base's *row-major* layout (the layout
StableHLO values have).  A caller's tensor that is not row-major
(``y.t()``, channels-last) holds the same elements elsewhere in its
storage; :func:`strided_view_of` finds the view of that tensor holding the
view's elements, when one exists, so a returned view shares the caller's
storage as it does in eager (``Executable`` rebuilds every view of a
user input through it when the input is not row-major).
"""

from __future__ import annotations

import torch

from hloalias.config import memo_cache_size
from hloalias.lru import memoized

#: Above this many elements (base or view) the element-by-element check is
#: not attempted and the caller gets ``None`` (the runtime then views a
#: row-major copy, as it did before).
EXACT_CHECK_LIMIT = 1 << 22

Geometry = tuple[tuple[int, ...], tuple[int, ...], int]


def strided_view_of(
    tensor: torch.Tensor, sizes: tuple[int, ...], strides: tuple[int, ...], offset: int
) -> torch.Tensor | None:
    """The view of ``tensor`` (same dtype) whose elements are those of
    ``as_strided(sizes, strides, offset)`` applied to ``tensor``'s row-major
    copy, or ``None`` when no strided view of ``tensor`` holds exactly
    those elements in that order (or the tensors are too large to check)."""
    geometry = _carried_geometry(tuple(tensor.shape), tuple(tensor.stride()), sizes, strides, offset)
    if geometry is None:
        return None
    view_sizes, view_strides, view_offset = geometry
    return tensor.as_strided(view_sizes, view_strides, tensor.storage_offset() + view_offset)


# Bounded by HLOALIAS_MEMO_CACHE_SIZE: one entry per geometry of the
# programs' rebuilt views (their callers' shapes and strides).
@memoized(memo_cache_size)
def _carried_geometry(
    shape: tuple[int, ...],
    caller_strides: tuple[int, ...],
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
) -> Geometry | None:
    """Geometry only (cached): the view's elements' positions in the
    caller's storage (relative to its storage offset), computed element by
    element and accepted when they are affine in the view's index."""
    numel = 1
    for n in shape:
        numel *= n
    view_numel = 1
    for n in sizes:
        view_numel *= n
    if numel > EXACT_CHECK_LIMIT or view_numel > EXACT_CHECK_LIMIT:
        return None
    if view_numel == 0:
        return sizes, tuple(0 for _ in sizes), 0
    if any(s < 0 for s in caller_strides):
        return None
    # Position in the caller's storage of every element, in row-major order.
    positions = torch.zeros((), dtype=torch.int64)
    for n, s in zip(shape, caller_strides):
        positions = (positions[..., None] + torch.arange(n, dtype=torch.int64) * s)
    rows = positions.reshape(-1)
    last = offset + sum((n - 1) * s for n, s in zip(sizes, strides))
    if offset < 0 or last >= rows.numel() or any(s < 0 for s in strides):
        return None
    wanted = rows.as_strided(sizes, strides, offset)
    start = int(wanted.reshape(-1)[0])
    carried: list[int] = []
    for dim, n in enumerate(sizes):
        if n == 1:
            carried.append(0)
            continue
        index = [0] * len(sizes)
        index[dim] = 1
        carried.append(int(wanted[tuple(index)]) - start)
    affine = torch.full(sizes, start, dtype=torch.int64)
    for dim, (n, step) in enumerate(zip(sizes, carried)):
        shape_at = [1] * len(sizes)
        shape_at[dim] = n
        affine = affine + (torch.arange(n, dtype=torch.int64) * step).reshape(shape_at)
    if not torch.equal(affine, wanted):
        return None
    return sizes, tuple(carried), start
