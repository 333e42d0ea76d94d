"""``select-to-dynamic-update-slice``: a ``stablehlo.select`` whose mask is
"coordinate ``d`` equals the constant ``k``" becomes a
``stablehlo.dynamic_update_slice`` of the one slice it takes from its true
operand.

torch-mlir lowers ``select_scatter`` (``x[:, k] = v`` / ``x[:, k].copy_(v)``
with a Python-int ``k``) to ``select(broadcast(iota_d == k), broadcast(v), x)``
over the whole of ``x``: every element of a 16x4096x256 cache is read and
written to store one position (0.173 ms/call, against 0.102 ms for the same
write as a one-window scatter; see ``README.md``).  Only slice ``k`` along
``d`` takes the true operand, so the select equals
``dynamic_update_slice(x, slice(on_true, d: k..k+1), 0, .., k, .., 0)``,
exactly: the elements outside the slice are ``x``'s, those inside are
``on_true``'s, whatever the element type.

The mask is recognised through ``broadcast_in_dim`` (of a dimension that is
not expanded from size 1) and reshapes that only add or drop size-1
dimensions, down to ``compare EQ`` of a splat integer constant ``k`` and a
coordinate: an ``iota``/``dynamic_iota`` with a static result (optionally
``* 1`` then ``+ 0``, the ``arange`` torch-mlir emits), seen through the
same broadcasts and reshapes.  Applies only when ``0 <= k < size(d)`` and the
mask has the select's shape.

Never fires on a scalar predicate, a mask of any other form (``NE``, ``LT``,
a non-constant or non-splat ``k``, a strided or offset ``arange``, a
coordinate broadcast from size 1), a ``k`` out of range (the select keeps
all of ``x``), or a select that is already a single slice wide along ``d``
(rewriting it again would gain nothing)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import producer, shape_of, splat_integer


@dataclasses.dataclass(frozen=True)
class SelectToUpdateSliceReport:
    """How many one-slice selects became dynamic-update-slices."""

    rewritten: int

    def to_text(self) -> str:
        """The report as people read it."""
        return f"select-to-dynamic-update-slice: {self.rewritten} selects are dynamic-update-slices"


@dataclasses.dataclass(frozen=True)
class SelectToDynamicUpdateSlice(ModulePass[SelectToUpdateSliceReport]):
    """Rewrite selects masked to one index along one dimension as dynamic-update-slices."""

    name: ClassVar[str] = "select-to-dynamic-update-slice"

    def apply(self, module: ModuleLike) -> SelectToUpdateSliceReport:
        """Rewrite every eligible select in ``module`` in place."""
        module = as_module_like(module)
        verify_contract(module)
        counter = _Counter()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.select", counter.rewrite_select)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return SelectToUpdateSliceReport(counter.rewritten)






def _static(value: ir.Value) -> bool:
    """True when ``value`` is a ranked tensor of static shape."""
    return isinstance(value.type, ir.RankedTensorType) and bool(value.type.has_static_shape)




def _through_layout(value: ir.Value, dimension: int | None, source: ir.Value) -> int | None:
    """Where ``dimension`` of ``source`` lands in ``value`` = a reshape that
    only adds or drops size-1 dims, or a ``broadcast_in_dim`` that does not
    expand it; None when it does not land on one dimension of its own size."""
    if dimension is None:
        return None
    source_shape, shape = shape_of(source), shape_of(value)
    if producer(value, "stablehlo.reshape") is not None:
        kept_source = [d for d, n in enumerate(source_shape) if n != 1]
        kept = [d for d, n in enumerate(shape) if n != 1]
        if [source_shape[d] for d in kept_source] != [shape[d] for d in kept] or dimension not in kept_source:
            return None
        return kept[kept_source.index(dimension)]
    broadcast = producer(value, "stablehlo.broadcast_in_dim")
    assert broadcast is not None
    mapping = list(ir.DenseI64ArrayAttr(broadcast.attributes["broadcast_dimensions"]))
    target = mapping[dimension]
    return target if shape[target] == source_shape[dimension] else None


def _layout_source(value: ir.Value) -> ir.Value | None:
    """The operand of the reshape or ``broadcast_in_dim`` producing ``value``."""
    for name in ("stablehlo.reshape", "stablehlo.broadcast_in_dim"):
        defining = producer(value, name)
        if defining is not None:
            return defining.operands[0]
    return None


def _coordinate(value: ir.Value) -> int | None:
    """The dimension ``d`` when every element of ``value`` is its own
    coordinate along ``d`` (an integer ``iota`` seen through layout ops)."""
    if not _static(value):
        return None
    source = _layout_source(value)
    if source is not None:
        return _through_layout(value, _coordinate(source), source) if _static(source) else None
    add = producer(value, "stablehlo.add")
    if add is not None:
        return _coordinate(add.operands[0]) if splat_integer(add.operands[1]) == 0 else None
    multiply = producer(value, "stablehlo.multiply")
    if multiply is not None:
        return _coordinate(multiply.operands[0]) if splat_integer(multiply.operands[1]) == 1 else None
    element_type = ir.RankedTensorType(value.type).element_type
    if not isinstance(element_type, ir.IntegerType) or element_type.width < 32:
        return None  # a narrow iota may wrap
    for name in ("stablehlo.iota", "stablehlo.dynamic_iota"):
        iota = producer(value, name)
        if iota is not None:
            return int(ir.IntegerAttr(iota.attributes["iota_dimension"]).value)
    return None


def _single_index(mask: ir.Value) -> tuple[int, int] | None:
    """``(d, k)`` when ``mask`` is true exactly where coordinate ``d`` is ``k``."""
    if not _static(mask):
        return None
    source = _layout_source(mask)
    if source is not None:
        found = _single_index(source) if _static(source) else None
        if found is None:
            return None
        dimension = _through_layout(mask, found[0], source)
        return None if dimension is None else (dimension, found[1])
    compare = producer(mask, "stablehlo.compare")
    if compare is None or str(compare.attributes["comparison_direction"]) != "#stablehlo<comparison_direction EQ>":
        return None
    lhs, rhs = compare.operands
    for coordinate, constant in ((lhs, rhs), (rhs, lhs)):
        k = splat_integer(constant)
        d = _coordinate(coordinate)
        if k is not None and d is not None:
            return d, k
    return None


@dataclasses.dataclass
class _Counter:
    rewritten: int = 0

    def rewrite_select(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """``select(coord_d == k, t, f)`` -> ``dynamic_update_slice(f, t[d: k..k+1], k at d)``."""
        operation = op.operation
        mask, on_true, on_false = operation.operands
        if not all(_static(v) for v in (mask, on_true, on_false)):
            return True
        result_type = ir.RankedTensorType(operation.results[0].type)
        if not result_type.has_static_shape or shape_of(mask) != list(result_type.shape):
            return True
        found = _single_index(mask)
        if found is None:
            return True
        dimension, k = found
        shape = list(result_type.shape)
        if not 0 <= k < shape[dimension] or shape[dimension] == 1:
            return True
        limits = list(shape)
        limits[dimension] = 1
        starts = [0] * len(shape)
        starts[dimension] = k
        index = ir.RankedTensorType.get([], ir.IntegerType.get_signless(64))
        with rewriter.ip, operation.location:
            update = ir.Operation.create(
                "stablehlo.slice",
                results=[ir.RankedTensorType.get(limits, result_type.element_type)],
                operands=[on_true],
                attributes={
                    "start_indices": ir.DenseI64ArrayAttr.get([start for start in starts]),
                    "limit_indices": ir.DenseI64ArrayAttr.get(
                        [start + size for start, size in zip(starts, limits)]
                    ),
                    "strides": ir.DenseI64ArrayAttr.get([1] * len(shape)),
                },
            ).results[0]
            constants: dict[int, ir.Value] = {}
            for start in set(starts):
                attribute = ir.DenseElementsAttr.get_splat(index, ir.IntegerAttr.get(index.element_type, start))
                constants[start] = ir.Operation.create(
                    "stablehlo.constant", results=[index], attributes={"value": attribute}
                ).results[0]
            result = ir.Operation.create(
                "stablehlo.dynamic_update_slice",
                results=[result_type],
                operands=[on_false, update, *[constants[start] for start in starts]],
            ).results[0]
        rewriter.replace_op(op, [result])
        self.rewritten += 1
        return False
