"""OpInfo coverage by family; writes ``bench/RESULTS-opinfo.md``.

From the repository root::

    .venv/bin/python -m bench.opinfo --run bench/RESULTS-opinfo-after.jsonl
    .venv/bin/python -m bench.opinfo --report bench/RESULTS-opinfo-before.jsonl bench/RESULTS-opinfo-after.jsonl

``--run`` sweeps torch's OpInfo database (``test/py/opinfo_sweep.py``:
each op's first float32 CPU sample compiled with ``hloalias.compile`` and
compared with eager), one JSON line per op, in a child process: when the
child dies (a crash inside torch-mlir or XLA) the op it was on is recorded
as ``crash`` and a new child goes on after it.  A file that exists is
resumed.  ``--report`` turns a before and an after sweep into the table
of ``RESULTS-opinfo.md``: per family, the testable ops (those with a
float32 sample whose eager call runs; random ops whose values eager
itself changes with the seed count as testable and as matching when their
dtypes and shapes match) and how many compile and match, how many are
refused, wrong or crash."""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP_DIR = os.path.join(ROOT, "test", "py")

_CHILD = r"""
import json, sys, time
sys.path.insert(0, {sweep_dir!r})
import opinfo_sweep
path = {path!r}
done = set()
with open(path) as handle:
    done = {{json.loads(line)["name"] for line in handle if line.strip()}}
with open(path, "a") as out:
    for op in opinfo_sweep.all_ops():
        name = opinfo_sweep.case_name(op)
        if name in done:
            continue
        print("START", name, flush=True)
        outcome = opinfo_sweep.run_case(op)
        out.write(json.dumps(outcome.__dict__) + "\n")
        out.flush()
"""


def run(path: str) -> float:
    """Sweep into ``path`` (resuming it); the wall time in seconds."""
    start = time.perf_counter()
    open(path, "a").close()
    while True:
        child = subprocess.run(
            [sys.executable, "-c", _CHILD.format(sweep_dir=SWEEP_DIR, path=path)],
            capture_output=True,
            text=True,
        )
        if child.returncode == 0:
            return time.perf_counter() - start
        started = [line.split(" ", 1)[1] for line in child.stdout.splitlines() if line.startswith("START ")]
        if not started:
            raise RuntimeError(f"the sweep failed before any op:\n{child.stderr[-3000:]}")
        name = started[-1]
        sys.path.insert(0, SWEEP_DIR)
        import opinfo_sweep

        with open(path, "a") as out:
            row = dict(
                name=name, family=opinfo_sweep.family(name), status="crash",
                reason=f"exit {child.returncode}", detail="the process died", seconds=0.0,
            )
            out.write(json.dumps(row) + "\n")


def load(path: str) -> dict[str, dict[str, Any]]:
    with open(path) as handle:
        return {row["name"]: row for row in map(json.loads, filter(str.strip, handle))}


_COUNTED = ("pass", "excluded", "refused", "wrong", "error", "crash")


def tally(rows: dict[str, dict[str, Any]]) -> dict[str, collections.Counter[str]]:
    """family -> status counts over testable ops ("all" for the total)."""
    families: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for row in rows.values():
        if row["status"] not in _COUNTED:
            continue
        for key in (row["family"], "all"):
            families[key][row["status"]] += 1
            families[key]["testable"] += 1
    return families


def _matching(counts: collections.Counter[str]) -> int:
    return counts["pass"] + counts["excluded"]


def _cell(counts: collections.Counter[str]) -> str:
    testable = counts["testable"]
    if not testable:
        return "-"
    return f"{_matching(counts)}/{testable} ({100 * _matching(counts) / testable:.0f}%)"


def _empty_results(names: list[str]) -> set[str]:
    """The ops among ``names`` whose first float32 sample gives eager
    results without elements."""
    sys.path.insert(0, SWEEP_DIR)
    import opinfo_sweep
    import torch
    import torch.utils._pytree as pytree

    empty = set()
    for op in opinfo_sweep.all_ops():
        name = opinfo_sweep.case_name(op)
        if name not in names:
            continue
        sample = opinfo_sweep.first_sample(op, torch.float32)
        if sample is None:
            continue
        case = opinfo_sweep._Case(op, sample)
        try:
            results = [t for t in pytree.tree_leaves(case(*case.tensors())) if isinstance(t, torch.Tensor)]
        except Exception:
            continue
        if results and all(t.numel() == 0 for t in results):
            empty.add(name)
    return empty


def report(before_path: str, after_path: str, wall: str) -> str:
    before, after = load(before_path), load(after_path)
    tb, ta = tally(before), tally(after)
    order = sorted(set(tb) | set(ta), key=lambda f: (f == "all", -ta.get(f, collections.Counter())["testable"], f))
    lines = [
        "# OpInfo coverage (issue 31)",
        "",
        "Every entry of torch's OpInfo database (`torch.testing._internal.common_methods_invocations.op_db`, "
        f"{len(after)} entries, torch 2.13.0) with its first float32 CPU sample, compiled with "
        "`hloalias.compile` and compared with eager (dtype, shape, values at rtol 1e-4 / atol 1e-5, NaN = NaN; "
        "inputs as eager leaves them): `test/py/opinfo_sweep.py`, run by `python -m bench.opinfo` "
        "(`--run FILE` then `--report BEFORE AFTER`). *Testable*: the op has a float32 sample and its eager "
        "call runs. *Matching*: compiles and matches eager; a random op (eager's own values change with the "
        "seed) matches when its dtypes and shapes do. *Before*: main at 08371b2; *after*: this branch.",
        "",
        "| family | before: matching/testable | after: matching/testable | after: refused | after: wrong | after: error | after: crash |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for family in order:
        b, a = tb.get(family, collections.Counter()), ta.get(family, collections.Counter())
        label = "**all**" if family == "all" else family
        lines.append(
            f"| {label} | {_cell(b)} | {_cell(a)} | {a['refused']} | {a['wrong']} | {a['error']} | {a['crash']} |"
        )
    lines += ["", "Before: wrong, error and crash cases:", ""]
    for row in before.values():
        if row["status"] in ("wrong", "error", "crash"):
            lines.append(f"- `{row['name']}`: {row['status']} {row['reason']} {row['detail'][:160]}".rstrip())
    reasons: collections.Counter[str] = collections.Counter(
        row["reason"].split(":")[0] for row in after.values() if row["status"] == "refused"
    )
    lines += ["", "After: refusals by reason class (the list `test/py/opinfo_expected_refusals.txt`):", ""]
    for reason, count in reasons.most_common():
        lines.append(f"- {reason}: {count}")
    fixed = sorted(
        name for name, row in after.items()
        if _matching(collections.Counter([row["status"]])) and name in before
        and not _matching(collections.Counter([before[name]["status"]]))
    )
    empty = _empty_results(fixed)
    lines += [
        "",
        f"Now matching, not before ({len(fixed)}; * marks the {len(empty)} whose first sample's results have no "
        "elements, so the sweep checks their empty case only): "
        + ", ".join(f"`{n}`" + ("*" if n in empty else "") for n in fixed),
    ]
    untestable = collections.Counter(row["reason"] for row in after.values() if row["status"] == "untestable")
    lines += [
        "",
        "Not testable: " + ", ".join(f"{reason} {count}" for reason, count in untestable.most_common())
        + " (no-sample: OpInfo lists no float32 dtype for CPU, e.g. bitwise and integer ops; eager-fails: "
        "the sample's eager call raises, e.g. jiterator ops, which need CUDA).",
        "",
        f"Sweep time: {wall}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", metavar="JSONL")
    parser.add_argument("--report", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--wall", default="not measured", help="the sweep's wall time, as text for the report")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "RESULTS-opinfo.md"))
    args = parser.parse_args()
    if args.run:
        seconds = run(args.run)
        print(f"swept in {seconds:.0f} s (load average {os.getloadavg()})")
    if args.report:
        text = report(args.report[0], args.report[1], args.wall)
        with open(args.out, "w") as handle:
            handle.write(text)
        print(text)


if __name__ == "__main__":
    main()
