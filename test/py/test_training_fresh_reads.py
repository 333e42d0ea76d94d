"""A bare read of the model's or the optimizer's tensors after calls of a
compiled training step (``model.weight``, ``p.detach().clone()``, an EMA
over ``model.parameters()``, ``opt.state[p]["exp_avg"].norm()``,
``p.grad`` under accumulation, ``torch.save(p, f)``) returns the calls'
values, as eager's would, with no ``write_back()``.  Before, it silently
returned the values of the last copy (compile time, here): parameters off
by ~3e-2 after three AdamW steps, ``exp_avg`` all zeros, ``p.grad`` None.

The calls leave those tensors stale (a subclass of their own class,
runtime/state.py) only when a read brought them in since: a call costs no
copy, nor does metadata (``shape``, ``requires_grad``, ``opt.state[p]``)."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import hloalias
from distributed import worker
from hloalias import Mesh
from hloalias.runtime import state as state_module
from state_counts import count_copies

TOL = 1e-5


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(6, 8)
        self.norm = torch.nn.BatchNorm1d(8)  # buffers the steps update
        self.lm_head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(torch.tanh(self.body(x))))


def _step_fn(model: torch.nn.Module, optimizer: torch.optim.Optimizer, zero_grad: bool = True) -> Callable[..., Any]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if zero_grad:
            optimizer.step()
            optimizer.zero_grad()
        return loss

    return step


def _batches(count: int, rows: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(rows, 6, generator=generator), torch.randn(rows, 3, generator=generator)) for _ in range(count)
    ]


class Pair:
    """An eager model and optimizer, and a compiled step of a copy of them."""

    def __init__(self, zero_grad: bool = True, **compile_options: Any) -> None:
        self.eager, self.model = Net(), Net()
        self.eager_opt = torch.optim.AdamW(self.eager.parameters(), lr=1e-2)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.eager_step = _step_fn(self.eager, self.eager_opt, zero_grad)
        self.train = hloalias.compile_training_step(
            _step_fn(self.model, self.opt, zero_grad), self.model, self.opt, _batches(1)[0], **compile_options
        )

    def steps(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for batch in batches:
            self.train(*batch)
            self.eager_step(*batch)


@pytest.fixture
def trained() -> Pair:
    pair = Pair()
    pair.steps(_batches(3))
    return pair


def _close(actual: Any, expected: Any) -> None:
    torch.testing.assert_close(torch.as_tensor(actual), torch.as_tensor(expected), rtol=TOL, atol=TOL)


def _saved(tensor: torch.Tensor) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    buffer.seek(0)
    loaded: torch.Tensor = torch.load(buffer)
    return loaded


BARE_READS: dict[str, Callable[[torch.nn.Module, torch.optim.Optimizer], Any]] = {
    "attribute, then an op": lambda m, o: m.lm_head.weight * 1,
    "list(parameters())": lambda m, o: torch.cat([p.detach().flatten() for p in list(m.parameters())]),
    "detach().clone()": lambda m, o: m.body.weight.detach().clone(),
    "sum()": lambda m, o: m.body.weight.sum(),
    ".data": lambda m, o: m.body.weight.data.clone(),
    ".cpu()": lambda m, o: m.lm_head.bias.cpu().clone(),
    ".numpy()": lambda m, o: m.lm_head.weight.detach().numpy().copy(),
    "np.asarray": lambda m, o: np.asarray(m.body.bias.detach()).copy(),
    "torch.save": lambda m, o: _saved(m.lm_head.weight),
    "buffer": lambda m, o: m.norm.running_mean.clone(),
    "buffer count": lambda m, o: m.norm.num_batches_tracked.item(),
    "optimizer state": lambda m, o: o.state[m.lm_head.weight]["exp_avg"].norm(),
    "optimizer step count": lambda m, o: o.state[m.body.bias]["step"] + 0,
    "copy.deepcopy": lambda m, o: copy.deepcopy(m.body.weight).detach(),
    "tolist": lambda m, o: m.lm_head.bias.tolist(),
    "item": lambda m, o: m.lm_head.bias[0].item(),
    "repr": lambda m, o: float(repr(m.lm_head.bias[1].item())),
}


@pytest.mark.parametrize("read", list(BARE_READS))
def test_a_bare_read_after_compiled_steps_returns_eager_values(trained: Pair, read: str) -> None:
    expected = BARE_READS[read](trained.eager, trained.eager_opt)
    _close(BARE_READS[read](trained.model, trained.opt), expected)


def test_the_read_tensor_keeps_its_class_and_identity(trained: Pair) -> None:
    weight = trained.model.lm_head.weight
    assert isinstance(weight, torch.nn.Parameter) and type(weight).__name__ == "Parameter"
    assert weight is trained.opt.param_groups[0]["params"][-2]
    weight.sum()
    # Fresh again: its class is the watched one of a state tensor
    # (runtime/state.py: _WatchedTensorHook), a Parameter named so.
    assert not state_module.is_stale(weight) and state_module.fresh_type(weight) is torch.nn.Parameter
    assert isinstance(weight, torch.nn.Parameter) and type(weight).__name__ == "Parameter"
    exp_avg = trained.opt.state[weight]["exp_avg"]
    assert isinstance(exp_avg, torch.Tensor) and type(exp_avg).__name__ == "Tensor" and type(exp_avg) is not torch.Tensor
    exp_avg.norm()
    assert not state_module.is_stale(exp_avg) and state_module.fresh_type(exp_avg) is torch.Tensor
    assert repr(trained.model.body.weight).startswith("Parameter containing:")
    assert not state_module.is_stale(trained.model.body.weight)


def test_an_ema_over_parameters_between_compiled_steps_matches_eager() -> None:
    """An EMA updated from ``model.parameters()`` after every call: each
    update reads the call's parameters (the calls leave them stale again)."""
    pair = Pair()
    decay = 0.9
    ema = [p.detach().clone() for p in pair.model.parameters()]
    eager_ema = [p.detach().clone() for p in pair.eager.parameters()]
    for batch in _batches(3):
        pair.steps([batch])
        with torch.no_grad():
            for average, p in zip(ema, pair.model.parameters()):
                average.mul_(decay).add_(p, alpha=1 - decay)
            torch._foreach_mul_(eager_ema, decay)
            torch._foreach_add_(eager_ema, list(pair.eager.parameters()), alpha=1 - decay)
    for average, expected in zip(ema, eager_ema):
        _close(average, expected)


def test_a_foreach_ema_reads_every_stale_parameter() -> None:
    pair = Pair()
    pair.steps(_batches(2))
    ema = [torch.zeros_like(p) for p in pair.model.parameters()]
    with torch.no_grad():
        torch._foreach_add_(ema, list(pair.model.parameters()))
    for average, expected in zip(ema, pair.eager.parameters()):
        _close(average, expected.detach())


def test_gradients_kept_across_calls_are_read_as_eager_accumulates_them() -> None:
    """A step without ``zero_grad`` (accumulation): ``p.grad`` after two
    calls is the sum of both gradients, as eager's; it is the tensor the
    device's gradient stands for, so an in-place edit is read by the next
    call."""
    pair = Pair(zero_grad=False)
    batches = _batches(3)
    pair.steps(batches[:2])
    for p, eager_p in zip(pair.model.parameters(), pair.eager.parameters()):
        assert p.grad is not None
        _close(p.grad, eager_p.grad)
        _close(p, eager_p)  # the parameter itself (unchanged: no optimizer step) after its gradient
    with torch.no_grad():
        for model in (pair.model, pair.eager):
            model.lm_head.weight.grad.mul_(0.5)  # type: ignore[union-attr]
    pair.steps(batches[2:])
    for p, eager_p in zip(pair.model.parameters(), pair.eager.parameters()):
        _close(p.grad, eager_p.grad)


def test_calls_nobody_reads_between_copy_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    copies = count_copies(monkeypatch)
    reads = state_module._STALE_READS[0]
    pair = Pair()
    for batch in _batches(4):
        pair.train(*batch)
    assert copies[0] == 0 and state_module._STALE_READS[0] == reads
    pair.model.lm_head.weight.sum()
    assert copies[0] == 1  # that tensor only
    for batch in _batches(2):
        pair.train(*batch)
    assert copies[0] == 1


def test_metadata_reads_copy_nothing(trained: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    copies = count_copies(monkeypatch)
    weight = trained.model.body.weight
    exp_avg = trained.opt.state[weight]["exp_avg"]
    assert weight.shape == (8, 6) and weight.size() == (8, 6) and weight.size(0) == 8
    assert weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 2 and weight.ndim == 2
    assert weight.requires_grad and weight.is_leaf and weight.numel() == 48 and len(weight) == 8
    assert id(weight) == id(trained.opt.param_groups[0]["params"][0]) and weight in trained.opt.state
    assert exp_avg.shape == (8, 6) and exp_avg.stride() == (6, 1) and exp_avg.is_contiguous()
    assert weight.grad_fn is None and not weight.is_inference() and weight.is_floating_point()
    # ``.grad`` reads the gradient only (none kept here), as ``zero_grad`` does.
    assert weight.grad is None
    trained.opt.zero_grad()
    trained.model.zero_grad()
    assert copies[0] == 0 and state_module.is_stale(weight) and state_module.is_stale(exp_avg)


def test_an_edit_as_the_first_op_on_a_stale_tensor_applies_to_the_calls_values(trained: Pair) -> None:
    """``p.mul_(0.5)`` on a stale parameter edits the calls' value (copied
    in first), and the next call reads the edit, as eager's next step."""
    with torch.no_grad():
        for model, opt in ((trained.model, trained.opt), (trained.eager, trained.eager_opt)):
            model.body.weight.mul_(0.5)
            opt.state[model.lm_head.weight]["exp_avg_sq"].mul_(0.25)
    trained.steps(_batches(2))
    for p, eager_p in zip(trained.model.parameters(), trained.eager.parameters()):
        _close(p, eager_p)
        _close(trained.opt.state[p]["exp_avg_sq"], trained.eager_opt.state[eager_p]["exp_avg_sq"])


def test_an_edit_after_a_read_is_read_by_the_next_call(trained: Pair) -> None:
    trained.model.body.bias.sum()
    with torch.no_grad():
        trained.model.body.bias.add_(1.0)
        trained.eager.body.bias.add_(1.0)
    trained.steps(_batches(2))
    _close(trained.model.body.bias, trained.eager.body.bias)


def test_ctrl_c_during_the_copy_leaves_the_tensor_stale_and_the_next_read_copies_again(
    trained: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = state_module._StateSlot.mark_synced

    def interrupted(slot: Any) -> None:
        monkeypatch.setattr(state_module._StateSlot, "mark_synced", original)
        raise KeyboardInterrupt

    monkeypatch.setattr(state_module._StateSlot, "mark_synced", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trained.model.lm_head.weight.sum()
    assert state_module.is_stale(trained.model.lm_head.weight)
    _close(trained.model.lm_head.weight, trained.eager.lm_head.weight)
    trained.steps(_batches(2))
    for p, eager_p in zip(trained.model.parameters(), trained.eager.parameters()):
        _close(p, eager_p)


def test_two_steps_and_an_eval_executable_of_one_model() -> None:
    """Steps for two batch shapes and an inference executable share the
    model's device state; a bare read between them sees the latest."""
    pair = Pair()
    other = hloalias.compile_training_step(
        _step_fn(pair.model, pair.opt), pair.model, pair.opt, _batches(1, rows=3)[0]
    )
    pair.model.eval()
    pair.eager.eval()
    x = torch.randn(4, 6)
    evaluate = hloalias.compile(pair.model, (x,))
    pair.model.train()
    pair.eager.train()
    for big, small in zip(_batches(2), _batches(2, rows=3)):
        pair.steps([big])
        _close(pair.model.lm_head.weight, pair.eager.lm_head.weight)
        other(*small)
        pair.eager_step(*small)
        _close(pair.model.body.weight.sum(), pair.eager.body.weight.sum())
    pair.model.eval()
    pair.eager.eval()
    with torch.no_grad():
        _close(evaluate(x), pair.eager(x))
        _close(pair.model.norm.running_var, pair.eager.norm.running_var)


def test_a_torch_compiled_forward_between_steps_reads_their_parameters_with_one_graph() -> None:
    """A ``torch.compile``d function calling the model (its forward
    pre-hooks traced, so they copy nothing in) after each compiled step:
    dynamo traces the stale parameters without copying (no graph break),
    and the hloalias backend brings its inputs in before each run."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    pair = Pair()
    x = torch.randn(4, 6)
    forward = torch.compile(lambda v: pair.model.lm_head(torch.tanh(pair.model.body(v))), backend="hloalias")
    try:
        for batch in _batches(3):
            pair.steps([batch])
            with torch.no_grad():
                _close(forward(x), pair.eager.lm_head(torch.tanh(pair.eager.body(x))))
        assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    finally:
        torch._dynamo.reset()


def test_a_bare_read_after_steps_on_a_mesh_in_one_process_returns_their_values() -> None:
    model, optimizer, step = worker.trainer()
    eager_model, eager_optimizer, eager_step = worker.trainer()
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    train = hloalias.compile_training_step(
        step, model, optimizer, (x, y), mesh=Mesh((2,), ("dp",)), shardings={0: ("dp", None)}
    )
    for _ in range(2):
        train(x, y)
        eager_step(x, y)
    _close(model.fc1.weight.sum(), eager_model.fc1.weight.sum())
    _close(optimizer.state[model.fc2.bias]["exp_avg"], eager_optimizer.state[eager_model.fc2.bias]["exp_avg"])


def test_a_bare_read_after_mesh_steps_across_processes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Across processes the copy is a collective: a bare read is refused
    (as an eager forward is), naming what to do, never a stale value."""
    model, optimizer, step = worker.trainer()
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    train = hloalias.compile_training_step(
        step, model, optimizer, (x, y), mesh=Mesh((2,), ("dp",)), shardings={0: ("dp", None)}
    )
    monkeypatch.setattr(train.executable._placement, "multiprocess", True)
    train(x, y)
    assert model.fc1.weight.shape == (32, 16)  # metadata: no copy, no refusal
    for read in (lambda: model.fc1.weight.sum(), lambda: [p.detach().clone() for p in model.parameters()]):
        with pytest.raises(hloalias.ExecutionError, match="train.write_back\\(\\) in every process"):
            read()
    monkeypatch.setattr(train.executable._placement, "multiprocess", False)
    train.write_back()
    monkeypatch.setattr(train.executable._placement, "multiprocess", True)
    model.fc1.weight.sum()
    assert not state_module.is_stale(model.fc1.weight) and state_module.fresh_type(model.fc1.weight) is torch.nn.Parameter


def test_steps_on_a_mesh_nobody_reads_between_copy_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step on a mesh brings in what other programs of the model left
    before each call, not its own state: that would gather every
    parameter and moment to the host per call (it did: 12 copies a call)."""
    copies = count_copies(monkeypatch)
    model, optimizer, step = worker.trainer()
    eager_model, eager_optimizer, eager_step = worker.trainer()
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    train = hloalias.compile_training_step(
        step, model, optimizer, (x, y), mesh=Mesh((2,), ("dp",)), shardings={0: ("dp", None)}
    )
    written_back = [0]
    original = type(train)._write_back

    def counted(step: Any) -> None:
        written_back[0] += 1
        original(step)

    monkeypatch.setattr(type(train), "_write_back", counted)
    for _ in range(3):
        train(x, y)
        eager_step(x, y)
    assert copies[0] == 0 and written_back[0] == 0
    _close(model.fc1.weight, eager_model.fc1.weight)
    assert written_back[0] == 1
