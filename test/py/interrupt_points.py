"""A Ctrl-C at every point of chosen files where Python can deliver one
(a test helper).

Python runs a signal's handler (the default SIGINT one raises
``KeyboardInterrupt``) only where its interpreter checks for pending
signals: on CPython 3.11, a function's entry (``RESUME``), a loop's
backward jump (``JUMP_BACKWARD``) and the return of a call (``CALL``,
``CALL_FUNCTION_EX``) -- never between, say, a ``with`` statement's
``__enter__`` and the start of its body.  :class:`InterruptAt` stands
for a Ctrl-C at the ``at``-th such point run in the watched files
(``sys.settrace`` with opcode events): it calls the SIGINT handler
installed at that moment, as Python would, so a region that holds SIGINT
back (``hloalias.interrupts.deferred``) keeps it pending and raises it
when it ends, as it would a real one.  Frames of other files are not
traced: an interrupt inside one of their calls surfaces at the return of
the call in a watched frame, which is swept.

An interrupt at a call's return is raised, by CPython, as part of the call:
its handler is the one of the call's own code units (the ``with`` body's
cleanup for ``with lock: return f()``).  A trace function can raise only
at the next instruction, whose handler can differ (there, the ``with``'s
exit code, which would skip ``__exit__``: a lock CPython releases would
stay held).  Such a point is left out (not counted): the interrupt in the
callee's last point before it and after the next call are swept.

:func:`sweep` runs a piece of code once per point, the k-th run
interrupted at its k-th point, until a run ends with no interrupt."""

from __future__ import annotations

import dis
import gc
import signal
import sys
from collections.abc import Callable, Collection
from types import CodeType, FrameType
from typing import Any, TypeVar

T = TypeVar("T")


#: Where CPython 3.11 checks for pending signals: before these ...
_CHECKED_AT = frozenset({"RESUME", "JUMP_BACKWARD"})
#: ... and right after these.
_CHECKED_AFTER = frozenset({"CALL", "CALL_FUNCTION_EX"})


class InterruptAt:
    """A trace function that delivers one SIGINT at the ``at``-th point
    (module docstring) run in ``files`` (their ``co_filename``s);
    ``fired`` names where: the function, the line, the next instruction."""

    def __init__(self, at: int, files: Collection[str]) -> None:
        self.at = at
        self.files = files
        self.seen = 0
        self.fired: tuple[str, int, str] | None = None
        self._after_call: set[int] = set()  # frames whose last instruction was a call

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.fired is not None or frame.f_code.co_filename not in self.files:
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.fired is not None:
            return None
        if event != "opcode":
            if event in ("return", "exception"):
                self._after_call.discard(id(frame))
            return self._local
        op = dis.opname[frame.f_code.co_code[frame.f_lasti]]
        key = id(frame)
        checked = op in _CHECKED_AT or key in self._after_call
        after_call = key in self._after_call
        if op in _CHECKED_AFTER:
            self._after_call.add(key)
        else:
            self._after_call.discard(key)
        if after_call and op not in _CHECKED_AT and _handler_differs(frame.f_code, frame.f_lasti):
            checked = False  # raised by CPython within the call's handler: not one a tracer can deliver
        if not checked:
            return self._local
        if self.seen == self.at:
            self.fired = (frame.f_code.co_qualname, frame.f_lineno or 0, op)
            handler = signal.getsignal(signal.SIGINT)
            if callable(handler):
                handler(signal.SIGINT, frame)  # raises, or (held back) returns
            return None
        self.seen += 1
        return self._local


_HANDLERS: dict[CodeType, list[Any]] = {}


def _handler_at(code: CodeType, offset: int) -> int | None:
    table = _HANDLERS.get(code)
    if table is None:
        table = _HANDLERS[code] = dis._parse_exception_table(code)  # type: ignore[attr-defined]
    for entry in table:
        if entry.start <= offset < entry.end:
            return int(entry.target)
    return None


def _handler_differs(code: CodeType, offset: int) -> bool:
    """Whether the instruction at ``offset``, right after a call, has
    another exception handler than the call's last code unit (where
    CPython raises an interrupt checked at the call's return)."""
    return _handler_at(code, offset - 2) != _handler_at(code, offset)


def sweep(
    prepare: Callable[[], T], run: Callable[[T], Any], check: Callable[[T, tuple[str, int, str] | None], None],
    files: Collection[str], limit: int = 100_000,
) -> list[tuple[str, int, str]]:
    """For k = 0, 1, ...: ``prepare()`` (not interrupted), then ``run`` on
    its result with a Ctrl-C at the k-th point in ``files``, then
    ``check(prepared, where)`` (``where``: the point, None when the run
    ended first), until a run ends with no interrupt.  The garbage
    collector is off meanwhile, so its callbacks never shift the points.
    Returns the points where an interrupt fired."""
    points: list[tuple[str, int, str]] = []
    enabled = gc.isenabled()
    try:
        for at in range(limit):
            gc.disable()
            prepared = prepare()
            hook = InterruptAt(at, files)
            previous = sys.gettrace()
            sys.settrace(hook)
            try:
                run(prepared)
            except KeyboardInterrupt:
                if hook.fired is None:
                    raise
            finally:
                sys.settrace(previous)
            check(prepared, hook.fired)
            if hook.fired is None:
                return points
            points.append(hook.fired)
    finally:
        if enabled:
            gc.enable()
    raise AssertionError(f"a run of more than {limit} points in {sorted(files)}")
