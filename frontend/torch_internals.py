"""The one place hloalias uses private ``torch.export`` internals
(torch 2.13): decomposing an exported program the way
``ExportedProgram.run_decompositions`` does, without its fixed per-call
cost.

``run_decompositions(table)`` does three things per call:

(a) splits the table into composite-implicit (CIA) operators and Python
    decompositions (``_split_decomp_table_to_cia_and_python_decomp``): it
    walks every registered operator (~0.1-0.5 s);
(b) for the retrace, overrides the Python kernels of every CIA operator
    (``_override_composite_implicit_decomp``: ~525 operators, ~11,500
    ``OperatorBase.py_impl`` calls, most of their time spent evaluating the
    ``Callable[_P, _T]`` annotations of ``py_impl``'s inner function: ~0.1 s
    idle), then restores them;
(c) retraces the program (``_decompose_exported_program``).

:func:`decompose` caches (a) (:func:`split_decomposition_table`), performs
(b) with :func:`cia_override`, which leaves every operator the Python
dispatcher resolves in the block in the same state as torch's override
(the same kernels under the same dispatch keys, the same fake-tensor rule)
and every operator in torch's state after exit, by writing the kernel
tables directly, with the per-operator callables built once, each
operator's when it is first resolved (:func:`eager_cia_override` writes
them all on entry, as torch does), and
lets torch do (c) with an empty CIA table (torch's own override is then a
no-op).  The first split in a process (and building torch-mlir's table)
materializes torch's CIA operators once instead of once per ``torch.ops``
namespace, and walks the registered operators for the preservable CIA set
once for both (once per operator registry across processes, where the
runtime hands over a store), asking each operator the cheaper of torch's
two preservability tests first (:func:`materialize_cia_ops_once`).

:func:`export_decomposed` is ``torch.export.export`` followed by
:func:`decompose` in one trace: torch's post-dispatch export (what
``torch.export`` traced before its training IR) with the same Python
table and the same CIA override, so the model runs through
functionalization and the decompositions once instead of being traced to
the training IR and retraced.  :func:`module_patches_skipped` keeps
``make_fx``'s tracer from swapping ``nn.Module``'s ``__getattr__`` and
``__call__`` for wrappers that change nothing for it (a per-class cost at
every trace).  :func:`signature_checked_once` runs torch's signature
check of an ``ExportedProgram`` with each signature property read once
(torch's is quadratic in mutated buffers), and :func:`eliminate_dead_code`
is ``Graph.eliminate_dead_code`` asking ``is_impure`` only of nodes
without users: both give torch's answers (tested in
``test/py/test_training_signature_check.py`` and below).
``test/py/test_torch_internals.py`` pins every private name used
here, compares the operator state under :func:`cia_override` (once
resolved) and :func:`eager_cia_override` with the state under torch's
override, and checks the decomposed graph and
signature against ``run_decompositions``; a torch that changes any of
them fails there.  A torch without these private names makes
:func:`decompose` fall back to ``run_decompositions``."""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._guards
import torch.fx
from torch.export import ExportedProgram

# Private names used (module -> names); pinned by the test.
PRIVATE_NAMES = {
    "torch.export.exported_program": (
        "_collect_all_valid_cia_ops",
        "_is_preservable_cia_op",
        "_split_decomp_table_to_cia_and_python_decomp",
        "_decompose_exported_program",
        "_disable_prexisiting_fake_mode",
        "_override_composite_implicit_decomp",
        "_AUTOGRAD_ALIAS_BACKEND_KEYS_TO_OVERRIDE",
        "_BACKEND_KEYS_TO_OVERRIDE",
        "_create_graph_module_for_export",
    ),
    "torch.export.decomp_utils": ("_collect_all_valid_cia_ops",),
    "torch._export.utils": (
        "_collect_all_valid_cia_ops", "_get_decomp_for_cia", "_materialize_cpp_cia_ops", "_compiling_state_context", "placeholder_naming_pass",
        "_is_preservable_cia_op", "_is_cia_op", "_check_valid_to_preserve",
    ),
    "torch._higher_order_ops.utils": ("autograd_not_implemented",),
    "torch._subclasses.fake_impls": ("op_implementations_dict", "op_implementations_checks", "_deregister_op_impl"),
    "torch.export._trace": ("_export", "_export_to_aten_ir", "_ignore_backend_decomps", "_get_forward_arg_names"),
    "torch.fx._lazy_graph_module": ("_use_lazy_graph_module", "_make_graph_module"),
    "torch._export.verifier": ("_verify_exported_program_signature",),
}

_SplitTable = tuple[dict[Any, Callable[..., Any]], dict[Any, Callable[..., Any]]]
#: The last split: ``{"split": (copy of its table, its registry_key(), split)}``.
_SPLIT_CACHE: dict[str, tuple[dict[Any, Callable[..., Any]], tuple[Any, ...], _SplitTable]] = {}
#: torch's preservable CIA operators under the :func:`registry_key` they were
#: collected at (one entry: the registry only grows).
_CIA_OPS_CACHE: dict[Any, frozenset[Any]] = {}
#: The modules that call ``_collect_all_valid_cia_ops`` by a name of their own.
_CIA_COLLECTORS = ("torch._export.utils", "torch.export.exported_program", "torch.export.decomp_utils")
#: The modules that call ``_is_preservable_cia_op`` by a name of their own
#: (the walk of each namespace and the split).
_PRESERVABLE_CHECKERS = ("torch._export.utils", "torch.export.exported_program")


def _cia_first_preservable(check_valid: Callable[[Any], bool], is_cia: Callable[[Any], bool],
                           original: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """torch's ``_is_preservable_cia_op`` (``_check_valid_to_preserve(op)
    and _is_cia_op(op)``) with its two tests in the other order: both only
    read the operator (pinned by the test), so the answer is the same, and
    most operators asked (every operator of every namespace in a walk, and
    the ~600 Python decompositions of a table in a split) are not CIA, which
    one dispatcher lookup says, while ``_check_valid_to_preserve`` reads
    the operator's tags and schema arguments first (~5 ms a cold compile).
    An object ``_is_cia_op`` cannot read is asked torch's way."""

    def preservable(op: Any) -> bool:
        try:
            cia = is_cia(op)
        except Exception:  # not an operator _is_cia_op reads: torch's order
            return original(op)
        return bool(cia) and check_valid(op)

    return preservable


@functools.cache
def _private() -> dict[str, Any] | None:
    """The private torch objects this module uses, or None when one is missing."""
    import importlib

    found: dict[str, Any] = {}
    for module_name, names in PRIVATE_NAMES.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return None
        for name in names:
            if not hasattr(module, name):
                return None
            found[name] = getattr(module, name)
    return found


def registry_key() -> tuple[Any, Any]:
    """What torch's set of preservable CIA operators
    (``_collect_all_valid_cia_ops``) depends on: the C++ dispatcher's
    CompositeImplicitAutograd registrations, the ``torch.ops`` namespaces
    and the operators each non-aten namespace holds (torch caches the aten
    namespace's part itself, unkeyed)."""
    cia_registrations = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    namespaces = tuple(
        (name, () if name == "aten" else tuple(getattr(torch.ops, name, ())))
        for name in sorted(torch.ops._dir)
    )
    return tuple(cia_registrations), namespaces


@contextlib.contextmanager
def materialize_cia_ops_once() -> Iterator[None]:
    """Within the block, torch's ``_materialize_cpp_cia_ops`` runs at most once.

    Collecting the CIA operators (first ``split_decomposition_table`` in a
    process, and torch-mlir's table, which asks torch for its default
    decompositions) calls it once per ``torch.ops`` namespace (~56), and
    each call fetches every CompositeImplicitAutograd registration from the
    dispatcher and ``getattr``s it into ``torch.ops``: idempotent, so once
    is the same (~0.1-0.2 s of a cold compile).

    ``_collect_all_valid_cia_ops`` (the walk over every registered operator
    that both make, ~10-20 ms each) is answered from the set collected by
    an earlier block while :func:`registry_key` is unchanged: the key
    holds what the walk reads that can change (the split cache,
    :func:`split_decomposition_table`, relies on the same key), and it is
    taken after a walk, which materializes operators into ``torch.ops``.
    Each caller gets its own copy.  Across processes the set is kept in
    :data:`CIA_OPS_STORE` (the disk cache, handed over by the runtime) under
    a digest of the key and torch's version, so a process whose registry
    matches an earlier one's does not walk (:func:`_stored_cia_ops`).
    ``_is_preservable_cia_op``, which the
    walks and the split ask of each operator, is answered with its two
    tests in the cheaper order (:func:`_cia_first_preservable`).  Without
    the private names the block changes nothing."""
    import importlib

    import torch._export.utils as export_utils

    original = getattr(export_utils, "_materialize_cpp_cia_ops", None)
    collectors = [importlib.import_module(name) for name in _CIA_COLLECTORS]
    original_collect = getattr(export_utils, "_collect_all_valid_cia_ops", None)
    if original is None or original_collect is None or not all(
        getattr(module, "_collect_all_valid_cia_ops", None) is original_collect for module in collectors
    ):
        yield
        return
    done = False

    def materialize_once() -> None:
        nonlocal done
        if not done:
            original()
            done = True

    def collect_once() -> set[Any]:
        # (An empty cache cannot hit: no key taken, ~0.5 ms in a cold process.)
        cached = _CIA_OPS_CACHE.get(registry_key()) if _CIA_OPS_CACHE else None
        if cached is None:
            # The walk materializes first (idempotent): doing it before
            # taking the key makes the key the one the walk's answer is
            # stored under.  Not on an in-process hit (~2 ms).
            materialize_once()
            key = registry_key()
            cached = _CIA_OPS_CACHE.get(key) or _stored_cia_ops(key)
            if cached is None:
                cached = frozenset(original_collect())
                key = registry_key()
                _store_cia_ops(key, cached)
            _CIA_OPS_CACHE.clear()
            _CIA_OPS_CACHE[key] = cached
        return set(cached)

    checkers = [importlib.import_module(name) for name in _PRESERVABLE_CHECKERS]
    original_preservable = getattr(export_utils, "_is_preservable_cia_op", None)
    reorder = (
        original_preservable is not None
        and all(getattr(module, "_is_preservable_cia_op", None) is original_preservable for module in checkers)
        and hasattr(export_utils, "_check_valid_to_preserve") and hasattr(export_utils, "_is_cia_op")
    )
    export_utils._materialize_cpp_cia_ops = materialize_once
    for module in collectors:
        module._collect_all_valid_cia_ops = collect_once  # type: ignore[attr-defined]
    if reorder and original_preservable is not None:
        preservable = _cia_first_preservable(
            export_utils._check_valid_to_preserve, export_utils._is_cia_op, original_preservable)
        for module in checkers:
            module._is_preservable_cia_op = preservable  # type: ignore[attr-defined]
    try:
        yield
    finally:
        export_utils._materialize_cpp_cia_ops = original
        for module in collectors:
            module._collect_all_valid_cia_ops = original_collect  # type: ignore[attr-defined]
        if reorder:
            for module in checkers:
                module._is_preservable_cia_op = original_preservable  # type: ignore[attr-defined]


#: Where :func:`materialize_cia_ops_once` keeps the walk's answer across
#: processes: ``[(read, write)]`` with ``read(key) -> bytes | None`` and
#: ``write(key, payload)``, installed by the runtime layer, which owns the
#: disk cache (this layer may not import it); empty: every process walks.
CIA_OPS_STORE: list[tuple[Callable[[str], bytes | None], Callable[[str, bytes], object]]] = []


def _cia_store_key(key: tuple[Any, Any]) -> str:
    """A digest of :func:`registry_key` ``key`` with torch's version: the
    registrations and each namespace's operators sorted (the dispatcher's
    and ``torch.ops``'s orders follow what a process touched first; the
    walk's answer is a set)."""
    import hashlib

    registrations, namespaces = key
    text = repr((torch.__version__, sorted(registrations), [(name, sorted(ops)) for name, ops in namespaces]))
    return hashlib.sha256(text.encode()).hexdigest()


def _operator_name(op: Any) -> str:
    """``namespace::name.overload`` of an ``OpOverload``."""
    return f"{op._schema.name}.{op._overloadname}"


def _stored_cia_ops(key: tuple[Any, Any]) -> frozenset[Any] | None:
    """The preservable CIA set a process with the same :func:`registry_key`
    stored (:data:`CIA_OPS_STORE`), or None: no store, no entry, or an
    operator it names not found.  Only the non-aten operators are stored:
    torch caches the aten namespace's part itself (unkeyed), and it is
    taken from that cache as torch's walk takes it."""
    if not CIA_OPS_STORE:
        return None
    import json

    import torch._export.utils as export_utils

    read, _ = CIA_OPS_STORE[0]
    payload = read(_cia_store_key(key))
    if payload is None:
        return None
    try:
        names = json.loads(payload)
        found = set(export_utils._collect_all_valid_cia_ops_for_aten_namespace())
        for name in names:
            qualified, overload = name.rsplit(".", 1)
            namespace, op_name = qualified.split("::")
            if namespace == "aten":
                return None
            found.add(getattr(getattr(getattr(torch.ops, namespace), op_name), overload))
    except (ValueError, TypeError, AttributeError, RuntimeError):
        return None  # not what this process would store: walk
    return frozenset(found)


def _store_cia_ops(key: tuple[Any, Any], ops: frozenset[Any]) -> None:
    if CIA_OPS_STORE:
        import json

        names = sorted(_operator_name(op) for op in ops if op.namespace != "aten")
        CIA_OPS_STORE[0][1](_cia_store_key(key), json.dumps(names).encode())


def split_decomposition_table(table: dict[Any, Callable[..., Any]]) -> _SplitTable:
    """``_split_decomp_table_to_cia_and_python_decomp(table)``, cached under
    :func:`registry_key` and the table: registering a custom op changes the key
    and the split is recomputed, as torch would.  Callers must not modify
    the returned dicts.

    The table's part of the key is checked as a copy of the table taken
    with the split (``copy == table``: the same pairs, what equal
    ``frozenset(table.items())`` means), which CPython compares with the
    hashes the dicts store: no ``OpOverload.__hash__`` call per entry
    (a Python method; ~1,100 entries each compile)."""
    private = _private()
    assert private is not None, "split_decomposition_table needs torch's private export names"
    dispatcher = registry_key()
    entry = _SPLIT_CACHE.get("split")  # one read: another thread may replace it
    if entry is not None and entry[1] == dispatcher and entry[0] == table:
        return entry[2]
    with materialize_cia_ops_once():
        cached: _SplitTable = private["_split_decomp_table_to_cia_and_python_decomp"](dict(table))
    # Keyed after the split: it materializes operators into torch.ops.
    # One live entry, replaced in one store: the registry only grows.
    _SPLIT_CACHE["split"] = (dict(table), registry_key(), cached)
    return cached


def _run_original_cia(fake_mode: Any, op: Any, *args: Any, original_callable: Any, **kwargs: Any) -> Any:
    """The fake-tensor rule torch's override registers for a CIA operator
    without one: run the operator's original CIA decomposition under the
    fake mode (so device-dependent CIA kernels trace as in eager)."""
    with fake_mode:
        return original_callable(*args, **kwargs)


@functools.cache
def _autograd_kernel(op: Any) -> Callable[..., Any]:
    """What torch's override registers under each autograd backend key of
    ``op`` (built once per operator; it depends only on the operator)."""
    private = _private()
    assert private is not None
    kernel: Callable[..., Any] = private["autograd_not_implemented"](op, deferred_error=True)
    return kernel


@functools.cache
def _filled_keys(op: Any) -> tuple[Callable[..., Any], dict[Any, Any]]:
    """For an op without a Python CIA kernel: its original CIA
    decomposition (torch's partial of the op) and what torch's override
    fills its backend and autograd keys with (built once per operator)."""
    private = _private()
    assert private is not None
    original: Callable[..., Any] = private["_get_decomp_for_cia"](op)
    backend_keys, autograd_keys = _override_keys()
    filled = dict.fromkeys(backend_keys, original)
    filled.update(dict.fromkeys(autograd_keys, _autograd_kernel(op)))
    return original, filled


@functools.cache
def _override_keys() -> tuple[dict[Any, None], dict[Any, None]]:
    """torch's backend and autograd keys to override, as dicts:
    ``dict.fromkeys(a_dict, value)`` reuses the hashes the dict stores,
    where a list's keys (pybind enums) are hashed again for every operator
    (~2 ms of a cold compile's ~500 operators).  Same keys, same order."""
    private = _private()
    assert private is not None
    return (dict.fromkeys(private["_BACKEND_KEYS_TO_OVERRIDE"]),
            dict.fromkeys(private["_AUTOGRAD_ALIAS_BACKEND_KEYS_TO_OVERRIDE"]))


_Rows = list[tuple[Any, Any, dict[Any, Any], Any]]
#: Per table: the table itself, its rows, and its operators (a set) and
#: their fake rules (a dict in the table's order): :func:`_prepared_entry`.
_PREPARED: dict[int, tuple[dict[Any, Callable[..., Any]], _Rows, tuple[frozenset[Any], dict[Any, Any]]]] = {}
_PREPARED_LOCK = threading.Lock()


def _prepared(cia_to_decomp: dict[Any, Callable[..., Any]]) -> _Rows:
    return _prepared_entry(cia_to_decomp)[0]


def _prepared_entry(
    cia_to_decomp: dict[Any, Callable[..., Any]],
) -> tuple[_Rows, tuple[frozenset[Any], dict[Any, Any]]]:
    """Per operator of ``cia_to_decomp`` (a table the caller does not
    modify: the cached split's): the operator, its decomposition, the
    kernel table :func:`cia_override` installs for it when it has no Python
    kernel of its own (its filled keys, then the CIA key), and the fake
    rule it installs where the operator has none (a partial of its
    original CIA decomposition: the same every time, :func:`_filled_keys`).
    Built once per table (the last two tables are kept, with the tables
    themselves, so that an ``id`` is never reused for another).  Also the
    operators as a set and their fake rules as a dict: both hold each
    operator's hash, so set and dict operations between them and torch's
    rule dict call no ``OpOverload.__hash__`` (a Python method)."""
    entry = _PREPARED.get(id(cia_to_decomp))
    if entry is not None and entry[0] is cia_to_decomp:
        return entry[1], entry[2]
    cia_key = torch._C.DispatchKey.CompositeImplicitAutograd
    rows = []
    for op, decomposition in cia_to_decomp.items():
        original, filled = _filled_keys(op)
        unpatched = filled.copy()
        unpatched[cia_key] = decomposition
        rows.append((op, decomposition, unpatched, functools.partial(_run_original_cia, original_callable=original)))
    rules = {op: fake_rule for op, _, _, fake_rule in rows}
    with _PREPARED_LOCK:
        while len(_PREPARED) >= 2:
            _PREPARED.pop(next(iter(_PREPARED)))
        _PREPARED[id(cia_to_decomp)] = (cia_to_decomp, rows, (frozenset(rules), rules))
    return rows, (frozenset(rules), rules)


def _patched_kernels(op: Any, decomposition: Any, unpatched: dict[Any, Any], fake_rule: Any,
                     ) -> tuple[dict[Any, Any], dict[Any, Any], Any, bool]:
    """For one row of :func:`_prepared_entry`: the operator's kernel table
    now, the table :func:`cia_override` installs in its place, the fake
    rule it installs where the operator has none, and whether that rule was
    built here (an operator with a Python CIA kernel of its own)."""
    kernels = op.py_kernels
    if not kernels:  # the usual case: no Python kernel of its own
        return kernels, unpatched.copy(), fake_rule, False
    cia_key = torch._C.DispatchKey.CompositeImplicitAutograd
    own = False
    # Taken before the CIA entry is replaced (torch's order).  An op
    # without a Python CIA kernel gets the same partial of itself
    # every time: its filled keys are built once (_filled_keys).
    if cia_key in kernels and not isinstance(kernels[cia_key], torch._C.DispatchKey):
        private = _private()
        assert private is not None
        backend_keys, autograd_keys = _override_keys()
        original = private["_get_decomp_for_cia"](op)
        patched = dict.fromkeys(backend_keys, original)
        patched.update(dict.fromkeys(autograd_keys, _autograd_kernel(op)))
        fake_rule = functools.partial(_run_original_cia, original_callable=original)
        own = True
    else:
        patched = _filled_keys(op)[1].copy()
    # Kernels already registered under a key stay (torch only fills
    # missing keys); the CIA key is replaced.
    patched.update(kernels)
    patched[cia_key] = decomposition
    return kernels, patched, fake_rule, own


#: The operators' dispatch-cache misses go through :func:`cia_override`'s
#: hook while a lazy override is on (one at a time; see there).
_LAZY_ACTIVE = [False]
#: The active lazy block's "patch every operator now" (a nested override's first step).
_LAZY_FINISH: list[Callable[[], None] | None] = [None]
#: The active (or interrupted) lazy block's restoration, and whether its
#: exit began (then the next override's entry finishes it).
_LAZY_RESTORE: list[Callable[[], None] | None] = [None]
_LAZY_CLOSING = [False]


def _lazy_dispatch_names() -> tuple[Any, Any] | None:
    """torch's ``OpOverload._get_dispatch`` (the function every
    dispatch-cache miss of the Python dispatcher calls) and its set of
    operators with a dispatch cache (``torch._ops.cached_ops``), or None
    when either is missing (then :func:`cia_override` installs eagerly)."""
    import torch._ops as ops_module

    get_dispatch = ops_module.OpOverload.__dict__.get("_get_dispatch")
    cached = getattr(ops_module, "cached_ops", None)
    if get_dispatch is None or not isinstance(cached, set):
        return None
    return get_dispatch, cached


@contextlib.contextmanager
def cia_override(cia_to_decomp: dict[Any, Callable[..., Any]]) -> Iterator[None]:
    """What :func:`eager_cia_override` installs, each operator's part
    installed when the Python dispatcher first resolves a kernel of it in
    the block, which is the only way the override's kernels are ever run:
    they are Python kernels (``py_kernels``), which only the Python
    dispatcher reads, through ``OpOverload._get_dispatch`` on a miss of the
    operator's dispatch cache.  Within the block that method is a hook
    that, on an operator of the table not yet patched, patches it (its
    kernel table and fake rule, as the eager override does) before
    torch's method resolves the key.  Dispatch caches filled before the
    block would skip the hook, so the table's operators that have one
    (``torch._ops.cached_ops``, the set torch adds every operator to when it
    fills its cache) are emptied on entry.  On exit the patched operators
    get their tables back and every operator of the table loses its fake
    rule (torch's exit drops them all, a prior one too).

    Most traces resolve none or a few of the ~525 operators: the eager
    override's two walks over all of them (a kernel table swapped, a dict
    copied, a rule added and popped, each operator's objects fetched from
    memory) were a large share of a warm seed compile
    (``bench/RESULTS-latency.md``, session 48).

    What differs from the eager override while the block runs: an
    operator not yet dispatched under the Python dispatcher still shows its
    own ``py_kernels`` and no fake rule to code that reads them directly.
    torch reads them for an operator that reached a mode's dispatch
    (``decompose``, the fake rules), which under the Python dispatcher
    resolved it first; an operator dispatched with the Python dispatcher
    off (torch does so for ``prims.item``'s aten implementation on real
    tensors) reaches a mode with its own tables.  Nested overrides, a torch
    without the names used (:func:`_lazy_dispatch_names`) or a hook already
    in place install eagerly.  A Ctrl-C in the exit leaves the rest of it
    to the next override's entry (:func:`_finish_restore`)."""
    names = _lazy_dispatch_names()
    import torch._ops as ops_module

    if names is None:
        with eager_cia_override(cia_to_decomp):
            yield
        return
    get_dispatch, cached_ops = names
    py_impl = ops_module.OperatorBase.py_impl
    private = _private()
    assert private is not None, "cia_override needs torch's private export names"
    fake_rules = private["op_implementations_dict"]
    rows, (ops, _) = _prepared_entry(cia_to_decomp)
    pending = dict(_rows_by_id(cia_to_decomp))
    saved: list[tuple[Any, dict[Any, Any]]] = []
    patch_lock = threading.RLock()

    def patch(op: Any) -> None:
        row = pending.pop(id(op), None)
        if row is not None and row[0] is op:
            kernels, patched, fake_rule, _ = _patched_kernels(*row)
            saved.append((op, kernels))  # recorded first: restored if interrupted
            op.py_kernels = patched
            op._dispatch_cache.clear()
            if op not in fake_rules:
                fake_rules[op] = fake_rule

    def hooked_get_dispatch(self: Any, key: Any) -> Any:
        if pending:
            with patch_lock:
                patch(self)
        return get_dispatch(self, key)

    def hooked_py_impl(self: Any, key: Any) -> Any:
        # A kernel registered in the block goes into the patched table, as
        # under the eager override, and is gone after it.
        if pending:
            with patch_lock:
                patch(self)
        return py_impl(self, key)

    def finish() -> None:
        with patch_lock:
            for row in rows:
                patch(row[0])

    def restore() -> None:
        # Idempotent, each step done before it is dropped: a Ctrl-C inside
        # it leaves the rest to the next override's entry (_finish_restore).
        pending.clear()
        if ops_module.OpOverload.__dict__.get("py_impl") is hooked_py_impl:
            del ops_module.OpOverload.py_impl
        if ops_module.OpOverload.__dict__.get("_get_dispatch") is hooked_get_dispatch:
            ops_module.OpOverload._get_dispatch = get_dispatch  # type: ignore[method-assign]
        while saved:
            op, kernels = saved[-1]
            op.py_kernels = kernels
            op._dispatch_cache.clear()
            saved.pop()
        # torch's exit drops every operator's fake rule (_deregister_op_impl).
        checked = {id(check) for check, _ in private["op_implementations_checks"]}
        for op in ops & set(fake_rules):
            if id(op) in checked:
                private["_deregister_op_impl"](op)
            else:
                fake_rules.pop(op, None)
        _LAZY_FINISH[0] = None
        _LAZY_RESTORE[0] = None
        _LAZY_CLOSING[0] = False
        _LAZY_ACTIVE[0] = False

    _finish_restore()
    lazy = ops_module.OpOverload.__dict__.get("_get_dispatch") is get_dispatch \
        and "py_impl" not in ops_module.OpOverload.__dict__
    claimed = False
    # No call between the check and the claim: no Ctrl-C (or thread
    # switch) lands between them, nor between the claim and the try.
    if lazy and not _LAZY_ACTIVE[0]:
        _LAZY_ACTIVE[0] = True
        claimed = True
    try:
        if not claimed:
            with eager_cia_override(cia_to_decomp):
                yield
            return
        _LAZY_RESTORE[0] = restore
        _LAZY_FINISH[0] = finish
        # Caches filled before the block would skip the hook.
        for op in ops & cached_ops:
            op._dispatch_cache.clear()
        ops_module.OpOverload._get_dispatch = hooked_get_dispatch  # type: ignore[method-assign]
        ops_module.OpOverload.py_impl = hooked_py_impl  # type: ignore[method-assign, assignment]
        yield
    finally:
        if claimed:
            _LAZY_CLOSING[0] = True
            _LAZY_RESTORE[0] = restore
            restore()


def _finish_restore() -> None:
    """Finish the restoration a Ctrl-C cut short in a lazy
    :func:`cia_override`'s exit (its steps are idempotent)."""
    left = _LAZY_RESTORE[0]
    if left is not None and _LAZY_CLOSING[0]:
        left()


def _rows_by_id(cia_to_decomp: dict[Any, Callable[..., Any]]) -> dict[int, tuple[Any, Any, dict[Any, Any], Any]]:
    """:func:`_prepared_entry`'s rows by their operator's ``id`` (an int
    key: no ``OpOverload.__hash__`` call per look-up), built once per table."""
    rows = _prepared(cia_to_decomp)
    entry = _BY_ID.get(id(rows))
    if entry is not None and entry[0] is rows:
        return entry[1]
    by_id = {id(row[0]): row for row in rows}
    with _PREPARED_LOCK:
        while len(_BY_ID) >= 2:
            _BY_ID.pop(next(iter(_BY_ID)))
        _BY_ID[id(rows)] = (rows, by_id)
    return by_id


_BY_ID: dict[int, tuple[_Rows, dict[int, tuple[Any, Any, dict[Any, Any], Any]]]] = {}


@contextlib.contextmanager
def eager_cia_override(cia_to_decomp: dict[Any, Callable[..., Any]]) -> Iterator[None]:
    """Install, for the duration of the block, what torch's
    ``_override_composite_implicit_decomp(cia_to_decomp)`` installs, and
    restore each operator's Python kernels and fake rule after it exactly
    as torch does.  Per operator ``op`` with decomposition ``fn``:

    - each autograd backend key without a Python kernel gets torch's
      deferred "autograd not implemented" kernel;
    - the CompositeImplicitAutograd key gets ``fn`` (the table's
      decomposition, or torch's marker that preserves the op);
    - each backend key without a Python kernel gets the op's original CIA
      decomposition (constant propagation on real tensors runs eager's);
    - an op without a fake-tensor rule gets one that runs the original CIA
      decomposition under the fake mode.

    torch does the same through ``py_impl``, whose cost is the point of
    this function; the dispatch cache of each operator is cleared as
    ``py_impl`` clears it."""
    private = _private()
    assert private is not None, "cia_override needs torch's private export names"
    _finish_restore()
    outer = _LAZY_FINISH[0]
    if outer is not None:
        # Inside a lazy block: its operators all patched first, so that this
        # override saves and restores what it would inside an eager one.
        outer()
    # Dicts, not lists: dict.fromkeys(a_dict) reuses the stored key hashes.
    backend_keys, autograd_keys = _override_keys()
    get_decomp_for_cia = private["_get_decomp_for_cia"]
    fake_rules = private["op_implementations_dict"]
    deregister_fake_rule = private["_deregister_op_impl"]
    cia_key = torch._C.DispatchKey.CompositeImplicitAutograd
    # Each operator's kernel table is swapped for a patched one and the
    # original (never written) put back: what torch's clear-and-update
    # leaves, without copying either table twice.
    saved: list[tuple[Any, dict[Any, Any]]] = []
    rows, (ops, prepared_rules) = _prepared_entry(cia_to_decomp)
    # Fake rules are installed after the kernels (nothing runs in between):
    # where none of the operators has a rule (the usual case: torch's exit
    # drops every rule), the prepared ones in one dict update that hashes
    # nothing, then the few built here (an operator with a Python CIA
    # kernel of its own) over theirs, in the same places.
    rules: list[Any] = []
    own_rules: list[tuple[Any, Any]] = []
    try:
        for op, decomposition, unpatched, fake_rule in rows:
            kernels = op.py_kernels
            if not kernels:  # the usual case: no Python kernel of its own
                patched = unpatched.copy()
            else:
                # Taken before the CIA entry is replaced (torch's order).  An op
                # without a Python CIA kernel gets the same partial of itself
                # every time: its filled keys are built once (_filled_keys).
                if cia_key in kernels and not isinstance(kernels[cia_key], torch._C.DispatchKey):
                    original = get_decomp_for_cia(op)
                    patched = dict.fromkeys(backend_keys, original)
                    patched.update(dict.fromkeys(autograd_keys, _autograd_kernel(op)))
                    fake_rule = functools.partial(_run_original_cia, original_callable=original)
                    own_rules.append((op, fake_rule))
                else:
                    patched = _filled_keys(op)[1].copy()
                # Kernels already registered under a key stay (torch only fills
                # missing keys); the CIA key is replaced.
                patched.update(kernels)
                patched[cia_key] = decomposition
            saved.append((op, kernels))
            op.py_kernels = patched
            rules.append(fake_rule)
            op._dispatch_cache.clear()
        # set(dict) and set.isdisjoint(set) use the stored hashes.
        if ops.isdisjoint(set(fake_rules)):
            fake_rules.update(prepared_rules)
            for op, fake_rule in own_rules:
                fake_rules[op] = fake_rule
        else:
            for (op, _), fake_rule in zip(saved, rules):
                if op not in fake_rules:
                    fake_rules[op] = fake_rule
        yield
    finally:
        # torch's _deregister_op_impl(op): the fake rule goes, and the first
        # check that is the op itself (few ops have one: called for those).
        checked = {id(check) for check, _ in private["op_implementations_checks"]}
        for op, kernels in saved:
            op.py_kernels = kernels
            op._dispatch_cache.clear()
            if id(op) in checked:
                deregister_fake_rule(op)
            else:
                fake_rules.pop(op, None)


@contextlib.contextmanager
def quiet_torch_deprecations() -> Iterator[None]:
    """Hide torch's warning that its own ``LeafSpec`` is deprecated, which
    torch 2.13 raises from inside ``run_decompositions`` (it deep-copies the
    module call graph's leaf specs): nothing the user wrote or can change."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*deprecated", category=FutureWarning)
        yield


def decompose(
    exported: ExportedProgram, table: dict[Any, Callable[..., Any]]
) -> ExportedProgram:
    """``exported.run_decompositions(table)``: the same program, without
    the fixed per-call costs (a) and (b) of the module docstring.  The
    retrace is torch's ``_decompose_exported_program`` under the same
    fake-mode guard as ``run_decompositions``; a torch without the private
    names falls back to ``run_decompositions``."""
    private = _private()
    if private is None:
        with quiet_torch_deprecations():
            decomposed: ExportedProgram = exported.run_decompositions(table)
        return decomposed
    cia_to_decomp, python_table = split_decomposition_table(table)
    retrace = private["_decompose_exported_program"]

    @private["_disable_prexisiting_fake_mode"]  # type: ignore[untyped-decorator]
    def run() -> ExportedProgram:
        with cia_override(cia_to_decomp), quiet_torch_deprecations(), module_patches_skipped():
            result: ExportedProgram = retrace(
                exported,
                cia_to_decomp={},  # installed above: torch's own override does nothing
                python_decomp_table=dict(python_table),
                joint_loss_index=None,
                decompose_custom_triton_ops=False,
            )
        return result

    decomposed_program: ExportedProgram = run()
    return decomposed_program


def export_decomposed(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    table: dict[Any, Callable[..., Any]],
    dynamic_shapes: Any = None,
) -> ExportedProgram | None:
    """``decompose(torch.export.export(module, args, kwargs,
    dynamic_shapes=dynamic_shapes, strict=False), table)`` traced once (module docstring), or None when torch lacks the
    private names (the caller then exports and decomposes).  Exceptions are
    torch's, raised from the trace.

    torch's ``_export(pre_dispatch=False)`` traces through
    ``_export_to_aten_ir``, which takes a decomposition table but is
    called without one: for the call, the module's name is bound to the
    same function with ``table``'s Python decompositions."""
    private = _private()
    if private is None:
        return None
    cia_to_decomp, python_table = split_decomposition_table(table)
    import torch.export._trace as trace

    to_aten_ir = private["_export_to_aten_ir"]
    python_decompositions = dict(python_table)

    def to_aten_ir_decomposed(*args: Any, **kwargs: Any) -> Any:
        return to_aten_ir(*args, **{**kwargs, "decomp_table": python_decompositions})

    trace._export_to_aten_ir = to_aten_ir_decomposed
    try:
        with cia_override(cia_to_decomp), quiet_torch_deprecations(), lazy_graph_modules(), \
                module_patches_skipped():
            exported: ExportedProgram = private["_export"](
                module, args, kwargs, dynamic_shapes, strict=False, pre_dispatch=False
            )
    finally:
        trace._export_to_aten_ir = to_aten_ir
    return exported


@contextlib.contextmanager
def lazy_graph_modules() -> Iterator[None]:
    """Within the block, the ``GraphModule``s torch's tracers make
    (``make_fx``, ``torch.export``'s stages) generate their Python code only
    when it is first needed: their ``code`` read or the module called,
    as under ``torch.compile`` (``torch.fx._lazy_graph_module``).  A trace
    builds several modules of one graph and calls none of them; code
    generation is ~0.1-0.3 s per module of a 1,500-node graph
    (``bench/latency_notes.md``).  Without the private name the block
    changes nothing."""
    private = _private()
    if private is None:
        yield
        return
    with private["_use_lazy_graph_module"](True):
        yield


def keep_stack_traces_of(fn: Callable[..., Any]) -> None:
    """Make ``torch.export`` record ``fn``'s frames in its nodes' stack
    traces (``node.meta["stack_trace"]``), which errors quote as the user's
    line.  Non-strict export keeps only frames of functions named
    ``forward`` and of registered anchors (``torch.fx.proxy``'s private
    ``_register_stack_trace_anchor``, what ``torch.fx.traceback.annotate_fn``
    calls); a compiled plain function is neither.  Without the private name
    nothing changes (errors then name no line)."""
    import torch.fx.proxy

    register = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
    if register is not None:
        register(fn)


@functools.cache
def make_fx_without_torch_fn_metadata() -> dict[str, Any]:
    """Keyword arguments for ``make_fx`` that leave out its
    ``TorchFunctionMetadataMode``: a torch-function mode that every
    torch-level call of the traced code (each ``Tensor`` method, property
    and ``torch.*`` function, autograd's backward included) passes through
    so that the tracer can record ``node.meta["torch_fn"]``, which only
    torch's module-stack tracer does (``record_module_stack`` on a
    compiled module); ``make_fx``'s plain tracer, hloalias's, records
    nothing from it, and nothing in hloalias or torch-mlir reads it.  The
    graph is the same (tested: the same program key and bits,
    ``test/py/test_training_torch_fn_metadata.py``).  Empty where this
    torch's ``make_fx`` has no such (private) parameter."""
    import inspect

    from torch.fx.experimental.proxy_tensor import make_fx

    name = "_disable_torch_fn_metadata_mode"
    return {name: True} if name in inspect.signature(make_fx).parameters else {}


_LAZY_EXPORT_LOCK = threading.Lock()
_lazy_export_depth = 0


def _lazy_module_for_export(root: Any, graph: Any) -> Any:
    private = _private()
    assert private is not None
    return private["_make_graph_module"](root, graph)


@contextlib.contextmanager
def lazy_exported_programs() -> Iterator[None]:
    """Within the block (and :func:`lazy_graph_modules`'), an
    ``ExportedProgram`` built from a graph generates its module's Python
    code only when first needed, as :func:`lazy_graph_modules` makes
    torch's tracers do: ``ExportedProgram.__init__`` builds its module with
    ``torch.fx.GraphModule`` (``_create_graph_module_for_export``), which
    generates the code at once (~0.1 s for a 1,500-node training step);
    the block has it built with torch's ``_make_graph_module``, lazy under
    :func:`lazy_graph_modules`.  A lazy module generates the same code when
    it is called or its code read.  Nestable and safe across threads (the
    name is restored when the last block exits).  Without the private
    names the block changes nothing."""
    global _lazy_export_depth
    private = _private()
    if private is None:
        yield
        return
    import torch.export.exported_program as exported_program

    with _LAZY_EXPORT_LOCK:
        if _lazy_export_depth == 0:
            exported_program._create_graph_module_for_export = _lazy_module_for_export
        _lazy_export_depth += 1
    try:
        yield
    finally:
        with _LAZY_EXPORT_LOCK:
            _lazy_export_depth -= 1
            if _lazy_export_depth == 0:
                exported_program._create_graph_module_for_export = private["_create_graph_module_for_export"]


def eliminate_dead_code(graph: torch.fx.Graph) -> bool:
    """``graph.eliminate_dead_code()``, the same nodes removed: torch asks
    every node ``is_impure`` (schema and effect reads, ~5 us a node) and
    then whether it has users; here only nodes without users are asked,
    since a node with users is kept whatever the answer.  The same
    ``impure_random`` as torch's (random ops impure outside a tracing
    context)."""
    impure_random = True
    if torch._guards.TracingContext.try_get():
        import torch._inductor.config as inductor_config

        impure_random = inductor_config.fallback_random
    return graph.eliminate_dead_code(lambda node: bool(node.users) or node.is_impure(impure_random))


class _SignatureRead:
    """An ``ExportGraphSignature`` whose attributes (``buffers``,
    ``buffers_to_mutate``... properties that walk every spec) are each read
    once, for one check of a signature that does not change meanwhile."""

    __slots__ = ("_signature", "_read")

    def __init__(self, signature: Any) -> None:
        self._signature = signature
        self._read: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        read = self._read
        if name not in read:
            read[name] = getattr(self._signature, name)  # one raising is asked again, and raises again
        return read[name]


class _ProgramRead:
    """An ``ExportedProgram`` as torch's signature check reads it, with the
    signature read through :class:`_SignatureRead`."""

    __slots__ = ("_program", "graph_signature")

    def __init__(self, program: ExportedProgram) -> None:
        self._program = program
        self.graph_signature = _SignatureRead(program.graph_signature)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._program, name)


_SIGNATURE_CHECK_LOCK = threading.Lock()
_signature_check_depth = 0
#: What the verifier module held when the outermost block began.
_signature_check_saved: Any = None


@contextlib.contextmanager
def signature_checked_once() -> Iterator[None]:
    """Within the block, ``ExportedProgram``'s verifier runs torch's own
    signature check (``_verify_exported_program_signature``: every check,
    the same errors) on the program with each signature property read once:
    torch's reads ``buffers_to_mutate`` and ``buffers`` (each a walk of
    every spec) once per mutated buffer, quadratic in the state of a
    training step (~86 slots in a 2-layer HF Llama's, ~5 ms; 16x that at 4x
    the slots).  Nestable and safe across threads (the name is restored
    when the last block exits; a check of another thread's meanwhile is
    the same check).  Without the private name the block changes nothing."""
    global _signature_check_depth, _signature_check_saved
    if _private() is None:
        yield
        return
    import torch._export.verifier as verifier

    # ``entered`` is set with the count, in a block where Python delivers
    # no Ctrl-C (no call in it): an interrupt anywhere else either comes
    # before the count or is inside the ``try``, whose ``finally`` takes
    # the count back (test_training_signature_check.py sweeps it).
    entered = False
    try:
        with _SIGNATURE_CHECK_LOCK:
            if _signature_check_depth == 0:
                _signature_check_saved = original = verifier._verify_exported_program_signature

                def check(exported_program: Any) -> None:
                    original(_ProgramRead(exported_program))

                verifier._verify_exported_program_signature = check
            _signature_check_depth += 1
            entered = True
        yield
    finally:
        if entered:
            with _SIGNATURE_CHECK_LOCK:
                _signature_check_depth -= 1
                if _signature_check_depth == 0:
                    verifier._verify_exported_program_signature = _signature_check_saved


_MODULE_PATCH_LOCK = threading.Lock()
_module_patch_depth = 0
_torch_new_patcher: Any = None


@functools.cache
def _tracer_internals() -> dict[str, Any] | None:
    """``torch.fx``'s tracer patching internals that
    :func:`module_patches_skipped` reads (pinned by the test), or None when
    one is missing."""
    try:
        import torch.fx._symbolic_trace as symbolic_trace
        from torch.fx.experimental.proxy_tensor import PythonKeyTracer
    except ImportError:
        return None
    names = ("_new_patcher", "_Patcher", "_orig_module_call", "_orig_module_getattr")
    if not all(hasattr(symbolic_trace, name) for name in names):
        return None
    found = {name: getattr(symbolic_trace, name) for name in names}
    found["module"] = symbolic_trace
    found["PythonKeyTracer"] = PythonKeyTracer
    return found


def _identity_tracer(new_fn: Any) -> bool:
    """Whether ``new_fn`` (the ``nn.Module.__getattr__``/``__call__``
    wrapper ``Tracer.trace`` makes, a closure over the tracer as ``self``)
    belongs to a tracer for which both wrappers change nothing: one whose
    ``call_module`` (``forward(*args, **kwargs)``) and ``getattr`` (the
    value) are ``PythonKeyTracer``'s, with no functions to autowrap (its
    wrapper's only other work is looking for them in the called module's
    globals)."""
    internals = _tracer_internals()
    code = getattr(new_fn, "__code__", None)
    closure = getattr(new_fn, "__closure__", None)
    if internals is None or code is None or closure is None or "self" not in code.co_freevars:
        return False
    tracer = closure[code.co_freevars.index("self")].cell_contents
    base = internals["PythonKeyTracer"]
    return (
        isinstance(tracer, base)
        and type(tracer).call_module is base.call_module
        and type(tracer).getattr is base.getattr
        and not getattr(tracer, "_autowrap_function_ids", True)
    )


def _patch_method_skipping(patcher: Any, cls: type, name: str, new_fn: Callable[..., Any],
                           deduplicate: bool = True) -> None:
    """``_Patcher.patch_method``, except that ``Tracer.trace``'s patches of
    ``nn.Module.__getattr__`` and ``__call__`` are not made where they
    change nothing (:func:`module_patches_skipped`)."""
    internals = _tracer_internals()
    assert internals is not None
    if cls is torch.nn.Module and (
        (name == "__getattr__" and cls.__getattr__ is internals["_orig_module_getattr"])
        or (name == "__call__" and cls.__call__ is internals["_orig_module_call"])
    ) and _identity_tracer(new_fn):
        # The tracer autowraps no function (_identity_tracer): the walks of
        # the traced function's globals that look for them find none.
        patcher.visit_once = _visited_before
        return
    internals["_Patcher"].patch_method(patcher, cls, name, new_fn, deduplicate)


def _visited_before(thing: object) -> bool:
    """``_Patcher.visit_once`` answering "seen": ``_autowrap_check`` then
    skips its walk of a globals dict for functions to autowrap."""
    return False


@contextlib.contextmanager
def _new_patcher_skipping() -> Iterator[Any]:
    """torch's ``_new_patcher`` (its ``CURRENT_PATCHER`` bookkeeping
    unchanged), whose patcher skips the module patches that change
    nothing."""
    with _torch_new_patcher() as patcher:
        patcher.patch_method = functools.partial(_patch_method_skipping, patcher)
        yield patcher


@contextlib.contextmanager
def module_patches_skipped() -> Iterator[None]:
    """Within the block, a ``make_fx`` trace does not replace
    ``nn.Module.__getattr__`` and ``nn.Module.__call__`` for its duration.

    ``torch.fx.Tracer.trace`` replaces both on the class (and puts them
    back after) so that its tracer's ``getattr`` and ``call_module`` see
    every attribute read and submodule call.  ``make_fx``'s tracer
    (``PythonKeyTracer``) answers both with what the original would give:
    ``getattr`` returns the value read, ``call_module`` calls the module's
    original ``__call__``.  Replacing a dunder method of ``nn.Module``
    makes CPython update the slot of every subclass (every ``nn.Module``
    class in the process, and the class each ``GraphModule`` makes of its
    own, which outlive their modules until a full collection): four such
    writes a trace, ~2 ms CPU of a warm seed compile
    (``bench/RESULTS-latency.md``).  The block skips the two patches for
    exactly those tracers (:func:`_identity_tracer`; and their walks of
    the traced function's globals for functions to autowrap, of which they
    have none), and only while the
    class still holds torch's originals (a trace nested in another
    tracer's, whose wrappers are installed, patches as torch does); every
    other tracer (``torch.fx.symbolic_trace``'s, export's module-stack
    tracer) is patched as before.  torch's function is swapped for the
    block, nestable and across threads (a trace of another thread in the
    meantime gets the same skip, which changes nothing for it either);
    without the private names nothing changes."""
    global _module_patch_depth, _torch_new_patcher
    internals = _tracer_internals()
    if internals is None:
        yield
        return
    module = internals["module"]
    with _MODULE_PATCH_LOCK:
        if _module_patch_depth == 0:
            _torch_new_patcher = module._new_patcher
            module._new_patcher = _new_patcher_skipping
        _module_patch_depth += 1
    try:
        yield
    finally:
        with _MODULE_PATCH_LOCK:
            _module_patch_depth -= 1
            if _module_patch_depth == 0:
                module._new_patcher = _torch_new_patcher
