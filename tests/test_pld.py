"""Tests of renyi.pld against independent ground truths.

Oracles: the exact Gaussian privacy profile (Balle & Wang 2018) in mpmath, numerical
quadrature of the hockey-stick divergence in output space, exact binomial enumeration of
randomized response and of the Kairouz-Oh-Viswanath composition of (eps, delta)-DP, direct
enumeration of explicit discrete pairs, and the peers dp_accounting / prv_accountant.
Every reported bracket ``[lower, upper]`` must contain the truth.
"""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

import renyi.analysis.pld._numerics as pld_numerics
from renyi.errors import PrivacyParameterError
from renyi.pld import PrivacyLossDistribution as PLD

mpmath.mp.dps = 40

# --------------------------------------------------------------------------------------
# independent references


def gaussian_delta(mu: float, eps: float) -> float:
    """Exact delta(eps) of the Gaussian with sensitivity/sigma = mu (Balle & Wang 2018)."""
    m, e = mpmath.mpf(mu), mpmath.mpf(eps)
    return float(mpmath.ncdf(m / 2 - e / m) - mpmath.exp(e) * mpmath.ncdf(-m / 2 - e / m))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact eps(delta) of the Gaussian by bisection on the mpmath profile."""
    lo, hi = mpmath.mpf(0), mpmath.mpf(mu * mu / 2 + 10 * mu + 10)
    m, d = mpmath.mpf(mu), mpmath.mpf(delta)

    def f(e: mpmath.mpf) -> mpmath.mpf:
        return mpmath.ncdf(m / 2 - e / m) - mpmath.exp(e) * mpmath.ncdf(-m / 2 - e / m) - d

    if f(lo) <= 0:
        return 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    return float((lo + hi) / 2)


def hockey_stick_quad(p_pdf, q_pdf, eps: float, points: list[float], lim: float) -> float:
    """int (p(x) - e^eps q(x))_+ dx by adaptive quadrature (output space)."""

    def f(x: float) -> float:
        return max(p_pdf(x) - math.exp(eps) * q_pdf(x), 0.0)

    edges = sorted({-lim, lim, *points})
    return sum(
        integrate.quad(f, a, b, limit=400, epsabs=1e-14, epsrel=1e-12)[0]
        for a, b in itertools.pairwise(edges)
    )


def mixture_pdf(q: float, sigma: float):
    return lambda x: (1 - q) * stats.norm.pdf(x, 0, sigma) + q * stats.norm.pdf(x, 1, sigma)


def subsampled_one_step(q: float, sigma: float, direction: str, e: float) -> float:
    """E_P[(1 - e^(e - L))_+] of one subsampled-Gaussian step for any real e, in closed form:
    the set {L > e} is a half-line {x > x*} (remove) or {x < x*} (add), whose P- and
    Q-masses are normal CDFs (mpmath, 40 digits)."""
    m = mpmath
    qq, s, ee = m.mpf(q), m.mpf(sigma), m.mpf(e)

    def xstar(ell):  # the output with loss ell in the remove direction
        return s**2 * m.log((m.exp(ell) - 1 + qq) / qq) + m.mpf(1) / 2

    if direction == "remove":
        if ee <= m.log(1 - qq):
            return float(1 - m.exp(ee))
        x = xstar(ee)
        pm = (1 - qq) * m.ncdf(-x / s) + qq * m.ncdf((1 - x) / s)
        return float(pm - m.exp(ee) * m.ncdf(-x / s))
    if -ee <= m.log(1 - qq):
        return 0.0
    x = xstar(-ee)
    qm = (1 - qq) * m.ncdf(x / s) + qq * m.ncdf((x - 1) / s)
    return float(m.ncdf(x / s) - m.exp(ee) * qm)


def laplace_one_step(b: float, e: float) -> float:
    """E_P[(1 - e^(e - L))_+] for Lap(0, b) vs Lap(1, b), any real e, closed form:
    {L > e} = {x < X}, X = (1 - b e)/2, with P[x < X] = 1 - e^(-X/b)/2 and
    Q[x < X] = e^((X-1)/b)/2 for X in [0, 1]."""
    if e >= 1 / b:
        return 0.0
    if e < -1 / b:
        return -math.expm1(e)
    x = (1 - b * e) / 2
    return (1 - math.exp(-x / b) / 2) - math.exp(e) * math.exp((x - 1) / b) / 2


def contains(bounds, truth: float, rel: float = 1e-12, abs_: float = 1e-300) -> bool:
    slack = rel * abs(truth) + abs_
    return bounds.lower - slack <= truth <= bounds.upper + slack


# --------------------------------------------------------------------------------------
# Gaussian: T-fold composition is exactly the Gaussian with mu = sqrt(T)/sigma


@pytest.mark.parametrize("count", [1, 10, 1000, 100_000])
@pytest.mark.parametrize("mu", [0.5, 2.0])
def test_gaussian_composition_brackets_exact_profile(count: int, mu: float) -> None:
    sigma = math.sqrt(count) / mu
    pld = PLD.gaussian(sigma, value_discretization_interval=1e-4).self_compose(count)
    eps = np.array([0.0, 0.1, 0.5, 1.0, 2.0, 4.0])
    b = pld.delta_for_epsilon(eps)
    for i, e in enumerate(eps):
        truth = gaussian_delta(mu, float(e))
        assert b.lower[i] <= truth <= b.upper[i], (e, b.lower[i], truth, b.upper[i])
        # tight: the bracket is a small fraction of the value where delta is not tiny
        if truth > 1e-6 and count <= 10:
            assert b.upper[i] - b.lower[i] <= 1e-2 * truth
    for delta in (1e-3, 1e-6, 1e-10):
        truth = gaussian_epsilon(mu, delta)
        e = pld.epsilon_for_delta(delta)
        assert e.lower <= truth <= e.upper, (delta, e, truth)
        assert e.lower <= e.estimate <= e.upper
        # the lower bound pays a Hoeffding term of order h sqrt(count log(1/delta))
        assert e.upper - e.lower <= 1e-4 * math.sqrt(60 * count) + 1e-3 * truth
        # the upper bound is nearly exact: connect-the-dots errs by O(h^2) per step
        assert e.upper - truth <= (1e-4 + count * 1e-8) * truth + 1e-6


def test_gaussian_upper_is_nearly_exact() -> None:
    # connect-the-dots is exact at grid points for a single step and second-order after
    pld = PLD.gaussian(1.0, value_discretization_interval=1e-4).self_compose(10)
    mu = math.sqrt(10)
    truth = gaussian_epsilon(mu, 1e-5)
    e = pld.epsilon_for_delta(1e-5)
    assert truth <= e.upper <= truth * (1 + 1e-5)


def test_gaussian_tiny_and_huge_noise() -> None:
    tiny = PLD.gaussian(1e-3, value_discretization_interval=1e-2)
    b = tiny.delta_for_epsilon([0.0, 10.0, 100.0])
    assert np.all(np.isfinite(b.upper)) and np.all(b.lower <= b.upper)
    for i, e in enumerate([0.0, 10.0, 100.0]):
        assert contains(PLDBoundsAt(b, i), gaussian_delta(1e3, e))
    huge = PLD.gaussian(1e4).self_compose(1000)
    e = huge.epsilon_for_delta(1e-5)
    truth = gaussian_epsilon(math.sqrt(1000) / 1e4, 1e-5)
    assert e.lower <= truth <= e.upper


def test_heterogeneous_gaussian_composition_is_exact_gaussian() -> None:
    """Composing Gaussians with different noise is the Gaussian with mu^2 = sum T_i/s_i^2;
    exercises compose() of self-composed PLDs (error terms of both factors propagate)."""
    a = PLD.gaussian(2.0).self_compose(50)
    b = PLD.gaussian(0.7).self_compose(3)
    c = a.compose(b).compose(PLD.gaussian(5.0))
    mu = math.sqrt(50 / 4 + 3 / 0.49 + 1 / 25)
    for eps in (0.0, 5.0, 15.0, 25.0):
        b_ = c.delta_for_epsilon(eps)
        truth = gaussian_delta(mu, eps)
        assert b_.lower <= truth <= b_.upper
        assert b_.upper - b_.lower <= 5e-3 * truth + 1e-12
    d = c.self_compose(3)
    for delta in (1e-3, 1e-9):
        e = d.epsilon_for_delta(delta)
        assert e.lower <= gaussian_epsilon(mu * math.sqrt(3), delta) <= e.upper


class PLDBoundsAt:
    def __init__(self, b, i: int) -> None:
        self.lower, self.upper = float(b.lower[i]), float(b.upper[i])


def test_coarsening_keeps_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    # force the "window too large" path: the grid is coarsened conservatively
    monkeypatch.setattr(pld_numerics, "_MAX_BINS", 1 << 17)
    pld = PLD.gaussian(3.0, value_discretization_interval=1e-4).self_compose(100)
    assert pld.value_discretization_interval > 1e-4
    mu = 10 / 3.0
    for delta in (1e-3, 1e-8):
        e = pld.epsilon_for_delta(delta)
        assert e.lower <= gaussian_epsilon(mu, delta) <= e.upper


# --------------------------------------------------------------------------------------
# Laplace, randomized response, (eps, delta)-DP, explicit pairs, discrete Laplace


@pytest.mark.parametrize("b", [0.5, 2.0])
def test_laplace_single_step_vs_quadrature(b: float) -> None:
    pld = PLD.laplace(b)
    p = lambda x: stats.laplace.pdf(x, 0, b)  # noqa: E731
    q = lambda x: stats.laplace.pdf(x, 1, b)  # noqa: E731
    for eps in (0.0, 0.3, 0.9 / b, 1.0 / b + 0.1):
        assert contains(pld.delta_for_epsilon(eps), hockey_stick_quad(p, q, eps, [0, 1], 60 * b))


def test_laplace_one_step_closed_form_matches_quadrature() -> None:
    b = 0.7
    p = lambda x: stats.laplace.pdf(x, 0, b)  # noqa: E731
    q = lambda x: stats.laplace.pdf(x, 1, b)  # noqa: E731
    for eps in (0.0, 0.5, 1.2):
        quad = hockey_stick_quad(p, q, eps, [0, 1], 60 * b)
        assert laplace_one_step(b, eps) == pytest.approx(quad, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("b", [1.0, 0.4])
def test_laplace_two_fold_vs_conditioned_quadrature(b: float) -> None:
    pld = PLD.laplace(b).self_compose(2)

    def loss(x: float) -> float:
        return (abs(x - 1) - abs(x)) / b

    for eps in (0.5, 1.5):
        # condition on the first output: delta_2(eps) = E_x1[one(eps - L(x1))]
        def f(x: float, eps: float = eps) -> float:
            return stats.laplace.pdf(x, 0, b) * laplace_one_step(b, eps - loss(x))

        parts = [(-60 * b, 0), (0, 1), (1, 60 * b)]
        truth = sum(integrate.quad(f, lo, hi, limit=200, epsabs=1e-14)[0] for lo, hi in parts)
        assert contains(pld.delta_for_epsilon(eps), truth, rel=1e-8)


@pytest.mark.parametrize("p,k", [(0.8, 5), (0.6, 40), (0.99, 3)])
def test_randomized_response_k_fold_exact(p: float, k: int) -> None:
    pld = PLD.randomized_response(p).self_compose(k)
    ll = math.log(p / (1 - p))
    j = np.arange(k + 1)
    w = stats.binom.pmf(j, k, p)
    for eps in (0.0, 0.5, 2.0, 5.0):
        truth = float(np.sum(w * np.clip(-np.expm1(eps - (2 * j - k) * ll), 0, None)))
        assert contains(pld.delta_for_epsilon(eps), truth)


@pytest.mark.parametrize("eps0,delta0,k", [(1.0, 1e-6, 10), (0.1, 0.0, 50), (2.0, 1e-3, 3)])
def test_approx_dp_composition_matches_kov(eps0: float, delta0: float, k: int) -> None:
    """Kairouz, Oh & Viswanath 2015, Thm. 3.3: the k-fold of (eps0, delta0)-DP."""
    pld = PLD.approx_dp(eps0, delta0).self_compose(k)
    j = np.arange(k + 1)
    w = stats.binom.pmf(j, k, math.exp(eps0) / (1 + math.exp(eps0)))
    for eps in (0.0, 0.5, 3.0):
        rr = float(np.sum(w * np.clip(-np.expm1(eps - (2 * j - k) * eps0), 0, None)))
        truth = 1 - (1 - delta0) ** k + (1 - delta0) ** k * rr
        assert contains(pld.delta_for_epsilon(eps), truth)


def test_from_distributions_two_fold_enumeration() -> None:
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.2, 0.3, 0.4, 0.1])
    pld = PLD.from_distributions(p, q)
    two = pld.self_compose(2)
    also = pld.compose(pld)
    p2, q2 = np.outer(p, p).ravel(), np.outer(q, q).ravel()
    for eps in (0.0, 0.4, 1.0):
        truth = float(np.sum(np.clip(p2 - math.exp(eps) * q2, 0, None)))
        assert contains(two.delta_for_epsilon(eps), truth)
        assert contains(also.delta_for_epsilon(eps), truth)


def test_from_distributions_infinite_loss() -> None:
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.0, 0.3, 0.7])
    pld = PLD.from_distributions(p, q)
    assert pld.infinity_mass >= 0.5
    for eps in (0.0, 0.1, 30.0):
        truth = float(np.sum(np.clip(p - math.exp(eps) * q, 0, None)))
        assert contains(pld.delta_for_epsilon(eps), truth)
    assert pld.epsilon_for_delta(0.4).upper == math.inf


@pytest.mark.parametrize("t,sens", [(1.0, 1), (0.7, 3)])
def test_discrete_laplace_vs_enumeration(t: float, sens: int) -> None:
    pld = PLD.discrete_laplace(t, sens).self_compose(2)
    k = np.arange(-400, 401)
    pk = np.exp(-np.abs(k) / t)
    pk /= pk.sum()
    qk = np.exp(-np.abs(k - sens) / t)
    qk /= qk.sum()
    p2, q2 = np.outer(pk, pk).ravel(), np.outer(qk, qk).ravel()
    for eps in (0.0, 1.0, 2.5):
        truth = float(np.sum(np.clip(p2 - math.exp(eps) * q2, 0, None)))
        assert contains(pld.delta_for_epsilon(eps), truth, rel=1e-9)


@pytest.mark.parametrize("sigma,sens", [(0.8, 1), (3.0, 2)])
def test_discrete_gaussian_vs_enumeration(sigma: float, sens: int) -> None:
    pld = PLD.discrete_gaussian(sigma, sens).self_compose(2)
    k = np.arange(-60, 61)
    pk = np.array([float(mpmath.exp(-(mpmath.mpf(int(i)) ** 2) / (2 * sigma**2))) for i in k])
    pk /= pk.sum()
    qk = np.array(
        [float(mpmath.exp(-(mpmath.mpf(int(i) - sens) ** 2) / (2 * sigma**2))) for i in k]
    )
    qk /= qk.sum()
    p2, q2 = np.outer(pk, pk).ravel(), np.outer(qk, qk).ravel()
    for eps in (0.0, 1.0, 3.0):
        truth = float(np.sum(np.clip(p2 - math.exp(eps) * q2, 0, None)))
        assert contains(pld.delta_for_epsilon(eps), truth, rel=1e-8)


# --------------------------------------------------------------------------------------
# Poisson-subsampled Gaussian


@pytest.mark.parametrize("direction", ["remove", "add"])
@pytest.mark.parametrize("q,sigma", [(0.01, 1.0), (0.2, 0.7), (0.5, 2.0)])
def test_subsampled_gaussian_single_step_vs_quadrature(direction: str, q: float, sigma: float):
    pld = PLD.subsampled_gaussian(q, sigma, direction=direction)  # type: ignore[arg-type]
    mix, base = mixture_pdf(q, sigma), (lambda x: stats.norm.pdf(x, 0, sigma))
    p, qq = (mix, base) if direction == "remove" else (base, mix)
    for eps in (0.0, 0.01, 0.2, 1.0, 3.0):
        truth = subsampled_one_step(q, sigma, direction, eps)
        assert contains(pld.delta_for_epsilon(eps), truth, rel=1e-12)
        if truth > 1e-7:  # the closed form itself, cross-checked by quadrature
            quad = hockey_stick_quad(p, qq, eps, [0.0, 0.5, 1.0], 40 * sigma + 2)
            assert truth == pytest.approx(quad, rel=1e-6)


def test_subsampled_gaussian_limits() -> None:
    g = PLD.gaussian(1.3).delta_for_epsilon(0.5)
    s = PLD.subsampled_gaussian(1.0, 1.3).delta_for_epsilon(0.5)
    assert g == s
    zero = PLD.subsampled_gaussian(0.0, 1.3).self_compose(5).delta_for_epsilon([0.0, 1.0])
    assert np.all(zero.upper <= 1e-12)


@pytest.mark.parametrize("direction", ["remove", "add"])
def test_subsampled_two_steps_vs_conditioned_quadrature(direction: str) -> None:
    """Two steps: delta_2(eps) = E_x1[one(eps - L(x1))], one step in closed form."""
    q, sigma = 0.3, 1.0
    pld = PLD.subsampled_gaussian(q, sigma, direction=direction).self_compose(2)  # type: ignore[arg-type]
    mix = mixture_pdf(q, sigma)
    base = lambda x: stats.norm.pdf(x, 0, sigma)  # noqa: E731
    p, qq = (mix, base) if direction == "remove" else (base, mix)

    for eps in (0.3, 1.0):

        def f(x: float, eps: float = eps) -> float:
            return p(x) * subsampled_one_step(q, sigma, direction, eps - math.log(p(x) / qq(x)))

        truth = integrate.quad(f, -9, 10, limit=200, epsabs=1e-13)[0]
        assert contains(pld.delta_for_epsilon(eps), truth, rel=1e-7)


def rdp_upper_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    """An independent valid upper bound: integer-order RDP of the subsampled Gaussian
    (Mironov, Talwar & Zhang 2019) converted with Mironov 2017, Prop. 3."""
    best = math.inf
    for a in range(2, 257):
        k = np.arange(a + 1)
        logs = (
            [float(mpmath.log(mpmath.binomial(a, int(i)))) for i in k]
            + (a - k) * math.log1p(-q)
            + k * math.log(q)
            + (k * k - k) / (2 * sigma**2)
        )
        rdp = float(np.logaddexp.reduce(logs)) / (a - 1)
        best = min(best, steps * rdp + math.log(1 / delta) / (a - 1))
    return best


def both_directions(q: float, sigma: float, steps: int, **kw) -> tuple[PLD, PLD]:
    return tuple(  # type: ignore[return-value]
        PLD.subsampled_gaussian(q, sigma, direction=d, **kw).self_compose(steps)
        for d in ("remove", "add")
    )


def test_peer_crash_case_q01_sigma05() -> None:
    rem, add = both_directions(0.1, 0.5, 100)
    for delta in (1e-5, 1e-10):
        e = [p.epsilon_for_delta(delta) for p in (rem, add)]
        for b in e:
            assert math.isfinite(b.upper) and 0 <= b.lower <= b.upper
        assert max(b.lower for b in e) <= rdp_upper_epsilon(0.1, 0.5, 100, delta)


@pytest.mark.parametrize("tail_mass", [1e-15, pytest.param(1e-20, marks=pytest.mark.slow)])
def test_mnist_tiny_delta_is_finite_and_sound(tail_mass: float) -> None:
    q, sigma, steps = 256 / 60000, 1.1, 14100
    rem, add = both_directions(q, sigma, steps, tail_mass=tail_mass)
    for delta in (1e-12, 1e-5):
        e = [p.epsilon_for_delta(delta) for p in (rem, add)]
        upper = max(b.upper for b in e)
        lower = max(b.lower for b in e)
        assert math.isfinite(upper) and lower <= upper
        rdp = rdp_upper_epsilon(q, sigma, steps, delta)
        assert lower <= rdp
        assert upper <= rdp  # the numerical bound is tighter than RDP here
        assert upper - lower <= 0.05 * upper


@pytest.mark.slow  # 15 s; extreme counts stay in make test via test_pld_robust's fuzz
def test_huge_count_sigma03_is_finite_and_sound() -> None:
    q, sigma, steps = 256 / 60000, 0.3, 10**6
    rem, add = both_directions(q, sigma, steps)
    e = [p.epsilon_for_delta(1e-5) for p in (rem, add)]
    for b in e:
        assert math.isfinite(b.upper) and np.isfinite(b.lower) and b.lower <= b.upper
        assert b.upper - b.lower <= 3e-3 * b.upper  # coarsened grid: Hoeffding term grows
    assert max(b.lower for b in e) <= rdp_upper_epsilon(q, sigma, steps, 1e-5)
    full = PLD.gaussian(0.3).self_compose(10**6).epsilon_for_delta(1e-5)
    assert full.lower <= gaussian_epsilon(1000 / 0.3, 1e-5) <= full.upper


# --------------------------------------------------------------------------------------
# peers


def dp_accounting_epsilon(q: float, sigma: float, steps: int, delta: float, h: float) -> float:
    dpl = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    pl = dpl.from_gaussian_mechanism(sigma, value_discretization_interval=h, sampling_prob=q)
    return float(pl.self_compose(steps).get_epsilon_for_delta(delta))


@pytest.mark.peers
@pytest.mark.parametrize(
    "q,sigma,steps", [(0.01, 1.0, 100), (0.1, 2.0, 200), (0.05, 0.8, 50), (256 / 60000, 1.1, 14100)]
)
def test_subsampled_gaussian_vs_dp_accounting(q: float, sigma: float, steps: int) -> None:
    h, delta = 1e-4, 1e-5
    ours = [p.epsilon_for_delta(delta) for p in both_directions(q, sigma, steps)]
    upper, lower = max(b.upper for b in ours), max(b.lower for b in ours)
    theirs = dp_accounting_epsilon(q, sigma, steps, delta, h)
    # both are pessimistic connect-the-dots discretisations: they agree to 0.1%
    assert abs(upper - theirs) <= 1e-3 * theirs
    # dp_accounting's pessimistic value is an upper bound: our lower bound must be below it
    assert lower <= theirs


@pytest.mark.peers
def test_mnist_vs_dp_accounting_fine_grid() -> None:
    q, sigma, steps, delta, h = 256 / 60000, 1.1, 14100, 1e-5, 1e-5
    ours = max(
        p.epsilon_for_delta(delta).upper
        for p in both_directions(q, sigma, steps, value_discretization_interval=h)
    )
    theirs = dp_accounting_epsilon(q, sigma, steps, delta, h)
    assert abs(ours - theirs) <= 1e-3 * theirs


@pytest.mark.peers
def test_subsampled_gaussian_vs_prv_accountant() -> None:
    prv = pytest.importorskip("prv_accountant")
    q, sigma, steps, delta = 256 / 60000, 1.1, 14100, 1e-5
    acc = prv.PRVAccountant(
        prvs=[
            prv.PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)
        ],
        eps_error=0.01,
        delta_error=1e-10,
        max_self_compositions=[steps],
    )
    p_lo, _, p_up = acc.compute_epsilon(delta=delta, num_self_compositions=[steps])
    rem = PLD.subsampled_gaussian(q, sigma, direction="remove").self_compose(steps)
    ours = rem.epsilon_for_delta(delta)
    # both brackets contain the truth for this direction, so they must overlap
    assert ours.lower <= p_up and p_lo <= ours.upper


# --------------------------------------------------------------------------------------
# algebraic properties (hypothesis)


probs3 = st.lists(st.floats(0.01, 1.0), min_size=3, max_size=3).map(
    lambda v: np.asarray(v) / np.sum(v)
)


@settings(max_examples=25, deadline=None)
@given(probs3, probs3, st.floats(0.0, 3.0))
def test_properties_of_explicit_pairs(p: np.ndarray, q: np.ndarray, eps: float) -> None:
    pld = PLD.from_distributions(p, q)
    grid = np.linspace(0.0, 3.0, 13)
    b = pld.delta_for_epsilon(grid)
    assert np.all(b.lower <= b.upper)
    assert np.all(np.diff(b.upper) <= 1e-15) and np.all(np.diff(b.lower) <= 1e-15)
    ab = pld.compose(PLD.from_distributions(q, p))
    ba = PLD.from_distributions(q, p).compose(pld)
    x, y = ab.delta_for_epsilon(eps), ba.delta_for_epsilon(eps)
    p2, q2 = np.outer(p, q).ravel(), np.outer(q, p).ravel()
    truth = float(np.sum(np.clip(p2 - math.exp(eps) * q2, 0, None)))
    assert contains(x, truth) and contains(y, truth)
    for delta in (0.5, 1e-3):
        e = ab.epsilon_for_delta(delta)
        if math.isfinite(e.upper):
            assert ab.delta_for_epsilon(e.upper).upper <= delta * (1 + 1e-12)
        assert e.lower <= e.upper


# --------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    "call",
    [
        lambda: PLD.gaussian(0.0),
        lambda: PLD.gaussian(-1.0),
        lambda: PLD.gaussian(float("nan")),
        lambda: PLD.gaussian(1.0, value_discretization_interval=0.0),
        lambda: PLD.gaussian(1.0, value_discretization_interval=-1e-4),
        lambda: PLD.gaussian(1.0, tail_mass=0.0),
        lambda: PLD.subsampled_gaussian(1.5, 1.0),
        lambda: PLD.subsampled_gaussian(-0.1, 1.0),
        lambda: PLD.subsampled_gaussian(float("nan"), 1.0),
        lambda: PLD.subsampled_gaussian(0.1, 1.0, direction="both"),  # type: ignore[arg-type]
        lambda: PLD.laplace(0.0),
        lambda: PLD.randomized_response(0.3),
        lambda: PLD.approx_dp(-1.0, 0.0),
        lambda: PLD.approx_dp(1.0, 1.5),
        lambda: PLD.discrete_laplace(1.0, 0),
        lambda: PLD.discrete_gaussian(0.0),
        lambda: PLD.discrete_gaussian(1.0, 1.5),  # type: ignore[arg-type]
        lambda: PLD.from_distributions([0.5, 0.5], [0.2, 0.2]),
        lambda: PLD.from_distributions([0.5, 0.5], [1.0]),
        lambda: PLD.gaussian(1.0).self_compose(-1),
        lambda: PLD.gaussian(1.0).self_compose(2.0),  # type: ignore[arg-type]
        lambda: PLD.gaussian(1.0).delta_for_epsilon(-0.1),
        lambda: PLD.gaussian(1.0).delta_for_epsilon(float("nan")),
        lambda: PLD.gaussian(1.0).delta_for_epsilon([0.1, float("nan")]),
        lambda: PLD.gaussian(1.0).epsilon_for_delta(0.0),
        lambda: PLD.gaussian(1.0).epsilon_for_delta(1.0),
        lambda: PLD.gaussian(1.0).epsilon_for_delta(float("nan")),
        lambda: PLD.gaussian(1.0).epsilon_for_delta([1e-5, 2.0]),
        lambda: PLD.gaussian(1.0).compose("x"),  # type: ignore[arg-type]
    ],
)
def test_bad_input_raises_our_error(call) -> None:
    with pytest.raises(PrivacyParameterError):
        call()


def test_error_message_names_parameter() -> None:
    with pytest.raises(PrivacyParameterError, match=r"sampling_rate=1\.5"):
        PLD.subsampled_gaussian(1.5, 1.0)
    with pytest.raises(PrivacyParameterError, match="value_discretization_interval"):
        PLD.gaussian(1.0, value_discretization_interval=0)


def test_identity_and_zero_count() -> None:
    g = PLD.gaussian(1.0)
    z = g.self_compose(0)
    assert z.delta_for_epsilon(0.0).upper <= 1e-15
    assert z.epsilon_for_delta(1e-9).upper == 0.0
    same = g.compose(PLD.identity())
    for e in (0.0, 1.0):
        assert contains(same.delta_for_epsilon(e), gaussian_delta(1.0, e))


def test_scalar_and_vector_queries_agree() -> None:
    pld = PLD.gaussian(2.0).self_compose(3)
    v = pld.delta_for_epsilon([0.5, 1.0])
    s = pld.delta_for_epsilon(1.0)
    assert isinstance(s.upper, float) and s.upper == v.upper[1]
    ev = pld.epsilon_for_delta(np.array([1e-3, 1e-6]))
    es = pld.epsilon_for_delta(1e-6)
    assert es.upper == ev.upper[1]
    inf = pld.delta_for_epsilon(math.inf)
    assert inf.upper <= 1e-14
