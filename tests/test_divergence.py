"""Rényi divergence: mpmath sums, quadrature, closed forms, properties and bad input."""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import norm

from renyi.divergence import (
    NumericalDivergence,
    gaussian_divergence,
    laplace_divergence,
    numerical_renyi_divergence,
    renyi_divergence,
)
from renyi.errors import PrivacyParameterError

mpmath.mp.dps = 60


def lap_logpdf(mu, b):
    # exact in log space (scipy's laplace.logpdf underflows to -inf far in the tails)
    return lambda x: -abs(x - mu) / b - math.log(2 * b)


# ----------------------------------------------------------------------------------------
# independent references (mpmath, 60 digits)
# ----------------------------------------------------------------------------------------


def mp_divergence(p, q, alpha) -> float:
    """D_alpha by the defining sums in 60-digit arithmetic (inputs as exact decimals)."""
    p = [mpmath.mpf(x) for x in p]
    q = [mpmath.mpf(x) for x in q]
    sp, sq = mpmath.fsum(p), mpmath.fsum(q)
    p = [x / sp for x in p]
    q = [x / sq for x in q]
    support = [(a, b) for a, b in zip(p, q, strict=True) if a > 0]
    if alpha == 0:
        return float(-mpmath.log(mpmath.fsum(b for _, b in support)))
    if alpha == 1:
        if any(b == 0 for _, b in support):
            return math.inf
        return float(mpmath.fsum(a * mpmath.log(a / b) for a, b in support))
    if alpha == math.inf:
        if any(b == 0 for _, b in support):
            return math.inf
        return float(max(mpmath.log(a / b) for a, b in support))
    al = mpmath.mpf(alpha)
    if al > 1 and any(b == 0 for _, b in support):
        return math.inf
    s = mpmath.fsum(a**al * b ** (1 - al) for a, b in support if b > 0)
    if s == 0:
        return math.inf
    return float(mpmath.log(s) / (al - 1))


CASES = [
    ([0.5, 0.5], [0.25, 0.75]),
    ([0.2, 0.3, 0.5], [0.4, 0.4, 0.2]),
    ([0.1, 0.0, 0.9], [0.3, 0.3, 0.4]),
    ([0.25, 0.25, 0.25, 0.25], [0.97, 0.01, 0.01, 0.01]),
    ([1e-300, 1.0 - 1e-300], [1e-200, 1.0 - 1e-200]),
    ([0.5, 0.5 - 1e-300, 1e-300], [0.5, 0.5 - 1e-250, 1e-250]),
    # nearly disjoint supports: sum p^a q^(1-a) ~ 1e-9, where an expansion around 1 cancels
    ([1.0, 0.0, 7.5e-81, 1.3e-242], [7.0e-14, 1.5e-27, 7.3e-192, 1.0]),
    ([2.4e-77, 0.0, 1.6e-68, 9.2e-164, 1.0], [0.0, 1.0, 3.1e-225, 4.9e-170, 3.0e-20]),
]
ORDERS = [0.0, 1e-6, 0.25, 0.5, 0.999, 1.0, 1.001, 2.0, 7.5, 64.0, 1000.0, math.inf]


@pytest.mark.parametrize(("p", "q"), CASES)
def test_discrete_matches_mpmath(p, q):
    got = renyi_divergence(p, q, ORDERS)
    want = np.array([mp_divergence(p, q, a) for a in ORDERS])
    # orders near 0 are ill-conditioned relative to their tiny value: absolute 1e-15 there
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(("p", "q"), CASES[:4])
@pytest.mark.parametrize("eps", [1e-9, -1e-9, 1e-12, 3e-6])
def test_near_order_one_is_accurate(p, q, eps):
    got = renyi_divergence(p, q, 1.0 + eps)
    assert got == pytest.approx(mp_divergence(p, q, mpmath.mpf(1) + mpmath.mpf(eps)), rel=1e-10)


def test_tiny_probabilities_log_space():
    # P = (1e-300, 1-1e-300), Q = (1e-310, ...): ratio 1e10, no underflow to 0/0
    p = [1e-300, 1.0 - 1e-300]
    q = [1e-310, 1.0 - 1e-310]
    assert renyi_divergence(p, q, math.inf) == pytest.approx(10 * math.log(10), rel=1e-12)
    assert renyi_divergence(p, q, 2.0) == pytest.approx(mp_divergence(p, q, 2.0), rel=1e-10)
    # alpha so large that p^alpha underflows in linear space: 1/(a-1) log(e^{(a-1) r_max} p_max)
    got = renyi_divergence(p, q, 1e6)
    want = mp_divergence(p, q, 1e6)
    assert got == pytest.approx(want, rel=1e-10) and np.isfinite(got)


def test_absolute_continuity_and_disjoint_supports():
    p, q = [0.5, 0.5, 0.0], [0.5, 0.0, 0.5]
    out = renyi_divergence(p, q, [0.0, 0.5, 1.0, 2.0, math.inf])
    assert out[0] == pytest.approx(math.log(2))  # -log Q(supp P) = -log 1/2
    assert out[1] == pytest.approx(mp_divergence(p, q, 0.5))
    assert np.isinf(out[2:]).all()
    disjoint = renyi_divergence([1.0, 0.0], [0.0, 1.0], [0.0, 0.3, 0.7])
    assert np.isinf(disjoint).all()


def test_scalar_and_array_shapes():
    p, q = [0.2, 0.8], [0.5, 0.5]
    assert isinstance(renyi_divergence(p, q, 2.0), float)
    out = renyi_divergence(p, q, np.array([[2.0, 3.0], [4.0, 5.0]]))
    assert out.shape == (2, 2)
    np.testing.assert_allclose(out.ravel(), renyi_divergence(p, q, [2.0, 3.0, 4.0, 5.0]))
    two_d = renyi_divergence([[0.1, 0.2], [0.3, 0.4]], [[0.25] * 2] * 2, 2.0)
    assert two_d == pytest.approx(mp_divergence([0.1, 0.2, 0.3, 0.4], [0.25] * 4, 2.0))


# ----------------------------------------------------------------------------------------
# hypothesis properties
# ----------------------------------------------------------------------------------------


@st.composite
def pairs(draw):
    n = draw(st.integers(1, 8))
    w = st.floats(0.0, 1.0, allow_nan=False)
    p = np.array(draw(st.lists(w, min_size=n, max_size=n)))
    q = np.array(draw(st.lists(w, min_size=n, max_size=n)))
    assume(p.sum() > 1e-3 and q.sum() > 1e-3)
    return p / p.sum(), q / q.sum()


@settings(max_examples=150, deadline=None)
@given(pairs(), st.lists(st.floats(0.0, 200.0), min_size=2, max_size=6))
def test_nonnegative_and_nondecreasing(pq, orders):
    p, q = pq
    orders = np.sort(np.array([*orders, 1.0, math.inf]))
    d = renyi_divergence(p, q, orders)
    assert not np.isnan(d).any()
    assert (d >= 0).all()
    finite = np.isfinite(d)
    dd = d[finite]
    assert (np.diff(dd) >= -1e-9 * (1 + np.abs(dd[1:]))).all()
    # once infinite, stays infinite at higher orders
    if (~finite).any():
        assert (~finite[np.argmax(~finite) :]).all()


@st.composite
def log_uniform_pairs(draw):
    """Probabilities spread over 300 orders of magnitude, some exactly 0."""
    n = draw(st.integers(1, 5))
    exps = st.floats(-300.0, 0.0)
    p = 10.0 ** np.array(draw(st.lists(exps, min_size=n, max_size=n)))
    q = 10.0 ** np.array(draw(st.lists(exps, min_size=n, max_size=n)))
    for arr in (p, q):
        if draw(st.booleans()):
            arr[draw(st.integers(0, n - 1))] = 0.0
    assume(p.sum() > 0 and q.sum() > 0)
    return p / p.sum(), q / q.sum()


@settings(max_examples=80, deadline=None)
@given(log_uniform_pairs())
def test_extreme_probabilities_match_mpmath(pq):
    p, q = pq
    orders = [1e-12, 0.3, 0.5, 1 - 1e-12, 1.0, 1 + 1e-12, 1.5, 30.0, 1e4]
    got = renyi_divergence(p, q, orders)
    for a, g in zip(orders, got, strict=True):
        want = mp_divergence(p.tolist(), q.tolist(), mpmath.mpf(a) if a != 1.0 else 1)
        # absolute 1e-15: the float inputs themselves carry no more information than that
        assert g == want or abs(g - want) <= 1e-9 * abs(want) + 1e-15, (a, g, want)


@settings(max_examples=100, deadline=None)
@given(pairs(), st.floats(0.05, 50.0))
def test_zero_iff_equal(pq, alpha):
    p, q = pq
    assert renyi_divergence(p, p, alpha) == pytest.approx(0.0, abs=1e-12)
    if np.max(np.abs(p - q)) > 1e-3:
        assert renyi_divergence(p, q, alpha) > 0


@settings(max_examples=100, deadline=None)
@given(pairs())
def test_order_one_is_continuous_limit(pq):
    p, q = pq
    kl = renyi_divergence(p, q, 1.0)
    assume(np.isfinite(kl))
    lo, hi = renyi_divergence(p, q, [1.0 - 1e-10, 1.0 + 1e-10])
    assert lo == pytest.approx(kl, rel=1e-5, abs=1e-12)
    assert hi == pytest.approx(kl, rel=1e-5, abs=1e-12)
    assert lo <= kl * (1 + 1e-12) + 1e-15 and kl <= hi * (1 + 1e-12) + 1e-15


# ----------------------------------------------------------------------------------------
# closed forms against quadrature (scipy) and mpmath
# ----------------------------------------------------------------------------------------


def quad_divergence(logp, logq, alpha, points):
    """Independent reference: plain quad of p^a q^(1-a) on pieces between points."""
    edges = [-np.inf, *sorted(set(points)), np.inf]
    if alpha == 1:

        def f(x):
            lp = logp(x)
            return 0.0 if lp < -745 else math.exp(lp) * (lp - logq(x))

    else:

        def f(x):
            g = alpha * logp(x) + (1 - alpha) * logq(x)
            return 0.0 if not g > -745 else math.exp(g)

    total = sum(
        integrate.quad(f, a, b, epsabs=1e-14, epsrel=1e-12, limit=200)[0]
        for a, b in itertools.pairwise(edges)
    )
    return total if alpha == 1 else math.log(total) / (alpha - 1)


GAUSS = [(0.0, 1.0, 1.0, 1.0), (0.0, 1.0, 2.0, 1.5), (1.0, 2.0, -1.0, 1.0), (0.0, 0.3, 0.1, 0.3)]


@pytest.mark.parametrize("params", GAUSS)
@pytest.mark.parametrize("alpha", [0.2, 0.5, 1.0, 1.5, 2.0, 3.5])
def test_gaussian_closed_form_vs_quadrature(params, alpha):
    m0, s0, m1, s1 = params
    if alpha * s1**2 + (1 - alpha) * s0**2 <= 0:
        assert gaussian_divergence(m0, s0, m1, s1, alpha) == math.inf
        return
    want = quad_divergence(norm(m0, s0).logpdf, norm(m1, s1).logpdf, alpha, [m0, m1])
    assert gaussian_divergence(m0, s0, m1, s1, alpha) == pytest.approx(want, rel=1e-8)


def test_gaussian_equal_variance_is_mironov_prop7():
    orders = np.array([1.5, 2.0, 10.0, 1e4])
    np.testing.assert_allclose(
        gaussian_divergence(0.0, 2.0, 3.0, 2.0, orders), orders * 9 / (2 * 4), rtol=1e-14
    )


def test_gaussian_special_orders_and_infinite_region():
    m0, s0, m1, s1 = 0.5, 1.0, -0.5, 2.0
    kl = math.log(s1 / s0) + (s0**2 + (m0 - m1) ** 2) / (2 * s1**2) - 0.5
    out = gaussian_divergence(m0, s0, m1, s1, [0.0, 1.0, 1 + 1e-9, math.inf])
    assert out[0] == 0.0
    assert out[1] == pytest.approx(kl, rel=1e-14)
    assert out[2] == pytest.approx(kl, rel=1e-8)
    # sup_x log p0/p1 of the two Gaussians, by direct maximisation
    xs = np.linspace(-20, 20, 400001)
    sup = np.max(norm(m0, s0).logpdf(xs) - norm(m1, s1).logpdf(xs))
    assert out[3] == pytest.approx(sup, rel=1e-8)
    # sigma0 > sigma1: infinite once alpha s1^2 + (1-alpha) s0^2 <= 0 (alpha >= 4/3 here)
    big = gaussian_divergence(0.0, 2.0, 0.0, 1.0, [1.3, 1.34, 2.0, math.inf])
    assert np.isfinite(big[0]) and np.isinf(big[1:]).all()


LAPLACE = [(0.0, 1.0, 1.0, 1.0), (0.0, 1.0, 3.0, 1.0), (0.0, 0.5, 0.2, 0.5), (0.0, 1.0, 1.0, 2.0)]
LAPLACE += [(1.0, 2.0, 0.0, 1.5), (0.0, 1.0, 0.0, 3.0), (0.0, 3.0, 0.0, 1.0)]


@pytest.mark.parametrize("params", LAPLACE)
@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.9, 1.0, 1.2, 2.0, 5.0])
def test_laplace_closed_form_vs_quadrature(params, alpha):
    m0, b0, m1, b1 = params
    got = laplace_divergence(m0, b0, m1, b1, alpha)
    if alpha > 1 and alpha / b0 - (alpha - 1) / b1 <= 0:
        assert got == math.inf
        return
    want = quad_divergence(lap_logpdf(m0, b0), lap_logpdf(m1, b1), alpha, [m0, m1])
    assert got == pytest.approx(want, rel=1e-8, abs=1e-13)


def test_laplace_equal_scale_is_mironov_table2():
    b, d = 0.7, 1.3  # shift 1.3, scale 0.7 -> the table's formula with 1/b replaced by d/b
    orders = [1.5, 2.0, 10.0, 100.0]
    x = mpmath.mpf(d) / mpmath.mpf(b)
    want = [
        float(
            mpmath.log(
                a / (2 * a - 1) * mpmath.exp((a - 1) * x)
                + (a - 1) / (2 * a - 1) * mpmath.exp(-a * x)
            )
            / (a - 1)
        )
        for a in map(mpmath.mpf, orders)
    ]
    np.testing.assert_allclose(laplace_divergence(0.0, b, d, b, orders), want, rtol=1e-13)
    special = laplace_divergence(0.0, b, d, b, [1.0, math.inf, 1 + 1e-9, 1 - 1e-9])
    kl = float(x + mpmath.exp(-x) - 1)
    np.testing.assert_allclose(special, [kl, float(x), kl, kl], rtol=1e-8)


def test_laplace_no_overflow_at_large_order_tiny_scale():
    # exp((alpha-1)/b) with alpha = 1e4, b = 0.01 overflows; the divergence is finite (~1/b)
    out = laplace_divergence(0.0, 0.01, 1.0, 0.01, [1e4, 1e6, 0.001])
    assert np.isfinite(out).all()
    x = mpmath.mpf(100)
    a = mpmath.mpf(10) ** 4
    want = mpmath.log(
        a / (2 * a - 1) * mpmath.exp((a - 1) * x) + (a - 1) / (2 * a - 1) * mpmath.exp(-a * x)
    ) / (a - 1)
    assert out[0] == pytest.approx(float(want), rel=1e-12)
    assert out[1] <= 100.0 and out[1] == pytest.approx(100.0, rel=1e-5)


def test_laplace_general_scale_inf_and_sup():
    out = laplace_divergence(0.0, 1.0, 1.0, 2.0, [0.0, math.inf])
    xs = np.linspace(-50, 50, 200001)
    sup = np.max((-np.abs(xs) - math.log(2)) - (-np.abs(xs - 1) / 2 - math.log(4)))
    assert out[0] == 0.0 and out[1] == pytest.approx(sup, rel=1e-9)
    assert laplace_divergence(0.0, 2.0, 1.0, 1.0, math.inf) == math.inf


# ----------------------------------------------------------------------------------------
# numerical divergence
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.3, 1.0, 2.0, 8.0])
def test_numerical_matches_gaussian_closed_form(alpha):
    res = numerical_renyi_divergence(norm(0.0, 1.0).logpdf, norm(1.5, 1.2).logpdf, alpha)
    assert isinstance(res, NumericalDivergence)
    want = gaussian_divergence(0.0, 1.0, 1.5, 1.2, alpha)
    assert abs(res.value - want) <= max(10 * res.abs_error, 1e-9 * want)
    assert res.abs_error < 1e-8


@pytest.mark.parametrize("alpha", [0.5, 1.0, 3.0])
def test_numerical_matches_laplace_closed_form(alpha):
    res = numerical_renyi_divergence(
        lap_logpdf(0.0, 1.0), lap_logpdf(2.0, 1.5), alpha, breakpoints=[0.0, 2.0]
    )
    want = laplace_divergence(0.0, 1.0, 2.0, 1.5, alpha)
    assert res.value == pytest.approx(want, rel=1e-8)


def test_numerical_narrow_peak_far_from_origin_and_log_shift():
    # the integrand is ~exp(-huge) everywhere: the log shift keeps it representable
    res = numerical_renyi_divergence(norm(1e4, 0.01).logpdf, norm(1e4 + 0.5, 0.01).logpdf, 20.0)
    assert res.value == pytest.approx(20 * 0.25 / (2 * 1e-4), rel=1e-7)


def test_numerical_finite_interval():
    # uniform densities on [0, 1] and a tilted one: D_2 by hand = log ∫ 1/q = log(∫ 1/(2x))
    # for q(x)=2x is infinite; use q(x) = (1 + x)/1.5 instead: ∫ 1.5/(1+x) = 1.5 log 2
    res = numerical_renyi_divergence(
        lambda x: 0.0, lambda x: math.log((1 + x) / 1.5), 2.0, lower=0.0, upper=1.0
    )
    assert res.value == pytest.approx(math.log(1.5 * math.log(2)), rel=1e-10)


def _uniform(lo, hi):
    return lambda x: -math.log(hi - lo) if lo <= x <= hi else -math.inf


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0, 10.0])
def test_numerical_supports_absolute_continuity_and_disjointness(alpha):
    # U[0,1] vs U[0,2]: sum p^a q^(1-a) = 2^(a-1) -> log 2 at every order
    narrow, wide = _uniform(0.0, 1.0), _uniform(0.0, 2.0)
    res = numerical_renyi_divergence(narrow, wide, alpha, breakpoints=[0.0, 1.0, 2.0])
    assert res.value == pytest.approx(math.log(2), rel=1e-10)
    # reversed: P not absolutely continuous w.r.t. Q for alpha >= 1 -> inf; for alpha < 1
    # the integral over [0, 1] of (1/2)^a is 2^-a -> D = a log 2 / (1 - a)
    rev = numerical_renyi_divergence(wide, narrow, alpha, breakpoints=[0.0, 1.0, 2.0])
    if alpha >= 1:
        assert rev.value == math.inf
    else:
        assert rev.value == pytest.approx(alpha * math.log(2) / (1 - alpha), rel=1e-10)
    if alpha < 1:  # disjoint supports
        far = numerical_renyi_divergence(narrow, _uniform(5.0, 6.0), alpha)
        assert far.value == math.inf


def test_numerical_refuses_nan_log_density():
    with pytest.raises(PrivacyParameterError, match=r"log_p=nan .*at x="):
        numerical_renyi_divergence(lambda x: math.nan, norm().logpdf, 2.0)
    with pytest.raises(PrivacyParameterError, match="log_q=inf"):
        numerical_renyi_divergence(norm().logpdf, lambda x: math.inf, 0.5)


# ----------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "q", "alpha", "name"),
    [
        ([0.5, -0.1, 0.6], [0.3, 0.3, 0.4], 2.0, "p="),
        ([0.5, 0.5], [0.3, 0.3], 2.0, "sum(q)="),
        ([0.5, 0.5], [0.3, 0.3, 0.4], 2.0, "q="),
        ([], [], 2.0, "p="),
        ([0.5, math.nan], [0.5, 0.5], 2.0, "p="),
        ([0.5, 0.5], [math.inf, 0.5], 2.0, "q="),
        ([0.5, 0.5], [0.5, 0.5], -1.0, "alpha="),
        ([0.5, 0.5], [0.5, 0.5], math.nan, "alpha="),
        ([0.5, 0.5], [0.5, 0.5], [2.0, math.nan], "alpha="),
        ([0.5, 0.5], [0.5, 0.5], [], "alpha="),
        ([0.5, 0.5], [0.5, 0.5], "2", "alpha="),
        (["a", "b"], [0.5, 0.5], 2.0, "p="),
    ],
)
def test_discrete_bad_input(p, q, alpha, name):
    with pytest.raises(PrivacyParameterError, match=name.replace("(", r"\(").replace(")", r"\)")):
        renyi_divergence(p, q, alpha)


def test_sum_tolerance_is_stated_and_adjustable():
    p = [0.5, 0.5 + 1e-8]
    assert renyi_divergence(p, [0.5, 0.5], 2.0) >= 0.0  # within default 1e-6
    with pytest.raises(PrivacyParameterError, match="tolerance 1e-10"):
        renyi_divergence(p, [0.5, 0.5], 2.0, tol=1e-10)


@pytest.mark.parametrize(
    ("fn", "args", "name"),
    [
        (gaussian_divergence, (0.0, 0.0, 1.0, 1.0, 2.0), "sigma0="),
        (gaussian_divergence, (0.0, 1.0, 1.0, -1.0, 2.0), "sigma1="),
        (gaussian_divergence, (math.nan, 1.0, 1.0, 1.0, 2.0), "mu0="),
        (gaussian_divergence, (0.0, 1.0, 1.0, 1.0, -0.5), "alpha="),
        (laplace_divergence, (0.0, math.inf, 1.0, 1.0, 2.0), "b0="),
        (laplace_divergence, (0.0, 1.0, math.inf, 1.0, 2.0), "mu1="),
        (laplace_divergence, (0.0, 1.0, 1.0, 1.0, math.nan), "alpha="),
    ],
)
def test_closed_form_bad_input(fn, args, name):
    with pytest.raises(PrivacyParameterError, match=name):
        fn(*args)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"alpha": 0.0}, "alpha="),
        ({"alpha": math.inf}, "alpha="),
        ({"alpha": math.nan}, "alpha="),
        ({"alpha": 2.0, "lower": 1.0, "upper": 0.0}, "upper="),
        ({"alpha": 2.0, "breakpoints": [math.nan]}, "breakpoints="),
    ],
)
def test_numerical_bad_input(kwargs, name):
    with pytest.raises(PrivacyParameterError, match=name):
        numerical_renyi_divergence(norm().logpdf, norm(1).logpdf, **kwargs)
    with pytest.raises(PrivacyParameterError, match="log_p="):
        numerical_renyi_divergence(3.0, norm().logpdf, 2.0)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------
# extreme parameters: closed forms vs the same formulas in 80-digit mpmath
# ----------------------------------------------------------------------------------------


def mp_gaussian(m0, s0, m1, s1, a):
    m0, s0, m1, s1, a = map(mpmath.mpf, (m0, s0, m1, s1, a))
    if a == 1:
        return mpmath.log(s1 / s0) + (s0**2 + (m0 - m1) ** 2) / (2 * s1**2) - mpmath.mpf(1) / 2
    v = a * s1**2 + (1 - a) * s0**2
    if v <= 0:
        return mpmath.inf
    return (
        mpmath.log(s1 / s0) + mpmath.log(s1**2 / v) / (2 * (a - 1)) + a * (m0 - m1) ** 2 / (2 * v)
    )


def mp_laplace(m0, b0, m1, b1, a):
    m0, b0, m1, b1, a = map(mpmath.mpf, (m0, b0, m1, b1, a))
    m = abs(m0 - m1)
    if a == 1:
        return mpmath.log(b1 / b0) + m / b1 + (b0 / b1) * mpmath.exp(-m / b0) - 1
    big_a, c = a / b0, (1 - a) / b1
    if big_a + c <= 0:
        return mpmath.inf
    e_a, e_c = mpmath.exp(-big_a * m), mpmath.exp(-c * m)
    mid = (e_a - e_c) / (c - big_a) if c != big_a else m * e_a
    total = (e_c + e_a) / (big_a + c) + mid
    return (mpmath.log(total) - a * mpmath.log(2 * b0) + (a - 1) * mpmath.log(2 * b1)) / (a - 1)


EXTREME_ORDERS = [1e-12, 0.3, 0.5, 1 - 1e-9, 1.0, 1 + 1e-9, 1.5, 30.0, 1e4]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize(
    "params",
    [
        (1.4e-5, 2.5e36, 0.0106, 1.5e-65),  # sigma0/sigma1 ~ 1e101
        (0.0, 1.4e113, 0.0, 2.5e-122),  # sigma0/sigma1 ~ 1e235: rho^2 overflows
        (-1.6, 9.5e98, 0.4, 5.8e-24),
        (42910.9, 0.0095, -0.0009, 0.0038),  # huge shift
        (0.0, 1.0, 1.0, 1.0 + 1e-11),  # nearly equal variances
        (3.0, 2.0, -1.0, 7.0),
    ],
)
def test_gaussian_extreme_parameters(params):
    mpmath.mp.dps = 80
    try:
        got = gaussian_divergence(*params, EXTREME_ORDERS)
        for a, g in zip(EXTREME_ORDERS, got, strict=True):
            want = float(mp_gaussian(*params, a))
            assert g == want or abs(g - want) <= 1e-9 * abs(want) + 1e-14, (a, g, want)
    finally:
        mpmath.mp.dps = 60


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize(
    "params",
    [
        (-3.09, 342.5, -0.34, 0.0162),  # pole of the order-1 expansion at 1 + 4.7e-5
        (-0.0031, 50.87, 0.0268, 0.0012),
        (0.0, 0.594, -23800.3, 0.886),  # huge shift, alpha -> 0 via skew symmetry
        (6751.5, 5.569, -69780.3, 5.569),  # equal scales, huge shift
        (-3.0e-5, 2.4e20, 0.0, 3.3e-16),  # scale ratio 1e36: factoring avoids 1e20-size terms
        (1.0, 2.0, 0.0, 1.5),
    ],
)
def test_laplace_extreme_parameters(params):
    mpmath.mp.dps = 80
    try:
        got = laplace_divergence(*params, EXTREME_ORDERS)
        ratio = max(params[1], params[3]) / min(params[1], params[3])
        for a, g in zip(EXTREME_ORDERS, got, strict=True):
            want = float(mp_laplace(*params, a))
            # documented: beyond scale ratio 1e6, orders within 1e-7 of 0 or 1 are looser
            rel = 1e-9 if ratio < 1e6 or 1e-7 < a < 1 - 1e-7 or a > 1 + 1e-7 else 1e-3
            assert g == want or abs(g - want) <= rel * abs(want) + 1e-13, (a, g, want)
    finally:
        mpmath.mp.dps = 60


def test_laplace_refuses_absurd_scale_ratio():
    with pytest.raises(PrivacyParameterError, match="b1="):
        laplace_divergence(0.0, 1e-200, 1.0, 1e200, 2.0)


def test_docstring_examples_run():
    import doctest

    import renyi.analysis.divergence as module

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
