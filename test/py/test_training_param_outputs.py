"""How the training capture returns each parameter's new value (issue 26:
a training step's compile time, branch ``steptrace``).

The capture returned ``leaf.detach()`` per parameter: a view that
functionalization traced twice (in the step, and again when it synced the
output), two ``aten.alias`` dispatches per parameter whose nodes the
lowering then dropped.  It now returns the leaf itself: the traced graph
has no alias between a parameter's update and its new value (the first
test fails on the code before), a frozen parameter's (whose leaf is its
input) is still an alias of its input, and the compiled step still
equals eager (tolerances as test_training.py's: float32, rounding only).
That the final module is the same as with the detach (the same program
key on the HF Llama step of ``bench.latency`` and on MLP steps with
BatchNorm, a frozen parameter, kept gradients and an ``lr = 0`` group,
and the same bits after three steps) was checked against the old code by
hand; ``bench/RESULTS-latency.md`` has it."""

from __future__ import annotations

import torch

import hloalias
from hloalias.frontend.training import capture_training_step

RTOL, ATOL = 1e-5, 1e-6
aten = torch.ops.aten


def _problem(seed: int = 0):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )
    model[0].bias.requires_grad_(False)  # frozen: its new value is its old one
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return model, optimizer, step


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(6, 8, generator=generator), torch.randn(6, 4, generator=generator)


def _new_value(node: torch.fx.Node) -> torch.fx.Node:
    """The value under the lr-0 guard ``where(lr == 0, old, new)``."""
    if node.target is aten.where.self:
        new = node.args[2]
        assert isinstance(new, torch.fx.Node)
        return new
    return node


def test_a_parameters_new_value_is_not_an_alias() -> None:
    model, optimizer, step = _problem()
    captured = capture_training_step(step, model, optimizer, _batch(0))
    graph = captured.exported.graph
    output = next(node for node in graph.nodes if node.op == "output")
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    new_values = {
        spec.target: _new_value(node)
        for spec, node in zip(captured.exported.graph_signature.output_specs, output.args[0])
        if spec.target is not None and spec.target.startswith("param.")
    }
    assert sorted(new_values) == sorted(f"param.{name}" for name, _ in model.named_parameters())
    for name, node in new_values.items():
        if name != "param.0.bias":
            assert node.target is not aten.alias.default, name
    # The frozen bias (its leaf is its placeholder) is returned as before:
    # an alias of its input, not a copy.
    frozen = new_values["param.0.bias"]
    position = [slot.name for slot in captured.slots].index("param.0.bias")
    assert frozen.target is aten.alias.default and frozen.args[0] is placeholders[position]


def test_the_compiled_step_still_equals_eager() -> None:
    model, optimizer, step = _problem()
    eager, eager_optimizer, eager_step = _problem()
    frozen = model[0].bias.detach().clone()
    train = hloalias.compile_training_step(step, model, optimizer, _batch(0))
    for seed in range(3):
        torch.testing.assert_close(train(*_batch(seed)), eager_step(*_batch(seed)).detach(), rtol=RTOL, atol=ATOL)
    train.write_back()
    torch.testing.assert_close(model[0].bias, frozen, rtol=0, atol=0)
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=RTOL, atol=ATOL, msg=key)
