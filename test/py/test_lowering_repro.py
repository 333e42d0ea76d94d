"""The torch-mlir lowering step of the importer (``importer._lower``): a
failure writes the module as it was before the pipeline ran as its repro,
and a success prints nothing."""

from __future__ import annotations

import pytest

from hloalias.errors import TorchImportError
from hloalias.frontend import importer
from hloalias.mlir import new_context, print_module
from torch_mlir import ir

_UNKNOWN_OP = """
module {
  func.func @main(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
    %0 = torch.operator "torch.aten.no_such_op"(%arg0) : (!torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> loc("user.py":7:3)
    return %0 : !torch.vtensor<[2],f32>
  }
}
"""

_IDENTITY = """
module {
  func.func @main(%arg0: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
    return %arg0 : !torch.vtensor<[2],f32>
  }
}
"""


def test_a_failed_lowering_writes_the_module_before_the_pipeline(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLOALIAS_REPRO_DIR", str(tmp_path))
    with new_context():
        module = ir.Module.parse(_UNKNOWN_OP)
        before = print_module(module, debug_info=True)
        with pytest.raises(TorchImportError, match="no_such_op") as raised:
            importer._lower(module, importer.TORCH_BACKEND_PIPELINE, "torch backend contract", lambda name, on_complex: None)
    assert raised.value.repro_path is not None
    with open(raised.value.repro_path) as handle:
        assert handle.read() == before
    assert 'loc("user.py":7:3)' in before


def test_a_lowering_that_succeeds_prints_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repro's text is made only on failure (printing a large module
    with its locations on every compile cost more than the copy kept)."""
    printed: list[object] = []
    real = importer.print_module

    def counted(module: object, debug_info: bool = False) -> str:
        printed.append(module)
        return real(module, debug_info=debug_info)  # type: ignore[arg-type]

    monkeypatch.setattr(importer, "print_module", counted)
    with new_context():
        module = ir.Module.parse(_IDENTITY)
        importer._lower(module, importer.TORCH_BACKEND_PIPELINE, "torch backend contract", lambda name, on_complex: None)
        assert "return %arg0" in real(module)
    assert printed == []
