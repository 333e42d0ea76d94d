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

``save`` is all or nothing: the files are written into a new sibling
directory (``.NAME.saving-*``) that is renamed into place once complete,
replacing an existing checkpoint in one step (Linux's ``renameat2``
exchange; elsewhere the earlier one is renamed aside, the new one in, then
the earlier one removed).  A save cut short anywhere (an error, a full
disk, Ctrl-C, a process of the run that could not write its file) leaves
the earlier checkpoint complete and loadable and removes its staging
directory.  A process killed outright (SIGKILL, a lost machine) may leave
one, never a torn checkpoint: the next ``save`` or ``load`` of the
checkpoint removes the staging directories beside it whose owner it can
prove dead (:func:`_clear_dead_staging`: the owning process, named in the
directory's name with its host and start time, is gone from this host),
and puts back an earlier checkpoint a killed two-rename replacement had
renamed aside.  Another live process's, and any another host made, are
left alone.  The directory is the checkpoint's alone: one holding other
files is refused, not replaced.

``save`` and ``load`` are collectives on a multi-process mesh (every process
calls them; ``save`` returns once the checkpoint is in place: process 0
makes the staging directory, which must be shared by every process, and
renames it into place once each process reported its file written).  ``load`` reads
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

import ctypes
import errno
import functools
import hashlib
import itertools
import json
import os
import re
import shutil
import socket
import uuid
from typing import Any

import torch

from hloalias import interrupts
from hloalias.errors import DistributedError, ExecutionError
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
    docstring); every process of the run calls it.  All or nothing: the
    checkpoint is written into a new sibling directory and renamed into
    place whole (an existing one replaced in one step), so a save cut
    short anywhere (an error, a full disk, Ctrl-C) leaves the earlier
    checkpoint complete and removes what it wrote.  ``directory`` is
    replaced as a whole: one holding anything but a checkpoint's files is
    refused (ExecutionError naming the file), never deleted.  What saves
    of ``directory`` killed outright left beside it is cleared first
    (module docstring)."""
    executable = _executable(target)
    if isinstance(target, TrainingStep):
        # Another step of the same model on a mesh may have run since this
        # one: its state is the model's newest (as for train.state_dict()).
        target._read_other_steps_state()
    shown = os.fspath(directory)
    # A link to a checkpoint is saved through: the directory it names is replaced.
    path = os.path.realpath(shown)
    rank, count = distributed.process_index(), distributed.process_count()
    multiprocess = executable._placement.multiprocess
    if not multiprocess:
        rank, count = 0, 1  # a program of this process alone: one file
    shards = local_shards(executable)
    metadata = _metadata(executable, count) if rank == 0 else None
    if not multiprocess:
        _check_target(shown, path)
        _clear_dead_staging(path)
        staging: list[str] = []
        try:
            with interrupts.deferred():  # made and recorded together: never left unremoved
                staging.append(_make_staging(path))
            torch.save(shards, os.path.join(staging[0], "shards-0.pt"))
            _write_metadata(staging[0], metadata)
            with interrupts.deferred():  # the swap and the earlier checkpoint's removal, together
                _remove(_replace(staging[0], path))
                staging.clear()
        except BaseException:
            _remove(*staging)
            raise
        return
    _save_across_processes(shown, path, rank, count, next(_SAVES), shards, metadata)


def _save_across_processes(
    shown: str, path: str, rank: int, count: int, serial: int, shards: dict[str, Any], metadata: dict[str, Any] | None,
) -> None:
    """:func:`save` on a mesh across processes (a shared directory): process
    0 makes the staging directory and names it to the others, each writes
    its file into it and reports, and process 0 renames it into place once
    every file is written (removing it when one is not), then reports the
    outcome, which every process returns or raises."""
    key = f"checkpoint-save-{serial}"
    staging: list[str] = []
    if rank != 0:
        named = distributed.receive(f"{key}/staging")
        if named.startswith(_FAILED):
            raise ExecutionError(f"checkpoint '{shown}': process 0 could not start the save: {named[len(_FAILED):]}")
        reported = False
        try:
            torch.save(shards, os.path.join(named, f"shards-{rank}.pt"))
            distributed.publish(f"{key}/wrote/{rank}", "ok")
            reported = True
        except BaseException as error:
            if not reported:
                distributed.publish(f"{key}/wrote/{rank}", _FAILED + _words(error))
                if isinstance(error, Exception):  # not a Ctrl-C: raised once process 0 cleaned up
                    try:
                        distributed.receive(f"{key}/done")
                    except DistributedError:
                        pass
            raise
        outcome = distributed.receive(f"{key}/done")
        if outcome != "ok":
            raise ExecutionError(f"checkpoint '{shown}' was not saved (the earlier one, if any, is kept): {outcome}")
        return
    try:
        _check_target(shown, path)
        _clear_dead_staging(path)
        with interrupts.deferred():  # made and recorded together: never left unremoved
            staging.append(_make_staging(path))
    except BaseException as error:
        _remove(*staging)
        distributed.publish(f"{key}/staging", _FAILED + _words(error))
        raise
    distributed.publish(f"{key}/staging", staging[0])
    swapped = False
    try:
        torch.save(shards, os.path.join(staging[0], "shards-0.pt"))
        for other in range(1, count):
            wrote = distributed.receive(f"{key}/wrote/{other}")
            if wrote != "ok":
                raise ExecutionError(
                    f"checkpoint '{shown}' was not saved (the earlier one, if any, is kept): process {other} "
                    f"could not write its shard file: {wrote[len(_FAILED):]}"
                )
        _write_metadata(staging[0], metadata)
        with interrupts.deferred():  # the swap and the earlier checkpoint's removal, together
            _remove(_replace(staging[0], path))
            staging.clear()
            swapped = True
    except BaseException as error:
        _remove(*staging)
        distributed.publish(f"{key}/done", "ok" if swapped else f"process 0: {_words(error)}")
        raise
    distributed.publish(f"{key}/done", "ok")


_FAILED = "failed: "


def _words(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0]


def _metadata(executable: Executable, count: int) -> dict[str, Any]:
    tensors = {}
    for name, slot in _unique_state(executable).items():
        shape, dtype = executable._arg_types[executable._names.index(
            executable._signature.state_aliases.get(name, name)
        )]
        tensors[name] = {"shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
    return {"format": FORMAT, "version": VERSION, "process_count": count, "tensors": tensors}


def _write_metadata(directory: str, metadata: dict[str, Any] | None) -> None:
    with open(os.path.join(directory, "metadata.json"), "w") as handle:
        json.dump(metadata, handle, indent=1)


#: The files of a checkpoint directory (and of an earlier format's
#: cut-short writes): what :func:`save` may replace.
_CHECKPOINT_FILE = re.compile(r"(metadata\.json|shards-[0-9]+\.pt)(\.tmp)?")


def _check_target(shown: str, path: str) -> None:
    """ExecutionError naming what keeps ``path`` from being replaced by a
    checkpoint: a file that is not a directory, or a file in it that is
    not a checkpoint's (the user's own, which a save would delete)."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ExecutionError(f"checkpoint.save: '{shown}' exists and is not a directory")
    if not os.path.isdir(path):
        return
    for name in sorted(os.listdir(path)):
        if not _CHECKPOINT_FILE.fullmatch(name):
            raise ExecutionError(
                f"checkpoint.save: '{os.path.join(shown, name)}' is not a file of a checkpoint; a save replaces "
                f"the directory '{shown}' as a whole: save into a directory of its own"
            )


def _sibling(path: str, what: str) -> str:
    """A new name beside ``path`` (the same file system: renames stay
    renames) that names its owner, this process (:func:`_owner`), for
    :func:`_clear_dead_staging`."""
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.{what}-{_owner()}-{uuid.uuid4().hex[:12]}")


@functools.cache
def _host() -> str:
    """Who can judge this process's liveness by its pid: the host's name,
    its boot and its pid namespace (a container on the same machine and
    name has other pids), as 12 hex digits.  A staging directory of
    another host, boot or namespace is never judged dead."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            parts.append(handle.read().strip())
    except OSError:
        parts.append("")
    try:
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        parts.append("")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _owner() -> str:
    """This process as a staging directory's name holds it: host, pid and
    start time (``0`` where the system does not say)."""
    pid = os.getpid()
    return f"{_host()}-{pid}-{_started(pid) or 0}"


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state
    first), or None (no such process, or not Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def _dead(pid: int, started: int) -> bool:
    """Whether process ``pid`` of this host, started at ``started`` (0:
    unknown), is proven gone: no such process, a zombie, or another
    process that took the pid since.  A process of another user is alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: it exists
        return False
    fields = _proc_stat(pid)
    if fields is None:
        return False
    if fields[0] == "Z":  # killed, not yet reaped by its parent
        return True
    return started != 0 and len(fields) > 19 and int(fields[19]) != started


def _clear_dead_staging(path: str) -> None:
    """Remove what saves of ``path`` killed outright left beside it (a
    ``.NAME.saving-*`` staging directory), where the save's process is
    proven dead (:func:`_dead`; one of another host, boot or pid namespace,
    or of a format without its host, is left alone); a ``.NAME.replaced-*``
    directory holding the earlier checkpoint of a two-rename replacement
    killed between its renames is renamed back to ``path`` when nothing
    is there (removed when a checkpoint is).  Housekeeping: what it cannot
    do (a race with another cleaner, a read-only directory) it leaves."""
    parent, base = os.path.split(path)
    try:
        names = os.listdir(parent or ".")
    except OSError:
        return
    pattern = re.compile(
        rf"\.{re.escape(base)}\.(saving|replaced)-([0-9a-f]{{12}})-([0-9]+)-([0-9]+)-[0-9a-f]{{12}}"
    )
    for name in sorted(names):
        found = pattern.fullmatch(name)
        if found is None or found[2] != _host() or not _dead(int(found[3]), int(found[4])):
            continue
        left = os.path.join(parent, name)
        if found[1] == "replaced" and not os.path.lexists(path):
            try:
                os.rename(left, path)  # the earlier checkpoint, back in place
            except OSError:  # never removed while it may be the only one
                pass
            continue
        _remove(left)


def _make_staging(path: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    staging = _sibling(path, "saving")
    os.mkdir(staging)
    return staging


def _replace(staging: str, path: str) -> str | None:
    """Put the complete checkpoint ``staging`` at ``path``; returns the
    directory that now holds the earlier checkpoint (to remove), or None.
    Where the system can (Linux's ``renameat2`` exchange) the two swap in
    one step; elsewhere the earlier one is renamed aside first and put
    back if the second rename fails."""
    if not os.path.lexists(path):
        try:
            os.rename(staging, path)
            return None
        except OSError as error:  # made meanwhile: replaced below
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if _exchange(staging, path):
        return staging
    aside = _sibling(path, "replaced")
    os.rename(path, aside)
    try:
        os.rename(staging, path)
    except BaseException:
        os.rename(aside, path)
        raise
    return aside


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


@functools.cache
def _renameat2() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not glibc >= 2.28: two renames
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _exchange(first: str, second: str) -> bool:
    """Swap two directories in one step; False where the system or file
    system cannot (then nothing changed)."""
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), second)


def _remove(*paths: str | None) -> None:
    """Remove what a save wrote or replaced and no longer needs; a Ctrl-C
    during it finishes the removal before it is raised."""
    for path in paths:
        if path is not None:
            with interrupts.deferred():
                shutil.rmtree(path, ignore_errors=True)


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
    one is missing or mismatched (``load_state_dict``'s checks).  What
    saves of ``directory`` killed outright left beside it is cleared
    first (module docstring): a checkpoint a killed replacement had
    renamed aside is back in place and loads."""
    executable = _executable(target)
    _clear_dead_staging(os.path.realpath(os.fspath(directory)))
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
