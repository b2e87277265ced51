"""Individual Rényi filters (Feldman & Zrnic 2021): no record ever passes the budget."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from renyi.accountants import RdpAccountant
from renyi.errors import PrivacyParameterError
from renyi.events import GaussianEvent, PoissonSampledEvent
from renyi.individual import IndividualRdpFilter
from renyi.subsampling import poisson_subsampled_gaussian_rdp


def test_all_norms_at_c_is_standard_accounting() -> None:
    q, sigma, steps = 0.02, 1.1, 40
    f = IndividualRdpFilter(5, noise_multiplier=sigma, sampling_rate=q, planned_steps=steps)
    admitted = [f.admit(np.ones(5)) for _ in range(steps + 3)]
    assert all(a.all() for a in admitted[:steps])
    assert not admitted[steps].any() and f.retired == 5
    assert (f.steps_taken == steps).all()
    assert (f.retired_at == steps).all()
    acc = RdpAccountant().compose(PoissonSampledEvent(q, GaussianEvent(sigma)), count=steps)
    np.testing.assert_array_equal(f.spent()[0], f.budget)
    np.testing.assert_allclose(f.budget, acc.curve.epsilons, rtol=1e-15, atol=0)
    assert f.epsilons(1e-5) == pytest.approx(acc.epsilon(1e-5).epsilon, rel=1e-12)
    assert f.budget_epsilon(1e-5) == pytest.approx(acc.epsilon(1e-5).epsilon, rel=1e-12)


def _quantised(s: float, levels: int) -> Fraction:
    """Smallest multiple of 1/levels >= s, in exact arithmetic."""
    x = Fraction(s) * levels
    n = x.numerator // x.denominator + (x.numerator % x.denominator != 0)
    return Fraction(min(n, levels), levels)


def test_never_past_the_budget_recomputed_independently() -> None:
    """Exhaustive bookkeeping on a small run, recomputed from scratch per record."""
    rng = np.random.default_rng(11)
    n, steps, q, sigma, levels = 12, 60, 0.05, 0.9, 16
    orders = np.array([1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0])
    f = IndividualRdpFilter(
        n, noise_multiplier=sigma, sampling_rate=q, planned_steps=20, levels=levels, orders=orders
    )
    budget = 20 * poisson_subsampled_gaussian_rdp(q, sigma, orders)
    spent = np.zeros((n, orders.size))
    retired = np.zeros(n, dtype=bool)
    for _ in range(steps):
        # records drawn from very different gradient regimes, some exactly at grid points
        s = np.clip(rng.choice([0.0, 1 / 3, 0.5, 1.0]) * rng.uniform(0.2, 1.2, n), 0, 1)
        s[0] = 1.0
        admitted = f.admit(s)
        for i in range(n):
            lev = _quantised(float(s[i]), levels)
            assert Fraction(int(f.level(s)[i]), levels) == lev
            cost = (
                np.zeros(orders.size)
                if lev == 0
                else poisson_subsampled_gaussian_rdp(q, sigma / float(lev), orders)
            )
            would = spent[i] + cost
            if retired[i]:
                assert not admitted[i]
            elif admitted[i]:
                spent[i] = would
            else:  # retired now: it really did not fit
                assert (would > budget * (1 + 1e-12)).any()
                retired[i] = True
        assert (spent <= budget * (1 + 1e-12)).all()
    np.testing.assert_allclose(f.spent(), spent, rtol=1e-12, atol=1e-300)
    assert retired[0] and f.steps_taken[0] == 20  # the worst-case record: exactly the plan
    assert f.steps_taken.max() > 20  # cheaper records trained for longer
    eps = f.epsilons(1e-5)
    assert (eps <= f.budget_epsilon(1e-5) * (1 + 1e-12)).all()


@pytest.mark.parametrize("levels", [1, 3, 7, 64, 1000])
def test_levels_never_round_down(levels: int) -> None:
    f = IndividualRdpFilter(
        200, noise_multiplier=1.0, sampling_rate=0.1, planned_steps=1, levels=levels, orders=[2.0]
    )
    s = np.concatenate([np.linspace(0, 1, 100), np.random.default_rng(0).uniform(0, 1, 100)])
    s[:5] = [1 / 3, 0.1, 0.7, 1 / levels, 1 - 1e-16]
    lev = f.level(s)
    assert (lev / levels >= s).all() and ((lev - 1) / levels < s)[s > 0].all()


def test_summary_and_state() -> None:
    f = IndividualRdpFilter(4, noise_multiplier=1.0, sampling_rate=0.1, planned_steps=3)
    for _ in range(5):
        f.admit(np.array([1.0, 0.5, 0.2, 0.0]))
    summ = f.summary(1e-5)
    assert summ["examples_retired"] == 1 and summ["min"] == 0.0
    assert summ["max"] <= summ["budget"]
    g = IndividualRdpFilter(4, noise_multiplier=1.0, sampling_rate=0.1, planned_steps=3)
    g.load_state_dict(f.state_dict())
    np.testing.assert_array_equal(g.spent(), f.spent())
    assert g.admit(np.ones(4)).tolist() == f.admit(np.ones(4)).tolist()


def test_bad_input() -> None:
    f = IndividualRdpFilter(2, noise_multiplier=1.0, sampling_rate=0.1, planned_steps=3)
    with pytest.raises(PrivacyParameterError, match="sensitivities"):
        f.admit(np.array([1.5, 0.0]))
    with pytest.raises(PrivacyParameterError, match="sensitivities"):
        f.admit(np.array([np.nan, 0.0]))
    with pytest.raises(PrivacyParameterError, match="sensitivities"):
        f.admit(np.ones(3))
    with pytest.raises(PrivacyParameterError, match="planned_steps"):
        IndividualRdpFilter(2, noise_multiplier=1.0, sampling_rate=0.1, planned_steps=0)
    with pytest.raises(PrivacyParameterError, match="noise_multiplier"):
        IndividualRdpFilter(2, noise_multiplier=0.0, sampling_rate=0.1, planned_steps=1)
    with pytest.raises(PrivacyParameterError, match="orders"):
        IndividualRdpFilter(2, noise_multiplier=1.0, sampling_rate=0.1, planned_steps=1, orders=[])
