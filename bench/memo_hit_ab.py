"""CPU time of a hit in the rebuilt-view geometry memo
(runtime/strided_views.py's ``strided_view_of``, called for each rebuilt
view result on every call), the branch's module (``hloalias.lru.memoized``)
against another version of the file (main's ``functools.lru_cache``),
alternating in one process: ``ROUNDS`` rounds of ``CALLS`` calls each
(``time.process_time``).

    .venv/bin/python bench/memo_hit_ab.py /tmp/old_strided_views.py

(results in bench/RESULTS-runtime.md)."""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from types import ModuleType
from typing import Any

import torch

from hloalias.runtime import strided_views

CALLS = 50_000
ROUNDS = 7


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("hloalias.runtime._strided_views_other", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _per_call_us(function: Any, *args: Any) -> float:
    start = time.process_time()
    for _ in range(CALLS):
        function(*args)
    return (time.process_time() - start) / CALLS * 1e6


def main() -> None:
    versions = {"other": _load(sys.argv[1]), "branch": strided_views}
    base = torch.zeros(8, 8)
    rows = {
        "geometry hit": lambda m: (m._carried_geometry, (8, 8), (8, 1), (4, 8), (16, 1), 0),
        "strided_view_of (hit)": lambda m: (m.strided_view_of, base, (4, 8), (16, 1), 0),
    }
    for row, make in rows.items():
        seen: dict[str, list[float]] = {name: [] for name in versions}
        for module in versions.values():
            function, *args = make(module)
            _per_call_us(function, *args)  # warm: the entry is made
        for round_ in range(ROUNDS):
            order = list(versions) if round_ % 2 == 0 else list(reversed(versions))
            for name in order:
                function, *args = make(versions[name])
                seen[name].append(_per_call_us(function, *args))
        print(row + ": " + ", ".join(
            f"{name} median {statistics.median(v):.3f} us (min {min(v):.3f}, max {max(v):.3f})" for name, v in seen.items()
        ), flush=True)


if __name__ == "__main__":
    main()
