"""One bounded least-recently-used map, the store of every in-process cache
of hloalias that grows with the user's programs (executables, imports,
shape families, ``hloalias.jit`` signatures, the ``torch.compile``
backend's number values, optimizer update templates, and through
:func:`memoized` the small memo tables: pipeline texts parsed, source
files' digests, strided views' geometry).

Contract:

- Order: :meth:`BoundedLRU.get` of a present key and :meth:`BoundedLRU.put`
  make the key the most recently used; iteration (:meth:`keys`,
  :meth:`values`, :meth:`items`) runs least recently used first.
  :meth:`peek` and ``in`` read without touching the order or the counters.
- Bound: after each :meth:`put`, entries beyond the bound go, least
  recently used first, each counted in ``stats.evictions`` and handed to
  ``on_evict(key, value)`` (after it left the map).  The bound is an int or
  a callable read at each :meth:`put` (a setting read when it is needed,
  as ``hloalias.config`` reads its variables); a bound of 0 or less keeps
  nothing (the cache is off: the entry just put is evicted at once).
- Stats (:class:`LRUStats`, a live object, or the caller's object of the
  same fields): ``hits`` and ``misses`` of :meth:`get` (a caller that counts
  its misses elsewhere passes ``miss=False``), ``evictions`` of the bound.
  :meth:`pop`, :meth:`remove_where` and :meth:`clear` are not evictions.
- :meth:`clear` drops every entry (not handed to ``on_evict``) and, unless
  told otherwise, resets the counters in place.
- Not thread-safe by itself: each cache takes its own lock around the
  calls (most hold it across several, a look-up then a re-key).
- :func:`memoized` is ``functools.lru_cache`` over a :class:`BoundedLRU`
  (the bound a callable, e.g. a setting): thread-safe (its own lock, not
  held while the function runs: two threads may compute one key, the
  later result kept), a raised exception is not cached, positional
  hashable arguments only.

Imports nothing but the standard library (``hloalias`` is the lowest layer
and ``import hloalias`` stays light: test_lazy_imports.py)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, Protocol, TypeVar, cast, overload

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")


class Counters(Protocol):
    """What :class:`BoundedLRU` counts into: a cache's public stats object."""

    hits: int
    misses: int
    evictions: int


@dataclasses.dataclass
class LRUStats:
    """Counters of one :class:`BoundedLRU` (live object)."""

    hits: int = 0
    misses: int = 0
    #: Entries dropped because the map was over its bound.
    evictions: int = 0


S = TypeVar("S", bound=Counters)


class BoundedLRU(Generic[K, V]):
    """A map of at most ``bound`` entries, least recently used dropped
    first (module docstring)."""

    def __init__(
        self,
        bound: int | Callable[[], int],
        *,
        on_evict: Callable[[K, V], None] | None = None,
        stats: Counters | None = None,
    ) -> None:
        self._bound = bound
        self._on_evict = on_evict
        self._entries: collections.OrderedDict[K, V] = collections.OrderedDict()
        #: The counters (live): the caller's object when it passed one.
        self.stats: Counters = LRUStats() if stats is None else stats

    @property
    def bound(self) -> int:
        """The bound now (never below 0); set an int or a callable (read at
        the next :meth:`put`)."""
        return max(self._bound() if callable(self._bound) else self._bound, 0)

    @bound.setter
    def bound(self, bound: int | Callable[[], int]) -> None:
        self._bound = bound

    @overload
    def get(self, key: K, *, miss: bool = True) -> V | None: ...
    @overload
    def get(self, key: K, default: D, *, miss: bool = True) -> V | D: ...
    def get(self, key: K, default: object = None, *, miss: bool = True) -> object:
        """The value of ``key``, now the most recently used (a hit), or
        ``default`` (a miss, counted unless ``miss`` is False)."""
        try:
            value = self._entries[key]
        except KeyError:
            if miss:
                self.stats.misses += 1
            return default
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return value

    @overload
    def peek(self, key: K) -> V | None: ...
    @overload
    def peek(self, key: K, default: D) -> V | D: ...
    def peek(self, key: K, default: object = None) -> object:
        """The value of ``key`` or ``default``; the order and counters stay."""
        return self._entries.get(key, default)

    def put(self, key: K, value: V) -> int:
        """Keep ``value`` under ``key`` as the most recently used, then
        evict beyond the bound; how many entries were evicted."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        bound = self.bound
        evicted = 0
        while len(self._entries) > bound:
            old_key, old_value = self._entries.popitem(last=False)
            self.stats.evictions += 1
            evicted += 1
            if self._on_evict is not None:
                self._on_evict(old_key, old_value)
        return evicted

    @overload
    def pop(self, key: K) -> V | None: ...
    @overload
    def pop(self, key: K, default: D) -> V | D: ...
    def pop(self, key: K, default: object = None) -> object:
        """Remove ``key`` and return its value, or ``default`` (not an eviction)."""
        return self._entries.pop(key, default)

    def remove_where(self, predicate: Callable[[K, V], bool]) -> int:
        """Remove every entry ``predicate`` holds for (not evictions); how many."""
        doomed = [key for key, value in self._entries.items() if predicate(key, value)]
        for key in doomed:
            del self._entries[key]
        return len(doomed)

    def clear(self, *, reset_stats: bool = True) -> None:
        """Drop every entry (no ``on_evict``); reset the counters in place
        unless ``reset_stats`` is False."""
        self._entries.clear()
        if reset_stats:
            self.stats.hits = self.stats.misses = self.stats.evictions = 0

    def newest(self) -> V | None:
        """The most recently used value, or None when empty."""
        return next(reversed(self._entries.values())) if self._entries else None

    def keys(self) -> list[K]:
        """The keys, least recently used first (a copy)."""
        return list(self._entries)

    def values(self) -> list[V]:
        """The values, least recently used first (a copy)."""
        return list(self._entries.values())

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recently used first (a copy)."""
        return list(self._entries.items())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._entries))

    def __bool__(self) -> bool:
        return bool(self._entries)


F = TypeVar("F", bound=Callable[..., Any])


class Memoized(Protocol):
    """What :func:`memoized` adds to the function it wraps."""

    #: The entries (arguments tuple -> result) and their counters.
    cache: BoundedLRU[tuple[Hashable, ...], Any]

    def cache_clear(self) -> None: ...


def memoized(bound: int | Callable[[], int]) -> Callable[[F], F]:
    """``function``'s results kept per positional arguments in a
    :class:`BoundedLRU` of ``bound`` (module docstring); the wrapper's
    ``cache`` is the map and ``cache_clear()`` empties it."""

    def wrap(function: F) -> F:
        cache: BoundedLRU[tuple[Hashable, ...], Any] = BoundedLRU(bound)
        lock = threading.Lock()
        missing = object()

        @functools.wraps(function)
        def memo(*args: Hashable) -> Any:
            with lock:
                found = cache.get(args, missing)
            if found is not missing:
                return found
            value = function(*args)
            with lock:
                cache.put(args, value)
            return value

        def cache_clear() -> None:
            with lock:
                cache.clear()

        setattr(memo, "cache", cache)
        setattr(memo, "cache_clear", cache_clear)
        return cast(F, memo)

    return wrap


__all__ = ["BoundedLRU", "Counters", "LRUStats", "Memoized", "memoized"]
