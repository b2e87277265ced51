"""Random allocation ("balls in bins"): each record is used in exactly ``k`` of ``t`` steps.

In one epoch of random ``k``-out-of-``t`` allocation every record picks ``k`` distinct steps
uniformly at random, independently of the other records, and each step releases the
Gaussian mechanism on the sum of the records allocated to it (Chua et al. 2024, "balls in
bins"; Feldman & Shenfeld 2025, "random allocation"). Batch sizes vary (binomially), unlike
epoch shuffling (:mod:`renyi.shuffling`).

For ``k = 1`` and Gaussian noise of multiplier ``σ`` the pair of output distributions of
one epoch, under add/remove neighbours, is ``P = (1/t) Σ_i N(e_i, σ² I_t)`` and
``Q = N(0, σ² I_t)``: the likelihood ratio is ``Y = (1/t) Σ_i X_i`` with ``X_i`` i.i.d.
log-normal, ``log X_i ~ N(-1/(2σ²), 1/σ²)`` under ``Q`` (so ``E X_i^j = exp(j(j-1)/(2σ²))``).

This module gives, per epoch:

* the **remove** direction RDP ``D_α(P‖Q) = log E_Q[Y^α] / (α - 1)`` *exactly* at integer
  orders: ``E_Q[S^α] = α! [z^α] (Σ_j E[X^j] z^j / j!)^t`` for ``S = t Y`` (the
  multinomial expansion of Feldman & Shenfeld 2025, Sec. 6, evaluated as a polynomial power
  in log space: positive terms only, no cancellation);
* the **add** direction RDP ``D_α(Q‖P) = log E_Q[Y^(1-α)] / (α - 1)``: a proven upper bound
  on the negative moment, from its Laplace-integral representation with an upper bound of
  the log-normal's Laplace transform and an upper Riemann sum;
* ``k > 1``: ``k``-out-of-``t`` allocation is bounded by the composition of 1-out-of-``m``
  allocations over the blocks of :func:`allocation_blocks` (``k - r`` of ``⌊t/k⌋`` steps and
  ``r = t mod k`` of ``⌈t/k⌉``: one step in each block, randomly relabelled, is a uniform
  ``k``-subset; Feldman & Shenfeld 2025 use ``k`` blocks of ``⌊t/k⌋``);
* Monte Carlo estimates of ``δ(ε)`` (``k = 1``, :func:`allocation_delta_monte_carlo`) and of
  ``ε(δ)`` (any ``k``, :func:`allocation_epsilon_monte_carlo`, the likelihood ratio
  ``e_k(X)/C(t,k)`` evaluated exactly) with confidence intervals, the numerical reference
  Chua et al. (2024) use, to show where the bounds sit (the certified lower bound is in
  :mod:`renyi.analysis.allocation_lower`).

Every curve is also capped by the no-amplification value ``k α / (2σ²)`` (quasi-convexity).
Orders are rounded up to integers (RDP is non-decreasing in α) and orders above
:data:`MAX_EXACT_ORDER` get the no-amplification value.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammaln, log_ndtr, logsumexp

from renyi._validation import (
    check_delta,
    check_int,
    check_nonnegative,
    check_orders,
    check_positive,
    check_range,
    fail,
)

__all__ = [
    "MAX_EXACT_ORDER",
    "allocation_blocks",
    "allocation_delta_monte_carlo",
    "allocation_epsilon_monte_carlo",
    "allocation_gaussian_rdp",
    "allocation_privacy_losses",
    "allocation_rdp_add",
    "allocation_rdp_remove",
    "one_of_t_epsilon_lower_bound",
]

FloatArray = NDArray[np.float64]

MAX_EXACT_ORDER = 256
"""Largest integer order evaluated exactly; above it the no-amplification value is used."""

# safety margins on the computed values: relative (round-off of a few hundred operations) and
# absolute (log-sum-exp of terms of size ~ α log t loses ~1e-16 of that size)
_MARGIN = 1e-9
_ABS_MARGIN = 1e-13


def _log_poly_mul(la: FloatArray, lb: FloatArray) -> FloatArray:
    """Log-coefficients of the product of two power series given by log-coefficients,
    truncated to the same degree."""
    n = la.size
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :] - i  # column n, row i: la[i] + lb[n - i]
    terms = np.where(j >= 0, la[:, None] + lb[np.clip(j, 0, n - 1)], -np.inf)
    out: FloatArray = logsumexp(terms, axis=0)
    return out


def _log_sum_moments(t: int, sigma: float, max_order: int) -> FloatArray:
    """``log E[S^j]`` for ``j = 0..max_order``, ``S`` the sum of ``t`` i.i.d. log-normals
    with ``E X^j = exp(j (j - 1) / (2σ²))``."""
    j = np.arange(max_order + 1, dtype=np.float64)
    base = j * (j - 1.0) / (2.0 * sigma * sigma) - gammaln(j + 1.0)  # log(E X^j / j!)
    result = np.full(max_order + 1, -np.inf)
    result[0] = 0.0  # the series 1
    power = base
    count = t
    while count:
        if count & 1:
            result = _log_poly_mul(result, power)
        count >>= 1
        if count:
            power = _log_poly_mul(power, power)
    return result + gammaln(j + 1.0)


def _integer_orders(orders: FloatArray) -> tuple[FloatArray, NDArray[np.bool_]]:
    """Orders rounded up to integers >= 2, and which of them are evaluated exactly."""
    with np.errstate(invalid="ignore"):
        up = np.maximum(np.ceil(orders), 2.0)
    exact = np.isfinite(up) & (up <= MAX_EXACT_ORDER)
    return up, exact


def _no_amplification(orders: FloatArray, sigma: float, k: int) -> FloatArray:
    with np.errstate(divide="ignore", over="ignore"):
        out: FloatArray = k * orders / (2.0 * sigma * sigma)
    return out


# Above this 1/σ² the add-direction bound is not evaluated (the no-amplification value is
# used): its Laplace-transform bounds need E[X^4] = exp(6/σ²) to be finite in float64.
_MAX_ADD_V = 100.0


def check_steps_selected(num_steps: Any, num_selected: Any) -> tuple[int, int]:
    """``(t, k)`` of ``k``-out-of-``t`` allocation, validated (``1 <= k <= t``)."""
    t = check_int("num_steps", num_steps, 1)
    k = check_int("num_selected", num_selected, 1)
    if k > t:
        raise fail("num_selected", num_selected, f"an integer in [1, num_steps={t}]")
    return t, k


def allocation_blocks(num_steps: int, num_selected: int) -> tuple[tuple[int, int], ...]:
    """``((size, count), ...)``: the blocks over which ``k``-out-of-``t`` allocation is
    decomposed — ``k - r`` blocks of ``m = ⌊t/k⌋`` steps and ``r = t - k m`` of ``m + 1``
    (zero counts dropped); ``((t, 1),)`` for ``k = 1``. One step in each block, relabelled by
    a uniformly random permutation, is a uniform ``k``-subset (docs/subsampling.md).

    >>> allocation_blocks(5, 2)
    ((2, 1), (3, 1))
    """
    t, k = check_steps_selected(num_steps, num_selected)
    m, r = divmod(t, k)
    return tuple((size, count) for size, count in ((m, k - r), (m + 1, r)) if count > 0)


def allocation_rdp_remove(
    num_steps: int, noise_multiplier: float, orders: ArrayLike, num_selected: int = 1
) -> FloatArray:
    """Remove-direction RDP ``D_α(P‖Q)`` of one epoch of random ``k``-of-``t`` allocation.

    Exact at integer orders for ``k = 1`` (Feldman & Shenfeld 2025); for ``k > 1`` the bound
    by the composition over the blocks of :func:`allocation_blocks`. An upper bound at every
    order.
    """
    t, k = check_steps_selected(num_steps, num_selected)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    a = check_orders(orders)
    up, exact = _integer_orders(a)
    cap = _no_amplification(a, sigma, k)
    out = cap.copy()
    if exact.any() and sigma > 1e-150:  # 1/σ² finite (smaller σ: the cap, +inf)
        top = int(up[exact].max())
        ints = up[exact].astype(np.int64)
        val = np.zeros(ints.size)
        for size, count in allocation_blocks(t, k):
            log_m = _log_sum_moments(size, sigma, top)
            log_ey = log_m[ints] - ints * math.log(size)
            val += count * (np.maximum(log_ey, 0.0) / (ints - 1.0) * (1.0 + _MARGIN) + _ABS_MARGIN)
        out[exact] = np.minimum(val, cap[exact])
    return out


def _log_laplace_upper(u: FloatArray, v: float) -> FloatArray:
    """An upper bound on ``log φ(u) = log E exp(-u X)``, ``log X ~ N(-v/2, v)``: the least of
    ``1``, the Taylor bounds ``E Σ_{j<=2n} (-uX)^j / j!`` for ``2n = 2, 4``
    (``e^-y <= Σ_{j<=2n} (-y)^j/j!`` for ``y >= 0``; ``E X^j = exp(j(j-1)v/2)``), the
    second-order one on ``{X <= M}`` plus ``P[X > M] e^(-uM)`` (truncated moments of the
    log-normal in closed form) over a grid of ``M``, and ``P[X <= x0] + exp(-u x0)`` over a
    grid of ``x0``."""
    m = [math.exp(j * (j - 1) * v / 2.0) for j in range(5)]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t2 = 1.0 - u + u * u * m[2] / 2.0
        t4 = t2 - u**3 * m[3] / 6.0 + u**4 * m[4] / 24.0
        taylor = np.log(np.maximum(np.minimum(t2, t4), 0.0))
    z = np.linspace(-40.0, 8.0, 241)
    x0 = np.exp(-0.5 * v + math.sqrt(v) * z)
    split = np.logaddexp(log_ndtr(z)[None, :], -u[:, None] * x0[None, :]).min(axis=1)
    # truncated Taylor: E[(1 - uX + (uX)²/2) 1{X <= M}] + P[X > M] e^(-uM), over a grid of M
    zm = np.linspace(-4.0, 12.0, 97)
    sv = math.sqrt(v)
    mom = [np.exp(j * (j - 1) * v / 2.0 + log_ndtr(zm - j * sv)) for j in range(3)]
    big_m = np.exp(-0.5 * v + sv * zm)
    with np.errstate(over="ignore"):
        trunc = (
            mom[0][None, :]
            - u[:, None] * mom[1][None, :]
            + 0.5 * (u * u)[:, None] * mom[2][None, :]
            + np.exp(log_ndtr(-zm)[None, :] - u[:, None] * big_m[None, :])
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        trunc_log = np.log(np.maximum(trunc.min(axis=1), 0.0))
    split = np.minimum(split, np.nan_to_num(trunc_log, nan=0.0))
    out: FloatArray = np.minimum(np.minimum(np.nan_to_num(taylor, nan=0.0), split), 0.0)
    return out


def _log_negative_moments(t: int, sigma: float, betas: FloatArray) -> FloatArray:
    """Upper bounds on ``log E[Y^-β]`` for ``Y = S/t``, ``S`` the sum of ``t >= 2`` i.i.d.
    log-normals (``E X = 1``), for ``β > 0``.

    ``y^-β = Γ(β)^-1 ∫ s^(β-1) e^(-s y) ds`` gives ``E[Y^-β] = Γ(β)^-1 ∫ s^(β-1) e^(g(s)) ds``
    with ``g(s) = t log φ(s/t)`` and ``φ`` the Laplace transform of ``X``. ``g`` is convex, so
    on each cell ``[a, b]`` of a geometric grid it lies below the chord through
    ``(a, t log ψ(a/t))`` and ``(b, t log ψ(b/t))`` (``ψ >= φ``, :func:`_log_laplace_upper`);
    ``log s`` is concave, so it lies below its tangent at the cell's midpoint; the integral of
    the exponential of the resulting linear function is exact. Below the grid ``φ <= 1``;
    above it ``φ(s/t)^t <= ψ(b/t)^(t-1) φ(s/t)``, whose integral is the closed-form moment
    ``E[X^-β] = exp(β(β+1)v/2)`` times ``t^β Γ(β)``. Every piece is an upper bound.
    """
    v = 1.0 / (sigma * sigma)
    lo = math.log(1e-6)
    hi = math.log(t) + 0.5 * v + 30.0 * math.sqrt(v) + 5.0
    edges = np.exp(np.linspace(lo, hi, 20_001))
    g = t * _log_laplace_upper(edges / t, v)
    a, b = edges[:-1], edges[1:]
    w = b - a
    mid = 0.5 * (a + b)
    bm1 = (betas - 1.0)[:, None]
    slope = bm1 / mid[None, :] + ((g[1:] - g[:-1]) / w)[None, :]
    at_a = bm1 * (np.log(mid) + (a - mid) / mid)[None, :] + g[:-1][None, :]
    cw = slope * w[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_int = np.where(
            np.abs(cw) > 1e-12,
            np.log(np.abs(np.expm1(cw))) - np.log(np.abs(slope)),
            np.log(w)[None, :] + np.log1p(0.5 * np.abs(cw)),
        )
    body = logsumexp(at_a + log_int, axis=1)
    below = betas * lo - np.log(betas)
    above = (
        (t - 1) * g[-1] / t + betas * math.log(t) + gammaln(betas) + 0.5 * betas * (betas + 1) * v
    )
    total = np.logaddexp(np.logaddexp(body, below), above)
    out: FloatArray = total - gammaln(betas)
    return out


def allocation_rdp_add(
    num_steps: int, noise_multiplier: float, orders: ArrayLike, num_selected: int = 1
) -> FloatArray:
    """Add-direction RDP ``D_α(Q‖P) = log E_Q[Y^(1-α)] / (α - 1)`` of one epoch of random
    ``k``-of-``t`` allocation, at the order rounded up to an integer ``>= 2``.

    The negative moment is bounded from above by a Riemann upper sum of its Laplace-integral
    representation with an upper bound of the log-normal's Laplace transform
    (:func:`_log_negative_moments`): every piece is a proven upper bound, so the result is
    one (checked against Monte Carlo in the tests). At ``t = 1`` the closed form
    ``α/(2σ²)`` is used. ``k > 1``: the composition over the blocks of
    :func:`allocation_blocks`. Capped by ``k α/(2σ²)``.
    """
    t, k = check_steps_selected(num_steps, num_selected)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    a = check_orders(orders)
    up, exact = _integer_orders(a)
    cap = _no_amplification(a, sigma, k)
    out = cap.copy()
    if exact.any() and sigma > 1e-150 and 1.0 / (sigma * sigma) <= _MAX_ADD_V:
        ints = np.unique(up[exact])
        val = np.zeros(ints.size)
        for size, count in allocation_blocks(t, k):
            if size == 1:
                val += count * ints / (2.0 * sigma * sigma)
            else:
                log_m = _log_negative_moments(size, sigma, ints - 1.0)
                val += count * (
                    np.maximum(log_m, 0.0) / (ints - 1.0) * (1.0 + _MARGIN) + _ABS_MARGIN
                )
        table = dict(zip(ints.tolist(), val.tolist(), strict=True))
        vals = np.array([table[x] for x in up[exact].tolist()])
        out[exact] = np.minimum(vals, cap[exact])
    return out


def allocation_gaussian_rdp(
    num_steps: int, noise_multiplier: float, orders: ArrayLike, num_selected: int = 1
) -> FloatArray:
    """RDP of one epoch of random allocation under add/remove: the larger direction.

    Cached per (t, σ, k, orders): an accountant fed one epoch at a time pays once."""
    a = check_orders(orders)
    t, k = check_steps_selected(num_steps, num_selected)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    return _cached_curve(t, sigma, k, a.tobytes()).copy()


@functools.lru_cache(maxsize=64)
def _cached_curve(t: int, sigma: float, k: int, key: bytes) -> FloatArray:
    a = np.frombuffer(key, dtype=np.float64)
    out = np.maximum(allocation_rdp_remove(t, sigma, a, k), allocation_rdp_add(t, sigma, a, k))
    out.setflags(write=False)
    return out


def allocation_delta_monte_carlo(
    num_steps: int,
    noise_multiplier: float,
    epsilon: float,
    *,
    epochs: int = 1,
    samples: int = 100_000,
    direction: str = "remove",
    confidence: float = 0.99,
    rng: np.random.Generator | None = None,
) -> tuple[float, float, float]:
    """Monte Carlo estimate of ``δ(ε)`` of ``epochs`` epochs of 1-out-of-``t`` allocation.

    ``δ_remove(ε) = E_Q[(Y - e^ε)_+]`` and ``δ_add(ε) = E_Q[(1 - e^ε Y)_+]`` with ``Y`` the
    product over epochs of the per-epoch likelihood ratios, sampled under ``Q``. Returns
    ``(estimate, low, high)``: a normal-approximation confidence interval at ``confidence``
    (an estimate, not a bound: the reference Chua et al. 2024 use, to place the bounds).
    """
    t = check_int("num_steps", num_steps, 1)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    e = check_int("epochs", epochs, 1)
    n = check_int("samples", samples, 2)
    epsilon = check_nonnegative("epsilon", epsilon, allow_inf=True)
    confidence = check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    if direction not in ("remove", "add"):
        raise fail("direction", direction, "'remove' or 'add'")
    if rng is None:
        from renyi.random import secure_random_bytes

        rng = np.random.default_rng(int.from_bytes(secure_random_bytes(16), "little"))
    v = 1.0 / (sigma * sigma)
    vals = np.empty(n)
    chunk = max(1, 4_000_000 // (t * e))  # rows per chunk: bounded memory
    for start in range(0, n, chunk):
        rows = min(chunk, n - start)
        log_y = np.zeros(rows)
        for _ in range(e):
            ell = rng.normal(-0.5 * v, math.sqrt(v), size=(rows, t))
            log_y += logsumexp(ell, axis=1) - math.log(t)
        if direction == "remove":
            with np.errstate(over="ignore", invalid="ignore"):  # no overflow at large epsilon
                gap = -np.expm1(np.minimum(epsilon - log_y, 0.0))
                part = np.where(log_y > epsilon, np.exp(log_y) * gap, 0.0)
        else:
            part = np.maximum(-np.expm1(epsilon + log_y), 0.0)
        vals[start : start + rows] = part
    est = float(vals.mean())
    from scipy.stats import norm

    half = float(norm.ppf(0.5 + confidence / 2.0)) * float(vals.std(ddof=1)) / math.sqrt(n)
    return est, max(est - half, 0.0), est + half


def _log_elementary(log_x: FloatArray, k: int) -> FloatArray:
    """``log e_k`` of each row of the positive matrix ``exp(log_x)`` (``e_k`` the ``k``-th
    elementary symmetric polynomial), by the recurrence ``e_j <- e_j + x e_(j-1)`` in log
    space (no overflow, positive terms only)."""
    rows, cols = log_x.shape
    le = np.full((k + 1, rows), -np.inf)
    le[0] = 0.0
    for i in range(cols):
        x = log_x[:, i]
        for j in range(min(k, i + 1), 0, -1):
            np.logaddexp(le[j], x + le[j - 1], out=le[j])
    out: FloatArray = le[k]
    return out


def allocation_privacy_losses(
    num_steps: int,
    noise_multiplier: float,
    samples: int,
    *,
    num_selected: int = 1,
    epochs: int = 1,
    under: str = "P",
    rng: np.random.Generator | None = None,
) -> FloatArray:
    """``samples`` draws of the privacy loss ``L = Σ_epochs log(e_k(X)/C(t,k))`` of
    ``epochs`` epochs of ``k``-out-of-``t`` allocation's pair, under ``P`` (the record's ``k``
    steps carry the signal; by symmetry the first ``k``) or ``Q``. ``X_i = exp((o_i - 1/2)/σ²)``
    are the steps' likelihood ratios; ``e_k`` is evaluated exactly (in log space)."""
    t, k = check_steps_selected(num_steps, num_selected)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    n = check_int("samples", samples, 1)
    e = check_int("epochs", epochs, 1)
    if under not in ("P", "Q"):
        raise fail("under", under, "'P' or 'Q'")
    if rng is None:
        from renyi.random import secure_random_bytes

        rng = np.random.default_rng(int.from_bytes(secure_random_bytes(16), "little"))
    v = 1.0 / (sigma * sigma)
    log_norm = float(gammaln(t + 1.0) - gammaln(k + 1.0) - gammaln(t - k + 1.0))
    total = np.zeros(n)
    chunk = max(1, 2_000_000 // t)
    for start in range(0, n, chunk):
        rows = min(chunk, n - start)
        for _ in range(e):
            log_x = rng.normal(-0.5 * v, math.sqrt(v), size=(rows, t))
            if under == "P":
                log_x[:, :k] += v
            total[start : start + rows] += _log_elementary(log_x, k) - log_norm
    return total


def allocation_epsilon_monte_carlo(
    num_steps: int,
    noise_multiplier: float,
    delta: float,
    *,
    num_selected: int = 1,
    epochs: int = 1,
    direction: str = "both",
    samples: int = 100_000,
    confidence: float = 0.99,
    rng: np.random.Generator | None = None,
) -> tuple[float, float, float]:
    """Monte Carlo ``(estimate, low, high)`` of ε(δ) of ``epochs`` epochs of random
    ``k``-out-of-``t`` allocation: the remove direction from losses under ``P``
    (``δ = E_P[(1 - e^(ε-L))_+]``), the add direction under ``Q`` (``E_Q[(1 - e^(ε+L))_+]``),
    both with summands in [0, 1] so the normal interval at ``confidence`` is honest at
    moderate δ; ε solves ``δ_MC(ε) = δ`` on the estimate and on both ends of the interval;
    ``"both"`` takes the larger direction at each. An estimate, not a bound.

    >>> rng = np.random.default_rng(0)
    >>> est, lo, hi = allocation_epsilon_monte_carlo(20, 1.0, 1e-3, num_selected=2, rng=rng)
    >>> 1.60 < lo <= est <= hi < 1.76
    True
    """
    from renyi.analysis.allocation_correlated import epsilon_interval_from_losses

    d = check_delta(delta)
    conf = check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    if direction not in ("remove", "add", "both"):
        raise fail("direction", direction, "'remove', 'add' or 'both'")
    todo = (("remove", "P"), ("add", "Q"))
    return epsilon_interval_from_losses(
        (
            (
                name,
                allocation_privacy_losses(
                    num_steps,
                    noise_multiplier,
                    samples,
                    num_selected=num_selected,
                    epochs=epochs,
                    under=under,
                    rng=rng,
                ),
            )
            for name, under in todo
            if direction in ("both", name)
        ),
        d,
        conf,
    )


def one_of_t_epsilon_lower_bound(
    num_steps: int,
    noise_multiplier: float,
    delta: float,
    *,
    epochs: int = 1,
    sensitivity: float = 1.0,
    value_discretization_interval: float = 1e-3,
) -> float:
    """A proven lower bound on ε(δ) of any sampler that puts each record in exactly one of
    ``num_steps`` batches per epoch (shuffling, random allocation with ``k = 1``), for
    ``epochs`` epochs of the Gaussian with noise multiplier σ.

    The pair of datasets: the other records have gradient 0 and the differing record moves
    one batch's sum by ``sensitivity`` (in units of C): ``1`` for a record of gradient ``+C``
    against a zero record (a replace-one pair, and an add/remove pair up to a zero record),
    ``2`` for ``+C`` against ``-C`` (replace-one only). Each epoch's outputs are ``t``
    Gaussians, one of them shifted by ``s = sensitivity`` in the first case. The maximum
    over the epoch's outputs is a post-processing with
    ``P[max <= x] = Φ((x-s)/σ) Φ(x/σ)^(t-1)`` versus ``Φ(x/σ)^t`` whatever the position;
    binned on a grid, composed over epochs by the PLD, and read off from the PLD's
    *lower* bound, it gives an ε that the mechanism must exceed (hockey-stick divergences
    only shrink under post-processing). This is the kind of lower bound Chua et al.
    (ICML 2024) use to show that Poisson accounting understates shuffling.
    """
    from renyi.analysis.pld import PrivacyLossDistribution

    t = check_int("num_steps", num_steps, 1)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    sigma = sigma / check_positive("sensitivity", sensitivity)
    e = check_int("epochs", epochs, 1)
    delta = check_delta(delta)
    top = sigma * (math.sqrt(2.0 * math.log(t + 1.0)) + 12.0) + 1.0
    x = np.linspace(-12.0 * sigma, top, 6001)
    log_fp = log_ndtr((x - 1.0) / sigma) + (t - 1) * log_ndtr(x / sigma)
    log_fq = t * log_ndtr(x / sigma)

    def masses(log_f: FloatArray) -> FloatArray:
        lf = np.concatenate(([-np.inf], log_f, [0.0]))
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.exp(lf[1:]) * -np.expm1(lf[:-1] - lf[1:])
        m = np.nan_to_num(np.maximum(m, 0.0))
        return m / math.fsum(m.tolist())

    pld = PrivacyLossDistribution.from_distributions(
        masses(log_fp), masses(log_fq), value_discretization_interval=value_discretization_interval
    )
    return max(float(pld.self_compose(e).epsilon_for_delta(delta).lower), 0.0)
