"""Privacy budgets that refuse over-budget releases, backed by a durable ledger.

A :class:`Budget` is a *privacy filter*: before each release, ``spend(event)`` checks that
the composition including the new event stays within the limit and raises
:class:`~renyi.errors.BudgetExceededError` *before any output is produced* if it would not.
A refused request changes nothing, so a later, cheaper request that fits is still served.

Budgets:

* ``Budget(epsilon=1.0)`` — pure ε-DP, basic composition (sound for adaptively chosen
  ε's: Rogers et al. 2016). Sums are exact rationals and never under-charge: declared
  ε's (``PureDpEvent``) are read as written (the shortest decimal of the float), so a budget
  of 1.0 spent as ten 0.1's allows exactly ten; costs derived from noise (Laplace ε = 1/scale)
  are exact rationals of the parameters, so three ``LaplaceEvent(3)`` cost exactly 1; costs
  only computable in floating point (randomized response) are rounded up.
* ``Budget(rho=0.5)`` — ρ-zCDP; ρ's add (Bun & Steinke 2016), exact sums likewise.
* ``Budget(epsilon=3.0, delta=1e-5)`` — (ε, δ) through RDP. The limit becomes a budget
  curve on a grid of orders fixed in advance: b(α) = ε − log(1/δ)/(α − 1), Mironov 2017,
  Prop. 3. The filter serves a request while *some* order of the grid stays within its
  budget (formulas.md §10: Feldman & Zrnic 2021; Lécuyer 2021). We use Mironov's
  conversion rather than the tighter Balle et al. one because the filter theorems are
  proven through the privacy-loss tail bound that Prop. 3 is; this is the safe choice.
* ``Budget(curve=RdpCurve(...))`` — an explicit RDP budget curve, same filter.

Adaptivity: the parameters of each release may depend on earlier outputs. This is sound
because the filter's grid of orders and limits are fixed when the budget is created and the
decision to halt uses only the parameters of the releases (never the data).

Hyperparameter tuning: every trial is a release. Tuning k configurations with honest
accounting composes the k trainings (spend each trial's event, labelled). Private selection
rules that pay for only a few trials (Papernot & Steinke 2022, "Hyperparameter tuning with
Rényi differential privacy", ICLR) are future work.

Example::

    >>> from renyi.budget import Budget
    >>> from renyi.analysis.events import LaplaceEvent
    >>> b = Budget(epsilon=1.0)
    >>> for _ in range(10):
    ...     _ = b.spend(LaplaceEvent(scale=10.0), label="count query")   # ε = 0.1 each
    >>> b.can_spend(LaplaceEvent(scale=10.0))
    False
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_delta, check_int, check_orders, check_positive, fail
from renyi.accountants.rdp import RdpAccountant, event_rdp
from renyi.accountants.zcdp import event_rho
from renyi.analysis.curves import DEFAULT_ORDERS, RdpCurve
from renyi.analysis.events import (
    ApproxDpEvent,
    ComposedEvent,
    DiscreteGaussianEvent,
    DiscreteLaplaceEvent,
    Event,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDpEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    ZcdpEvent,
    from_dict,
)
from renyi.errors import BudgetExceededError, PrivacyParameterError, UnsupportedEventError
from renyi.ledger import (
    CHAIN_HMAC,
    CHAIN_SHA256,
    DEFAULT_NAME,
    IdempotencyConflictError,
    LedgerEntry,
    LedgerError,
    LedgerNotFoundError,
    LedgerStore,
    Transaction,
    entry_digest,
    genesis_digest,
    new_ledger_id,
    now_iso,
    open_store,
    state_digest,
)
from renyi.ledger._base import dumps, same_digest

__all__ = ["PERIODS", "Budget", "Receipt", "check_period", "event_pure_epsilon", "event_rho_exact"]

PERIODS = ("day", "week", "month", "quarter", "year")
_PERIOD_FORMS = {
    "day": (r"\d{4}-\d{2}-\d{2}", "YYYY-MM-DD"),
    "week": (r"\d{4}-W\d{2}", "YYYY-Www (ISO week)"),
    "month": (r"\d{4}-\d{2}", "YYYY-MM"),
    "quarter": (r"\d{4}-Q[1-4]", "YYYY-Qn"),
    "year": (r"\d{4}", "YYYY"),
}


def check_period(unit: str, value: str) -> str:
    """A period of a time-bucketed budget, e.g. ``check_period("month", "2026-11")``."""
    import datetime as _dt
    import re

    pattern, form = _PERIOD_FORMS[unit]
    ok = isinstance(value, str) and re.fullmatch(pattern, value) is not None
    if ok:
        try:
            if unit == "day":
                _dt.date.fromisoformat(value)
            elif unit == "week":
                _dt.date.fromisocalendar(int(value[:4]), int(value[6:]), 1)
            elif unit == "month":
                _dt.date(int(value[:4]), int(value[5:]), 1)
        except ValueError:
            ok = False
    if not ok:
        raise fail("period", value, f"a {unit} written {form}")
    return value


def _check_metadata(metadata: Any) -> dict[str, Any]:
    """A copy of ``metadata`` if the ledger can store it as it is: a dict with string keys
    of JSON values (finite numbers), which reads back equal; else our error naming it."""
    import json

    meta = {} if metadata is None else metadata
    expected = "a dict of JSON values (string keys; finite numbers, text, lists, dicts)"
    if not isinstance(meta, dict):
        raise fail("metadata", metadata, expected)
    try:
        same = json.loads(dumps(meta)) == meta
    except (TypeError, ValueError):
        same = False
    if not same:
        raise fail("metadata", metadata, expected)
    return dict(meta)


_ROUND_UP = 1.0 + 4 * np.finfo(np.float64).eps  # inflate computed RDP costs by a few ulps
_ULPS_UP = Fraction(1) + Fraction(1, 2**49)  # ~8 ulps up, for costs computed in floats

_INF = Fraction(10) ** 400  # stands for +inf in exact arithmetic (larger than any float)


def _dec(x: float) -> Fraction:
    """The shortest decimal that round-trips ``x`` (what the user typed), as an exact rational."""
    x = float(x)
    if math.isinf(x):
        return _INF
    return Fraction(Decimal(repr(x)))


def _small(x: float) -> Fraction:
    """The smaller of the two readings of a parameter: as typed (decimal) or as stored (binary).

    A cost that *decreases* in a parameter (ε = 1/scale) is charged at this reading, so it is
    never below the cost of either the value the user wrote or the float the mechanism used.
    """
    return min(_dec(x), Fraction(float(x)))


def _large(x: float) -> Fraction:
    """The larger of the two readings (for costs that increase in the parameter)."""
    return max(_dec(x), Fraction(float(x)))


def _float_up(x: float) -> Fraction:
    """A cost computed in floating point (a few ulps of error), rounded up."""
    return _INF if math.isinf(x) else Fraction(x) * _ULPS_UP


def event_pure_epsilon(event: Event) -> Fraction:
    """ε of one run of ``event`` under pure DP, exactly or rounded up (basic composition).

    Declared guarantees (``PureDpEvent``, ``ApproxDpEvent`` with δ = 0) are charged at the
    value as written (the shortest decimal of the float). Costs derived from noise parameters
    are exact rationals of those parameters, taking whichever reading (decimal or binary)
    costs more: Laplace ε = 1/scale, discrete Laplace ε = Δ₁/scale. Randomized response's
    log(p/(1−p)) is irrational: it is computed in floating point and rounded up.
    """
    if isinstance(event, PureDpEvent):
        return _dec(event.epsilon)
    if isinstance(event, ApproxDpEvent) and event.delta == 0.0:
        return _dec(event.epsilon)
    if isinstance(event, LaplaceEvent):
        return 1 / _small(event.scale)
    if isinstance(event, DiscreteLaplaceEvent):
        return _large(event.sensitivity) / _small(event.scale)
    if isinstance(event, RandomizedResponseEvent):
        if event.p == 1.0:
            return _INF
        p = event.p if _dec(event.p) <= Fraction(event.p) else math.nextafter(event.p, 1.0)
        if p >= 1.0:
            return _INF
        return _float_up(math.log1p((2.0 * p - 1.0) / (1.0 - p)))
    if isinstance(event, ComposedEvent):
        return sum((event_pure_epsilon(e) for e in event.events), Fraction(0))
    if isinstance(event, SelfComposedEvent):
        return event.count * event_pure_epsilon(event.event) if event.count else Fraction(0)
    raise UnsupportedEventError(
        f"{type(event).__name__} has no pure-DP guarantee; use an (epsilon, delta) or rho budget"
    )


def event_rho_exact(event: Event) -> Fraction:
    """ρ (zCDP) of one run of ``event``, exactly or rounded up (see :func:`event_pure_epsilon`)."""
    if isinstance(event, ZcdpEvent):
        return _dec(event.rho)
    if isinstance(event, GaussianEvent):
        return 1 / (2 * _small(event.noise_multiplier) ** 2)
    if isinstance(event, DiscreteGaussianEvent):
        return _large(event.sensitivity) ** 2 / (2 * _small(event.sigma) ** 2)
    if isinstance(
        event, LaplaceEvent | DiscreteLaplaceEvent | PureDpEvent | RandomizedResponseEvent
    ):
        e = event_pure_epsilon(event)
        return _INF if e >= _INF else e * e / 2  # Bun & Steinke 2016, Prop. 3.3
    if isinstance(event, ApproxDpEvent) and event.delta == 0.0:
        e = event_pure_epsilon(event)
        return e * e / 2
    if isinstance(event, PoissonSampledEvent | SampledWithoutReplacementEvent):
        if getattr(event, "sampling_rate", 1.0) == 0.0:
            return Fraction(0)
        return event_rho_exact(event.event)  # no amplification in zCDP
    if isinstance(event, ComposedEvent):
        return sum((event_rho_exact(e) for e in event.events), Fraction(0))
    if isinstance(event, SelfComposedEvent):
        return event.count * event_rho_exact(event.event) if event.count else Fraction(0)
    return _float_up(event_rho(event))  # raises UnsupportedEventError for the rest


def _show(x: Fraction) -> str:
    """A readable exact value: the decimal when it terminates, else a 17-digit float."""
    if x >= _INF:
        return "inf"
    if x == 0:
        return "0"
    d = x.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d == 1:
        text = format(Decimal(x.numerator) / Decimal(x.denominator), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return repr(float(x))


def _flt(x: Fraction) -> float:
    return math.inf if x >= _INF else float(x)


def _enc(values: NDArray[np.float64]) -> list[Any]:
    return [float(v) if math.isfinite(v) else "inf" for v in values]


def _dec_arr(values: list[Any]) -> NDArray[np.float64]:
    return np.array([math.inf if v == "inf" else float(v) for v in values], dtype=np.float64)


def _key_bytes(key: bytes | str | None) -> bytes | None:
    if key is None:
        return None
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, bytes) or len(key) < 16:
        raise fail("key", "<hidden>", "bytes or str of at least 16 bytes (an HMAC key)")
    return key


@dataclass(frozen=True)
class Receipt:
    """What a successful ``spend`` recorded (``replayed``: an earlier spend with the same
    idempotency key, returned again and not charged twice)."""

    index: int
    event: Event
    count: int
    cost: dict[str, Any]
    state_after: dict[str, Any]
    label: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    time: str = ""
    hash: str = ""
    replayed: bool = False

    @classmethod
    def of(cls, entry: LedgerEntry, event: Event, *, replayed: bool = False) -> Receipt:
        return cls(
            entry.index,
            event,
            entry.count,
            entry.cost,
            entry.state_after,
            entry.label,
            entry.metadata,
            entry.time,
            entry.hash,
            replayed,
        )


class Budget:
    """A privacy filter with a tamper-evident ledger. See the module docstring.

    Args:
        epsilon: pure-DP limit, or with ``delta`` the (ε, δ) target (via RDP).
        delta: failure probability in (0, 1) for an (ε, δ) budget.
        rho: zCDP limit.
        curve: an explicit RDP budget curve.
        orders: the fixed grid of orders of an (ε, δ) budget (default: DEFAULT_ORDERS).
        ledger: a path to a SQLite ledger file (created atomically if missing; reopened and
            verified if present), a ``postgresql://`` URL, a
            :class:`~renyi.ledger.LedgerStore`, or None (in memory).
        key: optional HMAC key (≥ 16 bytes) for the ledger's hash chain and state row: a
            keyed ledger cannot be rewritten, cut short or moved consistently by anyone
            without the key. A keyed ledger must always be opened with its key.
        expect_id: the ledger id (``budget.ledger_id``, shown by ``renyi ledger show``) that
            an existing ledger must carry: refuses a ledger swapped for another one.
        period: ``"day"``, ``"week"``, ``"month"``, ``"quarter"`` or ``"year"`` for a
            *time-bucketed* budget: every period's data gets its own budget of this size
            (:meth:`bucket`), and nothing is spent against this ledger itself. Sound only when
            each period's data are disjoint from every other period's and each release reads
            one period's data (parallel composition); a person whose records fall in k periods
            is protected at k times the per-period budget (docs/budget.md).
    """

    def __init__(
        self,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        rho: float | None = None,
        curve: RdpCurve | None = None,
        orders: ArrayLike = DEFAULT_ORDERS,
        ledger: str | os.PathLike[str] | LedgerStore | None = None,
        key: bytes | str | None = None,
        expect_id: str | None = None,
        period: str | None = None,
    ) -> None:
        spec = _make_spec(epsilon, delta, rho, curve, orders)
        if period is not None:
            if period not in PERIODS:
                raise fail("period", period, f"None or one of {', '.join(PERIODS)}")
            spec["period"] = period
        self._init(spec, open_store(ledger), _key_bytes(key), expect_id)

    def _init(
        self,
        spec: dict[str, Any],
        store: LedgerStore,
        key: bytes | None,
        expect_id: str | None,
    ) -> None:
        self._key = key
        spec["chain"] = CHAIN_HMAC if self._key is not None else CHAIN_SHA256
        self._store = store
        self._spec = spec
        self._id = new_ledger_id()
        self._setup()
        try:
            state = self._state_json(self._initial())
            self.created = self._store.initialise(spec, state, self._id)
        except LedgerError:
            try:
                held = self._store.spec()
            except LedgerError:
                held = None
            if held is not None and {**held, "chain": spec["chain"]} == spec:
                raise self._chain_mismatch(held) from None
            raise
        if not self.created:
            info = self._store.info()
            if info is None:  # pragma: no cover - the store just said it holds this budget
                raise LedgerError(f"{self._store.describe()} holds no budget")
            self._id = str(info["id"])
            self._setup()
        self._check_expected(expect_id)
        self._load()

    @classmethod
    def open(
        cls,
        ledger: str | os.PathLike[str] | LedgerStore,
        *,
        key: bytes | str | None = None,
        expect_id: str | None = None,
    ) -> Budget:
        """Reopen and verify the budget recorded in an existing ledger (path, URL or store).

        ``expect_id``: the id the ledger must carry (``budget.ledger_id``, printed by
        ``renyi ledger show``); a different ledger put in its place is refused.
        """
        store = open_store(ledger, create=False)
        info = store.info()
        if info is None:
            raise LedgerNotFoundError(
                f"{store.describe()} holds no budget: create it with Budget(..., ledger=) "
                "or `renyi ledger init`"
            )
        spec = info["spec"]
        self = cls.__new__(cls)
        self._key = _key_bytes(key)
        self._store = store
        self._spec = spec
        self._id = str(info["id"])
        self.created = False
        if spec.get("chain") not in (CHAIN_SHA256, CHAIN_HMAC):
            raise LedgerError(f"{store.describe()}: unknown hash chain {spec.get('chain')!r}")
        if (spec["chain"] == CHAIN_HMAC) != (self._key is not None):
            raise self._chain_mismatch(spec)
        self._check_expected(expect_id)
        self._setup()
        self._load()
        return self

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        token: str | None = None,
        expect_id: str | None = None,
        timeout: float = 30.0,
        job: str | None = None,
        planned_steps: int | None = None,
    ) -> Any:
        """A budget held by a ledger service (``renyi ledger serve``), for another machine.

        ``url`` is ``http[s]://host:port#name`` (the ledger ``name`` of the service;
        ``default`` if omitted); ``token`` a spend (or read) token from ``renyi ledger
        token`` (default: ``$RENYI_LEDGER_TOKEN``). The returned
        :class:`~renyi.ledger.client.RemoteBudget` charges the service *before* each
        release, exactly as a local budget does: ``spend`` returns only after the service
        committed the entry, and raises (so nothing is released) when the service refuses
        (:class:`~renyi.errors.BudgetExceededError`) or cannot be reached or answers
        otherwise (:class:`~renyi.ledger.LedgerError`). Each spend carries an idempotency
        key, so a retried request is never charged twice. ``job`` and ``planned_steps``
        label the spends of a running job for the dashboard's progress table.
        """
        from renyi.ledger.client import RemoteBudget

        return RemoteBudget(
            url,
            token=token,
            expect_id=expect_id,
            timeout=timeout,
            job=job,
            planned_steps=planned_steps,
        )

    def bucket(self, period: str) -> Budget:
        """The budget of one period of a time-bucketed budget (created on first use).

        It is the ledger ``<name>@<period>`` of the same store, with this budget's limit and
        key, e.g. ``budget.bucket("2026-11")`` for ``period="month"``. Each bucket is its own
        filter: sound only for releases that read that period's data alone (see ``period``).

        When a bucket is first opened, its id is recorded in this ledger's own chain (an entry
        of cost 0, labelled ``bucket <period>``); a recorded bucket that is later missing
        from the store, or carries another id, is refused (:class:`LedgerError`) instead of
        being started again at zero spent. Keyed, this holds against anyone without the
        key who can edit the store (not against a rollback of the whole store).
        """
        if self.period is None:
            raise fail("period", None, "a time-bucketed budget (Budget(..., period=...))")
        check_period(self.period, period)
        spec = {k: v for k, v in self._spec.items() if k not in ("period", "chain")}
        spec.update(bucket=period, bucket_of=self.name)
        store = self._store.named(f"{self.name}@{period}")
        recorded = self._bucket_ids().get(period)
        if recorded is not None and store.info() is None:
            raise LedgerError(
                f"{store.describe()}: bucket {period!r} of ledger {self.name!r} was opened as "
                f"ledger {recorded} (recorded in {self.name!r}'s chain) and is missing from "
                "the store: deleted; refusing to start that period again at zero spent"
            )
        out = Budget.__new__(Budget)
        out._init(spec, store, self._key, recorded)
        if recorded is None:
            receipt = self._charge(
                PureDpEvent(0.0),
                1,
                label=f"bucket {period}",
                metadata={"bucket": period, "bucket_id": out.ledger_id},
                idempotency_key=f"bucket:{period}",
            )
            if not same_digest(str(receipt.metadata.get("bucket_id")), out.ledger_id):
                raise LedgerError(
                    f"{store.describe()} is ledger {out.ledger_id}, but {self.name!r}'s chain "
                    f"records bucket {period!r} as ledger {receipt.metadata.get('bucket_id')}: "
                    "replaced; refusing to use it"
                )
        return out

    def _bucket_ids(self) -> dict[str, str]:
        """``{period: bucket ledger id}`` as recorded in this ledger's verified chain."""
        ids: dict[str, str] = {}
        for e in self.entries():
            period, bucket_id = e.metadata.get("bucket"), e.metadata.get("bucket_id")
            if isinstance(period, str) and isinstance(bucket_id, str):
                ids.setdefault(period, bucket_id)
        return ids

    def _check_expected(self, expect_id: str | None) -> None:
        if expect_id is not None and not same_digest(str(expect_id), self._id):
            raise LedgerError(
                f"{self._store.describe()} is ledger {self._id}, not the expected {expect_id}: "
                "a different ledger was put in its place (swapped or replaced); refusing to "
                "use it"
            )

    def _chain_mismatch(self, held: dict[str, Any]) -> LedgerError:
        where = self._store.describe()
        if held.get("chain") == CHAIN_HMAC:
            return LedgerError(f"{where} is keyed (HMAC): open it with its key")
        return LedgerError(
            f"{where} is not keyed but a key was given: a keyed budget cannot reuse an unkeyed "
            "ledger (or its chain was downgraded)"
        )

    def _setup(self) -> None:
        try:
            kind = self._spec["kind"]
            if kind not in ("pure", "zcdp", "approx", "rdp"):
                raise ValueError(f"unknown kind {kind!r}")
            if kind in ("approx", "rdp"):
                self._orders = np.array(self._spec["orders"], dtype=np.float64)
                self._limit = _dec_arr(self._spec["limit"])
                if self._orders.shape != self._limit.shape or self._orders.ndim != 1:
                    raise ValueError("orders and limits differ in shape")
            if kind == "approx":
                float(self._spec["epsilon"]) + float(self._spec["delta"])
            elif kind in ("pure", "zcdp"):
                _dec(self._spec["epsilon" if kind == "pure" else "rho"])
        except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
            raise LedgerError(
                f"{self._store.describe()}: the recorded budget is unreadable ({exc}): a "
                "damaged ledger; refusing to use it"
            ) from None
        self.kind: str = kind
        self.period: str | None = self._spec.get("period")
        self._genesis = genesis_digest(self._spec, self._key, self._id, self.name)
        self._cost_cache: dict[tuple[str, int], Any] = {}

    def _load(self) -> None:
        """Verify the whole chain and the state row; remember the verified totals."""
        self._n, self._head, self._verified = 0, self._genesis, self._initial()
        self._store.read(self._full_check)

    # ------------------------------------------------------------------ description
    @property
    def spec(self) -> dict[str, Any]:
        """The budget's specification as stored in the ledger."""
        return dict(self._spec)

    @property
    def store(self) -> LedgerStore:
        return self._store

    @property
    def ledger_id(self) -> str:
        """The ledger's unique id (random, drawn at creation; bound into its hash chain)."""
        return self._id

    @property
    def name(self) -> str:
        """The ledger's name in its store (``"default"`` unless named)."""
        return str(getattr(self._store, "name", DEFAULT_NAME))

    @property
    def head(self) -> str:
        """The hash of the last verified entry (keep a copy elsewhere to detect a rollback)."""
        return self._head

    def close(self) -> None:
        """Close the ledger's connection in this thread (reopened on the next use)."""
        close = getattr(self._store, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Budget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self._spec
        if s["kind"] == "pure":
            what = f"epsilon={s['epsilon']}"
        elif s["kind"] == "zcdp":
            what = f"rho={s['rho']}"
        elif s["kind"] == "approx":
            what = f"epsilon={s['epsilon']}, delta={s['delta']}"
        else:
            what = "rdp curve"
        if self.period is not None:
            what += f", period={self.period!r}"
        return f"Budget({what})"

    # ------------------------------------------------------------------ costs
    def cost(self, event: Event, count: int = 1) -> Any:
        """The cost of ``count`` runs of ``event`` in this budget's currency (no state change)."""
        count = check_int("count", count, 0)
        if not isinstance(event, Event):
            raise fail("event", event, "a renyi.analysis.events.Event")
        if self.kind == "pure":
            return count * event_pure_epsilon(event) if count else Fraction(0)
        if self.kind == "zcdp":
            return count * event_rho_exact(event) if count else Fraction(0)
        per = event_rdp(event, self._orders) * _ROUND_UP
        return np.zeros_like(per) if count == 0 else count * per

    def _initial(self) -> Any:
        if self.kind in ("pure", "zcdp"):
            return Fraction(0)
        return np.zeros_like(self._orders)

    def _cap(self) -> Fraction:
        return _dec(self._spec["epsilon" if self.kind == "pure" else "rho"])

    def _fits(self, spent: Any) -> bool:
        if self.kind in ("pure", "zcdp"):
            return bool(spent <= self._cap())
        return bool(np.any(spent <= self._limit))

    def _spent_of(self, state: dict[str, Any]) -> Any:
        try:
            if self.kind in ("pure", "zcdp"):
                return Fraction(state["spent"])
            return _dec_arr(state["spent"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            raise LedgerError(
                f"{self._store.describe()}: the state row is unreadable (damaged or edited)"
            ) from None

    def _state_json(self, spent: Any, n: int = 0, head: str | None = None) -> dict[str, Any]:
        enc: Any = str(spent) if self.kind in ("pure", "zcdp") else _enc(spent)
        state = {"spent": enc, "entries": n, "head": head or self._genesis, "id": self._id}
        return {**state, "tag": state_digest(state, self._key)}

    def _epsilon_of(self, spent: NDArray[np.float64]) -> float:
        """ε at the budget's δ of an RDP total (Mironov, over the budget's fixed grid)."""
        from renyi.analysis.conversions import rdp_to_dp_mironov
        from renyi.noise import accounting_slack

        if not np.any(spent > 0):
            return 0.0
        delta = float(self._spec["delta"])
        eps = float(rdp_to_dp_mironov(self._orders, spent, delta)[0])
        # the noise implementation's slack, as Accountant.epsilon adds it (0: renyi's noise is
        # exact): the ideal ε at δ - slack(guess), valid once the answer is below the guess
        guess = eps + 1.0
        for _ in range(16):
            e_s, d_s = accounting_slack(guess)
            if not (e_s or d_s):
                return eps
            d = min(delta - d_s, math.nextafter(delta, 0.0))
            if d <= 0:
                return math.inf
            ideal = float(rdp_to_dp_mironov(self._orders, spent, d)[0])
            if ideal <= guess:
                return ideal + e_s
            guess = ideal + 1.0
        return math.inf

    def _summary(self, spent: Any) -> dict[str, Any]:
        if self.kind == "pure":
            return {"epsilon_spent": _show(spent)}
        if self.kind == "zcdp":
            return {"rho_spent": _show(spent)}
        ok = spent <= self._limit
        slack = np.where(ok, self._limit - spent, -np.inf)
        i = int(np.argmax(slack))
        out: dict[str, Any] = {
            "best_order": float(self._orders[i]),
            "orders_within_budget": int(ok.sum()),
        }
        if self.kind == "approx":
            out["epsilon_spent"] = self._epsilon_of(spent)
        return out

    def _cost_json(self, cost: Any, before: Any) -> dict[str, Any]:
        if self.kind == "pure":
            return {"epsilon": _show(cost), "exact": str(cost)}
        if self.kind == "zcdp":
            return {"rho": _show(cost), "exact": str(cost)}
        if self.kind == "approx":
            return {
                "epsilon": self._epsilon_of(before + cost) - self._epsilon_of(before),
                "epsilon_alone": self._epsilon_of(cost),
            }
        return {"rdp_at_best_order": float(np.min(cost))}

    # ------------------------------------------------------------------ verification
    def _entry_cost(self, e: LedgerEntry) -> Any:
        key = (str(sorted(e.event.items())), e.count)
        cached = self._cost_cache.get(key)
        if cached is None:
            try:
                event = from_dict(e.event)
            except Exception as exc:  # any damage to a stored event is a ledger problem
                raise LedgerError(
                    f"{self._store.describe()}: entry #{e.index} holds an unreadable event ({exc})"
                ) from None
            cached = self.cost(event, e.count)
            if len(self._cost_cache) < 4096:
                self._cost_cache[key] = cached
        return cached

    def _walk(
        self, entries: list[LedgerEntry], n: int, head: str, spent: Any
    ) -> tuple[int, str, Any]:
        """Verify ``entries`` as the continuation of a verified prefix (n entries, head, spent)."""
        where = self._store.describe()
        for e in entries:
            if e.index != n:
                what = "missing" if e.index > n else "duplicated or out of order"
                raise LedgerError(
                    f"{where}: entry #{n} is {what} (found #{e.index} where #{n} belongs): "
                    "the ledger was tampered with; refusing to use it"
                )
            if not same_digest(e.hash, entry_digest(e, head, self._key)):
                raise LedgerError(
                    f"{where}: entry #{n} fails the hash chain: it (or the budget, or an entry "
                    "before it) was edited, reordered or damaged; refusing to use this ledger"
                )
            cost = self._entry_cost(e)
            if self.kind in ("pure", "zcdp"):
                # the recorded exact cost (covered by the chain) is what was charged; it must
                # be at least what the event costs now (a later, tighter renyi keeps old
                # ledgers valid; a cost below the event's is refused)
                try:
                    recorded = Fraction(str(e.cost.get("exact")))
                except (ValueError, ZeroDivisionError):
                    raise LedgerError(
                        f"{where}: entry #{n} has an unreadable cost {e.cost!r}; refusing to use "
                        "this ledger"
                    ) from None
                if recorded < cost:
                    raise LedgerError(
                        f"{where}: entry #{n} records a cost of {_show(recorded)} but its event "
                        f"costs {_show(cost)}; refusing to use this ledger"
                    )
                cost = recorded
            spent = spent + cost
            head = e.hash
            n += 1
        return n, head, spent

    def _check_state(self, t: Transaction, n: int, head: str, spent: Any) -> Any:
        """Compare the stored state with the verified totals; return the spent total to use."""
        where = self._store.describe()
        state = t.state()
        if state is None:
            raise LedgerError(f"{where}: the state row is missing (damaged or edited ledger)")
        stored_n = state.get("entries")
        if stored_n != n:
            if isinstance(stored_n, int) and stored_n > n:
                raise LedgerError(
                    f"{where}: entry #{n} is missing: the state records {stored_n} releases but "
                    f"the chain holds {n}; refusing to use this ledger"
                )
            raise LedgerError(
                f"{where}: the state row records {stored_n!r} releases but the chain holds {n} "
                "(state row edited); refusing to use this ledger"
            )
        if not same_digest(str(state.get("head")), head):
            raise LedgerError(
                f"{where}: the state row's chain head does not match entry #{n - 1} (state row "
                "edited); refusing to use this ledger"
            )
        stored = self._spent_of(state)
        if self.kind in ("pure", "zcdp"):
            ok = stored == spent
        else:
            # RDP costs are recomputed from the events in floating point: a state below them
            # (beyond rounding) is refused; one above them (an older, looser renyi) is kept
            with np.errstate(invalid="ignore"):  # inf - inf where an order has no bound
                floor = spent - (1e-9 * np.abs(spent) + 1e-12)
            ok = bool(np.all((stored >= floor) | (stored == spent)))
            spent = np.maximum(stored, spent)  # never below what either says
        if not ok:
            shown = (
                f"{_show(stored)} spent but entries #0..#{n - 1} add up to {_show(spent)}"
                if self.kind in ("pure", "zcdp")
                else "a spent total that its entries do not add up to"
            )
            raise LedgerError(
                f"{where}: the state row says {shown} (state row edited); refusing to use "
                "this ledger"
            )
        if not same_digest(str(state.get("id")), self._id):
            raise LedgerError(
                f"{where}: the state row belongs to ledger {state.get('id')!r}, not to this "
                f"ledger {self._id} (moved from another ledger); refusing to use this ledger"
            )
        if not same_digest(str(state.get("tag")), state_digest(state, self._key)):
            keyed = " under the ledger's key" if self._key is not None else ""
            raise LedgerError(
                f"{where}: the state row's tag does not verify{keyed}: the state row was "
                "rewritten (e.g. entries cut from the end and the row set to match) or damaged; "
                "refusing to use this ledger"
            )
        return spent

    def _full_check(self, t: Transaction) -> Any:
        n, head, spent = self._walk(t.entries(), 0, self._genesis, self._initial())
        spent = self._check_state(t, n, head, spent)
        if t.count_entries() != n:  # pragma: no cover - entries() returned every row
            raise LedgerError(f"{self._store.describe()}: entry count changed while reading")
        self._n, self._head, self._verified = n, head, spent
        return spent

    def _sync(self, t: Transaction) -> Any:
        """Verify what other writers appended since we last looked; the verified spent total.

        The last verified link, the entries after it, the entry count and the state row are
        checked; any surprise falls back to a full verification that names the first bad entry.
        """
        n0, head0, spent0 = self._n, self._head, self._verified
        try:
            rows = t.entries(max(n0 - 1, 0))
            if n0 > 0:
                if not rows or rows[0].index != n0 - 1 or not same_digest(rows[0].hash, head0):
                    raise LedgerError("prefix changed")
                rows = rows[1:]
            n, head, spent = self._walk(rows, n0, head0, spent0)
            if t.count_entries() != n:
                raise LedgerError("entry count")
            spent = self._check_state(t, n, head, spent)
        except LedgerError:
            return self._full_check(t)  # raises with the first bad entry named
        self._n, self._head, self._verified = n, head, spent
        return spent

    def verify(self) -> bool:
        """Re-verify the whole chain and recompute the spent total from every entry's event.

        Returns True when the chain is intact and the stored state equals the recomputed
        total; raises :class:`LedgerError` naming the first bad entry otherwise.
        """
        self._store.read(self._full_check)
        return True

    # ------------------------------------------------------------------ spending
    def spend(
        self,
        event: Event,
        count: int = 1,
        *,
        label: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Receipt:
        """Charge ``count`` runs of ``event``, or raise BudgetExceededError (changing nothing).

        The ledger is verified first (see :meth:`verify`), and the entry is committed before
        this returns: release only after it does. With ``idempotency_key``, a spend whose key
        was already charged returns that entry's receipt (``replayed=True``) and charges
        nothing; the same key with a different event, count or label raises
        :class:`~renyi.ledger.IdempotencyConflictError`.
        """
        if self.period is not None:
            raise fail(
                "ledger",
                self.name,
                f"a period's bucket: this budget is renewed every {self.period} for that "
                f"period's data only; spend with budget.bucket(<the {self.period}>) (ledger "
                f"'{self.name}@<{self.period}>' of the service)",
            )
        return self._charge(
            event, count, label=label, metadata=metadata, idempotency_key=idempotency_key
        )

    def _charge(
        self,
        event: Event,
        count: int,
        *,
        label: str | None,
        metadata: dict[str, Any] | None,
        idempotency_key: str | None,
    ) -> Receipt:
        """:meth:`spend` without the time-bucket check (the buckets' own records use it)."""
        cost = self.cost(event, count)
        event_dict = event.to_dict()
        meta = _check_metadata(metadata)
        if label is not None and not isinstance(label, str):
            raise fail("label", label, "a string or None")
        if idempotency_key is not None:
            if not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= 200:
                raise fail("idempotency_key", idempotency_key, "a string of 1-200 characters")
            meta["idempotency_key"] = idempotency_key

        done: list[tuple[int, str, Any]] = []

        def txn_fn(txn: Transaction) -> Receipt:
            done.clear()
            spent = self._sync(txn)
            if idempotency_key is not None:
                prior = txn.find(idempotency_key)
                if prior is not None:
                    return self._replay(txn, prior, event, event_dict, count, label)
            new = spent + cost
            if not self._fits(new):
                raise BudgetExceededError(self._refusal(event, count, spent, cost))
            entry = LedgerEntry(
                index=self._n,
                time=now_iso(),
                event=event_dict,
                count=count,
                cost=self._cost_json(cost, spent),
                state_after=self._summary(new),
                label=label,
                metadata=meta,
            )
            digest = entry_digest(entry, self._head, self._key)
            entry = LedgerEntry(**{**entry.__dict__, "hash": digest})
            txn.append(entry, self._state_json(new, self._n + 1, digest), idempotency_key)
            done.append((self._n + 1, digest, new))
            return Receipt.of(entry, event)

        receipt = self._store.transaction(txn_fn)
        if done:
            self._n, self._head, self._verified = done[-1]  # committed
        return receipt

    def _replay(
        self,
        txn: Transaction,
        prior: LedgerEntry,
        event: Event,
        event_dict: dict[str, Any],
        count: int,
        label: str | None,
    ) -> Receipt:
        """The receipt of an entry charged earlier under the same idempotency key."""
        where = self._store.describe()
        key = prior.metadata.get("idempotency_key")
        if prior.event != event_dict or prior.count != count or prior.label != label:
            raise IdempotencyConflictError(
                f"{where}: idempotency key {key!r} already charged a different release "
                f"(entry #{prior.index}: {prior.count} x {prior.event.get('type')}, label "
                f"{prior.label!r}); use a new key for a new release"
            )
        # the entry is part of the verified chain: check its own link once more
        before = txn.entries(max(prior.index - 1, 0))
        prev = self._genesis if prior.index == 0 else before[0].hash if before else ""
        if prior.index >= self._n or not same_digest(
            prior.hash, entry_digest(prior, prev, self._key)
        ):
            raise LedgerError(
                f"{where}: entry #{prior.index} fails the hash chain; refusing to use this ledger"
            )
        return Receipt.of(prior, event, replayed=True)

    @contextmanager
    def release(
        self,
        event: Event,
        count: int = 1,
        *,
        label: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Iterator[Receipt]:
        """Context manager: charges on entry (refusing before the body runs), then yields.

        The charge stands even if the body raises: once noise may have been drawn, the
        privacy is spent.
        """
        yield self.spend(event, count, label=label, metadata=metadata)

    def quote(self, event: Event, count: int = 1) -> dict[str, Any]:
        """What ``spend(event, count)`` would cost now, in the user's units (no state change).

        Keys: ``fits``, and ``epsilon_spent``, ``epsilon_cost`` (the rise of ε spent at the
        budget's δ), ``epsilon_after``, ``epsilon_remaining`` (pure and (ε, δ) budgets), or
        the same with ``rho`` (zCDP). Infinite costs are ``inf``.
        """
        spent = self._spent()
        cost = self.cost(event, count)
        new = spent + cost
        out: dict[str, Any] = {"fits": bool(self._fits(new))}
        if self.kind in ("pure", "zcdp"):
            unit = "epsilon" if self.kind == "pure" else "rho"
            cap = self._cap()
            out.update(
                {
                    f"{unit}_spent": _flt(spent),
                    f"{unit}_cost": _flt(cost),
                    f"{unit}_after": _flt(new),
                    f"{unit}_remaining": _flt(max(cap - spent, Fraction(0))),
                }
            )
        elif self.kind == "approx":
            eps0, eps1 = self._epsilon_of(spent), self._epsilon_of(new)
            target = float(self._spec["epsilon"])
            out.update(
                {
                    "epsilon_spent": eps0,
                    "epsilon_cost": eps1 - eps0,
                    "epsilon_after": eps1,
                    "epsilon_remaining": max(target - eps0, 0.0),
                    "delta": float(self._spec["delta"]),
                }
            )
        return out

    def entries_since(self, start: int) -> list[LedgerEntry]:
        """The entries from index ``start`` on, each checked against its link of the chain.

        Cheap for a dashboard that keeps the entries it already has: the chain is verified
        from the last verified entry as :meth:`spend` does, and every returned entry is
        checked against its predecessor's link. :meth:`entries` re-verifies everything.
        """
        start = check_int("start", start, 0)
        out: list[LedgerEntry] = []

        def fn(t: Transaction) -> None:
            self._sync(t)
            n, where = self._n, self._store.describe()
            if start >= n:
                return
            rows = t.entries(max(start - 1, 0))
            prev = self._genesis
            if start > 0:
                if not rows or rows[0].index != start - 1:
                    raise LedgerError(f"{where}: entry #{start - 1} is missing")
                prev, rows = rows[0].hash, rows[1:]
            for e in rows[: n - start]:
                if not same_digest(e.hash, entry_digest(e, prev, self._key)):
                    raise LedgerError(
                        f"{where}: entry #{e.index} fails the hash chain; refusing to use this "
                        "ledger"
                    )
                prev = e.hash
                out.append(e)

        self._store.read(fn)
        return out

    def _spent(self) -> Any:
        """The verified spent total now (re-reading what other writers appended)."""
        return self._store.read(self._sync)

    def spent(self) -> Any:
        """The verified spent total in the budget's currency: an exact ``Fraction`` (pure ε,
        zCDP ρ) or the per-order RDP array of an (ε, δ) or curve budget."""
        value = self._spent()
        return value.copy() if isinstance(value, np.ndarray) else value

    def can_spend(self, event: Event, count: int = 1) -> bool:
        """Whether ``spend(event, count)`` would succeed now (no state change)."""
        return bool(self._fits(self._spent() + self.cost(event, count)))

    def _refusal(self, event: Event, count: int, spent: Any, cost: Any) -> str:
        asked = f"{count} x {type(event).__name__}" if count != 1 else type(event).__name__
        if self.kind in ("pure", "zcdp"):
            unit = "epsilon" if self.kind == "pure" else "rho"
            cap = self._cap()
            return (
                f"refused {asked}: it costs {unit}={_show(cost)} but only "
                f"{unit}={_show(max(cap - spent, Fraction(0)))} of {_show(cap)} remains "
                f"({_show(spent)} spent)"
            )
        left = self._limit - spent
        j = int(np.argmax(left - cost))
        detail = (
            f"closest Rényi order {self._orders[j]:g}: costs {cost[j]:.6g}, "
            f"{max(left[j], 0):.6g} remains"
        )
        if self.kind == "approx":
            target = float(self._spec["epsilon"])
            eps0 = self._epsilon_of(spent)
            eps1 = self._epsilon_of(spent + cost)
            return (
                f"refused {asked}: it would raise epsilon spent from {eps0:.4g} to {eps1:.4g} "
                f"(costs {eps1 - eps0:.4g}) at delta={self._spec['delta']:g}, but only "
                f"{max(target - eps0, 0.0):.4g} of epsilon={target:g} remains ({detail})"
            )
        return f"refused {asked}: no order of the budget curve stays within its limit ({detail})"

    # ------------------------------------------------------------------ queries
    def remaining(self) -> Any:
        """What is left: ε (pure), ρ (zCDP) as floats, or per-order RDP budget (an RdpCurve)."""
        spent = self._spent()
        if self.kind in ("pure", "zcdp"):
            return float(max(self._cap() - spent, Fraction(0)))
        return RdpCurve(self._orders, np.clip(self._limit - spent, 0.0, None))

    def max_count(self, event: Event, *, limit: int = 10**12) -> int:
        """How many more runs of ``event`` fit (e.g. DP-SGD steps of a given configuration)."""
        spent = self._spent()
        unit = self.cost(event)
        if self.kind in ("pure", "zcdp"):
            if unit == 0:
                return limit
            k = max(int((self._cap() - spent) / unit), 0) if unit < _INF else 0
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                per = np.where(unit > 0, (self._limit - spent) / unit, np.inf)
            best = float(np.max(per))
            k = limit if math.isinf(best) else max(math.floor(best), 0)
        k = min(k, limit)
        # the floating-point estimate is verified exactly and stepped down if needed
        while k > 0 and not self._fits(spent + self.cost(event, k)):
            k -= 1
        return k

    def largest(
        self, build: Callable[[float], Event], lo: float, hi: float, *, rtol: float = 1e-6
    ) -> float | None:
        """Largest x in [lo, hi] with ``build(x)`` still fitting (cost increasing in x).

        E.g. the largest ε of a next Laplace release:
        ``budget.largest(lambda e: LaplaceEvent(1 / e), 1e-6, 100)``. None if even ``lo``
        does not fit.
        """
        spent = self._spent()

        def ok(x: float) -> bool:
            return self._fits(spent + self.cost(build(x)))

        if not ok(lo):
            return None
        if ok(hi):
            return hi
        while hi - lo > rtol * hi:
            mid = math.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def entries(self) -> list[LedgerEntry]:
        """Every recorded release, in order (verified against the hash chain)."""
        out: list[LedgerEntry] = []

        def fn(t: Transaction) -> None:
            self._full_check(t)
            out.extend(t.entries())

        self._store.read(fn)
        return out

    def events(self) -> list[tuple[Event, int]]:
        """Recorded (event, count) pairs, deserialised."""
        return [(from_dict(e.event), e.count) for e in self.entries()]

    def accountant(self) -> RdpAccountant:
        """An RDP accountant rebuilt from the ledger (same composition, same order)."""
        orders = self._orders if self.kind in ("approx", "rdp") else DEFAULT_ORDERS
        acc = RdpAccountant(orders)
        for event, count in self.events():
            acc.compose(event, count)
        return acc

    def spent_epsilon(self) -> float:
        """ε spent so far: the pure ε spent, or for (ε, δ) budgets ε at the budget's δ.

        For (ε, δ) budgets this is Mironov's conversion over the budget's fixed grid of
        orders: the same bound the filter enforces, so it never exceeds the target.
        """
        spent = self._spent()
        if self.kind == "pure":
            return float(spent)
        if self.kind == "approx":
            return self._epsilon_of(spent)
        raise PrivacyParameterError(
            f"spent_epsilon is defined for pure and (ε, δ) budgets, not {self.kind}"
        )

    def status(self) -> dict[str, Any]:
        """The budget in the user's units: what was spent and what is left.

        Keys: ``kind``, ``name`` and ``id`` (the ledger's name in its store and its unique
        id), ``releases`` (entries recorded), ``head`` (the chain head) and, by
        kind, ``epsilon``/``delta`` (the target), ``epsilon_spent``, ``epsilon_remaining``
        (pure and (ε, δ)), ``rho``, ``rho_spent``, ``rho_remaining`` (zCDP), ``order`` (the
        Rényi order giving the (ε, δ) figure) and ``orders_within_budget``.
        """
        spent = self._spent()
        out: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "id": self._id,
            "releases": self._n,
            "head": self._head,
        }
        if self.kind in ("pure", "zcdp"):
            unit = "epsilon" if self.kind == "pure" else "rho"
            cap = self._cap()
            out[unit] = float(self._spec[unit])
            out[f"{unit}_spent"] = float(spent)
            out[f"{unit}_remaining"] = float(max(cap - spent, Fraction(0)))
            out[f"{unit}_spent_exact"] = _show(spent)
            return out
        summary = self._summary(spent)
        out["order"] = summary["best_order"]
        out["orders_within_budget"] = summary["orders_within_budget"]
        if self.kind == "approx":
            eps = self._epsilon_of(spent)
            out["epsilon"] = float(self._spec["epsilon"])
            out["delta"] = float(self._spec["delta"])
            out["epsilon_spent"] = eps
            out["epsilon_remaining"] = max(float(self._spec["epsilon"]) - eps, 0.0)
        return out


def _make_spec(
    epsilon: float | None,
    delta: float | None,
    rho: float | None,
    curve: RdpCurve | None,
    orders: ArrayLike,
) -> dict[str, Any]:
    given = [
        name for name, v in (("epsilon", epsilon), ("rho", rho), ("curve", curve)) if v is not None
    ]
    if len(given) != 1:
        raise PrivacyParameterError(
            "give exactly one of epsilon (optionally with delta), rho or curve; "
            f"got {given or 'none'}"
        )
    if rho is not None:
        if delta is not None:
            raise fail("delta", delta, "None for a rho budget (convert at query time)")
        return {"kind": "zcdp", "rho": check_positive("rho", rho)}
    if curve is not None:
        if not isinstance(curve, RdpCurve):
            raise fail("curve", curve, "an RdpCurve")
        return {
            "kind": "rdp",
            "orders": _enc(np.asarray(curve.orders)),
            "limit": _enc(np.asarray(curve.epsilons)),
        }
    eps = check_positive("epsilon", epsilon)
    if delta is None:
        return {"kind": "pure", "epsilon": eps}
    d = check_delta(delta)
    grid = check_orders(orders)
    limit = eps - math.log(1.0 / d) / (grid - 1.0)  # Mironov 2017, Prop. 3 inverted
    if not np.any(limit > 0):
        raise PrivacyParameterError(
            f"epsilon={eps!r} at delta={d!r} leaves no positive RDP budget at any order up to "
            f"{grid.max():g}: raise epsilon or delta, or add larger orders"
        )
    return {
        "kind": "approx",
        "epsilon": eps,
        "delta": d,
        "orders": _enc(grid),
        "limit": _enc(limit),
    }
