"""Shared fixtures of hloalias's pytest suite."""

from __future__ import annotations

import os

# Several CPU devices for the multi-device tests: XLA reads this once, when
# jax's CPU client starts, so it is set before anything imports jax.  It
# changes nothing for single-device programs (they run on device 0).
HOST_DEVICE_COUNT = 4
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={HOST_DEVICE_COUNT}"
    ).strip()

# The suite's compiles use caches of their own (a fresh directory per run),
# never the user's: a program cached by an earlier run (or by a test that
# patched hloalias's internals) must not serve this run's, and the suite
# must pass on a machine whose cache is empty, as CI's first run is.
if "HLOALIAS_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["HLOALIAS_CACHE_DIR"] = tempfile.mkdtemp(prefix="hloalias-test-cache-")

import warnings
from collections.abc import Callable, Iterator

import pytest

import hloalias
from hloalias.runtime.pjrt import MemoryStats, compile_module, device_for, memory_stats


# torch 2.13's pytree warns about ``LeafSpec`` from inside torch.export on
# every import: noise that says nothing about hloalias.  Only that message
# is ignored; every other FutureWarning still shows.
_LEAFSPEC_FILTER = "ignore:.*LeafSpec.*:FutureWarning"


def pytest_configure(config: pytest.Config) -> None:
    """Filter torch's LeafSpec FutureWarning everywhere, including the setup
    of module-scoped fixtures (which run before any function fixture)."""
    config.addinivalue_line("filterwarnings", _LEAFSPEC_FILTER)


@pytest.fixture(autouse=True)
def _ignore_torch_leafspec_warning() -> Iterator[None]:
    """The same filter for code a test runs under its own
    ``warnings.catch_warnings`` (e.g. ``pytest.warns`` blocks record all)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        yield


@pytest.fixture
def fresh_cache() -> Iterator[None]:
    """An empty executable cache with zeroed counters, for tests that count
    compiles; emptied again afterwards so no test sees another's entries."""
    hloalias.clear_cache()
    yield
    hloalias.clear_cache()


@pytest.fixture
def fresh_shape_families(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Shape families on, the program cache off, and every in-process
    cache of compiled programs, exports and families empty before and
    after (the shape-family tests count exports and specializations).
    The dynamic export at the second size (``static_sizes()`` 1): these
    tests are about what that export serves, from two compiles; the
    default's static second size is tested on its own
    (``test_shape_family.py``, ``static_second_size``)."""
    from hloalias.runtime import export_cache, shape_family

    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "0")
    monkeypatch.delenv("HLOALIAS_SHAPE_FAMILY", raising=False)
    monkeypatch.setenv("HLOALIAS_SHAPE_FAMILY_STATIC_SIZES", "1")
    hloalias.clear_cache()
    export_cache.clear_export_cache()
    shape_family.clear_shape_families()
    yield
    shape_family.clear_shape_families()
    hloalias.clear_cache()


def _compile_text_for_memory(module_text: str) -> MemoryStats:
    """Compile final StableHLO ``module_text`` on the CPU PJRT client and
    return XLA's memory figures (what ``hloalias-opt --xla-compile`` prints)."""
    return memory_stats(compile_module(module_text, device_for("cpu")))


@pytest.fixture
def xla_memory_of_text() -> Callable[[str], MemoryStats]:
    """``f(module_text) -> MemoryStats``: XLA's figures for a module that
    was transformed outside :func:`hloalias.compile` (passes run by hand)."""
    return _compile_text_for_memory
