"""One-run audits against a trade-off curve: the f-DP bound of Mahloujifar, Melis & Chaudhuri.

The one-run audit of Steinke, Nasr & Jagielski 2023 (:func:`renyi.audit.stats.
one_run_epsilon_lower_bound`) tests an ``(epsilon, delta)`` claim; its ``delta`` term grows
with the number of canaries ``m`` (``2 m delta``), which caps what one run can show at small
``delta``. Mahloujifar, Melis & Chaudhuri ("Auditing f-differential privacy in one run",
ICML 2025, arXiv:2410.22235) test a whole trade-off curve ``f`` instead: the mechanism is
``f``-DP with respect to every canary (the canaries are included independently with
probability 1/2), the auditor guesses "in" for ``k`` canaries and ``c`` of those guesses
are right. Their analysis (Sec. 4, the numerical procedure they call "audit with cap";
jax_privacy ships the same procedure as ``epsilon_one_run_fdp``) walks down from ``c`` correct
guesses with two running quantities, ``r`` (correct) and ``h`` (incorrect), both started at
``tau * count / m``::

    for i = c - 1, ..., 0:
        h' = max(h, f_inv(r))            # f_inv(x): least FPR of a test whose TPR is x
        r  = min(r + i / (k - i) * (h' - h), 1);  h = h'

If the final ``r + h`` exceeds ``k / m`` (the fraction of canaries guessed), ``c`` or more
correct guesses had probability below ``tau`` for every ``f``-DP mechanism: the claim is
refuted at confidence ``1 - tau``.

Functions here:

* :func:`fdp_refutes`: that test for any inverse trade-off function ``f_inv``.
* :func:`gaussian_inverse_tradeoff` / :func:`curve_inverse_tradeoff`: ``f_inv`` for mu-GDP
  (exact: ``Phi(Phi^-1(x) - mu)``) and for a claimed curve from :mod:`renyi.tradeoff`
  (TPR upper bounds on a grid, inverted conservatively).
* :func:`gdp_mu_lower_bound`: the largest ``mu`` such that the run refutes mu-GDP (found by
  bisection and verified): the "empirical privacy" of the one-run f-DP audit.
* :func:`gdp_epsilon_lower_bound`: that ``mu`` as ``epsilon`` at ``delta`` (Balle & Wang
  2018): the epsilon a Gaussian mechanism would need to explain the guesses. This reads
  a refuted *Gaussian* curve as an epsilon; it is a bound on the mechanism's epsilon only
  among mechanisms whose trade-off curve is Gaussian (as DP-SGD's is for full batches), and
  is labelled so everywhere it is reported.
* :func:`gdp_samples_mu_lower_bound`: the same question for *independent* releases with
  and without a canary (not one run): a held-out threshold test whose Clopper-Pearson
  rates refute mu-GDP. Far more powerful than an ``(epsilon, delta)`` bound at small
  ``delta`` when the claim is a Gaussian curve (one unamplified Gaussian step).

Example:
    >>> round(gdp_mu_lower_bound(m=1000, guesses=100, correct=100, confidence=0.95), 3)
    1.226
    >>> fdp_refutes(1000, 100, 100, gaussian_inverse_tradeoff(1.0), confidence=0.95)
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import ndtr, ndtri

from renyi._validation import check_delta, check_int, check_nonnegative, check_range, fail
from renyi.analysis.closed_forms import gaussian_epsilon

__all__ = [
    "curve_inverse_tradeoff",
    "fdp_refutes",
    "gaussian_inverse_tradeoff",
    "gdp_epsilon_lower_bound",
    "gdp_mu_lower_bound",
    "gdp_samples_mu_lower_bound",
]

InverseTradeoff = Callable[[float], float]


def gaussian_inverse_tradeoff(mu: float) -> InverseTradeoff:
    """``f_inv`` of mu-GDP: the least FPR of any test with TPR ``x`` is ``Phi(Phi^-1(x) - mu)``
    (the Gaussian trade-off curve ``1 - G_mu(a) = Phi(Phi^-1(a) + mu)`` inverted; Dong, Roth &
    Su 2022). ``mu = inf`` allows every TPR at FPR 0.

    Example:
        >>> round(gaussian_inverse_tradeoff(0.0)(0.3), 12)
        0.3
    """
    m = check_nonnegative("mu", mu, allow_inf=True)
    if math.isinf(m):
        return lambda x: 0.0 if x < 1.0 else 1.0

    def f_inv(x: float) -> float:
        if x <= 0.0:
            return 0.0
        if x >= 1.0:
            return 1.0
        return float(ndtr(ndtri(x) - m))

    return f_inv


def curve_inverse_tradeoff(fpr: ArrayLike, tpr: ArrayLike) -> InverseTradeoff:
    """``f_inv`` of a claimed curve given as TPR *upper bounds* ``tpr`` at rates ``fpr``.

    For :class:`renyi.tradeoff.TradeoffCurve` (``curve.fpr``, ``curve.tpr``). The inverse is
    taken on the safe side for an audit: for a TPR ``x`` it returns the largest grid FPR whose
    bound is still below ``x`` (the true least FPR is larger: the curve is a bound and
    non-decreasing), so a coarse grid can only weaken the audit, never make it refute a
    true claim.

    Example:
        >>> f_inv = curve_inverse_tradeoff([0.0, 0.1, 0.5, 1.0], [0.0, 0.3, 0.8, 1.0])
        >>> f_inv(0.5), f_inv(0.2), f_inv(1.0)
        (0.1, 0.0, 0.5)
    """
    a = np.asarray(fpr, dtype=np.float64).reshape(-1)
    t = np.asarray(tpr, dtype=np.float64).reshape(-1)
    if a.size == 0 or a.shape != t.shape or np.any(np.diff(a) < 0):
        raise fail("fpr/tpr", (a.shape, t.shape), "two equal-length arrays, fpr non-decreasing")
    if np.any((a < 0) | (a > 1) | (t < 0) | (t > 1)) or not np.all(np.isfinite(a + t)):
        raise fail("fpr/tpr", "values", "rates in [0, 1]")
    t = np.maximum.accumulate(t)  # a bound of a non-decreasing curve

    def f_inv(x: float) -> float:
        if x <= 0.0:
            return 0.0
        below = np.flatnonzero(t < x)
        return float(a[below[-1]]) if below.size else 0.0

    return f_inv


def fdp_refutes(
    m: int, guesses: int, correct: int, f_inv: InverseTradeoff, confidence: float = 0.95
) -> bool:
    """Whether ``correct`` right guesses out of ``guesses`` on ``m`` canaries refute ``f``-DP.

    The test of Mahloujifar, Melis & Chaudhuri 2025 (module docstring): ``True`` means that
    for every mechanism that is ``f``-DP with respect to each canary (each included
    independently with probability 1/2), so many correct guesses had probability at most
    ``1 - confidence``. Guesses must be made from the mechanism's output alone (e.g. the top
    scores), before the inclusion is revealed.

    Example:
        >>> fdp_refutes(1000, 100, 55, gaussian_inverse_tradeoff(0.0))  # 55 of 100: chance
        False
    """
    m_ = check_int("m", m, 1)
    k = check_int("guesses", guesses, 0)
    c = check_int("correct", correct, 0)
    if k > m_:
        raise fail("guesses", guesses, f"an integer in [0, m={m_}]")
    if c > k:
        raise fail("correct", correct, f"an integer in [0, guesses={k}]")
    conf = check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    if c == 0:
        return False
    tau = 1.0 - conf
    r = tau * c / m_
    h = tau * (k - c) / m_
    for i in range(c - 1, -1, -1):
        h_next = max(h, f_inv(r))
        if h_next == h:  # nothing moves any more
            break
        r = min(r + i / (k - i) * (h_next - h), 1.0)
        h = h_next
    return r + h > k / m_


def gdp_mu_lower_bound(m: int, guesses: int, correct: int, confidence: float = 0.95) -> float:
    """The largest ``mu`` whose mu-GDP the guesses refute (0 if even ``mu = 0`` stands).

    Bisection on :func:`fdp_refutes` with :func:`gaussian_inverse_tradeoff` (refutation is
    monotone in ``mu``: a larger ``mu`` allows more); the returned value is verified to be
    refuted, so the bound is on the safe (low) side. Holds with probability
    ``>= confidence`` over the canaries' inclusion.

    Example:
        >>> gdp_mu_lower_bound(1000, 100, 50)
        0.0
    """

    def refuted(mu: float) -> bool:
        return fdp_refutes(m, guesses, correct, gaussian_inverse_tradeoff(mu), confidence)

    if not refuted(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while refuted(hi):
        lo, hi = hi, 2.0 * hi
        if hi > 64.0:  # every guess right with enough canaries: beyond any useful mu
            return lo
    while hi - lo > 1e-6 * max(1.0, lo):
        mid = 0.5 * (lo + hi)
        if refuted(mid):
            lo = mid
        else:
            hi = mid
    if not refuted(lo):  # pragma: no cover - bisection keeps lo refuted
        return 0.0
    return lo


def gdp_epsilon_lower_bound(
    m: int, guesses: int, correct: int, delta: float, confidence: float = 0.95
) -> float:
    """``epsilon`` at ``delta`` of the strongest Gaussian curve the guesses refute.

    ``gaussian_epsilon(gdp_mu_lower_bound(...), delta)`` (Balle & Wang 2018, Thm. 8),
    stepped down by a relative ``1e-9``. A lower bound on the mechanism's epsilon among
    mechanisms with a Gaussian trade-off curve (module docstring); what Mahloujifar et al.
    and jax_privacy report as the one-run f-DP "empirical epsilon".

    Example:
        >>> gdp_epsilon_lower_bound(1000, 100, 50, 1e-5)
        0.0
    """
    d = check_delta(delta)
    mu = gdp_mu_lower_bound(m, guesses, correct, confidence)
    if mu <= 0.0:
        return 0.0
    return float(gaussian_epsilon(mu, d)) * (1.0 - 1e-9)


def gdp_samples_mu_lower_bound(
    y0: ArrayLike, y1: ArrayLike, confidence: float = 0.95
) -> tuple[float, dict[str, float]]:
    """A lower bound on ``mu`` from independent releases without (``y0``) and with (``y1``)
    a canary: every mu-GDP mechanism has ``mu >= `` the returned value with probability at
    least ``confidence`` (0 when nothing is refuted).

    The test (a held-out threshold attack): for every test ``phi`` of a mu-GDP pair,
    ``TPR <= Phi(Phi^-1(FPR) + mu)`` (Dong, Roth & Su 2022), i.e. ``Phi^-1(TPR) -
    Phi^-1(FPR) <= mu``. The even-indexed samples choose, in each direction ("in" above or
    below the threshold), the threshold whose Clopper-Pearson bounds give the largest such
    gap; the odd-indexed samples then bound that threshold's FPR from above and TPR from
    below (Clopper-Pearson, ``(1 - confidence) / 4`` for each of the four bounds), and
    ``Phi^-1(TPR_low) - Phi^-1(FPR_high)`` is the bound. Valid for any claimed ``mu``
    because the threshold never sees the samples that test it.

    Returns ``(mu_lower_bound, details)`` with the chosen threshold's counts.

    Example:
        >>> gen = np.random.default_rng(0)
        >>> mu, _ = gdp_samples_mu_lower_bound(gen.normal(size=20000),
        ...                                    1 + gen.normal(size=20000), 0.999)
        >>> 0.8 < mu < 1.0  # a 1-GDP pair: never above 1 (at this confidence)
        True
    """
    from renyi.audit.stats import clopper_pearson

    a = np.asarray(y0, dtype=np.float64).reshape(-1)
    b = np.asarray(y1, dtype=np.float64).reshape(-1)
    if a.size < 8 or b.size < 8 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise fail("y0/y1", (a.size, b.size), "at least 8 finite releases on each side")
    conf = check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    each = 1.0 - (1.0 - conf) / 4.0
    levels = np.linspace(0.01, 0.99, 99)
    best: tuple[float, dict[str, float]] = (0.0, {})
    for sign in (1.0, -1.0):
        tr0, te0 = sign * a[0::2], sign * a[1::2]
        tr1, te1 = sign * b[0::2], sign * b[1::2]
        cuts = np.unique(np.quantile(np.concatenate([tr0, tr1]), levels))
        k0 = (tr0[:, None] > cuts).sum(axis=0)
        k1 = (tr1[:, None] > cuts).sum(axis=0)
        _, f_hi = clopper_pearson(k0, tr0.size, each, side="upper")
        t_lo, _ = clopper_pearson(k1, tr1.size, each, side="lower")
        with np.errstate(divide="ignore", invalid="ignore"):
            gap = np.nan_to_num(ndtri(t_lo) - ndtri(f_hi), nan=-np.inf)
        cut = cuts[int(np.argmax(gap))]
        c0, c1 = int((te0 > cut).sum()), int((te1 > cut).sum())
        _, fpr_hi = clopper_pearson(c0, te0.size, each, side="upper")
        tpr_lo, _ = clopper_pearson(c1, te1.size, each, side="lower")
        with np.errstate(divide="ignore", invalid="ignore"):
            mu = float(ndtri(float(tpr_lo[()])) - ndtri(float(fpr_hi[()])))
        if math.isfinite(mu) and mu > best[0]:
            best = (
                mu * (1.0 - 1e-9),
                {
                    "direction": sign,
                    "threshold": float(sign * cut),
                    "fpr_high": float(fpr_hi[()]),
                    "tpr_low": float(tpr_lo[()]),
                    "test_without": float(te0.size),
                    "test_with": float(te1.size),
                },
            )
    return best
