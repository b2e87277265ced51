"""Types, constants and round-off-aware sums shared by the PLD modules."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import NDArray

Direction = Literal["remove", "add"]
FloatArray = NDArray[np.float64]
# the exponential tilt(s) of a composition's round-off control: None picks them (see
# _fft._tilts); internally a tuple runs several (the split of heavy-tailed steps)
Tilt = float | tuple[float, ...] | None

_U = float(np.finfo(np.float64).eps)  # 2.2e-16, unit round-off (times 2)
# extended precision (x87 80-bit long double on x86-64: 1.1e-19; equal to _U where long
# double is double): FFT powers are redone in it when float64 round-off would dominate delta
_EXT = np.longdouble
_U_EXT = float(np.finfo(_EXT).eps)
_EXT_USEFUL = _U_EXT < _U / 16
_NOISE_RATIO = 1e-4  # a query whose round-off bound exceeds this fraction of delta ...
_EXT_MAX_POINTS = 1 << 21  # ... is redone in extended precision if its FFTs were this short
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
