"""One process of test_distributed.py's runs: started by
``python -m hloalias.tools.launch -n 2 --devices 2`` (2 processes x 2 CPU
devices), it runs the programs below on a mesh over all 4 devices and
writes what it saw to ``OUT/rank-K.pt`` for the test to compare with a
single-process run.  The models, batches and steps are defined here once,
for the workers and for the test's reference.

``worker.py train OUT``: data-parallel and tensor-parallel training steps,
a tensor-parallel decode step, per-device bytes, a sharded checkpoint of
the tensor-parallel step (``OUT/ckpt``) and a save over it that process 1
cannot write, and the misuses (initialize
twice, a mesh larger than the devices, processes compiling different
programs).  ``worker.py load OUT``: a fresh tensor-parallel step loads
``OUT/ckpt`` and takes one more step.  ``worker.py random OUT``: each
process seeds torch differently (:func:`random_seed`) and runs dropout on
replicated data and a data-parallel training step with dropout
(replicated parameters)."""

from __future__ import annotations

import math
import sys
import traceback
from pathlib import Path
from typing import Any, TypeVar

import torch

STEPS = 3
WIDTH, HIDDEN, BATCH = 16, 32, 8


class MLP(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(WIDTH, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Decode(torch.nn.Module):
    """One attention decode step writing its key/value into a cache held as
    buffers, heads sharded over the mesh."""

    def __init__(self, heads: int = 4, length: int = 8, dim: int = 8) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.q = torch.nn.Linear(heads * dim, heads * dim, bias=False)
        self.k = torch.nn.Linear(heads * dim, heads * dim, bias=False)
        self.v = torch.nn.Linear(heads * dim, heads * dim, bias=False)
        self.heads, self.dim = heads, dim
        self.register_buffer("k_cache", torch.zeros(heads, length, dim))
        self.register_buffer("v_cache", torch.zeros(heads, length, dim))

    def forward(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        q = self.q(token).view(self.heads, 1, self.dim)
        k = self.k(token).view(self.heads, 1, self.dim)
        v = self.v(token).view(self.heads, 1, self.dim)
        self.k_cache.index_copy_(1, position, k)
        self.v_cache.index_copy_(1, position, v)
        scores = q @ self.k_cache.transpose(1, 2) / math.sqrt(self.dim)
        return (scores.softmax(-1) @ self.v_cache).reshape(1, -1)


class Accumulator(torch.nn.Module):
    """A bf16 buffer updated in place, sharded over the mesh."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.arange(32, dtype=torch.bfloat16).reshape(8, 4) / 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x)
        return self.total * 3


class Wide(torch.nn.Module):
    """An int64 and a float64 buffer updated in place, sharded over the mesh,
    holding values 32 bits cannot (``wide_inputs``)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.arange(1, 33, dtype=torch.int64).reshape(8, 4) * (2**40 + 7))
        self.register_buffer("total", torch.arange(1, 33, dtype=torch.float64).reshape(8, 4) * (1 + 2**-40))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.count.add_(x)
        self.total.mul_(y)
        return self.count * 3, self.total + 0, x * 5


def wide_inputs(count: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [
        (torch.arange(32, dtype=torch.int64).reshape(8, 4) * (2**41 + 3 * i),
         torch.full((8, 4), 1 + 2**-40 * (i + 1), dtype=torch.float64))
        for i in range(count)
    ]


def bf16_inputs(count: int = 2) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(13)
    return [torch.randn(8, 4, generator=generator).to(torch.bfloat16) for _ in range(count)]


def batches(count: int = STEPS + 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batches, the same in every process."""
    generator = torch.Generator().manual_seed(7)
    return [
        (torch.randn(BATCH, WIDTH, generator=generator), torch.randn(BATCH, WIDTH, generator=generator))
        for _ in range(count)
    ]


def tokens(count: int = 3) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    return [torch.randn(1, 32, generator=generator) for _ in range(count)]


_M = TypeVar("_M", bound=torch.nn.Module)


def _with_adam(model: _M) -> tuple[_M, torch.optim.Optimizer, Any]:
    """``model``, its Adam and the step function."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return model, optimizer, step


def trainer(seed: int = 0) -> tuple[MLP, torch.optim.Optimizer, Any]:
    """A model, its Adam and the step function."""
    return _with_adam(MLP(seed))


DATA_PARALLEL = {0: ("dp", None), 1: ("dp", None)}
TENSOR_PARALLEL = {
    0: ("dp", None), 1: ("dp", None),
    "fc1.weight": ("tp", None), "fc1.bias": ("tp",),  # column parallel
    "fc2.weight": (None, "tp"),  # row parallel
}


class DroppedMLP(MLP):
    """:class:`MLP` with dropout between its layers (train mode)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.dropout(torch.relu(self.fc1(x)), 0.5, training=self.training)
        return self.fc2(hidden)


def dropped_trainer() -> tuple[DroppedMLP, torch.optim.Optimizer, Any]:
    """:func:`trainer`'s step on :class:`DroppedMLP`."""
    return _with_adam(DroppedMLP())


def dropout(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True)


def random_seed(rank: int) -> int:
    """The seed process ``rank`` gives torch in ``random`` mode: different
    in every process (as when each rank shuffles its own data)."""
    return 100 + rank


def _error(action: Any) -> str:
    """The HloaliasError ``action()`` raises, as 'Type: message' ('' if none)."""
    import hloalias

    try:
        action()
    except hloalias.HloaliasError as error:
        return f"{type(error).__name__}: {error}"
    return ""


def train(out: Path) -> dict[str, Any]:
    import hloalias

    report: dict[str, Any] = {"initialize_twice": _error(hloalias.distributed.initialize)}
    dp_mesh = hloalias.Mesh((4,), ("dp",))
    mesh_2d = hloalias.Mesh((2, 2), ("dp", "tp"))
    data = batches()

    model, optimizer, step = trainer()
    dp = hloalias.compile_training_step(step, model, optimizer, data[0], mesh=dp_mesh, shardings=DATA_PARALLEL)
    report["dp_losses"] = [float(dp(x, y)) for x, y in data[:STEPS]]
    report["dp_state"] = dp.state_dict()
    report["dp_bytes"] = dp.executable.memory_stats_per_device
    report["dp_aliases"] = len(dp.aliases)

    model, optimizer, step = trainer()
    tp = hloalias.compile_training_step(step, model, optimizer, data[0], mesh=mesh_2d, shardings=TENSOR_PARALLEL)
    report["tp_losses"] = [float(tp(x, y)) for x, y in data[:STEPS]]
    report["tp_state"] = tp.state_dict()
    report["tp_bytes"] = tp.executable.memory_stats_per_device
    weight = tp.executable._slots["param.fc1.weight"].array
    report["tp_local_shard_shapes"] = [tuple(s.data.shape) for s in weight.addressable_shards]
    hloalias.checkpoint.save(tp, out / "ckpt")
    # A save of the next step's state that process 1 cannot write (a full
    # disk): every process raises, and OUT/ckpt stays the one above whole.
    tp(*data[STEPS])
    report["failed_save"] = _save_with_process_1_failing(tp, out / "ckpt")
    report["beside_ckpt"] = sorted(p.name for p in out.iterdir() if p.name.startswith(".ckpt"))

    forward = hloalias.compile(MLP().eval(), (data[0][0],), mesh=mesh_2d, shardings={
        "fc1.weight": ("tp", None), "fc1.bias": ("tp",), "fc2.weight": (None, "tp"), "x": ("dp", None),
    })
    report["forward"] = forward(data[0][0])
    report["forward_bytes"] = forward.memory_stats_per_device

    decode = Decode()
    tp_mesh = hloalias.Mesh((4,), ("tp",))
    shardings = {"k_cache": ("tp", None, None), "v_cache": ("tp", None, None)}
    decoder = hloalias.compile(decode, (tokens()[0], torch.tensor([0])), mesh=tp_mesh, shardings=shardings)
    report["decode"] = [decoder(token, torch.tensor([i])) for i, token in enumerate(tokens())]
    report["decode_state"] = decoder.state_dict()
    report["decode_bytes"] = decoder.memory_stats_per_device
    # The module's own tensors: a read would gather (a collective), so
    # without write_back() in every process it is refused, never stale.
    report["decode_bare_read"] = _error(lambda: decode.k_cache * 1)
    report["decode_module_state_dict"] = _error(decode.state_dict)
    report["decode_eager_forward"] = _error(lambda: decode(tokens()[0], torch.tensor([0])))
    from hloalias.runtime.state import is_stale

    report["decode_stale_after_refusals"] = is_stale(decode.v_cache)
    decoder.write_back()
    report["decode_written_back"] = {"k_cache": decode.k_cache * 1, "v_cache": decode.state_dict()["v_cache"]}

    accumulator = hloalias.compile(
        Accumulator(), (bf16_inputs()[0],), mesh=dp_mesh, shardings={"total": ("dp", None), "x": ("dp", None)}
    )
    report["bf16"] = [accumulator(x) for x in bf16_inputs()]
    report["bf16_state"] = accumulator.state_dict()

    wide = Wide()
    wide_exe = hloalias.compile(wide, wide_inputs()[0], mesh=dp_mesh, shardings={
        "count": ("dp", None), "total": ("dp", None), "x": ("dp", None), "y": (None, None),
    })
    report["wide"] = [wide_exe(x, y) for x, y in wide_inputs()]
    report["wide_state"] = wide_exe.state_dict()
    wide_exe.write_back()
    report["wide_written_back"] = {"count": wide.count.clone(), "total": wide.total.clone()}

    report["mesh_too_large"] = _error(lambda: hloalias.compile(
        MLP().eval(), (data[0][0],), mesh=hloalias.Mesh((8,), ("dp",))
    ))
    # Process 1 compiles a program for another batch size: both refuse.
    rows = 4 if hloalias.distributed.process_index() == 0 else 8
    report["different_program"] = _error(lambda: hloalias.compile(
        MLP().eval(), (torch.randn(rows, WIDTH),), mesh=dp_mesh, shardings={"x": ("dp", None)}
    ))
    return report


def _save_with_process_1_failing(target: Any, directory: Path) -> str:
    """The error ``checkpoint.save`` raises when process 1's disk is full."""
    import errno
    import os

    import hloalias

    real = torch.save

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if hloalias.distributed.process_index() == 1:
        torch.save = full_disk
    try:
        hloalias.checkpoint.save(target, directory)
    except Exception as error:  # process 1's own OSError included
        return f"{type(error).__name__}: {error}"
    finally:
        torch.save = real
    return ""


def load(out: Path) -> dict[str, Any]:
    import hloalias

    model, optimizer, step = trainer(seed=5)  # other weights: the checkpoint must replace them
    data = batches()
    tp = hloalias.compile_training_step(
        step, model, optimizer, data[0], mesh=hloalias.Mesh((2, 2), ("dp", "tp")), shardings=TENSOR_PARALLEL
    )
    hloalias.checkpoint.load(tp, out / "ckpt")
    report: dict[str, Any] = {"loaded_state": tp.state_dict()}
    report["next_loss"] = float(tp(*data[STEPS]))
    return report


def random(out: Path) -> dict[str, Any]:
    """Random ops on the mesh, each process's torch seeded differently."""
    import hloalias

    seed = random_seed(hloalias.distributed.process_index())
    mesh = hloalias.Mesh((4,), ("dp",))
    x = torch.ones(8, 64)
    report: dict[str, Any] = {}
    dropped = hloalias.compile(dropout, (x,), mesh=mesh)  # x replicated
    report["explain"] = dropped.explain()
    for run in range(2):  # the same seed again: the same draws
        torch.manual_seed(seed)
        report[f"dropout_{run}"] = [dropped(x), dropped(x)]
    report["rng_state_after_dropout"] = torch.get_rng_state()
    data = batches()
    model, optimizer, step = dropped_trainer()
    train = hloalias.compile_training_step(step, model, optimizer, data[0], mesh=mesh, shardings=DATA_PARALLEL)
    torch.manual_seed(seed)
    report["losses"] = [float(train(x, y)) for x, y in data[:STEPS]]
    report["state"] = train.state_dict()  # replicated: this process's own copy
    report["rng_state_after_training"] = torch.get_rng_state()
    return report


def main() -> int:
    mode, out = sys.argv[1], Path(sys.argv[2])
    import hloalias

    hloalias.distributed.initialize()
    rank = hloalias.distributed.process_index()
    try:
        report = {"train": train, "load": load, "random": random}[mode](out)
    except BaseException:
        traceback.print_exc()
        return 1
    report["rank"] = rank
    report["process_count"] = hloalias.distributed.process_count()
    torch.save(report, out / f"{mode}-rank-{rank}.pt")
    print(f"{mode} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
