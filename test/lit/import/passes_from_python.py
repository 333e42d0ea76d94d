# RUN: %PYTHON %s | filecheck %s

"""hloalias's passes driven from Python: ``apply`` on an imported Program or
on a parsed torch-mlir module, ``add_to`` a torch-mlir PassManager next to
upstream passes, and textual pipelines through hloalias.pipeline."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable

import torch
from torch_mlir import ir, passmanager

import hloalias
from hloalias.mlir import new_context, parse_module, print_module
from hloalias.passes import AliasDonatedBuffers, EliminateViewResults
from hloalias.pipeline import DEFAULT_PIPELINE, run_pipeline


def run(test: Callable[[], None]) -> Callable[[], None]:
    """Print the test's name for CHECK-LABEL, run it, then free what it made."""
    print(f"\nTEST: {test.__name__}", flush=True)
    test()
    gc.collect()
    return test


def seed(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed example: x itself and a view of it."""
    a = x[0:1024]
    return x, a.view(2, 512)


class KVCache(torch.nn.Module):
    """A static cache updated at the positions given by an index input."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, 16, 4))

    def forward(self, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.k_cache.index_copy_(1, pos, k)
        return self.k_cache[:, :8]


def import_kv_cache() -> hloalias.Program:
    """The KV cache imported to StableHLO."""
    return hloalias.import_torch(KVCache(), (torch.randn(1, 2, 4), torch.tensor([3, 4])))


# CHECK-LABEL: TEST: apply_to_program
# Both results of the seed are rebuilt from x; the donation of x is refused
# (with a UserWarning) because the runtime reads x after the call.
# CHECK:      removed output:0 pass_through base=arg:0 sizes=(1024,) strides=(1,) offset=0
# CHECK-NEXT: removed output:1 view base=arg:0 sizes=(2, 512) strides=(512, 1) offset=0
# CHECK-NEXT: kept ()
# CHECK:      func.func @main(%arg0: tensor<1024xf32> {hloalias.kind = "user_input", hloalias.name = "x"}) attributes {hloalias.removed_results = [
# CHECK-NEXT:   return{{$}}
# CHECK:      alias-donated-buffers: 0 aliases, 0 bytes saved
# CHECK-NEXT:   unused  arg 0 'x' (explicit): it is returned unchanged (output:0, rebuilt from its buffer after the call)
# CHECK-NEXT: warning: UserWarning: Some donated buffers were not usable: 'x'
# CHECK-NOT:  tf.aliasing_output
# CHECK:      end apply_to_program
@run
def apply_to_program() -> None:
    program = hloalias.import_torch(seed, (torch.randn(1024),))
    view_report = EliminateViewResults().apply(program)
    for removal in view_report.removed:
        assert removal.layout is not None
        layout = removal.layout
        print(
            f"removed {removal.key} {removal.reason} base={removal.base} sizes={layout.sizes} "
            f"strides={layout.strides} offset={layout.offset}"
        )
    print(f"kept {view_report.kept}")
    print(program.text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alias_report = AliasDonatedBuffers(donate=("x",)).apply(program)
    print(alias_report.to_text())
    for warning in caught:
        print(f"warning: {warning.category.__name__}: {warning.message}")
    print(program.text)
    print("end apply_to_program")


# CHECK-LABEL: TEST: apply_to_parsed_module
# dead_results takes positions; the view of the mutated buffer's new value is
# rebuilt from it, and the buffer aliases its new value.
# CHECK:      func.func @main(%arg0: tensor<8xf32> {hloalias.donation = "inferred", hloalias.kind = "buffer", hloalias.name = "b", tf.aliasing_output = 0 : i32})
# CHECK-SAME:   -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"})
# CHECK-SAME:   attributes {hloalias.removed_results = [{reason = "dead", result = "output:0"},
# CHECK-SAME:   {base = "mutation:0", chain = ["slice [4:8:1]"], dtype = f32, offset = 4 : i64, reason = "view", result = "output:1", sizes = array<i64: 4>, strides = array<i64: 1>}]} {
# CHECK-NEXT:   %0 = stablehlo.negate %arg0 : tensor<8xf32>
# CHECK-NEXT:   return %0 : tensor<8xf32>
# CHECK:      bytes saved: 32
@run
def apply_to_parsed_module() -> None:
    text = """
    func.func @main(%arg0: tensor<8xf32> {hloalias.kind = "buffer", hloalias.name = "b"})
        -> (tensor<8xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation"},
            tensor<8xf32> {hloalias.output = 0 : i64, hloalias.role = "user_output"},
            tensor<4xf32> {hloalias.output = 1 : i64, hloalias.role = "user_output"}) {
      %0 = stablehlo.negate %arg0 : tensor<8xf32>
      %1 = stablehlo.exponential %arg0 : tensor<8xf32>
      %2 = stablehlo.slice %0 [4:8] : (tensor<8xf32>) -> tensor<4xf32>
      return %0, %1, %2 : tensor<8xf32>, tensor<8xf32>, tensor<4xf32>
    }
    """
    module = parse_module(text, new_context())
    EliminateViewResults(dead_results=(1,)).apply(module)
    report = AliasDonatedBuffers().apply(module)
    print(print_module(module))
    print(f"bytes saved: {report.bytes_saved}")


# CHECK-LABEL: TEST: add_to_pass_manager
# The passes run inside a torch-mlir PassManager between upstream passes, and
# each run hands its report back through the list.
# CHECK:      reports: ViewReport, AliasReport
# CHECK-NEXT: removed output:0 view base=mutation:0
# CHECK-NEXT: alias-donated-buffers: 1 aliases, 256 bytes saved
# CHECK-NEXT:   alias   arg 0 'k_cache' -> result 0  256 bytes  (inferred)
# CHECK-NEXT:   unused  arg 1 'k' (explicit): no free result of type tensor<1x2x4xf32>; kept as jax.buffer_donor
# CHECK:      func.func @main(
# CHECK-SAME:   %arg0: tensor<1x16x4xf32> {hloalias.donation = "inferred", hloalias.kind = "buffer", hloalias.name = "k_cache", tf.aliasing_output = 0 : i32},
# CHECK-SAME:   %arg1: tensor<1x2x4xf32> {hloalias.donation = "explicit", hloalias.kind = "user_input", hloalias.name = "k", hloalias.unused_donation = "no free result of type tensor<1x2x4xf32>", jax.buffer_donor = true},
# The index input carries the range eager's index_copy_ accepts (checked on
# every call before the program runs: XLA would drop an out-of-range row):
# CHECK-SAME:   %arg2: tensor<2xi64> {hloalias.index_ranges = [{high = 16 : i64, low = 0 : i64, op = "aten.index_copy", where = "{{.*}}.py:{{[0-9]+}} in forward: self.k_cache.index_copy_(1, pos, k)"}], hloalias.kind = "user_input", hloalias.name = "pos"})
# CHECK-SAME:   -> (tensor<1x16x4xf32> {hloalias.mutates = 0 : i64, hloalias.role = "mutation", hloalias.storage = "arg:0"})
# CHECK-SAME:   attributes {hloalias.removed_results = [{base = "mutation:0", chain = ["slice [0:1:1, 0:8:1, 0:4:1]"], dtype = f32, offset = 0 : i64, reason = "view", result = "output:0", sizes = array<i64: 1, 8, 4>, strides = array<i64: 64, 4, 1>}]} {
# CHECK:        %[[CACHE:[0-9]+]] = "stablehlo.scatter"(%arg0, %{{.*}}, %arg1)
# CHECK-NOT:    stablehlo.slice
# CHECK:        return %[[CACHE]] : tensor<1x16x4xf32>
@run
def add_to_pass_manager() -> None:
    program = import_kv_cache()
    module = program.torch_mlir_module
    reports: list[object] = []
    with module.context, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report says why 'k' was not used
        pm = passmanager.PassManager("builtin.module")
        EliminateViewResults().add_to(pm, reports)
        pm.add("canonicalize")
        AliasDonatedBuffers(donate=("k",)).add_to(pm, reports)
        pm.run(module.operation)
    print("reports: " + ", ".join(type(report).__name__ for report in reports))
    view_report, alias_report = reports
    for removal in view_report.removed:  # type: ignore[attr-defined]
        print(f"removed {removal.key} {removal.reason} base={removal.base}")
    print(alias_report.to_text())  # type: ignore[attr-defined]
    print(program.text)


# CHECK-LABEL: TEST: pass_manager_error
# A bad option fails the PassManager run with an MLIR diagnostic naming the
# culprit, and the pass leaves the module as it was.
# CHECK:      MLIRError: {{.*}}alias-donated-buffers: donate names unknown argument 'nope' (arguments: k_cache, k, pos)
# CHECK-NEXT: module unchanged: True
@run
def pass_manager_error() -> None:
    program = import_kv_cache()
    module = program.torch_mlir_module
    before = program.text
    with module.context:
        pm = passmanager.PassManager("builtin.module")
        AliasDonatedBuffers(donate=("nope",)).add_to(pm)
        try:
            pm.run(module.operation)
        except ir.MLIRError as error:
            print("MLIRError: " + " ".join(str(error).split()))
    print(f"module unchanged: {program.text == before}")


# CHECK-LABEL: TEST: textual_pipeline
# The default pipeline and one with options, from Python; options print back
# in pipeline syntax.
# CHECK:      default: builtin.module(fold-transpose-into-dot-general, fold-broadcast-into-dot-general, window-scatter-indices, window-gather-indices, scatter-to-dynamic-update-slice, select-to-dynamic-update-slice, bitcast-overwrite-scatter, widen-one-row-updates, fold-repeat-into-dot-general, elementwise-in-producer-shape, eliminate-view-results, alias-donated-buffers)
# CHECK-NEXT: reports: FoldReport, BroadcastFoldReport, WindowScatterReport, WindowGatherReport, ScatterToUpdateSliceReport, SelectToUpdateSliceReport, BitcastScatterReport, WidenReport, RepeatFoldReport, ElementwiseShapeReport, ViewReport, AliasReport
# CHECK-NEXT: k_cache aliases result 0
# CHECK-NEXT: alias-donated-buffers{donate=x,0 exclude-kinds=parameter}
# CHECK-NEXT: eliminate-view-results{dead-results=1,2}
@run
def textual_pipeline() -> None:
    program = import_kv_cache()
    print(f"default: {DEFAULT_PIPELINE}")
    reports = run_pipeline(program.torch_mlir_module, DEFAULT_PIPELINE)
    print("reports: " + ", ".join(type(report).__name__ for report in reports))
    for alias in reports[-1].aliases:
        print(f"{alias.arg_name} aliases result {alias.result_index}")
    print(AliasDonatedBuffers.from_options("donate=x,0 exclude-kinds=parameter").option_text())
    print(EliminateViewResults(dead_results=(1, 2)).option_text())
