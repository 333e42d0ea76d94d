"""Differential testing: generated torch programs run eagerly and through
:func:`hloalias.compile` must agree.

Each program (``differential/programs.py``) is built three times from its
source: once as the example for ``compile``, once for eager PyTorch, once for
the executable; every build gets its own fresh inputs with the same values
and layouts (some inputs are non-contiguous), and its own buffer.

What must agree, after one call:

1. Results: count, dtype, shape and value, bit for bit (the generated
   arithmetic is exact, see ``programs.py``; bits rather than ``==`` so that
   float views of integer data compare too).
2. Inputs that are not donated: bit-identical to eager's inputs after the
   call (mutated ones updated, the others untouched).  Donated inputs are
   consumed and never read after the call.
3. Module state: ``exe.state_dict()`` against the eager module's buffer.
4. ``compile`` itself changes neither the example inputs nor the module.
5. Storage sharing (``E``: eager's results share storage, ``H``: hloalias's
   do; sharing = the storages' byte ranges overlap, which includes equal
   ``untyped_storage().data_ptr()``).  When both share, the same elements
   must coincide: the "which element of ``a`` is which element of ``b``"
   matrix of byte addresses is equal, so a write through one is seen at the
   same place through the other, as in eager (except that an eager
   ``expand`` of an intermediate may come back materialized: then hloalias
   may lack the expand's own coincidences, never add any).

   - result and input ``x``, ``x`` contiguous and not donated: ``H == E``.
   - result and a non-contiguous input: ``H`` implies ``E`` (hloalias copies
     such inputs first and rebuilds views from the copy, as
     ``hloalias/runtime/executable.py`` documents, so ``E`` without ``H`` is
     allowed; a view of the caller's tensor must still be eager's view).
   - result and a donated input: not checked (the input is consumed).
   - two results, ``E`` without ``H``: allowed only when they are views of a
     donated input (hloalias keeps views of an overwritten argument as real
     results, documented in ``passes/eliminate_view_results.py``).
   - two results, ``H`` without ``E``: allowed only when both derive
     through view ops alone from the same non-contiguous input (eager's
     ``reshape``/``contiguous`` copied it, hloalias views its one copy).
     Anything else is hloalias aliasing what eager keeps apart: a write to
     one result would change the other.

Examples: ``HLOALIAS_DIFF_EXAMPLES`` (default 300; nightly runs set
thousands), derandomized; ``HLOALIAS_DIFF_SEED=N`` runs a random search from
seed ``N`` instead, to look where the fixed sequence does not.
``HLOALIAS_DIFF_KNOWN_BUGS=1`` stops the generator from steering around the
known bugs (the strict xfail tests at the end of this file).  Shrinking stops ``HLOALIAS_DIFF_SHRINK_SECONDS``
(default 90) after the first failure, so a failure costs minutes, not an
hour of compiles; the failing program's reproducer is in the message."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, event, given, note, reject, seed, settings
from hypothesis.errors import UnsatisfiedAssumption

import hloalias
from differential.programs import BUFFER_LOCAL, BUFFER_NAME, GeneratedProgram, TensorSpec, programs

EXAMPLES = int(os.environ.get("HLOALIAS_DIFF_EXAMPLES", "300"))
AVOID_KNOWN_BUGS = os.environ.get("HLOALIAS_DIFF_KNOWN_BUGS", "0") != "1"
SHRINK_SECONDS = float(os.environ.get("HLOALIAS_DIFF_SHRINK_SECONDS", "90"))
SEED = os.environ.get("HLOALIAS_DIFF_SEED")


def _search_seed(test: Callable[..., None]) -> Callable[..., None]:
    """With ``HLOALIAS_DIFF_SEED``, a random search from that seed instead
    of the derandomized one (``@seed`` overrides ``derandomize``)."""
    return test if SEED is None else seed(int(SEED))(test)


# -- comparisons -----------------------------------------------------------


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bits (NaN payloads and signed zeros included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.float32:
        a, b = a.contiguous().view(torch.int32), b.contiguous().view(torch.int32)
    return torch.equal(a, b)


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` live in overlapping storages.  A tensor of no
    elements shares with nothing: no write through it or to another tensor
    can show (eager's ``x[2:2]`` is in ``x``'s storage, every empty tensor
    of its own has the null pointer)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a_start, a_end = _storage_range(a)
    b_start, b_end = _storage_range(b)
    if a_start == b_start:
        return True
    return a_start < b_end and b_start < a_end


def element_addresses(t: torch.Tensor) -> torch.Tensor:
    """Absolute byte address of every element of ``t``, row-major."""
    addresses = torch.full(t.shape, int(t.storage_offset()), dtype=torch.int64)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[dim] = size
        addresses = addresses + (torch.arange(size, dtype=torch.int64) * stride).view(shape)
    return addresses.flatten() * t.element_size() + t.untyped_storage().data_ptr()


def coincidence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``M[i, j]``: element ``i`` of ``a`` is element ``j`` of ``b`` (flattened)."""
    return element_addresses(a)[:, None] == element_addresses(b)[None, :]


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` are one memory location (an ``expand``)."""
    return any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride()))


def _distinct_elements(t: torch.Tensor) -> int:
    return int(element_addresses(t).unique().numel())


def same_elements(eager: tuple[torch.Tensor, torch.Tensor], ours: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether the two pairs' elements coincide alike.  An eager tensor with
    internal overlap (an expand of an intermediate, which eager cannot write
    through anyway) may come back materialized, wholly or in part (an
    expand of a materialized expand: fewer of its elements share a
    location): then hloalias may only lack coincidences, never add one."""
    eager_matrix, our_matrix = coincidence(*eager), coincidence(*ours)
    materialized = any(
        has_internal_overlap(e) and _distinct_elements(h) > _distinct_elements(e) for e, h in zip(eager, ours)
    )
    if materialized:
        return not bool((our_matrix & ~eager_matrix).any())
    return torch.equal(eager_matrix, our_matrix)


# -- running one program ---------------------------------------------------


_failed_programs: set[str] = set()
_first_failure_at: float | None = None


def _fingerprint(program: GeneratedProgram) -> str:
    return program.reproducer()


def _compile(program: GeneratedProgram, target: Any, example: Sequence[torch.Tensor]) -> hloalias.Executable:
    """``hloalias.compile``; a program torch.export itself refuses is rejected."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable", category=UserWarning)
        try:
            return hloalias.compile(target, list(example), donate=list(program.donate))
        except hloalias.TorchImportError:
            make_program, make_inputs = program.build()
            module = make_program()
            if not isinstance(module, torch.nn.Module):
                module = _Wrap(module)
            try:
                torch.export.export(module, tuple(make_inputs()[: len(program.inputs)]), strict=False)
            except Exception as error:
                event(f"rejected: torch.export refuses it ({type(error).__name__})")
                reject()  # outside hloalias: torch.export cannot take it
            raise


class _Wrap(torch.nn.Module):
    """A plain function as a module, for calling ``torch.export`` directly."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def differential_problems(program: GeneratedProgram) -> list[str]:
    """Run ``program`` eagerly and through hloalias; every disagreement."""
    make_program, make_inputs = program.build()
    count = len(program.inputs)
    names = program.input_names
    donated = set(program.donate)
    problems: list[str] = []

    # 4. compile leaves its example inputs and the module alone.
    example = make_inputs()[:count]
    example_reference = make_inputs()[:count]
    compiled_target = make_program()
    exe = _compile(program, compiled_target, example)
    for name, used, reference in zip(names, example, example_reference):
        if not same_bits(used, reference):
            problems.append(f"compile changed example input {name}")
    if program.buffer is not None:
        if not same_bits(compiled_target.buf, make_inputs()[-1]):
            problems.append("compile changed the module's buffer")

    eager_target = make_program()
    eager_inputs = make_inputs()[:count]
    try:
        expected = eager_target(*eager_inputs)
    except RuntimeError as error:
        event(f"rejected: eager raised {str(error)[:60]}")
        reject()  # the generator's simulation should prevent this
    inputs = make_inputs()[:count]
    copied = {i for i, t in enumerate(inputs) if not t.is_contiguous()}
    got = exe(*inputs)

    # 1. results
    if not isinstance(got, tuple) or len(got) != len(expected):
        return problems + [f"results: expected a tuple of {len(expected)}, got {type(got).__name__} {got!r}"]
    for position, (e, h) in enumerate(zip(expected, got)):
        if e.dtype != h.dtype or e.shape != h.shape:
            problems.append(f"result {position}: expected {e.dtype}{list(e.shape)}, got {h.dtype}{list(h.shape)}")
        elif not same_bits(e, h):
            problems.append(f"result {position} ({program.returns[position]}): expected\n{e}\ngot\n{h}")

    # 2. inputs after the call
    for index, (name, e, h) in enumerate(zip(names, eager_inputs, inputs)):
        if index in donated:
            continue
        if not same_bits(e, h):
            problems.append(f"input {name} after the call: expected\n{e}\ngot\n{h}")

    # 3. module state
    if program.buffer is not None:
        state = exe.state_dict()
        if not same_bits(eager_target.buf, state[BUFFER_NAME]):
            problems.append(f"buffer after the call: expected\n{eager_target.buf}\ngot\n{state[BUFFER_NAME]}")

    # 5. storage sharing
    problems += _sharing_problems(program, expected, got, eager_inputs, inputs, copied)
    return problems


def _sharing_problems(
    program: GeneratedProgram,
    expected: Sequence[torch.Tensor],
    got: Sequence[torch.Tensor],
    eager_inputs: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    copied: set[int],
) -> list[str]:
    """Rule 5 of the module docstring, for one call's results and inputs."""
    problems = []
    names = program.input_names
    donated_names = {names[i] for i in program.donate}
    copied_names = {names[i] for i in copied}
    returns = program.returns

    def label(position: int) -> str:
        return f"result {position} ({returns[position]})"

    for position, (e, h) in enumerate(zip(expected, got)):
        for index, (eager_input, our_input) in enumerate(zip(eager_inputs, inputs)):
            if index in program.donate:
                continue  # consumed: never read after the call
            eager_shares = shares_storage(e, eager_input)
            our_shares = shares_storage(h, our_input)
            what = f"{label(position)} and input {names[index]}"
            if index in copied and not our_shares:
                continue
            if eager_shares != our_shares:
                problems.append(f"{what}: eager shares storage: {eager_shares}, hloalias: {our_shares}")
            elif eager_shares and not same_elements((e, eager_input), (h, our_input)):
                problems.append(f"{what}: share storage, but not the same elements as in eager")

    for first in range(len(expected)):
        for second in range(first + 1, len(expected)):
            eager_shares = shares_storage(expected[first], expected[second])
            our_shares = shares_storage(got[first], got[second])
            roots = {program.view_roots[first], program.view_roots[second]}
            what = f"{label(first)} and {label(second)}"
            if eager_shares and not our_shares:
                if not roots & donated_names:
                    problems.append(f"{what}: share storage in eager, not in hloalias")
            elif our_shares and not eager_shares:
                same_copied_root = len(roots) == 1 and roots <= copied_names
                if not same_copied_root:
                    problems.append(f"{what}: share storage in hloalias, not in eager (a write to one changes the other)")
            elif eager_shares and not same_elements((expected[first], expected[second]), (got[first], got[second])):
                problems.append(f"{what}: share storage, but not the same elements as in eager")
    return problems


def check_program(program: GeneratedProgram) -> None:
    """Assert eager and hloalias agree on ``program``; the message holds the reproducer."""
    problems = differential_problems(program)
    assert not problems, "\n".join(problems) + "\n" + program.describe()


# -- the generated corpus --------------------------------------------------


@_search_seed
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large),
)
@given(programs(avoid_known_bugs=AVOID_KNOWN_BUGS))
def test_generated_programs_match_eager(program: GeneratedProgram) -> None:
    """Every generated program agrees with eager PyTorch (see the module docstring)."""
    global _first_failure_at
    fingerprint = _fingerprint(program)
    shrinking_over = _first_failure_at is not None and time.monotonic() - _first_failure_at > SHRINK_SECONDS
    if shrinking_over and fingerprint not in _failed_programs:
        reject()  # shrink budget spent: only failures already seen replay
    note(program.describe())
    try:
        check_program(program)
    except UnsatisfiedAssumption:
        raise  # a rejected program is not a failure
    except Exception:
        _failed_programs.add(fingerprint)
        if _first_failure_at is None:
            _first_failure_at = time.monotonic()
        raise


# -- hand-written programs: the generator's building blocks work ----------


def _program(
    body: Sequence[str],
    returns: Sequence[str],
    view_roots: Sequence[str],
    inputs: Sequence[TensorSpec] = (TensorSpec("x0", (2, 3), "float32"),),
    buffer: TensorSpec | None = None,
    donate: Sequence[int] = (),
) -> GeneratedProgram:
    return GeneratedProgram(tuple(inputs), buffer, tuple(body), tuple(returns), tuple(donate), 7, tuple(view_roots))


TWO_INPUTS = (TensorSpec("x0", (2, 3), "float32"), TensorSpec("x1", (2, 3), "float32"))
BUFFER = TensorSpec(BUFFER_NAME, (2, 3), "float32")

# Programs hloalias gets right today; each pins one construct of the generator.
PASSING = {
    "seed_example": _program(["v0 = x0.view(6)[0:4]", "v1 = v0.view(2, 2)"], ["x0", "v1"], ["x0", "x0"], [TensorSpec("x0", (6,), "float32")]),
    "mutate_through_views": _program(["x0[1:2].add_(1.0)", "x0.t().mul_(2.0)"], ["x0", "x0"], ["x0", "x0"]),
    "int_view_update": _program(["v0 = x0.view(torch.int32)", "v0.add_(1)"], ["v0", "x0"], ["x0", "x0"]),
    "expand_and_permute": _program(["v0 = x0.unsqueeze(0).expand(2, 2, 3)", "v1 = v0.permute(2, 0, 1)"], ["v1", "v0"], ["x0", "x0"]),
    "views_of_computed": _program(["v0 = x0 * 2.0", "v1 = v0[:, ::2]"], ["v1", "v0"], ["v0", "v0"]),
    "buffer_update_and_views": _program(
        [f"{BUFFER_LOCAL}[0].add_(1.0)", f"v0 = {BUFFER_LOCAL}.t()"], ["v0", BUFFER_LOCAL, "x0"], ["b", "b", "x0"], buffer=BUFFER
    ),
    "donated_view_base": _program(["v0 = x0[0]"], ["v0", "x1"], ["x0", "x1"], TWO_INPUTS, donate=[0]),
    "non_contiguous_mutated": _program(
        ["x0.add_(1.0)", "v0 = x0[:, 1]"], ["v0", "x0"], ["x0", "x0"], [TensorSpec("x0", (2, 3), "float32", contiguous=False)]
    ),
    # Once known bugs, fixed by the importer's hloalias.storage classes and
    # by keeping every mutation result: regressions name them.
    # torch.export returns x0 itself as the buffer's new value (no copy
    # node); x0 must still come back as the caller's x0, not as the buffer.
    "buffer_copied_from_input_returns_the_buffer": _program([f"{BUFFER_LOCAL}.copy_(x0)"], ["x0"], ["x0"], buffer=BUFFER),
    # Fixed by issue 11 (storage classes read before functionalization):
    # v0's storage was filed under the buffer's, so v0 came back as the
    # buffer's new state and shared it with the returned buffer.
    "buffer_copied_from_intermediate_shares_it": _program(
        ["v0 = x0 * 2.0", f"{BUFFER_LOCAL}.copy_(v0)"], ["v0", BUFFER_LOCAL], ["v0", BUFFER_LOCAL], buffer=BUFFER
    ),
    # eliminate-view-results sees the functional program, where clone() is
    # gone: the clone is returned as the caller's own tensor.
    "clone_returned_as_input": _program(["v0 = x0.clone()"], ["v0"], ["v0"]),
    # x.t().contiguous() copies in eager; hloalias returns a transposed view of x.
    "contiguous_copy_returned_as_view": _program(["v0 = x0.t().contiguous()"], ["v0"], ["x0"]),
    # The same computation twice is one SSA value after CSE: both results
    # come back as one tensor.
    "equal_computations_share": _program(["v0 = x0 * 2.0", "v1 = x0 * 2.0"], ["v0", "v1"], ["v0", "v1"]),
    # y equals x's new value, so y is rebuilt as a view of the caller's x.
    "result_equal_to_update_aliases_input": _program(["v0 = x0 + 1.0", "x0.add_(1.0)"], ["v0"], ["v0"]),
    # The update's new value is input x1 itself (pass-through), the mutation
    # result is removed and the runtime never writes x0.
    "copy_from_input_is_lost": _program(["x0.copy_(x1)"], ["x0"], ["x0"], TWO_INPUTS),
    # Two equal fills: the second update is removed as a duplicate of the
    # first and x1 keeps its old value.
    "equal_fills_lose_one": _program(["x0.fill_(1.5)", "x1.fill_(1.5)"], ["x0"], ["x0"], TWO_INPUTS),
    # Found by issue 25's generator extension, fixed by issue 24 (the
    # importer spells out copy_'s conversion before functionalization): a
    # copy_ from another dtype over the whole buffer came back in the
    # source's dtype (int32, the bits of the float values eager returns).
    "whole_buffer_copy_from_another_dtype_returned": _program(
        [f"{BUFFER_LOCAL}.copy_(x0.view(torch.int32))"], [BUFFER_LOCAL], ["b"], buffer=BUFFER
    ),
    # Found by the session-46 user sweep (TAPAS), fixed in the importer: a
    # select between two equal broadcasting constants was folded by
    # torch-mlir to the unbroadcast constant: the sum was 1.5, eager's 9.0.
    "select_between_one_broadcast_value": _program(
        ["v0 = torch.where(x0 > 0.25, torch.full((1,), 1.5), torch.full((1,), 1.5)).sum() + x0"], ["v0"], ["v0"]
    ),
}


@pytest.mark.parametrize("name", sorted(PASSING))
def test_hand_written_program_matches_eager(name: str) -> None:
    """Fixed programs, one per construct, so a regression names its construct."""
    check_program(PASSING[name])


def test_checker_catches_a_wrong_alias() -> None:
    """The sharing rule can fail: an executable that hands back the input
    where eager returns a fresh tensor is reported."""
    program = _program(["v0 = x0 + 1.0"], ["v0"], ["v0"])
    x = torch.randn(2, 3)
    eager = (x + 1.0,)
    wrong = (x.add_(1.0),)  # same values, but the caller's tensor
    problems = _sharing_problems(program, eager, wrong, [torch.randn(2, 3)], [x], set())
    assert problems and "eager shares storage: False, hloalias: True" in problems[0]


# -- known limitations: minimal reproducers the generator found -----------

KNOWN_BUGS = {
    # x's new value is a constant; lowering folds the slice of it into a
    # constant of its own, so the view is no longer found: it comes back
    # as a copy, not a view of x.
    "view_of_filled_input_is_a_copy": _program(["x0.fill_(1.5)", "v0 = x0[0]"], ["v0"], ["x0"]),
    # Views of an intermediate that is not returned come back as two device
    # results: eager's v1 and v2 overlap in row 1 (a write to one shows in
    # the other), hloalias's are independent.  Undocumented limitation.
    "overlapping_views_of_unreturned_intermediate": _program(
        ["v0 = x0 + 1.0", "v1 = v0[0:2]", "v2 = v0[1:3]"], ["v1", "v2"], ["v0", "v0"],
        [TensorSpec("x0", (3, 4), "float32")],
    ),
    # unfold with overlapping windows is lowered as a gather: the windows
    # come back as a new tensor, not as eager's view of x.
    "overlapping_unfold_view_is_a_copy": _program(
        ["v0 = x0.unfold(0, 3, 1)"], ["v0"], ["x0"], [TensorSpec("x0", (5, 2), "float32")],
    ),
    "diagonal_of_non_adjacent_dims_is_a_copy": _program(
        ["v0 = x0.diagonal(0, 0, 2)"], ["v0"], ["x0"], [TensorSpec("x0", (2, 3, 2), "float32")],
    ),
}


_COPIED = "hloalias bug: a view of a constant-folded update comes back as a copy"
_UNRETURNED = "hloalias limitation: views of an intermediate that is not returned do not share its storage"
_WINDOWS = "hloalias limitation: overlapping unfold windows come back as a copy"
KNOWN_BUG_REASONS = {
    "overlapping_unfold_view_is_a_copy": _WINDOWS,
    "diagonal_of_non_adjacent_dims_is_a_copy": "hloalias limitation: a diagonal of dimensions that are not adjacent comes back as a copy",
    "view_of_filled_input_is_a_copy": _COPIED,
    "overlapping_views_of_unreturned_intermediate": _UNRETURNED,
}


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUG_REASONS[name])) for name in sorted(KNOWN_BUGS)],
)
def test_known_bug(name: str) -> None:
    """Minimal programs for the known bugs; strict: a fix must flip them."""
    check_program(KNOWN_BUGS[name])
