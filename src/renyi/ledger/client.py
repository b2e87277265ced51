"""Spending against a ledger service from another machine: :class:`RemoteBudget`.

``Budget.connect("http://ledger.internal:8000#census", token=...)`` returns a
:class:`RemoteBudget`. Its :meth:`~RemoteBudget.spend` is the same gate as a local budget's:
it returns only after the service has committed the entry, and raises — so the caller
releases nothing — when the service refuses (:class:`~renyi.errors.BudgetExceededError`,
HTTP 409) or when it cannot be reached, times out or answers anything else
(:class:`~renyi.ledger.LedgerError`). Every spend carries an idempotency key: a request whose
answer was lost (a dropped connection, a server killed after its commit) is retried with the
same key until ``timeout`` and is never charged twice.

Standard library only (``http.client``): a training job needs no extra package to spend.

Example (against a running ``renyi ledger serve``; not run here)::

    budget = Budget.connect("http://127.0.0.1:8000#census", token=os.environ["TOKEN"])
    with budget.release(LaplaceEvent(scale=10.0), label="count by region"):
        publish(noisy_counts)
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlsplit

from renyi._validation import check_int, fail
from renyi.analysis.events import Event, from_dict
from renyi.errors import BudgetExceededError
from renyi.ledger._base import (
    DEFAULT_NAME,
    SPEND_COUNT_RANGE,
    LedgerError,
    LedgerNotFoundError,
    check_name,
    is_spend_count,
)

__all__ = ["LedgerAccessError", "RemoteBudget", "budget_hook"]

_RETRY_STATUS = (502, 503, 504)


class LedgerAccessError(LedgerError):
    """The ledger service refused the token (HTTP 401: unknown; 403: role or scope)."""


class RemoteBudget:
    """A budget held by a ledger service. See the module docstring and ``Budget.connect``.

    Args:
        url: ``http[s]://host[:port][/prefix]#name``; ``name`` defaults to ``default``.
        token: the service token (default ``$RENYI_LEDGER_TOKEN``).
        expect_id: refuse a ledger whose id is not this one.
        timeout: seconds a call may keep retrying an unreachable service before it raises.
        job, planned_steps: recorded with each spend (``metadata``) so the dashboard can
            show the job's progress.
        planned_charges: how many spends the job will make when it is not one per step
            (a sampler that charges once per epoch makes ``ceil(steps / steps_per_epoch)``);
            the dashboard's progress counts spends against it.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        expect_id: str | None = None,
        timeout: float = 30.0,
        job: str | None = None,
        planned_steps: int | None = None,
        planned_charges: int | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise fail("url", url, "http[s]://host[:port][#ledger name]")
        self.name = check_name(parts.fragment or DEFAULT_NAME)
        self.url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}#{self.name}"
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._base = f"{parts.path.rstrip('/')}/api/v1/ledgers/{quote(self.name)}"
        token = token or os.environ.get("RENYI_LEDGER_TOKEN")
        if not token:
            raise fail("token", None, "a token from `renyi ledger token` (or $RENYI_LEDGER_TOKEN)")
        self._auth = {"Authorization": f"Bearer {token}"}
        self._timeout = float(timeout)
        self._local = threading.local()
        self.job = job
        self.planned_steps = (
            None if planned_steps is None else check_int("planned_steps", planned_steps, 1)
        )
        self.planned_charges = (
            None if planned_charges is None else check_int("planned_charges", planned_charges, 1)
        )
        self._steps = 0
        self.retries = 0  # requests sent again after a lost answer (same idempotency key)
        info = self.status()
        self.kind: str = str(info.get("kind"))
        self.ledger_id: str = str(info.get("id"))
        if expect_id is not None and info.get("id") != expect_id:
            raise LedgerError(
                f"{self.url} is ledger {info.get('id')}, not the expected {expect_id}; "
                "refusing to use it"
            )

    def __repr__(self) -> str:
        return f"RemoteBudget({self.url!r})"

    # ------------------------------------------------------------------ transport
    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=min(self._timeout, 30.0))
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        """Close this thread's connection (reopened on the next call)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One API call, retried (same body, so the same idempotency key) while the service
        cannot be reached or answers 502/503/504, until ``timeout``."""
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self._auth)
        if data is not None:
            headers["Content-Type"] = "application/json"
        deadline = time.monotonic() + self._timeout
        delay = 0.05
        while True:
            try:
                conn = self._conn()
                conn.request(method, self._base + path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                status = resp.status
                if status not in _RETRY_STATUS:
                    try:
                        payload = json.loads(raw) if raw else {}
                    except ValueError:
                        payload = {"detail": raw[:200].decode("utf-8", "replace")}
                    return status, payload
                problem = f"HTTP {status}"
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                problem = f"{type(exc).__name__}: {exc}"
            self.retries += 1
            if time.monotonic() + delay > deadline:
                raise LedgerError(
                    f"cannot reach the ledger service at {self.url} ({problem}) for "
                    f"{self._timeout:g} s; nothing may be released (a spend's charge may or may "
                    "not be recorded: retrying it with the same idempotency key charges it once)"
                )
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)

    def _check(self, status: int, payload: Any) -> Any:
        detail = payload.get("detail") if isinstance(payload, dict) else None
        where = f"ledger service {self.url}"
        if status == 200 or status == 201:
            return payload
        if status == 409 and isinstance(payload, dict) and payload.get("error") == "refused":
            raise BudgetExceededError(str(detail))
        if status in (401, 403):
            raise LedgerAccessError(f"{where}: HTTP {status}: {detail}")
        if status == 404:
            raise LedgerNotFoundError(f"{where}: {detail}")
        raise LedgerError(f"{where}: HTTP {status}: {detail}")

    # ------------------------------------------------------------------ the budget
    def spend(
        self,
        event: Event,
        count: int = 1,
        *,
        label: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """Charge the service for ``count`` runs of ``event``; release only after it returns.

        Returns a :class:`renyi.budget.Receipt`. Raises BudgetExceededError (refused, nothing
        charged) or LedgerError (unreachable or any other answer; nothing may be released).
        """
        from renyi.budget import Receipt, _check_metadata

        if not isinstance(event, Event):
            raise fail("event", event, "a renyi.analysis.events.Event")
        if not is_spend_count(count):
            # the service's range (an empty spend records nothing): refused here, before any
            # request, with the same words as a local mistake instead of the service's 422
            raise fail("count", count, f"{SPEND_COUNT_RANGE} (runs charged by one spend)")
        meta = _check_metadata(metadata)
        if self.job is not None:
            meta.setdefault("job", self.job)
            meta.setdefault("step", self._steps + 1)
            if self.planned_steps is not None:
                meta.setdefault("planned_steps", self.planned_steps)
            if self.planned_charges is not None:
                meta.setdefault("planned_charges", self.planned_charges)
        body = {
            "event": event.to_dict(),
            "count": count,
            "label": label,
            "metadata": meta,
            "idempotency_key": idempotency_key or uuid.uuid4().hex,
        }
        out = self._check(*self._request("POST", "/spend", body))
        r = out["receipt"]
        self._steps += 1
        return Receipt(
            index=int(r["index"]),
            event=event,
            count=int(r["count"]),
            cost=dict(r["cost"]),
            state_after=dict(r["state_after"]),
            label=r.get("label"),
            metadata=dict(r.get("metadata") or {}),
            time=str(r.get("time", "")),
            hash=str(r.get("hash", "")),
            replayed=bool(r.get("replayed", False)),
        )

    @contextmanager
    def release(
        self,
        event: Event,
        count: int = 1,
        *,
        label: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Iterator[Any]:
        """Charges on entry (refusing before the body runs), then yields the receipt."""
        yield self.spend(event, count, label=label, metadata=metadata)

    def status(self) -> dict[str, Any]:
        """The ledger as the service reports it (``GET /api/v1/ledgers/{name}``)."""
        return dict(self._check(*self._request("GET", "")))

    def verify(self) -> bool:
        """Ask the service to re-verify the whole chain; True, or raises LedgerError."""
        info = self._check(*self._request("GET", "?verify=full"))
        if not info.get("verified"):
            raise LedgerError(f"{self.url}: {info.get('verification_error')}")
        return True

    def remaining(self) -> float:
        """ε (or ρ for zCDP) left, as the service reports it."""
        info = self.status()
        return float(info["rho_remaining" if self.kind == "zcdp" else "epsilon_remaining"])

    def spent_epsilon(self) -> float:
        return float(self.status()["epsilon_spent"])

    def max_count(self, event: Event) -> int:
        """How many more runs of ``event`` fit now."""
        path = "/fits?event=" + quote(json.dumps(event.to_dict()))
        return int(self._check(*self._request("GET", path))["count"])

    def can_spend(self, event: Event, count: int = 1) -> bool:
        return self.max_count(event) >= count

    def entries(self, start: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        """Recorded releases (JSON objects as the API returns them)."""
        out = self._check(*self._request("GET", f"/entries?start={start}&limit={limit}"))
        return list(out["entries"])

    def events(self) -> list[tuple[Event, int]]:
        return [(from_dict(e["event"]), int(e["count"])) for e in self.entries()]

    def __enter__(self) -> RemoteBudget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def budget_hook(
    ledger: Any,
    *,
    token: str | None = None,
    planned_steps: int | None = None,
    planned_charges: int | None = None,
    job: str | None = None,
) -> Any:
    """What ``make_private(..., ledger=)`` / ``PrivacyEngine(ledger=)`` charge each step.

    ``ledger``: a ledger service URL (``http[s]://...#name``: a :class:`RemoteBudget`), a
    SQLite path or ``postgresql://`` URL (an existing budget, opened and verified; key from
    ``$RENYI_LEDGER_KEY``), or anything with a ``spend(event)`` method (a ``Budget``).
    ``job`` defaults to ``<host>-<pid>`` so the dashboard can follow the run's progress.
    """
    if ledger is None:
        return None
    if hasattr(ledger, "spend"):
        return ledger
    from renyi.ledger import is_remote_url

    if is_remote_url(ledger):
        return RemoteBudget(
            ledger,
            token=token,
            planned_steps=planned_steps,
            planned_charges=planned_charges,
            job=job or f"{socket.gethostname()}-{os.getpid()}",
        )
    from renyi.budget import Budget

    return Budget.open(ledger, key=os.environ.get("RENYI_LEDGER_KEY") or None)
