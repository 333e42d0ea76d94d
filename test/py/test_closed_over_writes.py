"""``hloalias.compile`` of a function or module whose forward writes in
place to a tensor it closes over (not a parameter, buffer or input): the
compiled program could not keep the write, so it is refused with a
TorchImportError (``ClosedOverWrite``) naming the op and the line, and
the caller's tensor is as it was.  Before the fix torch.export refused it
("Constant lifted_tensor_0 is mutated") only after its traces had run the
write on the real tensor: a counter closed over went from 0 to 2.
Reading a closed-over tensor stays supported (its value at compile time,
as export bakes it)."""

from __future__ import annotations

import pytest
import torch

import hloalias
from hloalias.errors import HloaliasError, TorchImportError


def test_a_function_writing_a_closed_over_counter_is_refused_unchanged() -> None:
    counter = torch.zeros(())

    def f(x: torch.Tensor) -> torch.Tensor:
        counter.add_(1)
        return x * 2

    with pytest.raises(TorchImportError, match=r"writes in place \(add_\) to a tensor it closes over") as caught:
        hloalias.compile(f, (torch.randn(3),))
    assert isinstance(caught.value, HloaliasError)
    assert "counter.add_(1)" in str(caught.value)
    assert counter.item() == 0.0


class _WritesClosure(torch.nn.Module):
    def __init__(self, cache: torch.Tensor, how: str) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.how = how
        self.cache = [cache]  # not a buffer: a plain Python reference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = self.cache[0]
        y = self.linear(x)
        if self.how == "mul_":
            cache.mul_(2).add_(1)
        elif self.how == "setitem":
            cache[0] = 5.0
        elif self.how == "out":
            torch.add(cache, 1, out=cache)
        else:
            torch.ops.aten.add_.Tensor(cache, torch.ones(3))
        return y


@pytest.mark.parametrize("how", ["mul_", "setitem", "out", "aten_op"])
def test_a_module_writing_a_closed_over_tensor_is_refused_unchanged(how: str) -> None:
    cache = torch.arange(3.0)
    module = _WritesClosure(cache, how)
    before = {name: value.clone() for name, value in module.state_dict().items()}
    with pytest.raises(TorchImportError, match="closes over"):
        hloalias.compile(module, (torch.randn(2, 3),))
    torch.testing.assert_close(cache, torch.arange(3.0), rtol=0, atol=0)
    for name, value in module.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


def test_reading_a_closed_over_tensor_and_writing_a_buffer_still_compile() -> None:
    scale = torch.tensor([1.0, 2.0, 3.0])

    class Reads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)
            local = torch.zeros(3)
            local.add_(x.sum())  # a tensor made in the forward is no closure
            return x * scale + local

    module, x = Reads(), torch.randn(2, 3)
    compiled = hloalias.compile(module, (x,))
    torch.testing.assert_close(compiled(x), x * scale + x.sum())
    assert scale.tolist() == [1.0, 2.0, 3.0]


def test_a_buffer_written_through_another_object_compiles_as_the_buffers_write() -> None:
    """transformers' TorchExportableModuleWithStaticCache registers each cache
    layer's ``cumulative_length`` as a buffer and writes it through the
    layer object (``layer.cumulative_length.copy_(...)``): the tensor is the
    module's own buffer, not a closure, and the write is the buffer's."""

    class Layer:
        def __init__(self) -> None:
            self.length = torch.zeros((), dtype=torch.int64)

    class Cached(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = Layer()
            self.register_buffer("length", self.layer.length, persistent=False)

        def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
            self.layer.length.copy_(position[0])
            return x + 1

    module, x, position = Cached(), torch.randn(2, 3), torch.tensor([5])
    compiled = hloalias.compile(module, (x, position))
    torch.testing.assert_close(compiled(x, position), x + 1)
    compiled(x, torch.tensor([7]))
    assert compiled.state_dict()["length"].item() == 7
