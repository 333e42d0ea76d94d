"""The persistent XLA executable cache (runtime/disk_cache.py), the
in-process import cache (runtime/export_cache.py) and the cached
decomposition split (frontend/importer.decompose).  Compiles are counted
through the caches' hooks, never timed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator

import pytest
import torch
from torch_mlir.extras.fx_decomp_util import get_decomposition_table

import hloalias
from hloalias.frontend.importer import decompose
from hloalias.runtime import disk_cache, export_cache
from hloalias.runtime.disk_cache import CacheWarning, disk_cache_stats


@pytest.fixture
def cache_dir(tmp_path: "os.PathLike[str]", monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private, empty disk cache; in-process caches emptied around the test."""
    directory = os.path.join(str(tmp_path), "xla-cache")
    monkeypatch.setenv("HLOALIAS_CACHE_DIR", directory)
    monkeypatch.setenv("HLOALIAS_CACHE_KEY_FILE", os.path.join(str(tmp_path), "keys", "cache-key"))
    monkeypatch.delenv("HLOALIAS_CACHE", raising=False)
    monkeypatch.delenv("HLOALIAS_CACHE_MAX_BYTES", raising=False)
    hloalias.clear_cache()
    export_cache.clear_export_cache()
    yield directory
    hloalias.clear_cache()
    export_cache.clear_export_cache()


def _entries(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []
    return sorted(name for name in os.listdir(directory) if name.endswith(".xla"))


def _affine(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


_CHILD = textwrap.dedent(
    """
    import warnings, torch, hloalias
    from hloalias.runtime.disk_cache import disk_cache_stats
    warnings.simplefilter("error", hloalias.runtime.disk_cache.CacheWarning)
    def seed(x):  # the seed with one computed result (a view-only program never reaches XLA)
        return x, (x[0:1024] * 2).view(2, 512)
    x = torch.arange(4096, dtype=torch.float32)
    exe = hloalias.compile(seed, (x,))
    same, computed = exe(x)
    assert torch.equal(computed, (x[0:1024] * 2).view(2, 512)) and same is x
    stats = disk_cache_stats()
    print("STATS", stats.xla_compiles, stats.hits, stats.misses, exe.memory_stats["total_bytes"])
    """
)


def _run_child(directory: str) -> list[int]:
    env = dict(os.environ, HLOALIAS_CACHE_DIR=directory)  # the key file: the fixture's
    env.pop("HLOALIAS_CACHE", None)
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    line = [line for line in done.stdout.splitlines() if line.startswith("STATS")][0]
    return [int(part) for part in line.split()[1:]]


def test_a_fresh_process_compiling_a_known_program_never_reaches_xla(cache_dir: str) -> None:
    first = _run_child(cache_dir)
    assert first == [1, 0, 1, 16384 + 4096]  # one XLA compile, written to the cache
    assert len(_entries(cache_dir)) == 1
    second = _run_child(cache_dir)
    assert second == [0, 1, 0, 16384 + 4096]  # a new process: loaded, no XLA compile


def test_corrupt_entry_warns_and_recompiles(cache_dir: str) -> None:
    x = torch.randn(64)
    hloalias.compile(_affine, (x,))
    (name,) = _entries(cache_dir)
    path = os.path.join(cache_dir, name)
    for damage in ("truncate", "flip", "garbage"):
        with open(path, "rb") as handle:
            data = handle.read()
        if damage == "truncate":
            data = data[: len(data) // 2]
        elif damage == "flip":
            data = data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]
        else:
            data = b"not a cache entry"
        with open(path, "wb") as handle:
            handle.write(data)
        hloalias.clear_cache()
        export_cache.clear_export_cache()
        compiles = disk_cache_stats().xla_compiles
        with pytest.warns(CacheWarning, match="ignoring entry"):
            exe = hloalias.compile(_affine, (x,))
        assert disk_cache_stats().xla_compiles == compiles + 1
        assert torch.equal(exe(x), x * 2 + 1)
        assert _entries(cache_dir) == [name]  # rewritten whole


def test_an_entry_for_another_key_is_never_loaded(cache_dir: str) -> None:
    x = torch.randn(64)
    hloalias.compile(_affine, (x,))
    (own,) = _entries(cache_dir)
    hloalias.compile(lambda t: t - 3, (x,))
    first = os.path.join(cache_dir, own)
    (second,) = (os.path.join(cache_dir, n) for n in _entries(cache_dir) if n != own)
    with open(second, "rb") as handle:
        foreign = handle.read()
    with open(first, "wb") as handle:  # another program's bytes under this key
        handle.write(foreign)
    hloalias.clear_cache()
    export_cache.clear_export_cache()
    with pytest.warns(CacheWarning, match="another key"):
        exe = hloalias.compile(_affine, (x,))
    assert torch.equal(exe(x), x * 2 + 1)


def test_different_aliasing_is_a_different_entry(cache_dir: str) -> None:
    x = torch.randn(1024)
    plain = hloalias.compile(_affine, (x,))
    donated = hloalias.compile(_affine, (x,), donate=[0])
    assert len(_entries(cache_dir)) == 2
    assert plain.memory_stats["alias_bytes"] == 0
    assert donated.memory_stats["alias_bytes"] == 4096
    hloalias.clear_cache()
    export_cache.clear_export_cache()
    compiles = disk_cache_stats().xla_compiles
    again = hloalias.compile(_affine, (x,), donate=[0])
    assert disk_cache_stats().xla_compiles == compiles  # from disk
    assert again.memory_stats == donated.memory_stats
    assert torch.equal(again(x.clone()), x * 2 + 1)


def test_disabled_by_environment(cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_CACHE", "0")
    x = torch.randn(64)
    compiles = disk_cache_stats().xla_compiles
    hloalias.compile(_affine, (x,))
    assert _entries(cache_dir) == []
    assert disk_cache_stats().xla_compiles == compiles + 1


def test_size_bound_evicts_least_recently_used(cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(64)
    hloalias.compile(_affine, (x,))
    (oldest,) = _entries(cache_dir)
    size = os.path.getsize(os.path.join(cache_dir, oldest))
    os.utime(os.path.join(cache_dir, oldest), (1, 1))
    monkeypatch.setenv("HLOALIAS_CACHE_MAX_BYTES", str(size + size // 2))
    hloalias.compile(lambda t: t - 3, (x,))
    remaining = _entries(cache_dir)
    assert len(remaining) == 1 and oldest not in remaining


# -- trust: ownership, permissions, the per-user MAC ---------------------------


def _times_hundred(x: torch.Tensor) -> torch.Tensor:
    return x * 100


def _fresh() -> None:
    hloalias.clear_cache()
    export_cache.clear_export_cache()
    getattr(disk_cache, "_WARNED", set()).clear()


def test_a_directory_writable_by_others_is_not_used(cache_dir: str) -> None:
    x = torch.randn(64)
    hloalias.compile(_affine, (x,))
    (name,) = _entries(cache_dir)
    os.chmod(cache_dir, 0o777)
    _fresh()
    compiles = disk_cache_stats().xla_compiles
    with pytest.warns(CacheWarning, match="writable by group or others"):
        exe = hloalias.compile(_affine, (x,))
    assert disk_cache_stats().xla_compiles == compiles + 1  # the entry was not read
    assert torch.equal(exe(x), x * 2 + 1)
    hloalias.clear_cache()
    export_cache.clear_export_cache()
    import warnings as _warnings

    with _warnings.catch_warnings():
        _warnings.simplefilter("error", CacheWarning)  # warned once per directory
        hloalias.compile(lambda t: t - 3, (x,))
    assert _entries(cache_dir) == [name]  # nothing written there either
    assert disk_cache_stats().xla_compiles == compiles + 2


def test_a_directory_owned_by_another_user_is_not_used(cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(64)
    hloalias.compile(_affine, (x,))
    _fresh()
    monkeypatch.setattr(disk_cache, "_expected_owner", lambda: os.geteuid() + 4242)
    compiles = disk_cache_stats().xla_compiles
    with pytest.warns(CacheWarning, match="owned by uid"):
        exe = hloalias.compile(_affine, (x,))
    assert disk_cache_stats().xla_compiles == compiles + 1
    assert torch.equal(exe(x), x * 2 + 1)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_an_entry_owned_by_another_user_is_not_used(cache_dir: str) -> None:
    x = torch.randn(64)
    hloalias.compile(_affine, (x,))
    (name,) = _entries(cache_dir)
    os.chown(os.path.join(cache_dir, name), 4242, 4242)
    _fresh()
    compiles = disk_cache_stats().xla_compiles
    with pytest.warns(CacheWarning, match="owned by uid 4242"):
        exe = hloalias.compile(_affine, (x,))
    assert disk_cache_stats().xla_compiles == compiles + 1
    assert torch.equal(exe(x), x * 2 + 1)
    assert os.stat(os.path.join(cache_dir, name)).st_uid == os.geteuid()  # replaced by ours


def test_an_entry_writable_by_others_is_not_used(cache_dir: str) -> None:
    x = torch.randn(64)
    hloalias.compile(_affine, (x,))
    (name,) = _entries(cache_dir)
    os.chmod(os.path.join(cache_dir, name), 0o666)
    _fresh()
    with pytest.warns(CacheWarning, match="writable by group or others"):
        exe = hloalias.compile(_affine, (x,))
    assert torch.equal(exe(x), x * 2 + 1)


def _plant(cache_dir: str, victim: str, donor_payload: bytes, mac: bytes) -> None:
    with open(os.path.join(cache_dir, victim), "wb") as handle:
        handle.write(disk_cache.MAGIC + victim[:64].encode() + mac + donor_payload)


def test_a_planted_entry_is_never_run(cache_dir: str) -> None:
    """Another program's executable under this program's key, with the
    checksum recomputed (plain SHA-256, as the old format had) or with a MAC
    under another user's secret: rejected, and the result is this program's."""
    x = torch.randn(64)
    hloalias.compile(_affine, (x,))
    (victim,) = _entries(cache_dir)
    hloalias.compile(_times_hundred, (x,))
    (donor,) = [n for n in _entries(cache_dir) if n != victim]
    with open(os.path.join(cache_dir, donor), "rb") as handle:
        donor_payload = handle.read()[len(disk_cache.MAGIC) + 64 + 32:]
    other_secret = os.urandom(32)
    for forged_by in ("plain checksum", "another user's secret"):
        if forged_by == "plain checksum":
            mac = hashlib.sha256(donor_payload).digest()
        else:
            mac = disk_cache._mac(other_secret, disk_cache.XLA_SUFFIX, victim[:64], donor_payload)
        _plant(cache_dir, victim, donor_payload, mac)
        _fresh()
        compiles = disk_cache_stats().xla_compiles
        with pytest.warns(CacheWarning, match="MAC does not verify"):
            exe = hloalias.compile(_affine, (x,))
        assert disk_cache_stats().xla_compiles == compiles + 1
        assert torch.equal(exe(x), x * 2 + 1)


def test_a_key_file_others_can_read_turns_the_cache_off(cache_dir: str) -> None:
    x = torch.randn(64)
    hloalias.compile(_affine, (x,))
    key = disk_cache.key_file()
    assert os.stat(key).st_mode & 0o777 == 0o600
    os.chmod(key, 0o644)
    _fresh()
    compiles = disk_cache_stats().xla_compiles
    with pytest.warns(CacheWarning, match="readable by group or others"):
        exe = hloalias.compile(_affine, (x,))
    assert disk_cache_stats().xla_compiles == compiles + 1
    assert torch.equal(exe(x), x * 2 + 1)


# -- in-process import cache ---------------------------------------------------


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8))
        self.factor = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight * self.factor


def test_same_module_same_inputs_reuses_the_import(cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "0")  # this is about the in-process import cache
    module = _Scaled()
    x = torch.randn(8)
    hloalias.compile(module, (x,))
    again = hloalias.compile(module, (torch.randn(8),))
    assert export_cache.export_cache_stats()["hits"] == 1
    assert torch.allclose(again(x), module(x))


class _Accumulates(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x)  # written state: compiling adds the state group's sync hook
        return self.total * 2


def test_a_module_with_written_state_reuses_its_import(cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The forward pre-hook that brings lagging state into the module made
    # the module's second compile miss the import cache (the key held the
    # hook's identity) and count as uncacheable for the program cache.
    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "0")
    module = _Accumulates()
    x = torch.ones(8)
    first = hloalias.compile(module, (x,))
    assert module._forward_pre_hooks  # the sync hook
    before = export_cache.export_cache_stats()["hits"]
    again = hloalias.compile(module, (x,))
    assert export_cache.export_cache_stats()["hits"] == before + 1
    assert torch.equal(first(x), torch.full((8,), 2.0)) and torch.equal(again(x), torch.full((8,), 4.0))
    assert source_key.source_key(module, (x,), {}, ()) is not None
    module.register_forward_pre_hook(lambda m, args: None)  # the user's own hook still counts
    with pytest.raises(Uncacheable, match="forward hooks"):
        source_key.source_key(module, (x,), {}, ())


def test_changed_module_or_inputs_are_imported_again(cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The in-process import cache alone: with the program cache on, a
    # replaced tensor of the same shape is (rightly) a program-cache hit,
    # and whether the earlier program's state is still on the device, which
    # decides if that entry is usable, depends on when it was collected.
    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "0")
    module = _Scaled()
    x = torch.randn(8)
    hloalias.compile(module, (x,))
    stats = export_cache.export_cache_stats()
    module.factor = 3.0  # a static value forward reads
    exe = hloalias.compile(module, (x,))
    assert torch.allclose(exe(x), module(x))
    with torch.no_grad():
        module.weight.mul_(-1)  # new parameter values (version counter)
    exe = hloalias.compile(module, (x,))
    assert torch.allclose(exe(x), module(x))
    module.weight = torch.nn.Parameter(torch.randn(8))  # replaced tensor
    exe = hloalias.compile(module, (x,))
    assert torch.allclose(exe(x), module(x))
    module.train(False)
    exe = hloalias.compile(module, (x,))
    y = torch.randn(2, 8)  # another input shape
    exe = hloalias.compile(module, (y,))
    assert torch.allclose(exe(y), module(y))
    assert stats["hits"] == 0 and stats["misses"] == 6


def test_entries_die_with_their_module(cache_dir: str) -> None:
    import gc

    module = _Scaled()
    hloalias.compile(module, (torch.randn(8),))
    assert len(export_cache._ENTRIES) == 1
    del module
    gc.collect()
    assert len(export_cache._ENTRIES) == 0


def test_the_import_cache_keeps_hloalias_export_cache_size_entries(
    cache_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HLOALIAS_EXPORT_CACHE_SIZE bounds the import cache, read at each new
    entry, least recently used dropped first; 0 keeps none."""
    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "0")  # this is about the in-process import cache
    monkeypatch.setenv("HLOALIAS_EXPORT_CACHE_SIZE", "2")
    modules = [_Scaled() for _ in range(3)]
    x = torch.randn(8)
    for module in modules:
        hloalias.compile(module, (x,))
    assert len(export_cache._ENTRIES) == 2
    stats = export_cache.export_cache_stats()
    hloalias.compile(modules[0], (x,))  # the oldest went: imported again
    assert (stats["hits"], stats["misses"]) == (0, 4)
    hloalias.compile(modules[2], (x,))
    assert stats["hits"] == 1
    monkeypatch.setenv("HLOALIAS_EXPORT_CACHE_SIZE", "0")
    hloalias.compile(_Scaled(), (x,))
    assert len(export_cache._ENTRIES) == 0


def test_closure_values_are_part_of_the_key(cache_dir: str) -> None:
    x = torch.randn(8)

    def make(offset: float):  # type: ignore[no-untyped-def]
        def shifted(t: torch.Tensor) -> torch.Tensor:
            return t + offset
        return shifted

    first = hloalias.compile(make(1.0), (x,))
    second = hloalias.compile(make(5.0), (x,))
    assert torch.allclose(first(x), x + 1) and torch.allclose(second(x), x + 5)
    assert export_cache.export_cache_stats()["hits"] == 0


def test_unfingerprintable_module_is_not_cached(cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # About the import cache: the program cache would serve the second
    # compile (as it did whenever the first executable was collected first).
    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "0")
    module = _Scaled()
    module.table = [1, 2]  # type: ignore[assignment]  # a list: no key, no reuse
    x = torch.randn(8)
    hloalias.compile(module, (x,))
    hloalias.compile(module, (x,))
    stats = export_cache.export_cache_stats()
    assert stats["hits"] == 0 and stats["uncacheable"] == 2


def test_decompose_equals_run_decompositions() -> None:
    class Mixed(torch.nn.Module):
        count: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 4)
            self.register_buffer("count", torch.zeros(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.count.add_(1)
            return torch.nn.functional.gelu(self.linear(x)).softmax(-1) + self.count

    exported = torch.export.export(Mixed(), (torch.randn(2, 8),), strict=False)
    for _ in range(2):  # the second call uses the cached split
        ours = decompose(exported)
        theirs = exported.run_decompositions(get_decomposition_table())
        assert str(ours.graph) == str(theirs.graph)
        assert ours.graph_signature == theirs.graph_signature


def test_disk_cache_default_location(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HLOALIAS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert disk_cache.cache_dir() == "/somewhere/hloalias/xla"


GLOBAL_SCALE = 2.0
GLOBAL_SHIFT = 0.5
GLOBAL_TABLE = [1.0]


def _shift(t: torch.Tensor) -> torch.Tensor:
    return t + GLOBAL_SHIFT


class _ReadsGlobals(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _shift(x * GLOBAL_SCALE)


class _ReadsMutableGlobal(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * GLOBAL_TABLE[0]


def test_globals_read_by_forward_and_its_helpers_are_part_of_the_key(
    cache_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    global GLOBAL_SCALE, GLOBAL_SHIFT
    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "0")  # this is about the in-process import cache
    module = _ReadsGlobals()
    x = torch.randn(8)
    try:
        first = hloalias.compile(module, (x,))
        assert torch.allclose(first(x), x * 2.0 + 0.5)
        GLOBAL_SCALE = 3.0  # read by forward
        second = hloalias.compile(module, (x,))
        assert torch.allclose(second(x), x * 3.0 + 0.5)
        GLOBAL_SHIFT = 1.5  # read by a helper forward calls
        third = hloalias.compile(module, (x,))
        assert torch.allclose(third(x), x * 3.0 + 1.5)
        again = hloalias.compile(module, (x,))  # nothing changed: reused
        assert torch.allclose(again(x), x * 3.0 + 1.5)
        stats = export_cache.export_cache_stats()
        assert stats["misses"] == 3 and stats["hits"] == 1
    finally:
        GLOBAL_SCALE, GLOBAL_SHIFT = 2.0, 0.5


def test_a_mutable_global_makes_the_program_uncacheable(cache_dir: str) -> None:
    module = _ReadsMutableGlobal()
    x = torch.randn(8)
    first = hloalias.compile(module, (x,))
    GLOBAL_TABLE[0] = 4.0
    try:
        second = hloalias.compile(module, (x,))
        assert torch.allclose(first(x), x) and torch.allclose(second(x), x * 4.0)
        assert export_cache.export_cache_stats()["uncacheable"] == 2
    finally:
        GLOBAL_TABLE[0] = 1.0


# -- the program cache: a compile keyed before import ----------------------------

from hloalias.runtime import program_cache, source_key  # noqa: E402
from hloalias.runtime.source_key import Uncacheable  # noqa: E402

_MODULE_SOURCE = """
import torch
OFFSET = {offset}

def helper(t):
    return t {op} OFFSET

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.scale = 2.0

    def forward(self, x):
        return helper(self.linear(x) * self.scale)
"""


def _block_class(offset: float = 1.0, op: str = "+") -> type:
    """``Block`` as if defined in a user's file: the same module and
    qualified name whatever its code."""
    namespace: dict[str, object] = {"__name__": "user_models"}
    exec(compile(_MODULE_SOURCE.format(offset=offset, op=op), "user_models.py", "exec"), namespace)
    return namespace["Block"]  # type: ignore[return-value]


def _key(module: object, *args: object, options: object = (), **kwargs: object) -> str:
    return source_key.source_key(module, args, kwargs, options)


def test_the_source_key_changes_with_each_input() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    base = _block_class()()
    key = _key(base, x)
    # The same program built again (other weights, another class object): the same key.
    assert _key(_block_class()(), torch.randn(2, 8)) == key

    def changed(mutate) -> str:  # type: ignore[no-untyped-def]
        module = _block_class()()
        mutate(module)
        return _key(module, x)

    variants = {
        "code of forward's helper": _key(_block_class(op="-")(), x),
        "a global the code reads": _key(_block_class(offset=3.0)(), x),
        "a configuration value": changed(lambda m: setattr(m, "scale", 3.0)),
        "a dtype": changed(lambda m: m.to(torch.float64)),
        "a parameter's shape": changed(lambda m: setattr(m, "linear", torch.nn.Linear(8, 8, bias=False))),
        "requires_grad": changed(lambda m: m.linear.weight.requires_grad_(False)),
        "training mode": changed(lambda m: m.train(False)),
        "a submodule's class": changed(lambda m: setattr(m, "linear", torch.nn.Identity())),
        "an instance-level forward": changed(lambda m: setattr(m, "forward", lambda t: t)),
        "an input shape": _key(base, torch.randn(3, 8)),
        "an input dtype": _key(base, x.double()),
        "an input's strides": _key(base, torch.randn(8, 2).t()),
        "an input's requires_grad": _key(base, x.clone().requires_grad_()),
        "an option": _key(base, x, options=(("argnum", 0),)),
        "a static input": _key(base, x, flag=True),
    }
    with torch.no_grad():
        variants["grad mode"] = _key(base, x)
    for what, other in variants.items():
        assert other != key, what
    assert len(set(variants.values())) == len(variants)


def test_the_source_key_changes_with_hloalias_own_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A version number stays while the code changes (an editable install,
    a pip install from a git commit): an entry compiled by other lowerings
    or passes must not be found."""
    x = torch.randn(2, 8)
    module = _block_class()()
    key = _key(module, x)
    edited = os.path.join(os.path.dirname(source_key.__file__), "..", "passes")
    real_digest = source_key._file_digest

    real_signature = source_key._file_signature

    def edited_file(path: str) -> bool:  # one file of the passes layer edited
        return os.path.basename(path) == "__init__.py" and "passes" in path

    def digest(path: str) -> str:
        return "edited" if edited_file(path) else real_digest(path)

    def signature(path: str) -> str:  # a write gives the file a new change time
        return real_signature(path) + (" edited" if edited_file(path) else "")

    monkeypatch.setattr(source_key, "_file_digest", digest)
    monkeypatch.setattr(source_key, "_file_signature", signature)
    source_key.versions.cache_clear()
    try:
        assert os.path.isdir(edited)
        assert _key(module, x) != key
    finally:
        monkeypatch.undo()
        source_key.versions.cache_clear()
    assert _key(module, x) == key


def _counting_file_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths whose contents the code digest reads from now on, as a new
    process would (the in-process digests of files forgotten)."""
    read: list[str] = []
    real = source_key._file_digest_cached

    def counting(path: str, size: int, mtime_ns: int) -> str:
        read.append(path)
        return real(path, size, mtime_ns)

    counting.cache_clear = real.cache_clear  # type: ignore[attr-defined]
    real.cache_clear()
    monkeypatch.setattr(source_key, "_file_digest_cached", counting)
    return read


def test_own_code_digest_reads_hloalias_files_once_per_version(cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest of hloalias's own code (part of every program-cache key)
    is stored beside the cache's key under the files' stat signatures: a
    new process with the same files reads none of them, and gets the digest
    their contents give."""
    read = _counting_file_reads(monkeypatch)
    first = source_key.own_code_digest()
    files = len(read)
    assert files > 20
    read.clear()
    source_key._file_digest_cached.cache_clear()  # a new process
    assert source_key.own_code_digest() == first
    assert read == []
    # Stored per user, not per cache directory (the digest is not a program's).
    monkeypatch.setenv("HLOALIAS_CACHE_DIR", cache_dir + "-another")
    source_key._file_digest_cached.cache_clear()
    assert source_key.own_code_digest() == first
    assert read == []
    monkeypatch.setenv("HLOALIAS_CACHE", "0")  # nothing stored: from the contents
    assert source_key.own_code_digest() == first
    assert len(read) == files


def test_code_digest_follows_a_write_that_keeps_size_and_mtime(cache_dir: str, tmp_path: "os.PathLike[str]",
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A file rewritten with contents of the same size and its modification
    time set back (as ``cp -p`` or a checkout may leave it) changes the
    digest: its change time is part of the signature the stored digest is
    found under."""
    folder = os.path.join(str(tmp_path), "code")
    os.makedirs(folder)
    files = []
    for name, text in (("a.py", "x = 1\n"), ("b.py", "y = 2\n")):
        path = os.path.join(folder, name)
        with open(path, "w") as handle:
            handle.write(text)
        files.append(("pkg", name, path))
    read = _counting_file_reads(monkeypatch)
    before = source_key._code_digest(files)
    assert len(read) == 2
    read.clear()
    source_key._file_digest_cached.cache_clear()
    assert source_key._code_digest(files) == before and read == []
    info = os.stat(files[0][2])
    with open(files[0][2], "w") as handle:
        handle.write("x = 3\n")
    os.utime(files[0][2], ns=(info.st_atime_ns, info.st_mtime_ns))
    source_key._file_digest_cached.cache_clear()
    after = source_key._code_digest(files)
    assert after != before and len(read) == 2
    expected = hashlib.sha256()
    for package, relative, path in files:
        with open(path, "rb") as handle:
            expected.update(f"{package}:{relative}\0{hashlib.sha256(handle.read()).hexdigest()}\0".encode())
    assert after == expected.hexdigest()


def test_entries_beside_the_key_are_authenticated_and_one_per_name(cache_dir: str) -> None:
    """A per-user entry (the code digest's) is found only for the key it
    was written for, is replaced by the next write, and is rejected when
    its bytes were changed."""
    key_a, key_b = "a" * 64, "b" * 64
    assert disk_cache.write_beside_key("code-test", key_a, ".code", b"payload-a")
    assert disk_cache.read_beside_key("code-test", key_a, ".code") == b"payload-a"
    assert disk_cache.read_beside_key("code-test", key_b, ".code") is None
    assert disk_cache.write_beside_key("code-test", key_b, ".code", b"payload-b")
    assert disk_cache.read_beside_key("code-test", key_a, ".code") is None
    path = os.path.join(os.path.dirname(disk_cache.key_file()), "code-test.code")
    with open(path, "r+b") as handle:
        data = handle.read()
        handle.seek(0)
        handle.write(data[:-1] + b"c")
    with pytest.warns(CacheWarning, match="MAC"):
        assert disk_cache.read_beside_key("code-test", key_b, ".code") is None
    assert not os.path.exists(path)


def _install_fake_library(root: str, version: str) -> None:
    """``keyedlib`` as a wheel installs it: the package and its
    ``.dist-info`` folder side by side (METADATA with a long body, as real
    ones have)."""
    os.makedirs(os.path.join(root, "keyedlib"), exist_ok=True)
    with open(os.path.join(root, "keyedlib", "__init__.py"), "w") as handle:
        handle.write("def scale(t):\n    return t * 2\n")
    for entry in os.listdir(root):
        if entry.endswith(".dist-info"):
            for name in os.listdir(os.path.join(root, entry)):
                os.remove(os.path.join(root, entry, name))
            os.rmdir(os.path.join(root, entry))
    info = os.path.join(root, f"keyedlib-{version}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as handle:
        handle.write(f"Metadata-Version: 2.1\nName: keyedlib\nVersion: {version}\nSummary: s\n\n"
                     "Version: 9.9 (the body, not a header)\n")


def test_the_source_key_changes_with_a_library_version(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library function the program calls is keyed by its name and the
    library's installed version (read beside the imported package, without
    parsing its metadata: ``importlib.metadata``'s ``version`` is never
    asked when the ``.dist-info`` folder is there)."""
    import importlib.metadata

    root = str(tmp_path)
    _install_fake_library(root, "1.0")
    monkeypatch.syspath_prepend(root)
    monkeypatch.setattr(source_key, "_LIBRARIES", source_key._LIBRARIES | {"keyedlib"})
    import keyedlib  # type: ignore[import-not-found]

    def unread(*args: object) -> str:
        raise AssertionError("importlib.metadata.version was called")

    monkeypatch.setattr(importlib.metadata, "version", unread)

    def forward(t: torch.Tensor) -> torch.Tensor:
        return keyedlib.scale(t)

    x = torch.randn(3)
    try:
        source_key._distribution_version.cache_clear()
        assert source_key._distribution_version("keyedlib") == "1.0"
        key = _key(forward, x)
        assert _key(forward, x) == key
        _install_fake_library(root, "1.1")
        source_key._distribution_version.cache_clear()
        assert source_key._distribution_version("keyedlib") == "1.1"
        assert _key(forward, x) != key
    finally:
        source_key._distribution_version.cache_clear()
        sys.modules.pop("keyedlib", None)


def test_library_versions_equal_the_installed_metadata() -> None:
    import importlib.metadata

    source_key._distribution_version.cache_clear()
    names = {"torch_mlir": "torch-mlir"}
    for top in ("torch", "torch_mlir", "jax", "jaxlib", "numpy"):
        assert source_key._distribution_version(top) == importlib.metadata.version(names.get(top, top)), top


def test_the_source_key_sees_tied_weights_and_closures() -> None:
    class Tied(torch.nn.Module):
        def __init__(self, tie: bool) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)
            if tie:
                self.b.weight = self.a.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    x = torch.randn(2, 4)
    assert _key(Tied(False), x) != _key(Tied(True), x)

    def make(offset: float):  # type: ignore[no-untyped-def]
        def shifted(t: torch.Tensor) -> torch.Tensor:
            return t + offset
        return shifted

    assert _key(make(1.0), x) == _key(make(1.0), x)
    assert _key(make(1.0), x) != _key(make(2.0), x)


def _tiny_llama(**overrides: object) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    settings: dict[str, object] = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    settings.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**settings)).eval()


def test_the_source_key_of_a_transformers_model_holds_its_config() -> None:
    ids = torch.randint(0, 64, (1, 8))
    key = _key(_tiny_llama(), ids, use_cache=False)
    assert _key(_tiny_llama(), ids, use_cache=False) == key  # another instance, other random weights
    for what, other in {
        "rms_norm_eps": _tiny_llama(rms_norm_eps=1e-3),
        "hidden_act": _tiny_llama(hidden_act="gelu"),
        "attention implementation": _tiny_llama(attn_implementation="eager"),
        "a dtype": _tiny_llama().to(torch.bfloat16),
    }.items():
        assert _key(other, ids, use_cache=False) != key, what
    assert _key(_tiny_llama(), ids, use_cache=True) != key  # a static input


class _Locked(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import threading

        self.lock = threading.Lock()  # no printable state: no key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def test_what_cannot_be_keyed_takes_the_full_path_and_says_why(cache_dir: str) -> None:
    x = torch.randn(4)
    with pytest.raises(Uncacheable, match="lock"):
        _key(_Locked(), x)
    hooked = _block_class()()
    hooked.linear.register_forward_hook(lambda module, inputs, output: output * 2)
    with pytest.raises(Uncacheable, match="forward hooks"):
        _key(hooked, torch.randn(2, 8))
    stats = program_cache.program_cache_stats()
    before = stats.uncacheable
    exe = hloalias.compile(_Locked(), (x,))
    assert torch.equal(exe(x), x + 1)
    assert stats.uncacheable == before + 1
    assert "the compile key cannot be computed soundly" in exe.explain()
    assert any("lock" in reason for reason in stats.reasons)


def test_a_changed_program_misses_and_an_unchanged_one_hits(cache_dir: str) -> None:
    stats = program_cache.program_cache_stats()
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    first = _block_class()()
    hits, misses = stats.hits, stats.misses
    exe = hloalias.compile(first, (x,))
    assert (stats.hits, stats.misses) == (hits, misses + 1)
    assert torch.allclose(exe(x), first(x))
    again = _block_class()()  # the same program, other weights
    exe = hloalias.compile(again, (x,))
    assert (stats.hits, stats.misses) == (hits + 1, misses + 1)
    assert "program cache: hit" in exe.explain()
    assert torch.allclose(exe(x), again(x))  # this module's weights, not the first one's
    edited = _block_class(op="-")()  # the helper's code edited
    exe = hloalias.compile(edited, (x,))
    assert (stats.hits, stats.misses) == (hits + 1, misses + 2)
    assert torch.allclose(exe(x), edited(x))
    edited.scale = 5.0  # a configuration value
    exe = hloalias.compile(edited, (x,))
    assert (stats.hits, stats.misses) == (hits + 1, misses + 3)
    assert torch.allclose(exe(x), edited(x))
    # A dtype (a module not compiled before: converting a compiled module
    # in place is a separate state-sharing bug, see the report).
    wide = _block_class(op="-")()
    wide.scale = 5.0
    wide.to(torch.float64)
    exe = hloalias.compile(wide, (x.double(),))
    assert (stats.hits, stats.misses) == (hits + 1, misses + 4)
    assert torch.allclose(exe(x.double()), wide(x.double()))


def test_a_program_cache_hit_warns_nothing(cache_dir: str) -> None:
    # Every hit used to warn "`isinstance(treespec, LeafSpec)` is
    # deprecated": the entry's signature was pickled with LeafSpec.__new__.
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    hloalias.compile(_block_class()(), (x,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exe = hloalias.compile(_block_class()(), (x,))
    assert "program cache: hit" in exe.explain()
    assert [str(warning.message) for warning in caught] == []


_PROGRAM_CHILD = textwrap.dedent(
    """
    import warnings, torch, torch.export, hloalias
    from hloalias.runtime.disk_cache import disk_cache_stats
    from hloalias.runtime.program_cache import program_cache_stats
    from transformers import LlamaConfig, LlamaForCausalLM
    warnings.simplefilter("error", hloalias.runtime.disk_cache.CacheWarning)
    if HIT_EXPECTED:  # a hit runs neither torch.export nor torch-mlir
        import hloalias.frontend.importer as importer
        def refuse(*args, **kwargs):
            raise AssertionError("imported on a hit")
        importer.import_torch = refuse
        torch.export.export = refuse

    class WithConstant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
        def forward(self, x):
            return self.linear(x) + torch.tensor([1.0, 2.0, 3.0, 4.0])

    torch.manual_seed(SEED)
    module = WithConstant()
    x = torch.randn(2, 4)
    exe = hloalias.compile(module, (x,))
    assert torch.allclose(exe(x), module(x))
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 8))
    exe = hloalias.compile(model, (ids,))
    out = exe(ids)
    ref = model(ids)
    assert torch.allclose(out.logits, ref.logits, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(
        out.past_key_values.layers[0].keys, ref.past_key_values.layers[0].keys))
    stats, disk = program_cache_stats(), disk_cache_stats()
    print("STATS", stats.hits, stats.misses, stats.uncacheable, disk.xla_compiles)
    """
)


def test_a_fresh_process_compiling_a_known_program_imports_nothing(cache_dir: str) -> None:
    def child(seed: int, hit: bool) -> list[int]:
        code = _PROGRAM_CHILD.replace("HIT_EXPECTED", str(hit)).replace("SEED", str(seed))
        done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        line = [line for line in done.stdout.splitlines() if line.startswith("STATS")][0]
        return [int(part) for part in line.split()[1:]]

    assert child(0, hit=False) == [0, 2, 0, 2]  # both imported, lowered, compiled and stored
    assert child(1, hit=True) == [2, 0, 0, 0]  # other weights: no import, no XLA compile


# -- a training step is traced once ----------------------------------------------


def test_a_training_step_is_traced_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """make_fx's one trace (functionalized, decomposed) is the program the
    importer lowers: neither torch.export nor a decomposition retrace runs."""
    import copy

    import hloalias.frontend.importer as importer
    from hloalias.frontend import torch_internals

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a second trace of the training step")

    monkeypatch.setattr(torch.export, "export", refuse)
    monkeypatch.setattr(importer, "decompose", refuse)
    monkeypatch.setattr(torch_internals, "decompose", refuse)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    x, y = torch.randn(6, 8), torch.randn(6, 4)

    def step_of(net: torch.nn.Module, opt: torch.optim.Optimizer):  # type: ignore[no-untyped-def]
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(net(x), y) * torch.tensor(0.5)  # a lifted constant too
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step

    compiled = hloalias.compile_training_step(step_of(model, optimizer), model, optimizer, (x, y))
    eager = step_of(reference, reference_optimizer)
    for _ in range(3):
        assert torch.allclose(compiled(x, y), eager(x, y), atol=1e-6)
    compiled.write_back()
    for ours, theirs in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.allclose(ours, theirs, atol=1e-6)


def test_an_entry_made_for_other_device_state_is_not_used(cache_dir: str) -> None:
    """The pipeline depends on state already on the device (its layout and
    dtype are fixed for a new program): an entry made before that state
    existed is not used, the program is imported again, and the result is
    right."""
    stats = program_cache.program_cache_stats()
    module = _block_class()()
    x = torch.randn(2, 8)
    first = hloalias.compile(module, (x,))  # stored; while it lives the module's state is on the device
    stale = stats.stale
    exe = hloalias.compile(module, (x,))
    assert stats.stale == stale + 1
    assert "entry found but not usable" in exe.explain()
    assert torch.allclose(exe(x), module(x))
    hits = stats.hits
    again = hloalias.compile(module, (x,))  # stored for this state: now a hit
    assert stats.hits == hits + 1
    assert torch.allclose(again(x), module(x)) and torch.allclose(first(x), module(x))


def test_classes_made_by_exec_are_keyed_by_their_code(cache_dir: str) -> None:
    """A class made by ``exec`` without ``__name__`` says it is from
    ``builtins`` (a library): it must still be keyed by its code (generated
    programs, as the differential tests make them, differ only there)."""
    source = ("import torch\nclass Program(torch.nn.Module):\n"
              "    def forward(self, x):\n        return {body}\n")
    programs = []
    for body in ("x * 2.0", "(x * 2.0, x + 1)"):
        namespace: dict[str, object] = {}
        exec(source.format(body=body), namespace)
        programs.append(namespace["Program"]())
    assert type(programs[0]).__module__ == "builtins"
    x = torch.randn(4)
    assert _key(programs[0], x) != _key(programs[1], x)
    first = hloalias.compile(programs[0], (x,))
    second = hloalias.compile(programs[1], (x,))
    assert torch.equal(first(x), x * 2.0)
    doubled, shifted = second(x)
    assert torch.equal(doubled, x * 2.0) and torch.equal(shifted, x + 1)


def test_a_dataclass_config_is_keyed_by_its_values() -> None:
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Config:
        width: int = 8
        scale: float = 2.0

    class Configured(torch.nn.Module):
        def __init__(self, config: Config) -> None:
            super().__init__()
            self.config = config

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.config.scale

    x = torch.randn(8)
    key = _key(Configured(Config()), x)
    assert _key(Configured(Config()), x) == key
    assert _key(Configured(Config(scale=3.0)), x) != key


class _ReadsEnvironment(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        approximate = "tanh" if os.environ.get("USER_GELU_TANH") else "none"
        return torch.nn.functional.gelu(x, approximate=approximate)


from os import getenv  # noqa: E402  (read as a global, as a user's module would)


def _reads_getenv(x: torch.Tensor) -> torch.Tensor:
    return x * (2.0 if getenv("USER_GELU_TANH") else 1.0)


def test_a_program_that_reads_the_environment_is_not_served_from_the_cache(
        cache_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # forward bakes the variable's value in; the library version of `os` says
    # nothing of it, so a hit would run the program of another environment.
    x = torch.linspace(-2.0, 2.0, 8)
    monkeypatch.delenv("USER_GELU_TANH", raising=False)
    for program in (_ReadsEnvironment(), _reads_getenv):
        with pytest.raises(Uncacheable, match="process environment"):
            _key(program, x)
    exact = hloalias.compile(_ReadsEnvironment(), (x,))
    torch.testing.assert_close(exact(x), torch.nn.functional.gelu(x), rtol=0, atol=1e-6)
    monkeypatch.setenv("USER_GELU_TANH", "1")
    tanh = hloalias.compile(_ReadsEnvironment(), (x,))
    torch.testing.assert_close(tanh(x), torch.nn.functional.gelu(x, approximate="tanh"), rtol=0, atol=1e-6)
    assert "process environment" in tanh.explain()
