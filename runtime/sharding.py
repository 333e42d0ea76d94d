"""Several devices: a mesh and partition specs in the torch user's terms,
carried into StableHLO as ``mhlo.sharding`` and compiled by XLA's own SPMD
partitioner through PJRT.

The user's vocabulary is torch_xla's ``mark_sharding``: a :class:`Mesh` of
devices with named axes, and for each tensor a partition spec, one entry
per tensor dimension: a mesh axis name (shard that dimension over the axis),
a tuple of axis names (over their product), or ``None`` (not sharded along
that dimension).  A tensor without a spec is replicated.

What this module decides, in one place:

- every argument of ``@main`` gets an ``mhlo.sharding`` (replicated unless
  given); the new value of mutated state gets its argument's sharding, so
  state stays where it lives and its buffer can be aliased;
- user outputs get no sharding: the partitioner chooses;
- the key random ops draw from (``rng_key``) is replicated on one process's
  devices; on a mesh spanning processes it is one row per device, each
  process placing its own key on its devices, and the program reads row 0
  (``frontend/random_key.py``): every process draws the same bits from
  the key of the process driving the mesh's first device, whatever each
  process's torch generator holds, with no host round trip;
- the compile options (SPMD partitioning over the mesh's devices);
- how torch tensors become sharded device arrays and back (:class:`Placement`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding, PartitionSpec
from torch_mlir import ir

from hloalias.contract import RNG_KEY_KIND, Signature
from hloalias.errors import ShardingError
from hloalias.frontend import random_key
from hloalias.mlir import element_bits, find_main
from hloalias.runtime import distributed, shardy
from hloalias.runtime.jaxlib_private import sharding_impls, xla_client
from hloalias.runtime.ownership import host_copy

SpecEntry: TypeAlias = "str | tuple[str, ...] | None"


@dataclasses.dataclass(frozen=True)
class Mesh:
    """A logical array of devices with named axes, as torch_xla's
    ``Mesh(device_ids, mesh_shape, axis_names)``.

    ``device_ids`` default to the first ``prod(mesh_shape)`` devices of
    ``platform`` (default CPU; on CPU, XLA's forced host device count
    ``--xla_force_host_platform_device_count`` gives several)."""

    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    device_ids: tuple[int, ...] | None = None
    platform: str = "cpu"

    def __post_init__(self) -> None:
        shape = tuple(self.mesh_shape)
        names = tuple(self.axis_names)
        if not shape or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in shape):
            raise ShardingError(f"mesh shape must be positive integers, got {self.mesh_shape!r}")
        if len(names) != len(shape) or any(not isinstance(n, str) or not n for n in names):
            raise ShardingError(
                f"mesh needs one non-empty axis name per dimension: shape {shape}, names {self.axis_names!r}"
            )
        if len(set(names)) != len(names):
            raise ShardingError(f"mesh axis names must be distinct, got {names}")
        object.__setattr__(self, "mesh_shape", shape)
        object.__setattr__(self, "axis_names", names)
        if self.device_ids is not None:
            ids = tuple(self.device_ids)
            if len(ids) != math.prod(shape) or len(set(ids)) != len(ids):
                raise ShardingError(
                    f"mesh of shape {shape} needs {math.prod(shape)} distinct device ids, got {ids}"
                )
            object.__setattr__(self, "device_ids", ids)

    @property
    def size(self) -> int:
        """Number of devices in the mesh."""
        return math.prod(self.mesh_shape)

    def axis_size(self, name: str) -> int:
        """Devices along axis ``name``."""
        return self.mesh_shape[self.axis_names.index(name)]

    def devices(self) -> list[Any]:
        """The mesh's PJRT devices, in mesh order; ShardingError when the
        platform has fewer devices than the mesh needs."""
        try:
            available = jax.devices(self.platform)
        except RuntimeError as error:
            raise ShardingError(f"no devices of platform '{self.platform}': {error}") from None
        by_id = {device.id: device for device in available}
        if self.device_ids is None:
            if len(available) < self.size:
                processes = distributed.process_count()
                where = f" across {processes} processes" if processes > 1 else ""
                raise ShardingError(
                    f"mesh {self.mesh_shape} needs {self.size} devices, but platform "
                    f"'{self.platform}' has {len(available)}{where} (on CPU, set XLA_FLAGS="
                    f"--xla_force_host_platform_device_count=N before jax starts; N devices per process)"
                )
            return list(available[: self.size])
        missing = [i for i in self.device_ids if i not in by_id]
        if missing:
            raise ShardingError(
                f"mesh names device ids {missing} that platform '{self.platform}' does not have "
                f"(it has {sorted(by_id)})"
            )
        return [by_id[i] for i in self.device_ids]

    def jax_mesh(self, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
        """The same mesh as a ``jax.sharding.Mesh`` (over ``devices`` when
        already looked up by :meth:`devices`)."""
        found = self.devices() if devices is None else list(devices)
        return jax.sharding.Mesh(np.array(found, dtype=object).reshape(self.mesh_shape), self.axis_names)


def _normalize_spec(mesh: Mesh, name: str, spec: Any, shape: tuple[int, ...]) -> tuple[SpecEntry, ...]:
    """``spec`` checked against ``mesh`` and a tensor of ``shape``."""
    if spec is None:
        return tuple(None for _ in shape)
    if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence):
        raise ShardingError(
            f"sharding of '{name}' must be a partition spec (a tuple with one entry per dimension), got {spec!r}"
        )
    entries = list(spec)
    if len(entries) != len(shape):
        raise ShardingError(
            f"sharding of '{name}' has {len(entries)} entries, but '{name}' has {len(shape)} dimensions {list(shape)}"
        )
    used: set[str] = set()
    normalized: list[SpecEntry] = []
    for dim, entry in enumerate(entries):
        if entry is None:
            normalized.append(None)
            continue
        axes = (entry,) if isinstance(entry, str) else entry
        if not isinstance(axes, tuple) or not axes or not all(isinstance(a, str) for a in axes):
            raise ShardingError(
                f"sharding of '{name}', dimension {dim}: expected a mesh axis name, a tuple of names "
                f"or None, got {entry!r}"
            )
        for axis in axes:
            if axis not in mesh.axis_names:
                raise ShardingError(
                    f"sharding of '{name}', dimension {dim} names unknown mesh axis '{axis}' "
                    f"(axes: {', '.join(mesh.axis_names)})"
                )
            if axis in used:
                raise ShardingError(f"sharding of '{name}' uses mesh axis '{axis}' twice")
            used.add(axis)
        ways = math.prod(mesh.axis_size(a) for a in axes)
        if shape[dim] % ways:
            raise ShardingError(
                f"sharding of '{name}': dimension {dim} (size {shape[dim]}) is not divisible by "
                f"{ways} (mesh axes {', '.join(axes)})"
            )
        normalized.append(entry if isinstance(entry, str) else tuple(axes))
    return tuple(normalized)


@dataclasses.dataclass(frozen=True)
class ArgumentSharding:
    """One ``@main`` argument's placement."""

    name: str
    spec: tuple[SpecEntry, ...]
    hlo: str  # the mhlo.sharding text
    shape: tuple[int, ...]
    element_bytes: int

    @property
    def replicated(self) -> bool:
        """True when every device holds the whole tensor."""
        return all(entry is None for entry in self.spec)

    def bytes_per_device(self, mesh: Mesh) -> int:
        """Bytes of this tensor each device holds."""
        ways = 1
        for entry in self.spec:
            if entry is not None:
                axes = (entry,) if isinstance(entry, str) else entry
                ways *= math.prod(mesh.axis_size(a) for a in axes)
        return math.prod(self.shape) * self.element_bytes // ways


class Placement:
    """Where a program's buffers live: one device, or a mesh with a
    sharding per ``@main`` argument.  The runtime goes through it for every
    transfer, so a program on several devices runs the same call path."""

    def __init__(self, device: Any, mesh: Mesh | None = None) -> None:
        self.mesh = mesh
        self.devices = mesh.devices() if mesh is not None else [device]
        self.device = self.devices[0]
        self._jax_mesh = mesh.jax_mesh(self.devices) if mesh is not None else None
        self.arguments: dict[int, ArgumentSharding] = {}
        #: True when the mesh spans several processes (runtime/distributed.py);
        #: one device never does (and may not be looked up yet:
        #: ``pjrt.DeferredDevice``).
        self.multiprocess = mesh is not None and distributed.spans_processes(self.devices)
        self._local_devices: list[Any] | None = None
        #: The key argument held one row per device (a mesh spanning
        #: processes, see :func:`plan_shardings`), or None.
        self.key_rows: int | None = None

    @property
    def local_devices(self) -> list[Any]:
        """The mesh's devices this process drives (all of them on one
        process); asked when first read, which looks a deferred device up."""
        if self._local_devices is None:
            self._local_devices = distributed.local_devices(self.devices)
        return self._local_devices

    @property
    def spmd(self) -> bool:
        """True when the program is partitioned over several devices."""
        return self.mesh is not None

    def describe(self, stats_per_device: Mapping[str, Mapping[str, int]]) -> list[str]:
        """Lines for ``Executable.explain()``: the mesh, each argument's
        sharding and bytes per device, XLA's figures per device (none on
        one device)."""
        if self.mesh is None:
            return []
        mesh = self.mesh
        axes = ", ".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.mesh_shape))
        lines = [f"mesh: {axes} on {', '.join(f'{d.platform}:{d.id}' for d in self.devices)}"]
        for index, sharding in sorted(self.arguments.items()):
            spec = "replicated" if sharding.replicated else str(sharding.spec)
            lines.append(f"  arg {index} '{sharding.name}': {spec}, {sharding.bytes_per_device(mesh)} bytes per device")
        per_device = next(iter(stats_per_device.values()))
        lines.append(
            "XLA memory per device: argument {argument_bytes} + output {output_bytes} - alias "
            "{alias_bytes} + temp {temp_bytes} = {total_bytes} bytes".format(**per_device)
        )
        return lines

    def named_sharding(self, arg_index: int) -> NamedSharding:
        """The jax sharding of argument ``arg_index``."""
        return self.sharding_of(self.arguments[arg_index].spec)

    def sharding_of(self, spec: Sequence[SpecEntry]) -> NamedSharding:
        """The jax sharding of a normalized partition spec on this mesh."""
        assert self._jax_mesh is not None
        return NamedSharding(self._jax_mesh, PartitionSpec(*spec))

    def put(self, tensor: torch.Tensor, arg_index: int) -> jax.Array:
        """``tensor`` as the sharded global array of argument ``arg_index``
        (a copy into PJRT-owned buffers, one shard per device)."""
        host = tensor.detach().contiguous()
        if arg_index == self.key_rows:  # this process's key, on each of its devices
            return distributed.put_per_process(host, self.named_sharding(arg_index), len(self.devices))
        if self.multiprocess:  # each process copies its own devices' shards
            return distributed.put_global(host, self.named_sharding(arg_index))
        # Copied shard by shard, never through DLPack: an import of ``host``
        # would die with the call, and its release (torch's deleter, under
        # the GIL) could fall on PJRT's worker as the process exits
        # (ownership.host_copy).  Complete on return: the caller may write
        # ``tensor`` at once.
        return host_copy(distributed._numpy_of(host), self.named_sharding(arg_index))

    def assemble_outputs(self, loaded: Any, shards: Sequence[Any], shapes: Sequence[tuple[int, ...]]) -> list[jax.Array]:
        """The executable's outputs as global arrays, each with the sharding
        XLA chose or was told, from ``shards`` (an execute's results
        disassembled: per output, its per-device arrays; read, never
        consumed, so a caller cut short can assemble them again)."""
        outputs = []
        for per_device, op_sharding, shape in zip(shards, loaded.get_output_shardings(), shapes):
            sharding = sharding_impls.GSPMDSharding(
                tuple(self.devices), xla_client.HloSharding.from_proto(op_sharding)
            )
            outputs.append(jax.make_array_from_single_device_arrays(shape, sharding, per_device))
        return outputs

    def compile_options(self, sharded_results: Sequence[bool]) -> Any:
        """XLA compile options: SPMD over the mesh's devices; results without
        a sharding (``sharded_results``, one per result) get the
        partitioner's choice."""
        options = xla_client.CompileOptions()
        build = options.executable_build_options
        build.num_replicas = 1
        build.num_partitions = len(self.devices)
        build.use_spmd_partitioning = True
        # Shardy when for_xla can write the module's shardings as sdy (it
        # turns this off when it cannot): GSPMD is deprecated in XLA.
        build.use_shardy_partitioner = shardy.available()
        build.device_assignment = xla_client.DeviceAssignment.create(
            np.array([d.id for d in self.devices]).reshape(1, len(self.devices))
        )
        build.allow_spmd_sharding_propagation_to_output = [not s for s in sharded_results] or [True]
        return options


    def for_xla(self, text: str, options: Any) -> str:
        """``text`` (the final module as XLA takes it) with Shardy's
        annotations when ``options`` ask for Shardy (:mod:`hloalias.runtime.shardy`);
        when the module has shardings it cannot translate, ``text`` as it
        is and ``options`` switched to GSPMD."""
        build = options.executable_build_options
        if self.mesh is None or not build.use_shardy_partitioner:
            return text
        specs = {("".join(a.hlo.split()), len(a.spec)): a.spec for a in self.arguments.values()}
        converted = shardy.to_shardy(text, list(zip(self.mesh.axis_names, self.mesh.mesh_shape)), specs)
        if converted is None:
            build.use_shardy_partitioner = False
            return text
        return converted


def key_per_device(placement: Placement) -> bool:
    """Whether the key random ops draw from is held one row per device
    (the mesh spans processes, whose torch generators may differ) rather
    than replicated.  bench/mesh_key.py measures the replicated form on a
    mesh spanning processes by replacing this."""
    return placement.multiprocess


def plan_shardings(
    program: Any, mesh: Mesh, shardings: Mapping[str | int, Any] | None, device: Any
) -> Placement:
    """Validate ``shardings`` (keys: state FQNs, user-input names, or
    user-input positions) against ``program`` and ``mesh``; write
    ``mhlo.sharding`` on every argument of ``@main`` and on the new value of
    each mutated argument; return the placement.  Raises ShardingError
    naming the culprit before anything is changed."""
    placement = Placement(device, mesh)
    arguments = program.signature.arguments
    user_inputs = program.signature.user_input_indices()
    by_name: dict[str, int] = {}
    for argument in arguments:
        by_name.setdefault(argument.name, argument.index)  # the first of a repeated name
    requested: dict[int, Any] = {}
    for key, spec in (shardings or {}).items():
        if isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key < len(user_inputs):
                raise ShardingError(
                    f"shardings names user input {key}, but the program has {len(user_inputs)} user inputs"
                )
            index = user_inputs[key]
        elif isinstance(key, str):
            if key not in by_name:
                known = ", ".join(a.name for a in arguments)
                raise ShardingError(f"shardings names unknown tensor '{key}' (known: {known})")
            index = by_name[key]
        else:
            raise ShardingError(f"shardings keys are tensor names or input positions, got {key!r}")
        if index in requested:
            raise ShardingError(f"'{arguments[index].name}' is given two shardings")
        if arguments[index].kind == RNG_KEY_KIND:
            raise ShardingError(
                f"shardings names '{key}', the key the program's random ops draw from: the runtime "
                "places it (replicated: every device draws from the whole key; on a mesh spanning processes, "
                "one row per device, and every device reads the first)"
            )
        requested[index] = spec

    module = program.torch_mlir_module
    keys = [argument.index for argument in arguments if argument.kind == RNG_KEY_KIND]
    if keys and key_per_device(placement):
        # Processes may be seeded differently: a replicated key would be
        # a different value in each (XLA assumes it the same).
        random_key.read_first_row_key(module, mesh.size)
        placement.key_rows = keys[0]
    with module.context:
        main = find_main(module)
        arg_types = [ir.RankedTensorType(a.type) for a in main.arguments]
        for argument in arguments:
            tensor_type = arg_types[argument.index]
            shape = tuple(tensor_type.shape)
            if argument.index == placement.key_rows:
                normalized: tuple[SpecEntry, ...] = (mesh.axis_names, None)  # row i on the mesh's device i
            else:
                normalized = _normalize_spec(mesh, argument.name, requested.get(argument.index), shape)
            hlo = str(placement.sharding_of(normalized)._to_xla_hlo_sharding(len(shape)))
            element_bytes = max(8, element_bits(tensor_type.element_type)) // 8
            placement.arguments[argument.index] = ArgumentSharding(argument.name, normalized, hlo, shape, element_bytes)
        # Through the contract's records: they write mhlo.sharding canonically.
        contract = Signature.read(main)
        canonical = {index: "".join(sharding.hlo.split()) for index, sharding in placement.arguments.items()}
        args = tuple(dataclasses.replace(arg, sharding=canonical[i]) for i, arg in enumerate(contract.args))
        results = tuple(
            dataclasses.replace(result, sharding=canonical[result.mutates])
            if result.mutates is not None
            else result
            for result in contract.results
        )
        dataclasses.replace(contract, args=args, results=results).write(main)
    return placement


def result_shardings(module: Any) -> list[bool]:
    """For each result of the final ``@main``: whether it has a sharding."""
    with module.context:
        return [r.sharding is not None for r in Signature.read(find_main(module)).results]
