"""The five benchmark workloads and the physical minimum of each.

Every workload is built from a config in code with random weights (nothing
is downloaded): a torch ``nn.Module`` with example inputs, what the caller
donates, an equivalent hand-written JAX function with its ``donate_argnums``,
and the argument for the workload's unavoidable temporaries.

The physical minimum is derived from the program itself, by running it in
eager PyTorch on a copy (:func:`derive_minimum`):

* arguments: every distinct tensor the program reads (module state and user
  inputs) must be on the device;
* genuinely new results: outputs whose storage is not the storage of an
  input.  Outputs sharing one storage (a result and views of it) count once,
  and only the storage elements some output exposes are counted.  New values
  of mutated state are written into the state's own storage by eager
  PyTorch, so they add nothing.  A donated input's buffer can hold one new
  result that fits in it, which then adds nothing either;
* unavoidable temporaries: a per-workload lower bound with its argument
  (:attr:`Workload.temp_bound`).  A temporary is counted only if, at some
  point of the computation, it must be live while every argument and result
  buffer holds data still needed; anything that fits in a result buffer
  before that result is written, or is computed elementwise in place, is not
  unavoidable."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from jax import lax

import hloalias
from hloalias.pipeline import DEFAULT_PIPELINE

F32 = 4  # bytes per float32 element

# -- configs ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SeedConfig:
    """The project's seed example: ``x[0:1024]`` viewed as ``2x512``."""

    length: int = 1024


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """Training-style step: MLP forward plus in-place SGD-momentum updates."""

    layers: int = 4
    width: int = 1024
    batch: int = 64
    lr: float = 0.01
    momentum: float = 0.9


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """GPT-2-small dimensions; one decode step with a static KV cache."""

    layers: int = 12
    heads: int = 12
    hidden: int = 768
    positions: int = 1024
    vocab: int = 50257
    position: int = 3  # where the decoded token goes

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads


@dataclasses.dataclass(frozen=True)
class ViewsConfig:
    """Two large inputs and one computed result, returned through many views."""

    rows: int = 2048
    cols: int = 1024


@dataclasses.dataclass(frozen=True)
class DonateConfig:
    """``y = x * 2 + 1`` on a large donated ``x``."""

    rows: int = 4096
    cols: int = 4096


# -- the workload record ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TempBound:
    """Unavoidable temporaries: a lower bound in bytes and why."""

    bytes: int
    argument: str


@dataclasses.dataclass
class Workload:
    """One benchmark program in every form the systems need."""

    key: str
    label: str
    title: str
    config: Any
    module: torch.nn.Module
    args: tuple[torch.Tensor, ...]
    donate: tuple[int | str, ...]
    temp_bound: TempBound
    jax_fn: Callable[..., Any]
    jax_inputs: Callable[[], tuple[Any, ...]]
    jax_donate_argnums: tuple[int, ...]
    jax_flatten: Callable[[Any], tuple[list[Any], dict[str, Any]]]
    notes: list[str] = dataclasses.field(default_factory=list)
    # An optional JAX variant measured as a diagnostic: (what it changes, fn).
    jax_diagnostic: tuple[str, Callable[..., Any]] | None = None

    @property
    def pipeline(self) -> str:
        """The default pipeline with this workload's explicit donations."""
        if not self.donate:
            return DEFAULT_PIPELINE
        names = ",".join(str(d) for d in self.donate)
        return DEFAULT_PIPELINE.replace("alias-donated-buffers", f"alias-donated-buffers{{donate={names}}}")

    def exported(self) -> torch.export.ExportedProgram:
        """``torch.export`` of the module on the example inputs (shared by
        the systems so the slow export runs once per workload)."""
        return torch.export.export(self.module, self.args, strict=False)


# -- the physical minimum ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Minimum:
    """Bytes of the distinct data that must exist on the device."""

    argument_bytes: int
    new_result_bytes: int
    temp_bytes: int
    derivation: tuple[str, ...]
    state_bytes: int = 0  # the part of argument_bytes that is module state

    @property
    def total_bytes(self) -> int:
        """Arguments + genuinely new results + unavoidable temporaries."""
        return self.argument_bytes + self.new_result_bytes + self.temp_bytes

    @property
    def data_bytes(self) -> int:
        """Arguments + genuinely new results (no temporaries)."""
        return self.argument_bytes + self.new_result_bytes


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _shape_text(tensor: torch.Tensor) -> str:
    dims = "x".join(str(s) for s in tensor.shape) or "scalar"
    return f"{dims} {str(tensor.dtype).removeprefix('torch.')}"


def eager_reference(workload: Workload) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], torch.nn.Module, list[torch.Tensor]]:
    """Run the workload in eager PyTorch on copies: ``(flat outputs, state
    after the call, the module copy, the argument copies)``."""
    module = copy.deepcopy(workload.module)
    args = [a.clone() for a in workload.args]
    with torch.no_grad():
        outputs = pytree.tree_leaves(module(*args))
    state = {name: value.detach().clone() for name, value in module.state_dict().items()}
    return outputs, state, module, args


def derive_minimum(workload: Workload) -> Minimum:
    """The physical minimum of ``workload``, derived by running it eagerly
    and looking at which storages its outputs live in (module docstring)."""
    outputs, _, module, args = eager_reference(workload)
    inputs: list[tuple[str, torch.Tensor]] = []
    seen: set[int] = set()
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            inputs.append((name, tensor))
    names = _argument_names(workload.module, len(args))
    inputs.extend(zip(names, args))
    input_storage = {t.untyped_storage().data_ptr(): name for name, t in inputs}
    state_bytes = sum(_nbytes(t) for name, t in inputs if name not in names)
    user_bytes = sum(_nbytes(t) for t in args)
    argument_bytes = state_bytes + user_bytes

    lines = [
        f"arguments: {len(inputs)} tensor(s), {argument_bytes:,} bytes "
        f"(module state {state_bytes:,} in {len(inputs) - len(args)} tensor(s); user inputs {user_bytes:,})"
    ]
    groups: dict[int, list[int]] = {}
    for position, out in enumerate(outputs):
        pointer = out.untyped_storage().data_ptr()
        if pointer in input_storage:
            lines.append(
                f"output {position} ({_shape_text(out)}): shares the storage of argument "
                f"'{input_storage[pointer]}': 0 new bytes"
            )
        else:
            groups.setdefault(pointer, []).append(position)
    new_bytes = 0
    exposed_by_group: list[tuple[int, int]] = []  # (exposed bytes, first output position)
    for members in groups.values():
        exposed = _exposed_bytes([outputs[p] for p in members])
        new_bytes += exposed
        exposed_by_group.append((exposed, members[0]))
        first = outputs[members[0]]
        others = ", ".join(str(p) for p in members[1:])
        suffix = f" and outputs {others} (views of the same storage)" if others else ""
        lines.append(
            f"output {members[0]} ({_shape_text(first)}){suffix}: new storage, "
            f"{exposed:,} bytes exposed"
        )
    # A donated input is the caller's to give up: its buffer can hold one
    # new result that fits in it (largest first), so that result adds nothing.
    for request in workload.donate:
        index = request if isinstance(request, int) else names.index(request)
        donated = _nbytes(args[index])
        fitting = [g for g in exposed_by_group if g[0] <= donated]
        if not fitting:
            lines.append(f"donated argument '{names[index]}' ({donated:,} bytes): no new result fits in it")
            continue
        hosted = max(fitting)
        exposed_by_group.remove(hosted)
        new_bytes -= hosted[0]
        lines.append(
            f"donated argument '{names[index]}' ({donated:,} bytes) can hold output {hosted[1]} "
            f"({hosted[0]:,} bytes): −{hosted[0]:,} bytes"
        )
    lines.append(f"genuinely new results (beyond donated buffers): {new_bytes:,} bytes")
    lines.append(f"unavoidable temporaries: {workload.temp_bound.bytes:,} bytes. {workload.temp_bound.argument}")
    return Minimum(argument_bytes, new_bytes, workload.temp_bound.bytes, tuple(lines), state_bytes)


def _argument_names(module: torch.nn.Module, count: int) -> list[str]:
    import inspect

    parameters = list(inspect.signature(module.forward).parameters.values())
    names: list[str] = []
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            base = parameter.name
            names.extend(f"{base}[{i}]" for i in range(count - len(names)))
            break
        names.append(parameter.name)
    return names[:count]


def _exposed_bytes(outputs: list[torch.Tensor]) -> int:
    """Bytes of one storage that at least one of ``outputs`` exposes."""
    element = outputs[0].element_size()
    storage_elements = outputs[0].untyped_storage().nbytes() // element
    for out in outputs:
        if out.is_contiguous() and out.storage_offset() == 0 and out.numel() == storage_elements:
            return storage_elements * element
    covered = torch.zeros(storage_elements, dtype=torch.bool)
    offsets = torch.arange(storage_elements)
    for out in outputs:
        index = offsets.as_strided(out.shape, out.stride(), out.storage_offset())
        covered[index.reshape(-1)] = True
    return int(covered.sum()) * element


# -- helpers for the JAX columns ---------------------------------------------


def to_jax(tensor: torch.Tensor) -> jax.Array:
    """A JAX array with ``tensor``'s values (int64 becomes int32: JAX runs
    with x64 disabled, its default)."""
    array = tensor.detach().cpu().numpy()
    if array.dtype == np.int64:
        array = array.astype(np.int32)
    return jnp.asarray(array)


def _layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * weight + bias


# -- 1. seed example --------------------------------------------------------


class SeedModule(torch.nn.Module):
    """``def f(x): a = x[0:1024]; return x, a.view(2, 512)``."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x[0:1024]
        return x, a.view(2, 512)


def seed_workload(config: SeedConfig = SeedConfig()) -> Workload:
    """Workload 1: the seed example on ``randn(1024)``."""
    x = torch.randn(config.length)

    def jax_seed(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return x, x[0:1024].reshape(2, 512)

    return Workload(
        key="seed",
        label="1 seed example",
        title="1. Seed example (x, x[0:1024].view(2, 512))",
        config=config,
        module=SeedModule(),
        args=(x,),
        donate=(),
        temp_bound=TempBound(0, "There is no computation: both results are the input or a view of it."),
        jax_fn=jax_seed,
        jax_inputs=lambda: (to_jax(x),),
        jax_donate_argnums=(),
        jax_flatten=lambda result: (list(result), {}),
    )


# -- 2. SGD-momentum training step ------------------------------------------


class SGDMomentumStep(torch.nn.Module):
    """An MLP forward with old weights, then ``buf.mul_(m).add_(g);
    p.sub_(lr * buf)`` in place under ``torch.no_grad()`` for every weight
    and bias.  Weights are ``nn.Parameter``s, or registered buffers when
    ``parameters`` is False (see :func:`probe_parameter_mutation`)."""

    def __init__(self, config: MLPConfig, parameters: bool = True) -> None:
        super().__init__()
        self.config = config
        for i in range(config.layers):
            weight = torch.randn(config.width, config.width) / math.sqrt(config.width)
            bias = torch.randn(config.width) * 0.01
            if parameters:
                setattr(self, f"w{i}", torch.nn.Parameter(weight))
                setattr(self, f"b{i}", torch.nn.Parameter(bias))
            else:
                self.register_buffer(f"w{i}", weight)
                self.register_buffer(f"b{i}", bias)
            self.register_buffer(f"mom_w{i}", torch.randn(config.width, config.width) * 0.01)
            self.register_buffer(f"mom_b{i}", torch.randn(config.width) * 0.01)

    def forward(self, x: torch.Tensor, *grads: torch.Tensor) -> torch.Tensor:
        c = self.config
        h = x
        for i in range(c.layers):
            h = F.linear(h, getattr(self, f"w{i}"), getattr(self, f"b{i}"))
            if i < c.layers - 1:
                h = torch.relu(h)
        with torch.no_grad():
            for i in range(c.layers):
                for j, kind in enumerate("wb"):
                    param = getattr(self, f"{kind}{i}")
                    buf = getattr(self, f"mom_{kind}{i}")
                    buf.mul_(c.momentum).add_(grads[2 * i + j])
                    param.sub_(c.lr * buf)
        return h


class _SGDMomentumStepWithParameters(torch.nn.Module):
    """The same step with ``nn.Linear`` parameters mutated under no_grad."""

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(config.width, config.width) for _ in range(2))
        for i in range(2):
            self.register_buffer(f"mom_w{i}", torch.zeros(config.width, config.width))

    def forward(self, x: torch.Tensor, g0: torch.Tensor, g1: torch.Tensor) -> torch.Tensor:
        h = self.layers[1](torch.relu(self.layers[0](x)))
        with torch.no_grad():
            for i, g in enumerate((g0, g1)):
                buf = getattr(self, f"mom_w{i}")
                buf.mul_(0.9).add_(g)
                layer: torch.nn.Linear = self.layers[i]  # type: ignore[assignment]
                layer.weight.sub_(0.01 * buf)
        return h


def probe_parameter_mutation() -> str | None:
    """Import the step with real ``nn.Parameter`` weights; the error text if
    hloalias rejects it, else None.  (Why workload 2 holds weights in buffers.)"""
    config = MLPConfig(width=16, batch=2)
    module = _SGDMomentumStepWithParameters(config)
    args = (torch.randn(2, 16), torch.randn(16, 16), torch.randn(16, 16))
    try:
        hloalias.import_torch(module, args)
    except hloalias.HloaliasError as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return None


def sgd_workload(config: MLPConfig = MLPConfig(), parameters: bool = True) -> Workload:
    """Workload 2: in-place SGD-momentum step of a 4x1024 MLP (weights as
    ``nn.Parameter``s, or as buffers when ``parameters`` is False)."""
    module = SGDMomentumStep(config, parameters)
    x = torch.randn(config.batch, config.width)
    grads = []
    for i in range(config.layers):
        grads.append(torch.randn(config.width, config.width) * 0.01)
        grads.append(torch.randn(config.width) * 0.01)
    weight_names = [f"{k}{i}" for i in range(config.layers) for k in "wb"]

    def jax_step(weights: dict[str, jax.Array], momenta: dict[str, jax.Array], x: jax.Array,
                 grads: dict[str, jax.Array], barrier: bool = False
                 ) -> tuple[jax.Array, dict[str, jax.Array], dict[str, jax.Array]]:
        h = x
        for i in range(config.layers):
            h = h @ weights[f"w{i}"].T + weights[f"b{i}"]
            if i < config.layers - 1:
                h = jax.nn.relu(h)
        if barrier:
            # Make the update of the weights depend on the finished forward.
            h, weights = lax.optimization_barrier((h, weights))
        new_momenta = {n: momenta[n] * config.momentum + grads[n] for n in weight_names}
        new_weights = {n: weights[n] - config.lr * new_momenta[n] for n in weight_names}
        return h, new_weights, new_momenta

    def jax_inputs() -> tuple[Any, ...]:
        weights = {n: to_jax(getattr(module, n)) for n in weight_names}
        momenta = {n: to_jax(getattr(module, f"mom_{n}")) for n in weight_names}
        return weights, momenta, to_jax(x), {n: to_jax(g) for n, g in zip(weight_names, grads)}

    def jax_flatten(result: Any) -> tuple[list[Any], dict[str, Any]]:
        h, weights, momenta = result
        state = dict(weights)
        state.update({f"mom_{n}": v for n, v in momenta.items()})
        return [h], state

    activation = config.batch * config.width * F32
    return Workload(
        key="sgd_mlp",
        label="2 SGD-momentum MLP step",
        title=f"2. SGD-momentum step, MLP {config.layers}x{config.width}, batch {config.batch}",
        config=config,
        module=module,
        args=(x, *grads),
        donate=(),
        temp_bound=TempBound(
            activation,
            f"The last layer reads the third hidden activation ({config.batch}x{config.width} f32 = "
            f"{activation:,} bytes) while it writes y; a matrix product cannot overwrite its own input, "
            "so that activation cannot sit in y's buffer, and every argument buffer still holds live "
            "data (weights and momenta are updated in place, x and the gradients are the caller's). "
            "Earlier activations fit in y's buffer before y is written; the updates are elementwise "
            "and in place. So one activation is unavoidable.",
        ),
        jax_fn=jax_step,
        jax_inputs=jax_inputs,
        jax_donate_argnums=(0, 1),
        jax_flatten=jax_flatten,
        jax_diagnostic=(
            "`lax.optimization_barrier((h, weights))` between the forward and the update",
            lambda weights, momenta, x, grads: jax_step(weights, momenta, x, grads, barrier=True),
        ),
    )


# -- 3. GPT-2-small decode step with a static KV cache ------------------------


class _Block(torch.nn.Module):
    k_cache: torch.Tensor
    v_cache: torch.Tensor

    def __init__(self, c: GPT2Config) -> None:
        super().__init__()
        self.c = c
        self.ln1 = torch.nn.LayerNorm(c.hidden)
        self.qkv = torch.nn.Linear(c.hidden, 3 * c.hidden)
        self.proj = torch.nn.Linear(c.hidden, c.hidden)
        self.ln2 = torch.nn.LayerNorm(c.hidden)
        self.fc = torch.nn.Linear(c.hidden, 4 * c.hidden)
        self.out = torch.nn.Linear(4 * c.hidden, c.hidden)
        self.register_buffer("k_cache", torch.randn(c.heads, c.positions, c.head_dim) * 0.1)
        self.register_buffer("v_cache", torch.randn(c.heads, c.positions, c.head_dim) * 0.1)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        c = self.c
        q, k, v = self.qkv(self.ln1(x)).split(c.hidden, dim=-1)
        q = q.view(c.heads, 1, c.head_dim)
        self.k_cache.index_copy_(1, pos, k.view(c.heads, 1, c.head_dim))
        self.v_cache.index_copy_(1, pos, v.view(c.heads, 1, c.head_dim))
        scores = q @ self.k_cache.transpose(1, 2) / math.sqrt(c.head_dim) + mask
        y = scores.softmax(-1) @ self.v_cache
        x = x + self.proj(y.transpose(0, 1).reshape(1, c.hidden))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT2Decode(torch.nn.Module):
    """One decode step: token ``tok`` at position ``pos`` (int64, shape [1]),
    K/V written into static per-layer caches with ``index_copy_``, logits out.
    The LM head is tied to the token embedding, as in GPT-2."""

    def __init__(self, c: GPT2Config) -> None:
        super().__init__()
        self.c = c
        self.wte = torch.nn.Parameter(torch.randn(c.vocab, c.hidden) * 0.02)
        self.wpe = torch.nn.Parameter(torch.randn(c.positions, c.hidden) * 0.01)
        self.blocks = torch.nn.ModuleList(_Block(c) for _ in range(c.layers))
        self.ln_f = torch.nn.LayerNorm(c.hidden)

    def forward(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.wte[tok] + self.wpe[pos]
        mask = torch.where(torch.arange(self.c.positions) <= pos, 0.0, float("-inf"))
        for block in self.blocks:
            x = block(x, pos, mask)
        return self.ln_f(x) @ self.wte.t()


def gpt2_workload(config: GPT2Config = GPT2Config()) -> Workload:
    """Workload 3: GPT-2-small-like decode step, KV cache updated in place."""
    module = GPT2Decode(config).eval()
    tok = torch.tensor([17])
    pos = torch.tensor([config.position])
    c = config
    cache_names = [f"blocks.{l}.{kind}_cache" for l in range(c.layers) for kind in "kv"]

    def jax_decode(params: dict[str, jax.Array], caches: dict[str, jax.Array], tok: jax.Array,
                   pos: jax.Array, contract_weight: bool = False) -> tuple[jax.Array, dict[str, jax.Array]]:
        def linear(h: jax.Array, weight: jax.Array, bias: jax.Array) -> jax.Array:
            if contract_weight:
                # Contract the weight's input dimension directly: no transpose op.
                return lax.dot_general(h, weight, (([1], [1]), ([], []))) + bias
            return h @ weight.T + bias

        x = params["wte"][tok] + params["wpe"][pos]
        mask = jnp.where(jnp.arange(c.positions) <= pos[0], 0.0, -jnp.inf)
        new_caches = {}
        for l in range(c.layers):
            def p(name: str) -> jax.Array:
                return params[f"blocks.{l}.{name}"]

            qkv = linear(_layer_norm(x, p("ln1.weight"), p("ln1.bias")), p("qkv.weight"), p("qkv.bias"))
            q, k, v = jnp.split(qkv, 3, axis=-1)
            q = q.reshape(c.heads, 1, c.head_dim)
            start = (0, pos[0], 0)
            k_cache = lax.dynamic_update_slice(caches[f"blocks.{l}.k_cache"], k.reshape(c.heads, 1, c.head_dim), start)
            v_cache = lax.dynamic_update_slice(caches[f"blocks.{l}.v_cache"], v.reshape(c.heads, 1, c.head_dim), start)
            new_caches[f"blocks.{l}.k_cache"] = k_cache
            new_caches[f"blocks.{l}.v_cache"] = v_cache
            scores = q @ k_cache.transpose(0, 2, 1) / math.sqrt(c.head_dim) + mask
            y = jax.nn.softmax(scores, axis=-1) @ v_cache
            x = x + linear(y.transpose(1, 0, 2).reshape(1, c.hidden), p("proj.weight"), p("proj.bias"))
            h = _layer_norm(x, p("ln2.weight"), p("ln2.bias"))
            h = jax.nn.gelu(linear(h, p("fc.weight"), p("fc.bias")), approximate=False)
            x = x + linear(h, p("out.weight"), p("out.bias"))
        logits = _layer_norm(x, params["ln_f.weight"], params["ln_f.bias"]) @ params["wte"].T
        return logits, new_caches

    params_cache: dict[str, jax.Array] = {}

    def jax_inputs() -> tuple[Any, ...]:
        # Parameters are not donated, so they are converted once and reused.
        if not params_cache:
            params_cache.update({n: to_jax(t) for n, t in module.named_parameters()})
        caches = {n: to_jax(t) for n, t in module.named_buffers() if n in cache_names}
        return params_cache, caches, to_jax(tok), to_jax(pos)

    hidden_bytes = c.hidden * F32
    scores = c.heads * c.positions
    return Workload(
        key="gpt2_decode",
        label="3 GPT-2-small decode step",
        title=(f"3. GPT-2-small decode step ({c.layers} layers, {c.heads} heads, {c.hidden} hidden, "
               f"{c.positions} positions, vocab {c.vocab}), static KV cache"),
        config=config,
        module=module,
        args=(tok, pos),
        donate=(),
        temp_bound=TempBound(
            hidden_bytes,
            f"The LM head reads the final normalized hidden state ({c.hidden} f32 = {hidden_bytes:,} bytes) "
            "while it writes the logits, so that vector needs its own buffer. Every other intermediate fits "
            f"in the logits buffer ({c.vocab} f32) before the logits are written: at most {scores:,} "
            f"attention scores plus a few {c.hidden}- and {4 * c.hidden}-wide vectors are live at once. "
            "New K/V rows go in place into the cache buffers.",
        ),
        jax_fn=jax_decode,
        jax_inputs=jax_inputs,
        jax_donate_argnums=(1,),
        jax_flatten=lambda result: ([result[0]], dict(result[1])),
        jax_diagnostic=(
            "every Linear written as `lax.dot_general` contracting the weight's input dimension (no transpose op)",
            lambda params, caches, tok, pos: jax_decode(params, caches, tok, pos, contract_weight=True),
        ),
        notes=[
            "Token and position are int64 tensors of shape [1] in torch and int32 in JAX (JAX's default "
            "with x64 disabled): JAX's arguments are 8 bytes smaller.",
        ],
    )


# -- 4. many views ---------------------------------------------------------


class ManyViews(torch.nn.Module):
    """Returns a computed result and views of it and of two large inputs:
    chunk, split, transpose, unsqueeze, expand and strided slices."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        z = x * y + 1.0
        return (
            z,
            *x.chunk(4, dim=0),
            *x.split([256, x.shape[1] - 256], dim=1),
            x.t(),
            x.unsqueeze(0),
            x[::2, ::4],
            x[0].expand(16, x.shape[1]),
            y.transpose(0, 1)[::2],
            *z.chunk(2, dim=1),
            z.t(),
            z.unsqueeze(1),
            z[1::3],
            z[:, 5:6].expand(z.shape[0], 64),
        )


def views_workload(config: ViewsConfig = ViewsConfig()) -> Workload:
    """Workload 4: many views of large inputs and of a computed result."""
    x = torch.randn(config.rows, config.cols)
    y = torch.randn(config.rows, config.cols)
    cols = config.cols

    def jax_views(x: jax.Array, y: jax.Array) -> tuple[jax.Array, ...]:
        z = x * y + 1.0
        rows = x.shape[0] // 4
        zc = cols // 2
        return (
            z,
            *(x[i * rows:(i + 1) * rows] for i in range(4)),
            x[:, :256], x[:, 256:],
            x.T,
            x[None],
            x[::2, ::4],
            jnp.broadcast_to(x[0], (16, cols)),
            y.T[::2],
            z[:, :zc], z[:, zc:],
            z.T,
            z[:, None],
            z[1::3],
            jnp.broadcast_to(z[:, 5:6], (z.shape[0], 64)),
        )

    return Workload(
        key="many_views",
        label="4 many views",
        title=f"4. Many views of two {config.rows}x{config.cols} inputs and a computed result",
        config=config,
        module=ManyViews(),
        args=(x, y),
        donate=(),
        temp_bound=TempBound(0, "z = x * y + 1 is elementwise and is written straight into its result buffer."),
        jax_fn=jax_views,
        jax_inputs=lambda: (to_jax(x), to_jax(y)),
        jax_donate_argnums=(),
        jax_flatten=lambda result: (list(result), {}),
    )


# -- 5. explicit donation ----------------------------------------------------


class Affine(torch.nn.Module):
    """``y = x * 2 + 1``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


def donate_workload(config: DonateConfig = DonateConfig()) -> Workload:
    """Workload 5: ``y = x * 2 + 1`` with ``x`` donated."""
    x = torch.randn(config.rows, config.cols)
    return Workload(
        key="donate",
        label="5 donated y = 2x + 1",
        title=f"5. Explicit donation: y = x * 2 + 1, x {config.rows}x{config.cols} f32 donated",
        config=config,
        module=Affine(),
        args=(x,),
        donate=(0,),
        temp_bound=TempBound(0, "Elementwise: y can be written in place into the donated x's buffer."),
        jax_fn=lambda x: x * 2 + 1,
        jax_inputs=lambda: (to_jax(x),),
        jax_donate_argnums=(0,),
        jax_flatten=lambda result: ([result], {}),
    )


def all_workloads(gpt2: GPT2Config = GPT2Config(), sgd_parameters: bool = True) -> list[Callable[[], Workload]]:
    """Builders of the five workloads, in report order (built lazily so only
    one workload's weights are in memory at a time)."""
    return [seed_workload, lambda: sgd_workload(MLPConfig(), sgd_parameters), lambda: gpt2_workload(gpt2),
            views_workload, donate_workload]


def build(key: str, gpt2_layers: int = 12) -> Workload:
    """The workload ``key`` of the latency comparison; GPT-2 with
    ``gpt2_layers`` layers (``bench.latency --gpt2-layers``): hloalias
    (``bench.latency``) and every peer (``bench.peer_measure``) build it
    here, so they measure the same program."""
    builders: dict[str, Callable[[], Workload]] = {
        "seed": seed_workload,
        "sgd_mlp": lambda: sgd_workload(MLPConfig()),
        "gpt2_decode": lambda: gpt2_workload(GPT2Config(layers=gpt2_layers)),
        "many_views": views_workload,
        "donate": donate_workload,
    }
    return builders[key]()
