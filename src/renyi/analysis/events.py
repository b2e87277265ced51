"""Immutable, serialisable descriptions of what was released.

An *event* says which mechanism ran, with which parameters, under which neighbouring
relation, and it is the one place that knows how to analyse one run of it: its RDP curve
(:meth:`Event.rdp_epsilons`), its zCDP ρ (:meth:`Event.zcdp_rho`), its privacy loss
distributions (:meth:`Event.pld_pair`) and its (ε, δ) guarantees
(:meth:`Event.approx_dp_guarantees`). Accountants (``renyi.accountants``) ask the event and
add the answers up; an analysis an event does not have raises
:class:`~renyi.errors.UnsupportedEventError`. Adding a mechanism is adding one event class
(``docs/architecture.md``, "Adding an event"). Events are frozen dataclasses validated when
they are built, so an accountant never sees a malformed one, and they round-trip through
JSON (``event.to_json()`` / ``renyi.analysis.events.from_json``) so that a ledger can store them.

Example::

    >>> from renyi.events import GaussianEvent, PoissonSampledEvent, SelfComposedEvent, from_json
    >>> step = PoissonSampledEvent(sampling_rate=0.01, event=GaussianEvent(noise_multiplier=1.1))
    >>> training = SelfComposedEvent(step, count=1000)
    >>> from_json(training.to_json()) == training
    True

Units: ``noise_multiplier`` is σ / (L2 sensitivity); ``LaplaceEvent.scale`` is b / (L1
sensitivity). Discrete mechanisms carry an explicit integer-valued ``sensitivity``.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

import numpy as np
from numpy.typing import NDArray

from renyi._validation import (
    check_int,
    check_nonnegative,
    check_orders,
    check_positive,
    check_probability,
    check_range,
    fail,
)
from renyi.analysis import closed_forms, conversions, subsampling
from renyi.errors import PrivacyParameterError, UnsupportedEventError

if TYPE_CHECKING:
    from renyi.analysis.pld import PrivacyLossDistribution

    PldPair = tuple[PrivacyLossDistribution, PrivacyLossDistribution]

__all__ = [
    "SAMPLINGS",
    "ApproxDpEvent",
    "ComposedEvent",
    "CustomEvent",
    "DiscreteGaussianEvent",
    "DiscreteLaplaceEvent",
    "Event",
    "GaussianEvent",
    "Guarantee",
    "LaplaceEvent",
    "Neighbouring",
    "PoissonSampledEvent",
    "PoissonSampledGroupEvent",
    "PureDpEvent",
    "RandomAllocationEvent",
    "RandomizedResponseEvent",
    "RdpEvent",
    "RepeatAndSelectEvent",
    "SampledWithoutReplacementEvent",
    "Sampling",
    "SelfComposedEvent",
    "ShuffledEvent",
    "TruncatedPoissonSampledEvent",
    "ZcdpEvent",
    "default_max_batch_size",
    "dpsgd_event",
    "from_dict",
    "from_json",
    "training_event",
]


class Neighbouring(StrEnum):
    """The neighbouring relation an event's guarantee is stated under.

    ``ADD_REMOVE``: datasets differ by adding or removing one record (the relation of
    Poisson subsampling and of DP-SGD's usual analysis). ``REPLACE_ONE``: same size, one
    record replaced (the relation of sampling without replacement). A guarantee under one
    does not transfer to the other for free, so accountants refuse to mix them.
    """

    ADD_REMOVE = "add_remove"
    REPLACE_ONE = "replace_one"


_REGISTRY: dict[str, type[Event]] = {}

# The two adjacency directions of a PLD: ``remove`` (the record is in the first dataset) and
# ``add`` (in the second); :meth:`Event.pld_pair` returns them in this order.
DIRECTIONS = ("remove", "add")

Guarantee = tuple[float, float]
"""An (ε, δ) guarantee of one run, as :meth:`Event.approx_dp_guarantees` counts them."""


def _times(count: int, eps: NDArray[np.float64]) -> NDArray[np.float64]:
    # 0 * inf is NaN in IEEE arithmetic; zero runs cost nothing.
    return np.zeros_like(eps) if count == 0 else count * eps


def _neighbouring(value: Any) -> Neighbouring:
    try:
        return Neighbouring(value)
    except ValueError:
        raise fail("neighbouring", value, "'add_remove' or 'replace_one'") from None


class Event(ABC):
    """Base class of release descriptions. Subclasses are frozen dataclasses."""

    kind: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if isinstance(kind, str):
            _REGISTRY[kind] = cls

    @property
    @abstractmethod
    def neighbouring(self) -> Neighbouring:
        """The neighbouring relation of this event (checked consistent for composites)."""

    def children(self) -> tuple[Event, ...]:
        """Directly nested events (empty for a leaf)."""
        return ()

    def walk(self) -> Iterator[Event]:
        """This event and every nested event, depth first."""
        yield self
        for child in self.children():
            yield from child.walk()

    # ------------------------------------------------------------------ analyses
    # Each event class overrides the analyses it has; the defaults say it has none. The
    # accountants call only these four methods (docs/architecture.md, "Adding an event").

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """RDP ε(α) of one run at ``orders`` (validated by the caller: float64, > 1).

        An upper bound on D_α at every order (+inf allowed, never NaN).
        """
        raise UnsupportedEventError(f"RdpAccountant cannot analyse {type(self).__name__}")

    def zcdp_rho(self) -> float:
        """ρ such that one run is ρ-zCDP (Bun & Steinke 2016; an upper bound)."""
        raise UnsupportedEventError(f"ZcdpAccountant cannot analyse {type(self).__name__}")

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        """Privacy loss distributions (remove, add) of one run (the same object twice when
        the event is symmetric), discretised with the given interval and tail mass.

        ``max_bins`` caps the FFT windows of self-compositions inside the event
        (:meth:`renyi.analysis.pld.PrivacyLossDistribution.self_compose`).
        """
        raise UnsupportedEventError(f"PldAccountant cannot analyse {type(self).__name__}")

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        """The (ε, δ) guarantees of one run, as a multiset {(ε, δ): count}."""
        raise UnsupportedEventError(
            f"ApproxDpAccountant cannot analyse {type(self).__name__}: it has no single (ε, δ) "
            "guarantee (use the RDP or PLD accountant)"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict with a ``"type"`` key; inverse of :func:`from_dict`."""
        out: dict[str, Any] = {"type": self.kind}
        for f in fields(self):  # type: ignore[arg-type]
            out[f.name] = _encode(getattr(self, f.name))
        return out

    def to_json(self) -> str:
        """Serialise to a JSON string (strict JSON: infinities are written as strings)."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)


def _check_inner(event: Any, relation: Neighbouring, why: str | None = None) -> None:
    """Refuse an inner ``event`` that is not an Event under the wrapper's relation."""
    if not isinstance(event, Event):
        raise fail("event", event, "an Event")
    if event.neighbouring is not relation:
        reason = f" ({why})" if why else ""
        raise fail("event.neighbouring", event.neighbouring.value, f"'{relation.value}'{reason}")


def _encode(value: Any) -> Any:
    if isinstance(value, Event):
        return value.to_dict()
    if isinstance(value, Neighbouring):
        return value.value
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _decode_float(value: Any) -> Any:
    if value == "inf":
        return math.inf
    return value


def from_dict(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from :meth:`Event.to_dict` output (validating every field)."""
    if not isinstance(data, Mapping) or "type" not in data:
        raise fail("data", data, "a mapping with a 'type' key produced by Event.to_dict()")
    kind = data["type"]
    cls = _REGISTRY.get(kind)
    if cls is None or cls is CustomEvent:
        raise fail("type", kind, f"one of {sorted(k for k in _REGISTRY if k != 'custom')}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "type":
            continue
        if isinstance(value, Mapping):
            kwargs[key] = from_dict(value)
        elif key == "events":
            kwargs[key] = tuple(from_dict(v) for v in value)
        elif key in ("orders", "epsilons"):
            kwargs[key] = tuple(_decode_float(v) for v in value)
        else:
            kwargs[key] = _decode_float(value)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise fail("data", dict(data), f"the fields of {cls.__name__} ({exc})") from None


def from_json(text: str) -> Event:
    """Rebuild an event from :meth:`Event.to_json` output."""
    try:
        data = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise fail("text", text, f"a JSON event description ({exc})") from None
    return from_dict(data)


# ----------------------------------------------------------------------------- leaves


@dataclass(frozen=True)
class GaussianEvent(Event):
    """Gaussian noise N(0, σ²) on a query of L2 sensitivity Δ; ``noise_multiplier`` = σ / Δ."""

    noise_multiplier: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE  # type: ignore[misc]
    kind: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", check_positive("noise_multiplier", self.noise_multiplier)
        )
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return closed_forms.gaussian_rdp(self.noise_multiplier, orders)

    def zcdp_rho(self) -> float:
        return 0.5 / self.noise_multiplier / self.noise_multiplier  # no overflow: 1e-300 gives inf

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        from renyi.analysis.pld import PrivacyLossDistribution as P

        g = P.gaussian(
            self.noise_multiplier,
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
        )
        return g, g


@dataclass(frozen=True)
class LaplaceEvent(Event):
    """Laplace noise of scale b, query of L1 sensitivity Δ₁; ``scale`` = b / Δ₁ (ε = 1/scale)."""

    scale: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE  # type: ignore[misc]
    kind: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", check_positive("scale", self.scale))
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return closed_forms.laplace_rdp(self.scale, orders)

    def zcdp_rho(self) -> float:
        return conversions.pure_to_zcdp(1.0 / self.scale)

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        from renyi.analysis.pld import PrivacyLossDistribution as P

        lap = P.laplace(
            self.scale,
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
        )
        return lap, lap

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        return Counter({(1.0 / self.scale, 0.0): 1})


@dataclass(frozen=True)
class RandomizedResponseEvent(Event):
    """Binary randomized response: the true bit with probability ``p`` in [1/2, 1]."""

    p: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE  # type: ignore[misc]
    kind: ClassVar[str] = "randomized_response"

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_range("p", self.p, 0.5, 1.0))
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return closed_forms.randomized_response_rdp(self.p, orders)

    def zcdp_rho(self) -> float:
        if self.p == 1.0:
            return float("inf")
        return conversions.pure_to_zcdp(math.log(self.p / (1.0 - self.p)))

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        from renyi.analysis.pld import PrivacyLossDistribution as P

        rr = P.randomized_response(
            self.p,
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
        )
        return rr, rr

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        eps = math.inf if self.p == 1.0 else math.log(self.p / (1.0 - self.p))
        return Counter({(eps, 0.0): 1})


@dataclass(frozen=True)
class DiscreteGaussianEvent(Event):
    """Discrete Gaussian N_Z(0, σ²) on an integer query of L2 sensitivity ``sensitivity``.

    Canonne, Kamath & Steinke 2020, Thm. 4: (Δ² / (2σ²))-zCDP, like the continuous one.
    """

    sigma: float
    sensitivity: float = 1.0
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE  # type: ignore[misc]
    kind: ClassVar[str] = "discrete_gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", check_positive("sigma", self.sigma))
        object.__setattr__(self, "sensitivity", check_positive("sensitivity", self.sensitivity))
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        # Canonne, Kamath & Steinke 2020, Thm. 4: (Δ²/(2σ²))-zCDP, i.e. ε(α) = α Δ² / (2σ²).
        return closed_forms.gaussian_rdp(self.sigma / self.sensitivity, orders)

    def zcdp_rho(self) -> float:
        return 0.5 * (self.sensitivity / self.sigma) ** 2  # Canonne, Kamath & Steinke, Thm. 4

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        from renyi.analysis.pld import PrivacyLossDistribution as P

        if self.sensitivity != int(self.sensitivity):
            raise UnsupportedEventError("discrete Gaussian PLD needs an integer sensitivity")
        dg = P.discrete_gaussian(
            self.sigma,
            int(self.sensitivity),
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
        )
        return dg, dg


@dataclass(frozen=True)
class DiscreteLaplaceEvent(Event):
    """Discrete Laplace with P[x] ∝ exp(-|x| / scale) on an integer query of L1 sensitivity Δ₁.

    (Δ₁ / scale)-DP (Canonne, Kamath & Steinke 2020, §2).
    """

    scale: float
    sensitivity: float = 1.0
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE  # type: ignore[misc]
    kind: ClassVar[str] = "discrete_laplace"

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", check_positive("scale", self.scale))
        object.__setattr__(self, "sensitivity", check_positive("sensitivity", self.sensitivity))
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return conversions.pure_to_rdp(self.sensitivity / self.scale, orders)

    def zcdp_rho(self) -> float:
        return conversions.pure_to_zcdp(self.sensitivity / self.scale)

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        from renyi.analysis.pld import PrivacyLossDistribution as P

        if self.sensitivity != int(self.sensitivity):
            raise UnsupportedEventError("discrete Laplace PLD needs an integer sensitivity")
        dl = P.discrete_laplace(
            self.scale,
            int(self.sensitivity),
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
        )
        return dl, dl

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        return Counter({(self.sensitivity / self.scale, 0.0): 1})


@dataclass(frozen=True)
class PureDpEvent(Event):
    """A mechanism known only to be ε-DP."""

    epsilon: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE  # type: ignore[misc]
    kind: ClassVar[str] = "pure_dp"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_nonnegative("epsilon", self.epsilon))
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return conversions.pure_to_rdp(self.epsilon, orders)

    def zcdp_rho(self) -> float:
        return conversions.pure_to_zcdp(self.epsilon)

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        from renyi.analysis.pld import PrivacyLossDistribution as P

        pure = P.approx_dp(
            self.epsilon,
            0.0,
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
        )
        return pure, pure

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        return Counter({(self.epsilon, 0.0): 1})


@dataclass(frozen=True)
class ApproxDpEvent(Event):
    """A mechanism known only to be (ε, δ)-DP (δ in [0, 1))."""

    epsilon: float
    delta: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE  # type: ignore[misc]
    kind: ClassVar[str] = "approx_dp"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_nonnegative("epsilon", self.epsilon))
        delta = check_probability("delta", self.delta)
        if delta >= 1.0:
            raise fail("delta", self.delta, "a number in [0, 1)")
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        if self.delta == 0.0:
            return conversions.pure_to_rdp(self.epsilon, orders)
        raise UnsupportedEventError(
            f"an (ε, δ)-DP guarantee with delta={self.delta!r} > 0 implies no RDP bound; "
            "use the ApproxDpAccountant, or describe the mechanism itself (e.g. GaussianEvent)"
        )

    def zcdp_rho(self) -> float:
        if self.delta == 0.0:
            return conversions.pure_to_zcdp(self.epsilon)
        raise UnsupportedEventError(
            f"an (ε, δ)-DP guarantee with delta={self.delta!r} > 0 implies no zCDP bound"
        )

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        from renyi.analysis.pld import PrivacyLossDistribution as P

        ad = P.approx_dp(
            self.epsilon,
            self.delta,
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
        )
        return ad, ad

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        return Counter({(self.epsilon, self.delta): 1})


@dataclass(frozen=True)
class ZcdpEvent(Event):
    """A mechanism known only to be ρ-zCDP (Bun & Steinke 2016)."""

    rho: float
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE  # type: ignore[misc]
    kind: ClassVar[str] = "zcdp"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", check_nonnegative("rho", self.rho))
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return conversions.zcdp_to_rdp(self.rho, orders)

    def zcdp_rho(self) -> float:
        return self.rho


@dataclass(frozen=True)
class RdpEvent(Event):
    """A mechanism known by its RDP curve ε(α) at the given orders (Mironov 2017, Def. 4).

    Between and beyond the given orders the accountant uses only what monotonicity of ε(α)
    in α proves: the value at the next given order at or above, +inf above the largest.
    """

    orders: tuple[float, ...]
    epsilons: tuple[float, ...]
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE  # type: ignore[misc]
    kind: ClassVar[str] = "rdp"

    def __post_init__(self) -> None:
        raw = np.asarray(self.orders, dtype=np.float64) if len(self.orders) else np.array([])
        orders = check_orders(raw)
        if orders.size != raw.size:
            raise fail("orders", self.orders, "distinct orders > 1")
        try:
            eps = np.asarray(self.epsilons, dtype=np.float64)
        except (TypeError, ValueError):
            raise fail("epsilons", self.epsilons, "real numbers >= 0 (inf allowed)") from None
        if eps.shape != raw.shape:
            raise fail("epsilons", self.epsilons, f"{raw.size} values, one per order")
        if np.isnan(eps).any() or (eps < 0).any():
            raise fail("epsilons", self.epsilons, "real numbers >= 0 (inf allowed), no NaN")
        order_idx = np.argsort(raw)
        object.__setattr__(self, "orders", tuple(float(x) for x in raw[order_idx]))
        object.__setattr__(self, "epsilons", tuple(float(x) for x in eps[order_idx]))
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))

    @classmethod
    def from_curve(
        cls, curve: Any, neighbouring: Neighbouring = Neighbouring.ADD_REMOVE
    ) -> RdpEvent:
        """Build from an object with ``orders`` and ``epsilons`` arrays (e.g. ``RdpCurve``)."""
        return cls(
            tuple(np.asarray(curve.orders).tolist()),
            tuple(np.asarray(curve.epsilons).tolist()),
            neighbouring,
        )

    def rdp_at(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """ε at ``orders``, conservatively: value at the next known order ≥ α, else +inf."""
        known = np.asarray(self.orders)
        eps = np.asarray(self.epsilons)
        idx = np.searchsorted(known, orders, side="left")
        out = np.full(orders.shape, math.inf)
        inside = idx < known.size
        out[inside] = eps[idx[inside]]
        return out

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.rdp_at(orders)


@dataclass(frozen=True, eq=False)
class CustomEvent(Event):
    """A user-defined mechanism, known by a function giving its RDP at any orders.

    ``rdp(orders: ndarray) -> ndarray`` must return an upper bound on D_α for every order
    (vectorised). ``pld`` optionally returns a privacy loss distribution for the PLD
    accountant. Custom events cannot be serialised (code is not data): register a
    serialisable event or use :class:`RdpEvent` for ledgers.
    """

    name: str
    rdp: Callable[[NDArray[np.float64]], NDArray[np.float64]]
    pld: Callable[..., Any] | None = None
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE  # type: ignore[misc]
    kind: ClassVar[str] = "custom"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise fail("name", self.name, "a non-empty string")
        if not callable(self.rdp):
            raise fail("rdp", self.rdp, "a callable orders -> epsilons")
        if self.pld is not None and not callable(self.pld):
            raise fail("pld", self.pld, "None or a callable returning a PLD")
        object.__setattr__(self, "neighbouring", _neighbouring(self.neighbouring))

    def to_dict(self) -> dict[str, Any]:
        raise UnsupportedEventError(
            f"CustomEvent {self.name!r} cannot be serialised: use RdpEvent with its curve instead"
        )

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        out = np.asarray(self.rdp(orders.copy()), dtype=np.float64)
        if out.shape != orders.shape or np.isnan(out).any() or (out < 0).any():
            raise PrivacyParameterError(
                f"CustomEvent {self.name!r}: rdp(orders) must return {orders.size} values >= 0 "
                "(inf allowed, no NaN), one per order"
            )
        return out

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        from renyi.analysis.pld import PrivacyLossDistribution

        if self.pld is None:
            raise UnsupportedEventError(
                f"CustomEvent {self.name!r} has no pld: pass pld=callable(direction, "
                "value_discretization_interval) to use the PLD accountant"
            )
        pair = tuple(self.pld(d, value_discretization_interval) for d in DIRECTIONS)
        if not all(isinstance(p, PrivacyLossDistribution) for p in pair):
            raise UnsupportedEventError(
                f"CustomEvent {self.name!r}: pld must return PrivacyLossDistribution objects"
            )
        return pair[0], pair[1]


# ------------------------------------------------------------------------- composites


@dataclass(frozen=True)
class PoissonSampledEvent(Event):
    """``event`` run on a Poisson subsample: each record kept independently w.p. ``sampling_rate``.

    Analysed under add/remove neighbouring (Mironov, Talwar & Zhang 2019).
    """

    sampling_rate: float
    event: Event
    kind: ClassVar[str] = "poisson_sampled"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "sampling_rate", check_probability("sampling_rate", self.sampling_rate)
        )
        _check_inner(
            self.event,
            Neighbouring.ADD_REMOVE,
            "Poisson subsampling is analysed under add/remove neighbours",
        )

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.ADD_REMOVE

    def children(self) -> tuple[Event, ...]:
        return (self.event,)

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        inner = self.event
        q = self.sampling_rate
        if isinstance(inner, GaussianEvent):
            return subsampling.poisson_subsampled_gaussian_rdp(q, inner.noise_multiplier, orders)
        # Zhu & Wang 2019, Thm 6: any mechanism, from its RDP at integer orders
        return subsampling.poisson_subsampled_rdp(inner.rdp_epsilons, q, orders)

    def zcdp_rho(self) -> float:
        # No amplification in zCDP: sampling never increases Rényi divergence (quasi-convexity).
        return 0.0 if self.sampling_rate == 0.0 else self.event.zcdp_rho()

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        from renyi.analysis.pld import PrivacyLossDistribution as P

        kw: dict[str, Any] = {
            "value_discretization_interval": value_discretization_interval,
            "tail_mass": tail_mass,
        }
        inner = self.event
        if isinstance(inner, GaussianEvent):
            if self.sampling_rate == 0.0:
                ident = P.identity(**kw)
                return ident, ident
            return (
                P.subsampled_gaussian(
                    self.sampling_rate, inner.noise_multiplier, direction="remove", **kw
                ),
                P.subsampled_gaussian(
                    self.sampling_rate, inner.noise_multiplier, direction="add", **kw
                ),
            )
        raise UnsupportedEventError(
            f"PldAccountant analyses Poisson subsampling of the Gaussian only, not of "
            f"{type(inner).__name__} (use the RDP accountant)"
        )

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        out: Counter[Guarantee] = Counter()
        for (eps, delta), n in self.event.approx_dp_guarantees().items():
            out[subsampling.amplify_approx_dp_poisson(eps, delta, self.sampling_rate)] += n
        return out


@dataclass(frozen=True)
class SampledWithoutReplacementEvent(Event):
    """``event`` run on a uniformly random subset of exactly ``sample_size`` of ``population_size``.

    The neighbouring relation is the inner event's. Replace-one (the usual one for this
    sampler): Wang, Balle & Kasiviswanathan 2019 (RDP) and a symmetrised Poisson pair (PLD).
    Add/remove (the inner event's guarantee is about one record added or removed; the
    population is the larger of the two datasets): with ``q = sample_size /
    population_size`` the record is in the batch w.p. ``q``; a batch without it is coupled
    to one with it by swapping it for a uniform other record, so given the rest of the
    batch and that record the pair is ``((1-q) N(a) + q N(a'), N(a))`` with ``a, a'`` one
    *replace-one* sensitivity (two add/remove ones) apart. Joint convexity over the
    coupling bounds every divergence by that of the Poisson-subsampled pair at rate ``q``
    and twice the sensitivity, i.e. :class:`PoissonSampledEvent` ``(q, inner at σ/2)``;
    the bound is attained (all other records' contributions equal and opposite to the
    record's), so nothing is lost. For ``(ε, δ)`` inner guarantees: group privacy of two
    records, then the Poisson amplification (Balle, Barthe & Gaboardi 2018).

    >>> from renyi.accountants import PldAccountant
    >>> ar = SampledWithoutReplacementEvent(60000, 256, GaussianEvent(1.1))
    >>> eps = PldAccountant().compose(ar, 1000).epsilon(1e-5).epsilon
    >>> same = PoissonSampledEvent(256 / 60000, GaussianEvent(0.55))
    >>> eps == PldAccountant().compose(same, 1000).epsilon(1e-5).epsilon
    True
    """

    population_size: int
    sample_size: int
    event: Event
    kind: ClassVar[str] = "sampled_without_replacement"

    def __post_init__(self) -> None:
        n = check_int("population_size", self.population_size, 1)
        m = check_int("sample_size", self.sample_size, 1)
        if m > n:
            raise fail("sample_size", m, f"an integer in [1, population_size={n}]")
        if not isinstance(self.event, Event):
            raise fail("event", self.event, "an Event")

    @property
    def neighbouring(self) -> Neighbouring:
        return self.event.neighbouring

    @property
    def sampling_rate(self) -> float:
        return self.sample_size / self.population_size

    def _add_remove(self) -> PoissonSampledEvent | None:
        """The dominating Poisson pair under add/remove (class docstring); ``None`` under
        replace-one or for a non-Gaussian inner event."""
        inner = self.event
        if inner.neighbouring is Neighbouring.REPLACE_ONE or not isinstance(inner, GaussianEvent):
            return None
        return PoissonSampledEvent(self.sampling_rate, GaussianEvent(inner.noise_multiplier / 2))

    def children(self) -> tuple[Event, ...]:
        return (self.event,)

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        inner = self.event
        poisson = self._add_remove()
        if poisson is not None:
            return poisson.rdp_epsilons(orders)
        if isinstance(inner, GaussianEvent):
            # Wang, Balle & Kasiviswanathan 2019, Thm 9 (replace-one neighbours)
            return subsampling.sampled_without_replacement_gaussian_rdp(
                self.population_size, self.sample_size, inner.noise_multiplier, orders
            )
        raise UnsupportedEventError(
            "sampling without replacement is analysed for the Gaussian mechanism only; "
            f"got {type(inner).__name__}"
        )

    def zcdp_rho(self) -> float:
        # No amplification in zCDP: sampling never increases Rényi divergence (quasi-convexity);
        # under add/remove the coupled pair is two records apart (group privacy: 4 rho).
        if self.sampling_rate == 0.0:
            return 0.0
        group = 4.0 if self.neighbouring is Neighbouring.ADD_REMOVE else 1.0
        return group * self.event.zcdp_rho()

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        """Add/remove: the dominating Poisson pair (class docstring). Replace-one: one
        symmetric PLD (:func:`renyi.analysis.sampled_pld.symmetrised_sampled_gaussian_pld`).

        Whether record ``i`` is in the batch (probability ``q = m/n``) has the same law in
        both worlds, and a batch without ``i`` is coupled to one with ``i`` by swapping ``i``
        for a uniform other record ``j``; given the rest ``R`` and ``j`` the outputs are
        ``(1-q) N(c) + q N(a)`` against ``(1-q) N(c) + q N(a')`` with the three means
        pairwise within one replace-one sensitivity. Joint convexity over ``(R, j)``, the
        advanced joint convexity of Balle, Barthe & Gaboardi 2018 (Thm 2) and joint
        convexity again bound ``H_γ`` for ``γ >= 1`` by ``q H_{γ''}(N(1)||N(0))``, which is
        exactly ``H_γ`` of the Poisson-subsampled pair ``((1-q) N(0) + q N(1), N(0))``
        (attained when ``a' = c``); for ``γ < 1`` the reversed pair gives the bound. Full
        batch (``m = n``): the Gaussian with the replace-one sensitivity."""
        inner = _gaussian_inner(self.event, "sampling without replacement")
        poisson = self._add_remove()
        if poisson is not None:
            return poisson.pld_pair(
                value_discretization_interval=value_discretization_interval,
                tail_mass=tail_mass,
                max_bins=max_bins,
            )
        from renyi.analysis.sampled_pld import symmetrised_sampled_gaussian_pld

        pld = symmetrised_sampled_gaussian_pld(
            self.sampling_rate,
            inner.noise_multiplier,
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
        )
        return pld, pld

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        wor: Counter[Guarantee] = Counter()
        add_remove = self.neighbouring is Neighbouring.ADD_REMOVE
        for (eps, delta), n in self.event.approx_dp_guarantees().items():
            if add_remove:  # two records apart, then amplified like Poisson at rate q
                eps2, delta2 = 2.0 * eps, min((1.0 + math.exp(min(eps, 700.0))) * delta, 1.0)
                amp = subsampling.amplify_approx_dp_poisson(eps2, delta2, self.sampling_rate)
            else:
                amp = subsampling.amplify_approx_dp_without_replacement(
                    eps, delta, self.population_size, self.sample_size
                )
            wor[amp] += n
        return wor


def _gaussian_inner(event: Event, what: str) -> GaussianEvent:
    if not isinstance(event, GaussianEvent):
        raise UnsupportedEventError(
            f"{what} is analysed for the Gaussian mechanism only; got {type(event).__name__}"
        )
    return event


@dataclass(frozen=True)
class TruncatedPoissonSampledEvent(Event):
    """``event`` on a Poisson sample cut to at most ``max_batch_size`` records.

    Each of ``dataset_size`` records joins w.p. ``sampling_rate``; a larger sample is cut to a
    uniformly random subset of ``max_batch_size`` (jax_privacy's truncated Poisson sampling,
    dp_accounting's ``TruncatedSubsampledGaussianDpEvent``). Add/remove neighbours; the inner
    event is the Gaussian with the per-record noise multiplier (analysis:
    :func:`renyi.analysis.subsampling.truncated_poisson_gaussian_rdp`).
    """

    dataset_size: int
    sampling_rate: float
    max_batch_size: int
    event: Event
    kind: ClassVar[str] = "truncated_poisson_sampled"

    def __post_init__(self) -> None:
        n = check_int("dataset_size", self.dataset_size, 1)
        check_int("max_batch_size", self.max_batch_size, 1)
        object.__setattr__(
            self, "sampling_rate", check_probability("sampling_rate", self.sampling_rate)
        )
        if self.max_batch_size > n:
            raise fail("max_batch_size", self.max_batch_size, f"an integer in [1, {n}]")
        _check_inner(self.event, Neighbouring.ADD_REMOVE)

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.ADD_REMOVE

    def children(self) -> tuple[Event, ...]:
        return (self.event,)

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        inner = _gaussian_inner(self.event, "truncated Poisson sampling")
        return subsampling.truncated_poisson_gaussian_rdp(
            self.dataset_size,
            self.sampling_rate,
            self.max_batch_size,
            inner.noise_multiplier,
            orders,
        )

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        """Branch-revealed mixture (:func:`renyi.sampled_pld.mixture_pld`): with probability
        ``1 - p`` the Poisson-subsampled Gaussian, with ``p`` (the larger truncation
        probability of the two neighbours) the one with a shift of 2C. Rate ``q`` in both:
        the second branch then dominates the first (a Gaussian location experiment with a
        larger shift is Blackwell-sufficient for a smaller one), so the larger ``p`` covers
        both neighbours; ``q`` also covers the true ``q B/(j+1)``."""
        inner = _gaussian_inner(self.event, "truncated Poisson sampling")
        q = self.sampling_rate
        p = subsampling.truncation_probability(self.dataset_size, q, self.max_batch_size)
        if p == 0.0 or q == 0.0:
            return PoissonSampledEvent(q, inner).pld_pair(
                value_discretization_interval=value_discretization_interval,
                tail_mass=tail_mass,
                max_bins=max_bins,
            )
        from renyi.analysis.sampled_pld import mixture_pld

        sigma = inner.noise_multiplier
        branches = [(1.0 - p, q, 1.0, sigma), (p, q, 2.0, sigma)]
        kw = {
            "value_discretization_interval": value_discretization_interval,
            "tail_mass": tail_mass,
        }
        return mixture_pld(branches, "remove", **kw), mixture_pld(branches, "add", **kw)

    def zcdp_rho(self) -> float:
        # No amplification in zCDP; a truncated batch can move the sum by 2C (ρ times 4).
        if self.sampling_rate == 0.0:
            return 0.0
        rho = self.event.zcdp_rho()
        p = subsampling.truncation_probability(
            self.dataset_size, self.sampling_rate, self.max_batch_size
        )
        return 4.0 * rho if p > 0.0 else rho


@dataclass(frozen=True)
class RandomAllocationEvent(Event):
    """One epoch of random allocation ("balls in bins"): each record is used in exactly
    ``num_selected`` of ``num_steps`` steps, chosen uniformly and independently of the other
    records; each step runs ``event`` (the Gaussian) on the records allocated to it.

    Add/remove neighbours; compose epochs with :class:`SelfComposedEvent`. Analysis:
    :mod:`renyi.analysis.allocation` (RDP: exact remove direction, proven bound of the add
    direction; Feldman & Shenfeld 2025) and :mod:`renyi.analysis.allocation_pld` (PLD of an
    explicit dominating pair, both directions).
    """

    num_steps: int
    event: Event
    num_selected: int = 1
    kind: ClassVar[str] = "random_allocation"

    def __post_init__(self) -> None:
        t = check_int("num_steps", self.num_steps, 1)
        k = check_int("num_selected", self.num_selected, 1)
        if k > t:
            raise fail("num_selected", k, f"an integer in [1, num_steps={t}]")
        _check_inner(self.event, Neighbouring.ADD_REMOVE)

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.ADD_REMOVE

    def children(self) -> tuple[Event, ...]:
        return (self.event,)

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        from renyi.analysis.allocation import allocation_gaussian_rdp

        inner = _gaussian_inner(self.event, "random allocation")
        return allocation_gaussian_rdp(
            self.num_steps, inner.noise_multiplier, orders, self.num_selected
        )

    def zcdp_rho(self) -> float:
        # No amplification in zCDP: the record is in num_selected steps of the epoch.
        return self.num_selected * self.event.zcdp_rho()

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        from renyi.analysis.allocation_pld import allocation_pld

        inner = _gaussian_inner(self.event, "random allocation")
        return allocation_pld(
            self.num_steps,
            inner.noise_multiplier,
            num_selected=self.num_selected,
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
            max_bins=max_bins,
        )


@dataclass(frozen=True)
class ShuffledEvent(Event):
    """One epoch of shuffling: a uniformly random permutation of the ``dataset_size``
    records cut into consecutive batches of ``batch_size``; each batch runs ``event``.

    Replace-one neighbours (the dataset size is fixed). What is proven: the replaced record
    is in exactly one batch, so the epoch is at most one run of ``event`` (the position
    revealed): that is the upper bound every accountant reports here, **without**
    amplification. No tighter sound bound is known; Chua et al. (ICML 2024) show that
    Poisson accounting can understate shuffling's ε (see :mod:`renyi.shuffling` for the
    lower bound). The inner event must be under replace-one (for DP-SGD: the Gaussian with
    noise multiplier σ/2, since replacing a record moves the sum by up to 2C).
    """

    dataset_size: int
    batch_size: int
    event: Event
    kind: ClassVar[str] = "shuffled"

    def __post_init__(self) -> None:
        n = check_int("dataset_size", self.dataset_size, 1)
        b = check_int("batch_size", self.batch_size, 1)
        if b > n:
            raise fail("batch_size", b, f"an integer in [1, dataset_size={n}]")
        _check_inner(
            self.event,
            Neighbouring.REPLACE_ONE,
            "shuffling keeps the dataset size: replace-one neighbours",
        )

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.REPLACE_ONE

    @property
    def num_steps(self) -> int:
        """Batches per epoch, ``ceil(n / b)`` (a short last batch included)."""
        return -(-self.dataset_size // self.batch_size)

    def children(self) -> tuple[Event, ...]:
        return (self.event,)

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.event.rdp_epsilons(orders)

    def zcdp_rho(self) -> float:
        return self.event.zcdp_rho()

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        return self.event.pld_pair(
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
            max_bins=max_bins,
        )

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        return self.event.approx_dp_guarantees()


@dataclass(frozen=True)
class ComposedEvent(Event):
    """Adaptive sequential composition of ``events`` (all under one neighbouring relation)."""

    events: tuple[Event, ...] = field(default_factory=tuple)
    kind: ClassVar[str] = "composed"

    def __post_init__(self) -> None:
        if isinstance(self.events, Event) or not isinstance(self.events, Sequence):
            raise fail("events", self.events, "a sequence of Events")
        events = tuple(self.events)
        if not events:
            raise fail("events", events, "at least one Event")
        for e in events:
            if not isinstance(e, Event):
                raise fail("events", e, "Event instances only")
        relations = {e.neighbouring for e in events}
        if len(relations) > 1:
            raise PrivacyParameterError(
                "events mix neighbouring relations "
                f"{sorted(r.value for r in relations)}: a composition needs one relation"
            )
        object.__setattr__(self, "events", events)

    @property
    def neighbouring(self) -> Neighbouring:
        return self.events[0].neighbouring

    def children(self) -> tuple[Event, ...]:
        return self.events

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        total = np.zeros_like(orders)
        for child in self.events:
            total = total + child.rdp_epsilons(orders)
        return total

    def zcdp_rho(self) -> float:
        return float(sum(e.zcdp_rho() for e in self.events))

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        parts = [
            e.pld_pair(
                value_discretization_interval=value_discretization_interval,
                tail_mass=tail_mass,
                max_bins=max_bins,
            )
            for e in self.events
        ]
        rem, add = parts[0]
        for r, a in parts[1:]:
            rem, add = rem.compose(r), add.compose(a)
        return rem, add

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        total: Counter[Guarantee] = Counter()
        for child in self.events:
            total.update(child.approx_dp_guarantees())
        return total


@dataclass(frozen=True)
class SelfComposedEvent(Event):
    """``event`` run ``count`` times (adaptively), e.g. T steps of DP-SGD."""

    event: Event
    count: int
    kind: ClassVar[str] = "self_composed"

    def __post_init__(self) -> None:
        if not isinstance(self.event, Event):
            raise fail("event", self.event, "an Event")
        object.__setattr__(self, "count", check_int("count", self.count, 0))

    @property
    def neighbouring(self) -> Neighbouring:
        return self.event.neighbouring

    def children(self) -> tuple[Event, ...]:
        return (self.event,)

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return _times(self.count, self.event.rdp_epsilons(orders))

    def zcdp_rho(self) -> float:
        return 0.0 if self.count == 0 else self.count * self.event.zcdp_rho()

    def pld_pair(
        self, *, value_discretization_interval: float, tail_mass: float, max_bins: int
    ) -> PldPair:
        r, a = self.event.pld_pair(
            value_discretization_interval=value_discretization_interval,
            tail_mass=tail_mass,
            max_bins=max_bins,
        )
        rc = r.self_compose(self.count, max_bins=max_bins)
        return (rc, rc) if a is r else (rc, a.self_compose(self.count, max_bins=max_bins))

    def approx_dp_guarantees(self) -> Counter[Guarantee]:
        inner = self.event.approx_dp_guarantees()
        return Counter({g: n * self.count for g, n in inner.items() if n * self.count})


# ---------------------------------------------------------------------------- DP-SGD steps


@dataclass(frozen=True)
class PoissonSampledGroupEvent(Event):
    """A Gaussian on Poisson-sampled records, guaranteed for a group of ``group_size`` records.

    User-level DP with example-level sampling ("ELS", Charles et al. 2024): each of a user's
    ``group_size`` examples is kept independently w.p. ``sampling_rate``, each clipped
    gradient has norm at most C, and the sum gets ``N(0, (σC)²)``. Adding or removing the
    user shifts the sum by ``M·C``, ``M ~ Binomial(group_size, sampling_rate)``
    (:func:`renyi.analysis.mixtures.binomial_mixture_gaussian_rdp`). ``group_size = 1`` is exactly
    :class:`PoissonSampledEvent` of the Gaussian. Neighbouring: add/remove one user.
    """

    sampling_rate: float
    group_size: int
    event: Event
    kind: ClassVar[str] = "poisson_sampled_group"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "sampling_rate", check_probability("sampling_rate", self.sampling_rate)
        )
        object.__setattr__(self, "group_size", check_int("group_size", self.group_size, 1))
        if not isinstance(self.event, GaussianEvent) or (
            self.event.neighbouring is not Neighbouring.ADD_REMOVE
        ):
            raise fail("event", self.event, "a GaussianEvent with add/remove neighbouring")

    @property
    def neighbouring(self) -> Neighbouring:
        return Neighbouring.ADD_REMOVE

    def children(self) -> tuple[Event, ...]:
        return (self.event,)

    @property
    def noise_multiplier(self) -> float:
        return cast(GaussianEvent, self.event).noise_multiplier

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        if self.group_size == 1:
            return PoissonSampledEvent(self.sampling_rate, self.event).rdp_epsilons(orders)
        from renyi.analysis.mixtures import binomial_mixture_gaussian_rdp

        return binomial_mixture_gaussian_rdp(
            self.noise_multiplier, self.group_size, self.sampling_rate, orders
        )

    def zcdp_rho(self) -> float:
        # Joint quasi-convexity: no worse than the Gaussian with sensitivity group_size·C.
        if self.sampling_rate == 0.0:
            return 0.0
        return self.group_size**2 * self.event.zcdp_rho()


@dataclass(frozen=True)
class RepeatAndSelectEvent(Event):
    """The best of ``K`` runs of ``event`` published, ``K`` random with mean ``mean``.

    Private hyperparameter tuning (Papernot & Steinke 2022; dp_accounting's
    ``RepeatAndSelectDpEvent``): ``shape = inf`` draws ``K ~ Poisson(mean)`` (``mean >= 1``), a
    finite ``shape = η >= 0`` the truncated negative binomial ``D_{η,γ}`` (1: geometric,
    0: logarithmic) with that mean. Only the RDP accountant analyses it
    (:func:`renyi.selection.repeat_and_select_rdp`); the neighbouring relation is the run's.
    """

    event: Event
    mean: float
    shape: float = 1.0
    kind: ClassVar[str] = "repeat_and_select"

    def __post_init__(self) -> None:
        from renyi.analysis.selection import RepetitionDistribution

        if not isinstance(self.event, Event):
            raise fail("event", self.event, "an Event")
        dist = RepetitionDistribution(self.mean, self.shape)  # validates mean and shape
        object.__setattr__(self, "mean", float(self.mean))
        object.__setattr__(self, "shape", dist.shape)

    @property
    def neighbouring(self) -> Neighbouring:
        return self.event.neighbouring

    def children(self) -> tuple[Event, ...]:
        return (self.event,)

    def rdp_epsilons(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        from renyi.analysis.selection import RepetitionDistribution, repeat_and_select_rdp

        dist = RepetitionDistribution(self.mean, self.shape)
        return repeat_and_select_rdp(orders, self.event.rdp_epsilons(orders), dist)


Sampling = Literal["poisson", "without_replacement"]


def dpsgd_event(
    noise_multiplier: float,
    sample_rate: float,
    *,
    sampling: Sampling = "poisson",
    dataset_size: int | None = None,
) -> Event:
    """The event of one DP-SGD step with noise N(0, (noise_multiplier * C)^2) on clipped sums.

    ``noise_multiplier`` is σ / C with C the per-example clipping norm (the usual DP-SGD
    convention). Poisson sampling is analysed under add/remove neighbours, where the clipped
    sum moves by at most C: the event's Gaussian has noise multiplier σ / C. Fixed-size
    sampling without replacement is analysed under replace-one neighbours, where the sum moves
    by up to 2C: the event's Gaussian has noise multiplier σ / (2C), i.e. half. The batch size
    is ``sample_rate * dataset_size``, which must be a whole number (never rounded silently).
    """
    if sampling == "poisson":
        return PoissonSampledEvent(sample_rate, GaussianEvent(noise_multiplier))
    if sampling == "without_replacement":
        if dataset_size is None:
            raise fail("dataset_size", None, "the dataset size (needed for without_replacement)")
        batch = sample_rate * dataset_size
        if abs(batch - round(batch)) > 1e-9 * max(1.0, batch):
            raise fail(
                "sample_rate",
                sample_rate,
                f"batch_size / dataset_size with an integer batch size (got {batch:g} records)",
            )
        return SampledWithoutReplacementEvent(
            dataset_size,
            round(batch),
            GaussianEvent(
                check_positive("noise_multiplier", noise_multiplier) / 2.0, Neighbouring.REPLACE_ONE
            ),
        )
    raise fail("sampling", sampling, "'poisson' or 'without_replacement'")


SAMPLINGS = ("poisson", "truncated-poisson", "fixed-size", "random-allocation", "shuffle")
"""Batch samplers with an accounting event (``renyi epsilon --sampling``)."""


def default_max_batch_size(batch_size: int) -> int:
    """The truncation used when none is given: ``ceil(b + 4 sqrt(b))`` (4 standard
    deviations of a Poisson batch above its mean)."""
    return math.ceil(batch_size + 4.0 * math.sqrt(batch_size))


def training_event(
    sampling: str,
    noise_multiplier: float,
    *,
    dataset_size: int,
    batch_size: int,
    steps: int,
    max_batch_size: int | None = None,
    neighbouring: Neighbouring | str | None = None,
) -> Event:
    """The event of ``steps`` DP-SGD steps under a batch sampler: the single source that
    :mod:`renyi.dpsgd.sampler` objects and ``renyi epsilon --sampling`` use.

    ``noise_multiplier`` is σ / C. Samplers and their analyses:

    * ``poisson``: each record joins each batch w.p. ``b/n``; add/remove neighbours.
    * ``truncated-poisson``: Poisson, cut to ``max_batch_size`` (default
      :func:`default_max_batch_size`); add/remove.
    * ``fixed-size``: a fresh uniform subset of exactly ``b`` per step; replace-one (default),
      Gaussian with multiplier σ/2 (the sum moves by up to 2C), or ``neighbouring=
      "add_remove"`` (:class:`SampledWithoutReplacementEvent`: the Poisson pair at rate
      ``b/n`` and multiplier σ/2).
    * ``random-allocation``: per epoch every record is put in one of ``t = n // b`` batches
      uniformly at random (balls in bins); add/remove; ``ceil(steps / t)`` epochs (a partial
      epoch costs at most a full one).
    * ``shuffle``: per epoch a random permutation cut into ``ceil(n / b)`` batches of ``b``;
      replace-one; the proven bound has no amplification (:class:`ShuffledEvent`).

    ``neighbouring`` (default: the sampler's own relation) may differ from it only for
    ``fixed-size``, which is analysed under both.
    """
    n = check_int("dataset_size", dataset_size, 1)
    b = check_int("batch_size", batch_size, 1)
    if b > n:
        raise fail("batch_size", b, f"an integer in [1, dataset_size={n}]")
    t_steps = check_int("steps", steps, 1)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    natural = {"fixed-size": Neighbouring.REPLACE_ONE, "shuffle": Neighbouring.REPLACE_ONE}
    own = natural.get(sampling, Neighbouring.ADD_REMOVE)
    relation = own if neighbouring is None else _neighbouring(neighbouring)
    if relation is not own and sampling != "fixed-size":
        raise fail(
            "neighbouring", relation.value, f"'{own.value}' (the relation of {sampling} sampling)"
        )
    if sampling == "poisson":
        return SelfComposedEvent(PoissonSampledEvent(b / n, GaussianEvent(sigma)), t_steps)
    if sampling == "truncated-poisson":
        cap = default_max_batch_size(b) if max_batch_size is None else max_batch_size
        cap = check_int("max_batch_size", cap, 1)
        if cap < b:  # a cap below the batch size would truncate most batches: a mistake
            raise fail("max_batch_size", cap, f"an integer >= batch_size={b}")
        cap = min(cap, n)  # a cap above n never binds: the same sampler
        step = TruncatedPoissonSampledEvent(n, b / n, cap, GaussianEvent(sigma))
        return SelfComposedEvent(step, t_steps)
    if sampling == "fixed-size":
        if relation is Neighbouring.ADD_REMOVE:
            inner = GaussianEvent(sigma)
        else:
            inner = GaussianEvent(sigma / 2.0, Neighbouring.REPLACE_ONE)
        return SelfComposedEvent(SampledWithoutReplacementEvent(n, b, inner), t_steps)
    if sampling == "random-allocation":
        per_epoch = n // b
        epoch = RandomAllocationEvent(per_epoch, GaussianEvent(sigma))
        return SelfComposedEvent(epoch, -(-t_steps // per_epoch))
    if sampling == "shuffle":
        epoch_s = ShuffledEvent(n, b, GaussianEvent(sigma / 2.0, Neighbouring.REPLACE_ONE))
        return SelfComposedEvent(epoch_s, -(-t_steps // epoch_s.num_steps))
    raise fail("sampling", sampling, f"one of {list(SAMPLINGS)}")
