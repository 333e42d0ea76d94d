"""Training steps compiled once: :func:`compile_training_step` and the
:class:`TrainingStep` it returns.

::

    def step(x, y):
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return result

    train = hloalias.compile_training_step(step, model, optimizer, (x, y), donate=[0, 1])
    for x, y in batches:
        loss = train(x, y)          # one XLA call; parameters and state stay on the device
        scheduler.step()            # a new lr is data: no recompile
    train.write_back()              # model and optimizer hold the trained values again

Parameters, model buffers and optimizer state live on the device inside the
executable and are aliased in place (inferred donors); batch inputs named in
``donate`` are explicit donors.  What the step returns comes back: the loss,
or tensors it computed in a tuple, list, dict or ``ModelOutput``
(``return loss, logits``; ``{"loss": loss, "grad_norm": norm}``), each a
new tensor (a parameter, state or input returned as such is refused at
capture: eager would return that very tensor).  The model's and the optimizer's own tensors are not written by
calls: a call leaves them stale (runtime/state.py), and the first read of
one (``model.weight * 1``, an EMA over ``model.parameters()``,
``optimizer.state[p]["exp_avg"].norm()``, ``p.grad`` of a kept gradient)
copies the steps' device value in; an eager ``model(x)``,
``model.state_dict()`` and ``optimizer.state_dict()`` first copy all of
it in (eager evaluation and checkpoints never see stale state; on a mesh
across processes, where the copy is a collective, they and bare reads
are refused until ``write_back`` in every process), and
``model.load_state_dict``/``optimizer.load_state_dict`` set the device
state (resuming after the step was compiled), on a mesh too.

The optimizer's state tensors are watched as the model's are: ``write_back``
(and ``optimizer.state_dict()``) copy the device state into the tensors
``optimizer.state`` holds, in place (the same objects stay there), and an
in-place edit of one between calls (``optimizer.state[p]["exp_avg"].zero_()``)
is read by the next call, as eager's next step reads it; edit after
``write_back`` (an edit of a stale tensor replaces the device's newer
value, as for parameters).  A tensor put in place of one
(``optimizer.state[p]["exp_avg"] = t``) is not seen until ``reload()``.
An eager ``optimizer.step()`` between calls first copies the device state
in (a step pre-hook), so eager and compiled steps continue each other.

One state store per model: every training step compiled for a model (and
optimizer) and every executable ``hloalias.compile`` made from the model
read and update the same device buffer per tensor (the model's state
group, :mod:`hloalias.runtime.executable`).  Two steps (the DataLoader's
smaller last batch; a backward-only step and a stepping one for gradient
accumulation) continue each other's progress as eager would, and an
inference executable sees the trained weights.  A step compiled after
another kept gradients (accumulation) makes every step of the model read
and clear them: a step compiled before recompiles itself on its next call."""

from __future__ import annotations

import contextlib
import copy
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from hloalias.errors import DonationError, ExecutionError
from hloalias.frontend.training import (
    CapturedTrainingStep,
    StateSlot,
    TrainingCaptureError,
    capture_training_step,
)
from hloalias.frontend.training import _hyperparameters as hyperparameters_of
from hloalias.frontend.training import _initial_optimizer_state as optimizer_state_of
from hloalias.frontend.training import _lr_dtype as lr_dtype_of
from hloalias.frontend.training import _lr_value as lr_of
from hloalias.runtime.executable import DeviceTensor, Executable, compile
from hloalias.runtime.sharding import Mesh
from hloalias.runtime.state import (
    _RUNTIME_READ, _SYNC_HOOK, _tracing, bring_up_to_date, fresh_type, refresh_stale, traced_as_plain,
)

#: The default pipeline, then ``order-in-place-updates``: weights the
#: backward reads for input gradients are updated in place without a copy.
TRAINING_PIPELINE = (
    "builtin.module(fold-transpose-into-dot-general, recompute-shared-activations, one-hot-scatter-as-select, "
    "recompute-for-late-readers, eliminate-view-results, alias-donated-buffers, order-in-place-updates)"
)


def compile_training_step(
    step_fn: Callable[..., Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    example_batch: Sequence[Any],
    *,
    donate: Sequence[int] = (),
    pipeline: str | None = None,
    device: Any = None,
    mesh: Mesh | None = None,
    shardings: dict[str | int, Any] | None = None,
) -> "TrainingStep":
    """Capture ``step_fn(*example_batch)`` — forward, ``backward()``,
    ``optimizer.step()``, ``optimizer.zero_grad()`` on ``model`` and
    ``optimizer`` — as one program and compile it (see the module docstring).

    ``donate`` lists batch leaves by position (in ``example_batch`` flattened)
    whose buffers the step may consume.  Parameters, buffers and optimizer
    state are donated always (they are updated in place).  ``pipeline``
    defaults to :data:`TRAINING_PIPELINE`.  The model and the
    optimizer are not changed.

    ``mesh`` runs the step on several devices (and processes:
    :mod:`hloalias.runtime.distributed`); ``shardings`` maps batch positions
    and parameter or buffer FQNs to partition specs (as ``hloalias.compile``'s).
    A parameter's optimizer state and kept gradient of its shape take its
    spec; everything else is replicated.  Data parallel: shard the batch
    (``{0: ("dp", None)}``): XLA all-reduces the gradients.

    Raises :class:`TrainingCaptureError` when
    the step cannot be captured (naming the construct and the line) and
    :class:`DonationError` for a bad ``donate`` entry."""
    store = _store_of(model)
    placement = (mesh, shardings)
    captured, executable = _compile_step(
        store, step_fn, model, optimizer, example_batch, tuple(donate), pipeline, device, placement
    )
    step = TrainingStep(captured, executable, model, optimizer)
    step._recompile = lambda: _compile_step(
        store, step_fn, model, optimizer, example_batch, tuple(donate), pipeline, device, placement
    )
    step._store = store
    step._generation = store.generation
    _checkpoint_sees_steps(store, optimizer, step)
    step._publish_optimizer_entries()
    return step


def _checkpoint_sees_steps(store: _TrainingStore, optimizer: torch.optim.Optimizer, step: "TrainingStep") -> None:
    """Make ``optimizer.load_state_dict()`` set the steps' device optimizer
    state (:meth:`TrainingStep._reload_optimizer`), and make
    ``optimizer.state_dict()`` (``torch.save`` of a checkpoint,
    ``accelerate``/``transformers`` Trainer code) first copy what the steps
    left on the device into the optimizer's state, as the model's
    ``state_dict()`` does for parameters and buffers (the state group's
    pre-hook, :meth:`hloalias.runtime.state._StateGroup.note_written`):
    without it a checkpoint taken without ``write_back()`` silently holds
    the optimizer state of compile time.  One set of hooks per optimizer.
    The copies to the host skip a step on a mesh (its state is gathered by
    a collective every process must enter, which a hook cannot promise);
    the load does not (each process places its own shards of what it
    loaded: no collective), so resuming a mesh step from
    ``optimizer.load_state_dict`` never continues from the old state."""
    with store.lock:
        steps = store.steps_of.get(optimizer)
        if steps is None:
            steps = store.steps_of[optimizer] = weakref.WeakSet()
            found = weakref.ref(store)

            def any_live_step(opt: torch.optim.Optimizer, on_mesh: bool = True) -> "TrainingStep | None":
                # Every step of the optimizer reads the same device state:
                # any live one holds it all.
                live = found()
                registered = live.steps_of.get(opt) if live is not None else None
                return next(
                    (s for s in list(registered or ()) if on_mesh or not s.executable._placement.spmd), None
                )

            def write_back_for(opt: torch.optim.Optimizer, what: str) -> None:
                # Eager code (``what``) reads the optimizer's state next.
                live = found()
                if live is not None and not getattr(_READING_STRUCTURE, "active", False):
                    live.mesh_steps_before_eager_read(what, optimizer=opt)
                step = any_live_step(opt, on_mesh=False)
                if step is not None:
                    step._write_back_optimizer()

            def write_back_first(opt: torch.optim.Optimizer) -> None:
                write_back_for(opt, "optimizer.state_dict()")

            def reload_after_load(opt: torch.optim.Optimizer) -> None:
                step = any_live_step(opt)
                if step is not None:
                    step._reload_optimizer()

            def write_back_before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
                # An eager ``optimizer.step()`` between compiled calls
                # updates the state the steps left, in place (the next call
                # reads its edits); not while a step is being captured.
                if not torch.compiler.is_compiling():
                    write_back_for(opt, "an eager optimizer.step()")

            optimizer.register_state_dict_pre_hook(write_back_first)
            optimizer.register_step_pre_hook(write_back_before_step)
            # Resuming from a checkpoint after compiling the step
            # (``optimizer.load_state_dict(ckpt)``): the device state must
            # become the loaded state, or the next step silently continues
            # from the old moments and step counts.
            optimizer.register_load_state_dict_post_hook(reload_after_load)
        steps.add(step)
        if step.executable._placement.spmd and not store.mesh_hooks:
            _mesh_steps_see_eager_reads(store, step._model)


#: Set while hloalias reads a model's state-dict keys and tensors or an
#: optimizer's param groups (not state values): the mesh steps' hooks then
#: copy nothing in and refuse nothing.
_READING_STRUCTURE = threading.local()


@contextlib.contextmanager
def _reading_structure() -> Iterator[None]:
    _READING_STRUCTURE.active = True
    try:
        yield
    finally:
        _READING_STRUCTURE.active = False


def _state_dict_entries(model: torch.nn.Module) -> dict[str, Any]:
    """``model.state_dict(keep_vars=True)``, for its keys and tensor objects."""
    with _reading_structure():
        return model.state_dict(keep_vars=True)


def _mesh_steps_see_eager_reads(store: "_TrainingStore", model: torch.nn.Module) -> None:
    """A step on a mesh keeps its state in an executable of its own (no
    state group of the model, whose hooks copy the device state in before
    eager code reads it).  Before the model's eager forward and its
    ``state_dict()``, every mesh step of the model that ran since the host
    last agreed with it does so itself (:meth:`TrainingStep._before_eager_read`),
    as the optimizer's hooks (:func:`_checkpoint_sees_steps`) do for the
    optimizer: an evaluation or an eager step between compiled steps never
    reads the state from before them."""
    found = weakref.ref(store)

    def before_eager_read(what: str) -> None:
        live = found()
        if live is not None:
            live.mesh_steps_before_eager_read(what)

    def before_forward(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if not _tracing(args, kwargs):
            before_eager_read(f"an eager forward of {type(module).__name__}")

    def before_state_dict(module: torch.nn.Module, prefix: str, keep_vars: bool) -> None:
        if not _tracing() and not getattr(_READING_STRUCTURE, "active", False):
            before_eager_read(f"{type(module).__name__}.state_dict()")

    # Not part of the program: the caches' keys and the hook checks skip them.
    setattr(before_forward, _SYNC_HOOK, True)
    setattr(before_state_dict, _SYNC_HOOK, True)
    store.mesh_hooks = (
        model.register_forward_pre_hook(before_forward, with_kwargs=True),
        model.register_state_dict_pre_hook(before_state_dict),  # type: ignore[no-untyped-call]
    )


class _TrainingStore:
    """What the training steps of one model share beyond the model's own
    tensors: the tensors standing for the optimizers' state and for kept
    gradients (the sources of their device buffers in the model's state
    group, one per tensor whichever step reads it), and the gradients some
    step keeps (accumulates across calls)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: optimizer -> (parameter index, key) -> the tensor its state slot stands for
        self.optimizer_state: "weakref.WeakKeyDictionary[torch.optim.Optimizer, dict[tuple[int, str], torch.Tensor]]" = (
            weakref.WeakKeyDictionary()
        )
        #: parameter FQN -> the tensor its kept gradient's slot stands for
        self.grads: dict[str, torch.Tensor] = {}
        #: parameters whose gradients some step keeps: every step reads them
        self.kept_grads: frozenset[str] = frozenset()
        #: bumped when ``kept_grads`` grows: steps compiled before recompile
        self.generation = 0
        #: optimizer -> its live single-device steps, whose device state its
        #: ``state_dict()`` pre-hook copies in first (:func:`_checkpoint_sees_steps`)
        self.steps_of: "weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.WeakSet[TrainingStep]]" = (
            weakref.WeakKeyDictionary()
        )
        #: the model's hooks for its steps on a mesh (:func:`_mesh_steps_see_eager_reads`)
        self.mesh_hooks: tuple[Any, ...] = ()

    def mesh_steps_before_eager_read(
        self, what: str, optimizer: torch.optim.Optimizer | None = None, caller: "TrainingStep | None" = None
    ) -> None:
        """Eager code or another step (``what``) reads the model's or the
        optimizer's tensors next: every live step on a mesh (of
        ``optimizer`` only, when given; not ``caller``) that ran since the
        host last agreed with it copies its state in, or refuses
        (:meth:`TrainingStep._before_eager_read`)."""
        groups = [self.steps_of.get(optimizer)] if optimizer is not None else list(self.steps_of.values())
        for steps in groups:
            for step in list(steps or ()):
                if step is not caller and step.executable._placement.spmd:
                    step._before_eager_read(what)


_STORES: "weakref.WeakKeyDictionary[torch.nn.Module, _TrainingStore]" = weakref.WeakKeyDictionary()
_STORES_LOCK = threading.Lock()


def _store_of(model: torch.nn.Module) -> _TrainingStore:
    with _STORES_LOCK:
        store = _STORES.get(model)
        if store is None:
            store = _STORES[model] = _TrainingStore()
        return store


def _compile_step(
    store: _TrainingStore, step_fn: Callable[..., Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
    example_batch: Sequence[Any], donate: tuple[Any, ...], pipeline: str | None, device: Any,
    placement: tuple[Mesh | None, dict[str | int, Any] | None] = (None, None),
) -> tuple[CapturedTrainingStep, Executable]:
    """Capture and compile one step over the model's shared state store."""
    # The capture reads the model's and the optimizer's tensors (initial
    # values, tracing): what calls left on the device first.
    refresh_stale(_host_tensors(model, optimizer, store), "compile_training_step")
    with traced_as_plain():
        captured = capture_training_step(step_fn, model, optimizer, example_batch, kept_grads=store.kept_grads)
    batch_count = captured.batch_spec.num_leaves
    positions: list[int] = []
    for request in donate:
        if isinstance(request, bool) or not isinstance(request, int):
            raise DonationError(f"donate lists batch positions (ints), got {request!r}")
        if not 0 <= request < batch_count:
            raise DonationError(f"donate names batch input {request}, but the batch has {batch_count} tensors")
        positions.append(captured.lr_count + request)
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    initial = captured.exported.state_dict
    sources: dict[str, torch.Tensor] = {}
    with store.lock:
        optimizer_state = store.optimizer_state.setdefault(optimizer, {})
        for slot in captured.slots:
            if slot.kind in ("param", "buffer"):
                assert slot.fqn is not None
                sources[slot.name] = named[slot.fqn]
            elif slot.kind == "optimizer":
                assert slot.param_index is not None and slot.key is not None
                # The optimizer's own tensor where it has one: its state
                # slot watches it, so an in-place edit between calls
                # (``optimizer.state[p]["exp_avg"].zero_()``) is read by
                # the next call, as eager's next step would read it.
                stored = optimizer_state.get((slot.param_index, slot.key))
                if stored is None:
                    held = _watchable_state(
                        optimizer, captured.parameters[slot.param_index], slot.key, initial[slot.name]
                    )
                    stored = held if held is not None else initial[slot.name]
                    optimizer_state[(slot.param_index, slot.key)] = stored
                sources[slot.name] = stored
            else:
                assert slot.fqn is not None
                sources[slot.name] = store.grads.setdefault(slot.fqn, initial[slot.name])
        kept = frozenset(slot.fqn for slot in captured.slots if slot.kind == "grad" and slot.fqn is not None)
        if not kept <= store.kept_grads:
            store.kept_grads |= kept
            store.generation += 1
    mesh, shardings = placement
    executable = compile(
        captured.exported, donate=positions, pipeline=pipeline or TRAINING_PIPELINE, device=device,
        mesh=mesh, shardings=_step_shardings(captured, model, shardings) if shardings is not None else None,
        _state_owner=model, _state_sources=sources,
    )
    # A replaced parameter (``model.w = nn.Parameter(...)``) leaves the
    # optimizer holding the old one: eager would go on training that.  A
    # buffer or a plain tensor attribute (``_tensor_constant0``) no
    # optimizer holds: the step reads the new one by name, as a forward
    # program does.  On a mesh every replacement is refused: its group
    # copies nothing into the replaced tensor (``_StateSlot.follow``), which
    # would keep the value from before the steps.
    refused = {
        id(executable._slots[slot.name]) for slot in captured.slots if slot.kind == "param"
    }
    executable._refused_replacements = {
        id(state_slot): (
            "a training step follows no replaced parameter (its optimizer holds the old one and would go on "
            "updating it)" if id(state_slot) in refused else
            "a training step on a mesh follows no replaced tensor (the old one would keep its value from "
            "before the steps)"
        )
        for state_slot in executable._slots.values()
        if id(state_slot) in refused or executable._placement.spmd
    }
    # A kept gradient is the parameter's ``.grad`` for eager code: reading
    # the parameter (``p.grad``) copies it in (runtime/state.py).
    for slot in captured.slots:
        if slot.kind == "grad" and slot.fqn is not None:
            executable._slots[slot.name].show_as_grad_of(named[slot.fqn])
    return captured, executable


def _host_tensors(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, store: "_TrainingStore | None" = None
) -> list[torch.Tensor]:
    """The model's parameters and buffers, the optimizer's state tensors and
    the kept gradients' tensors: what a step's device state stands for."""
    with _RUNTIME_READ():
        tensors: list[torch.Tensor] = [*model.parameters(), *model.buffers()]
        for entries in optimizer.state.values():
            tensors.extend(v for v in entries.values() if isinstance(v, torch.Tensor))
        if store is not None:
            tensors.extend(store.grads.values())
    return tensors


def _watchable_state(
    optimizer: torch.optim.Optimizer, param: torch.Tensor, key: str, like: torch.Tensor
) -> torch.Tensor | None:
    """``optimizer.state[param][key]`` when a state slot can stand for it
    (a plain tensor of ``like``'s dtype and shape, with a version counter),
    else None."""
    held = optimizer.state.get(param, {}).get(key)
    if (
        isinstance(held, torch.Tensor) and fresh_type(held) is torch.Tensor and not held.is_inference()
        and not held.requires_grad and held.device.type == "cpu"
        and held.dtype == like.dtype and tuple(held.shape) == tuple(like.shape)
    ):
        return held
    return None


def _step_shardings(
    captured: CapturedTrainingStep, model: torch.nn.Module, shardings: Any
) -> dict[str | int, Any]:
    """``compile_training_step``'s ``shardings`` (batch positions, parameter
    and buffer FQNs) as the captured program's: batch position ``i`` is user
    input ``lr_count + i``; a parameter's optimizer state and kept gradient
    of the parameter's shape take its spec.  Unknown keys are left for
    ``compile``'s ShardingError to name."""
    if not isinstance(shardings, dict):
        return shardings  # type: ignore[no-any-return]  # compile names the type
    state = captured.exported.state_dict
    slot_of_fqn = {slot.fqn: slot.name for slot in captured.slots if slot.kind in ("param", "buffer")}
    fqn_of_param = {id(p): fqn for fqn, p in model.named_parameters()}
    mapped: dict[str | int, Any] = {}
    for key, spec in shardings.items():
        if isinstance(key, int) and not isinstance(key, bool):
            mapped[captured.lr_count + key] = spec
        elif isinstance(key, str) and key in slot_of_fqn:
            mapped[slot_of_fqn[key]] = spec
        else:
            mapped[key] = spec
    for slot in captured.slots:
        if slot.kind == "grad":
            source = slot_of_fqn.get(slot.fqn or "")
        elif slot.kind == "optimizer" and slot.param_index is not None:
            source = slot_of_fqn.get(fqn_of_param.get(id(captured.parameters[slot.param_index]), ""))
        else:
            continue
        if source is None or source not in mapped:
            continue
        value, reference = state.get(slot.name), state.get(source)
        if isinstance(value, torch.Tensor) and isinstance(reference, torch.Tensor) and value.shape == reference.shape:
            mapped.setdefault(slot.name, mapped[source])
    return mapped


class TrainingStep:
    """A compiled training step.  Call it with a batch shaped like the
    example batch; it returns what the step returns (the loss, or a tuple,
    list, dict or ``ModelOutput`` of tensors it computed), as new tensors."""

    def __init__(
        self,
        captured: CapturedTrainingStep,
        executable: Executable,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        self.executable = executable
        # What calls read of the capture; not the captured program itself,
        # whose state_dict holds host copies of all the state the device
        # now owns (a second copy of model and optimizer state).
        self._batch_spec = captured.batch_spec
        self._lr_count = captured.lr_count
        self._hyperparameters = captured.hyperparameters
        self._parameters = captured.parameters
        self._model = model
        self._optimizer = optimizer
        self._slots = captured.slots
        self._cleared_grads = captured.cleared_grads
        # dtype and shape of every state slot, to name a mismatched entry of
        # load_state_dict by the user's key (the slots' names are internal).
        self._slot_types = {
            name: (value.dtype, tuple(value.shape))
            for name, value in captured.exported.state_dict.items()
            if isinstance(value, torch.Tensor)
        }
        self._lr_cache: list[tuple[float, torch.Tensor]] = []
        #: Set by compile_training_step: the model's state store, the
        #: generation of its kept gradients this step was compiled for, and
        #: how to compile it again when they changed.
        self._store: _TrainingStore | None = None
        self._generation = 0
        self._recompile: Callable[[], tuple[CapturedTrainingStep, Executable]] | None = None
        #: Which parameters were trainable at capture: a frozen one gets no
        #: gradient and no update, as in eager (frontend/training.py).
        self._trainable = self._trainable_now()
        self._optimizer_entry_slots = self._entry_slots()
        #: Why the optimizer's state could not be loaded onto the device
        #: (:meth:`_reload_optimizer`); calls refuse to run until it can.
        self._unloaded_optimizer: str | None = None
        #: A call ran since the model's and optimizer's tensors last got the
        #: device state (read by :meth:`_before_eager_read`, steps on a mesh).
        self._host_lags = False
        self._route_stale_reads()

    def _route_stale_reads(self) -> None:
        """On a mesh, a read of a tensor the calls left stale (runtime/state.py)
        is served by :meth:`_before_eager_read`: this step's whole state is
        written back (one process), or the read is refused (across
        processes, where that copy is a collective)."""
        if not self.executable._placement.spmd:
            return
        found = weakref.ref(self)

        def before_read(what: str) -> None:
            step = found()
            if step is not None:
                step._before_eager_read(what)

        self.executable._group.before_read = before_read

    def _trainable_now(self) -> tuple[bool, ...]:
        with _RUNTIME_READ():  # stale parameters answer without a hook
            return tuple(bool(p.requires_grad) for p in self._model.parameters())

    def _adopt(self, captured: CapturedTrainingStep, executable: Executable) -> None:
        """Take a recompiled program of the same step (more state: kept gradients)."""
        self.executable = executable
        self._batch_spec = captured.batch_spec
        self._lr_count = captured.lr_count
        self._hyperparameters = captured.hyperparameters
        self._parameters = captured.parameters
        self._slots = captured.slots
        self._cleared_grads = captured.cleared_grads
        self._trainable = self._trainable_now()
        self._optimizer_entry_slots = self._entry_slots()
        self._publish_optimizer_entries()
        self._route_stale_reads()

    def _entry_slots(self) -> tuple[tuple[torch.Tensor, StateSlot, str], ...]:
        """(parameter, slot, state key) of every optimizer state slot: the
        entries :meth:`_replaced_optimizer_entries` checks."""
        return tuple(
            (self._parameters[slot.param_index], slot, slot.key)
            for slot in self._slots
            if slot.kind == "optimizer" and slot.param_index is not None and slot.key is not None
        )

    # -- calling -----------------------------------------------------------
    def __call__(self, *batch: Any) -> Any:
        """One training step on ``batch``; returns the step's result."""
        if self._unloaded_optimizer is not None:
            self._reload_optimizer()  # raises again while the loaded state does not fit
        store = self._store
        if store is not None and store.generation != self._generation and self._recompile is not None:
            # Another step of the model keeps gradients now: read them too.
            generation = store.generation
            self._adopt(*self._recompile())
            self._generation = generation
        if self._trainable_now() != self._trainable:
            # A parameter frozen or unfrozen since capture (gradual
            # unfreezing): capture again; the state stays on the device.
            if self._recompile is None:
                changed = [
                    name for (name, p), was in zip(self._model.named_parameters(), self._trainable)
                    if p.requires_grad != was
                ]
                raise ExecutionError(f"requires_grad of {changed} changed since the step was compiled: compile again")
            self._adopt(*self._recompile())
        leaves, spec = pytree.tree_flatten(batch)
        if spec != self._batch_spec:
            raise ExecutionError(
                f"the batch does not have the structure the step was compiled for: "
                f"expected {self._batch_spec}, got {spec}"
            )
        # The calls' own reads of the model's and optimizer's tensors
        # (versions, identities, edits to upload) do not copy stale ones in.
        with _RUNTIME_READ():
            self._read_other_steps_state()
            # After the other steps' state came in: their write-back keeps a
            # replaced entry (the newest value) and copies into the rest.
            self._adopt_replaced_optimizer_entries()
            self._read_replaced_grads()
            try:
                result = self.executable(*self._lr_inputs(), *leaves)
                self._host_lags = True
                self._show_cleared_grads()
            except BaseException:
                # Cut short once the program ran (a Ctrl-C as it returned:
                # the call committed its state to the device first), eager
                # reads must still copy it in; the first step's optimizer
                # entries have no host tensor a stale mark could route.
                if any(slot.lags for slot in self.executable._slots.values()):
                    self._host_lags = True
                    self._show_cleared_grads()
                raise
        return result

    def _show_cleared_grads(self) -> None:
        """After a call: each kept gradient reads as the step left it, None
        where it set it to None again (``zero_grad()`` last: another step
        of the model accumulates into it, so its slot exists, holding
        zeros).  Before, ``.grad`` read zeros, and an eager
        ``optimizer.step()`` with momentum then moved every parameter where
        eager's skips gradients that are None."""
        cleared = self._cleared_grads
        for slot in self._slots:
            if slot.kind == "grad":
                self.executable._slots[slot.name].show_grad_cleared(slot.fqn in cleared)

    def _read_replaced_grads(self) -> None:
        """A kept gradient whose parameter's ``.grad`` eager code set since
        hloalias last did (``optimizer.zero_grad()`` after an eager
        ``optimizer.step()`` between accumulating calls sets it to None;
        ``p.grad = t``): the call starts from that, as eager's next
        backward would (from nothing for None), not from the device's
        sum.  The slot's tensor takes the value in place, an edit the
        call's watch then reads."""
        for slot in self._slots:
            if slot.kind == "grad":
                self._take_replaced_grad(slot)

    def _take_replaced_grad(self, slot: StateSlot) -> bool:
        """:meth:`_read_replaced_grads` for one kept gradient; whether its
        ``.grad`` had been replaced (then it stays the user's)."""
        state_slot = self.executable._slots[slot.name]
        replaced, grad = state_slot.grad_replaced()
        source = state_slot.source()
        if not replaced or source is None:
            return False
        with torch.no_grad():
            if grad is None:
                source.zero_()
            else:
                source.copy_(self._checked(grad, slot.name, f"the .grad of '{slot.fqn}'", "a call"))
        # A whole new value, not an edit of the stale one: the call reads it.
        state_slot.host_overwritten()
        state_slot.note_grad_shown()
        return True

    def _read_other_steps_state(self) -> None:
        """Two steps of one model (another batch shape, an accumulation
        variant) continue each other's progress.  Steps on one device share
        the model's state group; a step on a mesh keeps its state in an
        executable of its own.  So before this call, every other mesh step
        of the model that ran since the host last agreed with it copies its
        state in (:meth:`_before_eager_read`), and a mesh step first brings
        the model's and optimizer's tensors up to date with what
        single-device programs left (:func:`bring_up_to_date`); the call
        then reads them as edits."""
        if self._store is not None:
            self._store.mesh_steps_before_eager_read("a call of another training step of the model", caller=self)
        if self.executable._placement.spmd:
            bring_up_to_date(_host_tensors(self._model, self._optimizer), reader=self.executable._group)

    def _before_eager_read(self, what: str) -> None:
        """Eager code is about to read the model or the optimizer (``what``)
        after calls of this step on a mesh: copy the device state in first
        (:meth:`write_back`; one process holds every device, so no
        collective).  On a mesh across processes the copy is a collective
        every process must enter, which a hook cannot promise: refuse, so
        the eager code never runs on the state from before the calls."""
        if not self._host_lags:
            return
        if self.executable._placement.multiprocess:
            raise ExecutionError(
                f"{what} after calls of a training step on a mesh across processes would read the state "
                "from before them: call train.write_back() in every process first"
            )
        self._write_back()

    def _lr_inputs(self) -> list[torch.Tensor]:
        groups = self._optimizer.param_groups
        if len(groups) != self._lr_count:
            raise ExecutionError(
                f"the optimizer has {len(groups)} param groups, the step was compiled for "
                f"{self._lr_count}; compile again"
            )
        inputs = []
        for index, group in enumerate(groups):
            if hyperparameters_of(group) != self._hyperparameters[index]:
                changed = sorted(
                    k for k, v in hyperparameters_of(group).items()
                    if self._hyperparameters[index].get(k) != v
                ) or ["(keys)"]
                cycled = (
                    " (OneCycleLR and CyclicLR cycle momentum/betas every step unless given "
                    "cycle_momentum=False)" if {"momentum", "betas"} & set(changed) else ""
                )
                raise ExecutionError(
                    f"param group {index}: {', '.join(changed)} changed since compile; only lr is "
                    f"passed as data, other hyperparameters are part of the program: compile again{cycled}"
                )
            lr = lr_of(group)
            if index < len(self._lr_cache) and self._lr_cache[index][0] == lr:
                inputs.append(self._lr_cache[index][1])
                continue
            tensor = torch.tensor(lr, dtype=lr_dtype_of(group, self._optimizer))
            if index < len(self._lr_cache):
                self._lr_cache[index] = (lr, tensor)
            else:
                self._lr_cache.append((lr, tensor))
            inputs.append(tensor)
        return inputs

    def to_device(self, tensor: torch.Tensor, name: str = "batch") -> DeviceTensor:
        """A batch tensor on the step's device (donatable for real)."""
        return self.executable.to_device(tensor, name)

    # -- introspection -----------------------------------------------------
    @property
    def memory_stats(self) -> dict[str, int]:
        """XLA's byte figures for the step."""
        return self.executable.memory_stats

    @property
    def aliases(self) -> list[dict[str, Any]]:
        """Every alias with its argument, result, origin and bytes."""
        return self.executable.aliases

    def explain(self) -> str:
        """The passes' decisions and XLA's bytes (also printed)."""
        return self.executable.explain()

    # -- state -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Host copies: ``{"model": model.state_dict()-shaped,
        "optimizer": optimizer.state_dict()-shaped}``; loadable into this
        step, into the torch model and optimizer, or saved with ``torch.save``."""
        with _RUNTIME_READ():
            self._read_other_steps_state()
            device_state = self.executable.state_dict()
        model_state: dict[str, torch.Tensor] = {}
        for key, name in self._model_keys().items():
            model_state[key] = device_state[name]
        optimizer_state: dict[int, dict[str, Any]] = {}
        for slot in self._slots:
            if slot.kind == "optimizer":
                assert slot.param_index is not None and slot.key is not None
                optimizer_state.setdefault(slot.param_index, {})[slot.key] = device_state[slot.name]
        with _reading_structure():
            groups = copy.deepcopy(self._optimizer.state_dict()["param_groups"])
        state: dict[str, Any] = {"model": model_state, "optimizer": {"state": optimizer_state, "param_groups": groups}}
        grads = {slot.fqn: device_state[slot.name] for slot in self._slots if slot.kind == "grad"}
        if grads:
            state["grads"] = grads  # kept gradients (the step does not zero them)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set the device state from a :meth:`state_dict` (or from
        ``{"model": model.state_dict(), "optimizer": optimizer.state_dict()}``).
        Every tensor of the step must be present; ``param_groups`` (lr and
        the rest) are loaded into the torch optimizer."""
        if not isinstance(state, dict) or "model" not in state or "optimizer" not in state:
            raise ExecutionError("load_state_dict expects {'model': ..., 'optimizer': ...}")
        # Strict, as torch's load_state_dict(strict=True): a key the step
        # would ignore is refused before anything changes.
        _refuse_unexpected("the state", state, ["model", "optimizer", "grads"])
        values: dict[str, torch.Tensor] = {}
        model_state = state["model"]
        model_keys = self._model_keys()
        _refuse_unexpected("'model'", model_state, list(_state_dict_entries(self._model)))
        for key, name in model_keys.items():
            if key not in model_state:
                raise ExecutionError(f"load_state_dict: model state '{key}' is missing")
            values[name] = self._checked(model_state[key], name, f"model state '{key}'")
        optimizer_state = state["optimizer"].get("state", {})
        _refuse_unexpected("'optimizer'", state["optimizer"], ["state", "param_groups"])
        _refuse_unexpected("optimizer 'state' (by parameter index)", optimizer_state, list(range(len(self._parameters))))
        for index, entries in optimizer_state.items():
            known = [slot.key for slot in self._slots if slot.kind == "optimizer" and slot.param_index == index]
            _refuse_unexpected(f"optimizer state of parameter {index}", entries, known)
        for slot in self._slots:
            if slot.kind == "optimizer":
                entries = optimizer_state.get(slot.param_index)
                if entries is None or slot.key not in entries:
                    raise ExecutionError(
                        f"load_state_dict: optimizer state '{slot.key}' of parameter {slot.param_index} is missing"
                    )
                value = entries[slot.key]
                if not isinstance(value, torch.Tensor):
                    value = torch.tensor(float(value), dtype=torch.float32)
                what = f"optimizer state '{slot.key}' of parameter {slot.param_index}"
                values[slot.name] = self._checked(value, slot.name, what)
        grads = state.get("grads", {})
        _refuse_unexpected("'grads' (kept gradients)", grads, [slot.fqn for slot in self._slots if slot.kind == "grad"])
        for slot in self._slots:
            if slot.kind == "grad" and slot.fqn in grads:
                values[slot.name] = self._checked(grads[slot.fqn], slot.name, f"kept gradient '{slot.fqn}'")
        groups = state["optimizer"].get("param_groups")
        if groups is not None and len(groups) != len(self._optimizer.param_groups):
            raise ExecutionError(
                f"load_state_dict: {len(groups)} param groups, the optimizer has "
                f"{len(self._optimizer.param_groups)}"
            )
        def loaded() -> None:
            # Part of the load (done again if it is cut short): the device
            # holds what was loaded, the model and optimizer do not; the
            # hyperparameters go with the state.
            self._host_lags_device()
            if groups is not None:
                for group, saved in zip(self._optimizer.param_groups, groups):
                    group.update({k: v for k, v in saved.items() if k != "params"})

        self.executable.load_state_dict(values, _then=loaded)

    def _host_lags_device(self) -> None:
        """The device holds state the model's and optimizer's tensors do not."""
        self._host_lags = True

    def _checked(self, value: Any, slot_name: str, what: str, source: str = "load_state_dict") -> Any:
        """``value`` if its dtype and shape are the slot's; an error naming
        ``what`` (the user's key) and where it came from otherwise."""
        expected = self._slot_types.get(slot_name)
        got = getattr(value, "dtype", None), tuple(getattr(value, "shape", ()))
        if expected is not None and isinstance(value, torch.Tensor) and got != expected:
            raise ExecutionError(
                f"{source}: {what} is {got[0]} {list(got[1])}, the step was compiled for "
                f"{expected[0]} {list(expected[1])}"
            )
        return value

    def write_back(self) -> None:
        """Copy the device state into the model's parameters and buffers
        (in place), kept gradients (``.grad``) and the optimizer's state, so that eager code,
        ``model.state_dict()`` and ``optimizer.state_dict()`` see it."""
        with _RUNTIME_READ():
            self._read_other_steps_state()
            self._write_back()

    def _write_back(self) -> None:
        """:meth:`write_back` of this step's own device state."""
        with _RUNTIME_READ():
            self._write_back_state()

    def _write_back_state(self) -> None:
        # A replaced optimizer entry is the newest value: the device takes
        # it, rather than the copy overwriting it.
        self._adopt_replaced_optimizer_entries()
        # A write made through an alias while the tensor lagged (refused by
        # calls) is replaced by the device's value, as the error says.
        device_state = self.executable._state_values(self.executable._slots, drop_stale_writes=True)
        named = {**dict(self._model.named_parameters()), **dict(self._model.named_buffers())}
        self._write_back_optimizer(device_state)
        with torch.no_grad():
            for slot in self._slots:
                if slot.kind in ("param", "buffer"):
                    assert slot.fqn is not None
                    # The module's tensor equals the device state again: a
                    # later change to it in torch is the newest value.
                    self.executable._slots[slot.name].copy_in(named[slot.fqn], device_state[slot.name])
        with torch.no_grad():
            for slot in self._slots:
                if slot.kind == "grad":
                    assert slot.fqn is not None
                    # The tensor the slot watches becomes ``.grad`` (as a
                    # read of the stale parameter does): an in-place edit
                    # of it is read by the next call.
                    state_slot = self.executable._slots[slot.name]
                    source = state_slot.source()
                    if self._take_replaced_grad(slot):
                        continue  # eager code set ``.grad`` since (``zero_grad()``): it stays
                    if source is None:
                        named[slot.fqn].grad = device_state[slot.name]
                        continue
                    state_slot.copy_in(source, device_state[slot.name])
                    state_slot.publish_grad()
        # Only once every tensor has it: a write-back cut short (Ctrl-C, an
        # error) is done again before the next eager read.
        self._host_lags = False

    def _write_back_optimizer(self, device_state: dict[str, torch.Tensor] | None = None) -> None:
        """Copy the device's optimizer state (read here, optimizer entries
        only, unless ``device_state`` has them) into the optimizer's own
        tensors (``optimizer.state[param][key]``), in place: they stay the
        objects the user holds, and the state slots go on watching them, so
        an in-place edit afterwards (``exp_avg.zero_()``) is read by the
        next call, as by eager's next step.  An entry the optimizer does
        not hold as such a tensor (no state yet, a Python number) is set to
        the tensor the slot stands for, which is watched from then on."""
        with self.executable._group.lock, _RUNTIME_READ():
            if device_state is None:
                self._adopt_replaced_optimizer_entries()
                device_state = self.executable._state_values(
                    slot.name for slot in self._slots if slot.kind == "optimizer"
                )
            for slot in self._slots:
                if slot.kind == "optimizer":
                    self._write_back_entry(slot, device_state[slot.name])

    def _write_back_entry(self, slot: StateSlot, value: torch.Tensor) -> None:
        """One optimizer state entry of :meth:`_write_back_optimizer`."""
        assert slot.param_index is not None and slot.key is not None
        state_slot = self.executable._slots[slot.name]
        entries = self._optimizer.state[self._parameters[slot.param_index]]
        held = _watchable_state(self._optimizer, self._parameters[slot.param_index], slot.key, value)
        source = state_slot.source()
        with torch.no_grad():
            if held is not None and held is not source:
                # The optimizer was given new tensors since the slot last
                # agreed with it (``optimizer.load_state_dict``): watch those.
                held.copy_(value)
                if state_slot.stand_for(held):
                    self._note_source(slot, held)
                    return
            if source is None:
                entries[slot.key] = value
                return
            state_slot.copy_in(source, value)
            entries[slot.key] = source

    def _note_source(self, slot: StateSlot, tensor: torch.Tensor) -> None:
        """Record ``tensor`` as the one the state slot of optimizer entry
        ``slot`` stands for (steps compiled later find the same slot)."""
        store = self._store
        if store is not None:
            assert slot.param_index is not None and slot.key is not None
            with store.lock:
                store.optimizer_state.setdefault(self._optimizer, {})[(slot.param_index, slot.key)] = tensor

    def _watch_optimizer_tensors(self) -> None:
        """After the device's optimizer state was loaded from the
        optimizer's own tensors: the state slots stand for those tensors
        from now on (an in-place edit of them is read by the next call)."""
        with self.executable._group.lock:
            for slot in self._slots:
                if slot.kind != "optimizer":
                    continue
                assert slot.param_index is not None and slot.key is not None
                state_slot = self.executable._slots[slot.name]
                held = _watchable_state(
                    self._optimizer, self._parameters[slot.param_index], slot.key,
                    torch.empty(state_slot.shape, dtype=state_slot.torch_dtype, device="meta"),
                )
                if held is not None and held is not state_slot.source() and state_slot.stand_for(held):
                    self._note_source(slot, held)

    def _publish_optimizer_entries(self) -> None:
        """Put into ``optimizer.state`` every tensor an optimizer state slot
        stands for where the optimizer holds another object or none (after
        compiling: the state the first call starts from, as eager's first
        step creates it).  From then on each entry is the slot's tensor
        until eager code puts another in its place, which
        :meth:`_replaced_optimizer_entries` notices."""
        with self.executable._group.lock:
            for param, slot, key in self._optimizer_entry_slots:
                source = self.executable._slots[slot.name].source()
                if source is not None:
                    entries = self._optimizer.state.setdefault(param, {})
                    if entries.get(key) is not source:
                        entries[key] = source

    def _replaced_optimizer_entries(self) -> list[StateSlot]:
        """The optimizer state slots whose entry of ``optimizer.state`` is no
        longer the tensor the slot stands for (in-place edits of those the
        slots read themselves): eager code replaced it, or the parameter's
        state (``optimizer.state[p] = {}``), or all of it
        (``optimizer.state.clear()``, a new ``optimizer.state``).  One
        identity check per entry."""
        state = self._optimizer.state
        slots = self.executable._slots
        replaced = []
        for param, slot, key in self._optimizer_entry_slots:
            entries = state.get(param)
            if entries is None or entries.get(key) is not slots[slot.name].source():
                replaced.append(slot)
        return replaced

    def _adopt_replaced_optimizer_entries(self) -> None:
        """Eager's next step reads what ``optimizer.state`` holds now: load
        every entry eager code replaced onto the device (a parameter whose
        state was cleared starts afresh, as eager's ``_init_group`` starts
        it), leaving the other entries as the calls left them on the device
        (their host tensors may lag), and watch the new tensors.  An entry
        the step cannot take (another shape or dtype, a missing key of a
        parameter that has state, a number) is an ExecutionError before
        anything changes."""
        replaced = self._replaced_optimizer_entries()
        if not replaced:
            return
        indices = sorted({slot.param_index for slot in replaced if slot.param_index is not None})
        try:
            held = optimizer_state_of(self._optimizer, [self._parameters[i] for i in indices], indices)
        except TrainingCaptureError as error:
            raise ExecutionError(f"optimizer.state: {error}") from None
        state_of = dict(zip(indices, held))
        values: dict[str, torch.Tensor] = {}
        for slot in replaced:
            assert slot.param_index is not None and slot.key is not None
            entries = state_of[slot.param_index]
            if slot.key not in entries:
                raise ExecutionError(
                    f"optimizer.state of parameter {slot.param_index} has no '{slot.key}' (eager's step would "
                    "fail): set it, clear the parameter's state, or load_state_dict"
                )
            values[slot.name] = self._checked(
                entries[slot.key], slot.name, f"optimizer.state['{slot.key}'] of parameter {slot.param_index}",
                source="a replaced optimizer state entry",
            )
        self.executable.load_state_dict(values)
        for slot in replaced:
            assert slot.param_index is not None and slot.key is not None
            param = self._parameters[slot.param_index]
            state_slot = self.executable._slots[slot.name]
            watched = _watchable_state(self._optimizer, param, slot.key, values[slot.name])
            if watched is None or not state_slot.stand_for(watched):
                # No tensor a slot can watch there (the parameter starts
                # afresh, a number, one another slot watches): the
                # optimizer gets the loaded value.
                watched = values[slot.name]
                state_slot.stand_for(watched)
                self._optimizer.state.setdefault(param, {})[slot.key] = watched
            self._note_source(slot, watched)

    def _reload_optimizer(self) -> None:
        """Set the device's optimizer state from the optimizer's own (after
        ``optimizer.load_state_dict``: the optimizer's post-hook); the
        parameters, buffers and kept gradients stay as the steps left them.
        A loaded state the step cannot take (a missing entry, another shape)
        is an ExecutionError from ``load_state_dict``, and every call of a
        step of this optimizer raises it until a load succeeds: the step
        never runs on the state from before the load."""
        try:
            values = self._optimizer_values()
            if values:
                self.executable.load_state_dict(values)
        except (TrainingCaptureError, ExecutionError) as error:
            message = f"optimizer.load_state_dict: the compiled training step cannot take the loaded state: {error}"
            self._set_unloaded_optimizer(message)
            raise ExecutionError(message) from None
        self._set_unloaded_optimizer(None)
        self._watch_optimizer_tensors()

    def _optimizer_values(self) -> dict[str, torch.Tensor]:
        """Slot name -> the optimizer's own tensor, for every optimizer slot
        (fresh state where the optimizer has none yet).  TrainingCaptureError
        for a state entry that is no tensor, ExecutionError for a missing one."""
        optimizer_state = optimizer_state_of(self._optimizer, list(self._parameters))
        values: dict[str, torch.Tensor] = {}
        for slot in self._slots:
            if slot.kind != "optimizer":
                continue
            assert slot.param_index is not None and slot.key is not None
            entries = optimizer_state[slot.param_index]
            if slot.key not in entries:
                raise ExecutionError(f"optimizer state '{slot.key}' of parameter {slot.param_index} is missing")
            values[slot.name] = entries[slot.key]
        return values

    def _set_unloaded_optimizer(self, message: str | None) -> None:
        """Record (or clear) a failed optimizer load on every step of this
        optimizer: they share the device state it failed to set."""
        store = self._store
        registered = store.steps_of.get(self._optimizer) if store is not None else None
        for step in list(registered or ()) or [self]:
            step._unloaded_optimizer = message

    def reload(self) -> None:
        """Set the device state from the model and the optimizer as they are
        now (after ``model.load_state_dict`` / ``optimizer.load_state_dict``)."""
        # A tensor the calls left stale holds, for eager code, their values.
        refresh_stale(_host_tensors(self._model, self._optimizer, self._store), "reload")
        named = {**dict(self._model.named_parameters()), **dict(self._model.named_buffers())}
        try:
            values = self._optimizer_values()
        except (TrainingCaptureError, ExecutionError) as error:
            raise ExecutionError(f"reload: {error}") from None
        for slot in self._slots:
            if slot.kind in ("param", "buffer"):
                assert slot.fqn is not None
                values[slot.name] = named[slot.fqn].detach()
            elif slot.kind == "grad":
                assert slot.fqn is not None
                grad = named[slot.fqn].grad
                values[slot.name] = grad.detach() if grad is not None else torch.zeros_like(named[slot.fqn].detach())
        self.executable.load_state_dict(values)
        self._host_lags = False
        self._watch_optimizer_tensors()

    def _model_keys(self) -> dict[str, str]:
        """``model.state_dict()`` key -> state slot name (tied weights map
        every key to the one slot)."""
        slot_of = {}
        named = {**dict(self._model.named_parameters()), **dict(self._model.named_buffers())}
        for slot in self._slots:
            if slot.kind in ("param", "buffer") and slot.fqn is not None:  # not a kept gradient's
                slot_of[id(named[slot.fqn])] = slot.name
        keys = {}
        for key, value in _state_dict_entries(self._model).items():
            if id(value) in slot_of:
                keys[key] = slot_of[id(value)]
        return keys


def _refuse_unexpected(what: str, entries: Any, known: Sequence[Any]) -> None:
    """An ExecutionError naming every key of ``entries`` not in ``known``."""
    if not isinstance(entries, dict):
        raise ExecutionError(f"load_state_dict: {what} must be a dict, got {type(entries).__name__}")
    unexpected = [key for key in entries if key not in known]
    if unexpected:
        listed = ", ".join(repr(key) for key in unexpected)
        expected = ", ".join(repr(key) for key in known) or "none"
        raise ExecutionError(f"load_state_dict: {what} has unexpected key(s) {listed} (expected: {expected})")
