"""Execution and commit: one call of a compiled program, after
``Executable.__call__`` bound and checked its inputs.

The order, for one device (:func:`run_planned`, driven by the frozen
:class:`~hloalias.runtime.plan._CallPlan`): import the user inputs
(:mod:`hloalias.runtime.ownership`: zero-copy where the runtime may read
the caller's memory, a runtime buffer where one backs a written input),
build the argument list from the state store, dispatch and wait
(:class:`~hloalias.runtime.pjrt.SingleDeviceDispatch`), then commit
(:func:`commit_planned`: state slots, runtime buffers behind written
inputs, caller tensors, consumed donors) and hand the results to
:mod:`hloalias.runtime.assembly`.  A program on a mesh has no plan and
takes :func:`run_mesh`: the same stages over sharded arrays.

Contract: every call is a transaction.  Until the program runs nothing is
changed (an error there leaves state and caller tensors as they were).
Once it ran, its donated buffers are gone, so the only usable state is
the call's: any exception from then on, ``KeyboardInterrupt`` included,
completes the commit before it leaves (:func:`settle`; the commit is
idempotent, a step already done is found done), on both call paths and on
a mesh.  The native call path (runtime/_lane.cpp) does the common kind of
one-device call itself and calls :func:`finish_planned`, :func:`settle`
and :func:`execution_failed` for the rest."""

from __future__ import annotations

import functools
import itertools
import operator
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import jax
import torch

from hloalias.errors import DonatedBufferError, ExecutionError
from hloalias.runtime.assembly import _view_base, assemble_outputs, direct_outputs
from hloalias.runtime.ownership import (
    DeviceTensor,
    HostBacking,
    _backing_of,
    _host_result,
    _can_reseat,
    _forget_import,
    _register_backing,
    _resolved,
    _writable_on_host,
    array_to_torch,
    host_backed_tensor,
    torch_to_device,
)
from hloalias.runtime.plan import _CallPlan

if TYPE_CHECKING:
    from hloalias.runtime.executable import Executable

_NOTHING: frozenset[int] = frozenset()


# -- one device: the planned call -----------------------------------------------------


def run_planned(exe: "Executable", plan: _CallPlan, inputs: dict[int, Any]) -> Any:
    """One call on one device, driven by ``plan`` (see :class:`_CallPlan`):
    the facts of the program precomputed and, after the call, work only
    for the arguments that have some.  Inputs were checked by
    ``Executable.__call__``, which holds the module's lock."""
    if not plan.executes:
        exe._calls += 1
        views_of: dict[int, Any] = {}
        for step in plan.user_steps:
            value = inputs[step.index]
            if not isinstance(value, DeviceTensor):
                views_of[step.index] = _view_base(value, _resolved(value))
        return assemble_outputs(exe, inputs, views_of, {})
    bases: dict[int, torch.Tensor] = {}
    backings: dict[int, HostBacking] = {}
    reseatable: set[int] = set()
    user_arrays: list[jax.Array] = []
    for step in plan.user_steps:
        value = inputs[step.index]
        if step.key:  # the random key: already PJRT's (executable.draw_rng_key)
            user_arrays.append(value)
            continue
        if isinstance(value, DeviceTensor):
            user_arrays.append(value.array if step.bits is None else _bits_array(value.array, step.bits))
            continue
        if (
            step.imported and plan.host_results
            and value.is_contiguous() and not value.is_conj() and not value.is_neg()
        ):
            # The common read-only input: imported as it is (the import
            # of the last call reused while it is the same tensor).
            bases[step.index] = value
            user_arrays.append(import_input(exe, step.index, value))
            continue
        if step.in_place is not None:
            backing = _backing_of(value, exe._input_nbytes[step.index], step.bits is not None)
            if backing is not None:
                backings[step.index] = backing
                bases[step.index] = value
                user_arrays.append(backing.array)
                continue
            if step.reseat and _can_reseat(value):
                # Decided before the zero-copy export below adds a
                # reference to the storage (released asynchronously).
                reseatable.add(step.index)
        tensor = _resolved(value)
        tensor = tensor if tensor.is_contiguous() else tensor.contiguous()
        bases[step.index] = tensor
        # A bits input: XLA reads the tensor's integer view (no copy).
        user_arrays.append(torch_to_device(
            tensor if step.bits is None else tensor.detach().view(step.bits), exe.device, owned=False,
        ))
    arrays = plan.arguments(exe, user_arrays)
    del user_arrays
    if len(plan.donated_state) > 1:
        # A tie takes two donors; a consumed donor fails in the
        # dispatch below, whose error path names it.
        _check_donated_state(exe, plan)
    # What commit reads of the pre-call arguments, taken before they run.
    kept: dict[int, Any] = {step.index: arrays[step.index] for step in plan.kept}
    dispatch = plan.dispatch
    assert dispatch is not None  # a plan that executes has one
    # The results, stored as the execute returns (SingleDeviceDispatch's launch):
    # once the program ran (donated buffers are gone), an exception at any
    # point (KeyboardInterrupt included) finds them and commits before it
    # leaves, so the module state is the call's, never half of it (settle).
    ran: list[Sequence[jax.Array]] = []
    # The count before this call: a call whose program ran is counted once
    # whatever stops it (the commit completes it: its effects are the call's).
    calls = exe._calls
    try:
        # The launch of SingleDeviceDispatch's docstring.
        if dispatch.unreturned:  # a launch interrupted earlier on this thread
            dispatch.unreturned.pop(threading.get_ident(), None)
        entry = dispatch.entry
        if entry is not None:
            ran.extend(itertools.starmap(entry, (arrays,)))
        else:
            ran.extend(map(dispatch.run, (arrays,)))
        outputs = ran[0]
        if dispatch.unreturned:
            dispatch.unreturned.pop(threading.get_ident(), None)
        if exe._watch_late and exe._state_watch.changed():
            # Torch changed the module's state since the two last agreed
            # (Executable._watch_late: checked while the program runs).
            # The run read the old state and had no effect: wait for it
            # (it reads the caller's imported memory until it ends), drop
            # it, bring the state up to date and run again.
            try:
                dispatch.wait(outputs)
            except Exception:  # noqa: BLE001 - the run is dropped
                pass
            exe._sync_from_torch()
            return run_planned(exe, plan, inputs)
        try:
            # Zero-copy imports of caller tensors are read until the
            # program ends: return only then (the caller may write them next).
            dispatch.wait(outputs)
        except Exception as error:
            execution_failed(exe, plan, error)
        exe._calls += 1
        # Dropping the list drops the zero-copy imports of caller tensors
        # (they hold a reference to the caller's storage, which would
        # block re-seating); ``kept`` holds what commit reads.
        arrays = []
        # finish_planned, inline (every Python-path call comes here).
        try:
            arg_tensors = commit_planned(exe, plan, inputs, backings, reseatable, kept, outputs)
        except BaseException:
            settle(exe, plan, inputs, bases, backings, reseatable, kept, outputs)
            raise
        single = plan.single_output
        if single is not None:
            return _host_result(outputs[single.position], single)
        return planned_outputs(exe, plan, inputs, bases, arg_tensors, outputs)
    except (ExecutionError, DonatedBufferError):
        raise
    except BaseException as error:
        arrays = []
        ran_outputs = dispatch.ran_results(ran)
        if ran_outputs is not None:
            if exe._calls == calls:  # stopped before it was counted
                exe._calls = calls + 1
            settle(exe, plan, inputs, bases, backings, reseatable, kept, ran_outputs)
        if isinstance(error, Exception):  # not an interrupt: the execution's error, in words
            execution_failed(exe, plan, error)
        raise


def import_input(exe: "Executable", index: int, tensor: torch.Tensor) -> jax.Array:
    """The CPU device's zero-copy view of read-only input ``tensor``
    (contiguous, no lazy bits).  The import of the previous call is
    reused while it is the same tensor object at the same address: the
    import *is* that memory (no copy), so it always shows the tensor's
    current data, however it was written (``.numpy()`` writes bump no
    version counter), and it keeps the memory it views alive.  Shape and
    dtype were checked, so the same address means the same bytes.  The
    entry goes when the tensor does (or a new tensor is passed); only
    inputs that are not written are imported this way, so it never stands
    in the way of re-seating a written one.  A donated input's import is
    not kept: the call consumes it (PJRT deletes the imported array; the
    caller's memory stays as it was)."""
    found = exe._imports.get(index)
    address = tensor.data_ptr()
    if found is not None and found[0]() is tensor and found[1] == address:
        return found[2]
    # Exported from a new tensor over the same storage: an export of
    # ``tensor`` itself would keep its Python object alive (torch
    # preserves it while its C++ tensor is referenced), so the entry
    # would never go.
    array = torch_to_device(tensor.detach(), exe.device, owned=False)
    if array.unsafe_buffer_pointer() == address and index not in exe._donated_args:  # zero-copy: reusable
        reference = weakref.ref(tensor, functools.partial(_forget_import, exe._imports, index))
        exe._imports[index] = (reference, address, array)
    return array


def _check_donated_state(exe: "Executable", plan: _CallPlan) -> None:
    """DonatedBufferError for a donated state buffer already consumed,
    ExecutionError for one buffer taken twice as a donor (tied state).
    Other state is not checked here: a consumed buffer is None in the
    argument list or a deleted array, which PJRT refuses before running
    anything, and the error path of the call names it."""
    donors: dict[int, int] = {}
    for step in plan.donated_state:
        array = exe._slot_array(step.name)  # the buffer itself: no copy in another form
        if id(array) in donors:
            raise ExecutionError(
                f"module state '{step.name}' is the same buffer as "
                f"'{exe._names[donors[id(array)]]}' (tied) and the program writes or "
                "donates it; XLA cannot take one buffer twice as a donor"
            )
        donors[id(array)] = step.index


def execution_failed(exe: "Executable", plan: _CallPlan, error: Exception) -> NoReturn:
    """Raise the error of a planned call whose execution failed
    (:class:`DonatedBufferError` naming a consumed state buffer, else
    :class:`ExecutionError`).  Nothing was committed."""
    for step in plan.steps:
        if step.slot is not None:
            exe._state_array(step.name)  # a consumed state buffer, in words
    raise ExecutionError(f"XLA execution failed: {error}") from None


def finish_planned(
    exe: "Executable", plan: _CallPlan, inputs: dict[int, Any], bases: dict[int, torch.Tensor],
    backings: dict[int, HostBacking], reseatable: set[int], kept: dict[int, Any], outputs: Sequence[jax.Array],
) -> Any:
    """The commit and outputs of a planned call that ran (``outputs``,
    ready; ``_calls`` counts it): ``bases`` are the caller tensors (or
    their resolved copies) the arguments were made from, ``backings``
    the runtime buffers passed for inputs they back, ``reseatable`` the
    inputs that may move onto their new buffer, ``kept`` the pre-call
    arrays of :attr:`_CallPlan.kept`.  Also the native call path's
    (``_lane``) for a call whose results are not the usual ones.  On any
    exception the commit is completed (:func:`settle`) before it leaves."""
    try:
        arg_tensors = commit_planned(exe, plan, inputs, backings, reseatable, kept, outputs)
    except BaseException:
        settle(exe, plan, inputs, bases, backings, reseatable, kept, outputs)
        raise
    return planned_outputs(exe, plan, inputs, bases, arg_tensors, outputs)


def planned_outputs(
    exe: "Executable", plan: _CallPlan, inputs: dict[int, Any], bases: dict[int, torch.Tensor],
    arg_tensors: dict[int, Any], outputs: Sequence[jax.Array],
) -> Any:
    """The outputs of a committed planned call (:mod:`hloalias.runtime.assembly`):
    ``arg_tensors`` from :func:`commit_planned`, ``bases`` as for :func:`finish_planned`."""
    if plan.direct_outputs:
        return direct_outputs(exe, plan, outputs)
    for step in plan.user_steps:
        if step.index not in arg_tensors and step.index in bases:
            arg_tensors[step.index] = _view_base(inputs[step.index], bases[step.index])
    return assemble_outputs(exe, inputs, arg_tensors, dict(zip(exe._result_keys, outputs)))


def settle(
    exe: "Executable", plan: _CallPlan, inputs: dict[int, Any], bases: dict[int, torch.Tensor],
    backings: dict[int, HostBacking], reseatable: set[int], kept: dict[int, Any], outputs: Sequence[jax.Array],
) -> None:
    """The commit of a call whose program ran, after an exception
    (``KeyboardInterrupt`` included) left it unfinished: the waiting, the
    commit or the outputs.  Its donated buffers are gone, so the state
    can only be the call's: every mutated state slot and runtime buffer
    behind a written input takes its new value (the commit is
    idempotent: a step already done is found done), and the results are
    dropped.  The native call path calls it too.  An error of its own
    is not raised over the one being handled."""
    try:
        commit_planned(exe, plan, inputs, backings, reseatable, kept, outputs)
    except BaseException:  # noqa: BLE001 - the caller re-raises the first error
        pass


def commit_planned(
    exe: "Executable", plan: _CallPlan, inputs: dict[int, Any], backings: dict[int, HostBacking],
    reseatable: set[int], kept: dict[int, Any], outputs: Sequence[jax.Array],
) -> dict[int, Any]:
    """Commit a planned call that ran: state slots, runtime buffers
    behind written inputs, caller tensors and donated DeviceTensors take
    their new values.  Returns the tensors rebuilt views of written
    inputs are views of.  Idempotent: run again after an exception
    stopped it part way (:func:`settle`), each step already done is
    found done (a slot or runtime buffer holds its new array; a caller
    tensor already on its new buffer is left there)."""
    moved: set[int] | frozenset[int] = _NOTHING
    for index, lent in backings.items():
        if lent.array.is_deleted() and (
            outputs[plan.steps[index].in_place].unsafe_buffer_pointer() != lent.address  # type: ignore[index]
        ):
            moved = _check_in_place(exe, plan, inputs, backings, outputs)
            break
    # Commit: nothing below can fail on valid inputs (checked above).
    if plan.consumed:
        call_name = f"in call {exe._calls}"
        for step in plan.consumed:
            value = inputs.get(step.index)
            if step.slot is not None:
                if kept[step.index].is_deleted():
                    step.slot.array = None
                    step.slot.consumed_by = call_name
            elif isinstance(value, DeviceTensor):
                value._consume(call_name)
    arg_tensors: dict[int, Any] = {}
    for step in plan.after:
        new_value = outputs[step.mutated] if step.mutated is not None else None
        if step.slot is not None:
            if new_value is not None:
                step.slot.array = _committed_buffer(exe, step.name, kept[step.index], new_value)
                step.slot.consumed_by = None
            continue
        value = inputs[step.index]
        backing = backings.get(step.index)
        # Found done when committing again (settle): the buffer already
        # holds the result XLA wrote into its memory.
        written_in_place = backing is not None and backing.array is outputs[step.in_place]  # type: ignore[index]
        if backing is not None and step.index not in moved and backing.array.is_deleted():
            # XLA wrote the aliased result into the donated buffer (its
            # address was checked above; it is ready): that result now
            # owns the memory the caller's tensor shows.
            backing.array = outputs[step.in_place]  # type: ignore[index]
            written_in_place = True
        if isinstance(value, DeviceTensor):
            if new_value is not None:
                committed = _committed_buffer(exe, None, kept[step.index], new_value)
                if step.bits is not None:  # its own dtype: the new bits reinterpreted on the device
                    committed = _bits_array(committed, value.dtype)
                value._rebind(committed)
            continue
        if new_value is None:
            continue
        if not written_in_place and step.index not in moved:
            _update_caller_tensor(exe, step.index, value, new_value, backing, step.index in reseatable)
        if not plan.direct_outputs:
            # Views of the new value share the caller's tensor, as in
            # eager (whatever its strides: assembly.assemble_outputs); one with a
            # lazy bit holds other values than its storage, so they view
            # the new value.
            view_base = _view_base(value, None)
            arg_tensors[step.index] = view_base if view_base is not None else _caller_typed(new_value, value)
    return arg_tensors


def _check_in_place(
    exe: "Executable", plan: _CallPlan, inputs: dict[int, Any], backings: dict[int, HostBacking],
    outputs: Sequence[jax.Array],
) -> set[int] | frozenset[int]:
    """Check that XLA wrote each donated runtime buffer's aliased result
    in place (the runtime relies on it: the caller's tensor shows that
    memory).  PJRT does so whenever it takes a donation; if it ever did
    not, the donated memory is released under the tensor, so the tensor
    is moved onto the result (correct when nothing else views its
    storage); with other views, ExecutionError: they show released memory.
    Returns the inputs so moved (they hold their new value)."""
    moved: set[int] = set()
    for index, backing in backings.items():
        if not backing.array.is_deleted():
            continue  # not donated: XLA wrote elsewhere and commit copies back
        step = plan.steps[index]
        assert step.in_place is not None
        result = outputs[step.in_place]
        if result.unsafe_buffer_pointer() == backing.address:
            continue
        value = inputs[index]
        alone = _can_reseat(value)
        tensor, fresh = host_backed_tensor(result, value.dtype, tuple(value.shape), backing.nbytes)
        with torch.no_grad():
            value.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
        _register_backing(fresh, step.bits is not None)
        moved.add(index)
        if not alone:
            raise ExecutionError(
                f"XLA wrote the new value of input '{step.name}' to a new buffer instead of into its "
                "donated buffer; the tensor now holds it, but other views of its old memory are invalid"
            )
    return moved


def _update_caller_tensor(
    exe: "Executable", index: int, value: torch.Tensor, new_value: jax.Array, backing: HostBacking | None,
    reseatable: bool,
) -> None:
    """Give the caller's tensor its new value, as cheaply as is correct:
    nothing to do when XLA wrote it in place (it is backed by a runtime
    buffer that was donated); re-seat it onto the new buffer when nothing
    else views its storage (no copy; later calls then update in place);
    else copy the new value back (counted in ``host_copies``).  A new
    value of another dtype than the tensor's is its bits (a user input
    stored as bits: ``_ProgramFacts.input_bits``): the tensor keeps its
    dtype, a re-seated one over the integer buffer, a copy written into its
    integer view (the bits, never a conversion of their values)."""
    if backing is not None:
        if backing.array.is_deleted() and backing.rebind(new_value):
            return
        if not backing.array.is_deleted():
            _copy_back(value, new_value)
            exe._count_copy(exe._names[index])
            return
        # Donated but written elsewhere (never for an input aliased to
        # its own result): the tensor moves to the new buffer.
    if reseatable and _writable_on_host(new_value):
        tensor, fresh = host_backed_tensor(new_value, value.dtype, tuple(value.shape))
        with torch.no_grad():
            value.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
        _register_backing(fresh, fresh.array.dtype != _jax_dtype(value.dtype))
        return
    _copy_back(value, new_value)
    exe._count_copy(exe._names[index])


def _copy_back(value: torch.Tensor, new_value: jax.Array) -> None:
    """Copy ``new_value`` into the caller's tensor ``value``: into its
    integer view where ``new_value`` holds its bits (same width, another
    dtype), so the bits are copied, not converted as values."""
    new = array_to_torch(new_value)
    with torch.no_grad():
        (value if new.dtype == value.dtype else value.detach().view(new.dtype)).copy_(new)


def _caller_typed(new_value: jax.Array, value: torch.Tensor) -> torch.Tensor:
    """``new_value`` as a tensor of the caller's tensor's dtype (its bits reinterpreted)."""
    new = array_to_torch(new_value)
    return new if new.dtype == value.dtype else new.view(value.dtype)


def _jax_dtype(dtype: torch.dtype) -> Any:
    """The jax dtype of a torch dtype (their names agree)."""
    return jax.numpy.dtype(str(dtype).removeprefix("torch."))


def _bits_array(array: jax.Array, dtype: torch.dtype) -> jax.Array:
    """``array``'s bits as ``dtype`` of the same width, on its device (a
    DeviceTensor passed for a user input stored as bits, and its new value
    back: one device copy each way).  x64 on: without it jax narrows a
    64-bit target (f64 <-> i64 bits) to 32 bits and splits each element in
    two (a trailing dimension of 2), another value of another shape."""
    with jax.enable_x64(True):
        return jax.lax.bitcast_convert_type(array, _jax_dtype(dtype))


def _committed_buffer(exe: "Executable", state_name: str | None, old: jax.Array, new: jax.Array) -> jax.Array:
    """The buffer that holds an updated argument after a call.  When XLA
    wrote in place (the old buffer was donated) that is ``new``; when the
    old buffer is still alive (a torch view of it is held, or it was not
    aliased) the new value is copied into it on the host so that every
    view of it stays live, as eager's would."""
    if old.is_deleted() or not _writable_on_host(old):
        return new
    array_to_torch(old).copy_(array_to_torch(new))
    if state_name is not None:
        exe._count_copy(state_name)
    return old


# -- a mesh: the same stages over sharded arrays ---------------------------------------


def run_mesh(exe: "Executable", inputs: dict[int, Any]) -> Any:
    """One call of a program on a mesh (SPMD; such a program has no call
    plan): each user input is copied into PJRT-owned shards
    (:meth:`~hloalias.runtime.sharding.Placement.put`), state is read from
    its slots, XLA runs, then the commit (:class:`_MeshCommit`) and the
    outputs follow as on one device.  A transaction as :func:`run_planned`
    is: once the program ran, any exception (``KeyboardInterrupt``
    included) completes the commit before it leaves.  Inputs were checked
    by ``__call__``."""
    placement = exe._placement
    arrays: list[jax.Array] = []
    bases: dict[int, torch.Tensor] = {}
    donors: dict[int, int] = {}
    for index, state_name in exe._arg_plan:
        if state_name is not None:
            array = exe._state_array(state_name)
            if index in exe._donated_args:
                if id(array) in donors:
                    raise ExecutionError(
                        f"module state '{state_name}' is the same buffer as "
                        f"'{exe._names[donors[id(array)]]}' (tied) and the program writes or "
                        "donates it; XLA cannot take one buffer twice as a donor"
                    )
                donors[id(array)] = index
            arrays.append(array)
            continue
        value = inputs[index]
        if isinstance(value, DeviceTensor):
            raise ExecutionError(
                f"input '{exe._names[index]}' is a DeviceTensor; a program on a mesh takes "
                "torch tensors and places them by its shardings"
            )
        tensor = _resolved(value)
        tensor = tensor if tensor.is_contiguous() else tensor.contiguous()
        bases[index] = tensor
        bits = exe._input_bits.get(index)
        arrays.append(placement.put(tensor if bits is None else tensor.detach().view(bits), index))
    # What the commit reads, taken before the run; ``ran`` gets the
    # results as the execute returns (from C: no point where Python runs
    # a Ctrl-C's handler lies between the two, SingleDeviceDispatch's
    # docstring), so an exception at any point after it (KeyboardInterrupt
    # included) finds them and commits before it leaves: the run's donated
    # state buffers are gone, the call's results are the only state.
    ran: list[Any] = []
    commit = _MeshCommit(exe, inputs, bases, arrays, ran)
    try:
        ran.extend(map(exe._loaded.execute_sharded, (arrays,)))
        del arrays  # the user inputs' shards go now
        arg_tensors = commit.run()  # counts the call, as settle() does
        return assemble_outputs(exe, inputs, arg_tensors, commit.produced())
    except BaseException as error:
        if not ran:  # the program did not run: nothing changed
            if isinstance(error, Exception):
                raise ExecutionError(f"XLA execution failed: {error}") from None
            raise
        commit.settle()
        raise


#: An execute's results -> their per-device arrays, per output (a C call).
_DISASSEMBLE = operator.methodcaller("disassemble_into_single_device_arrays")


class _MeshCommit:
    """The commit of one call on a mesh whose program ran: the outputs as
    global arrays, each state slot and written caller tensor given its new
    value, each consumed donor marked.  Idempotent (each argument is
    committed once however often :meth:`run` runs), so an exception that
    stopped it part way is completed by :meth:`settle`."""

    def __init__(
        self, exe: "Executable", inputs: dict[int, Any], bases: dict[int, torch.Tensor],
        arrays: list[jax.Array], ran: list[Any],
    ) -> None:
        self.exe = exe
        self.inputs = inputs
        self.bases = bases
        # The state arguments' pre-call arrays (the commit reads whether
        # XLA took them); not the user inputs' shards.
        self.kept = {index: arrays[index] for index, name in exe._arg_plan if name is not None}
        #: The execute's results (``ExecuteResults``), once it returned.
        self.ran = ran
        #: Their per-device arrays, taken from C as they are taken out:
        #: ``ExecuteResults`` gives them once, so a Ctrl-C right after must
        #: not lose them (:meth:`produced` runs again in :meth:`settle`).
        self.shards: list[Any] = []
        self.outputs: list[jax.Array] | None = None
        self.done: set[int] = set()
        self.arg_tensors: dict[int, Any] = {}
        #: Whether ``exe._calls`` counts this call (once, by the first
        #: :meth:`run`: an interrupt right after the program ran is
        #: completed by :meth:`settle`, which counts it then).
        self.counted = False

    def produced(self) -> dict[str, jax.Array]:
        """The program's results by key, as global arrays."""
        exe = self.exe
        if self.outputs is None:
            try:
                if not self.shards:
                    self.shards.extend(map(_DISASSEMBLE, self.ran))
                self.outputs = exe._placement.assemble_outputs(exe._loaded, self.shards[0], exe._result_shapes)
            except Exception as error:
                raise ExecutionError(f"XLA execution failed: {error}") from None
        return dict(zip(exe._result_keys, self.outputs))

    def run(self) -> dict[int, Any]:
        """Commit every argument not committed yet; returns the tensors
        rebuilt views of user inputs are views of."""
        exe = self.exe
        if not self.counted:
            # The two statements have no point between them where Python
            # runs a signal handler: counted exactly once.
            exe._calls += 1
            self.counted = True
        produced = self.produced()
        call_name = f"in call {exe._calls}"
        for index, state_name in exe._arg_plan:
            if index in self.done:
                continue
            mutation_key = exe._mutation_keys[index]
            new_value = produced.get(mutation_key) if mutation_key is not None else None
            if state_name is not None:
                slot = exe._slots[state_name]
                if new_value is not None:
                    slot.array = _committed_buffer(exe, state_name, self.kept[index], new_value)
                    slot.consumed_by = None
                elif index in exe._donated_args and self.kept[index].is_deleted():
                    slot.array = None
                    slot.consumed_by = call_name
            else:
                value = self.inputs[index]
                if new_value is None:
                    self.arg_tensors[index] = _view_base(value, self.bases[index])
                else:
                    _update_caller_tensor(exe, index, value, new_value, None, False)
                    # Views of the new value share the caller's tensor, as
                    # in eager; one with a lazy bit holds other values than
                    # its storage, so they view the new value.
                    view_base = _view_base(value, None)
                    self.arg_tensors[index] = view_base if view_base is not None else _caller_typed(new_value, value)
            self.done.add(index)
        return self.arg_tensors

    def settle(self) -> None:
        """Complete the commit after an exception; an error of its own is
        not raised over the one being handled."""
        try:
            self.run()
        except BaseException:  # noqa: BLE001 - the caller re-raises the first error
            pass
