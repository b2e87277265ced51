"""DP-SGD under individual Rényi filters: per-record guarantees, reduction, refusal."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from renyi.accountants import RdpAccountant  # noqa: E402
from renyi.budget import Budget  # noqa: E402
from renyi.dpsgd.individual import IndividualSensitivityError, train_individual  # noqa: E402
from renyi.events import GaussianEvent, PoissonSampledEvent  # noqa: E402

pytestmark = pytest.mark.torch


def _opt(model: nn.Module, lr: float = 0.05) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr)


def test_all_norms_at_c_reduces_to_standard_dpsgd() -> None:
    torch.manual_seed(0)
    x = 1000.0 * torch.randn(40, 4, dtype=torch.float64)
    y = torch.randn(40, 1, dtype=torch.float64)
    model = nn.Linear(4, 1, bias=False).double()
    run = train_individual(  # squared error, lr = 0: every norm stays far above C
        model,
        _opt(model, lr=0.0),
        (x, y),
        loss_fn=nn.MSELoss(),
        target_epsilon=3.0,
        delta=1e-5,
        batch_size=10,
        epochs=2,
        max_epochs=4,
        max_grad_norm=1e-3,
    )
    assert run.planned_steps == 8 and run.steps == 8  # everyone retired after the plan
    assert run.filter.retired == 40 and (run.filter.steps_taken == 8).all()
    acc = RdpAccountant().compose(
        PoissonSampledEvent(run.sample_rate, GaussianEvent(run.noise_multiplier)), count=8
    )
    expected = acc.epsilon(1e-5).epsilon
    assert expected <= 3.0
    np.testing.assert_allclose(run.epsilons(1e-5), expected, rtol=1e-12)


def test_cheap_records_train_longer_and_nobody_passes_the_target(tmp_path) -> None:
    torch.manual_seed(1)
    x = torch.randn(60, 4, dtype=torch.float64)
    x[:20] = 0.0  # no bias: these records have zero gradient, they never pay
    x[20:40] *= 1e-4  # tiny gradients: cheap
    y = torch.randint(0, 2, (60,))
    model = nn.Linear(4, 2, bias=False).double()
    budget = Budget(epsilon=5.0, delta=1e-5, ledger=tmp_path / "l.sqlite")
    run = train_individual(
        model,
        _opt(model),
        (x, y),
        loss_fn=nn.CrossEntropyLoss(),
        target_epsilon=2.0,
        delta=1e-5,
        batch_size=15,
        epochs=1,
        max_epochs=3,
        max_grad_norm=0.05,
        budget=budget,
    )
    assert run.steps == 12  # max_epochs: some records still had budget
    eps = run.epsilons(1e-5)
    assert (eps <= 2.0).all()
    assert (eps[:20] == 0.0).all()
    assert (eps[20:40] < 0.5).all()
    assert (run.filter.steps_taken[:40] == 12).all()
    assert run.filter.retired == 20 and (run.filter.steps_taken[40:] < 12).all()
    summ = run.summary(1e-5)
    assert summ["examples_retired"] == 20 and summ["min"] == 0.0 and summ["max"] <= 2.0
    entries = budget.entries()
    assert len(entries) == 1 and entries[0].label == "DP-SGD with individual accounting"


def test_nondeterministic_model_is_refused_before_release() -> None:
    torch.manual_seed(2)
    x = torch.randn(200, 6)
    y = torch.randint(0, 2, (200,))
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.5), nn.ReLU(), nn.Linear(16, 2))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(IndividualSensitivityError, match="no update was released"):
        train_individual(
            model,
            _opt(model),
            (x, y),
            loss_fn=nn.CrossEntropyLoss(),
            target_epsilon=2.0,
            delta=1e-5,
            batch_size=100,
            epochs=1,
            max_grad_norm=100.0,
        )
    # the failing step released nothing: parameters are those of the steps before it, and
    # the first step at least was checked before any update
    assert all(p.shape == b.shape for p, b in zip(model.parameters(), before, strict=True))
