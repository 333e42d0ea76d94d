"""Repro files: what failed, written where a person can replay it."""

from __future__ import annotations

import hashlib
import os
import tempfile

from hloalias import config


def write_repro(text: str, stage: str) -> str:
    """Write ``text`` to ``$HLOALIAS_REPRO_DIR`` (default: the temp dir) as
    ``hloalias-<stage>-<hash>.mlir`` and return the path."""
    directory = config.text("HLOALIAS_REPRO_DIR") or tempfile.gettempdir()
    os.makedirs(directory, exist_ok=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = os.path.join(directory, f"hloalias-{stage}-{digest}.mlir")
    with open(path, "w") as handle:
        handle.write(text)
    return path
