"""Random ops draw from a key each call passes, drawn from torch's default
generator (frontend/random_key.py, ``rng_key`` in the IR contract):
``torch.manual_seed`` makes compiled runs reproducible, different seeds
draw differently (in fresh processes too), successive calls draw
differently, and the draws have the right distribution.  Before, they drew
from XLA's own generator, which torch's seed does not reach: two processes
seeded differently drew the same dropout masks.

Not expected: eager's bits (torch.compile does not give them either).
Statistical bounds are many standard deviations wide (n = 2**16 draws)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import torch

import hloalias
from hloalias import Mesh
from hloalias.contract import verify
from hloalias.errors import IRError
from hloalias.frontend import import_torch
from hloalias.frontend import random_key
from hloalias.mlir import find_main, new_context, parse_module, print_module
from hloalias.runtime import export_cache


@pytest.fixture(params=["native", "python"])
def call_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Both call paths (``HLOALIAS_NATIVE`` is read when an executable is made)."""
    if request.param == "python":
        monkeypatch.setenv("HLOALIAS_NATIVE", "0")
    yield str(request.param)


class _Dropped(torch.nn.Module):
    def __init__(self, p: float = 0.25, width: int = 64) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(width, width)
        self.drop = torch.nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.linear(x))


def _fresh_compile(model: torch.nn.Module, x: torch.Tensor) -> hloalias.Executable:
    """A compile that neither the executable nor the import cache serves."""
    hloalias.clear_cache()
    export_cache.clear_export_cache()
    return hloalias.compile(copy.deepcopy(model), (x,))


def test_manual_seed_reproduces_draws_across_fresh_compiles(call_path: str) -> None:
    model = _Dropped().train()
    x = torch.randn(32, 64)
    first = _fresh_compile(model, x)
    assert (first._lane is not None) == (call_path == "native"), first._python_only_reason
    assert "random ops: drawn from argument 3 ('rng_key')" in first.explain()
    torch.manual_seed(1)
    a1, a2 = first(x), first(x)
    torch.manual_seed(1)
    assert torch.equal(first(x), a1)  # the same executable, seeded again
    second = _fresh_compile(model, x)
    torch.manual_seed(1)
    b1, b2 = second(x), second(x)
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert not torch.equal(a1, a2)  # successive calls draw anew
    torch.manual_seed(2)
    assert not torch.equal(second(x), a1)


def test_a_program_writing_its_inputs_draws_in_place(call_path: str) -> None:
    """``x.uniform_()`` beside a second input: the call checks that the
    inputs it writes share no memory with the others, and the key (a
    buffer of its own, PJRT's) is not one of those inputs.  Before, the
    check read the key's ``data_ptr`` and the call raised AttributeError."""
    def fill(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.uniform_(2.0, 3.0)
        return x + y

    x, y = torch.zeros(8, 8), torch.ones(8, 8)
    exe = hloalias.compile(fill, (x.clone(), y))
    torch.manual_seed(3)
    out = exe(x, y)
    assert bool(((x >= 2.0) & (x < 3.0)).all())  # written in place, as eager's uniform_
    torch.testing.assert_close(out, x + 1)
    with pytest.raises(hloalias.ExecutionError, match="share memory"):
        exe(x, x)  # the check itself still runs


def test_successive_calls_and_ops_in_one_call_draw_independently(call_path: str) -> None:
    def two_draws(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + torch.rand(4, 1024), x + torch.rand(4, 1024)

    exe = hloalias.compile(two_draws, (torch.zeros(4, 1024),))
    torch.manual_seed(0)
    first, second = exe(torch.zeros(4, 1024))
    third, _ = exe(torch.zeros(4, 1024))
    assert not torch.equal(first, second)  # the state is threaded from one op to the next
    assert not torch.equal(first, third)
    # Independent streams: no correlation between the two ops' draws.
    assert abs(float(torch.corrcoef(torch.stack([first.flatten(), second.flatten()]))[0, 1])) < 0.05


def test_dropout_keeps_one_minus_p_scaled(call_path: str) -> None:
    p = 0.3

    def drop(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x, p, training=True)

    x = torch.ones(256, 256)
    exe = hloalias.compile(drop, (x,))
    torch.manual_seed(0)
    y = exe(x)
    kept = y != 0
    assert abs(float(kept.float().mean()) - (1 - p)) < 0.01  # sd 0.0018
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_uniform_and_normal_draws_have_their_distribution(dtype: torch.dtype) -> None:
    def draws(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            torch.rand(x.shape, dtype=dtype),
            torch.randn(x.shape, dtype=dtype),
            torch.empty_like(x).uniform_(-2.0, 3.0),
        )

    x = torch.zeros(256, 256, dtype=dtype)
    exe = hloalias.compile(draws, (x,))
    torch.manual_seed(0)
    uniform, normal, scaled = (t.double() for t in exe(x))
    assert uniform.min() >= 0 and uniform.max() < 1
    assert abs(float(uniform.mean()) - 0.5) < 0.01 and abs(float(uniform.var()) - 1 / 12) < 0.01
    assert abs(float(normal.mean())) < 0.02 and abs(float(normal.std()) - 1) < 0.02
    assert scaled.min() >= -2 and scaled.max() <= 3 and abs(float(scaled.mean()) - 0.5) < 0.05
    # Every value of the uniform's 2**mantissa grid is reachable: not a few distinct ones.
    assert uniform.unique().numel() > min(2 ** {torch.float16: 10, torch.bfloat16: 7}.get(dtype, 16) // 2, 1000)


def _train_dropped(seed: int, mesh: Mesh | None = None) -> list[float]:
    """Four steps of a model with dropout after ``torch.manual_seed(seed)``."""
    model = _Dropped(p=0.5, width=16).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    generator = torch.Generator().manual_seed(7)
    batch = (torch.randn(8, 16, generator=generator), torch.randn(8, 16, generator=generator))
    shardings = {0: ("dp", None), 1: ("dp", None)} if mesh is not None else None
    train = hloalias.compile_training_step(step, model, optimizer, batch, mesh=mesh, shardings=shardings)
    torch.manual_seed(seed)
    return [float(train(*batch)) for _ in range(4)]


def test_training_step_with_dropout_reproduces_under_manual_seed() -> None:
    first = _train_dropped(1)
    assert _train_dropped(1) == first
    assert _train_dropped(2) != first
    assert len(set(first)) == len(first)  # each step draws its own masks


def test_training_step_on_a_mesh_draws_as_on_one_device() -> None:
    if len(__import__("jax").devices("cpu")) < 2:
        pytest.skip("fewer than 2 cpu devices")
    mesh = Mesh((2,), ("dp",), platform="cpu")
    first = _train_dropped(1, mesh)
    assert _train_dropped(1, mesh) == first
    assert _train_dropped(2, mesh) != first
    # The same masks as one device's: the losses differ by the all-reduce's rounding only.
    torch.testing.assert_close(torch.tensor(first), torch.tensor(_train_dropped(1)), rtol=1e-5, atol=1e-6)


def test_mesh_draws_follow_the_seed_and_match_one_device() -> None:
    if len(__import__("jax").devices("cpu")) < 2:
        pytest.skip("fewer than 2 cpu devices")

    def drop(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x, 0.5, training=True)

    x = torch.ones(8, 64)
    one = hloalias.compile(drop, (x,))
    mesh = hloalias.compile(drop, (x,), mesh=Mesh((2,), ("dp",), platform="cpu"), shardings={"x": ("dp", None)})
    assert 'hloalias.kind = "rng_key", hloalias.name = "rng_key", mhlo.sharding = "{replicated}"' in mesh.mlir
    torch.manual_seed(3)
    expected = one(x)
    torch.manual_seed(3)
    drawn = mesh(x)
    assert torch.equal(drawn, expected)
    assert not torch.equal(drawn[:4], drawn[4:])  # the shards do not share a mask
    torch.manual_seed(3)
    assert torch.equal(mesh(x), expected)


def test_the_key_cannot_be_sharded() -> None:
    def drop(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x, 0.5, training=True)

    with pytest.raises(hloalias.ShardingError, match="'rng_key', the key the program's random ops draw from"):
        hloalias.compile(drop, (torch.ones(8, 4),), mesh=Mesh((2,), ("dp",), platform="cpu"),
                         shardings={"rng_key": ("dp",)})


def test_dynamo_backend_draws_follow_the_seed() -> None:
    model = _Dropped().train()
    compiled = torch.compile(model, backend="hloalias")
    x = torch.randn(8, 64)
    with torch.no_grad():
        torch.manual_seed(5)
        first = compiled(x)
        torch.manual_seed(5)
        again = compiled(x)
        following = compiled(x)
    assert torch.equal(first, again)
    assert not torch.equal(first, following)


_CHILD = textwrap.dedent(
    """
    import hashlib, sys, torch, hloalias

    def drop(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.randn(x.shape)

    x = torch.ones(64, 64)
    exe = hloalias.compile(drop, (x,))
    torch.manual_seed(int(sys.argv[1]))
    print("DRAWN", hashlib.sha256(exe(x).numpy().tobytes()).hexdigest(), exe.program_cache)
    """
)


def _child(tmp_path: object, seed: int, cache_dir: str) -> tuple[str, str]:
    path = os.path.join(str(tmp_path), "child.py")  # a file: the program cache keys its source
    with open(path, "w") as handle:
        handle.write(_CHILD)
    env = dict(os.environ, HLOALIAS_CACHE_DIR=cache_dir)
    env.pop("HLOALIAS_CACHE", None)
    done = subprocess.run([sys.executable, path, str(seed)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    line = [line for line in done.stdout.splitlines() if line.startswith("DRAWN")][0]
    _, digest, status = line.split(" ", 2)
    return digest, status


def test_fresh_processes_draw_by_their_seed_also_from_the_program_cache(tmp_path: object) -> None:
    cache_dir = os.path.join(str(tmp_path), "cache")
    one, status = _child(tmp_path, 1, cache_dir)
    assert "hit" not in status
    one_again, status = _child(tmp_path, 1, cache_dir)
    assert "hit" in status, status  # the final module came from disk: the key is no constant in it
    two, _ = _child(tmp_path, 2, cache_dir)
    assert one_again == one
    assert two != one


def test_a_program_without_random_ops_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    def affine(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x * 2 + 1, 0.5, training=False)

    x = torch.randn(4, 4)
    text = import_torch(affine, (x,)).text
    monkeypatch.setattr(random_key, "thread_rng_key", lambda module: False)
    assert import_torch(affine, (x,)).text == text
    assert "rng" not in text
    exe = hloalias.compile(affine, (x,))
    assert exe._rng_key is None and "rng_key" not in exe.mlir
    torch.manual_seed(0)
    assert torch.equal(exe(x), x * 2 + 1)


def test_the_import_records_the_key_in_the_contract() -> None:
    def noisy(x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn(3, 4)

    program = import_torch(noisy, (torch.zeros(3, 4),))
    assert [a.kind for a in program.signature.arguments] == ["user_input", "rng_key"]
    assert program.signature.user_input_indices() == [0]
    text = program.text
    assert "stablehlo.rng " not in text and text.count("stablehlo.rng_bit_generator") == 2
    assert 'tensor<2xi64> {hloalias.kind = "rng_key", hloalias.name = "rng_key"}' in text
    exe = hloalias.compile(noisy, (torch.zeros(3, 4),))
    with pytest.raises(hloalias.ExecutionError):
        exe(torch.zeros(3, 4), torch.zeros(2, dtype=torch.int64))  # the key is not the caller's to pass


_KEYED = """
func.func @main(%arg0: tensor<3xf32> {hloalias.kind = "user_input", hloalias.name = "x"},
                %arg1: KEY_TYPE {hloalias.kind = "rng_key", hloalias.name = "rng_key"KEY_ATTRS}) -> tensor<3xf32> {
  return %arg0 : tensor<3xf32>
}
"""


@pytest.mark.parametrize(
    ("key_type", "key_attrs", "message"),
    [
        ("tensor<3xi64>", "", "expected tensor<2xi64>"),
        ("tensor<2xi64>", ", jax.buffer_donor = true", "a key is only read"),
        ("tensor<2xi64>", ', mhlo.sharding = "{devices=[2]<=[2]}"', "every device draws from the whole key"),
    ],
)
def test_the_contract_refuses_a_malformed_key(key_type: str, key_attrs: str, message: str) -> None:
    module = parse_module(_KEYED.replace("KEY_TYPE", key_type).replace("KEY_ATTRS", key_attrs), new_context())
    with module.context, pytest.raises(IRError, match=message):
        verify(find_main(module))


@pytest.mark.parametrize(
    ("key_type", "key_attrs", "message"),
    [
        ("tensor<4x2xi64>", "", "one key per device.*expected {devices=\\[4,1\\]<=\\[4\\]}"),
        ("tensor<4x2xi64>", ', mhlo.sharding = "{replicated}"', "each device holds its process's key"),
        ("tensor<1x2xi64>", ', mhlo.sharding = "{devices=[1,1]<=[1]}"', "expected tensor<2xi64>"),
        ("tensor<4x2xi64>", ', mhlo.sharding = "{devices=[4,1]<=[4]}", jax.buffer_donor = true',
         "a key is only read"),
    ],
)
def test_the_contract_refuses_a_malformed_key_per_device(key_type: str, key_attrs: str, message: str) -> None:
    module = parse_module(_KEYED.replace("KEY_TYPE", key_type).replace("KEY_ATTRS", key_attrs), new_context())
    with module.context, pytest.raises(IRError, match=message):
        verify(find_main(module))


def test_a_key_per_device_reads_row_0() -> None:
    text = """
    func.func @main(%a: tensor<f32>, %b: tensor<f32>) -> tensor<2xf32> {
      %shape = stablehlo.constant dense<[2]> : tensor<1xi64>
      %r = stablehlo.rng %a, %b, %shape, distribution = UNIFORM : (tensor<f32>, tensor<f32>, tensor<1xi64>) -> tensor<2xf32>
      return %r : tensor<2xf32>
    }
    """
    module = parse_module(text, new_context())
    assert random_key.thread_rng_key(module)
    random_key.read_first_row_key(module, 4)
    printed = print_module(module)
    assert "tensor<4x2xi64>) -> tensor<2xf32>" in printed
    assert "stablehlo.slice %arg2 [0:1, 0:2] : (tensor<4x2xi64>) -> tensor<1x2xi64>" in printed
    with module.context:
        main = find_main(module)
        key = main.regions[0].blocks[0].arguments[2]
        assert [use.owner.name for use in key.uses] == ["stablehlo.slice"]
    with pytest.raises(hloalias.TorchImportError, match="expected the key's tensor<2xi64>"):
        random_key.read_first_row_key(module, 4)


def test_the_contract_accepts_a_well_formed_key_per_device() -> None:
    attrs = ', mhlo.sharding = "{devices=[4,1]<=[4]}"'
    module = parse_module(_KEYED.replace("KEY_TYPE", "tensor<4x2xi64>").replace("KEY_ATTRS", attrs), new_context())
    with module.context:
        verify(find_main(module))


def test_the_contract_accepts_a_well_formed_key() -> None:
    module = parse_module(_KEYED.replace("KEY_TYPE", "tensor<2xi64>").replace("KEY_ATTRS", ""), new_context())
    with module.context:
        verify(find_main(module))
    assert "rng_key" in print_module(module)


def test_a_random_op_outside_main_is_refused() -> None:
    text = """
    func.func private @helper(%a: tensor<f32>, %b: tensor<f32>) -> tensor<2xf32> {
      %shape = stablehlo.constant dense<[2]> : tensor<1xi64>
      %r = stablehlo.rng %a, %b, %shape, distribution = UNIFORM : (tensor<f32>, tensor<f32>, tensor<1xi64>) -> tensor<2xf32>
      return %r : tensor<2xf32>
    }
    func.func @main(%a: tensor<f32>, %b: tensor<f32>) -> tensor<2xf32> {
      %r = func.call @helper(%a, %b) : (tensor<f32>, tensor<f32>) -> tensor<2xf32>
      return %r : tensor<2xf32>
    }
    """
    module = parse_module(text, new_context())
    with pytest.raises(hloalias.TorchImportError, match="nested region or another function"):
        random_key.thread_rng_key(module)


def test_integer_random_ops_are_refused() -> None:
    text = """
    func.func @main(%a: tensor<i32>, %b: tensor<i32>) -> tensor<2xi32> {
      %shape = stablehlo.constant dense<[2]> : tensor<1xi64>
      %r = stablehlo.rng %a, %b, %shape, distribution = UNIFORM : (tensor<i32>, tensor<i32>, tensor<1xi64>) -> tensor<2xi32>
      return %r : tensor<2xi32>
    }
    """
    module = parse_module(text, new_context())
    with pytest.raises(hloalias.TorchImportError, match="UNIFORM values of type tensor<2xi32>"):
        random_key.thread_rng_key(module)
