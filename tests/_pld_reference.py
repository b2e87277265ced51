"""An independent connect-the-dots PLD of the Poisson-subsampled Gaussian, for tests.

Shares no code with :mod:`renyi.analysis.pld`. The step is discretised here from the normal
CDF (connect the dots, Doroshenko et al. 2022: each loss bin's P- and Q-masses are kept by two
atoms at its ends; mass beyond ``z`` standard deviations goes to ``+inf``), and the ``T``-fold
composition is computed by **direct** convolutions (``np.convolve``, binary powering) in
float64: every composed mass is a sum of products of non-negative numbers, so each keeps
~1e-13 relative accuracy however small it is -- no FFT round-off spread over the window, no
tilts, no binomial split, no truncation budget (masses below 1e-60 are dropped after each
product; their effect on delta is below 1e-50). Not a rigorous bound (the CDF differences
are not rounded outward), but exact to ~1e-12 relative for the discretised pair, at any
delta. ``O(n^2)`` per product: for coarse grids (``h >= 5e-4``).

On the same grid the accountant's pessimistic side must be at least this, and -- if its
tracked error terms are tight -- barely more.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr

_FLOOR = 1e-60


def _mass(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``Phi(b) - Phi(a)`` for ``a <= b``, from the side of the median that keeps accuracy."""
    upper = a > 0
    return np.where(upper, ndtr(-a) - ndtr(-b), ndtr(b) - ndtr(a))


def step(
    q: float, sigma: float, h: float, direction: str, z: float = 12.0
) -> tuple[int, np.ndarray, float]:
    """(first grid index, masses on the grid, mass at +inf) of one step's pessimistic
    discretisation, for the pair ``((1-q) N(0, s^2) + q N(1, s^2), N(0, s^2))`` ("remove")
    or the reverse ("add")."""
    s2 = sigma * sigma

    def loss(x: float) -> float:  # log dP/dQ of the remove pair, increasing in x
        return float(np.logaddexp(math.log1p(-q), math.log(q) + (2.0 * x - 1.0) / (2.0 * s2)))

    def x_of(value: np.ndarray) -> np.ndarray:  # inverse of loss
        with np.errstate(divide="ignore", invalid="ignore"):
            x = s2 * np.log((np.expm1(value) + q) / q) + 0.5
        return np.where(np.expm1(value) + q > 0, x, -np.inf)

    x_top = 1.0 + z * sigma
    l_top, l_bot = loss(x_top), math.log1p(-q)
    if direction == "remove":  # first side P, loss l(x); x beyond x_top to +inf
        k0, k1 = math.floor(l_bot / h), math.ceil(l_top / h)
        grid = np.arange(k0, k1 + 1) * h
        xe = np.concatenate(([-np.inf], x_of(grid[1:-1]), [x_top]))
    else:  # add: first side N(0), loss -l(x), decreasing in x; x beyond x_top to the bottom
        k0, k1 = math.floor(-l_top / h), math.ceil(-l_bot / h)
        grid = np.arange(k0, k1 + 1) * h
        xe = np.concatenate(([-np.inf], x_of(-grid[::-1][1:-1]), [np.inf]))
    qm = _mass(xe[:-1] / sigma, xe[1:] / sigma)  # N(0) mass of each x-bin
    pm = (1.0 - q) * qm + q * _mass((xe[:-1] - 1.0) / sigma, (xe[1:] - 1.0) / sigma)
    inf = 0.0
    if direction == "remove":
        first, partner = pm, qm
        inf = (1.0 - q) * float(ndtr(-x_top / sigma)) + q * float(ndtr(-(x_top - 1.0) / sigma))
    else:  # x-bins run from high loss to low: reverse to ascending loss
        first, partner = qm[::-1], pm[::-1]
    lo_l, hi_l = grid[:-1], grid[1:]  # loss bin i is (grid[i], grid[i + 1]]
    with np.errstate(invalid="ignore", divide="ignore"):
        up = (first - partner * np.exp(lo_l)) / -np.expm1(lo_l - hi_l)
    up = np.clip(np.nan_to_num(up), 0.0, first)
    out = np.zeros(grid.size)
    out[:-1] += first - up
    out[1:] += up
    return k0, out, inf


def _crop(k0: int, pmf: np.ndarray) -> tuple[int, np.ndarray]:
    keep = np.flatnonzero(pmf > _FLOOR)
    if keep.size == 0:
        return k0, np.zeros(1)
    return k0 + int(keep[0]), pmf[keep[0] : keep[-1] + 1]


def compose(
    q: float, sigma: float, steps: int, h: float, direction: str, z: float = 12.0
) -> tuple[np.ndarray, np.ndarray, float]:
    """(losses, masses, mass at +inf) of ``steps`` composed steps, by direct convolution."""
    k0, pmf, inf = step(q, sigma, h, direction, z)
    base = _crop(k0, pmf)
    acc: tuple[int, np.ndarray] | None = None
    t = steps
    while t:
        if t & 1:
            if acc is None:
                acc = base
            else:
                acc = _crop(acc[0] + base[0], np.convolve(acc[1], base[1]))
        t >>= 1
        if t:
            base = _crop(2 * base[0], np.convolve(base[1], base[1]))
    assert acc is not None
    losses = (acc[0] + np.arange(acc[1].size)) * h
    total_inf = -math.expm1(steps * math.log1p(-inf)) if inf > 0 else 0.0
    return losses, acc[1], total_inf


def delta_for_epsilon(profile: tuple[np.ndarray, np.ndarray, float], eps: float) -> float:
    losses, mass, inf = profile
    sel = losses > eps
    return float(np.sum(mass[sel] * -np.expm1(eps - losses[sel]))) + inf


def epsilon_for_delta(
    q: float, sigma: float, steps: int, delta: float, h: float = 1e-3, z: float = 12.0
) -> float:
    """``max`` over both directions of the ``epsilon`` at which the composed PLD reaches
    ``delta`` (bisection on the discrete profile)."""
    best = 0.0
    for direction in ("remove", "add"):
        prof = compose(q, sigma, steps, h, direction, z)
        if delta_for_epsilon(prof, 0.0) <= delta:
            continue
        lo, hi = 0.0, float(prof[0][-1])
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if delta_for_epsilon(prof, mid) <= delta else (mid, hi)
        best = max(best, hi)
    return best
