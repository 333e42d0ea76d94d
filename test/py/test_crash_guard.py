"""The crash guard: a crash of torch-mlir's native code during a compile
is a CompileError naming the op, and the caller's process lives on
(frontend/crash_guard.py, hloalias/isolation.py)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch

import hloalias
from hloalias import isolation
from hloalias.frontend import crash_guard


@pytest.fixture
def stages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of deliberately failing stages, importable in the child."""
    (tmp_path / "failing_stages.py").write_text(
        textwrap.dedent(
            """
            import ctypes, os

            def abort(payload):
                os.abort()

            def segfault(payload):
                ctypes.string_at(0)

            def exit_silently(payload):
                os._exit(3)

            def raise_error(payload):
                raise ValueError("no: " + payload[:5])

            def echo(payload):
                return payload.upper()
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "failing_stages"


def test_a_stage_runs_in_a_child_and_returns_its_text(stages: str) -> None:
    assert isolation.run_isolated(f"{stages}:echo", "abc\ndef") == "ABC\nDEF"


@pytest.mark.parametrize("stage, signal_name", [("abort", "SIGABRT"), ("segfault", "SIGSEGV"), ("exit_silently", None)])
def test_a_dying_child_is_a_stage_crash(stages: str, stage: str, signal_name: str | None) -> None:
    with pytest.raises(isolation.StageCrashed) as caught:
        isolation.run_isolated(f"{stages}:{stage}", "payload")
    assert caught.value.signal_name == signal_name
    assert ("exit status 3" in str(caught.value)) == (signal_name is None)


def test_a_raising_stage_is_a_stage_failure(stages: str) -> None:
    with pytest.raises(isolation.StageFailed, match="ValueError: no: paylo"):
        isolation.run_isolated(f"{stages}:raise_error", "payload")


def _program(x: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(x * 2.0, 1) + 1.0


def _no_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every compile imports (no program reused from an earlier test)."""
    for name in ("HLOALIAS_CACHE", "HLOALIAS_EXPORT_CACHE", "HLOALIAS_PROGRAM_CACHE"):
        monkeypatch.setenv(name, "0")


def test_isolated_compile_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_ISOLATE_COMPILE", "1")
    _no_caches(monkeypatch)
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    got = hloalias.compile(_program, (x,))(x)
    torch.testing.assert_close(got, _program(x))


def test_a_crash_in_the_lowering_is_a_compile_error_and_the_caller_lives(
    stages: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLOALIAS_ISOLATE_COMPILE", "1")
    _no_caches(monkeypatch)
    monkeypatch.setattr(crash_guard, "LOWERING_STAGE", f"{stages}:abort")
    x = torch.randn(3, 5)
    with pytest.raises(hloalias.CompileError) as caught:
        hloalias.compile(_program, (x,))
    message = str(caught.value)
    assert "torch-mlir crashed (SIGABRT)" in message
    assert "aten.logsumexp" in message and "test_crash_guard.py" in message, message
    assert caught.value.repro_path and os.path.exists(caught.value.repro_path)
    # The process lives on and compiles the next program in process.
    monkeypatch.setenv("HLOALIAS_ISOLATE_COMPILE", "0")
    torch.testing.assert_close(hloalias.compile(_program, (x,))(x), _program(x))


def test_a_failing_lowering_in_a_child_is_reported_as_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """An op torch-mlir cannot lower: the same TorchImportError with or
    without the child."""

    def program(x: torch.Tensor) -> torch.Tensor:
        return torch.poisson(x.abs())

    messages = []
    for isolate in ("0", "1"):
        monkeypatch.setenv("HLOALIAS_ISOLATE_COMPILE", isolate)
        with pytest.raises(hloalias.TorchImportError) as caught:
            hloalias.compile(program, (torch.randn(3),))
        messages.append(str(caught.value).splitlines()[0])
    assert messages[0] == messages[1]


def test_a_zero_dim_keepdim_reduction_is_on_the_risky_list() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.zeros(())
    y = graph.placeholder("y")
    y.meta["val"] = torch.zeros(3)
    graph.call_function(torch.ops.aten.logsumexp.default, (x, [0], True))
    graph.call_function(torch.ops.aten.sum.dim_IntList, (y, [0], True))
    graph.call_function(torch.ops.aten.amax.default, (x, [0]), {"keepdim": False})
    assert crash_guard.risky_nodes(graph) == ["aten.logsumexp.default"]
    assert crash_guard.should_isolate(["aten.logsumexp.default"])


def test_a_crash_in_xla_compile_is_a_compile_error_and_the_caller_lives(
    stages: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hloalias.runtime import pjrt

    monkeypatch.setenv("HLOALIAS_ISOLATE_COMPILE", "1")
    _no_caches(monkeypatch)
    monkeypatch.setattr(crash_guard, "LOWERING_STAGE", "hloalias.isolation:lower_torch_mlir")
    monkeypatch.setattr(pjrt, "XLA_PROBE_STAGE", f"{stages}:segfault")
    x = torch.randn(4, 3)
    with pytest.raises(hloalias.CompileError, match=r"XLA crashed \(SIGSEGV\) compiling the program") as caught:
        hloalias.compile(lambda t: torch.tanh(t) * 3.0, (x,))
    assert caught.value.repro_path and os.path.exists(caught.value.repro_path)
    monkeypatch.setattr(pjrt, "XLA_PROBE_STAGE", "hloalias.isolation:compile_xla")
    torch.testing.assert_close(hloalias.compile(lambda t: torch.tanh(t) * 3.0, (x,))(x), torch.tanh(x) * 3.0)


def test_a_failing_lowering_writes_the_module_the_pipeline_got(monkeypatch: pytest.MonkeyPatch) -> None:
    # The repro is the module before the failing pipeline (with locations),
    # not what the pipeline left of it: replaying it fails the same way.
    _no_caches(monkeypatch)
    monkeypatch.setenv("HLOALIAS_ISOLATE_COMPILE", "0")

    def program(x: torch.Tensor) -> torch.Tensor:
        return torch.poisson(x.abs()) + 1.0

    with pytest.raises(hloalias.TorchImportError) as caught:
        hloalias.compile(program, (torch.randn(3),))
    # The source line is found by tracing the model again, with torch
    # functions' overrides on (the import around it runs with them off).
    assert "test_crash_guard.py" in str(caught.value).splitlines()[0]
    assert caught.value.repro_path is not None
    with open(caught.value.repro_path) as handle:
        text = handle.read()
    assert "torch.aten.poisson" in text and "func.func @main" in text and "loc(" in text
