"""Persistent compilation cache: XLA executables on disk, shared by processes.

On by default.  Settings (read at each lookup, so tests and tools may
change them at run time):

- ``HLOALIAS_CACHE_DIR``: the directory (default
  ``$XDG_CACHE_HOME/hloalias/xla`` or ``~/.cache/hloalias/xla``), created
  with mode 0700: a cache entry is loaded code, so the directory must be
  writable by its owner only.
- ``HLOALIAS_CACHE_MAX_BYTES``: size bound (default 2 GiB).  After each
  write the least recently used entries (file modification time, refreshed
  on every hit) are deleted until the directory is within the bound.
- ``HLOALIAS_CACHE=0`` (or ``off``/``false``/``no``): disabled; every
  compile goes to XLA and nothing is read or written.

Key: SHA-256 over the module text XLA receives (hloalias's final module,
so aliasing and donation are part of it), the serialized compile options,
the jax/jaxlib versions, the PJRT client's platform, platform version and
runtime type, the device kind and the number of devices.  An entry is
``MAGIC | key | SHA-256(payload) | payload`` where the payload is PJRT's
executable serialization (``LoadedExecutable.serialize()``); a lookup
checks the magic, that the stored key is the requested one and the
checksum before it hands the bytes to ``deserialize_executable``.  A
missing entry is a miss; an entry that fails any check or does not
deserialize is reported with a :class:`CacheWarning`, removed, and the
program is compiled again.  Writes go to a temporary file in the same
directory and are renamed into place, so concurrent processes see either
no entry or a whole one."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import threading
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jaxlib.version

from hloalias import config

MAGIC = b"HLOALIAS-XLA-EXECUTABLE-1\n"
DEFAULT_MAX_BYTES = 2 * 1024**3
_SUFFIX = ".xla"


class CacheWarning(UserWarning):
    """A disk cache entry could not be used or written (the compile goes on)."""


@dataclasses.dataclass
class DiskCacheStats:
    """Process-wide counters of the disk cache and of XLA compiles."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    rejected: int = 0  # corrupt, foreign or undeserializable entries
    xla_compiles: int = 0  # calls into XLA's compiler (cache or not)


_STATS = DiskCacheStats()
_LOCK = threading.Lock()


def disk_cache_stats() -> DiskCacheStats:
    """The live counters (tests read ``xla_compiles`` to see that a cached
    program never reached XLA)."""
    return _STATS


def enabled() -> bool:
    """False when ``HLOALIAS_CACHE`` is 0/off/false/no."""
    return config.flag("HLOALIAS_CACHE")


def cache_dir() -> str:
    """The cache directory (see the module docstring); not created here."""
    explicit = config.text("HLOALIAS_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hloalias", "xla")


def max_bytes() -> int:
    """The size bound in bytes (``HLOALIAS_CACHE_MAX_BYTES``, default 2 GiB)."""
    return max(0, config.integer("HLOALIAS_CACHE_MAX_BYTES") or 0)


def cache_key(module_text: str, options: Any, device: Any, device_count: int = 1) -> str:
    """The entry key of ``module_text`` compiled with ``options`` for
    ``device`` (the first of ``device_count``; the options hold an SPMD
    program's device assignment)."""
    client = device.client
    digest = hashlib.sha256()
    for part in (
        MAGIC.decode(),
        f"jax={jax.__version__} jaxlib={jaxlib.version.__version__}",
        f"platform={client.platform} version={client.platform_version} runtime={client.runtime_type}",
        f"device_kind={device.device_kind} devices={device_count}",
    ):
        digest.update(part.encode() + b"\0")
    digest.update(options.SerializeAsString() + b"\0")
    digest.update(module_text.encode())
    return digest.hexdigest()


def _entry_path(directory: str, key: str) -> str:
    return os.path.join(directory, key + _SUFFIX)


def load_or_compile(
    module_text: str,
    options: Any,
    device: Any,
    compile_fn: Callable[[], Any],
    deserialize_fn: Callable[[bytes], Any],
    device_count: int = 1,
) -> Any:
    """The loaded executable for ``module_text``: from the disk cache when an
    intact entry exists, else ``compile_fn()`` (counted in ``xla_compiles``),
    then written to the cache.  Cache trouble never fails the compile."""
    if not enabled():
        return _count_compile(compile_fn)
    directory = cache_dir()
    key = cache_key(module_text, options, device, device_count)
    path = _entry_path(directory, key)
    loaded = _read(path, key, deserialize_fn)
    if loaded is not None:
        with _LOCK:
            _STATS.hits += 1
        return loaded
    with _LOCK:
        _STATS.misses += 1
    loaded = _count_compile(compile_fn)
    _write(directory, path, key, loaded)
    return loaded


def _count_compile(compile_fn: Callable[[], Any]) -> Any:
    with _LOCK:
        _STATS.xla_compiles += 1
    return compile_fn()


def _reject(path: str, why: str) -> None:
    with _LOCK:
        _STATS.rejected += 1
    warnings.warn(f"hloalias disk cache: ignoring entry {path}: {why}; compiling again", CacheWarning,
                  stacklevel=4)
    try:
        os.unlink(path)
    except OSError:
        pass


def _read(path: str, key: str, deserialize_fn: Callable[[bytes], Any]) -> Any:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        _reject(path, f"unreadable ({error})")
        return None
    header = len(MAGIC) + 64 + 32
    if len(data) < header or not data.startswith(MAGIC):
        _reject(path, "not an hloalias cache entry (bad header)")
        return None
    stored_key = data[len(MAGIC):len(MAGIC) + 64]
    checksum = data[len(MAGIC) + 64:header]
    payload = data[header:]
    if stored_key != key.encode():
        _reject(path, "entry was written for another key")
        return None
    if hashlib.sha256(payload).digest() != checksum:
        _reject(path, "checksum mismatch (truncated or corrupted)")
        return None
    try:
        loaded = deserialize_fn(payload)
    except Exception as error:  # PJRT raises XlaRuntimeError and others
        _reject(path, f"PJRT could not deserialize it ({error})")
        return None
    try:
        os.utime(path)  # recently used: LRU order is modification time
    except OSError:
        pass
    return loaded


def _write(directory: str, path: str, key: str, loaded: Any) -> None:
    try:
        payload = bytes(loaded.serialize())
    except Exception as error:
        warnings.warn(f"hloalias disk cache: executable not serializable ({error}); not cached",
                      CacheWarning, stacklevel=3)
        return
    data = MAGIC + key.encode() + hashlib.sha256(payload).digest() + payload
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=_SUFFIX, dir=directory)
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
            os.replace(temporary, path)  # atomic: readers see no entry or all of it
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
    except OSError as error:
        warnings.warn(f"hloalias disk cache: cannot write {path} ({error}); not cached",
                      CacheWarning, stacklevel=3)
        return
    with _LOCK:
        _STATS.writes += 1
    evict(directory, max_bytes())


def evict(directory: str, limit: int) -> list[str]:
    """Delete least recently used entries of ``directory`` until the entries
    total at most ``limit`` bytes; return the deleted paths.  Entries that
    vanish meanwhile (another process evicting) are skipped."""
    entries: list[tuple[float, int, str]] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if not name.endswith(_SUFFIX) or name.startswith(".tmp-"):
            continue
        full = os.path.join(directory, name)
        try:
            info = os.stat(full)
        except OSError:
            continue
        entries.append((info.st_mtime, info.st_size, full))
    total = sum(size for _, size, _ in entries)
    deleted: list[str] = []
    for _, size, full in sorted(entries):
        if total <= limit:
            break
        try:
            os.unlink(full)
        except OSError:
            continue
        total -= size
        deleted.append(full)
    return deleted


def clear_disk_cache() -> None:
    """Delete every entry of the current cache directory."""
    evict(cache_dir(), 0)
