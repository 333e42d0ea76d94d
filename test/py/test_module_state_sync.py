"""A call reads the module's state as eager would, after torch changed it.

The device holds one copy of each state tensor (runtime/state.py).  When
torch changes the module's own tensor after compiling (``m.weight.mul_(2)``,
``cache.zero_()``, ``model.load_state_dict``, ``m.to(torch.float64)``), the
next call, and ``state_dict()``, see it:

- a tensor torch changed is read again: the user's write is the newest
  value, also where calls updated the state on the device since (the
  module's tensor holds what it held when the two last agreed: at compile,
  ``write_back()``, or the previous re-read);
- a dtype or shape change is an ExecutionError naming the tensor;
- ``Executable.write_back()`` and ``TrainingStep.write_back()`` copy the
  device state into the module, so that an edit made after it starts from
  what calls left;
- a module attribute given another tensor (``m.w = nn.Parameter(...)``, a
  buffer assigned, ``load_state_dict(assign=True)``, a replaced submodule)
  is what the next call reads and updates; a buffer set to None, given
  another dtype or shape, untied from a tied name, or replaced under a training step, it
  is an ExecutionError naming it.

Each on both call paths; nothing changes when a call is refused."""

from __future__ import annotations

import pytest
import torch

import hloalias
from hloalias.errors import ExecutionError

from test_runtime_transaction import PATHS, compile_on


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]), requires_grad=False)
        self.b = torch.nn.Parameter(torch.tensor([0.5, 0.5, 0.5]), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x + self.b


class Accumulator(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x)
        return self.total * 2


@pytest.mark.parametrize("path", PATHS)
def test_an_in_place_change_of_a_parameter_is_read_by_the_next_call(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Affine()
    x = torch.tensor([1.0, 1.0, 2.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    torch.testing.assert_close(exe(x), model(x))
    with torch.no_grad():
        model.w.mul_(2)
        model.b.fill_(-1.0)
    torch.testing.assert_close(exe(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(exe.state_dict()["w"], model.w.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_a_module_loaded_from_a_state_dict_is_read_by_the_next_call(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, other = Affine(), Affine()
    with torch.no_grad():
        other.w.copy_(torch.tensor([7.0, 8.0, 9.0]))
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(exe(x), other(x), rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_a_module_converted_to_another_dtype_is_refused_by_name(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Affine()
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    before = exe(x)
    model.to(torch.float64)
    with pytest.raises(ExecutionError, match=r"module state 'w' is now torch.float64 \[3\].*compile again"):
        exe(x)
    again = hloalias.compile(model, (x.double(),))  # "compile again" works
    torch.testing.assert_close(again(x.double()), model(x.double()), rtol=0, atol=0)
    with pytest.raises(ExecutionError, match="module state 'w' is now torch.float64"):
        exe(x)
    model.to(torch.float32)  # the same values again, in new memory
    torch.testing.assert_close(exe(x), before, rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_a_reset_of_state_no_call_updated_is_read(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Accumulator()
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    with torch.no_grad():
        model.total.fill_(10.0)
    torch.testing.assert_close(exe(x), torch.tensor([22.0, 24.0, 26.0]), rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_a_reset_after_calls_is_the_newest_value(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Accumulator()
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    exe(x)  # the device holds 2x; the module's tensor still 0
    with torch.no_grad():
        model.total.zero_()  # a reset between sequences
    torch.testing.assert_close(exe.state_dict()["total"], torch.zeros(3), rtol=0, atol=0)
    torch.testing.assert_close(exe(x), x * 2, rtol=0, atol=0)
    torch.testing.assert_close(exe(x), x * 4, rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_write_back_then_an_edit_starts_from_what_calls_left(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Accumulator()
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    exe.write_back()
    torch.testing.assert_close(model.total, x, rtol=0, atol=0)
    with torch.no_grad():
        model.total.mul_(10)  # eager's edit of what calls left
    torch.testing.assert_close(exe(x), x * 22, rtol=0, atol=0)
    model.load_state_dict(exe.state_dict())  # equal values: nothing changes
    torch.testing.assert_close(exe(x), x * 24, rtol=0, atol=0)


def test_eager_changes_after_write_back_reach_the_next_training_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, target = torch.randn(3, 4), torch.randn(3, 2)

    def training_step(inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    step = hloalias.compile_training_step(training_step, model, optimizer, (x, target))

    def eager_step() -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(reference(x), target)
        loss.backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        return loss.detach()

    torch.testing.assert_close(step(x, target), eager_step())
    step.write_back()
    with torch.no_grad():  # an eager edit of the trained weights
        model.weight.mul_(0.5)
        reference.weight.mul_(0.5)
    torch.testing.assert_close(step(x, target), eager_step())
    step.write_back()
    torch.testing.assert_close(model.weight, reference.weight)


@pytest.mark.parametrize("path", PATHS)
def test_a_replaced_parameter_is_read_by_the_next_call(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Affine()
    x = torch.tensor([1.0, 1.0, 2.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    model.w = torch.nn.Parameter(torch.tensor([5.0, 6.0, 7.0]), requires_grad=False)
    torch.testing.assert_close(exe(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(exe.state_dict()["w"], model.w.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_a_replaced_buffer_receives_the_calls_updates(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, reference = Accumulator(), Accumulator()
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    reference(x)
    model.total = torch.full((3,), 10.0)
    reference.total = torch.full((3,), 10.0)
    torch.testing.assert_close(exe(x), reference(x), rtol=0, atol=0)
    exe.write_back()
    torch.testing.assert_close(model.total, reference.total, rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_state_loaded_with_assign_and_a_replaced_submodule_are_read(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    x = torch.randn(4, 3)
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    other = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    model.load_state_dict(other.state_dict(), assign=True)
    torch.testing.assert_close(exe(x), model(x))  # XLA's dot rounds apart from torch's
    model[2] = torch.nn.Linear(3, 2)
    torch.testing.assert_close(exe(x), model(x))


@pytest.mark.parametrize("path", PATHS)
def test_a_replacement_the_program_cannot_follow_is_refused_by_name(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Affine()
    x = torch.tensor([1.0, 1.0, 2.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    model.w = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
    with pytest.raises(ExecutionError, match=r"module state 'w' is now torch.float32 \[4\]"):
        exe(x)
    accumulator = Accumulator()
    counting = compile_on(path, monkeypatch, accumulator, (x,))
    counting(x)
    accumulator.total = None  # torch's buffer hooks see it (a parameter set to None goes unseen)
    with pytest.raises(ExecutionError, match=r"module state 'total' was removed"):
        counting(x)


def test_untying_a_tied_weight_is_refused() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4, bias=False)
            self.b = torch.nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    model = Tied()
    x = torch.randn(2, 4)
    exe = hloalias.compile(model, (x,))
    exe(x)
    model.b.weight = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ExecutionError, match=r"tied names \['a.weight', 'b.weight'\]"):
        exe(x)


def test_a_parameter_replaced_under_a_training_step_is_refused() -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.randn(3, 4), torch.randn(3, 2)

    def training_step(inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    step = hloalias.compile_training_step(training_step, model, optimizer, (x, target))
    step(x, target)
    model.weight = torch.nn.Parameter(torch.zeros(2, 4))
    with pytest.raises(ExecutionError, match="module state .*weight.* a training step follows no replaced parameter .*its optimizer holds"):
        step(x, target)


def test_the_native_and_python_checks_agree() -> None:
    """``_lane.first_changed`` is the Python loop in native code: the same
    index for an in-place change, a swapped ``.data``, a dead reference."""
    import gc
    import weakref

    from hloalias.runtime import lane, state

    native = lane.native_first_changed()
    if native is None:
        pytest.skip("the native call path is not built here")
    tensors = [torch.zeros(3) for _ in range(4)]
    refs = tuple(weakref.ref(t) for t in tensors)

    def recorded() -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(t._version for t in tensors), tuple(t.data_ptr() for t in tensors)

    versions, pointers = recorded()
    checks = (native, state._first_changed_in_python)
    assert [check(refs, versions, pointers) for check in checks] == [-1, -1]
    tensors[2].add_(1)
    assert [check(refs, versions, pointers) for check in checks] == [2, 2]
    versions, pointers = recorded()
    tensors[1].data = torch.ones(3)  # no version counted, new memory
    assert [check(refs, versions, pointers) for check in checks] == [1, 1]
    versions, pointers = recorded()
    tensors[0] = torch.zeros(3)  # the first one dies
    gc.collect()
    assert [check(refs, versions, pointers) for check in checks] == [-1, -1]
    with pytest.raises(TypeError):
        native(refs, versions[:1], pointers)


def test_a_tied_model_loaded_with_assign_stays_tied() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4, bias=False)
            self.b = torch.nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    model, other = Tied(), Tied()
    x = torch.randn(2, 4)
    exe = hloalias.compile(model, (x,))
    exe(x)
    model.load_state_dict(other.state_dict(), assign=True)  # two Parameters over other's one storage
    assert model.a.weight.data_ptr() == model.b.weight.data_ptr()
    torch.testing.assert_close(exe(x), model(x))


@pytest.mark.parametrize("path", PATHS)
def test_a_checkpoint_of_the_module_holds_what_calls_left(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.state_dict()`` (torch.save, save_pretrained) without
    ``write_back()`` first copies the calls' state updates into the module:
    a checkpoint never holds the compile-time state."""
    import io

    model, reference = Accumulator(), Accumulator()
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    for _ in range(3):
        exe(x)
        reference(x)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    torch.testing.assert_close(saved["total"], reference.total, rtol=0, atol=0)
    torch.testing.assert_close(model.total, reference.total, rtol=0, atol=0)  # eager's tensor, updated in place
    # The module and the device agree again: the calls go on from there.
    torch.testing.assert_close(exe(x), reference(x), rtol=0, atol=0)
    torch.testing.assert_close(model.state_dict()["total"], reference.total, rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_a_deepcopy_or_pickle_of_the_module_holds_what_calls_left(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``copy.deepcopy(model)`` (an EMA or best-model snapshot) copied the
    compile-time state, and ``torch.save(model)`` failed ("Can't pickle
    local object ... write_back_before_forward"): both now hold what calls
    left, as plain modules, and the compiled module goes on."""
    import copy
    import io

    model, reference = Accumulator(), Accumulator()
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    for _ in range(2):
        exe(x)
        reference(x)
    snapshot = copy.deepcopy(model)
    torch.testing.assert_close(snapshot.total, reference.total, rtol=0, atol=0)
    assert not snapshot._forward_pre_hooks and not snapshot._state_dict_pre_hooks
    assert "__reduce_ex__" not in snapshot.__dict__
    exe(x)
    reference(x)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded.total, reference.total, rtol=0, atol=0)
    assert not loaded._forward_pre_hooks and "__reduce_ex__" not in loaded.__dict__
    torch.testing.assert_close(snapshot.total, 2 * x, rtol=0, atol=0)  # the snapshot is its own
    torch.testing.assert_close(exe(x), reference(x), rtol=0, atol=0)
    torch.testing.assert_close(model.state_dict()["total"], reference.total, rtol=0, atol=0)


@pytest.mark.parametrize("path", PATHS)
def test_a_checkpoint_after_an_edit_holds_the_edit(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Accumulator()
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    exe(x)
    with torch.no_grad():
        model.total.fill_(7.0)  # the user's write is the newest value
    torch.testing.assert_close(model.state_dict()["total"], torch.full((3,), 7.0), rtol=0, atol=0)
    torch.testing.assert_close(exe(x), (7.0 + x) * 2, rtol=0, atol=0)


def test_a_recompile_after_calls_starts_from_what_calls_left() -> None:
    """torch.export reads ``state_dict()`` of the module it traces: a second
    program compiled after calls (another batch size) continues the state."""
    model, reference = Accumulator(), Accumulator()
    x = torch.tensor([1.0, 2.0, 3.0])
    first = hloalias.compile(model, (x,))
    first(x)
    reference(x)
    second = hloalias.compile(model, (x * 2,))
    torch.testing.assert_close(second(x * 2), reference(x * 2), rtol=0, atol=0)
    torch.testing.assert_close(first(x), reference(x), rtol=0, atol=0)
    torch.testing.assert_close(model.state_dict()["total"], reference.total, rtol=0, atol=0)


def _compiled_and_eager_mlp(make_optimizer):  # type: ignore[no-untyped-def]
    """An MLP and its eager twin, their optimizers, a batch, the compiled
    training step and the eager one."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    reference.load_state_dict(model.state_dict())
    optimizer, reference_optimizer = make_optimizer(model.parameters()), make_optimizer(reference.parameters())
    x, target = torch.randn(6, 4), torch.randn(6, 2)

    def make_step(net: torch.nn.Module, opt: torch.optim.Optimizer):  # type: ignore[no-untyped-def]
        def training_step(inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(net(inputs), labels)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return training_step

    step = hloalias.compile_training_step(make_step(model, optimizer), model, optimizer, (x, target))
    return model, reference, optimizer, reference_optimizer, x, target, step, make_step(reference, reference_optimizer)


def test_a_checkpoint_of_model_and_optimizer_holds_the_trained_state() -> None:
    """Without ``write_back()``: ``model.state_dict()`` and
    ``optimizer.state_dict()`` after compiled AdamW steps equal eager's."""
    model, reference, optimizer, reference_optimizer, x, target, step, eager_step = _compiled_and_eager_mlp(
        lambda params: torch.optim.AdamW(params, lr=0.05)
    )
    for _ in range(3):
        step(x, target)
        eager_step(x, target)
    saved, expected = model.state_dict(), reference.state_dict()
    for name in expected:
        torch.testing.assert_close(saved[name], expected[name])
    state, expected_state = optimizer.state_dict()["state"], reference_optimizer.state_dict()["state"]
    assert sorted(state) == sorted(expected_state)
    for index in expected_state:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(state[index][key].float(), expected_state[index][key].float())
    # Training goes on from the device state, as it would have.
    step(x, target)
    eager_step(x, target)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value)


@pytest.mark.parametrize("path", PATHS)
def test_an_eager_forward_after_calls_reads_what_calls_left(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager code calling the module between compiled calls (an evaluation,
    a fallback) sees the state as eager would have it, and the next compiled
    call continues from what the eager call left."""
    model, reference = Accumulator(), Accumulator()
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = compile_on(path, monkeypatch, model, (x,))
    exe(x)
    reference(x)
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)  # eager, on the module itself
    torch.testing.assert_close(exe(x), reference(x), rtol=0, atol=0)
    # A bare read: the compiled call's state, as eager's (it showed the
    # eager call's [2, 4, 6] before bare reads copied the device state in).
    torch.testing.assert_close(model.total, reference.total, rtol=0, atol=0)
    torch.testing.assert_close(model.total, torch.tensor([3.0, 6.0, 9.0]), rtol=0, atol=0)
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)


def test_torch_compile_and_hloalias_compile_of_one_module_share_its_state() -> None:
    model, reference = Accumulator(), Accumulator()
    x = torch.tensor([1.0, 2.0, 3.0])
    exe = hloalias.compile(model, (x,))
    exe(x)
    exe(x)
    reference(x)
    reference(x)
    compiled = torch.compile(model, backend="hloalias")
    torch.testing.assert_close(compiled(x), reference(x), rtol=0, atol=0)
    torch.testing.assert_close(exe(x), reference(x), rtol=0, atol=0)
    torch.testing.assert_close(compiled(x), reference(x), rtol=0, atol=0)
    torch._dynamo.reset()


def test_an_eager_evaluation_after_training_steps_sees_the_trained_weights() -> None:
    """Train with compiled steps, evaluate in eager without write_back()."""
    model, reference, optimizer, reference_optimizer, x, target, step, eager_step = _compiled_and_eager_mlp(
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)
    )
    for _ in range(2):
        step(x, target)
        eager_step(x, target)
        with torch.no_grad():
            torch.testing.assert_close(model(x), reference(x))  # an evaluation between steps
    step(x, target)
    eager_step(x, target)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x))


def test_a_program_with_no_effect_checks_the_state_while_it_runs() -> None:
    """A program that donates and writes nothing (Affine) checks torch's
    edits after its launch: the run on the old state is dropped (natively:
    the call goes to the Python path once) and the call returns what eager
    does.  A program that writes state (Accumulator) checks before it runs."""
    model = Affine()
    x = torch.tensor([1.0, 1.0, 2.0])
    exe = hloalias.compile(model, (x,))
    assert exe._watch_late
    assert not hloalias.compile(Accumulator(), (x,))._watch_late
    if exe._lane is None:
        pytest.skip("the native call path is not built here")
    torch.testing.assert_close(exe(x), model(x), rtol=0, atol=0)
    before = exe._lane.counts
    with torch.no_grad():
        model.w.mul_(2)
    torch.testing.assert_close(exe(x), model(x), rtol=0, atol=0)
    after = exe._lane.counts
    assert after["fallbacks"] == before["fallbacks"] + 1  # the run on the old state, dropped
    assert after["calls"] == before["calls"]
    torch.testing.assert_close(exe(x), model(x), rtol=0, atol=0)
    assert exe._lane.counts["calls"] == after["calls"] + 1  # in agreement again: natively
