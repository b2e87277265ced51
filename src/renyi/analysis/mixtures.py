"""RDP of a Gaussian whose shift is a random number of sensitivities: user-level DP-SGD.

When each of a user's ``k`` examples is Poisson-sampled independently with rate ``q``
(example-level sampling, "ELS" in Charles et al. 2024, "Fine-tuning large language models
with user-level differential privacy"), the user's clipped gradients add ``M ~ Binomial(k, q)``
vectors of norm at most ``C`` to a sum that gets ``N(0, σ²C²)`` noise. In the worst case (all
aligned) one step compares, in units of ``C``,

    P = Σ_m b_m N(m, σ²)   with b_m = Binomial(m; k, q)    against    Q = N(0, σ²),

the "mixture of Gaussians" mechanism (dp_accounting's ``MixtureOfGaussiansDpEvent``). For
``k = 1`` it is the Poisson-subsampled Gaussian.

Both directions are computed at integer orders ``α`` (and carried to fractional orders by
monotonicity of RDP in the order, ε(α) ≤ ε(⌈α⌉)):

* ``D_α(P‖Q)`` exactly: ``P/Q(x) = Σ_m β_m e^{m x/σ²}`` with ``β_m = b_m e^{-m²/(2σ²)}``, so
  ``(P/Q)^α = Σ_S w_S e^{S x/σ²}`` where ``w`` are the coefficients of the polynomial
  ``(Σ_m β_m z^m)^α`` (built one factor at a time in log space), and
  ``E_Q[e^{S x/σ²}] = e^{S²/(2σ²)}``: a sum of positive terms, no cancellation.
* ``D_α(Q‖P)`` by quadrature of ``q^α p^{1-α}`` on a fine grid in log space, with the tails
  bounded analytically (``p ≥ b_0 q`` gives ``q^α p^{1-α} ≤ b_0^{1-α} q``) and the
  discretisation error estimated from two grid spacings and added.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special, stats

from renyi._validation import check_int, check_positive, check_probability

__all__ = ["binomial_mixture_gaussian_rdp", "max_integer_order"]

FloatArray = NDArray[np.float64]

#: Integer orders up to this are computed; larger orders get +inf (never optimal in practice
#: for the mechanisms this serves, and always a valid bound).
max_integer_order = 256


def _log_binomial_pmf(k: int, q: float) -> FloatArray:
    m = np.arange(k + 1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return stats.binom.logpmf(m, k, q)


@lru_cache(maxsize=64)
def _remove_direction(sigma: float, k: int, q: float, top: int) -> tuple[float, ...]:
    """log E_Q[(P/Q)^α] for α = 0..top (exact sums of positive terms)."""
    m = np.arange(k + 1, dtype=np.float64)
    log_beta = _log_binomial_pmf(k, q) - m**2 / (2.0 * sigma**2)
    out = [0.0]
    log_w = np.array([0.0])  # coefficients of the power 0
    for alpha in range(1, top + 1):
        deg = alpha * k
        shifted = np.full((k + 1, deg + 1), -np.inf)
        for j in range(k + 1):  # multiply by Σ_j β_j z^j
            shifted[j, j : j + log_w.size] = log_w + log_beta[j]
        log_w = special.logsumexp(shifted, axis=0)
        s = np.arange(deg + 1, dtype=np.float64)
        out.append(float(special.logsumexp(log_w + s**2 / (2.0 * sigma**2))))
    return tuple(out)


def _log_p(x: FloatArray, sigma: float, log_b: FloatArray) -> FloatArray:
    m = np.arange(log_b.size, dtype=np.float64)
    z = (x[:, None] - m[None, :]) / sigma
    return special.logsumexp(log_b[None, :] - 0.5 * z**2, axis=1) - math.log(
        sigma * math.sqrt(2 * math.pi)
    )


@lru_cache(maxsize=64)
def _add_direction(sigma: float, k: int, q: float, top: int) -> tuple[float, ...]:
    """Upper estimates of log ∫ q^α p^{1-α} for α = 0..top (quadrature + tail bound)."""
    log_b = _log_binomial_pmf(k, q)
    log_b0 = float(log_b[0])
    if not math.isfinite(log_b0):  # q = 1: P = N(k, σ²), Q = N(0, σ²): Gaussian closed form
        return tuple(a * (a - 1) * k**2 / (2.0 * sigma**2) for a in range(top + 1))
    # tails: q^α p^{1-α} <= b_0^{1-α} q, so outside [-T, k + T] the mass is at most
    # b_0^{1-α} (Φ(-T/σ) + Φ(-(k+T)/σ)) <= 2 b_0^{1-α} Φ(-T/σ); pick T for 1e-14 relative at top.
    log_tail_target = math.log(1e-14) - (1 - top) * log_b0
    t = sigma * max(8.0, -special.ndtri(math.exp(max(log_tail_target, -700.0)) / 2.0))
    out = [0.0]
    estimates = []
    for n in (1 << 11, 1 << 12):
        x = np.linspace(-t, k + t, n + 1)
        h = x[1] - x[0]
        log_q = -0.5 * (x / sigma) ** 2 - math.log(sigma * math.sqrt(2 * math.pi))
        log_p = _log_p(x, sigma, log_b)
        w = np.full(x.size, math.log(h))
        w[0] = w[-1] = math.log(h / 2)  # trapezoid
        alphas = np.arange(1, top + 1, dtype=np.float64)[:, None]
        estimates.append(special.logsumexp(alphas * log_q + (1 - alphas) * log_p + w, axis=1))
    fine, coarse = estimates[1], estimates[0]
    alphas = np.arange(1, top + 1, dtype=np.float64)
    log_tail = math.log(2.0) + (1 - alphas) * log_b0 + float(special.log_ndtr(-t / sigma))
    # error allowance: the difference between spacings (times 2), plus the tails, plus 1e-12
    err = np.logaddexp(
        math.log(2.0) + np.log(np.abs(np.expm1(coarse - fine)) + 1e-12) + fine, log_tail
    )
    out.extend(np.logaddexp(fine, err).tolist())
    return tuple(out)


def binomial_mixture_gaussian_rdp(
    noise_multiplier: float, group_size: int, sampling_rate: float, orders: ArrayLike
) -> FloatArray:
    """RDP of ``N(M, σ²)`` vs ``N(0, σ²)``, ``M ~ Binomial(group_size, sampling_rate)``, both ways.

    The user-level cost of one example-level-sampled DP-SGD step when a user owns
    ``group_size`` examples (module docstring); for ``group_size = 1`` the Poisson-subsampled
    Gaussian. Returns the larger of the two directions at every order (add/remove neighbours
    of users), an upper bound; orders above :data:`max_integer_order` get ``inf``.

    Example:
        >>> import numpy as np
        >>> from renyi.analysis.subsampling import poisson_subsampled_gaussian_rdp
        >>> a = np.array([2.0, 8.0, 32.0])
        >>> one = binomial_mixture_gaussian_rdp(1.0, 1, 0.01, a)
        >>> bool(np.allclose(one, poisson_subsampled_gaussian_rdp(0.01, 1.0, a), rtol=1e-9))
        True
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    k = check_int("group_size", group_size, minimum=1)
    q = check_probability("sampling_rate", sampling_rate)
    a = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    out = np.full(a.shape, np.inf)
    if q == 0.0:
        return np.zeros(a.shape)
    ceil = np.ceil(a)
    ok = np.isfinite(a) & (ceil <= max_integer_order)
    if not ok.any():
        return out
    # always the full table: a value must not depend on the other orders of the call (the
    # quadrature's range depends on the top order), so that a ledger re-pricing an entry gets
    # the very same bits as the charge
    top = max_integer_order
    rem = np.asarray(_remove_direction(sigma, k, q, top))
    add = np.asarray(_add_direction(sigma, k, q, top))
    idx = ceil[ok].astype(int)
    log_e = np.maximum(rem[idx], add[idx])
    out[ok] = np.maximum(log_e, 0.0) / (idx - 1.0)
    return out
