"""``hloalias.compile`` reuses one MLIR context across compiles for a
bounded budget (:class:`hloalias.mlir.ContextPool`): a context serves at
most ``max_uses`` compiles and none after ``max_bytes`` of modules, a
compile with resource blobs ends its context's reuse, concurrent compiles
never share a context, and what compiles after a recycle computes what
eager does."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import hloalias
from hloalias import mlir
from hloalias.mlir import CONTEXT_POOL, ContextPool, compile_context, context_lease
from hloalias.runtime import executable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[ContextPool]:
    """The process's pool, emptied, with every cache off (each compile
    imports again)."""
    monkeypatch.setenv("HLOALIAS_CACHE", "0")
    CONTEXT_POOL.clear()
    hloalias.clear_cache()
    yield CONTEXT_POOL
    CONTEXT_POOL.clear()


def _contexts_of_compiles(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Records the context each compile's pass pipeline runs in."""
    seen: list[Any] = []
    original = executable.run_pipeline

    def spy(module: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(module.context)
        return original(module, *args, **kwargs)

    monkeypatch.setattr(executable, "run_pipeline", spy)
    return seen


def _scaled(index: int) -> Any:
    # A distinct program per index (its own constant and shape).
    return lambda x: (x * (index + 2)).sum(0) + index


def test_context_is_reused_then_recycled_after_its_budget(
    pool: ContextPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool, "max_uses", 3)
    seen = _contexts_of_compiles(monkeypatch)
    for index in range(7):
        x = torch.randn(index + 2, 3)
        exe = hloalias.compile(_scaled(index), (x,))
        torch.testing.assert_close(exe(x), _scaled(index)(x))
    assert len(seen) == 7
    first, second, third = seen[0], seen[3], seen[6]
    assert all(context is first for context in seen[:3])
    assert all(context is second for context in seen[3:6])
    assert first is not second and third is not second and third is not first


def test_a_lease_within_a_lease_is_the_same_context(pool: ContextPool) -> None:
    with context_lease() as outer:
        assert compile_context() is outer.context
        with context_lease() as inner:
            assert inner is outer
    assert CONTEXT_POOL.current() is None
    # Outside a lease every call gets a new context, as before the pool.
    assert compile_context() is not compile_context()


def test_context_is_recycled_after_its_byte_budget(pool: ContextPool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "max_bytes", 1)  # any module spends it
    seen = _contexts_of_compiles(monkeypatch)
    for index in range(3):
        x = torch.randn(4, 3)
        exe = hloalias.compile(_scaled(index), (x,))
        torch.testing.assert_close(exe(x), _scaled(index)(x))
    assert len({id(context) for context in seen}) == 3


def test_resource_blobs_end_reuse_so_texts_do_not_depend_on_history(
    pool: ContextPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``as_strided`` imports ``dense_resource`` index constants; a second
    blob of the same name in one context is renamed (``..._1``), so the
    same program compiled again in a reused context had another text
    (another executable cache key).  Such a compile retires its context."""
    seen = _contexts_of_compiles(monkeypatch)

    def strided(x: torch.Tensor) -> torch.Tensor:
        return x.as_strided((2, 2), (1, 2), 1) * 3

    x = torch.randn(3, 4)
    texts = []
    for _ in range(3):
        hloalias.clear_cache()
        exe = hloalias.compile(strided, (x,))
        assert "dense_resource<" in exe.mlir
        torch.testing.assert_close(exe(x), strided(x))
        texts.append(exe.mlir)
    assert texts[0] == texts[1] == texts[2]
    assert len({id(context) for context in seen}) == 3


def test_concurrent_compiles_never_share_a_context(pool: ContextPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads compile at once across recycles (two uses a context):
    no context is leased to two threads at the same time, and every
    program computes what eager does."""
    monkeypatch.setattr(pool, "max_uses", 2)
    held: set[int] = set()
    overlaps: list[int] = []
    guard = threading.Lock()
    original = ContextPool.lease

    @contextlib.contextmanager
    def checked(self: ContextPool) -> Iterator[Any]:
        outer = self.current() is None
        with original(self) as lease:
            key = id(lease.context)
            if outer:
                with guard:
                    if key in held:
                        overlaps.append(key)
                    held.add(key)
            try:
                yield lease
            finally:
                if outer:
                    with guard:
                        held.discard(key)

    monkeypatch.setattr(ContextPool, "lease", checked)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def run(index: int) -> None:
        try:
            barrier.wait()
            for round_ in range(3):
                x = torch.randn(index + 2, round_ + 2)
                fn = _scaled(index * 3 + round_)
                exe = hloalias.compile(fn, (x,))
                torch.testing.assert_close(exe(x), fn(x))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert overlaps == []
    assert CONTEXT_POOL.retired >= 1  # some context was recycled on the way


def test_a_forked_child_compiles_in_contexts_of_its_own() -> None:
    """A context taken over a fork has no MLIR worker threads in the
    child: the child neither reuses the parent's idle contexts nor returns
    one it inherited mid-lease.  (View-only programs: no XLA in either.)"""
    script = (
        "import os, torch, hloalias\n"
        "from hloalias.mlir import CONTEXT_POOL, context_lease\n"
        "f = lambda x: (x, x[0:8].view(2, 4))\n"
        "x = torch.randn(16)\n"
        "hloalias.compile(f, (x,))\n"
        "assert len(CONTEXT_POOL._idle) == 1\n"
        "with context_lease() as lease:\n"
        "    parent = lease.context\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        ok = CONTEXT_POOL._idle == [] and CONTEXT_POOL.current() is None\n"
        "        hloalias.compile(f, (torch.randn(16),))\n"
        "        ok = ok and len(CONTEXT_POOL._idle) == 1 and CONTEXT_POOL._idle[0].context is not parent\n"
        "if pid == 0:  # the inherited lease has ended: not taken back\n"
        "    ok = ok and len(CONTEXT_POOL._idle) == 1 and CONTEXT_POOL._idle[0].context is not parent\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0, status\n"
        "print('ok')\n"
    )
    env = dict(os.environ, HLOALIAS_CACHE="0")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")


def test_pool_size_is_bounded(pool: ContextPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most ``max_idle`` contexts wait between leases."""
    monkeypatch.setattr(pool, "max_idle", 1)
    with context_lease() as first:
        done = threading.Event()
        other: list[Any] = []

        def hold() -> None:
            with context_lease() as lease:
                other.append(lease.context)
            done.set()

        thread = threading.Thread(target=hold)
        thread.start()
        thread.join()
        assert done.is_set() and other[0] is not first.context
    assert len(mlir.CONTEXT_POOL._idle) == 1


def _programs() -> list[tuple[str, Any, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4)
    conv = torch.nn.Conv2d(3, 4, 3)
    norm = torch.nn.LayerNorm(8)
    return [
        ("seed", lambda x: (x, x[0:8].view(2, 4)), (torch.randn(16),)),
        ("linear", linear, (torch.randn(2, 8),)),
        ("erf_bf16", lambda x: torch.erf(x).to(torch.bfloat16).sum(0), (torch.randn(4, 8),)),
        ("conv", conv, (torch.randn(1, 3, 6, 6),)),
        ("softmax_norm", lambda x: torch.softmax(norm(x), -1).cumsum(0), (torch.randn(3, 8),)),
        ("index_put", lambda x, i: x.index_put((i,), torch.ones(2, 8)), (torch.randn(5, 8), torch.tensor([0, 3]))),
        ("matmul_relu", lambda a, b: torch.relu(a @ b).amax(1), (torch.randn(4, 6), torch.randn(6, 5))),
    ]


def test_reused_context_and_pass_managers_give_a_new_contexts_modules(
    pool: ContextPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each program, compiled in one reused context after the others (and
    twice: the lowering's pass managers run again), has the final module
    it has compiled in a new context, and computes what eager does."""
    programs = _programs()
    monkeypatch.setattr(pool, "max_uses", 1)
    fresh = {name: hloalias.compile(fn, args).mlir for name, fn, args in programs}
    pool.clear()
    monkeypatch.setattr(pool, "max_uses", 100)
    seen = _contexts_of_compiles(monkeypatch)
    for _ in range(2):
        for name, fn, args in programs:
            hloalias.clear_cache()
            exe = hloalias.compile(fn, args)
            assert exe.mlir == fresh[name], name
            torch.testing.assert_close(exe(*args), fn(*args))
    assert len({id(context) for context in seen}) == 1


def test_lowering_pass_managers_are_kept_per_leased_context(pool: ContextPool) -> None:
    pipeline = "builtin.module(canonicalize)"
    with context_lease() as lease:
        first = mlir.lowering_pass_manager(pipeline, lease.context)
        assert mlir.lowering_pass_manager(pipeline, lease.context) is first
        other = mlir.new_context()
        assert mlir.lowering_pass_manager(pipeline, other) is not mlir.lowering_pass_manager(pipeline, other)
        mlir.drop_pass_manager(pipeline, lease.context)  # after a failed run
        assert mlir.lowering_pass_manager(pipeline, lease.context) is not first
    # Outside the lease the context's pass managers are not handed out.
    assert mlir.lowering_pass_manager(pipeline, lease.context) is not mlir.lowering_pass_manager(
        pipeline, lease.context)
