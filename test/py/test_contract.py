"""The IR contract (hloalias.contract): typed records, one ``verify``, and
what depends on them: reports rebuilt from the final module, the runtime's
single check of the final module, and IR from other producers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch_mlir import ir

import hloalias
from hloalias import attributes as A
from hloalias.contract import ArgRecord, RemovedResult, ResultRecord, Signature, verify
from hloalias.errors import IRError
from hloalias.mlir import find_main, new_context, parse_module, print_module
from hloalias.passes import AliasDonatedBuffers, AliasReport, EliminateViewResults, ViewReport
from hloalias.pipeline import run_pipeline


def _verify_text(text: str) -> Signature:
    module = parse_module(text, new_context())
    with module.context:
        return verify(find_main(module))


_MAIN = (
    "func.func @main(%arg0: tensor<8xf32>{ARG}) -> (tensor<8xf32>{R0}, tensor<8xf32>{R1}){FN} {{\n"
    "  %0 = stablehlo.negate %arg0 : tensor<8xf32>\n"
    "  return %0, %arg0 : tensor<8xf32>, tensor<8xf32>\n"
    "}}\n"
)


def _main(arg: str = "", r0: str = "", r1: str = "", fn: str = "") -> str:
    def attrs(text: str) -> str:
        return f" {{{text}}}" if text else ""

    return _MAIN.format(
        ARG=attrs(arg), R0=attrs(r0), R1=attrs(r1), FN=f" attributes {{{fn}}}" if fn else ""
    )


_REBUILD = (
    'base = "{base}", chain = [], dtype = f32, offset = 0 : i64, reason = "view", '
    'result = "output:2", sizes = array<i64: 8>, strides = array<i64: 1>'
)

VIOLATIONS: dict[str, tuple[str, str]] = {
    "duplicate_keys": (
        _main(r0="hloalias.output = 1 : i64"), "result 1 of @main has result key output:1, like result 0"
    ),
    "removed_key_also_kept": (
        _main(fn='hloalias.removed_results = [{reason = "dead", result = "output:0"}]'),
        "entry 0 (output:0): result key output:0 is also result 0 of @main",
    ),
    "base_names_no_result": (
        _main(fn="hloalias.removed_results = [{" + _REBUILD.format(base="output:9") + "}]"),
        "'base' is output:9, which is no result of @main: a base must be kept",
    ),
    "base_names_missing_argument": (
        _main(fn="hloalias.removed_results = [{" + _REBUILD.format(base="arg:4") + "}]"),
        "'base' is arg:4; @main has 1 arguments",
    ),
    "dead_result_with_a_base": (
        _main(fn='hloalias.removed_results = [{reason = "dead", result = "output:2", base = "arg:0"}]'),
        "(output:2) is dead but has a 'base'",
    ),
    "unknown_reason": (
        _main(fn='hloalias.removed_results = [{reason = "gone", result = "output:2"}]'),
        "'reason' is 'gone'",
    ),
    "sizes_not_an_array": (
        _main(fn="hloalias.removed_results = [{" + _REBUILD.format(base="arg:0").replace(
            "sizes = array<i64: 8>", "sizes = 8 : i64") + "}]"),
        "'sizes' must be an array<i64>",
    ),
    "unknown_role": (_main(r0='hloalias.role = "scratch"'), "'hloalias.role' is 'scratch'"),
    "mutation_without_argument": (
        _main(r0='hloalias.role = "mutation"'), "'hloalias.mutates' is missing: the result is a mutation"
    ),
    "output_on_a_mutation": (
        _main(r0='hloalias.role = "mutation", hloalias.mutates = 0 : i64, hloalias.output = 0 : i64'),
        "result 0 of @main: 'hloalias.output' is set on a mutation result",
    ),
    "storage_malformed": (_main(r0='hloalias.storage = "somewhere"'), "'hloalias.storage' is 'somewhere'"),
    "buffer_donor_not_boolean": (_main(arg="jax.buffer_donor = 1 : i32"), "'jax.buffer_donor' must be a boolean"),
    "unknown_donation_origin": (_main(arg='hloalias.donation = "maybe"'), "'hloalias.donation' is 'maybe'"),
    "name_not_a_string": (_main(arg="hloalias.name = 3 : i64"), "argument 0: 'hloalias.name' must be a string"),
}


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_verify_names_the_attribute_and_its_owner(name: str) -> None:
    """Every violation is an IRError naming the attribute and the argument,
    result or removed entry; never a KeyError or ValueError."""
    text, message = VIOLATIONS[name]
    with pytest.raises(IRError) as raised:
        _verify_text(text)
    assert message in str(raised.value)


def test_records_read_and_write_canonically() -> None:
    """Reading fills in what the contract implies (a result without a role
    is the user output at its position); writing spells all of it out."""
    module = parse_module(
        _main(arg='hloalias.kind = "user_input", hloalias.name = "x", jax.buffer_donor', r1="hloalias.output = 0 : i64"),
        new_context(),
    )
    with module.context:
        main = find_main(module)
        signature = Signature.read(main)
        assert signature.args == (ArgRecord(kind="user_input", name="x", buffer_donor=True),)
        assert signature.results == (ResultRecord("user_output", output=0), ResultRecord("user_output", output=0))
    # Both claim user output 0: rejected, never silently renumbered.
    with pytest.raises(IRError, match="result 1 of @main has result key output:0"):
        signature.check()
    module = parse_module(_main(r0="hloalias.output = 1 : i64", r1="hloalias.output = 0 : i64"), new_context())
    with module.context:
        main = find_main(module)
        verify(main).write(main)
        text = print_module(module)
    # Each keeps its number, now with its role spelt out.
    assert (
        '-> (tensor<8xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}, '
        'tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"})'
    ) in text


def test_removed_result_round_trips_through_its_attribute() -> None:
    module = parse_module(_main(), new_context())
    with module.context:
        record = RemovedResult("output:3", A.REASON_DEAD)
        assert RemovedResult.from_attr(record.to_attr(), 0) == record


# -- reports of the final module ----------------------------------------------

def _views_and_mutation(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y.mul_(2)
    return x.t(), x[1:] + 1


def test_reports_come_from_the_final_module_after_a_pass_runs_twice() -> None:
    """The second run of eliminate-view-results removes nothing; the
    executable's reports still show what the first removed and the alias
    the alias pass made (they were the last run's before)."""
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    exe = hloalias.compile(
        _views_and_mutation, (x, y),
        pipeline="builtin.module(eliminate-view-results, alias-donated-buffers, eliminate-view-results)",
    )
    assert exe.view_report is not None and exe.alias_report is not None
    assert [(r.key, r.base, r.reason) for r in exe.view_report.removed] == [("output:0", "arg:0", "view")]
    assert [(a.arg_name, a.origin) for a in exe.alias_report.aliases] == [("y", "inferred")]
    text = exe.explain()
    assert "output:0: rebuilt as a view of arg:0 (view: transpose [1, 0])" in text
    assert "arg 1 'y' -> result 0" in text
    x2, y2 = torch.randn(3, 3), torch.randn(3, 3)
    expected_y = y2.clone()
    got = exe(x2, y2)
    want = _views_and_mutation(x2.clone(), expected_y)
    assert all(torch.equal(g, w) for g, w in zip(got, want)) and torch.equal(y2, expected_y)


def test_module_reports_match_a_single_runs_reports() -> None:
    """After one run of each pass, the reports rebuilt from the IR equal the
    ones the runs returned (unused donations included)."""
    program = hloalias.import_torch(_views_and_mutation, (torch.randn(3, 3), torch.randn(3, 3)))
    module: Any = program.torch_mlir_module
    view = EliminateViewResults().apply(module)
    with pytest.warns(UserWarning, match="not usable"):
        alias = AliasDonatedBuffers(donate=("x",)).apply(module)
    assert alias.unused, "x is the base of a rebuilt view: its donation is unused"
    assert ViewReport.from_module(module) == view
    assert AliasReport.from_module(module) == alias


# -- checks in a pipeline: one per change of @main's signature -------------------

_CLEAN = (
    "func.func @main(%arg0: tensor<8xf32> {hloalias.kind = \"user_input\", hloalias.name = \"x\"}) -> "
    "tensor<8xf32> {\n"
    "  %0 = stablehlo.negate %arg0 : tensor<8xf32>\n"
    "  return %0 : tensor<8xf32>\n"
    "}\n"
)
# Passes that leave this module's signature alone.
_UNTOUCHING = (
    "builtin.module(fold-transpose-into-dot-general, window-scatter-indices, widen-one-row-updates, "
    "elementwise-in-producer-shape, canonicalize, fold-broadcast-into-dot-general, accumulate-bf16-dots-in-f32)"
)


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads = [0]
    original = Signature.read

    def counting(main: Any) -> Signature:
        reads[0] += 1
        return original(main)

    monkeypatch.setattr(Signature, "read", staticmethod(counting))
    return reads


def test_a_pipeline_reads_an_unchanged_signature_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seven passes (an upstream one among them) that leave ``@main``'s
    signature alone: its contract is read once, on entry; every other check
    (the pipeline's around each pass, the passes' own) reuses that one."""
    reads = _count_reads(monkeypatch)
    module = parse_module(_CLEAN, new_context())
    run_pipeline(module, _UNTOUCHING)
    assert reads[0] == 1
    with module.context:  # outside the pipeline: read again
        verify(find_main(module))
    assert reads[0] == 2


def test_a_pipeline_checks_once_before_each_run_of_passes_and_once_after_each_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a pipeline the adapter checks the contract on entry to each run
    of hloalias passes and after each pass; the passes' own checks on entry
    and exit (the same module again) are not made there: eight checks for
    the six passes in two runs, not twenty.  Called directly, a pass still
    checks on entry and on exit."""
    import hloalias.passes.base as base
    from hloalias.passes.fold_transpose_into_dot_general import FoldTransposeIntoDotGeneral

    checks = [0]
    original = base.verify

    def counting(main: Any, **kwargs: Any) -> Any:
        checks[0] += 1
        return original(main, **kwargs)

    monkeypatch.setattr(base, "verify", counting)
    run_pipeline(parse_module(_CLEAN, new_context()), _UNTOUCHING)
    assert checks[0] == 2 + 6
    checks[0] = 0
    FoldTransposeIntoDotGeneral().apply(parse_module(_CLEAN, new_context()))
    assert checks[0] == 2


def test_verify_each_pass_reads_the_signature_at_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _count_reads(monkeypatch)
    monkeypatch.setenv("HLOALIAS_VERIFY_EACH_PASS", "1")
    run_pipeline(parse_module(_CLEAN, new_context()), _UNTOUCHING)
    assert reads[0] == 2 + 6  # every check the pipeline makes (on entry to each run, after each pass), in full


def test_a_pipeline_reads_a_changed_signature_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """eliminate-view-results changes the signature (the pass-through
    result goes): the checks after it read the new one; the records the
    pipeline returns are the final module's."""
    reads = _count_reads(monkeypatch)
    module = parse_module(_main(), new_context())
    reports = run_pipeline(
        module, "builtin.module(widen-one-row-updates, eliminate-view-results, widen-one-row-updates)"
    )
    assert 2 <= reads[0] <= 4  # entry; after the change (the pass reads its own result once)
    assert reports[1].removed[0].key == "output:1"
    with module.context:
        assert verify(find_main(module)).keys == ("output:0",)


def _breaking(check_own_exit: bool) -> Any:
    """An ``apply`` that writes a removed result without its base."""
    from hloalias.passes.base import as_module_like, verify_contract

    def apply(self: Any, module: Any) -> None:
        view = as_module_like(module)
        with view.context:
            find_main(view).attributes[A.REMOVED_RESULTS] = ir.Attribute.parse(
                '[{reason = "view", result = "output:1"}]'
            )
        if check_own_exit:  # as every hloalias pass checks on its way out
            verify_contract(view)

    return apply


@pytest.mark.parametrize("check_own_exit", [False, True])
def test_a_pipeline_names_the_pass_that_breaks_the_contract(
    monkeypatch: pytest.MonkeyPatch, check_own_exit: bool
) -> None:
    """The pass before it left the signature as it found it (its checks
    reused the first one); the breaking pass changed it, is checked in
    full and named."""
    from hloalias.passes.widen_one_row_updates import WidenOneRowUpdates

    monkeypatch.setattr(WidenOneRowUpdates, "apply", _breaking(check_own_exit))
    module = parse_module(_CLEAN, new_context())
    with pytest.raises(IRError, match="widen-one-row-updates broke the IR contract: .*entry 0 lacks 'base'"):
        run_pipeline(module, "builtin.module(window-scatter-indices, widen-one-row-updates, canonicalize)")


def test_a_rejected_input_does_not_name_the_pass() -> None:
    """A module broken before the pipeline is the input's fault: the
    message is the contract's alone (as the passes' lit error cases check)."""
    module = parse_module(_main(fn='hloalias.removed_results = [{reason = "view", result = "output:1"}]'),
                          new_context())
    with pytest.raises(IRError) as raised:
        run_pipeline(module, "builtin.module(window-scatter-indices, widen-one-row-updates)")
    assert "entry 0 lacks 'base'" in str(raised.value) and "broke" not in str(raised.value)


# -- the runtime checks the final module once ---------------------------------

def test_compile_rejects_a_final_module_that_breaks_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline that leaves a broken record is an IRError at compile
    time, not a KeyError or ValueError at call time."""
    import hloalias.runtime.executable as executable

    def corrupting(module: Any, text: str, **kwargs: Any) -> list[Any]:
        reports = run_pipeline(module, text, **kwargs)
        with module.context:
            main = find_main(module)
            main.attributes[A.REMOVED_RESULTS] = ir.Attribute.parse(
                '[{reason = "view", result = "output:1"}]'
            )
        return reports

    monkeypatch.setattr(executable, "run_pipeline", corrupting)
    with pytest.raises(IRError, match="entry 0 lacks 'base'"):
        hloalias.compile(lambda x: x + 1, (torch.randn(2),))


# -- IR XLA cannot take as torch-mlir writes it ---------------------------------

def test_xla_input_is_the_same_parsed_in_the_programs_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile`` parses the final text for XLA in the program's own
    context (no new one): the text XLA gets (and the disk cache keys) is
    what a new context gives, with dense_resource constants (as_strided's
    indices) among them."""
    from hloalias.runtime import pjrt

    seen: list[tuple[str, Any]] = []
    original = pjrt.prepare_for_xla

    def spy(text: str, **kwargs: Any) -> str:
        seen.append((text, kwargs.get("context")))
        return original(text, **kwargs)

    monkeypatch.setattr(pjrt, "prepare_for_xla", spy)
    monkeypatch.setenv("HLOALIAS_CACHE", "0")
    programs = [
        (lambda x: x.as_strided((2, 2), (1, 2), 1) * 3, (torch.randn(3, 4),)),
        (lambda x: torch.erf(x).to(torch.bfloat16).sum(0), (torch.randn(4, 8),)),
        (torch.nn.Linear(8, 4), (torch.randn(2, 8),)),
    ]
    for fn, args in programs:
        hloalias.compile(fn, args)
    assert len(seen) == len(programs)
    for text, context in seen:
        assert context is not None
        assert original(text, allow_stored_state=True, context=context) == original(text, allow_stored_state=True)



def test_final_text_is_parsed_once_for_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile`` prepares what XLA gets from a clone of the final module
    (the one its text was printed from), not from a parse of that text:
    the only parse is the prepared text's, for the portable artifact.  The
    prepared text is the one a parse of the final text gives, and the
    final module is left as it was."""
    from hloalias.runtime import pjrt

    parsed: list[str] = []
    original_parse = pjrt.parse_module

    def counting(text: str, *args: Any, **kwargs: Any) -> Any:
        parsed.append(text)
        return original_parse(text, *args, **kwargs)

    prepared: list[tuple[str, Any, str]] = []
    original_prepare = pjrt.prepare_for_xla

    def spy(text: str, **kwargs: Any) -> str:
        module = kwargs.get("module")
        before = None if module is None else pjrt.print_module(module, debug_info=True)
        result = original_prepare(text, **kwargs)
        assert module is not None and pjrt.print_module(module, debug_info=True) == before
        prepared.append((text, kwargs.get("context"), result))
        return result

    monkeypatch.setattr(pjrt, "parse_module", counting)
    monkeypatch.setattr(pjrt, "prepare_for_xla", spy)
    monkeypatch.setenv("HLOALIAS_CACHE", "0")
    programs = [
        (lambda x: x.as_strided((2, 2), (1, 2), 1) * 3, (torch.randn(3, 4),)),  # dense_resource constants
        (lambda x: torch.erf(x).to(torch.bfloat16).sum(0), (torch.randn(4, 8),)),
        (lambda x: x * torch.tensor([1.0, 2.0]), (torch.randn(3, 2),)),  # a lifted constant
        (torch.nn.Linear(8, 4), (torch.randn(2, 8),)),
    ]
    for fn, args in programs:
        hloalias.clear_cache()
        parsed.clear()
        hloalias.compile(fn, args)
        assert len(parsed) == 1 and parsed[0] == prepared[-1][2]  # the prepared text, for the artifact
    assert len(prepared) == len(programs)
    monkeypatch.setattr(pjrt, "parse_module", original_parse)
    for text, context, result in prepared:
        assert result == original_prepare(text, allow_stored_state=True, context=context)


def test_xla_artifact_is_serialized_in_the_programs_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile`` serializes the portable artifact from the prepared text
    parsed in the program's own context, not through
    ``serialize_portable_artifact_str`` (which creates a context for each
    call): the bytes are those that function gives, locations included."""
    from hloalias.runtime import pjrt

    made: list[tuple[str, Any, str | bytes]] = []
    original = pjrt._xla_input

    def spy(stripped: str, *context: Any) -> str | bytes:
        result = original(stripped, *context)
        made.append((stripped, context[0] if context else None, result))
        return result

    by_text: list[str] = []
    stablehlo = pjrt._stablehlo

    class Counting:
        def __getattr__(self, name: str) -> Any:
            value = getattr(stablehlo, name)
            if name != "serialize_portable_artifact_str":
                return value

            def counted(text: str, version: str) -> bytes:
                by_text.append(text)
                return value(text, version)  # type: ignore[no-any-return]

            return counted

    monkeypatch.setattr(pjrt, "_xla_input", spy)
    monkeypatch.setattr(pjrt, "_stablehlo", Counting())
    monkeypatch.setenv("HLOALIAS_CACHE", "0")
    programs = [
        (lambda x: (x, x[0:8].view(2, 4) * 2), (torch.randn(8),)),  # a view-only program is not compiled
        (lambda x: x.as_strided((2, 2), (1, 2), 1) * 3, (torch.randn(3, 4),)),
        (lambda x: torch.erf(x).to(torch.bfloat16).sum(0), (torch.randn(4, 8),)),
        (torch.nn.Linear(8, 4), (torch.randn(2, 8),)),
    ]
    for fn, args in programs:
        hloalias.clear_cache()
        hloalias.compile(fn, args)
    assert len(made) == len(programs)
    assert by_text == []
    version = pjrt.target_stablehlo_version()
    for stripped, context, artifact in made:
        assert context is not None
        assert artifact == stablehlo.serialize_portable_artifact_str(stripped, version)

def test_as_strided_compiles_and_matches_eager() -> None:
    """``as_strided`` lowers to a gather with dense_resource index constants;
    they are inlined before serialization (was: CompileError)."""

    def strided(x: torch.Tensor) -> torch.Tensor:
        return x.as_strided((2, 2), (1, 2), 1) * 3

    x = torch.randn(3, 4)
    exe = hloalias.compile(strided, (x,))
    assert torch.equal(exe(x), strided(x))


def test_static_extents_are_worked_out_once_per_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """``check_static_extents`` (run on every module XLA gets) works out
    each distinct type once, and a type that overflows is still refused
    where it first appears, after many values of a type that fits."""
    from hloalias import mlir

    calls: list[object] = []
    original = mlir.element_bits

    def counting(element_type: Any) -> int:
        calls.append(element_type)
        return original(element_type)

    monkeypatch.setattr(mlir, "element_bits", counting)
    negates = "\n".join(f"  %{i + 1} = stablehlo.negate %{i} : tensor<4xf32>" for i in range(20))
    text = (
        "func.func @main(%a: tensor<4xf32>, %s: tensor<f32>) -> tensor<4xf32> {\n"
        "  %0 = stablehlo.negate %a : tensor<4xf32>\n" + negates + "\n"
        "  %big = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<2305843009213693952xf32>\n"
        "  return %20 : tensor<4xf32>\n}\n"
    )
    module = mlir.parse_module(text, mlir.new_context())
    with pytest.raises(IRError, match="result 0 of 'stablehlo.broadcast_in_dim' .* overflows 64 bits"):
        mlir.check_static_extents(module)
    assert len(calls) == 3  # tensor<4xf32>, tensor<f32>, the one that overflows
