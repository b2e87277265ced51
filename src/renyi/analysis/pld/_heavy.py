"""Self-compositions of heavy-tailed steps: the binomial split at a loss ``c``.

A Poisson-subsampled Gaussian at a tiny rate (``q T`` of order 1) has a step loss that is
almost always within ``O(q)`` of 0 and, rarely, up to several nats: a log-normal tail. No
exponential tilt localises such a composition (the moment generating function explodes
beyond order ~30), so the FFT's round-off, relative to the total mass, used to set the upper
bound at small delta (issue 30: epsilon(1.2e-11) = 0.0356 where the truth is 0.0157, a floor
of delta(eps) near 2e-15).

The fix is exact algebra. Split the step's finite masses at the grid index of a loss ``c``:
``p = a + b`` with ``a`` the losses below ``c`` and ``b`` the rest (mass ``m_b``). Then

    p^{*T} = a^{*T} + T a^{*(T-1)} * b + R,    R = sum_{k >= 2} C(T, k) a^{*(T-k)} * b^{*k},

and ``R`` is a non-negative measure of mass at most ``C(T, 2) m_b^2 (m_a + m_b)^(T-2)``
(since ``C(T, k) <= C(T, 2) C(T-2, k-2)``). ``c`` is the smallest loss whose tail mass makes
that bound at most a quarter of ``tail_mass``. The pessimistic side moves ``R`` to ``+inf``
(delta only grows), the optimistic side drops it (delta only shrinks). ``a`` has a short
support, so ``a^{*T}`` is computed with tilts that work; the one-big-step term is an FFT
product whose error is relative to its own (tiny) mass ``T m_b``. Every other piece is the
existing machinery (:meth:`_Side.self_compose`, :meth:`_Side.compose`) with its tracked
errors, so the result is as rigorous as the plain composition.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from renyi.analysis.pld._fft import _composed_inf, _ErrTerm, _merge, _term
from renyi.analysis.pld._numerics import _DELTA_REFS, _S_GRID, _U, Tilt, _sum_up
from renyi.analysis.pld._plan import _plan
from renyi.analysis.pld._side import _regrid, _Side, _trim

# split only where the tail beyond c holds a real part of the grid (a heavy tail): otherwise
# the plain composition is as tight and cheaper
_MAX_KEPT_FRACTION = 0.9
_MERGE_LIMIT = 12  # error terms each part keeps (see _fft._merge)


def _split_index(side: _Side, count: int, tail_mass: float) -> int | None:
    """Grid index where ``b`` starts (``None``: no useful split). ``C(T, 2) m_b^2 F^(T-2)``,
    with ``F`` the total finite mass, is at most ``tail_mass / 4`` for the returned index."""
    if count < 2 or side.errors or side.size < 4:
        return None
    p = side.probs
    top = np.cumsum(p[::-1])[::-1] * (1.0 + (p.size + 2) * _U)  # upper bounds
    log_f = math.log(max(side.finite_mass, _sum_up(p), 1e-300))
    log_pairs = math.log(count) + math.log(count - 1) - math.log(2.0)
    log_lim = 0.5 * (math.log(tail_mass / 4.0) - log_pairs - (count - 2) * max(log_f, 0.0))
    with np.errstate(divide="ignore"):
        ok = np.log(top) <= log_lim
    k = int(np.argmax(ok)) if ok.any() else p.size
    if k < 1 or k >= _MAX_KEPT_FRACTION * p.size:
        return None
    return k


def _scaled(terms: tuple[_ErrTerm, ...], factor: float) -> list[_ErrTerm]:
    lw = math.log(factor)
    return [_term(t.lams, [w + lw for w in t.log_ws], t.lo, t.hi) for t in terms]


def _mix(parts: list[tuple[_Side, float]], extra_inf: float) -> _Side:
    """``sum_i w_i S_i`` on the coarsest grid of the parts (each regridded conservatively for
    its direction), plus ``extra_inf`` at ``+inf``: masses, error bounds and totals add."""
    h = max(s.h for s, _ in parts)
    sides = [(_regrid(s, h), w) for s, w in parts]
    lo = min(s.offset for s, _ in sides)
    hi = max(s.offset + s.size for s, _ in sides)
    probs = np.zeros(hi - lo)
    errs: list[_ErrTerm] = []
    for s, w in sides:
        probs[s.offset - lo : s.offset - lo + s.size] += w * s.probs
        errs += _scaled(s.errors, w)
    first = sides[0][0]
    return _trim(
        _Side(
            first.pessimistic,
            h,
            lo,
            probs,
            math.fsum(w * s.finite_mass for s, w in sides),
            math.fsum(w * s.inf_mass for s, w in sides) + extra_inf,
            # not fused into one term: a term re-expressed across the other part's range
            # (the one-large-step part reaches several nats) would lose its tilt
            _merge(errs, limit=2 * _MERGE_LIMIT),
            (min(s.support[0] for s, _ in sides), max(s.support[1] for s, _ in sides)),
            max(s.hoeffding_var for s, _ in sides),
            max(s.shift for s, _ in sides),
            max(s.fft_len for s, _ in sides),
        )
    )


def _split_self_compose(
    side: _Side,
    count: int,
    tail_mass: float,
    tilt: Tilt,
    ext: bool,
    max_bins: int,
) -> _Side | None:
    """``side`` composed ``count`` times through the binomial split (module docstring), or
    ``None`` where no useful split exists (light tails, composed inputs, ``count < 2``).

    Tail budget: ``tail_mass / 4`` each for ``a^{*T}``, ``a^{*(T-1)}`` and the remainder
    ``R``; ``tail_mass / 8`` for the top of ``b`` cut off and ``tail_mass / (8 T)`` for the
    product with ``b`` (scaled by ``T``).
    """
    k = _split_index(side, count, tail_mass)
    if k is None:
        return None
    p = side.probs
    c = (side.offset + k) * side.h
    # the top of the tail, where T times its mass is below tail_mass / 8, is cut off b (to
    # +inf on the pessimistic side: at most T m_cut F^(T-1) of paths visit it; dropped on
    # the optimistic side): b then spans the losses that matter, not the step's whole range
    top = np.cumsum(p[::-1])[::-1] * (1.0 + (p.size + 2) * _U)
    cut = k + int(np.searchsorted(-top[k:], -tail_mass / (8.0 * count), side="right"))
    cut = min(max(cut, k + 1), p.size)
    m_a, m_b = _sum_up(p[:k]), _sum_up(p[k:cut])
    m_cut = float(top[cut]) if cut < p.size else 0.0
    a = _trim(replace(side, probs=p[:k].copy(), finite_mass=m_a, inf_mass=0.0))
    a = replace(a, support=(side.support[0], c))
    b = _trim(replace(side, offset=side.offset + k, probs=p[k:cut].copy(), finite_mass=m_b))
    b = replace(b, inf_mass=0.0, support=(c - side.h, side.support[1]))
    quarter = tail_mass / 4.0
    lam = tilt if tilt is not None else _large_tilt(a, count)  # None: the default choice
    # a^{*T} by its own plan (not a^{*(T-1)} * a, whose truncation would be charged the
    # untilted round-off above the cut), a^{*(T-1)} for the one-large-step term
    all_small = a.self_compose(_plan(a, count, quarter, max_bins), quarter, lam, ext)
    a_rest = a.self_compose(_plan(a, count - 1, quarter, max_bins), quarter, lam, ext)
    # its error is relative to its own small mass: the default tilts do
    one_big = a_rest.compose(b, tail_mass / (8.0 * count), tilt, ext)
    # the step's own +inf mass, composed: (F + I)^T - F^T
    inf = _composed_inf([(side.finite_mass, side.inf_mass, count)], side.pessimistic)
    if side.pessimistic:  # R to +inf: C(T, 2) m_b^2 (m_a + m_b)^(T-2), rounded up
        log_r = (
            math.log(count)
            + math.log(count - 1)
            - math.log(2.0)
            + 2.0 * math.log(max(m_b, 1e-300))
            + (count - 2) * math.log(m_a + m_b)
        )
        inf += math.exp(min(log_r, 0.0)) * (1.0 + 1e-9)
        if m_cut > 0.0:
            log_f = (count - 1) * max(math.log(max(side.finite_mass, _sum_up(p))), 0.0)
            inf += count * m_cut * math.exp(min(log_f, 700.0)) * (1.0 + 1e-9)
    return _mix([(all_small, 1.0), (one_big, float(count))], inf)


def _large_tilt(a: _Side, count: int) -> tuple[float, ...] | None:
    """Tilts beyond the default grid (up to 3000) for ``a^{*T}``: the Chernoff-optimal order
    for delta = 1e-12 and a ladder below it (factors of 3, down to 100), so that every loss
    between the default tilt's window and that order's has a run whose window holds it
    (the Chernoff order of a spiky short step can place its window well above the epsilon
    of small deltas); ``None`` (the default choice) where that order is within the grid.

    Only a step with a short support (the small-loss part of a split, or a step bounded above
    such as the add direction at a tiny rate) has such an order, and there it is needed:
    q T = 0.003, sigma = 1.47 puts epsilon(5e-15) near 4e-4, whose Chernoff order is ~1e5.
    """
    lams = np.geomspace(1e-3, 1e7, 81)
    lm = a.log_mgf(lams)
    with np.errstate(invalid="ignore", over="ignore"):
        eps = (count * lm - math.log(_DELTA_REFS[0])) / lams
    eps = np.where(np.isfinite(eps), eps, np.inf)
    best = float(lams[int(np.argmin(eps))])
    if best <= float(_S_GRID[-1]):
        return None
    ladder = [best]
    while ladder[-1] / 3.0 >= 100.0 and len(ladder) < 8:
        ladder.append(ladder[-1] / 3.0)
    return tuple(sorted(ladder))
