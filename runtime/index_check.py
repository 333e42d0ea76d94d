"""The per-call check of user inputs used as indices: a value eager refuses
(an ``embedding`` id >= the vocabulary, a negative ``index_select``
index) is refused before anything runs, instead of XLA's clamp or drop.

Contract: :func:`index_checks` reads the ranges the importer recorded in
the contract (``hloalias.index_ranges``, frontend/index_ranges.py) from
the program's facts, once per executable, unless ``HLOALIAS_INDEX_CHECK=0``.
:func:`check_indices` runs on every call of the Python path, after the
inputs' types were checked and before any state is read, written or
donated; the native lane runs the same bounds (:attr:`IndexCheck.low`,
:attr:`IndexCheck.high`, the ``ranges`` table of ``plan._NativeSteps``)
in C++ (the Python path's quick test is the same function, ``_lane.within``,
where the extension is built) and leaves a call with a value outside them
to the Python path,
which raises here.  The error, :class:`IndexRangeError` (an
``ExecutionError`` and an ``IndexError``, as eager's), names the input,
the value and its position, the op and the user's source line: that of
the first use in program order that refuses the value, the op eager
would have raised at.  Checked: CPU torch tensors and ``DeviceTensor``s
on one CPU device (a zero-copy view of the buffer); a ``DeviceTensor`` on
another device is not read back to the host for it (an out-of-range value
there is undefined, docs/precision.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from hloalias import config
from hloalias.contract import IndexRange
from hloalias.errors import ExecutionError
from hloalias.runtime.lane import native_within
from hloalias.runtime.ownership import DeviceTensor

#: The native lane's range check (``_lane.within``) where it is built: one
#: check in both languages, as ``first_changed``; else torch's ``aminmax``.
_within = native_within()


class IndexRangeError(ExecutionError, IndexError):
    """A user input holds an index that eager refuses for the op it feeds
    (out of range, or negative where the op counts from 0 only)."""


@dataclasses.dataclass(frozen=True)
class IndexCheck:
    """What one user input must satisfy on every call."""

    #: The ``@main`` argument index.
    index: int
    name: str
    #: The tightest bounds over every use: the quick test (the native
    #: lane's too).  Every element within them: no use refuses a value.  An
    #: element outside: the uses decide, each over the elements it reads
    #: (a use of a slice does not read the rest).
    low: int
    high: int
    #: Every use, in program order (regions included).
    ranges: tuple[IndexRange, ...]
    #: Every use reads every element: ``low``/``high`` decide alone.
    whole: bool


def enabled() -> bool:
    """Whether executables made now check their inputs' index ranges."""
    return config.flag("HLOALIAS_INDEX_CHECK")


def index_checks(ranges: Mapping[int, tuple[IndexRange, ...]], names: list[str]) -> tuple[IndexCheck, ...]:
    """One check per user input with recorded ranges (``ranges`` by
    ``@main`` argument index), in argument order; none when switched off."""
    if not enabled():
        return ()
    checks = []
    for index in sorted(ranges):
        entries = ranges[index]
        low = max(entry.low for entry in entries)
        high = min(entry.high for entry in entries)
        whole = not any(entry.region for entry in entries)
        checks.append(IndexCheck(index, names[index], low, high, entries, whole))
    return tuple(checks)


def describe_checks(checks: tuple[IndexCheck, ...]) -> str:
    """The ``explain()`` line: which inputs each call checks, and against what."""
    if not checks:
        state = "off (HLOALIAS_INDEX_CHECK=0)" if not enabled() else "none (no user input is used as indices)"
        return f"index checks per call: {state}"
    parts = []
    for check in checks:
        ops = ", ".join(sorted({entry.op for entry in check.ranges}))
        bounds = f"[{check.low}, {check.high})" + ("" if check.whole else " (else each use over the part it reads)")
        parts.append(f"'{check.name}' {bounds} ({ops})")
    return "index checks per call: " + "; ".join(parts)


def check_indices(checks: tuple[IndexCheck, ...], inputs: Mapping[int, Any]) -> None:
    """Raise :class:`IndexRangeError` for the first input of ``inputs`` (by
    ``@main`` argument index) that holds a value one of its uses refuses."""
    for check in checks:
        tensor = _host_view(inputs.get(check.index))
        if tensor is None or tensor.numel() == 0:
            continue
        quick = _within(tensor, check.low, check.high) if _within is not None else None
        if quick is None:
            smallest, largest = torch.aminmax(tensor)
            quick = check.low <= int(smallest) and int(largest) < check.high
        if quick:
            continue
        for entry in check.ranges:
            part = tensor[tuple(slice(start, stop, step) for start, stop, step in entry.region)]
            bad = (part < entry.low) | (part >= entry.high)
            if bool(bad.any()):
                raise _refusal(check, entry, part, bad)


def _host_view(value: Any) -> torch.Tensor | None:
    """The input's values on the host without a copy, or None when they
    are not there (a DeviceTensor on another device)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, DeviceTensor):
        array = value.array
        devices = array.devices()
        if len(devices) == 1 and next(iter(devices)).platform == "cpu":
            return value.to_torch()
    return None


def _refusal(check: IndexCheck, entry: IndexRange, part: torch.Tensor, bad: torch.Tensor) -> IndexRangeError:
    """The error for ``entry``'s first refused value in ``part`` (the
    region of input ``check`` it reads)."""
    flat = int(bad.reshape(-1).nonzero()[0, 0])
    value = int(part.reshape(-1)[flat])
    position = list(_unravel(flat, tuple(part.shape)))
    if entry.region:  # back to the input's own coordinates
        position = [start + i * step for i, (start, _, step) in zip(position, entry.region)]
    accepted = f"{entry.low} <= index < {entry.high}" if entry.low < 0 else f"0 <= index < {entry.high}"
    size = f"a dimension of size {entry.high}" if entry.op != "aten.put" else f"{entry.high} elements"
    where = f" at {entry.source}" if entry.source else ""
    return IndexRangeError(
        f"input '{check.name}' holds index {value} at position {tuple(position)}, out of range for "
        f"{entry.op} into {size} (eager accepts {accepted} and raises otherwise){where}; "
        "nothing ran and no state changed"
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    position = []
    for size in reversed(shape):
        position.append(flat % size)
        flat //= size
    return tuple(reversed(position))
