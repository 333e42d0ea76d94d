"""``torch.compile(..., backend="hloalias")`` (hloalias.runtime.dynamo_backend):
results, module state and tokens equal eager's; mutated buffers aliased in
place; one compile per shape; graph breaks; training through AOTAutograd;
HF GPT-2 (DynamicCache decode loop) and Llama (static-cache generate)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hloalias.errors import CompileError, ExecutionError, TorchImportError
from hloalias.runtime import dynamo_backend


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _new_graphs(before: list[dynamo_backend.CompiledGraph]) -> list[dynamo_backend.CompiledGraph]:
    known = {id(graph) for graph in before}
    return [graph for graph in dynamo_backend.compiled_graphs() if id(graph) not in known]


def test_backend_name_works_without_importing_hloalias() -> None:
    program = (
        "import sys, torch\n"
        "f = torch.compile(lambda x: x * 2 + 1, backend='hloalias')\n"
        "print(f(torch.ones(3)).tolist(), 'hloalias.runtime.dynamo_backend' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[3.0, 3.0, 3.0] True"


class _BufferWriter(torch.nn.Module):
    """Writes a row of a buffer in place and returns a view of the buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("buf", torch.zeros(3, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        self.buf[0].add_(y.sum(0))
        return y, self.buf[1:]


def test_buffer_written_in_place_and_returned_view() -> None:
    torch.manual_seed(0)
    model = _BufferWriter()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="hloalias")
    before = dynamo_backend.compiled_graphs()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 4)
            (y, view), (y_eager, view_eager) = compiled(x), eager(x)
            torch.testing.assert_close(y, y_eager)
            torch.testing.assert_close(view, view_eager)
            torch.testing.assert_close(model.buf, eager.buf)
            # A real view of the module's own buffer, not a copy.
            assert view.untyped_storage().data_ptr() == model.buf.untyped_storage().data_ptr()
            assert view.storage_offset() == 4
    (graph,) = _new_graphs(before)
    assert graph.kind == "inference" and (graph.stats.compiles, graph.stats.hits) == (1, 2)
    (executable,) = graph.jit.executables
    # The buffer is aliased to its new value (XLA writes in place) and never copied back.
    assert [(a["origin"], a["bytes"]) for a in executable.aliases] == [("inferred", 48)]
    assert executable.memory_stats["alias_bytes"] == 48
    assert sum(executable.host_copies.values()) == 0


def test_mlp_new_shapes_compile_once_each_and_are_cached() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3)).eval()
    compiled = torch.compile(model, backend="hloalias")
    before = dynamo_backend.compiled_graphs()
    with torch.no_grad():
        for batch in (2, 3, 5, 3, 2, 5):
            x = torch.randn(batch, 6)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    graphs = _new_graphs(before)
    # Dynamo's static graph for batch 2, then its dynamic graph (the batch an int input), which
    # dynamo tries first from then on: batch 2 is compiled once more there, each batch once.
    assert [(g.stats.compiles, g.stats.hits) for g in graphs] == [(1, 0), (3, 2)]
    # Least recently used first; the int input is x's size, read from x (the graph is called with tensors only).
    for signature, batch in zip(graphs[1].jit.signatures, (3, 2, 5), strict=True):
        assert f"float32[{batch}, 6]" in signature and f" {batch}," not in signature
    static = dynamo_backend.compiled_graphs()
    with torch.no_grad():
        x = torch.randn(7, 6)
        torch.testing.assert_close(torch.compile(model, backend="hloalias", dynamic=False)(x), model(x))
    assert [g.stats.compiles for g in _new_graphs(static)] == [1]
    assert "signature 0" in dynamo_backend.explain()


def test_graph_break_compiles_each_subgraph() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.sin() * 2
        torch._dynamo.graph_break()
        return y.cos() + 1

    compiled = torch.compile(f, backend="hloalias")
    before = dynamo_backend.compiled_graphs()
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), f(x))
    assert len(_new_graphs(before)) == 2


def _train_beside_eager(
    model: torch.nn.Module, eager: torch.nn.Module, batch: Any, steps: int,
) -> None:
    """``steps`` SGD-momentum steps of ``torch.compile(model)`` beside the
    same steps of ``eager``: losses and parameters must agree."""
    compiled = torch.compile(model, backend="hloalias")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, eager)]
    for _ in range(steps):
        x, target = batch()
        losses = []
        for module, optimizer in zip((compiled, eager), optimizers):
            loss = torch.nn.functional.mse_loss(module(x), target)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss)
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_training_through_aot_autograd_equals_eager() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    eager = copy.deepcopy(model)
    before = dynamo_backend.compiled_graphs()
    _train_beside_eager(model, eager, lambda: (torch.randn(4, 6), torch.randn(4, 2)), steps=3)
    graphs = _new_graphs(before)
    assert [(g.kind, g.stats.compiles, g.stats.hits) for g in graphs] == [("forward", 1, 2), ("backward", 1, 2)]


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 5, 3, 2, 8).unbind(2)
        y = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.out(torch.nn.functional.silu(y.transpose(1, 2).reshape(2, 5, 16)))


def test_training_sdpa_and_silu_through_aot_autograd_equals_eager() -> None:
    # What every HF attention model's training step is: SDPA's fused CPU
    # kernel and its backward, and silu_backward, which torch-mlir cannot
    # lower, used to reach the graphs (TorchImportError at the first call).
    torch.manual_seed(0)
    model = _Attention()
    eager = copy.deepcopy(model)
    # SGD (in the helper): Adam would amplify the rounding noise of the key
    # bias's gradient (exactly zero in exact arithmetic: softmax ignores a
    # shift of k).
    _train_beside_eager(model, eager, lambda: (torch.randn(2, 5, 16), torch.randn(2, 5, 4)), steps=2)


def test_unknown_option_is_refused() -> None:
    compiled = torch.compile(lambda x: x + 1, backend="hloalias", options={"pipelin": "x"})
    # Dynamo wraps what a backend raises; the cause is ours, named in the message.
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="CompileError: hloalias backend: unknown option") as failed:
        compiled(torch.ones(2))
    assert isinstance(failed.value.inner_exception, CompileError)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="cache_size must be a positive int") as failed:
        torch.compile(lambda x: x + 1, backend="hloalias", options={"cache_size": "8"})(torch.ones(2))
    assert isinstance(failed.value.inner_exception, ExecutionError)
    with pytest.raises(CompileError, match="unknown option"):
        dynamo_backend.hloalias_backend(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.ones(2)], {"pipelin": "x"})


def test_torch_compile_modes_are_accepted_and_unknown_ones_refused() -> None:
    # Hugging Face's recipe passes mode="reduce-overhead": it reached the
    # backend as an unknown option and failed.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU()).eval()
    x = torch.randn(2, 4)
    for mode in ("reduce-overhead", "max-autotune", "default"):
        torch._dynamo.reset()
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(model, backend="hloalias", mode=mode)(x), model(x))
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="mode='fastest' is not one of") as failed:
        torch.compile(model, backend="hloalias", mode="fastest")(x)
    assert isinstance(failed.value.inner_exception, CompileError)


def test_gpt2_dynamic_cache_decode_loop_equals_eager() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="hloalias")
    ids = torch.randint(0, 100, (1, 5))
    with torch.no_grad():
        ours, theirs = compiled(ids), eager(ids)
        for _ in range(3):  # the cache grows by one position per step
            torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-4, atol=1e-4)
            token = theirs.logits[:, -1:].argmax(-1)
            assert torch.equal(ours.logits[:, -1:].argmax(-1), token)
            ours = compiled(token, past_key_values=ours.past_key_values)
            theirs = eager(token, past_key_values=theirs.past_key_values)
        torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-4, atol=1e-4)
    for layer_ours, layer_theirs in zip(ours.past_key_values.layers, theirs.past_key_values.layers):
        torch.testing.assert_close(layer_ours.keys, layer_theirs.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(layer_ours.values, layer_theirs.values, rtol=1e-4, atol=1e-4)


def test_llama_static_cache_generate_equals_eager() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, max_position_embeddings=32, bos_token_id=0, eos_token_id=None, pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    eager = copy.deepcopy(model)
    # Hugging Face's recipe for compiled generation.
    model.forward = torch.compile(model.forward, backend="hloalias")  # type: ignore[method-assign]
    before = dynamo_backend.compiled_graphs()
    ids = torch.randint(1, 100, (1, 6))
    ours = model.generate(ids, max_new_tokens=5, do_sample=False, cache_implementation="static")
    theirs = eager.generate(ids, max_new_tokens=5, do_sample=False, cache_implementation="static")
    assert torch.equal(ours, theirs)
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value)
    graphs = _new_graphs(before)
    # Prefill, then one decode graph reused for every new token, its KV cache written in place.
    assert sum(g.stats.compiles for g in graphs) == 2 and sum(g.stats.hits for g in graphs) == 3
    decode = graphs[-1].jit.executables[0]
    aliased = {a["argument"] for a in decode.aliases if a["origin"] == "inferred"}
    for layer in range(config.num_hidden_layers):  # every layer's K and V cache (and its length counter)
        for kind in ("keys", "values", "cumulative_length"):
            assert f"l_kwargs_past_key_values_layers_{layer}_{kind}" in aliased
    assert sum(decode.host_copies.values()) == 0


def test_graph_hloalias_cannot_import_raises_its_error_at_the_first_call() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.ldl_factor(x @ x.T)[0]  # JAX has no LDL rule to splice in

    compiled = torch.compile(f, backend="hloalias")
    with pytest.raises(TorchImportError, match="cannot lower aten.linalg_ldl_factor_ex"):
        compiled(torch.randn(3, 3))


def test_training_with_batch_norm_statistics_equals_eager() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 1))
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="hloalias")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, eager)]
    for _ in range(3):
        x = torch.randn(8, 4)
        for module, optimizer in zip((compiled, eager), optimizers):
            module(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    # Parameters, running statistics and the batch counter (AOTAutograd copies the buffers back).
    for (name, ours), theirs in zip(model.state_dict().items(), eager.state_dict().values(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)
    assert int(model[1].num_batches_tracked) == 3


class _ScaledDropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.1)
        self.scale = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x)) * self.scale


def test_dynamic_true_passes_python_floats_as_numbers_and_follows_their_values() -> None:
    """``dynamic=True`` makes dynamo pass the floats a forward reads
    (``Dropout.p``, ``self.scale``) as 0-d tensor inputs turned back into
    numbers by ``.item()``: ``torch.export`` refused that as a data-dependent
    value (every HF model with dropout failed).  They are numbers here, one
    executable per value, so a changed value (dynamo does not recompile for
    it) runs its own program."""
    model = _ScaledDropout().eval()
    before = dynamo_backend.compiled_graphs()
    compiled = torch.compile(model, backend="hloalias", dynamic=True)
    with torch.no_grad():
        for rows, scale in ((3, 0.5), (5, 0.5), (5, 2.0), (7, -1.5), (3, 0.5)):
            model.scale = scale
            x = torch.randn(rows, 4)
            torch.testing.assert_close(compiled(x), model(x))
    (graph,) = _new_graphs(before)
    assert len(graph.scalar_positions) == 2
    assert graph.stats.compiles == 4  # (3, 0.5), (5, 0.5), (5, 2.0), (7, -1.5); then a hit


def test_hloalias_jit_cache_size_bounds_a_graphs_number_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """HLOALIAS_JIT_CACHE_SIZE is the graphs' default cache_size: with 1, a
    graph keeps the Jit of one set of number values, so a value seen two
    sets ago compiles again (options' cache_size wins over it)."""
    monkeypatch.setenv("HLOALIAS_JIT_CACHE_SIZE", "1")
    model = _ScaledDropout().eval()
    before = dynamo_backend.compiled_graphs()
    compiled = torch.compile(model, backend="hloalias", dynamic=True)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for scale in (0.5, 2.0, 0.5):
            model.scale = scale
            torch.testing.assert_close(compiled(x), model(x))
    (graph,) = _new_graphs(before)
    assert graph.jit.cache_size == 1
    assert (graph.stats.compiles, graph.stats.hits, graph.stats.evictions) == (3, 0, 2)
    torch._dynamo.reset()
    before = dynamo_backend.compiled_graphs()
    torch.compile(lambda t: t + 1, backend="hloalias", options={"cache_size": 3})(torch.ones(2))
    (graph,) = _new_graphs(before)
    assert graph.jit.cache_size == 3


def test_dynamic_true_generate_of_a_transformers_gpt2_equals_eager() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.generation_config.pad_token_id = 0
    ids = torch.randint(0, 64, (2, 5))
    expected = model.generate(ids, max_new_tokens=4, do_sample=False)
    model.forward = torch.compile(model.forward, backend="hloalias", dynamic=True)
    assert model.generate(ids, max_new_tokens=4, do_sample=False).tolist() == expected.tolist()
