"""What a compiled training step returns: the loss, or any tuple, list,
dict or ``ModelOutput`` of tensors the step computed (``return loss,
logits`` for an accuracy, ``{"loss": loss, "grad_norm": norm}`` from
``clip_grad_norm_``, a Hugging Face model's whole output), each equal to
eager's at every step.  A parameter, buffer, optimizer state or input
returned as such (or a view of one) is refused at capture naming the
entry: eager returns that very tensor, which later steps change, where a
compiled step returns a new one.  So is an entry that is no tensor."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import hloalias
from hloalias.frontend.training import TrainingCaptureError


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


_X = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
_Y = torch.randint(0, 3, (6,), generator=torch.Generator().manual_seed(2))


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, shape: str) -> Callable[..., Any]:
    def step(x: torch.Tensor, y: torch.Tensor) -> Any:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        accuracy = (logits.argmax(-1) == y).float().mean()
        if shape == "tuple":
            return loss, logits
        if shape == "list":
            return [loss, [accuracy, norm]]
        return {"loss": loss, "logits": logits, "accuracy": accuracy, "grad_norm": norm}

    return step


@pytest.mark.parametrize("path", ["native", "python"])
@pytest.mark.parametrize("shape", ["tuple", "list", "dict"])
def test_results_of_every_structure_equal_eager(shape: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
    eager_model, model = _model(), _model()
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    eager_step = _step(eager_model, eager_opt, shape)
    train = hloalias.compile_training_step(_step(model, opt, shape), model, opt, (_X, _Y))
    for _ in range(3):
        expected = eager_step(_X, _Y)
        got = train(_X, _Y)
        assert type(got) is type(expected)
        assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(expected)
        for a, b in zip(torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(got)):
            torch.testing.assert_close(b, a.detach(), rtol=1e-5, atol=2e-6)
            assert not b.requires_grad
    for a, b in zip(eager_model.parameters(), model.parameters()):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=1e-5, atol=2e-6)


def test_a_hugging_face_output_comes_back_whole() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    eager_model = copy.deepcopy(model)

    def make(m: torch.nn.Module) -> Callable[..., Any]:
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

        def step(batch: dict[str, torch.Tensor]) -> Any:
            out = m(**batch)
            out.loss.backward()
            opt.step()
            opt.zero_grad()
            return out

        step.opt = opt  # type: ignore[attr-defined]
        return step

    eager_step, step = make(eager_model), make(model)
    batch = {"input_ids": torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(3)),
             "labels": torch.tensor([0, 2])}
    train = hloalias.compile_training_step(step, model, step.opt, (batch,))  # type: ignore[attr-defined]
    for _ in range(2):
        expected, got = eager_step(batch), train(batch)
        assert type(got) is type(expected) and list(got.keys()) == ["loss", "logits"]
        torch.testing.assert_close(got.loss, expected.loss.detach(), rtol=1e-5, atol=2e-6)
        torch.testing.assert_close(got.logits, expected.logits.detach(), rtol=1e-5, atol=2e-6)


_REFUSED: dict[str, tuple[Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], Any], str]] = {
    "parameter": (lambda m, x, loss: (loss, m[0].weight), r"result\[1\] is a parameter, buffer, gradient"),
    "view_of_parameter": (lambda m, x, loss: {"loss": loss, "row": m[2].bias[1:]},
                          r"result\['row'\] is a parameter, buffer, gradient"),
    "input": (lambda m, x, loss: (loss, x), r"result\[1\] is an input of the step"),
    "view_of_input": (lambda m, x, loss: (loss, x[0]), r"result\[1\] is an input of the step"),
    "number": (lambda m, x, loss: (loss, 3), r"result\[1\] is 3 \(type int\)"),
    "none": (lambda m, x, loss: None, r"returned NoneType with no tensor"),
    "none_entry": (lambda m, x, loss: (loss, None), r"result\[1\] is None \(type NoneType\)"),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_returning_state_inputs_or_non_tensors_is_refused(case: str) -> None:
    returned, message = _REFUSED[case]
    model = _model()
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> Any:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return returned(model, x, loss)

    with pytest.raises(TrainingCaptureError, match=message):
        hloalias.compile_training_step(step, model, opt, (_X, _Y))
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert not opt.state


def test_a_copy_of_a_parameter_is_returned_as_its_value_after_the_step() -> None:
    """The refusal's advice: ``.detach().clone()`` returns the parameter's
    value after the update, as eager's copy does."""
    eager_model, model = _model(), _model()
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager_model, model)]

    def make(m: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[..., Any]:
        def step(x: torch.Tensor, y: torch.Tensor) -> Any:
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss, m[2].bias.detach().clone()

        return step

    eager_step = make(eager_model, opts[0])
    train = hloalias.compile_training_step(make(model, opts[1]), model, opts[1], (_X, _Y))
    held = []
    for _ in range(2):
        expected, got = eager_step(_X, _Y), train(_X, _Y)
        held.append((expected[1], got[1]))
        torch.testing.assert_close(got[1], expected[1], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(held[0][1], held[0][0], rtol=1e-6, atol=1e-7)  # still the first step's value
