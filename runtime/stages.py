"""The pass pipeline of a compile as observable stages: which pass ran,
what it reported, how long it took, and the module after it.

:func:`run_passes` runs a textual pipeline on a module in place.  When
someone looks at the compile's stages (:func:`hloalias.observe.detailed`:
the ``hloalias`` logger at INFO, a dump folder, a progress line) it runs
one pipeline element at a time, each a timed stage (``pass <name>``) whose
result is dumped; otherwise the whole pipeline runs in one ``PassManager``
run (one contract check less per pass) and only the reports are kept.
Either way the same passes run in the same order on the same module.
:func:`pass_lines` renders the runs as ``Executable.explain()`` shows them:
one line per pass that ran."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch_mlir import ir

from hloalias import observe
from hloalias.mlir import print_module
from hloalias.passes import get_all_passes
from hloalias.pipeline import parse_pipeline, run_pipeline


@dataclasses.dataclass(frozen=True)
class PassRun:
    """One pipeline element that ran: its name, the hloalias pass's report
    (None for an upstream MLIR pass) and its duration (None when the
    pipeline ran as one)."""

    name: str
    report: Any
    seconds: float | None


def run_passes(
    module: ir.Module, pipeline: str, runner: Callable[..., list[Any]] = run_pipeline
) -> list[PassRun]:
    """Run ``pipeline`` on ``module`` in place with ``runner`` (a
    :func:`hloalias.pipeline.run_pipeline`, the caller's); one
    :class:`PassRun` per top-level element, in order."""
    elements = parse_pipeline(pipeline)
    ours = get_all_passes()
    runs: list[PassRun] = []
    if not observe.detailed():
        in_order = iter(runner(module, pipeline))
        return [PassRun(e.name, next(in_order, None) if e.name in ours else None, None) for e in elements]
    for element in elements:
        mark = observe.start(f"pass {element.name}")
        reports = runner(module, f"builtin.module({element.text})")
        seconds = observe.finish(mark)
        observe.dump(f"after-{element.name}", lambda: print_module(module))
        runs.append(PassRun(element.name, reports[0] if reports else None, seconds))
    return runs


def pass_lines(runs: list[PassRun]) -> tuple[str, ...]:
    """``passes run (N):`` and one line per run: the first line of its
    report (or ``upstream MLIR pass``), with its duration when timed."""
    lines = [f"passes run ({len(runs)}):"]
    for run in runs:
        to_text = getattr(run.report, "to_text", None)
        text = str(to_text()).splitlines()[0] if callable(to_text) else f"{run.name}: upstream MLIR pass"
        if not text.startswith(run.name):
            text = f"{run.name}: {text}"
        timing = f" ({run.seconds * 1000:.1f} ms)" if run.seconds is not None else ""
        lines.append(f"  {text}{timing}")
    return tuple(lines)


__all__ = ["PassRun", "pass_lines", "run_passes"]
