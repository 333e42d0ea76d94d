"""Per-call cost of the index check (runtime/index_check.py, the native
lane's ``ranges`` table): an embedding call and a Llama decode step
(``input_ids`` -> embedding, ``cache_position`` -> the caches'
``index_copy_``), on the native lane and the Python path.  Not a test.

Self-contained (no import from the repository), so that one script times
two installs in the same window: run it from outside the repository with
each venv's interpreter, alternating processes::

    cd /tmp && for i in 1 2 3; do
      /work/main/.venv/bin/python /path/to/bench/index_check_bench.py base
      /path/to/.venv/bin/python /path/to/bench/index_check_bench.py branch
    done

Each line printed is JSON: the label, the workload, the call path, whether
the check is on (``HLOALIAS_INDEX_CHECK``, read when an executable is
made; an install without the check ignores it), whether the lane ran the
calls, and the minimum over rounds of the median per-call time in µs."""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import hloalias


def best_of_rounds(calls: dict[str, Callable[[], Any]], count: int = 300, rounds: int = 5) -> dict[str, float]:
    """µs per call: the minimum over interleaved rounds of each call's median."""
    best = {name: float("inf") for name in calls}
    with torch.no_grad():
        for fn in calls.values():
            for _ in range(30):
                fn()
        for _ in range(rounds):
            for name, fn in calls.items():
                gc.collect()
                samples = []
                for _ in range(count):
                    start = time.perf_counter()
                    fn()
                    samples.append(time.perf_counter() - start)
                best[name] = min(best[name], statistics.median(samples) * 1e6)
    return best


def compiled(f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], native: bool, check: bool) -> Any:
    os.environ["HLOALIAS_NATIVE"] = "1" if native else "0"
    os.environ["HLOALIAS_INDEX_CHECK"] = "1" if check else "0"
    try:
        return hloalias.compile(f, args, kwargs)
    finally:
        del os.environ["HLOALIAS_NATIVE"], os.environ["HLOALIAS_INDEX_CHECK"]


def decode_step() -> tuple[Any, dict[str, torch.Tensor]]:
    import transformers
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, max_position_embeddings=512,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config = transformers.GenerationConfig(
        use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": 256},
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    wrapper = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=256)
    return wrapper, {"input_ids": torch.tensor([[5]]), "cache_position": torch.tensor([7])}


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "run"
    table = torch.nn.Embedding(32000, 64)
    ids = torch.randint(0, 32000, (1, 8))
    wrapper, step = decode_step()
    workloads = {
        "embedding 32000x64, ids [1, 8]": (table, (ids,), {}),
        "Llama decode step (4 layers, hidden 256, static cache)": (wrapper, (), step),
    }
    for workload, (f, args, kwargs) in workloads.items():
        for native in (True, False):
            exes = {check: compiled(f, args, kwargs, native, check) for check in (True, False)}
            times = best_of_rounds({str(check): (lambda e=exe: e(*args, **kwargs)) for check, exe in exes.items()})
            for check, exe in exes.items():
                print(json.dumps({
                    "label": label, "workload": workload, "path": "native" if native else "python",
                    "check": check, "lane": exe._lane is not None, "us": round(times[str(check)], 2),
                }), flush=True)


if __name__ == "__main__":
    main()
