"""When one trace is enough: ``torch.export`` and the decomposition
retrace in one pass, for programs that write to no tensor in place.

The importer reads three things from ``torch.export``'s training IR, the
one graph that still has eager's in-place ops and strides: the rewrite of
``copy_`` conversions, the ``contiguous``/``reshape``/``flatten`` that
copy in eager (pinned as clones, because functionalization re-derives them
from strides an in-place op changed), each user output's eager storage,
and the inputs an ``as_strided`` addresses
(:func:`hloalias.frontend.importer._import_torch`).  For a program without
in-place writes and without ``as_strided`` they change nothing, and the
functional graph says what the training IR says; such a program is traced
once, decomposed: by one ``make_fx`` trace that builds the program
``torch.export`` would give (:func:`hloalias.frontend.fx_export.exported_from_trace`),
or, where that trace cannot tell the signature, by ``torch.export``'s
post-dispatch trace (:func:`hloalias.frontend.torch_internals.export_decomposed`).

Which programs: the trace runs under :class:`_WriteWatch`, a
``TorchFunctionMode`` that stops it at the first torch call that writes
to a tensor (an in-place method ``x.add_``, ``x[i] = v``, ``x += y``, an
``out=`` argument, an operator with a mutable schema) or addresses storage (``as_strided``, ``set_``); a
graph that still mutates an argument (an op with a mutable schema, such as
batch norm's running statistics in training mode) or holds an
``as_strided`` is not used either.  Then, and when the single trace
fails for any reason, the importer exports and decomposes as before: the
same program and the same errors.  A cheap look at the module's code
first (:func:`may_write_in_place`: the names and stores of every
submodule's ``forward``) sends programs that visibly write in place to
one ``make_fx`` trace that records the writes as export does
(:func:`hloalias.frontend.fx_export.exported_from_trace` with
``mutations``: the same program as export, the rewrites above and the
decompositions, or None where it cannot tell), and where that declines
straight to the two-trace path, so that they do not pay for a trace
stopped half way.

:func:`single_trace_stats` counts which of the three a static import took
(the one ``make_fx`` trace, ``torch.export``'s post-dispatch trace after it
declined, or the training IR and the retrace) and keeps the last reasons
the ``make_fx`` trace declined (``bench/single_trace_census.py`` lists
them per transformers model).  The write guards and watches are entered
by forward hooks; a trace that raises inside the module skips the hook
that leaves them, so each block puts the torch-function mode stack back
as it found it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from hloalias.errors import TorchImportError
from hloalias.frontend import fx_export, torch_internals

#: Tensor methods named like in-place ops that write no tensor.
_NOT_WRITES = frozenset({"requires_grad_", "retain_grad_", "share_memory_", "_set_grad_enabled"})
#: Operator methods that write their left operand in place.
_IN_PLACE_DUNDERS = frozenset({
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
    "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__",
})
#: Calls that address or replace a tensor's storage.
_STORAGE_OPS = frozenset({"as_strided", "as_strided_", "set_", "resize_", "resize_as_", "untyped_storage"})
_MUTATIONS = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION, OutputKind.USER_INPUT_MUTATION)


class _WritesInPlace(Exception):
    """Raised inside the trace: the program needs the training IR."""


def is_write(name: str, kwargs: dict[str, Any] | None) -> bool:
    if kwargs and kwargs.get("out") is not None:
        return True
    if name in _IN_PLACE_DUNDERS:
        return True
    if name in _STORAGE_OPS or name.startswith("as_strided"):
        return True
    return name.endswith("_") and not name.startswith("__") and name not in _NOT_WRITES


class _WriteWatch(torch.overrides.TorchFunctionMode):
    """Stops the trace at the first torch call that writes a tensor in
    place or addresses its storage (module docstring), and notes it in
    ``seen``: a forward that catches the exception does not make the
    trace usable."""

    def __init__(self, seen: list[str]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if is_write(getattr(func, "__name__", ""), kwargs) or mutable_op(func):
            self.seen.append(getattr(func, "__name__", repr(func)))
            raise _WritesInPlace(self.seen[-1])
        return func(*args, **(kwargs or {}))


class ClosedOverWrite(TorchImportError):
    """The traced code writes in place to a tensor it closes over (not a
    parameter, buffer or input of the program): refused before the write
    (:class:`_ClosedOverWriteGuard`)."""


_CLOSED_OVER_WRITE = (
    "{program} writes in place ({what}) to a tensor it closes over{where}, which is not a parameter, "
    "buffer or input of it: the compiled program would lose the write. The tensor was not changed. "
    "Register it as a buffer of the module (module.register_buffer) or pass it as an argument."
)


def writes_in_place(name: str, kwargs: dict[str, Any] | None) -> bool:
    """Whether the torch call ``name`` writes its first argument (or an
    ``out=`` tensor) in place; unlike :func:`is_write`, addressing storage
    (``as_strided``, ``untyped_storage``) reads."""
    if kwargs and kwargs.get("out") is not None:
        return True
    if name in _IN_PLACE_DUNDERS:
        return True
    return name.endswith("_") and not name.startswith("__") and name not in _NOT_WRITES


def plain_tensors_written(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, state: frozenset[int] = frozenset()
) -> bool:
    """Whether the torch call writes a plain (real, untraced) tensor other
    than the module's own state (``state``: the ids of its parameters and
    buffers): while a program is traced its parameters, buffers and inputs
    are fake or functional tensors, so a plain one is a tensor the code
    closes over.  A buffer reached through another object (transformers'
    ``layer.cumulative_length``, registered as a buffer too) is still the
    real tensor, and torch.export records its write as the buffer's."""
    if not (writes_in_place(getattr(func, "__name__", ""), kwargs) or mutable_op(func)):
        return False
    written = [args[0]] if args else []
    written += [leaf for leaf in pytree.tree_leaves((kwargs or {}).get("out")) if leaf is not None]
    return any(
        isinstance(t, torch.Tensor) and type(t) in (torch.Tensor, torch.nn.Parameter) and id(t) not in state
        for t in written
    )


class _ClosedOverWriteGuard(torch.overrides.TorchFunctionMode):
    """Active while a traced module's forward runs: a write to a tensor the
    code closes over is stopped before it happens (:class:`ClosedOverWrite`),
    so no trace changes the caller's tensor (torch.export would refuse the
    program only after its trace had written it, once per trace)."""

    def __init__(self, program: str, state: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.program = program
        self.state = state

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if plain_tensors_written(func, args, kwargs, self.state):
            what = getattr(func, "__name__", "") or repr(func)
            raise ClosedOverWrite(_CLOSED_OVER_WRITE.format(program=self.program, what=what, where=_user_line()))
        return func(*args, **(kwargs or {}))


def _user_line() -> str:
    """`` at file:line`` of the innermost frame outside torch and this
    module: the user's code that called the write."""
    torch_dir, here = os.path.dirname(torch.__file__) + os.sep, os.path.abspath(__file__)
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if path != here and not path.startswith(torch_dir):
            return f" at {frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"
    return ""


@contextlib.contextmanager
def refusing_closed_over_writes(module: torch.nn.Module, program: str) -> Iterator[None]:
    """:class:`_ClosedOverWriteGuard` active while ``module``'s forward runs
    (in every trace of it inside the block)."""
    guards: list[_ClosedOverWriteGuard] = []
    # Taken before torch swaps them for traced values.
    state = frozenset(id(t) for t in (*module.parameters(), *module.buffers()))

    def enter(*_: Any) -> None:
        guard = _ClosedOverWriteGuard(program, state)
        guard.__enter__()  # type: ignore[no-untyped-call]
        guards.append(guard)

    def leave(*_: Any) -> None:
        if guards:
            _leave_mode(guards.pop())

    handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]
    try:
        with fx_export.function_modes_kept():
            yield
    finally:
        for handle in handles:
            handle.remove()
        while guards:
            _leave_mode(guards.pop())


def mutable_op(func: Any) -> bool:
    """Whether ``func`` is an operator (``torch.ops.ns.op[.overload]``)
    whose schema writes an argument."""
    if isinstance(func, torch._ops.OpOverload):
        return bool(func._schema.is_mutable)
    if isinstance(func, torch._ops.OpOverloadPacket):
        return any(getattr(func, name)._schema.is_mutable for name in func.overloads())  # type: ignore[no-untyped-call]
    return False


@contextlib.contextmanager
def _watching(module: torch.nn.Module) -> Iterator[list[str]]:
    """:class:`_WriteWatch` active while ``module``'s forward runs (and only
    then: export's own machinery around it reads storages and sets flags);
    yields the list of the writes it stopped at."""
    watches: list[_WriteWatch] = []
    seen: list[str] = []

    def enter(*_: Any) -> None:
        watch = _WriteWatch(seen)
        watch.__enter__()  # type: ignore[no-untyped-call]
        watches.append(watch)

    def leave(*_: Any) -> None:
        if watches:
            _leave_mode(watches.pop())

    handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]
    try:
        with fx_export.function_modes_kept():
            yield seen
    finally:
        for handle in handles:
            handle.remove()
        while watches:
            _leave_mode(watches.pop())


def _leave_mode(mode: torch.overrides.TorchFunctionMode) -> None:
    """Take ``mode``, entered by a forward pre-hook, off the torch-function
    mode stack wherever it is, the modes above it kept in their order (a
    ``TorchFunctionMode`` exit pops whatever is on top).  A trace stopped by
    an exception may skip the forward hook that would leave it (the
    block that pushed the hook then restores the stack it found:
    fx_export.function_modes_kept): a mode no longer on the stack is left
    alone."""
    if not any(entry is mode for entry in fx_export.function_mode_stack()):
        return
    above = []
    while True:
        top = torch._C._pop_torch_function_stack()
        if top is mode:
            break
        above.append(top)
    for entry in reversed(above):
        torch._C._push_on_torch_function_stack(entry)


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    found = [code]
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            found.extend(_code_objects(constant))
    return found


def _code_writes(code: types.CodeType) -> bool:
    for each in _code_objects(code):
        if any(is_write(name, None) for name in each.co_names if not name.startswith("_")):
            return True
    return False


def may_write_in_place(module: torch.nn.Module) -> bool:
    """Whether the ``forward`` of ``module`` or of one of its submodules
    names an in-place method (a cheap look: a name is not a call, and a
    helper function's writes are not seen; the trace decides the rest)."""
    seen: set[types.CodeType] = set()
    for submodule in module.modules():
        forward = getattr(type(submodule), "forward", None)
        code = getattr(forward, "__code__", None)
        if submodule is module and getattr(module, "fn", None) is not None:
            code = getattr(module.fn, "__code__", code)  # a wrapped function (importer._FunctionModule)
        if not isinstance(code, types.CodeType) or code in seen:
            continue
        seen.add(code)
        if _code_writes(code):
            return True
    return False


def _holds_as_strided(exported: ExportedProgram) -> bool:
    return any(
        node.op == "call_function" and "as_strided" in str(node.target) for node in exported.graph_module.graph.nodes
    )


def export_decomposed(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    table: dict[Any, Callable[..., Any]],
    dynamic_shapes: Any = None,
    dynamic_dims: Any = None,
) -> ExportedProgram | None:
    """The decomposed program of ``module`` on ``args``/``kwargs`` (with
    ``torch.export``'s ``dynamic_shapes``) from one trace, or None when the
    program needs the training IR or the trace fails (module docstring).
    With ``dynamic_dims`` (per flat input leaf, the dimensions to keep
    symbolic: :func:`hloalias.frontend.shape_specialization.export_dynamic`)
    only the one ``make_fx`` trace is tried, symbolic in those dimensions
    (:func:`hloalias.frontend.fx_export.exported_from_trace`); where it
    declines, None."""
    if dynamic_dims is not None:
        if may_write_in_place(module):
            return None
    elif may_write_in_place(module):
        exported = _export_writing(module, args, kwargs, table, dynamic_shapes)
        if dynamic_shapes is None:
            _count("make_fx" if exported is not None else "training_ir", "the writing trace declined")
        return exported
    declined: list[str] = []
    traced_once = False
    try:
        with _watching(module) as writes:
            exported = None
            if dynamic_dims is not None:
                exported = fx_export.exported_from_trace(module, args, kwargs, table, dynamic_dims=dynamic_dims)
            elif dynamic_shapes is None:
                exported = fx_export.exported_from_trace(module, args, kwargs, table, declined=declined)
                traced_once = exported is not None
            if exported is None and not writes and dynamic_dims is None:
                exported = torch_internals.export_decomposed(module, args, kwargs, table, dynamic_shapes)
    except Exception:  # _WritesInPlace, or any failure: the two-trace path names it
        exported = None
    if writes or exported is None or _holds_as_strided(exported):
        exported = None
    elif any(spec.kind in _MUTATIONS for spec in exported.graph_signature.output_specs):
        exported = None
    elif not _bake_static_inputs(exported):
        exported = None
    if dynamic_dims is None and dynamic_shapes is None:
        reason = f"writes in place ({writes[0]})" if writes else (declined[0] if declined else "")
        _count("training_ir" if exported is None else "make_fx" if traced_once else "post_dispatch", reason)
    return exported


@dataclasses.dataclass
class SingleTraceStats:
    """Counters (live) of the static imports of :func:`export_decomposed`:
    programs taken from the one ``make_fx`` trace (``make_fx``), from
    ``torch.export``'s post-dispatch trace after that trace declined
    (``post_dispatch``: two traces), and those left to the training IR and
    the decomposition retrace (``training_ir``), with the last 8 reasons
    the ``make_fx`` trace declined (``reasons``)."""

    make_fx: int = 0
    post_dispatch: int = 0
    training_ir: int = 0
    reasons: list[str] = dataclasses.field(default_factory=list)


_STATS = SingleTraceStats()
_STATS_LOCK = threading.Lock()


def single_trace_stats() -> SingleTraceStats:
    return _STATS


def clear_single_trace_stats() -> None:
    global _STATS
    with _STATS_LOCK:
        _STATS = SingleTraceStats()


def _count(path: str, reason: str) -> None:
    with _STATS_LOCK:
        setattr(_STATS, path, getattr(_STATS, path) + 1)
        if path != "make_fx" and reason:
            _STATS.reasons = [*_STATS.reasons[-7:], reason]


def _export_writing(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    table: dict[Any, Callable[..., Any]],
    dynamic_shapes: Any,
) -> ExportedProgram | None:
    """The decomposed program of a module that may write in place, from
    one ``make_fx`` trace that records the writes as export does
    (:func:`hloalias.frontend.fx_export.exported_from_trace` with
    ``mutations``), or None where that trace declines."""
    if dynamic_shapes is not None:
        return None
    if any(isinstance(leaf, torch.Tensor) and not leaf.is_contiguous() for leaf in pytree.tree_leaves((args, kwargs))):
        # A written input that is not contiguous: eager's contiguous() of
        # it (or of its views) copies, which the two-trace path's graph
        # rewrite keeps and this trace does not (test_runtime_trust #14).
        return None
    try:
        exported = fx_export.exported_from_trace(module, args, kwargs, table, mutations=True)
    except Exception:  # any failure: the two-trace path names it
        return None
    if exported is None or _holds_as_strided(exported) or not _bake_static_inputs(exported):
        return None
    return exported


_STATIC_TYPES = (bool, int, float, str)


def _bake_static_inputs(exported: ExportedProgram) -> bool:
    """Replace each read of a Python-value user input (``factor=2``) by its
    value, in place, as the training IR has it (``torch.export`` specializes
    on such values; its post-dispatch trace leaves the placeholder in the
    ops' arguments).  False, changing nothing, where such an input holds
    another kind of value."""
    graph = exported.graph_module.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    static: dict[torch.fx.Node, Any] = {}
    for spec, node in zip(exported.graph_signature.input_specs, placeholders):
        value = node.meta.get("val")
        if spec.kind is not InputKind.USER_INPUT or isinstance(value, torch.Tensor) or not node.users:
            continue
        if type(value) not in _STATIC_TYPES:
            return False
        static[node] = value
    if not static:
        return True

    def bake(argument: Any) -> Any:
        return static[argument] if isinstance(argument, torch.fx.Node) and argument in static else argument

    for node in graph.nodes:
        if node.op in ("call_function", "call_method"):
            node.args = torch.fx.node.map_aggregate(node.args, bake)
            node.kwargs = torch.fx.node.map_aggregate(node.kwargs, bake)
    exported.graph_module.recompile()
    return True
