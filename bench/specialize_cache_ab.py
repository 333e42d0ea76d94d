"""Same-window A/B of a specialization without torch's fake-tensor cache
(frontend/shape_specialization.py, ``_specialize``) against the cached
dispatch (the code before): one fresh process per run, the ``shapes`` ratio
child's 4-layer HF Llama at lengths 16 (first), 24 (static), 40 (dynamic
export + specialization), 9, 33, 12, 57, 20 (specialized).

    python -m bench.specialize_cache_ab old|new
    python -m bench.specialize_cache_ab alone [ROUNDS]

``old``/``new`` print one JSON line: CPU and wall seconds per compile, the
CPU of ``specialize`` and of the XLA compile (``disk_cache._count_compile``)
in it, the fake-tensor cache's entries after the run, a digest of each final
module (equal on both sides), and whether outputs equal eager.  ``alone``:
``specialize`` by itself in one process, old and new alternating (ROUNDS,
default 6, of 4 lengths never specialized before per side), the length-40
dynamic export's; prints each side's median and minimum CPU ms."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from typing import Any, Callable


def _cpu_of(owner: Any, name: str, spent: list[float]) -> None:
    function: Callable[..., Any] = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - start

    setattr(owner, name, timed)


def main(side: str) -> dict[str, Any]:
    os.environ["HLOALIAS_CACHE_DIR"] = tempfile.mkdtemp(prefix="specialize_cache_ab")
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    import hloalias
    from bench.latency import LLAMA
    from hloalias.frontend import shape_specialization
    from hloalias.runtime import disk_cache, shape_family

    if side == "old":  # the cached dispatch
        shape_specialization.disable_fake_tensor_cache = lambda mode: contextlib.nullcontext()  # type: ignore[assignment]
    xla, specialize = [0.0], [0.0]
    _cpu_of(disk_cache, "_count_compile", xla)
    _cpu_of(shape_specialization, "specialize", specialize)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    result: dict[str, Any] = {"side": side, "load": os.getloadavg()[0], "at": time.strftime("%H:%M:%S", time.gmtime())}
    correct = True
    for length in (16, 24, 40, 9, 33, 12, 57, 20):
        ids = torch.randint(0, 256, (1, length))
        xla[0] = specialize[0] = 0.0
        start, start_cpu = time.perf_counter(), time.process_time()
        exe = hloalias.compile(model, (ids,))
        result[f"cpu_{length}"] = time.process_time() - start_cpu
        result[f"wall_{length}"] = time.perf_counter() - start
        result[f"xla_{length}"] = xla[0]
        result[f"specialize_{length}"] = specialize[0]
        result[f"digest_{length}"] = hashlib.sha256(exe.mlir.encode()).hexdigest()[:12]
        correct = correct and bool(torch.allclose(exe(ids).logits, model(ids).logits, atol=1e-4))
    stats = shape_family.shape_family_stats()
    result["family"] = [stats.first, stats.static, stats.exported, stats.specialized, stats.fallbacks]
    result["fake_cache_entries"] = len(FakeTensorMode.cache)
    result["correct"] = correct
    return result


def alone(rounds: int) -> dict[str, Any]:
    import itertools
    import statistics

    os.environ["HLOALIAS_CACHE_DIR"] = tempfile.mkdtemp(prefix="specialize_cache_ab")
    import torch
    import transformers

    import hloalias
    from bench.latency import LLAMA
    from hloalias.frontend import shape_specialization
    from hloalias.runtime import shape_family

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    for length in (16, 24, 40):
        hloalias.compile(model, (torch.randint(0, 256, (1, length)),))
    dynamic = next(family.dynamic for family in shape_family._FAMILIES.values() if family.dynamic is not None)
    sides: dict[str, Callable[..., Any]] = {
        "old": lambda mode: contextlib.nullcontext(), "new": shape_specialization.disable_fake_tensor_cache,
    }
    spent: dict[str, list[float]] = {side: [] for side in sides}
    fresh = itertools.count(41)
    result: dict[str, Any] = {"at": time.strftime("%H:%M:%S", time.gmtime()), "load": os.getloadavg()[0]}
    for round_ in range(rounds):
        for side in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
            shape_specialization.disable_fake_tensor_cache = sides[side]  # type: ignore[assignment]
            for _ in range(4):
                ids = torch.randint(0, 256, (1, next(fresh)))
                start = time.process_time()
                shape_specialization.specialize(dynamic, (ids,), {})
                spent[side].append(time.process_time() - start)
    result["until"], result["load_after"] = time.strftime("%H:%M:%S", time.gmtime()), os.getloadavg()[0]
    for side, seconds in spent.items():
        result[side] = {"median_ms": statistics.median(seconds) * 1e3, "min_ms": min(seconds) * 1e3, "n": len(seconds)}
    return result


if __name__ == "__main__":
    if sys.argv[1] == "alone":
        print(json.dumps(alone(int(sys.argv[2]) if len(sys.argv) > 2 else 6)))
    else:
        print(json.dumps(main(sys.argv[1])))
