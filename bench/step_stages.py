"""The HF training step's compile against its forward's, stage by stage,
and two capture variants that were measured and not kept (issue 26, "a
training step ≤ 2× the forward compile"; figures in
``bench/RESULTS-latency.md``, session 48, branch ``stepcut``).

From the repository root::

    .venv/bin/python -m bench.step_stages stages [N]            # N fresh processes (default 3)
    .venv/bin/python -m bench.step_stages variant layout [PAIRS]
    .venv/bin/python -m bench.step_stages variant torch-fn [PAIRS]

``stages``: each process is ``bench.latency``'s ``hf_training`` ratio child
(2-layer HF Llama, AdamW, batch 2×16, every cache off): the forward compile
of the model, then ``compile_training_step``; per stage the CPU time
(``time.process_time``, every thread; stages inclusive, wrapped as
:mod:`bench.latency` wraps them, plus the capture's own sub-stages as
:mod:`bench.step_capture_ab` has them).

``variant``: in one process, ``capture_training_step`` of that step
alternated between the capture as it is and a variant (``PAIRS`` pairs,
order flipped every pair, after one warm-up capture), CPU per capture and
the paired differences; then both compile the whole step and the two
final modules' program keys are compared.  ``layout``: ``t``,
``transpose.int``, ``detach`` and ``_unsafe_view`` left out of the
capture's decomposition table (recorded as they are, lowered by
torch-mlir).  ``torch-fn``: ``make_fx``'s ``TorchFunctionMetadataMode``
off (``_disable_torch_fn_metadata_mode=True``; it records
``node.meta["torch_fn"]``, which nothing here reads).  Neither changes
hloalias; each is patched in from here."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _problem() -> tuple[Any, Any, Any, Callable[[Any], Any]]:
    import torch
    import transformers

    from bench.latency import LLAMA

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": 2}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (2, 16))

    def lm_step(ids: Any) -> Any:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return model, optimizer, ids, lm_step


def stages_child() -> dict[str, Any]:
    os.environ["HLOALIAS_CACHE"] = "0"
    import torch

    import hloalias
    from bench.latency import StageTimer, _instrument
    from hloalias.frontend import training as frontend_training
    from hloalias.runtime import training as runtime_training

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
    hloalias.compile(lambda t: t + 1, (torch.randn(4),))  # first-use costs paid outside both
    model, optimizer, ids, lm_step = _problem()
    result: dict[str, Any] = {"load": os.getloadavg()[0]}
    runs: list[tuple[str, Callable[[], Any]]] = [
        ("forward", lambda: hloalias.compile(model.eval(), (ids,))),
        ("step", lambda: hloalias.compile_training_step(lm_step, model.train(), optimizer, (ids,))),
    ]
    for name, run in runs:
        timer.seconds = {}
        start, start_cpu = time.perf_counter(), time.process_time()
        run()
        stages = {k: round(v * 1e3, 1) for k, v in timer.seconds.items()}
        stages["total_cpu"] = round((time.process_time() - start_cpu) * 1e3, 1)
        stages["total_wall"] = round((time.perf_counter() - start) * 1e3, 1)
        result[name] = stages
    return result


def stages(processes: int) -> None:
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("HLOALIAS_CACHE", None)
    rows = []
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    for _ in range(processes):
        done = subprocess.run([sys.executable, "-m", "bench.step_stages", "--stages-child"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=1800)
        lines = [line for line in done.stdout.splitlines() if line.startswith("STAGES ")]
        if not lines:
            raise RuntimeError(f"child failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(lines[-1][len("STAGES "):]))
        print(lines[-1], flush=True)
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    for which in ("forward", "step"):
        names = list(dict.fromkeys(k for row in rows for k in row[which]))
        for name in names:
            print(f"{which} {name}: " + " / ".join(f"{row[which].get(name, 0.0):,.0f}" for row in rows) + " ms")
    print("step ÷ forward (CPU): " + " / ".join(
        f"{row['step']['total_cpu'] / row['forward']['total_cpu']:.2f}" for row in rows))


def variant(which: str, pairs: int) -> None:
    os.environ["HLOALIAS_CACHE"] = "0"
    import torch

    import hloalias
    from hloalias.frontend import importer
    from hloalias.frontend import training as frontend_training

    hloalias.compile(lambda t: t + 1, (torch.randn(4),))
    model, optimizer, ids, lm_step = _problem()
    model.train()
    make_fx, table, late = (frontend_training.make_fx, frontend_training._decomposition_table_with_custom_ops,
                            frontend_training.late_registered_entries)
    aten = torch.ops.aten
    layout = (aten.t.default, aten.transpose.int, aten.detach.default, aten._unsafe_view.default)
    reduced = {op: entry for op, entry in table().items() if op not in layout}

    def use(on: bool) -> None:
        frontend_training.make_fx = make_fx
        frontend_training._decomposition_table_with_custom_ops = table
        frontend_training.late_registered_entries = late
        if on and which == "layout":
            frontend_training._decomposition_table_with_custom_ops = lambda: reduced
            # Not a late-registered entry: left out on purpose (no second trace).
            frontend_training.late_registered_entries = lambda t, g: {
                op: e for op, e in importer.late_registered_entries(t, g).items() if op not in layout}
        elif on and which == "torch-fn":
            frontend_training.make_fx = functools.partial(make_fx, _disable_torch_fn_metadata_mode=True)

    def capture() -> float:
        start = time.process_time()
        frontend_training.capture_training_step(lm_step, model, optimizer, (ids,))
        return time.process_time() - start

    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    use(False)
    capture()  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for index in range(pairs):
        for on in (False, True) if index % 2 == 0 else (True, False):
            use(on)
            times[on].append(capture())
    for on, label in ((False, "as is"), (True, which)):
        print(f"{label}: capture CPU ms " + " / ".join(f"{t * 1e3:.0f}" for t in times[on])
              + f" (med {statistics.median(times[on]) * 1e3:.0f})")
    paired = [(new - old) * 1e3 for old, new in zip(times[False], times[True])]
    print(f"paired {which} - as is (ms): " + " / ".join(f"{d:+.0f}" for d in paired)
          + f"; median {statistics.median(paired):+.0f}, {which} faster in {sum(d < 0 for d in paired)} of {pairs}")
    keys = []
    for on in (False, True):
        use(on)
        hloalias.clear_cache()
        keys.append(hloalias.compile_training_step(lm_step, model, optimizer, (ids,)).executable.cache_key)
    use(False)
    print(f"same program key: {keys[0] == keys[1]}")
    print(f"uptime: {os.popen('uptime').read().strip()}", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--stages-child"]:
        print("STAGES " + json.dumps(stages_child()), flush=True)
    elif sys.argv[1:2] == ["stages"]:
        stages(int(sys.argv[2]) if len(sys.argv) > 2 else 3)
    elif sys.argv[1:2] == ["variant"] and len(sys.argv) > 2 and sys.argv[2] in ("layout", "torch-fn"):
        variant(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 10)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
