"""The noise implementation's slack reaches every reported ε and δ (issue 23).

renyi's noise is exact, so :func:`renyi.noise.accounting_slack` is (0, 0) today; these tests
make the slack non-zero (a pretend implementation with a tail of 1e-9 per value over 1000
values) and check that every accountant, ``PrivacyEngine.get_epsilon`` and the CLI's JSON
carry it. They fail if an accountant result omits it.
"""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout

import pytest

from renyi import noise
from renyi.accountants import ACCOUNTANTS, make_accountant
from renyi.analysis.events import GaussianEvent, PoissonSampledEvent


@pytest.fixture
def leaky(monkeypatch):
    monkeypatch.setattr(noise, "TAIL_MASS", 1e-9)
    monkeypatch.setattr(noise, "MAX_ACCOUNTED_VALUES", 1000)
    return noise.accounting_slack


def test_exact_noise_has_no_slack():
    assert noise.accounting_slack(5.0) == (0.0, 0.0)
    assert noise.implementation_slack(10**14) == (0.0, 0.0)


@pytest.mark.parametrize("name", sorted(ACCOUNTANTS))
def test_every_accountant_adds_the_slack(name, leaky):
    acc = make_accountant(name)
    event = PoissonSampledEvent(0.2, GaussianEvent(3.0))
    if not acc.supports(event):
        pytest.skip(f"{name} does not analyse the subsampled Gaussian")
    acc.compose(event, 3)
    delta = 1e-4
    res = acc.epsilon(delta)
    eps_slack, ds = res.implementation_slack
    assert ds > 0 and ds >= leaky(res.epsilon)[1]
    ideal = acc._epsilon(delta).epsilon
    assert res.epsilon > ideal  # taken at delta - slack
    assert res.epsilon >= acc._epsilon(delta - ds).epsilon + eps_slack
    d = acc.delta(res.epsilon)
    assert d.implementation_slack[1] > 0
    assert d.delta >= acc._delta(res.epsilon).delta + leaky(res.epsilon)[1]


def test_privacy_engine_epsilon_inherits_the_slack(leaky):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from renyi.dpsgd import PrivacyEngine

    data = TensorDataset(torch.randn(64, 3), torch.randint(0, 2, (64,)))
    model = torch.nn.Linear(3, 2)
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=16),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    x, y = next(iter(loader))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    eps = engine.get_epsilon(1e-4)
    acc = engine.accountant.accountant
    assert eps == acc.epsilon(1e-4).epsilon > acc._epsilon(1e-4).epsilon


def test_budget_and_ledger_epsilon_inherit_the_slack(leaky, tmp_path):
    from renyi.analysis.conversions import rdp_to_dp_mironov
    from renyi.budget import Budget

    b = Budget(epsilon=10.0, delta=1e-3, ledger=tmp_path / "l.sqlite")
    b.spend(GaussianEvent(2.0), 3)
    ideal = float(rdp_to_dp_mironov(b._orders, b.spent(), 1e-3)[0])
    assert b.spent_epsilon() > ideal
    assert b.status()["epsilon_spent"] == b.spent_epsilon()


def test_cli_json_reports_the_slack():
    from renyi.cli.main import main

    out = io.StringIO()
    with redirect_stdout(out):
        main(
            [
                "epsilon",
                "--noise-multiplier",
                "1.0",
                "--sample-rate",
                "0.01",
                "--steps",
                "100",
                "--delta",
                "1e-5",
                "--json",
                "--accountant",
                "rdp",
            ]
        )
    doc = json.loads(out.getvalue())
    slack = doc["implementation_slack"]
    assert slack["epsilon"] == 0.0 and slack["delta"] == 0.0
    assert slack["released_values_covered"] == 2**64
    assert math.isfinite(doc["epsilon"])
