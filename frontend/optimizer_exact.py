"""Optimizer updates as eager computes them, traceable with a tensor step
counter and a tensor learning rate: Adam and AdamW, Adamax, Adagrad,
NAdam, RAdam and ASGD.

Eager's default update (``capturable=False``; torch/optim/adam.py
``_single_tensor_adam`` and the others) reads the step counter (and
NAdam's ``mu_product``, ASGD's ``eta`` and ``mu``) on the host and
computes its scalars in Python doubles; Adam's::

    bias_correction1 = 1 - beta1 ** step          # C pow()
    step_size = lr / bias_correction1
    bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)

The training capture cannot read the step on the host, and torch's
traceable form (``capturable=True``) is another formula (Adam: divides by
``bias_correction2_sqrt * -step_size`` and adds ``eps / -step_size``)
with the scalars in the step counter's dtype (float32).  A float64 Adam
drifted from eager by ~2e-7 after three steps (session 47); NAdam, ASGD,
RAdam, Adamax and Adagrad alike (bench/RESULTS-training.md, session 48).

While the capture traces, :func:`eager_formula_kernels` replaces torch's
single-tensor kernels (the optimizers call them by their module-level
names) with this module's ``eager_*`` functions: eager's formula, line for
line, on traced 0-d float64 values: the step converted to float64 (an
integer: exact), ``x ** y`` as ``pow`` (XLA's CPU ``pow`` on float64 is
the C library's: equal to Python's on 200000 random operands), ``lr`` a
float64 input (:func:`hloalias.frontend.training._lr_dtype`), every
scalar reaching a parameter-shaped operator as a 0-d tensor, which the
operator rounds to the parameter's dtype as eager rounds the Python
double, and eager's host branches (RAdam's ``rho_t > 5``, ASGD's
``mu != 1``) as selects.  A constant exponent is hidden from the compiler
(:func:`_pow`): XLA rewrites ``pow(x, 0.5)`` into ``sqrt(x)`` and
``pow(x, 0.75)`` alike, which differ from C's ``pow`` in the last bit for
some ``x``.

Anything else (``capturable=True`` or ``differentiable=True`` groups,
tensor betas, complex parameters, sparse gradients, a gradient scaler's
``grad_scale``) runs torch's kernel in its ``capturable=True`` form, as
the capture always did.  Parameters of dtypes other than float32 and
float64 too: eager computes their scalar operands in float32 (the reduced
types' opmath), a rounding the trace does not reproduce.

What stays different from eager is the rounding of the element-wise
arithmetic itself: XLA's CPU backend contracts ``a * b + c`` into one
fused multiply-add across what eager runs as separate kernels, and
torch's CPU kernels round by their own library (its ``sqrt`` is not
IEEE's correctly rounded one; ``addcmul`` fuses or not by CPU
capability): a few ulps per step, measured in
test/py/test_optimizer_eager_formula.py."""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Iterator
from typing import Any

import torch

_EXACT_DTYPES = (torch.float32, torch.float64)


#: (module, torch's kernel) replaced while tracing,
#: each by the function of this module named in :data:`_EAGER`.
_KERNELS = (
    ("torch.optim.adam", "_single_tensor_adam"),
    ("torch.optim.adamax", "_single_tensor_adamax"),
    ("torch.optim.adagrad", "_single_tensor_adagrad"),
    ("torch.optim.nadam", "_single_tensor_nadam"),
    ("torch.optim.radam", "_single_tensor_radam"),
    ("torch.optim.asgd", "_single_tensor_asgd"),
)

#: torch's own kernels, by name, while :func:`eager_formula_kernels` replaces them.
_ORIGINAL: dict[str, Any] = {}


def _torch_kernel(name: str) -> Any:
    module = next(m for m, n in _KERNELS if n == name)
    # (``torch.optim.adam`` the attribute is the function ``adam``.)
    return _ORIGINAL.get(name, getattr(importlib.import_module(module), name))


def eager_formula_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer``'s groups are traced with their ``capturable``
    setting as the user gave it (its kernel is replaced here)."""
    optim = torch.optim
    return isinstance(optimizer, (optim.Adam, optim.Adamax, optim.Adagrad, optim.NAdam, optim.RAdam, optim.ASGD))


def group_uses_eager_form(group: dict[str, Any]) -> bool:
    """Whether a param group's update is traced with eager's formula (the
    rest of the check is per kernel call)."""
    betas = group.get("betas", (0.9, 0.999))
    return (
        not group.get("capturable", False)
        and not group.get("differentiable", False)
        and not group.get("fused", False)
        and all(isinstance(v, (int, float)) for v in (*betas, group.get("weight_decay", 0), group.get("eps", 0)))
        and all(p.dtype in _EXACT_DTYPES for p in group["params"])
    )


def _applies(tensors: list[list[torch.Tensor]], kwargs: dict[str, Any], scalars: tuple[str, ...]) -> bool:
    """Whether every tensor and setting is one the eager kernels compute as
    eager does (module docstring): float32/float64 parameters and
    gradients, 0-d state scalars, number hyperparameters, a float64 lr."""
    if kwargs.get("capturable") or kwargs.get("differentiable") or kwargs.get("has_complex"):
        return False
    if kwargs.get("has_sparse_grad"):
        return False
    if not all(isinstance(kwargs[k], (int, float)) and not isinstance(kwargs[k], bool) for k in scalars):
        return False
    lr = kwargs["lr"]
    if isinstance(lr, torch.Tensor) and (lr.dtype != torch.float64 or lr.dim() != 0):
        return False
    params, grads = tensors[0], tensors[1]
    return all(
        p.dtype in _EXACT_DTYPES and g.dtype == p.dtype and g.layout == torch.strided
        for p, g in zip(params, grads)
    ) and all(isinstance(t, torch.Tensor) and t.dim() == 0 for lst in tensors[2:] for t in lst)


def _fallback(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """torch's kernel in its traceable form, as the capture ran it before."""
    if "capturable" in kwargs:
        kwargs = {**kwargs, "capturable": True}
    _torch_kernel(name)(*args, **kwargs)


def _f64(value: torch.Tensor) -> torch.Tensor:
    """A 0-d state value (a step count, a product) as eager's host double."""
    return value.to(torch.float64)


def _pow(base: Any, exponent: float) -> torch.Tensor:
    """``base ** exponent`` (Python's C ``pow``) with the constant exponent
    hidden from the compiler, which rewrites ``pow(x, 0.5)`` into
    ``sqrt(x)`` and ``pow(x, 0.75)`` alike (module docstring):
    ``where(base >= -inf, exponent, base)`` is the exponent for every base
    but NaN, whose power is NaN either way.  (``base == base`` would do as
    well, but the lowering folds it to true.)"""
    return torch.pow(base, torch.where(base >= -math.inf, exponent, base))


def _neg(grad: torch.Tensor, maximize: bool) -> torch.Tensor:
    return -grad if maximize else grad


def eager_adam(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    max_exp_avg_sqs: list[torch.Tensor],
    state_steps: list[torch.Tensor],
    grad_scale: torch.Tensor | None,
    found_inf: torch.Tensor | None,
    **kwargs: Any,
) -> None:
    """``torch.optim.adam._single_tensor_adam`` (Adam, AdamW) with eager's
    ``capturable=False`` arithmetic on a traced step and lr (module
    docstring); other cases go to torch's kernel."""
    args = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, grad_scale, found_inf)
    if grad_scale is not None or found_inf is not None or not _applies(
        [params, grads, state_steps], kwargs, ("beta1", "beta2", "weight_decay", "eps")
    ):
        _fallback("_single_tensor_adam", args, kwargs)
        return
    beta1, beta2, lr = float(kwargs["beta1"]), float(kwargs["beta2"]), kwargs["lr"]
    weight_decay, eps = float(kwargs["weight_decay"]), float(kwargs["eps"])
    amsgrad, maximize, decoupled = kwargs["amsgrad"], kwargs["maximize"], kwargs["decoupled_weight_decay"]
    for i, param in enumerate(params):
        grad = _neg(grads[i], maximize)
        exp_avg, exp_avg_sq, step_t = exp_avgs[i], exp_avg_sqs[i], state_steps[i]
        step_t += 1
        if weight_decay != 0:
            if decoupled:
                # Eager: the double ``1 - lr * weight_decay``, rounded by mul_.
                param.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        # Eager's host scalars, as float64 0-d values.
        step = _f64(step_t)
        bias_correction1 = 1 - torch.pow(beta1, step)
        bias_correction2 = 1 - torch.pow(beta2, step)
        neg_step_size = -(lr / bias_correction1)
        bias_correction2_sqrt = _pow(bias_correction2, 0.5)
        if amsgrad:
            max_exp_avg_sqs[i].copy_(torch.maximum(max_exp_avg_sqs[i], exp_avg_sq))
            denom = (max_exp_avg_sqs[i].sqrt() / bias_correction2_sqrt).add_(eps)
        else:
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        # ``param.addcdiv_(exp_avg, denom, value=-step_size)``: its kernel's
        # ``param + value * exp_avg / denom`` (addcdiv takes no tensor value).
        param.add_(exp_avg * neg_step_size / denom)


def eager_adamax(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_infs: list[torch.Tensor],
    state_steps: list[torch.Tensor],
    **kwargs: Any,
) -> None:
    """``torch.optim.adamax._single_tensor_adamax``, eager's arithmetic."""
    args = (params, grads, exp_avgs, exp_infs, state_steps)
    if not _applies([params, grads, state_steps], kwargs, ("beta1", "beta2", "weight_decay", "eps")):
        _fallback("_single_tensor_adamax", args, kwargs)
        return
    beta1, beta2, lr = float(kwargs["beta1"]), float(kwargs["beta2"]), kwargs["lr"]
    weight_decay, eps, maximize = float(kwargs["weight_decay"]), float(kwargs["eps"]), kwargs["maximize"]
    for i, param in enumerate(params):
        grad = _neg(grads[i], maximize)
        exp_avg, exp_inf, step_t = exp_avgs[i], exp_infs[i], state_steps[i]
        step_t += 1
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_inf.copy_(torch.maximum(exp_inf.mul_(beta2), grad.abs().add_(eps)))
        clr = lr / (1 - torch.pow(beta1, _f64(step_t)))
        param.add_(exp_avg * -clr / exp_inf)  # addcdiv_(exp_avg, exp_inf, value=-clr)


def eager_adagrad(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    state_sums: list[torch.Tensor],
    state_steps: list[torch.Tensor],
    grad_scale: torch.Tensor | None,
    found_inf: torch.Tensor | None,
    **kwargs: Any,
) -> None:
    """``torch.optim.adagrad._single_tensor_adagrad``, eager's arithmetic
    (dense gradients)."""
    args = (params, grads, state_sums, state_steps, grad_scale, found_inf)
    if grad_scale is not None or found_inf is not None or not _applies(
        [params, grads, state_steps], kwargs, ("weight_decay", "lr_decay", "eps")
    ):
        _fallback("_single_tensor_adagrad", args, kwargs)
        return
    lr, weight_decay = kwargs["lr"], float(kwargs["weight_decay"])
    lr_decay, eps, maximize = float(kwargs["lr_decay"]), float(kwargs["eps"]), kwargs["maximize"]
    for param, grad, state_sum, step_t in zip(params, grads, state_sums, state_steps):
        step_t += 1
        grad = _neg(grad, maximize)
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        clr = lr / (1 + (_f64(step_t) - 1) * lr_decay)
        state_sum.addcmul_(grad, grad, value=1)
        std = state_sum.sqrt().add_(eps)
        param.add_(grad * -clr / std)  # addcdiv_(grad, std, value=-clr)


def eager_nadam(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    mu_products: list[torch.Tensor],
    state_steps: list[torch.Tensor],
    **kwargs: Any,
) -> None:
    """``torch.optim.nadam._single_tensor_nadam``, eager's arithmetic."""
    args = (params, grads, exp_avgs, exp_avg_sqs, mu_products, state_steps)
    if not _applies(
        [params, grads, state_steps, mu_products], kwargs, ("beta1", "beta2", "weight_decay", "eps", "momentum_decay")
    ):
        _fallback("_single_tensor_nadam", args, kwargs)
        return
    beta1, beta2, lr = float(kwargs["beta1"]), float(kwargs["beta2"]), kwargs["lr"]
    weight_decay, eps = float(kwargs["weight_decay"]), float(kwargs["eps"])
    momentum_decay, decoupled, maximize = float(kwargs["momentum_decay"]), kwargs["decoupled_weight_decay"], kwargs["maximize"]
    for i, param in enumerate(params):
        grad = _neg(grads[i], maximize)
        exp_avg, exp_avg_sq, mu_product, step_t = exp_avgs[i], exp_avg_sqs[i], mu_products[i], state_steps[i]
        step_t += 1
        step = _f64(step_t)
        bias_correction2 = 1 - torch.pow(beta2, step)
        if weight_decay != 0:
            if decoupled:
                param.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(param, alpha=weight_decay)
        mu = beta1 * (1.0 - 0.5 * torch.pow(0.96, step * momentum_decay))
        mu_next = beta1 * (1.0 - 0.5 * torch.pow(0.96, (step + 1) * momentum_decay))
        # ``mu_product *= mu``: a Python double meets the 0-d state in its
        # own dtype (a 0-d float64 tensor would promote the product).
        mu_product.mul_(mu.to(mu_product.dtype))
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = exp_avg_sq.div(bias_correction2).sqrt()
        product = _f64(mu_product)
        mu_product_next = product * mu_next
        denom.add_(eps)
        param.add_(grad * (-lr * (1.0 - mu) / (1.0 - product)) / denom)
        param.add_(exp_avg * ((-lr * mu_next) / (1.0 - mu_product_next)) / denom)


def eager_radam(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    state_steps: list[torch.Tensor],
    **kwargs: Any,
) -> None:
    """``torch.optim.radam._single_tensor_radam``, eager's arithmetic; its
    host branch on ``rho_t > 5`` a select of the two updates."""
    args = (params, grads, exp_avgs, exp_avg_sqs, state_steps)
    if not _applies([params, grads, state_steps], kwargs, ("beta1", "beta2", "weight_decay", "eps")):
        _fallback("_single_tensor_radam", args, kwargs)
        return
    beta1, beta2, lr = float(kwargs["beta1"]), float(kwargs["beta2"]), kwargs["lr"]
    weight_decay, eps = float(kwargs["weight_decay"]), float(kwargs["eps"])
    decoupled, maximize = kwargs["decoupled_weight_decay"], kwargs["maximize"]
    for i, param in enumerate(params):
        grad = _neg(grads[i], maximize)
        exp_avg, exp_avg_sq, step_t = exp_avgs[i], exp_avg_sqs[i], state_steps[i]
        step_t += 1
        step = _f64(step_t)
        if weight_decay != 0:
            if decoupled:
                param.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - torch.pow(beta1, step)
        beta2_power = torch.pow(beta2, step)
        bias_correction2 = 1 - beta2_power
        bias_corrected_exp_avg = exp_avg / bias_correction1
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * beta2_power / bias_correction2
        rect = _pow((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t), 0.5)
        adaptive_lr = _pow(bias_correction2, 0.5) / exp_avg_sq.sqrt().add_(eps)
        rectified = bias_corrected_exp_avg * lr * adaptive_lr * rect
        param.sub_(torch.where(rho_t > 5.0, rectified, bias_corrected_exp_avg * lr))  # add_(..., alpha=-1.0)


def eager_asgd(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    axs: list[torch.Tensor],
    mus: list[torch.Tensor],
    etas: list[torch.Tensor],
    state_steps: list[torch.Tensor],
    **kwargs: Any,
) -> None:
    """``torch.optim.asgd._single_tensor_asgd``, eager's arithmetic; its
    host branch on ``mu != 1`` a select."""
    args = (params, grads, axs, mus, etas, state_steps)
    if not _applies([params, grads, state_steps, mus, etas], kwargs, ("lambd", "t0", "alpha", "weight_decay")):
        _fallback("_single_tensor_asgd", args, kwargs)
        return
    lambd, lr, t0, alpha = float(kwargs["lambd"]), kwargs["lr"], float(kwargs["t0"]), float(kwargs["alpha"])
    weight_decay, maximize = float(kwargs["weight_decay"]), kwargs["maximize"]
    for i, param in enumerate(params):
        grad = _neg(grads[i], maximize)
        ax, mu, eta, step_t = axs[i], mus[i], etas[i], state_steps[i]
        step_t += 1
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        eta_value = _f64(eta)
        param.mul_(1 - lambd * eta_value)
        param.add_(grad * -eta_value)  # add_(grad, alpha=-eta_value)
        ax.copy_(torch.where(mu == 1, param, ax + param.sub(ax).mul_(mu)))
        step = _f64(step_t)
        eta.copy_(lr / _pow(1 + lambd * lr * step, alpha))
        excess = step - t0
        mu.copy_(1 / torch.where(excess > 1, excess, 1.0))  # 1 / max(1, step - t0)


#: The replacement of each kernel of :data:`_KERNELS`, by kernel name.
_EAGER = {
    "_single_tensor_adam": "eager_adam",
    "_single_tensor_adamax": "eager_adamax",
    "_single_tensor_adagrad": "eager_adagrad",
    "_single_tensor_nadam": "eager_nadam",
    "_single_tensor_radam": "eager_radam",
    "_single_tensor_asgd": "eager_asgd",
}


@contextlib.contextmanager
def eager_formula_kernels() -> Iterator[None]:
    """The eager-formula kernels in place of torch's for the duration (the
    optimizers call them by their module-level names)."""
    replaced = []
    try:
        for module_name, name in _KERNELS:
            module = importlib.import_module(module_name)
            eager = globals()[_EAGER[name]]
            if getattr(module, name) is eager:
                continue  # a capture inside a capture: the outer one restores it
            _ORIGINAL[name] = getattr(module, name)
            replaced.append((module, name))
            setattr(module, name, eager)
        yield
    finally:
        for module, name in reversed(replaced):
            setattr(module, name, _ORIGINAL.pop(name))
