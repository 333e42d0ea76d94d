"""``fold-broadcast-into-dot-general``: a weight broadcast over batch
dimensions that only a batched ``dot_general`` consumes is fed to a
non-batched dot instead.

torch-mlir lowers ``x @ W.t()`` on a 3-d ``x`` (BERT's attention output
projection under SDPA) as ``dot_general(x, broadcast_in_dim(transpose(W)))``
with batching dimensions: XLA:CPU materializes ``B`` copies of the
transposed weight in temp (56 MB of BERT-base's 62 MB at batch 2).  When
the broadcast adds exactly the operand's batching dimensions, every batch
reads the same weight, so a dot without batching dimensions that contracts
the broadcast's source computes the same result: the other operand's batch
dimensions become free dimensions, which come first in its result order
either way.  A ``transpose`` of the source then folds into the new dot as
in ``fold-transpose-into-dot-general`` (that pattern runs here too).

Applies when, on one side: the operand is (through same-type ``reshape``s
and identity ``broadcast_in_dim``s, each used once) a ``broadcast_in_dim``
used only by that chain; the dimensions it adds are exactly that side's
batching dimensions; it expands no size-1 source dimension; the side's free
dimensions keep their order; and the result's dimension order is unchanged
(the other side's batching dimensions are its leading dimensions, in
order).  Never fires when the broadcast (or a link of the chain) has another
user: it would stay materialized for that user anyway."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite
from torch_mlir._mlir_libs import _stablehlo

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import shape_of
from hloalias.passes.fold_transpose_into_dot_general import TransposeFolder


@dataclasses.dataclass(frozen=True)
class BroadcastFoldReport:
    """How many dots lost a broadcast operand (and transposes folded after)."""

    folded: int
    transposes_folded: int

    def to_text(self) -> str:
        """The report as people read it."""
        return (
            f"fold-broadcast-into-dot-general: {self.folded} broadcasts folded, "
            f"{self.transposes_folded} transposes folded after them"
        )


@dataclasses.dataclass(frozen=True)
class FoldBroadcastIntoDotGeneral(ModulePass[BroadcastFoldReport]):
    """Feed the source of a batch-only broadcast to a non-batched ``dot_general``."""

    name: ClassVar[str] = "fold-broadcast-into-dot-general"

    def apply(self, module: ModuleLike) -> BroadcastFoldReport:
        """Rewrite every foldable ``dot_general`` in ``module`` in place;
        broadcasts left without users are erased."""
        module = as_module_like(module)
        verify_contract(module)
        counter = _Counter()
        transposes = TransposeFolder()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.dot_general", counter.fold_broadcast_operand)
            patterns.add("stablehlo.dot_general", transposes.fold_transposed_operand)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return BroadcastFoldReport(counter.folded, transposes.folded)


def _single_use(value: ir.Value) -> bool:
    return len(list(value.uses)) == 1




def _batch_broadcast(value: ir.Value) -> ir.Operation | None:
    """The ``broadcast_in_dim`` behind ``value`` (through identity links,
    every link used once), or None."""
    while True:
        owner = value.owner
        if not isinstance(owner, (ir.OpView, ir.Operation)) or not _single_use(value):
            return None
        operation = owner.operation
        source = operation.operands[0] if len(operation.operands) else None
        if operation.name == "stablehlo.reshape" and source is not None and source.type == value.type:
            value = source
            continue
        if operation.name != "stablehlo.broadcast_in_dim" or source is None:
            return None
        dims = list(ir.DenseI64ArrayAttr(operation.attributes["broadcast_dimensions"]))
        if source.type == value.type and dims == list(range(len(dims))):
            value = source
            continue
        return operation


@dataclasses.dataclass
class _Counter:
    folded: int = 0

    def fold_broadcast_operand(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """One batch-broadcast operand of ``op`` -> the broadcast's source."""
        numbers = _stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        batching = [list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)]
        contracting = [list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions)]
        if not batching[0]:
            return True
        operands = [op.operands[0], op.operands[1]]
        for side in (1, 0):
            other = 1 - side
            broadcast = _batch_broadcast(operands[side])
            if broadcast is None:
                continue
            source = broadcast.operands[0]
            source_shape, target_shape = shape_of(source), shape_of(broadcast.results[0])
            mapping = list(ir.DenseI64ArrayAttr(broadcast.attributes["broadcast_dimensions"]))
            added = set(range(len(target_shape))) - set(mapping)
            if added != set(batching[side]):
                continue
            if any(source_shape[p] != target_shape[d] for p, d in enumerate(mapping)):
                continue  # expands a size-1 dimension: not the same weight per batch
            position = {d: p for p, d in enumerate(mapping)}
            free = [d for d in range(len(target_shape)) if d not in added and d not in contracting[side]]
            if [position[d] for d in free] != sorted(position[d] for d in free):
                continue
            # The other side's batch dims become free dims, ordered by position;
            # the result lists batch dims first, then that side's free dims.
            other_rank = len(shape_of(operands[other]))
            other_free = [d for d in range(other_rank) if d not in contracting[other]]
            expected = batching[other] + [d for d in other_free if d not in batching[other]]
            if other_free != expected:
                continue
            if side == 0 and free:
                continue  # lhs free dims would move in front of the former batch dims
            new_contracting = [contracting[0], contracting[1]]
            new_contracting[side] = [position[d] for d in contracting[side]]
            operands[side] = source
            dims = _stablehlo.DotDimensionNumbers.get(
                lhs_batching_dimensions=[],
                rhs_batching_dimensions=[],
                lhs_contracting_dimensions=new_contracting[0],
                rhs_contracting_dimensions=new_contracting[1],
            )
            attributes = {name: op.attributes[name] for name in op.attributes}
            attributes["dot_dimension_numbers"] = dims
            with rewriter.ip, op.location:
                replacement = ir.Operation.create(
                    "stablehlo.dot_general",
                    results=[op.results[0].type],
                    operands=operands,
                    attributes=attributes,
                )
            rewriter.replace_op(op, replacement.results)
            self.folded += 1
            return False
        return True
