"""The decomposed program from one ``make_fx`` trace
(frontend/fx_export.py) is the program ``torch.export`` and the
decompositions give: the same graph code, signature, placeholder names,
call trees, state and constants; programs whose signature the trace
cannot tell are left to ``torch.export`` (None), and the importer's single
trace no longer runs ``torch.export`` for the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.frontend import fx_export, importer, single_trace, torch_internals


class _Seed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x[0:16].view(2, 8)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(8, 16)
        self.l2 = torch.nn.Linear(16, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.register_buffer("shift", torch.ones(4), persistent=False)

    def forward(
        self, x: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor], *, k: int = 2, named: Any = None
    ) -> dict[str, Any]:
        h = torch.relu(self.l1(x))
        out = self.norm(self.l2(h)) * self.scale + self.shift * k + pair[0].sum() - pair[1].mean()
        return {"out": out, "h": h.t(), "none": None, "x": x, "d": named["a"].to(torch.float64)}


class _Dropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x).flatten().contiguous()


def _function(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    return [(x @ y).relu(), x.transpose(0, 1).reshape(-1)]


def _linear_algebra(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.linalg.det(a), torch.linalg.svdvals(a)


_PROGRAMS: dict[str, Callable[[], tuple[Any, tuple[Any, ...], dict[str, Any]]]] = {
    "seed": lambda: (_Seed(), (torch.randn(32),), {}),
    "block_trees_statics_buffers": lambda: (
        _Block(),
        (torch.randn(3, 8), (torch.randn(2), torch.randn(5))),
        {"k": 3, "named": {"a": torch.ones(2)}},
    ),
    "function": lambda: (_function, (torch.randn(3, 4), torch.randn(4, 5)), {}),
    # Composite-implicit ops the table decomposes its own way (linalg_det
    # into a JAX-lowering placeholder): the override's Python kernels run
    # only under the Python dispatcher, as in export's trace.
    "table_cia_decompositions": lambda: (
        _linear_algebra,
        (torch.randn(4, 4),),
        {},
    ),
}


def _module(f: Any) -> torch.nn.Module:
    return f if isinstance(f, torch.nn.Module) else importer._FunctionModule.wrap(f)


def _described(exported: torch.export.ExportedProgram) -> tuple[Any, ...]:
    return (
        exported.graph_module.code,
        str(exported.graph_signature),
        exported.call_spec.in_spec,
        exported.call_spec.out_spec,
        {name: id(tensor) for name, tensor in exported.state_dict.items()},
        {name: id(tensor) for name, tensor in exported.constants.items()},
        [(node.name, type(node.meta.get("val")).__name__) for node in exported.graph.nodes],
        [
            (tuple(node.meta["val"].shape), node.meta["val"].stride(), node.meta["val"].dtype)
            for node in exported.graph.nodes
            if isinstance(node.meta.get("val"), torch.Tensor)
        ],
    )


@pytest.mark.parametrize("name", sorted(_PROGRAMS))
def test_one_make_fx_trace_gives_exports_program(name: str) -> None:
    f, args, kwargs = _PROGRAMS[name]()
    module = _module(f)
    table = importer._decomposition_table_with_custom_ops()
    ours = fx_export.exported_from_trace(module, args, kwargs, table)
    assert ours is not None
    theirs = torch_internals.export_decomposed(module, args, kwargs, table)
    assert theirs is not None and single_trace._bake_static_inputs(theirs)
    theirs.graph_module.recompile()
    assert _described(ours) == _described(theirs)


def test_a_small_hf_model_gives_exports_program() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    args, kwargs = (torch.randint(0, 64, (2, 7)),), {"use_cache": False}
    table = importer._decomposition_table_with_custom_ops()
    ours = fx_export.exported_from_trace(model, args, kwargs, table)
    assert ours is not None
    theirs = torch_internals.export_decomposed(model, args, kwargs, table)
    assert theirs is not None and single_trace._bake_static_inputs(theirs)
    theirs.graph_module.recompile()
    assert _described(ours) == _described(theirs)


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


class _BufferWrite(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x)
        return self.count * 2


class _BatchNormTraining(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class _Constant(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.arange(4.0)  # neither parameter nor buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table + torch.tensor([1.0, 2.0, 3.0, 4.0])


class _DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x - 1


class _Holder:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class _ObjectOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> Any:
        return _Holder(x + 1)


_DECLINED: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]] = {
    "tied_weights": lambda: (_Tied(), (torch.tensor([[1, 2, 3]]),)),
    "buffer_write": lambda: (_BufferWrite(), (torch.ones(4),)),
    "batch_norm_training": lambda: (_BatchNormTraining().train(), (torch.randn(3, 4),)),
    "tensor_constants": lambda: (_Constant(), (torch.ones(4),)),
    "data_dependent": lambda: (_DataDependent(), (torch.ones(4),)),
    "object_output": lambda: (_ObjectOutput(), (torch.ones(4),)),
    "dropout_training": lambda: (_Dropout().train(), (torch.randn(4, 4),)),
    "dropout_eval": lambda: (_Dropout().eval(), (torch.randn(4, 4),)),
    "object_input": lambda: (torch.nn.Identity(), (_Holder(torch.ones(4)),)),
}


@pytest.mark.parametrize("name", sorted(_DECLINED))
def test_what_the_trace_cannot_tell_is_left_to_export(name: str) -> None:
    module, args = _DECLINED[name]()
    state = {key: value.clone() for key, value in module.state_dict().items()}
    table = importer._decomposition_table_with_custom_ops()
    assert fx_export.exported_from_trace(module, args, {}, table) is None
    for key, value in module.state_dict().items():
        torch.testing.assert_close(value, state[key])  # the trace wrote nothing back


def test_the_single_trace_runs_no_torch_export(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.export._trace as trace

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("torch.export ran")

    monkeypatch.setattr(trace, "_export", refuse)
    monkeypatch.setattr(torch.export, "export", refuse)
    f, args, kwargs = _PROGRAMS["block_trees_statics_buffers"]()
    single = importer._export_decomposed(f, args, kwargs)
    assert single is not None
    hloalias.clear_cache()
    module = _Block()
    module.load_state_dict(f.state_dict())
    expected = module(*args, **kwargs)
    exe = hloalias.compile(f, args, kwargs)
    got = exe(*args, **kwargs)
    for key in ("out", "h", "x", "d"):
        torch.testing.assert_close(got[key], expected[key])
    assert got["none"] is None


def test_data_dependent_control_flow_keeps_exports_error() -> None:
    hloalias.clear_cache()
    with pytest.raises(hloalias.HloaliasError) as caught:
        hloalias.compile(_DataDependent(), (torch.ones(4),))
    assert "data-dependent" in str(caught.value).lower() or "data dependent" in str(caught.value).lower()
