"""The crash guard of torch-mlir's lowering: when to run it in a child
process (:mod:`hloalias.isolation`), and what a crash there becomes.

A segfault or abort in torch-mlir's native code cannot be caught in the
process it happens in.  A child process per compile would catch every one,
but costs a process start per compile (docs/refusals.md has the figures),
which first-compile latency cannot afford by default.  So the lowering runs
in a child

- when ``HLOALIAS_ISOLATE_COMPILE`` is set (every compile), or
- when the graph holds a node on the known-risky list
  (:func:`risky_nodes`: inputs that crashed torch-mlir before; the
  rewrites of :func:`hloalias.frontend.decompositions.prepare_graph` take
  the known ones away, so a node still on the list is a form they missed),

and in process otherwise.  A crash in the child is a
:class:`~hloalias.CompileError` naming the risky nodes, else the program's
ops (the crash does not say which pattern crashed), with a repro file and
the ``torch-mlir-opt`` command that replays it.  A lowering that fails
without crashing is run again in process, which reports it as it always
does (it is known not to crash)."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Sequence

import torch
from torch_mlir import ir

from hloalias import config, isolation
from hloalias.errors import CompileError
from hloalias.mlir import parse_module, print_module
from hloalias.repro import write_repro

#: The stage :func:`lower_isolated` runs in the child ("module:function").
LOWERING_STAGE = "hloalias.isolation:lower_torch_mlir"


def _is_zero_dim_keepdim_reduction(node: torch.fx.Node) -> bool:
    """A reduction with ``keepdim=True`` of a 0-d tensor: torch-mlir's
    StableHLO lowering segfaulted on it (``logsumexp``, ``sum``, ...)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    names = [argument.name for argument in schema.arguments]
    if "keepdim" not in names:
        return False
    position = names.index("keepdim")
    keepdim = node.args[position] if position < len(node.args) else node.kwargs.get("keepdim", False)
    operand = node.args[0].meta.get("val")
    return keepdim is True and isinstance(operand, torch.Tensor) and operand.dim() == 0


#: Predicates of the nodes known to crash torch-mlir's lowering.
RISKY: tuple[Callable[[torch.fx.Node], bool], ...] = (_is_zero_dim_keepdim_reduction,)


def risky_nodes(graph: torch.fx.Graph) -> list[str]:
    """The ops of ``graph``'s nodes on the known-risky list."""
    found = []
    for node in graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            if any(predicate(node) for predicate in RISKY):
                found.append(str(node.target))
    return found


def should_isolate(risky: Sequence[str]) -> bool:
    return bool(risky) or config.flag("HLOALIAS_ISOLATE_COMPILE")


def program_ops(graph: torch.fx.Graph) -> list[str]:
    """The user's ops of ``graph`` (before torch's decompositions, as
    ``aten.name``), in program order, each once."""
    names: list[str] = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        op = node.meta.get("original_aten") or node.target
        name = str(getattr(op, "_overloadpacket", op))
        if name not in names:
            names.append(name)
    return names


def lower_isolated(
    module: ir.Module,
    pipelines: Sequence[str],
    ops: Sequence[str],
    risky: Sequence[str],
    locate: Callable[[str], str | None],
) -> ir.Module | None:
    """Run ``pipelines`` on ``module`` (imported from a graph of the
    user's ``ops``) in a child process: the lowered
    module (in ``module``'s context), or None when the lowering failed
    without a crash (the caller runs it in process to report the failure).
    Raises :class:`CompileError` when the child crashed."""
    text = print_module(module, debug_info=True)
    try:
        lowered = isolation.run_isolated(LOWERING_STAGE, json.dumps(list(pipelines)) + "\n" + text)
    except isolation.StageFailed:
        return None
    except isolation.StageCrashed as crash:
        path = write_repro(text, "import-crash")
        if risky:
            culprits = ", ".join(dict.fromkeys(risky))
            named = f"the op on the known-risky list: {culprits}"
        else:
            shown = []
            for name in ops[:12]:
                where = locate(name.removeprefix("aten."))
                shown.append(f"{name} (from {where})" if where else name)
            more = f", and {len(ops) - 12} more" if len(ops) > 12 else ""
            named = "one of the program's ops: " + ", ".join(shown) + more if shown else "no aten op"
        pipeline = ",".join(p.removeprefix("builtin.module(").removesuffix(")") for p in pipelines)
        raise CompileError(
            f"torch-mlir crashed ({crash.signal_name or 'no result'}) lowering the program, in a child "
            f"process (this process is unharmed); the crash points at {named}\n"
            f"repro written to {path}; replay with:\n"
            f"  torch-mlir-opt --pass-pipeline='builtin.module({pipeline})' {path}\n"
            f"child's stderr (tail):\n{crash.stderr_tail[-800:]}",
            repro_path=path,
        ) from None
    return parse_module(lowered, module.context)
