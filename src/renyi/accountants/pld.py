"""Tight numerical accounting with privacy loss distributions (formulas.md §8).

Each event becomes a privacy loss distribution (PLD) for each adjacency direction
(``remove``: the record is in the first dataset; ``add``: in the second); compositions are
FFT convolutions (:mod:`renyi.analysis.pld`). Answers are rigorous intervals: ``epsilon`` is the
verified upper bound, ``epsilon_lower`` a verified lower bound of the discretised analysis,
``epsilon_estimate`` their midpoint; the reported value is the max over both directions.

Composition is lazy: ``compose`` validates the event and records it (identical events are
merged, since composition is commutative); the FFT work happens at the first query after a
change and is cached. So T calls of ``compose(step)`` cost what one ``compose(step, T)`` does.

The reported ``epsilon`` (``delta``) is the smallest of every sound upper bound the
accountant can compute: the PLD's and, for events the RDP accountant analyses, the RDP
bound of the same composition (``details["bound"]`` says which won). So it is never above
the RDP value and never ``inf`` where RDP is finite. A step whose privacy loss does not fit
the requested grid is discretised on the finest power-of-two multiple of it that does; one
that fits no grid (e.g. ``noise_multiplier = 1e-200``) is left to RDP. Queries at a delta
within 1000x of ``tail_mass`` are answered with a proportionally smaller tail mass; so are
``delta(epsilon)`` queries whose bound falls there (the tail mass is lowered to 1e-3 of the
bracket's lower end, at most four times), so tiny deltas are not stuck on a truncation floor.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from functools import reduce
from typing import Any

import numpy as np

from renyi.accountants.base import Accountant, DeltaResult, EpsilonResult
from renyi.accountants.rdp import RdpAccountant
from renyi.analysis.events import DIRECTIONS, Event
from renyi.analysis.pld import DEFAULT_MAX_BINS, PldBounds, PldGridError, PrivacyLossDistribution
from renyi.errors import (
    OrderAtGridEdgeWarning,
    PrivacyParameterError,
    RenyiWarning,
    UnsupportedEventError,
)

__all__ = ["PldAccountant", "event_pld"]

Pair = tuple[PrivacyLossDistribution, PrivacyLossDistribution]

_MIN_TAIL = 1e-250  # smallest tail mass a tiny-delta query lowers tail_mass to
_RESOLVE = 16.0  # grid steps per standard deviation of one run's loss (see _resolved)
_RESOLVE_MAX_DOUBLINGS = 8  # at most 256x finer than the requested grid ...
_RESOLVE_POINTS = 1 << 18  # ... and at most this many points for one run


def _loss_std(pld: PrivacyLossDistribution) -> float:
    """Standard deviation of the finite losses of ``pld``'s upper discretisation (sums, not
    BLAS dot products, whose thread start-up would cost more than the work)."""
    losses, masses = pld.pmf("upper")
    total = float(np.sum(masses))
    if not total > 0.0:
        return 0.0
    mean = float(np.sum(masses * losses)) / total
    return math.sqrt(max(float(np.sum(masses * np.square(losses - mean))) / total, 0.0))


def event_pld(
    event: Event,
    *,
    value_discretization_interval: float = 1e-4,
    tail_mass: float = 1e-15,
    max_bins: int = DEFAULT_MAX_BINS,
) -> Pair:
    """PLDs (remove, add) of one run of ``event`` (the same object twice when symmetric):
    the event's own :meth:`~renyi.analysis.events.Event.pld_pair`.

    ``max_bins`` caps the FFT windows of self-compositions inside the event
    (:meth:`PrivacyLossDistribution.self_compose`).
    """
    return event.pld_pair(
        value_discretization_interval=value_discretization_interval,
        tail_mass=tail_mass,
        max_bins=max_bins,
    )


class PldAccountant(Accountant):
    """Privacy-loss-distribution accountant: tight ε with rigorous [lower, upper] bounds.

    Args:
        value_discretization_interval: grid spacing h of one step's privacy loss (smaller:
            tighter and slower; the upper bound is sound at any h). A step whose loss has a
            standard deviation below 16 h is discretised on h / 2**k instead (nested, so
            only tighter), k <= 8, while it keeps at most 2**18 points.
        tail_mass: probability mass allowed to be truncated (charged to δ in the upper bound).
        max_bins: cap (1024 to 2**22) on the FFT window of a self-composition. Compositions
            wider than that (many steps) are computed by a ladder of FFT powers on grids
            coarsened by powers of two, so run time grows like log T rather than sqrt T;
            the grid finally used is ``details["composed_interval"]`` of ``epsilon()``. The
            default 2**17 leaves e.g. DP-SGD on MNIST (T = 14 100, h = 1e-4) on the fine
            grid; 2**22 switches the ladder off.

    Example::

        >>> from renyi.accountants import PldAccountant
        >>> from renyi.analysis.events import GaussianEvent, PoissonSampledEvent
        >>> acc = PldAccountant().compose(PoissonSampledEvent(0.01, GaussianEvent(1.0)), 1000)
        >>> r = acc.epsilon(1e-5)
        >>> r.epsilon_lower <= r.epsilon_estimate <= r.epsilon
        True
    """

    name = "pld"

    def __init__(
        self,
        value_discretization_interval: float = 1e-4,
        tail_mass: float = 1e-15,
        max_bins: int = DEFAULT_MAX_BINS,
    ) -> None:
        super().__init__()
        # validated by building a PLD once (same checks and messages as renyi.analysis.pld)
        PrivacyLossDistribution.identity(
            value_discretization_interval=value_discretization_interval, tail_mass=tail_mass
        ).self_compose(1, max_bins=max_bins)
        self._h = float(value_discretization_interval)
        self._tail = float(tail_mass)
        self._max_bins = int(max_bins)
        self._counts: Counter[Event] = Counter()
        self._base: dict[tuple[Event, float], Pair | None] = {}
        self._cache: dict[float, Pair | None] = {}
        self._rdp: RdpAccountant | None = RdpAccountant()

    def _config(self) -> dict[str, Any]:
        return {
            "value_discretization_interval": self._h,
            "tail_mass": self._tail,
            "max_bins": self._max_bins,
        }

    def _pair(self, event: Event, tail: float) -> Pair | None:
        """The event's PLD pair on the finest power-of-two multiple of ``h`` that holds its
        loss (``None`` if no grid does), cached per tail mass."""
        key = (event, tail)
        if key not in self._base:
            h, pair = self._h, None
            for _ in range(1100):  # 2**1100 h exceeds any float range
                try:
                    pair = event_pld(
                        event,
                        value_discretization_interval=h,
                        tail_mass=tail,
                        max_bins=self._max_bins,
                    )
                    break
                except PldGridError as err:
                    if not math.isfinite(err.needed) or err.needed <= h:
                        break
                    # a grid of ~2**17 points (the default window), not the 2**22 limit:
                    # such steps have huge losses, where 1e-5 of their range is ample
                    h *= 2.0 ** max(1, math.ceil(math.log2(32.0 * err.needed / h)))
            if pair is not None and h == self._h:
                pair = self._resolved(event, tail, pair)
            self._base[key] = pair
        return self._base[key]

    def _resolved(self, event: Event, tail: float, pair: Pair) -> Pair:
        """``pair`` again on ``h / 2**k`` where one run's privacy loss spreads over fewer than
        ``_RESOLVE`` grid steps per standard deviation.

        Connect-the-dots adds up to ``h^2 / 4`` to the variance of every step's loss, a
        relative ``h^2 / (4 s^2)`` for a loss of standard deviation ``s``: at q = 2e-4,
        sigma = 1.5 (``s = 1.6 h``) that made epsilon(1e-5) 3.7 % too large at h = 1e-4
        (0.05 % at h / 8, 0.00 % at h / 16; q = 4.9e-4, sigma = 1.09: 0.12 % at h, 0.007 %
        at h / 4; q = 1e-4, sigma = 5, T = 1e4: 0.2 % at h / 32, 0.04 % at h / 64; rare
        participation, q = 2.2e-6, sigma = 1.47, T = 1447, delta = 5e-15: epsilon 4.2e-4
        was 5.7 % too large at h / 64, 0.35 % at h / 256). The finer grid is nested in ``h``
        (powers of two), so the bound can only get tighter; it is used only while the step
        keeps at most ``_RESOLVE_POINTS`` points. A smaller ``q`` or a larger ``sigma`` has
        a smaller spread (and support), so a grid at least as fine: the choice moves epsilon
        the way monotonicity in ``q`` and ``sigma`` wants.
        """
        spread = min(_loss_std(p) for p in pair)
        if not spread > 0.0 or _RESOLVE * self._h <= spread:
            return pair
        k = min(math.ceil(math.log2(_RESOLVE * self._h / spread)), _RESOLVE_MAX_DOUBLINGS)
        size = max(p.support_size for p in pair)
        while k > 0 and size * 2**k > _RESOLVE_POINTS:
            k -= 1
        if k <= 0:
            return pair
        try:
            return event_pld(
                event,
                value_discretization_interval=self._h / 2**k,
                tail_mass=tail,
                max_bins=self._max_bins,
            )
        except PldGridError:  # pragma: no cover - a finer grid of a step that fits h
            return pair

    def _analyse(self, event: Event) -> Event:
        self._pair(event, self._tail)  # raises UnsupportedEventError for foreign events
        return event

    def _add(self, cost: Event, count: int) -> None:
        if count:
            self._counts[cost] += count
            self._cache = {}
            if self._rdp is not None:
                try:
                    self._rdp.compose(cost, count)
                except (UnsupportedEventError, PrivacyParameterError, ArithmeticError):
                    self._rdp = None  # no RDP bound for this composition: PLD only

    def _tail_for(self, delta: float) -> float:
        """``tail_mass`` unless ``delta`` is within 1000x of it (then ``delta / 1000``)."""
        return self._tail if delta >= 1e3 * self._tail else max(delta * 1e-3, _MIN_TAIL)

    def _plds_at(self, tail: float) -> Pair | None:
        if tail not in self._cache:
            try:
                self._compose_all(tail)
            except PldGridError:  # e.g. counts beyond 1e15: the RDP bound carries it
                self._cache[tail] = None
        return self._cache[tail]

    def _compose_all(self, tail: float) -> None:
        pairs = []
        for event, count in self._counts.items():
            pair = self._pair(event, tail)
            if pair is None:
                self._cache[tail] = None
                return
            r, a = pair
            rc = r.self_compose(count, max_bins=self._max_bins)
            pairs.append((rc, rc if a is r else a.self_compose(count, max_bins=self._max_bins)))
        rem = reduce(lambda x, y: x.compose(y), [p[0] for p in pairs])
        if all(r is a for r, a in pairs):  # symmetric mechanisms: one composition
            self._cache[tail] = (rem, rem)
        else:
            self._cache[tail] = (rem, reduce(lambda x, y: x.compose(y), [p[1] for p in pairs]))

    def plds(self) -> Pair:
        """The composed (remove, add) PLDs of everything so far (computed lazily, cached)."""
        pair = self._plds_at(self._tail)
        if pair is None:
            raise UnsupportedEventError(
                "a composed event's privacy loss fits no PLD grid (its bound comes from RDP)"
            )
        return pair

    def _rdp_query(self, which: str, value: float) -> float:
        """The RDP bound of the same composition (``inf`` if RDP cannot analyse it)."""
        if self._rdp is None:
            return math.inf
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OrderAtGridEdgeWarning)
            warnings.simplefilter("ignore", RenyiWarning)
            try:
                if which == "epsilon":
                    return float(self._rdp.epsilon(value).epsilon)
                return float(self._rdp.delta(value).delta)
            except (ArithmeticError, PrivacyParameterError):  # pragma: no cover - defensive
                return math.inf

    def _epsilon(self, delta: float) -> EpsilonResult:
        plds = self._plds_at(self._tail_for(delta))
        rdp = self._rdp_query("epsilon", delta)
        details: dict[str, Any] = {"value_discretization_interval": self._h}
        if plds is None:
            worst = PldBounds(0.0, rdp, math.inf)
        else:
            bounds = [p.epsilon_for_delta(delta) for p in plds]
            worst = _max_bounds(bounds)
            details["direction"] = DIRECTIONS[int(bounds[1].upper > bounds[0].upper)]
            details["composed_interval"] = max(p.value_discretization_interval for p in plds)
        upper = min(float(worst.upper), rdp)
        details.update(
            bound="pld" if upper == worst.upper else "rdp",
            pld_epsilon=float(worst.upper),
            rdp_epsilon=rdp,
        )
        lower = min(float(worst.lower), upper)
        return EpsilonResult(
            upper,
            delta,
            self.name,
            epsilon_lower=lower,
            epsilon_estimate=min(max(float(worst.estimate), lower), upper),
            details=details,
        )

    def _pld_delta(self, epsilon: float, tail: float) -> tuple[PldBounds, float] | None:
        plds = self._plds_at(tail)
        if plds is None:
            return None
        worst = _max_bounds([p.delta_for_epsilon(epsilon) for p in plds])
        return worst, max(p.value_discretization_interval for p in plds)

    def _delta(self, epsilon: float) -> DeltaResult:
        rdp = self._rdp_query("delta", epsilon)
        details: dict[str, Any] = {}
        tail = self._tail
        found = self._pld_delta(epsilon, tail)
        # A delta within 1000x of the tail mass is mostly truncated mass: answer it with a
        # tail 1000x below the delta (its lower bound where informative), as epsilon() does.
        for _ in range(4):
            if found is None or not float(found[0].upper) < 1e3 * tail or tail <= _MIN_TAIL:
                break
            low = float(found[0].lower)
            tail = max(1e-3 * (low if low > 0 else float(found[0].upper)), _MIN_TAIL)
            again = self._pld_delta(epsilon, tail)
            if again is None:
                break
            found = (
                PldBounds(
                    max(float(found[0].lower), float(again[0].lower)),
                    again[0].estimate,
                    min(float(found[0].upper), float(again[0].upper)),
                ),
                again[1],
            )
        if found is None:
            worst = PldBounds(0.0, rdp, 1.0)
        else:
            worst = found[0]
            details["composed_interval"] = found[1]
            if tail != self._tail:
                details["tail_mass"] = tail
        upper = min(float(worst.upper), rdp)
        lower = min(float(worst.lower), upper)
        details.update(
            delta_estimate=min(max(float(worst.estimate), lower), upper),
            bound="pld" if upper == worst.upper else "rdp",
            pld_delta=float(worst.upper),
            rdp_delta=rdp,
        )
        return DeltaResult(upper, epsilon, self.name, delta_lower=lower, details=details)


def _max_bounds(bounds: list[PldBounds]) -> PldBounds:
    """The max over directions, componentwise: each component bounds max_dir(truth_dir)."""
    return PldBounds(
        max(float(b.lower) for b in bounds),
        max(float(b.estimate) for b in bounds),
        max(float(b.upper) for b in bounds),
    )
