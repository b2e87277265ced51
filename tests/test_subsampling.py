"""Tests of renyi.subsampling against independent high-precision computations.

References: mpmath quadrature of the Rényi integral of the mixture
(1-q) N(0, s^2) + q N(1, s^2) against N(0, s^2) (fractional orders), the exact binomial sum
in mpmath rationals-of-exponentials at 50 digits (integer orders, MTZ Section 3.2), the
closed form alpha / (2 sigma^2) at q = 1, and the peers (dp_accounting) as an oracle at
integer orders. Nothing here is a stored output of our own code.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renyi.errors import PrivacyParameterError
from renyi.subsampling import (
    amplify_approx_dp_poisson,
    amplify_approx_dp_without_replacement,
    poisson_subsampled_gaussian_rdp,
    poisson_subsampled_rdp,
    sampled_without_replacement_gaussian_rdp,
)

REL_TOL = 1e-8  # required agreement with the high-precision reference
ROUND_TOL = 1e-13  # how far below the reference rounding alone may take us


def _grid() -> np.ndarray:
    try:
        from renyi.curves import DEFAULT_ORDERS

        return np.asarray(DEFAULT_ORDERS, dtype=np.float64)
    except ImportError:  # pragma: no cover - curves.py not committed yet
        return np.concatenate(
            [
                np.arange(1.01, 1.095, 0.01),
                np.arange(1.1, 10.95, 0.1),
                np.arange(11, 64),
                np.arange(64, 257, 8),
                np.arange(288, 1025, 32),
            ]
        )


@functools.cache
def ref_quad(q: float, sigma: float, alpha: float, dps: int = 30) -> float:
    """epsilon(alpha) = log1p(B) / (alpha - 1), B = E_{mu0}[(1+u)^alpha - 1 - alpha u] by quad.

    u(z) = q (exp((2z - 1) / (2 s^2)) - 1) = mu(z)/mu0(z) - 1; integrating the non-negative
    B directly keeps its relative precision when it is tiny. The range is split around 0, the
    peak of the integrand (fixed point of z = alpha w(z)) and z0.
    """
    with mp.workdps(dps):
        qm, s, a = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)
        c = 1 / (2 * s * s)

        def integrand(z: mp.mpf) -> mp.mpf:
            u = qm * mp.expm1((2 * z - 1) * c)
            return mp.npdf(z, 0, s) * (mp.power(1 + u, a) - 1 - a * u)

        z = a
        for _ in range(200):
            t = (2 * z - 1) * c
            z = a * (qm / (qm + (1 - qm) * mp.exp(-t)))
        z0 = s * s * mp.log((1 - qm) / qm) + mp.mpf(1) / 2
        pts = set()
        for centre in (mp.mpf(0), z, z0):
            for m in (0, 0.5, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
                pts.add(centre + m * s)
                pts.add(centre - m * s)
        b = mp.quad(integrand, [-mp.inf, *sorted(pts), mp.inf])
        return float(mp.log1p(b) / (a - 1))


@functools.cache
def ref_integer(q: float, sigma: float, alpha: int) -> float:
    """Exact MTZ binomial sum at 50 digits (with A - 1 formed in high precision)."""
    with mp.workdps(50):
        qm, s = mp.mpf(q), mp.mpf(sigma)
        c = 1 / (2 * s * s)
        a_sum = mp.fsum(
            mp.binomial(alpha, k) * (1 - qm) ** (alpha - k) * qm**k * mp.exp(c * (k * k - k))
            for k in range(alpha + 1)
        )
        return float(mp.log(a_sum) / (alpha - 1))


def _check(value: float, ref: float) -> None:
    assert math.isfinite(value)
    rel = (value - ref) / ref
    assert rel <= REL_TOL, (value, ref, rel)
    assert rel >= -ROUND_TOL, (value, ref, rel)  # never (beyond rounding) below the truth


QS = [1e-4, 0.01, 0.1, 0.5]
SIGMAS = [0.3, 0.5, 1.0, 4.0, 20.0]


@pytest.mark.parametrize("q", QS)
@pytest.mark.parametrize("sigma", SIGMAS)
@pytest.mark.parametrize("alpha", [1.01, 2.5])
def test_fractional_orders_match_quadrature(q: float, sigma: float, alpha: float) -> None:
    _check(poisson_subsampled_gaussian_rdp(q, sigma, alpha)[0], ref_quad(q, sigma, alpha))


@pytest.mark.slow
@pytest.mark.parametrize("q", [*QS, 0.9])
@pytest.mark.parametrize("sigma", SIGMAS)
@pytest.mark.parametrize("alpha", [1.09, 1.5, 3.7, 10.5, 20.5, 100.5, 1000.3])
def test_fractional_orders_match_quadrature_full_grid(q: float, sigma: float, alpha: float) -> None:
    _check(poisson_subsampled_gaussian_rdp(q, sigma, alpha)[0], ref_quad(q, sigma, alpha))


@pytest.mark.parametrize("q", [*QS, 0.9])
@pytest.mark.parametrize("sigma", [*SIGMAS, 200.0])
def test_integer_orders_match_exact_sum(q: float, sigma: float) -> None:
    alphas = [2, 3, 7, 32, 64, 256, 1024]
    got = poisson_subsampled_gaussian_rdp(q, sigma, alphas)
    for a, v in zip(alphas, got, strict=True):
        _check(v, ref_integer(q, sigma, a))


@pytest.mark.parametrize(("q", "sigma", "alpha"), [(0.01, 1.0, 2), (0.5, 0.5, 64), (1e-4, 4.0, 7)])
def test_integer_formula_matches_quadrature(q: float, sigma: float, alpha: int) -> None:
    # The binomial sum itself is checked against the integral it comes from.
    _check(poisson_subsampled_gaussian_rdp(q, sigma, alpha)[0], ref_quad(q, sigma, alpha))


def test_full_rate_is_plain_gaussian_exactly() -> None:
    orders = _grid()
    for sigma in SIGMAS:
        got = poisson_subsampled_gaussian_rdp(1.0, sigma, orders)
        np.testing.assert_array_equal(got, orders / (2 * sigma * sigma))


def test_zero_rate_is_zero() -> None:
    np.testing.assert_array_equal(poisson_subsampled_gaussian_rdp(0.0, 1.0, _grid()), 0.0)


def test_infinite_order() -> None:
    got = poisson_subsampled_gaussian_rdp(0.01, 1.0, [2.0, math.inf])
    assert got[1] == math.inf and math.isfinite(got[0])
    assert poisson_subsampled_gaussian_rdp(0.0, 1.0, [math.inf])[0] == 0.0


def test_order_and_duplicates_preserved_and_vectorised_equals_scalar() -> None:
    orders = [3.5, 2.0, 3.5, 1.01, 64.0]
    got = poisson_subsampled_gaussian_rdp(0.01, 1.3, orders)
    single = [poisson_subsampled_gaussian_rdp(0.01, 1.3, o)[0] for o in orders]
    np.testing.assert_allclose(got, single, rtol=1e-12)
    assert got[0] == got[2]


@pytest.mark.parametrize(
    ("q", "sigma"), [(0.5, 1e-3), (0.9, 0.05), (1e-4, 1e-6), (0.3, 1e-200), (1e-12, 1e6)]
)
def test_extreme_parameters_never_nan(q: float, sigma: float) -> None:
    got = poisson_subsampled_gaussian_rdp(q, sigma, _grid())
    assert not np.isnan(got).any()
    assert (got >= 0).all()
    assert (got[1:] >= got[:-1] * (1 - 1e-12)).all()


def test_tiny_sigma_large_order_is_large_or_inf() -> None:
    # log A ~ q^alpha exp(alpha(alpha-1)/(2 s^2)): epsilon ~ alpha / (2 s^2) + log(q)
    got = poisson_subsampled_gaussian_rdp(0.01, 0.01, [1024.0, 1000.5])
    assert np.all(got > 0.99 * 1024 / (2 * 0.01**2) * (1000 / 1024))


@settings(max_examples=25, deadline=None)
@given(
    q=st.floats(1e-6, 1.0),
    sigma=st.floats(0.3, 50.0),
)
def test_monotone_in_order_and_rate(q: float, sigma: float) -> None:
    orders = _grid()
    got = poisson_subsampled_gaussian_rdp(q, sigma, orders)
    assert not np.isnan(got).any()
    # RDP is non-decreasing in alpha (van Erven & Harremoës 2014, Thm 3).
    assert (np.diff(got) >= -1e-12 * np.abs(got[1:])).all()
    # And below the non-subsampled Gaussian.
    assert (got <= orders / (2 * sigma * sigma) * (1 + 1e-12)).all()
    # Non-decreasing in q.
    more = poisson_subsampled_gaussian_rdp(min(1.0, 1.5 * q), sigma, orders)
    assert (more >= got * (1 - 1e-12)).all()


@pytest.mark.peers
def test_integer_orders_agree_with_dp_accounting() -> None:
    rdp = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    orders = np.arange(2, 200, dtype=np.float64)
    for q, sigma in [(256 / 60000, 1.1), (0.1, 2.0), (0.01, 0.7)]:
        peer = np.array(
            [rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, [a])[0] for a in orders]
        )
        ours = poisson_subsampled_gaussian_rdp(q, sigma, orders)
        np.testing.assert_allclose(ours, peer, rtol=1e-7)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"sampling_rate": -0.1}, "sampling_rate"),
        ({"sampling_rate": 1.5}, "sampling_rate"),
        ({"sampling_rate": math.nan}, "sampling_rate"),
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": math.inf}, "noise_multiplier"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"orders": [1.0]}, "orders"),
        ({"orders": [0.5, 2.0]}, "orders"),
        ({"orders": [math.nan]}, "orders"),
        ({"orders": []}, "orders"),
    ],
)
def test_bad_input_raises(kwargs: dict[str, object], name: str) -> None:
    args: dict[str, object] = {"sampling_rate": 0.1, "noise_multiplier": 1.0, "orders": [2.0]}
    args.update(kwargs)
    with pytest.raises(PrivacyParameterError, match=name):
        poisson_subsampled_gaussian_rdp(**args)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# (epsilon, delta) amplification, Balle, Barthe & Gaboardi 2018
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-8, 0.1, 1.0, 1.5, 10.0, 700.0, 710.0, 1000.0, 1e6])
@pytest.mark.parametrize("q", [1e-9, 0.01, 0.5, 1.0])
def test_amplify_approx_dp_matches_mpmath(eps: float, q: float) -> None:
    got_eps, got_delta = amplify_approx_dp_poisson(eps, 1e-5, q)
    with mp.workdps(40):
        ref = mp.log(1 + mp.mpf(q) * (mp.exp(mp.mpf(eps)) - 1))
    assert got_eps == pytest.approx(float(ref), rel=1e-13)
    assert got_delta == pytest.approx(q * 1e-5, rel=1e-15)
    assert got_eps <= eps * (1 + 1e-15)


def test_amplify_approx_dp_edges_and_without_replacement() -> None:
    assert amplify_approx_dp_poisson(math.inf, 0.1, 0.5) == (math.inf, 0.05)
    assert amplify_approx_dp_poisson(1.0, 0.1, 0.0) == (0.0, 0.0)
    assert amplify_approx_dp_poisson(1.0, 0.1, 1.0)[0] == pytest.approx(1.0, rel=1e-15)
    assert amplify_approx_dp_without_replacement(1.0, 1e-6, 1000, 10) == (
        amplify_approx_dp_poisson(1.0, 1e-6, 0.01)
    )
    with pytest.raises(PrivacyParameterError, match="sample_size"):
        amplify_approx_dp_without_replacement(1.0, 1e-6, 10, 11)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        amplify_approx_dp_poisson(-1.0, 1e-6, 0.1)
    with pytest.raises(PrivacyParameterError, match="delta"):
        amplify_approx_dp_poisson(1.0, 1.5, 0.1)
    with pytest.raises(PrivacyParameterError, match="sampling_rate"):
        amplify_approx_dp_poisson(1.0, 0.1, math.nan)


# ---------------------------------------------------------------------------------------------
# Sampling without replacement, Wang, Balle & Kasiviswanathan 2019, Theorem 9
# ---------------------------------------------------------------------------------------------


def wbk_theorem9_mpmath(n: int, m: int, sigma: float, alpha: int) -> float:
    """Independent evaluation of WBK Thm 9 for the Gaussian (eps(j) = j / (2 s^2)), 40 digits."""
    with mp.workdps(40):
        g = mp.mpf(m) / n
        c = 1 / (2 * mp.mpf(sigma) ** 2)

        def eps(j: int) -> mp.mpf:
            return j * c

        total = 1 + g**2 * mp.binomial(alpha, 2) * min(4 * (mp.exp(eps(2)) - 1), mp.exp(eps(2)) * 2)
        for j in range(3, alpha + 1):
            total += g**j * mp.binomial(alpha, j) * mp.exp((j - 1) * eps(j)) * 2
        return float(min(mp.log(total) / (alpha - 1), alpha * c))


@pytest.mark.parametrize(
    ("n", "m", "sigma"), [(60000, 256, 1.1), (1000, 100, 2.0), (100, 50, 0.7), (10, 10, 1.0)]
)
def test_without_replacement_matches_theorem9(n: int, m: int, sigma: float) -> None:
    orders = [2, 3, 4, 7, 16, 64]
    got = sampled_without_replacement_gaussian_rdp(n, m, sigma, orders)
    for a, v in zip(orders, got, strict=True):
        ref = wbk_theorem9_mpmath(n, m, sigma, a)
        assert v == pytest.approx(ref, rel=1e-10)
        assert v >= ref * (1 - 1e-13)


def test_without_replacement_fractional_interpolation_and_monotone() -> None:
    n, m, sigma = 1000, 100, 2.0
    ints = sampled_without_replacement_gaussian_rdp(n, m, sigma, [2.0, 3.0])
    got = sampled_without_replacement_gaussian_rdp(n, m, sigma, [1.5, 2.5])
    # (alpha - 1) eps is interpolated linearly (0 at alpha = 1).
    assert got[0] * 0.5 == pytest.approx(0.5 * ints[0], rel=1e-12)
    assert got[1] * 1.5 == pytest.approx(0.5 * ints[0] + 0.5 * 2 * ints[1], rel=1e-12)
    grid = _grid()
    curve = sampled_without_replacement_gaussian_rdp(n, m, sigma, grid)
    assert (curve[1:] >= curve[:-1] * (1 - 1e-12)).all()
    assert (curve <= grid / (2 * sigma**2) * (1 + 1e-12)).all()
    more = sampled_without_replacement_gaussian_rdp(n, 2 * m, sigma, grid)
    assert (more >= curve * (1 - 1e-12)).all()
    assert sampled_without_replacement_gaussian_rdp(n, 0, sigma, [2.0])[0] == 0.0
    assert sampled_without_replacement_gaussian_rdp(n, m, sigma, [math.inf])[0] == math.inf
    tiny = sampled_without_replacement_gaussian_rdp(n, m, 1e-3, grid)
    assert not np.isnan(tiny).any()


@pytest.mark.peers
def test_without_replacement_not_below_dp_accounting_where_terms_agree() -> None:
    rdp = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")
    # For sigma = 1.1, q = 256/60000 both use the same dominant terms.
    orders = [2.0, 3.0, 8.0, 32.0]
    ours = sampled_without_replacement_gaussian_rdp(60000, 256, 1.1, orders)
    peer = [rdp._compute_rdp_sample_wor_gaussian(256 / 60000, 1.1, [a])[0] for a in orders]
    np.testing.assert_allclose(ours, peer, rtol=1e-8)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((0, 0, 1.0), "population_size"),
        ((10, 11, 1.0), "sample_size"),
        ((10, -1, 1.0), "sample_size"),
        ((10, 5, 0.0), "noise_multiplier"),
        ((10, 5, math.nan), "noise_multiplier"),
    ],
)
def test_without_replacement_bad_input(args: tuple[int, int, float], name: str) -> None:
    with pytest.raises(PrivacyParameterError, match=name):
        sampled_without_replacement_gaussian_rdp(*args, [2.0])
    with pytest.raises(PrivacyParameterError, match="orders"):
        sampled_without_replacement_gaussian_rdp(10, 5, 1.0, [1.0])


# ---------------------------------------------------------------------------------------------
# Generic Poisson amplification, Zhu & Wang 2019, Theorem 6
# ---------------------------------------------------------------------------------------------


def _laplace_rdp(b: float) -> Callable[[np.ndarray], np.ndarray]:
    """Mironov 2017 Table II, Laplace with scale b and sensitivity 1 (mpmath, then float)."""

    def fn(orders: np.ndarray) -> np.ndarray:
        out = []
        for a in orders:
            with mp.workdps(40):
                am = mp.mpf(a)
                v = mp.log(
                    am / (2 * am - 1) * mp.exp((am - 1) / b)
                    + (am - 1) / (2 * am - 1) * mp.exp(-am / b)
                ) / (am - 1)
            out.append(float(v))
        return np.array(out)

    return fn


@functools.cache
def subsampled_laplace_divergence(q: float, b: float, alpha: float) -> float:
    """max of D_alpha(mu || L0) and D_alpha(L0 || mu), mu = (1-q) L0 + q L1, by mpmath quad."""
    with mp.workdps(30):
        qm, bm, a = mp.mpf(q), mp.mpf(b), mp.mpf(alpha)

        def p0(x: mp.mpf) -> mp.mpf:
            return mp.exp(-abs(x) / bm) / (2 * bm)

        def mu(x: mp.mpf) -> mp.mpf:
            return (1 - qm) * p0(x) + qm * p0(x - 1)

        pts = [-mp.inf, -1, 0, mp.mpf(1) / 2, 1, 2, mp.inf]
        rem = mp.quad(lambda x: mu(x) ** a * p0(x) ** (1 - a), pts)
        add = mp.quad(lambda x: p0(x) ** a * mu(x) ** (1 - a), pts)
        return float(max(mp.log(rem), mp.log(add)) / (a - 1))


@pytest.mark.parametrize("q", [0.01, 0.1, 0.5])
@pytest.mark.parametrize("b", [0.5, 1.0, 4.0])
def test_generic_amplification_bounds_subsampled_laplace(q: float, b: float) -> None:
    orders = [2.0, 3.0, 5.5, 8.0]
    got = poisson_subsampled_rdp(_laplace_rdp(b), q, orders)
    base = _laplace_rdp(b)(np.array(orders))
    for a, v, e in zip(orders, got, base, strict=True):
        truth = subsampled_laplace_divergence(q, b, a)
        assert v >= truth * (1 - 1e-12), (a, v, truth)  # an upper bound
        if a == int(a):  # capped by the mechanism itself at integer orders
            assert v <= e * (1 + 1e-12)


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (256 / 60000, 1.1), (0.5, 0.5), (0.1, 4.0)])
def test_generic_amplification_on_gaussian_is_above_exact_and_close(q: float, sigma: float) -> None:
    orders = np.array([2.0, 3.0, 4.0, 10.0, 32.0, 2.5])
    generic = poisson_subsampled_rdp(lambda a: a / (2 * sigma**2), q, orders)
    exact = poisson_subsampled_gaussian_rdp(q, sigma, orders)
    assert (generic >= exact * (1 - 1e-12)).all()
    assert generic[0] == pytest.approx(exact[0], rel=1e-12)  # alpha = 2: same terms
    # The factor 3 on the l >= 3 terms: A_generic <= 3 A_exact at integer orders.
    ints = orders[:-1]
    assert (generic[:-1] <= exact[:-1] + math.log(3) / (ints - 1) + 1e-12).all()
    assert (generic <= orders / (2 * sigma**2) * (1 + 1e-12)).all()


def test_generic_amplification_edges_and_bad_input() -> None:
    fn = _laplace_rdp(1.0)
    assert (poisson_subsampled_rdp(fn, 0.0, [2.0, 3.0]) == 0).all()
    assert poisson_subsampled_rdp(fn, 0.1, [math.inf])[0] == math.inf
    assert poisson_subsampled_rdp(lambda a: np.full(len(a), np.inf), 0.1, [2.0])[0] == math.inf
    with pytest.raises(PrivacyParameterError, match="rdp_fn"):
        poisson_subsampled_rdp(lambda a: np.full(len(a), np.nan), 0.1, [2.0])
    with pytest.raises(PrivacyParameterError, match="rdp_fn"):
        poisson_subsampled_rdp(lambda a: -np.ones(len(a)), 0.1, [2.0])
    with pytest.raises(PrivacyParameterError, match="sampling_rate"):
        poisson_subsampled_rdp(fn, 1.1, [2.0])
    with pytest.raises(PrivacyParameterError, match="orders"):
        poisson_subsampled_rdp(fn, 0.1, [0.9])
