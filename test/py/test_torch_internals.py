"""The private-torch adapter (frontend/torch_internals.py): every private
name it uses is still there and unchanged, its CIA override leaves every
operator exactly as torch's own override does (and as it was, after), and
``decompose`` gives the graph and signature ``run_decompositions`` gives on
programs that mutate buffers and user inputs, return views, take kwargs and
tie weights; without the private names it falls back to
``run_decompositions``.  A torch upgrade that changes any of these fails
here, loudly, before it can change a compiled program."""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import sys

import pytest
import torch
from torch_mlir.extras.fx_decomp_util import get_decomposition_table

import hloalias
from hloalias.frontend import importer, torch_internals

# sha256 of the source of each torch function cia_override / decompose
# mirror or call, as read when the adapter was written (torch 2.13.0).  A
# mismatch means torch changed it: re-read it, check cia_override still does
# what it does, then update the hash.
_PINNED_SOURCES = {
    ("torch.export.exported_program", "_override_composite_implicit_decomp"):
        "4422dc79d0792af728dd8eacf0a2fadcf00195c8802ceca15632b737d9d5c9bd",
    ("torch.export.exported_program", "_split_decomp_table_to_cia_and_python_decomp"):
        "a4ccae438dfcc5dfe5f385d83ee95e4f04b6d3d3e8d88eb00de370f17ebffa99",
    ("torch.export.exported_program", "_decompose_exported_program"):
        "1949ba42c1237735a330489d1a5ea2bc70d65a93c4f370f02f3c67f2a09dcd37",
    ("torch.export.exported_program", "_decompose_and_get_gm_with_new_signature_constants"):
        "93ddd4ba4ed9f3fef4eefa55d8d194967d8a4b471491d319f87abfbd0525ad9a",
    ("torch._export.utils", "_get_decomp_for_cia"):
        "3ae30c72c7d7bce2e64a2589eac8d22502ccb6cdc120cc4d35a8150f726a5eb9",
    ("torch._subclasses.fake_impls", "_deregister_op_impl"):
        "b25dfd97c983a622274368e3179ad8d5d041e1f04894656ca36719cbdabc9233",
    ("torch._export.utils", "_materialize_cpp_cia_ops"):
        "51472f6b4e2c37824078c061741bf2861dcc0da2f439e19ab099ce5d0711b033",
    ("torch._export.utils", "_collect_all_valid_cia_ops_for_namespace"):
        "c26d5cd619830773104ec3ccb3fbdcfa84f0ff7e59fc9c54e13e7551c96701ee",
    ("torch._export.utils", "_collect_all_valid_cia_ops"):
        "1d09a99ea79bd377c8f0acc97247545fc7c769103e4e94cad6e72370598fd615",
    ("torch._ops", "OperatorBase.py_impl"):
        "8173bd205b783783cda935e5b6590b730162bf3224538ae039576a75fc40ec0b",
    # cia_override's lazy install: every dispatch-cache miss of the Python
    # dispatcher resolves through _get_dispatch, which records each
    # operator whose cache it fills in cached_ops.
    ("torch._ops", "OpOverload._get_dispatch"):
        "be1dcc0b1a6f17cd41dc34a57ceed9e3b5292ea5af51fa682f0a2f5b0ee3e3aa",
    ("torch._ops", "add_cached_op"):
        "31e8253c026338896a2b2b93a1a3c0d4d5b5a1fbdafe6453f4ac2b02d0b3f8c5",
    # The two tests _cia_first_preservable asks in the other order: both
    # must only read the operator.
    ("torch._export.utils", "_is_preservable_cia_op"):
        "00d78e92c3d6d9f6e4493fa6341691476ee05fa5259ed4e7210991da48eb2778",
    ("torch._export.utils", "_is_cia_op"):
        "4588c37719fb83563868426a4d95664f3d23d1d5811fd140ddc45c1a9b1f0c87",
    ("torch._export.utils", "_check_valid_to_preserve"):
        "a225772212a823aad71b5599a0c6eaa06f409bb3574d2ff79868bc2600b362ab",
    ("torch._decomp", "_should_decompose_because_unsafe_op"):
        "f106d112e31ab4596ed9519a3ae21da3125a7d265db93432b08361a0708330d5",
    # module_patches_skipped: the wrappers Tracer.trace installs, the patcher
    # it installs them with, and what make_fx's tracer does in them.
    ("torch.fx._symbolic_trace", "Tracer.trace"):
        "34f22abf9e6f184ce99e0c42ec91e9fe92618ed6f587341b9f525b02e09a46f0",
    ("torch.fx._symbolic_trace", "_Patcher.patch_method"):
        "ac5a4a0e5aba84be38999264301d5fcd05b2d359f911becad8a0ba0feb14b831",
    ("torch.fx._symbolic_trace", "_new_patcher"):
        "3e948e37e459d396d8ea1f3af8faf8e2487daa8ea09c8f16d41f69ed34be2312",
    ("torch.fx._symbolic_trace", "_autowrap_check"):
        "771eb4ff2e57222067ccc351bcaff027c49c55e22b9710806ac6947989568a3d",
    ("torch.fx.experimental.proxy_tensor", "PythonKeyTracer.call_module"):
        "333bdeab06a0dc4669b42027b9e82c854bda17424f41ad238096b6d981f6c399",
    # signature_checked_once: torch's signature check, run with each
    # signature property read once, must not change the signature it reads.
    ("torch._export.verifier", "_verify_exported_program_signature"):
        "28e166748f97611dead44d9a514f2801d07936e613ab6b469426ec08e9777b96",
    ("torch.fx.experimental.proxy_tensor", "PythonKeyTracer.getattr"):
        "56581dd84c98dde6bbde0b02156cfa88921fa66e725da3761998a75975ffc738",
}


def _source_hash(module_name: str, qualname: str) -> str:
    value: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        value = getattr(value, part)
    return hashlib.sha256(inspect.getsource(value).encode()).hexdigest()


def test_private_names_are_present() -> None:
    missing = [
        f"{module}.{name}"
        for module, names in torch_internals.PRIVATE_NAMES.items()
        for name in names
        if not hasattr(importlib.import_module(module), name)
    ]
    assert not missing, f"torch no longer has {missing}: review frontend/torch_internals.py"
    assert torch_internals._private() is not None


@pytest.mark.parametrize("where", sorted(_PINNED_SOURCES), ids=lambda w: w[1])
def test_mirrored_torch_source_is_unchanged(where: tuple[str, str]) -> None:
    assert _source_hash(*where) == _PINNED_SOURCES[where], (
        f"torch's {where[0]}.{where[1]} changed: check that frontend/torch_internals.py still "
        "does what it does, then update the pinned hash"
    )


def test_materializing_cia_ops_once_gives_torchs_split() -> None:
    import torch._export.utils as export_utils
    from torch.export.exported_program import _split_decomp_table_to_cia_and_python_decomp

    table = importer._decomposition_table()
    original = export_utils._materialize_cpp_cia_ops
    calls = []

    def counted() -> None:
        calls.append(1)
        original()

    export_utils._materialize_cpp_cia_ops = counted
    try:
        theirs = _split_decomp_table_to_cia_and_python_decomp(dict(table))
        assert len(calls) > 1  # torch's own walk: once per namespace
        calls.clear()
        torch_internals._CIA_OPS_CACHE.clear()  # the block walks (not a shared earlier walk)
        with torch_internals.materialize_cia_ops_once():
            ours = _split_decomp_table_to_cia_and_python_decomp(dict(table))
        assert len(calls) == 1
        assert export_utils._materialize_cpp_cia_ops is counted  # restored
    finally:
        export_utils._materialize_cpp_cia_ops = original
    assert ours[0] == theirs[0] and ours[1] == theirs[1]


def test_the_cia_walk_is_shared_until_the_operator_registry_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building torch-mlir's table and splitting it each walk every
    registered operator for the preservable CIA set; inside
    ``materialize_cia_ops_once`` the second walk is answered from the
    first while the registry is unchanged, with torch's result, and a new
    CIA operator makes the next block walk again and find it.  (Without
    the cross-process store, which would answer the first walk too:
    ``test_cia_ops_store.py``.)"""
    import torch._export.utils as export_utils
    from torch.export.exported_program import _split_decomp_table_to_cia_and_python_decomp

    monkeypatch.setattr(torch_internals, "CIA_OPS_STORE", [])

    torch_internals._private()  # its imports register operators: done before counting
    original = export_utils._collect_all_valid_cia_ops
    modules = [importlib.import_module(name) for name in torch_internals._CIA_COLLECTORS]
    walks = []

    def counted() -> set[Any]:
        walks.append(1)
        result: set[Any] = original()
        return result

    table = dict(importer._decomposition_table())
    theirs = _split_decomp_table_to_cia_and_python_decomp(dict(table))
    torch_internals._CIA_OPS_CACHE.clear()
    for module in modules:
        module._collect_all_valid_cia_ops = counted
    library = torch.library.Library("hloalias_test_walk", "DEF")  # noqa: TOR901
    try:
        with torch_internals.materialize_cia_ops_once():
            first = export_utils._collect_all_valid_cia_ops()
            first.clear()  # a caller's copy: the shared set is not touched
        with torch_internals.materialize_cia_ops_once():
            ours = _split_decomp_table_to_cia_and_python_decomp(dict(table))
        assert len(walks) == 1
        assert ours[0] == theirs[0] and ours[1] == theirs[1]
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
        with torch_internals.materialize_cia_ops_once():
            again = export_utils._collect_all_valid_cia_ops()
        assert len(walks) == 2
        assert torch.ops.hloalias_test_walk.twice.default in again
        assert all(module._collect_all_valid_cia_ops is counted for module in modules)  # restored
    finally:
        for module in modules:
            module._collect_all_valid_cia_ops = original
        library._destroy()
        torch_internals._CIA_OPS_CACHE.clear()
        torch_internals._SPLIT_CACHE.clear()


def test_the_cia_walk_and_split_ask_the_cheaper_test_first_with_torchs_answers() -> None:
    """Inside ``materialize_cia_ops_once`` the walks and the split ask
    ``_is_preservable_cia_op`` with its two tests in the cheaper order:
    the same answer as torch's for every operator of every namespace and
    every key of the table, and torch's function back after the block."""
    import torch._export.utils as export_utils
    import torch.export.exported_program as exported_program

    original = export_utils._is_preservable_cia_op
    table = importer._decomposition_table()
    ops = set(table)
    for namespace_name in list(torch.ops._dir):
        namespace = getattr(torch.ops, namespace_name)
        for name in list(namespace):
            packet = getattr(namespace, name)
            for overload in getattr(packet, "op_overloads", lambda: [])():
                ops.add(overload)
    assert len(ops) > 2000
    with torch_internals.materialize_cia_ops_once():
        ours = export_utils._is_preservable_cia_op
        assert ours is not original and exported_program._is_preservable_cia_op is ours
        differing = [op for op in ops if ours(op) != original(op)]
    assert not differing
    assert sum(original(op) for op in ops) > 400
    assert export_utils._is_preservable_cia_op is original
    assert exported_program._is_preservable_cia_op is original


def _describe(kernel: Any) -> Any:
    """A comparable description of a Python kernel or fake rule: partials
    by function, arguments and (described) keywords; closures made by
    torch's ``autograd_not_implemented`` by their operator; the rest by
    identity."""
    if isinstance(kernel, functools.partial):
        name = getattr(kernel.func, "__name__", "")
        keywords = {k: _describe(v) for k, v in kernel.keywords.items()}
        if "original_callable" in keywords:  # the fake rule: torch's and ours differ only in name
            return ("run-original-cia", keywords["original_callable"])
        return ("partial", name, kernel.args, tuple(sorted(keywords.items())))
    if getattr(kernel, "__qualname__", "") == "autograd_not_implemented.<locals>.inner":
        cells = dict(zip(kernel.__code__.co_freevars, (c.cell_contents for c in kernel.__closure__)))
        return ("autograd-not-implemented", cells["op"], cells["deferred_error"])
    return ("object", id(kernel))


def _operator_state(ops: list[Any]) -> dict[Any, Any]:
    from torch._subclasses import fake_impls

    return {
        op: (
            {key: _describe(kernel) for key, kernel in op.py_kernels.items()},
            _describe(fake_impls.op_implementations_dict[op]) if op in fake_impls.op_implementations_dict else None,
        )
        for op in ops
    }


def _dispatched(ops: list[Any]) -> None:
    """Each operator resolved as the Python dispatcher resolves a kernel on
    a miss of the operator's dispatch cache (its C++ side calls
    ``op._get_dispatch(key)``): where the lazy override patches it."""
    for op in ops:
        if torch._C.DispatchKey.CPU not in op._dispatch_cache:
            op._get_dispatch(torch._C.DispatchKey.CPU)


def test_cia_override_installs_what_torchs_override_installs() -> None:
    from torch.export.exported_program import _override_composite_implicit_decomp

    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    ops = list(cia_to_decomp)
    assert len(ops) > 400  # the whole preservable CIA set, not a sample
    # torch's override drops, on exit, the fake rule an op had before it
    # (aten.item loses local_scalar_dense): compare from the state the
    # first override leaves, where every later one starts.
    with _override_composite_implicit_decomp(cia_to_decomp):
        pass
    before = _operator_state(ops)
    with _override_composite_implicit_decomp(cia_to_decomp):
        theirs = _operator_state(ops)
    after_theirs = _operator_state(ops)
    with torch_internals.cia_override(cia_to_decomp):
        _dispatched(ops)
        ours = _operator_state(ops)
    after_ours = _operator_state(ops)
    with torch_internals.eager_cia_override(cia_to_decomp):
        eager = _operator_state(ops)
    assert ours == theirs == eager
    assert after_ours == after_theirs == _operator_state(ops) == before
    assert sum(state != before[op] for op, state in ours.items()) == len(ops)


def test_cia_override_installs_fake_rules_without_hashing_each_operator() -> None:
    """In the usual case (no operator of the table has a fake rule: torch's
    exit drops them all) the rules go in with one dict update that reuses
    the stored hashes, not two ``OpOverload.__hash__`` calls per operator
    (a Python method; ~1,000 a compile); the state is torch's (the test
    above)."""
    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    with torch_internals.cia_override(cia_to_decomp):
        pass
    calls = []
    original = torch._ops.OpOverload.__hash__

    def counted(self: Any) -> int:
        calls.append(1)
        return original(self)

    torch._ops.OpOverload.__hash__ = counted  # type: ignore[method-assign]
    try:
        with torch_internals.cia_override(cia_to_decomp):
            entered = len(calls)
    finally:
        torch._ops.OpOverload.__hash__ = original  # type: ignore[method-assign]
    # (a few per operator with Python kernels of its own: their cached rows)
    assert entered < len(cia_to_decomp) // 2


def test_cia_override_with_one_prior_fake_rule_installs_what_torchs_override_installs() -> None:
    """An operator of the table that has a fake rule on entry keeps it in
    the block (each operator's own test, as torch does) and loses it after."""
    from torch._subclasses import fake_impls
    from torch.export.exported_program import _override_composite_implicit_decomp

    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    ops = list(cia_to_decomp)
    op = torch.ops.aten.item.default

    def rule(fake_mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not called")

    states = []
    for override in (_override_composite_implicit_decomp, torch_internals.cia_override):
        with override(cia_to_decomp):
            pass
        fake_impls.op_implementations_dict[op] = rule
        with override(cia_to_decomp):
            _dispatched(ops)
            assert fake_impls.op_implementations_dict[op] is rule
            states.append(_operator_state(ops))
        assert op not in fake_impls.op_implementations_dict
        states.append(_operator_state(ops))
    assert states[0] == states[2] and states[1] == states[3]


def test_cia_override_drops_a_prior_fake_rule_as_torch_does() -> None:
    from torch._subclasses import fake_impls
    from torch.export.exported_program import _override_composite_implicit_decomp

    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    op = torch.ops.aten.item.default
    assert op in cia_to_decomp

    def rule(fake_mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not called")

    for override in (_override_composite_implicit_decomp, torch_internals.cia_override):
        fake_impls.op_implementations_dict[op] = rule
        with override({op: cia_to_decomp[op]}):
            assert fake_impls.op_implementations_dict[op] is rule
        assert op not in fake_impls.op_implementations_dict


def test_cia_override_drops_a_kernel_registered_in_the_block_as_torch_does() -> None:
    """Each operator gets its own kernel table back (the same object, as
    it was): a kernel registered while the override is on is gone after
    it, as after torch's override."""
    from torch.export.exported_program import _override_composite_implicit_decomp

    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    op = torch.ops.aten.item.default
    key = torch._C.DispatchKey.PrivateUse1  # a key the override does not fill
    for override in (_override_composite_implicit_decomp, torch_internals.eager_cia_override,
                     torch_internals.cia_override):
        table = op.py_kernels
        before = dict(table)
        with override({op: cia_to_decomp[op]}):
            # (first: the lazy override patches the operator on a registration too)
            op.py_impl(key)(lambda *args: None)
            assert op.py_kernels[torch._C.DispatchKey.CompositeImplicitAutograd] is cia_to_decomp[op]
        assert op.py_kernels is table and op.py_kernels == before and key not in op.py_kernels


def test_cia_override_restores_operators_when_the_block_raises() -> None:
    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    ops = list(cia_to_decomp)
    with torch_internals.cia_override(cia_to_decomp):
        pass
    before = _operator_state(ops)
    with pytest.raises(RuntimeError, match="inside"):
        with torch_internals.cia_override(cia_to_decomp):
            raise RuntimeError("inside")
    assert _operator_state(ops) == before


def test_cia_override_patches_only_the_operators_the_python_dispatcher_resolves() -> None:
    """Inside the block no operator is touched until the Python dispatcher
    resolves a kernel of it: a call then runs the override's kernels (its
    state is the eager override's), the others keep their own tables and no
    fake rule, and after the block every operator is as before."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._subclasses import fake_impls

    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    ops = list(cia_to_decomp)
    op = torch.ops.aten.item.default
    with torch_internals.eager_cia_override(cia_to_decomp):
        pass  # (item's own fake rule goes at the first exit: from the state after it)
    with torch_internals.eager_cia_override(cia_to_decomp):
        eager = _operator_state([op])
    before = _operator_state(ops)
    tables = {op_: op_.py_kernels for op_ in ops}
    with torch_internals.cia_override(cia_to_decomp):
        assert all(op_.py_kernels is tables[op_] for op_ in ops)
        assert not any(op_ in fake_impls.op_implementations_dict for op_ in ops)
        with enable_python_dispatcher():
            assert op(torch.tensor(2.5)) == 2.5
        assert _operator_state([op]) == eager
        untouched = [op_ for op_ in ops if op_ is not op]
        assert all(op_.py_kernels is tables[op_] for op_ in untouched)
        assert not any(op_ in fake_impls.op_implementations_dict for op_ in untouched)
    assert _operator_state(ops) == before
    assert all(op_.py_kernels is tables[op_] for op_ in ops)


def test_cia_override_empties_dispatch_caches_filled_before_it() -> None:
    """A kernel the Python dispatcher cached before the block would be run
    without the override: the block empties the table's filled caches, so
    the call in it runs the override's kernels."""
    from torch._dispatch.python import enable_python_dispatcher

    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    op = torch.ops.aten.item.default
    with torch_internals.eager_cia_override(cia_to_decomp):
        pass  # (item's own fake rule goes at the first exit: from the state after it)
    with torch_internals.eager_cia_override(cia_to_decomp):
        eager = _operator_state([op])
    with enable_python_dispatcher():
        assert op(torch.tensor(1.5)) == 1.5  # fills op's dispatch cache, unpatched
    assert op._dispatch_cache and op in torch._ops.cached_ops
    filled = dict(op._dispatch_cache)
    with torch_internals.cia_override(cia_to_decomp):
        assert not op._dispatch_cache
        with enable_python_dispatcher():
            assert op(torch.tensor(3.5)) == 3.5
        assert _operator_state([op]) == eager
        autograd = op._dispatch_cache[torch._C.DispatchKey.AutogradCPU]
        assert autograd is not filled.get(torch._C.DispatchKey.AutogradCPU)
        assert autograd is op.py_kernels[torch._C.DispatchKey.AutogradCPU]  # the override's kernel
    assert not op._dispatch_cache


@pytest.mark.parametrize("inner", ["lazy", "eager"])
def test_an_override_inside_the_lazy_one_sees_and_restores_the_eager_state(inner: str) -> None:
    """A second override inside the lazy one (installed eagerly) starts
    from every operator patched, as inside the eager override, and both
    exits leave every operator as before."""
    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    ops = list(cia_to_decomp)
    with torch_internals.eager_cia_override(cia_to_decomp):
        eager = _operator_state(ops)
        with torch_internals.eager_cia_override(cia_to_decomp):
            eager_nested = _operator_state(ops)
        eager_after_inner = _operator_state(ops)
    before = _operator_state(ops)
    nested = (torch_internals.cia_override if inner == "lazy" else torch_internals.eager_cia_override)
    with torch_internals.cia_override(cia_to_decomp):
        with nested(cia_to_decomp):
            assert _operator_state(ops) == eager_nested
        # (the inner exit drops every fake rule, as torch's does)
        assert _operator_state(ops) == eager_after_inner
    assert eager_after_inner != eager  # (the comparison above sees the rules go)
    assert _operator_state(ops) == before
    assert torch._ops.OpOverload.__dict__["_get_dispatch"] is torch_internals._lazy_dispatch_names()[0]
    assert "py_impl" not in torch._ops.OpOverload.__dict__


class _CompositeOps(torch.nn.Module):
    """CIA operators the table keeps (linear, layer_norm, softmax, sdpa) and
    ones it decomposes, on the single trace's path."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.linear(x)).softmax(-1)
        q = h.view(2, 1, 2, 8)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return torch.matmul(a.flatten(0, 2), h.t()).log_softmax(-1)


def test_the_single_trace_under_the_lazy_override_is_the_eager_overrides(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hloalias.frontend import fx_export

    module = _CompositeOps().eval()
    args = (torch.randn(4, 8),)
    table = importer._decomposition_table()
    lazy = fx_export.exported_from_trace(module, args, {}, table)
    monkeypatch.setattr(torch_internals, "cia_override", torch_internals.eager_cia_override)
    eager = fx_export.exported_from_trace(module, args, {}, table)
    assert lazy is not None and eager is not None
    assert lazy.graph_module.code == eager.graph_module.code
    assert str(lazy.graph_signature) == str(eager.graph_signature)


class _BufferAndInputMutation(torch.nn.Module):
    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.count.add_(1)
        acc.mul_(2)
        y = torch.nn.functional.gelu(self.linear(x)).softmax(-1) + self.count
        return y, y.t()


class _Views(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x[1:3].add_(1.0)
        return x, x[0:2].view(2, 2, 2), x.transpose(0, 1), x.flatten().contiguous()


class _Kwargs(torch.nn.Module):
    def forward(self, x: torch.Tensor, *, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.nn.functional.layer_norm(x * scale, (x.shape[-1],))
        return out if bias is None else out + bias


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


class _Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


_PROGRAMS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]]] = {
    "buffer_and_input_mutation": lambda: (_BufferAndInputMutation(), (torch.randn(2, 8), torch.ones(4)), {}),
    "views": lambda: (_Views(), (torch.randn(4, 4),), {}),
    "kwargs": lambda: (_Kwargs(), (torch.randn(3, 5),), {"scale": torch.randn(5), "bias": torch.randn(5)}),
    "tied_weights": lambda: (_Tied(), (torch.tensor([[1, 2, 3]]),), {}),
    "attention": lambda: (_Attention(), tuple(torch.randn(2, 4, 6, 8) for _ in range(3)), {}),
}


@pytest.mark.parametrize("name", sorted(_PROGRAMS))
def test_decompose_gives_run_decompositions_graph_and_signature(name: str) -> None:
    module, args, kwargs = _PROGRAMS[name]()
    exported = torch.export.export(module, args, kwargs, strict=False)
    for table in (get_decomposition_table(), importer._decomposition_table()):
        theirs = exported.run_decompositions(table)
        for _ in range(2):  # the second call uses the cached split
            ours = torch_internals.decompose(exported, table)
            assert str(ours.graph) == str(theirs.graph)
            assert ours.graph_signature == theirs.graph_signature
            assert ours.state_dict.keys() == theirs.state_dict.keys()
            assert ours.constants.keys() == theirs.constants.keys()


def test_decompose_leaves_no_operator_patched() -> None:
    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    module, args, kwargs = _PROGRAMS["buffer_and_input_mutation"]()
    exported = torch.export.export(module, args, kwargs, strict=False)
    torch_internals.decompose(exported, importer._decomposition_table())
    before = _operator_state(list(cia_to_decomp))
    torch_internals.decompose(exported, importer._decomposition_table())
    assert _operator_state(list(cia_to_decomp)) == before
    # Eager CIA ops run as before (nothing left overriding them).
    x = torch.randn(3, 4, requires_grad=True)
    torch.nn.functional.linear(x, torch.randn(2, 4)).sum().backward()
    assert x.grad is not None


def test_without_torchs_private_names_decompose_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    module, args, kwargs = _PROGRAMS["buffer_and_input_mutation"]()
    exported = torch.export.export(module, args, kwargs, strict=False)
    table = importer._decomposition_table()
    expected = exported.run_decompositions(table)
    monkeypatch.setattr(torch_internals, "_private", lambda: None)

    def refuse(*_: Any) -> Any:
        raise AssertionError("cia_override used without torch's private names")

    monkeypatch.setattr(torch_internals, "cia_override", refuse)
    fallback = torch_internals.decompose(exported, table)
    assert str(fallback.graph) == str(expected.graph)
    assert fallback.graph_signature == expected.graph_signature
    # And the whole compile still matches eager on the fallback.
    hloalias.clear_cache()
    fresh, reference = _BufferAndInputMutation(), _BufferAndInputMutation()
    reference.load_state_dict(fresh.state_dict())
    x, acc = torch.randn(2, 8), torch.ones(4)
    acc_eager = acc.clone()
    exe = hloalias.compile(fresh, (x, acc.clone()))
    acc_ours = acc.clone()
    got = exe(x, acc_ours)
    want = reference(x, acc_eager)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(acc_ours, acc_eager)


class _Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x)  # an in-place write: exported, then decomposed
        return self.count * 2


def test_compiling_shows_no_warning_of_torch_about_its_own_leaf_specs() -> None:
    # torch 2.13's run_decompositions deep-copies the module call graph's
    # LeafSpecs and warns that LeafSpec is deprecated: every compile of a
    # program with an in-place write printed it to the user.
    import warnings

    x = torch.ones(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exe = hloalias.compile(_Counter(), (x,))
    assert torch.equal(exe(x), torch.full((4,), 2.0))
    assert [str(w.message) for w in caught if "LeafSpec" in str(w.message)] == []


@pytest.mark.parametrize("name", ["views", "kwargs", "attention"])
def test_export_decomposed_generates_python_code_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.export's stages build several GraphModules and call none:
    under :func:`torch_internals.lazy_graph_modules` only the returned
    program's module generates code, and the program still runs like the
    module (its code generated on demand)."""
    from torch.fx.graph import Graph

    generated: list[int] = []
    python_code = Graph.python_code

    def counted(self: Graph, *args: Any, **kwargs: Any) -> Any:
        # A module's code (GraphModule.recompile), not torch's debug
        # printing (print_readable, which pytest's log capture turns on).
        if sys._getframe(1).f_code.co_name == "recompile":
            generated.append(len(self.nodes))
        return python_code(self, *args, **kwargs)

    module, args, kwargs = _PROGRAMS[name]()
    monkeypatch.setattr(Graph, "python_code", counted)
    exported = torch_internals.export_decomposed(module, args, kwargs, importer._decomposition_table())
    assert exported is not None
    assert len(generated) == 1
    monkeypatch.setattr(Graph, "python_code", python_code)
    def fresh() -> tuple[tuple[Any, ...], dict[str, Any]]:  # "views" writes to its input
        return tuple(a.clone() for a in args), {k: v.clone() for k, v in kwargs.items()}

    ours_args, ours_kwargs = fresh()
    eager_args, eager_kwargs = fresh()
    torch.testing.assert_close(exported.module()(*ours_args, **ours_kwargs), module(*eager_args, **eager_kwargs))
    torch.testing.assert_close(ours_args, eager_args)


def test_lazy_exported_programs_builds_lazy_modules_and_restores_torch() -> None:
    """Inside the block an ExportedProgram's module is lazy (no code until
    called) and runs like the program; nested blocks and a block that
    raises leave torch's own function in place."""
    import torch.export.exported_program as exported_program
    from torch.fx._lazy_graph_module import _LazyGraphModule

    original = exported_program._create_graph_module_for_export

    class Twice(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    exported = torch.export.export(Twice(), (torch.ones(3),))
    with torch_internals.lazy_graph_modules(), torch_internals.lazy_exported_programs():
        with torch_internals.lazy_exported_programs():
            assert exported_program._create_graph_module_for_export is not original
        assert exported_program._create_graph_module_for_export is not original
        rebuilt = torch.export.ExportedProgram(
            root=exported.graph_module, graph=exported.graph, graph_signature=exported.graph_signature,
            state_dict=exported.state_dict, range_constraints=exported.range_constraints,
            module_call_graph=exported.module_call_graph, example_inputs=exported.example_inputs,
            constants=exported.constants,
        )
    assert exported_program._create_graph_module_for_export is original
    assert isinstance(rebuilt.graph_module, _LazyGraphModule)
    assert rebuilt.graph_module._needs_recompile()
    assert torch.equal(rebuilt.module()(torch.arange(3.0)), torch.arange(3.0) * 2)
    with pytest.raises(RuntimeError, match="inside"):
        with torch_internals.lazy_exported_programs():
            raise RuntimeError("inside")
    assert exported_program._create_graph_module_for_export is original


def _split_of(table: dict[Any, Callable[..., Any]]) -> tuple[dict[Any, Any], dict[Any, Any]]:
    cia_to_decomp, python_table = torch_internals.split_decomposition_table(table)
    return dict(cia_to_decomp), dict(python_table)


def test_split_cache_follows_every_change_of_the_table() -> None:
    """The cached split is reused only for a table with the same pairs:
    a replaced decomposition (same keys, same length), a removed entry and
    the same dict object changed in place each give torch's split of the
    table as it is now."""
    from torch.export.exported_program import _split_decomp_table_to_cia_and_python_decomp

    table = dict(importer._decomposition_table())
    python_op = next(op for op in table if op.name() == "aten::addmm")
    cia_op = torch.ops.aten.linear.default  # CompositeImplicitAutograd
    _split_of(table)

    def replacement(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("never called")

    replaced = {**table, python_op: replacement}
    assert _split_of(replaced) == _split_decomp_table_to_cia_and_python_decomp(dict(replaced))
    assert _split_of(replaced)[1][python_op] is replacement
    with_cia = {**table, cia_op: replacement}
    assert _split_of(with_cia)[0][cia_op] is replacement
    removed = {op: fn for op, fn in table.items() if op is not python_op}
    assert python_op not in _split_of(removed)[1]
    _split_of(table)
    table[python_op] = replacement  # the same object as last time, changed in place
    assert _split_of(table)[1][python_op] is replacement


def test_split_cache_follows_a_new_composite_implicit_operator() -> None:
    """An operator registered with a CompositeImplicitAutograd kernel after
    a split is in the next split's CIA table, as torch's own split has it."""
    table = importer._decomposition_table()
    _split_of(table)
    library = torch.library.Library("hloalias_split_cache_test", "DEF")
    try:
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda x: x + x, "CompositeImplicitAutograd")
        op = torch.ops.hloalias_split_cache_test.twice.default
        cia_to_decomp, python_table = _split_of(table)
        assert op in cia_to_decomp and op not in python_table
    finally:
        library._destroy()


def test_late_registered_entries_of_the_shared_table_is_empty_only_without_new_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shared table has nothing missing from itself; a custom entry
    that appears after the trace's table was taken is reported."""
    shared = importer._decomposition_table()
    traced = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    assert importer.late_registered_entries(shared, traced) == {}
    from hloalias.frontend import decompositions

    op = torch.ops.aten.addmm.default
    entry = shared.get(op)
    monkeypatch.setattr(decompositions, "custom_op_decompositions", lambda: {op: entry})
    without = {k: v for k, v in shared.items() if k is not op}
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    graph.output(graph.call_function(op, (a, a, a)))
    assert importer.late_registered_entries(without, torch.fx.GraphModule({}, graph)) == {op: entry}


def test_cia_override_reads_each_operators_kernels_at_every_entry() -> None:
    """What cia_override builds once per table (each operator's filled
    keys) never hides the operator's state at entry: a Python kernel
    registered between two overrides (under a key the override fills, and
    a Python CIA kernel) is in the next override as in torch's, and a
    kernel registered inside one override is in no later one."""
    from torch.export.exported_program import _override_composite_implicit_decomp

    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    op = torch.ops.aten.item.default
    table = {op: cia_to_decomp[op]}
    with torch_internals.cia_override(table):  # builds what is built once
        op.py_impl(torch._C.DispatchKey.PrivateUse1)(lambda *args: None)  # gone after the block
    assert torch._C.DispatchKey.PrivateUse1 not in op.py_kernels
    saved = dict(op.py_kernels)
    try:
        for key in (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CompositeImplicitAutograd):
            op.py_impl(key)(lambda *args: None)
            with _override_composite_implicit_decomp(table):
                theirs = _operator_state([op])
            with torch_internals.cia_override(table):
                _dispatched([op])
                ours = _operator_state([op])
            assert ours == theirs
            assert torch._C.DispatchKey.PrivateUse1 not in ours[op][0]
    finally:
        op.py_kernels.clear()
        op.py_kernels.update(saved)
        op._dispatch_cache.clear()


def test_a_compile_after_a_failed_trace_starts_from_the_same_operators() -> None:
    """What the override builds once per table holds nothing of a trace:
    after a compile whose forward raises inside the trace, every operator
    is as before and the next compile is eager's."""

    class Fails(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > float("-inf"):  # data-dependent: the trace stops here
                raise RuntimeError("forward failed")
            return x

    class Seed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x[0:8].view(2, 4)

    cia_to_decomp, _ = torch_internals.split_decomposition_table(importer._decomposition_table())
    ops = list(cia_to_decomp)
    hloalias.compile(Seed(), (torch.randn(8),))
    before = _operator_state(ops)
    with pytest.raises(hloalias.HloaliasError):
        hloalias.compile(Fails(), (torch.randn(8),))
    assert _operator_state(ops) == before
    x = torch.randn(8)
    got = hloalias.compile(Seed(), (x,))(x)
    assert torch.equal(got[0], x) and torch.equal(got[1], x[0:8].view(2, 4))
    assert _operator_state(ops) == before


class _Recording(torch.nn.Module):
    """Records, while its forward runs, whether ``nn.Module.__call__`` and
    ``__getattr__`` are torch's own (not a tracer's wrappers)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        self.scale = torch.nn.Parameter(torch.full((3,), 2.0))
        self.seen: list[tuple[bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.fx._symbolic_trace as symbolic_trace

        self.seen.append((torch.nn.Module.__call__ is symbolic_trace._orig_module_call,
                          torch.nn.Module.__getattr__ is symbolic_trace._orig_module_getattr))
        return self.inner(x) * self.scale


def _make_fx_code(module: torch.nn.Module) -> str:
    from torch.fx.experimental.proxy_tensor import make_fx

    traced = make_fx(module, tracing_mode="fake", _allow_non_fake_inputs=True)(torch.randn(2, 4))
    return str(traced.code)


def test_make_fx_in_the_block_leaves_nn_module_alone_and_traces_the_same_graph() -> None:
    """make_fx's tracer swaps ``nn.Module.__getattr__``/``__call__`` for
    wrappers that change nothing: in the block it does not (the module
    sees torch's own methods) and the graph is the same."""
    module = _Recording()
    outside = _make_fx_code(module)
    assert module.seen == [(False, False)]  # torch's trace: both wrapped
    with torch_internals.module_patches_skipped():
        inside = _make_fx_code(module)
    assert module.seen[1:] == [(True, True)]
    assert inside == outside
    assert "addmm" in inside and "relu" in inside


def test_other_tracers_are_patched_in_the_block() -> None:
    """``torch.fx.symbolic_trace``'s tracer records submodule calls and
    parameter reads through the wrappers: patched as torch patches it, the
    same graph (leaf modules as ``call_module``)."""
    module = _Recording()
    outside = torch.fx.symbolic_trace(module)
    with torch_internals.module_patches_skipped():
        inside = torch.fx.symbolic_trace(module)
    assert module.seen == [(False, False), (False, False)]
    assert str(inside.code) == str(outside.code)
    assert [n.op for n in inside.graph.nodes].count("call_module") == 2


def test_a_make_fx_under_another_tracers_wrappers_patches_as_torch_does() -> None:
    """Where ``nn.Module.__call__`` is not torch's own (another trace's
    wrapper is installed), the block patches as torch does: the module's
    calls go to make_fx's wrapper, not to the one found."""
    import torch.fx._symbolic_trace as symbolic_trace

    found_calls: list[int] = []
    original = torch.nn.Module.__call__

    def other_wrapper(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        found_calls.append(1)
        return original(self, *args, **kwargs)

    module = _Recording()
    torch.nn.Module.__call__ = other_wrapper  # type: ignore[method-assign]
    try:
        with torch_internals.module_patches_skipped():
            inside = _make_fx_code(module)
        assert torch.nn.Module.__call__ is other_wrapper
    finally:
        torch.nn.Module.__call__ = original  # type: ignore[method-assign]
    assert module.seen == [(False, True)]  # __call__ wrapped by make_fx, __getattr__ torch's own
    assert not found_calls  # make_fx's wrapper calls torch's original, as without the block
    assert torch.nn.Module.__call__ is symbolic_trace._orig_module_call
    assert "addmm" in inside and "relu" in inside


def test_module_patches_skipped_restores_torch() -> None:
    import torch.fx._symbolic_trace as symbolic_trace

    original = symbolic_trace._new_patcher
    with torch_internals.module_patches_skipped():
        with torch_internals.module_patches_skipped():
            assert symbolic_trace._new_patcher is not original
        assert symbolic_trace._new_patcher is not original
    assert symbolic_trace._new_patcher is original
    with pytest.raises(RuntimeError, match="inside"):
        with torch_internals.module_patches_skipped():
            raise RuntimeError("inside")
    assert symbolic_trace._new_patcher is original
    assert symbolic_trace.CURRENT_PATCHER is None


def test_compile_traces_without_patching_nn_module() -> None:
    """The single trace of ``hloalias.compile`` runs the model with
    ``nn.Module``'s own methods (no class-wide patch per trace), and the
    program is eager's."""
    module = _Recording()
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = module(x)
    module.seen.clear()
    compiled = hloalias.compile(module, (x,))
    assert module.seen and all(seen == (True, True) for seen in module.seen)
    torch.testing.assert_close(compiled(x), expected)


def test_eliminate_dead_code_removes_what_torchs_removes() -> None:
    """``torch_internals.eliminate_dead_code`` asks ``is_impure`` of nodes
    without users only: the same nodes go as with torch's own, on a graph
    with dead pure, random, in-place and effectful nodes and dead chains."""
    aten = torch.ops.aten

    def dead_ends(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        unused = aten.add.Tensor(x, y)
        chain = aten.mul.Tensor(aten.sin.default(x), 2)  # noqa: F841 - a dead chain
        aten.rand.default([3], device="cpu")  # random: impure outside a tracing context
        aten.add_.Tensor(y.clone(), 1)  # a write to a dead clone
        aten.copy_.default(y, x)  # a write to an input: kept
        del unused
        return aten.cos.default(x)

    def graph() -> torch.fx.GraphModule:
        from torch.fx.experimental.proxy_tensor import make_fx

        traced = make_fx(dead_ends, tracing_mode="fake")(torch.randn(3), torch.randn(3))
        return traced

    torchs, ours = graph(), graph()
    before = [node.format_node() for node in ours.graph.nodes]
    assert torchs.graph.eliminate_dead_code() == torch_internals.eliminate_dead_code(ours.graph)
    kept = [node.format_node() for node in ours.graph.nodes]
    assert kept == [node.format_node() for node in torchs.graph.nodes]
    assert len(kept) < len(before) and any("rand" in line for line in kept) and any("copy_" in line for line in kept)
