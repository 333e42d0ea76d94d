"""``fold-repeat-into-dot-general``: a ``dot_general`` operand that repeats
a tensor along a batching dimension (grouped-query attention's K and V) is
replaced by the tensor itself, the repeat becoming a free dimension of the
other operand.

Hugging Face's ``repeat_kv`` expands K and V from the KV heads to all heads
(``reshape`` to ``[B, Hkv, 1, L, D]``, ``broadcast_in_dim`` to
``[B, Hkv, G, L, D]``, ``reshape`` to ``[B, Hkv*G, L, D]``), attention then
transposes K and, under SDPA, scales it; torch-mlir merges ``B*H`` into one
batching dimension of each ``dot_general``.  XLA:CPU materializes the
repeated, transposed, scaled K and the repeated V in temp on every call:
two copies of the whole cache per layer, growing with the context.

Each value ``X`` of such a chain (``reshape``, ``transpose``,
``broadcast_in_dim``, ``multiply`` by a splat, ``convert`` between float
types) is described from its source
``S``: every dimension of ``X`` is a row-major group of ``S``'s dimensions
(size-1 dimensions dropped) and of *repeat* axes the broadcasts added.  A
dot whose operand ``X`` has repeat axes only inside batching dimensions
becomes ``dot_general(Y', S')``: ``S'`` is ``S`` without its size-1
dimensions, ``Y'`` the other operand with each batching and contracting
dimension split into its group's sizes; the non-repeat axes pair as batching
and contracting dimensions, and each repeat axis is a free dimension of
``Y'`` (every repetition reads the same ``S`` element, so the values are the
same).  The new result is reshaped to the old one, which requires its
dimensions, flattened in row-major order, to be the old result's: the pass
checks this and otherwise leaves the dot alone (e.g. the repeated operand on
the left with free dimensions of its own).  The reshapes are of ``S`` and of
the other operand only; neither copies on XLA.

A ``multiply`` by a splat inside the chain (SDPA's ``sqrt(scale)`` on K)
moves onto the dot's result: the repeat and transposition removal is exact,
the moved scale is exact when the splat is a power of two and otherwise
rounds the sum of products once instead of each product (as torch's fused
CPU attention kernel, which scales ``q @ k^T``).  ``exact-scales-only``
(the default) moves only power-of-two scales; any other scale is applied
to the unrepeated source instead (the dot reads ``S * c``, one copy of
``S``, no repeat and no transpose: exact, since a splat multiply commutes
with the chain's reshapes, transposes and repeats).  Where that scaled copy
has one free dimension and is larger than ``chunk-bytes`` (when not 0,
the default; the CPU pipeline sets 256 KiB) and than the dot's result (a decode step's K cache, not a prefill's, whose scores are
larger), it is scaled and read in equal chunks of a multiple of 256
positions along that dimension: the first chunk's dot before a
``stablehlo.while`` over the others, each writing its part of the result
(the same products of the same scaled elements; one chunk's copy alive).
``exact-scales-only=false`` moves those onto the result too.  Only
floating-point multiplies of the dot's result element type move.  A chain
with a ``convert`` (torch's SDPA math upcasting bf16 K and V to f32) has
the convert and every scale applied to the source in the chain's order
(exact, with either option), never in chunks: XLA:CPU hoists the convert
of the loop's carried source out of the loop.

Never fires on a dot without a repeated operand (``fold-broadcast-into-dot-
general`` handles a weight broadcast over whole batching dimensions), when
the repeat axis is in a contracting or free dimension, when a reshape in
the chain splits one of ``S``'s dimensions, or when ``S`` is written by a
one-row ``dynamic_update_slice`` (a decode step's cache write): XLA:CPU
would duplicate that write into the reshape the new dot reads, copying the
cache twice; ``widen-one-row-updates``, before this pass in the default
pipeline, makes such writes two-row ones, which it keeps in place."""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Callable, ClassVar

from torch_mlir import ir, rewrite
from torch_mlir._mlir_libs import _stablehlo

from hloalias.errors import PassError
from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import shape_of

_CHAIN_OPS = (
    "stablehlo.reshape", "stablehlo.transpose", "stablehlo.broadcast_in_dim", "stablehlo.multiply", "stablehlo.convert",
)


@dataclasses.dataclass(frozen=True)
class RepeatFoldReport:
    """How many dots lost a repeated operand, and how many scales moved."""

    folded: int
    scales_moved: int
    scales_on_source: int = 0
    chunked: int = 0

    def to_text(self) -> str:
        """The report as people read it."""
        return (
            f"fold-repeat-into-dot-general: {self.folded} repeated operands folded, "
            f"{self.scales_moved} scales moved onto dot results, {self.scales_on_source} onto the unrepeated source, "
            f"{self.chunked} dots over a scaled source in chunks"
        )


@dataclasses.dataclass(frozen=True)
class FoldRepeatIntoDotGeneral(ModulePass[RepeatFoldReport]):
    """Feed the source of a batch-repeated operand (GQA's K/V) to ``dot_general``."""

    name: ClassVar[str] = "fold-repeat-into-dot-general"
    # Exact by default, as every rewrite of the default pipeline is: moving
    # another scale changes the last bits of the scores (closer to torch's
    # fused CPU attention, but not what the unrewritten program computes).
    exact_scales_only: bool = dataclasses.field(
        default=True,
        metadata={"help": "move only power-of-two splat scales onto the result and apply others to the "
                          "unrepeated source (bit-exact; default); false moves every scale, rounding the "
                          "scores once (as torch's fused CPU attention)"},
    )
    # The scaled source is a copy of a layer's K cache, growing with the
    # context; in chunks only one chunk of it is alive at a time.
    # 0 by default: the chunks' exactness is measured on XLA:CPU's dot
    # kernel only; the CPU pipeline sets 262144 (256 KiB).
    chunk_bytes: int = dataclasses.field(
        default=0,
        metadata={"help": "a scaled source larger than this and than the dot's result is scaled and read in "
                          "chunks of at most this many bytes along its free dimension, in a while loop (same "
                          "values on XLA:CPU); 0 never chunks (the default)"},
    )

    def __post_init__(self) -> None:
        if self.chunk_bytes < 0:
            raise PassError(f"{self.name}: option 'chunk-bytes' must be >= 0, got {self.chunk_bytes}")

    def apply(self, module: ModuleLike) -> RepeatFoldReport:
        """Rewrite every foldable ``dot_general`` in ``module`` in place;
        chain links left without users are erased."""
        module = as_module_like(module)
        verify_contract(module)
        folder = _RepeatFolder(self.exact_scales_only, self.chunk_bytes)
        with module.context, ir.Location.unknown():
            patterns = rewrite.RewritePatternSet()
            patterns.add("stablehlo.dot_general", folder.fold_repeated_operand)
            rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())
        verify_contract(module)
        return RepeatFoldReport(folder.folded, folder.scales_moved, folder.scales_on_source, folder.chunked)


@dataclasses.dataclass(frozen=True)
class _Axis:
    """One dimension of the chain's source (``repeat`` False) or one a
    broadcast added (``repeat`` True)."""

    ident: int
    size: int
    repeat: bool


@dataclasses.dataclass
class _Chain:
    """``X`` described from its source: one group of axes per dimension."""

    source: ir.Value
    source_axes: list[_Axis]
    groups: list[list[_Axis]]
    scales: list[ir.Operation]
    # Float converts of the chain (bf16 K/V upcast for f32 attention).
    converts: list[ir.Operation] = dataclasses.field(default_factory=list)
    # Splat multiplies and converts applied to the source instead, in the
    # chain's order (farthest first): exact, as an elementwise op commutes
    # with the chain's reshapes, transposes and repeats; the dot then reads
    # the scaled (converted) source, one unrepeated copy.
    source_scales: list[ir.Operation] = dataclasses.field(default_factory=list)


def _operation(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    if isinstance(owner, (ir.OpView, ir.Operation)):
        return owner.operation
    return None


def _splat_operand(multiply: ir.Operation) -> int | None:
    """Which operand of ``multiply`` is a splat (a ``broadcast_in_dim`` of a
    rank-0 value, or a splat constant), or None."""
    for index in (1, 0):
        defining = _operation(multiply.operands[index])
        if defining is None:
            continue
        if defining.name == "stablehlo.broadcast_in_dim" and not shape_of(defining.operands[0]):
            return index
        if defining.name == "stablehlo.constant":
            attribute = defining.attributes["value"]
            if isinstance(attribute, ir.DenseElementsAttr) and attribute.is_splat:
                return index
    return None


def _chain_links(value: ir.Value) -> list[ir.Operation]:
    """The chain ops behind ``value``, nearest first."""
    links: list[ir.Operation] = []
    while True:
        operation = _operation(value)
        if operation is None or operation.name not in _CHAIN_OPS:
            return links
        if operation.name == "stablehlo.multiply":
            splat = _splat_operand(operation)
            if splat is None or not isinstance(ir.RankedTensorType(value.type).element_type, ir.FloatType):
                return links
            links.append(operation)
            value = operation.operands[1 - splat]
            continue
        if operation.name == "stablehlo.convert" and not all(
            isinstance(ir.RankedTensorType(v.type).element_type, ir.FloatType)
            for v in (operation.operands[0], operation.results[0])
        ):
            return links
        links.append(operation)
        value = operation.operands[0]


def _chain_input(link: ir.Operation) -> ir.Value:
    if link.name == "stablehlo.multiply":
        splat = _splat_operand(link)
        assert splat is not None
        return link.operands[1 - splat]
    return link.operands[0]


def _regroup(axes: list[_Axis], shape: list[int]) -> list[list[_Axis]] | None:
    """Row-major ``axes`` grouped into dimensions of ``shape``, or None when
    a dimension would split an axis."""
    axes = [axis for axis in axes if axis.size != 1]
    groups: list[list[_Axis]] = []
    position = 0
    for size in shape:
        group: list[_Axis] = []
        product = 1
        while product < size and position < len(axes):
            group.append(axes[position])
            product *= axes[position].size
            position += 1
        if product != size:
            return None
        groups.append(group)
    return groups if position == len(axes) else None


def _describe(source: ir.Value, links: list[ir.Operation]) -> _Chain | None:
    """``links`` (farthest first, the first one reading ``source``) as groups
    of ``source``'s axes, or None when a link splits an axis."""
    counter = iter(range(1 << 30))
    source_axes = [_Axis(next(counter), size, False) for size in shape_of(source)]
    groups = _regroup(source_axes, shape_of(source))
    scales: list[ir.Operation] = []
    elementwise: list[ir.Operation] = []
    for link in links:
        if groups is None:
            return None
        result_shape = shape_of(link.results[0])
        if link.name == "stablehlo.reshape":
            groups = _regroup([axis for group in groups for axis in group], result_shape)
        elif link.name == "stablehlo.transpose":
            permutation = list(ir.DenseI64ArrayAttr(link.attributes["permutation"]))
            groups = [groups[p] for p in permutation]
        elif link.name == "stablehlo.broadcast_in_dim":
            mapping = list(ir.DenseI64ArrayAttr(link.attributes["broadcast_dimensions"]))
            operand_shape = shape_of(link.operands[0])
            new_groups: list[list[_Axis]] = [
                [_Axis(next(counter), size, True)] if size != 1 else [] for size in result_shape
            ]
            for operand_dim, result_dim in enumerate(mapping):
                if operand_shape[operand_dim] == result_shape[result_dim]:
                    new_groups[result_dim] = groups[operand_dim]
            groups = new_groups
        else:
            elementwise.append(link)
            if link.name == "stablehlo.multiply":
                scales.append(link)
    if groups is None:
        return None
    converts = [link for link in elementwise if link.name == "stablehlo.convert"]
    if converts:
        # A convert changes the dot's operand type: it cannot move onto the
        # result, so it and every scale stay on the source, in order.
        return _Chain(source, source_axes, groups, [], converts, elementwise)
    return _Chain(source, source_axes, groups, scales)


def _duplicated_update(source: ir.Value) -> bool:
    """Whether ``source`` is (a reshape of) a ``dynamic_update_slice`` whose
    update has fewer non-1 dimensions than its result (a decode step's
    one-row cache write, unless ``widen-one-row-updates`` widened it).

    XLA:CPU counts such an update as effectively unary and duplicates it
    into the reshape through which the folded dot reads the cache: a fresh
    copy of the updated cache, and a copy of the old one for the in-place
    update (measured: the decode step's temp doubles)."""
    operation = _operation(source)
    while operation is not None and operation.name == "stablehlo.reshape":
        operation = _operation(operation.operands[0])
    if operation is None or operation.name != "stablehlo.dynamic_update_slice":
        return False
    update = [size for size in shape_of(operation.operands[1]) if size != 1]
    return len(update) < len([size for size in shape_of(operation.results[0]) if size != 1])


def _is_power_of_two_scale(multiply: ir.Operation) -> bool:
    """Whether the splat ``multiply`` scales by is a constant power of two
    (through ``reshape``/``convert``/``broadcast_in_dim`` of a constant)."""
    splat = _splat_operand(multiply)
    assert splat is not None
    value = multiply.operands[splat]
    while True:
        operation = _operation(value)
        if operation is None:
            return False
        if operation.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert"):
            value = operation.operands[0]
            continue
        if operation.name != "stablehlo.constant":
            return False
        attribute = operation.attributes["value"]
        if not isinstance(attribute, ir.DenseFPElementsAttr) or not attribute.is_splat:
            return False
        number = float(ir.FloatAttr(attribute.get_splat_value()).value)
        # As the multiply's own element type sees it: f32 rounding of an f64
        # constant can make a power of two out of a non-power (not here: a
        # power of two is exact in every float type).
        number = struct.unpack("f", struct.pack("f", number))[0]
        if number <= 0 or not math.isfinite(number):
            return False
        mantissa, _exponent = math.frexp(number)
        return mantissa == 0.5


# A chunk is a multiple of this many columns, as is the whole free
# dimension: XLA:CPU's dot kernel picks its tiling from the free size
# (measured: the per-element sum changes only when that size modulo 64 is
# 1..48), so equal-shaped chunks of 256 columns compute each score exactly
# as the whole dot does (asserted bit for bit in test_repeat_fold_bytes).
_CHUNK_ALIGN = 256


@dataclasses.dataclass(frozen=True)
class _ChunkPlan:
    """Read the scaled source ``count`` chunks of ``size`` along its
    ``source_dim``, the dot's ``result_dim``."""

    source_dim: int
    result_dim: int
    size: int
    count: int


@dataclasses.dataclass
class _RepeatFolder:
    exact_scales_only: bool
    chunk_bytes: int = 0
    folded: int = 0
    scales_moved: int = 0
    scales_on_source: int = 0
    chunked: int = 0

    def fold_repeated_operand(self, op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
        """One repeated operand of ``op`` -> its source, the repeat a free dim."""
        for side in (1, 0):
            if self._fold(op, side, rewriter):
                return False
        return True

    def _fold(self, op: ir.OpView, side: int, rewriter: rewrite.PatternRewriter) -> bool:
        numbers = _stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        batching = [list(numbers.lhs_batching_dimensions), list(numbers.rhs_batching_dimensions)]
        contracting = [list(numbers.lhs_contracting_dimensions), list(numbers.rhs_contracting_dimensions)]
        if not batching[side]:
            return False
        links = _chain_links(op.operands[side])
        if not any(link.name == "stablehlo.broadcast_in_dim" for link in links):
            return False
        result_element = ir.RankedTensorType(op.results[0].type).element_type
        # The farthest source first: the fewer links stay, the fewer copies.
        for start in range(len(links), 0, -1):
            chosen = list(reversed(links[:start]))
            chain = _describe(_chain_input(chosen[0]), chosen)
            if chain is None:
                continue
            if not self._scales_movable(chain, result_element):
                chain = self._scales_on_source(chain, result_element)
                if chain is None:
                    continue
            if self._rewrite(op, side, chain, batching, contracting, rewriter):
                return True
        return False

    def _scales_movable(self, chain: _Chain, result_element: ir.Type) -> bool:
        for multiply in chain.scales:
            if ir.RankedTensorType(multiply.results[0].type).element_type != result_element:
                return False
            if self.exact_scales_only and not _is_power_of_two_scale(multiply):
                return False
        return True

    def _scales_on_source(self, chain: _Chain, result_element: ir.Type) -> _Chain | None:
        """``chain`` with the scales that may not move onto the result
        applied to its source (exact), or None when the source's element
        type is not theirs."""
        source_element = ir.RankedTensorType(chain.source.type).element_type
        stay = [m for m in chain.scales if ir.RankedTensorType(m.results[0].type).element_type != result_element
                or (self.exact_scales_only and not _is_power_of_two_scale(m))]
        if any(ir.RankedTensorType(m.results[0].type).element_type != source_element for m in stay):
            return None
        moving = [m for m in chain.scales if m not in stay]
        return dataclasses.replace(chain, scales=moving, source_scales=stay)

    def _chunk_plan(
        self, chain: _Chain, kept: list[_Axis], source_free: list[_Axis], result_axes: list[_Axis],
        element: ir.Type,
    ) -> _ChunkPlan | None:
        """How to read a scaled source in chunks, or None to scale it whole:
        only a source with scales that stay on it, one free axis, larger than
        ``chunk_bytes`` and than the dot's result (a decode step's K cache,
        not a prefill's, whose scores dwarf it)."""
        if not chain.source_scales or self.chunk_bytes == 0:
            return None
        if chain.converts:
            # XLA:CPU hoists the loop's convert of the carried source out of
            # the loop: a whole converted copy again, plus the loop (measured
            # on a bf16-cache decode step: more temp than without chunks).
            return None
        free = [axis for axis in source_free if axis.size != 1]
        if len(free) != 1:
            return None
        # The copy the dot reads, in the last source op's element type.
        copy_element = ir.RankedTensorType(chain.source_scales[-1].results[0].type).element_type
        if not isinstance(copy_element, ir.FloatType) or not isinstance(element, ir.FloatType):
            return None
        row_bytes = math.prod(a.size for a in kept) // free[0].size * (copy_element.width // 8)
        scaled_bytes = row_bytes * free[0].size
        result_bytes = math.prod(a.size for a in result_axes) * (element.width // 8)
        if scaled_bytes <= self.chunk_bytes or scaled_bytes <= result_bytes:
            return None
        length = free[0].size
        sizes = [n for n in range(_CHUNK_ALIGN, length, _CHUNK_ALIGN)
                 if length % n == 0 and n * row_bytes <= self.chunk_bytes]
        if not sizes:
            return None
        source_dim = kept.index(free[0])
        result_dim = [a.ident for a in result_axes].index(free[0].ident)
        return _ChunkPlan(source_dim, result_dim, max(sizes), length // max(sizes))

    def _rewrite(
        self,
        op: ir.OpView,
        side: int,
        chain: _Chain,
        batching: list[list[int]],
        contracting: list[list[int]],
        rewriter: rewrite.PatternRewriter,
    ) -> bool:
        other = 1 - side
        groups = chain.groups
        x_free = [d for d in range(len(groups)) if d not in batching[side] and d not in contracting[side]]
        batch_groups = [groups[d] for d in batching[side]]
        if not any(axis.repeat for group in batch_groups for axis in group):
            return False
        if _duplicated_update(chain.source):
            return False
        if any(axis.repeat for d in x_free + contracting[side] for axis in groups[d]):
            return False
        # The other operand, each batching/contracting dim split like X's group.
        other_value = op.operands[other]
        other_shape = shape_of(other_value)
        fresh = -1
        other_axes: list[_Axis] = []
        original_other: dict[int, list[_Axis]] = {}
        for dim, size in enumerate(other_shape):
            if dim in batching[other]:
                axes = groups[batching[side][batching[other].index(dim)]]
            elif dim in contracting[other]:
                axes = groups[contracting[side][contracting[other].index(dim)]]
            else:
                axes = [_Axis(fresh, size, False)]
                fresh -= 1
            original_other[dim] = axes
            other_axes.extend(axes)
        other_position = {axis.ident: i for i, axis in enumerate(other_axes)}
        # S without its size-1 dims: XLA's dot then has S's batching dims leading
        # (no transposing copy) and reads S through a bitcast.
        kept = [axis for axis in chain.source_axes if axis.size != 1]
        source_position = {axis.ident: i for i, axis in enumerate(kept)}
        batch_pairs = [
            (other_position[axis.ident], source_position[axis.ident])
            for group in batch_groups for axis in group if not axis.repeat
        ]
        contracting_pairs = [
            (other_position[axis.ident], source_position[axis.ident])
            for d in contracting[side] for axis in groups[d]
        ]
        paired_other = {o for o, _ in batch_pairs + contracting_pairs}
        paired_source = {s for _, s in batch_pairs + contracting_pairs}
        other_free = [a for i, a in enumerate(other_axes) if i not in paired_other]
        source_free = [a for i, a in enumerate(kept) if i not in paired_source]
        batch_axes = [axis for group in batch_groups for axis in group if not axis.repeat]
        lhs_free, rhs_free = (other_free, source_free) if other == 0 else (source_free, other_free)
        new_order = [a.ident for a in batch_axes + lhs_free + rhs_free if a.size != 1]
        old_lhs = [d for d in range(len(shape_of(op.operands[0]))) if d not in batching[0] + contracting[0]]
        old_rhs = [d for d in range(len(shape_of(op.operands[1]))) if d not in batching[1] + contracting[1]]

        def free_axes(operand: int, dims: list[int]) -> list[_Axis]:
            if operand == side:
                return [axis for d in dims for axis in groups[d]]
            return [axis for d in dims for axis in original_other[d]]

        old_order = [a.ident for group in batch_groups for a in group]
        old_order += [a.ident for a in free_axes(0, old_lhs) + free_axes(1, old_rhs) if a.size != 1]
        if new_order != old_order:
            return False  # the result's dimension order would change

        result_type = ir.RankedTensorType(op.results[0].type)
        element = result_type.element_type
        new_shape = [a.size for a in batch_axes + lhs_free + rhs_free]
        pairs = (batch_pairs, contracting_pairs)
        if other == 1:
            dims = _stablehlo.DotDimensionNumbers.get(
                lhs_batching_dimensions=[s for _, s in pairs[0]],
                rhs_batching_dimensions=[o for o, _ in pairs[0]],
                lhs_contracting_dimensions=[s for _, s in pairs[1]],
                rhs_contracting_dimensions=[o for o, _ in pairs[1]],
            )
        else:
            dims = _stablehlo.DotDimensionNumbers.get(
                lhs_batching_dimensions=[o for o, _ in pairs[0]],
                rhs_batching_dimensions=[s for _, s in pairs[0]],
                lhs_contracting_dimensions=[o for o, _ in pairs[1]],
                rhs_contracting_dimensions=[s for _, s in pairs[1]],
            )
        attributes = {name: op.attributes[name] for name in op.attributes}
        attributes["dot_dimension_numbers"] = dims

        def dot(other_operand: ir.Value, source_operand: ir.Value, shape: list[int]) -> ir.Value:
            operands = [other_operand, source_operand] if other == 0 else [source_operand, other_operand]
            return ir.Operation.create(
                "stablehlo.dot_general", results=[ir.RankedTensorType.get(shape, element)],
                operands=operands, attributes=attributes,
            ).results[0]

        plan = self._chunk_plan(chain, kept, source_free, batch_axes + lhs_free + rhs_free, element)
        with rewriter.ip, op.location:
            other_operand = _reshaped(other_value, [a.size for a in other_axes])
            if plan is None:
                source = chain.source
                for source_op in chain.source_scales:
                    source = _applied(source, source_op)
                new = dot(other_operand, _reshaped(source, [a.size for a in kept]), new_shape)
            else:
                new = _chunked_dot(
                    other_operand, _reshaped(chain.source, [a.size for a in kept]), chain.source_scales,
                    new_shape, element, plan, dot,
                )
                self.chunked += 1
            result = _reshaped(new, list(result_type.shape))
            for multiply in chain.scales:
                result = _scaled(result, multiply)
        rewriter.replace_op(op, [result])
        self.folded += 1
        self.scales_moved += len(chain.scales)
        self.scales_on_source += len([m for m in chain.source_scales if m.name == "stablehlo.multiply"])
        return True


def _scalar_i64(value: int) -> ir.Value:
    i64 = ir.RankedTensorType.get([], ir.IntegerType.get_signless(64))
    return ir.Operation.create(
        "stablehlo.constant", results=[i64], attributes={"value": ir.DenseElementsAttr.get_splat(
            i64, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value))},
    ).results[0]


def _chunked_dot(
    other: ir.Value, source: ir.Value, scales: list[ir.Operation], shape: list[int], element: ir.Type,
    plan: _ChunkPlan, dot: Callable[[ir.Value, ir.Value, list[int]], ir.Value],
) -> ir.Value:
    """``dot(other, source * scales)`` of ``shape`` in ``plan.count``
    chunks: each slices ``plan.size`` of ``source`` along
    ``plan.source_dim``, scales the slice and writes its dot into the result
    along ``plan.result_dim``.  Every score is the same product of the same
    scaled elements; only one chunk's scaled copy is alive.  The first chunk
    is computed before a ``stablehlo.while`` over the others, its dot padded
    with zeros to the result: the loop's initial value is then this layer's
    own (a zero splat shared by every layer's loop, which XLA would merge,
    is copied once per loop, all copies alive at the start).  The loop
    carries every value it reads but constants."""
    i64 = ir.RankedTensorType.get([], ir.IntegerType.get_signless(64))
    result_type = ir.RankedTensorType.get(shape, element)
    source_shape = shape_of(source)
    source_element = ir.RankedTensorType(source.type).element_type
    # Rank-0 scale factors computed outside ride along; constants are rebuilt inside.
    factors = [f for f in (_scale_factor(m) for m in scales) if f is not None]

    def chunk_dot(start: ir.Value | None, other_value: ir.Value, source_value: ir.Value,
                  factor_values: list[ir.Value]) -> ir.Value:
        """The dot of the chunk at ``start`` (None: the first, a static slice)."""
        sizes = [plan.size if d == plan.source_dim else n for d, n in enumerate(source_shape)]
        chunk_type = ir.RankedTensorType.get(sizes, source_element)
        if start is None:
            chunk = ir.Operation.create(
                "stablehlo.slice", results=[chunk_type], operands=[source_value],
                attributes={
                    "start_indices": ir.DenseI64ArrayAttr.get([0] * len(sizes)),
                    "limit_indices": ir.DenseI64ArrayAttr.get(sizes),
                    "strides": ir.DenseI64ArrayAttr.get([1] * len(sizes)),
                },
            ).results[0]
        else:
            starts = [start if d == plan.source_dim else _scalar_i64(0) for d in range(len(source_shape))]
            chunk = ir.Operation.create(
                "stablehlo.dynamic_slice", results=[chunk_type], operands=[source_value, *starts],
                attributes={"slice_sizes": ir.DenseI64ArrayAttr.get(sizes)},
            ).results[0]
        remaining = iter(factor_values)
        for source_op in scales:
            chunk = _applied(chunk, source_op, next(remaining) if _scale_factor(source_op) is not None else None)
        chunk_shape = [plan.size if d == plan.result_dim else n for d, n in enumerate(shape)]
        return dot(other_value, chunk, chunk_shape)

    first = chunk_dot(None, other, source, factors)
    zero = ir.Operation.create(
        "stablehlo.constant", results=[ir.RankedTensorType.get([], element)],
        attributes={"value": ir.DenseElementsAttr.get_splat(
            ir.RankedTensorType.get([], element), ir.FloatAttr.get(element, 0.0))},
    ).results[0]
    high = [shape[d] - plan.size if d == plan.result_dim else 0 for d in range(len(shape))]
    initial = ir.Operation.create(
        "stablehlo.pad", results=[result_type], operands=[first, zero],
        attributes={
            "edge_padding_low": ir.DenseI64ArrayAttr.get([0] * len(shape)),
            "edge_padding_high": ir.DenseI64ArrayAttr.get(high),
            "interior_padding": ir.DenseI64ArrayAttr.get([0] * len(shape)),
        },
    ).results[0]
    carried = [_scalar_i64(1), initial, other, source, *factors]
    loop = ir.Operation.create(
        "stablehlo.while", results=[v.type for v in carried], operands=carried, regions=2,
    )
    cond = loop.regions[0].blocks.append(*[v.type for v in carried])
    with ir.InsertionPoint(cond):
        below = ir.Operation.create(
            "stablehlo.compare", results=[ir.RankedTensorType.get([], ir.IntegerType.get_signless(1))],
            operands=[cond.arguments[0], _scalar_i64(plan.count)],
            attributes={
                "comparison_direction": ir.Attribute.parse("#stablehlo<comparison_direction LT>"),
                "compare_type": ir.Attribute.parse("#stablehlo<comparison_type SIGNED>"),
            },
        ).results[0]
        ir.Operation.create("stablehlo.return", operands=[below])
    body = loop.regions[1].blocks.append(*[v.type for v in carried])
    with ir.InsertionPoint(body):
        arguments = list(body.arguments)
        index, accumulated, other_arg, source_arg = arguments[:4]
        start = ir.Operation.create(
            "stablehlo.multiply", results=[i64], operands=[index, _scalar_i64(plan.size)]
        ).results[0]
        part = chunk_dot(start, other_arg, source_arg, arguments[4:])
        at = [start if d == plan.result_dim else _scalar_i64(0) for d in range(len(shape))]
        updated = ir.Operation.create(
            "stablehlo.dynamic_update_slice", results=[result_type], operands=[accumulated, part, *at],
        ).results[0]
        following = ir.Operation.create(
            "stablehlo.add", results=[i64], operands=[index, _scalar_i64(1)]
        ).results[0]
        ir.Operation.create("stablehlo.return", operands=[following, updated, other_arg, source_arg, *arguments[4:]])
    return loop.results[1]


def _scale_factor(multiply: ir.Operation) -> ir.Value | None:
    """The rank-0 value a splat ``multiply`` broadcasts, or None for a splat
    constant or a convert."""
    if multiply.name == "stablehlo.convert":
        return None
    splat = _splat_operand(multiply)
    assert splat is not None
    defining = _operation(multiply.operands[splat])
    assert defining is not None
    return None if defining.name == "stablehlo.constant" else defining.operands[0]


def _reshaped(value: ir.Value, shape: list[int]) -> ir.Value:
    """``value`` as ``shape`` (itself when it already is)."""
    if shape_of(value) == shape:
        return value
    element = ir.RankedTensorType(value.type).element_type
    reshape = ir.Operation.create(
        "stablehlo.reshape", results=[ir.RankedTensorType.get(shape, element)], operands=[value]
    )
    return reshape.results[0]


def _applied(value: ir.Value, source_op: ir.Operation, factor: ir.Value | None = None) -> ir.Value:
    """``source_op`` (a splat multiply or a convert) applied to ``value``."""
    if source_op.name == "stablehlo.convert":
        element = ir.RankedTensorType(source_op.results[0].type).element_type
        return ir.Operation.create(
            "stablehlo.convert", results=[ir.RankedTensorType.get(shape_of(value), element)], operands=[value]
        ).results[0]
    return _scaled(value, source_op, factor)


def _scaled(value: ir.Value, multiply: ir.Operation, factor: ir.Value | None = None) -> ir.Value:
    """``value`` times the splat ``multiply`` scales by (broadcasting
    ``factor`` in its rank-0 value's place where given)."""
    splat = _splat_operand(multiply)
    assert splat is not None
    defining = _operation(multiply.operands[splat])
    assert defining is not None
    result_type = ir.RankedTensorType(value.type)
    if defining.name == "stablehlo.constant":
        attribute = ir.DenseElementsAttr(defining.attributes["value"])
        splat_value = ir.Operation.create(
            "stablehlo.constant", results=[result_type],
            attributes={"value": ir.DenseElementsAttr.get_splat(result_type, attribute.get_splat_value())},
        ).results[0]
    else:
        splat_value = ir.Operation.create(
            "stablehlo.broadcast_in_dim", results=[result_type],
            operands=[defining.operands[0] if factor is None else factor],
            attributes={"broadcast_dimensions": ir.DenseI64ArrayAttr.get([])},
        ).results[0]
    operands = [value, splat_value] if splat == 1 else [splat_value, value]
    return ir.Operation.create("stablehlo.multiply", results=[result_type], operands=operands).results[0]
