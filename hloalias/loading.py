"""How hloalias loads its libraries late (jax, its runtime, torch's tracing
machinery): :func:`library_load` wraps every such load.

- Ctrl-C is held back until the load is complete
  (:func:`hloalias.interrupts.deferred`): an interrupted import leaves a
  library half initialized for the rest of the process.
- The load runs outside ``torch.inference_mode()``: the first compile may
  happen inside it, and a tensor a module makes at import (a sentinel, a
  constant table) would otherwise be an inference tensor for the rest of
  the process: it has no version counter, and torch refuses to use it in
  autograd or to write it in place outside inference mode."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from hloalias.interrupts import deferred


@contextlib.contextmanager
def library_load() -> Iterator[None]:
    """Run the body as a load (see the module docstring)."""
    torch = sys.modules.get("torch")  # not loaded yet: inference mode cannot be on
    with deferred(), (torch.inference_mode(False) if torch is not None else contextlib.nullcontext()):
        yield
