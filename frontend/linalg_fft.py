"""linalg and fft ops torch-mlir cannot lower, lowered by JAX's rules
(:mod:`hloalias.frontend.jax_lowerings`): each aten op maps to a rule, a
JAX function with the aten op's semantics built from ``jax.numpy.linalg``,
``jax.lax.linalg``, ``jax.scipy.linalg`` and ``jax.numpy.fft``, whose
StableHLO (LAPACK custom calls, ``stablehlo.fft``) is spliced in.  What
the rules add to JAX's functions is torch's conventions: 1-based LU pivots,
``A = P L U``, empty tensors for outputs not asked for, LAPACK's ``info``
(the first zero pivot, or the first leading minor that is not positive
definite), the ``(atol, rtol)`` cut-off of ``pinv``.

fft: each ``fft_*`` function is its ``jnp.fft`` namesake (numpy's
signature, and so torch's; integer inputs promoted as torch does);
``hfft2/n`` and ``ihfft2/n``, which jnp lacks, are numpy's definition of
``hfft`` over n dims (the real transform of the conjugate, normalization
swapped); the primitives ``_fft_r2c/c2c/c2r`` (and their prims) map to
``rfftn``/``fftn``/``ifftn``/``irfftn`` with torch's normalization.
Complex helpers: ``view_as_real`` (a copy: the graph is functional),
``abs`` of a complex tensor (torch-mlir lowers it as ``abs`` of the real
part, a wrong value) and ``conj_physical``.

Errors eager raises for a singular or non positive-definite matrix are
not raised: ``inv``, ``cholesky``, ``solve`` and ``lu_factor`` map to
rules directly, without the ``_linalg_check_errors`` torch would trace (an
op with an effect, which the importer refuses), and the ``*_ex`` ops'
``check_errors=True`` is ignored; a compiled program cannot raise, its
results are what LAPACK leaves (inf or NaN), as in JAX and torch_xla.
Not covered: ``ldl_factor``/``ldl_solve`` (JAX has no LDL rule), ``lstsq``
(torch.export refuses it), ``pivot=False`` LU (torch's CPU kernel has none
either)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hloalias.frontend.jax_lowerings import call, rule

aten = torch.ops.aten


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


def _lax_linalg() -> Any:
    import jax.lax.linalg as lax_linalg

    return lax_linalg


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,))


def _zero_pivot_info(lu: Any) -> Any:
    """LAPACK getrf's info: the 1-based index of the first zero on U's
    diagonal, 0 when there is none (int32, batch-shaped)."""
    jnp = _jnp()
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = diagonal == 0
    first = jnp.argmax(zero, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(zero, axis=-1), first, jnp.zeros_like(first))


# --- rules (params -> JAX function) --------------------------------------------------------


@rule("cholesky")
def _cholesky(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        jnp = _jnp()
        lower = _lax_linalg().cholesky(a, symmetrize_input=False)
        factor = jnp.conj(jnp.swapaxes(lower, -1, -2)) if params["upper"] else lower
        if not params["info"]:
            return (factor,)
        n = a.shape[-1]
        # potrf's info: the first k whose leading k x k minor is not
        # positive definite (Sylvester: the first non-positive leading
        # minor); 0 when the factor exists.
        eye = jnp.eye(n, dtype=a.dtype)
        minors = []
        for k in range(1, n + 1):
            keep = jnp.arange(n) < k
            block = jnp.where(keep[:, None] & keep[None, :], a, eye)
            minors.append(jnp.linalg.det(block))
        if n:
            bad = ~(jnp.stack(minors, axis=-1).real > 0)
            first = jnp.argmax(bad, axis=-1).astype(jnp.int32) + 1
            info = jnp.where(jnp.any(bad, axis=-1), first, jnp.zeros_like(first))
        else:
            info = jnp.zeros(a.shape[:-2], jnp.int32)
        return factor, info

    return f


@rule("svd")
def _svd(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        jnp = _jnp()
        if not params["compute_uv"]:
            return (jnp.linalg.svd(a, compute_uv=False),)
        return tuple(jnp.linalg.svd(a, full_matrices=params["full_matrices"]))

    return f


@rule("det")
def _det(params: dict[str, Any]) -> Callable[..., Any]:
    return lambda a: _jnp().linalg.det(a)


@rule("eig")
def _eig(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        values, vectors = _lax_linalg().eig(a, compute_left_eigenvectors=False)
        return values, vectors

    return f


@rule("eigh")
def _eigh(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        values, vectors = _jnp().linalg.eigh(a, UPLO=params["uplo"], symmetrize_input=False)
        return (values, vectors) if params["compute_v"] else (values,)

    return f


@rule("slogdet")
def _slogdet(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        sign, logabsdet = _jnp().linalg.slogdet(a)
        return sign, logabsdet

    return f


@rule("conj")
def _conj(params: dict[str, Any]) -> Callable[..., Any]:
    return lambda x: _jnp().conj(x)


@rule("cholesky_solve")
def _cholesky_solve(params: dict[str, Any]) -> Callable[..., Any]:
    """``A X = B`` from A's Cholesky factor; without B, ``A^-1``."""

    def f(factor: Any, *b: Any) -> Any:
        import jax.scipy.linalg

        jnp = _jnp()
        rhs = b[0] if b else jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
        batch = jnp.broadcast_shapes(factor.shape[:-2], rhs.shape[:-2])
        factor = jnp.broadcast_to(factor, batch + factor.shape[-2:])
        rhs = jnp.broadcast_to(rhs, batch + rhs.shape[-2:])
        return jax.scipy.linalg.cho_solve((factor, not params["upper"]), rhs)

    return f


@rule("abs")
def _abs(params: dict[str, Any]) -> Callable[..., Any]:
    return lambda x: _jnp().abs(x)


@rule("view_as_real")
def _view_as_real(params: dict[str, Any]) -> Callable[..., Any]:
    return lambda x: _jnp().stack([x.real, x.imag], axis=-1)


@rule("householder_product")
def _householder_product(params: dict[str, Any]) -> Callable[..., Any]:
    return lambda a, tau: _lax_linalg().householder_product(a, tau)


@rule("inv")
def _inv(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        if not params["info"]:
            return _jnp().linalg.inv(a)
        lu, _, _ = _lax_linalg().lu(a)
        return _jnp().linalg.inv(a), _zero_pivot_info(lu)

    return f


@rule("lu")
def _lu(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        jnp = _jnp()
        lu, _, permutation = _lax_linalg().lu(a)
        m, n = a.shape[-2:]
        k = min(m, n)
        lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=a.dtype)
        upper = jnp.triu(lu[..., :k, :])
        # A[permutation] = L U, so A = P L U with P[permutation[i], i] = 1.
        p = jnp.swapaxes(jnp.eye(m, dtype=a.dtype)[permutation], -1, -2)
        return p, lower, upper

    return f


@rule("lu_factor")
def _lu_factor(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        lu, pivots, _ = _lax_linalg().lu(a)
        return lu, pivots + 1, _zero_pivot_info(lu)

    return f


def _lu_solve_left(lu: Any, pivots0: Any, b: Any, trans: int) -> Any:
    """Solve op(A) X = B from A's LU factors (0-based pivots); ``trans``
    as LAPACK's getrs: 0 A, 1 A^T, 2 A^H."""
    jnp = _jnp()
    lax_linalg = _lax_linalg()
    m = lu.shape[-1]
    batch = jnp.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    lu = jnp.broadcast_to(lu, batch + lu.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    pivots0 = jnp.broadcast_to(pivots0, batch + pivots0.shape[-1:])
    permutation = lax_linalg.lu_pivots_to_permutation(pivots0, m)
    if trans == 0:
        x = jnp.take_along_axis(b, permutation[..., :, None], axis=-2)
        x = lax_linalg.triangular_solve(lu, x, left_side=True, lower=True, unit_diagonal=True)
        return lax_linalg.triangular_solve(lu, x, left_side=True, lower=False)
    conjugate = trans == 2
    x = lax_linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=conjugate)
    x = lax_linalg.triangular_solve(
        lu, x, left_side=True, lower=True, transpose_a=True, conjugate_a=conjugate, unit_diagonal=True
    )
    inverse = jnp.argsort(permutation, axis=-1)
    return jnp.take_along_axis(x, inverse[..., :, None], axis=-2)


def _lu_solve_general(lu: Any, pivots0: Any, b: Any, left: bool, adjoint: bool) -> Any:
    jnp = _jnp()
    if left:
        return _lu_solve_left(lu, pivots0, b, 2 if adjoint else 0)
    # X op(A) = B  <=>  op(A)^T X^T = B^T.
    bt = jnp.swapaxes(b, -1, -2)
    if adjoint:  # conj(A) X^T = B^T  <=>  A conj(X^T) = conj(B^T)
        return jnp.conj(jnp.swapaxes(_lu_solve_left(lu, pivots0, jnp.conj(bt), 0), -1, -2))
    return jnp.swapaxes(_lu_solve_left(lu, pivots0, bt, 1), -1, -2)


@rule("lu_solve")
def _lu_solve(params: dict[str, Any]) -> Callable[..., Any]:
    def f(lu: Any, pivots: Any, b: Any) -> Any:
        return _lu_solve_general(lu, pivots - 1, b, params["left"], params["adjoint"])

    return f


@rule("solve")
def _solve(params: dict[str, Any]) -> Callable[..., Any]:
    """torch's ``_linalg_solve_ex``: for real A it factors A^T and solves
    with ``adjoint`` (so the LU it returns is A^T's); for complex A, A's."""

    def f(a: Any, b: Any) -> Any:
        jnp = _jnp()
        vector = params["vector"]
        if vector:
            b = b[..., None]
        use_transpose = not jnp.iscomplexobj(a)
        factored = jnp.swapaxes(a, -1, -2) if use_transpose else a
        lu, pivots0, _ = _lax_linalg().lu(factored)
        x = _lu_solve_general(lu, pivots0, b, params["left"], use_transpose)
        if vector:
            x = x[..., 0]
        return x, lu, pivots0 + 1, _zero_pivot_info(lu)

    return f


@rule("solve_triangular")
def _solve_triangular(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any, b: Any) -> Any:
        jnp = _jnp()
        batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a = jnp.broadcast_to(a, batch + a.shape[-2:])
        b = jnp.broadcast_to(b, batch + b.shape[-2:])
        return _lax_linalg().triangular_solve(
            a,
            b,
            left_side=params["left"],
            lower=not params["upper"],
            transpose_a=params.get("transpose", False),
            unit_diagonal=params["unitriangular"],
        )

    return f


@rule("lu_unpack")
def _lu_unpack(params: dict[str, Any]) -> Callable[..., Any]:
    def f(lu: Any, pivots: Any) -> Any:
        jnp = _jnp()
        m, n = lu.shape[-2:]
        k = min(m, n)
        results = []
        if params["unpack_pivots"]:
            permutation = _lax_linalg().lu_pivots_to_permutation(pivots - 1, m)
            results.append(jnp.swapaxes(jnp.eye(m, dtype=lu.dtype)[permutation], -1, -2))
        if params["unpack_data"]:
            results.append(jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype))
            results.append(jnp.triu(lu[..., :k, :]))
        return tuple(results)

    return f


@rule("matrix_exp")
def _matrix_exp(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        import jax.scipy.linalg

        return jax.scipy.linalg.expm(a)

    return f


@rule("geqrf")
def _geqrf(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        from jax._src.lax.linalg import geqrf  # no public name; it is jax.lax.linalg.qr's first half

        return tuple(geqrf(a))

    return f


@rule("ormqr")
def _ormqr(params: dict[str, Any]) -> Callable[..., Any]:
    return lambda a, tau, c: _lax_linalg().ormqr(a, tau, c, left=params["left"], transpose=params["transpose"])


@rule("qr")
def _qr(params: dict[str, Any]) -> Callable[..., Any]:
    def f(a: Any) -> Any:
        mode = params["mode"]
        if mode == "r":
            return (_jnp().linalg.qr(a, mode="r"),)
        return tuple(_jnp().linalg.qr(a, mode=mode))

    return f


@rule("pinv")
def _pinv(params: dict[str, Any]) -> Callable[..., Any]:
    """torch's cut-off: singular values above ``max(atol, rtol * s_max)``;
    ``rtol`` defaults to ``eps * max(m, n)`` when neither is given, to 0
    when only ``atol`` is."""

    def f(a: Any, *tolerances: Any) -> Any:
        jnp = _jnp()
        given = list(tolerances)
        atol = given.pop(0) if params["has_atol"] else None
        rtol = given.pop(0) if params["has_rtol"] else None
        m, n = a.shape[-2:]
        real = jnp.finfo(a.dtype).dtype
        if rtol is None:
            rtol = jnp.asarray(0.0 if atol is not None else jnp.finfo(real).eps * max(m, n), real)
        if atol is None:
            atol = jnp.asarray(0.0, real)
        if params["hermitian"]:
            values, vectors = jnp.linalg.eigh(a, UPLO="L", symmetrize_input=False)
            magnitude = jnp.abs(values)
            largest = jnp.max(magnitude, axis=-1, initial=0.0)
            cutoff = jnp.maximum(atol, rtol * largest)[..., None]
            inverse = jnp.where(magnitude > cutoff, 1.0 / jnp.where(magnitude > cutoff, values, 1.0), 0.0)
            return (vectors * inverse[..., None, :].astype(a.dtype)) @ jnp.conj(jnp.swapaxes(vectors, -1, -2))
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
        largest = jnp.max(s, axis=-1, initial=0.0)
        cutoff = jnp.maximum(atol, rtol * largest)[..., None]
        inverse = jnp.where(s > cutoff, 1.0 / jnp.where(s > cutoff, s, 1.0), 0.0)
        return jnp.conj(jnp.swapaxes(vh, -1, -2)) @ (inverse[..., :, None].astype(a.dtype) * jnp.conj(jnp.swapaxes(u, -1, -2)))

    return f


# fft: normalization 0 = none, 1 = 1/sqrt(n), 2 = 1/n on the transform
# asked for; jnp's ``norm`` names where 1/n goes.
_FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}


@rule("fft_r2c")
def _fft_r2c(params: dict[str, Any]) -> Callable[..., Any]:
    def f(x: Any) -> Any:
        jnp = _jnp()
        norm = _FORWARD_NORM[params["normalization"]]
        if params["onesided"]:
            return jnp.fft.rfftn(x, axes=params["dim"], norm=norm)
        return jnp.fft.fftn(x, axes=params["dim"], norm=norm)

    return f


@rule("fft_c2c")
def _fft_c2c(params: dict[str, Any]) -> Callable[..., Any]:
    def f(x: Any) -> Any:
        jnp = _jnp()
        if params["forward"]:
            return jnp.fft.fftn(x, axes=params["dim"], norm=_FORWARD_NORM[params["normalization"]])
        return jnp.fft.ifftn(x, axes=params["dim"], norm=_INVERSE_NORM[params["normalization"]])

    return f


@rule("fft_c2r")
def _fft_c2r(params: dict[str, Any]) -> Callable[..., Any]:
    def f(x: Any) -> Any:
        dim = params["dim"]
        sizes = [x.shape[d] for d in dim[:-1]] + [params["last_dim_size"]]
        return _jnp().fft.irfftn(x, s=sizes, axes=dim, norm=_INVERSE_NORM[params["normalization"]])

    return f


# --- aten ops -> rules -------------------------------------------------------------------


def _one(name: str, params: dict[str, Any], *tensors: torch.Tensor) -> torch.Tensor:
    return call(name, params, *tensors)[0]


def cholesky(a: torch.Tensor, upper: bool = False) -> torch.Tensor:
    return _one("cholesky", {"upper": upper, "info": False}, a)


def linalg_cholesky(a: torch.Tensor, *, upper: bool = False) -> torch.Tensor:
    return _one("cholesky", {"upper": upper, "info": False}, a)


def linalg_cholesky_ex(a: torch.Tensor, *, upper: bool = False, check_errors: bool = False) -> Any:
    return call("cholesky", {"upper": upper, "info": True}, a)


def linalg_svd(a: torch.Tensor, full_matrices: bool = False, compute_uv: bool = True, *, driver: str | None = None) -> Any:
    if not compute_uv:
        (s,) = call("svd", {"compute_uv": False, "full_matrices": False}, a)
        return _empty(a), s, _empty(a)
    return call("svd", {"compute_uv": True, "full_matrices": full_matrices}, a)


def linalg_det(a: torch.Tensor) -> torch.Tensor:
    return _one("det", {}, a)


def linalg_slogdet(a: torch.Tensor) -> Any:
    return call("slogdet", {}, a)


def conj_physical(x: torch.Tensor) -> torch.Tensor:
    if not x.is_complex():
        return x.clone()
    return _one("conj", {}, x)


def cholesky_inverse(factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    return _one("cholesky_solve", {"upper": upper}, factor)


def cholesky_solve(b: torch.Tensor, factor: torch.Tensor, upper: bool = False) -> torch.Tensor:
    return _one("cholesky_solve", {"upper": upper}, factor, b)


def complex_abs(x: torch.Tensor) -> Any:
    """torch-mlir lowers ``abs`` of a complex tensor as ``abs`` of its real
    part (a silently wrong modulus): the modulus is JAX's."""
    if not x.is_complex():
        return NotImplemented
    return _one("abs", {}, x)


def view_as_real(x: torch.Tensor) -> torch.Tensor:
    """A copy where eager has a view: in the functional graph no write
    goes through it (``x.real`` of an fft's result, as FNet has it)."""
    return _one("view_as_real", {}, x)


def linalg_eig(a: torch.Tensor) -> Any:
    return call("eig", {}, a)


def linalg_eigh(a: torch.Tensor, uplo: str = "L", compute_v: bool = True) -> Any:
    results = call("eigh", {"uplo": uplo, "compute_v": compute_v}, a)
    return results if compute_v else (results[0], _empty(a))


def linalg_householder_product(a: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    return _one("householder_product", {}, a, tau)


def linalg_inv(a: torch.Tensor) -> torch.Tensor:
    return _one("inv", {"info": False}, a)


def linalg_inv_ex(a: torch.Tensor, *, check_errors: bool = False) -> Any:
    return call("inv", {"info": True}, a)


def linalg_lu(a: torch.Tensor, *, pivot: bool = True) -> Any:
    if not pivot:
        return NotImplemented
    return call("lu", {}, a)


def linalg_lu_factor_ex(a: torch.Tensor, *, pivot: bool = True, check_errors: bool = False) -> Any:
    if not pivot:
        return NotImplemented
    return call("lu_factor", {}, a)


def linalg_lu_factor(a: torch.Tensor, *, pivot: bool = True) -> Any:
    if not pivot:
        return NotImplemented
    return call("lu_factor", {}, a)[:2]


def linalg_lu_solve(lu: torch.Tensor, pivots: torch.Tensor, b: torch.Tensor, *, left: bool = True, adjoint: bool = False) -> torch.Tensor:
    return _one("lu_solve", {"left": left, "adjoint": adjoint}, lu, pivots, b)


def linalg_solve_ex(a: torch.Tensor, b: torch.Tensor, *, left: bool = True, check_errors: bool = False) -> Any:
    # torch's rule (linalg_solve_is_vector_rhs): B is a batch of vectors when
    # it is 1-d or has A's shape without the last dim.
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and tuple(b.shape) == tuple(a.shape[:-1]))
    return call("solve", {"left": left, "vector": vector}, a, b)


def linalg_solve(a: torch.Tensor, b: torch.Tensor, *, left: bool = True) -> torch.Tensor:
    result: torch.Tensor = linalg_solve_ex(a, b, left=left)[0]
    return result


def linalg_solve_triangular(a: torch.Tensor, b: torch.Tensor, *, upper: bool, left: bool = True, unitriangular: bool = False) -> torch.Tensor:
    return _one("solve_triangular", {"upper": upper, "left": left, "unitriangular": unitriangular}, a, b)


def triangular_solve(b: torch.Tensor, a: torch.Tensor, upper: bool = True, transpose: bool = False, unitriangular: bool = False) -> Any:
    params = {"upper": upper, "left": True, "unitriangular": unitriangular, "transpose": transpose}
    solution = _one("solve_triangular", params, a, b)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])  # type: ignore[no-untyped-call]
    return solution, a.expand(*batch, *a.shape[-2:]).clone()


def lu_unpack(lu: torch.Tensor, pivots: torch.Tensor, unpack_data: bool = True, unpack_pivots: bool = True) -> Any:
    if not (unpack_data or unpack_pivots):
        return _empty(lu), _empty(lu), _empty(lu)
    results = list(call("lu_unpack", {"unpack_data": unpack_data, "unpack_pivots": unpack_pivots}, lu, pivots))
    p = results.pop(0) if unpack_pivots else _empty(lu)
    lower, upper = (results[0], results[1]) if unpack_data else (_empty(lu), _empty(lu))
    return p, lower, upper


def linalg_matrix_exp(a: torch.Tensor) -> torch.Tensor:
    return _one("matrix_exp", {}, a)


def geqrf(a: torch.Tensor) -> Any:
    return call("geqrf", {}, a)


def ormqr(a: torch.Tensor, tau: torch.Tensor, c: torch.Tensor, left: bool = True, transpose: bool = False) -> torch.Tensor:
    return _one("ormqr", {"left": left, "transpose": transpose}, a, tau, c)


def linalg_qr(a: torch.Tensor, mode: str = "reduced") -> Any:
    if mode == "r":
        (r,) = call("qr", {"mode": "r"}, a)
        return _empty(a), r
    return call("qr", {"mode": mode}, a)


def linalg_pinv(
    a: torch.Tensor, *, atol: torch.Tensor | None = None, rtol: torch.Tensor | None = None, hermitian: bool = False
) -> torch.Tensor:
    tolerances = [t for t in (atol, rtol) if t is not None]
    params = {"has_atol": atol is not None, "has_rtol": rtol is not None, "hermitian": hermitian}
    return _one("pinv", params, a, *tolerances)


def fft_r2c(x: torch.Tensor, dim: list[int], normalization: int, onesided: bool) -> torch.Tensor:
    return _one("fft_r2c", {"dim": [d % x.dim() for d in dim], "normalization": normalization, "onesided": onesided}, x)


def fft_c2c(x: torch.Tensor, dim: list[int], normalization: int, forward: bool) -> torch.Tensor:
    return _one("fft_c2c", {"dim": [d % x.dim() for d in dim], "normalization": normalization, "forward": forward}, x)


def fft_c2r(x: torch.Tensor, dim: list[int], normalization: int, last_dim_size: int) -> torch.Tensor:
    params = {"dim": [d % x.dim() for d in dim], "normalization": normalization, "last_dim_size": int(last_dim_size)}
    return _one("fft_c2r", params, x)


def prims_fft_r2c(x: torch.Tensor, *, dim: list[int], onesided: bool) -> torch.Tensor:
    return fft_r2c(x, dim, 0, onesided)


def prims_fft_c2c(x: torch.Tensor, *, dim: list[int], forward: bool) -> torch.Tensor:
    return fft_c2c(x, dim, 0, forward)


def prims_fft_c2r(x: torch.Tensor, *, dim: list[int], last_dim_size: int) -> torch.Tensor:
    return fft_c2r(x, dim, 0, last_dim_size)


@rule("fft")
def _fft(params: dict[str, Any]) -> Callable[..., Any]:
    """``jnp.fft.<function>``, whose signature is numpy's and so torch's."""

    def f(x: Any) -> Any:
        jnp = _jnp()
        name = params["function"]
        if name in _FFT_HERMITIAN_ND:
            # numpy's definition of hfft/ihfft, over n dims: the real
            # transform of the conjugate with the normalization swapped.
            norm = _SWAPPED_NORM[params["norm"] or "backward"]
            if name.startswith("i"):
                return jnp.conj(jnp.fft.rfftn(x, s=params["size"], axes=params["dim"], norm=norm))
            return jnp.fft.irfftn(jnp.conj(x), s=params["size"], axes=params["dim"], norm=norm)
        function = getattr(jnp.fft, name)
        if params["function"] in _FFT_SHIFTS:
            return function(x, axes=params["dim"])
        if params["function"] in _FFT_1D:
            return function(x, n=params["size"], axis=params["dim"], norm=params["norm"])
        return function(x, s=params["size"], axes=params["dim"], norm=params["norm"])

    return f


_FFT_1D = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
_FFT_ND = ("fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn")
_FFT_SHIFTS = ("fftshift", "ifftshift")
#: torch fft functions jnp.fft lacks, written with rfftn/irfftn.
_FFT_HERMITIAN_ND = ("hfft2", "ihfft2", "hfftn", "ihfftn")
_SWAPPED_NORM = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def _fft_entry(function: str) -> Callable[..., Any]:
    def decomposition(x: torch.Tensor, size: Any = None, dim: Any = None, norm: str | None = None) -> torch.Tensor:
        if not (x.is_floating_point() or x.is_complex()):
            x = x.to(torch.get_default_dtype())  # torch promotes integers as its ops do
        if function in _FFT_SHIFTS:  # (self, dim)
            dims = [size] if isinstance(size, int) else (list(size) if size is not None else None)
            return _one("fft", {"function": function, "dim": dims}, x)
        if function in _FFT_1D:
            params = {"function": function, "size": size, "dim": -1 if dim is None else dim, "norm": norm}
        else:
            if dim is None and function.endswith("2"):
                dim = [-2, -1]
            params = {
                "function": function,
                "size": None if size is None else [int(n) for n in size],
                "dim": None if dim is None else list(dim),
                "norm": norm,
            }
        return _one("fft", params, x)

    return decomposition


def linalg_fft_decompositions() -> dict[Any, Callable[..., Any]]:
    """The entries :mod:`hloalias.frontend.decompositions` adds."""
    table: dict[Any, Callable[..., Any]] = {
        aten.cholesky.default: cholesky,
        aten.linalg_cholesky_ex.default: linalg_cholesky_ex,
        aten._linalg_svd.default: linalg_svd,
        aten.linalg_det.default: linalg_det,
        aten.linalg_eig.default: linalg_eig,
        aten._linalg_eigh.default: linalg_eigh,
        aten.linalg_householder_product.default: linalg_householder_product,
        aten.linalg_inv_ex.default: linalg_inv_ex,
        aten.linalg_lu.default: linalg_lu,
        aten.linalg_lu_factor_ex.default: linalg_lu_factor_ex,
        aten.linalg_lu_solve.default: linalg_lu_solve,
        aten._linalg_solve_ex.default: linalg_solve_ex,
        aten.linalg_solve_triangular.default: linalg_solve_triangular,
        aten.triangular_solve.default: triangular_solve,
        aten.lu_unpack.default: lu_unpack,
        aten.linalg_matrix_exp.default: linalg_matrix_exp,
        aten.geqrf.default: geqrf,
        aten.ormqr.default: ormqr,
        aten.linalg_qr.default: linalg_qr,
        aten.linalg_pinv.atol_rtol_tensor: linalg_pinv,
        aten.linalg_cholesky.default: linalg_cholesky,
        aten.linalg_slogdet.default: linalg_slogdet,
        aten.linalg_inv.default: linalg_inv,
        aten.linalg_lu_factor.default: linalg_lu_factor,
        aten.linalg_solve.default: linalg_solve,
        aten._fft_r2c.default: fft_r2c,
        aten._fft_c2c.default: fft_c2c,
        aten._fft_c2r.default: fft_c2r,
    }
    prims = torch.ops.prims
    table[aten.view_as_real.default] = view_as_real
    table[aten.abs.default] = complex_abs
    table[aten.cholesky_inverse.default] = cholesky_inverse
    table[aten.cholesky_solve.default] = cholesky_solve
    table[prims.conj_physical.default] = conj_physical
    table[aten.conj_physical.default] = conj_physical
    table[prims.fft_r2c.default] = prims_fft_r2c
    table[prims.fft_c2c.default] = prims_fft_c2c
    table[prims.fft_c2r.default] = prims_fft_c2r
    for function in _FFT_1D + _FFT_ND + _FFT_SHIFTS + _FFT_HERMITIAN_ND:
        table[getattr(aten, f"fft_{function}").default] = _fft_entry(function)
    return table
