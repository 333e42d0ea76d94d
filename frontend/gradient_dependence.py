"""Which user outputs of an exported program eager would return without
a gradient from the module's parameters, and which it would return with a
gradient from each floating user input.

Eager PyTorch gives a result ``requires_grad`` when autograd records a path
to it from a tensor that requires grad.  In a functional graph that path
is a chain of floating or complex values from a trainable parameter's
placeholder to the output: an integer or bool value carries no gradient
(``argmax``, comparisons, indices), so a chain through one is cut there.

:func:`parameter_free_outputs` answers with the user outputs no such chain
reaches (a buffer plus one, ``x * 2``, a mask); :func:`input_reached_outputs`
with the user outputs each floating user input's chains reach (eager's
results that require grad when the caller's input does), and
:func:`constant_reached_outputs` the same for a function's closed-over
tensors (a closed-over model's parameters).  The answer errs one way
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
    sources: dict[torch.fx.Node, int] = {}
    for spec, node in zip(exported.graph_signature.input_specs, _placeholders(exported)):
        if spec.kind is InputKind.PARAMETER and spec.target is not None:
            value = exported.state_dict.get(spec.target)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                sources[node] = 1
    reaching = _reaching_outputs(exported, sources)
    return frozenset(position for position, mask in enumerate(reaching) if not mask)


def input_reached_outputs(exported: ExportedProgram) -> dict[str, frozenset[int]]:
    """For each floating or complex user input (by its placeholder's
    argument name) that some floating chain leads from to a user output,
    the positions of those outputs (counted as in
    :func:`parameter_free_outputs`): eager returns them with
    ``requires_grad`` when that input requires grad."""
    return _reached_from(exported, InputKind.USER_INPUT)


def constant_reached_outputs(exported: ExportedProgram) -> dict[str, frozenset[int]]:
    """:func:`input_reached_outputs` for the lifted constants (by target):
    a function's closed-over tensors, a closed-over model's parameters among
    them, whose results eager records a graph for while they require grad."""
    return _reached_from(exported, InputKind.CONSTANT_TENSOR)


def _reached_from(exported: ExportedProgram, kind: InputKind) -> dict[str, frozenset[int]]:
    names: list[str] = []
    sources: dict[torch.fx.Node, int] = {}
    for spec, node in zip(exported.graph_signature.input_specs, _placeholders(exported)):
        if spec.kind is kind and _carries_gradient(node.meta.get("val")):
            sources[node] = 1 << len(names)
            names.append(spec.arg.name if kind is InputKind.USER_INPUT else str(spec.target))
    reaching = _reaching_outputs(exported, sources)
    reached = {
        name: frozenset(position for position, mask in enumerate(reaching) if mask >> bit & 1)
        for bit, name in enumerate(names)
    }
    return {name: positions for name, positions in reached.items() if positions}


def _placeholders(exported: ExportedProgram) -> list[torch.fx.Node]:
    return [node for node in exported.graph_module.graph.nodes if node.op == "placeholder"]


def _reaching_outputs(exported: ExportedProgram, sources: dict[torch.fx.Node, int]) -> list[int]:
    """Per user output position (constants counted), the bits of the
    ``sources`` (placeholder -> bit) a floating chain leads from to it:
    a value carries its operands' bits when it can itself carry a
    gradient (an integer or bool value cuts the chain)."""
    graph = exported.graph_module.graph
    output_node = next(node for node in graph.nodes if node.op == "output")
    masks: dict[torch.fx.Node, int] = dict(sources)
    if sources:
        for node in graph.nodes:
            if node.op not in ("call_function", "call_method", "call_module"):
                continue
            mask = 0
            for leaf in pytree.tree_leaves((node.args, node.kwargs)):
                if isinstance(leaf, torch.fx.Node):
                    mask |= masks.get(leaf, 0)
            if mask and _carries_gradient(node.meta.get("val")):
                masks[node] = mask
    reaching: list[int] = []
    for spec, value in zip(exported.graph_signature.output_specs, output_node.args[0]):
        if spec.kind is not OutputKind.USER_OUTPUT:
            continue
        if isinstance(spec.arg, ConstantArgument):
            reaching.append(0)
        else:
            reaching.append(masks.get(value, 0) if isinstance(value, torch.fx.Node) else 0)
    return reaching
