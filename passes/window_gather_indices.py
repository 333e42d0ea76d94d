"""``window-gather-indices``: a gather whose per-element indices enumerate
whole slices along some dimensions becomes a gather with slice windows
there and one index per slice.

torch-mlir lowers ``torch.gather(x, d, index)`` to a gather of single
elements: every result element gets its own full index vector, a
``concatenate`` of one component per operand dimension, where each
dimension other than ``d`` is an ``iota`` over the result.  For
DeBERTa-v2's relative-position attention (``torch.gather`` of the c2p/p2c
scores along the last dimension, batch x heads = 8, 64 x 64 positions) that
is an s64[8,64,64,3] tensor (768 KiB) in XLA's temp per gather, although
the position index does not vary along the batch-head dimension.

A component for operand dimension ``j`` that equals the result's coordinate
``r[d]`` (an ``iota`` along result dimension ``d``, or an ``arange``
broadcast along it) turns ``d`` into an offset (slice window) dimension
over ``j``, provided every component left as an index is constant along
``d``; windows along which a remaining index varies are dropped until that
holds.  The rewrite is exact: each result element reads the same operand
element.  A window spans ``[0, n)`` with ``n`` at most the operand's size
(never clamped), and every remaining index keeps a slice size of 1, so
XLA's clamping of start indices moves it exactly as before.

Never fires on a gather that already has slice windows, batching
dimensions, an index vector that is not the last index dimension, or no
component left to index; nor when the window dimensions would have to be
reordered (XLA maps offset dimensions to operand dimensions in order)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite
from torch_mlir._mlir_libs import _stablehlo

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import producer, shape_of
from hloalias.passes.window_scatter_indices import IndexComponent, classify_component, first_of_each_window


@dataclasses.dataclass(frozen=True)
class WindowGatherReport:
    """How many gathers now take one index per slice."""

    windowed: int

    def to_text(self) -> str:
        """The report as people read it."""
        return f"window-gather-indices: {self.windowed} gathers take one index per slice"


@dataclasses.dataclass(frozen=True)
class WindowGatherIndices(ModulePass[WindowGatherReport]):
    """Turn per-element gather indices that enumerate slices into slice windows."""

    name: ClassVar[str] = "window-gather-indices"

    def apply(self, module: ModuleLike) -> WindowGatherReport:
        """Rewrite every eligible gather in ``module`` in place."""
        module = as_module_like(module)
        verify_contract(module)
        counter = _Counter()
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.gather", counter.window_gather)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return WindowGatherReport(counter.windowed)


def _component(part: ir.Value, batch_shape: list[int]) -> IndexComponent | None:
    """The component one ``concatenate`` operand (shape ``batch + [1]``)
    holds, classified over the batch shape; None when it is not of that form."""
    if shape_of(part) != [*batch_shape, 1]:
        return None
    iota = producer(part, "stablehlo.iota")
    if iota is not None and ir.IntegerAttr(iota.attributes["iota_dimension"]).value < len(batch_shape):
        return classify_component(part, len(batch_shape))
    reshape = producer(part, "stablehlo.reshape")
    if reshape is None or shape_of(reshape.operands[0]) != batch_shape:
        return None
    return classify_component(reshape.operands[0], len(batch_shape))


def _windows(components: list[IndexComponent], operand_dims: list[int], batch_shape: list[int],
             operand_shape: list[int]) -> dict[int, int]:
    """Result dim -> operand dim for every window the components allow: an
    ``arange`` component in bounds, with every indexed component constant
    along it (a window an index varies along is dropped, which turns its
    own component into an index too)."""
    window: dict[int, int] = {}
    for component, operand_dim in zip(components, operand_dims):
        d = component.arange_dim
        if d is None or d in window or batch_shape[d] > operand_shape[operand_dim]:
            continue
        window[d] = operand_dim
    while True:
        owner = {d: k for k, (c, j) in enumerate(zip(components, operand_dims)) for d in window
                 if c.arange_dim == d and window[d] == j}
        indexed = [c for k, c in enumerate(components) if k not in owner.values()]
        varying = {d for d in window if not all(d in c.constant_dims for c in indexed)}
        if not varying:
            return window
        for d in varying:
            del window[d]


@dataclasses.dataclass
class _Counter:
    windowed: int = 0

    def window_gather(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """Per-element ``concatenate`` indices -> slice windows plus one index per slice."""
        operation = op.operation
        numbers = _stablehlo.GatherDimensionNumbers(operation.attributes["dimension_numbers"])
        operand, indices = operation.operands[0], operation.operands[1]
        operand_shape = shape_of(operand)
        index_shape = shape_of(indices)
        slice_sizes = list(ir.DenseI64ArrayAttr(operation.attributes["slice_sizes"]))
        if (
            list(numbers.offset_dims)
            or list(numbers.operand_batching_dims)
            or sorted(numbers.collapsed_slice_dims) != list(range(len(operand_shape)))
            or any(size != 1 for size in slice_sizes)
            or numbers.index_vector_dim != len(index_shape) - 1
            or not ir.RankedTensorType(indices.type).has_static_shape
        ):
            return True
        concatenate = producer(indices, "stablehlo.concatenate")
        if concatenate is None or ir.IntegerAttr(concatenate.attributes["dimension"]).value != len(index_shape) - 1:
            return True
        batch_shape = index_shape[:-1]
        components = []
        for part in concatenate.operands:
            component = _component(part, batch_shape)
            if component is None:
                return True
            components.append(component)
        operand_dims = list(numbers.start_index_map)
        if len(components) != len(operand_dims):
            return True
        window = _windows(components, operand_dims, batch_shape, operand_shape)
        windowed = {k for k, (c, j) in enumerate(zip(components, operand_dims))
                    if c.arange_dim in window and window[c.arange_dim] == j}
        indexed = [(c, j) for k, (c, j) in enumerate(zip(components, operand_dims)) if k not in windowed]
        if not window or not indexed:
            return True
        window_dims = sorted(window)
        if [window[d] for d in window_dims] != sorted(window.values()):
            return True  # XLA maps offset dims to operand dims in order
        rest_shape = [n for d, n in enumerate(batch_shape) if d not in window]
        index_type = ir.RankedTensorType(indices.type).element_type
        with rewriter.ip, operation.location:
            pieces = [first_of_each_window(c.value, window_dims, rest_shape, index_type) for c, _ in indexed]
            new_indices = ir.Operation.create(
                "stablehlo.concatenate",
                results=[ir.RankedTensorType.get([*rest_shape, len(pieces)], index_type)],
                operands=pieces,
                attributes={"dimension": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), len(rest_shape))},
            ).results[0]
            attributes = {name: operation.attributes[name] for name in operation.attributes}
            window_operand_dims = set(window.values())
            attributes["dimension_numbers"] = _stablehlo.GatherDimensionNumbers.get(
                offset_dims=window_dims,
                collapsed_slice_dims=[j for j in range(len(operand_shape)) if j not in window_operand_dims],
                operand_batching_dims=[],
                start_indices_batching_dims=[],
                start_index_map=[j for _, j in indexed],
                index_vector_dim=len(rest_shape),
            )
            sizes = [1] * len(operand_shape)
            for d, j in window.items():
                sizes[j] = batch_shape[d]
            attributes["slice_sizes"] = ir.DenseI64ArrayAttr.get(sizes)
            replacement = ir.Operation.create(
                "stablehlo.gather",
                results=[operation.results[0].type],
                operands=[operand, new_indices],
                attributes=attributes,
            )
        rewriter.replace_op(op, replacement.results)
        self.windowed += 1
        return False
