"""One side of a same-window A/B of the per-call cost of a program's random
key (``bench/RESULTS-runtime.md``, "The random key as a PJRT-owned copy"):
per-call time of small programs with dropout, of one drawing a single
random number (the key is most of its host work), and of one without
random ops as the control, in this process, on the call path ``HLOALIAS_NATIVE``
selects.  Not a timed test.

Run it from the root of the tree under test with that tree's venv, and
alternate trees and paths process by process::

    HLOALIAS_NATIVE=0 .venv/bin/python /path/to/bench/rng_key_ab.py --label new-python

Prints one JSON line: per row, microseconds per call, the minimum over
``--rounds`` interleaved rounds of the median of ``--calls`` calls."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import hloalias


def _dropout(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True)


def _affine(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def _one_draw(x: torch.Tensor) -> torch.Tensor:
    # One random element: the call's host work (the key) is most of its time.
    return x * 2 + torch.rand(1)


def rows() -> dict[str, Callable[[], Any]]:
    """Each row's call, compiled and warmed up."""
    small = torch.ones(16, 16)
    drop = hloalias.compile(_dropout, (small,))
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.25)).train()
    batch = torch.randn(32, 64)
    linear = hloalias.compile(layer, (batch,))
    affine = hloalias.compile(_affine, (small,))
    one_draw = hloalias.compile(_one_draw, (small,))
    calls: dict[str, Callable[[], Any]] = {
        "dropout on 256 floats": lambda: drop(small),
        "Linear(64, 64) + Dropout on 32x64": lambda: linear(batch),
        "x*2+1 on 256 floats (no random ops)": lambda: affine(small),
        "x*2 + rand(1) on 256 floats": lambda: one_draw(small),
    }
    for call in calls.values():
        for _ in range(50):
            call()
    return calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    options = parser.parse_args()
    calls = rows()
    best: dict[str, float] = {name: float("inf") for name in calls}
    for _ in range(options.rounds):
        for name, call in calls.items():
            times = []
            for _ in range(options.calls):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            best[name] = min(best[name], statistics.median(times) * 1e6)
    print(json.dumps({"label": options.label, "us_per_call": best}))


if __name__ == "__main__":
    main()
