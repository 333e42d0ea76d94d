"""Results of ``hloalias.compile``/``jit`` in grad mode (runtime/gradient_boundary.py):
a compiled program records no autograd graph, so a ``backward()`` through
its results would silently leave the module's parameters without gradient
(a compiled backbone under an eager head).  Such a backward is refused by
name; results require grad as eager's do; under ``no_grad`` nothing
changes; a result that is an input's memory follows the input."""

from __future__ import annotations

import pytest
import torch

import hloalias
from hloalias.errors import ExecutionError


def _backbone_and_head() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()), torch.nn.Linear(8, 2)


def test_backward_through_a_compiled_backbone_is_refused_by_name() -> None:
    backbone, head = _backbone_and_head()
    x = torch.randn(4, 8)
    exe = hloalias.compile(backbone, (x,))
    features = exe(x)
    assert features.requires_grad == backbone(x).requires_grad  # True, as in eager
    loss = head(features).sum()
    with pytest.raises(ExecutionError, match="compiled program Sequential .*compile_training_step"):
        loss.backward()
    assert backbone[0].weight.grad is None


def test_jit_results_are_checked_too() -> None:
    backbone, _ = _backbone_and_head()
    fast = hloalias.jit(backbone)
    x = torch.randn(3, 8)
    with pytest.raises(ExecutionError, match="records no autograd graph"):
        fast(x).sum().backward()


def test_no_grad_calls_are_unchanged_and_detached_results_train_the_head() -> None:
    backbone, head = _backbone_and_head()
    x = torch.randn(4, 8)
    exe = hloalias.compile(backbone, (x,))
    with torch.no_grad():
        frozen = exe(x)
    assert not frozen.requires_grad and frozen.grad_fn is None
    head(exe(x).detach()).sum().backward()  # the compiled part asked for no gradient
    assert head.weight.grad is not None and backbone[0].weight.grad is None
    # autograd.grad of the head alone never reaches the compiled part
    (grad,) = torch.autograd.grad(head(exe(x)).sum(), [head.bias])
    assert torch.equal(grad, torch.full((2,), 4.0))


def test_marked_results_share_memory_and_stay_writable() -> None:
    backbone, _ = _backbone_and_head()
    x = torch.randn(4, 8)
    exe = hloalias.compile(backbone, (x,))
    with torch.no_grad():
        want = backbone(x)
    y = exe(x)
    torch.testing.assert_close(y.detach(), want)
    y.add_(1)  # an in-place edit of a result, as eager allows
    torch.testing.assert_close(y.detach(), want + 1)


class _ReturnsItsInput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.linear(x), x, x[1:]


def test_a_returned_input_and_its_views_follow_the_input() -> None:
    torch.manual_seed(0)
    module = _ReturnsItsInput()
    x = torch.randn(3, 4)
    exe = hloalias.compile(module, (x,))
    y, same, view = exe(x)
    assert y.requires_grad
    assert same is x and not same.requires_grad
    assert not view.requires_grad and view.data_ptr() == x[1:].data_ptr()


def test_a_module_without_trainable_parameters_is_not_checked() -> None:
    backbone, _ = _backbone_and_head()
    backbone.requires_grad_(False)
    x = torch.randn(4, 8)
    exe = hloalias.compile(backbone, (x,))
    y = exe(x)
    assert not y.requires_grad and y.grad_fn is None


class _ReturnsAViewOfItsResult(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.linear(x).relu()
        return y, y[:, :8]


def test_a_view_of_a_marked_result_is_a_view_of_it() -> None:
    torch.manual_seed(0)
    module = _ReturnsAViewOfItsResult()
    x = torch.randn(4, 16)
    exe = hloalias.compile(module, (x,))
    y, head = exe(x)
    assert head._base is y and head.data_ptr() == y.data_ptr() and head.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(head, module(x)[1])
    with pytest.raises(ExecutionError, match="records no autograd graph"):
        head.sum().backward()


class _ResultsWithAndWithoutParameters(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits = self.linear(x)
        chosen = logits.argmax(-1)
        return logits, self.count + 1, x * 2, chosen, chosen.float(), logits.sum() + self.count.sum()


def test_results_no_parameter_reaches_do_not_require_grad() -> None:
    """As in eager: a buffer plus one, ``x * 2`` and a value derived through
    an integer (argmax) carry no gradient, so ``.numpy()`` works on them;
    the results computed from the parameters still refuse a backward."""
    torch.manual_seed(0)
    module = _ResultsWithAndWithoutParameters()
    x = torch.randn(3, 4)
    exe = hloalias.compile(module, (x,))
    eager, ours = module(x), exe(x)
    assert [r.requires_grad for r in ours] == [r.requires_grad for r in eager] == [True, False, False, False, False, True]
    for index in (1, 2, 4):
        ours[index].numpy()
    with pytest.raises(ExecutionError, match="records no autograd graph"):
        ours[5].backward()


class _ReturnsAViewOfItsParameter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4, 3))
        self.register_buffer("scale", torch.ones(4, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x * 2, self.weight[1:3], self.scale[0]


def test_a_returned_view_of_a_parameter_requires_grad_and_refuses_backward() -> None:
    """Eager's ``self.weight[1:3]`` requires grad (a backward reaches the
    parameter); ours is marked, still over the module state's memory."""
    module = _ReturnsAViewOfItsParameter()
    exe = hloalias.compile(module, (torch.randn(2),))
    got = exe(torch.randn(2))
    assert [r.requires_grad for r in got] == [r.requires_grad for r in module(torch.randn(2))] == [False, True, False]
    with torch.no_grad():
        state_view = exe(torch.randn(2))[1]
    assert got[1].data_ptr() == state_view.data_ptr()
    with pytest.raises(ExecutionError, match="records no autograd graph"):
        (got[1].sum() * 2).backward()


def test_freezing_the_model_after_compiling_gives_results_without_grad() -> None:
    """``model.requires_grad_(False)`` after compiling: eager's results
    require no grad (``.numpy()`` works), so the program's must not."""
    backbone, _ = _backbone_and_head()
    x = torch.randn(4, 8)
    exe = hloalias.compile(backbone, (x,))
    assert exe(x).requires_grad
    backbone.requires_grad_(False)
    result = exe(x)
    assert result.requires_grad == backbone(x).requires_grad == False  # noqa: E712
    result.numpy()
    backbone.requires_grad_(True)
    assert exe(x).requires_grad


def test_unfreezing_after_compiling_frozen_refuses_the_backward_instead_of_no_gradient() -> None:
    """Compiled frozen, then ``requires_grad_(True)`` to fine-tune: eager's
    results now carry a graph to the parameters; a backward through the
    program's must be refused, never silently give them no gradient."""
    backbone, head = _backbone_and_head()
    backbone.requires_grad_(False)
    x = torch.randn(4, 8)
    exe = hloalias.compile(backbone, (x,))
    assert not exe(x).requires_grad
    backbone.requires_grad_(True)
    features = exe(x)
    assert features.requires_grad == backbone(x).requires_grad == True  # noqa: E712
    with pytest.raises(ExecutionError, match="records no autograd graph"):
        head(features).sum().backward()
    assert backbone[0].weight.grad is None


def test_a_parameter_unfrozen_since_compiling_marks_the_outputs_only_it_reaches() -> None:
    """Compiled with ``b`` frozen, the output only ``b`` reaches counted as
    free of parameters; once ``b`` trains, eager's output requires grad."""

    class TwoHeads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.a(x), self.b(x)

    model = TwoHeads()
    model.b.requires_grad_(False)
    x = torch.randn(2, 4)
    exe = hloalias.compile(model, (x,))
    assert [r.requires_grad for r in exe(x)] == [True, False]
    model.b.requires_grad_(True)
    assert [r.requires_grad for r in exe(x)] == [r.requires_grad for r in model(x)] == [True, True]


def _penalty(activations: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (activations * weights).square().sum(), weights * 2


@pytest.mark.parametrize("entry", ["jit", "compile"])
def test_an_input_that_requires_grad_marks_the_results_it_reaches(entry: str) -> None:
    # A parameter-free function (a regulariser) on an eager model's
    # activations: eager's first result requires grad through them, and a
    # loss mixing it with other terms must not silently give the
    # activations no gradient from it.
    torch.manual_seed(0)
    activations = torch.randn(4, requires_grad=True)
    weights = torch.randn(4)
    fast = hloalias.jit(_penalty) if entry == "jit" else hloalias.compile(_penalty, (activations.detach(), weights))
    penalty, doubled = fast(activations, weights)
    eager_penalty, eager_doubled = _penalty(activations, weights)
    assert (penalty.requires_grad, doubled.requires_grad) == (eager_penalty.requires_grad, eager_doubled.requires_grad)
    assert torch.equal(penalty.detach(), eager_penalty.detach())
    with pytest.raises(ExecutionError, match="compiled program _penalty .*inputs that require grad"):
        (penalty + activations.sum()).backward()
    # Without grad in the inputs, or under no_grad, nothing is marked.
    assert not fast(activations.detach(), weights)[0].requires_grad
    with torch.no_grad():
        assert not fast(activations, weights)[0].requires_grad


class _LinearAndInputTerm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.linear(x), x * 2, mask + 1


def test_a_result_free_of_parameters_is_marked_when_its_input_requires_grad() -> None:
    torch.manual_seed(0)
    module = _LinearAndInputTerm()
    x, mask = torch.randn(2, 4), torch.randn(2, 4)
    exe = hloalias.compile(module, (x, mask))
    assert [out.requires_grad for out in exe(x, mask)] == [True, False, False]
    x.requires_grad_(True)
    eager = module(x, mask)
    ours = exe(x, mask)
    assert [out.requires_grad for out in ours] == [out.requires_grad for out in eager] == [True, True, False]
    with pytest.raises(ExecutionError, match="records no autograd graph"):
        (ours[1].sum() + x.sum()).backward()


def test_a_function_closing_over_a_model_marks_what_its_parameters_reach() -> None:
    # jit(lambda x: model(x)): the model's parameters are the program's
    # constants, and a loss mixing the result with other terms must not
    # silently give them no gradient from it.
    torch.manual_seed(0)
    model = _LinearAndInputTerm()
    scale = torch.full((4,), 3.0, requires_grad=True)
    fast = hloalias.jit(lambda x, mask: (*model(x, mask), mask * scale))
    x, mask = torch.randn(2, 4), torch.randn(2, 4)
    eager = (*model(x, mask), mask * scale)
    ours = fast(x, mask)
    assert [out.requires_grad for out in ours] == [out.requires_grad for out in eager] == [True, False, False, True]
    with pytest.raises(ExecutionError, match="records no autograd graph"):
        (ours[0].sum() + model.linear.weight.sum()).backward()
    with pytest.raises(ExecutionError, match="records no autograd graph"):
        ours[3].sum().backward()
    model.requires_grad_(False)
    scale.requires_grad_(False)
    assert not any(out.requires_grad for out in fast(x, mask))
