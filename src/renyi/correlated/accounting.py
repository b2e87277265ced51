"""What a correlated-noise run costs: an event our accountants price, and σ for a target ε.

Two analyses, by participation pattern (``partitions`` = b, ``sample_rate`` = q: the data
are split at random into b partitions, step t uses partition t mod b, and each of its
records joins with probability q — *cyclic Poisson sampling*):

* **Amplified** (Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization",
  Thm. 4): when ``C`` has at most b bands, the b-step blocks of rows one record touches are
  disjoint, and the whole run is ``⌈T/b⌉`` adaptive compositions of the Poisson-subsampled
  Gaussian with noise multiplier σ relative to the largest column norm of ``C``:
  ``SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(σ)), ⌈T/b⌉)``. One band and one
  partition is exactly DP-SGD's event.
* **b-min-sep** (Denisov et al. 2022; Choquette-Choo et al. 2023, "Multi-epoch matrix
  factorization"): any lower-triangular ``C``; each record joins at most ``k = ⌈T/b⌉`` steps
  at least b apart; the run is one Gaussian mechanism with noise multiplier σ relative to
  the b-min-sep sensitivity of ``C`` (:mod:`renyi.correlated.sensitivity`, an upper bound
  when not exact): ``GaussianEvent(σ)``. Sampling within partitions (q < 1) is not used by
  this analysis, which holds for every realised participation.

**Random allocation ("balls in bins") instead of Poisson** (``sampling="random-allocation"``;
the sampler is :class:`renyi.dpsgd.correlated.CyclicAllocationSampler`): the b partitions are
drawn once as above; the run is cut into epochs of ``m`` rounds (``m · b`` steps) and in each
epoch every record joins exactly ``k`` of the ``m`` steps of its partition, chosen uniformly
and independently of the other records. With at most b bands the amplified argument goes
through unchanged: given the record's partition, its rounds touch disjoint b-row blocks of
``C G + Z``, so one epoch is ``k``-out-of-``m`` random allocation of b-row Gaussian blocks,
each with noise multiplier σ relative to the largest column norm (a shorter column is a
post-processing of the longest: scale the block down and add the missing noise). The run is
``⌈T/(m·b)⌉`` compositions of ``RandomAllocationEvent(m, GaussianEvent(σ), k)`` (a last,
partial epoch is a post-processing of a whole one), priced by
:mod:`renyi.analysis.allocation` / :mod:`renyi.analysis.allocation_pld` (Feldman & Shenfeld
2025; Chua et al. 2024). One band and one partition is exactly DP-SGD with
:class:`~renyi.dpsgd.sampler.BallsInBinsSampler` (the same event). Wider ``C`` (BLT, tree):
b-min-sep with at most ``k`` participations per epoch, ``k · ⌈T/(m·b)⌉`` in all (no
amplification is claimed for them: the adaptive, multi-dimensional mixture of overlapping
columns has no proven dominating pair here; :mod:`renyi.analysis.allocation_correlated`
estimates what a scalar pair would give, by Monte Carlo).

``noise_multiplier`` σ is always relative to the sensitivity the analysis uses; the noise
actually drawn is ``z ~ N(0, (σ · sens · clip)²)`` in the space of ``C`` (:attr:`noise_scale`
= σ·sens per unit clipping norm), so the same σ means the same ε for every strategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from renyi._validation import check_int, check_positive, check_probability, fail
from renyi.accountants import Accountant, make_accountant
from renyi.analysis.events import (
    Event,
    GaussianEvent,
    PoissonSampledEvent,
    RandomAllocationEvent,
    SelfComposedEvent,
)
from renyi.calibration import CalibrationResult, calibrate_event_noise, calibrate_noise_multiplier
from renyi.correlated.sensitivity import Sensitivity
from renyi.correlated.strategies import Strategy

__all__ = ["SAMPLINGS", "CorrelatedPlan", "calibrate_correlated", "correlated_plan"]

Analysis = Literal["auto", "amplified", "min_sep"]
Sampling = Literal["poisson", "random-allocation"]
SAMPLINGS: tuple[str, ...] = ("poisson", "random-allocation")


@dataclass(frozen=True)
class CorrelatedPlan:
    """The privacy plan of a correlated-noise run (see the module docstring).

    Attributes:
        analysis: ``"amplified"`` or ``"min_sep"``.
        step_event: the event charged at each charge point (first step of each round for
            amplified; step 0 for min-sep, once).
        charges: how many times ``step_event`` is charged over the run.
        round_length: steps between charges (b; or T for min-sep).
        sensitivity: the sensitivity σ is relative to.
        noise_scale: σ · sensitivity — the std of ``z`` per unit clipping norm.
        sampling: ``"poisson"`` (cyclic Poisson: ``sample_rate`` = q within a partition) or
            ``"random-allocation"`` (``num_selected`` = k of ``rounds_per_epoch`` = m rounds
            per epoch; ``sample_rate`` = k/m).
    """

    analysis: str
    strategy: str
    steps: int
    partitions: int
    sample_rate: float
    noise_multiplier: float
    step_event: Event
    charges: int
    round_length: int
    sensitivity: Sensitivity
    sampling: str = "poisson"
    rounds_per_epoch: int = 1
    num_selected: int = 1

    @property
    def noise_scale(self) -> float:
        return self.noise_multiplier * self.sensitivity.value

    @property
    def event(self) -> Event:
        """The whole run as one event."""
        return SelfComposedEvent(self.step_event, self.charges)

    def charge_at(self, step: int) -> bool:
        """Whether ``step`` (0-based) starts a round, where the plan charges ``step_event``."""
        return step % self.round_length == 0 and step // self.round_length < self.charges

    def to_dict(self) -> dict[str, Any]:
        return {
            "analysis": self.analysis,
            "strategy": self.strategy,
            "steps": self.steps,
            "partitions": self.partitions,
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
            "sensitivity": self.sensitivity.value,
            "charges": self.charges,
            "step_event": self.step_event.to_dict(),
            "sampling": self.sampling,
            "rounds_per_epoch": self.rounds_per_epoch,
            "num_selected": self.num_selected,
        }


def _amplifiable(strategy: Strategy, partitions: int) -> bool:
    return strategy.bands is not None and strategy.bands <= partitions


def _check_allocation(
    t: int, b: int, rounds_per_epoch: int | None, num_selected: int
) -> tuple[int, int]:
    if rounds_per_epoch is None:
        raise fail("rounds_per_epoch", None, "an integer >= 1 for sampling='random-allocation'")
    m = check_int("rounds_per_epoch", rounds_per_epoch, 1)
    k = check_int("num_selected", num_selected, 1)
    if k > m:
        raise fail("num_selected", num_selected, f"an integer in [1, rounds_per_epoch={m}]")
    return m, k


def correlated_plan(
    strategy: Strategy,
    steps: int,
    noise_multiplier: float,
    *,
    partitions: int = 1,
    sample_rate: float = 1.0,
    analysis: Analysis = "auto",
    sampling: Sampling = "poisson",
    rounds_per_epoch: int | None = None,
    num_selected: int = 1,
) -> CorrelatedPlan:
    """The plan (event, sensitivity, noise scale) of ``strategy`` under cyclic sampling.

    ``sampling="poisson"``: cyclic Poisson with rate ``sample_rate`` within a partition.
    ``sampling="random-allocation"``: each epoch of ``rounds_per_epoch`` rounds, every record
    joins ``num_selected`` of its partition's rounds (``sample_rate`` is ignored and set to
    k/m). ``analysis="auto"``: amplified when ``C`` has at most ``partitions`` bands, else
    b-min-sep. Asking for ``"amplified"`` with a wider ``C`` is refused (the theorem does
    not apply).

    >>> from renyi.correlated.strategies import identity
    >>> p = correlated_plan(identity(), 100, 1.1, sample_rate=0.01)
    >>> p.step_event == PoissonSampledEvent(0.01, GaussianEvent(1.1)), p.charges
    (True, 100)
    >>> p = correlated_plan(identity(), 100, 1.1, sampling="random-allocation",
    ...                     rounds_per_epoch=50)
    >>> p.step_event == RandomAllocationEvent(50, GaussianEvent(1.1)), p.charges
    (True, 2)
    """
    t = check_int("steps", steps, 1)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    b = check_int("partitions", partitions, 1)
    if b > t:
        raise fail("partitions", b, f"an integer in [1, steps={t}]")
    if sampling not in SAMPLINGS:
        raise fail("sampling", sampling, f"one of {SAMPLINGS}")
    if analysis not in ("auto", "amplified", "min_sep"):
        raise fail("analysis", analysis, "'auto', 'amplified' or 'min_sep'")
    if analysis == "amplified" and not _amplifiable(strategy, b):
        raise fail(
            "analysis",
            analysis,
            f"'min_sep' for strategy {strategy.name!r} with bands={strategy.bands} > "
            f"partitions={b} (amplification needs C with at most `partitions` bands)",
        )
    amplified = analysis != "min_sep" and _amplifiable(strategy, b)
    if sampling == "random-allocation":
        m, k = _check_allocation(t, b, rounds_per_epoch, num_selected)
        epoch = m * b
        epochs = -(-t // epoch)
        q = k / m
        if amplified:
            return CorrelatedPlan(
                "amplified",
                strategy.name,
                t,
                b,
                q,
                sigma,
                RandomAllocationEvent(m, GaussianEvent(sigma), k),
                epochs,
                epoch,
                strategy.sensitivity(t, 1, 1),  # largest column norm
                sampling,
                m,
                k,
            )
        sens = strategy.sensitivity(t, b, min(k * epochs, -(-t // b)))
        return CorrelatedPlan(
            "min_sep", strategy.name, t, b, q, sigma, GaussianEvent(sigma), 1, t, sens,
            sampling, m, k,
        )  # fmt: skip
    q = check_probability("sample_rate", sample_rate)
    if q == 0.0:
        raise fail("sample_rate", sample_rate, "a number in (0, 1]")
    rounds = -(-t // b)
    if amplified:
        sens = strategy.sensitivity(t, 1, 1)  # largest column norm
        return CorrelatedPlan(
            "amplified",
            strategy.name,
            t,
            b,
            q,
            sigma,
            PoissonSampledEvent(q, GaussianEvent(sigma)),
            rounds,
            b,
            sens,
        )
    sens = strategy.sensitivity(t, b, None)
    return CorrelatedPlan(
        "min_sep", strategy.name, t, b, q, sigma, GaussianEvent(sigma), 1, t, sens
    )


def calibrate_correlated(
    target_epsilon: float,
    delta: float,
    strategy: Strategy,
    steps: int,
    *,
    partitions: int = 1,
    sample_rate: float = 1.0,
    analysis: Analysis = "auto",
    accountant: str | Accountant = "pld",
    sampling: Sampling = "poisson",
    rounds_per_epoch: int | None = None,
    num_selected: int = 1,
) -> tuple[CorrelatedPlan, CalibrationResult]:
    """The smallest σ (within 0.01%) whose plan costs at most ``target_epsilon`` at ``delta``.

    The calibration of :func:`renyi.calibration.calibrate_noise_multiplier` (verified on the
    safe side by the same accountant): amplified Poisson plans are ``⌈T/b⌉`` DP-SGD steps at
    rate q; min-sep plans one Gaussian (rate 1, one step); random-allocation plans
    :func:`renyi.calibration.calibrate_event_noise` on the epoch's event (started from the
    Poisson answer at rate k/m, which random allocation never needs more noise than by much).
    """

    def make(sigma: float, how: str) -> CorrelatedPlan:
        return correlated_plan(
            strategy,
            steps,
            sigma,
            partitions=partitions,
            sample_rate=sample_rate,
            analysis=how,  # type: ignore[arg-type]
            sampling=sampling,
            rounds_per_epoch=rounds_per_epoch,
            num_selected=num_selected,
        )

    probe = make(1.0, analysis)
    if probe.analysis == "amplified" and sampling == "random-allocation":
        guess = calibrate_noise_multiplier(
            target_epsilon, delta, probe.sample_rate, probe.charges * probe.rounds_per_epoch, "rdp"
        ).noise_multiplier

        def build(sigma: float) -> tuple[Event, int]:
            plan = make(sigma, "amplified")
            return plan.step_event, plan.charges

        cal = calibrate_event_noise(target_epsilon, delta, build, accountant, guess=guess)
    elif probe.analysis == "amplified":
        cal = calibrate_noise_multiplier(
            target_epsilon, delta, probe.sample_rate, probe.charges, accountant
        )
    else:
        cal = calibrate_noise_multiplier(target_epsilon, delta, 1.0, 1, accountant)
    sigma = cal.noise_multiplier
    for _ in range(100):  # verify the plan's own event; step σ up until the accountant agrees
        plan = make(sigma, probe.analysis)
        acc = make_accountant(accountant)
        acc.compose(plan.step_event, plan.charges)
        if acc.epsilon(delta).epsilon <= target_epsilon:
            return plan, cal
        sigma *= 1.0 + 1e-4
    raise fail("target_epsilon", target_epsilon, "a target the plan's accountant verifies")


def choose_bands(
    target_epsilon: float,
    delta: float,
    steps: int,
    dataset_size: int,
    batch_size: int,
    *,
    candidates: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
    momentum: float = 0.0,
    accountant: str | Accountant = "rdp",
) -> tuple[int, dict[int, float]]:
    """The number of bands (= partitions) with the smallest calibrated prefix-sum RMSE.

    For each candidate b (with b · batch_size ≤ n): the banded strategy optimised for the
    run's workload (:func:`~renyi.correlated.optimize.optimize_banded`), σ calibrated for the
    amplified plan (b partitions, rate b·batch/n, ⌈T/b⌉ rounds), and the RMSE of the noise in
    the running sums, σ · sens(C) · RMSE(B). b = 1 is DP-SGD, so the choice is never worse
    than DP-SGD by this measure. Returns (best b, {b: calibrated RMSE}).
    """
    from renyi.correlated.optimize import optimize_banded
    from renyi.correlated.strategies import error_summary
    from renyi.correlated.workload import prefix_coefs

    t = check_int("steps", steps, 1)
    n = check_int("dataset_size", dataset_size, 1)
    batch = check_int("batch_size", batch_size, 1)
    scores: dict[int, float] = {}
    workload = prefix_coefs(t, momentum)
    for b in candidates:
        b = check_int("candidates", b, 1)
        if b * batch > n or b > t:
            continue
        strategy = optimize_banded(t, b, workload=workload)
        plan, _ = calibrate_correlated(
            target_epsilon,
            delta,
            strategy,
            t,
            partitions=b,
            sample_rate=b * batch / n,
            analysis="amplified",
            accountant=accountant,
        )
        rmse = error_summary(strategy, t, workload=workload).rmse  # at sens(C) = col norm
        scores[b] = plan.noise_multiplier * rmse
    if not scores:
        raise fail("candidates", candidates, f"some b with b * batch_size <= n = {n}")
    return min(scores, key=lambda b: scores[b]), scores
