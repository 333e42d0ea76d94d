"""The state store: module state on the device, one buffer per tensor,
shared by every executable and training step compiled from one module
(:class:`_StateGroup`, one per ``nn.Module``/``ExportedProgram``), each
buffer in the form (layout, dtype) its slot records (:class:`_StateSlot`).
Calls of executables sharing a group are serialized by its lock; a slot's
buffer is replaced only under it.

A slot follows the module attribute it was made from: when torch registers
another tensor under that attribute (``m.weight = nn.Parameter(...)``,
``m.cache = torch.zeros(...)``, ``load_state_dict(..., assign=True)``, a
replaced submodule), torch's registration hooks re-point the slot to the new
tensor (:func:`_on_registration`), and the next call reads it as it reads
any tensor torch changed.  A tensor registered under a name whose tensor was
deleted (``del m.bias`` first), or under a replaced submodule, and a plain
tensor attribute given another object (``m.scale = t``, which no hook
sees) are found by name at the next call (:meth:`StateWatch.attach`).  A
removed attribute (set to None, or a plain one given a non-tensor) or a
new tensor of another dtype or shape is an ExecutionError at the next
call.  A registered tensor only deleted (``del m.bias``: eager would fail)
or a parameter set to None, which no hook hears, is counted by torch's
``Module.__delattr__`` and ``register_parameter``, wrapped
(:func:`_count_removal`), and refused at the next call.  Not seen: an
entry written into ``_parameters`` or ``_buffers`` directly.

The owner module's ``state_dict()`` and eager forward first copy every
slot some program of the group writes, where it lags the module's tensor,
into that tensor (:meth:`_StateGroup.note_written`), and a
``torch.compile``d graph does so for its inputs (:func:`bring_up_to_date`):
the hloalias backend's always, any other backend's where dynamo traced a
stale tensor (:func:`_inputs_brought_in_by_this_graph`; dynamo's guard on
the tensor's class keeps stale tensors out of the other graphs); a
tensor torch changed since the two last agreed keeps the user's write.
Any other read of a tensor a call left behind (``module.weight * 1``, an
EMA, ``optimizer.state[p]["exp_avg"]``) copies it in first: the call marks
it stale (:func:`_mark_stale`, a class swap), and its first op that may
read values brings it in (:func:`refresh_stale`).  So torch never reads a
stale module tensor, except one that shares memory with it and was made
before the calls (``v = p.detach()`` taken before), and state of other
tensor classes, which is not marked.

Writes torch does not count in the tensor's version, through ``.data``,
``.numpy()``/``__array__``, ``__dlpack__`` or ``untyped_storage()``/
``storage()`` taken from a tensor a slot stands for, are read in by the
next call: the tensor's class is a watched subclass whose escape hatches
mark its slots (:class:`_WatchedTensorHook`, :meth:`_StateSlot.host_may_change`),
at no cost to a call or an op without an escape.  What it cannot see is
listed at the class.

A program on a mesh has a group of its own (its state is placed by its
shardings), with the same hooks and marks: a read gathers the buffer in
one process; across processes, where that gather is a collective every
process must enter, the group refuses the read (``before_read``) until
``write_back()``.  Before a call, the per-call check (:class:`StateWatch`)
copies in what another group's programs of the module left
(:func:`read_others_stale`)."""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import jax
import torch
from torch.export import ExportedProgram

from hloalias import interrupts
from hloalias.contract import StoredLayout
from hloalias.errors import ExecutionError, HloaliasError
from torch.utils.weak import WeakIdKeyDictionary
from hloalias.runtime.ownership import _resolved, _torch_dtype_of_jax, _writable_on_host, array_to_torch, torch_to_device

if TYPE_CHECKING:
    from hloalias.runtime.plan import _CallPlan

#: Marks the forward and state-dict pre-hooks a state group adds to its
#: module (:meth:`_StateGroup.note_written`).
_SYNC_HOOK = "_hloalias_state_sync"
_REDUCE = "__reduce_ex__"


class _CurrentWhenCopied:
    """A state group's owner module's ``__reduce_ex__`` (an instance
    attribute: ``copy.deepcopy`` and ``pickle`` look it up on the object):
    copies lagging state into the module first, then reduces it as its
    class does, leaving out this attribute and the group's hooks, so the
    copy or the pickle holds the current values and is a plain module."""

    def __init__(self, group: "weakref.ref[_StateGroup]", module: "weakref.ref[torch.nn.Module]") -> None:
        #: The module's groups: its own, and one per program on a mesh.
        self.groups, self.module = [group], module

    def __call__(self, protocol: int) -> Any:
        module = self.module()
        if module is None:
            raise TypeError("cannot reduce a module that no longer exists")
        self.groups[:] = [ref for ref in self.groups if ref() is not None]
        for ref in list(self.groups):
            group = ref()
            if group is not None and _LAGGING[0]:
                group.write_back_written(f"copying or pickling {type(module).__name__}")
        reduced = type(module).__reduce_ex__(module, protocol)
        if not (isinstance(reduced, tuple) and len(reduced) > 2 and isinstance(reduced[2], dict)):
            return reduced
        state = dict(reduced[2])
        state.pop(_REDUCE, None)
        for table in ("_forward_pre_hooks", "_state_dict_pre_hooks"):
            hooks = state.get(table)
            if hooks:
                state[table] = type(hooks)(
                    (key, hook) for key, hook in hooks.items() if not getattr(hook, _SYNC_HOOK, False)
                )
        with_kwargs = state.get("_forward_pre_hooks_with_kwargs")
        if with_kwargs:
            kept = state["_forward_pre_hooks"]
            state["_forward_pre_hooks_with_kwargs"] = type(with_kwargs)(
                (key, value) for key, value in with_kwargs.items() if key in kept
            )
        return (*reduced[:2], state, *reduced[3:])


def is_state_sync_hook(hook: Any) -> bool:
    """Whether ``hook`` is the pre-hook a state group adds (see below)."""
    return bool(getattr(hook, _SYNC_HOOK, False))


def user_forward_pre_hooks(module: torch.nn.Module) -> list[Any]:
    """``module``'s forward pre-hooks except the one a state group adds to
    bring lagging state in: that hook is skipped while torch traces, so it
    is no part of a traced program, and the import and program caches'
    keys must not see it (else a module's second compile missed both)."""
    return [hook for hook in module._forward_pre_hooks.values() if not getattr(hook, _SYNC_HOOK, False)]


class _StateSlot:
    """One state tensor of a module on one device: the single device buffer
    every executable compiled from that module reads and updates.

    ``layout`` is the buffer's layout: None for torch's, else the buffer
    holds ``tensor.permute(P).flip(R)`` (``hloalias.stored_permutation`` and
    ``stored_reversed``, written by ``permute-conv-kernel-state`` on
    read-only convolution kernels).  ``bits`` is the buffer's dtype when it
    holds the tensor's bit pattern as the same-width integer
    (``tensor.view(torch.int16)``: ``hloalias.stored_bits_of``, written by
    ``store-state-as-bits``), else None.  Both are fixed by the first
    executable that uses the slot and change only back to torch's
    (:meth:`to_torch_layout`, :meth:`to_torch_dtype`), when a later
    executable writes, donates or views the tensor in torch's.  An
    executable that reads it in another form copies it into its own on
    each call; one that writes it in the other dtype has its new value
    stored back as the slot's dtype (the ``array`` setter)."""

    def __init__(
        self, source: torch.Tensor, device: Any, put: Callable[[torch.Tensor], jax.Array] | None = None,
        layout: StoredLayout | None = None, bits: torch.dtype | None = None,
    ) -> None:
        self.source: weakref.ref[torch.Tensor] = weakref.ref(source)
        #: The parameter whose ``.grad`` shows this slot's tensor (a training
        #: step's kept gradient: :meth:`show_as_grad_of`), else None.
        self.grad_of: weakref.ref[torch.Tensor] | None = None
        #: What that parameter's ``.grad`` was when hloalias last set or
        #: saw it (:meth:`note_grad_shown`): a weakref, or None for None.
        self._grad_shown: weakref.ref[torch.Tensor] | None = None
        #: Whether the last step that ran set this kept gradient to None
        #: again (:meth:`show_grad_cleared`): its parameter's ``.grad`` reads None.
        self.grad_cleared = False
        #: Whether a lagging buffer marks its tensors stale (:func:`_mark_stale`):
        #: not while the slot is being made (the buffer is the tensor's copy).
        self._marks = False
        self.on_mesh = put is not None
        self._group: weakref.ref[_StateGroup] | None = None
        #: The tensor that keeps this slot alive while it lags (see
        #: :meth:`_keep_alive_while_lagging`), else None.
        self._kept_by: weakref.ref[torch.Tensor] | None = None
        #: For a BatchNorm running statistic: the slot of its module's
        #: ``num_batches_tracked``, whose version stands in for its own
        #: (:meth:`counted_by`); else None.
        self.stats_counter: _StateSlot | None = None
        #: How often torch's edits of this slot's tensor were read in
        #: (:meth:`refresh_from_torch`): a ``num_batches_tracked`` slot's
        #: count tells its statistics an eager forward ran.
        self.torch_writes = 0
        #: ``stats_counter``'s ``torch_writes`` when this slot last agreed with its tensor.
        self._counter_writes = 0
        #: For state torch may change in place without counting a version
        #: (a batch norm's running statistics: :meth:`watch_values`), a host
        #: copy of what the tensor held when the two last agreed, which the
        #: per-call check compares its bytes with; else None.
        self.snapshot: torch.Tensor | None = None
        #: Tensors eager code took from the slot's tensor through ``.data``
        #: (:func:`_note_escape`): each shares its memory under a version
        #: counter of its own, recorded (with its address) when the two
        #: last agreed; the per-call check watches them as it watches the
        #: tensor.  Dead ones are dropped at the next agreement.
        self.aliases: tuple[tuple[weakref.ref[torch.Tensor], int, int], ...] = ()
        #: What else eager code took that shares the memory and counts no
        #: version (the array ``.numpy()`` returned): while one lives, the
        #: tensor is compared by value (:attr:`snapshot`, taken at the next
        #: agreement and dropped at the first one after the last died).
        self.held: tuple[weakref.ref[Any], ...] = ()
        #: Whether the snapshot stays for good (:meth:`watch_values`).
        self.compares_values = False
        with _RUNTIME_READ():
            self._made(source, device, put, layout, bits)

    def _made(
        self, source: torch.Tensor, device: Any, put: Callable[[torch.Tensor], jax.Array] | None,
        layout: StoredLayout | None, bits: torch.dtype | None,
    ) -> None:
        # Memory another holder shares already (a ``w = p.data`` kept from
        # before compiling) is written where no escape is taken: compared
        # by value (:func:`_memory_shared`).  Counted before the upload.
        shared = _memory_shared(source)
        #: What torch's tensor was when the buffer last equalled it: its
        #: version counter and memory (``.data =`` and ``module.to(dtype)``
        #: swap the memory without counting a version).
        self.version = source._version
        self.source_ptr = source.data_ptr()
        self.shape = tuple(source.shape)
        self.device = device
        self.put = put if put is not None else (lambda t: torch_to_device(t, device, owned=True))
        self.layout = layout
        self.torch_dtype = source.dtype
        self.bits = bits
        #: Call plans whose cached argument lists hold this slot's buffer:
        #: replacing the buffer drops those lists (see ``_CallPlan``).
        self.readers: list[weakref.ref[_CallPlan]] = []
        self._array: jax.Array | None = None
        #: Whether the buffer holds a value the module's tensor does not
        #: (a call wrote it since the two last agreed): see :func:`bring_up_to_date`.
        self.lags = False
        self.array = self.upload(_resolved(source))
        self._set_lags(False)
        self.consumed_by: str | None = None
        self.nbytes = source.numel() * source.element_size()
        #: How often the module attribute behind the slot was given another
        #: tensor (:meth:`follow`); why the slot cannot follow it, if so.
        self.replacements = 0
        self.unfollowable: str | None = None
        _slots_of(source).append(weakref.ref(self))
        self._marks = True
        if shared:
            self.watch_values()

    @property
    def stored_dtype(self) -> torch.dtype:
        """The dtype of the slot's buffer: ``bits``, else torch's."""
        return self.bits if self.bits is not None else self.torch_dtype

    @property
    def array(self) -> jax.Array | None:
        """The slot's buffer (None once consumed by a donation), always in
        the slot's layout and dtype."""
        return self._array

    @array.setter
    def array(self, value: jax.Array | None) -> None:
        # A program compiled for the other interpretation of the same bits
        # (bf16 vs. its i16 bits) wrote the state: store its bits as ours.
        # (``_array``, when set, has the stored dtype: the usual case is one
        # dtype comparison.)
        current = self._array
        if value is not None and (current is None or value.dtype != current.dtype) and (
            _torch_dtype_of_jax(value.dtype) != self.stored_dtype
        ):
            value = self._reinterpreted(value)
        self._array = value
        if value is not None and not self.lags:
            self._set_lags(True)
        if self.readers:
            self._forget_cached_lists()

    def _set_lags(self, lags: bool) -> None:
        # Ordered for a Ctrl-C at any point: the flag changes last when the
        # slot starts lagging and first when it stops, so a lagging slot is
        # always kept alive by its tensor and marks it stale (its values
        # are neither lost with a dropped program nor read stale).  Cut
        # short, the steps leave at most a marked tensor or a kept slot that
        # agree, which the tensor's next read drops (:func:`refresh_stale`),
        # and counts counted over, never under; starting again redoes them.
        if lags == self.lags:
            return
        if lags:
            _LAGGING[0] += 1
            # Once per change of agreement, never per call: a slot that
            # keeps lagging (calls and no reads) marks nothing again.
            _LAG_STARTS[0] += 1
            if self.on_mesh:
                _MESH_LAG_STARTS[0] += 1
            if self._marks:
                _mark_stale(self)
            self._keep_alive_while_lagging(True)
            self.lags = True
            return
        self.lags = False
        _LAGGING[0] -= 1
        self._keep_alive_while_lagging(False)
        if self._marks:
            for tensor in self._shown_by():
                _unmark_if_current(tensor)

    def _keep_alive_while_lagging(self, lags: bool) -> None:
        """While the buffer holds a value its tensor does not, the tensor
        keeps the slot alive (:data:`_KEPT_WHILE_LAGGING`): a program dropped
        before anyone read what its calls left (a training step made inside
        a function that returns) must not take the module's new values with
        it.  The next read of the stale tensor copies them in as usual.
        Idempotent (see :meth:`_set_lags`)."""
        if lags:
            source = self.source()
            if source is None or source is _REMOVED:
                return
            kept = _KEPT_WHILE_LAGGING.get(source)  # type: ignore[no-untyped-call]
            if kept is None:
                _KEPT_WHILE_LAGGING[source] = kept = []
            if not any(slot is self for slot in kept):
                kept.append(self)
            self._kept_by = weakref.ref(source)
            return
        holder = self._kept_by() if self._kept_by is not None else self.source()
        kept = _KEPT_WHILE_LAGGING.get(holder) if holder is not None else None  # type: ignore[no-untyped-call]
        if kept is not None:
            kept[:] = [slot for slot in kept if slot is not self]
            if not kept:
                del _KEPT_WHILE_LAGGING[holder]
        self._kept_by = None

    def _shown_by(self) -> list[torch.Tensor]:
        """The torch tensors a read of which must see this slot's buffer:
        its own tensor, the live ``.data`` tensors taken from it
        (:attr:`aliases`: a write through one while the slot lags must
        apply to the calls' value, as eager's does) and, for a kept
        gradient, the parameter whose ``.grad`` it is."""
        shown = [self.source(), *(ref() for ref, _, _ in self.aliases)]
        if self.grad_of is not None:
            shown.append(self.grad_of())
        return [tensor for tensor in shown if tensor is not None and tensor is not _REMOVED]

    def shown_through_alias(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a live ``.data`` tensor taken from this
        slot's tensor (:attr:`aliases`)."""
        return any(ref() is tensor for ref, _, _ in self.aliases)

    def copied_alone(self) -> bool:
        """Whether a read of this slot's tensor copies this buffer alone in
        (:meth:`copy_to_source`): on one device, and on a mesh in one
        process (the gather is local), unless its group serves reads
        itself (``before_read``: a training step's whole write-back, or
        the refusal across processes, where the gather is a collective
        every process must enter, which no hook can promise)."""
        if not self.on_mesh:
            return True
        group = self._group() if self._group is not None else None
        return group is None or group.before_read is None

    def show_as_grad_of(self, parameter: torch.Tensor) -> None:
        """This slot's tensor is ``parameter.grad`` for eager code (a
        training step's kept gradient): a read of ``parameter`` (its
        ``.grad``) copies the buffer in and sets ``.grad`` to the slot's
        tensor, whose in-place edits the next call then reads."""
        old = self.grad_of() if self.grad_of is not None else None
        if old is parameter:
            return
        self.grad_of = weakref.ref(parameter)
        found: list[weakref.ref[_StateSlot]] | None = _GRAD_SLOTS_OF.get(parameter)  # type: ignore[no-untyped-call]
        if found is None:
            found = _GRAD_SLOTS_OF[parameter] = []
        found.append(weakref.ref(self))
        self.note_grad_shown()
        if self.lags:
            _mark_stale(self)

    def publish_grad(self) -> None:
        """After the buffer was copied into the slot's tensor: the
        parameter's ``.grad`` is that tensor (as eager's accumulated one),
        unless the last step set it to None (:meth:`show_grad_cleared`)."""
        parameter = self.grad_of() if self.grad_of is not None else None
        source = self.source()
        if parameter is not None and source is not None and parameter.grad is not source and not self.grad_cleared:
            parameter.grad = source
        self.note_grad_shown()

    def show_grad_cleared(self, cleared: bool) -> None:
        """The last step that ran set this kept gradient to None again
        (``cleared``: ``optimizer.zero_grad()`` last) or left it set: for
        None the buffer holds zeros (what the next accumulating call adds
        to, as eager's backward into None starts from nothing) and the
        parameter's ``.grad`` reads None, as eager's does, until a call
        sets it again.  Where eager code set ``.grad`` since hloalias last
        did, it stays the user's."""
        self.grad_cleared = cleared
        parameter = self.grad_of() if self.grad_of is not None else None
        if not cleared or parameter is None:
            return
        replaced, _ = self.grad_replaced()
        if not replaced:
            with _RUNTIME_READ():
                parameter.grad = None
        self.note_grad_shown()

    def note_grad_shown(self) -> None:
        """Record what the parameter's ``.grad`` is now (hloalias set it, or
        a call read it): :meth:`grad_replaced` compares against it."""
        parameter = self.grad_of() if self.grad_of is not None else None
        if parameter is None:
            return
        with _RUNTIME_READ():
            grad = parameter.grad
        self._grad_shown = weakref.ref(grad) if grad is not None else None

    def grad_replaced(self) -> tuple[bool, torch.Tensor | None]:
        """Whether eager code set the parameter's ``.grad`` to another
        tensor or to None (``optimizer.zero_grad()``) since
        :meth:`note_grad_shown`, and what it holds now."""
        parameter = self.grad_of() if self.grad_of is not None else None
        if parameter is None:
            return False, None
        with _RUNTIME_READ():
            grad = parameter.grad
        shown = self._grad_shown
        same = grad is None if shown is None else grad is not None and shown() is grad
        return not same, grad

    def follow(self, new: torch.Tensor | None) -> None:
        """The module attribute this slot stands for now holds ``new``
        (None: removed).  The slot stands for ``new`` from now on; the next
        call finds it changed (no version or address can match) and reads
        it (:meth:`refresh_from_torch`, which refuses another dtype or
        shape).  Called from torch's registration hooks: never raises."""
        self.replacements += 1
        group = self._group() if self._group is not None else None
        old = self.source()
        if old is not None and old is not new and self.lags and self.copied_alone():
            # Eager code holding the old tensor reads what the calls left
            # in it, as eager's old tensor holds its last update.
            try:
                self.copy_to_source()
            except Exception:  # noqa: BLE001 - called from torch's registration hooks
                pass
        if new is None:
            self.unfollowable = "was removed from the module (deleted or set to None)"
            new = _REMOVED
        elif new.is_inference():
            # No version counter to read: the slot cannot see torch's edits
            # of it, so it watches nothing and refuses the next call.
            self.unfollowable = f"was given {_INFERENCE_TENSOR},"
            new = _REMOVED
        elif group is not None and group.existing(new, self.device) not in (None, self):
            self.unfollowable = "now holds a tensor that another state entry of the program also holds"
        if group is not None:
            with group.lock:
                if old is not None:
                    group._slots.pop((id(old), self.device.platform, self.device.id), None)
                if new is not _REMOVED and self.unfollowable is None:
                    group._slots[(id(new), self.device.platform, self.device.id)] = weakref.ref(self)
        self.source = weakref.ref(new)
        self.aliases, self.held = (), ()  # they show the old tensor's memory
        if new is not _REMOVED:
            _slots_of(new).append(weakref.ref(self))
        self.version = -1
        self.source_ptr = -1
        _AGREEMENTS[0] += 1
        if old is not None:
            _unmark_if_current(old)

    def stand_for(self, new: torch.Tensor) -> bool:
        """Stand for ``new`` from now on, which holds the buffer's value
        (the caller just copied it there, or loaded the buffer from it): a
        training step's optimizer state whose owner (``optimizer.state``)
        was given new tensors by ``optimizer.load_state_dict``.  Unlike
        :meth:`follow` this is no replacement a program must refuse: the
        slot and ``new`` agree.  False (nothing changed) where ``new``
        cannot be watched (an inference tensor, another dtype or shape) or
        another slot of the group stands for it already."""
        if new.is_inference() or new.dtype != self.torch_dtype or tuple(new.shape) != self.shape:
            return False
        group = self._group() if self._group is not None else None
        with group.lock if group is not None else contextlib.nullcontext():
            if group is not None:
                if group.existing(new, self.device) not in (None, self):
                    return False
                old = self.source()
                if old is not None and old is not new and self.lags and self.copied_alone():
                    self.copy_to_source()  # the replaced tensor keeps the calls' last value
                if old is not None:
                    group._slots.pop((id(old), self.device.platform, self.device.id), None)
                group._slots[(id(new), self.device.platform, self.device.id)] = weakref.ref(self)
            old = self.source()
            self.source = weakref.ref(new)
            self.aliases, self.held = (), ()  # they show the old tensor's memory
            _slots_of(new).append(weakref.ref(self))
            self.mark_synced()
        if old is not None and old is not new:
            _unmark_if_current(old)
        return True

    def copy_to_source(self) -> None:
        """Copy the buffer into the module's tensor (in place) when it
        lags it and torch did not change the tensor since the two last
        agreed; then they agree."""
        if not self.lags:
            return
        group = self._group() if self._group is not None else None
        with group.lock if group is not None else contextlib.nullcontext(), torch.no_grad(), _RUNTIME_READ():
            source, array = self.source(), self._array
            if not self.lags or source is None or array is None or array.is_deleted():
                return
            if self.torch_changed():
                # The user's write is the newest value, unless the tensor
                # holds the calls' value already (a copy in that a Ctrl-C
                # cut short before it recorded the agreement, with the
                # snapshot of a compared slot still the old value): then
                # they agree, and what torch does next is read as an edit.
                if self.copied_alone() and not _bits_differ(source, self.torch_value(array)):
                    self.mark_synced()
                return
            self.copy_in(source, self.torch_value(array))
            if self.grad_of is not None:
                self.publish_grad()

    def copy_in(self, target: torch.Tensor, value: torch.Tensor) -> None:
        """Copy ``value`` (the buffer's, in torch's form) into ``target``
        (the slot's tensor, or the module attribute it stands for), then
        record that they agree (:meth:`mark_synced`).  The version the copy
        counts is recorded before it (no point where Python delivers a
        Ctrl-C lies between the two): cut after the copy, the slot lags a
        tensor torch did not change, whose next read copies the same value
        again and records the agreement, rather than one torch seems to
        have changed, which no read copies into again."""
        with _RUNTIME_READ():
            if target is self.source():
                before = self.version
                self.version = target._version + 1
                try:
                    target.copy_(value)
                except BaseException:
                    if target._version != self.version:  # the copy failed: nothing counted
                        self.version = before
                    raise
            else:
                target.copy_(value)
        self.mark_synced()

    def torch_changed(self) -> bool:
        """Whether torch changed the slot's tensor (in place, or its memory
        swapped) since the buffer last equalled it.  A BatchNorm running
        statistic counts as changed, unless the slot lags, when torch
        changed its module's ``num_batches_tracked`` (:meth:`counted_by`)."""
        source = self.source()
        if source is None:
            return False
        with _RUNTIME_READ():
            if source._version != self.version or source.data_ptr() != self.source_ptr:
                return True
            if self.snapshot is not None and _bits_differ(source, self.snapshot):
                return True
            if self.aliases or self.held:
                for ref, version, pointer in self.aliases:
                    alias = ref()
                    if alias is not None and (alias._version != version or alias.data_ptr() != pointer):
                        return True
                if self.snapshot is None and any(ref() is not None for ref in self.held):
                    return True  # no copy to compare with yet (:meth:`_record_aliases`)
        counter = self.stats_counter
        return counter is not None and not self.lags and (
            counter.torch_writes != self._counter_writes or counter.torch_changed()
        )

    def written_while_lagging(self) -> bool:
        """Whether torch wrote the tensor's memory in place while the slot
        lagged (:meth:`torch_changed` while :attr:`lags`; not a replaced
        tensor, nor swapped memory, which hold the user's whole value):
        through something that shares the memory and that no stale mark
        brings up to date first (a kept ``numpy()`` array, a DLPack consumer,
        a storage, a tensor made before the calls), so the write applied to
        the value from before the calls.  :meth:`refresh_from_torch`
        refuses it: reading it in would put that over the calls' value."""
        source, array = self.source(), self._array
        if not self.lags or self.source_ptr == -1 or source is None or source is _REMOVED:
            return False
        with _RUNTIME_READ():
            if source.data_ptr() != self.source_ptr or not self.torch_changed():
                return False
            if array is None or array.is_deleted():
                return False  # no value of the calls' to lose (a donation consumed it)
            if not self.copied_alone():
                return True  # no compare: on a mesh across processes a gather is a collective
            # The tensor holds the calls' value (a copy in cut short by a
            # Ctrl-C before it recorded the agreement): reading it in loses
            # nothing.  A compare, on this rare path only.
            return _bits_differ(source, self.torch_value(array))

    def host_overwritten(self) -> None:
        """hloalias wrote the whole tensor while the slot lagged (a kept
        gradient set from the ``.grad`` eager code gave the parameter): its
        value is the newest, which the next call reads in.  Called after
        the write (cut short before, the next call refuses, never reads a
        part-stale value)."""
        self._set_lags(False)

    def watch_values(self) -> None:
        """Compare this slot's tensor with a copy of what it held when the
        two last agreed (:attr:`snapshot`) at every call and in
        :meth:`torch_changed`: torch may change it in place without counting
        a version (aten's batch norm updates its running statistics so:
        ``F.batch_norm(x, rm, rv, training=True)``, ``torch.batch_norm``,
        ``torch.native_batch_norm``, a norm module's train-mode forward),
        and a difference is then read in as torch's edit.  For small
        tensors only (the per-call cost is a compare of their bytes).
        Taken now: a change made before it is not seen.  Idempotent."""
        source = self.source()
        self.compares_values = True
        if self.snapshot is not None or source is None or source is _REMOVED:
            return
        with _RUNTIME_READ(), torch.no_grad():
            self.snapshot = _resolved(source).clone(memory_format=torch.contiguous_format)
        _AGREEMENTS[0] += 1  # the watches take it into their tuples

    def _record_snapshot(self) -> None:
        """The slot agrees with its tensor: its value is the snapshot's now
        (copied in place, so the watches' tuples stay valid).  Called after
        the agreement's version is recorded: cut short before, the next
        check finds a difference and reads the tensor in again (an upload
        too many, never a change missed)."""
        snapshot, source = self.snapshot, self.source()
        if snapshot is None or source is None or source.dtype != snapshot.dtype or source.shape != snapshot.shape:
            return
        with _RUNTIME_READ(), torch.no_grad():
            snapshot.copy_(_resolved(source))

    def _record_aliases(self) -> None:
        """The slot agrees with its tensor, so with the memory its aliases
        show: record their versions and addresses as of now, and drop the
        dead ones.  Called after the agreement's version is recorded (as
        :meth:`_record_snapshot`): cut short before, the next check finds
        an alias changed and reads the tensor in again (an upload too many,
        never a change missed)."""
        if not self.aliases and not self.held:
            return
        with _RUNTIME_READ():
            self.aliases = tuple(
                (ref, alias._version, alias.data_ptr()) for ref, _, _ in self.aliases if (alias := ref()) is not None
            )
        self.held = tuple(ref for ref in self.held if ref() is not None)
        source = self.source()
        if self.held and self.snapshot is None and source is not None and source is not _REMOVED:
            with _RUNTIME_READ(), torch.no_grad():
                self.snapshot = _resolved(source).clone(memory_format=torch.contiguous_format)
        elif not self.held and not self.compares_values:
            self.snapshot = None

    def host_may_change(self, alias: Any) -> None:
        """Eager code took ``alias`` from the slot's tensor (``.data``,
        ``.numpy()``, DLPack, its storage: :func:`_note_escape`), through
        which torch writes the memory without counting the tensor's
        version: the next call reads the tensor in, and a ``.data`` tensor
        (or a live array) is watched from then on (:attr:`aliases`,
        :attr:`held`).  The version is forgotten last, with the count the
        watches rebuild on, in one step no Ctrl-C can split: cut short
        before, the alias never reached the caller."""
        if isinstance(alias, torch.Tensor):
            with _RUNTIME_READ():
                entry = (weakref.ref(alias), alias._version, alias.data_ptr())
            # Found from the alias when a call leaves the slot lagging: it
            # is marked stale with the tensor (:meth:`_shown_by`).
            found: list[weakref.ref[_StateSlot]] | None = _ALIAS_SLOTS.get(alias)  # type: ignore[no-untyped-call]
            if found is None:
                _ALIAS_SLOTS[alias] = found = []
            found.append(weakref.ref(self))
            self.aliases = (*(kept for kept in self.aliases if kept[0]() is not None), entry)
        elif alias is not None:
            try:
                ref = weakref.ref(alias)
            except TypeError:  # no weak reference (a DLPack capsule): read in once
                pass
            else:
                self.held = (*(kept for kept in self.held if kept() is not None), ref)
        self.version = -1  # no tensor's version: never equal
        _AGREEMENTS[0] += 1

    def counted_by(self, counter: "_StateSlot") -> None:
        """This slot holds a running statistic (``running_mean``,
        ``running_var``) of a module whose ``num_batches_tracked``
        ``counter`` holds.  A train-mode batch norm that torch runs (an
        eager forward, a ``torch.compile`` graph of another backend)
        updates the statistics in place without counting a version
        (aten's ``native_batch_norm`` schema does not mark them written),
        but the module's forward counts ``num_batches_tracked`` with
        ``add_``: a change of the counter that torch made since this slot
        last agreed is taken as one of the statistic (:meth:`torch_changed`),
        and the next call reads it in.  The per-call check watches the
        counter's tensor already (it is a slot of the same program).  A
        lagging slot ignores it: the calls' value is newer, and a forward
        brings it in before reading it.  A module without
        ``num_batches_tracked``, and ``F.batch_norm`` on statistics no
        call left stale: their values are compared (:meth:`watch_values`,
        ``runtime/running_stats.py``)."""
        if self.stats_counter is None and counter is not self:
            self.stats_counter = counter
            self._note_counter()

    def _note_counter(self) -> None:
        """Record the counter's torch writes as seen (this slot agrees with
        its tensor now), including one pending that its next refresh reads."""
        counter = self.stats_counter
        if counter is not None:
            self._counter_writes = counter.torch_writes + (1 if counter.torch_changed() else 0)

    def mark_synced(self) -> None:
        """Record that torch's tensor now holds the buffer's value (it was
        just copied there, as ``TrainingStep.write_back`` does)."""
        source = self.source()
        if source is not None:
            with _RUNTIME_READ():
                self.version = source._version
                self.source_ptr = source.data_ptr()
            self._set_lags(False)
            self._note_counter()
            self._record_snapshot()
            self._record_aliases()
            _AGREEMENTS[0] += 1

    def refresh_from_torch(self, name: str) -> None:
        """Make the buffer hold what torch's tensor holds now, after torch
        changed it (:meth:`torch_changed`): the user's write is the newest
        value, as in eager, also where calls updated the state since (the
        module's tensor keeps what it held when the two last agreed: after
        compiling, ``write_back()`` or the previous refresh).  Refused
        (ExecutionError, nothing changed) when the tensor's dtype or shape
        changed: the program was compiled for the old ones."""
        source = self.source()
        if source is None:
            return
        if self.unfollowable is not None:
            raise ExecutionError(
                f"module state '{name}' {self.unfollowable} after compiling; compile again"
            )
        if self.written_while_lagging():
            raise ExecutionError(
                f"module state '{name}' was written in place while a call's newer value of it was on the "
                "device, through memory it shares that hloalias cannot bring up to date first (an array from "
                "numpy()/np.asarray, a DLPack consumer, a storage, or a tensor sharing its memory made before "
                "the calls): the write applied to the value from before the calls, where eager's applies to "
                "the newest; nothing ran. Call write_back() on the executable or training step (the calls' "
                "values replace that write), then write again; reading the tensor first (t.clone()) brings "
                "the calls' values in before such a write"
            )
        if source.dtype != self.torch_dtype or tuple(source.shape) != self.shape:
            raise ExecutionError(
                f"module state '{name}' is now {source.dtype} {list(source.shape)}, but the program was compiled "
                f"for {self.torch_dtype} {list(self.shape)} (the module was converted after compiling); "
                "compile again"
            )
        with _RUNTIME_READ():
            # Not through the ``array`` setter (the upload has the slot's
            # form): the slot never lags the tensor it reads in, so a
            # Ctrl-C before the agreement is recorded leaves a change the
            # next call reads in again, never a lagging slot whose tensor
            # changed (:meth:`written_while_lagging`, which refuses).
            self._array = self.upload(_resolved(source))
            if self.readers:
                self._forget_cached_lists()
            self.version = source._version
            self.source_ptr = source.data_ptr()
        self.consumed_by = None
        self._set_lags(False)
        self.torch_writes += 1
        self._note_counter()
        self._record_snapshot()
        self._record_aliases()
        _AGREEMENTS[0] += 1

    def _forget_cached_lists(self) -> None:
        """Drop the argument lists of the plans reading this slot: they hold
        the replaced buffer (and would keep it alive)."""
        for reader in self.readers:
            plan = reader()
            if plan is not None:
                plan.state_arrays = None

    def _reinterpreted(self, value: jax.Array) -> jax.Array:
        """``value`` (the state's bits in the other dtype of the same width)
        in the slot's dtype: copied into the current buffer when that is
        alive and writable on the host (views of it stay live), else into a
        new one."""
        tensor = array_to_torch(value).view(self.stored_dtype)
        current = self._array
        if current is not None and not current.is_deleted() and _writable_on_host(current):
            array_to_torch(current).copy_(tensor)
            return current
        return self.put(tensor)

    def upload(self, tensor: torch.Tensor) -> jax.Array:
        """A new device buffer holding ``tensor`` (torch's layout and dtype) in the slot's."""
        return self.put(_stored_form(tensor, self.layout, self.bits))

    def torch_value(self, array: jax.Array) -> torch.Tensor:
        """``array`` (a buffer in the slot's layout and dtype) as a torch
        tensor in torch's: on CPU a zero-copy view unless the layout flips
        dimensions (torch has no negative strides: then a copy)."""
        tensor = array_to_torch(array)
        if self.bits is not None:
            tensor = tensor.view(self.torch_dtype)
        if self.layout is None:
            return tensor
        if self.layout.reversed:
            tensor = tensor.flip(self.layout.reversed)
        return tensor.permute(self.layout.inverse)

    def write(self, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` (torch's layout and dtype) into the slot's buffer in place."""
        assert self.array is not None
        array_to_torch(self.array).copy_(_stored_form(tensor, self.layout, self.bits))

    def array_in(self, array: jax.Array, layout: StoredLayout | None, bits: torch.dtype | None = None) -> jax.Array:
        """``array`` (in the slot's layout and dtype) copied into ``layout``
        and ``bits`` (None: torch's), for an executable compiled for another
        form."""
        return self.put(_stored_form(self.torch_value(array), layout, bits))

    def to_torch_layout(self) -> None:
        """Store the buffer in torch's layout from now on (a copy, once)."""
        if self.layout is None:
            return
        if self.array is not None and not self.array.is_deleted():
            # The same value in another layout: no new value, so not
            # through the ``array`` setter, which would have the slot lag
            # its tensor (a change torch made then reads as one made
            # behind a stale mark: :meth:`written_while_lagging`).
            self._array = self.array_in(self.array, None, self.bits)
            self._forget_cached_lists()
        self.layout = None

    def to_torch_dtype(self) -> None:
        """Store the buffer in torch's dtype from now on (a copy, once)."""
        if self.bits is None:
            return
        array = self._array
        fresh = None if array is None or array.is_deleted() else self.array_in(array, self.layout, None)
        self.bits = None
        # A consumed buffer becomes None (using it still names the donation):
        # ``_array``, when set, always has the stored dtype.
        self._array = fresh
        self._forget_cached_lists()


# -- stale tensors ------------------------------------------------------------
#
# A call leaves the state's new values on the device; torch's tensors keep
# the values of the last agreement.  So that eager code never reads those
# silently (``model.weight``, an EMA over ``model.parameters()``,
# ``opt.state[p]["exp_avg"]``), a slot that starts lagging marks its tensors
# stale: their class becomes a subclass of their own (as torch's
# ``UninitializedParameter`` swaps ``__class__``) whose ``__torch_function__``
# copies the buffers in (:func:`refresh_stale`) and restores the class before
# the first op that may read values runs.  Marking happens when a slot
# starts lagging, once, never per call: calls nobody reads between cost
# nothing more.  hloalias's own reads (the per-call version watch, uploads,
# write-back, hooks) run under :data:`_RUNTIME_READ`, which skips the
# subclass's hook.

#: hloalias reads or writes torch's tensors itself: no stale-tensor hook.
_RUNTIME_READ = torch._C.DisableTorchFunctionSubclass

#: A stale class's attribute naming the class it stands in for.
_FRESH_CLASS = "_hloalias_fresh_class"

#: Tensor properties (getters and setters) and methods that read no values:
#: a stale tensor answers them without copying anything in.
_METADATA_PROPERTIES = frozenset({
    "shape", "dtype", "device", "requires_grad", "is_leaf", "ndim", "layout", "names", "_version", "is_cpu",
    "is_cuda", "is_xpu", "is_mps", "is_meta", "is_sparse", "is_sparse_csr", "is_quantized", "is_mkldnn",
    "is_nested", "itemsize", "nbytes", "name", "grad_fn", "_backward_hooks", "_post_accumulate_grad_hooks",
    "output_nr", "_base", "is_vulkan", "is_ipu", "is_maia", "is_mtia", "is_xla", "is_lazy",
})
_METADATA_METHODS = frozenset({
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.ndimension, torch.Tensor.numel, torch.Tensor.nelement,
    torch.Tensor.element_size, torch.Tensor.stride, torch.Tensor.storage_offset, torch.Tensor.is_contiguous,
    torch.Tensor.is_floating_point, torch.Tensor.is_complex, torch.Tensor.is_signed, torch.Tensor.get_device,
    torch.Tensor.data_ptr, torch.Tensor.is_inference, torch.Tensor.requires_grad_, torch.Tensor.__len__,
    torch.Tensor._is_view, torch.Tensor.is_pinned, torch.Tensor.is_shared, torch.Tensor.is_conj,
    torch.Tensor.is_neg, torch.Tensor.register_hook, torch.Tensor.register_post_accumulate_grad_hook,
    torch.is_tensor, torch.is_floating_point, torch.is_complex, torch.numel,
})


def _is_grad_getter(func: Any) -> bool:
    return (
        type(func).__name__ == "method-wrapper" and func.__name__ == "__get__"
        and getattr(getattr(func, "__self__", None), "__name__", "") == "grad"
    )


def _reads_no_values(func: Any) -> bool:
    if type(func).__name__ == "method-wrapper":  # a property: ``Tensor.shape.__get__``
        descriptor = getattr(func, "__self__", None)
        return getattr(descriptor, "__name__", "") in _METADATA_PROPERTIES
    try:
        return func in _METADATA_METHODS
    except TypeError:  # unhashable
        return False


class _StaleTensorHook:
    """The hook of a stale tensor's class (made by :func:`_stale_class`):
    the first op that may read its values (or set its ``.grad``) copies
    the device state in and gives it its class back, then runs.  ``type(t)``
    shows the stale class meanwhile (named as the original, which
    ``isinstance`` still passes)."""

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            # Dynamo traces this: the values are not read now (a copy here
            # would break the graph).  The graph it compiles, for any
            # backend, brings its inputs in before each run instead.
            _inputs_brought_in_by_this_graph()
            with _RUNTIME_READ():
                return func(*args, **kwargs)
        if _reads_no_values(func):
            with _RUNTIME_READ():
                return func(*args, **kwargs)
        if _is_grad_getter(func):
            # ``p.grad`` (``zero_grad``, ``clip_grad_norm_``) reads the
            # gradient, not the parameter: only a kept gradient comes in.
            refresh_stale(args[:1], "grad", grads_only=True)
            with _RUNTIME_READ():
                return func(*args, **kwargs)
        refresh_stale(torch.utils._pytree.tree_leaves((args, kwargs)), getattr(func, "__name__", repr(func)))
        result = func(*args, **kwargs)
        try:
            after = _AFTER_EAGER_RUN.get(func)
        except TypeError:  # unhashable
            after = None
        if after is not None:
            after(args, kwargs)
        return result

    # Not routed through ``__torch_function__`` by Parameter: bring the
    # tensor in, then copy or pickle it as its own class does.
    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        refresh_stale([self], "copy.deepcopy")
        return self.__deepcopy__(memo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        refresh_stale([self], "pickling")
        return self.__reduce_ex__(protocol)


_STALE_CLASSES: dict[type, type] = {}

#: Torch functions that change a tensor uncounted, run on a stale one: what
#: the hook calls after (``runtime/running_stats.py`` fills it: a train-mode
#: ``F.batch_norm`` updates the running statistics without a version).
_AFTER_EAGER_RUN: dict[Any, Callable[[tuple[Any, ...], dict[str, Any]], None]] = {}


def _stale_class(fresh: type) -> type:
    found = _STALE_CLASSES.get(fresh)
    if found is None:
        found = _STALE_CLASSES[fresh] = type(fresh.__name__, (_StaleTensorHook, fresh), {
            _FRESH_CLASS: fresh, "__module__": __name__, "__qualname__": fresh.__qualname__,
            "__doc__": f"A {fresh.__qualname__} whose values are on the device (runtime/state.py).",
        })
    return found


# -- uncounted aliases ---------------------------------------------------------
#
# Torch counts an in-place write in the version counter of the tensor it
# writes through, which views share; but ``.data`` returns a tensor with a
# counter of its own, and ``.numpy()``, ``__array__``, ``__dlpack__`` and
# the storage (``untyped_storage()``, ``storage()``) hand out the memory
# with none: ``p.data.mul_(2)``, a manual SGD step ``p.data.add_(...)``, an
# EMA ``ema.data.mul_(d).add_(...)``, ``p.data.copy_(init)``, a load through
# numpy.  So a tensor a slot stands for gets a class (:func:`_watch_escapes`:
# a subclass of its own, as the stale class is) that overrides these five in
# Python and nothing else: taking one of them marks the tensor's slots
# (:meth:`_StateSlot.host_may_change`), so the next call reads the tensor in
# and watches a ``.data`` tensor's counter (or, while it lives, an array)
# from then on.  Its ``__torch_function__`` is torch's disabled one, as
# ``nn.Parameter``'s: ops run as on the plain class and return plain tensors,
# at no cost.  Copies and pickles are of the plain class (no hloalias needed
# to load them); optimizers keep their foreach kernels (the class is listed
# where torch lists the classes they take, as DTensor is).
#
# Aliases that exist when the slot is made take no escape: such a tensor is
# compared by value (:func:`_memory_shared`).  Not seen (docs/runtime.md):
# the same escapes taken later from another tensor sharing the memory
# (``p.detach().numpy()``, ``p[0].data``) and written after the next call,
# the function ``torch.utils.dlpack.to_dlpack(p)``,
# ``Tensor.data.__get__(p)``, and writes through a storage, DLPack
# consumer or ``.data``-of-``.data`` after the call that follows the escape.
#
# A call that leaves the slot lagging marks its live ``.data`` tensors stale
# with the tensor (:meth:`_StateSlot._shown_by`): a write through one then
# applies to the calls' value, as eager's.  A write through an unmarkable
# sharer (a kept array, a tensor made before the calls) while the slot
# lags is refused by the next call (:meth:`_StateSlot.written_while_lagging`).

#: A watched class's attribute naming the plain class it stands in for.
_PLAIN_CLASS = "_hloalias_plain_class"
#: The ``Tensor.data`` descriptor (a getset: ``__get__``/``__set__``).
_TENSOR_DATA: Any = torch.Tensor.data


def _note_escape(tensor: torch.Tensor, alias: Any) -> None:
    """Eager code took ``alias`` from ``tensor``: each slot standing for
    it (and agreeing with it: a lagging one's tensor is stale, and a read
    brings the calls' value in first) reads it in at the next call.
    hloalias's own reads (under :data:`_RUNTIME_READ`, or with torch
    functions off) mark nothing."""
    if not torch._C._is_torch_function_enabled():
        return
    for ref in _SLOTS_OF_TENSOR.get(tensor) or ():  # type: ignore[no-untyped-call]
        slot = ref()
        if slot is not None and slot.source() is tensor and not slot.lags:
            slot.host_may_change(alias)


class _WatchedTensorHook:
    """The escape hatches of a watched tensor's class (made by
    :func:`_watched_class`; see above): each runs torch's own, then marks
    the tensor's slots (:func:`_note_escape`)."""

    @property
    def data(self) -> torch.Tensor:
        alias: torch.Tensor = _TENSOR_DATA.__get__(self)  # a stale tensor's hook brings it in first
        _note_escape(self, alias)  # type: ignore[arg-type]
        return alias

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        # Swaps the memory: the slot sees the new address.
        _TENSOR_DATA.__set__(self, value)

    def numpy(self, *, force: bool = False) -> Any:
        array = torch.Tensor.numpy(self, force=force)  # type: ignore[arg-type]
        # ``force`` may return a copy (no alias): marking it costs an upload.
        _note_escape(self, array)  # type: ignore[arg-type]
        return array

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        capsule = torch.Tensor.__dlpack__(self, *args, **kwargs)  # type: ignore[arg-type]
        _note_escape(self, capsule)  # type: ignore[arg-type]
        return capsule

    def untyped_storage(self) -> torch.UntypedStorage:
        # ``storage()`` and ``__array__`` (through ``numpy``) come here too.
        storage = torch.Tensor.untyped_storage(self)  # type: ignore[arg-type]
        _note_escape(self, None)  # type: ignore[arg-type]
        return storage

    # Copies and pickles are of the plain class: no hloalias to load them,
    # and torch's own code (which insists on the copy's class) runs as is.
    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return _as_plain(self, lambda: self.__deepcopy__(memo))  # type: ignore[arg-type]

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _as_plain(self, lambda: self.__reduce_ex__(protocol))  # type: ignore[arg-type]


def _memory_shared(tensor: torch.Tensor) -> bool:
    """Whether something besides ``tensor`` holds its memory: another
    tensor (``w = p.data`` or ``p.detach()`` kept, the array of
    ``p.detach().numpy()`` kept, a view's base or sibling views, a DLPack
    consumer), by torch's count of the storage's references (less the
    tensor's own and the storage object's taken here).  Such a holder may
    write the memory without counting the tensor's version and without an
    escape the watched class sees, so the slot made now compares the
    tensor by value at every call (:meth:`_StateSlot.watch_values`): exact,
    at a host copy and a memcmp per call, for these tensors only.  Not
    counted: an array ``p.numpy()`` returned (it holds the tensor, not the
    storage).  Views and tensors sharing a version counter (``p.detach()``)
    are counted too, though torch counts their writes: a compare too many."""
    try:
        storage = torch._C.TensorBase.untyped_storage(tensor)
        return bool(torch._C._storage_Use_Count(storage._cdata) > 2)
    except (RuntimeError, NotImplementedError):  # no storage: nothing to share
        return False


def _as_plain(tensor: torch.Tensor, run: Callable[[], Any]) -> Any:
    """``run()`` while ``tensor`` has its plain class (its escapes mark
    nothing meanwhile: ``run`` copies, it does not write).  No Ctrl-C
    point lies between the class swap and the ``try``."""
    watched = type(tensor)
    tensor.__class__ = getattr(watched, _PLAIN_CLASS)
    try:
        return run()
    finally:
        tensor.__class__ = watched


_WATCHED_CLASSES: dict[type, type] = {}
#: The watched classes (not their stale subclasses).
_WATCHED: set[type] = set()


def _watched_class(plain: type) -> type:
    found = _WATCHED_CLASSES.get(plain)
    if found is None:
        found = _WATCHED_CLASSES[plain] = type(plain.__name__, (_WatchedTensorHook, plain), {
            _PLAIN_CLASS: plain, "__module__": __name__, "__qualname__": plain.__qualname__,
            "__torch_function__": torch._C._disabled_torch_function_impl,
            "__doc__": f"A {plain.__qualname__} held by a state slot (runtime/state.py).",
        })
        _WATCHED.add(found)
    return found


# Optimizers and clip_grad_norm_ take their foreach kernels only for the
# classes listed here (torch lists DTensor so too).
for _plain, _lists in (
    (torch.Tensor, ("torch.optim.optimizer", "torch.utils._foreach_utils")),
    (torch.nn.Parameter, ("torch.optim.optimizer",)),
):
    for _module_name in _lists:
        _supported = getattr(importlib.import_module(_module_name), "_foreach_supported_types", None)
        if isinstance(_supported, list) and _watched_class(_plain) not in _supported:
            _supported.append(_watched_class(_plain))


# Torch's tracing and aot_autograd's first-run analysis
# (``_AnalyzeCustomOpInputOutputMode``) handle the tensors whose exact class
# is in ``HANDLED_TYPES`` and refuse others (a ``torch.compile`` graph of
# aot_eager or inductor run on the module's buffers failed): the watched
# classes behave as their plain ones there.  ``runtime_wrappers`` imports
# the tuple by name, when first imported (after this) or already.
def _handled_as_plain() -> None:
    watched = tuple(_watched_class(plain) for plain in (torch.Tensor, torch.nn.Parameter))
    for module_name in ("torch.fx.experimental.proxy_tensor", "torch._functorch._aot_autograd.runtime_wrappers"):
        module = sys.modules.get(module_name)
        handled = getattr(module, "HANDLED_TYPES", None)
        if isinstance(handled, tuple) and not set(watched) <= set(handled):
            setattr(module, "HANDLED_TYPES", (*handled, *(cls for cls in watched if cls not in handled)))


import torch.fx.experimental.proxy_tensor  # noqa: E402 - what _handled_as_plain extends

_handled_as_plain()


def _watch_escapes(tensor: torch.Tensor) -> None:
    """Give ``tensor`` (a plain Tensor or Parameter a slot stands for) its
    watched class; a stale one keeps its class (refresh gives it the watched one)."""
    watched = _WATCHED_CLASSES.get(type(tensor))
    if watched is not None:
        tensor.__class__ = watched
    _WATCHED_TENSORS[id(tensor)] = tensor


#: Every tensor given a watched class (by id; weak: tensors compare by value).
_WATCHED_TENSORS: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


@contextlib.contextmanager
def traced_as_plain() -> Iterator[None]:
    """While hloalias traces a program (``torch.export``, a training step's
    capture), every watched tensor has its plain class again: torch's
    tracing takes a slower path for a tensor of another class than
    Tensor/Parameter (a dynamic export of a compiled model took ~1.5 s
    more: bench/RESULTS-latency.md), and the trace's own reads are no
    user's escapes.  Swapped with Ctrl-C held, so no tensor keeps its
    plain class past the trace."""
    swapped: list[tuple[torch.Tensor, type]] = []
    with interrupts.deferred():
        for tensor in list(_WATCHED_TENSORS.values()):
            cls = type(tensor)
            if cls in _WATCHED:
                tensor.__class__ = getattr(cls, _PLAIN_CLASS)
                swapped.append((tensor, cls))
    try:
        yield
    finally:
        with interrupts.deferred():
            for tensor, cls in swapped:
                if type(tensor) is getattr(cls, _PLAIN_CLASS):
                    tensor.__class__ = cls


def fresh_type(tensor: Any) -> type:
    """``type(tensor)``, or the class a stale tensor will get back, as the
    plain class a watched one stands in for."""
    cls = type(tensor)
    cls = getattr(cls, _FRESH_CLASS, cls)
    return getattr(cls, _PLAIN_CLASS, cls)


def is_stale(tensor: Any) -> bool:
    """Whether ``tensor`` is marked stale (its values are on the device)."""
    return getattr(type(tensor), _FRESH_CLASS, None) is not None


def _mark_stale(slot: "_StateSlot") -> None:
    for tensor in slot._shown_by():
        # Only torch's own classes: a subclass keeps its class (and its
        # bare reads show the last copied value, as before).
        cls = type(tensor)
        if cls is torch.Tensor or cls is torch.nn.Parameter or cls in _WATCHED:
            tensor.__class__ = _stale_class(cls)


def _lagging_slots(tensor: torch.Tensor, grads_only: bool = False) -> list["_StateSlot"]:
    """The lagging slots whose buffer a read of ``tensor`` must see: its own
    (the slot stands for it) and kept gradients shown as its ``.grad``."""
    found = []
    for ref in () if grads_only else _SLOTS_OF_TENSOR.get(tensor) or ():  # type: ignore[no-untyped-call]
        slot = ref()
        if slot is not None and slot.lags and slot.source() is tensor:
            found.append(slot)
    for ref in _GRAD_SLOTS_OF.get(tensor) or ():  # type: ignore[no-untyped-call]
        slot = ref()
        if slot is not None and slot.lags and slot.grad_of is not None and slot.grad_of() is tensor:
            found.append(slot)
    if not grads_only:
        found.extend(_lagging_through_alias(tensor))
    return found


def _lagging_through_alias(tensor: torch.Tensor) -> list["_StateSlot"]:
    """The lagging slots ``tensor`` is a live ``.data`` tensor of: a read
    or write through it first copies their buffers into the memory it
    shares with their tensors."""
    found = []
    for ref in _ALIAS_SLOTS.get(tensor) or ():  # type: ignore[no-untyped-call]
        slot = ref()
        if slot is not None and slot.lags and slot.shown_through_alias(tensor) and slot not in found:
            found.append(slot)
    return found


def _unmark_if_current(tensor: torch.Tensor) -> None:
    """Give ``tensor`` its class back when no slot's buffer lags it."""
    fresh = getattr(type(tensor), _FRESH_CLASS, None)
    if fresh is not None and not _lagging_slots(tensor):
        tensor.__class__ = fresh


def refresh_stale(tensors: Any, what: str, grads_only: bool = False) -> None:
    """Before torch reads ``tensors`` (``what``: the op): copy into each
    stale one what calls left on the device (:meth:`_StateSlot.copy_to_source`;
    a kept gradient becomes its ``.grad``), then give it its class back.
    A group that serves reads itself decides (``before_read``: a training
    step on a mesh writes its state back; a mesh across processes
    refuses, leaving the tensors stale).  Idempotent: cut short (Ctrl-C,
    an error), the tensors not done stay stale and the next read does them.  ``grads_only``: only
    kept gradients shown as their ``.grad`` (a read of ``p.grad``); the
    tensor stays stale while its own value lags."""
    stale = [t for t in tensors if isinstance(t, torch.Tensor) and is_stale(t)]
    if not stale:
        return
    with torch._C.DisableTorchFunction(), torch.utils._python_dispatch._disable_current_modes(), torch.no_grad():
        for tensor in stale:
            for slot in _lagging_slots(tensor, grads_only):
                _bring_in(slot, f"{what} of a tensor of the model or the optimizer")
            _drop_kept_agreeing(tensor)
            fresh = getattr(type(tensor), _FRESH_CLASS, None)
            if grads_only:
                _unmark_if_current(tensor)
            elif fresh is not None:
                tensor.__class__ = fresh
    _STALE_READS[0] += 1


def _drop_kept_agreeing(tensor: torch.Tensor) -> None:
    """Let go of the slots ``tensor`` keeps alive that no longer lag it
    (left by a Ctrl-C in :meth:`_StateSlot._set_lags`)."""
    kept = _KEPT_WHILE_LAGGING.get(tensor)  # type: ignore[no-untyped-call]
    if kept and not all(slot.lags for slot in kept):
        kept[:] = [slot for slot in kept if slot.lags]
        if not kept:
            del _KEPT_WHILE_LAGGING[tensor]


def _bring_in(slot: "_StateSlot", what: str) -> None:
    """Copy what calls left in ``slot``'s buffer into its tensor, or let its
    group serve the read (``before_read``; ``what``: the reader)."""
    if slot.copied_alone():
        slot.copy_to_source()
        return
    group = slot._group() if slot._group is not None else None
    if group is not None and group.before_read is not None:
        group.before_read(what)


#: How many reads found stale tensors and brought them in (tests count them).
_STALE_READS = [0]


#: How many live or dead slots lag their tensor (:attr:`_StateSlot.lags`):
#: 0 lets :func:`bring_up_to_date` return at once.  (A slot collected while
#: lagging keeps it above 0: only a slower check, never a missed one.)
_LAGGING = [0]


def bring_up_to_date(tensors: Any, reader: "_StateGroup | None" = None) -> None:
    """Before torch itself reads ``tensors`` (a ``torch.compile``d graph's
    inputs, an eager forward of the module), or a program of the group
    ``reader`` (a training step on a mesh) reads them as torch's edits,
    copy into each one that a state slot of another group stands for what
    calls left on the device since the two last agreed, unless torch
    changed the tensor since (the user's write is then the newest value,
    which the next call reads).  ``reader``'s own buffers hold its latest
    values already: copying them would cost a gather per call."""
    if not _LAGGING[0]:
        return
    with _RUNTIME_READ():
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            refs = _SLOTS_OF_TENSOR.get(tensor)  # type: ignore[no-untyped-call]
            for ref in refs or ():
                slot = ref()
                if (
                    slot is not None and slot.lags and slot.source() is tensor
                    and (reader is None or slot._group is None or slot._group() is not reader)
                ):
                    _bring_in(slot, "a torch.compile'd graph or an eager forward reading it")
            if is_stale(tensor):
                # A ``.data`` tensor of a lagging one is marked with it (:meth:`_StateSlot._shown_by`).
                for slot in _lagging_through_alias(tensor):
                    if reader is None or slot._group is None or slot._group() is not reader:
                        _bring_in(slot, "a torch.compile'd graph or an eager forward reading it")


#: Count the times a slot (any; one on a mesh) started lagging its
#: tensor: a :class:`StateWatch` looks for state other groups left stale
#: only when the count it watches moved (once per read between calls).
_LAG_STARTS = [0]
_MESH_LAG_STARTS = [0]


def read_others_stale(slots: tuple[_StateSlot, ...], reader: "_StateGroup | None") -> None:
    """Before a call of a program of ``reader``: copy into each of
    ``slots``' tensors what calls of another group's programs left on the
    device (their own slots of it lag), so the call reads it as torch's
    edit.  Two programs of one module on a mesh (or one on a mesh and one
    on one device) keep their state in groups of their own."""
    for slot in slots:
        tensor = slot.source()
        if tensor is None or not is_stale(tensor):
            continue
        for other in _lagging_slots(tensor):
            # The tensor's own value only (a kept gradient shown as its
            # ``.grad`` is not what the call reads).
            if other is not slot and other.source() is tensor and (
                other._group is None or other._group() is not reader
            ):
                _bring_in(other, "a call of another program of the module")


class _BringsInputsUpToDate:
    """A dynamo backend (``compiler_fn``) whose compiled graphs first bring
    their inputs up to date (:func:`bring_up_to_date`), then run as the
    backend compiled them."""

    def __init__(self, compiler_fn: Callable[..., Any]) -> None:
        #: Where dynamo looks for the backend a wrapper wraps (it compares
        #: that with its own, e.g. under ``torch.func`` transforms).
        self.compiler_fn = compiler_fn
        self.__name__ = getattr(compiler_fn, "__name__", type(compiler_fn).__name__)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        compiled = self.compiler_fn(gm, example_inputs, **kwargs)
        if getattr(compiled, "brings_inputs_up_to_date", False):
            return compiled  # the hloalias backend's graphs do it themselves
        return _InputsBroughtIn(compiled)


class _InputsBroughtIn:
    """A backend's compiled graph that brings its inputs up to date before
    each run (see :func:`_inputs_brought_in_by_this_graph`)."""

    brings_inputs_up_to_date = True

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self.compiled = compiled

    def __call__(self, *args: Any) -> Any:
        bring_up_to_date(args)
        return self.compiled(*args)


def _inputs_brought_in_by_this_graph() -> bool:
    """Called when dynamo traces an op on a stale tensor (from the stale
    class's hook).  Dynamo runs it once, at trace time, as Python (it is
    marked constant, as ``torch._dynamo.assume_constant_result`` marks
    functions: no graph break, and dynamo guards only on its code): it
    wraps the backend of the graph being traced so that the graph it
    compiles brings its inputs up to date before every run (dynamo lifts
    the module's parameters and buffers and free tensors such as optimizer
    state as inputs).  Only graphs that traced a stale tensor are wrapped;
    dynamo's guard on each input's class keeps stale tensors out of the
    others.  Outside a dynamo trace (``torch.export``'s non-strict one) and
    in a strict export capture it does nothing.  True when it wrapped."""
    symbolic_convert = sys.modules.get("torch._dynamo.symbolic_convert")
    tx = getattr(symbolic_convert.tls, "current_tx", None) if symbolic_convert is not None else None
    output = getattr(tx, "output", None)
    compiler_fn = getattr(output, "compiler_fn", None)
    # ``torch.export``'s strict capture runs no graph later: nothing to wrap.
    if (
        output is None or compiler_fn is None or isinstance(compiler_fn, _BringsInputsUpToDate)
        or getattr(output, "export", False)
    ):
        return False
    output.compiler_fn = _BringsInputsUpToDate(compiler_fn)
    return True


# What ``torch._dynamo.assume_constant_result`` sets (without importing dynamo).
_inputs_brought_in_by_this_graph._dynamo_marked_constant = True  # type: ignore[attr-defined]


#: Counts the times a slot recorded a new agreement with its tensor
#: (``refresh_from_torch``, ``mark_synced``): a :class:`StateWatch` rebuilds
#: its tuples when it moved.
_AGREEMENTS = [0]

#: Counts the registrations torch's hooks saw that no slot's tensor was
#: replaced by: a tensor or submodule registered under a name that held
#: none (``del m.bias; m.bias = nn.Parameter(...)``, ``del m.lin;
#: m.lin = nn.Linear(...)``), and every submodule registration.  The slot
#: of the deleted tensor cannot be found from the hook, so each
#: :class:`StateWatch` looks its names up again when this moved.
_ATTACHMENT_EDITS = [0]


def _first_changed_in_python(refs: tuple[Any, ...], versions: tuple[int, ...], pointers: tuple[int, ...]) -> int:
    for index, ref in enumerate(refs):
        tensor = ref()
        if tensor is not None and (tensor._version != versions[index] or tensor.data_ptr() != pointers[index]):
            return index
    return -1


_SAME_WIDTH_INTEGER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits_differ(tensor: torch.Tensor, snapshot: torch.Tensor) -> bool:
    """Whether ``tensor``'s bytes differ from ``snapshot``'s (another
    dtype or shape differs): bit for bit, so a NaN equals itself.  Run
    under :data:`_RUNTIME_READ` (a stale tensor's hook would copy in)."""
    if tensor.dtype != snapshot.dtype or tensor.shape != snapshot.shape:
        return True
    tensor = _resolved(tensor)
    as_int = _SAME_WIDTH_INTEGER.get(tensor.element_size())
    if as_int is not None and not tensor.is_complex():
        return not torch.equal(tensor.view(as_int), snapshot.view(as_int))
    return not torch.equal(tensor, snapshot)


def _first_differing_in_python(refs: tuple[Any, ...], snapshots: tuple[torch.Tensor, ...]) -> int:
    for index, ref in enumerate(refs):
        tensor = ref()
        if tensor is not None and _bits_differ(tensor, snapshots[index]):
            return index
    return -1


class StateWatch:
    """The per-call check that a call never reads a stale copy of the
    module's state: whether torch changed any of ``slots``' tensors since
    the slot last agreed with it (:meth:`_StateSlot.torch_changed`).  The
    slots' weakrefs, versions and data pointers are kept as three tuples for
    ``first_changed`` (``_lane.first_changed`` where the native call path is
    built, about a tenth of the Python loop's cost), rebuilt only when some
    slot recorded a new agreement.  The slots compared by value
    (:meth:`_StateSlot.watch_values`: state torch may change without
    counting a version) are then compared with their snapshots
    (``_lane.first_differing``, a memcmp each, else ``torch.equal`` in
    Python).

    With ``group`` (the slots' group), the check first brings in what
    programs of other groups of the module left on their devices
    (:func:`read_others_stale`; the check then sees it as torch's edits):
    a program on a mesh keeps its state in a group of its own, so the
    module's tensors are the only place the two meet.  Only when some slot
    of another kind started lagging since (``on_mesh``: a mesh program's
    watch looks at every slot's start, one device's at mesh slots'): once
    per read between calls, never per call."""

    def __init__(
        self, slots: tuple[_StateSlot, ...],
        first_changed: Callable[[tuple[Any, ...], tuple[int, ...], tuple[int, ...]], int] | None,
        group: "_StateGroup | None" = None, on_mesh: bool = False,
        first_differing: Callable[[tuple[Any, ...], tuple[torch.Tensor, ...]], int] | None = None,
    ) -> None:
        self.slots = slots
        self._first_changed = first_changed or _first_changed_in_python
        self._first_differing = first_differing or _first_differing_in_python
        self._agreements = -1
        self._refs: tuple[Any, ...] = ()
        self._versions: tuple[int, ...] = ()
        self._pointers: tuple[int, ...] = ()
        #: The slots compared by value (:meth:`_StateSlot.watch_values`):
        #: their tensors' weakrefs and snapshots.
        self._value_refs: tuple[Any, ...] = ()
        self._snapshots: tuple[torch.Tensor, ...] = ()
        #: The slots with :attr:`_StateSlot.held` arrays: a live one is a
        #: change until the slot has a snapshot to compare with.
        self._held: tuple[_StateSlot, ...] = ()
        self._group = weakref.ref(group) if group is not None else None
        self._starts = _LAG_STARTS if on_mesh else _MESH_LAG_STARTS
        self._starts_seen = self._starts[0]
        #: The plain tensor attributes among the slots' module attributes,
        #: which no registration hook sees replaced (``m.scale = t``): the
        #: table holding each (a submodule's ``__dict__``), its key and its
        #: slot, compared by identity at every call (:meth:`attach`).
        self._plain: tuple[tuple[dict[str, Any], str, _StateSlot], ...] = ()
        #: ``_ATTACHMENT_EDITS`` when the attachments were last looked up;
        #: -1: never (no module attributes to look up).
        self._edits_seen = -1
        #: Whether :meth:`attachments_moved` found a move that no lookup
        #: (:meth:`attach`) recorded since: the per-call check and the
        #: state's sync that follows it look once.
        self._moved = False

    def attach(self, plain: tuple[tuple[dict[str, Any], str, _StateSlot], ...], edits: int) -> None:
        """Record the slots' module attributes as looked up when
        ``_ATTACHMENT_EDITS`` was ``edits``: :meth:`changed` reports a
        change when it moves, or when a ``plain`` attribute holds another
        object than its slot's tensor."""
        self._plain = plain
        self._edits_seen = edits
        self._moved = False

    def attachments_moved(self) -> bool:
        """Whether a module attribute may hold another tensor than its slot's
        (see :meth:`attach`); asked only once :meth:`attach` ran.  A move
        found is remembered until the next lookup is recorded, so the
        per-call check (:meth:`changed`) and the sync that follows it look
        once (cut short, the lookup is made again)."""
        if self._moved:
            return True
        if self._edits_seen != _ATTACHMENT_EDITS[0]:
            self._moved = True
            return True
        for table, key, slot in self._plain:
            if table.get(key) is not slot.source():
                self._moved = True
                return True
        return False

    def changed(self) -> bool:
        # Each count is recorded only once what it stands for is done: a
        # Ctrl-C part way leaves it unrecorded, and the next call redoes it.
        starts = self._starts[0]
        if self._starts_seen != starts and self._group is not None:
            read_others_stale(self.slots, self._group())
            self._starts_seen = starts
        # After the other groups' values came in: a slot that follows its
        # attribute to another tensor, or reads one in, reads their newest.
        if self._edits_seen >= 0 and self.attachments_moved():  # once attach() ran
            return True
        agreements = _AGREEMENTS[0]
        rebuilt = self._agreements != agreements
        if rebuilt:
            self._rebuild(agreements)
        if not self._tuples_changed():
            return False
        if rebuilt:
            return True
        # A slot may have recorded an agreement whose count a Ctrl-C cut
        # off (the count comes after): the tuples would show a change no
        # slot finds, at every call.  Only when they show one: look again.
        self._rebuild(_AGREEMENTS[0])
        return self._tuples_changed()

    def _rebuild(self, agreements: int) -> None:
        # The ``.data`` tensors taken from the slots' tensors are
        # watched as the tensors are (:attr:`_StateSlot.aliases`).
        aliases = [entry for slot in self.slots for entry in slot.aliases]
        self._refs = (*(slot.source for slot in self.slots), *(ref for ref, _, _ in aliases))
        self._versions = (*(slot.version for slot in self.slots), *(version for _, version, _ in aliases))
        self._pointers = (*(slot.source_ptr for slot in self.slots), *(pointer for _, _, pointer in aliases))
        self._held = tuple(slot for slot in self.slots if slot.held)
        valued = [slot for slot in self.slots if slot.snapshot is not None]
        self._value_refs = tuple(slot.source for slot in valued)
        self._snapshots = tuple(slot.snapshot for slot in valued if slot.snapshot is not None)
        self._agreements = agreements

    def _tuples_changed(self) -> bool:
        if self._held and any(
            slot.snapshot is None and any(ref() is not None for ref in slot.held) for slot in self._held
        ):
            return True  # compared by value from the next agreement on
        if self._first_changed is _first_changed_in_python:
            with _RUNTIME_READ():  # stale tensors' versions, not their values
                if _first_changed_in_python(self._refs, self._versions, self._pointers) >= 0:
                    return True
        elif self._first_changed(self._refs, self._versions, self._pointers) >= 0:
            return True
        if not self._value_refs:
            return False
        if self._first_differing is _first_differing_in_python:
            with _RUNTIME_READ():
                return _first_differing_in_python(self._value_refs, self._snapshots) >= 0
        return self._first_differing(self._value_refs, self._snapshots) >= 0


#: The buffers a batch norm updates in place without counting a version,
#: and the one its module's forward counts instead (``_NormBase``).
_RUNNING_STATS = ("running_mean", "running_var")
_STATS_COUNTER = "num_batches_tracked"


def link_running_stats(slots: dict[str, _StateSlot]) -> None:
    """Link each running statistic among a program's state ``slots``
    (by name: ``<module>.running_mean``) to the slot of its module's
    ``num_batches_tracked`` where the program has one
    (:meth:`_StateSlot.counted_by`): an eager train-mode forward of a
    batch norm is then read in by the next call.  Costs a call nothing:
    the counter's tensor is watched already."""
    for name, slot in slots.items():
        prefix, dot, leaf = name.rpartition(".")
        if leaf in _RUNNING_STATS:
            counter = slots.get(f"{prefix}{dot}{_STATS_COUNTER}")
            if counter is not None:
                slot.counted_by(counter)


def _form_text(layout: StoredLayout | None, bits: torch.dtype | None = None) -> str:
    text = "torch's layout" if layout is None else layout.describe()
    return text if bits is None else f"{text} as {str(bits).removeprefix('torch.')} bits"


def _stored_form(tensor: torch.Tensor, layout: StoredLayout | None, bits: torch.dtype | None = None) -> torch.Tensor:
    """``tensor`` (torch's layout and dtype) as ``layout`` and ``bits`` store
    it (a contiguous copy unless the layout is torch's; the bits are a view)."""
    if layout is not None:
        tensor = tensor.permute(layout.permutation)
        if layout.reversed:
            tensor = tensor.flip(layout.reversed)
        tensor = tensor.contiguous()
    return tensor if bits is None else tensor.view(bits)


def _tracing(*values: Any) -> bool:
    """Whether torch is tracing (dynamo, ``torch.export``, ``make_fx``: the
    values it passes are fake or proxy tensors): the state hooks then do
    nothing (a copy into a module tensor would be traced, or fail)."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return True
    leaves, _ = torch.utils._pytree.tree_flatten(values)
    return any(
        isinstance(leaf, torch.Tensor) and fresh_type(leaf) not in (torch.Tensor, torch.nn.Parameter) for leaf in leaves
    )


class _StateGroup:
    """The device state of one module (or of one function's constants) and
    the lock that serializes calls reading or writing it."""

    def __init__(self, owner: torch.nn.Module | None = None) -> None:
        self.lock = threading.RLock()
        self._slots: dict[tuple[int, str, int], weakref.ref[_StateSlot]] = {}
        #: The module whose state this is (None: a function's or a program's).
        self.owner: weakref.ref[torch.nn.Module] | None = weakref.ref(owner) if owner is not None else None
        #: Slots some program of the group writes (see :meth:`note_written`).
        self._written: "weakref.WeakValueDictionary[int, _StateSlot]" = weakref.WeakValueDictionary()
        self._state_dict_hook: Any = None
        self._forward_hook: Any = None
        #: How a read of a stale tensor of this group's slots on a mesh is
        #: served (``before_read(what)``: a training step's write-back, or
        #: the refusal across processes, where the copy is a collective);
        #: None: copied slot by slot (one device, or a mesh in one process).
        self.before_read: Callable[[str], None] | None = None

    def note_written(self, slots: list[_StateSlot]) -> None:
        """``slots`` are written by a program of this group: the owner
        module's ``state_dict()`` (``torch.save``, ``save_pretrained``,
        checkpoint code) and its eager forward first copy what calls left
        in them into the module's tensors (:meth:`write_back_written`, a
        state-dict and a forward pre-hook registered once), so neither a
        checkpoint nor eager code reads a stale value.  A bare read
        (``module.buf * 1``) copies that one tensor in (:func:`refresh_stale`)."""
        owner = self.owner() if self.owner is not None else None
        if owner is None or not slots:
            return
        for slot in slots:
            self._written[id(slot)] = slot
        if self._state_dict_hook is None:
            group = weakref.ref(self)

            def write_back_first(module: torch.nn.Module, prefix: str, keep_vars: bool) -> None:
                found = group()
                if not _tracing() and found is not None and _LAGGING[0]:
                    found.write_back_written(f"{type(module).__name__}.state_dict()")

            def write_back_before_forward(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
                found = group()
                if not _tracing(args, kwargs) and found is not None and _LAGGING[0]:
                    found.write_back_written(f"an eager forward of {type(module).__name__}")

            # Not part of the program: the caches' keys skip it (user_forward_pre_hooks).
            setattr(write_back_before_forward, _SYNC_HOOK, True)
            setattr(write_back_first, _SYNC_HOOK, True)
            self._state_dict_hook = owner.register_state_dict_pre_hook(write_back_first)  # type: ignore[no-untyped-call]
            self._forward_hook = owner.register_forward_pre_hook(write_back_before_forward, with_kwargs=True)
            # A program on a mesh has a group of its own, which dies with
            # it: its hooks go with it (a module compiled again and again
            # keeps no dead hooks).
            for handle in (self._state_dict_hook, self._forward_hook):
                weakref.finalize(self, handle.remove).atexit = False
            # copy.deepcopy and pickle (torch.save(model)) look __reduce_ex__
            # up on the instance: a copy gets what calls left, not the
            # stale tensors, and neither sees the hooks (closures pickle
            # cannot write).
            reduce = owner.__dict__.get(_REDUCE)
            if isinstance(reduce, _CurrentWhenCopied):
                reduce.groups.append(group)
            else:
                owner.__dict__[_REDUCE] = _CurrentWhenCopied(group, weakref.ref(owner))

    def write_back_written(self, what: str = "a read of the module's state") -> None:
        """Copy each written slot's buffer into its module tensor (in place)
        where it lags it, unless torch changed that tensor since they last
        agreed: then the user's write is the newest value, which the next
        call reads.  A group that serves reads itself (``before_read``: a
        mesh across processes, which refuses) is asked instead, once,
        where some slot lags; ``what`` names the reader."""
        with self.lock, _RUNTIME_READ():
            slots = list(self._written.values())
            if self.before_read is not None:
                if any(slot.lags for slot in slots):
                    self.before_read(what)
                return
            for slot in slots:
                slot.copy_to_source()

    def module_tensor(self, name: str) -> torch.Tensor | None:
        """The owner module's parameter, buffer or plain tensor attribute
        ``name`` (a dotted FQN) as it is now, or None (no owner module, or
        no such attribute)."""
        found = self.attribute_table(name)
        if found is None:
            return None
        table, leaf, _ = found
        value = table.get(leaf)
        return value if isinstance(value, torch.Tensor) else None

    def attribute_table(self, name: str) -> tuple[dict[str, Any], str, bool] | None:
        """Where the owner module holds ``name`` (a dotted FQN) now: the
        table (a submodule's ``_parameters``, ``_buffers`` or, for a plain
        tensor attribute, ``__dict__``), the key in it, and whether it is
        the plain attribute's ``__dict__``; None when there is no owner
        module or no such attribute."""
        owner = self.owner() if self.owner is not None else None
        if owner is None:
            return None
        prefix, _, leaf = name.rpartition(".")
        try:
            module = owner.get_submodule(prefix) if prefix else owner
        except AttributeError:
            return None
        if leaf in module._parameters:
            return module._parameters, leaf, False
        if leaf in module._buffers:
            return module._buffers, leaf, False
        attributes = vars(module)
        return (attributes, leaf, True) if leaf in attributes else None

    def slot(
        self, source: torch.Tensor, device: Any, put: Callable[[torch.Tensor], jax.Array] | None = None,
        layout: StoredLayout | None = None, needs_torch_layout: bool = False,
        bits: torch.dtype | None = None, needs_torch_dtype: bool = False, name: str = "",
    ) -> _StateSlot:
        """The slot of ``source`` on ``device``, created (copied to the
        device, by ``put`` when given: a mesh placement, in ``layout``) on first use; re-read when torch changed ``source``
        since.  An existing slot keeps its layout unless ``needs_torch_layout``
        (the program writes, donates or views the tensor): then it is stored
        in torch's layout from now on; likewise its dtype (``bits``) unless
        ``needs_torch_dtype`` (the program writes or donates it in torch's
        dtype, or views it).  ``name`` names the tensor in errors."""
        with self.lock:
            slot = self.existing(source, device)
            if slot is not None and (source.dtype != slot.torch_dtype or tuple(source.shape) != slot.shape):
                # Converted since (``module.to(torch.float64)``): a new
                # program gets a slot of its own; the old ones refuse to run.
                slot = None
            if slot is None:
                refuse_inference_tensor(source, name, ExecutionError)
                slot = _StateSlot(source, device, put, layout, bits)
                slot._group = weakref.ref(self)
                self._slots[(id(source), device.platform, device.id)] = weakref.ref(slot)
                return slot
            if needs_torch_layout:
                slot.to_torch_layout()
            if needs_torch_dtype:
                slot.to_torch_dtype()
            if slot.torch_changed():
                slot.refresh_from_torch(name)
            return slot

    def existing(self, source: torch.Tensor, device: Any) -> _StateSlot | None:
        """The live slot of ``source`` on ``device``, or None."""
        found = self._slots.get((id(source), device.platform, device.id))
        slot = found() if found is not None else None
        return slot if slot is not None and slot.source() is source else None

    def fixed_layouts(self, state: dict[str, torch.Tensor], device: Any) -> tuple[str, ...]:
        """``permute-conv-kernel-state``'s ``layouts`` entries for the state
        that already has a slot here: a new program reads those buffers in
        the layout they are stored in."""
        entries = []
        for name, tensor in state.items():
            slot = self.existing(tensor, device)
            if slot is not None:
                entries.append(f"{name}:{'torch' if slot.layout is None else slot.layout.spec()}")
        return tuple(entries)

    def fixed_dtypes(self, state: dict[str, torch.Tensor], device: Any) -> tuple[str, ...]:
        """``store-state-as-bits``'s ``dtypes`` entries for the state that
        already has a slot here: a new program reads those buffers in the
        dtype they are stored in."""
        entries = []
        for name, tensor in state.items():
            slot = self.existing(tensor, device)
            if slot is not None:
                entries.append(f"{name}:{'torch' if slot.bits is None else 'bits'}")
        return tuple(entries)


#: The live slots that stand for a tensor, in every group.
_SLOTS_OF_TENSOR: WeakIdKeyDictionary = WeakIdKeyDictionary()
#: Tensor -> the slots whose buffers hold values it does not (strong: they
#: outlive the programs that wrote them until read or the tensor dies).
_KEPT_WHILE_LAGGING: WeakIdKeyDictionary = WeakIdKeyDictionary()
#: Parameter -> the slots of kept gradients shown as its ``.grad``.
_GRAD_SLOTS_OF: WeakIdKeyDictionary = WeakIdKeyDictionary()
#: A ``.data`` tensor taken from a slot's tensor -> the slots it was taken
#: from (:meth:`_StateSlot.host_may_change`); each lists it in ``aliases``
#: while it stands for that tensor.
_ALIAS_SLOTS: WeakIdKeyDictionary = WeakIdKeyDictionary()
#: What a removed attribute's slot stands for: no version matches -1.
# The runtime may be loaded lazily inside ``torch.inference_mode()``: the
# sentinel must still be a tensor with a version counter (the state check reads it).
with torch.inference_mode(False):
    _REMOVED = torch.empty(0)

_INFERENCE_TENSOR = (
    "an inference tensor (made under torch.inference_mode()), which has no version counter: hloalias could not "
    "see torch's edits of it and would run on a stale copy"
)


def refuse_inference_tensor(tensor: torch.Tensor, name: str, error: type[HloaliasError]) -> None:
    """Raise ``error`` naming ``name`` when ``tensor`` is an inference
    tensor: module state is re-read when torch changed it, which is seen
    through its version counter (:class:`StateWatch`)."""
    if tensor.is_inference():
        raise error(
            f"module state '{name}' is {_INFERENCE_TENSOR}; build or load the module outside "
            "torch.inference_mode() (calling it inside is fine), or replace the tensor by a clone made outside it"
        )


def module_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor ``module`` and its submodules hold, by dotted name: each
    submodule's parameters, then its buffers, then its plain tensor
    attributes (``self.scale = t``, in its ``__dict__``), in
    ``named_modules(remove_duplicate=False)``'s order, so a tensor reachable
    under several names (tied weights, a shared submodule) comes once per
    name.  Entries set to None are left out.  The one walk of a module's
    state: :func:`refuse_inference_state` and the executable's attribute
    names (``Executable._module_attachments``) read it, from one list a
    compile makes (``walked``)."""
    for prefix, submodule in module.named_modules(remove_duplicate=False):
        head = f"{prefix}." if prefix else ""
        for table in (submodule._parameters, submodule._buffers, vars(submodule)):
            for key, value in table.items():
                if isinstance(value, torch.Tensor):
                    yield f"{head}{key}", value


def refuse_inference_state(
    module: torch.nn.Module, error: type[HloaliasError]
) -> tuple[tuple[str, torch.Tensor], ...]:
    """:func:`refuse_inference_tensor` for every parameter, buffer and tensor
    attribute of ``module`` and its submodules; returns what it walked
    (:func:`module_tensors`), which the compile hands on, so it walks once."""
    walked = tuple(module_tensors(module))
    seen: set[int] = set()
    for name, tensor in walked:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            refuse_inference_tensor(tensor, name, error)
    return walked


def _slots_of(tensor: torch.Tensor) -> list[weakref.ref[_StateSlot]]:
    """The slots standing for ``tensor``, which one is about to join: its
    escapes are watched from now on (:func:`_watch_escapes`)."""
    _watch_escapes(tensor)
    found: list[weakref.ref[_StateSlot]] | None = _SLOTS_OF_TENSOR.get(tensor)  # type: ignore[no-untyped-call]
    if found is None:
        found = []
        _SLOTS_OF_TENSOR[tensor] = found
    else:
        found[:] = [ref for ref in found if ref() is not None and ref().source() is tensor]  # type: ignore[union-attr]
    return found


def _replaced(old: Any, new: Any) -> None:
    """Module attribute ``old`` now holds ``new``: every slot of ``old`` follows."""
    if not isinstance(old, torch.Tensor) or old is new:
        return
    refs = _SLOTS_OF_TENSOR.get(old)  # type: ignore[no-untyped-call]
    if not refs:
        return
    for ref in list(refs):
        slot = ref()
        if slot is not None and slot.source() is old:
            slot.follow(new if isinstance(new, torch.Tensor) else None)


def _on_tensor_registration(module: torch.nn.Module, name: str, value: Any) -> None:
    # torch calls this before it stores ``value``: the attribute still holds the old tensor.
    old: torch.Tensor | None = module._parameters.get(name)
    if old is None:
        old = module._buffers.get(name)
    if old is None and not torch.compiler.is_compiling():
        # Nothing to follow from here: a slot of a tensor deleted from this
        # name (``del m.bias``) is found by name at the next call.  Not
        # while dynamo traces (a lazily registered cache buffer): it would
        # guard its graph on the count, and every call would compile again.
        _ATTACHMENT_EDITS[0] += 1
    _replaced(old, value)


def _on_module_registration(module: torch.nn.Module, name: str, value: Any) -> None:
    # The new submodule's plain tensor attributes, and every tensor of one
    # registered where another was deleted, are found by name at the next
    # call (not counted while dynamo traces: see _on_tensor_registration).
    if not torch.compiler.is_compiling():
        _ATTACHMENT_EDITS[0] += 1
    old = module._modules.get(name)
    if not isinstance(old, torch.nn.Module) or old is value:
        return
    new_tensors: dict[str, torch.Tensor] = {}
    if isinstance(value, torch.nn.Module):
        new_tensors.update(value.named_parameters(remove_duplicate=False))
        new_tensors.update(value.named_buffers(remove_duplicate=False))
    for path, tensor in [*old.named_parameters(remove_duplicate=False), *old.named_buffers(remove_duplicate=False)]:
        _replaced(tensor, new_tensors.get(path))


# Global hooks: torch calls them for every parameter, buffer and submodule
# registered on any module (``m.w = nn.Parameter(...)`` goes through them);
# they cost a dictionary lookup unless the old tensor has a slot.
torch.nn.modules.module.register_module_parameter_registration_hook(_on_tensor_registration)
torch.nn.modules.module.register_module_buffer_registration_hook(_on_tensor_registration)
torch.nn.modules.module.register_module_module_registration_hook(_on_module_registration)


def _count_removal(module: torch.nn.Module, name: str) -> bool:
    """A parameter, buffer or submodule ``name`` of ``module`` is deleted
    or a parameter set to None, for which torch calls no hook: every
    program looks its names up again at its next call
    (:class:`StateWatch`), finds the tensor gone and refuses, as eager
    would fail or take another branch (``del m.bias``, ``m.bias = None``).
    Not while dynamo traces (see :func:`_on_tensor_registration`).
    Whether it counted."""
    if (
        (name in module._parameters and module._parameters[name] is not None) or name in module._buffers
        or name in module._modules
    ) and not torch.compiler.is_compiling():
        _ATTACHMENT_EDITS[0] += 1
        return True
    return False


_TORCH_DELATTR = torch.nn.Module.__delattr__
_TORCH_REGISTER_PARAMETER = torch.nn.Module.register_parameter


def _delattr_counted(self: torch.nn.Module, name: str) -> None:
    # Counted before the deletion (a Ctrl-C between: one lookup too many)
    # and after it (a call of another thread may have looked up between).
    counted = _count_removal(self, name)
    _TORCH_DELATTR(self, name)
    if counted:
        _ATTACHMENT_EDITS[0] += 1


def _register_parameter_counted(self: torch.nn.Module, name: str, param: Any) -> None:
    # Only ``None`` over a parameter: torch's registration hook hears the rest.
    if param is None:
        _count_removal(self, name)
    _TORCH_REGISTER_PARAMETER(self, name, param)


# torch calls no hook for ``del m.bias`` or ``m.bias = None``: its own
# methods, wrapped (``__delattr__`` and ``register_parameter`` are Python
# in torch; the wrap costs a call and a dictionary test per deletion or
# registration, nothing per call of a program).  Writes into
# ``m._parameters``/``m._buffers`` directly stay unseen (docs/runtime.md).
torch.nn.Module.__delattr__ = _delattr_counted  # type: ignore[method-assign]
torch.nn.Module.register_parameter = _register_parameter_counted  # type: ignore[method-assign]


_GROUPS: "weakref.WeakKeyDictionary[Any, _StateGroup]" = weakref.WeakKeyDictionary()
_GROUPS_LOCK = threading.Lock()


def _state_group(f: Any) -> _StateGroup:
    """The state group of ``f``: one per ``nn.Module`` / ``ExportedProgram``
    (shared by all its executables), a fresh one for a plain function."""
    if not isinstance(f, (torch.nn.Module, ExportedProgram)):
        return _StateGroup()
    with _GROUPS_LOCK:
        group = _GROUPS.get(f)
        if group is None:
            group = _StateGroup(f if isinstance(f, torch.nn.Module) else None)
            _GROUPS[f] = group
        return group
