"""Differentially private averaging of K private values: central DP vs local DP.

Each of ``K`` parties holds a value in ``[0, 1]`` (or a vector of L2 norm at most 1/2: a
domain of L2 diameter 1 either way) and the goal is the mean. Neighbouring relation:
**replace-one** (one party's value changes arbitrarily inside its domain), so the sum has L2
sensitivity 1 and the mean ``1 / K``.

* **Central DP** (trusted curator): the server computes the exact mean and adds Gaussian
  noise of standard deviation ``1 / (K mu)`` once.
* **Local DP** (no trusted party): each party releases its own value plus Gaussian noise of
  standard deviation ``1 / mu``; the mean of the reports has standard deviation
  ``1 / (sqrt(K) mu)``, a factor ``sqrt(K)`` worse (Bellet 2022 lecture, part 3).

Here ``mu`` is the Gaussian "sensitivity over sigma" ratio that meets the target (ε, δ):

* ``calibration="classic"``: Dwork & Roth 2014, Theorem A.1, ``sigma = c(delta) / epsilon``
  with ``c(delta) = sqrt(2 ln(1.25 / delta))``, proven for ``epsilon < 1``; for larger ε the
  classic value is accepted only after the exact analytic Gaussian privacy profile (Balle &
  Wang 2018, Theorem 8) confirms it;
* ``calibration="analytic"``: the exact analytic Gaussian (Balle & Wang 2018, Theorem 8),
  ``renyi.analysis.closed_forms.gaussian_mu``; both estimates shrink by the same factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi import noise
from renyi._validation import check_delta, check_int, check_nonnegative, check_positive, fail
from renyi.accountants import Accountant, EpsilonResult, make_accountant
from renyi.analysis.closed_forms import classic_gaussian_constant, gaussian_delta, gaussian_mu
from renyi.analysis.events import GaussianEvent, Neighbouring
from renyi.random import get_source

__all__ = [
    "AggregationComparison",
    "Calibration",
    "aggregation_event",
    "central_mean_std",
    "check_values",
    "classic_gaussian_constant",
    "compare_aggregation",
    "gaussian_noise",
    "gaussian_ratio",
    "local_mean_std",
    "private_mean_central",
    "private_mean_local",
    "reported_epsilon",
    "simulate_aggregation",
]

Calibration = Literal["classic", "analytic"]


def gaussian_noise(
    sigma: float, size: int | tuple[int, ...], rng: object = None
) -> NDArray[np.float64]:
    """Released ``N(0, sigma²)`` noise of the given shape: :func:`renyi.noise.gaussian_noise`
    (on the lattice ``renyi.noise.lattice_step(sigma) Z``). Noise that is added to data must
    go through :func:`renyi.noise.gaussian` with the data instead, so that the *sum* is on the
    lattice. ``rng=None`` reads the operating system's CSPRNG; a seeded
    ``numpy.random.Generator`` is accepted for experiments (with
    ``InsecureRandomnessWarning``).
    """
    sigma = check_nonnegative("sigma", sigma)
    return np.asarray(noise.gaussian_noise(size, sigma, rng=rng), dtype=np.float64)


def gaussian_ratio(epsilon: float, delta: float, calibration: Calibration = "classic") -> float:
    """The ratio ``mu = sensitivity / sigma`` of a Gaussian mechanism meeting (ε, δ)-DP.

    ``classic``: ``epsilon / c(delta)`` (Dwork & Roth 2014, Thm A.1). Proven there for
    ``epsilon < 1``; for ``epsilon >= 1`` the value is kept only if the exact privacy
    profile of Balle & Wang 2018 (Thm 8) confirms ``delta(epsilon) <= delta``, otherwise
    ``PrivacyParameterError`` is raised (use ``analytic``).
    ``analytic``: the largest ``mu`` meeting (ε, δ) exactly (Balle & Wang 2018, Thm 8).

    >>> round(1 / gaussian_ratio(1.0, 1e-5), 4)
    4.8448
    """
    epsilon = check_positive("epsilon", epsilon)
    delta = check_delta(delta)
    if calibration == "analytic":
        return float(gaussian_mu(epsilon, delta))
    if calibration != "classic":
        raise fail("calibration", calibration, "'classic' or 'analytic'")
    mu = epsilon / classic_gaussian_constant(delta)
    if epsilon >= 1.0 and float(gaussian_delta(mu, epsilon)) > delta:
        raise fail(
            "epsilon",
            epsilon,
            "a value for which the classic Gaussian bound holds (it is proven for epsilon < 1"
            " and fails the exact check here); use calibration='analytic'",
        )
    return mu


def central_mean_std(
    parties: int, epsilon: float, delta: float, calibration: Calibration = "classic"
) -> float:
    """Standard deviation of the central-DP mean of ``parties`` values in ``[0, 1]``.

    The curator adds ``N(0, sigma²)`` with ``sigma = 1 / (K mu)`` to the exact mean
    (sensitivity ``1 / K`` under replace-one), which is (ε, δ)-DP.

    >>> round(central_mean_std(1000, 1.0, 1e-5), 6)
    0.004845
    """
    k = check_int("parties", parties, 1)
    return 1.0 / (k * gaussian_ratio(epsilon, delta, calibration))


def local_mean_std(
    parties: int, epsilon: float, delta: float, calibration: Calibration = "classic"
) -> float:
    """Standard deviation of the mean of ``parties`` locally privatised reports.

    Each party adds ``N(0, 1 / mu²)`` to its value (sensitivity 1), so each report is
    (ε, δ)-DP on its own; the mean of K reports has standard deviation ``1 / (sqrt(K) mu)``.

    >>> round(local_mean_std(1000, 1.0, 1e-5), 6)
    0.153206
    """
    k = check_int("parties", parties, 1)
    return 1.0 / (math.sqrt(k) * gaussian_ratio(epsilon, delta, calibration))


def check_values(values: ArrayLike) -> NDArray[np.float64]:
    """K private values: shape ``(K,)`` in ``[0, 1]`` or ``(K, d)`` rows of L2 norm <= 1/2."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim not in (1, 2) or arr.shape[0] == 0:
        raise fail("values", arr.shape, "a non-empty array of shape (K,) or (K, d)")
    if not np.isfinite(arr).all():
        raise fail("values", "array with NaN/inf", "finite values")
    if arr.ndim == 1:
        if (arr < 0).any() or (arr > 1).any():
            raise fail("values", "array outside [0, 1]", "every value in [0, 1]")
    elif (np.linalg.norm(arr, axis=1) > 0.5).any():
        # replace-one moves a row by up to the domain's diameter: 1 for the ball of radius 1/2
        raise fail("values", "rows of L2 norm > 1/2", "every row of L2 norm <= 1/2")
    return arr


def private_mean_central(
    values: ArrayLike,
    epsilon: float,
    delta: float,
    *,
    calibration: Calibration = "classic",
    rng: np.random.Generator | None = None,
) -> NDArray[np.float64] | float:
    """(ε, δ)-DP mean released by a trusted curator (central model, replace-one).

    >>> m = private_mean_central([0.2, 0.4, 0.6], 1.0, 1e-5, rng=np.random.default_rng(0))
    """
    arr = check_values(values)
    sigma = central_mean_std(arr.shape[0], epsilon, delta, calibration)
    out = noise.gaussian(np.asarray(arr.mean(axis=0), dtype=np.float64), sigma, rng=rng)
    return float(out) if arr.ndim == 1 else np.asarray(out, dtype=np.float64)


def private_mean_local(
    values: ArrayLike,
    epsilon: float,
    delta: float,
    *,
    calibration: Calibration = "classic",
    rng: np.random.Generator | None = None,
) -> NDArray[np.float64] | float:
    """Mean of locally privatised reports: each report alone is (ε, δ)-DP (local model).

    >>> m = private_mean_local([0.2, 0.4, 0.6], 1.0, 1e-5, rng=np.random.default_rng(0))
    """
    arr = check_values(values)
    sigma = 1.0 / gaussian_ratio(epsilon, delta, calibration)
    reports = noise.gaussian(arr, sigma, rng=rng)
    out = reports.mean(axis=0)
    return float(out) if arr.ndim == 1 else np.asarray(out, dtype=np.float64)


@dataclass(frozen=True)
class AggregationComparison:
    """Theoretical (and optionally simulated) errors of the central and local models."""

    parties: int
    epsilon: float
    delta: float
    calibration: str
    central_std: float
    local_std: float
    ratio: float
    central_std_simulated: float | None = None
    local_std_simulated: float | None = None


def compare_aggregation(
    parties: int, epsilon: float, delta: float, calibration: Calibration = "classic"
) -> AggregationComparison:
    """Central vs local DP error for averaging; the ratio is exactly ``sqrt(parties)``.

    >>> c = compare_aggregation(1000, 1.0, 1e-5)
    >>> round(c.ratio, 2)
    31.62
    """
    c = central_mean_std(parties, epsilon, delta, calibration)
    loc = local_mean_std(parties, epsilon, delta, calibration)
    return AggregationComparison(
        parties=int(parties),
        epsilon=float(epsilon),
        delta=float(delta),
        calibration=str(calibration),
        central_std=c,
        local_std=loc,
        ratio=loc / c,
    )


def aggregation_event(
    epsilon: float, delta: float, calibration: Calibration = "classic"
) -> GaussianEvent:
    """The release of either model as an event: a Gaussian, noise multiplier ``1 / mu``.

    Central (sensitivity ``1/K``, ``sigma = 1/(K mu)``) and local (each report: sensitivity
    1, ``sigma = 1/mu``) have the same noise multiplier; replace-one neighbours.
    """
    mu = gaussian_ratio(epsilon, delta, calibration)
    return GaussianEvent(1.0 / mu, neighbouring=Neighbouring.REPLACE_ONE)


def reported_epsilon(
    epsilon: float,
    delta: float,
    calibration: Calibration = "classic",
    accountant: str | Accountant = "rdp",
) -> EpsilonResult:
    """What a renyi accountant reports for the calibrated release at ``delta``.

    Never below the exact ε of the Gaussian (the accountants are upper bounds); the RDP
    accountant's conversion is looser than the analytic profile used for calibration.

    >>> reported_epsilon(1.0, 1e-5).epsilon < 1.0  # classic calibration is conservative
    True
    """
    event = aggregation_event(epsilon, delta, calibration)
    return make_accountant(accountant).compose(event).epsilon(check_delta(delta))


def simulate_aggregation(
    parties: int,
    epsilon: float,
    delta: float,
    *,
    trials: int = 2000,
    calibration: Calibration = "classic",
    rng: np.random.Generator | None = None,
) -> AggregationComparison:
    """Monte Carlo check of :func:`compare_aggregation` on uniform values in ``[0, 1]``.

    Runs ``trials`` independent releases of both models (vectorised) and reports the
    empirical standard deviation of the error ``estimate - true mean``.
    """
    k = check_int("parties", parties, 1)
    n = check_int("trials", trials, 2)
    base = compare_aggregation(k, epsilon, delta, calibration)
    values = get_source(rng).uniform(k)
    true = values.mean()
    central = true + gaussian_noise(base.central_std, n, rng)
    sigma_local = 1.0 / gaussian_ratio(epsilon, delta, calibration)
    local = (values[None, :] + gaussian_noise(sigma_local, (n, k), rng)).mean(axis=1)
    return AggregationComparison(
        parties=k,
        epsilon=base.epsilon,
        delta=base.delta,
        calibration=base.calibration,
        central_std=base.central_std,
        local_std=base.local_std,
        ratio=base.ratio,
        central_std_simulated=float(np.sqrt(np.mean((central - true) ** 2))),
        local_std_simulated=float(np.sqrt(np.mean((local - true) ** 2))),
    )
