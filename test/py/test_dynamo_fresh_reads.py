"""A ``torch.compile``d function of any backend (``eager``, ``aot_eager``,
``inductor``, ``hloalias``) that reads the model's or the optimizer's
tensors between calls of a compiled training step computes on the calls'
values, as eager's would.  Before, every backend but hloalias's ran on the
host tensors the calls had left stale (``nn.Linear(8, 4)`` after three SGD
steps: outputs off by ~0.9): dynamo traced the stale tensors without
copying, and only the hloalias backend brought its graph inputs in.

Also: a traced forward pre-hook of the module added no guard on how many
slots lag (a recompile whenever that count changed), and a graph copies
nothing when nothing is stale."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import hloalias
from hloalias.runtime import state as state_module
from state_counts import count_copies
from test_training_fresh_reads import Pair, _batches, _close, _step_fn

_HAS_CXX = any(shutil.which(name) for name in (os.environ.get("CXX", "c++"), "g++", "clang++"))

BACKENDS = [
    "eager",
    "aot_eager",
    pytest.param("inductor", marks=pytest.mark.skipif(not _HAS_CXX, reason="inductor on CPU needs a C++ compiler")),
    "hloalias",
]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def test_the_linear_repro_reads_the_steps_parameters() -> None:
    """The report's case: ``nn.Linear`` and SGD, three compiled steps, then
    ``torch.compile(..., backend="eager")`` under ``no_grad``."""
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    reference.load_state_dict(model.state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]

    def step_of(m: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step

    x, y, t = torch.randn(5, 8), torch.randn(5, 4), torch.randn(3, 8)
    train = hloalias.compile_training_step(step_of(model, optimizers[0]), model, optimizers[0], (x, y))
    eager_step = step_of(reference, optimizers[1])
    for _ in range(3):
        train(x, y)
        eager_step(x, y)
    forward = torch.compile(lambda v: model(v), backend="eager")
    with torch.no_grad():
        _close(forward(t), reference(t))


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_calls_between_steps_read_the_steps_values(backend: str) -> None:
    """Rounds of training steps, each followed by two calls of a compiled
    eval forward (the BatchNorm statistics the steps update are read too).
    The first call after steps traced stale tensors, the second fresh ones:
    dynamo's guard on their class makes those two graphs, no more, however
    many rounds and however many slots lag (the second model's steps)."""
    pair = Pair()
    other = Pair()
    x = torch.randn(4, 6)
    forward = torch.compile(lambda v: pair.model(v), backend=backend)
    for round_, batch in enumerate(_batches(4)):
        pair.steps([batch])
        if round_ % 2:
            other.steps([batch])  # more slots lag: no new graph
        for model in (pair.model, pair.eager):
            model.eval()
        with torch.no_grad():
            expected = pair.eager(x)
            for _ in range(2):
                _close(forward(x), expected)
        for model in (pair.model, pair.eager):
            model.train()
    assert _graphs() <= 2 and not counters["graph_break"]
    for p, eager_p in zip(pair.model.parameters(), pair.eager.parameters()):
        _close(p, eager_p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fullgraph_compiled_eval_module_between_steps(backend: str) -> None:
    """``torch.compile(model, fullgraph=True)`` in eval mode, called after
    each step without ``no_grad``: no graph break (fullgraph would refuse
    one), the steps' parameters and statistics."""
    pair = Pair()
    compiled = torch.compile(pair.model, backend=backend, fullgraph=True)
    x = torch.randn(4, 6)
    for batch in _batches(3):
        pair.model.train()
        pair.steps([batch])
        pair.model.eval()
        pair.eager.eval()
        _close(compiled(x).detach(), pair.eager(x).detach())
        pair.eager.train()
    assert not counters["graph_break"]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_read_of_optimizer_state_and_a_submodule_sees_the_steps(backend: str) -> None:
    """Tensors other than a module's forward inputs: a submodule called
    alone, a parameter read bare and the optimizer's ``exp_avg``."""
    pair = Pair()
    pair.steps(_batches(3))

    def read(model: torch.nn.Module, opt: torch.optim.Optimizer, v: torch.Tensor) -> torch.Tensor:
        weight = model.lm_head.weight  # type: ignore[union-attr]
        exp_avg = opt.state[weight]["exp_avg"]
        return model.body(v).sum() + weight.sum() * 2 + torch.linalg.vector_norm(exp_avg)  # type: ignore[operator]

    compiled = torch.compile(read, backend=backend)
    x = torch.randn(4, 6)
    with torch.no_grad():
        _close(compiled(pair.model, pair.opt, x), read(pair.eager, pair.eager_opt, x))
    assert _graphs() == 1 and not counters["graph_break"]


class _Tracking(torch.nn.Module):
    """A buffer every forward updates in place (an input mean, counted)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(6, 3)
        self.register_buffer("seen", torch.zeros(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.mul_(0.5).add_(x.mean(0))
        return self.fc(x - self.seen)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_forward_writes_the_steps_buffer_and_the_next_step_reads_it(backend: str) -> None:
    """A compiled forward between steps updates a buffer the steps update
    too: in place on the steps' value (brought in first), and the next step
    reads that write, as eager's next step does."""
    models = [_Tracking(), _Tracking()]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models]
    steps = [_step_fn(m, o) for m, o in zip(models, optimizers)]
    batches = [(x[:, :6], y) for x, y in _batches(4)]
    train = hloalias.compile_training_step(steps[0], models[0], optimizers[0], batches[0])
    forward = torch.compile(lambda v: models[0](v), backend=backend)
    x = torch.randn(4, 6)
    for batch in batches:
        train(*batch)
        steps[1](*batch)
        with torch.no_grad():
            _close(forward(x), models[1](x))
    for batch in batches[:2]:
        train(*batch)
        steps[1](*batch)
    _close(models[0].seen, models[1].seen)
    for p, eager_p in zip(models[0].parameters(), models[1].parameters()):
        _close(p, eager_p)


def test_a_compiled_graph_copies_only_after_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each tensor is copied in once after a step, by the first call that
    reads it; later calls, and calls before any step, copy nothing."""
    copies = count_copies(monkeypatch)
    pair = Pair()
    forward = torch.compile(lambda v: pair.model.lm_head(v), backend="eager")
    v = torch.randn(2, 8)
    with torch.no_grad():
        forward(v)
    assert copies[0] == 0
    pair.train(*_batches(1)[0])
    with torch.no_grad():
        forward(v)
        assert copies[0] == 2  # lm_head's weight and bias
        forward(v)
        forward(v)
    assert copies[0] == 2
    assert not state_module.is_stale(pair.model.lm_head.weight)
    assert state_module.is_stale(pair.model.body.weight)  # not read: still on the device only


@pytest.mark.parametrize("backend", ["eager", "hloalias"])
def test_only_graphs_that_traced_stale_tensors_bring_their_inputs_in(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph traced on fresh tensors runs as its backend compiled it (no
    check per call; dynamo's guard on the tensors' class keeps stale ones
    out); one traced on stale tensors checks its inputs once per call (the
    hloalias backend's graphs as before, in the backend)."""
    checks = [0]
    original = state_module.bring_up_to_date

    def counted(tensors: Any) -> None:
        checks[0] += 1
        original(tensors)

    monkeypatch.setattr(state_module, "bring_up_to_date", counted)
    pair = Pair()
    forward = torch.compile(lambda v: pair.model.lm_head(v), backend=backend)
    v = torch.randn(2, 8)
    with torch.no_grad():
        forward(v)
        forward(v)
    assert checks[0] == 0 or backend == "hloalias"
    pair.train(*_batches(1)[0])
    before = checks[0]
    with torch.no_grad():
        forward(v)
    assert checks[0] == before + (0 if backend == "hloalias" else 1)
