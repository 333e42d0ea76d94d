"""Same-window A/B of the stored preservable-CIA set (issue 26, cold first
compile): fresh processes alternating ``old`` (``materialize_cia_ops_once``
of the base commit, loaded from git, patched over the tree's: every process
walks torch's operators) and ``new`` (the tree's: a stored set is used).
Each child does what ``bench.latency``'s cold child does before its timed
compile (imports, torch's lazy imports, the workload built, an empty disk
cache directory), then times ``hloalias.compile`` (CPU, the process's).

    .venv/bin/python -m bench.cia_store_ab seed,donate --pairs 6 --base d13e67b
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(key: str, mode: str, base: str) -> None:
    sys.path.insert(0, REPO)
    import hloalias
    from bench import workloads
    from bench.latency import _TORCH_LAZY_IMPORTS
    from hloalias.frontend import torch_internals
    from hloalias.runtime import disk_cache, export_cache, pjrt  # noqa: F401 - as the latency child
    from hloalias.runtime.ownership import torch_to_device  # noqa: F401

    for name in _TORCH_LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    if mode == "old":
        source = subprocess.run(["git", "show", f"{base}:frontend/torch_internals.py"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout
        old = types.ModuleType("hloalias_old_torch_internals")
        exec(compile(source, "old_torch_internals.py", "exec"), old.__dict__)
        torch_internals.materialize_cia_ops_once = old.materialize_cia_ops_once  # type: ignore[attr-defined]
    workload = workloads.build(key, 2)
    gc.collect()
    start, start_cpu = time.perf_counter(), time.process_time()
    hloalias.compile(workload.module, workload.args, donate=workload.donate)
    print("AB " + json.dumps({"wall": time.perf_counter() - start, "cpu": time.process_time() - start_cpu,
                              "load": os.getloadavg()[0]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workloads")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--base", default="main")
    parser.add_argument("--child")
    parser.add_argument("--mode")
    options = parser.parse_args()
    if options.child:
        child(options.child, options.mode, options.base)
        return
    results: dict[str, dict[str, list[float]]] = {}
    for index in range(options.pairs):
        for key in options.workloads.split(","):
            order = ("old", "new") if index % 2 == 0 else ("new", "old")
            for mode in order:
                with tempfile.TemporaryDirectory(prefix="hloalias-ab-cache-") as cache:
                    env = dict(os.environ, HLOALIAS_CACHE_DIR=cache, PYTHONPATH=REPO)
                    done = subprocess.run([sys.executable, "-m", "bench.cia_store_ab", options.workloads,
                                           "--child", key, "--mode", mode, "--base", options.base],
                                          cwd=REPO, env=env, capture_output=True, text=True)
                line = [x for x in done.stdout.splitlines() if x.startswith("AB ")]
                if not line:
                    print(done.stderr[-2000:], file=sys.stderr)
                    continue
                data = json.loads(line[-1][3:])
                results.setdefault(key, {}).setdefault(mode, []).append(data["cpu"])
                print(f"pair {index + 1} {key} {mode}: cpu {data['cpu'] * 1e3:.1f} ms, wall {data['wall'] * 1e3:.1f} ms, "
                      f"load {data['load']:.1f}", flush=True)
    for key, modes in results.items():
        old, new = modes.get("old", []), modes.get("new", [])
        pairs = list(zip(old, new))
        print(f"{key}: old median {statistics.median(old) * 1e3:.1f} ms, new median {statistics.median(new) * 1e3:.1f} ms, "
              f"median paired difference {statistics.median(n - o for o, n in pairs) * 1e3:+.1f} ms "
              f"({sum(n < o for o, n in pairs)} of {len(pairs)} pairs new faster)")


if __name__ == "__main__":
    main()
