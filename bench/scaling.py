"""Pass time on synthetic StableHLO modules of growing size, and per-call
host overhead of :class:`hloalias.Executable` against the raw PJRT call."""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time

import numpy as np
import torch

import hloalias
from hloalias.mlir import new_context, parse_module
from hloalias.passes import ViewReport
from hloalias.pipeline import DEFAULT_PIPELINE, run_pipeline

_SQUARE = "tensor<16x16xf32>"
_HALF = "tensor<8x16xf32>"
_TALL = "tensor<16x8xf32>"
OPS_PER_BLOCK = 5


@dataclasses.dataclass(frozen=True)
class SyntheticModule:
    """Text of a generated module and what it holds."""

    text: str
    ops: int
    results: int
    view_results: int


def synthetic_module(target_ops: int, result_every: int = 100) -> SyntheticModule:
    """A ``@main`` of about ``target_ops`` StableHLO ops: a chain of blocks

        a = add(prev, arg1); s = slice(a); r = reshape(s);
        t = transpose(r); c = concatenate(t, s)

    (``c`` feeds the next block).  Every ``result_every`` ops the block's
    ``a`` and ``r`` are returned too, so ``r`` is a view of another result
    (slice + reshape of ``a``); every tenth such block also returns a slice
    of ``arg0`` (a view of an argument).  The result count grows with the
    module, as it does in real programs (per-layer state)."""
    lines: list[str] = []
    results: list[tuple[str, str]] = []
    views = 0
    previous = "%arg0"
    block = 0
    ops = 0
    while ops + OPS_PER_BLOCK + 1 <= target_ops or block == 0:
        a, s, r, t, c = (f"%{p}{block}" for p in "asrtc")
        lines.append(f"    {a} = stablehlo.add {previous}, %arg1 : {_SQUARE}")
        lines.append(f"    {s} = stablehlo.slice {a} [0:8, 0:16] : ({_SQUARE}) -> {_HALF}")
        lines.append(f"    {r} = stablehlo.reshape {s} : ({_HALF}) -> {_TALL}")
        lines.append(f"    {t} = stablehlo.transpose {r}, dims = [1, 0] : ({_TALL}) -> {_HALF}")
        lines.append(f"    {c} = stablehlo.concatenate {t}, {s}, dim = 0 : ({_HALF}, {_HALF}) -> {_SQUARE}")
        ops += OPS_PER_BLOCK
        if (block * OPS_PER_BLOCK) % result_every == 0:
            results += [(a, _SQUARE), (r, _TALL)]
            views += 1
            if (block * OPS_PER_BLOCK) % (10 * result_every) == 0:
                v = f"%v{block}"
                lines.append(f"    {v} = stablehlo.slice %arg0 [{block % 8}:{block % 8 + 8}, 0:16] : ({_SQUARE}) -> {_HALF}")
                ops += 1
                results.append((v, _HALF))
                views += 1
        previous = c
        block += 1
    results.append((previous, _SQUARE))
    ops += 1  # func.return
    values = ", ".join(v for v, _ in results)
    types = ", ".join(t for _, t in results)
    text = (
        "module {\n"
        f"  func.func @main(%arg0: {_SQUARE}, %arg1: {_SQUARE}) -> ({types}) {{\n"
        + "\n".join(lines)
        + f"\n    return {values} : {types}\n  }}\n}}\n"
    )
    return SyntheticModule(text, ops, len(results), views)


@dataclasses.dataclass(frozen=True)
class ScalingPoint:
    """Pass time on one synthetic module (median over ``repeats``)."""

    target_ops: int
    ops: int
    results: int
    view_results: int
    parse_seconds: float
    pass_seconds: float
    removed: int
    repeats: int


def time_synthetic(target_ops: int, repeats: int) -> ScalingPoint:
    """Parse a synthetic module of ``target_ops`` ops and time
    ``run_pipeline(module, DEFAULT_PIPELINE)`` on fresh parses."""
    synthetic = synthetic_module(target_ops)
    parse_times, pass_times = [], []
    removed = 0
    for _ in range(repeats):
        context = new_context()
        start = time.perf_counter()
        module = parse_module(synthetic.text, context)
        parse_times.append(time.perf_counter() - start)
        gc.collect()
        start = time.perf_counter()
        reports = run_pipeline(module, DEFAULT_PIPELINE)
        pass_times.append(time.perf_counter() - start)
        removed = sum(len(r.removed) for r in reports if isinstance(r, ViewReport))
        del module, context
    return ScalingPoint(
        target_ops, synthetic.ops, synthetic.results, synthetic.view_results,
        statistics.median(parse_times), statistics.median(pass_times), removed, repeats,
    )


def fit_exponent(points: list[ScalingPoint]) -> float:
    """Least-squares slope of log(pass time) against log(op count)."""
    x = np.log([p.ops for p in points])
    y = np.log([p.pass_seconds for p in points])
    slope, _ = np.polyfit(x, y, 1)
    return float(slope)


def run_scaling(sizes: tuple[int, ...] = (1_000, 10_000, 100_000)) -> tuple[list[ScalingPoint], float]:
    """Time every size (3 repeats below 50k ops, 1 above; a warm-up first)
    and fit the exponent."""
    time_synthetic(100, 1)  # warm-up: first pipeline run pays one-time costs
    points = [time_synthetic(n, 3 if n < 50_000 else 1) for n in sizes]
    return points, fit_exponent(points)


# -- per-call overhead --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Overhead:
    """Median per-call times (seconds) on one small graph."""

    calls: int
    executable_call: float
    raw_execute: float
    raw_execute_and_unpack: float
    executable_call_torch_input: float

    @property
    def ratio(self) -> float:
        """``Executable.__call__`` / raw ``execute_sharded``."""
        return self.executable_call / self.raw_execute


def _median_call(fn, calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e9


def measure_overhead(calls: int = 3000, rounds: int = 5) -> Overhead:
    """Median time of ``exe(x_device)`` and of
    ``exe._loaded.execute_sharded([x_device.array])`` on the same device
    array, for ``f(x) = x * 2 + 1`` on 256 floats.  The two are interleaved
    in ``rounds`` so drift hits both; the reported value is the median of
    the per-round medians."""

    def small(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    x = torch.randn(256)
    exe = hloalias.compile(small, (x,))
    device_x = exe.to_device(x)
    arrays = [device_x.array]
    loaded = exe._loaded

    def call() -> None:
        exe(device_x)

    def call_torch() -> None:
        exe(x)

    def raw() -> None:
        loaded.execute_sharded(arrays)

    def raw_unpack() -> None:
        # What a call needs before it can hand results over: the program
        # has run (``execute_sharded`` alone returns before it has).
        for shards in loaded.execute_sharded(arrays).disassemble_into_single_device_arrays():
            for shard in shards:
                shard.block_until_ready()

    for fn in (call, call_torch, raw, raw_unpack):  # warm-up
        _median_call(fn, 200)
    per_round: dict[str, list[float]] = {"call": [], "call_torch": [], "raw": [], "raw_unpack": []}
    for _ in range(rounds):
        for name, fn in (("call", call), ("raw", raw), ("raw_unpack", raw_unpack), ("call_torch", call_torch)):
            per_round[name].append(_median_call(fn, calls // rounds))
    return Overhead(
        calls,
        statistics.median(per_round["call"]),
        statistics.median(per_round["raw"]),
        statistics.median(per_round["raw_unpack"]),
        statistics.median(per_round["call_torch"]),
    )
