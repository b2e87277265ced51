"""Attacks on every release path of issue #12: the low-bits test and a trained distinguisher
on floating-point features (lowest set bit, exponent, precision), set chosen on a training
split and the epsilon bound computed on a held-out split with Clopper-Pearson
(:func:`renyi.audit.audit_mechanism`, all attacks, Bonferroni over them).

False-alarm rate: each "bound <= claim" assertion fails with probability at most
``1 - CONFIDENCE = 1e-3`` when the claim is true (the bound is a lower bound at that
confidence). The planted bugs (textbook ``x + numpy.random.normal`` and the Box-Muller floats
renyi released before) must be caught by the same test at the same confidence.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from renyi.audit import audit_mechanism
from renyi.audit.paths import release_path
from renyi.errors import InsecureRandomnessWarning

CONFIDENCE = 0.999
VECTOR_TRIALS = 20_000  # one vectorised call per input
SCALAR_TRIALS = 1_000  # one call of the public function per release (about 2 ms each)


def _audit(name: str, trials: int, **kw):
    mech, x0, x1, claim, delta, desc = release_path(name, **kw)
    r = audit_mechanism(
        mech, x0, x1, trials=trials, claimed_epsilon=claim, delta=delta, confidence=CONFIDENCE
    )
    return r, claim, desc


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dpsgd_noisy_gradient_leaks_no_more_than_claimed(dtype):
    pytest.importorskip("torch")
    r, claim, desc = _audit("dpsgd-noise", VECTOR_TRIALS, dtype=dtype)
    assert {a.attack for a in r.attacks} >= {"lowbits", "features"}
    assert r.epsilon_lower <= claim, (desc, r.best.attack, r.epsilon_lower)
    # the floating-point attacks in particular find (almost) nothing
    fp = max(a.epsilon for a in r.attacks if a.attack in ("lowbits", "features"))
    assert fp <= 0.5 * claim


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("central-mean", {"k": 1}),
        ("central-mean", {"k": 10}),
        ("local-mean", {"k": 1}),
        ("fedavg", {}),
    ],
)
def test_federated_release_paths_leak_no_more_than_claimed(name, kw):
    r, claim, desc = _audit(name, SCALAR_TRIALS, **kw)
    assert r.epsilon_lower <= claim, (desc, r.best.attack, r.epsilon_lower)


@pytest.mark.parametrize("name", ["laplace", "discrete-laplace"])
def test_laplace_mechanisms_output_leaks_no_more_than_claimed(name):
    from renyi.audit.blackbox import vectorised
    from renyi.mechanisms import DiscreteLaplaceMechanism, LaplaceMechanism

    if name == "laplace":
        mech = vectorised(lambda n: LaplaceMechanism(1.0, 1.0, dimension=n))
        claim = LaplaceMechanism(1.0, 1.0).pure_epsilon
        x0, x1 = 0.0, 1.0
    else:
        mech = vectorised(lambda n: DiscreteLaplaceMechanism(1, 1, dimension=n))
        claim = DiscreteLaplaceMechanism(1, 1).pure_epsilon
        x0, x1 = 0, 1
    r = audit_mechanism(
        mech, x0, x1, trials=VECTOR_TRIALS, claimed_epsilon=claim, confidence=CONFIDENCE
    )
    assert r.epsilon_lower <= claim, (name, r.best.attack, r.epsilon_lower)


@pytest.mark.parametrize("bug", ["numpy-normal", "box-muller"])
def test_planted_bugs_are_caught_by_the_same_test(bug):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        r, claim, desc = _audit(bug, VECTOR_TRIALS)
    assert r.epsilon_lower > claim, (desc, r.epsilon_lower)
    assert r.best.attack in ("lowbits", "features")


def test_features_attack_alone_separates_the_box_muller_leak_from_the_lattice():
    """The trained feature distinguisher on its own (not only the fixed low-bits cells):
    far above the lattice release's bound on the Box-Muller floats, at the same sample size."""
    from renyi import noise
    from renyi.audit import audit_samples
    from renyi.random import get_source

    n = VECTOR_TRIALS
    kw = dict(claimed_epsilon=4.38, delta=1e-5, confidence=CONFIDENCE, attacks=["features"])
    src = get_source(None)
    leaky = audit_samples(src.normal(n), 1.0 + src.normal(n), **kw)
    safe = audit_samples(noise.gaussian(np.zeros(n), 1.0), noise.gaussian(np.ones(n), 1.0), **kw)
    assert leaky.epsilon_lower > 3.0 > 2.0 > safe.epsilon_lower
