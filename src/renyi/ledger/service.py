"""The ledger service: one place where a team's jobs charge their budgets and people look.

``renyi ledger serve LEDGER`` serves every ledger of a store (a SQLite file, or a PostgreSQL
database holding many) over HTTP: a JSON API under ``/api/v1`` for jobs and scripts
(:mod:`renyi.ledger.client`) and server-rendered pages for people (no build step, no
JavaScript). Starlette + uvicorn (``pip install 'renyi[service]'``); docs/ledger_service.md
lists every route, field and status code.

What the service guarantees is what the budget guarantees: a spend is decided and committed
by :meth:`renyi.budget.Budget.spend` in one store transaction (so several service processes,
or a service and local jobs, can share a PostgreSQL store), and answered only after the
commit. Retried spends carry an idempotency key and are charged once.

Safe defaults: it listens on 127.0.0.1 unless told otherwise and speaks plain HTTP — put a
TLS-terminating reverse proxy in front of it for any other machine; request bodies above
64 KiB are refused (413); clients never see a traceback (500 with a fixed message; details
go to the server's log); and it refuses to start when any ledger of the store fails
verification. Every request but ``/api/v1/health`` needs a token (roles: read, spend,
admin; :mod:`renyi.ledger.tokens`); the dashboard keeps it in an HttpOnly, SameSite=Strict
cookie after a login form.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote

from renyi.analysis.events import Event, GaussianEvent, LaplaceEvent, PoissonSampledEvent, from_dict
from renyi.budget import Budget
from renyi.errors import BudgetExceededError, RenyiError
from renyi.ledger._base import (
    CHAIN_HMAC,
    SPEND_COUNT_RANGE,
    IdempotencyConflictError,
    LedgerEntry,
    LedgerError,
    LedgerNotFoundError,
    LedgerStore,
    TokenRecord,
    check_name,
    describe_event,
    is_spend_count,
)
from renyi.ledger.tokens import allows, check_token

__all__ = ["MAX_BODY", "LedgerService", "create_app", "serve"]

log = logging.getLogger("renyi.ledger.service")

MAX_BODY = 64 * 1024  # bytes of a request body
COOKIE = "renyi_ledger_token"
_JOB_IDLE_S = 600.0  # a job with no spend for this long is no longer "running"


class ApiError(Exception):
    """An answer other than 200: status, a short error code and a message for the client."""

    def __init__(self, status: int, error: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.extra = status, error, detail, extra


# ----------------------------------------------------------------------------- the service


@dataclass
class _Ledger:
    """What the service keeps for one ledger: the open budget and the verified entries."""

    budget: Budget
    lock: threading.Lock = field(default_factory=threading.Lock)
    entries: list[LedgerEntry] = field(default_factory=list)
    verified_at: str = ""
    error: str | None = None


class LedgerService:
    """Every ledger of ``store``, opened and verified; the operations the routes call.

    Args:
        store: the store (any of its ledgers; the service serves all of them).
        key: the HMAC key of keyed ledgers (``$RENYI_LEDGER_KEY`` for the CLI); new ledgers
            created through the API are keyed with it.

    Raises:
        LedgerError: a ledger fails verification, or is keyed and no key was given.
    """

    def __init__(self, store: LedgerStore, *, key: bytes | str | None = None) -> None:
        self.store = store
        self.key = key
        self._ledgers: dict[str, _Ledger] = {}
        self._lock = threading.Lock()
        for name in store.names():
            self._open(name)  # raises on the first ledger that fails verification

    def check_token(self, token: str) -> TokenRecord | None:
        """The token's record, looked up in the store at every request (no cache: a revoked
        token is refused from its next request on; a lookup costs ~10-40 µs on SQLite)."""
        return check_token(self.store, token)

    # -- ledgers ------------------------------------------------------------------------
    def _open(self, name: str) -> _Ledger:
        with self._lock:
            held = self._ledgers.get(name)
            if held is not None:
                return held
            sub = self.store.named(name)
            info = sub.info()
            if info is None:
                raise LedgerNotFoundError(f"no ledger named {name!r}")
            keyed = info["spec"].get("chain") == CHAIN_HMAC
            if keyed and self.key is None:
                raise LedgerError(
                    f"ledger {name!r} is keyed (HMAC): start the service with its key in "
                    "$RENYI_LEDGER_KEY"
                )
            budget = Budget.open(sub, key=self.key if keyed else None)
            held = _Ledger(budget)
            held.entries = budget.entries()  # a full verification
            held.verified_at = _now()
            self._ledgers[name] = held
            return held

    def ledger(self, name: str, *, create_bucket: bool = False) -> _Ledger:
        """The ledger ``name``; a period bucket ``base@period`` is created from its template
        on first use when ``create_bucket``."""
        try:
            check_name(name)
        except RenyiError:
            raise ApiError(404, "not_found", f"no ledger named {name!r}") from None
        with self._lock:
            held = self._ledgers.get(name)
        if held is not None:
            return held
        try:
            return self._open(name)
        except LedgerNotFoundError:
            pass
        base, _, period = name.partition("@")
        with self._lock:
            template = self._ledgers.get(base)
        if not period or template is None or template.budget.period is None:
            raise ApiError(404, "not_found", f"no ledger named {name!r}")
        if not create_bucket:
            raise ApiError(404, "not_found", f"no spend recorded yet for period {name!r}")
        try:
            with template.lock:
                template.budget.bucket(period)
        except RenyiError as exc:
            if isinstance(exc, LedgerError):
                raise
            raise ApiError(422, "invalid", str(exc)) from None
        return self._open(name)

    def names(self) -> list[str]:
        return sorted(set(self.store.names()) | set(self._ledgers))

    def refresh(self, held: _Ledger, *, full: bool = False) -> None:
        """Bring the kept entries up to date (verified incrementally, or in full)."""
        try:
            if full:
                held.entries = held.budget.entries()
                held.verified_at = _now()
            else:
                held.entries.extend(held.budget.entries_since(len(held.entries)))
            held.error = None
        except LedgerError as exc:
            held.error = str(exc)

    def summary(self, name: str, *, full: bool = False) -> dict[str, Any]:
        """The ``GET /api/v1/ledgers/{name}`` object."""
        held = self.ledger(name)
        with held.lock:
            self.refresh(held, full=full)
            b = held.budget
            out: dict[str, Any] = {
                "name": name,
                "id": b.ledger_id,
                "kind": b.kind,
                "budget": {k: v for k, v in b.spec.items() if k not in ("orders", "limit")},
                "period": b.period,
                "keyed": b.spec.get("chain") == CHAIN_HMAC,
                "verified": held.error is None,
                "verification_error": held.error,
                "verified_in_full_at": held.verified_at,
            }
            if held.error is not None:
                return {**out, "entries": len(held.entries), "head": None}
            st = b.status()
            out.update(
                {
                    "entries": st["releases"],
                    "head": st["head"],
                    "epsilon": st.get("epsilon"),
                    "delta": st.get("delta", 0.0 if b.kind == "pure" else None),
                    "epsilon_spent": st.get("epsilon_spent"),
                    "epsilon_remaining": st.get("epsilon_remaining"),
                }
            )
            for k in ("rho", "rho_spent", "rho_remaining", "order", "orders_within_budget"):
                if k in st:
                    out[k] = st[k]
            if held.entries:
                out["last_release"] = held.entries[-1].time
            return out

    def spend(self, name: str, body: Any, who: TokenRecord) -> dict[str, Any]:
        """``POST /api/v1/ledgers/{name}/spend``: the receipt, or an ApiError (409, 422)."""
        event, count, label, metadata, key = _spend_request(body)
        held = self.ledger(name, create_bucket=True)
        meta = {**metadata, "who": who.name}
        with held.lock:
            try:
                receipt = held.budget.spend(
                    event, count, label=label, metadata=meta, idempotency_key=key
                )
            except BudgetExceededError as exc:
                quote_ = _quote(held.budget, event, count)
                self._log_refusal(name, who.name, event, count, str(exc))
                raise ApiError(409, "refused", str(exc), **quote_) from None
            except IdempotencyConflictError as exc:
                raise ApiError(422, "idempotency_conflict", str(exc)) from None
            except LedgerError as exc:
                held.error = str(exc)
                raise ApiError(503, "ledger_unavailable", str(exc)) from None
            except RenyiError as exc:  # e.g. an event a pure budget cannot price, a template
                raise ApiError(422, "invalid", str(exc)) from None
            after = _quote(held.budget, event, 0)
        entry = {
            "index": receipt.index,
            "time": receipt.time,
            "hash": receipt.hash,
            "event": event.to_dict(),
            "count": receipt.count,
            "label": receipt.label,
            "metadata": receipt.metadata,
            "cost": receipt.cost,
            "state_after": receipt.state_after,
            "epsilon_cost": _entry_epsilon(held.budget, receipt.cost, "cost"),
            "replayed": receipt.replayed,
        }
        return {
            "receipt": entry,
            "ledger": name,
            **_without(after, "fits", "epsilon_cost", "epsilon_after", "rho_cost", "rho_after"),
        }

    def _log_refusal(self, name: str, who: str, event: Event, count: int, detail: str) -> None:
        try:
            self.store.named(name).log_refusal(who, event.to_dict(), count, detail)
        except LedgerError:  # the refusal stands; only its log line is lost
            log.exception("could not record a refusal of ledger %r", name)

    def create(self, body: Any, who: TokenRecord) -> tuple[int, dict[str, Any]]:
        """``POST /api/v1/ledgers`` (admin): 201 created, 200 the same exists, 409 differs."""
        if not isinstance(body, dict):
            raise ApiError(422, "invalid", "the body must be a JSON object")
        name = body.get("name")
        try:
            check_name(str(name))
            if "@" in str(name):
                raise ValueError("'@' is reserved for period buckets (name@period)")
        except (RenyiError, ValueError) as exc:
            raise ApiError(422, "invalid", f"name: {exc}") from None
        if not allows(who, str(name), "admin"):
            raise ApiError(403, "forbidden", f"token {who.name!r} may not create {name!r}")
        allowed = {"name", "epsilon", "delta", "rho", "period"}
        extra = sorted(set(body) - allowed)
        if extra:
            raise ApiError(422, "invalid", f"unknown fields {extra}; allowed: {sorted(allowed)}")
        params = {k: body[k] for k in ("epsilon", "delta", "rho", "period") if k in body}
        try:
            budget = Budget(ledger=self.store.named(str(name)), key=self.key, **params)
        except LedgerError as exc:
            if "different budget" in str(exc) or "keyed" in str(exc):
                raise ApiError(409, "exists", str(exc)) from None
            raise
        except (RenyiError, TypeError) as exc:
            raise ApiError(422, "invalid", str(exc)) from None
        created = budget.created
        with self._lock:
            self._ledgers.pop(str(name), None)
        return (201 if created else 200), self.summary(str(name))

    def fits(self, name: str, event: Event) -> dict[str, Any]:
        held = self.ledger(name)
        with held.lock:
            try:
                count = held.budget.max_count(event)
                one = _quote(held.budget, event, 1)
            except LedgerError as exc:
                raise ApiError(503, "ledger_unavailable", str(exc)) from None
            except RenyiError as exc:
                raise ApiError(422, "invalid", str(exc)) from None
        return {"count": count, "event": event.to_dict(), "one": one}

    def entries(self, name: str, start: int, limit: int) -> list[dict[str, Any]]:
        held = self.ledger(name)
        with held.lock:
            self.refresh(held)
            if held.error is not None:
                raise ApiError(503, "ledger_unavailable", held.error)
            rows = held.entries[start : start + limit]
            return [_entry_json(held.budget, e) for e in rows]

    def page(self, name: str, fits: dict[str, float], page: int) -> dict[str, Any]:
        """Everything the ledger page shows (one consistent read)."""
        info = self.summary(name)
        held = self.ledger(name)
        with held.lock:
            b = held.budget
            entries = list(held.entries)
            fits_out = _what_fits(b, fits) if held.error is None and b.period is None else {}
        refusals = self.store.named(name).refusals(20)
        per = 100
        pages = max(1, math.ceil(len(entries) / per))
        page = min(max(page, 1), pages)
        shown = entries[::-1][(page - 1) * per : page * per]
        buckets = [n for n in self.names() if n.startswith(name + "@")]
        return {
            "info": info,
            "rows": [_entry_row(b, e) for e in shown],
            "page": page,
            "pages": pages,
            "plot": _plot(b, entries),
            "fits": fits_out,
            "fits_in": fits,
            "jobs": _jobs(b, entries),
            "refusals": refusals,
            "buckets": buckets,
        }


# ----------------------------------------------------------------------------- helpers


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


def _finite(x: Any) -> Any:
    """JSON has no infinity: ``inf`` costs are sent as the string "inf"."""
    return "inf" if isinstance(x, float) and math.isinf(x) else x


def _quote(b: Budget, event: Event, count: int) -> dict[str, Any]:
    try:
        return {k: _finite(v) for k, v in b.quote(event, count).items()}
    except RenyiError:
        return {}


def _spend_request(body: Any) -> tuple[Event, int, str | None, dict[str, Any], str | None]:
    if not isinstance(body, dict):
        raise ApiError(422, "invalid", "the body must be a JSON object")
    allowed = {"event", "count", "label", "metadata", "idempotency_key"}
    extra = sorted(set(body) - allowed)
    if extra:
        raise ApiError(422, "invalid", f"unknown fields {extra}; allowed: {sorted(allowed)}")
    event = _event(body.get("event"))
    count = body.get("count", 1)
    if not is_spend_count(count):
        raise ApiError(422, "invalid", f"count: expected {SPEND_COUNT_RANGE}, got {count!r}")
    label = body.get("label")
    if label is not None and (not isinstance(label, str) or len(label) > 200):
        raise ApiError(422, "invalid", "label: expected a string of at most 200 characters")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ApiError(422, "invalid", "metadata: expected a JSON object")
    key = body.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 200):
        raise ApiError(422, "invalid", "idempotency_key: expected a string of 1-200 characters")
    return event, count, label, metadata, key


def _event(value: Any) -> Event:
    """An event from its ``Event.to_dict()`` form; anything else is a 422 saying why."""
    if not isinstance(value, dict):
        raise ApiError(
            422,
            "invalid_event",
            'event: expected an object, Event.to_dict() (e.g. {"type": "laplace", "scale": 10.0})',
        )
    try:
        return from_dict(value)
    except Exception as exc:  # from_dict raises many kinds on malformed input: all are 422
        raise ApiError(422, "invalid_event", f"event: {type(exc).__name__}: {exc}") from None


def _entry_epsilon(b: Budget, cost: dict[str, Any], what: str) -> float | None:
    """ε (ρ for zCDP) of a recorded cost, as a float, at the ledger's δ."""
    value = cost.get("rho" if b.kind == "zcdp" else "epsilon")
    if isinstance(value, int | float):
        return float(value)
    exact = cost.get("exact")
    try:
        return float(Fraction(str(exact))) if exact is not None else None
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def _spent_after(b: Budget, e: LedgerEntry) -> float | None:
    value = e.state_after.get("rho_spent" if b.kind == "zcdp" else "epsilon_spent")
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(Fraction(str(value))) if value is not None else None
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def _entry_json(b: Budget, e: LedgerEntry) -> dict[str, Any]:
    return {
        "index": e.index,
        "time": e.time,
        "label": e.label,
        "event": e.event,
        "count": e.count,
        "cost": e.cost,
        "state_after": e.state_after,
        "metadata": e.metadata,
        "hash": e.hash,
        "epsilon_cost": _entry_epsilon(b, e.cost, "cost"),
        "epsilon_spent_after": _spent_after(b, e),
    }


def _entry_row(b: Budget, e: LedgerEntry) -> dict[str, Any]:
    return {
        "index": e.index,
        "time": e.time[:19].replace("T", " "),
        "who": str(e.metadata.get("who", "")),
        "job": str(e.metadata.get("job", "")),
        "label": e.label or "",
        "event": describe_event(e.event),
        "count": e.count,
        "cost": _fmt(_entry_epsilon(b, e.cost, "cost")),
        "after": _fmt(_spent_after(b, e)),
    }


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return "inf" if math.isinf(x) else f"{x:.4g}"


def _what_fits(b: Budget, fits: dict[str, float]) -> dict[str, Any]:
    """DP-SGD steps at (σ, q) and Laplace queries at a scale that still fit."""
    out: dict[str, Any] = {}
    try:
        step: Event = GaussianEvent(fits["sigma"])
        if fits["q"] < 1.0:
            step = PoissonSampledEvent(fits["q"], step)
        out["steps"] = b.max_count(step) if b.kind != "pure" else None
    except RenyiError as exc:
        out["steps_error"] = str(exc)
    try:
        out["laplace"] = b.max_count(LaplaceEvent(fits["scale"]))
    except RenyiError as exc:
        out["laplace_error"] = str(exc)
    return out


def _plot(b: Budget, entries: list[LedgerEntry]) -> dict[str, Any]:
    """An inline SVG polyline of ε spent after each release, against time (≤ 600 points)."""
    width, height, pad = 640.0, 220.0, 36.0
    cap = {"pure": "epsilon", "approx": "epsilon", "zcdp": "rho"}.get(b.kind)
    top = float(b.spec[cap]) if cap else None
    points: list[tuple[LedgerEntry, float]] = []
    for e in entries:
        y = _spent_after(b, e)
        if y is not None and math.isfinite(y):
            points.append((e, y))
    if not points or top is None:
        return {"svg_points": "", "width": width, "height": height, "empty": True}
    step = max(1, len(points) // 600)
    kept = points[::step]
    if kept[-1] is not points[-1]:
        kept.append(points[-1])
    times = [_ts(e.time) for e, _ in kept]
    t0, t1 = min(times), max(times)
    span = (t1 - t0) or 1.0
    ymax = max(top, max(y for _, y in kept)) or 1.0
    xy = [
        (pad + (t - t0) / span * (width - 2 * pad), height - pad - y / ymax * (height - 2 * pad))
        for t, (_, y) in zip(times, kept, strict=True)
    ]
    xy.insert(0, (xy[0][0], height - pad))
    limit_y = height - pad - top / ymax * (height - 2 * pad)
    return {
        "svg_points": " ".join(f"{x:.1f},{y:.1f}" for x, y in xy),
        "width": width,
        "height": height,
        "pad": pad,
        "limit_y": f"{limit_y:.1f}",
        "limit": f"{top:g}",
        "unit": "ρ" if b.kind == "zcdp" else "ε",
        "t0": kept[0][0].time[:16].replace("T", " "),
        "t1": kept[-1][0].time[:16].replace("T", " "),
        "empty": False,
    }


def _ts(iso: str) -> float:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return 0.0


def _jobs(b: Budget, entries: list[LedgerEntry]) -> list[dict[str, Any]]:
    """Progress of the jobs that charge per step (entries with ``metadata.job``)."""
    jobs: dict[str, dict[str, Any]] = {}
    for e in entries:
        job = e.metadata.get("job")
        if not isinstance(job, str):
            continue
        j = jobs.setdefault(job, {"job": job, "who": e.metadata.get("who", ""), "steps": 0})
        j["steps"] += 1  # spends: one per step, or one per epoch for the epoch samplers
        j["last"] = e.time
        planned = e.metadata.get("planned_charges", e.metadata.get("planned_steps"))
        if isinstance(planned, int) and planned > 0:
            j["planned"] = planned
        eps = _entry_epsilon(b, e.cost, "cost")
        j["epsilon"] = j.get("epsilon", 0.0) + (eps or 0.0)
    now = time.time()
    out = []
    for j in jobs.values():
        planned = j.get("planned")
        j["progress"] = min(j["steps"] / planned, 1.0) if planned else None
        idle = now - _ts(j["last"])
        done = planned is not None and j["steps"] >= planned
        j["status"] = "finished" if done else ("running" if idle < _JOB_IDLE_S else "stopped")
        j["last"] = j["last"][:19].replace("T", " ")
        j["epsilon"] = _fmt(j["epsilon"])
        out.append(j)
    return sorted(out, key=lambda j: j["last"], reverse=True)


# ----------------------------------------------------------------------------- the app


def create_app(service: LedgerService) -> Any:
    """The Starlette application of ``service`` (routes: docs/ledger_service.md)."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
    from starlette.routing import Route

    folder = resources.files("renyi.ledger") / "templates"
    env = Environment(loader=FileSystemLoader(str(folder)), autoescape=select_autoescape(["html"]))

    def error(exc: ApiError) -> JSONResponse:
        body = {"error": exc.error, "detail": exc.detail, **exc.extra}
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(body, status_code=exc.status, headers=headers)

    def token_of(request: Request, *, cookie: bool = False) -> TokenRecord:
        """The caller's token: the Authorization header (the API), or for the pages the
        login cookie (never for the API, so no other site can make a browser spend)."""
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        if cookie:
            token = token or request.cookies.get(COOKIE)
        if not token:
            raise ApiError(401, "unauthorized", "a token is required (Authorization: Bearer ...)")
        record = service.check_token(token)
        if record is None:
            raise ApiError(401, "unauthorized", "unknown or malformed token")
        return record

    def need(record: TokenRecord, name: str | None, role: str) -> None:
        if not allows(record, name, role):
            what = f"ledger {name!r}" if name else "this store"
            raise ApiError(
                403,
                "forbidden",
                f"token {record.name!r} ({record.role}, scope "
                f"{record.scope!r}) may not {role} on {what}",
            )

    async def body_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
            raise ApiError(413, "too_large", f"request bodies are limited to {MAX_BODY} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                raise ApiError(413, "too_large", f"request bodies are limited to {MAX_BODY} bytes")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks) or b"null")
        except ValueError as exc:
            raise ApiError(422, "invalid", f"the body is not JSON: {exc}") from None

    Handler = Callable[[Request], Awaitable[Response]]

    def api(fn: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            try:
                return await fn(request)
            except ApiError as exc:
                return error(exc)
            except LedgerError as exc:
                return error(ApiError(503, "ledger_unavailable", str(exc)))
            except Exception:
                log.exception("internal error in %s %s", request.method, request.url.path)
                return JSONResponse(
                    {"error": "internal", "detail": "internal error (see the server's log)"},
                    status_code=500,
                )

        return wrapped

    @api
    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @api
    async def list_ledgers(request: Request) -> Response:
        who = token_of(request)

        def run() -> list[dict[str, Any]]:
            return [service.summary(n) for n in service.names() if allows(who, n, "read")]

        return JSONResponse({"ledgers": await run_in_threadpool(run)})

    @api
    async def create_ledger(request: Request) -> Response:
        who = token_of(request)
        need(who, None, "admin")
        body = await body_json(request)
        status, out = await run_in_threadpool(service.create, body, who)
        return JSONResponse(out, status_code=status)

    @api
    async def get_ledger(request: Request) -> Response:
        who = token_of(request)
        name = request.path_params["name"]
        need(who, name, "read")
        full = request.query_params.get("verify") == "full"
        return JSONResponse(await run_in_threadpool(service.summary, name, full=full))

    @api
    async def spend(request: Request) -> Response:
        who = token_of(request)
        name = request.path_params["name"]
        need(who, name, "spend")
        body = await body_json(request)
        return JSONResponse(await run_in_threadpool(service.spend, name, body, who))

    @api
    async def fits(request: Request) -> Response:
        who = token_of(request)
        name = request.path_params["name"]
        need(who, name, "read")
        try:
            value = json.loads(request.query_params.get("event", ""))
        except ValueError:
            raise ApiError(
                422, "invalid_event", "event: expected Event.to_dict() as JSON"
            ) from None
        return JSONResponse(await run_in_threadpool(service.fits, name, _event(value)))

    @api
    async def entries(request: Request) -> Response:
        who = token_of(request)
        name = request.path_params["name"]
        need(who, name, "read")
        try:
            start = int(request.query_params.get("start", "0"))
            limit = int(request.query_params.get("limit", "1000"))
            if start < 0 or not 1 <= limit <= 10000:
                raise ValueError
        except ValueError:
            raise ApiError(422, "invalid", "start >= 0 and 1 <= limit <= 10000") from None
        rows = await run_in_threadpool(service.entries, name, start, limit)
        return JSONResponse({"entries": rows, "start": start})

    # -- pages ------------------------------------------------------------------------
    def render(template: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(template).render(**context), status_code=status)

    def page_user(request: Request) -> TokenRecord | None:
        try:
            return token_of(request, cookie=True)
        except ApiError:
            return None

    async def login_page(request: Request) -> Response:
        return render("login.html", error=None)

    async def login(request: Request) -> Response:
        try:
            raw = await body_json_raw(request)
        except ApiError as exc:
            return render("login.html", status=exc.status, error=exc.detail)
        token = (parse_qs(raw.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        record = await run_in_threadpool(check_token, service.store, token)
        if record is None:
            return render("login.html", status=401, error="unknown or malformed token")
        resp = RedirectResponse("/", status_code=303)
        https = request.headers.get("x-forwarded-proto") == "https" or request.url.scheme == "https"
        resp.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", secure=https, max_age=12 * 3600
        )
        return resp

    async def logout(request: Request) -> Response:
        resp = RedirectResponse("/login", status_code=303)
        resp.delete_cookie(COOKIE)
        return resp

    async def body_json_raw(request: Request) -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                raise ApiError(413, "too_large", f"request bodies are limited to {MAX_BODY} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def index(request: Request) -> Response:
        who = page_user(request)
        if who is None:
            return RedirectResponse("/login", status_code=303)

        def run() -> list[dict[str, Any]]:
            return [service.summary(n) for n in service.names() if allows(who, n, "read")]

        try:
            ledgers = await run_in_threadpool(run)
        except Exception:
            log.exception("internal error on the index page")
            return render("error.html", status=500, message="internal error (see the log)")
        return render("index.html", ledgers=ledgers, who=who, fmt=_fmt, quote=quote)

    async def ledger_page(request: Request) -> Response:
        who = page_user(request)
        if who is None:
            return RedirectResponse("/login", status_code=303)
        name = request.path_params["name"]
        if not allows(who, name, "read"):
            return render("error.html", status=403, message=f"no access to ledger {name!r}")
        q = request.query_params
        try:
            wanted = {
                "sigma": float(q.get("sigma", "1.0")),
                "q": float(q.get("q", "0.01")),
                "scale": float(q.get("scale", "10")),
            }
            page = int(q.get("page", "1"))
        except ValueError:
            return render("error.html", status=422, message="sigma, q, scale: numbers; page: int")
        try:
            data = await run_in_threadpool(service.page, name, wanted, page)
        except ApiError as exc:
            return render("error.html", status=exc.status, message=exc.detail)
        except Exception:
            log.exception("internal error on the page of %r", name)
            return render("error.html", status=500, message="internal error (see the log)")
        return render("ledger.html", who=who, name=name, fmt=_fmt, quote=quote, **data)

    routes = [
        Route("/api/v1/health", health),
        Route("/api/v1/ledgers", list_ledgers, methods=["GET"]),
        Route("/api/v1/ledgers", create_ledger, methods=["POST"]),
        Route("/api/v1/ledgers/{name}", get_ledger, methods=["GET"]),
        Route("/api/v1/ledgers/{name}/spend", spend, methods=["POST"]),
        Route("/api/v1/ledgers/{name}/fits", fits, methods=["GET"]),
        Route("/api/v1/ledgers/{name}/entries", entries, methods=["GET"]),
        Route("/", index),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/ledgers/{name}", ledger_page),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 404)
        return JSONResponse({"error": "not_found", "detail": "no such route"}, status_code=code)

    async def crashed(request: Request, exc: Exception) -> Response:
        log.exception("internal error", exc_info=exc)
        return JSONResponse(
            {"error": "internal", "detail": "internal error (see the server's log)"},
            status_code=500,
        )

    return Starlette(
        debug=False,
        routes=routes,
        exception_handlers={404: not_found, 405: not_found, Exception: crashed},
    )


def serve(
    ledger: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    key: bytes | str | None = None,
    announce: Callable[[str], None] = print,
) -> None:
    """Verify every ledger of the store named by ``ledger``, then serve it until stopped.

    Raises LedgerError (before listening) when a ledger fails verification.
    """
    import uvicorn

    from renyi.ledger import is_postgres_url, open_store

    if is_postgres_url(ledger):  # the whole database: every ledger in it
        store = open_store(ledger.rsplit("#", 1)[0])
    else:
        store = open_store(ledger, create=False)
    service = LedgerService(store, key=key)
    app = create_app(service)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections queue from now on: announcing is safe
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        server_header=False,
        proxy_headers=False,
        timeout_keep_alive=30,
        limit_concurrency=256,
        h11_max_incomplete_event_size=MAX_BODY,
    )
    names = ", ".join(service.names()) or "none yet"
    shown = f"[{host}]" if ":" in host else host
    announce(f"renyi ledger service on http://{shown}:{bound}/ (ledgers: {names})")
    uvicorn.Server(config).run(sockets=[sock])
