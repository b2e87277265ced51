"""Discretising a loss distribution: connect-the-dots above, mean-preserving below;
the loss CDFs of specific mechanisms."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.special import log_ndtr

from renyi.analysis.pld import _numerics as _num
from renyi.analysis.pld._errors import _grid_error
from renyi.analysis.pld._numerics import (
    _LOG_HALF,
    _LOGCDF_ULPS,
    _U,
    Direction,
    FloatArray,
    _ctd_upper,
    _f64,
    _log1mexp,
    _sum_down,
    _sum_up,
)
from renyi.analysis.pld._side import _Side, _trim

# ---------------------------------------------------------------------------------------
# discretisation: connect-the-dots (upper) and merge + mean-preserving rounding (lower)


class _LossCdf(NamedTuple):
    """Log CDF / survival values of the loss under P and Q at some points, with error bars.

    ``lcp = log P[L <= l]``, ``lsp = log P[L > l]`` (``+inf`` losses included), and the same
    under Q; ``tol_p`` / ``tol_q`` bound the absolute error of those logs.
    """

    lcp: FloatArray
    lsp: FloatArray
    tol_p: FloatArray
    lcq: FloatArray
    lsq: FloatArray
    tol_q: FloatArray


LossCdfFn = Callable[[FloatArray], _LossCdf]


def _log_ndtr_tol(z: FloatArray, dz: FloatArray | float, v: FloatArray) -> FloatArray:
    """Error bound of ``v = log_ndtr(z)`` given an error ``dz`` in ``z``: library round-off
    plus ``dz`` times a bound on the derivative ``phi(z)/Phi(z) <= |z| + 1``."""
    with np.errstate(invalid="ignore"):
        t = _LOGCDF_ULPS * _U * (1.0 + np.abs(v)) + (np.abs(z) + 1.0) * dz
    t = np.where(np.isinf(z), 0.0, t)  # Phi(+-inf) is exact
    return np.where(np.isfinite(t), t, np.inf)


def _log_ndtr_pair(z: FloatArray, dz: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(log Phi(z), log Phi(-z), tol)``: one ``log_ndtr`` on the small side, the other from
    ``log(1 - e^v)`` (whose derivative is at most 1 there), and a bound on both errors."""
    small = log_ndtr(-np.abs(z))
    big = _log1mexp(np.minimum(small, _LOG_HALF))
    neg = z < 0
    lo, hi = np.where(neg, small, big), np.where(neg, big, small)
    t = _log_ndtr_tol(z, dz, small) + 4 * _U
    return lo, hi, t


def _bin_masses(lc: FloatArray, ls: FloatArray, tol: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Masses of the bins between consecutive points and a bound on their absolute error.

    Differences of CDF values below the median and of survival values above it, in log
    space, so no bin loses relative precision to cancellation against 1.
    """
    use_c = lc[1:] <= _LOG_HALF
    hi_c, lo_c = lc[1:], lc[:-1]
    hi_s, lo_s = ls[:-1], ls[1:]
    top = np.where(use_c, hi_c, hi_s)
    bot = np.where(use_c, lo_c, lo_s)
    t_top = np.where(use_c, tol[1:], tol[:-1])
    t_bot = np.where(use_c, tol[:-1], tol[1:])
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        diff = np.where(np.isneginf(top), 0.0, np.minimum(bot - top, 0.0))
        mass = np.where(np.isneginf(top), 0.0, np.exp(top + _log1mexp(diff)))
        err = 1.01 * (np.exp(top) * np.expm1(t_top) + np.exp(bot) * np.expm1(t_bot))
    err = np.where(np.isfinite(err), err, 1.0) + 8 * _U * mass
    return np.maximum(mass, 0.0), err


def _discretise(
    cdf: LossCdfFn, l_lo: float, l_hi: float, h: float, inf_mass: float
) -> tuple[_Side, _Side]:
    """Both discretisations of a loss distribution given through ``cdf``.

    Grid points ``e_k = k h`` for ``k = floor(l_lo/h) .. ceil(l_hi/h)``; bin ``k`` holds the
    losses in ``(e_{k-1}, e_k]``.

    * Upper: each bin's (upper-bounded) P-mass is split between its two ends by
      connect-the-dots, with the right end's share bounded from above; losses
      ``<= e_lo`` go to ``e_lo``, losses ``> e_hi`` to ``+inf``. Every piece dominates the
      exact one, so ``delta`` of this discretisation (and of its compositions) is an upper
      bound.
    * Lower: each bin is merged into one outcome (a post-processing, which can only lower
      ``delta``) with loss ``log(P_k / Q_k)`` pushed down by its error bound, then rounded to
      the two ends at random with the mean preserved (the Hoeffding coupling of
      :meth:`_Side.delta_bound` turns this into a rigorous lower bound); the tails are deleted.
    """
    if not (math.isfinite(l_lo) and math.isfinite(l_hi)) or l_hi - l_lo > 1e300:
        raise _grid_error("value_discretization_interval", h, math.inf, "a mechanism")
    k_lo, k_hi = math.floor(l_lo / h), math.ceil(l_hi / h)
    n = k_hi - k_lo + 1
    if n > _num._MAX_BINS:
        raise _grid_error(
            "value_discretization_interval",
            h,
            (l_hi - l_lo) / (_num._MAX_BINS - 4),
            f"this mechanism (the grid would need {n} points)",
        )
    n = max(n, 2)
    edges = np.asarray((k_lo + np.arange(n)) * h, dtype=np.float64)
    c = cdf(edges)
    c = _LossCdf(
        *(
            np.minimum(np.asarray(v, dtype=np.float64), 0.0) if i % 3 != 2 else v
            for i, v in enumerate(c)
        )
    )
    pk, ep = _bin_masses(c.lcp, c.lsp, c.tol_p)
    qk, eq = _bin_masses(c.lcq, c.lsq, c.tol_q)
    # --- upper: connect the dots
    p_up = pk + ep
    q_low = np.maximum(qk - eq, 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        qe_low = np.where(q_low > 0, np.exp(edges[:-1]) * q_low, 0.0)
    right = _ctd_upper(p_up, qe_low, h)
    up = np.zeros(n)
    up[1:] += right
    up[:-1] += p_up - right
    up[0] += math.exp(min(float(c.lcp[0]) + float(c.tol_p[0]), 0.0)) * (1 + 4 * _U)
    inf_up = min(math.exp(min(float(c.lsp[-1]) + float(c.tol_p[-1]), 0.0)) * (1 + 4 * _U), 1.0)
    inf_up = max(inf_up, inf_mass)
    fin_up = _sum_up(up)
    upper = _Side(True, h, k_lo, up, fin_up, inf_up, (), (float(edges[0]), float(edges[-1])))
    # --- lower: merge each bin, push its loss down by its error, round preserving the mean
    p_low = np.maximum(pk - ep, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        merged = np.log(pk) - np.log(qk)
        err_l = 1.01 * (ep / pk + eq / qk) + 8 * _U * (1 + np.abs(merged))
        ml = merged - err_l
    ml = np.where(np.isfinite(ml), ml, np.where(qk > 0, -np.inf, np.inf))
    ml = np.clip(ml, edges[:-1], edges[1:])
    frac = np.clip((ml - edges[:-1]) / h, 0.0, 1.0)
    frac = np.where(p_low > 0, frac, 0.0)
    low = np.zeros(n)
    low[1:] += p_low * frac
    low[:-1] += p_low * (1.0 - frac)
    low *= 1 - 4 * _U
    fin_low = _sum_down(low)
    lower = _Side(
        False,
        h,
        k_lo,
        low,
        fin_low,
        inf_mass * (1 - 4 * _U),
        (),
        (float(edges[0]), float(edges[-1])),
        hoeffding_var=h * h,
        shift=8 * _U * (h + float(np.max(np.abs(edges)))),
    )
    return _trim(upper), _trim(lower)


def _from_atoms(
    losses: FloatArray, probs: FloatArray, inf_mass: float, h: float, loss_tol: FloatArray
) -> tuple[_Side, _Side]:
    """Both discretisations of a PLD with finitely many atoms (connect-the-dots above,
    mean-preserving rounding of the loss lowered by its error bound below)."""
    keep = probs > 0
    losses, probs, tol = losses[keep], probs[keep], np.asarray(loss_tol)[keep]
    if losses.size == 0:
        empty = np.zeros(1)
        return (
            _Side(True, h, 0, empty, 0.0, inf_mass, (), (0.0, 0.0)),
            _Side(False, h, 0, empty.copy(), 0.0, inf_mass, (), (0.0, 0.0)),
        )
    lu, ll = losses + tol, losses - tol
    k_up = np.ceil(lu / h)
    k_up = np.where(k_up * h < lu, k_up + 1, k_up)
    k_dn = np.floor(ll / h)
    k_dn = np.where(k_dn * h > ll, k_dn - 1, k_dn)
    span = float(max(k_up.max(), k_dn.max() + 1) - min(k_up.min() - 1, k_dn.min())) + 1
    if span > _num._MAX_BINS:
        raise _grid_error(
            "value_discretization_interval",
            h,
            float(lu.max() - ll.min()) / (_num._MAX_BINS - 4),
            "these losses",
        )
    off = int(min(k_up.min() - 1, k_dn.min()))
    size = int(span)
    # upper: split each atom (rounded up by its error) between the grid points around it
    p_up = probs * (1 + 4 * _U)
    left = (k_up - 1) * h
    with np.errstate(over="ignore"):
        frac_q = np.exp(-(lu - left))
    right = _ctd_upper(p_up, p_up * frac_q * (1 - 8 * _U), h)
    iu = (k_up - off).astype(np.int64)
    up = _f64(
        np.bincount(iu, weights=right, minlength=size)
        + np.bincount(iu - 1, weights=p_up - right, minlength=size)
    )
    upper = _Side(
        True,
        h,
        off,
        up,
        _sum_up(up),
        inf_mass * (1 + 4 * _U),
        (),
        (off * h, (off + size - 1) * h),
    )
    # lower: mean-preserving rounding of the lowered losses
    p_low = probs * (1 - 4 * _U)
    frac = np.clip((ll - k_dn * h) / h, 0.0, 1.0)
    idn = (k_dn - off).astype(np.int64)
    low = _f64(
        np.bincount(idn, weights=p_low * (1 - frac), minlength=size + 1)[:size]
        + np.bincount(np.minimum(idn + 1, size - 1), weights=p_low * frac, minlength=size)
    )
    lower = _Side(
        False,
        h,
        off,
        low,
        _sum_down(low),
        inf_mass * (1 - 4 * _U),
        (),
        (off * h, (off + size - 1) * h),
        hoeffding_var=h * h,
        shift=8 * _U * (h + float(np.max(np.abs(ll)))),
    )
    return _trim(upper), _trim(lower)


# ---------------------------------------------------------------------------------------
# loss CDFs of specific mechanisms


def _gaussian_cdf(mu: float) -> LossCdfFn:
    """Pair (N(0, s^2), N(1, s^2)), mu = 1/s: L ~ N(mu^2/2, mu^2) under P and
    N(-mu^2/2, mu^2) under Q (Balle & Wang 2018, Lemma 3)."""
    m = 0.5 * mu * mu

    def cdf(ell: FloatArray) -> _LossCdf:
        zp, zq = (ell - m) / mu, (ell + m) / mu
        dzp = 4 * _U * (np.abs(zp) + m / mu + 1.0)
        dzq = 4 * _U * (np.abs(zq) + m / mu + 1.0)
        cp, sp, cq, sq = log_ndtr(zp), log_ndtr(-zp), log_ndtr(zq), log_ndtr(-zq)
        tp = np.maximum(_log_ndtr_tol(zp, dzp, cp), _log_ndtr_tol(zp, dzp, sp))
        tq = np.maximum(_log_ndtr_tol(zq, dzq, cq), _log_ndtr_tol(zq, dzq, sq))
        return _LossCdf(cp, sp, tp, cq, sq, tq)

    return cdf


def _sub_gaussian_cdf(q: float, sigma: float, direction: Direction) -> LossCdfFn:
    """Poisson-subsampled Gaussian, sensitivity 1; mixture ``M = (1-q) N(0, s^2) + q N(1, s^2)``.

    ``remove``: (P, Q) = (M, N(0, s^2)), ``L(x) = log(1 - q + q e^{(2x-1)/(2 s^2)})``,
    increasing in x. ``add``: (P, Q) = (N(0, s^2), M), ``L = -`` the same, decreasing. With
    ``A(l) = e^l - (1 - q)`` the output at loss ``l`` is ``x(l) = s^2 log(A(l)/q) + 1/2``
    (remove) and ``x(-l)`` (add).
    """
    s2 = sigma * sigma
    log_q, log_1mq = math.log(q), math.log1p(-q)

    def x_of(ell: FloatArray) -> tuple[FloatArray, FloatArray]:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            em1 = np.expm1(ell)
            a = em1 + q
            big = ell > 1.0
            log_a = np.where(
                big, ell + np.log1p(-(1.0 - q) * np.exp(-np.where(big, ell, 0.0))), np.log(a)
            )
            log_a = np.where(a > 0, log_a, -np.inf)
            x = s2 * (log_a - log_q) + 0.5
            rel_a = 4 * _U * (np.abs(em1) + q + np.abs(a)) / np.abs(a)
            dx = s2 * (rel_a + 4 * _U * (np.abs(log_a) + abs(log_q) + 1.0)) + 4 * _U * np.abs(x)
        dx = np.where(np.isfinite(x), dx, 0.0)
        return x, dx

    def cdf(ell: FloatArray) -> _LossCdf:
        x, dx = x_of(ell if direction == "remove" else -ell)
        z0, z1 = x / sigma, (x - 1.0) / sigma
        dz = dx / sigma + 4 * _U * (np.abs(z0) + 1.0)
        a0, b0, t0 = _log_ndtr_pair(z0, dz)
        a1, b1, t1 = _log_ndtr_pair(z1, dz)
        with np.errstate(invalid="ignore"):
            mix_c = np.logaddexp(log_1mq + a0, log_q + a1)  # log M[x' <= x]
            mix_s = np.logaddexp(log_1mq + b0, log_q + b1)  # log M[x' > x]
        t_mix = np.maximum(t0, t1) + 4 * _U * (1 + abs(log_q))
        if direction == "remove":  # L <= l  <=>  x <= x(l)
            return _LossCdf(mix_c, mix_s, t_mix, a0, b0, t0)
        # add: L <= l  <=>  x >= x(-l)
        return _LossCdf(b0, a0, t0, mix_s, mix_c, t_mix)

    return cdf


def _laplace_cdf(b: float) -> LossCdfFn:
    """Pair (Lap(0, b), Lap(1, b)): ``L = (|x-1| - |x|)/b`` in ``[-1/b, 1/b]``, atoms at both
    ends. ``L <= l  <=>  x >= X = (1 - b l)/2``; ``P[x >= X] = e^{-X/b}/2`` and
    ``Q[x >= X] = 1 - e^{(X-1)/b}/2`` for ``X`` in ``[0, 1]``."""
    log2 = math.log(2.0)

    def cdf(ell: FloatArray) -> _LossCdf:
        x = np.clip((1.0 - b * ell) / 2.0, 0.0, 1.0)
        below, above = ell < -1.0 / b, ell >= 1.0 / b
        a_p = -x / b - log2  # log P[L <= l] inside
        a_q = (x - 1.0) / b - log2  # log Q[L > l] inside
        cp = np.where(above, 0.0, np.where(below, -np.inf, a_p))
        sp = np.where(above, -np.inf, np.where(below, 0.0, _log1mexp(np.minimum(a_p, 0.0))))
        sq = np.where(above, -np.inf, np.where(below, 0.0, a_q))
        cq = np.where(above, 0.0, np.where(below, -np.inf, _log1mexp(np.minimum(a_q, 0.0))))
        dx = 4 * _U * (1.0 + np.abs(b * ell))
        t = dx / b * 4.0 + 16 * _U * (1.0 + np.abs(a_p) + np.abs(a_q))
        return _LossCdf(cp, sp, t, cq, sq, t)

    return cdf
