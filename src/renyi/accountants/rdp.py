"""Rényi DP accounting (Mironov 2017): the default accountant.

Each event becomes an RDP curve ε(α) on a fixed grid of orders; composition adds curves
pointwise (Mironov 2017, Prop. 1), ``count`` repetitions multiply by ``count``, so the cost
of accounting T steps does not depend on T. ε at δ minimises the conversion of
Balle et al. 2020, Thm. 21 over the grid and reports the order used.

The expensive curve, the Poisson-subsampled Gaussian, is kept symbolically and evaluated
lazily: :meth:`RdpAccountant.epsilon` computes it on a coarse part of the grid, bounds ε from
below on the rest (Rényi divergence is non-decreasing in α and ``(α - 1) D_α`` is convex in α,
van Erven & Harremoës 2014, Thms 3 and 11) and evaluates only the orders that could still win.
The answer (ε and order) is the full-grid minimum; see ``docs/subsampling.md``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_orders
from renyi.accountants.base import Accountant, DeltaResult, EpsilonResult
from renyi.analysis import conversions, subsampling
from renyi.analysis.curves import DEFAULT_ORDERS, RdpCurve, _warn_edge
from renyi.analysis.events import (
    ComposedEvent,
    Event,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    _times,
)

__all__ = ["RdpAccountant", "event_rdp"]


def event_rdp(event: Event, orders: ArrayLike) -> NDArray[np.float64]:
    """RDP curve ε(α) of one run of ``event`` at ``orders`` (an upper bound at every order).

    The curve is the event's own (:meth:`renyi.analysis.events.Event.rdp_epsilons`). Raises
    :class:`UnsupportedEventError` for events without an RDP analysis (e.g. an (ε, δ)-DP
    guarantee with δ > 0, which implies no finite RDP bound).
    """
    a = check_orders(orders)
    return event.rdp_epsilons(a)


# ------------------------------------------------------------------------------------------
# Symbolic costs: the Poisson-subsampled Gaussian is evaluated lazily, everything else at once
# ------------------------------------------------------------------------------------------

# Relative slack of the pruning bounds: the kernel's values are upper bounds of the exact
# divergence within ~1e-8 relative on the tested grids (docs/subsampling.md); a value computed
# at one order is trusted to lower-bound the exact divergence only after this discount.
_SLACK = 1e-6
# Grids this small are evaluated in full (nothing to gain).
_MIN_LAZY_ORDERS = 24
# Pending symbolic costs folded into the dense total beyond this many (keeps epsilon() cheap
# when an accountant is fed one step at a time).
_MAX_PENDING = 8
# Orders evaluated first (those in the grid): cheap integer orders, dense where the optimum of
# typical settings lies and sparser above, enough for sharp chord bounds.
_FIRST_INTEGERS = np.concatenate([np.arange(2.0, 17.0), [20.0, 24, 28, 32, 40, 48, 56, 64]])


class _Sampled:
    """Poisson-subsampled Gaussian, ``0 < q < 1``: evaluated on demand, order by order."""

    __slots__ = ("floor", "key", "q", "sigma")

    def __init__(self, q: float, sigma: float) -> None:
        self.q, self.sigma = q, sigma
        self.key = (q, sigma)
        # A lower bound at every order: D_alpha >= KL >= 2 TV^2 (monotonicity in the order;
        # Pinsker), TV(mu, mu0) = q TV(N(1, s^2), N(0, s^2)) = q erf(1 / (2 sqrt(2) s)).
        tv = q * math.erf(1.0 / (2.0 * math.sqrt(2.0) * sigma))
        self.floor = 2.0 * tv * tv * (1.0 - _SLACK)


class _Sum:
    __slots__ = ("children",)

    def __init__(self, children: list[Any]) -> None:
        self.children = children


class _Times:
    __slots__ = ("child", "count")

    def __init__(self, count: int, child: Any) -> None:
        self.count, self.child = count, child


def _symbolic(event: Event, a: NDArray[np.float64]) -> Any:
    """The cost of ``event`` on the grid ``a``: a dense array (computed now by the event's
    :meth:`~renyi.analysis.events.Event.rdp_epsilons`, so every error is raised here) or a tree of
    :class:`_Sum` / :class:`_Times` over :class:`_Sampled` leaves and dense arrays.

    Only the evaluation order differs from the event's own curve: the composition operators
    are walked here so that the subsampled Gaussian (the one expensive curve) can be
    evaluated order by order; every other event is dense and needs nothing here."""
    if isinstance(event, PoissonSampledEvent) and isinstance(event.event, GaussianEvent):
        q, sigma = event.sampling_rate, event.event.noise_multiplier
        two_var = 2.0 * sigma * sigma  # 0.0 when σ² underflows (σ < 1e-154)
        if 0.0 < q < 1.0 and two_var > 0.0 and math.isfinite(1.0 / two_var):
            return _Sampled(q, sigma)
        return event.rdp_epsilons(a)
    if isinstance(event, ComposedEvent):
        kids = [_symbolic(child, a) for child in event.events]
        if all(isinstance(k, np.ndarray) for k in kids):
            total = np.zeros_like(a)  # the same additions as ComposedEvent.rdp_epsilons
            for k in kids:
                total = total + k
            return total
        return _Sum(kids)
    if isinstance(event, SelfComposedEvent):
        child = _symbolic(event.event, a)
        if isinstance(child, np.ndarray):
            return _times(event.count, child)
        return _Times(event.count, child)
    return event.rdp_epsilons(a)


def _leaves(node: Any, out: dict[tuple[float, float], _Sampled]) -> None:
    if isinstance(node, _Sampled):
        out.setdefault(node.key, node)
    elif isinstance(node, _Sum):
        for child in node.children:
            _leaves(child, out)
    elif isinstance(node, _Times):
        _leaves(node.child, out)


def _evaluate(node: Any, leaf: dict[tuple[float, float], NDArray[np.float64]]) -> Any:
    """The cost on the whole grid, with the leaves' values taken from ``leaf`` (the same
    operations, in the same order, as the event's ``rdp_epsilons``)."""
    if isinstance(node, np.ndarray):
        return node
    if isinstance(node, _Sampled):
        return leaf[node.key]
    if isinstance(node, _Sum):
        total = np.zeros_like(next(iter(leaf.values())))
        for child in node.children:
            total = total + _evaluate(child, leaf)
        return total
    return _times(node.count, _evaluate(node.child, leaf))


class _GridInfo:
    """Order-dependent helpers of a grid: the orders evaluated first (``_FIRST_INTEGERS``, or
    every 8th order if the grid has fewer than 4 of them, and inf) and the order-only parts of
    the conversion of Balle et al. 2020, Thm. 21 (the same operations as
    :func:`renyi.analysis.conversions.rdp_to_dp`)."""

    def __init__(self, a: NDArray[np.float64]) -> None:
        finite = np.isfinite(a)
        first = np.isin(a, _FIRST_INTEGERS)
        if np.count_nonzero(first) < 4:
            first = np.zeros(a.shape, dtype=bool)
            first[::8] = True
        self.first = first | ~finite
        self.first.setflags(write=False)
        self.is_inf = np.isinf(a)
        finite_orders = a[finite]
        # the orders at which RdpCurve.to_dp warns (OrderAtGridEdgeWarning)
        self.edges = (float(finite_orders[0]), float(finite_orders[-1])) if finite.any() else ()
        self.first_geometry = _Geometry(a, self.first)
        self.terms = conversions._balle_order_terms(a)

    def shift(self, delta: float) -> NDArray[np.float64]:
        """``(log delta + log a) / (a - 1)``."""
        return conversions._balle_shift(self.terms, math.log(delta))

    def balle(self, e: NDArray[np.float64], shift: NDArray[np.float64]) -> NDArray[np.float64]:
        """``conversions._balle_epsilons(a, e, log(delta))``: the same code, order-only parts
        computed once per grid."""
        return conversions._balle_from_terms(e, self.terms, shift, self.is_inf)


@functools.lru_cache(maxsize=16)
def _grid_info_cached(key: bytes) -> _GridInfo:
    return _GridInfo(np.frombuffer(key, dtype=np.float64))


def _grid_info(a: NDArray[np.float64]) -> _GridInfo:
    if a is _DEFAULT_GRID:
        return _DEFAULT_INFO
    return _grid_info_cached(a.tobytes())


def _bh_possible(total: NDArray[np.float64], delta: float) -> bool:
    """Whether ``delta >= sqrt(1 - exp(-eps))`` at some order, for lower bounds ``total``."""
    return bool((np.sqrt(-np.expm1(-total)) <= delta).any())


class _Geometry:
    """Where each order sits among the evaluated orders ``have`` (see :func:`_lower_bound`):
    indices, in the evaluated orders padded with two NaN on each side, of the two evaluated
    orders below (``p0 < p1``) and above (``n1 < n2``), and the chord-extension factors."""

    def __init__(self, a: NDArray[np.float64], have: NDArray[np.bool_]) -> None:
        nan2 = (np.nan, np.nan)
        self.idx = np.flatnonzero(have)
        ae = np.concatenate((nan2, a[self.idx], nan2))
        c = np.cumsum(have)  # at an unevaluated order: how many evaluated orders lie below
        self.p0, self.p1, self.n1, self.n2 = c, c + 1, c + 2, c + 3
        with np.errstate(invalid="ignore", divide="ignore"):
            self.ae_m1 = ae - 1.0
            self.up = (a - ae[self.p1]) / (ae[self.p1] - ae[self.p0])
            self.down = (ae[self.n1] - a) / (ae[self.n2] - ae[self.n1])
            self.a_m1 = a - 1.0


def _lower_bound(
    a: NDArray[np.float64],
    vals: NDArray[np.float64],
    have: NDArray[np.bool_],
    floor: float = 0.0,
    geometry: _Geometry | None = None,
) -> NDArray[np.float64]:
    """A lower bound of one subsampled-Gaussian curve at every order from its values at the
    orders ``have`` (returned as they are there).

    The curve is the exact ``D_α(μ || μ0)`` of MTZ (up to the kernel's upward error, covered
    by ``_SLACK``): non-decreasing in α, and ``F(α) = (α - 1) D_α`` is convex (log of a moment
    generating function), so ``F`` lies above the extension of every chord: with evaluated
    ``p0 < p1 < α``, ``F(α) >= F(p1) + (F(p1) - F(p0)) (α - p1) / (p1 - p0)``, and with
    ``α < n1 < n2``, ``F(α) >= F(n1) - (F(n2) - F(n1)) (n1 - α) / (n2 - n1)``. Each bound is
    evaluated with ``F`` rounded down where it enters positively and up where negatively;
    bounds that cannot be formed (no such orders, inf) come out NaN and are skipped. ``floor``
    is a lower bound valid at every order. Call under ``np.errstate(all="ignore")``.
    """
    g = geometry if geometry is not None else _Geometry(a, have)
    ve = np.concatenate(((np.nan, np.nan), vals[g.idx], (np.nan, np.nan)))
    fe = g.ae_m1 * ve
    lo, hi = 1.0 - _SLACK, 1.0 + _SLACK
    lb = np.fmax(ve[g.p1] * lo, floor)  # monotonicity: the value just below
    f1, g1 = fe[g.p1] * lo, fe[g.n1] * lo
    up = (f1 + (f1 - fe[g.p0] * hi) * g.up) / g.a_m1
    down = (g1 - (fe[g.n2] * hi - g1) * g.down) / g.a_m1
    return np.where(have, vals, np.fmax(lb, np.fmax(up, down)))


class RdpAccountant(Accountant):
    """Rényi DP accountant over a fixed grid of orders.

    Example::

        >>> from renyi.accountants import RdpAccountant
        >>> from renyi.analysis.events import GaussianEvent, PoissonSampledEvent
        >>> acc = RdpAccountant()
        >>> acc = acc.compose(PoissonSampledEvent(256 / 60000, GaussianEvent(1.1)), count=14100)
        >>> res = acc.epsilon(1e-5)   # res.epsilon ≈ 3.0, res.order is the best Rényi order

    The grid is fixed when the accountant is built; with adaptively chosen events this is
    what keeps the multi-order filter sound (Feldman & Zrnic 2021).
    """

    name = "rdp"

    def __init__(self, orders: ArrayLike = DEFAULT_ORDERS) -> None:
        super().__init__()
        self._orders = _DEFAULT_GRID if orders is DEFAULT_ORDERS else _grid(orders)
        self._total = np.zeros_like(self._orders)  # dense part of the composition so far
        # Symbolic costs composed after the dense total, in order: (cost, count).
        self._pending: list[tuple[Any, int]] = []
        # Subsampled-Gaussian values computed so far: key -> (values, which orders).
        self._values: dict[tuple[float, float], tuple[NDArray[np.float64], NDArray[np.bool_]]]
        self._values = {}

    @property
    def orders(self) -> NDArray[np.float64]:
        return self._orders

    @property
    def curve(self) -> RdpCurve:
        """The composed RDP curve so far."""
        self._fold()
        return RdpCurve(self._orders, self._total.copy())

    def _config(self) -> dict[str, Any]:
        return {"orders": [float(x) if np.isfinite(x) else "inf" for x in self._orders]}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> RdpAccountant:
        config = dict(state.get("config", {}))
        if "orders" in config:
            config["orders"] = [float(x) for x in config["orders"]]
        return super().from_state_dict({**state, "config": config})

    def _analyse(self, event: Event) -> Any:
        return _symbolic(event, self._orders)

    def _add(self, cost: Any, count: int) -> None:
        if isinstance(cost, np.ndarray) and not self._pending:
            self._total = self._total + _times(count, cost)
            return
        self._pending.append((cost, count))
        if len(self._pending) > _MAX_PENDING:
            self._fold()

    # -- lazy evaluation ------------------------------------------------------------------

    def _evaluate_at(self, leaf: _Sampled, sel: NDArray[np.bool_], cache: bool = False) -> None:
        """Make sure the curve of ``leaf`` is known at the orders ``sel``."""
        vals, have = self._values.get(leaf.key, (None, None))
        if vals is None or have is None:
            vals = np.full(self._orders.shape, np.nan)
            have = np.zeros(self._orders.shape, dtype=bool)
            self._values[leaf.key] = (vals, have)
        need = sel & ~have
        if need.any():
            vals[need] = subsampling._gaussian_rdp_subset(
                leaf.q, leaf.sigma, self._orders, need, cache=cache
            )
            have |= need

    def _pending_total(self, leaf: dict[tuple[float, float], NDArray[np.float64]]) -> Any:
        total = self._total
        for cost, count in self._pending:
            total = total + _times(count, _evaluate(cost, leaf))
        return total

    def _fold(self) -> None:
        """Evaluate the pending costs on the whole grid and add them to the dense total."""
        if not self._pending:
            return
        leaves: dict[tuple[float, float], _Sampled] = {}
        for cost, _ in self._pending:
            _leaves(cost, leaves)
        everywhere = np.ones(self._orders.shape, dtype=bool)
        for leaf in leaves.values():
            self._evaluate_at(leaf, everywhere)
        self._total = self._pending_total({k: self._values[k][0] for k in leaves})
        self._pending = []

    def _lazy_epsilon(self, delta: float) -> tuple[float, float] | None:
        """``(epsilon, order)`` of the full grid, evaluating the subsampled Gaussian only where
        it can matter; None where the Bretagnolle-Huber case cannot be ruled out."""
        a = self._orders
        grid = _grid_info(a)
        leaves: dict[tuple[float, float], _Sampled] = {}
        for cost, _ in self._pending:
            _leaves(cost, leaves)
        # A fresh leaf is evaluated at the grid's first-pass orders exactly (cached tables).
        fresh = not any(key in self._values for key in leaves)
        for leaf in leaves.values():
            self._evaluate_at(leaf, grid.first, cache=fresh)
        # First pass: exact values where every leaf is known, lower bounds elsewhere.
        ev = np.ones(a.shape, dtype=bool)
        lower: dict[tuple[float, float], NDArray[np.float64]] = {}
        for key in leaves:
            vals, have = self._values[key]
            ev &= have
            geometry = grid.first_geometry if fresh else None
            lower[key] = _lower_bound(a, vals, have, leaves[key].floor, geometry)
        total = self._pending_total(lower)
        shift = grid.shift(delta)
        eps = grid.balle(total, shift)
        best = float(np.minimum.reduce(eps[ev]))
        # Every order whose bound does not exceed the best value so far is evaluated, and the
        # first order if Bretagnolle-Huber (rdp_to_dp's first test: some order with
        # sqrt(1 - exp(-eps(alpha))) <= delta) is not ruled out yet: its value bounds the rest.
        todo = ~ev & ~(eps > best)
        bh = _bh_possible(total, delta)
        if bh and not ev[0]:
            todo[0] = True
        if todo.any():
            for leaf in leaves.values():
                self._evaluate_at(leaf, todo, cache=True)  # tables: orders only
            ev |= todo
            if bh:  # exact where evaluated, monotone lower bounds elsewhere
                for key in leaves:
                    vals, have = self._values[key]
                    known = np.where(have, vals, 0.0)
                    mono = np.maximum.accumulate(known) * (1.0 - _SLACK)
                    lower[key] = np.where(have, vals, np.maximum(mono, leaves[key].floor))
                total = self._pending_total(lower)
                bh = _bh_possible(total, delta)
            else:  # the first bounds already ruled Bretagnolle-Huber out; exact values on ev
                total = self._pending_total({key: self._values[key][0] for key in leaves})
            eps = grid.balle(total, shift)
        if bh:
            return None  # Bretagnolle-Huber might apply: let the full grid decide
        # Orders outside ev were ruled out: their bound exceeds a value attained on ev.
        eps = np.where(ev, eps, np.inf)
        i = int(np.argmin(eps))
        return max(float(eps[i]), 0.0), float(a[i])

    # -- queries --------------------------------------------------------------------------

    def _epsilon(self, delta: float) -> EpsilonResult:
        if self._pending and self._orders.size > _MIN_LAZY_ORDERS:
            with np.errstate(all="ignore"):  # inf and NaN are handled explicitly
                found = self._lazy_epsilon(delta)
            if found is not None:
                eps, order = found
                if order in _grid_info(self._orders).edges:
                    _warn_edge(order, self._orders)
                return EpsilonResult(eps, delta, self.name, order=order)
        conv = self.curve.to_dp(delta)
        return EpsilonResult(conv.epsilon, delta, self.name, order=conv.order)

    def _delta(self, epsilon: float) -> DeltaResult:
        conv = self.curve.to_delta(epsilon)
        return DeltaResult(conv.delta, epsilon, self.name, order=conv.order)


def _grid(orders: ArrayLike) -> NDArray[np.float64]:
    out = check_orders(orders)
    out.setflags(write=False)
    return out


_DEFAULT_GRID = _grid(DEFAULT_ORDERS)
_DEFAULT_INFO = _GridInfo(_DEFAULT_GRID)
