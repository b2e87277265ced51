"""Optimised strategy coefficients for a given number of steps and participation pattern.

The loss of a strategy is its squared error at a fixed privacy level:

    loss(C) = error(A C⁻¹) · sens(C)²,

with ``error`` the **total** squared error ``‖A C⁻¹‖_F²`` (``loss="total"``; equivalently the
mean, RMSE²·T) or the **max** per-step squared error (``loss="max"``), and ``sens`` the
sensitivity under the pattern (single participation; or ``k`` participations ``min_sep``
apart). Both are invariant to scaling ``C``, so ``c_0 = 1`` throughout.

* :func:`optimize_banded` — banded Toeplitz ``C`` with b bands (Choquette-Choo et al. 2023;
  McKenna 2024): L-BFGS-B over ``c_1..c_{b−1} ∈ [0, 1]`` with the exact gradient (the error
  is a ratio of power series, ``h = a / c``; ``∂E/∂c_m = −2 Σ_j w_j h_j u_{j−m}`` with
  ``u = h / c``), O(T·b) per evaluation, started from the coefficients of ``(1 − x)^{−1/2}``
  (the Toeplitz square root of the prefix-sum matrix).
* :func:`optimize_blt` — BLT with d buffers (Dvijotham et al. 2024): L-BFGS-B over
  ``logit θ`` and ``log ω``, O(T·d) per evaluation through the rational form of ``1/c``.
* :func:`optimize_dense` — the optimal dense ``C`` for single participation: minimise
  ``tr(AᵀA X⁻¹)`` subject to ``diag(X) = 1`` by the fixed point of its dual
  (``X = V^{−1/2}(V^{1/2} AᵀA V^{1/2})^{1/2} V^{−1/2}``, ``v ← v · diag(X)²``; Denisov et al.
  2022, after Yuan et al. 2016), then ``C`` from a reversed Cholesky factor (lower
  triangular, so the noise is causal). O(T³) per iteration: small T only.

Toeplitz strategies take a Toeplitz workload (first column, default prefix sums); the dense
optimiser takes any workload matrix.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.signal
import scipy.special
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_int, fail
from renyi.correlated.strategies import BandedToeplitzStrategy, BltStrategy, DenseStrategy
from renyi.correlated.workload import prefix_coefs, prefix_workload

__all__ = ["optimize_banded", "optimize_blt", "optimize_dense", "toeplitz_loss"]

FloatArray = NDArray[np.float64]
Loss = Literal["total", "max"]


def _weights(steps: int, loss: str) -> FloatArray:
    if loss == "total":  # ‖Toeplitz(h)‖_F² = Σ_j (T − j) h_j²
        return np.arange(steps, 0, -1, dtype=np.float64)
    if loss == "max":  # the last row carries every h_j
        return np.ones(steps)
    raise fail("loss", loss, "'total' or 'max'")


def _workload_coefs(steps: int, workload: ArrayLike | None) -> FloatArray:
    if workload is None:
        return prefix_coefs(steps)
    a = np.asarray(workload, dtype=np.float64).reshape(-1)
    if a.size < steps or not np.all(np.isfinite(a)):
        raise fail("workload", "array", f"the first column of a Toeplitz workload, >= {steps}")
    return a[:steps]


def _shift_sum(c: FloatArray, steps: int, min_sep: int, k: int) -> FloatArray:
    """``v = Σ_{j<k} shift(c, j·min_sep)`` truncated to ``steps`` (the worst pattern's column)."""
    v = np.zeros(steps)
    for j in range(k):
        s = j * min_sep
        if s >= steps:
            break
        n = min(c.size, steps - s)
        v[s : s + n] += c[:n]
    return v


def _sens_sq_and_grad(c: FloatArray, steps: int, min_sep: int, k: int) -> tuple[float, FloatArray]:
    v = _shift_sum(c, steps, min_sep, k)
    grad = np.zeros(c.size)
    for j in range(k):
        s = j * min_sep
        if s >= steps:
            break
        n = min(c.size, steps - s)
        grad[:n] += 2.0 * v[s : s + n]
    return float(v @ v), grad


def toeplitz_loss(
    coefs: ArrayLike,
    steps: int,
    *,
    loss: Loss = "total",
    min_sep: int = 1,
    max_participations: int = 1,
    workload: ArrayLike | None = None,
) -> float:
    """``error(A C⁻¹) · sens(C)²`` of the Toeplitz ``C`` with first column ``coefs``.

    The sensitivity is that of the pattern 0, b, 2b, … (exact for non-negative,
    non-increasing coefficients; see :func:`~renyi.correlated.sensitivity.toeplitz_sensitivity`).
    """
    c = np.asarray(coefs, dtype=np.float64).reshape(-1)
    t = check_int("steps", steps, 1)
    value, _ = _banded_loss(
        c,
        t,
        _weights(t, loss),
        _workload_coefs(t, workload),
        min_sep,
        max_participations,
        want_grad=False,
    )
    return value


def _banded_loss(
    c: FloatArray,
    steps: int,
    w: FloatArray,
    a: FloatArray,
    min_sep: int,
    k: int,
    *,
    want_grad: bool = True,
) -> tuple[float, FloatArray]:
    h = scipy.signal.lfilter([1.0], c, a)
    err = float(np.sum(w * h * h))
    sens, dsens = _sens_sq_and_grad(c, steps, min_sep, k)
    if not want_grad:
        return err * sens, np.zeros(0)
    u = scipy.signal.lfilter([1.0], c, h)
    wh = w * h
    derr = np.array([-2.0 * float(wh[m:] @ u[: steps - m]) for m in range(c.size)])
    return err * sens, derr * sens + err * dsens


def optimize_banded(
    steps: int,
    bands: int,
    *,
    loss: Loss = "total",
    min_sep: int = 1,
    max_participations: int = 1,
    workload: ArrayLike | None = None,
    maxiter: int = 500,
) -> BandedToeplitzStrategy:
    """The banded Toeplitz strategy with ``bands`` bands minimising ``loss`` (see module).

    With ``bands ≤ min_sep`` the columns of any pattern are disjoint and the loss is the
    same for every ``max_participations`` (so the default, single participation, is also the
    optimum for the amplified cyclic-Poisson pattern of Choquette-Choo et al. 2023).

    >>> s = optimize_banded(64, 4)
    >>> s.bands, s.coefficients[0]
    (4, 1.0)
    """
    t = check_int("steps", steps, 1)
    b = min(check_int("bands", bands, 1), t)
    sep = check_int("min_sep", min_sep, 1)
    k = check_int("max_participations", max_participations, 1)
    w = _weights(t, loss)
    a = _workload_coefs(t, workload)
    if b == 1:
        return BandedToeplitzStrategy((1.0,))
    j = np.arange(b)
    init = np.exp(
        scipy.special.gammaln(2 * j + 1) - 2 * scipy.special.gammaln(j + 1) - 2 * j * math.log(2)
    )

    def fun(x: FloatArray) -> tuple[float, FloatArray]:
        c = np.concatenate([[1.0], x])
        value, grad = _banded_loss(c, t, w, a, sep, k)
        if not math.isfinite(value):
            return 1e300, np.zeros_like(x)
        return value, grad[1:]

    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        res = scipy.optimize.minimize(
            fun,
            init[1:],
            jac=True,
            method="L-BFGS-B",
            bounds=[(0.0, 1.0)] * (b - 1),
            options={"maxiter": maxiter},
        )
        best = res.x if fun(res.x)[0] <= fun(init[1:])[0] else init[1:]
    return BandedToeplitzStrategy((1.0, *(float(x) for x in best)))


def _blt_params(x: FloatArray) -> tuple[FloatArray, FloatArray]:
    d = x.size // 2
    return scipy.special.expit(x[:d]), np.exp(x[d:])


def optimize_blt(
    steps: int,
    buffers: int = 3,
    *,
    loss: Loss = "total",
    min_sep: int = 1,
    max_participations: int = 1,
    workload: ArrayLike | None = None,
    maxiter: int = 300,
) -> BltStrategy:
    """The BLT strategy with ``buffers`` buffers minimising ``loss`` (see module).

    >>> s = optimize_blt(64, 2)
    >>> s.buffers
    2
    """
    t = check_int("steps", steps, 1)
    d = check_int("buffers", buffers, 1)
    sep = check_int("min_sep", min_sep, 1)
    k = check_int("max_participations", max_participations, 1)
    w = _weights(t, loss)
    a = _workload_coefs(t, workload)

    def fun(x: FloatArray) -> float:
        th, om = _blt_params(x)
        s = BltStrategy(tuple(th.clip(0.0, 1 - 1e-12)), tuple(om))
        num, den = s._filter()
        h = scipy.signal.lfilter(num, den, a)
        err = float(np.sum(w * h * h))
        c = np.maximum.accumulate(np.abs(s.coefs(t))[::-1])[::-1]
        sens, _ = _sens_sq_and_grad(c, t, sep, k)
        value = err * sens
        return math.log(value) if math.isfinite(value) and value > 0 else 1e30

    # starts: θ spread over time scales from a few steps to ~T (or to ~min_sep), small ω
    best_x, best = np.zeros(0), math.inf
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for longest, weight in ((float(t), 0.3), (float(min(sep, t)), 0.3), (float(t), 0.05)):
            scales = np.geomspace(2.0, max(4.0, longest), d)
            x0 = np.concatenate(
                [scipy.special.logit(1.0 - 1.0 / scales), np.log(np.full(d, weight / d))]
            )
            res = scipy.optimize.minimize(fun, x0, method="L-BFGS-B", options={"maxiter": maxiter})
            for x in (res.x, x0):
                value = fun(x)
                if value < best:
                    best_x, best = x, value
    th, om = _blt_params(best_x)
    return BltStrategy(tuple(float(v) for v in th.clip(0.0, 1 - 1e-12)), tuple(map(float, om)))


def optimize_dense(
    steps: int,
    *,
    workload: ArrayLike | None = None,
    iterations: int = 40,
    tol: float = 1e-7,
) -> DenseStrategy:
    """The optimal dense lower-triangular ``C`` for single participation, total squared error.

    ``workload``: a dense T × T matrix (default prefix sums). O(T³) per iteration; 40
    iterations reach the optimum's RMSE to ~1e-4 relative for T = 128 and 256 (the result
    is feasible, i.e. correctly normalised, whatever the number of iterations).
    """
    t = check_int("steps", steps, 1)
    a = prefix_workload(t) if workload is None else np.asarray(workload, dtype=np.float64)
    if a.shape != (t, t) or not np.all(np.isfinite(a)):
        raise fail("workload", "array", f"a finite ({t}, {t}) matrix")
    g = a.T @ a
    v = np.ones(t)
    x = np.eye(t)
    for _ in range(check_int("iterations", iterations, 1)):
        sv = np.sqrt(v)
        evals, evecs = np.linalg.eigh(sv[:, None] * g * sv[None, :])
        root = (evecs * np.sqrt(np.maximum(evals, 0.0))) @ evecs.T
        x = root / sv[:, None] / sv[None, :]
        diag = np.diag(x)
        if np.max(np.abs(diag - 1.0)) < tol:
            break
        v = v * diag**2
    x = x / np.max(np.diag(x))  # feasible: max column norm of C is 1
    # C lower triangular with CᵀC = X: C = J Lᵀ J where J X J = L Lᵀ
    low = scipy.linalg.cholesky(x[::-1, ::-1], lower=True)
    c = low.T[::-1, ::-1]
    return DenseStrategy(np.tril(c))
