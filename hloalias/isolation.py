"""One compile stage run in a child process, so that a crash of upstream
code (a segfault or abort inside torch-mlir's or XLA's native code) ends
the child and not the caller.

:func:`run_isolated` starts ``python -c`` running :func:`_child_main`,
sends it a *stage* (``"module:function"``, a function of one ``str``
returning a ``str``) and the stage's text input on stdin, and reads the
stage's text result from stdout.  The child imports only the stage's
module (the stages here need torch-mlir's bindings, not torch), so a start
costs a Python start and that import (docs/refusals.md has the figures).

- the stage returned: its text;
- the stage raised: :class:`StageFailed` with its message (an ordinary
  failure: the caller may rerun the stage in process to report it as it
  would have without a child, since it is known not to crash);
- the child died (a signal, or an exit without a result):
  :class:`StageCrashed` with the signal's name and the tail of its
  stderr.  The caller turns it into its :class:`~hloalias.CompileError`.

:func:`lower_torch_mlir` is the torch-mlir lowering as such a stage,
:func:`compile_xla` XLA's compile for one CPU device (a probe: its
executable stays in the child; the caller compiles again in process once
the child has shown the compile does not crash)."""

from __future__ import annotations

import base64
import importlib
import json
import os
import signal
import subprocess
import sys

_OK = "ok"
_FAILED = "failed"
#: The child's reply starts with this line, then a status line; anything a
#: library prints to stdout before it is skipped.
_MARK = "--hloalias-isolated-result--"


class StageFailed(Exception):
    """The stage raised in the child (no crash)."""


class StageCrashed(Exception):
    """The child died before it answered."""

    def __init__(self, message: str, signal_name: str | None, stderr_tail: str) -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.stderr_tail = stderr_tail


def run_isolated(stage: str, payload: str, *, timeout: float | None = None) -> str:
    """Run ``stage`` (``"module:function"``) on ``payload`` in a child
    process and return its result (see the module docstring)."""
    request = stage + "\n" + payload
    program = "from hloalias.isolation import _child_main; _child_main()"
    child = subprocess.run(
        [sys.executable, "-c", program],
        input=request.encode(),
        capture_output=True,
        timeout=timeout,
        env=os.environ.copy(),
    )
    stdout = child.stdout.decode(errors="replace")
    stderr_tail = child.stderr.decode(errors="replace")[-2000:]
    marker = stdout.find(_MARK + "\n")
    if child.returncode == 0 and marker >= 0:
        status, _, body = stdout[marker + len(_MARK) + 1 :].partition("\n")
        if status == _OK:
            return body
        if status == _FAILED:
            raise StageFailed(str(json.loads(body)))
    signal_name: str | None = None
    if child.returncode < 0:
        try:
            signal_name = signal.Signals(-child.returncode).name
        except ValueError:
            signal_name = f"signal {-child.returncode}"
    how = signal_name if signal_name else f"exit status {child.returncode}"
    raise StageCrashed(f"the child process running {stage} died ({how})", signal_name, stderr_tail)


def _child_main() -> None:
    """The child's side of :func:`run_isolated`."""
    request = sys.stdin.buffer.read().decode()
    stage, _, payload = request.partition("\n")
    module_name, _, function_name = stage.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    try:
        result = function(payload)
    except Exception as error:  # the stage's own failure, reported to the parent
        reply = f"{_MARK}\n{_FAILED}\n{json.dumps(f'{type(error).__name__}: {error}')}"
    else:
        reply = f"{_MARK}\n{_OK}\n{result}"
    sys.stdout.flush()
    sys.stdout.buffer.write(reply.encode())
    sys.stdout.flush()


def lower_torch_mlir(payload: str) -> str:
    """A stage: ``payload`` is a JSON list of pass pipelines, a newline, and
    a torch-mlir module's text; the result is the module's text (with
    locations) after running the pipelines in turn."""
    from torch_mlir import passmanager

    from hloalias.mlir import new_context, parse_module, print_module

    header, _, text = payload.partition("\n")
    pipelines = json.loads(header)
    context = new_context()
    module = parse_module(text, context)
    with context:
        for pipeline in pipelines:
            passmanager.PassManager.parse(pipeline).run(module.operation)
    return print_module(module, debug_info=True)


def compile_xla(payload: str) -> str:
    """A stage: ``payload`` is a JSON header (``options``: the
    ``CompileOptions`` serialized, base64), a newline, and StableHLO text
    as XLA takes it; compiles it for the first CPU device and returns
    ``"compiled"``."""
    from jax._src.lib import xla_client

    import jax

    header, _, text = payload.partition("\n")
    options = xla_client.CompileOptions.ParseFromString(base64.b64decode(json.loads(header)["options"]))
    device = jax.devices("cpu")[0]
    device.client.compile_and_load(text, xla_client.DeviceList((device,)), options)
    return "compiled"


def compile_xla_payload(text: str, serialized_options: bytes) -> str:
    """The payload of :func:`compile_xla`."""
    return json.dumps({"options": base64.b64encode(serialized_options).decode()}) + "\n" + text
