"""Host memory over many distinct compiles, and after a dropped compiled
program: where the growth goes (figures to ``bench/RESULTS-runtime.md`` by
hand, section "Host memory over many compiles").

From the repository root::

    .venv/bin/python -m bench.memory_growth growth --compiles 1000 --reps 2
    .venv/bin/python -m bench.memory_growth dropped

``growth``: processes alternate ``old`` / ``new``; each compiles
``--compiles`` distinct programs (new input lengths: new tensor types
every import), drops each executable, and reports VmRSS at 250-compile
checkpoints, then after ``gc.collect()`` and after ``malloc_trim(0)``, the
MLIR contexts alive and the pool's count of those made, the objects the
collector tracks and the full collections that ran.  ``old`` =
``frontend/tracing_lock.py`` freezing as before the branch ``memgrow``
(``gc.freeze()``/``gc.unfreeze()`` alone), ``new`` = as it is.
``--program view`` (outputs are views of the input: no XLA compile) or
``compute`` (``x * 2 + 1``: an XLA executable per compile).

``dropped``: one process compiles a 4-layer 1024-wide MLP (16 MiB of
weights) on a new batch size several times (a new module object each
time: a new import, XLA compile and executable), drops every reference, and reports VmRSS at each step,
after ``gc.collect()`` and after ``malloc_trim(0)``."""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_kib() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _trim() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def _old_freezing() -> None:
    """The freezing before the branch: no young collection first, full
    collections free to run frozen."""
    from hloalias.frontend import tracing_lock

    def freeze() -> None:
        tracing_lock._frozen = True
        gc.freeze()

    def unfreeze() -> None:
        if tracing_lock._frozen:
            tracing_lock._frozen = False
            gc.unfreeze()

    tracing_lock._freeze = freeze  # type: ignore[assignment]
    tracing_lock._unfreeze = unfreeze  # type: ignore[assignment]


def growth_child(setting: str, compiles: int, program_kind: str) -> dict[str, Any]:
    os.environ["HLOALIAS_CACHE"] = "0"
    import torch
    from torch_mlir import ir

    import hloalias
    from hloalias.mlir import CONTEXT_POOL

    if setting == "old":
        _old_freezing()

    def view(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x[0:8].view(2, 4)

    def compute(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    program = view if program_kind == "view" else compute
    hloalias.compile(program, (torch.randn(16),))
    full_before = gc.get_stats()[2]["collections"]
    checkpoints: dict[int, int] = {}
    start = time.process_time()
    for index in range(compiles):
        hloalias.clear_cache()
        x = torch.randn(16 + index)
        exe = hloalias.compile(program, (x,))
        outputs = exe(x)
        expected = view(x) if program_kind == "view" else (x * 2 + 1,)
        for got, want in zip(outputs if isinstance(outputs, tuple) else (outputs,), expected):
            if not torch.allclose(got, want):
                raise AssertionError(f"compile {index} differs from eager")
        del exe, outputs
        if (index + 1) % 250 == 0:
            checkpoints[index + 1] = _rss_kib()
    cpu = time.process_time() - start
    full = gc.get_stats()[2]["collections"] - full_before
    contexts_alive = ir.Context._get_live_count()
    tracked = len(gc.get_objects())
    end = _rss_kib()
    gc.collect()
    after_gc = _rss_kib()
    contexts_after_gc = ir.Context._get_live_count()
    _trim()
    return {"setting": setting, "program": program_kind, "rss_kib": checkpoints, "end_kib": end,
            "after_gc_kib": after_gc, "after_trim_kib": _rss_kib(), "contexts_made": CONTEXT_POOL.created,
            "contexts_alive": contexts_alive, "contexts_alive_after_gc": contexts_after_gc,
            "tracked_objects": tracked, "full_collections": full, "cpu_s": round(cpu, 2),
            "load": os.getloadavg()[0]}


def dropped_child(rounds: int) -> dict[str, Any]:
    os.environ["HLOALIAS_CACHE"] = "0"
    import torch

    import hloalias

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(1024, 1024) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    steps: list[dict[str, Any]] = []
    warm = hloalias.compile(Block(), (torch.randn(4, 1024),))  # imports, backends set up
    del warm
    hloalias.clear_cache()
    gc.collect()
    _trim()
    steps.append({"step": "start (after one compile, dropped)", "rss_kib": _rss_kib()})
    for index in range(rounds):
        hloalias.clear_cache()
        model = Block()  # a new object: no import is reused
        x = torch.randn(8 + index, 1024)
        exe = hloalias.compile(model, (x,))
        exe(x)
        steps.append({"step": f"compiled {index}", "rss_kib": _rss_kib()})
        del exe, model, x
        hloalias.clear_cache()
        steps.append({"step": f"dropped {index}", "rss_kib": _rss_kib()})
        gc.collect()
        steps.append({"step": f"gc {index}", "rss_kib": _rss_kib()})
        _trim()
        steps.append({"step": f"trim {index}", "rss_kib": _rss_kib()})
    from hloalias.runtime import export_cache

    export_cache.clear_export_cache()
    gc.collect()
    _trim()
    steps.append({"step": "export cache cleared, gc, trim", "rss_kib": _rss_kib()})
    return {"steps": steps, "load": os.getloadavg()[0]}


def _run_child(*args: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, "-m", "bench.memory_growth", "--child", *args],
                          capture_output=True, text=True, env=env, cwd=REPO, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("growth", "dropped"))
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--setting", default="new", choices=("old", "new"))
    parser.add_argument("--program", default="view", choices=("view", "compute"))
    parser.add_argument("--compiles", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.child:
        if args.mode == "growth":
            print(json.dumps(growth_child(args.setting, args.compiles, args.program)))
        else:
            print(json.dumps(dropped_child(args.rounds)))
        return
    print(f"start {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()}", flush=True)
    if args.mode == "growth":
        for _ in range(args.reps):
            for setting in ("old", "new"):
                print(json.dumps(_run_child("growth", "--setting", setting, "--compiles", str(args.compiles),
                                            "--program", args.program)), flush=True)
    else:
        print(json.dumps(_run_child("dropped", "--rounds", str(args.rounds))), flush=True)
    print(f"end {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
