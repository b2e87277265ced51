"""User-level DP-SGD: one person may own many examples (Charles et al. 2024).

"One record = one person" fails when people contribute several examples (messages, visits,
photos): example-level ε then says nothing about a person. Two ways to train with a
user-level guarantee (add/remove one user with all their examples), after bounding each user
to at most ``examples_per_user`` examples (:func:`group_by_user`):

* **ULS** (user-level sampling): users are Poisson-sampled; a sampled user's gradient is the
  gradient of the mean loss over their examples, clipped to C. Users are the records of
  ordinary DP-SGD: the accounting is the Poisson-subsampled Gaussian at user level.
* **ELS** (example-level sampling): examples are Poisson-sampled and clipped as usual; a
  user's ``k`` examples add ``Binomial(k, q)`` clipped gradients, priced by
  :class:`renyi.analysis.events.PoissonSampledGroupEvent` (the binomial mixture of Gaussians). The
  noise is calibrated to the *user-level* target.

Group privacy applied to example-level DP-SGD (the textbook answer) is also reported, for
comparison: it is valid but far looser (:func:`group_privacy_epsilon`).

Example:
    >>> import torch
    >>> x, y = torch.randn(12, 3), torch.arange(12) % 2
    >>> users = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 3, 3])
    >>> data = group_by_user(x, y, users, examples_per_user=3)
    >>> tuple(data.inputs.shape), data.targets[1].tolist(), data.dropped
    ((4, 3, 3), [1, 0, -100], 2)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from renyi._validation import check_delta, check_int, check_positive, fail
from renyi.accountants import RdpAccountant
from renyi.analysis.conversions import group_privacy_rdp, rdp_to_dp
from renyi.analysis.events import (
    Event,
    GaussianEvent,
    PoissonSampledEvent,
    PoissonSampledGroupEvent,
    SelfComposedEvent,
)
from renyi.calibration import epochs_to_steps
from renyi.errors import PrivacyParameterError

__all__ = [
    "PAD_TARGET",
    "PerUser",
    "UserData",
    "UserLevelTraining",
    "calibrate_user_level",
    "group_by_user",
    "group_privacy_epsilon",
    "make_private_user_level",
    "user_level_event",
    "user_mean_loss",
]

#: Target value of padding slots (CrossEntropyLoss's default ``ignore_index``).
PAD_TARGET = -100

Level = Literal["ELS", "ULS"]


@dataclass(frozen=True)
class UserData:
    """Examples grouped by user: ``inputs [U, K, ...]``, ``targets [U, K]`` (PAD_TARGET pads)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    counts: torch.Tensor
    dropped: int

    @property
    def num_users(self) -> int:
        return int(self.inputs.shape[0])

    def examples(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The kept examples, flattened, with the user index of each: for ELS training."""
        mask = self.targets != PAD_TARGET
        owner = torch.arange(self.num_users).unsqueeze(1).expand_as(self.targets)
        return self.inputs[mask], self.targets[mask], owner[mask]


def group_by_user(
    inputs: torch.Tensor, targets: torch.Tensor, user_ids: Any, *, examples_per_user: int
) -> UserData:
    """Group examples by user id, keeping at most ``examples_per_user`` per user.

    A user's first ``examples_per_user`` examples in data order are kept (a rule that does not
    look at the examples' content); the rest are dropped and counted in ``dropped``. Users
    with fewer are padded (targets ``PAD_TARGET``). Classification targets (integers).
    """
    k = check_int("examples_per_user", examples_per_user, minimum=1)
    ids = torch.as_tensor(np.asarray(user_ids))
    if ids.ndim != 1 or len(ids) != len(inputs) or len(targets) != len(inputs):
        raise fail("user_ids", f"length {len(ids)}", f"one id per example ({len(inputs)})")
    if targets.dtype.is_floating_point or (targets == PAD_TARGET).any():
        raise fail("targets", "values", f"integer class labels (not {PAD_TARGET})")
    uniq, inverse = torch.unique(ids, return_inverse=True)
    u = len(uniq)
    x = torch.zeros((u, k, *inputs.shape[1:]), dtype=inputs.dtype)
    t = torch.full((u, k), PAD_TARGET, dtype=targets.dtype)
    counts = torch.zeros(u, dtype=torch.long)
    dropped = 0
    for i, owner in enumerate(inverse.tolist()):
        c = int(counts[owner])
        if c >= k:
            dropped += 1
            continue
        x[owner, c] = inputs[i]
        t[owner, c] = targets[i]
        counts[owner] = c + 1
    return UserData(x, t, counts, dropped)


def user_mean_loss(
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Per-user loss for ULS: the mean of the example losses of each user's real examples.

    ``outputs [B, K, classes]``, ``targets [B, K]`` → ``[B]``; padding slots are ignored.
    ``loss_fn(outputs [N, classes], targets [N]) -> [N]`` defaults to cross-entropy.
    """
    per_example = loss_fn or nn.CrossEntropyLoss(reduction="none")

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        b, k = targets.shape
        mask = targets != PAD_TARGET
        flat_out = outputs.reshape(b * k, -1)
        flat_t = torch.where(mask, targets, torch.zeros_like(targets)).reshape(-1)
        per = per_example(flat_out, flat_t).reshape(b, k) * mask
        return per.sum(dim=1) / mask.sum(dim=1).clamp_min(1)

    return loss


def user_level_event(
    level: Level, noise_multiplier: float, sample_rate: float, examples_per_user: int
) -> Event:
    """The user-level event of one step: ULS → subsampled Gaussian over users; ELS → the
    binomial mixture over a user's ``examples_per_user`` Poisson-sampled examples."""
    gauss = GaussianEvent(check_positive("noise_multiplier", noise_multiplier))
    if level == "ULS":
        return PoissonSampledEvent(sample_rate, gauss)
    if level == "ELS":
        return PoissonSampledGroupEvent(sample_rate, examples_per_user, gauss)
    raise fail("level", level, "'ELS' or 'ULS'")


def group_privacy_epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, group_size: int, delta: float
) -> float:
    """User-level ε by group privacy from example-level DP-SGD (Mironov 2017, Prop. 2)."""
    acc = RdpAccountant().compose(
        PoissonSampledEvent(sample_rate, GaussianEvent(noise_multiplier)), count=steps
    )
    orders, eps = group_privacy_rdp(acc.curve.orders, acc.curve.epsilons, group_size)
    return float(rdp_to_dp(orders, eps, check_delta(delta))[0])


def calibrate_user_level(
    level: Level,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    examples_per_user: int,
    *,
    rtol: float = 1e-3,
) -> float:
    """Smallest σ (within ``rtol``, rounded up) whose user-level ε at δ is ≤ the target (RDP).

    ε is monotone in σ; a geometric bisection brackets the boundary and the returned σ is
    the upper end, verified to meet the target.
    """
    target = check_positive("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    steps = check_int("steps", steps, minimum=1)

    def eps(sigma: float) -> float:
        ev = user_level_event(level, sigma, sample_rate, examples_per_user)
        return RdpAccountant().compose(ev, count=steps).epsilon(delta).epsilon

    lo, hi = 0.05, 1.0
    while eps(hi) > target:
        lo, hi = hi, hi * 4.0
        if hi > 1e4:
            raise PrivacyParameterError(
                f"target_epsilon={target_epsilon} is unreachable with noise_multiplier <= 1e4 "
                f"at user level ({level}, {examples_per_user} examples per user)"
            )
    while hi / lo > 1 + rtol:
        mid = math.sqrt(lo * hi)
        if eps(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


class PerUser(nn.Module):
    """Runs ``model`` on every example of every user: ``[B, K, ...] -> [B, K, out...]``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, k = x.shape[:2]
        out = self.model(x.reshape(b * k, *x.shape[2:]))
        return out.reshape(b, k, *out.shape[1:])


@dataclass
class UserLevelTraining:
    """A user-level private training set up by :func:`make_private_user_level`."""

    level: str
    private: Any
    event: Event
    examples_per_user: int
    target_epsilon: float
    delta: float
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return int(self.private.steps)

    def user_epsilon(self, delta: float | None = None) -> float:
        """User-level ε after the steps taken so far (RDP accountant)."""
        taken = int(self.private.optimizer.steps_taken)
        if taken == 0:
            return 0.0
        acc = RdpAccountant().compose(self.event, count=taken)
        return acc.epsilon(self.delta if delta is None else check_delta(delta)).epsilon

    def group_privacy_epsilon(self, delta: float | None = None) -> float:
        """What group privacy from example-level accounting would claim (ELS only)."""
        if self.level != "ELS":
            raise fail("level", self.level, "'ELS' (ULS is accounted at user level directly)")
        p = self.private
        return group_privacy_epsilon(
            p.noise_multiplier,
            p.sample_rate,
            p.steps,
            self.examples_per_user,
            self.delta if delta is None else delta,
        )

    def fit(self) -> list[float]:
        """Run the planned steps (``optimizer.accumulate`` + ``step``); mean loss per step."""
        losses: list[float] = []
        opt = self.private.optimizer
        while opt.steps_taken < self.steps:  # the loader yields one epoch per pass
            drawn = 0
            for xb, yb in self.private.data_loader:
                drawn += 1
                opt.zero_grad()
                per_example, _ = opt.accumulate(xb, yb)
                opt.step()
                self.batch_sizes.append(len(per_example))
                losses.append(float(per_example.mean()) if per_example.numel() else math.nan)
            if drawn == 0:  # the plan's batches are all drawn
                break
        return losses


def make_private_user_level(
    level: Level,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: UserData,
    *,
    target_epsilon: float,
    delta: float,
    epochs: float,
    batch_size: int,
    max_grad_norm: float,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    budget: Any = None,
) -> UserLevelTraining:
    """DP-SGD with a user-level (ε, δ) guarantee, ELS or ULS (module docstring).

    ``batch_size`` is the expected number of users per batch (ULS) or of examples (ELS);
    ``loss_fn(outputs [N, classes], targets [N]) -> [N]`` (default cross-entropy). σ is
    calibrated with the RDP accountant for the user-level event.
    """
    from torch.utils.data import TensorDataset

    from renyi.dpsgd.privacy import make_private

    per_example = loss_fn or nn.CrossEntropyLoss(reduction="none")
    k = int(data.inputs.shape[1])
    extra: dict[str, Any] = {}
    module: nn.Module
    if level == "ULS":  # users are the records: one clipped mean-loss gradient per user
        module, records = PerUser(model), TensorDataset(data.inputs, data.targets)
        loss, count, extra = user_mean_loss(per_example), data.num_users, {"grad_mode": "vmap"}
    elif level == "ELS":  # examples are the records, priced at the user level
        x, y, _ = data.examples()
        module, records, loss, count = model, TensorDataset(x, y), per_example, len(x)
    else:
        raise fail("level", level, "'ELS' or 'ULS'")
    steps, q = epochs_to_steps(epochs, count, batch_size)
    sigma = calibrate_user_level(level, target_epsilon, delta, q, steps, k)
    private = make_private(
        module,
        optimizer,
        records,
        loss_fn=loss,
        delta=delta,
        max_grad_norm=max_grad_norm,
        batch_size=batch_size,
        noise_multiplier=sigma,
        steps=steps,
        accountant="rdp",
        **extra,
    )
    event = user_level_event(level, sigma, q, k)
    if budget is not None:  # the whole training, in user-level units, before any step
        budget.spend(
            SelfComposedEvent(event, steps),
            label=f"user-level DP-SGD ({level})",
            metadata={
                "guarantee": f"per user (at most {k} examples each); add/remove one user",
                "examples_per_user": k,
                "dropped_examples": data.dropped,
            },
        )
    return UserLevelTraining(level, private, event, k, target_epsilon, delta)
