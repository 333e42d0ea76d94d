"""The dynamic export of a shape family from one symbolic ``make_fx``
trace (frontend/fx_export.py ``dynamic_dims``, frontend/shape_specialization.py
``export_dynamic``): no ``torch.export`` and no decomposition retrace where
the trace can tell the program, the same program (specialized imports equal
fresh ones, the signature and lifted constants named as ``torch.export``
names them), the same guards, and every program it declines exported by
the two traces as before.  Counted, never timed."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import hloalias
from hloalias.frontend import fx_export, importer
from hloalias.frontend.importer import Stage, import_torch
from hloalias.frontend.shape_specialization import (
    NotSpecializable,
    export_dynamic,
    import_specialized,
    specialize,
)
from hloalias.frontend.tracing_lock import tracing
from hloalias.runtime import shape_family
from test_shape_guards import Parity


pytestmark = pytest.mark.usefixtures("fresh_shape_families")


class _Counted:
    """Counts the calls of ``importer._export`` and ``importer.decompose``
    (the two traces) while active."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in ("_export", "decompose"):
            original = getattr(importer, name)

            def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
                self.calls.append(_name)
                return _original(*args, **kwargs)

            monkeypatch.setattr(importer, name, counted)


class Mixer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.embed(ids)) * 2.0
        weights = torch.softmax(h.sum(-1), dim=-1)
        return h.transpose(1, 2).reshape(ids.shape[0], -1) + weights.repeat(1, 8)


def _ids(length: int) -> torch.Tensor:
    return torch.arange(2 * length).reshape(2, length) % 32


def _tiny_llama() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()  # type: ignore[no-any-return]


def test_the_dynamic_export_is_one_trace_and_specializes_to_fresh_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Mixer().eval()
    counted = _Counted(monkeypatch)
    dynamic = export_dynamic(model, (_ids(8),), {}, [frozenset({1})])
    assert counted.calls == []  # neither torch.export nor the decomposition retrace
    for length in (3, 8, 17):
        specialized = import_specialized(dynamic, model, (_ids(length),), {}, Stage.STABLEHLO)
        fresh = import_torch(model, (_ids(length),))
        assert specialized.text == fresh.text
        assert specialized.signature == fresh.signature


def test_a_llama_with_a_cache_output_and_lifted_constants_is_one_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A causal LM returns a transformers cache (a registered pytree node)
    and makes tensors in ``forward`` (the cache layers' ``torch.tensor([])``),
    which ``torch.export`` lifts as constants named after the module that
    made them: the one trace gives the same signature, constants and
    output tree as the two traces, and its specializations import as fresh
    exports do."""
    model = _tiny_llama()
    ids = torch.randint(0, 64, (1, 10))
    counted = _Counted(monkeypatch)
    dynamic = export_dynamic(model, (ids,), {}, [frozenset({1})])
    assert counted.calls == []
    monkeypatch.setattr(importer, "_export_decomposed", lambda *args, **kwargs: None)
    two = export_dynamic(model, (ids,), {}, [frozenset({1})])  # the two traces
    assert counted.calls == ["_export", "decompose"]
    ours, theirs = dynamic.exported, two.exported
    # The same inputs; in the order of a static import (the text compared
    # below), where export's retrace puts the constants before the buffers.
    assert sorted(str(spec) for spec in ours.graph_signature.input_specs) == sorted(
        str(spec) for spec in theirs.graph_signature.input_specs)
    assert any("lifted_tensor" in name for name in ours.constants)
    assert sorted(ours.constants) == sorted(theirs.constants)
    assert ours.call_spec.out_spec == theirs.call_spec.out_spec
    assert ours.call_spec.in_spec == theirs.call_spec.in_spec
    assert len(ours.range_constraints) == 1
    monkeypatch.undo()
    for length in (6, 13):
        ids = torch.randint(0, 64, (1, length))
        specialized = import_specialized(dynamic, model, (ids,), {}, Stage.STABLEHLO)
        fresh = import_torch(model, (ids,))
        assert specialized.text == fresh.text
        assert specialized.signature == fresh.signature


def test_a_llama_compiled_at_new_lengths_equals_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _tiny_llama()
    counted = _Counted(monkeypatch)
    for length in (6, 10, 7, 12):
        ids = torch.randint(0, 64, (1, length))
        exe = hloalias.compile(model, (ids,))
        torch.testing.assert_close(exe(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    stats = shape_family.shape_family_stats()
    assert (stats.first, stats.exported, stats.specialized, stats.fallbacks) == (1, 1, 3, 0), stats.reasons
    assert "decompose" not in counted.calls


class LongerThan(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 8:
            return x * 2
        return x + 1


def test_the_one_trace_keeps_the_guards_and_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = _Counted(monkeypatch)
    dynamic = export_dynamic(Parity(), (torch.ones(2, 4),), {}, [frozenset({1})])
    assert counted.calls == []
    assert len(dynamic.guards) == 1 and "Mod" in str(dynamic.guards[0])
    specialize(dynamic, (torch.ones(2, 10),), {})
    with pytest.raises(NotSpecializable, match="relied on"):
        specialize(dynamic, (torch.ones(2, 9),), {})
    longer = export_dynamic(LongerThan(), (torch.ones(2, 12),), {}, [frozenset({1})])
    assert counted.calls == []
    specialize(longer, (torch.ones(2, 9),), {})
    with pytest.raises(NotSpecializable, match="outside the range"):
        specialize(longer, (torch.ones(2, 8),), {})


class FixedView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(2, 8) * 3


class Square(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == x.shape[1]:
            return x * 2
        return x + 1


class DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0] * 2


class AttributeConstant(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.offset = torch.tensor([1.0, 2.0, 3.0])  # neither parameter nor buffer: export names it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.offset


class ReturnsSize(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x * 2, x.shape[1]


class Sized:
    """An output object that keeps a length in its pytree context (as a
    cache may): one tree cannot serve every size."""

    def __init__(self, values: torch.Tensor, length: Any) -> None:
        self.values = values
        self.length = length


torch.utils._pytree.register_pytree_node(
    Sized, lambda sized: ([sized.values], sized.length), lambda leaves, length: Sized(leaves[0], length),
    serialized_type_name=f"{__name__}.Sized",
)


class ReturnsSized(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> Sized:
        return Sized(x * 2, x.shape[1])


@pytest.mark.parametrize(("model", "x", "dims"), [
    (FixedView(), torch.randn(16), frozenset({0})),  # the code fixes the size
    (DataDependent(), torch.randn(2, 6), frozenset({1})),  # data-dependent sizes
    (AttributeConstant(), torch.randn(4, 3), frozenset({0})),  # a tensor attribute
    (ReturnsSize(), torch.randn(2, 6), frozenset({1})),  # a size output
    (ReturnsSized(), torch.randn(2, 6), frozenset({1})),  # a size in the output tree
], ids=["fixed", "data-dependent", "attribute constant", "returns a size", "size in the output tree"])
def test_programs_the_one_trace_cannot_tell_are_declined(model: torch.nn.Module, x: torch.Tensor,
                                                       dims: frozenset[int]) -> None:
    table = importer._decomposition_table_with_custom_ops()
    with tracing():
        assert fx_export.exported_from_trace(model, (x,), {}, table, dynamic_dims=(dims,)) is None


def test_a_declined_program_is_exported_by_the_two_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    model = AttributeConstant()
    counted = _Counted(monkeypatch)
    for rows in (4, 6, 9):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(hloalias.compile(model, (x,))(x), model(x))
    stats = shape_family.shape_family_stats()
    assert (stats.exported, stats.specialized, stats.fallbacks) == (1, 2, 0), stats.reasons
    assert counted.calls.count("decompose") == 1  # the dynamic export's retrace


def test_the_size_arithmetic_of_the_one_trace_records_no_stack_traces() -> None:
    """A symbolic trace makes a node for every size computation; their
    stack traces would cost a walk of the Python stack each and serve
    nothing (a specialization evaluates them to numbers).  The tensor ops
    keep theirs: the specialized program's nodes quote the user's line."""
    model = Mixer().eval()
    dynamic = export_dynamic(model, (_ids(8),), {}, [frozenset({1})])
    nodes = [node for node in dynamic.exported.graph.nodes if node.op == "call_function"]
    sizes = [node for node in nodes if fx_export._shape_node(node)]
    assert sizes  # ids.shape[0] and the reshape's sizes
    assert all(not node.stack_trace for node in sizes)
    tensors = [node for node in nodes if not fx_export._shape_node(node)]
    assert tensors and all("forward" in (node.stack_trace or "") for node in tensors)
    specialized = specialize(dynamic, (_ids(5),), {})
    assert all(node.stack_trace for node in specialized.graph.nodes if node.op == "call_function")


class _Waiting(torch.nn.Module):
    """A submodule that, called from another thread, waits inside its
    forward until released."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        self.release.wait(timeout=30)
        return x  # no op: make_fx's module-call patch is process-wide too


class _CalledBesideTheTrace(torch.nn.Module):
    """Its forward makes a constant while another thread is inside the
    forward of one of its submodules."""

    def __init__(self) -> None:
        super().__init__()
        self.block = _Waiting()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.block.entered.clear()
        self.block.release.clear()
        beside = threading.Thread(target=self.block, args=(torch.ones(2),))
        beside.start()
        self.block.entered.wait(timeout=30)
        try:
            return x * torch.tensor([1.0, 2.0])
        finally:
            self.block.release.set()
            beside.join()


def test_a_lifted_constant_is_named_after_the_traced_thread_s_module() -> None:
    """The module that made a constant is read from process-wide module
    hooks: another thread's call of a submodule, eager beside the trace,
    does not name it (torch.export names it after the root here)."""
    table = importer._decomposition_table_with_custom_ops()
    with tracing():
        exported = fx_export.exported_from_trace(
            _CalledBesideTheTrace(), (torch.randn(5, 2),), {}, table, dynamic_dims=(frozenset({0}),))
    assert exported is not None
    assert list(exported.constants) == ["lifted_tensor_0"]


def test_the_one_trace_makes_nodes_only_for_the_size_arithmetic_it_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every meta function's size computation (contiguity, strides,
    broadcasting) is symbolic in a dynamic trace; traced as it runs, each
    would be a node (most of them dead, dropped at the end).  The trace
    records them lazily, as AOT autograd's functionalization does: only
    those the graph uses become nodes."""
    created: list[torch.fx.Node] = []
    create_node = torch.fx.Graph.create_node

    def counting(self: torch.fx.Graph, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = create_node(self, *args, **kwargs)
        created.append(node)
        return node

    monkeypatch.setattr(torch.fx.Graph, "create_node", counting)
    dynamic = export_dynamic(Mixer().eval(), (_ids(8),), {}, [frozenset({1})])
    kept = [node for node in dynamic.exported.graph.nodes if fx_export._shape_node(node)]
    made = [node for node in created if fx_export._shape_node(node)]
    assert kept and len(made) <= 3 * len(kept), (len(made), len(kept))
