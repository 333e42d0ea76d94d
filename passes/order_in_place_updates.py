"""``order-in-place-updates``: make every in-place update of an aliased
argument data-dependent on the reads of the argument's old value that
nothing else orders before it.

In a training step the optimizer overwrites a weight in place
(``tf.aliasing_output``) while the backward still reads the old weight for
an input gradient (``dX = dY @ W``).  The update depends on ``dW``, not on
``dX``, so XLA's copy insertion, which orders instructions by data
dependencies, cannot prove the read happens before the write and copies
the weight first (4 MB per 1024x1024 weight, every step).  An
``optimization_barrier`` does not help on XLA:CPU: its
``cse_barrier_expander`` removes barriers before copy insertion.

The rewrite puts the op that produces the new value inside a
``stablehlo.if`` whose two branches are that same op and whose predicate
reads one element of each unordered reader's result (``v == v``).  Both
branches compute the same value, so the result is exact whatever the
predicate (NaN included); the predicate makes the readers data-dependent
predecessors of the update, and XLA writes the weight in place without a
copy.  Run it after ``alias-donated-buffers`` (it reads
``tf.aliasing_output``)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir

from hloalias.contract import verify
from hloalias.mlir import find_main, return_op
from hloalias.passes.base import ModuleLike, ModulePass, as_module_like


@dataclasses.dataclass(frozen=True)
class OrderedUpdate:
    """One guarded update: the aliased argument, its result, and how many
    unordered reads of the old value now come before the write."""

    arg_index: int
    arg_name: str
    result_index: int
    readers: int


@dataclasses.dataclass(frozen=True)
class OrderReport:
    """Every update the pass guarded."""

    ordered: tuple[OrderedUpdate, ...]

    def to_text(self) -> str:
        """One line per guarded update."""
        lines = [f"order-in-place-updates: {len(self.ordered)} updates ordered after their reads"]
        for update in self.ordered:
            lines.append(
                f"  arg {update.arg_index} '{update.arg_name}' -> result {update.result_index}: "
                f"after {update.readers} read(s) of the old value"
            )
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class OrderInPlaceUpdates(ModulePass[OrderReport]):
    """Guard in-place updates of aliased arguments behind unordered reads."""

    name: ClassVar[str] = "order-in-place-updates"

    def apply(self, module: ModuleLike) -> OrderReport:
        """Rewrite ``@main`` in place; returns what was guarded."""
        module = as_module_like(module)
        ordered: list[OrderedUpdate] = []
        with module.context, ir.Location.unknown():
            main = find_main(module)
            contract = verify(main)
            block = main.regions[0].blocks[0]
            ret = return_op(main).operation
            ancestry = _Ancestry(block, main.operation)
            for index, arg in enumerate(contract.args):
                if arg.aliasing_output is None:
                    continue
                readers = _guard(block.arguments[index], main.operation, ret, arg.aliasing_output, ancestry)
                if readers:
                    ordered.append(OrderedUpdate(index, arg.display_name(index), arg.aliasing_output, readers))
            verify(main)
        return OrderReport(tuple(ordered))


def _guard(
    argument: ir.Value, main: ir.Operation, ret: ir.Operation, result_index: int, ancestry: "_Ancestry"
) -> int:
    """Guard the op producing result ``result_index`` behind the reads of
    ``argument`` it is not ordered after; the number of such reads."""
    new_value = ret.operands[result_index]
    if isinstance(new_value.owner, ir.Block):
        return 0  # the result is an argument: nothing is written
    writer = new_value.owner.operation
    # Exactly one use, this result: the writer is then erased with nothing
    # left pointing at it.  A value returned twice (two aliased results of
    # one SSA value, ``a.copy_(z); b.copy_(z.clone())``) or read elsewhere
    # keeps its op: XLA copies it into one of the two buffers anyway.
    if len(writer.results) != 1 or len(list(new_value.uses)) != 1:
        return 0
    unordered: list[ir.Operation] = []
    for use in argument.uses:
        # A read inside a region (a case/while/if branch) is ordered by the
        # op in @main's body that holds it: only that op's results are
        # visible at the return, where the predicate is built.
        reader = _in_body(use.owner.operation, main)
        if reader == writer or ancestry.precedes(reader, writer) or reader in unordered:
            continue
        unordered.append(reader)
    probes: list[ir.Value] = []
    for reader in unordered:
        readable = [result for result in reader.results if _probeable(result.type)]
        if not readable:
            return 0  # a reader whose results cannot be probed: leave the update as it is
        probes.append(readable[0])
    if not probes:
        return 0
    at_return = ir.InsertionPoint(ret)
    i1 = ir.RankedTensorType.get([], ir.IntegerType.get_signless(1))
    predicate: ir.Value | None = None
    for value in probes:
        tensor_type = ir.RankedTensorType(value.type)
        rank = tensor_type.rank
        element = ir.Operation.create(
            "stablehlo.slice",
            results=[ir.RankedTensorType.get([1] * rank, tensor_type.element_type)],
            operands=[value],
            attributes={
                "start_indices": ir.DenseI64ArrayAttr.get([0] * rank),
                "limit_indices": ir.DenseI64ArrayAttr.get([1] * rank),
                "strides": ir.DenseI64ArrayAttr.get([1] * rank),
            },
            ip=at_return,
        )
        scalar = ir.Operation.create(
            "stablehlo.reshape",
            results=[ir.RankedTensorType.get([], tensor_type.element_type)],
            operands=[element.results[0]],
            ip=at_return,
        )
        same = ir.Operation.create(
            "stablehlo.compare",
            results=[i1],
            operands=[scalar.results[0], scalar.results[0]],
            attributes={"comparison_direction": ir.Attribute.parse("#stablehlo<comparison_direction EQ>")},
            ip=at_return,
        ).results[0]
        if predicate is not None:
            same = ir.Operation.create("stablehlo.or", results=[i1], operands=[predicate, same], ip=at_return).results[0]
        predicate = same
    assert predicate is not None
    guarded = ir.Operation.create("stablehlo.if", results=[new_value.type], operands=[predicate], regions=2, ip=at_return)
    for region in guarded.regions:
        branch = region.blocks.append()
        copy = writer.clone(ip=ir.InsertionPoint(branch))
        ir.Operation.create("stablehlo.return", operands=[copy.results[0]], ip=ir.InsertionPoint(branch))
    ret.operands[result_index] = guarded.results[0]
    ancestry.forget(writer)  # before erasing: a later op may take its address
    writer.erase()  # its one use, the return operand, now reads the if
    return len(probes)


def _in_body(op: ir.Operation, main: ir.Operation) -> ir.Operation:
    """The op of ``main``'s body that is ``op`` or holds it in a region."""
    while True:
        parent = op.parent
        if parent is None or parent.operation == main:
            return op
        op = parent.operation


def _probeable(value_type: ir.Type) -> bool:
    """A static, non-empty tensor of integers or floats (one element is read)."""
    try:
        tensor_type = ir.RankedTensorType(value_type)
    except ValueError:
        return False
    if not tensor_type.has_static_shape or any(d == 0 for d in tensor_type.shape):
        return False
    return _is_a(ir.FloatType, tensor_type.element_type) or _is_a(ir.IntegerType, tensor_type.element_type)


def _is_a(kind: type, value_type: ir.Type) -> bool:
    try:
        kind(value_type)
    except ValueError:
        return False
    return True


class _Ancestry:
    """Which ops of ``@main``'s body each one reads, transitively: one pass
    over the body in order (operands come before their readers), each op's
    ancestors a bit set (a Python int over body positions), so that asking
    for every update costs no walk of the graph (a walk per update read the
    whole backward again for each weight).  An op reads what its operands,
    and those of the ops nested in its regions, read.  Ops the rewrite adds
    later feed only the return and are no ancestor of an update; one it
    erases is forgotten first."""

    def __init__(self, block: ir.Block, main: ir.Operation) -> None:
        self.position: dict[ir.Operation, int] = {}
        self.ancestors: list[int] = []
        for op_view in block.operations:
            op = op_view.operation
            at = len(self.ancestors)
            self.position[op] = at
            bits = 0
            for operand in _operands_within(op):
                owner = operand.owner
                if isinstance(owner, ir.Block):
                    continue
                producer = self.position.get(_in_body(owner.operation, main))
                if producer is not None and producer != at:
                    bits |= self.ancestors[producer] | (1 << producer)
            self.ancestors.append(bits)

    def precedes(self, reader: ir.Operation, op: ir.Operation) -> bool:
        """Whether ``op`` reads ``reader``'s results, transitively (False for
        an op added after the pass began)."""
        at, of = self.position.get(reader), self.position.get(op)
        return at is not None and of is not None and bool(self.ancestors[of] >> at & 1)

    def forget(self, op: ir.Operation) -> None:
        self.position.pop(op, None)


def _operands_within(op: ir.Operation) -> list[ir.Value]:
    """The operands of ``op`` and of every op nested in its regions."""
    operands = list(op.operands)
    for region in op.regions:
        for block in region.blocks:
            for nested in block.operations:
                operands += _operands_within(nested.operation)
    return operands
