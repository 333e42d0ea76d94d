"""Decompositions the training capture applies while it traces a step.

The import decomposes every graph with torch-mlir's table
(:func:`hloalias.frontend.importer.decompose`).  Several kinds of backward
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
  1-d one fails on a leftover ``torch.constant.bool``), every dilated one
  (DeepLab's atrous convolutions) and every transposed one (UNet and VAE
  decoders: the adjoint of a forward convolution);
- average pooling (``avg_pool2d_backward``, ``avg_pool3d_backward``): a
  transposed convolution with a kernel of ones over the gradient divided
  by torch's divisors (:func:`average_pool_backward`);
  ``_adaptive_avg_pool2d_backward`` with an output other than ``1 x 1``:
  one averaging matrix per dimension; the max poolings torch-mlir does not
  differentiate (``adaptive_max_pool2d/3d_backward``,
  ``max_pool3d_with_indices_backward``): a scatter-add at the argmax
  indices;
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
import math
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
        aten.avg_pool2d_backward.default: average_pool_backward(2),
        aten.avg_pool3d_backward.default: average_pool_backward(3),
        aten._adaptive_avg_pool2d_backward.default: adaptive_average_pool_backward,
        aten.adaptive_max_pool2d_backward.default: max_pool_backward_by_indices(2),
        aten.adaptive_max_pool3d_backward.default: max_pool_backward_by_indices(3),
        aten.max_pool3d_with_indices_backward.default: max_pool_backward_by_indices(3),
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
    convolution with ``groups > 1``, or dilated, or of any number of
    spatial dimensions but two, in forward convolutions, and of every
    transposed convolution (:func:`_transposed_convolution_backward`);
    anything else returns ``NotImplemented`` (``make_fx`` then records the
    operator and torch-mlir decomposes it, correctly for undilated 2-d
    ones with ``groups == 1``; its 1-d lowering fails, as in Whisper's
    encoder, and so does its lowering of a dilated one).

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
    if transposed:
        return _transposed_convolution_backward(
            grad_output, input, weight, stride, padding, dilation, groups, output_mask
        )
    if groups == 1 and spatial == 2 and all(d == 1 for d in dilation):
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


def _transposed_convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    output_mask: Sequence[bool],
) -> Any:
    """``convolution_backward`` of a transposed convolution (``ConvTranspose``:
    UNet and VAE decoders), which torch-mlir does not lower to StableHLO.  A
    transposed convolution is the adjoint of the forward convolution with
    the same weight (``[C_in, C_out/g, k...]`` is that convolution's
    ``[out, in/g, k...]``), stride, padding, dilation and groups, so:

    - input gradient: that forward convolution of ``grad_output``;
      ``output_padding`` only added rows the forward convolution never
      reads, so its output has the input's size;
    - weight gradient: the weight gradient of that forward convolution
      whose input is ``grad_output`` and whose output gradient is
      ``input`` (a non-transposed ``convolution_backward``, decomposed by
      :func:`grouped_convolution_backward` or lowered by torch-mlir);
    - bias gradient: ``grad_output`` summed over batch and space."""
    spatial = input.dim() - 2
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = aten.convolution.default(
            grad_output, weight, None, stride, padding, dilation, False, [0] * spatial, groups
        )
    if output_mask[1]:
        grad_weight = aten.convolution_backward.default(
            input, grad_output, weight, None, stride, padding, dilation, False, [0] * spatial, groups,
            [False, True, False],
        )[1]
    if output_mask[2]:
        grad_bias = grad_output.sum([0, *range(2, 2 + spatial)])
    return grad_input, grad_weight, grad_bias


def average_pool_backward(spatial: int) -> Callable[..., torch.Tensor]:
    """``avg_pool2d_backward``/``avg_pool3d_backward`` (``spatial`` 2 or 3:
    ``nn.AvgPool2d``,
    ``F.avg_pool1d``, PoolFormer's token mixer, DenseNet's transitions),
    which torch-mlir does not lower to StableHLO.  Each output's gradient
    divided by its window's divisor is spread over the window: a transposed
    convolution with a kernel of ones, stride ``stride`` and no padding,
    over ``[N*C, 1, out...]``, whose result is in padded coordinates
    (window ``j`` covers ``[j*s, j*s + k)``); the input's gradient is its
    ``[p, p + size)`` part (zero-extended where the last windows end
    before it).  The divisor is torch's: ``divisor_override``; else the
    product over dimensions of the window's length inside the padded input
    (``count_include_pad``) or inside the input itself, ceil-mode windows
    past the padded end counting only what they cover.  Unbatched inputs
    (``[C, H, W]``) too."""

    def backward(
        grad_output: torch.Tensor,
        input: torch.Tensor,
        kernel_size: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[int],
        ceil_mode: bool,  # read from the gradient's shape
        count_include_pad: bool,
        divisor_override: int | None,
    ) -> torch.Tensor:
        # Imported on first use: the entry points load no decomposition
        # tables (test_lazy_imports.py).
        from hloalias.frontend.decompositions import _tuple

        kernel = _tuple(kernel_size, spatial)
        steps = _tuple(stride, spatial) if stride else kernel  # an empty stride is the kernel's
        pads = _tuple(padding, spatial)
        out_size = list(grad_output.shape[-spatial:])
        in_size = list(input.shape[-spatial:])
        lead = list(grad_output.shape[:-spatial])
        grad = grad_output.reshape(-1, 1, *out_size)
        if divisor_override:
            grad = grad / divisor_override
        else:
            divisor = torch.ones((), dtype=grad.dtype, device=grad.device)
            for d in range(spatial):
                start = torch.arange(out_size[d], device=grad.device) * steps[d]
                if count_include_pad:
                    length = torch.clamp(start + kernel[d], max=in_size[d] + 2 * pads[d]) - start
                else:
                    length = torch.clamp(start + kernel[d], max=in_size[d] + pads[d]) - torch.clamp(start, min=pads[d])
                shape = [1] * (spatial + 2)
                shape[2 + d] = out_size[d]
                length = length.to(grad.dtype).reshape(shape)
                divisor = divisor * length
            grad = grad / divisor
        ones = torch.ones([1, 1, *kernel], dtype=grad.dtype, device=grad.device)
        spread = aten.convolution.default(grad, ones, None, steps, [0] * spatial, [1] * spatial, True, [0] * spatial, 1)
        for d in range(spatial):
            needed = pads[d] + in_size[d]
            have = spread.shape[2 + d]
            if have < needed:
                pad = [0, 0] * (spatial - 1 - d) + [0, needed - have]
                spread = aten.constant_pad_nd.default(spread, pad, 0.0)
            spread = spread.narrow(2 + d, pads[d], in_size[d])
        result: torch.Tensor = spread.reshape(*lead, *in_size)
        return result

    return backward


def adaptive_average_pool_backward(grad_output: torch.Tensor, input: torch.Tensor) -> Any:
    """``_adaptive_avg_pool2d_backward`` (``nn.AdaptiveAvgPool2d((3, 3))``,
    pyramid pooling), which torch-mlir does not lower to StableHLO; a
    ``1 x 1`` output keeps the path it has (``NotImplemented``).  Output
    ``o`` of a dimension of size ``n -> m`` averages input
    ``[floor(o n / m), ceil((o + 1) n / m))``: the pooling is a product of
    one ``[m, n]`` averaging matrix per dimension, exact integer windows,
    so the gradient is ``A_h^T @ grad @ A_w``."""
    out_h, out_w = grad_output.shape[-2:]
    if out_h == 1 and out_w == 1:
        return NotImplemented
    in_h, in_w = input.shape[-2:]
    # Imported on first use: the entry points load no decomposition tables
    # (test_lazy_imports.py).
    from hloalias.frontend.decompositions import _adaptive_weights

    along_w = torch.matmul(grad_output, _adaptive_weights(in_w, out_w, grad_output.dtype))
    return torch.matmul(_adaptive_weights(in_h, out_h, grad_output.dtype).transpose(0, 1), along_w)


def max_pool_backward_by_indices(spatial: int) -> Callable[..., torch.Tensor]:
    """The backward of a max pooling over ``spatial`` dimensions that
    returned its argmax ``indices`` as its last argument
    (``adaptive_max_pool2d/3d_backward(grad, input, indices)``,
    ``max_pool3d_with_indices_backward(grad, input, kernel, stride, padding,
    dilation, ceil_mode, indices)``), which torch-mlir does not lower: each
    output's gradient added at its index, flat over the input's spatial
    dimensions per image and channel (torch's indices are flat there)."""

    def backward(grad_output: torch.Tensor, input: torch.Tensor, *args: Any) -> torch.Tensor:
        indices = args[-1]
        lead = list(input.shape[: input.dim() - spatial])
        flat = grad_output.new_zeros([*lead, math.prod(input.shape[input.dim() - spatial:])])
        added = flat.scatter_add(-1, indices.reshape(*lead, -1), grad_output.reshape(*lead, -1))
        return added.reshape(input.shape)

    return backward
