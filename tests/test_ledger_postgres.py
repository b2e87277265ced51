"""The team ledger on a real PostgreSQL server (started by the test session, see conftest.py).

The SIGKILL and multi-process races are in test_ledger_processes.py (both stores) and the
tampering cases in test_ledger_tamper.py; here: the store's contract, threads sharing one
budget, several ledgers in one database, and every failure as our LedgerError.
"""

import threading

import pytest

from renyi.budget import Budget
from renyi.errors import BudgetExceededError
from renyi.events import GaussianEvent, LaplaceEvent, PoissonSampledEvent, PureDpEvent
from renyi.ledger import LedgerError, PostgresLedgerStore

pytest.importorskip("psycopg")


def test_round_trip_same_answers_as_sqlite(postgres_url, tmp_path):
    step = PoissonSampledEvent(0.01, GaussianEvent(1.1))
    pg = Budget(epsilon=3.0, delta=1e-5, ledger=postgres_url)
    lite = Budget(epsilon=3.0, delta=1e-5, ledger=tmp_path / "b.sqlite")
    for b in (pg, lite):
        for i in range(3):
            b.spend(step, 100, label=f"epoch {i}", metadata={"lr": 0.1})
    again = Budget.open(postgres_url)
    assert again.verify() and again.created is False
    assert again.status()["epsilon_spent"] == lite.status()["epsilon_spent"]
    assert [e.label for e in again.entries()] == ["epoch 0", "epoch 1", "epoch 2"]
    assert again.entries()[0].metadata == {"lr": 0.1}
    assert [e.hash for e in again.entries()] != [e.hash for e in lite.entries()]  # own times
    assert again.max_count(step) == lite.max_count(step)
    with pytest.raises(LedgerError, match="different budget"):
        Budget(epsilon=4.0, delta=1e-5, ledger=postgres_url)


def test_several_ledgers_in_one_database(postgres_url):
    base = postgres_url.rsplit("#", 1)[0]
    a = Budget(epsilon=1.0, ledger=base + "#team-a")
    b = Budget(epsilon=2.0, ledger=base + "#team-b")
    a.spend(PureDpEvent(1.0))
    assert b.remaining() == 2.0 and a.remaining() == 0.0
    assert Budget.open(PostgresLedgerStore(base, ledger="team-b")).remaining() == 2.0
    with pytest.raises(LedgerError, match="no ledger named 'team-c'"):
        Budget.open(base + "#team-c")


def test_threads_sharing_one_budget_never_overspend(postgres_url):
    b = Budget(epsilon=3.0, ledger=postgres_url)  # 30 releases of 0.1
    served = []

    def worker():
        n = 0
        while True:
            try:
                b.spend(PureDpEvent(0.1))
            except BudgetExceededError:
                break
            n += 1
        served.append(n)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sum(served) == 30 and len(Budget.open(postgres_url).entries()) == 30
    assert b.verify() and b.remaining() == 0.0


def test_keyed_postgres_ledger(postgres_url):
    key = "0123456789abcdef-team-key"
    b = Budget(epsilon=1.0, ledger=postgres_url, key=key)
    b.spend(LaplaceEvent(4.0))
    assert Budget.open(postgres_url, key=key).remaining() == 0.75
    with pytest.raises(LedgerError, match="keyed"):
        Budget.open(postgres_url)


def test_unreachable_server_is_our_error_without_the_password():
    url = "postgresql://alice:s3cret@/renyi?host=/nonexistent-socket-dir&connect_timeout=2"
    with pytest.raises(LedgerError, match="cannot connect") as err:
        Budget(epsilon=1.0, ledger=url)
    assert "s3cret" not in str(err.value) and "alice@" in str(err.value)


def test_foreign_rows_are_refused(postgres_url):
    psycopg = pytest.importorskip("psycopg")
    base, name = postgres_url.rsplit("#", 1)
    Budget(epsilon=1.0, ledger=base + "#setup")  # creates the tables
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO renyi_ledger_meta (ledger, key, value) VALUES (%s, 'other', 'x')", (name,)
        )
    with pytest.raises(LedgerError, match="not a renyi ledger"):
        Budget(epsilon=1.0, ledger=postgres_url)
