"""Per-step time of a compiled training step that nobody reads between
calls, for the stale-tensor marking of runtime/state.py (A/B against
another checkout: ``--root`` points the editable install at it).

    python -m bench.fresh_reads_ab [--root /path/to/other/checkout] [--model mlp|gpt2] [--ema] [--write-back]

Prints one JSON line: model, steps, median and mean per-step milliseconds
(``time.perf_counter`` around each call, loss not read), the process's
CPU time per step (``time.process_time``: every thread, XLA's too; steadier
than wall time on a loaded machine), and with ``--ema``
the same with an EMA over ``model.parameters()`` after every call (every
parameter read: one copy per tensor per step); ``--write-back`` calls
``train.write_back()`` before each update (what an EMA needed to be right
before bare reads copied the state in)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=None)
    parser.add_argument("--model", default="mlp", choices=["mlp", "gpt2"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ema", action="store_true")
    parser.add_argument("--write-back", action="store_true", help="train.write_back() before each EMA update")
    args = parser.parse_args()
    if args.root is not None:
        import __editable___hloalias_0_1_0_finder as finder  # type: ignore[import-not-found]

        for name, path in list(finder.MAPPING.items()):
            finder.MAPPING[name] = args.root + path[path.index("/", len("/work/")):]
    import torch

    import hloalias
    import hloalias.runtime.state

    torch.manual_seed(0)
    if args.model == "mlp":
        layers: list[torch.nn.Module] = []
        for _ in range(8):
            layers += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
        model: torch.nn.Module = torch.nn.Sequential(*layers)
        batch = (torch.randn(16, 64), torch.randn(16, 64))

        def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.mse_loss(model(x), y)
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                            resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
        model = GPT2LMHeadModel(config)
        ids = torch.randint(0, 100, (2, 16))
        batch = (ids, ids.clone())

        def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return model(input_ids=x, labels=y).loss  # type: ignore[no-any-return]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_of(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    train = hloalias.compile_training_step(step, model, optimizer, batch)
    ema = [p.detach().clone() for p in model.parameters()]
    for _ in range(20):
        train(*batch)
    times, cpu_times = [], []
    for _ in range(args.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        train(*batch)
        if args.write_back:
            train.write_back()
        if args.ema:
            with torch.no_grad():
                for average, p in zip(ema, model.parameters()):
                    average.mul_(0.99).add_(p, alpha=0.01)
        times.append((time.perf_counter() - start) * 1e3)
        cpu_times.append((time.process_time() - cpu_start) * 1e3)
    print(json.dumps({
        "root": args.root or "this checkout", "marks_stale": hasattr(hloalias.runtime.state, "refresh_stale"),
        "loaded_from": hloalias.runtime.state.__file__, "model": args.model, "ema": args.ema,
        "write_back": args.write_back, "steps": args.steps,
        "tensors": len(list(model.parameters())),
        "median_ms": round(statistics.median(times), 4), "mean_ms": round(statistics.mean(times), 4),
        "cpu_total_ms": round(sum(cpu_times), 1), "cpu_mean_ms": round(statistics.mean(cpu_times), 4),
    }))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
