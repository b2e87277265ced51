"""Fixed-size sampling without replacement under add/remove neighbours (issue 16, item 1).

The analysis (``SampledWithoutReplacementEvent`` with an add/remove inner event) reduces to
the Poisson-subsampled pair at rate ``q = b/n`` and twice the sensitivity. References that do
not use that reduction: the exact output distributions of the worst-case dataset (the record
contributes +1, every other record -1, so the noisy batch sum is ``-b + 2·[record drawn] + Z``
with ``P[record drawn] = b/n`` by counting subsets), integrated by quadrature, and a Monte
Carlo draw of actual fixed-size batches from that dataset.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import laplace, norm

from renyi.accountants import ApproxDpAccountant, PldAccountant, RdpAccountant, ZcdpAccountant
from renyi.cli.main import main
from renyi.errors import PrivacyParameterError
from renyi.events import (
    GaussianEvent,
    LaplaceEvent,
    Neighbouring,
    SampledWithoutReplacementEvent,
    training_event,
)


def _exact_pair(n: int, b: int, sigma: float):
    """Densities of the noisy batch sum on the worst-case dataset (with / without the record)."""
    q = math.comb(n - 1, b - 1) / math.comb(n, b)  # batches of the n-record set holding it

    def with_record(x):
        return (1 - q) * norm.pdf(x, -b, sigma) + q * norm.pdf(x, -b + 2, sigma)

    def without(x):
        return norm.pdf(x, -b, sigma)

    return q, with_record, without


def _hockey(p, q, eps: float, lo: float, hi: float) -> float:
    val, _ = integrate.quad(
        lambda x: max(p(x) - math.exp(eps) * q(x), 0.0), lo, hi, limit=400, epsabs=1e-14
    )
    return val


@pytest.mark.parametrize("n, b, sigma", [(10, 3, 1.0), (50, 5, 0.7), (1000, 32, 2.0)])
def test_one_step_pld_is_tight_against_the_worst_case_dataset(n, b, sigma):
    q, p1, p0 = _exact_pair(n, b, sigma)
    assert q == pytest.approx(b / n)
    event = SampledWithoutReplacementEvent(n, b, GaussianEvent(sigma))
    assert event.neighbouring is Neighbouring.ADD_REMOVE
    acc = PldAccountant(value_discretization_interval=1e-4).compose(event)
    lo, hi = -b - 12 * sigma, -b + 2 + 12 * sigma
    for eps in (0.1, 0.5, 1.0, 2.0):
        exact = max(_hockey(p1, p0, eps, lo, hi), _hockey(p0, p1, eps, lo, hi))
        got = acc.delta(eps).delta
        assert got >= exact - 1e-12  # an upper bound ...
        assert got <= exact * (1 + 2e-3) + 1e-10  # ... attained by this dataset


@pytest.mark.parametrize("alpha", [2.0, 3.0, 5.0, 8.0])
def test_rdp_is_the_exact_divergence_of_the_worst_case_dataset(alpha):
    n, b, sigma = 40, 4, 1.2
    q = b / n

    def log_with(x):
        return np.logaddexp(
            math.log1p(-q) + norm.logpdf(x, -b, sigma), math.log(q) + norm.logpdf(x, -b + 2, sigma)
        )

    def log_without(x):
        return norm.logpdf(x, -b, sigma)

    lo, hi = -b - 30 * sigma, -b + 2 + 30 * sigma
    both = []
    for la, lc in ((log_with, log_without), (log_without, log_with)):
        m, _ = integrate.quad(
            lambda x, la=la, lc=lc: math.exp(alpha * la(x) + (1 - alpha) * lc(x)),
            lo,
            hi,
            limit=400,
        )
        both.append(math.log(m) / (alpha - 1))
    event = SampledWithoutReplacementEvent(n, b, GaussianEvent(sigma))
    got = float(event.rdp_epsilons(np.array([alpha]))[0])
    assert got >= max(both) * (1 - 1e-9)
    assert got <= max(both) * (1 + 1e-6)


def test_monte_carlo_of_real_fixed_size_batches_matches_the_pair():
    """Draw real fixed-size batches (uniform b-subsets) from the worst-case dataset: the
    record's inclusion frequency is the rate the analysis uses."""
    n, b, draws = 30, 7, 200_000
    rng = np.random.default_rng(11)
    keys = rng.random((draws, n))
    batches = np.argpartition(keys, b, axis=1)[:, :b]  # a uniform b-subset per row
    freq = float(np.mean(np.any(batches == 0, axis=1)))
    se = math.sqrt(b / n * (1 - b / n) / draws)
    assert abs(freq - b / n) < 5 * se


def test_both_relations_and_the_accountants():
    n, b, s = 60000, 256, 1.1
    ar = training_event(
        "fixed-size", s, dataset_size=n, batch_size=b, steps=1000, neighbouring="add_remove"
    )
    ro = training_event("fixed-size", s, dataset_size=n, batch_size=b, steps=1000)
    assert (
        ar.neighbouring is Neighbouring.ADD_REMOVE and ro.neighbouring is Neighbouring.REPLACE_ONE
    )
    e_ar = PldAccountant().compose(ar).epsilon(1e-5).epsilon
    e_ro = PldAccountant().compose(ro).epsilon(1e-5).epsilon
    r_ar = RdpAccountant().compose(ar).epsilon(1e-5).epsilon
    assert 0 < e_ar <= r_ar and 0 < e_ro
    # zCDP: no amplification, and the coupled records are two add/remove steps apart
    assert ZcdpAccountant().compose(ar).rho == pytest.approx(1000 * 4 / (2 * s * s))
    with pytest.raises(PrivacyParameterError, match="neighbouring"):
        training_event(
            "shuffle", s, dataset_size=n, batch_size=b, steps=10, neighbouring="add_remove"
        )
    with pytest.raises(PrivacyParameterError, match="neighbouring"):
        training_event("fixed-size", s, dataset_size=n, batch_size=b, steps=10, neighbouring="x")


def test_approx_dp_of_an_add_remove_laplace_holds_on_the_worst_case_dataset():
    n, b, scale = 20, 4, 1.0  # Laplace of scale 1 on a sum with add/remove sensitivity 1
    event = SampledWithoutReplacementEvent(n, b, LaplaceEvent(scale))
    res = ApproxDpAccountant().compose(event)
    eps = res.epsilon(1e-6).epsilon
    q = b / n

    def p1(x):
        return (1 - q) * laplace.pdf(x, -b, scale) + q * laplace.pdf(x, -b + 2, scale)

    def p0(x):
        return laplace.pdf(x, -b, scale)

    lo, hi = -b - 60, -b + 62
    exact = max(_hockey(p1, p0, eps, lo, hi), _hockey(p0, p1, eps, lo, hi))
    assert exact <= 1e-6 + 1e-12
    assert eps <= 2.0  # amplified well below the group-2 value 2/scale


def test_cli_neighbouring_flag(capsys: pytest.CaptureFixture[str]):
    base = ["epsilon", "--noise-multiplier", "1.1", "--delta", "1e-5", "--json"]
    data = ["--sampling", "fixed-size", "--dataset-size", "60000", "--batch-size", "256"]
    assert main([*base, *data, "--steps", "100", "--neighbouring", "add-remove"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["neighbouring"] == "add_remove" and out["epsilon"] > 0
    assert main([*base, *data, "--steps", "100"]) == 0
    assert json.loads(capsys.readouterr().out)["neighbouring"] == "replace_one"
    shuffle = ["--sampling", "shuffle", "--dataset-size", "600", "--batch-size", "60"]
    assert main([*base, *shuffle, "--steps", "10", "--neighbouring", "add-remove"]) == 2
    assert "neighbouring" in capsys.readouterr().err
