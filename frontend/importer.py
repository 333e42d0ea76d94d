"""Import: a torch program -> StableHLO whose ``@main`` keeps parameters,
buffers, lifted constants and user inputs as arguments and records, in IR
attributes (:mod:`hloalias.attributes`), what each argument is and which
result is the new value of which mutated argument.

Engine: ``torch.export`` -> ``run_decompositions`` (functionalized: in-place
updates become extra outputs) -> torch-mlir's FX importer on the functional
graph (so nothing is frozen into literals) -> torch-mlir's lowering to the
torch backend contract and on to StableHLO.

Argument order of ``@main`` is the exported program's: parameters, buffers,
lifted tensor constants, then user inputs (the flattened ``(args, kwargs)``
leaves).  Result order is: mutated parameters and buffers, mutated user inputs, then
the flattened user outputs that are tensors (constant outputs such as None
are returned by the runtime as they are)."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.multiprocessing.reductions import StorageWeakRef
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind

from torch_mlir import ir, passmanager
from torch_mlir.extras.fx_decomp_util import get_decomposition_table
from torch_mlir.extras.fx_importer import FxImporter

from hloalias import attributes as A
from hloalias.contract import ArgRecord, ResultRecord
from hloalias.errors import TorchImportError
from hloalias.legalize import legalize_tensor_constants
from hloalias.mlir import (
    find_main,
    format_diagnostics,
    new_context,
    parse_module,
    print_module,
    set_arg_attr_dicts,
    set_result_attr_dicts,
    walk_ops,
)
from hloalias.repro import write_repro

TORCH_BACKEND_PIPELINE = (
    "builtin.module(func.func(torch-match-quantized-custom-ops), "
    "torchdynamo-export-to-torch-backend-pipeline{extra-library=})"
)
STABLEHLO_PIPELINE = "builtin.module(torch-backend-to-stablehlo-backend-pipeline)"

_MUTATION_OUTPUTS = (
    OutputKind.BUFFER_MUTATION,
    OutputKind.PARAMETER_MUTATION,
    OutputKind.USER_INPUT_MUTATION,
)

_KINDS = {
    InputKind.PARAMETER: "parameter",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "constant",
    InputKind.USER_INPUT: "user_input",
}


class Stage(enum.Enum):
    """Where :func:`import_torch` stops."""

    TORCH = "torch"  # torch dialect, backend contract (value semantics)
    STABLEHLO = "stablehlo"


@dataclasses.dataclass(frozen=True)
class ArgumentInfo:
    """One argument of ``@main``."""

    index: int
    kind: str
    name: str


@dataclasses.dataclass(frozen=True)
class ResultInfo:
    """One result of ``@main`` as imported (before any pass)."""

    index: int
    role: str
    output: int | None = None
    mutates: int | None = None
    storage: str | None = None  # eager storage class, see attributes.RESULT_STORAGE

    @property
    def record(self) -> ResultRecord:
        """The IR contract's record of this result."""
        return ResultRecord(self.role, self.output, self.mutates, self.storage)

    @property
    def key(self) -> str:
        """The result key (``output:N`` / ``mutation:I``)."""
        return self.record.key


@dataclasses.dataclass(frozen=True)
class ProgramSignature:
    """How ``@main``'s arguments and results map to the torch program."""

    arguments: tuple[ArgumentInfo, ...]
    results: tuple[ResultInfo, ...]
    in_spec: Any  # pytree spec of (args, kwargs)
    out_spec: Any  # pytree spec of the user outputs
    # User outputs that are Python constants (None, ints): no result of
    # @main, returned as they are.  Keyed by user output position.
    constant_outputs: dict[int, Any] = dataclasses.field(default_factory=dict)

    def user_input_indices(self) -> list[int]:
        """Indices of user-input arguments, in flattened (args, kwargs) order."""
        return [a.index for a in self.arguments if a.kind == "user_input"]


class Program:
    """An imported torch program: a verified MLIR module (torch dialect or
    StableHLO, see ``stage``) with its signature and module state.

    ``torch_mlir_module`` is a torch-mlir ``ir.Module`` that passes and
    torch-mlir ``PassManager``s run on in place; ``text`` prints it."""

    def __init__(
        self,
        module: ir.Module,
        stage: Stage,
        signature: ProgramSignature,
        state: dict[str, torch.Tensor],
    ) -> None:
        self.torch_mlir_module = module
        self.stage = stage
        self.signature = signature
        self.state = state

    @property
    def text(self) -> str:
        """The module's text (without locations)."""
        return print_module(self.torch_mlir_module)

    def __str__(self) -> str:
        return self.text

    def save(self, path: str | os.PathLike[str], debug_info: bool = False) -> None:
        """Write the module's text to ``path``."""
        with open(path, "w") as handle:
            handle.write(print_module(self.torch_mlir_module, debug_info=debug_info))

    def verify(self) -> None:
        """Run the MLIR verifier; raises ``TorchImportError`` if it fails."""
        with self.torch_mlir_module.context:
            try:
                self.torch_mlir_module.operation.verify()
            except ir.MLIRError as error:
                raise TorchImportError(format_diagnostics(error)) from None

    def clone(self) -> "Program":
        """An independent copy in a fresh context (the state is shared)."""
        text = print_module(self.torch_mlir_module, debug_info=True)
        module = parse_module(text, new_context())
        return Program(module, self.stage, self.signature, self.state)


def import_torch(
    f: torch.nn.Module | Callable[..., Any] | ExportedProgram,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    stage: Stage = Stage.STABLEHLO,
) -> Program:
    """Import ``f`` called on ``args``/``kwargs`` into a :class:`Program`.

    ``f`` is an ``nn.Module``, a plain function or an ``ExportedProgram``
    (then ``args`` are ignored).  ``stage`` chooses where import stops.
    Every argument and result carries the ``hloalias.*`` attributes.

    Raises :class:`TorchImportError` naming the culprit when export fails,
    a shape is dynamic (``dynamic_shapes`` is accepted so that ``torch.export``
    can report it, but dynamic dimensions are rejected), an input or output is
    not a tensor, or lowering fails (an op torch-mlir cannot lower, with its
    source line); on a lowering failure a repro ``.mlir`` is written and the
    message holds the ``torch-mlir-opt`` command that replays it."""
    kwargs = dict(kwargs or {})
    exported = f if isinstance(f, ExportedProgram) else _export(f, tuple(args), kwargs, dynamic_shapes)
    try:
        exported = exported.run_decompositions(get_decomposition_table())
    except Exception as error:  # torch raises many types here
        raise TorchImportError(f"torch.export decompositions failed: {error}") from error
    signature = _signature(exported)
    state = _state(exported, signature)

    context = new_context()
    importer = FxImporter(context=context)
    try:
        importer.import_stateless_graph(exported.graph_module.graph, func_name="main")
    except Exception as error:
        raise TorchImportError(f"torch-mlir's FX importer failed: {error}") from error
    module = importer.module
    _annotate(module, signature)

    def locate(aten_name: str) -> str | None:
        return _source_line(f, tuple(args), kwargs, aten_name)

    _lower(module, TORCH_BACKEND_PIPELINE, "torch backend contract", locate)
    if stage is Stage.STABLEHLO:
        _lower(module, STABLEHLO_PIPELINE, "StableHLO", locate)
        legalize_tensor_constants(module)
    _annotate(module, signature)
    program = Program(module, stage, signature, state)
    program.verify()
    return program


def _export(
    f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any
) -> ExportedProgram:
    module = f if isinstance(f, torch.nn.Module) else _FunctionModule.wrap(f)
    try:
        return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as error:
        raise TorchImportError(f"torch.export failed for {_describe(f)}: {error}") from error


class _FunctionModule(torch.nn.Module):
    """Wraps a function so ``torch.export`` sees its argument names."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @staticmethod
    def wrap(fn: Callable[..., Any]) -> "_FunctionModule":
        if not callable(fn):
            raise TorchImportError(f"expected an nn.Module, a function or an ExportedProgram, got {type(fn).__name__}")
        wrapper_type = type(f"Function_{getattr(fn, '__name__', 'fn')}", (_FunctionModule,), {})
        forward = lambda self, *a, **k: self.fn(*a, **k)  # noqa: E731
        try:
            parameters = list(inspect.signature(fn).parameters.values())
            self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
            forward.__signature__ = inspect.Signature([self_parameter, *parameters])  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass
        wrapper_type.forward = forward  # type: ignore[attr-defined]
        wrapper: _FunctionModule = wrapper_type(fn)
        return wrapper


def _describe(f: Any) -> str:
    return type(f).__name__ if isinstance(f, torch.nn.Module) else getattr(f, "__qualname__", repr(f))


def _signature(exported: ExportedProgram) -> ProgramSignature:
    graph_signature = exported.graph_signature
    placeholders = [n for n in exported.graph_module.graph.nodes if n.op == "placeholder"]
    arguments = []
    index_of_target: dict[str, int] = {}
    for index, (spec, node) in enumerate(zip(graph_signature.input_specs, placeholders)):
        if spec.kind not in _KINDS:
            raise TorchImportError(f"input '{node.name}' of kind {spec.kind.name} is not supported")
        kind = _KINDS[spec.kind]
        name = spec.target if spec.target is not None else spec.arg.name
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            raise TorchImportError(
                f"input '{name}' is {type(value).__name__}, not a tensor: hloalias compiles "
                "tensor inputs only (bake other values into the function)"
            )
        for dim, size in enumerate(value.shape):
            if not isinstance(size, int):
                raise TorchImportError(
                    f"input '{name}' has dynamic dimension {dim} ({size}): "
                    "hloalias compiles static shapes only"
                )
        arguments.append(ArgumentInfo(index, kind, name))
        index_of_target[name] = index
        if kind == "user_input":
            index_of_target[spec.arg.name] = index

    results: list[ResultInfo] = []
    output = 0
    constant_outputs: dict[int, Any] = {}
    graph_values = []
    output_node = next(n for n in exported.graph_module.graph.nodes if n.op == "output")
    for spec, value in zip(graph_signature.output_specs, output_node.args[0]):
        index = len(results)
        if spec.kind in _MUTATION_OUTPUTS:
            results.append(ResultInfo(index, A.ROLE_MUTATION, mutates=index_of_target[spec.target]))
        elif spec.kind == OutputKind.USER_OUTPUT and isinstance(spec.arg, ConstantArgument):
            constant_outputs[output] = spec.arg.value
            output += 1
            continue
        elif spec.kind == OutputKind.USER_OUTPUT:
            results.append(ResultInfo(index, A.ROLE_USER_OUTPUT, output=output))
            output += 1
        else:
            raise TorchImportError(f"output {spec.arg.name} of kind {spec.kind.name} is not supported")
        graph_values.append(value)
    if constant_outputs:
        # Constants are not results of @main: drop them from the graph.
        output_node.args = (tuple(graph_values),)
    for result, value in zip(results, graph_values):
        meta = getattr(value, "meta", {}).get("val")
        if not isinstance(meta, torch.Tensor):
            raise TorchImportError(
                f"result {result.key} is {type(meta).__name__ if meta is not None else repr(value)}, "
                "not a tensor: hloalias programs return tensors only"
            )
        for dim, size in enumerate(meta.shape):
            if not isinstance(size, int):
                raise TorchImportError(f"result {result.key} has dynamic dimension {dim} ({size})")
    results = _storage_classes(placeholders, results, graph_values)
    return ProgramSignature(
        tuple(arguments),
        tuple(results),
        exported.call_spec.in_spec,
        exported.call_spec.out_spec,
        constant_outputs,
    )


def _storage_classes(
    placeholders: list[Any], results: list[ResultInfo], values: list[Any]
) -> list[ResultInfo]:
    """Each result's eager storage class (``arg:I`` or ``new:N``), read from
    the fake tensors of the functional graph: there a view shares its base's
    storage, a copy (``clone``, ``contiguous``, arithmetic) does not, and the
    new value of a mutated argument is the storage that argument holds after
    the call.  StableHLO erases the difference (``x.clone()`` is ``x``)."""
    storage_class: dict[StorageWeakRef, str] = {}
    for index, node in enumerate(placeholders):
        storage_class.setdefault(StorageWeakRef(node.meta["val"].untyped_storage()), A.arg_key(index))
    for result, value in zip(results, values):
        if result.mutates is not None:
            # A whole-tensor copy_ leaves no node: the new value *is* the
            # source's storage, which keeps its own class.
            storage_class.setdefault(
                StorageWeakRef(value.meta["val"].untyped_storage()), A.arg_key(result.mutates)
            )
    fresh = 0
    classified = []
    for result, value in zip(results, values):
        reference = StorageWeakRef(value.meta["val"].untyped_storage())
        if reference not in storage_class:
            storage_class[reference] = f"new:{fresh}"
            fresh += 1
        storage = A.arg_key(result.mutates) if result.mutates is not None else storage_class[reference]
        classified.append(dataclasses.replace(result, storage=storage))
    return classified


def _state(exported: ExportedProgram, signature: ProgramSignature) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for argument in signature.arguments:
        if argument.kind in ("parameter", "buffer"):
            state[argument.name] = exported.state_dict[argument.name]
        elif argument.kind == "constant":
            state[argument.name] = exported.constants[argument.name]
    return state


def _annotate(module: ir.Module, signature: ProgramSignature) -> None:
    with module.context:
        main = find_main(module)
        set_arg_attr_dicts(
            main, [ArgRecord(kind=a.kind, name=a.name).to_attrs({}) for a in signature.arguments]
        )
        set_result_attr_dicts(main, [result.record.to_attrs({}) for result in signature.results])


def _lower(
    module: ir.Module, pipeline: str, target: str, locate: Callable[[str], str | None]
) -> None:
    before = print_module(module, debug_info=True)
    with module.context:
        module.context.emit_error_diagnostics = False
        try:
            passmanager.PassManager.parse(pipeline).run(module.operation)
        except ir.MLIRError as error:
            path = write_repro(before, "import")
            culprit = _unlowered_op(module)
            if culprit is not None:
                where = locate(culprit.removeprefix("torch.aten."))
                headline = f"torch-mlir cannot lower {culprit.removeprefix('torch.')} to the {target}" + (
                    f" (from {where})" if where else ""
                )
            else:
                headline = f"lowering to the {target} failed"
            raise TorchImportError(
                f"{headline}\n{format_diagnostics(error)}\n"
                f"repro written to {path}; replay with:\n"
                f"  torch-mlir-opt --pass-pipeline='{pipeline}' {path}",
                repro_path=path,
            ) from None


def _unlowered_op(module: ir.Module) -> str | None:
    """The first torch op a failed partial conversion left behind."""
    for op in walk_ops(module.operation):
        if op.name.startswith("torch.aten.") or op.name.startswith("torch.prims."):
            return str(op.name)
    return None


def _source_line(f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], aten_name: str) -> str | None:
    """Best effort: the user's source line of the first ``aten_name`` call.
    Only strict export records stack traces, so it is re-run here, on the
    failure path alone."""
    if isinstance(f, ExportedProgram):
        graphs = [f.graph_module.graph]
    else:
        try:
            module = f if isinstance(f, torch.nn.Module) else _FunctionModule.wrap(f)
            graphs = [torch.export.export(module, args, kwargs, strict=True).graph_module.graph]
        except Exception:
            return None
    for graph in graphs:
        for node in graph.nodes:
            name = getattr(getattr(node.target, "_overloadpacket", None), "__name__", "")
            trace = node.meta.get("stack_trace")
            if name == aten_name and trace:
                frames = _FRAME_RE.findall(trace)
                user = [fr for fr in frames if not _is_library_file(fr[0])]
                if user:
                    file, line, function, code = user[-1]
                    return f"{file}:{line} in {function}: {code.strip()}"
    return None


_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def _is_library_file(path: str) -> bool:
    library_roots = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
    return path.startswith(library_roots)
