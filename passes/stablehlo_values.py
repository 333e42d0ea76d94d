"""Small readers of StableHLO values shared by the pattern passes: which op
defines a value, its static shape, and the integers a constant holds."""

from __future__ import annotations

import math

from torch_mlir import ir


def producer(value: ir.Value, name: str) -> ir.Operation | None:
    """The operation named ``name`` that defines ``value``, or None (a block
    argument, or another op)."""
    owner = value.owner
    if isinstance(owner, (ir.OpView, ir.Operation)) and owner.operation.name == name:
        return owner.operation
    return None


def shape_of(value: ir.Value) -> list[int]:
    """The dimensions of ranked-tensor ``value``."""
    return list(ir.RankedTensorType(value.type).shape)


def splat_integer(value: ir.Value) -> int | None:
    """The integer every element of a splat ``stablehlo.constant`` holds."""
    constant = producer(value, "stablehlo.constant")
    if constant is None:
        return None
    attribute = constant.attributes["value"]
    if not isinstance(attribute, ir.DenseIntElementsAttr) or not attribute.is_splat:
        return None
    return int(ir.IntegerAttr(attribute.get_splat_value()).value)


def constant_integers(value: ir.Value) -> list[int] | None:
    """The elements of ``value`` when a ``stablehlo.constant`` of integers
    defines it (a splat repeated to the element count)."""
    constant = producer(value, "stablehlo.constant")
    if constant is None:
        return None
    attribute = constant.attributes["value"]
    if not isinstance(attribute, ir.DenseIntElementsAttr):
        return None
    count = math.prod(shape_of(value))
    if attribute.is_splat:
        return [int(ir.IntegerAttr(attribute.get_splat_value()).value)] * count
    return [int(attribute[i]) for i in range(count)]
