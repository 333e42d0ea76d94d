"""``alias-donated-buffers``: decide which arguments' buffers XLA may reuse
for which results, combining inferred donors (arguments the program mutates)
with explicit donors (the caller's), and explain every decision.

The rule, in one place (after JAX's ``_set_up_aliases``):

1. Aliases already in the IR (``tf.aliasing_output``) are validated and kept.
2. Inferred: an argument whose new value is result R aliases R when their
   types are identical.
3. Explicit: each remaining explicit donor, in argument order, aliases the
   first result (in result order) of identical type not yet aliased; one
   with no partner keeps ``jax.buffer_donor = true`` so XLA may still reuse
   it for any output of its size.
4. Never: an argument of an excluded kind, or one whose old value the
   runtime still needs after the call: the base of a rebuilt view, or an
   argument returned unchanged (a removed pass-through result).
5. On a device mesh, an argument and a result are partners only when their
   ``mhlo.sharding`` is the same (as torch_xla and JAX require): a buffer
   holds one shard, so it can only be reused for the same shard.  A result
   without a sharding is placed by the partitioner and is no partner of a
   sharded argument; an explicit donor left without a partner stays a
   ``jax.buffer_donor``, which XLA uses if the shardings turn out equal.

Both sources are a set union: an argument that is both counts once, with
origin ``"both"``."""

from __future__ import annotations

import dataclasses
import warnings
from typing import ClassVar

from torch_mlir import ir
from torch_mlir.dialects import func

from hloalias import attributes as A
from hloalias.contract import Signature, placement_text, verify
from hloalias.errors import PassError
from hloalias.mlir import find_main, ranked_tensor, tensor_bytes
from hloalias.passes.base import ModuleLike, ModulePass, as_module_like

ORIGIN_INFERRED = "inferred"
ORIGIN_EXPLICIT = "explicit"
ORIGIN_BOTH = "both"


@dataclasses.dataclass(frozen=True)
class Alias:
    """Argument ``arg_index``'s buffer holds result ``result_index``."""

    arg_index: int
    arg_name: str
    result_index: int
    bytes: int
    origin: str


@dataclasses.dataclass(frozen=True)
class UnusedDonation:
    """A donation that was not turned into an alias, and why."""

    arg_index: int
    arg_name: str
    origin: str
    reason: str
    kept_as_donor: bool


@dataclasses.dataclass(frozen=True)
class AliasReport:
    """Every alias made and every donation that could not be used."""

    aliases: tuple[Alias, ...]
    unused: tuple[UnusedDonation, ...]

    @property
    def bytes_saved(self) -> int:
        """Device bytes the aliases save (sum of aliased buffers)."""
        return sum(alias.bytes for alias in self.aliases)

    @staticmethod
    def from_module(module: ModuleLike) -> AliasReport:
        """The report of a module's final state, from its IR records
        (``tf.aliasing_output``, ``jax.buffer_donor``, ``hloalias.donation``,
        ``hloalias.unused_donation``): right after any pipeline."""
        module = as_module_like(module)
        with module.context:
            signature = verify(find_main(module))
        aliases = []
        unused = []
        for index, arg in enumerate(signature.args):
            name = arg.display_name(index)
            if arg.aliasing_output is not None:
                aliases.append(
                    Alias(
                        index, name, arg.aliasing_output, tensor_bytes(signature.arg_types[index]),
                        arg.donation or ORIGIN_EXPLICIT,
                    )
                )
            elif arg.unused_donation is not None or arg.buffer_donor:
                reason = arg.unused_donation or "no result was paired with it"
                unused.append(
                    UnusedDonation(index, name, arg.donation or ORIGIN_EXPLICIT, reason, arg.buffer_donor)
                )
        return AliasReport(tuple(aliases), tuple(unused))

    def to_text(self) -> str:
        """The report as people read it (also printed by ``hloalias-opt``)."""
        lines = [f"alias-donated-buffers: {len(self.aliases)} aliases, {self.bytes_saved} bytes saved"]
        for a in self.aliases:
            lines.append(
                f"  alias   arg {a.arg_index} '{a.arg_name}' -> result {a.result_index}"
                f"  {a.bytes} bytes  ({a.origin})"
            )
        for u in self.unused:
            kept = "; kept as jax.buffer_donor" if u.kept_as_donor else ""
            lines.append(f"  unused  arg {u.arg_index} '{u.arg_name}' ({u.origin}): {u.reason}{kept}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class AliasDonatedBuffers(ModulePass[AliasReport]):
    """Attach ``tf.aliasing_output`` / ``jax.buffer_donor`` to ``@main``'s arguments."""

    name: ClassVar[str] = "alias-donated-buffers"

    inferred: bool = dataclasses.field(
        default=True, metadata={"help": "alias each mutated argument to its new value"}
    )
    explicit: bool = dataclasses.field(
        default=True,
        metadata={"help": "honour explicit donors (the donate option and jax.buffer_donor in the IR)"},
    )
    donate: tuple[str, ...] = dataclasses.field(
        default=(), metadata={"help": "arguments to donate, by index or hloalias.name"}
    )
    exclude_kinds: tuple[str, ...] = dataclasses.field(
        default=(),
        metadata={"help": "argument kinds never donated: parameter, buffer, constant, user_input"},
    )

    def apply(self, module: ModuleLike) -> AliasReport:
        """Set the aliasing attributes on ``module``'s ``@main`` and return
        the report.  Raises :class:`PassError` for bad options or aliasing
        attributes that make no sense; the module is unchanged then.  Warns
        (``UserWarning``) when explicit donations could not be used."""
        module = as_module_like(module)
        with module.context, ir.Location.unknown():
            main = find_main(module)
            state = _State.read(main, self)
            report = state.decide(self)
            state.write(main, report)
            verify(main)
        unusable = [u for u in report.unused if u.origin != ORIGIN_INFERRED]
        if unusable:
            names = ", ".join(f"'{u.arg_name}' ({u.reason})" for u in unusable)
            warnings.warn(f"Some donated buffers were not usable: {names}", stacklevel=2)
        return report


@dataclasses.dataclass
class _State:
    contract: Signature
    arg_types: list[ir.Type]
    arg_names: list[str]
    arg_kinds: list[str | None]
    result_types: list[ir.Type]
    mutation_result: dict[int, int]  # arg -> result holding its new value
    existing: dict[int, int]  # arg -> result, from tf.aliasing_output
    existing_origin: dict[int, str]
    explicit: list[int]
    blocked: dict[int, str]  # arg -> why its buffer must survive the call
    aliases: dict[int, tuple[int, str]] = dataclasses.field(default_factory=dict)  # arg -> (result, origin)
    donors: set[int] = dataclasses.field(default_factory=set)  # explicit donors left unpaired

    @staticmethod
    def read(main: func.FuncOp, options: AliasDonatedBuffers) -> _State:
        contract = verify(main)
        arg_types = list(contract.arg_types)
        names = [a.display_name(i) for i, a in enumerate(contract.args)]
        kinds = [a.kind for a in contract.args]
        for kind in options.exclude_kinds:
            if kind not in A.ARG_KINDS:
                raise PassError(
                    f"{options.name}: exclude-kinds has unknown kind '{kind}' "
                    f"(kinds: {', '.join(A.ARG_KINDS)})"
                )
        result_types = list(contract.result_types)
        mutation_result: dict[int, int] = {
            r.mutates: position for position, r in enumerate(contract.results) if r.mutates is not None
        }

        existing: dict[int, int] = {}
        existing_origin: dict[int, str] = {}
        explicit: list[int] = []
        for index, arg in enumerate(contract.args):
            what = f"argument {index} ('{names[index]}')"
            alias = arg.aliasing_output
            if alias is not None or arg.buffer_donor:
                ranked_tensor(arg_types[index], what)
            if alias is not None:
                # Range, type and uniqueness are checked by verify().
                existing[index] = alias
                existing_origin[index] = arg.donation or ORIGIN_EXPLICIT
            # A donation an earlier run could not use stays requested, so a
            # rerun decides (and records) the same.
            offered = arg.buffer_donor or (
                arg.unused_donation is not None and arg.donation in (ORIGIN_EXPLICIT, ORIGIN_BOTH)
            )
            if offered and options.explicit:
                explicit.append(index)

        requested: set[int] = set()
        for request in options.donate:
            index = _resolve(request, names, options.name)
            if index in requested:
                raise PassError(f"{options.name}: argument {index} ('{names[index]}') is donated twice")
            requested.add(index)
        if options.explicit:
            explicit = sorted(set(explicit) | requested)

        blocked: dict[int, str] = {}
        for index, arg_kind in enumerate(kinds):
            if arg_kind is not None and arg_kind in options.exclude_kinds:
                blocked[index] = f"arguments of kind '{arg_kind}' are excluded from donation"
        # The runtime rebuilds removed results from an argument's buffer
        # after the call: that buffer must survive it.  (An argument still
        # returned by @main itself needs nothing: XLA copies if it must.)
        for record in contract.removed:
            if record.base is None:
                continue
            kind, index = A.parse_key(record.base)
            if kind != "arg":
                continue
            if record.reason == A.REASON_PASS_THROUGH:
                why = f"it is returned unchanged ({record.key}, rebuilt from its buffer after the call)"
            else:
                why = f"its old value is the base of rebuilt view {record.key}"
            blocked.setdefault(index, why)
        # Every argument that may be donated must have a static size.
        for index in sorted(set(mutation_result) | set(explicit) | set(existing)):
            ranked_tensor(arg_types[index], f"argument {index} ('{names[index]}')")
        for position in mutation_result.values():
            ranked_tensor(result_types[position], f"result {position} of @main")
        for index, alias in existing.items():
            if index in blocked:
                raise PassError(
                    f"argument {index} ('{names[index]}'): {A.ALIASING_OUTPUT} = {alias}, "
                    f"but {blocked[index]}"
                )
        return _State(
            contract, arg_types, names, kinds, result_types, mutation_result,
            existing, existing_origin, explicit, blocked,
        )

    def arg_sharding(self, arg: int) -> str | None:
        """Argument ``arg``'s ``mhlo.sharding`` (None on one device)."""
        return self.contract.args[arg].sharding

    def result_sharding(self, result: int) -> str | None:
        """Result ``result``'s ``mhlo.sharding`` (None: the partitioner's choice)."""
        return self.contract.results[result].sharding

    def decide(self, options: AliasDonatedBuffers) -> AliasReport:
        taken = {result: arg for arg, result in self.existing.items()}
        aliases = self.aliases
        aliases.update((arg, (result, self.existing_origin[arg])) for arg, result in self.existing.items())
        unused: list[UnusedDonation] = []
        explicit = set(self.explicit)

        def unusable(arg: int, origin: str, reason: str, keep: bool = False) -> None:
            unused.append(UnusedDonation(arg, self.arg_names[arg], origin, reason, keep))

        if options.inferred:
            for arg, result in sorted(self.mutation_result.items()):
                if arg in aliases:
                    continue
                origin = ORIGIN_BOTH if arg in explicit else ORIGIN_INFERRED
                if arg in self.blocked:
                    unusable(arg, origin, self.blocked[arg])
                elif result in taken:
                    unusable(arg, origin, f"result {result} is already aliased to argument {taken[result]}")
                elif self.arg_types[arg] != self.result_types[result]:
                    unusable(
                        arg, origin,
                        f"its new value (result {result}, {self.result_types[result]}) "
                        f"differs in type from {self.arg_types[arg]}",
                    )
                elif self.arg_sharding(arg) != self.result_sharding(result):
                    unusable(
                        arg, origin,
                        f"its new value (result {result}) is placed as "
                        f"{placement_text(self.result_sharding(result))}, the argument as "
                        f"{placement_text(self.arg_sharding(arg))}",
                    )
                else:
                    aliases[arg] = (result, origin)
                    taken[result] = arg

        for arg in self.explicit:
            if arg in aliases:
                if aliases[arg][1] == ORIGIN_INFERRED:
                    aliases[arg] = (aliases[arg][0], ORIGIN_BOTH)
                continue
            if any(u.arg_index == arg for u in unused):
                continue
            if arg in self.blocked:
                unusable(arg, ORIGIN_EXPLICIT, self.blocked[arg])
                continue
            same_type = [
                r for r, t in enumerate(self.result_types) if r not in taken and t == self.arg_types[arg]
            ]
            partner = next((r for r in same_type if self.result_sharding(r) == self.arg_sharding(arg)), None)
            if partner is None:
                self.donors.add(arg)
                reason = f"no free result of type {self.arg_types[arg]}"
                if same_type:
                    placed = ", ".join(f"result {r}: {placement_text(self.result_sharding(r))}" for r in same_type)
                    reason += f" with its sharding {placement_text(self.arg_sharding(arg))} ({placed})"
                unusable(arg, ORIGIN_EXPLICIT, reason, keep=True)
            else:
                aliases[arg] = (partner, ORIGIN_EXPLICIT)
                taken[partner] = arg
        return AliasReport(
            tuple(
                Alias(arg, self.arg_names[arg], result, tensor_bytes(self.arg_types[arg]), origin)
                for arg, (result, origin) in sorted(aliases.items())
            ),
            tuple(sorted(unused, key=lambda u: u.arg_index)),
        )

    def write(self, main: func.FuncOp, report: AliasReport) -> None:
        """Every argument's aliasing attributes, decided by independent
        rules, written once through the contract's records."""
        unused = {u.arg_index: u for u in report.unused}
        args = []
        for index, arg in enumerate(self.contract.args):
            result, origin = self.aliases.get(index, (None, None))
            if index in unused:
                origin = unused[index].origin
            args.append(
                dataclasses.replace(
                    arg,
                    aliasing_output=result,
                    buffer_donor=index in self.donors,
                    donation=origin,
                    unused_donation=unused[index].reason if index in unused else None,
                )
            )
        dataclasses.replace(self.contract, args=tuple(args)).write(main)


def _resolve(request: str, names: list[str], pass_name: str) -> int:
    if A.is_index(request):
        index = int(request)
        if index >= len(names):
            raise PassError(f"{pass_name}: donate names argument {index}, but @main has {len(names)} arguments")
        return index
    matches = [i for i, name in enumerate(names) if name == request]
    if not matches:
        raise PassError(
            f"{pass_name}: donate names unknown argument '{request}' (arguments: {', '.join(names)})"
        )
    return matches[0]
