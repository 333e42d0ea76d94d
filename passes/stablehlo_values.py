"""Small readers of StableHLO values shared by the pattern passes: which op
defines a value, its static shape, the integers a constant holds, and
whether an index value is an ``arange``; and :func:`create`, the
one-result op builder they share."""

from __future__ import annotations

import math

from torch_mlir import ir


def create(name: str, result: ir.Type, operands: list[ir.Value],
           attributes: dict[str, ir.Attribute] | None = None) -> ir.Value:
    """The result of a new ``name`` op (one result) at the insertion point."""
    return ir.Operation.create(name, results=[result], operands=operands, attributes=attributes or {}).results[0]


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


def is_arange(value: ir.Value) -> bool:
    """True when the rank-1 ``value`` is ``0, 1, ..., n-1``: an ``iota`` or
    ``dynamic_iota`` (static result), optionally ``* 1`` then ``+ 0``."""
    add = producer(value, "stablehlo.add")
    if add is not None:
        if splat_integer(add.operands[1]) != 0:
            return False
        value = add.operands[0]
    multiply = producer(value, "stablehlo.multiply")
    if multiply is not None:
        if splat_integer(multiply.operands[1]) != 1:
            return False
        value = multiply.operands[0]
    for name in ("stablehlo.iota", "stablehlo.dynamic_iota"):
        iota = producer(value, name)
        if iota is not None:
            dimension = ir.IntegerAttr(iota.attributes["iota_dimension"]).value
            return dimension == 0 and len(shape_of(value)) == 1 and ir.RankedTensorType(value.type).has_static_shape
    return False


def strip_unit_reshapes(value: ir.Value) -> ir.Value:
    """Look through reshapes that only add or drop size-1 dimensions."""
    while True:
        reshape = producer(value, "stablehlo.reshape")
        if reshape is None:
            return value
        source = reshape.operands[0]
        if [n for n in shape_of(source) if n != 1] != [n for n in shape_of(value) if n != 1]:
            return value
        value = source
