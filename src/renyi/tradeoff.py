"""f-DP outputs: the trade-off curve of membership inference, and a μ-GDP summary.

A membership-inference attack is a test between "the record is in" (``P``) and "it is out"
(``Q``). Its false-positive rate (FPR, type I error α) and true-positive rate (TPR = 1 - β)
are limited by the mechanism's trade-off function ``f(α) = inf{β}`` (Dong, Roth & Su 2022).
Every ``(ε, δ(ε))`` point of the privacy profile implies
``f(α) >= max(0, 1 - δ - e^ε α, e^-ε (1 - δ - α))`` (their Prop. 2.12 / Kairouz et al.
2015), and the profile for all ε gives ``f`` exactly (the envelope). So from the upper bounds
``δ(ε)`` an accountant proves, on a grid of ε::

    TPR(α) <= min_ε min(1, δ(ε) + e^ε α, 1 - e^-ε (1 - δ(ε) - α))

is an **upper bound on the power of any attack** at that FPR (a coarser grid or a larger δ
only raises it: the direction is always safe). Both adjacency directions are bounded and the
larger TPR is reported. The PLD accountant gives the tightest curve; the RDP accountant's
curve uses its RDP → (ε, δ) conversion.

μ-GDP (Dong, Roth & Su 2022): the mechanism is μ-GDP iff ``δ(ε) <= δ_μ(ε)`` (Gaussian
profile) for every ε. :func:`gdp_mu` returns the largest, over the ε grid, of the μ each
``(ε, δ(ε))`` point needs: a **lower estimate** of the smallest certifying μ (the grid may
miss the supremum; the mechanism need not be exactly Gaussian), i.e. ``G_μ`` may be slightly
optimistic. Its ``at_delta`` variant matches ε at one δ (the "effective μ").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import norm

from renyi._validation import check_delta, check_nonnegative, fail
from renyi.analysis.closed_forms import gaussian_mu

__all__ = [
    "DEFAULT_FPRS",
    "GdpEstimate",
    "TradeoffCurve",
    "gaussian_tradeoff_tpr",
    "gdp_mu",
    "tpr_from_profile",
    "tradeoff_curve",
]

FloatArray = NDArray[np.float64]

DEFAULT_FPRS = (1e-3, 1e-2, 0.1)
"""FPRs printed by ``renyi epsilon --tradeoff``."""


@dataclass(frozen=True)
class TradeoffCurve:
    """TPR upper bounds at ``fpr`` (arrays), from ``accountant``'s privacy profile."""

    fpr: FloatArray
    tpr: FloatArray
    accountant: str

    def at(self, fpr: float) -> float:
        """The TPR bound at one FPR (interpolated upward between grid points)."""
        i = int(np.searchsorted(self.fpr, fpr, side="left"))
        if i < self.fpr.size and self.fpr[i] == fpr:
            return float(self.tpr[i])
        return float(self.tpr[min(i, self.fpr.size - 1)])

    def to_list(self) -> list[dict[str, float]]:
        return [{"fpr": float(a), "tpr": float(b)} for a, b in zip(self.fpr, self.tpr, strict=True)]


@dataclass(frozen=True)
class GdpEstimate:
    """μ of a Gaussian trade-off curve summarising the mechanism, with how it errs."""

    mu: float
    method: str
    direction: str


def _rates(name: str, value: Any, *, one_d: bool = False) -> FloatArray:
    """``value`` as an array of rates in ``[0, 1]`` (no NaN), 1-D and non-empty if ``one_d``."""
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise fail(name, value, "rates in [0, 1]") from None
    if one_d and (a.ndim != 1 or a.size == 0):
        raise fail(name, value, "a non-empty 1-D array of rates in [0, 1]")
    if np.any(np.isnan(a)) or np.any((a < 0) | (a > 1)):
        raise fail(name, value, "rates in [0, 1] (no NaN)")
    return a


def gaussian_tradeoff_tpr(mu: float, fpr: ArrayLike) -> FloatArray:
    """The exact TPR ``1 - G_μ(α) = Φ(μ - Φ⁻¹(1 - α))`` of μ-GDP (Dong, Roth & Su 2022).

    ``mu >= 0`` (``inf`` allowed: TPR 1 at every FPR > 0); ``fpr`` rates in ``[0, 1]``, any
    shape (the result has its shape).

    Example::

        >>> float(gaussian_tradeoff_tpr(1.0, 0.05)) > 0.05
        True
    """
    m = check_nonnegative("mu", mu, allow_inf=True)
    a = _rates("fpr", fpr)
    if m == math.inf:  # perfectly separable: TPR 1 even at FPR 0
        return np.ones_like(a)
    out: FloatArray = norm.cdf(m - norm.isf(a))
    return out


def tpr_from_profile(epsilons: ArrayLike, deltas: ArrayLike, fpr: ArrayLike) -> FloatArray:
    """Upper bound on TPR at each ``fpr`` from points ``(ε_i, δ_i)`` of a privacy profile
    (each an upper bound): ``min_i min(1, δ_i + e^ε_i α, 1 - e^-ε_i (1 - δ_i - α))``.

    ``epsilons`` (``>= 0``, ``inf`` allowed) and ``deltas`` (in ``[0, 1]``) are 1-D arrays of
    the same length (one δ per ε: nothing is broadcast); ``fpr`` a 1-D array of rates.
    """
    try:
        e1 = np.asarray(epsilons, dtype=np.float64)
        d1 = np.asarray(deltas, dtype=np.float64)
    except (TypeError, ValueError):
        raise fail("epsilons", epsilons, "1-D arrays of ε >= 0 and δ in [0, 1]") from None
    if e1.ndim != 1 or e1.size == 0 or np.any(np.isnan(e1)) or np.any(e1 < 0):
        raise fail("epsilons", epsilons, "a non-empty 1-D array of ε >= 0 (no NaN)")
    if d1.shape != e1.shape:
        raise fail("deltas", deltas, f"one δ per ε: a 1-D array of length {e1.size}")
    d1 = _rates("deltas", d1)
    e, d = e1[:, None], d1[:, None]
    a = _rates("fpr", fpr, one_d=True)[None, :]
    with np.errstate(over="ignore"):
        first = d + np.exp(e) * a
    second = 1.0 - np.exp(-e) * np.maximum(1.0 - d - a, 0.0)
    out: FloatArray = np.clip(np.minimum(first, second).min(axis=0), 0.0, 1.0)
    return np.maximum(out, np.asarray(fpr, dtype=np.float64))


def _check_accountant(accountant: Any) -> None:
    """An accountant instance (not a name such as ``"pld"``: it must hold the events)."""
    from renyi.accountants import Accountant

    if not isinstance(accountant, Accountant):
        raise fail(
            "accountant",
            accountant,
            "an Accountant with the events composed, e.g. PldAccountant().compose(event, steps)",
        )


def _profile(accountant: Any, epsilons: FloatArray) -> FloatArray:
    """Upper bounds of δ(ε) from an accountant (worst direction)."""
    from renyi.accountants import PldAccountant

    if isinstance(accountant, PldAccountant):
        out = np.zeros_like(epsilons)
        for p in accountant.plds():
            out = np.maximum(out, np.asarray(p.delta_for_epsilon(epsilons).upper, dtype=float))
        return out
    import warnings

    from renyi.errors import OrderAtGridEdgeWarning

    with warnings.catch_warnings():  # scanning ε reaches the grid's edge orders by design
        warnings.simplefilter("ignore", OrderAtGridEdgeWarning)
        return np.array([accountant.delta(float(x)).delta for x in epsilons])


def _eps_grid(accountant: Any) -> FloatArray:
    top = float(accountant.epsilon(1e-12).epsilon)
    if not math.isfinite(top) or top <= 0:
        top = float(accountant.epsilon(1e-6).epsilon)
    top = top if math.isfinite(top) and top > 0 else 50.0
    grid = np.unique(np.concatenate([np.linspace(0.0, top, 300), np.geomspace(1e-4, top, 100)]))
    return grid


def tradeoff_curve(accountant: Any, fpr: ArrayLike | None = None) -> TradeoffCurve:
    """TPR upper bounds of any membership-inference attack at ``fpr`` (default: a grid from
    1e-6 to 1) for what ``accountant`` (PLD or RDP, with events composed) has recorded."""
    a = np.geomspace(1e-6, 1.0, 200) if fpr is None else _rates("fpr", fpr, one_d=True)
    _check_accountant(accountant)
    eps = _eps_grid(accountant)
    tpr = tpr_from_profile(eps, _profile(accountant, eps), a)
    return TradeoffCurve(a, tpr, accountant.name)


def gdp_mu(accountant: Any, delta: float | None = None) -> GdpEstimate:
    """A μ-GDP summary of ``accountant``'s composition.

    Without ``delta``: the largest over an ε grid of ``gaussian_mu(ε, δ(ε))`` — a lower
    estimate of the smallest μ certifying μ-GDP. With ``delta``: the μ whose Gaussian has
    the same ε at that δ (not a bound at other δ).
    """
    _check_accountant(accountant)
    if delta is not None:
        delta = check_delta(delta)
        eps = float(accountant.epsilon(delta).epsilon)
        return GdpEstimate(
            float(gaussian_mu(eps, delta)) if eps > 0 else 0.0,
            f"matches epsilon at delta={delta:g}",
            "neither: exact at this delta only",
        )
    grid = _eps_grid(accountant)
    deltas = _profile(accountant, grid)
    mus = [
        gaussian_mu(float(e), float(d))
        for e, d in zip(grid.tolist(), deltas.tolist(), strict=True)
        if 0 < d < 1
    ]
    mu = float(max(mus)) if mus else math.inf
    return GdpEstimate(
        mu,
        "largest mu needed over an epsilon grid",
        "lower estimate of the smallest certifying mu (G_mu may be slightly optimistic)",
    )
