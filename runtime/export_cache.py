"""In-process cache of imported programs: compiling the same torch program
on inputs of the same kind twice reuses the first import (``torch.export``,
decompositions, FX import, lowering to StableHLO), not only the executable.

What the key holds, and why each part is there (an entry may be returned
only when a fresh import would produce the same program):

- **The callable's identity**: the ``nn.Module``, function or
  ``ExportedProgram`` object itself, held by a weak reference; a lookup
  checks that the reference still points at the same object, so a new
  object that reuses a dead one's ``id`` never matches.
- **The code**: for every submodule (``named_modules``, duplicates kept),
  its name, class, the code object of its class's ``forward`` and of an
  instance-level ``forward`` override, its ``training`` flag, and the
  identities of its forward hooks and pre-hooks; for a plain function its
  code object and, for each closure cell, the cell's fingerprint below.
- **The state**: every parameter, buffer and other tensor attribute of
  every submodule by name with its identity, shape, dtype, strides,
  storage pointer, ``requires_grad`` and version counter (bumped by every
  in-place write), so new values, replaced tensors, changed shapes or
  dtypes all miss; every plain Python attribute (``bool``, ``int``,
  ``float``, ``str``, ``None``, tuples and frozen dataclasses of these) by
  value, since forward may read it as a static value.
- **The inputs**: the pytree structure of ``(args, kwargs)``, and per leaf
  either the tensor's shape, dtype, strides and ``requires_grad`` (the
  values are not part of an exported program) or the static value itself.
- **The globals the code reads**: for the code of every forward above (and
  of a plain function), each module-level global name it reads: a scalar,
  tuple, dtype or tensor by value as above, a module or class by identity,
  a Python function by identity and code, and (for functions outside the
  libraries) the globals *it* reads in turn, three calls deep.
- **Process settings export reads**: grad mode, the default dtype and
  the global module forward hooks and pre-hooks.

Not in the key, so not reused: a callable with a closure cell, attribute
or input leaf of any other type (a list, a dict, an object), and a global of
such a type read by the code, make the program uncacheable:
:func:`fingerprint` returns ``None``.  Not seen: globals read by library
code (torch, transformers, ...) and by functions reached other than by a
global name (an attribute of an imported module) or more than three calls
deep; ``HLOALIAS_EXPORT_CACHE=0`` turns this cache off.

Entries hold the imported program's text (printed before any pass ran)
and signature; a hit parses a fresh module, so the passes that run on it
in place never touch the cached one.  At most
``HLOALIAS_EXPORT_CACHE_SIZE`` programs (default ``MAX_ENTRIES``, read at
each new entry; 0 keeps none) are kept, least recently used dropped first, and
an entry goes when its program object is garbage-collected (the entry
holds the state tensors the import captured)."""

from __future__ import annotations

import dataclasses
import os
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from hloalias import config
from hloalias.frontend.importer import Program
from hloalias.lru import BoundedLRU
from hloalias.mlir import compile_context, parse_module, print_module
from hloalias.runtime.state import user_forward_pre_hooks

MAX_ENTRIES = 32
_SCALARS = (bool, int, float, str, type(None))


class _Uncacheable(Exception):
    pass


def max_entries() -> int:
    """The bound: ``HLOALIAS_EXPORT_CACHE_SIZE`` (module docstring)."""
    configured = config.integer("HLOALIAS_EXPORT_CACHE_SIZE")
    return MAX_ENTRIES if configured is None else configured


_ENTRIES: BoundedLRU[Any, tuple[weakref.ref[Any], str, Program]] = BoundedLRU(max_entries)
_LOCK = threading.Lock()
_STATS = {"hits": 0, "misses": 0, "uncacheable": 0}


def export_cache_stats() -> dict[str, int]:
    """Counters: ``hits``, ``misses`` and ``uncacheable`` compiles (live)."""
    return _STATS


def clear_export_cache() -> None:
    """Drop every cached import and reset the counters."""
    with _LOCK:
        _ENTRIES.clear()
        for name in _STATS:
            _STATS[name] = 0


def enabled() -> bool:
    """False when ``HLOALIAS_EXPORT_CACHE`` is 0/off/false/no."""
    return config.flag("HLOALIAS_EXPORT_CACHE")


def _static(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return (type(value).__name__, value)
    if isinstance(value, (torch.dtype, torch.device)):
        return (type(value).__name__, str(value))
    if isinstance(value, tuple):
        return ("tuple", tuple(_static(v) for v in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and value.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return (type(value), tuple((field.name, _static(getattr(value, field.name)))
                                   for field in dataclasses.fields(value)))
    raise _Uncacheable


def _tensor(tensor: torch.Tensor) -> Any:
    return (id(tensor), tuple(tensor.shape), str(tensor.dtype), tuple(tensor.stride()),
            tensor.data_ptr(), tensor.requires_grad, tensor._version, type(tensor).__name__)


def _value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", _tensor(value))
    return _static(value)


_LIBRARIES = ("torch", "transformers", "jax", "numpy", "hloalias", "functools", "typing")


def _global_names(code: types.CodeType) -> set[str]:
    """Names ``code`` (and code nested in it) may read as globals."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names


def _globals_print(fn: Any, depth: int = 0, seen: set[int] | None = None) -> Any:
    """The module-level globals the code of ``fn`` reads (see the module
    docstring); raises _Uncacheable for a global of a mutable kind."""
    code = getattr(fn, "__code__", None)
    namespace = getattr(fn, "__globals__", None)
    if not isinstance(code, types.CodeType) or not isinstance(namespace, dict):
        return ()
    seen = set() if seen is None else seen
    if id(code) in seen:
        return ()
    seen.add(id(code))
    parts: list[Any] = []
    for name in sorted(_global_names(code)):
        if name not in namespace:
            continue  # a builtin, an attribute name, or not defined yet
        value = namespace[name]
        if isinstance(value, (types.ModuleType, type, types.BuiltinFunctionType)):
            parts.append((name, id(value)))
        elif isinstance(value, types.FunctionType):
            library = (value.__module__ or "").split(".")[0] in _LIBRARIES
            inner = () if library or depth >= 3 else _globals_print(value, depth + 1, seen)
            parts.append((name, id(value), value.__code__, inner))
        elif callable(value) and not isinstance(value, torch.Tensor):
            parts.append((name, id(value)))  # torch ops, partials, other callables: by identity
        else:
            parts.append((name, _value(value)))
    return tuple(parts)


def _module_print(module: torch.nn.Module) -> Any:
    parts: list[Any] = []
    for name, sub in module.named_modules(remove_duplicate=False):
        forward = type(sub).forward
        own_forward = sub.__dict__.get("forward")
        parts.append((
            name, type(sub), getattr(forward, "__code__", forward),
            None if own_forward is None else getattr(own_forward, "__code__", id(own_forward)),
            _globals_print(forward), _globals_print(own_forward),
            sub.training,
            tuple(id(h) for h in sub._forward_hooks.values()),
            tuple(id(h) for h in user_forward_pre_hooks(sub)),
        ))
        for attr, value in sorted(sub.__dict__.items()):
            if attr in ("_parameters", "_buffers"):
                for tensor_name, tensor in sorted(value.items()):
                    parts.append((attr, tensor_name, None if tensor is None else _tensor(tensor)))
            elif attr.startswith("_") or attr in ("training", "forward") or isinstance(value, torch.nn.Module):
                continue  # torch's bookkeeping (hooks above), submodules (own entries)
            else:
                parts.append((attr, _value(value)))
    return tuple(parts)


def _global_hooks_print() -> Any:
    """The identities of the global module forward hooks and pre-hooks
    (``register_module_forward_hook``): export runs them on every module."""
    hooks = torch.nn.modules.module
    return tuple(
        tuple(id(h) for h in getattr(hooks, name, {}).values())
        for name in ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_always_called")
    )


def _function_print(fn: Callable[..., Any]) -> Any:
    code = getattr(fn, "__code__", None)
    if code is None:
        raise _Uncacheable
    cells = tuple(_value(cell.cell_contents) for cell in (getattr(fn, "__closure__", None) or ()))
    defaults = tuple(_value(v) for v in (getattr(fn, "__defaults__", None) or ()))
    return (code, cells, defaults, _globals_print(fn))


def fingerprint(f: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The cache key of importing ``f`` on ``(args, kwargs)``, or ``None``
    when some part cannot be fingerprinted (see the module docstring)."""
    try:
        if isinstance(f, ExportedProgram):
            program_print: Any = ("exported",)  # immutable once built; identity suffices
        elif isinstance(f, torch.nn.Module):
            program_print = ("module", _module_print(f))
        elif callable(f):
            program_print = ("function", _function_print(f))
        else:
            return None
        leaves, spec = pytree.tree_flatten((args, kwargs))
        inputs = tuple(
            ("tensor", tuple(leaf.shape), str(leaf.dtype), tuple(leaf.stride()), leaf.requires_grad)
            if isinstance(leaf, torch.Tensor) else _static(leaf)
            for leaf in leaves
        )
        return (id(f), program_print, str(spec), inputs, torch.is_grad_enabled(), str(torch.get_default_dtype()),
                _global_hooks_print())
    except _Uncacheable:
        return None
    except TypeError:  # unhashable or odd attribute values
        return None


def _forget(dead: weakref.ref[Any]) -> None:
    """Drop the entries of a collected program object, so the cache never
    keeps its state tensors alive."""
    with _LOCK:
        _ENTRIES.remove_where(lambda _, entry: entry[0] is dead)


def import_cached(f: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                  do_import: Callable[[], Program]) -> Program:
    """A program for ``f`` on ``(args, kwargs)``: a clone of the cached
    import when the fingerprint matches, else ``do_import()`` (cached)."""
    key = fingerprint(f, args, kwargs) if enabled() else None
    if key is None:
        with _LOCK:
            _STATS["uncacheable"] += 1
        return do_import()
    try:
        hash(key)
    except TypeError:
        return do_import()
    with _LOCK:
        entry = _ENTRIES.peek(key)
        if entry is not None and entry[0]() is f:
            _ENTRIES.get(key)  # now the most recently used
            _STATS["hits"] += 1
            cached: tuple[str, Program] | None = (entry[1], entry[2])
        else:
            cached = None
    if cached is not None:
        text, template = cached
        module = parse_module(text, compile_context())
        return Program(module, template.stage, template.signature, template.state)
    program = do_import()
    try:
        reference = weakref.ref(f, _forget)
    except TypeError:
        return program
    with _LOCK:
        _STATS["misses"] += 1
        _ENTRIES.put(key, (reference, print_module(program.torch_mlir_module, debug_info=True), program))
    return program
