"""Running an MLIR ``PassManager`` with the IR verified once, after its
last pass.

MLIR's pass manager verifies the whole module after every pass by
default.  Verification never changes the IR, so a pipeline whose result
verifies gives the same module either way; what the verification after
each intermediate pass adds is only that a pass which leaves invalid IR is
caught before the next pass runs on it.  :func:`run_verifying_result` runs
the pipeline with that verifier off and verifies the result once: a module
that does not verify after the pipeline is still refused (the caller's
error, with the verifier's diagnostics), and a pipeline that verified
before gives the same text.  ``HLOALIAS_VERIFY_EACH_PASS=1`` (a debugging
aid) verifies after every pass again, stopping at the first pass that
breaks the IR.

The residual difference: a pass (torch-mlir's own, or one of ours) that
leaves invalid IR is no longer stopped before the next pass, which then
runs on that IR; the result's verification (or a crash in that next pass)
reports it instead."""

from __future__ import annotations

from typing import Any

from hloalias import config


def run_verifying_result(manager: Any, operation: Any) -> None:
    """Run ``manager`` (a ``PassManager``) on ``operation`` in place and
    verify the result once (module docstring); raises ``ir.MLIRError``
    from either, as ``manager.run`` did with the verifier after each pass."""
    manager.enable_verifier(config.flag("HLOALIAS_VERIFY_EACH_PASS"))
    manager.run(operation)
    operation.verify()
