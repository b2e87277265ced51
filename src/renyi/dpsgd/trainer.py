"""A small training loop for people who want one call: :class:`Trainer`.

It runs the DP-SGD steps fixed by :func:`~renyi.dpsgd.privacy.make_private` (exactly
``private.steps`` of them, so the guarantee computed at set-up is the one delivered), shows a
progress bar (tqdm, on stderr) with the running loss, the held-out accuracy and ε, evaluates
at every epoch boundary, and records a :class:`TrainHistory`.

Guarantee: the same as the :class:`~renyi.dpsgd.privacy.PrivateTraining` it runs (the
trainer only reads the released model; evaluation on held-out data costs no privacy of the
training set).

Example:
    >>> trainer = Trainer(private, eval_data=test)  # doctest: +SKIP
    >>> history = trainer.fit()  # doctest: +SKIP
    >>> history.final_accuracy, history.epsilons[-1]  # doctest: +SKIP
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from renyi._validation import check_int, fail
from renyi.analysis.events import Event
from renyi.dpsgd.privacy import PrivateTraining

__all__ = ["TrainHistory", "Trainer", "evaluate", "spent_epsilon_curve", "train_non_private"]


@dataclass
class TrainHistory:
    """What happened during training: per-evaluation step, loss, accuracy and ε."""

    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    eval_accuracy: list[float] = field(default_factory=list)
    epsilons: list[float] = field(default_factory=list)
    delta: float = float("nan")

    @property
    def final_accuracy(self) -> float:
        return self.eval_accuracy[-1] if self.eval_accuracy else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "train_loss": self.train_loss,
            "eval_loss": self.eval_loss,
            "eval_accuracy": self.eval_accuracy,
            "epsilons": self.epsilons,
            "delta": self.delta,
        }


def _tensors(data: Dataset[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(data, TensorDataset):
        x, y = data.tensors[0], data.tensors[1]
        return x, y
    xs, ys = zip(*(data[i] for i in range(len(data))), strict=True)  # type: ignore[arg-type]
    return torch.stack([torch.as_tensor(v) for v in xs]), torch.as_tensor(ys)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    data: Dataset[Any],
    *,
    loss_fn: Callable[..., torch.Tensor] = torch.nn.functional.cross_entropy,
    batch_size: int = 2048,
) -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` on ``data`` (classification, argmax of outputs)."""
    batch_size = check_int("batch_size", batch_size, 1)
    x, y = _tensors(data)
    was_training = model.training
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        out = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        total_loss += float(loss_fn(out, target, reduction="sum"))
        correct += int((out.argmax(dim=1) == target).sum())
    model.train(was_training)
    n = max(len(y), 1)
    return total_loss / n, correct / n


def train_non_private(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Dataset[Any],
    *,
    epochs: int,
    batch_size: int,
    loss_fn: Callable[..., torch.Tensor] = torch.nn.functional.cross_entropy,
    seed: int = 0,
) -> torch.nn.Module:
    """Ordinary (NOT private) minibatch training, the baseline to compare against."""
    epochs = check_int("epochs", epochs, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    x, y = _tensors(data)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            optimizer.step()
    return model


class Trainer:
    """Run the DP-SGD steps of a :class:`PrivateTraining` with a progress bar.

    Args:
        private: from :func:`~renyi.dpsgd.privacy.make_private`.
        eval_data: held-out data for loss/accuracy at each evaluation (optional).
        eval_every: steps between evaluations (default: one epoch, ⌈1/q⌉ steps, or the
            epoch samplers' ``steps_per_epoch``).
        progress: show the tqdm bar on stderr.
        on_evaluate: optional callback ``(step, history)`` after each evaluation.
    """

    def __init__(
        self,
        private: PrivateTraining,
        *,
        eval_data: Dataset[Any] | None = None,
        eval_every: int | None = None,
        progress: bool = True,
        on_evaluate: Callable[[int, TrainHistory], None] | None = None,
        loss_fn: Callable[..., torch.Tensor] = torch.nn.functional.cross_entropy,
    ) -> None:
        if not isinstance(private, PrivateTraining):
            raise fail("private", type(private).__name__, "a PrivateTraining (make_private)")
        self.private = private
        self.eval_data = eval_data
        per_epoch = getattr(private.sampler, "steps_per_epoch", None) or max(
            1, math.ceil(1.0 / private.sample_rate)
        )
        self.eval_every = (
            per_epoch if eval_every is None else check_int("eval_every", eval_every, 1)
        )
        self.progress = progress
        self.on_evaluate = on_evaluate
        self.loss_fn = loss_fn
        self.history = TrainHistory(delta=private.delta)

    def _record(self, step: int, running_loss: float) -> None:
        h = self.history
        h.steps.append(step)
        h.train_loss.append(running_loss)
        if self.eval_data is not None:
            loss, acc = evaluate(self.private.model, self.eval_data, loss_fn=self.loss_fn)
        else:
            loss, acc = float("nan"), float("nan")
        h.eval_loss.append(loss)
        h.eval_accuracy.append(acc)
        h.epsilons.append(float(self.private.epsilon().epsilon) if step > 0 else 0.0)
        if self.on_evaluate is not None:
            self.on_evaluate(step, h)

    def fit(self) -> TrainHistory:
        """Train the remaining steps (all of them, or what is left after a resume)."""
        private = self.private
        opt = private.optimizer
        model = private.model
        model.train()
        start = opt.steps_taken
        remaining = private.steps - start
        if remaining < 0:
            raise fail("steps_taken", start, f"at most steps={private.steps}")
        if remaining == 0:  # never train past the steps the guarantee was computed for
            return self.history
        bar = None
        if self.progress:
            try:
                from tqdm import tqdm

                bar = tqdm(total=private.steps, initial=start, file=sys.stderr, desc="DP-SGD")
            except ImportError:  # pragma: no cover - tqdm is in the torch extra
                bar = None
        loss_sum, loss_count = 0.0, 0
        running = float("nan")
        try:
            while opt.steps_taken < private.steps:  # one pass = one epoch of the loader
                yielded = 0
                for x, y in private.data_loader:
                    yielded += 1
                    if opt.steps_taken >= private.steps:
                        break
                    opt.zero_grad()
                    losses, _ = opt.accumulate(x, y)
                    opt.step()
                    loss_sum += float(losses.sum())
                    loss_count += int(losses.numel())
                    step = opt.steps_taken
                    if step % self.eval_every == 0 or step == private.steps:
                        running = loss_sum / loss_count if loss_count else float("nan")
                        loss_sum, loss_count = 0.0, 0
                        self._record(step, running)
                        if bar is not None:
                            bar.set_postfix(
                                loss=f"{running:.3f}",
                                acc=f"{self.history.eval_accuracy[-1]:.3f}",
                                eps=f"{self.history.epsilons[-1]:.3g}",
                            )
                    if bar is not None:
                        bar.update(1)
                if yielded == 0:  # the loader's plan is spent (e.g. after a partial resume)
                    break
        finally:
            if bar is not None:
                bar.close()
        return self.history


def spent_epsilon_curve(
    event: Event,
    steps: list[int],
    delta: float,
    accountant: str,
) -> list[float]:
    """ε at ``delta`` after each number of ``steps`` compositions of ``event`` (one DP-SGD step).

    Each entry is a fresh accountant's answer for ``t``-fold composition (0 steps: ε = 0).
    Raises :class:`~renyi.errors.UnsupportedEventError` if the accountant cannot analyse it.
    """
    from renyi.accountants import make_accountant

    out = []
    for t in steps:
        t = check_int("steps", t, 0)
        out.append(
            0.0 if t == 0 else float(make_accountant(accountant).compose(event, t).epsilon(delta))
        )
    return out
