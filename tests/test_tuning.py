"""Private hyperparameter tuning: one ledger entry for the whole procedure, charged first."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from renyi.accountants import RdpAccountant
from renyi.budget import Budget
from renyi.errors import BudgetExceededError, PrivacyParameterError
from renyi.events import (
    GaussianEvent,
    PoissonSampledEvent,
    RepeatAndSelectEvent,
    SelfComposedEvent,
    from_json,
)
from renyi.selection import RepetitionDistribution, repeat_and_select_rdp
from renyi.tuning import tune

RUN = SelfComposedEvent(PoissonSampledEvent(0.01, GaussianEvent(1.2)), 1000)
SPACE = [{"lr": lr} for lr in (0.01, 0.03, 0.1, 0.3, 1.0)]


def _train(config: dict) -> tuple[float, str]:
    return -abs(math.log10(config["lr"]) + 1.0), f"model@{config['lr']}"


def test_best_run_and_cost(tmp_path) -> None:
    budget = Budget(epsilon=10.0, delta=1e-5, ledger=tmp_path / "l.sqlite")
    calls: list[dict] = []

    def train(config: dict) -> tuple[float, str]:
        calls.append(config)
        return _train(config)

    res = tune(train, SPACE, trial_event=RUN, mean_trials=10.0, budget=budget)
    assert res.runs == len(calls) >= 1
    assert res.best is not None
    assert res.best.score == max(_train(c)[0] for c in calls)
    # one ledger entry for the whole procedure, with its parameters
    entries = budget.entries()
    assert len(entries) == 1
    dist = entries[0].metadata["distribution"]
    assert dist["shape"] == 1.0 and dist["mean"] == pytest.approx(10.0, rel=1e-12)
    assert dist["gamma"] == pytest.approx(0.1, rel=1e-12)
    assert entries[0].label == "private hyperparameter tuning"
    # what was charged is the selection bound, and it is what the result reports
    assert entries[0].event == res.event.to_dict()
    assert budget.spent_epsilon() >= res.epsilon(1e-5) * (1 - 1e-12)
    single = RdpAccountant().compose(RUN).epsilon(1e-5).epsilon
    assert single < res.epsilon(1e-5) < res.naive_epsilon(1e-5, trials=10)


def test_refused_before_any_run(tmp_path) -> None:
    budget = Budget(epsilon=1.0, delta=1e-5, ledger=tmp_path / "l.sqlite")
    calls: list[dict] = []
    with pytest.raises(BudgetExceededError):
        tune(lambda c: calls.append(c) or 0.0, SPACE, trial_event=RUN, budget=budget)
    assert calls == [] and budget.entries() == []


def test_worst_configuration_prices_one_run() -> None:
    events = {0.1: GaussianEvent(2.0), 1.0: GaussianEvent(1.0)}  # lr=1.0 is the costliest
    res = tune(
        lambda c: 0.0,
        [{"lr": 0.1}, {"lr": 1.0}],
        trial_event=lambda c: events[c["lr"]],
        mean_trials=3.0,
    )
    worst = RdpAccountant().compose(RepeatAndSelectEvent(GaussianEvent(1.0), 3.0)).curve
    np.testing.assert_allclose(res.curve().epsilons, worst.epsilons, rtol=1e-12)


def test_per_config_events_need_a_finite_space() -> None:
    with pytest.raises(PrivacyParameterError, match="trial_event"):
        tune(lambda c: 0.0, lambda rng: {"lr": 0.1}, trial_event=lambda c: RUN)


def test_sampler_search_space_and_minimize() -> None:
    def draw(source) -> dict:
        return {"lr": 10.0 ** (-3.0 * float(source.uniform(1)[0]))}

    res = tune(lambda c: c["lr"], draw, trial_event=RUN, mean_trials=4.0, maximize=False)
    assert res.best is not None and 1e-3 <= res.best.score <= 1.0


def test_poisson_can_make_no_run() -> None:
    rng = np.random.default_rng(3)
    zero = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(30):
            res = tune(_train, SPACE, trial_event=RUN, mean_trials=1.0, shape=math.inf, rng=rng)
            zero += res.runs == 0
            assert (res.best is None) == (res.runs == 0)
    assert zero >= 1  # P[K = 0] = e^-1: no zero in 30 runs has probability 1e-6


def test_event_is_the_selection_curve() -> None:
    res = tune(_train, SPACE, trial_event=RUN, mean_trials=20.0, shape=0.0)
    assert res.event == RepeatAndSelectEvent(RUN, 20.0, 0.0)
    single = RdpAccountant().compose(RUN).curve
    expected = repeat_and_select_rdp(single.orders, single.epsilons, RepetitionDistribution(20, 0))
    np.testing.assert_allclose(res.curve().epsilons, expected, rtol=0, atol=0)
    # the event survives a ledger round trip
    assert from_json(res.event.to_json()) == res.event


def test_bad_input() -> None:
    with pytest.raises(PrivacyParameterError, match="search_space"):
        tune(_train, [], trial_event=RUN)
    with pytest.raises(PrivacyParameterError, match="train"):
        tune("not callable", SPACE, trial_event=RUN)  # type: ignore[arg-type]
    with pytest.raises(PrivacyParameterError, match="mean"):
        tune(_train, SPACE, trial_event=RUN, mean_trials=1.0)
    with pytest.raises(PrivacyParameterError, match="score"):
        tune(lambda c: float("nan"), SPACE, trial_event=RUN, mean_trials=3.0)
