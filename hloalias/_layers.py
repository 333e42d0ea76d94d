"""The product's layers and the one rule that keeps them single.

Each top-level folder of the repository is one layer, installed as a
subpackage of ``hloalias`` (``passes/`` is ``hloalias.passes``).  From the
repository root, Python could also import such a folder under its bare name
(``import passes``) and load every module a second time, with a second copy
of each class: ``isinstance`` checks and registries would then disagree.
:func:`alias_bare_import` makes the bare name an alias of the installed
package instead."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Final

# Layer name -> rank; a module may import only from layers of lower rank,
# and from its own layer.  frontend and passes are siblings (rank 1).
LAYER_RANKS: Final[dict[str, int]] = {
    "hloalias": 0,
    "hloalias.frontend": 1,
    "hloalias.passes": 1,
    "hloalias.pipeline": 2,
    "hloalias.runtime": 3,
    "hloalias.tools": 4,
}


class _BareNameAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``bare`` and ``bare.x`` to the modules ``real`` and ``real.x``."""

    def __init__(self, bare: str, real: str) -> None:
        self.bare = bare
        self.real = real

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == self.bare or fullname.startswith(self.bare + "."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.real + spec.name[len(self.bare):])

    def exec_module(self, module: types.ModuleType) -> None:
        """The real module is already executed."""


def alias_bare_import(module_name: str, real_name: str) -> None:
    """Call at the top of a layer's ``__init__``: when the layer is being
    imported under its bare folder name, make that name (and every
    submodule under it) the installed ``real_name`` package."""
    if module_name == real_name:
        return
    if not any(isinstance(f, _BareNameAlias) and f.bare == module_name for f in sys.meta_path):
        sys.meta_path.insert(0, _BareNameAlias(module_name, real_name))
    sys.modules[module_name] = importlib.import_module(real_name)
