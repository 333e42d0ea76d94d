"""Same-process, same-window A/B of the watched state class
(``runtime/state.py``: ``_WatchedTensorHook``, branch ``uncounted``);
not a timed test.  Prints CPU seconds (``time.process_time``) per
operation, old/new alternating for ``--reps`` rounds:

* ``call``: one call of a compiled ``nn.Linear`` forward with no escape,
  with ``StateWatch.changed`` as on main (``_changed_as_on_main`` below,
  copied from 636f636) vs this branch's (one more method call and the
  alias/held checks);
* ``op``: ``param + 1`` and ``buffer * 2`` on the plain class vs the
  watched one (the class is swapped back and forth on the same tensors);
* ``data``: ``param.data`` on the plain class (torch's C getter) vs the
  watched one (the Python property, which marks the slot).

Run from the tree's root: ``.venv/bin/python bench/uncounted_ab.py``."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

import hloalias
from hloalias.runtime.state import (
    _AGREEMENTS, _RUNTIME_READ, StateWatch, _first_changed_in_python, _first_differing_in_python, read_others_stale,
)


def _changed_as_on_main(self: Any) -> bool:
    starts = self._starts[0]
    if self._starts_seen != starts and self._group is not None:
        read_others_stale(self.slots, self._group())
        self._starts_seen = starts
    agreements = _AGREEMENTS[0]
    if self._agreements != agreements:
        self._refs = tuple(slot.source for slot in self.slots)
        self._versions = tuple(slot.version for slot in self.slots)
        self._pointers = tuple(slot.source_ptr for slot in self.slots)
        valued = [slot for slot in self.slots if slot.snapshot is not None]
        self._value_refs = tuple(slot.source for slot in valued)
        self._snapshots = tuple(slot.snapshot for slot in valued if slot.snapshot is not None)
        self._agreements = agreements
    if self._first_changed is _first_changed_in_python:
        with _RUNTIME_READ():
            if _first_changed_in_python(self._refs, self._versions, self._pointers) >= 0:
                return True
    elif self._first_changed(self._refs, self._versions, self._pointers) >= 0:
        return True
    if not self._value_refs:
        return False
    if self._first_differing is _first_differing_in_python:
        with _RUNTIME_READ():
            return _first_differing_in_python(self._value_refs, self._snapshots) >= 0
    return self._first_differing(self._value_refs, self._snapshots) >= 0


def _per_op(fn: Callable[[], Any], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--ops", type=int, default=50000)
    args = parser.parse_args()
    model = torch.nn.Linear(64, 64)
    model.register_buffer("scale", torch.ones(64))
    x = torch.randn(8, 64)
    exe = hloalias.compile(model, (x,))
    with torch.no_grad():
        for _ in range(50):
            exe(x)
    new_changed = StateWatch.changed
    weight, scale = model.weight, model.scale
    watched = (type(weight), type(scale))
    assert watched != (torch.nn.Parameter, torch.Tensor), watched
    results: dict[str, dict[str, list[float]]] = {k: {"old": [], "new": []} for k in ("call", "op", "data")}

    def call() -> None:
        with torch.no_grad():
            exe(x)

    def op() -> None:
        weight + 1
        scale * 2

    def data() -> None:
        weight.data

    for _ in range(args.reps):
        for side in ("old", "new"):
            StateWatch.changed = _changed_as_on_main if side == "old" else new_changed  # type: ignore[method-assign]
            results["call"][side].append(_per_op(call, args.calls))
            StateWatch.changed = new_changed  # type: ignore[method-assign]
            weight.__class__, scale.__class__ = (torch.nn.Parameter, torch.Tensor) if side == "old" else watched
            results["op"][side].append(_per_op(op, args.ops))
            results["data"][side].append(_per_op(data, args.ops))
            weight.__class__, scale.__class__ = watched
            call()  # reads in what the ``.data`` marks asked for, outside the timing
    summary = {
        key: {side: {"min_us": min(v) * 1e6, "median_us": sorted(v)[len(v) // 2] * 1e6} for side, v in sides.items()}
        for key, sides in results.items()
    }
    print(json.dumps({"native": exe._lane is not None, **summary}))


if __name__ == "__main__":
    main()
