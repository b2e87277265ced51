"""Rigorous FFT composition: tracked error terms, tilted transforms and powers."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from renyi.analysis.pld._numerics import (
    _DELTA_REFS,
    _FFT_C,
    _S_GRID,
    _SMALL_POWER,
    _U,
    FloatArray,
    Tilt,
    _lse,
)

# ---------------------------------------------------------------------------------------
# error terms: bounds on sum_i |e_i| exp(lam L_i) for an error vector e supported in [lo, hi]


@dataclass(frozen=True)
class _ErrTerm:
    """A bound on one error vector ``e`` supported on losses in ``[lo, hi]``.

    For each alternative ``(lam, log_w)``: ``sum_i |e_i| exp(lam L_i) <= exp(log_w)``,
    ``lam >= 0``. Any alternative is valid; the tightest is used.
    """

    lams: tuple[float, ...]
    log_ws: tuple[float, ...]
    lo: float
    hi: float

    def at(self, lam: float) -> float:
        """The bound re-expressed for weight ``exp(lam L)`` (rigorous through the range)."""
        best = np.inf
        for lt, lw in zip(self.lams, self.log_ws, strict=True):
            d = lam - lt
            ref = self.hi if d > 0 else self.lo
            best = min(best, lw + d * ref if d != 0 else lw)
        return float(best)

    def delta_error(self, eps: FloatArray) -> FloatArray:
        """Bound on the change of ``delta(eps)`` this error can cause (only ``L > eps`` count)."""
        x = np.maximum(np.minimum(eps, self.hi), self.lo)
        with np.errstate(over="ignore"):
            if len(self.lams) == 1:
                best = np.exp(self.log_ws[0] - self.lams[0] * x)
            else:
                lams, log_ws = self.arrays
                best = np.exp(np.min(log_ws[:, None] - lams[:, None] * np.ravel(x), axis=0))
        return np.where(eps >= self.hi, 0.0, np.reshape(best, np.shape(eps)))

    @cached_property
    def arrays(self) -> tuple[FloatArray, FloatArray]:
        return np.asarray(self.lams, dtype=np.float64), np.asarray(self.log_ws, dtype=np.float64)


def _term(
    lams: Sequence[float] | FloatArray, log_ws: Sequence[float] | FloatArray, lo: float, hi: float
) -> _ErrTerm:
    return _ErrTerm(tuple(float(v) for v in lams), tuple(float(v) for v in log_ws), lo, hi)


def _merge(terms: Sequence[_ErrTerm], limit: int = 12) -> tuple[_ErrTerm, ...]:
    """Drop empty terms; if there are too many, fuse them into one (summing the bounds)."""
    terms = [t for t in terms if np.any(np.asarray(t.log_ws) > -np.inf)]
    if len(terms) <= limit:
        return tuple(terms)
    lams = sorted({lt for t in terms for lt in t.lams})
    lo, hi = min(t.lo for t in terms), max(t.hi for t in terms)
    log_ws = [_lse([t.at(lam) for t in terms]) for lam in lams]
    return (_term(lams, log_ws, lo, hi),)


def _fft_level_error(n: int, u: float = _U) -> float:
    """Per-coefficient absolute error of an FFT of length ``n`` per unit of input L1 norm.

    An a-priori model: every output of a length-``n`` FFT passes through about ``log2 n``
    butterfly levels, each adding a relative error of a few units of round-off to partial
    sums bounded by the input's L1 norm (cf. Higham, *Accuracy and Stability of Numerical
    Algorithms*, 2nd ed., Sec. 24.1); ``_FFT_C`` leaves a generous margin.
    """
    return _FFT_C * u * (math.log2(max(n, 2)) + 1.0)


def _rfft_weights(n_fft: int, size: int) -> FloatArray:
    """Multiplicity of each rfft bin in the full spectrum."""
    w = np.full(size, 2.0)
    w[0] = 1.0
    if n_fft % 2 == 0:
        w[-1] = 1.0
    return w


def _spectral_error(err: Any, w: Any, n_fft: int, g: float) -> float:
    """Bound on the L1 norm of the error of ``irfft(w, n_fft)`` given per-coefficient error
    bounds ``err`` of the half spectrum ``w``.

    Both parts go through 2-norms, ``||x||_1 <= sqrt(n) ||x||_2``, and Parseval,
    ``||irfft(X)||_2 = ||X||_2 / sqrt(n)`` over the full (Hermitian) spectrum: the spectral
    error contributes ``||E||_2``, a factor up to ``sqrt(n)`` below its L1 norm; the inverse
    FFT's own round-off, ``g`` relative to the output's 2-norm (the normwise form of the
    per-level model of :func:`_fft_level_error`: a radix-``r`` stage whose outputs err by
    ``<= (r + 3) u`` times the L1 norm of their ``r`` inputs (``r - 1`` additions, one
    twiddle product) errs by ``<= (r + 3) sqrt(r) u`` relative in 2-norm, at most
    ``8 u log2(r)`` for the radices 2..5 of the transform lengths used; later stages scale
    the 2-norm of an error and of the result alike), contributes ``g ||w||_2``.
    """
    wts = _rfft_weights(n_fft, w.size)
    e2 = float(np.sum(wts * np.square(np.asarray(err, dtype=np.float64))))
    w2 = float(np.sum(wts * np.square(np.abs(w).astype(np.float64))))
    return (math.sqrt(e2) + g * math.sqrt(w2)) * (1.0 + 1e-6) + 1e-250


def _tilts(log_mgf_pos: FloatArray, count: int, tilt: Tilt) -> list[float]:
    """Exponential tilts used for one composition: 0 plus the Chernoff-optimal orders for a
    spread of reference deltas (so the round-off is relative wherever delta is evaluated);
    0 plus the given tilt(s) if any."""
    if isinstance(tilt, tuple):
        return sorted({0.0, *(float(t) for t in tilt)})
    if tilt is not None:
        return sorted({0.0, float(tilt)})
    lams = {0.0}
    for ref in _DELTA_REFS:
        with np.errstate(invalid="ignore"):
            eps = (count * log_mgf_pos - math.log(ref)) / _S_GRID
        eps = np.where(np.isfinite(eps), eps, np.inf)
        lams.add(float(_S_GRID[int(np.argmin(eps))]))
    return sorted(lams)


class _Run(NamedTuple):
    """One tilted FFT result for :func:`_stitch`: untilted masses ``r * exp(log_z - lam L)``.

    Errors, in the tilted L1 norm ``sum_i |e_i| exp(lam L_i - log_z)``: ``err`` bounds the
    part spread over the whole output (FFT round-off, propagated input errors); ``alias(i0,
    i1)`` the mass wrapped cyclically into output bins ``[i0, i1)`` (``None``: no wrap);
    untilting entry ``i`` adds a relative error ``<= 4 u (c0 + lam |L_i| + |log r_i|)``, local
    to it (the exponent's round-off, the final rounding to float64).
    """

    lam: float
    log_z: float
    err: float
    r: Any
    c0: float
    alias: Callable[[int, int], float] | None = None


def _stitch(
    runs: Sequence[_Run], out_losses: FloatArray, log_cap: float
) -> tuple[FloatArray, list[_ErrTerm]]:
    """Combine results computed under several tilts, bin by bin.

    Each bin takes the run whose error scale ``e_j exp(log_z - lam L)`` is smallest there;
    the error of the stitched vector is the sum of the runs' errors restricted to their
    bins, one term per contiguous piece a run owns, each bounded on its own (narrow) range
    with the aliased mass and untilting error of that piece only.
    """
    # Runs come sorted by tilt and the first covers the whole window. The score of run j is
    # linear in L with slope -lam_j, so a later (larger-tilt) run wins on an interval: from
    # where it beats the current best at its window's left end onwards, within its window.
    n = out_losses.size
    owner = np.zeros(n, dtype=np.int64)
    top = float(np.max(np.abs(out_losses))) if n else 0.0

    def spread(run: _Run) -> float:  # err + untilting error bound over the whole window
        mass = float(np.nansum(np.abs(run.r)))
        return run.err + 4.0 * _U * (run.c0 + run.lam * top) * mass

    def alias(run: _Run, i0: int, i1: int) -> float:
        return 0.0 if run.alias is None else run.alias(i0, i1)

    base = [spread(run) for run in runs]
    full = [b + alias(run, 0, n) for b, run in zip(base, runs, strict=True)]
    a_of = np.log(np.maximum(full, 1e-300)) + np.array([run.log_z for run in runs])
    lam_of = np.array([run.lam for run in runs])
    for j in range(1, len(runs)):  # a handful of tilts
        run = runs[j]
        lam, r = run.lam, run.r
        valid = np.flatnonzero(~np.isnan(r))
        if valid.size == 0:
            continue
        lo_i, hi_i = int(valid[0]), int(valid[-1]) + 1
        seg = slice(lo_i, hi_i)
        cur = owner[seg]
        ls = out_losses[seg]
        k = int(cur[0])
        if np.all(cur == k) and lam > lam_of[k]:  # one rival: the switch is a threshold in L
            # the wrapped mass a piece receives shrinks as the piece starts higher: find the
            # threshold without it, then again with the alias of the piece from there on
            a_j = math.log(max(base[j], 1e-300)) + run.log_z
            cut = (a_j - a_of[k]) / (lam - lam_of[k])
            start = lo_i + int(np.searchsorted(ls, cut, side="right"))
            a_j = math.log(max(base[j] + alias(run, start, hi_i), 1e-300)) + run.log_z
            cut = (a_j - a_of[k]) / (lam - lam_of[k])
            start = lo_i + int(np.searchsorted(ls, cut, side="right"))
            owner[start:hi_i] = j
        else:  # several rivals: compare with the mass each would alias onto this segment
            # (not onto the whole window, which can be far larger for a steep tilt); the
            # choice only decides which run's values are kept, each piece's error is bounded
            # below with its own aliased mass
            a_seg = a_of.copy()
            for i in {j, *np.unique(cur).tolist()}:
                local = base[i] + alias(runs[i], lo_i, hi_i)
                a_seg[i] = math.log(max(local, 1e-300)) + runs[i].log_z
            better = a_seg[j] - lam * ls < a_seg[cur] - lam_of[cur] * ls
            owner[seg] = np.where(better, j, cur)
    probs = np.zeros(n)
    terms: list[_ErrTerm] = []
    # one error term per contiguous piece a run owns (each bounded on its own narrow range)
    cuts = np.flatnonzero(np.diff(owner)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    for i0, i1 in zip(starts.tolist(), ends.tolist(), strict=True):
        run = runs[int(owner[i0])]
        lam, lz, r = run.lam, run.log_z, run.r
        seg = slice(i0, i1)
        ls = out_losses[seg]
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            logv = np.log(np.maximum(r[seg], 0.0)) + lz - lam * ls
            probs[seg] = np.exp(np.minimum(logv, log_cap))
            rs = np.abs(r[seg])
            mag = run.c0 + lam * np.abs(ls) + np.abs(np.log(np.where(rs > 0, rs, 1.0)))
            local = 4.0 * _U * float(np.sum(rs * mag))
        e = run.err + alias(run, i0, i1) + local * (1.0 + 1e-9)
        terms.append(
            _term(
                [lam],
                [math.log(max(e, 1e-300)) + lz],
                float(out_losses[i0]),
                float(out_losses[i1 - 1]),
            )
        )
    return probs, terms


def _fft_power(z: Any, gz: float, T: int, u: float = _U) -> tuple[Any, FloatArray]:
    """``z**T`` per coefficient and a bound on its error, given errors ``<= gz`` in ``z``.

    Small powers by repeated complex multiplication (relative error of each product
    ``<= sqrt(5) u``, Brent, Percival & Zimmermann 2007); large ones through polar form
    (error of the exponent ``T (|log|z|| + pi) u``). The input error propagates as
    ``T gz (|z| + gz)^(T-1)``. Coefficients whose power cannot exceed ``e^-700`` are set to 0
    (the caller's constant term covers them).
    """
    absz = np.abs(z)
    if T <= _SMALL_POWER:  # binary powering: at most 2 log2(T) products
        w: Any = None
        sq, e, mults = z, T, 0
        while e:
            if e & 1:
                w = sq if w is None else w * sq
                mults += 1
            e >>= 1
            if e:
                sq = sq * sq
                mults += 1
        with np.errstate(under="ignore"):
            pow_in = T * gz * (absz + gz) ** (T - 1)
        return w, pow_in + _FFT_C * u * (mults + 1) * np.abs(w)
    w = np.zeros_like(z)
    err = np.zeros(z.size, dtype=absz.dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        keep = np.flatnonzero((T - 1) * np.log(absz + gz) > -700.0)
        zk, ak = z[keep], absz[keep]
        log_abs = np.log(ak)
        mag = np.exp(T * log_abs)
        phase = T * np.angle(zk)
        w[keep] = np.where(ak > 0, mag * (np.cos(phase) + 1j * np.sin(phase)), 0.0)
        pow_in = T * gz * np.exp((T - 1) * np.log(ak + gz))
        pow_own = np.where(ak > 0, _FFT_C * u * (1.0 + T * (np.abs(log_abs) + math.pi)) * mag, 0.0)
    err[keep] = pow_in + pow_own
    return w, err


def _composed_inf(factors: Sequence[tuple[float, float, int]], pessimistic: bool) -> float:
    """Mass at ``+inf`` of a composition of ``(finite, infinite, count)`` factors:
    ``prod tot^c - prod fin^c``, computed without cancellation, rounded outward."""
    log_tot, log_keep, n = 0.0, 0.0, 0
    for fin, inf, c in factors:
        tot = fin + inf
        if tot <= 0.0:
            return 0.0
        log_tot += c * math.log(tot)
        log_keep += c * math.log1p(-min(inf / tot, 1.0)) if inf < tot else -math.inf
        n += c
    lost = -math.expm1(log_keep)
    val = math.exp(min(log_tot + math.log(lost), 1.0)) if lost > 0 else 0.0
    if pessimistic:
        return min(val * (1 + 16 * _U * (n + 2)), 1.0)
    return min(val * (1 - 16 * _U * (n + 2)), 1.0)
