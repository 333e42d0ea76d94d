"""Running statistics that torch updates in place without counting a
version, read in by the next call.

aten's batch norm (``F.batch_norm(x, running_mean, running_var,
training=True)``, which a norm module's train-mode forward calls) updates
the statistics in place, and its schema does not mark them written: their
``_version`` stays, so the per-call check (``runtime/state.py``:
``StateWatch``) would not see the change, and the next call would run on
the device's old statistics.  Three ways in, each costing a compiled call
nothing:

- A module with ``num_batches_tracked`` in the program counts it with
  ``add_`` in the same forward: its statistics' slots take a change of the
  counter for theirs (``_StateSlot.counted_by``, ``link_running_stats``).
- A module with ``running_mean``/``running_var`` and no counter in the
  program (``num_batches_tracked`` deleted or None, a custom norm module)
  gets a forward pre-hook (:func:`_train_forward_updates_stats`, one per
  module, skipped while torch traces, no part of any program or cache
  key): a train-mode eager forward first copies in what calls left, then
  has the slots read the statistics in at the next call.
- In a ``torch.compile`` graph of another backend the pre-hook is traced,
  not run: tracing it wraps the backend so that each run of that graph
  has the statistics read in (:func:`_noted_after_each_run`).
- A batch-norm function called on statistics that a call left stale (a
  training step's, a train-mode forward program's) runs through the stale
  class's hook, which calls :func:`_after_batch_norm` after it: in train
  mode the slots read the statistics in at the next call.

Not seen (docs/runtime.md): a batch-norm function called outside a module
forward on statistics no call left stale (an eval-mode forward program's,
or ones eager code read since the last call): nothing that hloalias sees
runs; statistics under other names.  A read-in costs one upload of the
statistics, and only after such an eager run."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch

from hloalias.runtime.state import (
    _AFTER_EAGER_RUN, _AGREEMENTS, _RUNNING_STATS, _InputsBroughtIn, _SLOTS_OF_TENSOR, _SYNC_HOOK, _StateSlot, _tracing,
    link_running_stats, refresh_stale,
)


def watch_running_stats(slots: dict[str, _StateSlot], owner: torch.nn.Module | None) -> None:
    """Link a program's running-statistic ``slots`` to their module's
    counter (``link_running_stats``); give each module of ``owner`` holding
    statistics the program has no counter for the pre-hook."""
    link_running_stats(slots)
    uncounted = {
        id(source) for name, slot in slots.items()
        if name.rpartition(".")[2] in _RUNNING_STATS and slot.stats_counter is None
        and (source := slot.source()) is not None
    }
    if owner is None or not uncounted:
        return
    for module in owner.modules():
        if any(id(module._buffers.get(leaf)) in uncounted for leaf in _RUNNING_STATS) and not any(
            hook is _train_forward_updates_stats for hook in module._forward_pre_hooks.values()
        ):
            module.register_forward_pre_hook(_train_forward_updates_stats)


def _train_forward_updates_stats(module: torch.nn.Module, args: Any) -> None:
    """A train-mode eager forward of a module whose statistics have no
    counter may update them uncounted: copy in what calls left first, then
    have the next call read them in."""
    if not module.training:
        return
    if torch.compiler.is_compiling():
        _noted_after_each_run(module)
        return
    if _tracing(args):
        return
    stats = [module._buffers.get(name) for name in _RUNNING_STATS]
    refresh_stale(stats, f"an eager forward of {type(module).__name__}")
    _note_uncounted_writes(stats)


def _noted_after_each_run(module: torch.nn.Module) -> bool:
    """Called when dynamo traces the pre-hook (a train-mode forward in a
    ``torch.compile`` graph): dynamo runs it once, at trace time (marked
    constant, as ``state._inputs_brought_in_by_this_graph`` is), and it
    wraps the backend so that each run of the graph it compiles then has
    ``module``'s statistics read in by the next call.  Not for the hloalias
    backend's graphs (their state is on the device, not in the tensors) nor
    an export capture.  True when it wrapped."""
    symbolic_convert = sys.modules.get("torch._dynamo.symbolic_convert")
    tx = getattr(symbolic_convert.tls, "current_tx", None) if symbolic_convert is not None else None
    output = getattr(tx, "output", None)
    compiler_fn = getattr(output, "compiler_fn", None)
    if output is None or compiler_fn is None or getattr(output, "export", False):
        return False
    output.compiler_fn = _NotesStatsAfterRuns(compiler_fn, weakref.ref(module))
    return True


# What ``torch._dynamo.assume_constant_result`` sets (without importing dynamo).
_noted_after_each_run._dynamo_marked_constant = True  # type: ignore[attr-defined]


class _NotesStatsAfterRuns:
    """A dynamo backend (``compiler_fn``) whose compiled graphs, after each
    run, have ``module``'s running statistics read in by the next call."""

    def __init__(self, compiler_fn: Callable[..., Any], module: "weakref.ref[torch.nn.Module]") -> None:
        #: Where dynamo looks for the backend a wrapper wraps.
        self.compiler_fn = compiler_fn
        self.module = module
        self.__name__ = getattr(compiler_fn, "__name__", type(compiler_fn).__name__)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        compiled = self.compiler_fn(gm, example_inputs, **kwargs)
        if getattr(compiled, "brings_inputs_up_to_date", False) and not isinstance(compiled, _InputsBroughtIn):
            return compiled  # the hloalias backend's graph: its state is the device's
        module = self.module

        def run(*args: Any) -> Any:
            result = compiled(*args)
            found = module()
            if found is not None:
                _note_uncounted_writes([found._buffers.get(name) for name in _RUNNING_STATS])
            return result

        return run


# A module-level function (deepcopy and pickle keep it); the hook checks
# and the caches' keys skip it (``is_state_sync_hook``).
setattr(_train_forward_updates_stats, _SYNC_HOOK, True)


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
