"""Same-window A/B for branch bnstats (batch-norm running statistics
compared by value at every call, runtime/running_stats.py), against
another tree: ``--root`` points the editable install at it (a copy of this
checkout with the old files and this checkout's built ``runtime/_lane*.so``).

    python bench/bn_value_watch_ab.py --case cnn|deep [--root /path/to/other/tree] --label L

``cnn``: a 3->8 conv + BatchNorm2d + linear forward in eval mode (2
statistics compared); ``deep``: 16 conv + BatchNorm2d(32) layers in eval
mode (32 statistics compared), input 1x32x4x4.  Nobody reads or writes
between calls.  Prints one JSON line: the per-call check
(``StateWatch.changed``, ns, the minimum of 5 rounds of 20000) and, in this
tree, the same check with the Python compare (``first_differing`` absent:
an unbuilt or stale extension); the process CPU time per call (all
threads, µs: each of 5 rounds of 1000 calls)."""

from __future__ import annotations

import argparse
import json
import os
import time
import timeit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=None)
    parser.add_argument("--label", default="")
    parser.add_argument("--case", default="cnn", choices=["cnn", "deep"])
    args = parser.parse_args()
    if args.root is not None:
        import __editable___hloalias_0_1_0_finder as finder  # type: ignore[import-not-found]

        for name, path in list(finder.MAPPING.items()):
            finder.MAPPING[name] = args.root + path[path.index("/", len("/work/")):]
    import torch

    import hloalias
    import hloalias.runtime.state as state

    torch.manual_seed(0)
    if args.case == "cnn":
        model: torch.nn.Module = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(288, 2)
        )
        x = torch.randn(2, 3, 8, 8)
    else:
        layers: list[torch.nn.Module] = []
        for _ in range(16):
            layers += [torch.nn.Conv2d(32, 32, 1), torch.nn.BatchNorm2d(32), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers)
        x = torch.randn(1, 32, 4, 4)
    model.eval()
    exe = hloalias.compile(model, (x,))
    with torch.no_grad():
        for _ in range(50):
            exe(x)
    watch = exe._state_watch
    result: dict[str, object] = {
        "label": args.label, "case": args.case, "native": os.environ.get("HLOALIAS_NATIVE", "1"),
        "state_py": state.__file__, "lane": exe._lane is not None,
        "compared": len(getattr(watch, "_value_refs", ())),
    }

    def check_ns() -> float:
        return min(timeit.repeat(watch.changed, number=20000, repeat=5)) / 20000 * 1e9

    result["check_ns"] = round(check_ns(), 1)
    if hasattr(watch, "_first_differing"):
        native = watch._first_differing
        watch._first_differing = state._first_differing_in_python
        result["check_ns_python_compare"] = round(check_ns(), 1)
        watch._first_differing = native
    rounds = []
    with torch.no_grad():
        for _ in range(5):
            start = time.process_time()
            for _ in range(1000):
                exe(x)
            rounds.append(round((time.process_time() - start) / 1000 * 1e6, 1))
    result["call_cpu_us"] = rounds
    print(json.dumps(result))


if __name__ == "__main__":
    main()
