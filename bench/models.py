"""Hugging Face models in the benchmark: an HF Llama static-cache decode
step (``TorchExportableModuleWithStaticCache``, HF's own export recipe),
a BERT, a DeBERTa-v2 and a Swin forward, all from configs in code (random
weights).

From the repository root::

    .venv/bin/python -m bench.models [--out DIR]

writes ``bench/RESULTS-models.md``: per workload, the data minimum derived
as ``bench.workloads.derive_minimum`` derives it (eager run, storages
inspected, tied weights once), XLA's figures for hloalias and plain
torch-mlir, the largest check error against eager, and where XLA's temp
bytes come from (copies and transposed copies read from the optimized HLO,
the rest being buffers of computed values).  The BERT forward also has a
hand-written ``jax.jit`` equivalent (same math, parameters as arguments);
the Llama static-cache step has none, so no JAX column there."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import time
from typing import Any

if __package__ in (None, ""):  # `python bench/models.py`: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import torch
import torch.utils._pytree as pytree
import transformers

import hloalias
from bench import systems, workloads
from bench.systems import Measurement


@dataclasses.dataclass(frozen=True)
class LlamaDecodeConfig:
    """An HF Llama with a static KV cache, one decode step (batch 1);
    ``family`` "qwen2" or "mistral" builds that model with the same sizes
    (their configs' other defaults: Qwen2's biased q/k/v projections,
    Mistral's 4096-token sliding window)."""

    vocab_size: int = 4096
    hidden_size: int = 512
    intermediate_size: int = 1376
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    max_cache_len: int = 256
    position: int = 17  # the step measured: tokens 0..16 already in the cache
    family: str = "llama"


@dataclasses.dataclass(frozen=True)
class BertForwardConfig:
    """An HF BertModel forward (SDPA attention, the default), batch 2."""

    vocab_size: int = 4096
    hidden_size: int = 512
    intermediate_size: int = 2048
    layers: int = 4
    heads: int = 8
    batch: int = 2
    sequence: int = 128


@dataclasses.dataclass(frozen=True)
class DebertaForwardConfig:
    """An HF DebertaV2Model forward with relative attention (c2p + p2c)."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    layers: int = 2
    heads: int = 4
    batch: int = 2
    sequence: int = 64


@dataclasses.dataclass(frozen=True)
class SwinForwardConfig:
    """An HF SwinModel forward (two stages, window 4)."""

    image_size: int = 64
    patch_size: int = 4
    embed_dim: int = 32
    depths: tuple[int, ...] = (2, 2)
    heads: tuple[int, ...] = (2, 4)
    window_size: int = 4
    batch: int = 2


def deberta_forward(config: DebertaForwardConfig = DebertaForwardConfig()) -> tuple[torch.nn.Module, torch.Tensor]:
    """A random-weight DeBERTa-v2 (seed 0) and its token ids (seed 1)."""
    torch.manual_seed(0)
    model = transformers.DebertaV2Model(transformers.DebertaV2Config(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.layers,
        num_attention_heads=config.heads, intermediate_size=config.intermediate_size, max_position_embeddings=128,
        relative_attention=True, pos_att_type=["p2c", "c2p"], max_relative_positions=-1, position_buckets=-1,
    )).eval()  # type: ignore[no-untyped-call]
    ids = torch.randint(0, config.vocab_size, (config.batch, config.sequence),
                        generator=torch.Generator().manual_seed(1))
    return model, ids


def swin_forward(config: SwinForwardConfig = SwinForwardConfig()) -> tuple[torch.nn.Module, torch.Tensor]:
    """A random-weight Swin (seed 0) and its NCHW pixels (seed 1)."""
    torch.manual_seed(0)
    model = transformers.SwinModel(transformers.SwinConfig(
        image_size=config.image_size, patch_size=config.patch_size, embed_dim=config.embed_dim,
        depths=list(config.depths), num_heads=list(config.heads), window_size=config.window_size,
    )).eval()  # type: ignore[no-untyped-call]
    pixels = torch.randn(config.batch, 3, config.image_size, config.image_size,
                         generator=torch.Generator().manual_seed(1))
    return model, pixels


_DECODE_FAMILIES: dict[str, tuple[Any, Any]] = {
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
    "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config),
    "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig),
}


class LlamaDecodeStep(torch.nn.Module):
    """HF's ``TorchExportableModuleWithStaticCache`` called as its docs show
    (``input_ids=``, ``cache_position=``), positional for the bench."""

    def __init__(self, config: LlamaDecodeConfig) -> None:
        super().__init__()
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

        torch.manual_seed(0)
        model_class, config_class = _DECODE_FAMILIES[config.family]
        model = model_class(config_class(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size, num_hidden_layers=config.layers,
            num_attention_heads=config.heads, num_key_value_heads=config.kv_heads,
            max_position_embeddings=config.max_cache_len, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )).eval()  # type: ignore[no-untyped-call]
        model.generation_config = transformers.GenerationConfig(  # type: ignore[no-untyped-call]
            use_cache=True, cache_implementation="static",
            cache_config={"batch_size": 1, "max_cache_len": config.max_cache_len},
            bos_token_id=0, eos_token_id=0, pad_token_id=0)
        self.inner = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=config.max_cache_len)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.inner(input_ids=input_ids, cache_position=cache_position)
        return logits


def _no_jax(*_: Any) -> Any:
    raise NotImplementedError("no hand-written JAX equivalent of this HF model")


def _workload(key: str, label: str, title: str, config: Any, module: torch.nn.Module,
              args: tuple[torch.Tensor, ...], temp_argument: str) -> workloads.Workload:
    return workloads.Workload(
        key=key, label=label, title=title, config=config, module=module, args=args, donate=(),
        temp_bound=workloads.TempBound(0, temp_argument),
        jax_fn=_no_jax, jax_inputs=lambda: (), jax_donate_argnums=(), jax_flatten=_no_jax,
    )


def llama_decode_workload(config: LlamaDecodeConfig = LlamaDecodeConfig()) -> workloads.Workload:
    module = LlamaDecodeStep(config)
    args = (torch.tensor([[7]]), torch.tensor([config.position]))
    return _workload(
        "hf-llama-decode", "HF Llama static-cache decode step",
        f"HF Llama ({config.layers} layers, hidden {config.hidden_size}, GQA {config.heads}/{config.kv_heads} "
        f"heads, vocab {config.vocab_size}), one decode step with a {config.max_cache_len}-token StaticCache",
        config, module, args,
        "No bound derived for HF models (0 is used): the temp is the step's activations and the attention "
        "over the whole cache; its composition is measured below.")


def _bert_jax(params: dict[str, jax.Array], ids: jax.Array, heads: int) -> tuple[jax.Array, jax.Array]:
    """BertModel's forward (no mask, token type 0, exact GELU, eval) in JAX."""
    def linear(x: jax.Array, name: str) -> jax.Array:
        return x @ params[f"{name}.weight"].T + params[f"{name}.bias"]

    def norm(x: jax.Array, name: str) -> jax.Array:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-12) * params[f"{name}.weight"] + params[f"{name}.bias"]

    batch, length = ids.shape
    x = (params["embeddings.word_embeddings.weight"][ids]
         + params["embeddings.position_embeddings.weight"][:length]
         + params["embeddings.token_type_embeddings.weight"][0])
    x = norm(x, "embeddings.LayerNorm")
    layer = 0
    while f"encoder.layer.{layer}.attention.self.query.weight" in params:
        prefix = f"encoder.layer.{layer}"
        hidden = x.shape[-1]

        def split(t: jax.Array) -> jax.Array:
            return t.reshape(batch, length, heads, hidden // heads).transpose(0, 2, 1, 3)

        q = split(linear(x, f"{prefix}.attention.self.query"))
        k = split(linear(x, f"{prefix}.attention.self.key"))
        v = split(linear(x, f"{prefix}.attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(float(hidden // heads))
        context = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        x = norm(x + linear(context, f"{prefix}.attention.output.dense"), f"{prefix}.attention.output.LayerNorm")
        inner = jax.nn.gelu(linear(x, f"{prefix}.intermediate.dense"), approximate=False)
        x = norm(x + linear(inner, f"{prefix}.output.dense"), f"{prefix}.output.LayerNorm")
        layer += 1
    pooled = jnp.tanh(linear(x[:, 0], "pooler.dense"))
    return x, pooled


def bert_forward_workload(config: BertForwardConfig = BertForwardConfig()) -> workloads.Workload:
    torch.manual_seed(0)
    module = transformers.BertModel(transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.layers, num_attention_heads=config.heads, max_position_embeddings=512,
    )).eval()  # type: ignore[no-untyped-call]
    ids = torch.randint(0, config.vocab_size, (config.batch, config.sequence),
                        generator=torch.Generator().manual_seed(1))
    workload = _workload(
        "hf-bert-forward", "HF BERT forward",
        f"HF BertModel ({config.layers} layers, hidden {config.hidden_size}, {config.heads} heads, SDPA), "
        f"forward on batch {config.batch} x {config.sequence} tokens",
        config, module, (ids,),
        "No bound derived for HF models (0 is used): the temp is the forward's activations; its composition "
        "is measured below.")
    params = {name: workloads.to_jax(value) for name, value in module.named_parameters()}
    workload.jax_fn = lambda p, i: _bert_jax(p, i, config.heads)
    workload.jax_inputs = lambda: (params, workloads.to_jax(ids))
    return workload


def deberta_forward_workload(config: DebertaForwardConfig = DebertaForwardConfig()) -> workloads.Workload:
    module, ids = deberta_forward(config)
    return _workload(
        "hf-deberta-forward", "HF DeBERTa-v2 forward",
        f"HF DebertaV2Model ({config.layers} layers, hidden {config.hidden_size}, {config.heads} heads, relative "
        f"attention c2p + p2c), forward on batch {config.batch} x {config.sequence} tokens",
        config, module, (ids,),
        "No bound derived for HF models (0 is used): the temp is the forward's activations; its composition "
        "is measured below.")


def swin_forward_workload(config: SwinForwardConfig = SwinForwardConfig()) -> workloads.Workload:
    module, pixels = swin_forward(config)
    return _workload(
        "hf-swin-forward", "HF Swin forward",
        f"HF SwinModel (image {config.image_size}, patch {config.patch_size}, embed {config.embed_dim}, depths "
        f"{list(config.depths)}, heads {list(config.heads)}, window {config.window_size}), forward on batch "
        f"{config.batch}",
        config, module, (pixels,),
        "No bound derived for HF models (0 is used): the temp is the forward's activations; its composition "
        "is measured below.")


@dataclasses.dataclass
class ModelResult:
    workload: workloads.Workload
    minimum: workloads.Minimum
    hloalias: Measurement
    torch_mlir: Measurement
    jax: Measurement | None
    jax_error: float | None
    max_error: float
    steps_checked: int
    state_error: float
    mutated_state: list[str]


def _max_error(actual: Any, expected: Any) -> float:
    pairs = zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected))
    return max(float((a.double() - e.double()).abs().max()) for a, e in pairs if isinstance(e, torch.Tensor))


def run(workload: workloads.Workload, steps: int) -> ModelResult:
    """Measure ``workload`` and check ``steps`` calls against eager."""
    print(f"{workload.key}: minimum", file=sys.stderr, flush=True)
    minimum = workloads.derive_minimum(workload)
    eager = copy.deepcopy(workload.module)
    print(f"{workload.key}: hloalias", file=sys.stderr, flush=True)
    start = time.perf_counter()
    exe = hloalias.compile(workload.module, workload.args)
    seconds = time.perf_counter() - start
    stats = exe.memory_stats
    m_hloalias = systems._measurement(
        systems.SYSTEM_HLOALIAS, stats["argument_bytes"], stats["output_bytes"], stats["alias_bytes"],
        stats["temp_bytes"], systems.hlo_facts(exe._loaded), seconds)
    error = 0.0
    args = workload.args
    for step in range(steps):
        if workload.key == "hf-llama-decode":
            args = (torch.tensor([[3 + step]]), torch.tensor([step]))
        with torch.no_grad():
            expected = eager(*args)
        error = max(error, _max_error(exe(*args), expected))
    eager_state = {**dict(eager.named_parameters()), **dict(eager.named_buffers())}
    state_error = max(
        float((value.double() - eager_state[name].detach().double()).abs().max())
        for name, value in exe.state_dict().items() if name in eager_state)
    mutated = [entry["argument"] for entry in exe.aliases]
    print(f"{workload.key}: torch-mlir", file=sys.stderr, flush=True)
    m_torch_mlir = systems.measure_torch_mlir(workload, workload.exported())
    m_jax: Measurement | None = None
    jax_error: float | None = None
    if workload.jax_fn is not _no_jax:
        print(f"{workload.key}: jax.jit", file=sys.stderr, flush=True)
        m_jax, compiled = systems.measure_jax(workload)
        with torch.no_grad():
            expected = workload.module(*workload.args)
        got = compiled(*workload.jax_inputs())
        jax_error = max(
            float((torch.from_numpy(jax.device_get(g).copy()).double() - e.double()).abs().max())
            for g, e in zip(got, (expected.last_hidden_state, expected.pooler_output)))
    return ModelResult(workload, minimum, m_hloalias, m_torch_mlir, m_jax, jax_error, error, steps, state_error,
                       mutated)


def _b(value: int) -> str:
    return f"{value:,}"


def _row(name: str, m: Measurement, minimum: workloads.Minimum) -> str:
    if m.error is not None:
        return f"| {name} | failed: {m.error} | | | | | | |"
    return (f"| {name} | {_b(m.argument_bytes)} | {_b(m.output_bytes)} | {_b(m.alias_bytes)} | {_b(m.temp_bytes)} "
            f"| {_b(m.constant_bytes)} | {_b(m.device_total)} | {m.data_total / minimum.data_bytes:.4f} |")


def report(results: list[ModelResult]) -> str:
    lines = [
        "# hloalias on Hugging Face models\n",
        "Written by `.venv/bin/python -m bench.models` (CPU PJRT, jaxlib "
        f"{__import__('jaxlib').__version__}, torch {torch.__version__}, transformers {transformers.__version__}). "
        "Models are built from configs in code with random weights.\n",
        "The data minimum is derived as in `bench/RESULTS.md` (`bench.workloads.derive_minimum`): the module's "
        "distinct state tensors (tied weights once), the user inputs, and the outputs eager PyTorch allocates. "
        "Data ratio = (argument + output − alias) / data minimum; XLA's tuple of several results adds 8 bytes per "
        "result to its output figure. The BERT forward has a hand-written `jax.jit` equivalent beside it; the "
        "other models have none here.\n",
    ]
    for result in results:
        w = result.workload
        m = result.hloalias
        lines.append(f"## {w.label}\n")
        lines.append(f"{w.title}.\n")
        lines.append("Derivation of the minimum:\n")
        lines.extend(f"- {line}" for line in result.minimum.derivation)
        lines.append(f"- **data minimum: {_b(result.minimum.data_bytes)} bytes**\n")
        lines.append("| system | argument | output | alias | temp | constants | device total | data ratio |")
        lines.append("|---|---|---|---|---|---|---|---|")
        lines.append(_row("hloalias", m, result.minimum))
        lines.append(_row("torch-mlir export_and_import", result.torch_mlir, result.minimum))
        if result.jax is not None:
            lines.append(_row("jax.jit (hand-written, ids int32)", result.jax, result.minimum))
        lines.append("")
        if result.jax is not None:
            lines.append(f"The hand-written JAX forward matches eager to {result.jax_error:.2e}; its token ids are "
                         "int32 (JAX without x64), half the bytes of torch's int64 ids, and it takes no "
                         "buffers (BERT's int64 position_ids and token_type_ids, which the torch model holds as "
                         "state and the minimum counts), hence its smaller argument figure.\n")
        lines.append(f"Checked against eager over {result.steps_checked} call(s): largest output error "
                     f"{result.max_error:.2e}, largest state error after the calls {result.state_error:.2e}. "
                     f"hloalias compile {m.seconds:.1f} s.")
        if result.mutated_state:
            lines.append(f"State updated in place on the device (inferred donors, aliased): "
                         f"{', '.join(result.mutated_state)}.")
        lines.append("")
        lines.append("Where hloalias's temp bytes come from (optimized HLO):\n")
        lines.append(f"- copies materialized by the entry computation: {_b(m.copy_bytes)} bytes "
                     f"(of which transposed: {_b(m.transposed_copy_bytes)} bytes)")
        for shape, count in sorted(m.copy_shapes.items(), key=lambda item: -item[1]):
            lines.append(f"  - {count} x {shape}")
        rest = m.temp_bytes - m.copy_bytes + m.output_copy_bytes
        lines.append(f"- the other {_b(max(rest, 0))} bytes of the {_b(m.temp_bytes)}-byte temp are no copies: "
                     "buffers of values the forward computes that XLA's buffer assignment keeps live at once "
                     "(not broken down further here)")
        if m.transposed_parameters:
            lines.append(f"- entry parameters read by transposed copies: {sorted(set(m.transposed_parameters))}")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    options = parser.parse_args(argv)
    results = [run(llama_decode_workload(), steps=4), run(bert_forward_workload(), steps=1),
               run(deberta_forward_workload(), steps=1), run(swin_forward_workload(), steps=1)]
    path = os.path.join(options.out, "RESULTS-models.md")
    with open(path, "w") as handle:
        handle.write(report(results))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
