"""Every ``HLOALIAS_*`` environment variable, in one registry: its name,
type, default, scope and what it does.  The package reads them only here
(:func:`flag`, :func:`integer`, :func:`number`, :func:`text`), each time a
value is needed, so a variable set after import takes effect at the next
read.  ``docs/configuration.md`` is generated from :data:`SETTINGS`
(``python -m hloalias.tools.gen_docs``; a test fails when it is stale).

Scopes: ``runtime`` variables change what the installed package does;
``build`` ones the install (``setup.py``, ``scripts/venv.sh``);
``development`` ones the repository's tests, benchmarks and scripts (read
there, listed here so that one table names them all).

A value that does not parse as its type is ignored with a
:class:`ConfigWarning` naming the variable, and the default applies."""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")

Scope = Literal["runtime", "build", "development"]
Kind = Literal["flag", "integer", "number", "text", "path"]

_FALSE = ("0", "off", "false", "no")
_TRUE = ("1", "on", "true", "yes")


class ConfigWarning(UserWarning):
    """An ``HLOALIAS_*`` variable holds a value of the wrong type."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: ``default`` is the value when it is unset
    (None: no value; the reader decides, as ``doc`` says)."""

    name: str
    kind: Kind
    default: bool | int | float | str | None
    scope: Scope
    doc: str


SETTINGS: tuple[Setting, ...] = (
    # -- runtime -------------------------------------------------------------
    Setting("HLOALIAS_CACHE", "flag", True, "runtime",
            "The on-disk cache of compiled XLA executables (`hloalias.runtime.disk_cache`); "
            "0/off/false/no turns it off: every new process compiles again."),
    Setting("HLOALIAS_CACHE_DIR", "path", None, "runtime",
            "Where the disk cache lives; unset: `$XDG_CACHE_HOME/hloalias/xla` or "
            "`~/.cache/hloalias/xla` (created 0700: entries are loaded code)."),
    Setting("HLOALIAS_CACHE_KEY_FILE", "path", None, "runtime",
            "The per-user secret that authenticates disk-cache entries (HMAC-SHA256); unset: "
            "`cache-key` beside the cache (`$XDG_CACHE_HOME/hloalias` or `~/.cache/hloalias`), "
            "created 0600; a key file others can read or write turns the disk caches off."),
    Setting("HLOALIAS_CACHE_MAX_BYTES", "integer", 2 * 1024**3, "runtime",
            "Size bound of the disk cache in bytes; least recently used entries are deleted first."),
    Setting("HLOALIAS_EXECUTABLE_CACHE_SIZE", "integer", 64, "runtime",
            "How many loaded XLA executables the in-process cache keeps, least recently used "
            "dropped first (`hloalias.runtime.executable`); read at import."),
    Setting("HLOALIAS_EXPORT_CACHE", "flag", True, "runtime",
            "Reuse of an import (`torch.export`, lowering) when the same program object is compiled "
            "again on inputs of the same shapes, dtypes and static values "
            "(`hloalias.runtime.export_cache`); 0 turns it off."),
    Setting("HLOALIAS_EXPORT_CACHE_SIZE", "integer", 32, "runtime",
            "How many imports the in-process import cache (`hloalias.runtime.export_cache`) keeps, least "
            "recently used dropped first; read at each new entry; 0 keeps none."),
    Setting("HLOALIAS_PROGRAM_CACHE", "flag", True, "runtime",
            "The program cache (`hloalias.runtime.program_cache`): a program compiled before, in any "
            "process, found before `torch.export` runs; 0/off/false/no turns it off (HLOALIAS_CACHE=0 "
            "turns off every disk cache)."),
    Setting("HLOALIAS_SHAPE_FAMILY", "flag", True, "runtime",
            "New input sizes of a module compiled before in this process come from one export with "
            "dynamic dimensions, specialized per sizes (`hloalias.runtime.shape_family`); 0/off/false/no "
            "exports every new size again."),
    Setting("HLOALIAS_SHAPE_FAMILY_STATIC_SIZES", "integer", 2, "runtime",
            "How many distinct input sizes of a module compile statically, each traced as it is, "
            "before its shape family's one dynamic export serves every later size "
            "(`hloalias.runtime.shape_family`); 1 exports dynamically at the second size."),
    Setting("HLOALIAS_SHAPE_FAMILY_CACHE_SIZE", "integer", 16, "runtime",
            "How many modules' shape families (each may hold a dynamic export and the module's state "
            "tensors) the process keeps, least recently used dropped first (`hloalias.runtime.shape_family`); "
            "read at each new family; 0 keeps none."),
    Setting("HLOALIAS_JIT_CACHE_SIZE", "integer", 8, "runtime",
            "The default `cache_size` of `hloalias.jit` (signatures kept per Jit) and of the "
            "`torch.compile(backend=\"hloalias\")` graphs (signatures per Jit, sets of number values per "
            "graph; `options={\"cache_size\": n}` overrides it), least recently used dropped first; read "
            "when a Jit or graph is made; at least 1 (0 or less is an `ExecutionError`)."),
    Setting("HLOALIAS_OPTIMIZER_TEMPLATE_CACHE_SIZE", "integer", 64, "runtime",
            "How many traced optimizer update templates the process keeps for later captures, least "
            "recently used dropped first (`hloalias.frontend.optimizer_replay`); read at each new "
            "template; 0 keeps none."),
    Setting("HLOALIAS_MEMO_CACHE_SIZE", "integer", 256, "runtime",
            "How many entries each small in-process memo table keeps, least recently used dropped first "
            "(`hloalias.lru.memoized`): pipeline texts parsed (`hloalias.pipeline`), source files' digests "
            "in cache keys (by path, size and mtime: `hloalias.runtime.source_key`), rebuilt strided "
            "views' geometry (`hloalias.runtime.strided_views`); read at each new entry; 0 keeps none."),
    Setting("HLOALIAS_FAKE_CACHE_ENTRIES", "integer", 16384, "runtime",
            "Bound on torch's fake-tensor dispatch cache (`FakeTensorMode.cache`, process-wide, which "
            "torch never empties: one entry, 1-2 KiB, per op and input shapes traced): after a trace "
            "that leaves more entries than this, hloalias empties it (`hloalias.frontend.tracing_lock`); "
            "0 leaves it unbounded."),
    Setting("HLOALIAS_NATIVE", "flag", True, "runtime",
            "The native call path (`hloalias.runtime._lane`, C++); 0 keeps every call on the Python "
            "path (whose per-call check of the module's tensors still uses the extension's "
            "`first_changed` where it is built). Read when an executable is made."),
    Setting("HLOALIAS_REPRO_DIR", "path", None, "runtime",
            "Where a failed lowering or XLA compile writes its repro `.mlir` file "
            "(`hloalias-<stage>-<hash>.mlir`); unset: the temp directory."),
    Setting("HLOALIAS_DUMP_DIR", "path", None, "runtime",
            "Write every compile's stages to this directory (torch IR, raw StableHLO, the module "
            "after each pass, the final module), as `dump_dir=` of `hloalias.compile` does; "
            "see docs/observability.md."),
    Setting("HLOALIAS_ISOLATE_COMPILE", "flag", False, "runtime",
            "1: every compile runs torch-mlir's lowering, and XLA's compile for one CPU device first, "
            "in a child process, so that a crash in their native code becomes a `CompileError` and not "
            "the end of the caller's process (programs with an op on the known-risky list lower in a "
            "child always); costs a process start or two per compile (docs/refusals.md)."),
    Setting("HLOALIAS_VERIFY_EACH_PASS", "flag", False, "runtime",
            "1: in a pass pipeline, check the IR contract (`hloalias.contract.verify`) in full before "
            "and after every hloalias pass; unset, a check of an `@main` whose signature (attributes, "
            "arguments, single block ending in `func.return`) is what the pipeline last checked returns "
            "that check's records (the same result: the contract reads nothing else); also run MLIR's "
            "verifier after every pass of a pipeline (hloalias's and torch-mlir's lowering), where unset "
            "verifies the pipeline's result once (hloalias/pass_runs.py). A debugging aid."),
    Setting("HLOALIAS_LOG", "text", None, "runtime",
            "A logging level (`INFO`, `DEBUG`, ...): attach a stderr handler at that level to the "
            "`hloalias` logger, which logs each compile stage's duration at INFO. Unset: the "
            "application's logging configuration decides."),
    Setting("HLOALIAS_PROGRESS", "text", "auto", "runtime",
            "The progress line on stderr during a long compile: `auto` shows it when stderr is a "
            "terminal and the `hloalias` logger does not already log at INFO; 1 always; 0 never."),
    Setting("HLOALIAS_PROGRESS_AFTER", "number", 2.0, "runtime",
            "Seconds a compile runs before the progress line appears."),
    # -- build ---------------------------------------------------------------
    Setting("HLOALIAS_REQUIRE_NATIVE", "flag", False, "build",
            "1: a native call path that cannot be built fails the install (`setup.py`) instead of "
            "installing without it; `scripts/venv.sh` sets 1 unless it is set."),
    Setting("HLOALIAS_BOOTSTRAP_PYTHON", "text", "python3.11", "build",
            "The interpreter `scripts/venv.sh` creates `.venv` with."),
    Setting("HLOALIAS_PYTHON", "path", None, "build",
            "The interpreter the lit suite and CMake's `check-hloalias` run hloalias with; "
            "`scripts/venv.sh` exports `.venv/bin/python`."),
    # -- development ---------------------------------------------------------
    Setting("HLOALIAS_LIT_OUT", "path", None, "development",
            "Where lit writes its temporary files; unset: `hloalias-lit-<uid>-<checkout>` in the temp directory."),
    Setting("HLOALIAS_DIFF_EXAMPLES", "integer", 300, "development",
            "Generated programs in `test_differential.py` (`scripts/fuzz.sh` raises it)."),
    Setting("HLOALIAS_STATEFUL_EXAMPLES", "integer", 25, "development",
            "Generated stateful programs in `test_differential_stateful.py`."),
    Setting("HLOALIAS_DYNAMO_EXAMPLES", "integer", None, "development",
            "Generated stateful programs run through `torch.compile(backend=\"hloalias\")` in "
            "`test_differential_stateful.py`; unset: half the stateful programs, at least 8."),
    Setting("HLOALIAS_TRAINING_EXAMPLES", "integer", None, "development",
            "Generated training steps (optimizers under learning-rate schedules, lr 0 included) in "
            "`test_differential_stateful.py`; unset: a quarter of the stateful programs, at least 6."),
    Setting("HLOALIAS_DIFF_SEED", "integer", None, "development",
            "The differential tests' seed (replay a failure); unset: the fixed CI sequence."),
    Setting("HLOALIAS_DIFF_KNOWN_BUGS", "flag", False, "development",
            "1: the differential generator also draws programs that hit known, documented limits."),
    Setting("HLOALIAS_DIFF_SHRINK_SECONDS", "number", 90.0, "development",
            "How long hypothesis may shrink a failing differential example."),
    Setting("HLOALIAS_PEERS_DIR", "path", "/work/peers", "development",
            "Where `bench/peers_setup.sh` builds the peer environments (torch_xla, torchax)."),
    Setting("HLOALIAS_PEER_DUMP", "path", None, "development",
            "Set by `bench/peers.py` for a peer run: where the peer writes XLA's dumps."),
    Setting("HLOALIAS_LATENCY_FIRST_ONLY", "text", None, "development",
            "Set (any value): `bench.latency` measures only the first compile (no warm rows)."),
    Setting("HLOALIAS_LATENCY_DEVICE_FIRST", "text", None, "development",
            "Set (any value) by `bench.latency --cold-rounds` for its 'backend set up first' column: the "
            "child sets up jax's CPU backend before the timed first compile, as every peer has its device "
            "up before its first call."),
)

_BY_NAME = {setting.name: setting for setting in SETTINGS}


def setting(name: str) -> Setting:
    """The registry entry of ``name`` (KeyError for an unregistered name:
    a variable the package reads must be registered here)."""
    return _BY_NAME[name]


def _raw(name: str, kind: Kind) -> str | None:
    entry = setting(name)
    if entry.kind != kind:
        raise TypeError(f"{name} is a {entry.kind} setting, read as {kind}")
    value = os.environ.get(name)
    return value if value is not None and value.strip() != "" else None


def _invalid(name: str, value: str, expected: str, default: object) -> None:
    warnings.warn(f"{name}={value!r} is not {expected}; using {default!r}", ConfigWarning, stacklevel=3)


def flag(name: str) -> bool:
    """A boolean variable: 1/on/true/yes or 0/off/false/no (any case)."""
    default = bool(setting(name).default)
    value = _raw(name, "flag")
    if value is None:
        return default
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    _invalid(name, value, "one of 1/on/true/yes/0/off/false/no", default)
    return default


def _parsed(name: str, kind: Kind, parse: Callable[[str], T], what: str) -> T | None:
    """Variable ``name`` read by ``parse`` (None when unset or invalid: the
    caller takes the default; an invalid value is reported by ``_invalid``)."""
    value = _raw(name, kind)
    if value is not None:
        try:
            return parse(value)
        except ValueError:
            _invalid(name, value, what, setting(name).default)
    return None


def integer(name: str) -> int | None:
    """An integer variable (None when unset and it has no default)."""
    value = _parsed(name, "integer", int, "an integer")
    default = setting(name).default
    return value if value is not None else (default if isinstance(default, int) else None)


def memo_cache_size() -> int:
    """``HLOALIAS_MEMO_CACHE_SIZE``: the bound of each
    :func:`hloalias.lru.memoized` table (read at each new entry)."""
    return integer("HLOALIAS_MEMO_CACHE_SIZE") or 0


def number(name: str) -> float | None:
    """A number variable (None when unset and it has no default)."""
    value = _parsed(name, "number", float, "a number")
    default = setting(name).default
    return value if value is not None else (float(default) if isinstance(default, (int, float)) else None)


def text(name: str) -> str | None:
    """A text or path variable (None when unset and it has no default); a
    path has ``~`` expanded."""
    entry = setting(name)
    value = _raw(name, "path" if entry.kind == "path" else "text")
    if value is None:
        return entry.default if isinstance(entry.default, str) else None
    return os.path.expanduser(value) if entry.kind == "path" else value


def markdown_table() -> str:
    """The registry as the Markdown of ``docs/configuration.md``."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated by `python -m hloalias.tools.gen_docs` from hloalias/config.py; do not edit. -->",
        "",
        "Every `HLOALIAS_*` environment variable. The package reads them in one place",
        "(`hloalias/config.py`), when a value is needed; a value that does not parse as its",
        "type is ignored with a `hloalias.config.ConfigWarning` and the default applies.",
        "",
    ]
    titles = {
        "runtime": "Runtime (the installed package)",
        "build": "Build (the install)",
        "development": "Development (tests, benchmarks, scripts of the repository)",
    }
    for scope, title in titles.items():
        lines += [f"## {title}", "", "| variable | type | default | what it does |", "|---|---|---|---|"]
        for entry in SETTINGS:
            if entry.scope == scope:
                default = "unset" if entry.default is None else f"`{_default_text(entry.default)}`"
                lines.append(f"| `{entry.name}` | {entry.kind} | {default} | {entry.doc} |")
        lines.append("")
    return "\n".join(lines)


def _default_text(default: bool | int | float | str) -> str:
    if isinstance(default, bool):
        return "1" if default else "0"
    return str(default)




class NativePathWarning(RuntimeWarning):
    """The native call path (``hloalias.runtime._lane``) is not built or
    does not load: every call takes the Python path."""


def warn_native_missing(error: BaseException) -> None:
    """The one warning that the native call path is missing (issued when
    the runtime is first imported), unless ``HLOALIAS_NATIVE=0`` says the
    user wants the Python path anyway."""
    if not flag("HLOALIAS_NATIVE"):
        return
    warnings.warn(
        f"hloalias: the native call path (hloalias.runtime._lane) is not available ({error}); every call "
        "takes the Python path: same results, about twice the host time per call. It is compiled when "
        "hloalias is installed where a C++ compiler (g++) is present: reinstall with "
        "`pip install --force-reinstall --no-deps hloalias` (or `bash scripts/venv.sh` in the repository). "
        "HLOALIAS_NATIVE=0 silences this.",
        NativePathWarning,
        stacklevel=2,
    )


def warn_native_stale(reason: str) -> None:
    """The one warning that the built native call path is of another
    interface than the runtime's (a build of an older ``_lane.cpp``,
    ``reason`` says which and how to rebuild it): every call and per-call
    check takes the Python path.  Unless ``HLOALIAS_NATIVE=0``."""
    if not flag("HLOALIAS_NATIVE"):
        return
    warnings.warn(
        f"hloalias: {reason}. Until then every call takes the Python path: same results, about twice the "
        "host time per call. HLOALIAS_NATIVE=0 silences this.",
        NativePathWarning,
        stacklevel=2,
    )


__all__ = [
    "ConfigWarning", "NativePathWarning", "SETTINGS", "Setting", "flag", "integer", "markdown_table", "memo_cache_size",
    "number",
    "setting", "text", "warn_native_missing", "warn_native_stale",
]
