"""(epsilon, delta) composition theorems and the book chapter's Gaussian comparison."""

from __future__ import annotations

import itertools
import math
import warnings

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renyi.composition import (
    GaussianCompositionComparison,
    compare_gaussian_composition,
    compose_advanced,
    compose_basic,
    compose_optimal,
    compose_rdp_advanced,
    drv_epsilon,
    optimal_composition_delta,
    vectorised_vs_sequential_noise,
)
from renyi.curves import DEFAULT_ORDERS, ApproxDp, PureDp
from renyi.errors import OrderAtGridEdgeWarning, PrivacyParameterError

mpmath.mp.dps = 50


# ---------------------------------------------------------------------------------------------
# basic and advanced
# ---------------------------------------------------------------------------------------------


def test_basic_sums_epsilons_and_deltas():
    g = compose_basic([PureDp(0.5), ApproxDp(0.25, 1e-6), ApproxDp(0.125, 2e-6)])
    assert g.epsilon == 0.875 and g.delta == pytest.approx(3e-6, rel=1e-15)
    assert compose_basic([]) == ApproxDp(0.0, 0.0)
    assert compose_basic([ApproxDp(1.0, 0.6), ApproxDp(1.0, 0.6)]).delta == 1.0  # capped
    assert compose_basic(iter([PureDp(math.inf)])).epsilon == math.inf


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 10), st.floats(0, 1e-3)),
        min_size=1,
        max_size=8,
    )
)
def test_basic_is_commutative_and_associative(items):
    gs = [ApproxDp(e, d) for e, d in items]
    forward = compose_basic(gs)
    backward = compose_basic(gs[::-1])
    nested = compose_basic([compose_basic(gs[:1]), compose_basic(gs[1:])])
    for other in (backward, nested):
        assert other.epsilon == pytest.approx(forward.epsilon, rel=1e-12, abs=1e-300)
        assert other.delta == pytest.approx(forward.delta, rel=1e-12, abs=1e-300)


def test_basic_refuses_other_types():
    with pytest.raises(PrivacyParameterError, match=r"guarantees\[1\]="):
        compose_basic([PureDp(1.0), 0.5])  # type: ignore[list-item]


def test_drv_formula_by_hand():
    # Dwork & Roth 2014 Thm 3.20: eps sqrt(2k ln 1/delta') + k eps (e^eps - 1)
    eps, k, dp = 0.1, 100, 1e-5
    by_hand = 0.1 * math.sqrt(200 * math.log(1e5)) + 100 * 0.1 * (math.exp(0.1) - 1)
    assert drv_epsilon(eps, k, dp) == pytest.approx(by_hand, rel=1e-14)
    g = compose_advanced(eps, 1e-7, k, dp)
    assert g.epsilon == pytest.approx(by_hand, rel=1e-14)
    assert g.delta == pytest.approx(100 * 1e-7 + 1e-5, rel=1e-14)


def test_advanced_falls_back_to_basic_when_better():
    # k eps = 2 < DRV = 1 * sqrt(2 * 2 * ln 1e5) + 2 (e - 1): basic dominates
    g = compose_advanced(1.0, 1e-6, 2, 1e-5)
    assert g == ApproxDp(2.0, 2e-6)
    assert g.epsilon < drv_epsilon(1.0, 2, 1e-5)


# ---------------------------------------------------------------------------------------------
# optimal composition (KOV) against brute-force enumeration in mpmath
# ---------------------------------------------------------------------------------------------


def brute_force_delta(eps, delta, k, target):
    """Hockey-stick divergence of the k-fold (eps, delta) dominating pair, enumerated.

    KOV 2015's pair: P = (delta, (1-delta) e^eps/(1+e^eps), (1-delta)/(1+e^eps), 0), Q the
    mirror image. Sum over all 4^k outcomes of max(0, P(x) - e^target Q(x)).
    """
    e = mpmath.e ** mpmath.mpf(eps)
    d = mpmath.mpf(delta)
    p = [d, (1 - d) * e / (1 + e), (1 - d) / (1 + e), mpmath.mpf(0)]
    q = p[::-1]
    et = mpmath.e ** mpmath.mpf(target)
    total = mpmath.mpf(0)
    for xs in itertools.product(range(4), repeat=k):
        px = mpmath.fprod(p[x] for x in xs)
        qx = mpmath.fprod(q[x] for x in xs)
        total += max(mpmath.mpf(0), px - et * qx)
    return total


@pytest.mark.parametrize(
    ("eps", "delta", "k"),
    [(0.5, 0.0, 1), (0.5, 0.0, 4), (0.3, 1e-3, 3), (1.0, 0.01, 5), (0.05, 1e-6, 6)],
)
def test_kov_matches_brute_force(eps, delta, k):
    targets = np.array([0.0, 0.5 * eps, eps, 1.7 * eps, (k - 2) * eps, k * eps, 2 * k * eps])
    targets = np.unique(np.clip(targets, 0.0, None))
    got = optimal_composition_delta(eps, delta, k, targets)
    for t, g in zip(targets, got, strict=True):
        want = brute_force_delta(eps, delta, k, t)
        assert g >= float(want) - 1e-40  # rounded up, never below the exact value (50 digits)
        assert g == pytest.approx(float(want), rel=1e-10, abs=1e-40)


def test_kov_theorem_grid_points():
    # KOV 2015 Thm 3.3 at eps' = (k - 2i) eps: delta_i with the sum over l < i
    eps, delta, k = 0.2, 1e-4, 20
    e = mpmath.e ** mpmath.mpf(eps)
    for i in range(0, k // 2 + 1):
        s = (
            mpmath.fsum(
                mpmath.binomial(k, ell) * (e ** (k - ell) - e ** (k - 2 * i + ell))
                for ell in range(i)
            )
            / (1 + e) ** k
        )
        want = 1 - (1 - mpmath.mpf(delta)) ** k * (1 - s)
        got = optimal_composition_delta(eps, delta, k, (k - 2 * i) * eps)
        assert got == pytest.approx(float(want), rel=1e-10)


def test_kov_rounding_never_gives_nan():
    # delta_RR(0) rounds to just above 1 here; the profile must stay in [0, 1]
    d = optimal_composition_delta(0.9921875, 0.0, 241, [0.0, 1.0, 100.0])
    assert not np.isnan(d).any() and (d <= 1.0).all() and d[0] == 1.0
    assert compose_optimal(0.9921875, 0.0, 241, 1e-6).epsilon <= 241 * 0.9921875


def test_kov_large_k_no_overflow():
    d = optimal_composition_delta(0.01, 1e-9, 100_000, [0.0, 1.0, 5.0, 50.0, 1000.0])
    assert np.isfinite(d).all() and (np.diff(d) <= 0).all()
    assert d[-1] == pytest.approx(-math.expm1(100_000 * math.log1p(-1e-9)), rel=1e-9)


def test_compose_optimal_is_verified_and_tight():
    eps, delta, k, target = 0.1, 1e-9, 200, 1e-5
    g = compose_optimal(eps, delta, k, target)
    assert g.delta == target
    assert optimal_composition_delta(eps, delta, k, g.epsilon) <= target
    assert optimal_composition_delta(eps, delta, k, g.epsilon * (1 - 1e-9)) > target
    assert float(brute_force_delta(0.5, 1e-3, 3, compose_optimal(0.5, 1e-3, 3, 0.01).epsilon)) <= (
        0.01
    )


def test_compose_optimal_edge_cases():
    # target below the floor 1 - (1 - delta)^k: no finite epsilon
    assert compose_optimal(0.1, 1e-3, 10, 1e-3).epsilon == math.inf
    # target above delta_total(0): epsilon 0
    assert compose_optimal(0.001, 0.0, 2, 0.5).epsilon == 0.0
    assert compose_optimal(0.0, 0.0, 10, 1e-5).epsilon == 0.0


@settings(max_examples=60, deadline=None)
@given(
    st.floats(0.001, 1.0),
    st.integers(1, 300),
    st.sampled_from([0.0, 1e-10, 1e-8]),
    st.sampled_from([1e-6, 1e-5, 1e-3]),
)
def test_orderings_optimal_advanced_basic(eps, k, delta, delta_prime):
    adv = compose_advanced(eps, delta, k, delta_prime)
    opt = compose_optimal(eps, delta, k, max(adv.delta, delta_prime))
    assert opt.epsilon <= adv.epsilon * (1 + 1e-12) + 1e-12
    assert adv.epsilon <= k * eps * (1 + 1e-12)
    # Mironov Cor. 1 is also an upper bound, so it cannot beat the optimum
    if delta == 0.0 and math.log(1 / delta_prime) >= eps * eps * k:
        mir = compose_rdp_advanced(eps, k, delta_prime)
        assert compose_optimal(eps, 0.0, k, delta_prime).epsilon <= mir.epsilon


def test_mironov_corollary_1_by_hand_and_condition():
    g = compose_rdp_advanced(0.01, 1000, 1e-5)
    assert g.epsilon == pytest.approx(4 * 0.01 * math.sqrt(2 * 1000 * math.log(1e5)), rel=1e-14)
    assert g.delta == 1e-5
    with pytest.raises(PrivacyParameterError, match=r"delta=0.1 .*log\(1/delta\) >= epsilon"):
        compose_rdp_advanced(1.0, 10, 0.1)  # log 10 = 2.3 < 10


@pytest.mark.parametrize(
    ("fn", "args", "name"),
    [
        (compose_advanced, (-0.1, 0.0, 10, 1e-5), "epsilon="),
        (compose_advanced, (0.1, 1.5, 10, 1e-5), "delta="),
        (compose_advanced, (0.1, 0.0, 0, 1e-5), "k="),
        (compose_advanced, (0.1, 0.0, 2.5, 1e-5), "k="),
        (compose_advanced, (0.1, 0.0, 10, 0.0), "delta_prime="),
        (compose_optimal, (0.1, 0.0, 10, 1.0), "target_delta="),
        (compose_optimal, (math.nan, 0.0, 10, 1e-5), "epsilon="),
        (optimal_composition_delta, (0.1, 0.0, 10, -1.0), "target_epsilon="),
        (optimal_composition_delta, (0.1, 0.0, 10, [0.1, math.nan]), "target_epsilon="),
        (compose_rdp_advanced, (0.1, 10, 0.0), "delta="),
        (drv_epsilon, (0.1, 10, math.nan), "delta_prime="),
    ],
)
def test_bad_input(fn, args, name):
    with pytest.raises(PrivacyParameterError, match=name):
        fn(*args)


# ---------------------------------------------------------------------------------------------
# the book chapter's comparison at sigma = 200, delta = 1e-5
# ---------------------------------------------------------------------------------------------


def mp_gaussian_delta(mu, eps):
    """Balle & Wang 2018 Thm 8 in 50 digits: Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)."""
    mu, eps = mpmath.mpf(mu), mpmath.mpf(eps)
    return mpmath.ncdf(mu / 2 - eps / mu) - mpmath.e**eps * mpmath.ncdf(-mu / 2 - eps / mu)


def mp_gaussian_epsilon(mu, delta):
    """Exact epsilon(delta) by 200 bisection steps in 50-digit arithmetic (delta decreasing)."""
    lo, hi = mpmath.mpf(0), mpmath.mpf(1)
    while mp_gaussian_delta(mu, hi) > delta:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mp_gaussian_delta(mu, mid) > delta else (lo, mid)
    return float(hi)


SIGMA, DELTA, K = 200.0, 1e-5, 500


@pytest.fixture(scope="module")
def book() -> GaussianCompositionComparison:
    return compare_gaussian_composition(SIGMA, DELTA, K, order=60)


def test_book_numbers_at_k_500(book):
    row = book.row(K)
    log_inv = math.log(1 / DELTA)
    # (a) the book's code: 2 * gauss_eps * sqrt(2 k log(1/delta)), gauss_eps classic
    gauss_eps = math.sqrt(2 * math.log(1.25 / DELTA) / SIGMA**2)
    assert row["book_advanced"] == pytest.approx(2 * gauss_eps * math.sqrt(2 * K * log_inv))
    assert row["book_advanced"] == pytest.approx(5.1984, abs=1e-4)
    # (c) zCDP: rho k + 2 sqrt(rho k log 1/delta), rho = 1/(2 sigma^2)
    rho = K / (2 * SIGMA**2)
    assert row["zcdp_bun_steinke"] == pytest.approx(rho + 2 * math.sqrt(rho * log_inv), rel=1e-12)
    assert row["zcdp_bun_steinke"] == pytest.approx(0.5427, abs=1e-4)
    # (d) RDP at alpha = 60: k alpha/(2 sigma^2) + log(1/delta)/(alpha - 1)
    assert row["rdp_fixed_order"] == pytest.approx(
        K * 60 / (2 * SIGMA**2) + log_inv / 59, rel=1e-12
    )
    assert row["rdp_fixed_order"] == pytest.approx(0.5701, abs=1e-4)
    # (f) exact: analytic Gaussian with mu = sqrt(k)/sigma, root found in 50-digit arithmetic
    exact = mp_gaussian_epsilon(math.sqrt(K) / SIGMA, DELTA)
    # closed_forms.gaussian_epsilon verifies in float64: allow a few ulps (relative 1e-12)
    assert row["exact"] >= exact * (1 - 1e-12) and row["exact"] == pytest.approx(exact, rel=1e-9)
    # (b) rigorous advanced: eps_i exact at delta/(2k), DRV with delta' = delta/2
    eps_i = mp_gaussian_epsilon(1 / SIGMA, DELTA / (2 * K))
    drv = eps_i * math.sqrt(2 * K * math.log(2 / DELTA)) + K * eps_i * math.expm1(eps_i)
    assert row["advanced"] == pytest.approx(drv, rel=1e-9)
    # (e) RDP at the best order of the grid, Balle et al. 2020 Thm 21 by hand
    a = DEFAULT_ORDERS
    vals = K * a / (2 * SIGMA**2) + np.log((a - 1) / a) - (math.log(DELTA) + np.log(a)) / (a - 1)
    assert row["rdp_optimal"] == pytest.approx(vals.min(), rel=1e-12)
    assert row["rdp_optimal_order"] == a[np.argmin(vals)]
    # (c') optimal zCDP conversion: the same formula minimised over a fine continuous grid
    fine = np.linspace(1.5, 400, 400_000)
    zvals = rho * fine + np.log1p(-1 / fine) - (math.log(DELTA) + np.log(fine)) / (fine - 1)
    assert row["zcdp_optimal"] == pytest.approx(zvals.min(), rel=1e-7)
    assert row["zcdp_optimal"] <= zvals.min() + 1e-12


def test_book_ordering_every_column_above_exact(book):
    assert book.k.tolist() == list(range(1, K + 1))
    cols = book.columns()
    for name, _ in GaussianCompositionComparison.METHODS:
        assert cols[name].shape == (K,)
        assert np.isfinite(cols[name]).all()
        assert (cols[name] >= book.exact).all(), name
    # the chapter's conclusions: zCDP and RDP beat advanced composition by a wide margin
    assert (book.zcdp_bun_steinke[1:] < book.book_advanced[1:]).all()
    assert (book.rdp_fixed_order[99:] < book.advanced[99:]).all()
    assert (book.rdp_optimal <= book.rdp_fixed_order + 1e-12).all()
    assert (book.zcdp_optimal <= book.zcdp_bun_steinke + 1e-12).all()
    assert (np.diff(book.exact) > 0).all()


@pytest.mark.parametrize("sigma", [1.0, 5.0, 30.0])
def test_other_sigmas_all_upper_bounds(sigma):
    ks = np.array([1, 2, 7, 40, 300])
    r = compare_gaussian_composition(sigma, 1e-6, ks, order=8)
    assert r.k.tolist() == ks.tolist()
    for i, k in enumerate(ks):
        exact = mp_gaussian_epsilon(math.sqrt(k) / sigma, 1e-6)
        assert r.exact[i] >= exact * (1 - 1e-12)
        for name, _ in GaussianCompositionComparison.METHODS:
            assert getattr(r, name)[i] >= exact * (1 - 1e-9), (name, k)


def test_comparison_warns_once_at_grid_edge():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare_gaussian_composition(5000.0, 1e-5, [1, 2])  # best order >> 1024
    edge = [w for w in caught if issubclass(w.category, OrderAtGridEdgeWarning)]
    assert len(edge) == 1


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"sigma": 0.0}, "sigma="),
        ({"delta": 1.0}, "delta="),
        ({"iterations": 0}, "iterations="),
        ({"iterations": [3, 0]}, "iterations="),
        ({"iterations": [1.5]}, "iterations="),
        ({"order": 1.0}, "order="),
    ],
)
def test_comparison_bad_input(kwargs, name):
    args = {"sigma": 200.0, "delta": 1e-5, "iterations": 5} | kwargs
    with pytest.raises(PrivacyParameterError, match=name):
        compare_gaussian_composition(**args)


# ---------------------------------------------------------------------------------------------
# noise vs number of queries
# ---------------------------------------------------------------------------------------------


def test_noise_vs_queries_book_formulas_and_improvement():
    ks = np.array([1, 10, 50, 100])
    eps, delta = 0.1, 1e-5
    r = vectorised_vs_sequential_noise(ks, eps, delta)
    np.testing.assert_array_equal(r.laplace_sequential, r.laplace_vectorised)
    np.testing.assert_allclose(r.laplace_sequential, ks / eps)
    np.testing.assert_allclose(
        r.gaussian_advanced, 16 * ks * np.log(2.5 * ks / delta) * np.log(2 / delta) / eps**2
    )
    np.testing.assert_allclose(r.gaussian_vectorised, 2 * ks * np.log(1.25 / delta) / eps**2)
    # calibrated variances are conservative: the k-fold Gaussian with that noise is
    # (eps, delta)-DP exactly (analytic Gaussian), and just barely for the exact column
    for col in (r.gaussian_zcdp, r.gaussian_rdp, r.gaussian_exact):
        for k, var in zip(ks, col, strict=True):
            assert float(mp_gaussian_delta(math.sqrt(k / var), eps)) <= delta * (1 + 1e-9)
    for k, var in zip(ks, r.gaussian_exact, strict=True):
        assert float(mp_gaussian_delta(math.sqrt(k / var), eps)) == pytest.approx(delta, rel=1e-6)
    # sequential composition with RDP/zCDP needs much less noise than advanced composition
    assert (r.gaussian_exact <= r.gaussian_zcdp).all()
    assert (r.gaussian_zcdp <= r.gaussian_rdp).all()
    assert (r.gaussian_rdp < r.gaussian_vectorised).all()
    assert (r.gaussian_vectorised < r.gaussian_advanced).all()


def test_noise_vs_queries_integer_k_and_bad_input():
    r = vectorised_vs_sequential_noise(5, 1.0, 1e-6)
    assert r.k.tolist() == [1, 2, 3, 4, 5]
    with pytest.raises(PrivacyParameterError, match="epsilon="):
        vectorised_vs_sequential_noise(5, 0.0, 1e-6)
    with pytest.raises(PrivacyParameterError, match="ks="):
        vectorised_vs_sequential_noise([0, 1], 1.0, 1e-6)


def test_huge_per_step_epsilon_no_overflow():
    assert drv_epsilon(800.0, 3, 1e-5) == math.inf
    assert compose_advanced(800.0, 0.0, 3, 1e-5) == ApproxDp(2400.0, 0.0)
    with pytest.warns(OrderAtGridEdgeWarning):  # best order 1.01 at k = 1000: the grid edge
        r = compare_gaussian_composition(0.01, 1e-10, [1, 10, 1000])
    for name, _ in GaussianCompositionComparison.METHODS:
        assert np.isfinite(getattr(r, name)).all()
    rigorous = [n for n, _ in GaussianCompositionComparison.METHODS if n != "book_advanced"]
    for name in rigorous:
        assert (getattr(r, name) >= r.exact).all(), name
    # the book's shortcut is not a bound: at tiny sigma it falls below the exact epsilon
    assert r.book_advanced[-1] < r.exact[-1]


@pytest.mark.peers
@pytest.mark.parametrize(("eps", "delta", "k"), [(0.1, 0.0, 50), (0.5, 1e-6, 20), (1.0, 1e-4, 10)])
def test_kov_matches_dp_accounting_pld(eps, delta, k):
    # dp_accounting's PLD of the (eps, delta) dominating pair, self-composed k times
    pld_mod = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    common = pytest.importorskip("dp_accounting.pld.common")
    params = common.DifferentialPrivacyParameters(eps, delta)
    composed = pld_mod.from_privacy_parameters(params, value_discretization_interval=1e-4)
    composed = composed.self_compose(k)
    for target in (0.5, 1.0, 2.0):
        want = composed.get_delta_for_epsilon(target)
        assert optimal_composition_delta(eps, delta, k, target) == pytest.approx(want, rel=1e-9)


def test_docstring_examples_run():
    import doctest

    import renyi.analysis.composition as module

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def mp_kov_delta(eps, delta, k, target):
    """The KOV profile summed term by term in 50-digit arithmetic (independent of scipy)."""
    e = mpmath.e ** mpmath.mpf(eps)
    et = mpmath.e ** mpmath.mpf(target)
    s = (
        mpmath.fsum(
            mpmath.binomial(k, ell) * max(mpmath.mpf(0), e ** (k - ell) - et * e**ell)
            for ell in range(k + 1)
        )
        / (1 + e) ** k
    )
    return 1 - (1 - mpmath.mpf(delta)) ** k * (1 - s)


@pytest.mark.parametrize(("eps", "delta", "k"), [(0.05, 1e-10, 2000), (0.01, 0.0, 5000)])
def test_kov_large_k_is_accurate_and_conservative(eps, delta, k):
    for target in (0.5 * math.sqrt(k) * eps, 2.0 * math.sqrt(k) * eps, 4.0 * math.sqrt(k) * eps):
        got = optimal_composition_delta(eps, delta, k, target)
        want = float(mp_kov_delta(eps, delta, k, target))
        assert got >= want
        assert got == pytest.approx(want, rel=1e-9)
