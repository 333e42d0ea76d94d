"""hloalias: PyTorch programs through StableHLO and XLA at the device-memory
minimum.  One layer per top-level folder, each a subpackage of this one:
:mod:`hloalias` itself (the IR contract, errors, MLIR helpers, this
façade) -> :mod:`hloalias.frontend` (torch -> StableHLO with the signature in
IR) and :mod:`hloalias.passes` -> :mod:`hloalias.pipeline` ->
:mod:`hloalias.runtime` (PJRT) -> :mod:`hloalias.tools` (``hloalias-opt``).

The torch- and jax-facing entry points load on first use, so the passes and
``hloalias-opt`` start without importing torch or jax."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: The release (PEP 440); pyproject.toml reads it from here.
__version__ = "0.1.0"

from hloalias.loading import library_load
from hloalias.errors import (
    CompileError,
    DonatedBufferError,
    DistributedError,
    DonationError,
    ExecutionError,
    HloaliasError,
    IndexRangeError,
    IRError,
    PassError,
    PipelineError,
    ShardingError,
    TorchImportError,
)

_LAZY = {
    "Program": "hloalias.frontend",
    "Stage": "hloalias.frontend",
    "import_torch": "hloalias.frontend",
    "DeviceTensor": "hloalias.runtime",
    "Mesh": "hloalias.runtime",
    "Executable": "hloalias.runtime",
    "cache_stats": "hloalias.runtime",
    "clear_cache": "hloalias.runtime",
    "compile": "hloalias.runtime",
    "to_device": "hloalias.runtime",
    "TrainingStep": "hloalias.runtime",
    "compile_training_step": "hloalias.runtime",
    "Jit": "hloalias.runtime",
    "jit": "hloalias.runtime",
    "compile_stablehlo": "hloalias.runtime.foreign",
    "distributed": "hloalias.runtime",
    "checkpoint": "hloalias.runtime",
}

if TYPE_CHECKING:
    from hloalias.frontend import Program, Stage, import_torch
    from hloalias.runtime import (
        DeviceTensor,
        Executable,
        Mesh,
        cache_stats,
        clear_cache,
        compile,
        to_device,
    )
    from hloalias.runtime import TrainingStep, compile_training_step
    from hloalias.runtime import Jit, jit
    from hloalias.runtime.foreign import compile_stablehlo
    from hloalias.runtime import checkpoint, distributed


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        # Loads torch, jax and the runtime the first time: a Ctrl-C in the
        # middle would leave jaxlib half registered (hloalias/interrupts.py).
        with library_load():
            value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hloalias' has no attribute {name!r}")


__all__ = [
    "CompileError", "DeviceTensor", "DistributedError", "DonatedBufferError", "DonationError", "Executable",
    "ExecutionError", "HloaliasError", "IndexRangeError", "IRError", "Mesh", "PassError", "PipelineError", "Program",
    "ShardingError",
    "Stage", "TorchImportError", "cache_stats", "clear_cache", "compile", "import_torch", "to_device",
    "TrainingStep", "compile_training_step",
    "Jit", "jit", "compile_stablehlo", "__version__", "checkpoint", "distributed",
]
