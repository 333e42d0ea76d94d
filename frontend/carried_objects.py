"""Input objects a program returns as themselves (a transformers ``Cache``).

A Hugging Face model updates the ``past_key_values`` it is given in Python
(``DynamicCache`` grows each layer by ``torch.cat`` and reassigns it; a
``StaticCache`` allocates its tensors on its first update) and returns that
same object.  ``torch.export`` sees the object as a pytree of tensors: the
program returns the updated tensors in a new object, and the caller's
object stays as it was.  A loop that keeps passing its own cache (Hugging
Face's documented ``past_key_values = DynamicCache(...)`` loop) would then
run every step on the empty cache: silently wrong logits.

:func:`record_carried_objects` watches the export call (a forward hook on
the exported module) and returns which output nodes are input nodes, as
``(output path, input path)`` pairs.  A path is a tuple of container keys
(tuple/list positions, dict keys) from the user outputs, or from the call's
``(args, kwargs)``; the objects are the pytree nodes that are neither
containers nor tensors.  The runtime writes each returned object's state
into the caller's object after the call and returns the caller's object
there, as eager does (:mod:`hloalias.runtime.carried_objects`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

#: ``(output path, input path)`` pairs (module docstring).
CarriedObjects = tuple[tuple[tuple[Any, ...], tuple[Any, ...]], ...]


def object_nodes(tree: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every pytree node of ``tree`` below containers that is an object
    (a registered class with attributes, not a tuple, list or dict), with
    its path; containers are walked, objects are not (their parts travel
    with them)."""
    if isinstance(tree, (tuple, list)):
        for index, item in enumerate(tree):
            yield from object_nodes(item, (*path, index))
    elif isinstance(tree, dict):  # also ModelOutput, an OrderedDict
        for key, item in tree.items():
            yield from object_nodes(item, (*path, key))
    elif type(tree) in pytree.SUPPORTED_NODES and hasattr(tree, "__dict__") and not isinstance(tree, torch.Tensor):
        yield path, tree


@contextlib.contextmanager
def record_carried_objects(module: torch.nn.Module) -> Iterator[list[CarriedObjects]]:
    """While exporting ``module``: the yielded list receives, for each
    forward of ``module``, the objects its output returns from its input."""
    found: list[CarriedObjects] = []

    def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        inputs = {id(node): path for path, node in object_nodes((args, kwargs))}
        found.append(tuple(
            (path, inputs[id(node)]) for path, node in object_nodes(output) if id(node) in inputs
        ))

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        yield found
    finally:
        handle.remove()
