"""StableHLO that hloalias did not import, run as an :class:`Executable`
with torch tensors in and out: :func:`compile_stablehlo`.

Accepted: MLIR text, MLIR bytecode (``bytes``), an MLIR module object of
any binding (jaxlib's, torch-mlir's: ``torch_mlir.fx.export_and_import``),
an object with ``as_text()`` (``jax.jit(f).lower(...)``), or a
:class:`~hloalias.frontend.Program` from ``import_torch``.

Text, bytecode and modules are read with jaxlib's MLIR
(:func:`hloalias.foreign_ir.through_jaxlib`), Shardy's single-device
placement is dropped, and the module is parsed into a torch-mlir context
with ``chlo`` loaded: ``chlo`` ops (``chlo.erf``) stay, and XLA reads that
module as text (a portable artifact cannot hold ``chlo``), so it computes
them as it does for JAX: the same bits.  Then the module is annotated with the
IR contract as a function of user inputs only: argument ``i`` is user
input ``arg<i>`` (or ``names[i]``), result ``i`` is user output ``i``, a
new tensor (JAX's value semantics: no result is a view of an input unless
``views=True`` lets ``eliminate-view-results`` rebuild results equal to a
view of an input as torch views).  An existing ``tf.aliasing_output`` or
``jax.buffer_donor`` marks its argument as an explicit donor, which
``alias-donated-buffers`` pairs again by its own rule; ``donate=`` adds
inputs by position or name.  A ``Program`` keeps its own signature and
state.  Then the pass pipeline (default: as ``hloalias.compile``) and XLA
run as for ``hloalias.compile``; results come back as torch tensors."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import torch.utils._pytree as pytree
from torch_mlir import ir

from hloalias import attributes as A, observe
from hloalias.contract import verify
from hloalias.errors import IRError
from hloalias.foreign_ir import context_for, through_jaxlib
from hloalias.frontend.importer import ArgumentInfo, Program, ProgramSignature, ResultInfo, Stage
from hloalias.mlir import (
    arg_attr_dicts,
    find_main,
    new_context,
    parse_module,
    print_module,
    result_attr_dicts,
    set_arg_attr_dicts,
    set_result_attr_dicts,
)
from hloalias.observe import traced_compile
from hloalias.passes.alias_donated_buffers import AliasDonatedBuffers, AliasReport
from hloalias.passes.eliminate_view_results import EliminateViewResults, ViewReport
from hloalias.pipeline import module_cache_key, parse_pipeline
from hloalias.runtime.executable import (
    Executable,
    _donation_requests,
    _mark_donors,
    _pipeline_for,
    _resolve_donations,
)
from hloalias.runtime.pjrt import compile_module, device_for
from hloalias.runtime.state import _StateGroup
from hloalias.runtime.stages import pass_lines, run_passes


@traced_compile
def compile_stablehlo(
    source: Any,
    *,
    donate: Sequence[int | str] = (),
    device: Any = None,
    pipeline: str | None = None,
    names: Sequence[str] | None = None,
    views: bool = False,
    dump_dir: str | os.PathLike[str] | None = None,
) -> Executable:
    """Compile StableHLO ``source`` (see the module docstring for what is
    accepted) and return an :class:`Executable` called with torch tensors,
    one per ``@main`` argument, positionally.

    ``donate``: inputs to donate, by position or name; ``device``: as for
    ``hloalias.compile``; ``pipeline``: a textual pipeline (default: the
    one ``hloalias.compile`` runs); ``names``: the inputs' names (default
    ``arg0``, ``arg1``, ...); ``views``: let results equal to a view of an
    input come back as torch views of it.  Raises :class:`IRError` for
    input that is not a module with a ``@main``, :class:`DonationError`,
    :class:`PipelineError`, :class:`CompileError` as ``compile`` does."""
    requests = _donation_requests(donate, (), (), ())
    target = device_for(device)
    program = _program_of(source, names, views)
    _mark_donors(program, _resolve_donations(program, requests))
    group = _StateGroup()
    pipeline_text = _pipeline_for(pipeline, program, group, target, False)
    module = program.torch_mlir_module
    observe.dump("stablehlo", lambda: print_module(module))
    runs = run_passes(module, pipeline_text)
    with module.context:
        verify(find_main(module))
    final_text = print_module(module)
    observe.dump("final", final_text)
    with observe.stage("XLA compile"):
        loaded = compile_module(final_text, target)
    ran = {element.name for element in parse_pipeline(pipeline_text)}
    exe = Executable(
        program, loaded, target, module_cache_key(final_text), final_text,
        ViewReport.from_module(module) if EliminateViewResults.name in ran else None,
        AliasReport.from_module(module) if AliasDonatedBuffers.name in ran else None,
        cache_hit=False,
        state_group=group,
    )
    exe._pass_lines = pass_lines(runs)
    return exe


def _program_of(source: Any, names: Sequence[str] | None, views: bool) -> Program:
    """``source`` as a StableHLO :class:`Program` of its own (the caller's
    object is not changed)."""
    if isinstance(source, Program):
        if source.stage is not Stage.STABLEHLO:
            raise IRError(f"compile_stablehlo: the Program is at stage {source.stage.value}; import it to StableHLO")
        return source.clone()
    data, source_name = _module_data(source)
    text = through_jaxlib(data, legalize_chlo=False, strip_sdy=True, source_name=source_name)
    module = parse_module(text, context_for(text), source_name)
    signature = _annotate_foreign(module, names, views)
    return Program(module, Stage.STABLEHLO, signature, {})


def _module_data(source: Any) -> tuple[str | bytes, str]:
    """MLIR text or bytecode of ``source`` and a name for diagnostics."""
    if isinstance(source, (str, bytes)):
        return source, "<stablehlo>"
    if isinstance(source, (bytearray, memoryview)):
        return bytes(source), "<stablehlo>"
    as_text = getattr(source, "as_text", None)
    if callable(as_text):  # jax's Lowered / Compiled-to-be
        return str(as_text()), f"<{type(source).__name__}>"
    operation = getattr(source, "operation", None)
    if operation is not None and hasattr(operation, "get_asm"):
        return str(operation.get_asm(enable_debug_info=True)), f"<{type(source).__name__}>"
    raise IRError(
        f"compile_stablehlo: cannot read a module from {type(source).__name__}; pass MLIR text, bytecode, "
        "an MLIR module, a jax Lowered (jax.jit(f).lower(...)) or an hloalias Program"
    )


def _annotate_foreign(module: ir.Module, names: Sequence[str] | None, views: bool) -> ProgramSignature:
    """Write the IR contract on ``@main`` of a foreign module: every
    argument a user input, every result a user output; existing
    ``tf.aliasing_output`` becomes ``jax.buffer_donor`` (an explicit donor
    the alias pass pairs again)."""
    with module.context:
        main = find_main(module)
        arg_dicts = arg_attr_dicts(main)
        result_dicts = result_attr_dicts(main)
        if names is not None and (isinstance(names, str) or len(names) != len(arg_dicts)):
            raise IRError(f"compile_stablehlo: names has {len(names)} entries, @main has {len(arg_dicts)} arguments")
        arg_names = [str(n) for n in names] if names is not None else [f"arg{i}" for i in range(len(arg_dicts))]
        if len(set(arg_names)) != len(arg_names):
            raise IRError(f"compile_stablehlo: names repeat: {arg_names}")
        new_args = []
        for index, attrs in enumerate(arg_dicts):
            donated = A.ALIASING_OUTPUT in attrs or A.BUFFER_DONOR in attrs
            kept = {k: v for k, v in attrs.items() if k not in (A.ALIASING_OUTPUT, A.BUFFER_DONOR, A.SHARDING)
                    and not k.startswith("hloalias.")}
            kept[A.ARG_KIND] = ir.StringAttr.get("user_input")
            kept[A.ARG_NAME] = ir.StringAttr.get(arg_names[index])
            if donated:
                kept[A.BUFFER_DONOR] = ir.BoolAttr.get(True)
            new_args.append(kept)
        new_results = []
        for index, attrs in enumerate(result_dicts):
            kept = {k: v for k, v in attrs.items() if k != A.SHARDING and not k.startswith("hloalias.")}
            kept[A.RESULT_ROLE] = ir.StringAttr.get(A.ROLE_USER_OUTPUT)
            kept[A.RESULT_OUTPUT] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), index)
            if not views:
                kept[A.RESULT_STORAGE] = ir.StringAttr.get(f"new:{index}")
            new_results.append(kept)
        set_arg_attr_dicts(main, new_args)
        set_result_attr_dicts(main, new_results)
    arguments = tuple(ArgumentInfo(i, "user_input", name) for i, name in enumerate(arg_names))
    results = tuple(
        ResultInfo(i, A.ROLE_USER_OUTPUT, output=i, storage=None if views else f"new:{i}")
        for i in range(len(result_dicts))
    )
    in_spec = pytree.tree_structure((tuple(range(len(arguments))), {}))
    out_spec = pytree.tree_structure(0) if len(results) == 1 else pytree.tree_structure(tuple(range(len(results))))
    return ProgramSignature(arguments, results, in_spec, out_spec)


__all__ = ["compile_stablehlo"]
