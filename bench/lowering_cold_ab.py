"""Why the two torch-mlir lowering pipelines cost more inside a compile than
run alone on the same module (branch ``firstcost``; figures to
``bench/RESULTS-latency.md``, section "firstcost").

From the repository root::

    .venv/bin/python -m bench.lowering_cold_ab --compiles 60 --procs 2

Warm process, the seed program compiled with every cache off (a new
``SeedModule`` each time, ``HLOALIAS_CACHE=0``).  Inside each compile, each
pipeline's pass manager (the pooled one the compile uses) runs on the
compile's module as usual, timed (``manager.run``, then the verifier), and
then four more times on copies of the module as it was before the pipeline
(``again0``-``again3``: the same passes on the same input right after,
"alone in a loop").  With ``--sweep``, a 32 MiB array is written between
``again0`` and ``again1`` and between ``again2`` and ``again3`` (the CPU's
caches emptied of the passes' code and data, as a trace's allocations
leave them).  CPU time (``time.process_time()``, every thread); medians
over the compiles; one line per process, processes alternating without and
with ``--sweep``.  Also counted: the pooled contexts made over the
compiles and the garbage collections that started while a pipeline ran
inside a compile."""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(compiles: int, sweep: bool) -> dict[str, Any]:
    os.environ["HLOALIAS_CACHE"] = "0"
    sys.path.insert(0, REPO)
    import numpy as np

    import hloalias
    from bench import workloads
    from hloalias.frontend import importer
    from hloalias.mlir import CONTEXT_POOL
    from hloalias.runtime import export_cache

    junk = np.zeros(4 << 20)  # 32 MiB
    times: dict[str, list[float]] = {}
    calls = [0]
    collections = [0, False]  # garbage collections started while a pipeline ran in a compile

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and collections[1]:
            collections[0] += 1

    gc.callbacks.append(count)

    def timed_run(manager: Any, operation: Any) -> None:
        name = ("backend_contract", "stablehlo")[calls[0] % 2]  # the order _import_decomposed runs them
        calls[0] += 1
        before = operation.clone()
        manager.enable_verifier(False)
        collections[1] = True
        start = time.process_time()
        manager.run(operation)
        ran = time.process_time()
        collections[1] = False
        operation.verify()
        times.setdefault(f"{name}_in_compile", []).append(ran - start)
        times.setdefault(f"{name}_verify", []).append(time.process_time() - ran)
        for index in range(4):
            if sweep and index % 2 == 1:
                junk[:] = junk + 1.0
            copy = before.clone()
            start = time.process_time()
            manager.run(copy)
            times.setdefault(f"{name}_again{index}", []).append(time.process_time() - start)
            copy.erase()
        before.erase()

    importer.run_verifying_result = timed_run
    seed = workloads.seed_workload()

    def compile_once() -> None:
        hloalias.clear_cache()
        export_cache.clear_export_cache()
        hloalias.compile(workloads.SeedModule(), seed.args)

    for _ in range(5):
        compile_once()
    times.clear()
    made = CONTEXT_POOL.created
    for _ in range(compiles):
        compile_once()
    return {"sweep": sweep, "load": os.getloadavg()[0], "contexts_made": CONTEXT_POOL.created - made,
            "collections_in_runs": collections[0],
            **{name: round(statistics.median(values) * 1e3, 3) for name, values in sorted(times.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiles", type=int, default=60)
    parser.add_argument("--procs", type=int, default=2, help="processes of each kind, alternating")
    parser.add_argument("--child", choices=("plain", "sweep"))
    options = parser.parse_args()
    if options.child:
        print("LOWERING " + json.dumps(child(options.compiles, options.child == "sweep")), flush=True)
        return
    for index in range(2 * options.procs):
        kind = ("plain", "sweep")[index % 2]
        done = subprocess.run([sys.executable, "-m", "bench.lowering_cold_ab", "--compiles", str(options.compiles),
                               "--child", kind], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                              capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("LOWERING ")]
        if not lines:
            raise RuntimeError(done.stderr[-3000:])
        print(lines[-1][len("LOWERING "):], flush=True)


if __name__ == "__main__":
    main()
