"""Lowerings for what torch-mlir lacks, applied to the exported graph
before torch-mlir sees it.

Two parts, both used by :func:`hloalias.frontend.importer.import_torch`:

- :func:`extra_decompositions`: entries added to the decomposition table
  that ``run_decompositions`` applies.  Where torch has a decomposition
  (``torch._decomp``) for an op torch-mlir cannot lower, torch's is used
  (:data:`TORCH_DECOMPOSED`); otherwise ours, written in aten ops that
  torch-mlir lowers to StableHLO: cumulative max/min and
  ``logcumsumexp`` as log-step scans, sort-based reductions (``median``,
  ``nanmedian``, ``kthvalue``, ``mode``), ``scatter_reduce`` and
  ``index_reduce`` by one-hot masks, ``diagonal``/``diagonal_scatter``,
  ``unfold`` and ``as_strided_copy``/``as_strided_scatter`` by index
  arithmetic, a boolean-mask write of one value (``x[x < 0] = 0``) as a
  ``where``, pools torch-mlir refuses (``ceil_mode``, ``divisor_override``,
  3-d max pools with indices, adaptive max pools with windows of different
  sizes) by explicit windows, ``cdist``, ``isclose``,
  ``angle``; special functions (``lgamma``, ``digamma``, ``polygamma``,
  ``zeta``, ``erfinv``, ...) from :mod:`hloalias.frontend.special_functions`;
  linalg and fft by JAX's lowering rules from
  :mod:`hloalias.frontend.linalg_fft`.
  A decomposition returns ``NotImplemented`` for arguments it does not
  cover, which leaves the op to torch-mlir (and its refusal, if any).
- :func:`prepare_graph`: rewrites of the decomposed graph that keep
  torch-mlir away from inputs that crash it or that it refuses for no
  reason of substance: a reduction of a 0-d tensor along dims
  (``logsumexp``, ``sum``, ``amax``, ``mean``, ``std`` with
  ``keepdim=True``: torch-mlir's StableHLO lowering segfaults, taking the
  caller's process with it) becomes the same reduction of the tensor as
  ``[1]`` along 0 without keepdim, the same 0-d result; a node whose every result has no
  elements becomes ``zeros`` of its shape (no values to compute), and so
  does the ``empty`` family (its values are unspecified; torch-mlir lowers
  it to ``tensor.empty``, which XLA's StableHLO reader does not know); a
  boolean-mask selection summed over its selected elements
  (``grad[mask].sum(0)``, the gradient of ``h[mask] = v``) becomes a sum
  of ``where(mask, grad, 0)``; ``topk`` with ``sorted=False`` becomes the
  sorted ``topk`` (torch-mlir lowers only that; an unsorted order is
  unspecified).

The scans cost ``log2(n)`` steps of ``n`` elements; the one-hot and
sort-count decompositions hold an ``n x m`` mask (``n``, ``m``: the sizes
along the reduced dimension), so they suit the moderate sizes those ops
see in models."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._decomp

from hloalias.frontend.linalg_fft import linalg_fft_decompositions
from hloalias.frontend.op_coverage import op_coverage_decompositions, torch_nn_custom_op_entries
from hloalias.frontend.special_functions import special_decompositions
from hloalias.frontend.torch_internals import eliminate_dead_code

aten = torch.ops.aten

#: aten ops torch-mlir cannot lower whose torch decomposition (all the
#: overloads ``torch._decomp`` has) is used.
TORCH_DECOMPOSED = (
    "_batch_norm_with_update_functional",
    "addmv",
    "adaptive_max_pool3d",
    "as_strided_copy",
    "cauchy",
    "diagonal_copy",
    "dist",
    "exponential",
    "geometric",
    "log_normal",
    "logaddexp",
    "max_pool2d_with_indices_backward",
    "max_pool3d_with_indices",
    "narrow_copy",
    "permute_copy",
    "unbind_copy",
    "unfold_copy",
    "upsample_nearest2d",
    "view_copy",
)


def _torch_entries() -> dict[Any, Callable[..., Any]]:
    table: dict[Any, Callable[..., Any]] = {}
    for name in TORCH_DECOMPOSED:
        packet = getattr(aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if op in torch._decomp.decomposition_table:
                table[op] = torch._decomp.decomposition_table[op]
    return table


def _canonical(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


# --- scans -------------------------------------------------------------------------------


def _lowest(dtype: torch.dtype) -> float | int:
    return -math.inf if dtype.is_floating_point else int(torch.iinfo(dtype).min)


def _highest(dtype: torch.dtype) -> float | int:
    return math.inf if dtype.is_floating_point else int(torch.iinfo(dtype).max)


def _shifted(x: torch.Tensor, dim: int, step: int, fill: float | int) -> torch.Tensor:
    """``x`` moved ``step`` places along ``dim`` (towards higher indices),
    the first ``step`` places ``fill``."""
    n = x.shape[dim]
    pad_shape = list(x.shape)
    pad_shape[dim] = step
    pad = torch.full(pad_shape, fill, dtype=x.dtype)
    return torch.cat([pad, x.narrow(dim, 0, n - step)], dim)


def _cumulative_extreme(x: torch.Tensor, dim: int, take_max: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``cummax``/``cummin`` as eager computes them: a NaN wins and stays
    (its index, the latest NaN's), ties go to the latest index.  A log-step
    scan: the combine of an earlier (a) and a later (b) prefix takes b
    when b is NaN, or when a is not NaN and b >= a (<= for min)."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64)
    dim = _canonical(dim, x.dim())
    n = x.shape[dim]
    shape = [1] * x.dim()
    shape[dim] = n
    indices = torch.arange(n, dtype=torch.int64).reshape(shape).expand(x.shape).contiguous()
    values = x
    identity = _lowest(x.dtype) if take_max else _highest(x.dtype)
    step = 1
    while step < n:
        earlier = _shifted(values, dim, step, identity)
        earlier_index = _shifted(indices, dim, step, 0)
        later_wins = (values >= earlier) if take_max else (values <= earlier)
        if x.dtype.is_floating_point:
            later_wins = torch.isnan(values) | (~torch.isnan(earlier) & later_wins)
        values = torch.where(later_wins, values, earlier)
        indices = torch.where(later_wins, indices, earlier_index)
        step *= 2
    return values, indices


def cummax(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _cumulative_extreme(x, dim, take_max=True)


def cummin(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _cumulative_extreme(x, dim, take_max=False)


def _logaddexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    high = torch.maximum(a, b)
    low = torch.minimum(a, b)
    # -inf + -inf and inf + inf: high - low would be NaN; the sum is high.
    same_infinity = torch.isinf(high) & (high == low)
    gap = torch.where(same_infinity, torch.zeros_like(high), low - high)
    return high + torch.log1p(torch.exp(gap))


def logcumsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """A log-step scan of ``logaddexp`` (exact where eager is; no global
    shift, so small early terms are not lost beside a large later one)."""
    if x.dim() == 0:
        return x.clone()
    dim = _canonical(dim, x.dim())
    n = x.shape[dim]
    step = 1
    while step < n:
        x = _logaddexp(x, _shifted(x, dim, step, -math.inf))
        step *= 2
    return x


def cumprod(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A log-step scan of products (torch's decomposition uses
    ``prims.prod``, which torch-mlir does not lower)."""
    if dtype is not None:
        x = x.to(dtype)
    elif not (x.dtype.is_floating_point or x.dtype.is_complex):
        x = x.to(torch.int64)
    if x.dim() == 0:
        return x.clone()
    dim = _canonical(dim, x.dim())
    n = x.shape[dim]
    step = 1
    while step < n:
        x = x * _shifted(x, dim, step, 1)
        step *= 2
    return x


# --- sort-based reductions ---------------------------------------------------------------


def _reduce_last(
    x: torch.Tensor, dim: int | None, keepdim: bool, pick: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply ``pick`` (a reduction of the last dimension returning values
    and indices, without keepdim) along ``dim`` of ``x``."""
    if x.dim() == 0:
        values, indices = pick(x.reshape(1))
        return values.reshape(()), indices.reshape(())
    dim = _canonical(dim if dim is not None else 0, x.dim())
    values, indices = pick(x.movedim(dim, -1))
    if keepdim:
        values, indices = values.unsqueeze(dim), indices.unsqueeze(dim)
    return values, indices


def _sorted(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending sort of the last dimension, NaN last (as eager).  Not
    ``stable=True``: torch-mlir lowers only ``aten.sort.default`` (which
    becomes a ``stablehlo.sort``; ties among equal values may then take
    another index than eager's, as eager's own kernels differ there)."""
    return torch.sort(x, dim=-1)


def _take(values: torch.Tensor, indices: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Element ``position`` (``[...]`` int64) of the last dimension of both."""
    where = position.unsqueeze(-1)
    return torch.gather(values, -1, where).squeeze(-1), torch.gather(indices, -1, where).squeeze(-1)


def _median_last(x: torch.Tensor, ignore_nan: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = _sorted(x)
    n = x.shape[-1]
    nan = torch.isnan(x) if x.dtype.is_floating_point else torch.zeros(x.shape, dtype=torch.bool)
    if ignore_nan:
        count = n - nan.sum(-1)
        position = torch.clamp((count - 1) // 2, min=0)
        return _take(values, indices, position)
    median, index = _take(values, indices, torch.full(x.shape[:-1], (n - 1) // 2, dtype=torch.int64))
    # With a NaN the result is NaN at the first NaN's index (eager's).
    has_nan = nan.any(-1)
    first_nan = torch.argmax(nan.to(torch.int32), -1)
    median = torch.where(has_nan, torch.full_like(median, math.nan) if x.dtype.is_floating_point else median, median)
    return median, torch.where(has_nan, first_nan, index)


def median(x: torch.Tensor) -> torch.Tensor:
    return _median_last(x.reshape(-1), ignore_nan=False)[0]


def median_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return _reduce_last(x, dim, keepdim, lambda t: _median_last(t, ignore_nan=False))


def nanmedian(x: torch.Tensor) -> torch.Tensor:
    return _median_last(x.reshape(-1), ignore_nan=True)[0]


def nanmedian_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return _reduce_last(x, dim, keepdim, lambda t: _median_last(t, ignore_nan=True))


def kthvalue(x: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    def pick(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = _sorted(t)
        return values[..., k - 1], indices[..., k - 1]

    return _reduce_last(x, dim, keepdim, pick)


def mode(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The most frequent value (ties: the smallest) and its last index."""

    def pick(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = t.shape[-1]
        equal = t.unsqueeze(-1) == t.unsqueeze(-2)  # [..., n, n]
        counts = equal.sum(-1)
        most = counts.amax(-1, keepdim=True)
        candidates = torch.where(counts == most, t, torch.full_like(t, _highest(t.dtype)))
        value = candidates.amin(-1)
        positions = torch.arange(n, dtype=torch.int64).expand(t.shape)
        last = torch.where(t == value.unsqueeze(-1), positions, torch.full_like(positions, -1)).amax(-1)
        return value, last

    return _reduce_last(x, dim, keepdim, pick)


# --- scatter reductions ------------------------------------------------------------------


def scatter_reduce(
    x: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    src: torch.Tensor,
    reduce: str,
    *,
    include_self: bool = True,
) -> Any:
    """``scatter_reduce.two`` where ``index`` has ``src``'s shape and
    covers ``x`` in every other dimension: a one-hot mask ``[n, m, ...]``
    (target ``t`` along ``dim`` receives source ``j`` where
    ``index[j] == t``) reduced over ``j``."""
    if x.dim() == 0 or tuple(index.shape) != tuple(src.shape):
        return NotImplemented
    dim = _canonical(dim, x.dim())
    if any(index.shape[d] != x.shape[d] for d in range(x.dim()) if d != dim):
        return NotImplemented
    target = x.movedim(dim, 0)  # [n, ...]
    source = src.movedim(dim, 0).to(x.dtype)  # [m, ...]
    where = index.movedim(dim, 0)
    n = target.shape[0]
    slots = torch.arange(n, dtype=where.dtype).reshape([n] + [1] * where.dim())
    mask = where.unsqueeze(0) == slots  # [n, m, ...]
    spread = source.unsqueeze(0)
    hits = mask.any(1)
    if reduce in ("sum", "mean"):
        total = torch.where(mask, spread, torch.zeros_like(spread)).sum(1)
        if include_self:
            total = total + target
        if reduce == "sum":
            result = total
        else:
            count = mask.sum(1) + (1 if include_self else 0)
            count = torch.clamp(count, min=1).to(x.dtype)
            result = total / count if x.dtype.is_floating_point else torch.div(total, count, rounding_mode="floor")
    elif reduce == "prod":
        result = torch.where(mask, spread, torch.ones_like(spread)).prod(1)
        if include_self:
            result = result * target
    elif reduce in ("amax", "amin"):
        fill = _lowest(x.dtype) if reduce == "amax" else _highest(x.dtype)
        masked = torch.where(mask, spread, torch.full_like(spread, fill))
        result = masked.amax(1) if reduce == "amax" else masked.amin(1)
        if include_self:
            result = torch.maximum(result, target) if reduce == "amax" else torch.minimum(result, target)
    else:
        return NotImplemented
    result = torch.where(hits, result.to(x.dtype), target)
    return result.movedim(0, dim)


def index_reduce(
    x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, reduce: str, *, include_self: bool = True
) -> Any:
    """``index_reduce`` as :func:`scatter_reduce` with ``index`` spread over
    ``source``'s shape."""
    if x.dim() == 0:
        return scatter_reduce(x.reshape(1), 0, index.reshape(1), source.reshape(1), reduce, include_self=include_self).reshape(())
    dim = _canonical(dim, x.dim())
    shape = [1] * source.dim()
    shape[dim] = index.shape[0]
    spread = index.reshape(shape).expand(source.shape)
    return scatter_reduce(x, dim, spread, source, reduce, include_self=include_self)


# --- index arithmetic for strided views --------------------------------------------------


def _diagonal_layout(x: torch.Tensor, offset: int, dim1: int, dim2: int) -> tuple[torch.Tensor, int, int, int]:
    """``x`` with ``dim1``, ``dim2`` moved last and flattened, the flat
    position of the first diagonal element, the stride between elements
    and the diagonal's length."""
    dim1, dim2 = _canonical(dim1, x.dim()), _canonical(dim2, x.dim())
    moved = x.movedim((dim1, dim2), (-2, -1))
    rows, cols = moved.shape[-2], moved.shape[-1]
    if offset >= 0:
        length = max(0, min(rows, cols - offset))
        start = offset
    else:
        length = max(0, min(rows + offset, cols))
        start = -offset * cols
    flat = moved.reshape(*moved.shape[:-2], rows * cols)
    return flat, start, cols + 1, length


def diagonal(x: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> torch.Tensor:
    flat, start, step, length = _diagonal_layout(x, offset, dim1, dim2)
    if length == 0:
        return torch.zeros((*flat.shape[:-1], 0), dtype=x.dtype)
    return flat[..., start : start + (length - 1) * step + 1 : step]


def diagonal_scatter(x: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> torch.Tensor:
    flat, start, step, length = _diagonal_layout(x, offset, dim1, dim2)
    if length == 0:
        return x.clone()
    d1, d2 = _canonical(dim1, x.dim()), _canonical(dim2, x.dim())
    moved_shape = list(x.movedim((d1, d2), (-2, -1)).shape)
    positions = torch.arange(length, dtype=torch.int64) * step + start
    written = flat.index_copy(flat.dim() - 1, positions, src.to(x.dtype))
    return written.reshape(moved_shape).movedim((-2, -1), (d1, d2))


def unfold(x: torch.Tensor, dimension: int, size: int, step: int) -> torch.Tensor:
    if x.dim() == 0:
        return x.reshape(1)
    dim = _canonical(dimension, x.dim())
    windows = (x.shape[dim] - size) // step + 1
    if 0 < size <= step and windows * step <= x.shape[dim]:
        # Windows that do not overlap, as slice and reshape: views the
        # runtime rebuilds as views of ``x`` (eliminate-view-results).
        shape = [*x.shape[:dim], windows, step, *x.shape[dim + 1 :]]
        spans = x.narrow(dim, 0, windows * step).reshape(shape)
        return spans.narrow(dim + 1, 0, size).movedim(dim + 1, -1)
    if size == 1:  # one element every ``step``: a strided slice
        return x[(slice(None),) * dim + (slice(0, None, step),)].unsqueeze(-1)
    positions = (torch.arange(windows, dtype=torch.int64) * step).unsqueeze(1) + torch.arange(size, dtype=torch.int64)
    picked = x.index_select(dim, positions.reshape(-1))
    shape = list(x.shape)
    shape[dim : dim + 1] = [windows, size]
    return picked.reshape(shape).movedim(dim + 1, -1)


def _strided_positions(size: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
    positions = torch.full(list(size), offset, dtype=torch.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        positions = positions + (torch.arange(n, dtype=torch.int64) * s).reshape(shape)
    return positions


def as_strided_copy(x: torch.Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> Any:
    """A gather from the row-major elements of ``x`` (which must be
    contiguous: the strides are relative to its storage)."""
    if not x.is_contiguous():
        return NotImplemented
    positions = _strided_positions(size, stride, storage_offset or 0)
    return x.reshape(-1)[positions.reshape(-1)].reshape(list(size)) if positions.numel() else torch.zeros(list(size), dtype=x.dtype)


def as_strided_scatter(
    x: torch.Tensor, src: torch.Tensor, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None
) -> Any:
    if not x.is_contiguous():
        return NotImplemented
    positions = _strided_positions(size, stride, storage_offset or 0).reshape(-1)
    if positions.numel() == 0:
        return x.clone()
    flat = x.reshape(-1).index_copy(0, positions, src.reshape(-1).to(x.dtype))
    return flat.reshape(x.shape)


# --- pools -------------------------------------------------------------------------------


def _tuple(value: int | Sequence[int], n: int) -> list[int]:
    if isinstance(value, int):
        return [value] * n
    values = list(value)
    return values * n if len(values) == 1 else values


def _pool_size(length: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    span = length + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= length + padding:
        out -= 1
    return out


def _windows(
    x: torch.Tensor,
    kernel: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    fill: float | int,
) -> torch.Tensor:
    """``x[..., *spatial]`` as ``[..., *out, *kernel]`` windows; places
    outside ``x`` hold ``fill``."""
    spatial = len(kernel)
    first = x.dim() - spatial
    for i in range(spatial):
        d = first + i
        length = x.shape[d]
        out = _pool_size(length, kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
        needed = (out - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1
        after = max(0, needed - length - padding[i])
        pad_shape_before = list(x.shape)
        pad_shape_before[d] = padding[i]
        pad_shape_after = list(x.shape)
        pad_shape_after[d] = after
        x = torch.cat(
            [torch.full(pad_shape_before, fill, dtype=x.dtype), x, torch.full(pad_shape_after, fill, dtype=x.dtype)], d
        )
        positions = (torch.arange(out, dtype=torch.int64) * stride[i]).unsqueeze(1) + (
            torch.arange(kernel[i], dtype=torch.int64) * dilation[i]
        )
        picked = x.index_select(d, positions.reshape(-1))
        shape = list(x.shape)
        shape[d : d + 1] = [out, kernel[i]]
        x = picked.reshape(shape).movedim(d + 1, -1)
    # [..., out0, out1, ..., k0, k1, ...] after each step moved its kernel dim last.
    return x


def _avg_pool(
    x: torch.Tensor,
    spatial: int,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> torch.Tensor:
    kernel = _tuple(kernel_size, spatial)
    strides = _tuple(stride, spatial) if stride else kernel
    pads = _tuple(padding, spatial)
    ones = [1] * spatial
    sums = _windows(x, kernel, strides, pads, ones, ceil_mode, 0).sum(list(range(-spatial, 0)))
    if divisor_override:
        return sums / divisor_override
    # Positions counted: inside x, or inside x and its padding.
    shape = list(x.shape[-spatial:])
    inside = torch.ones(shape, dtype=x.dtype)
    if count_include_pad:
        padded = torch.ones([n + 2 * p for n, p in zip(shape, pads)], dtype=x.dtype)
        counts = _windows(padded, kernel, strides, [0] * spatial, ones, ceil_mode, 0)
        # ceil_mode windows reach past the padded input: those places do not count.
        counts = counts.sum(list(range(-spatial, 0)))
        counts = counts[tuple(slice(0, s) for s in sums.shape[-spatial:])]
    else:
        counts = _windows(inside, kernel, strides, pads, ones, ceil_mode, 0).sum(list(range(-spatial, 0)))
    return sums / counts


def avg_pool2d(
    x: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Any:
    if not (ceil_mode or divisor_override) or not x.dtype.is_floating_point:
        return NotImplemented  # torch-mlir lowers these
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _max_pool_with_indices(
    x: torch.Tensor,
    spatial: int,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and flat (per-plane) indices of the first maximum of each
    window; a NaN is the maximum (eager's)."""
    kernel = _tuple(kernel_size, spatial)
    strides = _tuple(stride, spatial) if stride else kernel
    pads = _tuple(padding, spatial)
    dilations = _tuple(dilation, spatial)
    shape = list(x.shape[-spatial:])
    plane = torch.arange(math.prod(shape), dtype=torch.int64).reshape(shape)
    values = _windows(x, kernel, strides, pads, dilations, ceil_mode, -math.inf)
    places = _windows(plane, kernel, strides, pads, dilations, ceil_mode, -1)
    flat_values = values.reshape(*values.shape[: values.dim() - spatial], -1)
    flat_places = places.reshape(*places.shape[: places.dim() - spatial], -1).expand(flat_values.shape)
    nan_first = torch.where(torch.isnan(flat_values), torch.full_like(flat_values, math.inf), flat_values)
    best = torch.argmax(nan_first, -1, keepdim=True)
    return torch.gather(flat_values, -1, best).squeeze(-1), torch.gather(flat_places, -1, best).squeeze(-1)


def max_pool2d_with_indices(
    x: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> Any:
    if not ceil_mode or not x.dtype.is_floating_point:
        return NotImplemented
    return _max_pool_with_indices(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


def max_pool3d_with_indices(
    x: torch.Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> Any:
    if not x.dtype.is_floating_point:
        return NotImplemented
    return _max_pool_with_indices(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


def _adaptive_bounds(length: int, out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[out, 1]`` starts and ends of eager's adaptive windows: window
    ``i`` is ``floor(i*L/out)`` to ``ceil((i+1)*L/out)``."""
    rows = torch.arange(out, dtype=torch.int64).unsqueeze(1)
    start = torch.div(rows * length, out, rounding_mode="floor")
    end = -torch.div(-(rows + 1) * length, out, rounding_mode="floor")
    return start, end


def _adaptive_weights(length: int, out: int, dtype: torch.dtype) -> torch.Tensor:
    """``[out, length]``: row ``i`` is ``1/len`` over window ``i``
    (:func:`_adaptive_bounds`), as eager's windows."""
    start, end = _adaptive_bounds(length, out)
    places = torch.arange(length, dtype=torch.int64).unsqueeze(0)
    inside = (places >= start) & (places < end)
    return inside.to(dtype) / (end - start).to(dtype)


def _adaptive_avg_pool(x: torch.Tensor, output_size: Sequence[int]) -> Any:
    if not x.dtype.is_floating_point:
        return NotImplemented
    spatial = len(output_size)
    for i, out in enumerate(output_size):
        d = x.dim() - spatial + i
        weights = _adaptive_weights(x.shape[d], out, x.dtype)
        x = torch.matmul(x.movedim(d, -1), weights.t()).movedim(-1, d)
    return x


def _adaptive_window_positions(length: int, out: int) -> tuple[torch.Tensor, int]:
    """``[out, span]`` positions of each adaptive window
    (:func:`_adaptive_bounds`), a shorter window padded with its own last
    position (a repeat changes no maximum and, coming after it, no first
    arg-maximum), and ``span``, the longest window."""
    span = max(-((-(i + 1) * length) // out) - (i * length) // out for i in range(out))
    start, end = _adaptive_bounds(length, out)
    positions = torch.minimum(start + torch.arange(span, dtype=torch.int64).unsqueeze(0), end - 1)
    return positions, span


def adaptive_max_pool2d(x: torch.Tensor, output_size: Sequence[int]) -> Any:
    """``adaptive_max_pool2d`` whose windows differ in size (``8 -> 3``):
    torch-mlir lowers it as a ``max_pool2d`` and refuses ("only support
    cases with fixed stride size").  Each output's window is gathered
    (``[..., out_h, out_w, span_h * span_w]``, row-major as eager scans
    it), its maximum and first arg-maximum taken; the index is flat over
    the input's ``H x W`` as eager's.  Even windows and ``1 x 1`` outputs
    keep their path (``NotImplemented``)."""
    out_h, out_w = (int(v) for v in output_size)
    in_h, in_w = int(x.shape[-2]), int(x.shape[-1])
    if out_h == 0 or out_w == 0 or (out_h == 1 and out_w == 1) or (in_h % out_h == 0 and in_w % out_w == 0):
        return NotImplemented
    rows, span_h = _adaptive_window_positions(in_h, out_h)
    columns, span_w = _adaptive_window_positions(in_w, out_w)
    lead = list(x.shape[:-2])
    picked = x.index_select(-2, rows.reshape(-1)).index_select(-1, columns.reshape(-1))
    windows = picked.reshape(*lead, out_h, span_h, out_w, span_w).movedim(-3, -2)
    windows = windows.reshape(*lead, out_h, out_w, span_h * span_w)
    values = torch.amax(windows, dim=-1)
    chosen = torch.argmax(windows, dim=-1)
    row_of = rows.reshape(-1)[torch.arange(out_h).unsqueeze(1) * span_h + torch.div(chosen, span_w, rounding_mode="floor")]
    column_of = columns.reshape(-1)[torch.arange(out_w) * span_w + chosen % span_w]
    return values, row_of * in_w + column_of


def adaptive_avg_pool1d(x: torch.Tensor, output_size: Sequence[int]) -> Any:
    return _adaptive_avg_pool(x, list(output_size))


def adaptive_avg_pool3d(x: torch.Tensor, output_size: Sequence[int]) -> Any:
    return _adaptive_avg_pool(x, list(output_size))


# --- elementwise and distances -----------------------------------------------------------


def _arg_extreme(x: torch.Tensor, dim: int | None, keepdim: bool, take_max: bool) -> Any:
    """``argmax``/``argmin`` of a 0-d tensor or over all elements
    (``dim=None``), which torch-mlir refuses; other forms are its."""
    if x.dim() == 0:
        return torch.zeros((), dtype=torch.int64)
    if dim is not None:
        return NotImplemented
    flat = x.reshape(-1)
    index = torch.argmax(flat, 0) if take_max else torch.argmin(flat, 0)
    return index.reshape([1] * x.dim()) if keepdim else index


def argmax(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    return _arg_extreme(x, dim, keepdim, take_max=True)


def argmin(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    return _arg_extreme(x, dim, keepdim, take_max=False)


def norm_scalar(x: torch.Tensor, p: float = 2) -> torch.Tensor:
    norm: torch.Tensor = torch.linalg.vector_norm(x, p)
    return norm


def norm_dim(x: torch.Tensor, p: float | None, dim: Sequence[int], keepdim: bool = False) -> torch.Tensor:
    norm: torch.Tensor = torch.linalg.vector_norm(x, 2 if p is None else p, dim, keepdim)
    return norm


def linalg_norm(
    x: torch.Tensor,
    ord: float | None = None,
    dim: Sequence[int] | None = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> Any:
    """Vector norms, and the Frobenius norm (the default over two
    dimensions), as ``linalg_vector_norm``; other matrix norms are left."""
    if dim is not None and len(dim) == 2 and ord is not None:
        return NotImplemented
    if dim is None and x.dim() == 2 and ord is not None:
        return NotImplemented
    return torch.linalg.vector_norm(x, 2 if ord is None else ord, dim, keepdim, dtype=dtype)


def hypot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """In float64 (no overflow of the squares for float32 inputs)."""
    dtype = torch.result_type(a, b)
    wide_a, wide_b = a.to(torch.float64), b.to(torch.float64)
    return torch.sqrt(wide_a * wide_a + wide_b * wide_b).to(dtype)


def put(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    """``put`` on the row-major elements of ``x`` (negative indices count
    from the end)."""
    flat = x.reshape(-1)
    where = index.reshape(-1)
    where = torch.where(where < 0, where + flat.shape[0], where)
    values = source.reshape(-1).to(x.dtype)
    written = flat.index_add(0, where, values) if accumulate else flat.index_copy(0, where, values)
    return written.reshape(x.shape)


def index_put_by_mask(
    x: torch.Tensor, indices: Sequence[torch.Tensor | None], values: torch.Tensor, accumulate: bool = False
) -> Any:
    """``x[..., mask] = v`` (one boolean index, after leading ``:``) whose
    ``v`` is the same for every selected element (``x[x < 0] = 0``,
    ``scores[mask] = -inf``, ``h[mask] = embedding``) as a ``where``.
    torch-mlir writes a boolean index as ``nonzero`` and a scatter, whose
    number of rows depends on the mask's values: no XLA program can hold
    it.  Every other index (integer tensors, several indices, values that
    differ per selected element) is left as it was (``NotImplemented``)."""
    present = [position for position, index in enumerate(indices) if index is not None]
    if len(present) != 1:
        return NotImplemented
    lead = present[0]
    mask = indices[lead]
    assert mask is not None
    if mask.dtype not in (torch.bool, torch.uint8):
        return NotImplemented
    mask_rank, rank = mask.dim(), x.dim()
    if lead + mask_rank > rank or tuple(mask.shape) != tuple(x.shape[lead : lead + mask_rank]):
        return NotImplemented
    # The selection's shape is x.shape[:lead] + (count,) + x.shape[lead + mask_rank:];
    # values broadcast to it, and must not vary along the count.
    selected_rank = lead + 1 + rank - lead - mask_rank
    if values.dim() > selected_rank:
        return NotImplemented
    padded = [1] * (selected_rank - values.dim()) + list(values.shape)
    if padded[lead] != 1:
        return NotImplemented
    spread = values.to(x.dtype).reshape(padded[:lead] + [1] * mask_rank + padded[lead + 1 :]).expand(x.shape)
    where = mask.to(torch.bool).reshape([1] * lead + list(mask.shape) + [1] * (rank - lead - mask_rank))
    if accumulate:
        return x + torch.where(where, spread, torch.zeros((), dtype=x.dtype))
    return torch.where(where, spread, x)


def histc(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Any:  # noqa: A002 - aten's names
    """Counts per bin by a one-hot mask ``[elements, bins]``; ``min == max``
    takes the data's range (eager's), an empty range widens by 1 each way."""
    if not x.dtype.is_floating_point:
        return NotImplemented
    flat = x.reshape(-1)
    if min == max and flat.numel():
        low, high = flat.amin(), flat.amax()
    else:
        low, high = torch.full((), float(min), dtype=x.dtype), torch.full((), float(max), dtype=x.dtype)
    same = low == high
    low = torch.where(same, low - 1, low)
    high = torch.where(same, high + 1, high)
    position = torch.floor((flat - low) * bins / (high - low)).to(torch.int64)
    position = torch.where(flat == high, torch.full_like(position, bins - 1), position)
    inside = (flat >= low) & (flat <= high)
    position = torch.where(inside, position, torch.full_like(position, -1))
    one_hot = position.unsqueeze(1) == torch.arange(bins, dtype=torch.int64)
    return one_hot.sum(0).to(x.dtype)



def isclose(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> torch.Tensor:
    if not (a.dtype.is_floating_point or b.dtype.is_floating_point):
        return a == b
    close = (a == b) | (torch.abs(a - b) <= atol + rtol * torch.abs(b))
    # Infinities of the same sign are equal (a == b); any other infinity is not close.
    close = close & (torch.isfinite(a) & torch.isfinite(b) | (a == b))
    if equal_nan:
        close = close | (torch.isnan(a) & torch.isnan(b))
    return close


def angle(x: torch.Tensor) -> Any:
    if x.dtype.is_complex:
        return NotImplemented
    result_dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    x = x.to(result_dtype)
    angles = torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x))
    return torch.where(torch.isnan(x), x, angles)


def cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None = None) -> torch.Tensor:
    """``|x1[..., i, :] - x2[..., j, :]|_p`` from the differences (eager's
    matrix-product form for p = 2 agrees to rounding)."""
    difference = torch.abs(x1.unsqueeze(-2) - x2.unsqueeze(-3))
    if p == 0:
        return (difference != 0).to(x1.dtype).sum(-1)
    if math.isinf(p):
        return difference.amax(-1)
    if p == 1:
        return difference.sum(-1)
    if p == 2:
        return torch.sqrt((difference * difference).sum(-1))
    return torch.pow(torch.pow(difference, p).sum(-1), 1.0 / p)


def pdist_forward(x: torch.Tensor, p: float = 2) -> torch.Tensor:
    """The pairs ``i < j`` of :func:`cdist_forward` of ``x`` with itself,
    row-major (eager's order)."""
    n = x.shape[0]
    distances = cdist_forward(x, x, p).reshape(-1)
    rows = torch.arange(n, dtype=torch.int64)
    upper = (rows.unsqueeze(1) < rows.unsqueeze(0)).reshape(-1)
    flat = torch.arange(n * n, dtype=torch.int64)
    # The positions of the pairs, ascending: sort puts the others (n*n) last.
    positions = torch.sort(torch.where(upper, flat, torch.full_like(flat, n * n)))[0][: n * (n - 1) // 2]
    return distances.index_select(0, positions)


def native_layer_norm(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None, bias: torch.Tensor | None,
    eps: float,
) -> Any:
    """LayerNorm computed in eager's CPU kernel's type (float32 for
    float32, float16 and bfloat16 inputs; float64 for float64): the mean,
    then the mean square of the centred values.  torch's decomposition goes
    through ``var_mean``, which torch-mlir computes in float64, and XLA
    keeps a float64 copy of every normalized activation in temp."""
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64) or not normalized_shape:
        return NotImplemented
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    wide = x.to(compute)
    mean = wide.mean(dims, keepdim=True)
    centred = wide - mean
    rstd = torch.rsqrt((centred * centred).mean(dims, keepdim=True) + eps)
    out = centred * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.to(x.dtype), mean.to(x.dtype), rstd.to(x.dtype)


def grouped_mm(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``transformers::grouped_mm_fallback`` (Hugging Face's grouped MoE
    experts on CPU): ``rows`` ``[S, K]`` sorted by expert, ``weight``
    ``[E, K, N]``, ``offsets`` ``[E]`` the cumulative row counts; row ``s``
    is multiplied by the weight of the group it falls in, rows past the last
    offset are zero (as the library's loop leaves them).  The groups are
    data-dependent, so each expert's product is taken over all rows and
    kept where the row is that expert's: one ``[S, N]`` product at a time,
    added into the result, never an ``[E, S, N]`` stack."""
    experts = weight.shape[0]
    row = torch.arange(rows.shape[0], dtype=offsets.dtype)
    # The group of row s: how many groups end at or before it.
    group = (offsets.unsqueeze(0) <= row.unsqueeze(1)).sum(1)
    mine = group.unsqueeze(0) == torch.arange(experts, dtype=group.dtype).unsqueeze(1)  # [E, S]
    products = torch.matmul(rows.unsqueeze(0), weight)  # [E, S, N]
    return torch.where(mine.unsqueeze(2), products, torch.zeros((), dtype=rows.dtype)).sum(0)


def grouped_mm_backward(
    rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, grad_output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``transformers::grouped_mm_fallback_backward`` (what autograd records
    for :func:`grouped_mm` in a training step): the gradient of each row
    through its group's weight, and each expert's weight gradient from its
    rows only (rows past the last offset get none), grouped as
    :func:`grouped_mm` groups them."""
    experts = weight.shape[0]
    row = torch.arange(rows.shape[0], dtype=offsets.dtype)
    group = (offsets.unsqueeze(0) <= row.unsqueeze(1)).sum(1)
    mine = (group.unsqueeze(0) == torch.arange(experts, dtype=group.dtype).unsqueeze(1)).unsqueeze(2)  # [E, S, 1]
    zero = torch.zeros((), dtype=rows.dtype)
    grad_rows = torch.where(mine, torch.matmul(grad_output.unsqueeze(0), weight.transpose(1, 2)), zero).sum(0)
    grad_weight = torch.matmul(torch.where(mine, rows.unsqueeze(0), zero).transpose(1, 2), grad_output)
    return grad_rows, grad_weight


def custom_op_decompositions() -> dict[Any, Callable[..., Any]]:
    """Entries for third-party custom ops torch-mlir cannot lower, for
    those registered in this process now (looked up per call: a library
    loaded after the first import still gets its entries; none is
    imported here)."""
    table = torch_nn_custom_op_entries()
    namespace = getattr(torch.ops, "transformers", None)
    fallback = getattr(namespace, "grouped_mm_fallback", None) if namespace is not None else None
    if fallback is not None:
        table[fallback.default] = grouped_mm
    backward = getattr(namespace, "grouped_mm_fallback_backward", None) if namespace is not None else None
    if backward is not None:
        table[backward.default] = grouped_mm_backward
    return table


def roll(x: torch.Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] = ()) -> torch.Tensor:
    """``torch.roll`` as two slices and a concatenation per dimension, with
    each shift taken modulo its dimension's size first: torch-mlir's own
    lowering concatenates an empty slice for a shift of 0 or of a multiple
    of the size, and slices out of range for a shift beyond it (a
    StableHLO verifier error where eager returns the rolled tensor)."""
    shift_list = [shifts] if isinstance(shifts, int) else list(shifts)
    dim_list = [dims] if isinstance(dims, int) else list(dims)
    if not dim_list:
        if len(shift_list) != 1:
            raise RuntimeError(f"roll: shifts {shift_list} with no dims (one shift rolls the flattened tensor)")
        return roll(x.flatten(), shift_list, [0]).view(x.shape)
    if len(shift_list) != len(dim_list):
        raise RuntimeError(f"roll: {len(shift_list)} shifts for {len(dim_list)} dims")
    result = x
    for shift, dim in zip(shift_list, dim_list):
        dim = _canonical(dim, x.dim())
        size = x.shape[dim]
        if size == 0:
            continue
        step = shift % size
        if step:
            result = torch.cat([result.narrow(dim, size - step, step), result.narrow(dim, 0, size - step)], dim)
    return result.clone() if result is x else result


def _scalar_operand(value: float | int | bool, x: torch.Tensor) -> torch.Tensor:
    """A Python number as the 0-d tensor a ``.Tensor`` overload takes in
    place of it beside ``x``: a 0-d operand promotes as a number does
    within its kind, and the widest dtype of the kind keeps the number's
    value (the op computes in the result's dtype).  A float beside an
    integer tensor makes the default dtype's result, as the number does."""
    if isinstance(value, bool):
        return torch.scalar_tensor(value, dtype=torch.bool)
    if isinstance(value, int):
        return torch.scalar_tensor(value, dtype=torch.int64)
    if not (x.is_floating_point() or x.is_complex()):
        return torch.scalar_tensor(value, dtype=torch.get_default_dtype())
    return torch.scalar_tensor(value, dtype=torch.float64)


def fmod(x: torch.Tensor, other: torch.Tensor) -> Any:
    """C's ``fmod``, exact, for floats: the remainder of the magnitudes
    (StableHLO's ``remainder``, which is exact and, for non-negative
    operands, what ``torch.remainder`` lowers to alone) with the dividend's
    sign.  torch-mlir lowers ``fmod`` as ``x - trunc(x / y) * y``, which
    rounds (``fmod(-2.5, 0.1)`` gave 1.4e-16 for eager's -0.1).  Integers
    keep torch-mlir's lowering (exact)."""
    dtype = torch.result_type(x, other)
    if not dtype.is_floating_point:
        return NotImplemented
    x, other = x.to(dtype), other.to(dtype)
    return torch.copysign(aten.remainder.Tensor(x.abs(), other.abs()), x)


def div_mode(x: torch.Tensor, other: torch.Tensor | float, *, rounding_mode: str | None = None) -> Any:
    """Floor division of floats (``x // y``, ``floor_divide``,
    ``div(rounding_mode="floor")``) as eager's CPU kernel computes it
    (c10's ``div_floor_floating``): from the exact ``fmod``, so that the
    quotient is the one of the exact remainder, then rounded to the nearest
    integer at a half; division by zero as IEEE's ``x / y``.  torch-mlir's
    ``floor(x / y)`` rounds the quotient first (``1.0 // 0.1`` gave 10.0,
    eager 9.0) and gives ``-inf // 2.0`` -inf where eager's gives NaN.
    Every step rounds to the operands' dtype, as eager's float16/bfloat16
    kernel does.  Other modes and integers keep torch-mlir's lowering."""
    dtype = torch.result_type(x, other)
    if rounding_mode != "floor" or not dtype.is_floating_point:
        return NotImplemented
    if not isinstance(other, torch.Tensor):
        other = _scalar_operand(other, x)
    a, b = x.to(dtype), other.to(dtype)
    mod = aten.fmod.Tensor(a, b)
    quotient = (a - mod) / b
    quotient = torch.where((mod != 0) & torch.logical_xor(b < 0, mod < 0), quotient - 1, quotient)
    floor = torch.floor(quotient)
    rounded = torch.where(quotient - floor > 0.5, floor + 1, floor)
    ieee = a / b
    rounded = torch.where(quotient != 0, rounded, torch.copysign(torch.zeros_like(rounded), ieee))
    return torch.where(b == 0, ieee, rounded)


def fmod_scalar(x: torch.Tensor, other: float | int | bool) -> Any:
    """``fmod`` by a number, as ``fmod.Tensor`` (the scalar overload does
    not lower)."""
    return aten.fmod.Tensor(x, _scalar_operand(other, x))


def right_shift_scalar(x: torch.Tensor, other: int) -> Any:
    """``x >> n`` as ``bitwise_right_shift.Tensor`` (the scalar overloads do
    not lower)."""
    return aten.bitwise_right_shift.Tensor(x, _scalar_operand(other, x).to(x.dtype))


def left_shift_scalar(x: torch.Tensor, other: int) -> Any:
    """``x << n`` as ``bitwise_left_shift.Tensor``."""
    return aten.bitwise_left_shift.Tensor(x, _scalar_operand(other, x).to(x.dtype))


def searchsorted(
    sorted_sequence: torch.Tensor, values: torch.Tensor, *, out_int32: bool = False, right: bool = False,
    side: str | None = None, sorter: torch.Tensor | None = None,
) -> Any:
    """``searchsorted`` in one sorted 1-D sequence is ``bucketize`` of the
    values by it (which lowers); batched sequences and ``sorter`` keep the
    op (a refusal naming it)."""
    if sorted_sequence.dim() != 1 or sorter is not None:
        return NotImplemented
    return aten.bucketize.Tensor(values, sorted_sequence, out_int32=out_int32, right=right or side == "right")


def _own_entries() -> dict[Any, Callable[..., Any]]:
    return {
        aten.roll.default: roll,
        aten.fmod.Tensor: fmod,
        aten.fmod.Scalar: fmod_scalar,
        aten.div.Tensor_mode: div_mode,
        aten.__rshift__.Scalar: right_shift_scalar,
        aten.bitwise_right_shift.Tensor_Scalar: right_shift_scalar,
        aten.__lshift__.Scalar: left_shift_scalar,
        aten.bitwise_left_shift.Tensor_Scalar: left_shift_scalar,
        aten.searchsorted.Tensor: searchsorted,
        aten.cumprod.default: cumprod,
        aten.argmax.default: argmax,
        aten.argmin.default: argmin,
        aten.norm.Scalar: norm_scalar,
        aten.norm.ScalarOpt_dim: norm_dim,
        aten.linalg_norm.default: linalg_norm,
        aten.hypot.default: hypot,
        aten.put.default: put,
        aten.index_put.default: index_put_by_mask,
        aten.histc.default: histc,
        aten.native_layer_norm.default: native_layer_norm,
        aten.cummax.default: cummax,
        aten.cummin.default: cummin,
        aten.logcumsumexp.default: logcumsumexp,
        aten.median.default: median,
        aten.median.dim: median_dim,
        aten.nanmedian.default: nanmedian,
        aten.nanmedian.dim: nanmedian_dim,
        aten.kthvalue.default: kthvalue,
        aten.mode.default: mode,
        aten.scatter_reduce.two: scatter_reduce,
        aten.index_reduce.default: index_reduce,
        aten.diagonal.default: diagonal,
        aten.diagonal_scatter.default: diagonal_scatter,
        aten.unfold.default: unfold,
        aten.as_strided_copy.default: as_strided_copy,
        aten.as_strided_scatter.default: as_strided_scatter,
        aten.avg_pool2d.default: avg_pool2d,
        aten.max_pool2d_with_indices.default: max_pool2d_with_indices,
        aten.max_pool3d_with_indices.default: max_pool3d_with_indices,
        aten.adaptive_avg_pool1d.default: adaptive_avg_pool1d,
        aten.adaptive_max_pool2d.default: adaptive_max_pool2d,
        aten._adaptive_avg_pool3d.default: adaptive_avg_pool3d,
        aten.isclose.default: isclose,
        aten.angle.default: angle,
        aten._cdist_forward.default: cdist_forward,
        aten._pdist_forward.default: pdist_forward,
    }


@functools.cache
def extra_decompositions() -> dict[Any, Callable[..., Any]]:
    """(Built once and shared: callers must not modify it.)  The entries
    added to torch-mlir's table: torch's (:data:`TORCH_DECOMPOSED`), then
    ours (which win where both exist)."""
    table = _torch_entries()
    table.update(_own_entries())
    table.update(special_decompositions())
    table.update(op_coverage_decompositions())
    table.update(linalg_fft_decompositions())
    return table


# --- graph rewrites ----------------------------------------------------------------------


def _tensor_values(node: torch.fx.Node) -> list[torch.Tensor] | None:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return None


def _schema_position(target: Any, name: str) -> int | None:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    for position, argument in enumerate(schema.arguments):
        if argument.name == name:
            return position
    return None


def _argument(node: torch.fx.Node, position: int, name: str) -> tuple[bool, Any]:
    if position < len(node.args):
        return True, node.args[position]
    if name in node.kwargs:
        return True, node.kwargs[name]
    return False, None


def _set_argument(node: torch.fx.Node, position: int, name: str, value: Any) -> None:
    if position < len(node.args):
        node.args = (*node.args[:position], value, *node.args[position + 1 :])
    else:
        node.kwargs = {**node.kwargs, name: value}


def _scalar_reduction_to_vector(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """A reduction (an op with ``keepdim``) of a 0-d tensor along dims ->
    the same reduction of it as ``[1]`` along 0 without keepdim: the same
    0-d result.  torch-mlir's StableHLO lowering segfaults on 0-d
    reductions with ``keepdim=True``, including those its own
    decompositions make (``std`` -> ``var`` -> ``mean(keepdim=True)``)."""
    keepdim_at = _schema_position(node.target, "keepdim")
    dim_at = _schema_position(node.target, "dim")
    if keepdim_at is None or dim_at is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    operand = node.args[0].meta.get("val")
    if not isinstance(operand, torch.Tensor) or operand.dim() != 0:
        return False
    present, dim = _argument(node, dim_at, "dim")
    if present and dim is not None and not isinstance(dim, (int, list, tuple)):
        return False
    with graph.inserting_before(node):
        vector = graph.call_function(aten.view.default, (node.args[0], [1]))
    # Only the value: the operand's other entries (tensor_meta) describe its 0-d shape.
    vector.meta = {"val": operand.reshape(1)}
    node.args = (vector, *node.args[1:])
    if present and dim is not None:
        # An empty list reduces everything in torch, nothing in torch-mlir: [0] either way.
        _set_argument(node, dim_at, "dim", 0 if isinstance(dim, int) else [0])
    _set_argument(node, keepdim_at, "keepdim", False)
    return True


def _empty_result_to_zeros(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """Replace a single-tensor node with no elements by ``zeros``."""
    values = _tensor_values(node)
    if values is None or len(values) != 1 or isinstance(node.meta.get("val"), (tuple, list)):
        return False
    value = values[0]
    if not all(isinstance(size, int) for size in value.shape):
        return False  # a data-dependent size: export's refusal stands
    if value.numel() != 0 or node.target is aten.zeros.default:
        return False
    with graph.inserting_before(node):
        zeros = graph.call_function(aten.zeros.default, (list(value.shape),), {"dtype": value.dtype})
    zeros.meta = dict(node.meta)
    node.replace_all_uses_with(zeros)
    return True


#: Ops whose values are unspecified: torch-mlir lowers them to
#: ``tensor.empty``, which XLA's StableHLO deserializer does not know.
_EMPTY_OPS = frozenset(
    (
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.empty_permuted.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
        aten.empty_like.default,
    )
)


def _empty_to_zeros(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    if node.target not in _EMPTY_OPS or not isinstance(value, torch.Tensor):
        return False
    if not all(isinstance(size, int) for size in value.shape):
        return False
    with graph.inserting_before(node):
        zeros = graph.call_function(aten.zeros.default, (list(value.shape),), {"dtype": value.dtype})
    zeros.meta = dict(node.meta)
    node.replace_all_uses_with(zeros)
    return True


def _mask_selection_sums(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """``x[..., mask].sum(dims)`` over the selection's dimension -> the sum
    of ``where(mask, x, 0)`` over the mask's dimensions: the same values,
    with no data-dependent size between.  Autograd writes the gradient of
    ``h[mask] = v`` for a ``v`` that requires it (Wav2Vec2's
    ``masked_spec_embed``) as exactly that: ``grad[mask]`` summed to
    ``v``'s shape."""
    if node.target is not aten.index.Tensor or len(node.args) != 2:
        return False
    source, indices = node.args
    if not isinstance(source, torch.fx.Node) or not isinstance(indices, (list, tuple)):
        return False
    present = [position for position, index in enumerate(indices) if index is not None]
    if len(present) != 1:
        return False
    lead, mask = present[0], indices[present[0]]
    if not isinstance(mask, torch.fx.Node):
        return False
    source_value, mask_value = source.meta.get("val"), mask.meta.get("val")
    if not isinstance(source_value, torch.Tensor) or not isinstance(mask_value, torch.Tensor):
        return False
    if mask_value.dtype is not torch.bool:
        return False
    rank, mask_rank = source_value.dim(), mask_value.dim()
    if tuple(mask_value.shape) != tuple(source_value.shape[lead : lead + mask_rank]):
        return False
    if not all(isinstance(size, int) for size in source_value.shape):
        return False
    selected_rank = rank - mask_rank + 1
    sums: list[tuple[torch.fx.Node, list[int], bool, torch.Tensor]] = []
    for user in node.users:
        if user.target is not aten.sum.dim_IntList or user.args[0] is not node or len(user.args) < 2:
            return False
        dims_argument = user.args[1]
        if not isinstance(dims_argument, (list, tuple)):
            return False
        given = [d for d in dims_argument if isinstance(d, int)]
        if len(given) != len(dims_argument):
            return False
        dims = sorted({d % selected_rank for d in given})
        value = user.meta.get("val")
        if lead not in dims or not isinstance(value, torch.Tensor) or not all(isinstance(size, int) for size in value.shape):
            return False
        keepdim = user.args[2] if len(user.args) > 2 else user.kwargs.get("keepdim", False)
        sums.append((user, dims, bool(keepdim), value))
    shape = [1] * lead + list(mask_value.shape) + [1] * (rank - lead - mask_rank)
    for user, dims, keepdim, value in sums:
        spread: list[int] = []
        for d in dims:
            if d < lead:
                spread.append(d)
            elif d == lead:
                spread.extend(range(lead, lead + mask_rank))
            else:
                spread.append(d + mask_rank - 1)
        with graph.inserting_before(user):
            mask_view = graph.call_function(aten.view.default, (mask, shape))
            mask_view.meta = {"val": mask_value.view(shape)}
            zero = graph.call_function(aten.zeros.default, ([],), {"dtype": source_value.dtype})
            zero.meta = {"val": source_value.new_zeros(())}
            masked = graph.call_function(aten.where.self, (mask_view, source, zero))
            masked.meta = {"val": torch.where(mask_view.meta["val"], source_value, zero.meta["val"])}
            options = {key: option for key, option in user.kwargs.items() if key != "keepdim"}
            total = graph.call_function(aten.sum.dim_IntList, (masked, spread, False), options)
            total.meta = {"val": masked.meta["val"].sum(spread, dtype=options.get("dtype"))}
            result = total
            if keepdim:
                result = graph.call_function(aten.view.default, (total, list(value.shape)))
                result.meta = dict(user.meta)
        user.replace_all_uses_with(result)
        graph.erase_node(user)
    graph.erase_node(node)
    return True


def _unsorted_topk_to_sorted(node: torch.fx.Node) -> None:
    """``topk(..., sorted=False)`` -> ``sorted=True`` (DeepSeek-V3's and
    other MoE routers pick groups and experts unsorted): torch-mlir lowers
    only the sorted form.  torch leaves the order of unsorted results
    unspecified, so the sorted order is one it allows; the same elements
    and indices."""
    if node.target is not aten.topk.default:
        return
    position = _schema_position(node.target, "sorted")
    if position is None:
        return
    given, value = _argument(node, position, "sorted")
    if given and value is False:
        _set_argument(node, position, "sorted", True)


def prepare_graph(graph: torch.fx.Graph) -> None:
    """Rewrite the decomposed graph in place (see the module docstring)."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.index.Tensor:
            changed |= _mask_selection_sums(graph, node)
            continue
        if node.target is operator.getitem:
            changed |= _empty_result_to_zeros(graph, node)
            continue
        if not isinstance(node.target, torch._ops.OpOverload) or node.target._schema.is_mutable:
            continue
        changed |= _empty_to_zeros(graph, node) or _empty_result_to_zeros(graph, node)
        changed |= _scalar_reduction_to_vector(graph, node)
        _unsorted_topk_to_sorted(node)
    if changed:
        eliminate_dead_code(graph)
