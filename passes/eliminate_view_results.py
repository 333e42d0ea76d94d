"""``eliminate-view-results``: results that PyTorch would return as views of
an argument or of another result are taken out of ``@main`` and recorded so
the runtime can rebuild them as real views, at zero device memory.

Also removed: pass-through results (an argument returned unchanged),
duplicates (one value returned twice) and results named dead by the caller.
Identity views (full slices, same-type reshapes and bitcasts, identity
transposes and broadcasts) are folded everywhere first, since
``canonicalize`` leaves them.

Correctness before memory: a view of the *old* value of an argument the
program overwrites (it has a mutation result, ``tf.aliasing_output`` or
``jax.buffer_donor``) stays a real result, because that storage will hold
something else after the call."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite
from torch_mlir.dialects import func

from hloalias import attributes as A
from hloalias.contract import RemovedResult, Signature, verify
from hloalias.errors import PassError
from hloalias.mlir import (
    find_main,
    ranked_tensor,
    result_attr_dicts,
    return_op,
    set_result_attr_dicts,
)
from hloalias.passes.base import ModuleLike, ModulePass, as_module_like
from hloalias.passes.view_layout import VIEW_OPS, Layout, apply_view_op, describe_view_op

Removal = RemovedResult
"""A removed result's record (:class:`hloalias.contract.RemovedResult`)."""


@dataclasses.dataclass(frozen=True)
class ViewReport:
    """Removed results (in order) and the keys of the results kept.  From a
    pass run: what that run removed.  From :meth:`from_module`: every removal
    the module records, i.e. the effect of all runs together."""

    removed: tuple[Removal, ...]
    kept: tuple[str, ...]
    notes: tuple[str, ...] = ()  # why results that are views were kept

    @staticmethod
    def from_module(module: ModuleLike) -> ViewReport:
        """The report of a module's final state, from its IR records."""
        module = as_module_like(module)
        with module.context:
            main = find_main(module)
            signature = verify(main)
            notes = _mesh_view_notes(main, signature)
        return ViewReport(signature.removed, signature.keys, notes)

    def to_text(self) -> str:
        """The report as people read it."""
        lines = [f"{EliminateViewResults.name}: {len(self.removed)} results removed"]
        for removal in self.removed:
            if removal.base is None:
                lines.append(f"  {removal.key}: removed ({removal.reason})")
            else:
                chain = " -> ".join(removal.chain) or "itself"
                lines.append(
                    f"  {removal.key}: rebuilt as a view of {removal.base} ({removal.reason}: {chain})"
                )
        lines.append(f"  kept on device: {', '.join(self.kept) or 'nothing'}")
        lines.extend(f"  {note}" for note in self.notes)
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class EliminateViewResults(ModulePass[ViewReport]):
    """Remove view, pass-through, duplicate and dead results from ``@main``."""

    name: ClassVar[str] = "eliminate-view-results"

    dead_results: tuple[int, ...] = dataclasses.field(
        default=(),
        metadata={
            "help": "positions of @main's results the caller will not use; they are "
            "removed and what only they needed is erased (mutation results cannot be dead)"
        },
    )

    def apply(self, module: ModuleLike) -> ViewReport:
        """Rewrite ``module``'s ``@main`` in place; return this run's removals.
        Raises :class:`PassError` for a bad option and :class:`IRError` for
        a module that breaks the IR contract (checked on entry and exit)."""
        module = as_module_like(module)
        with module.context, ir.Location.unknown():
            main = find_main(module)
            signature = _Signature.read(main)
            dead = self._check_dead(signature)
            _fold_identity_views(module)
            signature = _Signature.read(main)  # folding can change returned values
            removals = _plan(signature, dead)
            _rewrite_results(main, signature, removals)
            _erase_trivially_dead(module)
            final = verify(main)
            kept = tuple(k for k in signature.keys if k not in {r.key for r in removals})
            return ViewReport(tuple(removals), kept, _mesh_view_notes(main, final))

    def _check_dead(self, signature: _Signature) -> set[int]:
        count = len(signature.values)
        dead = set()
        for position in self.dead_results:
            if not 0 <= position < count:
                raise PassError(
                    f"{self.name}: dead-results names result {position}, but @main has {count} results"
                )
            if position in dead:
                raise PassError(f"{self.name}: dead-results names result {position} twice")
            if position in signature.aliased_by:
                arg = signature.aliased_by[position]
                raise PassError(
                    f"{self.name}: result {position} is aliased by argument {arg} "
                    f"('{signature.arg_names[arg]}') and cannot be dead"
                )
            mutated = signature.mutates[position]
            if mutated is not None:
                arg = mutated
                raise PassError(
                    f"{self.name}: result {position} is the new value of mutated argument "
                    f"{arg} ('{signature.arg_names[arg]}') and cannot be dead"
                )
            key = signature.keys[position]
            if key in signature.recorded_bases:
                raise PassError(
                    f"{self.name}: result {position} ({key}) cannot be dead: an earlier run "
                    f"recorded it as the base of {signature.recorded_bases[key]}"
                )
            dead.add(position)
        return dead


@dataclasses.dataclass
class _Signature:
    """@main's results and arguments as the pass sees them."""

    main: func.FuncOp
    contract: Signature
    values: list[ir.Value]
    keys: list[str]
    mutates: list[int | None]
    arg_names: list[str]
    overwritten: set[int]
    aliased_by: dict[int, int]  # result position -> argument whose buffer holds it
    storage: list[str | None]  # eager storage class per result (hloalias.storage)
    recorded_bases: dict[str, str]  # kept key -> a removed result recorded on it
    on_mesh: set[int]  # state arguments placed by mhlo.sharding: no host storage

    def storage_of_base(self, base_key: str) -> str | None:
        """The eager storage class a view of ``base_key`` would have."""
        kind, index = A.parse_key(base_key)
        if kind in ("arg", "mutation"):
            return A.arg_key(index)
        return self.storage[self.keys.index(base_key)]

    @staticmethod
    def read(main: func.FuncOp) -> _Signature:
        contract = verify(main)
        values = list(return_op(main).operands)
        for position, value in enumerate(values):
            ranked_tensor(value.type, f"result {position} of @main")
        keys = list(contract.keys)
        mutates = [r.mutates for r in contract.results]
        arg_names = [a.display_name(i) for i, a in enumerate(contract.args)]
        overwritten = {arg for arg in mutates if arg is not None}
        aliased_by: dict[int, int] = {}
        for index, arg in enumerate(contract.args):
            if arg.overwritten:
                overwritten.add(index)
            if arg.aliasing_output is not None:
                aliased_by[arg.aliasing_output] = index
        storage = [r.storage for r in contract.results]
        recorded_bases = {
            r.base: r.key for r in contract.removed if r.base is not None and r.base in keys
        }
        return _Signature(
            main, contract, values, keys, mutates, arg_names, overwritten, aliased_by,
            storage, recorded_bases, _state_on_mesh(contract),
        )


def _state_on_mesh(contract: Signature) -> set[int]:
    """Module-state arguments placed on a device mesh (``mhlo.sharding``):
    they live in shards on the devices, so the host has no storage a view
    of them could share.  (A user input's base is the caller's tensor.)"""
    return {
        index for index, arg in enumerate(contract.args)
        if arg.sharding is not None and arg.kind not in (None, "user_input")
    }


def _mesh_view_notes(main: func.FuncOp, contract: Signature) -> tuple[str, ...]:
    """For each kept result that views state on a device mesh: why it stayed."""
    on_mesh = _state_on_mesh(contract)
    if not on_mesh:
        return ()
    notes = []
    for position, value in enumerate(return_op(main).operands):
        if contract.results[position].mutates is not None:
            continue
        while not isinstance(value, ir.BlockArgument) and value.owner.name in VIEW_OPS:
            value = value.owner.operands[0]
        if isinstance(value, ir.BlockArgument) and ir.BlockArgument(value).arg_number in on_mesh:
            arg = ir.BlockArgument(value).arg_number
            notes.append(
                f"{contract.keys[position]}: kept on the devices: it views state "
                f"'{contract.args[arg].display_name(arg)}', which lives in shards on the mesh "
                "(no host storage to view)"
            )
    return tuple(notes)


# -- identity folding ------------------------------------------------------

def fold_identity_slice(op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
    """``slice`` over the whole operand with unit strides is its operand."""
    source = ir.RankedTensorType(op.operands[0].type)
    starts = ir.DenseI64ArrayAttr(op.attributes["start_indices"])
    limits = ir.DenseI64ArrayAttr(op.attributes["limit_indices"])
    steps = ir.DenseI64ArrayAttr(op.attributes["strides"])
    if any(s != 0 for s in starts) or any(s != 1 for s in steps):
        return True
    if list(limits) != list(source.shape):
        return True
    rewriter.replace_op(op, [op.operands[0]])
    return False


def fold_same_type_view(op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
    """``reshape``/``bitcast_convert`` to the operand's own type is the operand."""
    if op.operands[0].type != op.results[0].type:
        return True
    rewriter.replace_op(op, [op.operands[0]])
    return False


def fold_identity_transpose(op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
    """``transpose`` by the identity permutation is its operand."""
    permutation = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
    if permutation != list(range(len(permutation))):
        return True
    rewriter.replace_op(op, [op.operands[0]])
    return False


def fold_identity_broadcast(op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
    """``broadcast_in_dim`` to the same type with in-order dims is its operand."""
    dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    if op.operands[0].type != op.results[0].type or dims != list(range(len(dims))):
        return True
    rewriter.replace_op(op, [op.operands[0]])
    return False


def _fold_identity_views(module: ir.Module) -> None:
    patterns = rewrite.RewritePatternSet()
    patterns.add("stablehlo.slice", fold_identity_slice)
    patterns.add("stablehlo.reshape", fold_same_type_view)
    patterns.add("stablehlo.bitcast_convert", fold_same_type_view)
    patterns.add("stablehlo.transpose", fold_identity_transpose)
    patterns.add("stablehlo.broadcast_in_dim", fold_identity_broadcast)
    rewrite.apply_patterns_and_fold_greedily(module.operation, patterns.freeze())


# -- planning --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Kept:
    pass


_KEEP = _Kept()


def _plan(signature: _Signature, dead: set[int]) -> list[Removal]:
    """Decide, for every result, whether it stays or how it is rebuilt."""
    values = signature.values
    live = [p for p in range(len(values)) if p not in dead]
    decisions: dict[int, Removal | _Kept] = {}

    def result_at(value: ir.Value, before: int | None, wanted: str | None) -> int | None:
        """The first live result returning ``value`` (before ``before``)
        whose eager storage class is ``wanted`` (any when unknown)."""
        for position in live:
            if before is not None and position >= before:
                break
            storage = signature.storage[position]
            if wanted is not None and storage is not None and storage != wanted:
                continue
            if values[position] == value:
                return position
        return None

    def decide(position: int) -> Removal | _Kept:
        if position in decisions:
            return decisions[position]
        value = values[position]
        key = signature.keys[position]
        earlier = result_at(value, before=position, wanted=signature.storage[position])
        if (
            position in signature.aliased_by
            or signature.mutates[position] is not None
            or key in signature.recorded_bases
        ):
            # XLA writes it into an argument's buffer, the runtime writes it
            # back into the mutated argument, or an earlier run rebuilds a
            # removed result from it: it must stay a result.
            decision: Removal | _Kept = _KEEP
        elif earlier is not None:
            decision = _rebase(key, A.REASON_DUPLICATE, earlier, decide(earlier), [])
        else:
            decision = walk(position, key, value)
        decision = same_storage(position, decision)
        decisions[position] = decision
        return decision

    def same_storage(position: int, decision: Removal | _Kept) -> Removal | _Kept:
        """Rebuild a result only from a base with its eager storage: two
        equal values are not one tensor (``x.clone()`` is not ``x``)."""
        if isinstance(decision, _Kept) or decision.base is None:
            return decision
        wanted = signature.storage[position]
        have = signature.storage_of_base(decision.base)
        if wanted is not None and have is not None and wanted != have:
            return _KEEP
        return decision

    def walk(position: int, key: str, value: ir.Value) -> Removal | _Kept:
        steps: list[ir.Operation] = []
        current = value
        while True:
            if steps:
                other = result_at(current, before=None, wanted=signature.storage[position])
                if other is not None:
                    return _rebase(key, A.REASON_VIEW, other, decide(other), steps)
            if isinstance(current, ir.BlockArgument):
                arg = ir.BlockArgument(current).arg_number
                if arg in signature.overwritten or arg in signature.on_mesh:
                    return _KEEP
                reason = A.REASON_VIEW if steps else A.REASON_PASS_THROUGH
                layout = _layout_through(Layout.contiguous(current.type), steps)
                if layout is None:
                    return _KEEP
                return Removal(key, reason, A.arg_key(arg), layout, _describe(steps))
            owner = current.owner
            if owner.name not in VIEW_OPS:
                return _KEEP
            steps.insert(0, owner.operation)
            current = owner.operands[0]

    def _rebase(
        key: str, reason: str, base_position: int, base: Removal | _Kept, steps: list[ir.Operation]
    ) -> Removal | _Kept:
        chain: tuple[str, ...]
        if isinstance(base, _Kept):
            start = Layout.contiguous(values[base_position].type)
            base_key, chain = signature.keys[base_position], ()
        else:
            assert base.layout is not None and base.base is not None
            start, base_key, chain = base.layout, base.base, base.chain
        layout = _layout_through(start, steps)
        if layout is None:
            return _KEEP
        return Removal(key, reason, base_key, layout, chain + _describe(steps))

    try:
        removals = [Removal(signature.keys[p], A.REASON_DEAD) for p in sorted(dead)]
        for position in live:
            decision = decide(position)
            if isinstance(decision, Removal):
                removals.append(decision)
        return removals
    finally:
        # decide and walk reach themselves through their closure cells: a
        # reference cycle holding ``signature``, so @main, its module and
        # the module's MLIR context, until a collection finds it.  Emptied
        # cells leave nothing for the collector.
        del result_at, decide, same_storage, walk, _rebase


def _layout_through(layout: Layout | None, steps: list[ir.Operation]) -> Layout | None:
    for op in steps:
        if layout is None:
            return None
        layout = apply_view_op(layout, op)
    return layout


def _describe(steps: list[ir.Operation]) -> tuple[str, ...]:
    return tuple(describe_view_op(op) for op in steps)


# -- rewriting -------------------------------------------------------------

def _rewrite_results(main: func.FuncOp, signature: _Signature, removals: list[Removal]) -> None:
    removed_keys = {r.key for r in removals}
    keep = [p for p, key in enumerate(signature.keys) if key not in removed_keys]
    terminator = return_op(main)
    new_values = [signature.values[p] for p in keep]
    # Attributes outside the contract travel with their result.
    old_attrs = result_attr_dicts(main)
    with ir.InsertionPoint(terminator):
        func.ReturnOp(new_values, loc=terminator.location)
    terminator.erase()
    function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    main.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(function_type.inputs, [v.type for v in new_values])
    )
    set_result_attr_dicts(main, [old_attrs[p] for p in keep])
    contract = signature.contract
    # Aliasing indices name positions, which shift as results leave.
    new_position = {old: new for new, old in enumerate(keep)}
    args = tuple(
        arg if arg.aliasing_output is None
        else dataclasses.replace(arg, aliasing_output=new_position[arg.aliasing_output])
        for arg in contract.args
    )
    # Written back canonically (role and output number on every result), so
    # positions can change without changing which output a result is.
    dataclasses.replace(
        contract,
        args=args,
        results=tuple(contract.results[p] for p in keep),
        removed=contract.removed + tuple(removals),
    ).write(main)


def _erase_trivially_dead(module: ir.Module) -> None:
    """Erase what only removed results needed, through MLIR's greedy driver:
    it erases an op only when its side-effect interfaces say it is trivially
    dead (a ``case`` whose branch has a ``custom_call`` stays)."""
    rewrite.apply_patterns_and_fold_greedily(module.operation, rewrite.RewritePatternSet().freeze())
