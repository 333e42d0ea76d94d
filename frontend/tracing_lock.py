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
oldest generation, and the full collection the interpreter's thresholds
call for runs after the trace, scanning everything.  Two things keep that
true, without which cyclic garbage (a dropped program's MLIR context held
by a cycle, ~1 MiB each) piled up for good over repeated compiles
(``bench/RESULTS-runtime.md``, "Host memory over many compiles"):

- the young generations are collected (``gc.collect(1)``, tens of
  microseconds) just before freezing, so their survivors enter the oldest
  generation through a collection, which counts them towards the next full
  one; frozen young objects would enter it at the unfreeze uncounted, and
  in a loop of compiles every compile's garbage is young when the next
  trace starts;
- no full collection runs while frozen: the oldest generation's threshold
  is raised for the trace and restored after it (unless someone set
  another meanwhile).  One that ran then would scan only the unfrozen
  objects and reset the interpreter's count of objects awaiting a full
  collection, so the frozen garbage would wait for the next, which (traces
  being where compiles allocate) landed in a trace again.

A process that turned the collector off, or froze objects itself, is left
as it is.

After the outermost trace, torch's fake-tensor dispatch cache
(``FakeTensorMode.cache``, one entry per op and input metadata, kept for
the process) is emptied when it holds more than
``HLOALIAS_FAKE_CACHE_ENTRIES`` entries: every new input shape adds
entries and torch never drops one.  Emptied, later traces fill it again
(a trace's own repeated ops still hit it)."""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Iterator

from hloalias import config
from hloalias.frontend.tracing_modules import load_tracing_modules

TRACING_LOCK = threading.RLock()

#: Traces entered and not yet left (changed only by the lock's holder),
#: whether the outermost one froze the collector's generations, and the
#: thresholds it replaced (None: it changed none).
_depth = 0
_frozen = False
_thresholds: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None

#: The oldest generation's threshold while frozen: a full collection runs
#: when it is exceeded by the count of middle-generation collections since
#: the last one, which no trace reaches.
_NO_FULL_COLLECTION = 1 << 30


def _freeze() -> None:
    global _frozen, _thresholds
    gc.collect(1)  # young survivors enter the oldest generation counted (docstring)
    before = gc.get_threshold()
    if before[0] > 0:  # 0 turns automatic collection off: nothing to hold back
        _thresholds = (before, (before[0], before[1], _NO_FULL_COLLECTION))
        gc.set_threshold(*_thresholds[1])
    _frozen = True  # no Ctrl-C lands between this and the call's end
    gc.freeze()


def _unfreeze() -> None:
    """Undo what :func:`_freeze` did, all or part of it (an interrupted
    one); a threshold someone else set meanwhile stays."""
    global _frozen, _thresholds
    # Each flag is cleared only once its undoing is done: a Ctrl-C can land
    # after any call returns, and the next trace redoes what is left.
    thresholds = _thresholds
    if thresholds is not None:
        if gc.get_threshold() == thresholds[1]:
            gc.set_threshold(*thresholds[0])
        _thresholds = None
    if _frozen:
        _frozen = False  # no Ctrl-C lands between this and the call's end
        gc.unfreeze()


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """Hold :data:`TRACING_LOCK` with the pre-existing objects frozen
    (module docstring), the tracing libraries loaded first; re-entrant.
    A Ctrl-C inside the outermost trace's own clean-up can leave part of
    it undone; the next outermost trace finishes it first."""
    global _depth
    load_tracing_modules()  # once per process, Ctrl-C held back (tracing_modules.py)
    with TRACING_LOCK:
        _depth += 1
        try:
            if _depth == 1:
                if _frozen or _thresholds is not None:
                    _unfreeze()  # left by an interrupted clean-up
                # A process that froze objects itself (pre-fork servers do)
                # or turned the collector off keeps its own arrangement.
                if gc.isenabled() and gc.get_freeze_count() == 0:
                    _freeze()
            yield
        finally:
            _depth -= 1
            if _depth == 0:
                _unfreeze()
                _bound_fake_cache()


def _bound_fake_cache() -> None:
    fake_tensor = sys.modules.get("torch._subclasses.fake_tensor")
    if fake_tensor is None:
        return
    bound = config.integer("HLOALIAS_FAKE_CACHE_ENTRIES") or 0
    if bound > 0 and len(fake_tensor.FakeTensorMode.cache) > bound:
        fake_tensor.FakeTensorMode.cache_clear()
