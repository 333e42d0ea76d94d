"""A Ctrl-C during the loads of a process's first compile (jax with the
runtime, dynamo/functorch/torch-mlir with the first trace) is raised once
the load is complete, and the next compile works (hloalias/interrupts.py,
frontend/tracing_modules.py).  Before, the interrupt left the library half
initialized: every later compile failed ("partially initialized module
'jax'", "module 'torch._dynamo' has no attribute 'utils'") or the process
crashed (a segmentation fault re-registering jaxlib).  Deterministic: an import hook sends the SIGINT when the named
module starts to load, in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent(
    """
    import importlib.abc, os, signal, sys
    import torch
    import hloalias

    class Trip(importlib.abc.MetaPathFinder):
        fired = False
        def find_spec(self, name, path, target=None):
            if name == TARGET and not Trip.fired:
                Trip.fired = True
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered in this import
            return None

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(3))
        def forward(self, x):
            self.count.add_(x)
            return self.count * 2

    x = torch.ones(3)
    if TARGET.startswith("torch"):  # the runtime loaded first: the trip is in the first trace
        hloalias.compile
    sys.meta_path.insert(0, Trip())
    module = Counter()
    try:
        hloalias.compile(module, (x,))
    except KeyboardInterrupt:
        print("INTERRUPTED", Trip.fired)
    exe = hloalias.compile(module, (x,))
    assert exe(x).tolist() == [2.0, 2.0, 2.0] and exe(x).tolist() == [4.0, 4.0, 4.0]
    print("SECOND COMPILE OK")
    """
)


@pytest.mark.parametrize("target", ["jax._src.config", "torch._dynamo.eval_frame"])
def test_ctrl_c_while_the_first_compile_loads_a_library_keeps_the_process_usable(target: str) -> None:
    code = _CHILD.replace("TARGET", repr(target))
    done = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, HLOALIAS_CACHE="0"), capture_output=True, text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "INTERRUPTED True" in done.stdout
    assert "SECOND COMPILE OK" in done.stdout
