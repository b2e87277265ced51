"""Keyed ledgers cannot be rewound or swapped without the key; bit rot is always our error.

The attacker here can read and rewrite the store (the SQLite file, or the PostgreSQL tables
with SQL against the real server) but does not hold the HMAC key. Each attack is one that
today's keyed ledgers accepted (issue 22, item 5):

* tail truncation with a rewritten state row: delete the last entries, set the state row's
  count, head and spent to those of the shorter chain — the overspend then went through;
* two ledgers with the same budget and key swapped (files, or ledger names in one database);
* one flipped bit anywhere in a ledger file: must end in :class:`LedgerError` or a ledger
  that still verifies with the same contents, never a raw exception.
"""

import json
import os
import random
import sqlite3
from fractions import Fraction

import pytest

from renyi.budget import Budget
from renyi.errors import BudgetExceededError
from renyi.events import PureDpEvent
from renyi.ledger import LedgerError

KEY = b"operator-secret-key-0123456789"


def _spend(b, n, eps=10.0):
    for i in range(n):
        b.spend(PureDpEvent(eps), label=f"q{i}")


def _rewound_state(state_json, rows):
    """The state row an attacker writes for the chain cut after ``rows`` (idx, hash, cost)."""
    state = json.loads(state_json)
    spent = sum((Fraction(json.loads(c)["exact"]) for _, _, c in rows), Fraction(0))
    state.update(spent=str(spent), entries=len(rows), head=rows[-1][1])
    return json.dumps(state)


def _truncate_sqlite(path, keep):
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT idx, hash, cost FROM entries ORDER BY idx").fetchall()[:keep]
    conn.execute("DELETE FROM entries WHERE idx >= ?", (keep,))
    (value,) = conn.execute("SELECT value FROM state").fetchone()
    conn.execute("UPDATE state SET value = ?", (_rewound_state(value, rows),))
    conn.commit()
    conn.close()


def test_sqlite_tail_truncation_with_rewritten_state_is_refused(tmp_path):
    path = tmp_path / "b.sqlite"
    victim = Budget(epsilon=100.0, ledger=path, key=KEY)
    _spend(victim, 9)  # 90 of 100 spent
    _truncate_sqlite(path, 2)  # the file now claims 20 spent, consistently
    with pytest.raises(LedgerError, match="state row"):
        Budget.open(path, key=KEY)
    with pytest.raises(LedgerError, match="state row"):  # the open budget refuses too
        victim.spend(PureDpEvent(80.0))
    with pytest.raises(LedgerError, match="state row"):
        Budget(epsilon=100.0, ledger=path, key=KEY)


def test_postgres_tail_truncation_with_rewritten_state_is_refused(postgres_url):
    psycopg = pytest.importorskip("psycopg")
    url, name = postgres_url.rsplit("#", 1)
    victim = Budget(epsilon=100.0, ledger=postgres_url, key=KEY)
    _spend(victim, 9)
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT idx, hash, cost FROM renyi_ledger_entries WHERE ledger = %s ORDER BY idx",
            (name,),
        ).fetchall()[:2]
        conn.execute("DELETE FROM renyi_ledger_entries WHERE ledger = %s AND idx >= 2", (name,))
        (value,) = conn.execute(
            "SELECT value FROM renyi_ledger_state WHERE ledger = %s", (name,)
        ).fetchone()
        conn.execute(
            "UPDATE renyi_ledger_state SET value = %s WHERE ledger = %s",
            (_rewound_state(value, rows), name),
        )
    with pytest.raises(LedgerError, match="state row"):
        Budget.open(postgres_url, key=KEY)
    with pytest.raises(LedgerError, match="state row"):
        victim.spend(PureDpEvent(80.0))


def test_untampered_keyed_ledgers_still_spend_to_the_limit(tmp_path, postgres_url):
    for target in (tmp_path / "b.sqlite", postgres_url):
        b = Budget(epsilon=100.0, ledger=target, key=KEY)
        _spend(b, 9)
        again = Budget.open(target, key=KEY, expect_id=b.ledger_id)
        again.spend(PureDpEvent(10.0))
        with pytest.raises(BudgetExceededError):
            b.spend(PureDpEvent(1.0))
        assert again.verify() and b.remaining() == 0.0


def test_swapped_sqlite_files_are_refused_when_the_id_is_expected(tmp_path, capsys):
    from renyi.cli.main import main

    a_path, b_path = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    a = Budget(epsilon=100.0, ledger=a_path, key=KEY)
    b = Budget(epsilon=100.0, ledger=b_path, key=KEY)
    _spend(a, 9)
    a_id, b_id = a.ledger_id, b.ledger_id
    assert a_id != b_id and len(a_id) == 32
    a.close()
    b.close()
    os.replace(a_path, tmp_path / "tmp")
    os.replace(b_path, a_path)
    os.replace(tmp_path / "tmp", b_path)
    with pytest.raises(LedgerError, match=f"is ledger {b_id}, not the expected {a_id}"):
        Budget.open(a_path, key=KEY, expect_id=a_id)
    with pytest.raises(LedgerError, match="not the expected"):
        Budget(epsilon=100.0, ledger=a_path, key=KEY, expect_id=a_id)
    # the id is what `renyi ledger show` prints, and what the CLI can be told to expect
    os.environ["RENYI_LEDGER_KEY"] = KEY.decode()
    try:
        assert main(["ledger", "show", str(b_path), "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["id"] == a_id and shown["name"] == "default"
        assert main(["ledger", "status", str(a_path), "--expect-id", a_id]) == 1
        assert "not the expected" in capsys.readouterr().err
    finally:
        del os.environ["RENYI_LEDGER_KEY"]


def test_swapped_postgres_ledgers_are_refused(postgres_url):
    """Renaming ledgers in the database (swapping their rows) breaks the chains: each chain
    is bound to its ledger's name and id, so no expected id is even needed."""
    psycopg = pytest.importorskip("psycopg")
    url, name = postgres_url.rsplit("#", 1)
    other = name + "x"
    a = Budget(epsilon=100.0, ledger=postgres_url, key=KEY)
    b = Budget(epsilon=100.0, ledger=f"{url}#{other}", key=KEY)
    _spend(a, 9)
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("renyi_ledger_meta", "renyi_ledger_entries", "renyi_ledger_state"):
            for old, new in ((name, "swap-tmp"), (other, name), ("swap-tmp", other)):
                conn.execute(f"UPDATE {table} SET ledger = %s WHERE ledger = %s", (new, old))
    with pytest.raises(LedgerError):
        Budget.open(postgres_url, key=KEY)
    with pytest.raises(LedgerError):
        Budget.open(postgres_url, key=KEY, expect_id=a.ledger_id)
    with pytest.raises(LedgerError):
        a.spend(PureDpEvent(80.0))
    del b


def test_300_single_bit_flips_give_ledger_error_or_the_same_ledger(tmp_path):
    """Each of 300 seeded single-bit flips of a small ledger file: our LedgerError, or a
    ledger that verifies with exactly the original entries and totals (a flip in unused
    bytes). Never a raw exception (before: one UnicodeDecodeError in 300)."""
    path = tmp_path / "b.sqlite"
    b = Budget(epsilon=100.0, ledger=path)
    _spend(b, 6, eps=5.0)
    want = ([(e.index, e.hash, e.label) for e in b.entries()], b.remaining())
    b.close()
    clean = path.read_bytes()
    rng = random.Random(2205)
    # where the data is (the file is mostly zero padding), and the high bit half of the time
    # (it turns stored text into invalid UTF-8: the raw UnicodeDecodeError of the issue)
    used = [i for i, byte in enumerate(clean) if byte]
    refused = 0
    for _ in range(300):
        data = bytearray(clean)
        at = rng.choice(used)
        data[at] ^= 1 << (7 if rng.random() < 0.5 else rng.randrange(7))
        target = tmp_path / "flip.sqlite"
        for leftover in ("-wal", "-shm"):
            if os.path.exists(f"{target}{leftover}"):
                os.unlink(f"{target}{leftover}")
        target.write_bytes(bytes(data))
        try:
            got = Budget.open(target)
            got.verify()
            seen = ([(e.index, e.hash, e.label) for e in got.entries()], got.remaining())
            got.close()
        except LedgerError:
            refused += 1
            continue
        assert seen == want, f"bit flip at byte {at} changed the ledger silently"
    assert refused > 0


def _delete_ledger_rows(execute, name):
    for table in ("meta", "entries", "state"):
        execute(table, name)


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_deleted_period_bucket_is_not_started_again_at_zero(tmp_path, request, store):
    """Held-out review: deleting a bucket's rows (no key needed) made ``bucket(period)``
    create it afresh, that period's budget back to zero spent. The parent ledger's chain now
    records each bucket's id when it is opened, so a recorded bucket that is missing or
    replaced is refused."""
    if store == "sqlite":
        target = tmp_path / "b.sqlite"

        def execute(table, name):
            conn = sqlite3.connect(target)
            conn.execute(f"DELETE FROM {table} WHERE ledger = ?", (name,))
            conn.commit()
            conn.close()

    else:
        psycopg = pytest.importorskip("psycopg")
        target = request.getfixturevalue("postgres_url")
        url = target.rsplit("#", 1)[0]

        def execute(table, name):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"DELETE FROM renyi_ledger_{table} WHERE ledger = %s", (name,))

    parent = Budget(epsilon=10.0, ledger=target, key=KEY, period="month")
    november = parent.bucket("2026-11")
    _spend(november, 9, eps=1.0)
    assert parent.bucket("2026-11").ledger_id == november.ledger_id  # reopened, not new
    _delete_ledger_rows(execute, f"{parent.name}@2026-11")
    again = Budget.open(target, key=KEY)
    with pytest.raises(LedgerError, match="missing"):
        again.bucket("2026-11")
    with pytest.raises(LedgerError, match="missing"):
        parent.bucket("2026-11")
    assert again.bucket("2026-12").remaining() == 10.0  # another period is its own budget
