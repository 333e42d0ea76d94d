"""One trace instead of export + decomposition retrace
(frontend/single_trace.py): a program that writes no tensor in place is
traced once, and imports to exactly the module and signature the two
traces give; a module whose forward visibly writes in place is traced
once by the writing trace (test_fx_export.py checks its programs); a
program that writes in place where the code look cannot see it (in a
helper, through ``x[i] = v``, ``+=``, ``out=`` or an operator call) is
exported and decomposed as before and still computes what eager does;
the module is left without hooks either way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.frontend import importer, single_trace


def _two_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importer, "_export_decomposed", lambda *_: None)


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.register_buffer("scale", torch.full((8,), 0.5), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, *, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = self.norm(out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)[..., :8]) * self.scale
        return out, q.transpose(0, 1)


class _Views(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x, x[1:3], x.t().contiguous(), x.detach(), x.flatten(), x.t().reshape(-1)


def _function(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x @ y).relu().transpose(0, 1).reshape(-1)


def _scaled(x: torch.Tensor, factor: int, *, mode: str = "mul", flag: bool = True) -> torch.Tensor:
    y = x * factor if mode == "mul" else x + factor
    return y.clamp(min=factor / 2) if flag else y


_PURE: dict[str, Callable[[], tuple[Any, tuple[Any, ...], dict[str, Any]]]] = {
    "tied_weights": lambda: (_Tied(), (torch.tensor([[1, 2, 3]]),), {}),
    "attention_kwargs_buffer": lambda: (
        _Attention(), (torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)), {"v": torch.randn(2, 4, 6, 8)}
    ),
    "views": lambda: (_Views(), (torch.randn(4, 4),), {}),
    "function": lambda: (_function, (torch.randn(3, 4), torch.randn(4, 5)), {}),
    "static_values": lambda: (_scaled, (torch.randn(4), 3), {"mode": "add", "flag": True}),
    "mlp": lambda: (
        torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3)), (torch.randn(5, 6),), {}
    ),
}


@pytest.mark.parametrize("name", sorted(_PURE))
def test_a_program_without_writes_is_traced_once_to_the_same_import(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    f, args, kwargs = _PURE[name]()
    single = importer._export_decomposed(f, args, kwargs)
    assert single is not None, "a program without in-place writes takes the single trace"
    ours = importer.import_torch(f, args, kwargs)
    _two_traces(monkeypatch)
    theirs = importer.import_torch(f, args, kwargs)
    assert ours.text == theirs.text
    assert ours.signature == theirs.signature
    assert list(ours.state) == list(theirs.state)
    if isinstance(f, torch.nn.Module):
        assert not f._forward_hooks and not f._forward_pre_hooks


def test_a_small_hf_model_is_traced_once_to_the_same_import(monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    args, kwargs = (torch.randint(0, 64, (2, 7)),), {"use_cache": False}
    assert importer._export_decomposed(model, args, kwargs) is not None
    ours = importer.import_torch(model, args, kwargs)
    _two_traces(monkeypatch)
    theirs = importer.import_torch(model, args, kwargs)
    assert ours.text == theirs.text
    assert ours.signature == theirs.signature


def _scale_in_place(t: torch.Tensor) -> torch.Tensor:
    return t.mul_(2)  # a helper's write: not in any forward's names


class _HelperWrite(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.t() + 0  # non-contiguous
        _scale_in_place(y)
        return y.reshape(-1)  # copies in eager


class _SetItem(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        y[0] = 3.0
        return y


class _AugmentedAssign(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.t() * 1
        y += x
        return y.flatten()


class _OutArgument(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(4, 4)
        torch.add(x, x, out=y)
        return y


class _OperatorCall(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        getattr(torch.ops.aten, "add_").Tensor(y, x)  # no in-place name in forward's code
        return y


class _CaughtWrite(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        try:  # a forward that swallows every error, the watch's too
            _scale_in_place(y)
        except Exception:
            pass
        return y


class _StridedScatter(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.as_strided_scatter(x, torch.ones(2, 2), (2, 2), (1, 2))


class _BufferWrite(torch.nn.Module):
    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x)
        return self.count * 2


_WRITING = {
    "helper_write": _HelperWrite,
    "setitem": _SetItem,
    "augmented_assign": _AugmentedAssign,
    "out_argument": _OutArgument,
    "operator_call": _OperatorCall,
    "caught_write": _CaughtWrite,
    "as_strided_scatter": _StridedScatter,
}


@pytest.mark.parametrize("name", sorted(_WRITING))
def test_a_program_that_writes_in_place_is_exported_and_decomposed(name: str) -> None:
    module = _WRITING[name]()
    x = torch.randn(4, 4)
    assert importer._export_decomposed(module, (x,), {}) is None
    assert not module._forward_hooks and not module._forward_pre_hooks
    reference = _WRITING[name]()
    reference.load_state_dict(module.state_dict())
    expected = reference(x.clone())
    hloalias.clear_cache()
    exe = hloalias.compile(module, (x.clone(),))
    torch.testing.assert_close(exe(x.clone()), expected)
    state = exe.state_dict()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(state[key], value)


def test_a_module_whose_forward_writes_its_state_is_traced_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The code look sends it to the writing trace (frontend/fx_export.py),
    which records the write as export does: the same import."""
    module = _BufferWrite()
    x = torch.randn(4, 4)
    assert importer._export_decomposed(module, (x,), {}) is not None
    assert not module._forward_hooks and not module._forward_pre_hooks
    ours = importer.import_torch(module, (x,))
    _two_traces(monkeypatch)
    theirs = importer.import_torch(module, (x,))
    assert ours.text == theirs.text
    assert ours.signature == theirs.signature


def test_the_code_look_sees_in_place_methods_of_submodules() -> None:
    assert single_trace.may_write_in_place(torch.nn.Sequential(torch.nn.Linear(2, 2), _BufferWrite()))
    assert not single_trace.may_write_in_place(torch.nn.Sequential(torch.nn.Linear(2, 2), _SetItem()))


def test_the_watch_is_removed_when_the_trace_fails() -> None:
    class Fails(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent control flow: export refuses
                return x
            return -x

    module = Fails()
    assert importer._export_decomposed(module, (torch.randn(3),), {}) is None
    assert not module._forward_hooks and not module._forward_pre_hooks
    assert torch._C._len_torch_function_stack() == 0
    with pytest.raises(hloalias.TorchImportError):
        importer.import_torch(module, (torch.randn(3),))
