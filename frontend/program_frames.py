"""Which frame is the traced program's own line: the one predicate every
error message that names a line of the program uses.

An error raised while torch traces a program (``torch.export``, the
training step's ``make_fx``) carries a traceback that runs through torch,
hloalias, the caller's function and, for a library model, the library's
code.  The line an error message should name is the innermost frame that
is neither torch's nor hloalias's: for a `transformers` model that is the
model's own line (``modeling_wav2vec2.py: if labels.max() >= ...``), not
the caller's ``loss = model(**batch).loss``, which names nothing the caller
could change.  When the two differ, messages name both.

Contract: a *program frame* is one whose file :func:`is_program_file`
accepts: a real file (not ``<string>``, ``<frozen ...>`` or generated
code) outside torch's and the loaded hloalias packages' folders and
outside Python's standard library (whose ``site-packages`` holds
programs: installed libraries' models are program frames).  Every lookup
here applies it, whatever the frames' source:

- a traceback: :func:`program_frames` returns ``(innermost, caller)``,
  ``innermost`` the innermost program frame and ``caller`` the outermost
  one when it is a different one (None otherwise); both are None when
  the traceback holds no program frame (:func:`where_raised` words it);
- the current stack: :func:`innermost_on_stack` (a random draw's line,
  an ``unfold`` whose windows a later write would lose);
- an FX node's recorded ``stack_trace``: :func:`innermost_in_stack_trace`
  (the line of a graph operator a message refuses);
- the stack torch recorded where it made a data-dependent size (the
  ``u0`` of ``x[mask]``, ``nonzero()``): :func:`data_dependent_size_origin`,
  for an error raised later, where torch had to decide something about
  that size (often in autograd's backward, under ``loss.backward()``).

Each is described as ``FILE:LINE in FUNCTION: CODE``.
"""
from __future__ import annotations

import os
import re
import sys
import traceback
from types import TracebackType

import torch

_HLOALIAS_PACKAGES = (
    "hloalias", "hloalias.frontend", "hloalias.passes", "hloalias.pipeline", "hloalias.runtime", "hloalias.tools",
)


def library_roots() -> tuple[str, ...]:
    """The folders whose frames are never the program's: torch's and each
    loaded hloalias package's (a clone holds them side by side at its top
    level, an install inside ``hloalias/``)."""
    roots = [os.path.dirname(os.path.abspath(torch.__file__))]
    for name in _HLOALIAS_PACKAGES:
        module = sys.modules.get(name)
        for path in getattr(module, "__path__", ()) or ():
            roots.append(os.path.abspath(path))
    return tuple(root + os.sep for root in roots)


#: Python's standard library (its ``site-packages`` excepted): contextlib,
#: functools and the like run between program frames but are none.
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep
_INSTALLED = ("site-packages", "dist-packages")


def is_program_file(path: str) -> bool:
    """True for a file of the traced program (the caller's or a library's
    model code), False for torch, hloalias, the standard library and
    generated code (the module docstring's contract)."""
    if not path or path.startswith("<"):
        return False
    path = os.path.abspath(path)
    if path.startswith(library_roots()):
        return False
    if path.startswith(_STDLIB):
        return any(part in _INSTALLED for part in path[len(_STDLIB):].split(os.sep))
    return True


def describe_frame(frame: traceback.FrameSummary) -> str:
    return f"{frame.filename}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"


def program_frames(tb: TracebackType | None) -> tuple[str | None, str | None]:
    """``(innermost, caller)`` program frames of ``tb``, described."""
    frames = [frame for frame in traceback.extract_tb(tb) if is_program_file(frame.filename)]
    if not frames:
        return None, None
    innermost, outermost = frames[-1], frames[0]
    caller = describe_frame(outermost) if outermost is not innermost else None
    return describe_frame(innermost), caller


def innermost_on_stack() -> str | None:
    """The innermost program frame of the current stack, described (the
    line running now, e.g. a random draw's), or None."""
    for frame in reversed(traceback.extract_stack()):
        if is_program_file(frame.filename):
            return describe_frame(frame)
    return None


def where_raised(error: BaseException) -> str:
    """`` at FILE:LINE in FUNCTION: CODE (called from ...)`` for the
    program's line that ``error`` was raised under; empty when none is on
    its traceback."""
    innermost, caller = program_frames(error.__traceback__)
    if innermost is None:
        return ""
    return f" at {innermost}" + (f" (called from {caller})" if caller else "")


_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def innermost_in_stack_trace(stack_trace: str) -> str | None:
    """The innermost program frame of an FX node's ``stack_trace`` (the
    text ``traceback.format_list`` writes), described; None when it has none."""
    frames = [
        traceback.FrameSummary(file, int(line), function, line=code)
        for file, line, function, code in _FRAME_RE.findall(stack_trace)
        if is_program_file(file)
    ]
    return describe_frame(frames[-1]) if frames else None


def data_dependent_size_origin(error: BaseException) -> str | None:
    """For torch's failure to decide a condition on a data-dependent size
    (``GuardOnDataDependentSymNode``): the program line that made the
    size, described as ``SYMBOL at FILE:LINE in FUNCTION: CODE``; None
    for other errors, or when no program frame made it.

    The error names only the condition (``Ne(u0, 1)``); torch's shape
    environment, a local of a frame on the error's traceback, recorded
    the stack of each size it made (``var_to_stack``)."""
    cond = getattr(error, "cond", None)
    symbolic_shapes = sys.modules.get("torch.fx.experimental.symbolic_shapes")
    if cond is None or symbolic_shapes is None or not isinstance(error, symbolic_shapes.GuardOnDataDependentSymNode):
        return None
    shape_env = None
    tb = error.__traceback__
    while tb is not None and shape_env is None:
        shape_env = next(
            (value for value in list(tb.tb_frame.f_locals.values()) if isinstance(value, symbolic_shapes.ShapeEnv)),
            None,
        )
        tb = tb.tb_next
    if shape_env is None:
        return None
    for symbol in sorted(getattr(cond, "free_symbols", ()), key=str):
        # A value read as a number (``labels.max() >= 4``) is an unbacked
        # symbol too, but not a size: its own line is where it is used.
        if symbol not in shape_env.size_like:
            continue
        stack = shape_env.var_to_stack.get(symbol)
        if stack is None:
            continue
        frames = [frame for frame in stack.summary() if is_program_file(frame.filename)]
        if frames:
            return f"{symbol} at {describe_frame(frames[-1])}"
    return None
