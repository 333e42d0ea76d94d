"""``hloalias.mlir.new_context`` loads only the dialects hloalias builds
operations of from Python; every other registered dialect loads on demand
(a default ``ir.Context()`` loads them all, ~3x the cost of a compile's
context)."""

from __future__ import annotations

import subprocess
import sys

from torch_mlir import ir

from hloalias.mlir import new_context, parse_module


def test_new_context_loads_only_what_hloalias_builds() -> None:
    context = new_context()
    for dialect in ("torch", "stablehlo", "func", "arith"):
        assert context.is_dialect_loaded(dialect), dialect
    # Registered, not loaded until something needs it.
    assert not context.is_dialect_loaded("linalg")
    assert not context.is_dialect_loaded("ml_program")


def test_registered_dialects_load_when_the_parser_meets_them() -> None:
    context = new_context()
    module = parse_module(
        """
        func.func @main(%arg0: tensor<2x3xf32>) -> tensor<3x2xf32> {
          %empty = tensor.empty() : tensor<3x2xf32>
          %0 = linalg.transpose ins(%arg0 : tensor<2x3xf32>) outs(%empty : tensor<3x2xf32>) permutation = [1, 0]
          return %0 : tensor<3x2xf32>
        }
        """,
        context,
    )
    assert context.is_dialect_loaded("linalg") and context.is_dialect_loaded("tensor")
    with context:
        module.operation.verify()
    assert "linalg.transpose" in str(module)
    assert isinstance(module, ir.Module)


def test_new_context_loads_dialects_without_importing_their_python_op_modules() -> None:
    # Loading a dialect through ``context.dialects[name]`` (what
    # ``load_on_create_dialects`` does) also imports its generated Python
    # op module; hloalias builds no op through arith's.  A fresh process:
    # this one may have imported it for another test.
    code = (
        "import sys\n"
        "from hloalias.mlir import new_context\n"
        "context = new_context()\n"
        "assert context.is_dialect_loaded('arith') and context.is_dialect_loaded('func')\n"
        "print('torch_mlir.dialects.arith' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
