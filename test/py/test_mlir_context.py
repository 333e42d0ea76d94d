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


_ARITH_MODULE = """
func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %c = arith.constant dense<2.0> : tensor<4xf32>
  %0 = stablehlo.multiply %arg0, %c : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def test_wrapping_arith_ops_does_not_import_torch_mlirs_arith_module() -> None:
    # Wrapping an op in Python (every walk over a module does) imported the
    # Python module of its dialect: for arith, torch-mlir's generated one
    # (~5 ms CPU of a first compile), though hloalias reads arith ops by
    # name and attributes only.  hloalias.dialects.arith is found first; a
    # compile with arith constants still runs and is right.  A fresh process.
    code = (
        "import sys, torch, hloalias\n"
        "from hloalias.mlir import new_context, parse_module, walk_ops\n"
        "from hloalias.legalize import legalize_tensor_constants\n"
        f"module = parse_module({_ARITH_MODULE!r}, new_context())\n"
        "ops = [op.opview for op in walk_ops(module.operation)]\n"
        "assert [op.operation.name for op in ops] == ['func.func', 'arith.constant', 'stablehlo.multiply', 'func.return']\n"
        "assert legalize_tensor_constants(module) == 1 and 'arith.constant' not in str(module)\n"
        "x = torch.arange(8, dtype=torch.float32)\n"
        "exe = hloalias.compile(lambda t: t * 2 + 1, (x,))\n"
        "assert torch.equal(exe(x), x * 2 + 1)\n"
        "print('torch_mlir.dialects.arith' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "HLOALIAS_CACHE": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_a_process_that_imports_torch_mlirs_arith_gets_its_op_classes() -> None:
    # Importing the generated module registers its op classes: wrapped arith
    # ops are its classes then, whatever module the search finds first.
    code = (
        "from torch_mlir.dialects import arith\n"
        "from hloalias.mlir import new_context, parse_module, walk_ops\n"
        f"module = parse_module({_ARITH_MODULE!r}, new_context())\n"
        "constant = [op.opview for op in walk_ops(module.operation) if op.name == 'arith.constant']\n"
        "print(type(constant[0]) is arith.ConstantOp)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"
