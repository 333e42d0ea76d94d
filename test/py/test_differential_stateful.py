"""Differential testing of state across calls (issue 11): generated modules
(``differential/stateful.py``) called several times eagerly and through
one or two executables of the same module, results held across calls,
inputs sometimes overlapping views of one tensor, a tied parameter; the
same programs through ``torch.compile(backend="hloalias")``, alone and
alternating with an ``hloalias.compile`` executable of the same module
(``HLOALIAS_DYNAMO_EXAMPLES``, default half of the stateful count).

``HLOALIAS_STATEFUL_EXAMPLES`` (default 25) sets the number of programs;
``HLOALIAS_DIFF_SEED=N`` searches from seed ``N`` (``scripts/fuzz.sh``)."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, note, seed, settings

import hloalias
from differential.stateful import EDITS, SHAPE, StatefulProgram, stateful_programs
from differential.training import TrainingProgram, training_programs

EXAMPLES = int(os.environ.get("HLOALIAS_STATEFUL_EXAMPLES", "25"))
SEED = os.environ.get("HLOALIAS_DIFF_SEED")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.detach().contiguous().view(torch.uint8), b.detach().contiguous().view(torch.uint8)
    )


def call_problems(
    call: int, eager_inputs: tuple[torch.Tensor, ...], our_inputs: tuple[torch.Tensor, ...],
    eager_state: dict[str, torch.Tensor], our_state: dict[str, torch.Tensor],
) -> list[str]:
    """Where the inputs (updated in place) or the state differ from eager's after call ``call``."""
    problems = [
        f"call {call}: input x{i} {b.tolist()} != eager {a.tolist()}"
        for i, (a, b) in enumerate(zip(eager_inputs, our_inputs)) if not same_bits(a, b)
    ]
    problems += [
        f"call {call}: state {name} {our_state[name].tolist()} != eager {value.tolist()}"
        for name, value in eager_state.items() if not same_bits(our_state[name], value)
    ]
    return problems


def held_problems(held_eager: list[torch.Tensor], held_ours: list[torch.Tensor]) -> list[str]:
    """Where results held since the last edit differ from eager's held results."""
    return [
        f"held result {position} after the last call: {b.tolist()} != eager {a.tolist()}"
        for position, (a, b) in enumerate(zip(held_eager, held_ours)) if not same_bits(a, b)
    ]


def stateful_problems(program: StatefulProgram) -> list[str]:
    """What differs between eager and hloalias over ``program.calls`` calls."""
    eager = program.build()
    compiled_from = program.build()
    example = program.inputs(0)
    executables = [hloalias.compile(compiled_from, (example[0].clone(), example[1].clone()))]
    if program.two_executables:
        executables.append(hloalias.compile(compiled_from, (example[0].clone(), example[1].clone())))
    problems: list[str] = []
    held_eager: list[torch.Tensor] = []
    held_ours: list[torch.Tensor] = []
    for call in range(1, program.calls + 1):
        exe = executables[call % len(executables)]
        edit = program.edit_before(call)
        if edit is not None:
            statement, needs_write_back = EDITS[edit]
            if needs_write_back:
                exe.write_back()
            for module in (eager, compiled_from):
                with torch.no_grad():
                    exec(statement, {"torch": torch, "SHAPE": SHAPE, "m": module, "fresh": program.build()})  # noqa: S102
            held_eager.clear()
            held_ours.clear()
        e0, e1, _ = program.inputs(call)
        x0, x1, base = program.inputs(call)
        if program.reads_training and not compiled_from.training:  # compiled in train mode
            state_before = exe.state_dict()
            try:
                exe(x0, x1)
            except hloalias.ExecutionError as error:
                if "eval mode now" not in str(error):
                    problems.append(f"call {call}: wrong refusal: {error}")
            else:
                problems.append(f"call {call}: a call in eval mode of a train-mode program was not refused")
            after = exe.state_dict()
            if any(not same_bits(after[k], state_before[k]) for k in state_before):
                problems.append(f"call {call}: a refused call changed the state")
            continue
        overlapping = program.overlap is not None and program.overlap < 4
        if overlapping and program.writes_input:
            state_before = exe.state_dict()
            before = base.clone() if base is not None else None
            try:
                exe(x0, x1)
            except hloalias.ExecutionError as error:
                if "share memory" not in str(error):
                    problems.append(f"call {call}: wrong refusal: {error}")
            else:
                problems.append(f"call {call}: overlapping written inputs were not refused")
            if base is not None and before is not None and not same_bits(base, before):
                problems.append(f"call {call}: a refused call changed the inputs")
            after = exe.state_dict()
            if any(not same_bits(after[k], state_before[k]) for k in state_before):
                problems.append(f"call {call}: a refused call changed the state")
            continue
        # Which results eager gives requires_grad (a copy of the module in
        # grad mode, before the call changes its state); ours are called in
        # grad mode, where results computed from the parameter are marked
        # (runtime/gradient_boundary.py).
        wants_grad = _requires_grad_in_eager(eager, e0, e1)
        with torch.no_grad():
            expected = eager(e0, e1)
        got = exe(x0, x1)
        if len(got) != len(expected):
            problems.append(f"call {call}: {len(got)} results, eager {len(expected)}")
            continue
        if wants_grad is not None and wants_grad != [bool(r.requires_grad) for r in got]:
            problems.append(
                f"call {call}: requires_grad of the results {[bool(r.requires_grad) for r in got]}, "
                f"eager {wants_grad}"
            )
        held_eager.extend(expected)
        held_ours.extend(got)
        problems += call_problems(call, (e0, e1), (x0, x1), eager.state_dict(), exe.state_dict())
    problems += held_problems(held_eager, held_ours)
    for exe in executables:
        if exe.memory_stats["argument_bytes"] > 2 * 4 * 24 * 4:  # buf + w once + x0 + x1
            problems.append(f"state counted more than once: {exe.memory_stats}")
    if program.two_executables and executables[0]._slots["buf"] is not executables[1]._slots["buf"]:
        problems.append("two executables of one module hold two copies of its buffer")
    return problems


def _requires_grad_in_eager(module: torch.nn.Module, x0: torch.Tensor, x1: torch.Tensor) -> list[bool] | None:
    """``requires_grad`` of each result of a grad-mode call of a copy of
    ``module`` on copies of the inputs; None where eager refuses the call in
    grad mode (an in-place write to the parameter)."""
    copied = copy.deepcopy(module)
    try:
        return [bool(r.requires_grad) for r in copied(x0.clone(), x1.clone())]
    except RuntimeError:
        return None


def check_stateful(program: StatefulProgram) -> None:
    problems = stateful_problems(program)
    assert not problems, "\n".join(problems) + "\n" + program.describe()


def _search_seed(test):  # type: ignore[no-untyped-def]
    return test if SEED is None else seed(int(SEED))(test)


@_search_seed
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.filter_too_much),
)
@given(stateful_programs())
def test_stateful_programs_match_eager(program: StatefulProgram) -> None:
    """Every generated stateful program agrees with eager across calls."""
    note(program.describe())
    check_stateful(program)


FIXED = {
    "held_view_of_buffer_across_calls": StatefulProgram(
        ("self.buf.add_(x0)",), ("self.buf[1:3]", "self.buf.t()"), 3, False, None, False
    ),
    "two_executables_share_the_buffer": StatefulProgram(
        ("self.buf.mul_(0.5)", "c0 = x0 + self.w", "self.buf.add_(self.w2)"), ("self.buf", "c0"), 3, True, None, False
    ),
    "overlapping_inputs_written_are_refused": StatefulProgram(
        ("x0.add_(self.buf)",), ("x1[:, 1]",), 2, False, 2, True
    ),
    "edits_between_calls_are_read": StatefulProgram(
        ("self.buf.add_(x0)", "c0 = x0 + self.w"), ("self.buf", "c0"), 3, True, None, False, (1, 4)
    ),
    "an_edit_after_write_back_starts_from_the_calls_state": StatefulProgram(
        ("self.buf.add_(self.w2)",), ("self.buf",), 3, False, None, False, (5, 2)
    ),
    # The mode edits (EDITS 6, 7): refused in eval mode, then agreeing again
    # once switched back; each call before the module_modes check ran the
    # train-mode branch in eval mode.
    "a_mode_switch_refuses_and_switching_back_agrees": StatefulProgram(
        ("self.buf.add_(1.0 if self.training else -1.0)", "c0 = x0 + self.w"), ("self.buf", "c0"), 4, True,
        None, False, (6, None, 7)
    ),
    "a_program_without_a_mode_branch_runs_in_either_mode": StatefulProgram(
        ("self.buf.add_(x0)",), ("self.buf",), 3, False, None, False, (6, 7)
    ),
    "overlapping_inputs_read_only_agree": StatefulProgram(
        ("self.buf.add_(x0)", "self.buf[1].copy_(x1[2])"), ("self.buf", "x1[:, 1]"), 2, False, 2, False
    ),
}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_stateful_program(name: str) -> None:
    check_stateful(FIXED[name])


# -- the same programs through torch.compile(backend="hloalias") ---------------

DYNAMO_EXAMPLES = int(os.environ.get("HLOALIAS_DYNAMO_EXAMPLES", str(max(8, EXAMPLES // 2))))


def dynamo_problems(program: StatefulProgram) -> list[str]:
    """What differs from eager when the module runs through
    ``torch.compile(backend="hloalias")``; with ``two_executables``, every
    other call runs an ``hloalias.compile`` executable of the same module
    instead (the two share its state: each must see the other's updates).
    Overlapping inputs that the program writes are refused by either path;
    the ``hloalias.compile`` executable also refuses a mode it was not
    compiled for, where dynamo recompiles."""
    torch._dynamo.reset()
    eager, ours = program.build(), program.build()
    compiled = torch.compile(ours, backend="hloalias")
    example = program.inputs(0)
    exe = hloalias.compile(ours, (example[0].clone(), example[1].clone())) if program.two_executables else None
    problems: list[str] = []
    held_eager: list[torch.Tensor] = []
    held_ours: list[torch.Tensor] = []
    for call in range(1, program.calls + 1):
        edit = program.edit_before(call)
        if edit is not None:
            statement, needs_write_back = EDITS[edit]
            if needs_write_back and exe is not None:
                exe.write_back()
            for module in (eager, ours):
                with torch.no_grad():
                    exec(statement, {"torch": torch, "SHAPE": SHAPE, "m": module, "fresh": program.build()})  # noqa: S102
            held_eager.clear()
            held_ours.clear()
        run = exe if exe is not None and call % 2 == 0 else compiled
        e0, e1, _ = program.inputs(call)
        x0, x1, base = program.inputs(call)
        # Overlapping inputs the program writes: refused, or (where the
        # graph dynamo hands over does not take both) run as eager runs.
        may_refuse = program.overlap is not None and program.overlap < 4 and program.writes_input
        must_refuse = run is exe and (program.reads_training and not ours.training or may_refuse)
        state_before = {k: v.clone() for k, v in ours.state_dict().items()}
        before = base.clone() if base is not None else None
        try:
            with torch.no_grad():
                got = run(x0, x1)
        except hloalias.ExecutionError as error:
            if not (must_refuse or may_refuse):
                problems.append(f"call {call}: refused: {error}")
            if base is not None and before is not None and not same_bits(base, before):
                problems.append(f"call {call}: a refused call changed the inputs")
            after = ours.state_dict()
            if any(not same_bits(after[k], state_before[k]) for k in state_before):
                problems.append(f"call {call}: a refused call changed the state")
            continue  # eager is not run either
        if must_refuse:
            problems.append(f"call {call}: not refused")
        with torch.no_grad():
            expected = eager(e0, e1)
        held_eager.extend(expected)
        held_ours.extend(got)
        for position, (a, b) in enumerate(zip(expected, got)):
            if not same_bits(a, b):
                problems.append(f"call {call}: result {position} {b.tolist()} != eager {a.tolist()}")
        problems += call_problems(call, (e0, e1), (x0, x1), eager.state_dict(), ours.state_dict())
    return problems + held_problems(held_eager, held_ours)


@_search_seed
@settings(
    max_examples=DYNAMO_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.filter_too_much),
)
@given(stateful_programs())
def test_stateful_programs_match_eager_through_torch_compile(program: StatefulProgram) -> None:
    """Every generated stateful program agrees with eager through the
    dynamo backend, alone and alternating with ``hloalias.compile``."""
    note(program.describe())
    problems = dynamo_problems(program)
    assert not problems, "\n".join(problems) + "\n" + program.describe()


DYNAMO_FIXED = {
    # Overlapping rows, one written through a slice: torch.export failed
    # inside torch ("Expected !size_bytes_is_heap_allocated_") where the
    # call must be refused, naming the inputs.
    "overlapping_written_rows_are_refused": StatefulProgram(
        ("c0 = x1.as_strided((3, 2), (6, 2)) * 2.0", "x1[:, 1:3].mul_(2.0)", "c1 = x0 + self.w"),
        ("self.w2[1:2]", "x0[0]", "self.buf.t()"), 2, True, 2, True, (4,),
    ),
    "torch_compile_and_hloalias_compile_share_the_buffer": StatefulProgram(
        ("self.buf.add_(x0)", "c0 = x0 + self.w"), ("self.buf[1:3]", "c0"), 3, True, None, False, (None, 5),
    ),
}


@pytest.mark.parametrize("name", sorted(DYNAMO_FIXED))
def test_fixed_program_through_torch_compile(name: str) -> None:
    problems = dynamo_problems(DYNAMO_FIXED[name])
    assert not problems, "\n".join(problems)


# -- training steps: optimizers under schedulers, lr 0 included (issue 25) ----

TRAINING_EXAMPLES = int(os.environ.get("HLOALIAS_TRAINING_EXAMPLES", str(max(6, EXAMPLES // 4))))
TRAINING_RTOL, TRAINING_ATOL = 1e-5, 2e-6
# Float64 programs: float64 rounding stays far below these; lr rounded to
# float32 (2.2e-8 relative, the bug 5bbe9bb fixed) moved SGD's parameters by ~1e-9.
TRAINING_RTOL_64, TRAINING_ATOL_64 = 1e-10, 1e-11


def check_training(program: TrainingProgram) -> None:
    (eager_model, eager_opt, eager_sched), (model, opt, sched) = program.build(), program.build()
    rtol, atol = (TRAINING_RTOL_64, TRAINING_ATOL_64) if program.float64 else (TRAINING_RTOL, TRAINING_ATOL)
    batches = program.batches()
    if program.warm:  # state hloalias does not initialize: one eager step first
        for m, o, s in ((eager_model, eager_opt, eager_sched), (model, opt, sched)):
            program.step(m, o)(*batches[0])
            s.step()
    train = hloalias.compile_training_step(program.step(model, opt), model, opt, batches[0])
    eager_step = program.step(eager_model, eager_opt)
    for step, batch in enumerate(batches[1:]):
        lrs = [group["lr"] for group in opt.param_groups]
        expected = eager_step(*batch)
        got = train(*batch)
        assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(expected)
        for eager_value, value in zip(torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(got)):
            assert torch.isfinite(value).all(), f"step {step} (lr {lrs}): {value}"
            torch.testing.assert_close(value, eager_value.detach(), rtol=rtol, atol=atol,
                                       msg=f"result of step {step} (lr {lrs})")
        eager_sched.step()
        sched.step()
    train.write_back()
    for name, value in model.state_dict().items():
        assert torch.isfinite(value).all(), name
        torch.testing.assert_close(value, eager_model.state_dict()[name], rtol=rtol, atol=atol, msg=name)


@_search_seed
@settings(
    max_examples=TRAINING_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=(HealthCheck.too_slow,),
)
@given(training_programs())
# Found by the generator (seed 4505): Rprop, warmed by one eager step, with
# the embedding frozen: the capture asked for the frozen parameter's state.
@example(TrainingProgram("Rprop", (("amsgrad", True), ("weight_decay", 0.1), ("momentum", 0.0)), False,
                         "cyclic_from_0", (0.0,), 2, 1526, "accumulate", True))
# Hand-written (session 47): a float64 model under SGD; lr was a float32
# input and every update drifted from eager's by 2.2e-8 relative.
@example(TrainingProgram("SGD", (("amsgrad", False), ("weight_decay", 0.0), ("momentum", 0.0)), False,
                         "table", (1.0,), 2, 7, "plain", False, True))
def test_generated_training_steps_match_eager(program: TrainingProgram) -> None:
    """Every generated optimizer/scheduler pair trains as eager does."""
    note(program.describe())
    check_training(program)
