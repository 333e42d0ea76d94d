"""User inputs used as indices (frontend/index_ranges.py,
runtime/index_check.py): a value eager refuses (an embedding id past the
table, a negative ``index_select`` index, ``x[idx]`` with ``idx < -n``)
raises :class:`IndexRangeError` naming the input, the value, its position
and the op, before anything runs, on both call paths; XLA would clamp a
gather or drop a scatter's update instead (a silent wrong result)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import hloalias
from hloalias.contract import IndexRange, Signature, verify
from hloalias.errors import ExecutionError, IRError
from hloalias.frontend.importer import import_torch
from hloalias.mlir import find_main
from hloalias.runtime import executable as executable_module
from hloalias.runtime.index_check import IndexRangeError

NATIVE = executable_module._lane is not None


@pytest.fixture(params=["native", "python"])
def call_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test twice: the native lane (where built) and the Python path
    (``HLOALIAS_NATIVE=0``, read when an executable is made)."""
    if request.param == "native" and not NATIVE and os.environ.get("HLOALIAS_REQUIRE_NATIVE") != "1":
        pytest.skip("the native call path is not built here")
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if request.param == "native" else "0")
    yield request.param


def compile_on(path: str, f: Any, args: tuple[Any, ...], **kwargs: Any) -> hloalias.Executable:
    exe = hloalias.compile(f, args, **kwargs)
    assert (exe._lane is not None) == (path == "native"), exe.explain()
    return exe


def native_calls(exe: hloalias.Executable) -> int:
    return int(exe._lane.counts["calls"]) if exe._lane is not None else 0


class Embed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids.view(-1)) * 2


@pytest.mark.parametrize("bad, position", [([3, 12], "(1,)"), ([-1, 1], "(0,)")])
def test_embedding_id_out_of_range_raises_naming_input_value_position_and_op(
    call_path: str, bad: list[int], position: str,
) -> None:
    model = Embed()
    exe = compile_on(call_path, model, (torch.tensor([1, 2]),))
    with pytest.raises(IndexError):  # as eager
        model(torch.tensor(bad))
    fallbacks = exe._lane.counts["fallbacks"] if exe._lane is not None else 0
    with pytest.raises(IndexRangeError) as raised:
        exe(torch.tensor(bad))
    if exe._lane is not None:  # the lane's check left the call to the Python path, which raised
        assert exe._lane.counts["fallbacks"] == fallbacks + 1
    message = str(raised.value)
    value = [v for v in bad if not 0 <= v < 10][0]
    assert f"input 'ids' holds index {value} at position {position}" in message
    assert "aten.embedding into a dimension of size 10" in message and "0 <= index < 10" in message
    assert isinstance(raised.value, ExecutionError)
    assert "index checks per call: 'ids' [0, 10) (aten.embedding)" in exe.explain()
    # A valid call after the refused one runs (natively where built) and is eager's.
    before = native_calls(exe)
    ids = torch.tensor([9, 0])
    torch.testing.assert_close(exe(ids), model(ids))
    assert native_calls(exe) == before + (call_path == "native")


def test_index_select_negative_raises_with_the_source_line(call_path: str) -> None:
    def pick(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 0, i) + 1  # the line named

    x = torch.arange(12.0).view(4, 3)
    exe = compile_on(call_path, pick, (x, torch.tensor([1, 2])))
    with pytest.raises(IndexError):
        pick(x, torch.tensor([-1, 3]))
    with pytest.raises(IndexRangeError, match=r"input 'i' holds index -1 at position \(0,\), out of range for "
                       r"aten.index_select .*test_index_range.py:\d+ in pick: return torch.index_select"):
        exe(x, torch.tensor([-1, 3]))
    torch.testing.assert_close(exe(x, torch.tensor([3, 0])), pick(x, torch.tensor([3, 0])))


def test_gather_out_of_range_raises(call_path: str) -> None:
    def take(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.gather(x, 1, i)

    x = torch.arange(12.0).view(4, 3)
    good = torch.tensor([[0], [1], [2], [0]])
    exe = compile_on(call_path, take, (x, good))
    bad = torch.tensor([[0], [1], [3], [0]])
    with pytest.raises(RuntimeError):
        take(x, bad)
    with pytest.raises(IndexRangeError, match=r"input 'i' holds index 3 at position \(2, 0\), out of range for aten.gather"):
        exe(x, bad)
    torch.testing.assert_close(exe(x, good), take(x, good))


class Rows(torch.nn.Module):
    """Writes rows of module state in place at user indices."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op
        self.register_buffer("table", torch.arange(15.0).view(5, 3))

    def forward(self, idx: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if self.op == "index_copy_":
            self.table.index_copy_(0, idx, rows)
        elif self.op == "index_add_":
            self.table.index_add_(0, idx, rows)
        else:
            self.table.scatter_(0, idx[:, None].expand(-1, 3), rows)
        return self.table.sum(0)


@pytest.mark.parametrize("op", ["index_copy_", "index_add_", "scatter_"])
@pytest.mark.parametrize("bad", [5, -1])
def test_a_bad_index_into_state_raises_and_leaves_the_state_unchanged(call_path: str, op: str, bad: int) -> None:
    model = Rows(op)
    rows = torch.ones(2, 3)
    exe = compile_on(call_path, model, (torch.tensor([0, 1]), rows))
    eager = Rows(op)
    with pytest.raises((IndexError, RuntimeError)):
        eager(torch.tensor([2, bad]), rows)
    exe(torch.tensor([0, 1]), rows)  # one call first: the state lives on the device
    before = {name: value.clone() for name, value in exe.state_dict().items()}
    module_before = model.table.clone()
    with pytest.raises(IndexRangeError, match=rf"input 'idx' holds index {bad} at position \(1,\)"):
        exe(torch.tensor([2, bad]), rows)
    for name, value in exe.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)
    torch.testing.assert_close(model.table, module_before, rtol=0, atol=0)
    # And the next valid call is eager's.
    eager.table.copy_(before["table"])
    torch.testing.assert_close(exe(torch.tensor([4, 3]), rows), eager(torch.tensor([4, 3]), rows))
    torch.testing.assert_close(exe.state_dict()["table"], eager.table)


def test_advanced_indexing_takes_negative_indices_down_to_minus_n(call_path: str) -> None:
    def rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return x[idx] * 1

    x = torch.arange(12.0).view(4, 3)
    exe = compile_on(call_path, rows, (x, torch.tensor([0, 1])))
    for good in ([-4, 3], [-1, 0], [2, -2]):
        torch.testing.assert_close(exe(x, torch.tensor(good)), rows(x, torch.tensor(good)))
    for bad, value in (([-5, 0], -5), ([1, 4], 4)):
        with pytest.raises(IndexError):
            rows(x, torch.tensor(bad))
        with pytest.raises(IndexRangeError, match=rf"holds index {value} .* aten.index .*-4 <= index < 4"):
            exe(x, torch.tensor(bad))


def test_index_put_with_negative_indices_writes_like_eager_and_refuses_past_minus_n(call_path: str) -> None:
    def put(x: torch.Tensor, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y[idx] = v
        return y

    x, v = torch.zeros(4, 2), torch.ones(2, 2)
    exe = compile_on(call_path, put, (x, torch.tensor([0, 1]), v))
    torch.testing.assert_close(exe(x, torch.tensor([-4, -1]), v), put(x, torch.tensor([-4, -1]), v))
    with pytest.raises(IndexRangeError, match="holds index -5"):
        exe(x, torch.tensor([-5, 1]), v)


def test_a_slice_of_the_input_is_checked_where_it_is_read(call_path: str) -> None:
    """``ids[:, 1:]`` reads only the later columns: a value eager never
    reads as an index (the first column) is not refused."""
    table = torch.nn.Embedding(10, 4)

    def shifted(ids: torch.Tensor) -> torch.Tensor:
        return table(ids[:, 1:]) + 0

    ids = torch.tensor([[-100, 3, 4]])
    exe = compile_on(call_path, shifted, (torch.tensor([[1, 2, 3]]),))
    torch.testing.assert_close(exe(ids), shifted(ids))  # the lane leaves it to the Python path, which runs it
    before = native_calls(exe)
    torch.testing.assert_close(exe(torch.tensor([[0, 3, 9]])), shifted(torch.tensor([[0, 3, 9]])))
    assert native_calls(exe) == before + (call_path == "native")
    with pytest.raises(IndexRangeError, match=r"holds index 10 at position \(0, 2\)"):
        exe(torch.tensor([[-100, 3, 10]]))


def test_indices_computed_in_the_program_are_not_checked() -> None:
    # Documented as undefined (docs/precision.md): only a user input's own
    # values (through shape-only ops) are checked.
    def shifted(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.index_select(x, 0, i + 1)

    exe = hloalias.compile(shifted, (torch.ones(4, 2), torch.tensor([0])))
    assert exe._index_checks == () and "hloalias.index_ranges" not in exe.mlir
    exe(torch.ones(4, 2), torch.tensor([3]))  # undefined, not refused


def test_the_tightest_range_over_the_uses_is_recorded_in_the_contract() -> None:
    small, large = torch.nn.Embedding(6, 2), torch.nn.Embedding(10, 2)

    def both(ids: torch.Tensor) -> torch.Tensor:
        return large(ids) + small(ids.view(2, 1))[:, 0] + large(ids)

    program = import_torch(both, (torch.tensor([1, 2]),))
    with program.torch_mlir_module.context:
        records = verify(find_main(program.torch_mlir_module)).args
    ids = next(record for record in records if record.name == "ids")
    # The second use of `large` is implied by the first and left out.
    assert [(r.low, r.high, r.op, r.region) for r in ids.index_ranges] == [
        (0, 10, "aten.embedding", ()), (0, 6, "aten.embedding", ()),
    ]
    exe = hloalias.compile(both, (torch.tensor([1, 2]),))
    assert (exe._index_checks[0].low, exe._index_checks[0].high) == (0, 6)
    with pytest.raises(IndexRangeError, match="holds index 7 .*size 6"):
        exe(torch.tensor([1, 7]))


def test_the_contract_refuses_index_ranges_on_state_or_float_arguments() -> None:
    def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return x[i]

    program = import_torch(f, (torch.ones(3), torch.tensor([0])))
    module = program.torch_mlir_module
    with module.context:
        main = find_main(module)
        signature = Signature.read(main)
        moved = signature.args[1].index_ranges
        assert moved and moved[0] == IndexRange(-3, 3, "aten.index", moved[0].source)
        import dataclasses

        wrong = dataclasses.replace(
            signature, args=(dataclasses.replace(signature.args[0], index_ranges=moved), signature.args[1]),
        )
        wrong.write(main)
        with pytest.raises(IRError, match="'hloalias.index_ranges' is on an argument of type tensor<3xf32>"):
            verify(main)


def test_device_tensor_inputs_on_cpu_are_checked(call_path: str) -> None:
    model = Embed()
    exe = compile_on(call_path, model, (torch.tensor([1, 2]),))
    with pytest.raises(IndexRangeError, match="holds index 10"):
        exe(exe.to_device(torch.tensor([10, 2]), "ids"))
    torch.testing.assert_close(exe(exe.to_device(torch.tensor([9, 2]), "ids")), model(torch.tensor([9, 2])))


def test_the_check_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_INDEX_CHECK", "0")
    exe = hloalias.compile(Embed(), (torch.tensor([1, 2]),))
    assert exe._index_checks == ()
    assert "index checks per call: off (HLOALIAS_INDEX_CHECK=0)" in exe.explain()
    exe(torch.tensor([12, 1]))  # undefined (XLA clamps), as documented; not refused


def test_jit_and_the_dynamo_backend_refuse_too() -> None:
    model = Embed()
    jitted = hloalias.jit(model)
    torch.testing.assert_close(jitted(torch.tensor([1, 2])), model(torch.tensor([1, 2])))
    with pytest.raises(IndexRangeError, match="holds index 10"):
        jitted(torch.tensor([10, 2]))
    torch._dynamo.reset()
    compiled: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model, backend="hloalias")
    with torch.no_grad():
        torch.testing.assert_close(compiled(torch.tensor([1, 2])), model(torch.tensor([1, 2])))
        with pytest.raises(IndexRangeError, match="holds index -3"):
            compiled(torch.tensor([-3, 2]))
    torch._dynamo.reset()


def test_a_llama_model_refuses_an_id_past_the_vocabulary(call_path: str) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.tensor([[1, 5, 63]])
    exe = compile_on(call_path, model, (ids,), kwargs={"use_cache": False})
    with torch.no_grad():
        torch.testing.assert_close(exe(ids, use_cache=False).logits, model(ids, use_cache=False).logits,
                                   rtol=1e-4, atol=1e-4)
    with pytest.raises(IndexRangeError, match=r"input 'input_ids' holds index 64 at position \(0, 1\), out of "
                       r"range for aten.embedding into a dimension of size 64"):
        exe(torch.tensor([[1, 64, 2]]), use_cache=False)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8])
def test_the_native_range_check_is_the_python_one(dtype: torch.dtype) -> None:
    from hloalias.runtime import index_check

    if index_check._within is None:
        pytest.skip("the native call path is not built here")
    cases = [torch.tensor([[0, 9]]), torch.tensor([[0, 10]]), torch.tensor([-1, 3]), torch.tensor(4), torch.tensor([9])]
    for tensor in cases:
        tensor = tensor.to(dtype)
        for low, high in ((0, 10), (-10, 10), (-1, 4)):
            expected = bool(((tensor >= low) & (tensor < high)).all())
            assert index_check._within(tensor, low, high) is expected
    assert index_check._within(torch.arange(6).view(2, 3).t(), 0, 10) is None  # not contiguous: torch decides
    assert index_check._within(torch.tensor([1.0]), 0, 10) is None


def test_a_non_contiguous_input_is_checked_too(call_path: str) -> None:
    table = torch.nn.Embedding(10, 2)

    def look(ids: torch.Tensor) -> torch.Tensor:
        return table(ids) + 0

    exe = hloalias.compile(look, (torch.zeros(3, 2, dtype=torch.long),))
    ids = torch.tensor([[1, 2, 3], [4, 5, 10]]).t()  # (3, 2), strided
    with pytest.raises(IndexRangeError, match=r"holds index 10 at position \(2, 1\)"):
        exe(ids)
    ok = torch.tensor([[1, 2, 3], [4, 5, 9]]).t()
    torch.testing.assert_close(exe(ok), look(ok))


def test_select_and_transpose_of_the_input_map_positions_back() -> None:
    table = torch.nn.Embedding(10, 2)

    def rows(ids: torch.Tensor) -> torch.Tensor:
        return table(ids.t()[:, 1]) + 0  # reads ids[1, :] only

    exe = hloalias.compile(rows, (torch.zeros(2, 3, dtype=torch.long),))
    unread = torch.tensor([[-7, 99, 10], [1, 2, 3]])
    torch.testing.assert_close(exe(unread), rows(unread))
    with pytest.raises(IndexRangeError, match=r"holds index 10 at position \(1, 2\)"):
        exe(torch.tensor([[0, 0, 0], [1, 2, 10]]))
