"""Programs that compute nothing (``hloalias.runtime.plan.computes_nothing``):
every output an input, a view of one or a constant, nothing donated, an
empty ``@main``.  ``compile`` hands them to no XLA compile and, with no
module state, does not start jax's backend; calls return real torch views
of the caller's tensors; ``memory_stats`` are XLA's own figures for the
empty ``@main`` (checked here against XLA compiling the same text)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import hloalias
from hloalias.errors import DonatedBufferError
from hloalias.runtime import executable as executable_module
from hloalias.runtime import export_cache
from hloalias.runtime.pjrt import MemoryStats, compile_module, device_for, memory_stats


def seed(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = x[0:1024]
    return x, a.view(2, 512)


class ViewsOfAParameter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x.t(), self.weight.view(-1), self.weight[::2]


class _XlaReached(Exception):
    pass


@pytest.fixture
def no_xla(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """``compile``'s XLA entry raising: a test that compiles a program that
    computes nothing must not reach it.  Caches emptied around the test
    (a cached executable would also skip XLA)."""
    reached: list[str] = []

    def refuse(module_text: str, *args: Any, **kwargs: Any) -> Any:
        reached.append(module_text)
        raise _XlaReached("XLA compile reached")

    monkeypatch.setattr(executable_module, "compile_module", refuse)
    hloalias.clear_cache()
    export_cache.clear_export_cache()
    yield reached
    hloalias.clear_cache()
    export_cache.clear_export_cache()


def _same_memory(view: torch.Tensor, base: torch.Tensor) -> bool:
    return view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_seed_is_not_compiled_by_xla_and_returns_views(no_xla: list[str]) -> None:
    x = torch.randn(1024)
    exe = hloalias.compile(seed, (x,))
    same, view = exe(x)
    assert same is x and view._base is x and _same_memory(view, x)
    assert torch.equal(view, x.view(2, 512))
    x.add_(1)  # a live view, as eager's
    assert torch.equal(view, x.view(2, 512))
    assert exe._loaded is None and not exe.cache_hit and no_xla == []
    assert exe.memory_stats == {
        "argument_bytes": 4096, "output_bytes": 0, "alias_bytes": 0, "temp_bytes": 0, "total_bytes": 4096,
    }
    assert exe.aliases == []
    text = exe.explain()
    assert "XLA memory: argument 4096 + output 0 - alias 0 + temp 0 = 4096 bytes" in text
    assert "XLA compile: none (the program computes nothing" in text
    assert exe._lane is None and "call path: Python (" in text  # the native lane takes no program that does not run
    assert "return\n" in exe.mlir and "hloalias.removed_results" in exe.mlir


def test_a_program_that_computes_still_reaches_xla(no_xla: list[str]) -> None:
    with pytest.raises(_XlaReached):
        hloalias.compile(lambda x: (x, x[0:4] + 1), (torch.randn(8),))
    assert len(no_xla) == 1


def test_a_donated_input_returned_as_itself_still_compiles_and_is_consumed() -> None:
    """Donation keeps its meaning: the program runs (XLA consumes the
    donated buffer), so it is compiled as before."""
    hloalias.clear_cache()
    x = torch.randn(16)
    exe = hloalias.compile(lambda t: t, (x,), donate=[0])
    assert exe._loaded is not None and exe._plan is not None and exe._plan.executes
    device_x = exe.to_device(x)
    out = exe(device_x)
    torch.testing.assert_close(out, x)
    with pytest.raises(DonatedBufferError):
        exe(device_x)


def test_views_of_state_are_not_compiled(no_xla: list[str]) -> None:
    model = ViewsOfAParameter()
    x = torch.randn(4, 3)
    exe = hloalias.compile(model, (x,))
    xt, flat, rows = exe(x)
    assert exe._loaded is None and no_xla == []
    assert xt._base is x and _same_memory(xt, x)
    torch.testing.assert_close(flat, model.weight.detach().view(-1))
    torch.testing.assert_close(rows, model.weight.detach()[::2])
    assert flat.untyped_storage().data_ptr() == rows.untyped_storage().data_ptr()  # one state buffer
    assert exe.memory_stats["argument_bytes"] == (8 * 16 + 4 * 3) * 4
    with torch.no_grad():
        model.weight.mul_(2)  # torch's write: the next call reads it
    _, flat, _ = exe(x)
    torch.testing.assert_close(flat, model.weight.detach().view(-1))


def test_jit_lower_compile_and_dynamo_skip_xla(no_xla: list[str]) -> None:
    x = torch.randn(1024)
    jitted = hloalias.jit(seed)
    same, view = jitted(x)
    assert same is x and view._base is x
    lowered = jitted.lower(torch.randn(2048))
    assert "func.func @main" in lowered.as_text()
    exe = lowered.compile()
    assert exe._loaded is None and jitted.stats.compiles == 2
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: (t.view(4, 256), t[1:3]), backend="hloalias")
    a, b = compiled(x)
    assert _same_memory(a, x) and _same_memory(b, x)
    torch.testing.assert_close(a, x.view(4, 256))
    torch.testing.assert_close(b, x[1:3])
    torch._dynamo.reset()
    assert no_xla == []


def test_program_cache_hit_of_a_view_only_program(
    no_xla: list[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLOALIAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HLOALIAS_CACHE", raising=False)
    monkeypatch.delenv("HLOALIAS_PROGRAM_CACHE", raising=False)
    x = torch.randn(1024)
    first = hloalias.compile(seed, (x,))
    export_cache.clear_export_cache()
    again = hloalias.compile(seed, (x,))
    assert "program cache: hit" in again.program_cache, again.program_cache
    assert again.mlir == first.mlir and again.memory_stats == first.memory_stats
    same, view = again(x)
    assert same is x and view._base is x and no_xla == []


def test_a_view_only_program_on_a_mesh_compiles_with_xla() -> None:
    """Meshes keep the XLA path (placement by the partitioner)."""
    hloalias.clear_cache()
    x = torch.randn(8, 4)
    exe = hloalias.compile(lambda t: (t, t.view(32)), (x,), mesh=hloalias.Mesh((2,), ("dp",)),
                           shardings={0: ("dp", None)})
    assert exe._loaded is not None
    same, flat = exe(x)
    torch.testing.assert_close(same, x)
    torch.testing.assert_close(flat, x.view(32))


def _xla_figures(exe: Any) -> dict[str, int]:
    stats: MemoryStats = memory_stats(compile_module(exe.mlir, device_for("cpu"), allow_stored_state=True))
    return stats.as_dict()


@pytest.mark.parametrize("make", [
    lambda: (seed, (torch.randn(1024),)),
    lambda: (lambda a, b, c: (c, a.view(-1), b[1]), (torch.randn(3, 5), torch.zeros(2, 4, dtype=torch.bool),
                                                    torch.tensor(7, dtype=torch.int64))),
    lambda: (lambda a, b: (a.t(), b.view(torch.int16)), (torch.randn(4, 6).bfloat16(), torch.randn(3, dtype=torch.float16))),
    lambda: (lambda a, b: (b, a[::2]), (torch.randn(5, dtype=torch.complex64), torch.empty(0, 3))),
    lambda: (lambda a: (a, a.unsqueeze(0), a.expand(3, 7)), (torch.randint(0, 9, (7,), dtype=torch.int8),)),
    lambda: (ViewsOfAParameter(), (torch.randn(4, 3),)),
], ids=["seed", "bool-int64-scalar", "bf16-f16-bitview", "complex-empty", "int8-expand", "state"])
def test_memory_stats_are_xlas_figures(make: Callable[[], tuple[Any, tuple[Any, ...]]], no_xla: list[str]) -> None:
    """The figures stated without compiling are the ones XLA reports when
    it compiles the same final module."""
    f, args = make()
    exe = hloalias.compile(f, args)
    assert exe._loaded is None and no_xla == [], exe.mlir
    eager = f(*args)
    for got, want in zip(exe(*args), eager):
        torch.testing.assert_close(got, want)
    stated = exe.memory_stats
    monkeypatch_free = _xla_figures(exe)
    assert stated == monkeypatch_free


_CHILD = textwrap.dedent(
    """
    import torch, hloalias
    from jax._src import xla_bridge
    from hloalias.runtime.disk_cache import disk_cache_stats
    def seed(x):
        return x, x[0:1024].view(2, 512)
    x = torch.randn(4096)
    exe = hloalias.compile(seed, (x,))
    same, view = exe(x)
    assert same is x and view._base is x
    assert exe.memory_stats["total_bytes"] == 16384 and exe.aliases == []
    exe = hloalias.jit(seed)
    same, view = exe(x)
    assert same is x and view._base is x
    stats = disk_cache_stats()
    print("CHILD", int(xla_bridge.backends_are_initialized()), stats.xla_compiles, exe.stats.compiles)
    """
)


@pytest.mark.parametrize("program_cache", ["empty", "warm"])
def test_a_fresh_process_never_starts_jax_backend(tmp_path: Any, program_cache: str) -> None:
    """In a new process, the seed compiled, called, its figures read and
    compiled again through ``hloalias.jit``: jax's backend never started,
    XLA compiled nothing; also when the program comes from the program
    cache (a second process on the same cache directory)."""
    env = dict(os.environ, HLOALIAS_CACHE_DIR=str(tmp_path / "cache"),
               HLOALIAS_CACHE_KEY_FILE=str(tmp_path / "keys" / "cache-key"))
    env.pop("HLOALIAS_CACHE", None)
    env.pop("HLOALIAS_PROGRAM_CACHE", None)
    runs = 2 if program_cache == "warm" else 1
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        line = [line for line in done.stdout.splitlines() if line.startswith("CHILD")][0]
        assert line.split()[1:] == ["0", "0", "1"], line
    assert not [name for name in os.listdir(tmp_path / "cache") if name.endswith(".xla")]
