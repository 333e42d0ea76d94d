"""Textual pass pipelines that mix hloalias's passes with upstream ones.

``builtin.module(canonicalize, eliminate-view-results{dead-results=1},
alias-donated-buffers)`` builds one torch-mlir ``PassManager``: elements
naming a registered hloalias pass become Python-defined passes, every other
element is handed to MLIR's own pipeline parser.  The verifier runs after
every pass; the IR contract is checked before and after each hloalias pass,
in full where ``@main``'s signature changed (:func:`run_pipeline` runs in a
:func:`hloalias.contract.verification_scope`)."""

from __future__ import annotations

from hloalias._layers import alias_bare_import

alias_bare_import(__name__, "hloalias.pipeline")

import dataclasses
import hashlib
import re
from typing import Any

from torch_mlir import ir, passmanager

from hloalias.config import memo_cache_size
from hloalias.contract import verification_scope
from hloalias.errors import IRError, PipelineError
from hloalias.lru import memoized
from hloalias.mlir import format_diagnostics, print_module
from hloalias.pass_runs import run_verifying_result
from hloalias.passes import get_all_passes
from hloalias.passes.base import ModulePass

DEFAULT_PIPELINE = (
    "builtin.module(fold-transpose-into-dot-general, fold-broadcast-into-dot-general, window-scatter-indices, window-gather-indices, scatter-to-dynamic-update-slice, select-to-dynamic-update-slice, bitcast-overwrite-scatter, widen-one-row-updates, fold-repeat-into-dot-general, elementwise-in-producer-shape, eliminate-view-results, alias-donated-buffers)"
)

STATE_LAYOUT_PASS = "permute-conv-kernel-state"
POOL_LAYOUT_PASS = "reduce-window-in-conv-layout"
STATE_BITS_PASS = "store-state-as-bits"

#: The default pipeline, then ``accumulate-bf16-dots-in-f32``, the two layout passes measured on XLA:CPU
#: (``reduce-window-in-conv-layout``, ``permute-conv-kernel-state``) and
#: ``store-state-as-bits`` (state XLA:CPU would copy to bit-cast it, as
#: ``bitcast-overwrite-scatter`` leaves a bf16 cache): what
#: ``hloalias.compile`` runs for a program on one CPU device when no pipeline
#: is given.  Not the default pipeline itself: ``permute-conv-kernel-state``
#: and ``store-state-as-bits`` change ``@main``'s argument types (the runtime
#: uploads that state permuted or as bits; another caller of the module
#: would have to as well), and all three target copies measured on XLA:CPU
#: (other backends are not measured); first ``accumulate-bf16-dots-in-f32``
#: (XLA:CPU's dot library takes bf16 operands with an f32 result without
#: converting the weights; measured on XLA:CPU only); last
#: ``order-in-place-updates`` (an in-place update of a weight that the
#: backward still reads is ordered after that read, so XLA's copy insertion
#: keeps no copy of the weight; it guards nothing where every read is
#: already ordered, as on the inference workloads of ``bench/``: measured by
#: ``bench.order_updates``).
#: Appended to the pipeline of every program compiled for a mesh
#: (``hloalias.runtime.executable``): XLA's SPMD partitioner aborts the
#: process on a scatter with 64-bit indices.
SPMD_INDEX_PASS = "narrow-scatter-indices"
BF16_DOT_PASS = "accumulate-bf16-dots-in-f32"
ORDER_PASS = "order-in-place-updates"

CPU_PIPELINE = (  # fold-repeat's chunks: exact as measured on XLA:CPU's dot kernel only
    DEFAULT_PIPELINE.replace(" fold-repeat-into-dot-general,", " fold-repeat-into-dot-general{chunk-bytes=262144},")[:-1]
    + f", {BF16_DOT_PASS}, {POOL_LAYOUT_PASS}, {STATE_LAYOUT_PASS}, {STATE_BITS_PASS}, {ORDER_PASS})"
)


def for_spmd(pipeline: str) -> str:
    """``pipeline`` with :data:`SPMD_INDEX_PASS` last (once)."""
    if SPMD_INDEX_PASS in {element.name for element in parse_pipeline(pipeline)}:
        return pipeline
    return pipeline.rstrip()[:-1] + f", {SPMD_INDEX_PASS})"


def with_fixed_layouts(pipeline: str, layouts: tuple[str, ...]) -> str:
    """``pipeline`` with ``layouts`` (``NAME:torch`` / ``NAME:P0.P1...``)
    as the option of each ``permute-conv-kernel-state`` that has no options;
    unchanged when ``layouts`` is empty or the pass is not in it."""
    elements = parse_pipeline(pipeline)
    if not layouts or not any(e.name == STATE_LAYOUT_PASS and not e.options for e in elements):
        return pipeline
    option = f"{STATE_LAYOUT_PASS}{{layouts={','.join(layouts)}}}"
    texts = [option if e.name == STATE_LAYOUT_PASS and not e.options else e.text for e in elements]
    return f"builtin.module({', '.join(texts)})"


def with_fixed_dtypes(pipeline: str, dtypes: tuple[str, ...]) -> str:
    """``pipeline`` with ``dtypes`` (``NAME:torch`` / ``NAME:bits``) as the
    option of each ``store-state-as-bits`` that has no options; unchanged
    when ``dtypes`` is empty or the pass is not in it."""
    elements = parse_pipeline(pipeline)
    if not dtypes or not any(e.name == STATE_BITS_PASS and not e.options for e in elements):
        return pipeline
    option = f"{STATE_BITS_PASS}{{dtypes={','.join(dtypes)}}}"
    texts = [option if e.name == STATE_BITS_PASS and not e.options else e.text for e in elements]
    return f"builtin.module({', '.join(texts)})"


@dataclasses.dataclass(frozen=True)
class PipelineElement:
    """One top-level element: ``name``, ``name{options}`` or ``name(nested)``.
    ``text`` is the element as written (handed to MLIR for upstream passes)."""

    name: str
    options: str
    text: str
    nested: bool = dataclasses.field(default=False, compare=False)


_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


class _PipelineParser:
    """A recursive-descent reader of MLIR's textual pipeline syntax:

        pipeline := NAME '(' [element (',' element)*] ')'
        element  := NAME ['{' options '}'] ['(' [element (',' element)*] ')']

    ``options`` may nest braces and hold quoted strings.  Anything else
    where a ``,``, ``)`` or the end is due is an error naming it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.position = 0

    def fail(self, message: str) -> PipelineError:
        return PipelineError(f"{message} in pipeline '{self.text}'")

    def skip_space(self) -> None:
        while self.position < len(self.text) and self.text[self.position].isspace():
            self.position += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.position] if self.position < len(self.text) else ""

    def rest(self) -> str:
        return self.text[self.position:]

    def offending(self) -> str:
        """The token at the cursor: a word, or one bracket character."""
        self.skip_space()
        match = re.compile(r"[^\s,(){}]+").match(self.text, self.position)
        return match[0] if match else self.text[self.position:self.position + 1]

    def name(self) -> str:
        self.skip_space()
        match = _NAME_RE.match(self.text, self.position)
        if not match:
            found = self.rest() or "the end"
            raise self.fail(f"expected a pass name at '{found}'")
        self.position = match.end()
        return match[0]

    def options(self) -> str:
        """The text between ``{`` (at the cursor) and its matching ``}``."""
        start = self.position + 1
        depth = 0
        quote = ""
        for index in range(self.position, len(self.text)):
            char = self.text[index]
            if quote:
                if char == quote:
                    quote = ""
            elif char in "\"'":
                quote = char
            elif char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    self.position = index + 1
                    return self.text[start:index]
        raise self.fail(f"unbalanced '{{' in '{self.text[start - 1:]}'")

    def element(self) -> tuple[PipelineElement, list[PipelineElement] | None]:
        self.skip_space()
        start = self.position
        name = self.name()
        options = ""
        if self.peek() == "{":
            options = self.options()
        nested = None
        if self.peek() == "(":
            nested = self.nested_list()
        text = self.text[start:self.position].strip()
        return PipelineElement(name, options, text, nested is not None), nested

    def nested_list(self) -> list[PipelineElement]:
        """``( element, ... )`` at the cursor."""
        assert self.peek() == "("
        self.position += 1
        elements: list[PipelineElement] = []
        if self.peek() == ")":
            self.position += 1
            return elements
        while True:
            element, _ = self.element()
            elements.append(element)
            follow = self.peek()
            if follow == ",":
                self.position += 1
                continue
            if follow == ")":
                self.position += 1
                return elements
            if not follow:
                raise self.fail(f"unbalanced '(': missing ')' after '{element.text}'")
            raise self.fail(f"unexpected '{self.offending()}' after '{element.text}'")


def parse_pipeline(text: str) -> list[PipelineElement]:
    """The top-level elements of ``builtin.module(a, b{x=1}, func.func(c))``.
    Raises :class:`PipelineError` naming the offending text: unbalanced
    brackets, text after an element (``pass{a=1}junk``), a missing anchor."""
    return list(_parse_pipeline(text))


@memoized(memo_cache_size)
def _parse_pipeline(text: str) -> tuple[PipelineElement, ...]:
    """:func:`parse_pipeline`, kept for the texts used last (a compile
    reads its pipeline several times; elements are immutable).  Bounded by
    HLOALIAS_MEMO_CACHE_SIZE: a program may name pipelines of its own."""
    parser = _PipelineParser(text)
    if not parser.peek():
        raise PipelineError(f"pipeline must have the form 'builtin.module(...)', got '{text}'")
    anchor, elements = parser.element()
    if anchor.name != "builtin.module" or elements is None or anchor.options:
        raise PipelineError(f"pipeline must have the form 'builtin.module(...)', got '{text}'")
    if parser.peek():
        raise parser.fail(f"unexpected '{parser.offending()}' after 'builtin.module(...)'")
    return tuple(elements)


def build_pass_manager(
    text: str, context: ir.Context, reports: list[Any] | None = None
) -> tuple[passmanager.PassManager, list[ModulePass[Any]]]:
    """A ``PassManager`` for pipeline ``text`` and the hloalias passes in it.
    Each hloalias pass run appends its report to ``reports``."""
    registry = get_all_passes()
    instances: list[ModulePass[Any]] = []
    with context:
        pm = passmanager.PassManager("builtin.module")
        # An hloalias pass right after another verified the contract on its
        # way out, and nothing ran in between: no second check on entry.
        after_hloalias_pass = False
        for element in parse_pipeline(text):
            if element.name in registry:
                if element.nested:
                    raise PipelineError(
                        f"pass '{element.name}' takes no nested pipeline: '{element.text}'"
                    )
                instance = registry[element.name](element.options)
                instance.add_to(pm, reports, verify_on_entry=not after_hloalias_pass)
                instances.append(instance)
                after_hloalias_pass = True
                continue
            after_hloalias_pass = False
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
        with verification_scope():  # one check per change of @main's signature
            # MLIR's verifier once, after the last pass (hloalias/pass_runs.py):
            # each hloalias pass checks the IR contract on its way out.
            run_verifying_result(pm, module.operation)
    except ir.MLIRError as error:
        raise IRError(format_diagnostics(error, source_name, line_offset)) from None
    return reports


# Attributes that only explain decisions (for reports): neither XLA nor the
# runtime reads them, so they do not distinguish executables.  Removed from
# the printed attribute dictionaries (sorted by name): after another entry,
# before another entry, or alone.
_REPORT_ONLY = r'hloalias\.(?:donation|unused_donation) = "(?:[^"\\]|\\.)*"'
_REPORT_ONLY_RES = (
    re.compile(", " + _REPORT_ONLY),
    re.compile(_REPORT_ONLY + ", "),
    re.compile(r" \{" + _REPORT_ONLY + r"\}"),
)


def module_cache_key(module: ir.Module | str) -> str:
    """Key of a final module (or of its text as :func:`print_module` prints
    it, when the caller has it already): SHA-256 of its text without
    locations and without report-only attributes (``hloalias.donation``,
    ``hloalias.unused_donation``).  Two configurations that produce the same
    module (same aliasing, same removed results) share it; any difference
    in aliasing changes it."""
    text = module if isinstance(module, str) else print_module(module)
    for pattern in _REPORT_ONLY_RES:
        text = pattern.sub("", text)
    return hashlib.sha256(text.encode()).hexdigest()


__all__ = [
    "CPU_PIPELINE",
    "ORDER_PASS",
    "DEFAULT_PIPELINE",
    "POOL_LAYOUT_PASS",
    "STATE_BITS_PASS",
    "STATE_LAYOUT_PASS",
    "PipelineElement",
    "build_pass_manager",
    "module_cache_key",
    "parse_pipeline",
    "run_pipeline",
    "with_fixed_dtypes",
    "with_fixed_layouts",
]
