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
something else after the call.  On a device mesh, a view of module state
placed by ``mhlo.sharding`` stays a result too: the state lives in shards
on the devices, and the host has no storage it could be a view of."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir, rewrite
from torch_mlir.dialects import func

from hloalias import attributes as A
from hloalias.errors import IRError, PassError
from hloalias.mlir import (
    arg_attr_dicts,
    body_ops,
    bool_attr,
    find_main,
    int_attr,
    ranked_tensor,
    result_attr_dicts,
    result_key,
    return_op,
    set_arg_attr_dicts,
    set_result_attr_dicts,
    string_attr,
)
from hloalias.passes.base import ModulePass, as_module_like
from hloalias.passes.view_layout import VIEW_OPS, Layout, apply_view_op, describe_view_op

_PURE_DIALECT_PREFIXES = ("stablehlo.", "chlo.", "arith.constant")

# Ops of those dialects with effects beyond their results: never erased.
_EFFECTFUL_OPS = frozenset(
    {
        "stablehlo.custom_call",
        "stablehlo.send",
        "stablehlo.recv",
        "stablehlo.infeed",
        "stablehlo.outfeed",
        "stablehlo.after_all",
        "stablehlo.all_reduce",
        "stablehlo.all_gather",
        "stablehlo.all_to_all",
        "stablehlo.reduce_scatter",
        "stablehlo.collective_permute",
        "stablehlo.collective_broadcast",
        "stablehlo.optimization_barrier",
        "func.call",
    }
)


@dataclasses.dataclass(frozen=True)
class Removal:
    """Why a result left ``@main`` and how to rebuild it (None for dead)."""

    key: str
    reason: str
    base: str | None = None
    layout: Layout | None = None
    chain: tuple[str, ...] = ()

    def to_attr(self) -> ir.Attribute:
        entries: dict[str, ir.Attribute] = {
            "result": ir.StringAttr.get(self.key),
            "reason": ir.StringAttr.get(self.reason),
        }
        if self.base is not None and self.layout is not None:
            entries["base"] = ir.StringAttr.get(self.base)
            entries["dtype"] = ir.TypeAttr.get(self.layout.element_type)
            entries["sizes"] = ir.DenseI64ArrayAttr.get(list(self.layout.sizes))
            entries["strides"] = ir.DenseI64ArrayAttr.get(list(self.layout.strides))
            entries["offset"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), self.layout.offset)
            entries["chain"] = ir.ArrayAttr.get([ir.StringAttr.get(c) for c in self.chain])
        return ir.DictAttr.get(entries)


@dataclasses.dataclass(frozen=True)
class ViewReport:
    """What one run removed (in order) and what it kept."""

    removed: tuple[Removal, ...]
    kept: tuple[str, ...]
    notes: tuple[str, ...] = ()  # why results that look like views were kept


@dataclasses.dataclass(frozen=True)
class EliminateViewResults(ModulePass):
    """Remove view, pass-through, duplicate and dead results from ``@main``."""

    name: ClassVar[str] = "eliminate-view-results"

    dead_results: tuple[int, ...] = dataclasses.field(
        default=(),
        metadata={
            "help": "positions of @main's results the caller will not use; they are "
            "removed and what only they needed is erased (mutation results cannot be dead)"
        },
    )

    def apply(self, module: ir.Module) -> ViewReport:  # type: ignore[override]
        """Rewrite ``module``'s ``@main`` in place; return the removals.
        Raises :class:`PassError` for a bad option or a malformed signature."""
        module = as_module_like(module)
        with module.context, ir.Location.unknown():
            main = find_main(module)
            signature = _Signature.read(main)
            dead = self._check_dead(signature)
            _fold_identity_views(module)
            signature = _Signature.read(main)  # folding can change returned values
            notes: list[str] = []
            removals = _plan(signature, dead, notes)
            _rewrite_results(main, signature, removals)
            _erase_dead_code(main)
            kept = tuple(k for k in signature.keys if k not in {r.key for r in removals})
            return ViewReport(tuple(removals), kept, tuple(notes))

    def _check_dead(self, signature: "_Signature") -> set[int]:
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
            dead.add(position)
        return dead


@dataclasses.dataclass
class _Signature:
    """@main's results and arguments as the pass sees them."""

    main: func.FuncOp
    values: list[ir.Value]
    keys: list[str]
    mutates: list[int | None]
    result_attrs: list[dict[str, ir.Attribute]]
    arg_names: list[str]
    overwritten: set[int]
    aliased_by: dict[int, int]  # result position -> argument whose buffer holds it
    arg_attrs: list[dict[str, ir.Attribute]]
    storage: list[str | None]  # eager storage class per result (hloalias.storage)
    on_mesh: set[int]  # state arguments placed by mhlo.sharding: no host storage

    def storage_of_base(self, base_key: str) -> str | None:
        """The eager storage class a view of ``base_key`` would have."""
        kind, index = A.parse_key(base_key)
        if kind in ("arg", "mutation"):
            return A.arg_key(index)
        return self.storage[self.keys.index(base_key)]

    @staticmethod
    def read(main: func.FuncOp) -> "_Signature":
        values = list(return_op(main).operands)
        for position, value in enumerate(values):
            ranked_tensor(value.type, f"result {position} of @main")
        result_attrs = result_attr_dicts(main)
        arg_attrs = arg_attr_dicts(main)
        keys: list[str] = []
        mutates: list[int | None] = []
        for position, attrs in enumerate(result_attrs):
            key, arg = result_key(attrs, position, len(arg_attrs))
            if A.RESULT_ROLE not in attrs:
                # Write the implied role down: positions change as results leave.
                attrs[A.RESULT_ROLE] = ir.StringAttr.get(A.ROLE_USER_OUTPUT)
                attrs[A.RESULT_OUTPUT] = _i64(position)
            keys.append(key)
            mutates.append(arg)
        if len(set(keys)) != len(keys):
            raise IRError(f"@main's results name the same output twice: {keys}")
        arg_names = [
            string_attr(attrs, A.ARG_NAME) or f"arg{i}" for i, attrs in enumerate(arg_attrs)
        ]
        overwritten = {arg for arg in mutates if arg is not None}
        aliased_by: dict[int, int] = {}
        for index, attrs in enumerate(arg_attrs):
            if A.ALIASING_OUTPUT in attrs or bool_attr(attrs, A.BUFFER_DONOR):
                overwritten.add(index)
            target = int_attr(attrs, A.ALIASING_OUTPUT)
            if target is not None:
                if not 0 <= target < len(values):
                    raise IRError(
                        f"argument {index} ('{arg_names[index]}'): {A.ALIASING_OUTPUT} = {target} "
                        f"is out of range; @main has {len(values)} results"
                    )
                aliased_by[target] = index
        storage = [string_attr(attrs, A.RESULT_STORAGE) for attrs in result_attrs]
        on_mesh = {
            index for index, attrs in enumerate(arg_attrs)
            if A.SHARDING in attrs and string_attr(attrs, A.ARG_KIND) != "user_input"
        }
        return _Signature(
            main, values, keys, mutates, result_attrs, arg_names, overwritten, aliased_by,
            arg_attrs, storage, on_mesh,
        )


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


def _plan(signature: _Signature, dead: set[int], notes: list[str]) -> list[Removal]:
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
        if position in signature.aliased_by or signature.mutates[position] is not None:
            # XLA writes it into an argument's buffer, or the runtime writes
            # it back into the mutated argument: it must stay a result.
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
                if arg in signature.overwritten:
                    return _KEEP
                if arg in signature.on_mesh:
                    notes.append(
                        f"{key}: kept on the devices: it views state '{signature.arg_names[arg]}', "
                        "which lives in shards on the mesh (no host storage to view)"
                    )
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

    removals = [Removal(signature.keys[p], A.REASON_DEAD) for p in sorted(dead)]
    for position in live:
        decision = decide(position)
        if isinstance(decision, Removal):
            removals.append(decision)
    return removals


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
    with ir.InsertionPoint(terminator):
        func.ReturnOp(new_values, loc=terminator.location)
    terminator.erase()
    function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    main.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(function_type.inputs, [v.type for v in new_values])
    )
    set_result_attr_dicts(main, [signature.result_attrs[p] for p in keep])
    # Aliasing indices name positions, which shift as results leave.
    new_position = {old: new for new, old in enumerate(keep)}
    for attrs in signature.arg_attrs:
        target = int_attr(attrs, A.ALIASING_OUTPUT)
        if target is not None and target != new_position[target]:
            attrs[A.ALIASING_OUTPUT] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), new_position[target])
    set_arg_attr_dicts(main, signature.arg_attrs)
    if removals:
        existing = list(ir.ArrayAttr(main.attributes[A.REMOVED_RESULTS])) if A.REMOVED_RESULTS in main.attributes else []
        main.attributes[A.REMOVED_RESULTS] = ir.ArrayAttr.get(existing + [r.to_attr() for r in removals])


def _erase_dead_code(main: func.FuncOp) -> None:
    for op in reversed(body_ops(main)):
        # Only ops whose dialects we know are pure; anything else may have
        # effects MLIR cannot see (unregistered ops never are erased upstream).
        if not op.name.startswith(_PURE_DIALECT_PREFIXES) or op.name in _EFFECTFUL_OPS:
            continue
        if not len(op.results):
            continue
        if all(not _has_uses(result) for result in op.results):
            op.erase()


def _has_uses(value: ir.Value) -> bool:
    for _ in value.uses:
        return True
    return False


def _i64(value: int) -> ir.IntegerAttr:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
