"""Forward hooks registered or removed after compiling (``runtime/module_hooks.py``).

``torch.export`` runs the hooks registered while it traces, so a program
holds them.  Before the check, an executable called after
``register_forward_hook`` silently left the new hook out (or kept a removed
one), ``hloalias.jit`` reused the hookless program, and a compile after
registering a *global* module hook was served the hookless import from the
in-process import cache.  Each test here fails on that code.  The check runs
before either call path, so the tests hold on the Python path too
(``HLOALIAS_NATIVE=0``)."""

from __future__ import annotations

import pytest
import torch

import hloalias
from hloalias.errors import ExecutionError


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _x() -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(1))


def _scale(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
    return output * 100


def _zero_input(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return (inputs[0] * 0,)


def test_a_hook_registered_after_compiling_is_refused_naming_the_module() -> None:
    model = _model()
    exe = hloalias.compile(model, (_x(),))
    handle = model[2].register_forward_hook(_scale)
    with pytest.raises(ExecutionError, match=r"forward hook of Linear '2' was registered or removed"):
        exe(_x())
    handle.remove()
    torch.testing.assert_close(exe(_x()), model(_x()))


def test_a_pre_hook_registered_after_compiling_is_refused() -> None:
    model = _model()
    exe = hloalias.compile(model, (_x(),))
    model[0].register_forward_pre_hook(_zero_input)
    with pytest.raises(ExecutionError, match=r"Linear '0'"):
        exe(_x())


def test_removing_a_hook_the_program_holds_is_refused() -> None:
    model = _model()
    handle = model.register_forward_hook(_scale)
    exe = hloalias.compile(model, (_x(),))
    torch.testing.assert_close(exe(_x()), model(_x()))
    handle.remove()
    with pytest.raises(ExecutionError, match=r"forward hook of Sequential"):
        exe(_x())


def test_hooks_elsewhere_do_not_disturb_calls() -> None:
    model, other = _model(), _model()
    exe = hloalias.compile(model, (_x(),))
    other.register_forward_hook(_scale)  # moves torch's handle counter
    torch.ones(2, requires_grad=True).register_hook(lambda grad: grad)
    for _ in range(2):
        torch.testing.assert_close(exe(_x()), model(_x()))


def test_compiling_again_with_the_hook_gives_eagers_result() -> None:
    model = _model()
    hloalias.compile(model, (_x(),))
    model.register_forward_hook(_scale)
    again = hloalias.compile(model, (_x(),))
    torch.testing.assert_close(again(_x()), model(_x()))


def test_jit_compiles_a_program_with_the_new_hook_and_reuses_the_old_after_removal() -> None:
    model = _model()
    f = hloalias.jit(model)
    torch.testing.assert_close(f(_x()), model(_x()))
    handle = model[0].register_forward_pre_hook(_zero_input)
    torch.testing.assert_close(f(_x()), model(_x()))
    handle.remove()
    torch.testing.assert_close(f(_x()), model(_x()))
    assert (f.stats.compiles, f.stats.hits) == (2, 1)


def test_a_global_module_hook_registered_after_a_compile_is_not_served_the_hookless_import() -> None:
    model = _model()
    f = hloalias.jit(model)
    f(_x())
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, inputs, output: output + 1 if isinstance(output, torch.Tensor) else output
    )
    try:
        want = model(_x())
        torch.testing.assert_close(f(_x()), want)
        torch.testing.assert_close(hloalias.compile(model, (_x(),))(_x()), want)
    finally:
        handle.remove()


def test_a_training_step_refuses_a_hook_registered_after_building_it() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        return loss

    train = hloalias.compile_training_step(step, model, optimizer, (_x(),))
    train(_x())
    model.register_forward_hook(_scale)
    with pytest.raises(ExecutionError, match=r"forward hook of Sequential"):
        train(_x())


def test_transformers_output_capturing_hooks_installed_later_do_not_refuse() -> None:
    """transformers installs forward hooks on a model's layers the first time
    a call asks for hidden states, and keeps them: they record only while
    such a call runs, so a program compiled before them stays valid."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        exe = hloalias.compile(model, (ids,))
        model(ids, output_hidden_states=True)  # installs the hooks
        assert model.model.layers[0]._forward_hooks
        torch.testing.assert_close(exe(ids).logits, model(ids).logits)
