"""``one-hot-scatter-as-select``: a one-hot matrix scattered into zeros is
a ``select`` over an ``iota``, and a row sum of its product with a per-row
value is that product at the row's one column.

torch's ``nll_loss_backward`` (every cross-entropy loss's backward in a
captured training step) scatters the weight into a zero ``[N, C]`` matrix at
``(i, target_i)`` for each row ``i``, multiplies it by a per-row scale, and
``log_softmax``'s backward sums that product over the classes.  XLA:CPU
computes the scatter into its own ``[N, C]`` buffer, and since it depends
only on the targets, its concurrency-optimized scheduler runs it during the
forward: the one-hot is alive from there to the backward (``f32[256,512]``,
524,288 bytes, on the tiny GPT-2 of ``bench/training.py``), at the peak.
As a ``select(iota == target, u, 0)`` it is elementwise, and with its row sum
written per row (no reduction reads it) XLA fuses it into the one loop that
computes the logits' gradient: no one-hot buffer.

Two rewrites:

- a ``stablehlo.scatter`` of a rank-2 ``[N, C]`` splat-zero operand, with
  an overwrite body, no update window, index vectors ``(i, k_i)`` whose row
  components are ``iota`` over ``N`` (each row once; a ``concatenate`` of an
  ``iota`` and ``k``) and ``[N, 1]`` updates ``u`` becomes ``select(iota_C ==
  k_i, u_i, 0)``.  Exact: XLA skips a scatter index out of bounds, and no
  ``iota`` element equals such a ``k_i`` either;
- a ``reduce`` (init zero, body ``add``) over dimension 1 of ``multiply`` of
  that ``select`` (``u`` broadcast along dimension 1) and a value broadcast
  along dimension 1 (``b``) becomes ``select(0 <= k_i < C, u_i * b_i, 0)``.
  Exact but for the sign of a zero: the reduce adds ``u_i * b_i`` to zero
  products, which changes no non-zero value; a row whose ``u_i * b_i`` is
  ``-0`` sums to ``+0``.  (Where ``b_i`` is infinite or NaN the other
  products are NaN and the reduce's row is NaN, not ``u_i * b_i``: not a
  case a loss's backward has, its scale is ``1 / count`` or zero.)

Never fires on a scatter whose rows are not ``iota`` (a row scattered twice
or not at all), into a non-zero operand, with another body or an update
window, or on another rank; nor on a sum over dimension 0, or of a one-hot
product whose other factor varies along the summed dimension."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite
from torch_mlir._mlir_libs import _stablehlo

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import create, producer, shape_of


@dataclasses.dataclass(frozen=True)
class OneHotReport:
    """How many one-hot scatters became selects and how many row sums of
    one-hot products became per-row selects."""

    scatters: int
    sums: int

    def to_text(self) -> str:
        """The report as people read it."""
        return (f"one-hot-scatter-as-select: {self.scatters} one-hot scatters became selects, "
                f"{self.sums} row sums of them per-row selects")


@dataclasses.dataclass(frozen=True)
class OneHotScatterAsSelect(ModulePass[OneHotReport]):
    """Write one-hot scatters as selects over an iota and their row sums per row."""

    name: ClassVar[str] = "one-hot-scatter-as-select"

    def apply(self, module: ModuleLike) -> OneHotReport:
        """Rewrite every eligible scatter and row sum in ``module`` in place."""
        module = as_module_like(module)
        verify_contract(module)
        counter = _Counter()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.scatter", counter.scatter_as_select)
            patterns.add("stablehlo.reduce", counter.sum_per_row)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return OneHotReport(counter.scatters, counter.sums)


FLOATS = (ir.F32Type, ir.F64Type, ir.BF16Type, ir.F16Type)


def _is_zero_splat(value: ir.Value) -> bool:
    constant = producer(value, "stablehlo.constant")
    if constant is None:
        return False
    attribute = constant.attributes["value"]
    if not isinstance(attribute, ir.DenseFPElementsAttr) or not attribute.is_splat:
        return False
    return float(attribute.get_splat_value().value) == 0.0


def _overwrites(region: ir.Region) -> bool:
    """Whether a scatter body returns its second argument (the update)."""
    blocks = list(region.blocks)
    if len(blocks) != 1 or len(blocks[0].arguments) != 2:
        return False
    ops = list(blocks[0].operations)
    return (len(ops) == 1 and ops[0].operation.name == "stablehlo.return"
            and ops[0].operation.operands[0] == blocks[0].arguments[1])


def _adds(op: ir.Operation) -> bool:
    """Whether a reduce body returns the sum of its two arguments."""
    blocks = list(op.regions[0].blocks)
    if len(blocks) != 1:
        return False
    ops = list(blocks[0].operations)
    if len(ops) != 2 or ops[0].operation.name != "stablehlo.add" or ops[1].operation.name != "stablehlo.return":
        return False
    add = ops[0].operation
    return ({add.operands[0], add.operands[1]} == {blocks[0].arguments[0], blocks[0].arguments[1]}
            and ops[1].operation.operands[0] == add.results[0])


def _is_iota(value: ir.Value, dimension: int) -> bool:
    iota = producer(value, "stablehlo.iota")
    return iota is not None and ir.IntegerAttr(iota.attributes["iota_dimension"]).value == dimension


def _rows(value: ir.Value, rows: int) -> ir.Value | None:
    """``value`` (``[N]``, ``[N, 1]`` or ``[N, 1, 1]``) as a ``[N]`` value
    (reshaped), or None for another shape."""
    shape = shape_of(value)
    if not shape or shape[0] != rows or any(n != 1 for n in shape[1:]):
        return None
    if len(shape) == 1:
        return value
    element = ir.RankedTensorType(value.type).element_type
    return create("stablehlo.reshape", ir.RankedTensorType.get([rows], element), [value])


def _broadcast_rows(value: ir.Value, rows: int) -> ir.Value | None:
    """The ``[N]``/``[N, 1]`` source of ``broadcast_in_dim`` ``value`` when it
    broadcasts along dimension 1 only (constant along it), else None."""
    broadcast = producer(value, "stablehlo.broadcast_in_dim")
    if broadcast is None:
        return None
    source = broadcast.operands[0]
    dims = list(ir.DenseI64ArrayAttr(broadcast.attributes["broadcast_dimensions"]))
    shape = shape_of(source)
    if dims == [0] and shape == [rows]:
        return source
    if dims == [0, 1] and shape == [rows, 1]:
        return source
    return None


@dataclasses.dataclass
class _OneHot:
    """``select(iota_C == broadcast(k), broadcast(u), 0)``: its ``k`` and
    ``u`` as ``[N]`` sources (before any reshape) and its shape."""

    columns: ir.Value
    updates: ir.Value
    shape: list[int]


def _one_hot(value: ir.Value) -> _OneHot | None:
    """``value`` as a one-hot select this pass writes, or None."""
    select = producer(value, "stablehlo.select")
    if select is None:
        return None
    shape = shape_of(value)
    if len(shape) != 2 or not _is_zero_splat(select.operands[2]):
        return None
    compare = producer(select.operands[0], "stablehlo.compare")
    if compare is None or str(_stablehlo.ComparisonDirectionAttr(
            compare.attributes["comparison_direction"]).value) != "EQ":
        return None
    if not _is_iota(compare.operands[0], 1):
        return None
    columns = _broadcast_rows(compare.operands[1], shape[0])
    updates = _broadcast_rows(select.operands[1], shape[0])
    if columns is None or updates is None:
        return None
    return _OneHot(columns, updates, shape)


@dataclasses.dataclass
class _Counter:
    scatters: int = 0
    sums: int = 0

    def scatter_as_select(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """One-hot ``scatter`` into zeros -> ``select`` over an ``iota``."""
        operation = op.operation
        if len(operation.operands) != 3 or len(operation.results) != 1:
            return True
        operand, indices, updates = operation.operands
        shape = shape_of(operand)
        element = ir.RankedTensorType(operand.type).element_type
        if len(shape) != 2 or not isinstance(element, FLOATS) or not _is_zero_splat(operand):
            return True
        if not _overwrites(operation.regions[0]):
            return True
        numbers = _stablehlo.ScatterDimensionNumbers(operation.attributes["scatter_dimension_numbers"])
        if (list(numbers.update_window_dims) or list(numbers.inserted_window_dims) != [0, 1]
                or list(numbers.scattered_dims_to_operand_dims) != [0, 1] or numbers.index_vector_dim != 2
                or list(numbers.input_batching_dims) or list(numbers.scatter_indices_batching_dims)):
            return True
        rows = shape[0]
        if shape_of(indices) != [rows, 1, 2] or shape_of(updates) != [rows, 1]:
            return True
        concatenate = producer(indices, "stablehlo.concatenate")
        if concatenate is None or len(concatenate.operands) != 2:
            return True
        if ir.IntegerAttr(concatenate.attributes["dimension"]).value != 2:
            return True
        if not _is_iota(concatenate.operands[0], 0):
            return True  # rows other than each row once: not a one-hot
        index_type = ir.RankedTensorType(indices.type).element_type
        with rewriter.ip, op.location:
            columns = _rows(concatenate.operands[1], rows)
            values = _rows(updates, rows)
            assert columns is not None and values is not None
            wide_index = ir.RankedTensorType.get(shape, index_type)
            iota = create("stablehlo.iota", wide_index, [], {"iota_dimension": ir.IntegerAttr.get(
                ir.IntegerType.get_signless(64), 1)})
            along = {"broadcast_dimensions": ir.DenseI64ArrayAttr.get([0])}
            spread = create("stablehlo.broadcast_in_dim", wide_index, [columns], along)
            match = create("stablehlo.compare", ir.RankedTensorType.get(shape, ir.IntegerType.get_signless(1)),
                            [iota, spread], {
                                "comparison_direction": _stablehlo.ComparisonDirectionAttr.get("EQ"),
                                "compare_type": _stablehlo.ComparisonTypeAttr.get("SIGNED"),
                            })
            result_type = operation.results[0].type
            wide_values = create("stablehlo.broadcast_in_dim", result_type, [values], along)
            zero = create("stablehlo.constant", result_type, [], {
                "value": ir.DenseElementsAttr.get_splat(result_type, ir.FloatAttr.get(element, 0.0))})
            select = create("stablehlo.select", result_type, [match, wide_values, zero])
        rewriter.replace_op(op, [select])
        self.scatters += 1
        return False

    def sum_per_row(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """Row sum of ``one_hot * broadcast(b)`` -> ``select(in range, u * b, 0)``."""
        operation = op.operation
        if len(operation.operands) != 2 or len(operation.results) != 1:
            return True
        product, init = operation.operands
        if list(ir.DenseI64ArrayAttr(operation.attributes["dimensions"])) != [1]:
            return True
        if not _is_zero_splat(init) or not _adds(operation):
            return True
        multiply = producer(product, "stablehlo.multiply")
        if multiply is None:
            return True
        shape = shape_of(product)
        element = ir.RankedTensorType(product.type).element_type
        if len(shape) != 2 or not isinstance(element, FLOATS):
            return True
        for side in (0, 1):
            one_hot = _one_hot(multiply.operands[side])
            scale = _broadcast_rows(multiply.operands[1 - side], shape[0])
            if one_hot is not None and scale is not None:
                break
        else:
            return True
        rows, classes = shape
        row_type = ir.RankedTensorType.get([rows], element)
        with rewriter.ip, op.location:
            columns = _rows(one_hot.columns, rows)
            values = _rows(one_hot.updates, rows)
            factor = _rows(scale, rows)
            assert columns is not None and values is not None and factor is not None
            index_type = ir.RankedTensorType(columns.type)
            low = create("stablehlo.constant", index_type, [], {
                "value": ir.DenseElementsAttr.get_splat(index_type, ir.IntegerAttr.get(index_type.element_type, 0))})
            high = create("stablehlo.constant", index_type, [], {
                "value": ir.DenseElementsAttr.get_splat(
                    index_type, ir.IntegerAttr.get(index_type.element_type, classes))})
            flag_type = ir.RankedTensorType.get([rows], ir.IntegerType.get_signless(1))
            signed = _stablehlo.ComparisonTypeAttr.get("SIGNED")
            above = create("stablehlo.compare", flag_type, [columns, low], {
                "comparison_direction": _stablehlo.ComparisonDirectionAttr.get("GE"), "compare_type": signed})
            below = create("stablehlo.compare", flag_type, [columns, high], {
                "comparison_direction": _stablehlo.ComparisonDirectionAttr.get("LT"), "compare_type": signed})
            inside = create("stablehlo.and", flag_type, [above, below])
            # The product in the multiply's own operand order (the one-hot's
            # value first where it was first).
            pair = [values, factor] if side == 0 else [factor, values]
            each = create("stablehlo.multiply", row_type, pair)
            zero = create("stablehlo.constant", row_type, [], {
                "value": ir.DenseElementsAttr.get_splat(row_type, ir.FloatAttr.get(element, 0.0))})
            summed = create("stablehlo.select", row_type, [inside, each, zero])
        rewriter.replace_op(op, [summed])
        self.sums += 1
        return False
