"""``hloalias-opt --verify-diagnostics``: the diagnostics a run produced,
checked against ``expected-*`` comments in the input, as ``mlir-opt``
checks them.

    // expected-error {{substring of the message}}       on this line
    // expected-error@+1 {{...}}                          on the next line
    // expected-error@-2 {{...}}                          two lines up
    // expected-error@above / @below {{...}}              the line above / below
    // expected-error@7 {{...}}                           on line 7 of the file
    // expected-error@unknown {{...}}                     without a location
    // expected-note / expected-warning / expected-remark (same forms)
    // expected-error 2 {{...}}                           produced twice

A diagnostic matches an expectation of its severity on its line whose
text is a substring of its message (``-re`` expectations: ``{{...}}``
inside the text are regular expressions).  Every diagnostic must be
expected and every expectation produced; each mismatch is reported as
``file:line:col: error: unexpected error: ...`` or ``file:line:col: error:
expected error "..." was not produced``, and the run fails.  With
``--split-input-file`` each chunk is checked against its own comments."""

from __future__ import annotations

import dataclasses
import re

_EXPECTED_RE = re.compile(
    r"expected-(?P<severity>error|warning|note|remark)(?P<re>-re)?"
    r"(?:@(?P<where>above|below|unknown|[+-]\d+|\d+))?"
    r"(?:\s+(?P<count>\d+))?\s*\{\{(?P<text>.*)\}\}"
)
_DIAGNOSTIC_RE = re.compile(r"^(?:(?P<file>.*?):(?P<line>\d+):(?P<col>\d+)|(?P<bare>[^:]*)): (?P<severity>error|warning|note|remark): (?P<message>.*)$")


@dataclasses.dataclass
class Expectation:
    """One ``expected-*`` comment: what, where (None: unknown location)."""

    severity: str
    line: int | None
    text: str
    regex: bool
    count: int
    comment_line: int
    column: int
    seen: int = 0

    def matches(self, message: str) -> bool:
        """Whether ``message`` satisfies this expectation's text."""
        if not self.regex:
            return self.text in message
        parts = re.split(r"\{\{(.*?)\}\}", self.text)
        pattern = "".join(re.escape(p) if i % 2 == 0 else f"(?:{p})" for i, p in enumerate(parts))
        return re.search(pattern, message) is not None


@dataclasses.dataclass
class Diagnostic:
    """One diagnostic of a run: severity, 1-based line (None: no
    location), column and message (with continuation lines)."""

    severity: str
    line: int | None
    column: int
    message: str


def expectations(chunk: str, line_offset: int) -> list[Expectation]:
    """The ``expected-*`` comments of ``chunk``, whose first line is line
    ``line_offset + 1`` of the file."""
    found: list[Expectation] = []
    for index, text in enumerate(chunk.splitlines()):
        line = line_offset + index + 1
        for match in _EXPECTED_RE.finditer(text):
            where = match["where"]
            target: int | None
            if where is None:
                target = line
            elif where == "unknown":
                target = None
            elif where == "above":
                target = line - 1
            elif where == "below":
                target = line + 1
            elif where[0] in "+-":
                target = line + int(where)
            else:
                target = int(where)
            count = int(match["count"]) if match["count"] else 1
            found.append(Expectation(match["severity"], target, match["text"], bool(match["re"]), count, line,
                                     match.start() + 1))
    return found


def parse_diagnostics(text: str, source_name: str) -> list[Diagnostic]:
    """The diagnostics in a run's stderr ``text``: ``file:line:col:
    severity: message`` lines (locations in other files count as no
    location) and ``name: severity: message`` lines without one; other
    lines continue the message before them."""
    diagnostics: list[Diagnostic] = []
    for line in text.splitlines():
        match = _DIAGNOSTIC_RE.match(line)
        if match is None:
            if diagnostics:
                diagnostics[-1].message += "\n" + line
            continue
        located = match["line"] is not None and match["file"] == source_name
        diagnostics.append(Diagnostic(
            match["severity"],
            int(match["line"]) if located else None,
            int(match["col"]) if located else 0,
            match["message"],
        ))
    return diagnostics


def verify(chunk: str, line_offset: int, source_name: str, produced: str) -> list[str]:
    """The verification errors (empty: the chunk's diagnostics are exactly
    the expected ones), each as ``file:line:col: error: ...``."""
    expected = expectations(chunk, line_offset)
    errors: list[str] = []
    for diagnostic in parse_diagnostics(produced, source_name):
        candidates = [
            e for e in expected
            if e.severity == diagnostic.severity and e.line == diagnostic.line and e.seen < e.count
            and e.matches(diagnostic.message)
        ]
        if candidates:
            candidates[0].seen += 1
            continue
        where = f"{source_name}:{diagnostic.line}:{diagnostic.column}" if diagnostic.line else source_name
        first = diagnostic.message.splitlines()[0] if diagnostic.message else ""
        errors.append(f"{where}: error: unexpected {diagnostic.severity}: {first}")
    for expectation in expected:
        if expectation.seen < expectation.count:
            errors.append(
                f"{source_name}:{expectation.comment_line}:{expectation.column}: error: expected "
                f"{expectation.severity} \"{expectation.text}\" was not produced"
            )
    return errors


__all__ = ["Diagnostic", "Expectation", "expectations", "parse_diagnostics", "verify"]
