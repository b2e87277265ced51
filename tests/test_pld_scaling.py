"""Large compositions: the coarsening FFT-power ladder of ``PrivacyLossDistribution.self_compose``.

Beyond ``max_bins`` grid points the composition is computed on grids coarsened by powers of
two (run time O(log T) instead of O(sqrt T)). These tests check that the bounds stay
rigorous there (exact Gaussian ground truth, a much finer reference for the subsampled
Gaussian, peers), that the grid size stays bounded as T grows (structural, not timed), and
that small compositions are computed exactly as before.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import renyi.analysis.pld as pld_module
from renyi import closed_forms
from renyi.accountants import PldAccountant, RdpAccountant
from renyi.analysis.pld._plan import _plan
from renyi.errors import PrivacyParameterError
from renyi.events import GaussianEvent, PoissonSampledEvent
from renyi.pld import PrivacyLossDistribution as PLD

Q, SIGMA = 256 / 60000, 1.1  # Abadi et al. MNIST


def both(q: float, sigma: float, steps: int, h: float = 1e-4, max_bins: int = 1 << 17) -> list[PLD]:
    return [
        PLD.subsampled_gaussian(
            q, sigma, direction=d, value_discretization_interval=h
        ).self_compose(steps, max_bins=max_bins)
        for d in ("remove", "add")
    ]


def eps_bracket(plds: list[PLD], delta: float) -> tuple[float, float]:
    b = [p.epsilon_for_delta(delta) for p in plds]
    return max(x.lower for x in b), max(x.upper for x in b)


# --------------------------------------------------------------------------------------
# ground truth: T Gaussians with noise sigma compose to one Gaussian with mu = sqrt(T)/sigma


@pytest.mark.parametrize("steps", [10**5, 10**6])
@pytest.mark.parametrize("mu", [1.0, 4.0])
def test_full_batch_gaussian_brackets_exact_profile_after_coarsening(steps: int, mu: float) -> None:
    sigma = math.sqrt(steps) / mu
    pld = PLD.gaussian(sigma, value_discretization_interval=1e-4).self_compose(steps)
    assert pld.value_discretization_interval > 1e-4  # the ladder did coarsen
    assert pld.support_size <= pld_module.DEFAULT_MAX_BINS
    eps = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0])
    b = pld.delta_for_epsilon(eps)
    truth = np.array([closed_forms.gaussian_delta(mu, float(e)) for e in eps])
    slack = 1e-9 * truth + 1e-300
    assert np.all(b.lower - slack <= truth) and np.all(truth <= b.upper + slack)
    for delta in (1e-3, 1e-6, 1e-10, 1e-12):
        e = pld.epsilon_for_delta(delta)
        exact = closed_forms.gaussian_epsilon(mu, delta)
        assert e.lower <= exact * (1 + 1e-9) and exact <= e.upper * (1 + 1e-9), (delta, e, exact)
        # as tight as the fine grid allows (the same allowance as tests/test_pld.py)
        assert e.upper - exact <= (1e-4 + steps * 1e-8) * exact + 1e-6


@pytest.mark.parametrize("mu", [1.0, 4.0])
def test_coarsened_ladder_is_as_tight_as_one_fine_power(mu: float) -> None:
    # the same composition with and without the ladder: the errors nearly coincide (the
    # fine grid's own discretisation error dominates; coarsening late adds little)
    steps = 10**5
    step = PLD.gaussian(math.sqrt(steps) / mu, value_discretization_interval=1e-4)
    ladder = step.self_compose(steps)
    direct = step.self_compose(steps, max_bins=1 << 22)
    assert ladder.value_discretization_interval > direct.value_discretization_interval == 1e-4
    assert ladder.support_size < direct.support_size / 5
    eps = np.array([0.0, 0.5, 2.0, 4.0, 8.0])
    truth = np.array([closed_forms.gaussian_delta(mu, float(e)) for e in eps])
    lad, dir_ = ladder.delta_for_epsilon(eps), direct.delta_for_epsilon(eps)
    assert np.all(lad.upper - truth <= 1.1 * (dir_.upper - truth) + 1e-12 * truth)
    assert np.all(truth - lad.lower <= 1.5 * (truth - dir_.lower) + 1e-12 * truth)
    exact = closed_forms.gaussian_epsilon(mu, 1e-6)
    lad_e, dir_e = ladder.epsilon_for_delta(1e-6), direct.epsilon_for_delta(1e-6)
    for b in (lad_e, dir_e):
        assert b.lower <= exact <= b.upper
    assert abs(lad_e.upper - dir_e.upper) <= 1e-5 * exact
    assert lad_e.upper - lad_e.lower <= 1.5 * (dir_e.upper - dir_e.lower) + 1e-6


# --------------------------------------------------------------------------------------
# subsampled Gaussian at T = 10^6


@pytest.fixture(scope="module")
def mnist_million() -> list[PLD]:
    return both(Q, SIGMA, 10**6)


def test_mnist_million_steps_contains_finer_reference(mnist_million: list[PLD]) -> None:
    lower, upper = eps_bracket(mnist_million, 1e-5)
    # a ten times finer grid with a 16 times larger window cap: its upper bound is within
    # ~1e-5 of the truth (and above it), so it must lie inside our bracket
    ref = both(Q, SIGMA, 10**6, h=1e-5, max_bins=1 << 21)
    ref_lower, ref_upper = eps_bracket(ref, 1e-5)
    assert ref_upper - ref_lower < 0.2 * (upper - lower)
    assert lower <= ref_upper <= upper
    assert ref_lower <= upper
    # accuracy kept: the default upper bound is within 1e-4 of the fine one
    assert upper - ref_upper <= 1e-4 * ref_upper
    # and the bracket is relatively no wider than at T = 10^4
    lo4, up4 = eps_bracket(both(Q, SIGMA, 10**4), 1e-5)
    assert (upper - lower) / upper <= (up4 - lo4) / up4


def test_mnist_million_steps_vs_rdp_and_tiny_delta(mnist_million: list[PLD]) -> None:
    for delta in (1e-5, 1e-12):
        lower, upper = eps_bracket(mnist_million, delta)
        assert math.isfinite(upper) and 0 <= lower <= upper
        rdp = RdpAccountant().compose(PoissonSampledEvent(Q, GaussianEvent(SIGMA)), 10**6)
        assert upper <= rdp.epsilon(delta).epsilon
        assert upper - lower <= 0.02 * upper
    # the truncated tails stay within the tail budget over all ladder stages
    for p in mnist_million:
        assert p.infinity_mass <= 1.01 * p.tail_mass


@pytest.mark.peers
def test_mnist_million_steps_vs_dp_accounting(mnist_million: list[PLD]) -> None:
    dpl = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    pl = dpl.from_gaussian_mechanism(SIGMA, value_discretization_interval=1e-4, sampling_prob=Q)
    theirs = float(pl.self_compose(10**6).get_epsilon_for_delta(1e-5))
    lower, upper = eps_bracket(mnist_million, 1e-5)
    assert abs(upper - theirs) <= 1e-4 * theirs
    assert lower <= theirs


# --------------------------------------------------------------------------------------
# structure: bounded grids, O(log T) stages, unchanged small compositions


def test_grid_size_stays_bounded_as_count_grows() -> None:
    step = PLD.subsampled_gaussian(Q, SIGMA, direction="remove")
    sizes, grids = [], []
    for steps in (10**5, 10**6, 10**7, 10**8):
        plan = _plan(step.upper_side, steps, step.tail_mass, 1 << 17)
        assert len(plan.levels) <= math.ceil(math.log(steps, 16))
        pld = step.self_compose(steps)
        sizes.append(max(pld.upper_side.size, pld.lower_side.size))
        grids.append(pld.value_discretization_interval)
        b = pld.epsilon_for_delta(1e-5)
        assert math.isfinite(b.upper) and 0 <= b.lower <= b.upper
    assert max(sizes) <= pld_module.DEFAULT_MAX_BINS
    assert grids == sorted(grids) and grids[-1] >= 100 * grids[0] / 10  # grid grows ~ sqrt(T)
    # a smaller cap gives smaller grids
    small = step.self_compose(10**6, max_bins=1 << 15)
    assert small.support_size <= 1 << 15


def test_small_compositions_are_unchanged_by_the_cap() -> None:
    step = PLD.subsampled_gaussian(Q, SIGMA, direction="remove")
    a = step.self_compose(14100)
    b = step.self_compose(14100, max_bins=1 << 22)
    assert a.value_discretization_interval == 1e-4
    assert np.array_equal(a.pmf()[1], b.pmf()[1])
    assert a.epsilon_for_delta(1e-5) == b.epsilon_for_delta(1e-5)


def test_digits_of_the_count_are_composed_exactly() -> None:
    # counts with nonzero digits in every ladder level: compare with the exact Gaussian
    mu = 3.0
    for steps in (123_457, 999_999):
        pld = PLD.gaussian(math.sqrt(steps) / mu).self_compose(steps, max_bins=1 << 14)
        plan = _plan(PLD.gaussian(math.sqrt(steps) / mu).upper_side, steps, 1e-15, 1 << 14)
        assert any(d for d, _ in plan.levels)
        for delta in (1e-4, 1e-9):
            e = pld.epsilon_for_delta(delta)
            assert e.lower <= closed_forms.gaussian_epsilon(mu, delta) <= e.upper


def test_max_bins_validation() -> None:
    pld = PLD.gaussian(1.0)
    for bad in (1023, (1 << 22) + 1, 2.0, True, -5, "big"):
        with pytest.raises(PrivacyParameterError, match="max_bins"):
            pld.self_compose(10, max_bins=bad)  # type: ignore[arg-type]
    with pytest.raises(PrivacyParameterError, match="max_bins"):
        PldAccountant(max_bins=100)


def test_accountant_uses_the_ladder_by_default() -> None:
    step = PoissonSampledEvent(Q, GaussianEvent(SIGMA))
    acc = PldAccountant().compose(step, 10**6)
    res = acc.epsilon(1e-5)
    assert res.details["composed_interval"] > res.details["value_discretization_interval"]
    assert res.epsilon_lower is not None and res.epsilon_estimate is not None
    assert res.epsilon_lower <= res.epsilon_estimate <= res.epsilon
    again = PldAccountant.from_state_dict(acc.state_dict())
    assert again.epsilon(1e-5).epsilon == res.epsilon
    assert acc.state_dict()["config"]["max_bins"] == pld_module.DEFAULT_MAX_BINS
    fine = PldAccountant(max_bins=1 << 22).compose(step, 14100).epsilon(1e-5)
    default = PldAccountant().compose(step, 14100).epsilon(1e-5)
    assert fine.epsilon == default.epsilon
    assert default.details["composed_interval"] == 1e-4
