"""``order-in-place-updates`` on the inputs that broke it (issue 25, item 8):
one SSA value returned as the new value of two aliased arguments (the pass
erased its op while the second result still used it: a segfault, exit 139,
inside the MLIR bindings), and reads of the old value inside a region
(``case``/``while``/``if``: the predicate read a value defined in the
region, which does not dominate the return: invalid IR).

The torch program runs in a child process, so that a crash in the bindings
fails this test instead of killing pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from torch_mlir import ir

from hloalias.mlir import new_context, parse_module
from hloalias.passes import OrderInPlaceUpdates
from hloalias.runtime.pjrt import compile_module, device_for

_TWO_COPIES_OF_ONE_VALUE = textwrap.dedent(
    """
    import torch
    import hloalias
    from hloalias.runtime.training import TRAINING_PIPELINE


    class TwoCopies(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("a", torch.arange(4.0))
            self.register_buffer("b", torch.arange(4.0) * 10)

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            old = self.a * 2 + self.b  # a read of both old values
            z = z + 1
            self.a.copy_(z)
            self.b.copy_(z.clone())  # the clone folds away: one value, two results
            return old


    eager = TwoCopies()
    model = TwoCopies()
    z = torch.tensor([5.0, 6.0, 7.0, 8.0])
    step = hloalias.compile(model, (z,), pipeline=TRAINING_PIPELINE)
    for call in range(2):
        expected = eager(z)
        got = step(z)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        state = step.state_dict()
        torch.testing.assert_close(state["a"], eager.a, rtol=0, atol=0)
        torch.testing.assert_close(state["b"], eager.b, rtol=0, atol=0)
    print("ok")
    """
)


def test_one_value_as_two_aliased_results_runs_as_eager() -> None:
    """Failed before the fix with exit status -11 (SIGSEGV) during compile."""
    child = subprocess.run(
        [sys.executable, "-c", _TWO_COPIES_OF_ONE_VALUE],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HLOALIAS_CACHE": "0"},
    )
    assert child.returncode == 0, child.stderr[-4000:]
    assert child.stdout.strip().endswith("ok")


_MAIN_ATTRS = (
    '%w: tensor<4xf32> {hloalias.kind = "buffer", hloalias.name = "w", tf.aliasing_output = 0 : i32}, '
    '%d: tensor<4xf32> {hloalias.kind = "user_input", hloalias.name = "d"}, '
    '%p: tensor<{pred}> {hloalias.kind = "user_input", hloalias.name = "p"}'
)
_RESULTS = (
    '(tensor<4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"}, '
    'tensor<4xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"})'
)

_READ_IN_IF = """
func.func @main(ARGS) -> RESULTS {
  %r = "stablehlo.if"(%p) ({
    %m = stablehlo.multiply %w, %d : tensor<4xf32>
    stablehlo.return %m : tensor<4xf32>
  }, {
    stablehlo.return %d : tensor<4xf32>
  }) : (tensor<i1>) -> tensor<4xf32>
  %new = stablehlo.subtract %d, %d : tensor<4xf32>
  return %new, %r : tensor<4xf32>, tensor<4xf32>
}
"""

_READ_IN_CASE = """
func.func @main(ARGS) -> RESULTS {
  %r = "stablehlo.case"(%p) ({
    %m = stablehlo.negate %w : tensor<4xf32>
    stablehlo.return %m : tensor<4xf32>
  }, {
    stablehlo.return %d : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  %new = stablehlo.multiply %d, %d : tensor<4xf32>
  return %new, %r : tensor<4xf32>, tensor<4xf32>
}
"""

_READ_IN_WHILE = """
func.func @main(ARGS) -> RESULTS {
  %zero = stablehlo.constant dense<0> : tensor<i64>
  %loop:2 = stablehlo.while(%i = %zero, %acc = %d) : tensor<i64>, tensor<4xf32>
  cond {
    %limit = stablehlo.constant dense<3> : tensor<i64>
    %lt = stablehlo.compare LT, %i, %limit : (tensor<i64>, tensor<i64>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  } do {
    %one = stablehlo.constant dense<1> : tensor<i64>
    %next = stablehlo.add %i, %one : tensor<i64>
    %sum = stablehlo.add %acc, %w : tensor<4xf32>
    stablehlo.return %next, %sum : tensor<i64>, tensor<4xf32>
  }
  %new = stablehlo.multiply %d, %d : tensor<4xf32>
  return %new, %loop#1 : tensor<4xf32>, tensor<4xf32>
}
"""


def _module(template: str, pred: str) -> ir.Module:
    text = template.replace("ARGS", _MAIN_ATTRS.replace("{pred}", pred)).replace("RESULTS", _RESULTS)
    return parse_module(text, new_context())


def _run_and_compile(template: str, pred: str) -> int:
    """The pass on the module, then the MLIR verifier and XLA; the number
    of reads the update was ordered after."""
    module = _module(template, pred)
    report = OrderInPlaceUpdates().apply(module)
    with module.context:
        assert module.operation.verify()
    compile_module(str(module), device_for("cpu"))
    return sum(update.readers for update in report.ordered)


def test_read_of_the_old_value_inside_an_if_branch() -> None:
    """Failed before the fix: 'operand #0 does not dominate this use'."""
    assert _run_and_compile(_READ_IN_IF, "i1") == 1


def test_read_of_the_old_value_inside_a_case_branch() -> None:
    assert _run_and_compile(_READ_IN_CASE, "i32") == 1


def test_read_of_the_old_value_inside_a_while_body() -> None:
    assert _run_and_compile(_READ_IN_WHILE, "i1") == 1


def test_rerun_orders_nothing_new() -> None:
    """A second run finds every read already before the guarded write."""
    module = _module(_READ_IN_IF, "i1")
    OrderInPlaceUpdates().apply(module)
    first = str(module)
    assert OrderInPlaceUpdates().apply(module).ordered == ()
    assert str(module) == first


def test_default_cpu_pipeline_updates_sgd_weights_without_copies() -> None:
    """``hloalias.compile`` with no pipeline (CPU_PIPELINE, which now ends
    with ``order-in-place-updates``) on bench's SGD-momentum step, 2 layers
    of 256: XLA no longer copies the 4 weights and biases the forward reads
    before their in-place updates."""
    import copy

    import torch

    import hloalias
    from bench.workloads import MLPConfig, SGDMomentumStep
    from hloalias.pipeline import CPU_PIPELINE, ORDER_PASS

    assert CPU_PIPELINE.endswith(f", {ORDER_PASS})")
    torch.manual_seed(0)
    config = MLPConfig(width=256, layers=2, batch=64)
    model = SGDMomentumStep(config)
    x = torch.randn(64, 256)
    grads = tuple(torch.randn_like(p) for p in (model.w0, model.b0, model.w1, model.b1))
    eager = copy.deepcopy(model)
    exe = hloalias.compile(model, (x, *grads))
    with torch.no_grad():
        expected = eager(x, *grads)
    torch.testing.assert_close(exe(x, *grads), expected)
    torch.testing.assert_close(exe.state_dict()["w0"], eager.w0.detach())
    without = hloalias.compile(copy.deepcopy(model), (x, *grads), pipeline=CPU_PIPELINE.replace(f", {ORDER_PASS}", ""))
    # Without the pass XLA keeps a copy of both weights and both biases
    # (2 x 262,144 + 2 x 1,024 bytes); with it the temp is the hidden
    # activation (64 x 256 f32) and 2 KiB more.
    assert without.memory_stats["temp_bytes"] == 526_336
    assert exe.memory_stats["temp_bytes"] == 67_584


_BRANCHES_AND_CHAINS = """
func.func @main(ARGS) -> RESULTS {
  %a = stablehlo.multiply %w, %d : tensor<4xf32>
  %b = stablehlo.negate %d : tensor<4xf32>
  %r = "stablehlo.case"(%p) ({
    %m = stablehlo.add %a, %w : tensor<4xf32>
    stablehlo.return %m : tensor<4xf32>
  }, {
    stablehlo.return %d : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  %c = stablehlo.add %r, %b : tensor<4xf32>
  %e = stablehlo.subtract %b, %d : tensor<4xf32>
  %new = stablehlo.multiply %e, %c : tensor<4xf32>
  return %new, %a : tensor<4xf32>, tensor<4xf32>
}
"""


def _walked_ancestors(op: ir.Operation, body: list[ir.Operation]) -> set[int]:
    """Positions in ``body`` of the ops ``op`` reads, transitively, by walking
    operands (nested regions included): what the pass answered before it
    kept one bit set per op."""

    def operands(of: ir.Operation) -> list[ir.Value]:
        found = list(of.operands)
        for region in of.regions:
            for block in region.blocks:
                for nested in block.operations:
                    found += operands(nested.operation)
        return found

    seen: set[int] = set()
    stack = [op]
    while stack:
        for value in operands(stack.pop()):
            if isinstance(value.owner, ir.Block):
                continue
            producer = value.owner.operation
            while producer.parent is not None and producer.parent.operation != body[0].parent.operation:
                producer = producer.parent.operation
            at = body.index(producer)
            if body[at] != op and at not in seen:
                seen.add(at)
                stack.append(producer)
    return seen


def test_ancestry_is_the_transitive_walk() -> None:
    """The one-pass bit sets (``_Ancestry``) give every op the ancestors a
    walk of its operands finds, reads inside a case's branch included."""
    from hloalias.passes.order_in_place_updates import _Ancestry

    module = _module(_BRANCHES_AND_CHAINS, "i32")
    with module.context:
        main = next(op.operation for op in module.body.operations)
        block = main.regions[0].blocks[0]
        body = [op.operation for op in block.operations]
        ancestry = _Ancestry(block, main)
        for op in body:
            expected = _walked_ancestors(op, body)
            assert {at for at, other in enumerate(body) if ancestry.precedes(other, op)} == expected
        names = {op.name: at for at, op in enumerate(body)}
        assert ancestry.precedes(body[0], body[names["stablehlo.case"]])  # %a, read in a branch
        assert not ancestry.precedes(body[names["stablehlo.case"]], body[names["stablehlo.subtract"]])
    assert sum(update.readers for update in OrderInPlaceUpdates().apply(module).ordered) == 0
