"""Same-window A/B of the pooled MLIR context (``hloalias.mlir.ContextPool``)
against a new context per compile, and host memory over many distinct
compiles; figures go to ``bench/RESULTS-latency.md`` by hand.

From the repository root::

    .venv/bin/python -m bench.context_pool_ab seed --reps 3       # alternating processes
    .venv/bin/python -m bench.context_pool_ab memory --compiles 2000

``seed``: processes alternate between ``uses=1`` (every compile gets a new
context: the behaviour before the pool) and the pool's defaults; each
process compiles the seed program ``--samples`` times warm (a new object
each time, every cache off, ``time.process_time()`` around ``compile``) and
reports the median, and ``jax.jit`` of the same program in the same
process (lower + compile of a new function).  ``memory``: one process per
setting (``uses=1``, the defaults, and a context never recycled) compiles
``--compiles`` distinct view-only programs (new input lengths: new types
every compile; no XLA), dropping each executable, and reports the RSS at
checkpoints and the peak."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {"fresh": (1, 1 << 20), "pool": (None, None), "forever": (10**12, 10**18)}


def _configure(setting: str) -> None:
    from hloalias.mlir import CONTEXT_POOL

    uses, size = SETTINGS[setting]
    if uses is not None:
        CONTEXT_POOL.max_uses = uses
    if size is not None:
        CONTEXT_POOL.max_bytes = size


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def seed_child(setting: str, samples: int) -> dict[str, Any]:
    os.environ["HLOALIAS_CACHE"] = "0"
    import jax

    import hloalias
    from bench import workloads
    from hloalias.mlir import CONTEXT_POOL

    _configure(setting)
    workload = workloads.seed_workload()
    hloalias.compile(workload.module, workload.args)
    times = []
    for _ in range(samples):
        hloalias.clear_cache()
        module = workloads.SeedModule()
        start = time.process_time()
        hloalias.compile(module, workload.args)
        times.append(time.process_time() - start)
    inputs = workload.jax_inputs()
    jax.jit(lambda x: workload.jax_fn(x)).lower(*inputs).compile()
    jax_times = []
    for _ in range(samples):
        fn = (lambda f: lambda x: f(x))(workload.jax_fn)
        start = time.process_time()
        jax.jit(fn).lower(*inputs).compile()
        jax_times.append(time.process_time() - start)
    return {"setting": setting, "hloalias_cpu_s": statistics.median(times), "jax_cpu_s": statistics.median(jax_times),
            "contexts_created": CONTEXT_POOL.created, "load": os.getloadavg()[0]}


def memory_child(setting: str, compiles: int) -> dict[str, Any]:
    os.environ["HLOALIAS_CACHE"] = "0"
    import torch

    import hloalias
    from hloalias.mlir import CONTEXT_POOL

    _configure(setting)

    def program(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x[0:8].view(2, 4)

    hloalias.compile(program, (torch.randn(16),))
    checkpoints = {}
    start = time.process_time()
    for index in range(compiles):
        hloalias.clear_cache()
        x = torch.randn(16 + index)  # a new length: new tensor types in every import
        exe = hloalias.compile(program, (x,))
        outputs = exe(x)
        if not (torch.equal(outputs[0], x) and torch.equal(outputs[1], x[0:8].view(2, 4))):
            raise AssertionError(f"compile {index} differs from eager")
        del exe, outputs
        if (index + 1) % (compiles // 8) == 0:
            checkpoints[index + 1] = _rss_bytes()
    return {"setting": setting, "rss_bytes": checkpoints,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "cpu_s": time.process_time() - start, "contexts_created": CONTEXT_POOL.created,
            "load": os.getloadavg()[0]}


def _run_child(*args: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, "-m", "bench.context_pool_ab", "--child", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("seed", "memory"))
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--setting", default="pool", choices=tuple(SETTINGS))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--compiles", type=int, default=2000)
    args = parser.parse_args()
    if args.child:
        if args.mode == "seed":
            print(json.dumps(seed_child(args.setting, args.samples)))
        else:
            print(json.dumps(memory_child(args.setting, args.compiles)))
        return
    print(f"start {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()}", flush=True)
    if args.mode == "seed":
        for rep in range(args.reps):
            for setting in ("fresh", "pool"):
                print(json.dumps(_run_child("seed", "--setting", setting, "--samples", str(args.samples))),
                      flush=True)
    else:
        for setting in ("fresh", "pool", "forever"):
            print(json.dumps(_run_child("memory", "--setting", setting, "--compiles", str(args.compiles))),
                  flush=True)
    print(f"end {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
