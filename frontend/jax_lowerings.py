"""JAX's lowering rules spliced into an imported program, for ops torch-mlir
cannot lower (linalg, fft): the StableHLO JAX emits for a ``jax.numpy`` /
``jax.lax.linalg`` function (LAPACK custom calls on CPU, ``stablehlo.fft``)
becomes a private function of the module, called where the op was.

A *rule* is a named Python function ``rule(params) -> f``, where ``f`` is
a JAX function of arrays returning a tuple of arrays, and ``params`` a
JSON-able dict of the op's static arguments (dims, flags).  The journey of
one call, in three steps, each a function here:

1. :func:`call` (used by decompositions on the exported graph): the aten op
   becomes the custom op ``hloalias::jax_lowering_<n>_<m>`` (``n`` tensors
   in, ``m`` out) with the rule's name and its params as string arguments;
   its fake kernel takes shapes and dtypes from ``jax.eval_shape`` of the
   rule, its CPU kernel runs the rule with JAX (constant folding, eager
   use).  torch-mlir's FX importer imports it as a ``torch.operator``.
2. :func:`mark_calls` (after the FX import, before torch-mlir's pipelines):
   each such ``torch.operator`` becomes a ``stablehlo.custom_call`` to
   :data:`TARGET` carrying the rule and params (``hloalias.jax_rule``,
   ``hloalias.jax_params``), between ``torch_c`` conversions, which the
   backend contract and the StableHLO pipeline let through untouched.
3. :func:`splice` (after the StableHLO pipeline): each such custom call is
   lowered by JAX for its operand types (``jax.jit(f).lower(...)``, 64-bit
   types enabled so that dtypes are torch's), the module crosses into
   torch-mlir's context as text (:func:`hloalias.foreign_ir.through_jaxlib`:
   ``chlo`` expanded, Shardy annotations dropped), its functions are renamed
   apart and added as private functions, the custom call becomes a
   ``func.call``, and the calls are inlined: ``@main`` stays the module's one
   function, as the passes downstream expect.

The LAPACK custom calls JAX emits on CPU (``lapack_*_ffi``) are resolved by
jaxlib's CPU client, which registers them when jax is imported (the
runtime runs through it).  A rule's result may be NaN where eager raises
(a singular matrix to ``inv``, a non positive-definite one to
``cholesky``): XLA programs cannot raise; the ``info`` outputs of the
``*_ex`` ops say what LAPACK said.

jax is imported when a rule is first used, not with this module."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_mlir import ir, passmanager

from hloalias.errors import TorchImportError
from hloalias.foreign_ir import load_chlo, through_jaxlib
from hloalias.mlir import walk_ops

#: The custom call target that stands for a rule between steps 2 and 3.
TARGET = "hloalias.jax_lowering"
RULE_ATTR = "hloalias.jax_rule"
PARAMS_ATTR = "hloalias.jax_params"
_OPERATOR_PREFIX = "torch.hloalias.jax_lowering_"

Rule = Callable[[dict[str, Any]], Callable[..., Any]]
_RULES: dict[str, Rule] = {}

_TORCH_TO_NUMPY = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
}
_NUMPY_TO_TORCH = {name: dtype for dtype, name in _TORCH_TO_NUMPY.items()}
_MLIR_TO_NUMPY = {
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "complex<f32>": "complex64",
    "complex<f64>": "complex128",
    "i8": "int8",
    "ui8": "uint8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "i1": "bool",
}


def rule(name: str) -> Callable[[Rule], Rule]:
    """Register ``rule(params) -> f`` under ``name``."""

    def register(function: Rule) -> Rule:
        _RULES[name] = function
        return function

    return register


def _jax_function(name: str, params_json: str) -> Callable[..., tuple[Any, ...]]:
    function = _RULES[name](json.loads(params_json))

    def as_tuple(*arrays: Any) -> tuple[Any, ...]:
        result = function(*arrays)
        return tuple(result) if isinstance(result, (tuple, list)) else (result,)

    return as_tuple


def _avals(shapes_and_dtypes: Sequence[tuple[Sequence[int], str]]) -> list[Any]:
    import jax

    return [jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in shapes_and_dtypes]


def _x64() -> Any:
    import jax

    return jax.enable_x64(True)


def result_types(name: str, params_json: str, operands: Sequence[tuple[Sequence[int], str]]) -> list[tuple[tuple[int, ...], str]]:
    """``(shape, numpy dtype name)`` of each result of rule ``name``."""
    import jax

    with _x64():
        results = jax.eval_shape(_jax_function(name, params_json), *_avals(operands))
    return [(tuple(int(d) for d in r.shape), str(r.dtype)) for r in results]


def _operand_of(tensor: torch.Tensor) -> tuple[tuple[int, ...], str]:
    if tensor.dtype not in _TORCH_TO_NUMPY:
        raise TorchImportError(f"hloalias's JAX lowerings take no {tensor.dtype} tensors")
    return tuple(int(d) for d in tensor.shape), _TORCH_TO_NUMPY[tensor.dtype]


_LIBRARY = torch.library.Library("hloalias", "FRAGMENT")  # type: ignore[no-untyped-call]


@functools.cache
def _custom_op(inputs: int, outputs: int) -> Any:
    """``hloalias::jax_lowering_<inputs>_<outputs>``, defined once."""
    name = f"jax_lowering_{inputs}_{outputs}"
    tensors = ", ".join(f"Tensor x{i}" for i in range(inputs))
    returns = "Tensor" if outputs == 1 else "(" + ", ".join(["Tensor"] * outputs) + ")"
    _LIBRARY.define(f"{name}({tensors}, str rule, str params) -> {returns}")  # type: ignore[no-untyped-call]

    def fake(*args: Any) -> Any:
        *tensors_in, rule_name, params_json = args
        results = result_types(rule_name, params_json, [_operand_of(t) for t in tensors_in])
        out = [tensors_in[0].new_empty(shape, dtype=_NUMPY_TO_TORCH[dtype]) for shape, dtype in results]
        return out[0] if outputs == 1 else tuple(out)

    def cpu(*args: Any) -> Any:
        import jax
        import numpy as np

        *tensors_in, rule_name, params_json = args
        with _x64():
            results = jax.jit(_jax_function(rule_name, params_json))(*[t.detach().numpy() for t in tensors_in])
        out = [torch.from_numpy(np.array(r)) for r in results]
        return out[0] if outputs == 1 else tuple(out)

    torch.library.register_fake(f"hloalias::{name}", fake, lib=_LIBRARY)
    _LIBRARY.impl(name, cpu, "CPU")  # type: ignore[no-untyped-call]
    return getattr(torch.ops.hloalias, name).default


def call(name: str, params: dict[str, Any], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Rule ``name`` with ``params`` applied to ``tensors``, as one custom op
    (inside a decomposition: a node of the exported graph)."""
    params_json = json.dumps(params, sort_keys=True)
    outputs = len(result_types(name, params_json, [_operand_of(t) for t in tensors]))
    result = _custom_op(len(tensors), outputs)(*tensors, name, params_json)
    return (result,) if outputs == 1 else tuple(result)


# --- step 2: torch.operator -> stablehlo.custom_call ----------------------------------------

_VTENSOR_RE = re.compile(r"!torch\.vtensor<\[([^\]]*)\],(.+)>")


def _builtin_type(torch_type: ir.Type) -> ir.Type:
    match = _VTENSOR_RE.fullmatch(str(torch_type))
    if match is None:
        raise TorchImportError(f"a JAX lowering takes and returns tensors of static shape, not {torch_type}")
    dims = [int(d) for d in match.group(1).split(",") if d.strip()]
    # torch's signed integers are StableHLO's signless ones (as torch_c's
    # own conversion has them); ui8 stays unsigned.
    element = re.sub(r"^si(\d+)$", r"i\1", match.group(2))
    return ir.RankedTensorType.get(dims, ir.Type.parse(element))


def _string_constant(value: ir.Value) -> str:
    owner = value.owner
    if not isinstance(owner, ir.OpView) and not isinstance(owner, ir.Operation):
        raise TorchImportError("a JAX lowering's rule name is no constant")
    return str(ir.StringAttr(owner.attributes["value"]).value)


def mark_calls(module: ir.Module) -> bool:
    """Step 2 (see the module docstring); True when any call was marked."""
    operators = [
        op
        for op in walk_ops(module.operation)
        if op.name == "torch.operator" and str(ir.StringAttr(op.attributes["name"]).value).startswith(_OPERATOR_PREFIX)
    ]
    if not operators:
        return False
    load_chlo(module.context)  # loads torch_c too
    with module.context:
        for op in operators:
            with ir.Location.unknown() if op.location is None else op.location:
                *tensors, rule_value, params_value = list(op.operands)
                point = ir.InsertionPoint(op)
                builtins = [
                    ir.Operation.create(
                        "torch_c.to_builtin_tensor", results=[_builtin_type(t.type)], operands=[t], ip=point
                    ).result
                    for t in tensors
                ]
                custom = ir.Operation.create(
                    "stablehlo.custom_call",
                    results=[_builtin_type(r.type) for r in op.results],
                    operands=builtins,
                    attributes={
                        "call_target_name": ir.StringAttr.get(TARGET),
                        RULE_ATTR: ir.StringAttr.get(_string_constant(rule_value)),
                        PARAMS_ATTR: ir.StringAttr.get(_string_constant(params_value)),
                    },
                    ip=point,
                )
                for result, value in zip(op.results, custom.results):
                    back = ir.Operation.create(
                        "torch_c.from_builtin_tensor", results=[result.type], operands=[value], ip=point
                    )
                    result.replace_all_uses_with(back.result)
                op.erase()
    return True


# --- step 3: custom call -> JAX's StableHLO -------------------------------------------------

_FUNC_NAME_RE = re.compile(r"func\.func\s+(?:public\s+|private\s+)?@([\w$.-]+)")


def _element_dtype(tensor_type: ir.Type) -> tuple[tuple[int, ...], str]:
    ranked = ir.RankedTensorType(tensor_type)
    element = str(ranked.element_type)
    if element not in _MLIR_TO_NUMPY:
        raise TorchImportError(f"a JAX lowering takes no {element} tensors")
    return tuple(int(d) for d in ranked.shape), _MLIR_TO_NUMPY[element]


def _lowered_text(name: str, params_json: str, operands: Sequence[tuple[Sequence[int], str]]) -> str:
    import jax

    with _x64():
        lowered = jax.jit(_jax_function(name, params_json), keep_unused=True).lower(*_avals(operands))
    return str(lowered.as_text())


def splice(module: ir.Module) -> None:
    """Step 3 (see the module docstring)."""
    calls = [
        op
        for op in walk_ops(module.operation)
        if op.name == "stablehlo.custom_call"
        and str(ir.StringAttr(op.attributes["call_target_name"]).value) == TARGET
    ]
    if not calls:
        return
    with module.context:
        for number, op in enumerate(calls):
            name = str(ir.StringAttr(op.attributes[RULE_ATTR]).value)
            params_json = str(ir.StringAttr(op.attributes[PARAMS_ATTR]).value)
            try:
                text = _lowered_text(name, params_json, [_element_dtype(v.type) for v in op.operands])
            except Exception as error:  # jax raises many types here
                raise TorchImportError(f"JAX's lowering of {name} ({params_json}) failed: {error}") from error
            text = through_jaxlib(text, legalize_chlo=True, strip_sdy=True, source_name=f"jax:{name}")
            prefix = f"hloalias_jax{number}_"
            for defined in set(_FUNC_NAME_RE.findall(text)):
                text = re.sub(rf"@{re.escape(defined)}\b", f"@{prefix}{defined}", text)
            lowered = ir.Module.parse(text)
            for function in list(lowered.body.operations):
                function.operation.attributes["sym_visibility"] = ir.StringAttr.get("private")
                module.body.append(function.operation)
            with op.location:
                call_op = ir.Operation.create(
                    "func.call",
                    results=[r.type for r in op.results],
                    operands=list(op.operands),
                    attributes={"callee": ir.FlatSymbolRefAttr.get(f"{prefix}main")},
                    ip=ir.InsertionPoint(op),
                )
            for result, value in zip(op.results, call_op.results):
                result.replace_all_uses_with(value)
            op.erase()
        try:
            passmanager.PassManager.parse("builtin.module(inline{default-pipeline=''}, symbol-dce)").run(module.operation)
        except ir.MLIRError as error:
            raise TorchImportError(f"splicing JAX's lowerings failed: {error}") from None


__all__ = ["PARAMS_ATTR", "RULE_ATTR", "TARGET", "call", "mark_calls", "result_types", "rule", "splice"]
