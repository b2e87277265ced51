"""PLD upper bounds within 0.1 % of the truth at tiny delta and tiny sampling rates (issue 16,
item 3).

At delta = 1e-12 the FFT round-off bound, relative to the total mass, used to set the
bound (0.2204 at h = 1e-4 and 0.2456 at h = 1e-5 where the truth is 0.2009: a finer grid
gave a looser bound). References are independent of our code: dp_accounting's pessimistic
PLD at h = 1e-5 (a peer; accurate to ~1e-4 relative at these deltas) and, in the slow tests,
prv_accountant's bracketed estimate (where dp_accounting itself drifts below the truth at
delta = 1e-12).
"""

from __future__ import annotations

import warnings

import pytest

from renyi.accountants import PldAccountant, RdpAccountant
from renyi.errors import OrderAtGridEdgeWarning
from renyi.events import GaussianEvent, PoissonSampledEvent
from renyi.pld import PrivacyLossDistribution as PLD


def ours(q: float, sigma: float, steps: int, deltas: list[float], h: float = 1e-4) -> list:
    acc = PldAccountant(value_discretization_interval=h)
    acc.compose(PoissonSampledEvent(q, GaussianEvent(sigma)), steps)
    return [acc.epsilon(d) for d in deltas]


def rdp(q: float, sigma: float, steps: int, delta: float) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderAtGridEdgeWarning)
        acc = RdpAccountant().compose(PoissonSampledEvent(q, GaussianEvent(sigma)), steps)
        return acc.epsilon(delta).epsilon


def dp_accounting_pessimistic(q: float, sigma: float, steps: int, deltas: list[float]) -> list:
    dpl = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    pl = dpl.from_gaussian_mechanism(
        sigma, value_discretization_interval=1e-5, sampling_prob=q, pessimistic_estimate=True
    ).self_compose(steps)
    return [float(pl.get_epsilon_for_delta(d)) for d in deltas]


def check(res: object, ref: float, rel: float = 1e-3) -> None:
    eps, lower = res.epsilon, res.epsilon_lower  # type: ignore[attr-defined]
    assert res.details["bound"] == "pld"  # type: ignore[attr-defined]
    assert abs(eps - ref) <= rel * ref, (eps, ref)
    assert lower <= ref * (1 + 1e-4)  # the lower bound stays below the reference


@pytest.mark.peers
@pytest.mark.parametrize(
    "q,sigma,steps,deltas",
    [
        (4.9e-4, 1.09, 62, [1e-12, 2.1e-10]),  # the setting
        (5e-3, 2.0, 50, [1e-12, 1e-10]),
        (2e-3, 1.2, 500, [1e-10, 2.1e-10]),
    ],
)
def test_tiny_delta_within_a_tenth_of_a_percent_of_dp_accounting(
    q: float, sigma: float, steps: int, deltas: list[float]
) -> None:
    refs = dp_accounting_pessimistic(q, sigma, steps, deltas)
    for res, ref, delta in zip(ours(q, sigma, steps, deltas), refs, deltas, strict=True):
        check(res, ref)
        assert res.epsilon < rdp(q, sigma, steps, delta)


@pytest.mark.peers
@pytest.mark.parametrize(
    "q,sigma,steps,deltas",
    [(2e-4, 1.5, 1000, [1e-5, 1e-10]), (1e-4, 5.0, 10_000, [1e-5, 1e-8])],
)
def test_small_losses_get_a_grid_that_resolves_them(
    q: float, sigma: float, steps: int, deltas: list[float]
) -> None:
    # one step's loss spreads over ~1.6 (q = 2e-4) or ~0.4 (q = 1e-4) grid steps at
    # h = 1e-4: epsilon was 3.7 % too large; the step is now discretised on h / 2**k.
    # Reference: dp_accounting at h = 1e-6 (at its h = 1e-5 it is itself 2.3 % loose on
    # the second setting, which we now beat)
    dpl = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    pl = dpl.from_gaussian_mechanism(
        sigma, value_discretization_interval=1e-6, sampling_prob=q, pessimistic_estimate=True
    ).self_compose(steps)
    for res, delta in zip(ours(q, sigma, steps, deltas), deltas, strict=True):
        check(res, float(pl.get_epsilon_for_delta(delta)))
        assert res.details["composed_interval"] < 1e-4


def test_finer_grid_is_not_looser_at_tiny_delta() -> None:
    # before: 0.2115 (h = 1e-3), 0.2204 (1e-4), 0.2456 (1e-5) with a truth of 0.2009
    # (the PLDs themselves: the accountant would refine these grids on its own)
    ups = []
    for h in (1e-3, 1e-4, 3e-5):
        bounds = [
            PLD.subsampled_gaussian(4.9e-4, 1.09, direction=d, value_discretization_interval=h)
            .self_compose(62)
            .epsilon_for_delta(1e-12)
            for d in ("remove", "add")
        ]
        ups.append((max(b.upper for b in bounds), max(b.estimate for b in bounds)))
    for upper, estimate in ups:
        assert upper <= 1.001 * estimate
    assert ups[1][0] <= ups[0][0]
    assert ups[2][0] <= ups[1][0] * (1 + 2e-4)


@pytest.mark.slow
@pytest.mark.peers
@pytest.mark.parametrize(
    "q,sigma,steps",
    [(4.9e-4, 1.09, 62), (1e-4, 0.7, 30), (1e-3, 0.9, 200)],
)
def test_delta_1e12_within_a_tenth_of_a_percent_of_prv(q: float, sigma: float, steps: int) -> None:
    prv = pytest.importorskip("prv_accountant")
    delta = 1e-12
    acc = prv.PRVAccountant(
        prvs=[
            prv.PoissonSubsampledGaussianMechanism(noise_multiplier=sigma, sampling_probability=q)
        ],
        max_self_compositions=[steps],
        eps_error=1e-4,
        delta_error=delta * 1e-4,
    )
    lo, est, _hi = acc.compute_epsilon(delta=delta, num_self_compositions=[steps])
    (res,) = ours(q, sigma, steps, [delta])
    assert res.epsilon >= lo  # sound against PRV's lower end
    check(res, est)
