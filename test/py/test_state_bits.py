"""Module state stored as its integer bit pattern (``store-state-as-bits``
and the runtime's state slots): a bf16 cache written by ``index_copy_``
lives on the device as int16, so XLA:CPU neither converts it to f32 nor
copies it to bit-cast it.

Every check compares against eager PyTorch over several calls: outputs,
``state_dict()`` (torch's dtype), ``load_state_dict``; XLA's temp bytes are
asserted exactly.  Executables of one module share one buffer per tensor
whatever dtype they were compiled for."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import hloalias
from hloalias.errors import IRError
from hloalias.mlir import find_main, new_context, parse_module
from hloalias.pipeline import CPU_PIPELINE, DEFAULT_PIPELINE, with_fixed_dtypes

ROWS = 4  # rows per index_copy_
WRITES = 3


class Cache(torch.nn.Module):
    """A bf16 cache; ``mode`` (static) picks the program: ``write``
    (``index_copy_`` of ``ROWS`` rows, ``WRITES`` times, then a float read of
    the new value), ``read`` (the cache read as float), ``view`` (a row of
    the cache returned: a view), ``add`` (the cache updated in float)."""

    cache: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.randn(64, 4, 8, generator=torch.Generator().manual_seed(2)).bfloat16())

    def forward(self, index: torch.Tensor, rows: torch.Tensor, mode: str) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if mode == "write":
            for i in range(WRITES):
                self.cache.index_copy_(0, index[ROWS * i : ROWS * i + ROWS], rows[ROWS * i : ROWS * i + ROWS])
            return self.cache[:2].float().sum()
        if mode == "read":
            return self.cache.float() * 2 + rows.float().sum()
        if mode == "view":
            return self.cache[1]
        self.cache.add_(1)
        return rows.float().sum()


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    index = torch.randperm(64, generator=generator)[: ROWS * WRITES]
    rows = torch.randn(ROWS * WRITES, 4, 8, generator=generator).bfloat16()
    return index, rows


def _check(exe: hloalias.Executable, eager: Cache, seed: int, mode: str) -> None:
    index, rows = _inputs(seed)
    got = exe(index, rows, mode)
    expected = eager(index, rows, mode)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    state = exe.state_dict()["cache"]
    assert state.dtype == torch.bfloat16 and state.is_contiguous()
    assert torch.equal(state, eager.cache)


def _cache_casts(exe: hloalias.Executable) -> int:
    """Cache-sized bit casts (to i16 and back) in the optimized HLO's entry computation."""
    text = exe._loaded.hlo_modules()[0].to_string()
    entry = text[text.index("\nENTRY "):]
    return len(re.findall(r"%[\w.-]*bitcast-convert[\w.-]* = (?:s16|bf16)\[64,4,8\]", entry))


def test_bf16_cache_stored_as_int16_equals_eager_and_drops_the_copy() -> None:
    model = Cache()
    eager = copy.deepcopy(model)
    before = hloalias.compile(copy.deepcopy(model), _inputs(0) + ("write",), pipeline=DEFAULT_PIPELINE)
    exe = hloalias.compile(model, _inputs(0) + ("write",))
    assert exe._stored_bits == {"cache": torch.int16} and before._stored_bits == {}
    # The default pipeline keeps one i16 copy of the 4,096-byte cache in
    # temp (XLA:CPU materializes bitcast_convert(cache)); stored as int16 it is gone.
    assert before.memory_stats["temp_bytes"] == 4768
    assert exe.memory_stats["temp_bytes"] == 928
    assert exe.memory_stats["alias_bytes"] == before.memory_stats["alias_bytes"] == 4096
    assert _cache_casts(before) == 2 and _cache_casts(exe) == 0
    assert "stored as its int16 bit pattern" in exe.explain()
    for seed in range(1, 4):
        _check(exe, eager, seed, "write")
    new_cache = torch.randn(64, 4, 8).bfloat16()
    exe.load_state_dict({"cache": new_cache})
    eager.cache.copy_(new_cache)
    for seed in range(4, 6):
        _check(exe, eager, seed, "write")
    exe.load_state_dict({"cache": exe.to_device(new_cache)})
    eager.cache.copy_(new_cache)
    _check(exe, eager, 6, "write")
    assert exe.host_copies == {}


def test_torch_side_update_of_the_buffer_is_uploaded_as_bits() -> None:
    model = Cache()
    eager = copy.deepcopy(model)
    exe = hloalias.compile(model, _inputs(0) + ("write",))
    _check(exe, eager, 1, "write")
    with torch.no_grad():
        model.cache.fill_(0.5)  # torch changed the module's tensor: re-read on the next compile
    eager.cache.fill_(0.5)
    again = hloalias.compile(model, _inputs(0) + ("write",))
    assert again._slots["cache"] is exe._slots["cache"] and again._stored_bits == {"cache": torch.int16}
    _check(again, eager, 2, "write")
    _check(exe, eager, 3, "write")


def test_later_float_reader_reads_the_bits_through_a_cast() -> None:
    """The writer fixed the buffer as int16; a later default compile that
    reads the cache as float reads that buffer (cast in the program): one
    buffer, no host copies."""
    model = Cache()
    eager = copy.deepcopy(model)
    writer = hloalias.compile(model, _inputs(0) + ("write",))
    reader = hloalias.compile(model, _inputs(0) + ("read",))
    assert reader._stored_bits == {"cache": torch.int16} and reader._slots["cache"] is writer._slots["cache"]
    for seed in range(1, 4):
        _check(writer, eager, seed, "write")
        _check(reader, eager, seed, "read")
    assert writer.host_copies == reader.host_copies == {}


def test_reader_first_keeps_torch_dtype_for_a_later_writer() -> None:
    model = Cache()
    eager = copy.deepcopy(model)
    reader = hloalias.compile(model, _inputs(0) + ("read",))
    writer = hloalias.compile(model, _inputs(0) + ("write",))
    assert reader._stored_bits == writer._stored_bits == {}
    for seed in range(1, 3):
        _check(writer, eager, seed, "write")
        _check(reader, eager, seed, "read")
    assert writer.host_copies == reader.host_copies == {}


def test_reader_without_the_pass_copies_per_call() -> None:
    """A program compiled for bf16 (pipeline without the pass) reads the
    int16 buffer through a per-call copy, counted; the buffer stays int16."""
    model = Cache()
    eager = copy.deepcopy(model)
    writer = hloalias.compile(model, _inputs(0) + ("write",))
    reader = hloalias.compile(model, _inputs(0) + ("read",), pipeline=DEFAULT_PIPELINE)
    assert reader._stored_bits == {} and writer._slots["cache"].bits == torch.int16
    for seed in range(1, 3):
        _check(writer, eager, seed, "write")
        _check(reader, eager, seed, "read")
    assert reader.host_copies == {"cache": 2} and writer.host_copies == {}
    assert ("stored as torch's layout as int16 bits (fixed by another executable of the module), this program "
            "reads torch's layout, so each call copies it into this program's layout, and a new value it "
            "writes back into the buffer's dtype") in reader.explain()


def test_writer_in_bf16_moves_the_buffer_to_bf16_and_the_int16_writer_writes_back() -> None:
    """A later program that writes the cache as bf16 (no pass) moves the
    buffer to bf16; the earlier int16 writer then reads a copy per call and
    its new value is stored back as bf16.  Both stay eager-equal."""
    model = Cache()
    eager = copy.deepcopy(model)
    writer = hloalias.compile(model, _inputs(0) + ("write",))
    _check(writer, eager, 1, "write")
    adder = hloalias.compile(model, _inputs(0) + ("add",), pipeline=DEFAULT_PIPELINE)
    assert adder._stored_bits == {} and writer._slots["cache"].bits is None
    for seed in range(2, 5):
        _check(writer, eager, seed, "write")
        _check(adder, eager, seed, "add")
    assert writer.host_copies == {"cache": 3} and adder.host_copies == {}


def test_view_of_the_cache_moves_it_to_bf16_and_stays_live() -> None:
    model = Cache()
    eager = copy.deepcopy(model)
    writer = hloalias.compile(model, _inputs(0) + ("write",))
    viewing = hloalias.compile(model, _inputs(0) + ("view",))
    assert viewing._stored_bits == {} and writer._slots["cache"].bits is None
    row = viewing(*_inputs(1), "view")
    assert row.dtype == torch.bfloat16 and torch.equal(row, eager.cache[1])
    for seed in range(2, 6):  # the held view keeps showing the cache's row 1
        _check(writer, eager, seed, "write")
        assert torch.equal(row, eager.cache[1])
    assert writer.host_copies == {"cache": 4}


def test_cache_as_a_user_input_is_not_stored_as_bits() -> None:
    """The pass never changes a user input's dtype (it is the caller's)."""

    def write(cache: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        for i in range(WRITES):
            cache.index_copy_(0, index[ROWS * i : ROWS * i + ROWS], rows[ROWS * i : ROWS * i + ROWS])
        return cache[:2].float().sum()

    cache = torch.randn(64, 4, 8).bfloat16()
    exe = hloalias.compile(write, (cache.clone(),) + _inputs(0))
    assert exe._stored_bits == {}
    mine, theirs = cache.clone(), cache.clone()
    torch.testing.assert_close(exe(mine, *_inputs(1)), write(theirs, *_inputs(1)), rtol=0, atol=0)
    assert torch.equal(mine, theirs)


def test_fixed_dtypes_go_to_the_pass_without_options() -> None:
    assert "store-state-as-bits{dtypes=cache:bits}," in with_fixed_dtypes(CPU_PIPELINE, ("cache:bits",))
    assert with_fixed_dtypes(DEFAULT_PIPELINE, ("cache:bits",)) == DEFAULT_PIPELINE
    assert with_fixed_dtypes(CPU_PIPELINE, ()) == CPU_PIPELINE


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ('hloalias.kind = "user_input", hloalias.stored_bits_of = bf16',
         "'hloalias.stored_bits_of' = bf16 is on a user_input not aliased to its own new value: only module "
         "state and user inputs written in place are stored as bits"),
        ('hloalias.kind = "buffer", hloalias.stored_bits_of = f32',
         "'hloalias.stored_bits_of' = f32 is on an argument of type tensor<4xi16>, expected element type i32"),
        ('hloalias.kind = "buffer", hloalias.stored_bits_of = i16',
         "'hloalias.stored_bits_of' is i16, expected one of bf16, f16, f32, f64"),
        ('hloalias.kind = "buffer", hloalias.stored_bits_of = "bf16"',
         "'hloalias.stored_bits_of' must be a type"),
    ],
)
def test_contract_rejects_a_wrong_stored_bits_of(attribute: str, message: str) -> None:
    from hloalias.contract import verify

    text = f"func.func @main(%a: tensor<4xi16> {{{attribute}}}) -> tensor<4xi16> {{ return %a : tensor<4xi16> }}"
    with new_context() as context:
        module = parse_module(text, context)
        with pytest.raises(IRError, match=message.replace("(", r"\(").replace(")", r"\)")):
            verify(find_main(module))
