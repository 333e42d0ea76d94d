"""Compile on demand: :func:`jit` wraps a module or function so that its
first call with an input signature compiles it (``hloalias.compile``) and
later calls with that signature reuse the executable, as ``jax.jit`` and
``torch.compile`` do.

- **Signature**: the pytree structure of ``(args, kwargs)``; per tensor
  leaf (torch tensor or :class:`DeviceTensor`) its shape, dtype and
  ``requires_grad``; per other leaf its type and value (every non-tensor
  input is static: ``torch.export`` specializes on it and the program bakes
  it in); the grad mode and the ``training`` flags of the modules it runs
  and the plain attributes their code reads (``runtime/module_modes.py``:
  a submodule switched alone counts, ``model.scale = 2.0`` too), and
  the forward hooks registered on them (``runtime/module_hooks.py``).  A call
  with a signature not seen before compiles; one seen before is a cache hit.
  A new shape never raises "compile again".
- **Bounded cache**: at most ``cache_size`` executables (default
  ``HLOALIAS_JIT_CACHE_SIZE``, read when the Jit is made), least recently
  used dropped first (a later call with that signature compiles again).
- **One copy of the state**: every executable compiled from a module
  shares that module's device state (``hloalias.compile``'s state group),
  so four batch sizes hold the weights once.
- **Donation**: ``donate_argnums`` / ``donate_argnames`` are passed to
  every compile (``hloalias.compile``'s meaning: flattened user-input
  positions, argument names).  ``static_argnums`` / ``static_argnames``
  name arguments that must be static: a tensor passed there is refused
  (:class:`~hloalias.errors.ExecutionError`), since hloalias cannot bake a
  tensor argument's value into a program.
- **Stages**: ``jit(f).lower(*args)`` imports (torch -> StableHLO with the
  signature in IR) and stops, ``.compile()`` finishes that signature and
  puts it into the cache, as JAX's ``jit(f).lower(x).compile()``.
- **Reports**: :meth:`Jit.explain` lists every cached signature with its
  executable's explanation; :attr:`Jit.stats` counts compiles, cache hits
  and evictions.

Calls of one :class:`Jit` are serialized around the cache only; the
executables serialize their own state access."""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from hloalias import config
from hloalias.errors import ExecutionError
from hloalias.frontend.importer import Program, _register_transformers_caches, import_torch
from hloalias.lru import BoundedLRU
from hloalias.runtime.executable import DeviceTensor, Executable, compile as compile_executable
from hloalias.runtime.export_cache import import_cached
from hloalias.runtime.module_hooks import ModuleHooks
from hloalias.runtime.state import traced_as_plain
from hloalias.runtime.module_modes import ModuleModes

#: Executables kept per :class:`Jit` unless ``cache_size`` or
#: ``HLOALIAS_JIT_CACHE_SIZE`` says otherwise (torch.compile's default
#: recompile limit is 8 as well).
DEFAULT_CACHE_SIZE = 8


def default_cache_size() -> int:
    """``HLOALIAS_JIT_CACHE_SIZE`` (else :data:`DEFAULT_CACHE_SIZE`): the
    ``cache_size`` of a Jit or ``torch.compile`` graph not given one.
    Raises :class:`ExecutionError` naming the variable when it is below 1."""
    configured = config.integer("HLOALIAS_JIT_CACHE_SIZE")
    size = DEFAULT_CACHE_SIZE if configured is None else configured
    if size < 1:
        raise ExecutionError(f"jit: HLOALIAS_JIT_CACHE_SIZE must be a positive int, got {size}")
    return size


@dataclasses.dataclass
class JitStats:
    """What a :class:`Jit` did so far (live object)."""

    compiles: int = 0
    hits: int = 0
    evictions: int = 0


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One cached signature: its executable and its description in words."""

    executable: Executable
    description: str


def _leaf_key(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return ("tensor", tuple(leaf.shape), leaf.dtype, leaf.requires_grad)
    if isinstance(leaf, DeviceTensor):
        return ("tensor", tuple(leaf.shape), leaf.dtype, False)
    try:
        hash(leaf)
    except TypeError:
        return ("value", type(leaf), repr(leaf))
    return ("value", type(leaf), leaf)


def _leaf_text(leaf: Any) -> str:
    if isinstance(leaf, (torch.Tensor, DeviceTensor)):
        return f"{str(leaf.dtype).removeprefix('torch.')}{list(leaf.shape)}"
    return repr(leaf)


class Lowered:
    """A signature imported to StableHLO and stopped there (``jit(f).lower``).

    ``program`` is the imported :class:`~hloalias.frontend.Program` (before
    the pass pipeline); :meth:`as_text` prints it; :meth:`compile` runs the
    pipeline and XLA (reusing this import) and caches the executable in the
    :class:`Jit` it came from."""

    def __init__(self, owner: "Jit", key: Any, args: tuple[Any, ...], kwargs: dict[str, Any], program: Program) -> None:
        self._owner = owner
        self._key = key
        self._args = args
        self._kwargs = kwargs
        self.program = program

    def as_text(self) -> str:
        """The imported StableHLO module, with the signature in IR."""
        return self.program.text

    def compile(self) -> Executable:
        """The executable of this signature (compiled now unless cached)."""
        return self._owner._executable(self._key, self._args, self._kwargs)


class Jit:
    """``f`` compiled per input signature on first use; call it like ``f``.
    See the module docstring for what a signature is and what is shared."""

    def __init__(
        self,
        f: torch.nn.Module | Callable[..., Any],
        *,
        donate_argnums: Sequence[int] = (),
        donate_argnames: Sequence[str] = (),
        static_argnums: Sequence[int] = (),
        static_argnames: Sequence[str] = (),
        pipeline: str | None = None,
        device: Any = None,
        cache_size: int | None = None,
    ) -> None:
        if not callable(f):
            raise ExecutionError(f"jit: {type(f).__name__} is not callable; pass an nn.Module or a function")
        if cache_size is None:
            cache_size = default_cache_size()
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ExecutionError(f"jit: cache_size must be a positive int, got {cache_size!r}")
        for what, values, kind in (
            ("donate_argnums", donate_argnums, int), ("static_argnums", static_argnums, int),
            ("donate_argnames", donate_argnames, str), ("static_argnames", static_argnames, str),
        ):
            if isinstance(values, (str, int)) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
                raise ExecutionError(f"jit: {what} must be a sequence of {kind.__name__}, got {values!r}")
        self.fn = f
        self.donate_argnums = tuple(donate_argnums)
        self.donate_argnames = tuple(donate_argnames)
        self.static_argnums = tuple(static_argnums)
        self.static_argnames = tuple(static_argnames)
        self.pipeline = pipeline
        self.device = device
        self.stats = JitStats()
        #: The bound is an int (a callable reading ``self`` would make a
        #: reference cycle: a dropped Jit would wait for the cyclic GC).
        self._cache: BoundedLRU[Any, _Entry] = BoundedLRU(cache_size)
        self._lock = threading.Lock()
        self._caches_registered = False
        #: The train/eval flags and plain attributes the programs may read: part of the key.
        self._modes = ModuleModes.of(f)
        #: The forward hooks the programs run: part of the key.
        self._hooks = ModuleHooks.of(f)
        #: The parameters ``f`` takes by position, in order (for
        #: ``static_argnames`` passed positionally); checked once here.
        self._positional_names: list[str] = []
        target = f.forward if isinstance(f, torch.nn.Module) else f
        try:
            parameters = list(inspect.signature(target).parameters.values())
        except (TypeError, ValueError):  # no signature to check against (a builtin)
            return
        self._positional_names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            known = {p.name for p in parameters}
            unknown = [name for name in self.static_argnames if name not in known]
            if unknown:
                raise ExecutionError(
                    f"jit: static_argnames {unknown} are not parameters of "
                    f"{getattr(target, '__qualname__', target)} ({', '.join(sorted(known)) or 'none'})"
                )

    @property
    def cache_size(self) -> int:
        """How many signatures the cache keeps (least recently used dropped first)."""
        return self._cache.bound

    @cache_size.setter
    def cache_size(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ExecutionError(f"jit: cache_size must be a positive int, got {size!r}")
        self._cache.bound = size

    # -- signatures ---------------------------------------------------------
    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self._caches_registered:
            # transformers' cache objects flatten to their tensors (as the
            # importer flattens them), so a DynamicCache is keyed by shape;
            # a graph from dynamo takes tensors only.
            if not isinstance(self.fn, torch.fx.GraphModule):
                _register_transformers_caches(self.fn)
            self._caches_registered = True
        self._check_statics(args, kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        modes = self._modes.key() if self._modes is not None else None
        hooks = self._hooks.key() if self._hooks is not None else None
        # The default dtype decides what ``torch.ones(4)`` inside the program
        # makes: a program traced under another would return other dtypes.
        return (
            spec, tuple(_leaf_key(leaf) for leaf in leaves), torch.is_grad_enabled(), torch.get_default_dtype(),
            modes, hooks,
        )

    def _check_statics(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        named = [(f"argument {i}", args[i]) for i in self.static_argnums if i < len(args)]
        named += [(f"argument '{name}'", kwargs[name]) for name in self.static_argnames if name in kwargs]
        if self.static_argnames:
            named += self._positional_statics(args)
        for what, value in named:
            if any(isinstance(leaf, (torch.Tensor, DeviceTensor)) for leaf in pytree.tree_leaves(value)):
                raise ExecutionError(
                    f"jit: static {what} holds a tensor; a static argument is a Python value baked into "
                    "the program (hloalias cannot bake a tensor argument): pass it as a regular input"
                )

    def _positional_statics(self, args: tuple[Any, ...]) -> list[tuple[str, Any]]:
        """Static arguments named in ``static_argnames`` but passed by position."""
        return [
            (f"argument '{name}'", args[i]) for i, name in enumerate(self._positional_names)
            if i < len(args) and name in self.static_argnames
        ]

    # -- compiling ----------------------------------------------------------
    def _compile(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Executable:
        return compile_executable(
            self.fn, args, kwargs,
            donate_argnums=self.donate_argnums, donate_argnames=self.donate_argnames,
            pipeline=self.pipeline, device=self.device,
        )

    def _executable(self, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Executable:
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                self.stats.hits += 1
                return entry.executable
        modes_before_trace = ModuleModes.of(self.fn) if self._modes is not None else None
        executable = self._compile(args, kwargs)
        description = self._describe(args, kwargs)
        if self._modes is not None:
            # A forward that sets an attribute it reads (a call counter) set
            # it while torch traced: not a setting (the key leaves it out).
            after = ModuleModes.of(self.fn)
            self._modes = after.without_written(modes_before_trace) if after is not None else None
            key = self._key(args, kwargs)
        with self._lock:
            entry = self._cache.peek(key)
            if entry is not None:  # another thread compiled it meanwhile
                return entry.executable
            self.stats.compiles += 1
            self.stats.evictions += self._cache.put(key, _Entry(executable, description))
        return executable

    def _describe(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        parts = [_leaf_text(leaf) for leaf in pytree.tree_leaves(args)]
        parts += [f"{key}={', '.join(_leaf_text(leaf) for leaf in pytree.tree_leaves(value))}"
                  for key, value in kwargs.items()]
        return "(" + ", ".join(parts) + ")"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run ``f`` on the inputs: compiled now for a new signature."""
        return self._executable(self._key(args, kwargs), args, kwargs)(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Import ``f`` for this signature and stop before the passes."""
        key = self._key(args, kwargs)
        with traced_as_plain():
            program = import_cached(self.fn, args, kwargs, lambda: import_torch(self.fn, args, kwargs))
        return Lowered(self, key, args, kwargs, program)

    # -- reports ------------------------------------------------------------
    @property
    def signatures(self) -> list[str]:
        """The cached signatures in words, least recently used first."""
        with self._lock:
            return [entry.description for entry in self._cache.values()]

    @property
    def executables(self) -> list[Executable]:
        """The cached executables, least recently used first."""
        with self._lock:
            return [entry.executable for entry in self._cache.values()]

    def explain(self) -> str:
        """Counts, then every cached signature with its executable's
        :meth:`~hloalias.Executable.explain`.  Returns the text."""
        with self._lock:
            entries = list(self._cache.values())
            stats = dataclasses.replace(self.stats)
        lines = [
            f"hloalias.jit of {getattr(self.fn, '__qualname__', type(self.fn).__name__)}: "
            f"{stats.compiles} compile(s), {stats.hits} cache hit(s), {stats.evictions} eviction(s); "
            f"{len(entries)} of at most {self.cache_size} signature(s) cached"
        ]
        for number, entry in enumerate(entries):
            lines.append(f"signature {number}: {entry.description}")
            lines.extend("  " + line for line in entry.executable.explain().splitlines())
        return "\n".join(lines)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The module's state as the device holds it (host copies): every
        cached executable shares it, so any of them answers.  Empty before
        the first compile."""
        executables = self.executables
        return executables[-1].state_dict() if executables else {}

    def clear(self) -> None:
        """Drop every cached executable (the counters stay)."""
        with self._lock:
            self._cache.clear(reset_stats=False)


def jit(
    f: torch.nn.Module | Callable[..., Any] | None = None,
    *,
    donate_argnums: Sequence[int] = (),
    donate_argnames: Sequence[str] = (),
    static_argnums: Sequence[int] = (),
    static_argnames: Sequence[str] = (),
    pipeline: str | None = None,
    device: Any = None,
    cache_size: int | None = None,
) -> Any:
    """``f`` compiled on first call and once per new input signature (a
    :class:`Jit`); without ``f``, a decorator.  ``device`` is a platform
    name, a ``torch.device`` or a jax device; ``cache_size`` (default
    ``HLOALIAS_JIT_CACHE_SIZE``, 8) how many signatures it keeps."""
    options: dict[str, Any] = dict(
        donate_argnums=donate_argnums, donate_argnames=donate_argnames, static_argnums=static_argnums,
        static_argnames=static_argnames, pipeline=pipeline, device=device, cache_size=cache_size,
    )
    if f is None:
        return lambda g: Jit(g, **options)
    return Jit(f, **options)
