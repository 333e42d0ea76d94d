"""The pass registry, pass options, ``--list-passes`` and pipeline parsing:
everything that names passes, without compiling anything."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import subprocess
import sys

import pytest

import hloalias
from hloalias.mlir import new_context, parse_module, print_module
from hloalias.passes import (
    AliasDonatedBuffers,
    EliminateViewResults,
    ModulePass,
    RecomputeForLateReaders,
    get_all_passes,
)
from hloalias.pipeline import DEFAULT_PIPELINE, PipelineElement, parse_pipeline
from hloalias.tools import opt

EXPECTED_PASS_NAMES = {
    "eliminate-view-results",
    "alias-donated-buffers",
    "fold-transpose-into-dot-general",
    "fold-broadcast-into-dot-general",
    "fold-repeat-into-dot-general",
    "widen-one-row-updates",
    "accumulate-bf16-dots-in-f32",
    "bitcast-overwrite-scatter",
    "window-scatter-indices",
    "window-gather-indices",
    "elementwise-in-producer-shape",
    "scatter-to-dynamic-update-slice",
    "select-to-dynamic-update-slice",
    "returned-matvec-as-reduce",
    "order-in-place-updates",
    "permute-conv-kernel-state",
    "reduce-window-in-conv-layout",
    "store-state-as-bits",
    "recompute-shared-activations",
    "one-hot-scatter-as-select",
    "recompute-for-late-readers",
    "narrow-scatter-indices",
}


def test_registry_holds_every_pass() -> None:
    """Exactly hloalias's passes are registered."""
    assert set(get_all_passes()) == EXPECTED_PASS_NAMES


@pytest.mark.parametrize("registered_name", sorted(EXPECTED_PASS_NAMES))
def test_registry_key_is_the_name_of_the_pass_built(registered_name: str) -> None:
    """A pipeline element naming a pass must build that very pass."""
    factory = get_all_passes()[registered_name]
    built = factory("")
    assert isinstance(built, ModulePass)
    assert built.name == registered_name
    # No options given: every option keeps its default.
    assert built.option_text() == registered_name


def test_list_passes_prints_every_pass_and_option() -> None:
    """``hloalias-opt --list-passes`` lists each pass with all its options."""
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        exit_code = opt.main(["--list-passes"])
    assert exit_code == 0
    listing = captured.getvalue()
    listed_names = {
        line.split(":", 1)[0] for line in listing.splitlines() if line and not line.startswith(" ")
    }
    assert listed_names == set(get_all_passes())
    for name, factory in get_all_passes().items():
        for option in type(factory("")).option_help():
            assert f"  {option}:" in listing, f"option {option} of {name} not listed"
    # The options a user types, in kebab case as pipelines spell them.
    for option in ("dead-results", "donate", "exclude-kinds", "inferred", "explicit"):
        assert f"  {option}:" in listing


def _options_of(pipeline_element_text: str) -> str:
    """``name{a=1 b=2}`` -> ``a=1 b=2``; ``name`` -> ``""``."""
    _name, _brace, rest = pipeline_element_text.partition("{")
    return rest[:-1] if rest else ""


@pytest.mark.parametrize(
    "configured",
    [
        EliminateViewResults(),
        EliminateViewResults(dead_results=(1,)),
        EliminateViewResults(dead_results=(0, 2, 5)),
        AliasDonatedBuffers(),
        AliasDonatedBuffers(inferred=False),
        AliasDonatedBuffers(explicit=False, donate=("x", "0")),
        AliasDonatedBuffers(donate=("layer.weight",), exclude_kinds=("parameter", "buffer")),
        AliasDonatedBuffers(inferred=False, explicit=False, exclude_kinds=("user_input",)),
        RecomputeForLateReaders(),
        RecomputeForLateReaders(min_saved_bytes=0),
        RecomputeForLateReaders(min_distance=3, kept_reshapes=False, min_saved_bytes=4096),
    ],
    ids=lambda p: p.option_text(),
)
def test_options_round_trip(configured: ModulePass) -> None:
    """``from_options(p.option_text())`` rebuilds the same pass, so what
    reports and ``--list-passes`` print can be pasted into a pipeline."""
    text = configured.option_text()
    assert text.startswith(configured.name)
    rebuilt = type(configured).from_options(_options_of(text))
    assert rebuilt == configured
    # And through a pipeline: the parser hands the factory the same text.
    (element,) = parse_pipeline(f"builtin.module({text})")
    assert get_all_passes()[element.name](element.options) == configured


def test_option_spellings() -> None:
    """A bare flag means true; 0/1 are booleans; lists split on commas."""
    assert AliasDonatedBuffers.from_options("inferred=false explicit") == AliasDonatedBuffers(
        inferred=False, explicit=True
    )
    assert AliasDonatedBuffers.from_options("explicit=0") == AliasDonatedBuffers(explicit=False)
    assert EliminateViewResults.from_options(" dead-results=3,1 ") == EliminateViewResults(
        dead_results=(3, 1)
    )
    assert AliasDonatedBuffers.from_options("donate=a,b,7").donate == ("a", "b", "7")


def test_a_pass_built_without_options_reads_no_annotation() -> None:
    """Only a given option's type is looked up: a pass built as the default
    pipeline builds its passes (no options) never evaluates its class's
    annotations, which ``typing.get_type_hints`` does for all of them."""

    @dataclasses.dataclass(frozen=True)
    class Unread(ModulePass[None]):
        name = "unread-annotations"
        width: NoSuchType = 1  # type: ignore[name-defined]  # noqa: F821  (never evaluated)
        flag: bool = False

        def apply(self, module: object) -> None:
            return None

    assert Unread.from_options("") == Unread()
    with pytest.raises(NameError):  # an option given: its type is read, as before
        Unread.from_options("flag=true")


@pytest.mark.parametrize(
    ("pass_type", "option_text", "culprit"),
    [
        (EliminateViewResults, "bogus=1", "bogus"),
        (EliminateViewResults, "dead-results=a", "dead-results"),
        (EliminateViewResults, "dead-results=1.5", "dead-results"),
        (EliminateViewResults, "dead-results", "dead-results"),
        (EliminateViewResults, "donate=x", "donate"),  # the other pass's option
        (AliasDonatedBuffers, "inferred=maybe", "inferred"),
        (AliasDonatedBuffers, "explicit=2", "explicit"),
        (AliasDonatedBuffers, "donate", "donate"),
        (AliasDonatedBuffers, "dead-results=1", "dead-results"),
        (AliasDonatedBuffers, "=x", "=x"),
        (RecomputeForLateReaders, "min-saved-bytes=-1", "min-saved-bytes"),
        (RecomputeForLateReaders, "min-saved-bytes=1.5", "min-saved-bytes"),
        (RecomputeForLateReaders, "min-saved-bytes=64KiB", "min-saved-bytes"),
    ],
)
def test_bad_options_raise_pass_error(pass_type: type[ModulePass], option_text: str, culprit: str) -> None:
    """Bad option text is a PassError naming the offending option."""
    with pytest.raises(hloalias.PassError) as raised:
        pass_type.from_options(option_text)
    assert culprit in str(raised.value)


_TINY_MODULE = """
module {
  func.func @main(%arg0: tensor<2xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) -> tensor<2xf32> {
    %0 = stablehlo.add %arg0, %arg0 : tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}
"""


@pytest.mark.parametrize(
    ("configured", "culprit"),
    [
        (AliasDonatedBuffers.from_options("exclude-kinds=weights"), "unknown kind 'weights'"),
        (AliasDonatedBuffers.from_options("donate=y"), "unknown argument 'y'"),
        (AliasDonatedBuffers.from_options("donate=3"), "argument 3"),
        (AliasDonatedBuffers.from_options("donate=x,0"), "donated twice"),
        (EliminateViewResults.from_options("dead-results=1"), "result 1"),
        (EliminateViewResults.from_options("dead-results=0,0"), "twice"),
    ],
)
def test_options_checked_against_the_module_raise_pass_error(configured: ModulePass, culprit: str) -> None:
    """Options that only the module can refute fail when the pass runs,
    with a PassError naming the culprit, and leave the module unchanged."""
    module = parse_module(_TINY_MODULE, new_context())
    before = print_module(module)
    with pytest.raises(hloalias.PassError, match=culprit):
        configured.apply(module)
    assert print_module(module) == before


def test_passes_are_immutable_values() -> None:
    """Options are frozen: a pass built once can be shared between pipelines."""
    configured = AliasDonatedBuffers(donate=("x",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        configured.donate = ("y",)  # type: ignore[misc]


# -- pipeline parsing -------------------------------------------------------

def test_parse_pipeline_splits_top_level_elements_only() -> None:
    """Commas inside ``{...}`` and nested ``(...)`` do not split elements."""
    elements = parse_pipeline(
        "builtin.module(canonicalize, eliminate-view-results{dead-results=1,2},"
        " func.func(cse, canonicalize{max-iterations=2}),"
        " alias-donated-buffers{donate=x,0 exclude-kinds=parameter inferred=false})"
    )
    assert elements == [
        PipelineElement("canonicalize", "", "canonicalize"),
        PipelineElement("eliminate-view-results", "dead-results=1,2", "eliminate-view-results{dead-results=1,2}"),
        PipelineElement("func.func", "", "func.func(cse, canonicalize{max-iterations=2})"),
        PipelineElement(
            "alias-donated-buffers",
            "donate=x,0 exclude-kinds=parameter inferred=false",
            "alias-donated-buffers{donate=x,0 exclude-kinds=parameter inferred=false}",
        ),
    ]


def test_parse_pipeline_of_the_default_and_the_empty_pipeline() -> None:
    """The default pipeline folds transposes, then eliminates views before
    aliasing (the alias pass must see which arguments are bases of rebuilt
    views)."""
    assert [e.name for e in parse_pipeline(DEFAULT_PIPELINE)] == [
        "fold-transpose-into-dot-general",
        "fold-broadcast-into-dot-general",
        "window-scatter-indices",
        "window-gather-indices",
        "scatter-to-dynamic-update-slice",
        "select-to-dynamic-update-slice",
        "bitcast-overwrite-scatter",
        "widen-one-row-updates",
        "fold-repeat-into-dot-general",
        "elementwise-in-producer-shape",
        "eliminate-view-results",
        "alias-donated-buffers",
    ]
    assert parse_pipeline("builtin.module()") == []
    assert parse_pipeline("  builtin.module( canonicalize )  ") == [
        PipelineElement("canonicalize", "", "canonicalize")
    ]


@pytest.mark.parametrize(
    "unbalanced",
    [
        "builtin.module(canonicalize, func.func(cse)",
        "builtin.module(canonicalize))",
        "builtin.module(eliminate-view-results{dead-results=1)",
        "builtin.module(eliminate-view-results})",
        "builtin.module(func.func(cse}))",
        "builtin.module(a{b(c}))",
    ],
)
def test_parse_pipeline_rejects_unbalanced_brackets(unbalanced: str) -> None:
    """Unbalanced or crossed brackets are a PipelineError quoting the text."""
    with pytest.raises(hloalias.PipelineError) as raised:
        parse_pipeline(unbalanced)
    assert unbalanced in str(raised.value)


@pytest.mark.parametrize(
    ("pipeline", "offending"),
    [
        ("builtin.module(alias-donated-buffers{donate=x}junk)", "unexpected 'junk' after 'alias-donated-buffers{donate=x}'"),
        ("builtin.module(canonicalize cse)", "unexpected 'cse' after 'canonicalize'"),
        ("builtin.module(canonicalize) cse", "unexpected 'cse' after 'builtin.module(...)'"),
        ("builtin.module(canonicalize,,cse)", "expected a pass name at ',cse)'"),
        ("builtin.module(canonicalize,)", "expected a pass name at ')'"),
    ],
)
def test_parse_pipeline_names_text_it_cannot_read(pipeline: str, offending: str) -> None:
    """Nothing after an element is silently dropped: a PipelineError names it."""
    with pytest.raises(hloalias.PipelineError) as raised:
        parse_pipeline(pipeline)
    assert offending in str(raised.value) and pipeline in str(raised.value)


def test_nested_pipeline_under_an_hloalias_pass_is_refused() -> None:
    """``eliminate-view-results(canonicalize)`` is not a pass with a nested
    pipeline: refused when the pass manager is built, naming the element."""
    from hloalias.mlir import new_context
    from hloalias.pipeline import build_pass_manager

    with pytest.raises(hloalias.PipelineError, match=r"takes no nested pipeline: 'eliminate-view-results\(canonicalize\)'"):
        build_pass_manager("builtin.module(eliminate-view-results(canonicalize))", new_context())


@pytest.mark.parametrize("unanchored", ["canonicalize", "func.func(cse)", "builtin.module", ""])
def test_parse_pipeline_requires_builtin_module_anchor(unanchored: str) -> None:
    """Pipelines are anchored on ``builtin.module(...)``."""
    with pytest.raises(hloalias.PipelineError):
        parse_pipeline(unanchored)


# -- packaging ----------------------------------------------------------------

@pytest.mark.parametrize("bare_name", ["passes", "pipeline"])
def test_bare_top_level_packages_are_not_importable(bare_name: str, tmp_path: os.PathLike[str]) -> None:
    """``passes/`` and ``pipeline/`` install as ``hloalias.passes`` and
    ``hloalias.pipeline`` only: generic top-level names must not leak into
    every environment hloalias is installed in.  Run from outside the repo,
    where the source tree is not on ``sys.path``."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # find_spec("hloalias") proves the interpreter sees the install (without
    # paying for torch's import); then the bare import must fail.
    probe = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('hloalias') is not None, sys.path\n"
        f"import {bare_name}\n"
        f"print({bare_name}.__file__)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 1, (completed.stdout, completed.stderr)
    assert f"ModuleNotFoundError: No module named '{bare_name}'" in completed.stderr
