"""The tensors a compiled function's lifted constants are.

``torch.export`` of a plain function (``lambda x: model(x)``,
``functools.partial(f, model)``, a function over a global tensor) lifts
every tensor the function reaches other than through its arguments as a
constant: a closed-over model's parameters and buffers, a closure or global
tensor.  For a parameter it lifts an alias (the same memory, a tensor
object of its own, with a version counter of its own), so a later in-place
write to the parameter (an eager optimizer step, ``weight.mul_(2)`` under
``no_grad``) moves no counter the runtime's state watch can see, and the
program kept the values it was compiled with: a silently stale result.

:func:`with_sources` replaces each such state value by the tensor it
aliases, found among the tensors the function reaches: its closure cells,
the globals its code names (nested code included), its defaults, a
``functools.partial``'s arguments, a bound method's object; for each
module among them its parameters, buffers and tensor attributes.  A value
is replaced only by a tensor of exactly its memory and geometry (data
pointer, storage offset, shape, strides, dtype): the values are identical
at compile, and the runtime then follows the tensor the user writes.  A
constant the code makes itself (``torch.tensor([1, 2])``) matches nothing
and stays."""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

#: How far through partials and bound methods :func:`_reached` looks.
_MAX_DEPTH = 4


def code_names(code: types.CodeType) -> frozenset[str]:
    """The attribute and global names ``code`` and its nested code use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return frozenset(names)


def _reached(f: Any, depth: int = 0) -> list[Any]:
    """The objects ``f`` reaches other than through its arguments."""
    if depth > _MAX_DEPTH:
        return []
    if isinstance(f, functools.partial):
        return [*f.args, *f.keywords.values(), *_reached(f.func, depth + 1)]
    owner = getattr(f, "__self__", None)
    function = getattr(f, "__func__", f)
    found: list[Any] = [] if owner is None else [owner]
    if isinstance(function, types.FunctionType):
        found += [cell.cell_contents for cell in function.__closure__ or () if filled(cell)]
        namespace = function.__globals__
        found += [namespace[name] for name in sorted(code_names(function.__code__)) if name in namespace]
        found += list(function.__defaults__ or ())
        found += list((function.__kwdefaults__ or {}).values())
    return found


def filled(cell: types.CellType) -> bool:
    """Whether ``cell`` holds a value (an empty one is a name bound later)."""
    try:
        cell.cell_contents
    except ValueError:  # an empty cell: a name bound later
        return False
    return True


def _geometry(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def _candidates(f: Any) -> dict[tuple[Any, ...], torch.Tensor]:
    """The tensors ``f`` reaches, by memory and geometry (a parameter first
    when one memory has several)."""
    tensors: list[torch.Tensor] = []
    for value in _reached(f):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, torch.nn.Module):
            tensors += [t for _, t in value.named_parameters(remove_duplicate=False)]
            tensors += [t for _, t in value.named_buffers(remove_duplicate=False)]
            for module in value.modules():
                tensors += [
                    t for name, t in vars(module).items()
                    if isinstance(t, torch.Tensor) and not name.startswith("_")
                ]
    found: dict[tuple[Any, ...], torch.Tensor] = {}
    for tensor in tensors:
        if tensor.layout is not torch.strided or tensor.device.type == "meta" or tensor.numel() == 0:
            continue
        key = _geometry(tensor)
        if key not in found or (isinstance(tensor, torch.nn.Parameter) and not isinstance(found[key], torch.nn.Parameter)):
            found[key] = tensor
    return found


def with_sources(f: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (a function's program state by argument name) with every
    value that aliases a tensor ``f`` reaches replaced by that tensor."""
    if isinstance(f, torch.nn.Module) or not state:
        return state
    candidates = _candidates(f)
    if not candidates:
        return state
    known = {id(tensor) for tensor in candidates.values()}
    replaced = dict(state)
    for name, value in state.items():
        if id(value) in known or value.layout is not torch.strided or value.numel() == 0:
            continue
        source = candidates.get(_geometry(value))
        if source is not None:
            replaced[name] = source
    return replaced
