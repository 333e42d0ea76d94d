"""MLIR that torch-mlir's context cannot read as it is: ``chlo`` ops,
Shardy (``sdy``) ops and attributes, and MLIR bytecode from jaxlib.

torch-mlir's Python context registers ``stablehlo`` but not ``chlo``
(torch-mlir's C++ has the dialect; it loads when a pass that emits it
runs) and has no ``sdy`` at all.  jaxlib's MLIR has both.  Each function
here brings such input into a torch-mlir context:

- :func:`load_chlo`: make ``chlo`` ops parseable in a torch-mlir context
  (they stay ``chlo`` ops); :func:`context_for` a context for a text;
- :func:`through_jaxlib`: parse text or bytecode with jaxlib's MLIR,
  optionally expand ``chlo`` ops into StableHLO
  (``chlo-legalize-to-stablehlo``: XLA's portable artifact has no
  ``chlo``) and drop Shardy's single-device annotations, and return text
  that torch-mlir reads (generic op form where ``sdy`` ops remain, which a
  context allowing unregistered dialects then holds as opaque ops).

jax is imported only when a function here is called."""

from __future__ import annotations

from typing import Any

from torch_mlir import ir, passmanager

from hloalias.errors import IRError
from hloalias.mlir import format_diagnostics, new_context

#: MLIR bytecode starts with these bytes ("ML\xefR").
BYTECODE_MAGIC = b"ML\xefR"

_CHLO_LOADED = "hloalias.chlo_loaded"


def load_chlo(context: ir.Context) -> None:
    """Load torch-mlir's ``chlo`` dialect into ``context`` (idempotent):
    a pass that emits ``chlo`` ops, run on an empty module, loads it as
    a dependent dialect."""
    with context, ir.Location.unknown():
        empty = ir.Module.create()
        passmanager.PassManager.parse("builtin.module(func.func(convert-torch-to-stablehlo))").run(empty.operation)


def context_for(text: str) -> ir.Context:
    """A new torch-mlir context (:func:`hloalias.mlir.new_context`) that
    parses ``text``: with ``chlo`` loaded when ``text`` names it."""
    context = new_context()
    if "chlo." in text:
        load_chlo(context)
    return context


def jaxlib_has_sdy() -> bool:
    """Whether jaxlib's MLIR has the Shardy dialect (jax is importable)."""
    try:
        from jaxlib.mlir.dialects import sdy  # noqa: F401
    except ImportError:
        return False
    return True


def _jaxlib_context() -> Any:
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir._mlir_libs import _stablehlo as jaxlib_stablehlo

    jaxlib_stablehlo.register_stablehlo_passes()
    context = jax_mlir.make_ir_context()
    context.allow_unregistered_dialects = True
    return context


def through_jaxlib(
    data: str | bytes, *, legalize_chlo: bool, strip_sdy: bool, source_name: str = "-", line_offset: int = 0
) -> str:
    """``data`` (MLIR text or bytecode) parsed with jaxlib's MLIR and
    printed back as text (with locations).  ``legalize_chlo`` expands
    ``chlo`` ops into StableHLO; ``strip_sdy`` removes ``sdy.mesh`` symbols
    and ``sdy.*`` argument/result/op attributes (placement only) and raises
    :class:`IRError` for a Shardy op that computes (``sdy.manual_computation``
    and the like), which a single device cannot run.  IRError when jaxlib
    cannot parse ``data`` either."""
    from jaxlib.mlir import ir as jir
    from jaxlib.mlir import passmanager as jpm

    context = _jaxlib_context()
    with context, jir.Location.unknown():
        try:
            module = jir.Module.parse(data)
        except jir.MLIRError as error:
            if isinstance(data, str):  # the diagnostics carry the text's positions
                raise IRError(format_diagnostics(error, source_name, line_offset)) from None
            details = "; ".join(str(d.message) for d in error.error_diagnostics) or str(error)
            raise IRError(f"{source_name}: error: cannot parse the module: {details}") from None
        if strip_sdy:
            _strip_sdy(module, source_name)
        if legalize_chlo:
            try:
                jpm.PassManager.parse("builtin.module(func.func(chlo-legalize-to-stablehlo))").run(module.operation)
            except jir.MLIRError as error:
                raise IRError(f"{source_name}: error: chlo-legalize-to-stablehlo failed: {error}") from None
        generic = not strip_sdy and "sdy." in str(module)
        return str(module.operation.get_asm(enable_debug_info=True, print_generic_op_form=generic))


def _strip_sdy(module: Any, source_name: str) -> None:
    """Drop Shardy's placement from ``module`` (jaxlib's MLIR) in place."""
    from jaxlib.mlir import ir as jir

    def names(attributes: Any) -> list[str]:
        return [a if isinstance(a, str) else a.name for a in attributes]

    def clean(attributes: Any) -> Any:
        kept = {name: attributes[name] for name in names(attributes) if not name.startswith("sdy.")}
        return jir.DictAttr.get(kept)

    for op in list(module.body.operations):
        if op.operation.name == "sdy.mesh":
            op.operation.erase()
    for name in [n for n in names(module.operation.attributes) if n.startswith("sdy.")]:
        del module.operation.attributes[name]

    def walk(operation: Any) -> None:
        if operation.name.startswith("sdy."):
            if operation.name == "sdy.sharding_constraint" and len(operation.operands) == 1:
                operation.results[0].replace_all_uses_with(operation.operands[0])
                operation.erase()
                return
            raise IRError(
                f"{source_name}: error: Shardy op '{operation.name}' computes across devices; "
                "compile_stablehlo runs single-device programs: lower without shardings"
            )
        for attribute in [n for n in names(operation.attributes) if n.startswith("sdy.")]:
            del operation.attributes[attribute]
        for key in ("arg_attrs", "res_attrs"):
            if key in operation.attributes:
                dicts = jir.ArrayAttr(operation.attributes[key])
                operation.attributes[key] = jir.ArrayAttr.get([clean(jir.DictAttr(d)) for d in dicts])
        for region in operation.regions:
            for block in region.blocks:
                for child in list(block.operations):
                    walk(child.operation)

    for op in list(module.body.operations):
        walk(op.operation)


__all__ = ["BYTECODE_MAGIC", "context_for", "jaxlib_has_sdy", "load_chlo", "through_jaxlib"]
