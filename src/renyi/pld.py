"""Privacy loss distributions (PLDs): tight numerical accounting with rigorous error bars.

For a pair of output distributions ``(P, Q)`` of a mechanism on neighbouring datasets the
*privacy loss* is ``L = log(P(x) / Q(x))`` with ``x ~ P`` (``L = +inf`` where ``Q(x) = 0``).
The mechanism's privacy profile is the hockey-stick divergence

    delta(eps) = E[(1 - exp(eps - L))_+] + P[L = +inf]

(Koskela, Jälkö & Honkela 2020, Eq. (5); Gopi, Lee & Wutschitz 2021, Prop. 2.9), and the
privacy loss of a composition is the sum of the independent losses, so composing means
convolving PLDs (Sommer, Meiser & Mohammadi 2019, Thm. 1; Koskela et al. 2020, Sec. 3).

This module stores a PLD on the uniform grid ``{k h}`` (``h`` is the *value discretisation
interval*) twice:

* the **pessimistic** side rounds every loss *up* to the grid and moves truncated tails to
  ``+inf``; it stochastically dominates the true PLD, so its ``delta(eps)`` is an upper bound
  for every ``eps`` and stays one under composition (Meiser & Mohammadi 2018, Thm. 5;
  Doroshenko et al. 2022, Sec. 3);
* the **optimistic** side rounds losses *down* and deletes truncated mass; its ``delta(eps)``
  is a lower bound.

Bin masses of continuous mechanisms are exact CDF differences of the output distribution
(the loss is monotone in the output), computed in log space and widened by a bound on the
library's round-off, so the bounds are rigorous rather than "close". Composition uses the FFT
on an *exponentially tilted* copy of the masses (``p_i exp(lam L_i)``, which commutes with
convolution): the FFT's round-off then stays relative to the Chernoff bound
``exp(-lam eps) E[exp(lam L)]`` at the ``eps`` of interest instead of to the largest mass,
which is what keeps ``delta = 1e-12`` meaningful after ``10^6`` steps. Every numerical error
(FFT round-off, cyclic aliasing, the base masses' own errors) is tracked as a bound on the
weighted norm ``sum_i |e_i| exp(lam L_i)`` and added to (upper) or subtracted from (lower)
every ``delta`` reported; tails outside the FFT window are bounded by Chernoff's inequality
and charged to ``+inf``. The true ``delta(eps)`` therefore always lies in the reported
``[lower, upper]``.

Neighbouring relation: a PLD describes one ordered pair ``(P, Q)``. For add/remove-one
neighbours of a subsampled mechanism the two orders differ; build both (``direction="remove"``
and ``"add"``), compose each, and report the larger ``delta``/``epsilon`` (what
:class:`renyi.accountants.PldAccountant` does).

Example
-------
>>> pld = PrivacyLossDistribution.gaussian(1.0).self_compose(10)
>>> lo, est, hi = pld.delta_for_epsilon(1.0)
>>> lo <= est <= hi
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import fft as sfft
from scipy.signal import lfilter
from scipy.special import log_ndtr, logsumexp, ndtri

from renyi._validation import (
    as_real,
    check_delta,
    check_int,
    check_positive,
    check_probability,
    check_range,
    fail,
)
from renyi.errors import PrivacyParameterError

__all__ = ["Direction", "PldBounds", "PldGridError", "PrivacyLossDistribution"]

Direction = Literal["remove", "add"]
FloatArray = NDArray[np.float64]

_U = float(np.finfo(np.float64).eps)  # 2.2e-16, unit round-off (times 2)
# extended precision (x87 80-bit long double on x86-64: 1.1e-19; equal to _U where long
# double is double): FFT powers are redone in it when float64 round-off would dominate delta
_EXT = np.longdouble
_U_EXT = float(np.finfo(_EXT).eps)
_EXT_USEFUL = _U_EXT < _U / 16
_NOISE_RATIO = 1e-4  # a query whose round-off bound exceeds this fraction of delta ...
_EXT_MAX_POINTS = 1 << 19  # ... is redone in extended precision if its FFTs were this short
_LOGCDF_ULPS = 32.0  # assumed accuracy of scipy's log_ndtr, in ulps of |log value| (+1)
_FFT_C = 8.0  # constant of the a-priori FFT round-off model, per butterfly level
_KAPPA = 1e-10  # relative safety margin applied to every reported delta
_MAX_BINS = 1 << 22  # largest grid a composition may produce before coarsening
DEFAULT_MAX_BINS = 1 << 17  # default cap on a self-composition's FFT window (see _plan)
_SMALL_POWER = 16  # powers up to this use repeated complex multiplication
_MAX_COUNT = 10**15  # larger self-compositions are refused (PldGridError: use RDP)
_COARSEN_GUARD = 8  # a level may coarsen G-fold only if its inputs hold >= 8 k G^2 steps
_DELTA_REFS = (1e-12,)  # tilts make the round-off relative around these deltas
_ALIAS_TARGET = 1e-11  # tilted-space mass allowed to wrap around the FFT window
_STEP_TAIL_FACTOR = 1e-10  # a single step is truncated at tail_mass * 1e-10 (T steps add up)
_ALT_TILTS = np.concatenate(([0.0], np.geomspace(0.03, 30.0, 13)))  # for propagated errors
_S_GRID = np.geomspace(1e-3, 3e3, 23)  # orders for Chernoff bounds and the tilt
_S_ALL = np.concatenate((-_S_GRID[::-1], [0.0], _S_GRID))  # exact MGFs at these orders
_LOG_HALF = math.log(0.5)


class PldGridError(PrivacyParameterError):
    """The privacy loss does not fit a grid of at most 2**22 points at the requested
    ``value_discretization_interval`` (or not in floating point at all).

    ``needed`` is the smallest interval that fits (``inf`` if none does): callers that may
    choose the grid (e.g. :class:`renyi.accountants.PldAccountant`) retry with it.
    """

    def __init__(self, message: str, needed: float) -> None:
        super().__init__(message)
        self.needed = needed


def _grid_error(name: str, value: Any, needed: float, what: str) -> PldGridError:
    if math.isfinite(needed):
        expected = f"a value >= {needed:.3g} for {what}"
    else:
        expected = f"{what} whose privacy loss fits in floating point (use the RDP accountant)"
    return PldGridError(f"{name}={value!r} is invalid: expected {expected}", needed)


class _NumericGuard:
    """Turns an arithmetic failure (overflow, division by zero) at an extreme parameter
    into our error naming that parameter, instead of a raw traceback."""

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None and issubclass(kind, OverflowError | ZeroDivisionError | MemoryError):
            raise _grid_error(self.name, self.value, math.inf, "a value") from exc


class PldBounds(NamedTuple):
    """A privacy quantity bracketed by rigorous bounds: ``lower <= truth <= upper``.

    ``estimate`` is the connect-the-dots value (Doroshenko et al. 2022) of the stored masses
    without the error margins, clipped into the bracket: the usual point estimate, within
    ``O(h^2)`` per composed step of the truth.
    """

    lower: Any
    estimate: Any
    upper: Any


# ---------------------------------------------------------------------------------------
# small numerical helpers


def _f64(x: Any) -> FloatArray:
    return np.asarray(x, dtype=np.float64)


def _sum_up(x: FloatArray) -> float:
    """An upper bound on the exact sum of non-negative floats (summation error <= n u sum)."""
    return float(np.sum(x)) * (1.0 + (x.size + 2) * _U)


def _sum_down(x: FloatArray) -> float:
    """A lower bound on the exact sum of non-negative floats."""
    return float(np.sum(x)) * (1.0 - (x.size + 2) * _U)


def _lse(values: Sequence[float]) -> float:
    """``log sum exp`` of a few floats (scipy's logsumexp costs ~0.1 ms per call)."""
    top = max(values, default=-math.inf)
    if top == -math.inf or top == math.inf:
        return top
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


def _log1mexp(x: FloatArray) -> FloatArray:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate on both sides of ``-log 2``."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > -math.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


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


def _tilts(log_mgf_pos: FloatArray, count: int, tilt: float | None) -> list[float]:
    """Exponential tilts used for one composition: 0 plus the Chernoff-optimal orders for a
    spread of reference deltas (so the round-off is relative wherever delta is evaluated)."""
    if tilt is not None:
        return sorted({0.0, float(tilt)})
    lams = {0.0}
    for ref in _DELTA_REFS:
        with np.errstate(invalid="ignore"):
            eps = (count * log_mgf_pos - math.log(ref)) / _S_GRID
        eps = np.where(np.isfinite(eps), eps, np.inf)
        lams.add(float(_S_GRID[int(np.argmin(eps))]))
    return sorted(lams)


def _stitch(
    runs: Sequence[tuple[float, float, float, FloatArray]],
    out_losses: FloatArray,
    log_cap: float,
) -> tuple[FloatArray, list[_ErrTerm]]:
    """Combine results computed under several tilts, bin by bin.

    Each run is ``(lam, log_z, e_tilted, r_tilted)``: the untilted masses are
    ``r_tilted * exp(log_z - lam L)`` with error ``sum |e_i| exp(lam L_i) <= e_tilted exp(log_z)``.
    Each bin takes the run whose error scale ``e_tilted exp(log_z - lam L)`` is smallest there;
    the error of the stitched vector is the sum of the runs' errors restricted to their bins,
    each bounded on its own (narrow) range.
    """
    # Runs come sorted by tilt and the first covers the whole window. The score of run j is
    # linear in L with slope -lam_j, so a later (larger-tilt) run wins on an interval: from
    # where it beats the current best at its window's left end onwards, within its window.
    n = out_losses.size
    owner = np.zeros(n, dtype=np.int64)
    a_of = np.array([math.log(max(e, 1e-300)) + lz for _, lz, e, _ in runs])
    lam_of = np.array([lam for lam, _, _, _ in runs])
    for j in range(1, len(runs)):  # a handful of tilts
        lam, lz, e, r = runs[j]
        valid = np.flatnonzero(~np.isnan(r))
        if valid.size == 0:
            continue
        lo_i, hi_i = int(valid[0]), int(valid[-1]) + 1
        seg = slice(lo_i, hi_i)
        cur = owner[seg]
        ls = out_losses[seg]
        k = int(cur[0])
        if np.all(cur == k) and lam > lam_of[k]:  # one rival: the switch is a threshold in L
            cut = (a_of[j] - a_of[k]) / (lam - lam_of[k])
            start = lo_i + int(np.searchsorted(ls, cut, side="right"))
            owner[start:hi_i] = j
        else:
            better = a_of[j] - lam * ls < a_of[cur] - lam_of[cur] * ls
            owner[seg] = np.where(better, j, cur)
    probs = np.zeros(n)
    terms: list[_ErrTerm] = []
    # one error term per contiguous piece a run owns (each bounded on its own narrow range)
    cuts = np.flatnonzero(np.diff(owner)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    for i0, i1 in zip(starts.tolist(), ends.tolist(), strict=True):
        lam, lz, e, r = runs[int(owner[i0])]
        seg = slice(i0, i1)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            logv = np.log(np.maximum(r[seg], 0.0)) + lz - lam * out_losses[seg]
            probs[seg] = np.exp(np.minimum(logv, log_cap))
        terms.append(
            _term(
                [lam],
                [math.log(max(e, 1e-300)) + lz],
                float(out_losses[i0]),
                float(out_losses[i1 - 1]),
            )
        )
    return probs, terms


def _tilted_rfft(
    side: _Side, lam: float, lm: float, n_fft: int, g: float, ext: bool = False
) -> tuple[Any, float]:
    """rfft of the masses tilted by ``exp(lam L - lm)`` (folded cyclically onto ``n_fft``
    points) and a bound on the absolute error of each coefficient; in extended precision
    if ``ext``."""
    u = _U_EXT if ext else _U
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        if ext:
            t = np.exp(np.log(side.probs.astype(_EXT)) + lam * side.losses.astype(_EXT) - lm)
        else:
            t = np.exp(side.log_probs + lam * side.losses - lm)
    folds = 1
    if side.size > n_fft:
        folds = -(-side.size // n_fft)
        pad = np.zeros(folds * n_fft, dtype=t.dtype)
        pad[: side.size] = t
        base = pad.reshape(folds, n_fft).sum(axis=0)
    else:
        base = t
    tot = float(np.sum(t))
    return sfft.rfft(base, n_fft), (g + (folds - 1) * u) * tot


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


def _regrid(side: _Side, h: float) -> _Side:
    """``side`` on the coarser grid ``h``: exact index arithmetic when ``h`` is an integer
    multiple of its own grid, the general (any ratio) re-gridding otherwise."""
    if side.h == h:
        return side
    ratio = h / side.h
    factor = round(ratio)
    if factor >= 1 and abs(ratio - factor) <= 1e-9 * ratio:
        return replace(side.coarsen(factor), h=h)
    return side.regrid_any(h)


class _Plan(NamedTuple):
    """How to compute ``step^count``: one FFT power ``step^t0`` on the step's grid, then one
    level per digit of ``count - t0 m^k`` in base ``m``: coarsen by ``factor``, raise to the
    ``m``-th power and convolve with ``step^digit``. ``taus`` are the tail budgets of the
    stages (direct power first), ``extra_tau`` that of each ``step^digit``."""

    total: int
    t0: int
    m: int
    levels: tuple[tuple[int, int], ...]
    taus: tuple[float, ...]
    extra_tau: float


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
    cap = min(max_bins, _MAX_BINS)
    direct_cap = max(cap, min(2 * step.size, _MAX_BINS))
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
        t0_max = max(t0_max, min(c_min, largest_fitting(_MAX_BINS)))
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
    while levels and levels[0][1] == 1 and width(m * t0 + levels[0][0], taus[0]) <= _MAX_BINS:
        t0 = m * t0 + levels[0][0]
        levels.pop(0)
        taus = taus[:1] + taus[2:]  # the direct stage keeps the smallest budget
    if not levels:
        return _Plan(count, count, 1, (), (tail_mass,), tail_mass)
    return _Plan(count, t0, m, tuple(levels), taus, extra_tau)


# ---------------------------------------------------------------------------------------
# one rounding direction


@dataclass(frozen=True, eq=False)
class _Side:
    """One discretisation (pessimistic or optimistic) of a PLD on the grid ``k h``.

    ``probs[i]`` is the mass at loss ``(offset + i) h``; ``finite_mass`` is the exact-arithmetic
    total of those masses (tracked analytically, never re-summed from noisy FFT output),
    ``inf_mass`` the mass at ``+inf``. ``errors`` bound ``computed - exact`` in weighted norms;
    ``support`` contains the support of the exact masses.
    """

    pessimistic: bool
    h: float
    offset: int
    probs: FloatArray
    finite_mass: float
    inf_mass: float
    errors: tuple[_ErrTerm, ...] = ()
    support: tuple[float, float] = (0.0, 0.0)
    hoeffding_var: float = 0.0  # lower side: sum of squared widths of the random roundings
    shift: float = 0.0  # lower side: bound on the total bias of those roundings
    fft_len: int = 0  # the longest FFT that produced it (the cost of redoing it)

    # -- basic views --------------------------------------------------------------------
    @property
    def size(self) -> int:
        return int(self.probs.size)

    @cached_property
    def losses(self) -> FloatArray:
        return (self.offset + np.arange(self.size, dtype=np.float64)) * self.h

    @cached_property
    def log_probs(self) -> FloatArray:
        with np.errstate(divide="ignore"):
            return np.log(self.probs)

    def log_mgf(self, s: ArrayLike) -> FloatArray:
        """``log sum_i p_i exp(s L_i)`` for each ``s`` (plus a 1e-12 margin: an upper bound).

        Exact and fast: chunks of ``c`` consecutive grid points share the factor
        ``exp(s L_chunk)``, so the sums become one matrix product with ``exp(s r h)``.
        """
        s = np.atleast_1d(np.asarray(s, dtype=np.float64))
        # orders of similar size share a chunk length (a power of two, e^(s c h) <= e^40)
        with np.errstate(divide="ignore"):
            raw = np.floor(40.0 / (np.abs(s) * self.h))
        c_of = np.exp2(np.floor(np.log2(np.clip(raw, 1, 128)))).astype(np.int64)
        if self.size < 16384:  # small grids: one group (call overhead dominates)
            c_of[:] = np.min(c_of)
        out = np.empty(s.shape)
        for c in np.unique(c_of).tolist():  # a few groups
            sel = c_of == c
            out[sel] = self._log_mgf_chunked(s[sel], int(c))
        return out + 1e-12

    def _log_mgf_chunked(self, s: FloatArray, c: int) -> FloatArray:
        n_chunks = -(-self.size // c)
        pad = np.zeros(n_chunks * c)
        pad[: self.size] = self.probs
        e = np.exp(np.outer(np.arange(c) * self.h, s))
        # einsum rather than BLAS: no thread start-up, which dominates at these sizes
        sums = np.einsum("ij,jk->ik", pad.reshape(n_chunks, c), e)
        start = (self.offset + np.arange(n_chunks) * c) * self.h
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(sums) + start[:, None] * s[None, :]
            top = np.max(logs, axis=0)
            safe = np.where(np.isfinite(top), top, 0.0)
            total = np.sum(np.exp(logs - safe), axis=0)
        return np.where(np.isfinite(top), safe + np.log(total), top)

    def grid_range(self) -> tuple[float, float]:
        return float(self.losses[0]), float(self.losses[-1])

    # -- delta queries --------------------------------------------------------------------
    @cached_property
    def _gd(self) -> tuple[FloatArray, FloatArray]:
        """``G[j] = sum_{i>=j} p_i e^{-(i-j)h}`` and ``D[j] = sum_{i>j} p_i (1 - e^{-(i-j)h})``.

        Both are sums of non-negative terms (a stable first-order recursion and a cumulative
        sum), so no cancellation occurs however small ``delta`` is.
        """
        a = math.exp(-self.h)
        g = lfilter([1.0], [1.0, -a], self.probs[::-1])[::-1]
        rp = np.empty_like(g)
        rp[:-1] = a * g[1:]
        rp[-1] = 0.0
        d = math.expm1(self.h) * np.cumsum(rp[::-1])[::-1]
        return np.asarray(g), np.asarray(d)

    def delta_raw(self, eps: FloatArray) -> FloatArray:
        """``sum_i p_i (1 - e^{eps - L_i})_+`` for each ``eps`` (not including ``+inf``)."""
        g, d = self._gd
        losses = self.losses
        j = np.searchsorted(losses, eps, side="right")
        inside = j < self.size
        jj = np.minimum(j, self.size - 1)
        with np.errstate(invalid="ignore", over="ignore"):
            t = losses[jj] - eps
            val = d[jj] - np.expm1(-t) * g[jj]
        return np.where(inside, val, 0.0)

    def error_at(self, eps: FloatArray) -> FloatArray:
        total = np.zeros_like(eps)
        for term in self.errors:
            total = total + term.delta_error(eps)
        return total

    def _plain_bound(self, eps: FloatArray) -> FloatArray:
        raw = self.delta_raw(eps) + self.inf_mass
        err = self.error_at(eps)
        if self.pessimistic:
            return (raw + err) * (1.0 + _KAPPA)
        return np.maximum(raw * (1.0 - _KAPPA) - err, 0.0)

    def delta_bound(self, eps: FloatArray) -> FloatArray:
        """Upper bound (pessimistic side) or lower bound (optimistic side) on the true delta.

        The optimistic side's losses were rounded at random with their mean preserved, so
        the rounded total ``S~`` and the (merged) true total ``S`` satisfy
        ``P[S~ - S > a + shift] <= exp(-2 a^2 / V)`` (Hoeffding 1963, Thm. 2, with ``V`` the
        sum of squared rounding widths); hence ``delta(eps) >= delta~(eps + a + shift) -
        exp(-2 a^2 / V)`` for every ``a >= 0``, maximised here over a grid of ``a``.
        """
        eps = np.asarray(eps, dtype=np.float64)
        if self.pessimistic or self.hoeffding_var == 0.0:
            return self._plain_bound(eps + (0.0 if self.pessimistic else self.shift))
        log_eta = -np.geomspace(1e-3, 92.0, 48)  # eta from ~1 down to 1e-40
        a = np.sqrt(self.hoeffding_var * (-log_eta) / 2.0)
        x = eps[..., None] + a + self.shift
        vals = self._plain_bound(x.ravel()).reshape(x.shape) - np.exp(log_eta)
        return np.maximum(np.max(vals, axis=-1), 0.0)

    def epsilon_bound(self, deltas: FloatArray) -> FloatArray:
        """Upper (pessimistic) or lower (optimistic) bound on eps(delta), vectorised.

        Pessimistic: the smallest ``eps >= 0`` found with ``delta_upper(eps) <= delta``
        (verified: the returned point satisfies it). Optimistic: a point ``eps`` with
        ``delta_lower(eps) > delta`` (so the true ``eps(delta)`` is at least that), using
        ``sup{eps: max_a [g(eps + a + shift) - eta(a)] > delta}
        = max_a [sup{x: g(x) > delta + eta(a)} - a - shift]`` with ``g`` the plain bound.
        """
        deltas = np.asarray(deltas, dtype=np.float64)
        if self.pessimistic:
            return self._invert(self._plain_bound, deltas, upper=True)
        if self.hoeffding_var == 0.0:
            e = self._invert(self._plain_bound, deltas, upper=False) - self.shift
            return np.maximum(e, 0.0)
        log_eta = -np.geomspace(1e-3, 92.0, 48)
        a = np.sqrt(self.hoeffding_var * (-log_eta) / 2.0)
        targets = deltas[:, None] + np.exp(log_eta)[None, :]
        ok = targets < 1.0
        e = np.full(targets.shape, -np.inf)
        e[ok] = self._invert(self._plain_bound, targets[ok], upper=False)
        e = e - a[None, :] - self.shift
        return np.maximum(np.max(e, axis=1), 0.0)

    def epsilon_raw(self, deltas: FloatArray) -> FloatArray:
        """eps(delta) of the stored masses alone (no error margins): a point estimate."""

        def raw(eps: FloatArray) -> FloatArray:
            return self.delta_raw(eps) + self.inf_mass

        return self._invert(raw, np.asarray(deltas, dtype=np.float64), upper=True)

    def _invert(
        self, f: Callable[[FloatArray], FloatArray], deltas: FloatArray, upper: bool
    ) -> FloatArray:
        """Invert a non-increasing ``f`` on ``[0, inf)``: the bracket comes from the grid,
        then bisection; ``upper`` returns the right end (``f <= delta`` there, verified),
        otherwise the left end (``f > delta`` there)."""
        grid = self.losses[self.losses > 0]
        grid = grid[:: max(1, grid.size // 1024)]  # any monotone bracket will do
        pts = np.concatenate(([0.0], grid))
        fp = np.minimum.accumulate(f(pts))
        # first index where f <= delta (the running minimum makes the search exact)
        idx = np.searchsorted(-fp, -deltas, side="left")
        lo = np.where(idx > 0, pts[np.maximum(idx - 1, 0)], 0.0)
        hi = np.where(idx < pts.size, pts[np.minimum(idx, pts.size - 1)], np.inf)
        beyond = idx >= pts.size
        if np.any(beyond):  # only +inf mass and error terms remain past the grid
            hi = hi.copy()
            hi[beyond] = self._beyond_grid_end(f, deltas[beyond], float(pts[-1]))
        at_zero = idx == 0
        finite = np.isfinite(hi) & ~at_zero
        lo_f, hi_f, d_f = lo[finite], hi[finite], deltas[finite]
        for _ in range(200):
            if np.all(hi_f - lo_f <= 1e-11 * (1.0 + hi_f)):
                break
            mid = 0.5 * (lo_f + hi_f)
            ok = f(mid) <= d_f
            hi_f = np.where(ok, mid, hi_f)
            lo_f = np.where(ok, lo_f, mid)
        out = np.empty_like(deltas)
        out[finite] = hi_f if upper else lo_f
        out[at_zero] = 0.0
        out[~finite & ~at_zero] = np.inf
        return out

    def _beyond_grid_end(
        self, f: Callable[[FloatArray], FloatArray], deltas: FloatArray, start: float
    ) -> FloatArray:
        """A point past the grid where ``f <= delta``, or ``+inf`` if no such point exists."""
        hi = np.full(deltas.shape, max(start, 1.0))
        for _ in range(12):  # grow geometrically: 2^(2^12) covers any float
            bad = f(hi) > deltas
            if not np.any(bad):
                break
            hi = np.where(bad, np.minimum(hi, 1e150) ** 2 + 1.0, hi)
            hi = np.minimum(hi, np.finfo(np.float64).max)
        return np.where(f(hi) <= deltas, hi, np.inf)

    # -- structural operations --------------------------------------------------------------
    def coarsen(self, factor: int) -> _Side:
        """Re-grid to ``factor h`` rounding up (pessimistic) or down (optimistic)."""
        if factor == 1:
            return self
        k = self.offset + np.arange(self.size)
        if self.pessimistic:  # connect the dots on the coarse grid (see _ctd_upper)
            base_k = k // factor
            d = (k - base_k * factor) * self.h
            off = int(base_k[0])
            n_new = int(base_k[-1]) - off + 2
            right = _ctd_upper(self.probs, self.probs * np.exp(-d) * (1 - 8 * _U), factor * self.h)
            probs = _f64(
                np.bincount(base_k - off, weights=self.probs - right, minlength=n_new)
                + np.bincount(base_k - off + 1, weights=right, minlength=n_new)
            )
        else:  # round at random to the two neighbours, preserving the mean
            base_k = k // factor
            frac = (k - base_k * factor) / factor
            off = int(base_k[0])
            n_new = int(base_k[-1]) - off + 2
            probs = _f64(
                np.bincount(base_k - off, weights=self.probs * (1 - frac), minlength=n_new)
                + np.bincount(base_k - off + 1, weights=self.probs * frac, minlength=n_new)
            )
        shift = factor * self.h
        up = self.pessimistic
        errs = tuple(
            _term(
                t.lams,
                [lw + (lt * shift if up else 0.0) for lt, lw in zip(t.lams, t.log_ws, strict=True)],
                t.lo - (0.0 if up else shift),
                t.hi + (shift if up else 0.0),
            )
            for t in self.errors
        )
        lo, hi = self.support
        return _Side(
            up,
            self.h * factor,
            off,
            probs,
            self.finite_mass,
            self.inf_mass,
            errs,
            (lo - (0.0 if up else shift), hi + (shift if up else 0.0)),
            0.0 if up else self.hoeffding_var + shift * shift,
            self.shift,
            self.fft_len,
        )

    def regrid_any(self, big_h: float) -> _Side:
        """Re-grid to ``{k H}`` for any ``H > h`` (not necessarily a multiple of ``h``).

        Each point's mass is split between the two coarse points around it: by
        connect-the-dots with the share sent up rounded up (pessimistic; the mean of
        ``e^-L`` is preserved, so by Jensen every ``delta(eps)`` can only grow), or at random
        with the mean preserved (optimistic; the width ``H`` enters the Hoeffding variance
        like any rounding). The float positions' round-off is absorbed conservatively.
        """
        if big_h <= self.h:
            raise fail("value_discretization_interval", big_h, f"a value > {self.h!r}")
        losses = self.losses
        base_k = np.floor(losses / big_h)
        base_k = np.where(base_k * big_h > losses, base_k - 1, base_k)
        base_k = np.where((base_k + 1) * big_h < losses, base_k + 1, base_k)
        d = losses - base_k * big_h
        slack = 8 * _U * (np.abs(losses) + big_h)
        off = int(base_k[0])
        idx = (base_k - off).astype(np.int64)
        n_new = int(idx[-1]) + 2
        up = self.pessimistic
        if up:  # the share sent up grows with d: use an upper bound on d
            d_hi = np.minimum(d + slack, big_h)
            right = _ctd_upper(self.probs, self.probs * np.exp(-d_hi) * (1 - 8 * _U), big_h)
            w_lo, w_hi = self.probs - right, right
        else:  # round at random, preserving the mean; the position error joins the shift
            frac = np.clip(d / big_h, 0.0, 1.0)
            w_lo, w_hi = self.probs * (1 - frac), self.probs * frac
        probs = _f64(
            np.bincount(idx, weights=w_lo, minlength=n_new)
            + np.bincount(idx + 1, weights=w_hi, minlength=n_new)
        )
        errs = tuple(
            _term(
                t.lams,
                [lw + (lt * big_h if up else 0.0) for lt, lw in zip(t.lams, t.log_ws, strict=True)],
                t.lo - (0.0 if up else big_h),
                t.hi + (big_h if up else 0.0),
            )
            for t in self.errors
        )
        lo, hi = self.support
        return _trim(
            _Side(
                up,
                big_h,
                off,
                probs,
                self.finite_mass,
                self.inf_mass,
                errs,
                (lo - (0.0 if up else big_h), hi + (big_h if up else 0.0)),
                0.0 if up else self.hoeffding_var + big_h * big_h,
                self.shift + (0.0 if up else float(np.max(slack))),
                self.fft_len,
            )
        )

    def _error_log_w(self, lam: float) -> float:
        vals = [t.at(lam) for t in self.errors]
        return _lse(vals)

    def _err_range(self) -> tuple[float, float]:
        glo, ghi = self.grid_range()
        los = [glo, self.support[0]] + [t.lo for t in self.errors]
        his = [ghi, self.support[1]] + [t.hi for t in self.errors]
        return min(los), max(his)

    @cached_property
    def mgf_table(self) -> FloatArray:
        """``log_mgf`` at ``_S_ALL``, the orders of every Chernoff bound (computed once)."""
        return self.log_mgf(_S_ALL)

    def self_compose(
        self, plan: _Plan, tail_mass: float, tilt: float | None, ext: bool = False
    ) -> _Side:
        """``self`` composed ``plan.total`` times, following ``plan`` (see :func:`_plan`).

        One FFT power ``self^t0`` on the grid ``h``; then every level coarsens by a power of
        two (if its window would exceed the cap) and raises to the ``plan.m``-th power, times
        ``self^digit`` (regridded) for the base-``m`` digits of the rest of the count.
        """
        count = plan.total
        if count == 1:
            return self
        if count == 0:
            return _identity_side(self.pessimistic, self.h)
        if not plan.levels:  # one FFT power on the fine grid
            return self._power_fitting(count, tail_mass, tilt, None, ext=ext)
        lm_pos = self.mgf_table[_S_GRID.size + 1 :]
        lam_max = _tilts(count * lm_pos, 1, tilt)[-1]  # one tilt target for every stage
        side = self
        if plan.t0 > 1:
            side = self._power_fitting(plan.t0, plan.taus[0], tilt, lam_max, ext=ext)
        powers: dict[int, _Side] = {1: self}
        for (digit, factor), tau in zip(plan.levels, plan.taus[1:], strict=True):
            side = side.coarsen(factor)
            extra = None
            if digit:
                if digit not in powers:
                    powers[digit] = self._power_fitting(
                        digit, plan.extra_tau, tilt, lam_max, ext=ext
                    )
                side, extra = _common_grid(side, powers[digit])
            side = side._power_fitting(plan.m, tau, tilt, lam_max, extra, ext=ext)
        return side

    def _power_fitting(
        self,
        count: int,
        tail_mass: float,
        tilt: float | None,
        lam_max: float | None,
        extra: _Side | None = None,
        *,
        ext: bool = False,
    ) -> _Side:
        """:meth:`_power`, coarsening the inputs first if the window cannot fit in memory."""
        side = self
        for _ in range(64):
            result = side._power(count, tail_mass, tilt, lam_max, extra, ext=ext)
            if isinstance(result, _Side):
                return result
            side = side.coarsen(result)
            if extra is not None:
                side, extra = _common_grid(side, extra)
        raise fail("count", count, "a count whose composition fits in memory")  # pragma: no cover

    def _power(
        self,
        count: int,
        tail_mass: float,
        tilt: float | None,
        lam_max: float | None,
        extra: _Side | None = None,
        *,
        ext: bool = False,
    ) -> _Side | int:
        """``self^count`` (convolved once with ``extra``, on the same grid, if given) by one
        FFT power over a Chernoff window; a power-of-two coarsening factor instead if that
        window would exceed ``_MAX_BINS``.

        Tilts: 0 and the largest useful one ``<= lam_max`` (default: the Chernoff-optimal
        order for ``delta = 1e-12`` of this composition) whose window stays affordable.
        """
        T = count
        h, k0 = self.h, self.offset
        n_g = _S_GRID.size
        lm_tab = self.mgf_table
        if extra is None:
            lm_all = T * lm_tab
            nat_lo, nat_hi = T * k0, T * (k0 + self.size - 1)
        else:
            lm_all = T * lm_tab + extra.mgf_table
            nat_lo = T * k0 + extra.offset
            nat_hi = T * (k0 + self.size - 1) + extra.offset + extra.size - 1
        lams = _tilts(lm_all[n_g + 1 :], 1, tilt)
        if tilt is None and lam_max is not None:
            lams = [0.0, float(lam_max)]
        log_tau = math.log(tail_mass)
        log_al = math.log(_ALIAS_TARGET)

        known: dict[float, tuple[float, float]] = {}
        for i, s in enumerate(_S_ALL):
            known[float(s)] = (
                float(lm_tab[i]),
                float(extra.mgf_table[i]) if extra is not None else 0.0,
            )

        def parts(lam: float) -> tuple[float, float]:
            """(log-MGF of self, of extra) at ``lam``: upper bounds within 1e-12."""
            if lam not in known:
                arr = np.array([lam])
                known[lam] = (
                    float(self.log_mgf(arr)[0]),
                    float(extra.log_mgf(arr)[0]) if extra is not None else 0.0,
                )
            return known[lam]

        def window(lam: float, log_target: float) -> tuple[int, int, FloatArray, FloatArray]:
            """Chernoff window of the tilt-``lam`` distribution: (k_lo, k_hi, up, down) with
            ``up``/``down`` the (order, log-MGF) rows bounding the mass beyond a point."""
            if lam:
                ls, le = parts(lam)
                lm_lam = T * (ls - 3e-12) + ((le - 3e-12) if extra is not None else 0.0)
            else:
                lm_lam = 0.0
            sp = _S_ALL - lam
            keep_up = sp > 0
            keep_dn = sp < 0
            up_s, up_v = sp[keep_up], lm_all[keep_up] - lm_lam
            dn_s, dn_v = -sp[keep_dn], lm_all[keep_dn] - lm_lam
            with np.errstate(invalid="ignore", divide="ignore"):
                hi_x = float(np.min((up_v - log_target) / up_s, initial=np.inf))
                lo_x = float(np.max(-(dn_v - log_target) / dn_s, initial=-np.inf))
            k_hi = min(nat_hi, _ceil_index(hi_x / h) - 1)
            k_lo = max(nat_lo, _floor_index(lo_x / h) + 1)
            return k_lo, max(k_hi, k_lo), np.stack((up_s, up_v)), np.stack((dn_s, dn_v))

        def outside(k_lo: int, k_hi: int, up: FloatArray, dn: FloatArray) -> float:
            a = 0.0 if k_hi >= nat_hi else _chernoff(up[1] - up[0] * ((k_hi + 1) * h))
            b = 0.0 if k_lo <= nat_lo else _chernoff(dn[1] + dn[0] * ((k_lo - 1) * h))
            return a + b

        out_lo, out_hi, out_up, out_dn = window(0.0, log_tau)
        width = out_hi - out_lo + 1
        if width > _MAX_BINS:
            return 1 << math.ceil(math.log2(width * 1.02 / _MAX_BINS))
        K = np.arange(out_lo, out_hi + 1)
        out_l = K * h
        if tilt is None:  # the largest useful tilt whose window stays affordable
            cands = _S_GRID[_S_GRID <= lams[-1]][::-1]
            lams = [0.0]
            for lam_c in cands:
                c_lo, c_hi, _, _ = window(float(lam_c), log_al)
                if c_hi - c_lo + 1 <= width + width // 4 + 1024:
                    lams.append(float(lam_c))
                    break
        runs = []
        longest = max(self.fft_len, extra.fft_len if extra is not None else 0)
        for lam in lams:  # a handful of tilts, each one FFT power
            w_lo, w_hi, up, dn = window(lam, log_al)
            if lam == 0.0:
                w_lo, w_hi = out_lo, out_hi
            elif w_hi < out_hi and out_hi - w_lo + 1 <= width + width // 4 + 1024:
                w_hi = out_hi  # tilted accuracy up to the top of the window (later levels)
            alias = outside(w_lo, w_hi, up, dn)
            if w_hi - w_lo + 1 > _MAX_BINS or w_hi < out_lo or w_lo > out_hi:
                continue  # this tilt would not help: the others cover the window
            n_fft = sfft.next_fast_len(w_hi - w_lo + 1, real=True)
            longest = max(longest, n_fft)
            ls, le = parts(lam) if lam else (float(lm_tab[n_g]), 0.0)
            if extra is not None and not lam:
                le = float(extra.mgf_table[n_g])
            u = _U_EXT if ext else _U
            g = _fft_level_error(n_fft, u)
            z, gz = _tilted_rfft(self, lam, ls, n_fft, g, ext)
            w, err = _fft_power(z, gz, T, u)
            if extra is not None:
                ze, gze = _tilted_rfft(extra, lam, le, n_fft, g, ext)
                err = err * (np.abs(ze) + gze) + np.abs(w) * gze
                w = w * ze
                err = err + 4.0 * u * np.abs(w)
            wts = _rfft_weights(n_fft, z.size)
            e_fft = float(np.sum(wts * err)) + g * float(np.sum(wts * np.abs(w)))
            e_fft += 4.0 * u * n_fft + 1e-250
            r_cyc = sfft.irfft(w, n_fft)
            r = np.full(K.size, np.nan, dtype=r_cyc.dtype)
            a, b = max(w_lo, out_lo), min(w_hi, out_hi)
            start = (a - nat_lo) % n_fft  # cyclic position of the composed index a
            r[a - out_lo : b - out_lo + 1] = np.roll(r_cyc, -start)[: b - a + 1]
            log_z = T * ls + le
            scale = 4.0 * _U * (1.0 + T * abs(ls) + abs(le) + lam * float(np.max(np.abs(out_l))))
            e_tilted = e_fft + scale * float(np.sum(np.abs(r[a - out_lo : b - out_lo + 1]))) + alias
            runs.append((lam, log_z, e_tilted, r))
        with np.errstate(over="ignore", divide="ignore"):  # huge counts: stay finite
            log_fin = T * math.log(max(self.finite_mass, 1e-300))
            log_fin += math.log(max(extra.finite_mass, 1e-300)) if extra is not None else 0.0
            fin = math.exp(min(log_fin, 700.0))
        log_cap = min(log_fin, 700.0) + 1e-9
        probs, errs = _stitch(runs, np.asarray(out_l, dtype=np.float64), log_cap)
        # the inputs' own errors, propagated: for computed C = X + E (norms M, W at a tilt),
        # |C^T Ce - X^T Xe| <= T W (M + W)^(T-1) Me + (M + W)^T We, in each tilted norm
        elo, ehi = self._err_range()
        rng_lo, rng_hi = T * elo, T * ehi
        if extra is not None:
            xlo, xhi = extra._err_range()
            rng_lo, rng_hi = rng_lo + xlo, rng_hi + xhi
        # at every order of the Chernoff grid (their MGFs are known): later compositions
        # and queries then never re-express a bound across a wide range of losses
        prop_lams = sorted({0.0, *lams, *(float(s) for s in _S_GRID)})
        prop_l: list[float] = []
        prop_w: list[float] = []
        for lam in prop_lams:
            base_w = self._error_log_w(lam)
            ext_w = extra._error_log_w(lam) if extra is not None else -np.inf
            if base_w == -np.inf and ext_w == -np.inf:
                continue
            ls, le = parts(lam) if lam else (float(lm_tab[n_g]), 0.0)
            if extra is not None and not lam:
                le = float(extra.mgf_table[n_g])
            log_mw = float(np.logaddexp(ls, base_w))  # log (M + W)
            pieces = [math.log(T) + base_w + (T - 1) * log_mw + le]
            if ext_w > -np.inf:
                pieces.append(T * log_mw + ext_w)
            prop_l.append(lam)
            prop_w.append(_lse(pieces) + 1e-12)
        if prop_l:
            errs.append(_term(prop_l, prop_w, rng_lo, rng_hi))
        inf = _composed_inf(
            [(self.finite_mass, self.inf_mass, T)]
            + ([(extra.finite_mass, extra.inf_mass, 1)] if extra is not None else []),
            self.pessimistic,
        )
        if self.pessimistic:
            inf = inf + outside(out_lo, out_hi, out_up, out_dn) * (1 + 1e-9)
        x_sup = extra.support if extra is not None else (0.0, 0.0)
        return _trim(
            _Side(
                self.pessimistic,
                h,
                int(out_lo),
                probs,
                fin,
                inf,
                _merge(errs),
                (T * self.support[0] + x_sup[0], T * self.support[1] + x_sup[1]),
                T * self.hoeffding_var + (extra.hoeffding_var if extra is not None else 0.0),
                T * self.shift + (extra.shift if extra is not None else 0.0),
                longest,
            )
        )

    def compose(
        self, other: _Side, tail_mass: float, tilt: float | None, ext: bool = False
    ) -> _Side:
        a, b = _common_grid(self, other)
        lams = _tilts(a.log_mgf(_S_GRID) + b.log_mgf(_S_GRID), 1, tilt)
        lm_a = a.log_mgf(np.asarray(lams))
        lm_b = b.log_mgf(np.asarray(lams))
        n_out = a.size + b.size - 1
        n_fft = sfft.next_fast_len(n_out, real=True)
        off = a.offset + b.offset
        out_l = (off + np.arange(n_out)) * a.h
        u = _U_EXT if ext else _U
        g = _fft_level_error(n_fft, u)
        runs = []
        for lam, la, lb in zip(lams, lm_a, lm_b, strict=True):
            za, ga = _tilted_rfft(a, lam, la, n_fft, g, ext)
            zb, gb = _tilted_rfft(b, lam, lb, n_fft, g, ext)
            w = za * zb
            r = sfft.irfft(w, n_fft)[:n_out]
            wts = _rfft_weights(n_fft, w.size)
            dw = ga * np.abs(zb) + gb * np.abs(za) + ga * gb + 2 * u * np.abs(w)
            e = float(np.sum(wts * dw)) + g * float(np.sum(wts * np.abs(w))) + 4.0 * u * n_fft
            scale = 4.0 * _U * (1.0 + abs(float(la + lb)) + lam * float(np.max(np.abs(out_l))))
            e += scale * float(np.sum(np.abs(r)))
            runs.append((lam, float(la + lb), e, r))
        fin = a.finite_mass * b.finite_mass
        log_cap = math.log(max(fin, 1e-300)) + 1e-9
        probs, errs = _stitch(runs, np.asarray(out_l, dtype=np.float64), log_cap)
        b_glo, b_ghi = b.grid_range()
        a_glo, a_ghi = a.grid_range()
        # Propagated errors (e_a * b, a * e_b, e_a * e_b), each bounded at a spread of tilts
        # (the term's own, the new ones, and a grid): which one is tight depends on the eps
        # queried and on how wide the other factor is; the queries take the minimum.
        alt = np.unique(np.concatenate((lams, _ALT_TILTS, *[t.lams for t in a.errors + b.errors])))
        mb, ma = b.log_mgf(alt), a.log_mgf(alt)
        for t in a.errors:  # e_a * b
            wa = np.array([t.at(float(x)) for x in alt])
            errs.append(_term(alt, wa + mb, t.lo + b_glo, t.hi + b_ghi))
            for v in b.errors:  # e_a * e_b
                wb = np.array([v.at(float(x)) for x in alt])
                errs.append(_term(alt, wa + wb, t.lo + v.lo, t.hi + v.hi))
        for v in b.errors:  # a * e_b
            wb = np.array([v.at(float(x)) for x in alt])
            errs.append(_term(alt, wb + ma, v.lo + a_glo, v.hi + a_ghi))
        if a.pessimistic:
            inf = _composed_inf(
                [(a.finite_mass, a.inf_mass, 1), (b.finite_mass, b.inf_mass, 1)], True
            )
        else:  # finite totals of the optimistic side may be slight overestimates
            fa, fb = a.finite_mass * (1 - 1e-9), b.finite_mass * (1 - 1e-9)
            inf = min(a.inf_mass * b.inf_mass + a.inf_mass * fb + fa * b.inf_mass, 1.0)
        side = _Side(
            a.pessimistic,
            a.h,
            off,
            probs,
            fin,
            inf,
            _merge(errs),
            (a.support[0] + b.support[0], a.support[1] + b.support[1]),
            a.hoeffding_var + b.hoeffding_var,
            a.shift + b.shift,
            max(a.fft_len, b.fft_len, n_fft),
        )
        return _truncate(side, tail_mass)


def _chernoff(log_bounds: FloatArray) -> float:
    """``exp(min log_bound)``, inflated slightly for the round-off of the MGF itself."""
    m = float(np.min(np.where(np.isnan(log_bounds), np.inf, log_bounds), initial=np.inf))
    return min(1.0, math.exp(min(m, 0.0)) * (1.0 + 1e-9))


def _ceil_index(x: float) -> int:
    if not math.isfinite(x):
        return (1 << 62) if x > 0 else -(1 << 62)
    return math.ceil(x)


def _floor_index(x: float) -> int:
    if not math.isfinite(x):
        return (1 << 62) if x > 0 else -(1 << 62)
    return math.floor(x)


def _common_grid(a: _Side, b: _Side) -> tuple[_Side, _Side]:
    h = max(a.h, b.h)
    return _regrid(a, h), _regrid(b, h)


def _trim(side: _Side) -> _Side:
    nz = np.flatnonzero(side.probs > 0)
    if nz.size == 0:
        return replace(side, probs=np.zeros(1))
    i, j = int(nz[0]), int(nz[-1])
    if i == 0 and j == side.size - 1:
        return side
    return replace(side, offset=side.offset + i, probs=np.ascontiguousarray(side.probs[i : j + 1]))


def _truncate(side: _Side, tail_mass: float) -> _Side:
    """Drop far tails after a convolution, conservatively for the side's direction.

    Pessimistic: upper-tail mass ``<= tail_mass / 2`` moves to ``+inf`` together with a bound on
    the error it carries. Optimistic: that upper tail moves down to the last kept bin and the
    lower tail (also ``<= tail_mass / 2``) is deleted; both only lower ``delta``.
    """
    side = _trim(side)
    p = side.probs
    top = np.cumsum(p[::-1])[::-1]  # mass at or above each bin
    cut = int(np.searchsorted(-top, -tail_mass / 2, side="left"))  # first bin with top <= tau/2
    probs = p
    inf = side.inf_mass
    fin = side.finite_mass
    offset = side.offset
    if 0 < cut < side.size:
        moved = float(top[cut])
        if side.pessimistic:
            charge = sum(
                float(t.delta_error(np.array([side.losses[cut] - side.h]))[0]) for t in side.errors
            )
            inf = inf + (moved + charge) * (1 + 1e-9)
            fin = max(fin - moved, 0.0)
            probs = p[:cut].copy()
        else:
            probs = p[:cut].copy()
            probs[-1] += moved
    if not side.pessimistic:
        bottom = np.cumsum(probs)
        drop = int(np.searchsorted(bottom, tail_mass / 2, side="right"))
        if 0 < drop < probs.size:
            fin = max(fin - float(bottom[drop - 1]), 0.0)
            probs = probs[drop:]
            offset += drop
    return _trim(replace(side, offset=offset, probs=probs, finite_mass=fin, inf_mass=inf))


def _identity_side(pessimistic: bool, h: float) -> _Side:
    return _Side(pessimistic, h, 0, np.ones(1), 1.0, 0.0, (), (0.0, 0.0))


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


def _ctd_upper(p_up: FloatArray, qe_low: FloatArray, h: float) -> FloatArray:
    """Upper bound on the connect-the-dots mass sent to the right end of each bin.

    A loss ``L`` in ``(left, left + h]`` is split between ``left`` and ``left + h`` so that
    the P- and Q-masses are preserved: the right end gets ``(P - e^left Q) / (1 - e^-h)`` of
    the bin (Doroshenko et al. 2022, Sec. 3); ``qe_low`` is a lower bound on ``e^left Q``.
    As ``(1 - e^(eps - L))_+`` is convex in ``e^-L`` and the split preserves the mean of
    ``e^-L``, Jensen's inequality makes every ``delta(eps)`` (of the PLD and of its
    compositions) at least the original one.
    """
    qe = qe_low
    with np.errstate(over="ignore", invalid="ignore"):
        num = p_up - qe
        num = num + 4 * _U * (p_up + qe)
        b = num / (-math.expm1(-h)) * (1 + 8 * _U)
    b = np.where(np.isfinite(b), b, p_up)
    return np.clip(b, 0.0, p_up)


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
    if n > _MAX_BINS:
        raise _grid_error(
            "value_discretization_interval",
            h,
            (l_hi - l_lo) / (_MAX_BINS - 4),
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
    if span > _MAX_BINS:
        raise _grid_error(
            "value_discretization_interval",
            h,
            float(lu.max() - ll.min()) / (_MAX_BINS - 4),
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


# ---------------------------------------------------------------------------------------
# validation helpers


def _check_h(h: Any) -> float:
    return check_positive("value_discretization_interval", h)


def _check_tail(t: Any) -> float:
    return check_range("tail_mass", t, 0.0, 1e-3, low_open=True)


def _check_tilt(t: Any) -> float | None:
    if t is None:
        return None
    return check_range("tilt", t, 0.0, 1e4)


def _as_eps_array(eps: ArrayLike) -> tuple[FloatArray, bool]:
    scalar = np.ndim(eps) == 0
    if scalar:
        as_real("epsilon", eps, allow_inf=True)
    try:
        arr = np.atleast_1d(np.asarray(eps, dtype=np.float64))
    except (TypeError, ValueError):
        raise fail("epsilon", eps, "real numbers >= 0") from None
    if arr.ndim != 1:
        raise fail("epsilon", eps, "a scalar or a 1-D array of real numbers >= 0")
    bad = np.isnan(arr) | (arr < 0)
    if np.any(bad):
        raise fail("epsilon", float(arr[bad][0]), "a real number >= 0 (NaN is not allowed)")
    return arr, scalar


def _as_delta_array(delta: ArrayLike) -> tuple[FloatArray, bool]:
    scalar = np.ndim(delta) == 0
    if scalar:
        check_delta(delta)
    try:
        arr = np.atleast_1d(np.asarray(delta, dtype=np.float64))
    except (TypeError, ValueError):
        raise fail("delta", delta, "real numbers in (0, 1)") from None
    if arr.ndim != 1:
        raise fail("delta", delta, "a scalar or a 1-D array of numbers in (0, 1)")
    bad = ~((arr > 0) & (arr < 1))
    if np.any(bad):
        raise fail("delta", float(arr[bad][0]), "a number in (0, 1)")
    return arr, scalar


def _finish(lo: FloatArray, est: FloatArray, up: FloatArray, scalar: bool) -> PldBounds:
    est = np.clip(est, lo, up)
    if scalar:
        return PldBounds(float(lo[0]), float(est[0]), float(up[0]))
    return PldBounds(lo, est, up)


# ---------------------------------------------------------------------------------------
# public class


@dataclass(frozen=True, eq=False)
class PrivacyLossDistribution:
    """A discretised privacy loss distribution with rigorous upper and lower bounds.

    Immutable. Holds a pessimistic discretisation (losses rounded up, truncated tails at
    ``+inf``: its ``delta(eps)`` is an upper bound) and an optimistic one (losses rounded
    down, truncated mass deleted: a lower bound) on the grid ``k * h`` with
    ``h = value_discretization_interval``. Build one with a class-method constructor, compose
    with :meth:`compose` / :meth:`self_compose`, and query :meth:`delta_for_epsilon` /
    :meth:`epsilon_for_delta`, which return ``PldBounds(lower, estimate, upper)`` with
    ``lower <= truth <= upper``.

    The PLD is that of one ordered pair ``(P, Q)`` (see each constructor for which); the
    theory is Koskela, Jälkö & Honkela (2020), Gopi, Lee & Wutschitz (2021) and Doroshenko
    et al. (2022, "Connect the dots", Sec. 3 for pessimistic rounding).

    Example
    -------
    >>> rem = PrivacyLossDistribution.subsampled_gaussian(0.01, 1.0, direction="remove")
    >>> add = PrivacyLossDistribution.subsampled_gaussian(0.01, 1.0, direction="add")
    >>> eps = max(p.self_compose(1000).epsilon_for_delta(1e-5).upper for p in (rem, add))
    >>> 0.5 < eps < 2.0
    True
    """

    upper_side: _Side = field(repr=False)
    lower_side: _Side = field(repr=False)
    tail_mass: float = 1e-15
    description: str = ""
    # how to recompute both sides in extended precision (None: exact inputs or too large)
    _refine: Callable[[], tuple[_Side, _Side]] | None = field(
        default=None, repr=False, compare=False
    )
    _cache: dict[str, tuple[_Side, _Side]] = field(default_factory=dict, repr=False, compare=False)

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def _build(
        cls, sides: tuple[_Side, _Side], tail_mass: float, desc: str
    ) -> PrivacyLossDistribution:
        return cls(sides[0], sides[1], tail_mass, desc)

    @classmethod
    def identity(
        cls, *, value_discretization_interval: float = 1e-4, tail_mass: float = 1e-15
    ) -> PrivacyLossDistribution:
        """The PLD of a mechanism that reveals nothing (all mass at loss 0)."""
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        return cls._build(
            (_identity_side(True, h), _identity_side(False, h)), tail_mass, "identity"
        )

    @classmethod
    def gaussian(
        cls,
        noise_multiplier: float,
        *,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """Gaussian mechanism with sensitivity 1 and standard deviation ``noise_multiplier``.

        The pair is ``(N(0, s^2), N(1, s^2))`` (symmetric, so add and remove coincide); the
        loss is exactly ``N(mu^2/2, mu^2)`` with ``mu = 1/s`` (Balle & Wang 2018, Lemma 3;
        Dong, Roth & Su 2022, Gaussian DP). Both tails beyond ``tail_mass / 2`` are truncated
        (to ``+inf`` in the upper bound).

        Example
        -------
        >>> PrivacyLossDistribution.gaussian(2.0).delta_for_epsilon(1.0).upper < 0.02
        True
        """
        sigma = check_positive("noise_multiplier", noise_multiplier)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        mu = 1.0 / sigma
        z = float(-ndtri(tail_mass * _STEP_TAIL_FACTOR / 2))
        mean, sd = 0.5 * mu * mu, mu
        tails = _gaussian_cdf(mu)
        lo, hi = mean - z * sd, mean + z * sd
        if not math.isfinite(hi - lo):
            raise _grid_error("noise_multiplier", sigma, math.inf, "a value")
        with _NumericGuard("noise_multiplier", sigma):
            sides = _discretise(tails, lo, hi, h, 0.0)
        return cls._build(
            sides,
            tail_mass,
            f"gaussian(noise_multiplier={sigma:g})",
        )

    @classmethod
    def subsampled_gaussian(
        cls,
        sampling_rate: float,
        noise_multiplier: float,
        *,
        direction: Direction = "remove",
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """Poisson-subsampled Gaussian (rate ``q``, noise multiplier ``s``, sensitivity 1).

        Add/remove-one neighbours give two different ordered pairs; build both:

        * ``"remove"`` (the record is removed from the dataset that contains it):
          ``P = (1-q) N(0, s^2) + q N(1, s^2)``, ``Q = N(0, s^2)``;
        * ``"add"``: ``P = N(0, s^2)``, ``Q = (1-q) N(0, s^2) + q N(1, s^2)``.

        (dp_accounting's REMOVE / ADD, up to the reflection ``x -> -x``; Zhu, Dong & Wang
        2022, "Optimal accounting of DP via characteristic functions", Sec. 5, show both
        are needed.) The loss is monotone in ``x`` so each bin's mass is an exact mixture-CDF
        difference. ``q = 1`` gives :meth:`gaussian`, ``q = 0`` :meth:`identity`.

        Example
        -------
        >>> pld = PrivacyLossDistribution.subsampled_gaussian(0.1, 1.0, direction="add")
        >>> pld.delta_for_epsilon(0.5).upper < 1e-3
        True
        """
        q = check_probability("sampling_rate", sampling_rate)
        sigma = check_positive("noise_multiplier", noise_multiplier)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        if direction not in ("remove", "add"):
            raise fail("direction", direction, "'remove' or 'add'")
        if q == 1.0:
            return cls.gaussian(sigma, value_discretization_interval=h, tail_mass=tail_mass)
        if q == 0.0:
            return cls.identity(value_discretization_interval=h, tail_mass=tail_mass)
        z = float(-ndtri(tail_mass * _STEP_TAIL_FACTOR / 2))
        tails = _sub_gaussian_cdf(q, sigma, direction)

        def loss_remove(x: float) -> float:  # increasing in x
            with np.errstate(over="ignore"):
                return float(
                    np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * sigma**2))
                )

        with _NumericGuard("noise_multiplier", sigma):
            # P-quantiles of x in both directions
            if direction == "remove":
                lo, hi = loss_remove(-sigma * z), loss_remove(1.0 + sigma * z)
            else:
                lo, hi = -loss_remove(sigma * z), -loss_remove(-sigma * z)
            sides = _discretise(tails, lo, hi, h, 0.0)
        return cls._build(
            sides,
            tail_mass,
            f"subsampled_gaussian(q={q:g}, noise_multiplier={sigma:g}, {direction})",
        )

    @classmethod
    def laplace(
        cls, scale: float, *, value_discretization_interval: float = 1e-4, tail_mass: float = 1e-15
    ) -> PrivacyLossDistribution:
        """Laplace mechanism, ``scale = b / Delta_1``: the pair ``(Lap(0, b), Lap(1, b))``.

        The loss lies in ``[-1/b, 1/b]`` with atoms at both ends (Koskela et al. 2020,
        Sec. 6.1); symmetric, so add and remove coincide.
        """
        b = check_positive("scale", scale)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        tails = _laplace_cdf(b)
        return cls._build(
            _discretise(tails, -1.0 / b, 1.0 / b, h, 0.0),
            tail_mass,
            f"laplace(scale={b:g})",
        )

    @classmethod
    def randomized_response(
        cls, p: float, *, value_discretization_interval: float = 1e-4, tail_mass: float = 1e-15
    ) -> PrivacyLossDistribution:
        """Binary randomized response reporting the truth with probability ``p >= 1/2``.

        Loss ``log(p/(1-p))`` with probability ``p`` and its negative otherwise (Mironov 2017,
        Table II's mechanism). ``p = 1`` puts all mass at ``+inf``.
        """
        pr = check_range("p", p, 0.5, 1.0)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        if pr == 1.0:
            losses, probs, inf = np.zeros(0), np.zeros(0), 1.0
        else:
            ll = math.log(pr) - math.log1p(-pr)
            losses, probs, inf = np.array([ll, -ll]), np.array([pr, 1.0 - pr]), 0.0
        tol = 4 * _U * (np.abs(losses) + 1.0)
        return cls._build(
            _from_atoms(losses, probs, inf, h, tol),
            tail_mass,
            f"randomized_response(p={pr:g})",
        )

    @classmethod
    def approx_dp(
        cls,
        epsilon: float,
        delta: float = 0.0,
        *,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """Any ``(epsilon, delta)``-DP mechanism, through its tight dominating pair.

        The four-point pair of Kairouz, Oh & Viswanath (2015, Thm. 2.1 / Eq. (3)): loss
        ``+inf`` w.p. ``delta``, ``epsilon`` w.p. ``(1-delta) e^eps/(1+e^eps)``, ``-epsilon``
        w.p. ``(1-delta)/(1+e^eps)``. Every ``(eps, delta)``-DP mechanism is
        post-processing of it, so its composition bounds theirs (Murtagh & Vadhan 2016).
        """
        eps = check_range("epsilon", epsilon, 0.0, math.inf)
        dlt = check_range("delta", delta, 0.0, 1.0)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        if math.isinf(eps) or dlt == 1.0:
            losses, probs, inf = np.zeros(0), np.zeros(0), 1.0
        else:
            p_hi = (1.0 - dlt) / (1.0 + math.exp(-eps))
            p_lo = (1.0 - dlt) / (1.0 + math.exp(eps))
            losses, probs, inf = np.array([eps, -eps]), np.array([p_hi, p_lo]), dlt
        tol = 4 * _U * (np.abs(losses) + 1.0)
        return cls._build(
            _from_atoms(losses, probs, inf, h, tol),
            tail_mass,
            f"approx_dp(epsilon={eps:g}, delta={dlt:g})",
        )

    @classmethod
    def discrete_laplace(
        cls,
        scale: float,
        sensitivity: int = 1,
        *,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """Discrete Laplace ``P(k) ~ exp(-|k|/t)`` on the integers, integer sensitivity.

        Pair ``(DLap(0, t), DLap(Delta, t))``: the loss is ``(|k - Delta| - |k|)/t`` taking
        ``2 Delta + 1`` values in ``[-Delta/t, Delta/t]`` (Canonne, Kamath & Steinke 2020).
        """
        t = check_positive("scale", scale)
        d = check_int("sensitivity", sensitivity, 1)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        # P[k <= 0] = 1/(1 + e^{-1/t}), P[k >= d] = e^{-d/t}/(1 + e^{-1/t}),
        # P[k] = tanh(1/(2t)) e^{-|k|/t} for 0 < k < d
        log_norm = -float(np.logaddexp(0.0, -1.0 / t))
        ks = np.arange(1, d, dtype=np.float64)
        log_mid = math.log(math.tanh(0.5 / t)) - ks / t
        losses = np.concatenate(([d / t], (d - 2 * ks) / t, [-d / t]))
        probs = np.exp(np.concatenate(([log_norm], log_mid, [log_norm - d / t])))
        tol = 4 * _U * (np.abs(losses) + 1.0)
        return cls._build(
            _from_atoms(losses, probs, 0.0, h, tol),
            tail_mass,
            f"discrete_laplace(scale={t:g}, sensitivity={d})",
        )

    @classmethod
    def discrete_gaussian(
        cls,
        sigma: float,
        sensitivity: int = 1,
        *,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """Discrete Gaussian ``P(k) ~ exp(-k^2 / (2 sigma^2))`` on the integers.

        Pair ``(DG(0, s), DG(Delta, s))`` with integer sensitivity ``Delta``: the loss at ``k``
        is ``(Delta^2 - 2 k Delta) / (2 sigma^2)`` (Canonne, Kamath & Steinke 2020, Sec. 4;
        symmetric, so add and remove coincide). The support is enumerated on
        ``|k| <= 40 sigma + 10 + Delta``; the mass beyond (below ``e^-800``, bounded by a
        geometric series) goes to ``+inf`` in the upper bound and is dropped in the lower.
        """
        s = check_positive("sigma", sigma)
        d = check_int("sensitivity", sensitivity, 1)
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        big_k = math.ceil(40.0 * s + 10.0) + d
        if 2 * big_k + 1 > _MAX_BINS:
            raise fail("sigma", s, f"a value <= {(_MAX_BINS / 2 - 10 - d) / 40:.4g}")
        k = np.arange(-big_k, big_k + 1, dtype=np.float64)
        log_w = -(k * k) / (2.0 * s * s)
        log_p = log_w - float(logsumexp(log_w))
        losses = (d * d - 2.0 * k * d) / (2.0 * s * s)
        # mass beyond |k| > K: 2 sum_{j>K} e^{-j^2/2s^2} <= 2 e^{-(K+1)^2/2s^2}/(1 - e^{-(K+1)/s^2})
        log_tail = (
            math.log(2.0)
            - (big_k + 1) ** 2 / (2.0 * s * s)
            - math.log(-math.expm1(-(big_k + 1) / (s * s)))
        )
        tail = math.exp(log_tail - float(logsumexp(log_w)))
        tol = 8 * _U * (np.abs(losses) + 1.0)
        upper, lower = _from_atoms(losses, np.exp(log_p), 0.0, h, tol)
        upper = replace(upper, inf_mass=upper.inf_mass + tail * (1 + 1e-6))
        return cls._build(
            (upper, lower), tail_mass, f"discrete_gaussian(sigma={s:g}, sensitivity={d})"
        )

    @classmethod
    def from_distributions(
        cls,
        p: ArrayLike,
        q: ArrayLike,
        *,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
    ) -> PrivacyLossDistribution:
        """The PLD of an explicit pair of discrete distributions ``(P, Q)`` on one support.

        ``p`` and ``q`` are probability vectors (non-negative, each summing to 1 within 1e-9).
        Outcomes with ``q = 0 < p`` have loss ``+inf``.
        """
        h = _check_h(value_discretization_interval)
        tail_mass = _check_tail(tail_mass)
        pa = np.asarray(p, dtype=np.float64)
        qa = np.asarray(q, dtype=np.float64)
        for name, arr in (("p", pa), ("q", qa)):
            if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise fail(name, p if name == "p" else q, "a 1-D vector of probabilities")
            if abs(math.fsum(arr.tolist()) - 1.0) > 1e-9:
                raise fail(name, p if name == "p" else q, "probabilities summing to 1")
        if pa.shape != qa.shape:
            raise fail("q", q, f"a vector of the same length as p ({pa.size})")
        pos = pa > 0
        inf = math.fsum(pa[pos & (qa == 0)].tolist())
        both = pos & (qa > 0)
        with np.errstate(divide="ignore"):
            losses = np.log(pa[both]) - np.log(qa[both])
        probs = pa[both]
        tol = 4 * _U * (np.abs(np.log(pa[both])) + np.abs(np.log(qa[both])) + 1.0)
        return cls._build(_from_atoms(losses, probs, inf, h, tol), tail_mass, "from_distributions")

    # -- properties -----------------------------------------------------------------------
    @property
    def value_discretization_interval(self) -> float:
        """Grid spacing of the losses: the step's ``h``, or a power-of-two multiple of it
        after a self-composition wider than ``max_bins`` points (see :meth:`self_compose`)."""
        return self.upper_side.h

    @property
    def infinity_mass(self) -> float:
        """Mass at ``+inf`` in the pessimistic discretisation (true mass plus truncation)."""
        return self.upper_side.inf_mass

    @property
    def support_size(self) -> int:
        """Number of grid points stored by the pessimistic discretisation."""
        return self.upper_side.size

    def pmf(self, side: Literal["upper", "lower"] = "upper") -> tuple[FloatArray, FloatArray]:
        """``(losses, masses)`` of one discretisation (read-only copies)."""
        if side not in ("upper", "lower"):
            raise fail("side", side, "'upper' or 'lower'")
        s = self.upper_side if side == "upper" else self.lower_side
        return s.losses.copy(), s.probs.copy()

    # -- composition ----------------------------------------------------------------------
    def compose(
        self, other: PrivacyLossDistribution, *, tilt: float | None = None
    ) -> PrivacyLossDistribution:
        """PLD of running ``self`` and ``other`` independently (losses add; FFT convolution).

        Both must use the same grid spacing (or one an integer multiple of the other, in
        which case the finer one is coarsened conservatively).
        """
        if not isinstance(other, PrivacyLossDistribution):
            raise fail("other", other, "a PrivacyLossDistribution")
        tl = _check_tilt(tilt)
        tm = min(self.tail_mass, other.tail_mass)
        with _NumericGuard("other", other):
            up = self.upper_side.compose(other.upper_side, tm, tl)
            lo = self.lower_side.compose(other.lower_side, tm, tl)

        def refine() -> tuple[_Side, _Side]:
            (au, al), (bu, bl) = self._precise_sides(), other._precise_sides()
            return au.compose(bu, tm, tl, True), al.compose(bl, tm, tl, True)

        small = max(up.fft_len, lo.fft_len) <= _EXT_MAX_POINTS
        return PrivacyLossDistribution(
            up,
            lo,
            tm,
            f"({self.description}) + ({other.description})",
            refine if small and _EXT_USEFUL else None,
        )

    def self_compose(
        self, count: int, *, tilt: float | None = None, max_bins: int = DEFAULT_MAX_BINS
    ) -> PrivacyLossDistribution:
        """PLD of ``count`` independent runs, by FFT powers: cost ``O(log count)`` FFTs.

        If the composed distribution fits in ``max_bins`` grid points (Chernoff window: at
        most ``tail_mass`` escapes it, charged to ``+inf`` in the upper bound), it is one FFT
        raised to the power ``count`` on this PLD's grid, as in earlier versions. Otherwise a
        ladder: one FFT power ``step^t0`` on the step's grid (the largest ``t0`` whose window
        fits ``max(max_bins, 2 * support_size)`` points), then for each base-``m`` digit
        ``d`` of the rest of the count (``m <= 16``), ``A <- coarsen(A)^m * step^d``,
        coarsening by powers of two so that the level windows stay within ``max_bins / 4``
        points. The spread of the composed loss grows like ``sqrt(count)``, so the grid
        grows with it (the result's :attr:`value_discretization_interval`) and the number of
        grid points per standard deviation stays roughly constant. Coarsening is rigorous
        (connect-the-dots above, mean-preserving rounding below) and happens only once the
        inputs hold enough steps that it adds at most ~1/8 of the fine grid's own
        discretisation error (which grows like ``count * h^2``). ``max_bins`` (an integer in
        ``[1024, 2**22]``, default ``2**17``) trades time for accuracy; ``2**22`` switches the
        ladder off. ``tilt`` fixes the exponential tilt of the round-off control (default:
        chosen automatically). See docs/pld.md, "Large counts".

        Example
        -------
        >>> step = PrivacyLossDistribution.subsampled_gaussian(256 / 60000, 1.1)
        >>> big = step.self_compose(10**6)  # a few FFTs of <= 2**17 points
        >>> big.value_discretization_interval > 1e-4 and big.support_size <= 2**17
        True
        """
        n = check_int("count", count, 0)
        tl = _check_tilt(tilt)
        mb = check_int("max_bins", max_bins, 1024)
        if mb > 1 << 22:
            raise fail("max_bins", max_bins, f"an integer in [1024, {1 << 22}]")
        if n > _MAX_COUNT:
            raise _grid_error("count", count, math.inf, f"a count <= {_MAX_COUNT:.0e}")
        with _NumericGuard("count", count):
            return self._self_compose(n, tl, mb)

    def _self_compose(self, n: int, tl: float | None, mb: int) -> PrivacyLossDistribution:
        plan = _plan(self.upper_side, n, self.tail_mass, mb)
        tm = self.tail_mass

        def refine() -> tuple[_Side, _Side]:
            u, lo = self._precise_sides()
            return u.self_compose(plan, tm, tl, True), lo.self_compose(plan, tm, tl, True)

        up = self.upper_side.self_compose(plan, tm, tl)
        lo = self.lower_side.self_compose(plan, tm, tl)
        small = 0 < max(up.fft_len, lo.fft_len) <= _EXT_MAX_POINTS
        return PrivacyLossDistribution(
            up, lo, tm, f"{n} x ({self.description})", refine if small and _EXT_USEFUL else None
        )

    def _precise_sides(self) -> tuple[_Side, _Side]:
        """Both sides recomputed with extended-precision FFTs (cached), or the stored ones
        when they came from exact inputs or are too large to redo."""
        if self._refine is None:
            return self.upper_side, self.lower_side
        if "ext" not in self._cache:
            self._cache["ext"] = self._refine()
        return self._cache["ext"]

    def _noisy(self, eps_up: FloatArray, eps_lo: FloatArray, delta: FloatArray) -> FloatArray:
        """Queries whose tracked float64 round-off exceeds ``_NOISE_RATIO`` of their delta
        (at the reported upper / lower epsilon): their answer is recomputed with
        extended-precision FFTs (the heavy-tailed compositions of tiny sampling rates put
        small deltas where the loss distribution holds little mass and no exponential tilt
        helps, so the FFT's round-off, relative to the total mass, would set the bound)."""
        if self._refine is None:
            return np.zeros(delta.shape, dtype=bool)
        fu = np.isfinite(eps_up)
        fl = np.isfinite(eps_lo)
        bad = np.zeros(delta.shape, dtype=bool)
        if np.any(fu):
            bad[fu] |= self.upper_side.error_at(eps_up[fu]) > _NOISE_RATIO * delta[fu]
        if np.any(fl):
            bad[fl] |= self.lower_side.error_at(eps_lo[fl]) > _NOISE_RATIO * delta[fl]
        return bad

    # -- queries --------------------------------------------------------------------------
    def delta_for_epsilon(self, epsilon: ArrayLike) -> PldBounds:
        """Hockey-stick divergence ``delta(eps) = E[(1 - e^(eps - L))_+] + P[L = inf]``.

        Vectorised over ``epsilon >= 0``. Returns ``PldBounds(lower, estimate, upper)``: the
        optimistic and pessimistic discretisations' deltas with all tracked numerical error
        subtracted / added, and their midpoint. Scalars in, floats out.
        """
        eps, scalar = _as_eps_array(epsilon)
        up = self.upper_side.delta_bound(eps)
        lo = self.lower_side.delta_bound(eps)
        est = self.upper_side.delta_raw(eps) + self.upper_side.inf_mass
        bad = self._noisy(eps, eps, np.maximum(up, 1e-300))
        if np.any(bad):
            pu, pl = self._precise_sides()
            up[bad] = np.minimum(up[bad], pu.delta_bound(eps[bad]))
            lo[bad] = np.maximum(lo[bad], pl.delta_bound(eps[bad]))
        lo = np.minimum(lo, up)
        return _finish(lo, est, np.minimum(up, 1.0), scalar)

    def epsilon_for_delta(self, delta: ArrayLike) -> PldBounds:
        """The smallest ``eps >= 0`` with ``delta(eps) <= delta``, bracketed rigorously.

        ``upper`` is a point where the pessimistic bound is verified to be ``<= delta``
        (exact search over the grid, then bisection of the closed form inside the cell,
        ending on the conservative side); ``lower`` a point where the optimistic bound is
        still ``> delta``. ``+inf`` when no finite ``eps`` achieves ``delta``.
        """
        d, scalar = _as_delta_array(delta)
        up = self.upper_side.epsilon_bound(d)
        lo = self.lower_side.epsilon_bound(d)
        bad = self._noisy(up, lo, d)
        if np.any(bad):
            pu, pl = self._precise_sides()
            up[bad] = np.minimum(up[bad], pu.epsilon_bound(d[bad]))
            lo[bad] = np.maximum(lo[bad], pl.epsilon_bound(d[bad]))
        lo = np.minimum(lo, up)
        return _finish(lo, self.upper_side.epsilon_raw(d), up, scalar)

    def __repr__(self) -> str:
        return (
            f"PrivacyLossDistribution({self.description}, h={self.value_discretization_interval:g},"
            f" points={self.support_size}, infinity_mass={self.infinity_mass:.3g})"
        )
