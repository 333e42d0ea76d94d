"""``returned-matvec-as-reduce``: a vector-matrix ``dot_general`` whose
result is returned becomes a ``multiply`` + ``reduce`` that XLA:CPU writes
straight into the output buffer.

XLA:CPU lowers a dot with one row (GPT-2's logits, ``[1, 768] x [50257,
768]^T``) to a matrix-vector call that writes into a temporary buffer, then
copies the result into the entry's output buffer through a loop fusion of
bitcasts (``ROOT bitcast_bitcast_fusion = f32[1,1,50257] fusion(dot)``):
201,028 bytes of temp for GPT-2-small's logits; JAX gets the same HLO.  The
same product as ``reduce(multiply(broadcast(x), W), add)`` is a single
fusion that XLA:CPU emits into the output buffer: no temp.

Applies to a float ``dot_general`` where one operand (the vector) has only
size-1 free dimensions and the result reaches ``func.return`` only through
``reshape``s, each used once.  Both operands are broadcast into the
result's dimensions followed by the contracted ones, so the ``reduce``
produces the result's shape itself: a ``reshape`` after it would cost
XLA:CPU the same relayout copy.  Batched products (attention scores of one query, ``q @ cache^T``)
qualify.  Never fires on a matrix-matrix product (the broadcast would be a
full-size product tensor), on integer or complex dots, or on a dot whose
result feeds further computation (there the temp buffer is needed anyway).

Not exact: the reduction sums in an order XLA chooses, not the dot's, so
results may differ in the last bits of f32 (like any change of kernel).
It is therefore an option, not in the default pipeline."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite
from torch_mlir._mlir_libs import _stablehlo

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import shape_of


@dataclasses.dataclass(frozen=True)
class MatvecReport:
    """How many returned vector-matrix dots became multiply + reduce."""

    rewritten: int

    def to_text(self) -> str:
        """The report as people read it."""
        return f"returned-matvec-as-reduce: {self.rewritten} dots became multiply + reduce"


@dataclasses.dataclass(frozen=True)
class ReturnedMatvecAsReduce(ModulePass[MatvecReport]):
    """Turn returned vector-matrix dots into multiply + reduce."""

    name: ClassVar[str] = "returned-matvec-as-reduce"

    def apply(self, module: ModuleLike) -> MatvecReport:
        """Rewrite every eligible ``dot_general`` in ``module`` in place."""
        module = as_module_like(module)
        verify_contract(module)
        counter = _Counter()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.dot_general", counter.as_reduce)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return MatvecReport(counter.rewritten)




def _only_returned(value: ir.Value) -> bool:
    """True when ``value`` reaches ``func.return`` through single-use reshapes only."""
    while True:
        uses = list(value.uses)
        if len(uses) != 1:
            return False
        user = uses[0].owner
        name = user.operation.name if isinstance(user, (ir.OpView, ir.Operation)) else ""
        if name == "func.return":
            return True
        if name != "stablehlo.reshape":
            return False
        value = user.operation.results[0]


@dataclasses.dataclass
class _Counter:
    rewritten: int = 0

    def as_reduce(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """``dot_general(x, W)`` with ``x``'s free dims all 1 -> ``reduce(x * W)``."""
        numbers = _stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        result_type = ir.RankedTensorType(op.results[0].type)
        element = result_type.element_type
        if not isinstance(element, (ir.F32Type, ir.F64Type, ir.BF16Type, ir.F16Type)):
            return True
        operands = [op.operands[0], op.operands[1]]
        if any(ir.RankedTensorType(v.type).element_type != element for v in operands):
            return True
        batching = [list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)]
        contracting = [list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions)]
        shapes = [shape_of(operands[0]), shape_of(operands[1])]
        free = [
            [d for d in range(len(shapes[side])) if d not in batching[side] and d not in contracting[side]]
            for side in (0, 1)
        ]
        if not any(all(shapes[side][d] == 1 for d in free[side]) for side in (0, 1)):
            return True  # matrix-matrix: the product tensor would be huge
        if not _only_returned(op.results[0]):
            return True
        # The product lives in the result's dims followed by the contracted
        # dims, so reducing the trailing dims yields the result directly
        # (a reshape after the reduce costs XLA:CPU a relayout copy).
        rank = len(result_type.shape)
        offsets = [len(batching[0]), len(batching[0]) + len(free[0])]
        mappings = []
        for side in (0, 1):
            mapping = [0] * len(shapes[side])
            for i, d in enumerate(batching[side]):
                mapping[d] = i
            for j, d in enumerate(free[side]):
                mapping[d] = offsets[side] + j
            for i, d in enumerate(contracting[side]):
                mapping[d] = rank + i
            mappings.append(mapping)
        product_shape = list(result_type.shape) + [shapes[0][d] for d in contracting[0]]
        product_type = ir.RankedTensorType.get(product_shape, element)
        with rewriter.ip, op.location:
            spread = [
                _create("stablehlo.broadcast_in_dim", [product_type], [operands[side]],
                        {"broadcast_dimensions": ir.DenseI64ArrayAttr.get(mappings[side])})
                for side in (0, 1)
            ]
            product = _create("stablehlo.multiply", [product_type], spread)
            summed = _reduce_sum(product, list(range(rank, len(product_shape))), list(result_type.shape), element)
        rewriter.replace_op(op, [summed])
        self.rewritten += 1
        return False


def _create(name: str, results: list[ir.Type], operands: list[ir.Value],
            attributes: dict[str, ir.Attribute] | None = None) -> ir.Value:
    return ir.Operation.create(name, results=results, operands=operands, attributes=attributes or {}).results[0]


def _reduce_sum(value: ir.Value, dimensions: list[int], shape: list[int], element: ir.Type) -> ir.Value:
    scalar = ir.RankedTensorType.get([], element)
    zero = _create("stablehlo.constant", [scalar], [], {"value": ir.DenseElementsAttr.get_splat(scalar, ir.FloatAttr.get(element, 0.0))})
    reduce = ir.Operation.create(
        "stablehlo.reduce",
        results=[ir.RankedTensorType.get(shape, element)],
        operands=[value, zero],
        attributes={"dimensions": ir.DenseI64ArrayAttr.get(dimensions)},
        regions=1,
    )
    block = reduce.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        total = _create("stablehlo.add", [scalar], [block.arguments[0], block.arguments[1]])
        ir.Operation.create("stablehlo.return", operands=[total])
    return reduce.results[0]
