"""DP-SGD with individual privacy accounting: each record pays for its own gradients.

:func:`train_individual` runs Poisson-sampled DP-SGD under a per-record Rényi filter
(:class:`renyi.individual.IndividualRdpFilter`, Feldman & Zrnic 2021). The noise multiplier is
calibrated so that the *planned* run (``epochs`` at the worst case, every gradient of norm C)
meets the target (ε, δ) under the RDP accountant; every record is then charged, at every
step, the RDP of the subsampled Gaussian at its own clipped gradient norm, and takes part in
sampling only while its total stays within that planned curve. With ``max_epochs`` above
``epochs``, records with small gradients keep training after the worst-case ones are retired.

Guarantee: every record's privacy loss is at most the target (ε, δ) (add/remove one record),
the same statement as standard DP-SGD with ``epochs``; records that spent less get a better
one, reported per record. Soundness conditions, checked here:

* every active record's clipped norm is computed at every step from the current model
  (sampled or not: whether a record was sampled is secret), and charged rounded up;
* the sampled records' gradients are clipped in the same step, and a record whose clipped
  norm there exceeds what it was charged (dropout or other randomness in the model makes the
  two passes differ) stops training with an error before the update is released.

Cost: one extra forward/backward pass over the active records per step (their norms), so a
step costs about ``1 / q`` ordinary steps — affordable on small data sets, which is where
individual accounting gains most (Feldman & Zrnic report the same cost).

Example:
    >>> import torch
    >>> from torch import nn
    >>> x, y = torch.randn(64, 5), torch.randint(0, 2, (64,))
    >>> model = nn.Linear(5, 2)
    >>> run = train_individual(model, torch.optim.SGD(model.parameters(), lr=0.1), (x, y),
    ...     loss_fn=nn.CrossEntropyLoss(), target_epsilon=2.0, delta=1e-5, batch_size=16,
    ...     epochs=1, max_epochs=2)
    >>> run.summary(1e-5)["max"] <= 2.0
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from renyi import noise
from renyi._validation import check_delta, check_positive, fail
from renyi.analysis.events import GaussianEvent, PoissonSampledEvent, SelfComposedEvent
from renyi.calibration import calibrate_noise_multiplier, epochs_to_steps
from renyi.dpsgd.clipping import ClippedGradientEngine
from renyi.dpsgd.sampler import SecureRandomSource, SeededRandomSource
from renyi.individual import IndividualRdpFilter

__all__ = ["IndividualSensitivityError", "IndividualTraining", "train_individual"]

#: Relative slack added to a measured norm before it is rounded up to the filter's grid, so
#: that recomputing the same norm in another batch (different float summation order) can
#: never exceed what was charged.
NORM_SLACK = 1e-6


class IndividualSensitivityError(RuntimeError):
    """A sampled record's clipped gradient exceeded the sensitivity it was charged for."""


@dataclass
class IndividualTraining:
    """The result of :func:`train_individual`."""

    model: nn.Module
    filter: IndividualRdpFilter
    noise_multiplier: float
    sample_rate: float
    planned_steps: int
    steps: int
    losses: list[float] = field(default_factory=list)
    receipt: Any = None

    def epsilons(self, delta: float) -> np.ndarray:
        """Each record's ε at ``delta`` (from what it actually spent)."""
        return self.filter.epsilons(delta)

    def summary(self, delta: float) -> dict[str, Any]:
        """``min/median/p90/max`` per-record ε, the budget ε, retired records and steps."""
        return self.filter.summary(delta)


def _tensors(data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(data, tuple | list) and len(data) == 2:
        x, y = data
    elif isinstance(data, torch.utils.data.TensorDataset) and len(data.tensors) == 2:
        x, y = data.tensors
    else:
        raise fail("data", type(data).__name__, "a TensorDataset or a tuple (inputs, targets)")
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or len(x) != len(y):
        raise fail("data", "tensors", "inputs and targets tensors of the same length")
    return x, y


def _total_norms(engine: ClippedGradientEngine, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    per_param = engine.per_example_norms(x, y)
    return torch.stack([v.to(torch.float64) ** 2 for v in per_param.values()]).sum(0).sqrt()


def train_individual(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Any,
    *,
    loss_fn: Any,
    target_epsilon: float,
    delta: float,
    batch_size: int,
    epochs: float,
    max_epochs: float | None = None,
    max_grad_norm: float = 1.0,
    levels: int = 64,
    norm_chunk: int = 1024,
    budget: Any = None,
    seed: int | None = None,
    progress: bool = False,
) -> IndividualTraining:
    """Poisson-sampled DP-SGD with a per-record Rényi filter (module docstring).

    Args:
        model, optimizer, loss_fn: as for :func:`renyi.dpsgd.make_private` (flat clipping).
        data: ``TensorDataset(x, y)`` or ``(x, y)``.
        target_epsilon, delta: every record's guarantee.
        batch_size: expected batch ``q·n``.
        epochs: the planned worst-case run that defines the budget (and σ).
        max_epochs: how long records with budget left may keep training (default: ``epochs``,
            stop at the plan; longer runs lost accuracy on digits, see docs/personalized.md).
        max_grad_norm: C.
        levels: sensitivity grid of the filter (charges rounded up to multiples of C/levels).
        budget: optional :class:`~renyi.budget.Budget`: the worst-case event (the per-record
            guarantee) is charged once, before training, as one entry.
        seed: ``None`` (default) for the secure OS source; an int for reproducible,
            **insecure** experiments (warns). The noise is released on a fixed lattice by
            :func:`renyi.noise.gaussian` either way.
    """
    x, y = _tensors(data)
    n = len(x)
    target = check_positive("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    c = check_positive("max_grad_norm", max_grad_norm)
    planned_steps, q = epochs_to_steps(epochs, n, batch_size)
    max_epochs = epochs if max_epochs is None else max_epochs
    max_steps, _ = epochs_to_steps(max_epochs, n, batch_size)
    if max_steps < planned_steps:
        raise fail("max_epochs", max_epochs, f">= epochs={epochs}")
    sigma = calibrate_noise_multiplier(target, delta, q, planned_steps, accountant="rdp")
    filt = IndividualRdpFilter(
        n,
        noise_multiplier=sigma.noise_multiplier,
        sampling_rate=q,
        planned_steps=planned_steps,
        levels=levels,
    )
    if filt.budget_epsilon(delta) > target:  # pragma: no cover - calibration verifies this
        raise fail("target_epsilon", target, "a target the filter's orders can meet")
    receipt = None
    if budget is not None:
        worst = SelfComposedEvent(
            PoissonSampledEvent(q, GaussianEvent(sigma.noise_multiplier)), planned_steps
        )
        receipt = budget.spend(
            worst,
            label="DP-SGD with individual accounting",
            metadata={
                "accounting": "individual Rényi filter (Feldman & Zrnic 2021)",
                "guarantee": f"every record (ε, δ) <= ({target}, {delta}); add/remove one record",
                "max_steps": max_steps,
            },
        )
    source = SecureRandomSource() if seed is None else SeededRandomSource(seed)
    noise_rng = None if seed is None else np.random.default_rng(seed)
    engine = ClippedGradientEngine(model, loss_fn, max_grad_norm=c)
    std = sigma.noise_multiplier * c
    run = IndividualTraining(model, filt, sigma.noise_multiplier, q, planned_steps, 0, [], receipt)
    iterator: Any = range(max_steps)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="DP-SGD (individual)", unit="step")
    for _ in iterator:
        active = np.flatnonzero(filt.active)
        if active.size == 0:
            break
        s = np.zeros(n)
        for start in range(0, active.size, norm_chunk):
            idx = torch.as_tensor(active[start : start + norm_chunk])
            norms = _total_norms(engine, x[idx], y[idx]).cpu().numpy()
            s[active[start : start + norm_chunk]] = np.minimum(norms * (1 + NORM_SLACK) / c, 1.0)
        admitted = filt.admit(s)
        if not admitted.any():  # everyone's budget is spent
            break
        charged = filt.level(s) / filt.levels
        mask = admitted & (source.uniform(n).numpy() < q)
        idx = torch.as_tensor(np.flatnonzero(mask))
        grads, losses, batch_norms = engine.clipped_grad_sum(x[idx], y[idx])
        clipped = np.minimum(batch_norms.to(torch.float64).cpu().numpy(), c)
        over = clipped > charged[mask] * c
        if over.any():
            raise IndividualSensitivityError(
                f"{int(over.sum())} sampled record(s) have a clipped gradient norm above the "
                "norm they were charged for at this step (the model is not deterministic "
                "between two passes, e.g. dropout in train mode); no update was released"
            )
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        flat = torch.cat([grads[name].reshape(-1).to(torch.float64) for name, _ in named])
        # the one lattice-safe release primitive: clipped sum + N(0, σ²C²) on a fixed lattice
        released = noise.gaussian(flat, std, rng=noise_rng)
        offset = 0
        for _, p in named:
            g = released[offset : offset + p.numel()].view(p.shape)
            offset += p.numel()
            p.grad = (g / (q * n)).to(p.dtype)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.steps += 1
        run.losses.append(float(losses.mean()) if losses.numel() else float("nan"))
    return run
