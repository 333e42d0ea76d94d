"""What importing hloalias loads, checked in fresh processes (behaviour,
not time): ``import hloalias`` loads neither torch nor jax nor torch-mlir;
reaching the entry points (``hloalias.compile``, ``jit``, ``import_torch``)
loads the runtime but not the tracing and import machinery (sympy,
torch-mlir's FX importer and decomposition table, hloalias's
decompositions, dynamo), which the first import of a program loads; a
compile served by the program cache in a fresh process loads none of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

#: Loaded by the first import of a program, not before.
TRACING_MODULES = (
    "sympy",
    "torch_mlir.extras.fx_importer",
    "torch_mlir.extras.fx_decomp_util",
    "hloalias.frontend.decompositions",
    "torch._dynamo",
)

_PROGRAM = """
import torch
class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.arange(4.0))
    def forward(self, x):
        return (x * self.w).sum(0)
"""


def _loaded_after(code: str, cache_dir: Path, watched: tuple[str, ...]) -> dict[str, object]:
    script = textwrap.dedent(code) + textwrap.dedent(
        f"""
        import json, sys
        print(json.dumps({{"loaded": sorted(m for m in {list(watched)!r} if m in sys.modules),
                           "result": globals().get("result")}}))
        """
    )
    env = dict(os.environ, HLOALIAS_CACHE_DIR=str(cache_dir))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_import_hloalias_loads_no_torch_jax_or_mlir(tmp_path: Path) -> None:
    watched = ("torch", "jax", "jaxlib", "torch_mlir", *TRACING_MODULES)
    assert _loaded_after("import hloalias", tmp_path, watched)["loaded"] == []


def test_the_entry_points_load_no_tracing_machinery(tmp_path: Path) -> None:
    code = "import hloalias\nhloalias.compile, hloalias.jit, hloalias.import_torch, hloalias.compile_training_step"
    assert _loaded_after(code, tmp_path, TRACING_MODULES)["loaded"] == []


def test_a_program_cache_hit_in_a_fresh_process_loads_no_tracing_machinery(tmp_path: Path) -> None:
    compile_once = _PROGRAM + textwrap.dedent(
        """
        import hloalias
        from hloalias.runtime import disk_cache
        exe = hloalias.compile(Scale(), (torch.ones(3, 4),))
        result = [exe(torch.ones(3, 4)).tolist(), disk_cache.disk_cache_stats().xla_compiles]
        """
    )
    first = _loaded_after(compile_once, tmp_path, TRACING_MODULES)
    assert first["result"] == [[0.0, 3.0, 6.0, 9.0], 1]
    assert "hloalias.frontend.decompositions" in first["loaded"]  # the first process imported the program
    second = _loaded_after(compile_once, tmp_path, TRACING_MODULES)
    assert second["result"] == [[0.0, 3.0, 6.0, 9.0], 0]  # served from the caches
    assert second["loaded"] == []
