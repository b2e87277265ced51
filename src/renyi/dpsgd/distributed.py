"""Multi-process data-parallel DP-SGD with ``torch.distributed`` (gloo on CPU, NCCL on GPU).

One logical DP-SGD step is spread over ``world_size`` ranks without changing the mechanism:

* **Sampling** — :class:`DistributedPoissonSampler`: rank 0 draws the global Poisson mask
  (each of the n examples independently with probability q, from its random source) and
  broadcasts it; rank r takes every ``world_size``-th sampled index starting at r. The union
  over ranks is exactly one Poisson(q) batch, as the accountant assumes.
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

Guarantee: the same as single-process DP-SGD with the same (q, σ, C, T) — add/remove
neighbouring, Poisson-subsampled Gaussian (Abadi et al. 2016; Mironov, Talwar & Zhang 2019).

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
from renyi.dpsgd.sampler import PoissonSampler, TorchRandomSource

__all__ = ["DistributedDPOptimizer", "DistributedPoissonSampler"]


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


class DistributedDPOptimizer(DPOptimizer):
    """:class:`~renyi.dpsgd.optimizer.DPOptimizer` whose clipped sums are all-reduced.

    Takes the same arguments. Noise is drawn on rank 0 only (from its random source) and
    enters the all-reduce once. Parameters are broadcast from rank 0 at construction.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
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
