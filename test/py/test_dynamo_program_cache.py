"""``torch.compile(..., backend="hloalias")`` and the program cache
(runtime/program_cache.py, runtime/source_key.py): the graphs dynamo (and
AOTAutograd) hands the backend are keyed by their generated code and what
it reads, so each input that changes the program changes the key, and a
fresh process compiling a model it compiled before gets every graph's
program from the disk cache, with results equal to eager's.  Counted
through the caches' statistics, never timed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from hloalias.runtime import dynamo_backend
from hloalias.runtime.source_key import source_key


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _graph_of(fn: Callable[..., Any], *args: Any, dynamic: bool | None = None) -> tuple[torch.fx.GraphModule, tuple[Any, ...]]:
    """The one graph dynamo makes of ``fn(*args)`` and its example inputs."""
    captured: list[tuple[torch.fx.GraphModule, tuple[Any, ...]]] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        captured.append((gm, tuple(example_inputs)))
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=capture, dynamic=dynamic)(*args)
    ((gm, inputs),) = captured
    return gm, inputs


def _key(gm: torch.nn.Module, inputs: tuple[Any, ...], options: Any = ()) -> str:
    with torch.no_grad():  # the backend's inference graphs are compiled without grad
        return source_key(gm, inputs, {}, options)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2 + 1


class _Minus(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2 - 1


class _OtherConstant(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2 + 3


class _ToDouble(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.relu(self.linear(x)) * 2 + 1).to(torch.float64)


class _ToHalf(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.relu(self.linear(x)) * 2 + 1).to(torch.float16)


def test_a_dynamo_graph_key_changes_with_each_input_of_its_program() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    gm, inputs = _graph_of(_Block(), x)
    key = _key(gm, inputs)
    # The same model traced again (other weights, another graph module and
    # generated class): the same key.
    again, again_inputs = _graph_of(_Block(), torch.randn(2, 8))
    assert again is not gm and type(again) is not type(gm)
    assert _key(again, again_inputs) == key

    def of(module: torch.nn.Module, *args: Any) -> str:
        return _key(*_graph_of(module, *args))

    variants = {
        "graph code": of(_Minus(), x),
        "a constant": of(_OtherConstant(), x),
        "a parameter's dtype": of(_Block().double(), x.double()),
        "an input's dtype": _key(gm, tuple(t.double() if t is inputs[-1] else t for t in inputs)),
        "a dtype the code names": of(_ToHalf(), x),
        "an input's shape": of(_Block(), torch.randn(3, 8)),
        "a parameter's shape": _key(gm, tuple(torch.randn(8, 4) if t.shape == (8, 8) else t for t in inputs)),
        "an option": _key(gm, inputs, options=("pipeline", "builtin.module()")),
        "grad mode": source_key(gm, inputs, {}, ()),
    }
    for what, other in variants.items():
        assert other != key, what
    assert len(set(variants.values())) == len(variants)
    assert of(_ToDouble(), x) != variants["a dtype the code names"]


def test_an_edited_graph_is_keyed_by_its_new_code() -> None:
    """A graph edited after dynamo made it (the backend turns ``.item()``
    inputs into numbers so, ``_numbers_as_inputs``): the key is of the code
    that runs, for an eager and for a lazy graph module (whose ``forward``
    is a stub until first use)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    torch.manual_seed(0)
    x = torch.randn(2, 8)
    for make in (lambda gm: gm, _LazyGraphModule.from_graphmodule):
        keys = []
        for activation in (torch.sigmoid, torch.tanh):
            gm, inputs = _graph_of(_Block(), x)
            gm = make(gm)
            unedited = _key(gm, inputs)
            for node in gm.graph.nodes:
                if node.target is torch.relu:
                    node.target = activation
            gm.recompile()  # a lazy module's forward is a stub again until used
            keys.append(_key(gm, inputs))
            assert keys[-1] != unedited
        assert keys[0] != keys[1], type(gm).__mro__[1].__name__


def test_a_sized_graph_is_keyed_by_its_graph_and_sizes() -> None:
    """Dynamo's automatic-dynamic graph with an int size input runs as a
    ``_SizedGraph`` of its tensors only: keyed by the graph and by where
    each size is read from."""
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    gm, inputs = _graph_of(_Block(), x, dynamic=True)
    sizes = dynamo_backend._sizes_of_tensors(gm)
    assert sizes is not None and len(sizes) == 1
    count = len(inputs)
    tensors = tuple(t for t in inputs if isinstance(t, torch.Tensor))
    key = _key(dynamo_backend._SizedGraph(gm, sizes, count), tensors)
    again, _ = _graph_of(_Block(), torch.randn(3, 8), dynamic=True)
    assert _key(dynamo_backend._SizedGraph(again, sizes, count), tensors) == key
    (position, tensor, _dim), = sizes
    other = ((position, tensor, 1),)
    assert _key(dynamo_backend._SizedGraph(gm, other, count), tensors) != key
    minus, _ = _graph_of(_Minus(), x, dynamic=True)
    assert _key(dynamo_backend._SizedGraph(minus, sizes, count), tensors) != key
    assert _key(dynamo_backend._SizedGraph(gm, sizes, count), (torch.randn(5, 8), *tensors[1:])) != key
    # The number values a dynamic=True graph's _SizedGraph fixes: each value
    # (1 and 1.0, 0.0 and -0.0 too) its own program.
    keys = {_key(dynamo_backend._SizedGraph(gm, sizes, count, ((count, value),)), tensors)
            for value in (0.1, 0.2, 1, 1.0, True, 0.0, -0.0)}
    assert len(keys) == 7 and key not in keys


_CHILD = textwrap.dedent(
    """
    import warnings, torch, transformers
    import hloalias
    from hloalias.runtime import dynamo_backend, executable
    from hloalias.runtime.disk_cache import CacheWarning, disk_cache_stats
    from hloalias.runtime.program_cache import program_cache_stats
    warnings.simplefilter("error", CacheWarning)
    if HIT_EXPECTED:  # a hit runs no torch.export, torch-mlir or passes
        def refuse(*args, **kwargs):
            raise AssertionError("imported on a hit")
        executable.import_cached = refuse

    torch.manual_seed(SEED)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).eval()
    compiled = torch.compile(model, backend="hloalias")
    with torch.no_grad():
        # 8: a static graph; 12: dynamo's automatic-dynamic graph (the
        # length an int input, run as a _SizedGraph); 16: the same graph.
        for length in (8, 12, 16):
            ids = torch.randint(0, 64, (1, length))
            torch.testing.assert_close(compiled(ids, use_cache=False).logits,
                                       model(ids, use_cache=False).logits, rtol=1e-5, atol=1e-5)
    sized = sum(graph.sizes is not None for graph in dynamo_backend.compiled_graphs())

    # A training step: AOTAutograd's forward and backward graphs.
    mlp = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    reference = [p.detach().clone().requires_grad_() for p in mlp.parameters()]
    x = torch.randn(4, 6)
    torch.compile(mlp, backend="hloalias")(x).square().sum().backward()
    eager = torch.func.functional_call(mlp, dict(zip([n for n, _ in mlp.named_parameters()], reference)), (x,))
    eager.square().sum().backward()
    for p, r in zip(mlp.parameters(), reference):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-6)
    stats, disk = program_cache_stats(), disk_cache_stats()
    print("STATS", sized, stats.hits, stats.misses, stats.uncacheable, stats.stale, disk.xla_compiles)
    """
)


def test_a_fresh_process_gets_every_dynamo_graph_from_the_program_cache(tmp_path: "os.PathLike[str]") -> None:
    directory = os.path.join(str(tmp_path), "cache")

    def child(seed: int, hit: bool) -> list[int]:
        code = _CHILD.replace("HIT_EXPECTED", str(hit)).replace("SEED", str(seed))
        env = dict(os.environ, HLOALIAS_CACHE_DIR=directory,
                   HLOALIAS_CACHE_KEY_FILE=os.path.join(str(tmp_path), "keys", "cache-key"))
        for name in ("HLOALIAS_CACHE", "HLOALIAS_PROGRAM_CACHE"):
            env.pop(name, None)
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-4000:]
        line = [line for line in done.stdout.splitlines() if line.startswith("STATS")][0]
        return [int(part) for part in line.split()[1:]]

    # GPT-2: the static graph at 8, the sized graph at 12 and 16; the MLP's
    # forward and backward: five programs imported, lowered, compiled, stored.
    assert child(0, hit=False) == [1, 0, 5, 0, 0, 5]
    # Other weights, a fresh process: every program from the cache, no import, no XLA compile.
    assert child(1, hit=True) == [1, 5, 0, 0, 0, 0]
