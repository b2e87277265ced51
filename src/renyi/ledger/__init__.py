"""A durable, tamper-evident record of every release spent against a budget.

The store is the source of truth for a :class:`renyi.budget.Budget`: a release is allowed
only after its entry is committed, so a process killed at any moment loses no committed
entry and never leaves half of one. Entries form a hash chain (optionally keyed with HMAC);
the budget re-verifies the chain and recomputes the spent total from the entries' events
when it opens a ledger, and checks the entries appended since then before every spend, so
an edited state row, a removed, reordered or altered entry is refused with
:class:`LedgerError` naming the first bad one.

Stores implement :class:`LedgerStore`: :class:`SQLiteLedgerStore` (one file, no server; the
default), :class:`PostgresLedgerStore` (a team ledger on a PostgreSQL server; ``pip install
'renyi[postgres]'``) and :class:`MemoryLedgerStore` (tests, throw-away budgets). Each store
can hold several named ledgers (``path#name``, ``postgresql://...#name``; ``default``
otherwise). :mod:`renyi.ledger.service` serves a store over HTTP to a team
(``renyi ledger serve``) and :mod:`renyi.ledger.client` spends against it from other machines.
"""

from __future__ import annotations

import os

from renyi.ledger._base import (
    CHAIN_HMAC,
    CHAIN_SHA256,
    DEFAULT_NAME,
    IdempotencyConflictError,
    LedgerEntry,
    LedgerError,
    LedgerNotFoundError,
    LedgerStore,
    MemoryLedgerStore,
    TokenRecord,
    Transaction,
    entry_digest,
    genesis_digest,
    new_ledger_id,
    now_iso,
    state_digest,
)
from renyi.ledger.postgres import PostgresLedgerStore, is_postgres_url
from renyi.ledger.sqlite import SQLiteLedgerStore

__all__ = [
    "CHAIN_HMAC",
    "CHAIN_SHA256",
    "DEFAULT_NAME",
    "IdempotencyConflictError",
    "LedgerEntry",
    "LedgerError",
    "LedgerNotFoundError",
    "LedgerStore",
    "MemoryLedgerStore",
    "PostgresLedgerStore",
    "SQLiteLedgerStore",
    "TokenRecord",
    "Transaction",
    "entry_digest",
    "genesis_digest",
    "is_remote_url",
    "new_ledger_id",
    "now_iso",
    "open_store",
    "state_digest",
]


def is_remote_url(text: object) -> bool:
    """Whether ``text`` names a ledger service (``http://`` or ``https://``)."""
    return isinstance(text, str) and text.startswith(("http://", "https://"))


def open_store(
    ledger: str | os.PathLike[str] | LedgerStore | None, *, create: bool = True
) -> LedgerStore:
    """A store from a path (SQLite), a ``postgresql://`` URL, a store, or None (in memory).

    A string path may end in ``#name`` to pick one ledger of the file (when no file has the
    whole string as its name); a URL likewise.
    """
    if ledger is None:
        return MemoryLedgerStore()
    if is_remote_url(ledger):
        raise LedgerError(
            f"{ledger!r} is a ledger service: use Budget.connect(url, token=...) to spend "
            "against it"
        )
    if isinstance(ledger, str) and is_postgres_url(ledger):
        return PostgresLedgerStore(ledger, create=create)
    if isinstance(ledger, str) and "#" in ledger and not os.path.exists(ledger):
        path, name = ledger.rsplit("#", 1)
        return SQLiteLedgerStore(path, ledger=name, create=create)
    if isinstance(ledger, str | os.PathLike):
        return SQLiteLedgerStore(ledger, create=create)
    return ledger
