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
never modified. Every failure of the medium (read-only, full, corrupted — including bytes
that no longer decode as text) is a LedgerError saying what happened and that nothing was
recorded.

One file can hold several named ledgers (``SQLiteLedgerStore(path, ledger="census")``, or
``"path#census"`` through :func:`renyi.ledger.open_store`); a file's ledger is ``"default"``
unless named. The file also keeps the ledger service's hashed access tokens and its log of
refused spends (neither is part of any chain).
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
    DEFAULT_NAME,
    MAGIC,
    SCHEMA_VERSION,
    LedgerEntry,
    LedgerError,
    LedgerNotFoundError,
    TokenRecord,
    Transaction,
    check_name,
    dumps,
    entry_from_row,
    loads,
    loads_object,
    now_iso,
)

__all__ = ["SQLiteLedgerStore"]

# A 32-bit tag in the SQLite header: lets us tell our files from foreign databases.
APPLICATION_ID = 0x52454E59  # "RENY"
_HEADER = b"SQLite format 3\x00"

T = TypeVar("T")

# meta rows of ledger '' describe the file (magic, schema_version); the others, one ledger
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    ledger TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (ledger, key)
);
CREATE TABLE IF NOT EXISTS entries (
    ledger TEXT NOT NULL,
    idx INTEGER NOT NULL,
    time TEXT NOT NULL,
    event TEXT NOT NULL,
    count INTEGER NOT NULL,
    cost TEXT NOT NULL,
    state_after TEXT NOT NULL,
    label TEXT,
    metadata TEXT NOT NULL,
    hash TEXT NOT NULL,
    idem TEXT,
    PRIMARY KEY (ledger, idx)
);
CREATE UNIQUE INDEX IF NOT EXISTS entries_idem ON entries (ledger, idem);
CREATE TABLE IF NOT EXISTS state (ledger TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, hash TEXT NOT NULL, name TEXT NOT NULL, role TEXT NOT NULL,
    scope TEXT NOT NULL, created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS refusals (
    ledger TEXT NOT NULL, time TEXT NOT NULL, who TEXT, event TEXT NOT NULL,
    count INTEGER NOT NULL, detail TEXT NOT NULL
);
"""
_TABLES = ("meta", "entries", "state", "tokens", "refusals")

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
    except UnicodeError as exc:  # stored text that no longer decodes: flipped bits
        raise LedgerError(
            f"{where} is corrupted (stored text does not decode: {exc}); refusing to use it — "
            "restore it from a backup"
        ) from None


class _SQLiteTxn:
    def __init__(self, conn: sqlite3.Connection, where: str, ledger: str) -> None:
        self._conn = conn
        self._where = where
        self._ledger = ledger

    def state(self) -> dict[str, Any] | None:
        row = self._conn.execute(
            "SELECT value FROM state WHERE ledger = ?", (self._ledger,)
        ).fetchone()
        return None if row is None else loads_object(row[0], f"{self._where}: state row")

    def entries(self, start: int = 0) -> list[LedgerEntry]:
        rows = self._conn.execute(
            f"SELECT {_COLUMNS} FROM entries WHERE ledger = ? AND idx >= ? ORDER BY idx",
            (self._ledger, start),
        ).fetchall()
        return [entry_from_row(r, self._where) for r in rows]

    def count_entries(self) -> int:
        return int(
            self._conn.execute(
                "SELECT COUNT(*) FROM entries WHERE ledger = ?", (self._ledger,)
            ).fetchone()[0]
        )

    def find(self, idempotency_key: str) -> LedgerEntry | None:
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM entries WHERE ledger = ? AND idem = ?",
            (self._ledger, idempotency_key),
        ).fetchone()
        return None if row is None else entry_from_row(row, self._where)

    def append(
        self, entry: LedgerEntry, new_state: dict[str, Any], idempotency_key: str | None = None
    ) -> None:
        self._conn.execute(
            f"INSERT INTO entries (ledger, {_COLUMNS}, idem) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self._ledger,
                entry.index,
                entry.time,
                dumps(entry.event),
                entry.count,
                dumps(entry.cost),
                dumps(entry.state_after),
                entry.label,
                dumps(entry.metadata),
                entry.hash,
                idempotency_key,
            ),
        )
        self._conn.execute(
            "UPDATE state SET value = ? WHERE ledger = ?", (dumps(new_state), self._ledger)
        )


# SQLite's locks are POSIX advisory locks, which a process loses on *every* fd of a file as
# soon as it closes *any* fd of that file (sqlite.org/howtocorrupt.html, 2.2). Reading the
# header with open()/close() while this process holds connections to the same file would drop
# their locks: another process closing its last connection would then checkpoint and delete
# the WAL under our feet, and our later commits would go to a deleted file. So the header is
# read through one fd per file (device, inode) that is opened once and never closed.
_HEADER_FDS: dict[tuple[int, int], int] = {}
_HEADER_LOCK = threading.Lock()


def _read_header(path: Path) -> bytes:
    st = os.stat(path)
    with _HEADER_LOCK:
        fd = _HEADER_FDS.get((st.st_dev, st.st_ino))
        if fd is None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            held = os.fstat(fd)
            _HEADER_FDS.setdefault((held.st_dev, held.st_ino), fd)
            fd = _HEADER_FDS[(held.st_dev, held.st_ino)]
    return os.pread(fd, 100, 0)


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
        ledger: the ledger's name in the file (default ``"default"``).
        create: if False, a missing file raises LedgerError at once.
        timeout: seconds to wait for another process's write lock.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ledger: str | None = None,
        create: bool = True,
        timeout: float = 60.0,
    ) -> None:
        self.path = Path(path)
        self.name = check_name(ledger or DEFAULT_NAME)
        self._timeout = timeout
        self._where = repr(str(self.path)) + ("" if self.name == DEFAULT_NAME else f"#{self.name}")
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
        with _guard(self._where, "read the ledger"):
            header = _read_header(self.path)
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
                columns = {r[1] for r in conn.execute("PRAGMA table_info(meta)")}
                where = " WHERE ledger = ''" if "ledger" in columns else ""
                rows = dict(conn.execute(f"SELECT key, value FROM meta{where}").fetchall())
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
            hint = {
                "1": " (written by an older renyi without the hash chain)",
                "2": " (written by an older renyi whose state row was not authenticated: read "
                "it with that renyi, e.g. `renyi ledger show --json`, and start a new ledger)",
            }.get(str(version), "")
            raise LedgerError(
                f"{self._where}: unsupported ledger schema {version!r}{hint}; this renyi reads "
                f"schema {SCHEMA_VERSION}"
            )
        return False

    # -- LedgerStore -----------------------------------------------------------------
    def named(self, name: str) -> SQLiteLedgerStore:
        """The same file, speaking for the ledger ``name``."""
        return SQLiteLedgerStore(self.path, ledger=name, timeout=self._timeout)

    def _write(self, fn: Callable[[sqlite3.Connection], T], action: str) -> T:
        """Run ``fn`` inside one write transaction (BEGIN IMMEDIATE ... COMMIT)."""
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
                    out = fn(conn)
                    conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            return out

    def _ledger_rows(self, spec: dict[str, Any], state: dict[str, Any], ledger_id: str) -> Any:
        return (
            [(self.name, "budget", dumps(spec)), (self.name, "id", ledger_id)],
            (self.name, dumps(state)),
        )

    def initialise(self, spec: dict[str, Any], state: dict[str, Any], ledger_id: str) -> bool:
        if not self.path.exists():
            if self._create(spec, state, ledger_id):
                return True
        self._check_file()
        with self._conn(read_only=True, action="open the ledger") as conn:
            self._half = self._check_schema(conn)
        if self._half:
            self._complete()
        info = self.info()
        if info is None:

            def add(conn: sqlite3.Connection) -> bool:
                held = conn.execute(
                    "SELECT value FROM meta WHERE ledger = ? AND key = 'budget'", (self.name,)
                ).fetchone()
                if held is not None:
                    return False  # another process created it meanwhile: compare below
                meta, row = self._ledger_rows(spec, state, ledger_id)
                conn.executemany("INSERT INTO meta (ledger, key, value) VALUES (?, ?, ?)", meta)
                conn.execute("INSERT INTO state (ledger, value) VALUES (?, ?)", row)
                return True

            if self._write(add, "create the ledger"):
                return True
            info = self.info()
            if info is None:  # pragma: no cover - a row vanished between two reads
                raise LedgerError(f"{self._where} holds no budget (damaged ledger)")
        if info["spec"] != spec:
            raise LedgerError(
                f"{self._where} already holds a different budget: {dumps(info['spec'])}"
            )
        return False

    def _create(self, spec: dict[str, Any], state: dict[str, Any], ledger_id: str) -> bool:
        """Write the whole ledger beside the target, then link it into place. False if beaten."""
        tmp = self.path.with_name(f".{self.path.name}.creating-{uuid.uuid4().hex[:12]}")
        try:
            with _guard(repr(str(tmp)), "create the ledger"):
                conn = self._raw_connect(tmp)
                try:
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    conn.execute("PRAGMA journal_mode = WAL")
                    conn.execute("BEGIN IMMEDIATE")
                    self._fill(conn, spec, state, ledger_id)
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

    def _fill(
        self,
        conn: sqlite3.Connection,
        spec: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        ledger_id: str | None = None,
    ) -> None:
        """Create the schema and the file's marker (and this ledger, if given)."""
        for stmt in _SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        conn.executemany(
            "INSERT INTO meta (ledger, key, value) VALUES ('', ?, ?)",
            [("magic", MAGIC), ("schema_version", str(SCHEMA_VERSION))],
        )
        if spec is not None and state is not None and ledger_id is not None:
            meta, row = self._ledger_rows(spec, state, ledger_id)
            conn.executemany("INSERT INTO meta (ledger, key, value) VALUES (?, ?, ?)", meta)
            conn.execute("INSERT INTO state (ledger, value) VALUES (?, ?)", row)

    def _complete(self) -> None:
        """Finish a file whose creation an older renyi left half done (it holds no entry)."""
        with (
            self._conn(read_only=False, action="complete the half-created ledger") as conn,
            _guard(self._where, "complete the half-created ledger"),
        ):
            conn.execute("BEGIN IMMEDIATE")
            try:
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
                n = 0
                if "entries" in tables:
                    n = int(conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
                if n == 0 and self._check_schema(conn):
                    for table in _TABLES:
                        conn.execute(f"DROP TABLE IF EXISTS {table}")
                    self._fill(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("PRAGMA journal_mode = WAL")
        self._half = False

    def info(self) -> dict[str, Any] | None:
        if self._half:
            return None
        with (
            self._conn(read_only=True, action="read the ledger") as conn,
            _guard(self._where, "read the ledger"),
        ):
            rows = conn.execute(
                "SELECT key, value FROM meta WHERE ledger = ?", (self.name,)
            ).fetchall()
        meta = dict(rows)
        if "budget" not in meta:
            return None
        if not isinstance(meta.get("id"), str):
            raise LedgerError(f"{self._where} holds a budget but no ledger id (damaged ledger)")
        spec = loads_object(meta["budget"], f"{self._where}: budget")
        return {"spec": spec, "id": meta["id"], "name": self.name}

    def spec(self) -> dict[str, Any] | None:
        info = self.info()
        return None if info is None else info["spec"]

    def names(self) -> list[str]:
        if self._half or not self.path.exists():
            return []
        with (
            self._conn(read_only=True, action="read the ledger") as conn,
            _guard(self._where, "read the ledger"),
        ):
            rows = conn.execute(
                "SELECT ledger FROM meta WHERE key = 'budget' ORDER BY ledger"
            ).fetchall()
        return [str(r[0]) for r in rows]

    def entries(self) -> list[LedgerEntry]:
        return self.read(lambda t: t.entries())

    def read(self, fn: Callable[[Transaction], T]) -> T:
        with (
            self._conn(read_only=True, action="read the ledger") as conn,
            _guard(self._where, "read the ledger"),
        ):
            conn.execute("BEGIN")
            try:
                return fn(_SQLiteTxn(conn, self._where, self.name))
            finally:
                conn.execute("ROLLBACK")

    def transaction(self, fn: Callable[[Transaction], T]) -> T:
        return self._write(lambda conn: fn(_SQLiteTxn(conn, self._where, self.name)), _RECORD)

    # -- the ledger service's records (not part of any chain) ------------------------
    def add_token(self, record: TokenRecord) -> None:
        def add(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO tokens (id, hash, name, role, scope, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (record.id, record.hash, record.name, record.role, record.scope, record.created),
            )

        self._write(add, "record the token")

    def get_token(self, token_id: str) -> TokenRecord | None:
        with (
            self._conn(read_only=True, action="read the ledger") as conn,
            _guard(self._where, "read the ledger"),
        ):
            row = conn.execute(
                "SELECT id, hash, name, role, scope, created FROM tokens WHERE id = ?",
                (token_id,),
            ).fetchone()
        return None if row is None else TokenRecord(*(str(x) for x in row))

    def list_tokens(self) -> list[TokenRecord]:
        with (
            self._conn(read_only=True, action="read the tokens") as conn,
            _guard(self._where, "read the tokens"),
        ):
            rows = conn.execute(
                "SELECT id, hash, name, role, scope, created FROM tokens ORDER BY created, id"
            ).fetchall()
        return [TokenRecord(*(str(x) for x in row)) for row in rows]

    def delete_token(self, token_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM tokens WHERE id = ?", (token_id,)).rowcount > 0

        return bool(self._write(delete, "revoke the token"))

    def log_refusal(self, who: str | None, event: dict[str, Any], count: int, detail: str) -> None:
        def add(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO refusals (ledger, time, who, event, count, detail) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (self.name, now_iso(), who, dumps(event), int(count), detail),
            )

        self._write(add, "record the refusal")

    def refusals(self, limit: int = 100) -> list[dict[str, Any]]:
        with (
            self._conn(read_only=True, action="read the ledger") as conn,
            _guard(self._where, "read the ledger"),
        ):
            rows = conn.execute(
                "SELECT time, who, event, count, detail FROM refusals WHERE ledger = ? "
                "ORDER BY rowid DESC LIMIT ?",
                (self.name, int(limit)),
            ).fetchall()
        return [
            {"time": t, "who": w, "event": loads(e, "refusal"), "count": c, "detail": d}
            for t, w, e, c, d in rows
        ]


_RECORD = "record the release"
