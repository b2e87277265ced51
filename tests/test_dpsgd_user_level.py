"""User-level DP-SGD (ELS / ULS): grouping, reduction to example level, sampling, ledger."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from renyi.budget import Budget  # noqa: E402
from renyi.calibration import calibrate_noise_multiplier  # noqa: E402
from renyi.dpsgd.user_level import (  # noqa: E402
    PAD_TARGET,
    calibrate_user_level,
    group_by_user,
    make_private_user_level,
    user_level_event,
    user_mean_loss,
)
from renyi.errors import PrivacyParameterError  # noqa: E402
from renyi.events import GaussianEvent, PoissonSampledEvent  # noqa: E402

pytestmark = pytest.mark.torch


def test_grouping_caps_and_pads() -> None:
    x = torch.arange(14, dtype=torch.float32).unsqueeze(1)
    y = torch.arange(14) % 3
    users = [5, 5, 5, 5, 7, 9, 9, 5, 7, 7, 7, 7, 1, 1]
    data = group_by_user(x, y, users, examples_per_user=3)
    assert data.num_users == 4 and data.dropped == 4  # users 5 and 7: 5 examples each
    assert data.counts.tolist() == [2, 3, 3, 2]  # ids sorted: 1, 5, 7, 9
    assert data.inputs[1, :, 0].tolist() == [0.0, 1.0, 2.0]  # the first three in data order
    assert data.targets[0, 2] == PAD_TARGET
    xs, _, owner = data.examples()
    assert len(xs) == 10 and owner.tolist().count(1) == 3
    with pytest.raises(PrivacyParameterError, match="user_ids"):
        group_by_user(x, y, users[:-1], examples_per_user=3)
    with pytest.raises(PrivacyParameterError, match="examples_per_user"):
        group_by_user(x, y, users, examples_per_user=0)


def test_user_mean_loss_ignores_padding() -> None:
    out = torch.randn(2, 3, 4)
    t = torch.tensor([[1, 2, PAD_TARGET], [0, 0, 3]])
    got = user_mean_loss()(out, t)
    ce = nn.CrossEntropyLoss(reduction="none")
    assert torch.allclose(got[0], ce(out[0, :2], t[0, :2]).mean())
    assert torch.allclose(got[1], ce(out[1], t[1]).mean())


def test_one_example_per_user_is_example_level() -> None:
    q, steps = 0.02, 300
    for level in ("ELS", "ULS"):
        ev = user_level_event(level, 1.1, q, 1)
        assert ev.rdp_epsilons(np.array([2.0, 8.0])).tolist() == (
            PoissonSampledEvent(q, GaussianEvent(1.1)).rdp_epsilons(np.array([2.0, 8.0])).tolist()
        )
    sigma_user = calibrate_user_level("ELS", 2.0, 1e-5, q, steps, 1, rtol=1e-4)
    sigma_ex = calibrate_noise_multiplier(2.0, 1e-5, q, steps, accountant="rdp").noise_multiplier
    assert sigma_user == pytest.approx(sigma_ex, rel=2e-4)


def test_more_examples_per_user_need_more_noise() -> None:
    a = calibrate_user_level("ELS", 4.0, 1e-5, 0.05, 100, 1)
    b = calibrate_user_level("ELS", 4.0, 1e-5, 0.05, 100, 4)
    assert b > 2 * a
    with pytest.raises(PrivacyParameterError, match="unreachable"):
        calibrate_user_level("ELS", 1e-6, 1e-5, 1.0, 10_000, 2)


@pytest.mark.parametrize("level", ["ULS", "ELS"])
def test_training_ledger_and_sampling_rate(level: str, tmp_path) -> None:
    torch.manual_seed(0)
    n_users, k = 24, 4
    x = torch.randn(n_users * k, 3)
    x[:, 0] = torch.arange(n_users * k) // k  # the owner's id, to count inclusions
    y = torch.randint(0, 2, (n_users * k,))
    data = group_by_user(x, y, torch.arange(n_users * k) // k, examples_per_user=k)
    model = nn.Sequential(nn.Linear(3, 2))
    budget = Budget(epsilon=10.0, delta=1e-5, ledger=tmp_path / "l.sqlite")
    batch = 6 if level == "ULS" else 24
    run = make_private_user_level(
        level,
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        target_epsilon=5.0,
        delta=1e-5,
        epochs=5,
        batch_size=batch,
        max_grad_norm=1.0,
        budget=budget,
    )
    losses = run.fit()
    assert len(losses) == run.steps == run.private.optimizer.steps_taken
    # sampled records per step: users (ULS) or examples (ELS), Poisson with rate q
    records = n_users if level == "ULS" else n_users * k
    q = run.private.sample_rate
    assert q == pytest.approx(batch / records)
    seen, steps = sum(run.batch_sizes), len(run.batch_sizes)
    sd = math.sqrt(steps * records * q * (1 - q))
    assert abs(seen - steps * records * q) < 5 * sd
    assert run.user_epsilon() <= 5.0
    entries = budget.entries()
    assert len(entries) == 1 and entries[0].label == f"user-level DP-SGD ({level})"
    if level == "ELS":
        assert run.group_privacy_epsilon() > run.user_epsilon()
