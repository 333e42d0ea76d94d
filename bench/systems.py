"""The measurement columns: compiled device bytes of one workload under

* ``torch-mlir`` — plain ``torch_mlir.fx.export_and_import(...,
  output_type="stablehlo")`` compiled with
  :func:`hloalias.runtime.pjrt.compile_module` (it freezes module state
  into constants, which XLA keeps outside the four memory figures);
* ``canonicalize`` — hloalias's own import with
  ``pipeline="builtin.module(canonicalize)"``: state stays as arguments and
  no hloalias pass runs;
* ``jax`` — ``jax.jit(...).lower(...).compile().memory_analysis()`` of the
  hand-written JAX equivalent with ``donate_argnums`` for state/donations;
* ``hloalias`` — ``hloalias.compile(...)`` and ``exe.memory_stats``;

plus pass time against XLA compile time, and output checks against eager
PyTorch."""

from __future__ import annotations

import dataclasses
import re
import statistics
import time
from typing import Any

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree
from torch_mlir.fx import export_and_import

import hloalias
from hloalias.legalize import inline_dense_resources, legalize_tensor_constants
from hloalias.mlir import print_module
from hloalias.passes import FoldReport
from hloalias.pipeline import run_pipeline
from hloalias.runtime import pjrt

from bench.workloads import Workload, eager_reference

SYSTEM_TORCH_MLIR = "torch-mlir"
SYSTEM_CANONICALIZE = "canonicalize"
SYSTEM_JAX = "jax"
SYSTEM_HLOALIAS = "hloalias"
SYSTEMS = (SYSTEM_TORCH_MLIR, SYSTEM_CANONICALIZE, SYSTEM_JAX, SYSTEM_HLOALIAS)
SYSTEM_LABELS = {
    SYSTEM_TORCH_MLIR: "torch-mlir export_and_import → PJRT",
    SYSTEM_CANONICALIZE: "hloalias import, canonicalize only",
    SYSTEM_JAX: "JAX jit + donate_argnums",
    SYSTEM_HLOALIAS: "hloalias (default pipeline)",
}


@dataclasses.dataclass
class Measurement:
    """XLA's compiled figures for one system on one workload."""

    system: str
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_bytes: int = 0
    constant_bytes: int = 0
    copy_bytes: int = 0
    copy_shapes: dict[str, int] = dataclasses.field(default_factory=dict)
    copied_parameters: tuple[int, ...] = ()
    transposed_copy_bytes: int = 0
    transposed_parameters: tuple[int, ...] = ()
    output_copy_bytes: int = 0
    seconds: float = 0.0
    error: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def pjrt_total(self) -> int:
        """argument + output − alias + temp, as PJRT reports them."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def device_total(self) -> int:
        """PJRT total plus the constants the executable holds."""
        return self.pjrt_total + self.constant_bytes

    @property
    def data_total(self) -> int:
        """argument + output − alias (what aliasing and views control)."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes


# -- facts read from XLA's optimized HLO --------------------------------------

_ELEMENT_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
    "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
_INSTRUCTION_RE = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\w+)\[([\d,]*)\](\S*) (\w[\w-]*)\(([^)]*)\)(.*)$")
_ROOT_TUPLE_RE = re.compile(r"^\s*ROOT %(\S+) = \(.*\) tuple\(([^)]*)\)")
_COMPUTATION_RE = re.compile(r"^(?:ENTRY )?%(\S+) .*\{\s*$")
_CALLS_RE = re.compile(r"calls=%([\w.\-]+)")
_PARAMETER_RE = re.compile(r"^parameter\((\d+)\)")
# Opcodes that only move or reinterpret data: a fusion made of nothing else
# writes a copy of its operand (transposed if it holds a transpose).
_MOVEMENT_OPCODES = frozenset({"parameter", "copy", "transpose", "bitcast", "reshape"})


def _shape_bytes(element: str, dims: str) -> int:
    count = 1
    for dim in filter(None, dims.split(",")):
        count *= int(dim)
    return count * _ELEMENT_BYTES.get(element, 4)


@dataclasses.dataclass(frozen=True)
class HloFacts:
    """What the optimized HLO of an executable shows."""

    constant_bytes: int
    copy_bytes: int
    copy_shapes: dict[str, int]
    copied_parameters: tuple[int, ...]
    transposed_copy_bytes: int
    transposed_parameters: tuple[int, ...]
    output_copy_bytes: int  # copies that are results of the entry computation (written into output buffers)


@dataclasses.dataclass(frozen=True)
class _Instruction:
    name: str
    root: bool
    element: str
    dims: str
    layout: str
    opcode: str
    operands: tuple[str, ...]
    calls: str | None
    parameter: int | None


def _computations(text: str) -> dict[str, tuple[bool, list[_Instruction]]]:
    """Every computation of the HLO text: name -> (is entry, instructions)."""
    computations: dict[str, tuple[bool, list[_Instruction]]] = {}
    current: list[_Instruction] | None = None
    for line in text.splitlines():
        header = _COMPUTATION_RE.match(line)
        if header:
            current = []
            computations[header.group(1)] = (line.startswith("ENTRY "), current)
            continue
        if line.startswith("}"):
            current = None
            continue
        if current is None:
            continue
        root_tuple = _ROOT_TUPLE_RE.match(line)
        if root_tuple:  # a tuple-shaped result does not fit _INSTRUCTION_RE
            current.append(_Instruction(root_tuple.group(1), True, "", "", "", "tuple",
                                        tuple(re.findall(r"%([\w.\-]+)", root_tuple.group(2))), None, None))
            continue
        match = _INSTRUCTION_RE.match(line)
        if not match:
            continue
        root = line.lstrip().startswith("ROOT ")
        name, element, dims, layout, opcode, operands, rest = match.groups()
        calls = _CALLS_RE.search(rest)
        parameter = _PARAMETER_RE.match(f"{opcode}({operands})")
        current.append(_Instruction(
            name, root, element, dims, layout, opcode, tuple(re.findall(r"%([\w.\-]+)", operands)),
            calls.group(1) if calls else None, int(parameter.group(1)) if parameter else None,
        ))
    return computations


def _changes_layout(copy: _Instruction, by_name: dict[str, _Instruction]) -> bool:
    """Whether a ``copy`` writes its operand in another layout (a physical transpose)."""
    source = by_name.get(copy.operands[0]) if copy.operands else None
    return source is not None and source.layout != copy.layout


def hlo_facts(loaded: Any) -> HloFacts:
    """Facts read from a compiled executable's optimized HLO: bytes of every
    non-scalar ``constant`` instruction (XLA keeps them outside the four
    memory figures), and bytes and shapes of every instruction of the entry
    computation that materializes a copy or a transposed copy (into a temp
    or an output buffer): a ``copy`` or ``transpose``, or a fusion whose
    computation only moves data (copy / transpose / bitcast / reshape).  A
    copy is *transposed* if it holds a transpose or changes the layout.
    Which entry parameters such copies read, and which copies are results of
    the entry computation, is recorded too."""
    text = "\n".join(module.to_string() for module in loaded.hlo_modules())
    computations = _computations(text)
    constants = copies = transposed_bytes = output_copies = 0
    shapes: dict[str, int] = {}
    copied: list[int] = []
    transposed_parameters: list[int] = []
    for is_entry, instructions in computations.values():
        by_name = {instruction.name: instruction for instruction in instructions}
        root = next((i for i in instructions if i.root), None)
        results = set(root.operands if root is not None and root.opcode == "tuple" else
                      [root.name] if root is not None else [])
        for instruction in instructions:
            if instruction.opcode == "constant" and instruction.dims:
                constants += _shape_bytes(instruction.element, instruction.dims)
            if not is_entry:
                continue
            if instruction.opcode == "fusion" and instruction.calls in computations:
                fused = computations[instruction.calls][1]
                if not {i.opcode for i in fused} <= _MOVEMENT_OPCODES:
                    continue
                fused_by_name = {i.name: i for i in fused}
                transposed = any(i.opcode == "transpose" or (i.opcode == "copy" and _changes_layout(i, fused_by_name))
                                 for i in fused)
            elif instruction.opcode == "copy":
                transposed = _changes_layout(instruction, by_name)
            elif instruction.opcode == "transpose":
                transposed = True
            else:
                continue
            size = _shape_bytes(instruction.element, instruction.dims)
            copies += size
            shape = ("transposed " if transposed else "") + f"{instruction.element}[{instruction.dims}]"
            shapes[shape] = shapes.get(shape, 0) + 1
            if transposed:
                transposed_bytes += size
            if instruction.name in results:
                output_copies += size
            for operand in instruction.operands:
                source = by_name.get(operand)
                if source is not None and source.parameter is not None:
                    (transposed_parameters if transposed else copied).append(source.parameter)
    return HloFacts(constants, copies, shapes, tuple(copied), transposed_bytes, tuple(transposed_parameters),
                    output_copies)


def _measurement(system: str, argument: int, output: int, alias: int, temp: int, facts: HloFacts,
                 seconds: float) -> Measurement:
    return Measurement(
        system,
        argument_bytes=argument,
        output_bytes=output,
        alias_bytes=alias,
        temp_bytes=temp,
        constant_bytes=facts.constant_bytes,
        copy_bytes=facts.copy_bytes,
        copy_shapes=facts.copy_shapes,
        copied_parameters=facts.copied_parameters,
        transposed_copy_bytes=facts.transposed_copy_bytes,
        transposed_parameters=facts.transposed_parameters,
        output_copy_bytes=facts.output_copy_bytes,
        seconds=seconds,
    )


def _from_stats(system: str, stats: Any, loaded: Any, seconds: float) -> Measurement:
    return _measurement(system, stats.argument_size_in_bytes, stats.output_size_in_bytes,
                        stats.alias_size_in_bytes, stats.temp_size_in_bytes, hlo_facts(loaded), seconds)


# -- torch-mlir export_and_import ---------------------------------------------


def measure_torch_mlir(workload: Workload, exported: torch.export.ExportedProgram) -> Measurement:
    """Plain torch-mlir: ``export_and_import(..., output_type="stablehlo")``,
    printed, compiled with ``compile_module``.  Two fixes are applied so
    that it compiles at all, and noted: tensor ``arith.constant`` ->
    ``stablehlo.constant`` and ``dense_resource`` blobs inlined as
    ``dense`` literals."""
    start = time.perf_counter()
    notes = []
    try:
        module = export_and_import(exported, output_type="stablehlo")
        legalized = legalize_tensor_constants(module)
        if legalized:
            notes.append(f"{legalized} tensor arith.constant rewritten to stablehlo.constant (XLA cannot read arith)")
        text = str(module)
        del module
        text, inlined = inline_dense_resources(text)
        if inlined:
            notes.append(
                f"{inlined} dense_resource blobs (frozen module state) inlined as dense literals "
                "(a StableHLO portable artifact cannot carry resources)"
            )
        loaded = pjrt.compile_module(text, pjrt.device_for("cpu"))
        del text
    except Exception as error:  # a failing baseline is a result, not a crash
        return Measurement(SYSTEM_TORCH_MLIR, error=f"{type(error).__name__}: {str(error).splitlines()[0]}",
                           seconds=time.perf_counter() - start)
    measurement = _from_stats(SYSTEM_TORCH_MLIR, loaded.get_compiled_memory_stats(), loaded,
                              time.perf_counter() - start)
    measurement.notes = notes
    return measurement


# -- hloalias ---------------------------------------------------------------


def measure_hloalias(
    workload: Workload, exported: torch.export.ExportedProgram, *, baseline: bool
) -> tuple[Measurement, hloalias.Executable]:
    """``hloalias.compile`` with the default pipeline and the workload's
    donations, or (``baseline``) with ``builtin.module(canonicalize)`` and no
    donations; the measurement and the executable."""
    start = time.perf_counter()
    if baseline:
        exe = hloalias.compile(exported, workload.args, pipeline="builtin.module(canonicalize)")
    else:
        exe = hloalias.compile(exported, workload.args, donate=workload.donate)
    seconds = time.perf_counter() - start
    system = SYSTEM_CANONICALIZE if baseline else SYSTEM_HLOALIAS
    stats = exe.memory_stats
    measurement = _measurement(system, stats["argument_bytes"], stats["output_bytes"], stats["alias_bytes"],
                               stats["temp_bytes"], hlo_facts(exe._loaded), seconds)
    return measurement, exe


# -- JAX --------------------------------------------------------------------


def measure_jax(workload: Workload) -> tuple[Measurement, Any]:
    """``jax.jit(fn, donate_argnums=...)`` lowered and compiled on the
    workload's inputs; the measurement and the compiled function."""
    start = time.perf_counter()
    jitted = jax.jit(workload.jax_fn, donate_argnums=workload.jax_donate_argnums)
    compiled = jitted.lower(*workload.jax_inputs()).compile()
    seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()
    measurement = _from_stats(SYSTEM_JAX, stats, compiled.runtime_executable(), seconds)
    return measurement, compiled


def measure_jax_diagnostic(workload: Workload) -> Measurement | None:
    """The workload's diagnostic JAX variant, compiled like :func:`measure_jax`."""
    if workload.jax_diagnostic is None:
        return None
    what, fn = workload.jax_diagnostic
    start = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=workload.jax_donate_argnums).lower(*workload.jax_inputs()).compile()
    measurement = _from_stats(SYSTEM_JAX, compiled.memory_analysis(), compiled.runtime_executable(),
                              time.perf_counter() - start)
    measurement.notes = [what]
    return measurement


# -- pass time vs XLA compile time ------------------------------------------


@dataclasses.dataclass(frozen=True)
class PassTiming:
    """Default pipeline time on a fresh import vs ``compile_module`` time."""

    workload: str
    ops: int
    pass_seconds: float
    xla_seconds: float
    same_module_as_compile: bool
    pipeline: str = ""
    # Transposes fold-transpose-into-dot-general absorbed (None: not run).
    folded_transposes: int | None = None
    # The imported module the pipeline was timed on, kept for profiling.
    imported_text: str = dataclasses.field(default="", repr=False)

    @property
    def ratio(self) -> float:
        """Pass time as a fraction of XLA compile time."""
        return self.pass_seconds / self.xla_seconds


def time_passes(workload: Workload, exported: torch.export.ExportedProgram, exe: hloalias.Executable,
                repeats: int = 3) -> PassTiming:
    """Import once, then on ``repeats`` fresh clones time
    ``run_pipeline(module, workload.pipeline)`` (median) and time
    ``compile_module`` of the result once."""
    program = hloalias.import_torch(exported)
    main = program.torch_mlir_module.body.operations[0]
    ops = sum(1 for _ in main.regions[0].blocks[0].operations)
    imported_text = print_module(program.torch_mlir_module)
    times = []
    final_text = ""
    folded = None
    for _ in range(repeats):
        clone = program.clone()
        start = time.perf_counter()
        reports = run_pipeline(clone.torch_mlir_module, workload.pipeline)
        times.append(time.perf_counter() - start)
        final_text = print_module(clone.torch_mlir_module)
        folded = next((r.folded for r in reports if isinstance(r, FoldReport)), None)
    start = time.perf_counter()
    pjrt.compile_module(final_text, pjrt.device_for("cpu"))
    xla_seconds = time.perf_counter() - start
    return PassTiming(workload.key, ops, statistics.median(times), xla_seconds,
                      final_text == exe.mlir, workload.pipeline, folded, imported_text)


# -- correctness ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Check:
    """Largest absolute difference of a system's outputs and state from eager."""

    system: str
    max_abs_error: float
    compared: int
    ok: bool


def _max_error(pairs: list[tuple[Any, torch.Tensor]]) -> float:
    worst = 0.0
    for got, want in pairs:
        got_array = np.asarray(got.detach().numpy() if isinstance(got, torch.Tensor) else got, dtype=np.float64)
        want_array = want.detach().numpy().astype(np.float64)
        if got_array.shape != want_array.shape:
            return float("inf")
        if got_array.size:
            worst = max(worst, float(np.max(np.abs(got_array - want_array))))
    return worst


def check_outputs(workload: Workload, exe: hloalias.Executable, compiled_jax: Any,
                  tolerance: float = 1e-3) -> list[Check]:
    """Run hloalias and JAX once on the example inputs and compare outputs
    and updated state with eager PyTorch.  A donated input is passed to
    hloalias as a DeviceTensor, so the donation really happens."""
    outputs, state, _, _ = eager_reference(workload)
    args = [a.clone() for a in workload.args]
    call_args: list[Any] = [
        exe.to_device(a) if i in workload.donate else a for i, a in enumerate(args)
    ]
    got = pytree.tree_leaves(exe(*call_args))
    pairs: list[tuple[Any, torch.Tensor]] = list(zip(got, outputs))
    exe_state = exe.state_dict()
    pairs += [(exe_state[name], value) for name, value in state.items() if name in exe_state]
    count = len(pairs) if len(got) == len(outputs) else -1
    error = _max_error(pairs) if count >= 0 else float("inf")
    checks = [Check(SYSTEM_HLOALIAS, error, count, error <= tolerance)]

    jax_outputs, jax_state = workload.jax_flatten(compiled_jax(*workload.jax_inputs()))
    jax_pairs: list[tuple[Any, torch.Tensor]] = list(zip(jax_outputs, outputs))
    jax_pairs += [(jax_state[name], value) for name, value in state.items() if name in jax_state]
    count = len(jax_pairs) if len(jax_outputs) == len(outputs) else -1
    error = _max_error(jax_pairs) if count >= 0 else float("inf")
    checks.append(Check(SYSTEM_JAX, error, count, error <= tolerance))
    return checks


__all__ = [
    "Check", "HloFacts", "Measurement", "PassTiming", "SYSTEMS", "SYSTEM_LABELS", "check_outputs", "hlo_facts",
    "measure_hloalias", "measure_jax", "measure_jax_diagnostic", "measure_torch_mlir", "time_passes",
]
