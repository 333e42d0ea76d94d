"""``window-scatter-indices``: a scatter whose per-element indices enumerate
whole slices becomes a windowed scatter with one index per slice.

torch-mlir lowers ``index_copy_``/``index_put_`` to a scatter with no update
window: every updated element gets its own full index vector, built as a
``concatenate`` of one component per operand dimension, each broadcast to
the updates' shape.  For ``cache.index_copy_(1, pos, k)`` into an 8x256x64
cache that is an ``8x1x64x3`` i64 tensor (12 KiB) in XLA's temp, although
only the ``pos`` component varies independently: the others are ``iota``s
(``arange`` over a whole dimension) that enumerate a window.

A component ``c_k`` (for operand dimension ``j_k``) that equals the updates'
coordinate ``u[d]`` (an ``iota``, possibly ``* 1 + 0``, broadcast along
update dimension ``d``) turns ``d`` into an update window dimension over
operand dimension ``j_k``; the remaining components must be constant along
every such ``d`` (broadcast there) and keep one index per slice.  The
rewrite is exact, duplicates and out-of-bounds indices included: element
``u`` is written to the same position in both forms, a window dimension
spans ``[0, n)`` with ``n`` at most the operand's size so it never goes out
of bounds, and the indexed dimensions are the same for every element of a
window, so XLA's skip-out-of-bounds rule drops the same elements.

Never fires when a component is neither such an ``iota`` nor constant along
the window dimensions (a general index tensor, a strided or offset
``arange``), when two components claim the same update dimension, when the
window dimensions would have to be reordered, or when the scatter already
has update windows or batching dimensions."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite
from torch_mlir._mlir_libs import _stablehlo

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import is_arange, producer, shape_of, strip_unit_reshapes


@dataclasses.dataclass(frozen=True)
class WindowScatterReport:
    """How many scatters now take one index per slice."""

    windowed: int

    def to_text(self) -> str:
        """The report as people read it."""
        return f"window-scatter-indices: {self.windowed} scatters take one index per slice"


@dataclasses.dataclass(frozen=True)
class WindowScatterIndices(ModulePass[WindowScatterReport]):
    """Turn per-element scatter indices that enumerate slices into update windows."""

    name: ClassVar[str] = "window-scatter-indices"

    def apply(self, module: ModuleLike) -> WindowScatterReport:
        """Rewrite every eligible scatter in ``module`` in place."""
        module = as_module_like(module)
        verify_contract(module)
        counter = _Counter()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.scatter", counter.window_scatter)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return WindowScatterReport(counter.windowed)


@dataclasses.dataclass(frozen=True)
class IndexComponent:
    """One index component, per element of the updates.  ``arange_dim`` is
    the update dimension it enumerates (None if it does not); ``constant_dims``
    are the update dimensions it does not vary along."""

    value: ir.Value
    arange_dim: int | None
    constant_dims: frozenset[int]


def classify_component(value: ir.Value, rank: int) -> IndexComponent:
    """What is known about the component ``value`` (shape = the updates' or
    a gather's batch shape): an ``iota`` of that shape, or a broadcast."""
    iota = producer(value, "stablehlo.iota")
    if iota is not None:
        dimension = ir.IntegerAttr(iota.attributes["iota_dimension"]).value
        return IndexComponent(value, dimension, frozenset(d for d in range(rank) if d != dimension))
    broadcast = producer(value, "stablehlo.broadcast_in_dim")
    if broadcast is None:
        return IndexComponent(value, None, frozenset())
    source = broadcast.operands[0]
    source_shape = shape_of(source)
    mapping = list(ir.DenseI64ArrayAttr(broadcast.attributes["broadcast_dimensions"]))
    varying = [mapping[p] for p, n in enumerate(source_shape) if n != 1]
    constant = frozenset(d for d in range(rank) if d not in varying)
    if len(varying) == 1 and is_arange(strip_unit_reshapes(source)):
        return IndexComponent(value, varying[0], constant)
    return IndexComponent(value, None, constant)


@dataclasses.dataclass
class _Counter:
    windowed: int = 0

    def window_scatter(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """Per-element ``concatenate`` indices -> update windows plus one index per slice."""
        operation = op.operation
        if len(operation.operands) != 3:
            return True
        numbers = _stablehlo.ScatterDimensionNumbers(operation.attributes["scatter_dimension_numbers"])
        operand_shape = shape_of(operation.operands[0])
        indices, updates = operation.operands[1], operation.operands[2]
        updates_shape = shape_of(updates)
        index_dim = numbers.index_vector_dim
        if (
            list(numbers.update_window_dims)
            or list(numbers.input_batching_dims)
            or sorted(numbers.inserted_window_dims) != list(range(len(operand_shape)))
            or index_dim != len(shape_of(indices)) - 1
        ):
            return True
        concatenate = producer(indices, "stablehlo.concatenate")
        if concatenate is None or ir.IntegerAttr(concatenate.attributes["dimension"]).value != index_dim:
            return True
        components = []
        for part in concatenate.operands:
            reshape = producer(part, "stablehlo.reshape")
            if reshape is None or shape_of(part)[-1] != 1 or shape_of(reshape.operands[0]) != updates_shape:
                return True
            components.append(classify_component(reshape.operands[0], len(updates_shape)))
        operand_dims = list(numbers.scattered_dims_to_operand_dims)
        if len(components) != len(operand_dims):
            return True
        window: dict[int, int] = {}  # update dim -> operand dim
        for component, operand_dim in zip(components, operand_dims):
            d = component.arange_dim
            if d is None or d in window or updates_shape[d] > operand_shape[operand_dim]:
                continue
            window[d] = operand_dim
        indexed = [(c, j) for c, j in zip(components, operand_dims) if c.arange_dim not in window]
        if not window or not indexed:
            return True
        window_dims = sorted(window)
        if [window[d] for d in window_dims] != sorted(window.values()):
            return True  # XLA maps update windows to operand dims in order
        if not all(set(window_dims) <= component.constant_dims for component, _ in indexed):
            return True  # an index varies inside a window: not one index per slice
        batch_shape = [n for d, n in enumerate(updates_shape) if d not in window]
        index_type = ir.RankedTensorType(indices.type).element_type
        with rewriter.ip, operation.location:
            pieces = [first_of_each_window(c.value, window_dims, batch_shape, index_type) for c, _ in indexed]
            new_indices = ir.Operation.create(
                "stablehlo.concatenate",
                results=[ir.RankedTensorType.get([*batch_shape, len(pieces)], index_type)],
                operands=pieces,
                attributes={"dimension": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), len(batch_shape))},
            ).results[0]
            attributes = {name: operation.attributes[name] for name in operation.attributes}
            attributes["scatter_dimension_numbers"] = _stablehlo.ScatterDimensionNumbers.get(
                update_window_dims=window_dims,
                inserted_window_dims=sorted(j for _, j in indexed),
                input_batching_dims=[],
                scatter_indices_batching_dims=[],
                scattered_dims_to_operand_dims=[j for _, j in indexed],
                index_vector_dim=len(batch_shape),
            )
            replacement = ir.Operation.create(
                "stablehlo.scatter",
                results=[result.type for result in operation.results],
                operands=[operation.operands[0], new_indices, updates],
                attributes=attributes,
                regions=1,
            )
            replacement.regions[0].blocks.append(*[a.type for a in operation.regions[0].blocks[0].arguments])
            # Move the update computation over unchanged.
            old_block = operation.regions[0].blocks[0]
            new_block = replacement.regions[0].blocks[0]
            for old, new in zip(old_block.arguments, new_block.arguments):
                old.replace_all_uses_with(new)
            for inner in list(old_block.operations):
                new_block.append(inner.operation)
        rewriter.replace_op(op, replacement.results)
        self.windowed += 1
        return False


def first_of_each_window(
    component: ir.Value, window_dims: list[int], batch_shape: list[int], index_type: ir.Type
) -> ir.Value:
    """``component`` at coordinate 0 of every window dimension, shaped
    ``batch_shape + [1]`` (the component is constant along those dims)."""
    shape = shape_of(component)
    limits = [1 if d in window_dims else n for d, n in enumerate(shape)]
    sliced = ir.Operation.create(
        "stablehlo.slice",
        results=[ir.RankedTensorType.get(limits, index_type)],
        operands=[component],
        attributes={
            "start_indices": ir.DenseI64ArrayAttr.get([0] * len(shape)),
            "limit_indices": ir.DenseI64ArrayAttr.get(limits),
            "strides": ir.DenseI64ArrayAttr.get([1] * len(shape)),
        },
    ).results[0]
    return ir.Operation.create(
        "stablehlo.reshape",
        results=[ir.RankedTensorType.get([*batch_shape, 1], index_type)],
        operands=[sliced],
    ).results[0]
