"""``ctc_loss`` (``aten.ctc_loss.Tensor`` and ``.IntList``, both
composite-implicit) written in aten ops torch-mlir lowers, applied with
:mod:`hloalias.frontend.decompositions`' table.

Why here: torch's composite calls ``aten._ctc_loss.Tensor``, which has a
CPU kernel only (no fake or meta rule: its second result, ``log_alpha``,
is ``[N, T, 2 * max(target_lengths) + 1]``, a shape read from the
lengths' values), so ``torch.export`` fails on it.  Replacing the
composite itself keeps ``_ctc_loss`` out of the trace; its result (the
loss) has a static shape.  The decomposition sits where the composite
does, above autograd: the training capture differentiates it.

Contract (torch's ``ctc_loss``, static shapes):

- ``log_probs`` ``[T, N, C]`` (or unbatched ``[T, C]``), float32 or
  float64;
  ``targets`` padded ``[N, S]`` or concatenated 1-d (``sum(target_lengths)``
  elements: the padded layout is gathered with ``S`` = all the elements,
  an upper bound of every length); ``input_lengths``/``target_lengths``
  ``[N]`` tensors (values vary per call) or int lists; ``blank``;
  ``reduction`` none/mean/sum (mean divides each loss by its target length
  clamped to >= 1, then means over the batch); ``zero_infinity``.
- The forward recursion (alpha) in log space over the ``2S + 1`` states
  of the labels with blanks between, unrolled over the static ``T``: per
  step one log-sum-exp of the state and its two predecessors (the skip
  only onto a label that differs from the one two states back), plus the
  emission.  A sample's result is read at ``t = input_length - 1`` from
  the stacked steps (``input_length == 0``: likelihood 1 for an empty
  target, else 0); states past ``2 * target_length`` get no emission
  (padding labels may lie outside ``[0, C)``: they are clamped before the
  gather).  Unreachable states hold a finite log-likelihood far below any
  path's (``finfo.min * 1e-8``), not ``-inf``: a log-sum-exp of only
  ``-inf`` has a NaN gradient, and guarding each step against it costs
  ops in every step of the unrolled loop; a likelihood below half that
  value is torch's ``inf`` loss.
- Gradients: autograd of the recursion is the posterior, ``-gamma``.
  torch's ``_ctc_loss_backward`` returns ``exp(log_probs) - gamma``
  instead (the logits' gradient when ``log_probs`` is a ``log_softmax``,
  whose backward then leaves it unchanged), for ``t < input_length``; a
  term of value 0 whose gradient is ``exp(log_probs)`` on those steps
  gives the same.  Infinite losses (no alignment fits in
  ``input_length``) get zero gradients where torch's are NaN (with
  ``zero_infinity`` both are zero).

Cost: ``T`` steps of ``N x (2S + 1)`` elements each, ~12 ops per step in
the program: compile time grows with ``T`` (bench/RESULTS-opinfo.md)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

aten = torch.ops.aten

#: torch's ``at::Reduction`` values.
_NONE, _MEAN, _SUM = 0, 1, 2


def _padded_labels(targets: torch.Tensor, target_lengths: torch.Tensor, batch: int) -> torch.Tensor:
    """``targets`` as ``[N, S]`` int64 labels: the padded layout as is,
    the concatenated one gathered from each sample's offset (``S`` = all
    its elements; positions past a sample's length are never read)."""
    if targets.dim() == 2:
        return targets.to(torch.int64)
    total = targets.shape[0]
    if total == 0:
        return torch.zeros((batch, 0), dtype=torch.int64, device=targets.device)
    lengths = target_lengths.to(torch.int64)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = starts.unsqueeze(1) + torch.arange(total, device=targets.device).unsqueeze(0)
    return targets.to(torch.int64)[positions.clamp(0, total - 1)]


def _unreachable(dtype: torch.dtype) -> float:
    """The log-likelihood of an unreachable state: finite (so no step's
    log-sum-exp sees only ``-inf``, whose gradient is NaN), far below any
    path's, and summable over ``T`` steps without overflowing."""
    return torch.finfo(dtype).min * 1e-8


def _logsumexp_first(x: torch.Tensor) -> torch.Tensor:
    """``logsumexp`` over dim 0 of finite values, in fewer ops than
    torch's (which guards against infinite peaks): the peak is detached
    (the exact gradient does not depend on it)."""
    peak = x.amax(0, keepdim=True).detach()
    return torch.log(torch.exp(x - peak).sum(0)) + peak[0]


def _negative_log_likelihood(
    log_probs: torch.Tensor,
    labels: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int,
) -> torch.Tensor:
    """Per sample ``-log p(target | log_probs)`` (``[N]``) by the alpha
    recursion (module docstring)."""
    steps, batch, classes = log_probs.shape
    device = log_probs.device
    states = 2 * labels.shape[1] + 1
    low = _unreachable(log_probs.dtype)
    label_lengths = target_lengths.to(torch.int64)
    lengths = input_lengths.to(torch.int64)
    # Extended labels: blank, l1, blank, l2, ..., blank.
    blanks = torch.full_like(labels, blank)
    extended = torch.cat(
        [torch.stack([blanks, labels.clamp(0, classes - 1)], 2).reshape(batch, states - 1),
         torch.full((batch, 1), blank, dtype=torch.int64, device=device)],
        1,
    )
    state = torch.arange(states, device=device).unsqueeze(0)
    valid = state < (2 * label_lengths + 1).unsqueeze(1)
    # The skip s-2 -> s: onto a label (odd s) unlike the one before it; as
    # an additive penalty (one op per step).
    skip = torch.cat(
        [torch.zeros((batch, min(2, states)), dtype=torch.bool, device=device),
         extended[:, 2:] != extended[:, :-2]],
        1,
    )
    skip_penalty = torch.where(skip, torch.zeros((), dtype=log_probs.dtype), torch.full((), low, dtype=log_probs.dtype))
    emissions = log_probs.gather(2, extended.unsqueeze(0).expand(steps, batch, states)).clamp_min(low)
    emissions = torch.where(valid.unsqueeze(0), emissions, torch.full_like(emissions, low))
    # t = 0: the first blank or the first label.
    alpha = torch.where(state < 2, emissions[0], torch.full_like(emissions[0], low))
    alphas = [alpha]
    for t in range(1, steps):
        if states >= 3:
            one = torch.constant_pad_nd(alpha[:, :-1], [1, 0], low)
            two = torch.constant_pad_nd(alpha[:, :-2], [2, 0], low) + skip_penalty
        else:  # no label: the blank alone
            one = two = torch.full_like(alpha, low)
        alpha = _logsumexp_first(torch.stack([alpha, one, two], 0)) + emissions[t]
        alphas.append(alpha)
    # Each sample's alpha at t = input_length - 1; input_length == 0:
    # likelihood 1 in state 0 (an empty target), none elsewhere.
    last_step = (lengths - 1).clamp(0, steps - 1).reshape(1, batch, 1).expand(1, batch, states)
    final = torch.stack(alphas, 0).gather(0, last_step)[0]
    empty = torch.where(state == 0, torch.zeros_like(final), torch.full_like(final, low))
    final = torch.where((lengths == 0).unsqueeze(1), empty, final)
    # The last label or the blank after it.
    last = torch.stack([2 * label_lengths, (2 * label_lengths - 1).clamp(min=0)], 1)
    ends = final.gather(1, last)
    ends = torch.where(torch.stack([label_lengths >= 0, label_lengths > 0], 1), ends, torch.full_like(ends, low))
    likelihood = _logsumexp_first(ends.transpose(0, 1))
    # Below half the unreachable value: no alignment fits (torch's inf).
    return torch.where(likelihood > low / 2, -likelihood, torch.full_like(likelihood, torch.inf))


def _torch_gradient_term(log_probs: torch.Tensor, input_lengths: torch.Tensor) -> torch.Tensor:
    """Per sample ``[N]`` a term of value 0 whose gradient with respect to
    ``log_probs`` is ``exp(log_probs)`` for ``t < input_length`` (torch's
    backward adds it: module docstring)."""
    steps = log_probs.shape[0]
    finite = torch.isfinite(log_probs)
    safe = torch.where(finite, log_probs, torch.zeros_like(log_probs))
    within = torch.arange(steps, device=log_probs.device).unsqueeze(1) < input_lengths.to(torch.int64).unsqueeze(0)
    weight = torch.where(finite & within.unsqueeze(2), torch.exp(safe), torch.zeros_like(safe)).detach()
    return (weight * (safe - safe.detach())).sum((0, 2))


def ctc_loss(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
    blank: int = 0,
    reduction: int = _MEAN,
    zero_infinity: bool = False,
) -> Any:
    """``aten.ctc_loss.Tensor`` (module docstring); ``NotImplemented``
    (torch's composite then runs) outside the contract."""
    # float32/float64 (eager's CPU kernel's): the unreachable value needs their range.
    if log_probs.dtype not in (torch.float32, torch.float64) or log_probs.dim() not in (2, 3):
        return NotImplemented
    if reduction not in (_NONE, _MEAN, _SUM):
        return NotImplemented
    if targets.is_floating_point() or targets.is_complex() or targets.dim() not in (1, 2):
        return NotImplemented
    batched = log_probs.dim() == 3
    if not batched:
        log_probs, targets = log_probs.unsqueeze(1), targets.unsqueeze(0)
        input_lengths, target_lengths = input_lengths.reshape(1), target_lengths.reshape(1)
    if input_lengths.dim() != 1 or target_lengths.dim() != 1:
        return NotImplemented
    labels = _padded_labels(targets, target_lengths, log_probs.shape[1])
    losses = _negative_log_likelihood(log_probs, labels, input_lengths, target_lengths, blank)
    losses = losses + _torch_gradient_term(log_probs, input_lengths)
    if zero_infinity:
        losses = torch.where(losses == torch.inf, torch.zeros_like(losses), losses)
    if reduction == _MEAN:
        return (losses / target_lengths.to(losses.dtype).clamp_min(1)).mean()
    if reduction == _SUM:
        return losses.sum()
    return losses if batched else losses.squeeze(0)


def ctc_loss_int_list(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: Sequence[int],
    target_lengths: Sequence[int],
    blank: int = 0,
    reduction: int = _MEAN,
    zero_infinity: bool = False,
) -> Any:
    """``aten.ctc_loss.IntList``: the lengths as constants."""
    def as_tensor(values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64, device=log_probs.device)

    return ctc_loss(log_probs, targets, as_tensor(input_lengths), as_tensor(target_lengths), blank, reduction, zero_infinity)


#: ``F.ctc_loss``'s and ``torch.ctc_loss``'s parameters (``reduction``: a
#: name for the first, torch's enum for the second).
_CALL_SIGNATURE = inspect.signature(
    lambda log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False: None
)
_REDUCTIONS = {"none": _NONE, "mean": _MEAN, "sum": _SUM}


def is_ctc_loss_call(func: Any) -> bool:
    """Whether ``func`` (what a ``TorchFunctionMode`` sees) is
    ``F.ctc_loss`` or ``torch.ctc_loss``."""
    return func is torch.nn.functional.ctc_loss or func is torch.ctc_loss


def ctc_loss_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call of ``F.ctc_loss`` or ``torch.ctc_loss`` (a ``TorchFunctionMode``
    sees either) as the decomposition, above autograd: for the training
    capture, whose ``make_fx`` does not apply the table to composite ops
    before autograd (the composite then reaches ``_ctc_loss.Tensor``).
    Outside the contract, the call itself."""
    bound = _CALL_SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    reduction = values["reduction"]
    reduction = _REDUCTIONS.get(reduction, reduction) if isinstance(reduction, str) else reduction
    result = NotImplemented
    if isinstance(values["log_probs"], torch.Tensor) and isinstance(values["targets"], torch.Tensor):
        lengths = (values["input_lengths"], values["target_lengths"])
        decomposition = ctc_loss if all(isinstance(v, torch.Tensor) for v in lengths) else ctc_loss_int_list
        result = decomposition(values["log_probs"], values["targets"], *lengths,
                               int(values["blank"]), reduction, bool(values["zero_infinity"]))
    return func(*args, **kwargs) if result is NotImplemented else result


def ctc_loss_decompositions() -> dict[Any, Any]:
    """The table of this module's decompositions by op."""
    return {aten.ctc_loss.Tensor: ctc_loss, aten.ctc_loss.IntList: ctc_loss_int_list}
