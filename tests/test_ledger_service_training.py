"""DP-SGD charging a remote ledger service every step: training stops when it refuses.

``PrivacyEngine(ledger=url)`` (and ``make_private(..., ledger=url)``) ask the service before
each step's noise is drawn; the step the service refuses raises BudgetExceededError and
changes no parameter, and the service holds exactly one entry per step taken.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("uvicorn")

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from _ledger_server import Server  # noqa: E402
from renyi.budget import Budget  # noqa: E402
from renyi.errors import BudgetExceededError  # noqa: E402
from renyi.events import GaussianEvent, PoissonSampledEvent  # noqa: E402
from renyi.ledger import LedgerError, open_store  # noqa: E402
from renyi.ledger.tokens import create_token  # noqa: E402


def _train_until_refused(model, optimizer, loader, limit):
    loss_fn = torch.nn.CrossEntropyLoss()
    steps = 0
    for _ in range(limit):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            before = [p.detach().clone() for p in model.parameters()]
            try:
                optimizer.step()
            except BudgetExceededError:
                after = list(model.parameters())
                assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
                return steps, True
            steps += 1
    return steps, False


def _remote_private_linear(server, token, **make_private_kwargs):
    """A linear model on 64 random examples made private by ``PrivacyEngine(ledger=url)``:
    (model, optimizer, loader), batches of 16, σ = 2, C = 1."""
    from renyi.dpsgd import PrivacyEngine

    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    model = torch.nn.Linear(4, 2)
    engine = PrivacyEngine(accountant="rdp", ledger=f"{server.url}#default", ledger_token=token)
    return engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=16),
        noise_multiplier=2.0,
        max_grad_norm=1.0,
        **make_private_kwargs,
    )


def test_privacy_engine_stops_when_the_remote_budget_refuses(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "team.sqlite"
    Budget(epsilon=3.0, delta=1e-5, ledger=path)
    token = create_token(open_store(str(path)), name="trainer", role="spend")
    server = Server(path)
    try:
        model, optimizer, loader = _remote_private_linear(server, token, epochs=50)
        data = loader.dataset  # the 64 examples, for the second private model below
        step = PoissonSampledEvent(0.25, GaussianEvent(2.0))
        expected = Budget.open(path).max_count(step)  # what the service will allow
        assert 1 <= expected < 200
        steps, refused = _train_until_refused(model, optimizer, loader, 50)
        assert refused and steps == expected
        remote = Budget.open(path)
        assert len(remote.entries()) == expected and remote.verify()
        assert {e.metadata["job"] for e in remote.entries()} == {optimizer.budget.job}
        assert remote.entries()[-1].metadata["planned_steps"] == 200  # 50 epochs x 4 steps

        # make_private(ledger=url): the same gate; with the service gone, the step raises
        from renyi.dpsgd import make_private

        model2 = torch.nn.Linear(4, 2)
        private = make_private(
            model2,
            torch.optim.SGD(model2.parameters(), lr=0.1),
            data,
            loss_fn=torch.nn.CrossEntropyLoss(reduction="none"),
            delta=1e-5,
            max_grad_norm=1.0,
            batch_size=16,
            noise_multiplier=5.0,
            steps=3,
            ledger=f"{server.url}#default",
            ledger_token=token,
        )
        server.kill()
        private.optimizer.budget._timeout = 0.5  # do not wait 30 s for a dead service
        x, y = next(iter(private.data_loader))
        before = [p.detach().clone() for p in model2.parameters()]
        private.optimizer.accumulate(x, y)
        with pytest.raises(LedgerError, match="cannot reach the ledger service"):
            private.optimizer.step()
        assert all(torch.equal(a, b) for a, b in zip(before, model2.parameters(), strict=True))
    finally:
        server.stop()


def test_a_job_charged_per_epoch_ends_finished(tmp_path):
    """Balls-in-bins charges once per epoch: the dashboard's progress counts those spends
    against the epochs planned (it counted them against the steps, so such a job never
    reached 100 % and stayed "running"/"stopped")."""
    from renyi.ledger.service import _jobs

    torch.manual_seed(0)
    path = tmp_path / "team.sqlite"
    Budget(epsilon=50.0, delta=1e-5, ledger=path)
    token = create_token(open_store(str(path)), name="trainer", role="spend")
    server = Server(path)
    try:
        model, optimizer, loader = _remote_private_linear(
            server, token, epochs=3, sampling="random-allocation"
        )
        steps, refused = _train_until_refused(model, optimizer, loader, 3)
    finally:
        server.stop()
    assert not refused and steps == 12
    b = Budget.open(path)
    entries = b.entries()
    assert len(entries) == 3  # one spend per epoch
    assert entries[-1].metadata["planned_steps"] == 12
    assert entries[-1].metadata["planned_charges"] == 3
    (job,) = _jobs(b, entries)
    assert job["steps"] == 3 and job["planned"] == 3
    assert job["progress"] == 1.0 and job["status"] == "finished"


def test_planned_counts_are_checked():
    from renyi.errors import PrivacyParameterError
    from renyi.ledger.client import RemoteBudget

    with pytest.raises(PrivacyParameterError, match="planned_charges"):
        RemoteBudget("http://127.0.0.1:9#x", token="t", planned_charges=0)
