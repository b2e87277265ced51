"""Several named ledgers in one store, and idempotent spends (what the ledger service uses)."""

import pytest

from renyi.budget import Budget
from renyi.errors import BudgetExceededError
from renyi.events import LaplaceEvent, PureDpEvent
from renyi.ledger import IdempotencyConflictError, LedgerError, open_store


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "memory":
        return open_store(None)
    if request.param == "sqlite":
        return open_store(str(tmp_path / "team.sqlite"))
    return open_store(request.getfixturevalue("postgres_url"))


def test_named_ledgers_share_a_store_and_keep_their_own_budgets(store):
    census = store.name + "-census"  # the PostgreSQL database is shared by the session
    a = Budget(epsilon=1.0, ledger=store)
    b = Budget(epsilon=2.0, ledger=store.named(census))
    a.spend(PureDpEvent(1.0))
    assert b.remaining() == 2.0 and a.remaining() == 0.0
    assert {store.name, census} <= set(store.names())
    assert b.name == census and b.ledger_id != a.ledger_id
    again = Budget.open(store.named(census), expect_id=b.ledger_id)
    assert again.status()["name"] == census
    with pytest.raises(LedgerError, match="holds no budget"):
        Budget.open(store.named(store.name + "-nope"))
    with pytest.raises(LedgerError, match="different budget"):
        Budget(epsilon=3.0, ledger=store.named(census))  # never raised


def test_sqlite_path_fragment_names_a_ledger(tmp_path):
    path = tmp_path / "team.sqlite"
    Budget(epsilon=1.0, ledger=f"{path}#clicks").spend(PureDpEvent(0.25))
    Budget(epsilon=5.0, ledger=str(path))
    assert Budget.open(f"{path}#clicks").remaining() == 0.75
    assert Budget.open(path).remaining() == 5.0


def test_idempotent_spend_is_charged_once(store):
    b = Budget(epsilon=1.0, ledger=store)
    r1 = b.spend(LaplaceEvent(4.0), label="q", idempotency_key="job-7/step-1")
    r2 = b.spend(LaplaceEvent(4.0), label="q", idempotency_key="job-7/step-1")
    assert not r1.replayed and r2.replayed and r1.index == r2.index and r1.hash == r2.hash
    assert b.remaining() == 0.75 and len(b.entries()) == 1
    with pytest.raises(IdempotencyConflictError, match="different release"):
        b.spend(LaplaceEvent(2.0), label="q", idempotency_key="job-7/step-1")
    for i in range(3):
        b.spend(LaplaceEvent(4.0), idempotency_key=f"k{i}")
    with pytest.raises(BudgetExceededError):
        b.spend(LaplaceEvent(4.0), idempotency_key="k3")
    # a replay of a committed spend still answers once the budget is exhausted
    assert b.spend(LaplaceEvent(4.0), idempotency_key="k2").replayed
    assert Budget.open(store).verify() and b.remaining() == 0.0
