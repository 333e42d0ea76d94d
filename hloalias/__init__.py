"""hloalias: PyTorch programs through StableHLO and XLA at the device-memory
minimum.  Layout follows the architecture: :mod:`hloalias.importer` (torch ->
StableHLO with the signature in IR) -> :mod:`hloalias.passes` ->
:mod:`hloalias.pipeline` -> :mod:`hloalias.runtime` (PJRT)."""

from hloalias.errors import (
    CompileError,
    DonatedBufferError,
    DonationError,
    ExecutionError,
    HloaliasError,
    IRError,
    PassError,
    PipelineError,
    TorchImportError,
)
from hloalias.importer import Program, Stage, import_torch
from hloalias.runtime import (
    DeviceTensor,
    Executable,
    cache_stats,
    clear_cache,
    compile,
    to_device,
)

__all__ = [
    "CompileError", "DeviceTensor", "DonatedBufferError", "DonationError", "Executable",
    "ExecutionError", "HloaliasError", "IRError", "PassError", "PipelineError", "Program",
    "Stage", "TorchImportError", "cache_stats", "clear_cache", "compile", "import_torch", "to_device",
]
