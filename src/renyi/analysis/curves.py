"""Privacy guarantees as immutable values with the algebra the papers prove.

* :class:`RdpCurve`: an RDP curve ``alpha -> eps(alpha)`` on a grid of orders (Mironov 2017,
  Def. 4). Sequential composition is ``+`` (pointwise sum, Mironov 2017 Prop. 1), k-fold
  self-composition is ``k * curve``; conversions to ``(epsilon, delta)``-DP report the order
  that achieves the bound.
* :class:`Zcdp` (Bun & Steinke 2016), :class:`PureDp` and :class:`ApproxDp` with their
  composition rules, group privacy and conversions.
* :func:`post_process`: the post-processing theorem (the guarantee is unchanged).

Every guarantee is stated for a neighbouring relation fixed by the caller (e.g. add/remove
one record); composition and conversions preserve that relation, and group privacy turns it
into "differ in up to ``size`` records". The formulas themselves live in
:mod:`renyi.conversions` and :mod:`renyi.closed_forms` (one source of truth per formula).

Example:
    >>> from renyi.analysis.closed_forms import gaussian_rdp
    >>> step = RdpCurve.from_function(lambda a: gaussian_rdp(200.0, a))
    >>> total = 500 * step
    >>> conversion = total.to_dp(1e-5)
    >>> round(conversion.epsilon, 4), conversion.order
    (0.4234, 37.0)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_delta, check_int, check_nonnegative, check_range, fail
from renyi.analysis import conversions as conv
from renyi.errors import OrderAtGridEdgeWarning, PrivacyParameterError

__all__ = [
    "DEFAULT_ORDERS",
    "ApproxDp",
    "DpConversion",
    "PureDp",
    "RdpCurve",
    "Zcdp",
    "post_process",
]


def _default_orders() -> NDArray[np.float64]:
    # Integer numerators over powers of ten: each division is correctly rounded, so 1.1 here
    # is exactly the float literal 1.1 (no accumulated floating-point error).
    near_one = (100 + np.arange(1, 10)) / 100.0  # 1.01 .. 1.09
    tenths = (10 + np.arange(1, 100)) / 10.0  # 1.1 .. 10.9 (dp_accounting, Opacus)
    integers = np.arange(11, 64, dtype=np.float64)  # 11 .. 63
    large = np.concatenate(
        [
            np.arange(64, 128, 4),  # 64 .. 124
            np.arange(128, 256, 16),  # 128 .. 240
            np.arange(256, 512, 32),  # 256 .. 480
            np.arange(512, 1025, 64),  # 512 .. 1024
        ]
    ).astype(np.float64)
    grid = np.unique(np.concatenate([near_one, tenths, integers, large]))
    grid.setflags(write=False)
    return grid


DEFAULT_ORDERS: NDArray[np.float64] = _default_orders()
"""Default grid of Rényi orders (read-only, float64, sorted): 1.01-1.09, 1.1-10.9 in steps of
0.1, the integers 11-63, then 64-1024 with growing steps (202 orders). It contains the default
grids of dp_accounting and Opacus below 512."""

ConversionMethod = Literal["balle2020", "mironov"]


def _grid(orders: Any) -> NDArray[np.float64]:
    """A 1-D float64 array of orders > 1 (``inf`` allowed) in the caller's order; a scalar is
    one order. Raises :class:`PrivacyParameterError` otherwise."""
    try:
        raw = np.asarray(orders)
    except (TypeError, ValueError):  # pragma: no cover - ragged nested sequences
        raise fail("orders", orders, "a non-empty 1-D array of real numbers > 1") from None
    if raw.dtype.kind not in "iuf" or raw.ndim > 1 or raw.size == 0:
        raise fail("orders", orders, "a non-empty 1-D array of real numbers > 1")
    new = np.atleast_1d(raw.astype(np.float64))
    bad = np.isnan(new) | ~(new > 1.0)
    if bad.any():
        raise fail("orders", float(new[bad][0]), "every order > 1 (inf allowed, NaN not)")
    return new


def _readonly(a: NDArray[np.float64]) -> NDArray[np.float64]:
    a = np.array(a, dtype=np.float64, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class DpConversion:
    """An ``(epsilon, delta)``-DP guarantee obtained by converting another guarantee.

    Attributes:
        epsilon: the privacy loss bound (>= 0, possibly ``inf``).
        delta: the failure probability.
        order: the Rényi order at which the conversion was optimal (``None`` if none applies).
        method: the name of the conversion theorem used.
    """

    epsilon: float
    delta: float
    order: float | None
    method: str


def _warn_edge(order: float, orders: NDArray[np.float64]) -> None:
    finite = orders[np.isfinite(orders)]
    if finite.size and (order == finite[0] or order == finite[-1]):
        warnings.warn(
            OrderAtGridEdgeWarning(
                f"the optimal Rényi order {order:g} is at the edge of the grid "
                f"[{finite[0]:g}, {finite[-1]:g}]: a wider grid may give a tighter bound"
            ),
            stacklevel=3,
        )


def _check_method(method: Any) -> str:
    if method not in ("balle2020", "mironov"):
        raise fail("method", method, "'balle2020' or 'mironov'")
    return str(method)


def _check_count(k: Any) -> int:
    return check_int("k", k, 0)


@dataclass(frozen=True, eq=False)
class RdpCurve:
    """An RDP guarantee: ``(alpha, epsilons[i])``-RDP for each ``alpha = orders[i]``.

    Mironov 2017, Definition 4: ``D_alpha(M(D) || M(D')) <= eps(alpha)`` for all neighbouring
    ``D, D'``. The arrays are validated (orders > 1, ``inf`` allowed, no duplicates;
    epsilons >= 0, ``inf`` allowed, never NaN), sorted by order and made read-only.

    Example:
        >>> c = RdpCurve([2.0, 4.0], [0.5, 1.0])
        >>> (c + c).epsilons.tolist(), (3 * c).epsilons.tolist()
        ([1.0, 2.0], [1.5, 3.0])
    """

    orders: NDArray[np.float64]
    epsilons: NDArray[np.float64]

    def __post_init__(self) -> None:
        raw_o = np.asarray(self.orders)
        raw_e = np.asarray(self.epsilons)
        if raw_o.dtype.kind not in "iuf" or raw_o.ndim != 1 or raw_o.size == 0:
            raise fail("orders", self.orders, "a non-empty 1-D array of real numbers > 1")
        if raw_e.dtype.kind not in "iuf" or raw_e.shape != raw_o.shape:
            raise fail(
                "epsilons",
                self.epsilons,
                f"a 1-D array of real numbers with one value per order ({raw_o.size})",
            )
        o = raw_o.astype(np.float64)
        e = raw_e.astype(np.float64)
        bad = np.isnan(o) | ~(o > 1.0)
        if bad.any():
            raise fail("orders", float(o[bad][0]), "every order > 1 (inf allowed, NaN not)")
        bad = np.isnan(e) | ~(e >= 0.0)
        if bad.any():
            raise fail("epsilons", float(e[bad][0]), "every epsilon >= 0 (inf allowed, NaN not)")
        idx = np.argsort(o, kind="stable")
        o, e = o[idx], e[idx]
        if o.size > 1 and (np.diff(o) == 0).any():
            dup = float(o[1:][np.diff(o) == 0][0])
            raise fail("orders", dup, "distinct orders (each order at most once)")
        object.__setattr__(self, "orders", _readonly(o))
        object.__setattr__(self, "epsilons", _readonly(e))

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_function(
        cls, fn: Callable[[NDArray[np.float64]], ArrayLike], orders: ArrayLike = DEFAULT_ORDERS
    ) -> RdpCurve:
        """Evaluate ``fn(orders)`` (one epsilon per order) into a curve.

        Example:
            >>> RdpCurve.from_function(lambda a: a / 2, [2.0, 3.0]).epsilons.tolist()
            [1.0, 1.5]
        """
        o = _grid(orders)
        return cls(o, np.asarray(fn(o)))

    # -- algebra ------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RdpCurve):
            return NotImplemented
        return bool(
            np.array_equal(self.orders, other.orders)
            and np.array_equal(self.epsilons, other.epsilons)
        )

    def __hash__(self) -> int:
        return hash((self.orders.tobytes(), self.epsilons.tobytes()))

    def __repr__(self) -> str:
        return f"RdpCurve(orders={self.orders.tolist()!r}, epsilons={self.epsilons.tolist()!r})"

    def __add__(self, other: RdpCurve) -> RdpCurve:
        """Sequential (adaptive) composition: pointwise sum (Mironov 2017, Proposition 1)."""
        if not isinstance(other, RdpCurve):
            return NotImplemented
        if not np.array_equal(self.orders, other.orders):
            raise PrivacyParameterError(
                "cannot compose RDP curves on different grids of orders "
                f"({self.orders.size} vs {other.orders.size} orders): evaluate both on a common "
                "grid first with curve.at(orders)"
            )
        return RdpCurve(self.orders, self.epsilons + other.epsilons)

    def __radd__(self, other: object) -> RdpCurve:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # so that sum(curves) works
        return NotImplemented

    def __mul__(self, k: int) -> RdpCurve:
        """``k``-fold self-composition (Mironov 2017, Proposition 1 applied ``k`` times)."""
        n = _check_count(k)
        if n == 0:
            return RdpCurve(self.orders, np.zeros_like(self.epsilons))
        return RdpCurve(self.orders, n * self.epsilons)

    __rmul__ = __mul__

    # -- conversions --------------------------------------------------------------------------

    def to_dp(self, delta: float, method: ConversionMethod = "balle2020") -> DpConversion:
        """The ``(epsilon, delta)``-DP guarantee implied by this curve, optimised over orders.

        ``method="balle2020"`` (default): Balle et al. 2020, Theorem 21 = Canonne, Kamath &
        Steinke 2020, Proposition 12 (:func:`renyi.analysis.conversions.rdp_to_dp`);
        ``method="mironov"``: Mironov 2017, Proposition 3. Warns with
        :class:`~renyi.errors.OrderAtGridEdgeWarning` when the optimal order is the first or
        last finite order of the grid.

        Example:
            >>> c = RdpCurve([2.0, 4.0, 8.0], [1.0, 2.0, 4.0])
            >>> c.to_dp(1e-5).order
            4.0
        """
        m = _check_method(method)
        d = check_delta(delta)
        fn = conv.rdp_to_dp if m == "balle2020" else conv.rdp_to_dp_mironov
        eps, order = fn(self.orders, self.epsilons, d)
        _warn_edge(order, self.orders)
        return DpConversion(epsilon=eps, delta=d, order=order, method=m)

    def to_delta(self, epsilon: float, method: ConversionMethod = "balle2020") -> DpConversion:
        """The smallest ``delta`` for which this curve implies ``(epsilon, delta)``-DP.

        Same theorems as :meth:`to_dp` (:func:`renyi.analysis.conversions.rdp_to_delta` and
        :func:`renyi.analysis.conversions.rdp_to_delta_mironov`), same edge warning.

        Example:
            >>> c = RdpCurve([2.0, 4.0, 8.0], [1.0, 2.0, 4.0])
            >>> c.to_delta(5.09).delta < 1e-5
            True
        """
        m = _check_method(method)
        eps = check_nonnegative("epsilon", epsilon)
        fn = conv.rdp_to_delta if m == "balle2020" else conv.rdp_to_delta_mironov
        d, order = fn(self.orders, self.epsilons, eps)
        _warn_edge(order, self.orders)
        return DpConversion(epsilon=eps, delta=d, order=order, method=m)

    def at(self, orders: ArrayLike) -> RdpCurve:
        """Conservative re-gridding: this guarantee on another grid of orders.

        ``eps(alpha)`` is non-decreasing in ``alpha`` (Mironov 2017, Proposition 8 / Table I;
        van Erven & Harremoës 2014, Thm. 3), so at a new order ``beta`` the value at the
        smallest tracked order ``>= beta`` is a valid bound; above the largest tracked order
        the only valid bound is ``inf``.

        Example:
            >>> RdpCurve([2.0, 4.0], [0.5, 1.0]).at([1.5, 2.0, 3.0, 5.0]).epsilons.tolist()
            [0.5, 0.5, 1.0, inf]
        """
        new = np.unique(_grid(orders))
        idx = np.searchsorted(self.orders, new, side="left")
        inside = idx < self.orders.size
        eps = np.full(new.shape, math.inf)
        eps[inside] = self.epsilons[idx[inside]]
        return RdpCurve(new, eps)

    def group(self, size: int) -> RdpCurve:
        """RDP for groups of ``size`` records (Mironov 2017, Proposition 2).

        The size is rounded up to ``2^c``; orders ``alpha >= 2^(c+1)`` become ``alpha / 2^c``
        with epsilon multiplied by ``3^c`` (:func:`renyi.analysis.conversions.group_privacy_rdp`).

        Example:
            >>> RdpCurve([2.0, 4.0, 8.0], [1.0, 2.0, 4.0]).group(2).orders.tolist()
            [2.0, 4.0]
        """
        o, e = conv.group_privacy_rdp(self.orders, self.epsilons, size)
        return RdpCurve(o, e)


def _scale(k: Any, value: float) -> float:
    n = _check_count(k)
    return 0.0 if n == 0 else n * value


@dataclass(frozen=True)
class Zcdp:
    """``rho``-zero-concentrated DP: ``D_alpha <= rho * alpha`` for all ``alpha > 1``.

    Bun & Steinke 2016, Definition 1.1. Composition adds ``rho`` (Lemma 2.3); a group of
    ``k`` records gets ``k^2 rho`` (Proposition 1.9). ``rho = inf`` is allowed (no guarantee).

    Example:
        >>> z = 500 * Zcdp(1 / (2 * 200.0**2))
        >>> round(z.to_dp(1e-5, method="bun_steinke").epsilon, 4)
        0.5427
    """

    rho: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", check_nonnegative("rho", self.rho, allow_inf=True))

    def __add__(self, other: Zcdp) -> Zcdp:
        """Composition: ``rho``'s add (Bun & Steinke 2016, Lemma 2.3)."""
        if not isinstance(other, Zcdp):
            return NotImplemented
        return Zcdp(self.rho + other.rho)

    def __radd__(self, other: object) -> Zcdp:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented

    def __mul__(self, k: int) -> Zcdp:
        return Zcdp(_scale(k, self.rho))

    __rmul__ = __mul__

    def group(self, size: int) -> Zcdp:
        """Group privacy: ``size^2 rho`` (Bun & Steinke 2016, Proposition 1.9)."""
        k = check_int("size", size, 1)
        return Zcdp(self.rho * k * k)

    def to_rdp(self, orders: ArrayLike = DEFAULT_ORDERS) -> RdpCurve:
        """The RDP curve ``rho * alpha`` on ``orders`` (:func:`renyi.conversions.zcdp_to_rdp`)."""
        o = _grid(orders)
        return RdpCurve(o, conv.zcdp_to_rdp(self.rho, o))

    def to_dp(
        self, delta: float, method: Literal["optimal", "bun_steinke"] = "optimal"
    ) -> DpConversion:
        """``(epsilon, delta)``-DP: ``"optimal"`` (Balle et al. 2020 Thm. 21 on ``rho alpha``,
        minimised over continuous ``alpha``) or ``"bun_steinke"`` (Bun & Steinke 2016, Prop.
        1.3: ``rho + 2 sqrt(rho log 1/delta)``)."""
        d = check_delta(delta)
        if method == "optimal":
            eps, order = conv.zcdp_to_dp(self.rho, d)
            return DpConversion(eps, d, order, "optimal")
        if method == "bun_steinke":
            return DpConversion(conv.zcdp_to_dp_bun_steinke(self.rho, d), d, None, "bun_steinke")
        raise fail("method", method, "'optimal' or 'bun_steinke'")

    def to_delta(self, epsilon: float) -> DpConversion:
        """Smallest ``delta`` for ``(epsilon, delta)``-DP, optimised over continuous orders.

        See :func:`renyi.analysis.conversions.zcdp_to_delta` (Balle et al. 2020, Theorem 21).
        """
        eps = check_nonnegative("epsilon", epsilon)
        d, order = conv.zcdp_to_delta(self.rho, eps)
        return DpConversion(eps, d, order, "optimal")


@dataclass(frozen=True)
class PureDp:
    """``epsilon``-DP: ``D_inf(M(D) || M(D')) <= epsilon`` for all neighbouring ``D, D'``.

    Composition adds epsilons (Dwork & Roth 2014, Thm. 3.14); a group of ``k`` records gets
    ``k epsilon`` (Dwork & Roth 2014, Thm. 2.2).

    Example:
        >>> (PureDp(0.5) + PureDp(0.25)).epsilon
        0.75
    """

    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "epsilon", check_nonnegative("epsilon", self.epsilon, allow_inf=True)
        )

    def __add__(self, other: PureDp) -> PureDp:
        if not isinstance(other, PureDp):
            return NotImplemented
        return PureDp(self.epsilon + other.epsilon)

    def __radd__(self, other: object) -> PureDp:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented

    def __mul__(self, k: int) -> PureDp:
        return PureDp(_scale(k, self.epsilon))

    __rmul__ = __mul__

    def group(self, size: int) -> PureDp:
        """Group privacy: ``size * epsilon`` (Dwork & Roth 2014, Theorem 2.2)."""
        k = check_int("size", size, 1)
        return PureDp(k * self.epsilon)

    def to_rdp(
        self,
        orders: ArrayLike = DEFAULT_ORDERS,
        method: Literal["randomized_response", "lemma1", "bun_steinke"] = "randomized_response",
    ) -> RdpCurve:
        """RDP curve of ``epsilon``-DP.

        ``"randomized_response"`` (default, tightest; :func:`renyi.conversions.pure_to_rdp`),
        ``"lemma1"`` (``min(eps, 2 alpha eps^2)``, Mironov 2017 Lemma 1) or ``"bun_steinke"``
        (``alpha eps^2 / 2``, Bun & Steinke 2016 Prop. 3.3).
        """
        fns = {
            "randomized_response": conv.pure_to_rdp,
            "lemma1": conv.pure_to_rdp_lemma1,
            "bun_steinke": conv.pure_to_rdp_bun_steinke,
        }
        if method not in fns:
            raise fail("method", method, "'randomized_response', 'lemma1' or 'bun_steinke'")
        o = _grid(orders)
        return RdpCurve(o, fns[method](self.epsilon, o))

    def to_zcdp(self) -> Zcdp:
        """``(epsilon^2 / 2)``-zCDP (Bun & Steinke 2016, Proposition 3.3)."""
        return Zcdp(conv.pure_to_zcdp(self.epsilon))

    def to_approx(self) -> ApproxDp:
        """``(epsilon, 0)``-DP (the definition)."""
        return ApproxDp(self.epsilon, 0.0)


@dataclass(frozen=True)
class ApproxDp:
    """``(epsilon, delta)``-DP: ``P[M(D) in S] <= e^epsilon P[M(D') in S] + delta``.

    ``delta`` in ``[0, 1]`` (0 is pure DP). Composition is basic composition (epsilons and
    deltas add; Dwork & Roth 2014, Theorem 3.16), with the sum of deltas capped at 1 (every
    mechanism is ``(epsilon, 1)``-DP).

    Example:
        >>> 3 * ApproxDp(0.1, 1e-6)
        ApproxDp(epsilon=0.30000000000000004, delta=3e-06)
    """

    epsilon: float
    delta: float = field(default=0.0)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "epsilon", check_nonnegative("epsilon", self.epsilon, allow_inf=True)
        )
        object.__setattr__(self, "delta", check_range("delta", self.delta, 0.0, 1.0))

    def __add__(self, other: ApproxDp) -> ApproxDp:
        """Basic composition (Dwork & Roth 2014, Theorem 3.16)."""
        if not isinstance(other, ApproxDp):
            return NotImplemented
        return ApproxDp(self.epsilon + other.epsilon, min(self.delta + other.delta, 1.0))

    def __radd__(self, other: object) -> ApproxDp:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented

    def __mul__(self, k: int) -> ApproxDp:
        """``k``-fold basic composition: ``(k epsilon, k delta)``."""
        return ApproxDp(_scale(k, self.epsilon), min(_scale(k, self.delta), 1.0))

    __rmul__ = __mul__

    def group(self, size: int) -> ApproxDp:
        """Group privacy: ``(k eps, k e^((k-1) eps) delta)``.

        Dwork & Roth 2014, Theorem 2.2 and its (epsilon, delta) analogue (Section 2.3): chaining
        the guarantee along ``k`` neighbouring steps gives ``delta * sum_{i<k} e^(i eps)``,
        which is at most ``k e^((k-1) eps) delta``. Capped at 1.
        """
        k = check_int("size", size, 1)
        if self.delta == 0.0:
            d = 0.0
        else:
            log_d = math.log(k) + (k - 1) * self.epsilon + math.log(self.delta)
            d = 1.0 if log_d >= 0.0 else math.exp(log_d)
        return ApproxDp(k * self.epsilon, d)


_G = TypeVar("_G", RdpCurve, Zcdp, PureDp, ApproxDp, DpConversion)


def post_process(guarantee: _G) -> _G:
    """The guarantee of ``f(M)`` for any (randomised) map ``f`` independent of the data.

    Post-processing cannot weaken privacy: if ``M`` satisfies a guarantee, so does ``f o M``
    (Mironov 2017, Proposition 9 for RDP; Bun & Steinke 2016, Lemma 1.8 for zCDP; Dwork & Roth
    2014, Proposition 2.1 for (epsilon, delta)-DP). Hence the guarantee is returned unchanged;
    this function exists to make the step explicit in an analysis.

    Example:
        >>> post_process(PureDp(1.0))
        PureDp(epsilon=1.0)
    """
    if not isinstance(guarantee, RdpCurve | Zcdp | PureDp | ApproxDp | DpConversion):
        raise fail("guarantee", guarantee, "an RdpCurve, Zcdp, PureDp, ApproxDp or DpConversion")
    return guarantee
