"""``narrow-scatter-indices``: a ``stablehlo.scatter`` with 64-bit indices
into an operand whose dimensions fit 32 bits takes 32-bit indices.

XLA's SPMD partitioner aborts the process on a scatter with ``i64``
indices ("Check failed: ShapeUtil::IsScalarWithElementType",
``spmd_partitioner_util.h``): ``jax.jit`` with x64 on a mesh does too.
torch's indices are ``int64``, so a slice assignment of a replicated
buffer from a sharded input (``self.last[:2] = x[:2]``: a scatter with
constant ``[[0], [1]]``) took the caller's process down.  The runtime
appends this pass to the pipeline of every program compiled for a mesh.

The rewrite is exact.  Each index is first clamped to ``[-1, m]``, ``m``
the largest size among the dimensions the indices address, then converted:
an index inside ``[0, m]`` is unchanged, and one outside stays outside
every addressed dimension's bounds (``-1`` is below 0; ``m`` is past
``size - window`` for every window of at least one element), so XLA skips
exactly the windows it skipped before.

Never fires on indices that are not signless ``i64``, on dynamic shapes, or
when an addressed dimension does not fit ``i32``."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite
from torch_mlir._mlir_libs import _stablehlo

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import create

_I32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class NarrowIndicesReport:
    """How many scatters now take 32-bit indices."""

    narrowed: int

    def to_text(self) -> str:
        """The report as people read it."""
        return f"narrow-scatter-indices: {self.narrowed} scatters take 32-bit indices"


@dataclasses.dataclass(frozen=True)
class NarrowScatterIndices(ModulePass[NarrowIndicesReport]):
    """Give scatters 32-bit indices in place of 64-bit ones (clamped: exact)."""

    name: ClassVar[str] = "narrow-scatter-indices"

    def apply(self, module: ModuleLike) -> NarrowIndicesReport:
        """Narrow every eligible scatter's indices in ``module``."""
        module = as_module_like(module)
        verify_contract(module)
        counter = _Counter()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.scatter", counter.narrow)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return NarrowIndicesReport(counter.narrowed)


def _addressed_bound(operation: ir.Operation) -> int | None:
    """The largest size among the operand dimensions the scatter's indices
    address, when the indices are static ``i64`` and it fits ``i32``."""
    operand, indices = operation.operands[0], operation.operands[len(operation.operands) // 2]
    if not isinstance(indices.type, ir.RankedTensorType) or not isinstance(operand.type, ir.RankedTensorType):
        return None
    index_type = ir.RankedTensorType(indices.type)
    element = index_type.element_type
    if not index_type.has_static_shape or not isinstance(element, ir.IntegerType):
        return None
    if not element.is_signless or element.width != 64:
        return None
    operand_type = ir.RankedTensorType(operand.type)
    if not operand_type.has_static_shape:
        return None
    numbers = _stablehlo.ScatterDimensionNumbers(operation.attributes["scatter_dimension_numbers"])
    addressed = [operand_type.shape[d] for d in numbers.scattered_dims_to_operand_dims]
    bound = max(addressed, default=0)
    return bound if bound < _I32_MAX else None


@dataclasses.dataclass
class _Counter:
    narrowed: int = 0

    def narrow(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """``scatter(x, i64 indices, u)`` -> ``scatter(x, i32(clamp(-1, indices, m)), u)``."""
        operation = op.operation
        bound = _addressed_bound(operation)
        if bound is None:
            return True
        position = len(operation.operands) // 2  # operands: inputs..., indices, updates...
        indices = operation.operands[position]
        index_type = ir.RankedTensorType(indices.type)
        with rewriter.ip, operation.location:
            wide = ir.RankedTensorType.get([], index_type.element_type)
            low = _scalar(wide, -1)
            high = _scalar(wide, bound)
            clamped = create("stablehlo.clamp", index_type, [low, indices, high])
            narrow_type = ir.RankedTensorType.get(index_type.shape, ir.IntegerType.get_signless(32))
            narrowed = create("stablehlo.convert", narrow_type, [clamped])
            replacement = operation.clone()
            replacement.operands[position] = narrowed
        rewriter.replace_op(op, list(replacement.results))
        self.narrowed += 1
        return False


def _scalar(scalar: ir.RankedTensorType, value: int) -> ir.Value:
    attribute = ir.DenseElementsAttr.get_splat(scalar, ir.IntegerAttr.get(scalar.element_type, value))
    return ir.Operation.create("stablehlo.constant", results=[scalar], attributes={"value": attribute}).results[0]
