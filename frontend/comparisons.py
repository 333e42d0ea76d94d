"""torch's comparisons in torch-mlir's StableHLO: NaN's order in sorts and
arg-reductions, and comparisons of booleans.

torch-mlir compares booleans (``mask != other``, ``a == b`` of two masks)
with ``compare_type = SIGNED``, which XLA's verifier refuses for ``i1``
(``Expected comparison type UNSIGNED``): the program failed to compile.
:func:`compare_as_torch` makes each such comparison ``UNSIGNED`` (false
below true, as torch orders bools), then orders NaN as below.

torch orders NaN above every number: ``sort`` puts NaNs last (first when
descending) in their original order, ``topk`` returns them as the
largest, and ``argmax``/``argmin``/``max(dim)``/``min(dim)`` return the
first NaN of a slice that has one (NaN propagates through both).
torch-mlir's StableHLO compares the floats with plain ordered
comparisons, under which NaN is neither smaller nor larger than anything:
its sorts and arg-reductions then return an order and indices of XLA's
choosing, silently not eager's (``argmax([1, nan, 3])`` gave 2, eager 1).

:func:`compare_as_torch` rewrites, in a module torch-mlir lowered to
StableHLO (before anything else is spliced in):

- each ``stablehlo.sort`` whose comparator compares its first operand pair
  ``LT``/``GT`` as floats: the comparison also holds NaN above every
  number, and the sort becomes stable (torch's CPU sort keeps equal keys,
  NaNs among them, in their order);
- each two-operand ``stablehlo.reduce`` of a float value and an integer
  index (the arg-reduction torch-mlir emits) whose body compares the two
  values ``GE``/``GT``/``LE``/``LT`` and ``EQ``: a NaN wins, and two NaNs
  are equal (the lower index wins, as for equal values).

Other ops are left alone; a comparison of another shape (not both block
arguments of the pair) is not rewritten.  Ties without NaN keep the
order they had."""

from __future__ import annotations

from collections.abc import Callable

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from hloalias.mlir import walk_ops


def compare_as_torch(module: ir.Module) -> bool:
    """Rewrite ``module``'s boolean comparisons, sorts and arg-reductions
    as the module docstring says; whether anything changed."""
    changed = False
    with module.context:
        for op in list(walk_ops(module.operation)):
            if op.name == "stablehlo.compare":
                changed |= _boolean_compare_unsigned(op)
            elif op.name == "stablehlo.sort":
                changed |= _sort_with_nans_last(op)
            elif op.name == "stablehlo.reduce" and len(op.operands) == 4:
                changed |= _arg_reduction_with_nans(op)
    return changed


def _boolean_compare_unsigned(compare: ir.Operation) -> bool:
    element = ir.RankedTensorType(compare.operands[0].type).element_type
    if not (isinstance(element, ir.IntegerType) and ir.IntegerType(element).width == 1):
        return False
    if "compare_type" in compare.attributes and str(
        _stablehlo.ComparisonTypeAttr(compare.attributes["compare_type"]).value
    ) == "UNSIGNED":
        return False
    compare.attributes["compare_type"] = _stablehlo.ComparisonTypeAttr.get("UNSIGNED")
    return True


def _direction(compare: ir.Operation) -> str:
    return str(_stablehlo.ComparisonDirectionAttr(compare.attributes["comparison_direction"]).value)


def _is_float_compare(compare: ir.Operation) -> bool:
    if "compare_type" in compare.attributes:
        return str(_stablehlo.ComparisonTypeAttr(compare.attributes["compare_type"]).value) == "FLOAT"
    element = ir.RankedTensorType(compare.operands[0].type).element_type
    return isinstance(element, (ir.F16Type, ir.BF16Type, ir.F32Type, ir.F64Type))


def _compare(lhs: ir.Value, rhs: ir.Value, direction: str) -> ir.Value:
    flag = ir.RankedTensorType.get([], ir.IntegerType.get_signless(1))
    return ir.Operation.create(
        "stablehlo.compare", results=[flag], operands=[lhs, rhs],
        attributes={
            "comparison_direction": _stablehlo.ComparisonDirectionAttr.get(direction),
            "compare_type": _stablehlo.ComparisonTypeAttr.get("FLOAT"),
        },
    ).results[0]


def _logical(name: str, lhs: ir.Value, rhs: ir.Value) -> ir.Value:
    return ir.Operation.create(name, results=[lhs.type], operands=[lhs, rhs]).results[0]


def _replace(compare: ir.Operation, build: Callable[[ir.Value, ir.Value, str], ir.Value]) -> None:
    """Replace ``compare``'s result by ``build(lhs, rhs)``, made before it."""
    with compare.location, ir.InsertionPoint(compare):
        replacement = build(compare.operands[0], compare.operands[1], _direction(compare))
    compare.results[0].replace_all_uses_with(replacement)
    compare.erase()


def _nan_above(lhs: ir.Value, rhs: ir.Value, direction: str) -> ir.Value:
    """``lhs`` before ``rhs`` in torch's order, NaN above every number:
    ``LT``/``LE``: lhs < rhs, or rhs is NaN and lhs is not (``LE``: or
    both are NaN); ``GT``/``GE`` mirrored."""
    plain = _compare(lhs, rhs, direction)
    high, low = (rhs, lhs) if direction in ("LT", "LE") else (lhs, rhs)
    high_nan = _compare(high, high, "NE")
    if direction in ("LE", "GE"):
        return _logical("stablehlo.or", plain, high_nan)
    low_number = _compare(low, low, "EQ")
    return _logical("stablehlo.or", plain, _logical("stablehlo.and", high_nan, low_number))


def _nan_wins(lhs: ir.Value, rhs: ir.Value, direction: str) -> ir.Value:
    """An arg-reduction's step: ``lhs`` wins when the plain comparison
    says so or when it is NaN and ``rhs`` is not (``GE``/``LE``: or both
    are); ``EQ``: equal, or both NaN."""
    plain = _compare(lhs, rhs, direction)
    lhs_nan = _compare(lhs, lhs, "NE")
    if direction == "EQ":
        return _logical("stablehlo.or", plain, _logical("stablehlo.and", lhs_nan, _compare(rhs, rhs, "NE")))
    if direction in ("GE", "LE"):
        return _logical("stablehlo.or", plain, lhs_nan)
    return _logical("stablehlo.or", plain, _logical("stablehlo.and", lhs_nan, _compare(rhs, rhs, "EQ")))


def _block(op: ir.Operation) -> ir.Block | None:
    regions = list(op.regions)
    if len(regions) != 1:
        return None
    blocks = list(regions[0].blocks)
    return blocks[0] if len(blocks) == 1 else None


def _on_arguments(compare: ir.Operation, block: ir.Block, lhs: int, rhs: int) -> bool:
    operands = list(compare.operands)
    arguments = list(block.arguments)
    return len(operands) == 2 and operands[0] == arguments[lhs] and operands[1] == arguments[rhs]


def _sort_with_nans_last(sort: ir.Operation) -> bool:
    block = _block(sort)
    if block is None or len(list(block.arguments)) < 2:
        return False
    compares = [
        op.operation for op in block.operations
        if op.operation.name == "stablehlo.compare" and _is_float_compare(op.operation)
        and _direction(op.operation) in ("LT", "GT") and _on_arguments(op.operation, block, 0, 1)
    ]
    if not compares:
        return False
    for compare in compares:
        _replace(compare, _nan_above)
    sort.attributes["is_stable"] = ir.BoolAttr.get(True)
    return True


def _arg_reduction_with_nans(reduce: ir.Operation) -> bool:
    block = _block(reduce)
    if block is None or len(list(block.arguments)) != 4:
        return False
    value_type = ir.RankedTensorType(block.arguments[0].type).element_type
    index_type = ir.RankedTensorType(block.arguments[1].type).element_type
    if not isinstance(value_type, (ir.F16Type, ir.BF16Type, ir.F32Type, ir.F64Type)):
        return False
    if not isinstance(index_type, ir.IntegerType):
        return False
    # The pair's block arguments are (value, index) of the accumulator,
    # then of the element: the values are arguments 0 and 2.
    compares = [
        op.operation for op in block.operations
        if op.operation.name == "stablehlo.compare" and _is_float_compare(op.operation)
        and _direction(op.operation) in ("GE", "GT", "LE", "LT", "EQ") and _on_arguments(op.operation, block, 0, 2)
    ]
    if not any(_direction(compare) != "EQ" for compare in compares):
        return False
    for compare in compares:
        _replace(compare, _nan_wins)
    return True
