"""Private hyperparameter tuning: run a random number of private trainings, publish the best.

Every tuning run reads the data, so tuning has a privacy cost; counting every run (naive
composition) makes it large, ignoring it (common practice) makes the reported ε wrong.
:func:`tune` follows Papernot & Steinke (ICLR 2022): the number of runs ``K`` is drawn from a
truncated negative binomial (geometric by default) or Poisson distribution, each run draws its
hyperparameters at random from the search space, and only the best run is returned. The whole
procedure is one :class:`~renyi.analysis.events.RepeatAndSelectEvent` (priced by
:func:`renyi.analysis.selection.repeat_and_select_rdp`), charged to an optional
:class:`~renyi.budget.Budget` as **one** ledger entry *before* any training starts, and the
result says what it cost.

Conditions of the guarantee (the caller's side of the contract):

* each run — training **and** the score it reports — is private with the single-run event
  you pass (``trial_event``); score on public data or privately;
* only the returned best run is published: the other runs' models and scores are discarded
  (they never leave :func:`tune`);
* the search space is fixed before seeing the data.

Example:
    >>> from renyi.analysis.events import GaussianEvent
    >>> def train(config):  # a private training; returns (score, model)
    ...     return -abs(config["lr"] - 0.1), f"model(lr={config['lr']})"
    >>> result = tune(train, [{"lr": 0.01}, {"lr": 0.1}, {"lr": 1.0}],
    ...               trial_event=GaussianEvent(noise_multiplier=20.0), mean_trials=5.0)
    >>> result.runs >= 1 and result.best is not None
    True
    >>> naive = result.naive_epsilon(1e-5, trials=5)
    >>> result.epsilon(1e-5) < naive
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from renyi._validation import as_real, check_int, fail
from renyi.accountants import RdpAccountant
from renyi.analysis.curves import DEFAULT_ORDERS
from renyi.analysis.events import Event, RdpEvent, RepeatAndSelectEvent
from renyi.analysis.selection import RepetitionDistribution
from renyi.random import get_source

__all__ = ["Trial", "TuningResult", "tune"]


@dataclass(frozen=True)
class Trial:
    """The published run: its hyperparameters, its (private) score and what it returned."""

    config: Any
    score: float
    output: Any


@dataclass(frozen=True)
class TuningResult:
    """What :func:`tune` publishes: the best run, how many runs were made, and the cost."""

    best: Trial | None
    runs: int
    distribution: RepetitionDistribution
    trial_event: Event
    event: RepeatAndSelectEvent
    receipt: Any = None
    orders: NDArray[np.float64] = field(default_factory=lambda: np.asarray(DEFAULT_ORDERS))

    def curve(self) -> Any:
        """The RDP curve of the whole procedure (:class:`~renyi.analysis.curves.RdpCurve`)."""
        return RdpAccountant(self.orders).compose(self.event).curve

    def epsilon(self, delta: float) -> float:
        """ε of the whole tuning procedure at ``delta`` (RDP accountant, Balle et al. 2020)."""
        return RdpAccountant(self.orders).compose(self.event).epsilon(delta).epsilon

    def naive_epsilon(self, delta: float, trials: int) -> float:
        """ε if ``trials`` runs were composed naively (what counting every run would cost)."""
        trials = check_int("trials", trials, minimum=1)
        acc = RdpAccountant(self.orders).compose(self.trial_event, count=trials)
        return acc.epsilon(delta).epsilon


def _single_run_event(
    trial_event: Event | Callable[[Any], Event],
    configs: Sequence[Any] | None,
    orders: NDArray[np.float64],
) -> Event:
    """The event of one run: ``trial_event``, or the pointwise-worst curve over the space.

    One run draws its configuration at random, then trains: its output distribution is a
    mixture over configurations with data-independent weights, whose Rényi divergence is at
    most the largest over the configurations (joint quasi-convexity).
    """
    if isinstance(trial_event, Event):
        return trial_event
    if not callable(trial_event):
        raise fail("trial_event", trial_event, "an Event or a callable config -> Event")
    if configs is None:
        raise fail(
            "trial_event",
            trial_event,
            "a single Event when the search space is a sampler (the per-configuration events "
            "must all be known to price one run)",
        )
    curves = []
    for config in configs:
        ev = trial_event(config)
        if not isinstance(ev, Event):
            raise fail("trial_event(config)", ev, "an Event for every configuration")
        curves.append(RdpAccountant(orders).compose(ev).curve.epsilons)
    worst = np.max(np.vstack(curves), axis=0)
    return RdpEvent(tuple(orders.tolist()), tuple(worst.tolist()))


def tune(
    train: Callable[[Any], Any],
    search_space: Sequence[Any] | Callable[[Any], Any],
    *,
    trial_event: Event | Callable[[Any], Event],
    mean_trials: float = 10.0,
    shape: float = 1.0,
    maximize: bool = True,
    budget: Any = None,
    label: str = "private hyperparameter tuning",
    rng: Any = None,
    orders: Any = DEFAULT_ORDERS,
    progress: bool = False,
) -> TuningResult:
    """Private random search: ``K ~ D`` runs of ``train`` on random configurations, best returned.

    Args:
        train: ``train(config)`` runs one private training and returns its score (a float)
            or ``(score, output)``; the score must be private too (counted in ``trial_event``).
        search_space: a sequence of configurations (each run picks one uniformly at random)
            or a function ``rng -> config`` drawing one.
        trial_event: the privacy event of one run (training + score), or a function
            ``config -> Event`` (then ``search_space`` must be a sequence: one run is priced at
            the worst configuration).
        mean_trials: E[K], the mean number of runs (> 1; > 0 for Poisson).
        shape: the distribution of K: ``1`` geometric (default), ``0`` logarithmic, ``η > 0``
            truncated negative binomial, ``math.inf`` Poisson (may make no run at all).
        maximize: whether a larger score is better.
        budget: an optional :class:`~renyi.budget.Budget`; the whole procedure is charged to it
            as one entry before the first run (refused → nothing runs).
        rng: randomness for K and the configurations (secure by default).
        progress: show a tqdm bar over the runs.

    Returns:
        :class:`TuningResult` with ``best`` (None if K = 0), ``runs`` = K and ``event``, the
        :class:`~renyi.analysis.events.RepeatAndSelectEvent` of the whole procedure (what the ledger
        records); ``result.epsilon(delta)`` gives its ε.
    """
    if not callable(train):
        raise fail("train", train, "a callable config -> score or (score, output)")
    configs: Sequence[Any] | None
    if callable(search_space):
        configs = None
    elif isinstance(search_space, Sequence) and not isinstance(search_space, str | bytes):
        configs = search_space
        if len(configs) == 0:
            raise fail("search_space", search_space, "a non-empty sequence or a sampler")
    else:
        raise fail("search_space", search_space, "a non-empty sequence or a callable rng -> config")
    mean_trials = as_real("mean_trials", mean_trials)
    distribution = RepetitionDistribution(mean_trials, shape)
    a = np.asarray(orders, dtype=np.float64)
    single_event = _single_run_event(trial_event, configs, a)
    event = RepeatAndSelectEvent(single_event, mean_trials, distribution.shape)
    receipt = None
    if budget is not None:
        receipt = budget.spend(
            event,
            label=label,
            metadata={
                "procedure": "repeat_and_select",
                "reference": "Papernot & Steinke 2022",
                "distribution": distribution.to_dict(),
                "trial_event": single_event.to_dict(),
                "guarantee": "per record, for the neighbouring relation of one run",
            },
        )
    source = get_source(rng)
    runs = distribution.sample(source)
    best: Trial | None = None
    iterator: Any = range(runs)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="private tuning", unit="run")
    for _ in iterator:
        if configs is None:
            config = search_space(source)  # type: ignore[operator]
        else:
            config = configs[int(source.integers_below(len(configs)))]
        got = train(config)
        score, output = (got if isinstance(got, tuple) else (got, None))[:2]
        score = float(score)
        if math.isnan(score):
            raise fail("score", score, "a real number (the training returned NaN)")
        if best is None or (score > best.score if maximize else score < best.score):
            best = Trial(config, score, output)
    return TuningResult(
        best=best,
        runs=runs,
        distribution=distribution,
        trial_event=single_event,
        event=event,
        receipt=receipt,
        orders=a,
    )
