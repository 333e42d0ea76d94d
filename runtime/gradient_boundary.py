"""Results of an inference program where eager would record autograd.

``hloalias.compile``/``hloalias.jit`` compile a forward program: XLA computes
the results, and no autograd graph connects them to the module's parameters
or to inputs that require grad.  Eager PyTorch returns the same results with
``requires_grad=True`` and a graph; a caller who mixes them into eager
training (a compiled backbone under an eager head, a regulariser added to
the loss) and calls ``backward()`` would silently get no gradient for the
compiled part.

:func:`mark_without_gradient` closes that gap for the module's parameters.
In grad mode, while a parameter of the module requires grad (asked at
each such call: after ``model.requires_grad_(False)`` eager's results
require no grad, and neither do these), every floating or complex result the program computed (not an
input returned as itself, not a view of an input or of state) comes back as a tensor that shares the result's memory and version
counter (``detach()``), requires grad (as eager's does), and whose backward
raises :class:`~hloalias.errors.ExecutionError` naming the program and the
ways to train it (``compile_training_step``, ``torch.compile(backend=
"hloalias")``).  Autograd runs that node only when the caller asks for
gradients the results depend on through it (``loss.backward()`` of a loss
that uses them); ``torch.autograd.grad`` of other tensors never runs it.
Under ``torch.no_grad()`` / ``torch.inference_mode()`` nothing is added
(the common inference call); int and bool results never carry gradients.
A view of such a result beside it (``y, y[:, :8]``) is a view of the
marked result.

A result no parameter reaches (a buffer plus one, ``x * 2``, a mask:
:mod:`hloalias.frontend.gradient_dependence`, from the parameters that
required grad when compiled; once another one does, every result counts
as reached) is left as it is, as eager leaves it; a returned view of a parameter (``self.w[1:2]``) is marked as
a computed result is.  Not seen: a result cut from the parameters inside
``forward`` (``y.detach()``, a ``no_grad`` block) is marked all the
same, so a backward through it is refused where eager gives it no
gradient.  A function that closes over a module (its tensors are the
program's constants, which the runtime follows to the module's tensors)
has them counted as parameters: while one requires grad, the results it
reaches are marked.

The same holds for the call's inputs: a floating input that requires grad
marks the results a floating chain from it reaches
(``input_gradient_outputs`` in the signature), with or without
parameters, so a parameter-free function (a loss, an activation) called on
an eager model's activations refuses a ``backward()`` through its results
instead of silently giving the activations no gradient from them.  A
foreign program's signature does not know the chains; its results are not
marked for inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from hloalias.errors import ExecutionError


class _NoGradient(torch.autograd.Function):
    """Identity on the results (as ``detach()``: their memory, not autograd
    views, so in-place edits stay allowed) whose backward refuses."""

    @staticmethod
    def forward(ctx: Any, program: str, anchor: torch.Tensor, *results: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.program = program
        return tuple(result.detach() for result in results)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise ExecutionError(
            f"a result of the compiled program {ctx.program} is part of this backward(), but a compiled "
            "program records no autograd graph: what it was computed from (the module's parameters, inputs that "
            "require grad) would get no gradient from it. "
            "Train through hloalias.compile_training_step or torch.compile(model, backend=\"hloalias\"), "
            "or detach the result (or call the program under torch.no_grad()) if it needs none"
        )


_ANCHOR: list[torch.Tensor] = []


def _anchor() -> torch.Tensor:
    """A leaf that requires grad, so that the results do too."""
    if not _ANCHOR:
        with torch.inference_mode(False):
            _ANCHOR.append(torch.zeros((), requires_grad=True))
    return _ANCHOR[0]




def mark_without_gradient(
    outputs: Any, program: str, call: tuple[Any, ...], keep: Sequence[Any] = (), free: frozenset[int] | None = None,
    reached: frozenset[int] | None = None,
) -> Any:
    """``outputs`` with each floating or complex result the program computed
    (not a view: ``_base`` is None) replaced as the module docstring says,
    and each view of such a result (``y[:, :8]`` beside ``y``) made a view of
    its replacement.  Left as they are: results that already require grad,
    the call's own tensors (``call``: its arguments, returned as
    themselves) and views of them (they follow the input, as in eager), the
    objects in ``keep`` (returned as themselves: the caller's transformers
    caches), and the leaves at the positions in ``free`` (outputs no
    parameter reaches: the signature's ``parameter_free_outputs``, whose
    positions are the outputs' leaves; given only without ``keep``).  When
    ``free`` is given, a view at another position whose base is not a
    result or an argument (a view of a parameter: ``self.w[1:2]``) is
    marked too, sharing its memory, as eager's view requires grad.
    ``reached`` (instead of ``free``): the positions to mark, the others
    left as they are (results reached from inputs that require grad only;
    views follow their bases); a result on an argument's memory (``x[1:]``,
    ``x.detach()``: the functional graph does not tell them apart) is left
    as it is, without grad, as before."""
    if isinstance(outputs, torch.Tensor):  # the common shapes without pytree's cost
        leaves, spec = [outputs], None
    elif type(outputs) is tuple and all(isinstance(output, torch.Tensor) for output in outputs):
        leaves, spec = list(outputs), None
    else:
        leaves, spec = pytree.tree_flatten(outputs, is_leaf=(lambda node: any(node is kept for kept in keep)) if keep else None)
    arguments = _argument_ids(call)
    unmarked = free if free is not None else frozenset()
    candidates = [
        index for index, leaf in enumerate(leaves)
        if isinstance(leaf, torch.Tensor) and id(leaf) not in arguments and index not in unmarked
        and (reached is None or index in reached)
        and not leaf.requires_grad and (leaf.is_floating_point() or leaf.is_complex())
    ]
    if reached is not None and candidates:
        storages = {
            torch._C.TensorBase.untyped_storage(arg).data_ptr()
            for arg in pytree.tree_leaves(call) if isinstance(arg, torch.Tensor)
        }
        candidates = [
            index for index in candidates
            if torch._C.TensorBase.untyped_storage(leaves[index]).data_ptr() not in storages
        ]
    computed = [index for index in candidates if leaves[index]._base is None]
    if free is not None:
        results = {id(leaves[index]) for index in computed}
        computed += [
            index for index in candidates
            if leaves[index]._base is not None and id(leaves[index]._base) not in results
            and id(leaves[index]._base) not in arguments
        ]
    if not computed:
        return outputs
    marked = _NoGradient.apply(program, _anchor(), *(leaves[index] for index in computed))  # type: ignore[no-untyped-call]
    replacement = {id(leaves[index]): result for index, result in zip(computed, marked)}
    for index, result in zip(computed, marked):
        leaves[index] = result
    for index, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) and leaf._base is not None and id(leaf._base) in replacement:
            leaves[index] = replacement[id(leaf._base)].as_strided(leaf.size(), leaf.stride(), leaf.storage_offset())
    if spec is None:
        return leaves[0] if isinstance(outputs, torch.Tensor) else tuple(leaves)
    return pytree.tree_unflatten(leaves, spec)


def _argument_ids(call: tuple[Any, ...]) -> set[int]:
    """The ids of the tensors in the call's ``(args, kwargs)``."""
    args, kwargs = call
    if all(isinstance(arg, torch.Tensor) for arg in args) and not kwargs:
        return {id(arg) for arg in args}
    return {id(leaf) for leaf in pytree.tree_leaves(call) if isinstance(leaf, torch.Tensor)}
