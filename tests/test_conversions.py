"""Conversion theorems checked against mpmath, brute force and the peer library dp_accounting."""

from __future__ import annotations

import doctest
import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import renyi.analysis.closed_forms
import renyi.analysis.conversions
import renyi.analysis.curves
from renyi.closed_forms import gaussian_delta, gaussian_epsilon, gaussian_rdp
from renyi.conversions import (
    group_privacy_rdp,
    pure_to_rdp,
    pure_to_rdp_bun_steinke,
    pure_to_rdp_lemma1,
    pure_to_zcdp,
    rdp_to_delta,
    rdp_to_delta_bretagnolle_huber,
    rdp_to_delta_mironov,
    rdp_to_dp,
    rdp_to_dp_mironov,
    zcdp_max_rho,
    zcdp_to_delta,
    zcdp_to_dp,
    zcdp_to_dp_bun_steinke,
    zcdp_to_rdp,
)
from renyi.curves import DEFAULT_ORDERS
from renyi.errors import PrivacyParameterError

dp_rdp = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")


@pytest.mark.parametrize(
    "module",
    [
        renyi.analysis.closed_forms,
        renyi.analysis.conversions,
        renyi.analysis.curves,
    ],
)
def test_docstring_examples_run(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------ RDP -> DP


def mp_balle(orders: np.ndarray, eps: np.ndarray, delta: float) -> mp.mpf:
    with mp.workdps(50):
        vals = [
            mp.mpf(e) + mp.log((mp.mpf(a) - 1) / a) - (mp.log(delta) + mp.log(a)) / (mp.mpf(a) - 1)
            for a, e in zip(orders, eps, strict=True)
        ]
        return max(min(vals), mp.mpf(0))


@pytest.mark.parametrize("sigma", [0.5, 1.0, 5.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10])
def test_rdp_to_dp_matches_mpmath_and_peer(sigma: float, delta: float) -> None:
    orders = DEFAULT_ORDERS
    eps = 50 * gaussian_rdp(sigma, orders)
    got, order = rdp_to_dp(orders, eps, delta)
    assert got == pytest.approx(float(mp_balle(orders, eps, delta)), rel=1e-12)
    peer_eps, peer_order = dp_rdp.compute_epsilon(orders, eps, delta)
    assert got == pytest.approx(peer_eps, rel=1e-12) and order == peer_order
    i = int(np.where(orders == order)[0][0])
    mir, _ = rdp_to_dp_mironov(orders, eps, delta)
    assert mir == pytest.approx(float(np.min(eps + math.log(1 / delta) / (orders - 1))), rel=1e-14)
    assert got <= mir
    assert eps[i] >= 0


@pytest.mark.parametrize("sigma", [0.7, 2.0, 10.0])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 8.0])
def test_rdp_to_delta_matches_peer(sigma: float, epsilon: float) -> None:
    orders = DEFAULT_ORDERS
    eps = 20 * gaussian_rdp(sigma, orders)
    got, _ = rdp_to_delta(orders, eps, epsilon)
    peer_delta, _ = dp_rdp.compute_delta(orders, eps, epsilon)
    assert got == pytest.approx(peer_delta, rel=1e-9)
    mir, _ = rdp_to_delta_mironov(orders, eps, epsilon)
    assert got <= mir * (1 + 1e-12)
    # Never below the exact delta of the 20-fold Gaussian.
    assert got >= gaussian_delta(math.sqrt(20) / sigma, epsilon)


@settings(max_examples=60, deadline=None)
@given(
    st.floats(min_value=0.2, max_value=30.0),
    st.integers(min_value=1, max_value=5000),
    st.floats(min_value=0.0, max_value=20.0),
)
def test_delta_conversions_above_exact_gaussian(sigma: float, k: int, epsilon: float) -> None:
    mu = math.sqrt(k) / sigma
    eps = gaussian_rdp(sigma, DEFAULT_ORDERS) * k
    exact = gaussian_delta(mu, epsilon)
    for fn in (rdp_to_delta, rdp_to_delta_mironov):
        d, _ = fn(DEFAULT_ORDERS, eps, epsilon)
        assert d >= exact * (1 - 1e-9)
    zd, _ = zcdp_to_delta(mu * mu / 2, epsilon)
    assert zd >= exact * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(min_value=0, max_value=100), min_size=4, max_size=4),
    st.floats(1e-12, 0.9),
    st.floats(1e-12, 0.9),
)
def test_rdp_to_dp_monotone_in_delta(eps: list[float], d1: float, d2: float) -> None:
    orders = [1.5, 2.0, 10.0, math.inf]
    e = np.cumsum(eps)  # any non-decreasing curve
    lo, hi = sorted((d1, d2))
    for fn in (rdp_to_dp, rdp_to_dp_mironov):
        assert fn(orders, e, lo)[0] >= fn(orders, e, hi)[0]
    for fn in (rdp_to_delta, rdp_to_delta_mironov):  # and delta non-increasing in epsilon
        assert fn(orders, e, 0.5)[0] >= fn(orders, e, 2.0)[0]


def test_bretagnolle_huber_bound() -> None:
    # Tiny curve: delta above sqrt(1 - exp(-eps)) -> epsilon 0, as dp_accounting reports.
    orders, eps = [2.0, 4.0], [1e-8, 2e-8]
    d, order = rdp_to_delta_bretagnolle_huber(orders, eps)
    assert d == pytest.approx(math.sqrt(-math.expm1(-1e-8)), rel=1e-12) and order == 2.0
    assert rdp_to_dp(orders, eps, 0.5) == (0.0, 2.0)
    assert dp_rdp.compute_epsilon(orders, eps, 0.5)[0] == 0
    # Valid: the total variation of a Gaussian pair with D_2 = eps is below the bound.
    sigma = 1 / math.sqrt(2 * 0.01)  # D_alpha = alpha / (2 sigma^2) -> D_1 = 0.01
    tv = gaussian_delta(1 / sigma, 0.0)
    assert tv <= rdp_to_delta_bretagnolle_huber([1.0001], [1.0001 * 0.01])[0]
    delta, _ = rdp_to_delta([2.0], [1e-8], 0.0)
    assert delta <= math.sqrt(-math.expm1(-1e-8)) * (1 + 1e-12)


def test_infinite_order_and_infinite_epsilon() -> None:
    orders = [2.0, math.inf]
    assert rdp_to_dp(orders, [5.0, 0.3], 1e-9) == (0.3, math.inf)
    assert rdp_to_dp_mironov(orders, [5.0, 0.3], 1e-9) == (0.3, math.inf)
    assert rdp_to_delta(orders, [5.0, 0.3], 0.3) == (0.0, math.inf)
    assert rdp_to_delta_mironov(orders, [5.0, 0.3], 0.3) == (0.0, math.inf)
    assert rdp_to_dp([2.0, 3.0], [math.inf, math.inf], 1e-5)[0] == math.inf
    assert rdp_to_delta([2.0, 3.0], [math.inf, math.inf], 1.0)[0] == 1.0
    assert rdp_to_delta_mironov([2.0], [math.inf], 1.0)[0] == 1.0


# ------------------------------------------------------------------ zCDP


def mp_zcdp_min(rho: float, delta: float) -> float:
    """Brute-force minimum over a fine log-grid of orders, at 30 digits."""
    with mp.workdps(30):
        best = mp.inf
        for x in np.linspace(-12, 12, 4001):
            a = 1 + mp.exp(x)
            v = rho * a + mp.log((a - 1) / a) - (mp.log(delta) + mp.log(a)) / (a - 1)
            best = min(best, v)
        return float(best)


@pytest.mark.parametrize("rho", [1e-6, 0.00625, 0.1, 1.0, 30.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-5, 1e-12])
def test_zcdp_to_dp(rho: float, delta: float) -> None:
    eps, order = zcdp_to_dp(rho, delta)
    if order == 1.0:  # Bretagnolle-Huber: delta above the TV bound sqrt(1 - exp(-rho))
        assert eps == 0.0 and delta >= math.sqrt(-math.expm1(-rho))
        assert gaussian_delta(math.sqrt(2 * rho), 0.0) <= delta
        return
    assert order > 1
    # The reported value is the bound at the reported order (valid by construction) ...
    with mp.workdps(50):
        a = mp.mpf(order)
        at_order = rho * a + mp.log((a - 1) / a) - (mp.log(delta) + mp.log(a)) / (a - 1)
    assert eps == pytest.approx(max(0.0, float(at_order)), rel=1e-11, abs=1e-300)
    # ... as good as a brute-force grid search, never worse than Bun-Steinke, never below exact.
    assert eps <= mp_zcdp_min(rho, delta) + 1e-9 * max(1.0, eps)
    assert eps <= zcdp_to_dp_bun_steinke(rho, delta)
    assert eps >= gaussian_epsilon(math.sqrt(2 * rho), delta)


@pytest.mark.parametrize("rho", [1e-4, 0.05, 2.0])
@pytest.mark.parametrize("epsilon", [0.1, 1.0, 10.0])
def test_zcdp_to_delta_roundtrip(rho: float, epsilon: float) -> None:
    delta, order = zcdp_to_delta(rho, epsilon)
    assert 0 <= delta <= 1 and order > 1
    assert delta >= gaussian_delta(math.sqrt(2 * rho), epsilon)
    if 1e-300 < delta < 0.5:
        eps_back, _ = zcdp_to_dp(rho, delta)
        assert eps_back == pytest.approx(epsilon, rel=1e-6)
    # Compare with the RDP conversion on the default grid: continuous orders are at least as good.
    grid_delta, _ = rdp_to_delta(DEFAULT_ORDERS, zcdp_to_rdp(rho, DEFAULT_ORDERS), epsilon)
    assert delta <= grid_delta * (1 + 1e-9)


@pytest.mark.parametrize("epsilon", [1e-3, 0.1, 1.0, 8.0, 200.0])
@pytest.mark.parametrize("delta", [0.3, 1e-5, 1e-12, 1e-100])
def test_zcdp_max_rho_is_conservative_and_tight(epsilon: float, delta: float) -> None:
    rho = zcdp_max_rho(epsilon, delta)
    assert rho > 0
    assert zcdp_to_dp(rho, delta)[0] <= epsilon
    assert zcdp_to_dp(rho * (1 + 1e-9), delta)[0] > epsilon
    # never below Bun-Steinke's inverse (Prop. 1.3), which zcdp_to_dp never exceeds
    bs = (math.sqrt(math.log(1 / delta) + epsilon) - math.sqrt(math.log(1 / delta))) ** 2
    assert rho >= bs * (1 - 1e-12)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True])
def test_zcdp_max_rho_refuses_bad_epsilon(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        zcdp_max_rho(bad, 1e-5)


@pytest.mark.parametrize("bad", [0.0, 1.0, -1e-5, math.nan, True])
def test_zcdp_max_rho_refuses_bad_delta(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PrivacyParameterError, match="delta"):
        zcdp_max_rho(1.0, bad)


def test_zcdp_bun_steinke_closed_form() -> None:
    assert zcdp_to_dp_bun_steinke(0.5, math.exp(-2)) == pytest.approx(0.5 + 2 * math.sqrt(1.0))
    assert zcdp_to_dp_bun_steinke(0.0, 1e-5) == 0.0
    assert zcdp_to_dp_bun_steinke(math.inf, 1e-5) == math.inf
    assert zcdp_to_rdp(0.25, [2.0, math.inf]).tolist() == [0.5, math.inf]
    assert zcdp_to_rdp(0.0, [2.0, math.inf]).tolist() == [0.0, 0.0]
    assert zcdp_to_delta(0.0, 1.0) == (0.0, math.inf)
    assert zcdp_to_dp(0.0, 1e-5) == (0.0, math.inf)


# ------------------------------------------------------------------ pure DP -> RDP


def mp_rr_pure(epsilon: float, alpha: float) -> mp.mpf:
    with mp.workdps(100):
        e, a = mp.mpf(epsilon), mp.mpf(alpha)
        p = mp.exp(e) / (1 + mp.exp(e))
        q = 1 / (1 + mp.exp(e))
        if a == 1:
            return (p - q) * e
        return mp.log(p**a * q ** (1 - a) + q**a * p ** (1 - a)) / (a - 1)


@pytest.mark.parametrize("epsilon", [1e-6, 0.01, 0.5, 1.0, 5.0, 40.0, 700.0])
def test_pure_to_rdp_matches_mpmath(epsilon: float) -> None:
    alphas = np.array([1.0, 1 + 1e-9, 1.01, 2.0, 16.0, 1e3, 1e6])
    got = pure_to_rdp(epsilon, alphas)
    for a, g in zip(alphas, got, strict=True):
        ref = min(mp_rr_pure(epsilon, a), mp.mpf(epsilon))
        assert float(abs(g - ref) / ref) < 1e-10, (epsilon, a)
    assert pure_to_rdp(epsilon, math.inf) == epsilon


@settings(max_examples=80, deadline=None)
@given(
    st.floats(min_value=1e-4, max_value=20.0),
    st.lists(st.floats(min_value=0.01, max_value=1.0), min_size=2, max_size=6),
    st.lists(st.floats(min_value=-1.0, max_value=1.0), min_size=6, max_size=6),
    st.floats(min_value=1.001, max_value=200.0),
)
def test_pure_to_rdp_bounds_every_eps_dp_pair(
    epsilon: float, weights: list[float], signs: list[float], alpha: float
) -> None:
    """Any P, Q with |log P/Q| <= epsilon have D_alpha(P||Q) <= the RR curve (tightness claim)."""
    n = len(weights)
    with mp.workdps(40):
        w = [mp.mpf(x) for x in weights]
        qs = [x / sum(w) for x in w]
        ps_raw = [q * mp.exp(epsilon * mp.mpf(s)) for q, s in zip(qs, signs[:n], strict=True)]
        ps = [x / sum(ps_raw) for x in ps_raw]
        # Normalising can push a ratio past e^eps; skip those draws.
        if any(abs(mp.log(p / q)) > epsilon for p, q in zip(ps, qs, strict=True)):
            return
        a = mp.mpf(alpha)
        d = mp.log(sum(p**a * q ** (1 - a) for p, q in zip(ps, qs, strict=True))) / (a - 1)
    bound = float(pure_to_rdp(epsilon, alpha))
    assert float(d) <= bound * (1 + 1e-9) + 1e-15


@settings(max_examples=80, deadline=None)
@given(st.floats(min_value=0.0, max_value=50.0), st.floats(min_value=1.0, max_value=1e5))
def test_pure_curves_ordered(epsilon: float, alpha: float) -> None:
    rr = float(pure_to_rdp(epsilon, alpha))
    assert rr <= float(pure_to_rdp_lemma1(epsilon, alpha)) * (1 + 1e-12)
    assert rr <= float(pure_to_rdp_bun_steinke(epsilon, alpha)) * (1 + 1e-12)
    assert rr <= epsilon


def test_pure_closed_forms() -> None:
    assert pure_to_rdp_lemma1(0.1, [2.0, 3.0, 1e9]).tolist() == pytest.approx([0.04, 0.06, 0.1])
    assert pure_to_rdp_bun_steinke(0.2, [3.0]).tolist() == pytest.approx([0.06])
    assert pure_to_zcdp(0.2) == pytest.approx(0.02)
    assert np.all(pure_to_rdp(0.0, [2.0, math.inf]) == 0.0)
    assert np.all(np.isinf(pure_to_rdp(math.inf, [2.0])))


# ------------------------------------------------------------------ group privacy


def test_group_privacy_rdp() -> None:
    o, e = group_privacy_rdp([2.0, 4.0, 8.0, 16.0, math.inf], [1.0, 2.0, 4.0, 8.0, 9.0], 4)
    assert o.tolist() == [2.0, 4.0, math.inf]
    assert e.tolist() == [36.0, 72.0, 81.0]
    o5, _ = group_privacy_rdp([16.0, 32.0], [1.0, 2.0], 5)  # rounded up to 8 = 2^3
    assert o5.tolist() == [2.0, 4.0]
    # Valid for the Gaussian: a group of k moves the mean by k (exact RDP alpha k^2/(2 s^2)).
    orders = DEFAULT_ORDERS
    for k in (2, 3, 4, 7, 8):
        go, ge = group_privacy_rdp(orders, gaussian_rdp(1.0, orders), k)
        assert (ge >= gaussian_rdp(1.0 / k, go)).all()


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "call",
    [
        lambda: rdp_to_dp([2.0], [1.0], 0.0),
        lambda: rdp_to_dp([2.0], [1.0], 1.0),
        lambda: rdp_to_dp([2.0], [1.0], math.nan),
        lambda: rdp_to_dp([2.0], [1.0], True),
        lambda: rdp_to_dp([1.0], [1.0], 1e-5),
        lambda: rdp_to_dp([2.0, 3.0], [1.0], 1e-5),
        lambda: rdp_to_dp([2.0], [-1.0], 1e-5),
        lambda: rdp_to_dp([2.0], [math.nan], 1e-5),
        lambda: rdp_to_dp([], [], 1e-5),
        lambda: rdp_to_dp_mironov([0.5], [1.0], 1e-5),
        lambda: rdp_to_delta([2.0], [1.0], -1.0),
        lambda: rdp_to_delta([2.0], [1.0], math.inf),
        lambda: rdp_to_delta([2.0], [1.0], math.nan),
        lambda: rdp_to_delta_mironov([2.0], [1.0], "1"),
        lambda: rdp_to_delta_bretagnolle_huber([2.0], [[1.0]]),
        lambda: zcdp_to_rdp(-1.0, [2.0]),
        lambda: zcdp_to_rdp(1.0, [0.5]),
        lambda: zcdp_to_dp(math.nan, 1e-5),
        lambda: zcdp_to_dp(1.0, 0.0),
        lambda: zcdp_to_dp_bun_steinke(-0.1, 1e-5),
        lambda: zcdp_to_dp_bun_steinke(0.1, 1.5),
        lambda: zcdp_to_delta(True, 1.0),
        lambda: zcdp_to_delta(0.1, -1.0),
        lambda: pure_to_rdp(-1.0, [2.0]),
        lambda: pure_to_rdp(math.nan, [2.0]),
        lambda: pure_to_rdp(1.0, [math.nan]),
        lambda: pure_to_rdp_lemma1(-1.0, [2.0]),
        lambda: pure_to_rdp_bun_steinke(1.0, [0.0]),
        lambda: pure_to_zcdp(math.nan),
        lambda: group_privacy_rdp([2.0], [1.0], 0),
        lambda: group_privacy_rdp([2.0], [1.0], 2.0),
        lambda: group_privacy_rdp([2.0], [1.0], True),
        lambda: group_privacy_rdp([2.0, 3.0], [1.0, 1.0], 2),
    ],
)
def test_bad_input(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PrivacyParameterError, match="="):
        call()


@pytest.mark.filterwarnings("ignore:Optimal order:UserWarning")  # the peer's own grid warning
@pytest.mark.parametrize("sigma", [0.6, 1.0, 3.0])
@pytest.mark.parametrize("steps", [1, 50, 1000])
def test_rdp_to_dp_matches_opacus(sigma: float, steps: int) -> None:
    """Peer oracle: Opacus' RDP -> DP conversion (same theorem), on Opacus' own grid."""
    rdp_analysis = pytest.importorskip("opacus.accountants.analysis.rdp")
    orders = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)), dtype=float)
    eps = steps * gaussian_rdp(sigma, orders)
    peer_eps, peer_order = rdp_analysis.get_privacy_spent(orders=orders, rdp=eps, delta=1e-5)
    got, order = rdp_to_dp(orders, eps, 1e-5)
    assert got == pytest.approx(float(peer_eps), rel=1e-12) and order == float(peer_order)
