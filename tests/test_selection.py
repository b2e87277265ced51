"""Private selection (Papernot & Steinke 2022): distributions of K and the RDP theorems.

References: dp_accounting's RepeatAndSelect RDP (a peer, same theorems), the paper's formula
evaluated by hand at stated (η, γ, λ̂), and the exact output distribution of "best of K runs"
for a discrete base mechanism (the probability generating function of K gives it in closed form),
against which the bound must never be smaller.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from renyi.conversions import rdp_to_delta
from renyi.curves import DEFAULT_ORDERS
from renyi.divergence import renyi_divergence
from renyi.errors import PrivacyParameterError
from renyi.selection import RepetitionDistribution, repeat_and_select_rdp
from renyi.subsampling import poisson_subsampled_gaussian_rdp

ORDERS = np.asarray(DEFAULT_ORDERS)
SHAPES = [0.0, 0.5, 1.0, 2.0, math.inf]


def _pgf(d: RepetitionDistribution, x: np.ndarray) -> np.ndarray:
    """E[x^K] in closed form."""
    if d.is_poisson:
        return np.exp(d.mean * (x - 1.0))
    g, eta = d.gamma, d.shape
    if eta == 0.0:
        return np.log1p(-(1.0 - g) * x) / math.log(g)
    return ((1.0 - (1.0 - g) * x) ** (-eta) - 1.0) / (g ** (-eta) - 1.0)


def _best_of_k(d: RepetitionDistribution, pmf: np.ndarray) -> np.ndarray:
    """Distribution of the best score over K runs (index 0: no run, K = 0)."""
    cdf = np.concatenate([[0.0], np.cumsum(pmf)])
    g = _pgf(d, np.clip(cdf, 0.0, 1.0))
    return np.diff(np.concatenate([[0.0], g]))  # P[⊥] = G(0), P[max = s] = G(F(s)) - G(F(s-1))


@pytest.mark.parametrize("shape", [0.0, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("mean", [1.5, 10.0, 1000.0])
def test_tnb_mean_and_pmf(shape: float, mean: float) -> None:
    d = RepetitionDistribution(mean, shape)
    assert d.mean == pytest.approx(mean, rel=1e-12)
    k = np.arange(1, 200_000)
    p = np.exp(d.log_pmf(k))
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    assert (k * p).sum() == pytest.approx(mean, rel=1e-6)
    assert np.exp(d.log_pmf(0)) == 0.0


def test_geometric_is_the_papers_gamma() -> None:
    # η = 1: D_{1,γ} is geometric with E[K] = 1/γ.
    assert RepetitionDistribution(10.0, 1.0).gamma == pytest.approx(0.1, rel=1e-14)
    # η = 0 (logarithmic): E[K] = (1-γ) / (γ log 1/γ)
    g = RepetitionDistribution(7.0, 0.0).gamma
    assert (1 - g) / (g * math.log(1 / g)) == pytest.approx(7.0, rel=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_sampler_matches_distribution(shape: float) -> None:
    d = RepetitionDistribution(5.0, shape)
    rng = np.random.default_rng(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seeded generator: insecure on purpose here
        draws = np.array([d.sample(rng) for _ in range(4000)])
    assert draws.min() >= (0 if d.is_poisson else 1)
    # mean within 5 standard errors (false alarm ~ 6e-7)
    k = np.arange(0, 100_000)
    p = np.exp(d.log_pmf(k))
    sd = math.sqrt(float((p * (k - d.mean) ** 2).sum()) / draws.size)
    assert abs(draws.mean() - d.mean) < 5 * sd
    # and secure by default
    assert d.sample() >= (0 if d.is_poisson else 1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("q,sigma,steps", [(0.01, 1.0, 1000), (1.0, 5.0, 1), (0.05, 0.8, 50)])
def test_matches_dp_accounting(shape: float, q: float, sigma: float, steps: int) -> None:
    rdp_mod = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    e = poisson_subsampled_gaussian_rdp(q, sigma, ORDERS) * steps
    ours = repeat_and_select_rdp(ORDERS, e, RepetitionDistribution(10.0, shape))
    theirs = np.asarray(rdp_mod._compute_rdp_repeat_and_select(ORDERS, e, 10.0, shape))
    if math.isinf(shape):
        # Same Theorem 6; ours also carries smaller values down the orders (monotonicity),
        # and takes δ̂ from our RDP->DP conversion: never larger than theirs.
        assert np.all(ours <= theirs * (1 + 1e-12))
        # and where neither is dominated by monotonicity they agree closely
        close = np.isclose(ours, theirs, rtol=1e-6)
        assert close.sum() > ORDERS.size // 3
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-9)


def test_theorem_2_by_hand() -> None:
    # One Gaussian run, ε(λ) = λ/(2σ²); geometric K (η = 1), mean 20: γ = 1/20.
    sigma = 3.0
    a = np.array([2.0, 5.0, 10.0, 40.0])
    e = a / (2 * sigma**2)
    d = RepetitionDistribution(20.0, 1.0)
    got = repeat_and_select_rdp(a, e, d)
    # λ̂ minimising (1 - 1/λ̂) λ̂/(2σ²) + log(20)/λ̂ over the grid, by hand
    hat = min((1 - 1 / lh) * lh / (2 * sigma**2) + math.log(20.0) / lh for lh in a)
    expected = e + math.log(20.0) / (a - 1) + 2 * hat
    expected = np.minimum.accumulate(expected[::-1])[::-1]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_theorem_6_by_hand() -> None:
    sigma, mu = 4.0, 8.0
    a = np.array([2.0, 3.0, 8.0, 16.0, 64.0])
    e = a / (2 * sigma**2)
    got = repeat_and_select_rdp(a, e, RepetitionDistribution(mu, math.inf))
    raw = np.array(
        [
            e[i] + mu * rdp_to_delta(a, e, math.log1p(1 / (lam - 1)))[0] + math.log(mu) / (lam - 1)
            for i, lam in enumerate(a)
        ]
    )
    np.testing.assert_allclose(got, np.minimum.accumulate(raw[::-1])[::-1], rtol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mean", [3.0, 30.0])
def test_bound_never_below_exact_best_of_k(shape: float, mean: float) -> None:
    """Exact Rényi divergence of 'best of K runs' for a discrete base mechanism vs the bound."""
    # base mechanism: a noisy score in {0..5} (a discretised Laplace shifted by one record)
    s = np.arange(6)
    p = np.exp(-0.9 * np.abs(s - 2.0))
    p /= p.sum()
    p2 = np.exp(-0.9 * np.abs(s - 3.0))
    p2 /= p2.sum()
    d = RepetitionDistribution(mean, shape)
    out, out2 = _best_of_k(d, p), _best_of_k(d, p2)
    a = np.array([1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0, 128.0])
    for x, y, ox, oy in [(p, p2, out, out2), (p2, p, out2, out)]:
        base = renyi_divergence(x, y, a)
        bound = repeat_and_select_rdp(a, base, d)
        exact = renyi_divergence(ox, oy, a)
        assert np.all(bound >= exact - 1e-12), (bound, exact)
        # and the procedure costs less than K_max-fold composition would suggest at mean K
        assert np.all(bound[a >= 4] < mean * base[a >= 4] + np.log(mean) / (a[a >= 4] - 1) + 10)


def test_bad_input() -> None:
    with pytest.raises(PrivacyParameterError, match="mean"):
        RepetitionDistribution(1.0, 1.0)  # truncated negative binomial needs mean > 1
    with pytest.raises(PrivacyParameterError, match="mean"):
        RepetitionDistribution(0.5, math.inf)  # Theorem 6 needs μ >= 1
    with pytest.raises(PrivacyParameterError, match="shape"):
        RepetitionDistribution(5.0, -1.0)
    with pytest.raises(PrivacyParameterError, match="shape"):
        RepetitionDistribution(5.0, float("nan"))
    with pytest.raises(PrivacyParameterError, match="distribution"):
        repeat_and_select_rdp([2.0], [1.0], "geometric")  # type: ignore[arg-type]


@pytest.mark.parametrize("mean", [1.0 + 1e-9, 1e12])
@pytest.mark.parametrize("shape", [0.0, 1.0, 1e6, math.inf])
def test_extremes_finite(mean: float, shape: float) -> None:
    d = RepetitionDistribution(mean, shape)
    e = poisson_subsampled_gaussian_rdp(0.01, 1.0, ORDERS) * 100
    r = repeat_and_select_rdp(ORDERS, e, d)
    assert not np.isnan(r).any() and np.isfinite(r[ORDERS > 2]).all()
    assert np.all(r >= e - 1e-12)
