"""A specialization computes each op once per (operator, arguments'
metadata) and rebuilds repeats (frontend/shape_specialization.py,
``_Results``): the specialized graph's fake values are those of the fake
mode's own dispatch, node for node (sizes, strides, offsets, dtypes,
storage sizes and which nodes share a storage), and a repeat never takes
another op's result (a Python int and float scalar promote differently; a
view is a view of its own input)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from hloalias.frontend import shape_specialization
from hloalias.frontend.shape_specialization import _Results, export_dynamic, specialize

aten = torch.ops.aten


class Blocks(torch.nn.Module):
    """Three identical attention-like blocks: views (reshape, transpose,
    slices, unsqueeze, expand) and new tensors, repeated on tensors of the
    same metadata."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 48) for _ in range(3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        batch, length = ids.shape
        for layer in self.layers:
            q, k, v = layer(h).reshape(batch, length, 3, 4, 4).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            scores = (q @ k.transpose(-1, -2)) / 2.0
            mask = torch.ones(length, length, dtype=torch.bool).tril().unsqueeze(0).expand(4, length, length)
            attention = scores.masked_fill(~mask, -1e9).softmax(-1) @ v
            h = h + attention.transpose(1, 2).reshape(batch, length, 16)[:, :, :16]
        return h[:, 1:] * 2


def _ids(length: int) -> torch.Tensor:
    return torch.arange(2 * length).reshape(2, length) % 32


def _described(program: Any) -> list[tuple[Any, ...]]:
    """Every node's fake value as what the importer reads of it, storages
    named by their first node."""
    storages: dict[int, str] = {}
    rows: list[tuple[Any, ...]] = []
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            storage = storages.setdefault(value.untyped_storage()._cdata, node.name)
            rows.append((
                node.name, str(node.target), type(value).__name__, tuple(value.shape), value.stride(),
                value.storage_offset(), value.dtype, value.device, value.requires_grad,
                value.untyped_storage().nbytes(), storage, node.meta["tensor_meta"],
            ))
        else:
            rows.append((node.name, str(node.target), value))
    return rows


def _dispatched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every op through the fake mode's dispatch (no reuse)."""
    monkeypatch.setattr(_Results, "value", lambda self, target, args, kwargs: target(*args, **kwargs))


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    rebuilt = [0]
    rebuild = _Results._rebuild

    def counted(self: _Results, known: Any, tensors: list[torch.Tensor]) -> torch.Tensor:
        rebuilt[0] += 1
        return rebuild(self, known, tensors)

    monkeypatch.setattr(_Results, "_rebuild", counted)
    return rebuilt


def test_repeated_blocks_specialize_as_dispatched() -> None:
    torch.manual_seed(0)
    model = Blocks().eval()
    dynamic = export_dynamic(model, (_ids(8),), {}, [frozenset({1})])
    for length in (3, 5, 8, 17, 33):
        with pytest.MonkeyPatch.context() as patch:
            rebuilt = _counting(patch)
            reused = _described(specialize(dynamic, (_ids(length),), {}))
        assert rebuilt[0] > 0, "the repeated blocks' ops were not reused"
        with pytest.MonkeyPatch.context() as patch:
            _dispatched(patch)
            dispatched = _described(specialize(dynamic, (_ids(length),), {}))
        assert reused == dispatched
        out = specialize(dynamic, (_ids(length),), {}).module()(_ids(length))
        torch.testing.assert_close(out, model(_ids(length)))


def test_tiny_llama_specializes_as_dispatched() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 12))
    dynamic = export_dynamic(model, (ids,), {}, [frozenset({1})])
    for length in (5, 12, 31):
        ids = torch.randint(0, 64, (1, length))
        with pytest.MonkeyPatch.context() as patch:
            rebuilt = _counting(patch)
            reused = _described(specialize(dynamic, (ids,), {}))
        assert rebuilt[0] > 0
        with pytest.MonkeyPatch.context() as patch:
            _dispatched(patch)
            assert reused == _described(specialize(dynamic, (ids,), {}))


def test_a_repeat_is_keyed_by_argument_types_and_views_its_own_input() -> None:
    mode = FakeTensorMode()
    results = _Results(mode)
    with mode:
        whole = torch.empty(4, 6, dtype=torch.int64)
        first, second = torch.empty(4, 6), torch.empty(4, 6)
        # 2 and 2.0 are equal keys of a dict: the key holds their types.
        assert results.value(aten.mul.Tensor, (whole, 2), {}).dtype == torch.int64
        assert results.value(aten.mul.Tensor, (whole, 2.0), {}).dtype == torch.float32
        assert results.value(aten.mul.Tensor, (whole, 2), {}).dtype == torch.int64
        views = [results.value(aten.view.default, (base, [6, 4]), {}) for base in (first, second)]
        sliced = [results.value(aten.slice.Tensor, (base, 1, 2, 5), {}) for base in (first, second)]
    for base, view, part in zip((first, second), views, sliced):
        assert isinstance(view, FakeTensor) and view.untyped_storage() is base.untyped_storage()
        assert (tuple(view.shape), view.stride()) == ((6, 4), (4, 1))
        assert part.untyped_storage() is base.untyped_storage()
        assert (tuple(part.shape), part.stride(), part.storage_offset()) == ((4, 3), (6, 1), 2)
    assert len(results.known) == 4  # mul by an int, by a float, the view and the slice: once each
    with mode:
        # The key holds which arguments share a storage, and each one's storage size.
        results.value(aten.add.Tensor, (first, first), {})
        results.value(aten.add.Tensor, (first, second), {})
        results.value(aten.add.Tensor, (torch.empty(8, 6)[:4], second), {})
    assert len(results.known) == 7


def test_results_dispatch_what_they_cannot_rebuild() -> None:
    mode = FakeTensorMode()
    results = _Results(mode)
    with mode:
        x = torch.empty(3, 5)
        leaf = torch.empty(3, 5, requires_grad=True)
        # An op that mutates its input, one with two results, and one whose
        # result requires grad (not a leaf): never rebuilt.
        for _ in range(2):
            assert results.value(aten.add_.Tensor, (x, x), {}) is x
            values, indices = results.value(aten.max.dim, (x, 1), {})
            assert values.shape == (3,) and indices.dtype == torch.int64
            doubled = results.value(aten.mul.Tensor, (leaf, 2), {})
            assert doubled.requires_grad and doubled.grad_fn is not None
    # max.dim and mul were keyed and recorded as not rebuildable; add_ never keyed.
    assert list(results.known.values()) == [None, None]


def test_a_specialization_adds_nothing_to_torchs_fake_tensor_cache() -> None:
    """Its ops are the first of their metadata at these sizes (misses):
    dispatched without the process-wide cache, which each new length would
    otherwise grow, and the values are the cached dispatch's."""
    torch.manual_seed(0)
    model = Blocks().eval()
    dynamic = export_dynamic(model, (_ids(8),), {}, [frozenset({1})])
    for length in (5, 19):
        entries, misses = len(FakeTensorMode.cache), FakeTensorMode.cache_misses
        uncached = _described(specialize(dynamic, (_ids(length),), {}))
        assert (len(FakeTensorMode.cache), FakeTensorMode.cache_misses) == (entries, misses)
        with pytest.MonkeyPatch.context() as patch:
            # The cached dispatch, as before: the same values node for node.
            patch.setattr(shape_specialization, "disable_fake_tensor_cache", lambda mode: contextlib.nullcontext())
            assert _described(specialize(dynamic, (_ids(length),), {})) == uncached
