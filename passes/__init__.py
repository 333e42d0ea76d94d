"""hloalias's own passes over StableHLO, one per module, and the registry
that makes them available by name to pipelines and ``hloalias-opt``."""

from __future__ import annotations

from hloalias._layers import alias_bare_import

alias_bare_import(__name__, "hloalias.passes")

from collections.abc import Callable
from typing import Any

from hloalias.passes.alias_donated_buffers import AliasDonatedBuffers, AliasReport
from hloalias.passes.base import ModulePass
from hloalias.passes.eliminate_view_results import EliminateViewResults, ViewReport
from hloalias.passes.fold_transpose_into_dot_general import FoldReport, FoldTransposeIntoDotGeneral


def get_all_passes() -> dict[str, Callable[[str], ModulePass[Any]]]:
    """Pass name -> factory taking the pass's option text (``"a=1 b=2"``)."""
    return {
        AliasDonatedBuffers.name: AliasDonatedBuffers.from_options,
        EliminateViewResults.name: EliminateViewResults.from_options,
        FoldTransposeIntoDotGeneral.name: FoldTransposeIntoDotGeneral.from_options,
    }


__all__ = [
    "AliasDonatedBuffers",
    "AliasReport",
    "EliminateViewResults",
    "FoldReport",
    "FoldTransposeIntoDotGeneral",
    "ModulePass",
    "ViewReport",
    "get_all_passes",
]
