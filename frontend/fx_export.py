"""The decomposed ``ExportedProgram`` of a module from one ``make_fx``
trace, without ``torch.export``'s machinery.

:func:`exported_from_trace` traces ``module(*args, **kwargs)`` once with
``make_fx`` (fake tensors, functionalized as ``torch.export``
functionalizes, under ``torch.no_grad()`` as its post-dispatch export
traces, with the importer's decomposition table: Python decompositions in
``make_fx``'s table, the composite-implicit ones through
:func:`hloalias.frontend.torch_internals.cia_override`) and builds from
what the trace recorded the program ``torch.export`` followed by
``run_decompositions`` gives for the same call: parameters, buffers
(non-persistent ones among the constants), user inputs (non-tensor values
as constants of the signature), user outputs (non-tensor outputs as
constants), the placeholder names ``torch.export`` gives
(``placeholder_naming_pass``), the call's input and output trees, and
node metadata (``val``, ``stack_trace`` from the module's ``forward``
frames).  ``torch.export`` spends most of a small program's trace in its
own machinery (a metadata trace before the real one, guards, verifier
passes); this route runs the model once.

It answers only for the programs whose signature the trace can tell
without ``torch.export``; otherwise it returns None and the caller
exports (same program, same errors):

- inputs and outputs are trees of tuples, lists and dicts (and
  ``ModelOutput``-like dicts) whose leaves are tensors or ``bool``,
  ``int``, ``float``, ``str``, ``None``; dense tensors only;
- no input or state tensor is written in place, its metadata changed or
  its storage replaced (checked on the functional tensors after the
  trace): the program has no mutation outputs;
- no two state tensors share memory (tied weights: export's lifting and
  :func:`hloalias.frontend.importer._merge_aliased_state` decide those);
- the graph reads no tensor constant (a tensor attribute that is neither
  parameter nor buffer, or a tensor made in ``forward``: export lifts
  those), calls no dropout and draws no random numbers (export keeps
  ``aten.dropout`` for the table, which this trace decomposes by its
  composite kernel) and the trace raises nothing (data-dependent control flow and
  the like are refused by ``torch.export`` with its message).

``test/py/test_fx_export.py`` compares the program with
``torch.export`` + ``run_decompositions`` (graph, signature, names, trees,
state) across the kinds above."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from hloalias.frontend import torch_internals

_PRIMITIVES = (bool, int, float, str, type(None))


class _NotPlain(Exception):
    """Raised inside the trace: the program needs ``torch.export``."""


def _plain_tree(tree: Any, traced: bool = False) -> bool:
    """Whether ``tree`` is tuples, lists and dicts of tensors and
    primitives (``torch.export`` flattens the same; objects such as caches
    and dataclasses are left to it)."""
    if isinstance(tree, torch.Tensor):
        return traced or (tree.layout == torch.strided and type(tree) in (torch.Tensor, torch.nn.Parameter))
    if isinstance(tree, _PRIMITIVES):
        return True
    if type(tree) in (tuple, list):
        return all(_plain_tree(item, traced) for item in tree)
    if isinstance(tree, dict) and (type(tree) is dict or type(tree) in pytree.SUPPORTED_NODES):
        return all(isinstance(key, str) for key in tree) and all(_plain_tree(item, traced) for item in tree.values())
    return False


def _state_shares_memory(tensors: list[torch.Tensor]) -> bool:
    from torch.multiprocessing.reductions import StorageWeakRef

    seen: set[StorageWeakRef] = set()
    for tensor in tensors:
        if tensor.numel() == 0:
            continue
        reference = StorageWeakRef(tensor.untyped_storage())
        if reference in seen:
            return True
        seen.add(reference)
    return False


def _non_persistent_buffers(module: torch.nn.Module) -> set[str]:
    names: set[str] = set()
    for prefix, submodule in module.named_modules(remove_duplicate=False):
        names.update(f"{prefix}.{name}" if prefix else name for name in submodule._non_persistent_buffers_set)
    return names


def _mutated(functional: torch.Tensor) -> bool:
    inner = functional.elem  # type: ignore[attr-defined]
    torch._sync(functional)  # type: ignore[attr-defined, no-untyped-call]
    return bool(
        torch._functionalize_has_data_mutation(inner)  # type: ignore[attr-defined]
        or torch._functionalize_has_metadata_mutation(inner)
        or torch._functionalize_was_storage_changed(inner)
    )


class _NoDropout(torch.overrides.TorchFunctionMode):
    """Stops the trace at a dropout call: export's functionalization keeps
    ``aten.dropout`` for the decomposition table (a ``clone`` in eval
    mode), where this trace takes its composite kernel (the input itself)."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if "dropout" in getattr(func, "__name__", ""):
            raise _NotPlain("dropout")
        return func(*args, **(kwargs or {}))


def _random(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def exported_from_trace(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    table: dict[Any, Callable[..., Any]],
) -> ExportedProgram | None:
    """The decomposed program of ``module`` on ``args``/``kwargs`` from one
    ``make_fx`` trace, or None where ``torch.export`` must decide (module
    docstring).  Never raises for a program it does not take."""
    private = torch_internals._private()
    if private is None or not _plain_tree((args, kwargs)):
        return None
    parameters = dict(module.named_parameters(remove_duplicate=False))
    buffers = dict(module.named_buffers(remove_duplicate=False))
    if not _plain_tree(list(parameters.values()) + list(buffers.values())):
        return None
    if _state_shares_memory([*parameters.values(), *buffers.values()]):
        return None
    try:
        traced = _trace(module, args, kwargs, parameters, buffers, table)
    except Exception:  # _NotPlain, or anything the trace raised: export names it
        return None
    if traced is None:
        return None
    graph_module, out_spec = traced
    try:
        return _program(module, args, kwargs, parameters, buffers, graph_module, out_spec)
    except _NotPlain:
        return None


def _trace(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    parameters: dict[str, torch.nn.Parameter],
    buffers: dict[str, torch.Tensor],
    table: dict[Any, Callable[..., Any]],
) -> tuple[torch.fx.GraphModule, Any] | None:
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.utils.stateless import _reparametrize_module

    flat_inputs, in_spec = pytree.tree_flatten((args, kwargs))
    names = [*parameters, *buffers]
    state_count = len(names)
    out_specs: list[Any] = []

    def flat_forward(*flat: Any) -> tuple[Any, ...]:
        call_args, call_kwargs = pytree.tree_unflatten(list(flat[state_count:]), in_spec)
        state = dict(zip(names, flat[:state_count]))
        with _reparametrize_module(module, state, tie_weights=True, strict=True, stack_weights=True), _NoDropout():
            result = module(*call_args, **call_kwargs)
        if not _plain_tree(result, traced=True):
            raise _NotPlain("output")
        leaves, spec = pytree.tree_flatten(result)
        out_specs.append(spec)
        return tuple(leaves)

    def functional(*flat: Any) -> tuple[Any, ...]:
        disable_above = torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
        )
        mode = FunctionalTensorMode(pre_dispatch=False, export=True, _allow_token_discovery=True)
        with disable_above, mode:
            wrapped = [FunctionalTensor.to_functional(t) if isinstance(t, torch.Tensor) else t for t in flat]
            outputs = flat_forward(*wrapped)
            if any(_mutated(t) for t in wrapped if isinstance(t, FunctionalTensor)):
                raise _NotPlain("mutation")
            unwrapped = []
            for value in outputs:
                if isinstance(value, FunctionalTensor):
                    torch._sync(value)  # type: ignore[attr-defined, no-untyped-call]
                    value = torch._from_functional_tensor(value.elem)
                unwrapped.append(value)
            return tuple(unwrapped)

    private = torch_internals._private()
    assert private is not None
    cia_to_decomp, python_table = torch_internals.split_decomposition_table(table)
    flat = [*parameters.values(), *buffers.values(), *flat_inputs]
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch_internals.cia_override(cia_to_decomp))
        # The override's kernels are Python kernels: only the Python
        # dispatcher runs them (make_fx enables it for symbolic and
        # pre-dispatch traces only; export's trace runs under it).
        stack.enter_context(enable_python_dispatcher())
        stack.enter_context(torch_internals.lazy_graph_modules())
        stack.enter_context(torch.no_grad())
        # What torch.export's post-dispatch trace runs under: backend
        # kernels' own decompositions off, torch.compiler.is_exporting()
        # true (models branch on it: transformers' is_tracing).
        stack.enter_context(private["_ignore_backend_decomps"]())
        stack.enter_context(private["_compiling_state_context"]())
        graph_module = make_fx(
            functional,
            decomposition_table=dict(python_table),
            tracing_mode="fake",
            record_stack_traces=True,
            _allow_non_fake_inputs=True,
        )(*flat)
    if len(out_specs) != 1:
        return None
    return graph_module, out_specs[0]


def _program(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    parameters: dict[str, torch.nn.Parameter],
    buffers: dict[str, torch.Tensor],
    graph_module: torch.fx.GraphModule,
    out_spec: Any,
) -> ExportedProgram:
    from torch._export.utils import placeholder_naming_pass
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
    from torch.export.graph_signature import (
        ConstantArgument, ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument,
    )

    graph = graph_module.graph
    for node in list(graph.nodes):  # export-mode functionalization's checks of .to(): not in export's graph
        if node.target is torch.ops.aten._assert_tensor_metadata.default and not node.users:
            graph.erase_node(node)
    graph.eliminate_dead_code()  # as AOT autograd does for export's graph
    if any(node.op == "get_attr" for node in graph.nodes):
        raise _NotPlain("tensor constant")  # export lifts it (and names it)
    if any(_random(node) for node in graph.nodes):
        raise _NotPlain("random op")  # export keeps native_dropout where this trace decomposes it
    flat_inputs, in_spec = pytree.tree_flatten((args, kwargs))
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    if len(placeholders) != len(parameters) + len(buffers) + len(flat_inputs):
        raise _NotPlain("placeholders")
    non_persistent = _non_persistent_buffers(module)
    input_specs: list[InputSpec] = []
    for node, name in zip(placeholders, parameters):
        input_specs.append(InputSpec(InputKind.PARAMETER, TensorArgument(node.name), name))
    for node, name in zip(placeholders[len(parameters):], buffers):
        input_specs.append(
            InputSpec(InputKind.BUFFER, TensorArgument(node.name), name, persistent=name not in non_persistent)
        )
    for node, value in zip(placeholders[len(parameters) + len(buffers):], flat_inputs):
        if isinstance(value, torch.Tensor):
            argument: Any = TensorArgument(node.name)
        else:
            node.meta["val"] = value
            argument = ConstantArgument(node.name, value)
        input_specs.append(InputSpec(InputKind.USER_INPUT, argument, None))
    for node in placeholders:
        node.meta.pop("stack_trace", None)
        node.meta.pop("nn_module_stack", None)
        if "val" not in node.meta:
            raise _NotPlain("placeholder without a value")
    output = next(node for node in graph.nodes if node.op == "output")
    output_specs: list[OutputSpec] = []
    for value in output.args[0]:
        if isinstance(value, torch.fx.Node):
            if not isinstance(value.meta.get("val"), torch.Tensor):
                raise _NotPlain("non-tensor output node")
            output_specs.append(OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(value.name), None))
        elif isinstance(value, _PRIMITIVES):
            output_specs.append(OutputSpec(OutputKind.USER_OUTPUT, ConstantArgument("", value), None))
        else:
            raise _NotPlain("output")
    output.meta.pop("stack_trace", None)
    # A plain graph: the flat inputs and outputs are the program's.
    graph._codegen = torch.fx.graph.CodeGen()
    signature = ExportGraphSignature(input_specs, output_specs)
    constants: dict[str, Any] = {name: buffers[name] for name in buffers if name in non_persistent}
    placeholder_naming_pass(
        graph_module, signature, module, args, kwargs, {**parameters, **buffers}, constants
    )
    graph_module.recompile()
    state_dict = {name: tensor for name, tensor in {**parameters, **buffers}.items() if name not in non_persistent}
    call = ModuleCallSignature(
        inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec,
        forward_arg_names=_forward_arg_names(module, args, kwargs),
    )
    exported = ExportedProgram(
        root=graph_module,
        graph=graph,
        graph_signature=signature,
        state_dict=state_dict,
        range_constraints={},
        module_call_graph=[ModuleCallEntry("", call)],
        example_inputs=(args, kwargs),
        constants=constants,
    )
    return exported


def _forward_arg_names(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str] | None:
    try:
        from torch.export._trace import _get_forward_arg_names

        names: list[str] = _get_forward_arg_names(module, args, kwargs)
        return names
    except Exception:  # names are informational
        return None
