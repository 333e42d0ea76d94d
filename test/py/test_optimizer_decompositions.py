"""The training capture's optimizer decompositions
(:mod:`hloalias.frontend.optimizer_decompositions`, issue 26: a training
step's compile time): Adam's ``lerp_`` with a Python weight is traced as
three operators instead of the reference's ten, and the compiled step
computes the same bits as with the reference decomposition (exact: no
tolerance)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from bitwise import assert_bitwise
from hloalias.frontend import training as frontend_training
from hloalias.frontend.importer import _decomposition_table
from hloalias.frontend.optimizer_decompositions import addcdiv, addcmul, lerp_scalar
from hloalias.frontend.training import capture_training_step

aten = torch.ops.aten
STEPS = 3


def _problem(make_optimizer: Callable[[Any], torch.optim.Optimizer], dtype: torch.dtype = torch.float32) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dtype)
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


def _compiled_run(make_optimizer: Callable[[Any], torch.optim.Optimizer], dtype: torch.dtype = torch.float32) -> Any:
    model, optimizer, step, batches = _problem(make_optimizer, dtype)
    train = hloalias.compile_training_step(step, model, optimizer, batches[0])
    losses = [train(x, y) for x, y in batches]
    state = train.state_dict()
    return losses, state["model"], state["optimizer"]["state"]


def _lerp_nodes(make_optimizer: Callable[[Any], torch.optim.Optimizer]) -> dict[str, int]:
    model, optimizer, step, batches = _problem(make_optimizer)
    captured = capture_training_step(step, model, optimizer, batches[0])
    counts: dict[str, int] = {}
    for node in captured.exported.graph.nodes:
        if node.op == "call_function":
            name = getattr(node.target, "__name__", str(node.target))
            counts[name] = counts.get(name, 0) + 1
    return counts


def test_adam_lerp_is_traced_without_the_references_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = _lerp_nodes(lambda p: torch.optim.AdamW(p, lr=1e-2))
    monkeypatch.setattr(frontend_training, "optimizer_decompositions", lambda: {})
    reference = _lerp_nodes(lambda p: torch.optim.AdamW(p, lr=1e-2))
    parameters = 4
    # The reference per parameter: empty_strided, full_like, abs, ge, sub,
    # 2 where (the weight's selects), sub, mul, add; ours: sub, mul, add.
    assert sum(reference.values()) - sum(ours.values()) == 7 * parameters
    for name in ("abs.default", "ge.Scalar", "empty_strided.default"):
        assert reference.get(name, 0) - ours.get(name, 0) == parameters, name
    # (The update's own ``ge``: frontend/optimizer_exact.py's hidden exponent.)
    assert ours.get("abs.default", 0) == ours.get("empty_strided.default", 0) == 0
    assert reference["where.self"] - ours["where.self"] == 2 * parameters


OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adam_amsgrad_wd": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "adam_beta1_half": lambda p: torch.optim.Adam(p, lr=1e-2, betas=(0.5, 0.9)),  # weight 0.5: the |w| >= 0.5 branch
    "adamw_beta1_0.3": lambda p: torch.optim.AdamW(p, lr=1e-2, betas=(0.3, 0.99)),  # weight 0.7
    "adam_beta1_0": lambda p: torch.optim.Adam(p, lr=1e-2, betas=(0.0, 0.99)),  # weight 1: exp_avg = grad
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_step_is_bitwise_the_reference_decompositions(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = _compiled_run(OPTIMIZERS[name])
    hloalias.clear_cache()
    monkeypatch.setattr(frontend_training, "optimizer_decompositions", lambda: {})
    reference = _compiled_run(OPTIMIZERS[name])
    assert_bitwise(ours, reference)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weight", [0.1, 0.09999999999999998, 0.49999999, 0.5, 0.7, 1.0, 1, 1.5, 2.0, -0.7, -2.0, 0.0, 1e-30])
def test_lerp_scalar_is_bitwise_the_reference(weight: float, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(2)
    start = torch.randn(257, generator=generator, dtype=dtype) * 1e3
    end = torch.randn(257, generator=generator, dtype=dtype)
    ours = lerp_scalar(start, end, weight)
    reference = _decomposition_table()[aten.lerp.Scalar](start, end, weight)
    assert ours.dtype == reference.dtype and ours.stride() == reference.stride()
    assert_bitwise(ours, reference)


@pytest.mark.parametrize(
    "case",
    ["bfloat16", "broadcast", "transposed", "large_weight", "nan_weight"],
)
def test_lerp_scalar_leaves_other_cases_to_the_reference(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    start, end, weight = torch.randn(4, 3), torch.randn(4, 3), 0.25
    if case == "bfloat16":
        start, end = start.bfloat16(), end.bfloat16()
    elif case == "broadcast":
        end = torch.randn(3)
    elif case == "transposed":
        start, end = torch.randn(3, 4).t(), torch.randn(3, 4).t()
    elif case == "large_weight":
        weight = 3.0
    else:
        weight = float("nan")
    calls = []
    reference = _decomposition_table()[aten.lerp.Scalar]
    table = dict(_decomposition_table())
    table[aten.lerp.Scalar] = lambda *args: calls.append(args) or reference(*args)
    monkeypatch.setattr("hloalias.frontend.optimizer_decompositions._decomposition_table", lambda: table)
    result = lerp_scalar(start, end, weight)
    assert len(calls) == 1
    torch.testing.assert_close(result, torch.lerp(start, end, weight), equal_nan=True, rtol=1e-2, atol=1e-2)


def _call_nodes(make_optimizer: Callable[[Any], torch.optim.Optimizer]) -> list[tuple[str, tuple[str, ...]]]:
    model, optimizer, step, batches = _problem(make_optimizer)
    graph = capture_training_step(step, model, optimizer, batches[0]).exported.graph
    return [(str(n.target), tuple(str(a) for a in n.args)) for n in graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_addcmul_and_addcdiv_trace_the_references_nodes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the reference's wrappers, the same nodes with the same
    arguments, in the same order."""
    ours = _call_nodes(OPTIMIZERS[name])
    monkeypatch.setattr(
        frontend_training, "optimizer_decompositions", lambda: {aten.lerp.Scalar: lerp_scalar}
    )
    assert ours == _call_nodes(OPTIMIZERS[name])


def test_adam_step_traces_no_reference_lerp_addcmul_or_addcdiv(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the reference decomposition ran")

    table = dict(_decomposition_table())
    for op in (aten.lerp.Scalar, aten.addcmul.default, aten.addcdiv.default):
        table[op] = refused
    monkeypatch.setattr(frontend_training, "_decomposition_table_with_custom_ops", lambda: table)
    monkeypatch.setattr("hloalias.frontend.optimizer_decompositions._decomposition_table", lambda: table)
    counts = _lerp_nodes(OPTIMIZERS["adam_amsgrad_wd"])
    assert counts  # captured without the references
    a, b, c = torch.randn(5), torch.randn(5), torch.rand(5) + 1
    reference = _decomposition_table()
    for op, ours in ((aten.addcmul.default, addcmul), (aten.addcdiv.default, addcdiv)):
        assert_bitwise(ours(a, b, c, value=0.25), reference[op](a, b, c, value=0.25))
        assert_bitwise(ours(a, b, c), reference[op](a, b, c))


@pytest.mark.parametrize("case", ["bfloat16", "broadcast", "mixed_dtype", "complex_value"])
def test_addcmul_and_addcdiv_leave_other_operands_to_the_reference(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c, value = torch.randn(4, 3), torch.randn(4, 3), torch.rand(4, 3) + 1, 0.5
    if case == "bfloat16":
        a, b, c = a.bfloat16(), b.bfloat16(), c.bfloat16()
    elif case == "broadcast":
        c = torch.rand(3) + 1
    elif case == "mixed_dtype":
        b = b.double()
    else:
        value = 0.5j  # type: ignore[assignment]
    calls: list[Any] = []
    table = dict(_decomposition_table())
    for op in (aten.addcmul.default, aten.addcdiv.default):
        reference = table[op]
        table[op] = lambda *args, _reference=reference, **kwargs: calls.append(args) or _reference(*args, **kwargs)
    monkeypatch.setattr("hloalias.frontend.optimizer_decompositions._decomposition_table", lambda: table)
    for ours in (addcmul, addcdiv):
        try:
            ours(a, b, c, value=value)
        except (RuntimeError, ValueError):
            assert case == "complex_value"  # the reference's own refusal
    assert len(calls) == 2
