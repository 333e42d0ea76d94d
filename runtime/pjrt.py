"""The bridge to XLA through jaxlib's PJRT client.

torch-mlir's MLIR and jaxlib's are separate builds, so a module crosses as
a StableHLO portable artifact serialized for the older of the two StableHLO
versions.  hloalias's own ``hloalias.*`` attributes are host-side metadata
and are stripped before serialization."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.extend.backend as jax_backend
import numpy as np
import torch
import torch.utils.dlpack
from jaxlib.mlir.dialects import stablehlo as jaxlib_stablehlo
from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from hloalias import attributes as A
from hloalias import config, foreign_ir, isolation
from hloalias.errors import CompileError, ExecutionError
from hloalias.legalize import inline_dense_resources, legalize_tensor_constants
from hloalias.mlir import (
    arg_attr_dicts,
    check_static_extents,
    find_main,
    new_context,
    parse_module,
    print_module,
    result_attr_dicts,
    set_arg_attr_dicts,
    set_result_attr_dicts,
)
from hloalias.repro import write_repro
from hloalias.runtime import disk_cache
from hloalias.runtime.jaxlib_private import array_result_handler as _array_result_handler
from hloalias.runtime.jaxlib_private import buffer_to_dlpack as _buffer_to_dlpack
from hloalias.runtime.jaxlib_private import dlpack_to_buffer as _dlpack_to_buffer
from hloalias.runtime.jaxlib_private import pjit as _jax_pjit
from hloalias.runtime.jaxlib_private import pxla as _jax_pxla
from hloalias.runtime.jaxlib_private import tree_util as _jax_tree_util
from hloalias.runtime.jaxlib_private import xla_client

try:  # the native extension (runtime/_lane.cpp), where it is built
    from hloalias.runtime import _lane as _built
except ImportError as _missing:
    _built = None  # type: ignore[assignment]
    config.warn_native_missing(_missing)

#: The interface number of the native extension this runtime uses
#: (runtime/_lane.cpp's ``kAbiVersion``; bump both together): the
#: ``Lane`` runtime/lane.py builds, the per-call checks it hands out, the
#: :class:`NativeWaiter` here and the DLPack release guard of
#: runtime/ownership.py.
LANE_ABI_VERSION = 9


def native_build() -> Any:
    """The built extension (``hloalias.runtime._lane``) where its
    ``ABI_VERSION`` is :data:`LANE_ABI_VERSION`, else None: missing, or a
    stale build (of an older ``_lane.cpp``), whose every part, not just
    the ``Lane``, is left for the Python equivalent (runtime/lane.py's
    ``warn_if_stale`` warns once and ``explain()`` says how to rebuild)."""
    if _built is None or getattr(_built, "ABI_VERSION", None) != LANE_ABI_VERSION:
        return None
    return _built


#: The wait policy in native code (``_lane.Waiter``), where a current build
#: of the extension has it; else None (:meth:`SingleDeviceDispatch._wait`).
NativeWaiter: Any = getattr(native_build(), "Waiter", None)



@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """XLA's compiled memory figures for one executable, in bytes."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int

    @property
    def total_bytes(self) -> int:
        """Device bytes the program needs: argument + output - alias + temp."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def as_dict(self) -> dict[str, int]:
        """The figures including ``total_bytes``."""
        figures = dataclasses.asdict(self)
        figures["total_bytes"] = self.total_bytes
        return figures


def device_for(device: Any = None) -> Any:
    """A PJRT device: ``None`` -> the first CPU device; a platform name
    (``"cpu"``, ``"gpu"``, ``"cuda"``, ``"tpu"``) -> its first device; a
    ``torch.device`` -> its type's platform, device ``index`` (default 0); a
    jax ``Device`` as is.  Raises ExecutionError when none is present."""
    if device is None:
        device = "cpu"
    if isinstance(device, torch.device):
        try:
            found = jax_backend.get_backend(device.type).local_devices()
        except Exception as error:
            raise ExecutionError(f"no PJRT device for {device!r}: {error}") from None
        index = device.index or 0
        if index >= len(found):
            raise ExecutionError(f"no PJRT device for {device!r}: platform '{device.type}' has {len(found)} device(s)")
        return found[index]
    if isinstance(device, str):
        try:
            return jax_backend.get_backend(device).local_devices()[0]
        except Exception as error:
            raise ExecutionError(f"no PJRT device for platform '{device}': {error}") from None
    if hasattr(device, "platform") and hasattr(device, "client"):
        return device
    raise ExecutionError(f"cannot use {device!r} as a device")


class DeferredDevice:
    """The first CPU device, asked for by default (``device=None`` or
    ``"cpu"``) and not looked up yet: looking it up starts jax's backend
    (PJRT plugin discovery, the CPU client), which a program that computes
    nothing never needs (``hloalias.compile``'s view-only programs).
    ``platform`` is known without it; :meth:`resolve` looks the device up
    once (:func:`device_for`), and so does reading any other attribute."""

    __slots__ = ("platform", "_device")

    def __init__(self) -> None:
        self.platform = "cpu"
        self._device: Any = None

    @property
    def resolved(self) -> bool:
        """Whether the device was looked up (jax's backend is up)."""
        return self._device is not None

    def resolve(self) -> Any:
        """The jax device (:func:`device_for` of ``"cpu"``)."""
        if self._device is None:
            self._device = device_for("cpu")
        return self._device

    def __getattr__(self, name: str) -> Any:
        return getattr(self.resolve(), name)

    def __repr__(self) -> str:
        return f"DeferredDevice({self._device!r})" if self._device is not None else "DeferredDevice(cpu, not looked up)"


def requested_device(device: Any = None) -> Any:
    """What ``compile`` targets: a :class:`DeferredDevice` for the default
    CPU device (``None``, ``"cpu"``), else :func:`device_for`'s device."""
    if device is None or (isinstance(device, str) and device == "cpu"):
        return DeferredDevice()
    return device_for(device)


def real_device(device: Any) -> Any:
    """``device`` as a jax device (a :class:`DeferredDevice` looked up)."""
    return device.resolve() if isinstance(device, DeferredDevice) else device


def device_key(device: Any) -> tuple[Any, ...]:
    """What identifies ``device`` in a compile's cache key, without
    looking up a :class:`DeferredDevice`: the default CPU device is
    ``("cpu", -1, "first local device")``, any other its platform, id and
    kind.  The program a compile makes depends on the platform only."""
    if isinstance(device, DeferredDevice):
        return (device.platform, -1, "first local device")
    return (device.platform, device.id, device.device_kind)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def target_stablehlo_version() -> str:
    """The StableHLO version both torch-mlir and jaxlib speak."""
    ours = _stablehlo.get_current_version()
    theirs = jaxlib_stablehlo.get_current_version()
    return str(min(ours, theirs, key=_version_tuple))


def prepare_for_xla(
    module_text: str, *, allow_stored_state: bool = False, context: ir.Context | None = None,
    module: ir.Module | None = None,
) -> str:
    """``module_text`` as XLA takes it: without ``hloalias.*`` attributes
    (host-side metadata XLA needs none of), tensor ``arith.constant``s as
    ``stablehlo.constant`` and ``dense_resource`` literals inlined
    (:mod:`hloalias.legalize`).  A module whose state is in the runtime's
    stored layout (``hloalias.state_form``) is a CompileError unless
    ``allow_stored_state`` (the runtime, which stores that state so).
    The text is parsed in ``context`` when given (the context of the module
    it was printed from: no new context to set up), else in a new one.
    ``module``: the module ``module_text`` was printed from
    (:func:`~hloalias.mlir.print_module`, no debug info: the same text as
    the module parsed from it, so the same result), already verified;
    it is cloned instead of parsing the text (a parse of the whole final
    module, milliseconds for an HF model), and left as it was."""
    prepared: Any  # a Module, or the clone's ModuleOp (the same .operation, .body and .context)
    if module is not None:
        prepared = module.operation.clone()
    else:
        if context is None:
            context = foreign_ir.context_for(module_text)
        elif "chlo." in module_text:
            foreign_ir.load_chlo(context)
        prepared = parse_module(module_text, context)
    module = prepared
    check_static_extents(module.operation)  # XLA aborts the process on these
    module_attributes = module.operation.attributes
    if A.MODULE_STATE_FORM in module_attributes:
        if not allow_stored_state:
            raise CompileError(
                f"the module's {A.MODULE_STATE_FORM} is {module_attributes[A.MODULE_STATE_FORM]}: some state "
                "argument of @main is in hloalias's stored layout (permute-conv-kernel-state), not torch's, "
                "so a caller passing torch's tensors would compute wrong values; compile it without that "
                "pass for other consumers, or pass --allow-stored-state (allow_stored_state=True) if the "
                "caller stores the state that way"
            )
        del module_attributes[A.MODULE_STATE_FORM]
    with module.context:
        main = find_main(module)
        for read, write in (
            (arg_attr_dicts, set_arg_attr_dicts),
            (result_attr_dicts, set_result_attr_dicts),
        ):
            write(main, [_without_host_metadata(attrs) for attrs in read(main)])
        for name in [n for n in main.attributes if n.startswith("hloalias.")]:
            del main.attributes[name]
        legalize_tensor_constants(module)
    text, _ = inline_dense_resources(print_module(module))
    return text


def _without_host_metadata(attrs: dict[str, ir.Attribute]) -> dict[str, ir.Attribute]:
    return {name: value for name, value in attrs.items() if not name.startswith("hloalias.")}


def precision_options(options: Any, excess_precision: bool) -> Any:
    """``options`` (a fresh ``CompileOptions`` when None) set to round
    every low-precision intermediate to its dtype, as eager PyTorch does
    (``excess_precision=False``), or to let XLA keep fused bf16/f16
    intermediates in f32 (True, XLA's default).  The setting is part of
    the options' serialization, so of every cache key."""
    if options is None:
        options = xla_client.CompileOptions()
    overrides = [(k, v) for k, v in options.env_option_overrides if k != "xla_allow_excess_precision"]
    options.env_option_overrides = [*overrides, ("xla_allow_excess_precision", excess_precision)]
    return options


def compile_module(
    module_text: str, device: Any, *, options: Any = None, devices: Any = None, allow_stored_state: bool = False,
    rewrite: Callable[[str, Any], str] | None = None, context: ir.Context | None = None,
    module: ir.Module | None = None,
) -> Any:
    """Compile final StableHLO ``module_text`` for ``device`` (or, with SPMD
    ``options``, for ``devices``); return the loaded executable, from the
    persistent cache when it holds the same program for the same devices and
    XLA (:mod:`hloalias.runtime.disk_cache`).  Raises :class:`CompileError`
    (with a repro file); for a module in the runtime's stored state layout
    unless ``allow_stored_state`` (see :func:`prepare_for_xla`).  ``rewrite``
    (the placement's, for Shardy) rewrites the text XLA gets and may adjust
    ``options`` before either keys the cache.  ``context``: the MLIR context
    of the module ``module_text`` was printed from, to parse it in
    (:func:`prepare_for_xla`) and to parse the prepared text in for the
    portable artifact (:func:`_xla_input`).  ``module``: the module
    ``module_text`` was printed from (no debug info), cloned instead of
    parsing the text (:func:`prepare_for_xla`)."""
    if not allow_stored_state and A.MODULE_STATE_FORM in module_text:
        prepare_for_xla(module_text)  # raises its CompileError, naming the attribute
    try:
        stripped = prepare_for_xla(module_text, allow_stored_state=True, context=context, module=module)
        if "@lapack_" in stripped:
            _initialize_lapack()
        if options is None:
            options = xla_client.CompileOptions()
        if rewrite is not None:
            stripped = rewrite(stripped, options)
        targets = tuple(devices) if devices is not None else (device,)
        device_list = xla_client.DeviceList(targets)
        if len({d.process_index for d in targets}) > 1:
            # Each process's executable drives its own devices: not one
            # cache entry for all (runtime/distributed.py).
            return device.client.compile_and_load(_xla_input(stripped, context), device_list, options)
        return disk_cache.load_or_compile(
            stripped, options, device,
            lambda: _probe_then_compile(device, stripped, device_list, options, len(targets) == 1, context),
            lambda payload: device.client.deserialize_executable(payload, device_list, options),
            device_count=len(targets),
        )
    except CompileError:  # the crash guard's, already naming the crash
        raise
    except Exception as error:
        path = write_repro(module_text, "xla-compile")
        raise CompileError(
            f"XLA compile failed: {error}\nmodule written to {path}; replay with:\n"
            f"  hloalias-opt {path} --xla-compile",
            repro_path=path,
        ) from None


def _initialize_lapack() -> None:
    """jaxlib's LAPACK kernels (the ``lapack_*_ffi`` custom calls of
    linalg lowerings, :mod:`hloalias.frontend.jax_lowerings`) call through
    function pointers that jax fills in when it lowers such an op; a program
    from the disk cache lowers nothing, and its first call would jump
    through a null pointer (a segfault).  Idempotent."""
    from jax._src.lax.linalg import initialize_lapack

    initialize_lapack()


#: The stage the XLA compile probe runs in a child ("module:function").
XLA_PROBE_STAGE = "hloalias.isolation:compile_xla"


def _probe_then_compile(
    device: Any, stripped: str, device_list: Any, options: Any, single_device: bool, context: ir.Context | None = None
) -> Any:
    """XLA's compile; with ``HLOALIAS_ISOLATE_COMPILE`` set (and one CPU
    device) first in a child process (:mod:`hloalias.isolation`), so that
    a crash inside XLA is a :class:`CompileError` and not the end of this
    process (docs/refusals.md).  A failure in the child without a crash is
    left to the compile in process, which reports it as always.
    ``context``: where :func:`_xla_input` parses ``stripped``."""
    if single_device and device.platform == "cpu" and config.flag("HLOALIAS_ISOLATE_COMPILE"):
        payload = isolation.compile_xla_payload(stripped, options.SerializeAsString())
        try:
            isolation.run_isolated(XLA_PROBE_STAGE, payload)
        except isolation.StageFailed:
            pass
        except isolation.StageCrashed as crash:
            path = write_repro(stripped, "xla-crash")
            raise CompileError(
                f"XLA crashed ({crash.signal_name or 'no result'}) compiling the program, in a child process "
                f"(this process is unharmed)\nmodule written to {path}; replay with:\n"
                f"  hloalias-opt {path} --xla-compile\nchild's stderr (tail):\n{crash.stderr_tail[-800:]}",
                repro_path=path,
            ) from None
    return device.client.compile_and_load(_xla_input(stripped, context), device_list, options)


def _xla_input(stripped: str, context: ir.Context | None = None) -> str | bytes:
    """What XLA compiles for ``stripped``, made only when XLA compiles (a
    disk-cache hit skips it): the portable artifact, or the text itself
    for a module with ``chlo`` ops (``compile_stablehlo`` keeps JAX's),
    which have no portable form.

    With ``context`` (the program's, where :func:`prepare_for_xla` parsed
    its text) the artifact is serialized from ``stripped`` parsed there;
    without, ``serialize_portable_artifact_str`` parses it in a context of
    its own, which it creates and loads the StableHLO dialects into for
    each call.  Both parse the same text, so the artifact is the same
    bytes, locations included (``test_contract.py``)."""
    if "chlo." in stripped or "sdy." in stripped:  # jaxlib's dialects: as text
        return stripped
    version = target_stablehlo_version()
    if context is None:
        return _stablehlo.serialize_portable_artifact_str(stripped, version)  # type: ignore[no-any-return]
    # Serializing rewrites the module into VHLO in place: a module of its own.
    return _stablehlo.serialize_portable_artifact(parse_module(stripped, context), version)  # type: ignore[no-any-return]


def memory_stats(loaded: Any) -> MemoryStats:
    """XLA's compiled memory statistics of ``loaded``."""
    stats = loaded.get_compiled_memory_stats()
    return MemoryStats(
        stats.argument_size_in_bytes,
        stats.output_size_in_bytes,
        stats.alias_size_in_bytes,
        stats.temp_size_in_bytes,
    )


class SingleDeviceDispatch:
    """Runs a single-device loaded executable on a list of device arrays
    (:attr:`run`: its results, one array each) and waits for the results
    (:meth:`wait`).

    Through jaxlib's C++ dispatch (the fast path ``jax.jit`` and
    ``jax.stages.Compiled`` calls use) where this jaxlib has it: that path
    matches the arguments' types and placements against the ones of a
    call it has seen and runs the executable without Python, ~3 us less
    per call than ``execute_sharded`` and unpacking its results (KV step,
    same-process A/B: 25.1 -> 22.2 us, ``bench/runtime_notes.md``).  A call it has not seen
    (the first, or arguments of another placement or weak type) runs
    through ``execute_sharded`` here, and its argument and result types
    become a new fast-path entry.  Arguments that are not live device
    arrays (a consumed buffer) fail as ``execute_sharded`` fails: the
    caller names them.  Donation and aliasing are the executable's own
    either way: both paths run the same loaded program.  After
    ``MAX_MISSES`` such calls (a caller alternating placements) it stops
    consulting the fast path and calls ``execute_sharded`` directly.
    ``fast=False``: ``execute_sharded`` always (any ``loaded`` with that
    method, as tests substitute).  So too for a program of ``arguments``
    at least :data:`SHARDED_FROM_ARGUMENTS`: the fast path's cost grows
    with each argument faster than ``execute_sharded``'s (jaxlib queries
    every argument's layout, ``PjRtArray::pjrt_layout``, and checks its
    placement against the entry's), so from about 8 arguments one
    ``execute_sharded`` of the whole list is the cheaper call (same
    process, 7 rounds of 300 calls, load 6: 9 arguments 7.7 against 7.2
    us, 33 arguments 15.2 against 11.4, 601 arguments 234 against 121;
    ``bench/RESULTS-runtime.md``).  ``spin_ns`` is the poll bound of
    :meth:`_wait` (default :data:`READY_SPIN_NS`): a test sets it to 0 (no
    wait is ever in time) or to hours (every wait is), so what it checks
    does not depend on how long the program took on a loaded machine.

    Results are never lost to an interrupt (the transaction of
    ``runtime/execution.py`` rests on it): the interpreter runs a pending
    signal handler (``KeyboardInterrupt``) only at its own checks (a
    Python function's entry and return, after a call from Python
    bytecode), never inside C code calling C code.  So every execute is
    called from C code that stores what it returns before any such check.
    A caller launches the program so: it drops its thread's
    :attr:`unreturned` entry if there is one (an earlier launch
    interrupted), then appends the results to a list of its own from C
    (``ran.extend(itertools.starmap(entry, (arrays,)))``, or
    ``ran.extend(map(run, (arrays,)))`` when :attr:`entry` is None), then
    drops the entry again (``execution.run_planned``; the native lane calls
    :attr:`entry` from C and drops it from C).  :meth:`_execute_sharded`
    (the cache-miss callback's and the slow path's execute) keeps each
    step's value in :attr:`unreturned` under the thread's id until the
    caller has them.  After an exception out of a launch,
    :meth:`ran_results` says whether the program ran, and with which
    results."""

    MAX_MISSES = 8
    #: Programs with at least this many arguments call ``execute_sharded``
    #: directly (see the class's docstring).
    SHARDED_FROM_ARGUMENTS = 8

    __slots__ = ("run", "entry", "wait", "unreturned", "_loaded", "_sharding", "_consume", "_misses", "_poll", "_spin", "__weakref__")

    def __init__(
        self, loaded: Any, device: Any, *, fast: bool = True, spin_ns: int | None = None,
        result_types: Sequence[tuple[tuple[int, ...], torch.dtype | None]] | None = None,
        arguments: int | None = None,
    ) -> None:
        self._loaded = loaded
        self._misses = 0
        self._poll = True
        self._spin = READY_SPIN_NS if spin_ns is None else spin_ns
        #: ``wait(results)``: return once every result is ready (raise a
        #: failed one's error); the policy is :meth:`_wait`'s, in native code
        #: where it is built and not turned off (``native_enabled``).
        # What this object stores of itself goes through a weak proxy: a
        # bound method kept on the instance (or in jaxlib's fast-path
        # function) is a reference cycle, and the dispatch with its loaded
        # program would wait for the cyclic GC once its executable is dropped.
        me = cast("SingleDeviceDispatch", weakref.proxy(self))
        self.wait: Callable[[Sequence[jax.Array]], None] = (
            NativeWaiter(self._spin) if NativeWaiter is not None and native_enabled()
            else functools.partial(SingleDeviceDispatch._wait, me)
        )
        self._sharding = jax.sharding.SingleDeviceSharding(device)
        #: What an execute of :meth:`_execute_sharded` returned and its
        #: caller has not yet received, by thread id (see the class's
        #: docstring); empty between calls.
        self.unreturned: dict[int, Any] = {}
        #: ExecuteResults -> the result arrays: with C++ result handlers
        #: where ``result_types`` (each result's shape and dtype, the
        #: program's own) are known, so no Python runs between the
        #: execute and the stored arrays; else jaxlib's disassembly, which
        #: calls back into Python for each result's sharding.
        self._consume: Callable[[Any], list[Any]] = _result_consumer(loaded, self._sharding, result_types)
        #: ``run(arrays)``: the results of one execution, in order.
        self.run: Callable[[Sequence[jax.Array | None]], Sequence[jax.Array]] = functools.partial(
            SingleDeviceDispatch._execute_sharded, me)
        if arguments is not None and arguments >= self.SHARDED_FROM_ARGUMENTS:
            fast = False
        call = self._fast_call(me) if fast else None
        #: jaxlib's fast-path function, called with the arrays as positional
        #: arguments (what :attr:`run` calls), or None where ``run`` does not
        #: take it: the native call path calls it directly.
        self.entry: Any = call
        if call is not None:
            self.run = lambda arrays: call(*arrays)

    @property
    def polling(self) -> bool:
        """Whether the next :attr:`wait` polls first (see :meth:`_wait`)."""
        wait = self.wait
        return bool(wait.polling) if NativeWaiter is not None and isinstance(wait, NativeWaiter) else self._poll

    def _wait(self, results: Sequence[jax.Array]) -> None:
        """Return once every result is ready (raise a failed one's error).
        Polls first (:func:`wait_ready`) while this program's results have
        come within the poll bound; after one that has not (a longer
        program, which a polling caller would only keep from a core), it
        blocks at once until a call's wait is short again."""
        if self._poll:
            self._poll = wait_ready(results, self._spin)
            return
        start = time.perf_counter_ns()
        for result in results:
            result.block_until_ready()
        self._poll = time.perf_counter_ns() - start < self._spin

    def ran_results(self, ran: Sequence[Sequence[jax.Array]] | None) -> Sequence[jax.Array] | None:
        """After an exception out of a launch (``ran``: its list) or
        out of the native lane's call of :attr:`entry` (None): the results
        of the program if it ran (its execute returned), else None.  The
        thread's :attr:`unreturned` entry is forgotten either way."""
        found = self.unreturned.pop(threading.get_ident(), None) if self.unreturned else None
        if ran:
            return ran[0]
        if found is None:
            return None
        if not isinstance(found, list):  # the execute's results, not made arrays yet
            try:
                found = self._consume(found)
            except Exception:  # noqa: BLE001 - nothing to recover: the caller raises its error
                return None
        return _single_device_arrays(found)

    def _execute_sharded(self, arrays: Sequence[jax.Array | None]) -> list[jax.Array]:
        # Each step's value is stored by C code (zip, map, dict.update) as
        # the call making it returns: no signal check between.
        key = (threading.get_ident(),)
        unreturned = self.unreturned
        unreturned.update(zip(key, map(self._loaded.execute_sharded, (list(arrays),))))
        unreturned.update(zip(key, map(self._consume, (unreturned[key[0]],))))
        return _single_device_arrays(unreturned[key[0]])

    def _execute_positional(self, *arrays: Any) -> tuple[jax.Array, ...]:
        return tuple(self._execute_sharded(arrays))

    def _fast_call(self, me: "SingleDeviceDispatch") -> Any:
        """jaxlib's fast-path function of this program; ``me``: a weak proxy
        of this object, which the function's callbacks hold (``__init__``)."""
        if _jax_pjit is None:
            return None
        try:
            # ``fun`` is what jaxlib calls instead under ``jax.disable_jit()``.
            return _jax_pjit(
                "hloalias", functools.partial(SingleDeviceDispatch._execute_positional, me),
                functools.partial(SingleDeviceDispatch._cache_miss, me), [], [], _jax_pxla.JitGlobalCppCacheKeys(),
                _jax_tree_util.dispatch_registry, _refuse_non_array,
            )
        except Exception:  # another jaxlib's signature: the Python path
            return None

    def _cache_miss(self, *arrays: Any) -> tuple[tuple[jax.Array, ...], Any, bool]:
        """jaxlib's callback for a call its fast path has no entry for:
        (results, the fast-path entry for calls like this one or None,
        False: keep the function's cache)."""
        results = tuple(self._execute_sharded(arrays))
        self._misses += 1
        if self._misses > self.MAX_MISSES:
            self.run = functools.partial(SingleDeviceDispatch._execute_sharded, self)  # self: the proxy
            self.entry = None
            return results, None, False
        if not all(isinstance(result, xla_client.ArrayImpl) for result in results):
            return results, None, False
        _, tree = _jax_tree_util.dispatch_registry.flatten(results, None)
        entry = _jax_pxla.MeshExecutableFastpathData(
            self._loaded, tree, [self._sharding] * len(arrays), [result.sharding for result in results],
            [result.aval for result in results], [result._committed for result in results],
            [True] * len(arrays), [None] * len(arrays), [],
        )
        return results, entry, False


_DISASSEMBLE = operator.methodcaller("disassemble_into_single_device_arrays")

#: numpy's dtype of each torch dtype a result can have (the result handlers' avals).
_NUMPY_DTYPES: dict[torch.dtype, Any] = {
    torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16,
    torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.uint16: np.uint16, torch.uint32: np.uint32, torch.uint64: np.uint64,
    torch.bool: np.bool_, torch.complex64: np.complex64, torch.complex128: np.complex128,
}


def _result_consumer(
    loaded: Any, sharding: Any, result_types: Sequence[tuple[tuple[int, ...], torch.dtype | None]] | None,
) -> Callable[[Any], list[Any]]:
    """``ExecuteResults -> arrays`` for ``loaded`` (see
    ``SingleDeviceDispatch._consume``): ``consume_with_handlers`` with one
    C++ handler per result when every result's type is known and their
    number is the executable's, else jaxlib's disassembly."""
    if result_types is None or _array_result_handler is None:
        return _DISASSEMBLE
    try:
        import ml_dtypes

        numpy_dtypes = {**_NUMPY_DTYPES, torch.bfloat16: ml_dtypes.bfloat16}
        kinds = loaded.get_output_memory_kinds()
        if len(kinds) != 1 or len(kinds[0]) != len(result_types):
            return _DISASSEMBLE
        handlers = []
        for shape, dtype in result_types:
            if dtype not in numpy_dtypes:
                return _DISASSEMBLE
            aval = jax.core.ShapedArray(tuple(shape), numpy_dtypes[dtype])
            # The program's own result types: no check is needed (nor made per call).
            handlers.append(_array_result_handler(aval, sharding, committed=True, _skip_checks=True))
    except Exception:  # noqa: BLE001 - another jaxlib's handlers: its disassembly serves
        return _DISASSEMBLE
    return operator.methodcaller("consume_with_handlers", handlers)


def _single_device_arrays(found: list[Any]) -> list[jax.Array]:
    """The result arrays of a single-device execute, from either form the
    consumer gives (a list of arrays, or of one-shard lists)."""
    if found and isinstance(found[0], list):
        return [shards[0] for shards in found]
    return found

#: How long a wait polls a result before it blocks, in ns.
READY_SPIN_NS = 100_000


def wait_ready(arrays: Sequence[jax.Array], spin_ns: int = READY_SPIN_NS) -> bool:
    """Return once every array in ``arrays`` is ready; raise the error of
    one whose computation failed.  Polls for up to ``spin_ns`` before
    blocking; returns whether the arrays were ready within it.

    ``block_until_ready`` on a result that is not ready yet puts the
    caller to sleep at once, and being woken up when PJRT's worker is done
    costs ~25-100 us on a virtual machine: more than the whole of a small
    program.  Polling keeps the caller awake for the few microseconds such
    a program takes (``bench/runtime_notes.md``)."""
    deadline = 0
    in_time = True
    for array in arrays:
        if in_time and not array.is_ready():
            if not deadline:
                deadline = time.perf_counter_ns() + spin_ns
            while not array.is_ready():
                if time.perf_counter_ns() >= deadline:
                    in_time = False
                    break
        array.block_until_ready()
    # Ready only after the bound (the caller may have been descheduled
    # while it polled) is not in time either.
    return in_time and (not deadline or time.perf_counter_ns() < deadline)


def native_enabled() -> bool:
    """Whether native code may serve calls: ``HLOALIAS_NATIVE=0`` turns it
    off (every call on the Python path), read when an executable is made."""
    return config.flag("HLOALIAS_NATIVE")


def _refuse_non_array(value: Any, sharding: Any, layout: Any) -> Any:
    """The fast path's conversion of an argument that is not a device
    array: none is made (the runtime passes only device arrays)."""
    raise TypeError(f"not a device array: {type(value).__name__}")


