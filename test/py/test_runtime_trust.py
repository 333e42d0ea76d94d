"""Runtime trust (issue 11): one device copy of module state, live views of
state, a failed call changes nothing, overlapping inputs, names and calling
convention, errors that are ours.  One case (or more) per numbered item."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import hloalias
from hloalias.errors import DonationError, ExecutionError, HloaliasError, TorchImportError


# -- 1: overlapping inputs ------------------------------------------------------


def add_one_to_a(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(1)
    return b * 2


@pytest.mark.parametrize(
    "make_pair",
    [
        lambda t: (t[0:4], t[0:4]),
        lambda t: (t[0:4], t[2:6]),
    ],
    ids=["same_tensor_twice", "overlapping_views"],
)
def test_1_overlapping_written_inputs_are_refused_before_running(make_pair: Any) -> None:
    exe = hloalias.compile(add_one_to_a, (torch.zeros(4), torch.zeros(4)))
    t = torch.zeros(8)
    a, b = make_pair(t)
    with pytest.raises(ExecutionError, match="'a' and 'b' share memory"):
        exe(a, b)
    assert torch.equal(t, torch.zeros(8))


def test_1_disjoint_views_of_one_tensor_are_accepted() -> None:
    exe = hloalias.compile(add_one_to_a, (torch.zeros(4), torch.zeros(4)))
    t = torch.arange(8.0)
    got = exe(t[0::2], t[1::2])  # interleaved, no element in common
    assert torch.equal(got, torch.tensor([2.0, 6.0, 10.0, 14.0]))
    assert torch.equal(t[0::2], torch.tensor([1.0, 3.0, 5.0, 7.0]))


def test_1_read_only_inputs_may_share_memory() -> None:
    exe = hloalias.compile(lambda a, b: a + b, (torch.zeros(4), torch.zeros(4)))
    t = torch.ones(4)
    assert torch.equal(exe(t, t), torch.full((4,), 2.0))


# -- 5: a failed call changes nothing --------------------------------------------


class CountAndWrite(torch.nn.Module):
    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        x.mul_(2)
        return x + self.count


def test_5_requires_grad_leaf_written_in_place_changes_nothing() -> None:
    exe = hloalias.compile(CountAndWrite(), (torch.ones(3),))
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(ExecutionError, match="'x' is a leaf tensor that requires grad"):
        exe(x)
    assert torch.equal(exe.state_dict()["count"], torch.zeros(3))
    assert torch.equal(x.detach(), torch.ones(3))


def test_5_expanded_input_written_in_place_changes_nothing() -> None:
    exe = hloalias.compile(CountAndWrite(), (torch.ones(3),))
    x = torch.ones(1).expand(3)
    with pytest.raises(ExecutionError, match="share memory"):
        exe(x)
    assert torch.equal(exe.state_dict()["count"], torch.zeros(3))


# -- 10: errors are ours ------------------------------------------------------------


def test_10_single_tensor_example_args_is_refused() -> None:
    with pytest.raises(TorchImportError, match=r"example_args is a single tensor.*\(x,\)"):
        hloalias.compile(lambda x: x * 2, torch.ones(3, 2))


@pytest.mark.parametrize(
    ("call", "culprit"),
    [
        (lambda: hloalias.compile(lambda x: x * 2, (torch.ones(2),), kwargs=[1]), "kwargs"),
        (lambda: hloalias.compile(lambda x: x * 2, (torch.ones(2),), donate="x"), r"donate=\['x'\]"),
        (lambda: hloalias.compile(lambda x: x * 2, (torch.ones(2),), pipeline=3), "pipeline"),
        (lambda: hloalias.to_device([1, 2]), "to_device"),
        (lambda: hloalias.to_device(torch.ones(2, device="meta")), "meta"),
    ],
    ids=["kwargs_list", "donate_string", "pipeline_int", "to_device_list", "to_device_meta"],
)
def test_10_malformed_arguments_are_hloalias_errors(call: Any, culprit: str) -> None:
    with pytest.raises(HloaliasError, match=culprit):
        call()


@pytest.mark.parametrize(
    "bad",
    [torch.ones(2, 3, device="meta"), "not a tensor"],
    ids=["meta", "string"],
)
def test_10_load_state_dict_is_all_or_nothing(bad: Any) -> None:
    layer = torch.nn.Linear(3, 2)
    exe = hloalias.compile(layer, (torch.randn(1, 3),))
    before = exe.state_dict()
    with pytest.raises(ExecutionError, match="'weight'"):
        exe.load_state_dict({"bias": torch.full((2,), 9.0), "weight": bad})
    after = exe.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_10_load_state_dict_takes_a_device_tensor() -> None:
    layer = torch.nn.Linear(3, 2)
    exe = hloalias.compile(layer, (torch.randn(1, 3),))
    exe.load_state_dict({"bias": exe.to_device(torch.full((2,), 9.0))})
    assert torch.equal(exe.state_dict()["bias"], torch.full((2,), 9.0))


# -- 8: names -----------------------------------------------------------------------


class WeightInput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * self.weight


def test_8_a_name_of_both_an_input_and_state_is_ambiguous() -> None:
    with pytest.raises(DonationError, match=r"ambiguous.*donate_argnames=\['weight'\].*donate_state=\['weight'\]"):
        hloalias.compile(WeightInput(), (torch.ones(3),), donate=["weight"])


def test_8_inputs_and_state_are_named_apart() -> None:
    by_input = hloalias.compile(WeightInput(), (torch.ones(3),), donate_argnames=["weight"])
    assert [a["argument"] for a in by_input.aliases] in ([], ["weight"])
    assert "hloalias.donation" in by_input.mlir or "jax.buffer_donor" in by_input.mlir
    donor_lines = [line for line in by_input.mlir.splitlines() if "func.func @main" in line][0]
    assert 'hloalias.kind = "user_input", hloalias.name = "weight"' in donor_lines
    by_state = hloalias.compile(WeightInput(), (torch.ones(3),), donate_state=["weight"])
    assert by_state.mlir != by_input.mlir
    with pytest.raises(DonationError, match="unknown module state 'nope'"):
        hloalias.compile(WeightInput(), (torch.ones(3),), donate_state=["nope"])


# -- 9: calling convention ---------------------------------------------------------------


def keywords(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return a * 100 + b * 10 + c


def test_9_calls_bind_like_the_eager_function() -> None:
    exe = hloalias.compile(keywords, (torch.ones(2),), {"b": torch.ones(2), "c": torch.ones(2)})
    a, b, c = torch.full((2,), 1.0), torch.full((2,), 2.0), torch.full((2,), 3.0)
    expected = keywords(a, b, c)
    assert torch.equal(exe(a, b=b, c=c), expected)
    assert torch.equal(exe(a, c=c, b=b), expected)
    assert torch.equal(exe(c=c, b=b, a=a), expected)
    assert torch.equal(exe(a, b, c), expected)


def test_9_mismatch_is_explained_in_words() -> None:
    exe = hloalias.compile(keywords, (torch.ones(2), torch.ones(2), torch.ones(2)))
    with pytest.raises(ExecutionError, match="missing a required argument: 'c'"):
        exe(torch.ones(2), torch.ones(2))
    with pytest.raises(ExecutionError, match=r"input 'c' should be a tensor, got a tuple of 2"):
        exe(torch.ones(2), torch.ones(2), c=(torch.ones(2), torch.ones(2)))
    with pytest.raises(ExecutionError, match=r"input 'b' is list, expected a torch.Tensor"):
        exe(torch.ones(2), [torch.ones(2), torch.ones(2)], torch.ones(2))


# -- 2: views of state stay live -------------------------------------------------------


class Accumulate(torch.nn.Module):
    buf: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.buf.add_(x)
        return self.buf[0:4]


def test_2_a_returned_view_of_state_stays_live() -> None:
    eager, module = Accumulate(), Accumulate()
    exe = hloalias.compile(module, (torch.ones(8),))
    first, eager_first = exe(torch.ones(8)), eager(torch.ones(8))
    second, eager_second = exe(torch.ones(8)), eager(torch.ones(8))
    assert torch.equal(first, eager_first) and torch.equal(first, torch.full((4,), 2.0))
    assert torch.equal(second, eager_second)
    assert exe.host_copies == {"buf": 1}  # the held view forced one copy, reported
    exe.load_state_dict({"buf": torch.full((8,), 5.0)})
    assert torch.equal(first, torch.full((4,), 5.0))


def test_2_device_tensor_view_stays_live() -> None:
    exe = hloalias.compile(lambda x: x.add_(1), (torch.zeros(4),))
    d = exe.to_device(torch.zeros(4))
    view = d.to_torch()
    exe(d)
    assert torch.equal(view, torch.ones(4))
    assert torch.equal(d.to_torch(), torch.ones(4))


# -- 3: one copy of module state ----------------------------------------------------------


def test_3_two_executables_of_one_module_share_its_state() -> None:
    module = Accumulate()
    small = hloalias.compile(module, (torch.ones(8),))
    other = hloalias.compile(module, (torch.ones(8, dtype=torch.float32) * 2,), pipeline=None)
    assert small._slots["buf"] is other._slots["buf"]
    small(torch.ones(8))
    assert torch.equal(other.state_dict()["buf"], torch.ones(8))


class ReadAndWrite(torch.nn.Module):
    """Decode-like: one program writes the buffer, another only reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 8:
            self.buf.add_(x)
            return x * 2
        return self.buf * x.sum()


def test_3_a_reading_executable_sees_every_replacement_of_shared_state() -> None:
    """The reader's argument list is kept between its calls: a write by the
    other executable (donated: a new buffer), a load_state_dict of a
    DeviceTensor (a new buffer) and of a torch tensor (written in place)
    must each show in its next call, and the list must not keep a replaced
    buffer alive."""
    import gc
    import weakref

    eager, module = ReadAndWrite(), ReadAndWrite()
    write = hloalias.compile(module, (torch.ones(8),))
    read = hloalias.compile(module, (torch.ones(2),))
    assert write._slots["buf"] is read._slots["buf"]
    one = torch.ones(2)
    assert torch.equal(read(one), eager(one))  # the list is built here
    old = weakref.ref(read._slots["buf"].array)
    for step in range(3):
        write(torch.full((8,), float(step + 1)))
        eager(torch.full((8,), float(step + 1)))
        assert torch.equal(read(one), eager(one))
    gc.collect()
    assert old() is None  # donated, then dropped by the reader's list too
    replaced = weakref.ref(read._slots["buf"].array)
    read.load_state_dict({"buf": read.to_device(torch.full((8,), 7.0))})
    gc.collect()
    assert replaced() is None  # no list keeps the replaced buffer
    assert torch.equal(read(one), torch.full((8,), 14.0))
    read.load_state_dict({"buf": torch.full((8,), 3.0)})
    assert torch.equal(read(one), torch.full((8,), 6.0))
    assert torch.equal(write(torch.ones(8)), torch.full((8,), 2.0))
    assert torch.equal(read(one), torch.full((8,), 8.0))


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.head(self.emb(ids))
        return result


def test_3_tied_parameters_are_one_buffer_counted_once() -> None:
    module = Tied()
    exe = hloalias.compile(module, (torch.tensor([1, 2]),))
    assert exe._slots["emb.weight"] is exe._slots["head.weight"]
    assert exe.tied_state == {"head.weight": "emb.weight"}
    weight_bytes = 10 * 4 * 4
    ids_bytes = 2 * 8
    assert exe.memory_stats["argument_bytes"] == weight_bytes + ids_bytes
    with torch.no_grad():
        torch.testing.assert_close(exe(torch.tensor([3, 4])), module(torch.tensor([3, 4])))


# -- 7: threads ------------------------------------------------------------------------------


class Counter(torch.nn.Module):
    n: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n.add_(1)
        return x + 1


def test_7_eight_threads_lose_no_update() -> None:
    exe = hloalias.compile(Counter(), (torch.zeros(2),))
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(25):
                exe(torch.zeros(2))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert int(exe.state_dict()["n"]) == 200


# -- 6: lazy conjugate and negative bits --------------------------------------------------------


def test_6_conjugate_and_negative_bits_are_resolved() -> None:
    z = torch.tensor([1 + 2j, 3 - 4j, 5j], dtype=torch.complex64)
    assert z.conj().imag.is_neg()
    real = hloalias.compile(lambda x: x + 0, (torch.zeros(3),))
    assert torch.equal(real(z.conj().imag), z.conj().imag.clone())
    assert torch.equal(real(torch._neg_view(torch.arange(3.0))), -torch.arange(3.0))


# -- 13: detach of a requires-grad input ---------------------------------------------------------


def test_13_detach_returns_a_new_tensor_without_grad() -> None:
    exe = hloalias.compile(lambda x: x.detach(), (torch.ones(3),))
    x = torch.ones(3, requires_grad=True)
    out = exe(x)
    eager = x.detach()
    assert out is not x and not out.requires_grad and out.requires_grad == eager.requires_grad
    assert out.data_ptr() == x.data_ptr()
    out.add_(1)  # eager allows this; it writes x's storage
    assert torch.equal(x.detach(), torch.full((3,), 2.0))


# -- 4: real memory: explain names the inputs that cost a copy ------------------------------------


def test_4_explain_names_mutated_torch_inputs_that_cost_a_copy(capsys: pytest.CaptureFixture[str]) -> None:
    def write_row(cache: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        cache[0].copy_(row)
        return row * 2

    exe = hloalias.compile(write_row, (torch.zeros(4, 8), torch.zeros(8)))
    text = exe.explain()
    assert "'cache' (128 bytes): mutated torch input" in text
    assert [c.name for c in exe.host_copy_plan()] == ["cache"]


# -- 12: whole-buffer copy_ of an input into state --------------------------------------------


class CopyIntoState(torch.nn.Module):
    buf: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.buf.copy_(x)
        return self.buf


def test_12_copy_into_state_returns_the_buffer_not_the_input() -> None:
    exe = hloalias.compile(CopyIntoState(), (torch.zeros(4),))
    x = torch.ones(4)
    out = exe(x)
    assert out is not x and out.data_ptr() != x.data_ptr()
    out.add_(1)  # eager: writes the buffer, not x
    assert torch.equal(x, torch.ones(4))
    assert torch.equal(exe.state_dict()["buf"], torch.full((4,), 2.0))


# -- 14: .contiguous() of a view of a mutated non-contiguous input -----------------------------


def contiguous_of_mutated(x0: torch.Tensor) -> tuple[torch.Tensor]:
    x0.add_(1.0)
    v1 = x0.squeeze(1).contiguous()
    x0.fill_(1.5)
    return (v1,)


def test_14_contiguous_copy_follows_the_callers_strides() -> None:
    def make() -> torch.Tensor:
        return torch.arange(24.0).reshape(4, 1, 6)[..., ::2]

    exe = hloalias.compile(contiguous_of_mutated, (make(),))
    eager_x, x = make(), make()
    (expected,) = contiguous_of_mutated(eager_x)
    (got,) = exe(x)
    assert torch.equal(got, expected)
    assert torch.equal(x, eager_x)


# -- 11: x.view(dtype) to another width -------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "example"),
    [
        (torch.int8, torch.arange(6.0)),
        (torch.float16, torch.arange(6.0)),
    ],
    ids=["f32_to_i8", "f32_to_f16"],
)
def test_11_view_dtype_of_another_width_is_a_view(dtype: torch.dtype, example: torch.Tensor) -> None:
    def program(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x.view(dtype)

    exe = hloalias.compile(program, (example.clone(),))
    x = example.clone()
    got_x, got_view = exe(x)
    eager_x, eager_view = program(example.clone())
    assert got_view.dtype == dtype and got_view.shape == eager_view.shape
    assert torch.equal(got_view.view(torch.uint8), eager_view.view(torch.uint8))
    assert got_view.data_ptr() == x.data_ptr()
    got_view.view(torch.uint8).fill_(0)  # a write through the view reaches x, as in eager
    assert torch.equal(x.view(torch.uint8), torch.zeros_like(x.view(torch.uint8)))


@pytest.mark.parametrize(
    ("dtype", "make"),
    [
        (torch.int32, lambda: torch.arange(24.0).reshape(4, 1, 6)[..., ::2]),  # same width, strided
        (torch.int32, lambda: torch.arange(12.0).reshape(3, 4).t()),  # same width, transposed
        (torch.int8, lambda: torch.arange(24.0).reshape(4, 6)[::2]),  # narrower, rows strided
    ],
    ids=["same_width_strided", "same_width_transposed", "narrower_rows_strided"],
)
def test_11_view_dtype_of_a_non_contiguous_input_views_the_callers_storage(
    dtype: torch.dtype, make: Callable[[], torch.Tensor],
) -> None:
    """As eager's: a view of the caller's own storage at its strides (it was
    a view of a row-major copy, one per result), so a write through it
    reaches the input."""
    def program(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.view(dtype), x.view(dtype)

    exe = hloalias.compile(program, (make(),))
    x = make()
    first, second = exe(x)
    eager_first, _ = program(make())
    assert first.dtype == dtype and torch.equal(first, eager_first)
    assert [s for n, s in zip(first.shape, first.stride()) if n > 1] == [
        s for n, s in zip(eager_first.shape, eager_first.stride()) if n > 1
    ]
    assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    first.fill_(0)  # zero bits: 0.0 in x
    assert torch.equal(x, torch.zeros_like(x)) and torch.equal(second, torch.zeros_like(second))


def test_11_view_dtype_to_a_wider_type_is_a_named_import_limit() -> None:
    """torch-mlir cannot lower a widening view(dtype); the error says which
    op (the pass's layout rule for it is covered in lit)."""
    with pytest.raises(TorchImportError, match="aten.view.dtype"):
        hloalias.compile(lambda x: x.view(torch.float32), (torch.zeros(16, dtype=torch.int8),))


def write_first_row(cache: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    cache[0].copy_(row)
    return row * 2


def test_4_mutated_torch_input_is_updated_in_place_after_its_first_call() -> None:
    exe = hloalias.compile(write_first_row, (torch.zeros(4, 8), torch.zeros(8)))
    cache = torch.zeros(4, 8)
    exe(cache, torch.ones(8))
    address = cache.data_ptr()  # re-seated onto the runtime's buffer, no copy
    for step in range(2, 5):
        exe(cache, torch.full((8,), float(step)))
        assert cache.data_ptr() == address  # XLA wrote in place
        assert torch.equal(cache[0], torch.full((8,), float(step)))
        assert torch.equal(cache[1:], torch.zeros(3, 8))
    assert exe.host_copies == {}


def test_4_a_viewed_input_is_copied_back_and_counted() -> None:
    exe = hloalias.compile(write_first_row, (torch.zeros(4, 8), torch.zeros(8)))
    cache = torch.zeros(4, 8)
    row_view = cache[0]  # shares cache's storage: cache must stay where it is
    exe(cache, torch.ones(8))
    exe(cache, torch.full((8,), 2.0))
    assert torch.equal(row_view, torch.full((8,), 2.0))
    assert exe.host_copies == {"cache": 2}


def test_4_a_donated_result_is_left_as_it_was_and_an_updated_input_is_written_in_place() -> None:
    """A donated torch tensor is left as it was, wherever its memory came
    from (issue 24, item 2): a result fed back (``y = exe(y)``) is not
    overwritten, so a name or view still holding it keeps its value.  The
    buffer-reusing loop is an in-place update: XLA writes into the
    runtime buffer behind the tensor every call."""
    exe = hloalias.compile(lambda x: x * 2 + 1, (torch.zeros(64),), donate_argnums=[0])
    y = exe(torch.zeros(64))
    first = y
    for step in range(3):
        y = exe(y)
    assert torch.equal(y, torch.full((64,), 15.0)) and torch.equal(first, torch.ones(64))
    update = hloalias.compile(lambda x: x.mul_(2).add_(1), (torch.zeros(64),))
    z = torch.zeros(64)
    update(z)
    address = z.data_ptr()
    for step in range(3):
        update(z)
        assert z.data_ptr() == address  # XLA wrote in place into the runtime buffer
    assert torch.equal(z, torch.full((64,), 15.0))


def test_4_backing_registry_stays_bounded_and_keeps_the_live_buffers() -> None:
    """Results dropped by the caller leave dead registry entries that are
    swept; a tensor updated in place kept alive across many sweeps is
    still found (written in place) on every call."""
    from hloalias.runtime import ownership

    update = hloalias.compile(lambda x: x.mul_(2).add_(1), (torch.zeros(64),))
    fresh = hloalias.compile(lambda x: x + 1, (torch.zeros(32),))
    y = torch.zeros(64)
    update(y)  # moved onto its runtime buffer
    address = y.data_ptr()
    held = [fresh(torch.zeros(32)) for _ in range(300)]  # 300 live entries
    for step in range(2000):
        fresh(torch.zeros(32))  # dropped at once: a dead entry
        if step % 100 == 0:
            update(y)
            assert y.data_ptr() == address  # still found: XLA wrote in place
    assert all(torch.equal(t, torch.ones(32)) for t in held)
    live = sum(1 for reference in ownership._BACKINGS.values() if reference() is not None)
    assert live >= len(held) + 1
    assert len(ownership._BACKINGS) <= 2 * live + 64


# -- 15: the precomputed call plan (issue 14) ------------------------------------------------
# A plan holds facts of the program only: a tensor that changes between calls
# is checked (and read) afresh on every call.


def test_15_a_tensor_whose_shape_or_dtype_changed_since_the_last_call_is_refused() -> None:
    exe = hloalias.compile(write_first_row, (torch.zeros(4, 8), torch.zeros(8)))
    cache, row = torch.zeros(4, 8), torch.ones(8)
    exe(cache, row)  # cache is now backed by the runtime's buffer
    for changed in (torch.zeros(5, 8), torch.zeros(4, 8, dtype=torch.float64)):
        cache.data = changed
        with pytest.raises(ExecutionError, match="input 'cache' is torch.float"):
            exe(cache, row)
        assert torch.equal(cache, changed)  # untouched
    row.data = torch.ones(8, dtype=torch.int32)
    cache.data = torch.zeros(4, 8)
    with pytest.raises(ExecutionError, match="input 'row' is torch.int32"):
        exe(cache, row)
    with pytest.raises(ExecutionError, match="input 'row' is on device 'meta'"):
        exe(cache, torch.ones(8, device="meta"))


def test_15_a_re_seated_tensor_moved_to_other_memory_is_read_from_there() -> None:
    exe = hloalias.compile(write_first_row, (torch.zeros(4, 8), torch.zeros(8)))
    cache = torch.zeros(4, 8)
    exe(cache, torch.ones(8))
    elsewhere = torch.full((4, 8), 7.0)
    cache.set_(elsewhere.untyped_storage(), 0, (4, 8), (8, 1))  # now shares 'elsewhere'
    exe(cache, torch.full((8,), 2.0))
    expected = torch.full((4, 8), 7.0)
    expected[0] = 2.0
    assert torch.equal(cache, expected) and torch.equal(elsewhere, expected)  # a view of it, as eager
    # Transposed strides over the same storage: the new layout is honoured.
    storage = torch.arange(32.0).untyped_storage()
    cache.set_(storage, 0, (4, 8), (1, 4))
    eager = torch.arange(32.0).reshape(8, 4).t().clone()
    eager[0] = 3.0
    exe(cache, torch.full((8,), 3.0))
    assert torch.equal(cache, eager)


def test_15_an_input_written_through_numpy_between_calls_is_read_afresh() -> None:
    exe = hloalias.compile(lambda x: x * 2, (torch.zeros(4),))
    x = torch.zeros(4)
    assert torch.equal(exe(x), torch.zeros(4))
    x.numpy()[:] = 3.0  # does not bump x._version
    assert torch.equal(exe(x), torch.full((4,), 6.0))


class ReadsWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def test_15_state_consumed_by_another_executable_is_a_donated_buffer_error() -> None:
    module = ReadsWeight()
    reader = hloalias.compile(module, (torch.ones(4),))
    donor = hloalias.compile(module, (torch.ones(4, dtype=torch.float32) * 2,), donate_state=["weight"], pipeline=None)
    with torch.no_grad():
        torch.testing.assert_close(donor(torch.ones(4)), torch.ones(4))
        if not donor._slots["weight"].consumed_by:
            pytest.skip("XLA kept the donated weight (no temporary to reuse it for)")
        with pytest.raises(hloalias.DonatedBufferError, match="module state 'weight' was donated in call 1"):
            reader(torch.ones(4))
        reader.load_state_dict({"weight": torch.full((4,), 3.0)})
        torch.testing.assert_close(reader(torch.ones(4)), torch.full((4,), 3.0))


def test_15_a_donor_called_again_after_its_state_was_consumed_names_it() -> None:
    module = ReadsWeight()
    donor = hloalias.compile(module, (torch.ones(4),), donate_state=["weight"], pipeline=None)
    with torch.no_grad():
        donor(torch.ones(4))
        if not donor._slots["weight"].consumed_by:
            pytest.skip("XLA kept the donated weight (no temporary to reuse it for)")
        x = torch.ones(4)
        with pytest.raises(hloalias.DonatedBufferError, match="module state 'weight' was donated in call 1"):
            donor(x)
    assert torch.equal(x, torch.ones(4)) and donor._slots["weight"].consumed_by == "in call 1"


class _NotInPlace:
    """A loaded executable whose result ``position`` comes back in a new
    buffer instead of the donated one (what the runtime assumes XLA never
    does): the original result is dropped, so its memory is released."""

    def __init__(self, loaded: Any, position: int) -> None:
        self.loaded, self.position = loaded, position

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loaded, name)

    def execute_sharded(self, arrays: Any) -> Any:
        import jax

        shards = [list(s) for s in self.loaded.execute_sharded(arrays).disassemble_into_single_device_arrays()]
        shards[self.position] = [jax.device_put(shards[self.position][0], may_alias=False).block_until_ready()]

        class Results:
            def disassemble_into_single_device_arrays(self) -> Any:
                return shards

        return Results()


def _run_not_in_place(exe: hloalias.Executable, loaded: Any) -> None:
    """Run ``exe``'s calls through ``loaded`` (its own ``execute_sharded``)."""
    from hloalias.runtime.pjrt import SingleDeviceDispatch

    exe._loaded = loaded
    assert exe._plan is not None
    exe._plan.dispatch = SingleDeviceDispatch(loaded, exe.device, fast=False)


def test_15_xla_writing_a_donated_runtime_buffer_elsewhere_moves_the_tensor() -> None:
    exe = hloalias.compile(write_first_row, (torch.zeros(4, 8), torch.zeros(8)))
    cache = torch.zeros(4, 8)
    exe(cache, torch.ones(8))  # re-seated: later calls donate its buffer
    real = exe._loaded
    _run_not_in_place(exe, _NotInPlace(real, exe._result_keys.index("mutation:0")))
    address = cache.data_ptr()
    out = exe(cache, torch.full((8,), 2.0))
    assert cache.data_ptr() != address  # moved onto the result, off the released memory
    assert torch.equal(cache[0], torch.full((8,), 2.0)) and torch.equal(cache[1:], torch.zeros(3, 8))
    assert torch.equal(out, torch.full((8,), 4.0))
    _run_not_in_place(exe, real)
    exe(cache, torch.full((8,), 5.0))
    assert torch.equal(cache[0], torch.full((8,), 5.0)) and exe.host_copies == {}


def test_15_xla_writing_elsewhere_under_a_held_view_is_an_error() -> None:
    exe = hloalias.compile(write_first_row, (torch.zeros(4, 8), torch.zeros(8)))
    cache = torch.zeros(4, 8)
    exe(cache, torch.ones(8))
    row_view = cache[1]  # a view of the buffer XLA is about to release
    _run_not_in_place(exe, _NotInPlace(exe._loaded, exe._result_keys.index("mutation:0")))
    with pytest.raises(ExecutionError, match="input 'cache' to a new buffer.*other views of its old memory"):
        exe(cache, torch.full((8,), 2.0))
    assert torch.equal(cache[0], torch.full((8,), 2.0))  # the tensor itself holds its new value
    del row_view  # shows released memory: never read


def test_15_a_read_only_input_moved_or_resized_between_calls_is_read_from_its_new_memory() -> None:
    exe = hloalias.compile(lambda x: x * 2, (torch.zeros(4),))
    x = torch.zeros(4)
    exe(x)
    x.set_(torch.full((4,), 5.0).untyped_storage(), 0, (4,), (1,))  # other memory
    assert torch.equal(exe(x), torch.full((4,), 10.0))
    x.untyped_storage().resize_(0)  # storage reallocated in place
    x.untyped_storage().resize_(16)
    x.fill_(1.0)
    assert torch.equal(exe(x), torch.full((4,), 2.0))
    x.set_(torch.arange(8.0).untyped_storage(), 0, (4,), (2,))  # strided: copied, not imported as is
    assert torch.equal(exe(x), torch.tensor([0.0, 4.0, 8.0, 12.0]))


def test_15_a_read_only_input_is_not_held_after_the_caller_drops_it() -> None:
    import gc
    import weakref

    exe = hloalias.compile(lambda x: x * 2, (torch.zeros(1024),))
    x = torch.ones(1024)
    exe(x)
    storage = weakref.ref(x.untyped_storage())
    del x
    gc.collect()
    assert exe._imports == {}
    assert storage() is None


def test_15_an_input_read_by_one_executable_and_written_by_another_stays_right() -> None:
    reader = hloalias.compile(lambda x: x * 2, (torch.zeros(4, 8),))
    writer = hloalias.compile(write_first_row, (torch.zeros(4, 8), torch.zeros(8)))
    cache = torch.zeros(4, 8)
    for step in range(1, 4):
        assert torch.equal(reader(cache)[0], torch.full((8,), 2.0 * (step - 1)))
        writer(cache, torch.full((8,), float(step)))
        assert torch.equal(cache[0], torch.full((8,), float(step)))
    assert torch.equal(reader(cache)[0], torch.full((8,), 6.0))


# -- views of inputs whose layout is not row-major ---------------------------------------------

NON_ROW_MAJOR_VIEWS: dict[str, tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], Any]]] = {
    # (the caller's tensor, the program): every first result is a view of the input in eager.
    "row_of_transpose_read_only": (
        lambda: torch.arange(12.0).reshape(3, 4).t(), lambda x: (x[1], x * 2),
    ),
    "slice_of_mutated_channels_last": (
        lambda: torch.arange(96.0).reshape(2, 3, 4, 4).to(memory_format=torch.channels_last),
        lambda x: (x.mul_(2)[:, :1], x.sum()),
    ),
    "view_only_program": (lambda: torch.arange(48.0).reshape(6, 8)[::2, 1::3], lambda x: (x[1:],)),
    "input_returned_as_is": (lambda: torch.arange(12.0).reshape(3, 4).t(), lambda x: (x, x + 1)),
}


@pytest.mark.parametrize("name", sorted(NON_ROW_MAJOR_VIEWS))
def test_view_of_a_non_row_major_input_is_a_view_of_the_callers_tensor(name: str) -> None:
    """A returned view of an input laid out otherwise than row-major
    (transposed, channels-last, strided) is a view of the caller's tensor,
    as in eager: a write through it reaches the caller (it was a view of a
    row-major copy)."""
    make, program = NON_ROW_MAJOR_VIEWS[name]
    executable = hloalias.compile(program, (make(),))
    ours_input, eager_input = make(), make()
    ours, eager = executable(ours_input)[0], program(eager_input)[0]
    torch.testing.assert_close(ours, eager, rtol=0, atol=0)
    torch.testing.assert_close(ours_input, eager_input, rtol=0, atol=0)
    assert ours.untyped_storage().data_ptr() == ours_input.untyped_storage().data_ptr()
    assert ours.storage_offset() == eager.storage_offset()
    ours.fill_(-1.0)
    eager.fill_(-1.0)
    torch.testing.assert_close(ours_input, eager_input, rtol=0, atol=0)


def test_an_ambient_autocast_is_refused_at_compile_and_call() -> None:
    # Under torch.autocast eager computes the Linear in bf16; the compiled
    # program silently returned float32 values (off by 5e-3) when called
    # under it, and compiling under it gave a float32 program.
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16).eval()
    x = torch.randn(2, 16)
    exe = hloalias.compile(model, (x,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(hloalias.ExecutionError, match=r"autocast\('cpu'\) is on.*torch.bfloat16"):
            exe(x)
        with pytest.raises(hloalias.CompileError, match="inside forward"):
            hloalias.compile(model, (x,))
    torch.testing.assert_close(exe(x), model(x))  # outside it, as before

    class Mixed(torch.nn.Module):  # autocast inside forward is compiled as written
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.linear(x)

    mixed = Mixed().eval()
    out = hloalias.compile(mixed, (x,))(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, mixed(x))
