"""Which noise to train with: strategies compared at the calibrated noise, on the real schedule.

The error table (:mod:`renyi.correlated.table`) compares strategies at σ = 1 per unit
sensitivity; training compares them at the *same ε*, where each strategy has its own σ (its
own analysis: amplified Poisson or random allocation for banded ``C``, b-min-sep for BLT) and
its own sensitivity, and on the workload the run really has: prefix sums of the gradients
through the optimizer's momentum β and the learning-rate schedule ``η_t``
(``A[t, s] = Σ_{r=s}^{t} η_r β^{r−s}``, :func:`renyi.correlated.workload.prefix_workload`).
:func:`choose_strategy` scores each candidate by the **calibrated noise in the iterates**,

    ``score = σ(ε) · sens(C) · RMSE(A C⁻¹)``    (per unit clipping norm and learning rate),

the root mean square over steps of the noise the model carries, and applies one rule:

**DP-SGD unless a correlated strategy lowers the score by at least ``margin`` (default
10 %).** The score is a proxy (it ignores how the noise interacts with the loss surface), and
correlated noise costs partitions (fewer, larger rounds) and memory. Where correlation
cannot help, the rule ends at DP-SGD: small data (few partitions of a batch fit) and runs
long *relative to the data* at small ε — there σ is large, amplification by sampling is
linear in the rate, and b partitions (each sampled at b times DP-SGD's rate) need about √b
times its σ, which eats the cancellation over b-step blocks (measured crossover on
Fashion-MNIST sizes: ~8 epochs at ε = 1, ~50 at ε = 3; docs/correlated.md). The margin is
the size of the proxy's error measured there: below it the proxy's winner did not train
reliably better.

Banded strategies are optimised for the Toeplitz part of the workload (momentum, the number
of steps) and then *scored* with the learning-rate schedule; an optimiser for non-Toeplitz
workloads would be O(T³) (:func:`renyi.correlated.optimize.optimize_dense`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.signal
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_int, check_positive, check_range, fail
from renyi.accountants import Accountant
from renyi.correlated.accounting import SAMPLINGS, CorrelatedPlan, calibrate_correlated
from renyi.correlated.strategies import Strategy, _Toeplitz, identity
from renyi.correlated.workload import prefix_coefs

__all__ = [
    "Candidate",
    "StrategyChoice",
    "candidate_plan",
    "choose_strategy",
    "schedule_error",
]

FloatArray = NDArray[np.float64]


def _learning_rates(steps: int, learning_rates: ArrayLike | None) -> FloatArray:
    if learning_rates is None:
        return np.ones(steps)
    lr = np.asarray(learning_rates, dtype=np.float64).reshape(-1)
    if lr.size != steps or not np.all(np.isfinite(lr)) or np.any(lr <= 0):
        raise fail("learning_rates", learning_rates, f"{steps} finite positive numbers")
    return lr


def schedule_error(
    strategy: Strategy,
    steps: int,
    *,
    momentum: float = 0.0,
    learning_rates: ArrayLike | None = None,
) -> float:
    """RMSE over steps of the rows of ``B = A C⁻¹`` for the workload of SGD with heavy-ball
    ``momentum`` and per-step ``learning_rates`` (default all 1): the noise in the iterates at
    unit noise in the space of ``C``.

    O(T²) time, O(T) memory per chunk (never a T × T matrix) for Toeplitz strategies; the
    tree's dense noising matrix otherwise (T ≤ 4096).

    >>> round(schedule_error(identity(), 4), 6)  # prefix sums: rows of norm 1, √2, √3, 2
    1.581139
    """
    t = check_int("steps", steps, 1)
    beta = check_range("momentum", momentum, 0.0, 1.0, high_open=True)
    lr = _learning_rates(t, learning_rates)
    if isinstance(strategy, _Toeplitz):
        r = strategy.noising_coefs(t)
        h = scipy.signal.lfilter([1.0], [1.0, -beta], r) if beta else r  # momentum ∘ C⁻¹
        total = 0.0
        chunk = max(1, 1_000_000 // t)
        u = np.arange(t)
        for start in range(0, t, chunk):
            s = np.arange(start, min(t, start + chunk))[:, None]
            idx = s + u[None, :]  # B[t, s] = Σ_{r=s}^{t} η_r h_{r-s}
            valid = idx < t
            terms = np.where(valid, lr[np.minimum(idx, t - 1)] * h[None, :], 0.0)
            total += float(np.square(np.cumsum(terms, axis=1) * valid).sum())
        return math.sqrt(total / t)
    if t > 4096:
        raise fail("steps", steps, "at most 4096 for a non-Toeplitz strategy (dense matrix)")
    from renyi.correlated.workload import prefix_workload

    b = prefix_workload(t, beta, lr) @ strategy.noising_matrix(t)
    return math.sqrt(float(np.square(b).sum()) / t)


@dataclass(frozen=True)
class Candidate:
    """One candidate: its kind (``dpsgd``, ``banded``, ``blt``), strategy, calibrated plan
    and score (calibrated noise in the iterates, :func:`choose_strategy`)."""

    noise: str
    strategy: Strategy
    plan: CorrelatedPlan
    error: float  # schedule_error(strategy): RMSE of A C⁻¹ at unit noise
    score: float  # plan.noise_scale * error

    def to_dict(self) -> dict[str, Any]:
        return {
            "noise": self.noise,
            "bands": self.strategy.bands,
            "partitions": self.plan.partitions,
            "analysis": self.plan.analysis,
            "noise_multiplier": self.plan.noise_multiplier,
            "sensitivity": self.plan.sensitivity.value,
            "error": self.error,
            "score": self.score,
        }


@dataclass(frozen=True)
class StrategyChoice:
    """What :func:`choose_strategy` picked, why, and every candidate it scored."""

    best: Candidate
    dpsgd: Candidate
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.best.to_dict(),
            "reason": self.reason,
            "candidates": [c.to_dict() for c in self.candidates],
        }


def _allocation_rounds(n: int, partitions: int, batch: int) -> int:
    return max(1, n // (partitions * batch))


def candidate_plan(
    noise: str,
    strategy: Strategy,
    target_epsilon: float,
    delta: float,
    steps: int,
    dataset_size: int,
    batch_size: int,
    *,
    partitions: int,
    sampling: str,
    accountant: str | Accountant,
    proxy: bool = False,
) -> CorrelatedPlan:
    """The calibrated plan of one candidate (the sampler make_private_correlated builds).

    ``proxy=True`` prices a random-allocation candidate as cyclic Poisson at the same rate
    k/m (a fast stand-in for scoring: random allocation needs about as much noise, a little
    less when the rounds per epoch are many; its own PLD calibration takes seconds)."""
    if sampling == "random-allocation" and not proxy:
        m = (
            1
            if noise in ("blt", "tree")
            else _allocation_rounds(dataset_size, partitions, batch_size)
        )
        plan, _ = calibrate_correlated(
            target_epsilon,
            delta,
            strategy,
            steps,
            partitions=partitions,
            accountant=accountant,
            sampling="random-allocation",
            rounds_per_epoch=m,
        )
        return plan
    rate = 1.0 if noise in ("blt", "tree") else min(1.0, partitions * batch_size / dataset_size)
    if sampling == "random-allocation" and noise not in ("blt", "tree"):  # Poisson at k/m
        rate = 1.0 / _allocation_rounds(dataset_size, partitions, batch_size)
    plan, _ = calibrate_correlated(
        target_epsilon,
        delta,
        strategy,
        steps,
        partitions=partitions,
        sample_rate=rate,
        accountant=accountant,
    )
    return plan


def choose_strategy(
    target_epsilon: float,
    delta: float,
    steps: int,
    dataset_size: int,
    batch_size: int,
    *,
    sampling: str = "poisson",
    momentum: float = 0.0,
    learning_rates: ArrayLike | None = None,
    kinds: tuple[str, ...] = ("dpsgd", "banded", "blt"),
    bands: tuple[int, ...] = (2, 4, 8, 16, 32, 64),
    buffers: int = 3,
    margin: float = 0.1,
    accountant: str | Accountant = "pld",
) -> StrategyChoice:
    """The noise to train with at ``target_epsilon``: the candidate with the smallest
    calibrated noise in the iterates, if it beats DP-SGD's by at least ``margin``; else
    DP-SGD (module docstring).

    Candidates: DP-SGD; banded with b bands = b partitions for each b in ``bands`` with
    ``b · batch_size ≤ n`` (amplified: Poisson at rate b·B/n, or random allocation over
    ``⌊n/(b·B)⌋`` rounds per epoch); BLT with ``buffers`` buffers over ``⌊n/B⌋`` fixed
    partitions (b-min-sep). ``accountant`` calibrates the candidates; random-allocation
    candidates are scored as cyclic Poisson at the same rate (``candidate_plan(proxy=True)``)
    and the chosen one is recalibrated by the training's own analysis.

    >>> c = choose_strategy(3.0, 1e-5, 40, 1000, 100, kinds=("dpsgd", "banded"), bands=(2,),
    ...                     accountant="rdp")
    >>> c.best.noise  # 1000 records: 2 bands lower the noise by 4 % only
    'dpsgd'
    """
    from renyi.correlated.optimize import optimize_banded, optimize_blt

    eps = check_positive("target_epsilon", target_epsilon)
    t = check_int("steps", steps, 1)
    n = check_int("dataset_size", dataset_size, 1)
    batch = check_int("batch_size", batch_size, 1)
    if batch > n:
        raise fail("batch_size", batch_size, f"an integer in [1, dataset_size={n}]")
    if sampling not in SAMPLINGS:
        raise fail("sampling", sampling, f"one of {SAMPLINGS}")
    margin = check_range("margin", margin, 0.0, 1.0, high_open=True)
    for kind in kinds:
        if kind not in ("dpsgd", "banded", "blt"):
            raise fail("kinds", kinds, "names among 'dpsgd', 'banded', 'blt'")
    lr = _learning_rates(t, learning_rates)
    workload = prefix_coefs(t, momentum)
    options: list[tuple[str, Strategy, int]] = [("dpsgd", identity(), 1)]
    if "banded" in kinds:
        for b in sorted(set(bands)):
            b = check_int("bands", b, 2)
            if b * batch <= n and b <= t:
                options.append(("banded", optimize_banded(t, b, workload=workload), b))
    if "blt" in kinds and n // batch >= 1:
        parts = min(max(1, n // batch), t)
        blt = optimize_blt(
            t, buffers, min_sep=parts, max_participations=-(-t // parts), workload=workload
        )
        options.append(("blt", blt, parts))
    scored: list[Candidate] = []
    for noise, strategy, parts in options:
        plan = candidate_plan(
            noise, strategy, eps, delta, t, n, batch,
            partitions=parts, sampling=sampling, accountant=accountant, proxy=True,
        )  # fmt: skip
        err = schedule_error(strategy, t, momentum=momentum, learning_rates=lr)
        scored.append(Candidate(noise, strategy, plan, err, plan.noise_scale * err))
    dpsgd = scored[0]
    best = min(scored, key=lambda c: c.score)
    if best is dpsgd:
        reason = "DP-SGD has the smallest calibrated noise in the iterates"
    elif best.score > (1.0 - margin) * dpsgd.score:
        reason = (
            f"{best.noise} (b={best.plan.partitions}) lowers the calibrated noise by only "
            f"{100 * (1 - best.score / dpsgd.score):.1f}% < margin {100 * margin:.0f}%: DP-SGD"
        )
        best = dpsgd
    else:
        reason = (
            f"{best.noise} (b={best.plan.partitions}) lowers the calibrated noise in the "
            f"iterates by {100 * (1 - best.score / dpsgd.score):.1f}% (>= margin "
            f"{100 * margin:.0f}%)"
        )
    return StrategyChoice(best, dpsgd, tuple(scored), reason)
