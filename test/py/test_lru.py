"""The bounded LRU every in-process cache is kept in (hloalias/lru.py):
order, bound (0 keeps nothing, a callable bound read at each put),
eviction callback, counters and clear."""

from __future__ import annotations

from pathlib import Path

import pytest

from hloalias.lru import BoundedLRU, LRUStats


def test_least_recently_used_goes_first_and_get_refreshes() -> None:
    cache: BoundedLRU[str, int] = BoundedLRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the oldest
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"] and cache.values() == [1, 3]
    assert cache.items() == [("a", 1), ("c", 3)] and list(cache) == ["a", "c"]
    assert "b" not in cache and len(cache) == 2 and cache.newest() == 3


def test_peek_and_contains_neither_reorder_nor_count() -> None:
    cache: BoundedLRU[str, int] = BoundedLRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.peek("a") == 1 and "a" in cache and cache.peek("z", 0) == 0
    cache.put("c", 3)  # "a" was not refreshed
    assert cache.keys() == ["b", "c"]
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (0, 0, 1)


def test_put_of_a_present_key_replaces_and_refreshes_it() -> None:
    cache: BoundedLRU[str, int] = BoundedLRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.put("a", 10) == 0
    assert cache.items() == [("b", 2), ("a", 10)]


def test_counters_hits_misses_evictions() -> None:
    cache: BoundedLRU[int, str] = BoundedLRU(1)
    assert cache.get(1) is None and cache.get(1, "none") == "none"
    cache.put(1, "one")
    assert cache.get(1) == "one"
    assert cache.get(2, miss=False) is None  # counted by its caller elsewhere
    assert cache.put(2, "two") == 1  # evicts 1
    assert cache.stats == LRUStats(hits=1, misses=2, evictions=1)


def test_eviction_callback_gets_each_evicted_entry_oldest_first() -> None:
    evicted: list[tuple[str, int]] = []
    bound = [3]
    cache: BoundedLRU[str, int] = BoundedLRU(lambda: bound[0], on_evict=lambda k, v: evicted.append((k, v)))
    for number, key in enumerate("abc"):
        cache.put(key, number)
    bound[0] = 1  # a callable bound is read at the next put
    assert cache.put("d", 3) == 3
    assert evicted == [("a", 0), ("b", 1), ("c", 2)] and cache.keys() == ["d"]
    assert "a" not in cache  # gone before its callback ran
    cache.pop("d")
    cache.remove_where(lambda k, v: True)
    cache.put("e", 4)
    cache.clear()
    assert evicted == [("a", 0), ("b", 1), ("c", 2)]  # pop, remove_where and clear are not evictions


def test_bound_zero_or_less_keeps_nothing() -> None:
    evicted: list[str] = []
    for bound in (0, -3):
        cache: BoundedLRU[str, int] = BoundedLRU(bound, on_evict=lambda k, v: evicted.append(k))
        assert cache.bound == 0
        assert cache.put("a", 1) == 1
        assert len(cache) == 0 and not cache and cache.get("a") is None
        assert cache.stats.evictions == 1
    assert evicted == ["a", "a"]


def test_bound_can_be_set() -> None:
    cache: BoundedLRU[str, int] = BoundedLRU(3)
    for number, key in enumerate("abc"):
        cache.put(key, number)
    cache.bound = 2
    assert len(cache) == 3  # applied at the next put
    cache.put("d", 3)
    assert cache.keys() == ["c", "d"] and cache.bound == 2


def test_pop_and_remove_where() -> None:
    cache: BoundedLRU[str, int] = BoundedLRU(4)
    for number, key in enumerate("abcd"):
        cache.put(key, number)
    assert cache.pop("b") == 1 and cache.pop("b") is None and cache.pop("b", -1) == -1
    assert cache.remove_where(lambda key, value: value % 2 == 0) == 2
    assert cache.keys() == ["d"] and cache.stats.evictions == 0


def test_clear_resets_counters_in_place_unless_told() -> None:
    cache: BoundedLRU[str, int] = BoundedLRU(1)
    stats = cache.stats
    cache.put("a", 1)
    cache.get("a")
    cache.get("b")
    cache.put("b", 2)
    cache.clear(reset_stats=False)
    assert len(cache) == 0 and (stats.hits, stats.misses, stats.evictions) == (1, 1, 1)
    cache.put("a", 1)
    cache.clear()
    assert len(cache) == 0 and stats is cache.stats and stats == LRUStats()
    assert cache.newest() is None


def test_counts_into_the_callers_stats_object() -> None:
    class Counters:
        def __init__(self) -> None:
            self.hits = self.misses = self.evictions = 0
            self.other = 7

    mine = Counters()
    cache: BoundedLRU[str, int] = BoundedLRU(1, stats=mine)
    cache.put("a", 1)
    cache.get("a")
    cache.put("b", 2)
    assert (mine.hits, mine.misses, mine.evictions, mine.other) == (1, 0, 1, 7)
    cache.clear()
    assert (mine.hits, mine.misses, mine.evictions, mine.other) == (0, 0, 0, 7)


@pytest.mark.parametrize("bound", [1, 5])
def test_never_more_than_the_bound(bound: int) -> None:
    cache: BoundedLRU[int, int] = BoundedLRU(bound)
    for key in range(20):
        cache.put(key, key)
        cache.get(key // 2)
        assert len(cache) <= bound
    assert cache.stats.evictions == 20 - bound


def test_memoized_keeps_results_per_arguments_within_its_bound() -> None:
    from hloalias.lru import memoized

    runs: list[tuple[int, int]] = []
    bound = [2]

    @memoized(lambda: bound[0])
    def add(a: int, b: int) -> int:
        runs.append((a, b))
        if a < 0:
            raise ValueError(a)
        return a + b

    assert add(1, 2) == 3 and add(1, 2) == 3 and runs == [(1, 2)]
    add(2, 2)
    add(3, 2)  # (1, 2) is the least recently used: evicted
    assert add.cache.keys() == [(2, 2), (3, 2)]  # type: ignore[attr-defined]
    assert add(1, 2) == 3 and runs.count((1, 2)) == 2
    with pytest.raises(ValueError):
        add(-1, 0)
    with pytest.raises(ValueError):  # an exception is not kept
        add(-1, 0)
    assert runs.count((-1, 0)) == 2
    bound[0] = 0  # off: nothing kept
    add(5, 5)
    add(5, 5)
    assert runs.count((5, 5)) == 2 and len(add.cache) == 0  # type: ignore[attr-defined]
    bound[0] = 2
    add(6, 6)
    add.cache_clear()  # type: ignore[attr-defined]
    assert len(add.cache) == 0  # type: ignore[attr-defined]


def test_the_memo_tables_that_grow_with_programs_are_bounded_by_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """Pipeline texts parsed, source files' digests and rebuilt views'
    geometry: keyed by what the user's programs bring (their pipelines,
    their files and each edit of one, their tensors' shapes and strides),
    each is an LRU of HLOALIAS_MEMO_CACHE_SIZE entries.  Before, each was
    a ``functools.lru_cache`` of a fixed size (64, 256, 256) that no
    setting changed."""
    import torch

    from hloalias.pipeline import _parse_pipeline, parse_pipeline
    from hloalias.runtime import source_key, strided_views

    monkeypatch.setenv("HLOALIAS_MEMO_CACHE_SIZE", "3")
    for memo in (_parse_pipeline, source_key._file_digest_cached, strided_views._carried_geometry):
        memo.cache_clear()
    for n in range(5):
        parse_pipeline(f"builtin.module(canonicalize{{max-iterations={n + 1}}})")
        source = tmp_path / f"m{n}.py"
        source.write_text(f"x = {n}\n")
        source_key._file_digest(str(source))
        base = torch.zeros(4, n + 2)
        assert strided_views.strided_view_of(base, (n + 2,), (1,), 0) is not None
    for memo in (_parse_pipeline, source_key._file_digest_cached, strided_views._carried_geometry):
        assert len(memo.cache) == 3, memo  # type: ignore[attr-defined]
    # The newest are kept: a hit, not a new entry.
    hits = strided_views._carried_geometry.cache.stats.hits  # type: ignore[attr-defined]
    strided_views.strided_view_of(torch.zeros(4, 6), (6,), (1,), 0)
    assert strided_views._carried_geometry.cache.stats.hits == hits + 1  # type: ignore[attr-defined]
    monkeypatch.setenv("HLOALIAS_MEMO_CACHE_SIZE", "0")
    source = tmp_path / "late.py"
    source.write_text("y = 1\n")
    source_key._file_digest(str(source))
    assert len(source_key._file_digest_cached.cache) == 0  # type: ignore[attr-defined]
