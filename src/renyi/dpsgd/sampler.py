"""Batch samplers for DP-SGD whose randomness is exactly what the accountant analyses.

Two samplers, each paired with the accounting event that matches it:

* :class:`PoissonSampler` — every example joins each batch independently with probability
  ``q`` (so batch sizes are Binomial(n, q) and may be 0). Accounted as
  ``PoissonSampledEvent(q, GaussianEvent(σ))`` under **add/remove** neighbouring
  (Abadi et al. 2016; Mironov, Talwar & Zhang 2019). This is the default.
* :class:`FixedSizeSampler` — every batch is a fresh uniformly random subset of exactly ``b``
  examples, drawn independently at each step (sampling *without replacement*, not epoch
  shuffling). Accounted as ``SampledWithoutReplacementEvent(n, b, GaussianEvent(σ/2,
  replace_one))`` under **replace-one** neighbouring (Wang, Balle & Kasiviswanathan 2019,
  Thm. 9): replacing one example moves the sum of clipped gradients by at most ``2C``, so the
  noise multiplier relative to that sensitivity is ``σ/2``.

Three more, each recording the event it implies (:meth:`training_event`, the single source
being :func:`renyi.analysis.events.training_event`):

* :class:`TruncatedPoissonSampler` — Poisson, batches cut to ``max_batch_size`` (as
  jax_privacy); per step ``TruncatedPoissonSampledEvent`` (add/remove).
* :class:`BallsInBinsSampler` — random allocation: each epoch, every example goes to one of
  ``t = n // b`` batches uniformly at random; per epoch ``RandomAllocationEvent``
  (add/remove).
* :class:`ShuffleSampler` — epoch shuffling: a random permutation cut into batches of
  ``b``; per epoch ``ShuffledEvent`` (replace-one), whose proven bound has **no**
  amplification. Accounting shuffled batches as Poisson sampling understates ε, so this
  sampler never yields a Poisson event.

The last two are analysed per *epoch*, not per step: their :meth:`accounting_event` raises
:class:`~renyi.errors.UnsupportedEventError` (a per-step event would be wrong) and training
is accounted with :meth:`training_event`.

Every sampler answers the one question the optimizer asks before it releases step ``k``
(0-based): :meth:`event_at` — the event to charge now, or None when an earlier charge covers
the step. Per-step samplers charge their :meth:`accounting_event` at every step; the epoch
samplers charge their whole epoch's event (:meth:`charged_event`) at the first step of each
epoch (``k % steps_per_epoch == 0``), before any noise of that epoch is released, so a partial
epoch costs a full one. :meth:`charges` counts the charges of the first ``steps`` steps, so
``charges(T)`` compositions of :meth:`charged_event` is exactly :meth:`training_event` of ``T``
steps.

Randomness comes from a :class:`TorchRandomSource`, the torch-facing adapter of
:mod:`renyi.random` (the package's one source of randomness). The default,
:class:`SecureRandomSource`, turns the words of :class:`renyi.random.SecureSource` (OS
entropy expanded by ChaCha20) into torch uniforms and normals with the same functions as
the rest of the package; :class:`SeededRandomSource` is a seeded ``torch.Generator`` for
reproducible experiments (checkpointable state) and warns once with
:class:`~renyi.errors.InsecureRandomnessWarning` through :mod:`renyi.random`'s warning.

Example:
    >>> sampler = PoissonSampler(num_samples=1000, sample_rate=0.01, steps=3)
    >>> [len(batch) >= 0 for batch in sampler]
    [True, True, True]
"""

from __future__ import annotations

import math
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from renyi import random as rrandom
from renyi._validation import check_int, check_range, fail
from renyi.analysis.events import (
    Event,
    GaussianEvent,
    Neighbouring,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    TruncatedPoissonSampledEvent,
    default_max_batch_size,
    training_event,
)
from renyi.errors import UnsupportedEventError

__all__ = [
    "BallsInBinsSampler",
    "FixedSizeSampler",
    "PoissonSampler",
    "SecureRandomSource",
    "SeededRandomSource",
    "ShuffleSampler",
    "TorchRandomSource",
    "TruncatedPoissonSampler",
    "checked_random_source",
    "make_random_source",
]

_INV_2_53 = 2.0**-53


class TorchRandomSource(ABC):
    """Where DP-SGD draws its batch-sampling uniforms and its Gaussian noise from (as tensors).

    A torch-facing adapter: implementations take their randomness from :mod:`renyi.random`
    (:class:`SecureRandomSource`) or from a checkpointable ``torch.Generator``
    (:class:`SeededRandomSource`).
    """

    secure: bool

    @abstractmethod
    def uniform(self, n: int) -> torch.Tensor:
        """``n`` float64 uniforms in the open interval (0, 1)."""

    @abstractmethod
    def normal(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Standard normal variates of ``shape`` (CPU tensor of ``dtype``)."""

    def permutation_prefix(self, n: int, k: int) -> torch.Tensor:
        """The first ``k`` entries of a uniformly random permutation of ``range(n)``.

        Random keys: the ``k`` smallest of ``n`` i.i.d. uniforms form a uniformly random
        ``k``-subset (ties have probability ~n²·2⁻⁵⁴, negligible).
        """
        keys = self.uniform(n)
        return torch.topk(keys, k, largest=False, sorted=False).indices

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Serialisable state (a secure source has none to restore)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` of the same kind of source."""


class SecureRandomSource(TorchRandomSource):
    """Torch tensors from :class:`renyi.random.SecureSource` (a CSPRNG keyed by OS entropy).

    A thin adapter: uniforms are :meth:`renyi.random.RandomSource.uniform_open`
    (``(k + 1/2)·2⁻⁵³`` for uniformly random 53-bit ``k``); Gaussians are
    :meth:`renyi.random.RandomSource.normal` (the Box–Muller transform
    :func:`renyi.random.box_muller`, evaluated by numpy and shared with torch without a
    copy): the radius from 53-bit uniforms in float64 (tails reach ≈ 8.6σ, beyond which the
    mass is < 1e-17), the angle in float64, or from 24-bit uniforms in float32 when ``dtype``
    is 32-bit or narrower, then rounded to ``dtype``. Large draws come from the ChaCha20
    keystream under a fresh ``os.urandom`` key (:func:`renyi.random.secure_random_bytes`).
    Like every floating-point Gaussian sampler this is not immune to the floating-point
    attacks of Mironov (2012) / Jin et al. (2022) on the low-order bits; the randomness itself
    is cryptographically secure and unpredictable. Its state cannot be saved or replayed, by
    design.
    """

    secure = True

    def __init__(self) -> None:
        self.source: rrandom.RandomSource = rrandom.get_source(None)

    def uniform(self, n: int) -> torch.Tensor:
        n = check_int("n", n, 0)
        if not _trusted_secure(self):
            raise fail("random_source", self, "a SecureRandomSource backed by renyi's OS source")
        return torch.from_numpy(self.source.uniform_open(n))

    def normal(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        # renyi.noise's full-precision sampler (float64), torch's CPU kernels;
        # raw normals are not for release: DPOptimizer snaps the noisy sum to the lattice
        from renyi import noise

        z = noise.standard_normal(math.prod(shape), rng=self.source, torch_kernel=True)
        return z.reshape(tuple(shape)).to(dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "secure"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "secure":
            raise fail("state['kind']", state.get("kind"), "'secure' (state of a secure source)")


class SeededRandomSource(TorchRandomSource):
    """A seeded ``torch.Generator`` (Philox/Mersenne, *not* a CSPRNG): experiments only.

    Warns once per process with :class:`~renyi.errors.InsecureRandomnessWarning` (the
    warning of :mod:`renyi.random`, shared with seeded numpy Generators). Its state
    round-trips through :meth:`state_dict`, which makes checkpoint/resume bit-exact.
    """

    secure = False

    def __init__(self, seed: int) -> None:
        seed = check_int("seed", seed, 0)
        rrandom._warn_insecure_once(
            "a seeded torch.Generator (DP-SGD)",
            "fine for reproducible experiments, not for releasing a model trained on real "
            "data (pass seed=None for the secure OS source)",
        )
        self.generator = torch.Generator().manual_seed(seed)

    def uniform(self, n: int) -> torch.Tensor:
        n = check_int("n", n, 0)
        u = torch.rand(n, generator=self.generator, dtype=torch.float64)
        # torch.rand is in [0, 1); shift by half an ulp of 2^-53 to stay in (0, 1).
        return u + 0.5 * _INV_2_53

    def normal(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.generator, dtype=dtype)

    def words(self, n: int) -> np.ndarray:
        """``n`` uniform 64-bit words from the generator (two 32-bit draws each), for
        :mod:`renyi.noise` (reproducible, predictable)."""
        n = check_int("n", n, 0)
        half = torch.randint(0, 2**32, (2 * n,), generator=self.generator, dtype=torch.int64)
        w = half.numpy().astype(np.uint64)
        return (w[:n] << np.uint64(32)) | w[n:]

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "seeded", "state": self.generator.get_state().tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "seeded":
            raise fail("state['kind']", state.get("kind"), "'seeded' (state of a seeded source)")
        self.generator.set_state(torch.tensor(state["state"], dtype=torch.uint8))


def make_random_source(seed: int | None = None) -> TorchRandomSource:
    """The secure OS source when ``seed`` is None, else a seeded (insecure) generator."""
    return SecureRandomSource() if seed is None else SeededRandomSource(seed)


def checked_random_source(
    random_source: Any, allow_predictable_sampling: bool = False
) -> TorchRandomSource:
    """The source a sampler may decide batch membership with: the rules of the noise.

    ``None`` gives the secure OS source. renyi's :class:`SecureRandomSource` (backed by renyi's
    own secure words) and :class:`SeededRandomSource` (which warned when it was made) are
    accepted by exact type: a subclass, a tampered secure source or any other object (one
    that returns zeros would put every example in every batch while the accountant charges
    ``q``) is refused with :class:`~renyi.errors.PrivacyParameterError`, unless
    ``allow_predictable_sampling=True`` says the caller vouches for it (it then warns:
    :class:`~renyi.errors.InsecureRandomnessWarning`).
    """
    if random_source is None:
        return SecureRandomSource()
    if type(random_source) is SecureRandomSource and _trusted_secure(random_source):
        return random_source
    if type(random_source) is SeededRandomSource:
        return random_source
    if not allow_predictable_sampling:
        raise fail(
            "random_source",
            random_source,
            "None (the secure OS source), SecureRandomSource or SeededRandomSource; a "
            "caller-supplied source decides who is in each batch, so it needs "
            "allow_predictable_sampling=True (renyi cannot check that its batches are the "
            "accounted sampling)",
        )
    rrandom._warn_insecure(
        f"a caller-supplied {type(random_source).__name__} for batch sampling "
        "(allow_predictable_sampling=True)",
        "renyi cannot vouch for its batches; leave random_source unset for the secure source",
    )
    return random_source  # type: ignore[no-any-return]


def _trusted_secure(source: SecureRandomSource) -> bool:
    """Its words come from one of renyi's own sources (exact type; a seeded one is
    reproducible and warns where it is used for noise)."""
    return rrandom.is_trusted_source(source.source)


def _refuse_default_collate(caller: Any) -> None:
    """Refuse, before the first batch, a ``DataLoader(batch_sampler=sampler)`` whose
    ``collate_fn`` is torch's ``default_collate``: it raises ``IndexError`` on the first
    empty batch, which Poisson sampling draws at random (an error that depends on the coins)."""
    from torch.utils.data import default_collate
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    it = caller.f_locals.get("self") if caller is not None else None
    if isinstance(it, _BaseDataLoaderIter) and it._collate_fn is default_collate:
        raise fail(
            "DataLoader collate_fn",
            "default_collate",
            "a collate_fn that handles empty batches (Poisson sampling draws them): "
            "DataLoader(dataset, batch_sampler=sampler, collate_fn="
            "renyi.dpsgd.EmptyBatchCollate(dataset)), or "
            "renyi.dpsgd.privacy.private_data_loader(dataset, sampler)",
        )


class _PrivacySamplerBase:
    """Shared plumbing: step counting, state, and the matching accounting event."""

    num_samples: int
    steps: int
    random_source: TorchRandomSource
    _position: int

    @property
    def neighbouring(self) -> Neighbouring:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def expected_batch_size(self) -> float:  # pragma: no cover - overridden
        raise NotImplementedError

    sampling: str  # the name of renyi.analysis.events.training_event's sampler

    def accounting_event(self, noise_multiplier: float) -> Event:  # pragma: no cover
        raise NotImplementedError

    def charged_event(self, noise_multiplier: float) -> Event:
        """The unit this sampler is accounted in: one step's event (per-step samplers)."""
        return self.accounting_event(noise_multiplier)

    def event_at(self, noise_multiplier: float, step: int) -> Event | None:
        """The event to charge before step ``step`` (0-based) is released, or None when an
        earlier charge already covers it. Per-step samplers: every step is charged."""
        return self.charged_event(noise_multiplier)

    def charges(self, steps: int) -> int:
        """How many :meth:`charged_event` charges the first ``steps`` steps make."""
        return check_int("steps", steps, 0)

    def _fixed_batch_setup(
        self,
        num_samples: int,
        batch_size: int,
        steps: int,
        random_source: TorchRandomSource | None,
        allow_predictable_sampling: bool = False,
    ) -> None:
        """Validate and store what every fixed-batch-size sampler holds (in this order)."""
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.batch_size = check_int("batch_size", batch_size, 1)
        if self.batch_size > self.num_samples:
            raise fail("batch_size", batch_size, f"an integer in [1, num_samples={num_samples}]")
        self.steps = check_int("steps", steps, 1)
        self.random_source = checked_random_source(random_source, allow_predictable_sampling)
        self._position = 0

    def _batch_size(self) -> int:
        return round(self.expected_batch_size)

    def _max_batch_size(self) -> int | None:
        return None

    def training_event(self, noise_multiplier: float, steps: int | None = None) -> Event:
        """The event of ``steps`` steps (default: one pass, ``len(self)``) with this sampler:
        :func:`renyi.analysis.events.training_event` for this sampler's kind and parameters."""
        return training_event(
            self.sampling,
            noise_multiplier,
            dataset_size=self.num_samples,
            batch_size=self._batch_size(),
            steps=self.steps if steps is None else steps,
            max_batch_size=self._max_batch_size(),
        )

    def __len__(self) -> int:
        return self.steps

    def _draw(self) -> torch.Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def __iter__(self) -> Iterator[list[int]]:
        _refuse_default_collate(sys._getframe(1))
        return self._batches()

    def _batches(self) -> Iterator[list[int]]:
        while self._position < self.steps:
            batch = self._draw()
            self._position += 1
            yield batch.tolist()
        self._position = 0

    def state_dict(self) -> dict[str, Any]:
        """Position within the current pass and the random source's state."""
        return {"position": self._position, "random_source": self.random_source.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the next iteration resumes after the saved batch."""
        position = check_int("state['position']", state["position"], 0)
        if position > self.steps:
            raise fail("state['position']", position, f"an integer in [0, steps={self.steps}]")
        self.random_source.load_state_dict(state["random_source"])
        self._position = position


class PoissonSampler(_PrivacySamplerBase):
    """Poisson subsampling: each of ``num_samples`` examples joins a batch w.p. ``sample_rate``.

    Use as a ``batch_sampler`` of a ``torch.utils.data.DataLoader``; one pass yields ``steps``
    batches of indices, independently drawn, of Binomial(n, q) sizes (empty batches are
    yielded, not skipped: skipping them would change the mechanism the accountant assumes).

    Guarantee: with :class:`~renyi.dpsgd.optimizer.DPOptimizer` each step is the Poisson
    subsampled Gaussian mechanism, add/remove neighbouring (Mironov, Talwar & Zhang 2019).

    Args:
        num_samples: dataset size n.
        sample_rate: q in (0, 1].
        steps: batches per pass (``len(sampler)``).
        random_source: defaults to the secure OS source.

    Example:
        >>> s = PoissonSampler(num_samples=100, sample_rate=0.1, steps=2)
        >>> s.expected_batch_size
        10.0
    """

    sampling = "poisson"

    def __init__(
        self,
        num_samples: int,
        sample_rate: float,
        steps: int,
        *,
        random_source: TorchRandomSource | None = None,
        allow_predictable_sampling: bool = False,
    ) -> None:
        self.num_samples = check_int("num_samples", num_samples, 1)
        self.sample_rate = check_range("sample_rate", sample_rate, 0.0, 1.0, low_open=True)
        self.steps = check_int("steps", steps, 1)
        self.random_source = checked_random_source(random_source, allow_predictable_sampling)
        self._position = 0

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.ADD_REMOVE

    @property
    def expected_batch_size(self) -> float:
        """q·n, the fixed divisor of the noisy gradient sum (never the realised size)."""
        return self.sample_rate * self.num_samples

    def accounting_event(self, noise_multiplier: float) -> Event:
        """One step: ``PoissonSampledEvent(q, GaussianEvent(noise_multiplier))``."""
        return PoissonSampledEvent(self.sample_rate, GaussianEvent(noise_multiplier))

    def sample_mask(self) -> torch.Tensor:
        """One Bernoulli(q) inclusion mask over all examples (bool tensor of length n)."""
        return self.random_source.uniform(self.num_samples) < self.sample_rate

    def _draw(self) -> torch.Tensor:
        return torch.nonzero(self.sample_mask()).flatten()


class FixedSizeSampler(_PrivacySamplerBase):
    """Each batch: a fresh uniformly random subset of exactly ``batch_size`` examples.

    Batches are drawn independently at every step (sampling without replacement within a
    batch, with replacement across batches) — the mechanism Wang, Balle & Kasiviswanathan
    (2019) analyse under **replace-one** neighbouring. The ε it yields is about a dataset of
    fixed size n in which one record is replaced; it is not comparable one-to-one with the
    add/remove ε of :class:`PoissonSampler`.

    Example:
        >>> s = FixedSizeSampler(num_samples=100, batch_size=10, steps=1)
        >>> [len(b) for b in s]
        [10]
    """

    sampling = "fixed-size"

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        steps: int,
        *,
        random_source: TorchRandomSource | None = None,
        allow_predictable_sampling: bool = False,
    ) -> None:
        self._fixed_batch_setup(
            num_samples, batch_size, steps, random_source, allow_predictable_sampling
        )

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.num_samples

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.REPLACE_ONE

    @property
    def expected_batch_size(self) -> float:
        return float(self.batch_size)

    def accounting_event(self, noise_multiplier: float) -> Event:
        """One step under replace-one: the sum moves by ≤ 2C, so the multiplier is σ/2."""
        return SampledWithoutReplacementEvent(
            self.num_samples,
            self.batch_size,
            GaussianEvent(noise_multiplier / 2.0, neighbouring=Neighbouring.REPLACE_ONE),
        )

    def _draw(self) -> torch.Tensor:
        idx = self.random_source.permutation_prefix(self.num_samples, self.batch_size)
        return torch.sort(idx).values


class TruncatedPoissonSampler(PoissonSampler):
    """Poisson sampling with a fixed maximum batch size (jax_privacy's truncated Poisson).

    Each example joins w.p. ``sample_rate``; a batch larger than ``max_batch_size`` is cut
    to a uniformly random subset of ``max_batch_size``. Per step
    ``TruncatedPoissonSampledEvent`` (add/remove). ``max_batch_size`` defaults to
    :func:`renyi.analysis.events.default_max_batch_size` of the expected batch size.

    Example:
        >>> s = TruncatedPoissonSampler(num_samples=100, sample_rate=0.1, steps=3,
        ...                             max_batch_size=12)
        >>> all(len(b) <= 12 for b in s)
        True
    """

    sampling = "truncated-poisson"

    def __init__(
        self,
        num_samples: int,
        sample_rate: float,
        steps: int,
        *,
        max_batch_size: int | None = None,
        random_source: TorchRandomSource | None = None,
        allow_predictable_sampling: bool = False,
    ) -> None:
        super().__init__(
            num_samples,
            sample_rate,
            steps,
            random_source=random_source,
            allow_predictable_sampling=allow_predictable_sampling,
        )
        cap = (
            default_max_batch_size(max(1, round(self.expected_batch_size)))
            if max_batch_size is None
            else max_batch_size
        )
        self.max_batch_size = min(check_int("max_batch_size", cap, 1), self.num_samples)

    def _max_batch_size(self) -> int | None:
        return self.max_batch_size

    def _batch_size(self) -> int:
        return max(1, round(self.expected_batch_size))

    def training_event(self, noise_multiplier: float, steps: int | None = None) -> Event:
        return SelfComposedEvent(
            self.accounting_event(noise_multiplier), self.steps if steps is None else steps
        )

    def accounting_event(self, noise_multiplier: float) -> Event:
        """One step: ``TruncatedPoissonSampledEvent(n, q, max_batch_size, Gaussian(σ))``."""
        return TruncatedPoissonSampledEvent(
            self.num_samples, self.sample_rate, self.max_batch_size, GaussianEvent(noise_multiplier)
        )

    def _draw(self) -> torch.Tensor:
        idx = super()._draw()
        if idx.numel() <= self.max_batch_size:
            return idx
        keep = self.random_source.permutation_prefix(int(idx.numel()), self.max_batch_size)
        return torch.sort(idx[keep]).values


class _EpochSampler(_PrivacySamplerBase):
    """Samplers analysed per epoch: every example is used once per epoch."""

    batch_size: int
    _epoch: list[torch.Tensor]

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        steps: int,
        *,
        random_source: TorchRandomSource | None = None,
        allow_predictable_sampling: bool = False,
    ) -> None:
        self._fixed_batch_setup(
            num_samples, batch_size, steps, random_source, allow_predictable_sampling
        )
        self._epoch = []
        self._served = 0  # batches served since construction (or since the restored state)

    @property
    def steps_per_epoch(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def _batch_size(self) -> int:
        return self.batch_size

    def accounting_event(self, noise_multiplier: float) -> Event:
        raise UnsupportedEventError(
            f"{type(self).__name__} is analysed per epoch, not per step (a per-step event "
            "would misstate its privacy): account with sampler.training_event(noise_multiplier"
            ", steps), or use PoissonSampler / FixedSizeSampler for per-step accounting"
        )

    def charged_event(self, noise_multiplier: float) -> Event:
        """One whole epoch's event (``RandomAllocationEvent`` / ``ShuffledEvent``): the
        one-epoch :meth:`training_event`, i.e. :func:`renyi.analysis.events.training_event`."""
        whole = self.training_event(noise_multiplier, self.steps_per_epoch)
        if not isinstance(whole, SelfComposedEvent) or whole.count != 1:  # pragma: no cover
            raise UnsupportedEventError(f"no one-epoch event for {type(self).__name__}")
        return whole.event

    def event_at(self, noise_multiplier: float, step: int) -> Event | None:
        """The epoch's event at the first step of each epoch (``step % steps_per_epoch ==
        0``), before any of its noise is released; None within an epoch (already paid)."""
        step = check_int("step", step, 0)
        return self.charged_event(noise_multiplier) if step % self.steps_per_epoch == 0 else None

    def charges(self, steps: int) -> int:
        """Epochs begun in the first ``steps`` steps, ``ceil(steps / steps_per_epoch)``."""
        return -(-check_int("steps", steps, 0) // self.steps_per_epoch)

    @property
    def sample_rate(self) -> float:
        """The fraction of the data in one batch on average (``1 / steps_per_epoch`` for
        random allocation, ``b / n`` for shuffling); descriptive only: these samplers are
        accounted per epoch, never as Poisson sampling at this rate."""
        return self.expected_batch_size / self.num_samples

    def _new_epoch(self) -> list[torch.Tensor]:  # pragma: no cover - overridden
        raise NotImplementedError

    def _draw(self) -> torch.Tensor:
        # Epochs are counted over every batch served, across passes: batch number s belongs
        # to epoch s // steps_per_epoch, which is where the optimizer charges (a pass of
        # `steps` batches that ends mid-epoch continues that epoch's allocation next pass).
        k = self._served % self.steps_per_epoch
        if k == 0:
            self._epoch = self._new_epoch()
        elif not self._epoch:  # pragma: no cover - load_state_dict refuses mid-epoch states
            raise fail("sampler state", "mid-epoch", "an epoch boundary")
        self._served += 1
        return self._epoch[k]

    def state_dict(self) -> dict[str, Any]:
        """Position within the pass, batches served in all, and the random source's state."""
        state = super().state_dict()
        state["served"] = self._served
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, at an epoch boundary only (the allocation of a
        running epoch is not saved: resuming mid-epoch would draw a second one)."""
        served = check_int("state['served']", state.get("served", state["position"]), 0)
        if served % self.steps_per_epoch:
            raise fail(
                "state['served']",
                served,
                "an epoch boundary (a multiple of steps_per_epoch): the epoch's allocation "
                "is not saved",
            )
        super().load_state_dict(state)
        self._served = served
        self._epoch = []


class BallsInBinsSampler(_EpochSampler):
    """Random allocation ("balls in bins"): each epoch, every example is put in one of
    ``t = n // batch_size`` batches uniformly at random and independently of the others
    (batch sizes are Binomial(n, 1/t), mean ``n / t >= batch_size``).

    Accounted per epoch as ``RandomAllocationEvent(t, GaussianEvent(σ))`` under add/remove
    (Chua et al. 2024; Feldman & Shenfeld 2025): about as private as Poisson sampling with
    ``q = 1/t``, with every example seen exactly once per epoch.

    Example:
        >>> s = BallsInBinsSampler(num_samples=100, batch_size=10, steps=10)
        >>> sorted(i for b in s for i in b) == list(range(100))
        True
    """

    sampling = "random-allocation"

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.batch_size

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.ADD_REMOVE

    @property
    def expected_batch_size(self) -> float:
        return self.num_samples / self.steps_per_epoch

    def _new_epoch(self) -> list[torch.Tensor]:
        t = self.steps_per_epoch
        bins = torch.clamp((self.random_source.uniform(self.num_samples) * t).long(), max=t - 1)
        order = torch.argsort(bins, stable=True)
        counts = torch.bincount(bins, minlength=t).tolist()
        return list(torch.split(order, counts))


class ShuffleSampler(_EpochSampler):
    """Epoch shuffling: each epoch a uniformly random permutation cut into consecutive
    batches of ``batch_size`` (the last one shorter if ``batch_size`` does not divide n).

    Accounted per epoch as ``ShuffledEvent`` under replace-one: the proven bound is one
    Gaussian run per epoch, **without** amplification (no tighter sound analysis is known;
    :func:`renyi.analysis.allocation.one_of_t_epsilon_lower_bound` shows how much privacy shuffling
    provably lacks). It never reports a Poisson ε.

    Example:
        >>> s = ShuffleSampler(num_samples=10, batch_size=4, steps=3)
        >>> [len(b) for b in s]
        [4, 4, 2]
    """

    sampling = "shuffle"

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.num_samples // self.batch_size)

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.REPLACE_ONE

    @property
    def expected_batch_size(self) -> float:
        return float(self.batch_size)

    def _new_epoch(self) -> list[torch.Tensor]:
        order = torch.argsort(self.random_source.uniform(self.num_samples))
        return list(torch.split(order, self.batch_size))
