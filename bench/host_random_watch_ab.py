"""CPU time per trace of the host random-draw watch
(frontend/host_random.py's ``refuse_host_random_draws``, entered and left
with nothing drawn, numpy loaded), the branch's module against another
version of the file, alternating in one process: ``ROUNDS`` rounds, each
timing ``ENTRIES`` entries of one version then of the other
(``time.process_time``: CPU time, not wall time, on a shared machine).

    .venv/bin/python bench/host_random_watch_ab.py /tmp/old_host_random.py

prints each round's microseconds per entry and the median per version
(results in bench/RESULTS-latency.md)."""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from types import ModuleType

import numpy  # noqa: F401  (loaded, as in a trace of transformers' models: its functions are watched)

from hloalias.frontend import host_random

ENTRIES = 2000
ROUNDS = 7


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("hloalias.frontend._host_random_other", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _per_entry_us(module: ModuleType) -> float:
    watch = module.refuse_host_random_draws
    start = time.process_time()
    for _ in range(ENTRIES):
        with watch():
            pass
    return (time.process_time() - start) / ENTRIES * 1e6


def main() -> None:
    versions = {"other": _load(sys.argv[1]), "branch": host_random}
    for module in versions.values():
        _per_entry_us(module)  # warm-up (the branch's builds its wrappers once here)
    seen: dict[str, list[float]] = {name: [] for name in versions}
    for round_ in range(ROUNDS):
        order = list(versions) if round_ % 2 == 0 else list(reversed(versions))
        for name in order:
            seen[name].append(_per_entry_us(versions[name]))
        print(f"round {round_}: " + ", ".join(f"{name} {seen[name][-1]:.1f} us" for name in versions), flush=True)
    for name, values in seen.items():
        print(f"{name}: median {statistics.median(values):.1f} us/entry, min {min(values):.1f}, max {max(values):.1f}")


if __name__ == "__main__":
    main()
