"""Exception types of the public API.  Every error hloalias raises on bad
input is a subclass of :class:`HloaliasError` and names its culprit."""

from __future__ import annotations


class HloaliasError(Exception):
    """Base of every error hloalias raises for bad input or a failed stage."""


class TorchImportError(HloaliasError):
    """Turning a torch program into StableHLO failed (unsupported op, dynamic
    shape, non-tensor input).  ``repro_path`` is set when a repro was written."""

    def __init__(self, message: str, repro_path: str | None = None) -> None:
        super().__init__(message)
        self.repro_path = repro_path


class IRError(HloaliasError):
    """A module is malformed or breaks the IR contract of
    :mod:`hloalias.attributes` (message carries ``file:line:col`` when known)."""


class PassError(IRError):
    """A pass rejected its input or its options."""


class PipelineError(HloaliasError):
    """A textual pass pipeline could not be parsed or names an unknown pass."""


class DonationError(HloaliasError):
    """A donation request is invalid: unknown name, donated twice."""


class DonatedBufferError(HloaliasError):
    """A device array that was donated (consumed) was used again."""


class CompileError(HloaliasError):
    """XLA rejected the module.  ``repro_path`` holds the module that failed."""

    def __init__(self, message: str, repro_path: str | None = None) -> None:
        super().__init__(message)
        self.repro_path = repro_path


class ExecutionError(HloaliasError):
    """Running a compiled program failed, or its inputs do not match."""


class IndexRangeError(ExecutionError, IndexError):
    """An input holds an index out of the range eager PyTorch accepts where
    the program uses it (``nn.Embedding`` given a token id >= its vocabulary,
    ``index_select`` a negative index): eager raises an IndexError there,
    and XLA would clamp or drop the index.  Raised before anything runs;
    the message names the input, the value, its position, the op and the
    source line."""


class ShardingError(HloaliasError):
    """A mesh or partition spec is invalid: unknown axis or tensor, a
    dimension not divisible by its axes, a mesh larger than the devices."""


class DistributedError(HloaliasError):
    """Several processes could not run one program together: the distributed
    runtime is initialized twice or too late, its settings are missing, or
    the processes compiled different programs."""
