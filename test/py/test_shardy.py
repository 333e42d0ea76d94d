"""Programs on a mesh are partitioned by Shardy: the module XLA gets carries
``sdy.sharding`` over one ``sdy.mesh`` (``hloalias.runtime.shardy``), so
XLA's GSPMD deprecation warning never shows; a module with a sharding the
placement did not write stays with GSPMD."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import hloalias
from hloalias import Mesh
from hloalias.runtime import shardy
from hloalias.runtime.jaxlib_private import xla_client
from hloalias.runtime.pjrt import prepare_for_xla

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not shardy.available(), reason="jaxlib without the Shardy dialect")


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


TENSOR_PARALLEL = {"fc1.weight": ("tp", None), "fc1.bias": ("tp",), "fc2.weight": (None, "tp"), "x": ("dp", None)}


def test_module_for_xla_carries_shardy_annotations() -> None:
    model = MLP().eval()
    x = torch.randn(4, 16)
    exe = hloalias.compile(model, (x,), mesh=Mesh((2, 2), ("dp", "tp")), shardings=TENSOR_PARALLEL)
    torch.testing.assert_close(exe(x), model(x).detach())
    placement = exe._placement
    options = placement.compile_options([False])
    assert options.executable_build_options.use_shardy_partitioner
    text = placement.for_xla(prepare_for_xla(exe.mlir, allow_stored_state=True), options)
    assert options.executable_build_options.use_shardy_partitioner
    assert 'sdy.mesh @mesh = <["dp"=2, "tp"=2]>' in text
    assert "mhlo.sharding" not in text
    for annotation in (
        '#sdy.sharding<@mesh, [{"tp"}, {}]>',  # fc1.weight
        '#sdy.sharding<@mesh, [{"tp"}]>',  # fc1.bias
        '#sdy.sharding<@mesh, [{}, {"tp"}]>',  # fc2.weight
        '#sdy.sharding<@mesh, [{}]>',  # fc2.bias: replicated
        '#sdy.sharding<@mesh, [{"dp"}, {}]>',  # x
    ):
        assert annotation in text


def test_sharding_it_cannot_translate_stays_with_gspmd() -> None:
    text = textwrap.dedent("""\
        module {
          func.func public @main(%arg0: tensor<8xf32> {mhlo.sharding = "{devices=[2]<=[2]}"}) -> tensor<8xf32> {
            %0 = stablehlo.custom_call @Sharding(%arg0) {mhlo.sharding = "{replicated}"} : (tensor<8xf32>) -> tensor<8xf32>
            return %0 : tensor<8xf32>
          }
        }
        """)
    assert shardy.to_shardy(text, [("dp", 2)], {("{devices=[2]<=[2]}", 1): ("dp",)}) is None
    # A sharding the placement did not write: unknown text.
    assert shardy.to_shardy(text.replace("[2]<=[2]", "[2]0,1"), [("dp", 2)], {}) is None
    model = MLP().eval()
    exe = hloalias.compile(model, (torch.randn(4, 16),), mesh=Mesh((2,), ("dp",)), shardings={"x": ("dp", None)})
    options = xla_client.CompileOptions()
    options.executable_build_options.use_shardy_partitioner = True
    assert exe._placement.for_xla(text, options) == text
    assert not options.executable_build_options.use_shardy_partitioner


def test_no_gspmd_deprecation_warning_on_a_mesh(tmp_path: Path) -> None:
    """XLA logs GSPMD's deprecation on stderr, from C++: seen in a process of its own."""
    script = tmp_path / "mesh.py"
    script.write_text(textwrap.dedent("""\
        import torch, hloalias
        model = torch.nn.Linear(16, 8).eval()
        x = torch.randn(4, 16)
        exe = hloalias.compile(model, (x,), mesh=hloalias.Mesh((2,), ("dp",)), shardings={0: ("dp", None)})
        torch.testing.assert_close(exe(x), model(x).detach())
        print("ran")
        """))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", HLOALIAS_CACHE="0")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert run.returncode == 0 and "ran" in run.stdout, run.stderr[-3000:]
    assert "GSPMD" not in run.stderr
