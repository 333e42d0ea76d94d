"""A/B of torch.compile(backend="hloalias") at new sequence lengths (issue 26):
``old`` turns off the dynamo graphs' shape family (every int input kept, as
before the ``dynfamily`` branch: ``_sizes_of_tensors`` answers None), ``new``
is the branch.  One process per run; prints CPU and wall seconds of each
length's first call (the compile and one run).

    .venv/bin/python bench/dynamo_family_ab.py old|new
"""

from __future__ import annotations

import sys
import time

import torch
import transformers

from hloalias.runtime import dynamo_backend, shape_family


def main() -> None:
    mode = sys.argv[1]
    if mode == "old":
        dynamo_backend._sizes_of_tensors = lambda graph: None  # type: ignore[assignment]
    elif mode != "new":
        raise SystemExit("usage: dynamo_family_ab.py old|new")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=4)).eval()
    compiled = torch.compile(model, backend="hloalias")
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
    print(mode, "cpu", " ".join(f"{v:.2f}" for v in cpu), "wall", " ".join(f"{v:.2f}" for v in wall),
          f"family first={stats.first} exported={stats.exported} specialized={stats.specialized} "
          f"fallbacks={stats.fallbacks}", flush=True)


if __name__ == "__main__":
    main()
