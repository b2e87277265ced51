"""The planted-bug catalogue (issue 27, item 3): every bug is caught by the same audit, at the
same confidence (0.999: false-alarm probability <= 1e-3 per audit), as the correct paths of
tests/test_audit_training.py. Seeded, so deterministic.

Two entries are defects found in renyi itself (the ``-0.0`` release of issue 22 and the
capture's mean assumption under a class-weighted / token-mean loss of issue 27): on main
before their fixes the real paths fail the audit the same way (see the xfail markers of
tests/test_audit_training.py); these planted copies keep the audit tested after the fixes.
"""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from renyi.audit import harness  # noqa: E402
from renyi.audit.planted import NOT_CAUGHT, PLANTED, MeanAssumingCapture, plant  # noqa: E402
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        yield


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_every_planted_bug_is_caught(name):
    bug = PLANTED[name]
    r = bug.audit(seed=0)
    assert r.confidence == 0.999
    assert not r.passed, (name, r.epsilon_lower_bound, r.epsilon_claimed)
    # refuted as (epsilon, delta), or (for a Gaussian claim) as mu-GDP
    assert r.epsilon_lower_bound > r.epsilon_claimed or (
        r.fdp_claim_refuted and r.mu_lower_bound > r.details["sigma"] ** -1
    )


def test_the_catalogue_has_the_bugs_of_the_issue():
    wanted = {
        "clip-skip-layer",
        "noise-over-batch-twice",
        "realised-batch-size",
        "batch-weight-loss",
        "sampler-rate",
        "noise-reused",
        "negative-zero",
        "residue",
        "capture-mean-class-weighted",
        "capture-mean-ignore-index",
    }
    assert wanted <= set(PLANTED)
    for bug in PLANTED.values():
        assert bug.description and bug.origin and bug.caught_by
    # the bugs the audit cannot catch are listed, each with why
    assert NOT_CAUGHT and not set(NOT_CAUGHT) & set(PLANTED)
    assert all(len(why) > 40 for why in NOT_CAUGHT.values())


def test_mean_assuming_capture_is_a_faithful_copy_where_the_assumption_holds():
    """With a plain mean loss the planted capture gives renyi's capture's clipped sums: the
    planted bug is the assumption, not a different engine."""
    from renyi.dpsgd.capture import PerExampleCapture

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    x, y = torch.randn(9, 5), torch.randint(0, 3, (9,))
    ours = PerExampleCapture(model, max_grad_norm=0.5)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    s1, n1, _ = ours.pop_clipped_sum()
    ours.remove()
    planted = MeanAssumingCapture(model, max_grad_norm=0.5)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    s2, n2, _ = planted.pop_clipped_sum()
    planted.remove()
    assert n1 == n2 == 9
    for name in s1:
        torch.testing.assert_close(s1[name], s2[name], rtol=1e-5, atol=1e-6)


def test_plant_patches_a_ready_optimizer_and_refuses_the_others():
    from renyi.audit.harness import DiracTask, _dp_optimizer

    opt = _dp_optimizer(DiracTask().model(), torch.nn.CrossEntropyLoss(), 1.0, 1.0, 0)
    plant("negative-zero", opt)
    assert "release_noisy_sum" in vars(opt)
    with pytest.raises(PrivacyParameterError, match="harness"):
        plant("sampler-rate", opt)
    with pytest.raises(PrivacyParameterError):
        plant("no-such-bug", opt)


def test_a_planted_copy_does_not_leak_into_the_real_path():
    """Planting patches one optimizer instance: a fresh one is untouched."""
    r = harness.audit_sampler("poisson", seed=1)
    assert r.passed
    assert np.isfinite(r.epsilon_claimed)
