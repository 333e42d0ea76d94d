"""Compiled programs on disk, found before any import: a compile whose
source key (:mod:`hloalias.runtime.source_key`) was seen before, in this
process or another, gets the final module (after every pass) and its
signature from the disk cache and runs neither ``torch.export`` nor
torch-mlir nor the pass pipeline; the executable then comes from the XLA
entry of the same final module (:mod:`hloalias.runtime.disk_cache`).

An entry (suffix ``.program``, authenticated like every disk cache entry)
holds the final module's text, the pipeline that produced it, the program's
signature and, per state argument, either the attribute path of the
module's tensor (a parameter, buffer or tensor attribute: its current value
is used, as a fresh import would) or the tensor itself (a constant the
import lifted out of the code, e.g. ``torch.tensor([1, 2])`` in forward:
its value is fixed by the code, which is in the key).

A hit is used only when, in this process, each recorded state path still
names a tensor of the recorded shape and dtype, and the pipeline the
compile would run (which depends on state that already has a device buffer
in this process, :func:`hloalias.runtime.executable._pipeline_for`) is the
recorded one; otherwise the compile takes the full path and counts a
``stale`` lookup.  A compile whose key cannot be computed counts as
``uncacheable`` with its reason (:func:`program_cache_stats`).
``HLOALIAS_PROGRAM_CACHE=0`` turns this cache off; ``HLOALIAS_CACHE=0``
turns off every disk cache."""

from __future__ import annotations

import collections
import dataclasses
import io
import pickle
import threading
import warnings
from typing import Any

import torch
import torch.utils._pytree as pytree

from hloalias import config
from hloalias.frontend.importer import Program, Stage, _register_transformers_caches
from hloalias.frontend import torch_internals
from hloalias.frontend.torch_internals import quiet_torch_deprecations
from hloalias.mlir import compile_context, parse_module
from hloalias.runtime import disk_cache
from hloalias.runtime.source_key import Uncacheable, keyed_source

SUFFIX = ".program"
_FORMAT = 2  # 2: signatures carry input_gradient_outputs
#: The disk cache's suffix of the stored preservable-CIA operator set.
CIA_OPS_SUFFIX = ".cia"


#: How many registries' sets are kept (one entry each, ~2.5 KB).
CIA_OPS_ENTRIES = 16


def _cia_ops_name(key: str) -> str:
    """The entry of registry key ``key`` (a hex digest): one per registry,
    so processes whose registries differ (a script that loads an operator
    library and one that does not; other users of the same account) do
    not replace each other's entry on every start."""
    return "cia-ops-" + key[:16]


def _read_cia_ops(key: str) -> bytes | None:
    return disk_cache.read_beside_key(_cia_ops_name(key), key, CIA_OPS_SUFFIX)


def _write_cia_ops(key: str, payload: bytes) -> bool:
    written = disk_cache.write_beside_key(_cia_ops_name(key), key, CIA_OPS_SUFFIX, payload)
    if written:  # (so the folder passed the write's checks)
        # The least recently written go beyond the bound (the single entry of
        # earlier versions, "cia-ops.cia", among them).
        disk_cache.prune_beside_key("cia-ops", CIA_OPS_SUFFIX, CIA_OPS_ENTRIES)
    return written


# torch's walk over every registered operator for the preservable CIA set
# (~5 ms CPU of each process's first import) is kept across processes under
# the operator registry's key (frontend/torch_internals.py), beside the disk
# cache's key: per user, not per cache directory, as the set is not per
# program; one entry per registry, the last CIA_OPS_ENTRIES written kept.
# The frontend layer cannot import the disk cache; it is handed it.
torch_internals.CIA_OPS_STORE[:] = [(_read_cia_ops, _write_cia_ops)]


@dataclasses.dataclass
class ProgramCacheStats:
    """Process-wide counters; ``reasons`` counts why keys could not be made."""

    hits: int = 0
    misses: int = 0
    stale: int = 0  # an entry found but not usable here (see the module docstring)
    uncacheable: int = 0
    stores: int = 0
    reasons: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


_STATS = ProgramCacheStats()
_LOCK = threading.Lock()


def program_cache_stats() -> ProgramCacheStats:
    """The live counters."""
    return _STATS


def enabled() -> bool:
    """False when ``HLOALIAS_PROGRAM_CACHE`` or ``HLOALIAS_CACHE`` is 0/off/false/no."""
    return config.flag("HLOALIAS_PROGRAM_CACHE") and disk_cache.enabled()


@dataclasses.dataclass
class CachedProgram:
    """A hit: the final program (its module parsed in a fresh context, its
    state this process's tensors), the pipeline that made it and its text."""

    program: Program
    pipeline_text: str
    final_text: str


@dataclasses.dataclass(frozen=True)
class Lookup:
    """The outcome of :func:`lookup`: ``key`` (None when uncacheable),
    ``found`` (a hit, not yet checked against the pipeline) and ``status``,
    the line ``explain()`` shows."""

    key: str | None
    found: CachedProgram | None
    status: str
    #: The printing of the program the key holds (:func:`keyed_source`),
    #: for a later key of the same object in this compile; None without a key.
    program_print: Any = None


def lookup(f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any) -> Lookup:
    """The cached final program of compiling ``f`` on ``(args, kwargs)``
    with ``options``, if any.  Never raises for cache trouble."""
    if not enabled():
        return Lookup(None, None, "program cache: off")
    # transformers' cache classes as pytree nodes, as the import would make
    # them: the inputs' structure and the signature's output spec hold them.
    _register_transformers_caches(f)
    try:
        key, program_print = keyed_source(f, args, kwargs, options)
    except Uncacheable as error:
        with _LOCK:
            _STATS.uncacheable += 1
            _STATS.reasons[str(error)] += 1
        return Lookup(None, None, f"program cache: not used, the compile key cannot be computed soundly: {error}")
    payload = disk_cache.read_entry(key, SUFFIX)
    found = None if payload is None else _decode(payload, f)
    with _LOCK:
        if found is None:
            _STATS.misses += 1
    if found is None:
        return Lookup(key, None, f"program cache: miss (key {key[:16]}); imported, lowered and stored", program_print)
    return Lookup(key, found, f"program cache: hit (key {key[:16]}); no torch.export, torch-mlir or passes ran",
                  program_print)


def usable(found: CachedProgram, pipeline_text: str) -> CachedProgram | None:
    """``found`` when ``pipeline_text`` (the pipeline this process would run
    on it) is the recorded one, else None (counted ``stale``)."""
    with _LOCK:
        if found.pipeline_text == pipeline_text:
            _STATS.hits += 1
            return found
        _STATS.stale += 1
    return None


def status_line(result: Lookup | None, used: CachedProgram | None) -> str:
    """The line ``explain()`` shows for a compile that looked up ``result``
    (None: not looked up, a mesh) and used ``used``."""
    if result is None:
        return "program cache: not used (a program on a mesh is imported every time)"
    if result.found is not None and used is None:
        return ("program cache: entry found but not usable in this process (state already on the device "
                "in another layout or dtype, or missing); imported again")
    return result.status


def store(key: str, f: Any, program: Program, pipeline_text: str, final_text: str) -> None:
    """Write the entry of ``key`` (see the module docstring); warns and
    stores nothing when the signature cannot be serialized."""
    recipe: list[tuple[str, str, Any]] = []
    for name, tensor in program.state.items():
        if _resolve(f, name) is tensor:
            recipe.append((name, "path", (tuple(tensor.shape), str(tensor.dtype))))
        else:
            buffer = io.BytesIO()
            torch.save(tensor.detach().clone(), buffer)
            recipe.append((name, "tensor", buffer.getvalue()))
    try:
        buffer = io.BytesIO()
        _EntryPickler(buffer).dump({
            "format": _FORMAT, "signature": program.signature, "state": recipe,
            "pipeline": pipeline_text, "final": final_text,
        })
        payload = buffer.getvalue()
    except Exception as error:  # a static value pickle cannot write
        warnings.warn(f"hloalias program cache: not stored ({error})", disk_cache.CacheWarning, stacklevel=2)
        return
    if disk_cache.write_entry(key, SUFFIX, payload):
        with _LOCK:
            _STATS.stores += 1


class _EntryPickler(pickle.Pickler):
    """Writes pytree leaf specs as a call of ``treespec_leaf``: pickle's
    default (``LeafSpec.__new__``) makes every load warn that ``LeafSpec``
    is deprecated, on every hit, in the user's program."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is pytree.LeafSpec:
            return pytree.treespec_leaf, ()
        return NotImplemented


def _resolve(f: Any, name: str) -> Any:
    """The object at dotted attribute path ``name`` of ``f``, or None."""
    target = f
    for part in name.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target


def _decode(payload: bytes, f: Any) -> CachedProgram | None:
    """The program of an authenticated entry with this process's state
    tensors, or None when the recorded state is not there as recorded."""
    try:
        with quiet_torch_deprecations():  # entries written before _EntryPickler hold LeafSpec.__new__
            entry = pickle.loads(payload)  # authenticated by the user's MAC (disk_cache)
        if entry.get("format") != _FORMAT:
            return None
        state: dict[str, torch.Tensor] = {}
        for name, kind, data in entry["state"]:
            if kind == "path":
                tensor = _resolve(f, name)
                shape, dtype = data
                if not isinstance(tensor, torch.Tensor) or (tuple(tensor.shape), str(tensor.dtype)) != (shape, dtype):
                    return None
            else:
                tensor = torch.load(io.BytesIO(data), weights_only=True)
            state[name] = tensor
        module = parse_module(entry["final"], compile_context())
    except Exception as error:  # an entry of another build, or unreadable
        warnings.warn(f"hloalias program cache: entry not usable ({error}); compiling",
                      disk_cache.CacheWarning, stacklevel=3)
        return None
    return CachedProgram(Program(module, Stage.STABLEHLO, entry["signature"], state), entry["pipeline"], entry["final"])
