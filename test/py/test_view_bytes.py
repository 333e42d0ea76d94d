"""``eliminate-view-results`` (issue: eliminate-view-results): results that
are views cost no device memory.  Byte figures are XLA's own, read through
PJRT from the compiled executable, and exact."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch_mlir import passmanager

import hloalias
from hloalias.mlir import new_context, parse_module, print_module
from hloalias.passes import EliminateViewResults, ViewReport
from hloalias.pipeline import DEFAULT_PIPELINE, run_pipeline
from hloalias.runtime.pjrt import MemoryStats

MIB = 2**20
PLAIN_PIPELINE = "builtin.module(canonicalize)"
VIEW_PIPELINE = "builtin.module(eliminate-view-results)"


def seed_example(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The issue's example: the input itself and a view of a slice of it."""
    a = x[0:1024]
    return x, a.view(2, 512)


class ViewsOfAParameter(torch.nn.Module):
    """Three views of one 1024x1024 f32 (4 MiB) parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(1024, 1024))

    def forward(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.weight
        return x.t(), x.view(-1), x[::2]


@pytest.fixture(scope="module")
def seed_input() -> torch.Tensor:
    """A 1024-element f32 input (4096 bytes)."""
    return torch.randn(1024)


@pytest.fixture(scope="module")
def seed_program_text(seed_input: torch.Tensor) -> str:
    """The seed example imported once, as text (each test parses its own)."""
    return hloalias.import_torch(seed_example, (seed_input,)).text


# -- the byte figures, end to end --------------------------------------

def test_seed_example_needs_only_its_argument(seed_input: torch.Tensor) -> None:
    """Both results are views of ``x``: XLA holds x and nothing else."""
    exe = hloalias.compile(seed_example, (seed_input,))
    assert exe.memory_stats == {
        "argument_bytes": 4096,
        "output_bytes": 0,
        "alias_bytes": 0,
        "temp_bytes": 0,
        "total_bytes": 4096,
    }
    assert exe.view_report is not None
    assert {r.key for r in exe.view_report.removed} == {"output:0", "output:1"}
    assert exe.view_report.kept == ()


def test_seed_example_plain_pipeline_copies_both_results(seed_input: torch.Tensor) -> None:
    """Without the pass XLA materializes both results: 4096 argument bytes
    + 4096 + 4096 result bytes + 16 for the tuple's two pointers."""
    exe = hloalias.compile(seed_example, (seed_input,), pipeline=PLAIN_PIPELINE)
    assert exe.memory_stats["total_bytes"] == 12304
    assert exe.memory_stats["output_bytes"] == 2 * 4096 + 2 * 8
    assert exe.view_report is None


def test_views_of_a_parameter_cost_nothing() -> None:
    """``x.t(), x.view(-1), x[::2]`` of a 4 MiB parameter: 4 MiB in all, and
    each result is a real view of the state with eager PyTorch's strides."""
    module = ViewsOfAParameter()
    exe = hloalias.compile(module, ())
    assert exe.memory_stats["total_bytes"] == 4 * MIB == 4194304
    assert exe.memory_stats["output_bytes"] == 0

    got = exe()
    expected = module()
    for got_view, eager_view in zip(got, expected, strict=True):
        assert got_view.shape == eager_view.shape
        assert got_view.stride() == eager_view.stride()
        assert torch.equal(got_view, eager_view.detach())
    # All three share one storage: the parameter's, held by the executable.
    assert len({v.untyped_storage().data_ptr() for v in got}) == 1


def test_views_of_a_parameter_plain_pipeline_copies_ten_mib() -> None:
    """Plain torch-mlir -> XLA materializes the transpose (4 MiB), the
    flattened copy (4 MiB) and the strided slice (2 MiB) beside the 4 MiB
    argument: 14 MiB, plus 24 bytes, measured, for the 3-result tuple's
    pointer table (3 x 8 bytes) -- 14680088 bytes."""
    exe = hloalias.compile(ViewsOfAParameter(), (), pipeline=PLAIN_PIPELINE)
    stats = exe.memory_stats
    assert stats["argument_bytes"] == 4 * MIB
    assert stats["output_bytes"] == 10 * MIB + 3 * 8
    assert stats["total_bytes"] == 14680088
    assert stats["total_bytes"] >= 14 * MIB


# -- three ways to run the pass ------------------------------------------------

RemovalSummary = tuple[str, str, str | None, tuple[int, ...], tuple[int, ...], int, str, tuple[str, ...]]


def _summary(report: ViewReport) -> tuple[tuple[RemovalSummary, ...], tuple[str, ...]]:
    """The report without MLIR objects (element types belong to a context,
    so reports from different contexts never compare equal as objects)."""
    removed = tuple(
        (r.key, r.reason, r.base, r.layout.sizes, r.layout.strides, r.layout.offset,
         str(r.layout.element_type), r.chain)
        for r in report.removed
        if r.layout is not None
    )
    return removed, report.kept


def _by_pipeline_name(module_text: str) -> tuple[str, ViewReport]:
    module = parse_module(module_text, new_context())
    (report,) = run_pipeline(module, VIEW_PIPELINE)
    return print_module(module), report


def _by_apply_on_program(seed_input: torch.Tensor) -> tuple[str, ViewReport]:
    program = hloalias.import_torch(seed_example, (seed_input,))
    report = EliminateViewResults().apply(program.torch_mlir_module)
    return program.text, report


def _by_pass_manager(module_text: str) -> tuple[str, ViewReport]:
    module = parse_module(module_text, new_context())
    reports: list[ViewReport] = []
    with module.context:
        pm = passmanager.PassManager("builtin.module")
        EliminateViewResults().add_to(pm, reports)
        pm.run(module.operation)
    (report,) = reports
    return print_module(module), report


def test_pass_is_usable_three_ways_with_one_result(
    seed_input: torch.Tensor,
    seed_program_text: str,
    xla_memory_of_text: Callable[[str], MemoryStats],
) -> None:
    """By name in a pipeline, ``.apply()`` on a Program's module, and
    ``add_to`` a torch-mlir PassManager give the same module, the same
    report, and XLA's 4096 bytes."""
    text, report = _by_pipeline_name(seed_program_text)
    for other_text, other_report in (
        _by_apply_on_program(seed_input),
        _by_pass_manager(seed_program_text),
    ):
        assert other_text == text
        assert _summary(other_report) == _summary(report)
    assert [(r.key, r.reason, r.base) for r in report.removed] == [
        ("output:0", "pass_through", "arg:0"),
        ("output:1", "view", "arg:0"),
    ]
    stats = xla_memory_of_text(text)
    assert stats.total_bytes == 4096
    assert stats.output_bytes == 0


def test_apply_accepts_a_program_itself(seed_input: torch.Tensor) -> None:
    """A Program may be handed to ``apply`` directly."""
    program = hloalias.import_torch(seed_example, (seed_input,))
    report = EliminateViewResults().apply(program)
    assert len(report.removed) == 2
    assert "hloalias.removed_results" in program.text


def test_pass_failure_in_a_pass_manager_is_an_mlir_error(seed_program_text: str) -> None:
    """Through ``add_to`` a bad option fails the pipeline with a diagnostic
    and leaves the module as it was."""
    module = parse_module(seed_program_text, new_context())
    before = print_module(module)
    with pytest.raises(hloalias.IRError, match="dead-results names result 7"):
        run_pipeline(module, "builtin.module(eliminate-view-results{dead-results=7})")
    assert print_module(module) == before


# -- idempotence ---------------------------------------------------------------

def _mutating_with_views(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x.add_(y)
    return x.t(), y[1:], x, (x * y).view(-1)


@pytest.mark.parametrize("which", ["seed", "mutating_with_views"])
def test_pass_is_idempotent(which: str, seed_program_text: str) -> None:
    """A second run finds nothing more to remove and changes no byte of
    the text (``hloalias.removed_results`` is not extended)."""
    if which == "seed":
        text = seed_program_text
    else:
        text = hloalias.import_torch(_mutating_with_views, (torch.randn(3, 3), torch.randn(3, 3))).text
    module = parse_module(text, new_context())
    first = EliminateViewResults().apply(module)
    once = print_module(module)
    second = EliminateViewResults().apply(module)
    assert print_module(module) == once
    assert first.removed, "the first run must have had something to do"
    assert second.removed == ()
    assert set(second.kept) == set(first.kept)
    # The same through the textual pipeline, run twice in one pipeline.
    twice = parse_module(text, new_context())
    run_pipeline(twice, "builtin.module(eliminate-view-results, eliminate-view-results)")
    assert print_module(twice) == once


# -- views of an overwritten argument's old value --------------------------------

_OVERWRITTEN_TEMPLATE = """
module {{
  func.func @main(%arg0: tensor<4x4xf32> {{hloalias.kind = "user_input", hloalias.name = "x"{arg_extra}}})
      -> (tensor<4x4xf32> {{{first_result_attrs}}},
          tensor<16xf32> {{hloalias.role = "user_output", hloalias.output = 0 : i64}},
          tensor<16xf32> {{hloalias.role = "user_output", hloalias.output = 2 : i64}}) {{
    %0 = stablehlo.add %arg0, %arg0 : tensor<4x4xf32>
    %old_view = stablehlo.reshape %arg0 : (tensor<4x4xf32>) -> tensor<16xf32>
    %new_view = stablehlo.reshape %0 : (tensor<4x4xf32>) -> tensor<16xf32>
    return %0, %old_view, %new_view : tensor<4x4xf32>, tensor<16xf32>, tensor<16xf32>
  }}
}}
"""
_SECOND_OUTPUT = 'hloalias.role = "user_output", hloalias.output = 1 : i64'
_MUTATION_OF_ARG0 = 'hloalias.role = "mutation", hloalias.mutates = 0 : i64'


@pytest.mark.parametrize(
    ("arg_extra", "first_result_attrs", "first_key"),
    [
        ("", _MUTATION_OF_ARG0, "mutation:0"),
        (", tf.aliasing_output = 0 : i32", _SECOND_OUTPUT, "output:1"),
        (", jax.buffer_donor = true", _SECOND_OUTPUT, "output:1"),
    ],
    ids=["mutated", "aliased", "donor"],
)
def test_view_of_overwritten_argument_old_value_stays(
    arg_extra: str,
    first_result_attrs: str,
    first_key: str,
    xla_memory_of_text: Callable[[str], MemoryStats],
) -> None:
    """``x``'s storage will hold something else after the call (its new
    value, or any result XLA puts there), so a view of x's *old* value must
    stay a real result; a view of the *new* value is still removed."""
    text = _OVERWRITTEN_TEMPLATE.format(arg_extra=arg_extra, first_result_attrs=first_result_attrs)
    module = parse_module(text, new_context())
    report = EliminateViewResults().apply(module)
    assert [(r.key, r.base, r.reason) for r in report.removed] == [("output:2", first_key, "view")]
    assert report.kept == (first_key, "output:0")
    printed = print_module(module)
    assert "%1 = stablehlo.reshape %arg0" in printed  # the old-value view survived
    assert "-> (tensor<4x4xf32>" in printed and "tensor<16xf32> {hloalias.output = 0" in printed

    # Through the whole default pipeline and XLA: x (64 bytes) is reused for
    # the 4x4 result, the 16-float old view is a real output.
    module = parse_module(text, new_context())
    run_pipeline(module, DEFAULT_PIPELINE)
    stats = xla_memory_of_text(print_module(module))
    assert (stats.argument_bytes, stats.output_bytes, stats.alias_bytes) == (64, 64 + 64 + 2 * 8, 64)
    assert stats.total_bytes == 144


def test_view_of_argument_nobody_overwrites_is_removed(
    xla_memory_of_text: Callable[[str], MemoryStats],
) -> None:
    """The control for the test above: without a mutation, alias or donor,
    both views go and only the 4x4 result is on device."""
    text = _OVERWRITTEN_TEMPLATE.format(arg_extra="", first_result_attrs=_SECOND_OUTPUT)
    module = parse_module(text, new_context())
    report = EliminateViewResults().apply(module)
    assert {(r.key, r.base) for r in report.removed} == {("output:0", "arg:0"), ("output:2", "output:1")}
    stats = xla_memory_of_text(print_module(module))
    assert (stats.argument_bytes, stats.output_bytes, stats.total_bytes) == (64, 64, 128)


def test_donated_input_view_keeps_old_value_at_runtime() -> None:
    """End to end: ``x`` donated, so ``x.view(-1)`` is computed on device and
    still holds x's value from before the call even though XLA may reuse x."""

    def view_and_double(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.view(-1), x * 2

    x = torch.randn(4, 4)
    exe = hloalias.compile(view_and_double, (x,), donate=(0,))
    assert exe.view_report is not None and exe.alias_report is not None
    assert "output:0" in exe.view_report.kept
    assert exe.alias_report.aliases[0].result_index == 1  # x's buffer holds x * 2
    device_x = exe.to_device(x, name="x")
    flat, doubled = exe(device_x)
    assert torch.equal(flat, x.view(-1))
    assert torch.equal(doubled, x * 2)
