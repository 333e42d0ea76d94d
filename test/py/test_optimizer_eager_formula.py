"""Every optimizer the training capture supports, with its options and
under lr schedulers, against eager (session 48): parameters and optimizer
state after five steps, float32 and float64.

The model's gradients are exact in both (``loss = (w * x).sum()``: the
gradient of ``w`` is the batch ``x``), so only the optimizer's update can
differ.  Two classes of difference exist:

* formula differences: the capture used torch's ``capturable=True`` forms
  (other formulas, bias corrections and step sizes in the float32 step
  counter's dtype) where eager computes host doubles; a float64 Adam was
  ~2e-7 (about 1e9 ulps) off after three steps.  Fixed by tracing eager's
  formula (frontend/optimizer_exact.py); the float64 bound below (16 ulps
  of the tensor's largest value) fails on the old code for Adam, AdamW,
  Adamax, Adagrad, NAdam, RAdam and ASGD.
* fused multiply-adds: XLA's CPU backend always contracts ``a * b + c``
  into one FMA, across what eager runs as separate kernels
  (``exp_avg_sq.mul_(beta2).addcmul_(...)``: XLA rounds once, eager twice),
  while torch's own CPU kernels contract inside a kernel or not depending
  on the CPU capability they dispatch to (``ATEN_CPU_CAPABILITY=default``
  gives other bits than ``avx2``/``avx512``).  Those stay a few ulps per
  step; bench/RESULTS-training.md (session 48) has the measurements.

Where no such contraction differs, the result is bitwise (``BITWISE``,
checked on AVX2/AVX512 CPUs, whose kernels this was measured with)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.frontend.training import TrainingCaptureError

O = torch.optim
S = torch.optim.lr_scheduler
STEPS = 5
#: Largest difference allowed, in units of the dtype's eps times the
#: tensor's largest magnitude: FMA rounding, never a formula difference.
ULPS = 16


class _ExactGradients(torch.nn.Module):
    """``loss = (w * x).sum() + (b * y).sum()``: gradients are the batch,
    bit for bit, in eager and compiled (odd sizes: vector bodies and tails)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(5, 7, generator=generator, dtype=dtype))
        self.b = torch.nn.Parameter(torch.randn(19, generator=generator, dtype=dtype))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (self.w * x).sum() + (self.b * y).sum()


def _step_fn(model: torch.nn.Module, optimizer: O.Optimizer) -> Callable[..., torch.Tensor]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def _batches(dtype: torch.dtype, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(5, 7, generator=generator, dtype=dtype), torch.randn(19, generator=generator, dtype=dtype))
        for _ in range(count)
    ]


Make = Callable[[Any], O.Optimizer]
#: name -> (optimizer, needs one eager step before compiling).
CONFIGS: dict[str, tuple[Make, bool]] = {
    "adam": (lambda p: O.Adam(p, lr=1e-2), False),
    "adam_amsgrad_l2_maximize": (lambda p: O.Adam(p, lr=1e-2, amsgrad=True, weight_decay=0.1, maximize=True), False),
    "adam_decoupled_foreach": (lambda p: O.Adam(p, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True,
                                                 foreach=True), False),
    "adamw": (lambda p: O.AdamW(p, lr=1e-2, weight_decay=0.1), False),
    "adamw_amsgrad_betas": (lambda p: O.AdamW(p, lr=1e-2, amsgrad=True, betas=(0.5, 0.9), eps=1e-6), False),
    "sgd": (lambda p: O.SGD(p, lr=1e-2), False),
    "sgd_nesterov_l2": (lambda p: O.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.1), False),
    "sgd_dampening_maximize": (lambda p: O.SGD(p, lr=1e-2, momentum=0.9, dampening=0.5, maximize=True), True),
    "rmsprop": (lambda p: O.RMSprop(p, lr=1e-2), False),
    "rmsprop_centered_momentum_l2": (lambda p: O.RMSprop(p, lr=1e-2, momentum=0.5, centered=True,
                                                         weight_decay=0.1), False),
    "adagrad_lr_decay_l2": (lambda p: O.Adagrad(p, lr=1e-2, lr_decay=0.01, weight_decay=0.1,
                                                initial_accumulator_value=0.1), False),
    "adagrad_maximize_foreach": (lambda p: O.Adagrad(p, lr=1e-2, maximize=True, foreach=True), False),
    "adamax_l2": (lambda p: O.Adamax(p, lr=1e-2, weight_decay=0.1), False),
    "nadam_l2": (lambda p: O.NAdam(p, lr=1e-2, weight_decay=0.1), False),
    "nadam_decoupled_momentum_decay": (lambda p: O.NAdam(p, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True,
                                                         momentum_decay=0.01), False),
    # beta2 = 0.99: rho_t passes 5 at step 6 (warm step + 5): both updates.
    "radam_l2": (lambda p: O.RAdam(p, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1), True),
    "radam_decoupled_maximize": (lambda p: O.RAdam(p, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True,
                                                   maximize=True), False),
    "adadelta_l2": (lambda p: O.Adadelta(p, lr=1.0, weight_decay=0.1), False),
    "asgd_l2": (lambda p: O.ASGD(p, lr=1e-2, weight_decay=0.1, t0=2.0), True),
    "rprop": (lambda p: O.Rprop(p, lr=1e-2), True),
    "rprop_etas_maximize": (lambda p: O.Rprop(p, lr=1e-2, etas=(0.3, 1.5), step_sizes=(1e-4, 1.0),
                                              maximize=True), True),
}

SCHEDULERS: dict[str, Callable[[O.Optimizer], Any]] = {
    "warmup_from_0": lambda o: S.LambdaLR(o, lambda step: min(1.0, step / 2)),
    "step_changes": lambda o: S.StepLR(o, step_size=2, gamma=0.1),
    "one_cycle": lambda o: S.OneCycleLR(o, max_lr=1e-2, total_steps=10, cycle_momentum=False),
}

#: (config, dtype) measured bitwise equal to eager on AVX2/AVX512 kernels,
#: under every scheduler here.
BITWISE = {
    ("sgd", torch.float32), ("sgd", torch.float64),
    ("adamax_l2", torch.float32), ("adamax_l2", torch.float64),
    ("rprop", torch.float32), ("rprop", torch.float64),
    ("rprop_etas_maximize", torch.float32), ("rprop_etas_maximize", torch.float64),
}


def _train_both(config: str, dtype: torch.dtype, scheduler: str) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, compiled, eager) of every parameter and optimizer state
    entry after STEPS steps (one more, eager, first where needed)."""
    make, warm = CONFIGS[config]
    eager_model, model = _ExactGradients(dtype), _ExactGradients(dtype)
    eager_opt, opt = make(eager_model.parameters()), make(model.parameters())
    eager_sched, sched = SCHEDULERS[scheduler](eager_opt), SCHEDULERS[scheduler](opt)
    batches = _batches(dtype, STEPS + 1)
    if warm:
        for m, o, s in ((eager_model, eager_opt, eager_sched), (model, opt, sched)):
            _step_fn(m, o)(*batches[0])
            s.step()
    train = hloalias.compile_training_step(_step_fn(model, opt), model, opt, batches[0])
    for batch in batches[1:]:
        _step_fn(eager_model, eager_opt)(*batch)
        train(*batch)
        eager_sched.step()
        sched.step()
    train.write_back()
    pairs = []
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters()):
        pairs.append((name, p.detach(), q.detach()))
        assert opt.state[p].keys() == eager_opt.state[q].keys(), name
        for key, value in eager_opt.state[q].items():
            pairs.append((f"{name}.{key}", torch.as_tensor(opt.state[p][key]), torch.as_tensor(value)))
    return pairs


def _check(config: str, dtype: torch.dtype, scheduler: str) -> None:
    bitwise = (config, dtype) in BITWISE and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    for name, compiled, eager in _train_both(config, dtype, scheduler):
        assert compiled.dtype == eager.dtype and compiled.shape == eager.shape, name
        if bitwise:
            assert torch.equal(compiled, eager), f"{name}: not bitwise eager's"
            continue
        eps = torch.finfo(eager.dtype).eps
        scale = max(eager.abs().max().item(), torch.finfo(eager.dtype).tiny)
        difference = (compiled.double() - eager.double()).abs().max().item()
        assert difference <= ULPS * eps * scale, (
            f"{name}: {difference:.3g} off ({difference / (eps * scale):.3g} ulps of {scale:.3g})"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_optimizer_equals_eager_warming_up_from_lr_0(config: str, dtype: torch.dtype) -> None:
    _check(config, dtype, "warmup_from_0")


#: One config per optimizer (the program is cached: a scheduler is data).
_SCHEDULED = ("adam_amsgrad_l2_maximize", "adamw", "sgd_nesterov_l2", "rmsprop_centered_momentum_l2",
              "adagrad_lr_decay_l2", "adamax_l2", "nadam_decoupled_momentum_decay", "radam_l2",
              "adadelta_l2", "asgd_l2", "rprop")


@pytest.mark.parametrize("scheduler", ["step_changes", "one_cycle"])
@pytest.mark.parametrize("config", _SCHEDULED)
def test_optimizer_equals_eager_under_scheduler(config: str, scheduler: str) -> None:
    _check(config, torch.float64, scheduler)


@pytest.mark.parametrize("option", ["differentiable", "fused"])
def test_options_without_an_eager_equal_capture_are_refused_by_name(option: str) -> None:
    model = _ExactGradients(torch.float32)
    optimizer = O.Adam(model.parameters(), lr=1e-2, **{option: True})
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(TrainingCaptureError, match=f"{option}=True"):
        hloalias.compile_training_step(_step_fn(model, optimizer), model, optimizer, _batches(torch.float32, 1)[0])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert not optimizer.state


class _BiasCorrections(torch.nn.Module):
    """Adam's host scalars as :func:`eager_adam` traces them."""

    def forward(self, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from hloalias.frontend.optimizer_exact import _pow

        bias_correction2 = 1 - torch.pow(0.999, step)
        return 1 - torch.pow(0.9, step), _pow(bias_correction2, 0.5)


def test_compiled_bias_corrections_are_pythons_doubles() -> None:
    """``1 - beta ** step`` and ``(1 - beta2 ** step) ** 0.5`` compiled
    equal Python's for steps 1..3000, bit for bit.  With a constant
    exponent the compiler computes ``sqrt``, which differs at steps 1270
    and 2582 (C's ``pow(x, 0.5)`` is not ``sqrt(x)`` there)."""
    steps = torch.arange(1, 3001, dtype=torch.float64)
    compiled = hloalias.compile(_BiasCorrections(), (steps,))
    bias_correction1, bias_correction2_sqrt = compiled(steps)
    expected1 = torch.tensor([1 - 0.9 ** k for k in range(1, 3001)], dtype=torch.float64)
    expected2 = torch.tensor([(1 - 0.999 ** k) ** 0.5 for k in range(1, 3001)], dtype=torch.float64)
    assert torch.equal(torch.as_tensor(bias_correction1), expected1)
    assert torch.equal(torch.as_tensor(bias_correction2_sqrt), expected2)


@pytest.mark.parametrize("config", ["adam", "nadam_l2", "rmsprop"])
def test_fresh_state_under_a_float64_default_dtype_is_eagers(config: str) -> None:
    """Under ``torch.set_default_dtype(torch.float64)`` eager's step counts
    (and NAdam's ``mu_product``) are float64 (torch's
    ``_get_scalar_dtype()``); the state hloalias creates was float32, and
    a float32 ``mu_product`` moved NAdam 2e-10 off eager's."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _check(config, torch.float64, "warmup_from_0")
    finally:
        torch.set_default_dtype(previous)


def test_kernels_are_torchs_again_after_capture_even_when_nested() -> None:
    import importlib

    from hloalias.frontend.optimizer_exact import eager_formula_kernels

    adam = importlib.import_module("torch.optim.adam")  # torch.optim deletes its submodules' names
    torchs = adam._single_tensor_adam
    with eager_formula_kernels():
        replaced = adam._single_tensor_adam
        with eager_formula_kernels():
            assert adam._single_tensor_adam is replaced
        assert adam._single_tensor_adam is replaced
    assert adam._single_tensor_adam is torchs
