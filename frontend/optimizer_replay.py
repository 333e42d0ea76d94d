"""Trace an optimizer's per-parameter update once per class of parameters.

The training capture traces ``optimizer.step()`` with the rest of the step;
torch's Adam, AdamW and SGD update one parameter at a time (or per
``foreach`` list, which decomposes to the same per-tensor operators), so
the trace pays the update's operators once per parameter: the largest
piece of a first capture.

While :func:`replayed_updates` is active, the functional optimizer
kernels (``_single_tensor_adam``, ``_multi_tensor_adam``,
``_single_tensor_sgd``, ``_multi_tensor_sgd``) are replaced by a wrapper
that emits, per parameter, one node of the opaque operator
``hloalias::optimizer_update`` that mutates the parameter and its state
(functionalized to one ``auto_functionalized_v2`` node) and reads the
gradient and the learning rate.  Parameters whose update is the same
program up to the shape form a class: same kernel, same settings (every
keyword but a tensor ``lr``), same lists, and per tensor the same dtype,
device and role (parameter-shaped or a fixed shape such as the 0-d step
counter), all contiguous and strided.

:func:`expand_replayed_updates` then traces each class's update once,
with the kernel itself on one-element lists and the capture's
decompositions, and copies its nodes in place of every node of the class
with the parameter's shape substituted.  It does so only where that is
exact: every operator of the update pointwise (or a copy, clone or dtype
conversion), every value parameter-shaped or of the fixed shape the
tensors had, and no list argument; it raises :class:`ReplayRefused`
otherwise (the capture then traces again without replay).  The expanded
graph holds the same operators on the same values as the full trace.

A call with anything else (a gradient scaler's ``grad_scale``, a tensor
hyperparameter other than ``lr``, complex or sparse or non-contiguous
tensors, a missing momentum buffer) runs the kernel itself: the full
trace.

A class's traced update (its template) is kept for later captures in the
process (:func:`template_cache_stats`): a second capture of the same
model and optimizer (a new batch shape, a step recompiled) traces no
update.  The key is everything the template's trace reads: the kernel
object, every setting (floats by their bits: ``-0.0`` is not ``0.0``),
which lists are present, each tensor's dtype, role, shape and device (the
member the template was traced with), the decomposition table's entries
and torch's default dtype; anything else misses and traces.  A template
found is checked (:func:`_check_template`) as a new one is.  At most
``HLOALIAS_OPTIMIZER_TEMPLATE_CACHE_SIZE`` templates (64; read at each new
template, 0 keeps none) are kept, least recently used dropped first."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode, dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from hloalias import config
from hloalias.lru import BoundedLRU
from hloalias.frontend.torch_internals import make_fx_without_torch_fn_metadata

aten = torch.ops.aten


class ReplayRefused(Exception):
    """A class's update is not shape-generic: capture without replay."""


#: (module, kernel name, index of the read-only gradient list) of the kernels replaced.
_KERNELS = (
    ("torch.optim.adam", "_single_tensor_adam"),
    ("torch.optim.adam", "_multi_tensor_adam"),
    ("torch.optim.sgd", "_single_tensor_sgd"),
    ("torch.optim.sgd", "_multi_tensor_sgd"),
)
_GRADS = 1  # position of the gradient list in every kernel (read only)
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
#: Non-pointwise operators an update may contain (the ``*_like`` ones take
#: their shape from a tensor; the others only with an empty shape list:
#: 0-d values, e.g. the reference ``lerp``'s weight for bfloat16).
_ALSO_ALLOWED = frozenset({
    aten.copy.default, aten.clone.default, aten._to_copy.default, aten.alias.default,
    aten._local_scalar_dense.default, aten.empty_like.default, aten.full_like.default,
    aten.zeros_like.default, aten.ones_like.default, aten.fill.Scalar,
    aten.empty_strided.default, aten.full.default, aten.scalar_tensor.default, aten.empty.memory_format,
})

#: Class keys whose update was refused once (with the classes of the same
#: trace not checked yet): their kernel calls trace in full in later
#: captures, which then need no second trace.
_REFUSED: set[Any] = set()


@dataclasses.dataclass
class TemplateCacheStats:
    """Counters of the template cache (live object)."""

    hits: int = 0
    misses: int = 0


#: The default of ``HLOALIAS_OPTIMIZER_TEMPLATE_CACHE_SIZE``.
_TEMPLATE_LIMIT = 64


def _template_limit() -> int:
    """How many templates are kept: ``HLOALIAS_OPTIMIZER_TEMPLATE_CACHE_SIZE``
    (else ``_TEMPLATE_LIMIT``), read at each new template; 0 keeps none."""
    configured = config.integer("HLOALIAS_OPTIMIZER_TEMPLATE_CACHE_SIZE")
    return _TEMPLATE_LIMIT if configured is None else configured


#: Templates kept for later captures, by :func:`_template_key`; the least
#: recently used goes past :func:`_template_limit`.
_TEMPLATES: "BoundedLRU[Any, torch.fx.GraphModule]" = BoundedLRU(_template_limit)
_TEMPLATES_LOCK = threading.Lock()
_TEMPLATE_STATS = TemplateCacheStats()


def template_cache_stats() -> TemplateCacheStats:
    """The process's template cache counters (live object)."""
    return _TEMPLATE_STATS


def clear_template_cache() -> None:
    """Drop every kept template and reset the counters."""
    with _TEMPLATES_LOCK:
        _TEMPLATES.clear()
        _TEMPLATE_STATS.hits = _TEMPLATE_STATS.misses = 0


@functools.cache
def _update_op() -> Any:
    """``hloalias::optimizer_update(state, inputs, classes) -> new state``:
    the updates of the parameters of one kernel call (each one's state and
    inputs concatenated in order, ``classes`` one per parameter), opaque
    while tracing (it is expanded, never run)."""

    @torch.library.custom_op("hloalias::optimizer_update", mutates_args=())
    def optimizer_update(
        state: list[torch.Tensor], inputs: list[torch.Tensor], classes: list[int]
    ) -> list[torch.Tensor]:
        raise RuntimeError("hloalias::optimizer_update is expanded after tracing and never runs")

    @optimizer_update.register_fake
    def _(state: list[torch.Tensor], inputs: list[torch.Tensor], classes: list[int]) -> list[torch.Tensor]:
        return [torch.empty_like(t) for t in state]

    return torch.ops.hloalias.optimizer_update.default


_Spec = tuple[torch.Size, torch.dtype, torch.device]


@dataclasses.dataclass
class _Class:
    """One class: the kernel, its keyword settings (``lr`` a placeholder
    when a tensor), which lists are present, and one member's tensors
    (state then inputs) to trace the update with."""

    key: Any
    kernel: Callable[..., Any]
    kwargs: dict[str, Any]
    list_count: int
    present: tuple[int, ...]  # indices of the non-empty lists
    tensor_lr: bool
    state_examples: tuple[_Spec, ...]
    input_examples: tuple[_Spec, ...]
    template: Any = None


@dataclasses.dataclass
class Replay:
    """The classes seen during one trace, by id."""

    classes: list[_Class] = dataclasses.field(default_factory=list)
    index: dict[Any, int] = dataclasses.field(default_factory=dict)


def _tensor_key(tensor: Any, param: torch.Tensor) -> Any:
    """A tensor's part of the class key, or None when it is not replayable."""
    if not isinstance(tensor, FunctionalTensor) or tensor.layout != torch.strided or tensor.is_sparse:
        return None
    if tensor.dtype not in _DTYPES or tensor.device != param.device or not tensor.is_contiguous():
        return None
    role = "P" if tensor.shape == param.shape and tensor.dim() > 0 else tuple(tensor.shape)
    return (tensor.dtype, role)


def _settings_key(kwargs: dict[str, Any]) -> Any:
    key: list[tuple[Any, ...]] = []
    for name in sorted(kwargs):
        value = kwargs[name]
        if name == "lr" and isinstance(value, torch.Tensor):
            if value.dim() != 0 or value.dtype not in (torch.float32, torch.float64):  # float64: a float64 group's lr
                return None
            key.append((name, "tensor"))
        elif value is None or isinstance(value, (bool, int, float, str)):
            key.append((name, type(value).__name__, value))
        else:
            return None
    return tuple(key)


def _wrapper(kernel: Callable[..., Any], replay: Replay) -> Callable[..., Any]:
    op = _update_op()

    @functools.wraps(kernel)
    def replayed(*lists: Any, **kwargs: Any) -> Any:
        if kwargs.get("grad_scale") is not None or kwargs.get("found_inf") is not None:
            return kernel(*lists, **kwargs)
        settings = _settings_key({k: v for k, v in kwargs.items() if k not in ("grad_scale", "found_inf")})
        if settings is None or not lists or not all(isinstance(lst, list) for lst in lists):
            return kernel(*lists, **kwargs)
        params = lists[0]
        present = tuple(i for i, lst in enumerate(lists) if len(lst))
        if _GRADS not in present or any(len(lists[i]) != len(params) for i in present):
            return kernel(*lists, **kwargs)
        lr = kwargs.get("lr")
        tensor_lr = isinstance(lr, torch.Tensor)
        calls = []
        for position, param in enumerate(params):
            if not isinstance(param, FunctionalTensor) or param.dim() == 0 or param.is_complex():
                return kernel(*lists, **kwargs)
            tensors = [lists[i][position] for i in present]
            keys = [_tensor_key(t, param) for t in tensors]
            if any(k is None for k in keys):
                return kernel(*lists, **kwargs)
            key = (kernel, settings, len(lists), present, tuple(keys))
            if key in _REFUSED:
                return kernel(*lists, **kwargs)
            calls.append((key, tensors))
        all_state: list[FunctionalTensor] = []
        all_inputs: list[torch.Tensor] = []
        classes: list[int] = []
        for key, tensors in calls:
            state = [t for i, t in zip(present, tensors) if i != _GRADS]
            inputs = [tensors[present.index(_GRADS)], *([lr] if tensor_lr else [])]
            cls = replay.index.get(key)
            if cls is None:
                cls = replay.index[key] = len(replay.classes)
                replay.classes.append(_Class(
                    key, kernel, {k: v for k, v in kwargs.items() if not (k == "lr" and tensor_lr)}, len(lists), present,
                    tensor_lr, tuple(_example(t) for t in state), tuple(_example(t) for t in inputs),
                ))
            all_state += state
            all_inputs += inputs
            classes.append(cls)
        # The functional updates (one node), then each state tensor set to
        # its new value as functionalization does for an in-place operator
        # (no copy node).
        for old, new in zip(all_state, op(all_state, all_inputs, classes)):
            old.replace_(torch._from_functional_tensor(new.elem))
            old.commit_update()
            old.sync()
        return None

    return replayed


def _example(tensor: torch.Tensor) -> _Spec:
    return (tensor.shape, tensor.dtype, tensor.device)


@contextlib.contextmanager
def replayed_updates() -> Iterator[Replay]:
    """The optimizer kernels replaced for the duration (see the module
    docstring); yields the :class:`Replay` the trace fills."""
    import importlib

    replay = Replay()
    saved = []
    try:
        for module_name, name in _KERNELS:
            module = importlib.import_module(module_name)
            kernel = getattr(module, name)
            saved.append((module, name, kernel))
            setattr(module, name, _wrapper(kernel, replay))
        yield replay
    finally:
        for module, name, kernel in reversed(saved):
            setattr(module, name, kernel)


def _exact(value: Any) -> Any:
    """``value`` for a key: a float by its bits (``-0.0 == 0.0`` and NaN
    payloads are different programs' constants), containers recursively."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, tuple):
        return tuple(_exact(v) for v in value)
    return value


def _template_key(cls: _Class, decompositions: dict[Any, Callable[..., Any]]) -> Any:
    """What :func:`_trace_template` of ``cls`` reads (module docstring), or
    None when some part of it cannot key a dict."""
    kernel, settings, list_count, present, tensor_keys = cls.key
    key = (
        kernel, _exact(settings), list_count, present, tensor_keys, cls.tensor_lr,
        cls.state_examples, cls.input_examples,
        torch.get_default_dtype(), torch.compiler.is_compiling(),
        tuple(decompositions.items()),
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _template(cls: _Class, decompositions: dict[Any, Callable[..., Any]]) -> torch.fx.GraphModule:
    """The class's template: kept from an earlier capture with the same
    key, else traced (and kept).  Raises :class:`ReplayRefused`."""
    key = _template_key(cls, decompositions)
    with _TEMPLATES_LOCK:
        found = _TEMPLATES.get(key) if key is not None else None
    if found is not None:
        _check_template(found, cls, len(cls.state_examples))
        _TEMPLATE_STATS.hits += 1
        return found
    template = _trace_template(cls, decompositions)
    _TEMPLATE_STATS.misses += 1
    if key is not None:
        with _TEMPLATES_LOCK:
            _TEMPLATES.put(key, template)
    return template


def _trace_template(cls: _Class, decompositions: dict[Any, Callable[..., Any]]) -> torch.fx.GraphModule:
    """One member's update traced as ``(state, inputs) -> new state``."""
    state_count = len(cls.state_examples)

    def update(state: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        state = [t.clone() for t in state]
        lists: list[list[Any]] = []
        state_iter = iter(state)
        for i in range(cls.list_count):
            if i not in cls.present:
                lists.append([])
            elif i == _GRADS:
                lists.append([inputs[0]])
            else:
                lists.append([next(state_iter)])
        kwargs = dict(cls.kwargs)
        if cls.tensor_lr:
            kwargs["lr"] = inputs[1]
        with torch.no_grad():
            cls.kernel(*lists, **kwargs)
        return state

    def example(spec: Any) -> torch.Tensor:
        shape, dtype, device = spec
        return torch.empty(shape, dtype=dtype, device=device)

    try:
        graph_module = make_fx(
            dispatch_functionalize(update, FunctionalTensorMode()),
            decomposition_table=decompositions,
            tracing_mode="fake",
            **make_fx_without_torch_fn_metadata(),
        )([example(s) for s in cls.state_examples], [example(s) for s in cls.input_examples])
    except Exception as error:  # torch raises many types while tracing
        raise ReplayRefused(f"the update does not trace alone: {type(error).__name__}: {error}") from None
    _check_template(graph_module, cls, state_count)
    return graph_module


def _check_template(graph_module: torch.fx.GraphModule, cls: _Class, state_count: int) -> None:
    shape = cls.state_examples[0][0]
    fixed = {tuple(s[0]) for s in (*cls.state_examples, *cls.input_examples) if s[0] != shape}
    for node in graph_module.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function":
            raise ReplayRefused(f"{node.op} node in the update")
        target = node.target
        if target is operator.getitem:
            pass
        elif not isinstance(target, torch._ops.OpOverload) or not (
            torch.Tag.pointwise in target.tags or target in _ALSO_ALLOWED
        ):
            raise ReplayRefused(f"{target} is not pointwise")
        for value in (*node.args, *node.kwargs.values()):
            if isinstance(value, (list, tuple)) and len(value):
                raise ReplayRefused(f"{target} has a list argument")
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            if not (val.shape == shape and val.is_contiguous()) and tuple(val.shape) not in fixed:
                raise ReplayRefused(f"{target} makes a value of shape {tuple(val.shape)}")
        elif target is not aten._local_scalar_dense.default:
            raise ReplayRefused(f"{target} makes {type(val).__name__}")


def expand_replayed_updates(
    graph_module: torch.fx.GraphModule, replay: Replay, decompositions: dict[Any, Callable[..., Any]]
) -> None:
    """Each ``optimizer_update`` node replaced by its class's traced update
    (module docstring); raises :class:`ReplayRefused`."""
    if not replay.classes:
        return
    op = _update_op()
    graph = graph_module.graph
    nodes = [n for n in graph.nodes if n.op == "call_function" and n.target is op]
    for node in nodes:
        state, inputs, classes = list(node.args[0]), list(node.args[1]), list(node.args[2])
        outputs: list[torch.fx.Node] = []
        for index in classes:
            cls = replay.classes[index]
            if cls.template is None:
                try:
                    cls.template = _template(cls, decompositions)
                except ReplayRefused:
                    # This class and those not checked yet: traced in full
                    # from now on (no second trace of a later step).
                    _REFUSED.update(c.key for c in replay.classes if c.template is None)
                    raise
            state_count, input_count = len(cls.state_examples), len(cls.input_examples)
            with graph.inserting_before(node):
                outputs += _expand(graph, cls, state[:state_count], inputs[:input_count])
            state, inputs = state[state_count:], inputs[input_count:]
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise ReplayRefused("unexpected use of the update")
            user.replace_all_uses_with(outputs[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)


def _expand(
    graph: torch.fx.Graph, cls: _Class, state: list[torch.fx.Node], inputs: list[torch.fx.Node]
) -> list[torch.fx.Node]:
    """The class's update copied for one member (at the graph's insertion
    point); returns the nodes of its new state."""
    template = cls.template.graph
    placeholders = [n for n in template.nodes if n.op == "placeholder"]
    if len(placeholders) != len(state) + len(inputs):
        raise ReplayRefused("the update's inputs do not match")
    first = state[0].meta["val"]
    shape, fake_mode, device = first.shape, first.fake_mode, first.device
    old_shape = cls.state_examples[0][0]
    env: dict[torch.fx.Node, torch.fx.Node] = dict(zip(placeholders, [*state, *inputs]))
    for t_node in template.nodes:
        if t_node.op == "placeholder":
            continue
        if t_node.op == "output":
            return [env[o] for o in t_node.args[0]]
        if t_node.target is aten.clone.default and t_node.args[0] in placeholders and not t_node.kwargs:
            env[t_node] = env[t_node.args[0]]  # the template's own copy of its state
            continue
        new = graph.node_copy(t_node, lambda n: env[n])
        val = t_node.meta.get("val")
        if isinstance(val, torch.Tensor):
            # A new fake value of the member's shape (contiguous: checked).
            new_shape = shape if val.shape == old_shape else val.shape
            new.meta["val"] = FakeTensor(fake_mode, torch.empty(new_shape, dtype=val.dtype, device="meta"), device)
            new.meta.pop("tensor_meta", None)
        env[t_node] = new
    raise ReplayRefused("the update has no output")
