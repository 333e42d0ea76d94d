"""Textual pass pipelines that mix hloalias's passes with upstream ones.

``builtin.module(canonicalize, eliminate-view-results{dead-results=1},
alias-donated-buffers)`` builds one torch-mlir ``PassManager``: elements
naming a registered hloalias pass become Python-defined passes, every other
element is handed to MLIR's own pipeline parser.  The verifier runs after
every pass."""

from __future__ import annotations

from hloalias._layers import alias_bare_import

alias_bare_import(__name__, "hloalias.pipeline")

import dataclasses
import hashlib
from typing import Any

from torch_mlir import ir, passmanager

from hloalias.errors import IRError, PipelineError
from hloalias.mlir import format_diagnostics, print_module
from hloalias.passes import get_all_passes
from hloalias.passes.base import ModulePass

DEFAULT_PIPELINE = (
    "builtin.module(fold-transpose-into-dot-general, fold-broadcast-into-dot-general, bitcast-overwrite-scatter, window-scatter-indices, eliminate-view-results, alias-donated-buffers)"
)


@dataclasses.dataclass(frozen=True)
class PipelineElement:
    """One top-level element: ``name{options}`` or ``name(nested)``."""

    name: str
    options: str
    text: str


def parse_pipeline(text: str) -> list[PipelineElement]:
    """Split ``builtin.module(a, b{x=1}, func.func(c))`` into its elements.
    Raises :class:`PipelineError` for unbalanced or unanchored text."""
    stripped = text.strip()
    if not (stripped.startswith("builtin.module(") and stripped.endswith(")")):
        raise PipelineError(
            f"pipeline must have the form 'builtin.module(...)', got '{text}'"
        )
    inner = stripped[len("builtin.module(") : -1]
    elements = []
    for part in _split_top_level(inner, text):
        part = part.strip()
        if not part:
            continue
        name_end = len(part)
        for index, char in enumerate(part):
            if char in "{(":
                name_end = index
                break
        name = part[:name_end].strip()
        rest = part[name_end:].strip()
        options = rest[1:-1] if rest.startswith("{") and rest.endswith("}") else ""
        elements.append(PipelineElement(name, options, part))
    return elements


def _split_top_level(inner: str, whole: str) -> list[str]:
    parts, depth, start = [], 0, 0
    closing = {")": "(", "}": "{"}
    stack: list[str] = []
    for index, char in enumerate(inner):
        if char in "({":
            stack.append(char)
        elif char in ")}":
            if not stack or stack.pop() != closing[char]:
                raise PipelineError(f"unbalanced '{char}' in pipeline '{whole}'")
        elif char == "," and not stack:
            parts.append(inner[start:index])
            start = index + 1
        depth = len(stack)
    if depth:
        raise PipelineError(f"unbalanced brackets in pipeline '{whole}'")
    parts.append(inner[start:])
    return parts


def build_pass_manager(
    text: str, context: ir.Context, reports: list[Any] | None = None
) -> tuple[passmanager.PassManager, list[ModulePass]]:
    """A ``PassManager`` for pipeline ``text`` and the hloalias passes in it.
    Each hloalias pass run appends its report to ``reports``."""
    registry = get_all_passes()
    instances: list[ModulePass] = []
    with context:
        pm = passmanager.PassManager("builtin.module")
        for element in parse_pipeline(text):
            if element.name in registry:
                instance = registry[element.name](element.options)
                instance.add_to(pm, reports)
                instances.append(instance)
                continue
            try:
                pm.add(element.text)
            except ValueError as error:
                raise PipelineError(
                    f"unknown pass or bad options in pipeline element '{element.text}': "
                    f"{str(error).strip()}"
                ) from None
    return pm, instances


def run_pipeline(
    module: ir.Module,
    text: str,
    *,
    print_ir_after_all: bool = False,
    source_name: str = "-",
    line_offset: int = 0,
) -> list[Any]:
    """Run pipeline ``text`` on ``module`` in place; return the hloalias
    passes' reports in run order.  A failing pass raises :class:`IRError`
    with ``file:line:col`` diagnostics."""
    reports: list[Any] = []
    pm, _ = build_pass_manager(text, module.context, reports)
    if print_ir_after_all:
        module.context.enable_multithreading(False)
        pm.enable_ir_printing()
    try:
        pm.run(module.operation)
    except ir.MLIRError as error:
        raise IRError(format_diagnostics(error, source_name, line_offset)) from None
    return reports


def module_cache_key(module: ir.Module) -> str:
    """Key of a final module: SHA-256 of its text without locations.  Two
    configurations that produce the same module (same aliasing, same
    removed results) share it; any difference in aliasing changes it."""
    return hashlib.sha256(print_module(module).encode()).hexdigest()


__all__ = [
    "DEFAULT_PIPELINE",
    "PipelineElement",
    "build_pass_manager",
    "module_cache_key",
    "parse_pipeline",
    "run_pipeline",
]
