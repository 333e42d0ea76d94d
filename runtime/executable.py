"""The runtime's façade: ``compile`` runs the whole pipeline and returns an
:class:`Executable` that behaves like calling the torch program eagerly.
A call binds and checks its inputs here, then goes, in order, through
:mod:`~hloalias.runtime.plan` (the frozen call plan, built once),
:mod:`~hloalias.runtime.execution` (import, dispatch, wait, commit) and
:mod:`~hloalias.runtime.assembly` (the outputs); state lives in
:mod:`~hloalias.runtime.state`, and torch memory meets PJRT buffers only
in :mod:`~hloalias.runtime.ownership`.  What every call guarantees:

- Results the ``eliminate-view-results`` pass removed come back as real
  torch views (``as_strided``) of their base: the input tensor, the module
  state or another result; no device memory and no copy.
- A program that computes nothing on one device (``@main`` returns no
  result, donates nothing, is empty: :func:`~hloalias.runtime.plan.computes_nothing`)
  is never run, so ``compile`` hands it to no XLA compile (``_loaded`` is
  None); its ``memory_stats`` are the figures XLA gives an empty ``@main``
  (its arguments' bytes).  The default CPU device is looked up when first
  needed (``pjrt.DeferredDevice``): such a program without module state
  does not start jax's backend at all.
- Module state (parameters, buffers, constants) lives on the device once
  per module: every executable compiled from the same ``nn.Module`` shares
  one device buffer per state tensor, and a tensor reachable under several
  names (tied weights) is one buffer.  A mutated buffer is aliased to its
  new value: XLA writes in place.  A returned view of state stays a live
  view of it across calls and ``load_state_dict``; while such a view is
  held PJRT cannot reuse the buffer, so XLA writes elsewhere and the runtime
  copies the new value back into it (counted in :attr:`Executable.host_copies`).
- A mutated user input is updated in place, as eager would.  A torch CPU
  tensor is memory PJRT does not own, so on its first call XLA writes the
  new value to a fresh buffer and the caller's tensor is moved onto it (no
  copy; only when nothing else views its storage); later calls donate that
  buffer and XLA writes in place.  Otherwise the new value is copied back
  each call (``host_copies``, named by ``explain()``).
- Results on CPU are runtime-owned buffers lent to torch without a DLPack
  export, so a result passed back as a mutated input (``exe(y)`` with
  ``y.add_(...)`` in the program) is updated in place.
- Donated inputs are consumed.  A :class:`DeviceTensor` that was donated
  raises :class:`DonatedBufferError` when used again.  A donated torch
  tensor is left untouched, wherever its memory came from (an earlier
  result included: ``hloalias.runtime.ownership``): XLA writes the result
  elsewhere; treat it as consumed.
- Every call is a transaction: once the program ran, any exception
  (``KeyboardInterrupt`` included) completes the commit before it leaves
  (:func:`hloalias.runtime.execution.settle`; on a mesh too), so module
  state is the call's and usable.
- Inputs must match the example inputs' shapes and dtypes; anything else is
  an :class:`ExecutionError` (compile again for another signature).  Calls
  bind like the eager function: positional or keyword, in any order.
- Non-contiguous user inputs are copied to the device row-major; a
  returned view of one is a view of the caller's tensor in its own strides
  (:mod:`hloalias.runtime.strided_views`).  Inputs with a lazy conjugate or
  negative bit are resolved first; views of them view the resolved copy.
- Two inputs that share memory where the program writes or donates either
  are refused before anything runs (eager would let one see the other's
  update mid-program; XLA cannot).
- An integer input whose values the program uses as indices
  (``hloalias.index_ranges``) holding a value out of the range eager
  accepts there is an :class:`IndexRangeError`, before anything runs
  (XLA would clamp or drop it; docs/precision.md).
- A call that fails leaves the module state and every caller tensor as they
  were.  Calls of executables that share module state are serialized.
- Single-device CPU calls of the common kind (see
  :func:`hloalias.runtime.lane._native_lane`) run
  in native code (``hloalias.runtime._lane``) with the same results and
  errors: a call it does not take runs here, in Python, before anything
  changed.  ``HLOALIAS_NATIVE=0`` (read when an executable is made) keeps
  every call in Python.
- A dropped executable is freed by reference counting: nothing it holds
  refers back to it strongly (the native call path reaches it through a
  weak proxy), so its host memory and the device buffers only it holds
  go at ``del``, not at the next cyclic GC."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn

import jax
import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode

from hloalias import attributes as A, config, observe
from hloalias.observe import traced_compile
from hloalias.errors import CompileError, DonatedBufferError, DonationError, ExecutionError, PipelineError, ShardingError, TorchImportError
from hloalias.lru import BoundedLRU
from hloalias.frontend.importer import Program, Stage
from hloalias.contract import DonationRequest, Signature, resolve_donations, row_major_strides, verification_scope, verify
from hloalias.mlir import CONTEXT_POOL, find_main, leasing_context, print_module
from hloalias.passes.alias_donated_buffers import AliasDonatedBuffers, AliasReport
from hloalias.passes.eliminate_view_results import EliminateViewResults, ViewReport
from hloalias.pipeline import (
    CPU_PIPELINE,
    DEFAULT_PIPELINE,
    for_spmd,
    module_cache_key,
    parse_pipeline,
    run_pipeline,
    with_fixed_dtypes,
    with_fixed_layouts,
)
from hloalias.runtime import program_cache
from hloalias.runtime.export_cache import import_cached
from hloalias.runtime.shape_family import import_program
from hloalias.runtime.stages import pass_lines, run_passes
from hloalias.runtime.sharding import Mesh, Placement, plan_shardings, result_shardings
from hloalias.runtime.distributed import check_same_program
from hloalias.runtime.assembly import input_views
from hloalias.runtime.execution import run_mesh, run_planned
from hloalias.runtime.module_hooks import ModuleHooks
from hloalias.runtime.module_modes import ModuleModes
from hloalias.runtime.running_stats import watch_running_stats
from hloalias.runtime.carried_objects import callers_objects, carry_objects
from hloalias.runtime.gradient_boundary import mark_without_gradient
from hloalias.runtime.lane import (
    _LANE_FALLBACK, _native_lane, native_first_changed, native_first_differing, native_values_in_range,
)
from hloalias.runtime.ownership import (
    DeviceTensor as DeviceTensor,
    _itemsize,
    _numel,
    _share_memory,
    _tensor_for_device,
    _writable_on_host,
    array_to_torch,
    host_copy,
    to_device as to_device,
    torch_to_device,
)
from hloalias.runtime.pjrt import (
    DeferredDevice, MemoryStats, compile_module, device_key, memory_stats, precision_options, real_device,
    requested_device,
)
from hloalias.runtime.plan import (
    _CallConvention, _CallPlan, _describe_spec, _IndexCheck, _ProgramFacts, check_index_ranges, computes_nothing,
)
from hloalias.runtime.state import (
    _AGREEMENTS, _ATTACHMENT_EDITS, _REMOVED, _RUNTIME_READ, StateWatch, traced_as_plain, _form_text, _state_group, _StateGroup, _StateSlot, refresh_stale,
    module_tensors,
    refuse_inference_state,
)

try:  # the native call path (tests read whether it is built here)
    from hloalias.runtime import _lane
except ImportError:
    _lane = None  # type: ignore[assignment]


@dataclasses.dataclass
class CacheStats:
    """Executable cache counters (process-wide)."""

    hits: int = 0
    misses: int = 0
    #: Entries dropped because the cache was full (least recently used first).
    evictions: int = 0


#: How many loaded XLA executables the in-process cache keeps (least
#: recently used dropped first; ``HLOALIAS_EXECUTABLE_CACHE_SIZE``, read at
#: import, sets another; 0 keeps none).  An evicted program stays loaded
#: while an ``Executable`` holds it; compiling it again reads the disk cache.
_CONFIGURED_CACHE_SIZE = config.integer("HLOALIAS_EXECUTABLE_CACHE_SIZE")
EXECUTABLE_CACHE_SIZE = 64 if _CONFIGURED_CACHE_SIZE is None else _CONFIGURED_CACHE_SIZE

_CACHE_STATS = CacheStats()
#: Keyed by (module key, devices, excess_precision); the bound is read at
#: each put (a test sets EXECUTABLE_CACHE_SIZE).
_CACHE: BoundedLRU[tuple[str, str, bool], Any] = BoundedLRU(lambda: EXECUTABLE_CACHE_SIZE, stats=_CACHE_STATS)
_CACHE_LOCK = threading.Lock()


def _cache_get(slot: tuple[str, str, bool]) -> Any:
    """The cached executable of ``slot`` (now the most recently used), or
    None; a miss is counted by the put of the compile that follows."""
    with _CACHE_LOCK:
        return _CACHE.get(slot, miss=False)


def _cache_put(slot: tuple[str, str, bool], loaded: Any) -> None:
    """Keep ``loaded`` under ``slot``, dropping the least recently used
    entries beyond :data:`EXECUTABLE_CACHE_SIZE`."""
    with _CACHE_LOCK:
        _CACHE_STATS.misses += 1
        _CACHE.put(slot, loaded)


def cache_stats() -> CacheStats:
    """The process-wide executable cache counters (live object)."""
    return _CACHE_STATS


def clear_cache() -> None:
    """Drop every cached XLA executable and reset the counters."""
    with _CACHE_LOCK:
        _CACHE.clear()


@traced_compile
@leasing_context  # one pooled MLIR context for the import, passes and XLA input (hloalias/mlir.py)
@verification_scope()  # the contract of a signature seen in this compile is not read again
def compile(  # noqa: A001 - the name users expect
    f: torch.nn.Module | Callable[..., Any] | ExportedProgram,
    example_args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    donate: Sequence[int | str] = (),
    donate_argnums: Sequence[int] = (),
    donate_argnames: Sequence[str] = (),
    donate_state: Sequence[str] = (),
    pipeline: str | None = None,
    device: Any = None,
    mesh: Mesh | None = None,
    shardings: dict[str | int, Any] | None = None,
    dump_dir: str | os.PathLike[str] | None = None,
    excess_precision: bool = False,
    _state_owner: Any = None,
    _state_sources: dict[str, torch.Tensor] | None = None,
) -> "Executable":
    """Import ``f`` on the example inputs, run the pass pipeline, compile it
    with XLA through PJRT and return an :class:`Executable`.

    ``example_args`` is a tuple or list of the positional inputs (a single
    tensor is refused: write ``(x,)``); ``kwargs`` a dict of keyword inputs.

    What to donate, as JAX separates ``donate_argnums``/``donate_argnames``:
    ``donate_argnums`` names user inputs by flattened position,
    ``donate_argnames`` user inputs by argument name, ``donate_state``
    parameters/buffers by fully qualified name.  ``donate`` takes positions
    and names of either kind; a name that is both a user input and module
    state there is a :class:`DonationError` listing both.  Each tensor may
    be donated once.  ``pipeline`` is a textual pipeline (default
    :data:`hloalias.pipeline.DEFAULT_PIPELINE`); ``device`` is a platform name
    or a jax device (default: the first CPU device).  XLA executables are
    cached by the final module's key, so equivalent configurations share
    one compile, in this process and across processes (the disk cache,
    :mod:`hloalias.runtime.disk_cache`); importing the same program object
    on inputs of the same shapes, dtypes and static values again reuses the
    import (:mod:`hloalias.runtime.export_cache`).  Module state is shared
    by every executable compiled from the same module.

    ``mesh`` (an :class:`~hloalias.runtime.sharding.Mesh`) runs the program
    on several devices with XLA's SPMD partitioner; ``shardings`` maps state
    names (FQNs), user-input names or positions to partition specs over the
    mesh's axes (one entry per dimension: axis name, tuple of names, or None;
    unnamed tensors are replicated).  Errors in either are
    :class:`ShardingError`, raised before anything is compiled.

    Each stage's duration is logged (``logging.getLogger("hloalias")``, INFO);
    ``dump_dir`` (default ``$HLOALIAS_DUMP_DIR``) receives each stage's IR
    (:mod:`hloalias.observe`).

    ``excess_precision``: False (the default) rounds every bf16/f16
    intermediate to its dtype as eager does (XLA's
    ``xla_allow_excess_precision=false``); True lets XLA keep fused
    intermediates in f32, faster and closer to the exact value but not
    eager's result (docs/precision.md).

    The program is traced under the default dtype of this call
    (``torch.get_default_dtype()``: a dtype-less ``torch.ones(3)``, an
    integer division) and keeps it: called under another default dtype it
    runs as compiled, with no warning, as jax's ahead-of-time
    ``jax.jit(f).lower(x).compile()`` keeps its ``jax_enable_x64``
    (``Executable.default_dtype``, ``explain()``; docs/runtime.md, "The
    default dtype").  :func:`hloalias.jit` compiles again instead.

    (Private: ``_state_owner`` is the object whose state group the program
    shares instead of ``f``'s, and ``_state_sources`` the tensors its state
    names stand for there: a training step's ``param.<fqn>`` is the
    model's parameter, so it shares its device buffer with every
    executable of the model, :mod:`hloalias.runtime.training`.)"""
    _check_mesh_arguments(mesh, shardings)
    default_dtype = torch.get_default_dtype()  # the trace's (docstring)
    if torch.is_autocast_enabled("cpu"):
        raise CompileError(_AUTOCAST.format(dtype=torch.get_autocast_dtype("cpu")) + "compile outside it")
    #: Each module's tensors by dotted name, walked once: the inference
    #: check here, the executable's attribute names (``_module_attachments``).
    walked: dict[int, tuple[tuple[str, torch.Tensor], ...]] = {}
    for holder in (f, _state_owner):
        if isinstance(holder, torch.nn.Module):
            walked[id(holder)] = refuse_inference_state(holder, CompileError)
            # Tracing, keys and new slots read the module's own tensors:
            # what calls left on the device first (stale tensors, state.py).
            refresh_stale([*holder.parameters(), *holder.buffers()], "hloalias.compile")
    if _state_sources:
        refresh_stale(list(_state_sources.values()), "hloalias.compile")
    example_args, kwargs = _checked_compile_arguments(example_args, kwargs, pipeline)
    modes_before_trace = ModuleModes.of(f if _state_owner is None else _state_owner)
    requests = _donation_requests(donate, donate_argnums, donate_argnames, donate_state)
    # The default CPU device is looked up only when something needs it: a
    # program that computes nothing (below) never starts jax's backend.
    target = requested_device(mesh.platform if mesh is not None else device)
    # A program compiled before (any process) comes from the disk cache
    # before any import (runtime/program_cache.py); single-device programs
    # of the caller's own state only (a training step's shares a model's).
    options_key = (tuple((r.kind, r.target) for r in requests), pipeline, *device_key(target))
    use_program_cache = mesh is None and _state_owner is None
    cached = program_cache.lookup(f, example_args, kwargs, options_key) if use_program_cache else None
    owner = f if _state_owner is None else _state_owner
    found = cached.found if cached is not None else None
    if found is not None:  # usable when this process would run the same pipeline
        found = program_cache.usable(found, _pipeline_for(pipeline, found.program, _state_group(owner), target, False))
    placement: Placement | None = None
    if found is not None:
        program, group, final_text = found.program, _state_group(owner), found.final_text
        pipeline_text = found.pipeline_text
        pass_report: tuple[str, ...] = (f"passes: from the program cache ({pipeline_text})",)
    else:
        with _refusing_training_steps():
            # The family key reuses the program-cache key's printing of f:
            # both are taken before the import, with no code run between.
            printed = cached.program_print if cached is not None else None
            with traced_as_plain():
                program = import_cached(
                    f, example_args, kwargs, lambda: import_program(f, example_args, kwargs, printed)
                )
        if _state_sources:
            # A new dict: the import cache may share the program's.
            program.state = {name: _state_sources.get(name, value) for name, value in program.state.items()}
        placement = plan_shardings(program, mesh, shardings, target) if mesh is not None else None
        donated = _resolve_donations(program, requests)
        _mark_donors(program, donated)
        # State on a mesh is placed by this program's shardings: its own
        # group, whose hooks on the module (a plain program's: a training
        # step's has its own, runtime/training.py) copy what its calls left
        # in before eager code reads it, as the module's group does.
        group = _state_group(owner) if mesh is None else _StateGroup(
            f if isinstance(f, torch.nn.Module) and _state_owner is None else None
        )
        pipeline_text = _pipeline_for(pipeline, program, group, target, mesh is not None)
        observe.dump("stablehlo", lambda: print_module(program.torch_mlir_module))
        runs = run_passes(program.torch_mlir_module, pipeline_text, run_pipeline)
        pass_report = pass_lines(runs)
        # The contract of the module XLA gets, checked once: a violation is an
        # IRError now, not a KeyError in some later call.
        with program.torch_mlir_module.context:
            verify(find_main(program.torch_mlir_module))
        final_text = print_module(program.torch_mlir_module)
        if cached is not None and cached.key is not None:
            program_cache.store(cached.key, f, program, pipeline_text, final_text)
    observe.dump("final", final_text)
    lease = CONTEXT_POOL.current()
    if lease is not None and program.torch_mlir_module.context is lease.context:
        lease.charge(len(final_text))
        if "dense_resource<" in final_text:
            # Resource blobs stay in the context (their bytes), and a later
            # import's blob of the same name would be renamed there, so its
            # text would differ from a new context's: no reuse after one.
            lease.retire()
    key = module_cache_key(final_text)
    facts = _ProgramFacts.read(program)
    # Nothing to compute: no results, nothing donated, an empty @main, one
    # device.  No call would run it (_CallPlan.executes), so XLA does not
    # compile it, and XLA's memory figures for it are the arguments' bytes.
    view_only = mesh is None and computes_nothing(program, facts)
    if not view_only or program.state:
        target = real_device(target)  # state is uploaded to the device
    if placement is None:
        placement = Placement(target)
    if placement.spmd:  # every process of a multi-process mesh runs this program
        check_same_program(key, placement.devices)
    loaded: Any = None
    hit = False
    if not view_only:
        cache_slot = (key, ",".join(f"{d.platform}:{d.id}" for d in placement.devices), excess_precision)
        loaded = _cache_get(cache_slot)
        hit = loaded is not None
        if not hit:
            options = None
            if placement.spmd:
                sharded = result_shardings(program.torch_mlir_module)
                options = placement.compile_options(sharded)
            options = precision_options(options, excess_precision)
            # The runtime stores permuted state as the module says: its own convention.
            with observe.stage("XLA compile"):
                loaded = compile_module(
                    final_text, target, options=options, devices=placement.devices, allow_stored_state=True,
                    rewrite=placement.for_xla if placement.spmd else None, context=program.torch_mlir_module.context,
                    module=program.torch_mlir_module,  # final_text's module: cloned, not parsed again
                )
            _cache_put(cache_slot, loaded)
    # Reports of the final module (all runs of each pass together), not
    # of the last run; None when the pipeline did not run the pass.
    ran = _passes_in(pipeline_text)
    module = program.torch_mlir_module
    exe = Executable(
        program, loaded, target, key, final_text,
        ViewReport.from_module(module) if EliminateViewResults.name in ran else None,
        AliasReport.from_module(module) if AliasDonatedBuffers.name in ran else None,
        cache_hit=hit,
        convention=_CallConvention.of(f, example_args, kwargs),
        state_group=group,
        placement=placement,
        facts=facts,
        owner_tensors=walked.get(id(group.owner())) if group.owner is not None else None,
    )
    exe._pass_lines = pass_report
    modes = ModuleModes.of(owner)
    exe._modes = modes.without_written(modes_before_trace) if modes is not None else None
    exe._hooks = ModuleHooks.of(owner)
    # A training step's program runs inside TrainingStep (its state is the
    # model's, and its loss is what the step returns): not checked.
    exe._gradient_checked = _state_owner is None
    exe._program_name = _program_name(f)
    exe.program_cache = program_cache.status_line(cached, found)
    exe.default_dtype = default_dtype
    return exe


def _program_name(f: Any) -> str:
    if isinstance(f, torch.nn.Module):
        return type(f).__name__
    if isinstance(f, ExportedProgram):
        return "(an ExportedProgram)"
    return getattr(f, "__qualname__", None) or type(f).__name__


class _TrainingInForward(TorchFunctionMode):
    """Refuses ``backward()`` and ``torch.autograd.grad`` while ``compile``
    exports a program: an inference compile would drop them (and an
    ``optimizer.step()`` after them) and be silently wrong."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _AUTOGRAD_ENTRIES:
            _refuse_training("calls backward()" if func is not torch.autograd.grad else "calls torch.autograd.grad")
        return func(*args, **(kwargs or {}))


_AUTOGRAD_ENTRIES = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)
_EXPORTING = threading.local()


def _refuse_training(what: str) -> NoReturn:
    raise TorchImportError(
        f"the program {what}: hloalias.compile compiles a forward (inference) program, whose "
        "gradients and optimizer updates it would drop; capture a training step with "
        "hloalias.compile_training_step(step_fn, model, optimizer, example_batch)"
    )


def _optimizer_step_while_exporting(optimizer: Any, args: Any, kwargs: Any) -> None:
    """torch's global optimizer pre-step hook: refuses a step taken while
    this thread's ``compile`` exports a program (see _TrainingInForward)."""
    if getattr(_EXPORTING, "active", False):
        _refuse_training(f"calls {type(optimizer).__name__}.step()")


register_optimizer_step_pre_hook(_optimizer_step_while_exporting)


@contextlib.contextmanager
def _refusing_training_steps() -> Iterator[None]:
    """While ``compile`` exports: a training step in the program is a
    TorchImportError naming compile_training_step (issue 24, item 5)."""
    _EXPORTING.active = True
    try:
        with _TrainingInForward():
            yield
    finally:
        _EXPORTING.active = False


def _pipeline_for(pipeline: str | None, program: Program, group: _StateGroup, target: Any, spmd: bool) -> str:
    """The pipeline ``compile`` runs: the given one, else the default (with
    ``permute-conv-kernel-state`` for a single-device CPU program: its state
    lives on the device in the layout the program reads).  State that already
    has a device buffer in ``group`` is read in the layout it is stored in."""
    if pipeline is None:
        pipeline = CPU_PIPELINE if target.platform == "cpu" and not spmd else DEFAULT_PIPELINE
    if spmd:
        pipeline = for_spmd(pipeline)
    pipeline = with_fixed_layouts(pipeline, group.fixed_layouts(program.state, target))
    return with_fixed_dtypes(pipeline, group.fixed_dtypes(program.state, target))


def _passes_in(pipeline: str) -> set[str]:
    return {element.name for element in parse_pipeline(pipeline)}


#: Why an ambient ``torch.autocast`` is refused (compile and call): eager
#: runs every op under it in the lower dtype, a compiled program computes
#: as it was compiled, whatever the caller's autocast.
_AUTOCAST = (
    "torch.autocast('cpu') is on: a compiled program does not follow an autocast around its call (eager "
    "would compute in {dtype}); put `with torch.autocast(...)` inside forward, which is compiled as written, and "
)
_any_autocast = torch._C._is_any_autocast_enabled


def _checked_compile_arguments(
    example_args: Any, kwargs: Any, pipeline: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``compile``'s example inputs as a tuple and a dict, or TorchImportError
    naming the malformed argument (nothing is guessed: a single tensor is
    not split into rows)."""
    if isinstance(example_args, torch.Tensor):
        raise TorchImportError(
            "compile: example_args is a single tensor; pass a tuple or list of the inputs, "
            "e.g. example_args=(x,)"
        )
    if not isinstance(example_args, (tuple, list)):
        raise TorchImportError(
            f"compile: example_args is {type(example_args).__name__}; pass a tuple or list of the inputs"
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise TorchImportError(
            f"compile: kwargs is {type(kwargs).__name__}; pass a dict from argument name to input"
        )
    if pipeline is not None and not isinstance(pipeline, str):
        raise PipelineError(f"compile: pipeline is {type(pipeline).__name__}; pass the textual pipeline as a str")
    return _apart(tuple(example_args), dict(kwargs))


def _apart(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The example inputs with every tensor that shares a storage with an
    earlier one replaced by a copy of the same sizes and strides.
    ``torch.export`` cannot trace inputs that overlap (a raw error from
    deep inside torch), and the program does not depend on it: whether a
    call's inputs overlap is checked at each call (read-only overlap runs,
    a written one is refused, naming both)."""
    # Strided tensors only: a sparse one has no storage to compare (and is
    # refused by name later, at the import).
    tensors = [
        leaf for leaf in pytree.tree_leaves((args, kwargs))
        if isinstance(leaf, torch.Tensor) and leaf.layout is torch.strided
    ]
    if len({StorageWeakRef(tensor.untyped_storage()) for tensor in tensors}) == len(tensors):
        return args, kwargs  # the usual case: the caller's objects, unrebuilt
    seen: set[StorageWeakRef] = set()

    def apart(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.layout is not torch.strided:
            return value
        storage = StorageWeakRef(value.untyped_storage())
        if storage not in seen:
            seen.add(storage)
            return value
        copy = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=value.device)
        with torch.no_grad():
            copy.copy_(value)
        return copy.requires_grad_(value.requires_grad) if value.is_leaf else copy

    separated: tuple[tuple[Any, ...], dict[str, Any]] = pytree.tree_map(apart, (args, kwargs))
    return separated


def _donation_requests(
    donate: Any, argnums: Any, argnames: Any, state: Any
) -> list[DonationRequest]:
    """``compile``'s donation arguments as the contract's requests
    (:class:`hloalias.contract.DonationRequest`), or DonationError naming a
    malformed one."""
    requests: list[DonationRequest] = []
    for option, kind, allowed, value in (
        ("donate", "any", (int, str), donate), ("donate_argnums", "input_position", (int,), argnums),
        ("donate_argnames", "input", (str,), argnames), ("donate_state", "state", (str,), state),
    ):
        if isinstance(value, (str, int)) or not isinstance(value, (tuple, list)):
            raise DonationError(
                f"{option} must be a list or tuple, got {type(value).__name__} {value!r}"
                + (f"; write {option}=[{value!r}]" if isinstance(value, (str, int)) else "")
            )
        for entry in value:
            if isinstance(entry, bool) or not isinstance(entry, allowed):
                what = {"any": "positions or names", "input_position": "positions"}.get(kind, "names")
                raise DonationError(f"{option} entries are {what}, got {entry!r}")
            requests.append(DonationRequest(kind, entry))
    return requests


def _check_mesh_arguments(mesh: Any, shardings: Any) -> None:
    """Bad ``mesh``/``shardings`` arguments: ShardingError before any work."""
    if shardings is not None and mesh is None:
        raise ShardingError("shardings were given without a mesh: pass mesh=hloalias.Mesh(...)")
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ShardingError(f"mesh must be an hloalias.Mesh, got {type(mesh).__name__}")
    if shardings is not None and not isinstance(shardings, dict):
        raise ShardingError(f"shardings must be a dict of name -> partition spec, got {type(shardings).__name__}")
    if mesh is not None:
        mesh.devices()  # a mesh larger than the platform fails before the import


def _resolve_donations(program: Program, requests: list[DonationRequest]) -> list[int]:
    """The ``@main`` arguments ``requests`` donate (the contract's one
    reading of a donation request: :func:`hloalias.contract.resolve_donations`)."""
    arguments = program.signature.arguments
    return resolve_donations([a.kind for a in arguments], [a.name for a in arguments], requests)


def _mark_donors(program: Program, donated: list[int]) -> None:
    if not donated:
        return
    module = program.torch_mlir_module
    with module.context:
        main = find_main(module)
        contract = Signature.read(main)
        args = tuple(
            dataclasses.replace(arg, buffer_donor=True) if index in donated else arg
            for index, arg in enumerate(contract.args)
        )
        dataclasses.replace(contract, args=args).write(main)


def _refusing_host_reads(executable: "weakref.ref[Executable]") -> Callable[[str], None]:
    """How a read of module state that calls of a program on a mesh across
    processes left on the devices is served (``_StateGroup.before_read``):
    refused.  The copy in is a gather every process must enter, which the
    hook of one process's read (``module.buf * 1``, ``state_dict()``, an
    eager forward) cannot promise; a silent read would see the values from
    before the calls."""

    def refuse(what: str) -> None:
        found = executable()
        name = found._program_name if found is not None else Executable._program_name
        raise ExecutionError(
            f"{what} after calls of the program compiled from {name} on a mesh across processes would read "
            "the state from before them: call write_back() of the compiled program in every process first"
        )

    return refuse


@dataclasses.dataclass(frozen=True)
class HostCopy:
    """A host-side copy the runtime makes on a call, and why."""

    name: str
    nbytes: int
    reason: str


class Executable:
    """A compiled torch program.  Call it like the original function."""

    #: ``explain()``'s line for each pass that ran (:mod:`hloalias.runtime.stages`).
    _pass_lines: tuple[str, ...] = ()
    #: Whether results in grad mode say they carry no gradient (not for a
    #: training step's program, whose loss TrainingStep returns), and what
    #: the program is called in errors (set by ``compile``;
    #: :mod:`hloalias.runtime.gradient_boundary`).
    _gradient_checked = False
    _program_name = "(a StableHLO program)"

    def __new__(cls, program: Program, *args: Any, **kwargs: Any) -> "Executable":
        # A program that returns input objects as themselves (a transformers
        # Cache) is a _CarryingExecutable, whose __call__ updates the
        # caller's objects; every other call runs __call__ below with no
        # extra frame (the Python path's per-call cost).
        # One of a module with floating parameters, or with a floating
        # input a result depends on, is a _GradientCheckedExecutable: in
        # grad mode, while one of them requires grad, its results say that
        # they carry no gradient (runtime/gradient_boundary.py).
        if cls is Executable:
            if program.signature.carried_objects:
                cls = _CarryingExecutable
            elif program.signature.input_gradient_outputs or any(
                isinstance(value, torch.nn.Parameter) and (value.is_floating_point() or value.is_complex())
                for value in program.state.values()
            ):
                cls = _GradientCheckedExecutable
        return super().__new__(cls)

    def __init__(
        self,
        program: Program,
        loaded: Any,
        device: Any,
        cache_key: str,
        mlir: str,
        view_report: ViewReport | None,
        alias_report: AliasReport | None,
        *,
        cache_hit: bool,
        convention: _CallConvention | None = None,
        state_group: _StateGroup | None = None,
        placement: Placement | None = None,
        facts: _ProgramFacts | None = None,
        owner_tensors: tuple[tuple[str, torch.Tensor], ...] | None = None,
    ) -> None:
        """(``owner_tensors``: the state group's owner module's tensors as
        :func:`~hloalias.runtime.state.module_tensors` walked them for this
        compile, else None: walked here.)"""
        assert program.stage is Stage.STABLEHLO
        self._placement = placement if placement is not None else Placement(device)
        self._signature = program.signature
        #: The loaded XLA executable; None for a program that computes
        #: nothing (``computes_nothing``): never run, so never compiled.
        self._loaded = loaded
        #: The device, or a ``DeferredDevice`` not looked up yet (see :attr:`device`).
        self._device = device
        self.cache_key = cache_key
        self.mlir = mlir
        self.cache_hit = cache_hit
        self.view_report = view_report
        self.alias_report = alias_report
        #: How the program cache served this compile (runtime/program_cache.py).
        self.program_cache = "program cache: not consulted"
        #: ``torch.get_default_dtype()`` of the compile that traced the
        #: program (or found it in a cache keyed by it; set by ``compile``):
        #: a call under another runs the program as it is (docs/runtime.md,
        #: "The default dtype").  None: not traced from torch
        #: (``compile_stablehlo``).
        self.default_dtype: torch.dtype | None = None
        self._calls = 0
        #: The train/eval flags the program was compiled under (set by
        #: ``compile``), checked at every call; None: no module to check.
        self._modes: ModuleModes | None = None
        self._hooks: ModuleHooks | None = None
        #: Input objects returned as themselves (frontend/carried_objects.py):
        #: then this is a :class:`_CarryingExecutable` (see ``__new__``).
        self._carried = program.signature.carried_objects
        #: Inputs read through ``as_strided``, whose layout every call checks.
        self._strided_inputs = self._signature.strided_inputs
        self._read_final_module(program, facts)
        self._convention = convention or _CallConvention(
            None,
            tuple((self._names[i], None) for i in self._user_indices[:self._caller_inputs]),
            (),
        )
        #: The number of positional tensors a call may pass as they are
        #: (a flat signature without keywords); -1 when there is none.
        self._positional_arity = (
            self._caller_inputs if self._flat_inputs and not self._convention.keywords else -1
        )
        self._group = state_group or _StateGroup()
        if self._placement.multiprocess and self._group.before_read is None:
            self._group.before_read = _refusing_host_reads(weakref.ref(self))
        state_index = {a.name: a.index for a in program.signature.arguments}
        self._slots: dict[str, _StateSlot] = {
            name: self._group.slot(
                value, device, self._state_put(state_index[name]), self._stored_layouts.get(name),
                needs_torch_layout=name in self._torch_layout_state,
                bits=self._stored_bits.get(name), needs_torch_dtype=name in self._torch_dtype_state, name=name,
            )
            for name, value in program.state.items()
        }
        watch_running_stats(self._slots, self._signature.batch_norm_state)
        #: Each state slot once (tied names share one), checked at every call
        #: for changes torch made to the module's tensor (``_sync_from_torch``).
        watched: dict[int, tuple[str, _StateSlot]] = {}
        for name, slot in self._slots.items():
            watched.setdefault(id(slot), (name, slot))
        self._watched: tuple[tuple[str, _StateSlot], ...] = tuple(watched.values())
        #: Each slot's count of replaced attributes when this program last
        #: checked it (``_check_follow``); why it may never follow one (a
        #: training step: set by compile_training_step), else None.
        self._replacements: dict[int, int] = {id(slot): slot.replacements for _, slot in self._watched}
        #: The state that required grad when compiled: the outputs the
        #: signature's ``parameter_free_outputs`` leaves out are free of
        #: these, not of a parameter unfrozen since.
        self._trainable_when_compiled = frozenset(
            id(slot) for _, slot in self._watched if (tensor := slot.source()) is not None and tensor.requires_grad
        )
        #: Closed-over tensors (lifted constants) a result depends on, with
        #: those results' positions (:mod:`hloalias.runtime.gradient_boundary`).
        self._closed_over_reach: tuple[tuple[_StateSlot, frozenset[int]], ...] = tuple(
            (self._slots[name], reached)
            for name, reached in self._signature.constant_gradient_outputs.items() if name in self._slots
        )
        #: Slots that may follow no replaced tensor, by id: why (a training
        #: step's parameters, which its optimizer holds: set by
        #: compile_training_step).
        self._refused_replacements: dict[int, str] = {}
        watched_slots = tuple(slot for _, slot in self._watched)
        self._state_watch = StateWatch(
            watched_slots, native_first_changed(), self._group, on_mesh=self._placement.spmd,
            first_differing=native_first_differing(),
        )
        #: The watched slots that stand for an attribute of the owner module,
        #: by its dotted name there, looked up again where no registration
        #: hook re-points them (``_follow_attachments``).
        self._attached = self._module_attachments(owner_tensors)
        #: Each attached slot's attribute name, which errors name.
        self._attached_names = {id(slot): name for name, slot in self._attached}
        if self._attached:
            self._follow_attachments()
        written_state = [
            (name, slot) for name, slot in self._watched
            if self._mutation_keys[self._names.index(self._signature.state_aliases.get(name, name))] is not None
        ]
        self._group.note_written([slot for _, slot in written_state])
        #: The state a caller's input must not share memory with (see
        #: ``_check_state_aliases``), by name: what the program writes.
        self._written_state: tuple[tuple[str, _StateSlot], ...] = tuple(written_state)
        #: ``_AGREEMENTS`` and the storages (address -> state name, written)
        #: ``_check_state_aliases`` last looked at.
        self._state_storages: tuple[int, dict[int, tuple[str, bool]]] = (-1, {})
        # A tensor reachable under several names (tied weights) is one
        # buffer: XLA counts each argument, the device holds it once.
        seen: set[int] = set()
        self.tied_state: dict[str, str] = {}
        first_name: dict[int, str] = {}
        duplicate_bytes = 0
        for name, slot in self._slots.items():
            if id(slot) in seen:
                self.tied_state[name] = first_name[id(slot)]
                duplicate_bytes += slot.nbytes
            else:
                seen.add(id(slot))
                first_name[id(slot)] = name
        stats = (memory_stats(loaded) if loaded is not None else self._stated_memory_stats()).as_dict()
        devices = self._placement.devices
        # On a mesh XLA reports one partition's figures; every device holds
        # the same.  Per device: this process's devices (runtime/distributed.py),
        # named when first read (a deferred device is looked up then).
        self._device_stats = dict(stats)
        self._stats_per_device: dict[str, dict[str, int]] | None = None
        stats = {name: value * len(devices) for name, value in stats.items()}
        stats["argument_bytes"] -= duplicate_bytes
        stats["total_bytes"] -= duplicate_bytes
        self.memory_stats = stats
        # Tied weights merged at import are one argument (XLA counts them
        # once): every name of the module's state_dict reaches their slot.
        for alias, canonical in self._signature.state_aliases.items():
            if canonical in self._slots:
                self._slots[alias] = self._slots[canonical]
                self.tied_state[alias] = canonical
        #: Host copies made by calls so far: name -> count (see ``explain()``).
        self.host_copies: dict[str, int] = {}
        self._statics: dict[int, Any] = dict(getattr(self._signature, "static_inputs", {}) or {})
        # Mutated inputs aliased to their own new value: a torch tensor
        # backed by a runtime-owned buffer is updated in place for them.
        self._self_aliased: set[int] = {
            index for index, result in self._aliases.items()
            if result is not None and self._result_keys[result] == A.mutation_key(index)
            and index in self._user_indices
        }
        self._writes = {
            index for index in self._user_indices
            if self._mutation_keys[index] is not None or index in self._donated_args
        }
        # Read by every call (hot): each user input's expected type, the
        # inputs written in place (eager's refusals apply to them), and the
        # pairs of inputs that must not share memory (either is written).
        self._input_types: tuple[tuple[int, torch.Size, torch.dtype], ...] = tuple(
            (index, torch.Size(self._arg_types[index][0]), self._arg_types[index][1])
            for index in self._user_indices
        )
        #: Each user input's size in bytes (its checked shape and dtype).
        self._input_nbytes: dict[int, int] = {
            index: _numel(shape) * _itemsize(dtype) for index, shape, dtype in self._input_types
        }
        self._written_in_place: tuple[int, ...] = tuple(
            index for index in self._user_indices
            if index in self._writes and self._mutation_keys[index] is not None
        )
        # The caller's inputs only: the random key (the last user input) is
        # a buffer of its own, never one a caller's tensor shares.
        callers = self._user_indices[: self._caller_inputs]
        self._write_pairs: tuple[tuple[int, int], ...] = tuple(
            (first, second)
            for position, first in enumerate(callers)
            for second in callers[position + 1:]
            if first in self._writes or second in self._writes
        )
        #: Whether a call checks its inputs against the module state's
        #: memory: the program writes an input in place or some state.
        self._checks_state_aliases = bool(self._watched) and bool(self._written_in_place or self._written_state)
        self._plan = _CallPlan(self) if not self._placement.spmd else None
        #: The check that torch did not change the module's tensors
        #: (``_state_watch``) runs while the program executes, not before:
        #: for a program with no effect (nothing donated or written, no state
        #: copied into its form: ``_CallPlan.effect_free``), whose
        #: run on stale state is dropped and run again (``execution.run_planned``,
        #: the native lane).  The check's time then overlaps XLA's, and
        #: PJRT's worker is not left idle for it between two calls.
        self._watch_late = bool(self._watched) and self._plan is not None and self._plan.effect_free
        #: Zero-copy imports of read-only torch inputs, reused while the same
        #: tensor object covers the same memory (see :func:`execution.import_input`).
        self._imports: dict[int, tuple[weakref.ref[torch.Tensor], int, jax.Array]] = {}
        #: The native call path for calls the plan's common kind covers
        #: (:func:`~hloalias.runtime.lane._native_lane`), or None: every call takes the Python path
        #: (``_python_only_reason`` says why).
        #: Where a call's random key goes (:func:`draw_rng_key`): this
        #: device, or None when the program has no random ops.
        self._key_sharding: jax.sharding.Sharding | None = (
            None if self._rng_key is None else jax.sharding.SingleDeviceSharding(self.device)
        )
        self._lane, self._python_only_reason = _native_lane(self, self._plan)

    @property
    def device(self) -> Any:
        """The jax device the program runs on (the default CPU device is
        looked up on first use: a program that computes nothing may not
        have started jax's backend)."""
        device = self._device
        if isinstance(device, DeferredDevice):
            device = self._device = device.resolve()
        return device

    @property
    def memory_stats_per_device(self) -> dict[str, dict[str, int]]:
        """XLA's figures per device this process drives (``platform:id``)."""
        if self._stats_per_device is None:
            self._stats_per_device = {
                f"{d.platform}:{d.id}": dict(self._device_stats) for d in self._placement.local_devices
            }
        return self._stats_per_device

    def _stated_memory_stats(self) -> MemoryStats:
        """XLA's figures for a program that computes nothing, stated
        without compiling it: an empty ``@main`` has no output, alias or
        temporary bytes, and its arguments are every ``@main`` argument's
        bytes (as XLA counts them: each argument once, ``i1`` one byte)."""
        return MemoryStats(sum(_numel(shape) * _itemsize(dtype) for shape, dtype in self._arg_types), 0, 0, 0)

    # -- final module facts ------------------------------------------------
    def _read_final_module(self, program: Program, facts: _ProgramFacts | None = None) -> None:
        """The program's facts (:class:`~hloalias.runtime.plan._ProgramFacts`,
        read by the plan from the final module's contract, unless ``compile``
        read them already), as the attributes every call reads."""
        if facts is None:
            facts = _ProgramFacts.read(program)
        self._donated_args = facts.donated_args
        self._aliases = facts.aliases
        self._result_keys = facts.result_keys
        self._stored_layouts = facts.stored_layouts
        self._torch_layout_state = facts.torch_layout_state
        self._stored_bits = facts.stored_bits
        self._input_bits = facts.input_bits
        self._torch_dtype_state = facts.torch_dtype_state
        self._rebuilds = facts.rebuilds
        self._rebuild_bases = facts.rebuild_bases
        self._result_shapes = facts.result_shapes
        self._result_dtypes = facts.result_dtypes
        self._arg_types = facts.arg_types
        self._names = facts.names
        self._user_indices = facts.user_indices
        #: The key random ops draw from (the last of ``_user_indices``), or
        #: None; how many user inputs a call passes (the others).
        self._rng_key = facts.rng_key
        self._caller_inputs = facts.caller_inputs
        self._arg_plan = facts.arg_plan
        self._mutation_keys = facts.mutation_keys
        self._flat_inputs = facts.flat_inputs
        self._keyword_leaves = facts.keyword_leaves
        self._output_keys = facts.output_keys
        self._constant_outputs = facts.constant_outputs
        self._single_output = facts.single_output
        self._flat_outputs = facts.flat_outputs
        #: User inputs checked against the index ranges eager accepts, before every call runs.
        self._index_checks: tuple[_IndexCheck, ...] = tuple(
            _IndexCheck.of(index, self._user_indices.index(index), self._names[index], ranges, native_values_in_range())
            for index, ranges in sorted(facts.index_ranges.items())
        )

    # -- introspection -----------------------------------------------------
    @property
    def aliases(self) -> list[dict[str, Any]]:
        """One entry per alias: argument name and index, result, origin, bytes."""
        if self.alias_report is None:
            return [
                {"argument": self._names[a], "arg_index": a, "result": r, "origin": "ir", "bytes": None}
                for a, r in sorted(self._aliases.items())
            ]
        return [
            {"argument": a.arg_name, "arg_index": a.arg_index, "result": a.result_index,
             "origin": a.origin, "bytes": a.bytes}
            for a in self.alias_report.aliases
        ]

    def host_copy_plan(self) -> list[HostCopy]:
        """The copies a call makes on the host beyond XLA's figures: each
        mutated torch input (PJRT cannot write into memory it does not own,
        so its new value is copied back) and the copies held references of
        state have forced so far."""
        plan = []
        for index in self._user_indices:
            if self._mutation_keys[index] is None:
                continue
            shape, dtype = self._arg_types[index]
            nbytes = _numel(shape) * _itemsize(dtype)
            bits = self._input_bits.get(index)
            if index in self._self_aliased:
                reason = (
                    "mutated torch input: PJRT cannot reuse memory it does not own; a contiguous tensor "
                    "that nothing else views is moved onto the runtime-owned result on its first call "
                    "(no copy) and updated in place after that; any other is copied back each call "
                    f"({self.host_copies.get(self._names[index], 0)} so far)"
                )
                if bits is not None:
                    name = str(bits).removeprefix("torch.")
                    reason += (
                        f"; read and written as its {name} bits (store-state-as-bits): XLA gets the tensor's "
                        f"view({name}), the runtime buffer it moves onto holds {name}, a copy back is of the "
                        f"bits into its view({name}); the tensor keeps its dtype"
                    )
            else:
                reason = (
                    "mutated torch input not aliased to its new value (see alias-donated-buffers): "
                    "XLA writes a fresh buffer and it is copied back each call"
                )
            plan.append(HostCopy(self._names[index], nbytes, reason))
        for name, count in sorted(self.host_copies.items()):
            slot = self._slots.get(name)
            if slot is None:
                continue  # an input: listed above
            wanted = self._stored_layouts.get(name)
            wanted_bits = self._stored_bits.get(name)
            if slot.layout != wanted or slot.bits != wanted_bits:
                reason = (
                    f"{count} call(s) so far: the module's shared buffer is stored as "
                    f"{_form_text(slot.layout, slot.bits)} (fixed by another executable of the module), this "
                    f"program reads {_form_text(wanted, wanted_bits)}, so each call copies it into this "
                    "program's layout"
                    + (", and a new value it writes back into the buffer's dtype" if slot.bits != wanted_bits else "")
                )
            else:
                reason = (
                    f"{count} call(s) so far: a held view of its buffer kept XLA from updating it in place, "
                    "so the new value was copied back into it"
                )
            plan.append(HostCopy(name, slot.nbytes if slot is not None else 0, reason))
        return plan

    def explain(self) -> str:
        """Both passes' decisions (from the final module) and XLA's byte
        figures, as text.  Returns the text; prints nothing."""
        lines = [f"hloalias executable {self.cache_key[:16]} on {self.device.platform}:{self.device.id}"]
        if self.view_report is None:
            lines.append("eliminate-view-results: (not run)")
        else:
            lines.append(self.view_report.to_text())
        lines.append(self.alias_report.to_text() if self.alias_report else "alias-donated-buffers: (not run)")
        lines.extend(self._pass_lines)
        stats = self.memory_stats
        lines.append(
            "XLA memory: argument {argument_bytes} + output {output_bytes} - alias {alias_bytes} "
            "+ temp {temp_bytes} = {total_bytes} bytes".format(**stats)
        )
        if self._loaded is None:
            lines.append(
                "XLA compile: none (the program computes nothing: every output is an input, a view of one or a "
                "constant, so no call runs it); the figures above are its arguments' bytes, as XLA states them "
                "for an empty @main"
            )
        lines.extend(self._host_copy_lines())
        lines.append(self._call_path_line())
        if self._rng_key is not None and self._placement.key_rows is not None:
            first = self._placement.devices[0]
            lines.append(
                f"random ops: drawn from argument {self._rng_key} ('rng_key'), one row per device of the mesh: "
                "on each call every process takes a key from its own torch default generator (each advances "
                f"once) for its devices' rows, and the program reads row 0, the key of process "
                f"{first.process_index} (it drives {first.platform}:{first.id}): every process draws the same "
                "bits whatever its seed (torch.manual_seed in that process reproduces them)"
            )
        elif self._rng_key is not None:
            lines.append(
                f"random ops: drawn from argument {self._rng_key} ('rng_key'), a key each call takes from "
                "torch's default generator (torch.manual_seed reproduces them)"
            )
        lines.append(self.program_cache)
        if self.default_dtype is not None:
            lines.append(
                f"default dtype: {self.default_dtype} (traced under it: a call under another "
                "torch.get_default_dtype() runs this program as it is; hloalias.jit compiles again)"
            )
        lines.extend(self._placement.describe(self.memory_stats_per_device))
        return "\n".join(lines)

    def _call_path_line(self) -> str:
        if self._lane is None:
            return f"call path: Python ({self._python_only_reason})"
        counts = self._lane.counts
        return (
            f"call path: native (hloalias.runtime._lane); calls so far: {counts['calls']} run natively, "
            f"{counts['fallbacks']} left to the Python path before running (inputs it does not take), "
            f"{counts['finished_in_python']} run natively and committed by the Python path (results not "
            "written in place)"
        )

    def _host_copy_lines(self) -> list[str]:
        lines = []
        for tied, first in self.tied_state.items():
            lines.append(f"state '{tied}' is '{first}' (tied): one device buffer, counted once")
        for name, layout in self._stored_layouts.items():
            lines.append(
                f"state '{name}' is read as {layout.describe()}, the layout its convolution reads "
                "(permute-conv-kernel-state); state_dict() returns torch's layout"
            )
        for name, bits in self._stored_bits.items():
            lines.append(
                f"state '{name}' is stored as its {str(bits).removeprefix('torch.')} bit pattern, the type the "
                "program reads and writes it as (store-state-as-bits); state_dict() returns torch's dtype"
            )
        for index, bits in self._input_bits.items():
            lines.append(
                f"input '{self._names[index]}' is read and written as its {str(bits).removeprefix('torch.')} bit "
                "pattern (store-state-as-bits: a user input written in place); the caller's tensor keeps "
                f"{self._arg_types[index][1]}"
            )
        plan = self.host_copy_plan()
        lines.append("host copies per call:" + ("" if plan else " none"))
        lines.extend(f"  '{c.name}' ({c.nbytes} bytes): {c.reason}" for c in plan)
        return lines

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Current parameters, buffers and constants (host copies, in
        torch's layout whatever layout the device buffer has)."""
        return self._state_values(self._slots)

    def _state_values(self, names: Iterable[str], drop_stale_writes: bool = False) -> dict[str, torch.Tensor]:
        """:meth:`state_dict`'s host copies of the entries ``names`` only
        (``drop_stale_writes``: see :meth:`_sync_from_torch`)."""
        with self._group.lock, _RUNTIME_READ():
            self._sync_from_torch(drop_stale_writes)
            return {
                name: self._slots[name].torch_value(self._slot_array(name)).clone(memory_format=torch.contiguous_format)
                for name in names
            }

    def write_back(self) -> None:
        """Copy the device state into the module's own tensors (in place),
        so that eager code sees what calls left there; a change torch makes
        to them afterwards is then the newest value, read by the next call.
        Constants and tensors that no longer exist are skipped.  A write
        made through memory a tensor shares while a call's newer value was
        on the device, which calls refuse, is replaced by that value."""
        with self._group.lock, _RUNTIME_READ():
            self._sync_from_torch(drop_stale_writes=True)
            values = {name: slot.torch_value(self._slot_array(name)) for name, slot in self._watched}
            with torch.no_grad():
                for name, slot in self._watched:
                    source = slot.source()
                    if source is not None:
                        slot.copy_in(source, values[name])  # Ctrl-C-safe (see copy_in)
                    else:
                        slot.mark_synced()

    def load_state_dict(self, state: dict[str, torch.Tensor], *, _then: Callable[[], None] | None = None) -> None:
        """Set module state.  Every entry is checked (known name, torch tensor
        or DeviceTensor with data, matching shape and dtype) and copied to the
        device before any is replaced; on CPU the values are written into the
        existing buffers, so returned views of state see them.  The state is
        shared by every executable compiled from the same module.

        All or nothing: once the first entry is replaced, an exception
        (KeyboardInterrupt included) completes the rest before it leaves.
        (Private: ``_then``, idempotent, is part of that: what the caller
        records once the device holds the state, run after the last
        replacement, and again on such an exception.)"""
        if not isinstance(state, dict):
            raise ExecutionError(f"load_state_dict: expected a dict from state name to tensor, got {type(state).__name__}")
        staged: dict[str, torch.Tensor | jax.Array] = {}
        for name, entry in state.items():
            if name not in self._slots:
                raise ExecutionError(
                    f"load_state_dict: unknown state '{name}' (known: {', '.join(self._slots)})"
                )
            index = self._names.index(self._signature.state_aliases.get(name, name))
            if isinstance(entry, DeviceTensor):
                if self._placement.spmd:
                    raise ExecutionError(
                        f"load_state_dict: '{name}' is a DeviceTensor; state on a mesh is loaded from "
                        "torch tensors and placed by the program's shardings"
                    )
                self._check_input(index, entry)
                staged[name] = entry.array
                continue
            checked = _tensor_for_device(entry, f"load_state_dict: '{name}'")
            self._check_input(index, checked)
            staged[name] = checked
        with self._group.lock:
            fresh: dict[str, jax.Array] = {}
            for name, value in staged.items():
                slot = self._slots[name]
                if isinstance(value, torch.Tensor) and _writable_on_host(slot.array):
                    continue  # written in place below
                if isinstance(value, torch.Tensor):
                    fresh[name] = slot.upload(value)
                elif slot.layout is not None or slot.bits is not None:
                    fresh[name] = slot.upload(array_to_torch(value))
                else:
                    fresh[name] = jax.device_put(value, self.device, may_alias=False)
            # Nothing changed so far.  From the first replacement on, an
            # exception (KeyboardInterrupt included) completes the rest
            # before it leaves: the state is never part loaded.
            done: set[str] = set()
            try:
                self._replace_state(staged, fresh, done)
                if _then is not None:
                    _then()
            except BaseException:
                self._replace_state(staged, fresh, done)
                if _then is not None:
                    _then()
                raise

    def _replace_state(
        self, staged: dict[str, torch.Tensor | jax.Array], fresh: dict[str, jax.Array], done: set[str]
    ) -> None:
        """:meth:`load_state_dict`'s replacements, each once (``done``: the
        names replaced; doing one again is harmless)."""
        for name, value in staged.items():
            if name in done:
                continue
            slot = self._slots[name]
            if name in fresh:
                slot.array = fresh[name]
            else:
                assert slot.array is not None and isinstance(value, torch.Tensor)
                slot.write(value)
            slot.consumed_by = None
            done.add(name)

    def to_device(self, tensor: torch.Tensor, name: str = "tensor") -> DeviceTensor:
        """``tensor`` copied onto this executable's device (donatable for real)."""
        if self._placement.spmd:
            raise ExecutionError(
                "to_device: a program on a mesh takes torch tensors as inputs and places them "
                "by its shardings; DeviceTensor inputs are single-device"
            )
        checked = _tensor_for_device(tensor, f"to_device: '{name}'")
        return DeviceTensor(torch_to_device(checked, self.device, owned=True), name)

    # -- placement ---------------------------------------------------------
    def _state_put(self, arg_index: int) -> Callable[[torch.Tensor], jax.Array] | None:
        """How state argument ``arg_index`` goes to the device: None (the
        slot's default, one device) unless the program runs on a mesh."""
        if not self._placement.spmd:
            return None
        placement = self._placement
        return lambda tensor: placement.put(tensor, arg_index)

    # -- calling -----------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the program; see the module docstring for the semantics."""
        leaves: Sequence[Any]
        if not kwargs and len(args) == self._positional_arity:
            leaves = args
        elif (
            not args and self._keyword_leaves is not None and len(kwargs) == len(self._keyword_leaves)
            and all(isinstance(kwargs.get(name), (torch.Tensor, DeviceTensor)) for name in self._keyword_leaves)
        ):
            # The keywords compiled, each a tensor: nothing to bind.
            leaves = [kwargs[name] for name in self._keyword_leaves]
        else:
            leaves = self._user_leaves(args, kwargs)
        if self._modes is not None:
            self._check_modes()
        if self._hooks is not None:
            self._check_hooks()
        if _any_autocast():
            self._refuse_autocast()
        key: Any = None
        if self._key_sharding is not None:
            # One more read-only argument on every path: a fresh key from
            # torch's default generator, which advances (manual_seed
            # reproduces a run, successive calls draw differently), in a
            # buffer PJRT owns (draw_rng_key).  On a mesh the torch tensor,
            # which the placement copies as it copies every input.
            key = draw_rng_key(self._key_sharding) if self._plan is not None else draw_rng_bits()
        if self._watched and not self._watch_late and self._state_watch.changed():
            self._sync_from_torch()
        if self._checks_state_aliases:
            self._check_state_aliases(leaves)
        if self._lane is not None:
            outputs = self._lane(leaves if key is None else [*leaves, key])
            if outputs is not _LANE_FALLBACK:
                return outputs
            # Left to the Python path: before running, or after a run on old
            # state that the lane dropped and brought the state up to date
            # for; either way the check during the run below is enough.
        # The key is the last of _user_indices: zip stops before it, and
        # the checks below see the caller's inputs only.
        inputs: dict[int, Any] = dict(zip(self._user_indices, leaves))
        if key is not None:
            inputs[self._rng_key] = key  # type: ignore[index]
        for (index, shape, dtype), value in zip(self._input_types, leaves):
            # The common case inline; anything else (DeviceTensor, errors)
            # through the full check.
            if not (
                isinstance(value, torch.Tensor) and value.dtype == dtype and value.shape == shape
                and value.is_cpu and value.layout is torch.strided
            ):
                self._check_input(index, value)
        if self._index_checks:
            check_index_ranges(self._index_checks, leaves)
        if self._write_pairs or self._written_in_place:
            self._check_writes(inputs)
        if self._strided_inputs:
            self._check_strided_layouts(inputs)
        plan = self._plan
        if plan is not None and plan.input_views is not None:
            # Not run (no results, no donation) and every output a view of
            # a user input: no state is read or written, nothing to serialize.
            outputs = input_views(self, plan.input_views, inputs)
            if outputs is not None:
                self._calls += 1
                return outputs
        with self._group.lock if self._slots else _NO_LOCK:
            if plan is not None:
                return run_planned(self, plan, inputs)
            return run_mesh(self, inputs)

    def _refuse_autocast(self) -> None:
        if torch.is_autocast_enabled("cpu"):
            raise ExecutionError(_AUTOCAST.format(dtype=torch.get_autocast_dtype("cpu")) + "call it outside torch.autocast")

    def _check_modes(self) -> None:
        """Refuse a call after a train/eval switch, or a new value of a
        plain attribute, of a module the program read (``runtime/module_modes.py``):
        the program holds the compile-time mode's dropout and normalization,
        and the compile-time values."""
        assert self._modes is not None
        changed = self._modes.changed()
        if changed is not None:
            raise ExecutionError(
                f"{changed}; the program holds what it was compiled with (the mode's dropout and "
                "normalization, the attribute's value): set it back, or compile again "
                "(hloalias.jit compiles once per mode and value)"
            )

    def _check_hooks(self) -> None:
        """Refuse a call after a forward hook of a module the program runs
        was registered or removed (``runtime/module_hooks.py``): the program
        holds the hooks it was compiled with."""
        assert self._hooks is not None
        changed = self._hooks.changed()
        if changed is not None:
            raise ExecutionError(
                f"{changed}; the program holds the hooks registered when it was compiled: "
                "restore them, or compile again (hloalias.jit compiles again for new hooks)"
            )

    def _sync_from_torch(self, drop_stale_writes: bool = False) -> None:
        """Bring the device state up to the module's tensors that torch
        changed since they last agreed (``m.weight.mul_(2)``,
        ``cache.zero_()``, ``model.load_state_dict(...)``): the user's write
        is the newest value, as in eager.  A dtype or shape change is an
        ExecutionError naming the tensor (``_StateSlot.refresh_from_torch``).
        Checked before every call and ``state_dict()``.  A write to a
        tensor's memory made while its slot lagged
        (``_StateSlot.written_while_lagging``) is refused, unless
        ``drop_stale_writes`` (a write-back, which puts the device's value
        over it): left to the copy that follows."""
        with self._group.lock, _RUNTIME_READ():
            # Where the per-call check ran, its answer (remembered).
            if self._attached and self._state_watch.attachments_moved():
                self._follow_attachments()
            for name, slot in self._watched:
                if slot.replacements != self._replacements.get(id(slot), 0):
                    self._check_follow(self._attached_names.get(id(slot), name), slot)
                if slot.torch_changed() and not (drop_stale_writes and slot.written_while_lagging()):
                    slot.refresh_from_torch(self._attached_names.get(id(slot), name))

    def _module_attachments(
        self, owner_tensors: tuple[tuple[str, torch.Tensor], ...] | None = None
    ) -> tuple[tuple[str, _StateSlot], ...]:
        """Each watched slot whose tensor the owner module holds as a
        parameter, buffer or plain tensor attribute, with that attribute's
        dotted name, the first :func:`module_tensors` gives (a training
        step's slots are named otherwise: ``param.<fqn>``,
        ``_tensor_constant0``).  ``owner_tensors``: that walk, made by the
        compile already."""
        owner = self._group.owner() if self._group.owner is not None else None
        if owner is None or not self._watched:
            return ()
        where: dict[int, str] = {}
        for name, value in owner_tensors if owner_tensors is not None else module_tensors(owner):
            where.setdefault(id(value), name)
        return tuple(
            (where[id(tensor)], slot) for _, slot in self._watched
            if (tensor := slot.source()) is not None and id(tensor) in where
        )

    def _follow_attachments(self) -> None:
        """Re-point each attached slot at the tensor its module attribute
        holds now, where torch's registration hooks could not: the name's
        tensor was deleted before another was registered (``del m.bias;
        m.bias = ...``, also a deleted submodule), or it is a plain tensor
        attribute (``m.scale = t``).  An attribute gone, or holding no
        tensor, is a removal the next ``_check_follow`` refuses, as eager
        would fail.  Records the lookup last: a Ctrl-C part way redoes it."""
        edits = _ATTACHMENT_EDITS[0]
        plain = []
        if self._group.owner is None or self._group.owner() is None:
            # The module is gone (compiled from a temporary): nothing can
            # hold another tensor under its names, and its state lives on.
            self._state_watch.attach((), edits)
            return
        for name, slot in self._attached:
            found = self._group.attribute_table(name)
            current = None
            if found is not None:
                table, key, is_plain = found
                value = table.get(key)
                current = value if isinstance(value, torch.Tensor) else None
                if is_plain and current is not None:
                    plain.append((table, key, slot))
            source = slot.source()
            if current is None:
                if source is not _REMOVED:
                    slot.follow(None)
            elif current is not source:
                slot.follow(current)
        self._state_watch.attach(tuple(plain), edits)

    def _check_follow(self, name: str, slot: _StateSlot) -> None:
        """Refuse a slot that followed its module attribute to a new tensor
        (``m.w = nn.Parameter(...)``: :meth:`_StateSlot.follow`) where this
        program cannot: the slot is shared by tied names (eager's other name
        still holds the old tensor), or a training step's optimizer holds
        the old parameter (eager would go on updating that one)."""
        tied = sorted(n for n, s in self._slots.items() if s is slot)
        # Tied names stay one tensor when every one of them was given the
        # same new memory (``load_state_dict(..., assign=True)`` of a tied
        # model makes two Parameters over one storage): then the slot may follow.
        if len(tied) > 1 and not all(_same_tensor(self._group.module_tensor(n), slot.source()) for n in tied):
            raise ExecutionError(
                f"module state '{name}' was replaced by another tensor after compiling, and the program "
                f"reads it under the tied names {tied}; compile again"
            )
        why = self._refused_replacements.get(id(slot))
        if why is not None:
            raise ExecutionError(
                f"module state '{name}' was replaced by another tensor after compiling; {why}; compile again"
            )
        self._replacements[id(slot)] = slot.replacements

    def _user_leaves(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The tensor inputs of a call, in ``@main``'s user-input order."""
        new_args, new_kwargs = self._convention.arrange(args, kwargs)
        leaves, spec = pytree.tree_flatten((new_args, new_kwargs))
        if spec != self._signature.in_spec:
            raise ExecutionError(self._structure_mismatch(new_args, new_kwargs))
        tensors = []
        for position, leaf in enumerate(leaves):
            if position not in self._statics:
                tensors.append(leaf)
                continue
            expected = self._statics[position]
            if type(leaf) is not type(expected) or leaf != expected:
                path = pytree.keystr(pytree.tree_flatten_with_path((new_args, new_kwargs))[0][position][0])
                raise ExecutionError(
                    f"compiled for static value {expected!r} of input {path}; got {leaf!r}: compile again"
                )
        return tensors

    def _structure_mismatch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        expected_args, expected_kwargs = self._signature.in_spec.children()
        names = [name if sub is None else f"{name}[{sub}]" for name, sub in self._convention.positional]
        pairs = list(zip(names, expected_args.children(), args))
        pairs += [(key, spec, kwargs.get(key)) for key, spec in zip(expected_kwargs.context, expected_kwargs.children())]
        for name, spec, value in pairs:
            got = pytree.tree_structure(value)
            if got != spec:
                # A transformers cache changes its structure as it fills
                # (a StaticCache allocates its tensors on its first update,
                # a DynamicCache gains layers): say so.
                grown = (
                    "; the cache changed its structure since compiling (its layers were allocated or "
                    "grew): hloalias.jit compiles once per structure"
                    if got.type is spec.type and type(value).__name__.endswith("Cache") else ""
                )
                return (
                    f"inputs do not have the structure the program was compiled for: input '{name}' "
                    f"should be {_describe_spec(spec)}, got {_describe_spec(got)}{grown}"
                )
        return (
            f"inputs do not have the structure the program was compiled for: expected "
            f"{self._convention.expected()}"
        )

    def _check_writes(self, inputs: dict[int, Any]) -> None:
        """Refuse, before anything runs, a call eager PyTorch would refuse or
        XLA cannot reproduce: a written input that requires grad (leaf) or is
        an inference tensor, one whose elements overlap each other, and two
        inputs sharing memory where either is written or donated."""
        for index in self._written_in_place:
            value = inputs[index]
            if not isinstance(value, torch.Tensor):
                continue
            if value.requires_grad and value.is_leaf and torch.is_grad_enabled():
                raise ExecutionError(
                    f"input '{self._names[index]}' is a leaf tensor that requires grad and the program writes "
                    "to it in place (eager PyTorch refuses this too); pass x.detach() or call under "
                    "torch.no_grad()"
                )
            if value.is_inference() and not torch.is_inference_mode_enabled():
                raise ExecutionError(
                    f"input '{self._names[index]}' is an inference tensor and the program writes to it in "
                    "place outside inference mode (eager PyTorch refuses this too)"
                )
            strides = value.stride()
            if 0 in strides and any(stride == 0 and size > 1 for size, stride in zip(value.shape, strides)):
                # Eager refuses only a write whose own elements overlap; a
                # write to one row of an expansion succeeds and every row
                # sees it.  The program works on a dense copy: it can do
                # neither, so every write to an expanded input is refused.
                raise ExecutionError(
                    f"input '{self._names[index]}' is an expanded tensor (elements share memory: stride 0 "
                    "along a dimension of size > 1) and the program writes to it in place. Eager PyTorch "
                    "refuses such a write where written elements share memory, and otherwise changes every "
                    "element that shares memory with a written one; a compiled program works on a dense "
                    f"copy and can do neither; pass '{self._names[index]}'.clone()"
                )
        nbytes = self._input_nbytes
        for first, second in self._write_pairs:
            if _share_memory(inputs[first], inputs[second], nbytes[first], nbytes[second]):
                writer = first if first in self._writes else second
                other = second if writer == first else first
                verb = "writes to" if self._mutation_keys[writer] is not None else "donates"
                raise ExecutionError(
                    f"inputs '{self._names[writer]}' and '{self._names[other]}' share memory and the "
                    f"program {verb} '{self._names[writer]}'; XLA cannot reproduce what eager "
                    f"PyTorch would do (one input seeing the other's update); pass separate "
                    f"tensors, e.g. '{self._names[other]}'.clone()"
                )

    def _check_state_aliases(self, leaves: Sequence[Any]) -> None:
        """Refuse, before anything runs, a caller's input that shares memory
        (a storage) with the module's state where the program writes either:
        eager would have one see the other's update (``f(m.bias)`` with
        ``a.mul_(2)`` then ``m(x)`` reads the doubled bias), the program
        reads each from its own buffer."""
        agreements = _AGREEMENTS[0]
        seen, storages = self._state_storages
        if seen != agreements:
            written = {id(slot) for _, slot in self._written_state}
            storages = {}
            with _RUNTIME_READ():
                for name, slot in self._watched:
                    tensor = slot.source()
                    if tensor is None or tensor is _REMOVED or not isinstance(tensor, torch.Tensor):
                        continue
                    address = torch._C.TensorBase.untyped_storage(tensor).data_ptr()
                    if not address:
                        continue
                    # One storage may hold several state tensors (buffers
                    # that are views of one tensor): the storage is written
                    # when any of them is, named by a written one.
                    is_written = id(slot) in written
                    known = storages.get(address)
                    if known is None or (is_written and not known[1]):
                        storages[address] = (self._attached_names.get(id(slot), name), is_written)
            self._state_storages = (agreements, storages)
        if not storages:
            return
        for index, value in zip(self._user_indices[: self._caller_inputs], leaves):
            if not isinstance(value, torch.Tensor):
                continue
            # torch's own method: a watched state tensor passed as an input
            # takes no escape here (runtime/state.py: _WatchedTensorHook).
            found = storages.get(torch._C.TensorBase.untyped_storage(value).data_ptr())
            if found is None:
                continue
            state, state_written = found
            if state_written or index in self._written_in_place:
                held = (
                    f"a tensor the function reads from its closure or globals (state '{state}')"
                    if state.startswith(("lifted_tensor", "_tensor_constant")) else f"module state '{state}'"
                )
                writer = "that state" if state_written else f"input '{self._names[index]}'"
                raise ExecutionError(
                    f"input '{self._names[index]}' shares memory with {held} and the program writes "
                    f"{writer}; XLA cannot reproduce what eager PyTorch would do (one seeing the other's "
                    f"update); pass a separate tensor, e.g. '{self._names[index]}'.clone()"
                )

    def _check_strided_layouts(self, inputs: dict[int, Any]) -> None:
        """Refuse an input read through ``as_strided`` in another layout than
        the example's: ``as_strided`` addresses storage, so eager would read
        other elements than the program, compiled for the example's."""
        for index, (strides, offset) in self._signature.strided_inputs.items():
            value = inputs[index]
            if isinstance(value, torch.Tensor):
                got = tuple(value.stride()), int(value.storage_offset())
            else:  # a DeviceTensor: row-major, at the start of its buffer
                got = row_major_strides(tuple(self._arg_types[index][0])), 0
            shape = tuple(self._arg_types[index][0])
            # A dimension of size 1 is never stepped along: its stride is free.
            differs = any(n > 1 and a != b for n, a, b in zip(shape, got[0], strides))
            if differs or (offset is not None and got[1] != offset):
                expected = f"strides {list(strides)}" + (f" and storage offset {offset}" if offset is not None else "")
                raise ExecutionError(
                    f"input '{self._names[index]}' has strides {list(got[0])} and storage offset {got[1]}; "
                    f"the program reads it through as_strided, which addresses storage, and was compiled "
                    f"for {expected} (the example's): pass a tensor laid out like the example, or "
                    "compile again on one laid out like this"
                )

    def _count_copy(self, name: str) -> None:
        self.host_copies[name] = self.host_copies.get(name, 0) + 1


    def _state_array(self, name: str) -> jax.Array:
        """State ``name``'s buffer in the layout this program reads.  When
        another executable of the module stored it differently, a copy in
        this program's layout (counted in ``host_copies``)."""
        array = self._slot_array(name)
        slot = self._slots[name]
        wanted = self._stored_layouts.get(name)
        wanted_bits = self._stored_bits.get(name)
        if slot.layout == wanted and slot.bits == wanted_bits:
            return array
        self._count_copy(name)
        return slot.array_in(array, wanted, wanted_bits)

    def _slot_array(self, name: str) -> jax.Array:
        """State ``name``'s buffer, in the slot's layout."""
        slot = self._slots[name]
        array = slot.array
        if array is None or array.is_deleted():
            raise DonatedBufferError(
                f"module state '{name}' was donated {slot.consumed_by or 'earlier'} "
                "and its buffer has been consumed; load_state_dict() to set it again"
            )
        return array

    def _check_input(self, index: int, value: Any) -> None:
        expected_shape, expected_dtype = self._arg_types[index]
        if (
            isinstance(value, torch.Tensor) and value.dtype == expected_dtype and value.shape == expected_shape
            and value.is_cpu and value.layout is torch.strided
        ):
            return
        name = self._names[index]
        if isinstance(value, DeviceTensor):
            if value.dtype == expected_dtype and value.shape == expected_shape:
                value.array  # DonatedBufferError now, before anything runs
                return
            shape, dtype = tuple(value.shape), value.dtype
        elif isinstance(value, torch.Tensor):
            shape, dtype = tuple(value.shape), value.dtype
            if value.device.type != "cpu":
                raise ExecutionError(
                    f"input '{name}' is on device '{value.device}'; pass a CPU tensor or a DeviceTensor"
                )
            if value.layout is not torch.strided:
                raise ExecutionError(f"input '{name}' has layout {value.layout}; only dense tensors are supported")
        else:
            raise ExecutionError(f"input '{name}' is {type(value).__name__}, expected a torch.Tensor or DeviceTensor")
        if shape != expected_shape or dtype != expected_dtype:
            raise ExecutionError(
                f"input '{name}' is {dtype} {list(shape)}, but the program was compiled for "
                f"{expected_dtype} {list(expected_shape)}; compile again for the new signature"
            )


class _GradientCheckedExecutable(Executable):
    """An :class:`Executable` of a module with a parameter that requires
    grad, whose results, in grad mode, refuse to be part of a
    ``backward()``: the program records no graph, and the module's
    parameters would silently get no gradient
    (:mod:`hloalias.runtime.gradient_boundary`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outputs = Executable.__call__(self, *args, **kwargs)
        if self._gradient_checked and torch.is_grad_enabled():
            trainable = _trainable_now(self) if self._watched else _NO_SLOTS
            from_inputs = self._reached_from_inputs(args, kwargs) if self._signature.input_gradient_outputs else _NO_SLOTS
            for slot, reached in self._closed_over_reach:
                # A closed-over tensor that requires grad: a constant to
                # the signature's parameter_free_outputs.
                if id(slot) in trainable:
                    from_inputs |= reached
            if trainable:
                # A parameter unfrozen since compiling may reach an output
                # the signature counts as free: every result is marked.
                free = self._signature.parameter_free_outputs if trainable <= self._trainable_when_compiled else None
                if free is not None and from_inputs:
                    free = free - from_inputs
                return mark_without_gradient(outputs, self._program_name, (args, kwargs), free=free)
            if from_inputs:
                return mark_without_gradient(
                    outputs, self._program_name, (args, kwargs), reached=from_inputs
                )
        return outputs

    def _reached_from_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> frozenset[int]:
        """The output positions a floating chain reaches from the call's
        inputs that require grad (the signature's
        ``input_gradient_outputs``): eager's results that require grad
        through them."""
        reached_by = self._signature.input_gradient_outputs
        assert reached_by
        if kwargs or len(args) != self._positional_arity:
            if not any(
                isinstance(leaf, torch.Tensor) and leaf.requires_grad for leaf in pytree.tree_leaves((args, kwargs))
            ):
                return frozenset()
            leaves: Sequence[Any] = self._user_leaves(args, kwargs)
        else:
            for leaf in args:
                if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                    break
            else:
                return _NO_SLOTS  # the common call: no input requires grad
            leaves = args
        reached: frozenset[int] = frozenset()
        for index, leaf in zip(self._user_indices, leaves):
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad and index in reached_by:
                reached |= reached_by[index]
        return reached


class _CarryingExecutable(Executable):
    """An :class:`Executable` whose program returns some input objects as
    themselves (a transformers Cache): after the call the caller's object
    gets the new state and is returned in its place, as in eager
    (:func:`~hloalias.runtime.carried_objects.carry_objects`); its other
    results are gradient-checked as :class:`_GradientCheckedExecutable`'s."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outputs = Executable.__call__(self, *args, **kwargs)
        call = self._convention.arrange(args, kwargs)
        outputs = carry_objects(self._carried, call, outputs)
        if self._gradient_checked and torch.is_grad_enabled() and _trainable_now(self):
            return mark_without_gradient(outputs, self._program_name, (args, kwargs), callers_objects(self._carried, call))
        return outputs


_NO_LOCK = contextlib.nullcontext()  # reusable: it holds nothing
_NO_SLOTS: frozenset[int] = frozenset()


def draw_rng_bits() -> torch.Tensor:
    """A key for a program's random ops (frontend/random_key.py): two
    int64 words drawn from torch's default CPU generator, advancing it."""
    return torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64)


def draw_rng_key(sharding: jax.sharding.Sharding) -> jax.Array:
    """:func:`draw_rng_bits` in a PJRT-owned buffer placed by ``sharding``
    (:func:`~hloalias.runtime.ownership.host_copy`).  Not a zero-copy import
    of the torch tensor: that import dies with the call, and its release,
    which runs torch's deleter under the GIL, could fall on PJRT's worker
    while the process finalizes after its last call (an abort at exit)."""
    return host_copy(draw_rng_bits().numpy(), sharding)


def _trainable_now(exe: Executable) -> frozenset[int]:
    """The state slots (by id) whose module tensor requires grad now: eager
    records a graph from these (``model.requires_grad_(False)`` after
    compiling leaves none, and eager's results then require no grad).
    Asked in grad mode only, where a call already builds an autograd node."""
    return frozenset(
        id(slot) for _, slot in exe._watched if (tensor := slot.source()) is not None and tensor.requires_grad
    )


def _same_tensor(first: torch.Tensor | None, second: torch.Tensor | None) -> bool:
    """Whether ``first`` and ``second`` are one tensor or show the same
    memory the same way (two Parameters over one storage)."""
    if first is None or second is None:
        return False
    return first is second or (
        first.dtype == second.dtype and first.shape == second.shape and first.stride() == second.stride()
        and first.data_ptr() == second.data_ptr()
    )
