"""``widen-one-row-updates``: a ``dynamic_update_slice`` that writes one row
of a tensor a ``dot_general`` then reads (a decode step's KV-cache write)
writes two rows instead, the second one unchanged, so XLA:CPU keeps the
write in place and the dot reads the written buffer.

XLA:CPU's fusion counts an update whose non-1 dimensions are fewer than its
result's as effectively unary and duplicates it into a consumer that only
reshapes the result, as a dot reading the cache does (the cache without its
size-1 batch dimension): the duplicate computes a fresh copy of the updated
cache, and the in-place update then needs a copy of the old one (measured:
the decode step's temp doubles with ``fold-repeat-into-dot-general``).  An
update with as many non-1 dimensions as the result is not duplicated.

The rewrite is exact.  For a ``dynamic_update_slice`` of ``operand`` whose
update is ``operand``'s shape except for size 1 along one dimension ``r``
(size ``N >= 2`` in ``operand``), at start ``i`` along ``r``: the update
start clamps to ``c = clamp(0, i, N-1)`` (as the op itself clamps it); the
new write starts at ``s = clamp(0, c, N-2)``, and its two rows are
``operand``'s own rows at ``s`` (``dynamic_slice``, the same other start
indices) with row ``c - s`` replaced by the old update.  Every element
``operand`` had outside row ``c`` is written with its own value.

Applies when the update's non-1 dimensions are fewer than the result's
(a two-row update has as many), its start indices are signed integers, and
the result reaches a ``dot_general`` operand through ``reshape``,
``transpose``, ``broadcast_in_dim``, ``multiply`` and ``convert`` links (the read the
duplication would copy).  Never fires on other updates: a write nothing
dots over keeps its one row."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import create, shape_of

_LINKS = ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.broadcast_in_dim", "stablehlo.multiply", "stablehlo.convert")


@dataclasses.dataclass(frozen=True)
class WidenReport:
    """How many one-row updates now write two rows."""

    widened: int

    def to_text(self) -> str:
        """The report as people read it."""
        return f"widen-one-row-updates: {self.widened} one-row updates widened"


@dataclasses.dataclass(frozen=True)
class WidenOneRowUpdates(ModulePass[WidenReport]):
    """Write a dotted-over one-row ``dynamic_update_slice`` as two rows."""

    name: ClassVar[str] = "widen-one-row-updates"

    def apply(self, module: ModuleLike) -> WidenReport:
        """Rewrite every such update in ``module`` in place."""
        module = as_module_like(module)
        verify_contract(module)
        widener = _Widener()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.dynamic_update_slice", widener.widen)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return WidenReport(widener.widened)


def _reaches_dot(value: ir.Value, depth: int = 0) -> bool:
    """Whether ``value`` is a ``dot_general`` operand through link ops."""
    if depth > 16:
        return False
    for use in value.uses:
        user = use.owner.operation if isinstance(use.owner, ir.OpView) else use.owner
        if not isinstance(user, ir.Operation):
            continue
        if user.name == "stablehlo.dot_general":
            return True
        if user.name in _LINKS and _reaches_dot(user.results[0], depth + 1):
            return True
    return False


def _non_1(shape: list[int]) -> int:
    return len([size for size in shape if size != 1])


@dataclasses.dataclass
class _Widener:
    widened: int = 0

    def widen(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """One one-row update -> a two-row one (returns False when rewritten)."""
        operand, update = op.operands[0], op.operands[1]
        starts = list(op.operands[2:])
        operand_shape, update_shape = shape_of(operand), shape_of(update)
        rows = [d for d, (a, b) in enumerate(zip(operand_shape, update_shape)) if a != b]
        if len(rows) != 1 or update_shape[rows[0]] != 1 or operand_shape[rows[0]] < 2:
            return True
        if _non_1(update_shape) >= _non_1(operand_shape) or not starts:
            return True
        index_type = ir.RankedTensorType(starts[0].type)
        element = index_type.element_type
        if not isinstance(element, ir.IntegerType) or element.is_unsigned:
            return True
        if not _reaches_dot(op.results[0]):
            return True
        row = rows[0]
        size = operand_shape[row]
        wide_shape = list(update_shape)
        wide_shape[row] = 2
        value_type = ir.RankedTensorType(update.type)
        wide_type = ir.RankedTensorType.get(wide_shape, value_type.element_type)
        mask_type = ir.RankedTensorType.get(wide_shape, element)
        with rewriter.ip, op.location:
            def constant(number: int) -> ir.Value:
                attribute = ir.DenseElementsAttr.get_splat(index_type, ir.IntegerAttr.get(element, number))
                return create("stablehlo.constant", index_type, [], {"value": attribute})

            zero = constant(0)
            clamped = create("stablehlo.clamp", index_type, [zero, starts[row], constant(size - 1)])
            start = create("stablehlo.clamp", index_type, [zero, clamped, constant(size - 2)])
            offset = create("stablehlo.subtract", index_type, [clamped, start])
            new_starts = list(starts)
            new_starts[row] = start
            old_rows = create("stablehlo.dynamic_slice", wide_type, [operand, *new_starts],
                               {"slice_sizes": ir.DenseI64ArrayAttr.get(wide_shape)})
            dims = ir.DenseI64ArrayAttr.get(list(range(len(wide_shape))))
            new_rows = create("stablehlo.broadcast_in_dim", wide_type, [update], {"broadcast_dimensions": dims})
            iota = create("stablehlo.iota", mask_type, [], {"iota_dimension": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), row)})
            offsets = create("stablehlo.broadcast_in_dim", mask_type, [offset],
                              {"broadcast_dimensions": ir.DenseI64ArrayAttr.get([])})
            bool_type = ir.RankedTensorType.get(wide_shape, ir.IntegerType.get_signless(1))
            compare = ir.Operation.create(
                "stablehlo.compare", results=[bool_type], operands=[iota, offsets],
                attributes={"comparison_direction": ir.Attribute.parse("#stablehlo<comparison_direction EQ>")},
            ).results[0]
            merged = create("stablehlo.select", wide_type, [compare, new_rows, old_rows])
            replacement = create("stablehlo.dynamic_update_slice", op.results[0].type, [operand, merged, *new_starts])
        rewriter.replace_op(op, [replacement])
        self.widened += 1
        return False
