"""L2 sensitivity of a strategy matrix ``C`` under a participation pattern.

One record contributes a vector ``u_i`` (``‖u_i‖ ≤ 1`` after clipping) at each step ``i``
where it participates; the released ``C G + Z`` moves by ``Σ_{i∈π} C[:, i] u_i``. The
sensitivity is the largest norm of that over the allowed participation sets ``π`` and unit
vectors, so with the Gram matrix ``X = CᵀC``

    sens(C)² = max_π max_{‖u_i‖≤1} Σ_{i,j∈π} X_ij ⟨u_i, u_j⟩ ≤ max_π Σ_{i,j∈π} |X_ij|.

Participation (Choquette-Choo et al. 2023, "Multi-epoch matrix factorization mechanisms"
and "Amplified banded matrix factorization"): **b-min-sep** — at most ``k`` participations,
any two at least ``b`` steps apart (``k = ⌈T / b⌉`` by default; ``b = T`` or ``k = 1`` is single
participation).

* One participation: the largest column norm (exact).
* ``C`` with at most ``b`` bands: columns of one pattern have disjoint rows, so
  ``sens² = max_π Σ_{i∈π} X_ii`` (exact; a dynamic programme over patterns).
* Any other ``C``: the two-stage bound of Choquette-Choo et al. 2023 (for each row of ``|X|``
  the best pattern, then the best pattern of those row maxima) — an upper bound, never below.
* Toeplitz ``C`` with non-negative, non-increasing coefficients: the worst pattern is ``k``
  participations exactly ``b`` apart from step 0 (McKenna 2024, Thm. 2), O(T). Other
  coefficients are first replaced by the reverse running maximum of their absolute values,
  which only increases every ``|X_ij|``: an upper bound (the smaller of it and the
  two-stage bound when T ≤ 1024).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_int, fail

__all__ = [
    "Sensitivity",
    "dense_sensitivity",
    "max_over_patterns",
    "max_participations",
    "toeplitz_sensitivity",
]

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Sensitivity:
    """An L2 sensitivity: ``value`` (an upper bound; the exact value when ``exact``)."""

    value: float
    exact: bool
    method: str


def max_participations(steps: int, min_sep: int, limit: int | None = None) -> int:
    """Most participations b-min-sep allows in ``steps`` steps: ⌈T / b⌉ (capped by ``limit``)."""
    t = check_int("steps", steps, 1)
    b = check_int("min_sep", min_sep, 1)
    k = -(-t // b)
    if limit is not None:
        k = min(k, check_int("max_participations", limit, 1))
    return k


def max_over_patterns(weights: ArrayLike, min_sep: int, max_part: int) -> FloatArray:
    """``max_π Σ_{i∈π} w_i`` over sets of ≤ ``max_part`` indices pairwise ≥ ``min_sep`` apart.

    Vectorised over leading axes (one answer per row of a 2-D ``weights``); weights must be
    ≥ 0. A backward dynamic programme: ``f_j(i) = max(f_j(i+1), w_i + f_{j-1}(i+b))`` keeping
    only the last ``b`` columns, O(T · k) per row.

    >>> max_over_patterns([3.0, 1.0, 2.0, 5.0], min_sep=2, max_part=2).item()
    8.0
    """
    w = np.asarray(weights, dtype=np.float64)
    b = check_int("min_sep", min_sep, 1)
    k = check_int("max_part", max_part, 1)
    if w.ndim == 0 or w.shape[-1] == 0:
        raise fail("weights", weights, "a non-empty array of non-negative numbers")
    if np.any(~np.isfinite(w)) or np.any(w < 0):
        raise fail("weights", "array", "finite non-negative numbers")
    t = w.shape[-1]
    lead = w.shape[:-1]
    # ring[r] holds f(i') for i' ≡ r (mod b) among the b most recent columns, shape (k+1, ...)
    ring = np.zeros((b, k + 1, *lead))
    nxt = np.zeros((k + 1, *lead))  # f(i + 1)
    for i in range(t - 1, -1, -1):
        ahead = ring[i % b]  # f(i + b) (zeros beyond the end)
        cur = np.empty_like(nxt)
        cur[0] = 0.0
        np.maximum(nxt[1:], w[..., i] + ahead[:-1], out=cur[1:])
        ring[i % b] = cur
        nxt = cur
    return np.asarray(nxt[k])


def _lower_bands(c: FloatArray, tol: float = 0.0) -> int:
    """Number of bands of a (lower-triangular) matrix: 1 + largest i − j with a non-zero."""
    rows, cols = np.nonzero(np.abs(c) > tol)
    if rows.size == 0:
        return 0
    return int(np.max(rows - cols)) + 1 if np.all(rows >= cols) else c.shape[0] + c.shape[1]


def dense_sensitivity(
    strategy: ArrayLike, min_sep: int = 1, max_participations: int | None = 1
) -> Sensitivity:
    """Sensitivity of a dense strategy ``C`` (rows × T) under b-min-sep participation.

    ``max_participations=None`` means as many as ``min_sep`` allows (⌈T/b⌉).
    """
    c = np.asarray(strategy, dtype=np.float64)
    if c.ndim != 2 or c.size == 0 or not np.all(np.isfinite(c)):
        raise fail("strategy", "array", "a finite 2-D matrix with T columns")
    t = c.shape[1]
    b = check_int("min_sep", min_sep, 1)
    k = _k(t, b, max_participations)
    col_sq = np.einsum("ij,ij->j", c, c)
    if k == 1:
        return Sensitivity(math.sqrt(float(col_sq.max())), True, "max column norm")
    if c.shape[0] == t and _lower_bands(c) <= b:
        value = float(max_over_patterns(col_sq, b, k))
        return Sensitivity(math.sqrt(value), True, "banded: disjoint columns")
    x = np.abs(c.T @ c)
    rows = max_over_patterns(x, b, k)
    value = float(max_over_patterns(rows, b, k))
    return Sensitivity(math.sqrt(value), False, "two-stage pattern bound on |CᵀC|")


def _k(steps: int, min_sep: int, limit: int | None) -> int:
    if limit is None:
        return -(-steps // min_sep)
    return min(check_int("max_participations", limit, 1), -(-steps // min_sep))


def toeplitz_sensitivity(
    coefs: ArrayLike, steps: int, min_sep: int = 1, max_participations: int | None = 1
) -> Sensitivity:
    """Sensitivity of the T × T lower-triangular Toeplitz matrix with first column ``coefs``.

    ``coefs`` may be shorter than T (zeros after: a banded matrix). Exact when the
    coefficients are non-negative and non-increasing; otherwise their reverse running
    maximum of absolute values gives an upper bound. O(T).

    >>> toeplitz_sensitivity([1.0], 8, 2, None).value  # DP-SGD: √k, k = 4
    2.0
    """
    t = check_int("steps", steps, 1)
    b = check_int("min_sep", min_sep, 1)
    c = np.asarray(coefs, dtype=np.float64).reshape(-1)[:t]
    if c.size == 0 or not np.all(np.isfinite(c)):
        raise fail("coefs", coefs, "finite Toeplitz coefficients")
    k = _k(t, b, max_participations)
    if k == 1:  # the first column is the longest
        return Sensitivity(math.sqrt(float(c @ c)), True, "max column norm")
    proj = np.maximum.accumulate(np.abs(c)[::-1])[::-1]
    exact = bool(np.all(c >= 0) and np.all(np.diff(c) <= 0))
    full = np.zeros(t)
    full[: c.size] = proj
    # v = Σ_{j<k} shift(c, j b): a running sum over blocks of b, minus the part shifted k
    pad = (-t) % b
    v = np.concatenate([full, np.zeros(pad)]).reshape(-1, b).cumsum(axis=0).reshape(-1)
    if k * b < v.size:
        v[k * b :] -= v[: v.size - k * b].copy()
    value = math.sqrt(float(v[:t] @ v[:t]))
    if exact:
        return Sensitivity(value, True, "Toeplitz, pattern 0, b, 2b, ...")
    envelope = Sensitivity(value, False, "Toeplitz, monotone envelope")
    if t > _DENSE_LIMIT:
        return envelope
    matrix = np.zeros((t, t))
    for j in range(min(c.size, t)):
        matrix[np.arange(j, t), np.arange(0, t - j)] = c[j]
    dense = dense_sensitivity(matrix, b, k)
    return dense if dense.value < envelope.value else envelope


_DENSE_LIMIT = 1024  # largest T for the O(T² k) dense bound of non-monotone Toeplitz C
