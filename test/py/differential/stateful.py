"""Random stateful programs for differential testing across calls.

A :class:`StatefulProgram` is the source of an ``nn.Module`` with a buffer
``buf`` (updated in place) and a parameter reachable under two names
(``self.w`` and ``self.w2``, tied), whose ``forward(x0, x1)`` runs a few
statements and returns views of the buffer, of the inputs, the tied
parameter and computed values.  The test (``test_differential_stateful.py``)
calls it several times, eagerly and through one or two executables compiled
from the same module, *holding every result across calls*, and may pass
``x0``/``x1`` as overlapping views of one tensor.  What must hold:

- every held result equals eager's held result after the last call (views
  of state are live views, in eager and in hloalias alike);
- the state equals eager's after each call, whichever executable ran it
  (state is shared by all executables of a module, tied weights are one);
- with overlapping inputs and a program that writes one of them, the call
  raises ExecutionError and changes neither the inputs nor the state;
  otherwise it agrees with eager.

Between calls the test may edit the module as users do (``EDITS``): set the
buffer, assign a new buffer, load a state dict (also with ``assign=True``,
which leaves the tied parameter as two Parameters over one storage), or
``write_back()`` and scale the buffer in place.  Eager and hloalias must
agree after each edit; held results are compared only since the last edit
(an earlier result that views state is a view of the device buffer in
hloalias, of the module's tensor in eager: docs/runtime.md).

A statement may branch on ``self.training`` and an edit may switch the
module to eval mode and back: a call of such a program in a mode other
than the one it was compiled in must raise ExecutionError naming the mode
and change nothing; in the compiled mode it agrees with eager.

Arithmetic is exact (multiples of 1/4, constants 0.5/2/1/-1), so the
comparison is bit for bit."""

from __future__ import annotations

import dataclasses
import linecache
from typing import Any

import torch
from hypothesis import strategies as st

SHAPE = (4, 6)
STATEMENTS: tuple[tuple[str, bool], ...] = (
    # (statement, writes an input)
    ("self.buf.add_(x0)", False),
    ("self.buf.mul_(0.5)", False),
    ("self.buf[1].copy_(x1[2])", False),
    ("self.buf[:, 1:4].add_(1.0)", False),
    ("self.buf.add_(self.w2)", False),
    # A read of the state through as_strided at a storage offset (rows 0-2,
    # written to row 3: no overlap), and a copy_ from another dtype.
    ("self.buf[3].add_(self.buf.as_strided((6,), (3,), 1))", False),
    ("self.buf[2].copy_((x1[0] * 4).to(torch.int32))", False),
    ("x0.add_(self.buf)", True),
    ("x1[0].fill_(-1.0)", True),
    ("x1[:, 1:3].mul_(2.0)", True),  # a stepped slice here: torch-mlir lowering exhausts memory (main too)
    # A branch on the module's train/eval mode (dropout, BatchNorm and Hugging
    # Face attention read it): export bakes the mode in.
    ("self.buf.add_(1.0 if self.training else -1.0)", False),
)
COMPUTED: tuple[str, ...] = (
    "self.buf * x1", "x0 + self.w", "self.w2 - x1",
    # as_strided without a storage offset: relative to x1's own (x1 may be
    # a view at another offset of a shared base).
    "x1.as_strided((3, 2), (6, 2)) * 2.0",
)
#: Edits of the module between calls, applied to the eager module and to
#: the one compiled from (``m``), with ``fresh`` a new instance of the
#: program; ``write_back`` first where the edit reads the state (the
#: module's tensors hold the device state only after ``write_back()``).
EDITS: tuple[tuple[str, bool], ...] = (
    # (statement, needs write_back first)
    ("m.buf.fill_(0.75)", False),
    ("m.buf = torch.full(SHAPE, 0.5)", False),
    ("m.w.fill_(-0.5)", False),
    ("m.load_state_dict(fresh.state_dict())", False),
    ("m.load_state_dict(fresh.state_dict(), assign=True)", False),
    ("m.buf.mul_(2.0)", True),
    # Mode switches (the module is compiled in train mode): a program that
    # reads ``self.training`` is refused in the other mode, naming it.
    ("m.eval()", False),
    ("m.train()", False),
)
RETURNS: tuple[str, ...] = (
    "self.buf", "self.buf[1:3]", "self.buf.t()", "self.buf[:, ::2]", "x0", "x0[0]", "x1[:, 1]", "self.w2[1:2]",
)


@dataclasses.dataclass(frozen=True)
class StatefulProgram:
    """A generated module, how it is called, and whether it writes an input."""

    body: tuple[str, ...]
    returns: tuple[str, ...]
    calls: int
    two_executables: bool
    overlap: int | None  # row offset of x1 in one shared base (< 4: overlapping), None: separate inputs
    writes_input: bool
    #: EDITS index applied before call ``i + 2`` (None: no edit).
    edits: tuple[int | None, ...] = ()

    @property
    def reads_training(self) -> bool:
        """Whether the program branches on the module's mode."""
        return any("self.training" in line for line in self.body)

    def edit_before(self, call: int) -> int | None:
        position = call - 2
        return self.edits[position] if 0 <= position < len(self.edits) else None

    def source(self) -> str:
        lines = [
            "class Program(torch.nn.Module):",
            "    def __init__(self):",
            "        super().__init__()",
            f"        self.register_buffer('buf', torch.arange({SHAPE[0] * SHAPE[1]}, dtype=torch.float32).reshape{SHAPE} / 4)",
            f"        self.w = torch.nn.Parameter(torch.full({SHAPE}, 0.25))",
            "        self.w2 = self.w",
            "    def forward(self, x0, x1):",
            *(f"        {line}" for line in self.body),
            f"        return ({', '.join(self.returns)},)",
        ]
        return "\n".join(lines) + "\n"

    def build(self) -> torch.nn.Module:
        """A fresh instance of the module (own buffer and parameter)."""
        source = self.source()
        filename = f"<stateful-{abs(hash(source))}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - generated test program
        module: torch.nn.Module = namespace["Program"]()
        return module

    def inputs(self, call: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(x0, x1, base)`` for call ``call``: separate tensors, or two
        views of one ``base`` ``overlap`` rows apart."""
        rows, cols = SHAPE
        if self.overlap is None:
            x0 = (torch.arange(rows * cols, dtype=torch.float32).reshape(SHAPE) + call) / 4
            x1 = (torch.arange(rows * cols, dtype=torch.float32).reshape(SHAPE) * 3 - call) / 4
            return x0, x1, None
        base = (torch.arange((rows + self.overlap) * cols, dtype=torch.float32).reshape(rows + self.overlap, cols) + call) / 4
        return base[0:rows], base[self.overlap:self.overlap + rows], base

    def describe(self) -> str:
        return (
            f"{self.source()}calls={self.calls} two_executables={self.two_executables} "
            f"overlap={self.overlap} writes_input={self.writes_input} "
            f"edits={[EDITS[e][0] if e is not None else None for e in self.edits]}"
        )


@st.composite
def stateful_programs(draw: st.DrawFn) -> StatefulProgram:
    chosen = draw(st.lists(st.sampled_from(range(len(STATEMENTS))), min_size=1, max_size=4))
    body = [STATEMENTS[i][0] for i in chosen]
    writes_input = any(STATEMENTS[i][1] for i in chosen)
    computed = draw(st.lists(st.sampled_from(COMPUTED), max_size=2, unique=True))
    for number, expression in enumerate(computed):
        body.insert(draw(st.integers(0, len(body))), f"c{number} = {expression}")
    names = [*RETURNS, *(f"c{n}" for n in range(len(computed)))]
    returns = draw(st.lists(st.sampled_from(names), min_size=1, max_size=4))
    overlap = draw(st.sampled_from([None, None, 0, 2, 4]))
    calls = draw(st.integers(2, 3))
    edits = tuple(
        draw(st.sampled_from([None, None, *range(len(EDITS))])) for _ in range(calls - 1)
    )
    return StatefulProgram(
        tuple(body), tuple(returns), calls, draw(st.booleans()), overlap, writes_input, edits
    )
