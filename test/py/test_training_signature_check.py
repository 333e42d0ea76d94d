"""``signature_checked_once`` (frontend/torch_internals.py): the training
capture builds its ``ExportedProgram`` with torch's own signature check run
on the signature read once per property (torch's reads two properties,
each a walk of every spec, once per mutated buffer: quadratic in a step's
state).  Every check still fails as torch's does, with torch's message;
the name is torch's again after the block."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._export.verifier as verifier
from torch.export.graph_signature import ExportGraphSignature, InputKind, OutputKind

from hloalias.frontend.torch_internals import signature_checked_once
from hloalias.frontend.training import capture_training_step


def _program() -> Any:
    """A captured AdamW step of a linear layer: 8 state slots (parameters
    and optimizer state), each a mutated buffer."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return capture_training_step(step, model, optimizer, (torch.randn(3, 4),)).exported


def _buffer_outputs(program: Any) -> list[Any]:
    return [s for s in program.graph_signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION]


def _no_such_buffer(program: Any) -> None:
    _buffer_outputs(program)[2].target = "nowhere"


def _mutation_of_nothing(program: Any) -> None:
    _buffer_outputs(program)[1].kind = OutputKind.PARAMETER_MUTATION  # of no parameter


def _input_renamed(program: Any) -> None:
    program.graph_signature.input_specs[1].arg.name = "renamed"


def _buffer_not_in_state(program: Any) -> None:
    program.state_dict.pop(program.graph_signature.input_specs[0].target)


def _non_persistent_in_state(program: Any) -> None:
    program.graph_signature.input_specs[0].persistent = False


def _outputs_reordered(program: Any) -> None:
    specs = program.graph_signature.output_specs
    user = [i for i, s in enumerate(specs) if s.kind == OutputKind.USER_OUTPUT][0]
    specs[user].arg.name = specs[0].arg.name


def _too_few_inputs(program: Any) -> None:
    program.graph_signature.input_specs.pop()


def _buffer_as_parameter(program: Any) -> None:
    program.graph_signature.input_specs[0].kind = InputKind.PARAMETER


BREAKAGES: dict[str, Callable[[Any], None]] = {
    "no_such_buffer": _no_such_buffer,
    "mutation_of_nothing": _mutation_of_nothing,
    "input_renamed": _input_renamed,
    "buffer_not_in_state": _buffer_not_in_state,
    "non_persistent_in_state": _non_persistent_in_state,
    "outputs_reordered": _outputs_reordered,
    "too_few_inputs": _too_few_inputs,
    "buffer_as_parameter": _buffer_as_parameter,
}


def _failure(program: Any) -> str | None:
    try:
        program.validate()
    except Exception as error:  # torch's SpecViolationError, or its AssertionError
        return f"{type(error).__name__}: {error}"
    return None


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_every_check_fails_as_torchs_does(breakage: str) -> None:
    program = _program()
    BREAKAGES[breakage](program)
    torchs = _failure(program)
    assert torchs is not None
    with signature_checked_once():
        assert _failure(program) == torchs


def test_a_valid_program_passes_and_torchs_check_is_back_after() -> None:
    original = verifier._verify_exported_program_signature
    with signature_checked_once():
        with signature_checked_once():  # nested
            assert verifier._verify_exported_program_signature is not original
        assert verifier._verify_exported_program_signature is not original
        assert _failure(_program()) is None
    assert verifier._verify_exported_program_signature is original


def test_each_signature_property_is_walked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    walks: list[str] = []
    for name in ("buffers_to_mutate", "buffers"):
        prop = getattr(ExportGraphSignature, name)
        monkeypatch.setattr(
            ExportGraphSignature, name,
            property(lambda self, _get=prop.fget, _name=name: walks.append(_name) or _get(self)),
        )
    program = _program()
    walks.clear()
    program.validate()
    torchs = len(walks)
    walks.clear()
    with signature_checked_once():
        program.validate()
    assert sorted(walks) == ["buffers", "buffers_to_mutate"]
    assert torchs >= 2 * len(_buffer_outputs(program))


def test_training_capture_checks_the_signature_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The captured step's program is checked by torch's check, through
    the block, which is gone after the capture."""
    checked: list[str] = []
    torchs = verifier._verify_exported_program_signature

    def counted(program: Any) -> None:
        checked.append(type(program).__name__)
        torchs(program)

    monkeypatch.setattr(verifier, "_verify_exported_program_signature", counted)
    program = _program()
    assert checked == ["_ProgramRead"]
    assert verifier._verify_exported_program_signature is counted
    assert len(_buffer_outputs(program)) == 8


def test_an_interrupt_anywhere_leaves_torchs_check_in_place() -> None:
    """A Ctrl-C at every point of the block (frontend/torch_internals.py)
    leaves torch's check in the verifier and no block counted."""
    from interrupt_points import sweep

    from hloalias.frontend import torch_internals

    program = _program()
    torchs = verifier._verify_exported_program_signature

    def run(_: None) -> None:
        with signature_checked_once():
            with signature_checked_once():
                program.validate()

    def check(_: None, where: Any) -> None:
        assert verifier._verify_exported_program_signature is torchs, where
        assert torch_internals._signature_check_depth == 0, where

    points = sweep(lambda: None, run, check, {torch_internals.__file__})
    assert {"signature_checked_once", "signature_checked_once.<locals>.check"} <= {name for name, _, _ in points}
