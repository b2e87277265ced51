"""Privacy loss distributions of random allocation ("balls in bins"), with a proven dominance.

One epoch of random 1-out-of-``t`` allocation with the Gaussian mechanism of noise
multiplier ``σ`` has, under add/remove neighbours, the dominating pair (Feldman & Shenfeld
2025; Chua et al. 2025; the pair behind :mod:`renyi.analysis.allocation`)

    ``P = (1/t) Σ_i N(e_i, σ² I_t)``,  ``Q = N(0, σ² I_t)``.

Its likelihood ratio is ``Y = S / t`` with ``S = Σ_i X_i`` and ``X_i = exp((x_i - 1/2)/σ²)``
the likelihood ratios of the one-dimensional pair ``A = N(1, σ²)``, ``B = N(0, σ²)``. A pair
is determined, up to equivalence, by the law of its likelihood ratio under the second
distribution, so the whole analysis is that of the sum of ``t`` i.i.d. log-normals. This
module builds a *discrete pair that dominates* ``(P, Q)`` (every hockey-stick divergence
``H_γ(P‖Q) = E_Q[(Y - γ)_+] + P[Y = ∞]``, ``γ >= 0``, is at most the discrete pair's; the
family over ``γ >= 0`` covers both orders, ``H_γ(Q‖P) = 1 - γ + γ H_{1/γ}(P‖Q)``), and
hands it to :meth:`renyi.pld.PrivacyLossDistribution.from_distributions`, whose own
rounding is pessimistic too. Tools (each a proven dominance of pairs): *splitting* an
outcome into several with the same total masses (the merge is a post-processing);
*connect the dots* — an outcome region whose ratios lie in ``[a, b]`` replaced by two
outcomes at ratios ``a`` and ``b`` with the same two total masses (a mean-preserving spread
of the ratio, Doroshenko et al. 2022); and *revealing* — any part of the pair with
second-side mass ``m`` and first-side mass ``e`` replaced by an outcome of ratio 0 (mass
``m``) and one of ratio ``∞`` (mass ``e``): the part's own ``H_γ`` is at most ``e``, which
the two new outcomes give for every ``γ``. ``H_γ`` is additive over a partition of the
outcomes, so each part may be treated separately. The construction:

1. **Patterns.** Partition the outputs by which coordinates have ratio ``X_i`` below ``x0``
   (rare: revealed), above the cut ``M`` ("large") or in ``[x0, M]``. Patterns with two
   or more large ratios are revealed (``x0`` and ``M`` are chosen so that these parts carry
   about ``1e-14``).
2. **No large ratio.** Each coordinate's ratio on ``[x0, M]`` is spread (connect the dots)
   onto the lattice ``x0 + ΔZ`` (cells of one or more lattice steps). Applying the kernel
   that undoes this to every coordinate maps the allocation of the lattice pair to that of
   the true one (allocation is built coordinate by coordinate), so the lattice version
   dominates; its ratio ``S'/t`` lives on the lattice ``t x0 + ΔZ`` and its second-side
   law is the ``t``-fold convolution power (exact: lattice sums stay on the lattice).
3. **Exactly one large ratio** (``t`` such patterns, one per coordinate): the large ratio is
   spread onto a geometric grid on ``(M, X_max]`` (beyond ``X_max`` the first side has
   mass ``tail_mass``: revealed), the others' sum is the ``(t - 1)``-fold lattice power
   (coarsened by connect the dots), and each sum of the two is spread onto a geometric grid
   of ratios. The heavy tail that decides ``δ`` at small ``ε`` — one coordinate's large
   likelihood ratio — is thus resolved in relative terms (``~1e-3``), not on the lattice.
4. **Rigorous arithmetic by lower bounds.** Every mass is carried as a proven *lower bound*:
   cell masses from log-CDFs with a bound on their round-off (the CDF on the side where it
   is small, no cancellation), convolution powers computed directly (all terms
   non-negative, so within a factor ``1 ± γ_n`` of the exact value) and scaled down by that
   factor, every sum of positive terms likewise. What the lower bounds miss, everything
   truncated and every revealed part together form one part with computed masses
   ``m = 1 - Σ ν`` and ``e = 1 - Σ ν y``: it is revealed (ratio 0 and ``∞``).

The explicit atoms (lattice and geometric-grid ratios with their masses), ``m`` at ratio 0
and ``e`` at ``∞`` form a discrete pair that dominates the epoch, so its ``δ(ε)`` is an
upper bound for every ``ε``, in both directions, and stays one under composition over
epochs. ``e`` and ``m`` are ``~1e-10`` to ``1e-9`` (mostly the round-off bounds of the cell
masses, times ``t``): a floor under ``δ`` per epoch. The looseness is the spread of step 2
(variance ``<= Δ²/4`` per coordinate), controlled by the number of lattice points (default
4096; the cost grows like its square), and the geometric grids of step 3.

**The add direction with few steps** (:func:`allocation_pair_add`). The lattice above must
reach the heavy tail, which makes it coarse when ``t`` is small, and the add direction
(``H_γ(Q‖P)``, decided by small ``Y``) feels that first. A second dominating pair partitions
by "some ratio above ``M ≈ t``": those outputs have ``Y >= M/t``, and a proven share of them
(second-side mass ``1 - (1 - Q[X > M])^t``, from below) is kept at ratio ``M/t`` with the
first side's surplus at ``∞`` — nothing for ``H_γ(Q‖P)``, ``γ >= 1``; the rest is the
``t``-fold power of a lattice on ``[x0, M]``, which holds every sum (``Δ ≈ t²/points``).
:func:`allocation_pairs` uses it for the add direction where its lattice is the finer.

``k > 1`` (each record in ``k`` of ``t`` steps): with ``m = ⌊t/k⌋`` and ``r = t - k m``,
split the steps into ``k - r`` blocks of ``m`` and ``r`` blocks of ``m + 1``
(:func:`renyi.analysis.allocation.allocation_blocks`) and pick one step in each block
uniformly; a uniformly random relabelling of the steps turns this into a uniform
``k``-subset (its law is invariant under every permutation, and permutations act
transitively on ``k``-subsets). Revealing the relabelling can only help the adversary, and
given it the record's steps are independent 1-out-of-``size`` allocations of the blocks, so
the PLD is the composition of the blocks' PLDs (Feldman & Shenfeld 2025 use ``k`` blocks of
``⌊t/k⌋``, padding the rest with pure-noise steps: up to ``k/⌊t/k⌋`` times less amplification
per block when ``k`` does not divide ``t``). Where the lattice is too coarse for the noise
(small σ), :func:`allocation_pld` returns the record's ``k`` Gaussian runs without
amplification when that is tighter at both reference δs (1e-2 and 1e-6): a choice between
two sound bounds. The accountants report the minimum of this PLD bound and the RDP bound of
:mod:`renyi.analysis.allocation`; :mod:`renyi.analysis.allocation_lower` gives the certified
lower bound that brackets them.

Example
-------
>>> rem, add = allocation_pld(235, 1.1)  # sigma = 1.1, n = 60000, b = 256: one epoch
>>> eps = max(float(p.epsilon_for_delta(1e-5).upper) for p in (rem, add))
>>> 0.27 < eps < 0.272  # Poisson accounting: 0.307; the RDP bound: 0.722
True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import log_ndtr, ndtr, ndtri

from renyi._validation import check_int, check_positive, check_probability, fail
from renyi.analysis.allocation import allocation_blocks, check_steps_selected
from renyi.analysis.pld import DEFAULT_MAX_BINS, PrivacyLossDistribution

__all__ = [
    "DEFAULT_MAX_POINTS",
    "AllocationPair",
    "allocation_pair",
    "allocation_pair_add",
    "allocation_pairs",
    "allocation_pld",
    "lattice_allocation_pair",
]

FloatArray = NDArray[np.float64]

DEFAULT_MAX_POINTS = 1 << 12
"""Default number of lattice points of ``S`` (the cost grows like its square)."""
MAX_POINTS = 1 << 16
_MAX_V = 1400.0  # largest 1/σ²: beyond it exp(v/2) overflows and no lattice holds X

_U = 2.0**-53  # unit round-off
_LOGCDF_ULPS = 32.0  # assumed accuracy of scipy's log_ndtr, in ulps of (|value| + 1), as renyi.pld
_TINY = 2.0**-1074  # smallest subnormal: the absolute round-off of an underflowing product
_CELL_REL = 1.0 / 256.0  # cells grow to about this fraction of their position


class AllocationPair:
    """An explicit discrete pair dominating one epoch of 1-out-of-``t`` allocation.

    Atoms at likelihood ratios ``ratios`` with second-side masses ``q`` (the first side's
    are ``q * ratios``), the second side's ``zero_mass`` at ratio 0 and the first side's
    ``inf_mass`` at ratio ``∞``.
    """

    def __init__(
        self,
        ratios: FloatArray,
        q: FloatArray,
        zero_mass: float,
        inf_mass: float,
        spacing: float = math.nan,
    ) -> None:
        self.ratios = ratios
        self.q = q
        self.zero_mass = zero_mass
        self.inf_mass = inf_mass
        self.spacing = spacing  # of the lattice of the ratios' sum (its resolution)

    def delta(self, epsilon: float, direction: str = "remove") -> float:
        """Hockey-stick divergence ``δ(ε)`` of the pair (exact for the discrete pair, so an
        upper bound for the mechanism) in ``direction`` (``remove``: ``H_{e^ε}(P‖Q)``)."""
        if direction not in ("remove", "add"):
            raise fail("direction", direction, "'remove' or 'add'")
        y, g = self.ratios, math.exp(epsilon)
        if direction == "remove":
            return math.fsum((self.q * np.maximum(y - g, 0.0)).tolist()) + self.inf_mass
        return math.fsum((self.q * np.maximum(1.0 - g * y, 0.0)).tolist()) + self.zero_mass

    def pld(
        self, direction: str, *, value_discretization_interval: float, tail_mass: float
    ) -> PrivacyLossDistribution:
        """The pessimistic PLD of the pair in ``direction`` (``remove``: ``(P, Q)``).

        Losses above ``_LOSS_HI`` go to ``+inf`` (both masses kept apart: a spread) and
        losses below ``-_LOSS_LO`` are raised to it (the second side's surplus split off to
        an outcome of its own: a spread), so the loss grid stays bounded."""
        if direction not in ("remove", "add"):
            raise fail("direction", direction, "'remove' or 'add'")
        y = self.ratios
        if direction == "remove":
            f, g, only_f, only_g = self.q * y, self.q, self.inf_mass, self.zero_mass
            with np.errstate(divide="ignore"):
                loss = np.log(y)
        else:
            f, g, only_f, only_g = self.q, self.q * y, self.zero_mass, self.inf_mass
            with np.errstate(divide="ignore"):
                loss = -np.log(y)
        high = loss > _LOSS_HI
        only_f += math.fsum(f[high].tolist())
        only_g += math.fsum(g[high].tolist())
        f, g, loss = f[~high], g[~high], loss[~high]
        low = loss < -_LOSS_LO
        g_new = np.where(low, f * math.exp(_LOSS_LO) * (1.0 - 4 * _U), g)
        only_g += math.fsum((g - g_new).tolist())
        p = np.concatenate((f, [only_f, 0.0]))
        q = np.concatenate((g_new, [0.0, only_g]))
        return PrivacyLossDistribution.from_distributions(
            p, q, value_discretization_interval=value_discretization_interval, tail_mass=tail_mass
        )


def _log_cdf_pair(z: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """``log Φ(z)``, ``log Φ(-z)`` and bounds on their absolute errors."""
    lo = log_ndtr(z)
    hi = log_ndtr(-z)
    # at z = ±inf the values (0 and -inf) are exact
    elo = np.where(np.isfinite(z), _LOGCDF_ULPS * _U * (np.abs(lo) + 1.0), 0.0)
    ehi = np.where(np.isfinite(z), _LOGCDF_ULPS * _U * (np.abs(hi) + 1.0), 0.0)
    return lo, hi, elo, ehi


def _cell_masses(z: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Masses ``Φ(z[i+1]) - Φ(z[i])`` of the cells between increasing ``z`` (``-inf``
    allowed first) and bounds on their absolute errors, computed without cancellation
    (lower CDF left of 0, upper CDF right of it) from log-CDFs."""
    lo, hi, elo, ehi = _log_cdf_pair(z)
    a_lo, b_lo, ea_lo, eb_lo = lo[:-1], lo[1:], elo[:-1], elo[1:]
    a_hi, b_hi, ea_hi, eb_hi = hi[:-1], hi[1:], ehi[:-1], ehi[1:]
    left = z[1:] <= 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        # left: exp(b_lo) * (1 - exp(a_lo - b_lo)); right: exp(a_hi) * (1 - exp(b_hi - a_hi))
        big = np.where(left, b_lo, a_hi)
        d = np.where(left, a_lo - b_lo, b_hi - a_hi)  # <= 0
        ed = np.where(left, ea_lo + eb_lo, ea_hi + eb_hi) + _U * np.abs(
            np.nan_to_num(d, nan=0.0, neginf=0.0)
        )
        ebig = np.where(left, eb_lo, ea_hi)
        frac = -np.expm1(d)  # in [0, 1]
        mass = np.exp(big) * frac
        # |frac error| <= ed (derivative of expm1 on (-inf, 0] is <= 1) plus round-off
        rel = np.where(frac > 0, (ed + 4 * _U * frac) / np.where(frac > 0, frac, 1.0), np.inf)
        err = mass * (rel + 2.0 * ebig + 4 * _U)
    mass = np.nan_to_num(mass, nan=0.0, posinf=0.0)
    err = np.where(np.isfinite(err), err, mass)
    return mass, np.minimum(err, mass)


def _cell_edges(n: int, offset: float) -> NDArray[np.int64]:
    """Lattice indices ``0 = e_0 < e_1 < ... = n - 1`` of the cells of ``offset + jΔ``
    (``offset`` in units of Δ): width 1 while the position is below ``1/_CELL_REL`` cells,
    then about ``_CELL_REL`` times the position, so that connect the dots loses at most a
    factor ``1/_CELL_REL`` of relative accuracy to cancellation."""
    edges = [0]
    while edges[-1] < n - 1:
        e = edges[-1]
        edges.append(min(n - 1, e + max(1, int((e + offset) * _CELL_REL))))
    return np.asarray(edges, dtype=np.int64)


def _ctd_lower(sigma: float, x: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Connect the dots for the likelihood ratio ``X`` of ``(N(1, σ²), N(0, σ²))`` on the
    cells between the increasing points ``x``: lower bounds on the second-side masses sent
    to each cell's lower and upper end (the cell's two masses are kept: a mean-preserving
    spread of ``X``)."""
    v = 1.0 / (sigma * sigma)
    s = math.sqrt(v)
    with np.errstate(divide="ignore"):
        lx = np.log(x)
    zq = (lx + 0.5 * v) / s  # second-side law of log X: N(-v/2, v); first side: N(v/2, v)
    q, eq = _cell_masses(zq)
    p, ep = _cell_masses(zq - s)
    a, w = x[:-1], np.diff(x)
    up = (p - q * a) / w
    e_up = (ep + eq * a) / w + 4 * _U * (p + q * a) / w
    up_lo = np.clip(up - e_up, 0.0, None) * (1.0 - 4 * _U)
    low_lo = np.clip(q - up - eq - e_up, 0.0, None) * (1.0 - 4 * _U)
    return low_lo, up_lo


def _small_lattice(sigma: float, x0: float, spacing: float, top: int, n: int) -> FloatArray:
    """Lower bounds on the second-side masses of the connect-the-dots lattice version of
    ``X`` restricted to ``x0 <= X <= x0 + top * spacing``, on ``x0 + spacing * [0, n)``."""
    edges = _cell_edges(top + 1, x0 / spacing)
    low, up = _ctd_lower(sigma, np.asarray(x0 + edges * spacing, dtype=np.float64))
    out = np.zeros(n)
    np.add.at(out, edges[:-1], low)
    np.add.at(out, edges[1:], up)
    out *= 1.0 - 4 * _U  # the additions round
    return out


Window = tuple[int, FloatArray]  # (lattice index of the first entry, masses)


def _conv_lower(a: Window, b: Window, lo: int, n: int) -> Window:
    """A lower bound on the convolution of the non-negative lattice masses ``a`` and ``b`` on
    the window ``[lo, lo + n)`` (``lo >= a.lo + b.lo``; entries outside are dropped). Direct
    summation: every output is a sum of at most ``m`` non-negative products, so the computed
    value is within a factor ``1 ± γ_m`` of the exact one (plus underflow)."""
    full = np.convolve(a[1], b[1])
    start = lo - a[0] - b[0]
    c = np.zeros(n)
    piece = full[start : start + n]
    c[: piece.size] = piece
    m = min(a[1].size, b[1].size) + 2
    gamma = m * _U / (1.0 - m * _U)
    out: FloatArray = np.maximum(c * (1.0 - gamma) * (1.0 - _U) - m * _TINY, 0.0)
    return lo, out


def _power_lower(
    base: FloatArray, count: int, n: int, lowest: Callable[[int], int] = lambda m: 0
) -> Window:
    """Lower bound on the ``count``-fold convolution power of ``base`` (repeated squaring),
    each partial sum of ``m`` terms kept on the window starting at ``lowest(m)``."""
    result: Window | None = None
    power: Window = (0, base)
    m_power, m_result = 1, 0
    while count:
        if count & 1:
            if result is None:
                result, m_result = power, m_power
            else:
                m_result += m_power
                lo = max(lowest(m_result), result[0] + power[0])
                result = _conv_lower(result, power, lo, n)
        count >>= 1
        if count:
            m_power *= 2
            power = _conv_lower(power, power, max(lowest(m_power), 2 * power[0]), n)
    assert result is not None
    return result


_REFERENCE_DELTAS = (1e-2, 1e-6)  # where allocation_pld compares with no amplification
_LOSS_HI = 40.0  # one epoch's losses above this go to +inf ...
_LOSS_LO = 20.0  # ... and below -_LOSS_LO are raised to it (the loss grid stays bounded)
_REST_POINTS = 1024  # points of the others' sum next to one large ratio
_BUDGET = 1e-14  # mass of the outcomes left to the leftover by the choice of x0 and M


def _cut_points(t: int, v: float, tail_mass: float) -> tuple[float, float, float]:
    """``(x0, M, X_max)``: ratios below ``x0`` (any coordinate) and two or more above ``M``
    are rare enough (``_BUDGET``) to be left to the leftover; above ``X_max`` the first
    side's mass is ``tail_mass``."""
    s = math.sqrt(v)
    z_low = float(-ndtri(_BUDGET / t))
    x0 = math.exp(-0.5 * v - z_low * s)
    z_top = float(-ndtri(tail_mass))
    x_max = math.exp(min(0.5 * v + z_top * s, 700.0))

    def rare(z: float) -> bool:  # two or more coordinates above exp(-v/2 + z s)
        qm, pm = float(ndtr(-z)), float(ndtr(s - z))
        return (t - 1) * pm * qm + 0.5 * (t - 1) * t * qm * qm <= _BUDGET

    if t == 1:
        z = 3.0
    else:
        lo, hi = -10.0, 40.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if rare(mid) else (mid, hi)
        z = max(hi, 3.0)
    big = math.exp(min(-0.5 * v + z * s, 700.0))
    return x0, max(big, 2.0 * x0), x_max


def allocation_pair(
    num_steps: int,
    noise_multiplier: float,
    *,
    tail_mass: float = 1e-15,
    max_points: int = DEFAULT_MAX_POINTS,
) -> AllocationPair:
    """The explicit discrete pair dominating one epoch of 1-out-of-``num_steps`` allocation
    of the Gaussian with ``noise_multiplier`` (module docstring, steps 1–4).

    ``max_points`` (64 to 65 536) lattice points hold the sums of the ratios below the cut
    ``M``; the cost is ``O(max_points² log t)``. The first side's mass beyond the largest
    ratio considered is ``tail_mass`` (it goes to ratio ``∞``).
    """
    t = check_int("num_steps", num_steps, 1)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    tail_mass = check_probability("tail_mass", tail_mass)
    if not 0.0 < tail_mass < 1.0:
        raise fail("tail_mass", tail_mass, "a probability in (0, 1)")
    n = check_int("max_points", max_points, 64)
    if n > MAX_POINTS:
        raise fail("max_points", max_points, f"an integer in [64, {MAX_POINTS}]")
    v = 1.0 / (sigma * sigma)
    if v > _MAX_V:
        raise fail(
            "noise_multiplier",
            noise_multiplier,
            f"a number >= {1.0 / math.sqrt(_MAX_V):.4g} for the allocation PLD "
            "(smaller noise: use the RDP bound)",
        )
    return _build_pair(t, sigma, tail_mass, n)


@functools.lru_cache(maxsize=16)
def _build_pair(t: int, sigma: float, tail_mass: float, n: int) -> AllocationPair:
    """:func:`allocation_pair` on validated arguments, cached (its arrays are read-only): an
    accountant, a ledger re-pricing an entry or the CLI asking twice pays once."""
    v = 1.0 / (sigma * sigma)
    x0, big, x_max = _cut_points(t, v, tail_mass)
    # the lattice: from where the sum of t ratios almost surely is not below (a lower tail
    # bound for non-negative summands, 1e-17) to one large-ish ratio above the bulk; the
    # lattice's own spread (<= Δ²/4 per ratio) widens the bulk (a fixed point, 3 rounds)
    spacing = 1.0
    for _ in range(3):
        var, m2 = math.expm1(min(v, 700.0)) + spacing**2 / 4, math.exp(min(v, 700.0))
        low = max(t * x0, t - 8.8 * math.sqrt(t * (m2 + spacing**2 / 4)))
        s_max = t + 12.0 * math.sqrt((t - 1) * var) + 1.5 * big
        spacing = (s_max - low) / (n - 1)
    top = max(1, min(n - 1, int((big - x0) / spacing)))
    big = x0 + top * spacing  # the cut, on the lattice
    small = _small_lattice(sigma, x0, spacing, top, n)
    vals = x0 + np.arange(n) * spacing
    m2_lat = (
        math.fsum((small * vals * vals).tolist())
        + max(1.0 - math.fsum(small.tolist()), 0.0) * big * big
    )

    def lowest(m: int) -> int:  # first lattice index kept for a sum of m ratios
        return max(0, math.floor((m * (1.0 - x0) - 8.8 * math.sqrt(m * m2_lat)) / spacing))

    rest = _power_lower(small, t - 1, n, lowest) if t > 1 else None
    lo_w, whole = (
        (0, small) if rest is None else _conv_lower(rest, (0, small), max(lowest(t), rest[0]), n)
    )
    ratios = [(t * x0 + (lo_w + np.arange(n)) * spacing) / t]
    masses = [whole]
    if x_max > big * (1.0 + 1e-9):
        ratios_1, masses_1 = _one_large(sigma, t, x0, spacing, big, x_max, rest)
        ratios.append(ratios_1)
        masses.append(masses_1)
    return _close_pair(np.concatenate(ratios), np.concatenate(masses), spacing)


def _close_pair(y: FloatArray, q: FloatArray, spacing: float) -> AllocationPair:
    """The pair of the atoms ``(y, q)`` (zero masses dropped) with everything they miss
    revealed: the leftover second-side mass at ratio 0 and first-side mass at ``∞``, with a
    margin for the rounding of the atoms' ratios and products."""
    keep = q > 0.0
    y, q = y[keep], q[keep]
    zero_mass = max(1.0 - math.fsum(q.tolist()), 0.0) + 64 * _U
    inf_mass = max(1.0 - math.fsum((q * y).tolist()), 0.0) + 64 * _U
    y.setflags(write=False)
    q.setflags(write=False)
    return AllocationPair(y, q, zero_mass, inf_mass, spacing)


def allocation_pairs(
    num_steps: int,
    noise_multiplier: float,
    *,
    tail_mass: float = 1e-15,
    max_points: int = DEFAULT_MAX_POINTS,
) -> tuple[AllocationPair, AllocationPair]:
    """The dominating pairs :func:`allocation_pld` uses for the remove and the add direction:
    :func:`allocation_pair` for both, or for the add direction :func:`allocation_pair_add`
    where its lattice is the finer (few steps per epoch). Both are sound for both."""
    pair = allocation_pair(num_steps, noise_multiplier, tail_mass=tail_mass, max_points=max_points)
    if num_steps * num_steps < pair.spacing * (max_points - 1):
        return pair, allocation_pair_add(num_steps, noise_multiplier, max_points=max_points)
    return pair, pair


def allocation_pair_add(
    num_steps: int, noise_multiplier: float, *, max_points: int = DEFAULT_MAX_POINTS
) -> AllocationPair:
    """A second dominating pair of 1-out-of-``t`` allocation, fine where the add direction
    needs it for few steps: the outputs where some ratio exceeds ``M ≈ t`` have
    ``Y = S/t >= M/t``, so they are revealed but for a proven share (second-side mass
    ``1 - (1 - Q[X > M])^t``, a lower bound) kept at ratio ``M/t`` (with the first side's
    surplus at ``∞``): at ratio ``~1`` they add nothing to ``H_γ(Q‖P)`` for ``γ >= 1``. The
    rest, all ratios in ``[x0, M]``, is the ``t``-fold lattice power on ``[t x0, t M]``
    (nothing truncated: ``Δ = t M / points``). Same proof steps as :func:`allocation_pair`.
    """
    t = check_int("num_steps", num_steps, 1)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    n = check_int("max_points", max_points, 64)
    if n > MAX_POINTS:
        raise fail("max_points", max_points, f"an integer in [64, {MAX_POINTS}]")
    if 1.0 / (sigma * sigma) > _MAX_V:
        raise fail("noise_multiplier", noise_multiplier, f">= {1.0 / math.sqrt(_MAX_V):.4g}")
    return _build_add_pair(t, sigma, n)


@functools.lru_cache(maxsize=16)
def _build_add_pair(t: int, sigma: float, n: int) -> AllocationPair:
    v = 1.0 / (sigma * sigma)
    s = math.sqrt(v)
    x0 = _cut_points(t, v, 0.5)[0]
    spacing = (t * t - t * x0) / (n - 1)
    top = max(1, min(n - 1, int((t - x0) / spacing)))
    cut = x0 + top * spacing
    small = _small_lattice(sigma, x0, spacing, top, n)
    lo, whole = _power_lower(small, t, n)
    # second-side mass of "some ratio above the cut": 1 - (1 - Φ(-z))^t, from below
    log_tail = float(log_ndtr(-(math.log(cut) + 0.5 * v) / s))
    log_tail -= _LOGCDF_ULPS * _U * (abs(log_tail) + 1.0) + 4 * _U
    above = -math.expm1(t * math.log1p(-math.exp(log_tail))) * (1.0 - 64 * _U)
    y = np.concatenate(((t * x0 + (lo + np.arange(n)) * spacing) / t, [cut / t]))
    q = np.concatenate((whole, [max(above, 0.0)]))
    return _close_pair(y, q, spacing)


def _one_large(
    sigma: float,
    t: int,
    x0: float,
    spacing: float,
    big: float,
    x_max: float,
    rest_window: Window | None,
) -> tuple[FloatArray, FloatArray]:
    """Atoms (ratios, lower bounds on second-side masses) of the outcomes with exactly one
    coordinate's ratio in ``(big, x_max]`` (``t`` such patterns): that ratio by connect the
    dots on a geometric grid, plus the lattice sum ``rest`` of the others, spread (connect
    the dots again) onto a geometric grid of the sum."""
    g_big = max(1e-3, math.log(x_max / big) / 4096)
    k_big = max(1, math.ceil(math.log(x_max / big) / g_big))
    edges = big * np.exp(np.arange(k_big + 1) * (math.log(x_max / big) / k_big))
    edges[-1] = max(edges[-1], x_max)
    low, up = _ctd_lower(sigma, edges)
    large = np.zeros(k_big + 1)
    large[:-1] += low
    large[1:] += up
    large *= t * (1.0 - 4 * _U)
    if rest_window is None:  # t = 1: the ratio itself
        return edges / t, large
    lo_rest, rest = rest_window
    # the others' sum, coarsened (connect the dots: a spread) to at most _REST_POINTS points
    # of its support: it moves a sum of ratios above ``big`` by a fraction of its spread
    js = np.flatnonzero(rest > 1e-30 * float(rest.max()))
    c = max(1, math.ceil((js[-1] - js[0] + 1) / _REST_POINTS))
    idx = js - js[0]
    lo_i, w = idx // c, (idx % c) / c
    m_rest = np.bincount(lo_i, weights=rest[js] * (1.0 - w), minlength=lo_i[-1] + 2)
    m_rest += np.bincount(lo_i + 1, weights=rest[js] * w, minlength=lo_i[-1] + 2)
    m_rest *= 1.0 - 4 * _U * (c + 4)
    vals_rest = (t - 1) * x0 + (lo_rest + js[0] + c * np.arange(m_rest.size)) * spacing
    keep = m_rest > 0
    vals_rest, m_rest = vals_rest[keep], m_rest[keep]
    s_lo = big + vals_rest[0]
    s_hi = edges[-1] + vals_rest[-1]
    g_out = max(2e-5, math.log(s_hi / s_lo) / 65536)
    k_out = max(1, math.ceil(math.log(s_hi / s_lo) / g_out)) + 1
    grid = s_lo * np.exp(np.arange(k_out + 1) * g_out)
    acc = np.zeros(k_out + 1)
    ib = np.flatnonzero(large > 0)
    chunk = max(1, 2_000_000 // m_rest.size)
    for start in range(0, ib.size, chunk):
        sel = ib[start : start + chunk]
        sums = (edges[sel][:, None] + vals_rest[None, :]).ravel()
        mass = (large[sel][:, None] * m_rest[None, :]).ravel()
        k = np.clip(np.floor(np.log(sums / s_lo) / g_out).astype(np.int64), 0, k_out - 1)
        # the float grid decides: move k so that grid[k] <= sum < grid[k + 1]
        k = np.where(grid[k] > sums, k - 1, k)
        k = np.where(grid[k + 1] <= sums, k + 1, k)
        k = np.clip(k, 0, k_out - 1)
        w_up = np.clip((sums - grid[k]) / (grid[k + 1] - grid[k]), 0.0, 1.0)
        acc += np.bincount(k, weights=mass * (1.0 - w_up), minlength=k_out + 1)
        acc += np.bincount(k + 1, weights=mass * w_up, minlength=k_out + 1)
    # products and sums above round (all terms positive): a relative margin covering a
    # sum of every pair in one bin
    acc *= 1.0 - 4 * _U * (8 + ib.size * m_rest.size)
    return grid / t, acc


def lattice_allocation_pair(
    coordinate: ArrayLike, spacing: float, num_steps: int
) -> AllocationPair:
    """The dominating pair of 1-out-of-``num_steps`` allocation of a coordinate pair whose
    likelihood ratio lives on the lattice ``spacing * [0, n)``: ``coordinate[j]`` is (a lower
    bound on) the second side's mass at ratio ``j * spacing`` (the first side's is
    ``coordinate[j] * j * spacing``; what is missing of its unit mass sits at ratio ``∞``).
    Steps 2 and 4 of the module docstring; for a two-point lattice pair the result is an exact
    binomial mixture (a test reference for the convolution powers).
    """
    t = check_int("num_steps", num_steps, 1)
    h = check_positive("spacing", spacing)
    base = np.asarray(coordinate, dtype=np.float64)
    if base.ndim != 1 or base.size < 2 or not np.all(np.isfinite(base)) or np.any(base < 0):
        raise fail("coordinate", coordinate, "a 1-D vector of >= 2 non-negative masses")
    lo, q = _power_lower(base, t, base.size)
    y = (lo + np.arange(base.size, dtype=np.float64)) * (h / t)
    zero_mass = max(1.0 - math.fsum(q.tolist()), 0.0) + 64 * _U
    inf_mass = max(1.0 - math.fsum((q * y).tolist()), 0.0) + 64 * _U
    return AllocationPair(y, q, zero_mass, inf_mass, h)


def allocation_pld(
    num_steps: int,
    noise_multiplier: float,
    *,
    num_selected: int = 1,
    value_discretization_interval: float = 1e-4,
    tail_mass: float = 1e-15,
    max_points: int = DEFAULT_MAX_POINTS,
    max_bins: int = DEFAULT_MAX_BINS,
    whole_pair: bool = True,
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
    """PLDs ``(remove, add)`` of one epoch of random ``k``-out-of-``t`` allocation: upper
    bounds in both directions (module docstring); ``k > 1`` by the composition of
    1-out-of-``m`` allocations over the blocks of :func:`allocation_blocks` (sizes
    ``⌊t/k⌋`` and ``⌈t/k⌉``) or, where it is affordable (few steps, ``k <= 3``) and
    ``whole_pair``, the tighter of that and the whole ``k``-of-``t`` pair of
    :mod:`renyi.analysis.allocation_multi`."""
    t, k = check_steps_selected(num_steps, num_selected)
    h, tm = value_discretization_interval, tail_mass
    gauss = PrivacyLossDistribution.gaussian(
        noise_multiplier, value_discretization_interval=h, tail_mass=tm
    )
    if k > 1:
        sigma = check_positive("noise_multiplier", noise_multiplier)
        return _blocks_pld(t, k, sigma, gauss, h, tm, max_points, max_bins, whole_pair)
    m = t
    if m == 1:  # every step holds the record: k runs of the Gaussian, exactly
        return gauss, gauss
    sigma = check_positive("noise_multiplier", noise_multiplier)
    if 1.0 / (sigma * sigma) > _MAX_V:  # no lattice holds the ratio: no amplification used
        return gauss, gauss
    pair_rem, pair_add = allocation_pairs(m, sigma, tail_mass=tm, max_points=max_points)
    rem = pair_rem.pld("remove", value_discretization_interval=h, tail_mass=tm)
    add = pair_add.pld("add", value_discretization_interval=h, tail_mass=tm)
    # both are sound; where the lattice is too coarse for the noise (small σ) the record's
    # Gaussian run without amplification can be the tighter one: keep the better at the
    # reference δs (a choice between two upper bounds, never a mix of them)
    deltas = np.array(_REFERENCE_DELTAS)
    ours = np.maximum(rem.epsilon_for_delta(deltas).upper, add.epsilon_for_delta(deltas).upper)
    if np.all(gauss.epsilon_for_delta(deltas).upper < ours):
        return gauss, gauss
    return rem, add


def _blocks_pld(
    t: int,
    k: int,
    sigma: float,
    gauss: PrivacyLossDistribution,
    h: float,
    tm: float,
    max_points: int,
    max_bins: int,
    whole_pair: bool = True,
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
    """``k > 1``: the composition over the blocks of :func:`allocation_blocks` of their
    1-out-of-``size`` PLDs (a block of one step is the Gaussian); the whole pair (if
    ``whole_pair`` and affordable) or the record's ``k`` Gaussian runs where those are
    tighter at both reference δs."""
    rem: PrivacyLossDistribution | None = None
    add: PrivacyLossDistribution | None = None
    for size, count in allocation_blocks(t, k):
        if size == 1 or 1.0 / (sigma * sigma) > _MAX_V:  # the Gaussian (no lattice holds X)
            b_rem = b_add = gauss
        else:
            pair_rem, pair_add = allocation_pairs(size, sigma, tail_mass=tm, max_points=max_points)
            b_rem = pair_rem.pld("remove", value_discretization_interval=h, tail_mass=tm)
            b_add = pair_add.pld("add", value_discretization_interval=h, tail_mass=tm)
        if count > 1:
            same = b_add is b_rem
            b_rem = b_rem.self_compose(count, max_bins=max_bins)
            b_add = b_rem if same else b_add.self_compose(count, max_bins=max_bins)
        rem = b_rem if rem is None else rem.compose(b_rem)
        add = b_add if add is None else add.compose(b_add)
    assert rem is not None and add is not None
    deltas = np.array(_REFERENCE_DELTAS)

    def worst(pair: tuple[PrivacyLossDistribution, PrivacyLossDistribution]) -> FloatArray:
        out: FloatArray = np.maximum(
            pair[0].epsilon_for_delta(deltas).upper, pair[1].epsilon_for_delta(deltas).upper
        )
        return out

    best = (rem, add)
    ours = worst(best)
    # the whole k-of-t pair, or the composition of whole 2- and 3-of-m pairs over blocks
    # (renyi.analysis.allocation_multi), where it is affordable: kept
    # where its epsilons at the reference deltas add up to less (a choice between two sound
    # bounds, made before any query)
    from renyi.analysis.allocation_multi import whole_blocks_pld

    whole = (
        whole_blocks_pld(t, sigma, k, value_discretization_interval=h, tail_mass=tm)
        if whole_pair
        else None
    )
    if whole is not None:
        theirs = worst(whole)
        if float(np.sum(theirs)) < float(np.sum(ours)):  # the smaller sum over both δs
            best, ours = whole, theirs
    gk = gauss.self_compose(k, max_bins=max_bins)
    if np.all(gk.epsilon_for_delta(deltas).upper < ours):
        return gk, gk
    return best
