"""What the medium can do to a ledger file: each case ends in our LedgerError, loses nothing.

Empty, truncated, foreign and half-created files; read-only storage and a full disk (a real
small tmpfs mounted by the test — as root here and in CI; skipped cleanly where mounting is
not permitted).
"""

import os
import sqlite3
import subprocess
import uuid

import pytest

from renyi.budget import Budget
from renyi.errors import BudgetExceededError
from renyi.events import PureDpEvent
from renyi.ledger import LedgerError, SQLiteLedgerStore


def _filled(path, n=5):
    b = Budget(epsilon=100.0, ledger=path)
    for i in range(n):
        b.spend(PureDpEvent(1.0), label=f"r{i}")
    b.close()


def test_empty_file_is_refused_not_restarted(tmp_path):
    """The issue's case: a 0-byte file silently became a fresh, full budget."""
    path = tmp_path / "b.sqlite"
    path.write_bytes(b"")
    with pytest.raises(LedgerError, match=r"empty file \(0 bytes\)"):
        Budget(epsilon=1.0, ledger=path)
    with pytest.raises(LedgerError, match="empty file"):
        Budget.open(path)
    assert path.read_bytes() == b""  # untouched


@pytest.mark.parametrize("keep", [50, 4096, 0.6])
def test_truncated_file_gives_our_error(tmp_path, keep):
    path = tmp_path / "b.sqlite"
    _filled(path, 30)
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    path.write_bytes(data[:cut])
    with pytest.raises(LedgerError, match=r"truncated|corrupted"):
        Budget.open(path)
    with pytest.raises(LedgerError):
        Budget(epsilon=100.0, ledger=path)
    assert path.read_bytes() == data[:cut]  # never rewritten


def test_directory_and_missing_paths(tmp_path):
    with pytest.raises(LedgerError, match="is a directory"):
        Budget(epsilon=1.0, ledger=tmp_path)
    with pytest.raises(LedgerError, match="no ledger at"):
        Budget.open(tmp_path / "missing.sqlite")
    with pytest.raises(LedgerError, match="cannot"):
        Budget(epsilon=1.0, ledger=tmp_path / "no-such-dir" / "b.sqlite")
    assert not (tmp_path / "no-such-dir").exists()


def test_foreign_files_are_never_overwritten(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 10)
    with pytest.raises(LedgerError, match="not a SQLite"):
        Budget(epsilon=1.0, ledger=junk)
    assert junk.read_bytes() == b"this is not a database at all" * 10
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    with pytest.raises(LedgerError, match="not a renyi ledger"):
        Budget(epsilon=1.0, ledger=foreign)
    assert foreign.read_bytes() == before


def test_half_created_ledger_of_an_older_renyi_is_completed(tmp_path):
    """Our file tag but no marker and no entries (old non-atomic creation, crashed): nothing
    can be lost, so creating the budget completes it instead of refusing forever."""
    path = tmp_path / "b.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 1380273753")  # 0x52454E59
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="holds no budget"):
        Budget.open(path)
    b = Budget(epsilon=2.0, ledger=path)
    b.spend(PureDpEvent(1.0))
    assert Budget.open(path).remaining() == 1.0


def test_creation_is_atomic_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "b.sqlite"
    b = Budget(epsilon=1.0, ledger=path)
    assert b.created and not Budget(epsilon=1.0, ledger=path).created
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("b.sqlite")) == []


# ----------------------------------------------------------------------------- tmpfs


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs mounted for the test (skipped where mounting is not permitted)."""
    mnt = tmp_path / f"mnt-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill_disk(mnt):
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def test_full_disk_refuses_records_nothing_and_recovers(tmpfs):
    path = tmpfs / "b.sqlite"
    b = Budget(epsilon=1e6, ledger=path)
    for i in range(10):
        b.spend(PureDpEvent(1.0), label=f"r{i}")
    filler = _fill_disk(tmpfs)
    big = {"blob": "x" * 200_000}  # an entry that cannot fit
    with pytest.raises(LedgerError, match="no space left"):
        b.spend(PureDpEvent(1.0), label="too big", metadata=big)
    assert len(b.entries()) == 10 and b.verify()  # nothing half-written, nothing lost
    filler.unlink()
    b.spend(PureDpEvent(1.0), label="after")
    again = Budget.open(path)
    assert len(again.entries()) == 11 and again.verify() and again.remaining() == 1e6 - 11


def test_creation_on_a_full_disk_leaves_nothing_behind(tmpfs):
    _fill_disk(tmpfs)
    path = tmpfs / "new.sqlite"
    with pytest.raises(LedgerError, match="no space left"):
        Budget(epsilon=1.0, ledger=path)
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler"]  # no half-created ledger
    (tmpfs / "filler").unlink()
    assert Budget(epsilon=1.0, ledger=path).created


def test_read_only_storage_reads_but_refuses_to_spend(tmpfs):
    path = tmpfs / "b.sqlite"
    _filled(path, 5)
    before = path.read_bytes()
    done = subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot remount read-only: {done.stderr.decode().strip()}")
    b = Budget.open(path)  # reading works (the file is opened as immutable)
    assert b.remaining() == 95.0 and len(b.entries()) == 5 and b.verify()
    with pytest.raises(LedgerError, match="read-only"):
        b.spend(PureDpEvent(1.0))
    with pytest.raises(LedgerError, match="read-only"):
        Budget(epsilon=1.0, ledger=tmpfs / "other.sqlite")
    assert path.read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_file_refuses_to_spend(tmp_path):  # pragma: no cover - non-root CI
    path = tmp_path / "b.sqlite"
    _filled(path, 2)
    path.chmod(0o444)
    with pytest.raises(LedgerError, match="read-only"):
        Budget.open(path).spend(PureDpEvent(1.0))


def test_refused_spend_on_full_budget_still_exact(tmp_path):
    path = tmp_path / "b.sqlite"
    b = Budget(epsilon=3.0, ledger=path)
    for _ in range(3):
        b.spend(PureDpEvent(1.0))
    with pytest.raises(BudgetExceededError):
        b.spend(PureDpEvent(1.0))
    assert SQLiteLedgerStore(path).entries()[-1].index == 2


def test_reopening_a_ledger_in_one_process_keeps_its_sqlite_locks(tmp_path):
    """Opening the same file again used to read its header with open()/close(), which drops
    every POSIX lock this process held on it: another process's last close then deleted the
    WAL, and the next commit went to a deleted file (lost). One entry per spend must stay."""
    import sys

    path = tmp_path / "b.sqlite"
    a = Budget(epsilon=10.0, ledger=path)
    a.spend(PureDpEvent(1.0))
    Budget.open(path)  # a second store on the same file, in the same process
    peek = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "print(c.execute('SELECT COUNT(*) FROM entries').fetchone()[0]); c.close()"
    )

    def count():
        out = subprocess.run(
            [sys.executable, "-c", peek, str(path)], capture_output=True, text=True, timeout=60
        )
        return int(out.stdout)

    assert count() == 1
    a.spend(PureDpEvent(1.0))
    assert count() == 2
