"""Access tokens of the ledger service: roles, scopes, and secrets stored only as hashes.

A token reads ``rlt_<id>_<secret>``: ``id`` (12 hex digits) finds its record, ``secret``
(43 URL-safe characters, 256 random bits from the OS) proves it. The store keeps only
``SHA-256(secret)`` (a stolen store gives no usable token) and compares in constant time.

Roles, each including the ones before it:

* ``read``: see ledgers (API ``GET`` and the dashboard);
* ``spend``: charge releases (``POST /api/v1/ledgers/{name}/spend``);
* ``admin``: create new ledgers. Nobody can raise a budget: a ledger's limit is part of its
  hash chain, and the service has no call that changes it.

A token is revoked by deleting its record (:func:`revoke_token`, ``renyi ledger revoke``):
the service looks every request's token up in the store, so the next request with it (or a
dashboard session opened with it) gets 401. :func:`list_tokens` shows who holds which role;
never a secret, which the store does not have.

A token's *scope* is one ledger name (it then also covers that ledger's period buckets
``name@period``) or ``*`` for every ledger of the store.

Example:
    >>> from renyi.ledger import MemoryLedgerStore
    >>> store = MemoryLedgerStore()
    >>> token = create_token(store, name="job-42", role="spend", scope="census")
    >>> rec = check_token(store, token)
    >>> rec.name, allows(rec, "census@2026-11", "spend"), allows(rec, "census", "admin")
    ('job-42', True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from renyi._validation import fail
from renyi.ledger._base import LedgerStore, TokenRecord, check_name, now_iso

__all__ = ["ROLES", "allows", "check_token", "create_token", "list_tokens", "revoke_token"]

ROLES = ("read", "spend", "admin")
_TOKEN = re.compile(r"rlt_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
_TOKEN_ID = re.compile(r"[0-9a-f]{12}")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def create_token(store: LedgerStore, *, name: str, role: str, scope: str = "*") -> str:
    """Record a new token and return it (the only time its secret exists in clear)."""
    if not isinstance(name, str) or not 1 <= len(name) <= 100 or not name.isprintable():
        raise fail("name", name, "1-100 printable characters naming a person or a job")
    if role not in ROLES:
        raise fail("role", role, f"one of {', '.join(ROLES)}")
    if scope != "*":
        check_name(scope)
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    store.add_token(TokenRecord(token_id, _hash(secret), name, role, scope, now_iso()))
    return f"rlt_{token_id}_{secret}"


def check_token(store: LedgerStore, token: str | None) -> TokenRecord | None:
    """The record of a valid token, or None (malformed, unknown or wrong secret)."""
    match = _TOKEN.fullmatch(token or "")
    if match is None:
        return None
    record = store.get_token(match.group(1))
    want = record.hash if record is not None else "0" * 64
    ok = hmac.compare_digest(_hash(match.group(2)), want)
    return record if ok and record is not None else None


def allows(record: TokenRecord, ledger: str | None, role: str) -> bool:
    """Whether ``record`` may act with ``role`` on ``ledger`` (None: no particular ledger)."""
    if ROLES.index(record.role) < ROLES.index(role):
        return False
    if record.scope == "*" or ledger is None:
        return True
    return ledger == record.scope or ledger.split("@", 1)[0] == record.scope


def list_tokens(store: LedgerStore) -> list[TokenRecord]:
    """The store's tokens, oldest first (ids, holders, roles, scopes; secrets are not kept)."""
    return store.list_tokens()


def revoke_token(store: LedgerStore, token: str) -> TokenRecord:
    """Revoke a token given whole (``rlt_<id>_<secret>``) or by its 12-hex-digit id.

    Returns the revoked record; raises our error naming ``token`` when there is no such token
    (nothing is changed then). The service refuses the token from its next request on.
    """
    if not isinstance(token, str):
        raise fail("token", token, "a token rlt_<id>_<secret> or its 12-hex-digit id")
    match = _TOKEN.fullmatch(token)
    token_id = match.group(1) if match else token
    if not _TOKEN_ID.fullmatch(token_id):
        raise fail("token", token, "a token rlt_<id>_<secret> or its 12-hex-digit id")
    record = store.get_token(token_id)
    if record is None or not store.delete_token(token_id):
        raise fail("token", token_id, f"the id of a token of {store.describe()} (none has it)")
    return record
