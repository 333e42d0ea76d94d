"""The disk cache's writes (runtime/disk_cache.py) leave no debris: a
write cut short anywhere by a Ctrl-C leaves no entry or a whole one and
no temporary file, and the temporary file of a writer killed mid-write is
removed by a later eviction once it is old (before, both stayed forever:
eviction skipped them and the size bound did not count them).

Deterministic: the interrupt is delivered at the k-th point where Python
checks for signals in the writer's code, for every k
(test/py/interrupt_points.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hloalias import interrupts
from hloalias.runtime import disk_cache
from interrupt_points import sweep

KEY = "ab" * 32
SECRET = bytes(range(32))


def test_a_write_interrupted_anywhere_leaves_a_whole_entry_or_none_and_no_temporary_file(tmp_path: Path) -> None:
    runs = iter(range(100_000))
    payload = b"x" * 4096

    def prepare() -> Path:
        directory = tmp_path / f"run-{next(runs)}"
        directory.mkdir()
        return directory

    def run(directory: Path) -> None:
        disk_cache._store(str(directory), str(directory / f"{KEY}.xla"), KEY, ".xla", payload, SECRET)

    def check(directory: Path, where: Any) -> None:
        names = os.listdir(directory)
        assert not [n for n in names if n.startswith(".tmp-")], (where, names)
        if names:
            found = disk_cache._authenticated(str(directory / f"{KEY}.xla"), KEY, ".xla", SECRET, other_key="x")
            assert found == payload, where

    points = sweep(prepare, run, check, {disk_cache.__file__, interrupts.__file__})
    assert any(name == "_store" for name, _, _ in points), points


def test_eviction_removes_a_killed_writers_old_temporary_file_only(tmp_path: Path) -> None:
    old, fresh = tmp_path / ".tmp-old.xla", tmp_path / ".tmp-fresh.xla"
    for path in (old, fresh):
        path.write_bytes(b"partial")
    long_ago = time.time() - 2 * 86400  # two days: no write lasts that long
    os.utime(old, (long_ago, long_ago))
    entry = tmp_path / f"{KEY}.xla"
    entry.write_bytes(b"entry")
    assert disk_cache.evict(str(tmp_path), 1 << 30) == []
    # A write in progress (another process's) and the entries stay.
    assert sorted(os.listdir(tmp_path)) == sorted([fresh.name, entry.name])
