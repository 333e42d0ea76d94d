"""The IR contract: every discardable attribute hloalias reads or writes.

All facts a pass needs travel in the module itself, so each pass can be run
alone on a ``.mlir`` file.  Names live in the ``hloalias.`` namespace, except
the two aliasing attributes XLA itself understands.

On ``@main``'s arguments (``arg_attrs``):

``hloalias.kind``  (string)
    What the argument is: ``"parameter"``, ``"buffer"``, ``"constant"`` (a
    lifted tensor constant), ``"user_input"`` or ``"rng_key"``: the key
    random ops draw from (``tensor<2xi64>``, the last argument, at most
    one; :mod:`hloalias.frontend.random_key`), which the runtime passes on
    every call, drawn from torch's default generator.  Never donated,
    aliased, mutated, stored permuted or as bits, range-checked, a rebuilt
    view's base, or placed other than replicated; except on a mesh spanning
    processes, where it is ``tensor<Nx2xi64>``, one row per device, with
    ``mhlo.sharding = "{devices=[N,1]<=[N]}"`` (each process's devices
    hold its own key; the program reads row 0).
``hloalias.name``  (string)
    Fully qualified name: ``"layer.weight"`` for state, the placeholder name
    (the Python argument name) for a user input.
``tf.aliasing_output``  (i32)
    XLA: this argument's buffer is reused for result N.
``jax.buffer_donor``  (bool)
    XLA: this argument's buffer may be reused for any result of its size.
``hloalias.donation``  (string)
    Why the argument is aliased: ``"inferred"``, ``"explicit"`` or ``"both"``.
``mhlo.sharding``  (string)
    XLA: the argument's placement on a device mesh (an HloSharding, e.g.
    ``"{devices=[2,1]<=[2]}"``).  Absent on single-device programs.
``hloalias.unused_donation``  (string)
    Written by ``alias-donated-buffers`` when a donation (of the origin in
    ``hloalias.donation``) was not turned into an alias: why not.  With it
    the pass's whole report can be rebuilt from the final module.
``hloalias.stored_permutation``  (array<i64>)
    Written by ``permute-conv-kernel-state`` on read-only module state: the
    argument is the torch tensor permuted by P (``tensor.permute(P)``:
    stored dimension d is torch dimension P[d]), so its type is the permuted
    shape.  The runtime uploads the state permuted and applies the inverse
    for ``state_dict()``.  Only on state (not a user input) that XLA never
    overwrites (no ``tf.aliasing_output``, no ``jax.buffer_donor``, no
    mutation result), that is no rebuilt view's base and has no
    ``mhlo.sharding``.
``hloalias.stored_reversed``  (array<i64>)
    Only beside ``hloalias.stored_permutation``: stored dimensions (sorted)
    that hold the permuted tensor's elements in reverse order
    (``tensor.permute(P).flip(R)``), for a convolution that reads its kernel
    with ``window_reversal`` on them.
``hloalias.stored_bits_of``  (type: ``bf16``, ``f16``, ``f32`` or ``f64``)
    Written by ``store-state-as-bits`` on module state: the argument holds
    the bit pattern of a torch tensor of this float element type, and its
    type is the same shape in the signless integer of the same width
    (``tensor.view(torch.int16)`` for bf16/f16).  When the state is mutated
    its new value (the ``hloalias.mutates`` result) has that integer type
    too.  The runtime uploads the state's bits once and reinterprets them
    for ``state_dict()``; for a user input it hands XLA the caller's
    tensor's integer view and keeps the tensor's dtype.  Only without
    ``mhlo.sharding`` or ``hloalias.stored_permutation``, on state that is
    no rebuilt view's base (neither ``arg:I`` nor ``mutation:I``), or on a
    user input aliased to its own new value (``tf.aliasing_output`` on the
    result that ``hloalias.mutates`` it; its views are rebuilt from the
    caller's tensor, in its dtype).

``hloalias.index_ranges``  (array of dictionaries)
    Written by the importer on an integer user input whose values reach the
    index operand of an indexing op unchanged
    (:mod:`hloalias.frontend.index_ranges`): one entry per range eager
    accepts there, each with ``low`` and ``high`` (i64: every element ``v``
    must be ``low <= v < high``), ``op`` (string: the aten op eager ran,
    ``"aten.embedding"``) and, when known, ``where`` (string: the user's
    source line).  XLA clamps or drops an out-of-range index where eager
    raises: the runtime checks each call's tensor against every entry before
    anything runs (``IndexRangeError``), on the host, on the caller's whole
    tensor, so also on an argument with ``mhlo.sharding`` (sharded or
    replicated).  Only on a ``user_input`` of signless integer element type
    without ``hloalias.stored_bits_of``, with ``low <= high``.

On ``@main``'s results (``res_attrs``):

``hloalias.role``  (string)
    ``"user_output"`` or ``"mutation"``.  A result without a role is a
    mutation when it has ``hloalias.mutates`` only, else a user output; a user
    output without ``hloalias.output`` is numbered by its position.  Every
    hloalias pass writes both attributes on every result it keeps, so later
    renumbering never changes which output a result is.
``hloalias.output``  (i64)
    For a user output: its position in the user's flattened outputs.
``hloalias.mutates``  (i64)
    For a mutation: the index of the argument whose new value it is.
``hloalias.storage``  (string)
    Which storage the result has in eager PyTorch: ``"arg:I"`` (argument I's,
    as a view of it or of its new value) or ``"new:N"`` (a tensor the program
    allocates; results sharing one have the same N).
``mhlo.sharding``  (string)
    XLA: the result's placement; absent where the partitioner chooses.  Written by the
    importer, which alone can tell a view from a copy (``x.clone()`` and
    ``x`` are one value in StableHLO).  A result may be rebuilt from a base
    only when both have the same storage class; a result without the
    attribute is unconstrained.

On ``@main`` itself:

``hloalias.static_inputs``  (dictionary)
    Written by the importer: the non-tensor user inputs baked into the
    program (``{leafN: repr(value)}``, N the position among the flattened
    ``(args, kwargs)`` leaves).  Part of the module, so of its cache key;
    the runtime rejects a call with another value.

``hloalias.removed_results``  (array of dictionaries)
    One entry per result the ``eliminate-view-results`` pass took out of the
    function, in the order they were removed.  Each has ``result`` (the
    result key, below) and ``reason`` (``"view"``, ``"pass_through"``,
    ``"duplicate"`` or ``"dead"``).  All but dead ones also have ``base`` (a
    result key or ``"arg:I"``), ``dtype`` (MLIR element type), ``sizes``,
    ``strides`` and ``offset`` (in elements, relative to a contiguous
    row-major base) and ``chain`` (the view ops, for people).

The records, their reader and writer and ``verify`` live in
:mod:`hloalias.contract`; nothing else parses these attributes.

A *result key* names a result independently of its position, which changes
as results are removed: ``"output:N"`` for user output N, ``"mutation:I"``
for the new value of argument I.
"""

from __future__ import annotations

from typing import Final

ARG_KIND: Final = "hloalias.kind"
ARG_NAME: Final = "hloalias.name"
ARG_DONATION: Final = "hloalias.donation"
ARG_UNUSED_DONATION: Final = "hloalias.unused_donation"
ARG_STORED_PERMUTATION: Final = "hloalias.stored_permutation"
ARG_STORED_REVERSED: Final = "hloalias.stored_reversed"
ARG_STORED_BITS_OF: Final = "hloalias.stored_bits_of"
ARG_INDEX_RANGES: Final = "hloalias.index_ranges"
RESULT_ROLE: Final = "hloalias.role"
RESULT_OUTPUT: Final = "hloalias.output"
RESULT_MUTATES: Final = "hloalias.mutates"
RESULT_STORAGE: Final = "hloalias.storage"
REMOVED_RESULTS: Final = "hloalias.removed_results"
STATIC_INPUTS: Final = "hloalias.static_inputs"
#: On the ``builtin.module``: ``"stored"`` when some state argument of
#: ``@main`` is in the runtime's stored layout (``permute-conv-kernel-state``)
#: rather than torch's, even where its type did not change (a 3x3x3x3 kernel
#: permuted OIHW -> HWIO).  Only hloalias's runtime may call such a module;
#: ``hloalias-opt --xla-compile`` and every other path to XLA refuse it
#: without ``--allow-stored-state`` (pjrt.compile_module's ``allow_stored_state``).
MODULE_STATE_FORM: Final = "hloalias.state_form"

ALIASING_OUTPUT: Final = "tf.aliasing_output"
BUFFER_DONOR: Final = "jax.buffer_donor"
SHARDING: Final = "mhlo.sharding"

ARG_KINDS: Final = ("parameter", "buffer", "constant", "user_input", "rng_key")
ROLE_USER_OUTPUT: Final = "user_output"
ROLE_MUTATION: Final = "mutation"

REASON_VIEW: Final = "view"
REASON_PASS_THROUGH: Final = "pass_through"
REASON_DUPLICATE: Final = "duplicate"
REASON_DEAD: Final = "dead"


def output_key(position: int) -> str:
    """Result key of user output ``position``."""
    return f"output:{position}"


def mutation_key(arg_index: int) -> str:
    """Result key of the new value of argument ``arg_index``."""
    return f"mutation:{arg_index}"


def arg_key(arg_index: int) -> str:
    """Base key naming argument ``arg_index`` (its value before the call)."""
    return f"arg:{arg_index}"


def is_index(text: str) -> bool:
    """Whether ``text`` is a non-negative decimal number in ASCII digits, the
    only spelling of an index in IR, options and keys.  ``str.isdigit`` and
    ``\\d`` also accept other scripts' digits ('٣', '३') and superscripts,
    which ``int`` then reads as some other number or rejects."""
    return text.isascii() and text.isdigit()


def parse_key(key: str) -> tuple[str, int]:
    """Split a result or base key into ``(kind, index)``; raises ValueError."""
    kind, sep, index = key.partition(":")
    if not sep or kind not in ("output", "mutation", "arg") or not is_index(index):
        raise ValueError(f"malformed result key {key!r}")
    return kind, int(index)
