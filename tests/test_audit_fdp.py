"""The one-run f-DP test of Mahloujifar, Melis & Chaudhuri (renyi.audit.fdp).

Oracle: jax_privacy's implementation of the same procedure (``epsilon_one_run_fdp``, which
reports the epsilon at delta of the refuted Gaussian curve). Validity: a Monte Carlo of the
false-alarm rate on the Gaussian mechanism itself. Seeds are fixed.
"""

import math
import warnings

import numpy as np
import pytest

from renyi.analysis.closed_forms import gaussian_epsilon
from renyi.audit.fdp import (
    curve_inverse_tradeoff,
    fdp_refutes,
    gaussian_inverse_tradeoff,
    gdp_epsilon_lower_bound,
    gdp_mu_lower_bound,
    gdp_samples_mu_lower_bound,
)
from renyi.errors import PrivacyParameterError
from renyi.tradeoff import gaussian_tradeoff_tpr

# three settings in the default suite, the rest with `make test-slow`
GRID = [
    (1000, 100, 100, 1e-5),
    (1000, 200, 160, 1e-3),
    (1000, 10, 10, 1e-5),
    *[
        pytest.param(m, k, c, d, marks=pytest.mark.slow)
        for m, k, c in [(1000, 100, 90), (5000, 500, 450), (1000, 100, 100), (1000, 10, 10)]
        for d in (1e-5, 1e-3)
    ],
]


@pytest.mark.parametrize(("m", "k", "c", "delta"), GRID)
def test_matches_jax_privacy(m, k, c, delta):
    auditing = pytest.importorskip("jax_privacy.auditing")
    dp_accounting = pytest.importorskip("dp_accounting")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = auditing._epsilon_one_run_fdp(0.0, m, k, c, 0.05, delta)
    ours = gdp_epsilon_lower_bound(m, k, c, delta, confidence=0.95)
    assert ours <= theirs + 1e-6  # ours is rounded down
    assert ours == pytest.approx(theirs, abs=2e-5)
    mu = gdp_mu_lower_bound(m, k, c, confidence=0.95)
    assert mu == pytest.approx(1.0 / dp_accounting.get_sigma_gaussian(theirs, delta), rel=1e-4)


def test_refutation_is_monotone_in_mu_and_correct_guesses():
    mus = np.linspace(0.0, 3.0, 31)
    refuted = [fdp_refutes(2000, 200, 180, gaussian_inverse_tradeoff(mu)) for mu in mus]
    # once a curve stands, every more permissive one stands too
    assert refuted == sorted(refuted, reverse=True)
    assert refuted[0] and not refuted[-1]
    bounds = [gdp_mu_lower_bound(2000, 200, c) for c in range(100, 201, 20)]
    assert bounds == sorted(bounds) and bounds[0] == 0.0


def test_false_alarm_rate_on_the_gaussian_mechanism():
    """mu = 1 GDP exactly (one Gaussian step, Dirac canaries): over 300 seeded one-run audits
    at confidence 0.9 the bound may exceed mu = 1 in at most 10% of runs. With 300 runs the
    count exceeds 51 with probability < 1e-4 when the true rate is 0.1 (binomial tail): the
    test's false-alarm rate."""
    from scipy import stats

    gen = np.random.default_rng(0)
    over = 0
    for _ in range(300):
        inc = gen.random(500) < 0.5
        scores = inc + gen.normal(size=500)
        order = np.argsort(-scores)
        k = 50
        c = int(inc[order[:k]].sum())
        if gdp_mu_lower_bound(500, k, c, confidence=0.9) > 1.0:
            over += 1
    assert stats.binom.sf(51, 300, 0.1) < 1e-4
    assert over <= 51


def test_tight_enough_to_refute_a_weaker_claim():
    """mu = 3 canaries (a bug) refute the claim mu = 1 with 1000 canaries."""
    gen = np.random.default_rng(1)
    inc = gen.random(1000) < 0.5
    scores = 3.0 * inc + gen.normal(size=1000)
    order = np.argsort(-scores)
    c = int(inc[order[:200]].sum())
    assert fdp_refutes(1000, 200, c, gaussian_inverse_tradeoff(1.0), confidence=0.999)
    assert gdp_mu_lower_bound(1000, 200, c, confidence=0.999) > 1.0


def test_curve_inverse_is_on_the_safe_side_of_the_exact_one():
    grid = np.geomspace(1e-6, 1.0, 300)
    f_inv = curve_inverse_tradeoff(grid, gaussian_tradeoff_tpr(1.0, grid))
    exact = gaussian_inverse_tradeoff(1.0)
    for x in np.linspace(0.01, 0.99, 40):
        assert f_inv(float(x)) <= exact(float(x)) + 1e-12
    # so a test against the gridded curve never refutes what the exact curve lets stand
    for c in range(60, 101, 5):
        if fdp_refutes(1000, 100, c, f_inv):
            assert fdp_refutes(1000, 100, c, exact)


def test_epsilon_is_the_gaussian_epsilon_of_mu():
    mu = gdp_mu_lower_bound(1000, 100, 100)
    eps = gdp_epsilon_lower_bound(1000, 100, 100, 1e-5)
    assert eps < gaussian_epsilon(mu, 1e-5) and eps == pytest.approx(gaussian_epsilon(mu, 1e-5))
    assert math.isfinite(eps)


@pytest.mark.parametrize(
    "call",
    [
        lambda: fdp_refutes(10, 11, 1, gaussian_inverse_tradeoff(1.0)),
        lambda: fdp_refutes(10, 5, 6, gaussian_inverse_tradeoff(1.0)),
        lambda: fdp_refutes(10, 5, 3, gaussian_inverse_tradeoff(1.0), confidence=1.0),
        lambda: gaussian_inverse_tradeoff(-1.0),
        lambda: curve_inverse_tradeoff([0.5, 0.1], [0.6, 0.2]),
        lambda: curve_inverse_tradeoff([0.1, 0.5], [0.2, 1.5]),
        lambda: gdp_epsilon_lower_bound(10, 5, 5, 0.0),
    ],
)
def test_bad_arguments_are_refused(call):
    with pytest.raises(PrivacyParameterError):
        call()


def test_gdp_test_of_independent_releases_is_valid_and_powerful():
    """gdp_samples_mu_lower_bound (held-out review: the releases audit had no mu-GDP test, so
    clipping at 2C or half the noise at every other step passed the gate).

    Validity: 200 audits of an exact 0.25-GDP pair (N(0, 16) vs N(1, 16), 3,000 releases a
    side) at confidence 0.9 may refute mu = 0.25 in at most 10 % of them in expectation;
    more than 35 refutations has probability < 1e-3 (Binomial(200, 0.1)), seeded. Power: a
    0.5-GDP pair (the sensitivity doubled) on the lattice 1/8 is refuted at mu = 0.25 by 8,000
    releases a side at confidence 0.999, where the (epsilon, delta = 1e-3) bound stays below
    the claim 0.592.
    """
    from renyi.audit.blackbox import audit_samples

    gen = np.random.default_rng(27)
    refuted = sum(
        gdp_samples_mu_lower_bound(4 * gen.normal(size=3000), 1 + 4 * gen.normal(size=3000), 0.9)[0]
        > 0.25
        for _ in range(200)
    )
    assert refuted <= 35
    y0 = np.round(32 * gen.normal(size=8000)) / 8
    y1 = np.round(16 + 32 * gen.normal(size=8000)) / 8
    mu, how = gdp_samples_mu_lower_bound(y0, y1, 0.999)
    assert mu > 0.25 and how["tpr_low"] > how["fpr_high"]
    claim = float(gaussian_epsilon(0.25, 1e-3))
    eps = audit_samples(
        y0, y1, claimed_epsilon=claim, delta=1e-3, confidence=0.999, attacks=["threshold"]
    )
    assert eps.epsilon_lower < claim
    with pytest.raises(PrivacyParameterError, match="y0/y1"):
        gdp_samples_mu_lower_bound([0.0] * 3, [1.0] * 3)
