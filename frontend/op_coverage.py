"""Lowerings of ops outside the linalg, fft and special families that
torch's OpInfo database found missing (test/py/opinfo_expected_refusals.txt),
applied with :mod:`hloalias.frontend.decompositions`' table.

torch has no decomposition of these into ops torch-mlir lowers; ours
are written in aten ops it lowers:

- ``nextafter`` and ``frexp`` by arithmetic on the float's bits (a
  bitcast: torch-mlir lowers no bitwise and/or or shifts);
- ``resize`` to as many elements or fewer (``resize_as_``);
- torch's chunked ``linear_cross_entropy`` (custom ops) as the linear
  layer and ``cross_entropy``, without the gradients it can precompute;
- ``fractional_max_pool2d/3d`` by gathering the windows its samples
  place (batched ``[N, C, H, W]`` inputs);
- ``grid_sampler_3d`` (trilinear or nearest; zeros, border or
  reflection padding) by gathering the corners from the flattened volume;
- ``_upsample_bilinear2d_aa`` (antialiased resizing) as weight-matrix
  products;
- ``segment_reduce`` (lengths or offsets) by a membership mask;
- ``histogram`` (a bin count) and ``histogramdd`` by one-hot masks over
  the bins (``[elements, bins]``: for the moderate bin counts histograms
  use);
- ``embedding_bag`` with ``padding_idx`` by a bag mask;
- random ops: ``normal`` (every overload) as ``mean + std * randn``,
  ``randint_like`` as ``low + floor(rand * (high - low))``, ``multinomial``
  by inverse-CDF sampling (with replacement) or the Gumbel top-k trick
  (without): each draws from the key torch's generator gives each call
  (:mod:`hloalias.frontend.random_key`), not eager's bits, so the sweep
  compares their dtypes and shapes (values differ by construction).

A decomposition returns ``NotImplemented`` for arguments it does not
cover, which leaves the op to torch-mlir (and its refusal, if any).  Two
graph rewrites besides: :func:`unsigned_constants_as_bitcasts` keeps
``uint8`` constants away from a torch-mlir fold it cannot lower;
:func:`remove_error_checks` drops linalg's host-side error checks and the
effect tokens export threads through them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch.export import ExportedProgram
from torch.export._remove_effect_tokens_pass import _remove_effect_tokens

from hloalias.frontend.ctc_loss import ctc_loss_decompositions

aten = torch.ops.aten

#: torch.broadcast_tensors, typed (torch leaves it untyped).
_broadcast_tensors = cast(Callable[..., tuple[torch.Tensor, ...]], torch.broadcast_tensors)
#: torch.broadcast_shapes, typed.
_broadcast_shapes = cast(Callable[..., torch.Size], torch.broadcast_shapes)

# --- floating-point representation ------------------------------------------------------

# dtype -> (integer dtype of its bits, mantissa bits, exponent bias - 1).
_FLOAT_BITS = {torch.float32: (torch.int32, 23, 126), torch.float64: (torch.int64, 52, 1022)}


def _magnitude_bits(x: torch.Tensor) -> torch.Tensor:
    """The bits of ``|x|`` as a nonnegative integer (torch-mlir lowers
    neither bitwise and/or nor shifts: arithmetic on the magnitude stands
    in for them)."""
    return torch.abs(x).view(_FLOAT_BITS[x.dtype][0])


def nextafter(x: torch.Tensor, y: torch.Tensor) -> Any:
    """The next representable value after ``x`` towards ``y``: one step of
    ``|x|``'s bits, up when moving away from 0."""
    if x.dtype not in _FLOAT_BITS or y.dtype != x.dtype:
        return NotImplemented
    x, y = _broadcast_tensors(x, y)
    integer = _FLOAT_BITS[x.dtype][0]
    sign_bit = -(2 ** (torch.iinfo(integer).bits - 1))
    magnitude = _magnitude_bits(x)
    away_from_zero = torch.where(x > 0, y > x, y < x)  # (a bool == bool is a signed compare XLA refuses)
    stepped = magnitude + torch.where(away_from_zero, torch.ones_like(magnitude), -torch.ones_like(magnitude))
    bits = torch.where(x < 0, stepped + sign_bit, stepped)
    # From zero: the smallest subnormal of y's sign.
    smallest = torch.where(y > 0, torch.ones_like(magnitude), torch.full_like(magnitude, 1 + sign_bit))
    bits = torch.where(x == 0, smallest, bits)
    result = bits.view(x.dtype)
    result = torch.where(x == y, y, result)
    return torch.where(torch.isnan(x) | torch.isnan(y), x + y, result)


def frexp(x: torch.Tensor) -> Any:
    """``x = mantissa * 2**exponent`` with ``|mantissa|`` in [0.5, 1): the
    mantissa's bits are ``|x|``'s fraction under the exponent of 0.5
    (subnormals scaled into the normal range first); 0, infinities and
    NaN are their own mantissa with exponent 0 (eager's)."""
    if x.dtype not in _FLOAT_BITS:
        return NotImplemented
    integer, fraction_bits, bias = _FLOAT_BITS[x.dtype]
    unit = 2**fraction_bits
    subnormal = torch.abs(x) < torch.finfo(x.dtype).tiny
    scaled = torch.where(subnormal, x * float(unit * 2), x)  # exact: a power of two
    magnitude = _magnitude_bits(scaled)
    field = torch.div(magnitude, unit, rounding_mode="floor")
    exponent = field - bias - torch.where(subnormal, fraction_bits + 1, 0)
    mantissa_bits = magnitude - field * unit + bias * unit
    mantissa = mantissa_bits.view(x.dtype)
    mantissa = torch.where(x < 0, -mantissa, mantissa)
    special = (x == 0) | ~torch.isfinite(x)
    mantissa = torch.where(special, x, mantissa)
    exponent = torch.where(special, torch.zeros_like(exponent), exponent)
    return mantissa, exponent.to(torch.int32)


def resize(x: torch.Tensor, size: Sequence[int], *, memory_format: Any = None) -> Any:
    """``resize`` (``resize_``, ``resize_as_`` functionalized) to as many
    elements or fewer: the leading elements in row-major order, eager's
    for a contiguous tensor.  Growing is left (the new elements' values
    are unspecified)."""
    count = math.prod(size)
    if count > x.numel() or not x.is_contiguous():
        return NotImplemented
    return x.reshape(-1)[:count].reshape(list(size)).clone()


def embedding_bag(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool,
    mode: int,
    sparse: bool,
    per_sample_weights: torch.Tensor | None,
    include_last_offset: bool,
    padding_idx: int | None,
) -> Any:
    """``embedding_bag`` of 1-d ``indices`` by a bag mask ``[positions,
    bags]`` (position ``p`` is in bag ``b`` when ``offsets[b] <= p <
    offsets[b + 1]``, the last bag to the end); positions holding ``padding_idx`` count in no bag.  Modes 0/1/2:
    sum, mean, max; an empty bag is 0.  The outputs after the first
    (offset2bag, bag sizes, max indices, which only eager's backward
    reads; ``F.embedding_bag`` returns the first) follow eager's
    definitions, not its kernel's quirks (zeros it leaves in some modes)."""
    if indices.dim() != 1 or not weight.dtype.is_floating_point or include_last_offset:
        # include_last_offset: eager's kernels disagree among themselves on
        # positions past the last offset; left to torch-mlir.
        return NotImplemented
    positions = indices.shape[0]
    starts = offsets
    bags = starts.shape[0]
    place = torch.arange(positions, dtype=torch.int64)
    bag_of = (place.unsqueeze(1) >= starts.unsqueeze(0)).sum(1) - 1  # [p]
    member = bag_of.unsqueeze(1) == torch.arange(bags, dtype=torch.int64).unsqueeze(0)  # [p, b]
    if padding_idx is not None:
        padding = padding_idx % weight.shape[0]
        member = member & (indices != padding).unsqueeze(1)
    rows = weight.index_select(0, indices)  # [p, d]
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1).to(rows.dtype)
    mask = member.to(rows.dtype)  # [p, b]
    counts = member.sum(0)  # [b]
    if mode == 2:
        spread = torch.where(member.unsqueeze(-1), rows.unsqueeze(1), torch.full_like(rows.unsqueeze(1), -math.inf))
        best = spread.argmax(0)  # [b, d]: a position
        output = torch.where(counts.unsqueeze(1) > 0, spread.amax(0), torch.zeros_like(spread[0]))
        max_indices = torch.where(counts.unsqueeze(1) > 0, indices[best], torch.zeros_like(best))
    else:
        output = mask.t() @ rows
        if mode == 1:
            output = output / torch.clamp(counts, min=1).unsqueeze(1).to(rows.dtype)
        max_indices = counts if mode == 1 else torch.zeros_like(counts)
    bag_size = counts if mode != 0 else torch.zeros_like(counts)
    return output, torch.clamp(bag_of, min=0), bag_size, max_indices


def segment_reduce(
    data: torch.Tensor,
    reduce: str,
    *,
    lengths: torch.Tensor | None = None,
    indices: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: float | None = None,
) -> Any:
    """Reductions of consecutive segments along ``axis`` (given by
    ``lengths`` or ``offsets``, 1-d) by a membership mask ``[segments,
    n]``.  ``initial`` joins every segment's reduction (``mean``: the sum's,
    over the segment's length); without it an empty segment is the
    reduction's identity (``mean``: NaN), as eager."""
    if not data.dtype.is_floating_point or indices is not None or reduce not in ("sum", "mean", "max", "min", "prod"):
        return NotImplemented
    if lengths is not None and lengths.dim() == 1:
        ends = torch.cumsum(lengths, 0)
        starts = ends - lengths
    elif lengths is None and offsets is not None and offsets.dim() == 1:
        starts, ends = offsets[:-1], offsets[1:]
    else:
        return NotImplemented
    axis = axis % data.dim()
    moved = data.movedim(axis, 0)  # [n, ...]
    place = torch.arange(moved.shape[0], dtype=starts.dtype)
    member = (place.unsqueeze(0) >= starts.unsqueeze(1)) & (place.unsqueeze(0) < ends.unsqueeze(1))  # [s, n]
    mask = member.reshape(*member.shape, *([1] * (moved.dim() - 1)))
    spread = moved.unsqueeze(0)
    identity = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}[reduce]
    masked = torch.where(mask, spread, torch.full_like(spread, identity))
    if reduce in ("sum", "mean"):
        result = masked.sum(1)
    elif reduce == "prod":
        result = masked.prod(1)
    else:
        result = masked.amax(1) if reduce == "max" else masked.amin(1)
    if initial is not None:
        start = torch.full_like(result, float(initial))
        if reduce in ("sum", "mean"):
            result = result + start
        elif reduce == "prod":
            result = result * start
        else:
            result = torch.maximum(result, start) if reduce == "max" else torch.minimum(result, start)
    if reduce == "mean":
        count = member.sum(1).reshape(-1, *([1] * (moved.dim() - 1))).to(result.dtype)
        result = result / count
        if initial is not None:
            result = torch.where(count == 0, torch.full_like(result, float(initial)), result)
    return result.movedim(0, axis)


def _linear_cross_entropy_loss(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: torch.Tensor | None,
    weight: torch.Tensor | None,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
    acc_dtype: torch.dtype | None,
) -> torch.Tensor:
    """The loss of the linear layer's logits, unchunked, accumulated in
    ``acc_dtype`` as torch's chunked op does."""
    dtype = acc_dtype or input.dtype
    logits = torch.nn.functional.linear(
        input.to(dtype), linear_weight.to(dtype), None if linear_bias is None else linear_bias.to(dtype)
    )
    loss = torch.nn.functional.cross_entropy(
        logits,
        target,
        None if weight is None else weight.to(dtype),
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    )
    return loss.to(input.dtype)


def linear_cross_entropy_chunked(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: torch.Tensor | None,
    weight: torch.Tensor | None,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
    batch_chunk_size: int,
    acc_policy: str,
    acc_dtype: torch.dtype | None,
    allow_retain_graph: bool,
    compute_input_grad: bool,
    compute_linear_weight_grad: bool,
    compute_linear_bias_grad: bool,
) -> Any:
    """torch's chunked ``linear_cross_entropy`` (a custom op, ``torch_nn``)
    as the linear layer and ``cross_entropy``: chunking bounds eager's
    memory; XLA plans the whole computation.  Only without the gradients
    the op precomputes in its forward (a program that is not trained):
    their outputs are then empty, as the op's own."""
    if compute_input_grad or compute_linear_weight_grad or compute_linear_bias_grad:
        return NotImplemented
    loss = _linear_cross_entropy_loss(
        input, linear_weight, target, linear_bias, weight, reduction, ignore_index, label_smoothing, acc_dtype
    )
    return (
        loss,
        torch.zeros((0, 0), dtype=input.dtype),
        torch.zeros((0, 0), dtype=input.dtype),
        torch.zeros((0,), dtype=input.dtype),
    )


def linear_cross_entropy_chunked_no_reduction(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: torch.Tensor | None,
    weight: torch.Tensor | None,
    ignore_index: int,
    batch_chunk_size: int,
    acc_policy: str,
    acc_dtype: torch.dtype | None,
) -> Any:
    return _linear_cross_entropy_loss(
        input, linear_weight, target, linear_bias, weight, "none", ignore_index, 0.0, acc_dtype
    )


def torch_nn_custom_op_entries() -> dict[Any, Callable[..., Any]]:
    """Entries for the ops torch defines as custom ops in
    ``torch.nn.modules.linear_cross_entropy``, for those registered in this
    process now.  That module is imported lazily by torch (on the first
    chunked ``linear_cross_entropy`` call), and importing it registers the
    ops through ``torch.library``, which reads their source through
    ``inspect`` (a scan of every loaded module): so it is not imported here,
    and a program whose trace registers them is traced again
    (:func:`hloalias.frontend.importer.late_registered_entries`)."""
    namespace = torch.ops.torch_nn
    entries: dict[Any, Callable[..., Any]] = {}
    for name, decomposition in (
        ("_linear_cross_entropy_batch_chunked", linear_cross_entropy_chunked),
        ("_linear_cross_entropy_batch_chunked_no_reduction", linear_cross_entropy_chunked_no_reduction),
    ):
        op = getattr(namespace, name, None)
        if op is not None:
            entries[op.default] = decomposition
    return entries


def _fractional_starts(sample: torch.Tensor, length: int, out: int, kernel: int) -> torch.Tensor:
    """Window starts ``[N, C, out]`` from the per-plane ``sample`` ``[N, C]``
    (eager's interval sequence, in the sample's dtype): ``int((i + u) a) -
    int(u a)`` with ``a = (length - kernel) / (out - 1)``, the last window
    flush with the end."""
    steps = torch.arange(out, dtype=sample.dtype)
    if out > 1:
        alpha = torch.full((), float(length - kernel), dtype=sample.dtype) / float(out - 1)
        u = sample.unsqueeze(-1)
        starts = torch.trunc((steps + u) * alpha).to(torch.int64) - torch.trunc(u * alpha).to(torch.int64)
    else:
        starts = torch.zeros((*sample.shape, out), dtype=torch.int64)
    return torch.where(steps == out - 1, torch.full_like(starts, length - kernel), starts)


def _fractional_max_pool(
    x: torch.Tensor, kernel_size: Sequence[int], output_size: Sequence[int], samples: torch.Tensor
) -> Any:
    """Max over windows of ``kernel_size`` at the starts the samples give
    (``samples[..., 0]`` is the last spatial dimension's, ``[..., 1]`` the one
    before; eager's order), with the flat (per-plane) index of the first
    maximum; a NaN is the maximum."""
    spatial = len(kernel_size)
    if not x.dtype.is_floating_point or x.dim() != spatial + 2:
        return NotImplemented
    sizes = list(x.shape[2:])
    planes = torch.arange(math.prod(sizes), dtype=torch.int64).reshape(sizes).expand(x.shape).contiguous()
    values = x
    for d in range(spatial):
        axis = 2 + d
        # Eager's order: sample 0 for the last dimension in 2-d, the first in 3-d.
        sample_index = (spatial - 1 - d) if spatial == 2 else d
        starts = _fractional_starts(samples[..., sample_index].to(x.dtype), sizes[d], output_size[d], kernel_size[d])
        window = starts.unsqueeze(-1) + torch.arange(kernel_size[d], dtype=torch.int64)  # [N, C, out, k]
        flat = window.reshape(*window.shape[:2], -1)  # [N, C, out * k]
        shape = [1] * values.dim()
        shape[0], shape[1], shape[axis] = flat.shape[0], flat.shape[1], flat.shape[2]
        target = list(values.shape)
        target[axis] = flat.shape[2]
        index = flat.reshape(shape).expand(target)
        values = torch.gather(values, axis, index)
        planes = torch.gather(planes, axis, index)
        split = list(values.shape)
        split[axis : axis + 1] = [output_size[d], kernel_size[d]]
        values = values.reshape(split).movedim(axis + 1, -1)
        planes = planes.reshape(split).movedim(axis + 1, -1)
    values = values.reshape(*values.shape[: 2 + spatial], -1)
    planes = planes.reshape(*planes.shape[: 2 + spatial], -1)
    nan_first = torch.where(torch.isnan(values), torch.full_like(values, math.inf), values)
    best = torch.argmax(nan_first, -1, keepdim=True)
    return torch.gather(values, -1, best).squeeze(-1), torch.gather(planes, -1, best).squeeze(-1)


def fractional_max_pool2d(x: torch.Tensor, kernel_size: Sequence[int], output_size: Sequence[int], samples: torch.Tensor) -> Any:
    return _fractional_max_pool(x, list(kernel_size), list(output_size), samples)


def fractional_max_pool3d(x: torch.Tensor, kernel_size: Sequence[int], output_size: Sequence[int], samples: torch.Tensor) -> Any:
    return _fractional_max_pool(x, list(kernel_size), list(output_size), samples)


def _grid_source(coordinate: torch.Tensor, size: int, padding_mode: int, align_corners: bool) -> torch.Tensor:
    """A normalized grid coordinate ([-1, 1]) as a position in an axis of
    ``size`` elements, with the padding mode's clipping or reflection (as
    ATen's grid sampler)."""
    if align_corners:
        position = (coordinate + 1) / 2 * (size - 1)
    else:
        position = ((coordinate + 1) * size - 1) / 2
    if padding_mode == 2:  # reflection
        low, high = (0.0, 2.0 * (size - 1)) if align_corners else (-1.0, 2.0 * size - 1)
        if low == high:
            position = torch.zeros_like(position)
        else:
            start, span = low / 2, (high - low) / 2
            distance = torch.abs(position - start)
            extra = torch.remainder(distance, span)
            flips = torch.floor(distance / span)
            even = torch.remainder(flips, 2) == 0
            position = torch.where(even, extra + start, span - extra + start)
    if padding_mode in (1, 2):  # border, reflection: clipped into the axis
        position = torch.clamp(position, 0, size - 1)
    return position


def grid_sampler_3d(
    x: torch.Tensor, grid: torch.Tensor, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> Any:
    """Trilinear (mode 0) or nearest (mode 1) sampling of ``x`` ``[N, C, D,
    H, W]`` at ``grid`` ``[N, D', H', W', 3]`` (x, y, z: W, H, D), zeros,
    border or reflection padding: the corners gathered from the flattened
    volume, out-of-volume corners weighted 0."""
    if interpolation_mode not in (0, 1) or not x.dtype.is_floating_point:
        return NotImplemented
    n, c, depth, height, width = x.shape
    out_shape = list(grid.shape[1:4])
    points = grid.reshape(n, -1, 3).to(x.dtype)  # [N, P, 3]
    ix = _grid_source(points[..., 0], width, padding_mode, align_corners)
    iy = _grid_source(points[..., 1], height, padding_mode, align_corners)
    iz = _grid_source(points[..., 2], depth, padding_mode, align_corners)
    volume = x.reshape(n, c, depth * height * width)

    def corner(zi: torch.Tensor, yi: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
        """Values ``[N, C, P]`` at integer positions, 0 outside."""
        inside = (xi >= 0) & (xi < width) & (yi >= 0) & (yi < height) & (zi >= 0) & (zi < depth)
        flat = (torch.clamp(zi, 0, depth - 1) * height + torch.clamp(yi, 0, height - 1)) * width + torch.clamp(
            xi, 0, width - 1
        )
        values = torch.gather(volume, 2, flat.unsqueeze(1).expand(n, c, flat.shape[1]))
        return torch.where(inside.unsqueeze(1), values, torch.zeros_like(values))

    if interpolation_mode == 1:
        result = corner(torch.round(iz).to(torch.int64), torch.round(iy).to(torch.int64), torch.round(ix).to(torch.int64))
    else:
        x0, y0, z0 = torch.floor(ix), torch.floor(iy), torch.floor(iz)
        result = torch.zeros((n, c, points.shape[1]), dtype=x.dtype)
        for dz in (0, 1):
            wz = (iz - z0) if dz else (z0 + 1 - iz)
            for dy in (0, 1):
                wy = (iy - y0) if dy else (y0 + 1 - iy)
                for dx in (0, 1):
                    wx = (ix - x0) if dx else (x0 + 1 - ix)
                    values = corner(
                        (z0 + dz).to(torch.int64), (y0 + dy).to(torch.int64), (x0 + dx).to(torch.int64)
                    )
                    result = result + values * (wx * wy * wz).unsqueeze(1)
    return result.reshape(n, c, *out_shape)


def _antialias_weights(length: int, out: int, align_corners: bool, scale: float | None, dtype: torch.dtype) -> torch.Tensor:
    """``[out, length]``: each output's normalized triangle-filter weights,
    the filter widened by the scale when shrinking (ATen's antialiased
    bilinear weights; a constant: they depend on the sizes only)."""
    if align_corners:
        ratio = (length - 1) / (out - 1) if out > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale else length / out
    support = ratio if ratio >= 1.0 else 1.0  # interp_size 2, halved, times the scale when shrinking
    inverse = 1.0 / ratio if ratio >= 1.0 else 1.0
    # In aten ops (a tensor literal cannot be made inside a decomposition), float64.
    center = ratio * (torch.arange(out, dtype=torch.float64).unsqueeze(1) + 0.5)  # [out, 1]
    low = torch.clamp(torch.trunc(center - support + 0.5), min=0)
    high = torch.clamp(torch.trunc(center + support + 0.5), max=length)
    place = torch.arange(length, dtype=torch.float64).unsqueeze(0)  # [1, length]
    triangle = torch.clamp(1.0 - torch.abs((place - center + 0.5) * inverse), min=0)
    weights = torch.where((place >= low) & (place < high), triangle, torch.zeros_like(triangle))
    total = weights.sum(1, keepdim=True)
    weights = weights / torch.where(total == 0, torch.ones_like(total), total)
    return weights.to(dtype)


def upsample_bilinear2d_aa(
    x: torch.Tensor,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> Any:
    """Antialiased bilinear resizing (``interpolate(..., antialias=True)``)
    as two weight-matrix products, one per spatial dimension."""
    if not x.dtype.is_floating_point or x.dim() != 4:
        return NotImplemented
    height = _antialias_weights(x.shape[2], output_size[0], align_corners, scales_h, x.dtype)
    width = _antialias_weights(x.shape[3], output_size[1], align_corners, scales_w, x.dtype)
    return torch.matmul(torch.matmul(height, x), width.t())


# --- histograms ------------------------------------------------------------------------


def _histogram_edges(column: torch.Tensor, bins: int, bounds: Sequence[float] | None) -> torch.Tensor:
    """``bins + 1`` evenly spaced edges over ``bounds`` or the data's
    range; an empty range widens by 0.5 each way (eager's, numpy's)."""
    if bounds is not None:
        low = torch.full((), float(bounds[0]), dtype=column.dtype)
        high = torch.full((), float(bounds[1]), dtype=column.dtype)
    elif column.numel():
        low, high = column.amin(), column.amax()
    else:
        low, high = torch.zeros((), dtype=column.dtype), torch.ones((), dtype=column.dtype)
    same = low == high
    low = torch.where(same, low - 0.5, low)
    high = torch.where(same, high + 0.5, high)
    steps = torch.arange(bins + 1, dtype=column.dtype)
    edges = low + steps * ((high - low) / bins)
    return torch.where(steps == bins, high, edges)  # the last edge exactly (as linspace)


def _bin_positions(column: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """The bin of each element: the count of edges <= it, less one (eager's
    search), the last edge in the last bin; -1 outside the edges."""
    bins = edges.shape[0] - 1
    position = (column.unsqueeze(-1) >= edges).sum(-1) - 1
    position = torch.where(column == edges[-1], torch.full_like(position, bins - 1), position)
    inside = (column >= edges[0]) & (column <= edges[-1])
    return torch.where(inside, position, torch.full_like(position, -1))


def _histogram_counts(
    points: torch.Tensor, bins: Sequence[int], bounds: Sequence[float] | None, weight: torch.Tensor | None, density: bool
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Counts (or weights) of ``points`` (``[N, D]``) in the ``bins`` grid,
    by a one-hot mask ``[N, prod(bins)]``, and each dimension's edges."""
    edges = []
    flat = torch.zeros(points.shape[0], dtype=torch.int64)
    inside = torch.ones(points.shape[0], dtype=torch.bool)
    for d, count in enumerate(bins):
        dim_bounds = None if bounds is None else bounds[2 * d : 2 * d + 2]
        dim_edges = _histogram_edges(points[:, d], count, dim_bounds)
        position = _bin_positions(points[:, d], dim_edges)
        inside = inside & (position >= 0)
        flat = flat * count + torch.clamp(position, min=0)
        edges.append(dim_edges)
    total = math.prod(bins)
    flat = torch.where(inside, flat, torch.full_like(flat, -1))
    one_hot = (flat.unsqueeze(1) == torch.arange(total, dtype=torch.int64)).to(points.dtype)
    weights = torch.ones(points.shape[0], dtype=points.dtype) if weight is None else weight.reshape(-1).to(points.dtype)
    hist = (one_hot * weights.unsqueeze(1)).sum(0).reshape(list(bins))
    if density:
        volume = torch.ones(list(bins), dtype=points.dtype)
        for d, dim_edges in enumerate(edges):
            shape = [1] * len(bins)
            shape[d] = bins[d]
            volume = volume * (dim_edges[1:] - dim_edges[:-1]).reshape(shape)
        hist = hist / (hist.sum() * volume)
    return hist, edges


def histogram(
    x: torch.Tensor, bins: int = 100, *, range: Sequence[float] | None = None,  # noqa: A002 - aten's name
    weight: torch.Tensor | None = None, density: bool = False,
) -> Any:
    if not x.dtype.is_floating_point:
        return NotImplemented
    hist, edges = _histogram_counts(x.reshape(-1, 1), [bins], range, weight, density)
    return hist, edges[0]


def histogramdd_bin_edges(
    x: torch.Tensor, bins: Sequence[int], *, range: Sequence[float] | None = None,  # noqa: A002
    weight: torch.Tensor | None = None, density: bool = False,
) -> Any:
    if not x.dtype.is_floating_point:
        return NotImplemented
    points = x.reshape(-1, x.shape[-1])
    return [
        _histogram_edges(points[:, d], count, None if range is None else range[2 * d : 2 * d + 2])
        for d, count in enumerate(bins)
    ]


def histogramdd_from_bin_cts(
    x: torch.Tensor, bins: Sequence[int], *, range: Sequence[float] | None = None,  # noqa: A002
    weight: torch.Tensor | None = None, density: bool = False,
) -> Any:
    if not x.dtype.is_floating_point:
        return NotImplemented
    return _histogram_counts(x.reshape(-1, x.shape[-1]), list(bins), range, weight, density)[0]


# --- random ops --------------------------------------------------------------------------


def _normal_dtype(*values: Any) -> torch.dtype:
    for value in values:
        if isinstance(value, torch.Tensor):
            return value.dtype
    return torch.get_default_dtype()


def normal_tensor_tensor(mean: torch.Tensor, std: torch.Tensor, *, generator: Any = None) -> Any:
    if generator is not None:
        return NotImplemented
    shape = _broadcast_shapes(mean.shape, std.shape)
    return mean + std * torch.randn(shape, dtype=_normal_dtype(mean, std))


def normal_tensor_float(mean: torch.Tensor, std: float = 1.0, *, generator: Any = None) -> Any:
    if generator is not None:
        return NotImplemented
    return mean + std * torch.randn(mean.shape, dtype=mean.dtype)


def normal_float_tensor(mean: float, std: torch.Tensor, *, generator: Any = None) -> Any:
    if generator is not None:
        return NotImplemented
    return mean + std * torch.randn(std.shape, dtype=std.dtype)


def normal_float_float(
    mean: float,
    std: float,
    size: Sequence[int],
    *,
    generator: Any = None,
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: bool | None = None,
) -> Any:
    if generator is not None:
        return NotImplemented
    return mean + std * torch.randn(list(size), dtype=dtype or torch.get_default_dtype())


def randint_like(
    x: torch.Tensor,
    high: int,
    *,
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: bool | None = None,
    memory_format: Any = None,
) -> Any:
    return randint_like_low(x, 0, high, dtype=dtype)


def randint_like_low(
    x: torch.Tensor,
    low: int,
    high: int,
    *,
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: bool | None = None,
    memory_format: Any = None,
) -> Any:
    """``low + floor(u * (high - low))``, ``u`` uniform in [0, 1) in
    float64 (exact for spans below 2**53)."""
    span = high - low
    u = torch.rand(x.shape, dtype=torch.float64)
    drawn = torch.clamp(torch.floor(u * span), max=span - 1) + low
    return drawn.to(dtype or x.dtype)


def multinomial(x: torch.Tensor, num_samples: int, replacement: bool = False, *, generator: Any = None) -> Any:
    """Rows of ``x`` are unnormalized probabilities.  With replacement:
    each sample is the first category whose cumulative probability
    exceeds a uniform draw; without: the Gumbel top-k trick (the indices
    of the ``num_samples`` largest ``log p + Gumbel`` noises: a draw
    without replacement, proportional to ``p``)."""
    if generator is not None or not x.dtype.is_floating_point:
        return NotImplemented
    rows = x.reshape(-1, x.shape[-1]).to(torch.float64)
    probabilities = rows / rows.sum(-1, keepdim=True)
    if replacement:
        cumulative = torch.cumsum(probabilities, -1)  # [r, n]
        u = torch.rand(rows.shape[0], num_samples, dtype=torch.float64)  # [r, s]
        # The count of categories whose cumulative probability is <= u.
        chosen = (cumulative.unsqueeze(1) <= u.unsqueeze(-1)).sum(-1)
        # A category of probability 0 is never drawn: clamp to the last positive one.
        last = rows.shape[-1] - 1 - torch.argmax((probabilities > 0).flip(-1).to(torch.int32), -1, keepdim=True)
        chosen = torch.minimum(chosen, last)
    else:
        u = torch.rand(rows.shape, dtype=torch.float64)
        gumbel = -torch.log(-torch.log(torch.clamp(u, min=1e-300)))
        scores = torch.where(probabilities > 0, torch.log(probabilities) + gumbel, torch.full_like(u, -math.inf))
        chosen = torch.topk(scores, num_samples, -1).indices
    return chosen.to(torch.int64).reshape(*x.shape[:-1], num_samples)


def _own_entries() -> dict[Any, Callable[..., Any]]:
    return {
        aten.nextafter.default: nextafter,
        aten.frexp.Tensor: frexp,
        aten.resize.default: resize,
        aten.embedding_bag.padding_idx: embedding_bag,
        aten.histogram.bin_ct: histogram,
        aten._upsample_bilinear2d_aa.default: upsample_bilinear2d_aa,
        aten.grid_sampler_3d.default: grid_sampler_3d,
        aten.fractional_max_pool2d.default: fractional_max_pool2d,
        aten.fractional_max_pool3d.default: fractional_max_pool3d,
        aten.segment_reduce.default: segment_reduce,
        aten._histogramdd_bin_edges.default: histogramdd_bin_edges,
        aten._histogramdd_from_bin_cts.default: histogramdd_from_bin_cts,
        aten.normal.Tensor_Tensor: normal_tensor_tensor,
        aten.normal.Tensor_float: normal_tensor_float,
        aten.normal.float_Tensor: normal_float_tensor,
        aten.normal.float_float: normal_float_float,
        aten.randint_like.default: randint_like,
        aten.randint_like.low_dtype: randint_like_low,
        aten.multinomial.default: multinomial,
    }


# --- host-side error checks ---------------------------------------------------------------

#: Ops that only check values on the host and raise (linalg's "the matrix
#: is singular"); export threads an effect token through them.
ERROR_CHECKS = frozenset((aten._linalg_check_errors.default,))


def remove_error_checks(exported: ExportedProgram) -> ExportedProgram:
    """Drop the host-side error checks (:data:`ERROR_CHECKS`) of an
    exported program, and the effect tokens export threads through them
    (an input and an output of kind TOKEN, which an XLA program has no
    use for).  An XLA program cannot raise on a value: where eager raises
    (a singular matrix), the compiled program returns what the
    factorization gives (inf or NaN), as JAX and torch_xla do.  A program
    with another effectful op is left as it is (refused by name)."""
    graph = exported.graph_module.graph
    effects = [node for node in graph.nodes if node.target is torch.ops.higher_order.with_effects]
    if not effects or any(node.args[1] not in ERROR_CHECKS for node in effects):
        return exported
    _remove_effect_tokens(exported)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in ERROR_CHECKS and not node.users:
            graph.erase_node(node)
    exported.graph_module.recompile()
    return exported


# --- uint8 constants -----------------------------------------------------------------------

_CONSTANT_FILLS = frozenset((aten.full.default, aten.zeros.default, aten.ones.default))


def unsigned_constants_as_bitcasts(graph: torch.fx.Graph) -> bool:
    """A constant ``uint8`` tensor (``full``, ``zeros``, ``ones``) becomes
    the ``int8`` constant of the same bits viewed as ``uint8``: torch-mlir
    folds a ``uint8`` constant (or a conversion of one) into a
    ``torch.vtensor.literal`` it then cannot lower to StableHLO, and it
    folds no bitcast.  An empty one is an empty slice of a one-element
    constant (an empty value folds whatever made it).  Returns whether
    anything changed."""
    changed = False
    for node in list(graph.nodes):
        value = node.meta.get("val")
        if node.op != "call_function" or node.target not in _CONSTANT_FILLS:
            continue
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
            continue
        if not all(isinstance(size, int) for size in value.shape):
            continue
        if node.target is aten.full.default:
            fill = node.args[1]
        else:
            fill = 0 if node.target is aten.zeros.default else 1
        if not isinstance(fill, (int, float, bool)):
            continue
        byte = int(fill) % 256
        signed = byte - 256 if byte > 127 else byte
        shape = list(value.shape)
        empty = value.numel() == 0
        # New nodes carry fake values made from the node's own (the importer reads their types).
        signed_value = value.new_zeros([1] if empty else shape, dtype=torch.int8)
        with graph.inserting_before(node):
            signed_node = graph.call_function(aten.full.default, ([1] if empty else shape, signed), {"dtype": torch.int8})
            signed_node.meta = {"val": signed_value}
            replacement = graph.call_function(aten.view.dtype, (signed_node, torch.uint8))
            replacement.meta = {"val": signed_value.view(torch.uint8)}
            if empty:
                flat = replacement
                replacement = graph.call_function(aten.slice.Tensor, (flat, 0, 1, 1))
                replacement.meta = {"val": flat.meta["val"][0:0]}
                if shape != [0]:
                    sliced = replacement
                    replacement = graph.call_function(aten.view.default, (sliced, shape))
                    replacement.meta = {"val": value}
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        changed = True
    return changed


def op_coverage_decompositions() -> dict[Any, Callable[..., Any]]:
    """The table of this module's decompositions by op (with
    :mod:`hloalias.frontend.ctc_loss`'s)."""
    return {**_own_entries(), **ctc_loss_decompositions()}
