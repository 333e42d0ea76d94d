"""``torch.compile(backend="hloalias")`` against ``hloalias.compile``: XLA's
device bytes (argument + output - alias + temp) of the executable each one
runs, on the KV-cache and GPT-2 decode workloads, after checking that
outputs and state equal eager's over three calls.

    .venv/bin/python -m bench.dynamo            # writes bench/RESULTS-dynamo.md
    .venv/bin/python -m bench.dynamo --small    # a 2-layer GPT-2 (quick check; not written)

torch_xla's ``openxla`` backend is not run here (it needs its own torch);
its figures are quoted from shared/peers.md."""

from __future__ import annotations

import argparse
import copy
import os
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

import hloalias
from bench import workloads
from bench.runtime_bench import POS, StateKV, kv_update
from hloalias.runtime import dynamo_backend

#: torch_xla ``openxla`` backend, ratio to the minimum, from shared/peers.md
#: (2026-12-02; measured by the peers' session, not by this script).
OPENXLA_FROM_PEERS = {
    "GPT-2-small decode": "1.724× (0 aliases)",
    "KV slice-assign (cache as input)": "1.983×",
    "StateKV (cache as buffer)": "1.977×",
}


class KVInput(torch.nn.Module):
    """``kv_update`` as a module: the cache is a user input, written in place."""

    def forward(self, cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return kv_update(cache, new)


def minimum_bytes(module: torch.nn.Module, args: tuple[torch.Tensor, ...], temp: workloads.TempBound) -> int:
    """``bench.workloads.derive_minimum``'s total for ``module`` on ``args``."""
    shape = types.SimpleNamespace(module=module, args=args, donate=(), temp_bound=temp)
    return workloads.derive_minimum(shape).total_bytes  # type: ignore[arg-type]


def _state(module: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()} if isinstance(module, torch.nn.Module) else {}


def measure(name: str, make: Callable[[], tuple[Any, tuple[torch.Tensor, ...], workloads.TempBound]],
            calls: int = 3) -> dict[str, Any]:
    """Both systems on fresh copies of ``make()``: equality with eager over
    ``calls`` calls, then each executable's memory figures."""
    f, args, temp = make()
    minimum = minimum_bytes(f, args, temp)
    ahead = hloalias.compile(f, [a.clone() for a in args])

    torch._dynamo.reset()
    f_backend, args_backend = copy.deepcopy(f), tuple(a.clone() for a in args)
    f_eager, args_eager = copy.deepcopy(f), tuple(a.clone() for a in args)
    compiled = torch.compile(f_backend, backend="hloalias")
    before = {id(g) for g in dynamo_backend.compiled_graphs()}
    with torch.no_grad():
        for _ in range(calls):
            got = pytree.tree_leaves(compiled(*args_backend))
            want = pytree.tree_leaves(f_eager(*args_eager))
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
            for g, w in zip(args_backend, args_eager, strict=True):
                torch.testing.assert_close(g, w)
    for key, value in _state(f_eager).items():
        torch.testing.assert_close(_state(f_backend)[key], value)
    graphs = [g for g in dynamo_backend.compiled_graphs() if id(g) not in before]
    executables = [exe for g in graphs for exe in g.jit.executables]
    backend_total = sum(exe.memory_stats["total_bytes"] for exe in executables)
    return {
        "workload": name,
        "graphs": len(graphs),
        "executables": len(executables),
        "compile": ahead.memory_stats,
        "compile_aliases": len(ahead.aliases),
        "backend": executables[0].memory_stats if len(executables) == 1 else None,
        "backend_total": backend_total,
        "backend_aliases": sum(len(exe.aliases) for exe in executables),
        "backend_host_copies": sum(sum(exe.host_copies.values()) for exe in executables),
        "ratio": backend_total / ahead.memory_stats["total_bytes"],
        "minimum": minimum,
    }


Make = Callable[[], tuple[Any, tuple[torch.Tensor, ...], workloads.TempBound]]
NO_TEMP = workloads.TempBound(0, "the new row goes in place into the cache; new * 2 is a new result")


def gpt2(config: workloads.GPT2Config) -> Make:
    def make() -> tuple[Any, tuple[torch.Tensor, ...], workloads.TempBound]:
        workload = workloads.gpt2_workload(config)
        return workload.module, tuple(workload.args), workload.temp_bound
    return make


def kv_input(cache_mib: int) -> Make:
    shape = (16, cache_mib * (1 << 20) // (16 * 256 * 4), 256)
    return lambda: (KVInput(), (torch.zeros(shape), torch.randn(16, 256)), NO_TEMP)


def kv_state(cache_mib: int) -> Make:
    shape = (16, cache_mib * (1 << 20) // (16 * 256 * 4), 256)
    return lambda: (StateKV(shape), (torch.randn(16, 256),), NO_TEMP)


def report(rows: list[dict[str, Any]], config_text: str) -> str:
    lines = [
        "# torch.compile(backend=\"hloalias\") vs hloalias.compile: device bytes",
        "",
        "Generated by `.venv/bin/python -m bench.dynamo`. XLA's figures (`memory_stats`: argument + output "
        "− alias + temp) of the executables each path runs. The backend's graphs come from dynamo with the "
        "module's parameters and buffers lifted as graph inputs; each is compiled by `hloalias.compile` "
        "(`hloalias.runtime.dynamo_backend`). Outputs, mutated inputs and module state were checked "
        "equal to eager's over three calls before measuring. " + config_text,
        "",
        "| workload | minimum bytes | hloalias.compile bytes | aliases | backend bytes | aliases | "
        "backend / compile | backend / minimum | backend host copies (3 calls) | "
        "torch_xla openxla / minimum (from shared/peers.md) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['workload']} | {row['minimum']:,} | {row['compile']['total_bytes']:,} | "
            f"{row['compile_aliases']} | {row['backend_total']:,} | {row['backend_aliases']} | {row['ratio']:.3f}× | "
            f"{row['backend_total'] / row['minimum']:.3f}× | "
            f"{row['backend_host_copies']} | {OPENXLA_FROM_PEERS.get(row['workload'], '—')} |"
        )
    lines += [
        "",
        "The minimum is `bench.workloads.derive_minimum`'s (arguments + genuinely new results + unavoidable "
        "temporaries). shared/peers.md does not give the shapes of its KV slice-assign and StateKV workloads; "
        "its openxla ratios are for its own shapes, quoted as ratios.",
        "",
        "Per-executable figures:",
        "",
    ]
    for row in rows:
        lines.append(f"- {row['workload']}: {row['graphs']} dynamo graph(s), {row['executables']} executable(s); "
                     f"compile {row['compile']}; backend {row['backend']}")
    lines += [
        "",
        "Why the backend keeps the aliases torch_xla's `openxla` loses: `openxla` is an AOTAutograd backend, "
        "so it compiles the functionalized graph, which returns each mutated buffer as a new tensor that "
        "AOTAutograd then `copy_`s back (no input/output alias; both values live on the device). The "
        "hloalias backend takes dynamo's graph before functionalization, for inference graphs, and lets "
        "`torch.export` + `alias-donated-buffers` turn each mutation into an in-place alias; the runtime moves "
        "the module's buffer onto the runtime buffer on the first call and donates it afterwards "
        "(0 host copies).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="a 2-layer GPT-2; results not written")
    parser.add_argument("--cache-mib", type=int, default=16)
    options = parser.parse_args()
    config = workloads.GPT2Config(layers=2, heads=4, hidden=64, positions=64, vocab=1000) if options.small \
        else workloads.GPT2Config()
    rows = [
        measure("KV slice-assign (cache as input)", kv_input(options.cache_mib)),
        measure("StateKV (cache as buffer)", kv_state(options.cache_mib)),
        measure("GPT-2-small decode" if not options.small else "GPT-2 decode (small)", gpt2(config)),
    ]
    text = report(rows, f"KV caches: 16 x L x 256 f32, {options.cache_mib} MiB, one position ({POS}) written per call; "
                  f"GPT-2: {config}.")
    print(text)
    if not options.small:
        with open(os.path.join(os.path.dirname(__file__), "RESULTS-dynamo.md"), "w") as out:
            out.write(text)


if __name__ == "__main__":
    main()
