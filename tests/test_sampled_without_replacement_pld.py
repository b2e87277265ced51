"""PLD of fixed-size sampling without replacement (replace-one) of the Gaussian (issue 16).

The PLD is the symmetrised Poisson-subsampled pair (Dong, Roth & Su 2022, Thm 9: the
trade-off ``C_p(f) = min(f_p, f_p^-1)**``). References: the closed-form one-step hockey-stick
curve, exact quadrature of the mechanism's one-step pairs (collinear triangles of means),
dp_accounting composing the same symmetrised pair from its own discretisation, dp_accounting's
Poisson pair (attained by sampling without replacement, so a lower bound on the truth), the
plain Gaussian (full batch) and our WBK RDP bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

from renyi.accountants import PldAccountant, RdpAccountant
from renyi.errors import PrivacyParameterError, UnsupportedEventError
from renyi.events import (
    GaussianEvent,
    LaplaceEvent,
    Neighbouring,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
)
from renyi.sampled_pld import symmetrised_sampled_gaussian_pld

dpa = pytest.importorskip("dp_accounting")

R1 = Neighbouring.REPLACE_ONE


def _wor(n: int, b: int, s: float, steps: int) -> SelfComposedEvent:
    return SelfComposedEvent(SampledWithoutReplacementEvent(n, b, GaussianEvent(s, R1)), steps)


def _pld_eps(event: SelfComposedEvent, delta: float) -> float:
    acc = PldAccountant()
    acc.compose(event)
    return float(acc.epsilon(delta).details["pld_epsilon"])


def _hockey_r(q: float, s: float, eps: float) -> float:
    """H_{e^eps}((1-q) N(0,s²) + q N(1,s²) || N(0,s²)) for eps >= 0 (closed form)."""
    e2 = math.log1p(math.expm1(eps) / q)  # advanced joint convexity: q H_{e^e2}(N(1)||N(0))
    a = 1.0 / (2.0 * s)
    return q * (norm.cdf(a - e2 * s) - math.exp(e2) * norm.cdf(-a - e2 * s))


def _hockey_sym(q: float, s: float, eps: float) -> float:
    """The symmetrised pair's curve: H_R above eps = 0, the reversed pair's below."""
    if eps >= 0.0:
        return _hockey_r(q, s, eps)
    return -math.expm1(eps) + math.exp(eps) * _hockey_r(q, s, -eps)


def _delta_of(pld: object, eps: float) -> float:
    """δ(ε) of the pessimistic side, any real ε (from its atoms and infinity mass)."""
    losses, masses = pld.pmf("upper")  # type: ignore[attr-defined]
    finite = -np.expm1(np.minimum(eps - losses, 0.0))
    return math.fsum((masses * finite).tolist()) + float(pld.infinity_mass)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("q", "s"), [(0.01, 0.8), (0.2, 1.5), (0.5, 0.4)])
def test_one_step_matches_closed_form_and_is_pessimistic(q: float, s: float) -> None:
    pld = symmetrised_sampled_gaussian_pld(q, s, value_discretization_interval=1e-4)
    for eps in (-1.0, -0.2, 0.0, 0.05, 0.3, 1.0, 2.0):
        exact = _hockey_sym(q, s, eps)
        got = _delta_of(pld, eps)
        if eps >= 0.0:
            assert float(pld.delta_for_epsilon(eps).upper) >= got * (1 - 1e-9)
        assert got >= exact * (1 - 1e-9) - 1e-15, (eps, got, exact)
        assert got <= exact * 1.01 + 1e-12, (eps, got, exact)


def _pair_hockey(q: float, s: float, a: float, a2: float, c: float, eps: float) -> float:
    """H_{e^eps} of the exact one-step output pair (1-q) N(c) + q N(a) vs (1-q) N(c) + q N(a2)
    (Simpson's rule on a fine grid; error far below the tolerances used)."""
    y = np.linspace(min(a, a2, c) - 14 * s, max(a, a2, c) + 14 * s, 200_001)
    p = (1 - q) * norm.pdf(y, c, s) + q * norm.pdf(y, a, s)
    r = (1 - q) * norm.pdf(y, c, s) + q * norm.pdf(y, a2, s)
    return float(integrate.simpson(np.maximum(p - math.exp(eps) * r, 0.0), x=y))


def test_bounds_every_collinear_one_step_pair() -> None:
    """Means pairwise within one sensitivity (the coupling of the proof), any order."""
    q, s = 0.3, 0.7
    pld = symmetrised_sampled_gaussian_pld(q, s, value_discretization_interval=1e-4)
    rng = np.random.default_rng(16)
    triangles = [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.5, -0.5, 0.0), (1.0, 0.0, 0.5)]
    while len(triangles) < 10:
        a, a2, c = rng.uniform(-0.5, 0.5, size=3)
        if max(abs(a - a2), abs(a - c), abs(a2 - c)) <= 1.0:
            triangles.append((a, a2, c))
    for eps in (-0.5, 0.0, 0.4, 1.2):
        bound = _delta_of(pld, eps)
        for a, a2, c in triangles:
            assert _pair_hockey(q, s, a, a2, c, eps) <= bound + 1e-9, (a, a2, c, eps)
    # the Poisson-like corner (a' = c) attains the bound at eps >= 0
    assert _pair_hockey(q, s, 1.0, 0.0, 0.0, 0.4) == pytest.approx(_hockey_r(q, s, 0.4), rel=1e-6)


def _dp_accounting_symmetrised(
    q: float, s: float, steps: int, delta: float, *, pessimistic: bool
) -> float:
    """dp_accounting composing the same symmetrised pair, built from y-bins of the exact
    Poisson pair above its zero-loss point y = 1/2 and their mirror image (an independent
    discretisation and composition of the same pair; binning makes it slightly optimistic,
    so only its optimistic estimate is a lower reference; its pessimistic one rounds every
    loss up to the grid, looser than connect-the-dots)."""
    edges = np.linspace(0.5, 1.0 + 14 * s, 10_001)
    qc = norm.sf(edges, 0.0, s)
    pc = (1 - q) * qc + q * norm.sf(edges, 1.0, s)
    pm, qm = -np.diff(pc), -np.diff(qc)
    pm[-1] += pc[-1]
    qm[-1] += qc[-1]
    centre = 1.0 - pm.sum() - qm.sum()
    upper: dict[object, float] = {"c": math.log(centre)}
    lower: dict[object, float] = {"c": math.log(centre)}
    for k, (pp, qq) in enumerate(zip(pm, qm, strict=True)):
        if pp > 0 and qq > 0:
            upper[("+", k)], lower[("+", k)] = math.log(pp), math.log(qq)
            upper[("-", k)], lower[("-", k)] = math.log(qq), math.log(pp)
    pld = dpa.pld.privacy_loss_distribution.from_two_probability_mass_functions(
        lower, upper, pessimistic_estimate=pessimistic, value_discretization_interval=1e-4
    )
    return float(pld.self_compose(steps).get_epsilon_for_delta(delta))


def _dp_accounting_poisson(q: float, s: float, steps: int, delta: float) -> float:
    acc = dpa.pld.PLDAccountant()
    event = dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(s))
    acc.compose(dpa.SelfComposedDpEvent(event, steps))
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize(
    ("n", "b", "s", "steps", "delta"),
    [(60_000, 256, 0.55, 1170, 1e-5), (1000, 50, 1.0, 100, 1e-6)],
)
def test_composed_against_peers_and_rdp(n: int, b: int, s: float, steps: int, delta: float) -> None:
    q = b / n
    event = _wor(n, b, s, steps)
    ours = _pld_eps(event, delta)
    lo = _dp_accounting_symmetrised(q, s, steps, delta, pessimistic=False)
    hi = _dp_accounting_symmetrised(q, s, steps, delta, pessimistic=True)
    assert lo * (1 - 1e-4) <= ours <= min(hi, lo * 1.01), (lo, ours, hi)
    # dp_accounting's Poisson pair is attained by sampling without replacement (a' = c):
    # the truth, hence our bound, is at least its value (up to its own discretisation)
    assert ours >= _dp_accounting_poisson(q, s, steps, delta) * (1 - 1e-3)
    rdp = RdpAccountant()
    rdp.compose(event)
    assert ours <= rdp.epsilon(delta).epsilon
    acc = PldAccountant()
    acc.compose(event)
    res = acc.epsilon(delta)
    assert res.epsilon == pytest.approx(ours) and res.details["bound"] == "pld"


@pytest.mark.parametrize(("s", "steps"), [(2.0, 10), (0.7, 3)])
def test_full_batch_is_the_gaussian(s: float, steps: int) -> None:
    delta = 1e-6
    full = _pld_eps(_wor(100, 100, s, steps), delta)
    plain = _pld_eps(SelfComposedEvent(GaussianEvent(s, R1), steps), delta)
    assert full == pytest.approx(plain, rel=1e-12)
    # dp_accounting's Gaussian PLD with the same noise multiplier (sensitivity 1)
    exact = dpa.pld.PLDAccountant()
    exact.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(s), steps))
    assert full == pytest.approx(exact.get_epsilon(delta), rel=2e-3)


def test_more_steps_larger_rate_cost_more() -> None:
    eps = [_pld_eps(_wor(10_000, b, 1.0, 50), 1e-5) for b in (10, 100, 1000, 10_000)]
    assert eps == sorted(eps) and eps[0] < eps[-1]


def test_bad_inputs() -> None:
    with pytest.raises(UnsupportedEventError, match="Gaussian"):
        PldAccountant().compose(SampledWithoutReplacementEvent(10, 2, LaplaceEvent(1.0, R1)))
    with pytest.raises(PrivacyParameterError, match="an Event"):
        SampledWithoutReplacementEvent(10, 2, 1.0)  # type: ignore[arg-type]
    with pytest.raises(PrivacyParameterError, match="sample_size"):
        SampledWithoutReplacementEvent(10, 11, GaussianEvent(1.0, R1))
    for bad_rate in (0.0, -0.1, 1.5, math.nan):
        with pytest.raises(PrivacyParameterError, match="rate"):
            symmetrised_sampled_gaussian_pld(bad_rate, 1.0)
    for bad_sigma in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(PrivacyParameterError, match="noise_multiplier"):
            symmetrised_sampled_gaussian_pld(0.1, bad_sigma)


@pytest.mark.parametrize(("q", "s"), [(1e-6, 0.3), (0.999, 50.0), (1e-3, 200.0)])
def test_extreme_parameters_stay_finite(q: float, s: float) -> None:
    pld = symmetrised_sampled_gaussian_pld(q, s)
    d = float(pld.delta_for_epsilon(0.5).upper)
    assert 0.0 <= d <= 1.0
    assert d >= _hockey_r(q, s, 0.5) * (1 - 1e-9) - 1e-15


def test_tiny_noise_adapts_the_grid() -> None:
    """σ = 0.1: losses span about a hundred; the accountant coarsens the grid instead of failing."""
    event = SampledWithoutReplacementEvent(10, 5, GaussianEvent(0.1, R1))
    ours = _pld_eps(SelfComposedEvent(event, 1), 1e-5)
    assert math.isfinite(ours)
    # one step: the closed-form curve says how tight it is (sound above, within 1 % below)
    assert _hockey_r(0.5, 0.1, ours) <= 1e-5 < _hockey_r(0.5, 0.1, 0.99 * ours)
    rdp = RdpAccountant()
    rdp.compose(event)
    assert ours <= rdp.epsilon(1e-5).epsilon
