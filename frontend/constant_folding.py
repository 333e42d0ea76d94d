"""Constant folding with torch's own semantics, before torch-mlir folds.

Contract: :func:`fold_constants` rewrites a decomposed, functional FX graph
(every node with a fake-tensor ``meta["val"]``) in place: each node whose
value is known at import (it depends on no argument; lifted constants are
arguments of ``@main``, which torch-mlir does not fold) and is one value repeated (a splat) becomes ``aten.full`` of
that value, computed by running the op in eager torch.  Nothing that
depends on a parameter, buffer or user input changes, and random ops and
uninitialized memory are never evaluated.

Why: torch-mlir's canonicalizer folds arithmetic on constant tensors with
MLIR's fixed-width integer rules, not torch's, and hloalias got silently
wrong results from it: ``ones_like(b) + ones_like(b)`` on bools folded to
False (1 + 1 wraps in ``i1``; torch's bool add is a logical or), ``True <
False`` compared ``i1`` as signed (True is -1), ``uint8`` comparisons and
right shifts as signed, and integer ``floor_divide`` of negative constants
to garbage (``full(-7) // 3`` gave 6148914691236516864).  The same ops on
values known only at run time lower right.  Evaluating the constant part
here, with torch, leaves torch-mlir nothing to fold; a splat stays one
scalar in the module (``aten.full``), so large constants (attention masks
of one value) cost nothing.  A known value that is not a splat (an
``arange``) is left to the lowering, which keeps it symbolic."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_map

from hloalias.frontend.torch_internals import eliminate_dead_code

aten = torch.ops.aten

# Ops whose result is not a function of their arguments.
_NOT_FUNCTIONS = frozenset(
    {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
)
# Ops whose first argument contributes only its shape, dtype and device.
_SHAPE_ONLY = frozenset({"full_like", "zeros_like", "ones_like", "new_full", "new_zeros", "new_ones"})
# Known inputs larger than this are not evaluated (import time; constants
# that large come from arange-like ops, which stay symbolic anyway).
_MAX_EVALUATED_ELEMENTS = 1 << 16


def fold_constants(graph: torch.fx.Graph) -> bool:
    """Fold ``graph`` in place (see the module docstring).  Returns
    whether anything changed (the caller recompiles the graph module)."""
    known: dict[torch.fx.Node, Any] = {}
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or not _evaluable(node.target):
            continue
        operands = [*node.all_input_nodes]
        if node.target._overloadpacket.__name__ in _SHAPE_ONLY and operands:
            # full_like(x, v) reads only x's shape and dtype: a stand-in does.
            stand_ins = {operands[0]: known.get(operands[0], _stand_in(operands[0]))}
        else:
            stand_ins = {}
        if any(operand not in known and operand not in stand_ins for operand in operands):
            continue
        values = {**known, **stand_ins}
        try:
            value = node.target(*tree_map(lambda a: values.get(a, a), node.args), **tree_map(
                lambda a: values.get(a, a), node.kwargs
            ))
        except Exception:  # the lowering, or the run, reports it as it would have
            continue
        if not isinstance(value, torch.Tensor) or value.is_complex() or value.numel() > _MAX_EVALUATED_ELEMENTS:
            continue
        known[node] = value
        if node.target is aten.full.default or not node.users:
            continue
        splat = _splat_value(value)
        fake = node.meta.get("val")
        if splat is None or not isinstance(fake, torch.Tensor) or fake.dtype != value.dtype:
            continue
        if value.dtype == torch.uint8:
            # torch-mlir cannot lower a uint8 literal (it folds a conversion
            # into one too): left to the lowering, as before.
            continue
        with graph.inserting_before(node):
            full = graph.call_function(
                aten.full.default,
                (list(value.shape), splat),
                {"dtype": value.dtype, "layout": torch.strided, "device": fake.device, "pin_memory": False},
            )
        full.meta = dict(node.meta)
        node.replace_all_uses_with(full)
        known[full] = value
        changed = True
    if changed:
        eliminate_dead_code(graph)
    return changed


def _stand_in(node: torch.fx.Node) -> Any:
    """A real tensor of ``node``'s shape and dtype (values irrelevant), or
    None when its fake value is no tensor."""
    fake = node.meta.get("val")
    if not isinstance(fake, torch.Tensor) or fake.numel() > _MAX_EVALUATED_ELEMENTS:
        return None
    return torch.zeros(fake.shape, dtype=fake.dtype)


def _evaluable(target: Any) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable:
        return False
    return target._overloadpacket.__name__ not in _NOT_FUNCTIONS


def _splat_value(value: torch.Tensor) -> bool | int | float | None:
    """The one value every element of ``value`` has, as a Python scalar;
    None if they differ (or ``value`` is empty)."""
    if value.numel() == 0:
        return None
    flat = value.reshape(-1)
    first = flat[0]
    if value.dtype.is_floating_point:
        # NaN never equals itself; -0.0 equals 0.0 but is another value.
        same = bool(torch.isnan(flat).all()) if bool(torch.isnan(first)) else bool(
            ((flat == first) & (torch.signbit(flat) == torch.signbit(first))).all()
        )
    else:
        same = bool((flat == first).all())
    return first.item() if same else None
