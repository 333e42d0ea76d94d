"""Seeing into a compile: stage durations on the ``hloalias`` logger, a
progress line on stderr for long compiles, and dumps of each stage's IR.

A compile (:func:`compile_trace`) is a sequence of stages — ``torch.export``,
``decompositions``, ``FX import``, the torch-mlir lowerings, each pass,
``XLA compile`` — that the code marks with :func:`start`/:func:`finish`
(or :func:`stage`).  For each one:

- **Logging**: ``logging.getLogger("hloalias")`` gets one INFO record per
  stage with its duration (``hloalias: GPT2LMHeadModel: XLA compile 11.204 s``)
  and one for the whole compile.  ``HLOALIAS_LOG=INFO`` attaches a stderr
  handler for people who do not configure logging themselves.
- **Progress**: once a compile has run ``HLOALIAS_PROGRESS_AFTER`` seconds
  (default 2), a line on stderr names the stage it is in, and each later
  stage as it starts; the compile's total closes it.  Shown when stderr is
  a terminal and the logger does not already print INFO records
  (``HLOALIAS_PROGRESS=auto``, the default), always with ``1``, never
  with ``0``.  On a terminal the line is redrawn in place; elsewhere each
  update is a line of its own.
- **Dumps**: with ``dump_dir`` (``hloalias.compile(..., dump_dir=...)`` or
  ``HLOALIAS_DUMP_DIR``) each compile writes a folder
  ``hloalias-<pid>-<n>-<name>/`` holding ``NN-<stage>.mlir`` in order: the
  torch dialect module torch-mlir's FX importer made, the StableHLO the
  passes start from, the module after each pass, and the final module XLA
  compiles.  Text is rendered only when it is written.

Outside a compile (a bare ``import_torch``) stages are still logged; there
is nothing to dump into."""

from __future__ import annotations

import contextlib
import functools
import contextvars
import dataclasses
import itertools
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TextIO, TypeVar

from hloalias import config

LOGGER = logging.getLogger("hloalias")

_COUNTER = itertools.count(1)
_CURRENT: contextvars.ContextVar[CompileTrace | None] = contextvars.ContextVar("hloalias_compile_trace", default=None)
_log_configured = False


def _configure_logging() -> None:
    """``HLOALIAS_LOG=LEVEL``: a stderr handler on the ``hloalias`` logger (once)."""
    global _log_configured
    if _log_configured:
        return
    _log_configured = True
    level = config.text("HLOALIAS_LOG")
    if level is None:
        return
    numeric = logging.getLevelName(level.strip().upper())
    if not isinstance(numeric, int):
        LOGGER.warning("HLOALIAS_LOG=%r is not a logging level; ignored", level)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
    LOGGER.addHandler(handler)
    LOGGER.setLevel(numeric)
    LOGGER.propagate = False  # the records are shown here, not twice


def logging_info() -> bool:
    """Whether INFO records of the ``hloalias`` logger reach a handler."""
    _configure_logging()
    return LOGGER.isEnabledFor(logging.INFO) and LOGGER.hasHandlers()


@dataclasses.dataclass
class StageTime:
    """One finished stage: its name and wall-clock seconds."""

    name: str
    seconds: float


@dataclasses.dataclass
class _Mark:
    name: str
    started: float
    trace: CompileTrace | None


class CompileTrace:
    """One compile's stages (:attr:`stages`, in order), its progress line
    and its dump folder (``None`` when not dumping)."""

    def __init__(self, name: str, dump_dir: str | None, stream: TextIO | None = None) -> None:
        self.name = name
        self.stages: list[StageTime] = []
        self.started = time.perf_counter()
        self.dump_folder: str | None = None
        if dump_dir:
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60] or "program"
            self.dump_folder = os.path.join(
                os.path.abspath(os.path.expanduser(dump_dir)), f"hloalias-{os.getpid()}-{next(_COUNTER)}-{safe}"
            )
            os.makedirs(self.dump_folder, exist_ok=True)
        self._dumps = 0
        self._stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()
        self._current: str | None = None
        self._showing = False
        self._progress_timer: threading.Timer | None = None
        mode = (config.text("HLOALIAS_PROGRESS") or "auto").strip().lower()
        if mode in ("1", "on", "true", "yes"):
            wanted = True
        elif mode in ("0", "off", "false", "no"):
            wanted = False
        else:
            wanted = self._is_terminal() and not logging_info()
        self._terminal = self._is_terminal()
        if wanted:
            after = config.number("HLOALIAS_PROGRESS_AFTER") or 0.0
            self._progress_timer = threading.Timer(after, self._show_progress)
            self._progress_timer.daemon = True
            if after > 0:
                self._progress_timer.start()
            else:  # shown from the start: no thread
                self._showing = True

    def _is_terminal(self) -> bool:
        isatty = getattr(self._stream, "isatty", None)
        return bool(isatty()) if callable(isatty) else False

    # -- stages --------------------------------------------------------------
    def _entered(self, name: str) -> None:
        with self._lock:
            self._current = name
            if self._showing:
                self._write_progress(f"{name}")

    def _left(self, name: str, seconds: float) -> None:
        with self._lock:
            self.stages.append(StageTime(name, seconds))
            if self._current == name:
                self._current = None

    def elapsed(self) -> float:
        """Seconds since the compile began."""
        return time.perf_counter() - self.started

    # -- progress ------------------------------------------------------------
    def _show_progress(self) -> None:
        with self._lock:
            if self._progress_timer is None:
                return  # the compile ended first
            self._showing = True
            self._write_progress(self._current or "")

    def _write_progress(self, what: str) -> None:
        text = f"hloalias: compiling {self.name} ({self.elapsed():.1f} s): {what}"
        try:
            if self._terminal:
                self._stream.write("\r\x1b[K" + text)
            else:
                self._stream.write(text + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            pass  # a closed stderr: progress is not worth an error

    def close(self, failed: bool) -> None:
        """Stop the progress line; log (and show) the compile's total."""
        total = self.elapsed()
        with self._lock:
            timer, self._progress_timer = self._progress_timer, None
            if timer is not None:
                timer.cancel()
            if self._showing:
                summary = ", ".join(f"{s.name} {s.seconds:.1f} s" for s in _grouped(self.stages))
                self._write_progress(f"{'failed' if failed else 'done'} in {total:.1f} s ({summary})")
                if self._terminal:
                    with contextlib.suppress(OSError, ValueError):
                        self._stream.write("\n")
                self._showing = False
        LOGGER.info("%s: %s in %.3f s", self.name, "compile failed" if failed else "compiled", total)

    # -- dumps ---------------------------------------------------------------
    def dump(self, stage: str, text: str | Callable[[], str]) -> str | None:
        """Write ``text`` as this compile's next ``NN-<stage>.mlir``; the path,
        or None when not dumping."""
        if self.dump_folder is None:
            return None
        with self._lock:
            number = self._dumps
            self._dumps += 1
        body = text() if callable(text) else text
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", stage)
        path = os.path.join(self.dump_folder, f"{number:02d}-{safe}.mlir")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(body if body.endswith("\n") else body + "\n")
        LOGGER.debug("%s: dumped %s", self.name, path)
        return path


def _grouped(stages: list[StageTime]) -> list[StageTime]:
    """Stages for the one-line summary: the passes summed as ``passes``."""
    grouped: list[StageTime] = []
    for entry in stages:
        name = "passes" if entry.name.startswith("pass ") else entry.name
        if grouped and grouped[-1].name == name:
            grouped[-1] = StageTime(name, grouped[-1].seconds + entry.seconds)
        else:
            grouped.append(StageTime(name, entry.seconds))
    return grouped


def current() -> CompileTrace | None:
    """The compile being traced in this context, if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def compile_trace(name: str, dump_dir: str | os.PathLike[str] | None = None) -> Iterator[CompileTrace]:
    """Trace a compile named ``name`` (its stages, progress, dumps) for the
    duration of the block.  ``dump_dir`` defaults to ``HLOALIAS_DUMP_DIR``.
    A nested call (a compile inside a compile) joins the outer trace."""
    outer = _CURRENT.get()
    if outer is not None:
        yield outer
        return
    _configure_logging()
    directory = os.fspath(dump_dir) if dump_dir is not None else config.text("HLOALIAS_DUMP_DIR")
    trace = CompileTrace(name, directory)
    token = _CURRENT.set(trace)
    failed = True
    try:
        yield trace
        failed = False
    finally:
        _CURRENT.reset(token)
        trace.close(failed)


def start(name: str) -> _Mark:
    """Begin stage ``name`` (pair with :func:`finish`)."""
    trace = _CURRENT.get()
    if trace is not None:
        trace._entered(name)
    return _Mark(name, time.perf_counter(), trace)


def finish(mark: _Mark) -> float:
    """End the stage :func:`start` began: record and log its duration."""
    seconds = time.perf_counter() - mark.started
    if mark.trace is not None:
        mark.trace._left(mark.name, seconds)
        LOGGER.info("%s: %s %.3f s", mark.trace.name, mark.name, seconds)
    else:
        LOGGER.info("%s %.3f s", mark.name, seconds)
    return seconds


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """:func:`start` and :func:`finish` around a block (finished on error too)."""
    mark = start(name)
    try:
        yield
    finally:
        finish(mark)


def dump(stage_name: str, text: str | Callable[[], str]) -> str | None:
    """Write ``text`` into the current compile's dump folder (see
    :meth:`CompileTrace.dump`); None when no compile is dumping."""
    trace = _CURRENT.get()
    return trace.dump(stage_name, text) if trace is not None else None


def program_name(f: Any) -> str:
    """A short name of what is compiled, for log lines and dump folders:
    a module's class (``GPT2LMHeadModel``), a function's qualified name,
    else the type's name (``ExportedProgram``)."""
    if _is_module(f) or not callable(f):
        return type(f).__name__
    qualname = getattr(f, "__qualname__", None)
    return qualname if isinstance(qualname, str) else type(f).__name__


def _is_module(f: Any) -> bool:
    """``f`` is a ``torch.nn.Module`` (told without importing torch)."""
    return any(cls.__name__ == "Module" and cls.__module__ == "torch.nn.modules.module" for cls in type(f).__mro__)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def traced_compile(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``function(f, ...)`` inside a :func:`compile_trace` named after
    ``f``, with its ``dump_dir`` keyword as the dump folder."""

    @functools.wraps(function)
    def traced(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        target = args[0] if args else kwargs.get("f")
        dump_dir = kwargs.get("dump_dir")
        with compile_trace(program_name(target), dump_dir if isinstance(dump_dir, (str, os.PathLike)) else None):
            return function(*args, **kwargs)

    return traced


def detailed() -> bool:
    """Whether someone looks at the stages of the current compile (logging
    at INFO, a dump folder, a progress line): then the pipeline runs one
    pass at a time so that each pass is timed and dumped."""
    trace = _CURRENT.get()
    if trace is None:
        return logging_info()
    return trace.dump_folder is not None or trace._progress_timer is not None or trace._showing or logging_info()


__all__ = [
    "LOGGER", "CompileTrace", "StageTime", "compile_trace", "current", "detailed", "dump", "finish",
    "logging_info", "program_name", "stage", "start", "traced_compile",
]
