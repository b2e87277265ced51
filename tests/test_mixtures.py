"""User-level accounting with example-level sampling: the binomial mixture of Gaussians."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from scipy import stats

from renyi.accountants import RdpAccountant
from renyi.conversions import group_privacy_rdp, rdp_to_dp
from renyi.curves import DEFAULT_ORDERS
from renyi.errors import PrivacyParameterError
from renyi.events import (
    GaussianEvent,
    PoissonSampledEvent,
    PoissonSampledGroupEvent,
    from_json,
)
from renyi.mixtures import binomial_mixture_gaussian_rdp

ORDERS = np.asarray(DEFAULT_ORDERS)


def _mp_divergences(sigma: float, k: int, q: float, alpha: int) -> tuple[float, float]:
    """Both Rényi divergences by 25-digit quadrature."""
    mp.mp.dps = 25
    b = [mp.mpf(stats.binom.pmf(m, k, q)) for m in range(k + 1)]

    def p(x):
        return sum(b[m] * mp.npdf(x, m, sigma) for m in range(k + 1))

    def q0(x):
        return mp.npdf(x, 0, sigma)

    # the remove-direction integrand peaks near x = alpha k: cut around it
    peak = alpha * k
    cuts = [-mp.inf, -10 * sigma, 0, k, k + 10 * sigma, peak - 10 * sigma, peak, peak + 10 * sigma]
    cuts = [*sorted(set(cuts)), mp.inf]
    rem = mp.quad(lambda x: p(x) ** alpha * q0(x) ** (1 - alpha), cuts)
    add = mp.quad(lambda x: q0(x) ** alpha * p(x) ** (1 - alpha), cuts)
    return float(mp.log(rem) / (alpha - 1)), float(mp.log(add) / (alpha - 1))


@pytest.mark.parametrize(
    "sigma,k,q,alpha", [(1.0, 10, 0.01, 2), (2.0, 4, 0.2, 16), (0.8, 3, 0.5, 5)]
)
def test_against_high_precision_quadrature(sigma: float, k: int, q: float, alpha: int) -> None:
    got = float(binomial_mixture_gaussian_rdp(sigma, k, q, [float(alpha)])[0])
    rem, add = _mp_divergences(sigma, k, q, alpha)
    assert got >= max(rem, add) * (1 - 1e-12)
    assert got == pytest.approx(max(rem, add), rel=1e-9, abs=1e-12)


def test_one_example_per_user_is_example_level_exactly() -> None:
    sub = PoissonSampledEvent(0.01, GaussianEvent(1.1))
    user = PoissonSampledGroupEvent(0.01, 1, GaussianEvent(1.1))
    np.testing.assert_array_equal(user.rdp_epsilons(ORDERS), sub.rdp_epsilons(ORDERS))
    a = RdpAccountant().compose(sub, count=1000).epsilon(1e-5)
    b = RdpAccountant().compose(user, count=1000).epsilon(1e-5)
    assert a.epsilon == b.epsilon and a.order == b.order
    # and the mixture computation itself agrees with the subsampled Gaussian at integer orders
    ints = ORDERS[(ORDERS == np.round(ORDERS)) & (ORDERS <= 256)]
    np.testing.assert_allclose(
        binomial_mixture_gaussian_rdp(1.1, 1, 0.01, ints),
        sub.rdp_epsilons(ints),
        rtol=1e-9,
    )


def test_full_batch_is_gaussian_with_group_sensitivity() -> None:
    a = np.array([2.0, 3.0, 10.0])
    np.testing.assert_allclose(
        binomial_mixture_gaussian_rdp(2.0, 5, 1.0, a), a * 25 / (2 * 4.0), rtol=1e-9
    )


def test_between_example_level_and_group_privacy() -> None:
    q, sigma, steps, k = 0.01, 1.0, 500, 10
    example = RdpAccountant().compose(PoissonSampledEvent(q, GaussianEvent(sigma)), count=steps)
    user = RdpAccountant().compose(
        PoissonSampledGroupEvent(q, k, GaussianEvent(sigma)), count=steps
    )
    eps_user = user.epsilon(1e-5).epsilon
    assert example.epsilon(1e-5).epsilon < eps_user
    # group privacy from the example-level curve (Mironov Prop. 2) is far looser
    go, ge = group_privacy_rdp(example.curve.orders, example.curve.epsilons, k)
    assert eps_user < rdp_to_dp(go, ge, 1e-5)[0]


def test_fractional_orders_are_bounded_by_the_next_integer() -> None:
    e = binomial_mixture_gaussian_rdp(1.0, 3, 0.1, [2.5, 3.0, 1000.0, math.inf])
    assert e[0] == e[1] and math.isinf(e[2]) and math.isinf(e[3])


def test_pld_peer_below_our_rdp() -> None:
    """dp_accounting's PLD of the same mixture (tight) is never above our RDP bound."""
    dpa = pytest.importorskip("dp_accounting")
    q, sigma, steps, k = 0.02, 1.2, 200, 5
    probs = [float(stats.binom.pmf(m, k, q)) for m in range(k + 1)]
    acc = dpa.pld.PLDAccountant(value_discretization_interval=1e-2)
    acc.compose(dpa.dp_event.MixtureOfGaussiansDpEvent(sigma, list(range(k + 1)), probs), steps)
    pld_eps = acc.get_epsilon(1e-5)
    ours = RdpAccountant().compose(
        PoissonSampledGroupEvent(q, k, GaussianEvent(sigma)), count=steps
    )
    rdp_eps = ours.epsilon(1e-5).epsilon
    assert pld_eps <= rdp_eps <= 1.6 * pld_eps


def test_event_json_and_validation() -> None:
    ev = PoissonSampledGroupEvent(0.05, 4, GaussianEvent(1.0))
    assert from_json(ev.to_json()) == ev
    assert ev.zcdp_rho() == pytest.approx(16 / 2)
    with pytest.raises(PrivacyParameterError, match="group_size"):
        PoissonSampledGroupEvent(0.05, 0, GaussianEvent(1.0))
    with pytest.raises(PrivacyParameterError, match="event"):
        PoissonSampledGroupEvent(0.05, 2, PoissonSampledEvent(0.1, GaussianEvent(1.0)))
    with pytest.raises(PrivacyParameterError, match="noise_multiplier"):
        binomial_mixture_gaussian_rdp(0.0, 2, 0.1, [2.0])
    with pytest.raises(PrivacyParameterError, match="sampling_rate"):
        binomial_mixture_gaussian_rdp(1.0, 2, 1.5, [2.0])


def test_value_does_not_depend_on_the_other_orders() -> None:
    """Bit-identical whatever else is asked (a ledger re-prices entries and compares)."""
    alone = binomial_mixture_gaussian_rdp(1.3, 4, 0.05, [3.0])
    with_more = binomial_mixture_gaussian_rdp(1.3, 4, 0.05, [2.0, 3.0, 200.0])
    assert alone[0] == with_more[1]
