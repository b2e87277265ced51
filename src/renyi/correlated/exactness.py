"""Exact correlated-noise releases: the exact coefficient rows of each streaming filter and a
proven bound on the rounding error of its float64 output.

Step ``t`` of correlated training releases ``x_t + σ·sens·y_t`` on the lattice, where the ideal
``y_t = Σ_j R[t, j] Z_j`` combines the ideal normals ``Z_j`` of counters ``(0, j, i)``
(:class:`renyi.noise.CounterNoise`) with the exact noising matrix ``R`` **of the coefficients
the strategy holds** (floats, used as exact dyadic rationals): banded ``R = C⁻¹`` for the
banded Toeplitz ``C`` with those ``c_m``; BLT ``R = C⁻¹`` for ``c_j = Σ_i ω_i θ_i^{j−1}``
(exact reals); the tree's ±1 rows; the banded inverse's ``r_j``. The streaming filters
(:mod:`renyi.correlated.streaming`) compute ``y_t`` in float64; each class here mirrors one
filter's arithmetic and returns, per step, a bound ``B_t ≥ max_i |ŷ_t(i) − y_t(i)|`` from
four scalars per step (the normals' error bound and ``max |z_t|``, ``max |ŷ_t|``), and the
exact row ``R[t, ·]`` for the rare coordinates that
:meth:`renyi.noise.CounterNoise.snap_combination` recomputes from the counters.

Error analysis (``u = 2⁻⁵³``, ``γ_k = k u/(1 − k u)``; docs/noise.md, "Correlated noise"):

* finite rows (banded inverse, tree): ``B_t = Σ_j |R[t,j]| (d_j + γ_K a_j)`` with ``K`` the
  number of terms (Higham's bound for a sum of ``K`` rounded products in any order);
* banded ``C`` (``ŷ_t = ẑ_t − Σ_m c_m ŷ_{t−m}``): the computed output is the exact filter
  driven by ``ẑ_t + ρ_t``, ``|ρ_t| ≤ γ_b (a_t + Σ_m |c_m| Y_{t−m})``, so the error is
  ``h * (δz + ρ)`` and ``B_t = Σ_j H̄_{t−j} (d_j + ρ̄_j)`` with ``H̄_n ≥ |h_n|`` (``h`` the
  impulse response of ``1/c(x)``);
* BLT (``ŷ = ẑ − Σ ω_i Ŝ_i``, ``Ŝ_i ← θ_i Ŝ_i + ŷ``): an error ``σ`` in state ``i`` acts as
  the output errors ``−ω_i θ_i^k σ`` afterwards, so ``B_t = Σ_j H̄_{t−j} q_j`` with ``q_j =
  d_j + ρ̄_j + Σ_i ω_i Σ̄_{i,j}`` (``Σ̄`` the decayed sum of the state rounding bounds).

The impulse response ``h`` is computed in fixed point (Python integers at ``2⁻ᴾ``) by the same
recursion; each step rounds at most ``W`` units, so ``|ĥ_n − h_n| ≤ W 2⁻ᴾ Λ_n`` with
``Λ_n = Σ_{k≤n} |h_k| ≤ Λ̂_n / (1 − (n+1) W 2⁻ᴾ)``: rows carry that radius.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from fractions import Fraction
from typing import Any

import numpy as np

from renyi._validation import check_int, fail
from renyi.correlated.strategies import (
    BandedInverseStrategy,
    BandedToeplitzStrategy,
    BltStrategy,
    Strategy,
    TreeStrategy,
)
from renyi.noise import CombinationRow
from renyi.noise._combination import UNIT_ROUNDOFF, gamma

__all__ = ["FilterExactness", "filter_exactness"]

_U = UNIT_ROUNDOFF
_P0 = 160  # fixed-point bits of the impulse response kept step by step


def _ratio(x: float) -> tuple[int, int]:
    """``(num, e)`` with ``x = num 2**-e`` exactly (``e >= 0``)."""
    num, den = float(x).as_integer_ratio()
    return num, den.bit_length() - 1


def _mul_round(num: int, e: int, v: int) -> int:
    """``round(num 2**-e v)`` to the nearest integer (ties up): error at most 1/2."""
    if e == 0:
        return num * v
    return (num * v + (1 << (e - 1))) >> e


def _up(x: int, shift: int) -> float:
    """A float64 upper bound of ``x 2**-shift`` for an integer ``x >= 0``."""
    return math.ldexp(float(x), -shift) * (1.0 + 2.0**-51) if x else 0.0


class FilterExactness(ABC):
    """Bookkeeping of one streaming filter: :meth:`observe` records each step's scalars and
    returns its error bound; :meth:`row` gives the exact row of ``R`` for a step."""

    #: Terms per step of the filter's float arithmetic (for the bound's own rounding).
    width = 1

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """Forget every step (subclasses reset their recursions too)."""
        self.err: list[float] = []  # bound on |ẑ_t − Z_t|
        self.zmax: list[float] = []  # max |ẑ_t|
        self.ymax: list[float] = []  # max |ŷ_t|

    @property
    def steps(self) -> int:
        """Steps observed so far."""
        return len(self.err)

    def observe(self, step: int, err: float, zmax: float, ymax: float) -> float:
        """Record step ``step`` (the next one) and return ``B_step ≥ max_i |ŷ_step(i) −
        y_step(i)|`` for the ideal ``y`` of the strategy's exact ``R``."""
        self._record(step, err, zmax, ymax)
        return self._bound(step) * (1.0 + 16.0 * (step + 1) * (self.width + 8) * _U)

    def _record(self, step: int, err: float, zmax: float, ymax: float) -> None:
        if check_int("step", step, 0) != self.steps:
            raise fail("step", step, f"{self.steps} (the next step of this filter)")
        for name, v in (("err", err), ("zmax", zmax), ("ymax", ymax)):
            if not (v >= 0.0):
                raise fail(name, v, "a number >= 0")
        self.err.append(float(err))
        self.zmax.append(float(zmax))
        self.ymax.append(float(ymax))
        self._advance(step)

    def _advance(self, step: int) -> None:  # noqa: B027 - optional hook
        """Update internal recursions after step ``step`` is recorded."""

    @abstractmethod
    def _bound(self, t: int) -> float: ...

    @abstractmethod
    def row(self, step: int, bits: int = 128) -> CombinationRow:
        """Row ``step`` of ``R``: coefficients exact or within ``2**-bits``."""

    def state_dict(self) -> dict[str, Any]:
        """The per-step scalars (derived from the noise: as secret as the checkpoint)."""
        return {"err": list(self.err), "zmax": list(self.zmax), "ymax": list(self.ymax)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replay the recorded scalars (rebuilds the impulse response and recursions)."""
        try:
            cols = [list(map(float, state[k])) for k in ("err", "zmax", "ymax")]
        except (KeyError, TypeError, ValueError):
            raise fail("state", "exactness state", "{'err', 'zmax', 'ymax'} lists") from None
        if len({len(c) for c in cols}) != 1:
            raise fail("state", [len(c) for c in cols], "lists of equal length")
        self._reset()
        for t, (e, a, y) in enumerate(zip(*cols, strict=True)):
            self._record(t, e, a, y)


class _FiniteRows(FilterExactness):
    """Rows with finitely many float coefficients (banded inverse; the tree's ±1)."""

    @abstractmethod
    def _terms(self, t: int) -> tuple[list[int], list[float]]: ...

    def _bound(self, t: int) -> float:
        steps, coefs = self._terms(t)
        g = gamma(len(steps))
        return sum(
            abs(c) * (self.err[j] + g * self.zmax[j]) for j, c in zip(steps, coefs, strict=True)
        )

    def row(self, step: int, bits: int = 128) -> CombinationRow:
        steps, coefs = self._terms(check_int("step", step, 0))
        return CombinationRow.from_floats(steps, coefs)


class _BandedInverseRows(_FiniteRows):
    def __init__(self, coefs: tuple[float, ...]) -> None:
        super().__init__()
        self.coefs = coefs
        self.width = len(coefs)

    def _terms(self, t: int) -> tuple[list[int], list[float]]:
        k = min(len(self.coefs), t + 1)
        return [t - j for j in range(k)], list(self.coefs[:k])


class _TreeRows(_FiniteRows):
    width = 64

    def _terms(self, t: int) -> tuple[list[int], list[float]]:
        n = t + 1
        top = (n & -n).bit_length() - 1
        return [t] + [t - (1 << lv) for lv in range(top)], [1.0] + [-1.0] * top


class _IirRows(FilterExactness):
    """Infinite rows ``R[t, j] = h_{t−j}`` (banded ``C``, BLT): ``h`` in fixed point."""

    def _reset(self) -> None:
        super()._reset()
        self._h: list[int] = []  # ĥ_n 2**P0
        self._lam = 0  # Σ |ĥ_n| 2**P0
        self._hbar = np.zeros(16)  # float upper bounds of |h_n|
        self._q = np.zeros(16)  # per-step injected error bounds
        self._fixed = self._fixed_state(_P0)

    # fixed-point recursion of the filter (impulse input): state object, next ĥ
    @abstractmethod
    def _fixed_state(self, p: int) -> Any: ...

    @abstractmethod
    def _fixed_next(self, state: Any, n: int, p: int) -> int: ...

    @property
    @abstractmethod
    def _w(self) -> Fraction:
        """Rounding error (units of 2**-P) injected per step of the fixed-point recursion."""

    @abstractmethod
    def _injected(self, t: int) -> float:
        """``q_t``: bound on the error the float filter injects at step ``t``."""

    def _radius(self, n: int, lam: int, p: int) -> int:
        """Units of ``2**-p`` bounding ``|ĥ_k − h_k|`` for every ``k <= n``."""
        room = (1 << p) - (n + 1) * self._w
        if room <= (1 << (p - 1)):
            raise fail("steps", n, "fewer steps (the fixed-point impulse response lost precision)")
        return math.ceil(self._w * lam / room) + 1

    def _grow(self, arr: np.ndarray, n: int) -> np.ndarray:
        if n < arr.size:
            return arr
        out = np.zeros(max(2 * arr.size, n + 1))
        out[: arr.size] = arr
        return out

    def _advance(self, step: int) -> None:
        h = self._fixed_next(self._fixed, step, _P0)
        self._h.append(h)
        self._lam += abs(h)
        rad = self._radius(step, self._lam, _P0)
        self._hbar = self._grow(self._hbar, step)
        self._hbar[step] = _up(abs(h) + rad, _P0)
        self._q = self._grow(self._q, step)
        self._q[step] = self._injected(step)

    def _bound(self, t: int) -> float:
        return float(np.dot(self._hbar[t::-1][: t + 1], self._q[: t + 1]))

    def _h_at(self, p: int, t: int) -> tuple[list[int], int]:
        """``(ĥ_0..ĥ_t at 2**-p, radius)``."""
        if p == _P0:
            return self._h[: t + 1], self._radius(t, sum(abs(x) for x in self._h[: t + 1]), p)
        state = self._fixed_state(p)
        hs = [self._fixed_next(state, n, p) for n in range(t + 1)]
        return hs, self._radius(t, sum(abs(x) for x in hs), p)

    def row(self, step: int, bits: int = 128) -> CombinationRow:
        t = check_int("step", step, 0)
        if t >= self.steps:
            raise fail("step", step, f"an observed step (< {self.steps})")
        p = _P0
        hs, rad = self._h_at(p, t)
        if p < bits or rad > 1 << (p - bits):  # radius 2**-p rad above 2**-bits: more bits
            p = bits + rad.bit_length() + 2  # rad (about W Λ) hardly depends on p
            hs, rad = self._h_at(p, t)
        return CombinationRow(tuple(range(t + 1)), tuple(reversed(hs)), p, rad)


class _BandedRows(_IirRows):
    def __init__(self, coefs: tuple[float, ...]) -> None:
        self.coefs = coefs
        self.width = len(coefs)
        self._c = [_ratio(c) for c in coefs[1:]]
        super().__init__()

    @property
    def _w(self) -> Fraction:
        return Fraction(max(len(self._c), 1), 2)

    def _fixed_state(self, p: int) -> Any:
        return []  # the past ĥ, newest last

    def _fixed_next(self, state: Any, n: int, p: int) -> int:
        if n == 0:
            h = 1 << p
        else:
            h = 0
            for m, (num, e) in enumerate(self._c, start=1):
                if m > n:
                    break
                h -= _mul_round(num, e, state[n - m])
        state.append(h)
        return h

    def _injected(self, t: int) -> float:
        k = min(len(self._c), t)
        rho = 0.0
        if k:
            rho = gamma(k + 1) * (
                self.zmax[t] + sum(abs(self.coefs[m]) * self.ymax[t - m] for m in range(1, k + 1))
            )
        return self.err[t] + rho


class _BltRows(_IirRows):
    def __init__(self, thetas: tuple[float, ...], omegas: tuple[float, ...]) -> None:
        self.thetas = thetas
        self.omegas = omegas
        self.width = len(thetas) + 2
        self._th = [_ratio(x) for x in thetas]
        self._om = [_ratio(x) for x in omegas]
        super().__init__()

    def _reset(self) -> None:
        self._smax = [0.0] * len(self.thetas)  # bounds on max |Ŝ_i| for the next step
        self._sig = [0.0] * len(self.thetas)  # decayed sums of state rounding bounds
        super()._reset()

    @property
    def _w(self) -> Fraction:
        w = Fraction(len(self.thetas), 2)
        for th, om in zip(self.thetas, self.omegas, strict=True):
            w += Fraction(om) / (2 * (1 - Fraction(th)))
        return w

    def _fixed_state(self, p: int) -> Any:
        return [0] * len(self.thetas)

    def _fixed_next(self, state: Any, n: int, p: int) -> int:
        if n == 0:
            y = 1 << p
            state[:] = [y] * len(state)
            return y
        y = -sum(_mul_round(num, e, s) for (num, e), s in zip(self._om, state, strict=True))
        for i, (num, e) in enumerate(self._th):
            state[i] = _mul_round(num, e, state[i]) + y
        return y

    def _injected(self, t: int) -> float:
        g2 = gamma(2)
        y = self.ymax[t]
        if t == 0:  # ŷ_0 = ẑ_0 exactly; the states are copies of it
            self._smax = [y] * len(self.thetas)
            return self.err[0]
        q = self.err[t] + gamma(len(self.thetas) + 1) * (
            self.zmax[t] + sum(om * s for om, s in zip(self.omegas, self._smax, strict=True))
        )
        q += sum(om * sg for om, sg in zip(self.omegas, self._sig, strict=True))
        for i, th in enumerate(self.thetas):
            sigma = g2 * (th * self._smax[i] + y)
            self._sig[i] = th * self._sig[i] + sigma
            self._smax[i] = (th * self._smax[i] + y) * (1.0 + g2)
        return q


def filter_exactness(strategy: Strategy) -> FilterExactness | None:
    """The bookkeeping for ``strategy``'s streaming filter; None for the identity (DP-SGD's
    noise, released by :meth:`renyi.noise.CounterNoise.gaussian` directly)."""
    if isinstance(strategy, BandedInverseStrategy):
        return _BandedInverseRows(strategy.inverse_coefficients)
    if isinstance(strategy, BandedToeplitzStrategy):
        if strategy.bands == 1:
            return None
        return _BandedRows(strategy.coefficients)
    if isinstance(strategy, BltStrategy):
        return _BltRows(strategy.thetas, strategy.omegas)
    if isinstance(strategy, TreeStrategy):
        return _TreeRows()
    raise fail("strategy", getattr(strategy, "name", strategy), "a streamable strategy")
