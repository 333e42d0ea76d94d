"""Capture a PyTorch training step as one functional program.

The user writes the step the PyTorch way::

    def step(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

:func:`capture_training_step` turns it into an ``ExportedProgram`` whose
module state is everything the step reads and overwrites: the model's
parameters (``param.<fqn>``), its buffers (``buffer.<fqn>``, e.g.
BatchNorm's running statistics) and the optimizer's per-parameter state
(``optim.<i>.<key>``, ``i`` being the parameter's index in
``optimizer.state_dict()``), and, when the step leaves ``.grad`` set (no
``zero_grad``: gradients accumulate across calls), the gradients
(``grad.<fqn>``).  Every one of them is updated in place, so the
importer records it as a mutated buffer and ``alias-donated-buffers``
aliases it (an inferred donor).  The user inputs are one ``lr`` scalar per
parameter group (so a scheduler's new learning rate is data, not a
recompile) followed by the flattened batch.  The only user output is the
step's return value (the loss).

Route: ``make_fx`` in fake mode traces the user's function with the model
reparametrized by traced leaves and the optimizer pointed at them; autograd
runs during tracing, so ``backward()`` and ``optimizer.step()`` become plain
aten ops of one graph.  The optimizer is traced with ``capturable=True``
(its step counters stay tensors: no ``.item()``), except those whose
eager formula is traced as it is (Adam, AdamW, Adamax, Adagrad, NAdam,
RAdam, ASGD: :mod:`hloalias.frontend.optimizer_exact`),
and the learning rate is a traced 0-d tensor (:func:`_lr_dtype`).  The one trace also functionalizes (torch's
``FunctionalTensorMode``) and applies the importer's decompositions, so its
graph becomes the ``ExportedProgram`` (state slots as mutated buffers) that
:func:`hloalias.frontend.importer.import_torch` lowers without a second
``torch.export`` or a decomposition retrace.  The optimizer's update is
traced once per class of parameters and copied, shapes substituted, for
the others of the class (:mod:`hloalias.frontend.optimizer_replay`): the
same operators as tracing each parameter's.  ``make_fx`` applies the table
below autograd, where a composite op has already become its parts: a call
of ``F.ctc_loss``/``torch.ctc_loss`` (whose composite reaches
``_ctc_loss``, which has no fake rule) is replaced by
:mod:`hloalias.frontend.ctc_loss`'s decomposition before autograd sees it.

Fake-mode tracing makes every host read of a traced value (``.item()``,
``if loss > 0``, ``print(loss)``) an error; it is reported as
:class:`TrainingCaptureError` naming the construct and the user's line."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.compiler
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.fx.experimental.proxy_tensor import make_fx
from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.utils.stateless import _reparametrize_module

from hloalias.errors import TorchImportError
from hloalias.frontend.tracing_lock import tracing
from hloalias.frontend import single_trace
from hloalias.frontend.backward_decompositions import capture_decompositions
from hloalias.frontend.ctc_loss import ctc_loss_call, is_ctc_loss_call
from hloalias.frontend.differentiable_forwards import differentiable_call, is_differentiable_forward_call
from hloalias.frontend.importer import (
    _decomposition_table_with_custom_ops,
    late_registered_entries,
    lossy_unfold_write_message,
    unfold_covers,
)
from hloalias.frontend.optimizer_decompositions import optimizer_decompositions
from hloalias.frontend.optimizer_exact import eager_formula_kernels, eager_formula_optimizer, group_uses_eager_form
from hloalias.frontend.host_random import refuse_host_random_draws
from hloalias.frontend.program_frames import (
    data_dependent_size_origin, innermost_in_stack_trace, innermost_on_stack, where_raised,
)
from hloalias.frontend.optimizer_replay import ReplayRefused, expand_replayed_updates, replayed_updates
from hloalias.frontend.torch_internals import (
    eliminate_dead_code,
    lazy_exported_programs,
    lazy_graph_modules,
    make_fx_without_torch_fn_metadata,
    signature_checked_once,
)


class TrainingCaptureError(TorchImportError):
    """The training step could not be captured as one graph (a host read of
    a traced value, data-dependent control flow, an unsupported optimizer
    setting); the message names the construct and the user's source line."""


#: Trace the optimizer's update once per class of parameters
#: (:mod:`hloalias.frontend.optimizer_replay`); tests compare with False.
REPLAY_OPTIMIZER = True

#: Optimizer hyperparameters that are not baked into the graph.
LR_KEY = "lr"


@dataclasses.dataclass(frozen=True)
class StateSlot:
    """One tensor of training state: its name in the captured program, what
    it is, and where it lives in torch (``fqn`` for model state, parameter
    index and key for optimizer state)."""

    name: str
    kind: str  # "param" | "buffer" | "optimizer" | "grad"
    fqn: str | None = None
    param_index: int | None = None
    key: str | None = None


@dataclasses.dataclass
class CapturedTrainingStep:
    """A captured step: ``exported`` (state as buffers holding its initial
    values, ``lr`` inputs, batch inputs), the state slots in argument order,
    and what the runtime needs to call and check it."""

    exported: ExportedProgram
    slots: tuple[StateSlot, ...]
    lr_count: int
    batch_spec: Any
    hyperparameters: tuple[dict[str, Any], ...]
    parameters: tuple[torch.nn.Parameter, ...]
    #: The kept gradients (by parameter FQN) the step sets to None again
    #: (``optimizer.zero_grad()`` last): their slots hold zeros, and the
    #: parameter's ``.grad`` must read None, as eager's does.
    cleared_grads: frozenset[str] = frozenset()


def capture_training_step(
    step_fn: Callable[..., Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    example_batch: Sequence[Any],
    kept_grads: frozenset[str] = frozenset(),
    *,
    stack_traces: bool = False,
) -> CapturedTrainingStep:
    """Trace ``step_fn(*example_batch)`` (which calls ``model`` and
    ``optimizer``) into one functional program; see the module docstring.
    ``kept_grads`` names parameters whose gradients are state of the step
    even if it leaves them unset (another step of the same model
    accumulates into them: this one reads and clears them as eager would).

    Neither the model nor the optimizer is changed.  An optimizer without
    state yet gets its initial state here for SGD (momentum buffers of
    zeros, exact when ``dampening == 0``), Adam, AdamW, RAdam, NAdam,
    Adamax, Adadelta and RMSprop (zero moments, step 0); any other
    optimizer must have state already (Adagrad makes its own in its
    constructor; ASGD and Rprop: run one eager step first).  Raises :class:`TrainingCaptureError`.

    ``stack_traces``: record each node's stack trace (what lowering errors
    quote as the user's line); off by default, as recording costs every
    traced op: a host read found without them is traced again with them."""
    if not isinstance(model, torch.nn.Module):
        raise TrainingCaptureError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TrainingCaptureError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not callable(step_fn):
        raise TrainingCaptureError(f"step_fn must be callable, got {type(step_fn).__name__}")
    batch_leaves, batch_spec = pytree.tree_flatten(tuple(example_batch))
    for position, leaf in enumerate(batch_leaves):
        if not isinstance(leaf, torch.Tensor):
            raise TrainingCaptureError(
                f"batch leaf {position} is {type(leaf).__name__}, not a tensor: bake it into step_fn"
            )

    named_params = dict(model.named_parameters())
    named_buffers = dict(model.named_buffers())
    param_fqn = {id(p): name for name, p in named_params.items()}
    opt_params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, p in enumerate(opt_params):
        if id(p) not in param_fqn:
            raise TrainingCaptureError(f"optimizer parameter {index} is not a parameter of the model")
    _check_groups(optimizer)
    opt_state = _initial_optimizer_state(optimizer, opt_params)
    kept, traces, replay = kept_grads, stack_traces, REPLAY_OPTIMIZER
    while True:
        try:
            with tracing(), refuse_host_random_draws(TrainingCaptureError):
                return _capture(
                    step_fn, model, optimizer, batch_leaves, batch_spec, opt_params, opt_state, kept, traces, replay
                )
        except ReplayRefused:
            # An update class is not shape-generic (frontend/optimizer_replay.py):
            # trace every parameter's update.
            replay = False
        except _GradientsKept as kept_now:
            # The step accumulates into .grad across calls (no zero_grad, or
            # zero_grad(set_to_none=False)): gradients become device state too.
            # (``kept`` grows with every retry, bounded by the parameters.)
            kept = kept_now.names | kept
        except _HostReadUntraced:
            # Failure path only: trace again recording stack traces, so that
            # the error names the user's line (recording costs every op).
            traces = True


class _HostReadUntraced(Exception):
    """Raised from a trace without stack traces that found a host read."""


class _GradientsKept(Exception):
    """Raised from a trace whose step leaves gradients set."""

    def __init__(self, names: frozenset[str]) -> None:
        super().__init__(", ".join(sorted(names)))
        self.names = names


def _capture(
    step_fn: Callable[..., Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch_leaves: list[Any],
    batch_spec: Any,
    opt_params: list[torch.nn.Parameter],
    opt_state: list[dict[str, torch.Tensor]],
    kept_grads: frozenset[str],
    stack_traces: bool,
    replay: bool = False,
) -> CapturedTrainingStep:
    named_params = dict(model.named_parameters())
    named_buffers = dict(model.named_buffers())
    param_fqn = {id(p): name for name, p in named_params.items()}
    slots: list[StateSlot] = []
    initial: dict[str, torch.Tensor] = {}
    for fqn, p in named_params.items():
        slot = StateSlot(f"param.{fqn}", "param", fqn=fqn)
        slots.append(slot)
        initial[slot.name] = p.detach().clone()
    for fqn, b in named_buffers.items():
        slot = StateSlot(f"buffer.{fqn}", "buffer", fqn=fqn)
        slots.append(slot)
        initial[slot.name] = b.detach().clone()
    for index, entries in enumerate(opt_state):
        for key, value in entries.items():
            slot = StateSlot(f"optim.{index}.{key}", "optimizer", param_index=index, key=key)
            slots.append(slot)
            initial[slot.name] = value
    for fqn, p in named_params.items():
        if fqn in kept_grads:
            slot = StateSlot(f"grad.{fqn}", "grad", fqn=fqn)
            slots.append(slot)
            grad = p.grad
            initial[slot.name] = grad.detach().clone() if grad is not None else torch.zeros_like(p.detach())
    lr_count = len(optimizer.param_groups)
    #: The pytree structure of the step's result, set by the trace.
    result_structure: list[Any] = []
    cleared: list[frozenset[str]] = []

    def functional(flat_state: list[torch.Tensor], lrs: list[torch.Tensor], batch: list[torch.Tensor]) -> Any:
        values = dict(zip((s.name for s in slots), flat_state))
        # A frozen parameter (requires_grad=False) gets no gradient, as in
        # eager: the optimizer skips it (no update, no weight decay).  The
        # traced input itself is the leaf (no traced clone): its old value
        # is its placeholder, which the lr-0 guards read after tracing.
        leaves = {fqn: values[f"param.{fqn}"].requires_grad_(p.requires_grad) for fqn, p in named_params.items()}
        for fqn in kept_grads:
            leaves[fqn].grad = values[f"grad.{fqn}"].clone()
        buffers = {fqn: values[f"buffer.{fqn}"].clone() for fqn in named_buffers}
        traced_params = [leaves[param_fqn[id(p)]] for p in opt_params]
        traced_state: list[dict[str, Any]] = [{} for _ in opt_params]
        for slot in slots:
            if slot.kind == "optimizer":
                assert slot.param_index is not None and slot.key is not None
                # The input itself, not a clone: the optimizer's in-place
                # update of it is functionalized like any other (the graph
                # returns its last value) and 63 traced clones of a step
                # like the HF Llama's cost the trace more than the rest of
                # the wrapper; a state the step leaves alone is copied after
                # tracing (_unchanged_state_copied).
                traced_state[slot.param_index][slot.key] = values[slot.name]
        with _optimizer_pointed_at(optimizer, traced_params, traced_state, lrs):
            with _reparametrize_module(model, {**leaves, **buffers}, tie_weights=True), _ClosedOverWrites():
                result = step_fn(*pytree.tree_unflatten(batch, batch_spec))
        still_set = frozenset(fqn for fqn, leaf in leaves.items() if leaf.grad is not None)
        if not still_set <= kept_grads:
            raise _GradientsKept(still_set | kept_grads)
        cleared.append(kept_grads - still_set)
        result_leaves, result_spec = pytree.tree_flatten(result)
        _check_step_results(
            result, result_leaves,
            [*leaves.values(), *buffers.values(), *(v for entries in traced_state for v in entries.values()),
             *(leaf.grad for leaf in leaves.values() if leaf.grad is not None)],
            [leaf for leaf in batch if isinstance(leaf, torch.Tensor)],
        )
        result_structure.append(result_spec)
        new_values = []
        for slot in slots:
            if slot.kind == "param":
                # A trained parameter's leaf itself, not a ``detach()``: a
                # detach is a view that functionalization traces twice (here,
                # and again when it syncs the output), two ``alias`` nodes
                # per parameter that the lowering drops (the same final
                # module without them).  A frozen one keeps its detach: the
                # leaf would be the placeholder, which _unchanged_state_copied
                # would clone.
                leaf = leaves[slot.fqn]  # type: ignore[index]
                new_values.append(leaf if leaf.requires_grad else leaf.detach())
            elif slot.kind == "buffer":
                new_values.append(buffers[slot.fqn])  # type: ignore[index]
            elif slot.kind == "grad":
                grad = leaves[slot.fqn].grad  # type: ignore[index]
                # A kept gradient the step set to None again reads as zeros.
                new_values.append(grad.detach() if grad is not None else torch.zeros_like(leaves[slot.fqn]))  # type: ignore[index]
            else:
                new_values.append(traced_state[slot.param_index][slot.key])  # type: ignore[index]
        return new_values, [leaf.detach() for leaf in result_leaves]

    lr_examples = [torch.tensor(float(_lr_value(g)), dtype=_lr_dtype(g, optimizer)) for g in optimizer.param_groups]
    flat_state = [initial[s.name] for s in slots]
    # The math attention backend is composite (matmul, softmax): its
    # backward is ops XLA lowers; the fused CPU kernels' backward is not.
    # Lazy graph modules: make_fx's module and the graph edits below need
    # no generated code; only the ExportedProgram's module generates it.
    # ``replay``: the optimizer's update traced once per class of
    # parameters and copied for the others (frontend/optimizer_replay.py).
    # A custom op registered during the trace (late_registered_entries)
    # was recorded undecomposed: traced again with its entry.
    decompositions = {**_decomposition_table_with_custom_ops(), **capture_decompositions(), **optimizer_decompositions()}
    while True:
        with _tracing_flag(), sdpa_kernel(SDPBackend.MATH), lazy_graph_modules(), eager_formula_kernels():
            try:
                with replayed_updates() if replay else contextlib.nullcontext() as replayed:
                    graph_module = make_fx(
                        dispatch_functionalize(functional, FunctionalTensorMode()),
                        decomposition_table=decompositions,
                        tracing_mode="fake",
                        record_stack_traces=stack_traces,
                        _allow_non_fake_inputs=True,
                        # No torch-function mode per torch-level call for
                        # metadata this tracer never records (torch_internals).
                        **make_fx_without_torch_fn_metadata(),
                    )(
                        flat_state, lr_examples, batch_leaves
                    )
                if replayed is not None:
                    expand_replayed_updates(graph_module, replayed, decompositions)
            except (TrainingCaptureError, _GradientsKept, ReplayRefused):
                raise
            except Exception as error:  # torch raises many types while tracing
                raise TrainingCaptureError(_describe_trace_failure(error)) from None
        late = late_registered_entries(decompositions, graph_module)
        if not late:
            break
        decompositions = {**decompositions, **late}
    # Graph edits only: _exported_from_graph lints, and the ExportedProgram
    # generates the code once.
    _drop_profiler_nodes(graph_module)
    _unchanged_state_copied(graph_module)
    _kept_at_zero_lr(graph_module, slots, _params_kept_at_zero_lr(optimizer, [param_fqn[id(p)] for p in opt_params]))
    _scalar_alphas_to_tensors(graph_module, stack_traces)
    _views_to_reshapes(graph_module)
    _refuse_closed_over_writes(graph_module)

    example_inputs = (*lr_examples, *batch_leaves)
    input_names = _input_names(step_fn, batch_leaves, batch_spec, lr_count)
    try:  # the captured graph as it is: no second trace by torch.export
        with lazy_graph_modules(), lazy_exported_programs(), signature_checked_once():
            exported = _exported_from_graph(
                graph_module, slots, initial, example_inputs, input_names, result_structure[-1]
            )
    except Exception as error:
        raise TrainingCaptureError(f"the captured step is not a valid exported program: {error}") from None
    hyperparameters = tuple(_hyperparameters(g) for g in optimizer.param_groups)
    return CapturedTrainingStep(
        exported, tuple(slots), lr_count, batch_spec, hyperparameters, tuple(opt_params), cleared[-1]
    )


def _check_step_results(
    result: Any, leaves: list[Any], state: list[torch.Tensor], batch: list[torch.Tensor]
) -> None:
    """The step's return value must be tensors in a pytree (the loss, or
    e.g. ``(loss, logits)``, ``{"loss": loss, "grad_norm": norm}``, a
    ``ModelOutput``) that the step computed: a parameter, buffer, optimizer
    state, gradient or batch input (or a view of one) is refused, since
    eager returns that very tensor, which later steps change or the caller
    owns, while a compiled step can only return a new one."""
    if result is None or not leaves:
        raise TrainingCaptureError(
            f"step_fn returned {type(result).__name__} with no tensor in it; it must return the loss "
            "(a tensor) or a tuple, list or dict of tensors"
        )
    state_storage = {t.untyped_storage()._cdata for t in state}
    batch_storage = {t.untyped_storage()._cdata for t in batch}
    for path, leaf in pytree.tree_flatten_with_path(result)[0]:
        where = f"step_fn's result{pytree.keystr(path)}"
        if not isinstance(leaf, torch.Tensor):
            raise TrainingCaptureError(
                f"{where} is {leaf!r:.60} (type {type(leaf).__name__}); a compiled step returns tensors only: "
                "return a tensor there or leave the entry out"
            )
        storage = leaf.untyped_storage()._cdata
        if storage in state_storage:
            raise TrainingCaptureError(
                f"{where} is a parameter, buffer, gradient or optimizer state of the step (or a view of one): "
                "eager returns that tensor itself, which later steps change, while a compiled step returns new "
                "tensors only; return a copy (.detach().clone()) or read it from the model after the call"
            )
        if storage in batch_storage:
            raise TrainingCaptureError(
                f"{where} is an input of the step (or a view of one): eager returns the caller's own tensor, "
                "while a compiled step returns new tensors only; return a copy (.detach().clone())"
            )


def _input_names(step_fn: Callable[..., Any], batch_leaves: list[Any], batch_spec: Any, lr_count: int) -> list[str]:
    """Names of the step's inputs as errors show them: ``lr`` (``lr_0``,
    ``lr_1``... with several param groups), then each batch leaf by
    ``step_fn``'s parameter (``x``; ``pair_0`` for a leaf nested in a
    tuple argument ``pair``; ``batch_2`` past the named parameters)."""
    try:
        parameters = list(inspect.signature(step_fn).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = next((p.name for p in parameters if p.kind == p.VAR_POSITIONAL), "batch")
    taken: set[str] = set()

    def unique(name: str) -> str:
        name = re.sub(r"\W", "_", name)
        name = name if name.isidentifier() else f"_{name}"
        candidate, suffix = name, 1
        while candidate in taken:
            candidate, suffix = f"{name}_{suffix}", suffix + 1
        taken.add(candidate)
        return candidate

    batch_names = []
    for path, _leaf in pytree.tree_flatten_with_path(pytree.tree_unflatten(batch_leaves, batch_spec))[0]:
        top = getattr(path[0], "idx", 0)
        base = positional[top] if top < len(positional) else f"{variadic}_{top}"
        rest = [str(getattr(key, "idx", getattr(key, "key", getattr(key, "name", key)))) for key in path[1:]]
        batch_names.append(unique("_".join([base, *rest])))
    lr_names = [unique("lr" if lr_count == 1 else f"lr_{index}") for index in range(lr_count)]
    return [*lr_names, *batch_names]


_CLOSED_OVER_WRITE = (
    "the step writes in place ({what}) to a tensor it closes over, which is not a parameter, buffer or "
    "optimizer state of the model nor an argument of the step: the compiled step would lose the write. "
    "Register the tensor as a buffer of the model (model.register_buffer) or pass it to the step as an "
    "argument."
)


#: ``Tensor.unfold``'s arguments after the tensor, to read them however
#: the step's code passed them.
_UNFOLD_ARGUMENTS = inspect.signature(lambda dimension, size, step: None)


class _ClosedOverWrites(torch.overrides.TorchFunctionMode):
    """Active while the step's code runs in the capture, where every
    parameter, buffer, optimizer state and argument is a traced tensor: a
    plain tensor is one the step closes over.  The trace reads those as
    constants (at their value at each call, as eager does), but a write to
    one is stopped before it happens (the caller's tensor stays as it was;
    the compiled step could not keep the write).  It also routes
    ``ctc_loss`` calls to their decomposition (module docstring), and
    interpolation, ``grid_sample`` and replication padding to torch's
    decompositions above autograd
    (:mod:`hloalias.frontend.differentiable_forwards`)."""

    def __init__(self) -> None:
        super().__init__()
        #: Views (by id, with the tensor kept alive) of ``unfold`` windows
        #: that do not tile their dimension, and the refusal a write to
        #: one of them gets: functionalization would zero what no window
        #: covers (importer.lossy_unfold_write_message).
        self.lossy_windows: dict[int, tuple[torch.Tensor, str]] = {}

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if is_ctc_loss_call(func):
            return ctc_loss_call(func, args, kwargs or {})
        if is_differentiable_forward_call(func):
            return differentiable_call(func, args, kwargs or {})
        name = getattr(func, "__name__", "")
        if single_trace.is_write(name, kwargs) or single_trace.mutable_op(func):
            written = [args[0]] if args else []
            written += [leaf for leaf in pytree.tree_leaves((kwargs or {}).get("out")) if leaf is not None]
            if any(isinstance(t, torch.Tensor) and type(t) in (torch.Tensor, torch.nn.Parameter) for t in written):
                raise TrainingCaptureError(_CLOSED_OVER_WRITE.format(what=name or repr(func)))
            for tensor in written:
                refusal = self._refusal_of(tensor)
                if refusal is not None:
                    raise TrainingCaptureError(refusal)
        result = func(*args, **(kwargs or {}))
        # ``Tensor.unfold`` (windows, a view), not ``F.unfold`` (im2col, a copy), also named "unfold".
        if func is torch.Tensor.unfold and args and isinstance(args[0], torch.Tensor) and isinstance(result, torch.Tensor):
            self._note_unfold(args, kwargs or {}, result)
        elif self.lossy_windows:
            self._note_views(args, result)
        return result

    def _refusal_of(self, tensor: Any) -> str | None:
        """The refusal a write to ``tensor`` gets, if it is lossy windows
        (the id is checked against the tensor kept alive with it)."""
        entry = self.lossy_windows.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None

    def _note_unfold(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: torch.Tensor) -> None:
        bound = _UNFOLD_ARGUMENTS.bind(*args[1:], **kwargs)
        dim, size, step = (int(bound.arguments[k]) for k in ("dimension", "size", "step"))
        base = args[0]
        length = int(base.shape[dim]) if base.dim() else 1
        if not unfold_covers(length, size, step):
            where = innermost_on_stack()
            self.lossy_windows[id(result)] = (result, lossy_unfold_write_message(dim, size, step, length, where))

    def _note_views(self, args: tuple[Any, ...], result: Any) -> None:
        """A view of lossy windows (``u[:, 0]``, ``u.t()``) inherits their refusal."""
        refusals = [refusal for refusal in map(self._refusal_of, args) if refusal is not None]
        if not refusals:
            return
        for leaf in pytree.tree_leaves(result):
            if isinstance(leaf, torch.Tensor) and leaf._is_view():
                self.lossy_windows[id(leaf)] = (leaf, refusals[0])


def _refuse_closed_over_writes(graph_module: torch.fx.GraphModule) -> None:
    """The graph's side of :class:`_ClosedOverWrites`: an operator that
    writes a constant of the trace (a write the Python-level check did not
    see, e.g. from a C++ kernel) is refused too."""
    for node in graph_module.graph.nodes:
        target = node.target
        if (
            node.op == "call_function"
            and isinstance(target, torch._ops.OpOverload)
            and target._schema.is_mutable
            and any(isinstance(arg, torch.fx.Node) and arg.op == "get_attr" for arg in node.args)
        ):
            raise TrainingCaptureError(_CLOSED_OVER_WRITE.format(what=target))


def _describe_trace_failure(error: BaseException) -> str:
    """The construct (first line of torch's message) and the program's line
    it was raised under (a library model's own line, and the caller's)."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    lowered = str(error).lower()
    origin = data_dependent_size_origin(error)
    if origin is not None:
        # Raised where torch decides on the size (often in autograd's
        # backward, under loss.backward()): the line to change is the one
        # that made it.
        return (
            "cannot capture the training step as one graph: a size that depends on a tensor's values "
            f"(a boolean mask selection `x[mask]`, `nonzero()`, `unique()`), made at {origin.partition(' at ')[2]}, "
            f"is used{where_raised(error)}; an XLA program has static shapes: compute over the full shape instead "
            "(`torch.where(mask, x, 0).sum() / mask.sum()` for `x[mask].mean()`)"
            f"\n  torch: {message}"
        )
    if "data-dependent" in lowered or "data dependent" in lowered or "guardondatadependent" in type(error).__name__.lower():
        construct = "data-dependent control flow or a host read of a traced value (.item(), bool(), print)"
    else:
        construct = type(error).__name__
    return (
        f"cannot capture the training step as one graph: {construct}{where_raised(error)}"
        f"\n  torch: {message}"
    )


@contextlib.contextmanager
def _tracing_flag() -> Iterator[None]:
    """``torch.compiler.is_compiling()`` is True while tracing, as under
    ``torch.compile``: the optimizer then keeps a tensor ``lr`` in the
    graph and skips its eager-only device checks for ``capturable``."""
    previous = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = previous


def _params_kept_at_zero_lr(optimizer: torch.optim.Optimizer, fqns: list[str]) -> dict[str, int]:
    """The parameter group (its ``lr`` input) of each parameter whose new
    value must be its old one where ``lr == 0``, by parameter name.

    Adam's and AdamW's ``capturable`` update (the form a traced ``lr``
    needs) divides by ``lr / bias_correction1``: at ``lr == 0`` (step 0 of
    every linear warmup) an element whose gradient and second moment are
    0 (an embedding row not in the batch) becomes 0/0, NaN, where eager
    adds ``-0 * exp_avg / denom`` and keeps the parameter (AdamW's decay
    multiplies by ``1 - 0 * weight_decay``).  Their state still updates, as
    in eager.  (Other optimizers' capturable forms do not divide by
    ``lr``.)  A group traced with eager's own formula
    (:func:`hloalias.frontend.optimizer_exact.group_uses_eager_form`) needs
    no guard: it computes what eager does at ``lr == 0`` too (``-0.0``
    parameters becoming ``0.0``, NaN where ``eps == 0`` and an element's
    moments are 0)."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return {}
    kept: dict[str, int] = {}
    position = 0
    for index, group in enumerate(optimizer.param_groups):
        if not group_uses_eager_form(group):
            for fqn in fqns[position:position + len(group["params"])]:
                kept[fqn] = index
        position += len(group["params"])
    return kept


def _kept_at_zero_lr(graph_module: torch.fx.GraphModule, slots: list[StateSlot], groups: dict[str, int]) -> None:
    """Each parameter in ``groups`` (name -> its group's ``lr`` input) gets
    ``where(lr == 0, old value, new value)`` as its new value: one
    ``lr == 0`` per group.  Graph edits after tracing, on make_fx's
    placeholders (state slots, then learning rates, then the batch: the
    old values), not traced ops: each traced op costs the trace more than
    the whole edit."""
    if not groups:
        return
    graph = graph_module.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    outputs = list(output.args[0])
    lr_is_zero: dict[int, torch.fx.Node] = {}
    for position, slot in enumerate(slots):
        group = groups.get(slot.fqn) if slot.kind == "param" else None  # type: ignore[arg-type]
        if group is None:
            continue
        with graph.inserting_before(output):
            if group not in lr_is_zero:
                lr = placeholders[len(slots) + group]
                lr_is_zero[group] = graph.call_function(torch.ops.aten.eq.Scalar, (lr, 0))
                lr_is_zero[group].meta["val"] = torch.ops.aten.eq.Scalar(lr.meta["val"], 0)
            new = outputs[position]
            kept = graph.call_function(torch.ops.aten.where.self, (lr_is_zero[group], placeholders[position], new))
            kept.meta["val"] = torch.ops.aten.where.self(
                lr_is_zero[group].meta["val"], placeholders[position].meta["val"], new.meta["val"]
            )
        outputs[position] = kept
    output.args = (type(output.args[0])(outputs),)


@contextlib.contextmanager
def _optimizer_pointed_at(
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    state: list[dict[str, Any]],
    lrs: list[torch.Tensor],
) -> Iterator[None]:
    """The optimizer works on ``params`` with ``state`` and tensor ``lr``
    for the duration; everything is put back afterwards."""
    saved_state = dict(optimizer.state)
    saved_groups = [dict(group) for group in optimizer.param_groups]
    try:
        optimizer.state.clear()
        position = 0
        for group, lr in zip(optimizer.param_groups, lrs):
            count = len(group["params"])
            group["params"] = params[position:position + count]
            for p, entries in zip(group["params"], state[position:position + count]):
                optimizer.state[p] = entries
            position += count
            group[LR_KEY] = lr
            if "capturable" in group and not eager_formula_optimizer(optimizer):
                # (Adam, AdamW, Adamax, NAdam, RAdam and ASGD keep the
                # user's setting: frontend/optimizer_exact.py traces eager's
                # formula for ``capturable=False``.)
                group["capturable"] = True
            if group.get("foreach"):
                # The per-tensor update (torch's default for CPU tensors):
                # the same formula as foreach's list ops, which the importer
                # has no lowering for (aten._foreach_add.Scalar).
                group["foreach"] = False
        yield
    finally:
        optimizer.state.clear()
        optimizer.state.update(saved_state)
        for group, saved in zip(optimizer.param_groups, saved_groups):
            group.clear()
            group.update(saved)


def _check_groups(optimizer: torch.optim.Optimizer) -> None:
    for index, group in enumerate(optimizer.param_groups):
        if group.get("fused"):
            raise TrainingCaptureError(f"param group {index}: fused=True is not supported; use the default foreach")
        if group.get("differentiable"):
            raise TrainingCaptureError(f"param group {index}: differentiable=True is not supported")
        lr = group.get(LR_KEY)
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise TrainingCaptureError(f"param group {index}: lr must be a number or a 1-element tensor")


def _lr_dtype(group: dict[str, Any], optimizer: torch.optim.Optimizer) -> torch.dtype:
    """The dtype of a param group's lr input: float64 when the group holds
    a float64 parameter or its optimizer's update is traced with eager's
    formula (:func:`hloalias.frontend.optimizer_exact.eager_formula_optimizer`), else float32.  Eager
    applies lr as a Python float (a double) to float64 parameters; a
    float32 lr rounds it (1e-2 by 2.2e-8 relative), and every update of a
    float64 model drifted from eager's by that much.  Adam computes
    ``lr / bias_correction1`` in doubles before rounding the quotient to a
    float32 parameter's dtype (frontend/optimizer_exact.py), and so do the
    others with eager kernels there; SGD's, RMSprop's, Adadelta's and
    Rprop's float32 parameters see lr rounded to float32 in eager too."""
    if eager_formula_optimizer(optimizer) or any(p.dtype == torch.float64 for p in group["params"]):
        return torch.float64
    return torch.float32


def _lr_value(group: dict[str, Any]) -> float:
    lr = group[LR_KEY]
    return float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)


def _hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    """The group's settings that are baked into the graph (all but params and lr)."""
    return {k: _frozen(v) for k, v in group.items() if k not in ("params", LR_KEY)}


def _frozen(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return tuple(value.detach().flatten().tolist())
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _initial_optimizer_state(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], indices: Sequence[int] | None = None
) -> list[dict[str, torch.Tensor]]:
    """Per-parameter optimizer state as tensors (copies), created where the
    optimizer has none yet and the first step equals a step from zeros;
    none for a frozen parameter without state (eager creates none).
    Errors name ``params[i]`` as parameter ``indices[i]`` (default ``i``)."""
    states: list[dict[str, torch.Tensor]] = []
    group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    for index, p in zip(range(len(params)) if indices is None else indices, params):
        existing = optimizer.state.get(p, {})
        group = group_of[id(p)]
        if existing:
            entries = {}
            for key, value in existing.items():
                if not isinstance(value, torch.Tensor):
                    if key == "step":
                        value = torch.tensor(float(value), dtype=torch.float32)
                    else:
                        raise TrainingCaptureError(
                            f"optimizer state '{key}' of parameter {index} is {type(value).__name__}, not a tensor"
                        )
                entries[key] = value.detach().clone()
            states.append(entries)
            continue
        if not p.requires_grad:
            # Frozen: eager's optimizer skips it (no gradient) and creates no
            # state for it, so neither does the step (an unfrozen parameter
            # is captured again, with its fresh state then).
            states.append({})
            continue
        states.append(_fresh_state(optimizer, group, p, index))
    return states


def _fresh_state(
    optimizer: torch.optim.Optimizer, group: dict[str, Any], p: torch.Tensor, index: int
) -> dict[str, torch.Tensor]:
    kind = type(optimizer)
    if kind is torch.optim.SGD:
        if group.get("momentum", 0) == 0:
            return {}
        if group.get("dampening", 0) != 0:
            raise TrainingCaptureError(
                "SGD with dampening != 0 starts its momentum from the first gradient, not from zeros: "
                "run one eager step before compiling"
            )
        return {"momentum_buffer": torch.zeros_like(p.detach(), memory_format=torch.contiguous_format)}
    # What each optimizer's ``_init_group`` creates before its first step
    # (zeros, a step count of 0, NAdam's running product of 1).  ASGD's
    # ``eta`` and Rprop's ``step_size`` start from the lr of the first step,
    # which a scheduler may still change after compiling: not built here.
    def zeros() -> torch.Tensor:
        return torch.zeros_like(p.detach(), memory_format=torch.contiguous_format)

    # Step counts and NAdam's product in torch's ``_get_scalar_dtype()``:
    # float64 under a float64 default dtype (a float32 ``mu_product`` moved
    # a float64 NAdam 2e-10 off eager's in 4 steps).
    scalar_dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    step = torch.tensor(0.0, dtype=scalar_dtype)
    if kind in (torch.optim.Adam, torch.optim.AdamW, torch.optim.RAdam):
        entries = {"step": step, "exp_avg": zeros(), "exp_avg_sq": zeros()}
        if group.get("amsgrad"):
            entries["max_exp_avg_sq"] = zeros()
        return entries
    if kind is torch.optim.NAdam:
        return {"step": step, "mu_product": torch.tensor(1.0, dtype=scalar_dtype), "exp_avg": zeros(), "exp_avg_sq": zeros()}
    if kind is torch.optim.Adamax:
        return {"step": step, "exp_avg": zeros(), "exp_inf": zeros()}
    if kind is torch.optim.Adadelta:
        return {"step": step, "square_avg": zeros(), "acc_delta": zeros()}
    if kind is torch.optim.RMSprop:
        entries = {"step": step, "square_avg": zeros()}
        if group.get("momentum", 0) > 0:
            entries["momentum_buffer"] = zeros()
        if group.get("centered"):
            entries["grad_avg"] = zeros()
        return entries
    raise TrainingCaptureError(
        f"{kind.__name__} has no state for parameter {index} yet and hloalias does not know its initial "
        "state: run one eager step before compiling (SGD, Adam, AdamW, RAdam, NAdam, Adamax, Adadelta and "
        "RMSprop are initialized here; Adagrad initializes itself)"
    )


def _drop_profiler_nodes(graph_module: torch.fx.GraphModule) -> None:
    """``record_function`` markers of the optimizer are not computation."""
    graph = graph_module.graph
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and str(node.target).startswith("profiler."):
            for user in list(node.users):
                graph.erase_node(user)
            if node in graph.nodes:
                graph.erase_node(node)


def _unchanged_state_copied(graph_module: torch.fx.GraphModule) -> None:
    """A state the step does not update (a frozen parameter's optimizer
    state) is returned as the input itself: it becomes a ``clone`` of it,
    as it was when the wrapper cloned every state before the step, so
    that every new state is a value the program computes."""
    graph = graph_module.graph
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    copies: dict[torch.fx.Node, torch.fx.Node] = {}

    def copied(value: Any) -> Any:
        if not (isinstance(value, torch.fx.Node) and value.op == "placeholder"):
            return value
        if value not in copies:
            with graph.inserting_before(output):
                copies[value] = graph.call_function(torch.ops.aten.clone.default, (value,))
            copies[value].meta = dict(value.meta)
        return copies[value]

    output.args = (pytree.tree_map(copied, output.args[0]),)


_ALPHA_OPS = {
    torch.ops.aten.add.Tensor: torch.ops.aten.add.Tensor,
    torch.ops.aten.add_.Tensor: torch.ops.aten.add_.Tensor,
    torch.ops.aten.sub.Tensor: torch.ops.aten.sub.Tensor,
    torch.ops.aten.sub_.Tensor: torch.ops.aten.sub_.Tensor,
}


def _scalar_alphas_to_tensors(graph_module: torch.fx.GraphModule, stack_traces: bool = True) -> None:
    """``param.add_(grad, alpha=-lr)`` with a tensor ``lr`` reads ``lr`` on
    the host (``_local_scalar_dense``), which XLA cannot run; it becomes
    ``param.add_(grad * -lr)``.  Any other host read left in the graph is a
    :class:`TrainingCaptureError` naming the line (:class:`_HostReadUntraced`
    when the graph was traced without ``stack_traces``)."""
    graph = graph_module.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.aten._local_scalar_dense.default:
            continue
        (source,) = node.args
        for user in list(node.users):
            if user.target in _ALPHA_OPS and user.kwargs.get("alpha") is node and len(user.args) == 2:
                with graph.inserting_before(user):
                    scaled = graph.call_function(torch.ops.aten.mul.Tensor, (user.args[1], source))
                    scaled.meta = dict(user.meta)
                user.args = (user.args[0], scaled)
                user.kwargs = {k: v for k, v in user.kwargs.items() if k != "alpha"}
            elif _scales_by(user, node) and _floating(source):
                # ``param.addcdiv_(grad, std, value=-clr)`` with a tensor
                # ``clr`` (Adagrad's step-dependent rate) decomposes to
                # ``grad * value``: the 0-d tensor itself is that operand
                # (a 0-d tensor promotes as the Python number does).
                user.args = (user.args[0], source)
        if node.users:
            if not stack_traces:
                raise _HostReadUntraced()
            trace = node.meta.get("stack_trace") or ""
            raise TrainingCaptureError(
                "cannot capture the training step as one graph: a traced tensor is read on the host "
                f"(.item() / float()){_last_user_frame(trace)}"
            )
        graph.erase_node(node)


#: Arithmetic whose second operand may be a 0-d tensor in place of the number.
_SCALED_OPS = (torch.ops.aten.mul.Tensor, torch.ops.aten.div.Tensor)


def _scales_by(user: torch.fx.Node, scalar: torch.fx.Node) -> bool:
    """Whether ``user`` is ``tensor * scalar`` or ``tensor / scalar`` of
    a traced tensor by the host-read number ``scalar`` (and nothing else)."""
    return (
        user.op == "call_function" and user.target in _SCALED_OPS and len(user.args) == 2 and not user.kwargs
        and user.args[1] is scalar and isinstance(user.args[0], torch.fx.Node) and user.args[0] is not scalar
        and _floating(user.args[0])
    )


def _floating(node: Any) -> bool:
    """Whether ``node``'s traced value is a floating-point tensor."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


def _last_user_frame(stack_trace: str) -> str:
    """`` at FILE:LINE in FUNCTION: CODE`` for the innermost program frame
    of an FX node's ``stack_trace`` (frontend/program_frames.py), else empty."""
    where = innermost_in_stack_trace(stack_trace)
    return f" at {where}" if where is not None else ""


def _views_to_reshapes(graph_module: torch.fx.GraphModule) -> None:
    """``aten.view`` is valid only for the strides seen while tracing; the
    exported graph is decomposed again, where a transposed gradient may get
    other strides and the view would fail.  A view no in-place op reaches
    (through any chain of aliases) is a reshape: same value, no aliasing
    observable."""
    graph = graph_module.graph
    parent: dict[torch.fx.Node, torch.fx.Node] = {}

    def root(node: torch.fx.Node) -> torch.fx.Node:
        while node in parent:
            node = parent[node]
        return node

    mutated_roots: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        if schema.arguments and node.args and isinstance(node.args[0], torch.fx.Node):
            first = schema.arguments[0]
            if first.alias_info is not None:
                if first.alias_info.is_write:
                    mutated_roots.add(node.args[0])
                elif schema.returns and schema.returns[0].alias_info is not None:
                    parent[node] = node.args[0]  # a view: same storage as its input
        for argument, value in zip(schema.arguments[1:], node.args[1:]):
            if argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, torch.fx.Node):
                mutated_roots.add(value)
    mutated = {root(node) for node in mutated_roots}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target == torch.ops.aten.view.default and root(node) not in mutated:
            node.target = torch.ops.aten.reshape.default


def _exported_from_graph(
    graph_module: torch.fx.GraphModule,
    slots: list[StateSlot],
    initial: dict[str, torch.Tensor],
    example_inputs: tuple[torch.Tensor, ...],
    input_names: list[str],
    result_spec: Any,
) -> ExportedProgram:
    """The ``make_fx`` graph of ``functional(flat_state, lrs, batch)`` as an
    ``ExportedProgram`` whose buffers are the state slots (each mutated to
    its new value) and whose user inputs are the learning rates and the
    batch, with each state slot's value written back to it: what
    ``torch.export`` of a module holding the state as buffers would give,
    without tracing the graph again.  make_fx's placeholders come in that order already
    (state, learning rates, batch); the output ``([new values], [results])`` is
    flattened to ``(*new values, *results)``, and ``result_spec`` (the step's
    return structure) is the program's output tree."""
    graph = graph_module.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    if len(placeholders) != len(slots) + len(example_inputs):
        raise TrainingCaptureError(
            f"the captured step has {len(placeholders)} inputs, expected {len(slots) + len(example_inputs)}"
        )
    # The step's inputs named as the user knows them (``lr``, then
    # ``step_fn``'s parameters: :func:`_input_names`), which errors and
    # reports show.
    for node, name in zip(placeholders[len(slots):], input_names):
        node._rename(name)
    constants = _lift_tensor_constants(graph_module, placeholders[len(slots)])
    eliminate_dead_code(graph)
    for node in graph.nodes:  # make_fx leaves the unused results of multi-output ops without a value
        if "val" not in node.meta and node.target is operator.getitem:
            node.meta["val"] = node.args[0].meta["val"][node.args[1]]
    output = next(node for node in graph.nodes if node.op == "output")
    flat_outputs = pytree.tree_leaves(output.args[0])
    result_count = result_spec.num_leaves
    if len(flat_outputs) != len(slots) + result_count or not all(isinstance(n, torch.fx.Node) for n in flat_outputs):
        raise TrainingCaptureError(
            f"the captured step returns {output.args[0]!r}, expected the new state and the step's results"
        )
    new_values, results = flat_outputs[: len(slots)], flat_outputs[len(slots):]
    output.args = (tuple(flat_outputs),)
    graph_module._out_spec = None  # the flat outputs are the program's: no make_fx output tree
    # (No lint here: the ExportedProgram's verifier lints this graph.)
    graph_module.recompile()
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
    from torch.export.graph_signature import (
        ExportGraphSignature, InputKind, InputSpec, OutputKind, OutputSpec, TensorArgument,
    )

    input_specs = [
        InputSpec(InputKind.BUFFER, TensorArgument(node.name), slot.name, persistent=True)
        for node, slot in zip(placeholders, slots)
    ] + [
        InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), name)
        for name, (node, _) in constants.items()
    ] + [
        InputSpec(InputKind.USER_INPUT, TensorArgument(node.name), None)
        for node in placeholders[len(slots):]
    ]
    output_specs = [
        OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(node.name), slot.name)
        for node, slot in zip(new_values, slots)
    ] + [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(node.name), None) for node in results]
    in_spec = pytree.tree_flatten((example_inputs, {}))[1]
    call = ModuleCallSignature(inputs=[], outputs=[], in_spec=in_spec, out_spec=result_spec)
    exported = ExportedProgram(
        root=graph_module,
        graph=graph,
        graph_signature=ExportGraphSignature(input_specs, output_specs),
        state_dict={slot.name: initial[slot.name] for slot in slots},  # copies made for the capture
        range_constraints={},
        module_call_graph=[ModuleCallEntry("", call)],
        example_inputs=(example_inputs, {}),
        constants={name: tensor for name, (_, tensor) in constants.items()},
    )
    # Traced functional and with the importer's decompositions applied:
    # import_torch skips its decomposition retrace.
    exported.hloalias_decomposed = True  # type: ignore[attr-defined]
    return exported


def _lift_tensor_constants(
    graph_module: torch.fx.GraphModule, first_user_input: torch.fx.Node
) -> dict[str, tuple[torch.fx.Node, torch.Tensor]]:
    """Replace each ``get_attr`` of a tensor (a constant the step created,
    e.g. ``torch.tensor(0.5)``) by a placeholder before the user inputs, as
    ``torch.export`` lifts them; returns name -> (placeholder, tensor)."""
    graph = graph_module.graph
    fake_mode = next(
        (n.meta["val"].fake_mode for n in graph.nodes
         if n.op == "placeholder" and hasattr(n.meta.get("val"), "fake_mode")),
        None,
    )
    lifted: dict[str, tuple[torch.fx.Node, torch.Tensor]] = {}
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        target = str(node.target)
        if target in lifted:  # a constant read twice (a closed-over tensor): one placeholder
            node.replace_all_uses_with(lifted[target][0])
            graph.erase_node(node)
            continue
        value = getattr(graph_module, target, None)
        if not isinstance(value, torch.Tensor):
            continue
        with graph.inserting_before(first_user_input):
            placeholder = graph.placeholder(f"c_{target}")
        placeholder.meta = dict(node.meta)
        if "val" not in placeholder.meta and fake_mode is not None:
            placeholder.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
        node.replace_all_uses_with(placeholder)
        graph.erase_node(node)
        lifted[target] = (placeholder, value)
    for target in lifted:
        delattr(graph_module, target)
    return lifted
