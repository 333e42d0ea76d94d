"""One lock for torch's tracing machinery, held by every hloalias stage
that traces a torch program, with the objects that existed before the
trace kept out of the garbage collector's scans while it is held.

Contract: :data:`TRACING_LOCK` is a process-wide re-entrant lock; code that
runs ``torch.export``, ``run_decompositions`` or ``make_fx`` holds it for
the whole trace, through :func:`tracing`.  torch keeps tracing state in
module globals and thread-unsafe mode stacks (``_EXPORT_MODULE_HIERARCHY``,
the proxy and fake dispatch-mode slots): two threads exporting at once fail
with "_EXPORT_MODULE_HIERARCHY must not be None", "ProxyTorchDispatchMode
slot already occupied" or "Trying to pop empty mode stack".  Serializing
the trace is enough: the XLA compile that follows runs outside the lock, in
parallel.  Re-entrant because one traced stage may call another (a
training step's capture exports its step graph).

:func:`tracing` also freezes the collector's generations for the
outermost trace (``gc.freeze()``) and unfreezes them after it
(``gc.unfreeze()``), when the collector is on.  After importing torch, jax
and torch-mlir a process tracks ~440,000 objects, and a trace allocates
enough to trigger a full collection, which scans all of them (0.2-0.7 s,
``bench/latency_notes.md``).  While frozen, a collection scans only the
objects made during the trace; their garbage is still collected (young
collections run as usual).  Unfreezing puts every object back into the
oldest generation, so nothing is kept alive longer than one later full
collection would; that collection runs when the interpreter's thresholds
call for it, outside the trace.  A process that turned the collector off,
or froze objects itself, is left as it is."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

from hloalias.frontend.tracing_modules import load_tracing_modules

TRACING_LOCK = threading.RLock()

#: Traces entered and not yet left (changed only by the lock's holder), and
#: whether the outermost one froze the collector's generations.
_depth = 0
_frozen = False


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """Hold :data:`TRACING_LOCK` with the pre-existing objects frozen
    (module docstring), the tracing libraries loaded first; re-entrant."""
    global _depth, _frozen
    load_tracing_modules()  # once per process, Ctrl-C held back (tracing_modules.py)
    with TRACING_LOCK:
        # A process that froze objects itself (pre-fork servers do) or
        # turned the collector off keeps its own arrangement.
        if _depth == 0 and gc.isenabled() and gc.get_freeze_count() == 0:
            gc.freeze()
            _frozen = True
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            if _depth == 0 and _frozen:
                _frozen = False
                gc.unfreeze()
