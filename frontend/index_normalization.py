"""Index normalization: make every index that torch counts from the end
(``-1`` is the last element) an in-range, non-negative index before
torch-mlir sees the graph, and give ``remainder`` torch's sign rule.

Contract: :func:`normalize_indices` rewrites a decomposed, functional FX
graph (every node with a fake-tensor ``meta["val"]``) in place so that it
computes what eager computes for every index eager accepts, and changes
nothing else.

Why here: torch-mlir's StableHLO lowering passes index tensors straight to
``stablehlo.gather``/``scatter``, whose out-of-range indices clamp (gather)
or are dropped (scatter), so ``x[idx]`` with ``idx == -1`` read element 0
and ``x[:, idx] = v`` wrote nothing.  Upstream normalizes for its linalg and
TOSA lowerings only.  And it lowers ``aten.remainder`` to
``stablehlo.remainder``, which is C's ``fmod`` (the sign of the dividend),
where torch's is Python's (the sign of the divisor): ``remainder(-1, 3)``
was ``-1``, not ``2`` (``take_along_dim``'s decomposition normalizes its
indices with exactly that ``remainder``).

Which ops accept negative indices in eager (torch 2.13, checked op by op):
advanced indexing ``x[idx]`` (``aten.index``), its writes ``x[idx] = v`` /
``index_put_`` (``aten.index_put``), ``index_fill_``, ``take``,
``take_along_dim`` and ``put_``.  After torch-mlir's decompositions these
are ``aten.index``/``_unsafe_index``, ``aten.index_put``/
``_unsafe_index_put``, ``aten.put`` and ``aten.gather`` on a ``remainder``.
``index_select``, ``gather``, ``scatter*``, ``index_copy_``, ``index_add_``,
``index_reduce_`` and ``embedding`` refuse negative indices in eager (an
index error); nothing is normalized for them.

The rewrite: each integer index tensor ``i`` of dimension size ``n``
becomes ``where(i < 0, i + n, i)``; ``remainder(a, b)`` becomes
``r + b where r != 0 and (r < 0) != (b < 0) else r`` with ``r`` the
lowered remainder (right under either sign rule, so it stays right if
upstream fixes its lowering).  Index tensors that cannot be negative are
left alone, so that patterns later passes match (a constant or ``arange``
position feeding a scatter) keep their shape: lifted constants whose
values are all non-negative, ``arange`` with a non-negative start and step,
and views, copies and broadcasts of those."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

aten = torch.ops.aten

# Ops whose argument 1 is a list of optional index tensors, one per
# dimension of argument 0 from the first.
_INDEX_LIST_OPS = frozenset(
    {
        aten.index.Tensor,
        aten._unsafe_index.Tensor,
        aten.index_put.default,
        aten._unsafe_index_put.default,
    }
)
# Ops whose argument 1 is one index tensor into the flattened argument 0.
_FLAT_INDEX_OPS = frozenset({aten.put.default})
_REMAINDER_OPS = frozenset({aten.remainder.Scalar, aten.remainder.Tensor})

# Ops whose result holds only values of their first argument (so a
# non-negative operand gives a non-negative result).
_VALUE_PRESERVING = frozenset(
    {
        aten.view.default,
        aten._unsafe_view.default,
        aten.reshape.default,
        aten.expand.default,
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.squeeze.default,
        aten.permute.default,
        aten.t.default,
        aten.transpose.int,
        aten.clone.default,
        aten.alias.default,
        aten.slice.Tensor,
        aten.select.int,
        aten.flatten.using_ints,
        aten._to_copy.default,
        aten.lift_fresh_copy.default,
    }
)


def normalize_indices(graph: torch.fx.Graph, constants: Mapping[str, Any]) -> bool:
    """Rewrite ``graph`` in place (see the module docstring); ``constants``
    maps a lifted constant's placeholder name to its tensor (values known
    at import).  Returns whether anything changed (the caller recompiles
    the graph module)."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _INDEX_LIST_OPS:
            changed |= _normalize_index_list(graph, node, constants)
        elif node.target in _FLAT_INDEX_OPS:
            changed |= _normalize_flat_index(graph, node, constants)
        elif node.target in _REMAINDER_OPS:
            changed |= _python_remainder(graph, node)
    return changed


def _val(value: Any) -> Any:
    return value.meta.get("val") if isinstance(value, torch.fx.Node) else value


def _call(graph: torch.fx.Graph, target: Any, args: tuple[Any, ...]) -> torch.fx.Node:
    """A new node ``target(*args)`` with its fake value in ``meta["val"]``."""
    node = graph.call_function(target, args)
    node.meta["val"] = target(*(_val(a) for a in args))
    return node


def _is_integer_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not value.dtype.is_floating_point and value.dtype not in (
        torch.bool,
        torch.uint8,  # a uint8 index is a mask in torch, and never negative
    ) and not value.dtype.is_complex


def _never_negative(node: Any, constants: Mapping[str, Any]) -> bool:
    """Whether ``node``'s values are known to be non-negative at import."""
    seen = 0
    while isinstance(node, torch.fx.Node) and seen < 64:
        seen += 1
        if node.op == "placeholder":
            value = constants.get(node.name)
            return isinstance(value, torch.Tensor) and bool((value >= 0).all())
        if node.op != "call_function":
            return False
        if node.target in _VALUE_PRESERVING:
            node = node.args[0]
            continue
        if node.target in (aten.arange.default, aten.arange.start, aten.arange.start_step):
            numbers = [a for a in node.args if not isinstance(a, torch.fx.Node)]
            start = numbers[0] if node.target is not aten.arange.default and numbers else 0
            step = numbers[2] if node.target is aten.arange.start_step and len(numbers) > 2 else 1
            return isinstance(start, (int, float)) and isinstance(step, (int, float)) and start >= 0 and step > 0
        return False
    return False


def _normalized(graph: torch.fx.Graph, index: torch.fx.Node, size: int) -> torch.fx.Node:
    """``where(index < 0, index + size, index)`` inserted before its use."""
    negative = _call(graph, aten.lt.Scalar, (index, 0))
    wrapped = _call(graph, aten.add.Scalar, (index, size))
    return _call(graph, aten.where.self, (negative, wrapped, index))


def _normalize_index_list(graph: torch.fx.Graph, node: torch.fx.Node, constants: Mapping[str, Any]) -> bool:
    base = _val(node.args[0])
    indices = node.args[1]
    if not isinstance(base, torch.Tensor) or not isinstance(indices, (list, tuple)):
        return False
    new_indices: list[Any] = []
    dim = 0
    changed = False
    for index in indices:
        value = _val(index)
        if index is None or not isinstance(value, torch.Tensor):
            new_indices.append(index)
            dim += 1
            continue
        if not _is_integer_tensor(value):  # a mask covers as many dimensions as it has
            new_indices.append(index)
            dim += max(value.dim(), 1)
            continue
        size = base.shape[dim] if dim < base.dim() else None
        if isinstance(size, int) and isinstance(index, torch.fx.Node) and not _never_negative(index, constants):
            with graph.inserting_before(node):
                index = _normalized(graph, index, size)
            changed = True
        new_indices.append(index)
        dim += 1
    if changed:
        node.args = (node.args[0], type(indices)(new_indices), *node.args[2:])
    return changed


def _normalize_flat_index(graph: torch.fx.Graph, node: torch.fx.Node, constants: Mapping[str, Any]) -> bool:
    base, index = _val(node.args[0]), node.args[1]
    if not isinstance(base, torch.Tensor) or not isinstance(index, torch.fx.Node):
        return False
    size = base.numel()
    if not isinstance(size, int) or not _is_integer_tensor(_val(index)) or _never_negative(index, constants):
        return False
    with graph.inserting_before(node):
        node.args = (node.args[0], _normalized(graph, index, size), *node.args[2:])
    return True


def _python_remainder(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """Follow ``node`` (a ``remainder``) by the sign correction."""
    divisor = node.args[1]
    result = _val(node)
    if not isinstance(result, torch.Tensor) or result.dtype == torch.bool:
        return False
    users = list(node.users)
    tensor_divisor = isinstance(divisor, torch.fx.Node)
    if not tensor_divisor and not isinstance(divisor, (int, float)):
        return False
    added: list[torch.fx.Node] = []

    def add(target: Any, args: tuple[Any, ...]) -> torch.fx.Node:
        with graph.inserting_after(added[-1] if added else node):
            made = _call(graph, target, args)
        added.append(made)
        return made

    nonzero = add(aten.ne.Scalar, (node, 0))
    result_negative = add(aten.lt.Scalar, (node, 0))
    if tensor_divisor:
        # logical_xor, not ne: torch-mlir compares i1 with a signed comparison, which XLA refuses.
        signs_differ = add(aten.logical_xor.default, (result_negative, add(aten.lt.Scalar, (divisor, 0))))
    elif isinstance(divisor, (int, float)) and divisor < 0:
        signs_differ = add(aten.logical_not.default, (result_negative,))
    else:
        signs_differ = result_negative
    wrong = add(aten.logical_and.default, (nonzero, signs_differ))
    shifted = add(aten.add.Tensor if tensor_divisor else aten.add.Scalar, (node, divisor))
    if shifted.meta["val"].dtype != result.dtype:
        return _undo(graph, added)
    corrected = add(aten.where.self, (wrong, shifted, node))
    for user in users:
        user.replace_input_with(node, corrected)
    return True


def _undo(graph: torch.fx.Graph, added: list[torch.fx.Node]) -> bool:
    for made in reversed(added):
        graph.erase_node(made)
    return False
