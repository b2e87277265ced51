"""Accountants: turn a sequence of events into (ε, δ). One interface, several analyses.

* :class:`RdpAccountant` (default): Rényi DP over a grid of orders.
* :class:`ZcdpAccountant`: ρ-zCDP (no subsampling amplification).
* :class:`PldAccountant`: tight numerical accounting with privacy loss distributions.
* :class:`ApproxDpAccountant`: (ε, δ) composition (basic / advanced / optimal).

:func:`epsilon_report` (also ``renyi.epsilon``) asks every applicable accountant at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from renyi._validation import fail
from renyi.accountants.approx import ApproxDpAccountant, event_approx_dp
from renyi.accountants.base import Accountant, DeltaResult, EpsilonResult
from renyi.accountants.pld import PldAccountant, event_pld
from renyi.accountants.rdp import RdpAccountant, event_rdp
from renyi.accountants.zcdp import ZcdpAccountant, event_rho
from renyi.analysis.events import (
    Event,
    PoissonSampledEvent,
    RandomAllocationEvent,
    SampledWithoutReplacementEvent,
    TruncatedPoissonSampledEvent,
    dpsgd_event,
    training_event,
)
from renyi.errors import RenyiError, UnsupportedEventError

__all__ = [
    "ACCOUNTANTS",
    "Accountant",
    "ApproxDpAccountant",
    "DeltaResult",
    "EpsilonReport",
    "EpsilonResult",
    "PldAccountant",
    "RdpAccountant",
    "ZcdpAccountant",
    "epsilon_report",
    "event_approx_dp",
    "event_pld",
    "event_rdp",
    "event_rho",
    "make_accountant",
]

ACCOUNTANTS: dict[str, type[Accountant]] = {
    RdpAccountant.name: RdpAccountant,
    ZcdpAccountant.name: ZcdpAccountant,
    PldAccountant.name: PldAccountant,
    ApproxDpAccountant.name: ApproxDpAccountant,
}


def make_accountant(accountant: str | Accountant = "rdp", **kwargs: Any) -> Accountant:
    """A fresh accountant by name (``"rdp"``, ``"zcdp"``, ``"pld"``, ``"approx"``).

    Given an accountant instance, returns a fresh one of the same type and configuration.
    """
    if isinstance(accountant, Accountant):
        return type(accountant)(**{**accountant._config(), **kwargs})
    cls = ACCOUNTANTS.get(accountant) if isinstance(accountant, str) else None
    if cls is None:
        raise fail("accountant", accountant, f"one of {sorted(ACCOUNTANTS)}")
    return cls(**kwargs)


@dataclass(frozen=True)
class EpsilonReport:
    """ε at δ from several accountants for the same events, side by side."""

    delta: float
    results: tuple[EpsilonResult, ...]
    unsupported: tuple[tuple[str, str], ...]
    subsampled: bool = False

    def best(self) -> EpsilonResult:
        """The smallest proven ε (every row is a valid upper bound)."""
        if not self.results:
            why = "; ".join(f"{n}: {w}" for n, w in self.unsupported) or "none was asked"
            raise UnsupportedEventError(f"no accountant applies to this event ({why})")
        return min(self.results, key=lambda r: r.epsilon)

    # float-like: ``float(renyi.epsilon(...))`` is the tightest sound ε; details on attributes
    @property
    def epsilon(self) -> float:
        """The tightest proven ε at ``delta`` over the accountants that apply."""
        return self.best().epsilon

    @property
    def accountant(self) -> str:
        """The accountant that gave :attr:`epsilon`."""
        return self.best().accountant

    def __float__(self) -> float:
        return self.epsilon

    def __format__(self, spec: str) -> str:
        return format(self.epsilon, spec) if spec else str(self)

    def __lt__(self, other: Any) -> bool:
        return self.epsilon < float(other)

    def __le__(self, other: Any) -> bool:
        return self.epsilon <= float(other)

    def __gt__(self, other: Any) -> bool:
        return self.epsilon > float(other)

    def __ge__(self, other: Any) -> bool:
        return self.epsilon >= float(other)

    def __str__(self) -> str:
        from renyi.cli._output import format_table

        rows = [
            [
                r.accountant,
                r.epsilon,
                "" if r.order is None else r.order,
                "" if r.epsilon_lower is None else r.epsilon_lower,
            ]
            for r in self.results
        ]
        title = f"delta = {self.delta:g}"
        if self.results:
            title = (
                f"epsilon = {self.epsilon:.6g} at delta = {self.delta:g} (tightest proven bound, "
                f"from the {self.accountant} accountant; every row is a valid upper bound)"
            )
        text = format_table(["accountant", "epsilon", "order", "epsilon_lower"], rows, title)
        notes = [f"  {name}: not applicable ({why})" for name, why in self.unsupported]
        if self.subsampled and any(r.accountant == "zcdp" for r in self.results):
            notes.append("  zcdp: charges subsampled steps without amplification (never tighter)")
        return "\n".join([text, *notes]) if notes else text


def epsilon_report(
    event: Event | None = None,
    *,
    delta: float,
    noise_multiplier: float | None = None,
    sample_rate: float | None = None,
    steps: int | None = None,
    accountants: Sequence[str] | None = None,
    sampling: str | None = None,
    dataset_size: int | None = None,
    batch_size: int | None = None,
) -> EpsilonReport:
    """ε at ``delta`` from every applicable accountant (``renyi.epsilon``).

    Pass an ``event`` (composed once), or the DP-SGD shorthand ``noise_multiplier``,
    ``sample_rate`` and ``steps`` (Poisson-subsampled Gaussian), or ``noise_multiplier``,
    ``steps``, ``sampling`` (one of :data:`renyi.analysis.events.SAMPLINGS`), ``dataset_size`` and
    ``batch_size`` for the batch sampler that actually ran
    (:func:`renyi.analysis.events.training_event`). Accountants that cannot analyse the event are
    listed with the reason instead of failing the whole report.

    Every argument given is used: one that the chosen form would ignore (``sample_rate`` or
    ``dataset_size`` without ``sampling``... see below) is refused with a
    :class:`~renyi.errors.PrivacyParameterError` naming both, never dropped silently:

    * ``event`` fixes everything: no other privacy argument goes with it;
    * ``sampling`` takes its rate from ``batch_size / dataset_size``: no ``sample_rate``;
    * without ``sampling`` (Poisson at ``sample_rate``, default 1): no ``dataset_size`` or
      ``batch_size``.

    Example::

        >>> import renyi
        >>> print(renyi.epsilon(noise_multiplier=1.1, sample_rate=256/60000, steps=14100,
        ...                     delta=1e-5))  # doctest: +SKIP
    """
    event, count = _report_event(
        event, noise_multiplier, sample_rate, steps, sampling, dataset_size, batch_size
    )
    names = list(accountants) if accountants is not None else list(ACCOUNTANTS)
    results: list[EpsilonResult] = []
    unsupported: list[tuple[str, str]] = []
    for name in names:
        acc = make_accountant(name)
        try:
            acc.compose(event, count)
            results.append(acc.epsilon(delta))
        except RenyiError as exc:  # this analysis does not apply (or not at these values)
            unsupported.append((name, str(exc)))
    subsampled = any(
        isinstance(
            e,
            PoissonSampledEvent
            | SampledWithoutReplacementEvent
            | TruncatedPoissonSampledEvent
            | RandomAllocationEvent,
        )
        for e in event.walk()
    )
    return EpsilonReport(delta, tuple(results), tuple(unsupported), subsampled)


def _report_event(
    event: Event | None,
    noise_multiplier: float | None,
    sample_rate: float | None,
    steps: int | None,
    sampling: str | None,
    dataset_size: int | None,
    batch_size: int | None,
) -> tuple[Event, int]:
    """The event :func:`epsilon_report` accounts and how often; every argument given is used
    or refused (naming it and the one that makes it meaningless)."""
    given = {
        "noise_multiplier": noise_multiplier,
        "sample_rate": sample_rate,
        "steps": steps,
        "sampling": sampling,
        "dataset_size": dataset_size,
        "batch_size": batch_size,
    }
    if event is not None:
        for name, value in given.items():
            if value is not None:
                raise fail(name, value, "no value with event=... (the event fixes it; pass one)")
        return event, 1
    if sampling is not None:
        if sample_rate is not None:
            raise fail(
                "sample_rate",
                sample_rate,
                f"no value with sampling={sampling!r} (its rate is batch_size / dataset_size)",
            )
        if noise_multiplier is None or dataset_size is None or batch_size is None:
            raise fail(
                "sampling",
                sampling,
                "given with noise_multiplier, dataset_size, batch_size and steps",
            )
        built = training_event(
            sampling,
            noise_multiplier,
            dataset_size=dataset_size,
            batch_size=batch_size,
            steps=1 if steps is None else steps,
        )
        return built, 1
    for name in ("dataset_size", "batch_size"):
        if given[name] is not None:
            raise fail(
                name,
                given[name],
                "no value without sampling=... (the Poisson shorthand takes sample_rate; "
                "pass sampling='poisson' to derive it from batch_size / dataset_size)",
            )
    if noise_multiplier is None:
        raise fail("event", None, "an Event, or noise_multiplier (with sample_rate, steps)")
    rate = 1.0 if sample_rate is None else sample_rate
    return dpsgd_event(noise_multiplier, rate), 1 if steps is None else steps
