"""``accumulate-bf16-dots-in-f32``: a ``dot_general`` of bf16 operands with a
bf16 result produces f32 (``preferred_element_type``), converted to bf16
after it.

XLA:CPU runs a bf16 dot with a bf16 result as an f32 dot: it converts both
operands to f32 first, and schedules every weight's f32 copy ahead of the
dots, all alive at once (4 bf16 Linears of 512x512: temp 4.2 MB for 2.1 MB
of weights).  A dot of bf16 operands whose result is f32 it hands to its
dot library as it is: no converted copy.  The values are those XLA:CPU
computed before (bf16 products are exact in f32, the sum accumulates in
f32 and is rounded to bf16 once), up to the order the library sums in.

Applies to a ``stablehlo.dot_general`` whose operands and result are all
bf16.  Never fires on other element types: XLA:CPU's dot library was
measured to convert f16 operands either way (bench/RESULTS-temp.md), and
f32 dots have nothing to convert."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract


@dataclasses.dataclass(frozen=True)
class AccumulateReport:
    """How many bf16 dots now produce f32."""

    rewritten: int

    def to_text(self) -> str:
        """The report as people read it."""
        return f"accumulate-bf16-dots-in-f32: {self.rewritten} bf16 dots produce f32"


@dataclasses.dataclass(frozen=True)
class AccumulateBf16DotsInF32(ModulePass[AccumulateReport]):
    """Give bf16 ``dot_general``s an f32 result, converted back to bf16."""

    name: ClassVar[str] = "accumulate-bf16-dots-in-f32"

    def apply(self, module: ModuleLike) -> AccumulateReport:
        """Rewrite every all-bf16 ``dot_general`` in ``module`` in place."""
        module = as_module_like(module)
        verify_contract(module)
        rewriter_state = _Rewriter()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.dot_general", rewriter_state.accumulate_in_f32)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return AccumulateReport(rewriter_state.rewritten)


def _is_bf16(value: ir.Value) -> bool:
    return isinstance(ir.RankedTensorType(value.type).element_type, ir.BF16Type)


@dataclasses.dataclass
class _Rewriter:
    rewritten: int = 0

    def accumulate_in_f32(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """An all-bf16 dot -> convert(dot with an f32 result)."""
        if not all(_is_bf16(value) for value in (op.operands[0], op.operands[1], op.results[0])):
            return True
        result_type = ir.RankedTensorType(op.results[0].type)
        wide_type = ir.RankedTensorType.get(list(result_type.shape), ir.F32Type.get())
        attributes = {name: op.attributes[name] for name in op.attributes}
        with rewriter.ip, op.location:
            dot = ir.Operation.create(
                "stablehlo.dot_general", results=[wide_type], operands=[op.operands[0], op.operands[1]],
                attributes=attributes,
            )
            narrow = ir.Operation.create("stablehlo.convert", results=[result_type], operands=[dot.results[0]])
        rewriter.replace_op(op, narrow.results)
        self.rewritten += 1
        return False
