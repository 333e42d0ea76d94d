"""The module XLA partitions with Shardy: ``mhlo.sharding`` on ``@main``'s
arguments and results rewritten as ``sdy.sharding`` over one ``sdy.mesh``,
just before PJRT compiles it.

hloalias's own IR keeps GSPMD's ``mhlo.sharding`` (torch-mlir's MLIR has no
Shardy dialect; the passes, ``alias-donated-buffers`` pairing only equal
shardings among them, read that attribute), so the rewrite happens on the
final text in jaxlib's MLIR, which has Shardy.  It is exact: each
``mhlo.sharding`` there was written by :func:`~hloalias.runtime.sharding.plan_shardings`
from a partition spec over the mesh, and becomes that spec again
(dimension ``d`` sharded over axes ``(a, b)``: ``{"a", "b"}``; not
sharded: ``{}``, closed).  A result without a sharding stays without one
(Shardy chooses, as GSPMD did).  A module with a sharding the placement
did not write (any other op carrying ``mhlo.sharding``) is left to GSPMD:
:func:`to_shardy` returns None."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hloalias.foreign_ir import _jaxlib_context, jaxlib_has_sdy

MESH_NAME = "mesh"
_GSPMD = "mhlo.sharding"
_SHARDY = "sdy.sharding"


def available() -> bool:
    """Whether jaxlib's MLIR has the Shardy dialect."""
    return jaxlib_has_sdy()


def sharding_text(spec: Sequence[Any]) -> str:
    """``#sdy.sharding`` of a normalized partition spec over :data:`MESH_NAME`."""
    dims = []
    for entry in spec:
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        dims.append("{" + ", ".join(f'"{axis}"' for axis in axes) + "}")
    return f"#sdy.sharding<@{MESH_NAME}, [{', '.join(dims)}]>"


def mesh_text(axes: Sequence[tuple[str, int]]) -> str:
    """The ``sdy.mesh`` op of a mesh with ``axes`` (name, size), in order."""
    listed = ", ".join(f'"{name}"={size}' for name, size in axes)
    return f"sdy.mesh @{MESH_NAME} = <[{listed}]>"


def to_shardy(
    text: str, axes: Sequence[tuple[str, int]], specs: Mapping[tuple[str, int], Sequence[Any]]
) -> str | None:
    """``text`` (a final module as XLA takes it) with every ``mhlo.sharding``
    of ``@main`` replaced by its ``sdy.sharding`` and the mesh added;
    ``specs`` maps each ``mhlo.sharding`` text the placement wrote
    (whitespace removed) and the rank of its tensor to its partition spec
    (``{replicated}`` is one text for every rank).  None when the module has a
    sharding ``specs`` does not know, or elsewhere than on ``@main``'s
    arguments and results (GSPMD then partitions it as written)."""
    from jaxlib.mlir import ir

    with _jaxlib_context() as context, ir.Location.unknown(context):
        module = ir.Module.parse(text)
        main = None
        for op in module.body.operations:
            name = op.attributes["sym_name"] if "sym_name" in op.attributes else None
            if name is not None and ir.StringAttr(name).value == "main":
                main = op
        if main is None:
            return None
        function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        for which, types in (("arg_attrs", function_type.inputs), ("res_attrs", function_type.results)):
            if which not in main.attributes:
                continue
            rewritten = []
            for entry, tensor_type in zip(ir.ArrayAttr(main.attributes[which]), types):
                attrs = ir.DictAttr(entry)
                fields = {attrs[i].name: attrs[i].attr for i in range(len(attrs))}
                if _GSPMD in fields:
                    key = "".join(ir.StringAttr(fields.pop(_GSPMD)).value.split())
                    rank = ir.ShapedType(tensor_type).rank
                    if (key, rank) not in specs:
                        return None
                    fields[_SHARDY] = ir.Attribute.parse(sharding_text(specs[key, rank]))
                rewritten.append(ir.DictAttr.get(fields))
            main.attributes[which] = ir.ArrayAttr.get(rewritten)
        printed = str(module)
        if _GSPMD in printed:  # on some op inside: not ours to translate
            return None
        mesh = ir.Module.parse(mesh_text(axes))
        mesh.body.operations[0].operation.move_before(module.body.operations[0].operation)
        return str(module)
