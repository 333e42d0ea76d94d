"""The decomposed program from one ``make_fx`` trace
(frontend/fx_export.py) is the program ``torch.export`` and the
decompositions give: the same graph code, signature, placeholder names,
call trees, state and constants; programs whose signature the trace
cannot tell are left to ``torch.export`` (None), and the importer's single
trace no longer runs ``torch.export`` for the rest.  Programs that write
their parameters, buffers or inputs in place give, with ``mutations``, the
program the importer's two traces give (export, its training-IR rewrites,
the decompositions): the same mutation outputs, and the same eager storage
of each output; compiled, they compute and write bit for bit what the two
traces' program does.  What the trace cannot match is declined."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from cache_shaped import CacheAndMadeConstants
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
        # A tensor made in forward is made anew by each trace: its value.
        {name: tensor.tolist() if "lifted_tensor" in name else id(tensor)
         for name, tensor in exported.constants.items()},
        [(node.name, type(node.meta.get("val")).__name__) for node in exported.graph.nodes],
        [
            (tuple(node.meta["val"].shape), node.meta["val"].stride(), node.meta["val"].dtype)
            for node in exported.graph.nodes
            if isinstance(node.meta.get("val"), torch.Tensor)
        ],
    )




_PROGRAMS.update({
    "tied_weights": lambda: (_Tied(), (torch.tensor([[1, 2, 3]]),), {}),
    "dropout_eval": lambda: (_Dropout().eval(), (torch.randn(4, 4),), {}),
    "cache_output_made_constants": lambda: (CacheAndMadeConstants().eval(), (torch.tensor([[1, 2, 3]]),), {}),
})


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


def test_the_programs_module_generates_its_code_only_when_used() -> None:
    """The ExportedProgram's module is built lazily (torch's
    ``_LazyGraphModule``): nothing on the way to MLIR reads its code, and
    generating it was a second code generation of the trace's graph in
    every compile.  Read, its code is what an eager module's would be; the
    program computes eager's values (to the decompositions' rounding)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    f, args, kwargs = _PROGRAMS["block_trees_statics_buffers"]()
    module = _module(f)
    ours = fx_export.exported_from_trace(module, args, kwargs, importer._decomposition_table_with_custom_ops())
    assert ours is not None
    assert isinstance(ours.graph_module, _LazyGraphModule) and ours.graph_module._needs_recompile()
    assert ours.graph_module.code == torch.fx.GraphModule(ours.graph_module, ours.graph).code
    assert not ours.graph_module._needs_recompile()
    got, want = ours.module()(*args, **kwargs), module(*args, **kwargs)
    assert all(torch.allclose(got[key], want[key]) for key in ("out", "h", "x", "d"))


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


class _SharedSubmodule(torch.nn.Module):
    """One submodule under two names: the trace sets one attribute per name."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = self.first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


class _DropoutInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x * 1, 0.5, training=False, inplace=True)


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
    "shared_submodule": lambda: (_SharedSubmodule(), (torch.randn(2, 4),)),
    "buffer_write": lambda: (_BufferWrite(), (torch.ones(4),)),
    "batch_norm_training": lambda: (_BatchNormTraining().train(), (torch.randn(3, 4),)),
    "tensor_constants": lambda: (_Constant(), (torch.ones(4),)),
    "data_dependent": lambda: (_DataDependent(), (torch.ones(4),)),
    "object_output": lambda: (_ObjectOutput(), (torch.ones(4),)),
    "dropout_training": lambda: (_Dropout().train(), (torch.randn(4, 4),)),
    "dropout_eval_in_place": lambda: (_DropoutInPlace().eval(), (torch.randn(4, 4),)),
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


# -- programs that write in place ----------------------------------------------


class _SGDMomentum(torch.nn.Module):
    """An MLP forward, then an SGD-momentum step in place under no_grad
    (parameters that require grad, momenta in buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.l0 = torch.nn.Linear(8, 8)
        self.l1 = torch.nn.Linear(8, 4)
        for name, parameter in list(self.named_parameters()):
            self.register_buffer("mom_" + name.replace(".", "_"), torch.randn(parameter.shape) * 0.1)

    def forward(self, x: torch.Tensor, *grads: torch.Tensor) -> torch.Tensor:
        h = self.l1(torch.relu(self.l0(x)))
        with torch.no_grad():
            for (name, parameter), grad in zip(list(self.named_parameters()), grads):
                momentum = getattr(self, "mom_" + name.replace(".", "_"))
                momentum.mul_(0.9).add_(grad)
                parameter.sub_(0.01 * momentum)
        return h


class _KVCache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(2, 8, 4))
        self.register_buffer("v", torch.zeros(2, 8, 4))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.k.index_copy_(1, positions, x)
        self.v[:, 2:4] = x * 2
        return (self.k[:, :4] * self.v[:, :4]).sum(-1)


class _InputAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x.add_(y)
        return x * 2, y


class _WriteReturnViews(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.cache[1] = x
        self.cache.add_(1)
        return self.cache[:2], self.cache.t(), self.cache.sum(0)


class _IntermediateWrite(torch.nn.Module):
    """In-place writes to an intermediate that requires grad (allowed in
    eager under grad mode: it is no leaf and no view) and to a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        h.relu_()
        h.mul_(2)
        self.calls.add_(1)
        return h


def _sgd_args() -> tuple[Any, ...]:
    module = _SGDMomentum()
    grads = tuple(torch.randn(parameter.shape) for parameter in module.parameters())
    return module, (torch.randn(3, 8), *grads)


_MUTATING: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]] = {
    "sgd_momentum_step": _sgd_args,
    "kv_cache_index_copy_and_slice": lambda: (_KVCache(), (torch.randn(2, 2, 4), torch.tensor([1, 5]))),
    "batch_norm_training": lambda: (_BatchNormTraining().train(), (torch.randn(3, 4),)),
    "user_input_add": lambda: (_InputAdd(), (torch.randn(3), torch.randn(3))),
    "intermediate_write_under_grad": lambda: (_IntermediateWrite(), (torch.randn(2, 4),)),
    "write_and_return_views": lambda: (_WriteReturnViews(), (torch.randn(6),)),
}


def _two_traces(
    module: torch.nn.Module, args: tuple[Any, ...], table: dict[Any, Callable[..., Any]]
) -> torch.export.ExportedProgram:
    """What the importer makes of ``torch.export``'s training IR for a
    program that writes in place: the decomposed program, none of the
    importer's rewrites of the training IR applying (frontend/importer.py,
    ``_import_torch``; each output's eager storage is compared in the
    imported signature)."""
    exported = importer._export(module, args, {}, None)
    exported, aliases = importer._merge_aliased_state(exported, owned=True)
    assert not aliases
    assert not importer._pin_eager_copies(exported)
    assert not importer._explicit_copy_conversions(exported)
    return importer.decompose(exported, table)


@pytest.mark.parametrize("name", sorted(_MUTATING))
def test_a_program_that_writes_in_place_gives_the_two_traces_program(name: str) -> None:
    module, args = _MUTATING[name]()
    state = {key: value.clone() for key, value in module.state_dict().items()}
    inputs = [arg.clone() for arg in args]
    table = importer._decomposition_table_with_custom_ops()
    assert fx_export.exported_from_trace(module, args, {}, table) is None  # without mutations
    ours = fx_export.exported_from_trace(module, args, {}, table, mutations=True)
    assert ours is not None
    for key, value in module.state_dict().items():
        assert torch.equal(value, state[key])  # the trace wrote nothing back
    for arg, before in zip(args, inputs):
        assert torch.equal(arg, before)
    theirs = _two_traces(module, args, table)
    assert _described(ours) == _described(theirs)
    assert [spec.kind for spec in ours.graph_signature.output_specs] == [
        spec.kind for spec in theirs.graph_signature.output_specs
    ]


class _LeafWrite(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.weight.add_(x)  # under grad mode: autograd refuses it
        return self.weight * 2


class _LeafWriteAfterNoGrad(_LeafWrite):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = x * 2
        self.weight.add_(y)  # grad mode is back on: autograd refuses it
        return self.weight * 2


class _ViewWrite(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.linear(x).unbind(0)
        first.add_(1)  # a multi-output view written under grad mode: autograd refuses it
        return first + second


class _ConvertingCopy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.copy_(x)
        return self.total + 1


class _WholeCopy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("last", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last.copy_(x * 2)
        return self.last + 1


class _WriteThenReshapeCopies(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        every_other = x[:, ::2]
        every_other.add_(1)
        return every_other.reshape(-1), x


class _TransposedInputWrite(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x.reshape(-1)


class _SharedInputsWrite(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x + y


class _TwoBuffersOneValue(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.zeros(4))
        self.register_buffer("b", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        self.a.copy_(y)
        self.b.copy_(y)
        return x


class _StridedWrite(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.as_strided((2, 2), (1, 2)).add_(1)
        return x * 2


class _MetadataWrite(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.t_()
        return x + 1


def _shared_inputs() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    x = torch.randn(4)
    return _SharedInputsWrite(), (x, x)


_MUTATING_DECLINED: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]] = {
    "leaf_write_under_grad": lambda: (_LeafWrite(), (torch.ones(4),)),
    "view_write_under_grad": lambda: (_ViewWrite(), (torch.ones(2, 4),)),
    "leaf_write_after_no_grad_block": lambda: (_LeafWriteAfterNoGrad(), (torch.ones(4),)),
    "converting_copy": lambda: (_ConvertingCopy(), (torch.randn(4),)),
    "whole_buffer_copy": lambda: (_WholeCopy(), (torch.randn(4),)),
    "reshape_copies_after_write": lambda: (_WriteThenReshapeCopies(), (torch.randn(6, 4).t(),)),
    "transposed_input_write": lambda: (_TransposedInputWrite(), (torch.randn(6, 4).t(),)),
    "inputs_sharing_memory": _shared_inputs,
    "two_buffers_one_value": lambda: (_TwoBuffersOneValue(), (torch.randn(4),)),
    "metadata_write": lambda: (_MetadataWrite(), (torch.randn(2, 3),)),
    "strided_write": lambda: (_StridedWrite(), (torch.randn(4, 4),)),
}


@pytest.mark.parametrize("name", sorted(_MUTATING_DECLINED))
def test_what_a_writing_trace_cannot_match_is_left_to_export(name: str) -> None:
    """Export errs on these (a leaf written under grad mode, a write through
    inputs that share memory, two buffers given one value), or the
    importer rewrites its training IR (a converting copy_, a reshape that
    copies in eager), or its retrace drops a whole-tensor copy_; a write
    that changes a tensor's layout or addresses its storage is never
    taken."""
    module, args = _MUTATING_DECLINED[name]()
    state = {key: value.clone() for key, value in module.state_dict().items()}
    inputs = [arg.clone() for arg in args]
    table = importer._decomposition_table_with_custom_ops()
    assert fx_export.exported_from_trace(module, args, {}, table, mutations=True) is None
    for key, value in module.state_dict().items():
        assert torch.equal(value, state[key])
    for arg, before in zip(args, inputs):
        assert torch.equal(arg, before)


def _leaves(tree: Any) -> list[torch.Tensor]:
    return [leaf for leaf in torch.utils._pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


@pytest.mark.parametrize("name", sorted(_MUTATING))
def test_a_writing_program_traced_once_computes_and_writes_what_two_traces_do(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, args = _MUTATING[name]()
    twin = copy.deepcopy(module)
    assert importer._export_decomposed(module, args, {}) is not None
    ours = importer.import_torch(module, args)
    hloalias.clear_cache()
    once = hloalias.compile(module, tuple(arg.clone() for arg in args))
    monkeypatch.setattr(importer, "_export_decomposed", lambda *_: None)
    theirs = importer.import_torch(twin, args)
    assert ours.text == theirs.text
    assert ours.signature == theirs.signature
    hloalias.clear_cache()
    twice = hloalias.compile(twin, tuple(arg.clone() for arg in args))
    for _ in range(2):
        our_inputs = tuple(arg.clone() for arg in args)
        their_inputs = tuple(arg.clone() for arg in args)
        got, expected = once(*our_inputs), twice(*their_inputs)
        for a, b in zip(_leaves((got, our_inputs)), _leaves((expected, their_inputs)), strict=True):
            assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
        our_state, their_state = once.state_dict(), twice.state_dict()
        assert list(our_state) == list(their_state)
        for key in our_state:
            assert torch.equal(our_state[key], their_state[key]), key


def _llama() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2,
    )
    return transformers.LlamaForCausalLM(config).eval(), (torch.randint(0, 64, (2, 7)),), {"use_cache": False}


@pytest.mark.parametrize("name", ["block_trees_statics_buffers", "function", "llama", *sorted(_MUTATING)])
def test_node_stack_traces_are_make_fxs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace records each node's stack trace reading only the frames it
    keeps; the strings are those ``make_fx(record_stack_traces=True)``
    records (errors quote them as the user's line)."""
    if name == "llama":
        f, args, kwargs = _llama()
    elif name in _MUTATING:
        f, args = _MUTATING[name]()
        kwargs = {}
    else:
        f, args, kwargs = _PROGRAMS[name]()
    module = _module(f)
    table = importer._decomposition_table_with_custom_ops()

    def stack_traces() -> list[tuple[str, Any]]:
        exported = fx_export.exported_from_trace(module, args, kwargs, table, mutations=name in _MUTATING)
        assert exported is not None
        return [(node.name, node.meta.get("stack_trace")) for node in exported.graph.nodes]

    ours = stack_traces()
    monkeypatch.setattr(fx_export, "_FAST_STACK_TRACES", False)
    assert ours == stack_traces()
    assert any(trace for _, trace in ours)


def test_the_signature_reads_the_call_specs_without_torchs_call_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """The importer reads the program's input and output specs from the
    root of its module call graph, as ``ExportedProgram.call_spec`` does,
    without that property (which defines a NamedTuple class on every
    read): the same specs, and a compile that never reads the property."""
    exported = torch.export.export(_Seed(), (torch.randn(32),))
    assert importer._call_specs(exported) == (exported.call_spec.in_spec, exported.call_spec.out_spec)
    empty = copy.copy(exported)
    empty._module_call_graph = []
    assert importer._call_specs(empty) == (None, None) == tuple(empty.call_spec)

    def refused(self: Any) -> Any:
        raise AssertionError("call_spec read")

    monkeypatch.setattr(torch.export.ExportedProgram, "call_spec", property(refused))
    x = torch.randn(32)
    first, second = hloalias.compile(_Seed(), (x,))(x)
    torch.testing.assert_close(second, x[0:16].view(2, 8))
