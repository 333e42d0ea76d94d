"""Every call is a transaction, and what a call hands back is eager's.

- An exception at any stage of a call (``KeyboardInterrupt`` included)
  leaves the module state as it was before the call or as the call leaves
  it, and usable: faults are injected at each stage boundary (before the
  program runs, after it ran and before the commit, in the commit, in the
  outputs), on both call paths.
- A donated torch tensor is left as it was, wherever its memory came from
  (an earlier result's runtime buffer included), with every view of it.
- ``buf.copy_(x)`` of another dtype or shape, then ``return self.buf``:
  the state and the returned tensor are eager's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

import hloalias
from hloalias.runtime import executable as executable_module, execution as execution_module, state as state_module

PATHS = ["native", "python"]


def compile_on(
    path: str, monkeypatch: pytest.MonkeyPatch, *args: Any, lane: bool = True, **kwargs: Any
) -> hloalias.Executable:
    """``hloalias.compile`` on one call path (``lane``: the native one must
    serve this program; else the program may be one it leaves to Python)."""
    with monkeypatch.context() as patch:
        patch.setenv("HLOALIAS_NATIVE", "1" if path == "native" else "0")
        exe = hloalias.compile(*args, **kwargs)
    if path == "native":
        if executable_module._lane is None:
            pytest.skip("the native call path is not built here")
        assert exe._lane is not None or not lane, exe._python_only_reason
    else:
        assert exe._lane is None
    return exe


class Counter(torch.nn.Module):
    """State updated in place every call (donated, written in place), and
    a pytree output (so the output stage runs Python on both paths)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0, 4.0]), requires_grad=False)
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        self.count.add_(x)
        return {"y": self.w * x + self.count}


class Fault(BaseException):
    """Stands for KeyboardInterrupt (which pytest would take as the user's)."""


def _raise_once(counter: list[int]) -> None:
    if counter[0] == 0:
        counter[0] += 1
        raise Fault


def _inject_after_the_run(stage: str, monkeypatch: pytest.MonkeyPatch, fired: list[int]) -> None:
    """The stages both call paths share: storing a state slot's new buffer
    (``commit``) and structuring the outputs (``outputs``)."""
    if stage == "commit":
        slot_type = state_module._StateSlot
        prop = slot_type.__dict__["array"]

        def setter(slot: Any, value: Any) -> None:
            _raise_once(fired)
            prop.fset(slot, value)

        monkeypatch.setattr(slot_type, "array", property(prop.fget, setter))
    elif stage == "outputs":
        original_unflatten = pytree.tree_unflatten

        def unflatten(*args: Any, **kwargs: Any) -> Any:
            _raise_once(fired)
            return original_unflatten(*args, **kwargs)

        monkeypatch.setattr(pytree, "tree_unflatten", unflatten)
    else:
        raise AssertionError(stage)


@pytest.fixture
def inject(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, hloalias.Executable], None]]:
    """``inject(stage, exe)``: the next call of ``exe`` raises at ``stage``."""

    def at(stage: str, exe: hloalias.Executable) -> None:
        fired = [0]
        if stage == "before-run":
            original_put = execution_module.torch_to_device

            def put(*args: Any, **kwargs: Any) -> Any:
                _raise_once(fired)
                return original_put(*args, **kwargs)

            monkeypatch.setattr(execution_module, "torch_to_device", put)
        elif stage == "after-run":
            dispatch = exe._plan.dispatch  # type: ignore[union-attr]
            original_wait = dispatch.wait

            def wait(results: Any) -> None:
                original_wait(results)
                _raise_once(fired)

            monkeypatch.setattr(dispatch, "wait", wait)
        else:
            _inject_after_the_run(stage, monkeypatch, fired)

    yield at


def _stop_at_every_stage(
    exe: hloalias.Executable, inject: Callable[[str, hloalias.Executable], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls of ``exe`` (compiled from a ``Counter``) stopped at each stage
    by ``inject``: the state after each is the one before the call or the
    call's, usable, and later calls go on from it as eager does."""
    eager = Counter()
    x = torch.tensor([0.5, 1.0, 1.5, 2.0])
    torch.testing.assert_close(exe(x.clone())["y"], eager(x.clone())["y"])
    for stage in ("before-run", "after-run", "commit", "outputs"):
        before = exe.state_dict()["count"]
        calls = exe._calls
        with monkeypatch.context():
            inject(stage, exe)
            with pytest.raises(Fault):
                exe(x.clone())
        after = exe.state_dict()["count"]  # usable: no DonatedBufferError
        assert torch.equal(after, before) or torch.equal(after, before + x), (stage, before, after)
        if not torch.equal(after, before):
            eager(x.clone())  # the interrupted call took effect: eager's too
        # The call count (named by a consumed buffer's error) counts the
        # call exactly when its effects were committed.
        assert exe._calls == calls + (not torch.equal(after, before)), (stage, calls, exe._calls)
        # Later calls see that state and update it in place as before.
        for _ in range(2):
            torch.testing.assert_close(exe(x.clone())["y"], eager(x.clone())["y"])
        torch.testing.assert_close(exe.state_dict()["count"], eager.count)
        assert exe._calls == calls + (not torch.equal(after, before)) + 2, stage


@pytest.mark.parametrize("path", PATHS)
def test_a_call_stopped_at_any_stage_leaves_state_before_or_after_and_usable(
    path: str, monkeypatch: pytest.MonkeyPatch, inject: Callable[[str, hloalias.Executable], None]
) -> None:
    module = Counter()
    exe = compile_on(path, monkeypatch, module, (torch.ones(4),))
    _stop_at_every_stage(exe, inject, monkeypatch)
    if path == "native":
        assert exe._lane is not None and exe._lane.counts["calls"] >= 8


@pytest.mark.parametrize("path", PATHS)
def test_a_training_write_back_after_an_interrupted_call_keeps_the_weights(
    path: str, monkeypatch: pytest.MonkeyPatch, inject: Callable[[str, hloalias.Executable], None]
) -> None:
    """The issue's symptom: after a KeyboardInterrupt mid-call every later
    call, state_dict() and write-back raised DonatedBufferError."""
    module = Counter()
    exe = compile_on(path, monkeypatch, module, (torch.ones(4),))
    inject("after-run", exe)
    with pytest.raises(Fault):
        exe(torch.ones(4))
    monkeypatch.undo()
    assert torch.equal(exe.state_dict()["count"], torch.ones(4))
    assert exe._calls == 1  # the call's effects were committed: it counts
    exe(torch.ones(4))
    assert torch.equal(exe.state_dict()["count"], torch.full((4,), 2.0))
    assert exe._calls == 2


# -- donated tensors are left as they were ------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_a_donated_result_of_another_executable_is_left_as_it_was(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make = compile_on(path, monkeypatch, lambda x: x + 1, (torch.zeros(4),))
    double = compile_on(path, monkeypatch, lambda x: x * 2, (torch.zeros(4),), donate=["x"])
    y = make(torch.zeros(4))  # a runtime-owned result
    view = y[0:2]
    plain = torch.ones(4)
    z = double(y)
    z_plain = double(plain)
    assert torch.equal(z, torch.full((4,), 2.0)) and torch.equal(z_plain, torch.full((4,), 2.0))
    # As a plain torch tensor is: left intact, its views too, no shared memory.
    assert torch.equal(y, torch.ones(4)) and torch.equal(view, torch.ones(2)) and torch.equal(plain, torch.ones(4))
    assert z.data_ptr() != y.data_ptr()
    # Donated again (the chain ``y = exe(y)``): still each value right.
    for step in range(3):
        y = double(y)
        assert torch.equal(y, torch.full((4,), 2.0 ** (step + 1)))
    assert torch.equal(view, torch.ones(2))


# -- copy_ into state of another dtype or shape ---------------------------------------


class CopyInto(torch.nn.Module):
    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(shape, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.buf.copy_(x)
        return self.buf


COPIES = {
    "float-into-int64": (torch.int64, (4,), torch.tensor([1.5, 2.5, -3.7, 4.2])),
    "bf16-into-int64": (torch.int64, (4,), torch.tensor([1.5, 2.5, -3.7, 4.2]).bfloat16()),
    "broadcast-row": (torch.float32, (3, 4), torch.arange(4.0)),
    "narrowing-f32-into-f16": (torch.float16, (4,), torch.tensor([1e6, 2.0, 3.0, -1e6])),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(COPIES))
def test_returned_state_after_a_converting_copy_is_eager(case: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dtype, shape, x = COPIES[case]
    exe = compile_on(path, monkeypatch, CopyInto(dtype, shape), (x,), lane=False)
    eager = CopyInto(dtype, shape)
    want = eager(x)
    for _ in range(2):
        got = exe(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want), (got, want)
        assert torch.equal(exe.state_dict()["buf"], eager.buf)


def test_functionalization_drops_copy_conversions_upstream() -> None:
    """Why the importer spells out ``copy_``'s conversion: torch's own
    decomposition of ``buf.copy_(x)`` with ``x`` of another dtype returns
    ``x`` unconverted as the buffer's new value.  If this starts failing,
    torch fixed it and ``_explicit_copy_conversions`` can go."""
    exported = torch.export.export(CopyInto(torch.int64, (4,)), (torch.randn(4),))
    graph = exported.run_decompositions().graph
    output = next(node for node in graph.nodes if node.op == "output")
    returned = output.args[0]
    assert all(value.meta["val"].dtype == torch.float32 for value in returned)


# -- a mesh: the same transaction -------------------------------------------------------


def _mesh_or_skip() -> hloalias.Mesh:
    import jax

    if len(jax.devices("cpu")) < 2:
        pytest.skip("fewer than 2 CPU devices (conftest forces the host device count)")
    return hloalias.Mesh((2,), ("dp",), platform="cpu")


@pytest.fixture
def inject_mesh(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, hloalias.Executable], None]]:
    """``inject_mesh(stage, exe)``: the next call of ``exe`` (a program on a
    mesh) raises at ``stage``."""

    def at(stage: str, exe: hloalias.Executable) -> None:
        fired = [0]
        placement = exe._placement
        if stage == "before-run":
            original_put = placement.put

            def put(*args: Any, **kwargs: Any) -> Any:
                _raise_once(fired)
                return original_put(*args, **kwargs)

            monkeypatch.setattr(placement, "put", put)
        elif stage == "after-run":
            original_assemble = placement.assemble_outputs

            def assemble(*args: Any, **kwargs: Any) -> Any:
                _raise_once(fired)
                return original_assemble(*args, **kwargs)

            monkeypatch.setattr(placement, "assemble_outputs", assemble)
        else:
            _inject_after_the_run(stage, monkeypatch, fired)

    yield at


def test_a_mesh_call_stopped_at_any_stage_leaves_state_before_or_after_and_usable(
    monkeypatch: pytest.MonkeyPatch, inject_mesh: Callable[[str, hloalias.Executable], None]
) -> None:
    """The mesh call path (no call plan): the same transaction as one device."""
    mesh = _mesh_or_skip()
    module = Counter()
    exe = hloalias.compile(module, (torch.ones(4),), mesh=mesh, shardings={"x": ("dp",)})
    assert exe._plan is None  # the mesh path
    # The state is donated and written in place: an interrupted commit would lose it.
    assert any(entry["argument"] == "count" for entry in exe.aliases)
    _stop_at_every_stage(exe, inject_mesh, monkeypatch)


def test_a_mesh_call_interrupted_after_it_ran_keeps_the_call_state() -> None:
    """After the program ran its donated state buffer is gone: the state
    must be the call's (not lost), as on one device."""
    mesh = _mesh_or_skip()
    exe = hloalias.compile(Counter(), (torch.ones(4),), mesh=mesh, shardings={"x": ("dp",)})
    placement = exe._placement
    original = placement.assemble_outputs
    fired = [0]

    def assemble(*args: Any, **kwargs: Any) -> Any:
        _raise_once(fired)
        return original(*args, **kwargs)

    placement.assemble_outputs = assemble  # type: ignore[method-assign]
    try:
        with pytest.raises(Fault):
            exe(torch.ones(4))
    finally:
        placement.assemble_outputs = original  # type: ignore[method-assign]
    assert torch.equal(exe.state_dict()["count"], torch.ones(4))
    assert exe._calls == 1  # the call's effects were committed: it counts
    exe(torch.ones(4))
    assert torch.equal(exe.state_dict()["count"], torch.full((4,), 2.0))
    assert exe._calls == 2


# -- an interrupt at every point of a call ----------------------------------------------


class _InterruptAt:
    """A ``sys.setprofile`` hook that raises :class:`Fault` at the
    ``at``-th profile event of a call (each Python function's entry and
    return, each C function called from Python bytecode and its return):
    where the interpreter also runs a pending signal handler, so a
    ``KeyboardInterrupt`` can land there.  ``c_return`` of XLA's execute
    (jaxlib's ``execute_sharded`` or the fast-path entry, called from
    Python) is the point right after the program ran and before its results
    are stored anywhere; a ``call`` inside jaxlib's cache-miss callback is
    the first call of a new argument placement.  C code calling C code (the
    native lane calling jaxlib) has no such point, as it has no signal check."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.seen = 0
        self.fired: tuple[str, str] | None = None
        self.active = False

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if not self.active:
            return
        if self.seen == self.at:
            self.active = False
            name = getattr(arg, "__qualname__", repr(arg)) if event.startswith("c_") else frame.f_code.co_qualname
            self.fired = (event, name)
            raise Fault
        self.seen += 1


def _interrupt_at_every_point(exe: hloalias.Executable, *, new_placement: bool) -> list[tuple[str, str]]:
    """Calls of ``exe`` (compiled from a ``Counter``), the k-th interrupted
    at its k-th profile event (:class:`_InterruptAt`), for every k until a
    call runs to its end: after each, the state is the one before the call
    or the call's, usable, and later calls go on from it as eager does.
    ``new_placement``: each call is the first of its argument placement
    (a fresh dispatch: jaxlib's fast path misses and calls back into
    Python).  Returns the points where an interrupt fired."""
    import gc
    import sys

    plan = exe._plan
    assert plan is not None
    eager = Counter()
    x = torch.tensor([0.5, 1.0, 1.5, 2.0])
    torch.testing.assert_close(exe(x.clone())["y"], eager(x.clone())["y"])
    points: list[tuple[str, str]] = []
    gc.disable()  # no collection (and its callbacks) shifting the events
    try:
        for at in range(100_000):
            if new_placement:
                plan.dispatch = plan.new_dispatch(exe)
            before = exe.state_dict()["count"]
            calls = exe._calls
            arg = x.clone()
            hook = _InterruptAt(at)
            sys.setprofile(hook)
            try:
                hook.active = True
                exe(arg)
                hook.active = False
            except Fault:
                pass
            finally:
                hook.active = False
                sys.setprofile(None)
            where = (at, hook.fired)
            try:
                after = exe.state_dict()["count"]  # usable: no DonatedBufferError
            except hloalias.HloaliasError as error:
                raise AssertionError(f"state lost by an interrupt at {where}: {error}") from None
            assert torch.equal(after, before) or torch.equal(after, before + x), (where, before, after)
            if not torch.equal(after, before):
                eager(x.clone())  # the interrupted call took effect: eager's too
            # Counted exactly when its effects were committed.
            assert exe._calls == calls + (not torch.equal(after, before)), (where, calls, exe._calls)
            torch.testing.assert_close(exe(x.clone())["y"], eager(x.clone())["y"], msg=lambda m: f"{where}: {m}")
            torch.testing.assert_close(exe.state_dict()["count"], eager.count)
            if hook.fired is None:
                return points
            points.append(hook.fired)
    finally:
        gc.enable()
    raise AssertionError("a call of more than 100000 profile events")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("placement", ["seen", "new"])
def test_an_interrupt_at_any_point_of_a_call_leaves_state_before_or_after_and_usable(
    path: str, placement: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24's transaction at every point a KeyboardInterrupt can land,
    not only at stage boundaries: right after XLA's execute returned
    (its donated state buffer gone, the results not stored yet) and inside
    jaxlib's cache-miss callback on a new argument placement among them."""
    exe = compile_on(path, monkeypatch, Counter(), (torch.ones(4),))
    points = _interrupt_at_every_point(exe, new_placement=placement == "new")
    # The sweep reached the points the transaction is about.
    names = {name for _, name in points}
    if placement == "new":
        assert any("_cache_miss" in name for name in names), sorted(names)
    if path == "python":
        assert "list.extend" in names, sorted(names)  # the store of the execute's results
