"""Which user outputs of an exported program eager would return without
a gradient from the module's parameters.

Eager PyTorch gives a result ``requires_grad`` when autograd records a path
to it from a tensor that requires grad.  In a functional graph that path
is a chain of floating or complex values from a trainable parameter's
placeholder to the output: an integer or bool value carries no gradient
(``argmax``, comparisons, indices), so a chain through one is cut there.

:func:`parameter_free_outputs` answers with the user outputs no such chain
reaches (a buffer plus one, ``x * 2``, a mask).  The answer errs one way
only: operations that stop autograd inside ``forward`` (``detach()``, a
``torch.no_grad()`` block) leave no trace in the functional graph, so
their results count as reached, as if eager recorded them.  The runtime
(:mod:`hloalias.runtime.gradient_boundary`) marks the reached outputs
only."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind


def _carries_gradient(value: Any) -> bool:
    """Whether a node's value can require grad (a floating or complex
    tensor, or a tuple of values holding one)."""
    if isinstance(value, torch.Tensor):
        return value.is_floating_point() or value.is_complex()
    if isinstance(value, (tuple, list)):
        return any(_carries_gradient(item) for item in value)
    return False


def parameter_free_outputs(exported: ExportedProgram) -> frozenset[int]:
    """The positions, among the user outputs (constants counted, as the
    out spec's leaves are), of the outputs no floating chain from a
    parameter that requires grad reaches."""
    signature = exported.graph_signature
    graph = exported.graph_module.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    reached: set[torch.fx.Node] = set()
    for spec, node in zip(signature.input_specs, placeholders):
        if spec.kind is InputKind.PARAMETER and spec.target is not None:
            value = exported.state_dict.get(spec.target)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                reached.add(node)
    output_node = next(node for node in graph.nodes if node.op == "output")
    if reached:
        for node in graph.nodes:
            if node.op not in ("call_function", "call_method", "call_module"):
                continue
            inputs = [
                leaf for leaf in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(leaf, torch.fx.Node)
            ]
            if any(leaf in reached for leaf in inputs) and _carries_gradient(node.meta.get("val")):
                reached.add(node)
    free: set[int] = set()
    position = 0
    for spec, value in zip(signature.output_specs, output_node.args[0]):
        if spec.kind is not OutputKind.USER_OUTPUT:
            continue
        if isinstance(spec.arg, ConstantArgument) or value not in reached:
            free.add(position)
        position += 1
    return frozenset(free)
