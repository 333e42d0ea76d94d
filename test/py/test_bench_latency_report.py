"""The latency benchmark's bookkeeping (no timing): every system measures
the same program, and a run keeps the sections appended to its report."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest


def test_peers_build_the_gpt2_depth_hloalias_uses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # `bench.latency --gpt2-layers 2` compiled a 2-layer GPT-2 with hloalias
    # while every peer child built the 12-layer default: the peers must get
    # the depth, and their builder must honour it.
    from bench import peer_measure, peers

    assert peer_measure.build("gpt2_decode", 2).config.layers == 2
    venv = tmp_path / "torch_xla-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / ".complete").write_text("")
    monkeypatch.setenv("HLOALIAS_PEERS_DIR", str(tmp_path))
    commands: list[list[str]] = []

    def fake_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        return subprocess.CompletedProcess(command, 1, "", "stub")

    monkeypatch.setattr(peers.subprocess, "run", fake_run)
    system = next(s for s in peers.SYSTEMS if s.peer == "torch_xla")
    peers.measure_all(["gpt2_decode"], calls=1, gpt2_layers=3)
    (command,) = [c for c in commands if str(venv) in c[0]]
    assert command[command.index("--gpt2-layers") + 1] == "3"
    assert peers.measure(system, "gpt2_decode", calls=1).error is not None  # the stub's failure, reported


def test_a_run_keeps_the_sections_appended_after_the_notes(tmp_path: Path) -> None:
    # The report is rewritten on every run: its old top goes under "Earlier
    # runs" and the notes are re-read from latency_notes.md; sections that
    # sessions appended after the notes were dropped.
    from bench import latency

    report = tmp_path / "RESULTS-latency.md"
    report.write_text(
        "# Compile latency\n\n## Old run\n\nold table\n\n"
        f"{latency._NOTES_HEADING}; appended by `bench.latency`)\n\n### A note\n\nnote text\n\n"
        "## Appended A/B\n\nfigures A\n\n## Another appended section\n\nfigures B\n"
    )
    latency.write_report(str(report), {}, [], None, 12)
    text = report.read_text()
    assert "## Appended A/B\n\nfigures A" in text
    assert "## Another appended section\n\nfigures B" in text
    assert text.index("### Old run") < text.index(latency._NOTES_HEADING) < text.index("## Appended A/B")
    assert text.count("## Appended A/B") == 1
    latency.write_report(str(report), {}, [], None, 12)  # a second run keeps them once
    assert report.read_text().count("## Appended A/B") == 1
