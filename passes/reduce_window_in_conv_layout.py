"""``reduce-window-in-conv-layout``: a pooling ``reduce_window`` over a
convolution's output runs on the convolution's channels-last order.

XLA:CPU's convolution computes in NHWC (batch, spatial..., feature) and
lays its output out so; torch's activations are NCHW.  Elementwise ops take
either layout, but XLA:CPU gives a ``reduce_window`` the default layout of
its logical shape, so a max-pool of an NCHW convolution output costs a full
relayout copy of that output in temp (HF ResNet's stem at 224x224, batch 2:
6.4 MB) and another of the pool's output back for the next convolution.
Written as ``transpose(reduce_window(transpose(x, P)), P^-1)`` with P the
convolution's (batch, spatial..., feature) order, the same window reads a
logically NHWC tensor: its default layout is the convolution's, and XLA
turns both transposes into bitcasts.  The rewrite is exact (a relabelling of
dimensions; the window, strides, padding and dilations move with them).

Applies to a single-input ``stablehlo.reduce_window`` whose operand is a
``stablehlo.convolution`` result, directly or through elementwise ops (the
BatchNorm, bias and activation between a convolution and its pool), when the
window does not touch the convolution's batch and feature dimensions (size
1, stride 1, no padding or dilation there) and the convolution's order is
not already the operand's.  Never applies to a variadic ``reduce_window``
(max-pool with indices), to pooling of values no convolution computed (its
layout is the caller's, the transposes would be copies), or to windows over
the feature dimension.  Measured on XLA:CPU only: not in the default
pipeline; ``hloalias.compile`` runs it on one CPU device."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from hloalias.contract import inverse_permutation, verify
from hloalias.mlir import find_main, walk_ops
from hloalias.passes.base import ModuleLike, ModulePass, as_module_like

# Ops whose result element i depends on their operands' element i only:
# a convolution's layout passes through them unchanged.
ELEMENTWISE = frozenset({
    "stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide", "stablehlo.maximum",
    "stablehlo.minimum", "stablehlo.negate", "stablehlo.abs", "stablehlo.exponential", "stablehlo.tanh",
    "stablehlo.logistic", "stablehlo.sqrt", "stablehlo.rsqrt", "stablehlo.convert", "stablehlo.select",
    "stablehlo.clamp", "stablehlo.power", "stablehlo.log", "stablehlo.log_plus_one",
    "stablehlo.exponential_minus_one",
})
_SEARCH_DEPTH = 16


@dataclasses.dataclass(frozen=True)
class PoolLayoutReport:
    """How many pools now run in their convolution's order."""

    rewritten: int

    def to_text(self) -> str:
        """The report as people read it."""
        return f"reduce-window-in-conv-layout: {self.rewritten} reduce_window ops run in convolution order"


@dataclasses.dataclass(frozen=True)
class ReduceWindowInConvLayout(ModulePass[PoolLayoutReport]):
    """Run pools of convolution outputs in the convolution's (batch, spatial..., feature) order."""

    name: ClassVar[str] = "reduce-window-in-conv-layout"

    def apply(self, module: ModuleLike) -> PoolLayoutReport:
        """Rewrite every eligible ``reduce_window`` of ``@main`` in place."""
        module = as_module_like(module)
        rewritten = 0
        with module.context, ir.Location.unknown():
            main = find_main(module)
            verify(main)
            pools = [op for op in walk_ops(main.operation) if op.name == "stablehlo.reduce_window"]
            for pool in pools:
                order = _conv_order(pool)
                if order is not None:
                    _rewrite(pool, order)
                    rewritten += 1
            verify(main)
        return PoolLayoutReport(rewritten)


def _conv_order(pool: ir.Operation) -> tuple[int, ...] | None:
    """The (batch, spatial..., feature) order of the convolution that
    computes ``pool``'s input, when the pool may run in it; else None."""
    if len(pool.operands) != 2 or len(pool.results) != 1:
        return None
    convolution = _producing_convolution(pool.operands[0])
    if convolution is None:
        return None
    numbers = _stablehlo.ConvDimensionNumbers(convolution.attributes["dimension_numbers"])
    order = (numbers.output_batch_dimension, *numbers.output_spatial_dimensions, numbers.output_feature_dimension)
    if order == tuple(range(len(order))):
        return None
    rank = len(order)
    window = _array(pool, "window_dimensions", rank, 1)
    strides = _array(pool, "window_strides", rank, 1)
    base = _array(pool, "base_dilations", rank, 1)
    dilations = _array(pool, "window_dilations", rank, 1)
    padding = _padding(pool, rank)
    for dim in (numbers.output_batch_dimension, numbers.output_feature_dimension):
        if window[dim] != 1 or strides[dim] != 1 or base[dim] != 1 or dilations[dim] != 1 or padding[dim] != [0, 0]:
            return None
    return order


def _producing_convolution(value: ir.Value) -> ir.Operation | None:
    """The convolution whose output ``value`` is, directly or through
    same-shaped operands of elementwise ops; None if none is found."""
    shape = ir.RankedTensorType(value.type).shape
    stack = [(value, 0)]
    seen: set[ir.Value] = set()
    while stack:
        current, depth = stack.pop()
        owner = current.owner
        if isinstance(owner, ir.Block) or current in seen or depth > _SEARCH_DEPTH:
            continue
        seen.add(current)
        operation = owner.operation
        if operation.name == "stablehlo.convolution":
            return operation
        if operation.name not in ELEMENTWISE:
            continue
        for operand in operation.operands:
            operand_type = ir.RankedTensorType(operand.type)
            if operand_type.shape == shape:
                stack.append((operand, depth + 1))
    return None


def _array(op: ir.Operation, name: str, rank: int, default: int) -> list[int]:
    if name not in op.attributes:
        return [default] * rank
    return [int(v) for v in ir.DenseI64ArrayAttr(op.attributes[name])]


def _padding(op: ir.Operation, rank: int) -> list[list[int]]:
    if "padding" not in op.attributes:
        return [[0, 0] for _ in range(rank)]
    return [[int(v) for v in row] for row in np.array(ir.DenseIntElementsAttr(op.attributes["padding"])).reshape(rank, 2)]


def _transpose(value: ir.Value, permutation: tuple[int, ...]) -> ir.Value:
    tensor = ir.RankedTensorType(value.type)
    shape = [tensor.shape[d] for d in permutation]
    return ir.Operation.create(
        "stablehlo.transpose", results=[ir.RankedTensorType.get(shape, tensor.element_type)], operands=[value],
        attributes={"permutation": ir.DenseI64ArrayAttr.get(list(permutation))},
    ).results[0]


def _rewrite(pool: ir.Operation, order: tuple[int, ...]) -> None:
    """``pool`` -> ``transpose(pool'(transpose(x, order)), order^-1)``."""
    rank = len(order)
    result_type = ir.RankedTensorType(pool.results[0].type)
    with ir.InsertionPoint(pool):
        operand = _transpose(pool.operands[0], order)
        moved = pool.clone(ip=ir.InsertionPoint(pool))
    moved.operands[0] = operand
    moved.results[0].set_type(
        ir.RankedTensorType.get([result_type.shape[d] for d in order], result_type.element_type)
    )
    for name in ("window_dimensions", "window_strides", "base_dilations", "window_dilations"):
        if name in moved.attributes:
            values = _array(moved, name, rank, 1)
            moved.attributes[name] = ir.DenseI64ArrayAttr.get([values[d] for d in order])
    if "padding" in moved.attributes:
        rows = _padding(moved, rank)
        moved.attributes["padding"] = ir.DenseIntElementsAttr.get(
            np.array([rows[d] for d in order], dtype=np.int64)
        )
    with ir.InsertionPoint(pool):
        back = _transpose(moved.results[0], inverse_permutation(order))
    pool.results[0].replace_all_uses_with(back)
    pool.erase()
