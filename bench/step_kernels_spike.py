"""Spike (issue 26, HF training step ≤ 2× its forward): can the step's XLA
compile lose kernels by grouping the optimizer's per-parameter updates, by
dropping the lr-0 ``where``s or ``order-in-place-updates``' guards, by the
embedding gather's form, or by an XLA:CPU option?  Findings and figures:
bench/RESULTS-latency.md (2026-12-06 section "the step's kernels, what
grouping and options would give").

Each part prints what it saw; none changes hloalias.

    .venv/bin/python -m bench.step_kernels_spike grouped [REPS]   # AdamW in JAX: per parameter, grouped, flat state
    .venv/bin/python -m bench.step_kernels_spike variants [REPS]  # the HF step's final module, edited / options

``grouped`` writes the HF step's AdamW (torch's capturable single-tensor
form, with the lr-0 ``where``) over the step's 21 parameter shapes in JAX
three ways: one update per parameter (what the step does now), one update
of all parameters and states concatenated and sliced back per parameter,
and a flat optimizer state (``exp_avg``/``exp_avg_sq`` one buffer each)
with per-parameter parameters.  ``variants`` builds the step of
``bench.latency``'s ``hf_training`` ratio child with ``HLOALIAS_DUMP_DIR``,
takes its final module and compiles it alone (as ``runtime/pjrt.py`` does)
as it is, with the lr-0 guard's predicate a constant false, with
``order-in-place-updates``' guards a constant true, with the embedding
gather written as ``[32,64]`` and a reshape, and under XLA:CPU options.
Kernels are the ``.ir-with-opt.ll`` files of ``xla_dump_to``; times are
CPU (``time.process_time``), the variants alternated."""

from __future__ import annotations

import glob
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

#: The HF step's parameter shapes (2-layer Llama of bench.latency.LLAMA).
SHAPES: list[tuple[int, ...]] = (
    [(256, 64)]
    + [(64, 64), (32, 64), (32, 64), (64, 64), (128, 64), (128, 64), (64, 128), (64,), (64,)] * 2
    + [(64,), (256, 64)]
)
B1, B2, EPS, WD = 0.9, 0.999, 1e-8, 0.01


def _cpu_medians(label_fns: list[tuple[str, Callable[[], Any]]], reps: int) -> None:
    times: dict[str, list[float]] = {label: [] for label, _ in label_fns}
    for _ in range(reps):
        for label, fn in label_fns:
            start = time.process_time()
            fn()
            times[label].append(time.process_time() - start)
    for label, samples in times.items():
        if samples:
            print(f"  {label}: CPU s {' / '.join(f'{t:.3f}' for t in samples)} (med {statistics.median(samples):.3f})")


def grouped(reps: int) -> None:
    import jax
    import jax.numpy as jnp

    def update(p: Any, g: Any, m: Any, v: Any, step: Any, lr: Any) -> tuple[Any, Any, Any, Any]:
        step = step + 1
        m = m + (g - m) * (1 - B1)
        v = v * B2 + g * g * (1 - B2)
        neg_step_size = -(lr / (1 - B1**step))
        denom = jnp.sqrt(v) / (jnp.sqrt(1 - B2**step) * neg_step_size) + EPS / neg_step_size
        return jnp.where(lr == 0, p, p * (1 - lr * WD) + m / denom), m, v, step

    def offsets(ps: list[Any]) -> list[int]:
        out = [0]
        for p in ps:
            out.append(out[-1] + p.size)
        return out

    def per_parameter(ps: Any, gs: Any, ms: Any, vs: Any, steps: Any, lr: Any) -> Any:
        return list(zip(*(update(*a, lr) for a in zip(ps, gs, ms, vs, steps))))

    def concatenated(ps: Any, gs: Any, ms: Any, vs: Any, steps: Any, lr: Any) -> Any:
        flat = lambda xs: jnp.concatenate([x.reshape(-1) for x in xs])  # noqa: E731
        cut = offsets(ps)
        new = update(flat(ps), flat(gs), flat(ms), flat(vs), steps[0], lr)
        split = lambda x: [x[a:b].reshape(p.shape) for a, b, p in zip(cut, cut[1:], ps)]  # noqa: E731
        return split(new[0]), split(new[1]), split(new[2]), [new[3]] * len(ps)

    def flat_state(ps: Any, gs: Any, m: Any, v: Any, steps: Any, lr: Any) -> Any:
        cut = offsets(ps)
        g = jnp.concatenate([x.reshape(-1) for x in gs])
        step = steps[0] + 1
        m = m + (g - m) * (1 - B1)
        v = v * B2 + g * g * (1 - B2)
        neg_step_size = -(lr / (1 - B1**step))
        out = []
        for a, b, p in zip(cut, cut[1:], ps):
            denom = jnp.sqrt(v[a:b].reshape(p.shape)) / (jnp.sqrt(1 - B2**step) * neg_step_size) + EPS / neg_step_size
            out.append(jnp.where(lr == 0, p, p * (1 - lr * WD) + m[a:b].reshape(p.shape) / denom))
        return out, m, v, step

    ones = lambda: [jnp.ones(s) for s in SHAPES]  # noqa: E731
    total = sum(math.prod(s) for s in SHAPES)
    steps, lr = [jnp.float32(1)] * len(SHAPES), jnp.float32(1e-3)
    cases: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
        ("per parameter", per_parameter, (ones(), ones(), ones(), ones(), steps, lr)),
        ("concatenated", concatenated, (ones(), ones(), ones(), ones(), steps, lr)),
        ("flat state", flat_state, (ones(), ones(), jnp.ones(total), jnp.ones(total), steps, lr)),
    ]
    for label, fn, args in cases:
        dump = tempfile.mkdtemp(prefix="stepker-")
        compiled = jax.jit(fn, donate_argnums=(0, 2, 3, 4)).lower(*args).compile({"xla_dump_to": dump})
        kernels = len(glob.glob(os.path.join(dump, "*.ir-with-opt.ll")))
        print(f"{label}: {kernels} kernels, temp {compiled.memory_analysis().temp_size_in_bytes:,} bytes")
    times: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    for _ in range(reps):
        for label, fn, args in cases:
            jax.clear_caches()  # else jax hands back the executable it made above
            lowered = jax.jit(fn, donate_argnums=(0, 2, 3, 4)).lower(*args)
            start = time.process_time()
            lowered.compile()
            times[label].append(time.process_time() - start)
    for label, samples in times.items():
        print(f"  {label}: XLA compile CPU s {' / '.join(f'{t:.3f}' for t in samples)} "
              f"(med {statistics.median(samples):.3f})")
    for label, fn, args in cases:
        jitted = jax.jit(fn)
        jax.block_until_ready(jitted(*args))
        samples = []
        for _ in range(30):
            start = time.perf_counter()
            jax.block_until_ready(jitted(*args))
            samples.append(time.perf_counter() - start)
        print(f"  {label}: run ms min {min(samples) * 1e3:.3f}, med {statistics.median(samples) * 1e3:.3f}")


def _hf_step_final_module() -> str:
    """The final module of bench.latency's hf_training step (caches off)."""
    dump = tempfile.mkdtemp(prefix="stepker-dump-")
    os.environ["HLOALIAS_CACHE"] = "0"
    os.environ["HLOALIAS_DUMP_DIR"] = dump
    import torch
    import transformers

    import hloalias
    from bench.latency import LLAMA

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": 2}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (2, 16))

    def lm_step(ids: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    hloalias.compile_training_step(lm_step, model.train(), optimizer, (ids,))
    del os.environ["HLOALIAS_DUMP_DIR"]
    (final,) = glob.glob(os.path.join(dump, "*", "09-final.mlir"))
    with open(final) as f:
        return f.read()


_GATHER = re.compile(
    r'    (%\d+) = "stablehlo\.gather"\((%arg\d+), (%arg\d+)\) <\{dimension_numbers = #stablehlo\.gather<offset_dims = '
    r"\[2\], collapsed_slice_dims = \[0\], start_index_map = \[0\], index_vector_dim = 2>, indices_are_sorted = "
    r"false, slice_sizes = array<i64: 1, 64>\}> : \(tensor<256x64xf32>, tensor<2x16xi64>\) -> tensor<2x16x64xf32>"
)


def _edits(text: str) -> dict[str, str]:
    """The hand-edited variants (upper bounds: each changes what the step
    computes at lr 0 or where XLA may place an update)."""
    no_lr0, n_lr0 = re.subn(r"= stablehlo\.compare EQ, (%arg\d+), (%\d+), FLOAT : \(tensor<f32>, tensor<f32>\) -> "
                            r"tensor<i1>", "= stablehlo.constant dense<false> : tensor<i1>", text)
    no_guard, n_guard = re.subn(r"= stablehlo\.compare EQ, (%\d+), \1 : \(tensor<f32>, tensor<f32>\) -> tensor<i1>",
                                "= stablehlo.constant dense<true> : tensor<i1>", text)
    gather = _GATHER.sub(
        r"    %g_idx = stablehlo.reshape \3 : (tensor<2x16xi64>) -> tensor<32x1xi64>\n"
        r'    %g_0 = "stablehlo.gather"(\2, %g_idx) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], '
        r"collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, "
        r"slice_sizes = array<i64: 1, 64>}> : (tensor<256x64xf32>, tensor<32x1xi64>) -> tensor<32x64xf32>\n"
        r"    \1 = stablehlo.reshape %g_0 : (tensor<32x64xf32>) -> tensor<2x16x64xf32>", text)
    folded = _fold_layer0_o_proj(text)
    print(f"edits: lr-0 predicates {n_lr0}, order guards {n_guard}, gather {gather != text}, "
          f"o_proj fold {folded != text}")
    return {"no lr-0 where": no_lr0, "no order guards": no_guard, "gather as [32,64]": gather,
            "layer 0 o_proj transpose in the dots": folded}


def _fold_layer0_o_proj(text: str) -> str:
    """Layer 0's ``attn_output.transpose(1, 2).reshape(...)`` folded into
    both dots that read it (o_proj's forward and its weight gradient) as
    dot_general dimension numbers, by hand: what a fold of a transpose
    behind a reshape would emit.  SSA names of this model's module; the
    text is returned unchanged when they are not there."""
    fwd = ("    %131 = stablehlo.dot_general %130, %arg4, contracting_dims = [1] x [1] : "
           "(tensor<32x64xf32>, tensor<64x64xf32>) -> tensor<32x64xf32>\n")
    grad = ("    %574 = stablehlo.dot_general %573, %130, contracting_dims = [0] x [0] : "
            "(tensor<32x64xf32>, tensor<32x64xf32>) -> tensor<64x64xf32>\n")
    source = "%127 = stablehlo.reshape %126 : (tensor<8x16x16xf32>) -> tensor<2x4x16x16xf32>"
    if fwd not in text or grad not in text or source not in text:
        return text
    return text.replace(fwd, (
        "    %wo_r = stablehlo.reshape %arg4 : (tensor<64x64xf32>) -> tensor<64x4x16xf32>\n"
        "    %o131 = stablehlo.dot_general %127, %wo_r, contracting_dims = [1, 3] x [1, 2] : "
        "(tensor<2x4x16x16xf32>, tensor<64x4x16xf32>) -> tensor<2x16x64xf32>\n"
        "    %131 = stablehlo.reshape %o131 : (tensor<2x16x64xf32>) -> tensor<32x64xf32>\n"
    )).replace(grad, (
        "    %g573 = stablehlo.reshape %573 : (tensor<32x64xf32>) -> tensor<2x16x64xf32>\n"
        "    %o574 = stablehlo.dot_general %g573, %127, contracting_dims = [0, 1] x [0, 2] : "
        "(tensor<2x16x64xf32>, tensor<2x4x16x16xf32>) -> tensor<64x4x16xf32>\n"
        "    %574 = stablehlo.reshape %o574 : (tensor<64x4x16xf32>) -> tensor<64x64xf32>\n"
    ))


def variants(reps: int) -> None:
    import jax
    from jax._src.lib import xla_client

    from hloalias.runtime import pjrt

    text = _hf_step_final_module()
    device = jax.devices("cpu")[0]
    modules = {"as is": text, **_edits(text)}
    options: dict[str, list[tuple[str, Any]]] = {
        "xla_cpu_opt_preset=FAST_COMPILE": [("xla_cpu_opt_preset", "CPU_OPT_PRESET_FAST_COMPILE")],
        "xla_cpu_scheduler_type=MEMORY_OPTIMIZED": [("xla_cpu_scheduler_type", "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED")],
        "ynn fusion DOT,ELTWISE": [("xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE")],
        "ynn fusion DOT,ELTWISE,REDUCE": [("xla_cpu_experimental_ynn_fusion_type",
                                           "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE,LIBRARY_FUSION_TYPE_REDUCE")],
    }
    prepared = {label: pjrt.prepare_for_xla(t, allow_stored_state=True) for label, t in modules.items()}
    runs = [(label, prepared[label], []) for label in modules]
    runs += [(label, prepared["as is"], overrides) for label, overrides in options.items()]

    def compile_(stripped: str, overrides: list[tuple[str, Any]], dump: str | None = None) -> Any:
        compile_options = xla_client.CompileOptions()
        compile_options.env_option_overrides = [*overrides, *([("xla_dump_to", dump)] if dump else [])]
        return device.client.compile_and_load(
            pjrt._xla_input(stripped), xla_client.DeviceList((device,)), compile_options)

    for label, stripped, overrides in runs:
        dump = tempfile.mkdtemp(prefix="stepker-xla-")
        executable = compile_(stripped, overrides, dump)
        kernels = len(glob.glob(os.path.join(dump, "*.ir-with-opt.ll")))
        temp = executable.get_compiled_memory_stats().temp_size_in_bytes
        print(f"{label}: {kernels} kernels, temp {temp:,} bytes")
    _cpu_medians([(label, (lambda s, o: lambda: compile_(s, o))(stripped, overrides))
                  for label, stripped, overrides in runs], reps)


def main() -> None:
    part, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    print(f"load {os.getloadavg()[0]:.1f}, {time.strftime('%H:%M:%S', time.gmtime())} UTC")
    {"grouped": grouped, "variants": variants}[part](reps)
    print(f"load {os.getloadavg()[0]:.1f}, {time.strftime('%H:%M:%S', time.gmtime())} UTC")


if __name__ == "__main__":
    main()
