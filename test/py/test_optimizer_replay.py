"""The optimizer update traced once per class of parameters
(:mod:`hloalias.frontend.optimizer_replay`, issue 26: a training step's
compile time): the captured graph holds the same operators in the same
order as the full trace, the compiled step computes the same bits over
several steps (exact: no tolerance), and what the replay does not cover
is traced in full."""

from __future__ import annotations

import importlib

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from bitwise import assert_bitwise
from hloalias.frontend import optimizer_exact, optimizer_replay
from hloalias.frontend import training as frontend_training
from hloalias.frontend.training import capture_training_step

STEPS = 3
_ADAM = importlib.import_module("torch.optim.adam")  # torch.optim deletes its submodules' names
_SGD = importlib.import_module("torch.optim.sgd")


def _groups(params: Any, **second: Any) -> list[dict[str, Any]]:
    params = list(params)
    return [{"params": params[:2]}, {"params": params[2:], **second}]


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adam_amsgrad_wd_maximize": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, amsgrad=True, maximize=True),
    "adamw_two_groups": lambda p: torch.optim.AdamW(
        _groups(p, lr=3e-2, weight_decay=0.3, betas=(0.5, 0.95), amsgrad=True), lr=1e-2
    ),
    "sgd_momentum_nesterov_wd": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.01),
    "sgd_plain": lambda p: torch.optim.SGD(p, lr=1e-2),
    "sgd_two_groups_maximize": lambda p: torch.optim.SGD(
        _groups(p, momentum=0.5, maximize=True, lr=2e-2), lr=1e-2, momentum=0.9
    ),
    "adamw_foreach_false": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False, weight_decay=0.05),
}


class _Model(torch.nn.Module):
    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 16)
        self.second = torch.nn.Linear(16, 4)
        self.scale = torch.nn.Parameter(torch.randn(4))
        if transposed:  # a non-contiguous parameter: not covered by the replay
            self.second.weight = torch.nn.Parameter(torch.randn(16, 4).t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x))) * self.scale


def _problem(make_optimizer: Callable[[Any], torch.optim.Optimizer], dtype: torch.dtype, transposed: bool) -> Any:
    torch.manual_seed(0)
    model = _Model(transposed).to(dtype)
    optimizer = make_optimizer(model.parameters())
    generator = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(6, 8, generator=generator, dtype=dtype), torch.randn(6, 4, generator=generator, dtype=dtype))
        for _ in range(STEPS)
    ]

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return model, optimizer, step, batches


def _compiled_run(name: str, dtype: torch.dtype = torch.float32, transposed: bool = False) -> Any:
    hloalias.clear_cache()
    model, optimizer, step, batches = _problem(OPTIMIZERS[name], dtype, transposed)
    train = hloalias.compile_training_step(step, model, optimizer, batches[0])
    losses = [train(x, y) for x, y in batches]
    state = train.state_dict()
    return losses, state["model"], state["optimizer"]["state"]


def _targets(name: str, dtype: torch.dtype = torch.float32, transposed: bool = False) -> list[str]:
    model, optimizer, step, batches = _problem(OPTIMIZERS[name], dtype, transposed)
    graph = capture_training_step(step, model, optimizer, batches[0]).exported.graph
    return [str(n.target) for n in graph.nodes if n.op == "call_function"]


def _kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of parameters each call of the kernels gets (Adam's:
    hloalias's eager formula, frontend/optimizer_exact.py)."""
    calls: list[int] = []
    for module, name in ((optimizer_exact, "eager_adam"), (_SGD, "_single_tensor_sgd")):
        kernel = getattr(module, name)

        def counted(*args: Any, _kernel: Any = kernel, **kwargs: Any) -> Any:
            calls.append(len(args[0]))
            return _kernel(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_update_is_traced_once_per_class(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _kernel_calls(monkeypatch)
    _targets(name)
    # 5 parameters; a class per param group (one dtype, all contiguous).
    groups = 2 if "groups" in name else 1
    assert calls == [1] * groups


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_graph_is_the_full_traces(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same operators in the same order as tracing every update."""
    replayed = _targets(name)
    assert "hloalias.optimizer_update.default" not in replayed
    monkeypatch.setattr(frontend_training, "REPLAY_OPTIMIZER", False)
    assert replayed == _targets(name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_steps_are_bitwise_the_full_traces(
    name: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    replayed = _compiled_run(name, dtype)
    monkeypatch.setattr(frontend_training, "REPLAY_OPTIMIZER", False)
    assert_bitwise(replayed, _compiled_run(name, dtype))


@pytest.mark.parametrize("name", ["adamw", "adam_amsgrad_wd_maximize", "sgd_momentum_nesterov_wd"])
def test_bfloat16_steps_are_bitwise_the_full_traces(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 Adam traces the reference ``lerp`` (a 0-d ``empty_strided``
    in the update): still replayed, still the same bits."""
    calls = _kernel_calls(monkeypatch)
    replayed = _compiled_run(name, torch.bfloat16)
    assert calls == [1]
    monkeypatch.setattr(frontend_training, "REPLAY_OPTIMIZER", False)
    assert_bitwise(replayed, _compiled_run(name, torch.bfloat16))


def test_non_contiguous_parameter_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _kernel_calls(monkeypatch)
    replayed = _targets("adamw", transposed=True)
    assert calls == [5]  # the kernel itself, on every parameter
    monkeypatch.setattr(frontend_training, "REPLAY_OPTIMIZER", False)
    assert replayed == _targets("adamw", transposed=True)
    monkeypatch.undo()
    replayed_run = _compiled_run("adamw", transposed=True)
    monkeypatch.setattr(frontend_training, "REPLAY_OPTIMIZER", False)
    assert_bitwise(replayed_run, _compiled_run("adamw", transposed=True))


def test_update_that_is_not_shape_generic_is_traced_again_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """A class's update refused after the trace: the step is traced again
    without replay (same graph, same bits)."""
    refusals = []

    def refuse(*args: Any) -> None:
        refusals.append(args)
        raise optimizer_replay.ReplayRefused("test")

    monkeypatch.setattr(optimizer_replay, "_check_template", refuse)
    monkeypatch.setattr(optimizer_replay, "_REFUSED", set())
    traces = []
    capture = frontend_training._capture
    monkeypatch.setattr(frontend_training, "_capture", lambda *args: traces.append(args[-1]) or capture(*args))
    refused_graph = _targets("adamw_two_groups")
    assert traces == [True, False] and len(refusals) == 1
    # The refusal is remembered: a later capture traces once, in full.
    refused_run = _compiled_run("adamw_two_groups")
    assert traces == [True, False, True] and len(refusals) == 1
    monkeypatch.setattr(frontend_training, "REPLAY_OPTIMIZER", False)
    assert refused_graph == _targets("adamw_two_groups")
    assert_bitwise(refused_run, _compiled_run("adamw_two_groups"))


def test_foreach_update_is_traced_per_tensor_and_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``foreach=True`` is captured with the per-tensor update (its
    ``_foreach_`` operators have no lowering), so the replay takes it (it
    refused the ``_foreach_`` update before); the capture is the full
    trace's."""
    monkeypatch.setitem(OPTIMIZERS, "adamw_foreach", lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True))
    refused = []
    check = optimizer_replay._check_template

    def checked(*args: Any) -> None:
        try:
            check(*args)
        except optimizer_replay.ReplayRefused as error:
            refused.append(str(error))
            raise

    monkeypatch.setattr(optimizer_replay, "_check_template", checked)
    monkeypatch.setattr(optimizer_replay, "_REFUSED", set())
    replayed = _targets("adamw_foreach")
    assert not refused
    assert not any("_foreach_" in target for target in replayed)
    monkeypatch.setattr(frontend_training, "REPLAY_OPTIMIZER", False)
    assert replayed == _targets("adamw_foreach")


def test_kernels_are_restored_after_capture() -> None:
    before = (_ADAM._single_tensor_adam, _ADAM._multi_tensor_adam, _SGD._single_tensor_sgd, _SGD._multi_tensor_sgd)
    _targets("adamw")
    with pytest.raises(Exception):
        model, optimizer, step, batches = _problem(OPTIMIZERS["adamw"], torch.float32, False)
        capture_training_step(lambda x, y: step(x, y).item(), model, optimizer, batches[0])
    after = (_ADAM._single_tensor_adam, _ADAM._multi_tensor_adam, _SGD._single_tensor_sgd, _SGD._multi_tensor_sgd)
    assert before == after


# -- the template cache: a later capture reuses a class's traced update ---------


class _Widths(torch.nn.Module):
    """Two linear layers of the given widths: its classes' first member
    (``first.weight``) has shape ``(hidden, inputs)``."""

    def __init__(self, inputs: int, hidden: int) -> None:
        super().__init__()
        self.first = torch.nn.Linear(inputs, hidden)
        self.second = torch.nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


def _graph(
    make_optimizer: Callable[[Any], torch.optim.Optimizer], dtype: torch.dtype = torch.float32,
    inputs: int = 8, hidden: int = 16, batch: int = 6,
) -> list[tuple[str, ...]]:
    """The captured graph, node by node: name, target, arguments (scalars
    by ``repr``: ``-0.0`` is not ``0.0``) and value's shape and dtype."""
    torch.manual_seed(0)
    model = _Widths(inputs, hidden).to(dtype)
    optimizer = make_optimizer(model.parameters())

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    example = (torch.randn(batch, inputs, dtype=dtype), torch.randn(batch, 4, dtype=dtype))
    graph = capture_training_step(step, model, optimizer, example).exported.graph
    rows = []
    for node in graph.nodes:
        val = node.meta.get("val")
        rows.append((node.name, str(node.target), repr(node.args), repr(node.kwargs),
                     f"{tuple(val.shape)} {val.dtype}" if isinstance(val, torch.Tensor) else repr(val)))
    return rows


def _fresh_graph(*args: Any, **kwargs: Any) -> list[tuple[str, ...]]:
    optimizer_replay.clear_template_cache()
    return _graph(*args, **kwargs)


def _adamw(p: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(p, lr=1e-2, eps=0.0)


def test_second_capture_reuses_the_update_template() -> None:
    stats = optimizer_replay.template_cache_stats()
    first = _fresh_graph(_adamw)
    assert (stats.hits, stats.misses) == (0, 1)
    again = _graph(_adamw)
    assert (stats.hits, stats.misses) == (1, 1)  # no update traced
    assert again == first
    # The batch is not part of the update: a new batch shape reuses it too.
    assert _graph(_adamw, batch=3) == _fresh_graph(_adamw, batch=3)


#: Changes of what the update's trace reads: each must trace again.
CHANGES: dict[str, dict[str, Any]] = {
    "weight_decay": {"make_optimizer": lambda p: torch.optim.AdamW(p, lr=1e-2, eps=0.0, weight_decay=0.3)},
    "eps_negative_zero": {"make_optimizer": lambda p: torch.optim.AdamW(p, lr=1e-2, eps=-0.0)},
    "betas": {"make_optimizer": lambda p: torch.optim.AdamW(p, lr=1e-2, eps=0.0, betas=(0.5, 0.999))},
    "amsgrad": {"make_optimizer": lambda p: torch.optim.AdamW(p, lr=1e-2, eps=0.0, amsgrad=True)},
    "maximize": {"make_optimizer": lambda p: torch.optim.AdamW(p, lr=1e-2, eps=0.0, maximize=True)},
    "adam_not_adamw": {"make_optimizer": lambda p: torch.optim.Adam(p, lr=1e-2, eps=0.0, weight_decay=0.01)},
    "sgd": {"make_optimizer": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9)},
    "dtype": {"make_optimizer": _adamw, "dtype": torch.float64},
    "parameter_shape": {"make_optimizer": _adamw, "inputs": 5, "hidden": 7},
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_of_the_update_traces_it_again(change: str) -> None:
    """Primed with the AdamW step, a capture differing in one thing the
    update reads misses the cache, and its graph is the one a capture with
    nothing kept makes."""
    stats = optimizer_replay.template_cache_stats()
    _fresh_graph(_adamw)
    hits, misses = stats.hits, stats.misses
    changed = _graph(**CHANGES[change])
    assert stats.hits == hits and stats.misses > misses
    assert changed == _fresh_graph(**CHANGES[change])


def test_a_new_decomposition_table_traces_the_update_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The template is traced with the capture's decompositions: with
    another table (here without the optimizer's own entries: torch's
    reference ``lerp``) the update is traced again, not taken from before."""
    stats = optimizer_replay.template_cache_stats()
    _fresh_graph(_adamw)
    monkeypatch.setattr(frontend_training, "optimizer_decompositions", dict)
    misses = stats.misses
    changed = _graph(_adamw)
    assert stats.misses == misses + 1
    assert changed == _fresh_graph(_adamw)
    monkeypatch.undo()
    assert changed != _fresh_graph(_adamw)


def test_another_default_dtype_traces_the_update_again() -> None:
    stats = optimizer_replay.template_cache_stats()
    _fresh_graph(_adamw)
    misses = stats.misses
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _graph(_adamw)
    finally:
        torch.set_default_dtype(previous)
    assert stats.misses == misses + 1


def test_template_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """HLOALIAS_OPTIMIZER_TEMPLATE_CACHE_SIZE bounds the cache (read at
    each new template), least recently used dropped first."""
    monkeypatch.setenv("HLOALIAS_OPTIMIZER_TEMPLATE_CACHE_SIZE", "2")
    optimizer_replay.clear_template_cache()
    for hidden in (3, 4, 5):
        _graph(_adamw, hidden=hidden)
    assert len(optimizer_replay._TEMPLATES) == 2
    stats = optimizer_replay.template_cache_stats()
    hits = stats.hits
    _graph(_adamw, hidden=3)  # the oldest went
    assert stats.hits == hits
