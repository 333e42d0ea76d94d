"""Runtime: compile through PJRT and execute with eager-PyTorch semantics."""

from hloalias._layers import alias_bare_import

alias_bare_import(__name__, "hloalias.runtime")

from hloalias.runtime.executable import (
    CacheStats,
    DeviceTensor,
    Executable,
    cache_stats,
    clear_cache,
    compile,
    to_device,
)
from hloalias.runtime.jit_cache import Jit, JitStats, Lowered, jit
from hloalias.runtime.pjrt import MemoryStats
from hloalias.runtime.sharding import Mesh
from hloalias.runtime.training import TrainingStep, compile_training_step
from hloalias.runtime import checkpoint, distributed

__all__ = [
    "CacheStats", "DeviceTensor", "Executable", "MemoryStats", "Mesh", "TrainingStep", "cache_stats",
    "clear_cache", "compile", "compile_training_step", "to_device",
    "Jit", "JitStats", "Lowered", "jit", "checkpoint", "distributed",
]
