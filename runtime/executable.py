"""Execution: ``compile`` runs the whole pipeline and returns an
:class:`Executable` that behaves like calling the torch program eagerly.

- Results the ``eliminate-view-results`` pass removed come back as real
  torch views (``as_strided``) of their base: the input tensor, the module
  state or another result; no device memory and no copy.
- Module state (parameters, buffers, constants) lives on the device inside
  the executable.  A mutated buffer is aliased to its new value: XLA writes
  in place and the executable rebinds it.
- A mutated user input is updated in place (``copy_``), as eager would.
- Donated inputs are consumed.  A :class:`DeviceTensor` that was donated
  raises :class:`DonatedBufferError` when used again.  A donated torch
  tensor is left untouched: on the CPU client PJRT cannot reuse memory it
  does not own, so XLA writes the result elsewhere; treat it as consumed.
- Inputs must match the example inputs' shapes and dtypes; anything else is
  an :class:`ExecutionError` (compile again for another signature).
- Non-contiguous user inputs are copied to contiguous memory first; views
  rebuilt from them are views of that copy."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch_mlir import ir

from hloalias import attributes as A
from hloalias.errors import DonatedBufferError, DonationError, ExecutionError, ShardingError
from hloalias.frontend.importer import Program, Stage, import_torch
from hloalias.contract import Signature, verify
from hloalias.mlir import find_main, print_module
from hloalias.passes.alias_donated_buffers import AliasDonatedBuffers, AliasReport
from hloalias.passes.eliminate_view_results import EliminateViewResults, ViewReport
from hloalias.pipeline import DEFAULT_PIPELINE, module_cache_key, parse_pipeline, run_pipeline
from hloalias.runtime.sharding import Mesh, Placement, gather, plan_shardings, result_shardings
from hloalias.runtime.pjrt import (
    MemoryStats,
    array_to_torch,
    compile_module,
    device_for,
    memory_stats,
    torch_to_device,
)


class DeviceTensor:
    """A tensor held on a PJRT device, for inputs whose buffers should be
    truly reused when donated.  Make one with :meth:`Executable.to_device`
    or :func:`to_device`; read it back with :meth:`to_torch`."""

    def __init__(self, array: jax.Array, name: str = "tensor") -> None:
        self._array: jax.Array | None = array
        self.name = name
        self._consumed_by: str | None = None
        # Fixed for its lifetime: a rebind (in-place update) keeps the type.
        self.dtype: torch.dtype = _torch_dtype_of_jax(array.dtype)
        self.shape = torch.Size(array.shape)

    @property
    def array(self) -> jax.Array:
        """The device array; DonatedBufferError once donated."""
        if self._array is None or self._array.is_deleted():
            raise DonatedBufferError(
                f"device tensor '{self.name}' was donated {self._consumed_by or 'to a call'} "
                "and its buffer has been consumed; it cannot be used again"
            )
        return self._array

    def to_torch(self) -> torch.Tensor:
        """The value as a torch tensor (zero-copy on CPU)."""
        return array_to_torch(self.array)

    def _consume(self, where: str) -> None:
        self._consumed_by = where
        self._array = None

    def _rebind(self, array: jax.Array) -> None:
        self._array = array


def to_device(tensor: torch.Tensor, device: Any = None, name: str = "tensor") -> DeviceTensor:
    """Copy ``tensor`` into a PJRT-owned buffer on ``device`` (default CPU)."""
    return DeviceTensor(torch_to_device(tensor, device_for(device), owned=True), name)


@dataclasses.dataclass(frozen=True)
class _Rebuild:
    """How to produce a removed result from its base (None layout: dead)."""

    base: str | None
    dtype: torch.dtype | None = None
    sizes: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    offset: int = 0
    identity: bool = False


@dataclasses.dataclass
class CacheStats:
    """Executable cache counters (process-wide)."""

    hits: int = 0
    misses: int = 0


_CACHE: dict[tuple[str, str], Any] = {}
_CACHE_STATS = CacheStats()
_CACHE_LOCK = threading.Lock()


def cache_stats() -> CacheStats:
    """The process-wide executable cache counters (live object)."""
    return _CACHE_STATS


def clear_cache() -> None:
    """Drop every cached XLA executable and reset the counters."""
    with _CACHE_LOCK:
        _CACHE.clear()
        _CACHE_STATS.hits = _CACHE_STATS.misses = 0


def compile(  # noqa: A001 - the name users expect
    f: torch.nn.Module | Callable[..., Any] | ExportedProgram,
    example_args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    donate: Sequence[int | str] = (),
    pipeline: str | None = None,
    device: Any = None,
    mesh: Mesh | None = None,
    shardings: dict[str | int, Any] | None = None,
) -> "Executable":
    """Import ``f`` on the example inputs, run the pass pipeline, compile it
    with XLA through PJRT and return an :class:`Executable`.

    ``donate`` names user inputs by position (int) or argument name, and
    parameters/buffers by fully qualified name; each may appear once.
    ``pipeline`` is a textual pipeline (default
    :data:`hloalias.pipeline.DEFAULT_PIPELINE`); ``device`` is a platform name
    or a jax device (default: the first CPU device).  XLA executables are
    cached by the final module's key, so equivalent configurations share
    one compile.

    ``mesh`` (an :class:`~hloalias.runtime.sharding.Mesh`) runs the program
    on several devices with XLA's SPMD partitioner; ``shardings`` maps state
    names (FQNs), user-input names or positions to partition specs over the
    mesh's axes (one entry per dimension: axis name, tuple of names, or None;
    unnamed tensors are replicated).  Errors in either are
    :class:`ShardingError`, raised before anything is compiled."""
    _check_mesh_arguments(mesh, shardings)
    program = import_torch(f, example_args, kwargs)
    target = device_for(mesh.platform if mesh is not None else device)
    placement = plan_shardings(program, mesh, shardings, target) if mesh is not None else Placement(target)
    donated = _resolve_donations(program, donate)
    _mark_donors(program, donated)
    run_pipeline(program.torch_mlir_module, pipeline or DEFAULT_PIPELINE)
    # The contract of the module XLA gets, checked once: a violation is an
    # IRError now, not a KeyError in some later call.
    with program.torch_mlir_module.context:
        verify(find_main(program.torch_mlir_module))
    final_text = print_module(program.torch_mlir_module)
    key = module_cache_key(program.torch_mlir_module)
    cache_slot = (key, ",".join(f"{d.platform}:{d.id}" for d in placement.devices))
    with _CACHE_LOCK:
        loaded = _CACHE.get(cache_slot)
        hit = loaded is not None
        if hit:
            _CACHE_STATS.hits += 1
    if not hit:
        options = None
        if placement.spmd:
            sharded = result_shardings(program.torch_mlir_module)
            options = placement.compile_options(len(sharded), sharded)
        loaded = compile_module(final_text, target, options=options, devices=placement.devices)
        with _CACHE_LOCK:
            _CACHE[cache_slot] = loaded
            _CACHE_STATS.misses += 1
    # Reports of the final module (all runs of each pass together), not
    # of the last run; None when the pipeline did not run the pass.
    ran = _passes_in(pipeline or DEFAULT_PIPELINE)
    module = program.torch_mlir_module
    return Executable(
        program, loaded, target, key, final_text,
        ViewReport.from_module(module) if EliminateViewResults.name in ran else None,
        AliasReport.from_module(module) if AliasDonatedBuffers.name in ran else None,
        cache_hit=hit,
        placement=placement,
    )


def _passes_in(pipeline: str) -> set[str]:
    return {element.name for element in parse_pipeline(pipeline)}


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


def _resolve_donations(program: Program, donate: Sequence[int | str]) -> list[int]:
    arguments = program.signature.arguments
    user_inputs = program.signature.user_input_indices()
    chosen: list[int] = []
    for request in donate:
        if isinstance(request, bool) or not isinstance(request, (int, str)):
            raise DonationError(f"donate entries are positions or names, got {request!r}")
        if isinstance(request, int):
            if not 0 <= request < len(user_inputs):
                raise DonationError(
                    f"donate names user input {request}, but the program has {len(user_inputs)} user inputs"
                )
            index = user_inputs[request]
        else:
            matches = [a.index for a in arguments if a.name == request]
            if not matches:
                names = ", ".join(a.name for a in arguments)
                raise DonationError(f"donate names unknown tensor '{request}' (known: {names})")
            index = matches[0]
        if index in chosen:
            raise DonationError(f"'{arguments[index].name}' is donated twice")
        if arguments[index].kind == "constant":
            raise DonationError(f"'{arguments[index].name}' is a lifted constant and cannot be donated")
        chosen.append(index)
    return chosen


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


class Executable:
    """A compiled torch program.  Call it like the original function."""

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
        placement: Placement | None = None,
    ) -> None:
        assert program.stage is Stage.STABLEHLO
        self._placement = placement if placement is not None else Placement(device)
        self._signature = program.signature
        self._loaded = loaded
        self.device = device
        self.cache_key = cache_key
        self.mlir = mlir
        self.cache_hit = cache_hit
        self.view_report = view_report
        self.alias_report = alias_report
        per_device = memory_stats(loaded).as_dict()
        devices = self._placement.devices
        # XLA reports one partition's figures; every device holds the same.
        self.memory_stats_per_device = {f"{d.platform}:{d.id}": dict(per_device) for d in devices}
        self.memory_stats = {name: value * len(devices) for name, value in per_device.items()}
        self._calls = 0
        self._read_final_module(program)
        state_index = {a.name: a.index for a in program.signature.arguments}
        self._state: dict[str, jax.Array | None] = {
            name: self._put(value, state_index[name], owned=True) for name, value in program.state.items()
        }
        self._state_consumed: dict[str, str] = {}

    # -- final module facts ------------------------------------------------
    def _read_final_module(self, program: Program) -> None:
        module = program.torch_mlir_module
        with module.context:
            main = find_main(module)
            contract = Signature.read(main)  # verified once, by compile()
            self._donated_args = {i for i, arg in enumerate(contract.args) if arg.overwritten}
            self._aliases = {
                i: arg.aliasing_output for i, arg in enumerate(contract.args)
                if arg.aliasing_output is not None
            }
            self._result_keys = list(contract.keys)
            self._rebuilds: dict[str, _Rebuild] = {}
            for record in contract.removed:
                if record.base is None or record.layout is None:
                    self._rebuilds[record.key] = _Rebuild(None)
                    continue
                layout = record.layout
                self._rebuilds[record.key] = _Rebuild(
                    record.base, _torch_dtype(layout.element_type),
                    layout.sizes, layout.strides, layout.offset, identity=record.is_identity,
                )
        function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        self._result_shapes = [tuple(ir.RankedTensorType(t).shape) for t in function_type.results]
        arguments = self._signature.arguments
        self._arg_types = [
            (tuple(ir.RankedTensorType(t).shape), _torch_dtype(ir.RankedTensorType(t).element_type))
            for t in ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value).inputs
        ]
        self._names = [a.name for a in arguments]
        # Per-call plans, computed once: the call path is hot.
        self._user_indices = self._signature.user_input_indices()
        self._arg_plan = [
            (a.index, None if a.kind == "user_input" else a.name) for a in arguments
        ]
        self._mutation_keys = [
            A.mutation_key(a.index) if A.mutation_key(a.index) in self._result_keys else None
            for a in arguments
        ]
        in_spec = self._signature.in_spec
        out_spec = self._signature.out_spec
        flat_in = pytree.tree_structure((tuple(range(len(self._user_indices))), {}))
        self._flat_inputs = in_spec == flat_in
        self._output_keys = [A.output_key(i) for i in range(out_spec.num_leaves)]
        self._constant_outputs = {
            A.output_key(i): v for i, v in self._signature.constant_outputs.items()
        }
        self._single_output = out_spec == pytree.tree_structure(0)
        self._flat_outputs = self._single_output or out_spec == pytree.tree_structure(
            tuple(range(out_spec.num_leaves))
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

    def explain(self) -> str:
        """Both passes' decisions (from the final module) and XLA's byte
        figures, as text.  Returns the text; prints nothing."""
        lines = [f"hloalias executable {self.cache_key[:16]} on {self.device.platform}:{self.device.id}"]
        if self.view_report is None:
            lines.append("eliminate-view-results: (not run)")
        else:
            lines.append(self.view_report.to_text())
        lines.append(self.alias_report.to_text() if self.alias_report else "alias-donated-buffers: (not run)")
        lines.extend(self._placement.describe(self.memory_stats_per_device))
        stats = self.memory_stats
        lines.append(
            "XLA memory: argument {argument_bytes} + output {output_bytes} - alias {alias_bytes} "
            "+ temp {temp_bytes} = {total_bytes} bytes".format(**stats)
        )
        return "\n".join(lines)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Current parameters, buffers and constants (host copies)."""
        return {name: self._to_torch(self._state_array(name)).clone() for name in self._state}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Replace module state; every name must be known and shapes/dtypes match."""
        for name, value in state.items():
            if name not in self._state:
                raise ExecutionError(f"load_state_dict: unknown state '{name}' (known: {', '.join(self._state)})")
            index = self._names.index(name)
            self._check_input(index, value)
        for name, value in state.items():
            self._state[name] = self._put(value, self._names.index(name), owned=True)
            self._state_consumed.pop(name, None)

    def to_device(self, tensor: torch.Tensor, name: str = "tensor") -> DeviceTensor:
        """``tensor`` copied onto this executable's device (donatable for real)."""
        if self._placement.spmd:
            raise ExecutionError(
                "to_device: a program on a mesh takes torch tensors as inputs and places them "
                "by its shardings; DeviceTensor inputs are single-device"
            )
        return DeviceTensor(torch_to_device(tensor, self.device, owned=True), name)

    # -- placement ---------------------------------------------------------
    def _put(self, tensor: torch.Tensor, arg_index: int, *, owned: bool) -> jax.Array:
        """``tensor`` as the device array of argument ``arg_index``."""
        if self._placement.spmd:
            return self._placement.put(tensor, arg_index)
        return torch_to_device(tensor, self.device, owned=owned)

    def _to_torch(self, array: jax.Array) -> torch.Tensor:
        """A device array as a torch tensor: zero-copy for one CPU device,
        gathered from its shards on a mesh."""
        if self._placement.spmd:
            return array_to_torch(gather(array, self.device))
        return array_to_torch(array)

    # -- calling -----------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the program; see the module docstring for the semantics."""
        if kwargs or len(args) != len(self._user_indices) or not self._flat_inputs:
            leaves, spec = pytree.tree_flatten((args, kwargs))
            if spec != self._signature.in_spec:
                raise ExecutionError(
                    f"inputs do not have the structure the program was compiled for: "
                    f"expected {self._signature.in_spec}, got {spec}"
                )
        else:
            leaves = list(args)
        self._calls += 1
        inputs: dict[int, Any] = dict(zip(self._user_indices, leaves))
        arrays: list[jax.Array] = []
        bases: dict[int, torch.Tensor] = {}
        for index, state_name in self._arg_plan:
            if state_name is not None:
                arrays.append(self._state_array(state_name))
                continue
            value = inputs[index]
            self._check_input(index, value)
            if isinstance(value, DeviceTensor):
                if self._placement.spmd:
                    raise ExecutionError(
                        f"input '{self._names[index]}' is a DeviceTensor; a program on a mesh takes "
                        "torch tensors and places them by its shardings"
                    )
                arrays.append(value.array)
            else:
                tensor = value if value.is_contiguous() else value.contiguous()
                bases[index] = tensor
                arrays.append(self._put(tensor, index, owned=False))
        try:
            results = self._loaded.execute_sharded(arrays)
            if self._placement.spmd:
                outputs = self._placement.assemble_outputs(self._loaded, results, self._result_shapes)
            else:
                outputs = [shards[0] for shards in results.disassemble_into_single_device_arrays()]
        except Exception as error:
            raise ExecutionError(f"XLA execution failed: {error}") from None
        produced = dict(zip(self._result_keys, outputs))
        call_name = f"in call {self._calls}"
        for index in self._donated_args:
            state_name = self._arg_plan[index][1]
            if state_name is not None:
                self._state[state_name] = None
                self._state_consumed[state_name] = call_name
            elif isinstance(inputs[index], DeviceTensor):
                inputs[index]._consume(call_name)
        arg_tensors: dict[int, Any] = {}
        for index, state_name in self._arg_plan:
            mutation_key = self._mutation_keys[index]
            new_value = produced.get(mutation_key) if mutation_key is not None else None
            if state_name is not None:
                if new_value is not None:
                    self._state[state_name] = new_value
                    self._state_consumed.pop(state_name, None)
                continue
            value = inputs[index]
            if isinstance(value, DeviceTensor):
                if new_value is not None:
                    value._rebind(new_value)
                continue
            if new_value is None:
                arg_tensors[index] = bases[index]
                continue
            value.copy_(self._to_torch(new_value))
            # Views of the new value share the caller's tensor, as in eager;
            # a non-contiguous caller's tensor cannot be the base of the
            # recorded row-major layouts, so they view the new value instead.
            arg_tensors[index] = value if value.is_contiguous() else self._to_torch(new_value)
        return self._assemble_outputs(inputs, arg_tensors, produced)

    def _assemble_outputs(
        self, inputs: dict[int, Any], arg_tensors: dict[int, Any], produced: dict[str, jax.Array]
    ) -> Any:
        torch_results: dict[str, Any] = {}

        def base_tensor(key: str) -> Any:
            kind, index = A.parse_key(key)
            if kind == "output":
                return result(key)
            state_name = self._arg_plan[index][1]
            if state_name is not None:
                return self._to_torch(self._state_array(state_name))
            value = inputs[index]
            return value.to_torch() if isinstance(value, DeviceTensor) else arg_tensors[index]

        def result(key: str) -> Any:
            if key in torch_results:
                return torch_results[key]
            if key in produced:
                value = self._to_torch(produced[key])
            elif key in self._constant_outputs:
                value = self._constant_outputs[key]
            else:
                rebuild = self._rebuilds[key]
                if rebuild.base is None:
                    value = None
                else:
                    base = base_tensor(rebuild.base)
                    same = rebuild.identity and base.dtype == rebuild.dtype
                    value = base if same else _as_view(base, rebuild)
            torch_results[key] = value
            return value

        flat = [result(key) for key in self._output_keys]
        if self._flat_outputs:
            return flat[0] if self._single_output else tuple(flat)
        return pytree.tree_unflatten(flat, self._signature.out_spec)

    def _state_array(self, name: str) -> jax.Array:
        array = self._state[name]
        if array is None or array.is_deleted():
            raise DonatedBufferError(
                f"module state '{name}' was donated {self._state_consumed.get(name, 'earlier')} "
                "and its buffer has been consumed; load_state_dict() to set it again"
            )
        return array

    def _check_input(self, index: int, value: Any) -> None:
        expected_shape, expected_dtype = self._arg_types[index]
        if isinstance(value, torch.Tensor) and value.dtype == expected_dtype and value.shape == expected_shape:
            return
        name = self._names[index]
        if isinstance(value, DeviceTensor):
            if value.dtype == expected_dtype and value.shape == expected_shape:
                return
            shape, dtype = tuple(value.shape), value.dtype
        elif isinstance(value, torch.Tensor):
            shape, dtype = tuple(value.shape), value.dtype
        else:
            raise ExecutionError(f"input '{name}' is {type(value).__name__}, expected a torch.Tensor or DeviceTensor")
        if shape != expected_shape or dtype != expected_dtype:
            raise ExecutionError(
                f"input '{name}' is {dtype} {list(shape)}, but the program was compiled for "
                f"{expected_dtype} {list(expected_shape)}; compile again for the new signature"
            )


def _as_view(base: torch.Tensor, rebuild: _Rebuild) -> torch.Tensor:
    assert rebuild.dtype is not None  # only dead results lack one
    typed = base if base.dtype == rebuild.dtype else base.view(rebuild.dtype)
    return typed.as_strided(rebuild.sizes, rebuild.strides, typed.storage_offset() + rebuild.offset)


_TORCH_DTYPES = {
    "f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
    "ui8": torch.uint8, "i1": torch.bool, "complex<f32>": torch.complex64,
    "complex<f64>": torch.complex128, "ui16": torch.uint16, "ui32": torch.uint32, "ui64": torch.uint64,
}


def _torch_dtype(element_type: ir.Type) -> torch.dtype:
    text = str(element_type)
    if text not in _TORCH_DTYPES:
        raise ExecutionError(f"element type {text} has no torch dtype")
    return _TORCH_DTYPES[text]


def _torch_dtype_of_jax(dtype: Any) -> torch.dtype:
    # jax/numpy dtype names (float32, bfloat16, bool, ...) are torch's names.
    torch_dtype = getattr(torch, str(dtype), None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ExecutionError(f"device array dtype {dtype} has no torch dtype")
    return torch_dtype
