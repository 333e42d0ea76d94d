"""A bare read of module state that calls of a program on a mesh (not a
training step: ``hloalias.compile(module, mesh=...)``) updated in place
(BatchNorm's running statistics in train mode, a KV cache written with
``index_copy_`` and slice assignment, a counter ``self.calls += 1``) returns
the calls' values, as eager's would, with no ``write_back()``: the tensor,
``.numpy()``, ``torch.save``, ``state_dict()``, a copy of the module, an
eager forward.  Before, each returned the value of the last copy (compile
time, here: a counter of 0, a cache of zeros).  The read gathers the
sharded buffer (``ownership.array_to_torch``), and the next call continues
from the device's value (nothing applied twice).

Calls nobody reads between copy nothing, nor do hloalias's own reads
(``Executable.state_dict()``).  Across processes a read is refused (the
gather is a collective): test_distributed.py, in two real processes."""

from __future__ import annotations

import copy
import gc
import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import hloalias
from hloalias import Mesh
from hloalias.runtime import state as state_module
from state_counts import count_copies

TOL = 1e-5
SHARDINGS = {"x": ("dp", None), "cache": (None, "dp", None), "last": ("dp", None)}
# The input replicated: one row per device as well in
# test_a_read_gathers_every_shard_of_one_row_per_device.
STATE_SHARDINGS = {name: spec for name, spec in SHARDINGS.items() if name != "x"}


class Stateful(torch.nn.Module):
    """Buffers a forward updates in place: BatchNorm's statistics, a call
    counter (int64), a cache written at a position, a slice assignment."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("cache", torch.zeros(2, 8, 8))
        self.register_buffer("last", torch.zeros(4, 8))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.norm(self.lin(x))
        self.cache.index_copy_(1, position, h[:2].unsqueeze(1))
        self.last[:2] = h[:2] * self.calls
        return h + self.cache.sum(1).mean(0) + self.last.mean(0)


def _inputs(count: int, start: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(start + 1)
    return [(torch.randn(4, 8, generator=generator), torch.tensor([start + i])) for i in range(count)]


class Pair:
    """An eager module, and a program on a mesh compiled from a copy of it."""

    def __init__(self, devices: int = 2, shardings: dict[str, Any] = SHARDINGS) -> None:
        self.eager, self.model = Stateful(), Stateful()
        example = _inputs(1)[0]
        self.exe = hloalias.compile(self.model, example, mesh=Mesh((devices,), ("dp",)), shardings=shardings)

    def calls(self, inputs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for x, position in inputs:
            with torch.no_grad():  # the eager buffers get no autograd history
                expected = self.eager(x, position)
            _close(self.exe(x, position), expected)


@pytest.fixture
def called() -> Pair:
    pair = Pair()
    pair.calls(_inputs(3))
    return pair


def _close(actual: Any, expected: Any) -> None:
    torch.testing.assert_close(torch.as_tensor(actual), torch.as_tensor(expected), rtol=TOL, atol=TOL)


def _saved(value: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


BARE_READS: dict[str, Callable[[torch.nn.Module], Any]] = {
    "attribute, then an op": lambda m: m.cache * 1,
    "counter item": lambda m: m.calls.item(),
    "counter + 0": lambda m: m.calls + 0,
    "running_mean clone": lambda m: m.norm.running_mean.clone(),
    "num_batches_tracked": lambda m: m.norm.num_batches_tracked.item(),
    ".numpy()": lambda m: m.norm.running_var.numpy().copy(),
    "np.asarray": lambda m: np.asarray(m.last).copy(),
    "tolist": lambda m: m.last.tolist(),
    "torch.save of the buffer": lambda m: _saved(m.cache),
    "state_dict()": lambda m: torch.cat([v.flatten().double() for v in m.state_dict().values()]),
    "buffers()": lambda m: torch.cat([b.flatten().double() for b in m.buffers()]),
    "torch.save of state_dict()": lambda m: _saved(m.state_dict())["norm.running_var"],
    "copy.deepcopy of the module": lambda m: copy.deepcopy(m).cache,
    "pickle of the module": lambda m: pickle.loads(pickle.dumps(m)).last,
    "torch.save of the module": lambda m: _saved(m).calls,
    "parameter": lambda m: m.lin.weight.detach().clone(),
}


@pytest.mark.parametrize("read", list(BARE_READS))
def test_a_bare_read_after_mesh_calls_returns_eager_values(called: Pair, read: str) -> None:
    _close(BARE_READS[read](called.model), BARE_READS[read](called.eager))


@pytest.mark.parametrize("read", ["attribute, then an op", "state_dict()", "torch.save of the buffer", "counter item"])
def test_calls_after_a_read_continue_from_the_device_values(called: Pair, read: str) -> None:
    """No update is applied twice, nor lost: the read copies the calls'
    values in and records that the two agree, so the next call keeps its
    own buffer (not a re-upload of the read value on top of it)."""
    BARE_READS[read](called.model)
    called.calls(_inputs(2, start=3))
    for name, value in called.eager.state_dict().items():
        _close(called.model.state_dict()[name], value)
    assert called.model.calls.item() == 5


@pytest.mark.parametrize("devices", [2, 4])
def test_a_read_gathers_every_shard(devices: int) -> None:
    pair = Pair(devices, STATE_SHARDINGS)
    pair.calls(_inputs(3))
    array = pair.exe._slots["cache"].array
    assert array is not None and len(array.sharding.device_set) == devices
    assert array.addressable_shards[0].data.shape == (2, 8 // devices, 8)
    _close(pair.model.cache, pair.eager.cache)
    _close(pair.model.last, pair.eager.last)


def test_a_read_gathers_every_shard_of_one_row_per_device() -> None:
    """The input's 4 rows sharded 4 ways: ``self.last[:2] = h[:2] * calls``
    is a scatter with int64 indices, on which XLA's SPMD partitioner
    aborted the process ("Check failed: ShapeUtil::IsScalarWithElementType",
    as jax.jit with x64 does); the mesh pipeline narrows them
    (``narrow-scatter-indices``)."""
    pair = Pair(4, SHARDINGS)
    pair.calls(_inputs(3))
    _close(pair.model.cache, pair.eager.cache)
    _close(pair.model.last, pair.eager.last)
    _close(pair.model.calls, pair.eager.calls)


def test_an_edit_after_a_read_is_read_by_the_next_call(called: Pair) -> None:
    """The user's in-place edit of the read tensor is the newest value:
    the next call uploads it, as eager's next forward reads it."""
    with torch.no_grad():
        for model in (called.model, called.eager):
            model.cache.mul_(0.5)
            model.calls.add_(10)
    called.calls(_inputs(2, start=3))
    _close(called.model.cache, called.eager.cache)
    assert called.model.calls.item() == called.eager.calls.item() == 15


def test_an_eager_forward_between_mesh_calls_sees_and_extends_their_state(called: Pair) -> None:
    """An eager forward of the compiled module reads the calls' state (its
    pre-hook copies it in) and updates it in place; the next call reads
    that update."""
    x, position = _inputs(1, start=7)[0]
    with torch.no_grad():
        _close(called.model(x, position), called.eager(x, position))
    for name, value in called.eager.state_dict().items():
        _close(called.model.state_dict()[name], value)
    called.calls(_inputs(2, start=3))
    # Not BatchNorm's running statistics: its kernel updates them without
    # bumping their version counter, so no program (one device or a mesh)
    # sees an eager forward's update of them.
    for name in ("calls", "cache", "last", "norm.num_batches_tracked"):
        _close(called.model.get_buffer(name), called.eager.get_buffer(name))


def test_calls_nobody_reads_between_copy_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    copies = count_copies(monkeypatch)
    reads = state_module._STALE_READS[0]
    pair = Pair()
    pair.calls(_inputs(4))
    assert copies[0] == 0 and state_module._STALE_READS[0] == reads
    assert state_module.is_stale(pair.model.cache) and state_module.is_stale(pair.model.calls)
    # Metadata and hloalias's own reads copy nothing and leave them stale.
    assert pair.model.cache.shape == (2, 8, 8) and pair.model.calls.dtype == torch.int64
    assert pair.model.cache.size(1) == 8 and pair.model.last.dim() == 2 and pair.model.cache.is_contiguous()
    _close(pair.exe.state_dict()["cache"], pair.eager.cache)
    assert "mesh: dp=2" in pair.exe.explain()
    assert copies[0] == 0 and state_module.is_stale(pair.model.cache)
    pair.model.cache.sum()
    assert copies[0] == 1  # that tensor only
    assert not state_module.is_stale(pair.model.cache) and state_module.fresh_type(pair.model.cache) is torch.Tensor
    assert state_module.is_stale(pair.model.last)
    pair.calls(_inputs(2, start=4))
    assert copies[0] == 1


def test_a_read_of_state_a_mesh_program_only_reads_copies_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parameters the program reads but never writes do not lag: never
    marked, never copied."""
    copies = count_copies(monkeypatch)
    pair = Pair()
    pair.calls(_inputs(2))
    assert not state_module.is_stale(pair.model.lin.weight)
    pair.model.lin.weight.sum()
    assert copies[0] == 0


def test_two_mesh_programs_of_one_module_each_bring_their_state_in() -> None:
    """Each program on a mesh keeps its state in a group of its own: a
    read after calls of the second sees its values, and the first then
    reads them as torch's edits."""
    pair = Pair()
    pair.calls(_inputs(2))
    other = hloalias.compile(pair.model, _inputs(1)[0], mesh=Mesh((4,), ("dp",)), shardings=STATE_SHARDINGS)
    for x, position in _inputs(2, start=2):
        with torch.no_grad():
            expected = pair.eager(x, position)
        _close(other(x, position), expected)
    _close(pair.model.cache, pair.eager.cache)
    pair.calls(_inputs(1, start=4))
    for name, value in pair.eager.state_dict().items():
        _close(pair.model.state_dict()[name], value)


def test_a_dead_mesh_program_leaves_no_hooks() -> None:
    """Each program on a mesh adds its group's hooks to the module; they
    go with the program (compiling again and again keeps none)."""
    model = Stateful()
    before = (len(model._forward_pre_hooks), len(model._state_dict_pre_hooks))
    exe = hloalias.compile(model, _inputs(1)[0], mesh=Mesh((2,), ("dp",)), shardings=SHARDINGS)
    exe(*_inputs(1)[0])
    assert (len(model._forward_pre_hooks), len(model._state_dict_pre_hooks)) == (before[0] + 1, before[1] + 1)
    del exe
    gc.collect()
    assert (len(model._forward_pre_hooks), len(model._state_dict_pre_hooks)) == before


def test_a_mesh_program_reads_what_a_single_device_program_of_the_module_left() -> None:
    """A program on one device and one on a mesh of one module: the mesh
    program's call first brings in what the other's calls left (its
    tensors are stale), with no read in between."""
    eager, model = Stateful(), Stateful()
    single = hloalias.compile(model, _inputs(1)[0])
    mesh = hloalias.compile(model, _inputs(1)[0], mesh=Mesh((2,), ("dp",)), shardings=SHARDINGS)
    for index, (x, position) in enumerate(_inputs(4)):
        with torch.no_grad():
            expected = eager(x, position)
        _close((single if index % 2 == 0 else mesh)(x, position), expected)
    assert model.calls.item() == 4
    for name, value in eager.state_dict().items():
        _close(model.state_dict()[name], value)
