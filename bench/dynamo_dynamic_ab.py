"""A/B of torch.compile(backend="hloalias", dynamic=True) at new sequence
lengths (issue 26): ``old`` runs a graph that reads numbers (``Dropout.p``,
``eps``, ``math.pi``) without a shape family, as before the ``dyncache``
branch (``_sizes_of_tensors`` answers None for it); ``new`` is the branch (one
``_SizedGraph`` per set of number values, its sizes a shape family).  Disk
caches off (``HLOALIAS_CACHE=0``, set here) so each run compiles.  One
process per run; prints CPU and wall seconds of each length's first call.

    .venv/bin/python bench/dynamo_dynamic_ab.py old|new
"""

from __future__ import annotations

import os
import sys
import time

os.environ["HLOALIAS_CACHE"] = "0"

import torch  # noqa: E402
import transformers  # noqa: E402

from hloalias.runtime import dynamo_backend, shape_family  # noqa: E402


def main() -> None:
    mode = sys.argv[1]
    if mode == "old":
        sizes = dynamo_backend._sizes_of_tensors
        dynamo_backend._sizes_of_tensors = (  # type: ignore[assignment]
            lambda graph, numbers=frozenset(): None if numbers else sizes(graph))
    elif mode != "new":
        raise SystemExit("usage: dynamo_dynamic_ab.py old|new")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=4)).eval()
    compiled = torch.compile(model, backend="hloalias", dynamic=True)
    cpu, wall = [], []
    with torch.no_grad():
        for length in (16, 24, 40, 9):
            ids = torch.randint(0, 50257, (1, length))
            c, w = time.process_time(), time.perf_counter()
            ours = compiled(ids, use_cache=False).logits
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
            torch.testing.assert_close(ours, model(ids, use_cache=False).logits, rtol=1e-4, atol=1e-4)
    stats = shape_family.shape_family_stats()
    print(mode, "cpu", " ".join(f"{v:.2f}" for v in cpu), f"sum {sum(cpu):.2f}",
          "wall", " ".join(f"{v:.2f}" for v in wall),
          f"family first={stats.first} exported={stats.exported} specialized={stats.specialized} "
          f"fallbacks={stats.fallbacks}", flush=True)


if __name__ == "__main__":
    main()
