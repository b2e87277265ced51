"""Black-box auditor: correctness on known mechanisms, our mechanisms pass, planted bugs fail.

Seeds are fixed. "Passes" tests run at confidence 1 - 1e-4, so a correct mechanism fails
them with probability <= 1e-4 (the stated false-alarm rate). Coverage tests state theirs.
"""

import math
import warnings
import zlib

import numpy as np
import pytest
from scipy import stats

from renyi import noise
from renyi.audit.blackbox import (
    audit_mechanism,
    audit_samples,
    lowest_bit_exponent,
    vectorised,
)
from renyi.closed_forms import gaussian_epsilon, randomized_response_rdp
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError
from renyi.mechanisms import (
    DiscreteGaussianMechanism,
    DiscreteLaplaceMechanism,
    GaussianMechanism,
    LaplaceMechanism,
    RandomizedResponse,
)

CONF = 1 - 1e-4  # false-alarm probability of every "passes" test


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        yield


def rr(p):
    def run(x, size, rng):
        return np.where(rng.random(size) < p, x, 1 - x)

    return run


def ref_laplace(b):  # honest textbook Laplace (floating point): for threshold attacks only
    return lambda x, size, rng: x + rng.laplace(0.0, b, size)


def ref_gaussian(s):
    return lambda x, size, rng: x + rng.normal(0.0, s, size)


# ------------------------------------------------------------------ the auditor itself
def test_lowest_bit_exponent_against_exact_rationals():
    from fractions import Fraction

    rng = np.random.default_rng(0)
    y = np.concatenate([rng.normal(0, 10, 200), rng.laplace(0, 1e-300, 20), [5e-324, 2.0**1000]])
    j = lowest_bit_exponent(y)
    for v, e in zip(y.tolist(), j.tolist(), strict=True):
        f = Fraction(v) / Fraction(2) ** e  # v / 2**j must be an odd integer
        assert f.denominator == 1 and f.numerator % 2 == 1


def test_randomized_response_bound_converges_from_below():
    p = 0.75
    truth = math.log(p / (1 - p))
    lbs = []
    for n in (10_000, 100_000, 1_000_000):
        r = audit_mechanism(rr(p), 0, 1, trials=n, rng=np.random.default_rng(n))
        lbs.append(r.epsilon_lower)
    assert all(lb <= truth for lb in lbs)
    assert lbs[0] < lbs[2]
    assert lbs[2] >= 0.97 * truth  # 1e6 runs: within 3% of log 3


def test_randomized_response_bound_exceeds_truth_at_most_at_the_stated_rate():
    # 300 audits of RR (p = 0.8) with 1000 runs per input at 90% confidence: the number of
    # audits above the truth is dominated by Binomial(300, 0.1);
    # false alarm P[Bin(300, 0.1) > 52] < 1e-4.
    p = 0.8
    truth = math.log(p / (1 - p))
    rng = np.random.default_rng(3)
    lbs = np.array(
        [
            audit_mechanism(rr(p), 0, 1, trials=1000, confidence=0.9, rng=rng).epsilon_lower
            for _ in range(300)
        ]
    )
    assert stats.binom.sf(52, 300, 0.1) < 1e-4
    assert int((lbs > truth).sum()) <= 52
    assert np.median(lbs) > 0.5 * truth


def test_renyi_lower_bounds_of_randomized_response():
    p = 0.75
    orders = np.array([1.5, 2.0, 8.0, 32.0])
    claim = randomized_response_rdp(p, orders)
    r = audit_mechanism(
        rr(p),
        0,
        1,
        trials=200_000,
        orders=orders,
        claimed_rdp=claim,
        confidence=CONF,
        rng=np.random.default_rng(8),
    )
    assert r.rdp_passed
    assert np.all(r.rdp_lower <= claim) and np.all(r.rdp_lower >= 0.85 * claim)
    # a mechanism that tells the truth more often than it claims is caught at every order
    bad = audit_mechanism(
        rr(0.9),
        0,
        1,
        trials=200_000,
        orders=orders,
        claimed_rdp=claim,
        confidence=CONF,
        rng=np.random.default_rng(9),
    )
    assert bad.rdp_passed is False and np.all(bad.rdp_lower > claim)


def test_reference_laplace_and_gaussian_pass_their_textbook_claims():
    r = audit_mechanism(
        ref_laplace(1.0),
        0.0,
        1.0,
        trials=100_000,
        claimed_epsilon=1.0,
        confidence=CONF,
        attacks=["threshold", "histogram"],
        rng=np.random.default_rng(1),
    )
    assert r.passed and r.epsilon_lower > 0.85  # threshold sets reach ~1 at 1e5 runs
    delta = 1e-5
    claim = gaussian_epsilon(1.0, delta)  # exact analytic Gaussian, mu = 1
    g = audit_mechanism(
        ref_gaussian(1.0),
        0.0,
        1.0,
        trials=100_000,
        claimed_epsilon=claim,
        delta=delta,
        confidence=CONF,
        attacks=["threshold"],
        rng=np.random.default_rng(2),
    )
    assert g.passed and 1.0 < g.epsilon_lower < claim


def test_audit_samples_refuses_bad_input():
    y = np.zeros(10)
    with pytest.raises(PrivacyParameterError):
        audit_samples(y, y, attacks=["bogus"])
    with pytest.raises(PrivacyParameterError):
        audit_samples(y, y, confidence=1.5)
    with pytest.raises(PrivacyParameterError):
        audit_samples(y, np.array([np.nan] * 10))
    with pytest.raises(PrivacyParameterError):
        audit_samples(y, y, claimed_rdp=[1.0])
    with pytest.raises(PrivacyParameterError):
        audit_mechanism(lambda x, n, r: np.zeros(n + 1), 0, 1, trials=10)


# ------------------------------------------------------------------ our mechanisms pass
@pytest.mark.parametrize(
    ("name", "mech", "x1", "claim", "delta"),
    [
        (
            "laplace",
            vectorised(lambda d: LaplaceMechanism(1.0, 1.0, dimension=d)),
            1.0,
            LaplaceMechanism(1.0, 1.0).pure_epsilon,
            0.0,
        ),
        (
            "gaussian",
            vectorised(lambda d: GaussianMechanism(1.0, 1.0, dimension=d)),
            1.0,
            GaussianMechanism(1.0, 1.0).epsilon(1e-5),
            1e-5,
        ),
        (
            "discrete_laplace",
            vectorised(lambda d: DiscreteLaplaceMechanism(2.0, 1, dimension=d)),
            1,
            DiscreteLaplaceMechanism(2.0, 1).pure_epsilon,
            0.0,
        ),
        (
            "discrete_gaussian",
            vectorised(lambda d: DiscreteGaussianMechanism(4.0, 1, dimension=d)),
            1,
            DiscreteGaussianMechanism(4.0, 1).epsilon(1e-5),
            1e-5,
        ),
        (
            "randomized_response",
            lambda x, n, rng: RandomizedResponse(0.75).release(np.full(n, x, dtype=bool), rng=rng),
            True,
            RandomizedResponse(0.75).pure_epsilon,
            0.0,
        ),
    ],
)
def test_our_mechanisms_pass_every_attack(name, mech, x1, claim, delta):
    x0 = False if isinstance(x1, bool) else 0 * x1
    r = audit_mechanism(
        mech,
        x0,
        x1,
        trials=50_000,
        claimed_epsilon=claim,
        delta=delta,
        confidence=CONF,
        rng=np.random.default_rng(zlib.crc32(name.encode())),
    )
    assert r.passed, (name, r.epsilon_lower, claim)
    lowbits = next(a for a in r.attacks if a.attack == "lowbits")
    assert lowbits.epsilon <= claim


def test_our_laplace_audit_comes_close_to_its_claim():
    claim = LaplaceMechanism(1.0, 1.0).pure_epsilon
    r = audit_mechanism(
        vectorised(lambda d: LaplaceMechanism(1.0, 1.0, dimension=d)),
        0.0,
        1.0,
        trials=200_000,
        claimed_epsilon=claim,
        confidence=0.95,
        rng=np.random.default_rng(4),
    )
    assert r.passed and r.epsilon_lower > 0.9 * claim


# ------------------------------------------------------------------ planted bugs fail
# Power, not false alarms, is what these test: each bug's true epsilon is about twice the
# claim (or unbounded), and the seeded audit must reject the claim at confidence 1 - 1e-4.
def test_planted_bug_noise_scale_halved_is_caught():
    claim = LaplaceMechanism(1.0, 1.0).pure_epsilon  # what the code says
    buggy = vectorised(lambda d: LaplaceMechanism(0.5, 1.0, dimension=d))  # what it does
    r = audit_mechanism(
        buggy,
        0.0,
        1.0,
        trials=100_000,
        claimed_epsilon=claim,
        confidence=CONF,
        attacks=["threshold", "histogram"],
        rng=np.random.default_rng(12),
    )
    assert r.passed is False and r.epsilon_lower > 1.5


def test_planted_bug_sensitivity_misstated_is_caught():
    # calibrated for sensitivity 1, but the query moves by 2 between neighbours
    mech = LaplaceMechanism(1.0, 1.0)
    r = audit_mechanism(
        vectorised(lambda d: LaplaceMechanism(1.0, 1.0, dimension=d)),
        0.0,
        2.0,
        trials=100_000,
        claimed_epsilon=mech.pure_epsilon,
        confidence=CONF,
        attacks=["threshold", "histogram"],
        rng=np.random.default_rng(13),
    )
    assert r.passed is False and r.epsilon_lower > 1.5


def test_planted_bug_naive_float_laplace_is_caught_by_the_low_bits():
    # x + np.random.laplace(0, 1) is "1-DP" on paper; its low bits reveal x (Mironov 2012).
    r = audit_mechanism(
        ref_laplace(1.0),
        0.0,
        1.0,
        trials=50_000,
        claimed_epsilon=1.0,
        confidence=CONF,
        rng=np.random.default_rng(14),
    )
    assert r.passed is False
    assert r.best.attack in ("lowbits", "features") and r.epsilon_lower > 5.0
    threshold = next(a for a in r.attacks if a.attack == "threshold")
    assert threshold.epsilon <= 1.0  # the value-based attack alone would not have seen it


# ------------------------------------------------------------------ sign, bytes, residue
def _neg_zero_leak(x, size, rng):
    """Planted: a lattice release that keeps the sign of an input just below zero."""
    y = np.asarray(noise.gaussian(np.zeros(size), 1.0, rng=rng))
    return np.where((y == 0) & (x < 0), -0.0, y)


def test_the_sign_of_zero_is_attacked():
    # confidence 0.999: -0.0 in about 5% of the releases for x0 only is caught at 20000 runs
    r = audit_mechanism(
        _neg_zero_leak,
        -0.01,
        0.01,
        trials=20000,
        claimed_epsilon=1.0,
        delta=1e-5,
        confidence=0.999,
        rng=np.random.default_rng(0),
    )
    assert not r.passed and r.best.attack in ("signzero", "bytes")
    sign = next(a for a in r.attacks if a.attack == "signzero")
    assert sign.epsilon > 1.0  # the set "not -0.0" says x1, or its complement x0


def test_byte_patterns_tell_signed_zeros_apart():
    from renyi.audit.blackbox import byte_pattern

    b = byte_pattern([0.0, -0.0])
    assert b[0] != b[1]
    y0 = np.where(np.arange(4000) % 10 == 0, -0.0, 0.0)
    y1 = np.zeros(4000)
    r = audit_samples(y0, y1, attacks=["bytes", "histogram"], confidence=0.999)
    by = {a.attack: a.epsilon for a in r.attacks}
    assert by["bytes"] > 0.5 and by["histogram"] == 0.0  # numpy.unique merges the zeros


def test_the_residue_attack_needs_its_modulus():
    rng = np.random.default_rng(1)
    g = 0.125
    y0 = g * rng.integers(-50, 50, 4000)
    y1 = 0.01 + g * rng.integers(-50, 50, 4000)
    r = audit_samples(y0, y1, residue=(1.0, g), attacks=["threshold"], confidence=0.999)
    assert r.best.attack == "residue" and r.epsilon_lower > 5
    with pytest.raises(PrivacyParameterError):
        audit_samples(y0, y1, attacks=["residue"])
    with pytest.raises(PrivacyParameterError):
        audit_samples(y0, y1, residue=(1.0, -1.0))


def test_a_lattice_release_passes_the_new_attacks_at_the_midpoint():
    g = noise.lattice_step(1.0)

    def mech(x, size, rng):
        return noise.gaussian(np.full(size, x), 1.0, rng=rng)

    r = audit_mechanism(
        mech,
        g / 2 - g / 128,
        g / 2 + g / 128,
        trials=20000,
        claimed_epsilon=4.38,
        delta=1e-5,
        confidence=0.999,
        rng=np.random.default_rng(2),
        residue=(1.0, g),
    )
    assert r.passed
