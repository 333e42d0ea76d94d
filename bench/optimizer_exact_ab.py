"""Same-window A/B of the training capture with eager-formula optimizer
kernels (frontend/optimizer_exact.py, session 48) against the capture
before them (torch's ``capturable=True`` kernels, float32 lr), in one
process: the old behaviour is this tree with the three hooks of
frontend/training.py that the change added set back to what main did
(no kernel replacement, no optimizer treated as eager-formula).

    python bench/optimizer_exact_ab.py [--rounds 3] [--layers 8] [--width 256] [--steps 20]

The program: an MLP of ``--layers`` Linear(width, width) layers with
tanh, AdamW(weight_decay=0.01), MSE loss, batch 32.  Each round, for
each variant (alternating): compile from scratch (program and update
template caches cleared) and record process CPU seconds, then run
``--steps`` steps and record CPU ms per step.  One JSON line per round
and variant."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

import torch

import hloalias
from hloalias.frontend import optimizer_replay
from hloalias.frontend import training as frontend_training


def _model(layers: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    parts: list[torch.nn.Module] = []
    for _ in range(layers):
        parts += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*parts)


@contextlib.contextmanager
def _variant(old: bool) -> Any:
    if not old:
        yield
        return
    saved = (frontend_training.eager_formula_kernels, frontend_training.eager_formula_optimizer,
             frontend_training.group_uses_eager_form)
    frontend_training.eager_formula_kernels = contextlib.nullcontext  # type: ignore[assignment]
    frontend_training.eager_formula_optimizer = lambda optimizer: False  # type: ignore[assignment]
    frontend_training.group_uses_eager_form = lambda group: False  # type: ignore[assignment]
    try:
        yield
    finally:
        (frontend_training.eager_formula_kernels, frontend_training.eager_formula_optimizer,
         frontend_training.group_uses_eager_form) = saved


def _measure(old: bool, layers: int, width: int, steps: int) -> dict[str, Any]:
    model = _model(layers, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    x, y = torch.randn(32, width), torch.randn(32, width)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    hloalias.clear_cache()
    optimizer_replay.clear_template_cache()
    with _variant(old):
        start = time.process_time()
        train = hloalias.compile_training_step(step, model, optimizer, (x, y))
        train(x, y).item()
        compile_s = time.process_time() - start
        start = time.process_time()
        for _ in range(steps):
            loss = train(x, y)
        loss.item()
        step_ms = (time.process_time() - start) / steps * 1e3
    return {"variant": "old" if old else "new", "compile_cpu_s": round(compile_s, 3), "step_cpu_ms": round(step_ms, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    _measure(False, 1, 8, 1)  # warm the imports
    for index in range(args.rounds):
        for old in (True, False):
            print(json.dumps({"round": index, **_measure(old, args.layers, args.width, args.steps)}), flush=True)


if __name__ == "__main__":
    main()
