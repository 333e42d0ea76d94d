"""Module state stored in the layout the compiled program reads
(``permute-conv-kernel-state`` and the runtime's state slots).

Every check compares against eager PyTorch: outputs, ``state_dict()`` (in
torch's layout, contiguous), ``load_state_dict``; XLA's temp bytes are
asserted exactly.  Several executables of one module share one device buffer
per tensor whatever layouts they were compiled for."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import hloalias
from hloalias.contract import StoredLayout
from hloalias.pipeline import CPU_PIPELINE, DEFAULT_PIPELINE, with_fixed_layouts

HWIO = StoredLayout((2, 3, 1, 0))
HWIO_FLIPPED = StoredLayout((2, 3, 1, 0), (0, 1))


class ConvNet(torch.nn.Module):
    """Conv -> BatchNorm -> ReLU -> 1x1 conv, as torchvision writes them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 8, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.bn(self.conv1(x))))


def _conv_net() -> ConvNet:
    torch.manual_seed(0)
    model = ConvNet().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    return model


def _pixels(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def _assert_state_dict_is_eager(exe: hloalias.Executable, model: torch.nn.Module) -> None:
    state = exe.state_dict()
    expected = model.state_dict()
    assert set(state) == set(expected)
    for name, value in expected.items():
        assert state[name].shape == value.shape and state[name].is_contiguous(), name
        torch.testing.assert_close(state[name], value, rtol=0, atol=0)


def test_conv_net_weights_stored_hwio_equal_eager_and_drop_the_weight_copies() -> None:
    model = _conv_net()
    x = _pixels(2, 3, 16, 16)
    exe = hloalias.compile(model, (x,))  # default on CPU: the pass runs
    plain = hloalias.compile(copy.deepcopy(model), (x,), pipeline=DEFAULT_PIPELINE)
    assert exe._stored_layouts == {"conv1.weight": HWIO, "conv2.weight": HWIO}
    assert plain._stored_layouts == {}
    with torch.no_grad():
        expected = model(x)
    for _ in range(2):
        torch.testing.assert_close(exe(x), expected, rtol=1e-5, atol=1e-5)
    _assert_state_dict_is_eager(exe, model)
    # XLA:CPU's per-call copies of conv1.weight and conv2.weight into HWIO
    # are gone from the optimized program; temp (a peak) drops by the one
    # live at the peak, conv2.weight's 512 bytes.  The activations' NCHW <->
    # NHWC relayout stays.
    weight_copies = ("f32[3,3,3,16]{3,2,1,0} fusion(", "f32[1,1,16,8]{3,2,1,0} fusion(")
    assert all(copy in _optimized_hlo(plain) for copy in weight_copies)
    assert not any(copy in _optimized_hlo(exe) for copy in weight_copies)
    assert plain.memory_stats["temp_bytes"] == 49_664
    assert exe.memory_stats["temp_bytes"] == 49_664 - 512
    assert exe.memory_stats["argument_bytes"] == plain.memory_stats["argument_bytes"]
    assert "state 'conv1.weight' is read as permute(2, 3, 1, 0)" in exe.explain()
    assert exe.host_copies == {}


def _optimized_hlo(exe: hloalias.Executable) -> str:
    return str(exe._loaded.hlo_modules()[0].to_string())


def test_hf_resnet_eval_equals_eager_with_state_in_kernel_layout() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=4, layer_type="basic")
    torch.manual_seed(3)
    model = transformers.ResNetForImageClassification(config).eval()
    pixels = _pixels(2, 3, 32, 32)
    exe = hloalias.compile(model, (pixels,))
    plain = hloalias.compile(copy.deepcopy(model), (pixels,), pipeline=DEFAULT_PIPELINE)
    conv_weights = {name for name, p in model.named_parameters() if p.dim() == 4}
    assert set(exe._stored_layouts) == conv_weights
    with torch.no_grad():
        expected = model(pixels).logits
    result = exe(pixels)
    logits = result[0] if isinstance(result, (tuple, list)) else result["logits"]
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    _assert_state_dict_is_eager(exe, model)
    # Conv weights are 23,648 bytes: XLA:CPU's per-call copies of them go
    # (23,680 bytes of temp: the copies and their alignment).
    assert sum(p.numel() * 4 for n, p in model.named_parameters() if n in conv_weights) == 23_648
    assert (plain.memory_stats["temp_bytes"], exe.memory_stats["temp_bytes"]) == (64_928, 41_248)


def test_load_state_dict_writes_the_stored_layout() -> None:
    model = _conv_net()
    x = _pixels(2, 3, 16, 16)
    exe = hloalias.compile(model, (x,))
    other = _conv_net()
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.mul_(-0.5)
    new_state = other.state_dict()
    exe.load_state_dict(new_state)  # written in place into the HWIO buffers
    with torch.no_grad():
        expected = other(x)
    torch.testing.assert_close(exe(x), expected, rtol=1e-5, atol=1e-5)
    _assert_state_dict_is_eager(exe, other)
    # A DeviceTensor entry (torch's layout) is uploaded in the stored layout.
    weight = torch.randn(16, 3, 3, 3)
    exe.load_state_dict({"conv1.weight": hloalias.to_device(weight)})
    torch.testing.assert_close(exe.state_dict()["conv1.weight"], weight, rtol=0, atol=0)
    other.conv1.weight.data.copy_(weight)
    with torch.no_grad():
        expected = other(x)
    torch.testing.assert_close(exe(x), expected, rtol=1e-5, atol=1e-5)
    # A wrong shape is refused before anything is written (torch's shape is expected).
    with pytest.raises(hloalias.ExecutionError, match=r"conv2.weight.*\[3, 3, 16, 8\]|\[8, 16, 1, 1\]"):
        exe.load_state_dict({"conv2.weight": torch.zeros(1, 1, 16, 8)})
    _assert_state_dict_is_eager(exe, other)


def test_state_dict_round_trip_and_torch_side_update() -> None:
    """``load_state_dict(state_dict())`` changes nothing; a weight torch
    changed since is re-read (in the stored layout) by the next compile."""
    model = _conv_net()
    x = _pixels(2, 3, 16, 16)
    exe = hloalias.compile(model, (x,))
    before = exe.state_dict()
    exe.load_state_dict(before)
    after = exe.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    with torch.no_grad():
        model.conv1.weight.mul_(-1.0)
        expected = model(x)
    again = hloalias.compile(model, (x,))
    assert again._slots["conv1.weight"] is exe._slots["conv1.weight"]
    assert again._slots["conv1.weight"].layout == HWIO
    torch.testing.assert_close(again(x), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(exe(x), expected, rtol=1e-5, atol=1e-5)  # one buffer, both see it
    _assert_state_dict_is_eager(exe, model)


class Stem(torch.nn.Module):
    """ResNet's stem: 7x7/2 convolution, BatchNorm, ReLU, 3x3/2 max-pool."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 7, stride=2, padding=3, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 3, 2, 1)


def test_pool_of_a_convolution_runs_in_its_order() -> None:
    """reduce-window-in-conv-layout: the max-pool reads the convolution's
    NHWC output without XLA:CPU's relayout copy of it; results equal eager.
    What temp keeps is the convolution output (2x16x32x32 f32, 131,072
    bytes) and XLA:CPU's NHWC copy of the caller's NCHW pixels (98,304)."""
    torch.manual_seed(7)
    model = Stem().eval()
    x = _pixels(2, 3, 64, 64)
    exe = hloalias.compile(model, (x,))
    plain = hloalias.compile(copy.deepcopy(model), (x,), pipeline=DEFAULT_PIPELINE)
    stored_only = hloalias.compile(copy.deepcopy(model), (x,), pipeline=DEFAULT_PIPELINE.replace(
        "alias-donated-buffers)", "alias-donated-buffers, permute-conv-kernel-state)"))
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(exe(x), expected, rtol=1e-5, atol=1e-5)
    assert "reduce_window" in exe.mlir and "stablehlo.transpose" in exe.mlir
    temps = [e.memory_stats["temp_bytes"] for e in (plain, stored_only, exe)]
    assert temps == [262_208, 262_144, 131_072 + 98_304]


class SmallMap(torch.nn.Module):
    """A 3x3 convolution on a 2x2 map: XLA swaps its operands."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(32, 32, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_swapped_convolution_kernel_stored_flipped() -> None:
    torch.manual_seed(4)
    model = SmallMap().eval()
    x = _pixels(2, 32, 2, 2)
    exe = hloalias.compile(model, (x,))
    plain = hloalias.compile(copy.deepcopy(model), (x,), pipeline=DEFAULT_PIPELINE)
    assert exe._stored_layouts == {"conv.weight": HWIO_FLIPPED}
    with torch.no_grad():
        torch.testing.assert_close(exe(x), model(x), rtol=1e-5, atol=1e-5)
    _assert_state_dict_is_eager(exe, model)
    weight_bytes = 32 * 32 * 9 * 4
    assert plain.memory_stats["temp_bytes"] - exe.memory_stats["temp_bytes"] == weight_bytes
    # In-place load into a flipped buffer.
    new_weight = torch.randn(32, 32, 3, 3)
    exe.load_state_dict({"conv.weight": new_weight})
    model.conv.weight.data.copy_(new_weight)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), model(x), rtol=1e-5, atol=1e-5)
    _assert_state_dict_is_eager(exe, model)


class Modes(torch.nn.Module):
    """One module, several programs (``mode`` is a static input): a conv
    only, the weight also read densely, the weight returned (a view), the
    weight updated in place."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 4, 3, 3))

    def forward(self, x: torch.Tensor, mode: str) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.conv2d(x, self.weight, padding=1)
        if mode == "dense":
            return y + self.weight.sum()
        if mode == "view":
            return y, self.weight[0]
        return y


def _modes() -> Modes:
    torch.manual_seed(5)
    return Modes().eval()


def test_two_executables_one_module_share_the_stored_buffer() -> None:
    model = _modes()
    x = _pixels(2, 4, 8, 8)
    conv = hloalias.compile(model, (x, "conv"))
    dense = hloalias.compile(model, (x, "dense"))
    # The second program reads the buffer as the first stored it, its dense
    # use through a transpose back: one buffer, no copies.
    assert conv._stored_layouts == dense._stored_layouts == {"weight": HWIO}
    assert conv._slots["weight"] is dense._slots["weight"]
    with torch.no_grad():
        torch.testing.assert_close(dense(x, "dense"), model(x, "dense"), rtol=1e-5, atol=1e-5)
        new_weight = torch.randn(8, 4, 3, 3)
        dense.load_state_dict({"weight": new_weight})
        model.weight.copy_(new_weight)
        torch.testing.assert_close(conv(x, "conv"), model(x, "conv"), rtol=1e-5, atol=1e-5)
    assert conv.host_copies == dense.host_copies == {}


def test_later_executable_in_torch_layout_copies_per_call() -> None:
    """A later program compiled without the pass reads torch's layout: the
    slot keeps its layout and that program copies it per call, counted."""
    model = _modes()
    x = _pixels(2, 4, 8, 8)
    stored = hloalias.compile(model, (x, "conv"))
    plain = hloalias.compile(model, (x, "dense"), pipeline=DEFAULT_PIPELINE)
    assert plain._stored_layouts == {} and stored._slots["weight"].layout == HWIO
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(plain(x, "dense"), model(x, "dense"), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(stored(x, "conv"), model(x, "conv"), rtol=1e-5, atol=1e-5)
    assert plain.host_copies == {"weight": 2} and stored.host_copies == {}
    assert ("stored as permute(2, 3, 1, 0) (fixed by another executable of the module), this program reads "
            "torch's layout, so each call copies it into this program's layout") in plain.explain()


def test_view_of_state_moves_the_buffer_back_to_torch_layout() -> None:
    """A later program that returns a view of the weight needs torch's
    layout: the shared buffer is stored so from then on, the view is live,
    and the earlier program (compiled for HWIO) copies per call."""
    model = _modes()
    x = _pixels(2, 4, 8, 8)
    stored = hloalias.compile(model, (x, "conv"))
    assert stored._slots["weight"].layout == HWIO
    viewing = hloalias.compile(model, (x, "view"))
    assert viewing._stored_layouts == {} and viewing._slots["weight"] is stored._slots["weight"]
    assert stored._slots["weight"].layout is None
    with torch.no_grad():
        y, row = viewing(x, "view")
        expected_y, expected_row = model(x, "view")
        torch.testing.assert_close(y, expected_y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(row, expected_row, rtol=0, atol=0)
        new_weight = torch.randn(8, 4, 3, 3)
        viewing.load_state_dict({"weight": new_weight})
        model.weight.copy_(new_weight)
        torch.testing.assert_close(row, new_weight[0], rtol=0, atol=0)  # a live view of the state
        torch.testing.assert_close(stored(x, "conv"), model(x, "conv"), rtol=1e-5, atol=1e-5)
    assert stored.host_copies == {"weight": 1}
    assert ("stored as torch's layout (fixed by another executable of the module), this program reads "
            "permute(2, 3, 1, 0), so each call copies it") in stored.explain()
    _assert_state_dict_is_eager(stored, model)


class UpdatedKernel(torch.nn.Module):
    """A kernel the program updates in place (a buffer): never permuted."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("kernel", torch.randn(4, 4, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.conv2d(x, self.kernel, padding=1)
        self.kernel.mul_(0.5)
        return y


def test_mutated_kernel_stays_in_torch_layout() -> None:
    torch.manual_seed(6)
    model = UpdatedKernel()
    eager = copy.deepcopy(model)
    x = _pixels(1, 4, 6, 6)
    exe = hloalias.compile(model, (x,))
    assert exe._stored_layouts == {}
    assert [a["argument"] for a in exe.aliases] == ["kernel"]
    for _ in range(3):
        torch.testing.assert_close(exe(x), eager(x), rtol=1e-5, atol=1e-5)
    _assert_state_dict_is_eager(exe, eager)


def test_torch_layout_slot_is_kept_by_a_later_default_compile() -> None:
    """The first program stored the weight in torch's layout; a later
    default compile reads it so (fixed layout), without copies."""
    model = _modes()
    x = _pixels(2, 4, 8, 8)
    plain = hloalias.compile(model, (x, "conv"), pipeline=DEFAULT_PIPELINE)
    later = hloalias.compile(model, (x, "dense"), pipeline=CPU_PIPELINE)
    assert later._stored_layouts == {} and plain._slots["weight"] is later._slots["weight"]
    with torch.no_grad():
        torch.testing.assert_close(later(x, "dense"), model(x, "dense"), rtol=1e-5, atol=1e-5)
    assert later.host_copies == plain.host_copies == {}


# -- differential: generated programs over one conv kernel, several executables --------

KERNEL_USES = ("conv", "conv_small", "conv_pool", "dense", "view", "mutate")


class KernelUses(torch.nn.Module):
    """A buffer ``k`` (4x2x3x3) read by the uses each mode lists, in order:
    ``conv`` (3x3 convolution on a 4x4 map: HWIO), ``conv_small`` (on a 2x2
    map: XLA swaps it, HWIO flipped), ``conv_pool`` (conv, ReLU, 3x3/2
    max-pool: the pool runs in the convolution's order), ``dense`` (added to the output),
    ``view`` (``k[1]`` returned), ``mutate`` (``k.mul_(0.5)``).  Values are
    multiples of 1/4: sums of products are exact, so comparisons are bitwise."""

    def __init__(self, modes: tuple[tuple[str, ...], ...]) -> None:
        super().__init__()
        self.modes = modes
        values = torch.arange(4 * 2 * 3 * 3, dtype=torch.float32).reshape(4, 2, 3, 3) % 7 - 3
        self.register_buffer("k", values * 0.25)

    def forward(self, x: torch.Tensor, small: torch.Tensor, mode: int) -> tuple[torch.Tensor, ...]:
        results = []
        for use in self.modes[mode]:
            if use == "conv":
                results.append(torch.nn.functional.conv2d(x, self.k, padding=1))
            elif use == "conv_pool":
                results.append(torch.nn.functional.max_pool2d(
                    torch.relu(torch.nn.functional.conv2d(x, self.k, padding=1)), 3, 2, 1))
            elif use == "conv_small":
                results.append(torch.nn.functional.conv2d(small, self.k, padding=1))
            elif use == "dense":
                results.append(torch.nn.functional.conv2d(x, self.k, padding=1) + self.k.sum())
            elif use == "view":
                results.append(self.k[1])
            else:
                self.k.mul_(0.5)
        return tuple(results)


def _kernel_programs() -> st.SearchStrategy[tuple[tuple[tuple[str, ...], ...], tuple[int, ...]]]:
    """Modes (one or two executables' use lists) and the order of calls."""
    uses = st.lists(st.sampled_from(KERNEL_USES), min_size=1, max_size=3).map(tuple)
    modes = st.lists(uses, min_size=1, max_size=2).map(tuple)
    return modes.flatmap(lambda m: st.tuples(
        st.just(m), st.lists(st.integers(0, len(m) - 1), min_size=2, max_size=4).map(tuple)))


def _kernel_inputs(call: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(call)
    x = torch.randint(-4, 5, (1, 2, 4, 4), generator=generator).float() * 0.25
    small = torch.randint(-4, 5, (1, 2, 2, 2), generator=generator).float() * 0.25
    return x, small


def kernel_program_problems(modes: tuple[tuple[str, ...], ...], calls: tuple[int, ...]) -> list[str]:
    """What differs from eager: every result (held across calls: views of
    state are live) and the state after each call."""
    eager = KernelUses(modes)
    compiled_from = KernelUses(modes)
    x, small = _kernel_inputs(0)
    executables = [hloalias.compile(compiled_from, (x, small, mode)) for mode in range(len(modes))]
    problems = []
    held: list[tuple[torch.Tensor, torch.Tensor]] = []
    for call, mode in enumerate(calls, start=1):
        x, small = _kernel_inputs(call)
        ours = executables[mode](x, small, mode)
        expected = eager(x, small, mode)
        held += list(zip(ours, expected))
        if not torch.equal(executables[mode].state_dict()["k"], eager.k):
            problems.append(f"call {call} (mode {mode}): state differs")
    for position, (ours_value, eager_value) in enumerate(held):
        if not torch.equal(ours_value, eager_value):
            problems.append(f"held result {position} differs after the last call")
    return problems


@settings(max_examples=10, derandomize=True, deadline=None, database=None,
          suppress_health_check=(HealthCheck.too_slow,))
@given(_kernel_programs())
def test_generated_kernel_programs_match_eager(program: tuple[tuple[tuple[str, ...], ...], tuple[int, ...]]) -> None:
    """Generated modes over one kernel (stored HWIO, flipped, forced by an
    earlier executable, moved back to torch's layout by a view or a write)
    agree with eager bit for bit across calls."""
    modes, calls = program
    note(f"modes {modes}, calls {calls}")
    problems = kernel_program_problems(modes, calls)
    assert not problems, "\n".join(problems) + f"\nmodes {modes}, calls {calls}"


@pytest.mark.parametrize("modes, calls, layouts, slot_layout", [
    # one kernel, two layouts wanted: kept in torch's layout
    ((("conv", "conv_small"),), (0, 0), [None], None),
    # HWIO, then moved back to torch's layout by a view (the first copies per call)
    ((("conv",), ("view", "conv")), (0, 1, 0), [HWIO, None], None),
    # flipped, then moved back by a write
    ((("conv_small",), ("mutate", "dense")), (0, 1, 0, 1), [HWIO_FLIPPED, None], None),
    # HWIO fixed by the first, forced on the dense reader
    ((("conv",), ("dense",)), (1, 0, 1), [HWIO, HWIO], HWIO),
])
def test_fixed_kernel_programs(
    modes: tuple[tuple[str, ...], ...], calls: tuple[int, ...], layouts: list[StoredLayout | None],
    slot_layout: StoredLayout | None,
) -> None:
    model = KernelUses(modes)
    x, small = _kernel_inputs(0)
    executables = [hloalias.compile(model, (x, small, mode)) for mode in range(len(modes))]
    assert [exe._stored_layouts.get("k") for exe in executables] == layouts
    assert executables[0]._slots["k"].layout == slot_layout
    problems = kernel_program_problems(modes, calls)
    assert not problems, "\n".join(problems)


def test_fixed_layouts_go_to_the_pass_without_options() -> None:
    """The runtime's ``layouts`` reach each ``permute-conv-kernel-state``
    that has no options; a pipeline without the pass, or with options of
    its own, is left as written."""
    assert with_fixed_layouts(CPU_PIPELINE, ()) == CPU_PIPELINE
    fixed = with_fixed_layouts(CPU_PIPELINE, ("a.weight:torch", "b.weight:2.3.1.0/0.1"))
    assert "permute-conv-kernel-state{layouts=a.weight:torch,b.weight:2.3.1.0/0.1}," in fixed
    assert fixed.startswith(CPU_PIPELINE[: CPU_PIPELINE.index("permute-conv-kernel-state")])
    assert with_fixed_layouts(DEFAULT_PIPELINE, ("a.weight:torch",)) == DEFAULT_PIPELINE
    own = "builtin.module(permute-conv-kernel-state{layouts=a.weight:torch})"
    assert with_fixed_layouts(own, ("a.weight:2.3.1.0",)) == own


class NormedConv(torch.nn.Module):
    """A CNN forward: its kernel is read in the stored layout, and in train
    mode it writes its batch-norm statistics (a state commit per call)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor, mode: str = "conv") -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.conv(x)))
        if mode == "view":
            return y, self.conv.weight[0]
        return y


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_a_cnn_forward_reading_its_kernel_stored_runs_on_the_native_path(
    training: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane refused every program reading state in a stored layout
    ("module state is read in another layout or dtype than its buffer's"),
    though the slot holds that layout: a CNN forward took the Python path.
    It runs natively now; when a later program moves the kernel back to
    torch's layout, each call copies it into this program's (counted, as on
    the Python path) and stays equal to eager."""
    from test_runtime_transaction import compile_on

    model = NormedConv().train(training)
    eager = copy.deepcopy(model)
    x = _pixels(2, 4, 8, 8)
    exe = compile_on("native", monkeypatch, model, (x,), lane=True)
    assert exe._stored_layouts == {"conv.weight": HWIO} and exe._slots["conv.weight"].layout == HWIO
    with torch.no_grad():
        for i in range(3):
            torch.testing.assert_close(exe(x + i), eager(x + i), rtol=1e-5, atol=1e-5)
        assert exe._lane.counts["calls"] == 3 and exe.host_copies == {}
        viewing = hloalias.compile(model, (x, "view"))
        assert exe._slots["conv.weight"].layout is None
        viewing(x, "view")
        eager(x, "view")
        for i in range(3):
            torch.testing.assert_close(exe(x - i), eager(x - i), rtol=1e-5, atol=1e-5)
    assert exe.host_copies == {"conv.weight": 3}
    assert exe._lane.counts["calls"] == 6
    state, expected = exe.state_dict(), eager.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-5, msg=name)
