"""Counters of the state store's work (a test helper): tests that count
how often a read copies a lagging slot into its module tensor."""

from __future__ import annotations

from typing import Any

import pytest

from hloalias.runtime import state as state_module


def count_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count, in the returned one-element list, the calls of
    ``_StateSlot.copy_to_source`` on a lagging slot (a copy of the
    device's value into the module's tensor) until ``monkeypatch`` undoes it."""
    copies = [0]
    original = state_module._StateSlot.copy_to_source

    def counted(slot: Any) -> None:
        if slot.lags:
            copies[0] += 1
        original(slot)

    monkeypatch.setattr(state_module._StateSlot, "copy_to_source", counted)
    return copies
