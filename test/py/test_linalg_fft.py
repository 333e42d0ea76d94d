"""linalg and fft lowered by JAX's rules (frontend/jax_lowerings.py,
frontend/linalg_fft.py): values, dtypes and shapes equal eager's beyond
OpInfo's first samples (batches, float64, the flags each op has, LAPACK's
``info``), the spliced IR is one ``@main`` with LAPACK's custom calls, a
program from the disk cache runs, and the sweep's comparisons of
decompositions with non-unique results reject wrong ones."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch

import hloalias
import opinfo_sweep
from hloalias.frontend import jax_lowerings

GEN = torch.Generator().manual_seed(0)


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN, dtype=dtype)


def positive_definite(*batch: int, n: int = 4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    a = randn(*batch, n, n, dtype=dtype)
    return a @ a.mT + n * torch.eye(n, dtype=dtype)


def matches_eager(f: Any, *inputs: torch.Tensor, compare: Any = None) -> None:
    expected = f(*[t.clone() for t in inputs])
    actual = hloalias.compile(f, [t.clone() for t in inputs])(*[t.clone() for t in inputs])
    problem = (compare or (lambda e, a: opinfo_sweep._compare(e, a, "output")))(expected, actual)
    assert problem is None, (problem, expected, actual)


# --- linalg ----------------------------------------------------------------------------------


def test_solve_left_right_vector_and_broadcast_batches() -> None:
    a, b = randn(2, 4, 4), randn(4, 3)
    matches_eager(lambda a, b: torch.linalg.solve(a, b), a, b)
    matches_eager(lambda a, b: torch.linalg.solve(a, b, left=False), a, randn(3, 4))
    matches_eager(lambda a, v: torch.linalg.solve(a, v), a, randn(2, 4))  # a batch of vectors
    matches_eager(lambda a, b: torch.linalg.solve_ex(a, b), a, b)


def test_lu_factor_solve_and_unpack() -> None:
    a = randn(3, 5, 5)
    matches_eager(lambda a: torch.linalg.lu_factor(a), a)
    matches_eager(lambda a: torch.linalg.lu(a), randn(4, 6))
    matches_eager(lambda a: torch.linalg.lu(a), randn(6, 4))
    lu, pivots = torch.linalg.lu_factor(a)
    b = randn(3, 5, 2)
    for left in (True, False):
        for adjoint in (True, False):
            rhs = b if left else b.mT
            matches_eager(
                lambda lu, p, r: torch.linalg.lu_solve(lu, p, r, left=left, adjoint=adjoint), lu, pivots, rhs
            )
    matches_eager(lambda lu, p: torch.lu_unpack(lu, p), lu, pivots)
    matches_eager(lambda lu, p: torch.lu_unpack(lu, p, unpack_data=False), lu, pivots)
    matches_eager(lambda lu, p: torch.lu_unpack(lu, p, unpack_pivots=False), lu, pivots)


def test_info_is_lapacks_for_singular_and_indefinite_matrices() -> None:
    singular = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])
    matches_eager(lambda a: torch.linalg.lu_factor_ex(a), singular)
    matches_eager(lambda a: torch.linalg.inv_ex(a)[1], singular)
    fine = positive_definite(n=3)
    matches_eager(lambda a: torch.linalg.cholesky_ex(a), fine)
    indefinite = torch.tensor([[4.0, 1.0, 0.0], [1.0, 2.0, 3.0], [0.0, 3.0, 1.0]])  # second minor 7 > 0, det < 0
    eager_info = torch.linalg.cholesky_ex(indefinite).info
    assert eager_info.item() == 3
    compiled = hloalias.compile(lambda a: torch.linalg.cholesky_ex(a).info, (indefinite,))
    assert torch.equal(compiled(indefinite), eager_info)


def test_inverse_determinants_and_cholesky() -> None:
    a = randn(2, 4, 4)
    matches_eager(torch.linalg.inv, a)
    matches_eager(torch.linalg.det, a)
    matches_eager(torch.linalg.slogdet, a)
    matches_eager(torch.logdet, a)  # NaN where det < 0, as eager
    spd = positive_definite(2)
    matches_eager(lambda a: torch.linalg.cholesky(a, upper=True), spd)
    matches_eager(torch.cholesky_inverse, torch.linalg.cholesky(spd))
    matches_eager(lambda u: torch.cholesky_inverse(u, upper=True), torch.linalg.cholesky(spd, upper=True))
    matches_eager(lambda b, u: torch.cholesky_solve(b, u, upper=True), randn(4, 3), torch.linalg.cholesky(spd, upper=True))
    matches_eager(torch.linalg.inv, randn(4, 4, dtype=torch.float64))


def test_qr_modes_and_householder() -> None:
    a = randn(2, 5, 3)
    for mode in ("reduced", "complete", "r"):
        matches_eager(lambda a: torch.linalg.qr(a, mode=mode), a)
    matches_eager(torch.geqrf, a)
    q, tau = torch.geqrf(a)
    matches_eager(torch.linalg.householder_product, q, tau)
    matches_eager(lambda q, t, c: torch.ormqr(q, t, c, left=False, transpose=True), q, tau, randn(2, 4, 5))


def test_triangular_solves() -> None:
    a, b = randn(4, 4).triu() + 4 * torch.eye(4), randn(4, 2)
    matches_eager(lambda a, b: torch.linalg.solve_triangular(a, b, upper=True), a, b)
    matches_eager(lambda a, b: torch.linalg.solve_triangular(a, b, upper=True, left=False, unitriangular=True), a, b.mT)
    matches_eager(lambda b, a: torch.triangular_solve(b, a, upper=True, transpose=True), b, a)


def test_spectral_decompositions_and_pinv() -> None:
    sym = positive_definite(2, n=5)
    matches_eager(lambda a: torch.linalg.eigh(a, UPLO="U"), sym, compare=opinfo_sweep.NON_UNIQUE["linalg.eigh"])
    matches_eager(lambda a: torch.linalg.eigvalsh(a, UPLO="U"), randn(5, 5))
    a = randn(2, 5, 3)
    matches_eager(
        lambda a: torch.linalg.svd(a, full_matrices=True), a, compare=opinfo_sweep.NON_UNIQUE["linalg.svd"]
    )
    matches_eager(torch.linalg.svdvals, a)
    matches_eager(lambda a: torch.linalg.pinv(a, atol=0.5), a)
    matches_eager(lambda a: torch.linalg.pinv(a, rtol=0.3), a)
    matches_eager(lambda a: torch.linalg.pinv(a, hermitian=True), sym)
    matches_eager(torch.linalg.matrix_exp, randn(3, 3) / 2)
    eig = torch.tensor([[2.0, -1.0, 0.0], [1.0, 2.0, 0.0], [0.0, 0.0, 3.0]])  # eigenvalues 2 +- i, 3
    matches_eager(torch.linalg.eigvals, eig)
    matches_eager(torch.linalg.eig, eig, compare=opinfo_sweep.NON_UNIQUE["linalg.eig"])


# --- fft -------------------------------------------------------------------------------------


def test_fft_sizes_dims_and_norms() -> None:
    x = randn(3, 8, 6)
    for norm in (None, "ortho", "forward", "backward"):
        matches_eager(lambda t: torch.fft.fft(t, n=5, dim=1, norm=norm), x)
        matches_eager(lambda t: torch.fft.ifft(t, norm=norm), x)
        matches_eager(lambda t: torch.fft.rfft(t, n=7, norm=norm), x)
        matches_eager(lambda t: torch.fft.irfft(torch.fft.rfft(t), n=7, norm=norm), x)
        matches_eager(lambda t: torch.fft.hfft(torch.fft.ihfft(t), n=6, norm=norm), x)
        matches_eager(lambda t: torch.fft.fftn(t, s=(4, 3), dim=(0, 2), norm=norm), x)
        matches_eager(lambda t: torch.fft.irfft2(torch.fft.rfft2(t), norm=norm), x)
        matches_eager(lambda t: torch.fft.hfftn(torch.fft.ihfftn(t, dim=(0, 1)), dim=(0, 1), norm=norm), x)
        matches_eager(lambda t: torch.fft.ihfft2(t, s=(5, 4), norm=norm), x)
    matches_eager(lambda t: (torch.fft.fftshift(t, dim=1), torch.fft.ifftshift(t)), x)
    matches_eager(lambda t: torch.fft.fft(t), torch.arange(6))  # integers: promoted as eager does
    matches_eager(lambda t: torch.fft.rfft(t), randn(9, dtype=torch.float64))


def test_complex_inputs_and_real_parts() -> None:
    z = torch.complex(randn(4, 6), randn(4, 6))
    matches_eager(lambda t: torch.fft.ifft2(t), z)
    # torch-mlir took abs of a complex tensor's real part: a wrong modulus.
    matches_eager(lambda t: torch.fft.fft(t).abs().square(), randn(4, 6))
    matches_eager(lambda t: (torch.fft.rfft(t).real, torch.fft.rfft(t).imag, t.abs()), randn(4, 6))


# --- the splice ------------------------------------------------------------------------------


def test_imported_program_is_one_main_with_lapack_calls() -> None:
    program = hloalias.import_torch(lambda a: torch.linalg.svdvals(a) + torch.linalg.det(a), (randn(4, 4),))  # 4x4: jnp has a closed form for 3x3 dets
    text = program.text
    assert jax_lowerings.TARGET not in text
    assert text.count("func.func") == 1, text
    assert "stablehlo.custom_call @lapack_sgesdd_ffi" in text
    assert "stablehlo.custom_call @lapack_sgetrf_ffi" in text
    fft_text = hloalias.import_torch(lambda x: torch.fft.rfft(x), (randn(8),)).text
    assert "stablehlo.fft" in fft_text and "RFFT" in fft_text


def test_program_from_the_disk_cache_runs_lapack(tmp_path: Any) -> None:
    """A program read back from the disk caches (the imported program and
    its executable) lowers nothing, so nothing filled in jaxlib's LAPACK
    function pointers: its first call jumped through a null one (a
    segfault) before the runtime initialized them.  (The function is in a
    file: the program cache keys a function by its source.)"""
    script = tmp_path / "det_program.py"
    script.write_text(
        "import torch, hloalias\n"
        "a = torch.eye(4) * 2  # 4x4: jnp.linalg.det has a closed form up to 3x3\n"
        "print(hloalias.compile(lambda m: torch.linalg.det(m), (a,))(a).item())\n"
    )
    env = dict(os.environ, HLOALIAS_CACHE_DIR=str(tmp_path / "cache"))
    for run in ("compiles and stores", "loads from the disk cache"):
        child = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
        assert child.returncode == 0 and child.stdout.strip() == "16.0", (run, child.returncode, child.stderr[-2000:])


def test_custom_op_runs_eagerly_with_jax() -> None:
    a = positive_definite(n=3)
    (factor,) = jax_lowerings.call("cholesky", {"upper": False, "info": False}, a)
    torch.testing.assert_close(factor, torch.linalg.cholesky(a))


# --- the sweep's comparisons of non-unique results -------------------------------------------


def test_non_unique_comparisons_accept_gauges_and_reject_wrong_results() -> None:
    a = randn(5, 3)
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    flip = torch.tensor([1.0, -1.0, -1.0])
    svd = opinfo_sweep.NON_UNIQUE["linalg.svd"]
    assert svd((u, s, vh), (u * flip, s, flip[:, None] * vh)) is None  # signs of pairs
    assert svd((u, s, vh), (u * flip, s, vh)) is not None  # a sign of U alone
    assert svd((u, s, vh), (u, s.flip(0), vh)) is not None  # singular values
    assert svd((u, s, vh), (u * 2, s / 2, vh)) is not None  # U not orthonormal
    w, v = torch.linalg.eigh(positive_definite(n=3))
    eigh = opinfo_sweep.NON_UNIQUE["linalg.eigh"]
    assert eigh((w, v), (w, -v)) is None
    assert eigh((w, v), (w, v[:, [1, 0, 2]])) is not None
    ew, ev = torch.linalg.eig(randn(3, 3))
    eig = opinfo_sweep.NON_UNIQUE["linalg.eig"]
    assert eig((ew, ev), (ew, ev * torch.exp(1j * torch.tensor([0.3, 1.0, -2.0])))) is None
    assert eig((ew, ev), (ew, ev * 2)) is not None
