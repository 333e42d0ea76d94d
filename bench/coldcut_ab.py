"""Same-window A/B of the stored preservable-CIA sets, one entry per
operator registry (issue 26, cold first compile; branch ``coldcut``,
session 48; figures in ``bench/RESULTS-latency.md``): fresh processes
alternating ``old`` (``runtime/program_cache.py`` of ``--base`` executed
over the tree's, which installs its single-entry store) and ``new`` (the
tree's).  Each child does what ``bench.latency``'s cold child does before
its timed compile (imports, torch's lazy imports, the workload built, an
empty disk cache directory, ``gc.collect()``), then times
``hloalias.compile`` (CPU, the process's) and counts torch's walks for the
CIA set.  The per-user entries live beside the cache's key: by default the
user's (shared with every other hloalias process of the account, as a
user's are); ``--key-file PATH`` gives both versions a private one.

    .venv/bin/python -m bench.coldcut_ab seed,donate --pairs 5 --base 755e6f2
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
    from hloalias.runtime import disk_cache, export_cache, pjrt, program_cache  # noqa: F401 - as the latency child
    from hloalias.runtime.ownership import torch_to_device  # noqa: F401

    for name in _TORCH_LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    if mode == "old":  # the base's module body installs its store over the tree's
        source = subprocess.run(["git", "show", f"{base}:runtime/program_cache.py"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout
        old = types.ModuleType("hloalias_old_program_cache")
        sys.modules[old.__name__] = old  # its dataclasses look their module up
        exec(compile(source, "old_program_cache.py", "exec"), old.__dict__)
    import torch._export.utils as export_utils

    walks = []
    original = export_utils._collect_all_valid_cia_ops
    collectors = [importlib.import_module(name) for name in ("torch._export.utils", "torch.export.decomp_utils",
                                                               "torch.export.exported_program")]

    def counted() -> object:
        walks.append(1)
        return original()

    for module in collectors:
        if getattr(module, "_collect_all_valid_cia_ops", None) is original:
            module._collect_all_valid_cia_ops = counted  # type: ignore[attr-defined]
    # The decomposition table's first build (where the walk falls), CPU.
    from hloalias.frontend import importer

    table_cpu = []
    built = importer._decomposition_table

    def timed_table() -> object:
        start = time.process_time()
        try:
            return built()
        finally:
            table_cpu.append(time.process_time() - start)

    importer._decomposition_table = timed_table  # type: ignore[assignment]
    workload = workloads.build(key, 2)
    gc.collect()
    start, start_cpu = time.perf_counter(), time.process_time()
    hloalias.compile(workload.module, workload.args, donate=workload.donate)
    print("AB " + json.dumps({"wall": time.perf_counter() - start, "cpu": time.process_time() - start_cpu,
                              "walks": len(walks), "table": table_cpu[0] if table_cpu else 0.0,
                              "load": os.getloadavg()[0]}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workloads")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--base", default="main")
    parser.add_argument("--key-file")
    parser.add_argument("--child")
    parser.add_argument("--mode")
    options = parser.parse_args()
    if options.child:
        child(options.child, options.mode, options.base)
        return
    results: dict[str, dict[str, list[tuple[float, int]]]] = {}
    tables: dict[str, dict[str, list[float]]] = {}
    for index in range(options.pairs):
        for key in options.workloads.split(","):
            order = ("old", "new") if index % 2 == 0 else ("new", "old")
            for mode in order:
                with tempfile.TemporaryDirectory(prefix="hloalias-ab-cache-") as cache:
                    env = dict(os.environ, HLOALIAS_CACHE_DIR=cache, PYTHONPATH=REPO)
                    env.pop("HLOALIAS_CACHE", None)
                    if options.key_file:
                        env["HLOALIAS_CACHE_KEY_FILE"] = options.key_file
                    done = subprocess.run([sys.executable, "-m", "bench.coldcut_ab", options.workloads,
                                           "--child", key, "--mode", mode, "--base", options.base],
                                          cwd=REPO, env=env, capture_output=True, text=True)
                line = [x for x in done.stdout.splitlines() if x.startswith("AB ")]
                if not line:
                    print(done.stderr[-2000:], file=sys.stderr)
                    continue
                data = json.loads(line[-1][3:])
                results.setdefault(key, {}).setdefault(mode, []).append((data["cpu"], data["walks"]))
                tables.setdefault(key, {}).setdefault(mode, []).append(data["table"])
                print(f"pair {index + 1} {key} {mode}: cpu {data['cpu'] * 1e3:.1f} ms, wall {data['wall'] * 1e3:.1f} ms, "
                      f"table {data['table'] * 1e3:.1f} ms, "
                      f"walks {data['walks']}, load {data['load']:.1f}", flush=True)
    for key, modes in results.items():
        old, new = [c for c, _ in modes.get("old", [])], [c for c, _ in modes.get("new", [])]
        pairs = list(zip(old, new))
        print(f"{key}: old median {statistics.median(old) * 1e3:.1f} ms (walked {sum(w for _, w in modes['old'])} "
              f"of {len(old)}), new median {statistics.median(new) * 1e3:.1f} ms (walked "
              f"{sum(w for _, w in modes['new'])} of {len(new)}), median paired difference "
              f"{statistics.median(n - o for o, n in pairs) * 1e3:+.1f} ms ({sum(n < o for o, n in pairs)} of "
              f"{len(pairs)} pairs new faster); table's first build old median "
              f"{statistics.median(tables[key]['old']) * 1e3:.1f} ms, new {statistics.median(tables[key]['new']) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
