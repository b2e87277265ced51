"""What every ledger store shares: entries, the hash chain, the store interface, memory store.

The hash chain: entry *i* carries ``hash_i = H(canonical(entry_i) ‖ hash_{i-1})`` where
``hash_{-1}`` (the *genesis*) is ``H(canonical(budget specification))``. ``H`` is SHA-256,
or HMAC-SHA-256 under the operator's key when the ledger is keyed. Editing, removing,
inserting or reordering any entry, or editing the budget it is spent against, breaks every
hash from that point on; the first broken link names the first bad entry. Without a key
this is tamper *evidence* (a careless edit or a bit flip is caught); with a key it is tamper
*proof* against anyone who can rewrite the file but does not hold the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from renyi.errors import RenyiError

__all__ = [
    "CHAIN_HMAC",
    "CHAIN_SHA256",
    "LedgerEntry",
    "LedgerError",
    "LedgerNotFoundError",
    "LedgerStore",
    "MemoryLedgerStore",
    "Transaction",
    "dumps",
    "entry_digest",
    "genesis_digest",
    "now_iso",
]

MAGIC = "renyi-ledger"
SCHEMA_VERSION = 2
CHAIN_SHA256 = "sha256"
CHAIN_HMAC = "hmac-sha256"

T = TypeVar("T")


class LedgerError(RenyiError):
    """The ledger is missing, unreadable, corrupted, tampered with, foreign or not writable."""


class LedgerNotFoundError(LedgerError):
    """No ledger at the given path or under the given name (a usage mistake, exit code 2)."""


def dumps(obj: Any) -> str:
    """The canonical JSON text of ``obj`` (sorted keys, no NaN): what is stored and hashed."""
    return json.dumps(obj, sort_keys=True, allow_nan=False, separators=(",", ":"))


def loads(text: str, what: str) -> Any:
    """Parse stored JSON, turning a decoding error into a LedgerError naming ``what``."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"{what} is not valid JSON (corrupted ledger): {exc}") from None


@dataclass(frozen=True)
class LedgerEntry:
    """One committed release."""

    index: int
    time: str  # ISO 8601, UTC
    event: dict[str, Any]  # Event.to_dict()
    count: int
    cost: dict[str, Any]  # what this release cost, in the budget's currency
    state_after: dict[str, Any]  # budget summary after this release
    label: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    hash: str = ""  # link of the hash chain (hex digest); see the module docstring


def entry_from_row(r: tuple[Any, ...], where: str) -> LedgerEntry:
    """A stored row (index, time, event, count, cost, state_after, label, metadata, hash)."""
    what = f"{where}: entry #{r[0]}"
    return LedgerEntry(
        index=int(r[0]),
        time=str(r[1]),
        event=loads(r[2], f"{what} (event)"),
        count=int(r[3]),
        cost=loads(r[4], f"{what} (cost)"),
        state_after=loads(r[5], f"{what} (state_after)"),
        label=r[6],
        metadata=loads(r[7], f"{what} (metadata)"),
        hash=str(r[8]),
    )


def _digest(key: bytes | None, text: str) -> str:
    data = text.encode("utf-8")
    if key is None:
        return hashlib.sha256(data).hexdigest()
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def genesis_digest(spec: dict[str, Any], key: bytes | None) -> str:
    """The link before the first entry: a digest of the budget specification."""
    return _digest(key, "renyi-ledger genesis\n" + dumps(spec))


def entry_digest(entry: LedgerEntry, prev: str, key: bytes | None) -> str:
    """The chain link of ``entry`` following the link ``prev``."""
    body = {
        "index": entry.index,
        "time": entry.time,
        "event": entry.event,
        "count": entry.count,
        "cost": entry.cost,
        "state_after": entry.state_after,
        "label": entry.label,
        "metadata": entry.metadata,
        "prev": prev,
    }
    return _digest(key, "renyi-ledger entry\n" + dumps(body))


def same_digest(a: str, b: str) -> bool:
    """Constant-time comparison of two hex digests."""
    return hmac.compare_digest(a.encode("ascii", "replace"), b.encode("ascii", "replace"))


class Transaction(Protocol):
    """What a store exposes inside one transaction (exclusive for writes)."""

    def state(self) -> dict[str, Any] | None: ...
    def entries(self, start: int = 0) -> list[LedgerEntry]: ...
    def count_entries(self) -> int: ...
    def append(self, entry: LedgerEntry, new_state: dict[str, Any]) -> None: ...


class LedgerStore(Protocol):
    """Persistence for a budget: its specification, its hash-chained entries, its state.

    * ``initialise(spec, state)`` records the budget and its initial state atomically (a
      store never holds half of a ledger); on a store that already holds ``spec`` it changes
      nothing and returns False, and it refuses a different budget. Returns True if created.
    * ``read(fn)`` runs ``fn`` on a consistent snapshot (no writes).
    * ``transaction(fn)`` runs ``fn`` with exclusive write access, committing what it
      appended if it returns and discarding everything if it raises; serialisation failures
      are retried inside the store.
    * ``describe()`` names the store in messages (a path, or a URL without its password).

    Every failure of the medium (unreadable, read-only, full, corrupted, unreachable) is
    raised as :class:`LedgerError`.
    """

    def initialise(self, spec: dict[str, Any], state: dict[str, Any]) -> bool: ...
    def spec(self) -> dict[str, Any] | None: ...
    def entries(self) -> list[LedgerEntry]: ...
    def read(self, fn: Callable[[Transaction], T]) -> T: ...
    def transaction(self, fn: Callable[[Transaction], T]) -> T: ...
    def describe(self) -> str: ...


# ----------------------------------------------------------------------------- memory


class _MemoryTxn:
    def __init__(self, store: MemoryLedgerStore) -> None:
        self._store = store
        self.pending: list[tuple[LedgerEntry, dict[str, Any]]] = []

    def state(self) -> dict[str, Any] | None:
        return self.pending[-1][1] if self.pending else self._store._state

    def entries(self, start: int = 0) -> list[LedgerEntry]:
        return (self._store._entries + [e for e, _ in self.pending])[start:]

    def count_entries(self) -> int:
        return len(self._store._entries) + len(self.pending)

    def append(self, entry: LedgerEntry, new_state: dict[str, Any]) -> None:
        self.pending.append((entry, new_state))


class MemoryLedgerStore:
    """An in-process store (thread-safe); nothing survives the process."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._spec: dict[str, Any] | None = None
        self._entries: list[LedgerEntry] = []
        self._state: dict[str, Any] | None = None

    def describe(self) -> str:
        return "in-memory ledger"

    def initialise(self, spec: dict[str, Any], state: dict[str, Any]) -> bool:
        with self._lock:
            if self._spec is not None:
                if self._spec != spec:
                    raise LedgerError("this store already holds a different budget")
                return False
            self._spec = dict(spec)
            self._state = dict(state)
            return True

    def spec(self) -> dict[str, Any] | None:
        return None if self._spec is None else dict(self._spec)

    def entries(self) -> list[LedgerEntry]:
        with self._lock:
            return list(self._entries)

    def read(self, fn: Callable[[Transaction], T]) -> T:
        with self._lock:
            return fn(_MemoryTxn(self))

    def transaction(self, fn: Callable[[Transaction], T]) -> T:
        with self._lock:
            txn = _MemoryTxn(self)
            out = fn(txn)
            for entry, state in txn.pending:
                self._entries.append(entry)
                self._state = state
            return out


def now_iso() -> str:
    """Current UTC time, ISO 8601 with microseconds."""
    return datetime.now(UTC).isoformat(timespec="microseconds")
