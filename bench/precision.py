"""What eager-exact bf16 rounding costs: a bf16 LLaMA (tiny config, random
weights) compiled with ``excess_precision`` False (the default) and True;
compile time, the median of timed calls, and the fraction of logits that
differ from eager.  ``python -m bench.precision``; the figures go to
bench/RESULTS-precision.md."""

from __future__ import annotations

import statistics
import time

import torch
import transformers

import hloalias


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)


def main() -> None:
    model = _model()
    ids = torch.randint(0, 512, (2, 128), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = model(input_ids=ids, use_cache=False).logits
    print("| excess_precision | compile s | call ms (median of 20) | logits differing from eager | max abs diff |")
    print("|---|---|---|---|---|")
    for excess in (True, False, True, False):
        hloalias.clear_cache()
        start = time.perf_counter()
        exe = hloalias.compile(model, (), {"input_ids": ids, "use_cache": False}, excess_precision=excess)
        compile_s = time.perf_counter() - start
        out = exe(input_ids=ids, use_cache=False).logits
        times = []
        for _ in range(20):
            start = time.perf_counter()
            exe(input_ids=ids, use_cache=False)
            times.append((time.perf_counter() - start) * 1e3)
        differ = (out != eager).float().mean().item()
        diff = (out.float() - eager.float()).abs().max().item()
        print(f"| {excess} | {compile_s:.2f} | {statistics.median(times):.2f} | {differ:.4f} | {diff:.4g} |")


if __name__ == "__main__":
    main()
