"""``make_private``: turn a model, an optimizer and a dataset into calibrated DP-SGD.

One call fixes everything the guarantee depends on *before* training: the sampling rate
``q = batch_size / n``, the number of steps ``T`` (epochs rounded **up** to whole steps, and
the rounding stated), the noise multiplier σ calibrated so that T steps cost at most the
target ε at δ by the chosen accountant (PLD by default: tight, so the smallest σ), the
sampler that matches the accounting event, and the optimizer that adds the noise.

Guarantee: training for at most ``steps`` optimizer steps with the returned loader and
optimizer is (ε, δ)-DP with ε ≤ ``target_epsilon`` — add/remove neighbouring with Poisson
sampling (default) and random allocation, replace-one with ``sampling="fixed-size"`` and
``"shuffle"`` — by the composition theorem of the chosen accountant for the sampler's event
(:func:`renyi.analysis.events.training_event`; Abadi et al. 2016; Mironov, Talwar & Zhang
2019; Wang, Balle & Kasiviswanathan 2019; Feldman & Shenfeld 2025 for random allocation).
The epoch samplers (``"random-allocation"``, ``"shuffle"``) are charged one whole epoch at
the first step of each epoch: a partial epoch costs a full one.

Example:
    >>> import torch
    >>> from renyi.dpsgd.data import load_digits
    >>> train, _ = load_digits()
    >>> model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    >>> private = make_private(model, torch.optim.SGD(model.parameters(), lr=0.5), train,
    ...     loss_fn=torch.nn.CrossEntropyLoss(), target_epsilon=3.0, delta=1e-5,
    ...     epochs=2, batch_size=64, max_grad_norm=1.0)  # doctest: +SKIP
    >>> for x, y in private.data_loader:  # doctest: +SKIP
    ...     private.optimizer.zero_grad()
    ...     private.optimizer.accumulate(x, y)
    ...     private.optimizer.step()
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from torch.utils.data import default_collate as _default_collate

from renyi._validation import check_delta, check_int, check_positive, fail
from renyi.analysis.events import Event
from renyi.calibration import (
    CalibrationResult,
    calibrate_event_noise,
    calibrate_noise_multiplier,
    epochs_to_steps,
)
from renyi.dpsgd.optimizer import BudgetHook, ClippingEngine, DPOptimizer
from renyi.dpsgd.sampler import (
    BallsInBinsSampler,
    FixedSizeSampler,
    PoissonSampler,
    ShuffleSampler,
    make_random_source,
)
from renyi.errors import PrivacyParameterError, RenyiWarning, UnsupportedEventError

__all__ = [
    "SAMPLING_NAMES",
    "EmptyBatchCollate",
    "PlanCompleteWarning",
    "PlannedBatchSampler",
    "PrivateTraining",
    "TrainingPlan",
    "calibrate_sampler_noise",
    "dataset_of",
    "make_private",
    "normalise_sampling",
    "plan_training",
    "private_data_loader",
]

SamplingName = Literal[
    "poisson", "fixed_size", "fixed-size", "random-allocation", "random_allocation", "shuffle"
]

#: The samplers :func:`make_private` builds (``renyi.analysis.events.training_event``'s names;
#: ``fixed_size`` and ``random_allocation`` are accepted too).
SAMPLING_NAMES: tuple[str, ...] = ("poisson", "fixed-size", "random-allocation", "shuffle")

#: Every sampler a private loader can run (the per-step and the per-epoch ones).
AnySampler = PoissonSampler | FixedSizeSampler | BallsInBinsSampler | ShuffleSampler


def normalise_sampling(sampling: str, name: str = "sampling") -> str:
    """The canonical name (:data:`SAMPLING_NAMES`) of ``sampling`` (``_`` or ``-``)."""
    canonical = sampling.replace("_", "-") if isinstance(sampling, str) else sampling
    if canonical not in SAMPLING_NAMES:
        raise fail(name, sampling, f"one of {list(SAMPLING_NAMES)}")
    return str(canonical)


def steps_per_epoch_of(sampling: str, dataset_size: int, batch_size: int) -> int:
    """Batches in one epoch: ``n // b`` for random allocation (each epoch puts every record
    in one of ``t = n // b`` batches), ``ceil(n / b)`` otherwise."""
    if sampling == "random-allocation":
        return dataset_size // batch_size
    return -(-dataset_size // batch_size)


def calibrate_sampler_noise(
    target_epsilon: float,
    delta: float,
    sampler: AnySampler,
    steps: int,
    accountant: str = "pld",
    *,
    rtol: float = 1e-4,
    max_noise_multiplier: float = 1e4,
) -> CalibrationResult:
    """Smallest σ (within ``rtol``, verified on the safe side) whose training event —
    ``sampler.training_event(σ, steps)``, i.e. :func:`renyi.analysis.events.training_event`,
    whole epochs for the epoch samplers — costs at most ``target_epsilon`` at ``delta`` by
    ``accountant``.

    Slow accountants (PLD) bracket around the RDP answer (cheap, and above PLD's in practice).

    Raises:
        PrivacyParameterError: the target is unreachable with σ ≤ ``max_noise_multiplier``.
    """
    from renyi.accountants import make_accountant

    steps = check_int("steps", steps, 1)

    def build(sigma: float) -> tuple[Event, int]:
        return sampler.training_event(sigma, steps), 1

    guess: float | None = None
    if make_accountant(accountant).name != "rdp":
        try:
            guess = calibrate_event_noise(
                target_epsilon, delta, build, "rdp", rtol=1e-3
            ).noise_multiplier
        except (PrivacyParameterError, UnsupportedEventError):
            guess = None
    return calibrate_event_noise(
        target_epsilon,
        delta,
        build,
        accountant,
        rtol=rtol,
        max_noise_multiplier=max_noise_multiplier,
        guess=guess,
    )


class PlanCompleteWarning(RenyiWarning):
    """A private data loader was iterated again after yielding all the planned batches."""


def _empty_like(value: Any) -> Any:
    """``value`` (a collated batch: tensors in tuples/lists/dicts) with every tensor cut to 0
    rows; other leaves are kept as they are."""
    if isinstance(value, torch.Tensor):
        return value[:0] if value.ndim > 0 else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_empty_like(v) for v in value))
    if isinstance(value, tuple | list):
        return type(value)(_empty_like(v) for v in value)
    if isinstance(value, Mapping):  # dicts, and mappings such as transformers' BatchEncoding
        return {k: _empty_like(v) for k, v in value.items()}
    return value


class EmptyBatchCollate:
    """A ``collate_fn`` that also collates the empty batches of Poisson sampling.

    Non-empty batches go to ``collate_fn`` (default: torch's ``default_collate``) unchanged.
    An empty batch is collated as a batch of one example (``dataset[0]``) with every tensor
    then cut to zero rows: the structure, dtypes and trailing shapes of a real batch, no
    example. (Only shapes are taken from ``dataset[0]``; nothing is released from it: an
    empty batch contributes a zero clipped sum.) Picklable, so ``num_workers > 0`` works.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> ds = TensorDataset(torch.zeros(5, 3), torch.zeros(5, dtype=torch.long))
        >>> x, y = EmptyBatchCollate(ds)([])
        >>> tuple(x.shape), tuple(y.shape)
        ((0, 3), (0,))
    """

    def __init__(
        self, dataset: Dataset[Any], collate_fn: Callable[[list[Any]], Any] | None = None
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn if collate_fn is not None else _default_collate

    def __call__(self, batch: list[Any]) -> Any:
        if len(batch) > 0:
            return self.collate_fn(batch)
        return _empty_like(self.collate_fn([self.dataset[0]]))


class PlannedBatchSampler:
    """The batches of a privacy sampler, cut into epochs, ending after the planned steps.

    Iterating it yields the next ``steps_per_epoch`` batches of ``sampler`` (one epoch; the
    last one may be shorter), continuing where the previous pass stopped, so that the usual
    loop ``for epoch in range(E): for batch in loader`` draws exactly the planned ``steps``
    batches over the ``E`` epochs. Once all ``sampler.steps`` batches are drawn, further
    passes yield nothing and warn (:class:`PlanCompleteWarning`): no loop can draw more
    batches than the plan, whatever wraps it. Empty batches are yielded, never skipped.

    Use it as the ``batch_sampler`` of a ``torch.utils.data.DataLoader`` (with
    :class:`EmptyBatchCollate`), as :func:`private_data_loader` does.

    Args:
        sampler: a sampler of :mod:`renyi.dpsgd.sampler` (its ``steps`` is the plan).
        steps_per_epoch: batches per pass (default: the sampler's ``steps_per_epoch`` for the
            epoch samplers, else ``⌈1/q⌉``).
        unlimited: no plan (Opacus's ``make_private`` with a noise multiplier): every pass
            is one full pass of ``sampler`` (``sampler.steps`` batches), without end.
    """

    def __init__(
        self,
        sampler: AnySampler,
        steps_per_epoch: int | None = None,
        *,
        unlimited: bool = False,
    ) -> None:
        self.sampler = sampler
        if unlimited:
            steps_per_epoch = sampler.steps
        elif steps_per_epoch is None:
            steps_per_epoch = getattr(sampler, "steps_per_epoch", None) or max(
                1, math.ceil(1.0 / sampler.sample_rate - 1e-9)
            )
        self.steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch, 1)
        self.unlimited = bool(unlimited)
        self._it: Any = None
        self._drawn = 0
        self._optimizer: Any = None
        self._step_base = 0
        #: size of the last batch drawn (None before the first): an empty one may be stepped
        #: without a forward (models that cannot run on zero rows)
        self.last_size: int | None = None

    def link(self, optimizer: Any) -> None:
        """Check, before each batch is drawn, that every batch drawn so far was stepped.

        Skipping a batch (``if len(x) == 0: continue``, a common habit with empty Poisson
        batches) releases the fact that it was empty and leaves it out of the accounting;
        stepping twice on one batch is accounted as two independent samples. Both are
        refused with :class:`~renyi.errors.PrivacyParameterError` when the next batch is
        drawn, once a step has been taken (drawing batches only to look at them releases
        nothing). Only for loaders without worker processes: workers draw batches ahead.
        """
        self._optimizer = optimizer
        self._step_base = int(optimizer.steps_taken) - self._drawn

    def _check_stepped(self) -> None:
        opt = self._optimizer
        if opt is None:
            return
        taken = int(opt.steps_taken) - self._step_base
        if taken and taken != self._drawn:  # (drawing batches only to look at them is fine)
            raise fail(
                "training loop",
                f"{self._drawn} batches drawn, {taken} optimizer steps",
                "exactly one optimizer.step() per batch of the private loader, empty batches "
                "included (skipping a batch reveals that it was empty and leaves it "
                "unaccounted; stepping twice on one batch is accounted as two independent "
                "samples)",
            )

    @property
    def steps(self) -> int:
        """All batches of the plan (``sampler.steps``)."""
        return int(self.sampler.steps)

    @property
    def batches_drawn(self) -> int:
        return self._drawn

    def __len__(self) -> int:
        """Batches of the next pass (an epoch, the rest of one, or 0 after the plan)."""
        if self.unlimited:
            return self.steps_per_epoch
        remaining = self.steps - self._drawn
        return min(remaining, self.steps_per_epoch - self._drawn % self.steps_per_epoch)

    def __iter__(self) -> Any:
        count = len(self)
        if count == 0:
            warnings.warn(
                f"the private data loader has yielded all {self.steps} planned batches "
                f"({self.steps / self.steps_per_epoch:.6g} epochs); this pass yields none "
                "(the privacy guarantee covers only the planned steps)",
                PlanCompleteWarning,
                stacklevel=2,
            )
            return
        if self.unlimited:
            for batch in self.sampler:
                self._check_stepped()
                self._drawn += 1
                self.last_size = len(batch)
                yield batch
            return
        if self._it is None:
            self._it = iter(self.sampler)
        for _ in range(count):
            self._check_stepped()
            batch = next(self._it)
            self._drawn += 1
            self.last_size = len(batch)
            yield batch

    def resync(self) -> None:
        """Continue after the sampler's restored position (after a checkpoint is loaded)."""
        self._it = None
        self._drawn = int(self.sampler.state_dict()["position"])
        if self._optimizer is not None:
            self.link(self._optimizer)


class _TensorBatches:
    """Fast path for ``TensorDataset``: index all tensors at once, one batch per sampler step."""

    def __init__(self, dataset: TensorDataset, batch_sampler: PlannedBatchSampler) -> None:
        self.dataset = dataset
        self.batch_sampler = batch_sampler

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Any:
        for idx in self.batch_sampler:
            index = torch.as_tensor(idx, dtype=torch.long)
            yield tuple(t[index] for t in self.dataset.tensors)


#: DataLoader settings carried over from a user's loader to the private one.
_KEPT_LOADER_SETTINGS = (
    "num_workers",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
)


def dataset_of(data: Dataset[Any] | DataLoader[Any] | Sequence[Any]) -> Dataset[Any]:
    """The dataset behind ``data`` (a ``DataLoader``'s ``.dataset``, else ``data`` itself).

    Raises:
        PrivacyParameterError: an iterable-style dataset (no length, no random access:
            Poisson sampling needs both).
    """
    dataset = data.dataset if isinstance(data, DataLoader) else data
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise fail(
            "data",
            type(dataset).__name__,
            "a map-style dataset with len() and indexing (Poisson sampling draws each example "
            "independently; an IterableDataset cannot be sampled that way)",
        )
    return dataset  # type: ignore[return-value]


def link_loader(loader: Any, optimizer: Any) -> None:
    """Tie ``loader``'s :class:`PlannedBatchSampler` to ``optimizer``: loading a checkpoint
    into the optimizer moves the loader on to the checkpoint's position, and (for loaders
    without worker processes, which draw batches ahead) the loader checks one step per batch
    (see :meth:`PlannedBatchSampler.link`)."""
    batches = getattr(loader, "batch_sampler", None)
    if not isinstance(batches, PlannedBatchSampler):
        return
    linked = getattr(optimizer, "_linked_batches", None)
    if isinstance(linked, list) and all(b is not batches for b in linked):
        linked.append(batches)
    if not getattr(loader, "num_workers", 0):
        batches.link(optimizer)


def private_data_loader(
    data: Dataset[Any] | DataLoader[Any] | Sequence[Any],
    sampler: AnySampler,
    *,
    steps_per_epoch: int | None = None,
    unlimited: bool = False,
) -> Any:
    """An iterable of batches drawn by ``sampler``, in epochs, ending after the planned steps.

    ``data`` is a map-style dataset or a ``DataLoader``: the loader's ``collate_fn``,
    ``num_workers``, ``pin_memory`` (and its other worker settings) are kept, its sampler and
    batch size are replaced by ``sampler`` (through :class:`PlannedBatchSampler`), and empty
    batches are collated by :class:`EmptyBatchCollate`. A ``TensorDataset`` without a loader
    takes a fast path (one indexing per batch).
    """
    batches = PlannedBatchSampler(sampler, steps_per_epoch, unlimited=unlimited)
    if isinstance(data, DataLoader):
        dataset = dataset_of(data)
        settings = {k: getattr(data, k) for k in _KEPT_LOADER_SETTINGS if hasattr(data, k)}
        if not settings.get("num_workers"):
            settings.pop("prefetch_factor", None)
            settings["persistent_workers"] = False
        return DataLoader(
            dataset,
            batch_sampler=batches,
            collate_fn=EmptyBatchCollate(dataset, data.collate_fn),
            **settings,
        )
    dataset = dataset_of(data)
    if isinstance(dataset, TensorDataset):
        return _TensorBatches(dataset, batches)
    return DataLoader(dataset, batch_sampler=batches, collate_fn=EmptyBatchCollate(dataset))


@dataclass
class PrivateTraining:
    """Everything ``make_private`` fixed, plus checkpoint/resume of the whole state.

    Attributes:
        steps: T, the number of optimizer steps the guarantee covers (train exactly these).
        steps_note: how ``epochs`` became ``steps`` (rounding up is stated here).
    """

    model: torch.nn.Module
    optimizer: DPOptimizer
    data_loader: Any
    sampler: AnySampler
    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float
    steps: int
    target_epsilon: float | None
    delta: float
    neighbouring: str
    steps_note: str
    calibration: CalibrationResult | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def epsilon(self, delta: float | None = None) -> Any:
        """ε spent so far (an ``EpsilonResult``) at ``delta`` (default: the target δ)."""
        return self.optimizer.epsilon(self.delta if delta is None else delta)

    def state_dict(self) -> dict[str, Any]:
        """Model + optimizer (incl. accountant and noise RNG) + sampler position/RNG."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (refuses a checkpoint of a different mechanism)."""
        if state["steps"] != self.steps:
            raise fail("checkpoint steps", state["steps"], f"{self.steps} (this run's)")
        self.optimizer.load_state_dict(state["optimizer"])  # validates the mechanism first
        self.model.load_state_dict(state["model"])
        self.sampler.load_state_dict(state["sampler"])
        batches = getattr(self.data_loader, "batch_sampler", None)
        if isinstance(batches, PlannedBatchSampler):
            batches.resync()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`state_dict` to ``path`` with ``torch.save``."""
        torch.save(self.state_dict(), path)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Read a checkpoint written by :meth:`save` and restore it."""
        self.load_state_dict(torch.load(path, weights_only=True))


def _epoch_plan(
    sampling: str, n: int, batch_size: int, epochs: float | None, steps: int | None
) -> tuple[int, float, str]:
    """(steps, sample rate, note) of an epoch sampler: an epoch is t batches, and every
    epoch begun is charged in full."""
    t = steps_per_epoch_of(sampling, n, batch_size)
    rule = "n // b" if sampling == "random-allocation" else "ceil(n / b)"
    unit = f"t={t} batches per epoch ({rule})"
    if epochs is not None:
        steps, _ = epochs_to_steps(epochs, t, 1)
        note = f"epochs={epochs:g} × {unit} = {steps} steps"
    else:
        steps = check_int("steps", steps, 1)
        note = f"steps={steps} given, {unit}"
    whole = -(-steps // t)
    if steps % t:
        note += (
            f"; charged as {whole} whole epochs (the last, partial epoch costs a full one: "
            "its allocation is drawn and charged at its first step)"
        )
    else:
        note += f" = {whole} epoch{'s' if whole != 1 else ''}, each charged at its first step"
    return steps, (n / t if sampling == "random-allocation" else batch_size) / n, note


@dataclass(frozen=True)
class TrainingPlan:
    """What a private training run is fixed to before it starts (see :func:`plan_training`).

    Attributes:
        sampler: the batch sampler (its ``steps`` is the plan's length).
        noise_multiplier: σ, calibrated to ``target`` or given.
        sample_rate: q.
        steps: T, the optimizer steps the guarantee covers.
        steps_note: how epochs became steps (the rounding, stated).
        calibration: the calibration's result (None when σ was given).
        target: ``(ε, δ)`` σ was calibrated for, or None.
    """

    sampler: AnySampler
    noise_multiplier: float
    sample_rate: float
    steps: int
    steps_note: str
    calibration: CalibrationResult | None
    target: tuple[float, float] | None


def plan_training(
    n: int,
    batch_size: int,
    *,
    delta: float,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    epochs: float | None = None,
    steps: int | None = None,
    accountant: str = "pld",
    sampling: str = "poisson",
    seed: int | None = None,
) -> TrainingPlan:
    """The sampler, σ and number of steps of a private run over ``n`` examples with expected
    batch size ``batch_size`` (what :func:`make_private` fixes before any data is touched;
    the Hugging Face :class:`~renyi.dpsgd.hf.DPTrainer` uses it too).

    Epochs become ⌈epochs · n / b⌉ steps (whole epochs of the sampler for the epoch
    samplers), rounded up and stated in ``steps_note``; σ is the smallest noise multiplier
    whose training event costs at most ``target_epsilon`` at ``delta`` by ``accountant``.

    Raises:
        PrivacyParameterError: inconsistent or out-of-range arguments, an unreachable target.
    """
    delta = check_delta(delta)
    n = check_int("n", n, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    if batch_size > n:
        raise fail("batch_size", batch_size, f"an integer in [1, len(data)={n}]")
    if (epochs is None) == (steps is None):
        raise fail("epochs/steps", (epochs, steps), "exactly one of epochs or steps")
    if (target_epsilon is None) == (noise_multiplier is None):
        raise fail(
            "target_epsilon/noise_multiplier",
            (target_epsilon, noise_multiplier),
            "exactly one of target_epsilon or noise_multiplier",
        )
    sampling = normalise_sampling(sampling)
    per_epoch_sampler = sampling in ("random-allocation", "shuffle")
    if per_epoch_sampler:
        steps, sample_rate, steps_note = _epoch_plan(sampling, n, batch_size, epochs, steps)
    elif epochs is not None:
        steps, sample_rate = epochs_to_steps(epochs, n, batch_size)
        exact = epochs * n / batch_size
        if steps == exact:
            steps_note = f"epochs={epochs:g} × n={n} / batch_size={batch_size} = {steps} steps"
        else:
            steps_note = (
                f"epochs={epochs:g} × n={n} / batch_size={batch_size} = {exact:.6g} steps, "
                f"rounded up to {steps} (the guarantee covers all {steps})"
            )
    else:
        steps = check_int("steps", steps, 1)
        sample_rate = batch_size / n
        steps_note = f"steps={steps} given ({steps * batch_size / n:.6g} epochs)"

    source = make_random_source(seed)
    sampler: AnySampler
    if sampling == "poisson":
        sampler = PoissonSampler(n, sample_rate, steps, random_source=source)
    elif sampling == "fixed-size":
        sampler = FixedSizeSampler(n, batch_size, steps, random_source=source)
    elif sampling == "random-allocation":
        sampler = BallsInBinsSampler(n, batch_size, steps, random_source=source)
    else:
        sampler = ShuffleSampler(n, batch_size, steps, random_source=source)

    calibration: CalibrationResult | None = None
    if target_epsilon is not None:
        target_epsilon = check_positive("target_epsilon", target_epsilon)
        if per_epoch_sampler:
            calibration = calibrate_sampler_noise(
                target_epsilon, delta, sampler, steps, accountant=accountant
            )
            sigma = calibration.noise_multiplier
        elif sampling == "poisson":
            calibration = calibrate_noise_multiplier(
                target_epsilon, delta, sample_rate, steps, accountant=accountant
            )
            sigma = calibration.noise_multiplier
        else:
            # calibration.dpsgd_event already charges replace-one's sensitivity 2C (its
            # Gaussian has multiplier σ/2, as FixedSizeSampler's event): σ comes back as σ/C.
            calibration = calibrate_noise_multiplier(
                target_epsilon,
                delta,
                sample_rate,
                steps,
                accountant=accountant,
                sampling="without_replacement",
                dataset_size=n,
            )
            sigma = calibration.noise_multiplier
    else:
        sigma = check_positive("noise_multiplier", noise_multiplier)

    return TrainingPlan(
        sampler=sampler,
        noise_multiplier=sigma,
        sample_rate=sample_rate,
        steps=steps,
        steps_note=steps_note,
        calibration=calibration,
        target=None if target_epsilon is None else (target_epsilon, delta),
    )


def make_private(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Dataset[Any] | DataLoader[Any] | Sequence[Any],
    *,
    loss_fn: Callable[..., torch.Tensor],
    delta: float,
    max_grad_norm: float,
    batch_size: int | None = None,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    epochs: float | None = None,
    steps: int | None = None,
    accountant: str = "pld",
    sampling: SamplingName = "poisson",
    seed: int | None = None,
    max_physical_batch_size: int | None = None,
    clipping: str = "flat",
    grad_mode: str = "auto",
    engine: ClippingEngine | None = None,
    budget: BudgetHook | None = None,
    allow_exceeding_target: bool = False,
    ledger: Any = None,
    ledger_token: str | None = None,
) -> PrivateTraining:
    """Calibrate σ to ``(target_epsilon, delta)`` and wire sampler, optimizer and accountant.

    Args:
        model, optimizer: the model and its (non-private) optimizer.
        data: a map-style dataset of ``(input, target)`` pairs, or a ``DataLoader`` over one
            (its ``collate_fn``, ``num_workers``, ``pin_memory`` are kept; its sampler is
            replaced by the privacy sampler; ``batch_size`` defaults to its batch size).
        loss_fn: per-example loss for the clipping engine.
        delta: δ in (0, 1) of the guarantee (and of the calibration).
        batch_size: *expected* batch size b; q = b / n. Fixed size with ``"fixed-size"``
            and ``"shuffle"``; ``"random-allocation"`` makes ``t = n // b`` batches an epoch.
        max_grad_norm: clipping norm C.
        target_epsilon: ε to calibrate σ for; or give ``noise_multiplier`` instead.
        epochs / steps: training length (exactly one of them); epochs become
            ⌈epochs · n / b⌉ steps (⌈epochs · t⌉ for the epoch samplers, t batches an epoch),
            rounded up and stated in ``steps_note``.
        accountant: ``"pld"`` (default, tight), ``"rdp"`` or ``"zcdp"``.
        sampling: which batch sampler runs, and so which event is charged
            (:func:`renyi.analysis.events.training_event`):

            * ``"poisson"`` (default): :class:`~renyi.dpsgd.sampler.PoissonSampler`, one
              ``PoissonSampledEvent`` per step (add/remove);
            * ``"fixed-size"`` (or ``"fixed_size"``): fresh fixed-size batches,
              :class:`~renyi.dpsgd.sampler.FixedSizeSampler`, per step (replace-one);
            * ``"random-allocation"``: balls in bins,
              :class:`~renyi.dpsgd.sampler.BallsInBinsSampler` — every example once per
              epoch of ``t = n // b`` batches; one ``RandomAllocationEvent`` per epoch,
              charged at the epoch's first step (add/remove; privacy close to Poisson's);
            * ``"shuffle"``: :class:`~renyi.dpsgd.sampler.ShuffleSampler`, a random
              permutation cut into batches of b; one ``ShuffledEvent`` per epoch (replace-one):
              the proven bound, **without** amplification, so far larger than Poisson's ε
              for the same σ and b. Never accounted as Poisson.

            A partial epoch of an epoch sampler costs a whole epoch.
        seed: None for the secure OS source, an int for reproducible (insecure) experiments.
        allow_exceeding_target: with ``target_epsilon``, the optimizer refuses a step past
            the planned ``steps`` (:class:`~renyi.dpsgd.optimizer.PlanExceededError`) unless
            this is True.
        ledger: a budget charged before every release, like ``budget``: a ledger service
            URL (``http[s]://host:port#name``, with ``ledger_token`` or
            ``$RENYI_LEDGER_TOKEN``), a ledger path or ``postgresql://`` URL, or a Budget
            (:func:`renyi.ledger.client.budget_hook`). A refused or unreachable ledger stops
            the step before any noise is drawn.

    The returned ``data_loader`` yields the planned batches in epochs of ``⌈1/q⌉`` batches
    (the sampler's ``steps_per_epoch`` for the epoch samplers) and ends after ``steps`` of
    them, whatever loop wraps it (see :class:`PlannedBatchSampler`).

    Raises:
        PrivacyParameterError: inconsistent or out-of-range arguments.
    """
    delta = check_delta(delta)
    max_grad_norm = check_positive("max_grad_norm", max_grad_norm)
    if ledger is not None and budget is not None:
        raise fail("ledger", ledger, "None when budget is given (one budget per training)")
    dataset = dataset_of(data)
    n = check_int("len(data)", len(dataset), 1)  # type: ignore[arg-type]
    if batch_size is None and isinstance(data, DataLoader):
        batch_size = data.batch_size
    if batch_size is None:
        raise fail(
            "batch_size",
            None,
            "the expected batch size (an integer >= 1; taken from a DataLoader's batch_size "
            "when data is one)",
        )
    plan = plan_training(
        n,
        batch_size,
        delta=delta,
        target_epsilon=target_epsilon,
        noise_multiplier=noise_multiplier,
        epochs=epochs,
        steps=steps,
        accountant=accountant,
        sampling=sampling,
        seed=seed,
    )
    sampler, sigma, steps = plan.sampler, plan.noise_multiplier, plan.steps
    source = sampler.random_source
    if ledger is not None:
        from renyi.ledger.client import budget_hook

        budget = budget_hook(ledger, token=ledger_token, planned_steps=steps)
    dp_optimizer = DPOptimizer(
        optimizer,
        model=model,
        loss_fn=loss_fn,
        noise_multiplier=sigma,
        max_grad_norm=max_grad_norm,
        sampler=sampler,
        accountant=accountant,
        random_source=source,
        max_physical_batch_size=max_physical_batch_size,
        clipping=clipping,
        grad_mode=grad_mode,
        engine=engine,
        budget=budget,
        max_steps=steps if plan.target is not None else None,
        target=plan.target,
        allow_exceeding_target=allow_exceeding_target,
    )
    loader = private_data_loader(data, sampler)
    link_loader(loader, dp_optimizer)
    return PrivateTraining(
        model=model,
        optimizer=dp_optimizer,
        data_loader=loader,
        sampler=sampler,
        noise_multiplier=sigma,
        max_grad_norm=max_grad_norm,
        sample_rate=plan.sample_rate,
        steps=steps,
        target_epsilon=None if plan.target is None else plan.target[0],
        delta=delta,
        neighbouring=sampler.neighbouring.value,
        steps_note=plan.steps_note,
        calibration=plan.calibration,
    )
