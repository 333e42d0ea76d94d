"""A transformers cache passed in is updated as eager updates it
(``frontend/carried_objects.py``, ``runtime/carried_objects.py``).

Hugging Face's documented decode loop creates ``past_key_values =
DynamicCache(config=...)`` once and passes the same object at every step;
the model updates it in Python and returns it.  A ``StaticCache`` passed in
allocates its tensors on its first update (lazily).  Before the fix the
program returned the new state in a new object and left the caller's as it
was: every later step attended to an empty (or zero) cache, logits off by
0.4-0.6 with no error.  Each test fails on that code.

Tolerance: float32 rounding (1e-5)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias

transformers = pytest.importorskip("transformers")
TOL = 1e-5


def _llama() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(1))


def _decode(call: Callable[..., Any], cache: Any, steps: int = 3) -> tuple[torch.Tensor, bool]:
    """The loop of Hugging Face's cache docs: the same cache object every
    step.  Returns the last-position logits and whether every step returned
    ``cache`` itself (as eager does)."""
    out = call(input_ids=_ids(), past_key_values=cache, use_cache=True)
    logits, returned_itself = [out.logits[:, -1]], out.past_key_values is cache
    for _ in range(steps):
        token = out.logits[:, -1:].argmax(-1)
        out = call(input_ids=token, past_key_values=cache, use_cache=True)
        returned_itself = returned_itself and out.past_key_values is cache
        logits.append(out.logits[:, -1])
    return torch.stack(logits), returned_itself


def test_a_reused_dynamic_cache_grows_as_in_eager() -> None:
    model = _llama()
    eager = copy.deepcopy(model)
    eager_cache = transformers.DynamicCache(config=model.config)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        expected, _ = _decode(eager, eager_cache)
    actual, returned_itself = _decode(hloalias.jit(model), cache)
    torch.testing.assert_close(actual, expected, rtol=TOL, atol=TOL)
    assert returned_itself
    assert cache.get_seq_length() == eager_cache.get_seq_length() == 7
    torch.testing.assert_close(cache.layers[1].keys, eager_cache.layers[1].keys, rtol=TOL, atol=TOL)


def test_a_lazily_allocated_static_cache_is_allocated_in_the_callers_object() -> None:
    model = _llama()
    eager = copy.deepcopy(model)
    eager_cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        expected, _ = _decode(eager, eager_cache)
    actual, returned_itself = _decode(hloalias.jit(model), cache)
    torch.testing.assert_close(actual, expected, rtol=TOL, atol=TOL)
    assert returned_itself
    layer, eager_layer = cache.layers[0], eager_cache.layers[0]
    assert layer.is_initialized and int(layer.cumulative_length) == int(eager_layer.cumulative_length) == 7
    torch.testing.assert_close(layer.values, eager_layer.values, rtol=TOL, atol=TOL)


def test_a_static_cache_updated_in_place_keeps_its_tensors() -> None:
    """An initialized StaticCache is written in place: the caller's layer
    objects and tensors stay the ones it holds."""
    model = _llama()
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    cache.early_initialization(1, 2, 8, torch.float32, torch.device("cpu"))
    layer, keys = cache.layers[0], cache.layers[0].keys
    exe = hloalias.compile(model, (), {"input_ids": _ids(), "past_key_values": cache, "use_cache": True})
    out = exe(input_ids=_ids(), past_key_values=cache, use_cache=True)
    assert out.past_key_values is cache and cache.layers[0] is layer and layer.keys is keys
    assert int(layer.cumulative_length) == 4 and keys[0, :, :4].abs().sum() > 0


def test_an_interrupt_while_updating_the_cache_completes_the_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C after the first layer of the caller's cache was updated: the
    update completes before the interrupt leaves, no layer is a step behind."""
    from hloalias.runtime import carried_objects

    model = _llama()
    eager = copy.deepcopy(model)
    jitted = hloalias.jit(model)
    eager_cache, cache = transformers.DynamicCache(config=model.config), transformers.DynamicCache(config=model.config)
    real = carried_objects._merge
    interrupted: list[Any] = []

    def merge_then_interrupt(old: Any, new: Any) -> Any:
        merged = real(old, new)
        if type(old).__name__ == "DynamicLayer" and not interrupted:
            interrupted.append(old)
            raise KeyboardInterrupt
        return merged

    monkeypatch.setattr(carried_objects, "_merge", merge_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        jitted(input_ids=_ids(), past_key_values=cache, use_cache=True)
    assert interrupted
    with torch.no_grad():
        eager(input_ids=_ids(), past_key_values=eager_cache, use_cache=True)
    for layer, eager_layer in zip(cache.layers, eager_cache.layers):
        torch.testing.assert_close(layer.keys, eager_layer.keys, rtol=TOL, atol=TOL)


def test_compile_on_an_unallocated_static_cache_refuses_the_allocated_one() -> None:
    """``hloalias.compile`` is one program: after the first call allocated
    the cache, the next call's cache has another structure, refused in
    words (before the fix it ran on a fresh zero cache every call)."""
    model = _llama()
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    exe = hloalias.compile(model, (), {"input_ids": _ids(), "past_key_values": cache, "use_cache": True})
    assert exe(input_ids=_ids(), past_key_values=cache, use_cache=True).past_key_values is cache
    assert cache.layers[0].is_initialized
    with pytest.raises(hloalias.ExecutionError, match="past_key_values.*cache changed its structure"):
        exe(input_ids=_ids(), past_key_values=cache, use_cache=True)
