"""The interface every accountant implements, and the results they return.

An accountant consumes :mod:`renyi.analysis.events` and answers "what is ε at δ?" (and the
inverse). The contract, shared by all accountants and tested by one suite:

* ``compose(event, count)`` validates the *whole* event before changing any state: an
  unsupported or malformed event raises and leaves the accountant as it was.
* All events composed into one accountant share one neighbouring relation.
* ``epsilon``/``delta`` on an empty accountant raise :class:`EmptyAccountantError`.
* ``state_dict()`` is JSON-able; ``from_state_dict`` rebuilds an accountant that answers
  bit-for-bit the same (it re-composes the recorded events in order).
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from renyi._validation import check_delta, check_int, check_nonnegative, fail
from renyi.analysis.events import Event, Neighbouring, from_dict
from renyi.errors import EmptyAccountantError, UnsupportedEventError

__all__ = ["Accountant", "DeltaResult", "EpsilonResult"]


@dataclass(frozen=True)
class EpsilonResult:
    """ε at a given δ, with how it was obtained.

    ``epsilon`` is always a proven upper bound. RDP-based accountants report the Rényi
    ``order`` that achieved it; numerical (PLD) accountants report ``epsilon_lower`` and
    ``epsilon_estimate`` so that [lower, epsilon] brackets the truth of the discretised
    analysis.
    """

    epsilon: float
    delta: float
    accountant: str
    order: float | None = None
    epsilon_lower: float | None = None
    epsilon_estimate: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: ``(epsilon_slack, delta_slack)`` of the floating-point noise implementation, already
    #: included in ``epsilon`` / ``delta`` (:func:`renyi.noise.accounting_slack`).
    implementation_slack: tuple[float, float] = (0.0, 0.0)

    def __float__(self) -> float:
        return self.epsilon


@dataclass(frozen=True)
class DeltaResult:
    """δ at a given ε; ``delta`` is a proven upper bound (``delta_lower`` a lower one if known)."""

    delta: float
    epsilon: float
    accountant: str
    order: float | None = None
    delta_lower: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    #: ``(epsilon_slack, delta_slack)`` of the noise implementation, included in ``delta``.
    implementation_slack: tuple[float, float] = (0.0, 0.0)

    def __float__(self) -> float:
        return self.delta


def _with_slack_epsilon(ideal: Any, delta: float) -> EpsilonResult:
    """ε of the implementation at ``delta``: the ideal ε at ``delta - delta_slack(ε)`` plus the
    ε slack (``ideal(d)`` answers for the ideal mechanism). The slack's δ part grows with ε
    (``n TAIL_MASS (1 + e^ε)``): it is evaluated at a guess that the answer must not exceed."""
    from renyi.noise import accounting_slack

    if accounting_slack(200.0) == (0.0, 0.0):  # renyi's noise is exact: nothing to add
        return dataclasses.replace(ideal(delta), implementation_slack=(0.0, 0.0))
    first = ideal(delta)
    if not math.isfinite(first.epsilon):
        return dataclasses.replace(first, implementation_slack=accounting_slack(0.0))
    guess = first.epsilon + 1.0
    eps_slack, ds = accounting_slack(guess)
    res = first
    for _ in range(16):
        eps_slack, ds = accounting_slack(guess)
        d = min(delta - ds, math.nextafter(delta, 0.0)) if delta > 0 else 0.0
        if delta > 0 and d <= 0:
            res = ideal(delta)
            return dataclasses.replace(
                res,
                epsilon=math.inf,
                implementation_slack=(eps_slack, ds),
                details={**res.details, "note": "delta is below the implementation's slack"},
            )
        res = ideal(d)
        if res.epsilon <= guess or not math.isfinite(res.epsilon):
            if delta == 0:  # pure DP of the ideal mechanism; the implementation has delta = ds
                ds = accounting_slack(res.epsilon)[1]
                return dataclasses.replace(
                    res,
                    epsilon=res.epsilon + eps_slack,
                    delta=math.nextafter(ds, math.inf),
                    implementation_slack=(eps_slack, ds),
                )
            return dataclasses.replace(
                res,
                epsilon=res.epsilon + eps_slack,
                delta=delta,
                implementation_slack=(eps_slack, ds),
            )
        guess = res.epsilon + 1.0
    return dataclasses.replace(res, epsilon=math.inf, implementation_slack=(eps_slack, ds))


class Accountant(ABC):
    """Abstract accountant. Subclasses implement ``_analyse`` / ``_add`` / the two queries."""

    name: ClassVar[str]

    def __init__(self) -> None:
        self._history: list[tuple[Event, int]] = []
        self._neighbouring: Neighbouring | None = None

    # --------------------------------------------------------------- subclass hooks
    @abstractmethod
    def _analyse(self, event: Event) -> Any:
        """Privacy cost of one run of ``event`` (pure; raise UnsupportedEventError if unknown)."""

    @abstractmethod
    def _add(self, cost: Any, count: int) -> None:
        """Add ``count`` runs of an analysed cost to the running total."""

    @abstractmethod
    def _epsilon(self, delta: float) -> EpsilonResult: ...

    @abstractmethod
    def _delta(self, epsilon: float) -> DeltaResult: ...

    def _config(self) -> dict[str, Any]:
        """Constructor arguments to record in ``state_dict`` (JSON-able)."""
        return {}

    # --------------------------------------------------------------- public API
    @property
    def neighbouring(self) -> Neighbouring | None:
        """The relation of the composed events (None while empty)."""
        return self._neighbouring

    @property
    def history(self) -> tuple[tuple[Event, int], ...]:
        """The (event, count) pairs composed so far, in order."""
        return tuple(self._history)

    @property
    def is_empty(self) -> bool:
        return not any(count for _, count in self._history)

    def supports(self, event: Event) -> bool:
        """Whether ``compose(event)`` would succeed (pure; no state change)."""
        try:
            self._check(event)
        except UnsupportedEventError:
            return False
        return True

    def _check(self, event: Event) -> Any:
        if not isinstance(event, Event):
            raise fail("event", event, "a renyi.analysis.events.Event")
        if self._neighbouring is not None and event.neighbouring is not self._neighbouring:
            raise UnsupportedEventError(
                f"event is analysed under {event.neighbouring.value!r} neighbours but this "
                f"accountant already holds {self._neighbouring.value!r} events; "
                "guarantees under different relations do not compose"
            )
        return self._analyse(event)

    def compose(self, event: Event, count: int = 1) -> Self:
        """Record ``count`` adaptive runs of ``event``. Validates everything before mutating."""
        count = check_int("count", count, 0)
        cost = self._check(event)
        self._add(cost, count)
        self._history.append((event, count))
        self._neighbouring = event.neighbouring
        return self

    def epsilon(self, delta: float) -> EpsilonResult:
        """Smallest proven ε such that the composition so far is (ε, δ)-DP.

        Includes the slack of renyi's noise implementation (:func:`renyi.noise.accounting_slack`,
        up to 2**64 released values): the ideal mechanism's ε is taken at ``δ - slack(ε)`` (at
        least one float below ``δ``) and the implementation's ε slack is added; both are in
        :attr:`EpsilonResult.implementation_slack`. This is the one place where it is added:
        every ε reported from an accountant (``PrivacyEngine.get_epsilon``, budgets, ledgers,
        the CLI) carries it.
        """
        delta = check_delta(delta)
        self._require_events()
        return _with_slack_epsilon(self._epsilon, delta)

    def delta(self, epsilon: float) -> DeltaResult:
        """Smallest proven δ such that the composition so far is (ε, δ)-DP (with the noise
        implementation's slack added, see :meth:`epsilon`)."""
        epsilon = check_nonnegative("epsilon", epsilon)
        self._require_events()
        from renyi.noise import accounting_slack

        eps_slack, _ = accounting_slack(epsilon)
        ideal = max(epsilon - eps_slack, 0.0)
        res = self._delta(ideal)
        ds = accounting_slack(epsilon)[1]
        total = min(1.0, math.nextafter(res.delta + ds, math.inf)) if ds > 0 else res.delta
        return dataclasses.replace(
            res, delta=total, epsilon=epsilon, implementation_slack=(eps_slack, ds)
        )

    def _require_events(self) -> None:
        if self.is_empty:
            raise EmptyAccountantError(
                f"{type(self).__name__} has no composed event: call compose(event) first"
            )

    def copy(self) -> Self:
        """An independent copy (composing into it leaves this one unchanged)."""
        return _copy.deepcopy(self)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the accountant type, its configuration and the event history."""
        return {
            "accountant": self.name,
            "config": self._config(),
            "history": [[event.to_dict(), count] for event, count in self._history],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Self:
        """Rebuild an accountant from :meth:`state_dict` (same answers, bit for bit)."""
        if not isinstance(state, dict) or state.get("accountant") != cls.name:
            raise fail("state", state, f"a state_dict produced by {cls.__name__}")
        acc = cls(**state.get("config", {}))
        for item in state.get("history", []):
            event_dict, count = item
            acc.compose(from_dict(event_dict), count)
        return acc
