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
'renyi[postgres]'``) and :class:`MemoryLedgerStore` (tests, throw-away budgets).
"""

from __future__ import annotations

import os

from renyi.ledger._base import (
    CHAIN_HMAC,
    CHAIN_SHA256,
    LedgerEntry,
    LedgerError,
    LedgerNotFoundError,
    LedgerStore,
    MemoryLedgerStore,
    Transaction,
    entry_digest,
    genesis_digest,
    now_iso,
)
from renyi.ledger.postgres import PostgresLedgerStore, is_postgres_url
from renyi.ledger.sqlite import SQLiteLedgerStore

__all__ = [
    "CHAIN_HMAC",
    "CHAIN_SHA256",
    "LedgerEntry",
    "LedgerError",
    "LedgerNotFoundError",
    "LedgerStore",
    "MemoryLedgerStore",
    "PostgresLedgerStore",
    "SQLiteLedgerStore",
    "Transaction",
    "entry_digest",
    "genesis_digest",
    "now_iso",
    "open_store",
]


def open_store(
    ledger: str | os.PathLike[str] | LedgerStore | None, *, create: bool = True
) -> LedgerStore:
    """A store from a path (SQLite), a ``postgresql://`` URL, a store, or None (in memory)."""
    if ledger is None:
        return MemoryLedgerStore()
    if isinstance(ledger, str) and is_postgres_url(ledger):
        return PostgresLedgerStore(ledger, create=create)
    if isinstance(ledger, str | os.PathLike):
        return SQLiteLedgerStore(ledger, create=create)
    return ledger
