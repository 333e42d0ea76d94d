"""hloalias-opt --verify-diagnostics: where ``expected-*`` comments point,
and how produced diagnostics are matched to them (mlir-opt's rules)."""

from __future__ import annotations

from hloalias.tools.verify_diagnostics import expectations, parse_diagnostics, verify

CHUNK = """\
// expected-error@+1 {{next line}}
op1
op2 // expected-warning {{same line}}
// expected-note@-2 {{two up}}
// expected-error@below 2 {{twice}}
op5
// expected-error@9 {{absolute}}
// expected-remark@unknown {{nowhere}}
// expected-error-re@above {{value {{[0-9]+}} is bad}}
"""


def test_where_comments_point() -> None:
    found = [(e.severity, e.line, e.text, e.count, e.regex) for e in expectations(CHUNK, 10)]
    assert found == [
        ("error", 12, "next line", 1, False),
        ("warning", 13, "same line", 1, False),
        ("note", 12, "two up", 1, False),
        ("error", 16, "twice", 2, False),
        ("error", 9, "absolute", 1, False),
        ("remark", None, "nowhere", 1, False),
        ("error", 18, "value {{[0-9]+}} is bad", 1, True),
    ]


def test_all_met() -> None:
    produced = "\n".join([
        "f.mlir:12:1: error: at the next line",
        "f.mlir:13:1: warning: on the same line",
        "f.mlir:12:3: note: two up, noted",
        "f.mlir:16:1: error: twice",
        "f.mlir:16:1: error: twice",
        "f.mlir:9:1: error: absolute",
        "f.mlir: remark: nowhere in particular",
        "f.mlir:18:1: error: value 42 is bad",
        "  a continuation line of the message before",
    ])
    assert verify(CHUNK, 10, "f.mlir", produced) == []


def test_mismatches_are_named() -> None:
    produced = "f.mlir:12:1: error: at the next line\nf.mlir:14:2: error: surprise\nf.mlir:18:1: error: value x is bad"
    errors = verify(CHUNK, 10, "f.mlir", produced)
    assert errors[0] == "f.mlir:14:2: error: unexpected error: surprise"
    assert errors[1] == "f.mlir:18:1: error: unexpected error: value x is bad"
    assert 'f.mlir:13:8: error: expected warning "same line" was not produced' in errors
    assert 'f.mlir:15:4: error: expected error "twice" was not produced' in errors
    assert len(errors) == 2 + 6


def test_other_files_have_no_location() -> None:
    (diagnostic,) = parse_diagnostics("other.mlir:3:4: error: elsewhere", "f.mlir")
    assert diagnostic.line is None and diagnostic.message == "elsewhere"
