"""A mutated bf16 user input written in place, stored as its integer bits
(``store-state-as-bits`` on a user input aliased to its own new value):
XLA gets the caller's tensor's ``view(torch.int16)`` (no copy), so XLA:CPU
does not copy the cache to bit-cast it; the caller's tensor keeps bf16.

Every check compares against eager PyTorch over several calls, on both
call paths: the result, the caller's tensor (dtype, values, where its
memory is) and views of it taken before the call.  XLA's temp bytes are
asserted exactly.  An interrupted call leaves the caller's tensor old or
new, never its bits converted as values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.pipeline import DEFAULT_PIPELINE
from hloalias.runtime import execution as execution_module
from hloalias.runtime.ownership import DeviceTensor, _backing_of

from test_runtime_transaction import PATHS, Fault, compile_on

ROWS = 4  # rows per index_copy_
WRITES = 3


class Writes(torch.nn.Module):
    """``WRITES`` ``index_copy_`` of ``ROWS`` rows into the caller's bf16 ``cache``."""

    def forward(self, cache: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        for i in range(WRITES):
            cache.index_copy_(0, index[ROWS * i : ROWS * i + ROWS], rows[ROWS * i : ROWS * i + ROWS])
        return cache[:2].float().sum()


def _cache(dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(64, 4, 8, generator=torch.Generator().manual_seed(2)).to(dtype)


def _inputs(seed: int, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    index = torch.randperm(64, generator=generator)[: ROWS * WRITES]
    rows = torch.randn(ROWS * WRITES, 4, 8, generator=generator).to(dtype)
    return index, rows


def _call_both(exe: hloalias.Executable, cache: torch.Tensor, eager_cache: torch.Tensor, seed: int,
               dtype: torch.dtype = torch.bfloat16) -> None:
    index, rows = _inputs(seed, dtype)
    got = exe(cache, index, rows)
    want = Writes()(eager_cache, index, rows)
    assert torch.equal(got, want), (got, want)
    assert cache.dtype == dtype and torch.equal(cache, eager_cache)


@pytest.mark.parametrize("path", PATHS)
def test_donated_bf16_input_is_stored_as_bits_and_equals_eager(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = hloalias.compile(Writes(), (_cache(),) + _inputs(0), donate=(0,), pipeline=DEFAULT_PIPELINE)
    exe = compile_on(path, monkeypatch, Writes(), (_cache(),) + _inputs(0), donate=(0,), lane=False)
    assert exe._input_bits == {0: torch.int16} and before._input_bits == {}
    assert exe._stored_bits == {}
    # The default pipeline keeps one i16 copy of the 4,096-byte cache in
    # temp (XLA:CPU materializes bitcast_convert(cache)); as int16 it is gone.
    assert before.memory_stats["temp_bytes"] == 4768
    assert exe.memory_stats["temp_bytes"] == 928
    assert exe.memory_stats["alias_bytes"] == before.memory_stats["alias_bytes"] == 4096
    assert exe.memory_stats["argument_bytes"] == before.memory_stats["argument_bytes"]
    text = exe.explain()
    assert "input 'cache' is read and written as its int16 bit pattern" in text
    assert "call path: Python (input 'cache' is read and written as its int16 bits)" in text or path == "python"
    cache, eager_cache = _cache(), _cache()
    _call_both(exe, cache, eager_cache, 1)
    # Re-seated onto the runtime's int16 buffer on the first call (nothing
    # else views it), updated in place after that: as for a bf16 program.
    address = cache.data_ptr()
    for seed in range(2, 5):
        _call_both(exe, cache, eager_cache, seed)
        assert cache.data_ptr() == address
    assert exe.host_copies == {}
    # A view taken before the call sees the new values, as in eager: the
    # new bits are copied into the tensor's int16 view, never converted.
    row, eager_row = cache[3], eager_cache[3]
    held = cache.data_ptr()
    for seed in range(5, 8):
        index, rows = _inputs(seed)
        index[0] = 3
        exe(cache, index, rows)
        Writes()(eager_cache, index, rows)
        assert torch.equal(row, eager_row) and torch.equal(cache, eager_cache) and cache.data_ptr() == held
    # A plain torch tensor viewed elsewhere: copied back into, as bits.
    plain, eager_plain = _cache(), _cache()
    alias = plain.view(-1)
    _call_both(exe, plain, eager_plain, 9)
    assert torch.equal(alias, eager_plain.view(-1)) and exe.host_copies["cache"] >= 1


@pytest.mark.parametrize("path", PATHS)
def test_inferred_donor_is_stored_as_bits(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not donated by the caller: alias-donated-buffers infers the mutated
    input as its own new value's donor, so it is stored as bits too."""
    exe = compile_on(path, monkeypatch, Writes(), (_cache(),) + _inputs(0), lane=False)
    assert exe._input_bits == {0: torch.int16}
    assert exe.memory_stats["temp_bytes"] == 928
    cache, eager_cache = _cache(), _cache()
    for seed in range(1, 4):
        _call_both(exe, cache, eager_cache, seed)


class WritesAndViews(torch.nn.Module):
    """:class:`Writes`, returning the cache itself and a view of it (as a
    decoder returns its cache object): rebuilt views of the caller's tensor."""

    def forward(self, cache: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        total = Writes()(cache, index, rows)
        return total, cache, cache[1:3]


@pytest.mark.parametrize("path", PATHS)
def test_an_input_returned_as_itself_and_viewed_is_stored_as_bits(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = compile_on(path, monkeypatch, WritesAndViews(), (_cache(),) + _inputs(0), donate=(0,), lane=False)
    before = hloalias.compile(WritesAndViews(), (_cache(),) + _inputs(0), donate=(0,), pipeline=DEFAULT_PIPELINE)
    assert exe._input_bits == {0: torch.int16}
    assert before.memory_stats["temp_bytes"] == 4768 and exe.memory_stats["temp_bytes"] == 928
    cache, eager_cache = _cache(), _cache()
    for seed in range(1, 4):
        index, rows = _inputs(seed)
        total, itself, view = exe(cache, index, rows)
        want_total, _, want_view = WritesAndViews()(eager_cache, index, rows)
        assert torch.equal(total, want_total) and torch.equal(cache, eager_cache)
        # As in eager: the caller's tensor itself and a bf16 view of its memory.
        assert itself is cache and view.dtype == torch.bfloat16 and torch.equal(view, want_view)
        assert view.data_ptr() == cache[1:3].data_ptr()


@pytest.mark.parametrize("path", PATHS)
def test_a_strided_input_gets_the_bits_copied_back(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-contiguous caller tensor (a permuted view of a larger buffer) is
    read through a contiguous copy and its new bits are copied back into it."""
    exe = compile_on(path, monkeypatch, Writes(), (_cache(),) + _inputs(0), donate=(0,), lane=False)
    base, eager_base = (_cache().permute(2, 1, 0).contiguous() for _ in range(2))
    cache, eager_cache = base.permute(2, 1, 0), eager_base.permute(2, 1, 0)
    assert not cache.is_contiguous() and torch.equal(cache, _cache())
    for seed in range(1, 4):
        _call_both(exe, cache, eager_cache, seed)
        assert torch.equal(base, eager_base) and cache.data_ptr() == base.data_ptr()
    assert exe.host_copies == {"cache": 3}


def test_f16_input_and_a_device_tensor() -> None:
    exe = hloalias.compile(Writes(), (_cache(torch.float16),) + _inputs(0, torch.float16), donate=(0,))
    assert exe._input_bits == {0: torch.int16}
    cache, eager_cache = _cache(torch.float16), _cache(torch.float16)
    for seed in range(1, 3):
        _call_both(exe, cache, eager_cache, seed, torch.float16)
    # A DeviceTensor keeps its dtype: its bits go in and come back.
    device = exe.to_device(_cache(torch.float16))
    eager_device = _cache(torch.float16)
    for seed in range(3, 5):
        index, rows = _inputs(seed, torch.float16)
        assert torch.equal(exe(device, index, rows), Writes()(eager_device, index, rows))
        assert isinstance(device, DeviceTensor) and device.dtype == torch.float16
        assert torch.equal(device.to_torch(), eager_device)


def test_a_bits_buffer_behind_the_tensor_is_not_read_as_bf16() -> None:
    """After the bits program re-seated the tensor onto an int16 buffer, a
    program that writes it as bf16 (not stored as bits) imports its memory
    instead of handing XLA the int16 buffer; then the bits program again."""
    bits = hloalias.compile(Writes(), (_cache(),) + _inputs(0), donate=(0,))
    plain = hloalias.compile(Writes(), (_cache(),) + _inputs(0), donate=(0,), pipeline=DEFAULT_PIPELINE)
    cache, eager_cache = _cache(), _cache()
    nbytes = cache.numel() * cache.element_size()
    for seed, exe in enumerate((bits, plain, plain, bits, bits, plain), start=1):
        _call_both(exe, cache, eager_cache, seed)
        # The buffer behind the tensor is found only by a program that reads its dtype.
        backing, bits_backing = _backing_of(cache, nbytes), _backing_of(cache, nbytes, True)
        if exe is bits:
            assert backing is None and bits_backing is not None and str(bits_backing.array.dtype) == "int16"
        else:
            assert bits_backing is None and backing is not None and str(backing.array.dtype) == "bfloat16"


STAGES = ("before-run", "after-run", "reseat", "copy-back")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("stage", STAGES)
def test_an_interrupted_call_leaves_the_tensor_old_or_new(
    stage: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = compile_on(path, monkeypatch, Writes(), (_cache(),) + _inputs(0), donate=(0,), lane=False)
    assert exe._input_bits == {0: torch.int16}
    cache, eager_cache = _cache(), _cache()
    held = cache.view(-1) if stage == "copy-back" else None  # a view: the new bits are copied back
    fired = [0]

    def once(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if fired[0] == 0:
                fired[0] += 1
                raise Fault
            return original(*args, **kwargs)
        return wrapper

    index, rows = _inputs(1)
    old = cache.clone()
    with monkeypatch.context() as patch:
        if stage == "before-run":
            patch.setattr(execution_module, "torch_to_device", once(execution_module.torch_to_device))
        elif stage == "after-run":
            dispatch = exe._plan.dispatch  # type: ignore[union-attr]
            original_wait = dispatch.wait

            def wait(results: Any) -> None:
                original_wait(results)
                once(lambda: None)()

            patch.setattr(dispatch, "wait", wait)
        elif stage == "reseat":
            patch.setattr(execution_module, "host_backed_tensor", once(execution_module.host_backed_tensor))
        else:
            patch.setattr(execution_module, "_copy_back", once(execution_module._copy_back))
        with pytest.raises(Fault):
            exe(cache, index, rows)
    assert fired[0] == 1
    assert cache.dtype == torch.bfloat16
    new = eager_cache.clone()
    Writes()(new, index, rows)
    if torch.equal(cache, new):
        eager_cache = new
    else:
        assert torch.equal(cache, old), stage
    if held is not None:
        assert torch.equal(held, cache.view(-1))
    # Later calls go on from it as eager does.
    for seed in range(2, 4):
        _call_both(exe, cache, eager_cache, seed)


def test_a_callers_bf16_static_cache_is_stored_as_bits_in_a_prefill() -> None:
    """transformers' StaticCache passed in by the caller (bf16 Llama, random
    weights): a prefill writes it with index_copy_, so its keys and values
    are stored as bits; the program without the pass computes the same bits
    and the caller's cache object, layers and tensors stay the ones it holds."""
    transformers = pytest.importorskip("transformers")
    from hloalias.pipeline import CPU_PIPELINE

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)

    def cache() -> Any:
        made = transformers.StaticCache(config=config, max_cache_len=32)
        made.early_initialization(1, 2, 8, torch.bfloat16, torch.device("cpu"))
        return made

    def inputs(made: Any, step: int) -> dict[str, Any]:
        ids = torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(step))
        return {"input_ids": ids, "past_key_values": made, "use_cache": True,
                "cache_position": torch.arange(4 * step, 4 * step + 4)}

    without = CPU_PIPELINE.replace(", store-state-as-bits", "")
    before = hloalias.compile(model, (), inputs(cache(), 0), pipeline=without)
    exe = hloalias.compile(model, (), inputs(cache(), 0))
    assert before._input_bits == {} and list(exe._input_bits.values()) == [torch.int16] * 4
    # Without the pass XLA:CPU copies each 1,024-byte cache tensor to
    # bit-cast it (temp holds some of those copies at once); as bits, none.
    assert before.memory_stats["temp_bytes"] == 9408
    assert exe.memory_stats["temp_bytes"] == 7616
    assert exe.memory_stats["alias_bytes"] == before.memory_stats["alias_bytes"]
    mine, theirs = cache(), cache()
    layer, keys = mine.layers[0], mine.layers[0].keys
    for step in range(3):
        got, want = exe(**inputs(mine, step)), before(**inputs(theirs, step))
        assert torch.equal(got.logits, want.logits) and got.past_key_values is mine
        for a, b in zip(mine.layers, theirs.layers):
            assert a.keys.dtype == torch.bfloat16 and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert mine.layers[0] is layer and layer.keys is keys and keys[0, :, :12].abs().sum() > 0
