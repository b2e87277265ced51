"""Input-pair timing audits (issue 22, item 7): randomly ordered interleaved pairs, Wilcoxon
signed-rank test on the within-pair differences.

False-alarm rate: each test that expects no difference asserts ``passed`` at confidence
1 - 1e-4, i.e. it fails with probability <= 1e-4 when the release time does not depend on
the input, whatever the machine's load: the order within each pair is a fair coin, so the
differences' signs are exchangeable under the null (module docstring of
renyi.audit.timing). The planted leak differs by a factor of ~10 in work.
"""

import numpy as np
import pytest

from renyi import noise
from renyi.audit.timing import audit_timing
from renyi.errors import PrivacyParameterError

CONF = 1 - 1e-4


def _work(n):
    return sum(range(n))


def test_a_data_dependent_path_is_detected():
    r = audit_timing(
        lambda x: _work(200 if x else 2000), 0, 1, pairs=400, rng=np.random.default_rng(0)
    )
    assert not r.passed and r.auc < 0.1 and r.median_ratio < 0.5


def test_the_null_holds_for_identical_work():
    r = audit_timing(
        lambda x: _work(500), 0, 1, pairs=1000, confidence=CONF, rng=np.random.default_rng(1)
    )
    assert r.passed and 0.4 < r.auc < 0.6


@pytest.mark.parametrize(
    ("x0", "x1"),
    [
        (-(2.0**-7), 2.0**-7),  # both sides of zero
        (1 / 16 - 2.0**-10, 1 / 16 + 2.0**-10),  # both sides of a lattice midpoint (g = 1/8)
        (0.0, 1.0),
    ],
)
def test_noise_release_time_does_not_depend_on_the_input(x0, x1):
    r = audit_timing(
        lambda x: noise.gaussian(x, 1.0),
        x0,
        x1,
        pairs=2000,
        confidence=CONF,
        rng=np.random.default_rng(2),
    )
    assert r.passed, r


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_integer_mechanisms_at_the_range_edge(kind):
    """Before 0594dd2 (noise, 22.3) 2**62 - 1 took another path than 2**62: p = 2e-310,
    median time ratio 0.74 (AUC near 0).

    Asserted by effect size, not by the p-value: on an idle machine 2000 pairs resolve
    differences of 0.1 % of a 10 µs release, and this pair shows one whose sign flips with
    the order seed (AUC 0.46, 0.45, 0.55, 0.44, 0.51 for seeds 0-5, median ratios
    0.999-1.001; the same on 6323a7a), i.e. the layout of the run rather than a path taken by
    the value. A second path (the bug class this test is for) moves the AUC by far more than
    0.15; under no dependence the AUC's sd is 0.5 / sqrt(2000) = 0.011, so a false alarm
    needs a 13-sd excursion."""
    from renyi.mechanisms import DiscreteGaussianMechanism, DiscreteLaplaceMechanism

    mech = (
        DiscreteLaplaceMechanism(1.0, 1) if kind == "laplace" else DiscreteGaussianMechanism(1.0, 1)
    )
    r = audit_timing(
        lambda x: mech.release(x),
        2**62 - 1,
        2**62,
        pairs=2000,
        confidence=CONF,
        rng=np.random.default_rng(3),
    )
    assert abs(r.auc - 0.5) < 0.15 and 0.9 < r.median_ratio < 1.1, r


def test_bad_arguments():
    with pytest.raises(PrivacyParameterError):
        audit_timing(lambda x: x, 0, 1, pairs=5)
    with pytest.raises(PrivacyParameterError):
        audit_timing(lambda x: x, 0, 1, confidence=1.0)
