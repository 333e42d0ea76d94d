# RUN: %PYTHON %s | filecheck %s

"""JAX's lowering rules spliced into an imported program
(frontend/jax_lowerings.py): at the torch stage an op torch-mlir cannot
lower stands as a ``stablehlo.custom_call @hloalias.jax_lowering``
placeholder naming its rule; at the StableHLO stage JAX's lowering (here
LAPACK's getrf and gesdd, ``stablehlo.fft``) is inlined into ``@main``, the
one function left.  Splicing a module with no placeholder changes nothing;
a rule JAX cannot lower is a TorchImportError naming it."""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch

import hloalias
from hloalias.frontend import jax_lowerings


def run(test: Callable[[], None]) -> Callable[[], None]:
    print(f"\nTEST: {test.__name__}", flush=True)
    test()
    gc.collect()
    return test


# CHECK-LABEL: TEST: placeholder_at_the_torch_stage
# CHECK:       torch_c.to_builtin_tensor %arg0 : !torch.vtensor<[3,3],f32> -> tensor<3x3xf32>
# CHECK-NEXT:  stablehlo.custom_call @hloalias.jax_lowering(%{{.*}}) {hloalias.jax_params = "{}", hloalias.jax_rule = "det"} : (tensor<3x3xf32>) -> tensor<f32>
# CHECK-NEXT:  torch_c.from_builtin_tensor
@run
def placeholder_at_the_torch_stage() -> None:
    print(hloalias.import_torch(torch.linalg.det, (torch.randn(3, 3),), stage=hloalias.Stage.TORCH).text)


# CHECK-LABEL: TEST: spliced_at_the_stablehlo_stage
# CHECK:       func.func @main(%arg0: tensor<4x4xf32>
# CHECK-NOT:   hloalias.jax_lowering
# CHECK-DAG:   stablehlo.custom_call @lapack_sgetrf_ffi
# CHECK-DAG:   stablehlo.custom_call @lapack_sgesdd_ffi
# CHECK-NOT:   func.func
# CHECK:       functions: 1
@run
def spliced_at_the_stablehlo_stage() -> None:
    text = hloalias.import_torch(lambda a: (torch.linalg.det(a), torch.linalg.svdvals(a)), (torch.randn(4, 4),)).text
    print(text)
    print("functions:", text.count("func.func"))


# CHECK-LABEL: TEST: fft_is_stablehlo_fft
# CHECK:       stablehlo.fft %{{.*}}, type = RFFT, length = [8] : (tensor<4x8xf32>) -> tensor<4x5xcomplex<f32>>
@run
def fft_is_stablehlo_fft() -> None:
    print(hloalias.import_torch(torch.fft.rfft, (torch.randn(4, 8),)).text)


# CHECK-LABEL: TEST: rerun_changes_nothing
# CHECK:       same: True
@run
def rerun_changes_nothing() -> None:
    program = hloalias.import_torch(torch.linalg.det, (torch.randn(3, 3),))
    before = program.text
    jax_lowerings.splice(program.torch_mlir_module)
    print("same:", program.text == before)


# CHECK-LABEL: TEST: a_rule_jax_cannot_lower
# CHECK:       TorchImportError: JAX's lowering of det ({}) failed: no lowering here
@run
def a_rule_jax_cannot_lower() -> None:
    original = jax_lowerings._lowered_text

    def failing(*args: object) -> str:
        raise ValueError("no lowering here")

    jax_lowerings._lowered_text = failing  # type: ignore[assignment]
    try:
        hloalias.import_torch(torch.linalg.det, (torch.randn(2, 2),))
    except hloalias.TorchImportError as error:
        print(f"TorchImportError: {str(error).splitlines()[0]}")
    finally:
        jax_lowerings._lowered_text = original  # type: ignore[assignment]
