"""Private selection: the RDP of running a private algorithm a random number of times.

Hyperparameter tuning runs a private training ``K`` times (each run with hyperparameters
drawn at random from a fixed search distribution) and publishes only the best run. If ``K``
is fixed, the whole procedure costs ``K`` runs. Papernot & Steinke (ICLR 2022, "Hyperparameter
tuning with Rényi differential privacy") show that if ``K`` is itself random, drawn from a
truncated negative binomial or a Poisson distribution, the procedure costs little more than
one run. This module holds the distributions of ``K`` and the two theorems:

* **Theorem 2** (truncated negative binomial ``D_{η,γ}``, ``η ≥ 0``: logarithmic for
  ``η = 0``, geometric for ``η = 1``): if one run is ``(λ, ε)``-RDP and ``(λ̂, ε̂)``-RDP, the
  selection is ``(λ, ε')``-RDP with

      ε' = ε + (1+η)(1 - 1/λ̂) ε̂ + (1+η) log(1/γ) / λ̂ + log E[K] / (λ - 1);

* **Theorem 6** (``K ~ Poisson(μ)``): if one run is ``(λ, ε)``-RDP and ``(ε̂, δ̂)``-DP with
  ``e^ε̂ ≤ 1 + 1/(λ-1)``, the selection is ``(λ, ε + μ δ̂ + log μ / (λ - 1))``-RDP.

Both are applied to a curve on a grid of orders: ``λ̂`` is optimised over the grid, ``δ̂``
comes from the tightest RDP → (ε, δ) conversion we have (:func:`renyi.conversions.rdp_to_delta`),
and monotonicity of RDP in the order carries the smallest value at a higher order down.
The guarantee holds for the neighbouring relation of the single run, whichever it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy
from numpy.typing import ArrayLike, NDArray

from renyi._validation import as_real, fail
from renyi.analysis.conversions import _curve, rdp_to_delta
from renyi.random import get_source

__all__ = ["RepetitionDistribution", "repeat_and_select_rdp"]


def _tnb_mean(shape: float, gamma: float) -> float:
    """E[K] for the truncated negative binomial D_{η,γ} (Papernot & Steinke, Sec. 2)."""
    if gamma >= 1.0:
        return 1.0
    if shape == 0.0:  # logarithmic: (1-γ) / (γ log(1/γ))
        return (1.0 - gamma) / (gamma * -math.log(gamma))
    # η (1-γ) / (γ (1 - γ^η)); -expm1(η log γ) = 1 - γ^η without cancellation
    return shape * (1.0 - gamma) / (gamma * -math.expm1(shape * math.log(gamma)))


@dataclass(frozen=True)
class RepetitionDistribution:
    """The distribution of the number of runs ``K`` of a private selection.

    ``shape = inf`` is the Poisson distribution with mean ``mean >= 1`` (``K = 0`` possible: the
    procedure then outputs nothing); a finite ``shape = η ≥ 0`` is the truncated negative
    binomial ``D_{η,γ}`` on ``K ≥ 1`` (``η = 0`` logarithmic, ``η = 1`` geometric) whose ``γ``
    is solved from ``mean``. The accounting uses the exact mean of the distribution that is
    sampled (``γ`` fixed once), so sampling and accounting cannot disagree.

    Example:
        >>> d = RepetitionDistribution(mean=10.0, shape=1.0)  # geometric
        >>> round(d.gamma, 6), round(d.mean, 9)
        (0.1, 10.0)
    """

    mean: float
    shape: float = 1.0

    def __post_init__(self) -> None:
        shape = as_real("shape", self.shape, allow_inf=True)
        if math.isnan(shape) or shape < 0:
            raise fail("shape", self.shape, "a real number >= 0 (inf for Poisson)")
        mean = as_real("mean", self.mean)
        # Theorem 6 needs μ >= 1 (log μ < 0 would give a bound below the single run's).
        ok = mean >= 1.0 if math.isinf(shape) else mean > 1.0
        if not (math.isfinite(mean) and ok) or mean > 1e12:
            kind = ">= 1 (Poisson)" if math.isinf(shape) else "> 1"
            raise fail("mean", self.mean, f"a finite mean number of runs {kind} and <= 1e12")
        object.__setattr__(self, "shape", shape)
        if math.isinf(shape):
            object.__setattr__(self, "mean", mean)
            object.__setattr__(self, "_gamma", math.nan)
            return

        # E[K] decreases from +inf (γ -> 0) to 1 (γ -> 1); solve in log γ.
        def gap(log_g: float) -> float:
            return math.log(_tnb_mean(shape, math.exp(log_g))) - math.log(mean)

        lo = -1.0
        while gap(lo) < 0:
            lo *= 2.0
        log_g = scipy.optimize.brentq(gap, lo, -1e-300, xtol=1e-15, rtol=1e-15)
        gamma = math.exp(log_g)
        object.__setattr__(self, "_gamma", gamma)
        object.__setattr__(self, "mean", _tnb_mean(shape, gamma))  # the mean actually sampled

    @property
    def gamma(self) -> float:
        """The ``γ`` of ``D_{η,γ}`` (NaN for Poisson)."""
        return float(self._gamma)  # type: ignore[attr-defined]

    @property
    def is_poisson(self) -> bool:
        return math.isinf(self.shape)

    def log_pmf(self, k: ArrayLike) -> NDArray[np.float64]:
        """``log P[K = k]`` for integers ``k`` (``-inf`` outside the support)."""
        from scipy import special

        kk = np.asarray(k, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.is_poisson:
                mu = self.mean
                out = kk * math.log(mu) - mu - special.gammaln(kk + 1.0)
                return np.where(kk >= 0, out, -np.inf)
            g, eta = self.gamma, self.shape
            if eta == 0.0:
                out = kk * math.log1p(-g) - np.log(kk) - math.log(-math.log(g))
            else:
                # (1-γ)^k Γ(k+η) / (Γ(η) k!) / (γ^-η - 1)
                norm = math.log(math.expm1(-eta * math.log(g)))
                out = (
                    kk * math.log1p(-g)
                    + special.gammaln(kk + eta)
                    - special.gammaln(eta)
                    - special.gammaln(kk + 1.0)
                    - norm
                )
            return np.where(kk >= 1, out, -np.inf)

    def sample(self, rng: Any = None) -> int:
        """One draw of ``K`` by inversion of the CDF, from the secure source by default.

        ``K`` depends on no data, so this draw is not a release; it still comes from
        :mod:`renyi.random` so that the selection's randomness is never predictable.
        """
        u = float(get_source(rng).uniform(1)[0])
        k = 0 if self.is_poisson else 1
        log_p = float(self.log_pmf(k))
        cdf = math.exp(log_p)
        while cdf <= u:
            if self.is_poisson:
                log_p += math.log(self.mean) - math.log(k + 1)
            elif self.shape == 0.0:
                log_p += math.log1p(-self.gamma) + math.log(k) - math.log(k + 1)
            else:
                log_p += math.log1p(-self.gamma) + math.log(k + self.shape) - math.log(k + 1)
            k += 1
            cdf += math.exp(log_p)
            if k > 10**9:  # pragma: no cover - cannot happen for a valid distribution
                raise RuntimeError("repetition sampler did not terminate")
        return k

    def to_dict(self) -> dict[str, float | str]:
        """JSON-able description (with the ``γ`` sampled with, for truncated negative binomials)."""
        if self.is_poisson:
            return {"mean": self.mean, "shape": "inf"}
        return {"mean": self.mean, "shape": self.shape, "gamma": self.gamma}


def repeat_and_select_rdp(
    orders: ArrayLike, epsilons: ArrayLike, distribution: RepetitionDistribution
) -> NDArray[np.float64]:
    """RDP of publishing the best of ``K ~ distribution`` runs of a mechanism with curve ε(α).

    Papernot & Steinke 2022, Theorem 2 (truncated negative binomial, ``λ̂`` minimised over the
    grid) and Theorem 6 (Poisson, ``δ̂`` at ``ε̂ = log(1 + 1/(λ-1))`` by
    :func:`renyi.conversions.rdp_to_delta`), then monotonicity in the order. Orders at which
    no bound follows get ``inf``.

    Example:
        >>> import numpy as np
        >>> a = np.array([2.0, 4.0, 8.0, 16.0, 32.0])
        >>> eps = repeat_and_select_rdp(a, a / 2.0, RepetitionDistribution(10.0, shape=1.0))
        >>> bool(np.all(eps >= a / 2.0))
        True
    """
    a, e = _curve(orders, epsilons)
    d = distribution
    if not isinstance(d, RepetitionDistribution):
        raise fail("distribution", distribution, "a RepetitionDistribution")
    finite = np.isfinite(a)
    out = np.full(a.shape, np.inf)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if d.is_poisson:
            mu = d.mean
            for i in np.flatnonzero(finite):
                eps_hat = math.log1p(1.0 / (a[i] - 1.0))
                delta_hat, _ = rdp_to_delta(a, e, eps_hat)
                out[i] = e[i] + mu * delta_hat + math.log(mu) / (a[i] - 1.0)
        else:
            eta, log_inv_g = d.shape, -math.log(d.gamma)
            hat = (1.0 - 1.0 / a[finite]) * e[finite] + log_inv_g / a[finite]
            if np.isinf(a).any():  # λ̂ = inf: (1+η) ε(∞)
                hat = np.append(hat, e[~finite].min())
            const = (1.0 + eta) * float(np.nanmin(hat))
            out[finite] = e[finite] + math.log(d.mean) / (a[finite] - 1.0) + const
    out = np.where(np.isnan(out), np.inf, out)
    # RDP is non-decreasing in the order: the bound at a higher order holds below it.
    order_idx = np.argsort(a)
    suffix_min = np.minimum.accumulate(out[order_idx][::-1])[::-1]
    result = np.empty_like(out)
    result[order_idx] = suffix_min
    return result
