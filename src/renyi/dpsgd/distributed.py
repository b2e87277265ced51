"""Multi-process data-parallel DP-SGD with ``torch.distributed`` (gloo on CPU, NCCL on GPU).

One logical DP-SGD step is spread over ``world_size`` ranks without changing the mechanism:

* **Sampling** — :class:`DistributedPoissonSampler`: rank 0 draws the global Poisson mask
  (each of the n examples independently with probability q, from its random source) and
  broadcasts it; rank r takes every ``world_size``-th sampled index starting at r. The union
  over ranks is exactly one Poisson(q) batch, as the accountant assumes. The epoch samplers
  likewise: :class:`DistributedBallsInBinsSampler` and :class:`DistributedShuffleSampler`
  draw each epoch's allocation (permutation) on rank 0, broadcast it at the epoch's first
  batch, and give rank r every ``world_size``-th index of each global batch.
* **Clipping** — each rank clips the per-example gradients of its share and sums them.
* **Noise, once** — :class:`DistributedDPOptimizer` adds ``N(0, σ² C² I)`` on rank 0 only,
  then all-reduces (sums) the noisy partial sums: every rank ends with
  ``Σ_all clip(g_i) + N(0, σ² C² I)`` — one noise draw, the total variance of the
  single-process mechanism (not ``world_size`` times it, nor split into under-noised parts).
* **Scale, account, step** — as in :class:`~renyi.dpsgd.optimizer.DPOptimizer`, identically
  on every rank (same gradient, same update, same accountant).

The model is *not* wrapped in ``torch.nn.parallel.DistributedDataParallel``: its gradient
hooks would all-reduce un-clipped gradients. The initial parameters are broadcast from rank 0
when the optimizer is built.

Guarantee: the same as single-process DP-SGD with the same sampler, σ, C and T — add/remove
neighbouring, Poisson-subsampled Gaussian (Abadi et al. 2016; Mironov, Talwar & Zhang 2019),
or the epoch samplers' events, charged per epoch on every rank alike. The optimizer refuses
a sampler that is not one of these distributed ones: every rank iterating the *same* global
batches would add each clipped gradient ``world_size`` times (sensitivity ``world_size · C``
against noise for ``C``).

Example (run under ``torchrun --nproc-per-node 2``)::

    dist.init_process_group("gloo")
    sampler = DistributedPoissonSampler(len(train), q, steps)
    opt = DistributedDPOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), model=model,
                                 loss_fn=nn.CrossEntropyLoss(), noise_multiplier=1.1,
                                 max_grad_norm=1.0, sampler=sampler)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from renyi._validation import fail
from renyi.dpsgd.optimizer import DPOptimizer
from renyi.dpsgd.sampler import (
    BallsInBinsSampler,
    PoissonSampler,
    ShuffleSampler,
    TorchRandomSource,
    _EpochSampler,
)

__all__ = [
    "DistributedBallsInBinsSampler",
    "DistributedDPOptimizer",
    "DistributedPoissonSampler",
    "DistributedShuffleSampler",
]


def _require_initialised() -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        raise fail(
            "torch.distributed",
            "not initialised",
            "an initialised process group (dist.init_process_group('gloo', ...))",
        )
    return dist.get_rank(), dist.get_world_size()


class DistributedPoissonSampler(PoissonSampler):
    """Poisson sampling over all ranks: rank 0 draws and broadcasts, each rank gets a share.

    Every rank must iterate it in lock-step (one broadcast per step). Only rank 0's random
    source is used. ``expected_batch_size`` is the *global* q·n, the divisor of the summed
    gradient on every rank.
    """

    def __init__(
        self,
        num_samples: int,
        sample_rate: float,
        steps: int,
        *,
        random_source: TorchRandomSource | None = None,
    ) -> None:
        super().__init__(num_samples, sample_rate, steps, random_source=random_source)
        self.rank, self.world_size = _require_initialised()

    def _draw(self) -> torch.Tensor:
        if self.rank == 0:
            mask = self.sample_mask().to(torch.uint8)
        else:
            mask = torch.empty(self.num_samples, dtype=torch.uint8)
        dist.broadcast(mask, src=0)
        indices = torch.nonzero(mask).flatten()
        return indices[self.rank :: self.world_size]


class _DistributedEpoch(_EpochSampler):
    """Rank 0 draws each epoch (through the concrete sampler's ``_new_epoch``) and
    broadcasts it; rank r keeps every ``world_size``-th index of each global batch."""

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        steps: int,
        *,
        random_source: TorchRandomSource | None = None,
    ) -> None:
        super().__init__(num_samples, batch_size, steps, random_source=random_source)
        self.rank, self.world_size = _require_initialised()

    def _new_epoch(self) -> list[torch.Tensor]:
        steps = int(self.steps_per_epoch)
        if self.rank == 0:
            batches = super()._new_epoch()
            order = torch.cat(batches).long()
            counts = torch.tensor([len(b) for b in batches], dtype=torch.long)
        else:
            order = torch.empty(self.num_samples, dtype=torch.long)
            counts = torch.empty(steps, dtype=torch.long)
        dist.broadcast(order, src=0)
        dist.broadcast(counts, src=0)
        return [b[self.rank :: self.world_size] for b in torch.split(order, counts.tolist())]


class DistributedBallsInBinsSampler(_DistributedEpoch, BallsInBinsSampler):
    """Balls in bins over all ranks: one global allocation per epoch (drawn on rank 0,
    broadcast), each rank a share of every batch. Iterate it in lock-step on every rank.
    ``expected_batch_size`` is the global ``n / t``."""


class DistributedShuffleSampler(_DistributedEpoch, ShuffleSampler):
    """Shuffling over all ranks: one global permutation per epoch (drawn on rank 0,
    broadcast), each rank a share of every batch. Iterate it in lock-step on every rank."""


_DISTRIBUTED_SAMPLERS = (
    DistributedPoissonSampler,
    DistributedBallsInBinsSampler,
    DistributedShuffleSampler,
)


class DistributedDPOptimizer(DPOptimizer):
    """:class:`~renyi.dpsgd.optimizer.DPOptimizer` whose clipped sums are all-reduced.

    Takes the same arguments. Noise is drawn on rank 0 only (from its random source) and
    enters the all-reduce once. Parameters are broadcast from rank 0 at construction.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        sampler = kwargs.get("sampler")
        if not isinstance(sampler, _DISTRIBUTED_SAMPLERS):
            raise fail(
                "sampler",
                type(sampler).__name__,
                "a distributed sampler (DistributedPoissonSampler, DistributedBallsInBinsSampler"
                " or DistributedShuffleSampler): with one that every rank iterates alike, each "
                "example would be clipped and summed on every rank (sensitivity world_size·C)",
            )
        super().__init__(optimizer, **kwargs)
        self.rank, self.world_size = _require_initialised()
        with torch.no_grad():
            for p in self._params:
                dist.broadcast(p.data, src=0)

    def add_noise(self) -> None:
        """The ranks' partial sums are summed; rank 0 releases the total with N(0, σ²C²I) on
        the lattice (:meth:`release_noisy_sum`) and broadcasts it to ``p.grad`` everywhere."""
        pieces = []
        for name, p in zip(self._param_names, self._params, strict=True):
            summed = self._summed.get(name) if self._summed is not None else None
            pieces.append(
                summed.detach().to(torch.float64).reshape(-1)
                if summed is not None
                else torch.zeros(p.numel(), dtype=torch.float64)
            )
        flat = torch.cat(pieces)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        if self.rank == 0:  # the single noise draw of this step, on the total (lattice-safe)
            flat = self.release_noisy_sum(flat)
        dist.broadcast(flat, src=0)
        offset = 0
        for p in self._params:
            chunk = flat[offset : offset + p.numel()].reshape(p.shape)
            p.grad = chunk.to(dtype=p.dtype, device=p.device)
            offset += p.numel()
