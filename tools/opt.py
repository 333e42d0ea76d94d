"""``hloalias-opt``: an ``mlir-opt``-style driver for hloalias's passes and
the upstream passes torch-mlir's bindings register.

    hloalias-opt [FILE|-] --pass-pipeline='builtin.module(...)' [-o OUT]
                 [--split-input-file] [--mlir-print-ir-after-all]
                 [--print-alias-report] [--print-reports] [--xla-compile]
                 [--list-passes]

Exit codes: 0 on success, 1 when the input or the pipeline is bad (the
diagnostic, ``file:line:col: error: ...``, goes to stderr; never a Python
traceback), 2 for bad command-line usage."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

from torch_mlir import ir

from hloalias.errors import HloaliasError, PassError, PipelineError
from hloalias.mlir import new_context, parse_module, print_module

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
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
        try:
            outputs.append(_process(chunk, line_offset, source_name, args))
        except (PipelineError, PassError) as error:
            # Raised before any IR is read (pipeline text, pass options).
            print(f"{source_name}: error: {error}", file=sys.stderr)
            failed = True
        except HloaliasError as error:
            print(str(error), file=sys.stderr)
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
    context = new_context()
    module = parse_module(chunk, context, source_name, line_offset)
    if args.pass_pipeline:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the report says it, to stderr, on request
            reports = run_pipeline(
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
