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

``noise_multiplier`` σ is always relative to the sensitivity the analysis uses; the noise
actually drawn is ``z ~ N(0, (σ · sens · clip)²)`` in the space of ``C`` (:attr:`noise_scale`
= σ·sens per unit clipping norm), so the same σ means the same ε for every strategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from renyi._validation import check_int, check_positive, check_probability, fail
from renyi.accountants import Accountant, make_accountant
from renyi.analysis.events import Event, GaussianEvent, PoissonSampledEvent, SelfComposedEvent
from renyi.calibration import CalibrationResult, calibrate_noise_multiplier
from renyi.correlated.sensitivity import Sensitivity
from renyi.correlated.strategies import Strategy

__all__ = ["CorrelatedPlan", "calibrate_correlated", "correlated_plan"]

Analysis = Literal["auto", "amplified", "min_sep"]


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
        }


def _amplifiable(strategy: Strategy, partitions: int) -> bool:
    return strategy.bands is not None and strategy.bands <= partitions


def correlated_plan(
    strategy: Strategy,
    steps: int,
    noise_multiplier: float,
    *,
    partitions: int = 1,
    sample_rate: float = 1.0,
    analysis: Analysis = "auto",
) -> CorrelatedPlan:
    """The plan (event, sensitivity, noise scale) of ``strategy`` under cyclic Poisson sampling.

    ``analysis="auto"``: amplified when ``C`` has at most ``partitions`` bands, else b-min-sep.
    Asking for ``"amplified"`` with a wider ``C`` is refused (the theorem does not apply).

    >>> from renyi.correlated.strategies import identity
    >>> p = correlated_plan(identity(), 100, 1.1, sample_rate=0.01)
    >>> p.step_event == PoissonSampledEvent(0.01, GaussianEvent(1.1)), p.charges
    (True, 100)
    """
    t = check_int("steps", steps, 1)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    b = check_int("partitions", partitions, 1)
    if b > t:
        raise fail("partitions", b, f"an integer in [1, steps={t}]")
    q = check_probability("sample_rate", sample_rate)
    if q == 0.0:
        raise fail("sample_rate", sample_rate, "a number in (0, 1]")
    if analysis not in ("auto", "amplified", "min_sep"):
        raise fail("analysis", analysis, "'auto', 'amplified' or 'min_sep'")
    rounds = -(-t // b)
    if analysis == "amplified" and not _amplifiable(strategy, b):
        raise fail(
            "analysis",
            analysis,
            f"'min_sep' for strategy {strategy.name!r} with bands={strategy.bands} > "
            f"partitions={b} (amplification needs C with at most `partitions` bands)",
        )
    if analysis != "min_sep" and _amplifiable(strategy, b):
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
) -> tuple[CorrelatedPlan, CalibrationResult]:
    """The smallest σ (within 0.01%) whose plan costs at most ``target_epsilon`` at ``delta``.

    The calibration of :func:`renyi.calibration.calibrate_noise_multiplier` (verified on the
    safe side by the same accountant): amplified plans are ``⌈T/b⌉`` DP-SGD steps at rate q;
    min-sep plans one Gaussian (rate 1, one step).
    """
    probe = correlated_plan(
        strategy, steps, 1.0, partitions=partitions, sample_rate=sample_rate, analysis=analysis
    )
    if probe.analysis == "amplified":
        cal = calibrate_noise_multiplier(
            target_epsilon, delta, probe.sample_rate, probe.charges, accountant
        )
    else:
        cal = calibrate_noise_multiplier(target_epsilon, delta, 1.0, 1, accountant)
    sigma = cal.noise_multiplier
    for _ in range(100):  # verify the plan's own event; step σ up until the accountant agrees
        plan = correlated_plan(
            strategy,
            steps,
            sigma,
            partitions=partitions,
            sample_rate=sample_rate,
            analysis=probe.analysis,  # type: ignore[arg-type]
        )
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
