"""Every zero-copy DLPack import of a call (a caller's tensor, a copy the
Python path makes for the call) crosses with its release guarded
(runtime/ownership.py's docstring, ``_lane.guard_dlpack``): torch's deleter
runs at once on a thread that holds the GIL, and is queued, without
touching Python, when PJRT's worker drops the import (after a call it can
be the worker, a moment after the results were ready); the next import or
the exit hook runs the queue.  Without that, torch's deleter took the GIL
on the worker, and a process already finalizing after its last call, on a
temporary, aborted ("terminate called without an active exception").

The checks do not depend on timing: they count the exports the calls make
against the guarded ones, hold an import in a running program (a host
callback waiting on an event) so that the worker is what drops it, and
run child processes that end right after calls on temporaries (on the old
code those were a race; here they are a smoke check)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import hloalias
from hloalias.runtime import ownership

pytestmark = pytest.mark.skipif(
    getattr(ownership, "_guard_dlpack", "old code") is None,
    reason="the native extension is not built: imports are not guarded (ownership's docstring)",
)


@pytest.fixture(params=["native", "python"])
def call_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both call paths (``HLOALIAS_NATIVE`` is read when an executable is made)."""
    if request.param == "python":
        monkeypatch.setenv("HLOALIAS_NATIVE", "0")
    yield str(request.param)


def _affine(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def _counted(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """Counters of torch's DLPack exports and of the guarded ones."""
    exports, guarded = [0], [0]
    export = ownership._torch_to_dlpack
    guard = ownership._guard_dlpack
    assert guard is not None

    def counted_export(tensor: torch.Tensor) -> Any:
        exports[0] += 1
        return export(tensor)

    def counted_guard(capsule: Any) -> Any:
        guarded[0] += 1
        return guard(capsule)

    monkeypatch.setattr(ownership, "_torch_to_dlpack", counted_export)
    monkeypatch.setattr(ownership, "_guard_dlpack", counted_guard)
    return exports, guarded


def test_every_import_of_a_temporary_is_guarded(call_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = hloalias.compile(_affine, (torch.ones(64, 64),))
    assert (exe._lane is not None) == (call_path == "native")
    exports, guarded = _counted(monkeypatch)
    for _ in range(5):
        exe(torch.ones(64, 64))  # a temporary: a new import each call
    assert exports[0] == 5
    assert guarded[0] == exports[0]


@pytest.mark.parametrize("form", ["non-contiguous", "negative bit"])
def test_the_python_paths_own_copies_are_guarded(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs the lane leaves to the Python path, which imports a copy
    made for the call (it dies with the call)."""
    exe = hloalias.compile(_affine, (torch.ones(64, 64),))
    base = torch.arange(64.0 * 64).reshape(64, 64)
    x = base.t() if form == "non-contiguous" else torch.ones(64, 64)._neg_view()
    expected = _affine(x.resolve_neg())
    exports, guarded = _counted(monkeypatch)
    for _ in range(3):
        torch.testing.assert_close(exe(x), expected)
    assert exports[0] == 3
    assert guarded[0] == exports[0]


def _release_on_a_thread_without_python(capsule: Any) -> None:
    """What PJRT's worker does with an import it drops: call the capsule's
    DLManagedTensor deleter on a thread Python never ran on (a pthread
    started from C; joined with the GIL released, as ctypes calls are)."""
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    managed = api.PyCapsule_GetPointer(capsule, b"dltensor")
    # DLManagedTensor: a DLTensor (48 bytes on 64-bit), manager_ctx, deleter.
    deleter = ctypes.c_void_p.from_address(managed + 56).value
    api.PyCapsule_SetName(capsule, b"used_dltensor")  # consumed, as jaxlib marks it
    libc = ctypes.CDLL(None)
    thread = ctypes.c_ulong()
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    assert libc.pthread_create(ctypes.byref(thread), None, deleter, managed) == 0
    assert libc.pthread_join(thread, None) == 0


def test_a_release_on_a_thread_without_the_gil_waits_for_it() -> None:
    """An import released on a thread without the GIL: torch's deleter
    (which drops the import's hold on the tensor) has not run when that
    thread is done; it runs at the next drain, on this thread."""
    native = ownership._native
    ownership.drain_releases()
    tensor = torch.ones(1024)
    # Holders of the TensorImpl: the export's is dropped by torch's deleter.
    users = getattr(tensor, "_use_count")
    before = users()
    capsule = ownership._export(tensor)
    assert users() == before + 1
    stats = native.release_stats()
    _release_on_a_thread_without_python(capsule)
    after = native.release_stats()
    assert after[1] == stats[1] + 1 and after[3] == stats[3] + 1  # queued
    assert users() == before + 1  # torch's deleter did not run there
    assert ownership.drain_releases() == 1
    assert users() == before
    assert native.release_stats()[3] == 0


def test_a_release_on_a_python_thread_without_the_gil_runs_at_once() -> None:
    """jaxlib deletes an array with the GIL released: that release runs
    torch's deleter at once on the calling thread (it takes the GIL
    itself), so a dropped tensor's memory goes with it, not at the next
    import."""
    native = ownership._native
    tensor = torch.ones(1024)
    users = getattr(tensor, "_use_count")
    before = users()
    capsule = ownership._export(tensor)
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    managed = api.PyCapsule_GetPointer(capsule, b"dltensor")
    deleter = ctypes.c_void_p.from_address(managed + 56).value
    api.PyCapsule_SetName(capsule, b"used_dltensor")
    stats = native.release_stats()
    # A ctypes function pointer is called with the GIL released.
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(deleter)(managed)
    after = native.release_stats()
    assert after[0] == stats[0] + 1 and after[1] == stats[1]
    assert users() == before


def test_a_release_on_a_python_thread_runs_at_once() -> None:
    native = ownership._native
    tensor = torch.ones(1024)
    users = getattr(tensor, "_use_count")
    before = users()
    stats = native.release_stats()
    del_capsule = ownership._export(tensor)
    del del_capsule  # torch's capsule destructor, on this thread: the guarded deleter
    after = native.release_stats()
    assert after[0] == stats[0] + 1 and after[1] == stats[1]
    assert users() == before


_CHILD = textwrap.dedent(
    """
    import os, torch, hloalias

    def affine(x):
        return x * 2 + 1

    native = hloalias.compile(affine, (torch.ones(64, 64),))
    os.environ["HLOALIAS_NATIVE"] = "0"
    python = hloalias.compile(affine, (torch.ones(64, 64),))
    assert native._lane is not None and python._lane is None
    for _ in range(200):
        native(torch.ones(64, 64))
        python(torch.ones(64, 64))
        python(torch.ones(64, 64).t())  # the Python path's own copy
    print("CALLED", flush=True)
    native(torch.ones(64, 64))
    # Ends at once: the last call's temporary is the newest import when the
    # interpreter finalizes.
    """
)


@pytest.mark.parametrize("run", range(3))
def test_a_process_ending_right_after_calls_on_temporaries_exits_cleanly(run: int, tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "child.py")
    with open(path, "w") as handle:
        handle.write(_CHILD)
    done = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "CALLED" in done.stdout
