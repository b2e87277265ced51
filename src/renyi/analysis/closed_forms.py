"""Closed-form privacy curves of the basic mechanisms.

* RDP curves of the Gaussian, Laplace and randomized-response mechanisms (Mironov 2017,
  "Rényi Differential Privacy", Table II), vectorised over Rényi orders, exact at ``alpha = 1``
  (the KL divergence) and ``alpha = inf`` (the max divergence) and evaluated in forms that stay
  accurate for orders just above 1, for huge orders and for tiny noise scales.
* The exact privacy profile of the Gaussian mechanism (Balle & Wang 2018, "Improving the
  Gaussian Mechanism for Differential Privacy", Theorem 8, the *analytic Gaussian mechanism*):
  ``delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)`` with ``mu = Delta / sigma``,
  and its inverses ``gaussian_epsilon`` (rounded up) and ``gaussian_mu`` (rounded down).
* The classic Gaussian calibration (Dwork & Roth 2014, Theorem A.1):
  ``sigma = sqrt(2 ln(1.25 / delta)) Delta_2 / epsilon``, proven for ``epsilon < 1``
  (``classic_gaussian_constant`` and ``classic_gaussian_sigma``).

The T-fold composition of a Gaussian mechanism with noise multiplier ``sigma`` is *exactly*
the Gaussian mechanism with ``mu = sqrt(T) / sigma`` (its privacy-loss distribution is again
Gaussian), so these functions are the ground truth every accountant is tested against.

Neighbouring relation: the curves hold for any relation under which the query's sensitivity
(L2 for the Gaussian, L1 for Laplace, one flipped bit for randomized response) is 1 in the
stated unit; the value is the same in both directions of the relation.

Orders: every function taking ``orders`` accepts a real scalar or an array of reals >= 1
(``inf`` allowed; ``1`` gives the KL divergence) and returns a float64 ``numpy.ndarray`` of the
same shape (a 0-d array for a scalar).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, overload

import numpy as np
import scipy
from numpy.typing import ArrayLike, NDArray
from scipy import special

from renyi._validation import (
    check_delta,
    check_nonnegative,
    check_positive,
    check_probability,
    check_range,
    fail,
)

__all__ = [
    "classic_gaussian_constant",
    "classic_gaussian_sigma",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_log_delta",
    "gaussian_mu",
    "gaussian_rdp",
    "laplace_rdp",
    "randomized_response_rdp",
]

_SQRT2 = math.sqrt(2.0)
_TINY = float(np.nextafter(0.0, 1.0))  # smallest positive float64 (a subnormal)


def _as_orders(orders: Any, name: str = "orders") -> NDArray[np.float64]:
    """Orders >= 1 (``inf`` allowed) as a float64 array of the input's shape (not sorted)."""
    try:
        raw = np.asarray(orders)
    except (TypeError, ValueError):  # pragma: no cover - ragged nested sequences
        raise fail(name, orders, "a real number >= 1 or an array of them") from None
    if raw.dtype.kind not in "iuf" or raw.size == 0:
        raise fail(name, orders, "a real number >= 1 or a non-empty array of them (no booleans)")
    arr = raw.astype(np.float64)
    bad = np.isnan(arr) | ~(arr >= 1.0)
    if bad.any():
        raise fail(name, float(arr[bad].flat[0]), "every order >= 1 (inf allowed, NaN not)")
    return arr


# ---------------------------------------------------------------------------------------------
# RDP curves (Mironov 2017, Table II)
# ---------------------------------------------------------------------------------------------


def gaussian_rdp(noise_multiplier: float, orders: ArrayLike) -> NDArray[np.float64]:
    """RDP curve of the Gaussian mechanism: ``eps(alpha) = alpha / (2 sigma^2)``.

    Guarantee: adding ``N(0, sigma^2)`` noise, ``sigma = noise_multiplier * Delta_2``, to a query
    of L2 sensitivity ``Delta_2`` (over the neighbouring relation of the caller, e.g.
    add/remove one record) is ``(alpha, alpha / (2 noise_multiplier^2))``-RDP for every
    ``alpha >= 1``; at ``alpha = inf`` the divergence is ``+inf``. Source: Mironov 2017,
    Table II and Proposition 7; the divergence of two normals, formulas.md §1.

    Args:
        noise_multiplier: ``sigma / Delta_2``, a finite number > 0.
        orders: Rényi orders >= 1 (scalar or array, ``inf`` allowed).

    Returns:
        ``eps(alpha)`` per order, same shape as ``orders``.

    Example:
        >>> float(gaussian_rdp(2.0, 4.0))
        0.5
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    alpha = _as_orders(orders)
    with np.errstate(over="ignore", divide="ignore", under="ignore"):
        # sigma^2 may underflow for absurdly small sigma: the true value is then above the
        # float64 range and +inf is the correct (conservative) answer.
        out = alpha / (2.0 * sigma * sigma)
    return np.asarray(out, dtype=np.float64)


def _expm1_minus_x(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """``exp(x) - 1 - x`` accurate to full relative precision, also for tiny ``|x|``."""
    out = np.empty_like(x)
    small = np.abs(x) <= 1.0
    xs = x[small]
    # Taylor series sum_{k>=2} x^k / k!, truncated after k = 20 (remainder < 2/21! relative).
    acc = np.full_like(xs, 1.0 / math.factorial(20))
    for k in range(19, 1, -1):  # Horner over the 19 series coefficients, not over the data
        acc = acc * xs + 1.0 / math.factorial(k)
    out[small] = acc * xs * xs
    xl = x[~small]
    with np.errstate(over="ignore"):
        out[~small] = np.expm1(xl) - xl
    return out


def laplace_rdp(scale: float, orders: ArrayLike) -> NDArray[np.float64]:
    """RDP curve of the Laplace mechanism with ``scale = b / Delta_1``.

    For ``alpha > 1`` (Mironov 2017, Table II and Proposition 6)::

        eps(alpha) = 1/(alpha-1) log( alpha/(2alpha-1) e^((alpha-1)/b)
                                      + (alpha-1)/(2alpha-1) e^(-alpha/b) ),

    ``eps(1) = 1/b + e^(-1/b) - 1`` (the KL divergence) and ``eps(inf) = 1/b`` (pure
    ``1/b``-DP). Guarantee: adding ``Laplace(b)`` noise to a query of L1 sensitivity
    ``Delta_1`` over the caller's neighbouring relation is ``(alpha, eps(alpha))``-RDP.

    Numerics: for ``alpha / b <= 1`` the argument of the logarithm is written as
    ``1 + [alpha g((alpha-1)/b) + (alpha-1) g(-alpha/b)] / (2alpha-1)`` with
    ``g(x) = e^x - 1 - x`` (the first-order terms cancel exactly), otherwise as
    ``1/b + [log1p((alpha-1)(1 + e^(-(2alpha-1)/b))) - log1p(2(alpha-1))] / (alpha-1)``, so
    neither large orders nor tiny scales overflow and orders just above 1 keep full accuracy.

    Args:
        scale: ``b / Delta_1``, a finite number > 0.
        orders: Rényi orders >= 1 (scalar or array, ``inf`` allowed).

    Example:
        >>> round(float(laplace_rdp(1.0, float("inf"))), 12)
        1.0
    """
    b = check_positive("scale", scale)
    alpha = _as_orders(orders)
    a = alpha.reshape(-1)
    out = np.empty_like(a)
    inf = np.isinf(a)
    out[inf] = 1.0 / b
    t = a - 1.0  # alpha - 1 >= 0
    small = ~inf & (a <= b)
    large = ~inf & ~small
    # Small branch: both exponents in [-1, 1].
    ts, as_ = t[small], a[small]
    s_minus_1 = (as_ * _expm1_minus_x(ts / b) + ts * _expm1_minus_x(-as_ / b)) / (2.0 * ts + 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        val = np.log1p(s_minus_1) / ts
    at_one = ts == 0.0
    val[at_one] = _expm1_minus_x(np.full(int(at_one.sum()), -1.0 / b))
    out[small] = val
    # Large branch: alpha / b > 1, exponentials bounded by factoring out e^((alpha-1)/b).
    tl, al = t[large], a[large]
    with np.errstate(invalid="ignore", divide="ignore", under="ignore"):
        c = np.exp(-(2.0 * al - 1.0) / b)
        val = 1.0 / b + (np.log1p(tl * (1.0 + c)) - np.log1p(2.0 * tl)) / tl
    at_one = tl == 0.0
    val[at_one] = 1.0 / b + np.expm1(-1.0 / b)
    out[large] = val
    # 0 <= D_alpha <= D_inf = 1/b: clipping only removes rounding noise, on the safe side.
    return np.clip(out, 0.0, 1.0 / b).reshape(alpha.shape)


def _rr_rdp(
    log_odds: float, q: float, p_minus_q: float, alpha: NDArray[np.float64]
) -> NDArray[np.float64]:
    """RR curve from ``r = log(p/q) >= 0``, ``q = 1 - p <= 1/2`` and ``p - q`` (all exact-ish).

    ``exp((alpha-1) eps) = p e^(t r) + q e^(-t r)`` with ``t = alpha - 1``; written as
    ``1 + 2 sinh^2(t r / 2) + (p - q) sinh(t r)`` (no cancellation) when ``t r <= 1`` and as
    ``r + log1p(q expm1(-2 t r)) / t`` otherwise (no overflow).
    """
    a = alpha.reshape(-1)
    out = np.empty_like(a)
    if log_odds == 0.0:
        return np.zeros(alpha.shape)
    if math.isinf(log_odds):
        return np.full(alpha.shape, math.inf)
    r = log_odds
    inf = np.isinf(a)
    out[inf] = r
    t = a - 1.0
    with np.errstate(over="ignore"):
        tr = t * r
    small = ~inf & (tr <= 1.0)
    large = ~inf & ~small
    ts, trs = t[small], tr[small]
    sm1 = 2.0 * np.sinh(trs / 2.0) ** 2 + p_minus_q * np.sinh(trs)
    with np.errstate(invalid="ignore", divide="ignore"):
        val = np.log1p(sm1) / ts
    val[ts == 0.0] = p_minus_q * r  # alpha = 1: KL = (2p - 1) log(p / q)
    out[small] = val
    tl, trl = t[large], tr[large]
    with np.errstate(under="ignore"):
        out[large] = r + np.log1p(q * np.expm1(-2.0 * trl)) / tl
    return np.clip(out, 0.0, r).reshape(alpha.shape)


def randomized_response_rdp(p: float, orders: ArrayLike) -> NDArray[np.float64]:
    """RDP curve of binary randomized response that reports the true bit with probability ``p``.

    For ``alpha > 1`` (Mironov 2017, Table II and Proposition 5)::

        eps(alpha) = 1/(alpha-1) log( p^alpha (1-p)^(1-alpha) + (1-p)^alpha p^(1-alpha) ),

    ``eps(1) = (2p-1) log(p/(1-p))`` and ``eps(inf) = |log(p/(1-p))|``. Guarantee: the
    mechanism on one bit (neighbouring = the bit flipped) is ``(alpha, eps(alpha))``-RDP.

    ``p`` may be any probability in ``[0, 1]``: the curve is symmetric in ``p <-> 1 - p``
    (a mechanism that lies with probability ``p`` is as private as one telling the truth with
    probability ``p``), ``p = 1/2`` gives 0 and ``p in {0, 1}`` gives ``+inf`` at every order.

    Example:
        >>> import math
        >>> p = math.e / (1 + math.e)  # 1-DP randomized response
        >>> round(float(randomized_response_rdp(p, float("inf"))), 12)
        1.0
    """
    prob = check_probability("p", p)
    alpha = _as_orders(orders)
    # lo = min(p, 1 - p) <= 1/2; 1 - prob is exact (Sterbenz) for prob in [1/2, 1].
    lo = prob if prob < 0.5 else 1.0 - prob
    p_minus_q = (1.0 - prob) - prob if prob < 0.5 else prob - lo
    if lo == 0.0:
        return np.full(alpha.shape, math.inf)
    log_odds = math.log1p(p_minus_q / lo)
    return _rr_rdp(log_odds, lo, p_minus_q, alpha)


# ---------------------------------------------------------------------------------------------
# Exact privacy profile of the Gaussian mechanism (Balle & Wang 2018)
# ---------------------------------------------------------------------------------------------


def _log1mexp(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """``log(1 - exp(x))`` for ``x <= 0`` (Mächler's two-branch form)."""
    with np.errstate(divide="ignore"):
        return np.where(x > -math.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def _check_mu(mu: float) -> float:
    return check_positive("mu", mu)


def _log_delta(mu: float, eps: NDArray[np.float64]) -> NDArray[np.float64]:
    """``log delta(eps)`` for validated ``mu`` and ``eps >= 0`` (``inf`` gives ``-inf``)."""
    out = np.full(eps.shape, -math.inf)
    fin = np.isfinite(eps)
    e = eps[fin]
    a = mu / 2.0 - e / mu
    b = -mu / 2.0 - e / mu
    log_pa = special.log_ndtr(a)
    # Tail (a < 0): D = log(e^eps Phi(b) / Phi(a)) < 0 via the Mills-ratio identity
    # Phi(x) = erfcx(-x/sqrt2) e^(-x^2/2) / 2 and b^2 - a^2 = 2 eps, which removes the two huge,
    # nearly equal exponents; then log delta = log Phi(a) + log(1 - e^D).
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        u, v = -a / _SQRT2, -b / _SQRT2  # 0 < u < v = u + mu / sqrt2 in the tail
        d_tail = np.log(special.erfcx(v)) - np.log(special.erfcx(u))
        # Far tail (u > 1e3): the ratio of the asymptotic series
        # erfcx(x) = (1 - 1/(2x^2) + O(x^-4)) / (x sqrt(pi)), so that a gap h = v - u far
        # below u does not round away (relative error O(u^-4) < 1e-12).
        h = mu / _SQRT2
        d_far = -np.log1p(h / u) + np.log1p(
            h * (u + v) / (2.0 * u * u * v * v) / (1.0 - 1.0 / (2.0 * u * u))
        )
        d_tail = np.where(u > 1e3, d_far, d_tail)
        log_tail = log_pa + _log1mexp(np.minimum(d_tail, 0.0))
        # Body (a >= 0 > b): Phi(a) - Phi(b) = (erf(a/sqrt2) + erf(-b/sqrt2)) / 2 has no
        # cancellation (accurate even for tiny mu), and the remaining term
        # (e^eps - 1) Phi(b) is at most about a third of it.
        first = 0.5 * (special.erf(a / _SQRT2) + special.erf(-b / _SQRT2))
        log_em1 = e + np.log(-np.expm1(-e))  # log(e^eps - 1), -inf at eps = 0
        body = first - np.exp(log_em1 + special.log_ndtr(b))
        log_body = np.log(body)
    use_body = (a >= 0.0) & (body > 0.0)
    out[fin] = np.where(use_body, log_body, log_tail)
    return out


@overload
def gaussian_log_delta(mu: float, epsilon: float) -> float: ...
@overload
def gaussian_log_delta(mu: float, epsilon: ArrayLike) -> float | NDArray[np.float64]: ...
def gaussian_log_delta(mu: float, epsilon: ArrayLike) -> float | NDArray[np.float64]:
    """Natural log of the exact Gaussian ``delta(epsilon)`` (see :func:`gaussian_delta`).

    Useful when ``delta`` underflows float64 (below about ``1e-308``).

    Example:
        >>> gaussian_log_delta(1.0, 50.0) < -1000
        True
    """
    m = _check_mu(mu)
    eps, scalar = _as_epsilons(epsilon)
    out = _log_delta(m, eps)
    return float(out) if scalar else out


def _as_epsilons(epsilon: ArrayLike) -> tuple[NDArray[np.float64], bool]:
    """Epsilons >= 0 (``inf`` allowed) as an array, and whether the input was a scalar."""
    if isinstance(epsilon, numbers.Real):
        return np.array(check_nonnegative("epsilon", epsilon, allow_inf=True)), True
    raw = np.asarray(epsilon)
    if raw.dtype.kind not in "iuf" or raw.size == 0:
        raise fail("epsilon", epsilon, "a real number >= 0 or a non-empty array of them")
    arr = raw.astype(np.float64)
    bad = np.isnan(arr) | ~(arr >= 0.0)
    if bad.any():
        raise fail("epsilon", float(arr[bad].flat[0]), "every epsilon >= 0 (inf allowed)")
    return arr, False


@overload
def gaussian_delta(mu: float, epsilon: float) -> float: ...
@overload
def gaussian_delta(mu: float, epsilon: ArrayLike) -> float | NDArray[np.float64]: ...
def gaussian_delta(mu: float, epsilon: ArrayLike) -> float | NDArray[np.float64]:
    """Exact ``delta(epsilon)`` of the Gaussian mechanism with ``mu = Delta_2 / sigma``.

    ``delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)`` (Balle & Wang 2018,
    Theorem 8): the smallest ``delta`` such that adding ``N(0, sigma^2)`` to a query of L2
    sensitivity ``Delta_2`` is ``(eps, delta)``-DP (for the neighbouring relation defining the
    sensitivity; both directions give the same profile). This is tight, not a bound.

    Computed in log space from ``log_ndtr`` and ``erfcx`` (no cancellation between the two
    terms), so values far below ``1e-300`` are accurate. A true value that underflows float64
    is returned as the smallest positive float (never 0 for finite ``epsilon``).

    Args:
        mu: ``Delta_2 / sigma`` (``sqrt(T) / noise_multiplier`` after T compositions), > 0.
        epsilon: scalar or array of reals >= 0 (``inf`` gives 0).

    Returns:
        A float for a scalar ``epsilon``, else an array of its shape.

    Example:
        >>> round(gaussian_delta(1.0, 0.0), 10)  # total variation 2 Phi(1/2) - 1
        0.3829249225
    """
    m = _check_mu(mu)
    eps, scalar = _as_epsilons(epsilon)
    logd = _log_delta(m, eps)
    with np.errstate(under="ignore"):
        d = np.exp(logd)
    d = np.where(np.isfinite(logd) & (d == 0.0), _TINY, d)
    d = np.minimum(d, 1.0)
    return float(d) if scalar else d


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact ``epsilon(delta)`` of the Gaussian mechanism with ``mu = Delta_2 / sigma``.

    The smallest ``eps >= 0`` with ``gaussian_delta(mu, eps) <= delta`` (Balle & Wang 2018,
    Theorem 8, inverted numerically). Found by bracketing and Brent's method on
    ``log delta(eps)`` and then verified: the returned value satisfies
    ``gaussian_delta(mu, result) <= delta`` (nudged upwards if rounding required it), so it
    is never smaller than the true epsilon by more than float rounding in the safe direction.

    Example:
        >>> eps = gaussian_epsilon(1.0, 1e-5)
        >>> gaussian_delta(1.0, eps) <= 1e-5
        True
    """
    m = _check_mu(mu)
    d = check_delta(delta)
    log_target = math.log(d)

    def f(e: float) -> float:
        return float(_log_delta(m, np.array(e))) - log_target

    if f(0.0) <= 0.0:
        return 0.0
    # Phi(mu/2 - eps/mu) <= exp(-(eps/mu - mu/2)^2 / 2) bounds delta(eps), so this is a bracket.
    hi = m * (m / 2.0 + math.sqrt(2.0 * -log_target)) + 1.0
    while f(hi) > 0.0:  # cannot loop long: f decreases faster than quadratically
        hi *= 2.0
    eps = float(scipy.optimize.brentq(f, 0.0, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps))
    # Verify against log delta with a margin that covers the float error of log delta itself
    # (< 1e-11 relative, tested), so the result is an upper bound on the exact epsilon.
    return _nudge(lambda x: f(x) <= -_LOG_DELTA_MARGIN, eps, up=True)


def gaussian_mu(epsilon: float, delta: float) -> float:
    """Largest ``mu = Delta_2 / sigma`` for which the Gaussian mechanism is ``(epsilon, delta)``-DP.

    Inverts the exact profile of Balle & Wang 2018 (Theorem 8) in ``mu``: ``delta(eps)`` is
    increasing in ``mu``, so the answer is the root of ``gaussian_delta(mu, epsilon) = delta``,
    found by bracketing and Brent's method on a log scale and then verified and rounded down so
    that ``gaussian_delta(result, epsilon) <= delta``. The noise to use is
    ``sigma = Delta_2 / result`` (the analytic Gaussian mechanism).

    Example:
        >>> mu = gaussian_mu(1.0, 1e-5)
        >>> gaussian_delta(mu, 1.0) <= 1e-5
        True
    """
    e = check_nonnegative("epsilon", epsilon)
    d = check_delta(delta)
    log_target = math.log(d)

    def f(log_mu: float) -> float:
        return float(_log_delta(math.exp(log_mu), np.array(e))) - log_target

    lo, hi = -1.0, 1.0
    while f(lo) > 0.0:
        if lo <= -700.0:  # mu < 1e-304: delta below what float64 can represent
            raise fail("delta", delta, "a value in (1e-300, 1) for gaussian_mu")
        lo = max(lo - 2.0 * (1.0 - lo), -700.0)
    while f(hi) <= 0.0:
        hi += 2.0 * (1.0 + hi)
    log_mu = float(scipy.optimize.brentq(f, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps))
    mu = _nudge(lambda x: f(math.log(x)) <= -_LOG_DELTA_MARGIN, math.exp(log_mu), up=False)
    return mu


# ---------------------------------------------------------------------------------------------
# the classic Gaussian mechanism (Dwork & Roth 2014, Theorem A.1)
# ---------------------------------------------------------------------------------------------


def classic_gaussian_constant(delta: float) -> float:
    """``c(delta) = sqrt(2 ln(1.25 / delta))`` of the classic Gaussian mechanism.

    Dwork & Roth 2014, Theorem A.1: adding ``N(0, (c(delta) Delta_2 / epsilon)^2)`` to a
    query of L2 sensitivity ``Delta_2`` is ``(epsilon, delta)``-DP for ``epsilon < 1``
    (any neighbouring relation the sensitivity is defined over). Equivalently the classic
    per-release epsilon of noise ``sigma`` is ``c(delta) Delta_2 / sigma``, a valid bound
    only when that value is below 1 (callers going beyond must verify it, e.g. with
    :func:`gaussian_delta`). See :func:`classic_gaussian_sigma` for the calibrated noise.

    Example:
        >>> round(classic_gaussian_constant(1e-5), 4)
        4.8448
    """
    d = check_delta(delta)
    return math.sqrt(2.0 * math.log(1.25 / d))


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Noise standard deviation of the classic Gaussian mechanism (Dwork & Roth 2014, Thm A.1).

    ``sigma = sqrt(2 ln(1.25 / delta)) * sensitivity / epsilon``: adding ``N(0, sigma^2)``
    to a query of L2 sensitivity ``sensitivity`` is ``(epsilon, delta)``-DP. The theorem is
    proven only for ``epsilon < 1``, so ``epsilon`` must lie in ``(0, 1)`` (a larger value
    raises :class:`~renyi.errors.PrivacyParameterError`; :func:`gaussian_mu` gives the exact,
    smaller noise for any epsilon). Never smaller than the analytic Gaussian's
    ``sensitivity / gaussian_mu(epsilon, delta)``.

    Example:
        >>> round(classic_gaussian_sigma(0.5, 1e-5), 4)
        9.6896
    """
    e = check_range("epsilon", epsilon, 0.0, 1.0, low_open=True, high_open=True)
    d = check_delta(delta)
    s = check_positive("sensitivity", sensitivity)
    return classic_gaussian_constant(d) * s / e


# Relative error allowed for our own evaluation of delta when verifying a root: roots are
# accepted only if log delta(root) <= log(target) - margin, i.e. delta <= target (1 - 1e-10).
_LOG_DELTA_MARGIN = 1e-10


def _nudge(ok: Any, x: float, *, up: bool) -> float:
    """Move ``x`` by growing steps in the safe direction until ``ok(x)`` holds."""
    step = max(abs(x) * 4 * np.finfo(float).eps, 1e-300)
    for _ in range(200):
        if ok(x):
            return x
        x = x + step if up else x - step
        step *= 2.0
    raise RuntimeError("could not verify a conservative root")  # pragma: no cover
