"""A Ctrl-C at any point of the lazy CIA override
(frontend/torch_internals.py ``cia_override``) leaves every operator of
its table as it was, once the next override's entry has finished what an
interrupted exit left (``_finish_restore``): the same kernel tables and
fake rules, torch's ``_get_dispatch`` and ``py_impl`` back, and the next
override lazy again.  Deterministic: the interrupt is delivered at every
point where Python checks for signals (test/py/interrupt_points.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch._dispatch.python import enable_python_dispatcher

from hloalias.frontend import importer, torch_internals
from interrupt_points import sweep
from test_torch_internals import _operator_state


def test_an_interrupt_anywhere_in_the_lazy_override_puts_every_operator_back() -> None:
    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    item, linear = torch.ops.aten.item.default, torch.ops.aten.linear.default
    table = {item: cia_to_decomp[item], linear: cia_to_decomp[linear]}
    ops = list(table)
    with torch_internals.cia_override(table):
        pass  # (item's own fake rule goes at the first exit)
    get_dispatch = torch._ops.OpOverload.__dict__["_get_dispatch"]
    with torch_internals.eager_cia_override(table):
        eager = _operator_state(ops)

    def prepare() -> dict[Any, Any]:
        return _operator_state(ops)

    def run(_: dict[Any, Any]) -> None:
        with torch_internals.cia_override(table):
            with enable_python_dispatcher():
                assert item(torch.tensor(2.5)) == 2.5
            assert _operator_state([item]) == {item: eager[item]}

    def check(before: dict[Any, Any], where: Any) -> None:
        torch_internals._finish_restore()  # what the next override's entry does first
        assert _operator_state(ops) == before, f"operators not put back after {where}"
        assert torch._ops.OpOverload.__dict__["_get_dispatch"] is get_dispatch, where
        assert "py_impl" not in torch._ops.OpOverload.__dict__, where
        assert not torch_internals._LAZY_ACTIVE[0] and torch_internals._LAZY_FINISH[0] is None, where

    points = sweep(prepare, run, check, {torch_internals.__file__})
    names = {name for name, _, _ in points}
    # The sweep went through the entry, the patching in the hook and the exit.
    assert {"cia_override", "hooked_get_dispatch", "patch", "restore"} <= {name.split(".")[-1] for name in names}, \
        sorted(names)
