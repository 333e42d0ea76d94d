"""In-process paired A/B of the single trace's torch adapter (branch ``seedfx``).

    .venv/bin/python -m bench.seed_trace_ab OLD_TORCH_INTERNALS_PY seed|hf PAIRS

Per compile, ``frontend/fx_export.py`` uses either the ``torch_internals``
module loaded from ``OLD_TORCH_INTERNALS_PY`` (another checkout's
``frontend/torch_internals.py``, with a no-op ``module_patches_skipped`` where
it has none: the trace as that checkout runs it) or this checkout's; old and
new alternate, the order flipped every pair.  Every cache off
(``HLOALIAS_CACHE=0``, ``hloalias.clear_cache()``), a new module object per
compile; CPU time (``time.process_time()``) per compile.  ``seed``: the seed
program; ``hf``: the 4-layer HF Llama forward of ``bench.latency``.  Prints
one JSON line: the medians and the median paired difference (old - new).
Figures: ``bench/RESULTS-latency.md``."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def main(argv: list[str]) -> None:
    old_path, kind, pairs = argv[0], argv[1], int(argv[2])
    os.environ["HLOALIAS_CACHE"] = "0"
    import torch

    import hloalias
    from hloalias.frontend import fx_export
    from hloalias.frontend import torch_internals as new_internals

    spec = importlib.util.spec_from_file_location("hloalias.frontend._old_torch_internals", old_path)
    assert spec is not None and spec.loader is not None
    old_internals: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old_internals)
    if not hasattr(old_internals, "module_patches_skipped"):
        old_internals.module_patches_skipped = contextlib.nullcontext
    make: Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]
    if kind == "seed":
        from bench import workloads

        seed = workloads.seed_workload()
        make = lambda: (workloads.SeedModule(), seed.args)  # noqa: E731
    else:
        import transformers

        from bench.latency import LLAMA

        torch.manual_seed(0)
        ids = torch.randint(0, 256, (1, 16))
        make = lambda: (transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval(), (ids,))  # noqa: E731
    for internals in (old_internals, new_internals, old_internals, new_internals):  # warm both
        fx_export.torch_internals = internals
        hloalias.clear_cache()
        hloalias.compile(*make())
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(pairs):
        for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
            fx_export.torch_internals = old_internals if name == "old" else new_internals
            hloalias.clear_cache()
            module, args = make()
            start = time.process_time()
            hloalias.compile(module, args)
            seconds[name].append(time.process_time() - start)
    fx_export.torch_internals = new_internals
    print(json.dumps({
        "kind": kind, "pairs": pairs, "load": os.getloadavg()[0],
        "old_median_ms": statistics.median(seconds["old"]) * 1e3,
        "new_median_ms": statistics.median(seconds["new"]) * 1e3,
        "paired_diff_median_ms": statistics.median(o - n for o, n in zip(seconds["old"], seconds["new"])) * 1e3,
    }))


if __name__ == "__main__":
    main(sys.argv[1:])
