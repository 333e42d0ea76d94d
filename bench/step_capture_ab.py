"""Same-window A/B of a training step's compile before XLA (capture,
import, passes, printing) between two source trees; figures go to
``bench/RESULTS-latency.md`` by hand.

From the repository root::

    git archive main | tar -x -C /tmp/old    # the tree to compare against
    .venv/bin/python -m bench.step_capture_ab --old /tmp/old --reps 3

Each run is a fresh process on one tree (``--tree``: the editable install's
package mapping pointed at it before ``hloalias`` is imported); runs
alternate old, new, new, old, old, new...  A run compiles the workload's
forward (first-use costs outside the step), then ``compile_training_step``
``--captures`` times on the same model and optimizer, every cache off
(``HLOALIAS_CACHE=0``; the in-process caches cleared between compiles).
Reported per compile: CPU seconds (``time.process_time``, every thread) of
the whole compile and of its stages (inclusive, wrapped as in
:mod:`bench.latency`, CPU not wall); ``pre_xla`` is the whole minus the
XLA compile.  Workloads: ``hf`` (the 2-layer HF Llama step of
``bench.latency``'s ``hf_training`` ratio, AdamW) and ``mlp`` (its
``training`` ratio's 3-layer MLP, AdamW)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _point_install_at(tree: str) -> None:
    """Import ``hloalias`` from ``tree`` (same layout as this repository)."""
    finder = next((m for m in sys.modules if m.startswith("__editable___hloalias")), None)
    if finder is None:
        raise RuntimeError("no editable hloalias install in this interpreter")
    module = sys.modules[finder]
    mapping = module.MAPPING
    for name, path in mapping.items():
        mapping[name] = os.path.join(tree, os.path.relpath(path, REPO))
    # Ahead of the path finder, which would find this repository's
    # ``hloalias`` (on PYTHONPATH for ``bench``) first.
    sys.meta_path.remove(module._EditableFinder)
    sys.meta_path.insert(0, module._EditableFinder)


def child(tree: str, workload: str, captures: int) -> dict[str, Any]:
    _point_install_at(tree)
    os.environ["HLOALIAS_CACHE"] = "0"
    import torch

    import hloalias
    from bench.latency import LLAMA, StageTimer, _instrument
    from hloalias.frontend import training as frontend_training
    from hloalias.runtime import training as runtime_training

    assert frontend_training.__file__.startswith(tree + os.sep), frontend_training.__file__

    class CpuTimer(StageTimer):
        @contextlib.contextmanager
        def stage(self, name: str) -> Iterator[None]:
            start = time.process_time()
            try:
                yield
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.process_time() - start

    timer = CpuTimer()
    _instrument(timer)
    runtime_training.capture_training_step = timer.wrap("capture", runtime_training.capture_training_step)
    make_fx = frontend_training.make_fx
    frontend_training.make_fx = lambda *a, **k: timer.wrap("capture.make_fx", make_fx(*a, **k))
    frontend_training.expand_replayed_updates = timer.wrap(
        "capture.replay_expand", frontend_training.expand_replayed_updates)
    frontend_training._exported_from_graph = timer.wrap(
        "capture.exported_program", frontend_training._exported_from_graph)
    hloalias.compile(lambda t: t + 1, (torch.randn(4),))  # first-use costs paid outside
    torch.manual_seed(0)
    if workload == "hf":
        import transformers

        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": 2}))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch: tuple[Any, ...] = (torch.randint(0, 256, (2, 16)),)

        def step(ids: torch.Tensor) -> torch.Tensor:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss
    else:
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                    torch.nn.ReLU(), torch.nn.Linear(512, 10))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = (torch.randn(64, 256), torch.randint(0, 10, (64,)))

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[misc]
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

    hloalias.compile(model.eval(), batch[:1])
    model.train()
    result: dict[str, Any] = {"tree": tree, "workload": workload, "load": os.getloadavg()[0], "compiles": []}
    expected = None
    for _ in range(captures):
        hloalias.clear_cache()
        timer.seconds = {}
        start = time.process_time()
        train = hloalias.compile_training_step(step, model, optimizer, batch)
        total = time.process_time() - start
        stages = {k: round(v, 4) for k, v in timer.seconds.items()}
        stages["total"] = round(total, 4)
        stages["pre_xla"] = round(total - timer.seconds.get("xla_compile", 0.0), 4)
        result["compiles"].append(stages)
        # Same program every time: compare the final modules' keys.
        key = train.executable.cache_key
        expected = key if expected is None else expected
        stages["same_key"] = key == expected
    return result


def run_child(tree: str, workload: str, captures: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("HLOALIAS_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-m", "bench.step_capture_ab", "--child", "--tree", tree, "--workload", workload,
         "--captures", str(captures)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("STEPCAP ")]
    if not lines:
        raise RuntimeError(f"child failed:\n{done.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(lines[-1][len("STEPCAP "):])
    return data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--tree", default=REPO)
    parser.add_argument("--old", help="the tree to compare against")
    parser.add_argument("--workload", default="hf", choices=("hf", "mlp"))
    parser.add_argument("--captures", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.child:
        print("STEPCAP " + json.dumps(child(os.path.abspath(args.tree), args.workload, args.captures)))
        return
    if not args.old:
        parser.error("--old TREE is required")
    order = []
    for rep in range(args.reps):
        order += [("old", "new"), ("new", "old")][rep % 2]
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    for which in order:
        tree = os.path.abspath(args.old) if which == "old" else REPO
        data = run_child(tree, args.workload, args.captures)
        runs[which].append(data)
        summary = " | ".join(
            f"#{i + 1} capture {c.get('capture', 0):.3f} pre_xla {c['pre_xla']:.3f} total {c['total']:.3f}"
            for i, c in enumerate(data["compiles"]))
        print(f"{which} load {data['load']:.1f}: {summary}", flush=True)
        print("   " + json.dumps(data["compiles"]), flush=True)
    for which, datas in runs.items():
        for index in range(args.captures):
            for stage in ("capture", "pre_xla", "total"):
                values = [d["compiles"][index].get(stage, 0.0) for d in datas]
                print(f"median {which} compile #{index + 1} {stage}: {statistics.median(values):.3f} s "
                      f"({', '.join(f'{v:.3f}' for v in values)})")
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)


if __name__ == "__main__":
    main()
