"""Training-step benchmark (issue 13): ``python -m bench.training`` writes
``bench/RESULTS-training.md``.

Workloads, written the PyTorch way and compiled with
:func:`hloalias.compile_training_step`:

1. SGD-momentum MLP (4x1024, batch 64, MSE loss) — the bench's SGD
   workload as a real training step (backward computes the gradients).
2. A tiny GPT-2 (transformers config, random weights) with AdamW.

Per workload: XLA's bytes (argument + output - alias + temp) against the
data minimum (parameters + optimizer state + batch + loss), the weight
copies XLA makes (``copy`` instructions of the compiled HLO), ``jax.jit`` of
a hand-written equivalent (``jax.value_and_grad`` + the optimizer written
out, state donated) where one exists, and the median step time against
eager PyTorch on CPU."""

from __future__ import annotations

import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import torch

import hloalias
from bench.systems import hlo_facts
from hloalias.pipeline import DEFAULT_PIPELINE

RESULTS = Path(__file__).with_name("RESULTS-training.md")
DUMP = Path(tempfile.mkdtemp(prefix="hloalias-bench-training-"))
F32 = 4
STEPS = 20


def _median_seconds(run: Callable[[], Any], steps: int = STEPS) -> float:
    run()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _torch_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                loss_of: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def step(*batch: torch.Tensor) -> torch.Tensor:
        loss = loss_of(model, *batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def _mlp_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def _gpt2_loss(model: Any, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss  # type: ignore[no-any-return]


def measure(name: str, model: torch.nn.Module, make_optimizer: Callable[..., torch.optim.Optimizer],
            loss_of: Callable[..., torch.Tensor], batch: tuple[torch.Tensor, ...],
            state_per_param: int, jax_run: Callable[[], dict[str, Any]] | None) -> dict[str, Any]:
    # Both read the initial weights: once the compiled step has run, the
    # model's parameters are its device state, updated by every step.
    eager_first_loss = float(loss_of(copy.deepcopy(model), *batch).detach())
    jax_result = jax_run() if jax_run else None
    eager_model = copy.deepcopy(model)
    eager_opt = make_optimizer(eager_model.parameters())
    opt = make_optimizer(model.parameters())
    start = time.perf_counter()
    train = hloalias.compile_training_step(_torch_step(model, opt, loss_of), model, opt, batch)
    compile_seconds = time.perf_counter() - start
    temp_slots = _temp_slots(train.memory_stats["temp_bytes"])
    unordered_model = copy.deepcopy(model)
    unordered_opt = make_optimizer(unordered_model.parameters())
    unordered = hloalias.compile_training_step(
        _torch_step(unordered_model, unordered_opt, loss_of), unordered_model, unordered_opt, batch,
        pipeline=DEFAULT_PIPELINE,
    )
    unordered_copies = hlo_facts(unordered.executable._loaded).copy_bytes
    stats = train.memory_stats
    facts = hlo_facts(train.executable._loaded)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    steps_bytes = F32 * len(list(model.parameters())) if state_per_param == 2 else 0
    batch_bytes = sum(t.numel() * t.element_size() for t in batch)
    minimum = params * (1 + state_per_param) + steps_bytes + batch_bytes + F32
    eager_step = _torch_step(eager_model, eager_opt, loss_of)
    # The first two steps of each from the same weights, before the timed
    # steps: the second loss reads the weights the first step's update wrote.
    first_losses = ([float(eager_step(*batch).detach()) for _ in range(2)],
                    [float(train(*batch)) for _ in range(2)])
    eager_s = _median_seconds(lambda: eager_step(*batch))
    hlo_s = _median_seconds(lambda: train(*batch))
    return {
        "name": name, "stats": stats, "minimum": minimum, "params": params, "batch": batch_bytes,
        "copy_bytes": facts.copy_bytes, "copy_shapes": facts.copy_shapes,
        "aliases": len(train.aliases), "alias_bytes": stats["alias_bytes"],
        "eager_s": eager_s, "hloalias_s": hlo_s, "compile_s": compile_seconds,
        "temp_slots": temp_slots,
        "unordered": unordered.memory_stats, "unordered_copy_bytes": unordered_copies,
        "eager_first_loss": eager_first_loss, "first_step_losses": first_losses,
        "jax": jax_result,
    }


def _temp_slots(temp_bytes: int) -> list[str]:
    """XLA's own account of the temp allocation of the newest compile: the
    memory-usage report block (slot size, offset, values sharing the slot)
    whose slots add up to ``temp_bytes``."""
    reports = sorted(DUMP.glob("*memory-usage-report.txt"), key=lambda p: p.stat().st_mtime)
    if not reports:
        return []
    blocks: list[list[str]] = []
    for line in reports[-1].read_text().splitlines():
        if "cumulative_size" in line:
            blocks.append([])
        elif blocks and ";" in line and "(" in line:
            blocks[-1].append(line.strip())
    for block in blocks:
        end = 0
        for row in block:
            fields = [f.strip() for f in row.split(";")]
            size = _parse_size(fields[1])
            end = max(end, int(fields[2]) + size)
        if abs(end - temp_bytes) <= 1024:
            return block
    return []


def _parse_size(text: str) -> int:
    units = {"KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "B": 1}
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def mlp_workload(layers: int = 4, width: int = 1024, batch: int = 64) -> dict[str, Any]:
    torch.manual_seed(0)
    modules: list[torch.nn.Module] = []
    for i in range(layers):
        modules.append(torch.nn.Linear(width, width))
        if i < layers - 1:
            modules.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*modules)
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    def jax_run() -> dict[str, Any]:
        params = [(jnp.asarray(m.weight.detach().numpy()), jnp.asarray(m.bias.detach().numpy()))
                  for m in model if isinstance(m, torch.nn.Linear)]
        momenta = jax.tree_util.tree_map(jnp.zeros_like, params)

        def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
            h = x
            for i, (w, b) in enumerate(params):
                h = h @ w.T + b
                if i < len(params) - 1:
                    h = jax.nn.relu(h)
            return jnp.mean((h - y) ** 2)

        def step(params: Any, momenta: Any, x: jax.Array, y: jax.Array) -> Any:
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            momenta = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, momenta, grads)
            params = jax.tree_util.tree_map(lambda p, m: p - 0.01 * m, params, momenta)
            return params, momenta, loss

        jitted = jax.jit(step, donate_argnums=(0, 1, 2, 3))
        jx, jy = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        compiled = jitted.lower(params, momenta, jx, jy).compile()
        analysis = compiled.memory_analysis()
        assert analysis is not None, "jaxlib reports no memory analysis"
        facts = hlo_facts(compiled.runtime_executable())
        first_loss = float(loss_fn(params, jx, jy))
        state = {"p": params, "m": momenta}

        def run() -> None:
            p, m, loss = compiled(state["p"], state["m"], jnp.array(jx), jnp.array(jy))
            loss.block_until_ready()
            state["p"], state["m"] = p, m

        seconds = _median_seconds(run)
        return {
            "first_loss": first_loss,
            "argument_bytes": analysis.argument_size_in_bytes, "output_bytes": analysis.output_size_in_bytes,
            "alias_bytes": analysis.alias_size_in_bytes, "temp_bytes": analysis.temp_size_in_bytes,
            "copy_bytes": facts.copy_bytes, "seconds": seconds,
        }

    return measure(f"SGD-momentum MLP {layers}x{width}, batch {batch}", model,
                   lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), _mlp_loss, (x, y), 1, jax_run)


def gpt2_workload() -> dict[str, Any]:
    import transformers

    config = transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 512, (4, 64))
    def jax_run() -> dict[str, Any]:
        return _jax_gpt2(model, config, ids)

    return measure("tiny GPT-2 (2 layers, 128 wide, vocab 512, 4x64 tokens), AdamW", model,
                   lambda p: torch.optim.AdamW(p, lr=1e-3), _gpt2_loss, (ids,), 2, jax_run)


def _jax_gpt2(model: torch.nn.Module, config: Any, ids: torch.Tensor) -> dict[str, Any]:
    """GPT-2 (transformers' layout: Conv1D weights are ``x @ W``, tied
    ``lm_head``, tanh GELU) and AdamW written out in JAX, state donated."""
    params = {n: jnp.asarray(p.detach().numpy()) for n, p in model.named_parameters()}
    heads, eps = config.n_head, config.layer_norm_epsilon

    def layer_norm(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + eps) * w + b

    def loss_fn(p: dict[str, jax.Array], tokens: jax.Array) -> jax.Array:
        batch, length = tokens.shape
        h = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][:length]
        mask = jnp.tril(jnp.ones((length, length), bool))
        for i in range(config.n_layer):
            pre = f"transformer.h.{i}."
            a = layer_norm(h, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"])
            qkv = a @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
            q, k, v = (t.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, -1))
            scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(q.shape[-1])
            scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
            attn = (jax.nn.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(batch, length, -1)
            h = h + attn @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
            m = layer_norm(h, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
            m = jax.nn.gelu(m @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"], approximate=True)
            h = h + m @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
        h = layer_norm(h, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
        logits = h @ p["transformer.wte.weight"].T
        logp = jax.nn.log_softmax(logits[:, :-1], -1)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

    lr, b1, b2, adam_eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2

    def step(p: Any, m: Any, v: Any, count: jax.Array, tokens: jax.Array) -> Any:
        loss, g = jax.value_and_grad(loss_fn)(p, tokens)
        count = count + 1
        m = jax.tree_util.tree_map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
        v = jax.tree_util.tree_map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
        c1, c2 = 1 - b1 ** count, 1 - b2 ** count
        p = jax.tree_util.tree_map(
            lambda p_, m_, v_: p_ * (1 - lr * wd) - lr * (m_ / c1) / (jnp.sqrt(v_ / c2) + adam_eps), p, m, v)
        return p, m, v, count, loss

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    tokens = jnp.asarray(ids.numpy())
    count = jnp.zeros((), jnp.float32)
    compiled = jax.jit(step, donate_argnums=(0, 1, 2, 3, 4)).lower(params, zeros, zeros, count, tokens).compile()
    analysis = compiled.memory_analysis()
    assert analysis is not None, "jaxlib reports no memory analysis"
    facts = hlo_facts(compiled.runtime_executable())
    first_loss = float(loss_fn(params, tokens))
    state = {"p": params, "m": zeros, "v": jax.tree_util.tree_map(jnp.zeros_like, params), "c": count}

    def run() -> None:
        p, m, v, c, loss = compiled(state["p"], state["m"], state["v"], state["c"], jnp.array(tokens))
        loss.block_until_ready()
        state.update(p=p, m=m, v=v, c=c)

    seconds = _median_seconds(run)
    return {
        "first_loss": first_loss,
        "argument_bytes": analysis.argument_size_in_bytes, "output_bytes": analysis.output_size_in_bytes,
        "alias_bytes": analysis.alias_size_in_bytes, "temp_bytes": analysis.temp_size_in_bytes,
        "copy_bytes": facts.copy_bytes, "seconds": seconds,
    }


def _mb(value: int) -> str:
    return f"{value / 1e6:,.2f} MB"


def write(results: list[dict[str, Any]]) -> str:
    lines = ["# Training steps: device bytes and step time", "",
             "Written by `python -m bench.training` (CPU PJRT, jaxlib 0.10.2). A step is "
             "`loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()` compiled with "
             "`hloalias.compile_training_step`; parameters and optimizer state are inferred donors "
             "(aliased in place). Minimum = parameters + optimizer state + batch + loss. "
             f"Times are medians of {STEPS} steps.", ""]
    for r in results:
        s = r["stats"]
        lines += [f"## {r['name']}", "",
                  "| system | argument | output | alias | temp | total | total / minimum | weight copies |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|",
                  f"| hloalias | {_mb(s['argument_bytes'])} | {_mb(s['output_bytes'])} | {_mb(s['alias_bytes'])} "
                  f"| {_mb(s['temp_bytes'])} | {_mb(s['total_bytes'])} | {s['total_bytes'] / r['minimum']:.3f}x "
                  f"| {_mb(r['copy_bytes'])} |"]
        u = r["unordered"]
        lines.append(f"| hloalias without order-in-place-updates | {_mb(u['argument_bytes'])} | {_mb(u['output_bytes'])} "
                     f"| {_mb(u['alias_bytes'])} | {_mb(u['temp_bytes'])} | {_mb(u['total_bytes'])} "
                     f"| {u['total_bytes'] / r['minimum']:.3f}x | {_mb(r['unordered_copy_bytes'])} |")
        if r["jax"]:
            j = r["jax"]
            total = j["argument_bytes"] + j["output_bytes"] - j["alias_bytes"] + j["temp_bytes"]
            lines.append(f"| jax.jit (hand-written, donated) | {_mb(j['argument_bytes'])} | {_mb(j['output_bytes'])} "
                         f"| {_mb(j['alias_bytes'])} | {_mb(j['temp_bytes'])} | {_mb(total)} "
                         f"| {total / r['minimum']:.3f}x | {_mb(j['copy_bytes'])} |")
            lines += ["", f"jax first loss {j['first_loss']:.6f}, eager PyTorch first loss {r['eager_first_loss']:.6f} "
                      "(same weights and batch: the hand-written step computes the same function)."]
        eager_loss, hloalias_loss = r["first_step_losses"]
        lines += ["", "Losses of the first two steps: eager PyTorch "
                  f"{', '.join(f'{v:.6f}' for v in eager_loss)}; hloalias {', '.join(f'{v:.6f}' for v in hloalias_loss)}."]
        lines += ["", f"Minimum {_mb(r['minimum'])} (parameters {_mb(r['params'])}, batch {_mb(r['batch'])}); "
                  f"{r['aliases']} aliases ({_mb(r['alias_bytes'])}). Copies by shape: {r['copy_shapes'] or 'none'}.", "",
                  "| | eager PyTorch CPU | hloalias | " + ("jax.jit |" if r["jax"] else ""),
                  "|---|---:|---:|" + ("---:|" if r["jax"] else ""),
                  f"| step time | {r['eager_s'] * 1e3:.2f} ms | {r['hloalias_s'] * 1e3:.2f} ms | "
                  + (f"{r['jax']['seconds'] * 1e3:.2f} ms |" if r["jax"] else ""),
                  "", f"Compile (capture + import + passes + XLA): {r['compile_s']:.1f} s.", ""]
        if r["temp_slots"]:
            lines += [f"hloalias temp ({_mb(s['temp_bytes'])}), slot by slot from XLA's buffer assignment "
                      "(cumulative; size; offset; values sharing the slot; their shapes):", "", "```",
                      *r["temp_slots"], "```", ""]
    lines += ["## Findings", "",
              "- A real training step does not by itself let XLA:CPU drop the weight copies: every weight the "
              "backward reads for an input gradient (dX = dY @ W; layers 1..3 of the MLP) is copied before "
              "the in-place update, because nothing orders that read before the write (the update depends on "
              "dW, not on dX); see the rows without `order-in-place-updates`. `jax.jit` of the hand-written "
              "step with donated state makes the same copies.",
              "- `stablehlo.optimization_barrier` over the update's increment and the dX results (update moved "
              "after it) was tried first and gave byte-identical figures: XLA:CPU's `cse_barrier_expander` "
              "removes barriers before copy insertion without adding control dependencies.",
              "- The remedy shipped, `order-in-place-updates` (default in `compile_training_step`): the op "
              "writing an aliased argument's new value moves into a `stablehlo.if` whose two branches are "
              "that same op and whose predicate reads one element of each unordered reader's result. The "
              "value is the same whatever the predicate; the readers become data predecessors of the write, "
              "and XLA updates the weights in place with no copy (losses and weights bit-identical to the "
              "unguarded program: test_order_in_place_updates_removes_weight_copies).",
              "- What the remaining temp holds is listed above from XLA's buffer assignment: gradient "
              "buffers (one dW at a time for the MLP) and the activations and activation gradients "
              "backward needs.", ""]
    return "\n".join(lines)


def main() -> None:
    # XLA reads its flags when the CPU client starts: before any compile.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP}").strip()
    results = [mlp_workload(), gpt2_workload()]
    text = write(results)
    RESULTS.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
