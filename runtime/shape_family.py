"""New input sizes of a module compiled before, in this process, from one
export with dynamic dimensions (:mod:`hloalias.frontend.shape_specialization`).

As ``torch.compile``'s automatic dynamic shapes, one size later: the first
``static_sizes()`` distinct sizes of a module compile statically, each
traced as it is (the first compile's one ``make_fx`` trace,
:mod:`hloalias.frontend.single_trace`).  The next compile of the same
module object on inputs that differ only in sizes (same structure, dtypes,
ranks, code, configuration and state: the program-cache key,
:mod:`hloalias.runtime.source_key`, of the call with the sizes left out)
exports once more with every dimension that changed among them dynamic,
and from then on every size is a specialization of that export: no
``torch.export``, no decomposition retrace; the FX import, the lowering,
the passes and XLA still run for the new sizes.

Why not export dynamically at the second size: the symbolic trace costs
several static ones (torch reasons about every size symbolically), so a
model compiled at two sizes only would pay more for its second size than
for its first; a static compile of the second size costs what the first
did, and the dynamic export waits until a third size shows that sizes
vary (a rent-or-buy choice: at most the static compiles' cost is spent
before the export, which serves every later size).
``HLOALIAS_SHAPE_FAMILY_STATIC_SIZES`` sets how many sizes compile
statically first (1: the export at the second size).  Sizes that would
export a changed dimension at 0 or 1 (sizes export fixes) compile
statically too, and the export waits for sizes that can stand for the
others.  Where the model's code depends on a changed
dimension (export fixes it), where the dynamic export fails, where a later
call changes a dimension that export kept static, or where the new sizes
fail a guard of the dynamic export (the model's code branched on a size,
``if x.shape[1] % 2 == 0``, and the export holds the example's branch),
the compile takes the usual path (:func:`hloalias.frontend.importer.import_torch`), and
:func:`shape_family_stats` says why.

The specialized program is the one a fresh export of the concrete sizes
gives (``test/py/test_shape_family.py`` compares the imported modules'
text); its state is the module's own tensors, checked by identity at each
specialization (a replaced parameter makes the module a new family).
A module may key itself (a ``shape_family_key()`` method: the text of
its code and settings, cheaper than the program-cache key's printing)
and set its own ``shape_family_static_sizes``: the ``torch.compile``
backend's graphs do (:mod:`hloalias.runtime.dynamo_backend`).
``HLOALIAS_SHAPE_FAMILY=0`` turns this off.  At most
``HLOALIAS_SHAPE_FAMILY_CACHE_SIZE`` modules (default ``MAX_FAMILIES``,
read at each new family; 0 keeps none) are kept (least recently used
dropped); a family goes when its
module is garbage-collected (its dynamic export holds the state tensors)."""

from __future__ import annotations

import dataclasses
import re
import threading
import weakref
from typing import Any

import torch
import torch.utils._pytree as pytree

from hloalias import config
from hloalias.errors import TorchImportError
from hloalias.frontend.importer import Program, Stage, import_torch
from hloalias.lru import BoundedLRU
from hloalias.frontend.shape_specialization import (
    DynamicExport,
    NotSpecializable,
    export_dynamic,
    import_specialized,
)
from hloalias.runtime.source_key import Uncacheable, source_key

MAX_FAMILIES = 16


@dataclasses.dataclass
class ShapeFamilyStats:
    """Counters (live): ``first`` imports of a family (the sizes as they
    are), ``static`` imports of a family's later sizes before its dynamic
    export (each traced as it is, module docstring), ``exported`` dynamic
    exports, ``specialized`` imports from one, ``fallbacks`` to the usual
    import, with the ``reasons`` (last 8)."""

    first: int = 0
    static: int = 0
    exported: int = 0
    specialized: int = 0
    fallbacks: int = 0
    reasons: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Family:
    reference: weakref.ref[Any]
    #: the distinct input sizes compiled statically, the first compile's first
    sizes: list[tuple[tuple[int, ...], ...]]
    dynamic: DynamicExport | None = None
    refused: str | None = None


def max_families() -> int:
    """The bound: ``HLOALIAS_SHAPE_FAMILY_CACHE_SIZE`` (module docstring)."""
    configured = config.integer("HLOALIAS_SHAPE_FAMILY_CACHE_SIZE")
    return MAX_FAMILIES if configured is None else configured


_FAMILIES: BoundedLRU[str, _Family] = BoundedLRU(max_families)
_LOCK = threading.Lock()
_STATS = ShapeFamilyStats()


def shape_family_stats() -> ShapeFamilyStats:
    return _STATS


def clear_shape_families() -> None:
    """Forget every family and reset the counters."""
    global _STATS
    with _LOCK:
        _FAMILIES.clear()
        _STATS = ShapeFamilyStats()


def enabled() -> bool:
    return config.flag("HLOALIAS_SHAPE_FAMILY")


def static_sizes() -> int:
    """How many distinct sizes of a family compile statically before its
    dynamic export (module docstring); at least 1, the first compile."""
    return max(1, config.integer("HLOALIAS_SHAPE_FAMILY_STATIC_SIZES") or 1)


def _inputs_kinds(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]] | None:
    """The inputs' pytree spec and, per leaf, what the family key holds of
    it (dtype, rank, ``requires_grad``, device), or None where there is no
    family: an input that is not a contiguous tensor, inputs sharing
    memory.  Cheap (no printing of the module)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    storages = set()
    kinds = []
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor) or leaf.layout != torch.strided or not leaf.is_contiguous():
            return None
        storage = leaf.untyped_storage().data_ptr()
        if storage in storages and leaf.numel():
            return None
        storages.add(storage)
        kinds.append((str(leaf.dtype), leaf.dim(), leaf.requires_grad, str(leaf.device)))
    return spec, kinds


def _family_key(f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], program: Any = None) -> str | None:
    """The program-cache key of ``f`` with the inputs' sizes left out, or
    None where there is no family: not a module, an input that is not a
    contiguous tensor, inputs sharing memory, or no sound key.
    ``program``: ``f``'s printing from this compile's program-cache key
    (:func:`hloalias.runtime.source_key.keyed_source`), taken before its
    import as this key is: not printed again."""
    if not isinstance(f, torch.nn.Module):
        return None
    own_key = getattr(f, "shape_family_key", None)
    found = _inputs_kinds(args, kwargs)
    if found is None:
        return None
    spec, kinds = found
    if callable(own_key):
        # A module that keys its program itself (a dynamo graph, by the
        # text of its generated code): found only under this very object,
        # as every family.
        return f"{own_key()!r} {spec} {tuple(kinds)} {torch.is_grad_enabled()} {torch.get_default_dtype()}"
    try:
        return source_key(f, (), {}, ("shape family", str(spec), tuple(kinds)), program)
    except Uncacheable:
        return None


def _unkeyed(f: Any) -> str:
    """Where the family of module ``f`` waits for its key (import_program):
    no key is this (keys are SHA-256 hex digits or a module's own key's
    ``repr``, which starts with a quote or a letter), and the family's
    weak reference (checked at every use) tells a reused ``id`` apart."""
    return f"\0unkeyed {id(f)}"


def _forget(dead: weakref.ref[Any]) -> None:
    """Drop the family of a collected module: its dynamic export holds the
    module's state tensors."""
    with _LOCK:
        _FAMILIES.remove_where(lambda _, family: family.reference is dead)


def _rekey(key: str, family: _Family, f: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Key ``family`` again after a dynamic export of ``f``: ``torch.export``
    puts back the module's container attributes as new objects (a
    transformers model's ``_pp_plan``), which the key prints differently;
    the first import's own export did that before its re-keying, but where
    that import took one ``make_fx`` trace (frontend/single_trace.py) the
    first ``torch.export`` may be this one."""
    new = _family_key(f, args, kwargs)
    if new is None or new == key:
        return
    with _LOCK:
        if _FAMILIES.peek(key) is family:
            _FAMILIES.pop(key)
            _FAMILIES.put(new, family)


def _fallback(reason: str) -> None:
    with _LOCK:
        _STATS.fallbacks += 1
        _STATS.reasons = [*_STATS.reasons[-7:], reason]


def import_program(f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], program_print: Any = None) -> Program:
    """The program of ``f`` on ``(args, kwargs)``: from the module's family
    when it has one for these sizes, else ``import_torch`` (see the module
    docstring).  ``program_print``: ``f``'s printing from the program-cache
    key its compile took just before (no code ran since), for the family
    key (:func:`_family_key`)."""
    if not enabled() or not isinstance(f, torch.nn.Module):  # only a module has a family
        return import_torch(f, args, kwargs)
    # A family is found only under its own module: for a module without
    # one (every first compile of a module object) no key can find one.
    # Nor is the key taken after such a compile's import: the family is
    # recorded unkeyed (_unkeyed), and the module's next compile, which
    # keys it before its import (the program-cache key's printing,
    # milliseconds for a large model), gives it that key.  A module
    # compiled once pays no key.
    with _LOCK:
        known = any(family.reference() is f for family in _FAMILIES.values())
    key = _family_key(f, args, kwargs, program_print) if known else None
    if known and key is None:
        return import_torch(f, args, kwargs)
    leaves = pytree.tree_leaves((args, kwargs))
    # Taken before the import, as the family records them (None: an input
    # that is not a tensor, which has no key either).
    tensors = all(isinstance(leaf, torch.Tensor) for leaf in leaves)
    sizes = tuple(tuple(leaf.shape) for leaf in leaves) if tensors else None
    family = None
    if key is not None:
        with _LOCK:
            family = _FAMILIES.peek(key)
            if family is not None and family.reference() is not f:
                family = None
            if family is None:
                # The module's unkeyed family, recorded by its first compile
                # (or by a compile whose key found none): this key is its.
                family = _FAMILIES.pop(_unkeyed(f), None)
                if family is not None and family.reference() is f:
                    _FAMILIES.put(key, family)
                else:
                    family = None
            if family is not None:
                _FAMILIES.get(key)  # now the most recently used
    if family is None:
        program = import_torch(f, args, kwargs)
        # Keyed at the module's next compile (above), before its import:
        # a model may set attributes on its first forward (transformers
        # records its modules' output names), which that key sees.  No
        # family for inputs that are not contiguous tensors or share
        # memory; a module without a sound key keeps an unkeyed family
        # that no compile finds.
        if sizes is None or _inputs_kinds(args, kwargs) is None:
            return program
        with _LOCK:
            _STATS.first += 1
            _FAMILIES.put(_unkeyed(f), _Family(weakref.ref(f, _forget), [sizes]))
        return program
    assert key is not None and sizes is not None  # found under a key: every input is a tensor
    if family.refused is not None:
        _fallback(family.refused)
        return import_torch(f, args, kwargs)
    if family.dynamic is None:
        if sizes in family.sizes:
            return import_torch(f, args, kwargs)
        if len(family.sizes) < getattr(f, "shape_family_static_sizes", static_sizes()):
            # Traced as it is, as the first compile was (module docstring).
            program = import_torch(f, args, kwargs)
            with _LOCK:
                family.sizes.append(sizes)
                _STATS.static += 1
            _rekey(key, family, f, args, kwargs)  # where that import ran torch.export
            return program
        # Dynamic: every dimension that differs among the sizes seen.
        changed = tuple(
            frozenset(d for d in range(len(now)) if any(seen[i][d] != now[d] for seen in family.sizes))
            for i, now in enumerate(sizes)
        )
        if any(sizes[i][d] < 2 for i, dims in enumerate(changed) for d in dims):
            # Export fixes a size of 0 or 1 (it specializes them), so this
            # example cannot stand for the others: compiled as it is, and
            # the export waits for sizes that can (the family is kept).
            program = import_torch(f, args, kwargs)
            with _LOCK:
                _STATS.static += 1
            return program
        try:
            family.dynamic = export_dynamic(f, args, kwargs, changed, refuse_returned_sizes=True)
        except TorchImportError as error:  # the model does not export with these dimensions dynamic
            family.refused = f"dynamic export: {str(error).splitlines()[0]}"
            _fallback(family.refused)
            _rekey(key, family, f, args, kwargs)
            return import_torch(f, args, kwargs)
        _rekey(key, family, f, args, kwargs)
        with _LOCK:
            _STATS.exported += 1
    try:
        program = import_specialized(family.dynamic, f, args, kwargs, Stage.STABLEHLO)
    except NotSpecializable as error:
        _fallback(str(error).splitlines()[0])
        return import_torch(f, args, kwargs)
    for name, tensor in program.state.items():
        if _state_path(f, name) is not tensor and not _created_in_forward(f, name):
            # A replaced tensor: export again (a new family).
            with _LOCK:
                _FAMILIES.pop(key, None)
            _fallback(f"state '{name}' was replaced since the dynamic export")
            return import_torch(f, args, kwargs)
    with _LOCK:
        _STATS.specialized += 1
    return program


_LIFTED = re.compile(r"(lifted_tensor|_tensor_constant)_?\d+")


def _created_in_forward(f: Any, name: str) -> bool:
    """Whether state ``name`` is a constant forward creates (``torch.tensor``
    of a config value), which export lifts under a name of its own: its
    value comes from the code and configuration, which the family's key
    holds.  A tensor attribute of the module is not one (its name is its
    path, checked by identity)."""
    return _state_path(f, name) is None and _LIFTED.fullmatch(name.rsplit(".", 1)[-1]) is not None


def _state_path(f: Any, name: str) -> Any:
    """The tensor at dotted attribute path ``name`` of ``f``, or None."""
    target = f
    for part in name.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target if isinstance(target, torch.Tensor) else None
