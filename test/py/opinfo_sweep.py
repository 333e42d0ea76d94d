"""torch's OpInfo database as a conformance suite: each op's first sample,
compiled with :func:`hloalias.compile` and compared with eager PyTorch.

One *case* is one entry of ``op_db`` (``name`` or ``name.variant``) with
the first sample OpInfo generates for CPU and the dtype asked for.  The
sample's tensors are the program's inputs; its other arguments (ints,
dims, dtypes) are baked into the program, as ``torch.export`` specializes
on them.  :func:`run_case` classifies what happens:

- ``pass``: compiled, and every output has eager's dtype, shape and values
  (``torch.testing.assert_close``'s float32 tolerances widened to
  :data:`RTOL`/:data:`ATOL`: XLA's transcendental approximations are not
  libm's; NaN equals NaN), and the inputs are as eager leaves them;
- ``refused``: compile raised an :class:`hloalias.HloaliasError` (the
  reason class is read from its message, see :func:`reason_class`);
- ``wrong``: compiled but the outputs or inputs differ from eager's;
- ``error``: anything else raised (a raw torch/XLA error reaching the
  user is a defect, as a wrong value is);
- decompositions whose results are unique only in part (singular and
  eigen vectors: signs, phases) are compared by those parts, per op
  (:data:`NON_UNIQUE`);
- ``excluded``: values differ from eager's for an op whose values cannot
  match, with the reason in :data:`EXCLUDED` (random ops: both follow
  OpInfo's torch seed, but XLA's THREE_FRY draws other bits than eager's
  generator; ops with unspecified values):
  compared by dtype and shape only (an excluded op whose sample is
  deterministic, as dropout with ``training=False``, must match and is a
  ``pass``);
- ``untestable``: the op has no sample for the dtype (OpInfo lists none,
  or the sample's eager call itself raises).

A process crash is no outcome: the caller sees it (the sweep runs in
process, so a crash kills the test run, which is the failure it is)."""

from __future__ import annotations

import dataclasses
import re
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

import hloalias

RTOL = 1e-4
ATOL = 1e-5

#: Ops whose values are random: compared by dtype and shape only.
EXCLUDED: dict[str, str] = {
    name: "random: values cannot match eager's generator"
    for name in (
        "bernoulli",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "multinomial",
        "normal",
        "normal.number_mean",
        "normal.in_place",
        "uniform",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.feature_alpha_dropout.without_train",
        "nn.functional.rrelu",
        "randn_like",
        "rand_like",
        "randint_like",
        "randint",
        "randn",
        "rand",
        "empty",
        "empty_like",
        "empty_strided",
        "empty_permuted",
        "new_empty",
        "new_empty_strided",
    )
}
#: Ops whose values are unspecified (uninitialized memory).
UNSPECIFIED = frozenset(("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"))
for _name in UNSPECIFIED:
    EXCLUDED[_name] = "uninitialized memory: values are unspecified"
#: Ops whose pooling regions are drawn at random (test_op_coverage.py
#: compares them with eager given the same samples).
for _name in ("nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d"):
    EXCLUDED[_name] = "random pooling regions: drawn by XLA's THREE_FRY, not eager's generator"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one case did."""

    name: str
    family: str
    status: str  # pass | refused | wrong | error | excluded | untestable
    reason: str  # reason class (refusals, errors), empty otherwise
    detail: str
    seconds: float


def case_name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def family(name: str) -> str:
    """The op's family, for the report: ``linalg``, ``fft``, ``special``,
    ``nn.functional``, ``sparse``, ``masked``, ``signal``, ... or
    ``torch`` for the top-level namespace."""
    for prefix in ("nn.functional", "linalg", "fft", "special", "masked", "signal", "sparse", "_refs"):
        if name.startswith(prefix + "."):
            return prefix
    if name.startswith("_"):
        return "private"
    return "torch"


def all_ops() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def first_sample(op: Any, dtype: torch.dtype) -> Any | None:
    """OpInfo's first CPU sample of ``op`` for ``dtype`` (None if none)."""
    if dtype not in op.supported_dtypes("cpu"):
        return None
    torch.manual_seed(0)
    try:
        samples = op.sample_inputs("cpu", dtype, requires_grad=False)
        return next(iter(samples), None)
    except Exception:
        return None


def _clone(value: Any) -> Any:
    return pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, value)


class _Case:
    """One sample as a function of its tensors."""

    def __init__(self, op: Any, sample: Any) -> None:
        self.op = op
        structure = (sample.input, tuple(sample.args), dict(sample.kwargs))
        self.leaves, self.spec = pytree.tree_flatten(structure)
        self.tensor_positions = [i for i, leaf in enumerate(self.leaves) if isinstance(leaf, torch.Tensor)]

    def tensors(self) -> list[torch.Tensor]:
        return [self.leaves[i].detach().clone() for i in self.tensor_positions]

    def __call__(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self.leaves)
        for position, tensor in zip(self.tensor_positions, tensors):
            leaves[position] = tensor
        first, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.op.op(first, *args, **kwargs)


_REFUSAL_PATTERNS = (
    (re.compile(r"torch-mlir cannot lower (\S+)"), "lowering"),
    (re.compile(r"returns a tensor's as_strided view"), "as-strided-view"),
    (re.compile(r"lowering to the \S+ failed"), "lowering-failed"),
    (re.compile(r"is a torch.sparse"), "sparse"),
    (re.compile(r"of kind TOKEN"), "effect-token"),
    (re.compile(r"data.dependent|value as a Python number|dynamic dimension|dynamic shape", re.I), "dynamic-shape"),
    (re.compile(r"reads a traced tensor's value on the host"), "host-read"),
    (re.compile(r"complex", re.I), "complex"),
    (re.compile(r"XLA compile failed"), "xla-compile"),
    (re.compile(r"torch.export failed"), "export"),
    (re.compile(r"decompositions failed"), "decomposition"),
    (re.compile(r"not a tensor"), "non-tensor"),
    (re.compile(r"FX importer failed"), "fx-importer"),
)


def reason_class(error: BaseException) -> str:
    """A short, stable class of a refusal: ``lowering:aten.X`` for an op
    torch-mlir cannot lower (the op named), else the stage that refused."""
    text = str(error)
    for pattern, label in _REFUSAL_PATTERNS:
        match = pattern.search(text)
        if match:
            if label == "lowering":
                return f"lowering:{match.group(1)}"
            return label
    return type(error).__name__


def _compare(expected: Any, actual: Any, what: str) -> str | None:
    """None when ``actual`` matches ``expected`` (dtype, shape, values), else
    what differs."""
    e_leaves, e_spec = pytree.tree_flatten(expected)
    a_leaves, a_spec = pytree.tree_flatten(actual)
    if len(e_leaves) != len(a_leaves):
        return f"{what}: {len(a_leaves)} leaves, eager has {len(e_leaves)}"
    for index, (e, a) in enumerate(zip(e_leaves, a_leaves)):
        label = f"{what}[{index}]"
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"{label}: {type(a).__name__}, eager has a tensor"
            if a.dtype != e.dtype:
                return f"{label}: dtype {a.dtype}, eager {e.dtype}"
            if tuple(a.shape) != tuple(e.shape):
                return f"{label}: shape {tuple(a.shape)}, eager {tuple(e.shape)}"
            try:
                torch.testing.assert_close(
                    a.detach().cpu(), e.detach(), rtol=RTOL, atol=ATOL, equal_nan=True, check_stride=False
                )
            except AssertionError as error:
                return f"{label}: {str(error).splitlines()[0]} | " + " ".join(str(error).split("\n")[1:4])
        elif isinstance(e, (int, float, bool)) and isinstance(a, (int, float, bool)):
            if e != a and not (e != e and a != a):
                return f"{label}: {a!r}, eager {e!r}"
    return None


def _close(expected: torch.Tensor, actual: torch.Tensor, label: str) -> str | None:
    try:
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True, check_stride=False)
    except AssertionError as error:
        return f"{label}: {str(error).splitlines()[0]} | " + " ".join(str(error).split("\n")[1:4])
    return None


def _orthonormal_columns(q: torch.Tensor, label: str) -> str | None:
    gram = q.mH @ q
    return _close(torch.eye(q.shape[-1], dtype=q.dtype).expand_as(gram), gram, f"{label}^H {label} = I")


def _singular_vectors(transposed_v: bool) -> Any:
    """SVD-like results ``(U, S, V or Vh)``: the singular values are
    unique, the singular vectors are not (a sign per pair of columns for
    real matrices, a phase for complex ones, any basis of a repeated
    value's space): compared are S, the reconstruction ``U_k diag(S) Vh_k``
    from the first ``k = len(S)`` columns (unique), and whether U's and
    V's columns are orthonormal."""

    def compare(expected: Any, actual: Any) -> str | None:
        problem = _shapes(expected, actual)
        if problem:
            return problem
        (eu, es, ev), (au, as_, av) = expected, actual
        problem = _close(es, as_, "S")
        if problem or eu.numel() == 0:
            return problem

        def reconstruct(u: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            vh = v.mH if transposed_v else v
            k = s.shape[-1]
            return (u[..., :, :k] * s[..., None, :].to(u.dtype)) @ vh[..., :k, :]

        return (
            _close(reconstruct(eu, es, ev), reconstruct(au, as_, av), "U diag(S) Vh")
            or _orthonormal_columns(au, "U")
            or _orthonormal_columns(av if transposed_v else av.mH, "V")
        )

    return compare


def _hermitian_eigenvectors(expected: Any, actual: Any) -> str | None:
    """``eigh``: eigenvalues are unique, eigenvectors are not (sign or
    phase, any basis of a repeated eigenvalue's space): compared are the
    eigenvalues, ``V diag(w) V^H`` and whether V is unitary."""
    problem = _shapes(expected, actual)
    if problem:
        return problem
    (ew, ev), (aw, av) = expected, actual
    return (
        _close(ew, aw, "eigenvalues")
        or _close((ev * ew[..., None, :].to(ev.dtype)) @ ev.mH, (av * aw[..., None, :].to(av.dtype)) @ av.mH, "V diag(w) V^H")
        or _orthonormal_columns(av, "V")
    )


def _eigenvectors_up_to_phase(expected: Any, actual: Any) -> str | None:
    """``eig``: each eigenvector is unique up to a complex phase (LAPACK
    normalizes it to unit norm): compared are the eigenvalues and the
    eigenvectors' moduli, as OpInfo's own gauge for ``linalg.eig``
    (``abs`` of the eigenvectors) does."""
    problem = _shapes(expected, actual)
    if problem:
        return problem
    (ew, ev), (aw, av) = expected, actual
    return _close(ew, aw, "eigenvalues") or _close(ev.abs(), av.abs(), "|eigenvectors|")


#: Ops whose results are unique only in part (decompositions): compared
#: by their unique parts, see each comparison's docstring.  ``svd_lowrank``
#: and ``pca_lowrank`` also draw a random projection (eager's generator is
#: not XLA's): their samples' ``q`` covers the matrix's rank, so the
#: reconstruction is the matrix's either way.
NON_UNIQUE: dict[str, Any] = {
    "linalg.svd": _singular_vectors(transposed_v=False),
    "svd": _singular_vectors(transposed_v=True),
    "svd_lowrank": _singular_vectors(transposed_v=True),
    "pca_lowrank": _singular_vectors(transposed_v=True),
    "linalg.eigh": _hermitian_eigenvectors,
    "linalg.eig": _eigenvectors_up_to_phase,
}


def _shapes(expected: Any, actual: Any) -> str | None:
    e_leaves = [x for x in pytree.tree_leaves(expected) if isinstance(x, torch.Tensor)]
    a_leaves = [x for x in pytree.tree_leaves(actual) if isinstance(x, torch.Tensor)]
    if [(x.dtype, tuple(x.shape)) for x in e_leaves] != [(x.dtype, tuple(x.shape)) for x in a_leaves]:
        return "dtypes or shapes differ from eager's"
    return None


def run_case(op: Any, dtype: torch.dtype = torch.float32) -> Outcome:
    name = case_name(op)
    start = time.perf_counter()

    def outcome(status: str, reason: str = "", detail: str = "") -> Outcome:
        return Outcome(name, family(name), status, reason, detail[:500], time.perf_counter() - start)

    sample = first_sample(op, dtype)
    if sample is None:
        return outcome("untestable", "no-sample", f"OpInfo has no CPU {dtype} sample")
    case = _Case(op, sample)
    eager_inputs = case.tensors()
    try:
        torch.manual_seed(0)
        expected = case(*eager_inputs)
    except Exception as error:
        return outcome("untestable", "eager-fails", f"{type(error).__name__}: {error}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            executable = hloalias.compile(case, case.tensors())
        except hloalias.HloaliasError as error:
            return outcome("refused", reason_class(error), str(error).splitlines()[0] if str(error) else "")
        except Exception as error:  # a raw upstream error reaching the user
            return outcome("error", type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        inputs = case.tensors()
        try:
            actual = executable(*inputs)
        except Exception as error:
            return outcome("error", "execution:" + type(error).__name__, str(error).splitlines()[0] if str(error) else "")
    if name in NON_UNIQUE:
        problem = NON_UNIQUE[name](expected, actual) or _compare(eager_inputs, inputs, "input")
    else:
        problem = _compare(expected, actual, "output") or _compare(eager_inputs, inputs, "input")
    if problem is not None and name in EXCLUDED:
        # A random op (OpInfo seeds eager's generator, not XLA's) or one
        # with unspecified values: dtypes and shapes only.
        problem = _shapes(expected, actual)
        return outcome("wrong" if problem else "excluded", "", problem or EXCLUDED[name])
    if problem is not None:
        return outcome("wrong", "", problem)
    return outcome("pass")


def sweep(dtype: torch.dtype = torch.float32, names: set[str] | None = None) -> Iterator[Outcome]:
    for op in all_ops():
        if names is not None and case_name(op) not in names:
            continue
        yield run_case(op, dtype)
