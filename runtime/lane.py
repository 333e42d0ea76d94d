"""The native call path's set-up: whether an executable's plan is of the
kind ``hloalias.runtime._lane.Lane`` runs (:func:`_lane_refusal`) and the
lane built from the plan's data (:func:`_native_lane`); the lane itself is
runtime/_lane.cpp.

Contract: a build of the extension is used only when it carries the
interface number this file expects (``_lane.ABI_VERSION`` ==
:data:`_LANE_ABI_VERSION`), for the ``Lane`` and for the per-call checks
this file hands out alike (``first_changed``, ``first_differing``,
``values_in_range``: never some natively and the rest silently in
Python); a stale build (from an older ``_lane.cpp``) leaves every call
and those checks on the Python path, ``explain()`` says so, and
importing the runtime warns once
(:class:`~hloalias.config.NativePathWarning`, unless ``HLOALIAS_NATIVE=0``),
both with how to rebuild it."""

from __future__ import annotations

from collections.abc import Callable

import functools
import weakref
from typing import TYPE_CHECKING, Any, cast

import torch.utils._pytree as pytree

from hloalias import config
from hloalias.runtime import execution
from hloalias.runtime.ownership import _BACKINGS, _BACKINGS_SWEEP_AT, HostBacking, _register_backing
from hloalias.runtime.pjrt import LANE_ABI_VERSION, native_enabled
from hloalias.runtime.plan import UNFLATTEN, _CallPlan, _NativeSteps

if TYPE_CHECKING:
    from hloalias.runtime.executable import Executable

try:  # the native call path; built with the package (setup.py), optional
    from hloalias.runtime import _lane
except ImportError:  # not built here: every call takes the Python path
    _lane = None  # type: ignore[assignment]

#: What a native lane returns for a call it leaves to the Python path.
_LANE_FALLBACK = object()

#: The interface number of the ``Lane`` this file builds (its constructor's
#: arguments, what it reads of the plan and the executable) and of the
#: module's functions this runtime calls: runtime/_lane.cpp's
#: ``kAbiVersion``, kept in ``pjrt.LANE_ABI_VERSION`` (the Waiter and the
#: DLPack guard are checked against it there).  9: ``first_differing``
#: (a build of 8 may lack it, and was then silently compared in Python).
_LANE_ABI_VERSION = LANE_ABI_VERSION

_REBUILD = "rebuild it: bash -c 'source scripts/venv.sh' (or pip install --no-build-isolation -e .)"


def _build_refusal() -> str | None:
    """Why the built extension cannot be used here (words for
    ``explain()``), or None: it is missing, or a stale build."""
    if _lane is None:
        return "the native call path (hloalias.runtime._lane) is not built here"
    built = getattr(_lane, "ABI_VERSION", None)
    if built != _LANE_ABI_VERSION:
        return (
            f"the native call path's build is stale (hloalias.runtime._lane has interface version "
            f"{built if built is not None else 'none'}, this runtime needs {_LANE_ABI_VERSION}); {_REBUILD}"
        )
    return None


def warn_if_stale() -> None:
    """The one warning that the built extension is stale (run when this
    module is first imported; a missing build warns in ``pjrt``):
    :func:`~hloalias.config.warn_native_stale` with :func:`_build_refusal`'s
    words."""
    if _lane is None:
        return
    refusal = _build_refusal()
    if refusal is not None:
        config.warn_native_stale(refusal)


def native_first_changed() -> Callable[[tuple[Any, ...], tuple[int, ...], tuple[int, ...]], int] | None:
    """``_lane.first_changed`` (the per-call check of the module's tensors,
    :class:`~hloalias.runtime.state.StateWatch`) where the extension is
    built (a current build), else None (the same check in Python,
    ``state._first_changed_in_python``).  Used on both call paths, also with
    ``HLOALIAS_NATIVE=0``: it is one check, the same in both languages
    (``test_module_state_sync.py``), run once per state tensor on every
    call, not a call path."""
    if _build_refusal() is not None:
        return None
    return getattr(_lane, "first_changed", None)


def native_first_differing() -> Callable[[tuple[Any, ...], tuple[Any, ...]], int] | None:
    """``_lane.first_differing`` (the per-call compare of the state torch
    may change without counting a version with its snapshots,
    :class:`~hloalias.runtime.state.StateWatch`) where the extension is
    built (a current build), else None (the same compare in
    Python, ``state._first_differing_in_python``).  Used on both call
    paths, as :func:`native_first_changed`."""
    if _build_refusal() is not None:
        return None
    # A current build has it (interface 9 on): a build without it is
    # refused as stale above, where it used to be used with this compare
    # alone silently in Python.
    return getattr(_lane, "first_differing", None)


def native_values_in_range() -> Callable[[Any, int, int], bool | None] | None:
    """``_lane.values_in_range`` (an index input's range check, the lane's
    own min/max pass: :class:`~hloalias.runtime.plan._IndexCheck`) where the
    extension is built (a current build), else None (``torch.aminmax``).
    Used on both call paths, also with ``HLOALIAS_NATIVE=0``: one check in
    either language, run once per index input on every call."""
    if _build_refusal() is not None:
        return None
    return getattr(_lane, "values_in_range", None)


def _lane_refusal(exe: "Executable", plan: _CallPlan | None) -> str | None:
    """Why ``exe`` has no native call path (words for ``explain()``), or
    None when it can have one (see :func:`_native_lane`)."""
    built = _build_refusal()
    if built is not None:
        return built
    if not native_enabled():
        return "HLOALIAS_NATIVE=0"
    if plan is None:
        return "a mesh program"
    if not plan.host_results:
        return "not a CPU program"
    if not plan.executes:
        return "the program does not run (its outputs are views of its inputs)"
    if not plan.direct_outputs or not all(result.nbytes > 0 for result in plan.outputs):
        return "an output is a rebuilt view, a constant or empty"
    if any(step.slot is not None for step in plan.consumed):
        return "module state is consumed by a donation"
    if exe._signature.strided_inputs:
        return "an input's storage layout is read (as_strided) and checked on every call"
    for step in plan.user_steps:
        if step.bits is not None:
            return f"input '{step.name}' is read and written as its {str(step.bits).removeprefix('torch.')} bits"
        if not step.imported and step.in_place is None and not step.key:
            return f"input '{step.name}' is written but not in place (its new value is copied back)"
    return None


def _native_lane(exe: "Executable", plan: _CallPlan | None) -> tuple[Any, str | None]:
    """The native call path (``hloalias.runtime._lane.Lane``, see its source
    for the contract) of ``exe`` and None, or None and why it has none
    (:func:`_lane_refusal`): the extension is not built, ``HLOALIAS_NATIVE=0``,
    or the plan is of another kind than the lane runs.  That kind: a CPU
    program that runs, every output one of its results (no rebuilt views,
    constants, empty results), no state consumed (a donated torch input is
    left as it is), and every user input either read only or written (or donated) in
    place into the runtime buffer backing it.  Calls of that kind whose
    inputs it does not take (another type, layout or memory; an input eager
    refuses to write; overlapping inputs; a consumed or tied donated state
    buffer) still take the Python path, call by call."""
    refusal = _lane_refusal(exe, plan)
    if refusal is not None or plan is None or _lane is None:
        return None, refusal
    steps = _NativeSteps.of(exe, plan)
    unflatten = None
    if steps.mode == UNFLATTEN:
        spec = exe._signature.out_spec
        unflatten = lambda flat: pytree.tree_unflatten(flat, spec)  # noqa: E731
    # The lane reaches the executable through a weak proxy: the executable
    # holds the lane, so a strong reference back would be a cycle, and a
    # dropped executable (its host memory and device buffers) would wait
    # for the cyclic GC.  The lane runs only inside a call of the
    # executable, so the proxy is alive whenever it is used.
    me = cast("Executable", weakref.proxy(exe))  # stands for it: the callees read its attributes
    try:
        lane = _lane.Lane(
            me, plan, steps.inputs, steps.sources, steps.pairs, steps.checks, steps.commits, steps.donated_state, steps.outputs,
            steps.kept, steps.mode, steps.refill, steps.state_count, unflatten,
            exe._group.lock if exe._slots else None, exe._imports, _BACKINGS, _BACKINGS_SWEEP_AT, HostBacking,
            _register_backing, functools.partial(execution.import_input, me),
            functools.partial(execution.finish_planned, me), functools.partial(execution.execution_failed, me),
            functools.partial(execution.settle, me), _LANE_FALLBACK,
            exe._state_watch.changed if exe._watch_late else None,
            functools.partial(type(exe)._sync_from_torch, me) if exe._watch_late else None,
            steps.ranges,
        )
    except TypeError as error:  # a build whose Lane takes other arguments than these
        return None, f"the native call path's build does not match this runtime ({error}); {_REBUILD}"
    return lane, None


warn_if_stale()
