"""Output assembly: a result the ``eliminate-view-results`` pass removed
comes back as a real torch view of its base (an input, the state or
another result), rebuilt from the recorded geometry (:class:`_Rebuild`):
:func:`_view_of` of the base, in the caller's strides where they differ
(:mod:`hloalias.runtime.strided_views`)."""

from __future__ import annotations

from typing import Any

import torch

from hloalias.errors import ExecutionError
from hloalias.runtime.ownership import _itemsize
from hloalias.runtime.plan import _Rebuild
from hloalias.runtime.strided_views import strided_view_of

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
