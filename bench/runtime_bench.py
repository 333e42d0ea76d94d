"""Runtime benchmark (issue 11): per-call time and host peak RSS growth per
call of in-place updates, against the same XLA program driven through
``jax.jit`` with the state on the device; and the device bytes a second
executable of the same module adds.  Not a timed test.

From the repository root::

    .venv/bin/python -m bench.runtime_bench [--cache-mib 64] [--calls 30]

writes ``bench/RESULTS-runtime.md``.

Per-call time is compared with two drivers of the *same* XLA program (the
final StableHLO hloalias compiled, state and inputs already on the device,
the same arguments donated), so the ratio is runtime overhead and nothing
else: ``jax.jit`` of that module wrapped as a ``jax.export.Exported``, and
raw PJRT (``execute_sharded``, unpack, wait for every result).  A hand-written
jax program (``jax idiomatic``) is listed for reference: XLA may compile it
differently (torch-mlir lowers the cache update to a select over the whole
cache where jax emits a dynamic-update-slice).  Times are the median of
per-round medians, the drivers interleaved round by round so drift hits all.
Each hloalias workload is also timed on the Python call path (the same
workload compiled with ``HLOALIAS_NATIVE=0``): what a call costs where the
native call path (runtime/_lane.cpp) is not built or does not apply.

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
from collections.abc import Callable, Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np
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


def interleaved(calls: dict[str, Callable[[], Any]], count: int, rounds: int = 5) -> dict[str, float]:
    """Median seconds per call of each of ``calls``: ``rounds`` rounds of
    ``count // rounds`` calls each, the callables taking turns per round;
    the median of the per-round medians."""
    for call in calls.values():
        for _ in range(3):
            call()
    per_round: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            samples = []
            for _ in range(max(1, count // rounds)):
                start = time.perf_counter()
                call()
                samples.append(time.perf_counter() - start)
            per_round[name].append(statistics.median(samples))
    return {name: statistics.median(values) for name, values in per_round.items()}


def _exported(exe: hloalias.Executable) -> Any:
    """The executable's final module as a ``jax.export.Exported`` (one
    device, this process's platform), for ``jax.jit`` to drive."""
    import jax.export
    from jax import tree_util
    from torch_mlir._mlir_libs import _stablehlo

    from hloalias.runtime.pjrt import prepare_for_xla, target_stablehlo_version

    artifact = _stablehlo.serialize_portable_artifact_str(prepare_for_xla(exe.mlir), target_stablehlo_version())
    in_avals = tuple(jax.core.ShapedArray(shape, _numpy_dtype(dtype)) for shape, dtype in exe._arg_types)
    out_avals = tuple(
        jax.core.ShapedArray(shape, _numpy_dtype(dtype)) for shape, dtype in zip(exe._result_shapes, exe._result_dtypes)
    )
    return jax.export.Exported(
        fun_name="main", in_tree=tree_util.tree_structure((tuple(range(len(in_avals))), {})), in_avals=in_avals,
        out_tree=tree_util.tree_structure(tuple(range(len(out_avals)))), out_avals=out_avals,
        _has_named_shardings=False, _in_named_shardings=(None,) * len(in_avals),
        _out_named_shardings=(None,) * len(out_avals), in_shardings_hlo=(None,) * len(in_avals),
        out_shardings_hlo=(None,) * len(out_avals), nr_devices=1, platforms=(exe.device.platform,),
        ordered_effects=(), unordered_effects=(), disabled_safety_checks=(), mlir_module_serialized=artifact,
        calling_convention_version=9, module_kept_var_idx=tuple(range(len(in_avals))),
        uses_global_constants=False, _get_vjp=None,
    )


def _numpy_dtype(dtype: torch.dtype) -> Any:
    return torch.empty((), dtype=dtype).numpy().dtype


JAX_TO_TORCH = "jax.jit (same program) + the output as a torch tensor (`torch.from_dlpack`)"


#: The driver of the same workload compiled with the native call path off.
PYTHON_PATH = "the Python path (`HLOALIAS_NATIVE=0`)"


def python_path_compile(*args: Any, **kwargs: Any) -> hloalias.Executable:
    """``hloalias.compile`` with the native call path off for this executable
    (``HLOALIAS_NATIVE=0`` while it is built): what every call costs where
    the extension is not built."""
    previous = os.environ.get("HLOALIAS_NATIVE")
    os.environ["HLOALIAS_NATIVE"] = "0"
    try:
        exe = hloalias.compile(*args, **kwargs)
    finally:
        if previous is None:
            del os.environ["HLOALIAS_NATIVE"]
        else:
            os.environ["HLOALIAS_NATIVE"] = previous
    assert exe._lane is None
    return exe


def same_program_drivers(
    exe: hloalias.Executable, inputs: dict[int, torch.Tensor], torch_output: int | None = None,
) -> dict[str, Callable[[], Any]]:
    """Calls of ``exe``'s XLA program with every argument on the device:
    ``jax.jit (same program)`` and ``raw PJRT``.  Each argument aliased to a
    result (a mutation or a donor) is donated and fed that result on the
    next call, as hloalias's runtime does; every result is waited for.
    With ``torch_output`` (a result position), also :data:`JAX_TO_TORCH`:
    the ``jax.jit`` call returning that result as a torch tensor (zero
    copy), what a torch caller of the same program through jax gets."""
    donated = sorted(exe._aliases)
    feedback = {arg: result for arg, result in exe._aliases.items() if result is not None}

    def initial() -> list[jax.Array]:
        device = exe.device
        state = exe.state_dict()
        return [
            jax.device_put(state[name].numpy() if name is not None else inputs[index].numpy(), device)
            for index, name in exe._arg_plan
        ]

    # x64 on, as the runtime's transfers: int64 inputs (token ids, cache
    # positions) stay int64, as the program was compiled for them.
    with jax.enable_x64(True):
        jitted = jax.jit(_exported(exe).call, donate_argnums=tuple(donated))
        jax_args = initial()
        raw_args = initial()
    loaded = exe._loaded

    def jax_call() -> Any:
        with jax.enable_x64(True):
            results = jitted(*jax_args)
        for arg, result in feedback.items():
            jax_args[arg] = results[result]
        for result in results:
            result.block_until_ready()
        return results

    def raw_call() -> None:
        results = [shards[0] for shards in loaded.execute_sharded(raw_args).disassemble_into_single_device_arrays()]
        for arg, result in feedback.items():
            raw_args[arg] = results[result]
        for result in results:
            result.block_until_ready()

    drivers: dict[str, Callable[[], Any]] = {"jax.jit (same program)": jax_call, "raw PJRT": raw_call}
    if torch_output is not None:
        position = torch_output
        drivers[JAX_TO_TORCH] = lambda: torch.from_dlpack(jax_call()[position])
    return drivers


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


def run(cache_mib: int, calls: int, timed_calls: int) -> list[dict[str, Any]]:
    heads, dim = 16, 256
    length = cache_mib * MIB // (heads * dim * 4)
    shape = (heads, length, dim)
    cache_bytes = heads * length * dim * 4
    new = torch.randn(heads, dim)
    rows: list[dict[str, Any]] = []

    def row(name: str, exe: hloalias.Executable, ours: Callable[[], Any], idiomatic: Callable[[], Any],
            inputs: dict[int, torch.Tensor], python: Callable[[], Any]) -> dict[str, Any]:
        drivers = same_program_drivers(exe, inputs)
        times = interleaved(
            {"hloalias": ours, PYTHON_PATH: python, **drivers, "jax idiomatic": idiomatic}, timed_calls
        )
        return {"workload": name, "times": times, "ours": measure(ours, calls), "jax": measure(idiomatic, calls),
                "tensor": cache_bytes, "copies": dict(exe.host_copies)}

    # KV: cache passed as an input.
    exe = hloalias.compile(kv_update, (torch.zeros(shape), new))
    cache = torch.zeros(shape)
    jit = jax.jit(lambda c, n: (c.at[:, POS].set(n), n * 2), donate_argnums=0)
    state = {"c": jnp.zeros(shape), "n": jnp.asarray(new.numpy())}

    def jax_kv() -> None:
        state["c"], out = jit(state["c"], state["n"])
        out.block_until_ready()
        state["c"].block_until_ready()

    python = python_path_compile(kv_update, (torch.zeros(shape), new))
    python_cache = torch.zeros(shape)
    rows.append(row("KV (cache as input)", exe, lambda: exe(cache, new), jax_kv, {0: torch.zeros(shape), 1: new},
                    lambda: python(python_cache, new)))
    del exe, cache, state, python, python_cache
    gc.collect()

    # StateKV: cache as a module buffer.
    module = StateKV(shape)
    exe = hloalias.compile(module, (new,))
    state = {"c": jnp.zeros(shape), "n": jnp.asarray(new.numpy())}
    user = exe._user_indices[0]
    python_module = StateKV(shape)
    python = python_path_compile(python_module, (new,))
    rows.append(row("StateKV (cache as buffer)", exe, lambda: exe(new), jax_kv, {user: new}, lambda: python(new)))
    del exe, module, state, python, python_module
    gc.collect()

    # Donation: y = x * 2 + 1, x donated, fed its own result.
    exe = hloalias.compile(donation, (torch.zeros(shape),), donate_argnums=[0])
    chain = {"x": torch.zeros(shape)}

    def ours_donate() -> None:
        chain["x"] = exe(chain["x"])

    jit_d = jax.jit(lambda x: x * 2 + 1, donate_argnums=0)
    jchain = {"x": jnp.zeros(shape)}

    def jax_donate() -> None:
        jchain["x"] = jit_d(jchain["x"])
        jchain["x"].block_until_ready()

    python = python_path_compile(donation, (torch.zeros(shape),), donate_argnums=[0])
    python_chain = {"x": torch.zeros(shape)}

    def python_donate() -> None:
        python_chain["x"] = python(python_chain["x"])

    rows.append(row("donation (y = x*2+1)", exe, ours_donate, jax_donate, {0: torch.zeros(shape)}, python_donate))
    return rows


def decode_step_rows(timed_calls: int) -> list[dict[str, Any]]:
    """Per-call time of a real decode step against ``jax.jit`` and raw PJRT
    of the same program: transformers' static-cache export recipe
    (``TorchExportableModuleWithStaticCache``) on a small Llama with random
    weights, one token per call at a fixed position (the KV caches are
    module buffers updated in place, inferred donors).  Same interleaving
    as the per-call table."""
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
    step = {"input_ids": torch.tensor([[5]]), "cache_position": torch.tensor([7])}
    exe = hloalias.compile(wrapper, (), step)
    inputs = dict(zip(exe._user_indices, (step["input_ids"], step["cache_position"])))
    drivers = same_program_drivers(exe, inputs)
    python = python_path_compile(wrapper, (), step)  # the same module: its state is shared
    times = interleaved({"hloalias": lambda: exe(**step), PYTHON_PATH: lambda: python(**step), **drivers}, timed_calls)
    return [{"workload": "HF Llama decode step (static cache, 4 layers, hidden 256; transformers' export recipe)",
             "times": times, "arguments": len(exe._arg_plan)}]


DEVICE_TENSOR_CHAIN = "DeviceTensor chain (y = exe(hloalias.to_device(y)))"
DEVICE_TENSOR_READY = ("DeviceTensor made before the call (exe(d); d = hloalias.to_device(x) and its upload "
                       "waited for, not timed)")


def uploaded(tensor: torch.Tensor) -> hloalias.DeviceTensor:
    """``hloalias.to_device(tensor)`` with its upload finished: ``to_device``
    returns before the copy into the device buffer is done, so a call timed
    right after it would include the rest of the copy."""
    device_tensor = hloalias.to_device(tensor)
    device_tensor.array.block_until_ready()
    return device_tensor


def timed_with_setup(setup: Callable[[], Any], call: Callable[[Any], Any], count: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the median seconds of ``call(setup())``,
    only ``call`` timed (its result is released after the clock stops)."""
    medians = []
    for _ in range(rounds):
        samples = []
        for _ in range(max(1, count // rounds)):
            value = setup()
            start = time.perf_counter()
            result = call(value)
            samples.append(time.perf_counter() - start)
            del value, result
        medians.append(statistics.median(samples))
    return statistics.median(medians)


def latency_rows(timed_calls: int) -> list[dict[str, Any]]:
    """Per-call time of bench.latency's ``donate`` and ``sgd_mlp`` workloads
    (same configurations) with the inputs as bench.latency passes them (torch
    tensors, the same ones every call) and device-owned as the peers pass
    them, against the same XLA program under jax.jit and raw PJRT."""
    from bench import workloads

    rows = []
    donate = workloads.donate_workload()
    exe = hloalias.compile(donate.module, donate.args, donate=donate.donate)
    x = donate.args[0]
    chain = {"y": exe(x.clone())}

    def donate_chain() -> None:
        chain["y"] = exe(chain["y"])  # a runtime-owned result, donated: XLA writes in place

    device_chain = {"y": exe(x.clone())}

    def device_tensor_chain() -> None:
        # The DeviceTensor route: consumed on donation, so XLA writes its
        # buffer in place; the upload of y is part of the step.
        device_chain["y"] = exe(hloalias.to_device(device_chain["y"]))

    drivers = same_program_drivers(exe, {exe._user_indices[0]: x})
    times = interleaved({"torch input (as bench.latency)": lambda: exe(x),
                         "device-owned input (y = exe(y))": donate_chain,
                         DEVICE_TENSOR_CHAIN: device_tensor_chain, **drivers}, timed_calls)
    # The DeviceTensor made (and uploaded) before each call, outside the
    # timed region (as the peers' fresh device buffer): the call alone.
    times[DEVICE_TENSOR_READY] = timed_with_setup(lambda: uploaded(x), exe, timed_calls)
    rows.append({"workload": f"donate ({donate.title.split(': ', 1)[1]})", "times": times})
    del exe, chain, drivers
    gc.collect()

    sgd = workloads.sgd_workload(workloads.MLPConfig())
    exe = hloalias.compile(sgd.module, sgd.args, donate=sgd.donate)
    on_device = [exe.to_device(a) for a in sgd.args]
    drivers = same_program_drivers(exe, dict(zip(exe._user_indices, sgd.args)))
    with torch.no_grad():
        times = interleaved({"torch input (as bench.latency)": lambda: exe(*sgd.args),
                             "device-owned input (DeviceTensor)": lambda: exe(*on_device), **drivers}, timed_calls)
    rows.append({"workload": "sgd_mlp (4x1024 MLP, SGD-momentum step in place)", "times": times})
    return rows


class ManyState(torch.nn.Module):
    """600 parameters of 4 floats, all read by one call."""

    def __init__(self, count: int = 600) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(4)) for _ in range(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = x
        for weight in self.weights:
            total = total + weight
        return total


def best_of_rounds(
    timed: dict[str, Callable[[], Any]], calls: int, rounds: int, per_round: dict[str, list[float]] | None = None,
    after: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, float]:
    """Seconds per call of each of ``timed`` (under ``torch.no_grad``): the
    minimum over ``rounds`` interleaved rounds of the median of ``calls``
    calls, after ``calls // 10`` (at least 10) warm-up calls each.  CPU work:
    the minimum is the figure least moved by other processes.  Each round's
    medians are appended to ``per_round`` when given (ratios of drivers
    timed side by side in one round move less than their minima).
    ``after[name]``, where given, runs after each of that driver's calls,
    untimed (work between calls)."""
    best = {name: float("inf") for name in timed}
    between = after or {}
    with torch.no_grad():
        for fn in timed.values():
            for _ in range(max(10, calls // 10)):
                fn()
        for _ in range(rounds):
            for name, fn in timed.items():
                gc.collect()
                samples = []
                untimed = between.get(name, _nothing)
                for _ in range(calls):
                    start = time.perf_counter()
                    fn()
                    samples.append(time.perf_counter() - start)
                    untimed()
                best[name] = min(best[name], statistics.median(samples))
                if per_round is not None:
                    per_round.setdefault(name, []).append(statistics.median(samples))
    return best


def _nothing() -> None:
    pass


def overhead_rows(calls: int, rounds: int = 7) -> list[dict[str, Any]]:
    """Per-call host overhead of ``Executable.__call__`` against raw PJRT on
    the same buffers (execute, unpack, wait for every result: what a call
    needs before it can hand results over) and against the dispatch alone
    (``execute_sharded``, which returns before the program has run), on the
    seed, ``x * 2 + 1`` on 256 floats and a module with 600 state arrays;
    torch and ``DeviceTensor`` inputs.  Minimum over ``rounds`` interleaved
    rounds of the median of ``calls`` calls (the overhead is CPU work: the
    minimum is the figure least moved by other processes)."""
    from bench import workloads
    from hloalias.runtime.pjrt import compile_module

    cases: list[tuple[str, hloalias.Executable, tuple[Any, ...]]] = []
    seed = workloads.seed_workload()
    seed_exe = hloalias.compile(seed.module, seed.args)
    cases.append(("seed (torch input)", seed_exe, seed.args))
    x = torch.randn(256)
    small = hloalias.compile(donation, (x,))
    cases.append(("x*2+1 on 256 floats (torch input)", small, (x,)))
    cases.append(("x*2+1 on 256 floats (DeviceTensor input)", small, (small.to_device(x),)))
    module = ManyState()
    x4 = torch.randn(4)
    many = hloalias.compile(module, (x4,))
    cases.append(("600 parameters of 4 floats (torch input)", many, (x4,)))
    cases.append(("600 parameters of 4 floats (DeviceTensor input)", many, (many.to_device(x4),)))
    rows = []
    for name, exe, args in cases:
        arrays = [exe._state_array(state) if state is not None else
                  jax.device_put(args[exe._user_indices.index(index)].to_torch().numpy()
                                 if isinstance(args[0], hloalias.DeviceTensor)
                                 else args[exe._user_indices.index(index)].numpy(), exe.device)
                  for index, state in exe._arg_plan]
        # The seed computes nothing and has no XLA executable (no call runs
        # one): raw PJRT of its final module, compiled here, is the floor.
        loaded = exe._loaded if exe._loaded is not None else compile_module(
            exe.mlir, exe.device, allow_stored_state=True)

        def raw() -> None:
            for shards in loaded.execute_sharded(arrays).disassemble_into_single_device_arrays():
                shards[0].block_until_ready()

        def dispatch() -> None:
            loaded.execute_sharded(arrays)

        def ours() -> None:
            exe(*args)

        per_round: dict[str, list[float]] = {}
        best = best_of_rounds({"call": ours, "raw": raw, "dispatch": dispatch}, calls, rounds, per_round)
        ratios = [call / raw_time for call, raw_time in zip(per_round["call"], per_round["raw"])]
        rows.append({"program": name, **best, "runs_xla": exe._plan is None or exe._plan.executes,
                     "round_ratio": statistics.median(ratios)})
    return rows


def floor_rows(cache_mib: int, calls: int, rounds: int = 7) -> list[dict[str, Any]]:
    """What the KV call cannot go below, driver by driver, interleaved in one
    process: ``jax.jit`` of the final program (jax's C++ dispatch), raw PJRT
    through jaxlib's Python API (``execute_sharded``, unpack, wait), the
    runtime's own entry (``SingleDeviceDispatch``: jaxlib's C++ fast path
    around the same loaded executable, and its wait), the same plus turning
    the user output into a torch tensor a later call can donate
    (``HostBacking``: what every CPU call returns), ``jax.jit`` with its
    output as a torch tensor (what a torch caller of the same program
    through jax gets), ``jax.jit`` with one small torch op between calls,
    ``jax.jit`` with 40 µs of Python between calls (PJRT's workers park
    when idle longer than ~20-40 µs), and the hloalias call.  Also the
    conversion alone, timed in a loop of its own.  Minimum over ``rounds``
    of the median of ``calls`` (the between-call work is not timed)."""
    from hloalias.runtime.ownership import host_backed_tensor
    from hloalias.runtime.pjrt import SingleDeviceDispatch

    heads, dim = 16, 256
    shape = (heads, cache_mib * MIB // (heads * dim * 4), dim)
    new = torch.randn(heads, dim)
    exe = hloalias.compile(kv_update, (torch.zeros(shape), new))
    cache = torch.zeros(shape)
    python = python_path_compile(kv_update, (torch.zeros(shape), new))
    python_cache = torch.zeros(shape)
    output = exe._result_keys.index("output:0")
    drivers = same_program_drivers(exe, {0: torch.zeros(shape), 1: new}, torch_output=output)
    dispatch = SingleDeviceDispatch(exe._loaded, exe.device)
    args: list[jax.Array | None] = [
        jax.device_put(np.zeros(shape, np.float32), exe.device), jax.device_put(new.numpy(), exe.device),
    ]
    feedback = {arg: result for arg, result in exe._aliases.items() if result is not None}

    def runtime_dispatch() -> Sequence[jax.Array]:
        results = dispatch.run(args)
        dispatch.wait(results)
        for arg, result in feedback.items():
            args[arg] = results[result]
        return results

    def dispatch_and_tensor() -> torch.Tensor:
        results = runtime_dispatch()
        tensor, _ = host_backed_tensor(results[output], torch.float32, (heads, dim), heads * dim * 4, ready=True)
        return tensor

    # jax.jit with work between calls, its own time still timed alone: what
    # a torch program's own work between steps does to jax's tight loop.
    jax_call = drivers["jax.jit (same program)"]
    torch_op_between = f"jax.jit (same program), `torch.empty({heads}, {dim})` between calls"
    python_between = "jax.jit (same program), 40 µs of Python between calls"

    ready = jax.device_put(np.ones((heads, dim), np.float32), exe.device).block_until_ready()

    def conversion_alone() -> torch.Tensor:
        return host_backed_tensor(ready, torch.float32, (heads, dim), heads * dim * 4, ready=True)[0]

    timed = {
        "jax.jit (same program)": jax_call,
        "raw PJRT (execute_sharded, unpack, wait)": drivers["raw PJRT"],
        "the runtime's dispatch (jaxlib's C++ fast path) and wait": runtime_dispatch,
        "the runtime's dispatch and wait + the output as a donatable torch tensor": dispatch_and_tensor,
        JAX_TO_TORCH: drivers[JAX_TO_TORCH],
        torch_op_between: jax_call,
        python_between: jax_call,
        "hloalias call": lambda: exe(cache, new),
        f"hloalias call, {PYTHON_PATH}": lambda: python(python_cache, new),
        "the output conversion alone, in its own loop": conversion_alone,
    }
    after = {torch_op_between: lambda: torch.empty(heads, dim), python_between: lambda: _spin(40_000)}
    best = best_of_rounds(timed, calls, rounds, after=after)
    return [{"driver": name, "seconds": seconds} for name, seconds in best.items()]


def _spin(nanoseconds: int) -> None:
    """Busy Python work for ``nanoseconds`` (no torch, no syscalls)."""
    end = time.perf_counter_ns() + nanoseconds
    while time.perf_counter_ns() < end:
        pass


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


def _same_program_cells(times: dict[str, float]) -> str:
    """The table cells hloalias, its Python path, jax.jit (same program) and
    raw PJRT in ms/call, then hloalias's ratio to each of the last two."""
    ours, jax_same, raw = times["hloalias"], times["jax.jit (same program)"], times["raw PJRT"]
    return (f"{ours * 1e3:.3f} | {times[PYTHON_PATH] * 1e3:.3f} | {jax_same * 1e3:.3f} | {raw * 1e3:.3f} | "
            f"{ours / jax_same:.2f}x | {ours / raw:.2f}x")


def report(rows: list[dict[str, Any]], overhead: list[dict[str, Any]], latency: list[dict[str, Any]],
           floor: list[dict[str, Any]], decode: list[dict[str, Any]], second: dict[str, int], cache_mib: int, calls: int, timed_calls: int, latency_calls: int,
           overhead_calls: int, load: str) -> str:
    timed_calls_note = f"{latency_calls} calls per driver"
    lines = [
        "# Runtime benchmark (issue 11)",
        "",
        f"`python -m bench.runtime_bench --cache-mib {cache_mib} --calls {calls} --timed-calls {timed_calls} "
        f"--latency-calls {latency_calls} --overhead-calls {overhead_calls}` "
        f"on CPU PJRT ({os.cpu_count()} cores, shared machine: times are indicative; load average at the "
        f"start: {load}).",
        "",
        "## Per-call time",
        "",
        f"Median of 5 per-round medians over {timed_calls} calls per driver, the drivers interleaved round "
        "by round. *jax.jit (same program)* and *raw PJRT* run hloalias's final StableHLO with every "
        "argument already on the device and the same arguments donated (the module wrapped as a "
        "`jax.export.Exported`; raw PJRT is `execute_sharded`, unpack, wait for every result): the ratio "
        "is the runtime's overhead. hloalias takes torch tensors (KV's `new` is imported zero-copy each "
        "call, jax's is already a device array) and waits for every result before returning torch tensors; "
        "*its Python path* is the same workload compiled with `HLOALIAS_NATIVE=0` (no native call path). "
        "*jax idiomatic* is the same computation written in jax: XLA compiles it differently.",
        "",
        "| workload | hloalias ms/call | its Python path ms/call | jax.jit (same program) ms/call | "
        "raw PJRT ms/call | ratio to jax.jit | ratio to raw | jax idiomatic ms/call |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['workload']} | {_same_program_cells(row['times'])} | "
            f"{row['times']['jax idiomatic'] * 1e3:.3f} |"
        )
    jax_floor = next(row["seconds"] for row in floor if row["driver"] == "jax.jit (same program)")
    lines += [
        "",
        "## The floor of the KV call",
        "",
        f"The KV program's drivers interleaved in one process (minimum over 7 rounds of the median of "
        f"{overhead_calls} calls; the work *between calls* is not timed). The goal (at most 1.5x "
        f"`jax.jit`) leaves {jax_floor * 1.5e6:.1f} µs here. The runtime enters the executable as "
        "`jax.jit` does (jaxlib's C++ fast path) and polls before it waits; the torch tensor every CPU "
        "call must return (one `HostBacking`, which a later call can donate) comes on top, made here the "
        "Python path's way. The hloalias call runs in native code (`runtime/_lane.cpp`: its checks, "
        "commit and a `from_blob` result tensor); the row after it is the same call on the Python path. "
        "The two rows with work between calls show what that work does to the next call: past ~20-40 µs "
        "idle, PJRT's worker threads park, and waking them costs more than the program.",
        "",
        "| driver | µs/call | / jax.jit |",
        "|---|---:|---:|",
    ]
    for row in floor:
        lines.append(f"| {row['driver']} | {row['seconds'] * 1e6:.1f} | {row['seconds'] / jax_floor:.2f}x |")
    lines += [
        "",
        "## A real decode step",
        "",
        "transformers' static-cache export recipe (`TorchExportableModuleWithStaticCache`, called with "
        "keywords as its docs do) on a small Llama with random weights; the KV caches are module buffers "
        "updated in place. Same drivers and interleaving as the per-call table.",
        "",
        "| workload | arguments | hloalias ms/call | its Python path ms/call | jax.jit (same program) ms/call | "
        "raw PJRT ms/call | ratio to jax.jit | ratio to raw |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in decode:
        lines.append(f"| {row['workload']} | {row['arguments']} | {_same_program_cells(row['times'])} |")
    lines += [
        "",
        "## Host memory per call",
        "",
        f"Largest peak RSS growth of one call over {calls} calls after 3 warm-up calls (VmHWM after minus "
        "VmRSS before, high-water mark reset before each call); jax is the idiomatic program.",
        "",
        "| workload | hloalias peak RSS growth/call | jax peak RSS growth/call | growth / updated tensor | "
        "host copies |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        (_, ours_rss), (_, jax_rss) = row["ours"], row["jax"]
        lines.append(
            f"| {row['workload']} | {ours_rss / MIB:.2f} MiB | {jax_rss / MIB:.2f} MiB | "
            f"{100 * ours_rss / row['tensor']:.1f}% | {row['copies'] or 'none'} |"
        )
    lines += [
        "",
        f"Updated tensor: {rows[0]['tensor'] / MIB:.0f} MiB. Goals (issue 11): at most 1.5x jax.jit per call; "
        "peak RSS growth per call at most 5% of the updated tensor for the in-place updates (KV, StateKV).",
        "",
        "## Per-call host overhead against raw PJRT (issue 14)",
        "",
        "`Executable.__call__` against the same compiled executable called raw on the same device "
        "buffers: *raw* = `execute_sharded`, unpack, wait for every result (what a call needs before it "
        "can hand results over); *dispatch* = `execute_sharded` alone, which returns before the program "
        f"has run. Minimum over 7 interleaved rounds of the median of {overhead_calls} calls (CPU work: the "
        "minimum is least moved by other processes). `bench.latency`'s overhead table is these rows.",
        "",
        "| program | `Executable.__call__` µs | raw µs | dispatch µs | call / raw | call / raw, median of the rounds' ratios |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in overhead:
        note = "" if row["runs_xla"] else " (no results: not run)"
        lines.append(
            f"| {row['program']}{note} | {row['call'] * 1e6:.1f} | {row['raw'] * 1e6:.1f} | "
            f"{row['dispatch'] * 1e6:.1f} | {row['call'] / row['raw']:.2f}x | {row['round_ratio']:.2f}x |"
        )
    lines += [
        "",
        "## bench.latency's donate and sgd_mlp, per call",
        "",
        "bench.latency times `exe(*workload.args)`: the same torch tensors every call. For donate that "
        "means a 64 MiB torch tensor donated each call, which PJRT cannot reuse (torch owns the memory), "
        "so XLA allocates and first-touches a new 64 MiB output every call; the peers instead get a fresh "
        "device buffer per call, prepared outside the timed region, and write it in place. The fair "
        "hloalias figure is the device-owned row (`y = exe(y)`: the result, runtime-owned, donated back). "
        f"Same method as above ({timed_calls_note}).",
        "",
        "| workload | hloalias, torch input (as bench.latency) ms | hloalias, device-owned input ms | "
        "jax.jit (same program) ms | raw PJRT ms | device-owned / jax.jit |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in latency:
        times = row["times"]
        torch_in = times["torch input (as bench.latency)"]
        device_in = next(v for k, v in times.items() if k.startswith("device-owned"))
        jax_same, raw = times["jax.jit (same program)"], times["raw PJRT"]
        lines.append(
            f"| {row['workload']} | {torch_in * 1e3:.2f} | {device_in * 1e3:.2f} | {jax_same * 1e3:.2f} | "
            f"{raw * 1e3:.2f} | {device_in / jax_same:.2f}x |"
        )
    donate_times = latency[0]["times"]
    lines += [
        "",
        "### The donation chain, by route",
        "",
        "The donate workload above, each route to a donated input (same rounds; the row with the DeviceTensor "
        "made before the call times the call alone: the buffer made and its upload waited for before the "
        "clock starts, its result released after it stops). A donated torch tensor is never overwritten (issue 24 item 2: it is left as it was, "
        "whatever its memory), so `y = exe(y)` gets a fresh 64 MiB output each call. A donated `DeviceTensor` "
        "is consumed and XLA writes its buffer in place: the route to take for buffer reuse.",
        "",
        "| route | ms/call |",
        "|---|---:|",
    ]
    for name in ("torch input (as bench.latency)", "device-owned input (y = exe(y))", DEVICE_TENSOR_CHAIN,
                 DEVICE_TENSOR_READY, "jax.jit (same program)", "raw PJRT"):
        if name in donate_times:
            lines.append(f"| {name} | {donate_times[name] * 1e3:.2f} |")
    lines += [
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
    notes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime_notes.md")
    if os.path.exists(notes):
        with open(notes) as handle:
            lines += ["", handle.read().rstrip()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--calls", type=int, default=30, help="calls for the RSS measurement")
    parser.add_argument("--timed-calls", type=int, default=500, help="calls per driver for the time")
    parser.add_argument("--latency-calls", type=int, default=50,
                        help="calls per driver for bench.latency's donate and sgd_mlp")
    parser.add_argument("--overhead-calls", type=int, default=500, help="calls per round for the overhead rows")
    parser.add_argument("--weight-mib", type=int, default=64)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS-runtime.md"))
    options = parser.parse_args()
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    rows = run(options.cache_mib, options.calls, options.timed_calls)
    floor = floor_rows(options.cache_mib, options.overhead_calls)
    decode = decode_step_rows(options.timed_calls)
    overhead = overhead_rows(options.overhead_calls)
    latency = latency_rows(options.latency_calls)
    second = second_executable(options.weight_mib)
    text = report(rows, overhead, latency, floor, decode, second, options.cache_mib, options.calls, options.timed_calls,
                  options.latency_calls, options.overhead_calls, load)
    with open(options.out, "w") as handle:
        handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
