"""Output assembly: a call's results as the torch values eager returns.

- A result of the program becomes a tensor over its runtime buffer
  (:func:`direct_outputs` for a plan whose outputs are all results; on CPU
  a buffer lent to torch: :mod:`hloalias.runtime.ownership`).
- A result the ``eliminate-view-results`` pass removed comes back as a
  real torch view of its base (an input, the state or another result),
  rebuilt from the recorded geometry (:class:`_Rebuild`): :func:`_view_of`
  of the base, in the caller's strides where they differ
  (:mod:`hloalias.runtime.strided_views`).  A constant output is the
  recorded constant.
- Outputs take the program's output structure (a tensor, a flat tuple, or
  the pytree ``out_spec``).

Contract: assembly reads the committed call (the state slots' new
buffers, the caller tensors' new values); it changes no state, so an
exception here leaves the module state the call's
(:mod:`hloalias.runtime.execution`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import torch
import torch.utils._pytree as pytree

from hloalias.errors import ExecutionError
from hloalias.runtime.ownership import DeviceTensor, _host_result, _itemsize, _result_tensor, array_to_torch
from hloalias.runtime.plan import _CallPlan, _Rebuild
from hloalias.runtime.strided_views import strided_view_of

if TYPE_CHECKING:
    from hloalias.runtime.executable import Executable


def _structured(exe: "Executable", flat: list[Any]) -> Any:
    """``flat`` outputs in the program's output structure."""
    if exe._flat_outputs:
        return flat[0] if exe._single_output else tuple(flat)
    return pytree.tree_unflatten(flat, exe._signature.out_spec)


def direct_outputs(exe: "Executable", plan: _CallPlan, outputs: Sequence[jax.Array]) -> Any:
    """The outputs of a call whose every output is a result of the program
    (``plan.direct_outputs``): a tensor over each result's buffer."""
    if plan.host_results:
        flat = [_host_result(outputs[result.position], result) for result in plan.outputs]
    else:
        flat = [array_to_torch(outputs[result.position]) for result in plan.outputs]
    # _structured inline: every Python-path call comes here.
    if exe._flat_outputs:
        return flat[0] if exe._single_output else tuple(flat)
    return pytree.tree_unflatten(flat, exe._signature.out_spec)


def assemble_outputs(
    exe: "Executable", inputs: dict[int, Any], arg_tensors: dict[int, Any], produced: dict[str, jax.Array]
) -> Any:
    """The outputs of a call in general: results (``produced``, by key),
    constants, and rebuilt views of their bases; ``arg_tensors`` are the
    tensors views of user inputs are views of (the caller's tensor, or the
    resolved copy it was read through)."""
    torch_results: dict[str, Any] = {}

    def base_tensor(key: str) -> Any:
        kind, index = exe._rebuild_bases[key]
        if kind == "output":
            return result(key)
        state_name = exe._arg_plan[index][1]
        if state_name is not None:
            return array_to_torch(exe._state_array(state_name))
        value = inputs[index]
        return value.to_torch() if isinstance(value, DeviceTensor) else arg_tensors[index]

    def result(key: str) -> Any:
        if key in torch_results:
            return torch_results[key]
        if key in produced:
            value = _result_tensor(produced[key])
        elif key in exe._constant_outputs:
            value = exe._constant_outputs[key]
        else:
            rebuild = exe._rebuilds[key]
            if rebuild.base is None:
                value = None
            else:
                base = base_tensor(rebuild.base)
                same = rebuild.identity and base.dtype == rebuild.dtype
                value = base if same else _view_of(base, rebuild)
                if value.requires_grad:
                    # Compiled results never carry autograd history:
                    # a pass-through of a grad input is its detach().
                    value = value.detach()
        torch_results[key] = value
        return value

    return _structured(exe, [result(key) for key in exe._output_keys])


def input_views(exe: "Executable", recipes: tuple[tuple[int, _Rebuild], ...], inputs: dict[int, Any]) -> Any:
    """The outputs of a program that is not run and returns only user
    inputs and same-dtype views of them (``_CallPlan.input_views``), as
    :func:`assemble_outputs` makes them for plain row-major tensors without
    grad or lazy bits: the input itself, or ``as_strided`` on it.  None
    (nothing done) for any other input: the caller takes the general
    path."""
    flat = []
    for index, rebuild in recipes:
        value = inputs[index]
        if (
            type(value) is not torch.Tensor or value.requires_grad or value.is_conj() or value.is_neg()
            or not value.is_contiguous()
        ):
            return None
        flat.append(value if rebuild.identity else value.as_strided(
            rebuild.sizes, rebuild.strides, value.storage_offset() + rebuild.offset
        ))
    return _structured(exe, flat)


def _view_base(value: Any, fallback: Any) -> Any:
    """The tensor a rebuilt view of user input ``value`` is a view of: the
    caller's tensor itself, whatever its strides (as in eager), unless it
    carries a lazy conjugate/negative bit (its storage then holds other
    values than it shows): then ``fallback``, the resolved copy."""
    if isinstance(value, torch.Tensor) and not value.is_conj() and not value.is_neg():
        return value
    return fallback


def _view_of(base: torch.Tensor, rebuild: _Rebuild) -> torch.Tensor:
    """The removed result as a view of ``base``.  The recorded geometry is
    in ``base``'s row-major layout; a caller's tensor laid out otherwise
    (``y.t()``, channels-last) gets the view of its own storage that holds
    the same elements (:func:`strided_view_of`; for a view to another
    dtype, of the caller's tensor reinterpreted as eager's ``view(dtype)``
    does), as eager's view does, and only where no strided view holds them
    a view of a row-major copy."""
    if base.is_contiguous():
        return _as_view(base, rebuild)
    caller: torch.Tensor | None = base
    if base.dtype != rebuild.dtype:
        # Eager's ``x.view(dtype)`` reinterprets the caller's own storage: at
        # any strides for a dtype of the same width, and for a narrower one
        # where torch allows it (last dimension contiguous).  The recorded
        # geometry is in the reinterpreted row-major layout.
        assert rebuild.dtype is not None  # only dead results lack one
        try:
            caller = (base.detach() if base.requires_grad else base).view(rebuild.dtype)
        except RuntimeError:
            caller = None
    if caller is not None:
        view = strided_view_of(caller, rebuild.sizes, rebuild.strides, rebuild.offset)
        if view is not None:
            return view
    return _as_view(base.contiguous(), rebuild)


def _as_view(base: torch.Tensor, rebuild: _Rebuild) -> torch.Tensor:
    """The removed result as a view of ``base``'s storage; offset, sizes and
    strides are in elements of the result's dtype (which may differ from
    the base's in width: ``x.view(torch.int8)``)."""
    assert rebuild.dtype is not None  # only dead results lack one
    if base.dtype == rebuild.dtype:
        return base.as_strided(rebuild.sizes, rebuild.strides, base.storage_offset() + rebuild.offset)
    itemsize = _itemsize(rebuild.dtype)
    start = base.storage_offset() * base.element_size()
    if start % itemsize:
        raise ExecutionError(f"cannot rebuild a {rebuild.dtype} view at byte {start} of its base")
    view = torch.empty(0, dtype=rebuild.dtype, device=base.device)
    view.set_(base.untyped_storage(), start // itemsize + rebuild.offset, rebuild.sizes, rebuild.strides)
    return view
