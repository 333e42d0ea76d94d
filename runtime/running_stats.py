"""Running statistics that torch updates in place without counting a
version, read in by the next call.

aten's batch norm (``F.batch_norm(x, running_mean, running_var,
training=True)``, ``torch.batch_norm``, ``torch.native_batch_norm``,
``aten._native_batch_norm_legit``, and a norm module's train-mode forward,
which calls them) updates the statistics in place, and their ``_version``
stays: the per-call version check (``runtime/state.py``: ``StateWatch``)
would not see the change, and the next call would run on the device's old
statistics.  So the state a program feeds to a batch norm, whatever its
name (the signature's ``batch_norm_state``, read from the decomposed
graph), and every ``running_mean``/``running_var`` (a training step's
trace records no batch norm), is compared by value
(:meth:`_StateSlot.watch_values`): its slot keeps a host copy of what the
tensor held when the two last agreed, and every call compares the
tensor's bytes with it (``_lane.first_differing``, a memcmp per tensor,
on both call paths where the extension is built); a difference is read
in as torch's edit.  The statistics are per-channel vectors: the compare
costs a call little (bench/RESULTS-runtime.md).  No hook on the module
(a ``torch.save`` of it needs no hloalias to load) and no patch of torch.

Two older ways in cost a call nothing and stay: a change of the module's
``num_batches_tracked`` counts as one of its statistics
(``_StateSlot.counted_by``), and a batch-norm function run on statistics
a call left stale (their class's hook) has them read in
(:func:`_after_batch_norm`).

Uncounted writes to other state through ``.data``, ``.numpy()``,
``__array__``, ``__dlpack__`` or the storage are seen where the escape is
taken (``runtime/state.py``: ``_WatchedTensorHook``; what it does not see
is listed there and in docs/runtime.md).  A read-in costs one upload of
the statistics, and only after such an eager run."""

from __future__ import annotations

from typing import Any

import torch

from hloalias.runtime.state import (
    _AFTER_EAGER_RUN, _AGREEMENTS, _RUNNING_STATS, _SLOTS_OF_TENSOR, _SYNC_HOOK, _StateSlot, link_running_stats,
)


def watch_running_stats(slots: dict[str, _StateSlot], fed_to_batch_norm: frozenset[str] = frozenset()) -> None:
    """Link a program's running-statistic ``slots`` to their module's
    counter (``link_running_stats``), and have each slot the program feeds
    to a batch norm (``fed_to_batch_norm``: the signature's
    ``batch_norm_state``) or named as a running statistic compared by
    value at every call (:meth:`_StateSlot.watch_values`)."""
    link_running_stats(slots)
    for name, slot in slots.items():
        if name in fed_to_batch_norm or name.rpartition(".")[2] in _RUNNING_STATS:
            slot.watch_values()


def _note_uncounted_writes(tensors: list[Any]) -> None:
    """Torch changed ``tensors`` in place without counting a version: each
    slot standing for one (and not lagging it: the calls' value would be
    newer) forgets their agreement, so the per-call check reads it in."""
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            continue
        for ref in _SLOTS_OF_TENSOR.get(tensor) or ():  # type: ignore[no-untyped-call]
            slot = ref()
            if slot is not None and slot.source() is tensor and not slot.lags:
                slot.version = -1  # no tensor's version: never equal
                _AGREEMENTS[0] += 1  # the watch rebuilds its versions


def _after_batch_norm(mean_at: int, var_at: int) -> Any:
    """What the stale hook runs after a batch-norm function whose
    ``running_mean``/``running_var`` are its arguments ``mean_at``/``var_at``
    (``training`` is the sixth, as in all of them)."""

    def after(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if kwargs.get("training", args[5] if len(args) > 5 else False):
            _note_uncounted_writes([
                kwargs.get(name, args[at] if len(args) > at else None)
                for name, at in (("running_mean", mean_at), ("running_var", var_at))
            ])

    return after


_AFTER_EAGER_RUN[torch.nn.functional.batch_norm] = _after_batch_norm(1, 2)
for _name in ("batch_norm", "native_batch_norm", "_batch_norm_impl_index", "cudnn_batch_norm", "miopen_batch_norm"):
    if hasattr(torch, _name):
        _AFTER_EAGER_RUN[getattr(torch, _name)] = _after_batch_norm(3, 4)


def _train_forward_updates_stats(module: torch.nn.Module, args: Any) -> None:
    """Does nothing: an earlier hloalias registered this as a forward
    pre-hook on norm modules without ``num_batches_tracked``, and a module
    pickled then (``torch.save(model)``) names it; it stays so that such a
    pickle still loads.  Their statistics are compared by value now."""


# Not part of any program: the hook checks and the caches' keys skip it.
setattr(_train_forward_updates_stats, _SYNC_HOOK, True)
