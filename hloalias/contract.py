"""The IR contract as typed records, read and written in one place.

:mod:`hloalias.attributes` documents the attributes; this module is their
only reader and writer.  Passes, the runtime and ``hloalias-opt`` exchange
:class:`ArgRecord`, :class:`ResultRecord` and :class:`RemovedResult` values
and never parse attribute dictionaries themselves.

- :meth:`Signature.read` turns ``@main``'s attributes into records and
  raises :class:`IRError` naming the attribute and the argument or result
  when one has the wrong type or value.
- :func:`verify` also checks the records against each other (keys unique,
  rebuild bases kept, aliasing in range and type-correct).  Every hloalias
  pass runs it on entry and exit and the runtime once on the final module,
  so a module that breaks the contract fails at compile time; within a
  :func:`verification_scope` (a pipeline run) a check of a signature that
  did not change since the last one returns its records.
- :meth:`Signature.write` writes records back, always in canonical form
  (every result has its role, and its output number or mutated argument).
- :class:`DonationRequest` and :func:`resolve_donations` are the one record
  of what a caller asked to donate and the one reading of it: ``compile``
  (``donate``, ``donate_argnums``, ``donate_argnames``, ``donate_state``)
  and ``alias-donated-buffers{donate=...}`` (``state:NAME``, ``input:NAME``,
  an argument index, or a bare name that must be unambiguous) both resolve
  through it; the result is written once, as ``jax.buffer_donor`` on the
  arguments (:attr:`ArgRecord.buffer_donor`), which the pass and the runtime
  read.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
from collections.abc import Iterator, Sequence

from torch_mlir import ir
from torch_mlir.dialects import func

from hloalias import attributes as A
from hloalias import config
from hloalias.errors import DonationError, IRError
from hloalias.mlir import (
    arg_attr_dicts,
    return_op,
    result_attr_dicts,
    set_arg_attr_dicts,
    set_result_attr_dicts,
)

DONATION_ORIGINS = ("inferred", "explicit", "both")
#: ``hloalias.kind`` of the key random ops draw from, and its type (hloalias/attributes.py).
RNG_KEY_KIND = "rng_key"
RNG_KEY_TYPE = "tensor<2xi64>"
#: On a mesh spanning processes, the key as one row per device
#: (``tensor<Nx2xi64>``), split ``N`` ways along its rows.
RNG_KEY_ROWS_SHARDING = "{{devices=[{rows},1]<=[{rows}]}}"
REMOVAL_REASONS = (A.REASON_VIEW, A.REASON_PASS_THROUGH, A.REASON_DUPLICATE, A.REASON_DEAD)

# Contract attributes on arguments and results: what ``to_attrs`` owns.
_ARG_NAMES = (
    A.ARG_KIND, A.ARG_NAME, A.ALIASING_OUTPUT, A.BUFFER_DONOR, A.ARG_DONATION, A.ARG_UNUSED_DONATION,
    A.SHARDING, A.ARG_STORED_PERMUTATION, A.ARG_STORED_REVERSED, A.ARG_STORED_BITS_OF, A.ARG_INDEX_RANGES,
)

#: Float element types state may be stored as bits of (``hloalias.stored_bits_of``), with their width.
BITS_OF_FLOAT = {"bf16": 16, "f16": 16, "f32": 32, "f64": 64}
_RESULT_NAMES = (A.RESULT_ROLE, A.RESULT_OUTPUT, A.RESULT_MUTATES, A.RESULT_STORAGE, A.SHARDING)


# -- typed attribute readers ------------------------------------------------------

def _string(attr: ir.Attribute, what: str) -> str:
    try:
        return str(ir.StringAttr(attr).value)
    except ValueError:
        raise IRError(f"{what} must be a string, got {attr}") from None


def _integer(attr: ir.Attribute, what: str) -> int:
    try:
        integer = ir.IntegerAttr(attr)
    except ValueError:
        raise IRError(f"{what} must be an integer, got {attr}") from None
    # A boolean is an i1 IntegerAttr whose signed value is -1 or 0: 'true'
    # would read as -1 and be reported as a number the user never wrote.
    if str(integer.type) == "i1":
        raise IRError(f"{what} must be an integer, got the boolean {attr}")
    return int(integer.value)


def _boolean(attr: ir.Attribute, what: str) -> bool:
    if isinstance(attr, ir.UnitAttr):
        return True
    try:
        return bool(ir.BoolAttr(attr).value)
    except ValueError:
        raise IRError(f"{what} must be a boolean, got {attr}") from None


def _i64(value: int) -> ir.IntegerAttr:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def _i32(value: int) -> ir.IntegerAttr:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(32), value)


def check_key(text: str, what: str, *, allow_arg: bool) -> str:
    """``text`` if it is a well-formed result key (or ``arg:I`` when
    ``allow_arg``), else IRError naming ``what``."""
    try:
        kind, _ = A.parse_key(text)
    except ValueError:
        kind = ""
    if kind in ("output", "mutation") or (allow_arg and kind == "arg"):
        return text
    expected = "'output:N', 'mutation:I' or 'arg:I'" if allow_arg else "'output:N' or 'mutation:I'"
    raise IRError(f"{what} is '{text}', expected {expected}")


# -- layouts -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a view's elements lie in its base: ``as_strided(sizes, strides, offset)``
    in elements of ``element_type``, relative to a contiguous row-major base."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    element_type: ir.Type

    @staticmethod
    def contiguous(tensor_type: ir.Type) -> Layout:
        """Row-major layout of a whole tensor of ``tensor_type``."""
        tensor = ir.RankedTensorType(tensor_type)
        sizes = tuple(int(s) for s in tensor.shape)
        return Layout(sizes, row_major_strides(sizes), 0, tensor.element_type)


def row_major_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Strides (in elements) of a contiguous row-major tensor of ``sizes``."""
    strides = []
    running = 1
    for size in reversed(sizes):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


# -- records ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class IndexRange:
    """One entry of ``hloalias.index_ranges``: every element ``v`` of the
    argument must satisfy ``low <= v < high``, the indices eager's ``op``
    (``"aten.embedding"``) accepts, called at ``where`` (the user's source
    line, None when unknown)."""

    low: int
    high: int
    op: str
    where: str | None = None

    def describe(self) -> str:
        """``[0, 10) of aten.embedding (model.py:12 in forward: ...)``."""
        return f"[{self.low}, {self.high}) of {self.op}" + (f" ({self.where})" if self.where else "")

    @staticmethod
    def from_attr(attr: ir.Attribute, what: str) -> IndexRange:
        """Read one entry; IRError names ``what`` and the field."""
        try:
            record = ir.DictAttr(attr)
        except ValueError:
            raise IRError(f"{what} must be a dictionary, got {attr}") from None
        for name in ("low", "high", "op"):
            if name not in record:
                raise IRError(f"{what} lacks '{name}'")
        low = _integer(record["low"], f"{what}: 'low'")
        high = _integer(record["high"], f"{what}: 'high'")
        if low > high:
            raise IRError(f"{what}: 'low' is {low}, above 'high' {high}")
        where = _string(record["where"], f"{what}: 'where'") if "where" in record else None
        return IndexRange(low, high, _string(record["op"], f"{what}: 'op'"), where)

    def to_attr(self) -> ir.Attribute:
        """The dictionary stored in ``hloalias.index_ranges``."""
        entries: dict[str, ir.Attribute] = {
            "low": _i64(self.low), "high": _i64(self.high), "op": ir.StringAttr.get(self.op),
        }
        if self.where is not None:
            entries["where"] = ir.StringAttr.get(self.where)
        return ir.DictAttr.get(entries)


@dataclasses.dataclass(frozen=True)
class ArgRecord:
    """What the contract says about one argument of ``@main``."""

    kind: str | None = None
    name: str | None = None
    aliasing_output: int | None = None  # tf.aliasing_output
    buffer_donor: bool = False  # jax.buffer_donor
    donation: str | None = None  # why aliased or offered: inferred / explicit / both
    unused_donation: str | None = None  # why a donation was not turned into an alias
    sharding: str | None = None  # mhlo.sharding without blanks; None: one device
    # hloalias.stored_permutation / stored_reversed: how the state's device buffer holds it
    stored_layout: StoredLayout | None = None
    # hloalias.stored_bits_of: the float element type ("bf16") whose bits the integer buffer holds
    stored_bits_of: str | None = None
    # hloalias.index_ranges: the index ranges eager accepts for a user input's values
    index_ranges: tuple[IndexRange, ...] = ()

    @property
    def overwritten(self) -> bool:
        """Whether XLA may write into this argument's buffer."""
        return self.aliasing_output is not None or self.buffer_donor

    def display_name(self, index: int) -> str:
        """``hloalias.name``, or ``argI`` when the argument has none."""
        return self.name if self.name is not None else f"arg{index}"

    @staticmethod
    def from_attrs(attrs: dict[str, ir.Attribute], index: int) -> ArgRecord:
        """Read argument ``index``'s attributes; IRError names a bad one."""

        def what(name: str) -> str:
            return f"argument {index}: '{name}'"

        def opt_string(name: str) -> str | None:
            return _string(attrs[name], what(name)) if name in attrs else None

        kind = opt_string(A.ARG_KIND)
        if kind is not None and kind not in A.ARG_KINDS:
            raise IRError(f"{what(A.ARG_KIND)} is '{kind}', expected one of {', '.join(A.ARG_KINDS)}")
        donation = opt_string(A.ARG_DONATION)
        if donation is not None and donation not in DONATION_ORIGINS:
            raise IRError(
                f"{what(A.ARG_DONATION)} is '{donation}', expected one of {', '.join(DONATION_ORIGINS)}"
            )
        aliasing = None
        if A.ALIASING_OUTPUT in attrs:
            aliasing = _integer(attrs[A.ALIASING_OUTPUT], what(A.ALIASING_OUTPUT))
        donor = _boolean(attrs[A.BUFFER_DONOR], what(A.BUFFER_DONOR)) if A.BUFFER_DONOR in attrs else False
        def opt_i64_array(name: str) -> tuple[int, ...] | None:
            if name not in attrs:
                return None
            try:
                return tuple(int(v) for v in ir.DenseI64ArrayAttr(attrs[name]))
            except ValueError:
                raise IRError(f"{what(name)} must be an array<i64>, got {attrs[name]}") from None

        permutation = opt_i64_array(A.ARG_STORED_PERMUTATION)
        reversed_dims = opt_i64_array(A.ARG_STORED_REVERSED)
        if reversed_dims is not None and permutation is None:
            raise IRError(f"{what(A.ARG_STORED_REVERSED)} needs '{A.ARG_STORED_PERMUTATION}' beside it")
        layout = None if permutation is None else StoredLayout(permutation, reversed_dims or ())
        bits_of = None
        if A.ARG_STORED_BITS_OF in attrs:
            try:
                bits_of = str(ir.TypeAttr(attrs[A.ARG_STORED_BITS_OF]).value)
            except ValueError:
                raise IRError(
                    f"{what(A.ARG_STORED_BITS_OF)} must be a type, got {attrs[A.ARG_STORED_BITS_OF]}"
                ) from None
            if bits_of not in BITS_OF_FLOAT:
                raise IRError(
                    f"{what(A.ARG_STORED_BITS_OF)} is {bits_of}, expected one of {', '.join(BITS_OF_FLOAT)}"
                )
        index_ranges: tuple[IndexRange, ...] = ()
        if A.ARG_INDEX_RANGES in attrs:
            try:
                entries = ir.ArrayAttr(attrs[A.ARG_INDEX_RANGES])
            except ValueError:
                raise IRError(
                    f"{what(A.ARG_INDEX_RANGES)} must be an array of dictionaries, got {attrs[A.ARG_INDEX_RANGES]}"
                ) from None
            index_ranges = tuple(
                IndexRange.from_attr(entry, f"{what(A.ARG_INDEX_RANGES)} entry {position}")
                for position, entry in enumerate(entries)
            )
        return ArgRecord(
            kind, opt_string(A.ARG_NAME), aliasing, donor, donation, opt_string(A.ARG_UNUSED_DONATION),
            _sharding(opt_string(A.SHARDING)), layout, bits_of, index_ranges,
        )

    def to_attrs(self, attrs: dict[str, ir.Attribute]) -> dict[str, ir.Attribute]:
        """``attrs`` with the contract attributes replaced by this record's."""
        out = {k: v for k, v in attrs.items() if k not in _ARG_NAMES}
        if self.kind is not None:
            out[A.ARG_KIND] = ir.StringAttr.get(self.kind)
        if self.name is not None:
            out[A.ARG_NAME] = ir.StringAttr.get(self.name)
        if self.aliasing_output is not None:
            out[A.ALIASING_OUTPUT] = _i32(self.aliasing_output)
        if self.buffer_donor:
            out[A.BUFFER_DONOR] = ir.BoolAttr.get(True)
        if self.donation is not None:
            out[A.ARG_DONATION] = ir.StringAttr.get(self.donation)
        if self.unused_donation is not None:
            out[A.ARG_UNUSED_DONATION] = ir.StringAttr.get(self.unused_donation)
        if self.sharding is not None:
            out[A.SHARDING] = ir.StringAttr.get(self.sharding)
        if self.stored_layout is not None:
            out[A.ARG_STORED_PERMUTATION] = ir.DenseI64ArrayAttr.get(list(self.stored_layout.permutation))
            if self.stored_layout.reversed:
                out[A.ARG_STORED_REVERSED] = ir.DenseI64ArrayAttr.get(list(self.stored_layout.reversed))
        if self.stored_bits_of is not None:
            out[A.ARG_STORED_BITS_OF] = ir.TypeAttr.get(ir.Type.parse(self.stored_bits_of))
        if self.index_ranges:
            out[A.ARG_INDEX_RANGES] = ir.ArrayAttr.get([entry.to_attr() for entry in self.index_ranges])
        return out


def inverse_permutation(permutation: Sequence[int]) -> tuple[int, ...]:
    """Q with ``Q[P[d]] == d``: ``t.permute(P).permute(Q)`` is ``t``."""
    inverse = [0] * len(permutation)
    for position, dimension in enumerate(permutation):
        inverse[dimension] = position
    return tuple(inverse)


@dataclasses.dataclass(frozen=True)
class StoredLayout:
    """How a state buffer holds its torch tensor ``t``: ``t.permute(permutation)``,
    then flipped along the (stored) dimensions in ``reversed``."""

    permutation: tuple[int, ...]
    reversed: tuple[int, ...] = ()

    @property
    def inverse(self) -> tuple[int, ...]:
        """The permutation back to torch's dimension order."""
        return inverse_permutation(self.permutation)

    def is_identity(self) -> bool:
        """Whether the buffer is in torch's layout after all."""
        return not self.reversed and self.permutation == tuple(range(len(self.permutation)))

    def valid_for(self, rank: int) -> bool:
        """A permutation of ``rank`` dimensions and distinct, sorted reversed dimensions."""
        return sorted(self.permutation) == list(range(rank)) and (
            list(self.reversed) == sorted(set(self.reversed)) and all(0 <= d < rank for d in self.reversed)
        )

    def spec(self) -> str:
        """``P0.P1...`` or ``P0.P1.../R0.R1...`` (as ``permute-conv-kernel-state{layouts=...}`` reads)."""
        text = ".".join(str(d) for d in self.permutation)
        return text + "/" + ".".join(str(d) for d in self.reversed) if self.reversed else text

    @staticmethod
    def from_spec(text: str) -> StoredLayout:
        """Parse :meth:`spec`'s form; ValueError when malformed."""
        permutation, slash, reversed_dims = text.partition("/")
        parts = permutation.split(".")
        flipped = reversed_dims.split(".") if slash else []
        if not all(A.is_index(part) for part in parts + flipped):
            raise ValueError(text)
        return StoredLayout(tuple(int(p) for p in parts), tuple(int(r) for r in flipped))

    def describe(self) -> str:
        """``permute(2, 3, 1, 0)`` or ``permute(2, 3, 1, 0) then flip(0, 1)``."""
        text = f"permute{self.permutation}"
        return text + f" then flip{self.reversed}" if self.reversed else text


@dataclasses.dataclass(frozen=True)
class ResultRecord:
    """What the contract says about one result of ``@main`` (canonical:
    a user output always has ``output``, a mutation always ``mutates``)."""

    role: str
    output: int | None = None
    mutates: int | None = None
    storage: str | None = None
    sharding: str | None = None  # mhlo.sharding without blanks; None: the partitioner's choice

    @property
    def key(self) -> str:
        """The result key (``output:N`` / ``mutation:I``)."""
        if self.role == A.ROLE_MUTATION:
            assert self.mutates is not None
            return A.mutation_key(self.mutates)
        assert self.output is not None
        return A.output_key(self.output)

    @staticmethod
    def from_attrs(attrs: dict[str, ir.Attribute], position: int) -> ResultRecord:
        """Read result ``position``'s attributes.  A result without a role is
        a user output; one without an output number is user output
        ``position``.  IRError names a bad attribute."""

        def what(name: str) -> str:
            return f"result {position} of @main: '{name}'"

        role = _string(attrs[A.RESULT_ROLE], what(A.RESULT_ROLE)) if A.RESULT_ROLE in attrs else None
        output = _integer(attrs[A.RESULT_OUTPUT], what(A.RESULT_OUTPUT)) if A.RESULT_OUTPUT in attrs else None
        mutates = (
            _integer(attrs[A.RESULT_MUTATES], what(A.RESULT_MUTATES)) if A.RESULT_MUTATES in attrs else None
        )
        storage = (
            _string(attrs[A.RESULT_STORAGE], what(A.RESULT_STORAGE)) if A.RESULT_STORAGE in attrs else None
        )
        if role is None:
            role = A.ROLE_MUTATION if mutates is not None and output is None else A.ROLE_USER_OUTPUT
        if role == A.ROLE_USER_OUTPUT:
            if mutates is not None:
                raise IRError(f"{what(A.RESULT_MUTATES)} is set on a user output")
            if output is None:
                output = position
            if output < 0:
                raise IRError(f"{what(A.RESULT_OUTPUT)} is {output}, expected a position >= 0")
        elif role == A.ROLE_MUTATION:
            if output is not None:
                raise IRError(f"{what(A.RESULT_OUTPUT)} is set on a mutation result")
            if mutates is None:
                raise IRError(f"{what(A.RESULT_MUTATES)} is missing: the result is a mutation")
        else:
            raise IRError(
                f"{what(A.RESULT_ROLE)} is '{role}', expected '{A.ROLE_USER_OUTPUT}' or '{A.ROLE_MUTATION}'"
            )
        if storage is not None:
            kind, _, number = storage.partition(":")
            if kind not in ("arg", "new") or not A.is_index(number):
                raise IRError(f"{what(A.RESULT_STORAGE)} is '{storage}', expected 'arg:I' or 'new:N'")
        sharding = _string(attrs[A.SHARDING], what(A.SHARDING)) if A.SHARDING in attrs else None
        return ResultRecord(role, output, mutates, storage, _sharding(sharding))

    def to_attrs(self, attrs: dict[str, ir.Attribute]) -> dict[str, ir.Attribute]:
        """``attrs`` with the contract attributes replaced by this record's."""
        out = {k: v for k, v in attrs.items() if k not in _RESULT_NAMES}
        out[A.RESULT_ROLE] = ir.StringAttr.get(self.role)
        if self.output is not None:
            out[A.RESULT_OUTPUT] = _i64(self.output)
        if self.mutates is not None:
            out[A.RESULT_MUTATES] = _i64(self.mutates)
        if self.storage is not None:
            out[A.RESULT_STORAGE] = ir.StringAttr.get(self.storage)
        if self.sharding is not None:
            out[A.SHARDING] = ir.StringAttr.get(self.sharding)
        return out


@dataclasses.dataclass(frozen=True)
class RemovedResult:
    """One entry of ``hloalias.removed_results``: why result ``key`` left
    ``@main`` and how to rebuild it from ``base`` (both None for dead)."""

    key: str
    reason: str
    base: str | None = None
    layout: Layout | None = None
    chain: tuple[str, ...] = ()

    @property
    def is_identity(self) -> bool:
        """The base itself (a pass-through or duplicate without view ops)."""
        return self.reason in (A.REASON_PASS_THROUGH, A.REASON_DUPLICATE) and not self.chain

    @staticmethod
    def from_attr(attr: ir.Attribute, index: int) -> RemovedResult:
        """Read entry ``index`` of ``hloalias.removed_results``."""
        where = f"'{A.REMOVED_RESULTS}' entry {index}"
        try:
            record = ir.DictAttr(attr)
        except ValueError:
            raise IRError(f"{where} must be a dictionary, got {attr}") from None

        def field(name: str) -> ir.Attribute:
            if name not in record:
                raise IRError(f"{where} lacks '{name}'")
            return record[name]

        key = check_key(_string(field("result"), f"{where}: 'result'"), f"{where}: 'result'", allow_arg=False)
        reason = _string(field("reason"), f"{where}: 'reason'")
        if reason not in REMOVAL_REASONS:
            raise IRError(f"{where}: 'reason' is '{reason}', expected one of {', '.join(REMOVAL_REASONS)}")
        if reason == A.REASON_DEAD:
            if "base" in record:
                raise IRError(f"{where} ({key}) is dead but has a 'base'")
            return RemovedResult(key, reason)
        base = check_key(_string(field("base"), f"{where}: 'base'"), f"{where}: 'base'", allow_arg=True)
        try:
            element_type = ir.TypeAttr(field("dtype")).value
        except ValueError:
            raise IRError(f"{where}: 'dtype' must be a type, got {record['dtype']}") from None
        arrays = []
        for name in ("sizes", "strides"):
            try:
                arrays.append(tuple(int(v) for v in ir.DenseI64ArrayAttr(field(name))))
            except ValueError:
                raise IRError(f"{where}: '{name}' must be an array<i64>, got {record[name]}") from None
        sizes, strides = arrays
        if len(sizes) != len(strides):
            raise IRError(f"{where}: 'sizes' has {len(sizes)} entries but 'strides' {len(strides)}")
        if any(s < 0 for s in sizes):
            raise IRError(f"{where}: 'sizes' {list(sizes)} has a negative size")
        offset = _integer(field("offset"), f"{where}: 'offset'")
        if offset < 0:
            raise IRError(f"{where}: 'offset' is {offset}, expected >= 0")
        chain: tuple[str, ...] = ()
        if "chain" in record:
            try:
                entries = ir.ArrayAttr(record["chain"])
            except ValueError:
                raise IRError(f"{where}: 'chain' must be an array of strings, got {record['chain']}") from None
            chain = tuple(_string(entry, f"{where}: 'chain'") for entry in entries)
        return RemovedResult(key, reason, base, Layout(sizes, strides, offset, element_type), chain)

    def to_attr(self) -> ir.Attribute:
        """The dictionary stored in ``hloalias.removed_results``."""
        entries: dict[str, ir.Attribute] = {
            "result": ir.StringAttr.get(self.key),
            "reason": ir.StringAttr.get(self.reason),
        }
        if self.base is not None and self.layout is not None:
            entries["base"] = ir.StringAttr.get(self.base)
            entries["dtype"] = ir.TypeAttr.get(self.layout.element_type)
            entries["sizes"] = ir.DenseI64ArrayAttr.get(list(self.layout.sizes))
            entries["strides"] = ir.DenseI64ArrayAttr.get(list(self.layout.strides))
            entries["offset"] = _i64(self.layout.offset)
            entries["chain"] = ir.ArrayAttr.get([ir.StringAttr.get(c) for c in self.chain])
        return ir.DictAttr.get(entries)


def read_removed_results(main: func.FuncOp) -> tuple[RemovedResult, ...]:
    """``@main``'s ``hloalias.removed_results`` as records (empty if absent)."""
    if A.REMOVED_RESULTS not in main.attributes:
        return ()
    attr = main.attributes[A.REMOVED_RESULTS]
    try:
        entries = ir.ArrayAttr(attr)
    except ValueError:
        raise IRError(f"'{A.REMOVED_RESULTS}' must be an array of dictionaries, got {attr}") from None
    return tuple(RemovedResult.from_attr(entry, index) for index, entry in enumerate(entries))


def write_removed_results(main: func.FuncOp, removed: Sequence[RemovedResult]) -> None:
    """Replace ``@main``'s ``hloalias.removed_results`` (dropped when empty)."""
    if not removed:
        if A.REMOVED_RESULTS in main.attributes:
            del main.attributes[A.REMOVED_RESULTS]
        return
    main.attributes[A.REMOVED_RESULTS] = ir.ArrayAttr.get([r.to_attr() for r in removed])


@dataclasses.dataclass(frozen=True)
class Signature:
    """``@main``'s contract: one record per argument and result, the
    removed results, and the types (for checks that need them)."""

    args: tuple[ArgRecord, ...]
    results: tuple[ResultRecord, ...]
    removed: tuple[RemovedResult, ...]
    arg_types: tuple[ir.Type, ...]
    result_types: tuple[ir.Type, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        """The kept results' keys, by position."""
        return tuple(r.key for r in self.results)

    def arg_what(self, index: int) -> str:
        """``argument I ('name')`` for messages."""
        return f"argument {index} ('{self.args[index].display_name(index)}')"

    @staticmethod
    def read(main: func.FuncOp) -> Signature:
        """Read every contract attribute of ``main`` into records (types
        and values of each attribute checked; relations by :meth:`check`).
        Reads only :data:`SIGNATURE_ATTRIBUTES` and the argument count."""
        arg_dicts = arg_attr_dicts(main)
        result_dicts = result_attr_dicts(main)
        function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        return Signature(
            tuple(ArgRecord.from_attrs(attrs, i) for i, attrs in enumerate(arg_dicts)),
            tuple(ResultRecord.from_attrs(attrs, p) for p, attrs in enumerate(result_dicts)),
            read_removed_results(main),
            tuple(function_type.inputs),
            tuple(function_type.results),
        )

    def check(self) -> None:
        """The relations between records; IRError names the culprit."""
        arg_count = len(self.args)
        seen: dict[str, str] = {}
        for position, result in enumerate(self.results):
            what = f"result {position} of @main"
            if result.mutates is not None and not 0 <= result.mutates < arg_count:
                raise IRError(
                    f"{what}: '{A.RESULT_MUTATES}' is {result.mutates}; @main has {arg_count} arguments"
                )
            if result.key in seen:
                raise IRError(f"{what} has result key {result.key}, like {seen[result.key]}")
            seen[result.key] = what
        kept = set(seen)
        for index, record in enumerate(self.removed):
            what = f"'{A.REMOVED_RESULTS}' entry {index} ({record.key})"
            if record.key in seen:
                raise IRError(f"{what}: result key {record.key} is also {seen[record.key]}")
            seen[record.key] = f"removed entry {index}"
        for index, record in enumerate(self.removed):
            if record.base is None:
                continue
            what = f"'{A.REMOVED_RESULTS}' entry {index} ({record.key}): 'base'"
            kind, number = A.parse_key(record.base)
            if kind == "arg":
                if number >= arg_count:
                    raise IRError(f"{what} is {record.base}; @main has {arg_count} arguments")
            elif record.base not in kept:
                state = "a removed result" if record.base in seen else "no result of @main"
                raise IRError(f"{what} is {record.base}, which is {state}: a base must be kept")
        self._check_stored_permutations()
        self._check_stored_bits()
        self._check_index_ranges()
        self._check_rng_key()
        holders: dict[int, int] = {}
        for index, arg in enumerate(self.args):
            if arg.aliasing_output is None:
                continue
            what = f"{self.arg_what(index)}: '{A.ALIASING_OUTPUT}' = {arg.aliasing_output}"
            if not 0 <= arg.aliasing_output < len(self.results):
                raise IRError(f"{what} is out of range; @main has {len(self.results)} results")
            if arg.aliasing_output in holders:
                other = holders[arg.aliasing_output]
                raise IRError(
                    f"{what}, but {self.arg_what(other)} already aliases result {arg.aliasing_output}"
                )
            holders[arg.aliasing_output] = index
            if self.arg_types[index] != self.result_types[arg.aliasing_output]:
                raise IRError(
                    f"{what} pairs {self.arg_types[index]} with result of type "
                    f"{self.result_types[arg.aliasing_output]}"
                )
            result_sharding = self.results[arg.aliasing_output].sharding
            if arg.sharding != result_sharding:
                raise IRError(
                    f"{what} pairs sharding {placement_text(arg.sharding)} with result sharding "
                    f"{placement_text(result_sharding)}: a buffer holds one shard"
                )

    def _check_stored_permutations(self) -> None:
        """``hloalias.stored_permutation`` only where a permuted buffer is
        never seen in torch's layout: read-only, unsharded state that no
        rebuilt view uses as its base."""
        mutated = {result.mutates for result in self.results if result.mutates is not None}
        view_bases = {record.base for record in self.removed if record.base is not None}
        for index, arg in enumerate(self.args):
            layout = arg.stored_layout
            if layout is None:
                continue
            what = f"{self.arg_what(index)}: '{A.ARG_STORED_PERMUTATION}' = {list(layout.permutation)}"
            if layout.reversed:
                what += f", '{A.ARG_STORED_REVERSED}' = {list(layout.reversed)}"
            rank = ir.RankedTensorType(self.arg_types[index]).rank
            if not layout.valid_for(rank):
                raise IRError(
                    f"{what} is not a permutation (and sorted distinct reversed dimensions) of the "
                    f"dimensions of {self.arg_types[index]}"
                )
            if arg.kind not in ("parameter", "buffer", "constant"):
                raise IRError(f"{what} is on {'an argument without a kind' if arg.kind is None else 'a ' + arg.kind}: "
                              "only module state is stored permuted")
            if arg.overwritten or index in mutated:
                raise IRError(f"{what} is on an argument XLA overwrites: only read-only state is stored permuted")
            if A.arg_key(index) in view_bases:
                raise IRError(f"{what} is on the base of a rebuilt view: the view needs torch's layout")
            if arg.sharding is not None:
                raise IRError(f"{what} is on a sharded argument: its sharding is in torch's dimensions")

    def _check_stored_bits(self) -> None:
        """``hloalias.stored_bits_of`` only on unsharded, unpermuted state
        that no rebuilt view uses as its base (or a user input aliased to its
        own new value: written in place; its views are rebuilt from the
        caller's tensor), whose type (and its new
        value's) is the same-width signless integer."""
        bases = {record.base for record in self.removed if record.base is not None}
        for index, arg in enumerate(self.args):
            if arg.stored_bits_of is None:
                continue
            what = f"{self.arg_what(index)}: '{A.ARG_STORED_BITS_OF}' = {arg.stored_bits_of}"
            width = BITS_OF_FLOAT[arg.stored_bits_of]
            element = ir.RankedTensorType(self.arg_types[index]).element_type
            if not (isinstance(element, ir.IntegerType) and element.is_signless and element.width == width):
                raise IRError(f"{what} is on an argument of type {self.arg_types[index]}, expected element type i{width}")
            if arg.kind == "user_input":
                aliased = arg.aliasing_output
                if aliased is None or not 0 <= aliased < len(self.results) or self.results[aliased].mutates != index:
                    raise IRError(f"{what} is on a user_input not aliased to its own new value: only module state "
                                  "and user inputs written in place are stored as bits")
            elif arg.kind not in ("parameter", "buffer", "constant"):
                raise IRError(f"{what} is on {'an argument without a kind' if arg.kind is None else 'a ' + arg.kind}: "
                              "only module state is stored as bits")
            if arg.stored_layout is not None:
                raise IRError(f"{what} is on an argument also stored permuted ('{A.ARG_STORED_PERMUTATION}')")
            if arg.kind != "user_input" and (A.arg_key(index) in bases or A.mutation_key(index) in bases):
                # (a user input's views are rebuilt from the caller's tensor, in its dtype)
                raise IRError(f"{what} is on the base of a rebuilt view: the view needs torch's dtype")
            if arg.sharding is not None:
                raise IRError(f"{what} is on a sharded argument")
            for position, result in enumerate(self.results):
                if result.mutates == index and self.result_types[position] != self.arg_types[index]:
                    raise IRError(
                        f"{what}, but its new value (result {position}) has type {self.result_types[position]}: "
                        "state and new value are stored alike"
                    )

    def _check_index_ranges(self) -> None:
        """``hloalias.index_ranges`` only on a user input of signless integer
        element type that is not stored as bits.  Sharded or replicated
        arguments may have them: the runtime checks the caller's whole
        tensor on the host, before placing it."""
        for index, arg in enumerate(self.args):
            if not arg.index_ranges:
                continue
            what = f"{self.arg_what(index)}: '{A.ARG_INDEX_RANGES}'"
            if arg.kind not in ("user_input", None):
                raise IRError(f"{what} is on a {arg.kind}: only user inputs are checked on each call")
            try:
                element = ir.RankedTensorType(self.arg_types[index]).element_type
            except ValueError:  # torch-mlir's !torch.vtensor (an import stopped at the torch dialect)
                element = None
            if element is not None and not (
                isinstance(element, ir.IntegerType) and element.is_signless and element.width > 1
            ):
                raise IRError(f"{what} is on an argument of type {self.arg_types[index]}, expected integer elements")
            if arg.stored_bits_of is not None:
                raise IRError(f"{what} is on an argument stored as bits ('{A.ARG_STORED_BITS_OF}')")

    def _check_rng_key(self) -> None:
        """An ``rng_key`` argument (:mod:`hloalias.frontend.random_key`) is
        the last, the only one, and only read: the runtime passes a fresh
        key on every call, so nothing may write, donate, re-store or check
        it, or rebuild a view of it.  Its type is ``tensor<2xi64>``, not
        split (every device draws from the whole key); or, on a mesh
        spanning processes, ``tensor<Nx2xi64>`` split one row per device
        (:data:`RNG_KEY_ROWS_SHARDING`): each process's devices hold its
        own key, and the program reads row 0 (``random_key.read_first_row_key``)."""
        keys = [index for index, arg in enumerate(self.args) if arg.kind == RNG_KEY_KIND]
        if not keys:
            return
        index = keys[-1]
        what = f"{self.arg_what(index)}: '{A.ARG_KIND}' = '{RNG_KEY_KIND}'"
        if len(keys) > 1:
            raise IRError(f"{what}, but {self.arg_what(keys[0])} is one too: @main has one key")
        if index != len(self.args) - 1:
            raise IRError(f"{what} is not @main's last argument")
        arg = self.args[index]
        per_device = re.fullmatch(r"tensor<([1-9][0-9]*)x2xi64>", str(self.arg_types[index]))
        rows = int(per_device.group(1)) if per_device is not None else 0
        if rows >= 2:
            wanted = RNG_KEY_ROWS_SHARDING.format(rows=rows)
            if arg.sharding != wanted:
                raise IRError(
                    f"{what} has type {self.arg_types[index]} (one key per device) and sharding "
                    f"{placement_text(arg.sharding)}, expected {wanted}: each device holds its process's key"
                )
        elif str(self.arg_types[index]) != RNG_KEY_TYPE:
            raise IRError(
                f"{what} has type {self.arg_types[index]}, expected {RNG_KEY_TYPE} (or tensor<Nx2xi64>, N >= 2, "
                "one key per device of a mesh spanning processes)"
            )
        elif arg.sharding is not None and arg.sharding != "{replicated}":
            raise IRError(f"{what} has sharding {arg.sharding}: every device draws from the whole key")
        mutated = any(result.mutates == index for result in self.results)
        if arg.overwritten or mutated or arg.stored_layout is not None or arg.stored_bits_of is not None:
            raise IRError(f"{what} is written, donated or stored in another form: a key is only read")
        if arg.index_ranges:
            raise IRError(f"{what} has '{A.ARG_INDEX_RANGES}': only user inputs are checked on each call")
        if any(record.base == A.arg_key(index) for record in self.removed):
            raise IRError(f"{what} is the base of a rebuilt view")

    def write(self, main: func.FuncOp) -> None:
        """Write the records to ``main`` in canonical form, keeping any
        attribute that is not part of the contract."""
        set_arg_attr_dicts(
            main, [rec.to_attrs(attrs) for rec, attrs in zip(self.args, arg_attr_dicts(main))]
        )
        set_result_attr_dicts(
            main, [rec.to_attrs(attrs) for rec, attrs in zip(self.results, result_attr_dicts(main))]
        )
        write_removed_results(main, self.removed)


def _sharding(text: str | None) -> str | None:
    """An ``mhlo.sharding`` in canonical form: without blanks."""
    return None if text is None else "".join(text.split())


def placement_text(sharding: str | None) -> str:
    """A sharding for messages; None is the partitioner's choice."""
    return sharding if sharding is not None else "chosen by the partitioner"


#: The attributes of ``@main`` that :meth:`Signature.read` reads (with the
#: number of arguments): the whole input of :func:`verify` besides the block
#: structure.  A new attribute read there must be added here.
SIGNATURE_ATTRIBUTES = ("function_type", "arg_attrs", "res_attrs", A.REMOVED_RESULTS)


class _Verified:
    """The last check of a :func:`verification_scope`: the key of the
    signature it read and the records it returned."""

    __slots__ = ("key", "signature")

    def __init__(self) -> None:
        self.key: tuple[object, ...] | None = None
        self.signature: Signature | None = None


_SCOPE: contextvars.ContextVar[_Verified | None] = contextvars.ContextVar("hloalias_contract_scope", default=None)


@contextlib.contextmanager
def verification_scope() -> Iterator[None]:
    """Within the block (this thread or task), :func:`verify` of an
    ``@main`` whose signature is the one it last checked in the block (the
    same :data:`SIGNATURE_ATTRIBUTES`, uniqued by MLIR, and the same number
    of arguments) returns that check's records without reading them again:
    the same result, since the contract reads nothing else (the block
    structure is checked every time).  A pass pipeline runs in one, so the
    checks before and after each pass cost a lookup where the pass left the
    signature alone.  Nested blocks share the outermost one's record.
    ``HLOALIAS_VERIFY_EACH_PASS=1`` (read on entry) makes every check a full
    one.  The record holds the attributes, so their context lives until the
    block ends."""
    if _SCOPE.get() is not None or config.flag("HLOALIAS_VERIFY_EACH_PASS"):
        yield
        return
    token = _SCOPE.set(_Verified())
    try:
        yield
    finally:
        _SCOPE.reset(token)


def _signature_key(main: func.FuncOp) -> tuple[object, ...]:
    attributes = main.attributes
    return (len(main.arguments), *(attributes.get(name) for name in SIGNATURE_ATTRIBUTES))


def _same_key(first: tuple[object, ...], second: tuple[object, ...]) -> bool:
    # Attributes are uniqued per context: equal is the same pointer.  (An
    # attribute compared with None raises, hence the pairs.)
    return first[0] == second[0] and all(
        a is b or (a is not None and b is not None and a == b) for a, b in zip(first[1:], second[1:])
    )


def verify(main: func.FuncOp, *, full: bool = False) -> Signature:
    """Check ``main`` against the whole IR contract and return its records.
    Raises :class:`IRError` naming the attribute and the argument or result.
    In a :func:`verification_scope`, an unchanged signature is not read
    again unless ``full``."""
    return_op(main)
    verified = _SCOPE.get()
    if verified is None or full:
        signature = Signature.read(main)
        signature.check()
        return signature
    key = _signature_key(main)
    if verified.signature is not None and verified.key is not None and _same_key(verified.key, key):
        return verified.signature
    signature = Signature.read(main)
    signature.check()
    verified.key, verified.signature = key, signature
    return signature


__all__ = [
    "ArgRecord", "BITS_OF_FLOAT", "DONATION_ORIGINS", "IndexRange", "Layout", "inverse_permutation", "placement_text", "REMOVAL_REASONS", "RemovedResult", "ResultRecord", "StoredLayout",
    "SIGNATURE_ATTRIBUTES", "Signature", "check_key", "read_removed_results", "row_major_strides", "verify",
    "verification_scope",
    "write_removed_results",
]


# -- donation requests -------------------------------------------------------------------

#: How a donation request names its argument: ``any`` a user input or state
#: by name, or a user input by position (``compile``'s ``donate``; a name
#: that is both is refused); ``input_position`` a user input by its position
#: among the user inputs; ``input`` a user input by name; ``state`` a
#: parameter, buffer or constant by name; ``arg`` an ``@main`` argument by
#: index (the pass option's bare number).
DONATION_KINDS = ("any", "input_position", "input", "state", "arg")
_STATE_KINDS = ("parameter", "buffer", "constant")


@dataclasses.dataclass(frozen=True)
class DonationRequest:
    """One request to donate an argument of ``@main``: ``kind`` (one of
    :data:`DONATION_KINDS`) says how ``target`` names it."""

    kind: str
    target: int | str

    @staticmethod
    def parse(text: str) -> "DonationRequest":
        """The pass option's spelling: ``state:NAME``, ``input:NAME``, an
        argument index (ASCII digits), or a bare name (``any``)."""
        for prefix, kind in (("state:", "state"), ("input:", "input")):
            if text.startswith(prefix):
                return DonationRequest(kind, text[len(prefix):])
        if text.isascii() and text.isdigit():
            return DonationRequest("arg", int(text))
        return DonationRequest("any", text)

    def spelling(self) -> str:
        """The request as the pass option spells it."""
        if self.kind in ("state", "input"):
            return f"{self.kind}:{self.target}"
        return str(self.target)


def resolve_donations(
    kinds: Sequence[str | None], names: Sequence[str | None], requests: Sequence[DonationRequest], *,
    in_pass: bool = False,
) -> list[int]:
    """The ``@main`` argument indices ``requests`` donate, in order, given
    each argument's ``hloalias.kind`` and ``hloalias.name`` (None where it
    has none: such an argument counts as a user input).
    :class:`DonationError` names the request that is unknown, out of range,
    ambiguous (a bare name that is both a user input and state), donated
    twice, or (``compile``'s requests) a lifted constant; ``in_pass``: the
    words of the pass option (arguments by index; constants are left to
    ``exclude_kinds``)."""
    user_inputs = [i for i, kind in enumerate(kinds) if kind == "user_input" or kind is None]
    by_input: dict[str | None, int] = {}
    by_state: dict[str | None, int] = {}
    for i in user_inputs:
        if names[i] is not None:
            by_input.setdefault(names[i], i)
    for i, kind in enumerate(kinds):
        if kind in _STATE_KINDS and names[i] is not None:
            by_state.setdefault(names[i], i)

    def label(index: int) -> str:
        return names[index] or f"arg{index}"

    chosen: list[int] = []
    for request in requests:
        target = request.target
        if request.kind not in DONATION_KINDS:
            raise DonationError(f"unknown donation kind '{request.kind}' (known: {', '.join(DONATION_KINDS)})")
        if request.kind == "arg":
            assert isinstance(target, int)
            if not 0 <= target < len(kinds):
                raise DonationError(f"donate names argument {target}, but @main has {len(kinds)} arguments")
            index = target
        elif isinstance(target, int):
            if request.kind not in ("any", "input_position"):
                raise DonationError(f"donate: {request.kind} donations are by name, got {target!r}")
            if not 0 <= target < len(user_inputs):
                raise DonationError(
                    f"donate names user input {target}, but the program has {len(user_inputs)} user inputs"
                )
            index = user_inputs[target]
        else:
            as_input = by_input.get(target) if request.kind in ("any", "input") else None
            as_state = by_state.get(target) if request.kind in ("any", "state") else None
            if as_input is not None and as_state is not None:
                raise DonationError(
                    f"donate name '{target}' is ambiguous: it is user input '{target}' "
                    f"(input:{target}, donate_argnames=['{target}'] or "
                    f"donate_argnums=[{user_inputs.index(as_input)}]) and {kinds[as_state]} '{target}' "
                    f"(state:{target}, donate_state=['{target}'])"
                )
            found = as_input if as_input is not None else as_state
            if found is None:
                known_by_kind: dict[str, list[str | None]] = {
                    "any": [label(i) for i in range(len(kinds))], "input": list(by_input), "state": list(by_state),
                }
                known = known_by_kind.get(request.kind, [])
                what = {"any": "argument" if in_pass else "tensor", "input": "user input", "state": "module state"}
                listed = ", ".join(str(k) for k in known) or "none"
                raise DonationError(
                    f"donate names unknown {what.get(request.kind, 'argument')} '{target}' "
                    + (f"(arguments: {listed})" if in_pass and request.kind == "any" else f"(known: {listed})")
                )
            index = found
        if index in chosen:
            if in_pass:
                raise DonationError(f"argument {index} ('{label(index)}') is donated twice")
            raise DonationError(f"'{label(index)}' is donated twice")
        if kinds[index] == "constant" and not in_pass:
            raise DonationError(f"'{label(index)}' is a lifted constant and cannot be donated")
        chosen.append(index)
    return chosen
