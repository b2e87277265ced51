"""The strategy-selection rule on fixed workloads, and a short run of every strategy."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from renyi.calibration import calibrate_noise_multiplier
from renyi.correlated.choice import choose_strategy, schedule_error
from renyi.correlated.optimize import optimize_banded, optimize_blt
from renyi.correlated.strategies import TreeStrategy, identity
from renyi.correlated.workload import prefix_workload
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError

warnings.filterwarnings("ignore", category=InsecureRandomnessWarning)


@pytest.mark.parametrize("strategy", [identity(), optimize_banded(30, 3), optimize_blt(30, 2),
                                      TreeStrategy()])  # fmt: skip
def test_schedule_error_is_the_rmse_of_a_c_inverse(strategy):
    t = 30
    lr = 0.5 * (1 + np.cos(np.pi * np.arange(t) / t)) + 0.01
    dense = prefix_workload(t, 0.9, lr) @ strategy.noising_matrix(t)
    want = math.sqrt(float(np.square(dense).sum()) / t)
    assert schedule_error(strategy, t, momentum=0.9, learning_rates=lr) == pytest.approx(
        want, rel=1e-10
    )
    # DP-SGD at a constant rate: prefix sums, rows of norm √(t+1)
    assert schedule_error(identity(), t) == pytest.approx(math.sqrt(np.mean(np.arange(1, t + 1))))
    with pytest.raises(PrivacyParameterError, match="learning_rates"):
        schedule_error(strategy, t, learning_rates=np.ones(t - 1))


def test_rule_short_run_small_data_is_dpsgd():
    c = choose_strategy(3.0, 1e-5, 40, 1000, 100, bands=(2, 4), accountant="rdp")
    assert c.best is c.dpsgd and c.best.noise == "dpsgd"
    assert {x.noise for x in c.candidates} == {"dpsgd", "banded", "blt"}
    sigma = calibrate_noise_multiplier(3.0, 1e-5, 0.1, 40, "rdp").noise_multiplier
    assert c.dpsgd.plan.noise_multiplier == pytest.approx(sigma, rel=1e-3)
    for x in c.candidates:  # the score is the calibrated noise in the iterates
        assert x.score == pytest.approx(x.plan.noise_scale * x.error, rel=1e-12)


def test_rule_long_run_many_records_picks_banded_and_respects_the_margin():
    kw = dict(kinds=("dpsgd", "banded"), bands=(4, 8), accountant="rdp", momentum=0.9)
    lr = 0.5 * (1 + np.cos(np.pi * np.arange(3000) / 3000)) + 1e-3
    c = choose_strategy(8.0, 1e-5, 3000, 60_000, 600, learning_rates=lr, **kw)
    assert c.best.noise == "banded"
    assert c.best.score <= 0.9 * c.dpsgd.score
    assert c.best.score == min(x.score for x in c.candidates)
    strict = choose_strategy(8.0, 1e-5, 3000, 60_000, 600, learning_rates=lr, margin=0.9, **kw)
    assert strict.best is strict.dpsgd and "margin" in strict.reason
    with pytest.raises(PrivacyParameterError, match="sampling"):
        choose_strategy(8.0, 1e-5, 30, 600, 60, sampling="shuffle")
    with pytest.raises(PrivacyParameterError, match="kinds"):
        choose_strategy(8.0, 1e-5, 30, 600, 60, kinds=("dense",))


torch = pytest.importorskip("torch")


def _data(n: int = 240):
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


@pytest.mark.parametrize("sampling", ["poisson", "random-allocation"])
@pytest.mark.parametrize("noise", ["dpsgd", "banded", "blt", "tree", "auto"])
def test_short_run_every_strategy(noise, sampling):
    from renyi.dpsgd.correlated import make_private_correlated

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 2)
    before = [p.detach().clone() for p in model.parameters()]
    private = make_private_correlated(
        model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5), _data(),
        loss_fn=torch.nn.CrossEntropyLoss(), target_epsilon=4.0, delta=1e-5, epochs=2,
        batch_size=24, max_grad_norm=1.0, noise=noise, bands=2 if noise == "banded" else None,
        sampling=sampling, accountant="rdp", seed=1,
    )  # fmt: skip
    opt = private.optimizer
    while opt.steps_taken < private.steps:
        for x, y in private.data_loader:
            opt.zero_grad()
            opt.accumulate(x, y)
            opt.step()
            if opt.steps_taken >= private.steps:
                break
    plan = private.extra["plan"]
    assert plan.sampling == ("poisson" if noise in ("blt", "tree") and sampling == "poisson"
                             else sampling)  # fmt: skip
    assert private.epsilon().epsilon <= 4.0 * (1 + 1e-9)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    if noise == "auto":
        assert private.extra["choice"] is not None and private.extra["choice"].reason


def test_cli_train_noise_auto_with_balls_in_bins(capsys):
    import json

    from renyi.cli.main import main

    argv = ["train", "--noise", "auto", "--sampling", "random-allocation", "--epsilon", "3"]
    argv += ["--epochs", "1", "--limit", "400", "--json", "--no-baseline", "--seed", "0"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epsilon"] <= 3.0 + 1e-9
    assert out["noise"]["sampling"] == "random-allocation" and out["noise"]["chosen_by"]
    assert main(["train", "--noise", "banded", "--sampling", "shuffle", "--epsilon", "3"]) == 2
    assert "--sampling" in capsys.readouterr().err
