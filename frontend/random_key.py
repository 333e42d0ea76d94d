"""Random ops draw from a key that each call passes, not from XLA's own
generator.

torch-mlir lowers every random op torch decomposes to (``rand``, ``randn``
by Box-Muller, ``bernoulli``, ``dropout``, ``uniform_``, ``normal_``,
``exponential_``, ``randint``, ``multinomial`` ...) to ``stablehlo.rng``,
which XLA feeds from a generator of its own: seeded per process, not by
``torch.manual_seed``, so two processes seeded differently drew the same
masks and no run could be reproduced by seeding torch.

Contract of :func:`thread_rng_key` (after the StableHLO pipeline, on
``@main``): when the module has no ``stablehlo.rng`` it changes nothing
(the module is what it was).  Otherwise it appends one argument to
``@main``, :data:`KEY_TYPE` (``tensor<2xi64>``, the key's 128 bits), the
IR contract's ``hloalias.kind = "rng_key"`` (:mod:`hloalias.attributes`),
and replaces each ``stablehlo.rng`` by ``stablehlo.rng_bit_generator``
(``THREE_FRY``, the same algorithm on every backend) whose state starts at
the key and is threaded from one draw to the next in program order, so the
draws of one call are independent of each other.  The bits become:

- ``UNIFORM`` on a float type (f16, bf16, f32, f64): the float's ``k``
  mantissa bits ``m`` as the midpoint ``(2m + 1) / 2**(k+1)`` of the
  ``2**k`` grid in (0, 1) (never 0: see :func:`_unit_uniform`), scaled to
  ``[a, b)`` and clamped below at ``a`` (as JAX's ``random.uniform``);
- ``NORMAL`` on a float type: Box-Muller on two such uniforms, ``a + b * z``.

Any other ``stablehlo.rng`` (integer elements, or one inside a nested
region or another function) is a :class:`TorchImportError` naming it:
torch-mlir emits none, and leaving it on XLA's generator would silently
break the seeding this module promises.

The runtime passes a fresh key on every call, drawn from torch's default
generator (``runtime/executable.py``): ``torch.manual_seed(s)`` makes
compiled runs reproducible, different seeds draw differently, successive
calls draw differently.  The draws are not eager's bits (nor are
``torch.compile``'s).

Contract of :func:`read_first_row_key` (a mesh spanning several processes,
``runtime/sharding.py``): each process draws its key from its own generator,
and processes may be seeded differently, but XLA takes a replicated argument
to be the same in every process; so the key argument becomes
:func:`rows_type` (``tensor<Nx2xi64>``, one row per device of the mesh, each
process's devices holding its own key) and ``@main`` reads row 0 (the key of
the process driving the mesh's first device) by a ``stablehlo.slice`` and
``stablehlo.reshape`` in front of the first draw: XLA's partitioner moves
that row to every device inside the program, with no host round trip, and
every process draws the same bits."""

from __future__ import annotations

import math

from torch_mlir import ir

from hloalias.contract import RNG_KEY_KIND, RNG_KEY_TYPE
from hloalias.errors import TorchImportError
from hloalias.mlir import find_main, walk_ops

#: ``hloalias.kind`` of the key argument, and its name (``hloalias.name``).
KEY_KIND = RNG_KEY_KIND
KEY_NAME = "rng_key"
#: The key argument's type: two int64 words (torch has no uint64 draws).
KEY_TYPE = RNG_KEY_TYPE
_STATE_TYPE = "tensor<2xui64>"

# Float element type -> (width, mantissa bits, bits of 1.0).
_FLOATS = {
    "f16": (16, 10, 0x3C00),
    "bf16": (16, 7, 0x3F80),
    "f32": (32, 23, 0x3F800000),
    "f64": (64, 52, 0x3FF0000000000000),
}


def rows_type(devices: int) -> str:
    """The key argument's type on a mesh of ``devices`` devices spanning
    processes: one key (two int64 words) per device."""
    return f"tensor<{devices}x2xi64>"


def read_first_row_key(module: ir.Module, devices: int) -> None:
    """Make ``@main``'s key argument (the last, ``hloalias.kind = "rng_key"``,
    :data:`KEY_TYPE`) :func:`rows_type` of ``devices`` rows and read its row 0
    wherever the key was read (see the module docstring).  The caller writes
    the argument's sharding (one row per device)."""
    with module.context, ir.Location.unknown():
        main = find_main(module)
        block = main.regions[0].blocks[0]
        key = block.arguments[len(block.arguments) - 1]
        if str(key.type) != KEY_TYPE:
            raise TorchImportError(f"@main's last argument has type {key.type}, expected the key's {KEY_TYPE}")
        rows = ir.Type.parse(rows_type(devices))
        key.set_type(rows)
        function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        main.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([*list(function_type.inputs)[:-1], rows], list(function_type.results))
        )
        uses = [(use.owner, use.operand_number) for use in key.uses]
        with ir.InsertionPoint.at_block_begin(block):
            row = _create("stablehlo.slice", ir.Type.parse("tensor<1x2xi64>"), [key], {
                "start_indices": ir.DenseI64ArrayAttr.get([0, 0]),
                "limit_indices": ir.DenseI64ArrayAttr.get([1, 2]),
                "strides": ir.DenseI64ArrayAttr.get([1, 1]),
            })
            first = _create("stablehlo.reshape", ir.Type.parse(KEY_TYPE), [row])
        for owner, number in uses:
            owner.operands[number] = first


def has_random_ops(module: ir.Module) -> bool:
    """Whether ``module`` holds a ``stablehlo.rng``."""
    return any(op.name == "stablehlo.rng" for op in walk_ops(module.operation))


def thread_rng_key(module: ir.Module) -> bool:
    """Rewrite ``module``'s random ops to draw from a key argument appended
    to ``@main`` (see the module docstring); True when it did (the caller
    records the argument in the signature), False when there were none."""
    rngs = [op for op in walk_ops(module.operation) if op.name == "stablehlo.rng"]
    if not rngs:
        return False
    with module.context, ir.Location.unknown():
        main = find_main(module)
        block = main.regions[0].blocks[0]
        for op in rngs:
            parent = op.parent
            if parent is None or parent.name != "func.func" or parent != main.operation:
                raise TorchImportError(
                    f"a random op ({_describe(op)}) is inside a nested region or another function than "
                    "@main: hloalias draws random numbers from a key each call passes, threaded through "
                    "@main's top-level ops only"
                )
            _check_supported(op)
        key = block.add_argument(ir.Type.parse(KEY_TYPE), ir.Location.unknown())
        function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        main.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([*function_type.inputs, key.type], list(function_type.results))
        )
        if "arg_attrs" in main.attributes:
            entries = list(ir.ArrayAttr(main.attributes["arg_attrs"]))
            main.attributes["arg_attrs"] = ir.ArrayAttr.get([*entries, ir.DictAttr.get({})])
        with ir.InsertionPoint(rngs[0]):
            state = _create("stablehlo.bitcast_convert", ir.Type.parse(_STATE_TYPE), [key])
        for op in rngs:
            with ir.InsertionPoint(op):
                value, state = _replacement(op, state)
            op.results[0].replace_all_uses_with(value)
            op.erase()
    return True


def _describe(op: ir.Operation) -> str:
    return f"stablehlo.rng -> {op.results[0].type}"


def _distribution(op: ir.Operation) -> str:
    text = str(op.attributes["rng_distribution"])  # #stablehlo<rng_distribution UNIFORM>
    return text.rsplit(" ", 1)[-1].rstrip(">")


def _check_supported(op: ir.Operation) -> None:
    result = ir.RankedTensorType(op.results[0].type)
    element = str(result.element_type)
    distribution = _distribution(op)
    if element not in _FLOATS or distribution not in ("UNIFORM", "NORMAL") or not result.has_static_shape:
        raise TorchImportError(
            f"a random op draws {distribution} values of type {result} ({_describe(op)}); hloalias draws "
            f"from a key each call passes for static float tensors ({', '.join(_FLOATS)}) only"
        )


def _create(name: str, result: ir.Type, operands: list[ir.Value],
            attributes: dict[str, ir.Attribute] | None = None) -> ir.Value:
    return ir.Operation.create(name, results=[result], operands=operands, attributes=attributes or {}).results[0]


def _splat(tensor_type: ir.RankedTensorType, value: int | float) -> ir.Value:
    element = tensor_type.element_type
    scalar = ir.FloatAttr.get(element, float(value)) if isinstance(value, float) else ir.IntegerAttr.get(element, value)
    return _create("stablehlo.constant", tensor_type, [], {"value": ir.DenseElementsAttr.get_splat(tensor_type, scalar)})


def _broadcast(scalar: ir.Value, tensor_type: ir.RankedTensorType) -> ir.Value:
    return _create("stablehlo.broadcast_in_dim", tensor_type, [scalar],
                   {"broadcast_dimensions": ir.DenseI64ArrayAttr.get([])})


def _bits(state: ir.Value, shape: list[int], width: int) -> tuple[ir.Value, ir.Value]:
    """``width``-bit random words of ``shape`` and the state after them."""
    bits_type = ir.RankedTensorType.get(shape, ir.IntegerType.get_unsigned(width))
    op = ir.Operation.create(
        "stablehlo.rng_bit_generator",
        results=[state.type, bits_type],
        operands=[state],
        attributes={"rng_algorithm": ir.Attribute.parse("#stablehlo<rng_algorithm THREE_FRY>")},
    )
    return op.results[1], op.results[0]


def _unit_uniform(state: ir.Value, result: ir.RankedTensorType) -> tuple[ir.Value, ir.Value]:
    """Uniform floats in (0, 1) of ``result``'s type, and the next state:
    the float's ``k`` mantissa bits from the top of 32- or 64-bit words,
    under the exponent of 1.0 (``1 + m / 2**k``), minus ``1 - 2**-(k+1)``:
    the midpoints ``(2m + 1) / 2**(k+1)`` of the grid, exact in the type.
    Never 0: torch-mlir lowers ``randn`` as Box-Muller on these, whose
    ``log(u)`` would be -inf (a 1-in-1024 draw in f16)."""
    width, mantissa, one = _FLOATS[str(result.element_type)]
    shape = list(result.shape)
    word = 64 if width == 64 else 32
    words, state = _bits(state, shape, word)
    word_type = ir.RankedTensorType(words.type)
    mantissas = _create("stablehlo.shift_right_logical", word_type, [words, _splat(word_type, word - mantissa)])
    narrow_type = ir.RankedTensorType.get(shape, ir.IntegerType.get_unsigned(width))
    if width != word:  # the mantissa (< 2**mantissa) fits the float's width
        mantissas = _create("stablehlo.convert", narrow_type, [mantissas])
    ored = _create("stablehlo.or", narrow_type, [mantissas, _splat(narrow_type, one)])
    in_one_two = _create("stablehlo.bitcast_convert", result, [ored])
    below_one = 1.0 - 2.0 ** -(mantissa + 1)
    return _create("stablehlo.subtract", result, [in_one_two, _splat(result, below_one)]), state


def _replacement(op: ir.Operation, state: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The value replacing ``op`` (built at the insertion point) and the next state."""
    result = ir.RankedTensorType(op.results[0].type)
    a = _broadcast(op.operands[0], result)
    b = _broadcast(op.operands[1], result)
    if _distribution(op) == "UNIFORM":
        u, state = _unit_uniform(state, result)
        span = _create("stablehlo.subtract", result, [b, a])
        scaled = _create("stablehlo.add", result, [_create("stablehlo.multiply", result, [u, span]), a])
        return _create("stablehlo.maximum", result, [scaled, a]), state
    # NORMAL, mean a and standard deviation b: Box-Muller, u1 in (0, 1].
    u0, state = _unit_uniform(state, result)
    u1 = _create("stablehlo.subtract", result, [_splat(result, 1.0), u0])
    u2, state = _unit_uniform(state, result)
    radius = _create("stablehlo.sqrt", result, [
        _create("stablehlo.multiply", result, [_create("stablehlo.log", result, [u1]), _splat(result, -2.0)])
    ])
    angle = _create("stablehlo.multiply", result, [u2, _splat(result, 2 * math.pi)])
    z = _create("stablehlo.multiply", result, [radius, _create("stablehlo.cosine", result, [angle])])
    return _create("stablehlo.add", result, [_create("stablehlo.multiply", result, [z, b]), a]), state
