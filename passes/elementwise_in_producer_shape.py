"""``elementwise-in-producer-shape``: an elementwise computation between a
reshape out of shape ``A`` (or a dot that XLA computes in shape ``A``) and
reshapes back into ``A`` is computed in shape ``A``.

torch-mlir lowers a Linear on a ``[batch, tokens, features]`` activation as
a dot with a three-dimensional result (or a two-dimensional dot reshaped
back to three dimensions); the bias add and the activation function (BERT's
and Swin's exact GELU: a polynomial of ``erf``) run in three dimensions,
and the next Linear reshapes the result to two.  XLA:CPU computes the dot
as ``[batch * tokens, features]`` and fuses the activation into one loop
that reads that buffer through a bitcast; a bitcast is not elementwise, so
XLA does not let the fusion write its result into that buffer, and the
activation's result takes a second buffer of the same size.  Computed in
the dot's own shape, the loop is elementwise on its input and XLA writes it
in place.

A region is grown from the operand of a ``reshape`` into ``A``: elementwise
ops whose results have the reshape's source shape ``B`` and whose every use
is another op of the region or a reshape into ``A``.  Its inputs must be
reshapes out of ``A``, dots without batching dimensions whose lhs free
dimensions merge into ``A``'s first (the dot is recomputed that way, as
XLA's dot decomposition does; its other users read it reshaped), at least
one of these two; and besides: splat constants and elementwise expressions
of them, ``broadcast_in_dim`` of values along dimensions that ``A`` and
``B`` share as a leading or trailing run (a bias along the features), and
scalars (``clamp``'s bounds).  The region is cloned in shape ``A`` and the
reshapes into ``A`` read its result.  The rewrite is exact: a reshape moves
no value, every elementwise op computes the same element from the same
operands, and the dot contracts the same elements.

Never fires when any op of the region has another use (it would be computed
twice), an input is of another kind (a value of shape ``B`` computed
otherwise, a broadcast along a dimension the reshape splits), or the region
has no reshape out of ``A`` and no such dot."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.stablehlo_values import shape_of

ELEMENTWISE = frozenset(
    f"stablehlo.{name}"
    for name in (
        "abs add and atan2 cbrt ceil clamp compare convert cosine divide exponential exponential_minus_one "
        "floor is_finite log log_plus_one logistic maximum minimum multiply negate not or power remainder "
        "round_nearest_afz round_nearest_even rsqrt select sign sine sqrt subtract tan tanh xor"
    ).split()
)


@dataclasses.dataclass(frozen=True)
class ElementwiseShapeReport:
    """How many elementwise regions now run in their producer's shape, and
    how many ops they hold."""

    regions: int
    ops: int

    def to_text(self) -> str:
        """The report as people read it."""
        return (f"elementwise-in-producer-shape: {self.regions} regions ({self.ops} ops) "
                "computed in their producer's shape")


@dataclasses.dataclass(frozen=True)
class ElementwiseInProducerShape(ModulePass[ElementwiseShapeReport]):
    """Compute elementwise ops between a reshape out of ``A`` and reshapes into ``A`` in ``A``."""

    name: ClassVar[str] = "elementwise-in-producer-shape"

    def apply(self, module: ModuleLike) -> ElementwiseShapeReport:
        """Rewrite every eligible region in ``module`` in place."""
        module = as_module_like(module)
        verify_contract(module)
        regions = ops = 0
        with module.context, ir.Location.unknown():
            for top in module.body.operations:
                if top.operation.name != "func.func":
                    continue
                for block in top.operation.regions[0].blocks:
                    while (found := _first_region(block)) is not None:
                        ops += _rewrite(*found)
                        regions += 1
        verify_contract(module)
        return ElementwiseShapeReport(regions, ops)


@dataclasses.dataclass
class _Region:
    """Ops (in block order) computing a value of shape ``B`` elementwise,
    their inputs, and the reshapes into ``A`` that read them."""

    shape: list[int]  # A
    ops: list[ir.Operation]
    exits: list[ir.Operation]


def _name(value: ir.Value) -> str | None:
    owner = value.owner
    return owner.operation.name if isinstance(owner, (ir.OpView, ir.Operation)) else None


def _shared_dims(a: list[int], b: list[int]) -> dict[int, int]:
    """Dimension of ``b`` -> the dimension of ``a`` it equals under a
    row-major reshape: the leading and trailing runs the shapes share."""
    prefix = 0
    while prefix < min(len(a), len(b)) and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(a), len(b)) - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    shared = {d: d for d in range(prefix)}
    shared.update({len(b) - 1 - k: len(a) - 1 - k for k in range(suffix)})
    return shared


def _flat_lhs_shape(dot: ir.Operation, a: list[int]) -> list[int] | None:
    """The 2-d lhs shape that makes ``dot`` compute shape ``a`` (its
    result with the lhs free dims merged, as XLA's dot decomposition
    merges them), or None: no batching dims, contracting dims the lhs's
    trailing ones in order, ``a`` = merged lhs free dims + rhs free dims."""
    numbers = _stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    lhs = shape_of(dot.operands[0])
    contracting = list(numbers.lhs_contracting_dimensions)
    free = len(lhs) - len(contracting)
    if list(numbers.lhs_batching_dimensions) or free < 2 or contracting != list(range(free, len(lhs))):
        return None
    result = shape_of(dot.results[0])
    if a != [math.prod(lhs[:free]), *result[free:]]:
        return None
    return [math.prod(lhs[:free]), *lhs[free:]]


def _dot_in_shape(dot: ir.Operation, a: list[int]) -> ir.Value:
    """``dot`` recomputed with its lhs free dims merged (result shape ``a``),
    placed before ``dot``; the old dot's other users read it reshaped."""
    lhs_shape = _flat_lhs_shape(dot, a)
    assert lhs_shape is not None
    numbers = _stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    element = ir.RankedTensorType(dot.results[0].type).element_type
    lhs_element = ir.RankedTensorType(dot.operands[0].type).element_type
    attributes = {key: dot.attributes[key] for key in dot.attributes}
    attributes["dot_dimension_numbers"] = _stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=[], rhs_batching_dimensions=[],
        lhs_contracting_dimensions=list(range(1, len(lhs_shape))),
        rhs_contracting_dimensions=list(numbers.rhs_contracting_dimensions),
    )
    with ir.InsertionPoint(dot), dot.location:
        lhs = ir.Operation.create("stablehlo.reshape", results=[ir.RankedTensorType.get(lhs_shape, lhs_element)],
                                  operands=[dot.operands[0]]).results[0]
        flat = ir.Operation.create("stablehlo.dot_general", results=[ir.RankedTensorType.get(a, element)],
                                   operands=[lhs, dot.operands[1]], attributes=attributes).results[0]
    return flat


def _splat_expression(value: ir.Value) -> bool:
    """Whether ``value`` is a splat constant or an elementwise op of such
    (a value the same in every element, however it is shaped)."""
    if ir.RankedTensorType(value.type).rank == 0:
        return _name(value) == "stablehlo.constant"
    name = _name(value)
    if name == "stablehlo.constant":
        attribute = value.owner.attributes["value"]
        return isinstance(attribute, ir.DenseElementsAttr) and attribute.is_splat
    return name in ELEMENTWISE and all(_splat_expression(operand) for operand in value.owner.operands)


def _through_identity_reshapes(value: ir.Value) -> ir.Value:
    """``value`` without the reshapes to its own shape that define it."""
    while _name(value) == "stablehlo.reshape" and shape_of(value.owner.operands[0]) == shape_of(value):
        value = value.owner.operands[0]
    return value


def _input_ok(value: ir.Value, a: list[int], b: list[int]) -> bool:
    """Whether region input ``value`` has a form in shape ``a``."""
    if ir.RankedTensorType(value.type).rank == 0:
        return True
    if shape_of(value) != b:
        return False
    value = _through_identity_reshapes(value)
    name = _name(value)
    owner = value.owner
    if name == "stablehlo.reshape":
        return shape_of(owner.operands[0]) == a
    if name == "stablehlo.constant" or name in ELEMENTWISE:
        return _splat_expression(value)
    if name == "stablehlo.dot_general":
        return _flat_lhs_shape(owner.operation, a) is not None
    if name == "stablehlo.broadcast_in_dim":
        source = shape_of(owner.operands[0])
        dims = list(ir.DenseI64ArrayAttr(owner.attributes["broadcast_dimensions"]))
        shared = _shared_dims(a, b)
        kept = [dims[i] for i, n in enumerate(source) if n != 1]
        if not all(d in shared for d in kept):
            return False
        mapped = [shared[d] for d in kept]
        return mapped == sorted(mapped)
    return False


def _grow(exit_op: ir.Operation) -> _Region | None:
    """The region read by reshape ``exit_op``, or None when it does not qualify."""
    a = shape_of(exit_op.results[0])
    root = exit_op.operands[0]
    b = shape_of(root)
    if a == b or _name(root) not in ELEMENTWISE:
        return None
    members: dict[ir.Operation, None] = {}
    stack = [root.owner.operation]
    inputs: list[ir.Value] = []
    while stack:
        op = stack.pop()
        if op in members:
            continue
        if op.name not in ELEMENTWISE or shape_of(op.results[0]) != b or op.block != exit_op.block:
            return None
        members[op] = None
        for operand in op.operands:
            if (_name(operand) in ELEMENTWISE and ir.RankedTensorType(operand.type).rank != 0
                    and not _splat_expression(operand)):
                stack.append(operand.owner.operation)
            else:
                inputs.append(operand)
    if not all(_input_ok(value, a, b) for value in inputs):
        return None
    if not any(_name(_through_identity_reshapes(v)) in ("stablehlo.reshape", "stablehlo.dot_general")
               for v in inputs if ir.RankedTensorType(v.type).rank != 0):
        return None
    exits: list[ir.Operation] = []
    for op in members:
        for use in op.results[0].uses:
            user = use.owner.operation
            if user in members:
                continue
            if user.name != "stablehlo.reshape" or shape_of(user.results[0]) != a:
                return None
            if user not in exits:
                exits.append(user)
    order = {op: position for position, op in enumerate(exit_op.block.operations)}
    first_exit = min(order[e] for e in exits)
    if any(order[op] > first_exit for op in members):
        return None
    return _Region(a, sorted(members, key=lambda op: order[op]), sorted(exits, key=lambda op: order[op]))


def _first_region(block: ir.Block) -> tuple[_Region] | None:
    for op in block.operations:
        if op.operation.name == "stablehlo.reshape":
            region = _grow(op.operation)
            if region is not None:
                return (region,)
    return None


def _in_shape(value: ir.Value, a: list[int]) -> ir.Value:
    """Region input ``value`` (checked by :func:`_input_ok`) in shape ``a``."""
    if ir.RankedTensorType(value.type).rank == 0:
        return value
    element = ir.RankedTensorType(value.type).element_type
    value = _through_identity_reshapes(value)
    owner = value.owner
    name = _name(value)
    if name == "stablehlo.reshape":
        return owner.operands[0]
    if name == "stablehlo.dot_general":
        return _dot_in_shape(owner.operation, a)
    new_type = ir.RankedTensorType.get(a, element)
    if name in ELEMENTWISE:  # a splat expression: the same op on its operands in shape a
        return ir.Operation.create(
            owner.operation.name, results=[new_type],
            operands=[_in_shape(operand, a) for operand in owner.operands],
            attributes={key: owner.operation.attributes[key] for key in owner.operation.attributes},
        ).results[0]
    if name == "stablehlo.constant":
        splat = ir.DenseElementsAttr(owner.attributes["value"]).get_splat_value()
        return ir.Operation.create("stablehlo.constant", results=[new_type],
                                   attributes={"value": ir.DenseElementsAttr.get_splat(new_type, splat)}).results[0]
    source = owner.operands[0]
    source_shape = shape_of(source)
    dims = list(ir.DenseI64ArrayAttr(owner.attributes["broadcast_dimensions"]))
    shared = _shared_dims(a, shape_of(value))
    kept = [i for i, n in enumerate(source_shape) if n != 1]
    squeezed = source if len(kept) == len(source_shape) else ir.Operation.create(
        "stablehlo.reshape",
        results=[ir.RankedTensorType.get([source_shape[i] for i in kept], element)],
        operands=[source],
    ).results[0]
    return ir.Operation.create(
        "stablehlo.broadcast_in_dim", results=[new_type], operands=[squeezed],
        attributes={"broadcast_dimensions": ir.DenseI64ArrayAttr.get([shared[dims[i]] for i in kept])},
    ).results[0]


def _rewrite(region: _Region) -> int:
    """Clone ``region`` in shape A before its first exit, route the exits
    to the clone, erase what is left unused; the number of ops moved."""
    clones: dict[ir.Operation, ir.Operation] = {}
    converted: dict[ir.Value, ir.Value] = {}
    flattened: list[tuple[ir.Operation, ir.Value]] = []
    with ir.InsertionPoint(region.exits[0]), region.exits[0].location:
        for op in region.ops:
            operands = []
            for operand in op.operands:
                owner = operand.owner
                inner = owner.operation if isinstance(owner, (ir.OpView, ir.Operation)) else None
                if inner in clones:
                    operands.append(clones[inner].results[0])
                    continue
                if operand not in converted:
                    converted[operand] = _in_shape(operand, region.shape)
                    dot = _through_identity_reshapes(operand).owner
                    if _name(_through_identity_reshapes(operand)) == "stablehlo.dot_general":
                        flattened.append((dot.operation, converted[operand]))
                operands.append(converted[operand])
            element = ir.RankedTensorType(op.results[0].type).element_type
            clones[op] = ir.Operation.create(
                op.name,
                results=[ir.RankedTensorType.get(region.shape, element)],
                operands=operands,
                attributes={key: op.attributes[key] for key in op.attributes},
                loc=op.location,
            )
    members = set(region.ops)
    inputs: list[ir.Operation] = []
    for op in region.ops:
        for operand in op.operands:
            owner = operand.owner
            if isinstance(owner, (ir.OpView, ir.Operation)) and owner.operation not in members:
                inputs.append(owner.operation)
    for exit_op in region.exits:
        exit_op.results[0].replace_all_uses_with(clones[exit_op.operands[0].owner.operation].results[0])
        exit_op.erase()
    for op in reversed(region.ops):
        op.erase()
    _erase_unused(inputs)
    for dot, flat in flattened:
        if list(dot.results[0].uses):  # other users read the merged dot reshaped
            with ir.InsertionPoint(dot), dot.location:
                reshaped = ir.Operation.create("stablehlo.reshape", results=[dot.results[0].type],
                                               operands=[flat]).results[0]
            dot.results[0].replace_all_uses_with(reshaped)
        _erase_unused([dot], _PURE | {"stablehlo.dot_general"})
    return len(region.ops)


_PURE: frozenset[str] = ELEMENTWISE | {"stablehlo.reshape", "stablehlo.constant", "stablehlo.broadcast_in_dim"}


def _erase_unused(ops: list[ir.Operation], names: frozenset[str] = _PURE) -> None:
    """Erase the ops of ``ops`` left without users, and the pure ops that
    only they used (ops named in ``names``)."""
    candidates = dict.fromkeys(ops)
    while True:
        dead = next((op for op in candidates if op.name in names
                     and not any(list(result.uses) for result in op.results)), None)
        if dead is None:
            return
        del candidates[dead]
        for operand in dead.operands:
            if isinstance(operand.owner, (ir.OpView, ir.Operation)):
                candidates[operand.owner.operation] = None
        dead.erase()
