"""Random ``k``-out-of-``t`` allocation (``k > 1``) analysed whole: an explicit dominating pair.

The block decomposition (:func:`renyi.analysis.allocation.allocation_blocks`, Feldman &
Shenfeld 2025) reveals a relabelling of the steps and pays for it: 4–7 % in ε over the
Monte Carlo estimate at few steps per epoch (docs/correlated.md). This module bounds the
pair of one epoch of ``k``-of-``t`` allocation itself,

    ``P = C(t,k)^(-1) Σ_{|S|=k} N(1_S, σ² I_t)``,  ``Q = N(0, σ² I_t)``,

whose likelihood ratio is ``Y = e_k(X)/C(t,k)`` (``e_k`` the ``k``-th elementary symmetric
polynomial, ``X_i = exp((o_i - 1/2)/σ²)`` the steps' ratios), by a discrete pair that
dominates it (every hockey-stick divergence, both orders, is at least the true one; the same
notion as :mod:`renyi.analysis.allocation_pld`). Each step is a proven dominance:

1. **Per-step spread.** The one-step pair ``(N(1, σ²), N(0, σ²))`` is replaced by its
   *connect-the-dots* pair on the ratios ``0 < x_1 < … < x_n`` (a mean-preserving spread of
   the ratio, Doroshenko et al. 2022; the first side's surplus above ``x_n`` revealed). One
   kernel per coordinate maps the spread pair's ``k``-of-``t`` allocation onto the true one
   (it maps the record's law and the noise's law at once, whichever steps carry the
   record), so the allocation of the spread pair dominates (as in ``allocation_pld``).
2. **Exact recursion with cells.** The outcomes of the spread pair's allocation are
   ``t``-tuples of atoms, with ratio ``e_k(x)/C(t,k)``. Adding a step of ratio ``x`` maps
   ``e_j ↦ e_j + x e_(j-1)``. The partial tuples after ``i`` steps are grouped in *cells*
   (by ``⌊log lo_j / h⌋``, ``j = 1..k``, with ``lo_j`` a lower bound of the members'
   ``e_j``); a cell carries its exact second-side mass ``Σ q``, the exact sums
   ``Σ q e_j`` and bounds ``lo_j <= e_j <= hi_j`` of all its members (the minimum and
   maximum of the members' bounds, rounded outwards). The updates are exact identities
   for the sums, so each final cell has its exact masses on both sides (the first side's
   is ``Σ q e_k / C(t,k)``), and its members' ratios lie in a known interval.
3. **Connect the dots per final cell**: the cell becomes two atoms at its interval's ends
   with the same two masses — a spread, hence a dominance. Grouping is not a coarsening:
   no information is merged, only the bookkeeping of the members.
4. **Round-off and pruning**, as in ``allocation_pld``: every computed mass carries a
   relative error bound (tracked through the recursion: products, and sums of at most
   ``g`` non-negative terms); atoms are lowered by what the error can account for; cells
   whose second-side mass and whose descendants' first-side mass are both below ``1e-16``
   are dropped; everything lost is *revealed* (second side at ratio 0, first side at
   ratio ∞), which dominates the lost part.

Looseness: the per-step spread (``points`` ratios) and the cells' widths (at most
``(t - 1) h`` in ``log e_k``). Cost: the number of cells (``k``-dimensional) times
``points`` a step; refused (``None``) above ``max_cells``. ``allocation_pld`` computes this
and the block decomposition where this is affordable (:func:`resolution`) and keeps the
tighter at its reference δs (a choice between two sound bounds). The same recursion run on
the steps' outputs *reduced* to their grid cells (a post-processing) gives a certified lower
bound (:func:`multi_allocation_lower_pair`): on the measured settings the two are 0.3–1.7 %
apart (docs/correlated.md).

Example
-------
>>> rem, add = multi_allocation_pld(5, 0.9, 2)
>>> eps = max(float(p.self_compose(2).epsilon_for_delta(1e-3).upper) for p in (rem, add))
>>> 5.64 < eps < 5.76  # certified lower bound 5.64; Monte Carlo 5.73; blocks 6.13
True
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import NDArray

from renyi._validation import check_int, check_positive, fail
from renyi.analysis.allocation import check_steps_selected
from renyi.analysis.allocation_pld import AllocationPair, _ctd_lower
from renyi.analysis.pld import PrivacyLossDistribution
from renyi.errors import RenyiError

__all__ = [
    "DEFAULT_MAX_CELLS",
    "multi_allocation_epsilon_lower_bound",
    "multi_allocation_lower_pair",
    "multi_allocation_pair",
    "multi_allocation_pld",
    "resolution",
    "step_grid",
    "whole_blocks",
    "whole_blocks_pld",
]

FloatArray = NDArray[np.float64]

DEFAULT_MAX_CELLS = 400_000
"""Cells (after grouping) above which the recursion gives up (``None``)."""

_U = 2.0**-53
_PRUNE = 1e-16  # cells lighter than this on both sides (descendants included) are revealed
_CORE = 3.0  # the uniform part of the grid: ±3 sd around both laws of log X
_FAR = 8.5  # the grid reaches 8.5 sd beyond them (first-side mass above: ~1e-17)
_TAIL_FRACTION = 0.2  # share of the points in the two geometric tails
_MAX_LOG = 600.0  # largest log e_k the recursion may meet (no overflow)
_KEY_OFFSET = 1 << 20  # cell keys are packed into one int64: 21 bits per index
_ZERO_KEY = 0  # the key of e_j = 0 exactly


_FINAL_WIDTH = 0.12  # the default h makes the final cells' width (t - 1) h about this
_MAX_STEPS = {2: 12, 3: 7}  # the default resolution costs <= ~3 CPU s up to these t


def resolution(num_steps: int, num_selected: int) -> tuple[int, float] | None:
    """The default ``(points, bin_width)`` of :func:`multi_allocation_pair` for ``k``-of-``t``
    allocation, or ``None`` where it is not affordable (``k = 1``, ``k > 3``, or ``t``
    above 12 for ``k = 2`` and 7 for ``k = 3``): then the block decomposition is used.

    >>> resolution(5, 2)
    (96, 0.03)
    """
    t, k = check_steps_selected(num_steps, num_selected)
    if k not in _MAX_STEPS or t > _MAX_STEPS[k] or t <= k:
        return None
    if k == 2:  # cells of (t - 1) h ~ 0.12 in log e_k, no narrower than 0.0133 (cost)
        return (96 if t <= 7 else 64), max(round(_FINAL_WIDTH / (t - 1), 4), 0.0133)
    return 48, 0.06 if t <= 6 else 0.05


def step_grid(noise_multiplier: float, points: int = 48) -> FloatArray:
    """The ``log`` ratios of the per-step spread pair: uniform on ``±3`` sd around the two
    laws of ``log X`` (``N(∓v/2, v)``, ``v = 1/σ²``), with geometrically growing gaps out to
    ``8.5`` sd beyond them (20 % of the points)."""
    sigma = check_positive("noise_multiplier", noise_multiplier)
    n = check_int("points", points, 8)
    v = 1.0 / (sigma * sigma)
    s = math.sqrt(v)
    a, b = -0.5 * v - _CORE * s, 0.5 * v + _CORE * s
    nt = max(int(n * _TAIL_FRACTION / 2), 1)
    core = np.linspace(a, b, n - 2 * nt)
    h = float(core[1] - core[0])
    length = (_FAR - _CORE) * s
    # gaps h g^i, i = 0..nt-1, adding up to length: solve for g by bisection
    lo, hi = 1.0, 64.0
    for _ in range(200):
        g = 0.5 * (lo + hi)
        total = h * nt if g == 1.0 else h * (g**nt - 1.0) / (g - 1.0)
        lo, hi = (lo, g) if total > length else (g, hi)
    steps = np.cumsum(h * hi ** np.arange(nt))
    out: FloatArray = np.concatenate((a - steps[::-1], core, b + steps))
    return out


def _step_pair(sigma: float, points: int) -> tuple[FloatArray, FloatArray]:
    """Ratios ``(0, x_1, …, x_n)`` of the spread one-step pair and lower bounds on their
    second-side masses (connect the dots on the cells between them; the cell above ``x_n``
    sends its second-side mass to ``x_n`` and leaves its first side's surplus out)."""
    x = np.concatenate(([0.0], np.exp(step_grid(sigma, points)), [np.inf]))
    low, up = _ctd_lower(sigma, x)
    beta = np.zeros(x.size)
    beta[:-1] += low
    beta[1:] += up
    beta *= 1.0 - 4 * _U  # the additions round
    keep = beta[:-1] > 0.0
    return x[:-1][keep], beta[:-1][keep]


def _keys(lo: FloatArray, h: float) -> NDArray[np.int64]:
    """Packed cell keys of the lower bounds ``lo`` (``k`` rows): ``⌊log lo_j / h⌋`` (0 for
    ``lo_j = 0``), 21 bits each."""
    key = np.zeros(lo.shape[1], dtype=np.int64)
    with np.errstate(divide="ignore"):
        for row in lo:
            idx = np.where(row > 0.0, np.floor(np.log(row) / h) + _KEY_OFFSET, _ZERO_KEY)
            key = (key << 21) + idx.astype(np.int64)
    return key


def multi_allocation_pair(
    num_steps: int,
    noise_multiplier: float,
    num_selected: int,
    *,
    points: int = 48,
    bin_width: float = 0.06,
    max_cells: int = DEFAULT_MAX_CELLS,
) -> AllocationPair | None:
    """A discrete pair dominating one epoch of random ``k``-out-of-``t`` allocation of the
    Gaussian with noise multiplier σ (module docstring), or ``None`` where the recursion
    would need more than ``max_cells`` cells or ``e_k`` could overflow (very small σ).

    Its :meth:`~renyi.analysis.allocation_pld.AllocationPair.pld` gives upper-bound PLDs in
    both directions, composable over epochs.
    """
    t, k = check_steps_selected(num_steps, num_selected)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    n_pts = check_int("points", points, 8)
    h = check_positive("bin_width", bin_width)
    cap = check_int("max_cells", max_cells, 1)
    if k > 3 or h > 1.0:  # 21-bit keys hold 3 indices; wider cells are pointless
        raise fail("num_selected" if k > 3 else "bin_width", k if k > 3 else h, "k <= 3, h <= 1")
    v = 1.0 / (sigma * sigma)
    if k * (0.5 * v + (_FAR + 1.0) * math.sqrt(v)) + math.lgamma(t + 1.0) > _MAX_LOG:
        return None
    x, beta = _step_pair(sigma, n_pts)
    cells = _recurse(t, k, x, beta, h, cap)
    if cells is None:
        return None
    q, p_mass, lo_k, hi_k, eta = cells
    lo_k, hi_k = lo_k * (1.0 - 1e-12), hi_k * (1.0 + 1e-12)
    return _spread_cells(q, p_mass, lo_k, hi_k, eta + 4 * _U)


def _recurse(
    t: int, k: int, x: FloatArray, beta: FloatArray, h: float, cap: int
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, float] | None:
    """The recursion of step 2 over ``t`` steps of the one-step law (ratios ``x``, second-side
    masses ``beta``): per final cell ``(q, p, lo, hi)`` — second- and first-side masses and
    bounds of the members' ratios ``e_k/C(t,k)`` — and the relative error bound of ``q``,
    ``p``; ``None`` above ``cap`` cells."""
    n = x.size
    # binomial weights C(t - i, k - j)/C(t, k): what a partial tuple's e_j can add to e_k in
    # expectation under the second side (each further step's ratio has mean <= 1)
    c_tk = float(math.comb(t, k))
    # cells after the first step: one per atom, exact
    q = beta.copy()
    s = np.zeros((k, n))  # s[j-1] = Σ q e_j over the cell's members
    s[0] = q * x
    lo = np.zeros((k, n))  # lo[j-1] <= e_j <= hi[j-1] for every member
    lo[0] = x
    hi = lo.copy()
    eta = 2.0 * _U  # relative error bound of q and s
    down, up = 1.0 - 4 * _U, 1.0 + 4 * _U  # keep the computed bounds on their side
    for i in range(1, t):
        rows = q.size
        per = max(1, 4_000_000 // n)
        parts: list[tuple[FloatArray, FloatArray, FloatArray, FloatArray]] = []
        # the descendants' expected e_k under the second side: Σ_j e_j C(t-i-1, k-j)/C(t,k)
        w = np.array([math.comb(t - i - 1, k - j - 1) for j in range(k)]) / c_tk
        w0 = math.comb(t - i - 1, k) / c_tk
        for a in range(0, rows, per):
            b = min(rows, a + per)
            qn = (q[a:b, None] * beta[None, :]).ravel()
            sn = np.empty((k, qn.size))
            ln = np.empty((k, qn.size))
            hn = np.empty((k, qn.size))
            prev_s, prev_l, prev_h = q[a:b, None], np.ones((b - a, 1)), np.ones((b - a, 1))
            for j in range(k):
                sn[j] = ((s[j, a:b, None] + x[None, :] * prev_s) * beta[None, :]).ravel()
                ln[j] = ((lo[j, a:b, None] + x[None, :] * prev_l) * down).ravel()
                hn[j] = ((hi[j, a:b, None] + x[None, :] * prev_h) * up).ravel()
                prev_s, prev_l, prev_h = s[j, a:b, None], lo[j, a:b, None], hi[j, a:b, None]
            # prune: second-side mass and the descendants' first-side mass both negligible
            keep = np.maximum(qn, w0 * qn + w @ sn) >= _PRUNE
            parts.append((qn[keep], sn[:, keep], ln[:, keep], hn[:, keep]))
        qn = np.concatenate([p[0] for p in parts])
        sn, ln, hn = (np.concatenate([p[m] for p in parts], axis=1) for m in (1, 2, 3))
        key = _keys(ln, h)
        order = np.argsort(key, kind="stable")
        key = key[order]
        starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        if starts.size > cap:
            return None
        q = np.add.reduceat(qn[order], starts)
        s = np.add.reduceat(sn[:, order], starts, axis=1)
        lo = np.minimum.reduceat(ln[:, order], starts, axis=1)
        hi = np.maximum.reduceat(hn[:, order], starts, axis=1)
        # q·β (1 rounding), s update (3), a sum of <= the largest cell's count of terms
        largest = int(np.diff(np.append(starts, key.size)).max())
        eta += (4.0 + largest) * _U
    c_tk = float(math.comb(t, k))
    return q, s[k - 1] / c_tk, lo[k - 1] / c_tk, hi[k - 1] / c_tk, eta + 2 * _U


def _spread_cells(
    q: FloatArray, p: FloatArray, lo: FloatArray, hi: FloatArray, eta: float
) -> AllocationPair:
    """Connect the dots per cell (second-side mass ``q``, first-side ``p``, members' ratios
    in ``[lo, hi]``; both masses known to a relative ``eta``): lower bounds on the exact
    two atoms; what they miss is revealed."""
    # the cells' invariant lo q <= p <= hi q (exact); a violation beyond round-off is a bug
    if np.any(p > hi * q * (1.0 + 1e-6) + 1e-300) or np.any(p < lo * q * (1.0 - 1e-6)):
        raise RenyiError("allocation_multi: a cell's ratio left its interval (internal error)")
    hi = np.maximum(hi, lo * (1.0 + 1e-3))  # keep W/hi >= 1e-3: the correction stays small
    hi = np.where(hi > 0.0, hi, 1e-300)
    w = hi - lo
    # exact: w_b = (p - lo q)/w, w_a = (hi q - p)/w; |p̂ - p| <= eta p, |q̂ - q| <= eta q
    corr = (3.0 * eta + 8 * _U) * hi * q / w
    wb = np.maximum((p - lo * q) / w - corr, 0.0)
    wa = np.maximum((hi * q - p) / w - corr, 0.0)
    ratios = np.concatenate((lo, hi))
    mass = np.concatenate((wa, wb)) * (1.0 - 8 * _U)
    ok = mass > 0.0
    ratios, mass = ratios[ok], mass[ok]
    zero = max(1.0 - math.fsum(mass.tolist()), 0.0)
    inf = max(1.0 - math.fsum((mass * ratios).tolist()), 0.0)
    return AllocationPair(ratios, mass, zero, inf)


def multi_allocation_pld(
    num_steps: int,
    noise_multiplier: float,
    num_selected: int,
    *,
    value_discretization_interval: float = 1e-4,
    tail_mass: float = 1e-15,
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution] | None:
    """Upper-bound PLDs ``(remove, add)`` of one epoch of ``k``-of-``t`` allocation from
    :func:`multi_allocation_pair` at the default :func:`resolution`, or ``None`` where that
    is not affordable. Cached (the same epoch is priced by every accountant query)."""
    t, k = check_steps_selected(num_steps, num_selected)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    h = check_positive("value_discretization_interval", value_discretization_interval)
    tm = check_positive("tail_mass", tail_mass)
    return _cached_pld(t, k, sigma, h, tm)


@functools.lru_cache(maxsize=16)
def _cached_pld(
    t: int, k: int, sigma: float, h: float, tm: float
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution] | None:
    res = resolution(t, k)
    if res is None:
        return None
    pair = multi_allocation_pair(t, sigma, k, points=res[0], bin_width=res[1])
    if pair is None:
        return None
    rem = pair.pld("remove", value_discretization_interval=h, tail_mass=tm)
    add = pair.pld("add", value_discretization_interval=h, tail_mass=tm)
    return rem, add


def multi_allocation_lower_pair(
    num_steps: int,
    noise_multiplier: float,
    num_selected: int,
    *,
    points: int = 48,
    bin_width: float = 0.06,
    max_cells: int = DEFAULT_MAX_CELLS,
) -> tuple[FloatArray, FloatArray, float, float] | None:
    """``(p, q, err_p, err_q)``: the laws under ``P`` and ``Q`` of a *statistic* of one epoch
    of ``k``-of-``t`` allocation and bounds on the L1 errors of the computed vectors — the
    counterpart of :func:`multi_allocation_pair` for a certified **lower** bound.

    The statistic: each step's output is reduced to its cell of the ratio grid
    (:func:`step_grid`; the masses of a cell under both laws, from the normal CDF with an L1
    error bound), the reduced steps run through the same recursion, and the final cell is
    released (one more outcome merges the pruned cells). Every stage is a function of the
    outputs, so the pair's divergences are at most the mechanism's; the recursion's sums are
    exact up to the tracked round-off. ``None`` where the recursion is refused."""
    from renyi.analysis.allocation_lower import _normal_cells

    t, k = check_steps_selected(num_steps, num_selected)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    n_pts = check_int("points", points, 8)
    h = check_positive("bin_width", bin_width)
    cap = check_int("max_cells", max_cells, 1)
    if k > 3 or h > 1.0:
        raise fail("num_selected" if k > 3 else "bin_width", k if k > 3 else h, "k <= 3, h <= 1")
    v = 1.0 / (sigma * sigma)
    if k * (0.5 * v + (_FAR + 1.0) * math.sqrt(v)) + math.lgamma(t + 1.0) > _MAX_LOG:
        return None
    s = math.sqrt(v)
    lx = np.concatenate(([-np.inf], step_grid(sigma, n_pts), [np.inf]))
    q1, eq1 = _normal_cells((lx + 0.5 * v) / s)
    p1, ep1 = _normal_cells((lx - 0.5 * v) / s)
    keep = q1 > 0.0  # a cell with no second-side mass: its first side goes to the error
    err1 = eq1 + ep1 + math.fsum(p1[~keep].tolist())
    x = p1[keep] / q1[keep]  # the cell's ratio; q x = p up to one rounding
    err1 += 2 * _U
    cells = _recurse(t, k, x, q1[keep], h, cap)
    if cells is None:
        return None
    q, p, _, _, eta = cells
    rest_q = max(1.0 - math.fsum(q.tolist()), 0.0)
    rest_p = max(1.0 - math.fsum(p.tolist()), 0.0)
    # the product of t step laws each within err1 in L1: within t err1; the recursion's
    # round-off: eta of each; the merged outcome absorbs both (twice)
    err = 2.0 * (t * err1 + 2.0 * eta) + 1e-15
    return np.append(p, rest_p), np.append(q, rest_q), err, err


def multi_allocation_epsilon_lower_bound(
    num_steps: int,
    noise_multiplier: float,
    delta: float,
    num_selected: int,
    *,
    epochs: int = 1,
    direction: str = "both",
    value_discretization_interval: float = 1e-4,
) -> float | None:
    """A certified lower bound on ε(δ) of ``epochs`` epochs of ``k``-of-``t`` allocation from
    :func:`multi_allocation_lower_pair` at the default :func:`resolution` (``None`` where
    that does not apply). ``direction``: ``"remove"``, ``"add"`` or ``"both"`` (the larger).

    >>> lo = multi_allocation_epsilon_lower_bound(5, 0.9, 1e-3, 2, epochs=2)
    >>> 5.64 < lo < 5.76  # the upper bound of the same epochs: 5.752
    True
    """
    from renyi.analysis.allocation_lower import _lower_bound_args, _lower_epsilon

    t, k, sigma, d, e, directions, vdi = _lower_bound_args(
        num_steps,
        noise_multiplier,
        delta,
        num_selected,
        epochs,
        direction,
        value_discretization_interval,
    )
    res = resolution(t, k)
    if res is None:
        return None
    pair = _cached_lower_pair(t, k, sigma, res[0], res[1])
    if pair is None:
        return None
    p, q, ep, eq = pair
    best = 0.0
    for dr in directions:
        a, b, ea, eb = (p, q, ep, eq) if dr == "remove" else (q, p, eq, ep)
        best = max(best, _lower_epsilon(a, b, ea, eb, d, e, vdi))
    return best


@functools.lru_cache(maxsize=16)
def _cached_lower_pair(
    t: int, k: int, sigma: float, points: int, h: float
) -> tuple[FloatArray, FloatArray, float, float] | None:
    return multi_allocation_lower_pair(t, sigma, k, points=points, bin_width=h)


def whole_blocks(num_steps: int, num_selected: int) -> tuple[tuple[int, int], ...] | None:
    """``((k_b, m_b), ...)``: blocks of ``m_b`` steps holding ``k_b`` of the record's ``k``
    steps each, whose whole ``k_b``-of-``m_b`` pairs are affordable (:func:`resolution`), or
    ``None``. ``k <= 3``: the epoch itself; ``k >= 4``: blocks of ``k_b = 2`` (and one of 3
    for odd ``k``) with sizes in proportion. Uniform ``k_b``-subsets of the blocks, randomly
    relabelled, are a uniform ``k``-subset, and revealing the relabelling can only help the
    adversary: the epoch is dominated by the composition of the blocks' pairs (the
    decomposition of :func:`renyi.analysis.allocation.allocation_blocks` with fewer, larger
    blocks).

    >>> whole_blocks(5, 2), whole_blocks(12, 4), whole_blocks(13, 5), whole_blocks(60, 4)
    (((2, 5),), ((2, 6), (2, 6)), ((2, 6), (3, 7)), None)
    """
    t, k = check_steps_selected(num_steps, num_selected)
    if k <= 3:
        return ((k, t),) if resolution(t, k) is not None else None
    parts = [2] * (k // 2)
    if k % 2:
        parts[-1] = 3
    sizes = [t * kb // k for kb in parts]
    for i in range(t - sum(sizes)):  # the remainder, one step each from the first block on
        sizes[i % len(sizes)] += 1
    blocks = tuple(zip(parts, sizes, strict=True))
    if any(resolution(m, kb) is None for kb, m in blocks):
        return None
    return blocks


def whole_blocks_pld(
    num_steps: int,
    noise_multiplier: float,
    num_selected: int,
    *,
    value_discretization_interval: float = 1e-4,
    tail_mass: float = 1e-15,
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution] | None:
    """Upper-bound PLDs ``(remove, add)`` of one epoch of ``k``-of-``t`` allocation: the
    composition of the whole pairs over :func:`whole_blocks` (``None`` where those are not
    affordable)."""
    t, k = check_steps_selected(num_steps, num_selected)
    blocks = whole_blocks(t, k)
    if blocks is None:
        return None
    rem: PrivacyLossDistribution | None = None
    add: PrivacyLossDistribution | None = None
    for kb, m in blocks:
        pair = multi_allocation_pld(
            m,
            noise_multiplier,
            kb,
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
        )
        if pair is None:
            return None
        rem = pair[0] if rem is None else rem.compose(pair[0])
        add = pair[1] if add is None else add.compose(pair[1])
    assert rem is not None and add is not None
    return rem, add
