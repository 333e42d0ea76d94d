"""``bitcast-overwrite-scatter``: an overwrite-only ``stablehlo.scatter`` on
16-bit floats runs on 16-bit integers instead.

XLA:CPU has no native bf16/f16 scatter: it converts the operand and updates
to f32, scatters, and converts back, which keeps two f32 copies of the whole
operand in temporary memory (a KV cache written with ``index_copy_`` costs
twice its own size in temp on every call).  A scatter whose update
computation returns the update unchanged does no arithmetic, so it moves the
same bit patterns whatever the element type says they mean: bit-casting the
operand and updates to a same-width integer type, scattering those and
bit-casting the result back is exact (NaN payloads and signed zeros
included), and XLA scatters integers in place.

Applies to a single-operand scatter whose operand element type is bf16 or
f16, whose region is exactly ``^bb0(%old, %new): return %new`` and which
reads more than one index vector.  A one-index scatter is left alone: XLA
already turns it into an in-place ``dynamic-update-slice`` at any type, and
XLA:CPU materializes a ``bitcast_convert`` as a copy (one operand-sized
buffer in temp, which is still a quarter of the two f32 copies it saves).  Never
fires on a combiner that computes (``add``, ``max``, a ``select``, ...) nor
one that returns the old value: those depend on the float interpretation.
A ``bitcast_convert`` of a ``bitcast_convert`` that restores the original
type is folded away, so chains of rewritten scatters pass integers along."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite
from torch_mlir._mlir_libs import _stablehlo

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract


@dataclasses.dataclass(frozen=True)
class BitcastScatterReport:
    """How many scatters now run on integers."""

    rewritten: int

    def to_text(self) -> str:
        """The report as people read it."""
        return f"bitcast-overwrite-scatter: {self.rewritten} scatters run on integers"


@dataclasses.dataclass(frozen=True)
class BitcastOverwriteScatter(ModulePass[BitcastScatterReport]):
    """Run overwrite-only bf16/f16 scatters on same-width integers."""

    name: ClassVar[str] = "bitcast-overwrite-scatter"

    def apply(self, module: ModuleLike) -> BitcastScatterReport:
        """Rewrite every eligible scatter in ``module`` in place."""
        module = as_module_like(module)
        verify_contract(module)
        counter = _Counter()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.scatter", counter.bitcast_scatter)
            patterns.add("stablehlo.bitcast_convert", _fold_round_trip)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return BitcastScatterReport(counter.rewritten)


def _is_16_bit_float(element: ir.Type) -> bool:
    return isinstance(element, (ir.BF16Type, ir.F16Type))


def is_overwrite_region(region: ir.Region) -> bool:
    """True when ``region`` is ``^bb0(%old, %new): return %new`` and nothing else."""
    blocks = list(region.blocks)
    if len(blocks) != 1 or len(blocks[0].arguments) != 2:
        return False
    operations = list(blocks[0].operations)
    if len(operations) != 1 or operations[0].operation.name != "stablehlo.return":
        return False
    returned = list(operations[0].operation.operands)
    return len(returned) == 1 and returned[0] == blocks[0].arguments[1]


@dataclasses.dataclass
class _Counter:
    rewritten: int = 0

    def bitcast_scatter(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """``scatter(x, i, u)`` on bf16/f16 -> ``bitcast(scatter(bitcast(x), i, bitcast(u)))`` on i16."""
        operation = op.operation
        if len(operation.operands) != 3 or len(operation.results) != 1:
            return True  # variadic scatter: left alone
        operand_type = ir.RankedTensorType(operation.operands[0].type)
        updates_type = ir.RankedTensorType(operation.operands[2].type)
        if not _is_16_bit_float(operand_type.element_type) or updates_type.element_type != operand_type.element_type:
            return True
        if not is_overwrite_region(operation.regions[0]):
            return True
        if _index_count(operation) <= 1:
            return True  # XLA makes it an in-place dynamic-update-slice at any type
        integer = ir.IntegerType.get_signless(16)
        scalar = ir.RankedTensorType.get([], integer)
        attributes = {name: operation.attributes[name] for name in operation.attributes}
        with rewriter.ip, operation.location:
            operand = _bitcast(operation.operands[0], ir.RankedTensorType.get(operand_type.shape, integer))
            updates = _bitcast(operation.operands[2], ir.RankedTensorType.get(updates_type.shape, integer))
            scatter = ir.Operation.create(
                "stablehlo.scatter",
                results=[operand.type],
                operands=[operand, operation.operands[1], updates],
                attributes=attributes,
                regions=1,
            )
            block = scatter.regions[0].blocks.append(scalar, scalar)
            with ir.InsertionPoint(block):
                ir.Operation.create("stablehlo.return", operands=[block.arguments[1]])
            result = _bitcast(scatter.results[0], operation.results[0].type)
        rewriter.replace_op(op, [result])
        self.rewritten += 1
        return False


def _index_count(scatter: ir.Operation) -> int:
    """How many index vectors ``scatter`` reads."""
    numbers = _stablehlo.ScatterDimensionNumbers(scatter.attributes["scatter_dimension_numbers"])
    shape = list(ir.RankedTensorType(scatter.operands[1].type).shape)
    count = 1
    for dimension, size in enumerate(shape):
        if dimension != numbers.index_vector_dim:
            count *= size
    return count


def _bitcast(value: ir.Value, to: ir.Type) -> ir.Value:
    return ir.Operation.create("stablehlo.bitcast_convert", results=[to], operands=[value]).results[0]


def _fold_round_trip(op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
    """``bitcast_convert(bitcast_convert(x))`` back to ``x``'s type -> ``x``."""
    producer = op.operation.operands[0].owner
    if not isinstance(producer, (ir.OpView, ir.Operation)) or producer.name != "stablehlo.bitcast_convert":
        return True
    source = producer.operands[0]
    if source.type != op.operation.results[0].type:
        return True
    rewriter.replace_op(op, [source])
    return False
