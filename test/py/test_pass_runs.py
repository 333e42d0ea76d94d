"""A pass pipeline's IR is verified once, after its last pass
(hloalias/pass_runs.py): a result that does not verify is refused with the
verifier's diagnostics (the torch-mlir lowering's and hloalias's own
pipelines alike), IR left invalid between two passes is not, and
``HLOALIAS_VERIFY_EACH_PASS=1`` verifies after every pass again."""

from __future__ import annotations

from typing import Any

import pytest
from torch_mlir import ir, passmanager
from torch_mlir.dialects import func

from hloalias.errors import IRError, TorchImportError
from hloalias.frontend import importer
from hloalias.pass_runs import run_verifying_result
from hloalias.pipeline import run_pipeline

_VALID = """
func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
  return %a : tensor<2xf32>
}
"""


def _invalid_module(context: ir.Context) -> ir.Module:
    """``@main`` returning an i32 where its type says i64: parses as
    built, fails the verifier."""
    with context, ir.Location.unknown():
        module = ir.Module.create()
        i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
        with ir.InsertionPoint(module.body):
            main = func.FuncOp("main", ir.FunctionType.get([i32], [i64]))
            block = main.add_entry_block()
            with ir.InsertionPoint(block):
                func.ReturnOp([block.arguments[0]])
    return module


def _returned_type(module_op: Any) -> ir.Type:
    return module_op.regions[0].blocks[0].operations[0].regions[0].blocks[0].operations[0].operands[0].type


def _set_result_type(module_op: Any, result: ir.Type) -> None:
    """Set ``@main``'s result type (an hloalias-style Python pass)."""
    main = module_op.regions[0].blocks[0].operations[0]
    inputs = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).inputs
    main.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, [result]))


def test_a_lowering_refuses_a_result_that_does_not_verify() -> None:
    # No pass runs, so no verifier ran after one: the result is verified.
    module = _invalid_module(ir.Context())
    with pytest.raises(TorchImportError, match="doesn't match function result type"):
        importer._lower(module, "builtin.module()", "StableHLO", lambda name, on_complex: None)


def test_a_pass_pipeline_refuses_a_result_that_does_not_verify() -> None:
    module = _invalid_module(ir.Context())
    with pytest.raises(IRError, match="doesn't match function result type"):
        run_pipeline(module, "builtin.module()")


def test_a_lowering_that_verifies_gives_the_same_module() -> None:
    context = ir.Context()
    module = ir.Module.parse(_VALID, context)
    before = str(module)
    importer._lower(module, "builtin.module(canonicalize)", "StableHLO", lambda name, on_complex: None)
    assert str(module) == before


def test_ir_invalid_between_passes_is_verified_after_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    context = ir.Context()

    def breaking(op: Any, pass_: Any) -> None:  # leaves @main's type disagreeing with its return
        _set_result_type(op, ir.IntegerType.get_signless(64))

    def repairing(op: Any, pass_: Any) -> None:
        _set_result_type(op, _returned_type(op))

    def manager(*passes: Any) -> Any:
        with context:
            pm = passmanager.PassManager("builtin.module")
            for position, run in enumerate(passes):
                pm.add(run, name=f"step{position}", argument=f"step{position}")
        return pm

    module = ir.Module.parse(_VALID, context)
    with context:
        run_verifying_result(manager(breaking, repairing), module.operation)
    assert str(module) == str(ir.Module.parse(_VALID, context))
    module = ir.Module.parse(_VALID, context)
    with context, pytest.raises(ir.MLIRError, match="doesn't match function result type"):
        run_verifying_result(manager(breaking), module.operation)
    # The debugging aid: the verifier after every pass, stopping at the first.
    monkeypatch.setenv("HLOALIAS_VERIFY_EACH_PASS", "1")
    module = ir.Module.parse(_VALID, context)
    with context, pytest.raises(ir.MLIRError):
        run_verifying_result(manager(breaking, repairing), module.operation)
