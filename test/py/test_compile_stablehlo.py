"""hloalias.compile_stablehlo: StableHLO that hloalias did not import (JAX's
lowering with chlo and its own aliasing, bytecode, Shardy annotations,
torch-mlir's fx.export_and_import, import_torch's Program) runs with torch
tensors in and out, through hloalias's passes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.scipy.special import erf

import hloalias
from hloalias.errors import DonationError, IRError


def _erf_program(x: np.ndarray, y: np.ndarray) -> tuple[jax.Array, jax.Array]:
    return erf(x) * y, x[0:2]


@pytest.fixture
def inputs() -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(0)
    return (
        generator.standard_normal((3, 4), dtype=np.float32),
        generator.standard_normal((3, 4), dtype=np.float32),
    )


def test_jax_erf_equals_jax(inputs: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = inputs
    lowered = jax.jit(_erf_program).lower(x, y)
    assert "chlo.erf" in lowered.as_text()
    expected = [torch.from_numpy(np.array(v)) for v in jax.jit(_erf_program)(x, y)]
    for source in (lowered, lowered.as_text()):
        exe = hloalias.compile_stablehlo(source)
        product, rows = exe(torch.from_numpy(x), torch.from_numpy(y))
        assert isinstance(product, torch.Tensor) and isinstance(rows, torch.Tensor)
        # XLA computes chlo.erf as it does for JAX: the same bits.
        assert torch.equal(product, expected[0])
        assert torch.equal(rows, expected[1])


def test_bytecode(inputs: tuple[np.ndarray, np.ndarray]) -> None:
    from jax._src.interpreters import mlir as jax_mlir

    x, y = inputs
    bytecode = jax_mlir.module_to_bytecode(jax.jit(_erf_program).lower(x, y).compiler_ir("stablehlo"))
    assert bytecode[:4] == b"ML\xefR"
    product, _ = hloalias.compile_stablehlo(bytecode)(torch.from_numpy(x), torch.from_numpy(y))
    assert torch.equal(product, torch.from_numpy(np.array(jax.jit(_erf_program)(x, y)[0])))


def test_jax_aliasing_becomes_an_explicit_donation(inputs: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = inputs
    lowered = jax.jit(_erf_program, donate_argnums=(1,)).lower(x, y)
    assert "tf.aliasing_output" in lowered.as_text()
    exe = hloalias.compile_stablehlo(lowered)
    assert exe.alias_report is not None
    assert [(a.arg_name, a.origin) for a in exe.alias_report.aliases] == [("arg1", "explicit")]
    assert exe.memory_stats["alias_bytes"] == 48
    product, _ = exe(torch.from_numpy(x), torch.from_numpy(y.copy()))
    assert torch.equal(product, torch.from_numpy(np.array(jax.jit(_erf_program)(x, y)[0])))


def test_donate_by_name_and_names(inputs: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = inputs
    text = jax.jit(_erf_program).lower(x, y).as_text()
    exe = hloalias.compile_stablehlo(text, donate=["y"], names=["x", "y"])
    assert exe.alias_report is not None
    assert [a.arg_name for a in exe.alias_report.aliases] == ["y"]
    with pytest.raises(DonationError, match="unknown tensor 'z'"):
        hloalias.compile_stablehlo(text, donate=["z"], names=["x", "y"])
    with pytest.raises(IRError, match="names has 1 entries"):
        hloalias.compile_stablehlo(text, names=["x"])


def test_views_only_when_asked(inputs: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = inputs
    text = jax.jit(_erf_program).lower(x, y).as_text()
    tx = torch.from_numpy(x)
    _, rows = hloalias.compile_stablehlo(text)(tx, torch.from_numpy(y))
    assert rows.untyped_storage().data_ptr() != tx.untyped_storage().data_ptr()  # JAX's value semantics
    _, rows = hloalias.compile_stablehlo(text, views=True)(tx, torch.from_numpy(y))
    assert rows._base is tx or rows.untyped_storage().data_ptr() == tx.untyped_storage().data_ptr()
    assert torch.equal(rows, tx[0:2])


def test_shardy_single_device() -> None:
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", True)
    try:
        mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:1]), ("x",))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
        lowered = jax.jit(lambda a: jnp.sin(a) * 2, in_shardings=(sharding,), out_shardings=sharding).lower(
            np.ones((4, 3), np.float32)
        )
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)
    assert "sdy.sharding" in lowered.as_text()
    out = hloalias.compile_stablehlo(lowered)(torch.ones(4, 3))
    assert torch.equal(out, torch.sin(torch.ones(4, 3)) * 2)


def test_torch_mlir_fx_export_and_import() -> None:
    from torch_mlir import fx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.GELU())
    x = torch.randn(2, 4)
    module = fx.export_and_import(model, x, output_type="stablehlo")
    exe = hloalias.compile_stablehlo(module)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), model(x))


def test_import_torch_program_unchanged() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    program = hloalias.import_torch(model, (x,))
    before = program.text
    exe = hloalias.compile_stablehlo(program)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), model(x))
    assert program.text == before
    assert "fold-transpose-into-dot-general: 1 transposes folded" in exe.explain()


@pytest.mark.parametrize(
    "source, message",
    [
        ("this is not MLIR", r"<stablehlo>:1:1: error: custom op .this. is unknown"),
        ("module {}", "no 'func.func @main'"),
        (b"ML\xefR\x00garbage", "cannot parse the module"),
        (object(), "cannot read a module from object"),
    ],
)
def test_bad_input_is_an_ir_error(source: object, message: str) -> None:
    with pytest.raises(IRError, match=message):
        hloalias.compile_stablehlo(source)
