"""The libraries the first trace of a program loads, loaded up front with
Ctrl-C held back and outside inference mode (:func:`hloalias.loading.library_load`).

``torch.export``, ``make_fx`` and torch-mlir's FX importer load about a
thousand modules on their first use (dynamo, functorch, sympy, torch-mlir's
native bindings).  An interrupt in the middle of those loads leaves them
half initialized and breaks every later trace in the process; loading them
here first, in one deferred block, means a Ctrl-C during the first compile
interrupts the trace itself, which is safe to redo.  Loaded once, when a
stage first enters :func:`hloalias.frontend.tracing_lock.tracing` (every
trace does), not on ``import hloalias`` or a cache hit."""

from __future__ import annotations

import functools
import importlib

from hloalias.loading import library_load

#: Loaded before the first trace.  Each pulls in the rest of its package's
#: tracing machinery.
TRACING_MODULES = (
    "sympy",
    "torch._dynamo",
    "torch._functorch.aot_autograd",
    "torch.export._trace",
    "torch.fx.experimental.proxy_tensor",
    "torch_mlir.extras.fx_importer",
    "torch_mlir.extras.fx_decomp_util",
)


@functools.cache
def load_tracing_modules() -> None:
    """Import :data:`TRACING_MODULES` (once per process), Ctrl-C held back
    until they are all loaded."""
    with library_load():
        for name in TRACING_MODULES:
            importlib.import_module(name)
