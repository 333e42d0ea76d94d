"""The frontend layer: torch programs -> StableHLO with the signature
recorded in IR (:mod:`hloalias.frontend.importer`).  Imports only the
bottom layer (:mod:`hloalias`)."""

from hloalias._layers import alias_bare_import

alias_bare_import(__name__, "hloalias.frontend")

from hloalias.frontend.importer import (  # noqa: E402
    ArgumentInfo,
    Program,
    ProgramSignature,
    ResultInfo,
    Stage,
    import_torch,
)

__all__ = ["ArgumentInfo", "Program", "ProgramSignature", "ResultInfo", "Stage", "import_torch"]
