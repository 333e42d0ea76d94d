"""``hloalias-opt``: an ``mlir-opt``-style driver for hloalias's passes and
the upstream passes torch-mlir's bindings register.

    hloalias-opt [FILE|-] --pass-pipeline='builtin.module(...)' [-o OUT]
                 [--split-input-file] [--mlir-print-ir-after-all]
                 [--print-alias-report] [--print-reports] [--xla-compile]
                 [--list-passes] [--verify-diagnostics] [--allow-unregistered-dialect]
                 [--mlir-timing] [--version]

``chlo`` ops parse (and stay); Shardy (``sdy``) ops and attributes parse
when jaxlib's MLIR has the dialect, and are carried as unregistered ops
(printed in generic form).  ``--verify-diagnostics`` checks the
diagnostics against ``// expected-error`` comments as ``mlir-opt`` does
(:mod:`hloalias.tools.verify_diagnostics`).

Exit codes: 0 on success, 1 when the input or the pipeline is bad (the
diagnostic, ``file:line:col: error: ...``, goes to stderr; never a Python
traceback), 2 for bad command-line usage."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

from torch_mlir import ir

from hloalias.errors import HloaliasError, PassError, PipelineError
from hloalias.mlir import new_context, parse_module, print_module
from hloalias.tools import verify_diagnostics

SPLIT_MARKER = "// -----"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hloalias-opt", description="Run hloalias and MLIR passes over a .mlir file."
    )
    parser.add_argument("input", nargs="?", default="-", help="input .mlir file ('-' for stdin)")
    parser.add_argument("--pass-pipeline", default="", help="textual pipeline: 'builtin.module(...)'")
    parser.add_argument("-o", dest="output", default="-", help="output file ('-' for stdout)")
    parser.add_argument("--split-input-file", action="store_true",
                        help=f"process each chunk separated by '{SPLIT_MARKER}' on its own")
    parser.add_argument("--mlir-print-ir-after-all", action="store_true",
                        help="print the IR after every pass (to stderr)")
    parser.add_argument("--print-alias-report", action="store_true",
                        help="print alias-donated-buffers' report (to stderr)")
    parser.add_argument("--print-reports", action="store_true",
                        help="print the report of every hloalias pass run, in run order (to stderr)")
    parser.add_argument("--xla-compile", action="store_true",
                        help="compile each result with XLA (PJRT CPU) and print its memory figures to stderr")
    parser.add_argument("--allow-stored-state", action="store_true",
                        help="--xla-compile a module whose state is in hloalias's stored layout "
                        "(hloalias.state_form, permute-conv-kernel-state): refused otherwise")
    parser.add_argument("--list-passes", action="store_true", help="list hloalias's passes and options")
    parser.add_argument("--verify-diagnostics", action="store_true",
                        help="check diagnostics against '// expected-error {{...}}' comments (as mlir-opt)")
    parser.add_argument("--allow-unregistered-dialect", action="store_true",
                        help="parse operations of dialects that are not registered")
    parser.add_argument("--mlir-timing", action="store_true",
                        help="print each top-level pass's wall time to stderr")
    parser.add_argument("--version", action=_PrintVersion, nargs=0, help="print the versions and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(_double_dashed(sys.argv[1:] if argv is None else list(argv)))
    if args.list_passes:
        _list_passes()
        return 0
    source_name = "<stdin>" if args.input == "-" else args.input
    try:
        data = sys.stdin.buffer.read() if args.input == "-" else _read_bytes(args.input)
    except OSError as error:
        print(f"hloalias-opt: cannot read '{args.input}': {error.strerror}", file=sys.stderr)
        return 1
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        print(
            f"{source_name}:{line}:{column}: error: input is not UTF-8 text "
            f"(byte 0x{data[error.start]:02x})",
            file=sys.stderr,
        )
        return 1
    chunks = _split(text) if args.split_input_file else [(text, 0)]
    outputs = []
    failed = False
    for chunk, line_offset in chunks:
        produced = ""
        try:
            outputs.append(_process(chunk, line_offset, source_name, args))
        except (PipelineError, PassError) as error:
            # Raised before any IR is read (pipeline text, pass options).
            produced = f"{source_name}: error: {error}"
        except HloaliasError as error:
            produced = str(error)
        if args.verify_diagnostics:
            mismatches = verify_diagnostics.verify(chunk, line_offset, source_name, produced)
            failed |= bool(mismatches)
            if mismatches:
                print("\n".join(mismatches), file=sys.stderr)
        elif produced:
            print(produced, file=sys.stderr)
            failed = True
    result = "".join(f"{o.rstrip()}\n" for o in outputs[:1]) + "".join(
        f"{SPLIT_MARKER}\n{o.rstrip()}\n" for o in outputs[1:]
    )
    if args.output == "-":
        sys.stdout.write(result)
    else:
        try:
            with open(args.output, "w", encoding="utf-8") as handle:
                handle.write(result)
        except OSError as error:
            print(f"hloalias-opt: cannot write '{args.output}': {error.strerror}", file=sys.stderr)
            return 1
    return 1 if failed else 0


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _split(text: str) -> list[tuple[str, int]]:
    chunks: list[tuple[str, int]] = []
    current: list[str] = []
    start = 0
    for line_number, line in enumerate(text.splitlines(keepends=True)):
        if line.strip() == SPLIT_MARKER:
            chunks.append(("".join(current), start))
            current, start = [], line_number + 1
        else:
            current.append(line)
    chunks.append(("".join(current), start))
    return chunks


def _process(chunk: str, line_offset: int, source_name: str, args: argparse.Namespace) -> str:
    from hloalias.passes.alias_donated_buffers import AliasReport
    from hloalias.pipeline import run_pipeline

    if not chunk.strip():
        raise HloaliasError(f"{source_name}:{line_offset + 1}:1: error: empty input: expected an MLIR module")
    text, context = _readable(chunk, line_offset, source_name, args)
    module = parse_module(text, context, source_name, line_offset)
    if args.pass_pipeline:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the report says it, to stderr, on request
            reports = _timed_pipeline(module, args, source_name, line_offset) if args.mlir_timing else run_pipeline(
                module,
                args.pass_pipeline,
                print_ir_after_all=args.mlir_print_ir_after_all,
                source_name=source_name,
                line_offset=line_offset,
            )
        for report in reports:
            if args.print_reports or (args.print_alias_report and isinstance(report, AliasReport)):
                print(_report_text(report), file=sys.stderr)
    text = print_module(module)
    if args.xla_compile:
        _xla_compile(module, text, source_name, line_offset, args.allow_stored_state)
    return text


def _readable(chunk: str, line_offset: int, source_name: str, args: argparse.Namespace) -> tuple[str, ir.Context]:
    """``chunk`` as torch-mlir's context parses it, and that context:
    ``chlo`` loaded where named; Shardy ops through jaxlib's MLIR into
    generic form (unregistered here); unregistered dialects on request."""
    from hloalias.foreign_ir import context_for, jaxlib_has_sdy, through_jaxlib

    text, unregistered = chunk, bool(args.allow_unregistered_dialect)
    if "sdy." in chunk and jaxlib_has_sdy():
        text = through_jaxlib(chunk, legalize_chlo=False, strip_sdy=False, source_name=source_name,
                              line_offset=line_offset)
        unregistered = True
    context = context_for(text)
    context.allow_unregistered_dialects = unregistered
    return text, context


def _timed_pipeline(module: ir.Module, args: argparse.Namespace, source_name: str, line_offset: int) -> list[Any]:
    """The pipeline one top-level element at a time, then an
    ``mlir-opt --mlir-timing``-style wall-time report on stderr."""
    from hloalias.pipeline import parse_pipeline, run_pipeline

    reports: list[Any] = []
    timings: list[tuple[str, float]] = []
    for element in parse_pipeline(args.pass_pipeline):
        started = time.perf_counter()
        reports += run_pipeline(module, f"builtin.module({element.text})",
                                print_ir_after_all=args.mlir_print_ir_after_all,
                                source_name=source_name, line_offset=line_offset)
        timings.append((element.name, time.perf_counter() - started))
    total = sum(seconds for _, seconds in timings) or 1e-9
    rule = "===" + "-" * 73 + "==="
    lines = [rule, "Execution time report".center(79).rstrip(), rule,
             f"  Total Execution Time: {total:.4f} seconds", "", "  ----Wall Time----  ----Name----"]
    lines += [f"  {seconds:8.4f} ({seconds / total * 100:5.1f}%)  {name}" for name, seconds in timings]
    lines.append(f"  {total:8.4f} (100.0%)  Total")
    print("\n".join(lines), file=sys.stderr)
    return reports


def _double_dashed(argv: list[str]) -> list[str]:
    """mlir-opt's single-dash spelling of long options (``-split-input-file``,
    ``-verify-diagnostics``, ``-pass-pipeline=...``) as argparse's ``--``."""
    long_options = {o for a in _parser()._actions for o in a.option_strings if o.startswith("--")}
    return [f"-{a}" if a.startswith("-") and not a.startswith("--") and f"-{a}".split("=")[0] in long_options
            else a for a in argv]


class _PrintVersion(argparse.Action):
    """``--version``, printed as one line (argparse's own wraps it)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(_version_text())
        parser.exit()


def _version_text() -> str:
    """``hloalias-opt --version``: hloalias's release and the MLIR builds."""
    from importlib import metadata

    from hloalias import __version__

    def version(distribution: str) -> str:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return "not installed"

    return (f"hloalias-opt (hloalias {__version__}); torch-mlir {version('torch-mlir')}, "
            f"jaxlib {version('jaxlib')}, torch {version('torch')}")


def _report_text(report: object) -> str:
    to_text = getattr(report, "to_text", None)
    return str(to_text()) if callable(to_text) else repr(report)


def _xla_compile(
    module: ir.Module, text: str, source_name: str, line_offset: int, allow_stored_state: bool = False
) -> None:
    """Compile ``module`` as the runtime would, after the checks that turn
    what XLA would abort on (or what would fail at call time) into
    diagnostics: the IR contract and 64-bit tensor extents."""
    from hloalias.errors import CompileError, IRError
    from hloalias.mlir import check_static_extents, location_prefix
    from hloalias.passes.base import verify_contract
    from hloalias.runtime.pjrt import compile_module, device_for, memory_stats

    check_static_extents(module, source_name, line_offset)
    where = location_prefix(_main_location(module), source_name, line_offset)
    try:
        verify_contract(module)
    except IRError as error:
        raise IRError(f"{where}: error: {error}") from None
    try:
        loaded = compile_module(text, device_for("cpu"), allow_stored_state=allow_stored_state)
    except CompileError as error:
        raise CompileError(f"{where}: error: {error}", error.repro_path) from None
    stats = memory_stats(loaded).as_dict()
    print("xla: " + " ".join(f"{k}={v}" for k, v in stats.items()), file=sys.stderr)


def _main_location(module: ir.Module) -> ir.Location:
    for op in module.body.operations:
        if op.operation.name == "func.func" and "sym_name" in op.attributes:
            if ir.StringAttr(op.attributes["sym_name"]).value == "main":
                return op.location
    return module.operation.location


def _list_passes() -> None:
    from hloalias.passes import get_all_passes

    for name, factory in sorted(get_all_passes().items()):
        pass_type = factory.__self__  # type: ignore[attr-defined]
        doc = (pass_type.__doc__ or "").strip().splitlines()[0]
        print(f"{name}: {doc}")
        for option, help_text in pass_type.option_help().items():
            print(f"  {option}: {help_text}")


if __name__ == "__main__":
    sys.exit(main())
