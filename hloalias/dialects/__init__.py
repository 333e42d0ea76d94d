"""Python dialect modules the MLIR bindings look up by dialect namespace.

torch-mlir's Python package has no ``stablehlo`` or ``chlo`` dialect module,
so each time the bindings wrap an op of those dialects they search for one,
fail, and search again on the next op: most of a pass's time went there.
The modules here are found instead; they define no op classes, so ops stay
generic ``OpView``s, and the lookup succeeds once and is cached."""

from torch_mlir._mlir_libs import _mlir


def register_search_prefix() -> None:
    """Make the bindings search this package after torch-mlir's (idempotent)."""
    if __name__ not in _mlir.globals.dialect_search_modules:
        _mlir.globals.append_dialect_search_prefix(__name__)
