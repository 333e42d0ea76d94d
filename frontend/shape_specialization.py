"""One export, many shapes: a program exported once with dynamic
dimensions, specialized to each call signature's sizes.

:func:`export_dynamic` traces the program once with the named dimensions
of the user's tensor inputs dynamic (``Dim.DYNAMIC``: torch keeps each one
symbolic unless the model's code fixes it) and the importer's
decompositions: one symbolic ``make_fx`` trace where it can tell the
program (:func:`hloalias.frontend.fx_export.exported_from_trace` with
``dynamic_dims``, the programs the importer's single trace takes:
:mod:`hloalias.frontend.single_trace`), else ``torch.export`` and the
decomposition retrace.  :func:`import_specialized` turns that decomposed,
symbolic program into the static program ``torch.export`` would give for
concrete inputs, without tracing the model again: every shape computation
of the graph (``sym_size`` and the integer arithmetic on it, the range
asserts) is evaluated for the inputs' sizes and replaced by its value, and
every op's result type is derived again by running the op on fake tensors
of the concrete shapes (once per operator and arguments' metadata: a
repeat, such as the same op of a transformer's next layer, is rebuilt from
the first result, ``_Results``; outside torch's process-wide fake-tensor
cache, which a specialization leaves as it was); the importer then continues from the decomposed
program (:func:`hloalias.frontend.importer._import_decomposed`: FX import,
lowering to StableHLO).  What depends on shapes runs again; the trace and
the decomposition retrace do not.

The graph holds one path through the model's code: where that code (or a
decomposition) branched on a symbolic size (``if x.shape[1] % 2 == 0``,
``if n > 8``, ``if x.shape[0] == x.shape[1]``), torch took the example's
branch and recorded the condition as a guard of the export's shape
environment, not in the graph.  :func:`export_dynamic` keeps every such
guard (:attr:`DynamicExport.guards`) and :func:`specialize` evaluates each
one for the new sizes: sizes for which one is false took another path
through the code, and the graph is not their program.

Not specializable, :class:`NotSpecializable` (the caller exports the
concrete shapes as usual): a dimension torch specialized while exporting
(the model's code depends on its value: the placeholder holds a number) or
a size outside the range export inferred; a guard of the trace that is
false for the sizes; a range assert of the graph that fails for the
sizes; a graph with higher-order ops or submodules; non-tensor or
non-contiguous inputs; a program that returns a size (a sliding-window
cache's length); and programs whose import rewrites
the graph before decomposing it with shapes as literals (``copy_`` conversions, ``as_strided`` inputs)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx.node import map_aggregate
from torch.fx.passes.shape_prop import _extract_tensor_metadata
from torch._subclasses.fake_tensor import FakeTensorMode, disable_fake_tensor_cache

from hloalias.errors import TorchImportError
from hloalias.frontend.carried_objects import CarriedObjects
from hloalias.frontend import importer
from hloalias.frontend.tracing_lock import tracing


class NotSpecializable(TorchImportError):
    """The program cannot be exported once for many shapes, or not
    specialized to these inputs' sizes; the message says why."""


@dataclasses.dataclass(frozen=True)
class DynamicExport:
    """A decomposed program with symbolic dimensions, and what the importer
    read from its graph before decomposing (see
    :func:`hloalias.frontend.importer._import_decomposed`)."""

    exported: ExportedProgram
    state_aliases: dict[str, str]
    eager_storage: list[str | None] | None
    #: per user input leaf, the dimensions exported as dynamic
    dynamic_dims: tuple[frozenset[int], ...]
    #: input objects the program returns as themselves (frontend/carried_objects.py)
    carried_objects: CarriedObjects = ()
    #: the conditions on the size symbols that the trace (the one symbolic
    #: trace, or export and the decomposition retrace) took as true: sympy booleans over the symbols
    #: of the user inputs' shapes (module docstring)
    guards: tuple[Any, ...] = ()
    #: the outputs that are sizes, not tensors (:func:`_returned_sizes`):
    #: no size is specializable then, known from the export alone
    returned_sizes: tuple[str, ...] = ()


_SHAPE_VALUES = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)
_ASSERTS = {
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
}


def export_dynamic(
    f: torch.nn.Module,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    dynamic_dims: Sequence[frozenset[int]],
    *,
    refuse_returned_sizes: bool = False,
) -> DynamicExport:
    """Export ``f`` on ``(args, kwargs)`` with ``dynamic_dims[i]`` of the
    ``i``-th tensor leaf dynamic, and decompose it; raises
    :class:`NotSpecializable` where the result could not be specialized
    soundly later (module docstring), :class:`TorchImportError` where
    export fails.  A program that returns sizes is never specializable
    (:attr:`DynamicExport.returned_sizes`); ``refuse_returned_sizes``
    refuses it from the export, before the decomposition retrace (the
    signature, and so which outputs are sizes, is the export's)."""
    with tracing():
        return _export_dynamic(f, tuple(args), dict(kwargs), tuple(dynamic_dims), refuse_returned_sizes)


def _export_dynamic(
    f: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic_dims: tuple[frozenset[int], ...],
    refuse_returned_sizes: bool,
) -> DynamicExport:
    _check_inputs(args, kwargs)
    leaves = pytree.tree_leaves((args, kwargs))
    if len(leaves) != len(dynamic_dims):
        raise NotSpecializable(f"{len(dynamic_dims)} dynamic-dimension sets for {len(leaves)} inputs")
    shapes = torch.export.ShapesCollection()  # type: ignore[no-untyped-call]
    for leaf, dims in zip(leaves, dynamic_dims):
        if any(leaf.shape[d] < 2 for d in dims):  # export specializes sizes 0 and 1
            raise NotSpecializable("a dynamic dimension has size 0 or 1 in the example")
        shapes[leaf] = {d: torch.export.Dim.DYNAMIC for d in dims}
    importer._check_strided_inputs(args, kwargs)
    single = importer._export_decomposed(f, args, kwargs, dynamic_dims=dynamic_dims)
    if single is not None:
        return _from_single_trace(single, dynamic_dims)
    exported = importer._export(f, args, kwargs, shapes.dynamic_shapes(f, args, kwargs))  # type: ignore[no-untyped-call]
    returned = _returned_sizes(exported)
    if returned and refuse_returned_sizes:
        raise NotSpecializable(f"the program returns sizes ({', '.join(returned)})")
    carried = importer.carried_objects_of(exported)
    importer._check_strided_outputs(exported)
    exported, state_aliases = importer._merge_aliased_state(exported, owned=True)
    if importer.writes_through_unfold(exported.graph_module.graph):
        # Whether the windows cover their dimension depends on its size.
        raise NotSpecializable("the program writes through an unfold view")
    importer._masked_fill_in_place_keeps_layout(exported)
    importer._pin_eager_copies(exported)
    # This rewrite writes shapes into the graph as literals: a program
    # that needs it is exported per shape.
    if importer._explicit_copy_conversions(exported):
        raise NotSpecializable("the program has copy_ with a conversion or broadcast")
    eager_storage = importer._eager_output_storage(exported)
    if importer._strided_inputs(exported):
        raise NotSpecializable("the program addresses an input through as_strided")
    try:
        exported = importer.decompose(exported, importer._decomposition_table_with_custom_ops())
    except Exception as error:  # torch raises many types here
        raise NotSpecializable(f"decomposing the dynamic program failed: {error}") from error
    if importer._strided_inputs(exported):
        raise NotSpecializable("the program addresses an input through as_strided")
    # After the decomposition: its retrace shares the export's shape
    # environment, and a decomposition may branch on sizes too.
    guards = _trace_guards(exported)
    return DynamicExport(
        exported, state_aliases, eager_storage, dynamic_dims, carried, guards, tuple(_returned_sizes(exported))
    )


def _from_single_trace(exported: ExportedProgram, dynamic_dims: tuple[frozenset[int], ...]) -> DynamicExport:
    """The dynamic export from one symbolic ``make_fx`` trace, decomposed
    (:func:`hloalias.frontend.importer._export_decomposed` with
    ``dynamic_dims``): the importer reads what it reads from a static
    single trace (``_import_torch``: no eager storages, no training-IR
    rewrites: the trace declined programs that need them).  Its guards are
    the trace's shape environment's, as for the two traces; it returns no
    size (the trace declined non-tensor outputs)."""
    carried = importer.carried_objects_of(exported)
    importer._check_strided_outputs(exported)
    exported, state_aliases = importer._merge_aliased_state(exported, owned=True)
    guards = _trace_guards(exported)
    return DynamicExport(
        exported, state_aliases, None, dynamic_dims, carried, guards, tuple(_returned_sizes(exported))
    )


def _returned_sizes(exported: ExportedProgram) -> list[str]:
    """The outputs of ``exported`` that are shape values (a sliding-window
    cache's length), not tensors: :func:`specialize` evaluates such a node
    to a number, and the signature names a symbolic output there."""
    output = exported.graph_module.graph.output_node()
    return [
        value.name for value in pytree.tree_leaves(output.args[0])
        if isinstance(value, torch.fx.Node) and value.op == "call_function"
        and isinstance(value.meta.get("val"), _SHAPE_VALUES) and not isinstance(value.meta.get("val"), torch.Tensor)
    ]


def _input_symbols(exported: ExportedProgram) -> tuple[Any, set[Any]]:
    """The shape environment of ``exported``'s symbolic input sizes (None
    when every size is static) and the size symbols of its user inputs."""
    user_inputs = set(exported.graph_signature.user_inputs)
    shape_env = None
    symbols: set[Any] = set()
    for node in exported.graph.nodes:
        value = node.meta.get("val")
        if node.op != "placeholder" or node.name not in user_inputs or not isinstance(value, torch.Tensor):
            continue
        for size in value.shape:
            if isinstance(size, torch.SymInt):
                shape_env = size.node.shape_env
                symbols |= size.node.expr.free_symbols
    return shape_env, symbols


def _trace_guards(exported: ExportedProgram) -> tuple[Any, ...]:
    """Every condition on the input sizes the trace of ``exported`` relied
    on: the guards of its shape environment (a branch of the model's code
    on a size, a size equal or unequal to another) and its deferred runtime
    asserts over input sizes (``torch._check``), with the environment's
    replacements applied (a dimension found equal to another is that one's
    symbol).  Not simplified: the environment's axioms are these guards,
    under which each one simplifies to true.  A guard over a symbol that is
    not an input size cannot be checked for new inputs: refused."""
    # Loaded with the tracing machinery (test_lazy_imports.py), not by the runtime.
    import sympy  # type: ignore[import-untyped]

    shape_env, symbols = _input_symbols(exported)
    if shape_env is None:
        return ()
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    conditions = [shape_env.replace(guard.expr) for guard in shape_env.guards]
    for asserts in shape_env.deferred_runtime_asserts.values():
        # Asserts over unbacked symbols (data-dependent sizes) are nodes of
        # the graph, checked by specialize with the graph's own values.
        conditions += [
            condition for condition in (shape_env.replace(ra.expr) for ra in asserts)
            if not free_unbacked_symbols(condition)
        ]
    guards = []
    for condition in conditions:
        if condition is sympy.true:
            continue
        unknown = condition.free_symbols - symbols
        if unknown:
            raise NotSpecializable(
                f"the trace depends on {condition}, over {sorted(map(str, unknown))}, which are not input sizes"
            )
        guards.append(condition)
    return tuple(dict.fromkeys(guards))


def _check_guards(guards: tuple[Any, ...], bindings: dict[Any, int]) -> None:
    """Raise :class:`NotSpecializable` unless every guard holds for the
    sizes ``bindings`` gives the symbols."""
    import sympy

    for guard in guards:
        unbound = [symbol for symbol in guard.free_symbols if symbol not in bindings]
        if unbound:
            raise NotSpecializable(f"the trace's guard {guard} is over {unbound}, which no input's size gives")
        value = guard.xreplace({symbol: sympy.Integer(bindings[symbol]) for symbol in guard.free_symbols})
        if value is sympy.true:
            continue
        sizes = ", ".join(f"{symbol}={bindings[symbol]}" for symbol in sorted(guard.free_symbols, key=str))
        if value is sympy.false:
            raise NotSpecializable(
                f"the trace relied on {guard} (a branch or check of the code on sizes), which is false "
                f"for {sizes}: another path through the code"
            )
        raise NotSpecializable(f"the trace's guard {guard} does not evaluate for {sizes} (it gives {value})")


def import_specialized(
    dynamic: DynamicExport, f: Any, args: Sequence[Any], kwargs: dict[str, Any], stage: importer.Stage
) -> importer.Program:
    """The program ``import_torch(f, args, kwargs)`` gives, from ``dynamic``
    specialized to the inputs' sizes (module docstring); raises
    :class:`NotSpecializable` when they do not fit it."""
    with tracing():
        exported = specialize(dynamic, tuple(args), dict(kwargs))
        program = importer._import_decomposed(
            f, tuple(args), dict(kwargs), exported, dynamic.state_aliases, dynamic.eager_storage, {}, stage
        )
        return importer.with_carried_objects(program, dynamic.carried_objects)


def _check_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    leaves = pytree.tree_leaves((args, kwargs))
    for position, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            raise NotSpecializable(f"input {position} is a {type(leaf).__name__}, not a tensor")
        if leaf.layout != torch.strided or not leaf.is_contiguous():
            raise NotSpecializable(f"input {position} is not a contiguous dense tensor")


def specialize(dynamic: DynamicExport, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ExportedProgram:
    """``dynamic.exported`` with every dimension fixed to the inputs' sizes
    (see the module docstring): a new graph, the program's signature,
    state and constants shared.

    Runs with torch functions' overrides off: no user code runs here, only
    the graph's aten ops on fake tensors, and a torch function mode around
    the compile (``compile``'s refusal of training calls while it exports,
    runtime/executable.py, or the caller's own) would be entered for every
    op and size query of the propagation, for nothing.  Torch dispatch (the
    fake mode) is unaffected."""
    with torch._C.DisableTorchFunction():
        return _specialize(dynamic, args, kwargs)


def _specialize(dynamic: DynamicExport, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ExportedProgram:
    _check_inputs(args, kwargs)
    exported = dynamic.exported
    leaves = pytree.tree_leaves((args, kwargs))
    graph = exported.graph_module.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    user_names = list(exported.graph_signature.user_inputs)
    if len(user_names) != len(leaves):
        raise NotSpecializable(f"the program takes {len(user_names)} inputs, not {len(leaves)}")
    concrete = dict(zip(user_names, leaves))
    bindings = _bind_symbols(placeholders, concrete)
    for symbol, value_range in exported.range_constraints.items():
        size = bindings.get(symbol)
        if size is not None and not bool(value_range.lower <= size <= value_range.upper):
            raise NotSpecializable(f"size {size} is outside the range {value_range} export inferred")
    _check_guards(dynamic.guards, bindings)
    fake_mode = FakeTensorMode()
    results = _Results(fake_mode)
    new_graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}  # old node -> new node, or a shape value
    values: dict[torch.fx.Node, Any] = {}  # old node -> fake tensor / concrete value

    def new_arg(argument: Any) -> Any:
        return env[argument] if isinstance(argument, torch.fx.Node) else argument

    def value_of(argument: Any) -> Any:
        return values[argument] if isinstance(argument, torch.fx.Node) else argument

    # One entry into the fake mode for the whole graph (each entry and exit
    # costs about what a cached op does); a shape computation's ops (sizes
    # of fake tensors, integer arithmetic) give the same values in it.
    # Without torch's fake-tensor cache (process-wide, FakeTensorMode.cache):
    # an op this dispatches is the first of its metadata in the graph for
    # these sizes (repeats are _Results'), so its lookup is mostly a miss
    # (141 of 197 for a 4-layer Llama at a new length; the hits are ops
    # whose metadata does not depend on the length), and keying the
    # arguments and building the entry cost about a fifth of the
    # propagation (bench/RESULTS-latency.md, "lenpath"); the entries would
    # serve no later length, only grow the cache by each one.  The results
    # are the meta kernels' either way (a hit replays one).
    with fake_mode, disable_fake_tensor_cache(fake_mode):
        for node in graph.nodes:
            old = node.meta.get("val")
            if node.op == "placeholder":
                source = concrete.get(node.name)
                if not isinstance(old, torch.Tensor):
                    raise NotSpecializable(f"input '{node.name}' is not a tensor")
                if source is not None:
                    value = torch.empty_strided(
                        source.shape, source.stride(), dtype=source.dtype, device=source.device
                    )
                else:  # state: static shapes
                    value = torch.empty_strided(
                        [int(s) for s in old.shape], [int(s) for s in old.stride()], dtype=old.dtype,
                        device=old.device,
                    )
                new = new_graph.placeholder(node.name, type_expr=node.type)
                new.name = node.name  # as the signature names it (FX renames builtins: "input")
                env[node], values[node] = new, value
            elif node.op == "call_function":
                target = node.target
                fake_args = map_aggregate(node.args, value_of)
                fake_kwargs = map_aggregate(node.kwargs, value_of)
                if target in _ASSERTS:
                    if target is torch.ops.aten._assert_scalar.default and not bool(fake_args[0]):
                        raise NotSpecializable(f"the program asserts {node.args[1:]!r} for these sizes")
                    continue
                if not isinstance(target, torch._ops.OpOverload) and getattr(target, "__module__", None) not in (
                    "_operator", "operator", "torch", "math", "torch.fx.experimental.sym_node"
                ):
                    raise NotSpecializable(f"the graph calls {target!r}, which is not an operator")
                try:
                    if isinstance(old, _SHAPE_VALUES) and not isinstance(old, torch.Tensor):
                        # A shape computation: its value for these sizes.
                        value = target(*fake_args, **fake_kwargs)
                        env[node], values[node] = value, value
                        continue
                    value = results.value(target, fake_args, fake_kwargs)
                except Exception as error:  # an op's own check of these sizes (torch raises many types)
                    raise NotSpecializable(f"{target} fails for these sizes: {error}") from error
                new = new_graph.create_node(
                    "call_function", target, map_aggregate(node.args, new_arg),
                    map_aggregate(node.kwargs, new_arg), name=node.name,
                )
                new.name = node.name
                env[node], values[node] = new, value
            elif node.op == "output":
                returned_sizes = [
                    value.name for value in pytree.tree_leaves(node.args[0])
                    if isinstance(value, torch.fx.Node) and not isinstance(env[value], torch.fx.Node)
                ]
                if returned_sizes:
                    # The signature names a symbolic output there; a static
                    # export has a constant in its place (a signature of its own).
                    raise NotSpecializable(f"the program returns sizes ({', '.join(returned_sizes)})")
                new_graph.output(map_aggregate(node.args[0], new_arg))
            else:
                raise NotSpecializable(f"the graph has a {node.op} node ({node.target})")
    metadata: dict[Any, Any] = {}  # the tensor metadata of equal tensors is equal
    for node, new in env.items():
        if isinstance(new, torch.fx.Node):
            new.meta = _meta(node, values[node], metadata)
    return _program_of(exported, new_graph, (args, kwargs))


_MISSING = object()
#: Argument values an op's key holds as they are (with their type: ``2`` and
#: ``2.0`` promote differently); any other kind of argument gives no key.
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


@dataclasses.dataclass(frozen=True)
class _Result:
    """What a fake tensor result is made of: its metadata, and the position
    (among the op's tensor arguments) of the one whose storage it views, or
    None for a new storage."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype
    device: torch.device
    view_of: int | None


class _Results:
    """The fake tensors of one specialization's ops, each op computed once
    per (operator, arguments' metadata): the 4 layers of a transformer
    repeat the same ops on tensors of the same metadata.

    What the fake mode computes for an op on fake tensors depends only on
    their metadata (sizes, strides, offsets, dtypes, devices) and the other
    arguments, so a repeat is rebuilt from the first result as the fake
    mode's own dispatch cache rebuilds a hit (``empty_strided`` on the meta
    device, ``set_`` onto the viewed input's storage for a view, wrapped
    as a ``FakeTensor``), without the dispatch: no cache key over the
    arguments, and views (which the fake mode computes in Python,
    ``_view_meta``, uncached) computed once.  Only where that rebuild is
    exact: one strided tensor out, not conjugate or negated, no constant
    (the fake mode's constant propagation) in or out, an op that mutates
    nothing and does not return an input itself, a result that does not
    require grad (a rebuilt one would be a leaf), a new storage exactly as
    large as ``empty_strided`` makes it; anything else dispatches.  The key
    holds each tensor argument's storage size and which earlier argument
    shares its storage, so a repeat sees inputs laid out as the first did."""

    def __init__(self, fake_mode: FakeTensorMode) -> None:
        self.fake_mode = fake_mode
        self.known: dict[Any, _Result | None] = {}

    def value(self, target: Any, args: Any, kwargs: Any) -> Any:
        tensors: list[torch.Tensor] = []
        key = self._key(target, args, kwargs, tensors)
        if key is None:
            return target(*args, **kwargs)
        known = self.known.get(key, _MISSING)
        if known is _MISSING:
            value = target(*args, **kwargs)
            self.known[key] = self._record(value, tensors)
            return value
        if known is None:
            return target(*args, **kwargs)
        assert isinstance(known, _Result)
        return self._rebuild(known, tensors)

    def _key(self, target: Any, args: Any, kwargs: Any, tensors: list[torch.Tensor]) -> Any:
        from torch._subclasses.fake_tensor import FakeTensor

        if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable or any(
            tag in target.tags for tag in (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)
        ):
            return None

        storages: list[int] = []

        def part(value: Any) -> Any:
            if isinstance(value, FakeTensor):
                if (
                    value.fake_mode is not self.fake_mode or value.constant is not None
                    or value.layout != torch.strided or value.is_conj() or value.is_neg()
                ):
                    raise _NoKey
                tensors.append(value)
                storage = value.untyped_storage()
                storages.append(storage._cdata)
                # Which earlier argument's storage it shares: a repeat then
                # views the argument the first result viewed.
                shared = storages.index(storage._cdata)
                return (torch.Tensor, tuple(value.shape), value.stride(), value.storage_offset(), value.dtype,
                        value.device, value.requires_grad, storage.nbytes(), shared)
            if isinstance(value, (list, tuple)):
                return (type(value), tuple(part(item) for item in value))
            if isinstance(value, _PLAIN):
                return (type(value), value)
            raise _NoKey

        try:
            return (target, part(args), tuple((name, part(value)) for name, value in kwargs.items()))
        except _NoKey:
            return None

    def _record(self, value: Any, tensors: list[torch.Tensor]) -> _Result | None:
        from torch._subclasses.fake_tensor import FakeTensor

        if (
            not isinstance(value, FakeTensor) or value.fake_mode is not self.fake_mode or value.constant is not None
            or value.layout != torch.strided or value.is_conj() or value.is_neg() or value.requires_grad
            or any(value is tensor for tensor in tensors)
        ):
            return None
        storage = value.untyped_storage()
        view_of = next(
            (i for i, tensor in enumerate(tensors) if tensor.untyped_storage()._cdata == storage._cdata), None
        )
        # Concrete sizes (the specialization's fake mode has no shape environment).
        shape, stride = tuple(map(int, value.shape)), tuple(map(int, value.stride()))
        offset = int(value.storage_offset())
        if view_of is None:
            # A new storage: exactly what empty_strided allocates.
            extent = 0 if 0 in shape else 1 + sum((size - 1) * step for size, step in zip(shape, stride))
            if offset != 0 or storage.nbytes() != extent * value.element_size():
                return None
        return _Result(shape, stride, offset, value.dtype, value.device, view_of)

    def _rebuild(self, known: _Result, tensors: list[torch.Tensor]) -> torch.Tensor:
        from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

        with in_kernel_invocation_manager(self.fake_mode):
            empty = torch.empty_strided(known.shape, known.stride, dtype=known.dtype, device="meta")
            if known.view_of is not None:
                empty.set_(tensors[known.view_of].untyped_storage(), known.storage_offset, known.shape, known.stride)
        return FakeTensor(self.fake_mode, empty, known.device)


class _NoKey(Exception):
    """An argument :meth:`_Results._key` cannot key."""


#: The attributes of an ``ExportedProgram`` that :func:`_program_of` sets
#: on its copy; a torch whose ``ExportedProgram`` lacks one of them gets the
#: constructor instead.
_PROGRAM_FIELDS = frozenset(("_graph_module", "_range_constraints", "_example_inputs", "_guards_code"))


def _program_of(
    exported: ExportedProgram, graph: torch.fx.Graph, example_inputs: tuple[tuple[Any, ...], dict[str, Any]]
) -> ExportedProgram:
    """``exported`` with ``graph`` (its specialization: the same nodes,
    names, signature, state and constants, concrete sizes) in a lazily
    compiled GraphModule, without range constraints or guards.

    Not the constructor: it generates the GraphModule's Python code, which
    nothing of the import runs (the importer reads the graph), and every
    ``recompile`` after a rewrite of the graph (``_import_decomposed``)
    would generate it again; a ``_LazyGraphModule`` generates it on first
    use.  The constructor's checks of the graph against the signature were
    made on ``exported``, whose graph this one copies node for node; its
    common-getitem pass ran there too."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    if not _PROGRAM_FIELDS <= vars(exported).keys():
        return ExportedProgram(
            root=exported.graph_module,
            graph=graph,
            graph_signature=exported.graph_signature,
            state_dict=exported.state_dict,
            range_constraints={},
            module_call_graph=exported.module_call_graph,
            example_inputs=example_inputs,
            constants=exported.constants,
        )
    graph._codegen = torch.fx.graph.CodeGen()  # a flat graph, as the constructor makes it
    module = _LazyGraphModule(exported.graph_module, graph)
    module.meta.update(exported.graph_module.meta)
    program = copy.copy(exported)
    program._graph_module = module
    program._range_constraints = {}
    program._example_inputs = example_inputs
    program._guards_code = []  # the guards' code of no shape environment (the constructor's)
    return program


def _bind_symbols(placeholders: list[torch.fx.Node], concrete: dict[str, torch.Tensor]) -> dict[Any, int]:
    """Each size symbol of the user inputs' shapes -> its value in the
    concrete inputs; a static dimension must have the exported size."""
    bindings: dict[Any, int] = {}
    for node in placeholders:
        source = concrete.get(node.name)
        value = node.meta.get("val")
        if source is None or not isinstance(value, torch.Tensor):
            continue
        if value.dim() != source.dim() or value.dtype != source.dtype:
            raise NotSpecializable(f"input '{node.name}' has another rank or dtype than the exported one")
        for dim, (size, wanted) in enumerate(zip(value.shape, source.shape)):
            if isinstance(size, torch.SymInt):
                expression = size.node.expr
                if not expression.is_Symbol:
                    raise NotSpecializable(f"input '{node.name}' dimension {dim} is an expression ({expression})")
                if bindings.setdefault(expression, int(wanted)) != int(wanted):
                    raise NotSpecializable(f"size symbol {expression} takes two values")
            elif int(size) != int(wanted):
                raise NotSpecializable(
                    f"input '{node.name}' dimension {dim} was exported as {int(size)} (the model's code "
                    f"fixed it), got {int(wanted)}"
                )
    return bindings


def _meta(node: torch.fx.Node, value: Any, metadata: dict[Any, Any]) -> dict[str, Any]:
    """``node``'s meta with the value (and tensor metadata) of the concrete
    shapes; ``metadata`` holds the tensor metadata computed so far, by what
    it is a function of (for a tensor that is not quantized: sizes,
    strides, dtype, whether it requires grad)."""
    meta = dict(node.meta)
    meta["val"] = value
    meta.pop("tensor_meta", None)
    if isinstance(value, torch.Tensor):
        if value.is_quantized:
            meta["tensor_meta"] = _extract_tensor_metadata(value)
        else:
            key = (tuple(value.shape), value.stride(), value.dtype, value.requires_grad)
            found = metadata.get(key)
            if found is None:
                found = metadata[key] = _extract_tensor_metadata(value)
            meta["tensor_meta"] = found
    return meta
