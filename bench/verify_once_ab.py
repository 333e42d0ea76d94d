"""Same-window A/B of verifying a pipeline's result once (hloalias/pass_runs.py)
against MLIR's verifier after every pass (the code before): one fresh process
per run, the ``shapes`` ratio child's 4-layer HF Llama at lengths 16 (first),
24 (static), 40 (dynamic export + specialization), 9, 33, 12 (specialized).

    python -m bench.verify_once_ab old|new|new-export2

(``new-export2``: the new tree with ``HLOALIAS_SHAPE_FAMILY_STATIC_SIZES=1``,
the dynamic export at the second length, 24)

prints one JSON line: CPU and wall seconds per compile, the XLA compile's CPU
(``disk_cache._count_compile``), a digest of each final module (equal on both
sides: verification does not change the IR), and whether outputs equal eager."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from typing import Any


def main(side: str) -> dict[str, Any]:
    os.environ["HLOALIAS_CACHE_DIR"] = tempfile.mkdtemp(prefix="verify_once_ab")
    if side == "new-export2":
        os.environ["HLOALIAS_SHAPE_FAMILY_STATIC_SIZES"] = "1"
    import torch
    import transformers

    import hloalias
    from bench.latency import LLAMA
    from hloalias.frontend import importer
    from hloalias.runtime import disk_cache, shape_family
    import hloalias.pipeline as pipeline

    if side == "old":  # the pass manager's default: the verifier after every pass, no check of the result
        def every_pass(manager: Any, operation: Any) -> None:
            manager.run(operation)

        importer.run_verifying_result = every_pass
        pipeline.run_verifying_result = every_pass
    xla = [0.0]
    count = disk_cache._count_compile

    def counted(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return count(*args, **kwargs)
        finally:
            xla[0] += time.process_time() - start

    disk_cache._count_compile = counted
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    result: dict[str, Any] = {"side": side, "load": os.getloadavg()[0], "at": time.strftime("%H:%M:%S", time.gmtime())}
    correct = True
    for length in (16, 24, 40, 9, 33, 12):
        ids = torch.randint(0, 256, (1, length))
        xla[0] = 0.0
        start, start_cpu = time.perf_counter(), time.process_time()
        exe = hloalias.compile(model, (ids,))
        result[f"cpu_{length}"] = time.process_time() - start_cpu
        result[f"wall_{length}"] = time.perf_counter() - start
        result[f"xla_{length}"] = xla[0]
        result[f"digest_{length}"] = hashlib.sha256(exe.mlir.encode()).hexdigest()[:12]
        correct = correct and bool(torch.equal(exe(ids).logits, exe(ids).logits)) and bool(
            torch.allclose(exe(ids).logits, model(ids).logits, atol=1e-4))
    stats = shape_family.shape_family_stats()
    result["family"] = [stats.first, stats.static, stats.exported, stats.specialized, stats.fallbacks]
    result["correct"] = correct
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
