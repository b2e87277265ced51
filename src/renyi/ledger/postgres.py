"""A team ledger on PostgreSQL (psycopg 3): many processes on many machines, one budget.

``PostgresLedgerStore("postgresql://user@host/db")`` keeps the same hash-chained entries as
the SQLite store in three tables (``renyi_ledger_meta``, ``renyi_ledger_entries``,
``renyi_ledger_state``) keyed by a ledger name, so one database can hold several budgets
(``postgresql://host/db#team-a`` names one; the default is ``default``). Each chain is bound
to its ledger's name and id, so rows moved or renamed between ledgers fail verification.
Two more tables hold the ledger service's hashed access tokens and its log of refused
spends (``renyi_ledger_tokens``, ``renyi_ledger_refusals``; neither is part of any chain).

Every spend runs in a ``SERIALIZABLE`` transaction that locks the ledger's state row
(``SELECT ... FOR UPDATE``), verifies the entries appended since it last looked, checks the
limit and appends; PostgreSQL aborts any transaction whose outcome would differ from some
serial order, and the store retries those (``serialization_failure``, ``deadlock_detected``)
with jittered back-off, so concurrent spenders never overspend together. A spend returns
only after ``COMMIT`` does; the release must come after it.

Install with ``pip install 'renyi[postgres]'``.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

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

__all__ = ["PostgresLedgerStore", "is_postgres_url"]

T = TypeVar("T")

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS renyi_ledger_meta ("
    " ledger TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (ledger, key))",
    "CREATE TABLE IF NOT EXISTS renyi_ledger_entries ("
    " ledger TEXT NOT NULL, idx BIGINT NOT NULL, time TEXT NOT NULL, event TEXT NOT NULL,"
    " count BIGINT NOT NULL, cost TEXT NOT NULL, state_after TEXT NOT NULL, label TEXT,"
    " metadata TEXT NOT NULL, hash TEXT NOT NULL, PRIMARY KEY (ledger, idx))",
    "CREATE TABLE IF NOT EXISTS renyi_ledger_state ( ledger TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "ALTER TABLE renyi_ledger_entries ADD COLUMN IF NOT EXISTS idem TEXT",
    "CREATE UNIQUE INDEX IF NOT EXISTS renyi_ledger_entries_idem"
    " ON renyi_ledger_entries (ledger, idem)",
    "CREATE TABLE IF NOT EXISTS renyi_ledger_tokens ( id TEXT PRIMARY KEY, hash TEXT NOT NULL,"
    " name TEXT NOT NULL, role TEXT NOT NULL, scope TEXT NOT NULL, created TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS renyi_ledger_refusals ( seq BIGSERIAL PRIMARY KEY,"
    " ledger TEXT NOT NULL, time TEXT NOT NULL, who TEXT, event TEXT NOT NULL,"
    " count BIGINT NOT NULL, detail TEXT NOT NULL)",
]
_COLUMNS = "idx, time, event, count, cost, state_after, label, metadata, hash"
_LOCK_ID = 0x52454E59  # advisory lock serialising schema creation


def is_postgres_url(text: str) -> bool:
    """Whether ``text`` is a PostgreSQL connection URL (``postgresql://`` or ``postgres://``)."""
    return text.startswith(("postgresql://", "postgres://"))


def _redact(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class _PgTxn:
    def __init__(self, cur: Any, ledger: str, where: str, write: bool) -> None:
        self._cur = cur
        self._ledger = ledger
        self._where = where
        self._lock = " FOR UPDATE" if write else ""

    def state(self) -> dict[str, Any] | None:
        self._cur.execute(
            "SELECT value FROM renyi_ledger_state WHERE ledger = %s" + self._lock, (self._ledger,)
        )
        row = self._cur.fetchone()
        return None if row is None else loads_object(row[0], f"{self._where}: state row")

    def entries(self, start: int = 0) -> list[LedgerEntry]:
        self._cur.execute(
            f"SELECT {_COLUMNS} FROM renyi_ledger_entries WHERE ledger = %s AND idx >= %s "
            "ORDER BY idx",
            (self._ledger, start),
        )
        return [entry_from_row(r, self._where) for r in self._cur.fetchall()]

    def count_entries(self) -> int:
        self._cur.execute(
            "SELECT COUNT(*) FROM renyi_ledger_entries WHERE ledger = %s", (self._ledger,)
        )
        return int(self._cur.fetchone()[0])

    def find(self, idempotency_key: str) -> LedgerEntry | None:
        self._cur.execute(
            f"SELECT {_COLUMNS} FROM renyi_ledger_entries WHERE ledger = %s AND idem = %s",
            (self._ledger, idempotency_key),
        )
        row = self._cur.fetchone()
        return None if row is None else entry_from_row(row, self._where)

    def append(
        self, entry: LedgerEntry, new_state: dict[str, Any], idempotency_key: str | None = None
    ) -> None:
        self._cur.execute(
            f"INSERT INTO renyi_ledger_entries (ledger, {_COLUMNS}, idem) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
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
        self._cur.execute(
            "UPDATE renyi_ledger_state SET value = %s WHERE ledger = %s",
            (dumps(new_state), self._ledger),
        )


class PostgresLedgerStore:
    """A ledger in a PostgreSQL database. See the module docstring.

    Args:
        url: ``postgresql://[user[:password]@]host[:port]/dbname[?options][#ledger]`` (any
            libpq URL; ``host=/path`` in the query selects a unix socket directory).
        ledger: the ledger's name inside the database (overrides a ``#name`` fragment).
        create: if False, a database without this ledger raises LedgerError at once.
        timeout: seconds to keep retrying serialisation failures and to wait for a connection.
    """

    def __init__(
        self, url: str, *, ledger: str | None = None, create: bool = True, timeout: float = 60.0
    ) -> None:
        try:
            import psycopg
        except ImportError:
            raise ModuleNotFoundError(
                "a postgresql:// ledger needs psycopg 3: pip install 'renyi[postgres]'",
                name="psycopg",
            ) from None
        self._psycopg = psycopg
        parts = urlsplit(url)
        self.url = urlunsplit((parts.scheme, parts.netloc, parts.path, parts.query, ""))
        self.ledger = check_name(ledger or parts.fragment or DEFAULT_NAME)
        self.name = self.ledger
        self._timeout = timeout
        self._local = threading.local()
        self._where = f"{_redact(self.url)}#{self.ledger}"
        if not create and self.spec() is None:
            raise LedgerNotFoundError(f"no ledger named {self.ledger!r} in {_redact(self.url)}")

    def describe(self) -> str:
        return self._where

    # -- connections and errors ------------------------------------------------------
    @contextmanager
    def _connect(self, action: str) -> Iterator[Any]:
        """This thread's connection, opened on first use and kept (dropped after an error)."""
        psycopg = self._psycopg
        cached = getattr(self._local, "conn", None)
        if cached is not None and cached[0] == os.getpid() and not cached[1].closed:
            conn = cached[1]
        else:
            try:
                conn = psycopg.connect(self.url, connect_timeout=max(1, int(self._timeout)))
            except psycopg.Error as exc:
                raise LedgerError(f"cannot connect to {self._where} to {action}: {exc}") from None
            self._local.conn = (os.getpid(), conn)
        try:
            yield conn
        except (psycopg.Error, LedgerError):
            self.close()
            raise

    def close(self) -> None:
        """Close this thread's connection (a later call opens a new one)."""
        cached = getattr(self._local, "conn", None)
        self._local.conn = None
        if cached is not None and cached[0] == os.getpid():
            with contextlib.suppress(Exception):
                cached[1].close()

    def _run(self, fn: Callable[[Transaction], T], action: str, *, write: bool) -> T:
        """Run ``fn`` in a SERIALIZABLE transaction, retrying serialisation failures."""
        psycopg = self._psycopg
        retry = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
        deadline = time.monotonic() + self._timeout
        delay = 0.002
        with self._connect(action) as conn:
            conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
            conn.read_only = not write
            while True:
                try:
                    with conn.transaction(), conn.cursor() as cur:
                        return fn(_PgTxn(cur, self.ledger, self._where, write))
                except retry:
                    if time.monotonic() > deadline:
                        raise LedgerError(
                            f"{self._where}: could not {action}: the database kept aborting "
                            f"the transaction for {self._timeout:g} s of contention "
                            "(nothing was recorded)"
                        ) from None
                    time.sleep(delay * (1 + random.random()))
                    delay = min(delay * 2, 0.2)
                except psycopg.errors.UndefinedTable:
                    raise LedgerNotFoundError(f"no ledger tables in {_redact(self.url)}") from None
                except psycopg.Error as exc:
                    raise LedgerError(
                        f"{self._where}: could not {action} (nothing was recorded): {exc}"
                    ) from None

    # -- LedgerStore -----------------------------------------------------------------
    def named(self, name: str) -> PostgresLedgerStore:
        """The same database, speaking for the ledger ``name``."""
        return PostgresLedgerStore(self.url, ledger=name, timeout=self._timeout)

    def _check_meta(self, meta: dict[str, str]) -> None:
        if meta.get("magic") != MAGIC:
            raise LedgerError(f"{self._where} is not a renyi ledger")
        version = meta.get("schema_version")
        if version != str(SCHEMA_VERSION):
            hint = (
                " (written by an older renyi whose state row was not authenticated)"
                if version == "2"
                else ""
            )
            raise LedgerError(
                f"{self._where}: unsupported ledger schema {version!r}{hint}; this renyi reads "
                f"schema {SCHEMA_VERSION}"
            )

    def _schema(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
        for stmt in _SCHEMA:
            cur.execute(stmt)

    def initialise(self, spec: dict[str, Any], state: dict[str, Any], ledger_id: str) -> bool:
        psycopg = self._psycopg
        with self._connect("create the ledger") as conn:
            try:
                conn.isolation_level = None
                conn.read_only = False
                with conn.transaction(), conn.cursor() as cur:
                    self._schema(cur)
                    cur.execute(
                        "SELECT key, value FROM renyi_ledger_meta WHERE ledger = %s",
                        (self.ledger,),
                    )
                    meta = dict(cur.fetchall())
                    if meta:
                        self._check_meta(meta)
                        held = loads(meta.get("budget", "null"), f"{self._where}: budget")
                        if held != spec:
                            raise LedgerError(
                                f"{self._where} already holds a different budget: "
                                f"{meta.get('budget')}"
                            )
                        return False
                    cur.executemany(
                        "INSERT INTO renyi_ledger_meta (ledger, key, value) VALUES (%s, %s, %s)",
                        [
                            (self.ledger, "magic", MAGIC),
                            (self.ledger, "schema_version", str(SCHEMA_VERSION)),
                            (self.ledger, "budget", dumps(spec)),
                            (self.ledger, "id", ledger_id),
                        ],
                    )
                    cur.execute(
                        "INSERT INTO renyi_ledger_state (ledger, value) VALUES (%s, %s)",
                        (self.ledger, dumps(state)),
                    )
                    return True
            except psycopg.Error as exc:
                raise LedgerError(f"{self._where}: could not create the ledger: {exc}") from None

    def _tables_exist(self, cur: Any) -> bool:
        cur.execute("SELECT to_regclass('renyi_ledger_meta') IS NOT NULL")
        return bool(cur.fetchone()[0])

    def info(self) -> dict[str, Any] | None:
        def fn(t: Transaction) -> dict[str, Any] | None:
            cur = t._cur  # type: ignore[attr-defined]
            if not self._tables_exist(cur):
                return None
            cur.execute(
                "SELECT key, value FROM renyi_ledger_meta WHERE ledger = %s", (self.ledger,)
            )
            meta = dict(cur.fetchall())
            if not meta:
                return None
            self._check_meta(meta)
            if "budget" not in meta or not isinstance(meta.get("id"), str):
                raise LedgerError(f"{self._where} holds no budget or no id (damaged ledger)")
            spec = loads_object(meta["budget"], f"{self._where}: budget")
            return {"spec": spec, "id": meta["id"], "name": self.ledger}

        return self._run(fn, "read the ledger", write=False)

    def spec(self) -> dict[str, Any] | None:
        info = self.info()
        return None if info is None else info["spec"]

    def names(self) -> list[str]:
        def fn(t: Transaction) -> list[str]:
            cur = t._cur  # type: ignore[attr-defined]
            if not self._tables_exist(cur):
                return []
            cur.execute("SELECT ledger FROM renyi_ledger_meta WHERE key = 'budget' ORDER BY ledger")
            return [str(r[0]) for r in cur.fetchall()]

        return self._run(fn, "read the ledger", write=False)

    def entries(self) -> list[LedgerEntry]:
        return self.read(lambda t: t.entries())

    def read(self, fn: Callable[[Transaction], T]) -> T:
        return self._run(fn, "read the ledger", write=False)

    def transaction(self, fn: Callable[[Transaction], T]) -> T:
        return self._run(fn, "record the release", write=True)

    # -- the ledger service's records (not part of any chain) ------------------------
    def _service_write(self, sql: str, params: tuple[Any, ...], action: str) -> int:
        psycopg = self._psycopg
        with self._connect(action) as conn:
            try:
                conn.isolation_level = None
                conn.read_only = False
                with conn.transaction(), conn.cursor() as cur:
                    self._schema(cur)
                    cur.execute(sql, params)
                    return int(cur.rowcount)
            except psycopg.Error as exc:
                raise LedgerError(f"{self._where}: could not {action}: {exc}") from None

    def add_token(self, record: TokenRecord) -> None:
        self._service_write(
            "INSERT INTO renyi_ledger_tokens (id, hash, name, role, scope, created) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (record.id, record.hash, record.name, record.role, record.scope, record.created),
            "record the token",
        )

    def get_token(self, token_id: str) -> TokenRecord | None:
        def fn(t: Transaction) -> TokenRecord | None:
            cur = t._cur  # type: ignore[attr-defined]
            cur.execute("SELECT to_regclass('renyi_ledger_tokens') IS NOT NULL")
            if not cur.fetchone()[0]:
                return None
            cur.execute(
                "SELECT id, hash, name, role, scope, created FROM renyi_ledger_tokens "
                "WHERE id = %s",
                (token_id,),
            )
            row = cur.fetchone()
            return None if row is None else TokenRecord(*(str(x) for x in row))

        return self._run(fn, "read the tokens", write=False)

    def list_tokens(self) -> list[TokenRecord]:
        def fn(t: Transaction) -> list[TokenRecord]:
            cur = t._cur  # type: ignore[attr-defined]
            cur.execute("SELECT to_regclass('renyi_ledger_tokens') IS NOT NULL")
            if not cur.fetchone()[0]:
                return []
            cur.execute(
                "SELECT id, hash, name, role, scope, created FROM renyi_ledger_tokens "
                "ORDER BY created, id"
            )
            return [TokenRecord(*(str(x) for x in row)) for row in cur.fetchall()]

        return self._run(fn, "read the tokens", write=False)

    def delete_token(self, token_id: str) -> bool:
        return (
            self._service_write(
                "DELETE FROM renyi_ledger_tokens WHERE id = %s", (token_id,), "revoke the token"
            )
            > 0
        )

    def log_refusal(self, who: str | None, event: dict[str, Any], count: int, detail: str) -> None:
        self._service_write(
            "INSERT INTO renyi_ledger_refusals (ledger, time, who, event, count, detail) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (self.ledger, now_iso(), who, dumps(event), int(count), detail),
            "record the refusal",
        )

    def refusals(self, limit: int = 100) -> list[dict[str, Any]]:
        def fn(t: Transaction) -> list[dict[str, Any]]:
            cur = t._cur  # type: ignore[attr-defined]
            cur.execute("SELECT to_regclass('renyi_ledger_refusals') IS NOT NULL")
            if not cur.fetchone()[0]:
                return []
            cur.execute(
                "SELECT time, who, event, count, detail FROM renyi_ledger_refusals "
                "WHERE ledger = %s ORDER BY seq DESC LIMIT %s",
                (self.ledger, int(limit)),
            )
            return [
                {"time": t, "who": w, "event": loads(e, "refusal"), "count": c, "detail": d}
                for t, w, e, c, d in cur.fetchall()
            ]

        return self._run(fn, "read the refusals", write=False)
