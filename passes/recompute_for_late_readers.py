"""``recompute-for-late-readers``: an elementwise value that ops far later
in the block read again is recomputed for them, or read through a buffer
XLA keeps anyway, instead of being kept from its first reader to its last.

A training step captured as one program (``compile_training_step``) reads
some forward values again in the backward: every Linear's input for its
weight gradient (``dW = X^T dY``), LayerNorm's weight for ``g * w``, the
attention probabilities for softmax's backward.  XLA keeps each such value
in its own buffer from the forward to the backward, across the step's peak.
On the tiny GPT-2 of ``bench/training.py``: each layer's ``gelu_new``
output (``f32[256,512]``; GELU's backward keeps the ``c_fc`` output it is
computed from), every LayerNorm's output (``x_hat * w + b``; its backward
keeps ``x_hat``), every LayerNorm weight broadcast to the activation's
shape, and the attention probabilities in a second shape.

The readers of a value ``V`` (an elementwise op, ``reshape``,
``broadcast_in_dim`` or ``convert``) are grouped in block order: a reader
``min-distance`` ops or more after the previous one starts a new group.
The first group keeps ``V``.  For each later group (last first):

- a group with a reader XLA cannot fuse ``V`` into (a dot) gets one copy of
  ``V``'s chain, in a two-branch ``stablehlo.case`` whose branches both hold
  the copy, inserted before the group's first reader.  Its ``i32`` index is
  ``e != e`` for one element ``e`` of that reader's latest-defined other
  operand (0, or 1 on a NaN: both branches give the same value), so the
  copy waits for the backward's value; XLA's CSE does not merge a branch
  with the forward's computation, and XLA turns only a case with a
  boolean predicate into a ``select``;
- a group of elementwise readers gives each reader its own copy, over an
  ``optimization_barrier`` of the copy's leaves (XLA fuses it into the
  reader; the barrier keeps CSE from merging it back first), when the
  chain holds an op XLA does not duplicate into several fusions (a
  transcendental, a division, a power) or ``V`` is a function argument's
  broadcast; and where a ``reshape`` of ``V`` is read by a dot less than
  ``min-distance`` ops before the reader (or after it), the reader reads
  that reshape's result reshaped back instead (over a barrier): one buffer
  where XLA kept ``V`` in both shapes (``kept-reshapes``, on by default).

The chain is what ``V`` is computed from through those ops, down to leaves
that are alive at the reader anyway: function arguments, constants, and
values an op reads at or after it.  A leaf that cheap elementwise ops
(no transcendental, division or non-constant power) compute from a single
other tensor (arguments and constants aside: GELU's ``0.5 x``, a bias
added to a dot's result) is recomputed from that tensor, which XLA keeps
while it fuses the leaf into its readers, rather than read (a case
operand must be a buffer); a function argument's broadcast is copied, not
read.  At most ``max-ops``
ops per copy.

A value smaller than ``min-saved-bytes`` (64 KiB by default) is left
alone: each value copied costs XLA kernels of its own to compile (the
branch's chain, the case index, a changed neighbour; measured in
``bench/RESULTS-latency.md``) and saves only that value's buffer.
The floor is on the bytes saved alone, not on their ratio to the bytes
the copy recomputes: that ratio is set by the chain (a Linear input's
RMSNorm, a GELU) and is the same on a model of any width, so it does not
tell a 2-layer, 64-wide Llama (8-16 KiB values: no copies) from one
whose copies take megabytes off the step's peak (``bench/training.py``'s
GPT-2, 128-512 KiB values: all copied).  ``min-saved-bytes=0`` copies
every eligible value; a value of a dynamic shape counts as large.

Never applies when a value the chain needs is not alive at the reader (it
would be kept longer: a chain reaching a dot's result nothing reads
later), to returned values, to chains of shape ops alone before a dot
(nothing to recompute), to readers in nested regions or readers that are
barriers (``recompute-shared-activations``' copies), to a copy it made (its
leaves are barrier results), nor to a case copy whose reader has no other
operand to wait for.  Exact: each copy computes the same ops on the same
values, so every reader reads the same bits; and a reshape moves no value,
but a reader reading the kept reshape is fused by XLA with another operand
form, and XLA may then sum that fusion's reductions in another order (on
the small GPT-2 of ``test_training_temp_passes``, the second step's loss
moves in the last bit; ``kept-reshapes=false`` keeps every bit)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir

from hloalias.errors import PassError
from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.elementwise_in_producer_shape import ELEMENTWISE

BARRIER = "stablehlo.optimization_barrier"
#: Shape-only ops copied with the chain (they move no value).
SHAPE_OPS = frozenset({"stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.convert"})
#: Ops XLA does not duplicate into several consumers' fusions.
EXPENSIVE = frozenset(
    f"stablehlo.{name}"
    for name in ("tanh logistic exponential exponential_minus_one log log_plus_one power rsqrt sqrt "
                 "divide atan2 cbrt sine cosine tan remainder").split()
)


@dataclasses.dataclass(frozen=True)
class LateReadersReport:
    """How many values got copies for their later readers, and how many
    ops the copies hold."""

    values: int
    copied_ops: int

    def to_text(self) -> str:
        """The report as people read it."""
        return (f"recompute-for-late-readers: {self.values} values recomputed for their later readers "
                f"({self.copied_ops} ops copied)")


@dataclasses.dataclass(frozen=True)
class RecomputeForLateReaders(ModulePass[LateReadersReport]):
    """Recompute an elementwise value for far later readers from values alive there."""

    name: ClassVar[str] = "recompute-for-late-readers"
    min_distance: int = dataclasses.field(
        default=16, metadata={"help": "readers at least this many ops apart (block order) get a copy"})
    max_ops: int = dataclasses.field(default=24, metadata={"help": "the most ops one copy may hold"})
    kept_reshapes: bool = dataclasses.field(
        default=True, metadata={"help": "elementwise readers read a reshape XLA keeps for a dot, reshaped back"})
    min_saved_bytes: int = dataclasses.field(
        default=65536, metadata={"help": "values smaller than this (bytes) are kept, not copied"})

    def __post_init__(self) -> None:
        if self.min_distance < 1:
            raise PassError(f"{self.name}: min-distance must be at least 1, got {self.min_distance}")
        if self.max_ops < 1:
            raise PassError(f"{self.name}: max-ops must be at least 1, got {self.max_ops}")
        if self.min_saved_bytes < 0:
            raise PassError(f"{self.name}: min-saved-bytes must be at least 0, got {self.min_saved_bytes}")

    def apply(self, module: ModuleLike) -> LateReadersReport:
        """Give the later readers of every eligible value their own copy."""
        module = as_module_like(module)
        verify_contract(module)
        values = copied = 0
        with module.context, ir.Location.unknown():
            for top in module.body.operations:
                if top.operation.name != "func.func":
                    continue
                for region in top.operation.regions:
                    for block in region.blocks:
                        made_values, made_ops = _Block(block, self.min_distance, self.max_ops, self.kept_reshapes,
                                                       self.min_saved_bytes).run()
                        values += made_values
                        copied += made_ops
        verify_contract(module)
        return LateReadersReport(values, copied)


def _owner(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    return owner.operation if isinstance(owner, (ir.OpView, ir.Operation)) else None


def _operation(owner: ir.OpView | ir.Operation) -> ir.Operation:
    return owner.operation if isinstance(owner, ir.OpView) else owner


def _is_constant(value: ir.Value) -> bool:
    owner = _owner(value)
    return owner is not None and owner.name == "stablehlo.constant"


class _Block:
    """One block's rewrite: positions of its ops, refreshed after each copy."""

    def __init__(self, block: ir.Block, min_distance: int, max_ops: int, kept_reshapes: bool,
                 min_saved_bytes: int) -> None:
        self.block = block
        self.min_saved_bytes = min_saved_bytes
        self.kept_reshapes = kept_reshapes
        self.min_distance = min_distance
        self.max_ops = max_ops
        self.position: dict[ir.Operation, int] = {}
        self.ops: list[ir.Operation] = []
        # readers() per value until the next refresh: every change of the
        # block (a copy) is followed by a refresh, so an entry never
        # outlives the uses it was read from.
        self._readers: dict[ir.Value, list[ir.Operation] | None] = {}

    def refresh(self) -> list[ir.Operation]:
        """The block's ops, read again (after each copy: every change is
        followed by one refresh, so :attr:`ops` is always the block's)."""
        self.ops = [op.operation for op in self.block.operations]
        self.position = {op: index for index, op in enumerate(self.ops)}
        self._readers = {}
        return self.ops

    def readers(self, value: ir.Value) -> list[ir.Operation] | None:
        """The ops of the block reading ``value``, in block order, each
        once; None when one is in a nested region."""
        if value in self._readers:
            return self._readers[value]
        owners = {_operation(use.owner) for use in value.uses}
        found = None if any(owner not in self.position for owner in owners) else \
            sorted(owners, key=self.position.__getitem__)
        self._readers[value] = found
        return found

    def run(self) -> tuple[int, int]:
        values = copied = 0
        ops = self.refresh()
        index = 0
        while index < len(ops):
            op = ops[index]
            index += 1
            made = self.recompute(op)
            if made:
                values += 1
                copied += made
                ops = self.ops  # refreshed after the copy that made it
        return values, copied

    def recompute(self, op: ir.Operation) -> int:
        """Ops copied for ``op``'s later readers (0: not eligible)."""
        if len(op.results) != 1 or (op.name not in ELEMENTWISE and op.name not in SHAPE_OPS):
            return 0
        value = op.results[0]
        if not isinstance(value.type, ir.RankedTensorType):
            return 0
        size = _byte_size(ir.RankedTensorType(value.type))
        if size is not None and size < self.min_saved_bytes:
            return 0  # its kernels cost XLA more than its buffer is worth
        readers = self.readers(value)
        if readers is None or any(r.name == "func.return" for r in readers):
            return 0
        readers = [r for r in readers if not _is_probe(r)]  # placed just before the case it feeds
        if len(readers) < 2:
            return 0
        groups: list[list[ir.Operation]] = [[readers[0]]]
        for reader in readers[1:]:
            if self.position[reader] - self.position[groups[-1][-1]] >= self.min_distance:
                groups.append([reader])
            else:
                groups[-1].append(reader)
        if len(groups) < 2:
            return 0
        made = 0
        # The last group first: a copy for an earlier group must not count
        # the original's later readers as keeping its leaves alive.
        for group in reversed(groups[1:]):
            if any(reader.name == BARRIER for reader in group):
                continue  # another copy's input (recompute-shared-activations): it recomputes already
            if all(reader.name in ELEMENTWISE or reader.name in SHAPE_OPS for reader in group):
                # XLA fuses a copy into each reader: one copy per reader.
                for reader in reversed(group):
                    kept = self.kept_reshape(op, self.position[reader]) if self.kept_reshapes else None
                    if kept is not None:
                        made += self.copy_over_barrier(kept, [], [kept.results[0]], reader, op.results[0])
                        self.refresh()
                        continue
                    plan = self.plan(op, self.position[reader])
                    if plan is not None and _worth_fusing(op, plan[0]):
                        made += self.copy_over_barrier(op, *plan, reader)
                        self.refresh()
                continue
            plan = self.plan(op, self.position[group[0]])
            if plan is not None and any(o.name not in SHAPE_OPS for o in plan[0]):
                made += self.copy_in_case(op, *plan, group)
                self.refresh()
        return made

    def alive_at(self, value: ir.Value, where: int) -> bool:
        """Whether ``value`` is alive at block position ``where`` anyway: an
        argument, a constant, or read there or later."""
        if _is_constant(value):
            return True
        owner = _owner(value)
        if owner is None:
            return True  # a block argument
        if owner.name == BARRIER:
            return False  # a copy this pass (or another) made: not copied again
        readers = self.readers(value)
        if readers is None:
            return True  # read in a nested region: kept as it is
        return any(self.position[r] >= where for r in readers)

    def plan(self, op: ir.Operation, where: int) -> tuple[list[ir.Operation], list[ir.Value]] | None:
        """The ops to copy (in block order) and the leaves they read, or
        None when some input would have to be kept alive longer."""
        members: set[ir.Operation] = {op}
        leaves: list[ir.Value] = []
        roots: set[ir.Value] = set()
        pending = [op]
        while pending:
            current = pending.pop()
            for operand in current.operands:
                owner = _owner(operand)
                if owner is not None and owner in members or _is_constant(operand) or operand in leaves:
                    continue
                if owner is not None and owner.name == BARRIER:
                    return None  # a copy already
                if operand in roots:
                    leaves.append(operand)
                    continue
                if self.alive_at(operand, where) and not _shaped_argument(operand):
                    root = self.single_root(operand)
                    if root is None:
                        leaves.append(operand)
                        continue
                    roots.add(root)  # recomputed from the one tensor it is a function of
                if owner is None or owner.name not in ELEMENTWISE and owner.name not in SHAPE_OPS:
                    return None
                if len(owner.results) != 1 or owner not in self.position:
                    return None
                members.add(owner)
                if len(members) > self.max_ops:
                    return None
                pending.append(owner)
        if not leaves:
            return None
        return sorted(members, key=self.position.__getitem__), leaves

    def single_root(self, value: ir.Value) -> ir.Value | None:
        """The one value computed otherwise (not elementwise, a shape op or
        a constant; arguments aside) that elementwise ``value`` is a
        function of, or None (several, none, or ``value`` itself)."""
        owner = _owner(value)
        if owner is None or owner.name not in ELEMENTWISE and owner.name not in SHAPE_OPS or _expensive(owner):
            return None
        found: set[ir.Value] = set()
        seen: set[ir.Operation] = {owner}
        pending = [owner]
        while pending:
            current = pending.pop()
            for operand in current.operands:
                below = _owner(operand)
                if below is None or _is_constant(operand) or below in seen:
                    continue
                if below.name in ELEMENTWISE or below.name in SHAPE_OPS:
                    if len(below.results) != 1 or below not in self.position or len(seen) >= self.max_ops:
                        return None
                    if _expensive(below):
                        return None  # XLA keeps this value, not the tensor it is computed from
                    seen.add(below)
                    pending.append(below)
                    continue
                if below.name == BARRIER:
                    return None
                found.add(operand)
                if len(found) > 1:
                    return None
        return next(iter(found)) if found else None

    def kept_reshape(self, op: ir.Operation, where: int) -> ir.Operation | None:
        """A ``reshape`` of ``op``'s value whose result an op that is not
        elementwise (a dot) reads after ``where - min_distance``: XLA keeps
        that buffer until about ``where`` anyway, and a reshape back is a
        bitcast of it."""
        for reader in self.readers(op.results[0]) or []:
            if reader.name != "stablehlo.reshape" or self.position[reader] >= where:
                continue  # not a reshape, or defined after the reader
            later = self.readers(reader.results[0]) or []
            if any(self.position[r] > where - self.min_distance and r.name not in ELEMENTWISE and r.name not in SHAPE_OPS
                   and r.name != BARRIER for r in later):
                return reader
        return None

    def copy_over_barrier(self, op: ir.Operation, chain: list[ir.Operation], leaves: list[ir.Value],
                          reader: ir.Operation, value: ir.Value | None = None) -> int:
        """A copy of ``chain`` over a barrier of ``leaves`` for ``reader``
        (no chain: ``value`` read as a reshape of the one leaf)."""
        value = op.results[0] if value is None else value
        with ir.InsertionPoint(reader), op.location:
            barrier = ir.Operation.create(BARRIER, results=[leaf.type for leaf in leaves], operands=leaves)
            mapping = {leaf: barrier.results[i] for i, leaf in enumerate(leaves)}
            if chain:
                replacement = _clone_chain(chain, mapping, value)
            else:
                replacement = ir.Operation.create("stablehlo.reshape", results=[value.type],
                                                  operands=[barrier.results[0]]).results[0]
        for index, operand in enumerate(reader.operands):
            if operand == value:
                reader.operands[index] = replacement
        return max(len(chain), 1)

    def copy_in_case(self, op: ir.Operation, chain: list[ir.Operation], leaves: list[ir.Value],
                     group: list[ir.Operation]) -> int:
        """A copy of ``chain`` in a two-branch ``case`` for ``group``."""
        del leaves  # read from the branches directly
        first = group[0]
        value = op.results[0]
        probe = self.probe(first, value)
        if probe is None:
            return 0
        with ir.InsertionPoint(first), op.location:
            index = _zero_unless_nan(probe)
            guarded = ir.Operation.create("stablehlo.case", results=[value.type], operands=[index], regions=2)
            for region in guarded.regions:
                branch = region.blocks.append()
                with ir.InsertionPoint(branch):
                    ir.Operation.create("stablehlo.return", operands=[_clone_chain(chain, {}, value)])
        replacement = guarded.results[0]
        for reader in group:
            for index, operand in enumerate(reader.operands):
                if operand == value:
                    reader.operands[index] = replacement
        return len(chain)

    def probe(self, reader: ir.Operation, value: ir.Value) -> ir.Value | None:
        """The value the copy waits for: the operand of ``reader`` other
        than ``value`` defined last in the block (None: there is none)."""
        best: ir.Value | None = None
        best_position = -1
        for operand in reader.operands:
            owner = _owner(operand)
            if operand == value or owner is None or owner not in self.position or not _probeable(operand):
                continue
            if self.position[owner] > best_position:
                best, best_position = operand, self.position[owner]
        return best


def _byte_size(tensor_type: ir.RankedTensorType) -> int | None:
    """The bytes of a tensor of ``tensor_type`` (sub-byte elements round
    up to a byte, as XLA stores them), or None for a dynamic shape or an
    element type of no known width."""
    if not tensor_type.has_static_shape:
        return None
    element = tensor_type.element_type
    if isinstance(element, ir.ComplexType):
        bits = 2 * ir.FloatType(element.element_type).width
    elif isinstance(element, ir.FloatType):
        bits = element.width
    elif isinstance(element, ir.IntegerType):
        bits = element.width
    else:
        return None  # an element type of unknown width: not counted as small
    count = 1
    for extent in tensor_type.shape:
        count *= int(extent)
    return count * max(1, (int(bits) + 7) // 8)


def _clone_chain(chain: list[ir.Operation], mapping: dict[ir.Value, ir.Value], value: ir.Value) -> ir.Value:
    """Copies of ``chain``'s ops at the insertion point, reading
    ``mapping``'s values for the originals it names; the copy of ``value``."""
    for original in chain:
        operands = [mapping.get(operand, operand) for operand in original.operands]
        clone = ir.Operation.create(original.name, results=[original.results[0].type], operands=operands,
                                    attributes={key: original.attributes[key] for key in original.attributes})
        mapping[original.results[0]] = clone.results[0]
    return mapping[value]


def _constant_like(value: ir.Value) -> bool:
    """A constant, or a shape op's result of one (a broadcast exponent)."""
    owner = _owner(value)
    if owner is None:
        return False
    if owner.name == "stablehlo.constant":
        return True
    return owner.name in SHAPE_OPS and _constant_like(owner.operands[0])


def _expensive(op: ir.Operation) -> bool:
    """An op XLA does not duplicate into several fusions (a power by a
    constant is multiplications to XLA)."""
    if op.name == "stablehlo.power":
        return not _constant_like(op.operands[1])
    return op.name in EXPENSIVE


def _worth_fusing(op: ir.Operation, chain: list[ir.Operation]) -> bool:
    """Whether XLA would keep ``op``'s value in a buffer for elementwise
    readers: a chain with an op it does not duplicate, or an argument's
    broadcast (shared, it is materialized at full size)."""
    if any(_expensive(o) for o in chain):
        return True
    return op.name == "stablehlo.broadcast_in_dim" and _owner(op.operands[0]) is None


def _shaped_argument(value: ir.Value) -> bool:
    """Whether a shape op defines ``value`` from a function argument (a
    weight broadcast to an activation's shape): copied, not read."""
    owner = _owner(value)
    return owner is not None and owner.name in SHAPE_OPS and _owner(owner.operands[0]) is None


def _single_user(op: ir.Operation, name: str) -> ir.Operation | None:
    """The one op reading ``op``'s one result, if it is a ``name``."""
    if len(op.results) != 1:
        return None
    users = {use.owner.operation if isinstance(use.owner, ir.OpView) else use.owner for use in op.results[0].uses}
    if len(users) != 1:
        return None
    user = next(iter(users))
    return user if user.name == name else None


def _is_probe(op: ir.Operation) -> bool:
    """Whether ``op`` is the ``slice`` of a case index this pass built."""
    chain = ["stablehlo.reshape", "stablehlo.compare", "stablehlo.convert", "stablehlo.case"]
    current: ir.Operation | None = op if op.name == "stablehlo.slice" else None
    for name in chain:
        if current is None:
            return False
        current = _single_user(current, name)
    return current is not None


def _probeable(value: ir.Value) -> bool:
    """A static, non-empty tensor of floats or integers (one element is read)."""
    if not isinstance(value.type, ir.RankedTensorType):
        return False
    tensor_type = ir.RankedTensorType(value.type)
    if not tensor_type.has_static_shape or any(d == 0 for d in tensor_type.shape):
        return False
    element = tensor_type.element_type
    return isinstance(element, (ir.IntegerType, ir.FloatType))


def _zero_unless_nan(value: ir.Value) -> ir.Value:
    """``value[0, ..., 0] != value[0, ..., 0]`` as a scalar ``i32``: 0, or
    1 where that element is NaN."""
    tensor_type = ir.RankedTensorType(value.type)
    rank = tensor_type.rank
    element = ir.Operation.create(
        "stablehlo.slice", results=[ir.RankedTensorType.get([1] * rank, tensor_type.element_type)],
        operands=[value], attributes={
            "start_indices": ir.DenseI64ArrayAttr.get([0] * rank),
            "limit_indices": ir.DenseI64ArrayAttr.get([1] * rank),
            "strides": ir.DenseI64ArrayAttr.get([1] * rank)}).results[0]
    scalar = ir.Operation.create("stablehlo.reshape", results=[ir.RankedTensorType.get([], tensor_type.element_type)],
                                 operands=[element]).results[0]
    i1 = ir.RankedTensorType.get([], ir.IntegerType.get_signless(1))
    differs = ir.Operation.create(
        "stablehlo.compare", results=[i1], operands=[scalar, scalar],
        attributes={"comparison_direction": ir.Attribute.parse("#stablehlo<comparison_direction NE>")},
    ).results[0]
    i32 = ir.RankedTensorType.get([], ir.IntegerType.get_signless(32))
    return ir.Operation.create("stablehlo.convert", results=[i32], operands=[differs]).results[0]
