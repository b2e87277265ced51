"""Statistics of privacy auditing: confidence intervals and privacy *lower* bounds.

An audit runs a mechanism on two neighbouring inputs, applies a test ("is the output in the
set S?") and counts how often the test fires under each input. Differential privacy bounds
what any test can achieve, so observed rates that no ``(epsilon, delta)``-DP mechanism could
produce prove a lower bound on the mechanism's privacy loss. Every function here turns
counts into a bound that holds with a stated confidence: for an audit the safe side is the
*low* side (a lower bound must not exceed the truth beyond its stated confidence).

* :func:`clopper_pearson`: exact binomial confidence bounds (Clopper & Pearson 1934), via
  ``scipy.stats.beta.ppf``.
* :func:`epsilon_from_rates`: the largest epsilon that false-positive and false-negative
  rates rule out, from the hypothesis-testing characterisation of DP (Kairouz, Oh &
  Viswanath 2015, Thm. 2.1; used for auditing by Jagielski, Ullman & Oprea 2020, Sec. 4 and
  Nasr et al. 2021, Sec. 3): every test of an ``(epsilon, delta)``-DP mechanism satisfies
  ``FPR + e^eps FNR >= 1 - delta`` and ``FNR + e^eps FPR >= 1 - delta``.
* :func:`epsilon_lower_bound`: the same from counts, with Clopper-Pearson upper bounds on
  both rates (union bound: confidence ``1 - beta`` overall).
* :func:`renyi_lower_bound`: a lower bound on the Rényi divergence of the two output
  distributions at chosen orders, by the data-processing inequality (van Erven & Harremoës
  2014, Thm. 9) applied to the test, minimised over the confidence box of its two rates.
* :func:`one_run_epsilon_lower_bound`: the one-run audit of Steinke, Nasr & Jagielski 2023
  (arXiv:2305.08846, Thm. 3.1 / Appendix D): from ``v`` correct guesses out of ``r`` on ``m``
  canaries each included independently with probability 1/2.
* :func:`tradeoff_curve`: the smallest FNR an ``(epsilon, delta)``-DP mechanism allows at a
  given FPR (the DP trade-off curve of Dong, Roth & Su 2019, Prop. 2.5; Kairouz et al. 2015).

Example:
    >>> b = epsilon_lower_bound(fp=50, negatives=1000, fn=50, positives=1000, delta=0.0)
    >>> 2.0 < b.epsilon < float(np.log(950 / 50))
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

from renyi._validation import check_int, check_orders, check_range, fail
from renyi.analysis.divergence import renyi_divergence

__all__ = [
    "EpsilonLowerBound",
    "clopper_pearson",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
    "renyi_lower_bound",
    "tradeoff_curve",
]

FloatArray = NDArray[np.float64]


def _check_confidence(confidence: Any) -> float:
    return check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)


def _check_counts(k: Any, n: Any, k_name: str, n_name: str) -> tuple[NDArray[np.int64], Any]:
    ka = np.asarray(k)
    na = np.asarray(n)
    for name, arr in ((k_name, ka), (n_name, na)):
        if arr.dtype.kind not in "iu":
            raise fail(name, k if name == k_name else n, "integer counts")
    if (ka < 0).any() or (na < 1).any() or (ka > na).any():
        raise fail(k_name, k, f"integer counts with 0 <= {k_name} <= {n_name} and {n_name} >= 1")
    return ka.astype(np.int64), na.astype(np.int64)


def clopper_pearson(
    k: ArrayLike, n: ArrayLike, confidence: float = 0.95, side: str = "two-sided"
) -> tuple[FloatArray, FloatArray]:
    """Exact (Clopper-Pearson 1934) confidence bounds on a binomial proportion.

    With ``k`` successes in ``n`` trials, returns ``(lower, upper)`` such that the true
    proportion lies in ``[lower, upper]`` with probability at least ``confidence`` (over the
    draw of ``k``), for every true proportion. ``side="upper"`` gives a one-sided bound at
    ``confidence`` (``lower`` is 0); ``side="lower"`` the mirror; ``"two-sided"`` puts
    ``(1 - confidence) / 2`` in each tail. Vectorised over ``k`` and ``n``.

    Example:
        >>> lo, hi = clopper_pearson(0, 100, 0.95, side="upper")
        >>> round(float(hi), 4)  # 1 - 0.05**(1/100)
        0.0295
    """
    c = _check_confidence(confidence)
    if side not in ("two-sided", "upper", "lower"):
        raise fail("side", side, "'two-sided', 'upper' or 'lower'")
    ka, na = _check_counts(k, n, "k", "n")
    tail = (1.0 - c) / 2.0 if side == "two-sided" else 1.0 - c
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.where(ka > 0, stats.beta.ppf(tail, ka, na - ka + 1), 0.0)
        hi = np.where(ka < na, stats.beta.ppf(1.0 - tail, ka + 1, na - ka), 1.0)
    if side == "upper":
        lo = np.zeros_like(lo)
    elif side == "lower":
        hi = np.ones_like(hi)
    return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)


def epsilon_from_rates(fpr: ArrayLike, fnr: ArrayLike, delta: float = 0.0) -> FloatArray:
    """The largest epsilon ruled out by a test with rates ``fpr`` and ``fnr`` at ``delta``.

    Any test of an ``(epsilon, delta)``-DP mechanism on a neighbouring pair has
    ``FPR + e^eps FNR >= 1 - delta`` and ``FNR + e^eps FPR >= 1 - delta`` (Kairouz, Oh &
    Viswanath 2015, Thm. 2.1). So ``eps >= max(log((1 - delta - FPR) / FNR),
    log((1 - delta - FNR) / FPR))``; returned clipped below at 0 (``+inf`` when a rate is 0
    and the other below ``1 - delta``). Pass *upper* confidence bounds on the rates to get a
    high-confidence lower bound (see :func:`epsilon_lower_bound`). Vectorised.

    Example:
        >>> round(float(epsilon_from_rates(0.25, 0.25)), 12)  # RR, truth w.p. 3/4: log 3
        1.098612288668
    """
    d = check_range("delta", delta, 0.0, 1.0, high_open=True)
    a = np.asarray(fpr, dtype=np.float64)
    b = np.asarray(fnr, dtype=np.float64)
    if not (np.all((a >= 0) & (a <= 1)) and np.all((b >= 0) & (b <= 1))):
        raise fail("fpr/fnr", (fpr, fnr), "rates in [0, 1]")
    with np.errstate(divide="ignore", invalid="ignore"):
        num_a = np.log(np.maximum(1.0 - d - a, 0.0))  # pairs with fnr
        num_b = np.log(np.maximum(1.0 - d - b, 0.0))  # pairs with fpr
        e1 = np.where(num_a > -np.inf, num_a - np.log(b), -np.inf)
        e2 = np.where(num_b > -np.inf, num_b - np.log(a), -np.inf)
    out = np.maximum(np.maximum(e1, e2), 0.0)
    return np.asarray(out, dtype=np.float64)


@dataclass(frozen=True)
class EpsilonLowerBound:
    """A high-confidence lower bound on epsilon from one test's error counts.

    Attributes:
        epsilon: the lower bound (0 when the counts rule nothing out).
        delta: the delta it is stated at.
        confidence: probability (over the audit's randomness) that the mechanism's true
            epsilon at ``delta`` is at least ``epsilon``.
        fpr, fnr: the observed rates; fpr_upper, fnr_upper: their one-sided
            Clopper-Pearson upper bounds at ``1 - (1 - confidence) / 2`` each.
    """

    epsilon: float
    delta: float
    confidence: float
    fpr: float
    fnr: float
    fpr_upper: float
    fnr_upper: float


def epsilon_lower_bound(
    fp: int, negatives: int, fn: int, positives: int, delta: float = 0.0, confidence: float = 0.95
) -> EpsilonLowerBound:
    """High-confidence epsilon lower bound from a test's false positives and negatives.

    ``fp`` of ``negatives`` runs on input ``x0`` made the test fire (false positives);
    ``fn`` of ``positives`` runs on ``x1`` did not (false negatives). Both rates are replaced
    by one-sided Clopper-Pearson upper bounds at level ``1 - beta/2`` (``beta = 1 -
    confidence``), then converted by :func:`epsilon_from_rates`: by the union bound, the
    mechanism's true epsilon at ``delta`` is at least the result with probability
    ``>= confidence`` (Jagielski et al. 2020, Alg. 2; Nasr et al. 2021, Sec. 3). The test
    must be chosen *before* seeing these counts (e.g. on a separate sample).

    Example:
        >>> b = epsilon_lower_bound(250, 1000, 250, 1000)  # true RR epsilon log 3 = 1.0986
        >>> 0.8 < b.epsilon < 1.0986
        True
    """
    c = _check_confidence(confidence)
    d = check_range("delta", delta, 0.0, 1.0, high_open=True)
    n0 = check_int("negatives", negatives, 1)
    n1 = check_int("positives", positives, 1)
    k0 = check_int("fp", fp, 0)
    k1 = check_int("fn", fn, 0)
    if k0 > n0:
        raise fail("fp", fp, f"an integer in [0, negatives={n0}]")
    if k1 > n1:
        raise fail("fn", fn, f"an integer in [0, positives={n1}]")
    each = 1.0 - (1.0 - c) / 2.0
    _, a_hi = clopper_pearson(k0, n0, each, side="upper")
    _, b_hi = clopper_pearson(k1, n1, each, side="upper")
    eps = float(epsilon_from_rates(float(a_hi), float(b_hi), d))
    if eps > 0 and math.isfinite(eps):
        eps = math.nextafter(eps, 0.0)  # conservative for an audit: round down
    return EpsilonLowerBound(eps, d, c, k0 / n0, k1 / n1, float(a_hi), float(b_hi))


def _binary_divergence(p: float, q: float, orders: FloatArray) -> FloatArray:
    if p == q:
        return np.zeros_like(orders)
    out = renyi_divergence([p, 1.0 - p], [q, 1.0 - q], orders, tol=1e-9)
    return np.asarray(out, dtype=np.float64)


def renyi_lower_bound(
    k0: int, n0: int, k1: int, n1: int, orders: ArrayLike, confidence: float = 0.95
) -> FloatArray:
    """High-confidence lower bound on ``max(D_a(P0 || P1), D_a(P1 || P0))`` at each order.

    ``k0`` of ``n0`` runs on ``x0`` and ``k1`` of ``n1`` on ``x1`` fell in a set ``S`` fixed
    in advance. By data processing (van Erven & Harremoës 2014, Thm. 9),
    ``D_a(P0 || P1) >= D_a(Bern(P0(S)) || Bern(P1(S)))``. Two-sided Clopper-Pearson
    intervals (each at ``1 - beta/2``) hold both probabilities with joint confidence
    ``>= 1 - beta``; the binary divergence is quasi-convex and zero on the diagonal, so its
    minimum over the box is at the corner nearest the diagonal (0 if the intervals overlap).
    A mechanism that is ``(a, eps(a))``-RDP for a neighbouring relation containing both
    ordered pairs has ``eps(a) >=`` the result (Mironov 2017, Def. 4). Returns one value per
    order (orders > 1, ``inf`` allowed).

    Example:
        >>> lb = renyi_lower_bound(250, 10000, 750, 10000, [2.0])
        >>> exact = float(np.log(0.75**2 / 0.25 + 0.25**2 / 0.75))  # RR p=3/4, alpha=2
        >>> bool(0.0 < lb[0] < exact)
        True
    """
    c = _check_confidence(confidence)
    a = check_orders(orders)
    n0_ = check_int("n0", n0, 1)
    n1_ = check_int("n1", n1, 1)
    k0_ = check_int("k0", k0, 0)
    k1_ = check_int("k1", k1, 0)
    if k0_ > n0_:
        raise fail("k0", k0, f"an integer in [0, n0={n0_}]")
    if k1_ > n1_:
        raise fail("k1", k1, f"an integer in [0, n1={n1_}]")
    each = 1.0 - (1.0 - c) / 2.0
    lo0_a, hi0_a = clopper_pearson(k0_, n0_, each)
    lo1_a, hi1_a = clopper_pearson(k1_, n1_, each)
    lo0, hi0, lo1, hi1 = float(lo0_a), float(hi0_a), float(lo1_a), float(hi1_a)
    if lo0 > hi1:  # P0(S) > P1(S) for sure: nearest corner (lo0, hi1)
        p, q = lo0, hi1
    elif lo1 > hi0:
        p, q = hi0, lo1
    else:
        return np.zeros_like(a)
    out = np.maximum(_binary_divergence(p, q, a), _binary_divergence(q, p, a))
    # conservative for an audit: step each finite positive value down by a relative 1e-12
    return np.where(np.isfinite(out), out * (1.0 - 1e-12), out)


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """P-value of ``>= v`` correct guesses out of ``r`` if the mechanism were ``(eps, delta)``-DP.

    Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846), Thm. 3.1: with ``m`` canaries, each
    included independently with probability 1/2, and any guesses (``r`` non-abstentions) made
    from the output of an ``(epsilon, delta)``-DP algorithm, the number ``W`` of correct
    guesses satisfies ``P[W >= v] <= f(v) + 2 m delta max_{1<=i<=v} (f(v - i) - f(v)) / i``
    with ``f(u) = P[Binomial(r, e^eps / (1 + e^eps)) >= u]``. Returns that bound (capped at 1).

    Example:
        >>> round(one_run_p_value(100, 100, 50, 0.0), 4)  # P[Bin(100, 1/2) >= 50]
        0.5398
    """
    m_ = check_int("m", m, 1)
    r_ = check_int("r", r, 0)
    v_ = check_int("v", v, 0)
    if r_ > m_:
        raise fail("r", r, f"an integer in [0, m={m_}]")
    if v_ > r_:
        raise fail("v", v, f"an integer in [0, r={r_}]")
    e = check_range("epsilon", epsilon, 0.0, math.inf)
    d = check_range("delta", delta, 0.0, 1.0)
    q = 1.0 / (1.0 + math.exp(-e)) if math.isfinite(e) else 1.0
    tail = float(stats.binom.sf(v_ - 1, r_, q))
    if d == 0.0 or v_ == 0:
        return min(tail, 1.0)
    # f(v - i) - f(v) = P[v - i <= Bin < v] = cumulative pmf from v-1 down to v-i
    pmf = stats.binom.pmf(np.arange(v_ - 1, -1, -1), r_, q)
    gaps = np.cumsum(pmf) / np.arange(1, v_ + 1)
    return min(tail + 2.0 * m_ * d * float(gaps.max()), 1.0)


def one_run_epsilon_lower_bound(
    m: int, r: int, v: int, delta: float = 0.0, confidence: float = 0.95
) -> float:
    """Epsilon lower bound of the one-run audit (Steinke, Nasr & Jagielski 2023, Sec. 3).

    The largest epsilon (found by bisection and then *verified*) such that
    :func:`one_run_p_value` ``(m, r, v, epsilon, delta) <= 1 - confidence``: if the
    algorithm were ``(epsilon', delta)``-DP for any ``epsilon' <=`` the result, ``v`` or
    more correct guesses would have had probability at most ``1 - confidence``. So the
    algorithm's true epsilon at ``delta`` is at least the result with confidence
    ``confidence``. Returns 0 when even epsilon = 0 is not rejected.

    Example:
        >>> eps = one_run_epsilon_lower_bound(1000, 100, 95, confidence=0.95)
        >>> 1.5 < eps < float(np.log(95 / 5))
        True
    """
    c = _check_confidence(confidence)
    beta = 1.0 - c
    if one_run_p_value(m, r, v, 0.0, delta) > beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) <= beta:
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:
            return lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if one_run_p_value(m, r, v, mid, delta) <= beta:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-9 * max(1.0, lo):
            break
    # verification: the reported value is rejected at level beta (lo maintains this)
    if one_run_p_value(m, r, v, lo, delta) > beta:  # pragma: no cover - invariant
        return 0.0
    return lo


def tradeoff_curve(epsilon: float, delta: float, fpr: ArrayLike) -> FloatArray:
    """Smallest false-negative rate an ``(epsilon, delta)``-DP mechanism allows at ``fpr``.

    ``f(a) = max(0, 1 - delta - e^eps a, e^-eps (1 - delta - a))`` (Kairouz, Oh & Viswanath
    2015, Thm. 2.1; Dong, Roth & Su 2019, Prop. 2.5). An attack's ROC point
    ``(FPR, 1 - FNR)`` above ``(a, 1 - f(a))`` contradicts the claim.

    Example:
        >>> tradeoff_curve(0.0, 0.0, [0.25]).tolist()
        [0.75]
    """
    e = check_range("epsilon", epsilon, 0.0, math.inf)
    d = check_range("delta", delta, 0.0, 1.0)
    a = np.asarray(fpr, dtype=np.float64)
    if not np.all((a >= 0) & (a <= 1)):
        raise fail("fpr", fpr, "rates in [0, 1]")
    if math.isinf(e):
        return np.zeros_like(a)
    f = np.maximum(1.0 - d - math.exp(min(e, 700.0)) * a, math.exp(-e) * (1.0 - d - a))
    return np.asarray(np.maximum(f, 0.0), dtype=np.float64)
