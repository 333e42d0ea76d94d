"""Random small torch programs for differential testing against eager PyTorch.

A :class:`GeneratedProgram` is Python source: a function ``program(x0, ...)``
or, when it has a buffer, an ``nn.Module`` ``Program`` whose ``forward``
starts with ``b = self.buf``.  Its body is a list of statements built from
an op list:

- views: slices with steps, open-ended and negative slices (``x[1:]``,
  ``x[:-1]``, ``x[-2:]``, ``x[1::2]``), ``narrow``, integer indexing and
  ``select``, ``x[..., i]``, ``x[None]``, a piece of ``split``/``chunk``/
  ``unbind``, ``unfold``, ``diagonal`` (dimensions and offsets of either
  sign), ``movedim``, ``mT``, ``flatten``/``unflatten`` and ``swapaxes``
  (dimensions counted from either end), ``view``/``reshape``,
  ``transpose``/``t``/``permute``, ``expand``, ``unsqueeze``/``squeeze``,
  ``view(torch.int32)`` on f32 (and ``view(torch.float32)`` on i32),
  ``contiguous``, an empty slice ``x[:, k:k]`` (returned only: an empty
  value is no operand);
- computations: ``v + c``, ``v * c``, ``v + w``, ``v.neg()``, ``v.clone()``,
  ``abs``, ``clamp``, ``torch.maximum``, ``torch.stack``, ``repeat``,
  ``torch.gather`` (repeated positions),
  ``flip``, ``roll``, ``torch.cat``, ``sum``/``cumsum``/``amax`` over a
  dimension counted from either end, ``torch.where`` on a comparison,
  advanced indexing with indices counted from the end (a list, or a
  tensor XLA sees only at run time), arithmetic on ``full_like`` bool and
  integer constants that is folded at import (``True + True``, ``-7 // 3``,
  ``-7 % 3``), and bf16 chains whose every intermediate eager rounds;
  dtype promotion as users meet it (``x_f32 + (x_i32 >> 20)``, an int32
  tensor times a Python float, ``int / int``, a product with a boolean
  mask ``x * (y > c)``), ``torch.cat`` with an empty piece (the first step
  of a growing cache), ``torch.take`` with flat positions counted from
  the end;
- reads through ``as_strided`` (sizes, strides and an optional storage
  offset within the operand's storage), copied out (``.clone()``, ``+ c``):
  a returned ``as_strided`` view and a write through one are refused by
  hloalias (``test_as_strided.py``);
- in-place updates of inputs, of the buffer, of intermediates and through
  views of any of them: ``add_``, ``sub_``, ``mul_``, ``div_``, ``clamp_``,
  ``zero_``, ``copy_`` (also from the other dtype: ``buf.copy_(x_int32)``),
  ``fill_``, ``scatter_``, ``index_add_`` (repeated positions),
  ``index_fill_`` (positions counted from either end),
  ``index_put_(..., accumulate=True)`` (repeated positions, from either
  end), ``x[:, [-1, 0]] += c``, updates whose operand has another dtype
  (float ``add_`` of int32 data, ``mul_`` by a boolean mask, int32
  ``add_`` of an int64 product), a write through a boolean mask (``x[x > 0] = c``, a
  row over the rows a mask selects), ``lerp_`` from another value (an EMA update), ``copy_``
  of a row broadcast over every row,
  ``masked_fill_``, ``index_put_``, ``index_copy_`` and slice assignment
  (``x[1:] = c``, ``x[:, ::2] = y``), except through ``unfold`` windows that
  do not tile their dimension (hloalias refuses those: torch's
  functionalization would zero what no window covers);

and it returns a tuple mixing views of inputs, of the buffer and of
computed values, inputs unchanged and the same tensor more than once.
Explicit donation (``donate=`` by input position) is part of the program.

The strategy runs every op eagerly on stand-in tensors laid out like the
call-time inputs (some inputs are non-contiguous), so it only emits valid
programs and knows, for every value, which eager storage it lives in and its
*view root*: the input, buffer or intermediate it derives from through view
ops alone (``reshape``/``contiguous`` count as views here even where eager
copies, since the functional program cannot tell).

Arithmetic is exact on purpose, so that eager and XLA must agree bit for bit
even where XLA reassociates (``(x + 3) + 3`` becomes ``x + 6``): data are
odd multiples of 1/4, constants are small dyadic numbers, integers are only
ever incremented by multiples of 2**20 or filled with float bit patterns,
and i32 data are bit patterns of such floats, so every float has a few
significant bits and float views of integer data never hold NaN, infinities or
denormals.

A storage a converting ``copy_`` wrote is only returned afterwards (its
values are exact as stored, but arithmetic on them would round, and float
views of truncated integers are denormals).

Known hloalias bugs (the strict xfail ``KNOWN_BUGS`` of
``test_differential.py``) make some programs fail whatever else they do:

- a returned view through ``unfold`` windows that overlap (``x.unfold(0,
  3, 1)``) or whose whole steps do not fit the dimension comes back as a
  copy: values right, sharing lost (the lowering gathers; no slice,
  reshape or transpose of ``x`` holds those windows), and so does a
  ``diagonal`` of dimensions that are not adjacent and in order;

- a view of a tensor whose value depends on no input (``fill_``, and
  arithmetic on that) is folded into a constant of its own and comes back
  as a copy: values right, sharing with its base lost;
- views of an intermediate that is not itself returned come back as
  independent results: two overlapping views no longer share;
- when a ``copy_`` overwrites the whole buffer, ``torch.export`` makes the
  copied tensor itself the buffer's new value, the importer files its
  storage under the buffer's, and results in that storage (the input or
  intermediate copied from, views of it) come back as the module's state.

With ``avoid_known_bugs=True`` the generator tracks, per eager storage,
whether it is constant and which storage a whole-buffer ``copy_`` last
copied from, and leaves such results out of the return tuple (the
statements stay), so that the examples keep finding other bugs.  Nothing
else is avoided: results that the functional program cannot tell apart
from another result or an input (an unmutated ``clone``, the same
computation twice, ``y = x + 1`` next to ``x.add_(1)``) and updates whose
new value equals an input or another update (``x.copy_(y)``, two equal
``fill_``) are generated freely; hloalias handles them since the importer
records each result's eager storage (``hloalias.storage``) and mutation
results are never removed."""

from __future__ import annotations

import dataclasses
import itertools
import linecache
import math
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import reject
from hypothesis import strategies as st

SHAPES: tuple[tuple[int, ...], ...] = ((6,), (2, 3), (3, 4), (4, 1, 3), (2, 3, 2), (1, 4))
BUFFER_NAME = "buf"
BUFFER_LOCAL = "b"
F32_ADD_CONSTANTS = (1.0, -0.5, 3.0)
F32_MUL_CONSTANTS = (2.0, 0.5, -1.0)
F32_FILL_CONSTANTS = (1.5, -2.0, 0.25)
# Multiples of 2**20: added to the bits of a float with few significant
# bits, they give another such float (the value moves by 1/8 to 3/8 of its
# binade), so float arithmetic on int-updated data stays exact.
I32_ADD_CONSTANTS = (1 << 20, 1 << 21, 3 << 20)
# Bit patterns of 1.0f, -2.0f and 0.5f: int fills keep float views normal.
I32_FILL_CONSTANTS = (1065353216, -1073741824, 1056964608)

_DTYPES = {"float32": torch.float32, "int32": torch.int32}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input (or the buffer): shape, dtype and call-time layout."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32" or "int32"
    contiguous: bool = True

    def creation_source(self) -> str:
        """Python lines that create this tensor from generator ``g``."""
        shape = repr(self.shape)
        # Odd multiples of 1/4 in [-7.75, 7.75]: never zero, and every sum
        # and product the program forms is exact whatever order XLA uses.
        value = f"((torch.randint(-16, 16, {shape}, generator=g) * 2 + 1) * 0.25)"
        if self.dtype == "int32":
            value += ".view(torch.int32)"  # bit patterns of normal floats
        if self.contiguous:
            return f"{self.name} = {value}"
        holder = (*self.shape[:-1], 2 * self.shape[-1])
        return (
            f"{self.name} = torch.zeros({holder!r}, dtype=torch.{self.dtype})[..., ::2]"
            f"  # non-contiguous\n{self.name}.copy_({value})"
        )


@dataclasses.dataclass(frozen=True)
class GeneratedProgram:
    """A generated program with everything needed to run and reproduce it."""

    inputs: tuple[TensorSpec, ...]
    buffer: TensorSpec | None
    body: tuple[str, ...]
    returns: tuple[str, ...]
    donate: tuple[int, ...]
    data_seed: int
    # Per returned value: the name it derives from through view ops only.
    view_roots: tuple[str, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        """The program's parameter names, in order."""
        return tuple(spec.name for spec in self.inputs)

    def source(self) -> str:
        """The program as Python source (a function, or a module with a buffer)."""
        params = ", ".join(self.input_names)
        result = f"return ({', '.join(self.returns)},)"
        if self.buffer is None:
            lines = [f"def program({params}):", *(f"    {s}" for s in self.body), f"    {result}"]
        else:
            lines = [
                "class Program(torch.nn.Module):",
                f"    def __init__(self, {BUFFER_NAME}):",
                "        super().__init__()",
                f"        self.register_buffer({BUFFER_NAME!r}, {BUFFER_NAME})",
                "",
                f"    def forward(self, {params}):",
                f"        {BUFFER_LOCAL} = self.{BUFFER_NAME}",
                *(f"        {s}" for s in self.body),
                f"        {result}",
            ]
        return "\n".join(lines) + "\n"

    def inputs_source(self) -> str:
        """``make_inputs()``: fresh inputs (and buffer) with their layouts."""
        lines = ["def make_inputs():", f"    g = torch.Generator().manual_seed({self.data_seed})"]
        specs = list(self.inputs) + ([self.buffer] if self.buffer is not None else [])
        for spec in specs:
            lines.extend(f"    {line}" for line in spec.creation_source().splitlines())
        names = ", ".join(spec.name for spec in specs)
        lines.append(f"    return [{names}]")
        return "\n".join(lines) + "\n"

    def reproducer(self) -> str:
        """A runnable script that replays this program eagerly and through hloalias."""
        build = "program" if self.buffer is None else "Program(make_inputs()[-1])"
        user = f"make_inputs()[:{len(self.inputs)}]"
        return (
            "import torch, hloalias\n\n"
            + self.source()
            + "\n"
            + self.inputs_source()
            + "\n"
            + f"exe = hloalias.compile({build}, {user}, donate={list(self.donate)!r})\n"
            + f"eager_inputs, hloalias_inputs = {user}, {user}\n"
            + f"expected = ({build})(*eager_inputs)\n"
            + "got = exe(*hloalias_inputs)\n"
            + "print(expected, got, eager_inputs, hloalias_inputs, exe.state_dict(), sep='\\n')\n"
            + "print(exe.explain())\n"
        )

    def describe(self) -> str:
        """Source, inputs (shape, dtype, layout) and donation, for failure messages."""
        layouts = ", ".join(
            f"{s.name}: {s.dtype}{list(s.shape)}{'' if s.contiguous else ' non-contiguous'}"
            for s in self.inputs
        )
        buffer = f"; buffer {self.buffer.dtype}{list(self.buffer.shape)}" if self.buffer else ""
        return (
            f"inputs {layouts}{buffer}; donate={list(self.donate)}\n"
            f"--- reproducer ---\n{self.reproducer()}------------------"
        )

    def _namespace(self) -> dict[str, Any]:
        # Registered in linecache so tracebacks through the program show its lines.
        text = self.source() + "\n" + self.inputs_source()
        filename = f"<hloalias-differential-{abs(hash(text)):x}>"
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(text, filename, "exec"), namespace)  # noqa: S102 - our own generated source
        return namespace

    def build(self) -> tuple[Callable[..., Any], Callable[[], list[torch.Tensor]]]:
        """``(make_program, make_inputs)``: ``make_program()`` returns a fresh
        function or module (its buffer from ``make_inputs()``);
        ``make_inputs()`` returns fresh user inputs, the buffer's initial
        value last when there is a buffer."""
        namespace = self._namespace()
        make_inputs = namespace["make_inputs"]
        if self.buffer is None:
            program = namespace["program"]
            return (lambda: program), make_inputs
        module_type = namespace["Program"]
        return (lambda: module_type(make_inputs()[-1])), make_inputs


# -- generation ------------------------------------------------------------


@dataclasses.dataclass
class _Storage:
    """One eager storage as the generator sees it."""

    base: torch.Tensor  # the tensor that owns it, in its natural layout
    argument: str | None  # input or buffer name when it is an argument's storage
    # Its value depends on no input (fill_, and arithmetic on that): lowering
    # folds it into a StableHLO constant (see _without_known_bugs).
    constant: bool = False
    # For the buffer: the storage that its last update, a ``copy_`` over all
    # of it, copied from, while neither has been updated since (see
    # _without_known_bugs).
    copied_from: int | None = None
    # Its values came from a copy_ across dtypes (int32 bit patterns as
    # float values near 1e9, or floats truncated to small integers): exact
    # as stored, but further arithmetic on them would round (and XLA
    # reassociates) or make float views of denormals, so the generator
    # leaves it alone afterwards: it is only returned.
    frozen: bool = False


@dataclasses.dataclass
class _Value:
    """A Python name in the program body."""

    name: str
    sim: torch.Tensor  # eager stand-in with the call-time layout
    storage: int  # key into _Builder.storages
    view_root: str
    #: A view of ``unfold`` windows that do not tile their dimension:
    #: hloalias refuses writes through it (importer._refuse_lossy_unfold_writes).
    lossy_windows: bool = False
    #: A view of ``unfold`` windows that overlap (``size > step``) or whose
    #: whole steps do not fit the dimension (the lowering gathers them), or
    #: of a ``diagonal`` of dimensions that are not adjacent and in order
    #: in a row-major operand: a copy.
    copied_windows: bool = False


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    """Which elements of its storage ``t`` is, and as what dtype."""
    return (tuple(t.shape), tuple(t.stride()), t.storage_offset(), str(t.dtype))


class _Builder:
    """Simulates the program while it is drawn."""

    def __init__(self, specs: list[TensorSpec], buffer: TensorSpec | None) -> None:
        self.values: dict[str, _Value] = {}
        self.storages: dict[int, _Storage] = {}
        self.body: list[str] = []
        self.counter = itertools.count()
        for spec in specs:
            self._add_argument(spec, spec.name)
        if buffer is not None:
            self._add_argument(buffer, BUFFER_LOCAL)

    def _add_argument(self, spec: TensorSpec, local: str) -> None:
        dtype = _DTYPES[spec.dtype]
        if spec.contiguous:
            sim = torch.zeros(spec.shape, dtype=dtype)
        else:
            sim = torch.zeros((*spec.shape[:-1], 2 * spec.shape[-1]), dtype=dtype)[..., ::2]
        sid = self._new_storage(_Storage(sim, spec.name))
        self.values[local] = _Value(local, sim, sid, local)

    def _new_storage(self, storage: _Storage) -> int:
        sid = storage.base.untyped_storage().data_ptr()
        self.storages[sid] = storage
        return sid

    def fresh_name(self) -> str:
        return f"v{next(self.counter)}"

    def is_view(self, value: _Value) -> bool:
        """Whether ``value`` is not its storage's whole base, as laid out."""
        return _layout(value.sim) != _layout(self.storages[value.storage].base)

    def is_whole(self, value: _Value) -> bool:
        """Whether an in-place update through ``value`` rewrites its whole storage."""
        base = self.storages[value.storage].base
        return (
            value.sim.numel() == base.numel()
            and value.sim.element_size() == base.element_size()
            and not any(stride == 0 and size > 1 for size, stride in zip(value.sim.shape, value.sim.stride()))
        )

    # -- emitting -------------------------------------------------------------
    def emit_view(
        self, operand: _Value, expression: str, sim: torch.Tensor, lossy: bool = False, copied: bool = False
    ) -> None:
        """``name = expression``, a view op (eager may copy: reshape, contiguous)."""
        name = self.fresh_name()
        self.body.append(f"{name} = {expression}")
        if sim.untyped_storage().data_ptr() == operand.sim.untyped_storage().data_ptr():
            self.values[name] = _Value(
                name, sim, operand.storage, operand.view_root, operand.lossy_windows or lossy,
                operand.copied_windows or copied,
            )
            return
        # Eager copied (a storage of its own); the view root stays, since
        # the functional program cannot tell this copy from a view.
        storage = _Storage(sim, None, constant=self.storages[operand.storage].constant)
        self.values[name] = _Value(name, sim, self._new_storage(storage), operand.view_root)

    def emit_compute(self, expression: str, sim: torch.Tensor, operands: list[_Value]) -> None:
        """``name = expression``, a fresh tensor computed from ``operands``."""
        name = self.fresh_name()
        self.body.append(f"{name} = {expression}")
        constant = all(self.storages[operand.storage].constant for operand in operands)
        self.values[name] = _Value(name, sim, self._new_storage(_Storage(sim, None, constant)), name)

    def emit_inplace(self, target: _Value, statement: str, op: str, source: _Value | None = None) -> None:
        """An in-place update of ``target``'s storage, already applied to the
        stand-ins (``source`` is ``copy_``'s)."""
        storage = self.storages[target.storage]
        whole = self.is_whole(target)
        update_constant = source is None or self.storages[source.storage].constant
        # Constant afterwards: it was, or the update overwrote all of it,
        # and the update itself depends on no input.
        storage.constant = update_constant and (storage.constant or (whole and op in ("fill", "copy")))
        for other in self.storages.values():
            if other.copied_from == target.storage:
                other.copied_from = None  # the source has a value of its own now
        storage.copied_from = None
        if source is not None and op == "copy" and whole and storage.argument == BUFFER_NAME:
            storage.copied_from = source.storage
        if source is not None and op == "copy" and source.sim.dtype != target.sim.dtype:
            storage.frozen = True  # a converting copy_ (mixed-dtype arithmetic stays exact)
        self.body.append(statement)

    def usable(self, value: _Value) -> bool:
        """Whether ``value`` may be an operand or a source (not frozen, and
        not empty: an empty view is only returned)."""
        return not self.storages[value.storage].frozen and value.sim.numel() > 0


# -- op choices -------------------------------------------------------------


def _reshape_targets(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    numel = math.prod(shape)
    targets: set[tuple[int, ...]] = {(numel,)}
    for position in range(len(shape) + 1):
        targets.add((*shape[:position], 1, *shape[position:]))
    for dim in range(len(shape) - 1):
        targets.add((*shape[:dim], shape[dim] * shape[dim + 1], *shape[dim + 2 :]))
    for dim, size in enumerate(shape):
        for factor in range(2, size):
            if size % factor == 0:
                targets.add((*shape[:dim], factor, size // factor, *shape[dim + 1 :]))
    if len(shape) >= 1 and numel % 2 == 0 and numel > 2:
        targets.add((2, numel // 2))
    targets.discard(shape)
    return sorted(targets)


def _index_text(dim: int, item: str) -> str:
    return "[" + ", ".join([":"] * dim + [item]) + "]"


@st.composite
def _view_expression(draw: st.DrawFn, operand: _Value) -> tuple[str, torch.Tensor, str]:
    """A view op on ``operand``: ``(source expression, eager result, kind)``."""
    sim = operand.sim
    shape = tuple(sim.shape)
    ndim = len(shape)
    name = operand.name
    kinds = ["reshape", "unsqueeze", "dtype", "contiguous", "expand"]
    if 1 in shape:
        kinds.insert(0, "squeeze")
    if ndim >= 2:
        kinds[1:1] = ["transpose", "permute"]
    if ndim >= 1:
        kinds.insert(0, "select")
    if any(size >= 2 for size in shape):
        kinds[:0] = ["slice", "slice", "open_slice", "open_slice", "narrow"]
    if ndim >= 1:
        kinds.insert(0, "select_method")
        kinds += ["ellipsis", "none_index", "empty_slice"]
    if any(size >= 2 for size in shape):
        kinds += ["split", "unfold"]
    if ndim >= 2:
        kinds += ["diagonal", "movedim", "mT", "flatten", "swapaxes"]
    if any(size >= 4 and size % 2 == 0 for size in shape):
        kinds += ["unflatten"]
    kind = draw(st.sampled_from(kinds))
    if kind == "empty_slice":  # x[:, k:k]: no elements (returned only: see _Builder.usable)
        dim = draw(st.integers(0, ndim - 1))
        start = draw(st.integers(-shape[dim], shape[dim]))
        key = (slice(None),) * dim + (slice(start, start),)
        return f"{name}{_index_text(dim, f'{start}:{start}')}", sim[key], kind
    if kind == "flatten":  # dims counted from either end
        start = draw(st.integers(0, ndim - 2))
        end = draw(st.integers(start + 1, ndim - 1))
        start_text = start - ndim if draw(st.booleans()) else start
        end_text = end - ndim if draw(st.booleans()) else end
        return f"{name}.flatten({start_text}, {end_text})", sim.flatten(start_text, end_text), kind
    if kind == "unflatten":  # -1 in the sizes is inferred
        dim = draw(st.sampled_from([d for d, size in enumerate(shape) if size >= 4 and size % 2 == 0]))
        sizes = draw(st.sampled_from(((2, -1), (-1, 2), (2, shape[dim] // 2))))
        return f"{name}.unflatten({dim - ndim}, {sizes!r})", sim.unflatten(dim - ndim, sizes), kind
    if kind == "swapaxes":
        first, second = draw(st.lists(st.integers(-ndim, ndim - 1), min_size=2, max_size=2, unique_by=lambda d: d % ndim))
        return f"{name}.swapaxes({first}, {second})", sim.swapaxes(first, second), kind
    if kind == "split":  # one piece of split / chunk / unbind: views, the last one maybe shorter
        dim = draw(st.sampled_from([d for d, size in enumerate(shape) if size >= 2]))
        form = draw(st.sampled_from(("split", "chunk", "unbind")))
        if form == "unbind":
            pieces, call = sim.unbind(dim), f"unbind({dim})"
        else:
            count = draw(st.integers(1, shape[dim] - 1))
            pieces = sim.split(count, dim) if form == "split" else sim.chunk(count + 1, dim)
            call = f"split({count}, {dim})" if form == "split" else f"chunk({count + 1}, {dim})"
        item = draw(st.integers(-len(pieces), len(pieces) - 1))
        return f"{name}.{call}[{item}]", pieces[item], kind
    if kind == "unfold":  # sliding windows: overlapping views of one storage
        dim = draw(st.sampled_from([d for d, size in enumerate(shape) if size >= 2]))
        size = draw(st.integers(1, shape[dim]))
        step = draw(st.integers(1, 2))
        tiles = size == step and shape[dim] % size == 0
        windows = (shape[dim] - size) // step + 1
        # frontend/decompositions.unfold: slices and reshapes (a view) where
        # the windows do not overlap and whole steps fit; else a gather.
        sliced = size <= step and (windows * step <= shape[dim] or size == 1)
        kind = "unfold" if tiles else "lossy_unfold" if sliced else "copied_unfold"
        return f"{name}.unfold({dim}, {size}, {step})", sim.unfold(dim, size, step), kind
    if kind == "diagonal":
        first, second = draw(st.lists(st.integers(-ndim, ndim - 1), min_size=2, max_size=2, unique_by=lambda d: d % ndim))
        offset = draw(st.integers(-1, 1))
        adjacent = first % ndim + 1 == second % ndim
        kind = "diagonal_adjacent" if adjacent else "diagonal"
        return f"{name}.diagonal({offset}, {first}, {second})", sim.diagonal(offset, first, second), kind
    if kind == "movedim":
        source = draw(st.integers(-ndim, ndim - 1))
        destination = draw(st.integers(-ndim, ndim - 1))
        return f"{name}.movedim({source}, {destination})", sim.movedim(source, destination), kind
    if kind == "mT":
        return f"{name}.mT", sim.mT, kind
    if kind == "ellipsis":  # x[..., i] counts from the last dimension
        item = draw(st.integers(-shape[-1], shape[-1] - 1))
        return f"{name}[..., {item}]", sim[..., item], kind
    if kind == "none_index":
        return f"{name}[None]", sim[None], kind
    if kind == "open_slice":
        dim = draw(st.sampled_from([d for d, size in enumerate(shape) if size >= 2]))
        size = shape[dim]
        form = draw(st.sampled_from(("start", "negative_stop", "negative_start", "step", "start_step")))
        if form == "start":
            start = draw(st.integers(1, size - 1))
            text, chosen = f"{start}:", slice(start, None)
        elif form == "negative_stop":
            stop = -draw(st.integers(1, size - 1))
            text, chosen = f":{stop}", slice(None, stop)
        elif form == "negative_start":
            start = -draw(st.integers(1, size - 1))
            text, chosen = f"{start}:", slice(start, None)
        elif form == "step":
            text, chosen = "::2", slice(None, None, 2)
        else:
            text, chosen = "1::2", slice(1, None, 2)
        return f"{name}{_index_text(dim, text)}", sim[(slice(None),) * dim + (chosen,)], "slice"
    if kind == "narrow":
        dim = draw(st.sampled_from([d for d, size in enumerate(shape) if size >= 2]))
        start = draw(st.integers(0, shape[dim] - 1))
        length = draw(st.integers(1, shape[dim] - start))
        return f"{name}.narrow({dim}, {start}, {length})", sim.narrow(dim, start, length), kind
    if kind == "select_method":
        dim = draw(st.integers(0, ndim - 1))
        item = draw(st.integers(-shape[dim], shape[dim] - 1))
        return f"{name}.select({dim}, {item})", sim.select(dim, item), kind
    if kind == "slice":
        dim = draw(st.sampled_from([d for d, size in enumerate(shape) if size >= 2]))
        start = draw(st.integers(0, shape[dim] - 1))
        stop = draw(st.integers(start + 1, shape[dim]))
        step = draw(st.sampled_from((1, 2)))
        text = f"{start}:{stop}:{step}" if step != 1 else f"{start}:{stop}"
        slices = (slice(None),) * dim + (slice(start, stop, step),)
        return f"{name}{_index_text(dim, text)}", sim[slices], kind
    if kind == "select":
        dim = draw(st.integers(0, ndim - 1))
        item = draw(st.integers(0, shape[dim] - 1))
        selection: tuple[slice | int, ...] = (slice(None),) * dim + (item,)
        return f"{name}{_index_text(dim, str(item))}", sim[selection], kind
    if kind == "reshape":
        target = draw(st.sampled_from(_reshape_targets(shape)))
        method = draw(st.sampled_from(("view", "reshape")))
        args = ", ".join(str(size) for size in target)
        if method == "view":
            try:
                return f"{name}.view({args})", sim.view(target), "view"
            except RuntimeError:
                pass  # not viewable with this layout: reshape (which copies)
        return f"{name}.reshape({args})", sim.reshape(target), "reshape"
    if kind == "transpose":
        if ndim == 2 and draw(st.booleans()):
            return f"{name}.t()", sim.t(), kind
        first, second = draw(st.lists(st.integers(0, ndim - 1), min_size=2, max_size=2, unique=True))
        return f"{name}.transpose({first}, {second})", sim.transpose(first, second), kind
    if kind == "permute":
        order = tuple(draw(st.permutations(range(ndim))))
        return f"{name}.permute{order!r}", sim.permute(order), kind
    if kind == "expand":
        sizes = [draw(st.sampled_from((2, 3))) if size == 1 and draw(st.booleans()) else size for size in shape]
        if draw(st.booleans()) or sizes == list(shape):
            sizes = [2, *sizes]
        return f"{name}.expand({', '.join(str(size) for size in sizes)})", sim.expand(sizes), kind
    if kind == "unsqueeze":
        dim = draw(st.integers(0, ndim))
        return f"{name}.unsqueeze({dim})", sim.unsqueeze(dim), kind
    if kind == "squeeze":
        dim = draw(st.sampled_from([d for d, size in enumerate(shape) if size == 1]))
        return f"{name}.squeeze({dim})", sim.squeeze(dim), kind
    if kind == "dtype":
        dtype_name = "int32" if sim.dtype == torch.float32 else "float32"
        return f"{name}.view(torch.{dtype_name})", sim.view(_DTYPES[dtype_name]), kind
    return f"{name}.contiguous()", sim.contiguous(), kind


@st.composite
def _draw_view(draw: st.DrawFn, builder: _Builder, operand: _Value) -> bool:
    expression, sim, kind = draw(_view_expression(operand))
    if sim.numel() == 0 and kind != "empty_slice":
        return False  # (a diagonal with an offset past its end): nothing to index later
    copied = kind == "copied_unfold"
    if kind.startswith("diagonal"):
        # frontend/decompositions.diagonal moves the two dimensions last and
        # merges them: a view of a row-major operand when they are adjacent
        # and in order, else a copy (known bug, see _without_known_bugs).
        copied = kind != "diagonal_adjacent" or operand.name != operand.view_root or not operand.sim.is_contiguous()
    builder.emit_view(operand, expression, sim, lossy=kind in ("lossy_unfold", "copied_unfold"), copied=copied)
    return True


# Constants for the constant-folded arithmetic (issue 25): negative ones,
# so that floor division, remainder and comparisons meet their sign rules.
_INT_CONSTANTS = (-7, -3, -1, 2, 3, 5)
_INT_OPS = ("//", "%", "+", "-", "*", "&", "|", "^", "<", ">", "==", "max", "min")
_BOOL_OPS = ("+", "*", "<", ">", "<=", ">=", "==", "!=", "&", "|", "^")
_INT_DTYPES = ("int64", "int32", "int8")


@st.composite
def _constant_expression(draw: st.DrawFn, name: str) -> str:
    """Arithmetic on ``full_like`` constants of ``name``'s shape: known at
    import, folded before lowering (bool add is a logical or, ``-7 // 3``
    is -3); its value is a small integer or bool."""
    if draw(st.booleans()):
        a, b = draw(st.booleans()), draw(st.booleans())
        op = draw(st.sampled_from(_BOOL_OPS))
        left = f"torch.full_like({name}, {a}, dtype=torch.bool)"
        right = f"torch.full_like({name}, {b}, dtype=torch.bool)"
        return f"({left} {op} {right})"
    dtype = draw(st.sampled_from(_INT_DTYPES))
    a, b = draw(st.sampled_from(_INT_CONSTANTS)), draw(st.sampled_from(_INT_CONSTANTS))
    op = draw(st.sampled_from(_INT_OPS))
    left = f"torch.full_like({name}, {a}, dtype=torch.{dtype})"
    right = f"torch.full_like({name}, {b}, dtype=torch.{dtype})"
    if op in ("max", "min"):
        return f"torch.{op}imum({left}, {right})"
    return f"({left} {op} {right})"


@st.composite
def _index_positions(draw: st.DrawFn, size: int) -> list[int]:
    """1 to 3 positions into a dimension of ``size``, some counted from the end."""
    positions = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=min(3, size)))
    return [p - size if draw(st.booleans()) else p for p in positions]


@st.composite
def _draw_compute(draw: st.DrawFn, builder: _Builder, operand: _Value) -> bool:
    sim = operand.sim
    name = operand.name
    is_float = sim.dtype == torch.float32
    kinds = ["add", "clone", "as_strided"] + (["mul", "neg", "add_tensor", "bf16_chain"] if is_float else [])
    kinds += ["constant_arithmetic", "promote", "mask_multiply"]
    if sim.dim() >= 1:
        kinds += ["negative_index_list", "negative_index_tensor", "flip", "roll", "cat", "stack", "repeat", "gather"]
        kinds += ["cat_empty", "take"]
        if is_float:
            kinds += ["sum_dim", "cumsum", "amax", "where", "where_one_value", "clamp", "abs", "maximum"]
    kind = draw(st.sampled_from(kinds))
    if kind == "as_strided":
        return draw(_draw_as_strided(builder, operand))
    if kind in ("promote", "mask_multiply", "cat_empty", "take"):
        return draw(_draw_mixed_or_empty(builder, operand, kind))
    if kind == "clone":
        builder.emit_compute(f"{name}.clone()", sim.clone(), [operand])
    elif kind == "add":
        constant = draw(st.sampled_from(F32_ADD_CONSTANTS if is_float else I32_ADD_CONSTANTS))
        builder.emit_compute(f"{name} + {constant!r}", sim + constant, [operand])
    elif kind == "mul":
        constant = draw(st.sampled_from(F32_MUL_CONSTANTS))
        builder.emit_compute(f"{name} * {constant!r}", sim * constant, [operand])
    elif kind == "neg":
        builder.emit_compute(f"{name}.neg()", -sim, [operand])
    elif kind in ("negative_index_list", "negative_index_tensor"):
        # Advanced indexing (a copy) with indices counted from the end: a
        # list (a lifted constant) or a tensor whose value XLA only sees at
        # run time (it depends on the data, though it is always ``positions``).
        dim = draw(st.integers(0, sim.dim() - 1))
        positions = draw(_index_positions(sim.shape[dim]))
        if kind == "negative_index_list":
            index = repr(positions)
        else:
            index = f"(torch.tensor({positions!r}) + {name}.reshape(-1)[:1].float().mul(0).long())"
        result = sim[(slice(None),) * dim + (torch.tensor(positions),)]
        builder.emit_compute(f"{name}{_index_text(dim, index)}", result, [operand])
    elif kind in ("flip", "roll", "cat", "sum_dim", "cumsum", "amax"):
        # What models write around their views: new tensors from a
        # dimension counted from either end (exact: the data are small
        # odd quarters, so sums and prefix sums round nowhere).
        dim = draw(st.integers(-sim.dim(), sim.dim() - 1))
        if kind == "flip":
            builder.emit_compute(f"{name}.flip({dim})", sim.flip(dim), [operand])
        elif kind == "roll":
            shift = draw(st.integers(-3, 3))
            builder.emit_compute(f"{name}.roll({shift}, {dim})", sim.roll(shift, dim), [operand])
        elif kind == "cat":
            step = 1.0 if is_float else 1048576  # int data stay the bits of normal floats
            builder.emit_compute(f"torch.cat([{name}, {name} + {step!r}], {dim})",
                                 torch.cat([sim, sim + step], dim), [operand])
        elif kind == "sum_dim":
            keep = draw(st.booleans())
            builder.emit_compute(f"{name}.sum({dim}, keepdim={keep})", sim.sum(dim, keepdim=keep), [operand])
        elif kind == "cumsum":
            builder.emit_compute(f"{name}.cumsum({dim})", sim.cumsum(dim), [operand])
        else:
            keep = draw(st.booleans())
            builder.emit_compute(f"{name}.amax({dim}, keepdim={keep})", sim.amax(dim, keepdim=keep), [operand])
    elif kind == "stack":
        dim = draw(st.integers(-sim.dim() - 1, sim.dim()))
        step = 1.0 if is_float else 1048576
        builder.emit_compute(f"torch.stack([{name}, {name} + {step!r}], {dim})",
                             torch.stack([sim, sim + step], dim), [operand])
    elif kind == "repeat":
        counts = [draw(st.integers(1, 2)) for _ in range(sim.dim() + draw(st.integers(0, 1)))]
        builder.emit_compute(f"{name}.repeat({', '.join(map(str, counts))})", sim.repeat(*counts), [operand])
    elif kind == "gather":
        # torch.gather with an index that picks positions along ``dim`` (some
        # repeated) in every slice: the same positions, broadcast.
        dim = draw(st.integers(-sim.dim(), sim.dim() - 1))
        size = sim.shape[dim]
        positions = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=size + 1))
        column = [1] * sim.dim()
        column[dim] = len(positions)
        full = list(sim.shape)
        full[dim] = len(positions)
        index = torch.tensor(positions).reshape(column).expand(full)
        expression = (
            f"torch.gather({name}, {dim}, "
            f"torch.tensor({positions!r}).reshape({tuple(column)!r}).expand({tuple(full)!r}))"
        )
        builder.emit_compute(expression, torch.gather(sim, dim, index), [operand])
    elif kind == "clamp":
        builder.emit_compute(f"{name}.clamp(-1.0, 2.0)", sim.clamp(-1.0, 2.0), [operand])
    elif kind == "abs":
        builder.emit_compute(f"{name}.abs()", sim.abs(), [operand])
    elif kind == "maximum":
        partners = [
            v for v in builder.values.values()
            if v.sim.shape == sim.shape and v.sim.dtype == sim.dtype and builder.usable(v)
        ]
        other = draw(st.sampled_from(partners))
        builder.emit_compute(f"torch.maximum({name}, {other.name})", torch.maximum(sim, other.sim), [operand, other])
    elif kind == "where":
        partners = [
            v for v in builder.values.values()
            if v.sim.shape == sim.shape and v.sim.dtype == sim.dtype and builder.usable(v)
        ]
        other = draw(st.sampled_from(partners))
        threshold = draw(st.sampled_from(F32_ADD_CONSTANTS))
        builder.emit_compute(f"torch.where({name} > {threshold!r}, {name}, {other.name})",
                             torch.where(sim > threshold, sim, other.sim), [operand, other])
    elif kind == "where_one_value":
        # A select between two equal constants that broadcast (what
        # scatter_reduce(include_self=False) of a constant source becomes),
        # then reduced: torch-mlir folded the select to the unbroadcast
        # constant, and the sum came out of one element.
        threshold = draw(st.sampled_from(F32_ADD_CONSTANTS))
        constant = draw(st.sampled_from(F32_ADD_CONSTANTS))
        ones = tuple([1] * draw(st.integers(1, sim.dim())))
        dim = draw(st.integers(-sim.dim(), sim.dim() - 1))
        builder.emit_compute(
            f"torch.where({name} > {threshold!r}, torch.full({ones!r}, {constant!r}), "
            f"torch.full({ones!r}, {constant!r})).sum({dim}, keepdim=True) + {name}",
            torch.where(sim > threshold, torch.full(ones, constant), torch.full(ones, constant)).sum(dim, keepdim=True)
            + sim,
            [operand],
        )
    elif kind == "constant_arithmetic":
        constant = draw(_constant_expression(name))
        value = eval(constant, {"torch": torch, name: sim})  # noqa: S307 - our own generated text
        if is_float:
            expression, result = f"{name} + {constant}.to(torch.float32)", sim + value.to(torch.float32)
        else:  # multiples of 2**20 keep int data the bits of normal floats
            scaled = (value.to(torch.int32) % 4) * 1048576
            expression, result = f"{name} + ({constant}.to(torch.int32) % 4) * 1048576", sim + scaled
        builder.emit_compute(expression, result, [operand])
    elif kind == "bf16_chain":
        # Each op's result rounded to bf16 as eager rounds it (products of
        # odd quarters up to 7.75 need more than bf16's 8 bits).
        partners = [v for v in builder.values.values() if v.sim.shape == sim.shape and v.sim.dtype == sim.dtype]
        other = draw(st.sampled_from(partners))
        factor = draw(st.sampled_from(F32_MUL_CONSTANTS))
        low, other_low = sim.bfloat16(), other.sim.bfloat16()
        chain = ((low * other_low + low) * factor).float()
        expression = (
            f"{name} + (({name}.bfloat16() * {other.name}.bfloat16() + {name}.bfloat16()) * {factor!r}).float()"
        )
        builder.emit_compute(expression, sim + chain, [operand, other])
    else:
        partners = [
            v for v in builder.values.values()
            if v.sim.shape == sim.shape and v.sim.dtype == sim.dtype and builder.usable(v)
        ]
        other = draw(st.sampled_from(partners))
        builder.emit_compute(f"{name} + {other.name}", sim + other.sim, [operand, other])
    return True


def _small_int(value: _Value) -> tuple[str, torch.Tensor]:
    """``value``'s data as small integers (``int32``): the top 12 bits of the
    float bit patterns the generator's int32 data are (sign, exponent and
    two mantissa bits; ``view(torch.int32)`` of a float value), so that
    float arithmetic with them stays exact."""
    if value.sim.dtype == torch.float32:
        return f"({value.name}.view(torch.int32) >> 20)", value.sim.view(torch.int32) >> 20
    return f"({value.name} >> 20)", value.sim >> 20


@st.composite
def _draw_mixed_or_empty(draw: st.DrawFn, builder: _Builder, operand: _Value, kind: str) -> bool:
    """What users write around dtypes and sizes: arithmetic that promotes
    (a float tensor with an int32 one, an int32 tensor with a Python float,
    true division of ints, a float times a boolean mask), ``torch.cat``
    with an empty piece (the first step of a growing cache), ``torch.take``
    with positions counted from the end.  Results are float32 or int32 and
    exact (small integers plus odd quarters)."""
    sim = operand.sim
    name = operand.name
    if sim.numel() == 0:
        return False
    partners = [
        v for v in builder.values.values()
        if v.sim.shape == sim.shape and builder.usable(v) and v.name != name
    ]
    if kind == "promote":
        small, small_sim = _small_int(operand)
        floats = [v for v in partners if v.sim.dtype == torch.float32]
        ints = [v for v in partners if v.sim.dtype == torch.int32]
        if sim.dtype == torch.float32:
            # float32 + int32 -> float32: an int32 partner, or this value's own bits
            other = draw(st.sampled_from(ints)) if ints and draw(st.booleans()) else operand
            other_text, other_sim = _small_int(other)
            builder.emit_compute(f"{name} + {other_text}", sim + other_sim, [operand, other])
            return True
        form = draw(st.sampled_from(("scalar", "true_divide", "tensor") if floats else ("scalar", "true_divide")))
        if form == "scalar":  # int32 tensor * Python float -> the default float dtype
            factor = draw(st.sampled_from(F32_MUL_CONSTANTS))
            builder.emit_compute(f"{small} * {factor!r}", small_sim * factor, [operand])
        elif form == "true_divide":  # int / int -> float
            divisor = draw(st.sampled_from((2, 4, -8)))
            builder.emit_compute(f"{small} / {divisor!r}", small_sim / divisor, [operand])
        else:
            other = draw(st.sampled_from(floats))
            builder.emit_compute(f"{small} + {other.name}", small_sim + other.sim, [operand, other])
        return True
    if kind == "mask_multiply":  # x * (y > c): a float (or int) times a bool tensor
        other = draw(st.sampled_from([operand, *partners]))
        threshold = 0 if other.sim.dtype == torch.int32 else draw(st.sampled_from(F32_ADD_CONSTANTS))
        builder.emit_compute(f"{name} * ({other.name} > {threshold!r})", sim * (other.sim > threshold),
                             [operand, other])
        return True
    dim = draw(st.integers(-sim.dim(), sim.dim() - 1))
    if kind == "cat_empty":  # torch.cat([past, new]) where past is empty
        empty = f"{name}{_index_text(dim % sim.dim(), ':0')}"
        first = draw(st.booleans())
        pieces = f"[{empty}, {name}]" if first else f"[{name}, {empty}]"
        builder.emit_compute(f"torch.cat({pieces}, {dim})", sim.clone(), [operand])
        return True
    # take: flat positions, some counted from the end
    numel = sim.numel()
    positions = draw(st.lists(st.integers(0, numel - 1), min_size=1, max_size=min(4, numel)))
    positions = [p - numel if draw(st.booleans()) else p for p in positions]
    builder.emit_compute(f"torch.take({name}, torch.tensor({positions!r}))",
                         torch.take(sim, torch.tensor(positions)), [operand])
    return True


@st.composite
def _draw_as_strided(draw: st.DrawFn, builder: _Builder, operand: _Value) -> bool:
    """A read through ``operand.as_strided(size, stride[, storage_offset])``,
    copied out (``.clone()``, or ``+ c``): hloalias refuses a returned
    as_strided view and a write through one (test_as_strided.py), and
    computes the read at the example layout's positions, which the
    generator's call-time inputs share.  Sizes, strides and the offset stay
    within the operand's storage (an explicit offset counts from the
    storage's start, as eager's)."""
    sim = operand.sim
    base = builder.storages[operand.storage].base
    if sim.dtype != base.dtype:
        return False  # a dtype view: its storage counts elements of another size
    storage_numel = sim.untyped_storage().nbytes() // sim.element_size()
    if not base.is_contiguous() or base.storage_offset() != 0 or base.numel() != storage_numel:
        # Storage elements that are no element of the base (the gaps of a
        # non-contiguous input) are out of a compiled program's reach:
        # torch-mlir refuses such an as_strided at import.
        return False
    rank = draw(st.integers(1, 2))
    sizes = [draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [draw(st.integers(0, 3)) for _ in range(rank)]
    span = sum((size - 1) * stride for size, stride in zip(sizes, strides))
    if span >= storage_numel:
        return False
    explicit = draw(st.booleans())
    if explicit:
        offset = draw(st.integers(0, storage_numel - 1 - span))
        offset_text = f", {offset}"
        view = sim.as_strided(sizes, strides, offset)
    else:
        if sim.storage_offset() + span >= storage_numel:
            return False
        offset_text = ""
        view = sim.as_strided(sizes, strides)
    expression = f"{operand.name}.as_strided({tuple(sizes)!r}, {tuple(strides)!r}{offset_text})"
    if sim.dtype == torch.float32 and draw(st.booleans()):
        constant = draw(st.sampled_from(F32_ADD_CONSTANTS))
        builder.emit_compute(f"{expression} + {constant!r}", view + constant, [operand])
    else:
        builder.emit_compute(f"{expression}.clone()", view.clone(), [operand])
    return True


@st.composite
def _draw_inplace(draw: st.DrawFn, builder: _Builder, target: _Value) -> bool:
    subscript = False  # the target is written ``name[...]``: slice assignment applies
    if draw(st.sampled_from((False, False, True))):
        # Through a view written inline: x0[1:3].add_(1.0), x0.t().mul_(2.0)
        expression, sim, view_kind = draw(_view_expression(target))
        if sim.numel() == 0:
            return False  # nothing to update
        if sim.untyped_storage().data_ptr() != target.sim.untyped_storage().data_ptr():
            return False  # eager copied: the update would go nowhere
        lossy = target.lossy_windows or view_kind in ("lossy_unfold", "copied_unfold")
        target = _Value(expression, sim, target.storage, target.view_root, lossy)
        subscript = view_kind in ("slice", "select")
    if target.lossy_windows:
        return False  # hloalias refuses it: functionalization would zero what no window covers
    sim = target.sim
    name = target.name
    if any(stride == 0 and size > 1 for size, stride in zip(sim.shape, sim.stride())):
        return False  # eager refuses in-place writes to expanded tensors
    is_float = sim.dtype == torch.float32
    # (sub_ of int data could take a float bit pattern to a denormal)
    kinds = ["add", "fill", "copy", "masked_fill", "zero"] + (["mul", "sub", "clamp", "div"] if is_float else [])
    if sim.dim() >= 1:
        kinds += ["index_put", "index_copy", "scatter"] + (["index_add"] if is_float else [])
    if subscript:
        kinds += ["setitem"] * 4
    if is_float and any(
        v.sim.shape == sim.shape and v.sim.dtype == sim.dtype and v.storage != target.storage and builder.usable(v)
        for v in builder.values.values()
    ):
        kinds += ["lerp"]
    if sim.dim() >= 2 and any(
        tuple(v.sim.shape) == tuple(sim.shape[1:]) and v.sim.dtype == sim.dtype and v.storage != target.storage
        and builder.usable(v)
        for v in builder.values.values()
    ):
        kinds += ["broadcast_copy"]
    if sim.dim() >= 1:
        kinds += ["index_fill", "mask_setitem", "index_put_accumulate", "advanced_augmented"]
    kinds += ["promoted_update"]
    if any(
        v.sim.shape == sim.shape and v.storage != target.storage and builder.usable(v)
        for v in builder.values.values()
    ):
        kinds += ["convert"] * 2
    kind = draw(st.sampled_from(kinds))
    fills = F32_FILL_CONSTANTS if is_float else I32_FILL_CONSTANTS
    dtype_text = f"torch.{str(sim.dtype).removeprefix('torch.')}"
    if kind == "masked_fill":
        constant = draw(st.sampled_from(fills))
        sim.masked_fill_(sim > 0, constant)
        builder.emit_inplace(target, f"{name}.masked_fill_({name} > 0, {constant!r})", "masked_fill")
        return True
    if kind in ("index_put", "index_copy"):
        dim = 0 if kind == "index_put" else draw(st.integers(0, sim.dim() - 1))
        positions = draw(st.lists(st.integers(0, sim.shape[dim] - 1), min_size=1, max_size=sim.shape[dim], unique=True))
        if kind == "index_put":  # index_put_ counts negative indices from the end (index_copy_ refuses them)
            positions = [p - sim.shape[dim] if draw(st.booleans()) else p for p in positions]
        constant = draw(st.sampled_from(fills))
        index = torch.tensor(positions)
        if kind == "index_put":
            sim.index_put_((index,), torch.tensor(constant, dtype=sim.dtype))
            statement = (
                f"{name}.index_put_((torch.tensor({positions!r}),), torch.tensor({constant!r}, dtype={dtype_text}))"
            )
        else:
            source_shape = (*sim.shape[:dim], len(positions), *sim.shape[dim + 1 :])
            sim.index_copy_(dim, index, torch.full(source_shape, constant, dtype=sim.dtype))
            statement = (
                f"{name}.index_copy_({dim}, torch.tensor({positions!r}), "
                f"torch.full({source_shape!r}, {constant!r}, dtype={dtype_text}))"
            )
        builder.emit_inplace(target, statement, kind)
        return True
    if kind == "setitem":
        sources = [
            v for v in builder.values.values()
            if v.sim.shape == sim.shape and v.sim.dtype == sim.dtype and v.storage != target.storage
            and builder.usable(v)
        ]
        from_value: bool = draw(st.booleans())
        if sources and from_value:
            source = draw(st.sampled_from(sources))
            sim.copy_(source.sim)
            builder.emit_inplace(target, f"{name} = {source.name}", "copy", source)
            return True
        constant = draw(st.sampled_from(fills))
        sim.fill_(constant)
        builder.emit_inplace(target, f"{name} = {constant!r}", "fill")
        return True
    if kind == "add":
        constant = draw(st.sampled_from(F32_ADD_CONSTANTS if is_float else I32_ADD_CONSTANTS))
        sim.add_(constant)
        builder.emit_inplace(target, f"{name}.add_({constant!r})", "add")
        return True
    if kind == "mul":
        constant = draw(st.sampled_from(F32_MUL_CONSTANTS))
        sim.mul_(constant)
        builder.emit_inplace(target, f"{name}.mul_({constant!r})", "mul")
        return True
    if kind == "sub":
        constant = draw(st.sampled_from(F32_ADD_CONSTANTS))
        sim.sub_(constant)
        builder.emit_inplace(target, f"{name}.sub_({constant!r})", "add")
        return True
    if kind == "div":
        constant = draw(st.sampled_from((2.0, -4.0)))
        sim.div_(constant)
        builder.emit_inplace(target, f"{name}.div_({constant!r})", "mul")
        return True
    if kind == "clamp":
        sim.clamp_(-1.0, 2.0)
        builder.emit_inplace(target, f"{name}.clamp_(-1.0, 2.0)", "mul")
        return True
    if kind == "zero":
        sim.zero_()
        builder.emit_inplace(target, f"{name}.zero_()", "fill")
        return True
    if kind == "lerp":  # an EMA update: exact, as weights and data are dyadic with few bits
        sources = [
            v for v in builder.values.values()
            if v.sim.shape == sim.shape and v.sim.dtype == sim.dtype and v.storage != target.storage and builder.usable(v)
        ]
        source = draw(st.sampled_from(sources))
        weight = draw(st.sampled_from((0.25, 0.5, 0.75)))
        sim.lerp_(source.sim, weight)
        builder.emit_inplace(target, f"{name}.lerp_({source.name}, {weight!r})", "add", source)
        return True
    if kind == "broadcast_copy":  # every row gets the same source: x.copy_(row)
        sources = [
            v for v in builder.values.values()
            if tuple(v.sim.shape) == tuple(sim.shape[1:]) and v.sim.dtype == sim.dtype and v.storage != target.storage
            and builder.usable(v)
        ]
        source = draw(st.sampled_from(sources))
        sim.copy_(source.sim)
        builder.emit_inplace(target, f"{name}.copy_({source.name})", "copy", source)
        return True
    if kind == "index_fill":  # positions may count from the end (eager allows it here)
        dim = draw(st.integers(-sim.dim(), sim.dim() - 1))
        positions = draw(_index_positions(sim.shape[dim]))
        constant = draw(st.sampled_from(fills))
        sim.index_fill_(dim, torch.tensor(positions), constant)
        builder.emit_inplace(target, f"{name}.index_fill_({dim}, torch.tensor({positions!r}), {constant!r})", "index_put")
        return True
    if kind == "mask_setitem":  # x[x > 0] = c; x[x[..., 0] > 0] = row (a where: one value per element)
        constant = draw(st.sampled_from(fills))
        if sim.dim() >= 2 and draw(st.booleans()):
            row = sim.shape[-1]
            mask = sim[..., 0] > 0
            sim[mask] = torch.full((row,), constant, dtype=sim.dtype)
            statement = f"{name}[{name}[..., 0] > 0] = torch.full(({row},), {constant!r}, dtype={dtype_text})"
        else:
            sim[sim > 0] = constant
            statement = f"{name}[{name} > 0] = {constant!r}"
        builder.emit_inplace(target, statement, "masked_fill")
        return True
    if kind in ("index_put_accumulate", "advanced_augmented", "index_fill") and sim.numel() == 0:
        return False
    if kind == "index_put_accumulate":  # repeated positions, counted from either end, add up
        positions = draw(st.lists(st.integers(0, sim.shape[0] - 1), min_size=1, max_size=sim.shape[0] + 1))
        positions = [p - sim.shape[0] if draw(st.booleans()) else p for p in positions]
        constant = draw(st.sampled_from(F32_ADD_CONSTANTS if is_float else I32_ADD_CONSTANTS))
        sim.index_put_((torch.tensor(positions),), torch.tensor(constant, dtype=sim.dtype), accumulate=True)
        statement = (
            f"{name}.index_put_((torch.tensor({positions!r}),), torch.tensor({constant!r}, dtype={dtype_text}), "
            "accumulate=True)"
        )
        builder.emit_inplace(target, statement, "add")
        return True
    if kind == "advanced_augmented":  # x[:, [-1, 0]] += c: a gather, an add, an index_put_
        dim = draw(st.integers(0, sim.dim() - 1))
        positions = draw(_index_positions(sim.shape[dim]))
        constant = draw(st.sampled_from(F32_ADD_CONSTANTS if is_float else I32_ADD_CONSTANTS))
        key = (slice(None),) * dim + (positions,)
        sim[key] += constant
        builder.emit_inplace(target, f"{name}{_index_text(dim, repr(positions))} += {constant!r}", "add")
        return True
    if kind == "promoted_update":  # an in-place op whose operand has another dtype
        others = [
            v for v in builder.values.values()
            if v.sim.shape == sim.shape and v.storage != target.storage and builder.usable(v)
        ]
        if not others:
            return False
        source = draw(st.sampled_from(others))
        if is_float and draw(st.booleans()):  # float32 += int32
            text, value = _small_int(source)
            sim.add_(value)
            builder.emit_inplace(target, f"{name}.add_({text})", "add", source)
        elif is_float:  # float32 *= bool
            sim.mul_(source.sim > 0)
            builder.emit_inplace(target, f"{name}.mul_({source.name} > 0)", "mul", source)
        else:  # int32 += int64 (a bool times a Python int): multiples of 2**20
            sim.add_((source.sim > 0) * 1048576)
            builder.emit_inplace(target, f"{name}.add_(({source.name} > 0) * 1048576)", "add", source)
        return True
    if kind == "index_add":  # repeated positions add twice (exact: small dyadic sums)
        dim = draw(st.integers(-sim.dim(), sim.dim() - 1))
        positions = draw(st.lists(st.integers(0, sim.shape[dim] - 1), min_size=1, max_size=sim.shape[dim] + 1))
        constant = draw(st.sampled_from(F32_ADD_CONSTANTS))
        source_shape = list(sim.shape)
        source_shape[dim] = len(positions)
        sim.index_add_(dim, torch.tensor(positions), torch.full(source_shape, constant))
        statement = (
            f"{name}.index_add_({dim}, torch.tensor({positions!r}), torch.full({tuple(source_shape)!r}, {constant!r}))"
        )
        builder.emit_inplace(target, statement, "add")
        return True
    if kind == "scatter":  # one position along ``dim`` in every slice gets a constant
        dim = draw(st.integers(-sim.dim(), sim.dim() - 1))
        position = draw(st.integers(0, sim.shape[dim] - 1))
        constant = draw(st.sampled_from(fills))
        index_shape = list(sim.shape)
        index_shape[dim] = 1
        sim.scatter_(dim, torch.full(index_shape, position), constant)
        statement = f"{name}.scatter_({dim}, torch.full({tuple(index_shape)!r}, {position}), {constant!r})"
        builder.emit_inplace(target, statement, "index_put")
        return True
    if kind == "fill":
        constant = draw(st.sampled_from(F32_FILL_CONSTANTS if is_float else I32_FILL_CONSTANTS))
        sim.fill_(constant)
        builder.emit_inplace(target, f"{name}.fill_({constant!r})", "fill")
        return True
    # copy_ from a same-shaped value in another storage (eager's overlap
    # rules aside), of the same dtype ("copy") or the other one ("convert":
    # int32 bit patterns of small floats become float values exactly,
    # floats truncate to integers).
    converting = kind == "convert"
    sources = [
        v for v in builder.values.values()
        if v.sim.shape == sim.shape and v.storage != target.storage and builder.usable(v)
        and (v.sim.dtype == sim.dtype or converting)
    ]
    if not sources:
        return False
    source = draw(st.sampled_from(sources))
    if converting and source.sim.dtype == sim.dtype:
        # The other dtype through a bit view written inline: b.copy_(x0.view(torch.int32)).
        other = "int32" if sim.dtype == torch.float32 else "float32"
        source = _Value(f"{source.name}.view(torch.{other})", source.sim.view(_DTYPES[other]), source.storage, source.view_root)
    sim.copy_(source.sim)
    builder.emit_inplace(target, f"{name}.copy_({source.name})", "copy", source)
    return True


def _tensor_specs(count: int) -> st.SearchStrategy[list[TensorSpec]]:
    spec = st.tuples(
        st.sampled_from(SHAPES),
        st.sampled_from(("float32",) * 6 + ("int32",)),
        st.sampled_from((True, True, True, True, False)),
    )
    return st.lists(spec, min_size=count, max_size=count).map(
        lambda rows: [TensorSpec(f"x{i}", shape, dtype, contiguous) for i, (shape, dtype, contiguous) in enumerate(rows)]
    )


@st.composite
def programs(draw: st.DrawFn, avoid_known_bugs: bool = True, max_steps: int = 7) -> GeneratedProgram:
    """A strategy for :class:`GeneratedProgram`\\ s (see the module docstring)."""
    count = draw(st.integers(1, 3))
    specs = draw(_tensor_specs(count))
    buffer = None
    if draw(st.sampled_from((False, False, True))):
        buffer = TensorSpec(BUFFER_NAME, draw(st.sampled_from(SHAPES)), "float32")
    builder = _Builder(specs, buffer)
    steps = draw(st.integers(1, max_steps))
    for _ in range(steps):
        operand = builder.values[draw(st.sampled_from(sorted(builder.values)))]
        if not builder.usable(operand):
            continue
        kind = draw(st.sampled_from(("view", "view", "view", "compute", "compute", "inplace", "inplace")))
        drawer = {"view": _draw_view, "compute": _draw_compute, "inplace": _draw_inplace}[kind]
        draw(drawer(builder, operand))

    donate: tuple[int, ...] = ()
    if draw(st.sampled_from((False, False, True))):
        donate = tuple(draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=count, unique=True)))
    names = sorted(builder.values)
    returns = draw(st.lists(st.sampled_from(names), min_size=1, max_size=4))
    if avoid_known_bugs:
        returns = _without_known_bugs(builder, returns)
        if not returns:
            reject()
    data_seed = draw(st.integers(0, 2**16))
    return GeneratedProgram(
        tuple(specs),
        buffer,
        tuple(builder.body),
        tuple(returns),
        donate,
        data_seed,
        tuple(builder.values[name].view_root for name in returns),
    )


def _without_known_bugs(builder: _Builder, returns: list[str]) -> list[str]:
    """``returns`` minus the values that would hit a known hloalias bug (the
    strict xfail ``KNOWN_BUGS`` of ``test_differential.py``)."""
    buffer_sources = {storage.copied_from for storage in builder.storages.values()} - {None}
    kept: list[str] = []
    for name in returns:
        value = builder.values[name]
        storage = builder.storages[value.storage]
        # A buffer that copy_ overwrote whole: torch.export makes the source
        # (or a view of it) the buffer's new value, the importer gives the
        # source's storage the buffer's class, and values in that storage
        # come back as the module's state, not as the tensors eager returns.
        if value.storage in buffer_sources:
            continue
        # A view of a constant (an input that fill_ overwrote, say) is
        # folded into a constant of its own and comes back as a copy.
        if storage.constant and builder.is_view(value):
            continue
        # A view of unfold windows the lowering gathers, or a diagonal it
        # cannot slice from a merged dimension, comes back as a copy.
        if value.copied_windows:
            continue
        # Views of an intermediate come back as separate device results
        # unless the intermediate itself is returned.  Equal views are one
        # value after CSE and are rebuilt from each other: returned twice,
        # they share as in eager.  So of the kept values in this storage,
        # if all are views and one differs from this one, it would lose
        # the sharing.
        sharing = [
            builder.values[other] for other in kept
            if builder.values[other].storage == value.storage
            and _layout(builder.values[other].sim) != _layout(value.sim)
        ]
        # "The intermediate itself" is the value that created the storage: a
        # view with the same layout (``v1.view(2, 3)`` of an unsqueezed
        # ``v0``) is still a view to hloalias, which cannot tell it from v0.
        if sharing and storage.argument is None and all(v.sim is not storage.base for v in [value, *sharing]):
            continue
        kept.append(name)
    return kept
