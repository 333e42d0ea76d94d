"""Hostile inputs to the Python API.

Every case gives bad input to a public entry point (``hloalias.mlir``
parsing, the passes' ``apply``, ``hloalias.import_torch``,
``hloalias.compile``, calling an :class:`~hloalias.Executable`) and expects
the documented :class:`~hloalias.HloaliasError` subclass with a message that
names the culprit (``hloalias/errors.py``: "every error hloalias raises on
bad input ... names its culprit").  After each failure the caller's things
are as they were: a module's text (with locations) is unchanged (the passes
validate before they change anything, ``passes/base.py``), and tensors,
module parameters/buffers and an executable's state are equal to clones
taken before.

Cases that fail today because of hloalias bugs are strict xfails, each
with the behaviour the documentation promises."""

from __future__ import annotations

import dataclasses
import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch_mlir import ir

import hloalias
from hloalias import (
    DonatedBufferError,
    DonationError,
    ExecutionError,
    IRError,
    PassError,
    PipelineError,
    TorchImportError,
)
from hloalias.mlir import new_context, parse_module, print_module
from hloalias.passes import AliasDonatedBuffers, EliminateViewResults

# -- helpers ---------------------------------------------------------------


def parse(text: str, allow_unregistered: bool = False) -> ir.Module:
    """``text`` parsed in a fresh context."""
    context = new_context()
    context.allow_unregistered_dialects = allow_unregistered
    return parse_module(text, context)


def module_text(module: Any) -> str:
    """The module's full text, locations included."""
    if hasattr(module, "torch_mlir_module"):
        module = module.torch_mlir_module
    return print_module(module, debug_info=True)


def snapshot(*values: Any) -> list[Any]:
    """Deep copies of tensors (and of the state of modules) for later comparison."""
    copies: list[Any] = []
    for value in values:
        if isinstance(value, torch.nn.Module):
            copies.append({k: v.detach().clone() for k, v in value.state_dict().items()})
        elif isinstance(value, torch.Tensor):
            copies.append(value.detach().clone())
        else:
            copies.append(value)
    return copies


def assert_unchanged(before: list[Any], *values: Any) -> None:
    """Every tensor (or module state) in ``values`` equals its snapshot."""
    for old, value in zip(before, values, strict=True):
        if isinstance(value, torch.nn.Module):
            new_state = value.state_dict()
            assert new_state.keys() == old.keys()
            for key in old:
                assert torch.equal(new_state[key], old[key]), f"module state '{key}' changed"
        elif isinstance(value, torch.Tensor):
            assert torch.equal(value, old), "a caller's tensor changed"


@pytest.fixture(autouse=True)
def _quiet_unused_donation_warnings() -> Iterator[None]:
    """Unusable donations warn by design; the tests that need the warning
    catch it themselves."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable", category=UserWarning)
        yield


# -- malformed MLIR text ----------------------------------------------------

MALFORMED_TEXT = {
    "undeclared_value": (
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  return %b : tensor<2xf32>\n"
        "}\n",
        r"^-:2:10: error: use of undeclared SSA value name",
    ),
    "unknown_custom_op": (
        "module {\n  this is not mlir\n}\n",
        r"^-:2:3: error: custom op 'this' is unknown",
    ),
    "unterminated": (
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  return %a : tensor<2xf32>\n",
        r"^-:2:\d+: error: ",  # MLIR reports the end of input on the last line
    ),
    "return_type_mismatch": (
        "func.func @main(%a: tensor<2xf32>) -> tensor<3xf32> {\n"
        "  return %a : tensor<2xf32>\n"
        "}\n",
        r"^-:2:3: error: type of return operand 0 \('tensor<2xf32>'\) doesn't match function result type",
    ),
    "unregistered_dialect": (
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
        '  %0 = "foo.bar"(%a) : (tensor<2xf32>) -> tensor<2xf32>\n'
        "  return %0 : tensor<2xf32>\n"
        "}\n",
        r"^-:2:\d+: error: operation being parsed with an unregistered dialect",
    ),
    "bad_tensor_type": (
        "func.func @main(%a: tensor<2xwat>) -> tensor<2xwat> {\n  return %a : tensor<2xwat>\n}\n",
        r"^-:1:\d+: error: ",
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_TEXT))
def test_malformed_text_is_an_ir_error_with_line_and_column(name: str) -> None:
    """``parse_module`` turns MLIR's diagnostics into ``IRError`` with ``-:line:col``."""
    text, pattern = MALFORMED_TEXT[name]
    with pytest.raises(IRError) as info:
        parse_module(text, new_context())
    assert re.search(pattern, str(info.value), re.MULTILINE), str(info.value)


def test_parse_error_location_uses_source_name_and_line_offset() -> None:
    """``source_name``/``line_offset`` place the error in the caller's file
    (as ``--split-input-file`` chunks need)."""
    text, _ = MALFORMED_TEXT["undeclared_value"]
    with pytest.raises(IRError) as info:
        parse_module(text, new_context(), source_name="model.mlir", line_offset=40)
    assert str(info.value).startswith("model.mlir:42:10: error: use of undeclared SSA value name")


# -- modules the passes must refuse -----------------------------------------

MAIN_2_RESULTS = (
    "func.func @main(%a: tensor<2xf32>{A}, %c: tensor<2xf32>{C}) -> (tensor<2xf32>, tensor<3xf32>) {{\n"
    "  %0 = stablehlo.add %a, %c : tensor<2xf32>\n"
    "  %1 = stablehlo.constant dense<1.0> : tensor<3xf32>\n"
    "  return %0, %1 : tensor<2xf32>, tensor<3xf32>\n"
    "}}\n"
)


def two_results(a: str = "", c: str = "") -> str:
    """``@main(a, c) -> (a + c, constant)`` with attribute dicts on ``a``/``c``."""
    return MAIN_2_RESULTS.format(A=f" {{{a}}}" if a else "", C=f" {{{c}}}" if c else "")


NO_MAIN = "func.func @other(%a: tensor<2xf32>) -> tensor<2xf32> {\n  return %a : tensor<2xf32>\n}\n"
DYNAMIC = "func.func @main(%a: tensor<?xf32>) -> tensor<?xf32> {\n  return %a : tensor<?xf32>\n}\n"
TOKEN_ARG = (
    "func.func @main(%t: !stablehlo.token{A}, %a: tensor<2xf32>) -> tensor<2xf32> {{\n"
    "  return %a : tensor<2xf32>\n"
    "}}\n"
)
INDEX_ARG = (
    "func.func @main(%i: index {jax.buffer_donor = true}, %a: tensor<2xf32>) -> tensor<2xf32> {\n"
    "  return %a : tensor<2xf32>\n"
    "}\n"
)
MUTATION = (
    "func.func @main(%a: tensor<2xf32> {hloalias.kind = \"user_input\", hloalias.name = \"x\"}) -> "
    "(tensor<2xf32> {hloalias.mutates = 0 : i64, hloalias.role = \"mutation\"}) {\n"
    "  %0 = stablehlo.add %a, %a : tensor<2xf32>\n"
    "  return %0 : tensor<2xf32>\n"
    "}\n"
)


@dataclasses.dataclass(frozen=True)
class PassCase:
    """A module, a pass, the error it must raise and what the message names."""

    text: str
    make_pass: Callable[[], Any]
    error: type[Exception]
    message: str


PASS_CASES = {
    "empty_module_views": PassCase("module {\n}\n", EliminateViewResults, IRError, "no 'func.func @main'"),
    "empty_module_aliases": PassCase("module {\n}\n", AliasDonatedBuffers, IRError, "no 'func.func @main'"),
    "no_main_views": PassCase(NO_MAIN, EliminateViewResults, IRError, "no 'func.func @main'"),
    "no_main_aliases": PassCase(NO_MAIN, AliasDonatedBuffers, IRError, "no 'func.func @main'"),
    "dynamic_result": PassCase(
        DYNAMIC, EliminateViewResults, IRError, "result 0 of @main has dynamic shape tensor<?xf32>"
    ),
    "aliasing_output_out_of_range": PassCase(
        two_results(a="tf.aliasing_output = 5 : i32"), AliasDonatedBuffers, IRError,
        "argument 0 ('arg0'): 'tf.aliasing_output' = 5 is out of range; @main has 2 results",
    ),
    "aliasing_output_negative": PassCase(
        two_results(a="tf.aliasing_output = -1 : i32"), AliasDonatedBuffers, IRError,
        "argument 0 ('arg0'): 'tf.aliasing_output' = -1 is out of range",
    ),
    "aliasing_output_type_mismatch": PassCase(
        two_results(a="tf.aliasing_output = 1 : i32"), AliasDonatedBuffers, IRError,
        "argument 0 ('arg0'): 'tf.aliasing_output' = 1 pairs tensor<2xf32> with result of type tensor<3xf32>",
    ),
    "two_arguments_one_result": PassCase(
        two_results(a="tf.aliasing_output = 0 : i32", c="tf.aliasing_output = 0 : i32"), AliasDonatedBuffers,
        IRError, "argument 1 ('arg1'): 'tf.aliasing_output' = 0, but argument 0 ('arg0') already aliases result 0",
    ),
    "aliasing_output_not_an_integer": PassCase(
        two_results(a='tf.aliasing_output = "zero"'), AliasDonatedBuffers, IRError,
        "'tf.aliasing_output' must be an integer",
    ),
    "buffer_donor_on_token": PassCase(
        TOKEN_ARG.format(A=" {jax.buffer_donor = true}"), AliasDonatedBuffers, IRError,
        "argument 0 ('arg0') has type !stablehlo.token: only ranked tensors are supported",
    ),
    "buffer_donor_on_index": PassCase(
        INDEX_ARG, AliasDonatedBuffers, IRError, "argument 0 ('arg0') has type index: only ranked tensors are supported"
    ),
    "donate_unknown_name": PassCase(
        two_results(), lambda: AliasDonatedBuffers(donate=("nope",)), PassError,
        "donate names unknown argument 'nope' (arguments: arg0, arg1)",
    ),
    "donate_same_argument_twice": PassCase(
        two_results(), lambda: AliasDonatedBuffers(donate=("0", "0")), PassError,
        "argument 0 ('arg0') is donated twice",
    ),
    "donate_index_and_name_of_one_argument": PassCase(
        MUTATION, lambda: AliasDonatedBuffers(donate=("0", "x")), PassError, "argument 0 ('x') is donated twice",
    ),
    "donate_out_of_range": PassCase(
        two_results(), lambda: AliasDonatedBuffers(donate=("7",)), PassError,
        "donate names argument 7, but @main has 2 arguments",
    ),
    "exclude_unknown_kind": PassCase(
        two_results(), lambda: AliasDonatedBuffers(exclude_kinds=("weights",)), PassError,
        "exclude-kinds has unknown kind 'weights'",
    ),
    "dead_result_out_of_range": PassCase(
        two_results(), lambda: EliminateViewResults(dead_results=(2,)), PassError,
        "dead-results names result 2, but @main has 2 results",
    ),
    "dead_result_twice": PassCase(
        two_results(), lambda: EliminateViewResults(dead_results=(1, 1)), PassError,
        "dead-results names result 1 twice",
    ),
    "dead_mutation": PassCase(
        MUTATION, lambda: EliminateViewResults(dead_results=(0,)), PassError,
        "result 0 is the new value of mutated argument 0 ('x') and cannot be dead",
    ),
    "mutation_of_missing_argument": PassCase(
        MUTATION.replace("hloalias.mutates = 0", "hloalias.mutates = 3"), EliminateViewResults, IRError,
        "result 0 of @main: 'hloalias.mutates' is 3; @main has 1 arguments",
    ),
}


@pytest.mark.parametrize("name", sorted(PASS_CASES))
def test_pass_refuses_bad_module_and_leaves_it_unchanged(name: str) -> None:
    """Each refusal names the culprit; the module is exactly as before."""
    case = PASS_CASES[name]
    module = parse(case.text)
    before = module_text(module)
    with pytest.raises(case.error) as info:
        case.make_pass().apply(module)
    assert case.message in str(info.value)
    assert module_text(module) == before


def test_torch_dialect_program_is_refused_by_eliminate_view_results() -> None:
    """A program imported at ``Stage.TORCH`` is not StableHLO: IRError naming
    the result whose type is not a ranked tensor; the program is unchanged."""
    program = hloalias.import_torch(lambda x: (x[0], x + 1), (torch.randn(2, 3),), stage=hloalias.Stage.TORCH)
    before = module_text(program)
    with pytest.raises(IRError, match=r"result 0 of @main has type !torch\.vtensor<\[3\],f32>: only ranked tensors"):
        EliminateViewResults().apply(program)
    assert module_text(program) == before


def test_torch_dialect_program_is_refused_by_alias_donated_buffers() -> None:
    """Donating an argument of type ``!torch.vtensor`` is an IRError naming
    the argument (not a ValueError from the MLIR bindings)."""
    program = hloalias.import_torch(lambda x: (x[0], x + 1), (torch.randn(2, 3),), stage=hloalias.Stage.TORCH)
    before = module_text(program)
    with pytest.raises(IRError, match=r"argument 0 \('x'\)"):
        AliasDonatedBuffers(donate=("x",)).apply(program)
    assert module_text(program) == before


def test_donating_a_dynamic_argument_is_an_ir_error() -> None:
    """``tensor<?xf32>`` has no byte size: donating it is refused (it was
    once aliased, the report claiming -36893488147419103232 bytes)."""
    module = parse(DYNAMIC)
    before = module_text(module)
    with pytest.raises(IRError, match=r"argument 0 \('arg0'\) has dynamic shape tensor<\?xf32>"):
        AliasDonatedBuffers(donate=("0",)).apply(module)
    assert module_text(module) == before


def test_donate_option_naming_a_token_is_refused() -> None:
    """The donate option is checked like a ``jax.buffer_donor`` in the IR:
    a token is not a tensor (writing ``jax.buffer_donor`` onto it would
    produce a module the pass itself refuses)."""
    module = parse(TOKEN_ARG.format(A=""))
    before = module_text(module)
    with pytest.raises(IRError, match=r"argument 0 \('arg0'\) has type !stablehlo.token"):
        AliasDonatedBuffers(donate=("0",)).apply(module)
    assert module_text(module) == before


UNREGISTERED_UNUSED = (
    "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
    '  %0 = "foo.effect"(%a) : (tensor<2xf32>) -> tensor<2xf32>\n'
    "  %1 = stablehlo.add %a, %a : tensor<2xf32>\n"
    "  return %1 : tensor<2xf32>\n"
    "}\n"
)


def test_ops_of_an_unhandled_dialect_are_opaque_to_alias_donated_buffers() -> None:
    """An op hloalias does not know (allowed in the context) is neither an
    error nor touched by ``alias-donated-buffers``."""
    module = parse(UNREGISTERED_UNUSED, allow_unregistered=True)
    report = AliasDonatedBuffers(donate=("0",)).apply(module)
    assert '"foo.effect"' in module_text(module)
    assert [alias.arg_index for alias in report.aliases] == [0]


def test_ops_of_an_unhandled_dialect_are_kept_or_refused_by_eliminate_view_results() -> None:
    """An unregistered op may have effects MLIR cannot see, so MLIR's own
    dead-code rules never erase one.  ``eliminate-view-results`` must keep
    it (or refuse the module naming it)."""
    module = parse(UNREGISTERED_UNUSED, allow_unregistered=True)
    try:
        EliminateViewResults().apply(module)
    except IRError as error:
        assert "foo.effect" in str(error)
        return
    assert '"foo.effect"' in module_text(module)


def test_pass_error_in_a_pipeline_leaves_the_module_unchanged() -> None:
    """Through a textual pipeline the PassError becomes an IRError with the
    same message, and the module is unchanged."""
    from hloalias.pipeline import run_pipeline

    module = parse(two_results(a="tf.aliasing_output = 5 : i32"))
    before = module_text(module)
    with pytest.raises(IRError, match=r"'tf.aliasing_output' = 5 is out of range"):
        run_pipeline(module, "builtin.module(eliminate-view-results, alias-donated-buffers)")
    assert module_text(module) == before


# -- compile: bad donations, devices, pipelines ------------------------------


class MutatingModule(torch.nn.Module):
    """Mutates its input and its buffer, so that a failed compile that ran
    the program for real would be visible in the caller's tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(2, 3))
        self.count: torch.Tensor
        self.register_buffer("count", torch.zeros(2, 3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.count.add_(1.0)
        x.mul_(2.0)
        return x + y * self.weight, x[0]


COMPILE_CASES: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "unknown_name": ({"donate": ["z"]}, DonationError, "donate names unknown tensor 'z' (known: weight, count, x, y)"),
    "same_position_twice": ({"donate": [0, 0]}, DonationError, "'x' is donated twice"),
    "position_and_name_of_one_input": ({"donate": [1, "y"]}, DonationError, "'y' is donated twice"),
    "state_name_twice": ({"donate": ["count", "count"]}, DonationError, "'count' is donated twice"),
    "position_out_of_range": ({"donate": [2]}, DonationError, "donate names user input 2, but the program has 2 user inputs"),
    "negative_position": ({"donate": [-1]}, DonationError, "donate names user input -1"),
    "bool_entry": ({"donate": [True]}, DonationError, "donate entries are positions or names, got True"),
    "float_entry": ({"donate": [0.0]}, DonationError, "donate entries are positions or names, got 0.0"),
    "missing_tpu": ({"device": "tpu"}, ExecutionError, "no PJRT device for platform 'tpu'"),
    "not_a_device": ({"device": 3}, ExecutionError, "cannot use 3 as a device"),
    "unknown_pass": ({"pipeline": "builtin.module(no-such-pass)"}, PipelineError, "no-such-pass"),
    "unanchored_pipeline": ({"pipeline": "eliminate-view-results"}, PipelineError, "builtin.module(...)"),
    "bad_pass_option": (
        {"pipeline": "builtin.module(alias-donated-buffers{donate=nope})"}, IRError, "donate names unknown argument 'nope'"
    ),
}


@pytest.mark.parametrize("name", sorted(COMPILE_CASES))
def test_compile_refuses_and_leaves_inputs_and_module_unchanged(name: str) -> None:
    """``compile`` raises the documented error naming the culprit; the
    example inputs and the module's parameters and buffers are unchanged."""
    options, error, message = COMPILE_CASES[name]
    module = MutatingModule()
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    before = snapshot(module, x, y)
    with pytest.raises(error) as info:
        hloalias.compile(module, (x, y), **options)
    assert message in str(info.value)
    assert_unchanged(before, module, x, y)


def test_donated_lifted_constant_is_refused() -> None:
    """A lifted tensor constant is not the caller's to donate."""

    class WithConstant(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.offset = torch.ones(2, 3)  # neither parameter nor buffer: lifted constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.offset

    module = WithConstant()
    x = torch.randn(2, 3)
    before = snapshot(x, module.offset)
    with pytest.raises(DonationError, match="'offset' is a lifted constant and cannot be donated"):
        hloalias.compile(module, (x,), donate=["offset"])
    assert_unchanged(before, x, module.offset)


# -- torch import errors ----------------------------------------------------


def _dynamic_batch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def _embedding_then_complex_scale(w: torch.Tensor, i: torch.Tensor, x: torch.Tensor) -> Any:
    embedded = torch.nn.functional.embedding(i, w)
    rotation = torch.polar(torch.ones_like(x), x)
    scaled = rotation * 2.0
    return embedded, torch.view_as_real(scaled)


_COMPLEX_SCALE_LINE = inspect.getsourcelines(_embedding_then_complex_scale)[1] + 3


IMPORT_CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str]] = {
    "dynamic_shapes": (
        _dynamic_batch, (torch.randn(4, 3), torch.randn(4, 3)),
        {"dynamic_shapes": ({0: torch.export.Dim("batch", min=2)}, {0: torch.export.Dim("batch", min=2)})},
        "input 'x' has dynamic dimension 0",
    ),
    # A non-tensor input (int, bool, str) is static since issue 12: test_models.py tests it.
    "scalar_output": (lambda x: x.sum().item(), (torch.randn(2, 3),), {}, "result output:0 is SymFloat, not a tensor"),
    "data_dependent_output_shape": (
        lambda x: torch.nonzero(x), (torch.randn(2, 3),), {},
        "result output:0 has dynamic dimension 0 (u0): its size depends on the input's values",
    ),
    "unknown_output_type": (
        lambda x: ValueError(x), (torch.randn(2, 3),), {}, "torch.export failed for",
    ),
    # cache[:, pos] with a 0-d tensor pos: pos.item() in the trace.
    "tensor_value_used_as_index": (
        lambda cache, new, pos: cache[:, pos].copy_(new),
        (torch.zeros(2, 8, 4), torch.randn(2, 4), torch.tensor(3)), {},
        "uses a tensor's value as a Python number",
    ),
    # A host read the program computes with: torch.export traces it, and
    # torch-mlir lowers it to tensor.extract, which XLA refused later with
    # "failed to serialize module" (a CompileError naming nothing).
    "item_in_forward": (
        lambda x: x * x.sum().item(), (torch.randn(2, 3),), {},
        "reads a traced tensor's value on the host (.item(), float(t), int(t)) at ",
    ),
    # torch-mlir does not know silu_backward (a torch.operator): the message
    # names it, not the embedding before it, which lowers fine.
    "op_torch_mlir_cannot_lower": (
        lambda w, i, x: torch.ops.aten.silu_backward(torch.nn.functional.embedding(i, w), x),
        (torch.randn(10, 4), torch.tensor([1, 2]), torch.randn(2, 4)), {},
        "torch-mlir cannot lower aten.silu_backward to the torch backend contract",
    ),
    # Complex arithmetic after an embedding (DeepSeek-V2's rotary: polar,
    # then `freqs_cis * scaling`): the conversion's diagnostics name the
    # complex `mul`; the embedding, the module's first op, lowers fine and
    # was named before.
    "complex_arithmetic": (
        _embedding_then_complex_scale,
        (torch.randn(10, 4), torch.tensor([1, 2]), torch.randn(3, 4)), {},
        "torch-mlir cannot lower aten.mul.Scalar on complex values to the StableHLO (from ",
    ),
}


def test_complex_arithmetic_names_the_complex_line() -> None:
    """The refusal of a complex ``mul`` names this file's line of it, not
    the line of the program's first op (the embedding)."""
    args = (torch.randn(10, 4), torch.tensor([1, 2]), torch.randn(3, 4))
    with pytest.raises(TorchImportError) as info:
        hloalias.import_torch(_embedding_then_complex_scale, args)
    headline = str(info.value).splitlines()[0]
    assert f"{__file__}:{_COMPLEX_SCALE_LINE} in _embedding_then_complex_scale" in headline
    assert "aten.embedding" not in headline


def _mismatched_cat(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, y], dim=-1)


def test_export_shape_error_names_the_programs_line() -> None:
    """A torch error raised while exporting the program (LongT5's
    ``torch.cat`` of a position bias traced with another batch size) names
    the program's line it was raised at, as compile_training_step does;
    the message used to carry torch's text alone."""
    with pytest.raises(TorchImportError) as info:
        hloalias.import_torch(_mismatched_cat, (torch.randn(1, 3), torch.randn(2, 3)))
    line = inspect.getsourcelines(_mismatched_cat)[1] + 1
    assert f"at {__file__}:{line} in _mismatched_cat: return torch.cat([x, y], dim=-1)" in str(info.value)
    assert "Sizes of tensors must match" in str(info.value)


@pytest.mark.parametrize("name", sorted(IMPORT_CASES))
def test_import_errors_name_the_culprit(name: str) -> None:
    """``import_torch`` raises TorchImportError naming the input or result; the
    example inputs are unchanged."""
    function, args, kwargs, message = IMPORT_CASES[name]
    before = snapshot(*args)
    with pytest.raises(TorchImportError) as info:
        hloalias.import_torch(function, args, **kwargs)
    assert message in str(info.value)
    assert_unchanged(before, *args)


def _scaled_by_its_sum(x: torch.Tensor) -> torch.Tensor:
    total = x.sum().item()
    return x * total


def test_item_in_forward_names_the_users_line() -> None:
    """``compile`` of a forward that computes with ``.item()``: a
    TorchImportError naming this file and the line of the ``.item()``, as
    ``compile_training_step`` does, not XLA's "failed to serialize module"."""
    x = torch.randn(2, 3)
    before = snapshot(x)
    line = _scaled_by_its_sum.__code__.co_firstlineno + 1
    with pytest.raises(TorchImportError) as info:
        hloalias.compile(_scaled_by_its_sum, (x,))
    message = str(info.value)
    assert f"{__file__}:{line} in _scaled_by_its_sum: total = x.sum().item()" in message
    assert "serialize" not in message
    assert not isinstance(info.value, hloalias.CompileError)
    assert_unchanged(before, x)


def test_stack_trace_anchor_private_name_is_still_there() -> None:
    """``torch_internals.keep_stack_traces_of`` uses torch's private
    ``torch.fx.proxy._register_stack_trace_anchor`` (without it, errors of
    compiled plain functions name no line): pinned for torch upgrades."""
    import torch.fx.proxy

    assert callable(getattr(torch.fx.proxy, "_register_stack_trace_anchor", None))


ALIASED_EXAMPLES: dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]], tuple[str, str]]] = {
    "same_tensor_twice": (lambda a, b: a.add_(b), lambda: (torch.ones(4),) * 2, ("a", "b")),
    "row_of_the_other": (lambda a, b: a.add_(1.0) + b, lambda: (lambda t: (t, t[0]))(torch.ones(4, 4)), ("a", "b")),
    "inside_a_list": (lambda xs: xs[0].add_(xs[1]), lambda: ([torch.ones(4)] * 2,), ("xs_0", "xs_1")),
    # Rows of one base that overlap, one written through a slice: torch.export
    # failed with "Expected !size_bytes_is_heap_allocated_" (what
    # torch.compile's graphs met with such inputs).
    "overlapping_rows": (
        lambda a, b: (b[:, 1:3].mul_(2.0), a + 1)[1],
        lambda: (lambda t: (t[0:4], t[2:6]))(torch.arange(36.0).reshape(6, 6)), ("a", "b"),
    ),
}


@pytest.mark.parametrize("name", sorted(ALIASED_EXAMPLES))
def test_aliased_example_inputs_compile_and_such_calls_are_refused(name: str) -> None:
    """Example inputs that share memory, one written in place: torch.export
    cannot trace them (a raw error from inside torch), and the program does
    not depend on it.  The import traces copies; a call with inputs that
    share memory is refused naming both, changing nothing; separate inputs
    run as eager does."""
    function, make_inputs, (first, second) = ALIASED_EXAMPLES[name]
    inputs = make_inputs()
    before = snapshot(*torch.utils._pytree.tree_leaves(inputs))
    exe = hloalias.compile(function, inputs)
    assert_unchanged(before, *torch.utils._pytree.tree_leaves(inputs))
    with pytest.raises(ExecutionError, match="share memory") as info:
        exe(*inputs)
    assert f"'{first}'" in str(info.value) and f"'{second}'" in str(info.value)
    assert_unchanged(before, *torch.utils._pytree.tree_leaves(inputs))
    separate = torch.utils._pytree.tree_map(lambda t: t.clone(), inputs)
    expected = torch.utils._pytree.tree_map(lambda t: t.clone(), inputs)
    torch.testing.assert_close(exe(*separate), function(*expected), rtol=0, atol=0)
    torch.testing.assert_close(separate, expected, rtol=0, atol=0)


def test_example_input_aliasing_module_state_is_named() -> None:
    class AddsInput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("total", torch.ones(4))

        def forward(self, a: torch.Tensor) -> torch.Tensor:
            self.total.add_(a)
            return self.total * 2

    module = AddsInput()
    with pytest.raises(TorchImportError, match=r"^example inputs share memory \(state 'total' and input 'a'"):
        hloalias.compile(module, (module.total,))
    assert torch.equal(module.total, torch.ones(4))


def test_aliased_example_inputs_that_are_only_read_still_compile() -> None:
    """No write, no refusal: the pair is read twice, as eager reads it."""
    x = torch.randn(4)
    executable = hloalias.compile(lambda a, b: a * b, (x, x))
    torch.testing.assert_close(executable(x, x), x * x, rtol=0, atol=0)


def _write_first_row(a: torch.Tensor) -> torch.Tensor:
    a[0].add_(1.0)
    return a.sum()


def test_write_to_an_expanded_input_is_refused_with_what_eager_does() -> None:
    """Eager PyTorch (pinned here) writes one row of an expansion and every
    row sees it (the sum is 12, not 4), and refuses a write whose own
    elements overlap.  The compiled program cannot do the first, so it
    refuses both, and the message says what eager does instead of the
    untrue "eager PyTorch refuses this too"."""
    base = torch.zeros(4)
    assert _write_first_row(base.expand(3, 4)).item() == 12.0
    assert torch.equal(base, torch.ones(4))
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers to a single"):
        torch.zeros(4).expand(3, 4)[:, 0].add_(1.0)

    executable = hloalias.compile(_write_first_row, (torch.zeros(3, 4),))
    base = torch.zeros(4)
    with pytest.raises(ExecutionError) as info:
        executable(base.expand(3, 4))
    message = str(info.value)
    assert "refuses this too" not in message
    assert message.startswith("input 'a' is an expanded tensor (elements share memory")
    assert "otherwise changes every element that shares memory with a written one" in message
    assert torch.equal(base, torch.zeros(4))
    torch.testing.assert_close(executable(torch.zeros(3, 4)), torch.tensor(4.0))


def test_strided_copy_imports_as_a_clone() -> None:
    """``prims.copy_strided`` (torch's decompositions emit it to keep eager's
    strides) is unknown to torch-mlir; in value semantics it is a clone."""
    x = torch.randn(4, 3)

    def f(t: torch.Tensor) -> torch.Tensor:
        return torch.ops.prims.copy_strided(t * 2, [1, 4]) + 1

    executable = hloalias.compile(f, (x,))
    torch.testing.assert_close(executable(x), f(x), rtol=0, atol=0)


def test_import_of_something_not_callable() -> None:
    """Neither module, function nor ExportedProgram: TorchImportError naming its type."""
    with pytest.raises(TorchImportError, match="expected an nn.Module, a function or an ExportedProgram, got int"):
        hloalias.import_torch(3, (torch.randn(2),))  # type: ignore[arg-type]


def test_compile_reports_import_errors_too() -> None:
    """``compile`` goes through the importer: the same error, inputs unchanged."""
    x = torch.randn(2, 3)
    before = snapshot(x)
    with pytest.raises(TorchImportError, match="result output:0 is SymFloat, not a tensor"):
        hloalias.compile(lambda t: t.mul_(2.0).sum().item(), (x,))
    assert_unchanged(before, x)


# -- calling an executable with bad inputs ----------------------------------


@pytest.fixture(scope="module")
def mutating_executable() -> hloalias.Executable:
    """``MutatingModule`` compiled for two f32[2, 3] inputs."""
    torch.manual_seed(0)
    return hloalias.compile(MutatingModule(), (torch.randn(2, 3), torch.randn(2, 3)))


BAD_CALLS: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], tuple[Any, ...]], str]] = {
    "wrong_shape": (
        lambda x, y: (x, torch.randn(3, 3)),
        "input 'y' is torch.float32 [3, 3], but the program was compiled for torch.float32 [2, 3]",
    ),
    "wrong_dtype": (
        lambda x, y: (x, y.double()),
        "input 'y' is torch.float64 [2, 3], but the program was compiled for torch.float32 [2, 3]",
    ),
    "non_tensor": (lambda x, y: (x, 3), "input 'y' is int, expected a torch.Tensor or DeviceTensor"),
    "missing_input": (lambda x, y: (x,), "inputs do not have the structure the program was compiled for"),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_call_changes_nothing(mutating_executable: hloalias.Executable, name: str) -> None:
    """A refused call mutates neither its (valid) inputs nor the executable's
    state, and the next good call still matches eager."""
    make_args, message = BAD_CALLS[name]
    exe = mutating_executable
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    state_before = exe.state_dict()
    args = make_args(x, y)
    before = snapshot(x, y)
    with pytest.raises(ExecutionError) as info:
        exe(*args)
    assert message in str(info.value)
    assert_unchanged(before, x, y)
    state_after = exe.state_dict()
    assert all(torch.equal(state_after[k], state_before[k]) for k in state_before)

    eager = MutatingModule()
    eager.load_state_dict(state_before)
    eager_x, eager_y = x.clone(), y.clone()
    expected = eager(eager_x, eager_y)
    got = exe(x, y)
    assert all(torch.equal(e, g) for e, g in zip(expected, got))
    assert torch.equal(x, eager_x)
    assert torch.equal(exe.state_dict()["count"], eager.count)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"nope": torch.zeros(2, 3)}, "load_state_dict: unknown state 'nope'"),
        ({"count": torch.zeros(2, 3), "weight": torch.zeros(3, 3)}, "input 'weight' is torch.float32 [3, 3]"),
        ({"count": torch.zeros(2, 3, dtype=torch.int32)}, "input 'count' is torch.int32 [2, 3]"),
    ],
    ids=["unknown_name", "one_good_one_wrong_shape", "wrong_dtype"],
)
def test_bad_state_dict_changes_no_state(
    mutating_executable: hloalias.Executable, state: dict[str, torch.Tensor], message: str
) -> None:
    """``load_state_dict`` checks every entry before it replaces any."""
    exe = mutating_executable
    before = exe.state_dict()
    with pytest.raises(ExecutionError) as info:
        exe.load_state_dict(state)
    assert message in str(info.value)
    after = exe.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)


# -- donating the base of a returned view ------------------------------------


def views_of_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two views of the input, neither of its type (no result to alias)."""
    return x[0], x.t()


def test_donated_view_base_keeps_the_views_on_the_device() -> None:
    """Donating ``x`` whose views are returned: the views stay real results
    (``eliminate-view-results`` docstring: a view of an argument the program
    overwrites - here ``jax.buffer_donor`` - stays a real result), the report
    says why the donation was not turned into an alias, and after the call,
    which consumes the donated device buffer, the views are still right."""
    x = torch.randn(2, 3)
    exe = hloalias.compile(views_of_x, (x.clone(),), donate=["x"])
    assert exe.view_report is not None
    assert not [r for r in exe.view_report.removed if r.base == "arg:0"]
    assert set(exe.view_report.kept) == {"output:0", "output:1"}
    assert exe.alias_report is not None
    [unused] = exe.alias_report.unused
    assert (unused.arg_name, unused.origin) == ("x", "explicit")
    assert "no free result of type tensor<2x3xf32>" in unused.reason
    assert unused.kept_as_donor

    donated = exe.to_device(x, name="x")
    first, second = exe(donated)
    with pytest.raises(DonatedBufferError, match="device tensor 'x' was donated in call 1"):
        donated.to_torch()
    assert torch.equal(first, x[0]) and torch.equal(second, x.t())


def test_donating_a_rebuilt_views_base_is_reported_unused() -> None:
    """Run by hand in the other order (views removed first, then a
    donation): the donated argument is the base of a rebuilt view, so it is
    not aliased, the report says so and a UserWarning names it."""
    program = hloalias.import_torch(lambda x: (x + 1.0, x[0]), (torch.randn(2, 3),))
    view_report = EliminateViewResults().apply(program)
    assert [(r.key, r.base) for r in view_report.removed] == [("output:1", "arg:0")]
    with pytest.warns(UserWarning, match=r"Some donated buffers were not usable: 'x' \(its old value is the base"):
        report = AliasDonatedBuffers(donate=("x",)).apply(program)
    assert report.aliases == ()
    [unused] = report.unused
    assert unused.reason == "its old value is the base of rebuilt view output:1"
    assert not unused.kept_as_donor
    assert "tf.aliasing_output" not in program.text and "jax.buffer_donor" not in program.text


def test_donating_an_argument_returned_unchanged_is_reported_unused() -> None:
    """Same for a pass-through: ``x`` comes back as itself, rebuilt from its
    buffer after the call, so that buffer must survive."""
    program = hloalias.import_torch(lambda x: (x + 1.0, x), (torch.randn(2, 3),))
    EliminateViewResults().apply(program)
    report = AliasDonatedBuffers(donate=("0",)).apply(program)
    [unused] = report.unused
    assert unused.reason.startswith("it is returned unchanged (output:1")
    assert "tf.aliasing_output" not in program.text


# -- training steps: errors name the user's arguments and keys ---------------


@pytest.fixture(scope="module")
def training_step() -> tuple[Any, torch.nn.Module, torch.optim.Optimizer]:
    """An MLP's SGD-with-momentum step compiled for a (6, 8) / (6, 4) batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(features), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    compiled = hloalias.compile_training_step(step, model, optimizer, (torch.randn(6, 8), torch.randn(6, 4)))
    return compiled, model, optimizer


@pytest.mark.parametrize(
    ("make_batch", "message"),
    [
        (lambda: (torch.randn(5, 8), torch.randn(6, 4)), "input 'features' is torch.float32 [5, 8]"),
        (lambda: (torch.randn(6, 8), torch.randn(6, 4).double()), "input 'targets' is torch.float64 [6, 4]"),
    ],
    ids=["features_shape", "targets_dtype"],
)
def test_training_step_errors_name_the_step_argument(
    training_step: tuple[Any, torch.nn.Module, torch.optim.Optimizer],
    make_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    message: str,
) -> None:
    """The step's inputs are named after ``step_fn``'s parameters, not the
    captured program's internal ``inputs_1``, ``inputs_2``."""
    compiled, _model, _optimizer = training_step
    with pytest.raises(ExecutionError) as info:
        compiled(*make_batch())
    assert message in str(info.value)
    assert "inputs_" not in str(info.value)


def test_training_step_input_names_follow_nested_and_variadic_arguments() -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(pair: tuple[torch.Tensor, torch.Tensor], *rest: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(pair[0]), pair[1]) + rest[0].sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    batch = ((torch.randn(3, 4), torch.randn(3, 2)), torch.randn(2))
    compiled = hloalias.compile_training_step(step, model, optimizer, batch)
    with pytest.raises(ExecutionError, match=r"^input 'rest_1' is torch.float32 \[3\]"):
        compiled(batch[0], torch.randn(3))
    with pytest.raises(ExecutionError, match=r"^input 'pair_1' is torch.float32 \[3, 3\]"):
        compiled((batch[0][0], torch.randn(3, 3)), batch[1])


def _unknown_model_key(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "model": {**state["model"], "3.weight": torch.zeros(4, 16)}}


def _unknown_parameter_index(state: dict[str, Any]) -> dict[str, Any]:
    optimizer = state["optimizer"]
    return {**state, "optimizer": {**optimizer, "state": {**optimizer["state"], 7: {"momentum_buffer": torch.zeros(4)}}}}


def _unknown_optimizer_key(state: dict[str, Any]) -> dict[str, Any]:
    optimizer = state["optimizer"]
    entries = {**optimizer["state"][0], "exp_avg": torch.zeros(16, 8)}
    return {**state, "optimizer": {**optimizer, "state": {**optimizer["state"], 0: entries}}}


def _wrong_shape(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "model": {**state["model"], "2.weight": torch.zeros(16, 4)}}


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda state: {**state, "scheduler": {}}, "load_state_dict: the state has unexpected key(s) 'scheduler'"),
        (_unknown_model_key, "load_state_dict: 'model' has unexpected key(s) '3.weight'"),
        (_unknown_parameter_index, "load_state_dict: optimizer 'state' (by parameter index) has unexpected key(s) 7"),
        (_unknown_optimizer_key, "load_state_dict: optimizer state of parameter 0 has unexpected key(s) 'exp_avg'"),
        (_wrong_shape, "load_state_dict: model state '2.weight' is torch.float32 [16, 4], the step was compiled for torch.float32 [4, 16]"),
        (lambda state: {**state, "grads": {"0.weight": torch.zeros(16, 8)}}, "load_state_dict: 'grads' (kept gradients) has unexpected key(s) '0.weight' (expected: none)"),
    ],
    ids=["top_level", "model_key", "parameter_index", "optimizer_key", "wrong_shape", "grads_of_a_step_that_keeps_none"],
)
def test_training_step_load_state_dict_is_strict(
    training_step: tuple[Any, torch.nn.Module, torch.optim.Optimizer],
    corrupt: Callable[[dict[str, Any]], dict[str, Any]],
    message: str,
) -> None:
    """Like torch's ``load_state_dict(strict=True)``: a key the step would
    ignore is refused, named, before anything changes (torch refuses an
    unexpected model key the same way: pinned below)."""
    compiled, model, _optimizer = training_step
    state = compiled.state_dict()
    good = {**state, "model": {k: v + 1 for k, v in state["model"].items()}}
    with pytest.raises(ExecutionError) as info:
        compiled.load_state_dict(corrupt(good))
    assert message in str(info.value)
    after = compiled.state_dict()
    for key, value in state["model"].items():
        assert torch.equal(after["model"][key], value), key
    for index, entries in state["optimizer"]["state"].items():
        for key, value in entries.items():
            assert torch.equal(after["optimizer"]["state"][index][key], value), (index, key)

    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "3.weight"'):
        eager.load_state_dict(_unknown_model_key(state)["model"])


# -- indices are ASCII digits; booleans are not integers ---------------------


@pytest.mark.parametrize("text", ["\u0663", "\u0969", "\u00b2", "1\u0660", "-1", ""])
def test_index_spellings_other_than_ascii_digits_are_refused(text: str) -> None:
    """``str.isdigit`` accepts '٣' (Arabic-Indic), '३' (Devanagari), '²'
    and ``int`` reads the first two as 3: an option ``donate=٣`` donated
    argument 3.  Keys, layouts and options now refuse them."""
    from hloalias.attributes import is_index, parse_key
    from hloalias.contract import StoredLayout

    assert not is_index(text)
    with pytest.raises(ValueError):
        parse_key(f"output:{text}")
    with pytest.raises(ValueError):
        StoredLayout.from_spec(f"0.{text}")
    with pytest.raises(PassError, match="expects a comma-separated list of integers"):
        EliminateViewResults.from_options(f"dead-results={text or ','}x")
    with pytest.raises(PassError, match=f"donate names unknown argument '{re.escape(text)}'"):
        AliasDonatedBuffers(donate=(text,)).apply(parse(BOOL_ALIAS.replace("true", "0 : i32")))


BOOL_ALIAS = """
func.func @main(%a: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "a", tf.aliasing_output = true}) -> (tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}) {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def test_boolean_aliasing_output_is_named_as_a_boolean() -> None:
    """``tf.aliasing_output = true`` is an i1 whose signed value is -1: it was
    reported as "'tf.aliasing_output' = -1 is out of range"."""
    module = parse(BOOL_ALIAS)
    before = module_text(module)
    with pytest.raises(IRError, match="^argument 0: 'tf.aliasing_output' must be an integer, got the boolean true$"):
        AliasDonatedBuffers().apply(module)
    assert module_text(module) == before
