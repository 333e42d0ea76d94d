"""``scatter-to-dynamic-update-slice``: an overwrite-only ``stablehlo.scatter``
that writes one window becomes a ``stablehlo.dynamic_update_slice``.

torch-mlir lowers ``cache[:, p:p+1].copy_(new)`` (``slice_scatter``) to a
scatter with one index vector, and ``cache.index_copy_(1, pos, new)`` with a
one-element ``pos`` (HF ``StaticCache`` on every decode step of every layer)
becomes one after ``window-scatter-indices``.  A dynamic-update-slice of the
window is an in-place copy that XLA needs no temp for (XLA's own expansion
of the dynamic-index scatter kept 65 bytes; 16x4096x256 f32 cache, one
position per call: 0.030 -> 0.024 ms of XLA execution, see ``README.md``).

Applies to a single-operand scatter with static shapes whose region is
exactly ``^bb0(%old, %new): return %new``, without batching dimensions,
whose index tensor holds exactly one index vector (every dimension but
``index_vector_dim`` has size 1), whose signless-integer index vector names
each operand dimension at most once, whose updates are not empty and whose
window fits in the operand.  The window covers the
``update_window_dims`` (mapped in order to the operand dimensions that are
not ``inserted_window_dims``) and size 1 on the inserted ones, so the
updates reshape to it element for element.

Semantics are scatter's, exactly: XLA skips a window that does not fit
(``start < 0`` or ``start > size - window`` in any dimension) while a
dynamic-update-slice clamps its start.  An index vector that is a constant
in bounds gives the plain ``dynamic_update_slice``; any other gives
``dynamic_update_slice(x, select(in_bounds, update, dynamic_slice(x, s)), s)``:
out of bounds, the window read at the clamped start is written back
unchanged.  A constant out-of-bounds index is left alone.

Never fires on several index vectors (their order and duplicates matter),
on a combiner that computes (``add``, ``max``, ...) or returns the old
value, on variadic scatters, batching dimensions, dynamic shapes, or
indices that are not i32/i64, and scatters that index no dimension."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from torch_mlir import ir, rewrite
from torch_mlir._mlir_libs import _stablehlo

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import constant_integers, create, shape_of
from hloalias.passes.bitcast_overwrite_scatter import is_overwrite_region


@dataclasses.dataclass(frozen=True)
class ScatterToUpdateSliceReport:
    """How many scatters became dynamic-update-slices, and how many of those
    needed the out-of-bounds guard (an index not known to be in bounds)."""

    rewritten: int
    guarded: int

    def to_text(self) -> str:
        """The report as people read it."""
        return (
            f"scatter-to-dynamic-update-slice: {self.rewritten} scatters are dynamic-update-slices"
            f" ({self.guarded} guarded against out-of-bounds indices)"
        )


@dataclasses.dataclass(frozen=True)
class ScatterToDynamicUpdateSlice(ModulePass[ScatterToUpdateSliceReport]):
    """Rewrite one-window overwrite scatters as dynamic-update-slices."""

    name: ClassVar[str] = "scatter-to-dynamic-update-slice"

    def apply(self, module: ModuleLike) -> ScatterToUpdateSliceReport:
        """Rewrite every eligible scatter in ``module`` in place."""
        module = as_module_like(module)
        verify_contract(module)
        counter = _Counter()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.scatter", counter.rewrite_scatter)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return ScatterToUpdateSliceReport(counter.rewritten, counter.guarded)






@dataclasses.dataclass(frozen=True)
class _Window:
    """One scatter window: ``components[k]`` of the index vector is the
    start in operand dimension ``operand_dims[k]``; ``sizes`` per operand dim."""

    operand_dims: list[int]
    sizes: list[int]


def _single_window(operation: ir.Operation) -> _Window | None:
    """The window of a one-index-vector, overwrite-only scatter, or None."""
    if len(operation.operands) != 3 or len(operation.results) != 1:
        return None
    operand, indices, updates = operation.operands
    if not all(isinstance(v.type, ir.RankedTensorType) for v in (operand, indices, updates)):
        return None
    types = [ir.RankedTensorType(v.type) for v in (operand, indices, updates)]
    if not all(t.has_static_shape for t in types) or types[2].element_type != types[0].element_type:
        return None
    index_type = types[1].element_type
    if not isinstance(index_type, ir.IntegerType) or not index_type.is_signless or index_type.width not in (32, 64):
        return None
    if any(n >= 2 ** (index_type.width - 1) for n in types[0].shape):
        return None  # the bounds would not fit the index type
    if not is_overwrite_region(operation.regions[0]):
        return None
    numbers = _stablehlo.ScatterDimensionNumbers(operation.attributes["scatter_dimension_numbers"])
    if list(numbers.input_batching_dims) or list(numbers.scatter_indices_batching_dims):
        return None
    operand_shape, indices_shape, updates_shape = shape_of(operand), shape_of(indices), shape_of(updates)
    index_dim = numbers.index_vector_dim
    if any(n != 1 for d, n in enumerate(indices_shape) if d != index_dim):
        return None  # zero or several index vectors
    operand_dims = list(numbers.scattered_dims_to_operand_dims)
    component_count = indices_shape[index_dim] if index_dim < len(indices_shape) else 1
    if not operand_dims or len(operand_dims) != component_count or len(set(operand_dims)) != len(operand_dims):
        return None
    if not all(0 <= d < len(operand_shape) for d in operand_dims):
        return None
    window_dims = list(numbers.update_window_dims)
    inserted = set(numbers.inserted_window_dims)
    kept = [d for d in range(len(operand_shape)) if d not in inserted]
    if len(kept) != len(window_dims) or window_dims != sorted(window_dims):
        return None
    if any(n != 1 for d, n in enumerate(updates_shape) if d not in window_dims):
        return None
    sizes = [1] * len(operand_shape)
    for operand_dim, update_dim in zip(kept, window_dims):
        sizes[operand_dim] = updates_shape[update_dim]
    if math.prod(sizes) == 0 or any(w > n for w, n in zip(sizes, operand_shape)):
        return None
    return _Window(operand_dims, sizes)


@dataclasses.dataclass
class _Counter:
    rewritten: int = 0
    guarded: int = 0

    def rewrite_scatter(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """One-window ``scatter`` -> ``dynamic_update_slice`` (guarded unless provably in bounds)."""
        operation = op.operation
        window = _single_window(operation)
        if window is None:
            return True
        operand, indices, updates = operation.operands
        operand_shape = shape_of(operand)
        index_type = ir.RankedTensorType(indices.type).element_type
        constant = constant_integers(indices)
        in_bounds = constant is not None and all(
            0 <= start <= operand_shape[d] - window.sizes[d] for start, d in zip(constant, window.operand_dims)
        )
        if constant is not None and not in_bounds:
            return True  # XLA skips the write; leave that to the scatter
        scalar = ir.RankedTensorType.get([], index_type)
        with rewriter.ip, operation.location:
            window_type = ir.RankedTensorType.get(window.sizes, ir.RankedTensorType(operand.type).element_type)
            update = updates if updates.type == window_type else create("stablehlo.reshape", window_type, [updates])
            if constant is not None:
                components = {d: _scalar_constant(scalar, v) for d, v in zip(window.operand_dims, constant)}
            else:
                flat = create("stablehlo.reshape", ir.RankedTensorType.get([len(window.operand_dims)], index_type), [indices])
                components = {d: _component(flat, k, index_type) for k, d in enumerate(window.operand_dims)}
            zero = None
            starts = []
            for d in range(len(operand_shape)):
                if d not in components:
                    zero = zero if zero is not None else _scalar_constant(scalar, 0)
                starts.append(components.get(d, zero))
            if constant is None:
                fits = _window_fits(components, operand_shape, window.sizes, scalar)
                old = ir.Operation.create(
                    "stablehlo.dynamic_slice",
                    results=[window_type],
                    operands=[operand, *starts],
                    attributes={"slice_sizes": ir.DenseI64ArrayAttr.get(window.sizes)},
                ).results[0]
                update = create("stablehlo.select", window_type, [fits, update, old])
            result = create("stablehlo.dynamic_update_slice", operation.results[0].type, [operand, update, *starts])
        rewriter.replace_op(op, [result])
        self.rewritten += 1
        self.guarded += constant is None
        return False


def _scalar_constant(scalar: ir.RankedTensorType, value: int) -> ir.Value:
    attribute = ir.DenseElementsAttr.get_splat(scalar, ir.IntegerAttr.get(scalar.element_type, value))
    return ir.Operation.create("stablehlo.constant", results=[scalar], attributes={"value": attribute}).results[0]


def _component(flat: ir.Value, k: int, index_type: ir.Type) -> ir.Value:
    """Element ``k`` of the rank-1 ``flat`` as a scalar."""
    piece = ir.Operation.create(
        "stablehlo.slice",
        results=[ir.RankedTensorType.get([1], index_type)],
        operands=[flat],
        attributes={
            "start_indices": ir.DenseI64ArrayAttr.get([k]),
            "limit_indices": ir.DenseI64ArrayAttr.get([k + 1]),
            "strides": ir.DenseI64ArrayAttr.get([1]),
        },
    ).results[0]
    return create("stablehlo.reshape", ir.RankedTensorType.get([], index_type), [piece])


def _compare(direction: str, lhs: ir.Value, rhs: ir.Value) -> ir.Value:
    return ir.Operation.create(
        "stablehlo.compare",
        results=[ir.RankedTensorType.get([], ir.IntegerType.get_signless(1))],
        operands=[lhs, rhs],
        attributes={
            "comparison_direction": ir.Attribute.parse(f"#stablehlo<comparison_direction {direction}>"),
            "compare_type": ir.Attribute.parse("#stablehlo<comparison_type SIGNED>"),
        },
    ).results[0]


def _window_fits(
    components: dict[int, ir.Value], operand_shape: list[int], sizes: list[int], scalar: ir.RankedTensorType
) -> ir.Value:
    """``0 <= start[d] <= size[d] - window[d]`` for every indexed ``d``: XLA's
    condition for writing a scatter window at all (a scalar ``i1``)."""
    zero = _scalar_constant(scalar, 0)
    fits: ir.Value | None = None
    for d, start in sorted(components.items()):
        limit = _scalar_constant(scalar, operand_shape[d] - sizes[d])
        both = create(
            "stablehlo.and",
            ir.RankedTensorType.get([], ir.IntegerType.get_signless(1)),
            [_compare("GE", start, zero), _compare("LE", start, limit)],
        )
        fits = both if fits is None else create("stablehlo.and", both.type, [fits, both])
    assert fits is not None  # a scatter names at least one operand dimension here
    return fits
