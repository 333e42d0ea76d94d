"""A/B of torch.compile(backend="hloalias") in a fresh process that compiled
the same model before (issue 26): ``old`` makes dynamo's graph modules
uncacheable in the program cache again (as before the ``dyncache`` branch:
the key prints the graph's ``_graph``, which it cannot), ``new`` is the
branch, ``eager`` is ``backend="eager"`` (dynamo's own tracing, the floor no
backend cache removes).  One process per run; the caller gives each
old/new pair of processes (cold, then warm) a fresh cache directory
(``HLOALIAS_CACHE_DIR``).  Prints CPU and wall seconds of each length's
first call (dynamo's trace, the backend's compile and one run), the program
cache's hits/misses/uncacheable and XLA compiles; outputs are checked
against eager.

    HLOALIAS_CACHE_DIR=/tmp/x .venv/bin/python bench/dynamo_cache_ab.py old|new|eager
"""

from __future__ import annotations

import sys
import time

import torch
import transformers

from hloalias.runtime import source_key
from hloalias.runtime.disk_cache import disk_cache_stats
from hloalias.runtime.program_cache import program_cache_stats


def main() -> None:
    mode = sys.argv[1]
    if mode == "old":
        source_key._graph_module_bookkeeping = lambda: frozenset()  # type: ignore[assignment]
    elif mode not in ("new", "eager"):
        raise SystemExit("usage: dynamo_cache_ab.py old|new|eager")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=4)).eval()
    compiled = torch.compile(model, backend="eager" if mode == "eager" else "hloalias")
    cpu, wall = [], []
    with torch.no_grad():
        # 16: dynamo's static graph; 24: its automatic-dynamic graph (a _SizedGraph).
        for length in (16, 24):
            ids = torch.randint(0, 50257, (1, length))
            c, w = time.process_time(), time.perf_counter()
            ours = compiled(ids, use_cache=False).logits
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
            torch.testing.assert_close(ours, model(ids, use_cache=False).logits, rtol=1e-4, atol=1e-4)
    stats, disk = program_cache_stats(), disk_cache_stats()
    print(mode, "cpu", " ".join(f"{v:.2f}" for v in cpu), f"sum {sum(cpu):.2f}",
          "wall", " ".join(f"{v:.2f}" for v in wall), f"sum {sum(wall):.2f}",
          f"program hits={stats.hits} misses={stats.misses} uncacheable={stats.uncacheable} "
          f"xla_compiles={disk.xla_compiles}", flush=True)


if __name__ == "__main__":
    main()
