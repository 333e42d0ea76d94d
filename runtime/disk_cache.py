"""Persistent compilation cache: XLA executables (and, through
:mod:`hloalias.runtime.program_cache`, compiled programs) on disk, shared by
one user's processes.

On by default.  Settings (read at each lookup, so tests and tools may
change them at run time):

- ``HLOALIAS_CACHE_DIR``: the directory (default
  ``$XDG_CACHE_HOME/hloalias/xla`` or ``~/.cache/hloalias/xla``), created
  with mode 0700.
- ``HLOALIAS_CACHE_MAX_BYTES``: size bound (default 2 GiB).  After each
  write the least recently used entries (file modification time, refreshed
  on every hit) are deleted until the directory is within the bound.
- ``HLOALIAS_CACHE=0`` (or ``off``/``false``/``no``): disabled; every
  compile goes to XLA and nothing is read or written.

Trust.  An entry is code this process will run, so it is used only when
nobody but the user could have written it, as ssh and pip decide:

- the directory must be a directory owned by the effective user and not
  writable by group or others; otherwise the process warns once per
  directory (:class:`CacheWarning`) and compiles without the cache (nothing
  read, nothing written);
- an entry must be a regular file (not a symbolic link) owned by the user
  and not writable by group or others; otherwise it is rejected;
- an entry carries HMAC-SHA256 under a per-user secret key: 32 random bytes
  in ``$XDG_CACHE_HOME/hloalias/cache-key`` (or ``~/.cache/hloalias/cache-key``;
  ``HLOALIAS_CACHE_KEY_FILE`` overrides), created with mode 0600 beside,
  not inside, the default cache directory, and held to the same ownership
  rules.  An entry whose MAC does not verify (planted, copied from another
  user, corrupted, written under another key) is rejected.  Without a
  usable key file the cache is off (warned once).

Key: SHA-256 over the module text XLA receives (hloalias's final module,
so aliasing and donation are part of it), the serialized compile options,
the jax/jaxlib versions, the PJRT client's platform, platform version and
runtime type, the device kind and the number of devices.  An entry is
``MAGIC | key | HMAC(secret, MAGIC | kind | key | payload) | payload``
where the payload is PJRT's executable serialization
(``LoadedExecutable.serialize()``) and ``kind`` the entry's file suffix.
A missing entry is a miss; an entry that fails any check or does not
deserialize is reported with a :class:`CacheWarning`, removed, and the
program is compiled again.

Entries beside the key (:func:`read_beside_key`): per-user entries that
are not a program's (the digest of hloalias's own code,
:func:`hloalias.runtime.source_key.own_code_digest`), in the key file's
folder under a fixed name, in the same format and held to the same
checks; one per name (the next write replaces it; a kind kept under one
name per key is bounded by :func:`prune_beside_key`), outside the size
bound and :func:`clear_disk_cache`.  Writes go to a temporary file in the same
directory and are renamed into place, so concurrent processes see either
no entry or a whole one (two writing one key: the last rename wins, whole).
A write cut short (an error, Ctrl-C) removes its temporary file; one a
killed process left is removed by the next eviction once it is
:data:`STALE_TEMPORARY_S` old."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import stat
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jaxlib.version

from hloalias import config, interrupts

MAGIC = b"HLOALIAS-XLA-EXECUTABLE-2\n"
#: Names of the temporary files writes rename into place.
_TEMPORARY = ".tmp-"
#: Seconds after which :func:`evict` takes a temporary file for a killed
#: writer's and removes it (a write lasts well under a second per entry).
STALE_TEMPORARY_S = 3600
DEFAULT_MAX_BYTES = 2 * 1024**3
XLA_SUFFIX = ".xla"
_SUFFIXES = (XLA_SUFFIX, ".program")  # every kind of entry the bound counts
_KEY_BYTES = 32
_HEADER = len(MAGIC) + 64 + 32  # magic, hex key, HMAC-SHA256


class CacheWarning(UserWarning):
    """A disk cache entry could not be used or written (the compile goes on)."""


@dataclasses.dataclass
class DiskCacheStats:
    """Process-wide counters of the disk cache and of XLA compiles."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    rejected: int = 0  # corrupt, foreign, unauthenticated or undeserializable entries
    untrusted: int = 0  # lookups made without the cache: directory or key not trusted
    xla_compiles: int = 0  # calls into XLA's compiler (cache or not)


_STATS = DiskCacheStats()
_LOCK = threading.Lock()
_WARNED: set[str] = set()  # untrusted directories and key files already warned about


def disk_cache_stats() -> DiskCacheStats:
    """The live counters (tests read ``xla_compiles`` to see that a cached
    program never reached XLA)."""
    return _STATS


def enabled() -> bool:
    """False when ``HLOALIAS_CACHE`` is 0/off/false/no."""
    return config.flag("HLOALIAS_CACHE")


def _user_cache_base() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hloalias")


def cache_dir() -> str:
    """The cache directory (see the module docstring); not created here."""
    explicit = config.text("HLOALIAS_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    return os.path.join(_user_cache_base(), "xla")


def key_file() -> str:
    """The per-user secret key's path (see the module docstring)."""
    explicit = config.text("HLOALIAS_CACHE_KEY_FILE")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    return os.path.join(_user_cache_base(), "cache-key")


def max_bytes() -> int:
    """The size bound in bytes (``HLOALIAS_CACHE_MAX_BYTES``, default 2 GiB)."""
    return max(0, config.integer("HLOALIAS_CACHE_MAX_BYTES") or 0)


# -- trust ------------------------------------------------------------------
def _expected_owner() -> int:
    """The uid every cache file must belong to (the effective user)."""
    return os.geteuid()


def _untrusted_why(info: os.stat_result, what: str) -> str | None:
    """Why a file or directory with ``info`` cannot be trusted, or None."""
    if info.st_uid != _expected_owner():
        return f"{what} is owned by uid {info.st_uid}, not by this user (uid {_expected_owner()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _warn_once(subject: str, why: str) -> None:
    with _LOCK:
        _STATS.untrusted += 1
        if subject in _WARNED:
            return
        _WARNED.add(subject)
    warnings.warn(f"hloalias disk cache: not using {subject}: {why}; compiling without the cache",
                  CacheWarning, stacklevel=4)


def _trusted_directory(directory: str, create: bool) -> bool:
    """True when ``directory`` exists (created 0700 when ``create``) and is
    a directory the user owns that nobody else may write; warns once when
    it is not."""
    try:
        if create:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        info = os.lstat(directory)
    except FileNotFoundError:
        return False
    except OSError as error:
        _warn_once(directory, f"cannot create or read it ({error})")
        return False
    if not stat.S_ISDIR(info.st_mode):
        _warn_once(directory, "it is not a directory (or is a symbolic link)")
        return False
    why = _untrusted_why(info, "the directory")
    if why is not None:
        _warn_once(directory, why)
        return False
    return True


def _secret() -> bytes | None:
    """The per-user MAC key, created on first use; None (warned once) when
    the key file or its directory cannot be trusted."""
    path = key_file()
    if not _trusted_directory(os.path.dirname(path), create=True):
        return None
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    except _Untrusted as error:
        _warn_once(path, str(error))
        return None
    secret = os.urandom(_KEY_BYTES)
    try:
        handle, temporary = tempfile.mkstemp(prefix=".tmp-key-", dir=os.path.dirname(path))  # 0600
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(secret)
            os.link(temporary, path)  # atomic and exclusive: a concurrent creator's key wins
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
        return _read_secret(path)
    except (OSError, _Untrusted) as error:
        _warn_once(path, f"cannot create or read the key ({error})")
        return None


class _Untrusted(Exception):
    pass


def _read_trusted(path: str, what: str) -> bytes:
    """The bytes of ``path``, a regular file (no symbolic link) the user
    owns that nobody else may write; _Untrusted otherwise."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _Untrusted(f"{what} is not a regular file")
        why = _untrusted_why(info, what)
        if why is not None:
            raise _Untrusted(why)
        return handle.read()


def _read_secret(path: str) -> bytes:
    try:
        secret = _read_trusted(path, "the key file")
    except OSError as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise _Untrusted(f"cannot read the key file ({error})") from None
    info = os.stat(path)
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise _Untrusted(f"the key file is readable by group or others (mode {stat.S_IMODE(info.st_mode):o})")
    if len(secret) != _KEY_BYTES:
        raise _Untrusted(f"the key file holds {len(secret)} bytes, not {_KEY_BYTES}")
    return secret


def _mac(secret: bytes, suffix: str, key: str, payload: bytes) -> bytes:
    digest = hmac.new(secret, MAGIC + suffix.encode() + b"\0" + key.encode() + b"\0", hashlib.sha256)
    digest.update(payload)
    return digest.digest()


# -- entries ----------------------------------------------------------------
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


def _entry_path(directory: str, key: str, suffix: str = XLA_SUFFIX) -> str:
    return os.path.join(directory, key + suffix)


def read_entry(key: str, suffix: str) -> bytes | None:
    """The authenticated payload stored under ``key`` (64 hex digits) with
    file suffix ``suffix``, or None: cache disabled, directory or key not
    trusted (warned once), no entry, or an entry rejected (warned, removed).
    Counts nothing but rejections; the caller counts hits and misses."""
    place = _trusted_place(create=False)
    if place is None:
        return None
    directory, secret = place
    return _read(_entry_path(directory, key, suffix), key, suffix, secret)


def write_entry(key: str, suffix: str, payload: bytes) -> bool:
    """Store ``payload`` under ``key`` (see :func:`read_entry`), then keep
    the directory within the size bound; False when nothing was written."""
    place = _trusted_place(create=True)
    if place is None:
        return False
    directory, secret = place
    return _write(directory, _entry_path(directory, key, suffix), key, suffix, payload, secret)


def read_beside_key(name: str, key: str, suffix: str) -> bytes | None:
    """The authenticated payload of the per-user entry ``name + suffix`` in
    the key file's folder (one for every cache directory, not cleared with
    one) when it was written for ``key``; None otherwise: cache disabled,
    key not trusted, no entry, or one written for another key (such an entry
    is replaced by the next write: one entry per name).  An entry that fails
    a check is rejected (warned, removed) as a cache entry is."""
    if not enabled():
        return None
    secret = _secret()  # also checks the folder (created if missing)
    if secret is None:
        return None
    path = os.path.join(os.path.dirname(key_file()), name + suffix)
    # An entry written for another key is replaced by the next write: no warning.
    return _authenticated(path, key, suffix, secret, other_key="")


def write_beside_key(name: str, key: str, suffix: str, payload: bytes) -> bool:
    """Store ``payload`` for ``key`` as the per-user entry ``name + suffix``
    (see :func:`read_beside_key`); False when nothing was written."""
    if not enabled():
        return False
    secret = _secret()
    if secret is None:
        return False
    directory = os.path.dirname(key_file())
    return _store(directory, os.path.join(directory, name + suffix), key, suffix, payload, secret)


def prune_beside_key(prefix: str, suffix: str, keep: int) -> list[str]:
    """Remove the oldest (by modification time) per-user entries named
    ``prefix...suffix`` beside the key until at most ``keep`` are left; the
    removed paths.  For a kind of entry kept under several names (one per
    key, where processes with different keys alternate): a bounded set,
    the least recently written going first.  Entries that vanish meanwhile
    (another process pruning) are skipped.  Call it after a successful
    :func:`write_beside_key` (which checked the folder)."""
    if not enabled():
        return []
    directory = os.path.dirname(key_file())
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if name.startswith(prefix) and name.endswith(suffix) and not name.startswith(_TEMPORARY):
            path = os.path.join(directory, name)
            try:
                found.append((os.stat(path).st_mtime_ns, path))
            except OSError:
                continue
    found.sort()
    removed = []
    for _, path in found[:max(0, len(found) - keep)]:
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed


def _trusted_place(create: bool) -> tuple[str, bytes] | None:
    """The cache directory and the user's secret, or None: cache disabled,
    directory or key not trusted (each warned once)."""
    if not enabled():
        return None
    directory = cache_dir()
    if not _trusted_directory(directory, create=create):
        return None
    secret = _secret()
    if secret is None:
        return None
    return directory, secret


def load_or_compile(
    module_text: str,
    options: Any,
    device: Any,
    compile_fn: Callable[[], Any],
    deserialize_fn: Callable[[bytes], Any],
    device_count: int = 1,
) -> Any:
    """The loaded executable for ``module_text``: from the disk cache when an
    authenticated entry exists, else ``compile_fn()`` (counted in
    ``xla_compiles``), then written to the cache.  Cache trouble never fails
    the compile."""
    if not enabled():
        return _count_compile(compile_fn)
    key = cache_key(module_text, options, device, device_count)
    payload = read_entry(key, XLA_SUFFIX)
    if payload is not None:
        try:
            loaded = deserialize_fn(payload)
        except Exception as error:  # PJRT raises XlaRuntimeError and others
            _reject(_entry_path(cache_dir(), key), f"PJRT could not deserialize it ({error})")
        else:
            with _LOCK:
                _STATS.hits += 1
            return loaded
    with _LOCK:
        _STATS.misses += 1
    loaded = _count_compile(compile_fn)
    try:
        serialized = bytes(loaded.serialize())
    except Exception as error:
        warnings.warn(f"hloalias disk cache: executable not serializable ({error}); not cached",
                      CacheWarning, stacklevel=2)
        return loaded
    write_entry(key, XLA_SUFFIX, serialized)
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
        os.unlink(path)  # the directory is the user's (checked): a rewrite replaces it
    except OSError:
        pass


def _read(path: str, key: str, suffix: str, secret: bytes) -> bytes | None:
    payload = _authenticated(path, key, suffix, secret, other_key="entry was written for another key")
    if payload is not None:
        try:
            os.utime(path)  # recently used: LRU order is modification time
        except OSError:
            pass
    return payload


def _authenticated(path: str, key: str, suffix: str, secret: bytes, other_key: str) -> bytes | None:
    """The payload of the entry at ``path`` when it is trusted, well formed,
    written for ``key`` and its MAC verifies; None otherwise.  A failed check
    rejects the entry (warned, removed); one written for another key is
    rejected with ``other_key`` as the reason, or left alone when that is
    empty."""
    try:
        data = _read_trusted(path, "the entry")
    except FileNotFoundError:
        return None
    except _Untrusted as error:
        _reject(path, str(error))
        return None
    except OSError as error:
        _reject(path, f"unreadable ({error})")
        return None
    if len(data) < _HEADER or not data.startswith(MAGIC):
        _reject(path, "not an hloalias cache entry (bad header)")
        return None
    stored_key = data[len(MAGIC):len(MAGIC) + 64]
    stored_mac = data[len(MAGIC) + 64:_HEADER]
    payload = data[_HEADER:]
    if stored_key != key.encode():
        if other_key:
            _reject(path, other_key)
        return None
    if not hmac.compare_digest(_mac(secret, suffix, key, payload), stored_mac):
        _reject(path, "its MAC does not verify (corrupted, or not written by this user's hloalias)")
        return None
    return payload


def _write(directory: str, path: str, key: str, suffix: str, payload: bytes, secret: bytes) -> bool:
    if not _store(directory, path, key, suffix, payload, secret):
        return False
    with _LOCK:
        _STATS.writes += 1
    evict(directory, max_bytes())
    return True


def _store(directory: str, path: str, key: str, suffix: str, payload: bytes, secret: bytes) -> bool:
    """Write the entry to a temporary file in ``directory`` and rename it
    to ``path``; False (warned) when that fails."""
    data = MAGIC + key.encode() + _mac(secret, suffix, key, payload) + payload
    made: list[str] = []
    try:
        try:
            with interrupts.deferred():  # made and recorded together: a Ctrl-C never leaks it
                handle, temporary = tempfile.mkstemp(prefix=_TEMPORARY, suffix=suffix, dir=directory)  # 0600
                made.append(temporary)
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
            os.replace(temporary, path)  # atomic: readers see no entry or all of it
        except BaseException:
            for temporary in made:
                try:
                    os.unlink(temporary)
                except OSError:
                    pass
            raise
    except OSError as error:
        warnings.warn(f"hloalias disk cache: cannot write {path} ({error}); not cached",
                      CacheWarning, stacklevel=5)
        return False
    return True


def evict(directory: str, limit: int) -> list[str]:
    """Delete least recently used entries of ``directory`` until the entries
    total at most ``limit`` bytes; return the deleted paths.  Entries that
    vanish meanwhile (another process evicting) are skipped."""
    entries: list[tuple[float, int, str]] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    stale_before = time.time() - STALE_TEMPORARY_S
    for name in names:
        if name.startswith(_TEMPORARY):
            _remove_if_stale(os.path.join(directory, name), stale_before)
            continue
        if not name.endswith(_SUFFIXES):
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


def _remove_if_stale(path: str, before: float) -> None:
    """Remove the temporary file of a write that ended before ``before``
    without renaming it (its process was killed mid-write): nothing else
    would, and the size bound does not count it."""
    try:
        if os.lstat(path).st_mtime < before:
            os.unlink(path)
    except OSError:  # gone meanwhile (renamed into place, or removed by another process)
        pass


def clear_disk_cache() -> None:
    """Delete every entry of the current cache directory."""
    evict(cache_dir(), 0)
