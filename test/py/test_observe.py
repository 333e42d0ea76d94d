"""Seeing into a compile (hloalias.observe): stage durations on the
``hloalias`` logger, the progress line, ``dump_dir``/``HLOALIAS_DUMP_DIR``,
and ``explain()``'s line for every pass that ran."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest
import torch

import hloalias
from hloalias.pipeline import CPU_PIPELINE, parse_pipeline

STAGES = (  # the program writes nothing in place: one trace (frontend/single_trace.py)
    "torch.export and decompositions (one trace)",
    "FX import",
    "torch-mlir lowering to the backend contract",
    "torch-mlir lowering to StableHLO",
)


def _fresh_program() -> tuple[object, tuple[torch.Tensor, ...]]:
    """A new function object each time (no import reuse) on a new shape."""

    def step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.nn.functional.linear(x, w).relu(), x[0:1]

    return step, (torch.randn(3, 5), torch.randn(2, 5))


@pytest.fixture(autouse=True)
def _no_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_CACHE", "0")
    monkeypatch.delenv("HLOALIAS_DUMP_DIR", raising=False)
    monkeypatch.delenv("HLOALIAS_PROGRESS", raising=False)
    hloalias.clear_cache()


def test_stage_durations_logged_at_info(caplog: pytest.LogCaptureFixture) -> None:
    f, args = _fresh_program()
    with caplog.at_level(logging.INFO, logger="hloalias"):
        hloalias.compile(f, args)
    messages = [r.getMessage() for r in caplog.records if r.name == "hloalias"]
    passes = [e.name for e in parse_pipeline(CPU_PIPELINE)]
    expected = [*STAGES, *(f"pass {p}" for p in passes), "XLA compile"]
    pattern = re.compile(r"^_fresh_program\.<locals>\.step: (.+) (\d+\.\d{3}) s$")
    stages = [m[1] for m in map(pattern.match, messages) if m and m[1] != "compiled in"]
    assert stages == expected
    assert re.match(r"^_fresh_program\.<locals>\.step: compiled in \d+\.\d{3} s$", messages[-1])


def test_nothing_logged_below_info(caplog: pytest.LogCaptureFixture) -> None:
    f, args = _fresh_program()
    with caplog.at_level(logging.WARNING, logger="hloalias"):
        hloalias.compile(f, args)
    assert [r for r in caplog.records if r.name == "hloalias"] == []


def test_dump_dir_holds_every_stage(tmp_path: Path) -> None:
    f, args = _fresh_program()
    exe = hloalias.compile(f, args, dump_dir=tmp_path)
    (folder,) = list(tmp_path.iterdir())
    assert re.match(rf"hloalias-{os.getpid()}-\d+-_fresh_program\.<locals>\.step$".replace("<", "_").replace(">", "_"),
                    folder.name)
    names = sorted(p.name for p in folder.iterdir())
    passes = [e.name for e in parse_pipeline(CPU_PIPELINE)]
    assert names == [
        f"{i:02d}-{stage}.mlir"
        for i, stage in enumerate(["torch", "stablehlo", *(f"after-{p}" for p in passes), "final"])
    ]
    assert "torch.aten." in (folder / "00-torch.mlir").read_text()
    assert "stablehlo.dot_general" in (folder / "01-stablehlo.mlir").read_text()
    # The transpose torch-mlir lowers linear with is gone after the fold.
    assert "stablehlo.transpose" in (folder / "01-stablehlo.mlir").read_text()
    assert "stablehlo.transpose" not in (folder / "02-after-fold-transpose-into-dot-general.mlir").read_text()
    assert (folder / names[-1]).read_text() == exe.mlir + ("" if exe.mlir.endswith("\n") else "\n")


def test_dump_dir_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_DUMP_DIR", str(tmp_path))
    f, args = _fresh_program()
    hloalias.compile(f, args, pipeline="builtin.module(eliminate-view-results)")
    (folder,) = list(tmp_path.iterdir())
    assert sorted(p.name for p in folder.iterdir()) == [
        "00-torch.mlir", "01-stablehlo.mlir", "02-after-eliminate-view-results.mlir", "03-final.mlir",
    ]


def test_explain_has_a_line_for_every_pass() -> None:
    f, args = _fresh_program()
    exe = hloalias.compile(f, args, pipeline="builtin.module(canonicalize, fold-transpose-into-dot-general, "
                                            "eliminate-view-results, alias-donated-buffers)")
    text = exe.explain()
    section = text[text.index("passes run (4):"):].splitlines()[1:5]
    assert [line.split(":")[0].strip() for line in section] == [
        "canonicalize", "fold-transpose-into-dot-general", "eliminate-view-results", "alias-donated-buffers",
    ]
    assert section[0].strip() == "canonicalize: upstream MLIR pass"
    assert section[1].strip().startswith("fold-transpose-into-dot-general: 1 transposes folded")


def test_progress_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_PROGRESS", "1")
    monkeypatch.setenv("HLOALIAS_PROGRESS_AFTER", "0")
    f, args = _fresh_program()
    hloalias.compile(f, args)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hloalias: compiling")]
    stages = [line.split(": ", 2)[2] for line in lines]
    assert stages[: len(STAGES)] == list(STAGES)
    assert "pass alias-donated-buffers" in stages and "XLA compile" in stages
    assert re.match(r"done in \d+\.\d s \(torch\.export .*, passes .*, XLA compile .*\)$", stages[-1])


def test_no_progress_line_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    f, args = _fresh_program()
    hloalias.compile(f, args)
    assert "hloalias: compiling" not in capsys.readouterr().err
