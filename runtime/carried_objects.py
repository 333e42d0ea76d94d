"""The caller's objects that a program returns as themselves, updated as in
eager (see :mod:`hloalias.frontend.carried_objects`, which finds them).

After a call, each returned object's state (the attributes of a
transformers ``Cache`` and of its layers) is written into the caller's
object at the recorded input path, and the caller's object is returned in
its place: ``model(ids, past_key_values=cache).past_key_values is cache``
and ``cache`` holds the new keys and values, as eager's would.  Tensors
that are the same view of the same memory (a ``StaticCache`` layer updated
in place) stay the caller's tensor objects; others are the program's
results."""

from __future__ import annotations

from typing import Any

import torch

from hloalias.errors import ExecutionError
from hloalias.frontend.carried_objects import CarriedObjects


def carry_objects(carried: CarriedObjects, call: tuple[tuple[Any, ...], dict[str, Any]], outputs: Any) -> Any:
    """``outputs`` with each carried object replaced by the caller's object
    in ``call`` (the call's ``(args, kwargs)`` in the compiled order),
    updated to the returned state.  Idempotent: an exception while it
    runs (a KeyboardInterrupt included) completes it before it leaves, so
    the caller's object never holds part of a step."""
    try:
        return _carry(carried, call, outputs)
    except BaseException:
        _carry(carried, call, outputs)
        raise


def callers_objects(carried: CarriedObjects, call: tuple[tuple[Any, ...], dict[str, Any]]) -> list[Any]:
    """The caller's objects in ``call`` that the program returns as themselves."""
    return [_at(call, input_path) for _, input_path in carried]


def _carry(carried: CarriedObjects, call: tuple[tuple[Any, ...], dict[str, Any]], outputs: Any) -> Any:
    for output_path, input_path in carried:
        callers = _at(call, input_path)
        returned = _at(outputs, output_path)
        if callers is returned:
            continue
        if type(callers) is not type(returned):
            raise ExecutionError(
                f"input {_describe(input_path)} is a {type(callers).__name__}, the program returns it "
                f"as a {type(returned).__name__}: compile again"
            )
        outputs = _replace(outputs, output_path, _merge(callers, returned))
    return outputs


def _describe(path: tuple[Any, ...]) -> str:
    where, *rest = path
    head = f"argument {rest[0]}" if where == 0 else f"'{rest[0]}'"
    return head + "".join(f"[{key!r}]" for key in rest[1:])


def _at(tree: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _replace(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(tree, tuple):
        items = list(tree)
        items[key] = _replace(items[key], rest, value)
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    tree[key] = _replace(tree[key], rest, value)  # a list, dict or ModelOutput
    return tree


def _same_view(old: torch.Tensor, new: torch.Tensor) -> bool:
    return (
        old.data_ptr() == new.data_ptr() and old.dtype == new.dtype and old.shape == new.shape
        and old.stride() == new.stride() and old.device == new.device
    )


def _merge(old: Any, new: Any) -> Any:
    """``old`` updated to ``new``'s state where it is a mutable object of the
    same kind (attributes, list items, dict entries), else ``new``."""
    if old is new:
        return old
    if isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor):
        both = isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)
        return old if both and _same_view(old, new) else new
    if type(old) is not type(new):
        return new
    if isinstance(old, list):
        if len(old) != len(new):
            return new
        old[:] = [_merge(a, b) for a, b in zip(old, new)]
        return old
    if isinstance(old, dict):
        if old.keys() != new.keys():
            return new
        for key in new:
            old[key] = _merge(old[key], new[key])
        return old
    if isinstance(old, tuple) or not hasattr(old, "__dict__") or isinstance(old, type):
        return new
    state, new_state = vars(old), vars(new)
    for name in [name for name in state if name not in new_state]:
        del state[name]
    for name, value in new_state.items():
        state[name] = _merge(state[name], value) if name in state else value
    return old
