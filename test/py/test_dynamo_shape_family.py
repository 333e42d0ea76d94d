"""``torch.compile(..., backend="hloalias")`` and the shape family
(hloalias.runtime.dynamo_backend, hloalias.runtime.shape_family): once
dynamo passes a size as an int input (automatic dynamic shapes), a new
size is specialized from one dynamic export of its graph, and results
equal eager's at every size (MLP, HF GPT-2 and Llama, greedy generate);
with ``dynamic=True``, whose graphs also read numbers, one family per set
of the numbers' values."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hloalias.runtime import dynamo_backend, shape_family


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # These tests count the family's imports, which a program-cache hit
    # skips: the suite's disk cache may hold the same graph, compiled by
    # another test of the run (test_dynamo_program_cache.py tests hits).
    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "0")
    torch._dynamo.reset()
    shape_family.clear_shape_families()
    yield
    torch._dynamo.reset()
    shape_family.clear_shape_families()


def _counts() -> tuple[int, int, int, int, int]:
    stats = shape_family.shape_family_stats()
    return stats.first, stats.static, stats.exported, stats.specialized, stats.fallbacks


def test_mlp_new_batches_are_specialized_from_one_export() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3)).eval()
    compiled = torch.compile(model, backend="hloalias")
    before = dynamo_backend.compiled_graphs()
    with torch.no_grad():
        for batch in (2, 3, 5, 7, 5):
            x = torch.randn(batch, 6)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    known = {id(graph) for graph in before}
    graphs = [graph for graph in dynamo_backend.compiled_graphs() if id(graph) not in known]
    # Dynamo's static graph for batch 2; its dynamic graph from batch 3, the
    # batch an int input: batch 3 its family's first (static) import, batch 5
    # the dynamic export, 5 and 7 specialized from it, the second 5 a cache hit.
    # The static graph is the first of a family of its own (its key is the
    # program cache's), which dynamo's guards never give a second size.
    assert [(g.stats.compiles, g.stats.hits) for g in graphs] == [(1, 0), (3, 1)]
    ((_, _, dim),) = graphs[1].sizes or ()  # the one int input: dimension 0 of x
    assert dim == 0
    assert _counts() == (2, 0, 1, 2, 0)
    # The dynamic graph's Jit sees the tensors only.
    assert all("float32[" in s and ", " not in s.split("float32")[0] for s in graphs[1].jit.signatures)


def test_an_int_that_is_not_the_tensor_size_runs_the_graph_as_given() -> None:
    captured: list[Any] = []

    def spy(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        compiled = dynamo_backend.hloalias_backend(gm, example_inputs)
        captured.append(compiled)
        return compiled

    f = torch.compile(lambda x: x.sum() + torch.arange(x.shape[0]), backend=spy)
    for n in (2, 3):
        torch.testing.assert_close(f(torch.ones(n, 4)), 4.0 * n + torch.arange(n))
    graph = captured[-1]
    assert graph.sizes is not None and graph._unsized is None
    placeholders = [n for n in graph._graph.graph.nodes if n.op == "placeholder"]
    # Called as dynamo never would: the int (4) disagrees with the tensor's rows (3).
    x = torch.ones(3, 4)
    args = [4 if isinstance(n.meta.get("example_value"), torch.SymInt) else x for n in placeholders]
    (result,) = graph(*args)
    torch.testing.assert_close(result, 12.0 + torch.arange(4))
    assert graph._unsized is not None


def _gpt2() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()


def _llama() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, max_position_embeddings=64, bos_token_id=0, eos_token_id=None, pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_hf_new_lengths_are_specialized_and_equal_eager(build: Any) -> None:
    torch.manual_seed(0)
    model = build()
    compiled = torch.compile(model, backend="hloalias")
    with torch.no_grad():
        for length in (16, 24, 40, 9):
            ids = torch.randint(1, 100, (1, length))
            ours = compiled(ids, use_cache=False).logits
            torch.testing.assert_close(ours, model(ids, use_cache=False).logits, rtol=1e-4, atol=1e-4)
    # 16: dynamo's static graph (a family's first, never given another size);
    # 24: its dynamic graph's first import; 40 and 9 specialized.
    assert _counts() == (2, 0, 1, 2, 0)


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_greedy_generate_of_compiled_forward_equals_eager_at_new_lengths(build: Any) -> None:
    torch.manual_seed(0)
    model = build()
    eager = copy.deepcopy(model)
    model.forward = torch.compile(model.forward, backend="hloalias")
    for length in (5, 8, 11, 7):
        ids = torch.randint(1, 100, (1, length))
        ours = model.generate(ids, max_new_tokens=4, do_sample=False)
        theirs = eager.generate(ids, max_new_tokens=4, do_sample=False)
        assert ours.tolist() == theirs.tolist()
    # Prompts and decode steps of new lengths specialized from the graphs' exports.
    assert shape_family.shape_family_stats().specialized > 0
    assert shape_family.shape_family_stats().fallbacks == 0


class _ScaledDropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.1)
        self.scale = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x)) * self.scale


def test_dynamic_true_graph_with_numbers_has_a_family_per_set_of_values() -> None:
    """``dynamic=True``: dynamo passes ``Dropout.p`` and ``self.scale`` as
    numbers beside the size; each set of their values is a ``_SizedGraph``
    of its own with the values fixed, whose sizes form a family."""
    torch.manual_seed(0)
    model = _ScaledDropout().eval()
    compiled = torch.compile(model, backend="hloalias", dynamic=True)
    before = dynamo_backend.compiled_graphs()
    with torch.no_grad():
        for rows, scale in ((3, 0.5), (5, 0.5), (7, 0.5), (9, 0.5), (5, 2.0), (7, 0.5)):
            model.scale = scale
            x = torch.randn(rows, 4)
            torch.testing.assert_close(compiled(x), model(x))
    known = {id(graph) for graph in before}
    (graph,) = [g for g in dynamo_backend.compiled_graphs() if id(g) not in known]
    assert len(graph.scalar_positions) == 2 and graph.sizes is not None
    # scale 0.5: 3 its family's first import, 5 the dynamic export, 5, 7
    # and 9 specialized from it; scale 2.0: a family of its own (its
    # first import at 5); the last (7, 0.5) a cache hit.
    assert _counts() == (2, 0, 1, 3, 0)
    assert (graph.stats.compiles, graph.stats.hits) == (5, 1)


def test_dynamic_true_gpt2_new_lengths_are_specialized_and_equal_eager() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    compiled = torch.compile(model, backend="hloalias", dynamic=True)
    with torch.no_grad():
        for length in (8, 12, 16, 5):
            ids = torch.randint(0, 64, (1, length))
            torch.testing.assert_close(compiled(ids, use_cache=False).logits,
                                       model(ids, use_cache=False).logits, rtol=1e-5, atol=1e-5)
    # One graph (the length and the numbers GPT-2 reads as inputs): 8 its
    # family's first import, 12 the dynamic export, 12, 16 and 5 specialized.
    assert _counts() == (1, 0, 1, 3, 0)
