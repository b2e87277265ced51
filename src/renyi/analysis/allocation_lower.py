"""A certified lower bound on ε of random ``k``-out-of-``t`` allocation (balls in bins).

The pair ``P = avg_{|S|=k} N(1_S, σ² I_t)``, ``Q = N(0, σ² I_t)`` of one epoch is *attained*:
a dataset whose other records have gradient 0 and whose differing record has gradient ``+C``
along a fixed direction releases exactly it (projected on that direction; the other
coordinates are pure noise). Any statistic of the epoch's outputs is a post-processing, so the
pair of its laws under ``P`` and ``Q`` has hockey-stick divergences no larger than the
mechanism's, in both orders and after composition over epochs: its ε(δ), read from the
*lower* side of its PLD, is a lower bound on the ε that any upper bound must report.

The statistic here is the *Poisson-product statistic* ``T = Σ_i ⌊log(1 + c X_i) / h⌋`` with
``X_i = exp((o_i - 1/2)/σ²)`` the per-step likelihood ratios: by the identity
``e_k(X) = Π_i (1 + c X_i) · c^(-k) · P[Σ_i B_i = k]`` (``B_i`` independent Bernoulli of
means ``c X_i / (1 + c X_i)``), ``T`` carries the first factor of the likelihood ratio
``e_k(X)/C(t,k)`` exactly (up to the binning ``h``), for every ``c > 0``. It is a sum of
i.i.d. integers under ``Q`` and, by symmetry, under ``P`` the sum of ``k`` integers of the
shifted law and ``t - k`` of the unshifted one: both laws are exact convolution powers. Small
``c`` makes ``T`` the sum of the ratios (sufficient for ``k = 1``); ``c ~ k/t`` resolves the
joint tail of the ``k`` chosen steps for ``k > 1``; several ``c`` are tried and the largest
certified value is kept (each is a lower bound).

Rigour: the per-step masses come from log-CDFs (relative error ~1e-14); the convolution
powers use FFTs with an a-priori round-off bound on the L1 error of each product (Higham,
*Accuracy and Stability of Numerical Algorithms*, Sec. 24.1, with a generous constant);
``T`` is cut at a cap and everything above merged into one outcome (``min(T, cap)``, still a
statistic); the composed pair's hockey-stick curve can move by at most
``epochs (‖ΔP‖₁ + e^ε ‖ΔQ‖₁)`` under those errors, which is subtracted before reading ε.

Example
-------
>>> lo = allocation_epsilon_lower_bound(235, 1.1, 1e-5)  # n = 60000, b = 256: one epoch
>>> 0.26 < lo < 0.2719  # the PLD upper bound of the same epoch: 0.2719
True
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import fft as sfft
from scipy.special import log_ndtr

from renyi._validation import check_delta, check_int, check_positive, fail
from renyi.analysis.allocation import check_steps_selected

__all__ = ["allocation_epsilon_lower_bound", "allocation_statistic_pair"]

FloatArray = NDArray[np.float64]

_U = 2.0**-53
_EXT = np.longdouble  # the convolutions run in extended precision where the platform has it
_U_EXT = float(np.finfo(_EXT).eps) / 2.0
_FFT_C = 8.0  # constant of the a-priori FFT round-off model (as renyi.analysis.pld)
_Z_TOP = 9.0  # the per-step statistic is cut where the shifted law has mass ~1e-19 above
_MAX_CELLS = 1 << 17  # cells of the per-step statistic
_MAX_SUM = 1 << 20  # cells of the summed statistic before the merged top outcome
_THETAS = (0.1, 0.3, 1.0)  # c = θ k / t


_GL_X, _GL_W = np.polynomial.legendre.leggauss(8)
_PIECE = 0.05  # width (in standard deviations) of the pieces the density is integrated over


def _normal_cells(z: FloatArray) -> tuple[FloatArray, float]:
    """``Φ(z[i+1]) - Φ(z[i])`` for increasing ``z`` (``z[0] = -inf``, ``z[-1] = +inf``) and a
    bound on the L1 error: the end cells from the CDF on their own side (relative accuracy),
    every finite cell by 8-point Gauss–Legendre quadrature of the density on pieces of width
    <= 0.05 (quadrature error < 1e-30 a piece; rounding relative ~u (1 + z²)), so narrow
    cells keep their relative accuracy, unlike differences of CDFs."""
    n = z.size - 1
    mass = np.zeros(n)
    mass[0] = math.exp(float(log_ndtr(z[1])))
    mass[-1] = math.exp(float(log_ndtr(-z[-2])))
    a, b = z[1:-2], z[2:-1]
    pieces = np.maximum(np.ceil((b - a) / _PIECE), 1.0).astype(np.int64)
    one = pieces == 1
    w = b[one] - a[one]
    nodes = 0.5 * (a[one] + b[one])[:, None] + 0.5 * w[:, None] * _GL_X[None, :]
    with np.errstate(under="ignore"):
        dens = np.exp(-0.5 * nodes * nodes) / math.sqrt(2.0 * math.pi)
    inner = np.zeros(a.size)
    inner[one] = 0.5 * w * (dens @ _GL_W)
    for i in np.flatnonzero(~one):
        edges = np.linspace(a[i], b[i], int(pieces[i]) + 1)
        pw = np.diff(edges)
        nd = 0.5 * (edges[:-1] + edges[1:])[:, None] + 0.5 * pw[:, None] * _GL_X[None, :]
        with np.errstate(under="ignore"):
            dd = np.exp(-0.5 * nd * nd) / math.sqrt(2.0 * math.pi)
        inner[i] = math.fsum((0.5 * pw * (dd @ _GL_W)).tolist())
    mass[1:-1] = inner
    # the density's exp(-z²/2) carries a relative error ~u (z²/2 + 1), the 8-term sums a few u
    zz = np.maximum(np.abs(a), np.abs(b))
    err = float(np.sum(inner * 8 * _U * (1.0 + zz * zz)))
    for end in (mass[0], mass[-1]):  # from log-CDFs good to 32 ulps of (|value| + 1)
        if end > 0:
            err += end * 32 * _U * (abs(math.log(end)) + 2.0)
    return mass, err + 1e-30 * n


def _step_laws(
    sigma: float, c: float, h: float, cells: int
) -> tuple[FloatArray, FloatArray, float, float]:
    """Laws of ``min(⌊log(1 + c X)/h⌋, cells - 1)`` for one step with (``P``) and without
    (``Q``) the record (``log X ~ N(±v/2, v)``, ``v = 1/σ²``) and bounds on their L1 errors."""
    v = 1.0 / (sigma * sigma)
    s = math.sqrt(v)
    u = np.arange(1, cells, dtype=np.float64) * h
    lx = np.log(np.expm1(u) / c)
    lx = np.concatenate(([-np.inf], lx, [np.inf]))
    q, eq = _normal_cells((lx + 0.5 * v) / s)
    p, ep = _normal_cells((lx - 0.5 * v) / s)
    return p, q, ep, eq


class _Law:
    """Masses of a statistic on ``0, 1, …, len - 1`` (exact below the cap it was cut at),
    with a bound ``err`` on the L1 distance to the exact masses."""

    def __init__(self, mass: NDArray[np.floating[Any]], err: float) -> None:
        self.mass = mass
        self.err = err

    def conv(self, other: _Law, cap: int) -> _Law:
        n_out = min(self.mass.size + other.mass.size - 1, cap)
        n_fft = sfft.next_fast_len(self.mass.size + other.mass.size - 1, real=True)
        fa = sfft.rfft(self.mass, n_fft)
        fb = sfft.rfft(other.mass, n_fft)
        out = sfft.irfft(fa * fb, n_fft)[:n_out]
        # round-off: ||ĉ - c||_2 <= γ (||a||_2 ||b||_1 + ||a||_1 ||b||_2 + ||c||_2) with
        # γ = C u (log2 n + 1); the L1 norm over the n_out kept entries is <= sqrt(n_out) times
        gamma = _FFT_C * _U_EXT * (math.log2(n_fft) + 1.0)
        a1, b1 = float(np.sum(self.mass)), float(np.sum(other.mass))
        a2, b2 = float(np.linalg.norm(self.mass)), float(np.linalg.norm(other.mass))
        c2 = float(np.linalg.norm(out))
        fft_err = math.sqrt(n_out) * gamma * (a2 * b1 + a1 * b2 + c2 + 1e-300)
        # propagated: (a + e_a)*(b + e_b) - a*b, in L1 (cutting at the cap only drops terms)
        prop = self.err * (b1 + other.err) + other.err * a1
        # clipping negative round-off to 0 moves each entry toward its (non-negative) value
        return _Law(np.maximum(out, 0.0), fft_err + prop)

    def power(self, count: int, cap: int) -> _Law:
        """``count``-fold convolution power (repeated squaring), cut at ``cap``."""
        result: _Law | None = None
        base: _Law = self
        while count:
            if count & 1:
                result = base if result is None else result.conv(base, cap)
            count >>= 1
            if count:
                base = base.conv(base, cap)
        return result if result is not None else _Law(np.ones(1, dtype=_EXT), 0.0)


def allocation_statistic_pair(
    num_steps: int, noise_multiplier: float, num_selected: int, c: float
) -> tuple[FloatArray, FloatArray, float, float]:
    """``(p, q, err_p, err_q)``: the laws under ``P`` and ``Q`` of the statistic
    ``min(Σ_i min(⌊log(1 + c X_i)/h⌋, N - 1), cap)`` of one epoch of ``k``-out-of-``t``
    allocation (module docstring; ``h = c/20`` or coarser, so that ``N <= 2^17`` cells reach
    where the record's step has mass ~1e-19 above), the last entry being the merged top
    outcome, and bounds on the L1 distance of each computed vector to the exact law."""
    t, k = check_steps_selected(num_steps, num_selected)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    c = check_positive("c", c)
    v = 1.0 / (sigma * sigma)
    top = math.log1p(c * math.exp(min(0.5 * v + _Z_TOP * math.sqrt(v), 700.0)))
    h = max(c / 20.0, top / (_MAX_CELLS - 1))
    cells = int(min(max(math.ceil(top / h) + 1, 2), _MAX_CELLS))
    p1, q1, e_p1, e_q1 = _step_laws(sigma, c, h, cells)
    # the cap: k steps anywhere in their range plus the other steps' bulk (12 sd above)
    idx = np.arange(cells, dtype=np.float64)
    mean_q = float(q1 @ idx)
    sd_q = math.sqrt(max(float(q1 @ (idx * idx)) - mean_q * mean_q, 0.0))
    cap = int(min(k * (cells - 1) + t * mean_q + 12.0 * math.sqrt(t) * sd_q + 2, _MAX_SUM))
    q_ext, p_ext = q1.astype(_EXT), p1.astype(_EXT)
    q_law = _Law(q_ext, e_q1).power(t, cap)
    p_law = _Law(p_ext, e_p1).power(k, cap).conv(_Law(q_ext, e_q1).power(t - k, cap), cap)
    out = []
    for law in (p_law, q_law):
        mass = np.asarray(law.mass[:cap], dtype=np.float64)  # rounding: relative u each
        rest = max(1.0 - math.fsum(mass.tolist()), 0.0)
        out.append((np.concatenate((mass, [rest])), 2.0 * law.err + 4 * _U))
    (p, ep), (q, eq) = out
    return p, q, ep, eq


def _lower_epsilon(
    p: FloatArray,
    q: FloatArray,
    ep: float,
    eq: float,
    delta: float,
    epochs: int,
    vdi: float,
) -> float:
    """The certified lower ε at ``delta`` of ``epochs`` compositions of the pair ``(p, q)``
    known to within ``ep``, ``eq`` in L1."""
    from renyi.analysis.pld import PrivacyLossDistribution

    tot_p, tot_q = math.fsum(p.tolist()), math.fsum(q.tolist())
    pld = PrivacyLossDistribution.from_distributions(
        p / tot_p, q / tot_q, value_discretization_interval=vdi
    )
    if epochs > 1:
        pld = pld.self_compose(epochs)
    # renormalising moves each vector by |1 - total| in L1 as well
    ep += abs(1.0 - tot_p)
    eq += abs(1.0 - tot_q)

    # the computed pair's δ(ε), from below, less what the round-off can account for; both
    # terms decrease in ε, so the largest ε where it still exceeds delta is found by bisection
    def margin(eps: float) -> float:
        slack = epochs * (ep + math.exp(min(eps, 700.0)) * eq)
        return float(pld.delta_for_epsilon(eps).lower) - slack - delta

    hi = float(pld.epsilon_for_delta(delta).lower)
    if margin(0.0) <= 0.0:
        return 0.0
    if margin(hi) > 0.0:
        return hi
    lo = 0.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if margin(mid) > 0.0 else (lo, mid)
    return lo


def _lower_bound_args(
    num_steps: int,
    noise_multiplier: float,
    delta: float,
    num_selected: int,
    epochs: int,
    direction: str,
    value_discretization_interval: float,
) -> tuple[int, int, float, float, int, tuple[str, ...], float]:
    """The lower bounds' arguments checked: ``(t, k, sigma, delta, epochs, directions,
    value_discretization_interval)``, ``directions`` those ``direction`` asks for."""
    t, k = check_steps_selected(num_steps, num_selected)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    d = check_delta(delta)
    e = check_int("epochs", epochs, 1)
    if direction not in ("remove", "add", "both"):
        raise fail("direction", direction, "'remove', 'add' or 'both'")
    vdi = check_positive("value_discretization_interval", value_discretization_interval)
    directions = ("remove", "add") if direction == "both" else (direction,)
    return t, k, sigma, d, e, directions, vdi


def allocation_epsilon_lower_bound(
    num_steps: int,
    noise_multiplier: float,
    delta: float,
    *,
    num_selected: int = 1,
    epochs: int = 1,
    direction: str = "both",
    value_discretization_interval: float = 1e-4,
) -> float:
    """A certified lower bound on ε(δ) of ``epochs`` epochs of random ``k``-out-of-``t``
    allocation of the Gaussian with noise multiplier σ, under add/remove neighbours.

    ``direction``: ``"remove"`` (``H(P‖Q)``), ``"add"`` (``H(Q‖P)``) or ``"both"`` (the larger:
    what an upper bound reporting the worse direction must exceed). The pair is attained by
    a concrete dataset (module docstring), so no sound analysis of the sampler can report
    less. Largest of the values for ``c = θ k/t``, ``θ`` in ``(0.1, 0.3, 1)``
    (:func:`allocation_statistic_pair`) and, for ``k = 2, 3`` with few steps, of the
    recursion's statistic (:func:`renyi.analysis.allocation_multi.multi_allocation_lower_pair`,
    within 0.3–1.7 % of the upper bound where it applies).

    >>> lo = allocation_epsilon_lower_bound(20, 1.0, 1e-3, num_selected=2)
    >>> 1.6 < lo < 1.69  # Monte Carlo of the pair: 1.68 [1.66, 1.70] (99 %)
    True
    """
    t, k, sigma, delta, e, directions, vdi = _lower_bound_args(
        num_steps,
        noise_multiplier,
        delta,
        num_selected,
        epochs,
        direction,
        value_discretization_interval,
    )
    if 1.0 / (sigma * sigma) > 1400.0:  # exp(v/2) overflows: no statistic is needed
        raise fail("noise_multiplier", noise_multiplier, f">= {1.0 / math.sqrt(1400.0):.4g}")
    best = 0.0
    for theta in _THETAS:
        c = theta * k / t
        for d in directions:
            best = max(best, _cached_lower(t, k, sigma, c, delta, e, d, vdi))
    if k > 1:  # the recursion's statistic (renyi.analysis.allocation_multi), where it applies
        from renyi.analysis.allocation_multi import multi_allocation_epsilon_lower_bound

        cells = multi_allocation_epsilon_lower_bound(
            t, sigma, delta, k, epochs=e, direction=direction, value_discretization_interval=vdi
        )
        if cells is not None:
            best = max(best, cells)
    return best


@functools.lru_cache(maxsize=256)
def _cached_lower(
    t: int, k: int, sigma: float, c: float, delta: float, epochs: int, direction: str, vdi: float
) -> float:
    p, q, ep, eq = _cached_pair(t, k, sigma, c)
    if direction == "add":
        p, q, ep, eq = q, p, eq, ep
    return _lower_epsilon(p, q, ep, eq, delta, epochs, vdi)


@functools.lru_cache(maxsize=32)
def _cached_pair(
    t: int, k: int, sigma: float, c: float
) -> tuple[FloatArray, FloatArray, float, float]:
    p, q, ep, eq = allocation_statistic_pair(t, sigma, k, c)
    p.setflags(write=False)
    q.setflags(write=False)
    return p, q, ep, eq
