"""Training steps compiled as one executable (issue 13): the PyTorch way of
writing a step (``loss.backward(); opt.step(); opt.zero_grad()``) against
eager PyTorch, state in place on the device, donation, checkpoint/resume,
lr as data and capture errors.

Tolerances: float32 over 5 steps; XLA and eager differ by rounding only
(the optimizer is traced with ``capturable=True``, which computes Adam's
bias corrections in float32 tensors instead of Python floats), so
parameters and state match to ``rtol=1e-5, atol=1e-6`` and losses to
``1e-5`` relative."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.frontend.training import TrainingCaptureError

STEPS = 5
RTOL, ATOL = 1e-5, 1e-6


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _batches(count: int = STEPS, batch: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 8, generator=generator), torch.randn(batch, 4, generator=generator)) for _ in range(count)]


def _step_fn(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def _assert_state_equal(eager: dict[str, Any], compiled: dict[str, Any]) -> None:
    assert eager.keys() == compiled.keys()
    for key in eager:
        if isinstance(eager[key], dict):
            _assert_state_equal(eager[key], compiled[key])
        elif isinstance(eager[key], torch.Tensor):
            assert compiled[key].dtype == eager[key].dtype, key
            torch.testing.assert_close(compiled[key], eager[key], rtol=RTOL, atol=ATOL, msg=key)
        else:
            assert compiled[key] == eager[key], key


OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mlp_five_steps_equal_eager(name: str) -> None:
    eager_model, model = _mlp(), _mlp()
    eager_opt, opt = OPTIMIZERS[name](eager_model.parameters()), OPTIMIZERS[name](model.parameters())
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    before = copy.deepcopy(model.state_dict())
    eager_losses = [_step_fn(eager_model, eager_opt)(x, y) for x, y in batches]
    losses = [train(x, y) for x, y in batches]
    # The state is on the device; a bare read of the model's own tensors
    # copies the trained values in first (test_training_fresh_reads.py) ...
    assert before.keys() == dict(model.named_parameters()).keys()
    _assert_state_equal(
        {name: value.detach() for name, value in eager_model.named_parameters()},
        {name: value.detach() for name, value in model.named_parameters()},
    )
    # ... and so does a checkpoint (model.state_dict()).
    _assert_state_equal(eager_model.state_dict(), model.state_dict())
    for eager_loss, loss in zip(eager_losses, losses):
        assert loss.shape == () and loss.dtype == torch.float32
        torch.testing.assert_close(loss, eager_loss.detach(), rtol=RTOL, atol=ATOL)
    train.write_back()
    _assert_state_equal(eager_model.state_dict(), model.state_dict())
    _assert_state_equal(eager_opt.state_dict(), opt.state_dict())
    _assert_state_equal(eager_opt.state_dict(), train.state_dict()["optimizer"])

    # Every parameter and every optimizer state tensor is an inferred donor.
    origins = {a["argument"]: a["origin"] for a in train.aliases}
    expected = {f"param.{n}" for n, _ in model.named_parameters()}
    expected |= {f"optim.{i}.{k}" for i, s in eager_opt.state_dict()["state"].items() for k in s}
    assert origins == {n: "inferred" for n in expected}
    # The loss is the one result that is not state, and it is a new tensor.
    view_report = train.executable.view_report
    assert view_report is not None
    assert [key for key in view_report.kept if not key.startswith("mutation:")] == ["output:0"]
    assert len(view_report.kept) == len(expected) + 1
    state_bytes = sum(p.numel() * 4 for p in model.parameters()) * (1 + {"sgd_momentum": 1}.get(name, 2))
    state_bytes += 0 if name == "sgd_momentum" else 4 * len(list(model.parameters()))
    assert train.memory_stats["alias_bytes"] == state_bytes


def test_explicitly_donated_batch_is_reported_and_consumed() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    (x, y), = _batches(1)
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, (x, y), donate=[0, 1])
    report = train.executable.alias_report
    assert report is not None
    print(report.to_text())
    # The batch has no result of its shape to alias: it stays a donor (XLA
    # may reuse it for temporaries) and the report says so.
    batch_donors = {u.arg_name: (u.origin, u.kept_as_donor) for u in report.unused}
    assert batch_donors == {"x": ("explicit", True), "y": ("explicit", True)}
    dx, dy = train.to_device(x), train.to_device(y)
    train(dx, dy)
    with pytest.raises(hloalias.DonatedBufferError):
        dx.to_torch()
    with pytest.raises(hloalias.DonationError, match="batch has 2 tensors"):
        hloalias.compile_training_step(_step_fn(model, opt), model, opt, (x, y), donate=[2])


def test_lr_schedule_is_data_not_a_recompile() -> None:
    eager_model, model = _mlp(), _mlp()
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.2, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    eager_sched = torch.optim.lr_scheduler.StepLR(eager_opt, step_size=1, gamma=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    batches = _batches()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    executable = train.executable
    for x, y in batches:
        _step_fn(eager_model, eager_opt)(x, y)
        eager_sched.step()
        train(x, y)
        sched.step()
    assert train.executable is executable
    train.write_back()
    _assert_state_equal(eager_model.state_dict(), model.state_dict())
    # Other hyperparameters are part of the program.
    opt.param_groups[0]["momentum"] = 0.5
    with pytest.raises(hloalias.ExecutionError, match="momentum changed since compile"):
        train(*batches[0])


def test_resume_from_checkpoint_equals_uninterrupted(tmp_path: Any) -> None:
    batches = _batches(6)
    straight_model = _mlp()
    straight_opt = torch.optim.Adam(straight_model.parameters(), lr=1e-2)
    straight = hloalias.compile_training_step(
        _step_fn(straight_model, straight_opt), straight_model, straight_opt, batches[0]
    )
    straight_losses = [straight(x, y) for x, y in batches]

    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    for x, y in batches[:3]:
        first(x, y)
    torch.save(first.state_dict(), tmp_path / "checkpoint.pt")

    # A fresh process would build these anew; load the checkpoint eagerly, then compile.
    resumed_model = _mlp()
    resumed_opt = torch.optim.Adam(resumed_model.parameters(), lr=1e-2)
    checkpoint = torch.load(tmp_path / "checkpoint.pt")
    resumed_model.load_state_dict(checkpoint["model"])
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    resumed = hloalias.compile_training_step(
        _step_fn(resumed_model, resumed_opt), resumed_model, resumed_opt, batches[0]
    )
    resumed_losses = [resumed(x, y) for x, y in batches[3:]]
    for a, b in zip(straight_losses[3:], resumed_losses):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    _assert_state_equal(straight.state_dict(), resumed.state_dict())

    # Loading into a running step works too.  (A fresh load: torch's
    # optimizer.load_state_dict keeps the checkpoint's tensors as
    # resumed_opt's own state, which its steps updated in place since, as
    # eager steps would.)
    first.load_state_dict(torch.load(tmp_path / "checkpoint.pt"))
    again = [first(x, y) for x, y in batches[3:]]
    for a, b in zip(straight_losses[3:], again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _eager_trained(steps: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = _step_fn(model, opt)
    for x, y in steps:
        step(x, y)
    return model, opt


def test_loading_a_checkpoint_after_compiling_the_step_resumes_from_it() -> None:
    """Compile, then ``model.load_state_dict``/``optimizer.load_state_dict``
    (a script that resumes after building its step): the step continues
    from the loaded moments and step counts, as eager does."""
    batches = _batches(5)
    eager_model, eager_opt = _eager_trained(batches[:3])
    checkpoint = {"model": copy.deepcopy(eager_model.state_dict()), "optimizer": copy.deepcopy(eager_opt.state_dict())}

    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    step(*batches[0])  # the device state is ahead of the optimizer's own
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["optimizer"])
    eager_step = _step_fn(eager_model, eager_opt)
    for x, y in batches[3:]:
        torch.testing.assert_close(step(x, y), eager_step(x, y), rtol=RTOL, atol=ATOL)
    _assert_state_equal({"model": eager_model.state_dict(), "optimizer": eager_opt.state_dict()},
                        {"model": model.state_dict(), "optimizer": opt.state_dict()})


def test_a_loaded_optimizer_state_the_step_cannot_take_stops_its_calls() -> None:
    batches = _batches(3)
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    step(*batches[0])
    broken = copy.deepcopy(opt.state_dict())
    for entries in broken["state"].values():
        del entries["exp_avg_sq"]
    with pytest.raises(hloalias.ExecutionError, match="exp_avg_sq"):
        opt.load_state_dict(broken)
    with pytest.raises(hloalias.ExecutionError, match="exp_avg_sq"):
        step(*batches[1])  # never from the state before the load
    _, eager_opt = _eager_trained(batches[:1])
    opt.load_state_dict(eager_opt.state_dict())
    assert torch.isfinite(step(*batches[1]))


class _BatchNormNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


def test_batchnorm_train_mode_updates_buffers_and_params() -> None:
    torch.manual_seed(0)
    eager_model = _BatchNormNet().train()
    model = copy.deepcopy(eager_model)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 3, 5, 5, generator=generator), torch.randint(0, 3, (4,), generator=generator)) for _ in range(STEPS)]

    def step_of(m: torch.nn.Module, o: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            o.step()
            o.zero_grad()
            return loss

        return step

    train = hloalias.compile_training_step(step_of(model, opt), model, opt, batches[0])
    for x, y in batches:
        eager_loss = step_of(eager_model, eager_opt)(x, y)
        torch.testing.assert_close(train(x, y), eager_loss.detach(), rtol=RTOL, atol=ATOL)
    train.write_back()
    _assert_state_equal(eager_model.state_dict(), model.state_dict())
    tracked = model.bn.num_batches_tracked
    assert isinstance(tracked, torch.Tensor) and int(tracked) == STEPS
    names = {a["argument"] for a in train.aliases}
    assert {"buffer.bn.running_mean", "buffer.bn.running_var", "buffer.bn.num_batches_tracked"} <= names


def _causal_lm_trains_like_eager(eager_model: Any, **call: Any) -> Any:
    """Three AdamW steps of ``eager_model`` (a transformers causal LM, train
    mode) compiled against the same steps in eager: equal losses, and equal
    parameters after ``write_back``.  Returns the compiled copy's model."""
    model = copy.deepcopy(eager_model)
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 64, (2, 16), generator=generator) for _ in range(3)]

    def step_of(m: Any, o: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
        def step(ids: torch.Tensor) -> torch.Tensor:
            loss = m(input_ids=ids, labels=ids, **call).loss
            loss.backward()
            o.step()
            o.zero_grad()
            return loss  # type: ignore[no-any-return]

        return step

    train = hloalias.compile_training_step(step_of(model, opt), model, opt, (batches[0],))
    for ids in batches:
        eager_loss = step_of(eager_model, eager_opt)(ids)
        torch.testing.assert_close(train(ids), eager_loss.detach(), rtol=1e-5, atol=1e-5)
    train.write_back()
    eager_state, state = eager_model.state_dict(), model.state_dict()
    for key in eager_state:
        torch.testing.assert_close(state[key], eager_state[key], rtol=1e-4, atol=1e-5, msg=key)
    return model


def test_tiny_gpt2_training_step_equals_eager() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    model = _causal_lm_trains_like_eager(transformers.GPT2LMHeadModel(config).train())
    # Tied weights (wte and lm_head) are one slot, updated once.
    assert model.lm_head.weight is model.transformer.wte.weight


@pytest.mark.parametrize("activation", [torch.nn.SiLU, torch.nn.Mish])
def test_activation_whose_backward_is_composite_trains_like_eager(activation: type[torch.nn.Module]) -> None:
    """``silu_backward``/``mish_backward`` have a CompositeImplicitAutograd and
    a CPU kernel: neither ``make_fx`` nor ``run_decompositions`` decomposed
    them, and torch-mlir cannot lower them (every Llama-family training step)."""

    def model_of() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), activation(), torch.nn.Linear(16, 4))

    eager_model, model = model_of(), model_of()
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = _batches(3)
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    for x, y in batches:
        eager_loss = _step_fn(eager_model, eager_opt)(x, y)
        torch.testing.assert_close(train(x, y), eager_loss.detach(), rtol=RTOL, atol=ATOL)
    train.write_back()
    _assert_state_equal(eager_model.state_dict(), model.state_dict())


GROUPED_CONVOLUTIONS = {
    # name: (batch, channels, out channels, groups, kernel, stride, padding, dilation, size, spatial dims)
    "groups2": (2, 4, 6, 2, 3, 1, 1, 1, 9, 2),
    "depthwise_7x7": (2, 16, 16, 16, 7, 1, 3, 1, 8, 2),
    "stride2_no_padding": (3, 6, 6, 3, 3, 2, 0, 1, 10, 2),
    "stride2_dilation2": (2, 8, 4, 4, 3, 2, 2, 2, 11, 2),
    "conv1d_stride3": (2, 6, 9, 3, 2, 3, 1, 1, 7, 1),
    "conv3d_dilation2": (1, 4, 8, 4, 3, 1, 1, 2, 6, 3),
}


@pytest.mark.parametrize("name", sorted(GROUPED_CONVOLUTIONS))
def test_grouped_convolution_backward_equals_torch(name: str) -> None:
    from hloalias.frontend.backward_decompositions import grouped_convolution_backward

    batch, channels, out, groups, kernel, stride, padding, dilation, size, dims = GROUPED_CONVOLUTIONS[name]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, channels, *[size] * dims, generator=generator)
    w = torch.randn(out, channels // groups, *[kernel] * dims, generator=generator)
    geometry = ([stride] * dims, [padding] * dims, [dilation] * dims, False, [0] * dims, groups)
    y = torch.ops.aten.convolution(x, w, None, *geometry)
    grad = torch.randn(y.shape, generator=generator)
    expected = torch.ops.aten.convolution_backward(grad, x, w, [out], *geometry, [True, True, True])
    got = grouped_convolution_backward(grad, x, w, [out], *geometry, [True, True, True])
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)
    only_weight = grouped_convolution_backward(grad, x, w, [out], *geometry, [False, True, False])
    assert only_weight[0] is None and only_weight[2] is None
    if dims == 2 and dilation == 1:  # torch-mlir's lowering of the undilated groups == 1 case is kept for 2-d
        assert grouped_convolution_backward(grad, x, w, [out], *geometry[:5], 1, [True] * 3) is NotImplemented


@pytest.mark.parametrize("stride", [1, 2])
def test_dilated_2d_convolution_backward_equals_torch(stride: int) -> None:
    """torch-mlir cannot lower a dilated 2-d ``convolution_backward``
    (DeepLab's atrous convolutions): it is decomposed for ``groups == 1``
    too."""
    from hloalias.frontend.backward_decompositions import grouped_convolution_backward

    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 10, 8, generator=generator)
    w = torch.randn(4, 3, 3, 3, generator=generator)
    geometry = ([stride] * 2, [2, 2], [2, 2], False, [0, 0], 1)
    grad = torch.randn(torch.ops.aten.convolution(x, w, None, *geometry).shape, generator=generator)
    expected = torch.ops.aten.convolution_backward(grad, x, w, [4], *geometry, [True, True, True])
    got = grouped_convolution_backward(grad, x, w, [4], *geometry, [True, True, True])
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dims", [1, 3])
@pytest.mark.parametrize("stride", [1, 2])
def test_ungrouped_1d_and_3d_convolution_backward_equals_torch(dims: int, stride: int) -> None:
    from hloalias.frontend.backward_decompositions import grouped_convolution_backward

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, *[9] * dims, generator=generator)
    w = torch.randn(5, 3, *[3] * dims, generator=generator)
    geometry = ([stride] * dims, [1] * dims, [1] * dims, False, [0] * dims, 1)
    grad = torch.randn(torch.ops.aten.convolution(x, w, None, *geometry).shape, generator=generator)
    expected = torch.ops.aten.convolution_backward(grad, x, w, [5], *geometry, [True, True, True])
    got = grouped_convolution_backward(grad, x, w, [5], *geometry, [True, True, True])
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)


def test_conv1d_stack_trains_like_eager() -> None:
    """Whisper's encoder stem (two Conv1d, the second with stride 2): the
    capture failed in torch-mlir's 1-d ``convolution_backward``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv1d(8, 16, 3, padding=1), torch.nn.GELU(), torch.nn.Conv1d(16, 16, 3, stride=2, padding=1)
    )
    eager_model = copy.deepcopy(model)
    x = torch.randn(2, 8, 32)

    def step_of(module: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[[torch.Tensor], torch.Tensor]:
        def step(batch: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = module(batch).pow(2).mean()
            loss.backward()
            opt.step()
            return loss
        return step

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    eager_step = step_of(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9))
    compiled = hloalias.compile_training_step(step_of(model, opt), model, opt, (x,))
    for _ in range(3):
        torch.testing.assert_close(compiled(x), eager_step(x), rtol=1e-5, atol=1e-6)
    compiled.write_back()
    for got, want in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dim", [0, 2])
def test_weight_normed_conv1d_trains_like_eager(dim: int) -> None:
    """Wav2Vec2's and HuBERT's positional convolution is weight-normed
    over its last dimension (``dim=2``): torch-mlir cannot lower
    ``_weight_norm_interface_backward``, and the capture decomposed nothing
    for it."""

    def model_of() -> torch.nn.Module:
        torch.manual_seed(0)
        conv = torch.nn.Conv1d(8, 8, 5, padding=2, groups=2)
        return torch.nn.Sequential(torch.nn.utils.parametrizations.weight_norm(conv, name="weight", dim=dim), torch.nn.GELU())

    eager_model, model = model_of(), model_of()
    eager_opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(3)
    batches = [(torch.randn(2, 8, 12, generator=generator), torch.randn(2, 8, 12, generator=generator)) for _ in range(3)]
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    for x, y in batches:
        eager_loss = _step_fn(eager_model, eager_opt)(x, y)
        torch.testing.assert_close(train(x, y), eager_loss.detach(), rtol=RTOL, atol=ATOL)
    train.write_back()
    eager_state, state = eager_model.state_dict(), model.state_dict()
    assert any("original1" in key for key in state)  # the parametrization's g and v are what trains
    for key in eager_state:
        torch.testing.assert_close(state[key], eager_state[key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adamw"])
def test_cnn_with_depthwise_conv_and_max_pool_trains_like_eager(optimizer: str) -> None:
    """torch-mlir lowers neither ``max_pool2d_with_indices_backward`` nor a
    grouped ``convolution_backward`` (its weight gradient is an invalid
    convolution): the capture decomposes both.  AdamW's ``lerp_`` on the
    ``[8, 1, 5, 5]`` depthwise weight decomposes to ``prims.copy_strided``,
    which the import turns into a clone."""

    def model_of() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, stride=2, padding=1),
            torch.nn.Conv2d(8, 8, 5, stride=2, padding=2, groups=8),  # depthwise
            torch.nn.Conv2d(8, 4, 1, groups=2), torch.nn.Flatten(), torch.nn.Linear(4 * 3 * 3, 2),
        )

    eager_model, model = model_of(), model_of()
    eager_opt = OPTIMIZERS[optimizer](eager_model.parameters())
    opt = OPTIMIZERS[optimizer](model.parameters())
    generator = torch.Generator().manual_seed(2)
    batches = [(torch.randn(2, 3, 12, 12, generator=generator), torch.randn(2, 2, generator=generator)) for _ in range(3)]
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    for x, y in batches:
        eager_loss = _step_fn(eager_model, eager_opt)(x, y)
        torch.testing.assert_close(train(x, y), eager_loss.detach(), rtol=RTOL, atol=ATOL)
    train.write_back()
    eager_state, state = eager_model.state_dict(), model.state_dict()
    for key in eager_state:
        torch.testing.assert_close(state[key], eager_state[key], rtol=1e-4, atol=1e-5, msg=key)


def test_tiny_llama_training_step_equals_eager() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    )
    torch.manual_seed(0)
    _causal_lm_trains_like_eager(transformers.LlamaForCausalLM(config).train(), use_cache=False)


def test_data_dependent_control_flow_names_the_line() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if loss > 1.0:  # data-dependent branch
            loss = loss * 2
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    before = copy.deepcopy(model.state_dict())
    with pytest.raises(TrainingCaptureError, match=r"data-dependent.*test_training.py:\d+ in step: if loss > 1.0"):
        hloalias.compile_training_step(step, model, opt, _batches(1)[0])
    _assert_state_equal(before, model.state_dict())
    assert not opt.state


def test_host_read_of_a_traced_value_names_the_line() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        scale = 2.0 if loss.item() > 1.0 else 1.0
        (loss * scale).backward()
        opt.step()
        opt.zero_grad()
        return loss

    with pytest.raises(TrainingCaptureError, match=r"test_training.py:\d+ in step: scale = 2.0 if loss.item\(\) > 1.0"):
        hloalias.compile_training_step(step, model, opt, _batches(1)[0])


def test_step_keeping_gradients_accumulates_them_on_the_device() -> None:
    """Without ``zero_grad`` eager accumulates ``.grad`` across steps; the
    gradients then become device state (``grad.<fqn>``), aliased in place."""
    eager_model, model = _mlp(), _mlp()
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.05, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step_of(m: torch.nn.Module, o: torch.optim.Optimizer) -> Callable[..., torch.Tensor]:
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            o.step()
            return loss

        return step

    batches = _batches(3)
    train = hloalias.compile_training_step(step_of(model, opt), model, opt, batches[0])
    assert all(p.grad is None for p in model.parameters())
    for x, y in batches:
        torch.testing.assert_close(train(x, y), step_of(eager_model, eager_opt)(x, y).detach(), rtol=RTOL, atol=ATOL)
    train.write_back()
    _assert_state_equal(eager_model.state_dict(), model.state_dict())
    for (name, eager_p), p in zip(eager_model.named_parameters(), model.parameters()):
        assert eager_p.grad is not None and p.grad is not None
        torch.testing.assert_close(p.grad, eager_p.grad, rtol=RTOL, atol=ATOL, msg=name)
    grads = {a["argument"]: a["origin"] for a in train.aliases if a["argument"].startswith("grad.")}
    assert grads == {f"grad.{n}": "inferred" for n, _ in model.named_parameters()}
    assert set(train.state_dict()["grads"]) == {n for n, _ in model.named_parameters()}


@pytest.mark.parametrize("clear", ["zero_grad", "set_to_none", "assign"])
def test_eager_zero_grad_between_accumulating_calls_is_read(clear: str) -> None:
    """Gradient accumulation with the optimizer stepped eagerly: calls of a
    backward-only step, then ``optimizer.step(); optimizer.zero_grad()``
    every second call.  ``zero_grad`` sets ``.grad`` to None, so the next
    call must start from no gradient, as eager's backward does.  Before,
    the device kept the old sum: from the second eager step on the updates
    were twice too large, silently.  A ``.grad`` the user assigns is the
    starting value too."""
    eager_model, model = _mlp(), _mlp()
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def backward_of(m: torch.nn.Module) -> Callable[..., torch.Tensor]:
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            return loss

        return step

    def clear_grads(m: torch.nn.Module, o: torch.optim.Optimizer) -> None:
        if clear == "zero_grad":
            o.zero_grad()
        elif clear == "set_to_none":
            for p in m.parameters():
                p.grad = None
        else:
            for p in m.parameters():
                p.grad = torch.full_like(p, 0.25)

    batches = _batches(6)
    train = hloalias.compile_training_step(backward_of(model), model, opt, batches[0])
    eager_step = backward_of(eager_model)
    for i, (x, y) in enumerate(batches):
        torch.testing.assert_close(train(x, y), eager_step(x, y).detach(), rtol=RTOL, atol=ATOL, msg=f"call {i}")
        if i % 2 == 1:
            for m, o in ((model, opt), (eager_model, eager_opt)):
                o.step()
                clear_grads(m, o)
    train.write_back()
    _assert_state_equal(eager_model.state_dict(), model.state_dict())
    for (name, eager_p), p in zip(eager_model.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, eager_p.grad, rtol=RTOL, atol=ATOL, msg=name)


def test_unknown_optimizer_without_state_is_rejected() -> None:
    model = _mlp()
    # ASGD's state starts from the first step's lr (RMSprop's is built now).
    opt = torch.optim.ASGD(model.parameters(), lr=0.1)
    with pytest.raises(TrainingCaptureError, match="ASGD has no state"):
        hloalias.compile_training_step(_step_fn(model, opt), model, opt, _batches(1)[0])


def _weight_copies(train: Any, width: int) -> int:
    text = train.executable._loaded.hlo_modules()[0].to_string()
    return sum(1 for line in text.splitlines() if " copy(" in line and f"f32[{width},{width}]" in line)


def test_order_in_place_updates_removes_weight_copies() -> None:
    """The backward reads layers 1 and 2's weights for input gradients;
    without ``order-in-place-updates`` XLA copies both (2 x 64 KiB) before
    the in-place update, with it none, at the same values."""
    from hloalias.pipeline import DEFAULT_PIPELINE

    width = 128
    results = {}
    for pipeline in (DEFAULT_PIPELINE, None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
            torch.nn.Linear(width, width),
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        generator = torch.Generator().manual_seed(4)
        x, y = torch.randn(8, width, generator=generator), torch.randn(8, width, generator=generator)
        train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, (x, y), pipeline=pipeline)
        losses = [train(x, y) for _ in range(3)]
        results[pipeline] = (train, losses)
    plain, plain_losses = results[DEFAULT_PIPELINE]
    ordered, ordered_losses = results[None]
    assert _weight_copies(plain, width) == 2 and plain.memory_stats["temp_bytes"] == 147456
    assert _weight_copies(ordered, width) == 0 and ordered.memory_stats["temp_bytes"] == 94720
    assert ordered.memory_stats["total_bytes"] == 499312
    assert ordered.memory_stats["alias_bytes"] == plain.memory_stats["alias_bytes"] == 396288
    for a, b in zip(plain_losses, ordered_losses):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(ordered.state_dict()["model"], plain.state_dict()["model"], rtol=0, atol=0)


def test_capture_and_compile_generate_no_python_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """make_fx's module, the graph edits and the captured ExportedProgram's
    module need no generated code, and neither do the import and the calls
    (``torch_internals.lazy_graph_modules``, ``lazy_exported_programs``;
    bench/latency_notes.md); the step still trains like eager, and the
    program's module generates its code when called."""
    from torch.fx.graph import Graph

    from hloalias.frontend.training import capture_training_step

    generated: list[int] = []
    python_code = Graph.python_code

    def counted(self: Graph, *args: Any, **kwargs: Any) -> Any:
        # A module's code (GraphModule.recompile), not torch's debug
        # printing (print_readable, which pytest's log capture turns on).
        if sys._getframe(1).f_code.co_name == "recompile":
            generated.append(len(self.nodes))
        return python_code(self, *args, **kwargs)

    monkeypatch.setattr(Graph, "python_code", counted)
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _batches(1)[0]
    captured = capture_training_step(_step_fn(model, optimizer), model, optimizer, (x, y))
    assert generated == []
    eager_model = copy.deepcopy(model)
    eager_optimizer = torch.optim.AdamW(eager_model.parameters(), lr=1e-2)
    step = hloalias.compile_training_step(_step_fn(model, optimizer), model, optimizer, (x, y))
    loss = step(x, y)
    assert generated == []
    eager_loss = _step_fn(eager_model, eager_optimizer)(x, y)
    torch.testing.assert_close(loss, eager_loss, rtol=RTOL, atol=ATOL)
    step.write_back()
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=name)
    assert captured.exported.module()(torch.tensor(1e-2), x, y) is not None  # lazy code generated on demand
    assert generated


def test_capture_copies_each_state_tensor_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The captured program's state_dict holds the copies the capture made
    (parameters cloned once; fresh optimizer state created once), not a
    second clone of every state tensor; the copies share no storage with
    the model."""
    from hloalias.frontend.training import capture_training_step

    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _batches(1)[0]
    cloned: list[tuple[int, ...]] = []
    clone = torch.Tensor.clone

    def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if type(self) is torch.Tensor:  # real tensors, not the trace's
            cloned.append(tuple(self.shape))
        return clone(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "clone", counted)
    captured = capture_training_step(_step_fn(model, optimizer), model, optimizer, (x, y))
    monkeypatch.setattr(torch.Tensor, "clone", clone)
    assert sorted(cloned) == sorted(tuple(p.shape) for p in model.parameters())
    state = captured.exported.state_dict
    for name, p in model.named_parameters():
        assert torch.equal(state[f"param.{name}"], p)
        assert state[f"param.{name}"].untyped_storage().data_ptr() != p.untyped_storage().data_ptr()


def test_capture_traces_the_state_without_copies() -> None:
    """Parameters and optimizer state are traced as they are (the
    optimizer's in-place update is functionalized like any other op, the
    lr-0 guard reads the parameter's placeholder), not through a traced
    ``clone`` of each: one traced op per state tensor, 84 of the HF Llama
    step's 1,486 nodes.  A state the step leaves alone (a frozen
    parameter's optimizer state: one eager step, then frozen) is a clone of
    its input, so that every new state is a value the program computes;
    the step equals eager."""
    from hloalias.frontend.training import capture_training_step

    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    eager_model = copy.deepcopy(model)
    eager_optimizer = torch.optim.AdamW(eager_model.parameters(), lr=1e-2)
    batches = _batches(3)
    for m, o in ((model, optimizer), (eager_model, eager_optimizer)):
        _step_fn(m, o)(*batches[0])
        m[2].bias.requires_grad_(False)
    captured = capture_training_step(_step_fn(model, optimizer), model, optimizer, batches[0])
    graph = captured.exported.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    state = dict(zip(placeholders, captured.slots))
    copied = sorted(state[node.args[0]].name for node in graph.nodes
                    if node.target == torch.ops.aten.clone.default and node.args[0] in state)
    frozen = len(optimizer.param_groups[0]["params"]) - 1
    assert copied == [f"optim.{frozen}.{key}" for key in ("exp_avg", "exp_avg_sq", "step")]
    output = next(node for node in graph.nodes if node.op == "output")
    new_values = dict(zip((slot.name for slot in captured.slots), output.args[0]))
    # The frozen parameter: a detach of its input (AdamW's eager formula
    # needs no lr-0 guard, which made it ``where(lr == 0, old, old)``).
    kept = new_values["param.2.bias"]
    assert kept.target == torch.ops.aten.alias.default and kept.args[0] is placeholders[captured.slots.index(
        next(slot for slot in captured.slots if slot.name == "param.2.bias"))]
    assert all(node.op != "placeholder" for node in output.args[0])

    train = hloalias.compile_training_step(_step_fn(model, optimizer), model, optimizer, batches[0])
    for x, y in batches:
        torch.testing.assert_close(train(x, y), _step_fn(eager_model, eager_optimizer)(x, y), rtol=RTOL, atol=ATOL)
    train.write_back()
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=name)
    assert torch.equal(model[2].bias, eager_model[2].bias)


def test_a_tensor_the_step_closes_over_is_read_at_each_call() -> None:
    """A target tensor defined outside the step (not an argument): read as
    eager reads it, its current value at each call; the capture refused
    it before (a real tensor in the fake trace)."""
    torch.manual_seed(0)
    target = torch.randn(2, 3)
    x = torch.randn(2, 4)

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, Callable[[torch.Tensor], torch.Tensor]]:
        torch.manual_seed(1)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(batch: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = (model(batch) - target).pow(2).mean() + (target * 0).sum()  # two reads of it
            loss.backward()
            opt.step()
            return loss
        return model, opt, step

    eager_model, _, eager_step = build()
    model, opt, step = build()
    compiled = hloalias.compile_training_step(step, model, opt, (x,))
    for change in (False, False, True):
        if change:
            target.mul_(2)
        torch.testing.assert_close(compiled(x), eager_step(x))
    compiled.write_back()
    torch.testing.assert_close(model.weight, eager_model.weight)


def test_a_write_to_a_tensor_the_step_closes_over_is_refused_before_it_happens() -> None:
    counter = torch.zeros(())
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weight = model.weight.detach().clone()

    def step(batch: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(batch).sum()
        loss.backward()
        opt.step()
        counter.add_(1)
        return loss

    with pytest.raises(TrainingCaptureError, match=r"writes in place \(add_\) to a tensor it closes over"):
        hloalias.compile_training_step(step, model, opt, (torch.randn(2, 4),))
    assert counter.item() == 0
    assert torch.equal(model.weight.detach(), weight)
