"""What the runtime makes for a call (the random key of a program with
random ops, a mesh input's host copy) reaches PJRT as a copy PJRT owns,
never as a DLPack import (runtime/ownership.py, ``host_copy``).

Such an import dies with the call.  PJRT's worker can still hold it when
the call returns (it finishes the execution a moment after the results
are ready), and then the worker drops the last reference: torch's deleter
runs there and takes the GIL, which aborts a process already finalizing
after its last call ("terminate called without an active exception",
exit code -6; bench/RESULTS-runtime.md).  Before the fix every call of a
program with random ops imported its key so, on every path, and every
call on a mesh imported a private copy of each input.

The checks do not depend on timing: they count the DLPack exports and
imports the calls make (a caller's tensor, imported on the first call and
reused while it is the same tensor, is the only one allowed), and the
native lane's fallbacks.  The child process at the end ends right after
such calls and must exit 0 (on the old code that was a race; here it is a
smoke check that nothing else aborts at exit)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import jax
import pytest
import torch

import hloalias
from hloalias import Mesh
from hloalias.runtime import ownership
from hloalias.runtime import plan as plan_module

CALLS = 5


@pytest.fixture(params=["native", "python"])
def call_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both call paths (``HLOALIAS_NATIVE`` is read when an executable is made)."""
    if request.param == "python":
        monkeypatch.setenv("HLOALIAS_NATIVE", "0")
    yield str(request.param)


class _Exports:
    """Counts every DLPack crossing from torch to PJRT: torch's C-level
    export (the zero-copy imports) and ``jax.dlpack.from_dlpack`` (owned
    uploads' source imports, and the old mesh placement's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        export = ownership._torch_to_dlpack
        from_dlpack = jax.dlpack.from_dlpack

        def counted_export(tensor: torch.Tensor) -> Any:
            self.count += 1
            return export(tensor)

        def counted_from_dlpack(value: Any, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return from_dlpack(value, *args, **kwargs)

        monkeypatch.setattr(ownership, "_torch_to_dlpack", counted_export)
        monkeypatch.setattr(jax.dlpack, "from_dlpack", counted_from_dlpack)


def _after_first_call(monkeypatch: pytest.MonkeyPatch, call: Callable[[], Any]) -> int:
    """DLPack crossings of ``CALLS`` calls after a first one (which imports
    the caller's tensors, kept while they are the same tensors)."""
    call()
    exports = _Exports(monkeypatch)
    for _ in range(CALLS):
        call()
    return exports.count


def _dropout(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True) + torch.randn(x.shape)


def test_the_key_is_no_import_on_either_call_path(call_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.ones(16, 16)
    exe = hloalias.compile(_dropout, (x,))
    assert exe._rng_key is not None
    assert (exe._lane is not None) == (call_path == "native"), exe._python_only_reason
    assert _after_first_call(monkeypatch, lambda: exe(x)) == 0
    if exe._lane is not None:
        # The lane takes the key as it is: no call of these left to the Python path.
        assert exe._lane.counts == {"calls": 1 + CALLS, "fallbacks": 0, "finished_in_python": 0}
    torch.manual_seed(4)
    first = exe(x)
    torch.manual_seed(4)
    assert torch.equal(exe(x), first)


def test_the_key_is_no_import_through_jit_and_dynamo(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.ones(16, 16)
    jitted = hloalias.jit(_dropout)
    assert _after_first_call(monkeypatch, lambda: jitted(x)) == 0
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5)).train()
    compiled = torch.compile(model, backend="hloalias")
    with torch.no_grad():
        assert _after_first_call(monkeypatch, lambda: compiled(x)) == 0


def test_the_key_is_no_import_in_a_training_step(monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    batch = (torch.randn(4, 8), torch.randn(4, 8))
    train = hloalias.compile_training_step(step, model, optimizer, batch)
    assert train.executable._rng_key is not None
    assert _after_first_call(monkeypatch, lambda: train(*batch)) == 0


def test_a_mesh_call_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each input (and the key) is copied shard by shard; the caller may
    write its tensor at once, and the calls draw by the seed as before."""
    if len(jax.devices("cpu")) < 2:
        pytest.skip("fewer than 2 cpu devices")
    x = torch.ones(8, 16)
    exe = hloalias.compile(
        _dropout, (x,), mesh=Mesh((2,), ("dp",), platform="cpu"), shardings={"x": ("dp", None)},
    )
    assert _after_first_call(monkeypatch, lambda: exe(x)) == 0
    torch.manual_seed(5)
    first = exe(x)
    torch.manual_seed(5)
    y = x.clone()
    again = exe(y)
    y.add_(1)  # after the call returned: it read its own copy
    assert torch.equal(again, first)


def test_the_plan_gives_the_key_its_own_row() -> None:
    """The native lane's table: the key's row is ``KEY`` (taken as it is,
    no flags), the caller's input an ``IMPORT``; a ``KEY`` row with flags,
    an index range or in an overlap pair is malformed."""
    exe = hloalias.compile(_dropout, (torch.ones(4, 4),))
    assert exe._plan is not None
    steps = plan_module._NativeSteps.of(exe, exe._plan)
    (x_row, key_row) = steps.inputs
    assert x_row[2] == plan_module.IMPORT
    assert key_row[:4] == (exe._rng_key, 1, plan_module.KEY, 0)


@pytest.mark.parametrize("what", ["input", "range", "pair"])
def test_a_malformed_key_row_is_refused(what: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from hloalias.runtime import lane as lane_module

    if lane_module._build_refusal() is not None:
        pytest.skip("the native call path is not built here")
    real = plan_module._NativeSteps.of
    change = {
        "input": lambda steps: dataclasses.replace(
            steps, inputs=steps.inputs[:1] + (steps.inputs[1][:3] + (plan_module.ZERO_OFFSET,) + steps.inputs[1][4:],),
        ),
        "range": lambda steps: dataclasses.replace(steps, ranges=((1, 0, 4),)),
        "pair": lambda steps: dataclasses.replace(steps, pairs=((0, 1),)),
    }[what]
    monkeypatch.setattr(plan_module._NativeSteps, "of", staticmethod(lambda exe, plan: change(real(exe, plan))))
    monkeypatch.setattr(lane_module, "_NativeSteps", plan_module._NativeSteps)
    with pytest.raises(ValueError, match=f"malformed {what} row"):
        hloalias.compile(_dropout, (torch.ones(4, 4),))


_CHILD = textwrap.dedent(
    """
    import os, sys, torch, hloalias

    def drop(x):
        return torch.nn.functional.dropout(x, 0.5, training=True)

    x = torch.ones(64, 64)
    native = hloalias.compile(drop, (x,))
    os.environ["HLOALIAS_NATIVE"] = "0"
    python = hloalias.compile(drop, (x,))
    assert native._lane is not None and python._lane is None
    for _ in range(20):
        native(x)
        python(x)
    print("CALLED", flush=True)
    # Ends at once: the last calls' keys are the newest runtime-made
    # arguments when the interpreter finalizes.
    """
)


def test_a_process_ending_right_after_random_calls_exits_cleanly(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "child.py")
    with open(path, "w") as handle:
        handle.write(_CHILD)
    done = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "CALLED" in done.stdout
