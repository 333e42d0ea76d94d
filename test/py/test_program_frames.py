"""Errors raised while tracing a library's model name the model's own line.

A `transformers` model that checks its labels on the host
(``if labels.max() >= vocab_size``) cannot be traced; the message must
name that line, not only the caller's ``loss = model(**batch).loss``.  The
library here lives under a ``site-packages`` folder, as an installed one
does (the training step's message named only frames outside it).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

import hloalias
from hloalias.errors import TorchImportError
from hloalias.frontend import importer, program_frames
from hloalias.frontend.training import TrainingCaptureError

_LIBRARY = '''
import torch


class CheckedClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, labels):
        if labels.max() >= 4:  # the library checks its labels on the host
            raise ValueError("label out of range")
        return torch.nn.functional.cross_entropy(self.lin(x), labels)


class GappedWindows(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("b", torch.arange(4.0))

    def forward(self, x):
        self.b.unfold(0, 1, 2)[:, 0].add_(1.0)  # the library writes through gapped windows
        return self.lin(x).sum() + self.b.sum()


class MaskedDepthLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, target):
        pred = self.lin(x).exp()
        valid_mask = target > 0.5
        diff_log = torch.log(target[valid_mask]) - torch.log(pred[valid_mask])  # the library's masked loss
        return torch.sqrt(diff_log.pow(2).mean() - 0.5 * diff_log.mean().pow(2))
'''


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    package = tmp_path / "site-packages" / "framelib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "checked.py").write_text(_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    module = importlib.import_module("framelib.checked")
    yield module
    for name in ("framelib.checked", "framelib"):
        sys.modules.pop(name, None)


_MODEL_LINE = r"framelib/checked\.py:\d+ in forward: if labels\.max\(\) >= 4:"


def _refused_capture(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> pytest.ExceptionInfo[TrainingCaptureError]:
    """The refusal of an SGD step of ``model`` on ``batch``; the model's
    state is as it was."""
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(*batch: torch.Tensor) -> torch.Tensor:
        loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TrainingCaptureError) as caught:
        hloalias.compile_training_step(step, model, opt, batch)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    return caught


def test_training_capture_names_the_library_line_and_the_caller(library: ModuleType) -> None:
    caught = _refused_capture(library.CheckedClassifier(), (torch.randn(3, 4), torch.tensor([0, 1, 2])))
    assert caught.match(
        r"data-dependent control flow .* at .*" + _MODEL_LINE
        + r"[^\n]* \(called from .*test_program_frames\.py:\d+ in step: loss = model\(\*batch\)\)"
    )


def test_export_failure_names_the_library_line(library: ModuleType) -> None:
    model = library.CheckedClassifier()
    with pytest.raises(TorchImportError) as caught:
        hloalias.compile(model, (torch.randn(3, 4), torch.tensor([0, 1, 2])))
    assert caught.match(r"uses a tensor's value as a Python number at .*" + _MODEL_LINE)


_MASK_LINE = r"framelib/checked\.py:\d+ in forward: diff_log = torch\.log\(target\[valid_mask\]\)"


def test_a_training_steps_data_dependent_size_names_the_line_that_made_it(library: ModuleType) -> None:
    """GLPN's SiLog loss (``target[valid_mask]``): torch fails on the
    selection's size in autograd's backward, under ``loss.backward()``,
    which the message named; the line to change is the model's."""
    caught = _refused_capture(library.MaskedDepthLoss(), (torch.randn(3, 4), torch.rand(3, 4)))
    assert caught.match(r"depends on a tensor's values .* made at .*" + _MASK_LINE)


def test_a_forwards_data_dependent_size_names_the_line_that_made_it(library: ModuleType) -> None:
    """The same loss in a forward: torch.export traces it, and torch-mlir's
    lowering failed on a gather's types, naming no line of the program."""
    model = library.MaskedDepthLoss()
    with pytest.raises(TorchImportError) as caught:
        hloalias.compile(model, (torch.randn(3, 4), torch.rand(3, 4)))
    assert caught.match(r"selects elements by a boolean mask \(`x\[mask\]`\) at .*" + _MASK_LINE)


def test_a_write_through_a_librarys_unfold_names_the_library_line(library: ModuleType) -> None:
    """The one predicate (frontend/program_frames.py): the training
    capture's unfold check named the caller's line, skipping installed
    libraries, where every other message names the library model's own."""
    model = library.GappedWindows()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    with pytest.raises(TrainingCaptureError) as caught:
        hloalias.compile_training_step(step, model, opt, (torch.randn(2, 4),))
    assert caught.match(r"unfold\(0, 1, 2\).* at .*framelib/checked\.py:\d+ in forward: self\.b\.unfold\(0, 1, 2\)")


def test_an_fx_stack_trace_names_its_innermost_program_frame() -> None:
    inner = os.path.join(sys.prefix, "site-packages", "transformers", "m.py")
    trace = "".join(
        f'  File "{path}", line {line}, in {function}\n    {code}\n'
        for path, line, function, code in [
            (__file__, 10, "step", "loss = model(x)"),
            (inner, 20, "forward", "y = x.item()"),
            (contextlib.__file__, 30, "__exit__", "next(self.gen)"),
            (torch.__file__, 40, "op", "return f()"),
        ]
    )
    assert program_frames.innermost_in_stack_trace(trace) == f"{inner}:20 in forward: y = x.item()"
    assert program_frames.innermost_in_stack_trace(trace.split(f'  File "{inner}"')[0]).endswith(
        "test_program_frames.py:10 in step: loss = model(x)"
    )
    assert program_frames.innermost_in_stack_trace("") is None


def test_frames_of_torch_and_hloalias_are_not_the_programs() -> None:
    assert not program_frames.is_program_file(torch.__file__)
    assert not program_frames.is_program_file(importer.__file__)
    assert not program_frames.is_program_file(hloalias.__file__)
    assert not program_frames.is_program_file("<string>")
    assert not program_frames.is_program_file(contextlib.__file__)  # the standard library
    assert not program_frames.is_program_file(functools.__file__)
    assert program_frames.is_program_file(__file__)
    assert program_frames.is_program_file(os.path.join(sys.prefix, "site-packages", "transformers", "m.py"))


def test_a_traceback_without_program_frames_names_nothing() -> None:
    try:
        torch.zeros(2) @ torch.zeros(3)
    except RuntimeError as error:
        innermost, caller = program_frames.program_frames(error.__traceback__)
    # The only program frame is this test's own line.
    assert innermost is not None and "test_program_frames.py" in innermost and caller is None
    assert program_frames.program_frames(None) == (None, None)


class _StudentTHead(torch.nn.Module):
    """A forecasting head as transformers' time-series models write it
    (time_series_utils.DistributionOutput): a distribution built from the
    projected parameters, scored on the targets."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        df, loc, scale = self.proj(x).unbind(-1)
        dist = torch.distributions.StudentT(2.0 + torch.nn.functional.softplus(df), loc,
                                            torch.nn.functional.softplus(scale) + 1e-3)
        return -dist.log_prob(target).mean()


def test_distribution_argument_check_is_named_with_its_switch() -> None:
    """torch.distributions checks its parameters' values on the host
    (validate_args, on by default): the refusal says so and how to turn
    it off, not the generic advice to index with a tensor (session 48
    sweep: TimeSeriesTransformer/Informer)."""
    model = _StudentTHead()
    args = (torch.randn(5, 4), torch.randn(5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # torch's own default (an earlier torch.compile in the process may
    # have turned it off: torch._dynamo does).
    previous = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(True)
    try:
        with pytest.raises(TorchImportError) as caught:
            hloalias.compile(model, args)
    finally:
        torch.distributions.Distribution.set_default_validate_args(previous)
    assert caught.match(r"torch\.distributions object at .*test_program_frames\.py:\d+ in forward: dist = ")
    assert caught.match(r"set_default_validate_args\(False\)")
    assert "index with the tensor" not in str(caught.value)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    # With the check off, the program compiles and computes eager's value.
    previous = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        exe = hloalias.compile(model, args)
        torch.testing.assert_close(exe(*args), model(*args), rtol=1e-5, atol=1e-6)
    finally:
        torch.distributions.Distribution.set_default_validate_args(previous)
