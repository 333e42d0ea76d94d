"""Small helpers over torch-mlir's MLIR Python bindings shared by the
importer, the passes and the command line: contexts (new ones, and the
bounded reuse of one across compiles: :func:`context_lease`), parsing with
readable diagnostics, ``@main`` signature access and tensor type facts."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import ParamSpec, TypeVar

from torch_mlir import ir, passmanager
from torch_mlir._mlir_libs import _stablehlo
from torch_mlir.dialects import func
from torch_mlir.dialects import torch as torch_dialect

from hloalias.dialects import register_search_prefix
from hloalias.errors import IRError

_passes_registered = False
#: The dialects :func:`new_context` loads besides torch and StableHLO.
_LOADED_ON_CREATE = ("func", "arith")


def new_context() -> ir.Context:
    """A context with the torch, StableHLO, func and arith dialects loaded
    (the ones hloalias creates operations of from Python) and the StableHLO
    passes registered (so pipelines may name them).  Every other registered
    dialect loads when the parser or a pass first needs it: a default
    ``ir.Context()`` loads all of them eagerly, ~16 ms a context against
    ~5 ms.  The two are loaded by descriptor: ``load_on_create_dialects``
    loads them through ``context.dialects[name]``, which also imports each
    one's generated Python op module (``torch_mlir.dialects.arith``: ~7 ms
    of the first compile in a process, and hloalias builds no op through
    it)."""
    global _passes_registered
    if not _passes_registered:
        _stablehlo.register_stablehlo_passes()
        register_search_prefix()
        _passes_registered = True
    context = ir.Context(load_on_create_dialects=[])
    for name in _LOADED_ON_CREATE:
        context.get_dialect_descriptor(name)  # loads it (MLIR's getOrLoadDialect)
    torch_dialect.register_dialect(context)
    _stablehlo.register_dialect(context)
    return context


class ContextLease:
    """One compile's hold on a pooled context (:func:`context_lease`).
    ``charge`` adds to the context's byte budget (the size of what the
    compile made in it); ``retire`` ends the context's reuse when this
    lease ends."""

    __slots__ = ("context", "_slot", "_charged", "_retire")

    def __init__(self, context: ir.Context, slot: "_PooledContext") -> None:
        self.context = context
        self._slot = slot
        self._charged = 0
        self._retire = False

    def charge(self, size: int) -> None:
        """Count ``size`` bytes (a module's printed size: its attributes,
        types and resource blobs stay uniqued in the context after the
        module is gone) against the context's budget."""
        self._charged += size

    def retire(self) -> None:
        """Hand the context to no later compile (it stays alive while any
        module in it does)."""
        self._retire = True


class _PooledContext:
    __slots__ = ("context", "uses", "charged", "pid", "pass_managers")

    def __init__(self, context: ir.Context) -> None:
        self.context = context
        self.uses = 0
        self.charged = 0
        self.pass_managers: dict[str, passmanager.PassManager] = {}
        self.pid = os.getpid()  # a forked child never takes it back (ContextPool._after_fork)


class ContextPool:
    """MLIR contexts reused across compiles, each for a bounded budget.

    A context costs its set-up every compile when new (dialect loading,
    registration; the dialects a lowering pipeline pulls in load again in
    each new context).  One context kept forever would instead keep every
    import's uniqued attributes, types and resource blobs alive, for good:
    MLIR frees none of them before the context.  So a context serves at
    most ``max_uses`` leases, and none after its leases charged
    ``max_bytes`` (:meth:`ContextLease.charge`); then the pool drops it and
    the next lease gets a new one.  A dropped context is never handed out
    again; it is freed when the last module in it is (Python's references
    keep it alive until then), so nothing made in it is ever used after it
    is freed.

    A lease is exclusive: while a thread holds a context, no other lease
    gets it (concurrent compiles get contexts of their own; up to
    ``max_idle`` wait in the pool between leases).  MLIR's diagnostics go to
    the handlers attached to a context, so two compiles running pass
    pipelines with Python passes in one context at once could report each
    other's errors; exclusivity rules that out.  Modules of earlier leases
    stay in the context (a ``Program`` holds its module), and are only
    read afterwards by their owners (printing, reports), which never runs
    a pipeline.  ``max_uses`` of 1 gives a new context to every lease."""

    def __init__(self, max_uses: int = 32, max_bytes: int = 1 << 20, max_idle: int = 2) -> None:
        self.max_uses = max_uses
        self.max_bytes = max_bytes
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[_PooledContext] = []
        self._local = threading.local()
        self.created = 0
        self.retired = 0

    def current(self) -> ContextLease | None:
        """This thread's lease, if it holds one."""
        lease: ContextLease | None = getattr(self._local, "lease", None)
        return lease

    @contextlib.contextmanager
    def lease(self) -> Iterator[ContextLease]:
        """A context for this thread until the block ends; the thread's
        own lease again when it holds one already (a compile inside a
        compile: one thread, one context at a time)."""
        held = self.current()
        if held is not None:
            yield held
            return
        slot = None
        with self._lock:
            if self._idle:
                slot = self._idle.pop()
        if slot is None:
            slot = _PooledContext(new_context())
            with self._lock:
                self.created += 1
        lease = ContextLease(slot.context, slot)
        self._local.lease = lease
        try:
            yield lease
        finally:
            self._local.lease = None
            slot.uses += 1
            slot.charged += lease._charged
            spent = (lease._retire or slot.uses >= self.max_uses or slot.charged >= self.max_bytes
                     or slot.pid != os.getpid())
            with self._lock:
                if spent or len(self._idle) >= self.max_idle:
                    self.retired += 1
                else:
                    # The importer's lowering sets this flag; the next lease
                    # starts from what new_context gives.
                    slot.context.emit_error_diagnostics = False
                    self._idle.append(slot)

    def clear(self) -> None:
        """Drop every idle context (leases held now end as budgeted)."""
        with self._lock:
            self.retired += len(self._idle)
            self._idle.clear()

    def _after_fork(self) -> None:
        # A forked child has none of the parent's threads, MLIR's worker
        # threads of these contexts included: it starts from new contexts.
        self._lock = threading.Lock()
        self._idle = []
        self._local = threading.local()


#: The process's pool (:func:`context_lease`, :func:`compile_context`).
CONTEXT_POOL = ContextPool()
os.register_at_fork(after_in_child=CONTEXT_POOL._after_fork)


def context_lease() -> contextlib.AbstractContextManager[ContextLease]:
    """A pooled context for this thread's compile (:class:`ContextPool`):
    :func:`compile_context` answers it until the block ends."""
    return CONTEXT_POOL.lease()


_P = ParamSpec("_P")
_R = TypeVar("_R")


def leasing_context(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``function`` inside a :func:`context_lease` (a compile entry point)."""

    @functools.wraps(function)
    def leased(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with CONTEXT_POOL.lease():
            return function(*args, **kwargs)

    return leased


def lowering_pass_manager(pipeline: str, context: ir.Context) -> passmanager.PassManager:
    """A ``PassManager`` for ``pipeline`` (textual, passes of torch-mlir's
    C++ only: no Python pass, whose reports a run would bind) in
    ``context``.  In this thread's leased context, the one parsed for an
    earlier compile there: a pass manager initializes its passes on its
    first run (the canonicalizer gathers every loaded op's patterns) and
    again only when the context's registry hash (its counts of loaded
    dialects and registered operations, attributes, types) changed since,
    so a reused one runs as a new one would on the context as it is now
    (``test_context_pool.py`` compares the final modules).  Elsewhere, a
    new one.  :func:`drop_pass_manager` after a failed run."""
    lease = CONTEXT_POOL.current()
    if lease is None or lease.context is not context:
        return passmanager.PassManager.parse(pipeline, context)
    cached = lease._slot.pass_managers.get(pipeline)
    if cached is None:
        cached = lease._slot.pass_managers[pipeline] = passmanager.PassManager.parse(pipeline, context)
    return cached


def drop_pass_manager(pipeline: str, context: ir.Context) -> None:
    """Parse ``pipeline`` anew at its next :func:`lowering_pass_manager` (a run of
    it failed: its passes' state is not reused)."""
    lease = CONTEXT_POOL.current()
    if lease is not None and lease.context is context:
        lease._slot.pass_managers.pop(pipeline, None)


def compile_context() -> ir.Context:
    """The context this thread's compile makes its modules in: its leased
    one (:func:`context_lease`), else a new one (:func:`new_context`)."""
    lease = CONTEXT_POOL.current()
    return lease.context if lease is not None else new_context()


# The first file position in a location: a plain ``loc("f":l:c)``, or the
# callee of a ``callsite(...)`` / first of a ``fused[...]`` (as mlir-opt prints).
_LOC_RE = re.compile(r'"(?P<file>[^"]*)":(?P<line>\d+):(?P<col>\d+)')


def format_diagnostics(
    error: ir.MLIRError, source_name: str = "-", line_offset: int = 0
) -> str:
    """Render an MLIRError as ``file:line:col: error: message`` lines.

    ``line_offset`` is added to line numbers (for ``--split-input-file``
    chunks); locations from other files keep their own name."""
    lines = []
    for diagnostic in error.error_diagnostics:
        lines.append(_format_one(diagnostic, source_name, line_offset, "error"))
        for note in diagnostic.notes:
            if "Available dialects" in note.message:
                continue
            lines.append(_format_one(note, source_name, line_offset, "note"))
    return "\n".join(lines) if lines else str(error)


def _format_one(diagnostic: ir.DiagnosticInfo, source_name: str, line_offset: int, severity: str) -> str:
    location = str(diagnostic.location)
    match = _LOC_RE.search(location)
    message = diagnostic.message.strip()
    if not match:
        return f"{source_name}: {severity}: {message}"
    file = match["file"]
    line = int(match["line"])
    if file == "-":
        if line == 0:
            return f"{source_name}: {severity}: {message}"
        file, line = source_name, line + line_offset
    return f"{file}:{line}:{match['col']}: {severity}: {message}"


def location_prefix(location: ir.Location, source_name: str = "-", line_offset: int = 0) -> str:
    """``file:line:col`` of ``location`` (``-`` meaning ``source_name``);
    just ``source_name`` when the location has no position."""
    match = _LOC_RE.search(str(location))
    if not match:
        return source_name
    file, line = match["file"], int(match["line"])
    if file == "-":
        if line == 0:
            return source_name
        file, line = source_name, line + line_offset
    return f"{file}:{line}:{match['col']}"


_INT64_MAX = 2**63 - 1


def check_static_extents(module: ir.Module | ir.Operation, source_name: str = "-", line_offset: int = 0) -> None:
    """IRError (``file:line:col: error:``) for a static tensor whose element
    count or byte size does not fit in 64 bits: XLA aborts the process on
    those instead of reporting an error."""
    operation = module.operation if isinstance(module, ir.Module) else module
    # Types are uniqued in their context and whether one fits depends on
    # nothing else: each is worked out once (an HF model's ~580 values
    # have a few dozen types).  Only types that fit are remembered.
    fits: set[ir.Type] = set()

    def check(value_type: ir.Type, op: ir.Operation, what: str) -> None:
        if value_type in fits:
            return
        if not isinstance(value_type, ir.RankedTensorType):
            return
        tensor = ir.RankedTensorType(value_type)
        if not tensor.has_static_shape:
            return
        count = 1
        for size in tensor.shape:
            count *= size
        try:
            bits = element_bits(tensor.element_type)
        except IRError:
            bits = 8
        if count > _INT64_MAX or count * max(8, bits) // 8 > _INT64_MAX:
            where = location_prefix(op.location, source_name, line_offset)
            raise IRError(
                f"{where}: error: {what} of '{op.name}' has type {value_type}, whose size "
                "overflows 64 bits: XLA cannot hold it"
            )
        fits.add(value_type)

    for op in [operation, *walk_ops(operation)]:
        for index, result in enumerate(op.results):
            check(result.type, op, f"result {index}")
        for region in op.regions:
            for block in region.blocks:
                for index, argument in enumerate(block.arguments):
                    check(argument.type, op, f"block argument {index}")


def parse_module(
    text: str, context: ir.Context, source_name: str = "-", line_offset: int = 0
) -> ir.Module:
    """Parse and verify ``text``; raise :class:`IRError` with the MLIR
    diagnostics (``file:line:col``) when it is malformed."""
    with context:
        try:
            return ir.Module.parse(text)
        except ir.MLIRError as error:
            raise IRError(format_diagnostics(error, source_name, line_offset)) from None


def find_main(module: ir.Module) -> func.FuncOp:
    """The module's ``@main`` function; :class:`IRError` if there is none."""
    for op in module.body.operations:
        if op.operation.name == "func.func":
            if ir.StringAttr(op.attributes["sym_name"]).value == "main":
                return op if isinstance(op, func.FuncOp) else func.FuncOp(op.operation)
    raise IRError("module has no 'func.func @main': hloalias passes work on @main")


def return_op(main: func.FuncOp) -> ir.Operation:
    """The ``func.return`` that ends ``@main``'s single block."""
    region = main.regions[0]
    if len(region.blocks) != 1:
        raise IRError("@main must have exactly one block (no control flow at the top level)")
    operations = region.blocks[0].operations
    terminator = operations[len(operations) - 1]
    if terminator.operation.name != "func.return":
        raise IRError("@main does not end with func.return")
    return terminator.operation


def arg_attr_dicts(main: func.FuncOp) -> list[dict[str, ir.Attribute]]:
    """One mutable ``{name: attribute}`` dict per argument of ``@main``."""
    count = len(main.arguments)
    return _attr_dicts(main, "arg_attrs", count)


def result_attr_dicts(main: func.FuncOp) -> list[dict[str, ir.Attribute]]:
    """One mutable ``{name: attribute}`` dict per result of ``@main``."""
    count = len(ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).results)
    return _attr_dicts(main, "res_attrs", count)


def _attr_dicts(main: func.FuncOp, key: str, count: int) -> list[dict[str, ir.Attribute]]:
    if key not in main.attributes:
        return [{} for _ in range(count)]
    array = ir.ArrayAttr(main.attributes[key])
    dicts = []
    for entry in array:
        dictionary = ir.DictAttr(entry)
        dicts.append({dictionary[i].name: dictionary[i].attr for i in range(len(dictionary))})
    if len(dicts) != count:
        raise IRError(f"@main has {len(dicts)} entries in {key} for {count} values")
    return dicts


def set_arg_attr_dicts(main: func.FuncOp, dicts: Sequence[dict[str, ir.Attribute]]) -> None:
    """Replace ``@main``'s ``arg_attrs`` (dropped when all are empty)."""
    _set_attr_dicts(main, "arg_attrs", dicts)


def set_result_attr_dicts(main: func.FuncOp, dicts: Sequence[dict[str, ir.Attribute]]) -> None:
    """Replace ``@main``'s ``res_attrs`` (dropped when all are empty)."""
    _set_attr_dicts(main, "res_attrs", dicts)


def _set_attr_dicts(main: func.FuncOp, key: str, dicts: Sequence[dict[str, ir.Attribute]]) -> None:
    if not any(dicts):
        if key in main.attributes:
            del main.attributes[key]
        return
    main.attributes[key] = ir.ArrayAttr.get(
        [ir.DictAttr.get(dict(sorted(d.items()))) for d in dicts]
    )


def ranked_tensor(value_type: ir.Type, what: str) -> ir.RankedTensorType:
    """``value_type`` as a statically shaped ranked tensor, else IRError naming ``what``."""
    if not isinstance(value_type, ir.RankedTensorType):
        raise IRError(f"{what} has type {value_type}: only ranked tensors are supported")
    tensor = ir.RankedTensorType(value_type)
    if not tensor.has_static_shape:
        raise IRError(f"{what} has dynamic shape {value_type}: only static shapes are supported")
    return tensor


def element_bits(element_type: ir.Type) -> int:
    """Bit width of a tensor element type (complex counts both halves)."""
    if isinstance(element_type, ir.ComplexType):
        return 2 * element_bits(ir.ComplexType(element_type).element_type)
    if isinstance(element_type, ir.IntegerType):
        return int(ir.IntegerType(element_type).width)
    if isinstance(element_type, ir.FloatType):
        return int(ir.FloatType(element_type).width)
    if isinstance(element_type, ir.IndexType):
        return 64
    raise IRError(f"unsupported element type {element_type}")


def tensor_bytes(value_type: ir.Type) -> int:
    """Bytes XLA stores for a static tensor (``i1`` takes one byte)."""
    tensor = ir.RankedTensorType(value_type)
    count = 1
    for size in tensor.shape:
        count *= size
    return count * max(8, element_bits(tensor.element_type)) // 8


def walk_ops(root: ir.Operation) -> Iterator[ir.Operation]:
    """Every operation nested in ``root`` (pre-order), ``root`` excluded."""
    for region in root.regions:
        for block in region.blocks:
            for op in block.operations:
                yield op.operation
                yield from walk_ops(op.operation)


def print_module(module: ir.Module | ir.Operation, debug_info: bool = False) -> str:
    """The module's text; without locations unless ``debug_info``."""
    operation = module.operation if isinstance(module, ir.Module) else module
    return str(operation.get_asm(enable_debug_info=debug_info))
