"""Where a cold first compile's time goes: py-spy samples of the first
``hloalias.compile`` of a workload in fresh processes, aggregated.

From the repository root (needs ``py-spy`` in the venv: ``pip install py-spy``)::

    .venv/bin/python -m bench.cold_profile seed --runs 12
    .venv/bin/python -m bench.cold_profile seed --runs 12 --under _decomposition_table_with_custom_ops

Each run is a fresh process that does what ``bench.latency``'s child does
before its timed compile (imports, torch's lazy imports, the workload
built, an empty disk cache), then compiles once under ``py-spy record``
(raw stacks, non-blocking sampling).  Printed: the share of the compile's
samples under each function (inclusive), or, with ``--under NAME``, the
share under each call path below the frame ``NAME`` (``--depth`` frames
deep).  Shares, not times: sampling and load inflate the absolute figures.
``--keep DIR`` keeps the raw files."""

from __future__ import annotations

import argparse
import collections
import glob
import importlib
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "COLD_COMPILE"  # the function (qualified name's end) the aggregation keeps samples under


def child(key: str, gpt2_layers: int) -> None:
    sys.path.insert(0, REPO)
    import hloalias
    from bench import workloads
    from bench.latency import _TORCH_LAZY_IMPORTS
    from hloalias.runtime import disk_cache, export_cache, pjrt  # noqa: F401 - as the latency child
    from hloalias.runtime.ownership import torch_to_device  # noqa: F401

    for name in _TORCH_LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    workload = workloads.build(key, gpt2_layers)

    def COLD_COMPILE() -> object:  # noqa: N802 - found by name in the samples
        return hloalias.compile(workload.module, workload.args, donate=workload.donate)

    start = time.process_time()
    COLD_COMPILE()
    print(f"cpu {(time.process_time() - start) * 1e3:.1f} ms", flush=True)


def _frame(text: str) -> str:
    """``function (file:line)`` -> ``function (file)``, the file relative."""
    name, _, where = text.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def aggregate(files: list[str], under: str | None, depth: int) -> tuple[int, collections.Counter[str]]:
    shares: collections.Counter[str] = collections.Counter()
    total = 0
    for path in files:
        with open(path) as handle:
            for line in handle:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                frames = stack.split(";")
                marks = [i for i, frame in enumerate(frames) if frame.split(" (")[0].endswith(MARK)]
                if not marks:
                    continue
                samples = int(count)
                total += samples
                below = frames[marks[0] + 1:]
                if under is None:
                    for frame in dict.fromkeys(_frame(f) for f in below):
                        shares[frame] += samples
                    continue
                roots = [i for i, frame in enumerate(below) if frame.startswith(under + " ")]
                if roots:
                    path_below = below[roots[0] + 1:roots[0] + 1 + depth]
                    shares[" > ".join(_frame(f) for f in path_below) or "(self)"] += samples
    return total, shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--gpt2-layers", type=int, default=2)
    parser.add_argument("--under")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--keep")
    parser.add_argument("--child", action="store_true")
    options = parser.parse_args()
    if options.child:
        child(options.workload, options.gpt2_layers)
        return
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    folder = options.keep or tempfile.mkdtemp(prefix="hloalias-cold-profile-")
    os.makedirs(folder, exist_ok=True)
    for run in range(options.runs):
        with tempfile.TemporaryDirectory(prefix="hloalias-cold-profile-cache-") as cache:
            env = dict(os.environ, HLOALIAS_CACHE_DIR=cache, PYTHONPATH=REPO)
            out = os.path.join(folder, f"{options.workload}-{run}.txt")
            done = subprocess.run(
                [spy, "record", "--nonblocking", "-r", str(options.rate), "-f", "raw", "-o", out, "--",
                 sys.executable, "-m", "bench.cold_profile", options.workload, "--child",
                 "--gpt2-layers", str(options.gpt2_layers)],
                cwd=REPO, env=env, capture_output=True, text=True)
            cpu = [line for line in done.stdout.splitlines() if line.startswith("cpu ")]
            print(f"run {run + 1}: {cpu[-1] if cpu else done.stderr[-500:]} (load {os.getloadavg()[0]:.1f})")
    total, shares = aggregate(sorted(glob.glob(os.path.join(folder, f"{options.workload}-*.txt"))),
                              options.under, options.depth)
    print(f"{total} samples in the compile")
    for name, count in shares.most_common(options.top):
        print(f"{100 * count / max(total, 1):5.1f}%  {name}")


if __name__ == "__main__":
    main()
