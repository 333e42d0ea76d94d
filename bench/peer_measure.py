"""Measure one peer system on the bench workloads; runs INSIDE the peer's own
virtualenv (torch 2.9 there), started by :mod:`bench.peers`, and prints one
JSON document on stdout.

    <peer-venv>/bin/python -m bench.peer_measure torchax seed,sgd_mlp

Only :mod:`bench.workloads`' torch modules are used; that module's
``hloalias`` import is satisfied by a stub when hloalias is not installed
(peers never run hloalias), and ``jax`` by a stub for torch_xla's
environment (the JAX variants are never called here).

Method (as ``shared/peers.md``): first call = trace + compile + run, waiting
for every result (wall time, and the process's CPU time, every thread); steady = median of ``--calls`` calls, each waiting for
all results.  Donated inputs get a fresh device copy before each call,
outside the timed region.  Every call runs under ``torch.no_grad()`` so
autograd keeps no extra outputs.  After one call the module state is
compared with eager PyTorch's: ``state_ok`` False means the system dropped
in-place state updates."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from typing import Any


def _install_stubs() -> None:
    try:
        importlib.import_module("hloalias.pipeline")
    except ImportError:  # the repo's hloalias/ folder may import; its layers do not
        stub = types.ModuleType("hloalias")
        pipeline = types.ModuleType("hloalias.pipeline")
        pipeline.DEFAULT_PIPELINE = "builtin.module()"  # type: ignore[attr-defined]
        stub.pipeline = pipeline  # type: ignore[attr-defined]
        sys.modules["hloalias"] = stub
        sys.modules["hloalias.pipeline"] = pipeline
    try:
        importlib.import_module("jax")
    except ImportError:
        jax_stub = types.ModuleType("jax")
        for name in ("numpy", "lax"):
            sub = types.ModuleType(f"jax.{name}")
            setattr(jax_stub, name, sub)
            sys.modules[f"jax.{name}"] = sub
        sys.modules["jax"] = jax_stub


_install_stubs()

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402

from bench import workloads  # noqa: E402

build = workloads.build  # the programs hloalias measures (bench.latency)


def _donated_positions(workload: workloads.Workload) -> list[int]:
    return [d for d in workload.donate if isinstance(d, int)]


def _max_state_error(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> float:
    worst = 0.0
    for name, value in expected.items():
        if name not in got:
            continue  # a tied duplicate torchax keeps once
        other = got[name].detach().to("cpu").to(value.dtype)
        if value.numel():
            worst = max(worst, float((value.float() - other.float()).abs().max()))
    return worst


def _median(fn: Callable[[], None], calls: int, prepare: Callable[[], None] | None = None) -> float:
    samples = []
    for _ in range(calls):
        if prepare is not None:
            prepare()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# -- torchax -------------------------------------------------------------------


def measure_torchax(workload: workloads.Workload, calls: int, variant: str) -> dict[str, Any]:
    import jax
    import torchax
    from torchax import interop

    expected_outputs, expected_state, _, _ = workloads.eager_reference(workload)
    env = torchax.default_env()
    module = workload.module
    donated = _donated_positions(workload)
    with env:
        module = module.to("jax")
        args = [a.to("jax") for a in workload.args]
    base_args = args
    jittable = interop.JittableModule(module)
    user_donate = tuple(2 + i for i in donated)
    if variant == "documented":
        # torchax's documented path: torchax.compile with donation through
        # jax_jit_kwargs.  The jitted function returns only forward's result.
        compiled = torchax.compile(module, torchax.CompileOptions(
            jax_jit_kwargs={"donate_argnums": user_donate} if user_donate else {}))

        def step_torch(*call_args: Any) -> Any:
            return compiled(*call_args)

        def inner(params: Any, buffers: Any, *call_args: Any) -> Any:
            return jittable.functional_call("forward", params, buffers, *call_args)

        donate_argnums = user_donate
    else:
        # Functional variant: return what forward mutated (parameters and
        # buffers), donate it and write it back, so state updates survive.
        def inner(params: Any, buffers: Any, *call_args: Any) -> Any:
            out = jittable.functional_call("forward", params, buffers, *call_args)
            return out, params, buffers

        donate_argnums = (0, 1) + user_donate
        jitted = interop.jax_jit(inner, kwargs_for_jax_jit={"donate_argnums": donate_argnums})

        def step_torch(*call_args: Any) -> Any:
            out, jittable.params, jittable.buffers = jitted(jittable.params, jittable.buffers, *call_args)
            return out

    def fresh_args() -> list[Any]:
        if not donated:
            return args
        with env:
            return [workload.args[i].to("jax") if i in donated else a for i, a in enumerate(base_args)]

    current: list[Any] = fresh_args()

    def call() -> None:
        with torch.no_grad(), env, torch.device("jax"):  # factory calls in forward (torch.arange)
            out = step_torch(*current)
        jax.block_until_ready(interop.jax_view(pytree.tree_leaves(out)))  # type: ignore[no-untyped-call]

    def prepare() -> None:
        nonlocal current
        current = fresh_args()

    start, start_cpu = time.perf_counter(), time.process_time()
    call()
    first, first_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    # State after exactly one call, against eager's.
    holder = compiled if variant == "documented" else jittable  # the state the next call uses
    state_now = {k: _to_cpu(v) for k, v in {**holder.params, **holder.buffers}.items()}
    state_error = _max_state_error(expected_state, state_now)
    prepare()
    steady = _median(call, calls, prepare if donated else None)
    # Bytes of the function actually called (jax.jit of the same callable).
    jax_fn = jax.jit(interop.jax_view(inner), donate_argnums=donate_argnums)
    lowered_args = interop.jax_view((jittable.params, jittable.buffers, *fresh_args()))
    with env, torch.device("jax"):
        stats: Any = jax_fn.lower(*lowered_args).compile().memory_analysis()
    argument, output, alias, temp = (stats.argument_size_in_bytes, stats.output_size_in_bytes,
                                     stats.alias_size_in_bytes, stats.temp_size_in_bytes)
    del expected_outputs
    return {
        "first_call_s": first, "first_call_cpu_s": first_cpu, "steady_s": steady, "state_max_error": state_error,
        "bytes": {"argument": argument, "output": output, "alias": alias, "temp": temp,
                  "total": argument + output - alias + temp},
    }


def _to_cpu(value: Any) -> torch.Tensor:
    import numpy as np

    array = value.jax() if hasattr(value, "jax") else value
    return torch.from_numpy(np.asarray(array).copy())


# -- jax.jit (the workload's hand-written JAX program) ------------------------------


def measure_jax(workload: workloads.Workload, calls: int, variant: str) -> dict[str, Any]:
    """``jax.jit`` of the workload's hand-written JAX function, its
    ``jax_donate_argnums`` donated.  Runs in hloalias's own environment (jax
    is pinned the same there); the inputs are made, so the backend is up,
    before the first call, as the peers move theirs to the device first."""
    import jax

    donate = workload.jax_donate_argnums
    current = workload.jax_inputs()
    jax.block_until_ready(current)
    jitted = jax.jit(workload.jax_fn, donate_argnums=donate)

    def call() -> None:
        jax.block_until_ready(jitted(*current))

    def prepare() -> None:
        nonlocal current
        current = workload.jax_inputs()  # donated inputs are consumed by a call
        jax.block_until_ready(current)

    start, start_cpu = time.perf_counter(), time.process_time()
    call()
    first, first_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    prepare()
    steady = _median(call, calls, prepare if donate else None)
    stats: Any = jitted.lower(*workload.jax_inputs()).compile().memory_analysis()
    argument, output, alias, temp = (stats.argument_size_in_bytes, stats.output_size_in_bytes,
                                     stats.alias_size_in_bytes, stats.temp_size_in_bytes)
    return {
        "first_call_s": first, "first_call_cpu_s": first_cpu, "steady_s": steady,
        "state_max_error": None,  # functional: state goes in and out as arguments, no module to compare
        "bytes": {"argument": argument, "output": output, "alias": alias, "temp": temp,
                  "total": argument + output - alias + temp},
    }


# -- torch_xla -----------------------------------------------------------------


def measure_torch_xla(workload: workloads.Workload, calls: int, variant: str) -> dict[str, Any]:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as metrics

    _, expected_state, _, _ = workloads.eager_reference(workload)
    device = torch_xla.device()
    module = workload.module.to(device)
    donated = _donated_positions(workload)
    if donated:  # peers.md: buffer-donor config, then mark and drop the tensor before the sync
        torch_xla._XLAC._xla_set_enable_alias_with_buffer_donor_config(True)
    base_args = [a.to(device) for a in workload.args]
    torch_xla.sync()
    current: list[Any] | None = None

    def prepare() -> None:
        nonlocal current
        current = [a.clone().to(device) if i in donated else base_args[i] for i, a in enumerate(workload.args)]
        torch_xla.sync()
        for i in donated:
            torch_xla._XLAC._set_buffer_donation(current[i], True)
        xm.wait_device_ops()

    def call() -> None:
        nonlocal current
        call_args, current = current, None
        assert call_args is not None
        # Factory calls in forward (torch.arange in the GPT-2 mask) follow
        # the default device, as they would for a model written for XLA.
        with torch.no_grad(), torch.device(device):
            out = module(*call_args)
        del call_args
        torch_xla.sync()
        xm.wait_device_ops()
        del out

    prepare()

    start, start_cpu = time.perf_counter(), time.process_time()
    call()
    first, first_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    state_now = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    state_error = _max_state_error(expected_state, state_now)
    steady = _median(call, calls, prepare)
    alias_count = metrics.metric_data("InputOutputAliasCount")
    return {
        "first_call_s": first, "first_call_cpu_s": first_cpu, "steady_s": steady, "state_max_error": state_error,
        "aliases": None if alias_count is None else alias_count[0],
        "bytes": _xla_dump_bytes(),
    }


def _xla_dump_bytes() -> dict[str, int] | None:
    """Bytes of the largest executed graph from XLA's buffer-assignment dump
    (argument = entry parameters, output = maybe-live-out, alias = both,
    temp = preallocated temp), when XLA_FLAGS dumped to HLOALIAS_PEER_DUMP."""
    import glob
    import re

    directory = os.environ.get("HLOALIAS_PEER_DUMP")
    if not directory:
        return None
    best: dict[str, int] | None = None
    for path in glob.glob(os.path.join(directory, "*cpu_after_optimizations-buffer-assignment.txt")):
        argument = output = alias = temp = 0
        with open(path) as handle:
            for line in handle:
                match = re.match(r"allocation \d+: size (\d+),(.*)", line)
                if not match:
                    continue
                size, flags = int(match.group(1)), match.group(2)
                parameter = "parameter" in flags
                live_out = "maybe-live-out" in flags
                if parameter:
                    argument += size
                if live_out:
                    output += size
                if parameter and live_out:
                    alias += size
                if "preallocated-temp" in flags:
                    temp += size
        total = argument + output - alias + temp
        if best is None or total > best["total"]:
            best = {"argument": argument, "output": output, "alias": alias, "temp": temp, "total": total}
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=("torchax", "torch_xla", "jax"))
    parser.add_argument("workload")
    parser.add_argument("--variant", default="documented")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--gpt2-layers", type=int, default=12)
    options = parser.parse_args()
    torch.manual_seed(0)
    versions: dict[str, str] = {"torch": str(torch.__version__)}
    if options.peer == "torchax":
        import jax
        import torchax

        versions.update(torchax=getattr(torchax, "__version__", "?"), jax=jax.__version__)
        measure = measure_torchax
    elif options.peer == "jax":
        import jax

        versions["jax"] = jax.__version__
        measure = measure_jax
    else:
        import torch_xla

        versions["torch_xla"] = torch_xla.__version__
        measure = measure_torch_xla
    workload = build(options.workload, options.gpt2_layers)
    result = measure(workload, options.calls, options.variant)
    result.update(peer=options.peer, variant=options.variant, workload=options.workload, versions=versions)
    print("PEER-RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
