"""Measure ``order-in-place-updates`` on the inference and training
workloads of ``bench/`` (issue 29): XLA's temp bytes and the call time of
what ``hloalias.compile`` runs on CPU without and with the pass.

``.venv/bin/python -m bench.order_updates`` prints a markdown table.  Each
workload is compiled twice from its own copy of the module; the calls of
the two executables alternate (``--calls`` each, after two warm-up calls)
so that a change of machine load hits both alike; the table gives the
median per call.  Results of both executables are checked equal to
eager's first."""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import hloalias
from hloalias.pipeline import CPU_PIPELINE, ORDER_PASS

WITHOUT = CPU_PIPELINE.replace(f", {ORDER_PASS}", "")
WITH = WITHOUT[: -len(")")] + f", {ORDER_PASS})"


def _sgd() -> tuple[str, torch.nn.Module, tuple[Any, ...], tuple[int | str, ...]]:
    from bench.workloads import sgd_workload

    w = sgd_workload()
    return "SGD-momentum MLP step (4x1024, batch 64)", w.module, w.args, w.donate


def _gpt2() -> tuple[str, torch.nn.Module, tuple[Any, ...], tuple[int | str, ...]]:
    from bench.workloads import GPT2Config, gpt2_workload

    w = gpt2_workload(GPT2Config())
    return "GPT-2-small decode step", w.module, w.args, w.donate


def _llama(cache: int) -> Callable[[], tuple[str, torch.nn.Module, tuple[Any, ...], tuple[int | str, ...]]]:
    def make() -> tuple[str, torch.nn.Module, tuple[Any, ...], tuple[int | str, ...]]:
        from bench.models import LlamaDecodeConfig, LlamaDecodeStep

        model = LlamaDecodeStep(LlamaDecodeConfig(max_cache_len=cache))
        return f"HF Llama GQA static-cache decode step, cache {cache}", model, (torch.tensor([[7]]), torch.tensor([17])), ()

    return make


def _bf16_cache() -> tuple[str, torch.nn.Module, tuple[Any, ...], tuple[int | str, ...]]:
    from bench.temp_bytes import RowWrites

    torch.manual_seed(0)
    args = (torch.randperm(4096)[:120], torch.randn(120, 16, 64, dtype=torch.bfloat16))
    return "10x `index_copy_` into a 4096x16x64 bf16 cache (state)", RowWrites(), args, ()


def _kv_step() -> tuple[str, torch.nn.Module, tuple[Any, ...], tuple[int | str, ...]]:
    from bench.temp_bytes import KVStep

    torch.manual_seed(1)
    return "step counter + `index_copy_` into an 8x256x64 cache", KVStep(), (torch.randn(8, 1, 64), torch.randn(8, 1, 64)), ()


def _bert() -> tuple[str, torch.nn.Module, tuple[Any, ...], tuple[int | str, ...]]:
    import transformers

    config = transformers.BertConfig(attn_implementation="sdpa", num_hidden_layers=4, hidden_size=512,
                                     num_attention_heads=8, intermediate_size=2048)
    torch.manual_seed(2)
    model = transformers.BertModel(config).eval()
    for submodule in model.modules():
        getattr(submodule, "_non_persistent_buffers_set", set()).clear()
    return "HF BERT forward (4 layers, hidden 512), batch 2 x 128", model, (torch.randint(0, config.vocab_size, (2, 128)),), ()


WORKLOADS = {"sgd": _sgd, "gpt2": _gpt2, "llama256": _llama(256), "llama4096": _llama(4096),
             "bf16_cache": _bf16_cache, "kv_step": _kv_step, "bert": _bert}


def _leaves(value: Any) -> list[torch.Tensor]:
    return [torch.as_tensor(t) for t in torch.utils._pytree.tree_leaves(value) if hasattr(t, "shape")]


def measure(key: str, calls: int) -> str:
    title, module, args, donate = WORKLOADS[key]()
    fresh = [copy.deepcopy(a) if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad():
        expected = _leaves(copy.deepcopy(module)(*fresh))
    exes = []
    for pipeline in (WITHOUT, WITH):
        exes.append(hloalias.compile(copy.deepcopy(module), args, donate=donate, pipeline=pipeline))
    for exe in exes:
        got = _leaves(exe(*[copy.deepcopy(a) for a in args]))
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
        exe(*[copy.deepcopy(a) for a in args])
    times: list[list[float]] = [[], []]
    for _ in range(calls):
        for i, exe in enumerate(exes):
            inputs = [copy.deepcopy(a) for a in args]  # donated inputs are consumed
            start = time.perf_counter()
            out = exe(*inputs)
            for leaf in _leaves(out)[:1]:
                leaf.sum()
            times[i].append(time.perf_counter() - start)
    cells = []
    for i, exe in enumerate(exes):
        stats = exe.memory_stats
        cells.append(f"{stats['temp_bytes']:,} | {stats['argument_bytes'] + stats['output_bytes'] - stats['alias_bytes'] + stats['temp_bytes']:,} | "
                     f"{statistics.median(times[i]) * 1e3:.2f}")
    return f"| {title} | {' | '.join(cells)} |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--calls", type=int, default=30)
    options = parser.parse_args(argv)
    print(f"without: `{WITHOUT}`\n\nwith: `{WITH}`\n")
    print("| workload | temp without | device total without | ms/call without | temp with | device total with | ms/call with |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for key in options.workloads:
        print(measure(key, options.calls), flush=True)


if __name__ == "__main__":
    main()
