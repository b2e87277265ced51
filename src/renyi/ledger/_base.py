"""What every ledger store shares: entries, the hash chain, the store interface, memory store.

The hash chain: entry *i* carries ``hash_i = H(canonical(entry_i) ‖ hash_{i-1})`` where
``hash_{-1}`` (the *genesis*) is ``H(canonical(budget specification, ledger id, name))``.
``H`` is SHA-256, or HMAC-SHA-256 under the operator's key when the ledger is keyed. The
ledger id is a random 128-bit value drawn when the ledger is created: it binds the chain to
one ledger, so entries cannot be moved between two ledgers with the same budget and key.
The *state row* (entry count, chain head, spent total, id) carries a tag
``H(canonical(state))`` under the same key, checked against the verified chain.

Editing, removing, inserting or reordering any entry, or editing the budget it is spent
against, breaks every hash from that point on; the first broken link names the first bad
entry. What each kind of ledger detects (docs/budget.md, "What a ledger can detect"):

* **unkeyed** (SHA-256): every accidental change (a bit flip, a careless edit of one row);
  *not* a deliberate rewrite, since anyone can recompute every hash and tag.
* **keyed** (HMAC): any rewrite by someone without the key — an edited, deleted, inserted or
  reordered entry, tail truncation with a rewritten state row, entries moved between
  ledgers; with ``expect_id`` also a whole ledger swapped for another made with the same key.
  *Not* a rollback of the whole store to an older genuine copy of itself (no file can tell
  its past from its present): keep the chain head or the entry count elsewhere for that.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from renyi.errors import RenyiError

__all__ = [
    "CHAIN_HMAC",
    "CHAIN_SHA256",
    "IdempotencyConflictError",
    "LedgerEntry",
    "LedgerError",
    "LedgerNotFoundError",
    "LedgerStore",
    "MemoryLedgerStore",
    "TokenRecord",
    "Transaction",
    "describe_event",
    "dumps",
    "entry_digest",
    "genesis_digest",
    "new_ledger_id",
    "now_iso",
    "state_digest",
]

MAGIC = "renyi-ledger"
SCHEMA_VERSION = 3
DEFAULT_NAME = "default"
CHAIN_SHA256 = "sha256"
CHAIN_HMAC = "hmac-sha256"

T = TypeVar("T")


class LedgerError(RenyiError):
    """The ledger is missing, unreadable, corrupted, tampered with, foreign or not writable."""


class LedgerNotFoundError(LedgerError):
    """No ledger at the given path or under the given name (a usage mistake, exit code 2)."""


class IdempotencyConflictError(LedgerError):
    """An idempotency key already charged a *different* release (event, count or label)."""


def dumps(obj: Any) -> str:
    """The canonical JSON text of ``obj`` (sorted keys, no NaN): what is stored and hashed."""
    return json.dumps(obj, sort_keys=True, allow_nan=False, separators=(",", ":"))


def loads(text: str, what: str) -> Any:
    """Parse stored JSON, turning a decoding error into a LedgerError naming ``what``."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise LedgerError(f"{what} is not valid JSON (corrupted ledger): {exc}") from None


def loads_object(text: str, what: str) -> dict[str, Any]:
    """Stored JSON that must be an object (a state row, a budget)."""
    value = loads(text, what)
    if not isinstance(value, dict):
        raise LedgerError(f"{what} is not a JSON object (corrupted ledger)")
    return value


def new_ledger_id() -> str:
    """A fresh ledger id: 128 random bits from the OS, as 32 hex digits."""
    return secrets.token_hex(16)


def check_name(name: str) -> str:
    """A ledger name: 1-64 characters of letters, digits and ``._@-`` (safe in URLs)."""
    import re

    from renyi._validation import fail

    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}", name):
        raise fail(
            "ledger name", name, "1-64 letters, digits or '._@-', starting with a letter or digit"
        )
    return name


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
    what = f"{where}: entry #{r[0]!r}"
    try:
        if not all(isinstance(r[i], int) for i in (0, 3)) or not isinstance(r[8], str):
            raise TypeError("a column holds a value of the wrong type")
        if r[6] is not None and not isinstance(r[6], str):
            raise TypeError("the label is not text")
        return LedgerEntry(
            index=int(r[0]),
            time=str(r[1]),
            event=loads_object(r[2], f"{what} (event)"),
            count=int(r[3]),
            cost=loads_object(r[4], f"{what} (cost)"),
            state_after=loads_object(r[5], f"{what} (state_after)"),
            label=r[6],
            metadata=loads_object(r[7], f"{what} (metadata)"),
            hash=r[8],
        )
    except (TypeError, ValueError, IndexError) as exc:
        raise LedgerError(f"{what} is unreadable (corrupted ledger): {exc}") from None


def _digest(key: bytes | None, text: str) -> str:
    data = text.encode("utf-8")
    if key is None:
        return hashlib.sha256(data).hexdigest()
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def genesis_digest(
    spec: dict[str, Any], key: bytes | None, ledger_id: str, name: str = DEFAULT_NAME
) -> str:
    """The link before the first entry: a digest of the budget, the ledger's id and name."""
    body = {"budget": spec, "id": ledger_id, "name": name}
    return _digest(key, "renyi-ledger genesis v3\n" + dumps(body))


def state_digest(state: dict[str, Any], key: bytes | None) -> str:
    """The tag of a state row: a digest of everything in it but the tag."""
    body = {k: v for k, v in state.items() if k != "tag"}
    return _digest(key, "renyi-ledger state\n" + dumps(body))


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
    def find(self, idempotency_key: str) -> LedgerEntry | None: ...
    def append(
        self, entry: LedgerEntry, new_state: dict[str, Any], idempotency_key: str | None = None
    ) -> None: ...


@dataclass(frozen=True)
class TokenRecord:
    """An access token of the ledger service, as stored: its secret only as a SHA-256 hash."""

    id: str
    hash: str  # hex SHA-256 of the secret part of the token
    name: str  # who holds it (a person or a job), shown in the releases table
    role: str  # "read", "spend" or "admin"
    scope: str  # a ledger name, or "*" for every ledger of the store
    created: str


class LedgerStore(Protocol):
    """Persistence for budgets: their specifications, hash-chained entries and states.

    A store holds one or more named ledgers (``name``; a SQLite file's ledger is
    ``"default"`` unless named); a store object speaks for one of them, and ``named(other)``
    gives the same store speaking for another.

    * ``initialise(spec, state, ledger_id)`` records the budget, its id and its initial state
      atomically (a store never holds half of a ledger); on a store that already holds
      ``spec`` it changes nothing and returns False, and it refuses a different budget.
      Returns True if created.
    * ``info()`` is ``{"spec", "id", "name"}`` of the ledger, or None if there is none.
    * ``read(fn)`` runs ``fn`` on a consistent snapshot (no writes).
    * ``transaction(fn)`` runs ``fn`` with exclusive write access, committing what it
      appended if it returns and discarding everything if it raises; serialisation failures
      are retried inside the store.
    * ``names()`` lists the ledgers of the store; tokens and refusals are store-wide records
      of the ledger service (not part of any chain).
    * ``describe()`` names the store in messages (a path, or a URL without its password).

    Every failure of the medium (unreadable, read-only, full, corrupted, unreachable) is
    raised as :class:`LedgerError`.
    """

    name: str

    def initialise(self, spec: dict[str, Any], state: dict[str, Any], ledger_id: str) -> bool: ...
    def info(self) -> dict[str, Any] | None: ...
    def spec(self) -> dict[str, Any] | None: ...
    def entries(self) -> list[LedgerEntry]: ...
    def read(self, fn: Callable[[Transaction], T]) -> T: ...
    def transaction(self, fn: Callable[[Transaction], T]) -> T: ...
    def describe(self) -> str: ...
    def names(self) -> list[str]: ...
    def named(self, name: str) -> LedgerStore: ...
    def add_token(self, record: TokenRecord) -> None: ...
    def get_token(self, token_id: str) -> TokenRecord | None: ...
    def list_tokens(self) -> list[TokenRecord]: ...
    def delete_token(self, token_id: str) -> bool: ...
    def log_refusal(
        self, who: str | None, event: dict[str, Any], count: int, detail: str
    ) -> None: ...
    def refusals(self, limit: int = 100) -> list[dict[str, Any]]: ...


# ----------------------------------------------------------------------------- memory


class _MemoryLedger:
    def __init__(self, spec: dict[str, Any], state: dict[str, Any], ledger_id: str) -> None:
        self.spec = dict(spec)
        self.id = ledger_id
        self.state = dict(state)
        self.entries: list[LedgerEntry] = []
        self.idem: dict[str, int] = {}
        self.refusals: list[dict[str, Any]] = []


class _MemoryTxn:
    def __init__(self, ledger: _MemoryLedger | None) -> None:
        self._ledger = ledger
        self.pending: list[tuple[LedgerEntry, dict[str, Any], str | None]] = []

    def state(self) -> dict[str, Any] | None:
        if self.pending:
            return self.pending[-1][1]
        return None if self._ledger is None else self._ledger.state

    def entries(self, start: int = 0) -> list[LedgerEntry]:
        held = [] if self._ledger is None else self._ledger.entries
        return (held + [e for e, _, _ in self.pending])[start:]

    def count_entries(self) -> int:
        return len(self.entries())

    def find(self, idempotency_key: str) -> LedgerEntry | None:
        for entry, _, key in self.pending:
            if key == idempotency_key:
                return entry
        if self._ledger is not None and idempotency_key in self._ledger.idem:
            return self._ledger.entries[self._ledger.idem[idempotency_key]]
        return None

    def append(
        self, entry: LedgerEntry, new_state: dict[str, Any], idempotency_key: str | None = None
    ) -> None:
        if self._ledger is None:
            raise LedgerError("in-memory ledger: no budget to record against")
        self.pending.append((entry, new_state, idempotency_key))


class MemoryLedgerStore:
    """An in-process store (thread-safe); nothing survives the process."""

    def __init__(self, name: str = DEFAULT_NAME) -> None:
        self.name = check_name(name)
        self._lock = threading.RLock()
        self._ledgers: dict[str, _MemoryLedger] = {}
        self._tokens: dict[str, TokenRecord] = {}

    def describe(self) -> str:
        return "in-memory ledger" + ("" if self.name == DEFAULT_NAME else f" {self.name!r}")

    def named(self, name: str) -> MemoryLedgerStore:
        other = MemoryLedgerStore(name)
        other._lock, other._ledgers, other._tokens = self._lock, self._ledgers, self._tokens
        return other

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._ledgers)

    def initialise(self, spec: dict[str, Any], state: dict[str, Any], ledger_id: str) -> bool:
        with self._lock:
            held = self._ledgers.get(self.name)
            if held is not None:
                if held.spec != spec:
                    raise LedgerError("this store already holds a different budget")
                return False
            self._ledgers[self.name] = _MemoryLedger(spec, state, ledger_id)
            return True

    def info(self) -> dict[str, Any] | None:
        with self._lock:
            held = self._ledgers.get(self.name)
            if held is None:
                return None
            return {"spec": dict(held.spec), "id": held.id, "name": self.name}

    def spec(self) -> dict[str, Any] | None:
        info = self.info()
        return None if info is None else info["spec"]

    def entries(self) -> list[LedgerEntry]:
        return self.read(lambda t: t.entries())

    def read(self, fn: Callable[[Transaction], T]) -> T:
        with self._lock:
            return fn(_MemoryTxn(self._ledgers.get(self.name)))

    def transaction(self, fn: Callable[[Transaction], T]) -> T:
        with self._lock:
            ledger = self._ledgers.get(self.name)
            txn = _MemoryTxn(ledger)
            out = fn(txn)
            for entry, state, key in txn.pending:
                assert ledger is not None
                if key is not None:
                    ledger.idem[key] = len(ledger.entries)
                ledger.entries.append(entry)
                ledger.state = state
            return out

    def add_token(self, record: TokenRecord) -> None:
        with self._lock:
            self._tokens[record.id] = record

    def get_token(self, token_id: str) -> TokenRecord | None:
        with self._lock:
            return self._tokens.get(token_id)

    def list_tokens(self) -> list[TokenRecord]:
        with self._lock:
            return sorted(self._tokens.values(), key=lambda r: (r.created, r.id))

    def delete_token(self, token_id: str) -> bool:
        with self._lock:
            return self._tokens.pop(token_id, None) is not None

    def log_refusal(self, who: str | None, event: dict[str, Any], count: int, detail: str) -> None:
        with self._lock:
            held = self._ledgers.get(self.name)
            if held is not None:
                row = {"time": now_iso(), "who": who, "event": event, "count": count}
                held.refusals.append({**row, "detail": detail})

    def refusals(self, limit: int = 100) -> list[dict[str, Any]]:
        with self._lock:
            held = self._ledgers.get(self.name)
            return [] if held is None else list(reversed(held.refusals[-limit:]))


def describe_event(event: dict[str, Any]) -> str:
    """A short readable form of a stored event: gaussian(σ=1.1) sampled at q=0.01, ..."""
    kind = str(event.get("type", "?"))
    if kind == "poisson_sampled" and isinstance(event.get("event"), dict):
        return f"{describe_event(event['event'])} sampled at q={event.get('sampling_rate'):g}"
    if kind == "self_composed" and isinstance(event.get("event"), dict):
        return f"{event.get('count')} x {describe_event(event['event'])}"
    params = [
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in event.items()
        if k not in ("type", "neighbouring") and isinstance(v, int | float | str)
    ]
    return f"{kind}({', '.join(params)})"


#: what one spend of the ledger service may charge: ``count`` runs, ``1 <= count <= 1e9``
SPEND_COUNT_RANGE = "an integer in [1, 1e9]"


def is_spend_count(count: object) -> bool:
    """Whether ``count`` is a spend's count the service takes (an int, not a bool, in range)."""
    return isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= 10**9


def now_iso() -> str:
    """Current UTC time, ISO 8601 with microseconds."""
    return datetime.now(UTC).isoformat(timespec="microseconds")
