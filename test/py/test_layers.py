"""The layers of the product (one per top-level folder, see
``hloalias/_layers.py``): no module imports a layer above its own or a
sibling layer, and a bare ``import passes`` from the repository root is the
installed ``hloalias.passes``, not a second copy."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hloalias._layers import LAYER_RANKS

REPO = Path(__file__).resolve().parents[2]
FOLDERS = {
    "hloalias": "hloalias",
    "frontend": "hloalias.frontend",
    "passes": "hloalias.passes",
    "pipeline": "hloalias.pipeline",
    "runtime": "hloalias.runtime",
    "tools": "hloalias.tools",
}


def _module_name(path: Path) -> str:
    relative = path.relative_to(REPO)
    package = FOLDERS[relative.parts[0]]
    rest = [p for p in relative.with_suffix("").parts[1:] if p != "__init__"]
    return ".".join([package, *rest])


def _layer_of(module: str) -> str | None:
    best = None
    for layer in LAYER_RANKS:
        if module == layer or module.startswith(layer + "."):
            if best is None or len(layer) > len(best):
                best = layer
    return best


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    if module == "hloalias":
        # The façade's lazy loader (and its TYPE_CHECKING names) is the one exception.
        for node in ast.walk(tree):
            if _is_type_checking_block(node):
                skipped.update(id(child) for child in ast.walk(node))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def _product_files() -> list[Path]:
    files = []
    for folder in FOLDERS:
        files.extend(sorted((REPO / folder).rglob("*.py")))
    return files


def test_every_layer_folder_is_walked() -> None:
    assert set(FOLDERS.values()) == set(LAYER_RANKS)
    assert len(_product_files()) > 20


@pytest.mark.parametrize("path", _product_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_import_goes_up_a_layer(path: Path) -> None:
    module = _module_name(path)
    source_layer = _layer_of(module)
    assert source_layer is not None
    bad = []
    for line, imported in _imports(path, module):
        target_layer = _layer_of(imported)
        if target_layer is None or target_layer == source_layer:
            continue
        if LAYER_RANKS[target_layer] >= LAYER_RANKS[source_layer]:
            bad.append(f"{path.relative_to(REPO)}:{line}: {source_layer} imports {imported} ({target_layer})")
    assert not bad, "\n".join(bad)


def test_layer_rule_catches_an_upward_import(tmp_path: Path) -> None:
    """The walker is not vacuous: an upward import is seen."""
    fake = REPO / "passes" / "base.py"
    imports = _imports(fake, "hloalias.passes.base")
    assert any(name.startswith("hloalias.errors") for _, name in imports)
    assert _layer_of("hloalias.runtime.pjrt") == "hloalias.runtime"
    assert LAYER_RANKS[_layer_of("hloalias.runtime.pjrt") or ""] > LAYER_RANKS["hloalias.passes"]


def test_bare_layer_import_from_repo_root_is_the_installed_package() -> None:
    code = (
        "import passes, passes.base, pipeline, runtime.pjrt, frontend, tools.opt\n"
        "import hloalias.passes, hloalias.passes.base, hloalias.runtime.pjrt\n"
        "assert passes is hloalias.passes\n"
        "assert passes.base.ModulePass is hloalias.passes.base.ModulePass\n"
        "assert runtime.pjrt is hloalias.runtime.pjrt\n"
        "import sys\n"
        "files = [getattr(m, '__file__', None) for n, m in list(sys.modules.items()) if n.endswith('passes.base')]\n"
        "assert len(set(files)) == 1, files\n"
        "print('ok')\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
