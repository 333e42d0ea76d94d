"""The training capture traces without ``make_fx``'s torch-function
metadata mode (issue 26: a training step's compile time, branch
``stepcut``).

``make_fx`` keeps a ``TorchFunctionMetadataMode`` on while it traces: every
torch-level call of the step (each ``Tensor`` method and property, autograd's
backward) passes through it so that the tracer can record
``node.meta["torch_fn"]``, which only the module-stack tracer does
(``record_module_stack`` of a compiled module); the capture's plain tracer
records nothing from it.  The capture and the optimizer's update templates
now trace with it off (``torch_internals.make_fx_without_torch_fn_metadata``).
Tested: no call reaches the mode during a capture (fails on the code
before), the helper still finds torch's parameter (a torch that renames it
fails here), and the compiled step is the same program as with the mode
on: the same program key and the same bits (losses, parameters, optimizer
state) after three steps, on an attention-like module and on a small HF
Llama.  The CPU saving is in ``bench/RESULTS-latency.md`` (session 48)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.frontend import optimizer_replay
from hloalias.frontend import training as frontend_training
from hloalias.frontend.torch_internals import make_fx_without_torch_fn_metadata
from hloalias.frontend.training import capture_training_step

Problem = tuple[torch.nn.Module, torch.optim.Optimizer, Callable[..., torch.Tensor], Callable[[int], tuple[Any, ...]]]


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # No bias: k's would get a zero gradient (softmax ignores a shift).
        self.qkv = torch.nn.Linear(8, 24, bias=False)
        self.out = torch.nn.Linear(8, 3)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q @ k.transpose(1, 2)).softmax(-1)
        return self.out(self.norm(scores @ v + x.detach() * 0.5)).sum(1)


def _attention() -> Problem:
    torch.manual_seed(0)
    model = _Attention()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    def batch(seed: int) -> tuple[Any, ...]:
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(2, 5, 8, generator=generator), torch.randn(2, 3, generator=generator)

    return model, optimizer, step, batch


def _llama() -> Problem:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(ids: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    def batch(seed: int) -> tuple[Any, ...]:
        return (torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(seed)),)

    return model, optimizer, step, batch


def test_helper_finds_torchs_parameter() -> None:
    assert make_fx_without_torch_fn_metadata() == {"_disable_torch_fn_metadata_mode": True}


def test_capture_runs_without_the_metadata_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.fx.experimental import proxy_tensor

    calls: list[object] = []
    through = proxy_tensor.TorchFunctionMetadataMode.__torch_function__

    def counted(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        calls.append(func)
        return through(self, func, types, args, kwargs)

    monkeypatch.setattr(proxy_tensor.TorchFunctionMetadataMode, "__torch_function__", counted)
    optimizer_replay.clear_template_cache()  # the update's template traced here too
    model, optimizer, step, batch = _attention()
    graph = capture_training_step(step, model, optimizer, batch(0)).exported.graph_module.graph
    assert any(node.op == "call_function" for node in graph.nodes)
    assert calls == []


def _run(problem: Callable[[], Problem]) -> tuple[str, list[torch.Tensor]]:
    hloalias.clear_cache()
    optimizer_replay.clear_template_cache()
    model, optimizer, step, batch = problem()
    train = hloalias.compile_training_step(step, model, optimizer, batch(0))
    values = [train(*batch(seed)) for seed in range(3)]
    values += [p.detach().clone() for p in model.parameters()]
    values += [v.clone() for entry in optimizer.state_dict()["state"].values() for v in entry.values()]
    return train.executable.cache_key, values


@pytest.mark.parametrize("problem", [_attention, _llama], ids=["attention", "llama"])
def test_same_program_and_bits_as_with_the_mode(problem: Callable[[], Problem], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_CACHE", "0")
    key, values = _run(problem)
    # The code before: make_fx's default (the metadata mode on).
    monkeypatch.setattr(frontend_training, "make_fx_without_torch_fn_metadata", lambda: {})
    monkeypatch.setattr(optimizer_replay, "make_fx_without_torch_fn_metadata", lambda: {})
    old_key, old_values = _run(problem)
    assert key == old_key
    assert len(values) == len(old_values)
    for new, old in zip(values, old_values):
        assert new.dtype == old.dtype and new.shape == old.shape
        if new.is_floating_point():
            new, old = new.view(torch.int32), old.view(torch.int32)  # bits (float32 here)
        assert torch.equal(new, old)
