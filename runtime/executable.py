"""Execution: ``compile`` runs the whole pipeline and returns an
:class:`Executable` that behaves like calling the torch program eagerly.

- Results the ``eliminate-view-results`` pass removed come back as real
  torch views (``as_strided``) of their base: the input tensor, the module
  state or another result; no device memory and no copy.
- Module state (parameters, buffers, constants) lives on the device once
  per module: every executable compiled from the same ``nn.Module`` shares
  one device buffer per state tensor, and a tensor reachable under several
  names (tied weights) is one buffer.  A mutated buffer is aliased to its
  new value: XLA writes in place.  A returned view of state stays a live
  view of it across calls and ``load_state_dict``; while such a view is
  held PJRT cannot reuse the buffer, so XLA writes elsewhere and the runtime
  copies the new value back into it (counted in :attr:`Executable.host_copies`).
- A mutated user input is updated in place, as eager would.  A torch CPU
  tensor is memory PJRT does not own, so on its first call XLA writes the
  new value to a fresh buffer and the caller's tensor is moved onto it (no
  copy; only when nothing else views its storage); later calls donate that
  buffer and XLA writes in place.  Otherwise the new value is copied back
  each call (``host_copies``, named by ``explain()``).
- Results on CPU are runtime-owned buffers lent to torch without a DLPack
  export, so a result donated to a later call (``y = exe(y)``) is reused in
  place.
- Donated inputs are consumed.  A :class:`DeviceTensor` that was donated
  raises :class:`DonatedBufferError` when used again.  A donated torch
  tensor is left untouched: on the CPU client PJRT cannot reuse memory it
  does not own, so XLA writes the result elsewhere; treat it as consumed.
- Inputs must match the example inputs' shapes and dtypes; anything else is
  an :class:`ExecutionError` (compile again for another signature).  Calls
  bind like the eager function: positional or keyword, in any order.
- Non-contiguous user inputs are copied to the device row-major; a
  returned view of one is a view of the caller's tensor in its own strides
  (:mod:`hloalias.runtime.strided_views`).  Inputs with a lazy conjugate or
  negative bit are resolved first; views of them view the resolved copy.
- Two inputs that share memory where the program writes or donates either
  are refused before anything runs (eager would let one see the other's
  update mid-program; XLA cannot).
- A call that fails leaves the module state and every caller tensor as they
  were.  Calls of executables that share module state are serialized.
- Single-device CPU calls of the common kind (see :func:`_native_lane`) run
  in native code (``hloalias.runtime._lane``) with the same results and
  errors: a call it does not take runs here, in Python, before anything
  changed.  ``HLOALIAS_NATIVE=0`` (read when an executable is made) keeps
  every call in Python."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

import jax
import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch_mlir import ir

from hloalias import attributes as A
from hloalias.errors import DonatedBufferError, DonationError, ExecutionError, PipelineError, ShardingError, TorchImportError
from hloalias.frontend.importer import Program, Stage, import_torch
from hloalias.contract import Signature, StoredLayout, verify
from hloalias.mlir import find_main, print_module
from hloalias.passes.alias_donated_buffers import AliasDonatedBuffers, AliasReport
from hloalias.passes.eliminate_view_results import EliminateViewResults, ViewReport
from hloalias.pipeline import (
    CPU_PIPELINE,
    DEFAULT_PIPELINE,
    module_cache_key,
    parse_pipeline,
    run_pipeline,
    with_fixed_dtypes,
    with_fixed_layouts,
)
from hloalias.runtime import program_cache
from hloalias.runtime.export_cache import import_cached
from hloalias.runtime.sharding import Mesh, Placement, plan_shardings, result_shardings
from hloalias.runtime.strided_views import strided_view_of
from hloalias.runtime.pjrt import (
    HostBacking,
    MemoryStats,
    SingleDeviceDispatch,
    array_to_torch,
    compile_module,
    device_for,
    host_backed_tensor,
    memory_stats,
    native_enabled,
    torch_to_device,
)

try:  # the native call path; built with the package (setup.py), optional
    from hloalias.runtime import _lane
except ImportError:  # not built here: every call takes the Python path
    _lane = None  # type: ignore[assignment]


class DeviceTensor:
    """A tensor held on a PJRT device, for inputs whose buffers should be
    truly reused when donated.  Make one with :meth:`Executable.to_device`
    or :func:`to_device`; read it back with :meth:`to_torch`."""

    def __init__(self, array: jax.Array, name: str = "tensor") -> None:
        self._array: jax.Array | None = array
        self.name = name
        self._consumed_by: str | None = None
        # Fixed for its lifetime: a rebind (in-place update) keeps the type.
        self.dtype: torch.dtype = _torch_dtype_of_jax(array.dtype)
        self.shape = torch.Size(array.shape)

    @property
    def array(self) -> jax.Array:
        """The device array; DonatedBufferError once donated."""
        if self._array is None or self._array.is_deleted():
            raise DonatedBufferError(
                f"device tensor '{self.name}' was donated {self._consumed_by or 'to a call'} "
                "and its buffer has been consumed; it cannot be used again"
            )
        return self._array

    def to_torch(self) -> torch.Tensor:
        """The value as a torch tensor: on CPU a live view of the device
        buffer (zero-copy; later in-place updates by calls show through it)."""
        return array_to_torch(self.array)

    def _consume(self, where: str) -> None:
        self._consumed_by = where
        self._array = None

    def _rebind(self, array: jax.Array) -> None:
        self._array = array


def _tensor_for_device(tensor: Any, what: str) -> torch.Tensor:
    """``tensor`` checked as a torch tensor that can be copied to a device."""
    if not isinstance(tensor, torch.Tensor):
        raise ExecutionError(f"{what} is {type(tensor).__name__}, expected a torch.Tensor")
    if tensor.device.type == "meta":
        raise ExecutionError(f"{what} is a meta tensor: it has no data to copy to the device")
    if tensor.layout is not torch.strided:
        raise ExecutionError(f"{what} has layout {tensor.layout}; only dense (strided) tensors are supported")
    return _resolved(tensor)


def _resolved(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` without lazy conjugate/negative bits (a copy when set):
    DLPack would export the raw memory without them."""
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    return tensor


def to_device(tensor: torch.Tensor, device: Any = None, name: str = "tensor") -> DeviceTensor:
    """Copy ``tensor`` into a PJRT-owned buffer on ``device`` (default CPU)."""
    checked = _tensor_for_device(tensor, f"to_device: '{name}'")
    return DeviceTensor(torch_to_device(checked, device_for(device), owned=True), name)


@dataclasses.dataclass(frozen=True)
class _Rebuild:
    """How to produce a removed result from its base (None layout: dead)."""

    base: str | None
    dtype: torch.dtype | None = None
    sizes: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    offset: int = 0
    identity: bool = False


@dataclasses.dataclass
class CacheStats:
    """Executable cache counters (process-wide)."""

    hits: int = 0
    misses: int = 0


_CACHE: dict[tuple[str, str], Any] = {}
_CACHE_STATS = CacheStats()
_CACHE_LOCK = threading.Lock()


def cache_stats() -> CacheStats:
    """The process-wide executable cache counters (live object)."""
    return _CACHE_STATS


def clear_cache() -> None:
    """Drop every cached XLA executable and reset the counters."""
    with _CACHE_LOCK:
        _CACHE.clear()
        _CACHE_STATS.hits = _CACHE_STATS.misses = 0


# -- module state shared by executables ---------------------------------------------


class _StateSlot:
    """One state tensor of a module on one device: the single device buffer
    every executable compiled from that module reads and updates.

    ``layout`` is the buffer's layout: None for torch's, else the buffer
    holds ``tensor.permute(P).flip(R)`` (``hloalias.stored_permutation`` and
    ``stored_reversed``, written by ``permute-conv-kernel-state`` on
    read-only convolution kernels).  ``bits`` is the buffer's dtype when it
    holds the tensor's bit pattern as the same-width integer
    (``tensor.view(torch.int16)``: ``hloalias.stored_bits_of``, written by
    ``store-state-as-bits``), else None.  Both are fixed by the first
    executable that uses the slot and change only back to torch's
    (:meth:`to_torch_layout`, :meth:`to_torch_dtype`), when a later
    executable writes, donates or views the tensor in torch's.  An
    executable that reads it in another form copies it into its own on
    each call; one that writes it in the other dtype has its new value
    stored back as the slot's dtype (the ``array`` setter)."""

    def __init__(
        self, source: torch.Tensor, device: Any, put: Callable[[torch.Tensor], jax.Array] | None = None,
        layout: StoredLayout | None = None, bits: torch.dtype | None = None,
    ) -> None:
        self.source: weakref.ref[torch.Tensor] = weakref.ref(source)
        self.version = source._version
        self.device = device
        self.put = put if put is not None else (lambda t: torch_to_device(t, device, owned=True))
        self.layout = layout
        self.torch_dtype = source.dtype
        self.bits = bits
        #: Call plans whose cached argument lists hold this slot's buffer:
        #: replacing the buffer drops those lists (see ``_CallPlan``).
        self.readers: list[weakref.ref[_CallPlan]] = []
        self._array: jax.Array | None = None
        self.array = self.upload(_resolved(source))
        self.consumed_by: str | None = None
        self.nbytes = source.numel() * source.element_size()

    @property
    def stored_dtype(self) -> torch.dtype:
        """The dtype of the slot's buffer: ``bits``, else torch's."""
        return self.bits if self.bits is not None else self.torch_dtype

    @property
    def array(self) -> jax.Array | None:
        """The slot's buffer (None once consumed by a donation), always in
        the slot's layout and dtype."""
        return self._array

    @array.setter
    def array(self, value: jax.Array | None) -> None:
        # A program compiled for the other interpretation of the same bits
        # (bf16 vs. its i16 bits) wrote the state: store its bits as ours.
        # (``_array``, when set, has the stored dtype: the usual case is one
        # dtype comparison.)
        current = self._array
        if value is not None and (current is None or value.dtype != current.dtype) and (
            _torch_dtype_of_jax(value.dtype) != self.stored_dtype
        ):
            value = self._reinterpreted(value)
        self._array = value
        if self.readers:
            self._forget_cached_lists()

    def _forget_cached_lists(self) -> None:
        """Drop the argument lists of the plans reading this slot: they hold
        the replaced buffer (and would keep it alive)."""
        for reader in self.readers:
            plan = reader()
            if plan is not None:
                plan.state_arrays = None

    def _reinterpreted(self, value: jax.Array) -> jax.Array:
        """``value`` (the state's bits in the other dtype of the same width)
        in the slot's dtype: copied into the current buffer when that is
        alive and writable on the host (views of it stay live), else into a
        new one."""
        tensor = array_to_torch(value).view(self.stored_dtype)
        current = self._array
        if current is not None and not current.is_deleted() and _writable_on_host(current):
            array_to_torch(current).copy_(tensor)
            return current
        return self.put(tensor)

    def upload(self, tensor: torch.Tensor) -> jax.Array:
        """A new device buffer holding ``tensor`` (torch's layout and dtype) in the slot's."""
        return self.put(_stored_form(tensor, self.layout, self.bits))

    def torch_value(self, array: jax.Array) -> torch.Tensor:
        """``array`` (a buffer in the slot's layout and dtype) as a torch
        tensor in torch's: on CPU a zero-copy view unless the layout flips
        dimensions (torch has no negative strides: then a copy)."""
        tensor = array_to_torch(array)
        if self.bits is not None:
            tensor = tensor.view(self.torch_dtype)
        if self.layout is None:
            return tensor
        if self.layout.reversed:
            tensor = tensor.flip(self.layout.reversed)
        return tensor.permute(self.layout.inverse)

    def write(self, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` (torch's layout and dtype) into the slot's buffer in place."""
        assert self.array is not None
        array_to_torch(self.array).copy_(_stored_form(tensor, self.layout, self.bits))

    def array_in(self, array: jax.Array, layout: StoredLayout | None, bits: torch.dtype | None = None) -> jax.Array:
        """``array`` (in the slot's layout and dtype) copied into ``layout``
        and ``bits`` (None: torch's), for an executable compiled for another
        form."""
        return self.put(_stored_form(self.torch_value(array), layout, bits))

    def to_torch_layout(self) -> None:
        """Store the buffer in torch's layout from now on (a copy, once)."""
        if self.layout is None:
            return
        if self.array is not None and not self.array.is_deleted():
            self.array = self.array_in(self.array, None, self.bits)
        self.layout = None

    def to_torch_dtype(self) -> None:
        """Store the buffer in torch's dtype from now on (a copy, once)."""
        if self.bits is None:
            return
        array = self._array
        fresh = None if array is None or array.is_deleted() else self.array_in(array, self.layout, None)
        self.bits = None
        # A consumed buffer becomes None (using it still names the donation):
        # ``_array``, when set, always has the stored dtype.
        self._array = fresh
        self._forget_cached_lists()


def _form_text(layout: StoredLayout | None, bits: torch.dtype | None = None) -> str:
    text = "torch's layout" if layout is None else layout.describe()
    return text if bits is None else f"{text} as {str(bits).removeprefix('torch.')} bits"


def _stored_form(tensor: torch.Tensor, layout: StoredLayout | None, bits: torch.dtype | None = None) -> torch.Tensor:
    """``tensor`` (torch's layout and dtype) as ``layout`` and ``bits`` store
    it (a contiguous copy unless the layout is torch's; the bits are a view)."""
    if layout is not None:
        tensor = tensor.permute(layout.permutation)
        if layout.reversed:
            tensor = tensor.flip(layout.reversed)
        tensor = tensor.contiguous()
    return tensor if bits is None else tensor.view(bits)


class _StateGroup:
    """The device state of one module (or of one function's constants) and
    the lock that serializes calls reading or writing it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._slots: dict[tuple[int, str, int], weakref.ref[_StateSlot]] = {}

    def slot(
        self, source: torch.Tensor, device: Any, put: Callable[[torch.Tensor], jax.Array] | None = None,
        layout: StoredLayout | None = None, needs_torch_layout: bool = False,
        bits: torch.dtype | None = None, needs_torch_dtype: bool = False,
    ) -> _StateSlot:
        """The slot of ``source`` on ``device``, created (copied to the
        device, by ``put`` when given: a mesh placement, in ``layout``) on first use; re-read when torch changed ``source``
        since.  An existing slot keeps its layout unless ``needs_torch_layout``
        (the program writes, donates or views the tensor): then it is stored
        in torch's layout from now on; likewise its dtype (``bits``) unless
        ``needs_torch_dtype`` (the program writes or donates it in torch's
        dtype, or views it)."""
        with self.lock:
            slot = self.existing(source, device)
            if slot is None:
                slot = _StateSlot(source, device, put, layout, bits)
                self._slots[(id(source), device.platform, device.id)] = weakref.ref(slot)
                return slot
            if needs_torch_layout:
                slot.to_torch_layout()
            if needs_torch_dtype:
                slot.to_torch_dtype()
            if source._version != slot.version:
                slot.array = slot.upload(_resolved(source))
                slot.version = source._version
                slot.consumed_by = None
            return slot

    def existing(self, source: torch.Tensor, device: Any) -> _StateSlot | None:
        """The live slot of ``source`` on ``device``, or None."""
        found = self._slots.get((id(source), device.platform, device.id))
        slot = found() if found is not None else None
        return slot if slot is not None and slot.source() is source else None

    def fixed_layouts(self, state: dict[str, torch.Tensor], device: Any) -> tuple[str, ...]:
        """``permute-conv-kernel-state``'s ``layouts`` entries for the state
        that already has a slot here: a new program reads those buffers in
        the layout they are stored in."""
        entries = []
        for name, tensor in state.items():
            slot = self.existing(tensor, device)
            if slot is not None:
                entries.append(f"{name}:{'torch' if slot.layout is None else slot.layout.spec()}")
        return tuple(entries)

    def fixed_dtypes(self, state: dict[str, torch.Tensor], device: Any) -> tuple[str, ...]:
        """``store-state-as-bits``'s ``dtypes`` entries for the state that
        already has a slot here: a new program reads those buffers in the
        dtype they are stored in."""
        entries = []
        for name, tensor in state.items():
            slot = self.existing(tensor, device)
            if slot is not None:
                entries.append(f"{name}:{'torch' if slot.bits is None else 'bits'}")
        return tuple(entries)


_GROUPS: "weakref.WeakKeyDictionary[Any, _StateGroup]" = weakref.WeakKeyDictionary()
_GROUPS_LOCK = threading.Lock()


def _state_group(f: Any) -> _StateGroup:
    """The state group of ``f``: one per ``nn.Module`` / ``ExportedProgram``
    (shared by all its executables), a fresh one for a plain function."""
    if not isinstance(f, (torch.nn.Module, ExportedProgram)):
        return _StateGroup()
    with _GROUPS_LOCK:
        group = _GROUPS.get(f)
        if group is None:
            group = _StateGroup()
            _GROUPS[f] = group
        return group


# -- calling convention ------------------------------------------------------------


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


def compile(  # noqa: A001 - the name users expect
    f: torch.nn.Module | Callable[..., Any] | ExportedProgram,
    example_args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    donate: Sequence[int | str] = (),
    donate_argnums: Sequence[int] = (),
    donate_argnames: Sequence[str] = (),
    donate_state: Sequence[str] = (),
    pipeline: str | None = None,
    device: Any = None,
    mesh: Mesh | None = None,
    shardings: dict[str | int, Any] | None = None,
) -> "Executable":
    """Import ``f`` on the example inputs, run the pass pipeline, compile it
    with XLA through PJRT and return an :class:`Executable`.

    ``example_args`` is a tuple or list of the positional inputs (a single
    tensor is refused: write ``(x,)``); ``kwargs`` a dict of keyword inputs.

    What to donate, as JAX separates ``donate_argnums``/``donate_argnames``:
    ``donate_argnums`` names user inputs by flattened position,
    ``donate_argnames`` user inputs by argument name, ``donate_state``
    parameters/buffers by fully qualified name.  ``donate`` takes positions
    and names of either kind; a name that is both a user input and module
    state there is a :class:`DonationError` listing both.  Each tensor may
    be donated once.  ``pipeline`` is a textual pipeline (default
    :data:`hloalias.pipeline.DEFAULT_PIPELINE`); ``device`` is a platform name
    or a jax device (default: the first CPU device).  XLA executables are
    cached by the final module's key, so equivalent configurations share
    one compile, in this process and across processes (the disk cache,
    :mod:`hloalias.runtime.disk_cache`); importing the same program object
    on inputs of the same shapes, dtypes and static values again reuses the
    import (:mod:`hloalias.runtime.export_cache`).  Module state is shared
    by every executable compiled from the same module.

    ``mesh`` (an :class:`~hloalias.runtime.sharding.Mesh`) runs the program
    on several devices with XLA's SPMD partitioner; ``shardings`` maps state
    names (FQNs), user-input names or positions to partition specs over the
    mesh's axes (one entry per dimension: axis name, tuple of names, or None;
    unnamed tensors are replicated).  Errors in either are
    :class:`ShardingError`, raised before anything is compiled."""
    _check_mesh_arguments(mesh, shardings)
    example_args, kwargs = _checked_compile_arguments(example_args, kwargs, pipeline)
    requests = _donation_requests(donate, donate_argnums, donate_argnames, donate_state)
    target = device_for(mesh.platform if mesh is not None else device)
    # A program compiled before (any process) comes from the disk cache
    # before any import (runtime/program_cache.py); single-device only.
    options_key = (tuple((r.kind, r.target) for r in requests), pipeline, target.platform, target.id, target.device_kind)
    cached = program_cache.lookup(f, example_args, kwargs, options_key) if mesh is None else None
    found = cached.found if cached is not None else None
    if found is not None:  # usable when this process would run the same pipeline
        found = program_cache.usable(found, _pipeline_for(pipeline, found.program, _state_group(f), target, False))
    if found is not None:
        program, placement, group, final_text = found.program, Placement(target), _state_group(f), found.final_text
        pipeline_text = found.pipeline_text
    else:
        program = import_cached(f, example_args, kwargs, lambda: import_torch(f, example_args, kwargs))
        placement = plan_shardings(program, mesh, shardings, target) if mesh is not None else Placement(target)
        donated = _resolve_donations(program, requests)
        _mark_donors(program, donated)
        # State on a mesh is placed by this program's shardings: its own group.
        group = _state_group(f) if not placement.spmd else _StateGroup()
        pipeline_text = _pipeline_for(pipeline, program, group, target, placement.spmd)
        run_pipeline(program.torch_mlir_module, pipeline_text)
        # The contract of the module XLA gets, checked once: a violation is an
        # IRError now, not a KeyError in some later call.
        with program.torch_mlir_module.context:
            verify(find_main(program.torch_mlir_module))
        final_text = print_module(program.torch_mlir_module)
        if cached is not None and cached.key is not None:
            program_cache.store(cached.key, f, program, pipeline_text, final_text)
    key = module_cache_key(final_text)
    cache_slot = (key, ",".join(f"{d.platform}:{d.id}" for d in placement.devices))
    with _CACHE_LOCK:
        loaded = _CACHE.get(cache_slot)
        hit = loaded is not None
        if hit:
            _CACHE_STATS.hits += 1
    if not hit:
        options = None
        if placement.spmd:
            sharded = result_shardings(program.torch_mlir_module)
            options = placement.compile_options(sharded)
        loaded = compile_module(final_text, target, options=options, devices=placement.devices)
        with _CACHE_LOCK:
            _CACHE[cache_slot] = loaded
            _CACHE_STATS.misses += 1
    # Reports of the final module (all runs of each pass together), not
    # of the last run; None when the pipeline did not run the pass.
    ran = _passes_in(pipeline_text)
    module = program.torch_mlir_module
    executable = Executable(
        program, loaded, target, key, final_text,
        ViewReport.from_module(module) if EliminateViewResults.name in ran else None,
        AliasReport.from_module(module) if AliasDonatedBuffers.name in ran else None,
        cache_hit=hit,
        convention=_CallConvention.of(f, example_args, kwargs),
        state_group=group,
        placement=placement,
    )
    executable.program_cache = program_cache.status_line(cached, found)
    return executable


def _pipeline_for(pipeline: str | None, program: Program, group: _StateGroup, target: Any, spmd: bool) -> str:
    """The pipeline ``compile`` runs: the given one, else the default (with
    ``permute-conv-kernel-state`` for a single-device CPU program: its state
    lives on the device in the layout the program reads).  State that already
    has a device buffer in ``group`` is read in the layout it is stored in."""
    if pipeline is None:
        pipeline = CPU_PIPELINE if target.platform == "cpu" and not spmd else DEFAULT_PIPELINE
    pipeline = with_fixed_layouts(pipeline, group.fixed_layouts(program.state, target))
    return with_fixed_dtypes(pipeline, group.fixed_dtypes(program.state, target))


def _passes_in(pipeline: str) -> set[str]:
    return {element.name for element in parse_pipeline(pipeline)}


def _checked_compile_arguments(
    example_args: Any, kwargs: Any, pipeline: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``compile``'s example inputs as a tuple and a dict, or TorchImportError
    naming the malformed argument (nothing is guessed: a single tensor is
    not split into rows)."""
    if isinstance(example_args, torch.Tensor):
        raise TorchImportError(
            "compile: example_args is a single tensor; pass a tuple or list of the inputs, "
            "e.g. example_args=(x,)"
        )
    if not isinstance(example_args, (tuple, list)):
        raise TorchImportError(
            f"compile: example_args is {type(example_args).__name__}; pass a tuple or list of the inputs"
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise TorchImportError(
            f"compile: kwargs is {type(kwargs).__name__}; pass a dict from argument name to input"
        )
    if pipeline is not None and not isinstance(pipeline, str):
        raise PipelineError(f"compile: pipeline is {type(pipeline).__name__}; pass the textual pipeline as a str")
    return tuple(example_args), dict(kwargs)


@dataclasses.dataclass(frozen=True)
class _DonationRequest:
    """One donation request: ``kind`` is ``any`` (from ``donate``),
    ``argnum``, ``argname`` or ``state``."""

    kind: str
    target: int | str


def _donation_requests(
    donate: Any, argnums: Any, argnames: Any, state: Any
) -> list[_DonationRequest]:
    requests: list[_DonationRequest] = []
    for option, kind, allowed in (
        ("donate", "any", (int, str)), ("donate_argnums", "argnum", (int,)),
        ("donate_argnames", "argname", (str,)), ("donate_state", "state", (str,)),
    ):
        value = {"donate": donate, "donate_argnums": argnums, "donate_argnames": argnames, "donate_state": state}[option]
        if isinstance(value, (str, int)) or not isinstance(value, (tuple, list)):
            raise DonationError(
                f"{option} must be a list or tuple, got {type(value).__name__} {value!r}"
                + (f"; write {option}=[{value!r}]" if isinstance(value, (str, int)) else "")
            )
        for entry in value:
            if isinstance(entry, bool) or not isinstance(entry, allowed):
                what = "positions or names" if kind == "any" else ("positions" if kind == "argnum" else "names")
                raise DonationError(f"{option} entries are {what}, got {entry!r}")
            requests.append(_DonationRequest(kind, entry))
    return requests


def _check_mesh_arguments(mesh: Any, shardings: Any) -> None:
    """Bad ``mesh``/``shardings`` arguments: ShardingError before any work."""
    if shardings is not None and mesh is None:
        raise ShardingError("shardings were given without a mesh: pass mesh=hloalias.Mesh(...)")
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ShardingError(f"mesh must be an hloalias.Mesh, got {type(mesh).__name__}")
    if shardings is not None and not isinstance(shardings, dict):
        raise ShardingError(f"shardings must be a dict of name -> partition spec, got {type(shardings).__name__}")
    if mesh is not None:
        mesh.devices()  # a mesh larger than the platform fails before the import


def _resolve_donations(program: Program, requests: list[_DonationRequest]) -> list[int]:
    arguments = program.signature.arguments
    user_inputs = program.signature.user_input_indices()
    user_names = {arguments[i].name: i for i in user_inputs}
    state_names = {a.name: a.index for a in arguments if a.kind != "user_input"}
    chosen: list[int] = []
    for request in requests:
        target = request.target
        if isinstance(target, int):
            if not 0 <= target < len(user_inputs):
                raise DonationError(
                    f"donate names user input {target}, but the program has {len(user_inputs)} user inputs"
                )
            index = user_inputs[target]
        else:
            as_input = user_names.get(target) if request.kind in ("any", "argname") else None
            as_state = state_names.get(target) if request.kind in ("any", "state") else None
            if as_input is not None and as_state is not None:
                raise DonationError(
                    f"donate name '{target}' is ambiguous: it is user input '{target}' "
                    f"(donate_argnames=['{target}'] or donate_argnums=[{user_inputs.index(as_input)}]) "
                    f"and {arguments[as_state].kind} '{target}' (donate_state=['{target}'])"
                )
            found = as_input if as_input is not None else as_state
            if found is None:
                known = {"any": [a.name for a in arguments], "argname": list(user_names), "state": list(state_names)}
                what = {"any": "tensor", "argname": "user input", "state": "module state"}[request.kind]
                raise DonationError(
                    f"donate names unknown {what} '{target}' (known: {', '.join(known[request.kind]) or 'none'})"
                )
            index = found
        if index in chosen:
            raise DonationError(f"'{arguments[index].name}' is donated twice")
        if arguments[index].kind == "constant":
            raise DonationError(f"'{arguments[index].name}' is a lifted constant and cannot be donated")
        chosen.append(index)
    return chosen


def _mark_donors(program: Program, donated: list[int]) -> None:
    if not donated:
        return
    module = program.torch_mlir_module
    with module.context:
        main = find_main(module)
        contract = Signature.read(main)
        args = tuple(
            dataclasses.replace(arg, buffer_donor=True) if index in donated else arg
            for index, arg in enumerate(contract.args)
        )
        dataclasses.replace(contract, args=args).write(main)


@dataclasses.dataclass(frozen=True)
class HostCopy:
    """A host-side copy the runtime makes on a call, and why."""

    name: str
    nbytes: int
    reason: str


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
    #: when a runtime buffer backs the input (a self-aliased mutation or a
    #: donor aliased to a user output); None when there is none.
    in_place: int | None
    #: A mutated user input aliased to its own new value: a plain torch
    #: tensor may be re-seated onto the result buffer.
    reseat: bool
    #: A user input the program only reads (not written, not donated).
    read_only: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        # Read on every call: computed once.
        object.__setattr__(
            self, "read_only",
            self.slot is None and self.mutated is None and not self.donated and self.in_place is None,
        )


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
    object sits at the same address: ``Executable._import_input``).  So a
    tensor whose dtype,
    shape or device changed since the last call is refused, and one whose
    memory changed is read afresh.  State arrays are read from their slots
    on each call, so a ``load_state_dict`` or another executable's update
    is seen.  Mesh (SPMD) programs have no plan: they take the general
    path (``Executable._run``)."""

    def __init__(self, exe: "Executable") -> None:
        results = {key: position for position, key in enumerate(exe._result_keys)}
        steps = []
        for index, state_name in exe._arg_plan:
            shape, dtype = exe._arg_types[index]
            mutation_key = exe._mutation_keys[index]
            in_place: int | None = None
            if index in exe._self_aliased:
                in_place = results[A.mutation_key(index)]
            elif index in exe._donor_aliased:
                in_place = results[exe._donor_aliased[index]]
            steps.append(_ArgStep(
                index, exe._names[index], exe._slots[state_name] if state_name is not None else None,
                torch.Size(shape), dtype, results[mutation_key] if mutation_key is not None else None,
                index in exe._donated_args, in_place, index in exe._self_aliased,
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
        self.host_results = exe.device.platform == "cpu"
        #: How the program runs: jaxlib's C++ dispatch where it has one.
        self.dispatch = SingleDeviceDispatch(exe._loaded, exe.device)
        #: A program with no results and no donations has no effect on the
        #: device (every output is a view of an input or a constant): it is
        #: not run at all.
        self.executes = bool(exe._result_keys) or any(step.donated for step in steps)
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
        #: For a program that is not run: when every user output is a user
        #: input or a same-dtype view of one, (input index, rebuild) per
        #: output; :meth:`Executable._input_views` then makes the outputs
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

    def arguments(self, exe: "Executable", user_arrays: list[jax.Array]) -> list[jax.Array | None]:
        """The argument list in @main order: the state slots' current arrays
        (None where a slot's buffer was consumed; a copy in this program's
        layout where the slot holds another: ``Executable._state_array``)
        and ``user_arrays``."""
        state = self.state_arrays
        if state is None:
            state = self.state_arrays = [slot.array for slot in self.state_slots]
        if self.stored_layouts:
            state = list(state)  # the copies below are this call's only
            for position, name, slot, layout, bits in self.stored_layouts:
                if slot.layout != layout or slot.bits != bits:
                    state[position] = exe._state_array(name)
        if self.state_first:
            return state + user_arrays
        arrays: list[jax.Array | None] = [None] * len(self.steps)
        state_values = iter(state)
        user_values = iter(user_arrays)
        for position, step in enumerate(self.steps):
            arrays[position] = next(state_values) if step.slot is not None else next(user_values)
        return arrays


#: What a native lane returns for a call it leaves to the Python path.
_LANE_FALLBACK = object()


def _lane_refusal(exe: "Executable", plan: _CallPlan | None) -> str | None:
    """Why ``exe`` has no native call path (words for ``explain()``), or
    None when it can have one (see :func:`_native_lane`)."""
    if _lane is None:
        return "the native call path (hloalias.runtime._lane) is not built here"
    if not native_enabled():
        return "HLOALIAS_NATIVE=0"
    if plan is None:
        return "a mesh program"
    if not plan.host_results:
        return "not a CPU program"
    if not plan.executes:
        return "the program does not run (its outputs are views of its inputs)"
    if not plan.direct_outputs or not all(result.nbytes > 0 for result in plan.outputs):
        return "an output is a rebuilt view, a constant or empty"
    if any(step.slot is not None for step in plan.consumed):
        return "module state is consumed by a donation"
    if plan.stored_layouts:
        return "module state is read in another layout or dtype than its buffer's"
    if not plan.state_first or tuple(step.index for step in plan.user_steps) != tuple(exe._user_indices):
        return "the arguments are not in state-then-inputs order"
    for step in plan.user_steps:
        if not step.read_only and step.in_place is None:
            return f"input '{step.name}' is written but not in place (its new value is copied back)"
    return None


def _native_lane(exe: "Executable", plan: _CallPlan | None) -> tuple[Any, str | None]:
    """The native call path (``hloalias.runtime._lane.Lane``, see its source
    for the contract) of ``exe`` and None, or None and why it has none
    (:func:`_lane_refusal`): the extension is not built, ``HLOALIAS_NATIVE=0``,
    or the plan is of another kind than the lane runs.  That kind: a CPU
    program that runs, every output one of its results (no rebuilt views,
    constants, empty results), no state consumed (a donated torch input is
    left as it is), state first in ``@main`` and read in the slots' own
    form, and every user input either read only or written (or donated) in
    place into the runtime buffer backing it.  Calls of that kind whose
    inputs it does not take (another type, layout or memory; an input eager
    refuses to write; overlapping inputs; a consumed or tied donated state
    buffer) still take the Python path, call by call."""
    refusal = _lane_refusal(exe, plan)
    if refusal is not None or plan is None or _lane is None:
        return None, refusal
    user_position = {index: position for position, index in enumerate(exe._user_indices)}
    users = tuple(
        (
            step.index, step.in_place is not None, step.index in exe._written_in_place, step.dtype,
            tuple(step.shape), exe._input_nbytes[step.index], step.in_place if step.in_place is not None else -1,
        )
        for step in plan.user_steps
    )
    state = tuple(
        (step.index, step.mutated, step.slot) for step in plan.after if step.slot is not None and step.mutated is not None
    )
    if exe._single_output:
        mode, unflatten = 0, None
    elif exe._flat_outputs:
        mode, unflatten = 1, None
    else:
        spec = exe._signature.out_spec
        mode, unflatten = 2, (lambda flat: pytree.tree_unflatten(flat, spec))
    lane = _lane.Lane(
        exe, plan, users,
        tuple((user_position[first], user_position[second]) for first, second in exe._write_pairs),
        state, tuple(step.index for step in plan.donated_state),
        tuple((result.position, result.dtype, tuple(result.shape), result.nbytes) for result in plan.outputs),
        tuple(step.index for step in plan.kept), mode,
        len({id(slot) for slot in plan.state_slots}) == len(plan.state_slots), len(plan.state_slots), unflatten,
        exe._group.lock if exe._slots else None, exe._imports, _BACKINGS, _BACKINGS_SWEEP_AT, HostBacking,
        _register_backing, exe._import_input, exe._finish_planned, exe._execution_failed, _LANE_FALLBACK,
    )
    return lane, None


class Executable:
    """A compiled torch program.  Call it like the original function."""

    def __init__(
        self,
        program: Program,
        loaded: Any,
        device: Any,
        cache_key: str,
        mlir: str,
        view_report: ViewReport | None,
        alias_report: AliasReport | None,
        *,
        cache_hit: bool,
        convention: _CallConvention | None = None,
        state_group: _StateGroup | None = None,
        placement: Placement | None = None,
    ) -> None:
        assert program.stage is Stage.STABLEHLO
        self._placement = placement if placement is not None else Placement(device)
        self._signature = program.signature
        self._loaded = loaded
        self.device = device
        self.cache_key = cache_key
        self.mlir = mlir
        self.cache_hit = cache_hit
        self.view_report = view_report
        self.alias_report = alias_report
        #: How the program cache served this compile (runtime/program_cache.py).
        self.program_cache = "program cache: not consulted"
        self._calls = 0
        self._read_final_module(program)
        self._convention = convention or _CallConvention(
            None,
            tuple((self._names[i], None) for i in self._user_indices),
            (),
        )
        #: The number of positional tensors a call may pass as they are
        #: (a flat signature without keywords); -1 when there is none.
        self._positional_arity = (
            len(self._user_indices) if self._flat_inputs and not self._convention.keywords else -1
        )
        self._group = state_group or _StateGroup()
        state_index = {a.name: a.index for a in program.signature.arguments}
        self._slots: dict[str, _StateSlot] = {
            name: self._group.slot(
                value, device, self._state_put(state_index[name]), self._stored_layouts.get(name),
                needs_torch_layout=name in self._torch_layout_state,
                bits=self._stored_bits.get(name), needs_torch_dtype=name in self._torch_dtype_state,
            )
            for name, value in program.state.items()
        }
        # A tensor reachable under several names (tied weights) is one
        # buffer: XLA counts each argument, the device holds it once.
        seen: set[int] = set()
        self.tied_state: dict[str, str] = {}
        first_name: dict[int, str] = {}
        duplicate_bytes = 0
        for name, slot in self._slots.items():
            if id(slot) in seen:
                self.tied_state[name] = first_name[id(slot)]
                duplicate_bytes += slot.nbytes
            else:
                seen.add(id(slot))
                first_name[id(slot)] = name
        stats = memory_stats(loaded).as_dict()
        devices = self._placement.devices
        # On a mesh XLA reports one partition's figures; every device holds the same.
        self.memory_stats_per_device = {f"{d.platform}:{d.id}": dict(stats) for d in devices}
        stats = {name: value * len(devices) for name, value in stats.items()}
        stats["argument_bytes"] -= duplicate_bytes
        stats["total_bytes"] -= duplicate_bytes
        self.memory_stats = stats
        # Tied weights merged at import are one argument (XLA counts them
        # once): every name of the module's state_dict reaches their slot.
        for alias, canonical in self._signature.state_aliases.items():
            if canonical in self._slots:
                self._slots[alias] = self._slots[canonical]
                self.tied_state[alias] = canonical
        #: Host copies made by calls so far: name -> count (see ``explain()``).
        self.host_copies: dict[str, int] = {}
        self._statics: dict[int, Any] = dict(getattr(self._signature, "static_inputs", {}) or {})
        # Mutated inputs aliased to their own new value: a torch tensor
        # backed by a runtime-owned buffer is updated in place for them.
        self._self_aliased: set[int] = {
            index for index, result in self._aliases.items()
            if result is not None and self._result_keys[result] == A.mutation_key(index)
            and index in self._user_indices
        }
        # Donated inputs aliased to a user output: a torch tensor backed by
        # a runtime-owned buffer (an earlier result) is donated for real.
        self._donor_aliased: dict[int, str] = {
            index: self._result_keys[result] for index, result in self._aliases.items()
            if result is not None and index in self._user_indices and index not in self._self_aliased
            and A.parse_key(self._result_keys[result])[0] == "output"
        }
        self._writes = {
            index for index in self._user_indices
            if self._mutation_keys[index] is not None or index in self._donated_args
        }
        # Read by every call (hot): each user input's expected type, the
        # inputs written in place (eager's refusals apply to them), and the
        # pairs of inputs that must not share memory (either is written).
        self._input_types: tuple[tuple[int, torch.Size, torch.dtype], ...] = tuple(
            (index, torch.Size(self._arg_types[index][0]), self._arg_types[index][1])
            for index in self._user_indices
        )
        #: Each user input's size in bytes (its checked shape and dtype).
        self._input_nbytes: dict[int, int] = {
            index: _numel(shape) * _itemsize(dtype) for index, shape, dtype in self._input_types
        }
        self._written_in_place: tuple[int, ...] = tuple(
            index for index in self._user_indices
            if index in self._writes and self._mutation_keys[index] is not None
        )
        self._write_pairs: tuple[tuple[int, int], ...] = tuple(
            (first, second)
            for position, first in enumerate(self._user_indices)
            for second in self._user_indices[position + 1:]
            if first in self._writes or second in self._writes
        )
        self._plan = _CallPlan(self) if not self._placement.spmd else None
        #: Zero-copy imports of read-only torch inputs, reused while the same
        #: tensor object covers the same memory (see :meth:`_import_input`).
        self._imports: dict[int, tuple[weakref.ref[torch.Tensor], int, jax.Array]] = {}
        #: The native call path for calls the plan's common kind covers
        #: (:func:`_native_lane`), or None: every call takes the Python path
        #: (``_python_only_reason`` says why).
        self._lane, self._python_only_reason = _native_lane(self, self._plan)

    # -- final module facts ------------------------------------------------
    def _read_final_module(self, program: Program) -> None:
        module = program.torch_mlir_module
        with module.context:
            main = find_main(module)
            contract = Signature.read(main)  # verified once, by compile()
            self._donated_args = {i for i, arg in enumerate(contract.args) if arg.overwritten}
            self._aliases = {
                i: arg.aliasing_output for i, arg in enumerate(contract.args)
                if arg.aliasing_output is not None
            }
            self._result_keys = list(contract.keys)
            # State this program reads permuted (permute-conv-kernel-state).
            self._stored_layouts = {
                arg.name: arg.stored_layout for arg in contract.args
                if arg.name is not None and arg.stored_layout is not None
            }
            # State whose device buffer must be in torch's layout: written,
            # donated, or the base of a rebuilt view.
            mutated = {result.mutates for result in contract.results if result.mutates is not None}
            bases = {record.base for record in contract.removed}
            self._torch_layout_state = {
                arg.name for index, arg in enumerate(contract.args)
                if arg.name is not None and (arg.overwritten or index in mutated or A.arg_key(index) in bases)
            }
            # State this program stores as integer bits (store-state-as-bits),
            # and state whose buffer must hold torch's dtype: viewed, or
            # written or donated by this program in torch's dtype.
            self._stored_bits = {
                arg.name: _torch_dtype(ir.RankedTensorType(contract.arg_types[index]).element_type)
                for index, arg in enumerate(contract.args)
                if arg.name is not None and arg.stored_bits_of is not None
            }
            self._torch_dtype_state = {
                arg.name for index, arg in enumerate(contract.args)
                if arg.name is not None and (
                    A.arg_key(index) in bases or A.mutation_key(index) in bases
                    or (arg.stored_bits_of is None and (arg.overwritten or index in mutated))
                )
            }
            self._rebuilds: dict[str, _Rebuild] = {}
            for record in contract.removed:
                if record.base is None or record.layout is None:
                    self._rebuilds[record.key] = _Rebuild(None)
                    continue
                layout = record.layout
                self._rebuilds[record.key] = _Rebuild(
                    record.base, _torch_dtype(layout.element_type),
                    layout.sizes, layout.strides, layout.offset, identity=record.is_identity,
                )
        # Each rebuilt result's base key, parsed once (the call path is hot).
        self._rebuild_bases = {
            r.base: A.parse_key(r.base) for r in self._rebuilds.values() if r.base is not None
        }
        function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        self._result_shapes = [tuple(ir.RankedTensorType(t).shape) for t in function_type.results]
        self._result_dtypes = [
            _TORCH_DTYPES.get(str(ir.RankedTensorType(t).element_type)) for t in function_type.results
        ]
        arguments = self._signature.arguments
        self._arg_types = [
            (tuple(ir.RankedTensorType(t).shape), _torch_dtype(ir.RankedTensorType(t).element_type))
            for t in ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).inputs
        ]
        for index, arg in enumerate(contract.args):
            if arg.stored_layout is not None:  # checked against torch's shape (load_state_dict)
                shape, dtype = self._arg_types[index]
                self._arg_types[index] = (tuple(shape[d] for d in arg.stored_layout.inverse), dtype)
            if arg.stored_bits_of is not None:  # checked against torch's dtype (load_state_dict)
                shape, _ = self._arg_types[index]
                self._arg_types[index] = (shape, _TORCH_DTYPES[arg.stored_bits_of])
        self._names = [a.name for a in arguments]
        # Per-call plans, computed once: the call path is hot.
        self._user_indices = self._signature.user_input_indices()
        self._arg_plan = [
            (a.index, None if a.kind == "user_input" else a.name) for a in arguments
        ]
        self._mutation_keys = [
            A.mutation_key(a.index) if A.mutation_key(a.index) in self._result_keys else None
            for a in arguments
        ]
        in_spec = self._signature.in_spec
        out_spec = self._signature.out_spec
        flat_in = pytree.tree_structure((tuple(range(len(self._user_indices))), {}))
        self._flat_inputs = in_spec == flat_in
        # A program compiled from keyword tensors only (HF's recipes:
        # ``module(input_ids=..., cache_position=...)``): their names in the
        # compiled order, for calls passing exactly those keywords.
        self._keyword_leaves: tuple[str, ...] | None = None
        parts = in_spec.children()
        if len(parts) == 2 and parts[1].type is dict and not getattr(self._signature, "static_inputs", None):
            names = tuple(parts[1].context)
            if in_spec == pytree.tree_structure(((), {name: 0 for name in names})):
                self._keyword_leaves = names
        self._output_keys = [A.output_key(i) for i in range(out_spec.num_leaves)]
        self._constant_outputs = {
            A.output_key(i): v for i, v in self._signature.constant_outputs.items()
        }
        self._single_output = out_spec == pytree.tree_structure(0)
        self._flat_outputs = self._single_output or out_spec == pytree.tree_structure(
            tuple(range(out_spec.num_leaves))
        )

    # -- introspection -----------------------------------------------------
    @property
    def aliases(self) -> list[dict[str, Any]]:
        """One entry per alias: argument name and index, result, origin, bytes."""
        if self.alias_report is None:
            return [
                {"argument": self._names[a], "arg_index": a, "result": r, "origin": "ir", "bytes": None}
                for a, r in sorted(self._aliases.items())
            ]
        return [
            {"argument": a.arg_name, "arg_index": a.arg_index, "result": a.result_index,
             "origin": a.origin, "bytes": a.bytes}
            for a in self.alias_report.aliases
        ]

    def host_copy_plan(self) -> list[HostCopy]:
        """The copies a call makes on the host beyond XLA's figures: each
        mutated torch input (PJRT cannot write into memory it does not own,
        so its new value is copied back) and the copies held references of
        state have forced so far."""
        plan = []
        for index in self._user_indices:
            if self._mutation_keys[index] is None:
                continue
            shape, dtype = self._arg_types[index]
            nbytes = _numel(shape) * _itemsize(dtype)
            if index in self._self_aliased:
                reason = (
                    "mutated torch input: PJRT cannot reuse memory it does not own; a contiguous tensor "
                    "that nothing else views is moved onto the runtime-owned result on its first call "
                    "(no copy) and updated in place after that; any other is copied back each call "
                    f"({self.host_copies.get(self._names[index], 0)} so far)"
                )
            else:
                reason = (
                    "mutated torch input not aliased to its new value (see alias-donated-buffers): "
                    "XLA writes a fresh buffer and it is copied back each call"
                )
            plan.append(HostCopy(self._names[index], nbytes, reason))
        for name, count in sorted(self.host_copies.items()):
            slot = self._slots.get(name)
            if slot is None:
                continue  # an input: listed above
            wanted = self._stored_layouts.get(name)
            wanted_bits = self._stored_bits.get(name)
            if slot.layout != wanted or slot.bits != wanted_bits:
                reason = (
                    f"{count} call(s) so far: the module's shared buffer is stored as "
                    f"{_form_text(slot.layout, slot.bits)} (fixed by another executable of the module), this "
                    f"program reads {_form_text(wanted, wanted_bits)}, so each call copies it into this "
                    "program's layout"
                    + (", and a new value it writes back into the buffer's dtype" if slot.bits != wanted_bits else "")
                )
            else:
                reason = (
                    f"{count} call(s) so far: a held view of its buffer kept XLA from updating it in place, "
                    "so the new value was copied back into it"
                )
            plan.append(HostCopy(name, slot.nbytes if slot is not None else 0, reason))
        return plan

    def explain(self) -> str:
        """Both passes' decisions (from the final module) and XLA's byte
        figures, as text.  Returns the text; prints nothing."""
        lines = [f"hloalias executable {self.cache_key[:16]} on {self.device.platform}:{self.device.id}"]
        if self.view_report is None:
            lines.append("eliminate-view-results: (not run)")
        else:
            lines.append(self.view_report.to_text())
        lines.append(self.alias_report.to_text() if self.alias_report else "alias-donated-buffers: (not run)")
        stats = self.memory_stats
        lines.append(
            "XLA memory: argument {argument_bytes} + output {output_bytes} - alias {alias_bytes} "
            "+ temp {temp_bytes} = {total_bytes} bytes".format(**stats)
        )
        lines.extend(self._host_copy_lines())
        lines.append(self._call_path_line())
        lines.append(self.program_cache)
        lines.extend(self._placement.describe(self.memory_stats_per_device))
        return "\n".join(lines)

    def _call_path_line(self) -> str:
        if self._lane is None:
            return f"call path: Python ({self._python_only_reason})"
        counts = self._lane.counts
        return (
            f"call path: native (hloalias.runtime._lane); calls so far: {counts['calls']} run natively, "
            f"{counts['fallbacks']} left to the Python path before running (inputs it does not take), "
            f"{counts['finished_in_python']} run natively and committed by the Python path (results not "
            "written in place)"
        )

    def _host_copy_lines(self) -> list[str]:
        lines = []
        for tied, first in self.tied_state.items():
            lines.append(f"state '{tied}' is '{first}' (tied): one device buffer, counted once")
        for name, layout in self._stored_layouts.items():
            lines.append(
                f"state '{name}' is read as {layout.describe()}, the layout its convolution reads "
                "(permute-conv-kernel-state); state_dict() returns torch's layout"
            )
        for name, bits in self._stored_bits.items():
            lines.append(
                f"state '{name}' is stored as its {str(bits).removeprefix('torch.')} bit pattern, the type the "
                "program reads and writes it as (store-state-as-bits); state_dict() returns torch's dtype"
            )
        plan = self.host_copy_plan()
        lines.append("host copies per call:" + ("" if plan else " none"))
        lines.extend(f"  '{c.name}' ({c.nbytes} bytes): {c.reason}" for c in plan)
        return lines

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Current parameters, buffers and constants (host copies, in
        torch's layout whatever layout the device buffer has)."""
        with self._group.lock:
            return {
                name: self._slots[name].torch_value(self._slot_array(name)).clone(memory_format=torch.contiguous_format)
                for name in self._slots
            }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Set module state.  Every entry is checked (known name, torch tensor
        or DeviceTensor with data, matching shape and dtype) and copied to the
        device before any is replaced; on CPU the values are written into the
        existing buffers, so returned views of state see them.  The state is
        shared by every executable compiled from the same module."""
        if not isinstance(state, dict):
            raise ExecutionError(f"load_state_dict: expected a dict from state name to tensor, got {type(state).__name__}")
        staged: dict[str, torch.Tensor | jax.Array] = {}
        for name, entry in state.items():
            if name not in self._slots:
                raise ExecutionError(
                    f"load_state_dict: unknown state '{name}' (known: {', '.join(self._slots)})"
                )
            index = self._names.index(self._signature.state_aliases.get(name, name))
            if isinstance(entry, DeviceTensor):
                if self._placement.spmd:
                    raise ExecutionError(
                        f"load_state_dict: '{name}' is a DeviceTensor; state on a mesh is loaded from "
                        "torch tensors and placed by the program's shardings"
                    )
                self._check_input(index, entry)
                staged[name] = entry.array
                continue
            checked = _tensor_for_device(entry, f"load_state_dict: '{name}'")
            self._check_input(index, checked)
            staged[name] = checked
        with self._group.lock:
            fresh: dict[str, jax.Array] = {}
            for name, value in staged.items():
                slot = self._slots[name]
                if isinstance(value, torch.Tensor) and _writable_on_host(slot.array):
                    continue  # written in place below
                if isinstance(value, torch.Tensor):
                    fresh[name] = slot.upload(value)
                elif slot.layout is not None or slot.bits is not None:
                    fresh[name] = slot.upload(array_to_torch(value))
                else:
                    fresh[name] = jax.device_put(value, self.device, may_alias=False)
            for name, value in staged.items():
                slot = self._slots[name]
                if name in fresh:
                    slot.array = fresh[name]
                else:
                    assert slot.array is not None and isinstance(value, torch.Tensor)
                    slot.write(value)
                slot.consumed_by = None

    def to_device(self, tensor: torch.Tensor, name: str = "tensor") -> DeviceTensor:
        """``tensor`` copied onto this executable's device (donatable for real)."""
        if self._placement.spmd:
            raise ExecutionError(
                "to_device: a program on a mesh takes torch tensors as inputs and places them "
                "by its shardings; DeviceTensor inputs are single-device"
            )
        checked = _tensor_for_device(tensor, f"to_device: '{name}'")
        return DeviceTensor(torch_to_device(checked, self.device, owned=True), name)

    # -- placement ---------------------------------------------------------
    def _state_put(self, arg_index: int) -> Callable[[torch.Tensor], jax.Array] | None:
        """How state argument ``arg_index`` goes to the device: None (the
        slot's default, one device) unless the program runs on a mesh."""
        if not self._placement.spmd:
            return None
        placement = self._placement
        return lambda tensor: placement.put(tensor, arg_index)

    # -- calling -----------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the program; see the module docstring for the semantics."""
        leaves: Sequence[Any]
        if not kwargs and len(args) == self._positional_arity:
            leaves = args
        elif (
            not args and self._keyword_leaves is not None and len(kwargs) == len(self._keyword_leaves)
            and all(isinstance(kwargs.get(name), (torch.Tensor, DeviceTensor)) for name in self._keyword_leaves)
        ):
            # The keywords compiled, each a tensor: nothing to bind.
            leaves = [kwargs[name] for name in self._keyword_leaves]
        else:
            leaves = self._user_leaves(args, kwargs)
        if self._lane is not None:
            outputs = self._lane(leaves)
            if outputs is not _LANE_FALLBACK:
                return outputs
        inputs: dict[int, Any] = dict(zip(self._user_indices, leaves))
        for (index, shape, dtype), value in zip(self._input_types, leaves):
            # The common case inline; anything else (DeviceTensor, errors)
            # through the full check.
            if not (
                isinstance(value, torch.Tensor) and value.dtype == dtype and value.shape == shape
                and value.is_cpu and value.layout is torch.strided
            ):
                self._check_input(index, value)
        if self._write_pairs or self._written_in_place:
            self._check_writes(inputs)
        plan = self._plan
        if plan is not None and plan.input_views is not None:
            # Not run (no results, no donation) and every output a view of
            # a user input: no state is read or written, nothing to serialize.
            outputs = self._input_views(plan.input_views, inputs)
            if outputs is not None:
                self._calls += 1
                return outputs
        with self._group.lock if self._slots else _NO_LOCK:
            if plan is not None:
                return self._run_planned(plan, inputs)
            return self._run(inputs)

    def _user_leaves(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The tensor inputs of a call, in ``@main``'s user-input order."""
        new_args, new_kwargs = self._convention.arrange(args, kwargs)
        leaves, spec = pytree.tree_flatten((new_args, new_kwargs))
        if spec != self._signature.in_spec:
            raise ExecutionError(self._structure_mismatch(new_args, new_kwargs))
        tensors = []
        for position, leaf in enumerate(leaves):
            if position not in self._statics:
                tensors.append(leaf)
                continue
            expected = self._statics[position]
            if type(leaf) is not type(expected) or leaf != expected:
                path = pytree.keystr(pytree.tree_flatten_with_path((new_args, new_kwargs))[0][position][0])
                raise ExecutionError(
                    f"compiled for static value {expected!r} of input {path}; got {leaf!r}: compile again"
                )
        return tensors

    def _structure_mismatch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        expected_args, expected_kwargs = self._signature.in_spec.children()
        names = [name if sub is None else f"{name}[{sub}]" for name, sub in self._convention.positional]
        pairs = list(zip(names, expected_args.children(), args))
        pairs += [(key, spec, kwargs.get(key)) for key, spec in zip(expected_kwargs.context, expected_kwargs.children())]
        for name, spec, value in pairs:
            got = pytree.tree_structure(value)
            if got != spec:
                return (
                    f"inputs do not have the structure the program was compiled for: input '{name}' "
                    f"should be {_describe_spec(spec)}, got {_describe_spec(got)}"
                )
        return (
            f"inputs do not have the structure the program was compiled for: expected "
            f"{self._convention.expected()}"
        )

    def _check_writes(self, inputs: dict[int, Any]) -> None:
        """Refuse, before anything runs, a call eager PyTorch would refuse or
        XLA cannot reproduce: a written input that requires grad (leaf) or is
        an inference tensor, one whose elements overlap each other, and two
        inputs sharing memory where either is written or donated."""
        for index in self._written_in_place:
            value = inputs[index]
            if not isinstance(value, torch.Tensor):
                continue
            if value.requires_grad and value.is_leaf and torch.is_grad_enabled():
                raise ExecutionError(
                    f"input '{self._names[index]}' is a leaf tensor that requires grad and the program writes "
                    "to it in place (eager PyTorch refuses this too); pass x.detach() or call under "
                    "torch.no_grad()"
                )
            if value.is_inference() and not torch.is_inference_mode_enabled():
                raise ExecutionError(
                    f"input '{self._names[index]}' is an inference tensor and the program writes to it in "
                    "place outside inference mode (eager PyTorch refuses this too)"
                )
            strides = value.stride()
            if 0 in strides and any(stride == 0 and size > 1 for size, stride in zip(value.shape, strides)):
                raise ExecutionError(
                    f"input '{self._names[index]}' has elements that share memory (an expanded tensor) and "
                    "the program writes to it in place (eager PyTorch refuses this too); pass a clone"
                )
        nbytes = self._input_nbytes
        for first, second in self._write_pairs:
            if _share_memory(inputs[first], inputs[second], nbytes[first], nbytes[second]):
                writer = first if first in self._writes else second
                other = second if writer == first else first
                verb = "writes to" if self._mutation_keys[writer] is not None else "donates"
                raise ExecutionError(
                    f"inputs '{self._names[writer]}' and '{self._names[other]}' share memory and the "
                    f"program {verb} '{self._names[writer]}'; XLA cannot reproduce what eager "
                    f"PyTorch would do (one input seeing the other's update); pass separate "
                    f"tensors, e.g. '{self._names[other]}'.clone()"
                )

    def _run(self, inputs: dict[int, Any]) -> Any:
        arrays: list[jax.Array] = []
        bases: dict[int, torch.Tensor] = {}
        backings: dict[int, HostBacking] = {}
        reseatable: set[int] = set()
        donated_slots: dict[int, int] = {}
        for index, state_name in self._arg_plan:
            if state_name is not None:
                array = self._state_array(state_name)
                if index in self._donated_args:
                    if id(array) in donated_slots:
                        raise ExecutionError(
                            f"module state '{state_name}' is the same buffer as "
                            f"'{self._names[donated_slots[id(array)]]}' (tied) and the program writes or "
                            "donates it; XLA cannot take one buffer twice as a donor"
                        )
                    donated_slots[id(array)] = index
                arrays.append(array)
                continue
            value = inputs[index]
            if isinstance(value, DeviceTensor):
                if self._placement.spmd:
                    raise ExecutionError(
                        f"input '{self._names[index]}' is a DeviceTensor; a program on a mesh takes "
                        "torch tensors and places them by its shardings"
                    )
                arrays.append(value.array)
                continue
            # Host backings and re-seating are for one CPU device; on a mesh
            # an input is copied into PJRT-owned shards.
            spmd = self._placement.spmd
            aliased = not spmd and (index in self._self_aliased or index in self._donor_aliased)
            backing = _backing_of(value, self._input_nbytes[index]) if aliased else None
            if backing is not None:
                backings[index] = backing
                bases[index] = value
                arrays.append(backing.array)
            else:
                if not spmd and index in self._self_aliased and _can_reseat(value):
                    # Decided before the zero-copy export below adds a
                    # reference to the storage (released asynchronously).
                    reseatable.add(index)
                tensor = _resolved(value)
                tensor = tensor if tensor.is_contiguous() else tensor.contiguous()
                bases[index] = tensor
                arrays.append(
                    self._placement.put(tensor, index) if spmd
                    else torch_to_device(tensor, self.device, owned=False)
                )
        try:
            results = self._loaded.execute_sharded(arrays)
            if self._placement.spmd:
                outputs = self._placement.assemble_outputs(self._loaded, results, self._result_shapes)
            else:
                outputs = [shards[0] for shards in results.disassemble_into_single_device_arrays()]
        except Exception as error:
            raise ExecutionError(f"XLA execution failed: {error}") from None
        self._calls += 1
        produced = dict(zip(self._result_keys, outputs))
        # Drop the zero-copy imports of caller tensors: they hold a reference
        # to the caller's storage, which would block re-seating it.
        kept = {
            index: array for index, array in enumerate(arrays)
            if self._arg_plan[index][1] is not None or not isinstance(inputs.get(index), torch.Tensor)
        }
        arrays.clear()
        del results
        call_name = f"in call {self._calls}"
        # Commit: nothing below can fail on valid inputs (checked above).
        for index in self._donated_args:
            state_name = self._arg_plan[index][1]
            if state_name is not None:
                slot = self._slots[state_name]
                if self._mutation_keys[index] is None and kept[index].is_deleted():
                    slot.array = None
                    slot.consumed_by = call_name
            elif isinstance(inputs[index], DeviceTensor) and self._mutation_keys[index] is None:
                inputs[index]._consume(call_name)
        arg_tensors: dict[int, Any] = {}
        for index, state_name in self._arg_plan:
            mutation_key = self._mutation_keys[index]
            new_value = produced.get(mutation_key) if mutation_key is not None else None
            if state_name is not None:
                if new_value is not None:
                    slot = self._slots[state_name]
                    slot.array = self._commit(state_name, kept[index], new_value)
                    slot.consumed_by = None
                continue
            value = inputs[index]
            if index in self._donor_aliased and index in backings and backings[index].array.is_deleted():
                # XLA wrote the aliased output into the donated buffer: that
                # output now owns the memory the consumed tensor still shows.
                backings[index].rebind(produced[self._donor_aliased[index]])
            if isinstance(value, DeviceTensor):
                if new_value is not None:
                    value._rebind(self._commit(None, kept[index], new_value))
                continue
            if new_value is None:
                arg_tensors[index] = _view_base(value, bases[index])
                continue
            self._update_caller_tensor(index, value, new_value, backings.get(index), index in reseatable)
            # Views of the new value share the caller's tensor, as in eager
            # (whatever its strides: _assemble_outputs); one with a lazy bit
            # holds other values than its storage, so they view the new value.
            view_base = _view_base(value, None)
            arg_tensors[index] = view_base if view_base is not None else array_to_torch(new_value)
        return self._assemble_outputs(inputs, arg_tensors, produced)

    def _run_planned(self, plan: _CallPlan, inputs: dict[int, Any]) -> Any:
        """:meth:`_run` for one device, driven by ``plan`` (see
        :class:`_CallPlan`): the same steps and guarantees, with the facts of
        the program precomputed and, after the call, work only for the
        arguments that have some.  Inputs were checked by ``__call__``."""
        if not plan.executes:
            self._calls += 1
            views_of: dict[int, Any] = {}
            for step in plan.user_steps:
                value = inputs[step.index]
                if not isinstance(value, DeviceTensor):
                    views_of[step.index] = _view_base(value, _resolved(value))
            return self._assemble_outputs(inputs, views_of, {})
        bases: dict[int, torch.Tensor] = {}
        backings: dict[int, HostBacking] = {}
        reseatable: set[int] = set()
        user_arrays: list[jax.Array] = []
        for step in plan.user_steps:
            value = inputs[step.index]
            if isinstance(value, DeviceTensor):
                user_arrays.append(value.array)
                continue
            if (
                step.read_only and plan.host_results
                and value.is_contiguous() and not value.is_conj() and not value.is_neg()
            ):
                # The common read-only input: imported as it is (the import
                # of the last call reused while it is the same tensor).
                bases[step.index] = value
                user_arrays.append(self._import_input(step.index, value))
                continue
            if step.in_place is not None:
                backing = _backing_of(value, self._input_nbytes[step.index])
                if backing is not None:
                    backings[step.index] = backing
                    bases[step.index] = value
                    user_arrays.append(backing.array)
                    continue
                if step.reseat and _can_reseat(value):
                    # Decided before the zero-copy export below adds a
                    # reference to the storage (released asynchronously).
                    reseatable.add(step.index)
            tensor = _resolved(value)
            tensor = tensor if tensor.is_contiguous() else tensor.contiguous()
            bases[step.index] = tensor
            user_arrays.append(torch_to_device(tensor, self.device, owned=False))
        arrays = plan.arguments(self, user_arrays)
        del user_arrays
        if len(plan.donated_state) > 1:
            # A tie takes two donors; a consumed donor fails in the
            # dispatch below, whose error path names it.
            self._check_donated_state(plan)
        try:
            outputs = plan.dispatch.run(arrays)
            # Zero-copy imports of caller tensors are read until the program
            # ends: return only then (the caller may write them next).
            plan.dispatch.wait(outputs)
        except Exception as error:
            self._execution_failed(plan, error)
        self._calls += 1
        # The arrays of state and DeviceTensors that commit reads; dropping
        # the list drops the zero-copy imports of caller tensors (they hold
        # a reference to the caller's storage, which would block re-seating).
        kept: dict[int, Any] = {step.index: arrays[step.index] for step in plan.kept}
        del arrays
        return self._finish_planned(plan, inputs, bases, backings, reseatable, kept, outputs)

    def _execution_failed(self, plan: _CallPlan, error: Exception) -> NoReturn:
        """Raise the error of a planned call whose execution failed
        (:class:`DonatedBufferError` naming a consumed state buffer, else
        :class:`ExecutionError`).  Nothing was committed."""
        for step in plan.steps:
            if step.slot is not None:
                self._state_array(step.name)  # a consumed state buffer, in words
        raise ExecutionError(f"XLA execution failed: {error}") from None

    def _finish_planned(
        self, plan: _CallPlan, inputs: dict[int, Any], bases: dict[int, torch.Tensor],
        backings: dict[int, HostBacking], reseatable: set[int], kept: dict[int, Any], outputs: Sequence[jax.Array],
    ) -> Any:
        """The commit and outputs of a planned call that ran (``outputs``,
        ready; ``_calls`` counts it): ``bases`` are the caller tensors (or
        their resolved copies) the arguments were made from, ``backings``
        the runtime buffers passed for inputs they back, ``reseatable`` the
        inputs that may move onto their new buffer, ``kept`` the pre-call
        arrays of :attr:`_CallPlan.kept`.  Also the native call path's
        (``_lane``) for a call whose results are not the usual ones."""
        moved: set[int] | frozenset[int] = _NOTHING
        for index, lent in backings.items():
            if lent.array.is_deleted() and (
                outputs[plan.steps[index].in_place].unsafe_buffer_pointer() != lent.address  # type: ignore[index]
            ):
                moved = self._check_in_place(plan, inputs, backings, outputs)
                break
        # Commit: nothing below can fail on valid inputs (checked above).
        if plan.consumed:
            call_name = f"in call {self._calls}"
            for step in plan.consumed:
                value = inputs.get(step.index)
                if step.slot is not None:
                    if kept[step.index].is_deleted():
                        step.slot.array = None
                        step.slot.consumed_by = call_name
                elif isinstance(value, DeviceTensor):
                    value._consume(call_name)
        arg_tensors: dict[int, Any] = {}
        for step in plan.after:
            new_value = outputs[step.mutated] if step.mutated is not None else None
            if step.slot is not None:
                if new_value is not None:
                    step.slot.array = self._commit(step.name, kept[step.index], new_value)
                    step.slot.consumed_by = None
                continue
            value = inputs[step.index]
            backing = backings.get(step.index)
            written_in_place = False
            if backing is not None and step.index not in moved and backing.array.is_deleted():
                # XLA wrote the aliased result into the donated buffer (its
                # address was checked above; it is ready): that result now
                # owns the memory the caller's tensor shows.
                backing.array = outputs[step.in_place]  # type: ignore[index]
                written_in_place = True
            if isinstance(value, DeviceTensor):
                if new_value is not None:
                    value._rebind(self._commit(None, kept[step.index], new_value))
                continue
            if new_value is None:
                continue
            if not written_in_place and step.index not in moved:
                self._update_caller_tensor(step.index, value, new_value, backing, step.index in reseatable)
            if not plan.direct_outputs:
                # Views of the new value share the caller's tensor, as in
                # eager (whatever its strides: _assemble_outputs); one with a
                # lazy bit holds other values than its storage, so they view
                # the new value.
                view_base = _view_base(value, None)
                arg_tensors[step.index] = view_base if view_base is not None else array_to_torch(new_value)
        if plan.direct_outputs:
            if plan.host_results:
                flat = [_host_result(outputs[result.position], result) for result in plan.outputs]
            else:
                flat = [array_to_torch(outputs[result.position]) for result in plan.outputs]
            if self._flat_outputs:
                return flat[0] if self._single_output else tuple(flat)
            return pytree.tree_unflatten(flat, self._signature.out_spec)
        for step in plan.user_steps:
            if step.index not in arg_tensors and step.index in bases:
                arg_tensors[step.index] = _view_base(inputs[step.index], bases[step.index])
        return self._assemble_outputs(inputs, arg_tensors, dict(zip(self._result_keys, outputs)))

    def _input_views(self, recipes: tuple[tuple[int, _Rebuild], ...], inputs: dict[int, Any]) -> Any:
        """The outputs of a program that is not run and returns only user
        inputs and same-dtype views of them (``_CallPlan.input_views``), as
        the general assembly makes them for plain row-major tensors without
        grad or lazy bits: the input itself, or ``as_strided`` on it.  None
        (nothing done) for any other input: the caller takes the general
        path."""
        flat = []
        for index, rebuild in recipes:
            value = inputs[index]
            if (
                type(value) is not torch.Tensor or value.requires_grad or value.is_conj() or value.is_neg()
                or not value.is_contiguous()
            ):
                return None
            flat.append(value if rebuild.identity else value.as_strided(
                rebuild.sizes, rebuild.strides, value.storage_offset() + rebuild.offset
            ))
        if self._flat_outputs:
            return flat[0] if self._single_output else tuple(flat)
        return pytree.tree_unflatten(flat, self._signature.out_spec)

    def _import_input(self, index: int, tensor: torch.Tensor) -> jax.Array:
        """The CPU device's zero-copy view of read-only input ``tensor``
        (contiguous, no lazy bits).  The import of the previous call is
        reused while it is the same tensor object at the same address: the
        import *is* that memory (no copy), so it always shows the tensor's
        current data, however it was written (``.numpy()`` writes bump no
        version counter), and it keeps the memory it views alive.  Shape and
        dtype were checked, so the same address means the same bytes.  The
        entry goes when the tensor does (or a new tensor is passed); only
        read-only inputs are imported this way, so it never stands in the way
        of re-seating a written one, nor is it ever donated."""
        found = self._imports.get(index)
        address = tensor.data_ptr()
        if found is not None and found[0]() is tensor and found[1] == address:
            return found[2]
        # Exported from a new tensor over the same storage: an export of
        # ``tensor`` itself would keep its Python object alive (torch
        # preserves it while its C++ tensor is referenced), so the entry
        # would never go.
        array = torch_to_device(tensor.detach(), self.device, owned=False)
        if array.unsafe_buffer_pointer() == address:  # zero-copy: safe to reuse
            reference = weakref.ref(tensor, functools.partial(_forget_import, self._imports, index))
            self._imports[index] = (reference, address, array)
        return array

    def _check_donated_state(self, plan: _CallPlan) -> None:
        """DonatedBufferError for a donated state buffer already consumed,
        ExecutionError for one buffer taken twice as a donor (tied state).
        Other state is not checked here: a consumed buffer is None in the
        argument list or a deleted array, which PJRT refuses before running
        anything, and the error path of the call names it."""
        donors: dict[int, int] = {}
        for step in plan.donated_state:
            array = self._slot_array(step.name)  # the buffer itself: no copy in another form
            if id(array) in donors:
                raise ExecutionError(
                    f"module state '{step.name}' is the same buffer as "
                    f"'{self._names[donors[id(array)]]}' (tied) and the program writes or "
                    "donates it; XLA cannot take one buffer twice as a donor"
                )
            donors[id(array)] = step.index

    def _check_in_place(
        self, plan: _CallPlan, inputs: dict[int, Any], backings: dict[int, HostBacking],
        outputs: Sequence[jax.Array],
    ) -> set[int] | frozenset[int]:
        """Check that XLA wrote each donated runtime buffer's aliased result
        in place (the runtime relies on it: the caller's tensor shows that
        memory).  PJRT does so whenever it takes a donation; if it ever did
        not, the donated memory is released under the tensor, so the tensor
        is moved onto the result (correct when nothing else views its
        storage); with other views, ExecutionError: they show released memory.
        Returns the inputs so moved (they hold their new value)."""
        moved: set[int] = set()
        for index, backing in backings.items():
            if not backing.array.is_deleted():
                continue  # not donated: XLA wrote elsewhere and commit copies back
            step = plan.steps[index]
            assert step.in_place is not None
            result = outputs[step.in_place]
            if result.unsafe_buffer_pointer() == backing.address:
                continue
            value = inputs[index]
            alone = _can_reseat(value)
            tensor, fresh = host_backed_tensor(result, value.dtype, tuple(value.shape), backing.nbytes)
            with torch.no_grad():
                value.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
            _register_backing(fresh)
            moved.add(index)
            if not alone:
                raise ExecutionError(
                    f"XLA wrote the new value of input '{step.name}' to a new buffer instead of into its "
                    "donated buffer; the tensor now holds it, but other views of its old memory are invalid"
                )
        return moved

    def _update_caller_tensor(
        self, index: int, value: torch.Tensor, new_value: jax.Array, backing: HostBacking | None,
        reseatable: bool,
    ) -> None:
        """Give the caller's tensor its new value, as cheaply as is correct:
        nothing to do when XLA wrote it in place (it is backed by a runtime
        buffer that was donated); re-seat it onto the new buffer when nothing
        else views its storage (no copy; later calls then update in place);
        else copy the new value back (counted in ``host_copies``)."""
        if backing is not None:
            if backing.array.is_deleted() and backing.rebind(new_value):
                return
            if not backing.array.is_deleted():
                with torch.no_grad():
                    value.copy_(array_to_torch(new_value))
                self._count_copy(self._names[index])
                return
            # Donated but written elsewhere (never for an input aliased to
            # its own result): the tensor moves to the new buffer.
        if reseatable and _writable_on_host(new_value):
            tensor, fresh = host_backed_tensor(new_value, value.dtype, tuple(value.shape))
            with torch.no_grad():
                value.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
            _register_backing(fresh)
            return
        with torch.no_grad():
            value.copy_(array_to_torch(new_value))
        self._count_copy(self._names[index])

    def _count_copy(self, name: str) -> None:
        self.host_copies[name] = self.host_copies.get(name, 0) + 1

    def _commit(self, state_name: str | None, old: jax.Array, new: jax.Array) -> jax.Array:
        """The buffer that holds an updated argument after a call.  When XLA
        wrote in place (the old buffer was donated) that is ``new``; when the
        old buffer is still alive (a torch view of it is held, or it was not
        aliased) the new value is copied into it on the host so that every
        view of it stays live, as eager's would."""
        if old.is_deleted() or not _writable_on_host(old):
            return new
        array_to_torch(old).copy_(array_to_torch(new))
        if state_name is not None:
            self._count_copy(state_name)
        return old

    def _assemble_outputs(
        self, inputs: dict[int, Any], arg_tensors: dict[int, Any], produced: dict[str, jax.Array]
    ) -> Any:
        torch_results: dict[str, Any] = {}

        def base_tensor(key: str) -> Any:
            kind, index = self._rebuild_bases[key]
            if kind == "output":
                return result(key)
            state_name = self._arg_plan[index][1]
            if state_name is not None:
                return array_to_torch(self._state_array(state_name))
            value = inputs[index]
            return value.to_torch() if isinstance(value, DeviceTensor) else arg_tensors[index]

        def result(key: str) -> Any:
            if key in torch_results:
                return torch_results[key]
            if key in produced:
                value = _result_tensor(produced[key])
            elif key in self._constant_outputs:
                value = self._constant_outputs[key]
            else:
                rebuild = self._rebuilds[key]
                if rebuild.base is None:
                    value = None
                else:
                    base = base_tensor(rebuild.base)
                    same = rebuild.identity and base.dtype == rebuild.dtype
                    value = base if same else _view_of(base, rebuild)
                    if value.requires_grad:
                        # Compiled results never carry autograd history:
                        # a pass-through of a grad input is its detach().
                        value = value.detach()
            torch_results[key] = value
            return value

        flat = [result(key) for key in self._output_keys]
        if self._flat_outputs:
            return flat[0] if self._single_output else tuple(flat)
        return pytree.tree_unflatten(flat, self._signature.out_spec)

    def _state_array(self, name: str) -> jax.Array:
        """State ``name``'s buffer in the layout this program reads.  When
        another executable of the module stored it differently, a copy in
        this program's layout (counted in ``host_copies``)."""
        array = self._slot_array(name)
        slot = self._slots[name]
        wanted = self._stored_layouts.get(name)
        wanted_bits = self._stored_bits.get(name)
        if slot.layout == wanted and slot.bits == wanted_bits:
            return array
        self._count_copy(name)
        return slot.array_in(array, wanted, wanted_bits)

    def _slot_array(self, name: str) -> jax.Array:
        """State ``name``'s buffer, in the slot's layout."""
        slot = self._slots[name]
        array = slot.array
        if array is None or array.is_deleted():
            raise DonatedBufferError(
                f"module state '{name}' was donated {slot.consumed_by or 'earlier'} "
                "and its buffer has been consumed; load_state_dict() to set it again"
            )
        return array

    def _check_input(self, index: int, value: Any) -> None:
        expected_shape, expected_dtype = self._arg_types[index]
        if (
            isinstance(value, torch.Tensor) and value.dtype == expected_dtype and value.shape == expected_shape
            and value.is_cpu and value.layout is torch.strided
        ):
            return
        name = self._names[index]
        if isinstance(value, DeviceTensor):
            if value.dtype == expected_dtype and value.shape == expected_shape:
                value.array  # DonatedBufferError now, before anything runs
                return
            shape, dtype = tuple(value.shape), value.dtype
        elif isinstance(value, torch.Tensor):
            shape, dtype = tuple(value.shape), value.dtype
            if value.device.type != "cpu":
                raise ExecutionError(
                    f"input '{name}' is on device '{value.device}'; pass a CPU tensor or a DeviceTensor"
                )
            if value.layout is not torch.strided:
                raise ExecutionError(f"input '{name}' has layout {value.layout}; only dense tensors are supported")
        else:
            raise ExecutionError(f"input '{name}' is {type(value).__name__}, expected a torch.Tensor or DeviceTensor")
        if shape != expected_shape or dtype != expected_dtype:
            raise ExecutionError(
                f"input '{name}' is {dtype} {list(shape)}, but the program was compiled for "
                f"{expected_dtype} {list(expected_shape)}; compile again for the new signature"
            )


_NO_LOCK = contextlib.nullcontext()  # reusable: it holds nothing
_NOTHING: frozenset[int] = frozenset()
#: Runtime buffers lent to torch, by address: weak references, so an entry
#: never keeps a buffer alive.  A dead entry is harmless (lookups check the
#: referent) and is replaced when its address is reused, which the
#: allocator does all the time; the dead ones left are swept once the table
#: has doubled since the last sweep, so it stays proportional to the live
#: buffers at O(1) amortized cost per registration.  (A callback per entry
#: would do the same work on every result's release: one is made per CPU
#: result of every call.)
_BACKINGS: dict[int, "weakref.ref[HostBacking]"] = {}
_BACKINGS_SWEEP_AT = [64]


def _register_backing(backing: HostBacking) -> None:
    """Index ``backing`` by address (see ``_BACKINGS``)."""
    _BACKINGS[backing.address] = weakref.ref(backing)
    if len(_BACKINGS) >= _BACKINGS_SWEEP_AT[0]:
        dead = [(address, reference) for address, reference in list(_BACKINGS.items()) if reference() is None]
        for address, reference in dead:
            # Another thread may have registered a live buffer there since.
            if _BACKINGS.get(address) is reference:
                _BACKINGS.pop(address, None)
        _BACKINGS_SWEEP_AT[0] = max(64, 2 * len(_BACKINGS))


def _forget_import(imports: dict[int, Any], index: int, reference: "weakref.ref[torch.Tensor]") -> None:
    """Drop input ``index``'s cached import once its tensor is gone."""
    found = imports.get(index)
    if found is not None and found[0] is reference:
        del imports[index]


def _backing_of(tensor: torch.Tensor, nbytes: int) -> HostBacking | None:
    """The runtime buffer backing all of ``tensor`` (re-seated by an earlier
    call), or None.  ``nbytes`` is ``tensor``'s size in bytes (a checked
    input's, known from the program)."""
    found = _BACKINGS.get(tensor.data_ptr())  # the first element's address
    if found is None or tensor.storage_offset() != 0 or not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg():
        return None
    backing: HostBacking | None = found()
    if backing is None or backing.array.is_deleted():
        return None
    if backing.nbytes != nbytes or backing.nbytes != tensor.untyped_storage().nbytes():
        return None
    return backing


def _host_result(array: jax.Array, result: _ResultStep) -> torch.Tensor:
    """:func:`_result_tensor` of a CPU result the call has waited for, its
    type from the call plan."""
    if result.nbytes == 0:
        return array_to_torch(array)
    tensor, backing = host_backed_tensor(array, result.dtype, result.shape, result.nbytes, ready=True)
    _register_backing(backing)
    return tensor


def _result_tensor(array: jax.Array) -> torch.Tensor:
    """A result for the caller: on CPU a tensor backed by the runtime-owned
    buffer without a DLPack export, so that donating it to a later call
    (``y = exe(y)``) lets XLA reuse the buffer in place."""
    if not _writable_on_host(array) or array.nbytes == 0:
        return array_to_torch(array)
    tensor, backing = host_backed_tensor(array, _torch_dtype_of_jax(array.dtype), tuple(array.shape))
    _register_backing(backing)
    return tensor


def _can_reseat(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` may move to another storage without anyone seeing
    it: it covers its whole storage, and no other tensor (view) or storage
    object shares that storage."""
    storage = tensor.untyped_storage()
    return (
        tensor.storage_offset() == 0 and tensor.is_contiguous() and not tensor.requires_grad
        and tensor._base is None and not tensor.is_conj() and not tensor.is_neg()
        and storage.nbytes() == tensor.numel() * tensor.element_size() and tensor.numel() > 0
        and torch._C._storage_Use_Count(storage._cdata) <= 2  # the tensor and this `storage`
    )


def _writable_on_host(array: jax.Array | None) -> bool:
    """Whether ``array``'s buffer can be written through a zero-copy torch
    view (CPU buffers on one device: DLPack shares their memory; an array
    sharded over several devices has no single host buffer)."""
    return (
        array is not None and not array.is_deleted() and array.platform() == "cpu"
        and len(array.sharding.device_set) == 1
    )


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _byte_span(tensor: torch.Tensor, nbytes: int) -> tuple[int, int]:
    """First and one-past-last byte of ``tensor``'s elements in memory
    (``data_ptr`` is the first element's address, offset included);
    ``nbytes`` is its size in bytes."""
    start = tensor.data_ptr()
    if tensor.is_contiguous():
        return start, start + nbytes
    size = tensor.element_size()
    extent = sum((int(n) - 1) * abs(int(s)) for n, s in zip(tensor.shape, tensor.stride()))
    return start, start + (extent + 1) * size


_EXACT_OVERLAP_LIMIT = 1 << 20


def _share_memory(first: Any, second: Any, first_nbytes: int, second_nbytes: int) -> bool:
    """Whether two inputs have a byte in common (the same DeviceTensor
    twice, or torch tensors whose elements overlap); ``first_nbytes`` and
    ``second_nbytes`` are their sizes in bytes (checked inputs: known from
    the program)."""
    if isinstance(first, DeviceTensor) or isinstance(second, DeviceTensor):
        return first is second
    if first_nbytes == 0 or second_nbytes == 0:
        return False
    a_start, a_end = _byte_span(first, first_nbytes)
    b_start, b_end = _byte_span(second, second_nbytes)
    if a_end <= b_start or b_end <= a_start:
        return False
    if first.numel() > _EXACT_OVERLAP_LIMIT or second.numel() > _EXACT_OVERLAP_LIMIT:
        return True  # ranges overlap: assume the elements do
    return bool(torch.isin(_element_bytes(first), _element_bytes(second)).any())


def _element_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The address of every byte of ``tensor``'s elements."""
    size = tensor.element_size()
    offsets = torch.tensor([tensor.storage_offset()], dtype=torch.int64)
    for n, s in zip(tensor.shape, tensor.stride()):
        offsets = (offsets[:, None] + torch.arange(n, dtype=torch.int64) * s).reshape(-1)
    base = tensor.untyped_storage().data_ptr()
    return (base + offsets[:, None] * size + torch.arange(size, dtype=torch.int64)).reshape(-1)


def _view_base(value: Any, fallback: Any) -> Any:
    """The tensor a rebuilt view of user input ``value`` is a view of: the
    caller's tensor itself, whatever its strides (as in eager), unless it
    carries a lazy conjugate/negative bit (its storage then holds other
    values than it shows): then ``fallback``, the resolved copy."""
    if isinstance(value, torch.Tensor) and not value.is_conj() and not value.is_neg():
        return value
    return fallback


def _view_of(base: torch.Tensor, rebuild: _Rebuild) -> torch.Tensor:
    """The removed result as a view of ``base``.  The recorded geometry is
    in ``base``'s row-major layout; a caller's tensor laid out otherwise
    (``y.t()``, channels-last) gets the view of its own storage that holds
    the same elements (:func:`strided_view_of`; for a view to another
    dtype, of the caller's tensor reinterpreted as eager's ``view(dtype)``
    does), as eager's view does, and only where no strided view holds them
    a view of a row-major copy."""
    if base.is_contiguous():
        return _as_view(base, rebuild)
    caller: torch.Tensor | None = base
    if base.dtype != rebuild.dtype:
        # Eager's ``x.view(dtype)`` reinterprets the caller's own storage: at
        # any strides for a dtype of the same width, and for a narrower one
        # where torch allows it (last dimension contiguous).  The recorded
        # geometry is in the reinterpreted row-major layout.
        assert rebuild.dtype is not None  # only dead results lack one
        try:
            caller = (base.detach() if base.requires_grad else base).view(rebuild.dtype)
        except RuntimeError:
            caller = None
    if caller is not None:
        view = strided_view_of(caller, rebuild.sizes, rebuild.strides, rebuild.offset)
        if view is not None:
            return view
    return _as_view(base.contiguous(), rebuild)


def _as_view(base: torch.Tensor, rebuild: _Rebuild) -> torch.Tensor:
    """The removed result as a view of ``base``'s storage; offset, sizes and
    strides are in elements of the result's dtype (which may differ from
    the base's in width: ``x.view(torch.int8)``)."""
    assert rebuild.dtype is not None  # only dead results lack one
    if base.dtype == rebuild.dtype:
        return base.as_strided(rebuild.sizes, rebuild.strides, base.storage_offset() + rebuild.offset)
    itemsize = _itemsize(rebuild.dtype)
    start = base.storage_offset() * base.element_size()
    if start % itemsize:
        raise ExecutionError(f"cannot rebuild a {rebuild.dtype} view at byte {start} of its base")
    view = torch.empty(0, dtype=rebuild.dtype, device=base.device)
    view.set_(base.untyped_storage(), start // itemsize + rebuild.offset, rebuild.sizes, rebuild.strides)
    return view


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


def _torch_dtype_of_jax(dtype: Any) -> torch.dtype:
    # jax/numpy dtype names (float32, bfloat16, bool, ...) are torch's names.
    torch_dtype = getattr(torch, str(dtype), None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ExecutionError(f"device array dtype {dtype} has no torch dtype")
    return torch_dtype
