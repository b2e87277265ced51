"""Correlated-noise private training in PyTorch: DP-FTRL (tree), banded MF and BLT.

The same clip → noise → scale → account → step pipeline as DP-SGD
(:class:`~renyi.dpsgd.optimizer.DPOptimizer`: same clipping engine, same secure noise
source, same budget gate), with one change: the fresh standard normal vector of each step
goes through the strategy's bounded-memory filter (:mod:`renyi.correlated.streaming`) before
it is scaled and added, so step t adds row t of ``C⁻¹ Z`` and the noise cancels in the
running sums the model depends on (Kairouz et al. 2021; Choquette-Choo et al. 2023;
Dvijotham et al. 2024).

Batches come from :class:`CyclicPoissonSampler`: every record is assigned once, at random, to
one of b partitions; step t uses partition ``t mod b`` and keeps each of its records with
probability q. The privacy plan (:func:`renyi.correlated.accounting.correlated_plan`) is
charged at the first step of each round of b steps (amplified banded: one Poisson-subsampled
Gaussian per round) or once at step 0 (b-min-sep: one Gaussian for the whole run); the
budget hook is asked before each charge, and steps beyond the plan are refused.

Guarantee: training for at most ``plan.steps`` steps with the returned loader and
optimizer is (ε, δ)-DP (add/remove neighbours) for the ε the accountant reports for
``plan.event``.

The fresh normals of step t are those of counter ``(0, t)`` of a
:class:`renyi.noise.CounterNoise` (a fresh OS key per run; ``counter_noise=`` to give one;
with ``seed=`` a key derived from the seed). Every release is exact
(:meth:`renyi.noise.CounterNoise.snap_combination`): its lattice index is that of the ideal
mechanism ``round(x/g + s·sens·Σ_j R[t, j] Z_j)`` for the ideal normals of the counters' bits
and the exact ``R`` of the strategy's coefficients (:mod:`renyi.correlated.exactness`,
docs/correlated.md "Exactness"). With ``counter_noise`` given, the banded-inverse strategy
(``noise="banded_inverse"``) regenerates its past draws and keeps no noise vectors.

Checkpoints (:meth:`CorrelatedOptimizer.state_dict`) carry the filter's state — past noise
vectors —, the key and the filter's error record. Keep them as secret as the data: whoever
holds them can cancel the noise.

Example:
    >>> import torch
    >>> from renyi.dpsgd.data import load_digits
    >>> train, _ = load_digits()
    >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    >>> private = make_private_correlated(model, torch.optim.SGD(model.parameters(), lr=1.0),
    ...     train, loss_fn=torch.nn.CrossEntropyLoss(), target_epsilon=3.0, delta=1e-5,
    ...     epochs=2, batch_size=64, max_grad_norm=1.0, noise="banded", bands=4
    ... )  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from numpy.typing import ArrayLike
from torch.utils.data import Dataset

from renyi._validation import check_delta, check_int, check_positive, fail
from renyi.analysis.events import (
    Event,
    GaussianEvent,
    Neighbouring,
    PoissonSampledEvent,
    RandomAllocationEvent,
)
from renyi.calibration import CalibrationResult, epochs_to_steps
from renyi.correlated.accounting import (
    CorrelatedPlan,
    calibrate_correlated,
    correlated_plan,
)
from renyi.correlated.exactness import filter_exactness
from renyi.correlated.optimize import optimize_banded, optimize_blt
from renyi.correlated.strategies import Strategy, TreeStrategy, bisr, identity
from renyi.correlated.streaming import _Identity, streaming_noise
from renyi.correlated.workload import prefix_coefs
from renyi.dpsgd.optimizer import BudgetHook, ClippingEngine, DPOptimizer, PlanExceededError
from renyi.dpsgd.privacy import PrivateTraining, private_data_loader
from renyi.dpsgd.sampler import (
    SeededRandomSource,
    TorchRandomSource,
    _PrivacySamplerBase,
    checked_random_source,
    make_random_source,
)

__all__ = [
    "NOISE_KINDS",
    "CorrelatedOptimizer",
    "CyclicAllocationSampler",
    "CyclicPoissonSampler",
    "make_private_correlated",
]

NoiseKind = Literal["dpsgd", "tree", "banded", "blt", "banded_inverse", "auto"]
NOISE_KINDS: tuple[str, ...] = ("dpsgd", "tree", "banded", "blt", "banded_inverse", "auto")


class CyclicPoissonSampler(_PrivacySamplerBase):
    """Cyclic Poisson sampling (Choquette-Choo et al. 2023): b random partitions, step t
    uses partition ``t mod b``, each of its records joining with probability q.

    Each record's partition is drawn once, independently and uniformly, at construction
    (so adding or removing one record changes no other record's partition). With one
    partition this is :class:`~renyi.dpsgd.sampler.PoissonSampler`, uniform for uniform.

    Args:
        num_samples: n.
        partitions: b ≥ 1.
        sample_rate: q in (0, 1], the rate *within* a partition (expected batch q·n/b).
        steps: batches per pass.
    """

    def __init__(
        self,
        num_samples: int,
        partitions: int,
        sample_rate: float,
        steps: int,
        *,
        random_source: TorchRandomSource | None = None,
    ) -> None:
        from renyi._validation import check_range

        self.num_samples = check_int("num_samples", num_samples, 1)
        self.partitions = check_int("partitions", partitions, 1)
        self.sample_rate = check_range("sample_rate", sample_rate, 0.0, 1.0, low_open=True)
        self.steps = check_int("steps", steps, 1)
        self.random_source = checked_random_source(random_source)  # the noise's rules
        self._position = 0
        self.assignment: torch.Tensor | None = None
        if self.partitions > 1:
            u = self.random_source.uniform(self.num_samples)
            self.assignment = torch.clamp((u * self.partitions).floor().long(), max=partitions - 1)

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.ADD_REMOVE

    @property
    def expected_batch_size(self) -> float:
        """q·n/b, the fixed divisor of the noisy sum (never the realised size)."""
        return self.sample_rate * self.num_samples / self.partitions

    def accounting_event(self, noise_multiplier: float) -> Event:
        """One round: ``PoissonSampledEvent(q, GaussianEvent(noise_multiplier))``."""
        return PoissonSampledEvent(self.sample_rate, GaussianEvent(noise_multiplier))

    def _draw(self) -> torch.Tensor:
        keep = self.random_source.uniform(self.num_samples) < self.sample_rate
        if self.assignment is not None:
            keep &= self.assignment == self._position % self.partitions
        return torch.nonzero(keep).flatten()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["assignment"] = None if self.assignment is None else self.assignment.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assignment = state.get("assignment")
        if (assignment is None) != (self.assignment is None) or (
            assignment is not None and tuple(assignment.shape) != (self.num_samples,)
        ):
            raise fail("state['assignment']", "checkpoint", "the partitions of this sampler")
        super().load_state_dict(state)
        if assignment is not None:
            self.assignment = assignment.clone().long()


class CyclicAllocationSampler(_PrivacySamplerBase):
    """Cyclic random allocation ("balls in bins" with b partitions): every record is assigned
    once, at random, to one of b partitions; the run is cut into epochs of ``m`` rounds of b
    steps, step ``t`` uses partition ``t mod b``, and in each epoch every record joins exactly
    ``k`` of the ``m`` steps of its partition, chosen uniformly and independently of the
    other records (:mod:`renyi.correlated.accounting`).

    With one partition and ``k = 1`` this is :class:`~renyi.dpsgd.sampler.BallsInBinsSampler`
    with ``m`` batches per epoch. Expected batch ``k·n/(m·b)`` (the fixed divisor).
    Resume is at epoch boundaries only (an epoch's allocation is not saved).

    Args:
        num_samples: n.
        partitions: b ≥ 1.
        rounds_per_epoch: m ≥ 1 (an epoch is ``m · b`` steps).
        steps: batches per pass.
        num_selected: k in [1, m], rounds per epoch each record joins.

    Example:
        >>> s = CyclicAllocationSampler(40, 2, 5, 10)
        >>> sorted(i for batch in s for i in batch) == list(range(40))
        True
    """

    sampling = "random-allocation"

    def __init__(
        self,
        num_samples: int,
        partitions: int,
        rounds_per_epoch: int,
        steps: int,
        *,
        num_selected: int = 1,
        random_source: TorchRandomSource | None = None,
    ) -> None:
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.partitions = check_int("partitions", partitions, 1)
        self.rounds_per_epoch = check_int("rounds_per_epoch", rounds_per_epoch, 1)
        self.num_selected = check_int("num_selected", num_selected, 1)
        if self.num_selected > self.rounds_per_epoch:
            raise fail("num_selected", num_selected, f"an integer in [1, {rounds_per_epoch}]")
        self.steps = check_int("steps", steps, 1)
        self.random_source = checked_random_source(random_source)  # the noise's rules
        self._position = 0
        self._served = 0
        self._epoch: list[torch.Tensor] = []
        self.assignment: torch.Tensor | None = None
        if self.partitions > 1:
            u = self.random_source.uniform(self.num_samples)
            self.assignment = torch.clamp((u * self.partitions).floor().long(), max=partitions - 1)

    @property
    def steps_per_epoch(self) -> int:
        return self.rounds_per_epoch * self.partitions

    @property
    def sample_rate(self) -> float:  # type: ignore[override]
        """k/m: the fraction of a partition in one of its steps (descriptive)."""
        return self.num_selected / self.rounds_per_epoch

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.ADD_REMOVE

    @property
    def expected_batch_size(self) -> float:
        """k·n/(m·b), the fixed divisor of the noisy sum (never the realised size)."""
        return self.num_selected * self.num_samples / self.steps_per_epoch

    def accounting_event(self, noise_multiplier: float) -> Event:
        """One epoch of one partition: ``RandomAllocationEvent(m, GaussianEvent(σ), k)``."""
        return RandomAllocationEvent(
            self.rounds_per_epoch, GaussianEvent(noise_multiplier), self.num_selected
        )

    def _new_epoch(self) -> list[torch.Tensor]:
        n, m, k, b = self.num_samples, self.rounds_per_epoch, self.num_selected, self.partitions
        if k == 1:
            rounds = torch.clamp((self.random_source.uniform(n) * m).long(), max=m - 1)[:, None]
        else:  # a uniform k-subset of the m rounds per record: the k smallest of m uniforms
            u = self.random_source.uniform(n * m).reshape(n, m)
            rounds = torch.argsort(u, dim=1)[:, :k]
        part = torch.zeros(n, dtype=torch.long) if self.assignment is None else self.assignment
        slot = (rounds * b + part[:, None]).reshape(-1)  # step within the epoch
        record = torch.arange(n).repeat_interleave(rounds.shape[1])
        order = torch.argsort(slot, stable=True)
        counts = torch.bincount(slot, minlength=m * b).tolist()
        return [torch.sort(x).values for x in torch.split(record[order], counts)]

    def _draw(self) -> torch.Tensor:
        j = self._served % self.steps_per_epoch
        if j == 0:
            self._epoch = self._new_epoch()
        elif not self._epoch:  # pragma: no cover - load_state_dict refuses mid-epoch states
            raise fail("sampler state", "mid-epoch", "an epoch boundary")
        self._served += 1
        return self._epoch[j]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["served"] = self._served
        state["assignment"] = None if self.assignment is None else self.assignment.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        served = check_int("state['served']", state.get("served"), 0)
        if served % self.steps_per_epoch:
            raise fail("state['served']", served, "an epoch boundary (multiple of m·b)")
        assignment = state.get("assignment")
        if (assignment is None) != (self.assignment is None) or (
            assignment is not None and tuple(assignment.shape) != (self.num_samples,)
        ):
            raise fail("state['assignment']", "checkpoint", "the partitions of this sampler")
        super().load_state_dict(state)
        self._served = served
        self._epoch = []
        if assignment is not None:
            self.assignment = assignment.clone().long()


class CorrelatedOptimizer(DPOptimizer):
    """:class:`~renyi.dpsgd.optimizer.DPOptimizer` adding correlated noise ``C⁻¹ z``.

    Args:
        optimizer, model, loss_fn, max_grad_norm, accountant, random_source,
        max_physical_batch_size, clipping, grad_mode, engine, budget: as for DPOptimizer.
        strategy: the (streamable) strategy ``C``.
        plan: its privacy plan (:func:`renyi.correlated.accounting.correlated_plan`), whose
            noise multiplier and steps this optimizer follows.
        sampler: the :class:`CyclicPoissonSampler` the plan was made for.
        counter_noise: the :class:`renyi.noise.CounterNoise` whose counters ``(0, t)`` give
            step t's fresh normals (default: a fresh OS key; a seed-derived key with a seeded
            ``random_source``). Its key is in every checkpoint: keep them secret.
        regenerate: banded inverse only: regenerate the past draws from the counters instead
            of storing them (default: when ``counter_noise`` is given).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        model: torch.nn.Module,
        loss_fn: Callable[..., torch.Tensor],
        max_grad_norm: float,
        sampler: CyclicPoissonSampler | CyclicAllocationSampler,
        strategy: Strategy,
        plan: CorrelatedPlan,
        accountant: Any = "pld",
        random_source: Any = None,
        max_physical_batch_size: int | None = None,
        clipping: str = "flat",
        grad_mode: str = "auto",
        engine: ClippingEngine | None = None,
        budget: BudgetHook | None = None,
        counter_noise: Any = None,
        regenerate: bool | None = None,
    ) -> None:
        mine: tuple[Any, ...]
        theirs: tuple[Any, ...]
        if isinstance(sampler, CyclicAllocationSampler):
            mine = ("random-allocation", sampler.partitions, sampler.rounds_per_epoch,
                    sampler.num_selected, sampler.steps)  # fmt: skip
            theirs = (plan.sampling, plan.partitions, plan.rounds_per_epoch, plan.num_selected,
                      plan.steps)  # fmt: skip
            what = "(sampling, partitions, rounds_per_epoch, num_selected, steps)"
        elif isinstance(sampler, CyclicPoissonSampler):
            mine = ("poisson", sampler.partitions, sampler.sample_rate, sampler.steps)
            theirs = (plan.sampling, plan.partitions, plan.sample_rate, plan.steps)
            what = "(sampling, partitions, sample_rate, steps)"
        else:
            raise fail(
                "sampler",
                type(sampler).__name__,
                "a CyclicPoissonSampler or CyclicAllocationSampler",
            )
        if mine != theirs:
            raise fail("plan", theirs, f"the sampler's {what} = {mine}")
        if plan.strategy != strategy.name:
            raise fail("plan.strategy", plan.strategy, f"{strategy.name!r} (the strategy's)")
        user_counter = counter_noise is not None
        self._regenerate = bool(user_counter if regenerate is None else regenerate)
        self.noise = streaming_noise(strategy)  # rebuilt once the parameters are known
        super().__init__(
            optimizer,
            model=model,
            loss_fn=loss_fn,
            noise_multiplier=plan.noise_multiplier,
            max_grad_norm=max_grad_norm,
            sampler=sampler,
            accountant=accountant,
            random_source=random_source,
            max_physical_batch_size=max_physical_batch_size,
            clipping=clipping,
            grad_mode=grad_mode,
            engine=engine,
            budget=budget,
        )
        self.strategy = strategy
        self.plan = plan
        self.event = plan.step_event
        self._sensitivity = plan.sensitivity.value
        from renyi.noise import CounterNoise

        if counter_noise is None:
            counter_noise = _counter_for(self.random_source)
        elif not isinstance(counter_noise, CounterNoise):
            raise fail("counter_noise", type(counter_noise).__name__, "a CounterNoise")
        self.counter_noise: CounterNoise = counter_noise
        #: Error bounds and exact rows of the noise filter (None for the identity).
        self.exactness = filter_exactness(strategy)
        if self._regenerate:
            self.noise = streaming_noise(strategy, regenerate=self._fresh)

    def _fresh(self, step: int) -> torch.Tensor:
        """``z_step``: the fresh standard normals of noise step ``step`` from the counter."""
        total = sum(p.numel() for p in self._params)
        z = self.counter_noise.standard_normal((total,), stream=0, step=step)
        return torch.from_numpy(z)

    def _releases_fresh_noise(self) -> bool:
        """Identity noise of sensitivity 1 is DP-SGD's: released exactly by renyi.noise (the
        identity filter keeps nothing; only its step counter moves)."""
        if isinstance(self.noise, _Identity) and self._sensitivity == 1.0:
            self.noise.step += 1
            return True
        return False

    def _next_noise(self) -> tuple[torch.Tensor, float, int]:
        """``(ŷ_t, B_t, t)``: the filter's float64 row t of ``C⁻¹ Z`` from the fresh normals of
        counter ``(stream 0, step t)``, and its proven error bound (:mod:`renyi.correlated.
        exactness`)."""
        t = self.noise.step
        total = sum(p.numel() for p in self._params)
        z, err = self.counter_noise.standard_normal((total,), stream=0, step=t, with_bound=True)
        zmax = max(float(z.max()), -float(z.min())) if total else 0.0
        y = self.noise.next(torch.from_numpy(z))
        bound = math.inf
        if self.exactness is not None:
            lo, hi = torch.aminmax(y) if total else (y.new_zeros(()), y.new_zeros(()))
            ymax = max(float(hi), -float(lo))
            bound = self.exactness.observe(t, err, zmax, ymax)
        return y, bound, t

    def draw_noise(self) -> torch.Tensor:
        """Row t of ``C⁻¹ Z`` times the sensitivity, as floats (one fresh N(0, I) draw per
        step, from ``counter_noise`` at ``(stream 0, step t)``; the banded-inverse filter
        regenerates the past draws when asked to). Not for release on its own: the optimizer
        releases through :meth:`release_noisy_sum`, exactly."""
        y, _, _ = self._next_noise()
        if self._sensitivity != 1.0:
            y.mul_(self._sensitivity)
        return y

    def release_noisy_sum(self, flat: torch.Tensor) -> torch.Tensor:
        """``flat + σ·C·sens·(C⁻¹ Z)_t`` on the lattice, with the **ideal** index: the filter's
        float64 row is accepted where it is provably far from a rounding boundary and the
        rest is recomputed from the counters
        (:meth:`renyi.noise.CounterNoise.snap_combination`; docs/correlated.md,
        "Exactness")."""
        from renyi import noise

        std = self.noise_std()
        if type(self).draw_noise is not CorrelatedOptimizer.draw_noise or "draw_noise" in vars(
            self
        ):  # a patched noise shaper: the caller's floats, released through snap
            return noise.snap(flat, self.draw_noise(), std)
        if self._releases_fresh_noise():
            return noise.gaussian(flat, std, rng=self.random_source)
        if self.exactness is None:  # identity with another sensitivity: one Gaussian
            t = self.noise.step
            self.noise.step += 1
            return self.counter_noise.gaussian(flat, std * self._sensitivity, stream=0, step=t)
        y, bound, t = self._next_noise()
        exact = self.exactness
        return self.counter_noise.snap_combination(
            flat,
            y,
            std,
            error_bound=bound,
            row=lambda bits: exact.row(t, bits),
            stream=0,
            scale=self._sensitivity,
        )

    def event_at(self, step: int) -> Event | None:
        """``plan.step_event`` at the steps where the plan charges (a round's first step, or
        step 0), None elsewhere; the budget hook is asked only there."""
        return self.event if self.plan.charge_at(step) else None

    def _check_plan(self) -> None:
        """Refuse a step past the plan: its noise would be charged to nobody (no opt-out)."""
        if self.steps_taken >= self.plan.steps:
            raise PlanExceededError(
                f"step {self.steps_taken + 1} refused: the correlated-noise plan covers "
                f"{self.plan.steps} steps (its rounds, sensitivity and σ are fixed for that "
                "many); nothing was released"
            )

    def state_dict(self) -> dict[str, Any]:
        """DPOptimizer's state + the plan + the noise filter's state (secret: past noise)."""
        state = super().state_dict()
        state["correlated"] = {
            "plan": self.plan.to_dict(),
            "strategy": self.strategy.to_dict(),
            "noise": self.noise.state_dict(),
            "counter": self.counter_noise.state_dict(),
            "exactness": None if self.exactness is None else self.exactness.state_dict(),
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; refuses another plan or strategy."""
        saved = state.get("correlated")
        if not isinstance(saved, dict):
            raise fail("checkpoint", "DP-SGD state", "a CorrelatedOptimizer checkpoint")
        for key, mine in (("plan", self.plan.to_dict()), ("strategy", self.strategy.to_dict())):
            if saved[key] != mine:
                raise fail(f"checkpoint {key}", saved[key], f"{mine!r} (this optimizer's)")
        if saved["noise"]["step"] != state["steps_taken"]:
            raise fail("checkpoint noise step", saved["noise"]["step"], "equal to steps_taken")
        if saved.get("counter") is None:
            raise fail("checkpoint counter", None, "the counter-noise key of the run")
        if (saved.get("exactness") is None) != (self.exactness is None):
            raise fail("checkpoint exactness", saved.get("exactness") is not None,
                       "the error-bound record of this strategy's noise")  # fmt: skip
        from renyi.noise import CounterNoise

        counter = CounterNoise.from_state_dict(saved["counter"])
        super().load_state_dict(state)
        self.noise.load_state_dict(saved["noise"])
        self.counter_noise = counter
        if self.exactness is not None:
            self.exactness.load_state_dict(saved["exactness"])
            if self.exactness.steps != saved["noise"]["step"]:
                raise fail("checkpoint exactness", self.exactness.steps, "one record per step")


def _counter_for(source: Any) -> Any:
    """The run's :class:`~renyi.noise.CounterNoise`: a fresh OS key with the secure source; with
    a seeded source (``seed=``, reproducible and insecure: it warns) a key derived from its
    seed, so seeded runs repeat their noise without drawing from the sampling stream."""
    from renyi.noise import CounterNoise

    if type(source) is SeededRandomSource:
        seed = int(source.generator.initial_seed())
        return CounterNoise(hashlib.sha256(b"renyi.correlated.seed:%d" % seed).digest())
    return CounterNoise()


def _strategy(
    noise: str,
    steps: int,
    *,
    bands: int | None,
    buffers: int,
    partitions: int,
    rounds: int,
    momentum: float,
) -> Strategy:
    workload = prefix_coefs(steps, momentum)
    if noise == "dpsgd":
        return identity()
    if noise == "tree":
        return TreeStrategy()
    if noise == "banded":
        return optimize_banded(steps, bands or partitions, workload=workload)
    if noise == "banded_inverse":
        return bisr(bands or 4, momentum)
    return optimize_blt(
        steps, buffers, min_sep=partitions, max_participations=rounds, workload=workload
    )


def make_private_correlated(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Dataset[Any] | Sequence[Any],
    *,
    loss_fn: Callable[..., torch.Tensor],
    delta: float,
    batch_size: int,
    max_grad_norm: float,
    noise: NoiseKind = "banded",
    bands: int | None = None,
    buffers: int = 3,
    strategy: Strategy | None = None,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    epochs: float | None = None,
    steps: int | None = None,
    sampling: str = "poisson",
    num_selected: int = 1,
    learning_rates: ArrayLike | None = None,
    margin: float = 0.1,
    accountant: str = "pld",
    seed: int | None = None,
    max_physical_batch_size: int | None = None,
    clipping: str = "flat",
    grad_mode: str = "auto",
    engine: ClippingEngine | None = None,
    budget: BudgetHook | None = None,
    counter_noise: Any = None,
) -> PrivateTraining:
    """Like :func:`~renyi.dpsgd.privacy.make_private`, with correlated noise.

    ``noise``:

    * ``"dpsgd"`` — independent noise, one partition: exactly DP-SGD (same event, same
      draws) with Poisson sampling at rate ``batch_size / n``, or with
      ``sampling="random-allocation"`` DP-SGD's balls in bins (``n // batch_size`` batches
      per epoch, :class:`~renyi.dpsgd.sampler.BallsInBinsSampler`'s event).
    * ``"banded"`` — banded Toeplitz ``C`` with ``bands`` bands, optimised for the run's
      workload (prefix sums with the optimizer's momentum), over ``bands`` random partitions:
      the amplified analysis, with Poisson rate ``bands · batch_size / n`` inside each
      partition, or random allocation (``sampling="random-allocation"``: each epoch every
      record joins ``num_selected`` of the ``⌊num_selected · n / (bands · batch_size)⌋``
      steps of its partition). ``bands=None`` with a target ε applies the rule of
      :func:`renyi.correlated.choice.choose_strategy` to DP-SGD and banded candidates (the
      smallest calibrated noise in the iterates under momentum and ``learning_rates``, the
      per-step learning-rate multipliers of your schedule; DP-SGD unless a banded strategy
      beats it by ``margin``); without a target, 4 bands.
    * ``"blt"`` / ``"tree"`` — BLT with ``buffers`` buffers (optimised for the run) or the
      online tree; one pass over the data per epoch in ``n / batch_size`` fixed random
      partitions (every record once per epoch, b-min-sep with b = steps per epoch): one
      Gaussian with the strategy's multi-participation sensitivity. Both samplings give
      this sampler (it is random allocation with one round per epoch).
    * ``"banded_inverse"`` — ``C⁻¹`` with ``bands`` bands (default 4), the banded inverse
      square root of the workload (BISR, :func:`renyi.correlated.strategies.bisr`), sampled
      and accounted as BLT; with ``counter_noise`` (a :class:`renyi.noise.CounterNoise`) the
      optimiser keeps no past noise (it regenerates it: b draws per step).
    * ``"auto"`` — :func:`~renyi.correlated.choice.choose_strategy` over DP-SGD, banded and
      BLT (needs ``target_epsilon``).

    ``strategy`` overrides the choice of ``C`` (its bands decide the analysis). The
    returned :class:`~renyi.dpsgd.privacy.PrivateTraining` has ``extra["plan"]``,
    ``extra["strategy"]`` and ``extra["choice"]`` (the scored candidates, when chosen);
    its ``sample_rate`` is the fraction of the data per step.
    """
    from renyi.correlated.accounting import SAMPLINGS
    from renyi.correlated.choice import StrategyChoice, choose_strategy

    delta = check_delta(delta)
    max_grad_norm = check_positive("max_grad_norm", max_grad_norm)
    n = check_int("len(data)", len(data), 1)  # type: ignore[arg-type]
    batch_size = check_int("batch_size", batch_size, 1)
    if batch_size > n:
        raise fail("batch_size", batch_size, f"an integer in [1, len(data)={n}]")
    if noise not in NOISE_KINDS:
        raise fail("noise", noise, f"one of {NOISE_KINDS}")
    if sampling not in SAMPLINGS:
        raise fail("sampling", sampling, f"one of {SAMPLINGS}")
    num_selected = check_int("num_selected", num_selected, 1)
    if (epochs is None) == (steps is None):
        raise fail("epochs/steps", (epochs, steps), "exactly one of epochs or steps")
    if (target_epsilon is None) == (noise_multiplier is None):
        raise fail(
            "target_epsilon/noise_multiplier",
            (target_epsilon, noise_multiplier),
            "exactly one of target_epsilon or noise_multiplier",
        )
    if bands is not None:
        bands = check_int("bands", bands, 1)
    buffers = check_int("buffers", buffers, 1)
    if epochs is not None:
        steps, _ = epochs_to_steps(epochs, n, batch_size)
        steps_note = f"epochs={epochs:g} × n={n} / batch_size={batch_size} → {steps} steps"
    else:
        steps = check_int("steps", steps, 1)
        steps_note = f"steps={steps} given"
    momentum = float(optimizer.param_groups[0].get("momentum", 0.0) or 0.0)
    choice: StrategyChoice | None = None
    automatic = strategy is None and (noise == "auto" or (noise == "banded" and bands is None))
    if automatic:
        if target_epsilon is None:
            if noise == "auto":
                raise fail("target_epsilon", None, "a target epsilon for noise='auto'")
            bands = 4
        else:
            choice = choose_strategy(
                check_positive("target_epsilon", target_epsilon),
                delta,
                steps,
                n,
                batch_size,
                sampling=sampling,
                momentum=momentum,
                learning_rates=learning_rates,
                kinds=("dpsgd", "banded", "blt") if noise == "auto" else ("dpsgd", "banded"),
                buffers=buffers,
                margin=margin,
                accountant=accountant,
            )
            noise = choice.best.noise  # type: ignore[assignment]
            strategy = choice.best.strategy
            bands = strategy.bands if noise != "blt" else None
    if noise == "auto":  # pragma: no cover - resolved above
        raise fail("noise", noise, "a target epsilon")
    if strategy is not None and noise in ("dpsgd", "banded") and strategy.bands is not None:
        partitions = strategy.bands
    elif noise == "dpsgd" and strategy is None:
        partitions = 1
    elif noise == "banded" and strategy is None:
        partitions = bands or 4
    elif noise == "banded_inverse" and strategy is None:
        partitions = max(1, n // batch_size)
    elif strategy is not None and strategy.bands is not None:
        partitions = strategy.bands
    else:
        partitions = max(1, n // batch_size)
    partitions = min(partitions, steps)
    wide = noise in ("blt", "tree", "banded_inverse") or (
        strategy is not None and strategy.bands is None
    )
    rate = batch_size * partitions / n
    if rate > 1.0:
        raise fail(
            "bands",
            partitions,
            f"at most len(data) / batch_size = {n // batch_size} (partitions of {batch_size}+)",
        )
    if strategy is None:
        strategy = _strategy(
            noise,
            steps,
            bands=bands,
            buffers=buffers,
            partitions=partitions,
            rounds=-(-steps // partitions),
            momentum=momentum,
        )
    if not strategy.streamable:
        raise fail("strategy", strategy.name, "a streamable strategy (dpsgd, tree, banded, blt)")
    source = make_random_source(seed)
    rounds = 1 if wide else max(num_selected, (num_selected * n) // (partitions * batch_size))
    if wide:
        num_selected = 1
    sampler: CyclicPoissonSampler | CyclicAllocationSampler
    if sampling == "random-allocation":
        sampler = CyclicAllocationSampler(
            n, partitions, rounds, steps, num_selected=num_selected, random_source=source
        )
        plan_args: dict[str, Any] = {
            "sampling": "random-allocation",
            "rounds_per_epoch": rounds,
            "num_selected": num_selected,
        }
    else:
        sampler = CyclicPoissonSampler(n, partitions, rate, steps, random_source=source)
        plan_args = {"sample_rate": rate}
    calibration: CalibrationResult | None = None
    if target_epsilon is not None:
        target_epsilon = check_positive("target_epsilon", target_epsilon)
        plan, calibration = calibrate_correlated(
            target_epsilon,
            delta,
            strategy,
            steps,
            partitions=partitions,
            accountant=accountant,
            **plan_args,
        )
    else:
        plan = correlated_plan(
            strategy,
            steps,
            check_positive("noise_multiplier", noise_multiplier),
            partitions=partitions,
            **plan_args,
        )
    dp_optimizer = CorrelatedOptimizer(
        optimizer,
        model=model,
        loss_fn=loss_fn,
        max_grad_norm=max_grad_norm,
        sampler=sampler,
        strategy=strategy,
        plan=plan,
        accountant=accountant,
        random_source=source,
        max_physical_batch_size=max_physical_batch_size,
        clipping=clipping,
        grad_mode=grad_mode,
        engine=engine,
        budget=budget,
        counter_noise=counter_noise,
    )
    return PrivateTraining(
        model=model,
        optimizer=dp_optimizer,
        data_loader=private_data_loader(
            data,
            sampler,  # type: ignore[arg-type]
            steps_per_epoch=max(1, -(-n // batch_size)),
        ),
        sampler=sampler,  # type: ignore[arg-type]
        noise_multiplier=plan.noise_multiplier,
        max_grad_norm=max_grad_norm,
        sample_rate=batch_size / n,
        steps=steps,
        target_epsilon=target_epsilon,
        delta=delta,
        neighbouring=sampler.neighbouring.value,
        steps_note=steps_note + f"; {plan.analysis} plan ({plan.sampling}), "
        f"{plan.charges} charge(s)",
        calibration=calibration,
        extra={
            "plan": plan,
            "strategy": strategy,
            "noise": noise,
            "choice": choice,
            "band_scores": {}
            if choice is None
            else {c.plan.partitions: c.score for c in choice.candidates if c.noise != "blt"},
        },
    )
