"""Tampering with a ledger is refused, naming the first bad entry — on open and before a spend.

Edits are made the way a careless or dishonest operator would: with the sqlite3 shell
(state row, deleted and reordered rows) or by flipping bytes of the file itself, and on the
PostgreSQL store with SQL against the real server.
"""

import sqlite3

import pytest

from renyi.budget import Budget
from renyi.errors import BudgetExceededError
from renyi.events import LaplaceEvent, PureDpEvent
from renyi.ledger import LedgerError


def _ledger(path, n=5, **kw):
    b = Budget(epsilon=100.0, ledger=path, **kw)
    for i in range(n):
        b.spend(PureDpEvent(10.0), label=f"query-{i}")
    b.close()
    return b


def _sql(path, *statements):
    conn = sqlite3.connect(path)
    for stmt in statements:
        conn.execute(stmt)
    conn.commit()
    conn.close()


def test_edited_state_row_refused_on_open_and_before_spend(tmp_path):
    """The issue's case: spent 50 -> 10 made remaining() say 90 and accepted spend(80)."""
    path = tmp_path / "b.sqlite"
    b = Budget(epsilon=100.0, ledger=path)
    for _ in range(5):
        b.spend(PureDpEvent(10.0))
    _sql(path, """UPDATE state SET value = json_set(value, '$.spent', '10')""")
    with pytest.raises(LedgerError, match=r"state row says 10 spent but entries #0..#4 add up"):
        Budget.open(path)
    # the budget that was already open refuses too, and nothing is recorded
    with pytest.raises(LedgerError, match="state row"):
        b.spend(PureDpEvent(80.0))
    with pytest.raises(LedgerError, match="state row"):
        b.remaining()
    _sql(path, """UPDATE state SET value = json_set(value, '$.spent', '50')""")
    again = Budget.open(path)  # restored: usable again, 50 left, 80 refused
    assert again.remaining() == 50.0 and len(again.entries()) == 5
    with pytest.raises(BudgetExceededError, match="only epsilon=50 of 100 remains"):
        again.spend(PureDpEvent(80.0))


def test_deleted_middle_entry_named(tmp_path):
    path = tmp_path / "b.sqlite"
    _ledger(path)
    _sql(path, "DELETE FROM entries WHERE idx = 2")
    with pytest.raises(LedgerError, match="entry #2 is missing"):
        Budget.open(path)


def test_deleted_last_entry_named(tmp_path):
    path = tmp_path / "b.sqlite"
    _ledger(path)
    _sql(path, "DELETE FROM entries WHERE idx = 4")
    with pytest.raises(LedgerError, match="entry #4 is missing"):
        Budget.open(path)


def test_renumbered_entries_after_deletion_named(tmp_path):
    path = tmp_path / "b.sqlite"
    _ledger(path)
    _sql(
        path, "DELETE FROM entries WHERE idx = 1", "UPDATE entries SET idx = idx - 1 WHERE idx > 1"
    )
    with pytest.raises(LedgerError, match="entry #1 fails the hash chain"):
        Budget.open(path)


def test_reordered_entries_named(tmp_path):
    path = tmp_path / "b.sqlite"
    _ledger(path)
    _sql(
        path,
        "UPDATE entries SET idx = -1 WHERE idx = 1",
        "UPDATE entries SET idx = 1 WHERE idx = 3",
        "UPDATE entries SET idx = 3 WHERE idx = -1",
    )
    with pytest.raises(LedgerError, match="entry #1 fails the hash chain"):
        Budget.open(path)


def test_edited_cost_and_event_named(tmp_path):
    path = tmp_path / "b.sqlite"
    _ledger(path)
    _sql(path, """UPDATE entries SET event = json_set(event, '$.epsilon', 1.0) WHERE idx = 3""")
    with pytest.raises(LedgerError, match="entry #3 fails the hash chain"):
        Budget.open(path)


def test_raised_limit_breaks_the_chain(tmp_path):
    path = tmp_path / "b.sqlite"
    _ledger(path)
    _sql(
        path, """UPDATE meta SET value = json_set(value, '$.epsilon', 1000.0) WHERE key='budget'"""
    )
    with pytest.raises(LedgerError, match="entry #0 fails the hash chain"):
        Budget.open(path)


def test_flipped_bytes_refused_and_named(tmp_path):
    path = tmp_path / "b.sqlite"
    _ledger(path)
    data = bytearray(path.read_bytes())
    at = data.find(b"query-3")
    assert at > 0  # the WAL was checkpointed into the file when the budget closed
    data[at + 6] ^= 0x04  # "query-3" -> "query-7"
    path.write_bytes(bytes(data))
    with pytest.raises(LedgerError, match="entry #3 fails the hash chain"):
        Budget.open(path)


@pytest.mark.parametrize("offset", [100, 2000, 4500, -200])
def test_random_byte_flips_never_raise_raw_errors(tmp_path, offset):
    """Bit rot anywhere: either our LedgerError, or a ledger that still verifies."""
    path = tmp_path / "b.sqlite"
    _ledger(path)
    data = bytearray(path.read_bytes())
    for k in range(16):
        data[(offset + 7 * k) % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))
    try:
        b = Budget.open(path)
        b.verify()
        assert b.remaining() == 50.0  # untouched data: still exact
    except LedgerError:
        pass


def test_keyed_chain_resists_a_consistent_rewrite(tmp_path):
    """Without the key an attacker who recomputes every hash still gets caught."""
    from renyi.ledger import entry_digest, genesis_digest, state_digest
    from renyi.ledger._base import dumps

    key = b"operator-secret-key-0123456789"
    path = tmp_path / "b.sqlite"
    _ledger(path, key=key)
    # rewrite: drop entries 3 and 4, recompute an unkeyed chain and a matching state
    b = Budget.open(path, key=key)
    keep = b.entries()[:3]
    b.close()
    spec = b.spec
    head = genesis_digest(spec, None, b.ledger_id)
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM entries WHERE idx >= 3")
    for e in keep:
        head = entry_digest(e, head, None)
        conn.execute("UPDATE entries SET hash = ? WHERE idx = ?", (head, e.index))
    state = {"spent": "30", "entries": 3, "head": head, "id": b.ledger_id}
    state["tag"] = state_digest(state, None)
    conn.execute("UPDATE state SET value = ?", (dumps(state),))
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="entry #0 fails the hash chain"):
        Budget.open(path, key=key)
    with pytest.raises(LedgerError, match="keyed"):
        Budget.open(path)
    with pytest.raises(LedgerError, match="keyed"):
        Budget(epsilon=100.0, ledger=path)


def test_unkeyed_rewrite_is_only_evidence(tmp_path):
    """Documented limit: without a key, a consistent rewrite of the whole file verifies."""
    path = tmp_path / "b.sqlite"
    b = Budget(epsilon=1.0, ledger=path)
    b.spend(LaplaceEvent(2.0))
    assert b.verify() and len(b.head) == 64


# ----------------------------------------------------------------------------- postgres


def test_postgres_tampering_named(postgres_url):
    psycopg = pytest.importorskip("psycopg")
    b = Budget(epsilon=100.0, ledger=postgres_url)
    for i in range(5):
        b.spend(PureDpEvent(10.0), label=f"q{i}")
    name = postgres_url.rsplit("#", 1)[1]
    url = postgres_url.rsplit("#", 1)[0]

    def sql(stmt):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(stmt.replace("LEDGER", name))

    sql(
        "UPDATE renyi_ledger_state SET value = replace(value, '\"50\"', '\"10\"') "
        "WHERE ledger='LEDGER'"
    )
    with pytest.raises(LedgerError, match="state row says 10 spent"):
        b.spend(PureDpEvent(80.0))
    sql(
        "UPDATE renyi_ledger_state SET value = replace(value, '\"10\"', '\"50\"') "
        "WHERE ledger='LEDGER'"
    )
    assert Budget.open(postgres_url).remaining() == 50.0
    sql("DELETE FROM renyi_ledger_entries WHERE ledger='LEDGER' AND idx = 2")
    with pytest.raises(LedgerError, match="entry #2 is missing"):
        Budget.open(postgres_url)
    with pytest.raises(LedgerError, match="entry #2 is missing"):
        b.spend(PureDpEvent(1.0))


def test_entry_charged_below_its_event_is_refused(tmp_path):
    """An edited cost with a consistently recomputed chain (no key) is still caught."""
    from renyi.ledger import entry_digest, genesis_digest, state_digest
    from renyi.ledger._base import dumps

    path = tmp_path / "b.sqlite"
    _ledger(path, n=2)
    b = Budget.open(path)
    entries = b.entries()
    b.close()
    head = genesis_digest(b.spec, None, b.ledger_id)
    conn = sqlite3.connect(path)
    for e in entries:
        cost = {"epsilon": "1", "exact": "1"} if e.index == 1 else e.cost
        e2 = type(e)(**{**e.__dict__, "cost": cost})
        head = entry_digest(e2, head, None)
        conn.execute(
            "UPDATE entries SET cost = ?, hash = ? WHERE idx = ?", (dumps(cost), head, e.index)
        )
    state = {"spent": "11", "entries": 2, "head": head, "id": b.ledger_id}
    state["tag"] = state_digest(state, None)
    conn.execute("UPDATE state SET value = ?", (dumps(state),))
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="entry #1 records a cost of 1 but its event costs 10"):
        Budget.open(path)


def test_approx_state_row_lowered_is_refused(tmp_path):
    from renyi.events import GaussianEvent

    path = tmp_path / "b.sqlite"
    b = Budget(epsilon=3.0, delta=1e-5, ledger=path)
    b.spend(GaussianEvent(5.0), 3)
    b.close()
    conn = sqlite3.connect(path)
    (value,) = conn.execute("SELECT value FROM state").fetchone()
    import json

    state = json.loads(value)
    state["spent"] = [x / 2 if isinstance(x, float) else x for x in state["spent"]]
    conn.execute("UPDATE state SET value = ?", (json.dumps(state),))
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="state row"):
        Budget.open(path)
