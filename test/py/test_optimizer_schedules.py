"""Optimizers at lr 0 and under every ``torch.optim.lr_scheduler`` (issue
25, item 2): Adam/AdamW's capturable update divided 0 by 0 where a
gradient element was 0 at lr 0 (step 0 of a linear warmup) and gave NaN
parameters; every optimizer the training capture accepts equals eager.

Tolerances as test_training.py (rounding only): rtol 1e-5, atol 2e-6."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias

O = torch.optim
S = torch.optim.lr_scheduler
RTOL, ATOL = 1e-5, 2e-6


class _EmbeddingModel(torch.nn.Module):
    """An embedding (rows not in a batch get exactly-zero gradients) and a
    linear layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.Embedding(10, 8)
        self.linear = torch.nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.linear(self.embedding(ids)).sum(1)


def _step_fn(model: torch.nn.Module, optimizer: O.Optimizer) -> Callable[..., torch.Tensor]:
    def step(ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(ids), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def _batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, 5, (4, 2), generator=generator), torch.randn(4, 3, generator=generator))
        for _ in range(count)
    ]


# Optimizers hloalias initializes itself, then ones that need an eager step first.
FRESH = {
    "sgd_momentum": lambda p: O.SGD(p, lr=0.1, momentum=0.9),
    "adam": lambda p: O.Adam(p, lr=1e-2),
    "adam_amsgrad_l2": lambda p: O.Adam(p, lr=1e-2, amsgrad=True, weight_decay=0.1),
    "adamw": lambda p: O.AdamW(p, lr=1e-2, weight_decay=0.1),
}
WARMED = {
    "adamax": lambda p: O.Adamax(p, lr=1e-2),
    "nadam": lambda p: O.NAdam(p, lr=1e-2, decoupled_weight_decay=True, weight_decay=0.1),
    "radam": lambda p: O.RAdam(p, lr=1e-2),
    "adadelta": lambda p: O.Adadelta(p, lr=1.0),
    "rmsprop": lambda p: O.RMSprop(p, lr=1e-2, momentum=0.5, centered=True),
    "rprop": lambda p: O.Rprop(p, lr=1e-2),
    "asgd": lambda p: O.ASGD(p, lr=1e-2),
}


def _train_both(
    make_optimizer: Callable[[Any], O.Optimizer],
    make_scheduler: Callable[[O.Optimizer], Any],
    steps: int,
    warm: bool,
) -> tuple[torch.nn.Module, torch.nn.Module]:
    eager_model, model = _EmbeddingModel(), _EmbeddingModel()
    eager_opt, opt = make_optimizer(eager_model.parameters()), make_optimizer(model.parameters())
    eager_sched, sched = make_scheduler(eager_opt), make_scheduler(opt)
    batches = _batches(steps + 1)
    if warm:  # optimizers whose initial state hloalias does not build
        for m, o, s in ((eager_model, eager_opt, eager_sched), (model, opt, sched)):
            _step_fn(m, o)(*batches[0])
            s.step()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    for batch in batches[1:]:
        eager_loss = _step_fn(eager_model, eager_opt)(*batch)
        loss = train(*batch)
        torch.testing.assert_close(loss, eager_loss.detach(), rtol=RTOL, atol=ATOL)
        for s, value in ((eager_sched, eager_loss), (sched, loss)):
            s.step(value.item()) if isinstance(s, S.ReduceLROnPlateau) else s.step()
    train.write_back()
    return eager_model, model


def _assert_equal_and_finite(eager_model: torch.nn.Module, model: torch.nn.Module) -> None:
    for name, value in model.state_dict().items():
        assert torch.isfinite(value).all(), name
        torch.testing.assert_close(value, eager_model.state_dict()[name], rtol=RTOL, atol=ATOL, msg=name)


def _zero_every_third(opt: O.Optimizer) -> Any:
    return S.LambdaLR(opt, lambda step: (step % 3) / 2)


@pytest.mark.parametrize("name", sorted(FRESH) + sorted(WARMED))
def test_optimizer_equals_eager_with_lr_zero_steps(name: str) -> None:
    make = FRESH.get(name) or WARMED[name]
    _assert_equal_and_finite(*_train_both(make, _zero_every_third, steps=5, warm=name in WARMED))


SCHEDULERS: dict[str, Callable[[O.Optimizer], Any]] = {
    "LambdaLR_warmup_from_0": lambda o: S.LambdaLR(o, lambda step: min(1.0, step / 2)),
    "MultiplicativeLR": lambda o: S.MultiplicativeLR(o, lambda step: 0.5),
    "StepLR": lambda o: S.StepLR(o, step_size=2, gamma=0.0),
    "MultiStepLR": lambda o: S.MultiStepLR(o, milestones=[1, 3], gamma=0.1),
    "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=2),
    "LinearLR_to_0": lambda o: S.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=3),
    "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.7),
    "PolynomialLR_to_0": lambda o: S.PolynomialLR(o, total_iters=3, power=1.0),
    "CosineAnnealingLR_to_0": lambda o: S.CosineAnnealingLR(o, T_max=2, eta_min=0.0),
    "CosineAnnealingWarmRestarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=2),
    "CyclicLR_from_0": lambda o: S.CyclicLR(o, base_lr=0.0, max_lr=1e-2, step_size_up=2, cycle_momentum=False),
    # Cycling momentum changes betas, a compiled-in hyperparameter: refused
    # with an ExecutionError naming it (test_training.py), so not here.
    "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=1e-2, total_steps=10, cycle_momentum=False),
    "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, factor=0.0, patience=0),
    "SequentialLR": lambda o: S.SequentialLR(
        o, [S.ConstantLR(o, factor=0.0, total_iters=2), S.ExponentialLR(o, gamma=0.9)], milestones=[2]
    ),
    "ChainedScheduler": lambda o: S.ChainedScheduler([S.LambdaLR(o, lambda s: s % 2), S.ExponentialLR(o, 0.9)]),
}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_adamw_under_every_scheduler_equals_eager(name: str) -> None:
    make = lambda p: O.AdamW(p, lr=1e-2, weight_decay=0.1)  # noqa: E731
    _assert_equal_and_finite(*_train_both(make, SCHEDULERS[name], steps=5, warm=False))


def test_bert_linear_warmup_from_zero_is_finite_and_equals_eager() -> None:
    """HF's get_linear_schedule_with_warmup on BERT (tiny config): step 0
    runs at lr 0, and word-embedding rows not in the batch have zero
    gradients (NaN losses from step 2 before the fix)."""
    transformers = pytest.importorskip("transformers")

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        config = transformers.BertConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=32, num_labels=2,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )
        return transformers.BertForSequenceClassification(config).train()

    def step_fn(m: torch.nn.Module, o: O.Optimizer) -> Callable[..., torch.Tensor]:
        def step(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            loss = m(input_ids=ids, labels=labels).loss
            loss.backward()
            o.step()
            o.zero_grad()
            return loss

        return step

    eager_model, compiled_model = model(), model()
    eager_opt = O.AdamW(eager_model.parameters(), lr=1e-3)
    opt = O.AdamW(compiled_model.parameters(), lr=1e-3)
    warmup = transformers.get_linear_schedule_with_warmup
    eager_sched, sched = warmup(eager_opt, 2, 6), warmup(opt, 2, 6)
    generator = torch.Generator().manual_seed(2)
    batches = [
        (torch.randint(0, 20, (2, 8), generator=generator), torch.randint(0, 2, (2,), generator=generator))
        for _ in range(4)
    ]
    assert opt.param_groups[0]["lr"] == 0.0
    train = hloalias.compile_training_step(step_fn(compiled_model, opt), compiled_model, opt, batches[0])
    for batch in batches:
        eager_loss = step_fn(eager_model, eager_opt)(*batch)
        loss = train(*batch)
        assert torch.isfinite(loss)
        torch.testing.assert_close(loss, eager_loss.detach(), rtol=1e-4, atol=1e-5)
        eager_sched.step()
        sched.step()
    train.write_back()
    for name, value in compiled_model.state_dict().items():
        assert torch.isfinite(value).all(), name
        torch.testing.assert_close(value, eager_model.state_dict()[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("make_scheduler", [
    lambda o: S.OneCycleLR(o, max_lr=1e-2, total_steps=10),
    lambda o: S.CyclicLR(o, base_lr=1e-3, max_lr=1e-2, step_size_up=2),
], ids=["OneCycleLR", "CyclicLR"])
def test_a_scheduler_cycling_momentum_is_refused_naming_cycle_momentum(make_scheduler: Any) -> None:
    """Their default cycle_momentum=True changes betas (Adam) or momentum
    (SGD), compiled-in hyperparameters, at every step: the refusal names
    the switch that keeps them fixed."""
    model = _EmbeddingModel()
    for optimizer in (O.AdamW(model.parameters(), lr=1e-2), O.SGD(model.parameters(), lr=1e-2, momentum=0.9)):
        scheduler = make_scheduler(optimizer)
        batch = _batches(1)[0]
        train = hloalias.compile_training_step(_step_fn(model, optimizer), model, optimizer, batch)
        train(*batch)
        scheduler.step()
        with pytest.raises(hloalias.ExecutionError, match=r"(betas|momentum) changed since compile.*cycle_momentum=False"):
            train(*batch)


def _lr_guards(captured: Any) -> tuple[list[Any], list[Any]]:
    """The captured step's ``lr == 0`` comparisons and the selects reading them."""
    lr_inputs = [spec.arg.name for spec in captured.exported.graph_signature.input_specs
                 if spec.kind.name == "USER_INPUT"][:captured.lr_count]
    compares = [node for node in captured.exported.graph.nodes
                if node.target == torch.ops.aten.eq.Scalar and node.args[0].name in lr_inputs]
    selects = [node for node in captured.exported.graph.nodes
               if node.target == torch.ops.aten.where.self and node.args[0] in compares]
    return compares, selects


def test_the_zero_lr_guard_compares_each_groups_lr_once() -> None:
    """Adam's lr-0 guard (one ``where`` per parameter), which torch's
    ``capturable=True`` formula needs, reads one ``lr == 0`` per parameter
    group, not one per parameter: each traced op costs the trace and every
    later stage.  Two groups, three parameters: two comparisons, three
    selects.  (Eager cannot run ``capturable=True`` on CPU: no comparison.)"""
    from hloalias.frontend.training import capture_training_step

    model = _EmbeddingModel()
    optimizer = O.AdamW([{"params": model.embedding.parameters()},
                         {"params": model.linear.parameters(), "lr": 0.0}], lr=1e-2, capturable=True)
    batch = _batches(1)[0]
    captured = capture_training_step(_step_fn(model, optimizer), model, optimizer, batch)
    assert captured.lr_count == 2
    compares, selects = _lr_guards(captured)
    assert len(compares) == 2
    assert len(selects) == 3  # the embedding's weight; the linear's weight and bias
    train = hloalias.compile_training_step(_step_fn(model, optimizer), model, optimizer, batch)
    for ids, target in _batches(2):
        assert torch.isfinite(train(ids, target))
    train.write_back()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_eager_formula_adam_has_no_lr_guard_and_equals_eager_at_lr_zero() -> None:
    """The default (``capturable=False``) Adam is traced with eager's own
    formula (frontend/optimizer_exact.py), which is finite at lr 0 as
    eager is: no guard, and the step equals eager with a group at lr 0."""
    from hloalias.frontend.training import capture_training_step

    def groups(m: torch.nn.Module) -> list[dict[str, Any]]:
        return [{"params": m.embedding.parameters()}, {"params": m.linear.parameters(), "lr": 0.0}]

    model, eager_model = _EmbeddingModel(), _EmbeddingModel()
    optimizer, eager_optimizer = O.AdamW(groups(model), lr=1e-2), O.AdamW(groups(eager_model), lr=1e-2)
    batch = _batches(1)[0]
    assert _lr_guards(capture_training_step(_step_fn(model, optimizer), model, optimizer, batch)) == ([], [])
    train = hloalias.compile_training_step(_step_fn(model, optimizer), model, optimizer, batch)
    for ids, target in _batches(2):
        torch.testing.assert_close(train(ids, target), _step_fn(eager_model, eager_optimizer)(ids, target),
                                   rtol=RTOL, atol=ATOL)
    train.write_back()
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters()):
        assert torch.isfinite(p).all(), name
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=name)
