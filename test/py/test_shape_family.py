"""New input sizes of a compiled module from one dynamic export
(runtime/shape_family.py, frontend/shape_specialization.py): results equal
eager, the specialized import equals a fresh export's, and every case the
dynamic export cannot serve falls back to the usual import.  Counted
through the family's counters, never timed."""

from __future__ import annotations

import pytest
import torch

import hloalias
from hloalias.frontend.importer import import_torch
from hloalias.frontend.shape_specialization import NotSpecializable, export_dynamic, specialize
from hloalias.runtime import export_cache, shape_family


pytestmark = pytest.mark.usefixtures("fresh_shape_families")


class Mixer(torch.nn.Module):
    """A sequence model: embedding, linear, softmax over the sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.proj = torch.nn.Linear(8, 8)
        self.scale = 2.0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.embed(ids)) * self.scale
        weights = torch.softmax(h.sum(-1), dim=-1)
        return h.transpose(1, 2).reshape(ids.shape[0], -1) + weights.repeat(1, 8)


def _ids(length: int) -> torch.Tensor:
    return torch.arange(2 * length).reshape(2, length) % 32


def test_new_lengths_are_specialized_and_equal_eager() -> None:
    torch.manual_seed(0)
    model = Mixer().eval()
    for length in (8, 12, 5, 12):
        exe = hloalias.compile(model, (_ids(length),))
        torch.testing.assert_close(exe(_ids(length)), model(_ids(length)))
    stats = shape_family.shape_family_stats()
    # 8: the first import; 12: the one dynamic export, specialized to 12;
    # 5: specialized; 12 again: the in-process import cache.
    assert (stats.first, stats.exported, stats.specialized, stats.fallbacks) == (1, 1, 2, 0)


def test_static_second_size_then_one_dynamic_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the second size compiles statically, traced as it is
    (one ``make_fx`` trace, as the first compile); the third exports once
    with the changed dimension dynamic and every later size is specialized
    from that export."""
    from hloalias.frontend.single_trace import clear_single_trace_stats, single_trace_stats

    monkeypatch.delenv("HLOALIAS_SHAPE_FAMILY_STATIC_SIZES")
    clear_single_trace_stats()
    torch.manual_seed(0)
    model = Mixer().eval()
    counts = []
    for length in (8, 12, 5, 17, 12):
        exe = hloalias.compile(model, (_ids(length),))
        torch.testing.assert_close(exe(_ids(length)), model(_ids(length)))
        stats = shape_family.shape_family_stats()
        counts.append((stats.first, stats.exported, stats.specialized, single_trace_stats().make_fx))
    assert counts == [
        (1, 0, 0, 1),  # 8: the first compile, one static trace
        (1, 0, 0, 2),  # 12: one more static trace, no dynamic export
        (1, 1, 1, 2),  # 5: the one dynamic export, specialized to 5
        (1, 1, 2, 2),  # 17: specialized
        (1, 1, 2, 2),  # 12 again: the in-process import cache
    ]
    assert shape_family.shape_family_stats().static == 1
    assert shape_family.shape_family_stats().fallbacks == 0


class TwoInputs(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum(0, keepdim=True) * 2 + y.sum(1).unsqueeze(0).sum(1, keepdim=True)


def test_the_dynamic_export_after_static_sizes_makes_every_changed_dimension_dynamic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dimension that changed between the statically compiled sizes but
    not at the size that exports is dynamic too: the export serves a size
    that changes it again."""
    monkeypatch.delenv("HLOALIAS_SHAPE_FAMILY_STATIC_SIZES")
    model = TwoInputs()
    for rows, width, height in ((3, 4, 2), (5, 4, 2), (5, 4, 6), (7, 9, 3)):
        x, y = torch.randn(rows, width), torch.randn(height, 5)
        torch.testing.assert_close(hloalias.compile(model, (x, y))(x, y), model(x, y))
    stats = shape_family.shape_family_stats()
    # (3, 4, 2): first; (5, 4, 2): static; (5, 4, 6): export with rows and
    # height dynamic, not width (equal in all three): (7, 9, 3) changes width.
    assert (stats.first, stats.exported, stats.specialized, stats.fallbacks) == (1, 1, 1, 1)
    assert "dimension 1 was exported as 4" in stats.reasons[-1]
    assert stats.static == 1
    x, y = torch.randn(11, 4), torch.randn(8, 5)
    torch.testing.assert_close(hloalias.compile(model, (x, y))(x, y), model(x, y))
    assert shape_family.shape_family_stats().specialized == 2


def test_a_size_of_one_in_a_changed_dimension_waits_for_another_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """Export fixes sizes 0 and 1: sizes that would export a changed
    dimension at 1 compile statically, and the family exports at the next
    sizes that can stand for the others instead of being refused."""
    monkeypatch.delenv("HLOALIAS_SHAPE_FAMILY_STATIC_SIZES")
    model = Scaled()
    for rows, width in ((3, 4), (3, 6), (1, 8), (3, 9), (3, 5)):
        x = torch.randn(rows, width)
        torch.testing.assert_close(hloalias.compile(model, (x,))(x), x * 2)
    stats = shape_family.shape_family_stats()
    # (3, 4) first; (3, 6) and (1, 8) static; (3, 9) exports the width
    # dynamic; (3, 5) specialized.
    assert (stats.first, stats.exported, stats.specialized, stats.fallbacks) == (1, 1, 2, 0), stats.reasons
    assert stats.static == 2


def test_specialized_import_equals_a_fresh_export() -> None:
    torch.manual_seed(0)
    model = Mixer().eval()
    dynamic = export_dynamic(model, (_ids(8),), {}, [frozenset({1})])
    from hloalias.frontend.shape_specialization import import_specialized
    from hloalias.frontend.importer import Stage

    for length in (3, 8, 17):
        specialized = import_specialized(dynamic, model, (_ids(length),), {}, Stage.STABLEHLO)
        fresh = import_torch(model, (_ids(length),))
        assert specialized.text == fresh.text
        assert specialized.signature == fresh.signature


def test_tiny_llama_new_sequence_length_equals_eager() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    for length in (6, 10, 7):
        ids = torch.randint(0, 64, (1, length))
        exe = hloalias.compile(model, (ids,))
        torch.testing.assert_close(exe(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    stats = shape_family.shape_family_stats()
    assert (stats.first, stats.exported, stats.specialized, stats.fallbacks) == (1, 1, 2, 0), stats.reasons


class Branchy(torch.nn.Module):
    """Code that depends on the sequence length."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 8:
            return x * 2
        return x + 1


def test_a_length_outside_the_exported_branch_falls_back() -> None:
    model = Branchy()
    for length in (12, 16, 5):
        x = torch.randn(2, length)
        torch.testing.assert_close(hloalias.compile(model, (x,))(x), model(x))
    stats = shape_family.shape_family_stats()
    assert stats.specialized == 1  # 16 is in the branch export took for 16; 5 is not
    assert stats.fallbacks == 1 and "outside the range" in stats.reasons[-1]


class FixedView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(2, 8) * 3


def test_a_dimension_the_code_fixes_is_refused_and_the_usual_import_runs() -> None:
    model = FixedView()
    x = torch.randn(16)
    torch.testing.assert_close(hloalias.compile(model, (x,))(x), model(x))
    with pytest.raises(hloalias.TorchImportError):  # as without families: 24 elements do not view as 2x8
        hloalias.compile(model, (torch.randn(24),))
    stats = shape_family.shape_family_stats()
    assert stats.specialized == 0 and stats.fallbacks == 1


def test_a_changed_attribute_is_a_new_family() -> None:
    """The family key holds the module's configuration: a changed value
    read by forward is never served by the old export."""
    torch.manual_seed(0)
    model = Mixer().eval()
    hloalias.compile(model, (_ids(8),))
    hloalias.compile(model, (_ids(12),))
    model.scale = 3.0
    exe = hloalias.compile(model, (_ids(16),))
    torch.testing.assert_close(exe(_ids(16)), model(_ids(16)))
    assert shape_family.shape_family_stats().first == 2



def test_a_new_module_is_not_keyed_and_its_family_still_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first compile of a module object takes no family key (before
    the import no key can find a family for a module that has none, and
    its family is recorded unkeyed); a later compile of the module keys
    it once, before its import, which finds the family (and once more
    after the family's dynamic export, which can rebuild module
    attributes the key reads), and new lengths are specialized from it."""
    keyed: list[object] = []
    original = shape_family._family_key

    def counting(f: object, *args: object) -> str | None:
        keyed.append(f)
        return original(f, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(shape_family, "_family_key", counting)
    torch.manual_seed(0)
    first, second = Mixer().eval(), Mixer().eval()
    second.scale = 3.0  # another key: one family per key
    hloalias.compile(first, (_ids(8),))
    hloalias.compile(second, (_ids(8),))
    assert keyed == []
    for length in (12, 5):
        exe = hloalias.compile(first, (_ids(length),))
        torch.testing.assert_close(exe(_ids(length)), first(_ids(length)))
    assert keyed == [first, first, first]  # 12: find, re-key after the export; 5: find
    stats = shape_family.shape_family_stats()
    assert (stats.first, stats.exported, stats.specialized, stats.fallbacks) == (2, 1, 2, 0)


def test_a_change_after_the_first_compile_is_in_the_key_the_family_gets() -> None:
    """The first compile records its family unkeyed; the key it gets is
    taken at the module's next compile, from the module as it is then:
    a value changed in between is in that key and in every program of
    the family (each new length equals eager with the new value), and
    changing it back misses that family."""
    torch.manual_seed(0)
    model = Mixer().eval()
    hloalias.compile(model, (_ids(8),))
    model.scale = 3.0
    for length in (12, 16):
        exe = hloalias.compile(model, (_ids(length),))
        torch.testing.assert_close(exe(_ids(length)), model(_ids(length)))
    model.scale = 1.0
    exe = hloalias.compile(model, (_ids(20),))
    torch.testing.assert_close(exe(_ids(20)), model(_ids(20)))
    stats = shape_family.shape_family_stats()
    assert (stats.first, stats.exported, stats.specialized, stats.fallbacks) == (2, 1, 2, 0), stats.reasons


def test_a_function_has_no_family() -> None:
    """Only modules have families: a function's new sizes take the usual
    import, and nothing is recorded for it."""
    for length in (4, 6):
        x = torch.randn(length)
        torch.testing.assert_close(hloalias.compile(lambda t: t * 2, (x,))(x), x * 2)
    stats = shape_family.shape_family_stats()
    assert (stats.first, stats.exported, stats.specialized, stats.fallbacks) == (0, 0, 0, 0)

def test_a_replaced_parameter_is_not_served_by_the_old_export() -> None:
    torch.manual_seed(0)
    model = Mixer().eval()
    hloalias.compile(model, (_ids(8),))
    hloalias.compile(model, (_ids(12),))
    model.proj.weight = torch.nn.Parameter(torch.randn(8, 8))
    exe = hloalias.compile(model, (_ids(16),))
    torch.testing.assert_close(exe(_ids(16)), model(_ids(16)))
    assert "replaced" in shape_family.shape_family_stats().reasons[-1]


def test_off_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOALIAS_SHAPE_FAMILY", "0")
    model = Mixer().eval()
    for length in (8, 12):
        hloalias.compile(model, (_ids(length),))
    stats = shape_family.shape_family_stats()
    assert (stats.first, stats.exported, stats.specialized) == (0, 0, 0)


def test_a_changed_rank_does_not_specialize() -> None:
    model = Mixer().eval()
    dynamic = export_dynamic(model, (_ids(8),), {}, [frozenset({1})])
    with pytest.raises(NotSpecializable, match="rank"):
        specialize(dynamic, (torch.arange(8) % 32,), {})


class Scaled(torch.nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - a builtin's name, as users write
        return input * 2


def test_an_input_named_like_a_builtin_keeps_its_name() -> None:
    """FX renames a new node called ``input`` to ``input_1``; the
    specialized program keeps the signature's names."""
    model = Scaled()
    for length in (4, 6, 9):
        x = torch.randn(3, length)
        torch.testing.assert_close(hloalias.compile(model, (x,))(x), x * 2)
    assert shape_family.shape_family_stats().specialized == 2


def test_hloalias_shape_family_cache_size_bounds_the_families(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most HLOALIAS_SHAPE_FAMILY_CACHE_SIZE modules keep a family (read
    at each new family), least recently used dropped: the dropped module's
    next size is a first compile again, not a specialization."""
    monkeypatch.setenv("HLOALIAS_SHAPE_FAMILY_CACHE_SIZE", "1")
    first, second = Mixer().eval(), Mixer().eval()
    hloalias.compile(first, (_ids(8),))
    hloalias.compile(second, (_ids(8),))  # drops first's family
    assert len(shape_family._FAMILIES) == 1
    hloalias.compile(first, (_ids(12),))
    stats = shape_family.shape_family_stats()
    assert (stats.first, stats.exported, stats.specialized) == (3, 0, 0)
    monkeypatch.setenv("HLOALIAS_SHAPE_FAMILY_CACHE_SIZE", "0")
    hloalias.compile(Mixer().eval(), (_ids(8),))
    assert len(shape_family._FAMILIES) == 0


def test_a_collected_module_takes_its_family_and_state_with_it() -> None:
    import gc
    import weakref

    model = Mixer().eval()
    hloalias.compile(model, (_ids(8),))
    hloalias.compile(model, (_ids(12),))
    weight = weakref.ref(model.proj.weight)
    assert len(shape_family._FAMILIES) == 1
    del model
    hloalias.clear_cache()
    export_cache.clear_export_cache()
    gc.collect()
    assert len(shape_family._FAMILIES) == 0
    assert weight() is None


class _CountingMode(torch.overrides.TorchFunctionMode):
    """Counts the torch calls it sees (and runs them unchanged)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        return func(*args, **(kwargs or {}))


def test_specialization_runs_no_torch_call_through_the_callers_modes() -> None:
    # compile exports under a torch function mode (its refusal of training
    # calls); the fake propagation of a specialization runs no user code and
    # goes around such modes, with the same program as a fresh export.
    torch.manual_seed(0)
    model = Mixer().eval()
    dynamic = export_dynamic(model, (_ids(8),), {}, [frozenset({1})])
    from hloalias.frontend.importer import Stage
    from hloalias.frontend.shape_specialization import import_specialized

    for length in (3, 17):
        ids = _ids(length)
        with _CountingMode() as mode:
            specialize(dynamic, (ids,), {})
        assert mode.calls == 0
        with _CountingMode() as mode:
            specialized = import_specialized(dynamic, model, (ids,), {}, Stage.STABLEHLO)
        # Nor does the import after it (graph rewrites, the FX import's
        # metadata queries, constant folding): no user code runs there.
        assert mode.calls == 0
        fresh = import_torch(model, (_ids(length),))
        assert specialized.text == fresh.text
        assert specialized.signature == fresh.signature


def test_specialization_generates_no_python_code_and_the_program_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The importer reads the specialized graph, never runs its GraphModule:
    # the module's Python code is generated on first use only (a lazy
    # GraphModule), not at the specialization nor at each recompile of the
    # import's graph rewrites.  Code generations are counted, not timed.
    torch.manual_seed(0)
    model = Mixer().eval()
    dynamic = export_dynamic(model, (_ids(8),), {}, [frozenset({1})])
    from hloalias.frontend.importer import Stage
    from hloalias.frontend.shape_specialization import import_specialized

    generated = []
    python_code = torch.fx.Graph.python_code

    def counting(self: torch.fx.Graph, *args: object, **kwargs: object) -> object:
        generated.append(self)
        return python_code(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", counting)
    program = import_specialized(dynamic, model, (_ids(5),), {}, Stage.STABLEHLO)
    assert generated == []
    assert program.text == import_torch(model, (_ids(5),)).text
    generated.clear()  # the fresh export's own
    # On first use the code is there: the specialized program runs as the
    # model does on those sizes.
    exported = specialize(dynamic, (_ids(6),), {})
    assert generated == []
    torch.testing.assert_close(exported.module()(_ids(6)), model(_ids(6)))
    assert exported.range_constraints == {}


def test_a_compile_prints_the_module_once_for_both_keys(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """With the program cache on, a later compile of a module takes the
    program-cache key and the family key before its import, with no code
    run between: the module is printed once, for the first, and the
    second reuses that printing; the family key is the one a printing of
    its own gives, and a new length is specialized from the family."""
    from hloalias.runtime import source_key

    monkeypatch.setenv("HLOALIAS_PROGRAM_CACHE", "1")
    monkeypatch.setenv("HLOALIAS_CACHE_DIR", str(tmp_path))
    printed: list[object] = []
    original = source_key._Printer.module

    def counting(self: object, root: torch.nn.Module) -> object:
        printed.append(root)
        return original(self, root)  # type: ignore[arg-type]

    monkeypatch.setattr(source_key._Printer, "module", counting)
    torch.manual_seed(0)
    model = Mixer().eval()
    for length in (8, 12):
        hloalias.compile(model, (_ids(length),))
    printed.clear()
    exe = hloalias.compile(model, (_ids(5),))
    torch.testing.assert_close(exe(_ids(5)), model(_ids(5)))
    assert printed == [model]
    stats = shape_family.shape_family_stats()
    assert (stats.first, stats.exported, stats.specialized, stats.fallbacks) == (1, 1, 2, 0), stats.reasons
    key, program = source_key.keyed_source(model, (_ids(5),), {}, "options")
    options = ("shape family", "spec", ())
    assert source_key.source_key(model, (), {}, options, program) == source_key.source_key(model, (), {}, options)
    with pytest.raises(ValueError):
        source_key.source_key(model, (_ids(5),), {}, "options", program)
