"""Model code that branches on a size, compiled for several sizes
(issue 26): a dynamic export holds the branch its example took, and the
conditions of that branch are guards of its shape environment, not nodes
of the graph (frontend/shape_specialization.py).  Sizes for which a guard
is false must get a trace of their own, never the other branch's program:
results equal eager's through ``hloalias.jit`` and ``hloalias.compile``
(both call paths), and the shape family's counters say the failing sizes
fell back (never timed).  ``torch.compile`` with dynamic shapes has
dynamo's guards: checked here too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.frontend.shape_specialization import NotSpecializable, export_dynamic, specialize
from hloalias.runtime import shape_family


pytestmark = pytest.mark.usefixtures("fresh_shape_families")


class Parity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] % 2 == 0:
            return x * 2
        return x + 1


class EqualsFive(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 5:
            return x * 2
        return x + 1


class Square(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == x.shape[1]:
            return x * 2
        return x + 1


class Wider(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < x.shape[1]:
            return x * 2
        return x + 1


class Large(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] * x.shape[1] > 20:
            return x * 2
        return x + 1


class LongerThan(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 8:
            return x * 2
        return x + 1


#: model, the sizes compiled in order (the first is imported as it is, the
#: second makes the dynamic export and is specialized from it, as the rest are where
#: its guards hold), and how many of them take the other branch.
CASES: dict[str, tuple[type[torch.nn.Module], list[tuple[int, int]], int]] = {
    "modulo": (Parity, [(2, 4), (2, 6), (2, 5), (2, 8), (2, 7)], 2),
    "equal to a constant": (EqualsFive, [(2, 4), (2, 6), (2, 5), (2, 7)], 1),
    "two dims equal": (Square, [(3, 4), (5, 6), (4, 4), (6, 5), (7, 7)], 2),
    "two dims compared": (Wider, [(3, 4), (5, 7), (2, 9), (4, 3), (6, 6)], 2),
    "product compared": (Large, [(3, 4), (2, 3), (3, 3), (5, 5), (2, 11)], 2),
    "compared to a constant": (LongerThan, [(2, 3), (2, 5), (2, 9), (2, 7)], 1),
}


def _entry(kind: str, model: torch.nn.Module) -> Callable[[torch.Tensor], Any]:
    if kind == "jit":
        return hloalias.jit(model)  # type: ignore[no-any-return]
    return lambda x: hloalias.compile(model, (x,))(x)


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("kind", ["jit", "compile"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_size_failing_a_guard_is_traced_again_and_equals_eager(
    case: str, kind: str, native: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HLOALIAS_NATIVE", native)
    model_class, shapes, other_branch = CASES[case]
    model = model_class()
    run = _entry(kind, model)
    for shape in shapes:
        x = torch.full(shape, 3.0)
        assert torch.equal(run(x), model(x)), f"{case}: wrong branch for sizes {shape}"
    stats = shape_family.shape_family_stats()
    assert stats.exported == 1, stats.reasons
    # Every size the example's branch does not cover is imported on its own.
    assert stats.fallbacks == other_branch, stats.reasons
    assert stats.specialized == len(shapes) - 1 - other_branch, stats.reasons
    if model_class is not LongerThan:  # its branch is in the range export inferred, checked before
        assert all("relied on" in reason for reason in stats.reasons), stats.reasons


def test_the_guards_are_kept_and_checked_by_specialize() -> None:
    model = Parity()
    dynamic = export_dynamic(model, (torch.ones(2, 4),), {}, [frozenset({1})])
    assert len(dynamic.guards) == 1 and "Mod" in str(dynamic.guards[0])
    specialize(dynamic, (torch.ones(2, 10),), {})
    with pytest.raises(NotSpecializable, match="relied on"):
        specialize(dynamic, (torch.ones(2, 9),), {})


def test_a_guard_equal_dims_replaced_by_one_symbol_still_binds() -> None:
    """``x.shape[0] == x.shape[1]`` true while exporting: torch replaces one
    symbol by the other, and the guard over both is kept over the one."""
    model = Square()
    dynamic = export_dynamic(model, (torch.ones(4, 4),), {}, [frozenset({0, 1})])
    specialize(dynamic, (torch.ones(6, 6),), {})
    with pytest.raises(NotSpecializable):
        specialize(dynamic, (torch.ones(6, 7),), {})


def _tiny_mistral() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, sliding_window=8,
    )
    return transformers.MistralForCausalLM(config).eval()  # type: ignore[no-any-return]


def test_the_sliding_window_cache_guard_of_mistral_is_checked() -> None:
    """Inside transformers: a sliding-window cache keeps the last
    ``window - 1`` positions (``keys[:, :, -7:]``); exported at length 12,
    the trace guards that this slice is not the whole tensor
    (``8 * length != 56``, from a contiguity check: not in the range
    [7, oo) export inferred), so length 7 took another path."""
    model = _tiny_mistral()
    dynamic = export_dynamic(model, (torch.randint(0, 64, (1, 12)),), {}, [frozenset({1})])
    assert any("56" in str(guard) for guard in dynamic.guards), dynamic.guards
    with pytest.raises(NotSpecializable, match="relied on"):
        specialize(dynamic, (torch.randint(0, 64, (1, 7)),), {})


def test_a_program_returning_a_size_falls_back() -> None:
    """A sliding-window cache returns its length, a symbolic output of the
    dynamic export: not specialized (a static export has a constant
    there), imported as it is, and equal to eager."""
    model = _tiny_mistral()
    for length in (6, 12):
        ids = torch.randint(0, 64, (1, length))
        exe = hloalias.compile(model, (ids,))
        torch.testing.assert_close(exe(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    stats = shape_family.shape_family_stats()
    # Refused from the dynamic export itself (no decomposed export made).
    assert (stats.exported, stats.specialized, stats.fallbacks) == (0, 0, 1), stats.reasons
    assert "returns sizes" in stats.reasons[-1]


@pytest.mark.parametrize("dynamic", [True, None])
def test_torch_compile_with_dynamic_sizes_takes_each_branch(dynamic: bool | None) -> None:
    """dynamo guards the branch itself (its graph holds one branch and a
    size guard); the graphs it hands over are checked here all the same."""
    torch._dynamo.reset()
    try:
        model = Parity()
        compiled = torch.compile(model, backend="hloalias", dynamic=dynamic)
        for length in (4, 6, 5, 8, 7):
            x = torch.full((2, length), 3.0)
            assert torch.equal(compiled(x), model(x)), f"wrong branch for length {length}"
    finally:
        torch._dynamo.reset()


def test_a_program_returning_a_size_is_refused_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a program returns a size is known from its dynamic export,
    before the decomposition retrace: the export is not decomposed, no
    later length propagates the graph only to be refused at its output,
    and every length is imported as it is, equal to eager."""
    from hloalias.frontend import shape_specialization
    from hloalias.runtime import shape_family as family_module

    attempts: list[int] = []
    real = family_module.import_specialized

    def counted(*args: object, **kwargs: object) -> object:
        attempts.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    decomposed: list[int] = []
    real_guards = shape_specialization._trace_guards

    def guards_after_decomposing(exported: Any) -> Any:
        decomposed.append(1)
        return real_guards(exported)

    monkeypatch.setattr(family_module, "import_specialized", counted)
    monkeypatch.setattr(shape_specialization, "_trace_guards", guards_after_decomposing)
    model = _tiny_mistral()
    for length in (6, 12, 9, 10):
        ids = torch.randint(0, 64, (1, length))
        exe = hloalias.compile(model, (ids,))
        torch.testing.assert_close(exe(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    stats = shape_family.shape_family_stats()
    assert attempts == [] and decomposed == []
    assert (stats.exported, stats.specialized, stats.fallbacks) == (0, 0, 3), stats.reasons
    assert all("returns sizes" in reason for reason in stats.reasons)
