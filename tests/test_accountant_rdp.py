"""RDP accountant: peers as oracles, closed forms, and the calibration contract."""

import math
import warnings

import numpy as np
import pytest

from renyi.accountants import RdpAccountant, ZcdpAccountant, epsilon_report, event_rdp
from renyi.calibration import (
    calibrate_noise_multiplier,
    calibrate_sample_rate,
    calibrate_steps,
    dpsgd_epsilon,
    epochs_to_steps,
)
from renyi.closed_forms import gaussian_epsilon
from renyi.curves import DEFAULT_ORDERS
from renyi.errors import PrivacyParameterError, UnsupportedEventError
from renyi.events import (
    ApproxDpEvent,
    ComposedEvent,
    CustomEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDpEvent,
    RdpEvent,
    ZcdpEvent,
)

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.rdp import rdp_privacy_accountant as rpa  # noqa: E402

GRID = [(q, s, t) for q in (1e-3, 0.01, 0.1) for s in (0.8, 1.1, 4.0) for t in (1, 100, 10_000)]


@pytest.mark.parametrize("q, sigma, steps", GRID)
def test_never_looser_than_dp_accounting(q, sigma, steps):
    """Our grid contains dp_accounting's; same conversion, so ε must be <= theirs.

    On integer orders (where dp_accounting's binomial expansion is exact) both must give the
    same number: a peer as oracle. Off integers dp_accounting's fractional-order series
    overestimates, so there we only require ours <= theirs.
    """
    ours = dpsgd_epsilon(sigma, q, steps, 1e-5).epsilon
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    acc = rpa.RdpAccountant()
    acc.compose(event, steps)
    assert ours <= acc.get_epsilon(1e-5) * (1 + 1e-9)
    same_grid = rpa.RdpAccountant([float(a) for a in DEFAULT_ORDERS if a % 1 == 0])
    same_grid.compose(event, steps)
    ours_same = dpsgd_epsilon(
        sigma, q, steps, 1e-5, accountant=RdpAccountant(same_grid._orders)
    ).epsilon
    assert ours_same == pytest.approx(same_grid.get_epsilon(1e-5), rel=1e-7)


@pytest.mark.parametrize("q, sigma", [(0.01, 1.0), (0.1, 2.0), (0.5, 0.7)])
def test_integer_orders_match_dp_accounting(q, sigma):
    orders = np.arange(2.0, 65.0)
    ours = event_rdp(PoissonSampledEvent(q, GaussianEvent(sigma)), orders)
    acc = rpa.RdpAccountant(orders.tolist())
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)))
    np.testing.assert_allclose(ours, acc._rdp, rtol=1e-8)


def test_full_batch_is_plain_gaussian():
    orders = np.array([1.5, 2.0, 10.0, 100.0])
    got = event_rdp(PoissonSampledEvent(1.0, GaussianEvent(1.3)), orders)
    np.testing.assert_array_equal(got, orders / (2 * 1.3**2))
    assert np.all(event_rdp(PoissonSampledEvent(0.0, GaussianEvent(1.3)), orders) == 0)


def test_events_of_every_kind():
    orders = np.array([2.0, 4.0])
    np.testing.assert_allclose(event_rdp(ZcdpEvent(0.5), orders), [1.0, 2.0])
    np.testing.assert_allclose(
        event_rdp(ComposedEvent((GaussianEvent(1.0), GaussianEvent(1.0))), orders), [2.0, 4.0]
    )
    assert np.all(event_rdp(PureDpEvent(1.0), orders) <= 1.0)
    np.testing.assert_allclose(event_rdp(RdpEvent((3.0,), (0.7,)), orders), [0.7, math.inf])
    np.testing.assert_allclose(event_rdp(CustomEvent("x", lambda a: 0.1 * a), orders), [0.2, 0.4])
    with pytest.raises(UnsupportedEventError, match="delta"):
        event_rdp(ApproxDpEvent(1.0, 1e-6), orders)
    with pytest.raises(PrivacyParameterError, match="CustomEvent"):
        event_rdp(CustomEvent("bad", lambda a: -a), orders)
    with pytest.raises(PrivacyParameterError, match="orders"):
        RdpAccountant(orders=[0.5, 2.0])


def test_laplace_composition_vs_exact_pure_bound():
    acc = RdpAccountant().compose(LaplaceEvent(10.0), 100)  # 100 x 0.1-DP
    assert acc.epsilon(1e-6).epsilon < 10.0  # better than basic composition


def test_zcdp_accountant_ignores_amplification_safely():
    sub = PoissonSampledEvent(0.01, GaussianEvent(1.0))
    z = ZcdpAccountant().compose(sub, 100)
    r = RdpAccountant().compose(sub, 100)
    assert z.rho == pytest.approx(100 * 0.5)
    assert z.epsilon(1e-5).epsilon > r.epsilon(1e-5).epsilon


def test_report_lists_unsupported_with_reason():
    rep = epsilon_report(ApproxDpEvent(0.5, 1e-7), delta=1e-5)
    names = {r.accountant for r in rep.results}
    assert "approx" in names and "rdp" not in names
    assert any(name == "rdp" and "delta" in why for name, why in rep.unsupported)
    assert "approx" in str(rep)


# ----------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("target", [0.5, 1.0, 3.0, 8.0])
def test_calibration_is_conservative_and_tight(target):
    q, steps = 256 / 60000, 14100
    res = calibrate_noise_multiplier(target, 1e-5, q, steps)
    assert res.epsilon <= target
    assert dpsgd_epsilon(res.value, q, steps, 1e-5).epsilon <= target
    # within 0.1% of the boundary: a 0.1% smaller sigma must exceed the target
    assert dpsgd_epsilon(res.value * 0.999, q, steps, 1e-5).epsilon > target


def test_calibration_full_batch_against_exact_gaussian():
    """RDP calibration needs more noise than the exact (analytic Gaussian) answer."""
    res = calibrate_noise_multiplier(1.0, 1e-5, 1.0, 100)
    exact = gaussian_epsilon(math.sqrt(100) / res.value, 1e-5)
    assert exact <= 1.0


def test_calibrate_steps_and_rate():
    r = calibrate_steps(2.0, 1e-5, 1.0, 0.01)
    n = int(r.value)
    assert (
        dpsgd_epsilon(1.0, 0.01, n, 1e-5).epsilon
        <= 2.0
        < dpsgd_epsilon(1.0, 0.01, n + 1, 1e-5).epsilon
    )
    s = calibrate_sample_rate(2.0, 1e-5, 1.0, 1000)
    assert dpsgd_epsilon(1.0, s.value, 1000, 1e-5).epsilon <= 2.0
    assert dpsgd_epsilon(1.0, s.value * 1.001, 1000, 1e-5).epsilon > 2.0


def test_unreachable_target_is_a_clear_error():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(PrivacyParameterError, match="unreachable"):
            calibrate_noise_multiplier(1e-4, 1e-10, 0.5, 1000, max_noise_multiplier=100.0)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"target_epsilon": -1.0}, "target_epsilon"),
        ({"delta": 0.0}, "delta"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"sample_rate": float("nan")}, "sample_rate"),
        ({"steps": 0}, "steps"),
    ],
)
def test_calibration_bad_input(kwargs, name):
    base = {"target_epsilon": 1.0, "delta": 1e-5, "sample_rate": 0.01, "steps": 100}
    with pytest.raises(PrivacyParameterError, match=name):
        calibrate_noise_multiplier(**{**base, **kwargs})


def test_epochs_to_steps_rounds_up_exactly():
    assert epochs_to_steps(2, 60000, 256) == (469, 256 / 60000)  # 468.75 -> 469
    assert epochs_to_steps(1, 1000, 10) == (100, 0.01)  # exact: no spurious +1
    assert epochs_to_steps(0.1, 1000, 10)[0] == 10
    with pytest.raises(PrivacyParameterError, match="batch_size"):
        epochs_to_steps(1, 10, 11)


def test_fixed_size_dpsgd_event_halves_the_noise_multiplier():
    """Replace-one moves a clipped sum by 2C, so the Gaussian's sigma/sensitivity is z/2."""
    from renyi.calibration import dpsgd_event
    from renyi.events import SampledWithoutReplacementEvent

    ev = dpsgd_event(2.0, 0.01, sampling="without_replacement", dataset_size=1000)
    assert isinstance(ev, SampledWithoutReplacementEvent)
    assert (ev.population_size, ev.sample_size) == (1000, 10)
    assert ev.event.noise_multiplier == 1.0
    with pytest.raises(PrivacyParameterError, match="sample_rate"):
        dpsgd_event(2.0, 0.0105, sampling="without_replacement", dataset_size=1000)


def test_poisson_subsampled_laplace_is_amplified_and_bounded():
    """Generic amplification (Zhu & Wang 2019) for a non-Gaussian mechanism."""
    orders = np.array([1.5, 2.0, 8.0, 32.0])
    plain = event_rdp(LaplaceEvent(1.0), orders)
    sub = event_rdp(PoissonSampledEvent(0.01, LaplaceEvent(1.0)), orders)
    assert np.all(sub <= plain * (1 + 1e-12))
    assert np.all(sub[:3] < 0.1 * plain[:3])
    acc = RdpAccountant().compose(PoissonSampledEvent(0.01, LaplaceEvent(1.0)), 1000)
    assert acc.epsilon(1e-5).epsilon < 1000 * 1.0  # far below basic composition


def test_sampled_without_replacement_gaussian_vs_dp_accounting():
    """WBK 2019 Thm 9 for the Gaussian: a valid bound (never below dp_accounting's refined
    one), amplified, and never above the plain Gaussian."""
    from renyi.events import Neighbouring, SampledWithoutReplacementEvent

    ev = SampledWithoutReplacementEvent(1000, 10, GaussianEvent(2.0, Neighbouring.REPLACE_ONE))
    orders = np.arange(2.0, 33.0)
    ours = event_rdp(ev, orders)
    assert np.all(ours <= orders / (2 * 4.0) * (1 + 1e-12))
    peer = rpa.RdpAccountant(orders.tolist(), dp_accounting.NeighboringRelation.REPLACE_ONE)
    peer.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(1000, 10, dp_accounting.GaussianDpEvent(2.0))
    )
    # dp_accounting refines the Gaussian's j >= 3 terms, so it may be tighter; ours must be a
    # valid bound of the same order of magnitude and amplified well below the plain Gaussian
    assert np.all(ours >= peer._rdp * (1 - 1e-9))
    assert np.all(ours < 0.2 * orders / 8.0)
    res = RdpAccountant().compose(ev, 100).epsilon(1e-5)
    assert math.isfinite(res.epsilon)


@pytest.mark.parametrize("sigma", [1e-200, 5e-324])
def test_underflowing_noise_multiplier_is_inf_not_a_crash(sigma: float) -> None:
    # σ² underflows to 0: the true ε (~1e399 at σ = 1e-200) is beyond float64, so inf
    acc = RdpAccountant().compose(PoissonSampledEvent(0.1, GaussianEvent(sigma)), count=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert acc.epsilon(1e-5).epsilon == math.inf
