"""Rewrites that make a StableHLO module from torch-mlir acceptable to XLA.

torch-mlir's StableHLO can hold two things XLA's StableHLO importer (through
a portable artifact) does not take:

- tensor ``arith.constant`` ops: XLA does not read the arith dialect;
- ``dense_resource`` attributes (torch-mlir's way to carry large literals,
  such as index tensors of ``as_strided`` or frozen weights): a portable
  artifact cannot carry the module's resource section.

Both rewrites are exact.  The runtime applies them to every module it
compiles, so IR from any producer (our importer, torch-mlir's own
``fx.export_and_import``, hand-written files) compiles."""

from __future__ import annotations

import re

from torch_mlir import ir, rewrite

from hloalias.mlir import walk_ops


def replace_arith_tensor_constant(op: ir.OpView, rewriter: rewrite.PatternRewriter) -> bool:
    """Pattern: ``arith.constant`` of tensor type -> ``stablehlo.constant``
    with the same value, built at the rewriter's insertion point."""
    if not isinstance(op.results[0].type, ir.RankedTensorType):
        return True
    with rewriter.ip:
        replacement = ir.Operation.create(
            "stablehlo.constant",
            results=[op.results[0].type],
            attributes={"value": op.attributes["value"]},
            loc=op.location,
        )
    rewriter.replace_op(op, replacement.results)
    return False


def legalize_tensor_constants(module: ir.Module | ir.Operation) -> int:
    """Rewrite every tensor ``arith.constant`` in ``module`` to
    ``stablehlo.constant`` in place; return how many were rewritten."""
    operation = module.operation
    count = sum(
        1
        for op in walk_ops(operation)
        if op.name == "arith.constant" and isinstance(op.results[0].type, ir.RankedTensorType)
    )
    if count:
        with operation.context:
            patterns = rewrite.RewritePatternSet()
            patterns.add("arith.constant", replace_arith_tensor_constant)
            rewrite.apply_patterns_and_fold_greedily(operation, patterns.freeze())
    return count


_RESOURCE_RE = re.compile(r"dense_resource<([^>]+)>")


def inline_dense_resources(text: str) -> tuple[str, int]:
    """Replace every ``dense_resource<name>`` in module ``text`` by
    ``dense<"0x...">`` holding the blob's bytes from the ``dialect_resources``
    section, which is dropped.  Returns the new text and the number of
    blobs inlined.  Raises ValueError naming a resource the section lacks."""
    body, marker, tail = text.partition("\n{-#")
    if not marker:
        return text, 0
    blobs: dict[str, str] = {}
    for line in tail.splitlines():
        name, sep, value = line.strip().partition(': "0x')
        if not sep:
            continue
        # The first 4 bytes (8 hex digits) of a blob are its alignment.
        blobs[name] = value.rstrip('",')[8:]
    pieces = _RESOURCE_RE.split(body)
    for index in range(1, len(pieces), 2):
        name = pieces[index]
        if name not in blobs:
            raise ValueError(f"dense_resource<{name}> has no blob in the module's resource section")
        pieces[index] = f'dense<"0x{blobs[name]}">'
    return "".join(pieces) + "\n", len(blobs)
