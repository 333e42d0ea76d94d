"""Ctrl-C held back while a library loads.

A ``KeyboardInterrupt`` that lands inside an import leaves the package half
initialized: Python drops the failed module from ``sys.modules`` but keeps
every submodule it had already loaded, and importing it again re-runs the
package over them.  For jax that re-runs jaxlib's native module
registration, which crashes the process (a segmentation fault on the next
``hloalias.compile``, seen after a Ctrl-C during the first compile).

:func:`deferred` holds SIGINT back for the duration of such a load: a Ctrl-C
that arrives meanwhile is raised as ``KeyboardInterrupt`` as soon as the
load is complete, so the interrupt is kept and nothing is left half loaded.
It applies in the main thread (the only one Python delivers signals to)
where SIGINT has Python's default handler; a handler the user installed is
left alone, and so is every other thread."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

_DEPTH = [0]


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Run the body with SIGINT held back (see the module docstring);
    nested uses hold it until the outermost one ends."""
    if (
        _DEPTH[0]
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        pending.append(signum)

    signal.signal(signal.SIGINT, hold)
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if pending:
        raise KeyboardInterrupt
