"""Sharded checkpoints of device state: each process writes the shards its
own devices hold, and a checkpoint loads into any number of processes
(the same mesh, another mesh, or one device).

::

    hloalias.checkpoint.save(train, "ckpt/step-100")    # every process
    hloalias.checkpoint.load(train, "ckpt/step-100")    # every process (any count)

A checkpoint is a directory:

- ``metadata.json`` (written by process 0): the format, the number of
  processes that saved it, and each tensor's global shape and dtype;
- ``shards-K.pt`` (written by process K, ``torch.save``): for each tensor,
  the shards held by process K's devices that are the first copy
  (``replica_id`` 0) of their part, each as ``{"index": [[start, stop],
  ...], "data": tensor}``: every element of every tensor is in exactly one
  file.

``save`` and ``load`` are collectives on a multi-process mesh (every process
calls them; ``save`` returns once every file is written).  ``load`` reads
every shard file and assembles each tensor's global value, then places it
as the program's shardings say (each process keeps its own devices'
shards): a checkpoint loads under any sharding.  What is saved is the
device state of an :class:`~hloalias.runtime.executable.Executable` (module
state by name) or a :class:`~hloalias.runtime.training.TrainingStep`
(parameters, buffers, optimizer state and kept gradients by their slot
names); optimizer hyperparameters (``param_groups``) live in the torch
optimizer and are not part of it.  The global view without files is
``state_dict()`` (gathered)."""

from __future__ import annotations

import glob
import itertools
import json
import os
from typing import Any

import torch

from hloalias.errors import ExecutionError
from hloalias.runtime import distributed
from hloalias.runtime.executable import Executable
from hloalias.runtime.ownership import array_to_torch
from hloalias.runtime.training import TrainingStep

FORMAT = "hloalias-sharded-checkpoint"
VERSION = 1
_SAVES = itertools.count()


def _executable(target: Any) -> Executable:
    if isinstance(target, TrainingStep):
        return target.executable
    if isinstance(target, Executable):
        return target
    raise ExecutionError(
        f"checkpoint: expected an hloalias Executable or TrainingStep, got {type(target).__name__}"
    )


def _unique_state(executable: Executable) -> dict[str, Any]:
    """State name -> slot, one name per buffer (tied names share one)."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    for name, slot in executable._slots.items():
        if id(slot) not in seen:
            seen.add(id(slot))
            found[name] = slot
    return found


def local_shards(target: Any) -> dict[str, list[dict[str, Any]]]:
    """The shards of ``target``'s state this process writes: for each state
    name, ``{"index": [[start, stop], ...], "data": tensor}`` for every
    shard on this process's devices that is the first copy of its part."""
    executable = _executable(target)
    shards: dict[str, list[dict[str, Any]]] = {}
    with executable._group.lock:
        # A tensor torch changed since the last call is the newest value
        # (the next call would read it), as for state_dict().
        executable._sync_from_torch()
        for name, slot in _unique_state(executable).items():
            array = executable._slot_array(name)
            entries: list[dict[str, Any]] = []
            if len(array.sharding.device_set) == 1:
                value = slot.torch_value(array).clone(memory_format=torch.contiguous_format)
                if distributed.process_index() == 0 or not executable._placement.multiprocess:
                    entries.append({"index": [[0, n] for n in value.shape], "data": value})
            else:
                assert slot.layout is None and slot.bits is None  # no stored forms on a mesh
                for shard in array.addressable_shards:
                    if shard.replica_id != 0:
                        continue
                    index = [
                        [s.start or 0, s.stop if s.stop is not None else n]
                        for s, n in zip(shard.index, array.shape)
                    ]
                    entries.append({"index": index, "data": array_to_torch(shard.data).clone()})
            shards[name] = entries
    return shards


def save(target: Any, directory: str | os.PathLike[str]) -> None:
    """Write ``target``'s device state to ``directory`` (see the module
    docstring); every process of the run calls it."""
    executable = _executable(target)
    if isinstance(target, TrainingStep):
        # Another step of the same model on a mesh may have run since this
        # one: its state is the model's newest (as for train.state_dict()).
        target._read_other_steps_state()
    path = os.fspath(directory)
    os.makedirs(path, exist_ok=True)
    rank, count = distributed.process_index(), distributed.process_count()
    if not executable._placement.multiprocess:
        rank, count = 0, 1  # a program of this process alone: one file
    shards = local_shards(executable)
    _atomic_save(shards, os.path.join(path, f"shards-{rank}.pt"))
    if rank == 0:
        for stale in glob.glob(os.path.join(path, "shards-*.pt")):
            if _rank_of(stale) is not None and _rank_of(stale) >= count:  # type: ignore[operator]
                os.remove(stale)
        tensors = {}
        for name, slot in _unique_state(executable).items():
            shape, dtype = executable._arg_types[executable._names.index(
                executable._signature.state_aliases.get(name, name)
            )]
            tensors[name] = {"shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
        metadata = {"format": FORMAT, "version": VERSION, "process_count": count, "tensors": tensors}
        temporary = os.path.join(path, "metadata.json.tmp")
        with open(temporary, "w") as handle:
            json.dump(metadata, handle, indent=1)
        os.replace(temporary, os.path.join(path, "metadata.json"))
    if executable._placement.multiprocess:
        distributed.barrier(f"checkpoint-save-{next(_SAVES)}")


def _atomic_save(value: Any, path: str) -> None:
    temporary = path + ".tmp"
    torch.save(value, temporary)
    os.replace(temporary, path)


def _rank_of(path: str) -> int | None:
    stem = os.path.basename(path).removeprefix("shards-").removesuffix(".pt")
    return int(stem) if stem.isdigit() else None


def read(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The global value of every tensor of the checkpoint in ``directory``
    (assembled from every process's shards).  ExecutionError naming what is
    missing or malformed."""
    path = os.fspath(directory)
    try:
        with open(os.path.join(path, "metadata.json")) as handle:
            metadata = json.load(handle)
    except (OSError, ValueError) as error:
        raise ExecutionError(f"checkpoint '{path}': no readable metadata.json ({error})") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
        raise ExecutionError(f"checkpoint '{path}': metadata.json is not an {FORMAT} version {VERSION}")
    values: dict[str, torch.Tensor] = {}
    filled: dict[str, int] = {}
    for name, entry in metadata["tensors"].items():
        dtype = getattr(torch, entry["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ExecutionError(f"checkpoint '{path}': tensor '{name}' has unknown dtype {entry['dtype']!r}")
        values[name] = torch.empty(entry["shape"], dtype=dtype)
        filled[name] = 0
    for rank in range(int(metadata["process_count"])):
        file = os.path.join(path, f"shards-{rank}.pt")
        if not os.path.exists(file):
            raise ExecutionError(f"checkpoint '{path}': shard file of process {rank} ({file}) is missing")
        shards = torch.load(file, weights_only=True)
        for name, entries in shards.items():
            if name not in values:
                raise ExecutionError(f"checkpoint '{path}': {file} holds '{name}', which metadata.json does not list")
            for shard in entries:
                region = tuple(slice(start, stop) for start, stop in shard["index"])
                target = values[name][region]
                if target.shape != shard["data"].shape:
                    raise ExecutionError(
                        f"checkpoint '{path}': a shard of '{name}' in {file} has shape "
                        f"{list(shard['data'].shape)} for region {shard['index']}"
                    )
                target.copy_(shard["data"])
                filled[name] += target.numel()
    for name, value in values.items():
        if filled[name] != value.numel():
            raise ExecutionError(
                f"checkpoint '{path}': the shards of '{name}' cover {filled[name]} of its {value.numel()} elements"
            )
    return values


def load(target: Any, directory: str | os.PathLike[str]) -> None:
    """Set ``target``'s device state from the checkpoint in ``directory``
    (saved by any number of processes); every process of the run calls it.
    Every state tensor of ``target`` must be in it; nothing changes when
    one is missing or mismatched (``load_state_dict``'s checks)."""
    executable = _executable(target)
    values = read(directory)
    missing = [name for name in _unique_state(executable) if name not in values]
    if missing:
        raise ExecutionError(
            f"checkpoint '{os.fspath(directory)}' has no value for state {', '.join(repr(m) for m in missing)}"
        )
    # A training step records, as part of the load (also when cut short
    # as it returns), that the device holds the checkpoint and the
    # model's and optimizer's own tensors do not: eager code first gets
    # it, or is refused on a mesh across processes.
    executable.load_state_dict(
        {name: values[name] for name in executable._slots if name in values},
        _then=target._host_lags_device if isinstance(target, TrainingStep) else None,
    )
