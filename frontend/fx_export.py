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
  ``int``, ``float``, ``str``, ``None``; dense tensors only; outputs may
  also hold registered pytree nodes that flatten to such leaves (a
  transformers cache, registered by the importer before the trace), with
  ``torch.export``'s output tree;
- no input or state tensor is written in place, its metadata changed or
  its storage replaced (checked on the functional tensors after the
  trace): the program has no mutation outputs.  With ``mutations`` (for
  a module whose code writes in place, where the importer would read
  export's training IR) data writes are taken: the module's code sees the
  caller's grad mode, as in the training IR, and the trace returns each
  written parameter, buffer and tensor input's new value first, in input
  order, as ``PARAMETER_MUTATION``/``BUFFER_MUTATION``/
  ``USER_INPUT_MUTATION`` outputs named and ordered as export's; the
  program is what export, the importer's rewrites of the training IR and
  ``run_decompositions`` give, and it is declined where that program
  could differ: a write that changes a tensor's shape, strides or offset
  (functionalization gives the result its out-of-place op's layout, where
  eager keeps the tensor's), a ``copy_`` that converts or broadcasts, a
  ``contiguous``/``reshape``/``flatten`` that copies in eager (rewritten
  in the training IR), a whole-input ``copy_`` or two written tensors
  given one value (export's retrace and signature treat those its own
  way), storage addressing (``as_strided``, ``set_``, ``untyped_storage``),
  an in-place write under grad mode to an input that requires grad or a
  view that does (autograd refuses those in eager and in export), a write where inputs
  share memory, and effectful or auto-functionalized custom ops;
- state tensors share memory only as one tensor under several names
  (tied weights): each name is an input of its own that its module reads,
  as export lifts them
  (:func:`hloalias.frontend.importer._merge_aliased_state` then makes them
  one argument); other sharing, and a submodule registered under two
  names, are left to export;
- the graph reads no module's tensor attribute that is neither parameter
  nor buffer (export names it after the attribute); tensors made in
  ``forward`` (``torch.tensor([])``) are lifted as constants after the
  state, named as export's ``lift_constants_pass`` names them
  (:func:`_lift_constants`);
- no dropout in training and no random numbers (export keeps
  ``aten.dropout`` for the table, which this trace decomposes by its
  composite kernel); ``F.dropout``/``torch.dropout`` out of training
  become the ``clone`` export's decomposition makes of them; and the trace
  raises nothing (data-dependent control flow and the like are refused by
  ``torch.export`` with its message).  A trace stopped mid-forward leaves
  the torch-function mode stack as it found it (:func:`function_modes_kept`).

With ``dynamic_dims`` (a shape family's dynamic export,
:func:`hloalias.frontend.shape_specialization.export_dynamic`) the trace is
symbolic in the named dimensions of the tensor inputs: fake inputs of one
shape environment as ``torch.export`` makes them for ``Dim.DYNAMIC`` (the
state static), the branches the code took on sizes left as that
environment's guards and the symbols' ranges as the program's
``range_constraints``.  An output tree must hold no size (one tree
serves every size).  It declines a size the code fixed,
data-dependent sizes, a module's tensor attribute read as a constant, and
every case above (``test/py/test_dynamic_single_trace.py``).

``test/py/test_fx_export.py`` compares the program with
``torch.export`` + ``run_decompositions`` (graph, signature, names, trees,
state) across the kinds above, and with the importer's two traces for
programs that write in place."""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
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


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _flat_tree(tree: Any) -> bool:
    """Whether ``tree`` flattens (``torch.utils._pytree``, with the nodes
    registered: a transformers cache, once the importer registered it) to
    tensors and primitives: the outputs ``torch.export`` takes, flattened
    the same way.  For a symbolic trace, whose tree serves every size: no
    size in a leaf or in a node's context (a cache that records its
    length)."""
    leaves, spec = pytree.tree_flatten(tree)
    if not all(isinstance(leaf, (torch.Tensor, *_PRIMITIVES)) for leaf in leaves):
        return False
    pending = [spec]
    while pending:
        node = pending.pop()
        if any(isinstance(value, _SYMBOLIC) for value in pytree.tree_leaves(node.context)):
            return False
        pending.extend(node.children())
    return True


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


def _shared_owner(module: torch.nn.Module, names: list[str]) -> bool:
    """Whether two of the state ``names`` are one attribute of one module
    object (a submodule registered twice): the trace gives each name its
    own value by setting that attribute (:func:`_trace`), so one of two
    such names would go unread where export may read both."""
    seen: set[tuple[int, str]] = set()
    for name in names:
        prefix, _, attribute = name.rpartition(".")
        owner = (id(module.get_submodule(prefix)), attribute)
        if owner in seen:
            return True
        seen.add(owner)
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


#: Calls that address or replace a tensor's storage: the training IR keeps
#: them for the importer (importer._strided_inputs), which this trace cannot.
#: With writes, ``unfold`` too: the importer checks writes through its windows
#: in the training IR (importer._refuse_lossy_unfold_writes).
_STORAGE_CALLS = frozenset({"as_strided", "as_strided_", "as_strided_scatter", "set_", "resize_", "resize_as_",
                            "untyped_storage", "data_ptr", "storage_offset_"})
#: Calls the importer pins as clones in the training IR where they copy in
#: eager (importer._pin_eager_copies).
_COPY_OR_VIEW = frozenset({"contiguous", "reshape", "flatten"})


def _eval_dropout(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the call is ``F.dropout``/``torch.dropout`` of a tensor out of
    training, not in place: export keeps ``aten.dropout`` and its
    decomposition makes it ``aten.clone`` of the input, where ``make_fx``
    takes the composite kernel (the input itself: no node)."""
    names: tuple[str, ...]
    if func is torch.nn.functional.dropout:
        names, training = ("input", "p", "training", "inplace"), "training"
    elif func is torch.dropout:
        names, training = ("input", "p", "train"), "train"
    else:
        return False
    bound = {**dict(zip(names, args)), **kwargs}
    return (
        isinstance(bound.get("input"), torch.Tensor)
        and bound.get(training, True) is False
        and bound.get("inplace", False) is False
        and set(bound) <= set(names)
    )


class _Watch(torch.overrides.TorchFunctionMode):
    """Stops the trace at a dropout call in training (:func:`_eval_dropout`
    says which are taken, as the clone export makes of them): export's
    functionalization keeps ``aten.dropout`` for the decomposition table,
    where this trace takes its composite kernel.
    With ``mutations``, also at a call that addresses storage and at a
    ``contiguous``/``reshape``/``flatten`` that copies (the importer rewrites
    those in the training IR; here every tensor has eager's layout, checked
    by :class:`_CheckedFunctionalMode`, so a copy is a result with a storage
    of its own)."""

    def __init__(self, mutations: bool, grad_enabled: bool = False) -> None:
        super().__init__()
        self.mutations = mutations
        #: The grad mode the module's code sees (:func:`_user_grad_mode`).
        self.grad_enabled = grad_enabled

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        name = getattr(func, "__name__", "")
        if "dropout" in name:
            if _eval_dropout(func, args, kwargs or {}):
                # What export's graph has for it: aten.dropout decomposed
                # (train false) to a clone of the input.
                return torch.clone(args[0])
            raise _NotPlain("dropout")
        if self.mutations and (name in _STORAGE_CALLS or name.startswith("as_strided") or name == "unfold"):
            raise _NotPlain(name)
        if func is torch._C._set_grad_enabled and args:
            self.grad_enabled = bool(args[0])
        result = func(*args, **(kwargs or {}))
        if self.mutations and name in _COPY_OR_VIEW and args and isinstance(args[0], torch.Tensor):
            if isinstance(result, torch.Tensor) and _storage(result) != _storage(args[0]):
                raise _NotPlain(f"{name} copies")
        return result


def _layout(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype)


def _written(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors the operator ``func`` writes (its schema's mutable arguments)."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    written: list[torch.Tensor] = []
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        written.extend(leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor))
    return written


class _CheckedFunctionalMode(FunctionalTensorMode):  # type: ignore[no-untyped-call]
    """``torch.export``'s functionalization, stopped (:class:`_NotPlain`)
    where its graph would not be what the importer makes of export's
    training IR: a tensor whose shape, strides or offset change during the
    trace (functionalization gives an in-place op's result the layout of
    its out-of-place op, eager keeps the tensor's: later ``reshape``
    decisions and storages would differ), a ``copy_`` that converts or
    broadcasts (importer._explicit_copy_conversions rewrites it), an
    in-place write under grad mode that autograd may refuse, and anything
    that addresses storage."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._layouts: dict[int, tuple[torch.Tensor, tuple[Any, ...]]] = {}
        #: Storages of the inputs that require grad (leaves in eager).
        self.leaves: set[Any] = set()

    def _refused(self, written: torch.Tensor) -> bool:
        """Whether autograd may refuse this in-place write under grad mode:
        the tensor shares the storage of an input that requires grad (a
        leaf, or a view of one), or it is a view (multi-output views, views
        made under no_grad) while some input requires grad.  A write to an
        intermediate that is no view is allowed in eager."""
        return _storage(written) in self.leaves or (bool(self.leaves) and written._is_view())

    def _check(self, tensors: Sequence[torch.Tensor]) -> None:
        for tensor in tensors:
            seen = self._layouts.get(id(tensor))
            if seen is None:
                self._layouts[id(tensor)] = (tensor, _layout(tensor))
            elif seen[1] != _layout(tensor):
                raise _NotPlain("layout changed in place")

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(getattr(func, "_overloadpacket", None), "__name__", "")
        if name in _STORAGE_CALLS or name.startswith("as_strided"):
            raise _NotPlain(name)
        if func is torch.ops.aten.copy_.default:
            destination, source = args[0], args[1]
            if isinstance(source, torch.Tensor) and (
                source.dtype != destination.dtype or tuple(source.shape) != tuple(destination.shape)
            ):
                raise _NotPlain("converting copy_")
        tensors = [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, FunctionalTensor)]
        if torch.is_grad_enabled() and any(self._refused(value) for value in _written(func, args, kwargs)):
            # Autograd refuses such a write in eager and in export's
            # training IR; this trace runs without autograd (the module's
            # code sees the caller's grad mode: _user_grad_mode).
            raise _NotPlain("in-place write autograd may refuse")
        self._check(tensors)
        result = super().__torch_dispatch__(func, types, args, kwargs)
        self._check(tensors + [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, FunctionalTensor)])
        return result


def _whole_copy(node: torch.fx.Node) -> bool:
    """``aten.copy`` of a whole input: export's retrace of the training IR
    takes the source as the new value (no copy), this trace keeps it."""
    return (
        node.target is torch.ops.aten.copy.default
        and isinstance(node.args[0], torch.fx.Node)
        and node.args[0].op == "placeholder"
    )


def _random(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def exported_from_trace(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    table: dict[Any, Callable[..., Any]],
    mutations: bool = False,
    dynamic_dims: Sequence[frozenset[int]] | None = None,
    declined: list[str] | None = None,
) -> ExportedProgram | None:
    """The decomposed program of ``module`` on ``args``/``kwargs`` from one
    ``make_fx`` trace, or None where ``torch.export`` must decide (module
    docstring).  With ``mutations``, a program that writes its parameters,
    buffers or tensor inputs in place is taken too (its code sees the
    caller's grad mode, as in export's training IR); without, it is
    declined.  With ``dynamic_dims`` (per flat input leaf, all tensors, the
    dimensions to keep symbolic) the trace is symbolic in those dimensions
    (:func:`_symbolic_inputs`; not with ``mutations``).  Never raises for a
    program it does not take; ``declined`` (when given) gets the reason."""
    why = declined if declined is not None else []
    private = torch_internals._private()
    if private is None:
        why.append("torch's private export internals are missing")
        return None
    if not _plain_tree((args, kwargs)):
        why.append("inputs: not tuples, lists and dicts of dense tensors and primitives")
        return None
    if dynamic_dims is not None and mutations:
        why.append("dynamic dimensions with mutations")
        return None
    parameters = dict(module.named_parameters(remove_duplicate=False))
    buffers = dict(module.named_buffers(remove_duplicate=False))
    if not _plain_tree(list(parameters.values()) + list(buffers.values())):
        why.append("state: a parameter or buffer that is not a dense tensor")
        return None
    # Tied weights (one tensor under two names) are lifted once per name,
    # as export lifts them (importer._merge_aliased_state makes them one
    # argument); other state sharing memory is left to export.
    if _state_shares_memory(list({id(t): t for t in [*parameters.values(), *buffers.values()]}.values())):
        why.append("state tensors share memory (not one tensor under two names)")
        return None
    if _shared_owner(module, [*parameters, *buffers]):
        why.append("a submodule registered under two names")
        return None
    try:
        with function_modes_kept():
            traced = _trace(module, args, kwargs, parameters, buffers, table, mutations, dynamic_dims)
    except _NotPlain as error:
        why.append(str(error))
        return None
    except Exception as error:  # anything the trace raised: export names it
        why.append(f"the trace raised {type(error).__name__}: {str(error)[:200]}")
        return None
    if traced is None:
        why.append("the module's forward ran more than once")
        return None
    tensors = [value for value in pytree.tree_leaves((args, kwargs)) if isinstance(value, torch.Tensor)]
    if traced.mutated and _state_shares_memory([*parameters.values(), *buffers.values(), *tensors]):
        why.append("a write through inputs that share memory")
        return None  # export's error or its aliasing rules
    try:
        ranges = None if dynamic_dims is None else _symbolic_ranges(traced.graph_module, len(parameters) + len(buffers))
        return _program(module, args, kwargs, parameters, buffers, traced, ranges)
    except _NotPlain as error:
        why.append(str(error))
        return None


def function_mode_stack() -> list[Any]:
    """The torch-function modes active, in the order they were entered."""
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


@contextlib.contextmanager
def function_modes_kept() -> Iterator[None]:
    """The torch-function mode stack as the block found it, on the way out.
    A trace stopped mid-forward unwinds modes that hooks push and pop
    (single_trace's write guards, entered on the module's forward) out of
    their order with ``make_fx``'s own: a ``TorchFunctionMode`` exit pops
    whatever is on top, and the stopped trace would leave its modes (this
    module's :class:`_Watch`) active under the caller's next trace."""
    saved = function_mode_stack()
    try:
        yield
    finally:
        if function_mode_stack() != saved:
            while torch._C._len_torch_function_stack():
                torch._C._pop_torch_function_stack()
            for mode in saved:
                torch._C._push_on_torch_function_stack(mode)


@dataclasses.dataclass
class _Traced:
    graph_module: torch.fx.GraphModule
    out_spec: Any
    #: Flat input positions (parameters, buffers, user inputs) written in
    #: place, in order: their new values lead the graph's outputs.
    mutated: list[int]
    #: Traced with ``mutations`` (the importer's alternative is then the
    #: training IR, not export's post-dispatch trace).
    writing: bool = False


def _trace(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    parameters: dict[str, torch.nn.Parameter],
    buffers: dict[str, torch.Tensor],
    table: dict[Any, Callable[..., Any]],
    mutations: bool = False,
    dynamic_dims: Sequence[frozenset[int]] | None = None,
) -> _Traced | None:
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx, maybe_enable_thunkify
    from torch.nn.utils.stateless import _reparametrize_module

    flat_inputs, in_spec = pytree.tree_flatten((args, kwargs))
    names = [*parameters, *buffers]
    state_count = len(names)
    out_specs: list[Any] = []
    mutated: list[int] = []

    user_grad = torch.is_grad_enabled()

    def flat_forward(*flat: Any) -> tuple[Any, ...]:
        call_args, call_kwargs = pytree.tree_unflatten(list(flat[state_count:]), in_spec)
        state = dict(zip(names, flat[:state_count]))
        watch = _Watch(mutations, user_grad)
        # Each name its own value, tied weights too: export lifts a tied
        # weight once per name, and each module reads its own.
        with _reparametrize_module(module, state, tie_weights=False, strict=True, stack_weights=True), watch, \
                _user_grad_mode(watch) if mutations else contextlib.nullcontext():
            result = module(*call_args, **call_kwargs)
        if not (_plain_tree(result, traced=True) and dynamic_dims is None or _flat_tree(result)):
            raise _NotPlain(f"output: a {type(result).__name__} the trace cannot flatten")
        leaves, spec = pytree.tree_flatten(result)
        out_specs.append(spec)
        return tuple(leaves)

    def functional(*flat: Any) -> tuple[Any, ...]:
        disable_above = torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize)
        )
        mode = (_CheckedFunctionalMode if mutations else FunctionalTensorMode)(
            pre_dispatch=False, export=True, _allow_token_discovery=True
        )
        with disable_above, mode:
            wrapped = [FunctionalTensor.to_functional(t) if isinstance(t, torch.Tensor) else t for t in flat]
            if isinstance(mode, _CheckedFunctionalMode):
                mode.leaves = {_storage(t) for t in wrapped if isinstance(t, torch.Tensor) and t.requires_grad}
            with _forward_stack_traces(dynamic_dims is None) if _FAST_STACK_TRACES else contextlib.nullcontext(), \
                    _constant_owners(module), \
                    maybe_enable_thunkify() if dynamic_dims is not None else contextlib.nullcontext():
                # Symbolic: the size arithmetic of every op's meta function
                # (thousands of operations for a small Llama) becomes a node
                # only where the graph uses it, as in AOT autograd's
                # functionalization; a chain too deep to force fails the
                # trace, and the two traces take the program.
                outputs = flat_forward(*wrapped)
            if mode._tokens:
                raise _NotPlain("effect tokens")
            for index, value in enumerate(wrapped):
                if isinstance(value, FunctionalTensor) and _mutated(value):
                    if not mutations:
                        raise _NotPlain("mutation")
                    mutated.append(index)
            unwrapped = []
            for value in [wrapped[index] for index in mutated] + list(outputs):
                if isinstance(value, FunctionalTensor):
                    torch._sync(value)  # type: ignore[attr-defined, no-untyped-call]
                    value = torch._from_functional_tensor(value.elem)
                unwrapped.append(value)
            return tuple(unwrapped)

    private = torch_internals._private()
    assert private is not None
    cia_to_decomp, python_table = torch_internals.split_decomposition_table(table)
    flat = [*parameters.values(), *buffers.values(), *flat_inputs]
    seen: set[int] = set()
    for position, tensor in enumerate(flat[:state_count]):
        if id(tensor) in seen:
            # A tied weight's second name: a tensor object of its own (one
            # storage), else the trace makes one fake tensor of both and
            # every read goes to the last name's placeholder, where export
            # reads each name's own.
            flat[position] = _alias(tensor)
        seen.add(id(tensor))
    if dynamic_dims is not None:
        flat = _symbolic_inputs(flat, state_count, dynamic_dims)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch_internals.cia_override(cia_to_decomp))
        # The override's kernels are Python kernels: only the Python
        # dispatcher runs them (make_fx enables it for symbolic and
        # pre-dispatch traces only; export's trace runs under it).
        stack.enter_context(enable_python_dispatcher())
        stack.enter_context(torch_internals.lazy_graph_modules())
        # make_fx's tracer would swap nn.Module's __getattr__/__call__ for
        # wrappers that change nothing, at a cost per nn.Module class.
        stack.enter_context(torch_internals.module_patches_skipped())
        stack.enter_context(torch.no_grad())
        # What torch.export's post-dispatch trace runs under: backend
        # kernels' own decompositions off, torch.compiler.is_exporting()
        # true (models branch on it: transformers' is_tracing).
        stack.enter_context(private["_ignore_backend_decomps"]())
        stack.enter_context(private["_compiling_state_context"]())
        # Each node records the aten op the program called that it comes
        # from (``meta["original_aten"]``), as export's decomposition
        # retrace does: index_copy_ and index_add_ decompose to index_put,
        # and frontend/index_ranges.py reads which op eager ran.
        stack.enter_context(torch.fx.traceback.preserve_node_meta())
        graph_module = make_fx(
            functional,
            decomposition_table=dict(python_table),
            tracing_mode="fake" if dynamic_dims is None else "symbolic",
            record_stack_traces=not _FAST_STACK_TRACES,
            _allow_non_fake_inputs=True,
        )(*flat)
    if len(out_specs) != 1:
        return None
    return _Traced(graph_module, out_specs[0], mutated, mutations)


def _alias(tensor: torch.Tensor) -> torch.Tensor:
    """A new tensor object on ``tensor``'s storage, of its type and grad flag."""
    alias = tensor.detach()
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(alias, requires_grad=tensor.requires_grad)
    return alias.requires_grad_(tensor.requires_grad)


@contextlib.contextmanager
def _user_grad_mode(watch: _Watch) -> Iterator[None]:
    """Within the block, ``torch.is_grad_enabled()`` called outside torch
    (and from its grad-mode context managers) answers the grad mode
    the module's code has set (``watch.grad_enabled``: the caller's, then
    what ``torch.no_grad()`` and the like set), as it does in export's
    training IR, while the trace itself runs under ``torch.no_grad()`` as
    ``run_decompositions`` retraces that IR: the module branches as in the
    training IR, and the writes autograd would refuse are declined
    (:class:`_CheckedFunctionalMode`)."""
    original = torch.is_grad_enabled
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    grad_mode_file = torch.autograd.grad_mode.__file__

    def is_grad_enabled() -> bool:
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(torch_dir) and caller != grad_mode_file:
            return original()  # torch's own code (decompositions): the trace's mode
        return watch.grad_enabled

    torch.is_grad_enabled = is_grad_enabled
    try:
        yield
    finally:
        torch.is_grad_enabled = original


#: Record node stack traces with :func:`_forward_stack_traces` (else with
#: ``make_fx``'s own recording, which gives the same strings: the test
#: compares them).
_FAST_STACK_TRACES = True


def _forward_frames(skipped: Any) -> traceback.StackSummary:
    """The frames ``make_fx``'s tracer keeps in a node's stack trace
    (``_filter_traceback_frames`` with ``_record_forward_stack_traces_only``:
    ``forward`` frames, ``torch/__init__.py``, registered anchors, none in
    the ``skipped`` files: ``uninteresting_files()``), outermost first.  The tracer summarizes every frame of the stack,
    reading each one's source line, then drops most: a frame's line is
    read here only when it is kept."""
    from torch.fx.proxy import _STACK_TRACE_ANCHORS

    kept = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if (
            code.co_name == "forward"
            or code.co_filename.endswith("torch/__init__.py")
            or (code.co_filename, code.co_name) in _STACK_TRACE_ANCHORS
        ) and code.co_filename not in skipped:
            kept.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back  # type: ignore[assignment]
    summary = traceback.StackSummary()
    for filename, line, name in reversed(kept):
        summary.append(traceback.FrameSummary(filename, line, name))
    return summary


@contextlib.contextmanager
def _forward_stack_traces(shape_nodes: bool = True) -> Iterator[None]:
    """Within the block, each node the ``make_fx`` trace creates records the
    stack trace ``record_stack_traces=True`` would give it, from
    :func:`_forward_frames` (placeholders, made before, record none: the
    program drops theirs).  Without ``shape_nodes``, the nodes of size
    arithmetic (:func:`_shape_node`) record none: each would be a walk of
    the Python stack, and a specialization evaluates them to numbers (no
    node of the specialized program comes from one)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    from torch.fx.experimental.symbolic_shapes import uninteresting_files

    mode = get_proxy_mode()
    if mode is None:
        yield
        return
    tracer = mode.tracer
    create_node = tracer.create_node
    skipped = uninteresting_files()

    def recording(*args: Any, **kwargs: Any) -> torch.fx.Node:
        node: torch.fx.Node = create_node(*args, **kwargs)
        if not node.stack_trace and (shape_nodes or not _shape_node(node)):
            summary = _forward_frames(skipped)
            if summary:
                node.stack_trace = "".join(summary.format()).strip()
        return node

    tracer.create_node = recording  # type: ignore[method-assign]
    try:
        yield
    finally:
        del tracer.create_node


_SIZE_QUERIES = frozenset({
    torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
    torch.ops.aten.sym_storage_offset.default,
})


def _shape_node(node: torch.fx.Node) -> bool:
    """Whether ``node`` computes a size, not a tensor: a size query of a
    tensor, or arithmetic on sizes (a Python operator or ``torch.sym_*``
    function as target: a symbolic trace's only targets that are no
    operator, save ``getitem`` of an operator's tuple result)."""
    target = node.target
    if node.op != "call_function" or target is operator.getitem:
        return False
    return target in _SIZE_QUERIES or not isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator))


#: Node meta key: the qualified name of the module whose forward made a
#: ``get_attr`` node (a tensor constant made in ``forward``).
_OWNER = "hloalias_constant_owner"


@contextlib.contextmanager
def _constant_owners(module: torch.nn.Module) -> Iterator[None]:
    """Within the block, each ``get_attr`` node the ``make_fx`` trace
    creates (a tensor the code makes, ``torch.tensor([])``) records in
    ``meta[_OWNER]`` the qualified name of the innermost submodule of
    ``module`` whose ``forward`` runs: ``torch.export`` names the lifted
    constant after it (:func:`_lift_constants`)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    mode = get_proxy_mode()
    if mode is None:
        yield
        return
    names = {id(submodule): name for name, submodule in module.named_modules()}
    running: list[str] = []
    pushed: list[bool] = []
    # The hooks are process-wide: module calls of other threads (an eager
    # forward beside the trace) are not the trace's.
    tracing_thread = threading.get_ident()

    def enter(called: torch.nn.Module, *_: Any) -> None:
        if threading.get_ident() != tracing_thread:
            return
        name = names.get(id(called))
        pushed.append(name is not None)
        if name is not None:
            running.append(name)

    def leave(*_: Any) -> None:
        if threading.get_ident() == tracing_thread and pushed and pushed.pop():
            running.pop()

    tracer = mode.tracer
    create_node = tracer.create_node

    def recording(kind: str, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node: torch.fx.Node = create_node(kind, *args, **kwargs)
        if kind == "get_attr":
            node.meta[_OWNER] = running[-1] if running else ""
        return node

    wrapped = "create_node" in vars(tracer)  # by _forward_stack_traces, which deletes its own
    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave, always_call=True)]
    tracer.create_node = recording  # type: ignore[method-assign]
    try:
        yield
    finally:
        if wrapped:
            tracer.create_node = create_node  # type: ignore[method-assign]
        else:
            del tracer.create_node
        for handle in handles:
            handle.remove()


def _lift_constants(
    graph_module: torch.fx.GraphModule, module: torch.nn.Module, first_user_input: torch.fx.Node | None
) -> list[tuple[torch.fx.Node, str, torch.Tensor]]:
    """Turn each tensor constant the trace made (``get_attr`` of a tensor
    the code created in ``forward``) into a placeholder, inserted before
    ``first_user_input`` (after the state, where ``torch.export``'s
    ``lift_constants_pass`` puts them: the order of a static import's
    arguments), named as that pass names
    it: ``lifted_tensor_<n>`` in graph order, under the qualified name of
    the module that made it.  One placeholder per tensor object.  Returns
    ``(placeholder, qualified name, tensor)``; declines
    (:class:`_NotPlain`) a constant that is a module's tensor attribute
    (export keeps that attribute's own name) or has no recorded owner."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    attributes = {
        id(value) for submodule in module.modules() for value in vars(submodule).values()
        if isinstance(value, torch.Tensor)
    }
    graph = graph_module.graph
    anchor = first_user_input or next(
        (node for node in graph.nodes if node.op != "placeholder"), None
    )
    lifted: dict[int, tuple[torch.fx.Node, str, torch.Tensor]] = {}
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(graph_module, str(node.target), None)
        if not isinstance(value, torch.Tensor) or id(value) in attributes or _OWNER not in node.meta:
            raise _NotPlain("tensor constant")
        if id(value) not in lifted:
            name = f"lifted_tensor_{len(lifted)}"
            owner = node.meta[_OWNER]
            with graph.inserting_before(anchor):
                placeholder = graph.placeholder(name)
            with unset_fake_temporarily():
                real = value.detach() if isinstance(value, torch.nn.Parameter) else value
            placeholder.meta["val"] = node.meta.get("val")
            lifted[id(value)] = (placeholder, f"{owner}.{name}" if owner else name, real)
        node.replace_all_uses_with(lifted[id(value)][0])
        graph.erase_node(node)
        if hasattr(graph_module, str(node.target)):
            delattr(graph_module, str(node.target))
    return list(lifted.values())


def _storage(tensor: torch.Tensor) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(tensor.untyped_storage())


def _program(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    parameters: dict[str, torch.nn.Parameter],
    buffers: dict[str, torch.Tensor],
    traced: _Traced,
    range_constraints: dict[Any, Any] | None = None,
) -> ExportedProgram:
    from torch._export.utils import placeholder_naming_pass
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
    from torch.export.graph_signature import (
        ConstantArgument, ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument,
    )

    graph_module, out_spec = traced.graph_module, traced.out_spec
    graph = graph_module.graph
    for node in list(graph.nodes):  # export-mode functionalization's checks of .to(): not in export's graph
        if node.target is torch.ops.aten._assert_tensor_metadata.default and not node.users:
            graph.erase_node(node)
    graph.eliminate_dead_code()  # as AOT autograd does for export's graph
    lifted: list[tuple[torch.fx.Node, str, torch.Tensor]] = []
    if any(node.op == "get_attr" for node in graph.nodes):
        if traced.writing:
            # The alternative here is the training IR, whose order of lifted
            # constants and buffers this lift does not follow everywhere (a
            # Llama's constants come before its buffers there, after them in
            # export's post-dispatch trace and here): left to it.
            raise _NotPlain("tensor constant in a writing trace")
        users = [node for node in graph.nodes if node.op == "placeholder"][len(parameters) + len(buffers):]
        lifted = _lift_constants(graph_module, module, users[0] if users else None)
    lifted_nodes = {node for node, _, _ in lifted}
    if any(_random(node) for node in graph.nodes):
        raise _NotPlain("random op")  # export keeps native_dropout where this trace decomposes it
    flat_inputs, in_spec = pytree.tree_flatten((args, kwargs))
    placeholders = [node for node in graph.nodes if node.op == "placeholder" and node not in lifted_nodes]
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
    for node, target, _ in lifted:
        input_specs.append(InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), target))
    for node, value in zip(placeholders[len(parameters) + len(buffers):], flat_inputs):
        if isinstance(value, torch.Tensor):
            argument: Any = TensorArgument(node.name)
        else:
            node.meta["val"] = value
            argument = ConstantArgument(node.name, value)
        input_specs.append(InputSpec(InputKind.USER_INPUT, argument, None))
    for node in [*placeholders, *lifted_nodes]:
        node.meta.pop("stack_trace", None)
        node.meta.pop("nn_module_stack", None)
        if "val" not in node.meta:
            raise _NotPlain("placeholder without a value")
    output = next(node for node in graph.nodes if node.op == "output")
    output_specs: list[OutputSpec] = []
    new_values = list(output.args[0][:len(traced.mutated)])
    if traced.mutated and (
        any(isinstance(node.target, torch._ops.HigherOrderOperator) for node in graph.nodes)
        or any(_whole_copy(node) for node in graph.nodes)
        or len(set(new_values)) != len(new_values)
        or not all(isinstance(value, torch.fx.Node) and value.op == "call_function" for value in new_values)
    ):
        # Export keys mutation outputs by node name: two writes of one value,
        # or a write of an input as it is, are told apart by its rules; its
        # retrace of the training IR drops a whole-tensor copy_ (the new
        # value is the source) where this trace keeps aten.copy.
        raise _NotPlain("mutation outputs")
    state_names = [*parameters, *buffers]
    for index, value in zip(traced.mutated, new_values):
        if index < len(parameters):
            kind, target = OutputKind.PARAMETER_MUTATION, state_names[index]
        elif index < len(state_names):
            kind, target = OutputKind.BUFFER_MUTATION, state_names[index]
        else:
            kind, target = OutputKind.USER_INPUT_MUTATION, placeholders[index].name
        output_specs.append(OutputSpec(kind, TensorArgument(value.name), target))
    for value in output.args[0][len(traced.mutated):]:
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
    constants: dict[str, Any] = {target: tensor for _, target, tensor in lifted}
    constants.update({name: buffers[name] for name in buffers if name in non_persistent})
    placeholder_naming_pass(
        graph_module, signature, module, args, kwargs, {**parameters, **buffers}, constants
    )
    graph_module.recompile()
    state_dict = {name: tensor for name, tensor in {**parameters, **buffers}.items() if name not in non_persistent}
    call = ModuleCallSignature(
        inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec,
        forward_arg_names=_forward_arg_names(module, args, kwargs),
    )
    # Its module's Python code generated only if something calls it or
    # reads its code (nothing on the way to MLIR does: the importer reads
    # the graph): ExportedProgram.__init__ otherwise generates and execs the
    # code of a second module over the graph the trace's lazy module holds.
    with torch_internals.lazy_graph_modules(), torch_internals.lazy_exported_programs():
        exported = ExportedProgram(
            root=graph_module,
            graph=graph,
            graph_signature=signature,
            state_dict=state_dict,
            range_constraints=dict(range_constraints or {}),
            module_call_graph=[ModuleCallEntry("", call)],
            example_inputs=(args, kwargs),
            constants=constants,
        )
    return exported


def _symbolic_inputs(
    flat: list[Any], state_count: int, dynamic_dims: Sequence[frozenset[int]]
) -> list[Any]:
    """``flat`` (parameters and buffers, then the user inputs' leaves) as
    fake tensors of one fake mode with a shape environment, as
    ``torch.export`` makes them for ``Dim.DYNAMIC`` dimensions (its
    ``make_fake_inputs``): the state with static shapes, the
    ``dynamic_dims[i]`` of the ``i``-th user input symbolic (a dynamic
    size of 0 or 1 would be specialized: refused)."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    users = flat[state_count:]
    if len(users) != len(dynamic_dims) or not all(isinstance(value, torch.Tensor) for value in users):
        raise _NotPlain("dynamic inputs")
    fake_mode = FakeTensorMode(shape_env=ShapeEnv(tracked_fakes=[], trace_asserts=True),
                               allow_non_fake_inputs=True, export=True)
    fakes: list[Any] = [fake_mode.from_tensor(tensor, static_shapes=True) for tensor in flat[:state_count]]
    for position, (tensor, dims) in enumerate(zip(users, dynamic_dims)):
        if any(tensor.shape[d] < 2 for d in dims):
            raise _NotPlain("a dynamic size of 0 or 1")
        context: Any = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(tensor.dim())],
            constraint_sizes=[None] * tensor.dim(),
        )
        fakes.append(fake_mode.from_tensor(tensor, source=ConstantSource(f"input{position}"),
                                           symbolic_context=context))
    return fakes


def _symbolic_ranges(graph_module: torch.fx.GraphModule, state_count: int) -> dict[Any, Any]:
    """The value range of each size symbol of the user inputs after a
    symbolic trace (the program's ``range_constraints``).  Declines
    (:class:`_NotPlain`) where the graph is not a program of those symbols
    alone: a size the code fixed (``torch.export`` refuses or specializes
    it), or data-dependent sizes (unbacked symbols, whose checks
    ``torch.export`` inserts into the graph as nodes)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    placeholders = [node for node in graph_module.graph.nodes if node.op == "placeholder"]
    shape_env = None
    symbols: set[Any] = set()
    for node in placeholders[state_count:]:
        value = node.meta.get("val")
        for size in getattr(value, "shape", ()):
            if isinstance(size, torch.SymInt):
                # ``expr`` has the shape environment's replacements applied:
                # a size the code fixed is a number here, and one found
                # equal to another is that one's symbol (as export writes
                # them into its placeholders; specialize binds the symbol
                # once and refuses two values for it).
                if not size.node.expr.is_Symbol:
                    raise _NotPlain("the code fixed a dynamic size, or made it an expression")
                shape_env = size.node.shape_env
                symbols.add(size.node.expr)
    if shape_env is None:
        return {}
    for node in graph_module.graph.nodes:
        if free_unbacked_symbols(node.meta.get("val")):
            raise _NotPlain("data-dependent sizes")
    if any(free_unbacked_symbols(ra.expr) for asserts in shape_env.deferred_runtime_asserts.values()
           for ra in asserts):
        raise _NotPlain("data-dependent sizes")
    return {symbol: shape_env.var_to_range[symbol] for symbol in symbols}


def _forward_arg_names(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str] | None:
    try:
        from torch.export._trace import _get_forward_arg_names

        names: list[str] = _get_forward_arg_names(module, args, kwargs)
        return names
    except Exception:  # names are informational
        return None
