"""Privacy amplification by subsampling.

The numerically delicate series of the project live here, once:

* :func:`poisson_subsampled_gaussian_rdp` -- RDP of the Poisson-subsampled Gaussian
  (add/remove neighbours), exact at every real order (Mironov, Talwar & Zhang 2019).
* :func:`sampled_without_replacement_gaussian_rdp` -- RDP of the Gaussian on a batch drawn
  uniformly without replacement (replace-one neighbours; Wang, Balle & Kasiviswanathan 2019).
* :func:`poisson_subsampled_rdp` -- generic RDP amplification of any mechanism whose RDP is
  known at integer orders (Zhu & Wang 2019).
* :func:`amplify_approx_dp_poisson`, :func:`amplify_approx_dp_without_replacement` --
  amplification of an (epsilon, delta)-DP guarantee (Balle, Barthe & Gaboardi 2018).

Notation: ``q`` is the sampling rate, ``sigma`` the noise multiplier (noise standard deviation
over the L2 sensitivity), ``mu0 = N(0, sigma^2)``, ``mu1 = N(1, sigma^2)`` and
``mu = (1 - q) mu0 + q mu1``. For the Poisson-subsampled Gaussian, Mironov, Talwar & Zhang
(arXiv:1908.10530, Theorem 4 with Section 3.3) show that for every order ``alpha > 1`` and
add/remove neighbours the Rényi divergence of the mechanism's outputs, in either direction, is
at most ``log(A_alpha) / (alpha - 1)`` with ``A_alpha = E_{z ~ mu0}[(mu(z) / mu0(z))^alpha]``,
i.e. ``D_alpha(mu || mu0)`` (removal direction). The other direction, ``D_alpha(mu0 || mu)``,
is never larger (their Theorem 5), so the value returned here is valid for both.

How ``A_alpha`` is evaluated (details in ``docs/subsampling.md``): writing
``u(z) = q (exp((2z - 1) / (2 sigma^2)) - 1)`` so that ``mu / mu0 = 1 + u`` and
``E[u] = 0``, we compute ``B = A_alpha - 1 = E[(1 + u)^alpha - 1 - alpha u]`` directly (its
integrand is non-negative), which keeps full relative accuracy when ``B`` is tiny (small ``q``,
large ``sigma``, ``alpha`` near 1), where ``log(A) / (alpha - 1)`` computed from ``A`` alone
loses every digit. Integer orders use the binomial expansion of MTZ (Section 3.2), in one
``logsumexp``, or, when ``B`` is small, the same expansion around 1 (all terms non-negative).
Fractional orders split the line into a central region, where the Taylor series of
``(1 + u)^alpha`` in ``u`` converges geometrically, and the upper tail, where the two series of
MTZ Section 3.3 apply; their alternating tails are summed by the Euler transform with a
rigorous remainder bound, because the magnitudes of their terms are completely monotone in the
summation index. Every truncation adds its remainder bound, so the result errs upwards only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammaln, log_ndtr

from renyi._validation import (
    check_int,
    check_nonnegative,
    check_orders,
    check_positive,
    check_probability,
    check_range,
    fail,
)

__all__ = [
    "amplify_approx_dp_poisson",
    "amplify_approx_dp_without_replacement",
    "poisson_subsampled_gaussian_rdp",
    "poisson_subsampled_rdp",
    "sampled_without_replacement_gaussian_rdp",
]

FloatArray = NDArray[np.float64]

# Central region of the fractional-order evaluation: |u| <= max(q, _RHO) there, so the Taylor
# series of (1 + u)^alpha converges at least geometrically with ratio 1/2.
_RHO = 0.5
# MTZ series: exact terms up to floor(alpha) + 2 + _MTZ_EXTRA, then an Euler transform of
# _EULER_TERMS differences of the alternating tail, with a rigorous remainder bound.
_MTZ_EXTRA = 8
_EULER_TERMS = 24
# Rounding allowance added to every log(A) (relative, and absolute where A itself was summed).
_ROUND = 64.0 * float(np.finfo(np.float64).eps)
_EPS4 = 4.0 * float(np.finfo(np.float64).eps)
_EULER_ROUND = 64.0 * float(np.finfo(np.float64).eps)  # rounding pad of an Euler-tail bound
# Limits of the expansion around 1: number of terms, and log of its rounding growth factor.
_CENTRAL_MAX_TERMS = 1500
_CENTRAL_MAX_GROWTH = 8.0
# Extra Taylor terms beyond ceil(alpha) in the central region (ratio <= 1/2 each).
_CENTRAL_EXTRA = 48
# Integer orders: below this log(A) the expansion around 1 is used (no cancellation).
_SMALL_LOG_A = 1e-2
# Integer orders, expansion around 1: exact terms up to this k, then a rigorous tail bound.
_CENTRAL_INT_TERMS = 64
# Integer orders, expansion around 1: up to this many terms in all, mask instead of gather.
_MASK_TERMS = 4096


def _central_ok(q: float, alphas: FloatArray, short: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """Where the expansion around 1 may be used (``short``: :func:`_short` of ``alphas``).

    That expansion keeps full relative accuracy for small ``A - 1`` (the direct sum's relative
    error is ``~eps / log(A)``), but its inner binomial sums carry rounding errors of order
    ``eps (1 + 2q)^alpha``, so it is used only while that factor is moderate.
    """
    if q > 0.5:
        return np.zeros(alphas.shape, dtype=bool)
    return (alphas * math.log1p(2.0 * q) <= _CENTRAL_MAX_GROWTH) & short


def _short(alphas: FloatArray) -> NDArray[np.bool_]:
    """The order-only part of :func:`_central_ok`: few enough terms."""
    return np.asarray(alphas + _CENTRAL_EXTRA <= _CENTRAL_MAX_TERMS)


def _validate_orders(orders: ArrayLike) -> FloatArray:
    """Check ``orders`` and return them as a 1-D float64 array in the caller's order."""
    check_orders(orders)  # raises PrivacyParameterError for anything invalid
    return np.atleast_1d(np.asarray(orders, dtype=np.float64)).ravel()


# --------------------------------------------------------------------------------------------
# Small numerical helpers
# --------------------------------------------------------------------------------------------


def _log_abs_binom(alpha: FloatArray, k: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``log|C(alpha, k)|`` and the sign of ``C(alpha, k)`` for real ``alpha`` and integer k >= 0.

    Uses ``gammaln`` (``log|Gamma|``); the sign of the generalised binomial coefficient is
    ``(-1)^(k - 1 - floor(alpha))`` for ``k > floor(alpha) + 1`` and positive below. Where
    ``alpha`` is an integer and ``k > alpha`` the coefficient is 0 (log = -inf, sign 0).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = gammaln(alpha + 1.0) - gammaln(k + 1.0) - gammaln(alpha - k + 1.0)
    is_int = alpha == np.floor(alpha)
    zero = is_int & (k > alpha)
    lg = np.where(zero, -np.inf, lg)
    neg_count = np.maximum(k - 1.0 - np.floor(alpha), 0.0)
    sign = np.where(np.mod(neg_count, 2.0) == 1.0, -1.0, 1.0)
    sign = np.where(zero, 0.0, sign)
    return lg, sign


def _log_abs_expm1(x: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``log|exp(x) - 1|`` and ``sign(x)``, accurate for tiny and for huge ``x``:
    ``log(1 - exp(-|x|))``, plus ``x`` where ``x > 0``."""
    lg = np.log(-np.expm1(-np.abs(x)))
    return np.where(x > 0, x + lg, lg), np.sign(x)


def _log_ndtr_diff(a: FloatArray, b: FloatArray) -> FloatArray:
    """``log(Phi(a) - Phi(b))`` for ``a > b`` (``b`` may be -inf), without cancellation."""
    # Upper tails when both are positive, lower tails otherwise.
    upper = b > 0
    hi = log_ndtr(np.where(upper, -b, a))
    lo = log_ndtr(np.where(upper, -a, b))
    return hi + np.log(-np.expm1(lo - hi))  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=8)
def _log_binom_table(n: int) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """``log C(k, j)`` laid out ``[j, k]`` (0 <= j <= k <= n, -inf for j > k), ``(-1)^(k - j)``
    and ``_ROUND + 4 eps (|log C(k, j)| + 1)`` (the rounding weight, less its ``F_j`` part);
    then ``j`` and ``j^2 - j`` as vectors."""
    j = np.arange(n + 1, dtype=np.float64)[:, None]
    k = np.arange(n + 1, dtype=np.float64)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        lb = gammaln(k + 1) - gammaln(j + 1) - gammaln(k - j + 1)
    lb = np.where(j <= k, lb, -np.inf)
    alt = np.where(np.mod(k - j, 2.0) == 0, 1.0, -1.0)
    # Rounding weight of each term before the |log(F_j - 1)| part: _ROUND + 4 eps mags.
    weight = _ROUND + _EPS4 * (np.where(j <= k, np.abs(lb), 0.0) + 1.0)
    jv = np.arange(n + 1, dtype=np.float64)
    jj = jv * jv - jv
    for arr in (lb, alt, weight, jv, jj):
        arr.setflags(write=False)
    return lb, alt, weight, jv, jj


@functools.lru_cache(maxsize=8)
def _euler_weights(m: int) -> tuple[FloatArray, FloatArray]:
    """Weights of the Euler transform of an alternating tail with ``m`` differences.

    For a completely monotone sequence ``f`` the tail ``S = sum_j (-1)^j f(K + j)`` equals
    ``sum_{i<=m} (-1)^i W_i f(K + i) + R`` with ``W_i = sum_{i <= l < m} C(l, i) / 2^(l + 1)``
    and ``0 <= R <= sum_i (-1)^i C(m, i) f(K + i) / 2^m`` (the m-th difference over 2^m).
    Returns ``(signed W, signed bound weights)`` as columns of shape ``(m + 1, 1)``.
    """
    from scipy.special import comb

    i = np.arange(m + 1)
    w = np.zeros(m + 1)
    for ell in range(m):
        w[: ell + 1] += comb(ell, i[: ell + 1]) / 2.0 ** (ell + 1)
    sgn = np.where(i % 2 == 0, 1.0, -1.0)
    bound = sgn * comb(m, i) / 2.0**m
    return (sgn * w)[:, None], bound[:, None]


# Sums over the terms of a series run down the columns of a (term, order) table, one column
# per order. ``_colsum`` adds the rows strictly in sequence (numpy's reduction over the outer
# axis of a C-contiguous 2-D array with at least two columns), so the value for an order does
# not depend on which other orders share the call, nor on -inf padding (exact zeros): an order
# gets bit-for-bit the same value alone, in a subset or in the full grid. The lazy order search
# of the RDP accountant relies on this.


def _colsum(x: FloatArray) -> FloatArray:
    """Sum of the rows of a 2-D array, added strictly in row order (per column)."""
    n = x.shape[1]
    if n == 1:  # a single column would be reduced pairwise: pad with a copy
        x = np.concatenate([x, x], axis=1)
    return np.add.reduce(np.ascontiguousarray(x), axis=0)[:n]


def _pad(log_a: FloatArray) -> FloatArray:
    """Round ``log(A)`` up by a relative rounding allowance (the final log and division)."""
    return log_a + _ROUND * np.abs(log_a)


# --------------------------------------------------------------------------------------------
# Order-dependent tables, cached per grid (they do not depend on q or sigma)
# --------------------------------------------------------------------------------------------


def _binom_mag(alpha: FloatArray, k: FloatArray) -> FloatArray:
    """Sum of the absolute values of the three ``gammaln`` making up ``log|C(alpha, k)|``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.abs(gammaln(alpha + 1.0)) + np.abs(gammaln(k + 1.0))
        out = g + np.abs(gammaln(alpha - k + 1.0))
    return np.where(np.isfinite(out), out, 0.0)


class _IntegerPlan:
    """Flattened ragged table of ``log C(alpha, k)``, ``0 <= k <= alpha``, integer orders."""

    alphas: FloatArray
    sizes: NDArray[np.int64]
    starts: NDArray[np.intp]
    row: NDArray[np.intp]
    a: FloatArray
    k: FloatArray
    lb: FloatArray
    lb_mag: FloatArray
    kk: FloatArray
    short: NDArray[np.bool_]
    a_m1: FloatArray
    k_ge2: NDArray[np.bool_]

    def __init__(self, alphas: FloatArray) -> None:
        sizes = alphas.astype(np.int64) + 1
        self.alphas = alphas
        self.sizes = sizes
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
        self.row = np.repeat(np.arange(alphas.size), sizes)
        self.a = alphas[self.row]
        self.k = np.arange(int(sizes.sum()), dtype=np.float64) - self.starts[self.row]
        g = (gammaln(self.a + 1), gammaln(self.k + 1), gammaln(self.a - self.k + 1))
        self.lb = g[0] - g[1] - g[2]
        self.lb_mag = np.abs(g[0]) + np.abs(g[1]) + np.abs(g[2])
        self.kk = self.k * self.k - self.k
        self._derived()

    def _derived(self) -> None:
        self.short = _short(self.alphas)
        self.a_m1 = self.alphas - 1.0
        self.k_ge2 = self.k >= 2

    def subset(self, sel: NDArray[np.bool_]) -> _IntegerPlan:
        """The plan of the orders ``alphas[sel]`` (segments gathered, nothing recomputed)."""
        if sel.all():
            return self
        out = object.__new__(_IntegerPlan)
        sizes = self.sizes[sel]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
        row = np.repeat(np.arange(sizes.size), sizes)
        gather = np.arange(int(sizes.sum())) + (self.starts[sel] - starts)[row]
        out.alphas, out.sizes, out.starts, out.row = self.alphas[sel], sizes, starts, row
        out.a, out.k, out.lb = self.a[gather], self.k[gather], self.lb[gather]
        out.lb_mag, out.kk = self.lb_mag[gather], self.kk[gather]
        out._derived()
        return out


def _central_terms(alphas: FloatArray) -> NDArray[np.intp]:
    """Per order, where the central Taylor series is cut: the first ``K`` in
    ``[ceil(alpha) + 2, ceil(alpha) + _CENTRAL_EXTRA]`` whose remainder bound
    ``|C(alpha, K)| 2^-(K-2) / (1 - 1/2) q^2 M_2`` is below ``2^-60`` times the ``k = 2`` term
    ``C(alpha, 2) q^2 M_2`` (the ratio depends on alpha alone). Any ``K`` gives a valid bound
    (the remainder is added); this only keeps the series short where it converges fast."""
    ks = np.ceil(alphas)[:, None] + np.arange(2.0, _CENTRAL_EXTRA + 1.0)[None, :]
    lk, _ = _log_abs_binom(alphas[:, None], ks)
    l2 = np.log(alphas * (alphas - 1.0) / 2.0)[:, None]
    ratio = lk - l2 - (ks - 2.0) * math.log(2.0) + math.log(2.0)
    ok = ratio <= -60.0 * math.log(2.0)
    first = np.where(ok.any(axis=1), np.argmax(ok, axis=1), ks.shape[1] - 1)
    return np.asarray(ks[np.arange(alphas.size), first], dtype=np.intp)


class _FractionalPlan:
    """Per-order tables of ``log|C(alpha, k)|`` and signs for the MTZ series and the central
    series, laid out ``[k, order]``; every truncation point is a function of the order alone.

    MTZ series of the order ``alpha``: exact terms ``k < k_start = floor(alpha) + 2 + 8``, then
    ``_EULER_TERMS + 1`` terms feeding the Euler transform of the tail (rows up to ``width``).
    Central series: terms ``2 <= k < k1`` (:func:`_central_terms`) and a bound beyond.
    """

    alphas: FloatArray
    k_start: NDArray[np.intp]
    width: NDArray[np.intp]
    k: FloatArray
    lb: FloatArray
    sb: FloatArray
    lb_mag: FloatArray
    sb_head: FloatArray
    sb_head2: FloatArray
    s_k: FloatArray
    tail_flat: NDArray[np.intp]
    k1: NDArray[np.intp]
    kc: FloatArray
    lbc: FloatArray
    sbc: FloatArray
    lbc_mag: FloatArray
    lbk1: FloatArray
    per_order: FloatArray
    mtz: FloatArray
    cen: FloatArray
    mtz_by_order: FloatArray
    cen_by_order: FloatArray
    short: NDArray[np.bool_]
    a_m1: FloatArray
    a_row: FloatArray
    kk: FloatArray
    k1m2: FloatArray
    cen_ones: FloatArray
    cen_nan: FloatArray
    tail_nan: FloatArray
    minus_ones: FloatArray
    s_pos: NDArray[np.bool_]

    def __init__(self, alphas: FloatArray) -> None:
        self.alphas = alphas
        a = alphas[None, :]
        self.k_start = (np.floor(alphas) + 2 + _MTZ_EXTRA).astype(np.intp)
        self.width = self.k_start + _EULER_TERMS + 1
        self.k = np.arange(int(self.width.max()), dtype=np.float64)[:, None]
        lb, self.sb = _log_abs_binom(a, self.k)
        self.lb = np.where(self.k < self.width[None, :], lb, -np.inf)  # nothing past width
        self.lb_mag = _binom_mag(a, self.k)
        self.sb_head = np.where(self.k < self.k_start[None, :], self.sb, 0.0)
        self.s_k = np.take_along_axis(self.sb, self.k_start[None, :], axis=0)[0]
        self.tail_flat = self._tail_flat()
        self.k1 = _central_terms(alphas)
        self.kc = np.arange(2, int(self.k1.max()), dtype=np.float64)[:, None]
        lbc, self.sbc = _log_abs_binom(a, self.kc)
        self.lbc = np.where(self.kc < self.k1[None, :], lbc, -np.inf)
        self.lbc_mag = _binom_mag(a, self.kc)
        self.lbk1, _ = _log_abs_binom(alphas, self.k1.astype(np.float64))
        self.per_order = np.stack([alphas, self.k_start, self.width, self.k1, self.s_k, self.lbk1])
        j = a - self.k  # exponents of the upper series, j^2 - j, |j|
        self.mtz = np.stack([self.lb, self.sb, self.lb_mag, self.sb_head, j, j * j - j, abs(j)])
        self.sb_head2 = np.concatenate([self.sb_head, self.sb_head])  # two series stacked
        self.cen = np.stack([self.lbc, self.sbc, self.lbc_mag])
        # Order-major copies: a subset of orders reads contiguous blocks.
        self.mtz_by_order = np.ascontiguousarray(self.mtz.transpose(2, 0, 1))
        self.cen_by_order = np.ascontiguousarray(self.cen.transpose(2, 0, 1))
        self._derived()

    def _derived(self) -> None:
        """Order-only constants of :func:`_log_a_fractional` (no per-call temporaries)."""
        n = self.alphas.size
        self.short = _short(self.alphas)
        self.a_m1 = self.alphas - 1.0
        self.a_row = self.alphas[None, :]
        self.kk = self.k * self.k - self.k
        self.k1m2 = (self.k1 - 2).astype(np.float64)
        self.cen_ones = np.ones((self.kc.shape[0] + 1, n))
        self.cen_nan = np.full((self.kc.shape[0] + 1, n), np.nan)
        self.tail_nan = np.full((2, n), np.nan)
        self.minus_ones = -np.ones((1, n))
        self.s_pos = self.s_k > 0

    def subset(self, sel: NDArray[np.bool_]) -> _FractionalPlan:
        """The plan of the orders ``alphas[sel]`` (columns and the rows they need)."""
        if sel.all():
            return self
        out = object.__new__(_FractionalPlan)
        cols = np.flatnonzero(sel)
        out.per_order = per = self.per_order.take(cols, axis=1)
        out.alphas, out.s_k, out.lbk1 = per[0], per[4], per[5]
        out.k_start, out.width, out.k1 = per[1:4].astype(np.intp)
        w = int(out.width.max())
        wc = int(out.k1.max()) - 2
        out.k, out.kc = self.k[:w], self.kc[:wc]
        out.mtz_by_order = self.mtz_by_order[cols, :, :w]
        out.cen_by_order = self.cen_by_order[cols, :, :wc]
        out.mtz = np.ascontiguousarray(out.mtz_by_order.transpose(1, 2, 0))
        out.cen = np.ascontiguousarray(out.cen_by_order.transpose(1, 2, 0))
        out.lb, out.sb, out.lb_mag, out.sb_head = out.mtz[:4]
        out.sb_head2 = np.concatenate([out.sb_head, out.sb_head])
        out.lbc, out.sbc, out.lbc_mag = out.cen
        out.tail_flat = out._tail_flat()
        out._derived()
        return out

    def _tail_flat(self) -> NDArray[np.intp]:
        """Flat indices into a ``[k, order]`` table of rows ``k_start .. k_start + M``."""
        n = self.alphas.size
        rows = self.k_start[None, :] + np.arange(_EULER_TERMS + 1)[:, None]
        return np.asarray(rows * n + np.arange(n)[None, :], dtype=np.intp)


class _GridSplit:
    """The distinct orders of a grid, split into integer, fractional and infinite ones, with
    the grid's integer-order and fractional-order plans (built on first use)."""

    def __init__(self, alphas: FloatArray) -> None:
        self.uniq, self.inverse = np.unique(alphas, return_inverse=True)
        finite = np.isfinite(self.uniq)
        self.finite = finite
        self.is_int = finite & (self.uniq == np.floor(self.uniq))
        self.frac = finite & ~self.is_int
        self.a_int = self.uniq[self.is_int]
        self.a_frac = self.uniq[self.frac]
        for arr in (self.uniq, self.inverse, finite, self.is_int, self.frac):
            arr.setflags(write=False)
        self.a_int.setflags(write=False)
        self.a_frac.setflags(write=False)
        self.any_int = bool(self.is_int.any())
        self.any_frac = bool(self.frac.any())
        self._int_plan: _IntegerPlan | None = None
        self._frac_plan: _FractionalPlan | None = None
        self._subsets: dict[bytes, _Subset] = {}
        self._full: _Subset | None = None

    @property
    def int_plan(self) -> _IntegerPlan:
        if self._int_plan is None:
            self._int_plan = _IntegerPlan(self.a_int)
        return self._int_plan

    def subset(self, sel: NDArray[np.bool_] | None, cache: bool) -> _Subset:
        """The tables of the orders ``uniq[sel]`` (all when None; kept with the grid for the
        full grid and, with ``cache``, for a few subsets)."""
        if sel is None:
            if self._full is None:
                self._full = _Subset(self, np.ones(self.uniq.shape, dtype=bool))
            return self._full
        if not cache:
            return _Subset(self, sel)
        key = sel.tobytes()
        sub = self._subsets.get(key)
        if sub is None:
            sub = _Subset(self, sel)
            if len(self._subsets) >= 8:
                self._subsets.clear()
            self._subsets[key] = sub
        return sub

    @property
    def frac_plan(self) -> _FractionalPlan:
        if self._frac_plan is None:
            self._frac_plan = _FractionalPlan(self.a_frac)
        return self._frac_plan


class _Subset:
    """The orders ``grid.uniq[sel]``: their integer-order and fractional-order plans (None:
    no such order) and where each part's values go in the result."""

    def __init__(self, grid: _GridSplit, sel: NDArray[np.bool_]) -> None:
        self.alphas = grid.uniq[sel]
        self.res0 = np.full(self.alphas.shape, np.inf)  # inf stays only at alpha = inf
        self.int_plan: _IntegerPlan | None = None
        self.frac_plan: _FractionalPlan | None = None
        if grid.any_int:
            s_int = sel[grid.is_int]
            if s_int.any():
                self.int_plan = grid.int_plan.subset(s_int)
        if grid.any_frac:
            s_frac = sel[grid.frac]
            if s_frac.any():
                self.frac_plan = grid.frac_plan.subset(s_frac)
        self.int_pos = grid.is_int[sel]
        self.frac_pos = grid.frac[sel]


@functools.lru_cache(maxsize=32)
def _grid_split(key: bytes) -> _GridSplit:
    return _GridSplit(np.frombuffer(key, dtype=np.float64))


@functools.lru_cache(maxsize=32)
def _integer_plan(key: bytes) -> _IntegerPlan:
    return _IntegerPlan(np.frombuffer(key, dtype=np.float64))


# --------------------------------------------------------------------------------------------
# Poisson-subsampled Gaussian: moments and integer orders
# --------------------------------------------------------------------------------------------


def _moments_log(
    c: float, sigma: float, z_hi: float, kmax: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``log|M_k|``, ``sign(M_k)`` and a log rounding allowance, ``M_k = E[Y^k; z <= z_hi]``.

    ``k = 0..kmax``; ``Y = exp(t) - 1``, ``t = (2z - 1) / (2 sigma^2)``, ``z ~ N(0, sigma^2)``.
    Expanding ``Y^k`` binomially gives ``sum_j C(k, j) (-1)^(k-j) F_j`` with
    ``F_j = E[exp(j t); z <= z_hi] = exp(c (j^2 - j)) Phi((z_hi - j) / sigma)``. Since the
    alternating binomial sum of a constant vanishes for ``k >= 1`` we sum ``F_j - 1`` instead
    (``expm1`` in log space), which removes the O(1) part that would otherwise cancel when
    sigma is large. Entry ``k = 0`` is ``Phi(z_hi / sigma)``. Each ``M_k`` is summed over
    ``j`` in sequence, so it does not depend on ``kmax``.
    """
    lb, alt, weight, j, jj = _log_binom_table(kmax)
    log_f = c * jj
    if math.isfinite(z_hi):
        log_f = log_f + log_ndtr((z_hi - j) / sigma)
    lm1, sm1 = _log_abs_expm1(log_f)
    logs = lb + lm1[:, None]
    # One shared scale per moment for the signed sum and its rounding allowance (the allowance
    # is sum |term| (_ROUND + 4 eps mags), mags the sizes of the parts of each log-term).
    m = np.maximum.reduce(logs, axis=0)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(logs - m)
    total = _colsum(e * (alt * sm1[:, None]))
    alm1 = np.where(np.isfinite(lm1), np.abs(lm1), 0.0)  # exp(-inf) = 0 terms: no rounding
    w = e * (weight + (_EPS4 * alm1)[:, None])
    out = np.log(np.abs(total)) + m
    rnd = np.log(_colsum(w)) + m
    sgn = np.sign(total)
    out[0] = float(log_ndtr(z_hi / sigma)) if math.isfinite(z_hi) else 0.0
    sgn[0] = 1.0
    return out, sgn, rnd


def _log_a_integer(q: float, sigma: float, plan: _IntegerPlan) -> FloatArray:
    """``log(A_alpha)`` (rounded up) for integer ``alpha >= 2`` (MTZ Section 3.2).

    ``A_alpha = sum_{k=0}^{alpha} C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 sigma^2))``,
    all terms positive: one log-sum-exp per order over a flattened ragged table. When the
    result is small, ``A_alpha - 1 = sum_{k=2}^{alpha} C(alpha, k) q^k E[Y^k]`` (expansion
    around 1, every ``E[Y^k] >= 0``) is used instead; terms beyond ``_CENTRAL_INT_TERMS`` are
    replaced by the bound ``E[Y^k] <= 1 + exp(c (k^2 - k))``.
    """
    alphas = plan.alphas
    c = 1.0 / (2.0 * sigma * sigma)
    logq, log1mq = math.log(q), math.log1p(-q)
    ck = c * plan.kk
    al1 = plan.a * log1mq
    terms = plan.lb + al1 + plan.k * (logq - log1mq) + ck
    mags = plan.lb_mag - al1 - plan.k * logq + ck
    log_a = _ragged_lse(terms, plan.starts, plan.row, mags, finite_mags=True)

    small = _central_ok(q, alphas, plan.short) & (log_a < _SMALL_LOG_A)
    if small.any():
        # On a short table, mask the other orders' terms instead of gathering the small ones
        # (the segments' sums do not depend on each other either way).
        sub = plan if plan.k.size <= _MASK_TERMS else plan.subset(small)
        k_s = sub.k
        kc = int(min(alphas[small][-1], _CENTRAL_INT_TERMS))
        log_m, _sgn_m, rnd_m = _moments_log(c, sigma, math.inf, kc)
        # E[Y^k] >= 0 exactly; a negative computed value is pure rounding: use its size plus
        # the rounding allowance, an upper bound either way.
        log_m = np.logaddexp(log_m, rnd_m)
        lm = log_m[np.minimum(k_s, kc).astype(np.intp)]
        ck_s = c * sub.kk
        mags = sub.lb_mag - k_s * logq + np.abs(lm) + ck_s
        head = sub.lb + k_s * logq
        tail = np.logaddexp(0.0, ck_s)  # rigorous bound for k > kc
        t = head + np.where(k_s > kc, tail, lm)
        keep = sub.k_ge2 & small[sub.row] if sub is plan else sub.k_ge2
        log_b = _ragged_lse(np.where(keep, t, -np.inf), sub.starts, sub.row, mags)
        if sub is plan:
            log_b = log_b[small]
        log_a[small] = np.minimum(log_a[small], np.log1p(np.exp(log_b)))
    return _pad(log_a)


def _ragged_lse(
    terms: FloatArray,
    starts: NDArray[np.intp],
    row: NDArray[np.intp],
    mags: FloatArray,
    finite_mags: bool = False,
) -> FloatArray:
    """Log-sum-exp of positive terms per segment plus the rounding allowance
    ``sum |term| (_ROUND + 4 eps mags)`` (``mags``: magnitudes of the parts each log-term was
    assembled from). Like every helper of the kernel, call it under
    ``np.errstate(all="ignore")``: infinities and NaN are handled explicitly."""
    m = np.maximum.reduceat(terms, starts)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(terms - m[row])
    s = np.add.reduceat(e, starts)
    w = e * (_ROUND + _EPS4 * np.abs(mags))
    if not finite_mags:  # an infinite magnitude goes with a zero term
        w = np.where(e > 0, w, 0.0)
    s = s + np.add.reduceat(w, starts)
    return np.log(s) + m  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------
# Poisson-subsampled Gaussian: fractional orders
# --------------------------------------------------------------------------------------------


def _seqsum(x: FloatArray, axis: int) -> FloatArray:
    """Sum over ``axis`` (not the last one) in sequence, like :func:`_colsum`."""
    n = x.shape[-1]
    if n == 1:
        x = np.concatenate([x, x], axis=-1)
    return np.add.reduce(np.ascontiguousarray(x), axis=axis)[..., :n]


def _series_with_euler_tail(
    logs: FloatArray, plan: _FractionalPlan
) -> tuple[FloatArray, FloatArray]:
    """Upper-bound the sums of series whose terms alternate, with completely monotone
    magnitudes, from row ``k_start`` of each column on (rows up to ``k_start + M`` present).

    ``logs`` has shape ``(s, W, n)``: ``s`` series (signs ``plan.sb``) over the orders of
    ``plan``. Returns ``(s, n)``: the log of the magnitude of each Euler-transformed tail plus
    its remainder bound when the tail is positive (its sign is ``plan.s_k`` times the sign of
    the result, which is returned second, also ``(s, n)``); the head
    terms (rows before ``k_start``) are the caller's. The sum of head and tail is never below
    the true sum.
    """
    w, bw = _euler_weights(_EULER_TERMS)
    tail_l = logs.reshape(logs.shape[0], -1)[:, plan.tail_flat]  # (s, M + 1, n)
    scale = tail_l[:, 0]
    finite = np.isfinite(scale)
    sc = np.where(finite, scale, 0.0)
    f = np.exp(tail_l - sc[:, None, :])
    est = _seqsum(f * w, axis=1)
    # Rounding in the m-th difference: pad by a multiple of the unit roundoff of f(K).
    bnd = np.maximum(_seqsum(f * bw, axis=1), 0.0) + _EULER_ROUND * finite
    total = est + np.where(plan.s_pos, bnd, 0.0)  # tail magnitude, upper/lower by sign
    tl = np.where(total > 0, np.log(np.abs(total)) + sc, -np.inf)
    return tl, plan.s_k * np.sign(total)


def _log_a_fractional(
    q: float, sigma: float, plan: _FractionalPlan, *, central: bool
) -> FloatArray:
    """``log(A_alpha)`` (rounded up) for non-integer ``alpha > 1``; see the module docstring.

    ``B = A - 1`` is assembled from (I) the central region ``u <= _RHO`` (``z <= z_c``), where
    ``(1 + u)^alpha - 1 - alpha u = sum_{k>=2} C(alpha, k) u^k`` with ``|u| <= max(q, _RHO)``;
    (II) the rest, ``z > z_c``, by the two series of MTZ Section 3.3 split at
    ``z0 = sigma^2 log(1/q - 1) + 1/2``, minus ``E[1 + alpha u; z > z_c]`` in closed form.
    With ``central=False`` the central region is empty (``z_c = -inf``) and this is exactly
    MTZ's two-series formula for ``A - 1``: accurate relative to ``A``, hence used first; the
    central region is needed only where ``A - 1`` is small (and ``q <= 1/2``). Tables are laid
    out ``[term, order]`` and summed down the columns in sequence (see :func:`_colsum`).
    """
    alphas = plan.alphas
    c = 1.0 / (2.0 * sigma * sigma)
    logq, log1mq = math.log(q), math.log1p(-q)
    n = alphas.size
    # One table of log-terms with, per term, its sign in B (0: not part of the sum) and its
    # rounding weight _ROUND + 4 eps mags (0: no rounding of its own; mags is the sum of the
    # absolute values of the parts its logarithm was assembled from): one scale, one exp.
    rows_l: list[FloatArray] = []
    rows_s: list[FloatArray] = []
    rows_m: list[FloatArray] = []  # magnitudes (NaN: no rounding term)

    # (I) central region.
    if central:
        r = max(q, _RHO)
        z_c = sigma * sigma * math.log1p(_RHO / q) + 0.5
        kc = plan.kc
        k1 = kc.shape[0] + 2
        log_m, sgn_m, rnd_m = _moments_log(c, sigma, z_c, k1)
        kl = kc * logq
        base = plan.lbc + kl
        lmc = log_m[2:k1, None]
        # Terms C(alpha, k) q^k E[Y^k; I]; then the moments' own rounding, added upwards; then
        # the remainder: |E[u^k; I]| <= r^(k-2) E[u^2; I], |C(alpha, k)| decreasing for k >= k1.
        rem = plan.lbk1 + plan.k1m2 * math.log(r) - math.log1p(-r) + 2 * logq + log_m[2]
        rows_l += [base + lmc, base + rnd_m[2:k1, None], rem[None, :]]
        rows_s += [plan.sbc * sgn_m[2:k1, None], plan.cen_ones]
        rows_m += [plan.lbc_mag - kl + np.abs(lmc), plan.cen_nan]
    else:
        z_c = -math.inf

    # (II) upper part, MTZ series with Euler-accelerated alternating tails.
    z0 = sigma * sigma * (log1mq - logq) + 0.5
    k = plan.k
    zb = max(z_c, z0)  # IIb: z > zb, expansion in 1/x <= 1
    j = plan.mtz[4]  # exponents alpha - k of the upper series
    lnu = log_ndtr((j - zb) / sigma)
    cjj = c * plan.mtz[5]  # c (j^2 - j)
    kl1 = k * log1mq
    t2 = plan.lb + kl1 + (j * logq + cjj + lnu)
    m2 = plan.lb_mag - kl1 + (plan.mtz[6] * abs(logq) + np.abs(cjj) + np.abs(lnu))
    if z_c < z0:  # IIa: z_c < z <= z0, expansion in x = q e^t / (1 - q) <= 1
        ckk = c * plan.kk
        lphi = _log_ndtr_diff((z0 - k) / sigma, (z_c - k) / sigma)
        al1 = plan.a_row * log1mq
        t1 = plan.lb + al1 + (k * (logq - log1mq) + ckk + lphi)
        m1 = plan.lb_mag - al1 + (k * (-logq) + ckk + np.abs(lphi))
        series, mags = np.concatenate([t1[None], t2[None]]), np.concatenate([m1[None], m2[None]])
    else:
        series, mags = t2[None], m2[None]
    tail = _series_with_euler_tail(series, plan)  # both series' tails in one pass
    n_rows = series.shape[0] * series.shape[1]
    # Every row of the series counts for rounding; only the head rows enter B as they are,
    # the rest through the Euler-transformed tail (whose rounding is in its own bound).
    rows_l += [series.reshape(n_rows, n), tail[0]]
    rows_s += [plan.sb_head2 if series.shape[0] == 2 else plan.sb_head, tail[1]]
    rows_m += [mags.reshape(n_rows, n), plan.tail_nan[: series.shape[0]]]

    # minus E[1 + alpha u; z > z_c] = (1 - alpha q) Phi(-z_c/s) + alpha q Phi((1 - z_c)/s).
    aq = alphas * q
    one_m = 1.0 - aq
    p0 = (np.log(np.abs(one_m)) + float(log_ndtr(-z_c / sigma)))[None, :]
    p1 = (np.log(aq) + float(log_ndtr((1.0 - z_c) / sigma)))[None, :]
    rows_l += [p0, p1]
    rows_s += [-np.sign(one_m)[None, :], plan.minus_ones]
    rows_m += [np.abs(p0), np.abs(p1)]

    logs = np.concatenate(rows_l)
    mx = np.maximum.reduce(logs, axis=0)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(logs - mx)
    total = _colsum(np.concatenate(rows_s) * e)
    # Rounding weights; inf magnitudes only occur with zero terms, NaN marks no rounding.
    w = _ROUND + _EPS4 * np.minimum(np.abs(np.concatenate(rows_m)), 1e300)
    rnd = _colsum(np.where(np.isnan(w), 0.0, w * e))
    # B > 0 in exact arithmetic; where the sum lost all precision (noise multipliers so large
    # that B underflows next to its rounding allowance) no bound is claimed here: +inf, which
    # the caller caps by the unsampled Gaussian alpha / (2 sigma^2) (tiny there).
    with np.errstate(divide="ignore", invalid="ignore"):
        log_b = np.where(total > 0, np.log(total + rnd) + mx, np.inf)
    return _pad(np.logaddexp(0.0, log_b))  # log(1 + B)


def _gaussian_rdp_on_grid(
    q: float,
    sigma: float,
    grid: _GridSplit,
    sel: NDArray[np.bool_] | None = None,
    *,
    cache: bool = False,
) -> FloatArray:
    """Poisson-subsampled Gaussian RDP at the distinct sorted orders ``grid.uniq[sel]``
    (all of them when ``sel`` is None); arguments already validated, ``0 < q < 1``.

    The value at an order does not depend on which other orders are evaluated with it.
    """
    with np.errstate(all="ignore"):  # the helpers below handle inf and NaN explicitly
        return _gaussian_rdp_values(q, sigma, grid, sel, cache)


def _gaussian_rdp_values(
    q: float, sigma: float, grid: _GridSplit, sel: NDArray[np.bool_] | None, cache: bool
) -> FloatArray:
    sub = grid.subset(sel, cache)
    res = sub.res0.copy()
    plan = sub.int_plan
    if plan is not None:
        res[sub.int_pos] = _log_a_integer(q, sigma, plan) / plan.a_m1
    fplan = sub.frac_plan
    if fplan is not None:
        af = fplan.alphas
        # q <= 1/4: the central expansion is accurate everywhere it is allowed; above,
        # MTZ's series alone first, the central expansion only where A - 1 is small.
        ok = _central_ok(q, af, fplan.short)
        if q <= 0.25 and ok.all():
            log_a = _log_a_fractional(q, sigma, fplan, central=True)
        else:
            cen = ok & (q <= 0.25)
            log_a = np.empty(af.shape)
            if cen.any():
                log_a[cen] = _log_a_fractional(q, sigma, fplan.subset(cen), central=True)
            rest = ~cen
            log_a[rest] = _log_a_fractional(q, sigma, fplan.subset(rest), central=False)
            redo = rest & ok & (log_a < _SMALL_LOG_A)
            if redo.any():  # both are upper bounds: keep the tighter one
                log_a[redo] = np.minimum(
                    log_a[redo],
                    _log_a_fractional(q, sigma, fplan.subset(redo), central=True),
                )
        res[sub.frac_pos] = log_a / fplan.a_m1
    # NaN only from overflow: inf. Never above the Gaussian without sampling: (alpha - 1)
    # D_alpha is convex in the first argument, so D_alpha((1-q) mu0 + q mu1 || mu0) <=
    # q D_alpha(mu1 || mu0) <= alpha c.
    res = np.fmin(np.where(np.isnan(res), np.inf, res), sub.alphas / (2.0 * sigma * sigma))
    return np.maximum(res, 0.0)


def _gaussian_rdp_subset(
    q: float, sigma: float, orders: FloatArray, sel: NDArray[np.bool_], *, cache: bool = False
) -> FloatArray:
    """:func:`poisson_subsampled_gaussian_rdp` at ``orders[sel]``, for a validated, sorted grid
    without duplicates, ``0 < q < 1`` and ``1 / (2 sigma^2)`` finite (the RDP accountant's lazy
    evaluation). Bit-for-bit the values that function returns at those orders. ``cache``
    keeps the gathered tables of this subset of orders with the grid (they depend on the
    orders alone; up to 8 subsets per grid, e.g. the accountant's two passes)."""
    return _gaussian_rdp_on_grid(q, sigma, _grid_split(orders.tobytes()), sel, cache=cache)


def poisson_subsampled_gaussian_rdp(
    sampling_rate: float, noise_multiplier: float, orders: ArrayLike
) -> FloatArray:
    """RDP of the Poisson-subsampled Gaussian mechanism, at integer and fractional orders.

    Each record is included independently with probability ``sampling_rate`` (q), and the
    Gaussian mechanism with noise multiplier ``noise_multiplier`` (sigma = noise standard
    deviation / L2 sensitivity) is applied to the sample. Neighbouring relation: add/remove
    one record. Returns ``epsilon(alpha) = log(A_alpha) / (alpha - 1)`` with
    ``A_alpha = E_{z ~ N(0, s^2)}[((1 - q) + q exp((2z - 1) / (2 s^2)))^alpha]``:
    Mironov, Talwar & Zhang 2019 (arXiv:1908.10530), Theorem 4 (this is ``D_alpha(mu || mu0)``)
    and Theorem 5 (``D_alpha(mu0 || mu)`` is never larger), so the bound holds for both the
    removal and the addition direction. Integer orders use their Section 3.2 sum; fractional
    orders their Section 3.3 two-series expression, combined with a central Taylor expansion
    and Euler-accelerated tails with rigorous remainder bounds (see the module docstring).
    Every truncation errs upwards: the result is never below the true value beyond rounding.

    ``q = 1`` gives the plain Gaussian ``alpha / (2 sigma^2)`` exactly; ``q = 0`` gives 0;
    ``alpha = inf`` gives ``inf`` for ``q > 0``. Astronomically large values come back as large
    finite numbers or ``inf``, never NaN.

    Args:
        sampling_rate: q in [0, 1].
        noise_multiplier: sigma > 0 (finite).
        orders: one order or a 1-D array of orders, each > 1 (``inf`` allowed).

    Returns:
        One epsilon per order, in the order given (float64 array).

    Example:
        >>> eps = poisson_subsampled_gaussian_rdp(1.0, 2.0, [2.0, 3.5])
        >>> eps.tolist()
        [0.25, 0.4375]
    """
    q = check_probability("sampling_rate", sampling_rate)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    alphas = _validate_orders(orders)
    out = np.zeros(alphas.shape, dtype=np.float64)
    if q == 0.0:
        return out
    two_var = 2.0 * sigma * sigma
    c = 1.0 / two_var if two_var > 0.0 else math.inf
    if q == 1.0 or not math.isfinite(c):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = alphas / (2.0 * sigma * sigma)  # the plain Gaussian, alpha / (2 sigma^2)
        return np.where(np.isnan(out), np.inf, out)
    grid = _grid_split(alphas.tobytes())  # order-dependent only, cached per grid
    return _gaussian_rdp_on_grid(q, sigma, grid)[grid.inverse]


# --------------------------------------------------------------------------------------------
# Generic amplification of (epsilon, delta)-DP
# --------------------------------------------------------------------------------------------


def amplify_approx_dp_poisson(
    epsilon: float, delta: float, sampling_rate: float
) -> tuple[float, float]:
    """Amplification of (epsilon, delta)-DP by Poisson subsampling.

    If ``M`` is (epsilon, delta)-DP, running it on a Poisson sample of rate q is
    ``(log(1 + q (e^epsilon - 1)), q delta)``-DP: Balle, Barthe & Gaboardi 2018 ("Privacy
    amplification by subsampling: tight analyses via couplings and divergences", NeurIPS),
    Theorem 8 (Poisson subsampling, add/remove neighbours). Computed as
    ``log1p(q * expm1(epsilon))`` for ``epsilon <= 1`` (accurate for tiny q and epsilon) and as
    ``epsilon + log(q + (1 - q) e^-epsilon)`` above (no overflow: epsilon = 1000 gives
    ``1000 + log q``); ``epsilon = inf`` stays inf for ``q > 0``.

    Example:
        >>> eps, dlt = amplify_approx_dp_poisson(1.0, 1e-6, 0.01)
        >>> round(eps, 6), dlt
        (0.017037, 1e-08)
    """
    eps = check_nonnegative("epsilon", epsilon, allow_inf=True)
    dlt = check_range("delta", delta, 0.0, 1.0)
    q = check_probability("sampling_rate", sampling_rate)
    if q == 0.0:
        return 0.0, 0.0
    if math.isinf(eps):
        return math.inf, q * dlt
    if eps <= 1.0:
        return math.log1p(q * math.expm1(eps)), q * dlt
    return eps + math.log(q + (1.0 - q) * math.exp(-eps)), q * dlt


def amplify_approx_dp_without_replacement(
    epsilon: float, delta: float, population_size: int, sample_size: int
) -> tuple[float, float]:
    """Amplification of (epsilon, delta)-DP by sampling ``m`` of ``n`` records without replacement.

    With replace-one (substitution) neighbours, running an (epsilon, delta)-DP mechanism
    on a uniformly random subset of size ``m`` drawn without replacement from ``n`` records
    is ``(log(1 + (m/n)(e^epsilon - 1)), (m/n) delta)``-DP: Balle, Barthe & Gaboardi 2018,
    Theorem 9 (sampling without replacement, substitution relation).

    Example:
        >>> eps, dlt = amplify_approx_dp_without_replacement(1.0, 1e-6, 1000, 10)
        >>> round(eps, 6), dlt
        (0.017037, 1e-08)
    """
    n = check_int("population_size", population_size, minimum=1)
    m = check_int("sample_size", sample_size, minimum=0)
    if m > n:
        raise fail("sample_size", sample_size, f"an integer in [0, population_size={n}]")
    return amplify_approx_dp_poisson(epsilon, delta, m / n)


# --------------------------------------------------------------------------------------------
# Sampling without replacement, Gaussian (Wang, Balle & Kasiviswanathan 2019)
# --------------------------------------------------------------------------------------------


def sampled_without_replacement_gaussian_rdp(
    population_size: int, sample_size: int, noise_multiplier: float, orders: ArrayLike
) -> FloatArray:
    """RDP of the Gaussian mechanism run on ``m`` of ``n`` records drawn without replacement.

    Neighbouring relation: replace one record; ``noise_multiplier`` is the noise standard
    deviation over the L2 sensitivity under that relation, so the base mechanism has
    ``eps(j) = j / (2 sigma^2)`` and ``eps(inf) = inf``. Bound: Wang, Balle &
    Kasiviswanathan 2019 ("Subsampled Rényi differential privacy and analytical moments
    accountant", AISTATS, arXiv:1808.00087), Theorem 9 (general upper bound), with
    ``gamma = m / n``; at integer ``alpha >= 2``::

        eps'(alpha) <= log(1 + gamma^2 C(alpha, 2) min(4 (e^{eps(2)} - 1), 2 e^{eps(2)})
                           + sum_{j=3}^{alpha} 2 gamma^j C(alpha, j) e^{(j-1) eps(j)}) / (alpha - 1)

    (the factors ``min(2, (e^{eps(inf)} - 1)^j)`` of the theorem are 2 for the Gaussian).
    Fractional orders: ``(alpha - 1) eps(alpha)`` is convex in ``alpha`` and 0 at
    ``alpha = 1``, so it is bounded by the linear interpolation of the integer bounds at
    ``floor(alpha)`` and ``ceil(alpha)`` (with 0 at 1), the interpolation WBK describe
    (Section 3.3). ``alpha = inf`` gives ``inf`` when ``sample_size > 0``. The result is also
    capped by the unsampled Gaussian ``alpha / (2 sigma^2)``. (dp_accounting adds a
    Gaussian-specific refinement of the ``j >= 3`` terms and can be smaller at some orders.)

    Example:
        >>> eps = sampled_without_replacement_gaussian_rdp(60000, 256, 1.1, [2.0, 2.5, 3.0])
        >>> bool(eps[0] <= eps[1] <= eps[2])
        True
    """
    n = check_int("population_size", population_size, minimum=1)
    m = check_int("sample_size", sample_size, minimum=0)
    if m > n:
        raise fail("sample_size", sample_size, f"an integer in [0, population_size={n}]")
    sigma = check_positive("noise_multiplier", noise_multiplier)
    alphas = _validate_orders(orders)
    two_var = 2.0 * sigma * sigma
    if m == 0 or two_var == math.inf:  # nothing sampled, or eps(alpha) = alpha c underflows
        return np.zeros(alphas.shape, dtype=np.float64)
    gamma = m / n
    c = 1.0 / two_var if two_var > 0.0 else math.inf
    finite = np.isfinite(alphas)
    lo = np.floor(np.where(finite, alphas, 2.0))
    hi = np.ceil(np.where(finite, alphas, 2.0))
    ints = np.unique(np.concatenate([lo, hi]))
    ints = ints[ints >= 2]
    f = {1.0: 0.0}  # (alpha - 1) eps'(alpha) at integer alpha
    if math.isfinite(c) and ints.size:
        plan = _integer_plan(ints.tobytes())
        k = plan.k
        lg = math.log(gamma)
        # j = 2 term: gamma^2 C(alpha, 2) min(4 (e^{2c} - 1), 2 e^{2c}).
        # log(4 (e^{2c} - 1)) = log 4 + 2c + log(1 - e^{-2c}); log(2 e^{2c}) = log 2 + 2c.
        log_two = 2.0 * c + min(math.log(4.0) + math.log(-math.expm1(-2.0 * c)), math.log(2.0))
        terms = plan.lb + k * lg + math.log(2.0) + c * plan.kk  # j >= 3: (j-1) eps(j) = c j(j-1)
        terms = np.where(k == 2, plan.lb + 2 * lg + log_two, terms)
        terms = np.where(k == 0, 0.0, np.where(k == 1, -np.inf, terms))
        mags = plan.lb_mag - k * lg + c * plan.kk + 1.0
        with np.errstate(all="ignore"):
            vals = _ragged_lse(terms, plan.starts, plan.row, mags)
        f.update(zip(ints.tolist(), _pad(vals).tolist(), strict=True))
    elif ints.size:
        f.update(dict.fromkeys(ints.tolist(), math.inf))
    f_lo = np.array([f[x] for x in lo.tolist()])
    f_hi = np.array([f[x] for x in hi.tolist()])
    theta = alphas - lo
    with np.errstate(invalid="ignore", over="ignore"):
        interp = np.where(theta > 0, (1 - theta) * f_lo + theta * f_hi, f_lo)
        out = interp / (alphas - 1.0)
    out = np.where(finite, out, np.inf)
    out = np.where(np.isnan(out), np.inf, out)
    # Never above the mechanism without sampling (the samples differ in at most one record).
    with np.errstate(over="ignore", divide="ignore"):
        out = np.minimum(out, alphas / two_var)
    return np.asarray(out, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Generic RDP amplification by Poisson subsampling (Zhu & Wang 2019)
# --------------------------------------------------------------------------------------------


def poisson_subsampled_rdp(
    rdp_fn: Callable[[FloatArray], ArrayLike], sampling_rate: float, orders: ArrayLike
) -> FloatArray:
    """RDP of any mechanism run on a Poisson sample, from its RDP at integer orders.

    Neighbouring relation: add/remove one record (the relation ``rdp_fn`` must hold for).
    ``rdp_fn`` maps an array of integer orders ``2, 3, ...`` to the mechanism's RDP
    ``eps(l)`` (``inf`` allowed). Bound: Zhu & Wang 2019 ("Poisson subsampled Rényi
    differential privacy", ICML), Theorem 6 (general upper bound); at integer ``alpha >= 2``,
    with ``q`` the sampling rate::

        eps'(alpha) <= log((1-q)^(alpha-1) (alpha q - q + 1)
                           + C(alpha, 2) q^2 (1-q)^(alpha-2) e^{eps(2)}
                           + 3 sum_{l=3}^{alpha} C(alpha, l) (1-q)^(alpha-l) q^l e^{(l-1) eps(l)})
                       / (alpha - 1).

    Fractional orders are bounded conservatively by interpolating ``(alpha - 1) eps'(alpha)``
    linearly between ``floor(alpha)`` and ``ceil(alpha)`` (it is convex in ``alpha`` and 0
    at ``alpha = 1``). Each integer-order value is also capped by the mechanism's own
    ``eps(alpha)`` (no amplification is never worse). For the Gaussian, prefer the exact
    :func:`poisson_subsampled_gaussian_rdp`; this bound is above it (factor 3 on ``l >= 3``).

    Example:
        >>> eps = poisson_subsampled_rdp(lambda a: a / 2.0, 0.01, [2.0, 4.0])
        >>> bool(eps[0] < eps[1] < 2.0)
        True
    """
    q = check_probability("sampling_rate", sampling_rate)
    alphas = _validate_orders(orders)
    if not callable(rdp_fn):
        raise fail("rdp_fn", rdp_fn, "a callable mapping orders to RDP epsilons")
    if q == 0.0:
        return np.zeros(alphas.shape, dtype=np.float64)
    finite = np.isfinite(alphas)
    lo = np.floor(np.where(finite, alphas, 2.0))
    hi = np.ceil(np.where(finite, alphas, 2.0))
    ints = np.unique(np.concatenate([lo, hi]))
    ints = ints[ints >= 2]
    amax = int(ints.max()) if ints.size else 2
    ell = np.arange(2, amax + 1, dtype=np.float64)
    eps = np.asarray(rdp_fn(ell), dtype=np.float64).reshape(-1)
    if eps.shape != ell.shape or np.isnan(eps).any() or (eps < 0).any():
        raise fail("rdp_fn", rdp_fn, f"one epsilon >= 0 (not NaN) per order 2..{amax}")
    if q == 1.0:
        base = {1.0: 0.0, **{float(a): (a - 1) * e for a, e in zip(ell, eps, strict=True)}}
        f = base
    else:
        plan = _integer_plan(ints.tobytes())
        k = plan.k
        logq, log1mq = math.log(q), math.log1p(-q)
        e_k = np.concatenate([[0.0, 0.0], eps])[k.astype(np.intp)]
        with np.errstate(invalid="ignore"):
            terms = plan.lb + (plan.a - k) * log1mq + k * logq + (k - 1) * e_k
        terms = np.where(k >= 3, terms + math.log(3.0), terms)
        # k = 0 and k = 1 together give (1-q)^(alpha-1) (alpha q - q + 1): exact as they are.
        mags = plan.lb_mag - (plan.a - k) * log1mq - k * logq + (k - 1) * e_k
        with np.errstate(all="ignore"):
            vals = _pad(_ragged_lse(terms, plan.starts, plan.row, mags))
        # Never above the mechanism itself (exp((alpha-1) D_alpha) is jointly convex).
        vals = np.minimum(vals, (ints - 1.0) * eps[(ints - 2).astype(np.intp)])
        f = {1.0: 0.0, **dict(zip(ints.tolist(), vals.tolist(), strict=True))}
    f_lo = np.array([f[x] for x in lo.tolist()])
    f_hi = np.array([f[x] for x in hi.tolist()])
    theta = alphas - lo
    with np.errstate(invalid="ignore", over="ignore"):
        interp = np.where(theta > 0, (1 - theta) * f_lo + theta * f_hi, f_lo)
        out = interp / (alphas - 1.0)
    out = np.where(finite, out, np.inf)
    return np.asarray(np.where(np.isnan(out), np.inf, out), dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Truncated Poisson sampling (a fixed maximum batch size)
# --------------------------------------------------------------------------------------------


def truncation_probability(dataset_size: int, sampling_rate: float, max_batch_size: int) -> float:
    """The largest probability, over add/remove neighbours of a dataset of ``dataset_size``
    records, that the *other* records alone fill a truncated Poisson batch:
    ``P[Binomial(n, q) >= B]`` (``n`` others is the larger of ``n - 1`` and ``n``)."""
    from scipy.stats import binom

    return float(binom.sf(max_batch_size - 1, dataset_size, sampling_rate))


def truncated_poisson_gaussian_rdp(
    dataset_size: int,
    sampling_rate: float,
    max_batch_size: int,
    noise_multiplier: float,
    orders: ArrayLike,
) -> FloatArray:
    """RDP of the Gaussian on a truncated Poisson sample (add/remove neighbours).

    Each record joins with probability ``q``; a sample larger than ``B = max_batch_size`` is
    cut to a uniformly random subset of ``B`` (as jax_privacy's truncated Poisson sampling;
    dp_accounting's ``TruncatedSubsampledGaussianDpEvent``). Condition on ``j``, the number of
    *other* records sampled, whose law is the same with or without the differing record:

    * ``j < B``: no truncation, the pair is the Poisson-subsampled Gaussian (rate ``q``);
    * ``j >= B``: the record enters the batch w.p. ``q B / (j + 1) <= q B / (B + 1)`` and then
      replaces a random member: the sum moves by at most ``2C``, so the pair is dominated by
      the Poisson-subsampled Gaussian with rate ``q B/(B+1)`` and multiplier ``σ/2``.

    ``exp((α-1) D_α)`` is jointly convex in the pair, so for ``p = P[j >= B]``
    (:func:`truncation_probability`, the larger over the two neighbours)::

        D_α <= log((1 - p) e^((α-1) r1(α)) + p e^((α-1) r2(α))) / (α - 1)

    with ``r1``, ``r2`` the two Poisson-subsampled Gaussian curves
    (:func:`poisson_subsampled_gaussian_rdp`, valid in both directions). The bound is linear
    in ``p`` inside the log, so the larger ``p`` of the two neighbours covers both.
    """
    n = int(dataset_size)
    q = check_probability("sampling_rate", sampling_rate)
    b = int(max_batch_size)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    alphas = _validate_orders(orders)
    r1 = poisson_subsampled_gaussian_rdp(q, sigma, alphas)
    p = truncation_probability(n, q, b)
    if p == 0.0:
        return r1
    r2 = poisson_subsampled_gaussian_rdp(q * b / (b + 1.0), sigma / 2.0, alphas)
    r2 = np.maximum(r2, r1)  # never below the untruncated branch (keeps the bound monotone)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        am1 = alphas - 1.0
        log_mix = np.logaddexp(math.log1p(-p) + am1 * r1, math.log(p) + am1 * r2)
        out = log_mix / am1
    return np.where(np.isfinite(alphas) & ~np.isnan(out), out, np.inf)
