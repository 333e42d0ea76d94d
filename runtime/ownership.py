"""Ownership: the only place torch memory meets PJRT buffers.

Invariant (every other runtime module goes through here to cross):

- A torch tensor may view a runtime (PJRT-owned) buffer only while the
  runtime holds that buffer: the tensor keeps its :class:`HostBacking`
  alive and the backing keeps the buffer's array alive; after XLA wrote a
  donated buffer in place, the backing takes the result (same address) as
  the owner (:meth:`HostBacking.rebind`).
- A buffer is donated only to receive that same tensor's new value (a
  mutated input aliased to itself, module state updated in place); a
  donated torch tensor whose value is *not* its new value is never handed
  to XLA to overwrite, wherever its memory came from: it is imported
  without ownership (:func:`torch_to_device` ``owned=False``), so PJRT
  cannot take it and XLA writes the result elsewhere.
- Anything else is copied (``owned=True``, a copy back into the caller's
  tensor) or refused (two inputs sharing memory where either is written:
  :func:`share_memory`).
- What the runtime itself makes for a call (the random key, a mesh
  input's host copy) never crosses by DLPack: it is copied into PJRT-owned
  buffers through jaxlib's host-buffer path (:func:`host_copy`).  A DLPack
  import is released by whichever thread drops PJRT's last hold of it,
  and after a call that can be PJRT's worker, finishing the execution a
  moment after its results were ready; the release runs torch's deleter,
  which takes the GIL, and a process already finalizing then aborts
  ("terminate called without an active exception").  A caller's tensor
  outlives the call; an import made for the call alone dies with it, so
  its release could fall on the worker at the process's last call.  What
  jaxlib's host-buffer path keeps of the source is a Python reference it
  releases only on a thread that holds the GIL.
- Every zero-copy import (:func:`torch_to_device` ``owned=False``: a
  caller's tensor, or a copy the Python path makes for the call) crosses
  with its release guarded (``_lane.guard_dlpack``, runtime/_lane.cpp): a
  release on a Python thread runs at once (one holding the GIL, or one
  that let it go for a moment while the interpreter is not finalizing,
  as jaxlib does when it deletes an array); one on a thread Python has no
  state for (PJRT's worker) is queued, without touching Python, and run
  by the next import or at exit (:func:`drain_releases`, an ``atexit``
  hook), so torch's deleter never takes the GIL from PJRT's thread.  The
  memory of a temporary released so stays held until then (one call's
  inputs at most, while calls go on).  Without a current build of the
  extension (``_lane`` missing or stale: ``pjrt.native_build``) imports are not guarded and a process
  whose last act is a call on a temporary can still abort at exit
  (``explain()`` says the native path is not built; build it).

Also here: :class:`DeviceTensor` (a PJRT-owned buffer held for the user),
the registry of runtime buffers lent to torch by address (``_BACKINGS``:
how a later call finds the runtime buffer behind a tensor; ``_BITS_BACKINGS``
for integer buffers holding a float tensor's bits, which only a program
that reads that input as bits looks up), result tensors
over runtime buffers, and the checks of what may move (``_can_reseat``)."""

from __future__ import annotations

import atexit
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import torch
import torch.utils.dlpack

from hloalias.errors import DonatedBufferError, ExecutionError
from hloalias.runtime.distributed import gathered_tensor
from hloalias.runtime.jaxlib_private import batched_device_put as _batched_device_put
from hloalias.runtime.jaxlib_private import buffer_to_dlpack as _buffer_to_dlpack
from hloalias.runtime.jaxlib_private import dlpack_to_buffer as _dlpack_to_buffer
from hloalias.runtime.jaxlib_private import host_buffer_semantics as _host_buffer_semantics
from hloalias.runtime.pjrt import device_for, native_build

if TYPE_CHECKING:
    from hloalias.runtime.plan import _ResultStep

# torch's C-level DLPack export (Tensor.__dlpack__ wraps it in Python checks).
_torch_to_dlpack: Any = getattr(torch.utils.dlpack, "to_dlpack")

# The native extension's guard of DLPack releases (module docstring), from
# a build of this runtime's interface only (pjrt.native_build): a stale
# build's guard, as its Lane, is not used.  None where the extension is
# missing or stale: imports are not guarded.
_native = native_build()
_guard_dlpack: Callable[[Any], Any] | None = getattr(_native, "guard_dlpack", None)
_drain_releases: Callable[[], int] | None = getattr(_native, "drain_releases", None)


def drain_releases() -> int:
    """Run the DLPack releases PJRT's threads queued (module docstring);
    how many ran (0 without the extension's guard).  The caller holds the
    GIL, as every Python caller does."""
    return _drain_releases() if _drain_releases is not None else 0


if _drain_releases is not None:
    # Before finalization (atexit runs with the interpreter intact), so a
    # release queued by the last call runs here, on this thread.
    atexit.register(_drain_releases)


def _export(tensor: torch.Tensor) -> Any:
    """torch's DLPack capsule of ``tensor``, its release guarded where the
    extension is built (module docstring)."""
    capsule = _torch_to_dlpack(tensor)
    return capsule if _guard_dlpack is None else _guard_dlpack(capsule)


def torch_to_device(tensor: torch.Tensor, device: Any, *, owned: bool) -> jax.Array:
    """``tensor`` on ``device``.  On a CPU device with ``owned=False`` this is
    zero-copy (DLPack).  ``owned=True`` always copies into a buffer PJRT
    owns, which it can reuse when the array is donated; the copy is
    complete when this returns (:func:`owned_upload`), so the caller may
    write ``tensor`` at once.  ``tensor`` must have
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
                return _dlpack_to_buffer(_export(tensor), device, None)
            except Exception:
                pass
        with jax.enable_x64(True):
            return jax.dlpack.from_dlpack(tensor)
    return owned_upload(tensor, lambda host: jax.device_put(host, device, may_alias=False))


#: How long :func:`owned_upload` waits for PJRT to drop its import of the
#: caller's memory after the copy completed (it does so at once; the bound
#: only keeps a jaxlib that never does from hanging the caller).
RELEASE_WAIT_S = 10.0


def owned_upload(tensor: torch.Tensor, place: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """``place(host)``, where ``host`` is a zero-copy import of ``tensor``'s
    memory and ``place`` copies it into PJRT-owned buffers (a
    ``device_put`` with ``may_alias=False``), *finished*: on return the
    copy has completed and PJRT holds no reference to ``tensor``'s memory.

    PJRT's copies are asynchronous (on CPU, a large one runs on its worker
    thread): without the wait, a caller writing ``tensor`` right after the
    upload returned changed the uploaded value (``to_device(t); t.add_(1)``
    uploaded the incremented values in most runs), and a process exiting
    with a copy in flight could abort in PJRT's teardown.  The copy's
    result being ready is not enough: the worker drops its import of the
    source a moment later, and until it has, torch's storage counts one
    more user (``_can_reseat`` refuses it) and the release runs torch's
    deleter on PJRT's thread, possibly during interpreter exit.  So the
    import is made from a tensor object of its own (``detach``: same
    memory, a fresh TensorImpl), whose use count says when PJRT let go."""
    alias = tensor.cpu().detach()
    # Holders of the TensorImpl (torch's C++ refcount; untyped in torch's stubs).
    use_count: Callable[[], int] = getattr(alias, "_use_count")
    users = use_count()
    # x64 on for this copy only: jax's default would narrow int64/float64,
    # and the program was compiled for the torch dtype.
    with jax.enable_x64(True):
        host = jax.dlpack.from_dlpack(alias)
        array = place(host)
    del host
    array.block_until_ready()
    if use_count() > users:
        deadline = time.monotonic() + RELEASE_WAIT_S
        spins = 0
        while use_count() > users and time.monotonic() < deadline:
            # A yield first (the release follows the copy within
            # microseconds), then short sleeps, never a busy core.
            time.sleep(0 if spins < 64 else 1e-4)
            spins += 1
    return array


def host_copy(host: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """``host`` copied into PJRT-owned buffers placed by ``sharding`` (one
    device, or the shards of a mesh this process drives), x64 dtypes kept;
    the copy is complete on return (nothing of ``host`` is read later).

    Through jaxlib's host-buffer path, never DLPack: what jaxlib keeps of
    ``host`` (a reference to the numpy array, and through its base to the
    torch tensor it may view) goes to its own reference manager, which
    drops it on a thread that holds the GIL, so neither torch's nor numpy's
    deleter ever runs on PJRT's worker (the module docstring).  Each shard
    is its own single-device copy: jaxlib's batched put over several
    devices neither forces a copy (``jax.device_put`` leaves a shard
    aliasing ``host``'s memory, whatever ``may_alias`` says) nor takes the
    copy semantics (``bad_function_call``, jaxlib 0.10.2)."""
    if _batched_device_put is None:
        # A private copy: a sharded device_put may alias a shard onto it.
        with jax.enable_x64(True):
            array = jax.device_put(np.array(host), sharding, may_alias=False)
        array.block_until_ready()
        return array
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        (device,) = sharding.device_set
        return _copy_to(host, sharding, device)
    with jax.enable_x64(True):
        shards = [
            _copy_to(host[index], jax.sharding.SingleDeviceSharding(device), device)
            for device, index in sharding.addressable_devices_indices_map(host.shape).items()
        ]
        return jax.make_array_from_single_device_arrays(host.shape, sharding, shards)


def _copy_to(host: np.ndarray, sharding: jax.sharding.SingleDeviceSharding, device: Any) -> jax.Array:
    """``host`` copied onto ``device`` during the call (``IMMUTABLE_ONLY_DURING_CALL``, forced)."""
    aval = _KEY_AVAL if host.shape == (2,) and host.dtype == np.int64 else _aval(host)
    return _batched_device_put(
        aval, sharding, [host], [device], True, True, _host_buffer_semantics.IMMUTABLE_ONLY_DURING_CALL, True,
    )


def _aval(host: np.ndarray) -> Any:
    # ShapedArray keeps a 64-bit dtype only when made with x64 on (the
    # process's default narrows it).
    with jax.enable_x64(True):
        return jax.core.ShapedArray(host.shape, host.dtype)


#: The random key's abstract value (every call makes one: made once).
_KEY_AVAL = _aval(np.empty(2, dtype=np.int64))


def array_to_torch(array: jax.Array) -> torch.Tensor:
    """A torch tensor for ``array``: zero-copy for CPU arrays on one device,
    a host copy for accelerator arrays (the installed torch is a CPU build)
    and for arrays sharded or replicated over several devices (gathered;
    from other processes too: a collective, :mod:`hloalias.runtime.distributed`).
    Every device-to-torch read of the runtime goes through here; its dtype
    and values are ``array``'s, 64-bit types included (no jax call here
    narrows them, whatever the process's x64 setting)."""
    devices = array.sharding.device_set
    if not array.is_fully_addressable:  # shards in other processes: gathered
        return gathered_tensor(array)
    if len(devices) > 1:
        first = min(devices, key=lambda d: d.id)
        # x64 on: without it jax's resharding copy of a sharded 64-bit
        # array keeps the int64/float64 dtype on the array but fills the
        # buffer with 32-bit values (jax 0.10.2), which DLPack then hands
        # to torch as int32/float32: silently wrong results on a mesh.
        with jax.enable_x64(True):
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
#: The same for runtime buffers of an integer dtype lent to a torch tensor
#: of the same-width float dtype (a user input stored as its bits,
#: ``store-state-as-bits``): kept apart, so that only a program that reads
#: that input as bits finds them (one that reads it in torch's dtype, the
#: native call path included, sees no buffer behind the tensor and imports
#: its memory instead).
_BITS_BACKINGS: dict[int, "weakref.ref[HostBacking]"] = {}
_BITS_BACKINGS_SWEEP_AT = [64]


def _register_backing(backing: HostBacking, bits: bool = False) -> None:
    """Index ``backing`` by address (see ``_BACKINGS``; ``bits``: in ``_BITS_BACKINGS``)."""
    table, sweep_at = (_BITS_BACKINGS, _BITS_BACKINGS_SWEEP_AT) if bits else (_BACKINGS, _BACKINGS_SWEEP_AT)
    table[backing.address] = weakref.ref(backing)
    if len(table) >= sweep_at[0]:
        dead = [(address, reference) for address, reference in list(table.items()) if reference() is None]
        for address, reference in dead:
            # Another thread may have registered a live buffer there since.
            if table.get(address) is reference:
                table.pop(address, None)
        sweep_at[0] = max(64, 2 * len(table))


def _forget_import(imports: dict[int, Any], index: int, reference: "weakref.ref[torch.Tensor]") -> None:
    """Drop input ``index``'s cached import once its tensor is gone."""
    found = imports.get(index)
    if found is not None and found[0] is reference:
        del imports[index]


def _backing_of(tensor: torch.Tensor, nbytes: int, bits: bool = False) -> HostBacking | None:
    """The runtime buffer backing all of ``tensor`` (re-seated by an earlier
    call), or None.  ``nbytes`` is ``tensor``'s size in bytes (a checked
    input's, known from the program); ``bits``: a buffer holding its bits
    in the integer dtype (``_BITS_BACKINGS``), else in its own dtype."""
    found = (_BITS_BACKINGS if bits else _BACKINGS).get(tensor.data_ptr())  # the first element's address
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
    typestr = _TYPESTRS.get(result.dtype)
    if typestr is None:  # no numpy type string (bf16, ...): through bytes
        tensor, backing = host_backed_tensor(array, result.dtype, result.shape, result.nbytes, ready=True)
        _register_backing(backing)
        return tensor
    # host_backed_tensor and _register_backing inline: every CPU result of
    # a Python-path call comes here.
    backing = HostBacking(array, result.nbytes, ready=True)
    address = backing.address
    backing.__array_interface__ = {"data": (address, False), "shape": result.shape, "typestr": typestr, "version": 3}
    tensor = torch.from_numpy(np.asarray(backing))
    _BACKINGS[address] = weakref.ref(backing)
    if len(_BACKINGS) >= _BACKINGS_SWEEP_AT[0]:
        _register_backing(backing)  # sweeps
    return tensor


def _result_tensor(array: jax.Array) -> torch.Tensor:
    """A result for the caller: on CPU a tensor backed by the runtime-owned
    buffer without a DLPack export, so that a later call mutating it in
    place (an input aliased to its own new value) lets XLA write into the
    buffer itself.  (A donated, not mutated, input is never written in
    place: see the module docstring.)"""
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


def _torch_dtype_of_jax(dtype: Any) -> torch.dtype:
    # jax/numpy dtype names (float32, bfloat16, bool, ...) are torch's names.
    torch_dtype = getattr(torch, str(dtype), None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ExecutionError(f"device array dtype {dtype} has no torch dtype")
    return torch_dtype
