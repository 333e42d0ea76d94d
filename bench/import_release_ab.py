"""Per-call cost of the guarded DLPack releases (runtime/ownership.py's
docstring), one process per tree: the minimum over rounds of the median of
``CALLS`` calls, per row and call path.  Run it once with the branch's
runtime/ownership.py and once with the base's, alternating (results in
bench/RESULTS-runtime.md)."""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

import hloalias

CALLS = 300
ROUNDS = 5


def _affine(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def main() -> None:
    x = torch.ones(64, 64)
    exes = {}
    exes["native"] = hloalias.compile(_affine, (x,))
    os.environ["HLOALIAS_NATIVE"] = "0"
    exes["python"] = hloalias.compile(_affine, (x,))
    assert exes["native"]._lane is not None and exes["python"]._lane is None
    rows = {
        "temporary ones(64,64)": lambda: torch.ones(64, 64),
        "same caller tensor": lambda: x,
        "non-contiguous (t())": lambda: x.t(),
    }
    best: dict[tuple[str, str], float] = {}
    for _ in range(ROUNDS):
        for row, make in rows.items():
            for path, exe in exes.items():
                times = []
                for _ in range(CALLS):
                    # The whole life of the argument: made, called on, dropped
                    # (a temporary's import is released when it dies).
                    start = time.perf_counter()
                    arg = make()
                    exe(arg)
                    del arg
                    times.append(time.perf_counter() - start)
                median = statistics.median(times) * 1e6
                key = (row, path)
                best[key] = min(best.get(key, median), median)
    tag = sys.argv[1] if len(sys.argv) > 1 else "?"
    for (row, path), value in best.items():
        print(f"{tag}\t{row}\t{path}\t{value:.1f}")
    from hloalias.runtime import ownership

    native = getattr(ownership, "_native", None)
    if getattr(native, "release_stats", None) is not None and getattr(ownership, "_guard_dlpack", None) is not None:
        print(f"{tag}\treleases (direct, queued, drained, pending)\t{native.release_stats()}")


if __name__ == "__main__":
    main()
