"""Random numbers drawn on the host while a program is traced are refused
(frontend/host_random.py): they would be constants of the compiled
program, the same at every call.  transformers' Wav2Vec2 draws its
SpecAugment masks with ``np.random`` in train mode; every compiled step
masked the same frames."""

from __future__ import annotations

import copy
import importlib
import random
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import hloalias
from hloalias.errors import TorchImportError
from hloalias.frontend.host_random import HostRandomWarning
from hloalias.frontend.training import TrainingCaptureError


def _python_random_branch(x: torch.Tensor) -> torch.Tensor:
    if random.random() < 0.5:  # a LayerDrop decision
        return x * 2
    return x


def _python_random_scale(x: torch.Tensor) -> torch.Tensor:
    return x * random.random()


class _LayerDropInEval(torch.nn.Module):
    """MusicGen's decoder: the probability is drawn in eval mode too, then
    not tested."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probability = random.uniform(0, 1)
        if self.training and probability < 0.1:
            return x
        return x + 1


def _numpy_mask(x: torch.Tensor) -> torch.Tensor:
    keep = torch.from_numpy(np.random.rand(*x.shape) > 0.5)
    return torch.where(keep, x, torch.zeros_like(x))


def test_python_random_in_a_forward_is_refused_naming_the_line() -> None:
    random.seed(7)
    expected_next = random.Random(7).random()
    with pytest.raises(TorchImportError, match=r"draws random numbers on the host \(random\.random\) at .*test_host_random\.py:\d+ in _python_random_branch: if random\.random\(\) < 0\.5:"):
        hloalias.compile(_python_random_branch, (torch.randn(3),))
    assert random.random() == expected_next  # the caller's sequence is as it was


def test_a_python_number_only_torch_reads_is_warned_about() -> None:
    with pytest.warns(HostRandomWarning, match=r"\(random\.random\) at .*in _python_random_scale: return x \* random\.random\(\)"):
        hloalias.compile(_python_random_scale, (torch.randn(3),))


def test_a_python_number_drawn_and_never_used_compiles() -> None:
    """MusicGen's LayerDrop draw in eval mode: compiled (with the warning),
    and the program equals eager."""
    model = _LayerDropInEval().eval()
    with pytest.warns(HostRandomWarning):
        exe = hloalias.compile(model, (torch.zeros(2),))
    assert torch.equal(exe(torch.zeros(2)), torch.ones(2))
    with pytest.raises(TorchImportError, match=r"\(random\.uniform\) at .*probability = random\.uniform\(0, 1\)"):
        hloalias.compile(_LayerDropInEval().train(), (torch.zeros(2),))


def test_numpy_random_in_a_forward_is_refused_and_its_state_restored() -> None:
    np.random.seed(11)
    expected = np.random.RandomState(11).rand(4)
    original = np.random.rand
    with pytest.raises(TorchImportError, match=r"\(numpy\.random\.rand\) at .*in _numpy_mask"):
        hloalias.compile(_numpy_mask, (torch.randn(2, 2),))
    assert np.random.rand is original  # the watch is gone
    np.testing.assert_array_equal(np.random.rand(4), expected)


def test_numpy_random_in_a_training_step_is_refused() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = copy.deepcopy(model.state_dict())

    def step(x: torch.Tensor) -> torch.Tensor:
        drop = int(np.random.choice(4))  # a host draw picks a feature to drop
        loss = model(x)[:, drop].square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    with pytest.raises(TrainingCaptureError, match=r"\(numpy\.random\.choice\) at .*in step: drop = int\(np\.random\.choice\(4\)\)"):
        hloalias.compile_training_step(step, model, opt, (torch.randn(2, 4),))
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_torch_random_ops_and_other_threads_draws_are_not_refused() -> None:
    stop = threading.Event()

    def draw_elsewhere() -> None:
        while not stop.is_set():
            np.random.rand(2)
            random.random()

    other = threading.Thread(target=draw_elsewhere)
    other.start()
    try:
        exe = hloalias.compile(lambda x: x + torch.rand_like(x), (torch.zeros(3),))
    finally:
        stop.set()
        other.join()
    out = exe(torch.zeros(3))
    assert out.shape == (3,) and bool(((out >= 0) & (out < 1)).all())


def test_a_module_imported_during_the_trace_may_draw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Top-level code runs once per process, traced or not: jax draws with
    np.random as it loads ``k8s_cluster`` lazily during a trace."""
    (tmp_path / "draws_on_import.py").write_text("import numpy as np\nJITTER = float(np.random.rand())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("draws_on_import", None)

    def forward(x: torch.Tensor) -> torch.Tensor:
        importlib.import_module("draws_on_import")
        return x * 2

    try:
        exe = hloalias.compile(forward, (torch.ones(2),))
    finally:
        sys.modules.pop("draws_on_import", None)
    assert torch.equal(exe(torch.ones(2)), torch.full((2,), 2.0))


def test_the_watch_s_wrappers_are_built_once_per_process() -> None:
    """Every trace reuses the same wrappers of the drawing functions
    (~65, built with ``functools.wraps`` each: about half of the watch's
    cost per trace, bench/RESULTS-latency.md); they report to the trace now
    active.  Before, each trace built its own."""
    from hloalias.frontend import host_random

    seen: list[tuple[object, object]] = []
    for _ in range(2):
        with host_random.refuse_host_random_draws():
            seen.append((np.random.rand, random.random))
    assert seen[0][0] is seen[1][0] and seen[0][1] is seen[1][1]
    assert seen[0][0] != np.random.mtrand._rand.rand  # a wrapper, not the generator's method
    # Each trace's record is its own: a draw in the second is refused there.
    with pytest.raises(TorchImportError, match=r"numpy\.random\.rand"):
        with host_random.refuse_host_random_draws():
            np.random.rand(2)
    with host_random.refuse_host_random_draws():
        pass
    assert np.random.rand == np.random.mtrand._rand.rand


def test_a_function_replaced_between_traces_is_watched_and_put_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrappers are rebuilt when a watched module's functions changed:
    a drawing function the caller replaced with another of the generator's
    methods is the one watched and put back, never an earlier original."""
    from hloalias.frontend import host_random

    with host_random.refuse_host_random_draws():
        pass
    monkeypatch.setattr(np.random, "rand", np.random.mtrand._rand.random_sample)
    replaced = np.random.rand
    with pytest.raises(TorchImportError, match=r"numpy\.random\.rand"):
        with host_random.refuse_host_random_draws():
            np.random.rand(2)
    assert np.random.rand is replaced


def test_a_watch_inside_a_watch_leaves_the_record_to_the_outer_one() -> None:
    from hloalias.frontend import host_random

    with pytest.raises(TrainingCaptureError, match=r"numpy\.random\.choice"):
        with host_random.refuse_host_random_draws(TrainingCaptureError):
            with host_random.refuse_host_random_draws():
                np.random.choice(3)
            assert np.random.choice != np.random.mtrand._rand.choice  # still watched
    assert np.random.choice == np.random.mtrand._rand.choice
