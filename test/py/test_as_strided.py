"""``Tensor.as_strided`` (issue 25, item 4): it addresses a tensor's
*storage*, which a compiled program does not have.  torch-mlir turns a read
through it into a gather at the element positions of the example's layout,
so hloalias

- refuses a returned ``as_strided`` view (or a view of one), of an input or
  of module state: eager returns a view sharing memory, the program would
  return a copy, and writes through it would not reach the base (it did,
  silently);
- lowers a write through one (and ``as_strided_scatter``) at the example
  layout's storage positions, with the same layout check as a read;
- computes with one as eager does, and checks at every call that an input
  read through it is laid out as the example was (strides, and storage
  offset where the call gives one): another layout holds other elements at
  those positions, and the program gave the example layout's values
  silently.

Eager behaviour each refusal rests on is pinned here too."""

from __future__ import annotations

import pytest
import torch

import hloalias
from hloalias import ExecutionError, TorchImportError


def _window(x: torch.Tensor) -> torch.Tensor:
    return x.as_strided((2, 2), (1, 2), 1)


class _StateWindow(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.arange(8.0))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.buf.as_strided((3,), (2,), 1) + y


class _ReturnsStateWindow(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.arange(8.0))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        self.buf.add_(y.sum())
        return self.buf.as_strided((2, 2), (2, 1), 2)


def test_eager_as_strided_is_a_view_at_an_absolute_storage_offset() -> None:
    """What the refusals rest on: a view (writes reach the base), and an
    explicit storage_offset counts from the storage's start, not the view's."""
    x = torch.arange(8.0)
    window = _window(x)
    assert window._base is x
    window.add_(100.0)
    assert x[1].item() == 101.0
    storage = torch.arange(10.0)
    assert _window(storage[2:]).tolist() == [[1.0, 3.0], [2.0, 4.0]]  # storage[1], not view[1]


def test_returned_as_strided_view_of_an_input_is_refused() -> None:
    x = torch.arange(8.0)
    with pytest.raises(TorchImportError) as info:
        hloalias.compile(_window, (x,))
    message = str(info.value)
    assert message.startswith("the program returns a tensor's as_strided view (or a view of one) at ")
    assert "in _window: return x.as_strided((2, 2), (1, 2), 1)" in message
    assert torch.equal(x, torch.arange(8.0))


def test_returned_view_of_an_as_strided_view_is_refused() -> None:
    with pytest.raises(TorchImportError, match="returns a tensor's as_strided view"):
        hloalias.compile(lambda x: x.as_strided((2, 3), (3, 1), 1).t()[0], (torch.arange(8.0),))


def test_returned_as_strided_view_of_state_is_refused_and_state_unchanged() -> None:
    module = _ReturnsStateWindow()
    with pytest.raises(TorchImportError, match="returns a tensor's as_strided view"):
        hloalias.compile(module, (torch.ones(2),))
    assert torch.equal(module.buf, torch.arange(8.0))


def test_write_through_as_strided_equals_eager_and_checks_the_layout() -> None:
    """A write through an ``as_strided`` view (``as_strided_scatter`` after
    functionalization) is lowered at the example layout's storage
    positions: it equals eager there, and a call in another layout, where
    eager would write other elements, is refused before anything runs."""
    def write(x: torch.Tensor) -> torch.Tensor:
        x.as_strided((2, 2), (1, 2), 1).fill_(5.0)
        return x.sum()

    exe = hloalias.compile(write, (torch.arange(8.0),))
    x, expected = torch.arange(8.0), torch.arange(8.0)
    assert torch.equal(exe(x), write(expected))
    assert torch.equal(x, expected)
    strided = torch.arange(16.0)[::2]
    with pytest.raises(ExecutionError, match="input 'x' has strides \\[2\\]"):
        exe(strided)
    assert torch.equal(strided, torch.arange(16.0)[::2])


def test_as_strided_scatter_checks_its_input_layout() -> None:
    """``torch.as_strided_scatter`` addresses its input's storage as laid
    out (eager: ``[0, 1, 1, 6, ...]`` for a stride-2 input): another layout
    than the example's is refused, not computed at the example's positions."""
    def scatter(x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.as_strided_scatter(x, src, (2, 2), (1, 2), 1)

    src = torch.ones(2, 2)
    exe = hloalias.compile(scatter, (torch.arange(8.0), src))
    assert torch.equal(exe(torch.arange(8.0), src), scatter(torch.arange(8.0), src))
    strided = torch.arange(16.0)[::2]
    assert torch.equal(scatter(strided, src), torch.tensor([0.0, 1, 1, 6, 8, 10, 12, 14]))  # eager, pinned
    with pytest.raises(ExecutionError, match="input 'x' has strides \\[2\\]"):
        exe(strided, src)


def test_returned_clone_of_an_as_strided_window_equals_eager() -> None:
    """A copy asked for is a copy: values as eager's, new storage."""
    def window_copy(x: torch.Tensor) -> torch.Tensor:
        return x.as_strided((2, 2), (1, 2), 1).clone() * 2

    x = torch.arange(8.0)
    executable = hloalias.compile(window_copy, (x.clone(),))
    torch.testing.assert_close(executable(x), window_copy(x), rtol=0, atol=0)


def test_as_strided_of_state_with_storage_offset_equals_eager() -> None:
    eager, compiled_module = _StateWindow(), _StateWindow()
    executable = hloalias.compile(compiled_module, (torch.ones(3),))
    for _ in range(2):
        y = torch.randn(3)
        torch.testing.assert_close(executable(y), eager(y), rtol=0, atol=0)


def test_input_in_another_storage_layout_is_refused() -> None:
    """Compiled on a dense example; called with a view at storage offset 2,
    eager reads storage[1], storage[3], ... and the program read x[1],
    x[3], ...: a different answer, given silently before the check."""
    def window_sum(x: torch.Tensor) -> torch.Tensor:
        return _window(x) * 1

    executable = hloalias.compile(window_sum, (torch.arange(8.0),))
    storage = torch.arange(10.0)
    with pytest.raises(ExecutionError) as info:
        executable(storage[2:])
    message = str(info.value)
    assert message.startswith("input 'x' has strides [1] and storage offset 2; the program reads it through as_strided")
    assert "compiled for strides [1] and storage offset 0 (the example's)" in message
    transposed = torch.arange(16.0).reshape(2, 8).t()[:, 0].contiguous()  # dense again: accepted
    torch.testing.assert_close(executable(transposed), window_sum(transposed), rtol=0, atol=0)


def test_non_row_major_input_equals_eager_in_the_example_layout_only() -> None:
    def window_of_matrix(x: torch.Tensor) -> torch.Tensor:
        return x.as_strided((2, 2), (1, 2), 1) + 0

    transposed = torch.arange(8.0).reshape(4, 2).t()
    executable = hloalias.compile(window_of_matrix, (transposed.clone().t().contiguous().t(),))
    torch.testing.assert_close(executable(transposed), window_of_matrix(transposed), rtol=0, atol=0)
    with pytest.raises(ExecutionError, match=r"input 'x' has strides \[4, 1\] and storage offset 0"):
        executable(transposed.contiguous())


def test_as_strided_without_offset_follows_the_inputs_offset() -> None:
    """No explicit storage_offset: positions count from the input's own
    offset, so a view at another offset (same strides) is accepted."""
    def relative(x: torch.Tensor) -> torch.Tensor:
        return x.as_strided((2, 2), (1, 2)) + 0

    executable = hloalias.compile(relative, (torch.arange(8.0),))
    shifted = torch.arange(10.0)[2:]
    torch.testing.assert_close(executable(shifted), relative(shifted), rtol=0, atol=0)
    assert "as_strided" in executable.explain()
