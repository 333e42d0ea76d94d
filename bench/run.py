"""Run the whole benchmark and write bench/RESULTS.md and bench/ratios.png.

From the repository root::

    .venv/bin/python -m bench.run

Options: ``--gpt2-layers N`` shrinks the decode workload (the report says
so), ``--out DIR`` writes elsewhere."""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import sys
import time
import warnings

if __package__ in (None, ""):  # `python bench/run.py`: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

import hloalias
import hloalias.passes
from hloalias.mlir import find_main, new_context, parse_module, tensor_bytes
from hloalias.pipeline import DEFAULT_PIPELINE, run_pipeline

from bench import report, scaling, systems, workloads
from bench.report import PassProfile, WorkloadResult


def log(message: str) -> None:
    """Progress on stderr with the time since start."""
    print(f"[{time.perf_counter() - _START:6.1f}s] {message}", file=sys.stderr, flush=True)


_START = time.perf_counter()


def _result_bytes(mlir_text: str) -> tuple[int, int]:
    """Total bytes and count of ``@main``'s results in a final module."""
    import torch_mlir.ir as ir

    module = parse_module(mlir_text, new_context())
    with module.context:
        main = find_main(module)
        results = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).results
        return sum(tensor_bytes(t) for t in results), len(results)


def run_workload(workload: workloads.Workload) -> WorkloadResult:
    """Measure one workload in every system; free what it held afterwards."""
    log(f"{workload.key}: minimum")
    minimum = workloads.derive_minimum(workload)
    exported = workload.exported()
    log(f"{workload.key}: hloalias")
    m_hloalias, exe = systems.measure_hloalias(workload, exported, baseline=False)
    result_bytes, result_count = _result_bytes(exe.mlir)
    view_report = exe.view_report
    view_summary = (f"{len(view_report.removed)} results removed by eliminate-view-results "
                    f"({len(view_report.kept)} kept)") if view_report else "eliminate-view-results not run"
    alias_report = exe.alias_report
    alias_summary = (f"{len(alias_report.aliases)} aliases ({alias_report.bytes_saved:,} bytes), "
                     f"{len(alias_report.unused)} unused donations") if alias_report else "no alias report"
    names = [argument.name for argument in exe._signature.arguments]
    copied_arguments = [names[i] for i in m_hloalias.copied_parameters if i < len(names)]
    aliased_arguments = [alias.arg_name for alias in alias_report.aliases] if alias_report else []
    log(f"{workload.key}: canonicalize baseline")
    m_baseline, baseline_exe = systems.measure_hloalias(workload, exported, baseline=True)
    del baseline_exe
    log(f"{workload.key}: jax")
    m_jax, compiled = systems.measure_jax(workload)
    jax_diagnostic = systems.measure_jax_diagnostic(workload)
    log(f"{workload.key}: pass timing")
    timing = systems.time_passes(workload, exported, exe)
    log(f"{workload.key}: output checks")
    checks = systems.check_outputs(workload, exe, compiled)
    del exe, compiled
    hloalias.clear_cache()
    gc.collect()
    log(f"{workload.key}: torch-mlir export_and_import")
    m_torch_mlir = systems.measure_torch_mlir(workload, exported)
    del exported
    gc.collect()
    measurements = {
        systems.SYSTEM_TORCH_MLIR: m_torch_mlir,
        systems.SYSTEM_CANONICALIZE: m_baseline,
        systems.SYSTEM_JAX: m_jax,
        systems.SYSTEM_HLOALIAS: m_hloalias,
    }
    return WorkloadResult(
        workload.key, workload.label, workload.title, workload.notes, minimum, measurements, timing, checks,
        result_bytes, result_count, alias_summary, view_summary, jax_diagnostic, copied_arguments,
        aliased_arguments, names,
    )


def profile_passes(text: str, pipeline: str, source: str, min_seconds: float = 0.5,
                   min_runs: int = 5) -> PassProfile:
    """cProfile of ``run_pipeline(module, pipeline)`` on fresh parses of
    ``text`` (parsing is outside the profile), repeated until
    ``min_seconds`` of pipeline time and ``min_runs`` runs; the functions of
    hloalias's own packages ranked by cumulative time."""
    profiler = cProfile.Profile()
    runs, profiled = 0, 0.0
    while runs < min_runs or profiled < min_seconds:
        module = parse_module(text, new_context())
        start = time.perf_counter()
        profiler.enable()
        run_pipeline(module, pipeline)
        profiler.disable()
        profiled += time.perf_counter() - start
        runs += 1
    packages = [os.path.dirname(p.__file__ or "") + os.sep for p in (hloalias, hloalias.passes, hloalias.pipeline)]
    root = os.path.commonpath(packages)
    cumulative_by_function: dict[str, float] = {}
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (filename, _, function), (_, _, _, cumulative, _) in stats.items():
        if any(filename.startswith(package) for package in packages):
            where = f"{os.path.relpath(filename, root)}:{function}"
            cumulative_by_function[where] = cumulative_by_function.get(where, 0.0) + cumulative
    # Shares are of run_pipeline's own cumulative time, as the profiler saw it.
    total = cumulative_by_function.pop(f"{os.path.relpath(run_pipeline.__code__.co_filename, root)}:run_pipeline",
                                       profiled)
    ranked = sorted(cumulative_by_function.items(), key=lambda entry: entry[1], reverse=True)
    return PassProfile(source, runs, profiled / runs, [(where, seconds / total) for where, seconds in ranked[:5]])


def main(argv: list[str] | None = None) -> int:
    """Run everything; write the report; print the headline table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpt2-layers", type=int, default=12, help="decode workload layers (default 12)")
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)), help="output directory")
    options = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    # The pass-time target compares the passes with XLA's compile: the
    # on-disk executable cache would replace that compile with a file read.
    os.environ["HLOALIAS_CACHE"] = "0"
    torch.manual_seed(0)
    command = ".venv/bin/python -m bench.run" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()

    log("warm-up")
    hloalias.compile(lambda x: x + 1, (torch.randn(4),))
    hloalias.clear_cache()
    notes: list[str] = []
    parameter_error = workloads.probe_parameter_mutation()
    if parameter_error:
        notes.append(
            "Workload 2 keeps weights and biases in registered buffers, not `nn.Parameter`s: hloalias rejects "
            f"parameters mutated in place under `torch.no_grad()` (`{parameter_error}`; probed on a 2-layer "
            "`nn.Linear` variant this run). Bytes and math are the same either way."
        )
    else:
        notes.append("Workload 2's weights and biases are `nn.Parameter`s updated in place under "
                     "`torch.no_grad()` (hloalias imported the probe with parameter mutation this run).")
    gpt2 = workloads.GPT2Config(layers=options.gpt2_layers)
    if gpt2.layers != workloads.GPT2Config().layers:
        notes.append(f"Workload 3 was reduced to {gpt2.layers} layers (GPT-2 small has 12) for this run.")
    else:
        notes.append("Workload 3 runs at full GPT-2-small size (12 layers, vocab 50257, ~124M parameters); "
                     "no layers were removed.")
    notes.append("Workload 5: the figures are XLA's compile-time plan. At run time hloalias can reuse a donated "
                 "buffer only if PJRT owns it (a `DeviceTensor` from `exe.to_device`); a donated torch tensor is "
                 "left untouched on CPU. The output check passes x as a DeviceTensor.")
    notes.append("The JAX functions are written by hand to match the torch programs (same argument tensors, "
                 "torch's (out, in) weight layout); their outputs are checked against eager PyTorch in each "
                 "workload section.")

    results: list[WorkloadResult] = []
    for build in workloads.all_workloads(gpt2, sgd_parameters=parameter_error is None):
        workload = build()
        results.append(run_workload(workload))
        del workload
        gc.collect()

    log("synthetic scaling")
    points, exponent = scaling.run_scaling()
    log("call overhead")
    overhead = scaling.measure_overhead()
    profile = None
    if not report.pass_target_met(results):
        worst = max(results, key=lambda r: r.timing.ratio)
        log(f"pass-time profile ({worst.key})")
        if worst.timing.imported_text:
            profile = profile_passes(worst.timing.imported_text, worst.timing.pipeline,
                                     f"workload {worst.key} ({worst.timing.ops:,} ops)")
        else:  # nothing kept from the workload: a synthetic module stands in
            synthetic = scaling.synthetic_module(1_000)
            profile = profile_passes(synthetic.text, DEFAULT_PIPELINE, f"a {synthetic.ops:,}-op synthetic module")
    gpt2_result = next((r for r in results if r.key == "gpt2_decode"), None)
    if gpt2_result is not None and gpt2_result.measurements[systems.SYSTEM_TORCH_MLIR].error is None:
        frozen = gpt2_result.measurements[systems.SYSTEM_TORCH_MLIR]
        notes.append(
            f"Workload 3's torch-mlir column took {frozen.seconds:.0f} s of this run (hloalias: "
            f"{gpt2_result.measurements[systems.SYSTEM_HLOALIAS].seconds:.0f} s): export_and_import freezes the "
            f"{gpt2_result.minimum.state_bytes / 2**20:,.0f} MiB of module state into the module text as hex "
            "literals, which compile_module parses, re-prints and serializes.")
    seconds = time.perf_counter() - _START
    os.makedirs(options.out, exist_ok=True)
    headline = report.write_report(options.out, results, points, exponent, overhead, profile, notes,
                                   command, seconds)
    log(f"wrote {os.path.join(options.out, 'RESULTS.md')} and ratios.png")
    print(headline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
