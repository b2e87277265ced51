"""(ε, δ) composition for mechanisms known only by an (ε, δ) guarantee.

For releases with no finer description than "this was (ε, δ)-DP" (or pure ε-DP, which
Laplace, randomized response and discrete Laplace reduce to), ε at a target δ is the best of:

* basic composition (Dwork & Roth 2014, Thm 3.16) — any sequence;
* for one repeated guarantee, the optimal homogeneous composition (Kairouz, Oh &
  Viswanath 2015, Thm 3.3), which dominates advanced composition (Dwork, Rothblum &
  Vadhan 2010);
* for several distinct guarantees, the optimal composition of each group with the spare δ
  split evenly between groups, then basic composition of the groups.

Subsampling of an (ε, δ) mechanism is amplified by Balle, Barthe & Gaboardi 2018
(ε' = log(1 + q(e^ε − 1)), δ' = qδ; Thm. 8 for Poisson sampling, Thm. 9 without replacement).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from renyi.accountants.base import Accountant, DeltaResult, EpsilonResult
from renyi.analysis import composition
from renyi.analysis.events import Event, Guarantee
from renyi.errors import RenyiError

__all__ = ["ApproxDpAccountant", "event_approx_dp"]


def event_approx_dp(event: Event) -> Counter[Guarantee]:
    """The (ε, δ) guarantees of one run of ``event``, as a multiset {(ε, δ): count}: the
    event's own :meth:`~renyi.analysis.events.Event.approx_dp_guarantees`."""
    return event.approx_dp_guarantees()


class ApproxDpAccountant(Accountant):
    """Composition of (ε, δ)-DP guarantees: best of basic and optimal homogeneous composition."""

    name = "approx"

    def __init__(self) -> None:
        super().__init__()
        self._groups: Counter[Guarantee] = Counter()

    def _analyse(self, event: Event) -> Counter[Guarantee]:
        return event_approx_dp(event)

    def _add(self, cost: Counter[Guarantee], count: int) -> None:
        for g, n in cost.items():
            if n * count:
                self._groups[g] += n * count

    def _basic(self) -> tuple[float, float]:
        eps = math.fsum(e * n for (e, _), n in self._groups.items())
        delta = math.fsum(d * n for (_, d), n in self._groups.items())
        return eps, delta

    def _epsilon(self, delta: float) -> EpsilonResult:
        basic_eps, basic_delta = self._basic()
        candidates: list[tuple[float, str]] = []
        if basic_delta <= delta:
            candidates.append((basic_eps, "basic"))
        spare = delta - basic_delta
        groups = [(g, n) for g, n in self._groups.items() if n]
        if spare > 0 and all(math.isfinite(e) for (e, _), _n in groups):
            share = spare / len(groups)
            try:
                eps = math.fsum(
                    composition.compose_optimal(e, d, n, n * d + share).epsilon
                    if n * d + share < 1.0
                    else 0.0
                    for (e, d), n in groups
                )
                candidates.append((eps, "optimal" if len(groups) == 1 else "optimal-per-group"))
            except RenyiError:
                pass
        if not candidates:
            return EpsilonResult(
                math.inf, delta, self.name, details={"reason": f"sum of deltas {basic_delta:g}"}
            )
        eps, method = min(candidates)
        return EpsilonResult(eps, delta, self.name, details={"method": method})

    def _delta(self, epsilon: float) -> DeltaResult:
        basic_eps, basic_delta = self._basic()
        best = basic_delta if basic_eps <= epsilon else 1.0
        method = "basic"
        groups = [(g, n) for g, n in self._groups.items() if n]
        if len(groups) == 1:
            (e, d), n = groups[0]
            if math.isfinite(e):
                opt = float(composition.optimal_composition_delta(e, d, n, epsilon))
                if opt < best:
                    best, method = opt, "optimal"
        return DeltaResult(min(best, 1.0), epsilon, self.name, details={"method": method})

    def _config(self) -> dict[str, Any]:
        return {}
