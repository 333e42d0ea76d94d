"""Python dialect modules the MLIR bindings look up by dialect namespace.

torch-mlir's Python package has no ``stablehlo`` or ``chlo`` dialect module,
so each time the bindings wrap an op of those dialects they search for one,
fail, and search again on the next op: most of a pass's time went there.
The modules here are found instead; they define no op classes, so ops stay
generic ``OpView``s, and the lookup succeeds once and is cached.

``arith`` is here for cost, not absence: wrapping the first ``arith`` op
(every Python walk over a module with a scalar or tensor constant does)
imported torch-mlir's generated ``torch_mlir.dialects.arith`` (~5 ms CPU of
a first compile), whose op classes hloalias never uses: it reads ops by
name, attributes and results only.  So this package is searched *before*
torch-mlir's; a dialect it has no module for is found in torch-mlir's as
before.  A process that imports ``torch_mlir.dialects.arith`` itself gets
its op classes as always (importing it registers them)."""

from torch_mlir._mlir_libs import _mlir


def register_search_prefix() -> None:
    """Make the bindings search this package first, then the others as
    before (idempotent)."""
    modules = list(_mlir.globals.dialect_search_modules)
    if modules[:1] != [__name__]:
        _mlir.globals.dialect_search_modules = [__name__, *(m for m in modules if m != __name__)]
