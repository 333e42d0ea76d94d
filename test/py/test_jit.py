"""``hloalias.jit``: compile per input signature on first use, a bounded
cache of executables sharing the module's device state, staged lowering,
reports (hloalias.runtime.jit_cache)."""

from __future__ import annotations

import copy
import gc

import jax
import pytest
import torch

import hloalias
from hloalias.errors import ExecutionError


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    # Odd sizes: no other array in the process has the weights' shapes.
    return torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.ReLU(), torch.nn.Linear(13, 3)).eval()


def _live_arrays_of_shape(shape: tuple[int, ...]) -> int:
    return sum(1 for array in jax.live_arrays() if array.shape == shape)


def test_four_batch_sizes_compile_four_times_and_share_one_copy_of_the_weights() -> None:
    gc.collect()  # arrays of other tests' models, if any, stay out of the count
    before = _live_arrays_of_shape((13, 7)), _live_arrays_of_shape((3, 13))
    model = _mlp()
    jitted = hloalias.jit(model)
    with torch.no_grad():
        for batch in (1, 2, 3, 4):
            x = torch.randn(batch, 7)
            torch.testing.assert_close(jitted(x), model(x))
        assert jitted.stats.compiles == 4 and jitted.stats.hits == 0
        for batch in (4, 1):
            x = torch.randn(batch, 7)
            torch.testing.assert_close(jitted(x), model(x))
    assert (jitted.stats.compiles, jitted.stats.hits) == (4, 2)
    assert len(jitted.executables) == 4
    # One device buffer per weight, whatever the number of executables.
    assert _live_arrays_of_shape((13, 7)) == before[0] + 1
    assert _live_arrays_of_shape((3, 13)) == before[1] + 1
    assert [name for name in jitted.state_dict()] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_cache_is_bounded_least_recently_used_first() -> None:
    jitted = hloalias.jit(lambda x: x * 2 + 1, cache_size=2)
    for rows in (1, 2, 3):
        torch.testing.assert_close(jitted(torch.ones(rows, 2)), torch.full((rows, 2), 3.0))
    assert (jitted.stats.compiles, jitted.stats.evictions) == (3, 1)
    assert jitted.signatures == ["(float32[2, 2])", "(float32[3, 2])"]
    jitted(torch.ones(1, 2))  # evicted: compiled again, not an error
    assert (jitted.stats.compiles, jitted.stats.hits, jitted.stats.evictions) == (4, 0, 2)


def test_cache_size_default_is_hloalias_jit_cache_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """HLOALIAS_JIT_CACHE_SIZE is the default cache_size (read when the Jit
    is made; an argument wins); below 1 it is refused by name."""
    monkeypatch.setenv("HLOALIAS_JIT_CACHE_SIZE", "1")
    jitted = hloalias.jit(lambda x: x * 2 + 1)
    monkeypatch.setenv("HLOALIAS_JIT_CACHE_SIZE", "5")  # read at the Jit's making only
    for rows in (1, 2):
        torch.testing.assert_close(jitted(torch.ones(rows, 2)), torch.full((rows, 2), 3.0))
    assert jitted.cache_size == 1 and jitted.signatures == ["(float32[2, 2])"]
    assert (jitted.stats.compiles, jitted.stats.evictions) == (2, 1)
    assert hloalias.jit(lambda x: x, cache_size=3).cache_size == 3
    monkeypatch.setenv("HLOALIAS_JIT_CACHE_SIZE", "0")
    with pytest.raises(ExecutionError, match="HLOALIAS_JIT_CACHE_SIZE must be a positive int, got 0"):
        hloalias.jit(lambda x: x)
    assert hloalias.jit(lambda x: x, cache_size=2).cache_size == 2  # the variable is not read


def test_static_values_and_dtypes_are_part_of_the_signature() -> None:
    def scale(x: torch.Tensor, factor: int) -> torch.Tensor:
        return x * factor

    jitted = hloalias.jit(scale)
    x = torch.arange(4.0)
    torch.testing.assert_close(jitted(x, 2), x * 2)
    torch.testing.assert_close(jitted(x, 3), x * 3)
    torch.testing.assert_close(jitted(x.double(), 3), x.double() * 3)
    torch.testing.assert_close(jitted(x, factor=3), x * 3)  # another call structure: its own entry
    assert jitted.stats.compiles == 4
    torch.testing.assert_close(jitted(x, 2), x * 2)
    assert jitted.stats.hits == 1


def test_static_argument_holding_a_tensor_is_refused_before_compiling() -> None:
    def scale(x: torch.Tensor, factor: int) -> torch.Tensor:
        return x * factor

    jitted = hloalias.jit(scale, static_argnames=("factor",))
    torch.testing.assert_close(jitted(torch.ones(2), 3), torch.full((2,), 3.0))
    for call in (lambda: jitted(torch.ones(2), torch.tensor(3)), lambda: jitted(torch.ones(2), factor=torch.tensor(3))):
        with pytest.raises(ExecutionError, match="static argument 'factor' holds a tensor"):
            call()
    by_position = hloalias.jit(scale, static_argnums=(1,))
    with pytest.raises(ExecutionError, match="static argument 1 holds a tensor"):
        by_position(torch.ones(2), torch.tensor(3))
    assert jitted.stats.compiles == 1 and by_position.stats.compiles == 0


def test_bad_options_are_refused() -> None:
    with pytest.raises(ExecutionError, match="cache_size"):
        hloalias.jit(lambda x: x, cache_size=0)
    with pytest.raises(ExecutionError, match="donate_argnames must be a sequence of str"):
        hloalias.jit(lambda x: x, donate_argnames="x")
    with pytest.raises(ExecutionError, match=r"static_argnames \['factr'\] are not parameters of .*\(factor, x\)"):
        hloalias.jit(lambda x, factor: x * factor, static_argnames=("factr",))
    with pytest.raises(ExecutionError, match="not callable"):
        hloalias.jit(3)  # type: ignore[arg-type]


def test_lower_then_compile_is_staged_and_cached() -> None:
    model = _mlp()
    jitted = hloalias.jit(model)
    x = torch.randn(5, 7)
    with torch.no_grad():
        lowered = jitted.lower(x)
        assert jitted.stats.compiles == 0
        assert "func.func @main" in lowered.as_text() and 'hloalias.name = "0.weight"' in lowered.as_text()
        executable = lowered.compile()
        assert isinstance(executable, hloalias.Executable) and jitted.stats.compiles == 1
        torch.testing.assert_close(jitted(x), model(x))
        assert jitted.stats.hits == 1 and jitted.executables == [executable]
        jitted(x.double().float())  # the same signature
    assert jitted.stats.hits == 2
    # Grad mode is part of the signature: the same shapes with grad enabled compile anew.
    jitted(x)
    assert jitted.stats.compiles == 2


def test_donate_argnames_reach_every_compile() -> None:
    jitted = hloalias.jit(lambda x: x * 2 + 1, donate_argnames=("x",))
    for rows in (2, 3):
        jitted(torch.ones(rows, 4))
    for executable in jitted.executables:
        assert [(a["argument"], a["origin"]) for a in executable.aliases] == [("x", "explicit")]


def test_module_state_updated_in_place_stays_on_the_device_for_every_signature() -> None:
    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("total", torch.zeros(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.total.add_(x.sum(0))
            return self.total[1:]

    model, eager = Counter(), Counter()
    jitted = hloalias.jit(model)
    for rows in (1, 2, 1, 4):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(jitted(x), eager(x))
    torch.testing.assert_close(jitted.state_dict()["total"], eager.total)
    assert jitted.stats.compiles == 3
    for executable in jitted.executables:
        assert [(a["argument"], a["origin"]) for a in executable.aliases] == [("total", "inferred")]


def test_training_flag_and_grad_mode_are_part_of_the_signature() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    eager = copy.deepcopy(model)
    jitted = hloalias.jit(model)
    x = torch.randn(6, 4)
    with torch.no_grad():
        torch.testing.assert_close(jitted(x), eager(x))  # train mode: batch statistics
        model.eval(), eager.eval()
        torch.testing.assert_close(jitted(x), eager(x))  # eval mode: running statistics
    assert jitted.stats.compiles == 2
    torch.testing.assert_close(jitted.state_dict()["1.running_mean"], eager[1].running_mean)


def test_the_default_dtype_is_part_of_the_signature() -> None:
    """A program that makes a tensor of the default dtype: before, a jit
    compiled under float32 went on returning float32 after
    ``torch.set_default_dtype(torch.float64)``, where eager returns float64."""
    jitted = hloalias.jit(lambda x: x + torch.arange(4) / 3)
    x = torch.randn(2, 4)
    assert jitted(x).dtype == torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        eager = x + torch.arange(4) / 3
        assert eager.dtype == torch.float64
        got = jitted(x)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, eager, rtol=0, atol=0)
    finally:
        torch.set_default_dtype(previous)
    assert jitted(x).dtype == torch.float32
    assert jitted.stats.compiles == 2


def test_device_accepts_a_torch_device() -> None:
    jitted = hloalias.jit(lambda x: x + 1, device=torch.device("cpu"))
    torch.testing.assert_close(jitted(torch.zeros(2)), torch.ones(2))
    assert jitted.executables[0].device.platform == "cpu"
    executable = hloalias.compile(lambda x: x + 1, (torch.zeros(2),), device=torch.device("cpu", 0))
    assert executable.device == jax.devices("cpu")[0]
    with pytest.raises(ExecutionError, match="no PJRT device for device\\(type='cpu', index=99\\)"):
        hloalias.compile(lambda x: x + 1, (torch.zeros(2),), device=torch.device("cpu", 99))


def test_explain_lists_every_signature_and_the_counts() -> None:
    jitted = hloalias.jit(_mlp())
    with torch.no_grad():
        jitted(torch.randn(1, 7))
        jitted(torch.randn(2, 7))
        jitted(torch.randn(2, 7))
    text = jitted.explain()
    assert "2 compile(s), 1 cache hit(s), 0 eviction(s); 2 of at most 8 signature(s) cached" in text
    assert "signature 0: (float32[1, 7])" in text and "signature 1: (float32[2, 7])" in text
    assert text.count("XLA memory: argument") == 2
