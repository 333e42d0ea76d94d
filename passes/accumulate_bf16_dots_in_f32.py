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
f32 dots have nothing to convert.

Also applies to an f32 ``dot_general`` whose two operands are each a
``stablehlo.convert`` from bf16 (torch-mlir's ``addmm``: a bf16 Linear
with a bias, as Qwen2's q/k/v projections, converts the input and the
transposed weight to f32 and adds the bias in f32): the dot reads the bf16
values themselves and keeps its f32 result.  Exact as above: converting
bf16 to f32 is exact, and the library accumulates the same products in
f32.  A ``transpose`` the convert hid is then folded into the dot's
dimension numbers as ``fold-transpose-into-dot-general`` does (on bf16 dots
with an f32 result only)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.fold_transpose_into_dot_general import TransposeFolder


@dataclasses.dataclass(frozen=True)
class AccumulateReport:
    """How many bf16 dots now produce f32."""

    rewritten: int
    unconverted: int = 0

    def to_text(self) -> str:
        """The report as people read it."""
        return (
            f"accumulate-bf16-dots-in-f32: {self.rewritten} bf16 dots produce f32, "
            f"{self.unconverted} f32 dots read their bf16 operands unconverted"
        )


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
            patterns.add("stablehlo.dot_general", rewriter_state.read_converted_sources)
            patterns.add("stablehlo.dot_general", rewriter_state.fold_exposed_transpose)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return AccumulateReport(rewriter_state.rewritten, rewriter_state.unconverted)


def _is_bf16(value: ir.Value) -> bool:
    return isinstance(ir.RankedTensorType(value.type).element_type, ir.BF16Type)


def _is_f32(value: ir.Value) -> bool:
    return isinstance(ir.RankedTensorType(value.type).element_type, ir.F32Type)


def _bf16_source(value: ir.Value) -> ir.Value | None:
    """The bf16 value ``value`` is a ``convert`` of, else None."""
    producer = value.owner
    if not isinstance(producer, (ir.OpView, ir.Operation)) or producer.name != "stablehlo.convert":
        return None
    source: ir.Value = producer.operands[0]
    return source if _is_bf16(source) else None


@dataclasses.dataclass
class _Rewriter:
    rewritten: int = 0
    unconverted: int = 0
    transposes: TransposeFolder = dataclasses.field(default_factory=TransposeFolder)

    def read_converted_sources(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """dot(convert(a_bf16), convert(b_bf16)) -> f32 -> dot(a_bf16, b_bf16) -> f32."""
        if not all(_is_f32(value) for value in (op.operands[0], op.operands[1], op.results[0])):
            return True
        sources = [_bf16_source(op.operands[0]), _bf16_source(op.operands[1])]
        if sources[0] is None or sources[1] is None:
            return True
        attributes = {name: op.attributes[name] for name in op.attributes}
        with rewriter.ip, op.location:
            dot = ir.Operation.create(
                "stablehlo.dot_general", results=[op.results[0].type], operands=sources, attributes=attributes,
            )
        rewriter.replace_op(op, dot.results)
        self.unconverted += 1
        return False

    def fold_exposed_transpose(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """A transpose feeding a bf16 dot with an f32 result (one the
        convert hid) -> the dot's dimension numbers."""
        if not (_is_bf16(op.operands[0]) and _is_bf16(op.operands[1]) and _is_f32(op.results[0])):
            return True
        return self.transposes.fold_transposed_operand(op, rewriter)

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
