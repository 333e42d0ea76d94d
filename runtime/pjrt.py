"""The bridge to XLA through jaxlib's PJRT client.

torch-mlir's MLIR and jaxlib's are separate builds, so a module crosses as
a StableHLO portable artifact serialized for the older of the two StableHLO
versions.  hloalias's own ``hloalias.*`` attributes are host-side metadata
and are stripped before serialization."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.backend as jax_backend
import numpy as np
import torch
import torch.utils.dlpack
from jax._src.lib import xla_client

try:
    from jax._src.lib import _jax as _jaxlib_ext

    _dlpack_to_buffer = getattr(_jaxlib_ext, "dlpack_managed_tensor_to_buffer", None)
    _buffer_to_dlpack = getattr(_jaxlib_ext, "buffer_to_dlpack_managed_tensor", None)
    # jaxlib's C++ dispatch of a loaded executable (SingleDeviceDispatch).
    _jax_pjit: Any = getattr(_jaxlib_ext, "pjit", None)
except ImportError:  # a jaxlib without the extension entries: use the public path
    _dlpack_to_buffer = _buffer_to_dlpack = _jax_pjit = None
try:
    # What that dispatch's entries are built from; private: without them
    # every call takes execute_sharded.
    from jax._src import tree_util as _jax_tree_util
    from jax._src.interpreters import pxla as _jax_pxla

    if not hasattr(_jax_pxla, "MeshExecutableFastpathData"):
        _jax_pjit = None
except ImportError:
    _jax_pjit = None
from jaxlib.mlir.dialects import stablehlo as jaxlib_stablehlo
from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

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

try:  # the wait policy in native code (runtime/_lane.cpp), where it is built
    from hloalias.runtime._lane import Waiter as NativeWaiter
except ImportError:
    NativeWaiter = None  # type: ignore[assignment,misc]

# torch's C-level DLPack export (Tensor.__dlpack__ wraps it in Python checks).
_torch_to_dlpack: Any = getattr(torch.utils.dlpack, "to_dlpack")


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
    jax ``Device`` as is.  Raises ExecutionError when none is present."""
    if device is None:
        device = "cpu"
    if isinstance(device, str):
        try:
            return jax_backend.get_backend(device).local_devices()[0]
        except Exception as error:
            raise ExecutionError(f"no PJRT device for platform '{device}': {error}") from None
    if hasattr(device, "platform") and hasattr(device, "client"):
        return device
    raise ExecutionError(f"cannot use {device!r} as a device")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def target_stablehlo_version() -> str:
    """The StableHLO version both torch-mlir and jaxlib speak."""
    ours = _stablehlo.get_current_version()
    theirs = jaxlib_stablehlo.get_current_version()
    return str(min(ours, theirs, key=_version_tuple))


def prepare_for_xla(module_text: str) -> str:
    """``module_text`` as XLA takes it: without ``hloalias.*`` attributes
    (host-side metadata XLA needs none of), tensor ``arith.constant``s as
    ``stablehlo.constant`` and ``dense_resource`` literals inlined
    (:mod:`hloalias.legalize`)."""
    module = parse_module(module_text, new_context())
    check_static_extents(module)  # XLA aborts the process on these
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


def compile_module(
    module_text: str, device: Any, *, options: Any = None, devices: Any = None
) -> Any:
    """Compile final StableHLO ``module_text`` for ``device`` (or, with SPMD
    ``options``, for ``devices``); return the loaded executable, from the
    persistent cache when it holds the same program for the same devices and
    XLA (:mod:`hloalias.runtime.disk_cache`).  Raises :class:`CompileError`
    (with a repro file)."""
    try:
        stripped = prepare_for_xla(module_text)
        if options is None:
            options = xla_client.CompileOptions()
        targets = tuple(devices) if devices is not None else (device,)
        device_list = xla_client.DeviceList(targets)
        return disk_cache.load_or_compile(
            stripped, options, device,
            lambda: device.client.compile_and_load(  # serialized only for XLA: a cache hit skips it
                _stablehlo.serialize_portable_artifact_str(stripped, target_stablehlo_version()),
                device_list, options),
            lambda payload: device.client.deserialize_executable(payload, device_list, options),
            device_count=len(targets),
        )
    except Exception as error:
        path = write_repro(module_text, "xla-compile")
        raise CompileError(
            f"XLA compile failed: {error}\nmodule written to {path}; replay with:\n"
            f"  hloalias-opt {path} --xla-compile",
            repro_path=path,
        ) from None


def memory_stats(loaded: Any) -> MemoryStats:
    """XLA's compiled memory statistics of ``loaded``."""
    stats = loaded.get_compiled_memory_stats()
    return MemoryStats(
        stats.argument_size_in_bytes,
        stats.output_size_in_bytes,
        stats.alias_size_in_bytes,
        stats.temp_size_in_bytes,
    )


def torch_to_device(tensor: torch.Tensor, device: Any, *, owned: bool) -> jax.Array:
    """``tensor`` on ``device``.  On a CPU device with ``owned=False`` this is
    zero-copy (DLPack).  ``owned=True`` always copies into a buffer PJRT
    owns, which it can reuse when the array is donated.  ``tensor`` must have
    no lazy conjugate/negative bit (DLPack exports the raw memory)."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if not owned and tensor.is_cpu and device.platform == "cpu":
        if _dlpack_to_buffer is not None:
            # jaxlib's direct entry, fed torch's C-level export: ~3x cheaper
            # than jax.dlpack.from_dlpack (which dominates the per-call host
            # overhead otherwise); the checks Tensor.__dlpack__ makes in
            # Python (grad, conjugate bit, layout) are the caller's.
            try:
                return _dlpack_to_buffer(_torch_to_dlpack(tensor), device, None)
            except Exception:
                pass
        with jax.enable_x64(True):
            return jax.dlpack.from_dlpack(tensor)
    # x64 on for this copy only: jax's default would narrow int64/float64,
    # and the program was compiled for the torch dtype.
    with jax.enable_x64(True):
        host = jax.dlpack.from_dlpack(tensor.cpu())
        return jax.device_put(host, device, may_alias=False)


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
    method, as tests substitute)."""

    MAX_MISSES = 8

    __slots__ = ("run", "entry", "wait", "_loaded", "_sharding", "_misses", "_poll")

    def __init__(self, loaded: Any, device: Any, *, fast: bool = True) -> None:
        self._loaded = loaded
        self._misses = 0
        self._poll = True
        #: ``wait(results)``: return once every result is ready (raise a
        #: failed one's error); the policy is :meth:`_wait`'s, in native code
        #: where it is built and not turned off (``native_enabled``).
        self.wait: Callable[[Sequence[jax.Array]], None] = (
            NativeWaiter(READY_SPIN_NS) if NativeWaiter is not None and native_enabled() else self._wait
        )
        self._sharding = jax.sharding.SingleDeviceSharding(device)
        #: ``run(arrays)``: the results of one execution, in order.
        self.run: Callable[[Sequence[jax.Array | None]], Sequence[jax.Array]] = self._execute_sharded
        call = self._fast_call() if fast else None
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
            self._poll = wait_ready(results)
            return
        start = time.perf_counter_ns()
        for result in results:
            result.block_until_ready()
        self._poll = time.perf_counter_ns() - start < READY_SPIN_NS

    def _execute_sharded(self, arrays: Sequence[jax.Array | None]) -> list[jax.Array]:
        results = self._loaded.execute_sharded(list(arrays))
        return [shards[0] for shards in results.disassemble_into_single_device_arrays()]

    def _execute_positional(self, *arrays: Any) -> tuple[jax.Array, ...]:
        return tuple(self._execute_sharded(arrays))

    def _fast_call(self) -> Any:
        if _jax_pjit is None:
            return None
        try:
            # ``fun`` is what jaxlib calls instead under ``jax.disable_jit()``.
            return _jax_pjit(
                "hloalias", self._execute_positional, self._cache_miss, [], [], _jax_pxla.JitGlobalCppCacheKeys(),
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
            self.run = self._execute_sharded
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
    return os.environ.get("HLOALIAS_NATIVE", "1") != "0"


def _refuse_non_array(value: Any, sharding: Any, layout: Any) -> Any:
    """The fast path's conversion of an argument that is not a device
    array: none is made (the runtime passes only device arrays)."""
    raise TypeError(f"not a device array: {type(value).__name__}")


def array_to_torch(array: jax.Array) -> torch.Tensor:
    """A torch tensor for ``array``: zero-copy for CPU arrays on one device,
    a host copy for accelerator arrays (the installed torch is a CPU build)
    and for arrays sharded or replicated over several devices (gathered)."""
    devices = array.sharding.device_set
    if len(devices) > 1:
        first = min(devices, key=lambda d: d.id)
        array = jax.device_put(array, jax.sharding.SingleDeviceSharding(first), may_alias=False)
    if array.platform() == "cpu":
        if _buffer_to_dlpack is not None:
            # jaxlib's direct entry: skips jax's Python-level __dlpack__.
            return torch.utils.dlpack.from_dlpack(_buffer_to_dlpack(array))
        return torch.utils.dlpack.from_dlpack(array)
    return torch.utils.dlpack.from_dlpack(np.asarray(array).copy())


# numpy's array-interface type string of the torch dtypes numpy has: a
# result tensor in one of them is built in one step (others through bytes).
_TYPESTRS: dict[torch.dtype, str] = {
    torch.float64: "<f8", torch.float32: "<f4", torch.float16: "<f2",
    torch.int64: "<i8", torch.int32: "<i4", torch.int16: "<i2", torch.int8: "|i1",
    torch.uint8: "|u1", torch.bool: "|b1", torch.complex64: "<c8", torch.complex128: "<c16",
}


class HostBacking:
    """A PJRT-owned CPU buffer lent to torch *without* a DLPack export, so
    PJRT still sees itself as the buffer's only owner and can donate it
    (XLA then writes the aliased result into the same memory).

    The torch tensor from :meth:`tensor` keeps this object alive (through a
    numpy array whose base it is), and this object keeps the buffer alive:
    after a call donated ``array`` in place, :meth:`rebind` hands ownership
    to the result, which lives at the same address.  Only for buffers
    aliased to their own new value: a donated buffer XLA did not write in
    place is freed under the tensor (the runtime checks the address after
    every such call; see ``Executable``).

    ``nbytes``, when the caller knows it (from the compiled program's
    types), saves reading it from the array.

    The native call path (runtime/_lane.cpp) makes these for its results
    too: it sets the slots ``__init__`` sets (``array``, ``address``,
    ``nbytes``; no interface) and makes the tensor with torch's
    ``from_blob``, whose deleter holds this object as the numpy array
    does here."""

    # One is made per CPU result of every call: slots keep that cheap.
    __slots__ = ("array", "address", "nbytes", "__array_interface__", "__weakref__")

    def __init__(self, array: jax.Array, nbytes: int | None = None, *, ready: bool = False) -> None:
        # Execution and transfers are asynchronous: the raw pointer is only
        # safe to read once the buffer is ready (DLPack would wait too).
        # ``ready``: the caller has already waited for it.
        if not ready:
            array.block_until_ready()
        self.array = array
        self.address = array.unsafe_buffer_pointer()
        self.nbytes = array.nbytes if nbytes is None else nbytes
        self.__array_interface__: dict[str, Any] | None = None

    def _interface(self, shape: tuple[int, ...], typestr: str) -> dict[str, Any]:
        return {"data": (self.address, False), "shape": shape, "typestr": typestr, "version": 3}

    def tensor(self, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A torch tensor over the buffer's memory (no copy), row-major."""
        # numpy reads the interface once, when the array is made; the array
        # (and through it the torch tensor) keeps this object as its base.
        typestr = _TYPESTRS.get(dtype)
        if typestr is not None:
            self.__array_interface__ = self._interface(shape, typestr)
            return torch.from_numpy(np.asarray(self))
        self.__array_interface__ = self._interface((self.nbytes,), "|u1")
        return torch.from_numpy(np.asarray(self)).view(dtype).view(shape)

    def rebind(self, array: jax.Array) -> bool:
        """Take ``array`` as the owner of the memory; False (nothing changed)
        unless it lives at the same address.  ``array`` is the aliased new
        value of this buffer's array, so it has the same type and size."""
        if array.unsafe_buffer_pointer() != self.address:
            return False
        array.block_until_ready()
        self.array = array
        return True


def host_backed_tensor(
    array: jax.Array, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int | None = None, *,
    ready: bool = False,
) -> tuple[torch.Tensor, HostBacking]:
    """A torch tensor backed by the CPU buffer ``array`` (see :class:`HostBacking`);
    ``ready``: the caller has already waited for ``array``."""
    backing = HostBacking(array, nbytes, ready=ready)
    return backing.tensor(dtype, shape), backing
