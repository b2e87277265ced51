"""What the training commands share: data sets, model architectures, per-dataset defaults and
the choice of accountant (``renyi train``, ``renyi tune``, the personalised variants of
``renyi train`` and ``renyi audit train`` import it; none of them imports another)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = [
    "DATASETS",
    "DEFAULTS",
    "MODELS",
    "accountant_names",
    "build_model",
    "choose_accountant",
    "load_data",
]

DATASETS = ("digits", "fashion-mnist")


MODELS = ("linear", "cnn")


def build_model(dataset: str, arch: str = "cnn") -> Any:
    """A model for ``dataset`` (no BatchNorm anywhere: it mixes the examples of a batch).

    ``linear``: softmax regression on the pixels. ``cnn``: a small tanh CNN; on Fashion-MNIST
    the CNN of Opacus's MNIST example (26k parameters), so accuracies compare with theirs.
    """
    from torch import nn

    if arch == "linear":
        side = 8 if dataset == "digits" else 28
        return nn.Sequential(nn.Flatten(), nn.Linear(side * side, 10))
    if dataset == "digits":
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.Tanh(),
            nn.AvgPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.Tanh(),
            nn.AvgPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 2 * 2, 10),
        )
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 32),
        nn.Tanh(),
        nn.Linear(32, 10),
    )


# Defaults per dataset: (model, epochs, batch size, learning rate, clipping norm, momentum).
# Chosen on digits by a small sweep at ε = 3 (softmax regression beat the CNN: fewer
# parameters, less noise); Fashion-MNIST follows Opacus's example set-up.
DEFAULTS: dict[str, tuple[str, float, int, float, float, float]] = {
    "digits": ("linear", 15.0, 64, 2.0, 1.0, 0.0),
    "fashion-mnist": ("cnn", 5.0, 256, 2.0, 1.0, 0.0),
}


def accountant_names() -> list[str]:
    from renyi.accountants import ACCOUNTANTS

    return sorted(ACCOUNTANTS)


def choose_accountant(requested: str, sampling: str, n: int, batch: int) -> str:
    """The accountant that calibrates σ: ``auto`` = the tightest that supports the event
    (the sampler's own, :func:`renyi.analysis.events.training_event`)."""
    from renyi._validation import fail
    from renyi.accountants import make_accountant
    from renyi.analysis.events import training_event

    names = accountant_names()
    if requested != "auto":
        if requested not in names:
            raise fail("--accountant", requested, f"one of {names} or 'auto'")
        return requested
    b = min(batch, n) if batch >= 1 else batch
    probe = training_event(sampling, 1.0, dataset_size=n, batch_size=b, steps=1)
    for name in ("pld", "rdp", "zcdp"):
        if name in names and make_accountant(name).supports(probe):
            return name
    raise fail("--sampling", sampling, "a sampling scheme some accountant can analyse")


def load_data(args: argparse.Namespace) -> tuple[Any, Any]:
    from renyi.dpsgd.data import load_digits, load_fashion_mnist

    if args.dataset == "digits":
        train, test = load_digits()
        if args.limit is not None:
            from torch.utils.data import TensorDataset

            train = TensorDataset(*(t[: args.limit] for t in train.tensors))
            test = TensorDataset(*(t[: args.limit] for t in test.tensors))
        return train, test
    return load_fashion_mnist(args.data_dir, limit=args.limit)
