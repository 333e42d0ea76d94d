"""CPU-time A/B of the per-call identity check of every module attribute a
program's state stands for (``StateWatch.attachments_moved``), which sees
``del m.bias``, a parameter set to None and writes into ``m._parameters``/
``m._buffers`` directly, against the check of plain tensor attributes only.

One executable per call path; A and B differ only in the entries the
watch compares (``StateWatch._plain``): the plain attributes only (A, the
old watch) or every attached attribute (B).  Alternated A/B/A/B in one
window, ``reps`` rounds of ``calls`` calls each, CPU time
(``time.process_time``) per call.  Run: ``.venv/bin/python
bench/attachment_identity_ab.py [layers] [reps] [calls]``."""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

import hloalias


class Deep(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def main() -> None:
    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    print(f"uptime: {os.popen('uptime').read().strip()}")
    x = torch.randn(2, 8)
    for path in ("native", "python"):
        os.environ["HLOALIAS_NATIVE"] = "1" if path == "native" else "0"
        model = Deep(layers)
        exe = hloalias.compile(model, (x,))
        watch = exe._state_watch
        every = tuple(
            (table, key, slot) for name, slot in exe._attached
            for table, key, _ in [exe._group.attribute_table(name)]  # type: ignore[misc]
        )
        plain_only = tuple(entry for entry in every if entry[0] is not entry[0])  # no plain attributes here
        variants = {"A plain only": plain_only, "B every attribute": every}
        results: dict[str, list[float]] = {name: [] for name in variants}
        with torch.no_grad():
            for _ in range(200):
                exe(x)
            for _ in range(reps):
                for name, entries in variants.items():
                    watch._plain = entries
                    start = time.process_time()
                    for _ in range(calls):
                        exe(x)
                    results[name].append((time.process_time() - start) / calls * 1e6)
        for name, values in results.items():
            print(
                f"{path:6s} {len(exe._attached)} attached  {name:18s} median {statistics.median(values):7.2f} us/call "
                f"(min {min(values):.2f}, reps {', '.join(f'{v:.2f}' for v in values)})"
            )
    print(f"uptime: {os.popen('uptime').read().strip()}")




def micro(layers: int = 64, reps: int = 5, loops: int = 20000) -> None:
    """The check alone (``attachments_moved``), A/B alternated: CPU time per call."""
    print(f"uptime: {os.popen('uptime').read().strip()}")
    model = Deep(layers)
    exe = hloalias.compile(model, (torch.randn(2, 8),))
    watch = exe._state_watch
    every = tuple(
        (table, key, slot) for name, slot in exe._attached
        for table, key, _ in [exe._group.attribute_table(name)]  # type: ignore[misc]
    )
    results: dict[str, list[float]] = {"A plain only": [], "B every attribute": []}
    for _ in range(reps):
        for name, entries in (("A plain only", ()), ("B every attribute", every)):
            watch._plain = entries
            start = time.process_time()
            for _ in range(loops):
                watch.attachments_moved()
            results[name].append((time.process_time() - start) / loops * 1e6)
    for name, values in results.items():
        print(f"check alone, {len(every)} attached, {name:18s} median {statistics.median(values):6.2f} us "
              f"(reps {', '.join(f'{v:.2f}' for v in values)})")
    print(f"uptime: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "micro":
        micro(*(int(a) for a in sys.argv[2:]))
    else:
        main()
