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

from renyi._validation import check_delta, fail
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


def gaussian_tradeoff_tpr(mu: float, fpr: ArrayLike) -> FloatArray:
    """The exact TPR ``1 - G_μ(α) = Φ(μ - Φ⁻¹(1 - α))`` of μ-GDP (Dong, Roth & Su 2022)."""
    a = np.asarray(fpr, dtype=np.float64)
    out: FloatArray = norm.cdf(mu - norm.isf(a))
    return out


def tpr_from_profile(epsilons: ArrayLike, deltas: ArrayLike, fpr: ArrayLike) -> FloatArray:
    """Upper bound on TPR at each ``fpr`` from points ``(ε_i, δ_i)`` of a privacy profile
    (each an upper bound): ``min_i min(1, δ_i + e^ε_i α, 1 - e^-ε_i (1 - δ_i - α))``."""
    e = np.asarray(epsilons, dtype=np.float64)[:, None]
    d = np.minimum(np.asarray(deltas, dtype=np.float64), 1.0)[:, None]
    a = np.asarray(fpr, dtype=np.float64)[None, :]
    if np.any(e < 0) or np.any(np.isnan(e)) or np.any(d < 0):
        raise fail("epsilons", epsilons, "ε >= 0 with δ in [0, 1]")
    with np.errstate(over="ignore"):
        first = d + np.exp(e) * a
    second = 1.0 - np.exp(-e) * np.maximum(1.0 - d - a, 0.0)
    out: FloatArray = np.clip(np.minimum(first, second).min(axis=0), 0.0, 1.0)
    return np.maximum(out, np.asarray(fpr, dtype=np.float64))


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
    a = np.geomspace(1e-6, 1.0, 200) if fpr is None else np.asarray(fpr, dtype=np.float64)
    if a.ndim != 1 or a.size == 0 or np.any((a < 0) | (a > 1)) or np.any(np.isnan(a)):
        raise fail("fpr", fpr, "false-positive rates in [0, 1]")
    eps = _eps_grid(accountant)
    tpr = tpr_from_profile(eps, _profile(accountant, eps), a)
    return TradeoffCurve(a, tpr, accountant.name)


def gdp_mu(accountant: Any, delta: float | None = None) -> GdpEstimate:
    """A μ-GDP summary of ``accountant``'s composition.

    Without ``delta``: the largest over an ε grid of ``gaussian_mu(ε, δ(ε))`` — a lower
    estimate of the smallest μ certifying μ-GDP. With ``delta``: the μ whose Gaussian has
    the same ε at that δ (not a bound at other δ).
    """
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
