"""``recompute-shared-activations``: a ``tanh`` or ``logistic`` read by
several ops is recomputed for each reader after the first, from its operand
behind a ``stablehlo.optimization_barrier``.

A training step captured as one program (forward, backward and optimizer:
``compile_training_step``) reads an activation's value twice: the forward
computes the layer's output from it, and the backward reads it again for
the derivative (GPT-2's ``gelu_new`` is ``0.5 x (1 + tanh(y))`` and
``tanh``'s backward is ``g (1 - t^2)``; SiLU's is ``x * logistic(x)``).
XLA does not duplicate a transcendental op into several fusions, so it
computes the activation into its own buffer, which stays alive from the
forward to the backward: on the tiny GPT-2 of ``bench/training.py`` two
``f32[256,512]`` ``tanh`` buffers are alive at the backward's start.  With a
copy of the op for each later reader, every copy has one reader and XLA
fuses it into that reader's loop (the backward's recomputes ``tanh`` from
``y``, which is an elementwise function of a value the backward keeps
anyway); the barrier stops XLA's CSE from merging the copies back.

Applies to every ``stablehlo.tanh`` and ``stablehlo.logistic``, and every
elementwise value computed from one through at most two more elementwise
ops (``1 + tanh(y)``), whose result has more than one reader in its block
(a reader is counted once however many of its operands it is); the first
reader in block order keeps the original, each other gets a copy of the
chain over ``optimization_barrier(operand)`` of the activation's operand,
inserted just before it (the chain's other operands are shared).
Never applies to an op with one reader, to a returned value (its output
buffer holds it anyway), nor to a copy it made (its operand is a barrier's
result).  Exact: each copy computes the same op on the same
value, so every reader reads the same bits."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir

from hloalias.passes.base import ModuleLike, ModulePass, as_module_like, verify_contract
from hloalias.passes.elementwise_in_producer_shape import ELEMENTWISE

RECOMPUTED = frozenset({"stablehlo.tanh", "stablehlo.logistic"})
BARRIER = "stablehlo.optimization_barrier"
#: How many elementwise ops above the activation a recomputed value may be
#: (GPT-2's backward reads ``1 + tanh(y)``: one).
DEPTH = 2


@dataclasses.dataclass(frozen=True)
class RecomputeReport:
    """How many activations got copies, and how many copies."""

    activations: int
    copies: int

    def to_text(self) -> str:
        """The report as people read it."""
        return (f"recompute-shared-activations: {self.copies} copies of {self.activations} "
                "activations recomputed for their later readers")


@dataclasses.dataclass(frozen=True)
class RecomputeSharedActivations(ModulePass[RecomputeReport]):
    """Recompute a shared ``tanh``/``logistic`` for each reader after the first."""

    name: ClassVar[str] = "recompute-shared-activations"

    def apply(self, module: ModuleLike) -> RecomputeReport:
        """Give each later reader of every eligible activation its own copy."""
        module = as_module_like(module)
        verify_contract(module)
        activations = copies = 0
        with module.context, ir.Location.unknown():
            for top in module.body.operations:
                if top.operation.name != "func.func":
                    continue
                for region in top.operation.regions:
                    for block in region.blocks:
                        for op in list(block.operations):
                            made = _recompute(op.operation, block)
                            if made:
                                activations += 1
                                copies += made
        verify_contract(module)
        return RecomputeReport(activations, copies)


def _readers(op: ir.Operation, block: ir.Block) -> list[ir.Operation]:
    """The ops of ``block`` reading ``op``'s result, in block order, each once."""
    reading = {use.owner for use in op.results[0].uses}
    return [other.operation for other in block.operations if other.operation in reading]


def _owner(value: ir.Value) -> ir.Operation | None:
    owner = value.owner
    return owner.operation if isinstance(owner, (ir.OpView, ir.Operation)) else None


def _path_to_activation(op: ir.Operation, depth: int) -> list[ir.Operation] | None:
    """``op`` and the elementwise ops under it down to a ``tanh`` or
    ``logistic`` (top first; at most ``depth`` ops above it), or None."""
    if op.name in RECOMPUTED:
        below = _owner(op.operands[0])
        return None if below is not None and below.name == BARRIER else [op]
    if op.name not in ELEMENTWISE or depth == 0 or len(op.results) != 1:
        return None
    for operand in op.operands:
        below = _owner(operand)
        if below is not None and below.block == op.block:
            path = _path_to_activation(below, depth - 1)
            if path is not None:
                return [op, *path]
    return None


def _recompute(op: ir.Operation, block: ir.Block) -> int:
    """Copies made for ``op``'s readers after the first (0: not eligible)."""
    if len(op.results) != 1:
        return 0
    path = _path_to_activation(op, DEPTH)
    if path is None:
        return 0
    readers = _readers(op, block)
    if len(readers) != len({use.owner for use in op.results[0].uses}):
        return 0  # a reader in a nested region: left as it is
    if len(readers) < 2 or any(reader.name == "func.return" for reader in readers):
        return 0  # a returned value stays in its output buffer: a copy saves nothing
    for reader in readers[1:]:
        with ir.InsertionPoint(reader), op.location:
            activation = path[-1]
            operand = activation.operands[0]
            below = ir.Operation.create(BARRIER, results=[operand.type], operands=[operand]).results[0]
            child: ir.Operation | None = None
            for original in reversed(path):
                operands = [below] if child is None else [
                    below if value == child.results[0] else value for value in original.operands
                ]
                below = ir.Operation.create(original.name, results=[original.results[0].type], operands=operands,
                                            attributes={key: original.attributes[key] for key in original.attributes}).results[0]
                child = original
        for index, value in enumerate(reader.operands):
            if value == op.results[0]:
                reader.operands[index] = below
    return len(readers) - 1
