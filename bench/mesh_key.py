"""Per-call cost of the random key on a mesh spanning 2 processes
(bench/RESULTS-sharding.md, "random key").  Run as

    .venv/bin/python -m hloalias.tools.launch -n 2 --devices 2 bench/mesh_key.py [REPS] [CALLS]

Three forms of the key, the same programs, every process seeded alike (so
all three draw correctly), alternating form by form ``REPS`` times (same
window); each figure is the median of ``CALLS`` timed calls of process 0:

- ``replicated``: the key as one replicated argument (the form before a
  key per device; wrong when processes are seeded differently);
- ``per-device``: one row per device, the program reads row 0 (hloalias's);
- ``broadcast``: ``replicated`` plus ``multihost_utils.broadcast_one_to_all``
  of the key before each call (a host round trip per call).

Workloads: dropout of a replicated 8x64 tensor (the key's cost alone,
nearly), and a data-parallel Adam step of an MLP with dropout (4 devices)."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import torch

# The workloads are the multi-process tests' (test/py/distributed/worker.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "py"))


def _median_us(call: Callable[[], Any], calls: int) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> int:
    import hloalias
    from hloalias.runtime import executable, sharding

    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    hloalias.distributed.initialize()
    from distributed import worker
    from jax.experimental import multihost_utils

    mesh = hloalias.Mesh((4,), ("dp",))
    x = torch.ones(8, 64)
    data = worker.batches()
    original_draw = executable.draw_rng_bits
    per_device = sharding.key_per_device

    def broadcast_draw() -> torch.Tensor:
        with jax.enable_x64(True):  # int64 stays int64
            key = np.asarray(multihost_utils.broadcast_one_to_all(original_draw().numpy()))
        return torch.from_numpy(key.copy())

    programs: dict[str, dict[str, Callable[[], Any]]] = {}
    for form in ("replicated", "per-device", "broadcast"):
        sharding.key_per_device = per_device if form == "per-device" else (lambda placement: False)
        dropped = hloalias.compile(worker.dropout, (x,), mesh=mesh)
        model, optimizer, step = worker.dropped_trainer()
        train = hloalias.compile_training_step(step, model, optimizer, data[0], mesh=mesh, shardings=worker.DATA_PARALLEL)
        programs[form] = {"dropout": lambda d=dropped: d(x), "step": lambda t=train: t(*data[0])}
    sharding.key_per_device = per_device
    torch.manual_seed(0)
    figures: dict[tuple[str, str], list[float]] = {}
    for _ in range(reps):
        for form, workloads in programs.items():
            executable.draw_rng_bits = broadcast_draw if form == "broadcast" else original_draw
            for name, call in workloads.items():
                figures.setdefault((name, form), []).append(_median_us(call, calls))
    executable.draw_rng_bits = original_draw
    if hloalias.distributed.process_index() == 0:
        print(f"reps {reps}, {calls} calls each; per-call median (us) per rep, process 0")
        for (name, form), values in sorted(figures.items()):
            print(f"{name:8s} {form:11s} median {statistics.median(values):8.1f}  reps " + " ".join(f"{v:.1f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
