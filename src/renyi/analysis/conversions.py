"""Conversions between privacy notions: one function per theorem, each citing it.

The value types of :mod:`renyi.analysis.curves` delegate here, so every formula has a single home.
All results are *upper bounds* on the privacy loss (they err on the safe side): where an
optimisation over the Rényi order is involved, any order gives a valid bound, so an imprecise
optimiser can only lose tightness, never validity; the reported value is always the bound
evaluated at the reported order.

Neighbouring relation: a conversion preserves whatever relation its input guarantee was
stated for (e.g. add/remove one record); it does not change it.

RDP -> (epsilon, delta) functions take the curve as two 1-D arrays ``orders`` (reals > 1,
``inf`` allowed) and ``epsilons`` (>= 0, ``inf`` allowed) of equal length and return
``(value, order)`` where ``order`` is the order achieving the optimum.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy
from numpy.typing import ArrayLike, NDArray
from scipy import special

from renyi._validation import (
    check_delta,
    check_int,
    check_nonnegative,
    check_positive,
    fail,
)
from renyi.analysis.closed_forms import _as_orders, _rr_rdp

__all__ = [
    "group_privacy_rdp",
    "pure_to_rdp",
    "pure_to_rdp_bun_steinke",
    "pure_to_rdp_lemma1",
    "pure_to_zcdp",
    "rdp_to_delta",
    "rdp_to_delta_bretagnolle_huber",
    "rdp_to_delta_mironov",
    "rdp_to_dp",
    "rdp_to_dp_mironov",
    "zcdp_max_rho",
    "zcdp_to_delta",
    "zcdp_to_dp",
    "zcdp_to_dp_bun_steinke",
    "zcdp_to_rdp",
]


def _curve(orders: Any, epsilons: Any) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Validate an RDP curve given as arrays (orders > 1 strictly, epsilons >= 0 or inf)."""
    raw = np.asarray(orders)
    if raw.dtype.kind not in "iuf" or raw.ndim != 1 or raw.size == 0:
        raise fail("orders", orders, "a non-empty 1-D array of real numbers > 1")
    a = raw.astype(np.float64)
    bad = np.isnan(a) | ~(a > 1.0)
    if bad.any():
        raise fail("orders", float(a[bad][0]), "every order > 1 (inf allowed, NaN not)")
    eraw = np.asarray(epsilons)
    if eraw.dtype.kind not in "iuf" or eraw.shape != a.shape:
        raise fail(
            "epsilons",
            epsilons,
            f"a 1-D array of real numbers of the same length as orders ({a.size})",
        )
    e = eraw.astype(np.float64)
    bad = np.isnan(e) | ~(e >= 0.0)
    if bad.any():
        raise fail("epsilons", float(e[bad][0]), "every epsilon >= 0 (inf allowed, NaN not)")
    return a, e


_TINY = float(np.nextafter(0.0, 1.0))


def _exp_up(log_value: float) -> float:
    """``exp(log_value)`` capped at 1, rounded up to the smallest positive float on underflow."""
    if log_value >= 0.0:
        return 1.0
    if math.isinf(log_value):
        return 0.0
    return max(math.exp(log_value), _TINY)


def _argmin(values: NDArray[np.float64], orders: NDArray[np.float64]) -> tuple[float, float]:
    i = int(np.argmin(values))
    return float(values[i]), float(orders[i])


# ---------------------------------------------------------------------------------------------
# RDP -> (epsilon, delta)
# ---------------------------------------------------------------------------------------------


BalleTerms = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]


def _balle_order_terms(a: NDArray[np.float64]) -> BalleTerms:
    """The order-only parts of Theorem 21: ``(log1p(-1/a), log a, a - 1)``, computed once per
    grid by callers that convert many curves on the same orders."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.log1p(-1.0 / a), np.log(a), a - 1.0


def _balle_shift(terms: BalleTerms, log_delta: float) -> NDArray[np.float64]:
    """``(log delta + log a) / (a - 1)`` per order (inf / inf gives NaN at ``a = inf``: call
    under ``np.errstate(invalid="ignore")``)."""
    return (log_delta + terms[1]) / terms[2]  # type: ignore[no-any-return]


def _balle_from_terms(
    e: NDArray[np.float64], terms: BalleTerms, shift: NDArray[np.float64], is_inf: NDArray[np.bool_]
) -> NDArray[np.float64]:
    """``eps(a) + log1p(-1/a) - shift`` per order; ``eps(inf)`` at inf (call under
    ``np.errstate(invalid="ignore", over="ignore")``)."""
    return np.where(is_inf, e, e + terms[0] - shift)


def _balle_epsilons(
    a: NDArray[np.float64], e: NDArray[np.float64], log_delta: float
) -> NDArray[np.float64]:
    """``eps(a) + log1p(-1/a) - (log delta + log a) / (a - 1)`` per order; ``eps(inf)`` at inf."""
    terms = _balle_order_terms(a)
    with np.errstate(invalid="ignore", over="ignore"):
        return _balle_from_terms(e, terms, _balle_shift(terms, log_delta), np.isinf(a))


def rdp_to_delta_bretagnolle_huber(orders: ArrayLike, epsilons: ArrayLike) -> tuple[float, float]:
    """A ``delta`` valid at *every* ``epsilon >= 0``: ``delta <= sqrt(1 - exp(-eps(alpha)))``.

    For ``epsilon >= 0``, ``delta(epsilon) <= delta(0) = TV(P, Q)``; the Bretagnolle-Huber
    inequality (Bretagnolle & Huber 1979; Tsybakov 2009, Lemma 2.6 and its proof; Canonne
    2022, arXiv:2202.07198) gives ``TV(P, Q) <= sqrt(1 - exp(-KL(P || Q)))``, and
    ``KL = D_1 <= D_alpha`` for ``alpha > 1`` (monotonicity in the order, van Erven &
    Harremoës 2014, Theorem 3). So every order of an RDP curve yields this bound; the smallest
    is returned. It matters only for tiny curves (large ``delta``), where the ``log delta``
    terms of Theorem 21 are loose; dp_accounting applies the same test.

    Returns:
        ``(delta, order)``.

    Example:
        >>> d, order = rdp_to_delta_bretagnolle_huber([2.0, 3.0], [1e-4, 2e-4])
        >>> round(d, 6), order
        (0.01, 2.0)
    """
    a, e = _curve(orders, epsilons)
    val = np.sqrt(-np.expm1(-e))
    i = int(np.argmin(val))
    return float(val[i]), float(a[i])


def rdp_to_dp(orders: ArrayLike, epsilons: ArrayLike, delta: float) -> tuple[float, float]:
    """Smallest ``epsilon`` with ``(epsilon, delta)``-DP implied by an RDP curve.

    Balle, Barthe, Gaboardi, Hsu & Sato 2020, "Hypothesis testing interpretations and Rényi
    differential privacy", Theorem 21 (= Canonne, Kamath & Steinke 2020, Proposition 12):
    ``(alpha, eps(alpha))``-RDP implies ``(eps_DP, delta)``-DP with::

        eps_DP = eps(alpha) + log((alpha-1)/alpha) - (log delta + log alpha) / (alpha-1),

    minimised over the given orders; at ``alpha = inf`` it is ``eps(inf)`` (pure DP). A
    negative minimum is reported as 0 (``(eps', delta)``-DP with ``eps' < 0`` implies
    ``(0, delta)``-DP), and so is the case ``delta >= sqrt(1 - exp(-eps(alpha)))``
    (:func:`rdp_to_delta_bretagnolle_huber`). Always at most :func:`rdp_to_dp_mironov`.

    Returns:
        ``(epsilon, order)``: the bound and the order achieving it.

    Example:
        >>> eps, order = rdp_to_dp([2.0, 4.0, 8.0], [1.0, 2.0, 4.0], 1e-5)
        >>> round(eps, 4), order
        (5.0879, 4.0)
    """
    a, e = _curve(orders, epsilons)
    d = check_delta(delta)
    bh_delta, bh_order = rdp_to_delta_bretagnolle_huber(a, e)
    if d >= bh_delta:
        return 0.0, bh_order
    eps, order = _argmin(_balle_epsilons(a, e, math.log(d)), a)
    return max(eps, 0.0), order


def rdp_to_dp_mironov(orders: ArrayLike, epsilons: ArrayLike, delta: float) -> tuple[float, float]:
    """``(epsilon, delta)``-DP from an RDP curve by Mironov 2017, Proposition 3.

    ``(alpha, eps(alpha))``-RDP implies ``(eps(alpha) + log(1/delta)/(alpha-1), delta)``-DP;
    minimised over the given orders (``eps(inf)`` at ``alpha = inf``).

    Returns:
        ``(epsilon, order)``.

    Example:
        >>> eps, order = rdp_to_dp_mironov([60.0], [500 * 60 / (2 * 200.0**2)], 1e-5)
        >>> round(eps, 4)  # the book chapter's RDP value for 500 Gaussian releases
        0.5701
    """
    a, e = _curve(orders, epsilons)
    d = check_delta(delta)
    with np.errstate(invalid="ignore"):
        val = np.where(np.isinf(a), e, e + math.log(1.0 / d) / (a - 1.0))
    eps, order = _argmin(val, a)
    return max(eps, 0.0), order


def _check_target_epsilon(epsilon: Any) -> float:
    return check_nonnegative("epsilon", epsilon)


def rdp_to_delta(orders: ArrayLike, epsilons: ArrayLike, epsilon: float) -> tuple[float, float]:
    """Smallest ``delta`` with ``(epsilon, delta)``-DP implied by an RDP curve.

    The inverse of :func:`rdp_to_dp` (Balle et al. 2020, Theorem 21; Canonne, Kamath & Steinke
    2020, Proposition 12)::

        log delta = (alpha-1) (eps(alpha) - epsilon + log(1 - 1/alpha)) - log alpha,

    minimised over the orders and capped at 1 (every mechanism is ``(epsilon, 1)``-DP) and by
    :func:`rdp_to_delta_bretagnolle_huber`. At ``alpha = inf`` the bound is 0 when
    ``eps(inf) <= epsilon`` and 1 otherwise.

    Returns:
        ``(delta, order)``.

    Example:
        >>> delta, order = rdp_to_delta([2.0, 4.0, 8.0], [1.0, 2.0, 4.0], 5.09)
        >>> delta <= 1e-5, order
        (True, 4.0)
    """
    a, e = _curve(orders, epsilons)
    eps = _check_target_epsilon(epsilon)
    with np.errstate(invalid="ignore", over="ignore"):
        log_d = (a - 1.0) * (e - eps + np.log1p(-1.0 / a)) - np.log(a)
    log_d = np.where(np.isinf(a), np.where(e <= eps, -math.inf, 0.0), log_d)
    log_d = np.where(np.isnan(log_d), 0.0, log_d)  # inf - inf: eps(alpha) = inf -> no bound
    val, order = _argmin(log_d, a)
    delta = _exp_up(val)
    bh_delta, bh_order = rdp_to_delta_bretagnolle_huber(a, e)
    if bh_delta < delta:
        return bh_delta, bh_order
    return delta, order


def rdp_to_delta_mironov(
    orders: ArrayLike, epsilons: ArrayLike, epsilon: float
) -> tuple[float, float]:
    """Smallest ``delta`` with ``(epsilon, delta)``-DP by Mironov 2017, Proposition 3.

    Inverting ``epsilon = eps(alpha) + log(1/delta)/(alpha-1)`` gives
    ``delta = exp(-(alpha-1)(epsilon - eps(alpha)))``, minimised over the orders and capped at
    1 (0 at ``alpha = inf`` when ``eps(inf) <= epsilon``).

    Returns:
        ``(delta, order)``.

    Example:
        >>> delta, order = rdp_to_delta_mironov([60.0], [0.375], 0.5701)
        >>> round(delta, 6)
        1e-05
    """
    a, e = _curve(orders, epsilons)
    eps = _check_target_epsilon(epsilon)
    with np.errstate(invalid="ignore", over="ignore"):
        log_d = (a - 1.0) * (e - eps)
    log_d = np.where(np.isinf(a), np.where(e <= eps, -math.inf, 0.0), log_d)
    log_d = np.where(np.isnan(log_d), 0.0, log_d)
    val, order = _argmin(log_d, a)
    return _exp_up(val), order


# ---------------------------------------------------------------------------------------------
# zCDP
# ---------------------------------------------------------------------------------------------


def _check_rho(rho: Any) -> float:
    return check_nonnegative("rho", rho, allow_inf=True)


def zcdp_to_rdp(rho: float, orders: ArrayLike) -> NDArray[np.float64]:
    """RDP curve of ``rho``-zCDP: ``eps(alpha) = rho * alpha`` (Bun & Steinke 2016, Def. 1.1).

    ``rho``-zCDP is by definition ``(alpha, rho alpha)``-RDP for every ``alpha > 1``; the
    value at ``alpha = inf`` is ``inf`` (0 when ``rho = 0``).

    Example:
        >>> zcdp_to_rdp(0.5, [2.0, 4.0]).tolist()
        [1.0, 2.0]
    """
    r = _check_rho(rho)
    a = _as_orders(orders)
    if r == 0.0:
        return np.zeros(a.shape)
    with np.errstate(over="ignore"):
        return np.asarray(r * a, dtype=np.float64)


def zcdp_to_dp_bun_steinke(rho: float, delta: float) -> float:
    """``rho``-zCDP implies ``(rho + 2 sqrt(rho log(1/delta)), delta)``-DP.

    Bun & Steinke 2016, "Concentrated Differential Privacy: Simplifications, Extensions, and
    Lower Bounds", Proposition 1.3.

    Example:
        >>> round(zcdp_to_dp_bun_steinke(0.00625, 1e-5), 5)  # book chapter, sigma=200, k=500
        0.54274
    """
    r = _check_rho(rho)
    d = check_delta(delta)
    return r + 2.0 * math.sqrt(r * math.log(1.0 / d))


def _zcdp_balle_eps(rho: float, t: float, log_delta: float) -> float:
    """Theorem 21 bound for ``eps(alpha) = rho alpha`` at ``alpha = 1 + t`` (``t > 0``)."""
    log_a = math.log1p(t)
    return rho * (1.0 + t) + (math.log(t) - log_a) - (log_delta + log_a) / t


def zcdp_to_dp(rho: float, delta: float) -> tuple[float, float]:
    """Tight ``(epsilon, delta)``-DP of ``rho``-zCDP by optimising the RDP conversion.

    Applies Balle et al. 2020, Theorem 21 (Canonne, Kamath & Steinke 2020, Prop. 12) to the
    RDP curve ``eps(alpha) = rho alpha`` (Bun & Steinke 2016, Def. 1.1) and minimises over
    *continuous* ``alpha > 1`` (bounded scalar minimisation in ``log(alpha - 1)``). Any order
    gives a valid bound, so the result is the bound evaluated at the returned order; it is
    never larger than :func:`zcdp_to_dp_bun_steinke` (its optimal order is tried as well).
    When ``delta >= sqrt(1 - exp(-rho))`` the answer is ``(0, 1.0)`` (Bretagnolle-Huber, see
    :func:`rdp_to_delta_bretagnolle_huber`, with ``KL <= rho``).

    Returns:
        ``(epsilon, order)``; ``(0.0, inf)`` for ``rho = 0``, ``(inf, inf)`` for ``rho = inf``.

    Example:
        >>> eps, order = zcdp_to_dp(0.00625, 1e-5)
        >>> eps < 0.5428
        True
    """
    r = _check_rho(rho)
    d = check_delta(delta)
    if r == 0.0:
        return 0.0, math.inf
    if math.isinf(r):
        return math.inf, math.inf
    if d >= math.sqrt(-math.expm1(-r)):
        # KL = D_1 <= rho, so delta >= TV by Bretagnolle-Huber: (0, delta)-DP.
        return 0.0, 1.0
    log_d = math.log(d)

    def bound(x: float) -> tuple[float, float]:
        a = 1.0 + math.exp(x)
        return _zcdp_balle_eps(r, a - 1.0, log_d), a  # a - 1 is exact: bound at order a

    # Bun-Steinke's optimal order for the Mironov conversion: a good start and a fallback.
    x0 = 0.5 * math.log(-log_d / r)
    lo, hi = _log_t_bounds(x0)
    res = scipy.optimize.minimize_scalar(
        lambda x: bound(x)[0], bounds=(lo, hi), method="bounded", options={"xatol": 1e-10}
    )
    best = min(bound(float(res.x)), bound(min(max(x0, lo), hi)))
    return max(best[0], 0.0), best[1]


def _log_t_bounds(x0: float) -> tuple[float, float]:
    """Search interval for ``x = log(alpha - 1)`` around ``x0``, kept where floats resolve it."""
    lo = max(x0 - 30.0, -34.0)  # alpha - 1 >= 1.7e-15: 1 + t stays distinct from 1
    hi = min(max(x0 + 30.0, lo + 1.0), 700.0)
    return lo, hi


def zcdp_to_delta(rho: float, epsilon: float) -> tuple[float, float]:
    """Smallest ``delta`` with ``(epsilon, delta)``-DP for ``rho``-zCDP, optimised over orders.

    Minimises ``log delta(alpha) = (alpha-1)(rho alpha - epsilon + log(1-1/alpha)) - log alpha``
    (Balle et al. 2020, Thm. 21 applied to ``eps(alpha) = rho alpha``) over continuous
    ``alpha > 1``; the result is the bound at the returned order, capped at 1.

    Also capped by ``sqrt(1 - exp(-rho))`` (Bretagnolle-Huber, with ``KL <= rho``), reported
    with order 1.

    Returns:
        ``(delta, order)``; ``(0.0, inf)`` for ``rho = 0``.

    Example:
        >>> delta, order = zcdp_to_delta(0.00625, 0.5428)
        >>> delta < 1e-5
        True
    """
    r = _check_rho(rho)
    eps = _check_target_epsilon(epsilon)
    if r == 0.0:
        return 0.0, math.inf
    if math.isinf(r):
        return 1.0, math.inf

    def log_delta(x: float) -> tuple[float, float]:
        a = 1.0 + math.exp(x)
        t = a - 1.0  # exact: the bound is evaluated at the reported order a
        log_a = math.log1p(t)
        return t * (r * a - eps + math.log(t) - log_a) - log_a, a

    # Optimum of the Mironov form: alpha - 1 ~ (epsilon - rho) / (2 rho).
    x0 = math.log(max((eps - r) / (2.0 * r), 1e-8))
    lo, hi = _log_t_bounds(x0)
    res = scipy.optimize.minimize_scalar(
        lambda x: log_delta(x)[0], bounds=(lo, hi), method="bounded", options={"xatol": 1e-10}
    )
    best = min(log_delta(float(res.x)), log_delta(min(max(x0, lo), hi)))
    delta, order = _exp_up(best[0]), best[1]
    bh = math.sqrt(-math.expm1(-r))  # Bretagnolle-Huber with KL <= rho (order 1)
    if bh < delta:
        return bh, 1.0
    return delta, order


def zcdp_max_rho(epsilon: float, delta: float) -> float:
    """Largest ``rho`` whose tight conversion :func:`zcdp_to_dp` gives at most ``epsilon``.

    The inverse in ``rho`` of Balle et al. 2020, Theorem 21 applied to ``rho``-zCDP (see
    :func:`zcdp_to_dp`): any ``rho``-zCDP mechanism with ``rho <=`` the result is
    ``(epsilon, delta)``-DP. Brent's method on ``log rho``, then verified: the root is moved
    down by growing relative steps until ``zcdp_to_dp(rho, delta)[0] <= epsilon`` holds, so
    the answer errs on the safe (smaller) side. Used to calibrate Gaussian noise through zCDP
    (``sigma = Delta / sqrt(2 rho)``).

    Example:
        >>> rho = zcdp_max_rho(1.0, 1e-5)
        >>> zcdp_to_dp(rho, 1e-5)[0] <= 1.0
        True
    """
    e = check_positive("epsilon", epsilon)
    d = check_delta(delta)

    def f(log_rho: float) -> float:
        return zcdp_to_dp(math.exp(log_rho), d)[0] - e

    lo, hi = -10.0, 1.0
    while f(lo) > 0:
        lo *= 2
    while f(hi) < 0:
        hi *= 2
    rho = math.exp(float(scipy.optimize.brentq(f, lo, hi, xtol=1e-13)))
    step = 2.0**-40
    while zcdp_to_dp(rho, d)[0] > e:  # verify; move to the safe side (less rho)
        rho *= 1.0 - step
        step = min(step * 2.0, 0.5)
    return rho


# ---------------------------------------------------------------------------------------------
# Pure DP
# ---------------------------------------------------------------------------------------------


def _check_pure_eps(epsilon: Any) -> float:
    return check_nonnegative("epsilon", epsilon, allow_inf=True)


def pure_to_rdp(epsilon: float, orders: ArrayLike) -> NDArray[np.float64]:
    """Tightest RDP curve of ``epsilon``-DP: randomized response, ``p = e^eps / (1 + e^eps)``.

    Every pair of distributions with ``D_inf <= epsilon`` in both directions has
    ``D_alpha <= eps_RR(alpha)``, the RDP curve of randomized response with that ``p``
    (Mironov 2017, Table II), and randomized response attains it, so the bound cannot be
    improved (formulas.md §4; see also Bun & Steinke 2016, proof of Prop. 3.3). The curve is
    also capped by ``epsilon`` itself (``D_alpha <= D_inf``, Mironov 2017, Prop. 8). Computed
    from the log-odds ``epsilon`` directly, so large ``epsilon`` keeps full precision.

    Example:
        >>> round(float(pure_to_rdp(1.0, float("inf"))), 12)
        1.0
    """
    e = _check_pure_eps(epsilon)
    a = _as_orders(orders)
    if math.isinf(e):
        return np.full(a.shape, math.inf)
    q = float(special.expit(-e))
    p_minus_q = math.tanh(e / 2.0)
    return np.minimum(_rr_rdp(e, q, p_minus_q, a), e)


def pure_to_rdp_lemma1(epsilon: float, orders: ArrayLike) -> NDArray[np.float64]:
    """RDP curve ``min(epsilon, 2 alpha epsilon^2)`` of ``epsilon``-DP (Mironov 2017, Lemma 1).

    Lemma 1 gives ``D_alpha <= 2 alpha eps^2``; ``D_alpha <= D_inf = eps`` (monotonicity in the
    order, Mironov 2017 Prop. 8 / Table I) gives the cap.

    Example:
        >>> pure_to_rdp_lemma1(0.1, [2.0, 100.0]).tolist()
        [0.04000000000000001, 0.1]
    """
    e = _check_pure_eps(epsilon)
    a = _as_orders(orders)
    if e == 0.0:
        return np.zeros(a.shape)
    with np.errstate(over="ignore"):
        return np.minimum(e, 2.0 * a * e * e)


def pure_to_rdp_bun_steinke(epsilon: float, orders: ArrayLike) -> NDArray[np.float64]:
    """RDP curve ``alpha epsilon^2 / 2`` of ``epsilon``-DP (Bun & Steinke 2016, Prop. 3.3).

    ``epsilon``-DP implies ``(epsilon^2/2)``-zCDP, i.e. ``(alpha, alpha eps^2/2)``-RDP.

    Example:
        >>> pure_to_rdp_bun_steinke(1.0, [2.0]).tolist()
        [1.0]
    """
    e = _check_pure_eps(epsilon)
    a = _as_orders(orders)
    if e == 0.0:
        return np.zeros(a.shape)
    with np.errstate(over="ignore"):
        return np.asarray(a * e * e / 2.0, dtype=np.float64)


def pure_to_zcdp(epsilon: float) -> float:
    """``epsilon``-DP implies ``(epsilon^2 / 2)``-zCDP (Bun & Steinke 2016, Prop. 3.3).

    Example:
        >>> pure_to_zcdp(1.0)
        0.5
    """
    e = _check_pure_eps(epsilon)
    return e * e / 2.0


# ---------------------------------------------------------------------------------------------
# Group privacy
# ---------------------------------------------------------------------------------------------


def group_privacy_rdp(
    orders: ArrayLike, epsilons: ArrayLike, group_size: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """RDP curve for groups of ``group_size`` records (Mironov 2017, Proposition 2).

    If a mechanism is ``(alpha, eps)``-RDP and ``g`` is ``2^c``-stable, then the composition is
    ``(alpha / 2^c, 3^c eps)``-RDP for ``alpha >= 2^(c+1)``. The group size is rounded up to
    ``2^c`` (a ``k``-stable map is ``2^c``-stable for ``k <= 2^c``); orders below ``2^(c+1)``
    are dropped. ``group_size = 1`` returns the curve unchanged.

    Returns:
        ``(new_orders, new_epsilons)``, sorted by order.

    Example:
        >>> o, e = group_privacy_rdp([2.0, 4.0, 8.0], [1.0, 2.0, 4.0], 2)
        >>> o.tolist(), e.tolist()
        ([2.0, 4.0], [6.0, 12.0])
    """
    a, e = _curve(orders, epsilons)
    k = check_int("group_size", group_size, 1)
    c = (k - 1).bit_length()  # smallest c with 2^c >= k
    idx = np.argsort(a, kind="stable")
    a, e = a[idx], e[idx]
    if c == 0:
        return a, e
    keep = a >= 2.0 ** (c + 1)
    if not keep.any():
        raise fail(
            "orders",
            float(a.max()),
            f"at least one order >= 2^(c+1) = {2 ** (c + 1)} for group_size={k} (Mironov Prop. 2)",
        )
    with np.errstate(over="ignore"):
        return a[keep] / 2.0**c, e[keep] * 3.0**c
