"""A ledger in one SQLite file (standard library ``sqlite3``; no server): the embedded default.

Durability: WAL journal with ``synchronous=FULL`` — a transaction is on disk when ``commit``
returns, so a process killed at any moment loses no committed entry and never leaves half
of one. Concurrency: spends take SQLite's write lock with ``BEGIN IMMEDIATE`` before
reading the state, so they are serialised across processes.

Creation is atomic: the complete ledger (schema, budget, initial state) is written to a
temporary file beside the target, synced, and then hard-linked into place — which fails
if anything appeared at the path meanwhile, so nothing is ever overwritten and no
half-created ledger is ever visible. A path holding anything else (an empty file, a
truncated or foreign file, another SQLite database) raises :class:`LedgerError` and is
never modified. Every failure of the medium (read-only, full, corrupted) is a LedgerError
saying what happened and that nothing was recorded.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from renyi.ledger._base import (
    MAGIC,
    SCHEMA_VERSION,
    LedgerEntry,
    LedgerError,
    LedgerNotFoundError,
    Transaction,
    dumps,
    entry_from_row,
    loads,
)

__all__ = ["SQLiteLedgerStore"]

# A 32-bit tag in the SQLite header: lets us tell our files from foreign databases.
APPLICATION_ID = 0x52454E59  # "RENY"
_HEADER = b"SQLite format 3\x00"

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    idx INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    event TEXT NOT NULL,
    count INTEGER NOT NULL,
    cost TEXT NOT NULL,
    state_after TEXT NOT NULL,
    label TEXT,
    metadata TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state (id INTEGER PRIMARY KEY CHECK (id = 1), value TEXT NOT NULL);
"""

_COLUMNS = "idx, time, event, count, cost, state_after, label, metadata, hash"


def _read_only_storage(where: str) -> bool:
    """Whether the file named by ``where`` (a repr'd path) sits on read-only storage."""
    try:
        parent = Path(where.strip("'\"")).parent
        return bool(os.statvfs(parent).f_flag & os.ST_RDONLY) or not os.access(parent, os.W_OK)
    except (OSError, ValueError):
        return False


def _explain(where: str, action: str, exc: BaseException) -> str:
    """One sentence for a failure of the medium: what happened and that nothing was recorded."""
    text = str(exc)
    low = text.lower()
    if "unable to open" in low and _read_only_storage(where):
        return f"{where} is on read-only storage: cannot {action} (nothing was recorded)"
    if isinstance(exc, sqlite3.Error) and ("readonly" in low or "read-only" in low):
        return f"{where} is read-only: cannot {action} (nothing was recorded)"
    if isinstance(exc, OSError) and exc.errno == 30:  # EROFS
        return f"{where} is on read-only storage: cannot {action} (nothing was recorded)"
    if "disk is full" in low or "no space" in low or (isinstance(exc, OSError) and exc.errno == 28):
        return (
            f"no space left on the device holding {where}: cannot {action}; nothing was "
            "recorded (and a refused release must not be made) — free some space and retry"
        )
    if "malformed" in low or "not a database" in low or "disk i/o" in low:
        return (
            f"{where} is corrupted or truncated ({text}); refusing to use it — restore it from "
            "a backup"
        )
    if "locked" in low or "busy" in low:
        return f"{where} is locked by another process for too long: cannot {action}"
    if "unable to open" in low:
        return f"cannot open {where} to {action} ({text}): check the path and its permissions"
    return f"{where}: cannot {action}: {text}"


@contextmanager
def _guard(where: str, action: str) -> Iterator[None]:
    try:
        yield
    except LedgerError:
        raise
    except (sqlite3.Error, OSError) as exc:
        raise LedgerError(_explain(where, action, exc)) from exc


class _SQLiteTxn:
    def __init__(self, conn: sqlite3.Connection, where: str) -> None:
        self._conn = conn
        self._where = where

    def state(self) -> dict[str, Any] | None:
        row = self._conn.execute("SELECT value FROM state WHERE id = 1").fetchone()
        return None if row is None else dict(loads(row[0], f"{self._where}: state row"))

    def entries(self, start: int = 0) -> list[LedgerEntry]:
        rows = self._conn.execute(
            f"SELECT {_COLUMNS} FROM entries WHERE idx >= ? ORDER BY idx", (start,)
        ).fetchall()
        return [entry_from_row(r, self._where) for r in rows]

    def count_entries(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def append(self, entry: LedgerEntry, new_state: dict[str, Any]) -> None:
        self._conn.execute(
            f"INSERT INTO entries ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.index,
                entry.time,
                dumps(entry.event),
                entry.count,
                dumps(entry.cost),
                dumps(entry.state_after),
                entry.label,
                dumps(entry.metadata),
                entry.hash,
            ),
        )
        self._conn.execute(
            "INSERT INTO state (id, value) VALUES (1, ?) "
            "ON CONFLICT(id) DO UPDATE SET value = excluded.value",
            (dumps(new_state),),
        )


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class SQLiteLedgerStore:
    """A ledger in one SQLite file. See the module docstring.

    Args:
        path: the ledger file. A missing file is created (atomically) by ``initialise``.
        create: if False, a missing file raises LedgerError at once.
        timeout: seconds to wait for another process's write lock.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, create: bool = True, timeout: float = 60.0
    ) -> None:
        self.path = Path(path)
        self._timeout = timeout
        self._where = repr(str(self.path))
        self._local = threading.local()
        if self.path.is_dir():
            raise LedgerError(f"{self._where} is a directory, not a ledger file")
        self._exists = self.path.exists()
        if not self._exists:
            if not create:
                raise LedgerNotFoundError(f"no ledger at {self._where}")
            return
        self._check_file()
        with self._conn(read_only=True, action="open the ledger") as conn:
            self._half = self._check_schema(conn)

    _half = False  # a creation interrupted by an older renyi: our tag, no marker, no entries

    def describe(self) -> str:
        return str(self.path)

    # -- connection handling ---------------------------------------------------------
    def _raw_connect(self, path: Path, *, immutable: bool = False) -> sqlite3.Connection:
        if immutable:
            uri = f"file:{quote(str(path.resolve()))}?mode=ro&immutable=1"
            conn = sqlite3.connect(uri, uri=True, timeout=self._timeout, isolation_level=None)
        else:
            conn = sqlite3.connect(path, timeout=self._timeout, isolation_level=None)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        return conn

    @contextmanager
    def _conn(self, *, read_only: bool, action: str) -> Iterator[sqlite3.Connection]:
        """This thread's connection (kept open between calls: closing checkpoints the WAL)."""
        if not self._exists and not self.path.exists():
            raise LedgerNotFoundError(f"no ledger at {self._where}")
        cached = getattr(self._local, "conn", None)
        conn: sqlite3.Connection | None = None
        if cached is not None and cached[0] == os.getpid():
            conn = cached[1]
        with _guard(self._where, action):
            if conn is None:
                try:  # touches the WAL index: fails on read-only storage
                    conn = self._raw_connect(self.path)
                    conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
                except sqlite3.OperationalError:
                    if conn is not None:
                        conn.close()
                    if not read_only:
                        raise
                    # read-only storage: SQLite cannot create the WAL index beside the file;
                    # nothing can be writing to it, so read it as an immutable file
                    conn = self._raw_connect(self.path, immutable=True)
                    yield conn
                    conn.close()
                    return
                self._local.conn = (os.getpid(), conn)
        try:
            yield conn
        except (sqlite3.Error, OSError, LedgerError):
            self.close()
            raise

    def close(self) -> None:
        """Close this thread's connection (a later call opens a new one)."""
        cached = getattr(self._local, "conn", None)
        self._local.conn = None
        if cached is not None and cached[0] == os.getpid():
            with contextlib.suppress(sqlite3.Error):
                cached[1].close()

    def _check_file(self) -> None:
        with _guard(self._where, "read the ledger"), open(self.path, "rb") as fh:
            header = fh.read(100)
        size = self.path.stat().st_size
        if size == 0:
            raise LedgerError(
                f"{self._where} is an empty file (0 bytes), not a ledger: a ledger truncated to "
                "nothing or a creation interrupted by an older renyi. Refusing to start a fresh "
                "budget over it: restore the ledger from a backup, or delete the file to start a "
                "new one"
            )
        if not header.startswith(_HEADER):
            raise LedgerError(
                f"{self._where} is not a SQLite database (corrupted or foreign file); "
                "refusing to touch it"
            )
        if len(header) < 100:
            raise LedgerError(
                f"{self._where} is truncated ({size} bytes); restore it from a backup"
            )
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages = int.from_bytes(header[28:32], "big")
        valid = header[24:28] == header[92:96]  # in-header size is valid
        if valid and pages and size < pages * page_size:
            raise LedgerError(
                f"{self._where} is truncated: {size} bytes where its header records "
                f"{pages * page_size}; refusing to use it — restore it from a backup"
            )
        app_id = int.from_bytes(header[68:72], "big")
        if app_id != APPLICATION_ID:
            raise LedgerError(
                f"{self._where} is a SQLite database but not a renyi ledger "
                f"(application_id={app_id:#x}); refusing to modify it"
            )

    def _check_schema(self, conn: sqlite3.Connection) -> bool:
        """Check the file is one of our ledgers; True if it is a half-created one (no data)."""
        with _guard(self._where, "read the ledger"):
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            rows: dict[str, str] = {}
            if "meta" in tables:
                rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            n = 0
            if "entries" in tables:
                n = int(conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
            ok = conn.execute("PRAGMA quick_check").fetchone()[0]
        if ok != "ok":
            raise LedgerError(f"{self._where} is corrupted (integrity check: {ok})")
        if rows.get("magic") != MAGIC:
            if n == 0 and "budget" not in rows:
                return True  # never recorded anything: safe to complete
            raise LedgerError(
                f"{self._where} carries renyi's file tag and {n} entries but no ledger marker: "
                "a damaged ledger; refusing to use it — restore it from a backup"
            )
        version = rows.get("schema_version")
        if version != str(SCHEMA_VERSION):
            hint = " (written by an older renyi without the hash chain)" if version == "1" else ""
            raise LedgerError(
                f"{self._where}: unsupported ledger schema {version!r}{hint}; this renyi reads "
                f"schema {SCHEMA_VERSION}"
            )
        return False

    # -- LedgerStore -----------------------------------------------------------------
    def initialise(self, spec: dict[str, Any], state: dict[str, Any]) -> bool:
        if not self.path.exists():
            if self._create(spec, state):
                return True
        self._check_file()
        with self._conn(read_only=True, action="open the ledger") as conn:
            self._half = self._check_schema(conn)
        if self._half:
            self._complete(spec, state)
        with self._conn(read_only=True, action="open the ledger") as conn:
            with _guard(self._where, "read the ledger"):
                row = conn.execute("SELECT value FROM meta WHERE key = 'budget'").fetchone()
        if row is None:
            raise LedgerError(f"{self._where} holds no budget (damaged ledger)")
        held = loads(row[0], f"{self._where}: budget")
        if held != spec:
            raise LedgerError(f"{self._where} already holds a different budget: {row[0]}")
        return False

    def _create(self, spec: dict[str, Any], state: dict[str, Any]) -> bool:
        """Write the whole ledger beside the target, then link it into place. False if beaten."""
        tmp = self.path.with_name(f".{self.path.name}.creating-{uuid.uuid4().hex[:12]}")
        try:
            with _guard(repr(str(tmp)), "create the ledger"):
                conn = self._raw_connect(tmp)
                try:
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    conn.execute("PRAGMA journal_mode = WAL")
                    conn.execute("BEGIN IMMEDIATE")
                    for stmt in _SCHEMA.split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                    conn.executemany(
                        "INSERT INTO meta (key, value) VALUES (?, ?)",
                        [
                            ("magic", MAGIC),
                            ("schema_version", str(SCHEMA_VERSION)),
                            ("budget", dumps(spec)),
                        ],
                    )
                    conn.execute("INSERT INTO state (id, value) VALUES (1, ?)", (dumps(state),))
                    conn.execute("COMMIT")
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                finally:
                    conn.close()
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
            with _guard(self._where, "create the ledger"):
                try:
                    os.link(tmp, self.path)  # atomic; never replaces an existing file
                except FileExistsError:
                    return False
                _fsync_dir(self.path.parent)
            self._exists = True
            return True
        finally:
            for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def _complete(self, spec: dict[str, Any], state: dict[str, Any]) -> None:
        """Finish a ledger whose creation an older renyi left half done (it holds no entry)."""
        with (
            self._conn(read_only=False, action="complete the half-created ledger") as conn,
            _guard(self._where, "complete the half-created ledger"),
        ):
            conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
                n = int(conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
                magic = conn.execute("SELECT value FROM meta WHERE key = 'magic'").fetchone()
                if n == 0 and magic is None:
                    conn.execute("DELETE FROM meta")
                    conn.execute("DELETE FROM state")
                    conn.executemany(
                        "INSERT INTO meta (key, value) VALUES (?, ?)",
                        [
                            ("magic", MAGIC),
                            ("schema_version", str(SCHEMA_VERSION)),
                            ("budget", dumps(spec)),
                        ],
                    )
                    conn.execute("INSERT INTO state (id, value) VALUES (1, ?)", (dumps(state),))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("PRAGMA journal_mode = WAL")
        self._half = False

    def spec(self) -> dict[str, Any] | None:
        if self._half:
            return None
        with (
            self._conn(read_only=True, action="read the ledger") as conn,
            _guard(self._where, "read the ledger"),
        ):
            row = conn.execute("SELECT value FROM meta WHERE key = 'budget'").fetchone()
        return None if row is None else dict(loads(row[0], f"{self._where}: budget"))

    def entries(self) -> list[LedgerEntry]:
        return self.read(lambda t: t.entries())

    def read(self, fn: Callable[[Transaction], T]) -> T:
        with (
            self._conn(read_only=True, action="read the ledger") as conn,
            _guard(self._where, "read the ledger"),
        ):
            conn.execute("BEGIN")
            try:
                return fn(_SQLiteTxn(conn, self._where))
            finally:
                conn.execute("ROLLBACK")

    def transaction(self, fn: Callable[[Transaction], T]) -> T:
        action = "record the release"
        with self._conn(read_only=False, action=action) as conn:
            deadline = time.monotonic() + self._timeout
            with _guard(self._where, action):
                while True:
                    try:
                        conn.execute("BEGIN IMMEDIATE")
                        break
                    except sqlite3.OperationalError as exc:  # pragma: no cover - contention
                        if "locked" not in str(exc) or time.monotonic() > deadline:
                            raise
                        time.sleep(0.01)
            try:
                with _guard(self._where, action):
                    out = fn(_SQLiteTxn(conn, self._where))
                    conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            return out
