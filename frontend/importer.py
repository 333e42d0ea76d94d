"""Import: a torch program -> StableHLO whose ``@main`` keeps parameters,
buffers, lifted constants and user inputs as arguments and records, in IR
attributes (:mod:`hloalias.attributes`), what each argument is and which
result is the new value of which mutated argument.

Engine: ``torch.export`` -> ``run_decompositions`` (functionalized: in-place
updates become extra outputs) -> torch-mlir's FX importer on the functional
graph (so nothing is frozen into literals) -> torch-mlir's lowering to the
torch backend contract and on to StableHLO.  A program that writes no
tensor in place is exported and decomposed in one trace instead
(:mod:`hloalias.frontend.single_trace`): the same functional graph.

Argument order of ``@main`` is the exported program's: parameters, buffers,
lifted tensor constants, then user inputs (the flattened ``(args, kwargs)``
leaves).  Result order is: mutated parameters and buffers, mutated user inputs, then
the flattened user outputs that are tensors (constant outputs such as None
are returned by the runtime as they are)."""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import torch
from torch.export import ExportedProgram
from torch.multiprocessing.reductions import StorageWeakRef
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind

from torch_mlir import ir

from hloalias import attributes as A, observe
from hloalias.contract import ArgRecord, IndexRange, ResultRecord
from hloalias.errors import TorchImportError
from hloalias.legalize import legalize_tensor_constants
from hloalias.mlir import (
    compile_context,
    drop_pass_manager,
    find_main,
    format_diagnostics,
    lowering_pass_manager,
    new_context,
    parse_module,
    print_module,
    set_arg_attr_dicts,
    set_result_attr_dicts,
    walk_ops,
)
from hloalias.pass_runs import run_verifying_result
from hloalias.repro import write_repro
from hloalias.frontend import crash_guard, jax_lowerings, random_key, single_trace, torch_internals
from hloalias.frontend.closure_tensors import with_sources
from hloalias.frontend.constant_folding import fold_constants
from hloalias.frontend.comparisons import compare_as_torch
from hloalias.frontend.gradient_dependence import (
    constant_reached_outputs,
    input_reached_outputs,
    parameter_free_outputs,
)
from hloalias.frontend.host_random import refuse_host_random_draws
from hloalias.frontend.program_frames import innermost_in_stack_trace, where_raised
from hloalias.frontend.op_coverage import remove_error_checks, unsigned_constants_as_bitcasts
from hloalias.frontend.index_normalization import normalize_indices
from hloalias.frontend.index_ranges import index_ranges
from hloalias.frontend.tracing_lock import tracing
from hloalias.frontend.carried_objects import CarriedObjects, record_carried_objects

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
    # User inputs that are Python values (``use_cache=False``, ints, strings):
    # no argument of @main, baked into the program as ``torch.export``
    # specialized on them (as JAX's ``static_argnames``).  Keyed by position
    # among the flattened ``(args, kwargs)`` leaves; the tensor leaves that
    # remain are the user-input arguments, in order.  A call must pass the
    # same values.
    static_inputs: dict[int, Any] = dataclasses.field(default_factory=dict)
    # Module state names that are another state argument's tensor (tied
    # weights, a tensor registered twice): merged into that argument at
    # import, name -> the argument's name.
    state_aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    # User inputs whose storage layout the program reads (``as_strided``
    # addresses storage, not values): argument index -> the example's
    # strides and storage offset (None: the program's as_strided calls keep
    # the input's offset, any will do).  A call must pass that layout.
    strided_inputs: dict[int, tuple[tuple[int, ...], int | None]] = dataclasses.field(default_factory=dict)
    # Input objects the program returns as themselves (a transformers
    # Cache it updates in Python): (output path, input path) pairs, see
    # frontend/carried_objects.py.  The runtime updates the caller's object.
    carried_objects: CarriedObjects = ()
    # User output positions that no floating chain from a parameter that
    # requires grad reaches (frontend/gradient_dependence.py): eager returns
    # them without requires_grad, so the runtime leaves them unmarked, and
    # marks the others (views of state included).  None: not known (a
    # foreign program), every computed result is marked, no view.
    parameter_free_outputs: frozenset[int] | None = None
    # For each floating user input (argument index) that a floating chain
    # leads from to a user output, those output positions (counted as in
    # ``parameter_free_outputs``): eager returns them requiring grad when the
    # caller's input does, and the runtime marks them then.  None: not known
    # (a foreign program, a cached signature from before this field): the
    # runtime marks nothing for inputs.
    input_gradient_outputs: dict[int, frozenset[int]] | None = None
    # The same for lifted constants, by state name: a function's closed-over
    # tensors, which are a closed-over model's parameters at run time
    # (frontend/closure_tensors.py); marked while the tensor requires grad.
    constant_gradient_outputs: dict[str, frozenset[int]] = dataclasses.field(default_factory=dict)
    # Integer user inputs whose values index an op unchanged: argument
    # index -> the ranges eager accepts (frontend/index_ranges.py), written
    # to the IR contract (``hloalias.index_ranges``), which the runtime reads.
    index_ranges: dict[int, tuple[IndexRange, ...]] = dataclasses.field(default_factory=dict)
    # State the program feeds to a batch norm (as its running statistics,
    # or weight and bias), whatever its name: eager's batch norm in train
    # mode updates running statistics in place without counting a version
    # (``F.batch_norm(..., training=True)``), so the runtime compares these
    # tensors' values at every call (runtime/running_stats.py).  Buffers
    # and constants only (a parameter is a weight or a bias, never updated
    # by a batch norm), read from the decomposed graph's ``original_aten``;
    # empty where the graph does not record it (a training step's trace).
    batch_norm_state: frozenset[str] = frozenset()

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
    """Import ``f`` called on ``args``/``kwargs`` into a :class:`Program`
    (see :func:`_import_torch`), one thread at a time
    (:mod:`hloalias.frontend.tracing_lock`)."""
    with tracing(), refuse_host_random_draws():
        return _import_torch(f, args, kwargs, dynamic_shapes=dynamic_shapes, stage=stage)


def _import_torch(
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
    _check_strided_inputs(tuple(args), kwargs)
    if not isinstance(f, ExportedProgram) and dynamic_shapes is None:
        # One trace where the training IR would change nothing
        # (frontend/single_trace.py); errors come from the path below.
        mark = observe.start(SINGLE_TRACE_STAGE)
        single = _export_decomposed(f, tuple(args), kwargs)
        if single is not None:
            _check_strided_outputs(single)
            observe.finish(mark)
            carried_once = carried_objects_of(single)
            single, state_aliases = _merge_aliased_state(single, owned=True)
            program = _import_decomposed(
                f, args, kwargs, single, state_aliases, None, {}, stage,
                user_ops=lambda: _training_ir_ops(f, tuple(args), kwargs),
            )
            return with_carried_objects(program, carried_once)
        observe.finish(mark)
    mark = observe.start("torch.export")
    exported = f if isinstance(f, ExportedProgram) else _export(f, tuple(args), kwargs, dynamic_shapes)
    carried = carried_objects_of(exported)
    _check_strided_outputs(exported)
    observe.finish(mark)
    exported, state_aliases = _merge_aliased_state(exported, owned=exported is not f)
    if not isinstance(f, ExportedProgram):
        _refuse_lossy_unfold_writes(exported)
        _masked_fill_in_place_keeps_layout(exported)
        _pin_eager_copies(exported)
        _explicit_copy_conversions(exported)
    eager_storage = _eager_output_storage(exported)
    # as_strided and as_strided_scatter are lowered through index arithmetic
    # on the example's layout (frontend/decompositions.py): the inputs they
    # address are recorded before the decompositions take them away.
    strided_before = _strided_inputs(exported)
    mark = observe.start("decompositions")
    try:  # a training step is captured decomposed and functional (frontend/training.py)
        if not getattr(exported, "hloalias_decomposed", False):
            exported = decompose(exported, _decomposition_table_with_custom_ops())
    except Exception as error:  # torch raises many types here
        # AOT autograd wraps the graph to replay an in-place write (or a
        # metadata change) through inputs that share memory; export has no
        # use for the wrapper and asserts "expected compiled_fn to be
        # GraphModule", naming neither the inputs nor the cause.
        shared = _inputs_sharing_memory(exported) if "compiled_fn" in str(error) else []
        if shared:
            pairs = ", ".join(f"{first} and {second}" for first, second in shared)
            raise TorchImportError(
                f"example inputs share memory ({pairs}: the same tensor, or views of one) and the "
                "program writes to one of them in place; torch.export cannot trace a write through "
                "inputs that share memory. Pass example inputs that do not (e.g. a .clone() of one); "
                "calls that pass such inputs are refused the same way."
                f"\n  torch: {error}"
            ) from error
        selection = _boolean_mask_selection(exported) if _data_dependent_hint(error) else None
        if selection is not None:
            raise TorchImportError(selection + f"\n  torch: {str(error).strip().splitlines()[0]}") from error
        raise TorchImportError(
            f"torch.export decompositions failed{_data_dependent_hint(error)}: {error}"
        ) from error
    observe.finish(mark)
    program = _import_decomposed(f, args, kwargs, exported, state_aliases, eager_storage, strided_before, stage)
    return with_carried_objects(program, carried)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _torch_functions_off(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """``function`` run with torch functions' overrides off
    (``torch._C.DisableTorchFunction``)."""

    @functools.wraps(function)
    def off(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with torch._C.DisableTorchFunction():
            return function(*args, **kwargs)

    return off


@_torch_functions_off
def _import_decomposed(
    f: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    exported: ExportedProgram,
    state_aliases: dict[str, str],
    eager_storage: list[str | None] | None,
    strided_before: dict[str, tuple[tuple[int, ...], int | None]],
    stage: Stage,
    *,
    user_ops: Callable[[], list[str]] | None = None,
) -> Program:
    """The import from the decomposed program on (FX import, lowering);
    ``state_aliases``, ``eager_storage`` and ``strided_before`` are what
    :func:`_import_torch` read from the graph before decomposing it.
    ``user_ops`` gives the program's ops before decomposition, for a crash
    report, where the graph's nodes do not record them (the single trace);
    by default they are read from the graph.
    :mod:`hloalias.frontend.shape_specialization` enters here with a
    program specialized from one exported with dynamic dimensions.

    Runs with torch functions' overrides off: no user code runs here (but
    the failure path's search for a source line, which traces the model
    again with them on), only graph rewrites, metadata queries on fake
    tensors and the ops of constant folding; a torch function mode around
    the import (``compile``'s refusal of training calls,
    runtime/executable.py, or the caller's own) would be entered for each
    of them, for nothing."""
    exported = remove_error_checks(exported)
    from hloalias.frontend.decompositions import prepare_graph

    prepare_graph(exported.graph_module.graph)
    if stage is Stage.STABLEHLO:
        _refuse_host_reads(exported.graph_module.graph)
    _refuse_returned_as_strided(exported)
    strided_inputs = {**strided_before, **_strided_inputs(exported)}
    _clamp_slice_bounds(exported.graph_module.graph)
    # Before torch-mlir folds or lowers: see each module's docstring.
    constant_values = _constant_values(exported)
    # Read before index normalization rewrites the index operands.
    ranges = index_ranges(
        exported.graph_module.graph,
        {spec.arg.name for spec in exported.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT},
        innermost_in_stack_trace,
    )
    normalized = normalize_indices(exported.graph_module.graph, constant_values)
    if fold_constants(exported.graph_module.graph) or normalized:
        exported.graph_module.recompile()
    _float_comparison_scalars(exported.graph_module.graph)
    if _same_operand_selects_expanded(exported.graph_module.graph):
        exported.graph_module.recompile()
    if _mask_products_as_selects(exported.graph_module.graph):
        exported.graph_module.recompile()
    if unsigned_constants_as_bitcasts(exported.graph_module.graph):
        exported.graph_module.recompile()
    _strided_copies_to_clones(exported.graph_module.graph)
    signature = _with_eager_storage(_signature(exported), eager_storage)
    signature = dataclasses.replace(
        signature,
        state_aliases=state_aliases,
        index_ranges={
            argument.index: ranges[argument.name]
            for argument in signature.arguments
            if argument.kind == "user_input" and argument.name in ranges
        },
        strided_inputs={
            argument.index: strided_inputs[argument.name]
            for argument in signature.arguments
            if argument.kind == "user_input" and argument.name in strided_inputs
        },
    )
    # A function's lifted constants that alias tensors it closes over (a
    # model's parameters) are those tensors: the runtime follows their writes.
    state = with_sources(f, _state(exported, signature))

    mark = observe.start("FX import")
    context = compile_context()  # the compile's pooled context (hloalias/mlir.py), if it holds one
    importer = fx_importer_class()(context=context)
    try:
        importer.import_stateless_graph(exported.graph_module.graph, func_name="main")
    except Exception as error:
        raise TorchImportError(f"torch-mlir's FX importer failed: {error}") from error
    module = importer.module
    jax_lowered = jax_lowerings.mark_calls(module)
    observe.finish(mark)
    observe.dump("torch", lambda: print_module(module))
    _annotate(module, signature)

    def locate(aten_name: str, on_complex: bool = False) -> str | None:
        with torch._C._EnableTorchFunction():  # it runs the model's code
            return _source_line(f, tuple(args), kwargs, aten_name, on_complex)

    # A crash in torch-mlir's native code must not end this process:
    # frontend/crash_guard.py says when the lowering runs in a child.
    pipelines = [TORCH_BACKEND_PIPELINE] + ([STABLEHLO_PIPELINE] if stage is Stage.STABLEHLO else [])
    risky = crash_guard.risky_nodes(exported.graph_module.graph)
    lowered = None
    if crash_guard.should_isolate(risky):
        with observe.stage("torch-mlir lowering in a child process"):
            lowered = crash_guard.lower_isolated(
                module,
                pipelines,
                user_ops() if user_ops is not None else crash_guard.program_ops(exported.graph_module.graph),
                risky,
                locate,
            )
    if lowered is not None:
        module = lowered
    else:
        try:
            with observe.stage("torch-mlir lowering to the backend contract"):
                _lower(module, TORCH_BACKEND_PIPELINE, "torch backend contract", locate)
            if stage is Stage.STABLEHLO:
                with observe.stage("torch-mlir lowering to StableHLO"):
                    _lower(module, STABLEHLO_PIPELINE, "StableHLO", locate)
        except TorchImportError as error:
            # torch-mlir names a gather's types, not the line whose size
            # depends on values (`target[valid_mask]` in a model's loss).
            sized = _data_dependent_size(exported)
            if sized is None:
                raise
            raise TorchImportError(sized + f"\n  torch-mlir: {str(error).splitlines()[0]}", repro_path=error.repro_path) from None
    if stage is Stage.STABLEHLO:
        # torch's NaN order in torch-mlir's sorts and arg-reductions, and
        # boolean comparisons XLA accepts, before JAX's lowerings (which
        # order NaNs their own way) are spliced in.
        compare_as_torch(module)
        if jax_lowered:
            with observe.stage("JAX lowerings"):
                jax_lowerings.splice(module)
        legalize_tensor_constants(module)
        if random_key.thread_rng_key(module):  # frontend/random_key.py
            key = ArgumentInfo(len(signature.arguments), random_key.KEY_KIND, random_key.KEY_NAME)
            signature = dataclasses.replace(signature, arguments=(*signature.arguments, key))
    _annotate(module, signature)
    program = Program(module, stage, signature, state)
    program.verify()
    return program


def _check_strided_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse sparse (and other non-strided) tensor inputs by position:
    StableHLO arguments are dense arrays, and export's storage checks
    would fail on them with a raw ``NotImplementedError``."""
    from torch.utils import _pytree

    leaves = _pytree.tree_leaves((args, kwargs))
    for position, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) and leaf.layout != torch.strided:
            raise TorchImportError(
                f"input {position} (flattened) is a {leaf.layout} tensor: hloalias compiles dense "
                "(strided) tensors only; pass t.to_dense()"
            )


def _check_strided_outputs(exported: ExportedProgram) -> None:
    """Refuse sparse (and other non-strided) outputs by position."""
    output_node = next(n for n in exported.graph_module.graph.nodes if n.op == "output")
    for position, value in enumerate(output_node.args[0]):
        meta = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
        if isinstance(meta, torch.Tensor) and meta.layout != torch.strided:
            raise TorchImportError(
                f"output {position} is a {meta.layout} tensor: hloalias returns dense (strided) "
                "tensors only; return t.to_dense()"
            )


def _constant_values(exported: ExportedProgram) -> dict[str, Any]:
    """Lifted tensor constants by placeholder name (their values are fixed
    at import, unlike parameters and buffers)."""
    return {
        spec.arg.name: exported.constants[spec.target]
        for spec in exported.graph_signature.input_specs
        if spec.kind == InputKind.CONSTANT_TENSOR and spec.target in exported.constants
    }


def _state_tensor(exported: ExportedProgram, name: str) -> Any:
    """State ``name`` of ``exported``: persistent parameters and buffers are
    in ``state_dict``; non-persistent buffers (``register_buffer(...,
    persistent=False)``: rotary ``inv_freq``, BERT's ``position_ids``) and
    lifted tensor constants are in ``constants``.  None when in neither."""
    if name in exported.state_dict:
        return exported.state_dict[name]
    return exported.constants.get(name)


def _merge_aliased_state(
    exported: ExportedProgram, *, owned: bool
) -> tuple[ExportedProgram, dict[str, str]]:
    """Make state that is one tensor one argument; reject state that overlaps.

    ``torch.export`` lifts a tensor the module reaches other than as an
    attribute (HF's ``StaticCache`` layers, also registered as buffers) as a
    *constant* beside the buffer it is, and a tensor registered twice as two
    buffers; functionalization then fails on the aliased inputs ("expected
    compiled_fn to be GraphModule").  Every state input that is exactly
    another one (same storage, offset, sizes, strides, dtype) is replaced by
    the first (parameters, then buffers, then constants): one device buffer,
    and in-place updates through either name update it (tied parameters
    too: the state keeps the first name).  A tensor that is both a
    parameter and a buffer, and state that shares memory without being the
    same view, are rejected naming both.  A caller's program (not
    ``owned``) is left as it was: the rewrite goes to a copy of its graph
    and signature."""
    signature = exported.graph_signature
    placeholders = {n.name: n for n in exported.graph_module.graph.nodes if n.op == "placeholder"}
    state_kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    order = {InputKind.PARAMETER: 0, InputKind.BUFFER: 1, InputKind.CONSTANT_TENSOR: 2}
    specs = sorted(
        (spec for spec in signature.input_specs if spec.kind in state_kinds and spec.target is not None),
        key=lambda spec: order[spec.kind],
    )
    canonical: dict[tuple[Any, ...], Any] = {}
    by_storage: dict[StorageWeakRef, tuple[str, torch.Tensor]] = {}
    merged: list[tuple[Any, Any]] = []
    for spec in specs:
        tensor = _state_tensor(exported, spec.target)
        if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0:
            continue
        storage = StorageWeakRef(tensor.untyped_storage())
        view = (storage, tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
        first = canonical.get(view)
        if first is not None:
            if {spec.kind, first.kind} == {InputKind.PARAMETER, InputKind.BUFFER}:
                raise TorchImportError(
                    f"module state '{spec.target}' and '{first.target}' are the same tensor registered "
                    f"as a {spec.kind.name.lower()} and a {first.kind.name.lower()}: register it once"
                )
            merged.append((spec, first))
            continue
        if storage in by_storage:
            other, other_tensor = by_storage[storage]
            if _overlaps(tensor, other_tensor):
                raise TorchImportError(
                    f"module state '{spec.target}' and '{other}' are overlapping views of one tensor: "
                    "hloalias keeps each state tensor in its own device buffer, so writes through one "
                    "would not reach the other; register the base tensor once and take the views in forward"
                )
        canonical[view] = spec
        by_storage.setdefault(storage, (spec.target, tensor))
    if not merged:
        return exported, {}
    # Names the module's state_dict has for a merged tensor (tied weights,
    # a buffer registered twice): the runtime answers to each of them.
    aliases = {
        spec.target: first.target for spec, first in merged if spec.kind != InputKind.CONSTANT_TENSOR
    }
    if not owned:
        original = exported
        exported = copy.copy(original)
        graph_copy = torch.fx.Graph()
        value_map: dict[torch.fx.Node, torch.fx.Node] = {}
        output = graph_copy.graph_copy(original.graph_module.graph, value_map)
        graph_copy.output(output)
        exported._graph_module = torch.fx.GraphModule(original.graph_module, graph_copy)
        exported._graph_signature = copy.deepcopy(original.graph_signature)
        exported._constants = dict(original.constants)
        signature = exported.graph_signature
        placeholders = {n.name: n for n in exported.graph_module.graph.nodes if n.op == "placeholder"}
        merged = [
            (next(s for s in signature.input_specs if s.arg.name == spec.arg.name),
             next(s for s in signature.input_specs if s.arg.name == first.arg.name))
            for spec, first in merged
        ]
    graph = exported.graph_module.graph
    for spec, first in merged:
        node = placeholders[spec.arg.name]
        node.replace_all_uses_with(placeholders[first.arg.name])
        graph.erase_node(node)
        signature.input_specs.remove(spec)
        if spec.kind == InputKind.CONSTANT_TENSOR:
            del exported.constants[spec.target]
    exported.graph_module.recompile()
    return exported, aliases


def _inputs_sharing_memory(exported: ExportedProgram) -> list[tuple[str, str]]:
    """Pairs of ``exported``'s example inputs (user inputs by argument
    name, state by fully qualified name) whose memory overlaps."""
    named: list[tuple[str, torch.Tensor]] = []
    leaves = iter(torch.utils._pytree.tree_leaves(exported.example_inputs or ((), {})))
    for spec in exported.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            value = next(leaves, None)
            name = f"input '{spec.arg.name}'"
        elif spec.target is not None:
            value = _state_tensor(exported, spec.target)
            name = f"state '{spec.target}'"
        else:
            continue
        if isinstance(value, torch.Tensor) and value.numel() > 0 and value.device.type != "meta":
            named.append((name, value))
    shared: list[tuple[str, str]] = []
    for position, (first, a) in enumerate(named):
        for second, b in named[position + 1:]:
            same_storage = StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())
            if same_storage and _overlaps(a, b):
                shared.append((first, second))
    return shared


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two views of one storage may share an element (by byte range)."""
    def extent(t: torch.Tensor) -> tuple[int, int]:
        start = int(t.storage_offset()) * t.element_size()
        last = sum((int(size) - 1) * int(stride) for size, stride in zip(t.shape, t.stride()))
        return start, start + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = extent(a), extent(b)
    return a0 < b1 and b0 < a1


def fx_importer_class() -> Any:
    """torch-mlir's ``FxImporter`` (imported on the first import of a
    program: a compile served by a cache does not need it)."""
    from torch_mlir.extras.fx_importer import FxImporter

    return FxImporter


def _torch_mlir_table() -> dict[Any, Callable[..., Any]]:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    table: dict[Any, Callable[..., Any]] = get_decomposition_table()
    return table


def _decomposition_table_with_custom_ops() -> dict[Any, Callable[..., Any]]:
    """:func:`_decomposition_table` with the entries of the third-party
    ops registered in this process now (a library loaded after the first
    compile still gets them)."""
    from hloalias.frontend.decompositions import custom_op_decompositions

    custom = custom_op_decompositions()
    return {**_decomposition_table(), **custom} if custom else _decomposition_table()


def late_registered_entries(
    table: Mapping[Any, Callable[..., Any]], traced: torch.fx.GraphModule
) -> dict[Any, Callable[..., Any]]:
    """The entries of :func:`_decomposition_table_with_custom_ops` missing
    from ``table`` for ops that ``traced`` calls: ops registered during
    the trace itself (a library that imports its op module on first use,
    as torch's chunked ``linear_cross_entropy`` does), which the trace
    recorded undecomposed.  Empty when there are none; otherwise the
    caller traces again with them."""
    full = _decomposition_table_with_custom_ops()
    if full is table:  # the shared table itself (no third-party entries): nothing can be missing
        return {}
    missing = {op: entry for op, entry in full.items() if op not in table}
    if not missing:
        return {}
    for graph_module in traced.modules():
        if isinstance(graph_module, torch.fx.GraphModule):
            for node in graph_module.graph.nodes:
                if node.op == "call_function" and node.target in missing:
                    return missing
    return {}


@functools.cache
def _decomposition_table() -> dict[Any, Callable[..., Any]]:
    """(Built once and shared: callers must not modify it.)

    torch-mlir's decomposition table with one entry replaced.

    torch's decomposition of ``_scaled_dot_product_flash_attention_for_cpu``
    (what SDPA becomes on CPU) returns its output in ``[L, B, H, E]``
    storage order, while the kernel, and so every fake tensor recorded at
    export, has ``[B, L, H, E]``.  The model's later ``view`` (GPT-2's
    ``Conv1D``, after ``transpose(1, 2).reshape``) was traced as a view of
    the kernel's layout and fails on the decomposition's for batch > 1
    ("Cannot view a tensor with shape [2, 64, 768] ...").  The replacement
    keeps the math and gives the output the kernel's layout."""
    with torch_internals.materialize_cia_ops_once():
        table = dict(_torch_mlir_table())
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    upstream = table.get(flash)
    if upstream is not None:

        def flash_attention_for_cpu(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            output, logsumexp = upstream(*args, **kwargs)
            # [B, H, L, E] values in [B, L, H, E] storage, as the kernel lays them out.
            output = output.transpose(1, 2).contiguous().transpose(1, 2)
            return output, logsumexp

        table[flash] = flash_attention_for_cpu
    # Lowerings torch-mlir lacks (hloalias.frontend.decompositions).
    from hloalias.frontend.decompositions import extra_decompositions

    table.update(extra_decompositions())
    return table


def decompose(
    exported: ExportedProgram, table: dict[Any, Callable[..., Any]] | None = None
) -> ExportedProgram:
    """``exported.run_decompositions(table)`` (default: torch-mlir's table),
    the same program, without its fixed per-call cost: see
    :mod:`hloalias.frontend.torch_internals`, the one module that uses
    torch's private export internals."""
    return torch_internals.decompose(exported, _torch_mlir_table() if table is None else table)


def _register_transformers_caches(f: Any) -> None:
    """Make transformers' cache classes pytree nodes before exporting, as
    transformers' own exporter does (``register_cache_pytrees_for_model``):
    a causal LM called as it comes returns a ``DynamicCache``, and the next
    step takes it back as ``past_key_values``; ``torch.export`` can flatten
    neither otherwise.  The registration is process-wide and idempotent
    (transformers registers the same nodes when it exports), and skipped
    when transformers is not loaded: no import for other programs."""
    import sys

    if "transformers" not in sys.modules:
        return
    try:
        from transformers import PreTrainedModel
        from transformers.cache_utils import Cache
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model, register_pytree_node
    except ImportError:  # a transformers without its exporter: export names what it cannot return
        return
    model = None
    if isinstance(f, torch.nn.Module):  # the model itself or a module wrapping one
        model = next((m for m in f.modules() if isinstance(m, PreTrainedModel)), None)
    if model is not None:
        register_cache_pytrees_for_model(model)  # also the model's own *Cache classes
        return
    pending = list(Cache.__subclasses__())
    while pending:
        cache_class = pending.pop()
        register_pytree_node(cache_class)
        pending.extend(cache_class.__subclasses__())


#: The observe stage of an export and decomposition done in one trace.
SINGLE_TRACE_STAGE = "torch.export and decompositions (one trace)"


def _training_ir_ops(f: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """The program's ops as ``torch.export``'s training IR has them (before
    the decompositions); empty when that export fails.  A single trace's
    nodes do not record them, and a crash report names them."""
    try:
        return crash_guard.program_ops(_export(f, args, kwargs, None).graph_module.graph)
    except Exception:  # a best-effort report
        return []


def _export_decomposed(
    f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any = None, dynamic_dims: Any = None
) -> ExportedProgram | None:
    """:func:`_export` and :func:`decompose` with the importer's table in
    one trace, or None where the program needs the training IR
    (:mod:`hloalias.frontend.single_trace`); ``dynamic_dims`` as
    :func:`hloalias.frontend.single_trace.export_decomposed` takes them."""
    module = f if isinstance(f, torch.nn.Module) else _FunctionModule.wrap(f)
    _register_transformers_caches(f)
    table = _decomposition_table_with_custom_ops()
    # A write to a tensor the program closes over stops the trace before
    # it happens; the single trace declines then, and _export names it.
    guard = single_trace.refusing_closed_over_writes(module, _describe(f))
    with guard, record_carried_objects(module) as carried:
        exported = single_trace.export_decomposed(module, args, kwargs, table, dynamic_shapes, dynamic_dims)
    late = late_registered_entries(table, exported.graph_module) if exported is not None else {}
    if late:
        table = {**table, **late}
        guard = single_trace.refusing_closed_over_writes(module, _describe(f))
        with guard, record_carried_objects(module) as carried:
            exported = single_trace.export_decomposed(module, args, kwargs, table, dynamic_shapes, dynamic_dims)
    if exported is not None:
        # As _export records them: a cache object the caller passes in and
        # gets back is updated by the runtime (frontend/carried_objects.py).
        exported.hloalias_carried_objects = carried[-1] if carried else ()  # type: ignore[attr-defined]
    return exported


def _export(
    f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any
) -> ExportedProgram:
    module = f if isinstance(f, torch.nn.Module) else _FunctionModule.wrap(f)
    _register_transformers_caches(f)
    try:
        # Every trace of the module refuses a write to a tensor it closes
        # over before the write (the caller's tensor stays as it was):
        # export would refuse the program only after tracing it.
        guard = single_trace.refusing_closed_over_writes(module, _describe(f))
        with guard, record_carried_objects(module) as carried:
            exported = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
        # Read back by _import_torch and export_dynamic (frontend/carried_objects.py).
        exported.hloalias_carried_objects = carried[-1] if carried else ()  # type: ignore[attr-defined]
        return exported
    except single_trace.ClosedOverWrite:
        raise
    except Exception as error:
        unknown = _UNKNOWN_OUTPUT_RE.search(str(error))
        if unknown is not None:
            type_name = unknown.group(1)
            hint = (
                " It is a transformers cache: pass use_cache=False (a static argument, baked into the "
                "program), or compile a static-cache module such as "
                "transformers.integrations.executorch.TorchExportableModuleWithStaticCache, whose "
                "cache lives in buffers that hloalias keeps on the device and updates in place."
                if "Cache" in type_name
                else " Return tensors, or tuples, lists, dicts or dataclasses of them."
            )
            raise TorchImportError(
                f"torch.export failed for {_describe(f)}: it returns a {type_name}, which hloalias "
                f"cannot return.{hint}"
            ) from error
        # Else the program's line the error was raised under (a shape
        # error in a model's forward named no line: LongT5's `torch.cat`).
        where = _data_dependent_hint(error) or where_raised(error)
        raise TorchImportError(f"torch.export failed for {_describe(f)}{where}: {error}") from error


_AS_STRIDED = torch.ops.aten.as_strided.default
_AS_STRIDED_SCATTER = torch.ops.aten.as_strided_scatter.default


def _refuse_returned_as_strided(exported: ExportedProgram) -> None:
    """``x.as_strided(size, stride, offset)`` addresses ``x``'s storage,
    which a compiled program does not have: the lowering gathers (and
    ``as_strided_scatter`` scatters) at the element positions of the
    example's layout.  The values are eager's, but a returned
    ``as_strided`` (or a view of one) would be a copy where eager returns a
    view of ``x`` (writes through it would not reach ``x``): refused,
    naming the line (return a ``.clone()``)."""
    graph = exported.graph_module.graph
    output = next(node for node in graph.nodes if node.op == "output")
    user_outputs = [
        value
        for spec, value in zip(exported.graph_signature.output_specs, output.args[0])
        if spec.kind == OutputKind.USER_OUTPUT and isinstance(value, torch.fx.Node)
    ]
    for returned in user_outputs:
        step: torch.fx.Node | None = returned
        while step is not None:
            if step.target is _AS_STRIDED:
                where = innermost_in_stack_trace(step.meta.get("stack_trace") or "")
                raise TorchImportError(
                    "the program returns a tensor's as_strided view (or a view of one)"
                    + (f" at {where}" if where else "")
                    + ": eager returns a view sharing the tensor's memory, a compiled program would "
                    "return a copy (writes through it would not reach the tensor); return "
                    "`.clone()` of it, or build the view from slices, view, transpose or expand"
                )
            step = _storage_operand(step)


def _strided_inputs(exported: ExportedProgram) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """The user inputs that an ``as_strided`` or ``as_strided_scatter``
    addresses (read or written through), with the example's strides (and
    storage offset, where one is given explicitly): another layout holds
    other elements at those positions, so the runtime checks every call's
    input against them."""
    graph = exported.graph_module.graph
    user_inputs = {
        spec.arg.name for spec in exported.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT
    }
    strided: dict[str, tuple[tuple[int, ...], int | None]] = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in (_AS_STRIDED, _AS_STRIDED_SCATTER):
            continue
        # as_strided views its operand; as_strided_scatter writes into a copy
        # of its first argument laid out as that argument is.
        first = node.args[0]
        root: torch.fx.Node = first if node.target is _AS_STRIDED_SCATTER and isinstance(first, torch.fx.Node) else node
        while (operand := _storage_operand(root)) is not None:
            root = operand
        example = root.meta.get("val")
        if root.op == "placeholder" and root.name in user_inputs and isinstance(example, torch.Tensor):
            # Without an explicit storage_offset as_strided keeps the input's:
            # positions are relative to it, and only the strides matter.
            position = 3 if node.target is _AS_STRIDED else 4  # as_strided_scatter has src first
            explicit = (
                node.args[position] if len(node.args) > position else node.kwargs.get("storage_offset")
            ) is not None
            offset = int(example.storage_offset()) if explicit else None
            previous = strided.get(root.name, ((), None))[1]
            strided[root.name] = (
                tuple(int(s) for s in example.stride()),
                offset if offset is not None else previous,
            )
    return strided


def _storage_operand(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor argument of ``node`` whose storage ``node``'s value shares
    (the operand of a view), or None."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    storage = value.untyped_storage()
    for arg in torch.utils._pytree.tree_leaves((node.args, node.kwargs)):
        if isinstance(arg, torch.fx.Node):
            arg_value = arg.meta.get("val")
            if isinstance(arg_value, torch.Tensor) and arg_value.untyped_storage() is storage:
                return arg
    return None


_HOST_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)


def _refuse_host_reads(graph: torch.fx.Graph) -> None:
    """A traced tensor's value read as a Python number (``.item()``,
    ``float(t)``) that the program goes on to compute with is a TorchImportError
    naming the user's line.  ``torch.export`` traces it (as an unbacked
    number) and torch-mlir lowers it to ``tensor.extract``, which no
    StableHLO consumer accepts: XLA failed later with "failed to serialize
    module", naming nothing of the user's."""
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _HOST_READS:
            continue
        if all(user.op == "output" for user in node.users):
            continue  # unused, or returned: _signature names a returned number
        where = innermost_in_stack_trace(node.meta.get("stack_trace") or "")
        raise TorchImportError(
            "the program reads a traced tensor's value on the host (.item(), float(t), int(t))"
            + (f" at {where}" if where else "")
            + ". An XLA program reads no values on the host: keep the value a tensor "
            "(`x * t` rather than `x * t.item()`, `torch.where` rather than `if`), or pass a Python "
            "number as an argument (baked into the program: one compile per value)"
        )


def _boolean_mask_selection(exported: ExportedProgram) -> str | None:
    """The message for a selection by a boolean mask (``x[mask]``) that the
    program goes on to compute with, naming its line; None when the graph
    holds none.  (``x[mask] = value``, one value for every selected
    element, is a ``where``: frontend/decompositions.py.)"""
    for node in exported.graph.nodes:
        if node.op != "call_function" or node.target not in (torch.ops.aten.index.Tensor, torch.ops.aten._unsafe_index.Tensor):
            continue
        indices = node.args[1] if len(node.args) > 1 else ()
        masks = [
            index for index in indices
            if isinstance(index, torch.fx.Node) and getattr(index.meta.get("val"), "dtype", None) in (torch.bool, torch.uint8)
        ]
        if not masks:
            continue
        where = innermost_in_stack_trace(node.meta.get("stack_trace") or "")
        return (
            "the program selects elements by a boolean mask (`x[mask]`)"
            + (f" at {where}" if where else "")
            + ": the selection's size depends on the mask's values, and an XLA program has static shapes. "
            "Compute over the full shape instead: `torch.where(mask, y, x)` for `x[mask] = y[mask]`, "
            "`torch.where(mask, x + 1, x)` for `x[mask] += 1`, `(x * mask).sum()` for `x[mask].sum()` "
            "(`x[mask] = value`, one value for every selected element, compiles as written)"
        )
    return None


def _data_dependent_size(exported: ExportedProgram) -> str | None:
    """The message for a tensor whose size depends on tensor values (an
    unbacked size: ``x[mask]``, ``nonzero()``, ``unique()``) in the
    decomposed graph, naming the line that made it; None when every size
    is known from the inputs' shapes."""
    # torch loads its symbolic shapes on the first trace that needs them.
    symbolic_shapes = sys.modules.get("torch.fx.experimental.symbolic_shapes")
    if symbolic_shapes is None:
        return None
    selection = _boolean_mask_selection(exported)
    if selection is not None:
        return selection
    for node in exported.graph.nodes:
        value = node.meta.get("val")
        if node.op == "call_function" and isinstance(value, torch.Tensor) and symbolic_shapes.free_unbacked_symbols(value.shape):
            where = innermost_in_stack_trace(node.meta.get("stack_trace") or "")
            return (
                f"the size of `{node.target}`'s result depends on tensor values"
                + (f" at {where}" if where else "")
                + ", and an XLA program has static shapes: compute over the full shape instead "
                "(`torch.where`, a mask multiplied in)"
            )
    return None


def _data_dependent_hint(error: BaseException) -> str:
    """What to write instead, when ``error`` is torch's failure to trace a
    tensor's value used as a Python number (empty otherwise)."""
    # torch loads its symbolic shapes (and sympy) on the first trace that
    # needs them: an error of that type cannot come before.
    symbolic_shapes = sys.modules.get("torch.fx.experimental.symbolic_shapes")
    if symbolic_shapes is None or not isinstance(error, symbolic_shapes.GuardOnDataDependentSymNode):
        return ""
    validation = _distribution_validation(error)
    if validation is not None:
        # The generic advice (index with the tensor, pass an int) does not
        # apply: the check is torch's own, and a switch turns it off.
        return (
            f". The program builds a torch.distributions object{where_raised(error)} whose argument "
            f"validation (validate_args, on by default) reads tensor values on the host in {validation}: "
            "an XLA program reads no values on the host. Turn the check off: "
            "`torch.distributions.Distribution.set_default_validate_args(False)` before compiling, "
            "or `validate_args=False` where the distribution is made (the values computed are the same)"
        )
    return (
        f". The program uses a tensor's value as a Python number{where_raised(error)}: indexing with a 0-d tensor "
        "(`x[:, pos] = v`, `x[pos]`) calls `pos.item()`, as do `int(t)` and `if t > 0:`. An XLA "
        "program reads no values on the host: index with the tensor "
        "(`x.index_copy_(dim, pos.view(1), v.unsqueeze(dim))`, `x.index_select(dim, pos.view(1))`, "
        "`torch.where`), or pass a Python int (baked into the program: one compile per value)"
    )


_DISTRIBUTION_CHECKS = {"__init__": "its constructor", "_validate_sample": "`_validate_sample`"}


def _distribution_validation(error: BaseException) -> str | None:
    """Which check of ``torch.distributions.Distribution`` ``error`` was
    raised under (its constructor's parameter check, or ``_validate_sample``
    of ``log_prob``/``cdf``), described; None when it was raised elsewhere."""
    tb = error.__traceback__
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in _DISTRIBUTION_CHECKS and code.co_filename.replace(os.sep, "/").endswith(
            "torch/distributions/distribution.py"
        ):
            found = _DISTRIBUTION_CHECKS[code.co_name]
        tb = tb.tb_next
    return found


def carried_objects_of(exported: ExportedProgram) -> CarriedObjects:
    """The carried objects :func:`_export` found (none for a caller's
    ExportedProgram: nothing watched its export)."""
    found: CarriedObjects = getattr(exported, "hloalias_carried_objects", ())
    return found


def with_carried_objects(program: "Program", carried: CarriedObjects) -> "Program":
    """``program`` with ``carried`` recorded in its signature."""
    if carried:
        program.signature = dataclasses.replace(program.signature, carried_objects=carried)
    return program


_UNKNOWN_OUTPUT_RE = re.compile(r"Found <class '([^']+)'> in output, which is not a known type")


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
        # Named ``forward``: torch.fx records a node's stack trace from the
        # first frame of that name on (a lambda's frames were all dropped,
        # so no error could name the line of a compiled function).
        def forward(self: _FunctionModule, *a: Any, **k: Any) -> Any:
            return self.fn(*a, **k)

        try:
            parameters = list(inspect.signature(fn).parameters.values())
            self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
            forward.__signature__ = inspect.Signature([self_parameter, *parameters])  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass
        wrapper_type.forward = forward  # type: ignore[attr-defined]
        torch_internals.keep_stack_traces_of(fn)
        wrapper: _FunctionModule = wrapper_type(fn)
        return wrapper


def _describe(f: Any) -> str:
    return type(f).__name__ if isinstance(f, torch.nn.Module) else getattr(f, "__qualname__", repr(f))


def _signature(exported: ExportedProgram) -> ProgramSignature:
    parameter_free = parameter_free_outputs(exported)
    input_reached = input_reached_outputs(exported)  # before the static inputs' placeholders go
    constant_gradient = constant_reached_outputs(exported)
    graph_signature = exported.graph_signature
    graph = exported.graph_module.graph
    all_placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    placeholders: list[torch.fx.Node] = []
    arguments: list[ArgumentInfo] = []
    index_of_target: dict[str, int] = {}
    static_inputs: dict[int, Any] = {}
    user_leaf = 0
    for spec, node in zip(graph_signature.input_specs, all_placeholders):
        if spec.kind not in _KINDS:
            raise TorchImportError(f"input '{node.name}' of kind {spec.kind.name} is not supported")
        kind = _KINDS[spec.kind]
        name = spec.target if spec.target is not None else spec.arg.name
        value = node.meta.get("val")
        if kind == "user_input":
            leaf = user_leaf
            user_leaf += 1
            if not isinstance(value, torch.Tensor):
                # A Python value (bool, int, float, str): static, baked into
                # the program as export specialized on it.
                if node.users:
                    raise TorchImportError(
                        f"input '{name}' is {type(value).__name__}, not a tensor, and the exported "
                        "graph still reads it: hloalias compiles tensor inputs only"
                    )
                static_inputs[leaf] = value if isinstance(value, (bool, int, float, str)) else getattr(
                    spec.arg, "value", value
                )
                graph.erase_node(node)
                continue
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
        index = len(arguments)
        arguments.append(ArgumentInfo(index, kind, name))
        placeholders.append(node)
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
                raise TorchImportError(
                    f"result {result.key} has dynamic dimension {dim} ({size})"
                    + (
                        ": its size depends on the input's values (boolean-mask indexing, nonzero, unique, "
                        "masked_select); an XLA program has static shapes: keep the shape fixed "
                        "(torch.where(mask, x, 0), a padded index list) or run that part eagerly"
                        if str(size).startswith("u")
                        else ""
                    )
                )
    results = _storage_classes(placeholders, results, graph_values)
    batch_norm_state = frozenset(
        argument.name for argument, node in zip(arguments, placeholders)
        if argument.kind in ("buffer", "constant") and _feeds_batch_norm(node)
    )
    input_gradient = {
        index_of_target[name]: positions for name, positions in input_reached.items() if name in index_of_target
    }
    in_spec, out_spec = _call_specs(exported)
    return ProgramSignature(
        tuple(arguments),
        tuple(results),
        in_spec,
        out_spec,
        constant_outputs,
        static_inputs,
        parameter_free_outputs=parameter_free,
        input_gradient_outputs=input_gradient,
        constant_gradient_outputs=constant_gradient,
        batch_norm_state=batch_norm_state,
    )


def _feeds_batch_norm(node: torch.fx.Node) -> bool:
    """Whether ``node`` (a placeholder of the decomposed graph), or a view
    of it, is read by an op decomposed from a batch norm (the node's
    ``original_aten``: ``_native_batch_norm_legit_no_training`` in eval
    mode, ``_native_batch_norm_legit_functional`` in train mode, ...)."""
    seen: set[torch.fx.Node] = set()
    pending = [node]
    while pending:
        for user in pending.pop().users:
            if user in seen:
                continue
            seen.add(user)
            original = user.meta.get("original_aten")
            name = getattr(original, "_opname", "") or str(original)
            if "batch_norm" in name and "backward" not in name:
                return True
            if getattr(user.target, "is_view", False):
                pending.append(user)
    return False


def _call_specs(exported: ExportedProgram) -> tuple[Any, Any]:
    """``exported.call_spec``'s ``in_spec`` and ``out_spec``, read where
    that property reads them (the root entry of the module call graph;
    none without one), without the ``NamedTuple`` class torch's property
    defines on every read (~0.2 ms of every import)."""
    if not exported.module_call_graph:
        return None, None
    root = exported.module_call_graph[0]
    if root.fqn != "":
        raise AssertionError(f"expected first module_call_graph fqn to be empty string, got {root.fqn!r}")
    return root.signature.in_spec, root.signature.out_spec


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


_COPY_OR_VIEW_OPS = ("contiguous", "reshape", "flatten")


def _masked_fill_in_place_keeps_layout(exported: ExportedProgram) -> None:
    """Write ``t.masked_fill_(mask, v)`` of a ``t`` that is not laid out
    row-major (a transposed view of an input) as ``t.copy_(t.masked_fill(mask,
    v))``, in the training IR.  Functionalization replays the in-place
    write as the out-of-place op, whose result torch lays out row-major
    whatever ``t``'s layout, and derives the written base's new value from
    it: the base then had the view's inverse strides, so a later
    ``x.as_strided`` read the wrong elements (silently) and
    ``x.reshape(-1)`` failed to replay.  ``copy`` keeps ``t``'s layout,
    as eager's in-place write does."""
    from torch._guards import detect_fake_mode

    graph = exported.graph_module.graph
    functional = {
        torch.ops.aten.masked_fill_.Scalar: torch.ops.aten.masked_fill.Scalar,
        torch.ops.aten.masked_fill_.Tensor: torch.ops.aten.masked_fill.Tensor,
    }
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in functional:
            continue
        target = node.args[0]
        value = target.meta.get("val") if isinstance(target, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.is_contiguous():
            continue
        fake_mode = detect_fake_mode([value])
        if fake_mode is None:
            continue
        with fake_mode:
            filled_value = functional[node.target](
                *[a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in node.args]
            )
        with graph.inserting_before(node):
            filled = graph.call_function(functional[node.target], node.args, dict(node.kwargs))
        filled.meta = {**node.meta, "val": filled_value}
        node.target = torch.ops.aten.copy_.default
        node.args = (target, filled)
        node.kwargs = {}
        changed = True
    if changed:
        exported.graph_module.recompile()


_UNFOLD = torch.ops.aten.unfold.default


def writes_through_unfold(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The ``unfold`` nodes of a graph with eager's in-place ops (the
    training IR) whose result, or a view of it, an op writes in place."""
    found: list[torch.fx.Node] = []
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        for position, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            written = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
            step = written if isinstance(written, torch.fx.Node) else None
            while step is not None and step.target is not _UNFOLD:
                step = _storage_operand(step)
            if step is not None and step not in found:
                found.append(step)
    return found


def unfold_covers(length: int, size: int, step: int) -> bool:
    """Whether ``unfold(dim, size, step)`` of a dimension of ``length``
    tiles it: every element in exactly one window."""
    return size == step and size > 0 and length % size == 0


def lossy_unfold_write_message(dim: int, size: int, step: int, length: int, where: str | None) -> str:
    """Why a write through windows that do not tile their dimension is
    refused: functionalization (torch.export's, torch.compile's, the
    training capture's) rebuilds the unfolded tensor from the written
    windows with ``unfold_backward``, which sets every element no window
    covers to 0 where eager keeps it (pytorch/pytorch#198102)."""
    how = "overlap" if size > step else "leave elements of the dimension uncovered"
    return (
        f"the program writes in place through `unfold({dim}, {size}, {step})` of a tensor of size "
        f"{length} in that dimension" + (f" at {where}" if where else "") + f", whose windows {how}: "
        "functionalization (torch.export, torch.compile) rebuilds the tensor from the windows with "
        "unfold_backward, which would set every element no window covers to 0 where eager keeps it "
        "(pytorch/pytorch#198102). Write through slices of the tensor instead, or write to a "
        "`.clone()` of the unfolded windows"
    )


def _refuse_lossy_unfold_writes(exported: ExportedProgram) -> None:
    """An in-place write through ``x.unfold(dim, size, step)`` whose windows
    do not tile ``x``'s dimension (gaps, ``step > size``; a tail no window
    reaches; overlap, ``size > step``) is a TorchImportError naming the op
    (:func:`lossy_unfold_write_message`); windows that tile it rebuild
    ``x`` exactly and are kept."""
    for node in writes_through_unfold(exported.graph_module.graph):
        base = node.args[0]
        base_value = base.meta.get("val") if isinstance(base, torch.fx.Node) else None
        if not isinstance(base_value, torch.Tensor):
            continue
        dim, size, step = (a for a in node.args[1:4] if isinstance(a, int))
        length = base_value.shape[dim] if base_value.dim() else 1
        if not unfold_covers(length, size, step):
            where = innermost_in_stack_trace(node.meta.get("stack_trace") or "")
            raise TorchImportError(lossy_unfold_write_message(dim, size, step, length, where))


def _pin_eager_copies(exported: ExportedProgram) -> bool:
    """Make each ``contiguous``/``reshape``/``flatten`` that copies in eager
    (for the example inputs' strides: its result has a storage of its own)
    an explicit ``clone`` (then ``view``), in place.  Functionalization
    re-derives those ops on functional intermediates whose strides differ
    from eager's (``x.add_(1)`` on a non-contiguous ``x`` becomes a
    contiguous ``add``), decides "view" where eager copied, and then replays
    later mutations of ``x`` into the result; a clone is a copy in every
    graph.  Returns whether it changed the graph."""
    graph = exported.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        name = getattr(getattr(node.target, "_overloadpacket", None), "__name__", "")
        if node.op != "call_function" or name not in _COPY_OR_VIEW_OPS or not node.args:
            continue
        source, result = node.args[0], node.meta.get("val")
        operand = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
        if not isinstance(result, torch.Tensor) or not isinstance(operand, torch.Tensor):
            continue
        if StorageWeakRef(result.untyped_storage()) == StorageWeakRef(operand.untyped_storage()):
            continue  # a view in eager: functionalization agrees
        with graph.inserting_before(node):
            copy = graph.call_function(
                torch.ops.aten.clone.default, (source,), {"memory_format": torch.contiguous_format}
            )
            copy.meta = dict(node.meta)
            replacement = copy
            if any(isinstance(size, torch.SymInt) for size in (*result.shape, *operand.shape)):
                # Symbolic sizes are not literals (a program exported with
                # dynamic dimensions): the op itself, a view of the clone.
                replacement = graph.call_function(node.target, (copy, *node.args[1:]), dict(node.kwargs))
                replacement.meta = dict(node.meta)
            elif tuple(result.shape) != tuple(operand.shape):
                replacement = graph.call_function(torch.ops.aten.view.default, (copy, list(result.shape)))
                replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
        changed = True
    if changed:
        exported.graph_module.recompile()
    return changed


def _eager_output_storage(exported: ExportedProgram) -> list[str | None] | None:
    """Each user output's eager storage class, read from the graph *before*
    functionalization, where in-place ops are still in place and every
    node's fake tensor has the strides and storage eager PyTorch gives it:
    ``buf.copy_(x); return buf`` is ``buf``'s storage (the functional graph
    returns ``x``), ``x.detach()`` shares ``x``'s, and ``.contiguous()`` of
    a non-contiguous view is a new storage even where functionalization made
    its operand contiguous.  None where the graph lacks fake tensors."""
    graph = exported.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output_node = next(n for n in graph.nodes if n.op == "output")
    storage_class: dict[StorageWeakRef, str] = {}
    index = 0  # @main's argument number: static (non-tensor) inputs are no arguments
    for node in placeholders:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue  # a non-tensor input (static value): no storage
        storage_class.setdefault(StorageWeakRef(value.untyped_storage()), A.arg_key(index))
        index += 1
    classes: list[str | None] = []
    fresh = 0
    values = list(output_node.args[0])
    specs = exported.graph_signature.output_specs
    if len(values) != len(specs):
        return None
    for spec, value in zip(specs, values):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        meta = getattr(value, "meta", {}).get("val") if isinstance(value, torch.fx.Node) else None
        if not isinstance(meta, torch.Tensor):
            classes.append(None)
            continue
        reference = StorageWeakRef(meta.untyped_storage())
        if reference not in storage_class:
            storage_class[reference] = f"new:{fresh}"
            fresh += 1
        classes.append(storage_class[reference])
    return classes


def _with_eager_storage(signature: ProgramSignature, eager_storage: list[str | None] | None) -> ProgramSignature:
    """``signature`` with each user output's storage class taken from
    :func:`_eager_output_storage` where that is known."""
    if eager_storage is None:
        return signature
    results = []
    for result in signature.results:
        if result.output is not None and result.output < len(eager_storage) and eager_storage[result.output]:
            result = dataclasses.replace(result, storage=eager_storage[result.output])
        results.append(result)
    return dataclasses.replace(signature, results=tuple(results))


def _state(exported: ExportedProgram, signature: ProgramSignature) -> dict[str, torch.Tensor]:
    """Module state by argument name (see :func:`_state_tensor`)."""
    state: dict[str, torch.Tensor] = {}
    for argument in signature.arguments:
        if argument.kind == "user_input":
            continue
        value = _state_tensor(exported, argument.name)
        if value is None:
            raise TorchImportError(
                f"{argument.kind} '{argument.name}' is neither in the exported program's state_dict "
                "nor in its constants"
            )
        if not isinstance(value, torch.Tensor):
            raise TorchImportError(
                f"{argument.kind} '{argument.name}' is {type(value).__name__}, not a tensor"
            )
        state[argument.name] = value
    return state


# Ops whose (dim, start, end, step) follow the input's tensor (argument 0).
_SLICE_OPS = {
    torch.ops.aten.slice.Tensor: 1,  # position of ``dim``
    torch.ops.aten.slice_scatter.default: 2,
}


_COMPARISONS_WITH_SCALAR = frozenset(
    getattr(torch.ops.aten, name).Scalar for name in ("eq", "ne", "gt", "ge", "lt", "le")
)


def _float_comparison_scalars(graph: torch.fx.Graph) -> None:
    """Give every comparison of a floating tensor with an integer scalar
    (``x > 0``) a float scalar, in place.  Exact: torch compares in the
    tensor's dtype either way.  Needed because torch-mlir folds such a
    comparison of a constant float tensor wrongly (``full_like(x, 1.5) > 0``
    folds to False; ``x.fill_(1.5); x.masked_fill_(x > 0, -2.0)`` came back
    as 1.5), while a float scalar folds right."""
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _COMPARISONS_WITH_SCALAR or len(node.args) < 2:
            continue
        tensor, scalar = node.args[0], node.args[1]
        value = tensor.meta.get("val") if isinstance(tensor, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
            continue
        if isinstance(scalar, int) and not isinstance(scalar, bool):
            node.args = (tensor, float(scalar), *node.args[2:])


def _same_value(first: Any, second: Any) -> bool:
    """Whether two operands are one value: one node, or two ``full`` of the
    same shape, value and options (constant folding writes splats so)."""
    if first is second:
        return True
    return (
        isinstance(first, torch.fx.Node) and isinstance(second, torch.fx.Node)
        and first.target is torch.ops.aten.full.default and second.target is torch.ops.aten.full.default
        and repr(first.args) == repr(second.args) and repr(first.kwargs) == repr(second.kwargs)
    )


def _same_operand_selects_expanded(graph: torch.fx.Graph) -> bool:
    """Write every ``where(c, a, a)`` whose result is larger than ``a`` as
    ``a.expand(result shape).clone()``, in place (the value torch computes: both
    choices are ``a``).  Needed because torch-mlir folds it to ``a``
    itself, dropping the broadcast: the next op then met a value of
    ``a``'s shape, and the lowering failed (``scatter_reduce(..., "sum",
    include_self=False)`` of a constant source, TAPAS's cell selection).
    Two ``full`` nodes of the same arguments are the same ``a``: torch-mlir
    merges them before it folds.  Returns whether it changed the graph."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.where.self or len(node.args) != 3:
            continue
        _, chosen, other = node.args
        if not isinstance(chosen, torch.fx.Node) or not _same_value(chosen, other):
            continue
        value, operand = node.meta.get("val"), chosen.meta.get("val")
        if not isinstance(value, torch.Tensor) or not isinstance(operand, torch.Tensor):
            continue
        if value.dtype != operand.dtype or tuple(value.shape) == tuple(operand.shape):
            continue
        if not all(isinstance(size, int) for size in value.shape):
            continue  # symbolic sizes: left as they were
        with graph.inserting_before(node):
            expanded = graph.call_function(torch.ops.aten.expand.default, (chosen, list(value.shape)))
            # A new tensor, as where's: a returned expand would come back
            # as a view of ``a``.
            copied = graph.call_function(torch.ops.aten.clone.default, (expanded,))
        expanded.meta = {**node.meta, "val": operand.expand(value.shape)}
        copied.meta = dict(node.meta)
        node.replace_all_uses_with(copied)
        graph.erase_node(node)
        changed = True
    return changed


_BOOL_TO_FLOAT = (torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def _bool_operand(node: Any) -> torch.fx.Node | None:
    """The boolean tensor ``node`` is, or converts to a float (``mask``,
    ``mask.float()``, ``mask.to(x.dtype)``); None otherwise."""
    if not isinstance(node, torch.fx.Node):
        return None
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor) and value.dtype == torch.bool:
        return node
    if node.op == "call_function" and node.target in _BOOL_TO_FLOAT and node.args and isinstance(node.args[0], torch.fx.Node):
        source = node.args[0].meta.get("val")
        if isinstance(value, torch.Tensor) and value.is_floating_point() and isinstance(source, torch.Tensor) \
                and source.dtype == torch.bool:
            return node.args[0]
    return None


def _mask_products_as_selects(graph: torch.fx.Graph) -> bool:
    """Write every float ``x * mask`` (``mask`` boolean, or a boolean
    converted to a float) as ``where(mask, x, x * 0)``, in place: the value
    eager computes, ``-0.0`` where a negative ``x`` meets False and NaN
    where an infinity or NaN does.  Needed because XLA's algebraic
    simplifier rewrites ``multiply(x, convert(pred))`` as ``select(pred, x,
    0)``, which returns ``+0.0`` there (session 48 sweep: ``x.mul_(x > 0)``,
    ``hidden * attention_mask``); it leaves the select and ``x * 0`` as they
    are.  Returns whether it changed the graph."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.mul.Tensor or len(node.args) != 2 or node.kwargs:
            continue
        result = node.meta.get("val")
        if not isinstance(result, torch.Tensor) or not result.is_floating_point():
            continue
        for value, other in (node.args, tuple(reversed(node.args))):
            mask = _bool_operand(other)
            operand = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
            if mask is None or not isinstance(operand, torch.Tensor) or operand.dtype != result.dtype:
                continue
            if _bool_operand(value) is not None:
                continue  # mask * mask: no float value whose sign or NaN matters
            with graph.inserting_before(node):
                if tuple(operand.shape) != tuple(result.shape):
                    # Broadcast first: torch-mlir folded the select of a
                    # smaller value back into a multiply of its operands'
                    # shape with the result's type (histogram's weights).
                    value = graph.call_function(torch.ops.aten.expand.default, (value, list(result.shape)))
                    value.meta = {**node.meta, "val": operand.expand(result.shape)}
                    operand = value.meta["val"]
                zero = graph.call_function(torch.ops.aten.mul.Tensor, (value, 0.0))
                select = graph.call_function(torch.ops.aten.where.self, (mask, value, zero))
            zero.meta = {**node.meta, "val": operand * 0.0}
            select.meta = dict(node.meta)
            node.replace_all_uses_with(select)
            graph.erase_node(node)
            changed = True
            break
    return changed


def _explicit_copy_conversions(exported: ExportedProgram) -> bool:
    """Spell out the conversion and broadcast of every ``dst.copy_(src)``
    whose ``src`` has another dtype or shape than ``dst`` (in place): the
    source becomes ``src.to(dst.dtype).expand(dst.shape)``, what eager's
    ``copy_`` computes.  torch's functionalization treats a same-shape
    ``copy_`` as "the new value is ``src``" whatever the dtypes, and a
    broadcasting one as ``src`` unexpanded, so the mutation's new value
    (and every read of ``dst`` after it: ``return self.buf``) would carry
    ``src``'s dtype or shape (pinned by
    ``test_runtime_transaction.py::test_functionalization_drops_copy_conversions_upstream``).
    Returns whether it changed the graph."""
    graph = exported.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.copy_.default or len(node.args) < 2:
            continue
        destination, source = node.args[0], node.args[1]
        if not isinstance(destination, torch.fx.Node) or not isinstance(source, torch.fx.Node):
            continue
        wanted, given = destination.meta.get("val"), source.meta.get("val")
        if not isinstance(wanted, torch.Tensor) or not isinstance(given, torch.Tensor):
            continue
        value = source
        with graph.inserting_before(node):
            if given.dtype != wanted.dtype:
                value = graph.call_function(torch.ops.aten._to_copy.default, (value,), {"dtype": wanted.dtype})
                value.meta = dict(source.meta)
                given = value.meta["val"] = given.to(wanted.dtype)
            if tuple(given.shape) != tuple(wanted.shape):
                expanded = graph.call_function(torch.ops.aten.expand.default, (value, list(wanted.shape)))
                expanded.meta = dict(source.meta)
                expanded.meta["val"] = given.expand(wanted.shape)
                value = expanded
        if value is not source:
            node.args = (destination, value, *node.args[2:])
            changed = True
    if changed:
        exported.graph_module.recompile()
    return changed


def _strided_copies_to_clones(graph: torch.fx.Graph) -> None:
    """Replace every ``prims.copy_strided(x, strides)`` by ``aten.clone(x)``,
    in place.  torch's decompositions emit it to give a result eager's
    strides (AdamW's ``exp_avg.lerp_(grad, ...)`` on the gradient of a
    depthwise conv weight, ``[16, 1, 7, 7]``, in ConvNeXt's training step
    before the capture decomposed grouped ``convolution_backward``);
    torch-mlir does not know the op, and in its value semantics, where
    tensors have no strides, the copy is a clone: same values.  (A new
    result comes back row-major either way: README, "Known limits".)"""
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.prims.copy_strided.default:
            node.target = torch.ops.aten.clone.default
            node.args = (node.args[0],)
            node.kwargs = {}


def _clamp_slice_bounds(graph: torch.fx.Graph) -> None:
    """Rewrite every ``slice``/``slice_scatter`` to explicit, in-range
    ``start``/``end`` as torch computes them (negative counted from the end,
    then clamped to ``[0, size]``).  ``x[1:]`` exports ``end`` as INT64_MAX,
    and torch-mlir's StableHLO lowering of ``slice_scatter`` sizes by it:
    ``std::bad_alloc`` or unbounded allocation at compile time."""
    for node in graph.nodes:
        dim_position = _SLICE_OPS.get(node.target) if node.op == "call_function" else None
        if dim_position is None:
            continue
        base = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(base, torch.Tensor) or base.dim() == 0:
            continue
        names = ("dim", "start", "end", "step")
        values: list[Any] = [0, None, None, 1]
        for offset, name in enumerate(names):
            position = dim_position + offset
            if position < len(node.args):
                values[offset] = node.args[position]
            elif name in node.kwargs:
                values[offset] = node.kwargs[name]
        dim, start, end, step = values
        if not all(isinstance(v, int) or v is None for v in (dim, start, end, step)):
            continue  # symbolic bounds: leave them to the lowering
        dim = dim % base.dim()
        size = base.shape[dim]
        if not isinstance(size, int):
            continue
        start = _clamp_index(0 if start is None else start, size)
        end = max(start, _clamp_index(size if end is None else end, size))
        node.args = (*node.args[:dim_position], dim, start, end, 1 if step is None else step)
        node.kwargs = {}


def _clamp_index(index: int, size: int) -> int:
    if index < 0:
        index += size
    return min(max(index, 0), size)


def _annotate(module: ir.Module, signature: ProgramSignature) -> None:
    with module.context:
        main = find_main(module)
        set_arg_attr_dicts(
            main, [
                ArgRecord(kind=a.kind, name=a.name, index_ranges=signature.index_ranges.get(a.index, ())).to_attrs({})
                for a in signature.arguments
            ]
        )
        set_result_attr_dicts(main, [result.record.to_attrs({}) for result in signature.results])
        if signature.static_inputs:
            # Static values are part of the program's identity (cache key).
            main.attributes[A.STATIC_INPUTS] = ir.DictAttr.get(
                {f"leaf{leaf}": ir.StringAttr.get(repr(value)) for leaf, value in signature.static_inputs.items()}
            )


def _lower(
    module: ir.Module, pipeline: str, target: str, locate: Callable[[str, bool], str | None]
) -> None:
    # The module as it was, for the repro of a failure: a copy, printed
    # only when the pipeline fails (printing it with locations every time
    # cost ~18 ms of GPT-2's compile; the copy ~1 ms).
    before = module.operation.clone()
    with module.context:
        module.context.emit_error_diagnostics = False
        try:
            # The leased context's pass manager of an earlier compile, if any
            # (hloalias/mlir.py): it skips the set-up of each pass.  Verified
            # once, after the last pass (hloalias/pass_runs.py): MLIR's
            # verifier after each pass cost about as much as the passes.
            run_verifying_result(lowering_pass_manager(pipeline, module.context), module.operation)
        except ir.MLIRError as error:
            drop_pass_manager(pipeline, module.context)
            path = write_repro(print_module(before, debug_info=True), "import")
            # The op the conversion reported is the culprit; the module's
            # first unconverted op is only a guess (a failed conversion
            # leaves every op unconverted: DeepSeek-V2's complex rotary
            # `mul` was reported as the embedding at the model's top).
            failed = _failed_op(error)
            culprit, on_complex = failed if failed is not None else (_unlowered_op(module), False)
            if culprit is not None:
                where = locate(culprit.removeprefix("torch.aten."), on_complex)
                headline = (
                    f"torch-mlir cannot lower {culprit.removeprefix('torch.')}"
                    + (" on complex values" if on_complex else "")
                    + f" to the {target}"
                    + (f" (from {where})" if where else "")
                )
            else:
                headline = f"lowering to the {target} failed"
            raise TorchImportError(
                f"{headline}\n{format_diagnostics(error)}\n"
                f"repro written to {path}; replay with:\n"
                f"  torch-mlir-opt --pass-pipeline='{pipeline}' {path}",
                repro_path=path,
            ) from None
        finally:
            before.erase()


_FAILED_OP_RE = re.compile(r"failed to legalize operation '((?:torch\.aten|torch\.prims)\.[\w.]+)'")
_CURRENT_OP_RE = re.compile(r'see current operation: [^"]*"((?:torch\.aten|torch\.prims)\.[\w.]+)"(.*)')


def _failed_op(error: ir.MLIRError) -> tuple[str, bool] | None:
    """The torch op a conversion's diagnostics name ("failed to legalize
    operation 'torch.aten.mul.Scalar'", or the op of a "see current
    operation" note), and whether its operands or results are complex (the
    op then lowers on real values, and the source line is searched among
    complex-valued calls)."""
    for diagnostic in error.error_diagnostics:
        texts = [diagnostic.message, *(note.message for note in diagnostic.notes)]
        for text in texts:
            current = _CURRENT_OP_RE.search(text)
            if current is not None:
                return current[1], "complex<" in current[2]
        for text in texts:
            failed = _FAILED_OP_RE.search(text)
            if failed is not None:
                return failed[1], "complex<" in text
    return None


def _unlowered_op(module: ir.Module) -> str | None:
    """The op a failed lowering most likely stopped at: the first
    ``torch.operator`` (an op torch-mlir does not know at all, which no
    pattern can lower; its name is an attribute), else the first torch op
    a failed partial conversion left behind.  (A failed conversion leaves
    every op of the function unconverted, so the first ``torch.aten`` op is
    often one that lowers fine: ``embedding`` was named for a
    ``silu_backward`` at the end of a training step.)"""
    first_aten: str | None = None
    for op in walk_ops(module.operation):
        if op.name == "torch.operator" and "name" in op.attributes:
            return str(ir.StringAttr(op.attributes["name"]).value)
        if first_aten is None and (op.name.startswith("torch.aten.") or op.name.startswith("torch.prims.")):
            first_aten = str(op.name)
    return first_aten


def _source_line(
    f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], aten_name: str, on_complex: bool = False
) -> str | None:
    """Best effort: the user's source line of the first ``aten_name`` call
    (an overload, ``mul.Scalar``, matches any ``mul``: torch-mlir's overload
    need not be the exported one), with ``on_complex`` the first whose
    result or a tensor operand is complex.  Only strict export records
    stack traces, so it is re-run here, on the failure path alone."""
    aten_name = aten_name.split(".")[0]
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
            if name == aten_name and trace and (not on_complex or _touches_complex(node)):
                where = innermost_in_stack_trace(trace)
                if where is not None:
                    return where
    return None


def _touches_complex(node: torch.fx.Node) -> bool:
    values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in values)
