"""Index ranges of user inputs: which values eager accepts of a user input
that a program uses as indices.

Contract: :func:`input_index_ranges` reads a decomposed, functional FX
graph (every node with a fake-tensor ``meta["val"]``, before
:mod:`hloalias.frontend.index_normalization` rewrites it) and returns, per
integer user input whose values reach an indexing op through shape-only
ops, one :class:`hloalias.contract.IndexRange` per such use: eager raises
an IndexError/RuntimeError for a value outside ``[low, high)`` in the
elements the use reads, and XLA would clamp it (gathers) or drop it
(scatters) instead.  The importer writes them into the IR contract
(``hloalias.index_ranges``) and the runtime checks every call's inputs
against them before anything runs (:mod:`hloalias.runtime.index_check`).
A range is exactly eager's condition, never stricter: a use that reads
only part of the input (``ids[:, 1:]``) records that part (``region``),
and a path this analysis cannot follow exactly records nothing.

Which uses: ``embedding``, ``index_select``, ``gather``, ``scatter``/
``scatter_add``/``scatter_reduce``, ``index_copy``/``index_add``/
``index_reduce`` (also where torch decomposed them into ``index_put``:
``meta["original_aten"]``) take ``[0, n)``; advanced indexing
(``aten.index``/``index_put`` and their unsafe forms) and ``index_fill``
take ``[-n, n)``, ``put`` ``[-numel, numel)``, as in eager.  Which paths:
from the input through ``view``/``reshape``/``flatten``/``squeeze``/
``unsqueeze``/``expand``/``permute``/``transpose``/``slice``/``select``/
``clone`` and integer conversions that keep every value (widening, the
same width).  Indices computed inside the program (arithmetic, a
``remainder``, ``where``) are not checked: an out-of-range one is
undefined (docs/precision.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.fx

from hloalias.contract import IndexRange

aten = torch.ops.aten

#: Ops whose values are their first argument's, in the same dimensions.
_SAME = frozenset({
    aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
    aten.contiguous.default,
})
#: Ops whose values are their first argument's, in other dimensions.
_RESHAPE = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.flatten.using_ints,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
})
#: Ops reading ``args[2]`` as indices into dimension ``args[1]`` of ``args[0]``, from 0.
_DIM_INDEX_OPS = frozenset({
    aten.index_select.default, aten.gather.default, aten.scatter.src, aten.scatter.value,
    aten.scatter.reduce, aten.scatter.value_reduce, aten.scatter_add.default, aten.scatter_reduce.two,
    aten.index_copy.default, aten.index_add.default, aten.index_reduce.default,
})
#: The same, counting from the end too (eager accepts ``-n <= i < n``).
_DIM_INDEX_NEGATIVE_OPS = frozenset({aten.index_fill.int_Scalar, aten.index_fill.int_Tensor})
#: Ops whose ``args[1]`` is a list of optional index tensors, one per dimension of ``args[0]``.
_INDEX_LIST_OPS = frozenset({
    aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_put.default, aten._unsafe_index_put.default,
})
#: What an ``index_put`` decomposed from these (by name: the graph's
#: ``original_aten`` may be a copy of the op object) refuses: negative indices.
_FROM_ZERO_ORIGINS = frozenset({"index_copy", "index_add", "index_reduce"})


@dataclasses.dataclass(frozen=True)
class _Reach:
    """How a tensor's values come from a user input: ``dims[d]`` is the
    input dimension that dimension ``d`` walks (None: a new or broadcast
    dimension), or ``dims`` is None after a reshape; ``region`` is the
    ``(start, stop, step)`` per input dimension of the elements it holds."""

    dims: tuple[int | None, ...] | None
    region: tuple[tuple[int, int, int], ...]


def input_index_ranges(
    graph: torch.fx.Graph, user_inputs: Iterable[str], where: Callable[[torch.fx.Node], str | None],
) -> dict[str, tuple[IndexRange, ...]]:
    """Per user input placeholder (by name, among ``user_inputs``): its uses
    as indices (see the module docstring), in program order, each one not
    already implied by an earlier one.  ``where`` gives a node's user
    source line for messages."""
    names = set(user_inputs)
    reach: dict[torch.fx.Node, tuple[torch.fx.Node, _Reach]] = {}
    found: dict[str, list[IndexRange]] = {}
    for node in graph.nodes:
        if node.op == "placeholder":
            value = node.meta.get("val")
            if node.name in names and _is_index_tensor(value):
                reach[node] = (node, _Reach(tuple(range(value.dim())), tuple((0, s, 1) for s in value.shape)))
            continue
        if node.op != "call_function":
            continue
        for operand, low, high in _index_operands(node):
            if isinstance(operand, torch.fx.Node) and operand in reach:
                source, how = reach[operand]
                whole = all(r == (0, s, 1) for r, s in zip(how.region, source.meta["val"].shape))
                entry = IndexRange(low, high, _op_name(node), where(node), () if whole else how.region)
                found.setdefault(source.name, []).append(entry)
        first = node.args[0] if node.args else None
        if isinstance(first, torch.fx.Node) and first in reach:
            source, how = reach[first]
            followed = _follow(node, how)
            value = node.meta.get("val")
            if followed is not None and isinstance(value, torch.Tensor) and value.numel() > 0:
                reach[node] = (source, followed)
    return {name: _without_implied(entries) for name, entries in found.items()}


def _is_index_tensor(value: Any) -> bool:
    # The signed integer dtypes (the ones torch's index ops take; uint8 and
    # bool index tensors are masks).
    return (
        isinstance(value, torch.Tensor) and value.dtype in (torch.int64, torch.int32, torch.int16, torch.int8)
        and all(isinstance(s, int) for s in value.shape) and value.numel() > 0
    )


def _op_name(node: torch.fx.Node) -> str:
    origin = node.meta.get("original_aten")
    target = origin if origin is not None and node.target in _INDEX_LIST_OPS else node.target
    packet = getattr(target, "_overloadpacket", None)
    return f"aten.{getattr(packet, '__name__', str(target))}"


def _size(value: Any, dim: Any) -> int | None:
    """``value.shape[dim]`` (1 for a 0-d tensor), or None when unknown."""
    if not isinstance(value, torch.Tensor) or not isinstance(dim, int):
        return None
    if value.dim() == 0:
        return 1 if dim in (0, -1) else None
    if not -value.dim() <= dim < value.dim():
        return None
    size = value.shape[dim]
    return size if isinstance(size, int) else None


def _index_operands(node: torch.fx.Node) -> list[tuple[Any, int, int]]:
    """(index operand, low, high) of each index tensor ``node`` reads."""
    target, args = node.target, node.args
    if target is aten.embedding.default and len(args) >= 2:
        size = _size(args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None, 0)
        return [] if size is None else [(args[1], 0, size)]
    if (target in _DIM_INDEX_OPS or target in _DIM_INDEX_NEGATIVE_OPS) and len(args) >= 3:
        size = _size(args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None, args[1])
        if size is None:
            return []
        return [(args[2], -size if target in _DIM_INDEX_NEGATIVE_OPS else 0, size)]
    if target is aten.put.default and len(args) >= 2 and isinstance(args[0], torch.fx.Node):
        base = args[0].meta.get("val")
        numel = base.numel() if isinstance(base, torch.Tensor) else None
        return [] if not isinstance(numel, int) else [(args[1], -numel, numel)]
    if target in _INDEX_LIST_OPS and len(args) >= 2 and isinstance(args[0], torch.fx.Node):
        base = args[0].meta.get("val")
        indices = args[1]
        if not isinstance(base, torch.Tensor) or not isinstance(indices, (list, tuple)):
            return []
        origin = getattr(node.meta.get("original_aten"), "_overloadpacket", None)
        from_zero = getattr(origin, "__name__", None) in _FROM_ZERO_ORIGINS
        operands = []
        dim = 0
        for index in indices:
            value = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
            if isinstance(value, torch.Tensor) and (value.dtype in (torch.bool, torch.uint8)):
                dim += max(value.dim(), 1)  # a mask covers as many dimensions as it has
                continue
            size = _size(base, dim) if dim < base.dim() else None
            if isinstance(index, torch.fx.Node) and size is not None:
                operands.append((index, 0 if from_zero else -size, size))
            dim += 1
        return operands
    return []


def _keeps_values(source: torch.dtype, target: Any) -> bool:
    """An integer conversion that keeps every value of ``source``."""
    if not isinstance(target, torch.dtype) or target.is_floating_point or target.is_complex or target == torch.bool:
        return False
    source_info, target_info = torch.iinfo(source), torch.iinfo(target)
    return target_info.min <= source_info.min and source_info.max <= target_info.max


def _follow(node: torch.fx.Node, how: _Reach) -> _Reach | None:
    """How ``node``'s values come from the input, given its first
    argument's; None when they are not its values, or not exactly known."""
    target, args = node.target, node.args
    before = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
    if not isinstance(before, torch.Tensor):
        return None
    if target in _SAME:
        return how
    if target is aten._to_copy.default:
        dtype = node.kwargs.get("dtype", before.dtype)
        return how if _keeps_values(before.dtype, dtype) else None
    if target in _RESHAPE:
        return _Reach(None, how.region)
    if how.dims is None:
        return None
    dims = list(how.dims)
    rank = len(dims)
    numbers = [a if isinstance(a, int) and not isinstance(a, bool) else None for a in args[1:5]]
    if target is aten.unsqueeze.default and numbers and numbers[0] is not None:
        dim = numbers[0] if numbers[0] >= 0 else numbers[0] + rank + 1
        return _Reach(tuple(dims[:dim] + [None] + dims[dim:]), how.region)
    if target is aten.expand.default and isinstance(args[1], (list, tuple)):
        sizes = list(args[1])
        new = len(sizes) - rank
        kept = [d if before.shape[i] == sizes[new + i] or sizes[new + i] == -1 else None for i, d in enumerate(dims)]
        return _Reach(tuple([None] * new + kept), how.region)
    if target is aten.permute.default and isinstance(args[1], (list, tuple)):
        return _Reach(tuple(dims[int(d) % rank] for d in args[1] if isinstance(d, int)), how.region)
    if target is aten.t.default and rank < 2:
        return how
    if target in (aten.transpose.int, aten.t.default) and rank >= 2:
        first, second = (numbers[0], numbers[1]) if target is aten.transpose.int else (0, 1)
        if first is None or second is None:
            return None
        first, second = first % rank, second % rank
        dims[first], dims[second] = dims[second], dims[first]
        return _Reach(tuple(dims), how.region)
    if target in (aten.slice.Tensor, aten.select.int) and rank > 0:
        dim = (numbers[0] if numbers and numbers[0] is not None else 0) % rank
        size = before.shape[dim]
        if not isinstance(size, int):
            return None
        if target is aten.select.int:
            if len(numbers) < 2 or numbers[1] is None:
                return None
            start = numbers[1] + size if numbers[1] < 0 else numbers[1]
            picked = range(size)[start:start + 1]
        else:
            # None bounds are open; anything else that is not an int: not followed.
            bounds = list(args[2:5]) + [None] * (3 - len(args[2:5]))
            if any(b is not None and not isinstance(b, int) for b in bounds):
                return None
            start_at, stop_at, step = (b if isinstance(b, int) else None for b in bounds)
            picked = range(size)[slice(start_at, stop_at, step)]
        if len(picked) == 0:
            return None
        region = list(how.region)
        source_dim = dims[dim]
        if source_dim is not None:
            first_at, _, step_of = region[source_dim]
            begin = first_at + picked.start * step_of
            stride = step_of * picked.step
            region[source_dim] = (begin, begin + (len(picked) - 1) * stride + 1, stride if len(picked) > 1 else 1)
        if target is aten.select.int:
            del dims[dim]
        return _Reach(tuple(dims), tuple(region))
    return None


def _without_implied(entries: list[IndexRange]) -> tuple[IndexRange, ...]:
    """``entries`` less each one that an earlier one over the same elements
    (or all of them) implies (every value it refuses, the earlier one refused first)."""
    kept: list[IndexRange] = []
    for entry in entries:
        if not any(
            (earlier.region == entry.region or not earlier.region) and entry.low <= earlier.low and earlier.high <= entry.high
            for earlier in kept
        ):
            kept.append(entry)
    return tuple(kept)
