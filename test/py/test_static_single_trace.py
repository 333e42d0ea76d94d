"""The static first import of a transformers-shaped model from one
``make_fx`` trace (frontend/fx_export.py, frontend/single_trace.py): a
returned cache (a registered pytree node), tensors made in ``forward``
(lifted as export lifts them), tied weights and dropout out of training no
longer send the import to ``torch.export``'s post-dispatch trace after the
``make_fx`` trace ran to the end; the import is the one that trace gives
(module text and signature) and the compiled program computes what eager
does.  A trace stopped mid-forward leaves no mode behind, so the
post-dispatch trace after it takes the program (before, it failed on the
stopped trace's modes and the training IR and the retrace ran).  Counted
(``single_trace_stats``, the traces' calls), never timed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import hloalias
from cache_shaped import CacheAndMadeConstants
from hloalias.frontend import fx_export, importer, single_trace, torch_internals


class _Counted:
    """Counts the calls of the traces after a declined ``make_fx`` trace:
    ``torch.export``'s post-dispatch trace, the training IR and its
    decomposition retrace."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for owner, name in ((torch_internals, "export_decomposed"), (importer, "_export"), (importer, "decompose")):
            original = getattr(owner, name)

            def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
                self.calls.append(_name)
                return _original(*args, **kwargs)

            monkeypatch.setattr(owner, name, counted)


def _import_as_main_did(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                        monkeypatch: pytest.MonkeyPatch) -> importer.Program:
    """The import with the ``make_fx`` trace declining: ``torch.export``'s
    post-dispatch trace with the table, as these models took it before."""
    with monkeypatch.context() as patch:
        patch.setattr(fx_export, "exported_from_trace", lambda *_, **__: None)
        return importer.import_torch(model, args, kwargs)


def _tensors(tree: Any) -> list[torch.Tensor]:
    if hasattr(tree, "to_tuple"):
        tree = tree.to_tuple()
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def _assert_one_trace_and_equal(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    single_trace.clear_single_trace_stats()
    counted = _Counted(monkeypatch)
    ours = importer.import_torch(model, args, kwargs)
    stats = single_trace.single_trace_stats()
    assert (stats.make_fx, stats.post_dispatch, stats.training_ir) == (1, 0, 0), stats.reasons
    # _training_ir_ops (a crash report's op list) may export lazily; nothing else ran.
    assert counted.calls == []
    theirs = _import_as_main_did(model, args, kwargs, monkeypatch)
    assert "export_decomposed" in counted.calls
    assert ours.text == theirs.text
    assert ours.signature == theirs.signature
    assert list(ours.state) == list(theirs.state)
    hloalias.clear_cache()
    exe = hloalias.compile(model, args, kwargs)
    with torch.no_grad():
        got, expected = _tensors(exe(*args, **kwargs)), _tensors(model(*args, **kwargs))
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert torch._C._len_torch_function_stack() == 0


def test_a_cache_output_made_tensors_tied_weights_and_eval_dropout_take_one_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    _assert_one_trace_and_equal(CacheAndMadeConstants().eval(), (torch.tensor([[1, 2, 3, 4]]),), {}, monkeypatch)


def _tiny(name: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "llama":
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return transformers.LlamaForCausalLM(config).eval()  # type: ignore[no-any-return]
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval()  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_causal_lm_returning_its_cache_is_traced_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama: a ``DynamicCache`` output and its layers' ``torch.tensor([])``;
    GPT-2 besides: a tied head and dropout modules (eval)."""
    model = _tiny(name)
    _assert_one_trace_and_equal(model, (torch.randint(0, 64, (1, 9)),), {}, monkeypatch)


class _TrainingDropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(self.linear(x), 0.5, training=True) + 1


def test_a_trace_stopped_mid_forward_leaves_the_post_dispatch_trace_working(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ``make_fx`` trace declines dropout in training (export keeps its
    op) with the importer's write guard active: the modes the stopped
    trace entered are gone, and export's post-dispatch trace takes the
    program instead of the training IR and its retrace."""
    single_trace.clear_single_trace_stats()
    counted = _Counted(monkeypatch)
    module = _TrainingDropout()
    assert importer._export_decomposed(module, (torch.randn(3, 4),), {}) is not None
    stats = single_trace.single_trace_stats()
    assert (stats.make_fx, stats.post_dispatch, stats.training_ir) == (0, 1, 0), stats.reasons
    assert stats.reasons == ["dropout"]
    assert counted.calls == ["export_decomposed"]
    assert torch._C._len_torch_function_stack() == 0
    assert not module._forward_hooks and not module._forward_pre_hooks


def test_one_submodule_under_two_names_is_left_to_export() -> None:
    class Shared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = torch.nn.Linear(4, 4)
            self.second = self.first

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.second(torch.relu(self.first(x)))

    declined: list[str] = []
    table = importer._decomposition_table_with_custom_ops()
    module, x = Shared(), torch.randn(2, 4)
    assert fx_export.exported_from_trace(module, (x,), {}, table, declined=declined) is None
    assert declined == ["a submodule registered under two names"]
    torch.testing.assert_close(hloalias.compile(module, (x,))(x), module(x))


class _WritesAndMakes(torch.nn.Module):
    """Writes its buffer (the code look sends it to the writing trace) and
    makes a tensor in forward."""

    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x)
        return self.count * torch.tensor([1.0, 2.0, 3.0])


def test_a_writing_program_that_makes_tensors_keeps_the_training_irs_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writing trace's alternative is the training IR, which may order
    lifted constants before the buffers (a Llama's): the trace declines
    them, as before, and the import is the two traces'."""
    declined: list[str] = []
    table = importer._decomposition_table_with_custom_ops()
    x = torch.ones(3)
    assert fx_export.exported_from_trace(_WritesAndMakes(), (x,), {}, table, mutations=True,
                                         declined=declined) is None
    assert declined == ["tensor constant in a writing trace"]
    ours = importer.import_torch(_WritesAndMakes(), (x,))
    monkeypatch.setattr(importer, "_export_decomposed", lambda *_, **__: None)
    theirs = importer.import_torch(_WritesAndMakes(), (x,))
    assert ours.text == theirs.text
    assert ours.signature == theirs.signature
