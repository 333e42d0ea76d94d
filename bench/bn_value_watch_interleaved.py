"""Same process, branch bnstats: ``StateWatch.changed()`` with the value
compare of the batch-norm statistics and without it (its tuples emptied),
interleaved 7 rounds (each the minimum of 3 x 20000 checks), and
``_lane.first_differing`` alone (the minimum of 5 x 20000).

    python bench/bn_value_watch_interleaved.py cnn|deep

The models are ``bench/bn_value_watch_ab.py``'s.  Prints one JSON line (ns)."""

from __future__ import annotations

import json
import sys
import timeit

import torch

import hloalias


def main() -> None:
    torch.manual_seed(0)
    if sys.argv[1] == "cnn":
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
        for _ in range(20):
            exe(x)
    watch = exe._state_watch
    refs, snapshots = watch._value_refs, watch._snapshots
    with_compare, without = [], []
    for _ in range(7):
        watch._value_refs, watch._snapshots = refs, snapshots
        with_compare.append(min(timeit.repeat(watch.changed, number=20000, repeat=3)) / 20000 * 1e9)
        watch._value_refs, watch._snapshots = (), ()
        without.append(min(timeit.repeat(watch.changed, number=20000, repeat=3)) / 20000 * 1e9)
    watch._value_refs, watch._snapshots = refs, snapshots
    compare = watch._first_differing
    alone = min(timeit.repeat(lambda: compare(refs, snapshots), number=20000, repeat=5)) / 20000 * 1e9
    print(json.dumps({
        "case": sys.argv[1], "slots": len(watch.slots), "compared": len(refs),
        "with_ns": [round(v) for v in with_compare], "without_ns": [round(v) for v in without],
        "first_differing_alone_ns": round(alone),
    }))


if __name__ == "__main__":
    main()
