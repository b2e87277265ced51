"""Correlated noise (matrix factorization): strategies, sensitivity, streaming, accounting.

References are independent brute force (enumerated participation patterns and signs, dense
matrices), closed forms (the exact Gaussian ε) and, where installed, jax_privacy.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from renyi.accountants import make_accountant
from renyi.calibration import dpsgd_epsilon, dpsgd_event
from renyi.closed_forms import gaussian_epsilon
from renyi.correlated.accounting import calibrate_correlated, correlated_plan
from renyi.correlated.optimize import optimize_banded, optimize_blt, optimize_dense, toeplitz_loss
from renyi.correlated.sensitivity import (
    dense_sensitivity,
    max_over_patterns,
    toeplitz_sensitivity,
)
from renyi.correlated.strategies import (
    BandedToeplitzStrategy,
    BltStrategy,
    DenseStrategy,
    HonakerTreeStrategy,
    TreeStrategy,
    error_summary,
    identity,
    strategy_from_dict,
)
from renyi.correlated.streaming import streaming_noise
from renyi.correlated.workload import prefix_coefs, prefix_workload
from renyi.errors import PrivacyParameterError
from renyi.events import GaussianEvent, PoissonSampledEvent, SelfComposedEvent


def _patterns(t: int, b: int, k: int):
    """Every participation set: ≤ k steps of range(t), pairwise ≥ b apart (non-empty)."""
    for size in range(1, k + 1):
        for combo in itertools.combinations(range(t), size):
            if all(j - i >= b for i, j in itertools.pairwise(combo)):
                yield combo


def _brute_sensitivity(c: np.ndarray, b: int, k: int) -> float:
    """max over patterns and signs of ‖Σ s_i C[:, i]‖ (the scalar-gradient sensitivity)."""
    best = 0.0
    for combo in _patterns(c.shape[1], b, k):
        cols = c[:, combo]
        for signs in itertools.product((1.0, -1.0), repeat=len(combo) - 1):
            v = cols @ np.array((1.0, *signs))
            best = max(best, float(v @ v))
    return math.sqrt(best)


def _random_lower(rng: np.random.Generator, t: int) -> np.ndarray:
    c = np.tril(rng.normal(size=(t, t)))
    np.fill_diagonal(c, np.abs(np.diag(c)) + 0.5)
    return c


T_SMALL = 8
STRATEGIES = [
    identity(),
    BandedToeplitzStrategy((1.0, 0.6, 0.3)),
    BandedToeplitzStrategy((1.0, -0.4, 0.7)),  # not monotone: the bound must still hold
    BltStrategy((0.8, 0.3), (0.25, 0.2)),
    TreeStrategy(),
]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.to_dict()["strategy"])
@pytest.mark.parametrize(("b", "k"), [(1, 1), (1, 3), (2, 2), (2, 4), (3, 3), (5, 2)])
def test_sensitivity_against_brute_force(strategy, b, k):
    c = strategy.matrix(T_SMALL)
    truth = _brute_sensitivity(c, b, k)
    got = strategy.sensitivity(T_SMALL, b, k)
    assert got.value >= truth * (1 - 1e-12)
    if got.exact:
        assert got.value == pytest.approx(truth, rel=1e-12)
    if k == 1:
        assert got.exact


def test_sensitivity_exact_claims():
    """Monotone non-negative Toeplitz and b-banded C are exact; sign-changing ones are not."""
    assert BandedToeplitzStrategy((1.0, 0.6, 0.3)).sensitivity(8, 2, 4).exact
    assert BltStrategy((0.8,), (0.5,)).sensitivity(8, 3, None).exact
    assert not BandedToeplitzStrategy((1.0, -0.4, 0.7)).sensitivity(8, 2, 4).exact
    banded = np.tril(np.triu(np.random.default_rng(1).normal(size=(8, 8)), -2))
    got = dense_sensitivity(banded + 3 * np.eye(8), 3, None)
    assert got.exact and got.value == pytest.approx(
        _brute_sensitivity(banded + 3 * np.eye(8), 3, 3)
    )


@pytest.mark.parametrize("seed", range(4))
def test_dense_sensitivity_random_matrices(seed):
    rng = np.random.default_rng(seed)
    c = _random_lower(rng, 7)
    for b, k in [(1, 1), (2, 3), (3, 2), (1, 7)]:
        got = dense_sensitivity(c, b, k)
        assert got.value >= _brute_sensitivity(c, b, k) * (1 - 1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_max_over_patterns_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    w = rng.exponential(size=(3, 9))
    for b, k in [(1, 1), (1, 9), (2, 3), (3, 2), (4, 5)]:
        got = max_over_patterns(w, b, k)
        want = [max(sum(row[list(p)]) for p in _patterns(9, b, k)) for row in w]
        np.testing.assert_allclose(got, want, rtol=1e-13)


def test_toeplitz_sensitivity_matches_dense():
    c = BltStrategy((0.9, 0.5), (0.3, 0.2))
    for b, k in [(1, 1), (3, None), (7, None), (2, 5)]:
        fast = toeplitz_sensitivity(c.coefs(40), 40, b, k)
        dense = dense_sensitivity(c.matrix(40), b, k)
        assert fast.value <= dense.value * (1 + 1e-12)  # dense is a looser (two-stage) bound
        kk = -(-40 // b) if k is None else k
        cols = c.matrix(40)[:, [j * b for j in range(kk) if j * b < 40]].sum(axis=1)
        assert fast.exact and fast.value == pytest.approx(float(np.linalg.norm(cols)), rel=1e-12)


WORKLOADS = {
    "prefix": prefix_workload(12),
    "momentum": prefix_workload(12, momentum=0.9),
    "schedule": prefix_workload(12, 0.5, np.linspace(1.0, 0.1, 12)),
}


@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.parametrize(
    "strategy",
    [*STRATEGIES, HonakerTreeStrategy(), optimize_dense(12)],
    ids=lambda s: s.to_dict()["strategy"],
)
def test_factorization_reconstructs_workload(name, strategy):
    a = WORKLOADS[name]
    c = strategy.matrix(12)
    r = strategy.noising_matrix(12)
    b = a @ r
    np.testing.assert_allclose(b @ c, a, atol=1e-9)
    if strategy.streamable:  # causal noise: step t uses z_0..z_t only
        assert np.allclose(np.triu(r, 1), 0.0)
    # per-step error (fast paths included) equals the dense row variances of B
    np.testing.assert_allclose(strategy.per_step_error(12, a), np.sum(b * b, axis=1), rtol=1e-9)


def test_workload_toeplitz_column_matches_dense():
    np.testing.assert_allclose(prefix_workload(9, 0.7)[:, 0], prefix_coefs(9, 0.7))
    s = BltStrategy((0.7,), (0.4,))
    np.testing.assert_allclose(
        s.per_step_error(9, prefix_coefs(9, 0.7)), s.per_step_error(9, prefix_workload(9, 0.7))
    )
    tree = TreeStrategy()
    np.testing.assert_allclose(tree.per_step_error(16), tree.per_step_error(16, np.ones(16)))


@pytest.mark.parametrize(
    "strategy",
    [
        identity(),
        BandedToeplitzStrategy((1.0, 0.5, 0.2, 0.1)),
        BltStrategy((0.9, 0.4), (0.3, 0.1)),
        TreeStrategy(),
    ],
    ids=lambda s: s.to_dict()["strategy"],
)
def test_streaming_equals_dense(strategy):
    t = 37
    z = np.random.default_rng(3).normal(size=(t, 5))
    gen = streaming_noise(strategy)
    ys = np.array([gen.next(z[i].copy()) for i in range(t)])
    np.testing.assert_allclose(ys, strategy.noising_matrix(t) @ z, atol=1e-12)
    assert gen.buffers <= max(
        len(strategy.to_dict().get("coefs", [0])), 2, math.ceil(math.log2(t)) + 1
    )
    # resume from a checkpoint mid-stream: the same continuation exactly
    gen2 = streaming_noise(strategy)
    for i in range(20):
        gen2.next(z[i].copy())
    state = gen2.state_dict()
    gen3 = streaming_noise(strategy)
    gen3.load_state_dict(state)
    rest = np.array([gen3.next(z[i].copy()) for i in range(20, t)])
    np.testing.assert_array_equal(rest, ys[20:])


def test_identity_streaming_is_the_input():
    z = np.arange(4.0)
    assert streaming_noise(identity()).next(z) is z


def test_streaming_refuses_dense():
    with pytest.raises(PrivacyParameterError, match="streamable"):
        streaming_noise(HonakerTreeStrategy())


def test_optimised_strategies_beat_baselines():
    t = 48
    dense = error_summary(optimize_dense(t), t)
    results = {
        "dpsgd": error_summary(identity(), t),
        "tree": error_summary(TreeStrategy(), t),
        "banded": error_summary(optimize_banded(t, 6), t),
        "blt": error_summary(optimize_blt(t, 3), t),
    }
    for r in results.values():  # the dense optimum (total error) is best
        assert dense.rmse <= r.rmse * (1 + 1e-6)
    assert results["banded"].rmse < results["dpsgd"].rmse
    assert results["blt"].rmse < results["tree"].rmse
    # more bands never hurt (the optimiser starts from the truncated square root)
    assert error_summary(optimize_banded(t, 12), t).rmse <= results["banded"].rmse + 1e-9


def test_banded_gradient_and_loss():
    from renyi.correlated.optimize import _banded_loss, _weights

    c = np.array([1.0, 0.5, 0.3, 0.2])
    w, a = _weights(30, "max"), prefix_coefs(30, 0.5)
    _, grad = _banded_loss(c, 30, w, a, 3, 4)
    eps = 1e-6
    for m in range(4):
        e = np.eye(4)[m] * eps
        num = (_banded_loss(c + e, 30, w, a, 3, 4)[0] - _banded_loss(c - e, 30, w, a, 3, 4)[0]) / (
            2 * eps
        )
        assert grad[m] == pytest.approx(num, rel=1e-5)
    s = BandedToeplitzStrategy(tuple(c))
    want = s.per_step_error(30)[-1] * s.sensitivity(30, 1, 1).value ** 2
    assert toeplitz_loss(c, 30, loss="max") == pytest.approx(want, rel=1e-12)


def test_strategy_round_trip():
    for s in [*STRATEGIES, HonakerTreeStrategy()]:
        assert strategy_from_dict(s.to_dict()) == s
    d = optimize_dense(6)
    np.testing.assert_array_equal(strategy_from_dict(d.to_dict()).matrix(6), d.matrix(6))


def test_strategy_validation():
    with pytest.raises(PrivacyParameterError, match="coefs"):
        BandedToeplitzStrategy((0.5, 0.1))
    with pytest.raises(PrivacyParameterError, match="thetas"):
        BltStrategy((1.0,), (0.1,))
    with pytest.raises(PrivacyParameterError, match="omegas"):
        BltStrategy((0.5,), (-0.1,))
    with pytest.raises(PrivacyParameterError, match="lower triangular"):
        DenseStrategy(np.ones((3, 3)))
    with pytest.raises(PrivacyParameterError, match="momentum"):
        prefix_workload(4, momentum=1.0)
    with pytest.raises(PrivacyParameterError, match="loss"):
        optimize_banded(8, 2, loss="mean")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ accounting


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_one_band_is_dpsgd(accountant):
    q, t, sigma = 0.02, 300, 1.1
    plan = correlated_plan(identity(), t, sigma, sample_rate=q)
    assert plan.analysis == "amplified" and plan.charges == t
    assert plan.step_event == dpsgd_event(sigma, q)
    acc = make_accountant(accountant).compose(plan.step_event, plan.charges)
    assert acc.epsilon(1e-5).epsilon == dpsgd_epsilon(sigma, q, t, 1e-5, accountant).epsilon
    assert plan.noise_scale == sigma


def test_amplified_never_below_exact_full_participation():
    """At q = 1 the banded mechanism IS a Gaussian with its (exact) b-min-sep sensitivity:
    the amplified analysis must not report less than that Gaussian's exact ε."""
    s = BandedToeplitzStrategy((1.0, 0.5, 0.25))
    t, b, sigma = 60, 4, 3.0
    plan = correlated_plan(s, t, sigma, partitions=b, sample_rate=1.0)
    assert plan.analysis == "amplified"
    sens = s.sensitivity(t, b, None)
    assert sens.exact
    mu = sens.value / plan.noise_scale
    exact = gaussian_epsilon(mu, 1e-5)
    got = make_accountant("pld").compose(plan.step_event, plan.charges).epsilon(1e-5).epsilon
    assert got >= exact
    assert got == pytest.approx(exact, rel=0.02)  # only truncated end columns differ
    # sub-sampling only helps, monotonically
    eps_q = [
        make_accountant("pld")
        .compose(correlated_plan(s, t, sigma, partitions=b, sample_rate=q).step_event, 15)
        .epsilon(1e-5)
        .epsilon
        for q in (0.1, 0.4, 1.0)
    ]
    assert eps_q[0] < eps_q[1] < eps_q[2]


def test_amplification_refused_for_wide_strategies():
    s = BandedToeplitzStrategy((1.0, 0.5, 0.25, 0.1))
    with pytest.raises(PrivacyParameterError, match="bands"):
        correlated_plan(s, 40, 1.0, partitions=2, sample_rate=0.5, analysis="amplified")
    plan = correlated_plan(s, 40, 1.0, partitions=2, sample_rate=0.5)
    assert plan.analysis == "min_sep" and isinstance(plan.step_event, GaussianEvent)
    assert plan.sensitivity.value == pytest.approx(s.sensitivity(40, 2, None).value)
    blt = correlated_plan(BltStrategy((0.9,), (0.3,)), 40, 1.0, partitions=8)
    assert blt.analysis == "min_sep"
    assert isinstance(blt.event, SelfComposedEvent) and blt.charges == 1


@pytest.mark.parametrize(
    ("strategy", "b", "q", "accountant"),
    [
        (identity(), 1, 0.05, "rdp"),
        (BandedToeplitzStrategy((1.0, 0.4)), 2, 0.1, "pld"),
        (BandedToeplitzStrategy((1.0, 0.4)), 2, 0.1, "rdp"),
        (BltStrategy((0.8,), (0.3,)), 5, 1.0, "pld"),
        (BltStrategy((0.8,), (0.3,)), 5, 1.0, "rdp"),
    ],
    ids=["dpsgd-rdp", "banded-pld", "banded-rdp", "blt-pld", "blt-rdp"],
)
def test_calibration_conservative_and_tight(accountant, strategy, b, q):
    plan, _ = calibrate_correlated(
        2.0, 1e-5, strategy, 50, partitions=b, sample_rate=q, accountant=accountant
    )

    def eps(sigma: float) -> float:
        p = correlated_plan(strategy, 50, sigma, partitions=b, sample_rate=q)
        return make_accountant(accountant).compose(p.step_event, p.charges).epsilon(1e-5).epsilon

    assert eps(plan.noise_multiplier) <= 2.0
    assert eps(plan.noise_multiplier * (1 - 2e-3)) > 2.0


def test_min_sep_calibration_matches_exact_gaussian():
    plan, _ = calibrate_correlated(1.0, 1e-6, TreeStrategy(), 32, partitions=8)
    mu = 1.0 / plan.noise_multiplier
    assert gaussian_epsilon(mu, 1e-6) <= 1.0 + 1e-9
    assert gaussian_epsilon(mu * 1.002, 1e-6) > 1.0
    assert isinstance(plan.step_event, GaussianEvent)


def test_plan_validation_and_charges():
    with pytest.raises(PrivacyParameterError, match="partitions"):
        correlated_plan(identity(), 5, 1.0, partitions=6)
    with pytest.raises(PrivacyParameterError, match="sample_rate"):
        correlated_plan(identity(), 5, 1.0, sample_rate=0.0)
    plan = correlated_plan(
        BandedToeplitzStrategy((1.0, 0.3)), 10, 1.0, partitions=4, sample_rate=0.5
    )
    assert [s for s in range(10) if plan.charge_at(s)] == [0, 4, 8]
    assert plan.charges == 3
    assert isinstance(plan.step_event, PoissonSampledEvent)


# ------------------------------------------------------------------------ jax_privacy oracle


@pytest.fixture(scope="module")
def jp():
    pytest.importorskip("jax_privacy")
    import jax

    jax.config.update("jax_enable_x64", True)
    from jax_privacy.matrix_factorization import sensitivity, toeplitz

    return toeplitz, sensitivity


def test_oracle_toeplitz(jp):
    toeplitz, sensitivity = jp
    s = BltStrategy((0.95, 0.6), (0.2, 0.1))
    coefs = s.coefs(64)
    for b, k in [(1, 1), (4, None), (16, 3)]:
        theirs = float(toeplitz.minsep_sensitivity_squared(coefs, b, n=64, max_participations=k))
        assert toeplitz_sensitivity(coefs, 64, b, k).value ** 2 == pytest.approx(theirs, rel=1e-12)
    theirs_err = np.asarray(toeplitz.per_query_error(strategy_coef=coefs, n=64))
    np.testing.assert_allclose(s.per_step_error(64), theirs_err, rtol=1e-10)
    tree = TreeStrategy().matrix(32)
    theirs = float(sensitivity.get_min_sep_sensitivity_upper_bound(tree, 4))
    assert dense_sensitivity(tree, 4, None).value == pytest.approx(theirs, rel=1e-12)


def test_oracle_banded_optimum(jp):
    toeplitz, _ = jp
    t, bands = 64, 4
    ours = optimize_banded(t, bands)
    theirs = np.asarray(toeplitz.optimize_banded_toeplitz(t, bands))
    theirs = theirs / theirs[0]
    loss_ours = toeplitz_loss(ours.coefficients, t)
    loss_theirs = toeplitz_loss(theirs, t)
    assert loss_ours <= loss_theirs * 1.001


# ------------------------------------------------------------------------------------- CLI


def test_cli_correlated_table_and_json(capsys):
    import json

    from renyi.cli.main import main

    assert main(["correlated", "--steps", "32", "--strategy", "dpsgd", "blt", "--bands", "4"]) == 0
    out = capsys.readouterr().out
    assert "dpsgd" in out and "blt" in out and "rmse" in out
    assert main(["correlated", "--steps", "16", "--min-sep", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["strategy"]: r for r in data["rows"]}
    assert set(rows) == {"dpsgd", "tree", "honaker", "banded", "blt", "dense"}
    assert rows["dpsgd"]["sensitivity"] == pytest.approx(2.0)  # √k, k = 4
    assert rows["dpsgd"]["rmse"] == pytest.approx(2.0 * math.sqrt(np.mean(np.arange(1, 17))))
    assert main(["correlated", "--steps", "0"]) == 2
    assert "steps=0" in capsys.readouterr().err


def test_choose_bands_minimises_calibrated_error():
    from renyi.calibration import calibrate_noise_multiplier
    from renyi.correlated.accounting import choose_bands

    best, scores = choose_bands(4.0, 1e-5, 60, 400, 20, candidates=(1, 2, 4, 32))
    assert set(scores) == {1, 2, 4}  # 32 partitions of 20 exceed n = 400
    assert scores[best] == min(scores.values())
    sigma = calibrate_noise_multiplier(4.0, 1e-5, 20 / 400, 60, "rdp").noise_multiplier
    assert scores[1] == pytest.approx(sigma * math.sqrt(np.mean(np.arange(1, 61))), rel=1e-12)
