"""Strided layouts of PyTorch views, and which StableHLO ops are views.

A :class:`Layout` says where a view's elements sit in its base's storage
(sizes, strides and offset in elements, as ``Tensor.as_strided`` takes them).
``apply_view_op`` pushes a layout through one StableHLO op, or answers None
when PyTorch could not represent the op's result as a view of the same
storage (a reshape of non-contiguous data, a bitcast between widths)."""

from __future__ import annotations

import dataclasses
import math

from torch_mlir import ir

from hloalias.contract import Layout as Layout
from hloalias.contract import row_major_strides as _row_major_strides
from hloalias.mlir import element_bits

VIEW_OPS = frozenset(
    {
        "stablehlo.slice",
        "stablehlo.reshape",
        "stablehlo.transpose",
        "stablehlo.broadcast_in_dim",
        "stablehlo.bitcast_convert",
        "stablehlo.dynamic_reshape",
        "stablehlo.real_dynamic_slice",
    }
)


def describe_view_op(op: ir.Operation) -> str:
    """A short human description of a view op for the removal record."""
    name = op.name.removeprefix("stablehlo.")
    result = ir.RankedTensorType(op.results[0].type)
    shape = "x".join(str(s) for s in result.shape) or "scalar"
    if name == "slice":
        params = _slice_params(op)
        assert params is not None  # stablehlo.slice always has them
        starts, limits, steps = params
        spans = ", ".join(f"{a}:{b}:{c}" for a, b, c in zip(starts, limits, steps))
        return f"slice [{spans}]"
    if name == "transpose":
        return f"transpose {list(_i64s(op, 'permutation'))}"
    if name == "broadcast_in_dim":
        return f"expand {list(_i64s(op, 'broadcast_dimensions'))} -> {shape}"
    if name == "bitcast_convert":
        return f"view dtype {result.element_type}"
    return f"reshape {shape}"


def apply_view_op(layout: Layout, op: ir.Operation) -> Layout | None:
    """The layout of ``op``'s result given its operand's ``layout``, or None
    if the result is not a PyTorch view of the operand's storage."""
    name = op.name
    result = ir.RankedTensorType(op.results[0].type)
    if not result.has_static_shape:
        return None
    if name == "stablehlo.slice" or name == "stablehlo.real_dynamic_slice":
        params = _slice_params(op)
        if params is None:
            return None
        return _slice(layout, *params)
    if name == "stablehlo.transpose":
        perm = _i64s(op, "permutation")
        return Layout(
            tuple(layout.sizes[p] for p in perm),
            tuple(layout.strides[p] for p in perm),
            layout.offset,
            layout.element_type,
        )
    if name == "stablehlo.broadcast_in_dim":
        return _broadcast(layout, _i64s(op, "broadcast_dimensions"), tuple(result.shape))
    if name in ("stablehlo.reshape", "stablehlo.dynamic_reshape"):
        strides = view_strides(layout.sizes, layout.strides, tuple(result.shape))
        if strides is None:
            return None
        return Layout(tuple(result.shape), strides, layout.offset, layout.element_type)
    if name == "stablehlo.bitcast_convert":
        source = ir.RankedTensorType(op.operands[0].type)
        old_bits = element_bits(source.element_type)
        new_bits = element_bits(result.element_type)
        # PyTorch's view(dtype) keeps sizes only between equal widths; i1 is
        # stored as a byte by both, which a bitcast does not respect.
        if old_bits != new_bits or old_bits == 1 or tuple(source.shape) != tuple(result.shape):
            return None
        return dataclasses.replace(layout, element_type=result.element_type)
    return None


def _i64s(op: ir.Operation, name: str) -> tuple[int, ...]:
    return tuple(ir.DenseI64ArrayAttr(op.attributes[name]))


def _slice_params(
    op: ir.Operation,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
    if op.name == "stablehlo.slice":
        return (
            _i64s(op, "start_indices"),
            _i64s(op, "limit_indices"),
            _i64s(op, "strides"),
        )
    # real_dynamic_slice is a view only when its bounds are constants.
    bounds = []
    for operand in list(op.operands)[1:4]:
        constant = _constant_ints(operand)
        if constant is None:
            return None
        bounds.append(constant)
    return bounds[0], bounds[1], bounds[2]


def _constant_ints(value: ir.Value) -> tuple[int, ...] | None:
    owner = value.owner
    if not isinstance(owner, (ir.Operation, ir.OpView)) or owner.name != "stablehlo.constant":
        return None
    attr = owner.attributes["value"]
    if not isinstance(attr, ir.DenseIntElementsAttr):
        return None
    return tuple(int(v) for v in ir.DenseIntElementsAttr(attr))


def _slice(
    layout: Layout, starts: tuple[int, ...], limits: tuple[int, ...], steps: tuple[int, ...]
) -> Layout | None:
    if any(step <= 0 for step in steps):
        return None
    sizes = []
    strides = []
    offset = layout.offset
    for dim, (start, limit, step) in enumerate(zip(starts, limits, steps)):
        size = max(0, math.ceil((limit - start) / step))
        sizes.append(size)
        strides.append(layout.strides[dim] * step)
        offset += start * layout.strides[dim]
    return Layout(tuple(sizes), tuple(strides), offset, layout.element_type)


def _broadcast(layout: Layout, dims: tuple[int, ...], shape: tuple[int, ...]) -> Layout:
    strides = [0] * len(shape)
    for source_dim, result_dim in enumerate(dims):
        if layout.sizes[source_dim] == shape[result_dim]:
            strides[result_dim] = layout.strides[source_dim]
    return Layout(shape, tuple(strides), layout.offset, layout.element_type)


def view_strides(
    old_sizes: tuple[int, ...], old_strides: tuple[int, ...], new_sizes: tuple[int, ...]
) -> tuple[int, ...] | None:
    """Strides of ``view(new_sizes)`` on a tensor with ``old_sizes`` and
    ``old_strides``, or None where PyTorch's ``view`` would refuse (the
    same rule as ATen's ``computeStride``)."""
    if math.prod(old_sizes) != math.prod(new_sizes):
        return None
    if math.prod(old_sizes) == 0 or not old_sizes:
        return _row_major_strides(new_sizes)
    new_strides = [0] * len(new_sizes)
    view_dim = len(new_sizes) - 1
    chunk_base_stride = old_strides[-1]
    tensor_numel = 1
    view_numel = 1
    for tensor_dim in range(len(old_sizes) - 1, -1, -1):
        tensor_numel *= old_sizes[tensor_dim]
        chunk_ends = tensor_dim == 0 or (
            old_sizes[tensor_dim - 1] != 1
            and old_strides[tensor_dim - 1] != tensor_numel * chunk_base_stride
        )
        if chunk_ends:
            while view_dim >= 0 and (view_numel < tensor_numel or new_sizes[view_dim] == 1):
                new_strides[view_dim] = view_numel * chunk_base_stride
                view_numel *= new_sizes[view_dim]
                view_dim -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_dim > 0:
                chunk_base_stride = old_strides[tensor_dim - 1]
                tensor_numel = 1
                view_numel = 1
    if view_dim != -1:
        return None
    return tuple(new_strides)
