"""Same-window A/B of ``hloalias.checkpoint.save`` over an existing
checkpoint: this tree's (staged in a sibling directory, swapped into place,
the earlier one removed) against main's (files replaced in place), loaded
from ``git show main:runtime/checkpoint.py``.

    python bench/checkpoint_save_ab.py [--saves 30] [--rounds 3] [--width 256]

The program: a Linear(width, width) and a (width, width) buffer (two
width^2 float32 tensors, ~0.5 MiB at 256).  Each round times ``--saves``
saves into one directory with each implementation, alternating, in
process CPU time (all threads) and wall time per save.  Prints one JSON
line per round and implementation."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

import hloalias
from hloalias.runtime import checkpoint


class _Model(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.register_buffer("total", torch.zeros(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(self.lin(x))
        return self.total * 1


def _main_checkpoint(work: str) -> object:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = subprocess.run(
        ["git", "-C", root, "show", "main:runtime/checkpoint.py"], capture_output=True, text=True, check=True
    ).stdout
    path = os.path.join(work, "checkpoint_main.py")
    with open(path, "w") as handle:
        handle.write(source)
    spec = importlib.util.spec_from_file_location("checkpoint_main", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--saves", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        old = _main_checkpoint(work)
        exe = hloalias.compile(_Model(options.width), (torch.ones(options.width, options.width),))
        exe(torch.ones(options.width, options.width))
        sides = {"main": old, "staged": checkpoint}
        for name, module in sides.items():  # each directory holds a checkpoint first
            module.save(exe, os.path.join(work, name))  # type: ignore[attr-defined]
        for round_index in range(options.rounds):
            for name, module in sides.items():
                target = os.path.join(work, name)
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(options.saves):
                    module.save(exe, target)  # type: ignore[attr-defined]
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                print(json.dumps({
                    "round": round_index, "save": name, "width": options.width,
                    "cpu_us_per_save": round(cpu / options.saves * 1e6),
                    "wall_us_per_save": round(wall / options.saves * 1e6),
                }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
