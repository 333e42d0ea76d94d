"""Several processes, one program: hloalias on JAX's multi-controller
runtime (``jax.distributed``), as torch_xla's multi-host SPMD runs one
process per host.

Every process runs the same script; :func:`initialize` joins them (the
coordinator address, process count and this process's index, or torchrun's
``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK`` as set by
``python -m hloalias.tools.launch``).  After it, ``jax.devices()`` lists the
devices of every process, a :class:`~hloalias.runtime.sharding.Mesh`
spans them, and a program compiled on it runs in every process at once
(XLA's collectives between processes: gloo on CPU).

What this module decides, in one place:

- the global view of a tensor is the caller's: every process passes the
  same whole tensor, and each process copies only the shards its own
  devices hold onto them (:func:`put_global`); a result or ``state_dict()``
  entry sharded over other processes' devices is gathered from them
  (:func:`gather`, a collective: every process calls it, in the same order,
  as every process calls the program); the one exception is a value that is
  each process's own (the random key), placed on that process's devices
  only (:func:`put_per_process`);
- every process compiles the same program: before XLA compiles, each
  publishes the final module's key and compares the others'
  (:func:`check_same_program`), so a process that diverged is a
  :class:`DistributedError` naming it, not a collective that waits forever;
- figures per device are this process's devices' (:func:`local_devices`).

One process (no :func:`initialize`) is the case every function reduces to:
nothing is published or gathered."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import torch

from hloalias.errors import DistributedError
from hloalias.runtime.jaxlib_private import jax_distributed, xla_bridge

#: torchrun's variables, read by :func:`initialize` when its arguments are
#: not given (the launcher sets them; so do torchrun and SLURM wrappers).
ENV_RANK, ENV_WORLD_SIZE, ENV_ADDR, ENV_PORT = "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"

#: Seconds a process waits for the others to publish their program before
#: the compile fails (a process that crashed or compiles something else).
AGREEMENT_TIMEOUT_S = 120

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"initialized": False}
_COMPILES = itertools.count()


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: int = 300,
) -> None:
    """Join this process to the others of the run (``jax.distributed``),
    with CPU collectives across processes (gloo).  Must run before anything
    uses a jax device (compiles included).  Arguments not given come from
    ``MASTER_ADDR``:``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK``.  Raises
    :class:`DistributedError` when called twice, after jax started, or
    without the settings."""
    with _LOCK:
        if _STATE["initialized"] or jax.distributed.is_initialized():
            raise DistributedError(
                "hloalias.distributed.initialize() was already called in this process; call it once, "
                "at the start of the script"
            )
        address = coordinator_address or _env_address()
        count = num_processes if num_processes is not None else _env_int(ENV_WORLD_SIZE)
        index = process_id if process_id is not None else _env_int(ENV_RANK)
        missing = [
            what for what, value in (
                (f"coordinator_address (or {ENV_ADDR} and {ENV_PORT})", address),
                (f"num_processes (or {ENV_WORLD_SIZE})", count),
                (f"process_id (or {ENV_RANK})", index),
            ) if value is None
        ]
        if missing:
            raise DistributedError(
                "hloalias.distributed.initialize: missing " + ", ".join(missing)
                + "; run the script with `python -m hloalias.tools.launch -n N script.py`"
            )
        assert address is not None and count is not None and index is not None
        if count < 1 or not 0 <= index < count:
            raise DistributedError(
                f"hloalias.distributed.initialize: process_id {index} is not in 0..{count - 1} "
                f"(num_processes {count})"
            )
        if _backends_started():
            raise DistributedError(
                "hloalias.distributed.initialize() must run before anything uses a jax device "
                "(a compile, jax.devices()); call it first in the script"
            )
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        try:
            jax.distributed.initialize(address, count, index, initialization_timeout=timeout_s)
        except (RuntimeError, ValueError) as error:
            raise DistributedError(
                f"hloalias.distributed.initialize: joining {count} processes at {address} as process "
                f"{index} failed: {error}"
            ) from None
        _STATE["initialized"] = True


def _env_address() -> str | None:
    host, port = os.environ.get(ENV_ADDR), os.environ.get(ENV_PORT)
    return f"{host}:{port}" if host and port else None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"environment variable {name}={value!r} is not an integer") from None


def _backends_started() -> bool:
    return bool(xla_bridge.backends_are_initialized())


def is_initialized() -> bool:
    """Whether :func:`initialize` joined this process to others."""
    return bool(_STATE["initialized"])


def process_index() -> int:
    """This process's index (0 without :func:`initialize`)."""
    return int(jax.process_index())


def process_count() -> int:
    """The number of processes of the run (1 without :func:`initialize`)."""
    return int(jax.process_count())


def spans_processes(devices: Sequence[Any]) -> bool:
    """Whether ``devices`` belong to more than one process."""
    return len({d.process_index for d in devices}) > 1


def local_devices(devices: Sequence[Any]) -> list[Any]:
    """The ones of ``devices`` this process drives."""
    here = jax.process_index()
    return [d for d in devices if d.process_index == here]


def _numpy_of(tensor: torch.Tensor) -> np.ndarray:
    """A zero-copy numpy view of a contiguous CPU tensor (bf16 as
    ml_dtypes' bfloat16, which jax reads)."""
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def put_global(tensor: torch.Tensor, sharding: jax.sharding.Sharding) -> jax.Array:
    """``tensor`` (the whole, global value: the same in every process) as a
    global array with ``sharding``: this process copies only the shards of
    its own devices (no transfer between processes)."""
    host = _numpy_of(tensor.detach().contiguous())
    with jax.enable_x64(True):
        return jax.make_array_from_callback(host.shape, sharding, lambda index: np.array(host[index]))


def put_per_process(key: torch.Tensor, sharding: jax.sharding.Sharding, rows: int) -> jax.Array:
    """``key`` (this process's own value, which may differ from the other
    processes') as rows ``i`` of a global ``[rows, *key.shape]`` array split
    one row per device (``sharding``): this process's devices each hold
    ``key``, the others' the other processes' keys."""
    host = _numpy_of(key.detach().contiguous())

    def rows_of(index: tuple[slice, ...]) -> np.ndarray:
        count = len(range(*index[0].indices(rows)))
        return np.ascontiguousarray(np.broadcast_to(host, (count, *host.shape)))

    with jax.enable_x64(True):
        return jax.make_array_from_callback((rows, *host.shape), sharding, rows_of)


def gather(array: jax.Array) -> np.ndarray:
    """The whole value of ``array`` in this process.  Fully replicated: this
    process's own copy; otherwise gathered from every process (a collective:
    every process must call it for the same array)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    if array.sharding.is_fully_replicated:
        return np.asarray(array.addressable_shards[0].data)
    from jax.experimental import multihost_utils

    with jax.enable_x64(True):
        return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def gathered_tensor(array: jax.Array) -> torch.Tensor:
    """:func:`gather` as a torch tensor of its own memory (bf16 included)."""
    value = gather(array)
    if value.dtype.name == "bfloat16":
        return torch.from_numpy(value.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(value.copy())


def check_same_program(key: str, devices: Sequence[Any], what: str = "program") -> None:
    """Before a compile on ``devices`` that span processes: every process
    publishes ``key`` (the final module's) and reads the others'.  A process
    that compiled another program, or none within
    :data:`AGREEMENT_TIMEOUT_S`, is a :class:`DistributedError` naming it.
    Nothing to do on one process's devices."""
    if not spans_processes(devices):
        return
    client = jax_distributed.global_state.client
    if client is None:  # pragma: no cover - devices of several processes imply a client
        return
    serial = next(_COMPILES)
    here = jax.process_index()
    processes = sorted({d.process_index for d in devices})
    client.key_value_set(f"hloalias/compile/{serial}/{here}", key)
    for other in processes:
        if other == here:
            continue
        try:
            theirs = client.blocking_key_value_get(
                f"hloalias/compile/{serial}/{other}", AGREEMENT_TIMEOUT_S * 1000
            )
        except Exception as error:  # the coordination service's timeout or shutdown
            raise DistributedError(
                f"{what} {serial} of process {here}: process {other} did not compile a program on the mesh "
                f"within {AGREEMENT_TIMEOUT_S} s ({str(error).splitlines()[0]}); every process must run the "
                "same compiles in the same order"
            ) from None
        if theirs != key:
            raise DistributedError(
                f"{what} {serial}: process {here} compiled module {key[:16]}, process {other} compiled "
                f"{theirs[:16]}; every process must compile the same program (same model, example "
                "shapes, shardings and options) in the same order"
            )


def barrier(name: str, timeout_s: int = AGREEMENT_TIMEOUT_S) -> None:
    """Wait until every process reached ``name`` (nothing on one process)."""
    if jax.process_count() == 1:
        return
    client = jax_distributed.global_state.client
    assert client is not None
    try:
        client.wait_at_barrier(f"hloalias/{name}", timeout_s * 1000)
    except Exception as error:
        raise DistributedError(
            f"process {jax.process_index()} waited {timeout_s} s at '{name}' for the other processes: "
            f"{str(error).splitlines()[0]}"
        ) from None


def publish(name: str, value: str) -> None:
    """Make ``value`` readable by every process under ``name`` (the
    coordination service's key-value store; once per name; nothing on one
    process).  :func:`receive` reads it."""
    if jax.process_count() == 1:
        return
    client = jax_distributed.global_state.client
    assert client is not None
    client.key_value_set(f"hloalias/{name}", value)


def receive(name: str, timeout_s: int = AGREEMENT_TIMEOUT_S) -> str:
    """The value another process published under ``name``, waiting for it
    up to ``timeout_s`` (then a :class:`DistributedError`: that process
    crashed or does something else)."""
    client = jax_distributed.global_state.client
    assert client is not None
    try:
        return str(client.blocking_key_value_get(f"hloalias/{name}", timeout_s * 1000))
    except Exception as error:  # the coordination service's timeout or shutdown
        raise DistributedError(
            f"process {jax.process_index()} waited {timeout_s} s for '{name}' from another process: "
            f"{str(error).splitlines()[0]}"
        ) from None
