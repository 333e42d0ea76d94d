"""Runtime benchmark (issue 11): per-call time and host peak RSS growth per
call of in-place updates, against the same XLA program driven through
``jax.jit`` with the state on the device; and the device bytes a second
executable of the same module adds.  Not a timed test.

From the repository root::

    .venv/bin/python -m bench.runtime_bench [--cache-mib 64] [--calls 30]

writes ``bench/RESULTS-runtime.md``.

Workloads:

- **KV**: ``cache[:, pos].copy_(new)`` on a cache passed as an input (a
  torch CPU tensor the caller keeps);
- **StateKV**: the same update on a cache that is a module buffer;
- **donation**: ``y = x * 2 + 1`` with ``x`` donated, fed its own result.

Peak RSS growth of a call is ``VmHWM`` after it minus ``VmRSS`` before it,
with the high-water mark reset (``/proc/self/clear_refs``) before each
call; the figure is the largest over the measured calls."""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import torch

import hloalias

MIB = 1 << 20
POS = 5


def _status(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def measure(call: Callable[[], Any], calls: int, warmup: int = 3) -> tuple[float, int]:
    """Median seconds per call and the largest peak RSS growth of one call."""
    for _ in range(warmup):
        call()
    gc.collect()
    times: list[float] = []
    growth = 0
    for _ in range(calls):
        _reset_peak()
        before = _status("VmRSS")
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        growth = max(growth, _status("VmHWM") - before)
    return statistics.median(times), growth


class StateKV(torch.nn.Module):
    """A KV-style cache as a module buffer, one position written per call."""

    cache: torch.Tensor

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(shape))

    def forward(self, new: torch.Tensor) -> torch.Tensor:
        self.cache[:, POS].copy_(new)
        return new * 2


def kv_update(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    cache[:, POS].copy_(new)
    return new * 2


def donation(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def run(cache_mib: int, calls: int) -> list[dict[str, Any]]:
    heads, dim = 16, 256
    length = cache_mib * MIB // (heads * dim * 4)
    shape = (heads, length, dim)
    cache_bytes = heads * length * dim * 4
    new = torch.randn(heads, dim)
    rows: list[dict[str, Any]] = []

    # KV: cache passed as an input.
    exe = hloalias.compile(kv_update, (torch.zeros(shape), new))
    cache = torch.zeros(shape)
    ours = measure(lambda: exe(cache, new), calls)
    jit = jax.jit(lambda c, n: (c.at[:, POS].set(n), n * 2), donate_argnums=0)
    state = {"c": jnp.zeros(shape), "n": jnp.asarray(new.numpy())}

    def jax_kv() -> None:
        state["c"], out = jit(state["c"], state["n"])
        out.block_until_ready()

    rows.append({"workload": "KV (cache as input)", "ours": ours, "jax": measure(jax_kv, calls),
                 "tensor": cache_bytes, "copies": dict(exe.host_copies)})
    del exe, cache, state
    gc.collect()

    # StateKV: cache as a module buffer.
    module = StateKV(shape)
    exe = hloalias.compile(module, (new,))
    ours = measure(lambda: exe(new), calls)
    state = {"c": jnp.zeros(shape), "n": jnp.asarray(new.numpy())}
    rows.append({"workload": "StateKV (cache as buffer)", "ours": ours, "jax": measure(jax_kv, calls),
                 "tensor": cache_bytes, "copies": dict(exe.host_copies)})
    del exe, module, state
    gc.collect()

    # Donation: y = x * 2 + 1, x donated, fed its own result.
    exe = hloalias.compile(donation, (torch.zeros(shape),), donate_argnums=[0])
    chain = {"x": torch.zeros(shape)}

    def ours_donate() -> None:
        chain["x"] = exe(chain["x"])

    ours = measure(ours_donate, calls)
    jit_d = jax.jit(lambda x: x * 2 + 1, donate_argnums=0)
    jchain = {"x": jnp.zeros(shape)}

    def jax_donate() -> None:
        jchain["x"] = jit_d(jchain["x"])
        jchain["x"].block_until_ready()

    rows.append({"workload": "donation (y = x*2+1)", "ours": ours, "jax": measure(jax_donate, calls),
                 "tensor": cache_bytes, "copies": dict(exe.host_copies)})
    return rows


def _settle(exe: hloalias.Executable) -> None:
    """Wait for the state transfers (asynchronous) so RSS counts them."""
    for slot in exe._slots.values():
        if slot.array is not None:
            slot.array.block_until_ready()
    gc.collect()


def second_executable(weight_mib: int) -> dict[str, int]:
    """Device bytes of module state and RSS growth when the same Linear is
    compiled for two batch sizes (prefill and decode)."""
    features = int((weight_mib * MIB / 4) ** 0.5)
    layer = torch.nn.Linear(features, features, bias=False)
    gc.collect()
    before = _status("VmRSS")
    first = hloalias.compile(layer, (torch.randn(1, features),))
    _settle(first)
    after_first = _status("VmRSS")
    second = hloalias.compile(layer, (torch.randn(8, features),))
    _settle(second)
    after_second = _status("VmRSS")
    unique = {id(slot): slot.nbytes for exe in (first, second) for slot in exe._slots.values()}
    return {
        "weight_bytes": features * features * 4,
        "state_bytes_on_device": sum(unique.values()),
        "rss_first": after_first - before,
        "rss_second": after_second - after_first,
    }


def report(rows: list[dict[str, Any]], second: dict[str, int], cache_mib: int, calls: int) -> str:
    lines = [
        "# Runtime benchmark (issue 11)",
        "",
        f"`python -m bench.runtime_bench --cache-mib {cache_mib} --calls {calls}` on CPU PJRT "
        f"({os.cpu_count()} cores, shared machine: times are indicative). Median per-call time over "
        f"{calls} calls after 3 warm-up calls; peak RSS growth is the largest of any one call "
        "(VmHWM after minus VmRSS before, high-water mark reset before each call).",
        "",
        "| workload | hloalias ms/call | jax.jit ms/call | ratio | hloalias peak RSS growth/call | "
        "jax peak RSS growth/call | growth / updated tensor | host copies |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        (ours_t, ours_rss), (jax_t, jax_rss) = row["ours"], row["jax"]
        lines.append(
            f"| {row['workload']} | {ours_t * 1e3:.3f} | {jax_t * 1e3:.3f} | {ours_t / jax_t:.2f}x | "
            f"{ours_rss / MIB:.2f} MiB | {jax_rss / MIB:.2f} MiB | {100 * ours_rss / row['tensor']:.1f}% | "
            f"{row['copies'] or 'none'} |"
        )
    lines += [
        "",
        f"Updated tensor: {rows[0]['tensor'] / MIB:.0f} MiB. Goals (issue 11): at most 1.5x jax.jit per call; "
        "peak RSS growth per call at most 5% of the updated tensor for the in-place updates (KV, StateKV).",
        "",
        "## A second executable of the same module",
        "",
        f"`nn.Linear` without bias, weight {second['weight_bytes'] / MIB:.1f} MiB, compiled for batch 1 and batch 8:",
        "",
        "| | bytes |",
        "|---|---|",
        f"| weight | {second['weight_bytes']} |",
        f"| module state on the device, both executables together | {second['state_bytes_on_device']} |",
        f"| RSS growth, first compile | {second['rss_first']} |",
        f"| RSS growth, second compile | {second['rss_second']} |",
        "",
        "The second executable shares the first's device buffer (one `_StateSlot` per state tensor "
        "per module), so it adds no weight bytes; its RSS growth is compile-time memory.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--weight-mib", type=int, default=64)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS-runtime.md"))
    options = parser.parse_args()
    rows = run(options.cache_mib, options.calls)
    second = second_executable(options.weight_mib)
    text = report(rows, second, options.cache_mib, options.calls)
    with open(options.out, "w") as handle:
        handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
