"""RESULTS.md and ratios.png from one benchmark run."""

from __future__ import annotations

import dataclasses
import datetime
import json
import importlib.metadata
import os
import platform
import subprocess
from typing import Any

from hloalias.pipeline import DEFAULT_PIPELINE

from bench.scaling import Overhead, ScalingPoint
from bench.systems import (
    SYSTEM_CANONICALIZE, SYSTEM_HLOALIAS, SYSTEM_JAX, SYSTEM_LABELS, SYSTEMS, Check, Measurement, PassTiming,
)
from bench.workloads import Minimum

PASS_TARGET = 0.05
OVERHEAD_TARGET = 1.5


@dataclasses.dataclass
class WorkloadResult:
    """Everything measured for one workload."""

    key: str
    label: str
    title: str
    notes: list[str]
    minimum: Minimum
    measurements: dict[str, Measurement]
    timing: PassTiming
    checks: list[Check]
    hloalias_result_bytes: int
    hloalias_results: int
    alias_summary: str
    view_summary: str
    jax_diagnostic: Measurement | None = None
    hloalias_copied_arguments: list[str] = dataclasses.field(default_factory=list)
    hloalias_aliased_arguments: list[str] = dataclasses.field(default_factory=list)
    argument_names: list[str] = dataclasses.field(default_factory=list)  # hloalias's @main arguments, in order

    def ratio(self, system: str) -> float | None:
        """Device bytes of ``system`` over the minimum (None if it failed)."""
        measurement = self.measurements[system]
        if measurement.error is not None:
            return None
        return measurement.device_total / self.minimum.total_bytes

    def data_ratio(self, system: str) -> float | None:
        """argument + output − alias (+ constants) over the data minimum."""
        measurement = self.measurements[system]
        if measurement.error is not None:
            return None
        return (measurement.data_total + measurement.constant_bytes) / self.minimum.data_bytes


@dataclasses.dataclass
class PassProfile:
    """cProfile of the pipeline on one module: hloalias's own functions
    with the largest cumulative time."""

    source: str  # what was profiled, in words
    runs: int
    seconds_per_run: float  # under the profiler
    top_functions: list[tuple[str, float]]  # ("file:function", share of pipeline time)


def pass_target_met(results: list[WorkloadResult]) -> bool:
    """Passes ≤5% of compile_module time over all workloads and on each."""
    total_pass = sum(r.timing.pass_seconds for r in results)
    total_xla = sum(r.timing.xla_seconds for r in results)
    return total_pass <= PASS_TARGET * total_xla and all(r.timing.ratio <= PASS_TARGET for r in results)


# -- machine ------------------------------------------------------------------


def machine_info() -> dict[str, str]:
    """CPU model, cores, memory, OS and package versions."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = "unknown"
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal"):
                    memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                    break
    except OSError:
        pass

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "CPU": model,
        "Cores (os.cpu_count)": str(os.cpu_count()),
        "Memory": memory,
        "OS": platform.platform(),
        "Python": platform.python_version(),
        "torch": version("torch"),
        "torch-mlir": version("torch-mlir"),
        "jax / jaxlib": f"{version('jax')} / {version('jaxlib')}",
        "numpy": version("numpy"),
        "hloalias commit": commit,
        "Load average (1/5/15 min) when the report was written": " / ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


# -- formatting ---------------------------------------------------------------


def _b(value: int) -> str:
    return f"{value:,}"


def _mib(value: int) -> str:
    return f"{value / 2**20:,.2f} MiB"


def _ratio(value: float | None, digits: int = 2) -> str:
    return "failed" if value is None else f"{value:.{digits}f}×"


def _cell(result: WorkloadResult, system: str) -> str:
    measurement = result.measurements[system]
    if measurement.error is not None:
        return "failed"
    return f"{_b(measurement.device_total)} ({_ratio(result.ratio(system))})"


# -- markdown -----------------------------------------------------------------


def headline_table(results: list[WorkloadResult]) -> str:
    """Device bytes and ratio to the minimum, one row per workload."""
    header = "| Workload | Minimum (bytes) | " + " | ".join(SYSTEM_LABELS[s] for s in SYSTEMS) + " |"
    rule = "|---|---:|" + "---:|" * len(SYSTEMS)
    rows = [header, rule]
    for result in results:
        cells = " | ".join(_cell(result, s) for s in SYSTEMS)
        rows.append(f"| {result.label} | {_b(result.minimum.total_bytes)} | {cells} |")
    return "\n".join(rows)


def data_table(results: list[WorkloadResult]) -> str:
    """The same without temporaries: (argument + output − alias + constants)
    over (arguments + new results)."""
    header = "| Workload | Data minimum (bytes) | " + " | ".join(SYSTEM_LABELS[s] for s in SYSTEMS) + " |"
    rule = "|---|---:|" + "---:|" * len(SYSTEMS)
    rows = [header, rule]
    for result in results:
        cells = []
        for system in SYSTEMS:
            m = result.measurements[system]
            if m.error is not None:
                cells.append("failed")
            else:
                cells.append(f"{_b(m.data_total + m.constant_bytes)} ({_ratio(result.data_ratio(system), 3)})")
        rows.append(f"| {result.label} | {_b(result.minimum.data_bytes)} | {' | '.join(cells)} |")
    return "\n".join(rows)


def detail_table(result: WorkloadResult) -> str:
    """Every figure of every system for one workload."""
    rows = [
        "| System | argument | output | alias | temp | copy instrs | constants | PJRT total | "
        "device total | ratio | compile s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system in SYSTEMS:
        m = result.measurements[system]
        if m.error is not None:
            rows.append(f"| {SYSTEM_LABELS[system]} | failed: {m.error} |||||||||")
            continue
        rows.append(
            f"| {SYSTEM_LABELS[system]} | {_b(m.argument_bytes)} | {_b(m.output_bytes)} | {_b(m.alias_bytes)} "
            f"| {_b(m.temp_bytes)} | {_b(m.copy_bytes)} | {_b(m.constant_bytes)} | {_b(m.pjrt_total)} "
            f"| {_b(m.device_total)} | {_ratio(result.ratio(system), 4)} | {m.seconds:.1f} |"
        )
    listed = [s for s in SYSTEMS if result.measurements[s].error is None and result.measurements[s].copy_shapes]
    rows.append("")
    rows.append("*copy instrs*: bytes written by the optimized entry computation's instructions that only move "
                "data (`copy`, `transpose`, and fusions of nothing but copy / transpose / bitcast / reshape), into "
                "temp or output buffers; *transposed* marks those that transpose or change the layout"
                + (". Their shapes:" if listed else "; there are none."))
    if listed:
        rows.append("")
    for system in listed:
        m = result.measurements[system]
        shapes = ", ".join(f"{count}× {shape}" for shape, count in sorted(m.copy_shapes.items()))
        rows.append(f"- {SYSTEM_LABELS[system]}: {shapes}")
    return "\n".join(rows)


def _hloalias_excess(result: WorkloadResult) -> list[str]:
    """Where hloalias's bytes above the minimum come from, measured."""
    m = result.measurements[SYSTEM_HLOALIAS]
    minimum = result.minimum
    lines = []
    excess = m.device_total - minimum.total_bytes
    if excess <= 0:
        return [f"hloalias is at the minimum ({_b(m.device_total)} bytes)."]
    lines.append(f"hloalias is {_b(excess)} bytes ({excess / minimum.total_bytes:.2%}) above the minimum:")
    tuple_bytes = m.output_bytes - result.hloalias_result_bytes
    data_excess = m.data_total - minimum.data_bytes
    if data_excess:
        detail = ""
        if tuple_bytes > 0:
            detail = (f"; {_b(tuple_bytes)} of them are XLA's tuple index table for the "
                      f"{result.hloalias_results} results (8 bytes a result pointer), not tensor data")
        lines.append(f"- argument + output − alias exceeds arguments + new results by {_b(data_excess)} bytes{detail}.")
    temp_excess = m.temp_bytes - minimum.temp_bytes
    if temp_excess:
        copies = (f"; data-moving instructions of the optimized entry computation (*copy instrs*) write "
                  f"{_b(m.copy_bytes)} bytes") if m.copy_bytes else ""
        if m.output_copy_bytes:
            copies += (f", {_b(m.output_copy_bytes)} of them as results of the entry computation: XLA computes "
                       "those values in temp and then copies them into their output buffers")
        lines.append(f"- XLA's temp is {_b(m.temp_bytes)} bytes against the {_b(minimum.temp_bytes)}-byte bound "
                     f"(+{_b(temp_excess)}){copies}.")
    if m.constant_bytes:
        lines.append(f"- the executable holds {_b(m.constant_bytes)} bytes of constants.")
    return lines


def _write_png(results: list[WorkloadResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(11, 5.5))
    width = 0.8 / len(SYSTEMS)
    colours = ["#9e9e9e", "#64b5f6", "#ffb74d", "#2e7d32"]
    for index, system in enumerate(SYSTEMS):
        xs, heights = [], []
        for position, result in enumerate(results):
            ratio = result.ratio(system)
            xs.append(position + (index - (len(SYSTEMS) - 1) / 2) * width)
            heights.append(ratio if ratio is not None else 0.0)
        label = SYSTEM_LABELS[system] + (" (incl. frozen state as constants)" if system == SYSTEMS[0] else "")
        bars = axis.bar(xs, heights, width, label=label, color=colours[index])
        for bar, height in zip(bars, heights):
            axis.annotate("failed" if height == 0 else f"{height:.2f}",
                          (bar.get_x() + bar.get_width() / 2, height), ha="center", va="bottom", fontsize=7)
    axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axis.set_xticks(range(len(results)))
    axis.set_xticklabels([r.key for r in results])
    axis.set_ylabel("device bytes / physical minimum")
    axis.set_title("Compiled device bytes relative to the physical minimum (CPU PJRT; lower is better, 1.0 = minimum)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(
    directory: str,
    results: list[WorkloadResult],
    scaling: list[ScalingPoint],
    exponent: float,
    overhead: Overhead,
    profile: PassProfile | None,
    notes: list[str],
    command: str,
    seconds: float,
) -> str:
    """Write ``RESULTS.md`` and ``ratios.png`` into ``directory``; return
    the headline table (markdown)."""
    _write_png(results, os.path.join(directory, "ratios.png"))
    machine = machine_info()
    headline = headline_table(results)
    out: list[str] = []
    add = out.append
    add("# hloalias benchmark results\n")
    add(f"Generated by `{command}` on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"the whole run took {seconds:.0f} s. Everything ran on the CPU PJRT client (jaxlib). "
        "Only what this run measured is reported. Times are wall-clock on this machine and move with its "
        f"load (other processes may share the {os.cpu_count()} cores; see the load average below); byte figures "
        "do not.\n")
    add("## Machine\n")
    add("| | |\n|---|---|")
    for key, value in machine.items():
        add(f"| {key} | {value} |")
    add("")

    add("## Device bytes against the physical minimum\n")
    add("Device bytes = XLA's compiled memory statistics, argument + output − alias + temp, plus the constants "
        "the executable holds (summed from its optimized HLO; only torch-mlir's frozen module state makes "
        "them large). Ratio = device bytes / physical minimum (arguments + genuinely new results + unavoidable "
        "temporaries, derived per workload below).\n")
    add(headline)
    add("\n![ratios](ratios.png)\n")
    add("The same without temporaries — (argument + output − alias + constants) / (arguments + new results) — "
        "isolates what views and aliasing control from XLA's scratch memory:\n")
    add(data_table(results))
    add("")
    add("Columns:\n")
    add("- **torch-mlir export_and_import → PJRT**: `torch_mlir.fx.export_and_import(module, *args, "
        "output_type=\"stablehlo\")`, printed, compiled with `hloalias.runtime.pjrt.compile_module`. It "
        "*freezes* parameters and buffers into constants: they are not arguments, XLA does not count them in "
        "the four memory figures (they are in the *constants* column), and mutated state comes back as fresh "
        "outputs while the constants keep the old values. Two fixes were needed for it to compile at all "
        "(listed per workload): tensor `arith.constant` rewritten to `stablehlo.constant`, and "
        "`dense_resource` blobs inlined as `dense` literals (a StableHLO portable artifact cannot carry resources).")
    add("- **hloalias import, canonicalize only**: `hloalias.compile(..., pipeline=\"builtin.module(canonicalize)\")`, "
        "no donation: the same import as hloalias (state stays arguments), no hloalias pass — in particular "
        "no `fold-transpose-into-dot-general`, so torch-mlir's `transpose` feeding each `dot_general` "
        "reaches XLA as is.")
    add("- **JAX jit + donate_argnums**: a hand-written JAX equivalent (same math, same argument tensors), "
        "`jax.jit(f, donate_argnums=...).lower(...).compile().memory_analysis()`; state and donated inputs are donated.")
    add(f"- **hloalias**: `hloalias.compile(module, args, donate=...)` with the default pipeline "
        f"`{DEFAULT_PIPELINE}` (the workload's donations added to `alias-donated-buffers`), `exe.memory_stats`. "
        "Its first pass, `fold-transpose-into-dot-general`, absorbs a `transpose` feeding a `dot_general` "
        "into the dot's dimension numbers.")
    add("")

    add("## Targets\n")
    add(_targets(results, scaling, exponent, overhead, profile))

    add("## Workloads: derivation of the minimum and all figures\n")
    add("The minimum is derived by running each program in eager PyTorch on a copy and inspecting storages: "
        "arguments are every distinct tensor the program reads; an output is genuinely new unless its storage "
        "is an input's; outputs sharing one storage count once (only the elements some output exposes); new "
        "values of state mutated in place add nothing. Unavoidable temporaries are a lower bound argued per "
        "workload: a temporary counts only if at some point it must be live while every argument and result "
        "buffer holds data still needed. XLA's output figure also contains a tuple index table (8 bytes per "
        "result when there are several), which is bookkeeping, not data, and is not in the minimum.\n")
    for result in results:
        add(f"### {result.title}\n")
        for line in result.minimum.derivation:
            add(f"- {line}")
        add(f"- **physical minimum: {_b(result.minimum.total_bytes)} bytes** ({_mib(result.minimum.total_bytes)})\n")
        add(detail_table(result))
        add("")
        add(f"hloalias decisions: {result.view_summary}; {result.alias_summary}.\n")
        for line in _hloalias_excess(result):
            add(line)
        add("")
        for line in _copy_findings(result):
            add(line)
        checks = ", ".join(
            f"{SYSTEM_LABELS[c.system]}: {'matches' if c.ok else 'DIFFERS'} (max |error| {c.max_abs_error:.2e} "
            f"over {c.compared} tensors)" for c in result.checks
        )
        add(f"Outputs and updated state against eager PyTorch: {checks}.\n")
        tm = result.measurements[SYSTEMS[0]]
        for note in [*tm.notes, *result.notes]:
            add(f"- Note: {note}")
        add("")

    add("## Pass time against XLA compile time\n")
    add(f"Default pipeline `{DEFAULT_PIPELINE}` (with the workload's donations) run with `hloalias.pipeline.run_pipeline` on a fresh "
        "import (median of 3 clones), against `compile_module` of the resulting module (strip host metadata, "
        "serialize, XLA compile) timed once.\n")
    add("| Workload | ops in @main | passes (s) | compile_module (s) | passes / compile | same module as hloalias.compile |")
    add("|---|---:|---:|---:|---:|---|")
    total_pass = total_xla = 0.0
    for result in results:
        t = result.timing
        total_pass += t.pass_seconds
        total_xla += t.xla_seconds
        add(f"| {t.workload} | {_b(t.ops)} | {t.pass_seconds:.3f} | {t.xla_seconds:.3f} | {t.ratio:.1%} | "
            f"{'yes' if t.same_module_as_compile else 'no'} |")
    add(f"| all | | {total_pass:.3f} | {total_xla:.3f} | {total_pass / total_xla:.1%} | |")
    add("")

    add("## Pass time on synthetic modules\n")
    add("Generated `@main`s: chains of `add → slice → reshape → transpose → concatenate` on 16x16 f32; every "
        "100 ops the block's `add` and its `slice+reshape` view are returned (the view is a view of another "
        "result), and every 1000 ops a slice of an argument is returned, so the result count grows with size. "
        "Parsed with `hloalias.mlir.parse_module`; `run_pipeline(module, DEFAULT_PIPELINE)` timed on fresh parses "
        "(they have no `dot_general`, so `fold-transpose-into-dot-general` finds nothing to fold).\n")
    add("| target ops | ops | results | view results | removed by the pass | parse (s) | passes (s) | µs / op | repeats |")
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in scaling:
        add(f"| {_b(p.target_ops)} | {_b(p.ops)} | {_b(p.results)} | {_b(p.view_results)} | {_b(p.removed)} | "
            f"{p.parse_seconds:.3f} | {p.pass_seconds:.3f} | {p.pass_seconds / p.ops * 1e6:.1f} | {p.repeats} |")
    add(f"\nLog-log least-squares exponent of pass time vs op count: **{exponent:.2f}** (1.00 = linear).\n")

    add("## Per-call host overhead\n")
    add(f"`f(x) = x * 2 + 1` on 256 f32, input already on the device (`exe.to_device`). Median of "
        f"{overhead.calls} calls per variant, interleaved in 5 rounds. `Executable.__call__` returns "
        "torch tensors of results that have been computed, so compare it with *raw + unpack + wait*; "
        "`bench/RESULTS-runtime.md` breaks the difference down.\n")
    add("| Call | median (µs) | vs raw |")
    add("|---|---:|---:|")
    for call_label, per_call in (
        ("raw `exe._loaded.execute_sharded(arrays)` (dispatch only: returns before the program has run)", overhead.raw_execute),
        ("raw + `disassemble_into_single_device_arrays()` + wait for every result", overhead.raw_execute_and_unpack),
        ("`Executable.__call__(device_tensor)`", overhead.executable_call),
        ("`Executable.__call__(torch_tensor)` (zero-copy DLPack input)", overhead.executable_call_torch_input),
    ):
        add(f"| {call_label} | {per_call * 1e6:.1f} | {per_call / overhead.raw_execute:.2f}× |")
    add("")

    out.extend(latency_section(directory))
    out.extend(other_results(directory))

    if notes:
        add("## Compromises and findings\n")
        for note in notes:
            add(f"- {note}")
        add("")
    with open(os.path.join(directory, "RESULTS.md"), "w") as handle:
        handle.write("\n".join(out))
    return headline


def _targets(results: list[WorkloadResult], scaling: list[ScalingPoint], exponent: float,
             overhead: Overhead, profile: PassProfile | None) -> str:
    lines: list[str] = []
    add = lines.append
    at_minimum = [r for r in results if r.measurements[SYSTEM_HLOALIAS].device_total <= r.minimum.total_bytes]
    met = len(at_minimum) == len(results)
    add(f"**1. hloalias at 1.00× the minimum on every workload: {'met' if met else 'missed'}.** "
        f"Exactly at the minimum: {', '.join(r.key for r in at_minimum) or 'none'}.\n")
    for result in results:
        m = result.measurements[SYSTEM_HLOALIAS]
        excess = m.device_total - result.minimum.total_bytes
        if excess <= 0:
            continue
        why = _why(result)
        add(f"- {result.key}: {_ratio(result.ratio(SYSTEM_HLOALIAS), 4)} ({_b(excess)} bytes over). {why}")
    for other in (SYSTEM_JAX, SYSTEMS[0]):
        for result in results:
            theirs = result.measurements[other]
            ours = result.measurements[SYSTEM_HLOALIAS]
            if theirs.error is not None or theirs.device_total >= ours.device_total:
                continue
            fewer = ours.device_total - theirs.device_total
            line = (f"- {SYSTEM_LABELS[other]} needs fewer device bytes than hloalias on {result.key}: "
                    f"{_b(fewer)} fewer ({fewer / ours.device_total:.3%}).")
            if other == SYSTEM_JAX:
                data = ours.data_total - theirs.data_total
                temp = ours.temp_bytes - theirs.temp_bytes
                line += (f" Of the difference, {_b(data)} bytes are argument + output − alias and {_b(temp)} bytes "
                         "are XLA's temp.")
            if other == SYSTEMS[0] and theirs.constant_bytes:
                line += (f" Its executable holds {_b(theirs.constant_bytes)} bytes of constants against "
                         f"{_b(result.minimum.state_bytes)} bytes of module state it froze. It is not a usable "
                         "step, though: mutated state comes back as new outputs (nothing aliased) while the "
                         "frozen constants keep the old values.")
            add(line)
    add("")
    total_pass = sum(r.timing.pass_seconds for r in results)
    total_xla = sum(r.timing.xla_seconds for r in results)
    share = total_pass / total_xla
    worst = max(results, key=lambda r: r.timing.ratio)
    linear = 0.85 <= exponent <= 1.15
    pass_met = pass_target_met(results)
    add(f"**2. Passes ≤5% of XLA compile time: {'met' if pass_met else 'missed'}.** Over all workloads the passes "
        f"take {total_pass:.3f} s against {total_xla:.2f} s of compile_module ({share:.1%}); worst {worst.key} at "
        f"{worst.timing.ratio:.1%} ({worst.timing.pass_seconds * 1e3:.1f} ms against "
        f"{worst.timing.xla_seconds * 1e3:.1f} ms).")
    if not pass_met and profile is not None:
        top = "; ".join(f"`{where}` {share:.0%}" for where, share in profile.top_functions)
        add(f" Where the time goes: cProfile of the pipeline on {profile.source}, {profile.runs} runs at "
            f"{profile.seconds_per_run * 1e3:.2f} ms each under the profiler; hloalias's functions with the largest "
            f"cumulative share of that time (`run_pipeline` = 100%; the profiler inflates Python-heavy parts): {top}.")
    add("")
    add(f"**3. Pass time linear in module size: {'met' if linear else 'missed'}.** Exponent {exponent:.2f} over "
        f"{scaling[0].ops:,}–{scaling[-1].ops:,} ops "
        f"({', '.join(f'{p.pass_seconds / p.ops * 1e6:.0f} µs/op at {p.ops:,}' for p in scaling)}).\n")
    overhead_met = overhead.ratio <= OVERHEAD_TARGET
    add(f"**4. Call overhead ≤1.5× raw: {'met' if overhead_met else 'missed'}.** `Executable.__call__` takes "
        f"{overhead.executable_call * 1e6:.1f} µs against {overhead.raw_execute * 1e6:.1f} µs for the raw "
        f"`execute_sharded` ({overhead.ratio:.2f}×, target 1.5×).")
    if not overhead_met:
        add(f" Why: the raw call returns an unopened result handle; turning it into per-output arrays "
            f"(`disassemble_into_single_device_arrays`) alone brings it to "
            f"{overhead.raw_execute_and_unpack * 1e6:.1f} µs ({overhead.raw_execute_and_unpack / overhead.raw_execute:.2f}×), "
            "and the rest is the Python work every call does: input checks, the call plan loop, donation "
            "bookkeeping, DLPack conversion of each output to a torch tensor and output assembly. On a graph "
            "this small the device work is ~nothing, so the ratio is the worst case; the absolute overhead is "
            f"{(overhead.executable_call - overhead.raw_execute) * 1e6:.0f} µs per call.")
    add("")
    return "\n".join(lines)


def _why(result: WorkloadResult) -> str:
    """The measured reasons for one workload's excess, in words."""
    m = result.measurements[SYSTEM_HLOALIAS]
    parts = []
    tuple_bytes = m.output_bytes - result.hloalias_result_bytes
    data_excess = m.data_total - result.minimum.data_bytes
    if data_excess and data_excess == tuple_bytes:
        parts.append(f"{_b(tuple_bytes)} bytes are XLA's tuple index table (not data)")
    elif data_excess:
        parts.append(f"argument + output − alias is {_b(data_excess)} bytes above arguments + new results "
                     f"(tuple table {_b(max(tuple_bytes, 0))})")
    temp_excess = m.temp_bytes - result.minimum.temp_bytes
    if temp_excess > 0:
        extra = f" (copy instructions write {_b(m.copy_bytes)} bytes" if m.copy_bytes else ""
        if m.output_copy_bytes:
            extra += f", {_b(m.output_copy_bytes)} of them copying values computed in temp into output buffers"
        extra += ")" if m.copy_bytes else ""
        parts.append(f"XLA's temp exceeds the unavoidable bound by {_b(temp_excess)} bytes{extra}")
    if m.constant_bytes:
        parts.append(f"{_b(m.constant_bytes)} bytes of constants")
    return "; ".join(parts) + "." + _diagnosis_text(result)


def _diagnosis_text(result: WorkloadResult) -> str:
    """Why XLA copies arguments that hloalias aliased, stated only when this
    run's optimized HLO shows such copies."""
    ours = result.measurements[SYSTEM_HLOALIAS]
    baseline = result.measurements[SYSTEM_CANONICALIZE]
    jax_m = result.measurements[SYSTEM_JAX]
    copied_aliased = [name for name in result.hloalias_copied_arguments if name in result.hloalias_aliased_arguments]
    if not copied_aliased:
        return ""
    text = (f" Diagnosis: the optimized HLO copies {len(copied_aliased)} arguments that hloalias aliased to "
            f"results ({', '.join(copied_aliased)}): XLA's copy insertion keeps an argument's old value in a "
            "copy when it cannot prove every read of it comes before the aliased result overwrites it.")
    if result.key == "sgd_mlp":
        text += " Here each copied weight and bias is read by the forward pass and overwritten by its in-place update."
    if baseline.error is None:
        text += (f" The canonicalize baseline, with no aliasing, has {_b(baseline.temp_bytes)} bytes of temp and "
                 f"{_b(baseline.copy_bytes)} bytes of copies, but returns every mutated value as a new output: its "
                 f"outputs take {_b(baseline.output_bytes)} bytes, hloalias's outputs not aliased to arguments "
                 f"{_b(ours.output_bytes - ours.alias_bytes)}.")
    if jax_m.error is None and jax_m.copied_parameters:
        same = " — the same bytes" if jax_m.copy_bytes == ours.copy_bytes else ""
        text += (f" JAX with the state donated copies {len(jax_m.copied_parameters)} arguments too "
                 f"({_b(jax_m.copy_bytes)} bytes{same}).")
    variant = result.jax_diagnostic
    if variant is not None and variant.copied_parameters:
        text += (f" Diagnostic run: the JAX function with {variant.notes[0]} still copies "
                 f"{len(variant.copied_parameters)} arguments ({_b(variant.copy_bytes)} bytes), so ordering the "
                 "update after the forward does not by itself make XLA drop the copies.")
    elif variant is not None:
        text += (f" Diagnostic run: the JAX function with {variant.notes[0]} copies no argument "
                 f"({_b(variant.temp_bytes)} bytes of temp).")
    return text


def _copy_findings(result: WorkloadResult) -> list[str]:
    """What ``fold-transpose-into-dot-general`` did and the transposed copies
    in each system's optimized HLO; nothing when the pass folded nothing and
    hloalias has no transposed copy."""
    folded = result.timing.folded_transposes
    ours = result.measurements[SYSTEM_HLOALIAS]
    if not folded and not ours.transposed_copy_bytes:
        return []
    systems = [s for s in (SYSTEM_CANONICALIZE, SYSTEM_JAX, SYSTEM_HLOALIAS) if result.measurements[s].error is None]
    lines = [f"`fold-transpose-into-dot-general` took the `transpose` off {folded or 0} `dot_general` operands in "
             "this workload (timed pipeline run)."]
    if not any(result.measurements[s].transposed_copy_bytes for s in systems):
        lines[-1] += (" No system's optimized HLO has a transposed copy here, the canonicalize-only baseline "
                      "(which keeps those transposes) included.\n")
        return lines
    lines[-1] += " Transposed copies in the optimized entry computations:"
    names = result.argument_names
    for system in systems:
        m = result.measurements[system]
        count = sum(n for shape, n in m.copy_shapes.items() if shape.startswith("transposed "))
        what = f"{count} ({_b(m.transposed_copy_bytes)} bytes)" if count else "none"
        sources = ""
        if m.transposed_parameters:
            sources = f", {len(m.transposed_parameters)} of them copies of arguments"
            if system != SYSTEM_JAX and names:  # JAX's arguments are ordered differently
                shown = [names[i] for i in m.transposed_parameters[:3] if i < len(names)]
                more = len(m.transposed_parameters) - len(shown)
                sources += f" ({', '.join(shown)}{f' and {more} more' if more else ''})"
        lines.append(f"- {SYSTEM_LABELS[system]}: {what}{sources}; temp {_b(m.temp_bytes)} bytes.")
    variant = result.jax_diagnostic
    if variant is not None and result.measurements[SYSTEM_JAX].transposed_copy_bytes:
        count = sum(n for shape, n in variant.copy_shapes.items() if shape.startswith("transposed "))
        lines.append(f"- Diagnostic: the JAX function with {variant.notes[0]}: {count or 'no'} transposed copies"
                     f"{f' ({_b(variant.transposed_copy_bytes)} bytes)' if count else ''}; "
                     f"temp {_b(variant.temp_bytes)} bytes.")
    lines.append("")
    return lines


#: Peer columns of the latency table: (peer, variant, heading).
_LATENCY_PEERS = (
    ("torch_xla", "lazy", "torch_xla (lazy tensors)"),
    ("torchax", "documented", "torchax `compile` (documented)"),
    ("torchax", "functional", "torchax functional"),
)


def _seconds(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "not measured"
    return f"{value * 1e3:,.1f} ms" if value < 1 else f"{value:,.2f} s"


def latency_section(directory: str) -> list[str]:
    """Compile and per-call time of hloalias beside torch_xla and torchax,
    rendered from ``RESULTS-latency.json`` (written by ``python -m
    bench.latency``, which runs each peer in its own environment); a
    system or workload that run did not measure is shown as not measured."""
    lines = ["## Compile and call time beside torch_xla and torchax\n"]
    path = os.path.join(directory, "RESULTS-latency.json")
    try:
        with open(path) as handle:
            data = json.load(handle)
        ours: dict[str, Any] = data["hloalias"]
        peers: list[dict[str, Any]] = data.get("peers", [])
    except (OSError, ValueError, KeyError) as error:
        lines.append(f"Not measured: `{path}` could not be read ({error}); run `python -m bench.latency`.\n")
        return lines
    lines.append(
        "From `bench/RESULTS-latency.json`, written by `python -m bench.latency` "
        "(not by this run; the stage breakdown of every compile, the peers' versions and the conditions are in "
        "`bench/RESULTS-latency.md`). hloalias: *warm* = a new program object compiled after another in the "
        "process, every cache off; *repeat* = the same program again; *call* = steady per-call time. Peers: "
        "first call (trace + compile + run in a fresh process) / steady call.\n"
    )
    heading = "| workload | hloalias warm compile | repeat | call |" + "".join(
        f" {title} first / call |" for _, _, title in _LATENCY_PEERS
    )
    lines.append(heading)
    lines.append("|---|" + "---:|" * (3 + len(_LATENCY_PEERS)))
    for workload, row in ours.items():
        warm = row.get("warm", {}).get("total") if isinstance(row.get("warm"), dict) else None
        repeat = row.get("repeat", {}).get("total") if isinstance(row.get("repeat"), dict) else None
        cells = [workload, _seconds(warm), _seconds(repeat), _seconds(row.get("call_s"))]
        for peer, variant, _ in _LATENCY_PEERS:
            found = next((p for p in peers if p.get("peer") == peer and p.get("variant") == variant
                          and p.get("workload") == workload), None)
            measured = found.get("data") if found is not None and not found.get("error") else None
            if measured is None:
                cells.append("not measured")
            else:
                cells.append(f"{_seconds(measured.get('first_call_s'))} / {_seconds(measured.get('steady_s'))}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.extend(_stage_breakdown(ours))
    return lines


def _stage_breakdown(ours: dict[str, Any]) -> list[str]:
    """Where each workload's cold and warm compile went, stage by stage (ms)."""
    stages: list[str] = []
    for row in ours.values():
        for kind in ("first", "warm"):
            for stage in row.get(kind, {}) if isinstance(row.get(kind), dict) else {}:
                if stage not in stages and stage != "total":
                    stages.append(stage)
    if not stages:
        return []
    lines = [
        "Where our compile goes (ms, per stage; *cold* = first compile in a process, *warm* as above):\n",
        "| workload | kind | " + " | ".join(stages) + " | total |",
        "|---|---|" + "---:|" * (len(stages) + 1),
    ]
    for workload, row in ours.items():
        for kind, label in (("first", "cold"), ("warm", "warm")):
            times = row.get(kind)
            if not isinstance(times, dict):
                continue
            cells = [f"{times[stage] * 1e3:,.0f}" if isinstance(times.get(stage), (int, float)) else "" for stage in stages]
            total = times.get("total")
            total_cell = f"{total * 1e3:,.0f}" if isinstance(total, (int, float)) else ""
            lines.append(f"| {workload} | {label} | " + " | ".join(cells) + f" | {total_cell} |")
    lines.append("")
    return lines


#: The other results files, each written by its own benchmark.
_RESULTS_FILES = (
    ("RESULTS-latency.md", "python -m bench.latency", "compile latency (stage breakdown) and per-call cost beside torch_xla and torchax"),
    ("RESULTS-runtime.md", "python -m bench.runtime_bench", "runtime per-call time and host peak RSS against jax.jit (KV, StateKV, donation); state shared by executables"),
    ("RESULTS-models.md", "python -m bench.models", "Hugging Face models: device bytes against the minimum, errors against eager"),
    ("RESULTS-training.md", "python -m bench.training", "training steps: bytes, copies, errors against eager"),
    ("RESULTS-temp.md", "python -m bench.temp_bytes", "XLA temp bytes: what each temp-byte pass removes, and the HLO behind what remains"),
    ("RESULTS-sharding.md", "python -m bench.sharding", "several devices: per-device bytes and placement"),
)


def other_results(directory: str) -> list[str]:
    """An index of the other benchmarks' results files that exist."""
    lines = ["## Other results files\n"]
    for name, command, what in _RESULTS_FILES:
        if os.path.exists(os.path.join(directory, name)):
            lines.append(f"- `bench/{name}` (`{command}`): {what}.")
    lines.append("")
    return lines
