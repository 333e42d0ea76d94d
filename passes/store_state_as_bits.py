"""``store-state-as-bits``: module state (and a user input written in
place) that the program only reads and writes as integer bits is stored
as those bits.

``bitcast-overwrite-scatter`` runs an overwrite-only bf16 scatter on i16:
``bitcast_convert(cache) -> i16``, scatters, ``bitcast_convert(...) -> bf16``.
XLA:CPU materializes the first ``bitcast_convert`` of the parameter as a
loop fusion (``wrapped_bitcast-convert = s16[...] fusion(Arg_0)``), one copy
of the whole cache in temporary memory on every call.  Module state lives on
the device and is the runtime's, so it can be stored as its bits once: this
pass gives the state argument the same-width signless integer type (bf16/f16
-> i16, f32 -> i32, f64 -> i64), feeds the integer uses the argument itself
and, when the state is mutated, returns the integer its new value was
bit-cast from, so the argument, its new value and XLA's alias between them
change type together and both converts disappear.  It records the float type
as ``hloalias.stored_bits_of``; the runtime uploads the state's bits
(``tensor.view(torch.int16)``, no copy on the host) and reinterprets them
for ``state_dict()`` / ``load_state_dict``.  Bit casts are exact: the
program computes the same bits.

Applies to an argument of ``@main`` that is module state (``parameter``,
``buffer`` or ``constant``) with a bf16, f16, f32 or f64 element type, at
least one use, every use a ``stablehlo.bitcast_convert`` to the same-width
integer, and — when a result is its new value (``hloalias.mutates``) — that
new value a ``stablehlo.bitcast_convert`` from that integer type.  Also to
a ``user_input`` under the same conditions that is mutated and aliased to
its own new value (``tf.aliasing_output``: written in place, as a
``donate``d or inferred donor ``index_copy_`` target is): its dtype is the
caller's, so the runtime hands XLA the caller's tensor's integer view
(``tensor.view(torch.int16)``, no copy) and writes the new bits back into
that view or re-seats the tensor, keeping its dtype (``docs/runtime.md``).

A user input may be a rebuilt view's base (the cache object a decoder
returns as itself): the runtime rebuilds its views from the caller's
tensor, which keeps its dtype.

Never applies to: user inputs not written in place (read only, or mutated
but not aliased to their new value); state read as
float anywhere (an ``add``, a ``slice``, a convolution ...) or whose new value
is computed in float (storing it as bits would add a convert, not remove
one); state that is the base of a rebuilt view (``hloalias.removed_results``
base ``arg:I`` or ``mutation:I``: a torch view needs torch's dtype); state
aliased to a result other than its own new value (``tf.aliasing_output``
pairs types); sharded state; state already stored permuted
(``permute-conv-kernel-state``).

``dtypes`` fixes how named state whose device buffer exists already is
stored (the runtime passes the module's shared state, so a later program
reads the buffer as an earlier one stored it): ``NAME:torch`` keeps torch's
dtype, ``NAME:bits`` stores the bits for any use (a ``bitcast_convert`` back
to the float type feeds float uses, and one to the integer type makes a new
value computed in float).  A named argument that must keep torch's dtype
(not state or an input written in place, state that is a view's base, aliased to another result, sharded, permuted, not
a float of those widths) is left so and reported; names the module does not
have are ignored."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir
from torch_mlir.dialects import func

from hloalias import attributes as A
from hloalias.contract import BITS_OF_FLOAT, Signature, verify
from hloalias.errors import PassError
from hloalias.mlir import find_main, return_op
from hloalias.passes.base import ModuleLike, ModulePass, as_module_like

TORCH_DTYPE = "torch"
BITS = "bits"


@dataclasses.dataclass(frozen=True)
class BitsState:
    """One state argument now stored as integer bits."""

    arg_index: int
    name: str
    float_type: str
    integer_type: str
    mutated: bool
    float_uses: int  # uses fed through a bitcast_convert back (fixed ``bits`` only)
    user_input: bool = False  # a user input written in place, not module state


@dataclasses.dataclass(frozen=True)
class BitsReport:
    """What is stored as bits, and which fixed ``bits`` entries could not be honoured."""

    stored: tuple[BitsState, ...]
    kept_in_torch_dtype: tuple[tuple[str, str], ...] = ()

    def to_text(self) -> str:
        """The report as people read it."""
        lines = [f"store-state-as-bits: {len(self.stored)} state arguments stored as bits"]
        for entry in self.stored:
            how = "read and written" if entry.mutated else "read"
            where = f"argument {entry.arg_index}" + (", user input" if entry.user_input else "")
            text = f"  '{entry.name}' ({where}): {entry.float_type} as {entry.integer_type}, {how}"
            if entry.float_uses:
                text += f"; {entry.float_uses} float use(s) through a bitcast_convert"
            lines.append(text)
        for name, reason in self.kept_in_torch_dtype:
            lines.append(f"  '{name}' kept in torch's dtype despite its fixed dtype: {reason}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class StoreStateAsBits(ModulePass[BitsReport]):
    """Store state used only through bit casts to integers as those integers."""

    name: ClassVar[str] = "store-state-as-bits"

    dtypes: tuple[str, ...] = dataclasses.field(
        default=(),
        metadata={"help": "fixed storage of existing state: NAME:torch or NAME:bits"},
    )

    def apply(self, module: ModuleLike) -> BitsReport:
        """Store every eligible state argument of ``@main`` as bits, in
        place.  Everything is checked before anything changes: a malformed
        ``dtypes`` entry, or one that contradicts what the module already
        records, is a :class:`PassError`."""
        module = as_module_like(module)
        fixed = self._fixed_dtypes()
        with module.context, ir.Location.unknown():
            main = find_main(module)
            contract = verify(main)
            block = main.regions[0].blocks[0]
            returned = return_op(main)
            plans: list[int] = []
            kept: list[tuple[str, str]] = []
            for index, arg in enumerate(contract.args):
                name = arg.display_name(index)
                wanted = fixed.get(name)
                if arg.stored_bits_of is not None:
                    if wanted == TORCH_DTYPE:
                        raise PassError(
                            f"{self.name}: '{name}' is already stored as bits of {arg.stored_bits_of}; "
                            "cannot store it in torch's dtype"
                        )
                    continue
                if wanted == TORCH_DTYPE:
                    continue
                blocker = _blocker(contract, index, block.arguments[index])
                if wanted == BITS:
                    if blocker is not None:
                        kept.append((name, blocker))
                    else:
                        plans.append(index)
                    continue
                new_value = _new_value(contract, index)
                if arg.kind == "user_input" and new_value is None:
                    continue
                if blocker is None and _only_bits(block.arguments[index], returned, new_value):
                    plans.append(index)
            stored = [_store(contract, main, returned, index) for index in plans]
            bits_of = {entry.arg_index: entry.float_type for entry in stored}
            args = tuple(
                dataclasses.replace(arg, stored_bits_of=bits_of[index]) if index in bits_of else arg
                for index, arg in enumerate(contract.args)
            )
            main.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([a.type for a in block.arguments], [v.type for v in returned.operands])
            )
            dataclasses.replace(contract, args=args).write(main)
            verify(main)
        return BitsReport(tuple(stored), tuple(kept))

    def _fixed_dtypes(self) -> dict[str, str]:
        """``dtypes`` as ``{name: "torch" | "bits"}``."""
        fixed: dict[str, str] = {}
        for entry in self.dtypes:
            name, colon, how = entry.rpartition(":")
            if not colon or not name or how not in (TORCH_DTYPE, BITS):
                raise PassError(f"{self.name}: dtypes entry '{entry}' is not NAME:torch or NAME:bits")
            if name in fixed:
                raise PassError(f"{self.name}: dtypes names '{name}' twice")
            fixed[name] = how
        return fixed


def _integer_type(float_type: ir.Type) -> ir.Type | None:
    """The same-width signless integer of a float element type it stores, or None."""
    width = BITS_OF_FLOAT.get(str(float_type))
    return None if width is None else ir.IntegerType.get_signless(width)


def _blocker(contract: Signature, index: int, value: ir.Value) -> str | None:
    """Why argument ``index`` must keep torch's dtype whatever its uses, or None."""
    arg = contract.args[index]
    if arg.kind == "user_input":
        if arg.aliasing_output is None or contract.results[arg.aliasing_output].mutates != index:
            return "it is a user input not written in place (aliased to its own new value)"
    elif arg.kind not in ("parameter", "buffer", "constant"):
        return "it is not module state"
    if _integer_type(ir.RankedTensorType(value.type).element_type) is None:
        return f"its element type is not one of {', '.join(BITS_OF_FLOAT)}"
    bases = {record.base for record in contract.removed}
    if arg.kind != "user_input" and (A.arg_key(index) in bases or A.mutation_key(index) in bases):
        return "it is the base of a rebuilt view"
    if arg.aliasing_output is not None and contract.results[arg.aliasing_output].mutates != index:
        return "it is aliased to a result other than its new value"
    if arg.sharding is not None:
        return "it is sharded"
    if arg.stored_layout is not None:
        return "it is stored permuted"
    return None


def _new_value(contract: Signature, index: int) -> int | None:
    """The position of argument ``index``'s new value among the results, or None."""
    for position, result in enumerate(contract.results):
        if result.mutates == index:
            return position
    return None


def _operation(owner: object) -> ir.Operation | None:
    operation = owner.operation if isinstance(owner, ir.OpView) else owner
    return operation if isinstance(operation, ir.Operation) else None


def _bitcast_to(use_owner: object, integer: ir.Type) -> ir.Operation | None:
    """``use_owner`` when it is a ``bitcast_convert`` to a tensor of ``integer``."""
    operation = _operation(use_owner)
    if operation is None or operation.name != "stablehlo.bitcast_convert":
        return None
    return operation if ir.RankedTensorType(operation.results[0].type).element_type == integer else None


def _bitcast_from(value: ir.Value, integer: ir.Type) -> ir.Value | None:
    """The integer tensor ``value`` is a ``bitcast_convert`` of, or None."""
    operation = _operation(value.owner)
    if operation is None or operation.name != "stablehlo.bitcast_convert":
        return None
    source = operation.operands[0]
    return source if ir.RankedTensorType(source.type).element_type == integer else None


def _only_bits(value: ir.Value, returned: ir.Operation, new_position: int | None) -> bool:
    """Every use of ``value`` is a bit cast to its integer type, and its new
    value (result ``new_position``, when mutated) is a bit cast from it."""
    integer = _integer_type(ir.RankedTensorType(value.type).element_type)
    assert integer is not None
    uses = list(value.uses)
    if not uses or any(_bitcast_to(use.owner, integer) is None for use in uses):
        return False
    return new_position is None or _bitcast_from(returned.operands[new_position], integer) is not None


def _store(contract: Signature, main: func.FuncOp, returned: ir.Operation, index: int) -> BitsState:
    """Give argument ``index`` its integer type: integer uses read it,
    float uses read a bit cast back; its new value is returned as integers."""
    block = main.regions[0].blocks[0]
    value = block.arguments[index]
    float_type = ir.RankedTensorType(value.type).element_type
    integer = _integer_type(float_type)
    assert integer is not None
    shape = list(ir.RankedTensorType(value.type).shape)
    float_tensor = value.type
    value.set_type(ir.RankedTensorType.get(shape, integer))
    float_uses = 0
    back: ir.Value | None = None
    for use in list(value.uses):
        cast = _bitcast_to(use.owner, integer)
        if cast is not None:
            cast.results[0].replace_all_uses_with(value)
            cast.erase()
            continue
        if back is None:
            with ir.InsertionPoint.at_block_begin(block):
                back = _bitcast(value, float_tensor)
        float_uses += 1
    if back is not None:
        back_op = _operation(back.owner)
        assert back_op is not None
        value.replace_all_uses_except(back, back_op)
    position = _new_value(contract, index)
    if position is not None:
        new = returned.operands[position]
        source = _bitcast_from(new, integer)
        if source is None:
            with ir.InsertionPoint(returned):
                source = _bitcast(new, ir.RankedTensorType.get(shape, integer))
        returned.operands[position] = source
        producer = _operation(new.owner)
        if producer is not None and producer.name == "stablehlo.bitcast_convert" and not list(new.uses):
            producer.erase()
    return BitsState(
        index, contract.args[index].display_name(index), str(float_type), str(integer), position is not None,
        float_uses, contract.args[index].kind == "user_input",
    )


def _bitcast(value: ir.Value, to: ir.Type) -> ir.Value:
    return ir.Operation.create("stablehlo.bitcast_convert", results=[to], operands=[value]).results[0]
