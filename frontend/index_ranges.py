"""Index ranges: which values of an integer user input eager PyTorch accepts
as an index, found at import so that every call can check them.

Contract: :func:`index_ranges` reads a decomposed, functional FX graph
(every node with a fake-tensor ``meta["val"]``, each node's
``meta["original_aten"]`` naming the aten op the program called: both of
the importer's traces record it) and returns, per user-input placeholder
whose values reach the index operand of an indexing op unchanged, the
range eager accepts there (:class:`~hloalias.contract.IndexRange`: the
bounds, the op and the user's source line).  It changes nothing.  The
importer writes the ranges into the IR contract
(``hloalias.index_ranges`` on the argument) and the runtime checks each
call's tensor against them before anything runs
(:class:`~hloalias.errors.IndexRangeError`).

Why: torch-mlir lowers these ops to ``stablehlo.gather``/``scatter``
(and passes to ``dynamic_slice``/``dynamic_update_slice``), whose
out-of-range indices are clamped (reads) or dropped (writes), where eager
raises an index error: ``nn.Embedding`` fed a token id >= the vocabulary
returned the last row's embedding.  The program cannot raise; the host can,
on the input, before the program runs.  Only user inputs: module state and
lifted constants are known to the caller's code, and values computed inside
the program have no host copy to check.

Which ranges (torch 2.13, checked op by op in eager): ``embedding``,
``index_select``, ``gather``, ``scatter``/``scatter_add``/
``scatter_reduce``, ``index_copy``, ``index_add`` and ``index_reduce``
accept ``[0, n)`` (a negative index is an error); advanced indexing
``x[idx]`` and its writes (``index``/``index_put``), ``index_fill``,
``take`` and ``put`` accept ``[-n, n)`` (negative ones count from the end:
:mod:`hloalias.frontend.index_normalization` makes them in-range
indices).  ``n`` is the indexed dimension's size (the element count for
``take``/``put``).  After the decompositions ``index_copy`` and
``index_add`` are ``index_put`` nodes: the op eager ran is read from
``original_aten``, the operand from the node itself.

Which inputs: a placeholder reaches an index operand through ops that keep
its set of values: views and reshapes, ``expand``, ``clone``, ``squeeze``/
``unsqueeze``, ``permute``, a ``slice`` that keeps the whole dimension, and
a conversion to an integer dtype that holds every value of the input's.  A
part of an input (a narrowing ``slice``, ``select``) or a computed index is
not followed: checking the whole input would refuse calls eager accepts (an
unused element out of range), so such an index stays unchecked
(docs/precision.md)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch
import torch.fx

from hloalias.contract import IndexRange

aten = torch.ops.aten

#: Ops (by overload packet name, a trailing ``_`` dropped) that accept
#: only ``[0, n)``.
_NON_NEGATIVE = frozenset({
    "embedding", "index_select", "gather", "scatter", "scatter_add", "scatter_reduce",
    "index_copy", "index_add", "index_reduce",
})
#: Ops that accept ``[-n, n)`` (negative indices count from the end).
_FROM_THE_END = frozenset({"index", "_unsafe_index", "index_put", "_unsafe_index_put", "index_fill", "take", "put"})

#: Decomposed nodes whose argument 2 is one index tensor along dimension argument 1 of argument 0.
_DIM_INDEX_OPS = frozenset({
    "index_select", "gather", "scatter", "scatter_add", "scatter_reduce", "index_copy", "index_add",
    "index_reduce", "index_fill",
})
#: Decomposed nodes whose argument 1 is a list of optional index tensors, one per dimension of argument 0.
_INDEX_LIST_OPS = frozenset({"index", "_unsafe_index", "index_put", "_unsafe_index_put"})
#: Decomposed nodes whose argument 1 indexes the flattened argument 0.
_FLAT_INDEX_OPS = frozenset({"take", "put"})

#: Ops whose result holds exactly the values of argument 0 (each of them, no other).
_SAME_VALUES = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
    aten.permute.default, aten.t.default, aten.transpose.int, aten.clone.default, aten.alias.default,
    aten.flatten.using_ints, aten.lift_fresh_copy.default, aten.contiguous.default,
})


def _name(op: Any) -> str:
    packet = getattr(op, "_overloadpacket", None)
    name = getattr(packet, "__name__", "") if packet is not None else ""
    return name.removesuffix("_") if name.endswith("_") and not name.endswith("__") else name


def _val(value: Any) -> Any:
    return value.meta.get("val") if isinstance(value, torch.fx.Node) else None


def _is_index_dtype(dtype: torch.dtype) -> bool:
    # Signed integers: a uint8 (or bool) index is a mask, and torch's index ops take no other unsigned type.
    return dtype in (torch.int8, torch.int16, torch.int32, torch.int64)


def _holds_all(wider: torch.dtype, narrower: torch.dtype) -> bool:
    """Whether every value of integer dtype ``narrower`` is one of ``wider``."""
    if wider.is_floating_point or wider.is_complex or wider == torch.bool or narrower.is_floating_point:
        return False
    if narrower.is_complex or narrower == torch.bool:
        return False
    return torch.iinfo(wider).min <= torch.iinfo(narrower).min and torch.iinfo(wider).max >= torch.iinfo(narrower).max


def _source(node: Any, user_inputs: Collection[str]) -> str | None:
    """The user-input placeholder whose values ``node`` holds unchanged, or None."""
    for _ in range(64):
        if not isinstance(node, torch.fx.Node):
            return None
        if node.op == "placeholder":
            return node.name if node.name in user_inputs else None
        if node.op != "call_function" or not node.args:
            return None
        operand = node.args[0]
        if node.target in _SAME_VALUES:
            node = operand
            continue
        if node.target is aten._to_copy.default:
            result, source = _val(node), _val(operand)
            if isinstance(result, torch.Tensor) and isinstance(source, torch.Tensor) and _holds_all(result.dtype, source.dtype):
                node = operand
                continue
            return None
        if node.target is aten.slice.Tensor:
            result, source = _val(node), _val(operand)
            if isinstance(result, torch.Tensor) and isinstance(source, torch.Tensor) and result.shape == source.shape:
                node = operand  # the whole dimension: every value
                continue
            return None
        return None
    return None


def _operands(node: torch.fx.Node) -> list[tuple[Any, int]]:
    """(index operand, the size it indexes) of decomposed ``node``."""
    name = _name(node.target)
    base = _val(node.args[0]) if node.args else None
    if not isinstance(base, torch.Tensor):
        return []
    if name == "embedding" and len(node.args) > 1:
        return [(node.args[1], base.shape[0])] if base.dim() >= 1 else []
    if name in _DIM_INDEX_OPS and len(node.args) > 2 and isinstance(node.args[1], int):
        rank = max(base.dim(), 1)
        dim = node.args[1] + rank if node.args[1] < 0 else node.args[1]
        size = base.shape[dim] if base.dim() > 0 and 0 <= dim < base.dim() else 1
        return [(node.args[2], size)]
    if name in _INDEX_LIST_OPS and len(node.args) > 1 and isinstance(node.args[1], (list, tuple)):
        found = []
        dim = 0
        for index in node.args[1]:
            value = _val(index)
            if index is None or not isinstance(value, torch.Tensor):
                dim += 1
                continue
            if value.dtype in (torch.bool, torch.uint8):  # a mask covers as many dimensions as it has
                dim += max(value.dim(), 1)
                continue
            if dim < base.dim():
                found.append((index, base.shape[dim]))
            dim += 1
        return found
    if name in _FLAT_INDEX_OPS and len(node.args) > 1:
        return [(node.args[1], base.numel())]
    return []


def index_ranges(
    graph: torch.fx.Graph, user_inputs: Collection[str], where: Callable[[str], str | None]
) -> dict[str, tuple[IndexRange, ...]]:
    """Per user-input placeholder name (of ``user_inputs``), the index ranges
    its values must lie in (module docstring), in graph order, each distinct
    range once.  ``where`` turns a node's ``stack_trace`` into the user's
    source line (None when it has none)."""
    found: dict[str, list[IndexRange]] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        called = _name(node.meta.get("original_aten") or node.target)
        if called in _NON_NEGATIVE:
            from_the_end = False
        elif called in _FROM_THE_END:
            from_the_end = True
        else:
            continue
        for operand, size in _operands(node):
            value = _val(operand)
            if not isinstance(size, int) or not isinstance(value, torch.Tensor) or not _is_index_dtype(value.dtype):
                continue
            source = _source(operand, user_inputs)
            if source is None:
                continue
            trace = node.meta.get("stack_trace")
            record = IndexRange(
                -size if from_the_end else 0, size, f"aten.{called}", where(trace) if trace else None,
            )
            ranges = found.setdefault(source, [])
            if record not in ranges:
                ranges.append(record)
    return {name: tuple(ranges) for name, ranges in found.items()}
