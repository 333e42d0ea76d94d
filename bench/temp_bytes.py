"""Re-measure issue 15's table: XLA's temp bytes on the workloads where
layouts, scatters and broadcasts dominate, before and after the passes.

``.venv/bin/python -m bench.temp_bytes`` writes ``bench/RESULTS-temp.md``.
Each row compiles the workload twice with ``hloalias.compile``: with the
previous default pipeline (``fold-transpose-into-dot-general,
eliminate-view-results, alias-donated-buffers``) and with today's
:data:`hloalias.pipeline.DEFAULT_PIPELINE`, and reports XLA's compiled memory
statistics of both, the data bytes (argument + output - alias, what no
scratch-memory change can remove) and the copy instructions left in the
optimized HLO as evidence for any remaining gap.  Peer figures (torch_xla,
torchax) are quoted from issue 15; this module does not run them."""

from __future__ import annotations

import dataclasses
import platform
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import hloalias
from bench.workloads import GPT2Config, derive_minimum, gpt2_workload
from hloalias.pipeline import CPU_PIPELINE, DEFAULT_PIPELINE, POOL_LAYOUT_PASS, STATE_BITS_PASS, STATE_LAYOUT_PASS

PREVIOUS_PIPELINE = "builtin.module(fold-transpose-into-dot-general, eliminate-view-results, alias-donated-buffers)"
MATVEC_OPTION = "returned-matvec-as-reduce"


def with_matvec_option(pipeline: str) -> str:
    """``pipeline`` with the opt-in ``returned-matvec-as-reduce`` after the scatter passes."""
    return pipeline.replace("window-scatter-indices,", f"window-scatter-indices, {MATVEC_OPTION},")
RESULTS = Path(__file__).with_name("RESULTS-temp.md")


@dataclasses.dataclass(frozen=True)
class Row:
    """One re-measured row of the issue's table."""

    title: str
    before: dict[str, int]
    after: dict[str, int]
    minimum: int
    minimum_source: str
    peers: str
    copies: list[str]
    note: str
    option: tuple[str, dict[str, int]] | None = None
    largest: list[str] = dataclasses.field(default_factory=list)

    @property
    def data_bytes(self) -> int:
        """argument + output - alias of the final executable."""
        return self.after["argument_bytes"] + self.after["output_bytes"] - self.after["alias_bytes"]


def _entry_copies(exe: hloalias.Executable) -> list[str]:
    """Copy instructions (plain or loop-fused) in the optimized HLO's entry computation."""
    text = exe._loaded.hlo_modules()[0].to_string()
    entry = text[text.index("\nENTRY ") :]
    found = []
    for line in entry.splitlines():
        match = re.match(r"\s*(?:ROOT )?(%[\w.-]*copy[\w.-]*) = (\S+) (copy|fusion)\(([^)]*)\)", line)
        if match:
            found.append(f"{match[1]} = {match[2]} {match[3]}({match[4]})")
    return found


_ELEMENT_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2,
                  "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}


def _largest_entry_values(exe: hloalias.Executable, count: int = 8) -> list[str]:
    """The largest non-parameter values the optimized entry computation
    defines (candidates for temp), with their byte sizes."""
    text = exe._loaded.hlo_modules()[0].to_string()
    entry = text[text.index("\nENTRY ") :]
    sized = []
    for line in entry.splitlines()[1:]:
        match = re.match(r"\s*(?:ROOT )?(%\S+) = (\w+)\[([\d,]*)\]\S* (\w[\w-]*)\(", line)
        if not match or match[4] in ("parameter", "constant", "bitcast", "tuple", "get-tuple-element"):
            continue
        elements = 1
        for size in filter(None, match[3].split(",")):
            elements *= int(size)
        sized.append((elements * _ELEMENT_BYTES.get(match[2], 4), f"{match[1]} = {match[2]}[{match[3]}] {match[4]}"))
    sized.sort(key=lambda item: -item[0])
    return [f"{size:>12,}  {text}" for size, text in sized[:count]]


def _compile_both(module: Any, args: tuple[Any, ...], pipeline: str = DEFAULT_PIPELINE,
                  previous: str = PREVIOUS_PIPELINE) -> tuple[hloalias.Executable, hloalias.Executable]:
    before = hloalias.compile(module, args, pipeline=previous)
    after = hloalias.compile(module, args, pipeline=pipeline)
    return before, after


class RowWrites(torch.nn.Module):
    """Ten ``index_copy_`` of 12 rows each into a 4096x16x64 bf16 cache."""

    cache: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(4096, 16, 64, dtype=torch.bfloat16))

    def forward(self, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        for i in range(10):
            self.cache.index_copy_(0, index[12 * i : 12 * i + 12], rows[12 * i : 12 * i + 12])
        return self.cache[:1, :1].float().sum()


def _temp_with_int16_rows(exe: hloalias.Executable) -> int:
    """XLA's temp bytes for ``exe``'s final module (the bf16 cache row) with
    its bf16 ``rows`` input declared int16: each 12-row slice is sliced as
    int16 and its cast to int16 becomes a no-op reshape."""
    import jax

    from hloalias.runtime.pjrt import compile_module, memory_stats

    text = exe.mlir.replace("%arg2: tensor<120x16x64xbf16>", "%arg2: tensor<120x16x64xi16>")
    text, slices = re.subn(r"(stablehlo.slice %arg2 \[[^\]]*\] : \(tensor<120x16x64x)bf16(>\) -> tensor<12x16x64x)bf16>",
                           r"\1i16\2i16>", text)
    text, casts = re.subn(r"stablehlo.bitcast_convert (%\w+) : \(tensor<12x16x64xbf16>\) -> tensor<12x16x64xi16>",
                          r"stablehlo.reshape \1 : (tensor<12x16x64xi16>) -> tensor<12x16x64xi16>", text)
    assert slices == casts == 10, (slices, casts)
    return int(memory_stats(compile_module(text, jax.devices("cpu")[0])).temp_bytes)


SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def _temp_with_memory_scheduler(exe: hloalias.Executable) -> int:
    """XLA's temp bytes for ``exe``'s final module compiled with XLA:CPU's
    memory-minimizing scheduler instead of its concurrency-optimized default
    (``XLA_FLAGS``, read when the backend starts: a child process, without
    the disk cache)."""
    import os
    import subprocess
    import tempfile

    script = (
        "import sys, jax\n"
        "from hloalias.runtime.pjrt import compile_module, memory_stats\n"
        "text = open(sys.argv[1]).read()\n"
        "print(memory_stats(compile_module(text, jax.devices('cpu')[0])).temp_bytes)\n"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".mlir", delete=False) as handle:
        handle.write(exe.mlir)
    try:
        env = dict(os.environ, XLA_FLAGS=SCHEDULER_FLAG, HLOALIAS_CACHE="0")
        done = subprocess.run([sys.executable, "-c", script, handle.name], env=env, capture_output=True,
                              text=True, timeout=600, check=True)
    finally:
        os.unlink(handle.name)
    return int(done.stdout.strip().splitlines()[-1])


def bf16_cache_row() -> Row:
    """The bf16 cache: the previous and today's default pipeline, and what
    ``hloalias.compile`` runs on one CPU device (:data:`CPU_PIPELINE`, whose
    ``store-state-as-bits`` stores the cache as its int16 bits)."""
    import copy

    torch.manual_seed(0)
    model = RowWrites()
    eager = copy.deepcopy(model)
    args = (torch.randperm(4096)[:120], torch.randn(120, 16, 64, dtype=torch.bfloat16))
    before, after = _compile_both(model, args)
    # Its own copy of the module: executables of one module share its device
    # state, whose dtype the first of them fixed (torch's, here).
    stored = hloalias.compile(copy.deepcopy(model), args, pipeline=CPU_PIPELINE)
    assert stored._stored_bits == {"cache": torch.int16}, stored._stored_bits
    expected = RowWrites.forward(eager, *args)
    for exe in (after, stored):
        torch.testing.assert_close(exe(*args), expected, rtol=0, atol=0)
    torch.testing.assert_close(stored.state_dict()["cache"], eager.cache, rtol=0, atol=0)
    stats = after.memory_stats
    minimum = stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"]
    option = stored.memory_stats
    update_bytes = 10 * 12 * 16 * 64 * 2
    rest = option["temp_bytes"] - update_bytes
    cache_bytes = 4096 * 16 * 64 * 2
    rows_int16_temp = _temp_with_int16_rows(stored)
    scheduled_temp = _temp_with_memory_scheduler(stored)
    scheduled_total = option["total_bytes"] - option["temp_bytes"] + scheduled_temp
    note = (
        "`bitcast-overwrite-scatter` scatters i16 instead of XLA:CPU's f32 round trip (two f32 copies of the "
        f"cache): temp {before.memory_stats['temp_bytes']:,} -> {stats['temp_bytes']:,} bytes. With the default "
        "pipeline one i16 copy of the cache stays in temp: XLA:CPU materializes `bitcast_convert` of the parameter "
        "as a loop fusion (`wrapped_bitcast-convert = s16[4096,16,64] fusion(Arg_0)`), it does not alias it. "
        f"With `{CPU_PIPELINE}` (what `hloalias.compile` runs on one CPU device when no pipeline is given), "
        f"`{STATE_BITS_PASS}` stores the cache as its int16 bit pattern (`hloalias.stored_bits_of = bf16`; the "
        "runtime uploads `cache.view(torch.int16)` once and `state_dict()` returns bf16): the parameter, the "
        "scatters and the aliased new value are all s16, no cache-sized cast is left (the largest values below, "
        "after the ten in-place s16[4096,16,64] scatters on the aliased cache) "
        f"and temp is {option['temp_bytes']:,} bytes, {option['total_bytes'] / minimum:.4f}x the minimum. "
        f"Of that, {update_bytes:,} bytes are the ten 12-row slices of the `rows` input each scatter reads "
        "(`bitcast-convert_bitcast_fusion = s16[12,1,16,64] fusion(Arg_2)`, 24,576 bytes each), which XLA:CPU "
        "materializes and schedules all before the first scatter, so all ten are alive together; the other "
        f"{rest:,} bytes are the s64[12,1] index slices and the f32 read of two rows. Not the dtype of `rows`: "
        "the same final module with `rows` handed over as int16 (its ten casts replaced by no-op reshapes) "
        f"keeps temp at {rows_int16_temp:,} bytes, so a zero-copy int16 view of the user input would not help. "
        "It is the schedule: the same final module compiled with XLA:CPU's memory-minimizing scheduler "
        f"(`XLA_FLAGS={SCHEDULER_FLAG}`, measured in a child process) has temp {scheduled_temp:,} bytes "
        "(one 24,576-byte update slice and one 96-byte index slice), total "
        f"{scheduled_total:,} ({scheduled_total / minimum:.4f}x); the default concurrency-optimized scheduler "
        "puts the ten independent slice copies first (hloalias does not change XLA's scheduler; jaxlib "
        "0.10.2's `CompileOptions.env_option_overrides` with this option compiles but leaves temp unchanged). "
        f"The cache itself ({cache_bytes:,} bytes) is no longer copied."
    )
    return Row("10x `index_copy_` (12 rows each) into a 4096x16x64 bf16 cache", before.memory_stats,
               stats, minimum, "arguments + new outputs (XLA's data bytes)",
               "torch_xla 4.94x, torchax 4.88x (issue 15, its own variant of the workload)",
               _entry_copies(stored), note,
               option=("+ state passes (`CPU_PIPELINE`)", option),
               largest=[v for v in _largest_entry_values(stored, 24) if "s16[4096,16,64]" not in v][:8])


class InputRowWrites(torch.nn.Module):
    """:class:`RowWrites` with the cache passed by the caller (the first user input)."""

    def forward(self, cache: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        for i in range(10):
            cache.index_copy_(0, index[12 * i : 12 * i + 12], rows[12 * i : 12 * i + 12])
        return cache[:1, :1].float().sum()


def bf16_input_cache_row() -> Row:
    """The bf16 cache as a donated user input: ``hloalias.compile(M(), args,
    donate=(0,))`` (:data:`CPU_PIPELINE`), before = the same pipeline
    without ``store-state-as-bits`` (what it did for a user input before it
    stored one as bits).  Result and mutated cache checked against eager."""
    torch.manual_seed(0)
    cache = torch.randn(4096, 16, 64).bfloat16()
    args = (torch.randperm(4096)[:120], torch.randn(120, 16, 64, dtype=torch.bfloat16))
    without = CPU_PIPELINE.replace(f", {STATE_BITS_PASS}", "")
    before = hloalias.compile(InputRowWrites(), (cache.clone(),) + args, donate=(0,), pipeline=without)
    after = hloalias.compile(InputRowWrites(), (cache.clone(),) + args, donate=(0,))
    assert before._input_bits == {} and after._input_bits == {0: torch.int16}, after._input_bits
    eager_cache = cache.clone()
    expected = InputRowWrites()(eager_cache, *args)
    for exe in (before, after):
        mine = cache.clone()
        got = exe(mine, *args)
        assert torch.equal(got, expected) and mine.dtype == torch.bfloat16 and torch.equal(mine, eager_cache)
    stats = after.memory_stats
    minimum = stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"]
    note = (
        f"`before` = `{without}` (the CPU pipeline without `{STATE_BITS_PASS}`: a user input kept bf16, so XLA:CPU "
        "copies the cache to bit-cast it to s16, temp "
        f"{before.memory_stats['temp_bytes']:,} bytes); `after` = `{CPU_PIPELINE}` (what `hloalias.compile(M(), "
        f"args, donate=(0,))` runs): `{STATE_BITS_PASS}` stores the donated input, aliased to its own new value, "
        "as its int16 bits; the runtime hands XLA `cache.view(torch.int16)` (no copy) and the caller's tensor "
        "stays bf16. What is left is the ten 12-row update slices, as in the state row. Result and mutated "
        "cache equal eager's exactly."
    )
    return Row("10x `index_copy_` (12 rows each) into a donated 4096x16x64 bf16 user input",
               before.memory_stats, stats, minimum, "arguments + new outputs (XLA's data bytes)",
               "not measured here", _entry_copies(after), note, largest=_largest_entry_values(after))


class KVStep(torch.nn.Module):
    """Write k at the step's slot of an 8x256x64 cache, advance the step, score q."""

    step: torch.Tensor
    k_cache: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("step", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("k_cache", torch.zeros(8, 256, 64))

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        slot = torch.remainder(self.step, 256)
        self.k_cache.index_copy_(1, slot, k)
        self.step.add_(1)
        return q @ self.k_cache.transpose(1, 2)


def kv_step_row() -> Row:
    torch.manual_seed(1)
    model = KVStep()
    args = (torch.randn(8, 1, 64), torch.randn(8, 1, 64))
    before, after = _compile_both(model, args)
    stats = after.memory_stats
    minimum = stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"]
    return Row("step counter + `index_copy_` into an 8x256x64 cache (q @ cache^T out)", before.memory_stats,
               stats, minimum, "arguments + new outputs (XLA's data bytes)",
               "torch_xla 1.030x, torchax 1.0003x (issue 15, its own variant)",
               _entry_copies(after),
               "`window-scatter-indices` replaces the 8x1x64x3 i64 per-element index (12,288 bytes) by one "
               "index per slice. The remaining 8,192 bytes of temp are the 8x1x256 scores: XLA:CPU computes "
               "the dot as f32[8,256] and bitcasts it to f32[8,1,256]{2,0,1}, a layout that differs from the "
               "output's {2,1,0} only in where the size-1 dimension sits, then copies it (see the copy below). "
               "That is the same compute-then-copy shape as GPT-2's logits. `returned-matvec-as-reduce` does not "
               "help here: the product needs the updated cache as f32[8,1,256,64], and XLA:CPU materializes "
               "that unit-dim broadcast of the dynamic-update-slice result as a copy of the whole cache "
               "(`bitcast_copy_fusion = f32[8,1,256,64] fusion(select_dynamic-update-slice_fusion)`, temp "
               "524,288), so the row keeps the dot (8,192 bytes, the size of the scores).")


def bert_row() -> Row:
    import transformers

    config = transformers.BertConfig(attn_implementation="sdpa")
    torch.manual_seed(2)
    model = transformers.BertModel(config).eval()
    # The importer does not yet export non-persistent buffers (position_ids,
    # token_type_ids); make them persistent so the model imports.
    for submodule in model.modules():
        getattr(submodule, "_non_persistent_buffers_set", set()).clear()
    ids = torch.randint(0, config.vocab_size, (2, 128))
    before, after = _compile_both(model, (ids,))
    with torch.no_grad():
        expected = model(ids).last_hidden_state
    result = after(ids)
    hidden = result[0] if isinstance(result, (tuple, list)) else result["last_hidden_state"]
    torch.testing.assert_close(hidden, expected, rtol=1e-4, atol=1e-4)
    stats = after.memory_stats
    minimum = stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"]
    ffn_bytes = 2 * 128 * config.intermediate_size * 4
    return Row("BERT-base, SDPA, batch 2, 128 tokens (random weights)", before.memory_stats, stats, minimum,
               "arguments + new outputs (XLA's data bytes)", "none measured in issue 15",
               _entry_copies(after),
               ("`fold-broadcast-into-dot-general` feeds each attention output weight to a non-batched dot "
                "instead of broadcasting its transpose to [2, 768, 768]; the transpose then folds too. "
                if before.memory_stats["temp_bytes"] > stats["temp_bytes"] else
                "The previous default pipeline gives the same bytes in this run: today's import no longer "
                "broadcasts any weight to [2, 768, 768] (no `broadcast_in_dim` to a batched weight in the "
                "imported module), so `fold-broadcast-into-dot-general` finds nothing to fold on this model "
                "(on the import measured at commit 8c1b24f it cut temp 62,523,392 -> 7,078,912; its FileCheck "
                "and byte tests keep the pattern covered). ") +
               "What remains in temp is activations, listed below: no weight-sized value is left. The FFN "
               f"intermediate (2x128x3072 f32, {ffn_bytes:,} bytes) must exist while the second FFN matmul "
               "reads it, so it is an unavoidable temporary: counted in, the minimum is "
               f"{minimum + ffn_bytes:,} bytes and hloalias is at "
               f"{stats['total_bytes'] / (minimum + ffn_bytes):.4f}x of it. The rest is XLA:CPU applying GELU "
               "out of place (`multiply_bitcast_fusion` beside the `ynn_fusion` matmul output, both "
               "f32[256,3072]).",
               largest=_largest_entry_values(after))


def gpt2_row() -> Row:
    import copy

    workload = gpt2_workload(GPT2Config())
    minimum = derive_minimum(workload)
    pipeline = workload.pipeline
    previous = PREVIOUS_PIPELINE
    if workload.donate:
        names = ",".join(str(d) for d in workload.donate)
        previous = previous.replace("alias-donated-buffers", f"alias-donated-buffers{{donate={names}}}")
    eager = copy.deepcopy(workload.module)
    before = hloalias.compile(workload.module, workload.args, pipeline=previous, donate=workload.donate)
    after = hloalias.compile(workload.module, workload.args, pipeline=pipeline, donate=workload.donate)
    option = hloalias.compile(copy.deepcopy(workload.module), workload.args,
                              pipeline=with_matvec_option(pipeline), donate=workload.donate)
    args = tuple(a.clone() for a in workload.args)
    torch.testing.assert_close(option(*args), eager(*args), rtol=1e-4, atol=1e-4)
    return Row("GPT-2-small decode step", before.memory_stats, after.memory_stats, minimum.total_bytes,
               "bench/workloads.py derive_minimum", "torch_xla 1.59x, torchax 1.0002x (temp 101,441) (issue 15)",
               _entry_copies(after),
               "Default pipeline: the 201,028 bytes are the logits, 50,257 x 4. XLA:CPU lowers the one-row dot "
               "to a matrix-vector call into a temp buffer, then copies it into the f32[1,1,50257] output through "
               "a loop fusion of bitcasts (the `bitcast_bitcast_fusion`/copy below; `jax.jit` of the same dot "
               "gives the same 201,028 bytes). The opt-in `returned-matvec-as-reduce` writes the logits as "
               "`reduce(multiply(broadcast(h), W))`, one fusion XLA:CPU emits straight into the output buffer: "
               "temp drops to 101,441 bytes (torchax's figure), logits equal eager's within 1e-4. It is not in "
               "the default pipeline because it changes the summation order.",
               option=(f"+ {MATVEC_OPTION}", option.memory_stats))


def _resnet_row(title: str, config: Any, pixels: torch.Tensor, peers: str) -> Row:
    """An HF ResNet row: the previous and today's default pipeline, and
    what ``hloalias.compile`` runs on one CPU device (:data:`CPU_PIPELINE`:
    the default plus the two layout passes)."""
    import copy

    import transformers

    torch.manual_seed(3)
    model = transformers.ResNetModel(config).eval()
    before, after = _compile_both(model, (pixels,))
    # Its own copy of the module: executables of one module share its device
    # state, whose layout the first of them fixed (torch's, here).
    stored = hloalias.compile(copy.deepcopy(model), (pixels,), pipeline=CPU_PIPELINE)
    with torch.no_grad():
        expected = model(pixels).pooler_output
    for exe in (after, stored):
        result = exe(pixels)
        pooled = result[1] if isinstance(result, (tuple, list)) else result["pooler_output"]
        torch.testing.assert_close(pooled, expected, rtol=1e-4, atol=1e-4)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(stored.state_dict()[name], value, rtol=0, atol=0)
    conv_bytes = sum(p.numel() * 4 for n, p in model.named_parameters() if p.dim() == 4)
    stats = after.memory_stats
    minimum = stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"]
    batch, _, height, width = pixels.shape
    # The stem's 7x7/2 convolution output and the max-pool output it feeds
    # are alive together while the pool runs, in any schedule.
    stem = batch * config.embedding_size * (height // 2) * (width // 2) * 4
    pooled_stem = stem // 4
    floor = minimum + stem + pooled_stem
    option = stored.memory_stats
    beyond = option["total_bytes"] - floor
    pixels_nhwc = pixels.numel() * 4
    flipped = [name for name, layout in stored._stored_layouts.items() if layout.reversed]
    swapped = (
        f"and reads the 3x3 kernels of convolutions whose window is larger than their map reversed "
        f"(XLA swaps their operands: {', '.join(flipped)}), " if flipped else ""
    )
    note = (
        "Default pipeline: XLA:CPU copies every conv weight from torch's OIHW layout into the HWIO layout "
        f"its convolution reads, on each call (`transpose_copy_fusion` of each weight), {swapped}and "
        "relayouts the stem's NCHW output for the NCHW max-pool (and the pool's output back). With "
        f"`{CPU_PIPELINE}` (what `hloalias.compile` runs on one CPU device when no pipeline is given), "
        f"`{STATE_LAYOUT_PASS}` stores each read-only conv weight as HWIO"
        + (" (flipped along H and W where XLA swaps)" if flipped else "")
        + f" and `{POOL_LAYOUT_PASS}` runs the max-pool in the convolution's NHWC order: temp "
        f"{before.memory_stats['temp_bytes']:,} -> {option['temp_bytes']:,} bytes, `state_dict()` equal to "
        "the module's. What remains (largest values below) are activations: the stem's 7x7/2 output "
        f"({stem:,} bytes) and the max-pool output it feeds ({pooled_stem:,}) are alive together in any "
        f"schedule; counted in, the minimum is {floor:,} bytes and hloalias is at "
        f"{option['total_bytes'] / floor:.4f}x of it. The other {beyond:,} bytes come from XLA:CPU's NHWC "
        f"copy of the caller's NCHW pixels ({pixels_nhwc:,} bytes, `transpose_copy_fusion = "
        f"f32[{batch},{height},{width},3]`), alive beside the stem's output while the stem convolution "
        "runs: the input's layout is the caller's, no state layout removes it."
    )
    return Row(f"{title}; conv weights {conv_bytes:,} bytes", before.memory_stats, stats, minimum,
               "arguments + new outputs (XLA's data bytes)", peers, _entry_copies(stored), note,
               option=("+ layout passes (`CPU_PIPELINE`)", option), largest=_largest_entry_values(stored))


def resnet_row() -> Row:
    import transformers

    config = transformers.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
                                       layer_type="basic")
    return _resnet_row("HF ResNet (basic, 4 stages, 32-256 channels) eval, 2x3x64x64", config,
                       torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(4)),
                       "none measured in issue 15")


def resnet18_row() -> Row:
    import transformers

    config = transformers.ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                                       layer_type="basic")
    return _resnet_row("HF ResNet in ResNet-18's shape (basic, [2,2,2,2], 64-512 channels) eval, 2x3x224x224",
                       config, torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(4)),
                       "torchax 0.0.13 (jax 0.10.2, `bench/resnet_torchax.py`, the same network written in torch): "
                       "temp 57,344,768, total 103,498,256 (2.2425x); issue 15: hloalias at 2.2x on torchvision "
                       "resnet18, B=2 (the `total before` here)")


def conv_layout_experiment() -> list[str]:
    """Item 5 evidence, through jaxlib 0.10.2's own API: what entry layouts
    do for a conv weight's per-call copy on XLA:CPU.  Returns report lines."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.layout import Format, Layout
    from jax.sharding import SingleDeviceSharding

    def conv_oihw(w: Any, x: Any) -> Any:
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))

    def conv_stored_hwio(w_hwio: Any, x: Any) -> Any:
        return conv_oihw(jnp.transpose(w_hwio, (3, 2, 0, 1)), x)

    device = jax.devices("cpu")[0]
    weight, x = jnp.ones((128, 128, 3, 3)), jnp.ones((2, 128, 16, 16))
    weight_hwio = jnp.transpose(weight, (2, 3, 1, 0))
    cases = [
        ("default entry layouts", jax.jit(conv_oihw), weight),
        ("`Layout.AUTO` on the weight (`mhlo.layout_mode = \"auto\"`)",
         jax.jit(conv_oihw, in_shardings=(Format(Layout.AUTO), None)), weight),
        ("explicit HWIO entry layout on the weight (major_to_minor (2,3,1,0))",
         jax.jit(conv_oihw, in_shardings=(Format(Layout(major_to_minor=(2, 3, 1, 0)), SingleDeviceSharding(device)), None)),
         weight),
        ("weight stored transposed (HWIO shape), transposed back to OIHW in the program",
         jax.jit(conv_stored_hwio), weight_hwio),
    ]
    small_x = jnp.ones((2, 128, 2, 2))
    flipped = jnp.flip(weight_hwio, (0, 1))
    small_cases = [
        ("same weight on a 2x2 map (XLA swaps the operands), stored HWIO", jax.jit(conv_stored_hwio), weight_hwio),
        ("same weight on a 2x2 map, stored HWIO and flipped along H, W, flipped back in the program",
         jax.jit(lambda w, x: conv_stored_hwio(jnp.flip(w, (0, 1)), x)), flipped),
    ]
    reference = jax.jit(conv_oihw)(weight, x)
    small_reference = jax.jit(conv_oihw)(weight, small_x)
    lines = ["| entry of a 128x128x3x3 conv weight (589,824 bytes), input 2x128x16x16 | weight layout XLA chose | temp bytes |",
             "|---|---|---:|"]
    for label, jitted, w, inputs, expected in [(*c, x, reference) for c in cases] + [
            (*c, small_x, small_reference) for c in small_cases]:
        compiled = jitted.lower(w, inputs).compile()
        placed = jax.device_put(w, compiled.input_formats[0][0])
        if not bool(jnp.allclose(compiled(placed, inputs), expected, atol=1e-3)):
            raise AssertionError(f"{label}: result differs")
        layout = compiled.input_formats[0][0].layout.major_to_minor
        lines.append(f"| {label} | {layout} | {compiled.memory_analysis().temp_size_in_bytes:,} |")
    return lines


GQA_PASSES = "widen-one-row-updates, fold-repeat-into-dot-general{chunk-bytes=262144}"
GQA_BEFORE = CPU_PIPELINE.replace(f" {GQA_PASSES},", "")
# head_dim 64: SDPA's scale sqrt(1/8) on K is no power of two, so the exact
# default applies it to the unrepeated cache (in chunks at long context);
# the opt-in moves it onto the scores (each row's "with option" cell).
GQA_SCALE_OPT_IN = CPU_PIPELINE.replace(
    "fold-repeat-into-dot-general{chunk-bytes=262144}", "fold-repeat-into-dot-general{exact-scales-only=false}"
)


def _gqa_row(title: str, cache_len: int, tokens: int, family: str = "llama") -> Row:
    """An HF Llama, or the Qwen2 or Mistral of ``family`` (bench/models.py's
    config: 4 layers, hidden 512, GQA 8/4 heads, head_dim 64) run as transformers' static-cache export recipe runs
    it: ``before`` is what ``hloalias.compile`` runs on CPU without the two
    GQA passes, ``after`` what it runs by default (:data:`CPU_PIPELINE`,
    exact), the option the scale move opted in (:data:`GQA_SCALE_OPT_IN`)."""
    import copy

    from bench.models import LlamaDecodeConfig, LlamaDecodeStep

    model = LlamaDecodeStep(LlamaDecodeConfig(max_cache_len=cache_len, family=family))
    if tokens == 1:
        args = (torch.tensor([[7]]), torch.tensor([17]))
    else:
        args = (torch.randint(0, 4096, (1, tokens), generator=torch.Generator().manual_seed(0)),
                torch.arange(tokens))
    expected = copy.deepcopy(model)(*args)
    before = hloalias.compile(copy.deepcopy(model), args, pipeline=GQA_BEFORE)
    after = hloalias.compile(copy.deepcopy(model), args)
    opted = hloalias.compile(copy.deepcopy(model), args, pipeline=GQA_SCALE_OPT_IN)
    result_before, result_after, result_opted = before(*args), after(*args), opted(*args)
    torch.testing.assert_close(result_after, expected)
    torch.testing.assert_close(result_opted, expected)
    identical = torch.equal(result_after, result_before)
    identical_opted = torch.equal(result_opted, result_before)
    stats = after.memory_stats
    minimum = stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"]
    kv_bytes = 4 * cache_len * 64 * 4
    note = (
        f"`before` = `{GQA_BEFORE}` (today's CPU pipeline without `{GQA_PASSES}`), `after` = `{CPU_PIPELINE}` "
        "(what `hloalias.compile` runs by default on one CPU device), the option = the same with "
        f"`fold-repeat-into-dot-general{{exact-scales-only=false}}`. One layer's K cache is {kv_bytes:,} bytes "
        f"(4 KV heads x {cache_len} x 64 f32). Before: XLA:CPU materializes `repeat_kv`'s K repeated to all 8 "
        "heads and transposed (SDPA's scaled `k^T`) and V repeated, each twice a layer's cache. After: "
        "`fold-repeat-into-dot-general` makes the attention dots read the cache itself, batching over the KV "
        "heads with the head group a free dimension of q (or of the probabilities); SDPA's splat scale on K "
        "(64 ** -0.25 at head_dim 64, no power of two) is applied to the unrepeated cache by default (exact), "
        "in chunks of 256 positions in a while loop where that scaled copy is larger than 256 KiB and than the "
        "scores (decode at cache 4096: one chunk's copy alive; at 256 and in prefill the whole scaled copy), and "
        "only the option moves it onto the scores; "
        "`widen-one-row-updates` writes the decode step's one-row cache "
        "update as two rows so that XLA:CPU keeps it in place instead of duplicating it into the reshape the "
        f"dot reads. Results equal eager (assert_close); bit-identical to `before`: {identical} by default, "
        f"{identical_opted} with the option (the moved scale is one rounding per score in another place)."
    )
    return Row(title, before.memory_stats, stats, minimum, "arguments + new outputs (XLA's data bytes)",
               "not measured here", _entry_copies(after), note,
               option=("+ `exact-scales-only=false`", opted.memory_stats), largest=_largest_entry_values(after))


def gqa_decode_256_row() -> Row:
    return _gqa_row("HF Llama GQA static-cache decode step, cache 256", 256, 1)


def gqa_decode_4096_row() -> Row:
    return _gqa_row("HF Llama GQA static-cache decode step, cache 4096", 4096, 1)


def gqa_prefill_row() -> Row:
    return _gqa_row("HF Llama GQA prefill of 512 tokens, cache 1024", 1024, 512)


def qwen2_decode_4096_row() -> Row:
    """Qwen2 with the Llama row's sizes (q/k/v projections biased)."""
    return _gqa_row("HF Qwen2 GQA static-cache decode step, cache 4096", 4096, 1, "qwen2")


def mistral_decode_4096_row() -> Row:
    """Mistral with the Llama row's sizes (its config's 4096-token sliding window)."""
    return _gqa_row("HF Mistral GQA static-cache decode step, cache 4096", 4096, 1, "mistral")


def qwen2_decode_256_row() -> Row:
    return _gqa_row("HF Qwen2 GQA static-cache decode step, cache 256", 256, 1, "qwen2")


def mistral_decode_256_row() -> Row:
    return _gqa_row("HF Mistral GQA static-cache decode step, cache 256", 256, 1, "mistral")


def mixtral_row() -> Row:
    """A tiny MixtralForCausalLM (2 layers, hidden 64, 4 experts, top-2)
    forward on 2 x 16 tokens: ``before`` is transformers' ``batched_mm``
    experts code (the only one that imported before issue 29), ``after``
    its default ``grouped_mm`` code, both with what ``hloalias.compile``
    runs on CPU."""
    import transformers

    def build(implementation: str | None) -> Any:
        torch.manual_seed(0)
        config = transformers.MixtralConfig(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=128)
        if implementation is not None:
            config._experts_implementation = implementation
        return transformers.MixtralForCausalLM(config).eval()

    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(2))
    model = build(None)
    with torch.no_grad():
        expected = model(ids).logits
    before = hloalias.compile(build("batched_mm"), (ids,))
    after = hloalias.compile(model, (ids,))
    torch.testing.assert_close(torch.as_tensor(after(ids).logits), expected, rtol=1e-4, atol=1e-4)
    stats = after.memory_stats
    minimum = stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"]
    note = (
        "The default experts code (`grouped_mm_experts_forward`) sorts the token-expert pairs, counts them "
        "per expert with `torch.histc` and multiplies each group through the custom op "
        "`transformers::grouped_mm_fallback`; `hloalias.frontend.decompositions` lowers both (the groups "
        "are data-dependent: every expert's product over all 64 rows, one [4, 64, N] stack, each row kept "
        "where it is its expert's). Logits equal eager's (assert_close 1e-4). `before` is the `batched_mm` "
        "code, which gathers one weight per token-expert pair. The largest temporary left is the stack of "
        "the gate/up products (4 x 64 x 256 f32, 262,144 bytes), 4 times the [64, 256] product a "
        "data-dependent grouped kernel would write."
    )
    return Row("tiny Mixtral forward (2 layers, hidden 64, 4 experts, top-2), 2 x 16 tokens", before.memory_stats,
               stats, minimum, "arguments + new outputs (XLA's data bytes)", "not measured here",
               _entry_copies(after), note, largest=_largest_entry_values(after))


def qwen2_bf16_row() -> Row:
    """A Qwen2ForCausalLM with bf16 weights (4 layers, hidden 512, GQA 8/4
    heads, intermediate 1408, vocab 4096), forward on 1 x 32 tokens:
    ``before`` is what ``hloalias.compile`` runs on CPU without
    ``accumulate-bf16-dots-in-f32``, ``after`` with it."""
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, max_position_embeddings=256)
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, 4096, (1, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
    pass_name = "accumulate-bf16-dots-in-f32"
    before = hloalias.compile(model, (ids,), pipeline=CPU_PIPELINE.replace(f" {pass_name},", ""))
    after = hloalias.compile(model, (ids,))
    errors = [float((torch.as_tensor(exe(ids).logits).float() - expected.float()).abs().max()) for exe in (before, after)]
    stats = after.memory_stats
    minimum = stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"]
    note = (
        "Without the pass XLA:CPU converts every bf16 weight to f32 ahead of the dots. Qwen2's q/k/v "
        "projections have a bias: torch-mlir lowers them as `addmm`, an f32 dot of converted bf16 operands "
        "(the transposed weight included) with the bias added in f32, which the pass's first form (all-bf16 "
        "dots only) left alone: with that form alone, measured on 2026-12-02, temp 8,497,152 bytes, total "
        "1.2623x (the q projection's f32[512,512] and the k/v projections' f32[256,512] copies, all alive "
        "together). Now the pass also lets such an f32 dot read its bf16 operands, and folds the transpose "
        f"the convert hid. Largest logit difference from eager's: before {errors[0]:.4g}, after "
        f"{errors[1]:.4g} (bf16 logits; bf16 activations round differently where the dot library sums in "
        "another order)."
    )
    return Row("Qwen2 with bf16 weights (4 layers, hidden 512, GQA 8/4), forward on 32 tokens", before.memory_stats,
               stats, minimum, "arguments + new outputs (XLA's data bytes)", "not measured here",
               _entry_copies(after), note, largest=_largest_entry_values(after))


# The two rewrites issue 29 added for DeBERTa-v2 and Swin; ``before`` of
# their rows is what ``hloalias.compile`` runs on CPU without them.
ISSUE29_PASSES = ("window-gather-indices", "elementwise-in-producer-shape")
ISSUE29_BEFORE = CPU_PIPELINE
for _name in ISSUE29_PASSES:
    ISSUE29_BEFORE = ISSUE29_BEFORE.replace(f" {_name},", "")


def _issue29_row(title: str, model: Any, args: tuple[Any, ...], cause: str) -> Row:
    """``model`` compiled by ``hloalias.compile`` with and without
    :data:`ISSUE29_PASSES`; results checked bit for bit against each other
    and against eager."""
    import copy

    import torch.utils._pytree as pytree

    with torch.no_grad():
        expected = copy.deepcopy(model)(*args)
    before = hloalias.compile(copy.deepcopy(model), args, pipeline=ISSUE29_BEFORE)
    after = hloalias.compile(copy.deepcopy(model), args)
    leaves = [pytree.tree_leaves(exe(*args)) for exe in (before, after)]
    identical = all(torch.equal(a, b) for a, b in zip(*leaves))
    error = max(float((got.double() - want.double()).abs().max())
                for got, want in zip(leaves[1], pytree.tree_leaves(expected)) if isinstance(want, torch.Tensor))
    stats = after.memory_stats
    minimum = stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"]
    note = (f"`before` = `{ISSUE29_BEFORE}` (today's CPU pipeline without `{', '.join(ISSUE29_PASSES)}`), "
            f"`after` = `{CPU_PIPELINE}`. {cause} Results bit-identical to `before`: {identical}; largest "
            f"difference from eager: {error:.2e}.")
    return Row(title, before.memory_stats, stats, minimum, "arguments + new outputs (XLA's data bytes)",
               "not measured here", _entry_copies(after), note, largest=_largest_entry_values(after))


def deberta_row() -> Row:
    """HF DeBERTa-v2 (bench/models.py's config) forward."""
    from bench.models import deberta_forward

    model, ids = deberta_forward()
    return _issue29_row(
        "HF DeBERTa-v2 forward (hidden 128, 2 layers, 4 heads, c2p + p2c), batch 2 x 64", model, (ids,),
        "Before: the c2p and p2c `torch.gather`s take per-element indices (`concatenate(iota, iota, index)`, "
        "s64[8,64,64,3], 786,432 bytes each, shared by both layers). After: `window-gather-indices` makes "
        "the batch-head dimension a slice window; the index is s64[64,64,2] (65,536 bytes).")


def swin_row() -> Row:
    """HF Swin (bench/models.py's config) forward."""
    from bench.models import swin_forward

    model, pixels = swin_forward()
    return _issue29_row(
        "HF Swin forward (image 64, patch 4, embed 32, depths [2, 2], window 4), batch 2", model, (pixels,),
        "Before: XLA:CPU's GELU after each MLP's first Linear reads the f32[512,128] product through a bitcast "
        "and writes a second buffer of its size (`multiply_bitcast_fusion`). After: "
        "`elementwise-in-producer-shape` computes the bias and GELU in the product's two-dimensional shape "
        "and XLA writes GELU in place.")


ROWS: list[Callable[[], Row]] = [bf16_cache_row, bf16_input_cache_row, kv_step_row, gpt2_row, resnet_row, resnet18_row, bert_row,
                                 gqa_decode_256_row, gqa_decode_4096_row, gqa_prefill_row, qwen2_decode_256_row,
                                 qwen2_decode_4096_row, mistral_decode_256_row, mistral_decode_4096_row, mixtral_row,
                                 qwen2_bf16_row,
                                 deberta_row, swin_row]


def _ratio(total: int, minimum: int) -> str:
    return f"{total:,} ({total / minimum:.4f}x)"


def _option_cell(row: Row) -> str:
    if row.option is None:
        return "—"
    name, stats = row.option
    return f"{name}: temp {stats['temp_bytes']:,}, total {_ratio(stats['total_bytes'], row.minimum)}"


def render(rows: list[Row], seconds: float, layout_lines: list[str] | None = None) -> str:
    lines = [
        "# Temp bytes beyond XLA (issue 15), re-measured",
        "",
        f"Generated by `.venv/bin/python -m bench.temp_bytes` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
        f"in {seconds:.0f} s; torch {torch.__version__}, Python {platform.python_version()}, CPU PJRT. "
        "`before` = the previous default pipeline, `after` = today's default pipeline "
        f"`{DEFAULT_PIPELINE}`. Bytes are XLA's compiled memory statistics.",
        "",
        "| workload | minimum | temp before | temp after | total before | total after | with option | peers (issue 15) |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.title} | {row.minimum:,} | {row.before['temp_bytes']:,} | {row.after['temp_bytes']:,} | "
            f"{_ratio(row.before['total_bytes'], row.minimum)} | {_ratio(row.after['total_bytes'], row.minimum)} | "
            f"{_option_cell(row)} | {row.peers} |"
        )
    lines.append("")
    for row in rows:
        lines += [f"## {row.title}", "", f"Minimum: {row.minimum:,} bytes ({row.minimum_source}).", "", row.note, ""]
        if row.largest:
            lines += ["Largest values defined in the optimized entry computation (bytes):", "", "```"]
            lines += row.largest
            lines += ["```", ""]
        if row.copies:
            lines += ["Copy instructions in the optimized HLO's entry computation:", "", "```"]
            lines += row.copies[:12]
            if len(row.copies) > 12:
                lines.append(f"... {len(row.copies) - 12} more")
            lines += ["```", ""]
    if layout_lines:
        lines += [
            "## Device-resident state in the program's preferred layout",
            "",
            "Measured here through jaxlib 0.10.2's API (`jax.jit` with `Format`/`Layout`, the same",
            "`mhlo.layout_mode` argument attribute and `get_parameter_layouts()` a PJRT caller would use):",
            "",
            *layout_lines,
            "",
            "On XLA:CPU, automatic entry layouts keep the default layout, and an explicit non-default entry",
            "layout is copied back to the default before XLA's own kernel transpose: neither removes the",
            "per-call weight copy. What does remove it is storing the weight *transposed* (logical HWIO) and",
            "transposing back in the program: XLA cancels that transpose against its kernel canonicalization,",
            "and only the activation relayout (NCHW -> NHWC) stays in temp. When XLA swaps the operands (a",
            "kernel window larger than the input) it also reads the kernel reversed; storing it flipped too",
            "cancels that reverse (the last two rows).",
            "",
            "Built on that: `permute-conv-kernel-state` gives each read-only state argument used only as",
            "convolution kernels the HWIO shape (`hloalias.stored_permutation`; flipped along the spatial",
            "dimensions XLA would reverse: `hloalias.stored_reversed`, read with `window_reversal`) and points",
            "the convolutions' dimension numbers at it. The runtime uploads that state permuted once; a",
            "module's executables share the buffer, whose layout the first fixes (later compiles read it so;",
            "one that writes, donates or views the state moves it back to torch's layout, and a program",
            "compiled for another layout copies it per call, counted in `host_copies`). `state_dict()` and",
            "`load_state_dict` use torch's layout. State that is written, donated, viewed, sharded or read",
            "any other way is never permuted.",
            "",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Measure the rows named on the command line (default: all) and write the results
    (with ``--stdout``: print them, RESULTS untouched)."""
    names = list(argv if argv is not None else sys.argv[1:])
    stdout = "--stdout" in names  # print the rows' markdown instead of rewriting RESULTS
    names = [n for n in names if n != "--stdout"]
    chosen = [f for f in ROWS if not names or f.__name__ in names]
    start = time.perf_counter()
    rows = []
    for make in chosen:
        print(f"measuring {make.__name__}", flush=True)
        rows.append(make())
    layout_lines = conv_layout_experiment() if not names or "conv_layout_experiment" in names else None
    text = render(rows, time.perf_counter() - start, layout_lines)
    if stdout:
        print(text)
        return
    RESULTS.write_text(text)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
