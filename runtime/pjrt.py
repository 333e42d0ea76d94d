"""The bridge to XLA through jaxlib's PJRT client.

torch-mlir's MLIR and jaxlib's are separate builds, so a module crosses as
a StableHLO portable artifact serialized for the older of the two StableHLO
versions.  hloalias's own ``hloalias.*`` attributes are host-side metadata
and are stripped before serialization."""

from __future__ import annotations

import dataclasses
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
except ImportError:  # a jaxlib without the extension entries: use the public path
    _dlpack_to_buffer = _buffer_to_dlpack = None
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
        artifact = _stablehlo.serialize_portable_artifact_str(stripped, target_stablehlo_version())
        if options is None:
            options = xla_client.CompileOptions()
        targets = tuple(devices) if devices is not None else (device,)
        device_list = xla_client.DeviceList(targets)
        return disk_cache.load_or_compile(
            stripped, options, device,
            lambda: device.client.compile_and_load(artifact, device_list, options),
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
    types), saves reading it from the array."""

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
