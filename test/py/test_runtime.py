"""Execution (issue: execution): a compiled program behaves like calling the
torch program eagerly -- values, dtypes, shapes, views, in-place updates of
inputs and module state -- and consumes donated buffers safely."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias

F32_BYTES = 4
# XLA returns two or more results as a tuple and counts its pointer table,
# 8 bytes per element, in output_bytes (the plain seed example's 8208 bytes
# are 2 x 4096 + 2 x 8).
TUPLE_POINTER_BYTES = 8


# -- results equal eager PyTorch ----------------------------------------------------

class SmallMLP(torch.nn.Module):
    """Linear -> GELU -> LayerNorm -> Linear -> softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(self.norm(torch.nn.functional.gelu(self.fc1(x)))), dim=-1)


class SmallConv(torch.nn.Module):
    """A convolution and a pooled view of it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, kernel_size=3, padding=1)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.relu(self.conv(image))
        return features, features.mean(dim=(2, 3))


def mixed_outputs(a: torch.Tensor, b: torch.Tensor, *, scale: torch.Tensor) -> dict[str, Any]:
    """Keyword input, dict output, integer, boolean and view results."""
    return {
        "scaled": a + b * scale,
        "argmax": a.argmax(dim=1),
        "greater": a > b,
        "first_row": a[0],
        "pair": (b.t(), (a * b).sum()),
    }


def half_precision(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 result and an int32 cast."""
    return x.to(torch.bfloat16) * 3, (x * 10).to(torch.int32)


MODEL_CASES: list[tuple[str, Callable[[], Any], Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]]] = [
    ("mlp", SmallMLP, lambda: ((torch.randn(5, 6),), {})),
    ("conv", SmallConv, lambda: ((torch.randn(1, 2, 5, 5),), {})),
    ("mixed_outputs", lambda: mixed_outputs,
     lambda: ((torch.randn(3, 4), torch.randn(3, 4)), {"scale": torch.randn(4)})),
    ("half_precision", lambda: half_precision, lambda: ((torch.randn(2, 3),), {})),
]


@pytest.mark.parametrize(("make_model", "make_inputs"), [c[1:] for c in MODEL_CASES],
                         ids=[c[0] for c in MODEL_CASES])
def test_results_equal_eager(
    make_model: Callable[[], Any], make_inputs: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]
) -> None:
    """Same structure, dtypes, shapes and values as eager PyTorch, on
    inputs other than the example inputs."""
    torch.manual_seed(0)
    model = make_model()
    example_args, example_kwargs = make_inputs()
    exe = hloalias.compile(model, example_args, example_kwargs)
    args, kwargs = make_inputs()
    got = exe(*args, **kwargs)
    with torch.no_grad():
        expected = model(*args, **kwargs)
    assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(expected)
    # assert_close also checks dtype, shape and device of every leaf.
    torch.testing.assert_close(got, expected)


def mutate_inputs(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """In-place updates of two inputs, then views of their new values."""
    x.add_(y)
    y.mul_(2)
    return x * y, y.t(), x[1:]


def test_mutated_inputs_equal_eager_and_views_follow_them() -> None:
    """After the call x and y hold eager's values, in the caller's own
    tensors; returned views are views of those tensors, as in eager."""
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    exe = hloalias.compile(mutate_inputs, (x.clone(), y.clone()))
    eager_x, eager_y = x.clone(), y.clone()
    expected = mutate_inputs(eager_x, eager_y)
    x_before = x
    got = exe(x, y)
    assert x is x_before
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close((x, y), (eager_x, eager_y))
    product, y_transposed, x_tail = got
    assert y_transposed.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    assert x_tail.data_ptr() == x.data_ptr() + 3 * x.element_size()
    x[2, 0] = 100.0  # a real view sees later writes, as eager's would
    assert x_tail[1, 0] == 100.0


class RunningMean(torch.nn.Module):
    """A float buffer updated in place each call, and a parameter read."""

    running: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(4))
        self.register_buffer("running", torch.zeros(4))

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        self.running.mul_(0.9).add_(0.1 * batch.mean(0))
        return batch * self.scale - self.running


def test_module_state_equals_eager_after_each_call() -> None:
    """The buffer evolves as eager's does; the parameter stays put."""
    torch.manual_seed(1)
    model = RunningMean()
    eager = copy.deepcopy(model)
    exe = hloalias.compile(model, (torch.randn(3, 4),))
    for _ in range(3):
        batch = torch.randn(3, 4)
        with torch.no_grad():
            expected = eager(batch)
        torch.testing.assert_close(exe(batch), expected)
        state = exe.state_dict()
        torch.testing.assert_close(state["running"], eager.running)
        torch.testing.assert_close(state["scale"], eager.scale.detach())
    # The state lives on the device; a bare read of the module's buffer
    # copies it in (runtime/state.py), so it reads as eager's does.
    torch.testing.assert_close(model.running, eager.running)


def seed_example(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The issue's example: the input itself and a view of a slice of it."""
    a = x[0:1024]
    return x, a.view(2, 512)


def test_seed_example_returns_x_itself_and_a_view_into_it() -> None:
    """``out[0] is x``, and out[1] points into x's storage: no copy."""
    x = torch.randn(1024)
    exe = hloalias.compile(seed_example, (x,))
    out = exe(x)
    assert out[0] is x
    view = out[1]
    start = x.untyped_storage().data_ptr()
    end = start + x.untyped_storage().nbytes()
    assert start <= view.data_ptr() < end
    assert view.data_ptr() + view.numel() * view.element_size() <= end
    assert view.shape == (2, 512) and view.stride() == (512, 1)
    assert torch.equal(view, x.view(2, 512))
    x[513] = 42.0
    assert view[1, 1] == 42.0


# -- donation ------------------------------------------------------------------------------

def double(x: torch.Tensor) -> torch.Tensor:
    """``x * 2``; with x donated, XLA writes the result into x's buffer."""
    return x * 2


@pytest.fixture(scope="module")
def donating_double() -> hloalias.Executable:
    """``double`` compiled with x donated."""
    return hloalias.compile(double, (torch.randn(4, 4),), donate=("x",))


def test_donated_device_tensor_cannot_be_used_again(donating_double: hloalias.Executable) -> None:
    """A donated DeviceTensor is consumed: using it again raises
    DonatedBufferError naming the tensor, never reads freed memory."""
    x = torch.randn(4, 4)
    activations = donating_double.to_device(x, name="activations")
    torch.testing.assert_close(donating_double(activations), x * 2)
    with pytest.raises(hloalias.DonatedBufferError, match="activations"):
        donating_double(activations)
    with pytest.raises(hloalias.DonatedBufferError, match="'activations' was donated"):
        activations.to_torch()


def test_donated_torch_tensor_is_left_untouched(donating_double: hloalias.Executable) -> None:
    """The CPU client cannot reuse memory torch owns: a donated torch tensor
    keeps its value and the result is right."""
    x = torch.randn(4, 4)
    before = x.clone()
    torch.testing.assert_close(donating_double(x), before * 2)
    assert torch.equal(x, before)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32).clone()


def test_non_donated_inputs_are_never_changed() -> None:
    """Inputs neither donated nor mutated keep every bit, as torch tensors
    and as device tensors, even beside a donated input of the same type."""

    def combine(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a * 2 + b, b - a

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    exe = hloalias.compile(combine, (a, b), donate=("a",))
    assert [alias["argument"] for alias in exe.aliases] == ["a"]
    b_bits = _bits(b)
    device_b = exe.to_device(b, name="b")
    for _ in range(2):  # b reused: it was never donated
        device_a = exe.to_device(a, name="a")
        torch.testing.assert_close(exe(device_a, b), combine(a, b))
        torch.testing.assert_close(exe(exe.to_device(a), device_b), combine(a, b))
        assert torch.equal(_bits(b), b_bits)
        assert torch.equal(_bits(device_b.to_torch()), b_bits)


# -- module state over many calls ---------------------------------------------------------

CACHE_LENGTH = 32
HEAD_DIM = 8


class KVCacheStep(torch.nn.Module):
    """One decoding step: write k at the step's slot of a ring-buffer key
    cache (``index_copy_``), advance the step counter, score q against the
    cache."""

    step: torch.Tensor
    k_cache: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("step", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("k_cache", torch.zeros(CACHE_LENGTH, HEAD_DIM))

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        slot = torch.remainder(self.step, CACHE_LENGTH)
        self.k_cache.index_copy_(0, slot, k)
        self.step.add_(1)
        return q @ self.k_cache.t()


def test_kv_cache_state_over_100_calls(fresh_cache: None) -> None:
    """100 steps: outputs and state equal eager's after every call (the
    ring wraps around three times), one compile, and XLA's figures at the
    minimum the shapes allow."""
    torch.manual_seed(2)
    model = KVCacheStep()
    eager = copy.deepcopy(model)
    exe = hloalias.compile(model, (torch.randn(1, HEAD_DIM), torch.randn(1, HEAD_DIM)))

    # The minimum: every argument once (state and inputs), plus the only
    # genuinely new result, the 1 x CACHE_LENGTH scores.  The new step and
    # cache must reuse their old buffers (aliases), adding nothing.  XLA
    # also counts its 3-result tuple's pointer table.  Its temp_bytes are
    # its own scratch (the scatter's index), outside what aliasing decides,
    # but smaller than the cache: the cache was not copied.
    state_bytes = 1 * 8 + CACHE_LENGTH * HEAD_DIM * F32_BYTES
    input_bytes = 2 * HEAD_DIM * F32_BYTES
    new_output_bytes = CACHE_LENGTH * F32_BYTES
    minimum = state_bytes + input_bytes + new_output_bytes + 3 * TUPLE_POINTER_BYTES

    def check_memory() -> None:
        stats = exe.memory_stats
        assert stats["alias_bytes"] == state_bytes
        assert stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"] == minimum
        assert stats["total_bytes"] == minimum + stats["temp_bytes"]
        assert stats["temp_bytes"] < CACHE_LENGTH * HEAD_DIM * F32_BYTES

    check_memory()
    assert [(a["argument"], a["origin"]) for a in exe.aliases] == [("step", "inferred"), ("k_cache", "inferred")]
    for call in range(100):
        q, k = torch.randn(1, HEAD_DIM), torch.randn(1, HEAD_DIM)
        expected = eager(q, k)
        torch.testing.assert_close(exe(q, k), expected, msg=lambda m: f"call {call}: {m}")
        state = exe.state_dict()
        assert torch.equal(state["step"], eager.step), f"call {call}"
        assert torch.equal(state["k_cache"], eager.k_cache), f"call {call}"
        check_memory()
    assert state["step"].item() == 100
    assert (hloalias.cache_stats().misses, hloalias.cache_stats().hits) == (1, 0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64], ids=["int64", "float64"])
def test_64_bit_state_and_inputs(dtype: torch.dtype) -> None:
    """64-bit values reach XLA at their width (jax narrows them to 32 bits
    unless told otherwise): an int64 counter buffer, 64-bit inputs."""

    class Counter(torch.nn.Module):
        step: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("step", torch.zeros(1, dtype=torch.int64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.step.add_(1)
            return x + 1

    # Values 32 bits cannot hold: narrowed, they would come back changed.
    if dtype == torch.int64:
        x = torch.arange(3, dtype=dtype) + 2**40
    else:
        x = torch.arange(3, dtype=dtype) + 1e-12
    exe = hloalias.compile(Counter(), (x,))
    assert torch.equal(exe(x), x + 1)
    assert torch.equal(exe(exe.to_device(x)), x + 1)
    step = exe.state_dict()["step"]
    assert step.dtype == torch.int64 and step.item() == 2


# -- input checking -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyword_program() -> hloalias.Executable:
    """``mixed_outputs`` compiled for two 3x4 inputs and a 4-vector keyword."""
    return hloalias.compile(mixed_outputs, (torch.randn(3, 4), torch.randn(3, 4)), {"scale": torch.randn(4)})


@pytest.mark.parametrize(
    ("b", "culprit"),
    [
        (torch.randn(2, 4), r"\[2, 4\]"),
        (torch.randn(4, 3), r"\[4, 3\]"),
        (torch.randn(3, 4, dtype=torch.float64), "float64"),
        (torch.ones(3, 4, dtype=torch.int32), "int32"),
    ],
    ids=["rows", "transposed", "float64", "int32"],
)
def test_wrong_shape_or_dtype_raises(keyword_program: hloalias.Executable, b: torch.Tensor, culprit: str) -> None:
    """An input that does not match the compiled signature is an
    ExecutionError naming the input and what was given."""
    with pytest.raises(hloalias.ExecutionError, match="'b'") as raised:
        keyword_program(torch.randn(3, 4), b, scale=torch.randn(4))
    raised.match(culprit)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)), {}),  # keyword given by position
        ((torch.randn(3, 4),), {"scale": torch.randn(4)}),  # one missing
        ((torch.randn(3, 4), torch.randn(3, 4)), {"scale": torch.randn(4), "extra": torch.randn(4)}),
        ((torch.randn(3, 4), [torch.randn(2), torch.randn(2)]), {"scale": torch.randn(4)}),
    ],
    ids=["positional_keyword", "missing", "extra_keyword", "list_for_tensor"],
)
def test_wrong_structure_raises(
    keyword_program: hloalias.Executable, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Inputs structured other than the example's are an ExecutionError."""
    with pytest.raises(hloalias.ExecutionError, match="structure"):
        keyword_program(*args, **kwargs)


def test_non_tensor_input_raises(keyword_program: hloalias.Executable) -> None:
    """A leaf that is not a tensor is an ExecutionError naming the input."""
    with pytest.raises(hloalias.ExecutionError, match="'scale'"):
        keyword_program(torch.randn(3, 4), torch.randn(3, 4), scale=3.0)


# -- introspection and state -------------------------------------------------------------------

def test_explain_mentions_both_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """``explain()`` gives both passes' decisions and XLA's bytes."""
    exe = hloalias.compile(mutate_inputs, (torch.randn(3, 3), torch.randn(3, 3)))
    text = exe.explain()
    assert "eliminate-view-results" in text
    assert "alias-donated-buffers" in text
    assert "output:1" in text and "transpose" in text  # y.t() rebuilt as a view
    assert "'x'" in text and "'y'" in text  # both mutated inputs aliased
    assert f"= {exe.memory_stats['total_bytes']} bytes" in text
    assert capsys.readouterr().out == ""  # returned, not printed


def test_state_dict_round_trip() -> None:
    """``load_state_dict(state_dict())`` restores; new values take effect."""
    torch.manual_seed(3)
    layer = torch.nn.Linear(3, 2)
    exe = hloalias.compile(layer, (torch.randn(1, 3),))
    original = exe.state_dict()
    assert set(original) == {"weight", "bias"}
    torch.testing.assert_close(original["weight"], layer.weight.detach())

    replacement = {name: torch.randn_like(value) for name, value in original.items()}
    exe.load_state_dict(replacement)
    assert all(torch.equal(exe.state_dict()[n], v) for n, v in replacement.items())
    x = torch.randn(1, 3)
    torch.testing.assert_close(exe(x), x @ replacement["weight"].t() + replacement["bias"])

    exe.load_state_dict(original)
    assert all(torch.equal(exe.state_dict()[n], v) for n, v in original.items())
    with torch.no_grad():
        torch.testing.assert_close(exe(x), layer(x))
    # Host copies: changing what state_dict() returned changes nothing.
    exe.state_dict()["bias"].fill_(7.0)
    torch.testing.assert_close(exe.state_dict()["bias"], original["bias"])


@pytest.mark.parametrize(
    ("state", "culprit"),
    [({"nonexistent": torch.ones(1)}, "nonexistent"), ({"weight": torch.ones(3, 3)}, "weight")],
    ids=["unknown_name", "wrong_shape"],
)
def test_load_state_dict_rejects_bad_state(state: dict[str, torch.Tensor], culprit: str) -> None:
    """Unknown names and mismatched shapes are an ExecutionError."""
    exe = hloalias.compile(torch.nn.Linear(3, 2), (torch.randn(1, 3),))
    before = exe.state_dict()
    with pytest.raises(hloalias.ExecutionError, match=culprit):
        exe.load_state_dict(state)
    assert all(torch.equal(exe.state_dict()[n], v) for n, v in before.items())


# -- configuration errors -------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("donate", "culprit"),
    [
        (("nonexistent",), "unknown tensor 'nonexistent'"),
        ((0, "x"), "'x' is donated twice"),
        (("x", "x"), "'x' is donated twice"),
        ((1,), "user input 1"),
    ],
    ids=["unknown_name", "position_and_name", "name_twice", "position_out_of_range"],
)
def test_bad_donation_raises(donate: tuple[int | str, ...], culprit: str) -> None:
    """Donation requests name real inputs, each once."""
    with pytest.raises(hloalias.DonationError, match=culprit):
        hloalias.compile(double, (torch.randn(2),), donate=donate)


def test_missing_device_raises() -> None:
    """A platform with no PJRT device here is an ExecutionError naming it."""
    with pytest.raises(hloalias.ExecutionError, match="'tpu'"):
        hloalias.compile(double, (torch.randn(2),), device="tpu")


def _write_row(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    cache[0].copy_(new)
    return new * 2


def test_calls_take_jaxlibs_cpp_dispatch_and_still_update_in_place() -> None:
    """After the first call, calls run through jaxlib's C++ fast path (no
    further cache misses) and XLA still writes the re-seated cache in place."""
    from hloalias.runtime import pjrt

    if pjrt._jax_pjit is None:
        pytest.skip("this jaxlib has no C++ dispatch entry")
    exe = hloalias.compile(_write_row, (torch.zeros(4, 3), torch.zeros(3)))
    cache = torch.zeros(4, 3)
    exe(cache, torch.ones(3))
    address = cache.data_ptr()
    for step in range(2, 7):
        out = exe(cache, torch.full((3,), float(step)))
        assert torch.equal(out, torch.full((3,), 2.0 * step)) and torch.equal(cache[0], torch.full((3,), float(step)))
    assert exe._plan is not None and exe._plan.dispatch._misses == 1
    assert cache.data_ptr() == address and exe.host_copies == {}


class _ManyCounters(torch.nn.Module):
    """Twelve state tensors (three dtypes), each read and updated in place
    by every call, and a running total: a program of 14 arguments."""

    def __init__(self) -> None:
        super().__init__()
        for index in range(4):
            self.register_buffer(f"f{index}", torch.full((3,), float(index)))
            self.register_buffer(f"i{index}", torch.arange(3, dtype=torch.int64) + index)
            self.register_buffer(f"d{index}", torch.full((2, 2), 0.5 * index, dtype=torch.float64))

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        total = x * scale
        for index in range(4):
            f, i, d = getattr(self, f"f{index}"), getattr(self, f"i{index}"), getattr(self, f"d{index}")
            f.add_(x)
            i.add_(index + 1)
            d.mul_(1.5)
            total = total + f + i.to(torch.float32) + d.sum().to(torch.float32)
        return total


def test_programs_of_many_arguments_call_execute_sharded_with_the_fast_paths_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A program of SHARDED_FROM_ARGUMENTS arguments or more skips jaxlib's
    fast path (one ``execute_sharded`` of the whole list per call, on both
    call paths); its results and module state equal eager's and those of
    the same program driven through the fast path, call after call."""
    from hloalias.runtime.pjrt import SingleDeviceDispatch

    eager, modules = _ManyCounters(), [_ManyCounters() for _ in range(3)]
    example = (torch.zeros(3), torch.ones(3))
    native = hloalias.compile(modules[0], example)
    with monkeypatch.context() as patch:
        patch.setenv("HLOALIAS_NATIVE", "0")
        python = hloalias.compile(modules[1], example)
    assert python._lane is None
    fast = hloalias.compile(modules[2], example)
    assert len(native._arg_plan) >= SingleDeviceDispatch.SHARDED_FROM_ARGUMENTS
    for exe in (native, python, fast):
        assert exe._plan is not None and exe._plan.dispatch.entry is None
        assert exe._plan.dispatch.run.func is SingleDeviceDispatch._execute_sharded  # type: ignore[attr-defined]
    # The third executable driven through jaxlib's fast path where it exists.
    assert fast._plan is not None
    fast._plan.dispatch = SingleDeviceDispatch(
        fast._loaded, fast.device, result_types=list(zip(fast._result_shapes, fast._result_dtypes)),
    )
    for step in range(6):
        x, scale = torch.randn(3), torch.full((3,), float(step))
        want = eager(x, scale)
        for exe in (native, python, fast):
            assert torch.equal(exe(x, scale), want)
            state = exe.state_dict()
            for name, value in eager.state_dict().items():
                assert torch.equal(state[name], value), name
    if native._lane is not None:  # built, and not turned off (HLOALIAS_NATIVE=0)
        assert native._lane.counts["fallbacks"] == 0 and native._lane.counts["calls"] == 6


def test_programs_of_few_arguments_keep_the_fast_path() -> None:
    from hloalias.runtime import pjrt

    if pjrt._jax_pjit is None:
        pytest.skip("this jaxlib has no C++ dispatch entry")
    arguments = pjrt.SingleDeviceDispatch.SHARDED_FROM_ARGUMENTS - 1
    exe = hloalias.compile(lambda *xs: sum(xs), tuple(torch.zeros(2) for _ in range(arguments)))
    assert exe._plan is not None and len(exe._arg_plan) == arguments
    assert exe._plan.dispatch.entry is not None
    got = exe(*(torch.full((2,), float(i)) for i in range(arguments)))
    assert torch.equal(got, torch.full((2,), float(sum(range(arguments)))))


def test_calls_under_jax_disable_jit_run() -> None:
    import jax

    exe = hloalias.compile(_write_row, (torch.zeros(4, 3), torch.zeros(3)))
    cache = torch.zeros(4, 3)
    exe(cache, torch.ones(3))
    with jax.disable_jit():
        out = exe(cache, torch.full((3,), 5.0))
    assert torch.equal(out, torch.full((3,), 10.0)) and torch.equal(cache[0], torch.full((3,), 5.0))


def test_dispatch_falls_back_to_execute_sharded_after_many_signatures() -> None:
    """Arguments of ever new types for the fast path (weak-typed or not,
    four scalars: 16 kinds) stop it being consulted after MAX_MISSES; the
    results stay right throughout."""
    import itertools

    import jax
    import jax.numpy as jnp
    import numpy as np

    from hloalias.runtime.pjrt import SingleDeviceDispatch

    exe = hloalias.compile(lambda a, b, c, d: a + 2 * b + 3 * c + 4 * d, tuple(torch.zeros(()) for _ in range(4)))
    dispatch = SingleDeviceDispatch(exe._loaded, exe.device)
    for kinds in itertools.product((False, True), repeat=4):
        arrays = [
            jax.device_put(jnp.asarray(1.0) if weak else np.float32(1.0), exe.device) for weak in kinds
        ]
        (result,) = dispatch.run(arrays)
        assert float(result) == 10.0
    assert dispatch._misses == SingleDeviceDispatch.MAX_MISSES + 1
    assert dispatch.run.func is SingleDeviceDispatch._execute_sharded  # type: ignore[attr-defined]  # a partial of a weak proxy: no cycle


class _SlowResult:
    """A result that turns ready only after ``polls`` readiness checks, or
    when waited for: how long a program "takes" is fixed by the test, not
    by the machine's load."""

    def __init__(self, polls: int) -> None:
        self.polls = polls
        self.blocked = 0

    def is_ready(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def block_until_ready(self) -> "_SlowResult":
        self.blocked += 1
        self.polls = -1
        return self


@pytest.mark.parametrize("native", [True, False], ids=["native-wait", "python-wait"])
def test_a_wait_longer_than_the_poll_bound_blocks_from_then_on(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait whose results are not ready within the poll bound ends the
    polling; later waits block at once while they stay longer than the bound,
    and poll again after one that is shorter.  The bound is injected (0: no
    poll is ever in time; an hour: every poll is), so the
    outcome does not depend on the machine's load; the results of a real
    program are right either way."""
    from hloalias.runtime import pjrt
    from hloalias.runtime.ownership import torch_to_device
    from hloalias.runtime.pjrt import SingleDeviceDispatch, wait_ready

    if native and pjrt.NativeWaiter is None:
        pytest.skip("the native call path is not built here")
    monkeypatch.setenv("HLOALIAS_NATIVE", "1" if native else "0")
    a = torch.randn(64, 64)
    exe = hloalias.compile(lambda x: x @ x, (a,))
    dispatch = SingleDeviceDispatch(exe._loaded, exe.device, spin_ns=0)
    assert isinstance(dispatch.wait, pjrt.NativeWaiter) is native if pjrt.NativeWaiter is not None else True
    assert dispatch.polling is True
    slow = _SlowResult(polls=5)
    dispatch.wait([slow])
    assert dispatch.polling is False and slow.blocked == 1  # polled past the bound, then blocked
    slow = _SlowResult(polls=5)
    dispatch.wait([slow])
    assert dispatch.polling is False and slow.polls == -1 and slow.blocked == 1  # blocked at once
    # A real program, waited for without polling: right results.
    arrays = [torch_to_device(a, exe.device, owned=False)]
    results = dispatch.run(arrays)
    dispatch.wait(results)
    torch.testing.assert_close(torch.from_dlpack(results[0]), a @ a, rtol=1e-4, atol=1e-3)
    assert wait_ready(results, spin_ns=0)  # ready already: in time
    # With an hour's bound a wait that polls a while is in time: polling goes on.
    patient = SingleDeviceDispatch(exe._loaded, exe.device, spin_ns=3_600 * 10**9)
    patient.wait([_SlowResult(polls=3)])
    assert patient.polling is True


def test_hloalias_executable_cache_size_is_read_at_import(tmp_path: Any) -> None:
    """The executable cache's bound comes from HLOALIAS_EXECUTABLE_CACHE_SIZE
    (read at import: a fresh process); 0 keeps none."""
    program = (
        "import torch, hloalias\n"
        "from hloalias.runtime import executable\n"
        "x = torch.zeros(4)\n"
        "for k in (1, 2, 3):\n"
        "    hloalias.compile(lambda v, k=k: v + k, (x,))\n"
        "s = hloalias.cache_stats()\n"
        "print(executable.EXECUTABLE_CACHE_SIZE, len(executable._CACHE), s.misses, s.evictions)\n"
    )
    for size, expected in (("1", "1 1 3 2"), ("0", "0 0 3 3")):
        env = {**os.environ, "HLOALIAS_EXECUTABLE_CACHE_SIZE": size, "HLOALIAS_CACHE": "0",
               "PYTHONWARNINGS": "ignore"}
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip().splitlines()[-1] == expected


def test_the_executable_cache_is_bounded_and_keeps_the_most_recently_used(
    fresh_cache: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-process executable cache holds EXECUTABLE_CACHE_SIZE programs
    (issue 24, item 9): the least recently used goes first; an executable
    whose program was evicted still runs."""
    from hloalias.runtime import executable as executable_module

    monkeypatch.setattr(executable_module, "EXECUTABLE_CACHE_SIZE", 2)
    x = torch.zeros(4)
    programs = [lambda v: v + 1, lambda v: v + 2, lambda v: v + 3]
    first = hloalias.compile(programs[0], (x,))
    hloalias.compile(programs[1], (x,))
    hloalias.compile(programs[2], (x,))  # evicts programs[0]
    stats = hloalias.cache_stats()
    assert (stats.misses, stats.hits, stats.evictions) == (3, 0, 1)
    assert len(executable_module._CACHE) == 2
    assert hloalias.compile(programs[1], (x,)).cache_hit  # now the most recent
    assert not hloalias.compile(programs[0], (x,)).cache_hit  # evicts programs[2]
    assert hloalias.compile(programs[1], (x,)).cache_hit
    assert not hloalias.compile(programs[2], (x,)).cache_hit
    assert hloalias.cache_stats().evictions == 3
    assert torch.equal(first(x), torch.ones(4))
