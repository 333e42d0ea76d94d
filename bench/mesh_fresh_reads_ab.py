"""Same-window A/B for branch meshfresh (runtime/state.py's reads of state
that programs of other groups left, and a mesh training step that no
longer copies its own state in before each call), against another tree:
``--root`` points the editable install at it (a copy of this checkout
with the old files, and this checkout's built ``runtime/_lane*.so``).

    python bench/mesh_fresh_reads_ab.py --case single|mesh-train [--root /path/to/other/tree] --label L

``single``: a 16-layer program with a counter buffer on one device, called
with no reads between calls: per-call microseconds (the minimum over 5
rounds of the median of 2000 calls) and the per-call state check
(``StateWatch.changed``, nanoseconds, the minimum of 5 x 20000).
``mesh-train``: an AdamW step of a 16-32-16 MLP on a 2-device CPU mesh
(batch sharded), nobody reading between steps: per-step milliseconds (the
minimum over 3 rounds of the median of 100 steps).  Prints one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import timeit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=None)
    parser.add_argument("--label", default="")
    parser.add_argument("--case", default="single", choices=["single", "mesh-train"])
    args = parser.parse_args()
    if args.case == "mesh-train":
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    if args.root is not None:
        import __editable___hloalias_0_1_0_finder as finder  # type: ignore[import-not-found]

        for name, path in list(finder.MAPPING.items()):
            finder.MAPPING[name] = args.root + path[path.index("/", len("/work/")):]
    import torch

    import hloalias
    import hloalias.runtime.state as state

    torch.manual_seed(0)
    result: dict[str, object] = {"label": args.label, "case": args.case, "state_py": state.__file__}
    if args.case == "single":

        class Layers(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lins = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(16))
                self.register_buffer("n", torch.zeros(()))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                self.n += 1
                for lin in self.lins:
                    x = lin(x)
                return x

        x = torch.randn(2, 8)
        with torch.no_grad():
            exe = hloalias.compile(Layers(), (x,))
            for _ in range(200):
                exe(x)
            medians = []
            for _ in range(5):
                times = []
                for _ in range(2000):
                    start = time.perf_counter()
                    exe(x)
                    times.append(time.perf_counter() - start)
                medians.append(statistics.median(times))
        result["call_us"] = min(medians) * 1e6
        result["watch_ns"] = min(timeit.repeat(exe._state_watch.changed, number=20000, repeat=5)) / 20000 * 1e9
    else:
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        x, y = torch.randn(8, 16), torch.randn(8, 16)
        train = hloalias.compile_training_step(
            step, model, optimizer, (x, y), mesh=hloalias.Mesh((2,), ("dp",)), shardings={0: ("dp", None)}
        )
        for _ in range(20):
            train(x, y)
        medians = []
        for _ in range(3):
            times = []
            for _ in range(100):
                start = time.perf_counter()
                train(x, y)
                times.append(time.perf_counter() - start)
            medians.append(statistics.median(times))
        result["step_ms"] = min(medians) * 1e3
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
