"""One side of a same-window A/B of ``bench/RESULTS-runtime.md``'s rows:
per-call time and host peak RSS growth per call of every row, in this
process, on the call path ``HLOALIAS_NATIVE`` selects.  Not a timed test.

Run it from the root of the tree under test, with that tree's venv (the
package is the one the venv's editable install maps; ``bench`` is imported
from the current directory)::

    HLOALIAS_NATIVE=0 .venv/bin/python /path/to/bench/runtime_ab.py --label main-python

and alternate trees and paths process by process (ABBA).  Prints one JSON
line: per row, seconds per call (the minimum over ``--rounds`` interleaved
rounds, 3 for the rows of tens of ms, of the median of each row's calls:
``runtime_bench.best_of_rounds``)
and the largest peak RSS growth of one call over ``--rss-calls`` calls
after 3 (``runtime_bench.measure``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

import hloalias  # noqa: E402
import hloalias.runtime.executable  # noqa: E402
from bench import runtime_bench as rb  # noqa: E402

MIB = 1 << 20


def _kv_shape(cache_bytes: int) -> tuple[int, int, int]:
    heads, dim = 16, 256
    return heads, max(rb.POS + 1, cache_bytes // (heads * dim * 4)), dim


def rows() -> dict[str, tuple[Callable[[], Any], int]]:
    """Each row's call and how many calls a round times."""
    torch.manual_seed(0)
    out: dict[str, tuple[Callable[[], Any], int]] = {}
    x = torch.randn(256)
    small = hloalias.compile(rb.donation, (x,))
    small_device = small.to_device(x)
    out["x*2+1 on 256 floats, torch input"] = (lambda: small(x), 300)
    out["x*2+1 on 256 floats, DeviceTensor input"] = (lambda: small(small_device), 300)
    module = rb.ManyState()
    x4 = torch.randn(4)
    many = hloalias.compile(module, (x4,))
    many_device = many.to_device(x4)
    out["600 parameters of 4 floats, torch input"] = (lambda: many(x4), 300)
    out["600 parameters of 4 floats, DeviceTensor input"] = (lambda: many(many_device), 300)
    for label, size in (("32 KiB", 32 * 1024), ("64 MiB", 64 * MIB)):
        shape = _kv_shape(size)
        new = torch.randn(shape[0], shape[2])
        cache = torch.zeros(shape)
        kv = hloalias.compile(rb.kv_update, (cache, new))
        out[f"KV, {label} cache as input"] = (lambda kv=kv, cache=cache, new=new: kv(cache, new), 300)
        state = rb.StateKV(shape)
        statekv = hloalias.compile(state, (new,))
        out[f"StateKV, {label} cache as buffer"] = (lambda statekv=statekv, new=new: statekv(new), 300)
    big = torch.randn(64 * MIB // 4)
    donating = hloalias.compile(rb.donation, (big,), donate=[0])
    chain = [big.clone()]

    def donated() -> None:
        chain[0] = donating(chain[0])

    out["donation y = x*2+1, 64 MiB torch input fed its result"] = (donated, 10)

    def upload() -> None:
        hloalias.to_device(big).array.block_until_ready()

    out["to_device of 64 MiB, until its copy is complete"] = (upload, 10)
    try:
        import transformers  # noqa: F401
    except ImportError:
        return out
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

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
    step = {"input_ids": torch.tensor([[5]]), "cache_position": torch.tensor([7])}
    decode = hloalias.compile(wrapper, (), step)
    out[f"HF Llama decode step ({len(decode._arg_plan)} arguments)"] = (lambda: decode(**step), 100)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rss-calls", type=int, default=30)
    args = parser.parse_args()
    started = time.time()
    table = rows()
    times: dict[str, float] = {}
    # Rows of like cost share their rounds (interleaved); the slow ones
    # (tens of ms a call) take 3 rounds.
    for calls in sorted({k for _, k in table.values()}, reverse=True):
        group = {name: call for name, (call, k) in table.items() if k == calls}
        times.update(rb.best_of_rounds(group, calls, args.rounds if calls >= 100 else 3))
    rss = {name: rb.measure(call, args.rss_calls)[1] for name, (call, _) in table.items()}
    print(json.dumps({
        "label": args.label, "native": hloalias.runtime.executable._lane is not None and os.environ.get("HLOALIAS_NATIVE") != "0",
        "start": started, "end": time.time(), "load": os.getloadavg(),
        "us": {name: seconds * 1e6 for name, seconds in times.items()}, "rss_mib": {n: b / MIB for n, b in rss.items()},
    }))


if __name__ == "__main__":
    main()
