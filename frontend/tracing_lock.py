"""One lock for torch's tracing machinery, held by every hloalias stage
that traces a torch program.

Contract: :data:`TRACING_LOCK` is a process-wide re-entrant lock; code that
runs ``torch.export``, ``run_decompositions`` or ``make_fx`` holds it for
the whole trace.  torch keeps tracing state in module globals and
thread-unsafe mode stacks (``_EXPORT_MODULE_HIERARCHY``, the proxy and
fake dispatch-mode slots): two threads exporting at once fail with
"_EXPORT_MODULE_HIERARCHY must not be None", "ProxyTorchDispatchMode slot
already occupied" or "Trying to pop empty mode stack".  Serializing the
trace is enough: the XLA compile that follows runs outside the lock, in
parallel.  Re-entrant because one traced stage may call another (a
training step's capture exports its step graph)."""

from __future__ import annotations

import threading

TRACING_LOCK = threading.RLock()
