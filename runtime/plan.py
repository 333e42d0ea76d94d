"""The call plan: what a call of a compiled program does with each input,
state tensor and result, read once from the final module's contract
(:class:`hloalias.contract.Signature`) and frozen: the program's facts
(:class:`_ProgramFacts`: the runtime's one reading of the final module),
how a call's arguments bind (:class:`_CallConvention`), each ``@main`` argument's step
(:class:`_ArgStep`), each user output's (:class:`_ResultStep`), how a
removed result is rebuilt (:class:`_Rebuild`), and the single-device plan
the Python call path and the native lane both read (:class:`_CallPlan`)."""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch_mlir import ir

from hloalias import attributes as A
from hloalias.contract import RNG_KEY_KIND, IndexRange, Signature, StoredLayout, row_major_strides
from hloalias.errors import ExecutionError, IndexRangeError
from hloalias.mlir import find_main
from hloalias.runtime.ownership import DeviceTensor, _itemsize, _numel
from hloalias.runtime.pjrt import SingleDeviceDispatch
from hloalias.runtime.state import _StateSlot

if TYPE_CHECKING:
    from hloalias.frontend.importer import Program
    from hloalias.runtime.executable import Executable

@dataclasses.dataclass(frozen=True)
class _Rebuild:
    """How to produce a removed result from its base (None layout: dead)."""

    base: str | None
    dtype: torch.dtype | None = None
    sizes: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    offset: int = 0
    identity: bool = False


@dataclasses.dataclass(frozen=True)
class _ProgramFacts:
    """What every call of a compiled program reads of it, read once from
    the final module's contract (:meth:`hloalias.contract.Signature.read`
    of ``@main``, verified by ``compile``) and the import's signature
    (argument names and kinds, the input and output pytree specs): the
    runtime's one reader of the final module.  Indices are ``@main``
    argument positions; keys are the contract's result keys."""

    #: Arguments whose buffers the program may overwrite (donated).
    donated_args: set[int]
    #: Argument -> the result XLA writes into its donated buffer.
    aliases: dict[int, int]
    #: Each result's key (``output:N``, ``mutation:N``), in result order.
    result_keys: list[str]
    #: State this program reads permuted (permute-conv-kernel-state).
    stored_layouts: dict[str, StoredLayout]
    #: State whose device buffer must be in torch's layout: written,
    #: donated, or the base of a rebuilt view.
    torch_layout_state: set[str]
    #: State this program stores as integer bits (store-state-as-bits): the bits' dtype.
    stored_bits: dict[str, torch.dtype]
    #: User inputs (argument index) this program reads and writes as integer
    #: bits (store-state-as-bits on an input aliased to its new value): the
    #: bits' dtype.  The caller's tensor keeps its dtype; XLA gets its
    #: ``view(bits)`` and the new value is written back as bits.
    input_bits: dict[int, torch.dtype]
    #: State whose buffer must hold torch's dtype: viewed, or written or
    #: donated by this program in torch's dtype.
    torch_dtype_state: set[str]
    #: How each removed result is rebuilt, by key.
    rebuilds: dict[str, _Rebuild]
    #: Each rebuilt result's base key, parsed.
    rebuild_bases: dict[str, tuple[str, int]]
    result_shapes: list[tuple[int, ...]]
    result_dtypes: list[torch.dtype | None]
    #: Each argument's shape and dtype as torch holds it (a permuted or
    #: bit-stored state argument in torch's layout and dtype).
    arg_types: list[tuple[tuple[int, ...], torch.dtype]]
    names: list[str]
    user_indices: list[int]
    #: (argument index, state name or None for a user input).
    arg_plan: list[tuple[int, str | None]]
    #: Each argument's mutation key where the program returns its new value, else None.
    mutation_keys: list[str | None]
    #: The inputs are a flat tuple of tensors (no keywords).
    flat_inputs: bool
    #: A program compiled from keyword tensors only (HF's recipes:
    #: ``module(input_ids=..., cache_position=...)``): their names in the
    #: compiled order, for calls passing exactly those keywords.
    keyword_leaves: tuple[str, ...] | None
    output_keys: list[str]
    constant_outputs: dict[str, Any]
    single_output: bool
    flat_outputs: bool
    #: User inputs (argument index) whose values the program uses as
    #: indices: the ranges eager accepts (``hloalias.index_ranges``).
    index_ranges: dict[int, tuple[IndexRange, ...]] = dataclasses.field(default_factory=dict)
    #: The argument random ops draw from (``hloalias.kind = "rng_key"``,
    #: frontend/random_key.py), or None.  It is the last of
    #: :attr:`user_indices`: every call path takes it as one more read-only
    #: argument after the caller's inputs, which ``Executable.__call__``
    #: draws from torch's default generator into a buffer PJRT owns
    #: (``executable.draw_rng_key``; on a mesh the torch tensor, which the
    #: placement copies), never a zero-copy import (``ownership.host_copy``).
    rng_key: int | None = None

    @property
    def caller_inputs(self) -> int:
        """How many user inputs a call passes (the key is not one)."""
        return len(self.user_indices) - (self.rng_key is not None)

    @staticmethod
    def read(program: "Program") -> "_ProgramFacts":
        signature = program.signature
        module = program.torch_mlir_module
        with module.context:
            main = find_main(module)
            contract = Signature.read(main)  # verified once, by compile()
            mutated = {result.mutates for result in contract.results if result.mutates is not None}
            bases = {record.base for record in contract.removed}
            rebuilds: dict[str, _Rebuild] = {}
            for record in contract.removed:
                if record.base is None or record.layout is None:
                    rebuilds[record.key] = _Rebuild(None)
                    continue
                layout = record.layout
                rebuilds[record.key] = _Rebuild(
                    record.base, _torch_dtype(layout.element_type),
                    layout.sizes, layout.strides, layout.offset, identity=record.is_identity,
                )
            function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
            arg_types = [
                (tuple(ir.RankedTensorType(t).shape), _torch_dtype(ir.RankedTensorType(t).element_type))
                for t in function_type.inputs
            ]
            for index, arg in enumerate(contract.args):
                if arg.stored_layout is not None:  # checked against torch's shape (load_state_dict)
                    shape, dtype = arg_types[index]
                    arg_types[index] = (tuple(shape[d] for d in arg.stored_layout.inverse), dtype)
                if arg.stored_bits_of is not None:  # checked against torch's dtype (load_state_dict)
                    shape, _ = arg_types[index]
                    arg_types[index] = (shape, _TORCH_DTYPES[arg.stored_bits_of])
                if arg.kind == RNG_KEY_KIND:  # a call draws one key (one row per device: the placement's)
                    arg_types[index] = ((2,), torch.int64)
            result_keys = list(contract.keys)
            arguments = signature.arguments
            user_indices = signature.user_input_indices()
            keys = [index for index, arg in enumerate(contract.args) if arg.kind == RNG_KEY_KIND]
            rng_key = keys[0] if keys else None  # one, the last argument: verified
            in_spec = signature.in_spec
            out_spec = signature.out_spec
            keyword_leaves: tuple[str, ...] | None = None
            parts = in_spec.children()
            if len(parts) == 2 and parts[1].type is dict and not getattr(signature, "static_inputs", None):
                names = tuple(parts[1].context)
                if in_spec == pytree.tree_structure(((), {name: 0 for name in names})):
                    keyword_leaves = names
            single_output = out_spec == pytree.tree_structure(0)
            return _ProgramFacts(
                donated_args={i for i, arg in enumerate(contract.args) if arg.overwritten},
                aliases={
                    i: arg.aliasing_output for i, arg in enumerate(contract.args) if arg.aliasing_output is not None
                },
                result_keys=result_keys,
                stored_layouts={
                    arg.name: arg.stored_layout for arg in contract.args
                    if arg.name is not None and arg.stored_layout is not None
                },
                torch_layout_state={
                    arg.name for index, arg in enumerate(contract.args)
                    if arg.name is not None and (arg.overwritten or index in mutated or A.arg_key(index) in bases)
                },
                stored_bits={
                    arg.name: _torch_dtype(ir.RankedTensorType(contract.arg_types[index]).element_type)
                    for index, arg in enumerate(contract.args)
                    if arg.name is not None and arg.stored_bits_of is not None and arg.kind != "user_input"
                },
                input_bits={
                    index: _torch_dtype(ir.RankedTensorType(contract.arg_types[index]).element_type)
                    for index, arg in enumerate(contract.args)
                    if arg.stored_bits_of is not None and arg.kind == "user_input"
                },
                torch_dtype_state={
                    arg.name for index, arg in enumerate(contract.args)
                    if arg.name is not None and (
                        A.arg_key(index) in bases or A.mutation_key(index) in bases
                        or (arg.stored_bits_of is None and (arg.overwritten or index in mutated))
                    )
                },
                rebuilds=rebuilds,
                rebuild_bases={r.base: A.parse_key(r.base) for r in rebuilds.values() if r.base is not None},
                result_shapes=[tuple(ir.RankedTensorType(t).shape) for t in function_type.results],
                result_dtypes=[_TORCH_DTYPES.get(str(ir.RankedTensorType(t).element_type)) for t in function_type.results],
                arg_types=arg_types,
                names=[a.name for a in arguments],
                user_indices=user_indices + ([rng_key] if rng_key is not None else []),
                arg_plan=[(a.index, None if a.kind in ("user_input", RNG_KEY_KIND) else a.name) for a in arguments],
                mutation_keys=[
                    A.mutation_key(a.index) if A.mutation_key(a.index) in result_keys else None for a in arguments
                ],
                flat_inputs=in_spec == pytree.tree_structure((tuple(range(len(user_indices))), {})),
                keyword_leaves=keyword_leaves,
                output_keys=[A.output_key(i) for i in range(out_spec.num_leaves)],
                constant_outputs={A.output_key(i): v for i, v in signature.constant_outputs.items()},
                single_output=single_output,
                flat_outputs=single_output or out_spec == pytree.tree_structure(tuple(range(out_spec.num_leaves))),
                index_ranges={index: arg.index_ranges for index, arg in enumerate(contract.args) if arg.index_ranges},
                rng_key=rng_key,
            )


@dataclasses.dataclass(frozen=True)
class _CallConvention:
    """How a call's ``(args, kwargs)`` map onto the compiled ``(args, kwargs)``.

    ``positional[i]`` is the parameter the i-th compiled positional argument
    bound to (with its index into ``*args`` when it went there);
    ``keywords`` lists each compiled keyword and the parameter it bound to
    (``**kwargs`` when ``via_var_keyword``)."""

    signature: inspect.Signature | None
    positional: tuple[tuple[str, int | None], ...]
    keywords: tuple[tuple[str, str, bool], ...]

    @staticmethod
    def of(f: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> "_CallConvention":
        signature: inspect.Signature | None = None
        if not isinstance(f, ExportedProgram):
            try:
                signature = inspect.signature(f.forward if isinstance(f, torch.nn.Module) else f)
                signature.bind(*args, **kwargs)
            except (TypeError, ValueError):
                signature = None
        if signature is None:
            return _CallConvention(
                None,
                tuple((f"argument {i}", None) for i in range(len(args))),
                tuple((key, key, False) for key in kwargs),
            )
        parameters = list(signature.parameters.values())
        by_position = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        var_positional = next((p.name for p in parameters if p.kind is p.VAR_POSITIONAL), "*args")
        var_keyword = next((p.name for p in parameters if p.kind is p.VAR_KEYWORD), "**kwargs")
        positional = tuple(
            (by_position[i].name, None) if i < len(by_position) else (var_positional, i - len(by_position))
            for i in range(len(args))
        )
        keywords = []
        for key in kwargs:
            parameter = signature.parameters.get(key)
            named = parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
            keywords.append((key, key if named else var_keyword, not named))
        return _CallConvention(signature, positional, tuple(keywords))

    def expected(self) -> str:
        """What a call must pass, in words."""
        names = [name if sub is None else f"{name}[{sub}]" for name, sub in self.positional]
        parts = []
        if names:
            parts.append("positional " + ", ".join(f"'{n}'" for n in names))
        if self.keywords:
            parts.append("keyword " + ", ".join(f"'{k}'" for k, _, _ in self.keywords))
        return " and ".join(parts) or "no inputs"

    def arrange(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's inputs in the compiled order; ExecutionError in words
        when the call does not bind the inputs the program was compiled with."""
        if self.signature is None:
            if len(args) != len(self.positional) or set(kwargs) != {k for k, _, _ in self.keywords}:
                raise ExecutionError(
                    f"inputs do not have the structure the program was compiled for: expected "
                    f"{self.expected()}; got {len(args)} positional and keyword(s) {sorted(kwargs)}"
                )
            return args, {key: kwargs[key] for key, _, _ in self.keywords}
        try:
            bound = self.signature.bind(*args, **kwargs).arguments
        except TypeError as error:
            raise ExecutionError(
                f"inputs do not have the structure the program was compiled for: {error} "
                f"(expected {self.expected()})"
            ) from None
        compiled = {name for name, _ in self.positional} | {name for _, name, _ in self.keywords}
        for name in bound:
            if name not in compiled:
                raise ExecutionError(
                    f"inputs do not have the structure the program was compiled for: input '{name}' "
                    f"was not passed at compile time (expected {self.expected()}); compile again with it"
                )
        for name in compiled:
            if name not in bound:
                raise ExecutionError(
                    f"inputs do not have the structure the program was compiled for: missing input "
                    f"'{name}' (expected {self.expected()})"
                )
        new_args = []
        for name, sub in self.positional:
            if sub is None:
                new_args.append(bound[name])
                continue
            extra = bound[name]
            count = sum(1 for n, s in self.positional if n == name and s is not None)
            if len(extra) != count:
                raise ExecutionError(
                    f"inputs do not have the structure the program was compiled for: {count} "
                    f"extra positional input(s) in '*{name}', got {len(extra)}"
                )
            new_args.append(extra[sub])
        new_kwargs: dict[str, Any] = {}
        var_keys = {key for key, _, via in self.keywords if via}
        for key, name, via in self.keywords:
            if via:
                given = bound[name]
                if set(given) != var_keys:
                    raise ExecutionError(
                        f"inputs do not have the structure the program was compiled for: keywords "
                        f"{sorted(given)} in '**{name}', expected {sorted(var_keys)}"
                    )
                new_kwargs[key] = given[key]
            else:
                new_kwargs[key] = bound[name]
        return tuple(new_args), new_kwargs


def _describe_spec(spec: Any) -> str:
    """A pytree spec in words: ``tensor``, ``list of 2 (tensor, tensor)``."""
    if spec.is_leaf():
        return "a tensor"
    children = spec.children()
    kind = getattr(spec.type, "__name__", str(spec.type))
    if spec.type is dict:
        inner = ", ".join(f"'{k}': {_describe_spec(c)}" for k, c in zip(spec.context, children))
        return f"a dict {{{inner}}}"
    if not children:
        return "None" if spec.type is type(None) else f"an empty {kind}"
    return f"a {kind} of {len(children)} ({', '.join(_describe_spec(c) for c in children)})"


@dataclasses.dataclass(frozen=True)
class _ArgStep:
    """What a single-device call does with one ``@main`` argument."""

    index: int
    name: str
    #: The module-state slot the argument reads, or None for a user input.
    slot: _StateSlot | None
    shape: torch.Size
    dtype: torch.dtype
    #: Position among the results of the argument's new value (None: not mutated).
    mutated: int | None
    donated: bool
    #: Position of the result XLA writes into the argument's donated buffer
    #: when a runtime buffer backs the input (a self-aliased mutation: the
    #: caller's tensor is to hold that value); None when there is none.  A
    #: donor aliased to a user output has none: a donated torch tensor is
    #: left as it was, wherever its memory came from (an earlier result's
    #: runtime buffer is not handed to XLA to overwrite).
    in_place: int | None
    #: A mutated user input aliased to its own new value: a plain torch
    #: tensor may be re-seated onto the result buffer.
    reseat: bool
    #: A user input the program reads and writes as integer bits
    #: (``_ProgramFacts.input_bits``): the integer dtype XLA gets the
    #: caller's tensor's ``view`` in, and whose runtime buffers back it
    #: (``ownership._BITS_BACKINGS``); None: in torch's dtype.
    bits: torch.dtype | None = None
    #: The random key (``_ProgramFacts.rng_key``): the call passes it as a
    #: PJRT-owned array (``executable.draw_rng_key``), taken as it is.
    key: bool = False
    #: A user input passed as a zero-copy import of the caller's memory:
    #: not written, and no runtime buffer to write in place (read only, or
    #: donated: PJRT cannot take memory it does not own, so XLA writes the
    #: result elsewhere and the tensor is left as it was).
    imported: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        # Read on every call: computed once.
        object.__setattr__(
            self, "imported", self.slot is None and self.mutated is None and self.in_place is None and not self.key,
        )


@dataclasses.dataclass(frozen=True)
class _IndexCheck:
    """A user input whose values the program uses as indices: every call
    checks its tensor against the ranges eager accepts
    (``hloalias.index_ranges``, :mod:`hloalias.frontend.index_ranges`)
    before anything runs, since XLA clamps or drops an out-of-range index
    where eager raises.  On every call path and placement: the Python path
    (mesh programs too: the caller's whole tensor, on the host, before it is
    placed, so a sharded or replicated input is checked like any other) and
    the native lane (``low``/``high`` in its input rows; a call out of range
    is left to the Python path, which raises)."""

    #: The @main argument.
    index: int
    #: Its position among a call's user inputs.
    leaf: int
    name: str
    #: The ranges' intersection: the one comparison of the common call.
    low: int
    high: int
    ranges: tuple[IndexRange, ...]
    #: The native min/max pass (``lane.native_values_in_range``: True,
    #: False, or None for a tensor it does not read), or None: ``aminmax``.
    within: Callable[[Any, int, int], bool | None] | None = None

    @staticmethod
    def of(
        index: int, leaf: int, name: str, ranges: tuple[IndexRange, ...],
        within: Callable[[Any, int, int], bool | None] | None = None,
    ) -> "_IndexCheck":
        return _IndexCheck(
            index, leaf, name, max(r.low for r in ranges), min(r.high for r in ranges), ranges, within,
        )

    def check(self, value: Any) -> None:
        """IndexRangeError when ``value`` (a checked input: a CPU tensor of
        the argument's dtype and shape, or a DeviceTensor) holds an index out
        of range."""
        tensor = value.to_torch() if isinstance(value, DeviceTensor) else value
        if self.within is not None:
            inside = self.within(tensor, self.low, self.high)
            if inside is True:
                return
            if inside is False:
                raise self.error(tensor)
        if tensor.numel() == 0:
            return
        low, high = torch.aminmax(tensor)
        if int(low) < self.low or int(high) >= self.high:
            raise self.error(tensor)

    def error(self, tensor: torch.Tensor) -> IndexRangeError:
        """The error naming the first element (in row-major order) out of
        the first range it breaks."""
        for entry in self.ranges:
            outside = (tensor < entry.low) | (tensor >= entry.high)
            if bool(outside.any()):
                position = tuple(int(i) for i in outside.nonzero()[0])
                value = int(tensor[position]) if position else int(tensor)
                return IndexRangeError(
                    f"input '{self.name}' holds the index {value} at position {list(position)}, out of the range "
                    f"{entry.describe()}: eager PyTorch raises an IndexError here, and XLA would clamp or drop "
                    "the index (a silently wrong result); nothing ran"
                )
        raise AssertionError("an index out of the ranges' intersection is out of one of them")


def computes_nothing(program: "Program", facts: _ProgramFacts) -> bool:
    """Whether ``program`` (final, one device) has nothing for XLA to do:
    ``@main`` returns no result, donates no argument, its body is its
    ``return`` alone and every argument has a static shape.  Every output
    is then an input, a view of one or a constant, recorded in the
    contract (``hloalias.removed_results``); no call runs such a program
    (:attr:`_CallPlan.executes`), so ``compile`` does not hand it to XLA."""
    if facts.result_keys or facts.donated_args:
        return False
    module = program.torch_mlir_module
    with module.context:
        main = find_main(module)
        blocks = list(main.regions[0].blocks)
        if len(blocks) != 1 or len(blocks[0].operations) != 1:
            return False
        return all(
            isinstance(argument.type, ir.RankedTensorType) and ir.RankedTensorType(argument.type).has_static_shape
            for argument in blocks[0].arguments
        )


def check_index_ranges(checks: tuple[_IndexCheck, ...], leaves: Sequence[Any]) -> None:
    """Each check of ``checks`` on its input among a call's ``leaves``."""
    for check in checks:
        check.check(leaves[check.leaf])


@dataclasses.dataclass(frozen=True)
class _ResultStep:
    """How one user output becomes a torch tensor."""

    position: int  # among the results
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int


class _CallPlan:
    """The per-call work of a single-device executable, decided once when
    it is built: the hot call path reads this instead of re-deriving the
    same facts from the signature on every call.

    Contract: a plan holds only facts of the compiled program (argument and
    result types, mutations, donations, aliasing, which state slot each
    state argument reads) and never anything about a call's tensors.  Every
    call still checks each input against it (type, dtype, shape, device,
    layout: ``Executable._check_input``), and everything that depends on the
    tensor itself (its memory, whether a runtime buffer backs it, whether it
    may be re-seated, lazy bits, contiguity) is read on each call; no device
    copy of a torch tensor is kept across calls (the zero-copy import of a
    read-only input, which *is* its memory, is reused while the same tensor
    object sits at the same address: ``execution.import_input``).  So a
    tensor whose dtype,
    shape or device changed since the last call is refused, and one whose
    memory changed is read afresh.  State arrays are read from their slots
    on each call, so a ``load_state_dict`` or another executable's update
    is seen.  Mesh (SPMD) programs have no plan: they take the general
    path (``execution.run_mesh``)."""

    def __init__(self, exe: "Executable") -> None:
        results = {key: position for position, key in enumerate(exe._result_keys)}
        steps = []
        for index, state_name in exe._arg_plan:
            shape, dtype = exe._arg_types[index]
            mutation_key = exe._mutation_keys[index]
            in_place: int | None = None
            if index in exe._self_aliased:
                in_place = results[A.mutation_key(index)]
            steps.append(_ArgStep(
                index, exe._names[index], exe._slots[state_name] if state_name is not None else None,
                torch.Size(shape), dtype, results[mutation_key] if mutation_key is not None else None,
                index in exe._donated_args, in_place, index in exe._self_aliased, exe._input_bits.get(index),
                index == exe._rng_key,
            ))
        self.steps: tuple[_ArgStep, ...] = tuple(steps)
        self.state_slots = tuple(step.slot for step in steps if step.slot is not None)
        #: The state slots' buffers in argument order, kept between calls
        #: (reading hundreds of slots per call costs more than the list:
        #: the execute that follows runs with the slots' objects in cache).
        #: Every replacement of a slot's buffer drops it (the slot's
        #: ``readers``), always under the module's lock, as calls run; so it
        #: never holds a replaced buffer, nor keeps one alive.  (The native
        #: call path refills it after its own commit, still under the lock,
        #: with the buffers the slots then hold.)
        self.state_arrays: list[jax.Array | None] | None = None
        reader = weakref.ref(self)
        for slot in set(self.state_slots):
            slot.readers[:] = [r for r in slot.readers if r() is not None]
            slot.readers.append(reader)
        self.user_steps = tuple(step for step in steps if step.slot is None)
        #: The common @main order (state first, then user inputs), where
        #: the argument list is the state arrays followed by the user ones.
        self.state_first = all(step.slot is not None for step in steps[:len(self.state_slots)])
        #: Where each argument comes from, in @main order: its position among
        #: the state arrays (>= 0), or ``-1 - p`` for the p-th user input.
        #: Both call paths build the argument list from it (:meth:`arguments`,
        #: the native lane).
        state_positions = iter(range(len(self.state_slots)))
        user_positions = iter(range(len(steps) - len(self.state_slots)))
        self.sources: tuple[int, ...] = tuple(
            next(state_positions) if step.slot is not None else -1 - next(user_positions) for step in steps
        )
        self.donated_state = tuple(step for step in steps if step.slot is not None and step.donated)
        #: State whose slot form may differ from the one this program reads
        #: (permute-conv-kernel-state's layout, store-state-as-bits' dtype):
        #: (position among the state arrays, name, slot, the layout and bits
        #: read here).  Compared on each call, since a slot's form can change
        #: after the plan is built; it only ever changes back to torch's (a
        #: later executable that writes, donates or views the tensor), so
        #: state in torch's form now and read so here stays matched and is
        #: not listed.
        state_steps = [step for step in steps if step.slot is not None]
        self.stored_layouts = tuple(
            (position, step.name, step.slot, exe._stored_layouts.get(step.name), exe._stored_bits.get(step.name))
            for position, step in enumerate(state_steps)
            if step.slot is not None and (
                step.name in exe._stored_layouts or step.slot.layout is not None
                or step.name in exe._stored_bits or step.slot.bits is not None
            )
        )
        self.consumed = tuple(step for step in steps if step.donated and step.mutated is None)
        #: Arguments with something to do after the call: mutated ones and
        #: donors written in place into a runtime buffer.
        self.after = tuple(step for step in steps if step.mutated is not None or step.in_place is not None)
        #: Arguments whose pre-call array the commit reads.
        self.kept = self.after + self.consumed
        self.host_results = exe._device.platform == "cpu"
        #: A program with no results and no donations has no effect on the
        #: device (every output is a view of an input or a constant): it is
        #: not run at all.
        self.executes = bool(exe._result_keys) or any(step.donated for step in steps)
        #: How the program runs: jaxlib's C++ dispatch where it has one;
        #: None for a program that is not run (it may not be compiled:
        #: :func:`computes_nothing`).
        self.dispatch: SingleDeviceDispatch | None = self.new_dispatch(exe) if self.executes else None
        #: The program runs and running it changes nothing (no argument
        #: donated or written, no state copied into this program's form,
        #: which ``host_copies`` counts): a run may be dropped and made again.
        self.effect_free = (
            self.executes and not self.after and not any(step.donated for step in steps) and not self.stored_layouts
        )
        #: Every user output is a result of the program (no rebuilt views or
        #: constants): outputs are made straight from the results.
        self.direct_outputs = all(key in results for key in exe._output_keys)
        self.outputs = tuple(
            _ResultStep(
                results[key], dtype, exe._result_shapes[results[key]],
                _numel(exe._result_shapes[results[key]]) * _itemsize(dtype),
            )
            for key in exe._output_keys if key in results
            for dtype in [exe._result_dtypes[results[key]]] if dtype is not None
        )
        self.direct_outputs = self.direct_outputs and len(self.outputs) == len(exe._output_keys)
        #: The one output, when the program returns a single tensor that is
        #: one of its results on the host (the common call): it becomes a
        #: tensor over that result's buffer with no structuring.  Else None.
        self.single_output = (
            self.outputs[0] if self.direct_outputs and self.host_results and exe._single_output else None
        )
        #: For a program that is not run: when every user output is a user
        #: input or a same-dtype view of one, (input index, rebuild) per
        #: output; :func:`assembly.input_views` then makes the outputs
        #: without the general assembly.  None otherwise.
        self.input_views: tuple[tuple[int, _Rebuild], ...] | None = None
        if not self.executes:
            recipes = []
            for key in exe._output_keys:
                rebuild = exe._rebuilds.get(key)
                if rebuild is None or rebuild.base is None:
                    break
                kind, index = exe._rebuild_bases[rebuild.base]
                if kind != "arg" or exe._arg_plan[index][1] is not None or rebuild.dtype != exe._arg_types[index][1]:
                    break
                recipes.append((index, rebuild))
            else:
                self.input_views = tuple(recipes)

    @staticmethod
    def new_dispatch(exe: "Executable") -> SingleDeviceDispatch:
        """A dispatch of ``exe``'s program (whose fast path has seen no call
        yet; none for a program of many arguments), which knows its result
        types."""
        return SingleDeviceDispatch(
            exe._loaded, exe.device, result_types=list(zip(exe._result_shapes, exe._result_dtypes)),
            arguments=len(exe._arg_plan),
        )

    def arguments(self, exe: "Executable", user_arrays: list[jax.Array]) -> list[jax.Array | None]:
        """The argument list in @main order: the state slots' current arrays
        (None where a slot's buffer was consumed; a copy in this program's
        layout where the slot holds another: ``Executable._state_array``)
        and ``user_arrays``."""
        state = self.state_arrays
        if state is None:
            state = [slot.array for slot in self.state_slots]
            # Cached only while every slot holds the form this program reads:
            # the native call path passes the cached list as it is.
            if not any(slot.layout != layout or slot.bits != bits for _, _, slot, layout, bits in self.stored_layouts):
                self.state_arrays = state
        if self.stored_layouts:
            state = list(state)  # the copies below are this call's only
            for position, name, slot, layout, bits in self.stored_layouts:
                if slot.layout != layout or slot.bits != bits:
                    state[position] = exe._state_array(name)
        if self.state_first:
            return state + user_arrays  # what the sources table gives, in one step
        return [state[source] if source >= 0 else user_arrays[-1 - source] for source in self.sources]


# -- the native lane's step tables ---------------------------------------------------------

#: Input steps (``_NativeSteps.inputs``): where a user input's argument comes from.
IMPORT = 0  #: read only: the zero-copy import, reused while the same tensor is at the same address (``execution.import_input``)
BACKED = 1  #: written in place: the runtime buffer registered at the tensor's address (``ownership._backing_of``)
KEY = 2  #: the random key: a PJRT-owned array the call passes (``executable.draw_rng_key``), taken as it is
#: What an input row requires of the tensor beyond its type, dtype, shape
#: and strides (flags, or-ed): the lane takes a tensor that meets its row,
#: else the call goes to the Python path, which copies, re-seats or refuses.
ZERO_OFFSET = 1  #: at the start of its storage
WHOLE_STORAGE = 2  #: its storage is exactly the row's bytes
WRITE_REFUSALS = 4  #: eager's refusals of an in-place write (a leaf that requires grad, an inference tensor)
#: Check steps (``_NativeSteps.checks``), after the program ran: the call's
#: results are the usual ones, else the Python commit (``execution.finish_planned``) takes them.
WROTE_IN_PLACE = 0  #: the argument's buffer was taken and the result sits at the input's address
TAKEN = 1  #: the argument's buffer was taken (XLA wrote the new value into it)
#: Commit steps (``_NativeSteps.commits``), done in order.
SET_BACKING = 0  #: the input's runtime buffer holds the result (``HostBacking.array``)
SET_SLOT = 1  #: the state slot holds the result, not consumed (``_StateSlot.array``)
#: How the outputs are structured (``_NativeSteps.mode``).
SINGLE, TUPLE, UNFLATTEN = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class _NativeSteps:
    """A plan's call as step tables, the data the native lane
    (runtime/_lane.cpp) executes row by row: each input's row (where its
    argument comes from and what the tensor must be: dtype, shape, strides,
    flags), where each argument comes from, the overlap pairs, the donated
    state, each check of the results, each commit and each output's
    geometry.  Built once from the same :class:`_ArgStep` and
    :class:`_ResultStep` facts the Python path reads (the argument sources
    are :attr:`_CallPlan.sources`, which the Python path reads too), so a
    change to what a call does with an argument or result is made here, in
    the plan; the lane's primitives (a tensor checked against a row, a
    registry lookup, a list built from the sources, a result's deletion or
    address, an attribute set, a tensor over a buffer) decide nothing of
    the call's semantics.  The op codes above are the lane's
    (``ABI_VERSION`` numbers them with the constructor)."""

    #: Per user input, in the order of :attr:`_CallPlan.user_steps` (the
    #: sources' user positions): (argument index, leaf position in the
    #: call's user inputs, source: IMPORT/BACKED/KEY, flags, dtype, shape,
    #: strides, bytes, the result written into a BACKED buffer or -1).
    inputs: tuple[tuple[int, int, int, int, torch.dtype, tuple[int, ...], tuple[int, ...], int, int], ...]
    #: Per argument in @main order: its state position (>= 0) or -1 - its input row.
    sources: tuple[int, ...]
    #: (input row, input row): inputs whose bytes must not overlap.
    pairs: tuple[tuple[int, int], ...]
    #: (step: WROTE_IN_PLACE/TAKEN, argument position, result position or -1, input row or -1).
    checks: tuple[tuple[int, int, int, int], ...]
    #: (step: SET_BACKING/SET_SLOT, argument position, result position, input row or the slot, state position or -1).
    commits: tuple[tuple[int, int, int, Any, int], ...]
    #: Argument positions of donated state: must be distinct buffers (one
    #: buffer twice: the Python path refuses, ``execution._check_donated_state``).
    donated_state: tuple[int, ...]
    #: (result position, dtype, shape, strides, bytes) per user output.
    outputs: tuple[tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...], int], ...]
    #: The arguments whose pre-call arrays the Python commit reads.
    kept: tuple[int, ...]
    mode: int
    #: Each state argument a slot of its own: the plan's cached state list can be refilled.
    refill: bool
    #: State arguments (their arrays: the plan's ``state_arrays``).
    state_count: int
    #: (input row, low, high) per index input (:class:`_IndexCheck`): its
    #: values must lie in [low, high), else the call takes the Python path,
    #: which raises.
    ranges: tuple[tuple[int, int, int], ...] = ()

    @staticmethod
    def of(exe: "Executable", plan: "_CallPlan") -> "_NativeSteps":
        leaf_position = {index: position for position, index in enumerate(exe._user_indices)}
        row_of = {step.index: row for row, step in enumerate(plan.user_steps)}
        inputs = tuple(
            (
                step.index, leaf_position[step.index],
                KEY if step.key else BACKED if step.in_place is not None else IMPORT,
                (ZERO_OFFSET | WHOLE_STORAGE if step.in_place is not None else 0)
                | (WRITE_REFUSALS if step.index in exe._written_in_place else 0),
                step.dtype, tuple(step.shape), row_major_strides(tuple(step.shape)), exe._input_nbytes[step.index],
                step.in_place if step.in_place is not None else -1,
            )
            for step in plan.user_steps
        )
        state_position = {step.index: source for step, source in zip(plan.steps, plan.sources) if source >= 0}
        checks: list[tuple[int, int, int, int]] = []
        commits: list[tuple[int, int, int, Any, int]] = []
        for step in plan.user_steps:
            if step.in_place is not None:
                checks.append((WROTE_IN_PLACE, step.index, step.in_place, row_of[step.index]))
                commits.append((SET_BACKING, step.index, step.in_place, row_of[step.index], -1))
        for step in plan.after:
            if step.slot is not None and step.mutated is not None:
                checks.append((TAKEN, step.index, -1, -1))
                commits.append((SET_SLOT, step.index, step.mutated, step.slot, state_position[step.index]))
        if exe._single_output:
            mode = SINGLE
        elif exe._flat_outputs:
            mode = TUPLE
        else:
            mode = UNFLATTEN
        return _NativeSteps(
            inputs, plan.sources,
            tuple((row_of[first], row_of[second]) for first, second in exe._write_pairs),
            tuple(checks), tuple(commits), tuple(step.index for step in plan.donated_state),
            tuple(
                (result.position, result.dtype, tuple(result.shape), row_major_strides(tuple(result.shape)), result.nbytes)
                for result in plan.outputs
            ),
            tuple(step.index for step in plan.kept), mode,
            # The lane's refill would cache this call's list, copies into
            # this program's form included: state read in a stored form
            # leaves the cache to ``_CallPlan.arguments``.
            len({id(slot) for slot in plan.state_slots}) == len(plan.state_slots) and not plan.stored_layouts,
            len(plan.state_slots),
            tuple((row_of[check.index], check.low, check.high) for check in exe._index_checks),
        )


_TORCH_DTYPES = {
    "f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
    "ui8": torch.uint8, "i1": torch.bool, "complex<f32>": torch.complex64,
    "complex<f64>": torch.complex128, "ui16": torch.uint16, "ui32": torch.uint32, "ui64": torch.uint64,
}


def _torch_dtype(element_type: ir.Type) -> torch.dtype:
    text = str(element_type)
    if text not in _TORCH_DTYPES:
        raise ExecutionError(f"element type {text} has no torch dtype")
    return _TORCH_DTYPES[text]
