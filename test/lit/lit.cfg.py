"""lit configuration for hloalias's FileCheck tests.

Every tool is run through the Python interpreter that runs lit (or
``$HLOALIAS_PYTHON``), so the suite needs neither ``PATH`` nor ``PYTHONPATH``
to find ``hloalias-opt`` or ``filecheck``: both are modules of the
environment hloalias is installed in."""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import tempfile

import lit.formats

# lit injects `config` (and `lit_config`) into this file's globals.
config = globals()["config"]

config.name = "hloalias"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.excludes = ["lit.cfg.py", "Inputs"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
# Temporary files (%t) and lit's timing cache go outside the source tree, to
# a directory of their own per checkout (or $HLOALIAS_LIT_OUT).
_checkout = hashlib.sha256(config.test_source_root.encode()).hexdigest()[:12]
config.test_exec_root = os.environ.get("HLOALIAS_LIT_OUT") or os.path.join(
    tempfile.gettempdir(), f"hloalias-lit-{os.getuid()}-{_checkout}"
)

python = os.environ.get("HLOALIAS_PYTHON") or sys.executable
quoted_python = shlex.quote(python)
inputs_dir = os.path.join(config.test_source_root, "Inputs")


def tool(name: str) -> str:
    """A regex matching ``name`` used as a command word, not inside a path,
    a longer name or an option (``hloalias-opt.py``, ``--not``, ``x/not``)."""
    return rf"(?<![\w./-]){name}(?![\w.-])"


# The order matters only in that no replacement contains a later pattern.
config.substitutions.extend(
    [
        ("%PYTHON", quoted_python),
        (tool("hloalias-opt"), f"{quoted_python} -m hloalias.tools.opt"),
        (tool("filecheck"), f"{quoted_python} -m filecheck"),
        (tool("not"), f"{quoted_python} {shlex.quote(os.path.join(inputs_dir, 'not.py'))}"),
    ]
)

# hloalias is installed into the interpreter's environment, so PYTHONPATH is
# not needed; keep the few variables tools legitimately read.
for variable in ("HOME", "PATH", "TMPDIR", "HLOALIAS_REPRO_DIR"):
    if variable in os.environ:
        config.environment[variable] = os.environ[variable]
config.environment.pop("PYTHONPATH", None)
# Diagnostics must not depend on the terminal, and XLA must stay on the CPU.
config.environment["PYTHONUNBUFFERED"] = "1"
config.environment["JAX_PLATFORMS"] = "cpu"
