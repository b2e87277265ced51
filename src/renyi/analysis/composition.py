"""Composition of ``(epsilon, delta)``-DP guarantees, and the book chapter's comparison.

Every theorem here bounds the k-fold *adaptive* sequential composition of mechanisms, each
``(epsilon, delta)``-DP with respect to the same neighbouring relation (e.g. add/remove one
record); the composed guarantee holds for that same relation.

* :func:`compose_basic`: epsilons and deltas add (Dwork & Roth 2014, Theorem 3.16).
* :func:`compose_advanced`: Dwork, Rothblum & Vadhan 2010 (Dwork & Roth 2014, Theorem 3.20),
  never worse than basic composition.
* :func:`optimal_composition_delta` / :func:`compose_optimal`: the exact optimum for k-fold
  homogeneous composition (Kairouz, Oh & Viswanath 2015, Theorem 3.3).
* :func:`compose_rdp_advanced`: Mironov 2017, Corollary 1 (advanced composition via RDP).
* :func:`compare_gaussian_composition`: epsilon after k Gaussian releases under every method
  (the comparison of the "Variants of Differential Privacy" book chapter, last figure), with
  the exact value of the analytic Gaussian as ground truth.
* :func:`vectorised_vs_sequential_noise`: the chapter's "noise vs number of queries" plots.

Example:
    >>> adv = compose_advanced(0.01, 1e-7, 1000, 1e-6)
    >>> adv.epsilon < compose_basic([ApproxDp(0.01, 1e-7)] * 1000).epsilon
    True
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import scipy
from numpy.typing import ArrayLike, NDArray
from scipy.special import logsumexp

from renyi._validation import (
    check_delta,
    check_int,
    check_nonnegative,
    check_positive,
    check_range,
    fail,
)
from renyi.analysis import closed_forms, conversions
from renyi.analysis.curves import DEFAULT_ORDERS, ApproxDp, PureDp, RdpCurve
from renyi.errors import OrderAtGridEdgeWarning

__all__ = [
    "GaussianCompositionComparison",
    "NoiseComparison",
    "compare_gaussian_composition",
    "compose_advanced",
    "compose_basic",
    "compose_optimal",
    "compose_rdp_advanced",
    "drv_epsilon",
    "optimal_composition_delta",
    "vectorised_vs_sequential_noise",
]

FloatArray = NDArray[np.float64]

# Relative safety margin on the KOV delta, covering floating-point error in logsumexp/expm1.
_DELTA_ROUND_UP = 1e-12


# ---------------------------------------------------------------------------------------------
# basic and advanced composition
# ---------------------------------------------------------------------------------------------


def compose_basic(guarantees: Iterable[PureDp | ApproxDp]) -> ApproxDp:
    """Basic composition: ``(sum eps_i, sum delta_i)``-DP (Dwork & Roth 2014, Theorem 3.16).

    Accepts any iterable of :class:`~renyi.analysis.curves.PureDp` (``delta = 0``) and
    :class:`~renyi.analysis.curves.ApproxDp`, composed adaptively; the sum of deltas is capped at 1
    (every mechanism is ``(eps, 1)``-DP). An empty iterable gives ``(0, 0)``.

    Example:
        >>> compose_basic([PureDp(0.5), ApproxDp(0.25, 1e-6)])
        ApproxDp(epsilon=0.75, delta=1e-06)
    """
    eps: list[float] = []
    deltas: list[float] = []
    for i, g in enumerate(guarantees):
        if isinstance(g, PureDp):
            eps.append(g.epsilon)
        elif isinstance(g, ApproxDp):
            eps.append(g.epsilon)
            deltas.append(g.delta)
        else:
            raise fail(f"guarantees[{i}]", g, "a PureDp or ApproxDp")
    return ApproxDp(math.fsum(eps), min(math.fsum(deltas), 1.0))


def drv_epsilon(epsilon: float, k: int, delta_prime: float) -> float:
    """The epsilon of Dwork, Rothblum & Vadhan's advanced composition theorem.

    ``eps sqrt(2 k log(1/delta')) + k eps (e^eps - 1)`` (Dwork, Rothblum & Vadhan 2010,
    Theorem III.3; Dwork & Roth 2014, Theorem 3.20): the k-fold adaptive composition of
    ``(eps, delta)``-DP mechanisms is ``(this, k delta + delta')``-DP. Prefer
    :func:`compose_advanced`, which also checks basic composition.

    Example:
        >>> round(drv_epsilon(0.1, 100, 1e-5), 4)
        5.8502
    """
    e = check_nonnegative("epsilon", epsilon)
    n = check_int("k", k, 1)
    dp = check_delta(delta_prime, "delta_prime")
    if e > 700.0:  # e^eps overflows: the bound is vacuous (basic composition is better)
        return math.inf
    return e * math.sqrt(2.0 * n * -math.log(dp)) + n * e * math.expm1(e)


def compose_advanced(epsilon: float, delta: float, k: int, delta_prime: float) -> ApproxDp:
    """k-fold advanced composition (Dwork, Rothblum & Vadhan 2010; Dwork & Roth 2014, Thm 3.20).

    The k-fold adaptive composition of ``(epsilon, delta)``-DP mechanisms is
    ``(eps', k delta + delta')``-DP with ``eps' =`` :func:`drv_epsilon`. Basic composition
    ``(k epsilon, k delta)`` is also valid; when ``k epsilon <= eps'`` it dominates (smaller
    epsilon *and* smaller delta) and is returned instead. So the result is basic composition
    exactly when ``result.delta == min(k delta, 1)`` and ``result.epsilon == k epsilon``;
    otherwise it is the DRV bound. Deltas are capped at 1.

    Example:
        >>> compose_advanced(0.1, 0.0, 100, 1e-5).epsilon  # DRV: 5.85 < 10 = basic
        5.8502350929445575
        >>> compose_advanced(1.0, 0.0, 10, 1e-5)  # basic wins for large epsilon
        ApproxDp(epsilon=10.0, delta=0.0)
    """
    e = check_nonnegative("epsilon", epsilon)
    d = check_range("delta", delta, 0.0, 1.0)
    n = check_int("k", k, 1)
    dp = check_delta(delta_prime, "delta_prime")
    basic_eps = n * e
    drv = drv_epsilon(e, n, dp)
    if basic_eps <= drv:
        return ApproxDp(basic_eps, min(n * d, 1.0))
    return ApproxDp(drv, min(n * d + dp, 1.0))


def compose_rdp_advanced(epsilon: float, k: int, delta: float) -> ApproxDp:
    """Advanced composition through RDP (Mironov 2017, Corollary 1).

    The k-fold adaptive composition of ``epsilon``-DP mechanisms is
    ``(4 epsilon sqrt(2 k log(1/delta)), delta)``-DP, provided ``log(1/delta) >= epsilon^2 k``
    (otherwise the corollary does not apply and a :class:`PrivacyParameterError` is raised).

    Example:
        >>> round(compose_rdp_advanced(0.01, 1000, 1e-5).epsilon, 4)
        6.0697
    """
    e = check_nonnegative("epsilon", epsilon)
    n = check_int("k", k, 1)
    d = check_delta(delta)
    log_inv = -math.log(d)
    if log_inv < e * e * n:
        raise fail(
            "delta",
            delta,
            f"log(1/delta) >= epsilon^2 k = {e * e * n:g} for Mironov 2017 Cor. 1 "
            f"(i.e. delta <= {math.exp(-e * e * n):.3g})",
        )
    return ApproxDp(4.0 * e * math.sqrt(2.0 * n * log_inv), d)


# ---------------------------------------------------------------------------------------------
# optimal homogeneous composition (Kairouz, Oh & Viswanath 2015)
# ---------------------------------------------------------------------------------------------


def _kov_log_delta_rr(epsilon: float, k: int, target: FloatArray) -> FloatArray:
    """``log delta_RR(target)`` of the k-fold composed randomized response (per target)."""
    if epsilon == 0.0:
        return np.full(target.shape, -np.inf)
    from scipy.stats import binom  # imported here: scipy.stats costs ~0.5 s at `import renyi`

    ell = np.arange(k + 1, dtype=np.float64)
    loss = (k - 2.0 * ell) * epsilon  # privacy loss with ell "flipped" outcomes
    # P(ell) = C(k, ell) e^{(k-ell) eps} / (1 + e^eps)^k: Binomial(k, 1/(1+e^eps)) at ell,
    # whose log-pmf scipy evaluates accurately for any k (no gammaln cancellation).
    log_pmf = binom.logpmf(ell, k, math.exp(-np.logaddexp(0.0, epsilon)))
    out = np.empty(target.shape[0])
    rows = max(1, 2_000_000 // (k + 1))  # bound the (targets x outcomes) work array
    for start in range(0, target.shape[0], rows):
        # term_ell = P(ell) (1 - e^{target - loss})_+ , in log space
        gap = target[start : start + rows, None] - loss[None, :]  # < 0 where positive
        with np.errstate(divide="ignore", invalid="ignore"):
            log_term = log_pmf[None, :] + np.log(-np.expm1(np.minimum(gap, 0.0)))
        log_term = np.where(gap < 0, log_term, -np.inf)
        out[start : start + rows] = logsumexp(log_term, axis=1)
    return out


def _kov_delta(epsilon: float, delta: float, k: int, target: FloatArray) -> FloatArray:
    # delta_RR <= 1; rounding can push its log a hair above 0 (clamping to 1 is conservative)
    log_rr = np.minimum(_kov_log_delta_rr(epsilon, k, target), 0.0)
    with np.errstate(divide="ignore"):
        # 1 - (1-delta)^k (1 - delta_RR)
        log_keep = k * math.log1p(-delta) + np.log1p(-np.exp(log_rr))
    # Safety margin for floating point: relative 1e-12 (log-pmf, logsumexp, expm1) plus the
    # absolute effect of rounding in target - loss, at most a few ulps of k eps + |target|.
    finite_target = np.where(np.isinf(target), 0.0, np.abs(target))
    slack = 8.0 * np.finfo(float).eps * (k * epsilon + finite_target)
    slack = np.where(np.isneginf(log_rr), 0.0, slack)  # delta_RR = 0 exactly: nothing to cover
    total = -np.expm1(log_keep) * (1.0 + _DELTA_ROUND_UP) + slack
    if k == 1:  # beyond k eps the profile is exactly delta: keep the boundary case exact
        total = np.where(np.isneginf(log_rr), delta, total)
    return np.minimum(total, 1.0)


def optimal_composition_delta(
    epsilon: float, delta: float, k: int, target_epsilon: ArrayLike
) -> float | FloatArray:
    """Smallest delta for ``(target_epsilon, delta)``-DP of k-fold ``(epsilon, delta)``-DP.

    Kairouz, Oh & Viswanath 2015 ("The composition theorem for differential privacy"),
    Theorem 3.3: the k-fold adaptive composition of ``(epsilon, delta)``-DP mechanisms is
    dominated by the k-fold composition of the ``(epsilon, delta)`` randomized-response pair,
    whose exact privacy profile is::

        delta_total(eps') = 1 - (1 - delta)^k (1 - delta_RR(eps')),
        delta_RR(eps') = sum_l C(k, l) max(0, e^{(k-l) eps} - e^{eps' + l eps}) / (1 + e^eps)^k.

    At ``eps' = (k - 2i) eps`` this is the theorem's ``delta_i``; the bound is tight (no
    smaller delta holds for every such composition). Evaluated in log space (scipy's binomial
    log-pmf, ``logsumexp``, ``expm1``) for any ``k``, and rounded up by a relative ``1e-12``
    plus a few ulps of ``k epsilon + target`` (the rounding of the privacy losses).
    ``target_epsilon`` is a scalar (returns a float) or an array.

    Example:
        >>> round(optimal_composition_delta(0.1, 0.0, 100, 3.0), 6)
        0.001361
    """
    e = check_nonnegative("epsilon", epsilon)
    d = check_range("delta", delta, 0.0, 1.0)
    n = check_int("k", k, 1)
    try:
        raw = np.asarray(target_epsilon)
        if raw.dtype.kind not in "iuf":
            raise TypeError
        t = raw.astype(np.float64)
    except (TypeError, ValueError):
        raise fail("target_epsilon", target_epsilon, "a real number >= 0 or an array") from None
    bad = np.isnan(t) | (t < 0)
    if bad.any() or t.size == 0:
        value = float(t[bad].flat[0]) if bad.any() else target_epsilon
        raise fail("target_epsilon", value, "every target epsilon >= 0 (inf allowed)")
    if d == 1.0:
        out = np.ones(t.shape)
    else:
        out = _kov_delta(e, d, n, t.reshape(-1)).reshape(t.shape)
    return float(out) if out.ndim == 0 else out


def compose_optimal(epsilon: float, delta: float, k: int, target_delta: float) -> ApproxDp:
    """Smallest ``eps'`` with ``(eps', target_delta)``-DP for k-fold ``(epsilon, delta)``-DP.

    Inverts :func:`optimal_composition_delta` (Kairouz, Oh & Viswanath 2015, Theorem 3.3):
    ``delta_total(eps')`` is continuous and non-increasing on ``[0, k epsilon]``, so Brent's
    method on ``log delta_total - log target_delta`` finds the root; the answer is then
    verified (``delta_total(answer) <= target_delta``) and nudged upwards until it holds.
    When ``target_delta < 1 - (1 - delta)^k`` no finite epsilon suffices and the result is
    ``ApproxDp(inf, target_delta)``.

    Example:
        >>> g = compose_optimal(0.1, 0.0, 100, 1e-5)
        >>> round(g.epsilon, 3), g.delta
        (4.307, 1e-05)
    """
    e = check_nonnegative("epsilon", epsilon)
    d = check_range("delta", delta, 0.0, 1.0)
    n = check_int("k", k, 1)
    td = check_delta(target_delta, "target_delta")
    if d == 1.0:
        return ApproxDp(math.inf, td)

    def total(x: float) -> float:
        return float(_kov_delta(e, d, n, np.array([x]))[0])

    if total(0.0) <= td:
        return ApproxDp(0.0, td)
    hi = n * e
    if total(hi) > td:  # the floor 1 - (1-delta)^k is above the target
        return ApproxDp(math.inf, td)
    log_td = math.log(td)

    def f(x: float) -> float:
        v = total(x)
        return (math.log(v) if v > 0 else -800.0) - log_td  # finite for Brent (e^-800 = 0)

    root = float(scipy.optimize.brentq(f, 0.0, hi, xtol=1e-13, rtol=4 * np.finfo(float).eps))
    eps_prime = _nudge_up(lambda x: total(x) <= td, root, hi)
    return ApproxDp(eps_prime, td)


def _nudge_up(ok: Any, x: float, limit: float) -> float:
    step = max(abs(x) * 4 * np.finfo(float).eps, 1e-15)
    while not ok(x):
        if x >= limit:
            return limit
        x = min(x + step, limit)
        step *= 2.0
    return x


# ---------------------------------------------------------------------------------------------
# the book chapter's comparison for the Gaussian mechanism
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GaussianCompositionComparison:
    """Epsilon after ``k`` releases of a Gaussian mechanism (L2 sensitivity 1, std ``sigma``).

    Each column is an array aligned with ``k``; all are valid upper bounds on the true
    epsilon except ``book_advanced``, which reproduces the book's back-of-the-envelope curve.

    Attributes:
        sigma, delta, order: the inputs (``order`` is the fixed RDP order of column d).
        k: the numbers of releases.
        book_advanced: (a) ``2 eps_0 sqrt(2 k log(1/delta))`` with the classic Gaussian
            ``eps_0 = sqrt(2 log(1.25/delta)) / sigma``, as the book computes it (it drops
            the ``k eps (e^eps - 1)`` term and the per-step deltas: not a rigorous bound).
        advanced: (b) rigorous DRV advanced composition with the book's split
            ``delta' = delta/2``, ``delta_i = delta/(2k)``, each step's
            ``eps_i = gaussian_epsilon(1/sigma, delta/(2k))`` (exact analytic Gaussian).
        zcdp_bun_steinke: (c) ``rho + 2 sqrt(rho log 1/delta)``, ``rho = k/(2 sigma^2)``.
        zcdp_optimal: (c') the optimal RDP conversion of ``rho``-zCDP over all orders.
        rdp_fixed_order: (d) Mironov 2017 Prop. 3 at ``order``, as the book.
        rdp_optimal: (e) RDP on :data:`~renyi.analysis.curves.DEFAULT_ORDERS`, best order, Balle et
            al. 2020 Thm. 21 conversion; ``rdp_optimal_order`` is the order achieving it.
        exact: (f) the exact epsilon: the k-fold composition is the Gaussian mechanism with
            ``mu = sqrt(k)/sigma`` (Balle & Wang 2018, Theorem 8), the ground truth.
    """

    sigma: float
    delta: float
    order: float
    k: NDArray[np.int64]
    book_advanced: FloatArray
    advanced: FloatArray
    zcdp_bun_steinke: FloatArray
    zcdp_optimal: FloatArray
    rdp_fixed_order: FloatArray
    rdp_optimal: FloatArray
    rdp_optimal_order: FloatArray
    exact: FloatArray

    #: the epsilon columns in display order, with human-readable labels
    METHODS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("book_advanced", "Adv. comp. (book)"),
        ("advanced", "Adv. comp. (rigorous)"),
        ("zcdp_bun_steinke", "zCDP (Bun-Steinke)"),
        ("zcdp_optimal", "zCDP (optimal conv.)"),
        ("rdp_fixed_order", "RDP (fixed order)"),
        ("rdp_optimal", "RDP (optimal order)"),
        ("exact", "Exact (analytic Gaussian)"),
    )

    def columns(self) -> dict[str, FloatArray]:
        """The epsilon columns by name (display order), plus ``k`` and ``rdp_optimal_order``."""
        out: dict[str, Any] = {"k": self.k}
        for name, _ in self.METHODS:
            out[name] = getattr(self, name)
        out["rdp_optimal_order"] = self.rdp_optimal_order
        return out

    def row(self, k: int) -> dict[str, float]:
        """All columns at one ``k`` (which must be in ``self.k``)."""
        idx = np.nonzero(self.k == k)[0]
        if idx.size == 0:
            raise fail("k", k, f"one of the computed k values ({self.k.min()}..{self.k.max()})")
        i = int(idx[0])
        return {name: float(col[i]) for name, col in self.columns().items()}


def _as_ks(iterations: int | ArrayLike, name: str = "iterations") -> NDArray[np.int64]:
    if isinstance(iterations, int | np.integer) and not isinstance(iterations, bool):
        n = check_int(name, iterations, 1)
        return np.arange(1, n + 1, dtype=np.int64)
    raw = np.asarray(iterations)
    if raw.ndim != 1 or raw.size == 0 or raw.dtype.kind not in "iu":
        raise fail(name, iterations, "an integer >= 1 or a non-empty 1-D array of integers >= 1")
    if (raw < 1).any():
        raise fail(name, int(raw[raw < 1][0]), "every number of releases >= 1")
    return np.unique(raw.astype(np.int64))


def compare_gaussian_composition(
    sigma: float, delta: float, iterations: int | ArrayLike, order: float = 60.0
) -> GaussianCompositionComparison:
    """Epsilon after k Gaussian releases under every composition method, k = 1..iterations.

    Reproduces the comparison at the end of the "Variants of Differential Privacy" chapter
    (Near & Abuah, *Programming Differential Privacy*): advanced composition, zCDP, RDP at a
    fixed order (Mironov 2017, Prop. 3) and adds RDP at the best order of the default grid,
    rigorous advanced composition and the exact value (see
    :class:`GaussianCompositionComparison` for the formulas and sources). ``iterations`` is
    an integer (k = 1..iterations) or an array of k values. The mechanism adds
    ``N(0, sigma^2)`` to a query of L2 sensitivity 1 under the caller's neighbouring relation.

    Example:
        >>> r = compare_gaussian_composition(200.0, 1e-5, [500])
        >>> round(float(r.zcdp_bun_steinke[0]), 4), round(float(r.rdp_fixed_order[0]), 4)
        (0.5427, 0.5701)
    """
    s = check_positive("sigma", sigma)
    d = check_delta(delta)
    a = check_range("order", order, 1.0, math.inf, low_open=True)
    ks = _as_ks(iterations)
    kf = ks.astype(np.float64)
    log_inv = -math.log(d)

    eps0 = closed_forms.classic_gaussian_constant(d) / s  # the book's eps_0, even if >= 1
    book_adv = 2.0 * eps0 * np.sqrt(2.0 * kf * log_inv)

    adv = np.empty_like(kf)
    for i, k in enumerate(ks.tolist()):
        eps_i = closed_forms.gaussian_epsilon(1.0 / s, d / (2.0 * k))
        adv[i] = compose_advanced(eps_i, d / (2.0 * k), k, d / 2.0).epsilon

    rho = kf / (2.0 * s * s)
    zcdp_bs = np.array([conversions.zcdp_to_dp_bun_steinke(r, d) for r in rho.tolist()])
    zcdp_opt = np.array([conversions.zcdp_to_dp(r, d)[0] for r in rho.tolist()])

    step_fixed = float(closed_forms.gaussian_rdp(s, a))
    rdp_fixed = np.array(
        [conversions.rdp_to_dp_mironov([a], [k * step_fixed], d)[0] for k in kf.tolist()]
    )

    step = RdpCurve(DEFAULT_ORDERS, closed_forms.gaussian_rdp(s, DEFAULT_ORDERS))
    rdp_opt = np.empty_like(kf)
    rdp_order = np.empty_like(kf)
    edge: list[int] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OrderAtGridEdgeWarning)
        for i, k in enumerate(ks.tolist()):
            n_before = len(caught)
            conv = (k * step).to_dp(d)
            rdp_opt[i] = conv.epsilon
            rdp_order[i] = conv.order if conv.order is not None else math.nan
            if len(caught) > n_before:
                edge.append(k)
    if edge:
        warnings.warn(
            OrderAtGridEdgeWarning(
                f"for {len(edge)} value(s) of k (e.g. k={edge[0]}) the best Rényi order sits at "
                "the edge of DEFAULT_ORDERS; the rdp_optimal column may be loose there"
            ),
            stacklevel=2,
        )

    exact = np.array([closed_forms.gaussian_epsilon(math.sqrt(k) / s, d) for k in kf.tolist()])

    return GaussianCompositionComparison(
        sigma=s,
        delta=d,
        order=a,
        k=ks,
        book_advanced=book_adv,
        advanced=adv,
        zcdp_bun_steinke=zcdp_bs,
        zcdp_optimal=zcdp_opt,
        rdp_fixed_order=rdp_fixed,
        rdp_optimal=rdp_opt,
        rdp_optimal_order=rdp_order,
        exact=exact,
    )


# ---------------------------------------------------------------------------------------------
# noise needed for k queries: sequential vs vectorised
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoiseComparison:
    """Noise per query needed to answer ``k`` sensitivity-1 queries with a total budget.

    Laplace columns are noise *scales* ``b`` (total ``epsilon``-DP); Gaussian columns are
    noise *variances* ``sigma^2`` (total ``(epsilon, delta)``-DP), as in the book chapter.

    Attributes:
        k, epsilon, delta: the inputs.
        laplace_sequential: ``k / epsilon`` (``epsilon_i = epsilon / k``, basic composition).
        laplace_vectorised: ``k / epsilon`` (one query of L1 sensitivity ``k``): identical.
        gaussian_advanced: ``16 k log(2/delta) log(2.5 k/delta) / epsilon^2``: classic
            Gaussian per query with the book's split for advanced composition.
        gaussian_vectorised: ``2 k log(1.25/delta) / epsilon^2``: one classic Gaussian query
            of L2 sensitivity ``sqrt(k)`` (Dwork & Roth 2014, Thm. A.1; needs epsilon < 1).
        gaussian_zcdp: sequential, composed in zCDP, optimal conversion:
            ``k / (2 rho*)`` with ``rho*`` the largest rho with ``(epsilon, delta)``-DP.
        gaussian_rdp: sequential, composed in RDP on ``DEFAULT_ORDERS`` (Balle et al. 2020
            Thm. 21 conversion): ``k / (2 rho*)`` likewise.
        gaussian_exact: sequential or vectorised analysed exactly (analytic Gaussian, Balle &
            Wang 2018): ``k / mu*^2`` with ``mu* = gaussian_mu(epsilon, delta)``.
    """

    k: NDArray[np.int64]
    epsilon: float
    delta: float
    laplace_sequential: FloatArray
    laplace_vectorised: FloatArray
    gaussian_advanced: FloatArray
    gaussian_vectorised: FloatArray
    gaussian_zcdp: FloatArray
    gaussian_rdp: FloatArray
    gaussian_exact: FloatArray

    LAPLACE: ClassVar[tuple[tuple[str, str], ...]] = (
        ("laplace_sequential", "Sequential (basic comp.)"),
        ("laplace_vectorised", "Vectorised"),
    )
    GAUSSIAN: ClassVar[tuple[tuple[str, str], ...]] = (
        ("gaussian_advanced", "Sequential, adv. comp. (book)"),
        ("gaussian_vectorised", "Vectorised (classic Gaussian)"),
        ("gaussian_zcdp", "Sequential, zCDP"),
        ("gaussian_rdp", "Sequential, RDP"),
        ("gaussian_exact", "Exact (analytic Gaussian)"),
    )

    def columns(self) -> dict[str, NDArray[Any]]:
        """All columns by name, ``k`` first."""
        out: dict[str, NDArray[Any]] = {"k": self.k}
        for name, _ in self.LAPLACE + self.GAUSSIAN:
            out[name] = getattr(self, name)
        return out


def _largest_rho(epsilon_of_rho: Any, target: float) -> float:
    """Largest rho with ``epsilon_of_rho(rho) <= target`` (monotone increasing), verified."""
    lo, hi = -60.0, 0.0
    while epsilon_of_rho(math.exp(hi)) <= target:
        lo, hi = hi, hi + 10.0
    while epsilon_of_rho(math.exp(lo)) > target:
        lo -= 10.0
        if lo < -700.0:  # pragma: no cover - eps(rho) -> 0 as rho -> 0
            raise fail("epsilon", target, "a budget reachable with Gaussian noise")
    log_rho = float(
        scipy.optimize.brentq(lambda x: epsilon_of_rho(math.exp(x)) - target, lo, hi, xtol=1e-14)
    )
    rho = math.exp(log_rho)
    step = rho * 4 * np.finfo(float).eps
    while epsilon_of_rho(rho) > target:  # verify; move to the safe side (less rho)
        rho -= step
        step *= 2.0
    return rho


def vectorised_vs_sequential_noise(
    ks: int | ArrayLike, epsilon: float, delta: float
) -> NoiseComparison:
    """The book chapter's "noise vs number of queries" comparisons, plus RDP/zCDP and exact.

    For ``k`` counting queries of sensitivity 1 and a total budget ``epsilon`` (Laplace) or
    ``(epsilon, delta)`` (Gaussian): Laplace noise is the same whether the queries are
    answered one by one (basic composition is tight for pure DP) or as one vector query;
    for the Gaussian, advanced composition needs far more noise than the vectorised query,
    while composing in zCDP/RDP (or exactly) closes the gap. See :class:`NoiseComparison`.
    ``ks`` is an integer (1..ks) or an array of integers >= 1.

    Example:
        >>> r = vectorised_vs_sequential_noise([10], 0.1, 1e-5)
        >>> float(r.laplace_sequential[0]) == float(r.laplace_vectorised[0]) == 100.0
        True
    """
    e = check_positive("epsilon", epsilon)
    d = check_delta(delta)
    k = _as_ks(ks, "ks")
    kf = k.astype(np.float64)
    lap_seq = kf / e  # epsilon_i = epsilon / k, b = 1 / epsilon_i
    lap_vec = 1.0 * kf / e  # L1 sensitivity k, b = k / epsilon
    # the book's split for advanced composition: eps_i = eps / (2 sqrt(2 k log(1/delta'))),
    # delta' = delta / 2, delta_i = delta / (2k), each a classic Gaussian (Thm A.1), i.e.
    # sigma^2 = 16 k log(2/delta) log(2.5 k/delta) / eps^2
    eps_i = e / (2.0 * np.sqrt(2.0 * kf * math.log(2.0 / d)))
    c_i = np.array([closed_forms.classic_gaussian_constant(d / (2.0 * k)) for k in kf.tolist()])
    gauss_adv = (c_i / eps_i) ** 2
    gauss_vec = kf * closed_forms.classic_gaussian_constant(d) ** 2 / e**2  # Thm A.1, as the book

    rho_z = conversions.zcdp_max_rho(e, d)
    rho_r = _largest_rho(
        lambda r: conversions.rdp_to_dp(DEFAULT_ORDERS, r * DEFAULT_ORDERS, d)[0], e
    )
    mu = closed_forms.gaussian_mu(e, d)
    return NoiseComparison(
        k=k,
        epsilon=e,
        delta=d,
        laplace_sequential=lap_seq,
        laplace_vectorised=lap_vec,
        gaussian_advanced=gauss_adv,
        gaussian_vectorised=gauss_vec,
        gaussian_zcdp=kf / (2.0 * rho_z),
        gaussian_rdp=kf / (2.0 * rho_r),
        gaussian_exact=kf / (mu * mu),
    )
