"""Every accountant input is used or refused (issue 30, item 3).

Extreme noise multipliers give a valid ``inf`` / ``0`` or our own error, never a raw
``ZeroDivisionError`` / ``OverflowError``; options that the chosen form would ignore are
refused with a message naming both; the trade-off helpers validate like the rest of the API.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

import renyi
from renyi.analysis.allocation import allocation_delta_monte_carlo
from renyi.analysis.events import GaussianEvent, PoissonSampledEvent, training_event
from renyi.cli.main import main
from renyi.errors import PrivacyParameterError
from renyi.tradeoff import gaussian_tradeoff_tpr, gdp_mu, tpr_from_profile, tradeoff_curve

SAMPLERS = ("poisson", "truncated-poisson", "fixed-size", "random-allocation", "shuffle")


def _report(sigma: float, sampling: str | None) -> renyi.accountants.EpsilonReport:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if sampling is None:
            return renyi.epsilon(noise_multiplier=sigma, sample_rate=0.01, steps=10, delta=1e-5)
        return renyi.epsilon(
            noise_multiplier=sigma,
            sampling=sampling,
            dataset_size=1000,
            batch_size=10,
            steps=100,
            delta=1e-5,
        )


@pytest.mark.parametrize("sampling", [None, *SAMPLERS])
@pytest.mark.parametrize(("sigma", "want"), [(1e-300, math.inf), (1e-200, math.inf), (1e300, 0.0)])
def test_extreme_noise_gives_a_valid_inf_or_zero(sigma, want, sampling):
    """sigma = 1e-300: sigma^2 underflows (zCDP's 0.5 / sigma^2 was a ZeroDivisionError);
    sigma = 1e300: 2 sigma^2 overflows (OverflowError in the RDP of fixed-size and
    truncated-Poisson sampling, NaN masses in their PLDs). With q = 0.01 and no noise no
    finite epsilon reaches delta = 1e-5; with sigma = 1e300 delta(0) = TV < 1e-5, so 0."""
    rep = _report(sigma, sampling)
    assert {r.accountant for r in rep.results} >= {"rdp", "zcdp", "pld"}, rep.unsupported
    for r in rep.results:
        assert r.epsilon == want, (r.accountant, r.epsilon)


def test_cli_extreme_noise_random_allocation_all_accountants(capsys):
    argv = ["epsilon", "--noise-multiplier", "1e300", "--sampling", "random-allocation"]
    argv += ["--accountant", "all", "--dataset-size", "1000", "--batch-size", "10"]
    argv += ["--steps", "100", "--delta", "1e-5", "--json"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    uppers = [r["epsilon"] for r in out["results"] if r["bound"] == "upper"]
    assert len(uppers) == 3 and all(e == 0.0 for e in uppers)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"sampling": None, "dataset_size": 1000, "batch_size": 10}, ("dataset_size", "sampling")),
        ({"dataset_size": 1000}, ("dataset_size", "sampling")),
        ({"batch_size": 10, "sample_rate": 0.01}, ("batch_size", "sampling")),
        (
            {"sampling": "poisson", "dataset_size": 1000, "batch_size": 10, "sample_rate": 0.5},
            ("sample_rate", "sampling"),
        ),
    ],
)
def test_renyi_epsilon_refuses_ignored_sizes(kwargs, names):
    """renyi.epsilon(sampling=None, dataset_size=1000, batch_size=10) used to account q = 1
    (epsilon 79) with the sizes silently dropped."""
    with pytest.raises(PrivacyParameterError) as err:
        renyi.epsilon(noise_multiplier=1.0, steps=10, delta=1e-5, **kwargs)
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize(
    "kwargs",
    [{"noise_multiplier": 1.0}, {"steps": 5}, {"sample_rate": 0.1}, {"sampling": "poisson"}],
)
def test_renyi_epsilon_refuses_arguments_beside_an_event(kwargs):
    event = PoissonSampledEvent(0.01, GaussianEvent(1.0))
    (name,) = kwargs
    with pytest.raises(PrivacyParameterError, match=f"{name}=.*event"):
        renyi.epsilon(event, delta=1e-5, **kwargs)


def test_renyi_epsilon_keeps_its_forms():
    a = renyi.epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=100, delta=1e-5)
    b = renyi.epsilon(
        training_event("poisson", 1.0, dataset_size=1000, batch_size=10, steps=100), delta=1e-5
    )
    c = renyi.epsilon(
        noise_multiplier=1.0,
        sampling="poisson",
        dataset_size=1000,
        batch_size=10,
        steps=100,
        delta=1e-5,
    )
    assert a.epsilon == b.epsilon == c.epsilon
    one = renyi.epsilon(noise_multiplier=2.0, delta=1e-5)  # the defaults: q = 1, T = 1
    same = renyi.epsilon(noise_multiplier=2.0, sample_rate=1.0, steps=1, delta=1e-5)
    assert one.epsilon == same.epsilon == renyi.epsilon(GaussianEvent(2.0), delta=1e-5).epsilon


# ------------------------------------------------------------------ trade-off helpers


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: gaussian_tradeoff_tpr(-1, [0.1]), "mu"),
        (lambda: gaussian_tradeoff_tpr(float("nan"), [0.1]), "mu"),
        (lambda: gaussian_tradeoff_tpr(1.0, [1.5]), "fpr"),
        (lambda: gaussian_tradeoff_tpr(1.0, [float("nan")]), "fpr"),
        (lambda: tpr_from_profile([1.0, 2.0], [1e-5], [0.1]), "deltas"),
        (lambda: tpr_from_profile([1.0], [1e-5], [-0.1]), "fpr"),
        (lambda: tpr_from_profile([1.0], [float("nan")], [0.1]), "deltas"),
        (lambda: tpr_from_profile([[1.0]], [[1e-5]], [0.1]), "epsilons"),
        (lambda: tradeoff_curve("pld"), "accountant"),
        (lambda: gdp_mu("rdp"), "accountant"),
    ],
)
def test_tradeoff_helpers_validate(call, name):
    """Before: numbers for mu = -1 and FPR = 1.5, NaN for mu = NaN, one delta broadcast over
    every epsilon, AttributeError for an accountant's name."""
    with pytest.raises(PrivacyParameterError, match=f"^{name}="):
        call()


def test_tradeoff_helpers_still_compute():
    tpr = gaussian_tradeoff_tpr(1.0, np.array([0.0, 0.05, 1.0]))
    assert tpr[0] == 0.0 and tpr[2] == 1.0 and 0.05 < tpr[1] < 1.0
    assert np.all(gaussian_tradeoff_tpr(math.inf, [0.0, 0.3]) == 1.0)
    assert gaussian_tradeoff_tpr(0.0, 0.3) == pytest.approx(0.3)
    got = tpr_from_profile([1.0, 2.0], [1e-5, 1e-6], [0.01])
    assert got[0] == pytest.approx(min(1e-5 + math.e * 0.01, 1e-6 + math.e**2 * 0.01))


# ------------------------------------------------------------------ other inputs


@pytest.mark.parametrize("eps", [float("nan"), -1.0, "1"])
def test_allocation_monte_carlo_refuses_bad_epsilon(eps):
    """allocation_delta_monte_carlo(5, 1, nan) returned (0, 0, 0)."""
    with pytest.raises(PrivacyParameterError, match=r"^epsilon="):
        allocation_delta_monte_carlo(5, 1.0, eps, samples=10)


def test_allocation_monte_carlo_extreme_epsilon_and_confidence():
    rng = np.random.default_rng(0)
    assert allocation_delta_monte_carlo(5, 1.0, 1e3, samples=50, rng=rng) == (0.0, 0.0, 0.0)
    assert allocation_delta_monte_carlo(5, 1.0, math.inf, samples=50, rng=rng)[0] == 0.0
    with pytest.raises(PrivacyParameterError, match=r"^confidence="):
        allocation_delta_monte_carlo(5, 1.0, 0.5, samples=10, confidence=1.5)


def test_truncated_poisson_cap_below_the_batch_is_refused():
    with pytest.raises(PrivacyParameterError, match=r"max_batch_size=9 .*batch_size=10"):
        training_event(
            "truncated-poisson", 1.0, dataset_size=1000, batch_size=10, steps=5, max_batch_size=9
        )
    ok = training_event(
        "truncated-poisson", 1.0, dataset_size=1000, batch_size=10, steps=5, max_batch_size=10
    )
    assert ok.event.max_batch_size == 10
