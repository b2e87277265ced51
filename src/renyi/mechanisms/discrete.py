"""Discrete Laplace and discrete Gaussian mechanisms for integer-valued queries.

Canonne, Kamath & Steinke 2020 (arXiv:2004.00010, "CKS"): exact samplers
(:mod:`renyi.samplers`) and their privacy.

* :class:`DiscreteLaplaceMechanism`: ``P[x] ∝ exp(-|x| / scale)`` noise on a query with integer
  L1 sensitivity ``Delta``: pure ``(Delta / scale)``-DP (CKS §2: the pmf ratio at shift
  ``Delta`` is at most ``exp(Delta / scale)``).
* :class:`DiscreteGaussianMechanism`: ``N_Z(0, sigma^2)`` noise per coordinate on a query with
  L2 sensitivity ``Delta`` (integer shifts): ``(Delta^2 / (2 sigma^2))``-zCDP, i.e. the RDP
  curve ``alpha Delta^2 / (2 sigma^2)`` -- the same as the continuous Gaussian (CKS Thm. 4;
  vectors by composition over coordinates). For scalar queries the exact
  ``(epsilon, delta)`` profile of CKS Thm. 7 (:func:`discrete_gaussian_delta`) is used too.

Neighbouring relation: the one the caller's sensitivity is stated for (e.g. add/remove one
record).

Example
-------
>>> import numpy as np
>>> from renyi.mechanisms import DiscreteGaussianMechanism
>>> m = DiscreteGaussianMechanism.calibrate(sensitivity=1, rho=0.5)
>>> m.sigma_squared, m.rho
(Fraction(1, 1), 0.5)
>>> int(m.release(10, rng=np.random.default_rng(0))) - 10 in range(-20, 21)
True
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize
from scipy.special import logsumexp

from renyi._validation import check_delta, check_int, check_nonnegative, fail
from renyi.analysis.closed_forms import gaussian_delta, gaussian_epsilon, gaussian_mu
from renyi.analysis.conversions import zcdp_max_rho
from renyi.analysis.curves import DEFAULT_ORDERS, PureDp, RdpCurve, Zcdp
from renyi.analysis.events import DiscreteGaussianEvent, DiscreteLaplaceEvent, Event
from renyi.mechanisms._base import (
    VALUE_BOUND,
    Calibration,
    Mechanism,
    Target,
    add_integers,
    down,
    grow_until,
    in_range_integers,
    parse_target,
    up,
)
from renyi.random import get_source
from renyi.samplers import (
    _check_terms,
    _default_t,
    as_fraction,
    discrete_gaussian_logpmf,
    noise_gaussian_frac,
    noise_laplace_int,
)

__all__ = [
    "DiscreteGaussianMechanism",
    "DiscreteLaplaceMechanism",
    "discrete_gaussian_delta",
    "discrete_gaussian_delta_bound",
    "discrete_gaussian_epsilon",
    "discrete_laplace_delta",
    "discrete_laplace_epsilon",
    "discrete_laplace_rdp",
]

# the exact profile is evaluated only when it sums fewer terms than this (about
# 12 sigma + Delta / 2 of them: see discrete_gaussian_delta)
_CKS_MAX_TERMS = 2**24


# ---------------------------------------------------------------- CKS Theorem 7
def discrete_gaussian_delta(
    sigma_squared: float | Fraction, sensitivity: int, epsilon: float
) -> float:
    """Exact ``delta(epsilon)`` of ``N_Z(0, sigma^2)`` noise on an integer query of sensitivity
    ``Delta`` (CKS 2020, Thm. 7; tight at shift ``Delta``). Smaller shifts give smaller
    profiles: shifts of the log-concave discrete Gaussian have monotone likelihood ratios, so
    the Karlin-Rubin theorem orders their tests (both directions agree by symmetry).

    ``delta = sum_y max(0, P(y) - e^eps P(y - Delta))`` over the integers, with
    ``P(y)/P(y - Delta) = exp(L(y))``, ``L(y) = (Delta^2 - 2 y Delta) / (2 sigma^2)``: summed in
    log space as ``P(y) (1 - e^{eps - L(y)})`` over ``L(y) > eps`` (no cancellation), over
    ``y`` from 12 standard deviations below ``min(top, 0)`` up, plus a proven bound on the
    remaining tail, and rounded up by a relative 1e-9.

    >>> d = discrete_gaussian_delta(100.0, 1, 0.5)
    >>> 0 < d < 1e-3
    True
    """
    s2 = float(as_fraction("sigma_squared", sigma_squared))
    s = check_int("sensitivity", sensitivity, 1)
    eps = check_nonnegative("epsilon", epsilon, allow_inf=True)
    if math.isinf(eps):
        return 0.0
    sd = math.sqrt(s2)
    top = math.floor(s / 2 - eps * s2 / s) + 1  # every y with L(y) > eps is <= top
    low = min(top, 0) - math.ceil(12.0 * sd) - 1  # terms below are bounded, not summed
    ys = np.arange(low, top + 1, dtype=np.float64)
    loss = (s * s - 2.0 * ys * s) / (2.0 * s2)
    keep = loss > eps
    if not keep.any():
        return 0.0
    with np.errstate(divide="ignore"):
        terms = discrete_gaussian_logpmf(ys[keep], s2) + np.log(-np.expm1(eps - loss[keep]))
    # Tail y < low (< 0): sum_{j>=1} P(low - j) <= P(low) r / (1 - r), r = exp(-|low|/s2),
    # since P(y - 1) / P(y) = exp(-(2|y| + 1) / (2 s2)) <= exp(-|y| / s2) for y < 0.
    log_r = -abs(low) / s2
    log_tail = float(discrete_gaussian_logpmf(low, s2)) + log_r - math.log(-math.expm1(log_r))
    log_delta = float(logsumexp(np.append(terms, log_tail)))
    return min(1.0, up(math.exp(log_delta) * (1.0 + 1e-9)))


def discrete_gaussian_epsilon(
    sigma_squared: float | Fraction, sensitivity: int, delta: float
) -> float:
    """Smallest ``epsilon`` with :func:`discrete_gaussian_delta` ``<= delta`` (CKS Thm. 7).

    Brent's method on ``log delta(eps)``, then verified and nudged up until the profile at the
    returned value is at most ``delta``.
    """
    s2 = float(as_fraction("sigma_squared", sigma_squared))
    s = check_int("sensitivity", sensitivity, 1)
    d = check_delta(delta)
    if discrete_gaussian_delta(s2, s, 0.0) <= d:
        return 0.0
    log_d = math.log(d)

    def f(e: float) -> float:
        v = discrete_gaussian_delta(s2, s, e)
        return (math.log(v) if v > 0 else -1e300) - log_d

    # Start from the continuous (analytic) Gaussian's epsilon, which is very close, and
    # bracket around it: a handful of evaluations of the (long) exact sum.
    e0 = gaussian_epsilon(s / math.sqrt(s2), d)
    lo, hi = e0 * 0.99, e0 * 1.01 + 1e-9
    while lo > 0 and f(lo) < 0:
        lo = max(0.0, lo - 2 * (hi - lo))
    while f(hi) > 0:
        hi = hi + 2 * (hi - lo)
    eps = float(optimize.brentq(f, lo, hi, xtol=1e-12, rtol=1e-10))
    return grow_until(lambda e: discrete_gaussian_delta(s2, s, e) <= d, up(eps))


def discrete_gaussian_delta_bound(
    sigma_squared: float | Fraction, sensitivity: int, epsilon: float
) -> float:
    """A cheap upper bound on :func:`discrete_gaussian_delta` for wide discrete Gaussians.

    ``delta_disc(eps) <= delta_cont(Delta / sigma, eps) + 1 / (sigma sqrt(2 pi))``, where
    ``delta_cont`` is the continuous (analytic) Gaussian profile (Balle & Wang 2018, Thm. 8).
    Proof: the summand ``f(y) = P(y) (1 - e^{eps - L(y)})_+`` is log-concave in ``y`` (a
    Gaussian times ``log(1 - e^{linear})``, concave), hence unimodal, so
    ``sum_y f(y) <= integral f + max f`` (pair each term with the unit interval on its side of
    the mode; the two terms around the mode cost at most ``max f`` beyond their interval).
    The integral is ``(sigma sqrt(2 pi) / Z) delta_cont`` and ``max f <= P(0) = 1 / Z`` with
    ``Z = sum_y exp(-y^2 / (2 sigma^2)) >= sigma sqrt(2 pi)`` (Poisson summation); since ``f``
    vanishes for ``y >= s/2 - eps sigma^2 / s``, ``max f`` is at most the pmf there. Used when
    the exact sum would need too many terms (``sigma > 4e5``).

    >>> exact = discrete_gaussian_delta(1e4, 1, 0.01)
    >>> exact <= discrete_gaussian_delta_bound(1e4, 1, 0.01) <= exact + 1 / (100 * 2.5066)
    True
    """
    s2 = float(as_fraction("sigma_squared", sigma_squared))
    s = check_int("sensitivity", sensitivity, 1)
    eps = check_nonnegative("epsilon", epsilon, allow_inf=True)
    if math.isinf(eps):
        return 0.0
    sigma = down(math.sqrt(s2))
    mu = up(s / sigma)
    cont = float(gaussian_delta(mu, eps))
    return min(1.0, up(cont * (1 + 1e-9) + _max_term_bound(s2, s, eps)))


def _max_term_bound(s2: float, s: int, eps: float) -> float:
    """Upper bound on ``max_y P(y) (1 - e^{eps - L(y)})_+``: ``f`` vanishes unless
    ``y < thr = s/2 - eps s2 / s``, so ``max f <= max_{y <= thr} P(y) <= exp(-thr^2 / (2 s2)) / Z``
    when ``thr < 0`` (else ``1 / Z``), with ``Z >= sqrt(2 pi s2)``."""
    sigma = down(math.sqrt(s2))
    depth = max(0.0, (eps * s2 / s - s / 2) * (1 - 1e-12))  # |thr| when thr < 0, shrunk
    log_bound = -(depth * depth) / (2 * s2 * (1 + 1e-12)) - math.log(sigma * math.sqrt(2 * math.pi))
    return up(math.exp(log_bound))


def _exact_is_cheap(sigma_squared: float | Fraction, shift: int) -> bool:
    """Whether the exact profile's sum is affordable: it runs over about ``12 sigma +
    shift / 2`` integers (``40 sigma + shift`` is a safe over-count), so a shift of many
    standard deviations is as costly as a wide noise (it used to allocate 15 GiB for
    sigma = 1 and sensitivity 1e6)."""
    return 40 * math.sqrt(float(sigma_squared)) + shift < _CKS_MAX_TERMS


def scalar_gaussian_delta(sigma_squared: float | Fraction, shift: int, epsilon: float) -> float:
    """The CKS Thm. 7 profile, exact when affordable, else :func:`discrete_gaussian_delta_bound`."""
    if _exact_is_cheap(sigma_squared, shift):
        return discrete_gaussian_delta(sigma_squared, shift, epsilon)
    return discrete_gaussian_delta_bound(sigma_squared, shift, epsilon)


def scalar_gaussian_epsilon(sigma_squared: float | Fraction, shift: int, delta: float) -> float:
    """Smallest epsilon with :func:`scalar_gaussian_delta` ``<= delta`` (``inf`` when the bound
    cannot reach ``delta``), verified."""
    if _exact_is_cheap(sigma_squared, shift):
        return discrete_gaussian_epsilon(sigma_squared, shift, delta)
    d = check_delta(delta)
    s2 = float(sigma_squared)
    sigma = down(math.sqrt(s2))

    def gap(e: float) -> float:
        return discrete_gaussian_delta_bound(s2, shift, e) - d

    # start from the continuous epsilon with the worst-case slack, then tighten by bisection
    slack = _max_term_bound(s2, shift, 0.0)
    hi = gaussian_epsilon(up(shift / sigma), max(d - slack, d * 1e-3))
    hi = grow_until(lambda e: gap(e) <= 0, max(hi, 1e-12))
    lo = gaussian_epsilon(up(shift / sigma), d) * (1 - 1e-9)
    if gap(lo) <= 0:
        return float(lo)
    eps = float(optimize.brentq(gap, lo, hi, xtol=1e-13, rtol=1e-11))
    return float(grow_until(lambda e: gap(e) <= 0, eps))


# ---------------------------------------------------------------- discrete Laplace profile
def _check_orders_array(orders: ArrayLike) -> NDArray[np.float64]:
    o = np.asarray(orders, dtype=np.float64)
    if o.size == 0 or np.isnan(o).any() or not (o > 1).all():
        raise fail("orders", orders, "Rényi orders > 1 (inf allowed)")
    return o


def discrete_laplace_rdp(scale: Any, shift: int, orders: ArrayLike) -> NDArray[np.float64]:
    """Exact ``D_alpha(P || P(. - s))`` for the discrete Laplace ``P[y] ∝ lam^|y|``,
    ``lam = exp(-1/scale)``, and an integer shift ``s``: the RDP curve of adding discrete
    Laplace noise to an integer query of sensitivity ``s`` (by symmetry both directions are
    equal, and smaller shifts give smaller divergences: shifts of a log-concave pmf are
    Blackwell-ordered by Karlin-Rubin).

    Derived from the definition by splitting the sum at 0 and ``s`` (three geometric series):
    ``sum_y P(y)^a P(y-s)^(1-a) = c/(1-lam) (lam^((1-a)s) + lam^(a s))
    + c lam^((1-a)s) sum_{y=1}^{s-1} lam^((2a-1)y)`` with ``c = (1-lam)/(1+lam)``; the limit
    ``alpha = inf`` is ``s / scale``. Evaluated in log space; never below the true value by
    more than rounding (results are rounded up by a relative 1e-12).

    >>> float(discrete_laplace_rdp(1.0, 1, [np.inf])[0])
    1.0
    """
    t = float(as_fraction("scale", scale))
    s = check_int("shift", shift, 1)
    a = _check_orders_array(orders)
    out = np.full(a.shape, s / t)
    fin = np.isfinite(a)
    af = a[fin]
    log_lam = -1.0 / t
    log_c = math.log(-math.expm1(log_lam)) - math.log1p(math.exp(log_lam))
    log_1ml = math.log(-math.expm1(log_lam))
    parts = [
        log_c - log_1ml + (1 - af) * s * log_lam,
        log_c - log_1ml + af * s * log_lam,
    ]
    if s > 1:
        # log sum_{y=1}^{s-1} r^y with log r = (2a - 1) log_lam < 0
        log_r = (2 * af - 1) * log_lam
        log_geo = log_r + np.log(-np.expm1((s - 1) * log_r)) - np.log(-np.expm1(log_r))
        parts.append(log_c + (1 - af) * s * log_lam + log_geo)
    total = logsumexp(np.vstack(parts), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        val = total / (af - 1)
    out[fin] = np.minimum(np.maximum(val, 0.0) * (1 + 1e-12), s / t)
    return out


def discrete_laplace_delta(scale: Any, shift: int, epsilon: float) -> float:
    """Exact ``delta(epsilon)`` of discrete Laplace noise (``P[y] ∝ exp(-|y|/scale)``) on an
    integer query of sensitivity ``shift``: ``sum_y max(0, P(y) - e^eps P(y - shift))``.

    The privacy loss is ``shift/scale`` for ``y <= 0``, ``(shift - 2y)/scale`` for
    ``0 < y < shift`` and negative beyond, so the sum is
    ``(1 - e^{eps - s/t}) / (1 + lam)`` plus a finite sum over ``0 < y < shift`` (log space,
    rounded up by a relative 1e-9). Zero for ``epsilon >= shift / scale`` (pure DP).

    >>> discrete_laplace_delta(1.0, 1, 1.0)
    0.0
    """
    t = float(as_fraction("scale", scale))
    s = check_int("shift", shift, 1)
    eps = check_nonnegative("epsilon", epsilon, allow_inf=True)
    if eps >= s / t:
        return 0.0
    log_lam = -1.0 / t
    log_c = math.log(-math.expm1(log_lam)) - math.log1p(math.exp(log_lam))
    terms = [math.log(-math.expm1(eps - s / t)) - math.log1p(math.exp(log_lam))]
    if s > 1:
        ys = np.arange(1, s, dtype=np.float64)
        loss = (s - 2 * ys) / t
        keep = loss > eps
        if keep.any():
            yk = ys[keep]
            terms.extend((log_c + yk * log_lam + np.log(-np.expm1(eps - loss[keep]))).tolist())
    return min(1.0, up(math.exp(float(logsumexp(terms))) * (1 + 1e-9)))


def discrete_laplace_epsilon(scale: Any, shift: int, delta: float) -> float:
    """Smallest ``epsilon`` with :func:`discrete_laplace_delta` ``<= delta`` (verified)."""
    t = float(as_fraction("scale", scale))
    s = check_int("shift", shift, 1)
    d = check_delta(delta)
    pure = s / t
    if discrete_laplace_delta(t, s, 0.0) <= d:
        return 0.0

    def f(e: float) -> float:
        v = discrete_laplace_delta(t, s, e)
        return (math.log(v) if v > 0 else -1e300) - math.log(d)

    eps = float(optimize.brentq(f, 0.0, pure, xtol=1e-13, rtol=1e-12))
    return min(up(pure), grow_until(lambda e: discrete_laplace_delta(t, s, e) <= d, up(eps)))


def round_up_sigma_squared(s2: Fraction) -> Fraction:
    """A rational ``>= s2`` with small terms for the sampler's fast path.

    ``s2 >= 2**20``: ``t * ceil(s2 / t)`` with ``t = floor(sqrt(s2)) + 1`` (an integer
    multiple of ``t``, relative increase < 2**-10); else ``ceil(s2 * 2**20) / 2**20``.
    """
    if s2 >= 2**20:
        t = _default_t(s2)
        return Fraction(t * math.ceil(s2 / t))
    return Fraction(math.ceil(s2 * 2**20), 2**20)


def _sensitivity_int(value: Any) -> int:
    return check_int("sensitivity", value, 1)


# ---------------------------------------------------------------- discrete Gaussian
class DiscreteGaussianMechanism(Mechanism):
    """Add ``N_Z(0, sigma^2)`` to each coordinate of an integer-valued query (CKS 2020).

    Args:
        sigma_squared: the variance parameter ``sigma^2`` (a positive rational: int,
            Fraction or float at its exact value; numerator and denominator < 2**56).
        sensitivity: the query's L2 sensitivity, a positive integer for scalar queries (any
            positive number for vectors, where it bounds the norm of the integer shift).
        dimension: number of coordinates released together (default 1).

    Guarantee: ``rho = sensitivity^2 / (2 sigma^2)``-zCDP (CKS Thm. 4), RDP
    ``alpha * rho``; ``epsilon(delta)`` is the smaller of the zCDP conversion (Balle et al.
    2020, Thm. 21) and, for scalars, the exact profile of CKS Thm. 7.

    >>> import numpy as np
    >>> m = DiscreteGaussianMechanism(4, sensitivity=1)
    >>> m.rho
    0.125
    >>> v = DiscreteGaussianMechanism(4, sensitivity=2, dimension=3)
    >>> v.release([1, 2, 3], rng=np.random.default_rng(1)).dtype
    dtype('int64')
    """

    def __init__(
        self,
        sigma_squared: Any,
        sensitivity: Any = 1,
        *,
        dimension: int = 1,
        value_bound: int = VALUE_BOUND,
    ) -> None:
        self.value_bound = _check_bound(value_bound)
        s2 = as_fraction("sigma_squared", sigma_squared)
        _check_terms("sigma_squared", sigma_squared, s2)
        self.dimension = check_int("dimension", dimension, 1)
        if self.dimension == 1:
            self.sensitivity: float = float(_sensitivity_int(sensitivity))
        else:
            self.sensitivity = float(as_fraction("sensitivity", sensitivity))
        self.sigma_squared = s2
        self._t = _default_t(s2)
        self.rho = _float_up(Fraction(self.sensitivity) ** 2 / (2 * s2))

    @property
    def sigma(self) -> float:
        return math.sqrt(float(self.sigma_squared))

    def release(self, value: Any, rng: Any = None) -> Any:
        """``value`` (integers, any shape with ``dimension`` entries) plus discrete Gaussian
        noise; returns int64 (a Python int for a scalar)."""
        x, scalar = in_range_integers(value, self.value_bound)  # one path for all in range
        _check_size(x, self.dimension)
        noise = noise_gaussian_frac(self.sigma_squared, self._t, x.size, get_source(rng))
        out = add_integers(x, noise)  # exact: int64, or Python ints beyond its range
        return int(out.reshape(-1)[0]) if scalar else out

    def rdp(self, orders: ArrayLike = DEFAULT_ORDERS) -> RdpCurve:
        """``alpha * rho`` (CKS Thm. 4)."""
        return Zcdp(self.rho).to_rdp(orders)

    def epsilon(self, delta: float) -> float:
        d = check_delta(delta)
        eps = Zcdp(self.rho).to_dp(d).epsilon
        if self.dimension == 1:
            eps = min(eps, scalar_gaussian_epsilon(self.sigma_squared, int(self.sensitivity), d))
        return eps

    def delta(self, epsilon: float) -> float:
        """Smallest proven delta at ``epsilon`` (same bounds as :meth:`epsilon`)."""
        eps = check_nonnegative("epsilon", epsilon)
        d = Zcdp(self.rho).to_delta(eps).delta
        if self.dimension == 1:
            d = min(d, scalar_gaussian_delta(self.sigma_squared, int(self.sensitivity), eps))
        return d

    def event(self) -> Event:
        return DiscreteGaussianEvent(sigma=self.sigma, sensitivity=self.sensitivity)

    @classmethod
    def calibrate(
        cls,
        sensitivity: Any = 1,
        *,
        epsilon: Any = None,
        delta: Any = None,
        alpha: Any = None,
        rho: Any = None,
        dimension: int = 1,
    ) -> DiscreteGaussianMechanism:
        """The least noise (up to a rounding of sigma^2 upwards) meeting the target.

        ``rho`` (zCDP), ``alpha`` + ``epsilon`` (RDP), ``epsilon`` + ``delta`` (for scalars
        via the analytic Gaussian start, verified with the exact CKS Thm. 7 profile; for
        vectors via zCDP). Pure ``epsilon`` alone is impossible and refused.
        """
        target = parse_target(epsilon, delta, alpha, rho)
        sens = (
            float(_sensitivity_int(sensitivity))
            if dimension == 1
            else float(as_fraction("sensitivity", sensitivity))
        )

        def make(s2: float) -> DiscreteGaussianMechanism:
            return cls(round_up_sigma_squared(Fraction(s2)), sensitivity, dimension=dimension)

        s2, method, bound = _gaussian_sigma2(target, sens, dimension)
        check = _gaussian_check(target, method)
        if target.kind == "approx":  # verify candidates with one delta(epsilon) each
            s2 = grow_until(lambda v: make(v).delta(target.epsilon) <= target.delta, s2)
        s2 = grow_until(lambda v: check(make(v)) <= _limit(target), s2)
        mech = make(s2)
        return mech._with(
            Calibration(target.describe(), method, bound, check(mech), _limit(target))
        )


def _check_bound(bound: Any) -> int:
    """``value_bound``: the public range ``|value| <= value_bound`` of a release's inputs."""
    return check_int("value_bound", bound, 1)


def _limit(target: Target) -> float:
    return target.rho if target.kind == "zcdp" else target.epsilon


def _gaussian_sigma2(target: Target, sens: float, dimension: int) -> tuple[float, str, str]:
    """Starting sigma^2 (absolute units) for a Gaussian-type target, its method and bound."""
    if target.kind == "pure":
        raise fail("delta", None, "a delta in (0, 1): Gaussian noise cannot give pure epsilon-DP")
    if target.kind == "zcdp":
        return sens**2 / (2 * target.rho), "zcdp", "rho = Delta^2/(2 sigma^2) (CKS 2020 Thm. 4)"
    if target.kind == "rdp":
        return (
            sens**2 * target.alpha / (2 * target.epsilon),
            "rdp",
            "eps(alpha) = alpha Delta^2/(2 sigma^2) (Mironov 2017 Table II; CKS 2020 Thm. 4)",
        )
    if dimension == 1:
        mu = gaussian_mu(target.epsilon, target.delta)
        return (
            (sens / mu) ** 2,
            "analytic",
            "exact discrete-Gaussian profile (CKS 2020 Thm. 7), started from the analytic "
            "Gaussian (Balle & Wang 2018 Thm. 8)",
        )
    rho = zcdp_max_rho(target.epsilon, target.delta)
    return (
        sens**2 / (2 * rho),
        "zcdp",
        "zCDP -> (eps, delta) (Balle et al. 2020 Thm. 21) of rho = Delta^2/(2 sigma^2)",
    )


def _gaussian_check(target: Target, method: str) -> Any:
    """The function computing the constrained quantity of a mechanism for ``target``."""
    if target.kind == "zcdp":
        return lambda m: m.rho
    if target.kind == "rdp":
        return lambda m: float(m.rdp([target.alpha]).epsilons[0])
    return lambda m: m.epsilon(target.delta)


def _check_size(x: NDArray[Any], dimension: int) -> None:
    if x.size != dimension:
        raise fail(
            "value",
            f"<array of {x.size} entries>",
            f"{dimension} entries (the mechanism's dimension; its sensitivity covers them all)",
        )


# ---------------------------------------------------------------- discrete Laplace
class DiscreteLaplaceMechanism(Mechanism):
    """Add discrete Laplace noise ``P[x] ∝ exp(-|x| / scale)`` to an integer-valued query.

    Args:
        scale: positive rational (int, Fraction or float at its exact value; terms < 2**56).
        sensitivity: the query's L1 sensitivity (a positive integer for scalars).
        dimension: number of coordinates released together (default 1).

    Guarantee: pure ``epsilon = sensitivity / scale``-DP (CKS 2020 §2). For scalars the RDP
    curve and ``epsilon(delta)`` are exact (:func:`discrete_laplace_rdp`,
    :func:`discrete_laplace_delta`); for vectors, the pure-DP (randomized-response) curve.

    >>> m = DiscreteLaplaceMechanism.calibrate(sensitivity=1, epsilon=0.5)
    >>> m.scale, m.pure_epsilon
    (Fraction(2, 1), 0.5)
    """

    def __init__(
        self,
        scale: Any,
        sensitivity: Any = 1,
        *,
        dimension: int = 1,
        value_bound: int = VALUE_BOUND,
    ) -> None:
        self.value_bound = _check_bound(value_bound)
        sc = as_fraction("scale", scale)
        _check_terms("scale", scale, sc)
        self.dimension = check_int("dimension", dimension, 1)
        sens = (
            Fraction(_sensitivity_int(sensitivity))
            if self.dimension == 1
            else as_fraction("sensitivity", sensitivity)
        )
        self.scale = sc
        self.sensitivity = float(sens)
        self._exact_epsilon = sens / sc
        self.pure_epsilon = _float_up(self._exact_epsilon)
        self._shift: int | None = int(sens) if self.dimension == 1 else None

    def release(self, value: Any, rng: Any = None) -> Any:
        """``value`` (integers, ``dimension`` entries) plus discrete Laplace noise (int64)."""
        x, scalar = in_range_integers(value, self.value_bound)  # one path for all in range
        _check_size(x, self.dimension)
        noise = noise_laplace_int(
            self.scale.numerator, self.scale.denominator, x.size, get_source(rng)
        )
        out = add_integers(x, noise)  # exact: int64, or Python ints beyond its range
        return int(out.reshape(-1)[0]) if scalar else out

    def rdp(self, orders: ArrayLike = DEFAULT_ORDERS) -> RdpCurve:
        """Scalars: the exact curve (:func:`discrete_laplace_rdp`), never above the pure-DP
        (randomized-response) curve; vectors: the pure-DP curve."""
        return _laplace_curve(self.pure_epsilon, self.scale, self._shift, orders)

    def epsilon(self, delta: float) -> float:
        """Scalars: the exact profile (:func:`discrete_laplace_epsilon`); vectors: pure."""
        d = check_delta(delta)
        if self._shift is None:
            return self.pure_epsilon
        return min(self.pure_epsilon, discrete_laplace_epsilon(self.scale, self._shift, d))

    def event(self) -> Event:
        return DiscreteLaplaceEvent(scale=float(self.scale), sensitivity=self.sensitivity)

    @classmethod
    def calibrate(
        cls,
        sensitivity: Any = 1,
        *,
        epsilon: Any = None,
        delta: Any = None,
        alpha: Any = None,
        rho: Any = None,
        dimension: int = 1,
    ) -> DiscreteLaplaceMechanism:
        """Scale for a target: pure ``epsilon`` (exact: scale = Delta / epsilon, rounded up to
        a float); scalars with ``epsilon`` + ``delta`` or ``alpha`` + ``epsilon`` lower it
        with the exact profile / RDP curve (method ``"exact"``); vectors use the pure bound
        or the pure->RDP curve; ``rho`` goes through ``epsilon^2 / 2``."""
        target = parse_target(epsilon, delta, alpha, rho)
        sens = (
            Fraction(_sensitivity_int(sensitivity))
            if dimension == 1
            else as_fraction("sensitivity", sensitivity)
        )
        eps, method, bound = pure_epsilon_for(target)
        scale = _float_up(sens / Fraction(eps))
        while sens / Fraction(scale) > Fraction(eps):  # exact check, rational arithmetic
            scale = up(scale)
        check: Any = None
        if dimension == 1 and target.kind == "approx":
            check = lambda m: m.epsilon(target.delta)  # noqa: E731
            bound = "exact discrete-Laplace profile"
        elif dimension == 1 and target.kind == "rdp":
            check = lambda m: float(m.rdp([target.alpha]).epsilons[0])  # noqa: E731
            bound = "exact discrete-Laplace RDP curve"
        if check is not None:
            scale = smallest_scale(lambda b: check(cls(b, sensitivity)), target.epsilon, scale)
            mech = cls(scale, sensitivity)
            return mech._with(
                Calibration(target.describe(), "exact", bound, check(mech), target.epsilon)
            )
        mech = cls(scale, sensitivity, dimension=dimension)
        achieved = pure_achieved(target, mech.pure_epsilon)
        return mech._with(Calibration(target.describe(), method, bound, achieved, _limit(target)))


def _laplace_curve(
    pure_epsilon: float, scale: Any, shift: int | None, orders: ArrayLike
) -> RdpCurve:
    """Pointwise minimum of the pure-DP curve and (for an integer shift) the exact curve."""
    curve = PureDp(pure_epsilon).to_rdp(orders)
    if shift is None:
        return curve
    exact = discrete_laplace_rdp(scale, shift, curve.orders)
    return RdpCurve(curve.orders, np.minimum(curve.epsilons, exact))


def _float_up(x: Fraction) -> float:
    """The smallest float >= the rational ``x``."""
    f = float(x)
    return f if Fraction(f) >= x else math.nextafter(f, math.inf)


def smallest_scale(check: Any, limit: float, hi: float) -> float:
    """Smallest noise scale ``b <= hi`` with ``check(b) <= limit`` (``check`` decreasing in
    ``b``, ``check(hi) <= limit``): Brent's method on ``log b``, then verified upwards."""
    if check(hi) > limit:  # pragma: no cover - callers pass a verified upper end
        raise RuntimeError("upper end of the scale search does not meet the target")
    lo = hi / 2.0
    while check(lo) <= limit and lo > hi * 2.0**-30:
        lo /= 2.0
    if check(lo) <= limit:
        return lo
    log_b = float(
        optimize.brentq(
            lambda x: check(math.exp(x)) - limit, math.log(lo), math.log(hi), xtol=1e-12
        )
    )
    return min(hi, grow_until(lambda b: check(b) <= limit, math.exp(log_b)))


def pure_epsilon_for(target: Target) -> tuple[float, str, str]:
    """Largest pure epsilon meeting a target (verified), with the method and bound used."""
    if target.kind in ("pure", "approx"):
        return target.epsilon, "pure", "pure epsilon-DP (delta not needed)"
    if target.kind == "zcdp":
        eps = grow_until(
            lambda e: PureDp(e).to_zcdp().rho <= target.rho, math.sqrt(2 * target.rho), up=False
        )
        return eps, "zcdp", "epsilon-DP => (epsilon^2/2)-zCDP (Bun & Steinke 2016 Prop. 3.3)"
    a = np.array([target.alpha])

    def f(e: float) -> float:
        return float(PureDp(e).to_rdp(a).epsilons[0]) - target.epsilon

    hi = 1.0
    while f(hi) < 0:
        hi *= 2
    e0 = float(optimize.brentq(f, 0.0, hi, xtol=1e-14))
    eps = grow_until(lambda e: f(e) <= 0, e0, up=False)
    return eps, "rdp", "pure DP -> RDP, randomized-response curve (tightest for pure DP)"


def pure_achieved(target: Target, eps: float) -> float:
    """The constrained quantity of a pure ``eps``-DP mechanism for ``target``."""
    if target.kind in ("pure", "approx"):
        return eps
    if target.kind == "zcdp":
        return PureDp(eps).to_zcdp().rho
    return float(PureDp(eps).to_rdp(np.array([target.alpha])).epsilons[0])
