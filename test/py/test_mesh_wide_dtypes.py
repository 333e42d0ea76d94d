"""64-bit dtypes (int64, float64, complex128) keep their type and values
through every way a result leaves the devices: sharded and replicated
outputs on a mesh, views of them rebuilt on the host, module state on a
mesh (its results, ``state_dict()``, ``write_back()``), DeviceTensor
results, and the single-device path they are compared with.

The values do not fit 32 bits (``2**40 + 7``; ``1 + 2**-40``, which
float32 rounds to 1): jax's resharding copy made without x64 kept the
dtype on the array but filled it with 32-bit values, so a sharded int64
result came back as a torch.int32 of other values.  (uint64 does not
reach the runtime: torch-mlir's importer refuses it.)  Several processes:
test_distributed.py (``test_64bit_results_and_state_across_processes_equal_eager``)."""

from __future__ import annotations

from typing import Any

import jax
import pytest
import torch

import hloalias
from hloalias import Mesh
from hloalias.runtime.distributed import _numpy_of
from hloalias.runtime.ownership import array_to_torch, host_copy
from hloalias.runtime.sharding import Placement

WIDE = 2**40 + 7
FINE = 1 + 2**-40

SPECS = {"sharded": ("dp", None), "replicated": (None, None), "one device": None}


def _needs(devices: int) -> None:
    if len(jax.devices("cpu")) < devices:
        pytest.skip(f"fewer than {devices} cpu devices")


def _wide(dtype: torch.dtype, rows: int = 8, columns: int = 1) -> torch.Tensor:
    """Values of ``dtype`` that 32 bits cannot hold."""
    steps = torch.arange(1, rows * columns + 1, dtype=torch.int64).reshape(rows, columns)
    if dtype == torch.int64:
        return steps * WIDE
    if dtype == torch.float64:
        return steps.to(torch.float64) * FINE
    assert dtype == torch.complex128
    real = steps.to(torch.float64) * FINE
    return torch.complex(real, -real * FINE)


def _compile(fn: Any, args: tuple[Any, ...], placement: str, names: tuple[str, ...] = ("x",)) -> Any:
    spec = SPECS[placement]
    if spec is None:
        return hloalias.compile(fn, args)
    _needs(2)
    return hloalias.compile(fn, args, mesh=Mesh((2,), ("dp",)), shardings={name: spec for name in names})


def _assert_exact(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.is_complex():  # XLA's FFT and torch's round differently, far below float32's precision
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _times_three(x: torch.Tensor) -> torch.Tensor:
    return x * 3


def _spectrum(x: torch.Tensor) -> torch.Tensor:
    # complex128 from float64: torch-mlir lowers no complex arithmetic.
    return torch.fft.fft(x, dim=0)


def _program(dtype: torch.dtype) -> tuple[Any, torch.Tensor]:
    """A program whose result has ``dtype``, and its input."""
    if dtype == torch.complex128:
        return _spectrum, _wide(torch.float64)
    return _times_three, _wide(dtype)


@pytest.mark.parametrize("placement", list(SPECS))
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.complex128])
def test_a_64bit_result_keeps_its_dtype_and_values(dtype: torch.dtype, placement: str) -> None:
    fn, x = _program(dtype)
    exe = _compile(fn, (x,), placement)
    for scale in (1, 2):
        batch = x * scale
        _assert_exact(exe(batch), fn(batch))


@pytest.mark.parametrize("placement", list(SPECS))
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_views_of_a_64bit_result_rebuilt_on_the_host_keep_dtype_and_values(dtype: torch.dtype, placement: str) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x * 3
        return y, y[2:6], y.view(-1)

    x = _wide(dtype, 8, 2)
    exe = _compile(fn, (x,), placement)
    assert exe.view_report is not None
    assert [r.key for r in exe.view_report.removed] == ["output:1", "output:2"]  # rebuilt from output 0
    got, want = exe(x), fn(x)
    for g, w in zip(got, want):
        _assert_exact(g, w)


class Counter(torch.nn.Module):
    """An int64 and a float64 buffer updated in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", _wide(torch.int64, 8, 2))
        self.register_buffer("total", _wide(torch.float64, 8, 2))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.count.add_(x)
        self.total.mul_(y)
        return self.count * 2, self.total + 0


@pytest.mark.parametrize("placement", list(SPECS))
def test_64bit_state_results_state_dict_and_write_back_equal_eager(placement: str) -> None:
    eager, module = Counter(), Counter()
    x, y = _wide(torch.int64, 8, 2), torch.full((8, 2), FINE, dtype=torch.float64)
    exe = _compile(module, (x, y), placement, names=("count", "total", "x", "y"))
    for _ in range(2):
        got, want = exe(x, y), eager(x, y)
        for g, w in zip(got, want):
            _assert_exact(g, w)
    state = exe.state_dict()
    _assert_exact(state["count"], eager.count)
    _assert_exact(state["total"], eager.total)
    exe.write_back()
    _assert_exact(module.count, eager.count)
    _assert_exact(module.total, eager.total)
    loaded = {"count": eager.count * 5, "total": eager.total * FINE}
    exe.load_state_dict({name: value.clone() for name, value in loaded.items()})
    state = exe.state_dict()
    _assert_exact(state["count"], loaded["count"])
    _assert_exact(state["total"], loaded["total"])


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.complex128])
def test_a_64bit_device_tensor_and_its_results_keep_dtype_and_values(dtype: torch.dtype) -> None:
    fn, x = _program(dtype)
    held = hloalias.to_device(_wide(dtype))
    assert held.dtype == dtype
    _assert_exact(held.to_torch(), _wide(dtype))
    held = hloalias.to_device(x)
    exe = hloalias.compile(fn, (x,))
    _assert_exact(exe(held), fn(x))
    _assert_exact(exe(exe.to_device(x)), fn(x))


@pytest.mark.parametrize("spec", [("dp", None), (None, None)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.uint64, torch.float64, torch.complex128])
def test_array_to_torch_keeps_64bit_arrays_on_a_mesh(dtype: torch.dtype, spec: tuple[str | None, ...]) -> None:
    """The one way device arrays become torch tensors, on the dtypes no
    program of the suite produces on a mesh (uint64: torch-mlir's importer
    refuses it) as well as the others."""
    _needs(2)
    placement = Placement(None, Mesh((2,), ("dp",)))
    want = _wide(torch.int64).to(dtype) if dtype == torch.uint64 else _wide(dtype)
    array = host_copy(_numpy_of(want), placement.sharding_of(spec))
    _assert_exact(array_to_torch(array), want)


@pytest.mark.parametrize("dtype, bits", [(torch.float64, torch.int64), (torch.int64, torch.float64)])
def test_64bit_bits_of_a_device_tensor_keep_shape_and_bits(dtype: torch.dtype, bits: torch.dtype) -> None:
    """A DeviceTensor passed for a float64 user input stored as its int64
    bits (store-state-as-bits), and the new bits back as float64: the same
    bits, the same shape."""
    from hloalias.runtime.execution import _bits_array

    value = _wide(dtype, 4, 2)
    held = hloalias.to_device(value)
    converted = _bits_array(held.array, bits)
    assert converted.shape == held.array.shape
    _assert_exact(array_to_torch(converted), value.view(bits))
