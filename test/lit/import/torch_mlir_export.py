# hloalias-opt on IR it did not produce: torch-mlir's own
# fx.export_and_import(..., output_type="stablehlo"), with tensor
# arith.constant ops, dense_resource literals (the index tensors of
# as_strided) and no hloalias.* attributes at all, runs through every
# hloalias pass (one of them twice) and compiles with XLA.
# RUN: %PYTHON %s > %t.mlir
# RUN: hloalias-opt %t.mlir --pass-pipeline='builtin.module(fold-transpose-into-dot-general, eliminate-view-results, alias-donated-buffers, eliminate-view-results)' --print-reports --xla-compile 2>&1 >/dev/null | filecheck %s
# RUN: not hloalias-opt %t.mlir --pass-pipeline='builtin.module(eliminate-view-results{dead-results=7})' 2>&1 | filecheck %s --check-prefix=ERR

import torch
from torch_mlir import fx


class Program(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(x), x.t(), x.as_strided((2, 2), (1, 2), 1)


torch.manual_seed(0)
module = fx.export_and_import(Program(), torch.randn(3, 4), output_type="stablehlo")
text = module.operation.get_asm(enable_debug_info=True)
assert "arith.constant" in text and "dense_resource" in text, "the cases this test is about"
print(text)

# CHECK-NOT: Traceback
# CHECK:      fold-transpose-into-dot-general: 1 transposes folded
# CHECK-NEXT: eliminate-view-results: 1 results removed
# CHECK-NEXT:   output:1: rebuilt as a view of arg:{{[0-9]+}} (view: transpose [1, 0])
# CHECK-NEXT:   kept on device: output:0, output:2
# CHECK-NEXT: alias-donated-buffers: 0 aliases, 0 bytes saved
# CHECK-NEXT: eliminate-view-results: 0 results removed
# CHECK-NEXT:   kept on device: output:0, output:2
# CHECK-NEXT: xla: argument_bytes=

# Diagnostics point at the source torch-mlir recorded (the callee of a call
# site location, as mlir-opt prints it), with its file name.
# ERR-NOT: Traceback
# ERR: linear.py:{{[0-9]+}}:{{[0-9]+}}: error: eliminate-view-results: dead-results names result 7, but @main has 3 results
