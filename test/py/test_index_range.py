"""Index inputs out of the range eager accepts are refused before a call
runs (frontend/index_ranges.py, ``hloalias.index_ranges``,
runtime/plan.py's ``_IndexCheck``, the native lane's ranges): XLA clamps
a gather's and drops a scatter's out-of-range index where eager raises an
IndexError, which was a silently wrong result.  On both call paths, through
``jit`` and ``torch.compile``, and on a mesh."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import jax
import pytest
import torch

import hloalias
from hloalias import ExecutionError, IndexRangeError, Mesh


@pytest.fixture(params=["native", "python"])
def call_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Compile on the native lane (where the build has it) or, with
    ``HLOALIAS_NATIVE=0``, on the Python path."""
    path: str = request.param
    if path == "python":
        monkeypatch.setenv("HLOALIAS_NATIVE", "0")
    return path


def _compile(call_path: str, f: Any, args: tuple[Any, ...]) -> hloalias.Executable:
    exe = hloalias.compile(f, args)
    if call_path == "python":
        assert exe._lane is None
    return exe


class _Embed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) * 2


@pytest.mark.parametrize("bad, value, position", [(10, 10, [0, 2]), (-1, -1, [0, 2]), (123, 123, [0, 2])])
def test_embedding_id_out_of_vocabulary_is_an_index_error(
    call_path: str, bad: int, value: int, position: list[int]
) -> None:
    model = _Embed()
    exe = _compile(call_path, model, (torch.tensor([[1, 2, 3]]),))
    good = torch.tensor([[0, 9, 4]])
    torch.testing.assert_close(exe(good), model(good).detach())
    with pytest.raises(IndexError):  # eager's error type
        model(torch.tensor([[1, 2, bad]]))
    with pytest.raises(IndexRangeError) as caught:
        exe(torch.tensor([[1, 2, bad]]))
    message = str(caught.value)
    assert f"input 'ids' holds the index {value} at position {position}" in message
    assert "[0, 10) of aten.embedding" in message
    assert "test_index_range.py" in message and "self.embed(ids)" in message
    assert isinstance(caught.value, ExecutionError) and isinstance(caught.value, IndexError)
    if exe._lane is not None:  # the lane left the call to the Python path, which raised
        assert exe._lane.counts["fallbacks"] >= 1
    torch.testing.assert_close(exe(good), model(good).detach())


def _index_select(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x.index_select(1, i)


def _gather(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.gather(x, 1, i)


def _scatter(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x.scatter(1, i, 1.0)


def _scatter_add(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x.scatter_add(1, i, torch.ones_like(x[:, :1]))


def _index_copy(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x.index_copy(1, i.view(-1), torch.ones(3, 1))


def _index_add(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x.index_add(1, i.view(-1), torch.ones(3, 1))


_COLUMN = torch.tensor([[1], [2], [0]])
_OPS: dict[str, tuple[Callable[..., torch.Tensor], torch.Tensor, str]] = {
    "index_select": (_index_select, torch.tensor([1, 3]), "aten.index_select"),
    "gather": (_gather, _COLUMN, "aten.gather"),
    "scatter": (_scatter, _COLUMN, "aten.scatter"),
    "scatter_add": (_scatter_add, _COLUMN, "aten.scatter_add"),
    "index_copy": (_index_copy, torch.tensor([[2]]), "aten.index_copy"),
    "index_add": (_index_add, torch.tensor([[2]]), "aten.index_add"),
}


@pytest.mark.parametrize("name", sorted(_OPS))
@pytest.mark.parametrize("bad", [4, -1])
def test_out_of_range_index_of_each_op_is_refused(call_path: str, name: str, bad: int) -> None:
    f, index, op = _OPS[name]
    x = torch.randn(3, 4)
    exe = _compile(call_path, f, (x, index))
    torch.testing.assert_close(exe(x, index), f(x, index))
    wrong = index.clone()
    wrong.view(-1)[-1] = bad
    with pytest.raises((IndexError, RuntimeError)):  # eager refuses it
        f(x, wrong)
    with pytest.raises(IndexRangeError, match=rf"holds the index {bad} at .*\[0, 4\) of {op} "):
        exe(x, wrong)


class _Cache(torch.nn.Module):
    """A buffer written at user-given positions (index_copy_ / index_add_)."""

    def __init__(self, add: bool) -> None:
        super().__init__()
        self.add = add
        self.register_buffer("cache", torch.zeros(2, 6, 3))

    def forward(self, pos: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if self.add:
            self.cache.index_add_(1, pos, rows)
        else:
            self.cache.index_copy_(1, pos, rows)
        return self.cache.sum(1)


@pytest.mark.parametrize("add", [False, True], ids=["index_copy_", "index_add_"])
@pytest.mark.parametrize("bad", [6, -1, -6])
def test_in_place_writes_at_bad_positions_leave_the_state_untouched(call_path: str, add: bool, bad: int) -> None:
    eager, compiled = _Cache(add), _Cache(add)
    rows = torch.ones(2, 2, 3)
    exe = _compile(call_path, compiled, (torch.tensor([0, 1]), rows))
    pos = torch.tensor([2, 5])
    torch.testing.assert_close(exe(pos, rows), eager(pos, rows))
    before = {name: value.clone() for name, value in exe.state_dict().items()}
    with pytest.raises((IndexError, RuntimeError)):  # (on a copy: eager may have written some rows first)
        copy.deepcopy(eager)(torch.tensor([1, bad]), rows)
    with pytest.raises(IndexRangeError, match=rf"input 'pos' holds the index {bad} at position \[1\], .*\[0, 6\) of "
                       rf"aten\.index_{'add' if add else 'copy'} .*index_{'add' if add else 'copy'}_\(1, pos, rows\)"):
        exe(torch.tensor([1, bad]), rows)
    for name, value in exe.state_dict().items():
        torch.testing.assert_close(value, before[name])
    torch.testing.assert_close(exe(pos, rows), eager(pos, rows))


def _last_columns(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x[..., i] + x.take(i)


class _SetItem(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.zeros(5, 2))

    def forward(self, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.table.index_put_((i,), v)
        return self.table * 1


def test_negative_indices_eager_accepts_still_count_from_the_end(call_path: str) -> None:
    x = torch.randn(3, 4)
    exe = _compile(call_path, _last_columns, (x, torch.tensor([0, 1])))
    for index in ([-1, -4], [3, -2]):
        i = torch.tensor(index)
        torch.testing.assert_close(exe(x, i), _last_columns(x, i))
    with pytest.raises(IndexRangeError, match=r"holds the index -5 .*\[-4, 4\) of aten\.index "):
        exe(x, torch.tensor([0, -5]))
    eager, compiled = _SetItem(), _SetItem()
    v = torch.ones(2, 2)
    put = _compile(call_path, compiled, (torch.tensor([0, 1]), v))
    torch.testing.assert_close(put(torch.tensor([-1, -5]), v), eager(torch.tensor([-1, -5]), v))
    with pytest.raises(IndexRangeError, match=r"\[-5, 5\) of aten\.index_put"):
        put(torch.tensor([5, 0]), v)


def test_llama_with_an_id_beyond_the_vocabulary_is_refused(call_path: str) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 6))
    exe = hloalias.compile(model, (ids,), {"use_cache": False})
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits
    torch.testing.assert_close(exe(ids, use_cache=False)["logits"], expected)
    bad = ids.clone()
    bad[0, 3] = 64
    with pytest.raises(IndexError):
        model(bad, use_cache=False)
    with pytest.raises(IndexRangeError, match=r"input 'input_ids' holds the index 64 at position \[0, 3\], .*"
                       r"\[0, 64\) of aten\.embedding"):
        exe(bad, use_cache=False)


def test_jit_and_torch_compile_check_too() -> None:
    model = _Embed()
    jitted = hloalias.jit(model)
    good = torch.tensor([[1, 2]])
    torch.testing.assert_close(jitted(good), model(good).detach())
    with pytest.raises(IndexRangeError, match="holds the index 10"):
        jitted(torch.tensor([[1, 10]]))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="hloalias", dynamic=False)
    torch.testing.assert_close(compiled(good), model(good).detach())
    with pytest.raises(IndexRangeError, match="holds the index -3"):
        compiled(torch.tensor([[-3, 1]]))
    torch._dynamo.reset()


class _Decode(torch.nn.Module):
    """A decode step: its key written into a cache sharded by heads at a
    replicated position input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.k = torch.nn.Linear(16, 16, bias=False)
        self.register_buffer("k_cache", torch.zeros(4, 8, 4))

    def forward(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        k = self.k(token).view(4, 1, 4)
        self.k_cache.index_copy_(1, position, k)
        return (self.k_cache.sum(1) / math.sqrt(4)).reshape(1, -1)


def test_a_replicated_position_on_a_mesh_is_checked_on_the_host() -> None:
    if len(jax.devices("cpu")) < 2:
        pytest.skip("fewer than 2 cpu devices")
    eager, compiled = _Decode(), _Decode()
    mesh = Mesh((2,), ("tp",), platform="cpu")
    exe = hloalias.compile(
        compiled, (torch.randn(1, 16), torch.tensor([0])), mesh=mesh, shardings={"k_cache": ("tp", None, None)},
    )
    for step in range(3):
        token = torch.randn(1, 16)
        torch.testing.assert_close(exe(token, torch.tensor([step])), eager(token, torch.tensor([step])).detach())
    before = exe.state_dict()["k_cache"].clone()
    with pytest.raises(IndexRangeError, match=r"input 'position' holds the index 8 at position \[0\]"):
        exe(torch.randn(1, 16), torch.tensor([8]))
    torch.testing.assert_close(exe.state_dict()["k_cache"], before)


@pytest.mark.parametrize("native_check", [True, False], ids=["values_in_range", "aminmax"])
def test_the_python_paths_check_with_and_without_the_extension(
    monkeypatch: pytest.MonkeyPatch, native_check: bool
) -> None:
    """The Python path's check uses the extension's min/max pass where it is
    built and ``aminmax`` otherwise (and for a tensor the pass does not read:
    non-contiguous, a DeviceTensor's view): the same answers."""
    from hloalias.runtime import executable as executable_module, lane as lane_module

    monkeypatch.setenv("HLOALIAS_NATIVE", "0")
    if not native_check:
        monkeypatch.setattr(executable_module, "native_values_in_range", lambda: None)
    model = _Embed()
    exe = hloalias.compile(model, (torch.tensor([[1, 2, 3]]),))
    built = lane_module._build_refusal() is None
    assert (exe._index_checks[0].within is not None) == (native_check and built)
    strided = torch.tensor([[1, 4], [2, 10], [3, 5]]).t()  # [[1, 2, 3], [4, 10, 5]]: not contiguous
    torch.testing.assert_close(exe(strided[:1]), model(strided[:1]).detach())
    with pytest.raises(IndexRangeError, match=r"holds the index 10 at position \[0, 1\]"):
        exe(strided[1:])
    with pytest.raises(IndexRangeError, match=r"holds the index -2 at position \[0, 0\]"):
        exe(exe.to_device(torch.tensor([[-2, 0, 0]])))
    torch.testing.assert_close(exe(exe.to_device(torch.tensor([[9, 0, 1]]))), model(torch.tensor([[9, 0, 1]])).detach())


def test_the_lane_refuses_a_malformed_range_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A range row naming no input, with low above high, or twice for one input is an error when the lane is built."""
    import dataclasses

    from hloalias.runtime import lane as lane_module, plan as plan_module

    if lane_module._build_refusal() is not None:
        pytest.skip("the native call path is not built here")
    real = plan_module._NativeSteps.of
    for ranges in (((3, 0, 10),), ((0, 5, 4),), ((0, 0, 10), (0, 0, 10))):
        monkeypatch.setattr(
            plan_module._NativeSteps, "of",
            staticmethod(lambda exe, plan, ranges=ranges: dataclasses.replace(real(exe, plan), ranges=ranges)),
        )
        monkeypatch.setattr(lane_module, "_NativeSteps", plan_module._NativeSteps)
        with pytest.raises(ValueError, match="malformed range row"):
            hloalias.compile(_Embed(), (torch.tensor([[1, 2, 3]]),))
