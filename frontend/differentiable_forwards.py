"""Forward operators whose backward torch-mlir cannot lower, run in the
training capture as torch's own decompositions, above autograd, so that
autograd differentiates their parts.

The training capture (:mod:`hloalias.frontend.training`) traces forward,
``backward()`` and the optimizer with ``make_fx``, whose decomposition
table applies below autograd: by then autograd has recorded each
operator's own backward operator.  torch-mlir lowers the forwards of
interpolation, ``grid_sample`` and replication padding but none of their
backwards (``upsample_bilinear2d_backward``, ``upsample_nearest2d_backward``,
``grid_sampler_2d_backward``, ``replication_pad2d_backward``...), so a step
of Segformer, UperNet or any model with ``nn.Upsample`` failed to import.
torch's decompositions of these forwards (``torch._decomp``: index
computations, ``_unsafe_index`` gathers and interpolation weights) are
differentiable compositions: autograd's backward of a gather is a
scatter-add, which lowers.

How: the capture's ``TorchFunctionMode`` sees ``F.interpolate``,
``F.grid_sample`` and ``F.pad`` (every ``nn.Upsample``/``nn.ReplicationPad``
calls one), and :func:`differentiable_call` runs the call with the C
functions they reach (``torch._C._nn.upsample_*``, ``torch.grid_sampler``,
``torch._C._nn.pad`` for ``mode="replicate"``) bound to the
decompositions for the duration of that call.  The capture holds the
tracing lock, so no other trace sees the swap; another thread's eager call
during it computes the same values through the same decomposition.

Not routed (they keep their import error naming the operator): the
antialiased modes (torch has no decomposition of
``_upsample_bilinear2d_aa.default``/``_upsample_bicubic2d_aa.default``),
3-d ``grid_sample`` and ``F.pad``'s other modes (reflect and circular
lower already)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._decomp
import torch.nn.functional as F

aten = torch.ops.aten

#: ``torch._C._nn`` function -> the overload whose decomposition replaces it
#: (the ``vec`` form ``F.interpolate`` calls: output size or scale factors).
_UPSAMPLE_VEC = {
    "upsample_nearest1d": aten.upsample_nearest1d.vec,
    "upsample_nearest2d": aten.upsample_nearest2d.vec,
    "upsample_nearest3d": aten.upsample_nearest3d.vec,
    "_upsample_nearest_exact1d": aten._upsample_nearest_exact1d.vec,
    "_upsample_nearest_exact2d": aten._upsample_nearest_exact2d.vec,
    "_upsample_nearest_exact3d": aten._upsample_nearest_exact3d.vec,
    "upsample_bilinear2d": aten.upsample_bilinear2d.vec,
    "upsample_bicubic2d": aten.upsample_bicubic2d.vec,
    "upsample_trilinear3d": aten.upsample_trilinear3d.vec,
}


def _linear1d_vec(
    input: torch.Tensor, output_size: Any, align_corners: bool, scale_factors: Any
) -> torch.Tensor:
    """``upsample_linear1d.vec`` (torch decomposes only the ``default``
    overload): the output size and scale as the ``vec`` form defines them."""
    from torch._decomp.decompositions import get_scale_value, upsample_compute_output_size

    size = upsample_compute_output_size(input.size(), output_size, scale_factors)  # type: ignore[no-untyped-call]
    decomposition = torch._decomp.decomposition_table[aten.upsample_linear1d.default]
    scale = get_scale_value(scale_factors, 0)  # type: ignore[no-untyped-call]
    return decomposition(input, size, align_corners, scale)  # type: ignore[no-any-return]


def _replacements() -> dict[tuple[Any, str], Callable[..., Any]]:
    table = torch._decomp.decomposition_table
    replacements: dict[tuple[Any, str], Callable[..., Any]] = {
        (torch._C._nn, name): table[op] for name, op in _UPSAMPLE_VEC.items() if op in table
    }
    replacements[(torch._C._nn, "upsample_linear1d")] = _linear1d_vec
    return replacements


def _grid_sampler(original: Callable[..., Any]) -> Callable[..., Any]:
    decomposition = torch._decomp.decomposition_table[aten.grid_sampler_2d.default]

    def grid_sampler(
        input: torch.Tensor, grid: torch.Tensor, mode: int, padding_mode: int, align_corners: bool
    ) -> torch.Tensor:
        if input.dim() == 4:
            return decomposition(input, grid, mode, padding_mode, align_corners)  # type: ignore[no-any-return]
        return original(input, grid, mode, padding_mode, align_corners)  # type: ignore[no-any-return]

    return grid_sampler


_REPLICATION_PADS = {1: aten.replication_pad1d.default, 2: aten.replication_pad2d.default,
                     3: aten.replication_pad3d.default}


def _pad(original: Callable[..., Any]) -> Callable[..., Any]:
    def pad(input: torch.Tensor, pad: Any, mode: str = "constant", value: Any = None) -> torch.Tensor:
        op = _REPLICATION_PADS.get(len(pad) // 2) if mode == "replicate" else None
        if op is not None and op in torch._decomp.decomposition_table:
            return torch._decomp.decomposition_table[op](input, list(pad))  # type: ignore[no-any-return]
        return original(input, pad, mode, value)  # type: ignore[no-any-return]

    return pad


@contextlib.contextmanager
def _decomposed(func: Any) -> Iterator[None]:
    """The C functions ``func`` reaches bound to their decompositions."""
    swaps: dict[tuple[Any, str], Callable[..., Any]]
    if func is F.interpolate:
        swaps = _replacements()
    elif func is F.grid_sample:
        swaps = {(torch, "grid_sampler"): _grid_sampler(torch.grid_sampler)}
    else:
        swaps = {(torch._C._nn, "pad"): _pad(torch._C._nn.pad)}
    saved = {key: getattr(*key) for key in swaps}
    try:
        for (owner, name), replacement in swaps.items():
            setattr(owner, name, replacement)
        yield
    finally:
        for (owner, name), original in saved.items():
            setattr(owner, name, original)


def is_differentiable_forward_call(func: Any) -> bool:
    """Whether ``func`` (what a ``TorchFunctionMode`` sees) is one the
    capture runs decomposed (module docstring)."""
    return func is F.interpolate or func is F.grid_sample or func is F.pad


def differentiable_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` with the operators it reaches decomposed
    above autograd (module docstring)."""
    with _decomposed(func):
        return func(*args, **kwargs)
