"""The package as people install and read it: ``__version__``, ``py.typed``,
the configuration registry (every ``HLOALIAS_*`` variable registered and
read in one place), the generated docs pages kept current, and the one
warning when the native call path is missing."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hloalias
from hloalias import config
from hloalias.tools import gen_docs

REPO = Path(__file__).resolve().parents[2]
#: Where the package's own modules live (the layer folders).
PACKAGE_DIRS = ("hloalias", "frontend", "passes", "pipeline", "runtime", "tools")


def test_version_is_the_installed_distribution() -> None:
    assert hloalias.__version__ == importlib.metadata.version("hloalias")
    assert re.fullmatch(r"\d+\.\d+\.\d+", hloalias.__version__)


def test_typed_package_ships_its_marker_and_stub() -> None:
    assert (importlib.resources.files("hloalias") / "py.typed").is_file()
    assert (importlib.resources.files("hloalias.runtime") / "_lane.pyi").is_file()


def test_sdist_manifest_carries_the_native_source() -> None:
    manifest = (REPO / "MANIFEST.in").read_text().split()
    assert "runtime/_lane.cpp" in manifest and "hloalias/py.typed" in manifest
    pyproject = (REPO / "pyproject.toml").read_text()
    build_requires = re.search(r"^requires = \[(.*)\]$", pyproject, re.M)
    assert build_requires is not None and '"torch==2.13.0"' in build_requires[1]
    assert '"torch==2.13.0",' in pyproject  # the runtime pin equals the build's


def _source_files() -> list[Path]:
    files = [p for p in REPO.rglob("*") if p.suffix in (".py", ".sh") and p.is_file()]
    skip = (".venv", "build", ".git", "__pycache__", ".mypy_cache")
    return [p for p in files if not any(part in skip for part in p.relative_to(REPO).parts)]


def test_every_variable_the_repository_reads_is_registered() -> None:
    registered = {s.name for s in config.SETTINGS}
    named: dict[str, str] = {}
    for path in _source_files():
        for name in re.findall(r"\bHLOALIAS_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")):
            named.setdefault(name, str(path.relative_to(REPO)))
    unregistered = {name: where for name, where in named.items() if name not in registered}
    assert unregistered == {}, "add these to hloalias/config.py"
    assert registered - set(named) == set(), "registered but read nowhere"


def test_the_package_reads_variables_only_through_the_registry() -> None:
    direct = re.compile(r"""environ(?:\.get)?\s*[\[(]\s*["']HLOALIAS_|getenv\(\s*["']HLOALIAS_""")
    offenders = [
        str(path.relative_to(REPO))
        for folder in PACKAGE_DIRS
        for path in (REPO / folder).rglob("*.py")
        if path.name != "config.py" and direct.search(path.read_text())
    ]
    assert offenders == []


def test_flags_and_numbers_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, expected in (("0", False), ("off", False), ("No", False), ("1", True), ("TRUE", True), ("", True)):
        monkeypatch.setenv("HLOALIAS_CACHE", value)
        assert config.flag("HLOALIAS_CACHE") is expected
    monkeypatch.delenv("HLOALIAS_CACHE")
    assert config.flag("HLOALIAS_CACHE") is True
    monkeypatch.setenv("HLOALIAS_CACHE_MAX_BYTES", "1234")
    assert config.integer("HLOALIAS_CACHE_MAX_BYTES") == 1234
    monkeypatch.setenv("HLOALIAS_PROGRESS_AFTER", "0.5")
    assert config.number("HLOALIAS_PROGRESS_AFTER") == 0.5
    monkeypatch.setenv("HLOALIAS_REPRO_DIR", "~/repros")
    assert config.text("HLOALIAS_REPRO_DIR") == os.path.expanduser("~/repros")


def test_bad_values_warn_and_use_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_CACHE_MAX_BYTES", "lots")
    with pytest.warns(config.ConfigWarning, match="HLOALIAS_CACHE_MAX_BYTES='lots' is not an integer"):
        assert config.integer("HLOALIAS_CACHE_MAX_BYTES") == 2 * 1024**3
    monkeypatch.setenv("HLOALIAS_NATIVE", "maybe")
    with pytest.warns(config.ConfigWarning, match="HLOALIAS_NATIVE='maybe'"):
        assert config.flag("HLOALIAS_NATIVE") is True
    with pytest.raises(KeyError):
        config.flag("HLOALIAS_" + "NOT_A_SETTING")
    with pytest.raises(TypeError, match="is a flag setting, read as integer"):
        config.integer("HLOALIAS_CACHE")


def test_read_sites_use_the_registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from hloalias.repro import write_repro
    from hloalias.runtime import disk_cache, export_cache, pjrt

    monkeypatch.setenv("HLOALIAS_CACHE", "off")
    monkeypatch.setenv("HLOALIAS_EXPORT_CACHE", "false")
    monkeypatch.setenv("HLOALIAS_NATIVE", "no")
    monkeypatch.setenv("HLOALIAS_CACHE_MAX_BYTES", "77")
    monkeypatch.setenv("HLOALIAS_REPRO_DIR", str(tmp_path))
    assert not disk_cache.enabled() and not export_cache.enabled() and not pjrt.native_enabled()
    assert disk_cache.max_bytes() == 77
    assert Path(write_repro("module {}", "test")).parent == tmp_path


def test_generated_docs_are_current() -> None:
    assert gen_docs.stale_pages() == [], "run: python -m hloalias.tools.gen_docs"


def test_stale_docs_are_found(tmp_path: Path) -> None:
    for name, render in gen_docs.PAGES.items():
        (tmp_path / name).write_text(render(), encoding="utf-8")
    assert gen_docs.stale_pages(tmp_path) == []
    assert gen_docs.main(["--check", "--docs-dir", str(tmp_path)]) == 0
    page = tmp_path / "passes.md"
    page.write_text(page.read_text().replace("fold-transpose-into-dot-general", "fold-transpose", 1))
    assert gen_docs.stale_pages(tmp_path) == ["passes.md"]
    assert gen_docs.main(["--check", "--docs-dir", str(tmp_path)]) == 1


def test_passes_page_documents_every_pass_and_option() -> None:
    from hloalias.passes import get_all_passes

    page = gen_docs.passes_markdown()
    for name, factory in get_all_passes().items():
        assert f"## {name}\n" in page
        for option in factory.__self__.option_help():  # type: ignore[attr-defined]
            assert f"| `{option}` |" in page


def _import_without_native(env_native: str | None) -> list[str]:
    """Warnings of importing the runtime where the extension cannot load."""
    script = (
        "import sys, warnings\n"
        "sys.modules['hloalias.runtime._lane'] = None  # an extension that does not load\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import hloalias.runtime\n"
        "for w in caught:\n"
        "    if w.category.__name__ == 'NativePathWarning': print('WARNING', w.message)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HLOALIAS_NATIVE"}
    if env_native is not None:
        env["HLOALIAS_NATIVE"] = env_native
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    return [line for line in result.stdout.splitlines() if line.startswith("WARNING")]


def test_one_warning_when_the_native_path_is_missing() -> None:
    (line,) = _import_without_native(None)
    assert "the native call path (hloalias.runtime._lane) is not available" in line
    assert "C++ compiler" in line and "HLOALIAS_NATIVE=0 silences this" in line
    assert _import_without_native("0") == []



def _readme_first_python_block() -> tuple[int, str]:
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index("```python")
    end = lines.index("```", start)
    return end, "\n".join(lines[start + 1:end])


def test_readme_opens_with_install_and_a_working_example(capsys: pytest.CaptureFixture[str]) -> None:
    head = "\n".join((REPO / "README.md").read_text().splitlines()[:40])
    assert "pip install" in head and "bash scripts/example.sh" in head and "bash scripts/test.sh" in head
    end, example = _readme_first_python_block()
    assert end < 40
    assert 'donate=["x"]' not in example
    exec(compile(example, "README.md", "exec"), {})  # noqa: S102 - the README's own example
    assert "eliminate-view-results: 2 results removed" in capsys.readouterr().out


def test_readme_lists_the_docs_that_exist() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Documentation"):]
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in section, f"README's Documentation section lacks docs/{page.name}"
