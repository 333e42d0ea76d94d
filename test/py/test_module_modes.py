"""Train/eval switches and attribute changes after compiling (``runtime/module_modes.py``).

``torch.export`` bakes ``self.training`` into the program, so an executable
compiled in one mode and called after ``model.eval()``/``model.train()``
ran the other mode's dropout and BatchNorm: silently wrong values (dropout
at inference, running statistics never updated).  Each test here fails on
the code before the check: the call ran and returned the old mode's result.
The same holds for a plain attribute a forward reads (``model.scale = 3.0``):
the program baked the old value in."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import hloalias
from hloalias.errors import ExecutionError


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.bn(self.fc(x)))


def _x() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def test_eval_after_compiling_in_train_mode_is_refused_and_train_again_runs() -> None:
    model = _Net().train()
    exe = hloalias.compile(model, (_x(),))
    exe(_x())
    model.eval()
    with pytest.raises(ExecutionError, match=r"BatchNorm1d 'bn' was in train mode when compiled and is in eval mode now"):
        exe(_x())
    model.train()
    assert exe(_x()).shape == (4, 8)


def test_a_module_that_reads_no_mode_runs_in_either_mode() -> None:
    """No false refusal: nothing in a Linear + ReLU reads ``training``."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())  # train mode, as constructed
    exe = hloalias.compile(model, (_x(),))
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(exe(_x()), model(_x()), rtol=1e-5, atol=1e-5)


def test_a_function_reading_the_flag_checks_its_model() -> None:
    model = torch.nn.Linear(8, 8)

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return model(x) * (2.0 if model.training else 1.0)

    exe = hloalias.compile(scaled, (_x(),))
    model.eval()
    with pytest.raises(ExecutionError, match="Linear was in train mode"):
        exe(_x())


def test_train_after_compiling_in_eval_mode_is_refused() -> None:
    """BatchNorm's running statistics would silently stay as they were."""
    model = _Net().eval()
    exe = hloalias.compile(model, (_x(),))
    before = exe.state_dict()["bn.running_mean"].clone()
    model.train()
    with pytest.raises(ExecutionError, match="eval mode when compiled and is in train mode now"):
        exe(_x())
    torch.testing.assert_close(exe.state_dict()["bn.running_mean"], before, rtol=0, atol=0)


def test_a_submodule_switched_alone_is_named() -> None:
    """Freezing BatchNorm statistics while fine-tuning: ``model.bn.eval()``."""
    model = _Net().train()
    model.drop.p = 0.0
    exe = hloalias.compile(model, (_x(),))
    model.bn.eval()
    with pytest.raises(ExecutionError, match="BatchNorm1d 'bn' was in train mode"):
        exe(_x())


def test_a_function_over_a_global_model_is_checked() -> None:
    model = _Net().eval()

    def predict(x: torch.Tensor) -> torch.Tensor:
        return model(x).softmax(-1)

    exe = hloalias.compile(predict, (_x(),))
    model.train()
    with pytest.raises(ExecutionError, match="eval mode when compiled"):
        exe(_x())


def test_jit_compiles_the_other_mode_for_a_submodule_switch() -> None:
    model = _Net().train()
    model.drop.p = 0.0
    eager = copy.deepcopy(model)
    jitted = hloalias.jit(model)
    jitted(_x())
    eager(_x())
    model.bn.eval()
    eager.bn.eval()
    torch.testing.assert_close(jitted(_x()), eager(_x()).detach(), rtol=1e-5, atol=1e-5)
    assert jitted.stats.compiles == 2


def test_hf_classifier_compiled_in_eval_refuses_train_mode() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=16, num_labels=2,
    )  # default dropout 0.1
    model = transformers.BertForSequenceClassification(config).eval()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    exe = hloalias.compile(model, (ids,))
    with torch.no_grad():
        torch.testing.assert_close(exe(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    model.train()
    with pytest.raises(ExecutionError, match="in eval mode when compiled and is in train mode now"):
        exe(ids)


def test_training_step_after_model_eval_is_refused() -> None:
    model = _Net().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    train = hloalias.compile_training_step(step, model, optimizer, (_x(), _x()))
    train(_x(), _x())
    model.eval()  # an evaluation pass, and the loop forgot model.train()
    with pytest.raises(ExecutionError, match="train mode when compiled and is in eval mode now"):
        train(_x(), _x())
    model.train()
    train(_x(), _x())


class _Scaled(torch.nn.Module):
    """A forward reading plain attributes a user sets between calls."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)
        self.scale = 1.0
        self.use_relu = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x) * self.scale
        return torch.relu(y) if self.use_relu else y


def test_a_changed_attribute_the_forward_reads_is_refused_naming_it() -> None:
    model = _Scaled()
    exe = hloalias.compile(model, (_x(),))
    model.scale = 3.0
    with pytest.raises(ExecutionError, match=r"attribute 'scale' of _Scaled was 1.0 when compiled and is 3.0 now"):
        exe(_x())
    model.scale = 1.0
    model.use_relu = True
    with pytest.raises(ExecutionError, match=r"attribute 'use_relu'"):
        exe(_x())
    model.use_relu = False
    with torch.no_grad():
        torch.testing.assert_close(exe(_x()), model(_x()))


def test_jit_compiles_again_for_a_new_attribute_value() -> None:
    model = _Scaled()
    f = hloalias.jit(model)
    with torch.no_grad():
        for scale, relu in ((1.0, False), (3.0, False), (3.0, True), (1.0, False)):
            model.scale, model.use_relu = scale, relu
            torch.testing.assert_close(f(_x()), model(_x()))
    assert (f.stats.compiles, f.stats.hits) == (3, 1)


def test_a_library_modules_setting_is_checked() -> None:
    """``model.drop.p = 0.0`` after compiling in train mode: the program
    holds p = 0.5 (eager now drops nothing)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    exe = hloalias.compile(model, (_x(),))
    model[1].p = 0.0
    with pytest.raises(ExecutionError, match=r"attribute 'p' of Dropout '1' was 0.5"):
        exe(_x())


def test_a_function_reading_a_models_attribute_checks_it() -> None:
    model = _Scaled()

    def shifted(x: torch.Tensor) -> torch.Tensor:
        return model(x) + model.shift

    model.shift = 1.0  # type: ignore[assignment]
    exe = hloalias.compile(shifted, (_x(),))
    model.shift = 2.0  # type: ignore[assignment]
    with pytest.raises(ExecutionError, match=r"attribute 'shift'"):
        exe(_x())


def test_a_deleted_attribute_is_refused() -> None:
    model = _Scaled()
    exe = hloalias.compile(model, (_x(),))
    del model.use_relu
    with pytest.raises(ExecutionError, match=r"attribute 'use_relu' of _Scaled was False when compiled and is deleted"):
        exe(_x())


class _Counting(torch.nn.Module):
    """A forward that sets an attribute it reads (a call counter): torch
    runs it while tracing, never again."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.eps = float("nan")  # a NaN equals itself only by identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 2 if self.eps != self.eps else x


def test_a_forward_setting_its_own_attribute_compiles_once() -> None:
    model = _Counting()
    f = hloalias.jit(model)
    exe = hloalias.compile(model, (_x(),))
    for _ in range(3):
        torch.testing.assert_close(f(_x()), _x() * 2)
        torch.testing.assert_close(exe(_x()), _x() * 2)
    assert f.stats.compiles == 1


def _tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).eval()


def test_a_transformers_config_flag_set_after_compiling_is_refused_and_jit_compiles_again() -> None:
    """``model.config.output_hidden_states = True``: eager returns the hidden
    states; the program compiled without them returned ``None`` for them."""
    model = _tiny_llama()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    f = hloalias.jit(model)
    with torch.no_grad():
        exe = hloalias.compile(model, (ids,))
        assert f(ids).hidden_states is None
        model.config.output_hidden_states = True
        with pytest.raises(ExecutionError, match=r"attribute 'output_hidden_states' of LlamaConfig \(config of LlamaForCausalLM\)"):
            exe(ids)
        got, want = f(ids).hidden_states, model(ids).hidden_states
        assert got is not None and len(got) == len(want) == 3
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        model.config.output_hidden_states = False
        assert f(ids).hidden_states is None and f.stats.hits == 1


def test_save_pretrained_between_calls_runs_on_compile_and_training_step(tmp_path: Any) -> None:
    """``model.save_pretrained(dir)`` sets ``config.architectures`` and
    ``config.dtype`` (checkpoint bookkeeping no forward computes with): a
    user who checkpoints mid-training kept getting an ExecutionError on the
    next call.  The checkpoint holds the trained values, and the calls after
    it equal eager's."""
    transformers = pytest.importorskip("transformers")
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(2))
    model = _tiny_llama()
    exe = hloalias.compile(model, (ids,), {"use_cache": False})
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        torch.testing.assert_close(exe(ids, use_cache=False).logits, want)
        model.save_pretrained(tmp_path / "inference")
        assert model.config.architectures == ["LlamaForCausalLM"]
        torch.testing.assert_close(exe(ids, use_cache=False).logits, want)

    eager, model = _tiny_llama().train(), _tiny_llama().train()

    def stepper(m: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
        def step(x: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = m(input_ids=x, labels=x, use_cache=False).loss
            loss.backward()
            opt.step()
            return loss
        return step

    eager_step = stepper(eager, torch.optim.SGD(eager.parameters(), lr=0.1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train = hloalias.compile_training_step(stepper(model, opt), model, opt, (ids,))
    for _ in range(2):
        torch.testing.assert_close(train(ids), eager_step(ids))
    model.save_pretrained(tmp_path / "training")
    two_steps = {name: value.detach().clone() for name, value in eager.state_dict().items()}
    torch.testing.assert_close(train(ids), eager_step(ids))
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "training")
    for name, value in loaded.state_dict().items():  # the checkpoint holds the two steps' values
        torch.testing.assert_close(value, two_steps[name], msg=name)
    for (name, got), want_p in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got, want_p, msg=name)


def test_a_user_forward_naming_the_config_dtype_keeps_it_checked() -> None:
    """The bookkeeping fields are free only where no code outside
    transformers names them: a user's module that reads
    ``self.config.dtype`` is refused after it changes."""
    transformers = pytest.importorskip("transformers")

    class Cast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = transformers.PretrainedConfig(dtype=torch.float32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.to(self.config.dtype) * 2

    model = Cast()
    exe = hloalias.compile(model, (torch.ones(3, dtype=torch.float64),))
    exe(torch.ones(3, dtype=torch.float64))
    model.config.dtype = torch.float64
    with pytest.raises(ExecutionError, match=r"attribute 'dtype' of PreTrainedConfig \(config of Cast\)"):
        exe(torch.ones(3, dtype=torch.float64))
