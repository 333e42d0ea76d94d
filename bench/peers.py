"""Peers in the benchmark: torch_xla and torchax, each measured by
:mod:`bench.peer_measure` in its own subprocess and virtualenv (they need
torch 2.9; this project pins torch 2.13), and ``jax.jit`` of each
workload's hand-written JAX program, measured the same way in hloalias's
own environment (the same jax).  Environments are built outside
the repository by ``bench/peers_setup.sh`` (default ``/work/peers``,
``HLOALIAS_PEERS_DIR`` to move it).  A peer whose environment is missing,
or whose run fails, is reported as not measured with the reason; never as
a zero.

Each (peer, variant, workload) runs in a fresh process, so a first call
there is that system's first compile in the process (imports excluded)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class PeerSystem:
    """One column: a peer and the variant of its API measured."""

    peer: str  # "jax" | "torchax" | "torch_xla"
    variant: str
    label: str
    note: str


SYSTEMS = (
    PeerSystem("jax", "jit", "`jax.jit` (hand-written)",
               "the workload's hand-written JAX function under `jax.jit` with its donations, "
               "run in hloalias's own environment (same jax)"),
    PeerSystem("torch_xla", "lazy", "torch_xla 2.9 (lazy tensors)",
               "module and inputs on the XLA device, `torch_xla.sync()` per call (PJRT_DEVICE=CPU)"),
    PeerSystem("torchax", "documented", "torchax `compile` (documented)",
               "`torchax.compile(module, CompileOptions(jax_jit_kwargs={'donate_argnums': ...}))`: "
               "drops in-place updates of parameters, buffers and mutated inputs"),
    PeerSystem("torchax", "functional", "torchax functional",
               "`JittableModule.functional_call` wrapped to return, donate and write back what it mutated"),
)


@dataclasses.dataclass
class PeerResult:
    """One peer measurement, or why there is none (``error``)."""

    system: PeerSystem
    workload: str
    data: dict[str, Any] | None
    error: str | None = None

    @property
    def measured(self) -> bool:
        """True when the peer ran and returned figures."""
        return self.data is not None


def peers_dir() -> str:
    """Where ``bench/peers_setup.sh`` builds the peer environments."""
    return os.environ.get("HLOALIAS_PEERS_DIR", "/work/peers")


def peer_python(peer: str) -> str | None:
    """The peer environment's python, or None when it is not built."""
    venv = os.path.join(peers_dir(), f"{peer}-venv")
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python) and os.path.exists(os.path.join(venv, ".complete")):
        return python
    return None


def measure(system: PeerSystem, workload: str, calls: int = 20, timeout: int = 900,
            gpt2_layers: int = 12) -> PeerResult:
    """Run :mod:`bench.peer_measure` for ``system`` on ``workload`` in the
    peer's environment; parse its ``PEER-RESULT`` line."""
    python = sys.executable if system.peer == "jax" else peer_python(system.peer)
    if python is None:
        return PeerResult(system, workload, None,
                          f"not measured: no environment at {peers_dir()}/{system.peer}-venv "
                          "(run bench/peers_setup.sh)")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HLOALIAS_", "PYTHON"))}
    env["PYTHONPATH"] = REPO
    with tempfile.TemporaryDirectory(prefix="hloalias-peer-dump-") as dump:
        if system.peer == "torch_xla":
            env["PJRT_DEVICE"] = "CPU"
            env["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
            env["HLOALIAS_PEER_DUMP"] = dump
        command = [python, "-m", "bench.peer_measure", system.peer, workload,
                   "--variant", system.variant, "--calls", str(calls), "--gpt2-layers", str(gpt2_layers)]
        try:
            done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return PeerResult(system, workload, None, f"not measured: timed out after {timeout} s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("PEER-RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return PeerResult(system, workload, None, f"not measured: run failed ({tail[:200]})")
    return PeerResult(system, workload, json.loads(lines[-1][len("PEER-RESULT "):]))


def measure_all(workloads: list[str], calls: int = 20, log: Any = None, gpt2_layers: int = 12) -> list[PeerResult]:
    """Every peer system on every workload (not-built peers once, as errors)."""
    results = []
    for system in SYSTEMS:
        for workload in workloads:
            if log is not None:
                log(f"peer {system.label}: {workload}")
            results.append(measure(system, workload, calls, gpt2_layers=gpt2_layers))
    return results


if __name__ == "__main__":
    for result in measure_all(sys.argv[1].split(",") if len(sys.argv) > 1 else ["seed"]):
        print(result.system.label, result.workload, result.data or result.error)
