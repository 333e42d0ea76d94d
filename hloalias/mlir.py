"""Small helpers over torch-mlir's MLIR Python bindings shared by the
importer, the passes and the command line: contexts, parsing with readable
diagnostics, ``@main`` signature access and tensor type facts."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from torch_mlir import ir
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

    def check(value_type: ir.Type, op: ir.Operation, what: str) -> None:
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
