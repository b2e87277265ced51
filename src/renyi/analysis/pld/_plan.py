"""How to compute a long self-composition within a bounded FFT window."""

from __future__ import annotations

import math

import numpy as np

from renyi.analysis.pld import _numerics as _num
from renyi.analysis.pld._numerics import _COARSEN_GUARD, _S_ALL, _Plan
from renyi.analysis.pld._side import _Side


def _plan(step: _Side, count: int, tail_mass: float, max_bins: int) -> _Plan:
    """Choose how to compute ``step^count`` with FFT windows of at most ``max_bins`` points.

    Window widths are predicted by Chernoff bounds on the step's exact MGF. If the whole
    composition fits, it is one FFT power on the step's grid. Otherwise the largest count
    ``t0_max`` that fits is found, the rest of the count is covered by ``k`` levels of base
    ``m <= 16`` (``m^k >= count / t0_max``, so ``t0 = count // m^k`` fits), and every level
    coarsens by the smallest power of two that keeps its window within ``max_bins / 4``
    (a few thousand points per standard deviation of the composed loss). Coarsening late
    is cheap in accuracy: the discretisation error of a grid ``H`` grows like
    ``count * H^2``, and the direct power has already composed ``t0`` steps on the fine
    grid. The direct power may always use ``2 * step.size`` points (coarsening before the
    first composition would cost accuracy for nothing). A truncation at stage ``j`` is
    repeated by the ``m^(k-j)`` copies composed after it, so the stage budgets shrink
    accordingly and sum to at most ``tail_mass``.
    """
    cap = min(max_bins, _num._MAX_BINS)
    direct_cap = max(cap, min(2 * step.size, _num._MAX_BINS))
    level_cap = max(cap // 4, 256)
    lm = step.mgf_table
    h = step.h
    nat_lo, nat_hi = step.offset * h, (step.offset + step.size - 1) * h
    up, dn = _S_ALL > 0, _S_ALL < 0

    def width(c: int, tau: float) -> float:
        lt = math.log(tau)
        with np.errstate(invalid="ignore", divide="ignore"):
            hi = float(np.min((c * lm[up] - lt) / _S_ALL[up], initial=np.inf))
            lo = float(np.max((c * lm[dn] - lt) / _S_ALL[dn], initial=-np.inf))
        return (min(hi, c * nat_hi) - max(lo, c * nat_lo)) / h + 1.0

    if count <= 1 or width(count, tail_mass) <= direct_cap:
        return _Plan(count, count, 1, (), (tail_mass,), tail_mass)
    small_tau = tail_mass / (2 * count)

    def largest_fitting(limit: float) -> int:  # bisection: widths grow with the count
        lo_c, hi_c = 1, count
        while hi_c - lo_c > 1:
            mid = (lo_c + hi_c) // 2
            lo_c, hi_c = (mid, hi_c) if width(mid, small_tau) <= limit else (lo_c, mid)
        return lo_c

    def levels_for(t0_max: int) -> int:
        return max(1, math.ceil(math.log(count / t0_max) / math.log(16.0) - 1e-12))

    t0_max = largest_fitting(direct_cap)
    # Coarsening the grid G-fold at a level whose inputs hold c steps each adds about
    # G^2 / c times the fine grid's discretisation error (per level, k levels): allowed only
    # while G^2 <= c / (_COARSEN_GUARD k). Below that the direct power goes on (up to the
    # hard window limit) rather than coarsen too early.
    c_min = 4 * _COARSEN_GUARD * levels_for(t0_max)
    if t0_max < c_min:
        t0_max = max(t0_max, min(c_min, largest_fitting(_num._MAX_BINS)))
        if t0_max >= count:
            return _Plan(count, count, 1, (), (tail_mass,), tail_mass)
    k = levels_for(t0_max)
    ratio = count / t0_max
    m = max(2, math.ceil(ratio ** (1.0 / k) - 1e-12))
    while m**k * t0_max < count:  # guard against rounding
        m += 1
    # count = t0 m^k + (base-m digits) needs t0 >= 1, i.e. m^k <= count: with a tiny t0_max
    # (wide steps) the m above may overshoot (t0 = 0 would compose m^k + rest > count steps)
    while count // m**k == 0:
        if m > 2:
            m -= 1
        else:
            k -= 1
    if k == 0:
        return _Plan(count, count, 1, (), (tail_mass,), tail_mass)
    unit = tail_mass / (2 * (k + 1))
    taus = tuple(unit / m ** (k - j) for j in range(k + 1))
    extra_tau = unit / (2 * m**k)
    t0 = count // m**k
    rest = count - t0 * m**k
    digits = [(rest // m ** (k - 1 - j)) % m for j in range(k)]
    levels = []
    c, grid = t0, 1
    for j, d in enumerate(digits, start=1):
        g_max = max(grid, 1 << math.floor(0.5 * math.log2(max(c / (_COARSEN_GUARD * k), 1.0))))
        w = width(m * c + d, taus[j]) / grid
        f = 1
        while w / f > level_cap and grid * f * 2 <= g_max:
            f *= 2
        levels.append((d, f))
        grid *= f
        c = m * c + d
    # leading levels that do not coarsen are cheaper as part of the direct power
    while levels and levels[0][1] == 1 and width(m * t0 + levels[0][0], taus[0]) <= _num._MAX_BINS:
        t0 = m * t0 + levels[0][0]
        levels.pop(0)
        taus = taus[:1] + taus[2:]  # the direct stage keeps the smallest budget
    if not levels:
        return _Plan(count, count, 1, (), (tail_mass,), tail_mass)
    return _Plan(count, t0, m, tuple(levels), taus, extra_tau)
