"""Samplers and their accounting (issue 16): random allocation, truncated Poisson, shuffling,
the sampler objects that imply them, and the f-DP (trade-off) outputs.

References: brute-force multinomial moments and closed forms (exact), Monte Carlo with
confidence intervals (random allocation), dp_accounting's TruncatedSubsampledGaussianDpEvent,
the exact Gaussian trade-off function.
"""

from __future__ import annotations

import itertools
import json
import math
import warnings

import numpy as np
import pytest

from renyi.accountants import PldAccountant, RdpAccountant, epsilon_report
from renyi.allocation import (
    allocation_delta_monte_carlo,
    allocation_gaussian_rdp,
    allocation_rdp_add,
    allocation_rdp_remove,
    one_of_t_epsilon_lower_bound,
)
from renyi.cli.main import main
from renyi.errors import PrivacyParameterError, UnsupportedEventError
from renyi.events import (
    GaussianEvent,
    Neighbouring,
    PoissonSampledEvent,
    RandomAllocationEvent,
    SelfComposedEvent,
    ShuffledEvent,
    TruncatedPoissonSampledEvent,
    from_json,
    training_event,
)
from renyi.subsampling import poisson_subsampled_gaussian_rdp
from renyi.tradeoff import gaussian_tradeoff_tpr, gdp_mu, tpr_from_profile, tradeoff_curve

# ------------------------------------------------------------------ random allocation


def _brute_log_moment(t: int, sigma: float, alpha: int) -> float:
    """log E[(S/t)^α] by the multinomial expansion over all (j_1..j_t) summing to α."""
    total = 0.0
    for js in itertools.product(range(alpha + 1), repeat=t):
        if sum(js) != alpha:
            continue
        coef = math.factorial(alpha) / math.prod(math.factorial(j) for j in js)
        total += coef * math.prod(math.exp(j * (j - 1) / (2 * sigma**2)) for j in js)
    return math.log(total) - alpha * math.log(t)


@pytest.mark.parametrize(("t", "sigma"), [(2, 1.0), (3, 0.7), (4, 2.0)])
def test_allocation_remove_matches_brute_force_multinomial(t: int, sigma: float) -> None:
    orders = np.array([2.0, 3.0, 5.0, 7.0])
    got = allocation_rdp_remove(t, sigma, orders)
    want = [_brute_log_moment(t, sigma, int(a)) / (a - 1) for a in orders]
    np.testing.assert_allclose(got, np.minimum(want, orders / (2 * sigma**2)), rtol=1e-8)
    assert np.all(got >= np.minimum(want, orders / (2 * sigma**2)))


def test_allocation_one_step_is_the_gaussian() -> None:
    orders = np.array([1.5, 2.0, 3.0, 10.0, 40.0])
    gauss = orders / (2 * 1.3**2)  # capped by the exact Gaussian curve at every order
    for fn in (allocation_rdp_remove, allocation_rdp_add):
        np.testing.assert_allclose(fn(1, 1.3, orders), gauss, rtol=1e-8)


@pytest.mark.parametrize(("t", "sigma"), [(20, 1.0), (100, 0.8), (100, 1.5)])
def test_allocation_rdp_against_monte_carlo(t: int, sigma: float) -> None:
    """Both directions: the bound is not below the Monte Carlo 99.9% lower limit of the true
    divergence, and for t >= 100 within 25% of the estimate (tight, not just sound)."""
    rng = np.random.default_rng(20260)
    v = 1.0 / sigma**2
    n = 20_000
    ell = rng.normal(-0.5 * v, math.sqrt(v), size=(n, t))
    y = np.exp(ell).mean(axis=1)
    z = 3.29  # two-sided 99.9 %
    for alpha in (2, 3):
        for fn, samples in (
            (allocation_rdp_remove, y**alpha),
            (allocation_rdp_add, y ** (1 - alpha)),
        ):
            m, se = samples.mean(), samples.std(ddof=1) / math.sqrt(n)
            low = math.log(max(m - z * se, 1e-300)) / (alpha - 1)
            est = math.log(m) / (alpha - 1)
            bound = float(fn(t, sigma, [float(alpha)])[0])
            assert bound >= low, (fn.__name__, alpha, bound, low)
            if t >= 100:  # the add bound loosens for few steps per epoch (t = 20: 1.45x)
                assert bound <= 1.25 * est + 1e-3, (fn.__name__, alpha, bound, est)


def test_allocation_add_bound_tight_for_many_steps() -> None:
    # second-order expansion of E[Y^-1] for t = 1000, σ = 1: log(1 + c2 - c3 + 3 c2²)
    t, v = 1000, 1.0
    c2 = math.expm1(v) / t
    c3 = (math.exp(3 * v) - 3 * math.exp(v) + 2) / t**2
    truth = math.log1p(c2 - c3 + 3 * c2 * c2)
    bound = float(allocation_rdp_add(t, 1.0, [2.0])[0])
    assert truth <= bound <= truth * (1 + 1e-3)


def test_allocation_close_to_poisson_and_below_no_amplification() -> None:
    orders = np.arange(2.0, 33.0)
    for t, sigma in [(100, 1.0), (1000, 0.8)]:
        alloc = allocation_gaussian_rdp(t, sigma, orders)
        pois = t * poisson_subsampled_gaussian_rdp(1.0 / t, sigma, orders)
        assert np.all(alloc <= orders / (2 * sigma**2) + 1e-12)
        # at the low orders that matter, within 15 % of Poisson with q = 1/t
        assert np.all(np.abs(alloc[:6] / pois[:6] - 1) < 0.15)


def test_allocation_delta_bracketed_by_monte_carlo_and_lower_bound() -> None:
    t, sigma, eps = 50, 0.9, 0.5
    event = RandomAllocationEvent(t, GaussianEvent(sigma))
    rdp_delta = RdpAccountant().compose(event).delta(eps).delta
    rng = np.random.default_rng(7)
    for direction in ("remove", "add"):
        est, low, high = allocation_delta_monte_carlo(
            t, sigma, eps, samples=40_000, direction=direction, rng=rng, confidence=0.999
        )
        assert low <= est <= high
        assert rdp_delta >= low
    # the max-test lower bound on ε sits below the RDP upper bound
    upper = RdpAccountant().compose(event).epsilon(1e-5).epsilon
    lower = one_of_t_epsilon_lower_bound(t, sigma, 1e-5)
    assert 0 < lower < upper


def test_allocation_multi_selection_decomposes() -> None:
    orders = np.array([2.0, 4.0, 8.0])
    k2 = allocation_rdp_remove(100, 1.0, orders, num_selected=2)
    np.testing.assert_allclose(k2, 2 * allocation_rdp_remove(50, 1.0, orders), rtol=1e-12)
    with pytest.raises(PrivacyParameterError, match="num_selected"):
        allocation_rdp_remove(3, 1.0, orders, num_selected=4)


# ------------------------------------------------------------------ truncated Poisson


def test_truncated_poisson_without_truncation_is_poisson() -> None:
    orders = np.array([2.0, 8.0, 32.0])
    full = TruncatedPoissonSampledEvent(1000, 0.01, 1000, GaussianEvent(1.0))
    np.testing.assert_array_equal(
        full.rdp_epsilons(orders),
        PoissonSampledEvent(0.01, GaussianEvent(1.0)).rdp_epsilons(orders),
    )
    tight = TruncatedPoissonSampledEvent(1000, 0.01, 15, GaussianEvent(1.0))
    assert np.all(tight.rdp_epsilons(orders) >= full.rdp_epsilons(orders))


def test_truncated_poisson_not_below_dp_accounting() -> None:
    dpa = pytest.importorskip("dp_accounting")
    n, q, b, sigma, steps = 10_000, 0.01, 130, 1.0, 200
    ours = (
        epsilon_report(
            SelfComposedEvent(TruncatedPoissonSampledEvent(n, q, b, GaussianEvent(sigma)), steps),
            delta=1e-5,
            accountants=["rdp"],
        )
        .best()
        .epsilon
    )
    acc = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dpa.TruncatedSubsampledGaussianDpEvent(n, q, b, sigma), steps)
    theirs = acc.get_epsilon(1e-5)
    pois = RdpAccountant().compose(PoissonSampledEvent(q, GaussianEvent(sigma)), steps)
    assert ours >= theirs * (1 - 1e-3)
    assert ours >= pois.epsilon(1e-5).epsilon
    # the PLD path (branch-revealed mixture) is as tight as dp_accounting's
    ours_pld = (
        epsilon_report(
            SelfComposedEvent(TruncatedPoissonSampledEvent(n, q, b, GaussianEvent(sigma)), steps),
            delta=1e-5,
            accountants=["pld"],
        )
        .best()
        .epsilon
    )
    assert theirs * (1 - 2e-3) <= ours_pld <= theirs * 1.02
    # a larger cap never costs more (the RDP mixture bound is loose: see docs/subsampling.md)
    caps = [
        RdpAccountant()
        .compose(
            SelfComposedEvent(TruncatedPoissonSampledEvent(n, q, cap, GaussianEvent(sigma)), steps)
        )
        .epsilon(1e-5)
        .epsilon
        for cap in (130, 160, 200, n)
    ]
    assert caps == sorted(caps, reverse=True)
    assert caps[-1] == pois.epsilon(1e-5).epsilon


def test_mixture_pld_single_branch_is_the_subsampled_gaussian() -> None:
    from renyi.pld import PrivacyLossDistribution
    from renyi.sampled_pld import mixture_pld

    q, sigma, steps = 0.01, 1.0, 300
    for direction in ("remove", "add"):
        ours = mixture_pld([(1.0, q, 1.0, sigma)], direction).self_compose(steps)
        ref = PrivacyLossDistribution.subsampled_gaussian(q, sigma, direction=direction)
        a = ours.epsilon_for_delta(1e-6)
        b = ref.self_compose(steps).epsilon_for_delta(1e-6)
        assert a.upper >= b.lower and abs(a.upper / b.upper - 1) < 1e-4


# ------------------------------------------------------------------ shuffling


def test_shuffle_upper_is_one_gaussian_per_epoch_and_lower_bound_exceeds_poisson() -> None:
    n, b, sigma, epochs = 60_000, 256, 1.1, 5
    inner = GaussianEvent(sigma / 2, Neighbouring.REPLACE_ONE)
    ev = training_event("shuffle", sigma, dataset_size=n, batch_size=b, steps=epochs * 235)
    assert ev == SelfComposedEvent(ShuffledEvent(n, b, inner), epochs)
    upper = RdpAccountant().compose(ev).epsilon(1e-5).epsilon
    same = RdpAccountant().compose(inner, epochs).epsilon(1e-5).epsilon
    assert upper == same
    lower = one_of_t_epsilon_lower_bound(235, sigma, 1e-5, epochs=epochs, sensitivity=2.0)
    poisson = RdpAccountant().compose(
        PoissonSampledEvent(b / n, GaussianEvent(sigma)), epochs * 235
    )
    # Poisson accounting of the same run would claim far less than shuffling provably has
    assert poisson.epsilon(1e-5).epsilon < lower / 3 < upper


def test_new_events_round_trip_and_validate() -> None:
    events = [
        TruncatedPoissonSampledEvent(100, 0.1, 20, GaussianEvent(1.0)),
        RandomAllocationEvent(10, GaussianEvent(1.0), 2),
        ShuffledEvent(100, 10, GaussianEvent(0.5, Neighbouring.REPLACE_ONE)),
    ]
    for e in events:
        assert from_json(e.to_json()) == e
    with pytest.raises(PrivacyParameterError, match="replace_one"):
        ShuffledEvent(100, 10, GaussianEvent(0.5))
    with pytest.raises(PrivacyParameterError, match="max_batch_size"):
        TruncatedPoissonSampledEvent(100, 0.1, 101, GaussianEvent(1.0))
    with pytest.raises(PrivacyParameterError, match="sampling"):
        training_event("uniform", 1.0, dataset_size=10, batch_size=2, steps=3)
    assert PldAccountant().supports(RandomAllocationEvent(10, GaussianEvent(1.0)))  # PLD since 16ra


# ------------------------------------------------------------------ samplers ↔ events


def _source(seed: int):
    pytest.importorskip("torch")
    from renyi.dpsgd.sampler import SeededRandomSource

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-time InsecureRandomnessWarning
        return SeededRandomSource(seed)


def test_samplers_inclusion_frequencies_match_their_events() -> None:
    pytest.importorskip("torch")
    from renyi.dpsgd.sampler import BallsInBinsSampler, ShuffleSampler, TruncatedPoissonSampler

    n, b = 200, 20
    bib = BallsInBinsSampler(n, b, steps=10 * 10, random_source=_source(1))
    batches = list(bib)
    t = bib.steps_per_epoch
    assert t == 10
    for e in range(10):  # every record exactly once per epoch
        assert sorted(i for bt in batches[e * t : (e + 1) * t] for i in bt) == list(range(n))
    # batch sizes: Binomial(n, 1/t) summed over 10 epochs (mean 200, sd about 13.4)
    counts = np.zeros(t)
    for e in range(10):
        for j, bt in enumerate(batches[e * t : (e + 1) * t]):
            counts[j] += len(bt)
    assert counts.sum() == 10 * n and counts.std() < 3 * math.sqrt(10 * n / t)
    assert bib.training_event(1.0) == training_event(
        "random-allocation", 1.0, dataset_size=n, batch_size=b, steps=100
    )
    assert bib.training_event(1.0) == SelfComposedEvent(
        RandomAllocationEvent(10, GaussianEvent(1.0)), 10
    )

    sh = ShuffleSampler(n, 30, steps=7 * 3, random_source=_source(2))
    sb = list(sh)
    assert [len(x) for x in sb[:7]] == [30] * 6 + [20]
    for e in range(3):
        assert sorted(i for bt in sb[e * 7 : (e + 1) * 7] for i in bt) == list(range(n))
    assert sh.neighbouring is Neighbouring.REPLACE_ONE
    for s in (bib, sh):
        with pytest.raises(UnsupportedEventError, match="per epoch"):
            s.accounting_event(1.0)

    tp = TruncatedPoissonSampler(n, 0.1, steps=1000, max_batch_size=22, random_source=_source(3))
    sizes = np.array([len(x) for x in tp])
    assert sizes.max() <= 22
    from scipy.stats import binom

    k = np.arange(n + 1)
    expected = float((np.minimum(k, 22) * binom.pmf(k, n, 0.1)).sum())
    assert abs(sizes.mean() - expected) < 4 * sizes.std() / math.sqrt(sizes.size)
    assert tp.accounting_event(1.0) == TruncatedPoissonSampledEvent(n, 0.1, 22, GaussianEvent(1.0))


# ------------------------------------------------------------------ f-DP


def test_tradeoff_matches_exact_gaussian_tradeoff() -> None:
    steps, sigma = 10, 3.0
    mu = math.sqrt(steps) / sigma
    fpr = np.array([1e-4, 1e-3, 1e-2, 0.1, 0.5])
    exact = gaussian_tradeoff_tpr(mu, fpr)
    pld = PldAccountant().compose(GaussianEvent(sigma), steps)
    curve = tradeoff_curve(pld, fpr)
    assert np.all(curve.tpr >= exact - 1e-12)
    np.testing.assert_allclose(curve.tpr, exact, rtol=2e-3, atol=1e-6)
    rdp = RdpAccountant().compose(GaussianEvent(sigma), steps)
    assert np.all(tradeoff_curve(rdp, fpr).tpr >= exact - 1e-12)
    est = gdp_mu(pld)
    assert abs(est.mu - mu) < 1e-3 * mu and "lower" in est.direction
    # one (ε, δ) point: the classical region
    assert tpr_from_profile([1.0], [1e-5], [0.01])[0] == pytest.approx(1e-5 + math.e * 0.01)


# ------------------------------------------------------------------ CLI


def test_cli_sampling_json_bounds_and_tradeoff(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    common = ["epsilon", "--noise-multiplier", "1.1", "--delta", "1e-5", "--json"]
    data = ["--dataset-size", "60000", "--batch-size", "256"]
    assert main([*common, "--sampling", "shuffle", *data, "--epochs", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sampling"] == "shuffle" and out["neighbouring"] == "replace_one"
    kinds = {r["accountant"]: r["bound"] for r in out["results"]}
    assert kinds == {"rdp": "upper", "max-test": "lower"}
    fig = tmp_path / "t.png"
    argv = [*common, "--sampling", "random-allocation", *data, "--steps", "468"]
    assert main([*argv, "--tradeoff", "--plot", str(fig)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [d["fpr"] for d in out["tradeoff"]] == [1e-3, 1e-2, 0.1]
    assert all(d["fpr"] <= d["tpr"] <= 1 for d in out["tradeoff"])
    assert fig.stat().st_size > 1000
    code = main(
        [*common, "--sample-rate", "0.01", "--steps", "5", "--plot", "/nonexistent/d/x.png"]
    )
    assert code == 2 and "directory" in capsys.readouterr().err  # usage error, before any work
    assert main([*common, "--sampling", "fixed-size", "--steps", "3"]) == 2  # usage error
    assert "dataset-size" in capsys.readouterr().err


def test_allocation_extremes_never_crash_or_nan() -> None:
    from renyi.curves import DEFAULT_ORDERS

    rng = np.random.default_rng(3)
    cases = [(1e-200, 10), (1e200, 10), (1.0, 10**18), (0.05, 7), (0.12, 1000)]
    cases += [(float(10 ** rng.uniform(-3, 3)), int(10 ** rng.uniform(0, 7))) for _ in range(3)]
    for sigma, t in cases:
        r = allocation_gaussian_rdp(t, sigma, DEFAULT_ORDERS)
        assert not np.isnan(r).any() and np.all(r >= 0)
        with np.errstate(divide="ignore", over="ignore"):
            cap = DEFAULT_ORDERS / (2 * sigma * sigma)
        assert np.all(r <= cap * (1 + 1e-9) + 1e-12)


def test_renyi_epsilon_takes_the_sampler() -> None:
    import renyi

    kw = {"noise_multiplier": 1.1, "steps": 400, "dataset_size": 10_000, "batch_size": 100}
    rep = renyi.epsilon(delta=1e-5, sampling="random-allocation", accountants=["rdp"], **kw)
    ev = training_event("random-allocation", 1.1, dataset_size=10_000, batch_size=100, steps=400)
    assert rep.best().epsilon == RdpAccountant().compose(ev).epsilon(1e-5).epsilon
    with pytest.raises(PrivacyParameterError, match="sampling"):
        renyi.epsilon(delta=1e-5, sampling="shuffle", noise_multiplier=1.0, steps=3)


def test_dp_optimizer_charges_epoch_samplers_per_epoch_never_per_step() -> None:
    """A shuffled (or balls-in-bins) run can never be accounted per step, hence never with
    the Poisson ε: the optimizer charges the sampler's whole-epoch event, at each epoch's
    first step (tests/test_dpsgd_epoch_samplers.py trains with them)."""
    torch = pytest.importorskip("torch")
    from renyi.dpsgd import DPOptimizer
    from renyi.dpsgd.sampler import BallsInBinsSampler, ShuffleSampler

    model = torch.nn.Linear(3, 1)
    for sampler, kind in (
        (ShuffleSampler(100, 10, 10), ShuffledEvent),
        (BallsInBinsSampler(100, 10, 10), RandomAllocationEvent),
    ):
        with pytest.raises(UnsupportedEventError, match="per epoch"):
            sampler.accounting_event(1.0)
        opt = DPOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            model=model,
            loss_fn=torch.nn.functional.mse_loss,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            sampler=sampler,
        )
        assert isinstance(opt.event, kind)
        assert [opt.event_at(k) is not None for k in range(12)] == [k % 10 == 0 for k in range(12)]
