"""Bit-for-bit comparison of nested results (losses, state dicts) for the
tests that promise a rewrite changes no bit: the optimizer decompositions
and the optimizer replay."""

from __future__ import annotations

from typing import Any

import torch


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as integers of its element size (NaNs compare)."""
    integer = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().reshape(-1).view(integer)


def assert_bitwise(a: Any, b: Any) -> None:
    """``a`` and ``b`` (dicts, lists, tuples, tensors, plain values) are equal,
    tensors in dtype, shape and every bit."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_bitwise(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_bitwise(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(bits(a), bits(b))
    else:
        assert a == b
