"""Compiling from threads (issue 25, item 6): torch.export keeps global
tracing state, so 8 threads importing at once failed ("
_EXPORT_MODULE_HIERARCHY must not be None"); the trace is serialized
(hloalias.frontend.tracing_lock), everything else runs in parallel."""

from __future__ import annotations

import threading
from typing import Any

import torch

import hloalias

THREADS = 8


def _run_in_threads(work: Any) -> tuple[dict[int, Any], list[BaseException]]:
    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work(index)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


def test_eight_threads_compile_eight_modules() -> None:
    def work(index: int) -> bool:
        torch.manual_seed(index)
        model = torch.nn.Sequential(torch.nn.Linear(4 + index, 3), torch.nn.ReLU())
        x = torch.randn(2, 4 + index)
        executable = hloalias.compile(model, (x,))
        return torch.allclose(executable(x), model(x), atol=1e-6)

    results, errors = _run_in_threads(work)
    assert errors == []
    assert results == {i: True for i in range(THREADS)}


def test_threads_compile_training_steps_and_functions_together() -> None:
    def work(index: int) -> bool:
        torch.manual_seed(index)
        if index % 2:
            x = torch.randn(5, index)
            f = lambda x: (x * index).softmax(-1)  # noqa: E731
            return torch.allclose(hloalias.compile(f, (x,))(x), f(x), atol=1e-6)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        batch = (torch.randn(4, 3), torch.randn(4, 2))

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        expected = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
        train = hloalias.compile_training_step(step, model, opt, batch)
        return torch.allclose(train(*batch), expected.detach(), atol=1e-6)

    results, errors = _run_in_threads(work)
    assert errors == []
    assert results == {i: True for i in range(THREADS)}
