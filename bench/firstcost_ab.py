"""The first compile in a fresh process, A/B between two versions of
``frontend/tracing_lock.py``, with the garbage collections inside it
(branch ``firstcost``; figures to ``bench/RESULTS-latency.md``, section
"firstcost").

From the repository root::

    .venv/bin/python -m bench.firstcost_ab --base 3a5621d --reps 4 seed donate

Each rep runs, per workload, one fresh process with ``old`` (the
``tracing_lock.py`` of ``--base``, loaded from git and put in place of this
tree's wherever ``tracing`` was imported) and one with ``new`` (this tree),
the order flipped every rep.  A child does what ``bench.latency``'s does
before its timed compile (imports, torch's lazy imports, the workload
built, an empty disk cache, ``gc.collect()``), then times the first
``hloalias.compile`` in CPU time (``time.process_time()``, every thread)
and records every garbage collection that starts inside it through
``gc.callbacks``: its generation, CPU time, and whether a trace held the
tracing lock then.  ``--plain``: as a user's script instead (no lazy
imports first, no collection before the compile).  ``--warm N`` adds N warm compiles after it (a new
object each, every cache off): their median and collections."""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _use_old_tracing_lock(path: str) -> None:
    """Put the ``tracing`` of the file at ``path`` where this tree's is used."""
    from hloalias.frontend import importer, shape_specialization, training, tracing_lock

    spec = importlib.util.spec_from_file_location("hloalias.frontend._old_tracing_lock", path)
    assert spec is not None and spec.loader is not None
    old: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    for module in (importer, shape_specialization, training):
        module.tracing = old.tracing  # type: ignore[attr-defined]
    tracing_lock.tracing = old.tracing  # type: ignore[assignment]
    tracing_lock.TRACING_LOCK = old.TRACING_LOCK


class _Collections:
    """Every collection started while :attr:`on`: (generation, CPU ms, in a trace)."""

    def __init__(self) -> None:
        self.on = False
        self.log: list[tuple[int, float, bool]] = []
        self.where: list[dict[str, Any]] = []
        self._start = 0.0
        self.t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._start = time.process_time()
            return
        from hloalias.frontend import tracing_lock

        held = tracing_lock.TRACING_LOCK._is_owned()  # type: ignore[attr-defined]
        self.log.append((info["generation"], (time.process_time() - self._start) * 1e3, held))
        if info["generation"] == 2:
            frame = sys._getframe(1)
            where = []
            while frame is not None and len(where) < 40:
                code = frame.f_code
                if "hloalias" in code.co_filename or "wt-" in code.co_filename:
                    where.append(f"{os.path.basename(code.co_filename)}:{code.co_name}")
                frame = frame.f_back
            self.where.append({"at_ms": round((self._start - self.t0) * 1e3, 1),
                               "collected": info["collected"], "stack": where[:6]})

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for generation in (0, 1, 2):
            times = [ms for g, ms, _ in self.log if g == generation]
            out[f"gen{generation}"] = [len(times), round(sum(times), 2)]
        out["full"] = [[round(ms, 1), "trace" if held else "outside"] for g, ms, held in self.log if g == 2]
        out["full_where"] = self.where
        return out


def child(setting: str, key: str, base_file: str, warm: int, plain: bool) -> dict[str, Any]:
    sys.path.insert(0, REPO)
    import hloalias
    from bench import workloads
    from bench.latency import _TORCH_LAZY_IMPORTS
    from hloalias.runtime import disk_cache, export_cache, pjrt  # noqa: F401 - as the latency child
    from hloalias.runtime.ownership import torch_to_device  # noqa: F401

    for name in () if plain else _TORCH_LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    if setting == "old":
        _use_old_tracing_lock(base_file)
    workload = workloads.build(key, 2)
    collections = _Collections()
    gc.callbacks.append(collections)
    if not plain:
        gc.collect()
    tracked = len(gc.get_objects())
    collections.on = True
    start = collections.t0 = time.process_time()
    if plain:  # the tracing libraries' imports, timed apart (the same code in old and new)
        from hloalias.frontend.tracing_modules import load_tracing_modules

        load_tracing_modules()
        loaded = time.process_time()
    hloalias.compile(workload.module, workload.args, donate=workload.donate)
    first = (time.process_time() - start) * 1e3
    collections.on = False
    result: dict[str, Any] = {"setting": setting, "workload": key, "first_ms": round(first, 2),
                              "tracked_before": tracked, "first_gc": collections.summary(),
                              "load": os.getloadavg()[0]}
    if plain:
        result["tracing_imports_ms"] = round((loaded - start) * 1e3, 2)
        result["after_imports_ms"] = round(first - (loaded - start) * 1e3, 2)
    # What the first compile left for the collector: the next full
    # collection, run now (not part of the compile's time).
    start = time.process_time()
    gc.collect()
    result["gc_after_ms"] = round((time.process_time() - start) * 1e3, 2)
    if warm:
        os.environ["HLOALIAS_CACHE"] = "0"
        collections.log = []
        collections.on = True
        times = []
        for _ in range(warm):
            hloalias.clear_cache()
            export_cache.clear_export_cache()
            workload = workloads.build(key, 2)
            start = time.process_time()
            hloalias.compile(workload.module, workload.args, donate=workload.donate)
            times.append((time.process_time() - start) * 1e3)
        collections.on = False
        result["warm_median_ms"] = round(statistics.median(times), 2)
        result["warm_gc"] = collections.summary()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=["seed"])
    parser.add_argument("--base", default="3a5621d")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warm", type=int, default=0)
    parser.add_argument("--plain", action="store_true",
                        help="as a user's script: no lazy imports first, no gc.collect() before the compile")
    parser.add_argument("--child", nargs=3, metavar=("SETTING", "WORKLOAD", "BASE_FILE"))
    options = parser.parse_args()
    if options.child:
        setting, key, base_file = options.child
        print("FIRSTCOST " + json.dumps(child(setting, key, base_file, options.warm, options.plain)), flush=True)
        return
    source = subprocess.run(["git", "show", f"{options.base}:frontend/tracing_lock.py"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="hloalias-firstcost-") as folder:
        base_file = os.path.join(folder, "old_tracing_lock.py")
        with open(base_file, "w") as handle:
            handle.write(source)
        results: list[dict[str, Any]] = []
        for rep in range(options.reps):
            for key in options.workloads:
                for setting in ("old", "new") if rep % 2 == 0 else ("new", "old"):
                    cache = tempfile.mkdtemp(dir=folder)
                    env = dict(os.environ, HLOALIAS_CACHE_DIR=cache, PYTHONPATH=REPO)
                    env.pop("HLOALIAS_CACHE", None)
                    done = subprocess.run(
                        [sys.executable, "-m", "bench.firstcost_ab", "--warm", str(options.warm),
                         *(["--plain"] if options.plain else []),
                         "--child", setting, key, base_file], cwd=REPO, env=env, capture_output=True,
                        text=True)
                    lines = [line for line in done.stdout.splitlines() if line.startswith("FIRSTCOST ")]
                    if not lines:
                        raise RuntimeError(done.stderr[-3000:])
                    data = json.loads(lines[-1][len("FIRSTCOST "):])
                    data["rep"] = rep
                    results.append(data)
                    print(json.dumps(data), flush=True)
        for key in options.workloads:
            for setting in ("old", "new"):
                firsts = [r["first_ms"] for r in results if r["workload"] == key and r["setting"] == setting]
                print(f"{key} {setting}: first median {statistics.median(firsts):.1f} ms {firsts}")


if __name__ == "__main__":
    main()
