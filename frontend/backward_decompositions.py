"""Decompositions the training capture applies while it traces a step.

The import decomposes every graph with torch-mlir's table
(:func:`hloalias.frontend.importer.decompose`).  Three kinds of backward
operators get past that table and torch-mlir then fails on them, so the
capture (``make_fx`` of forward + autograd + optimizer) decomposes them as
it traces; :func:`capture_decompositions` is that table:

- operators with both a CompositeImplicitAutograd and a CPU kernel
  (``silu_backward``, ``mish_backward``): under fake tensors the CPU kernel
  wins, so ``make_fx`` keeps them, and ``run_decompositions`` with the
  table leaves them too (seen for both); torch-mlir does not know them;
- ``max_pool2d_with_indices_backward`` (ResNet's stem): torch-mlir has no
  StableHLO lowering; torch's decomposition scatters the gradient to the
  argmax indices;
- ``convolution_backward`` with ``groups > 1`` (depthwise convolutions:
  ConvNeXt, MobileNet): torch-mlir's own decomposition of the weight
  gradient builds an invalid convolution ("input feature dimension (2) to
  be a multiple of feature_group_count ... 128");
  :func:`grouped_convolution_backward` writes it with valid ones; so too
  every 1-d and 3-d ``convolution_backward`` (torch-mlir's lowering of the
  1-d one fails on a leftover ``torch.constant.bool``);
- ``_weight_norm_interface_backward`` (weight-normed convolutions:
  Wav2Vec2's and HuBERT's positional convolution): torch-mlir does not know
  it; it is written as torch's own ``_weight_norm_differentiable_backward``
  (the formula autograd uses for double backward), which is composite of
  sums, products and quotients.

One more is there for the program XLA gets, not for torch-mlir:
``slice_backward`` with step 1 (the gradient of ``x[..., a:b]``: HF's
``rotate_half``, every split of a fused projection) is a zero pad of the
gradient (:func:`slice_backward_as_pad`).  The reference decomposition
writes it into zeros with ``slice_scatter``, which torch-mlir lowers to a
``stablehlo.scatter`` with one index per slice position: XLA:CPU emits
each as a kernel of its own (plus a copy of the zeros to scatter into),
where a pad fuses into the consumer (the sum of the two halves).  Same
values, bit for bit: a pad and a scatter into zeros write the same
elements.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._decomp

from hloalias.frontend.importer import _decomposition_table

aten = torch.ops.aten


@functools.cache
def capture_decompositions() -> dict[Any, Callable[..., Any]]:
    """(Built once and shared: callers must not modify it.)  The table the
    training capture passes to ``make_fx``; see the module docstring."""
    selected: dict[Any, Callable[..., Any]] = {
        aten.max_pool2d_with_indices_backward.default: torch._decomp.decomposition_table[
            aten.max_pool2d_with_indices_backward.default
        ],
        aten.convolution_backward.default: grouped_convolution_backward,
        aten.slice_backward.default: slice_backward_as_pad,
        aten._weight_norm_interface_backward.default: weight_norm_backward,
    }
    for op, decomposition in _decomposition_table().items():
        name = op._schema.name
        if not torch._C._dispatch_has_kernel(name):  # an overload torch does not register
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(
            name, "CompositeImplicitAutograd"
        ) and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"):
            selected[op] = decomposition
    return selected


def weight_norm_backward(
    grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor, saved_norms: torch.Tensor, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_weight_norm_interface_backward`` as torch's composite of the same
    gradient (``grad_v``, ``grad_g``)."""
    grad_v, grad_g = aten._weight_norm_differentiable_backward.default(grad_w, saved_v, saved_g, saved_norms, dim)
    return grad_v, grad_g


def grouped_convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Sequence[int] | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    output_mask: Sequence[bool],
) -> Any:
    """``aten.convolution_backward`` of a forward (not transposed)
    convolution with ``groups > 1``, or of any number of spatial dimensions
    but two, in forward convolutions; anything else returns
    ``NotImplemented`` (``make_fx`` then records the operator and
    torch-mlir decomposes it, correctly for 2-d ones with ``groups == 1``;
    its 1-d lowering fails, as in Whisper's encoder).

    - input gradient: the transposed convolution of ``grad_output`` with
      ``weight`` (same stride, padding, dilation and groups), with the
      output padding that gives back the input's spatial size;
    - weight gradient: a convolution whose batch is the ``C/g`` channels of
      a group and whose ``g * N`` input channels are the groups' images;
      the kernel is ``grad_output`` with ``O`` output channels and ``N``
      input channels per group; stride and dilation swap roles.  Its output
      ``[C/g, O, k'...]`` (``k' >= k``: positions past the kernel are
      dropped) permuted to ``[O, C/g, k...]`` is the weight gradient;
    - bias gradient: ``grad_output`` summed over batch and space."""
    spatial = input.dim() - 2
    if transposed or (groups == 1 and spatial == 2):
        return NotImplemented
    batch, channels = input.shape[0], input.shape[1]
    out_channels = weight.shape[0]
    kernel = weight.shape[2:]
    out_size = grad_output.shape[2:]
    in_size = input.shape[2:]
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        extra = [
            in_size[i] - ((out_size[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1) + 1)
            for i in range(spatial)
        ]
        grad_input = aten.convolution.default(
            grad_output, weight, None, stride, padding, dilation, True, extra, groups
        )
    if output_mask[1]:
        per_group, out_per_group = channels // groups, out_channels // groups
        space = list(range(3, 3 + spatial))
        images = (
            input.reshape(batch, groups, per_group, *in_size)
            .permute(2, 1, 0, *space)
            .reshape(per_group, groups * batch, *in_size)
        )
        kernels = (
            grad_output.reshape(batch, groups, out_per_group, *out_size)
            .permute(1, 2, 0, *space)
            .reshape(out_channels, batch, *out_size)
        )
        full = aten.convolution.default(
            images, kernels, None, dilation, padding, stride, False, [0] * spatial, groups
        )
        for i in range(spatial):
            full = full.narrow(2 + i, 0, kernel[i])
        grad_weight = full.permute(1, 0, *range(2, 2 + spatial)).contiguous()
    if output_mask[2]:
        grad_bias = grad_output.sum([0, *range(2, 2 + spatial)])
    return grad_input, grad_weight, grad_bias


def slice_backward_as_pad(
    grad_output: torch.Tensor, input_sizes: Sequence[int], dim: int, start: int, end: int, step: int
) -> torch.Tensor:
    """``aten.slice_backward``: with ``step == 1``, ``grad_output`` padded
    with zeros along ``dim`` to ``input_sizes`` (``constant_pad_nd``);
    other steps keep torch's decomposition (zeros, then ``slice_scatter``).
    ``start``/``end`` are normalized as ``slice`` does (negative from the
    end, clamped to the dimension)."""
    rank = len(input_sizes)
    dim = dim + rank if dim < 0 else dim
    size = int(input_sizes[dim])
    if step != 1:
        return torch._decomp.decomposition_table[aten.slice_backward.default](  # type: ignore[no-any-return]
            grad_output, input_sizes, dim, start, end, step
        )
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    pad = [0, 0] * (rank - 1 - dim) + [start, size - end]
    padded: torch.Tensor = aten.constant_pad_nd.default(grad_output, pad, 0.0)
    return padded
