"""Randomized response: binary (Warner 1965) and k-ary (generalised) randomized response.

Local DP: each respondent randomises their own value, so the neighbouring relation is "one
respondent's value changes" (replace-one on a single record).

* :class:`RandomizedResponse`: report the true bit with probability ``p``, the flipped bit
  otherwise. Pure ``epsilon = log(p / (1 - p))``-DP; RDP curve of Mironov 2017, Table II;
  exact ``(epsilon, delta)`` profile ``delta(eps) = max(0, p - e^eps (1 - p))``.
  ``p`` must lie in ``(1/2, 1)``: ``p = 1/2`` outputs pure noise, ``p = 1`` releases the bit
  unprotected, and ``p < 1/2`` is pointless -- it is ``1 - p`` followed by flipping the
  answer (post-processing), so it has exactly the privacy and the information of ``1 - p``.
* :class:`KaryRandomizedResponse`: ``k`` categories, the truth with probability ``p`` and
  each other category with probability ``q = (1 - p) / (k - 1)``; ``p`` in ``(1/k, 1)``. Pure
  ``epsilon = log(p / q)``; RDP by the exact divergence of the two worst-case output
  distributions (:func:`renyi.analysis.divergence.renyi_divergence`); exact
  ``delta(eps) = max(0, p - e^eps q)``.

Sampling is exact: ``p`` is used at its exact rational (binary) value in integer Bernoulli
draws from :mod:`renyi.random`.

Example
-------
>>> import numpy as np
>>> from renyi.mechanisms import RandomizedResponse
>>> rr = RandomizedResponse.calibrate(epsilon=1.0)
>>> rr.pure_epsilon <= 1.0, round(rr.p, 4)
(True, 0.7311)
>>> rr.release(np.array([0, 1, 1]), rng=np.random.default_rng(0)).shape
(3,)
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize

from renyi._validation import check_delta, check_int, check_range, fail
from renyi.analysis.closed_forms import randomized_response_rdp
from renyi.analysis.curves import DEFAULT_ORDERS, RdpCurve
from renyi.analysis.divergence import renyi_divergence
from renyi.analysis.events import Event, PureDpEvent, RandomizedResponseEvent
from renyi.mechanisms._base import (
    Calibration,
    Mechanism,
    Target,
    parse_target,
)
from renyi.mechanisms.discrete import _limit, pure_achieved, pure_epsilon_for
from renyi.random import get_source

__all__ = ["KaryRandomizedResponse", "RandomizedResponse"]


def _bits(value: Any) -> tuple[NDArray[Any], bool]:
    arr = np.asarray(value) if not isinstance(value, str | bytes) else np.asarray([value])
    if arr.dtype.kind not in "biu" and not (
        arr.dtype.kind == "f" and np.isfinite(arr).all() and (arr == np.round(arr)).all()
    ):
        raise fail("value", value, "bits: booleans or integers in {0, 1}")
    if arr.size == 0:
        raise fail("value", value, "bits: a non-empty array of booleans or 0/1 integers")
    if arr.dtype.kind != "b" and not np.isin(arr, (0, 1)).all():
        raise fail("value", value, "bits: booleans or integers in {0, 1}")
    return arr, arr.ndim == 0


def _lie(p: Fraction, size: int, rng: Any) -> NDArray[np.bool_]:
    """Exact Bernoulli(1 - p) draws."""
    src = get_source(rng)
    return src.bernoulli(
        np.full(size, p.denominator - p.numerator, dtype=np.int64),
        np.full(size, p.denominator, dtype=np.int64),
    )


def _log_ratio_up(p: float, q: float) -> float:
    """log(p / q) rounded up: each float log (and the rounding of its argument) is within a
    few ulps of its magnitude, so a margin of 8 ulps of ``|log p| + |log q| + 1`` covers it."""
    lp, lq = math.log(p), math.log(q)
    return (lp - lq) + 8 * 2.0**-53 * (abs(lp) + abs(lq) + 1.0)


class RandomizedResponse(Mechanism):
    """Binary randomized response: the true bit with probability ``p`` in ``(1/2, 1)``.

    >>> RandomizedResponse(0.75).pure_epsilon > math.log(3)
    True
    """

    def __init__(self, p: Any) -> None:
        self.p = check_range("p", p, 0.5, 1.0, low_open=True, high_open=True)
        self._p = Fraction(self.p)
        self.pure_epsilon = _log_ratio_up(self.p, 1.0 - self.p)  # 1 - p is exact for p > 1/2

    def release(self, value: Any, rng: Any = None) -> Any:
        """Randomise bits (booleans or 0/1 integers, any shape; one respondent each)."""
        bits, scalar = _bits(value)
        flip = _lie(self._p, bits.size, rng).reshape(bits.shape)
        out = np.logical_xor(bits.astype(np.bool_), flip)
        out = out if bits.dtype.kind == "b" else out.astype(bits.dtype)
        return out.item() if scalar else out

    def rdp(self, orders: ArrayLike = DEFAULT_ORDERS) -> RdpCurve:
        """Mironov 2017, Table II (:func:`renyi.analysis.closed_forms.randomized_response_rdp`)."""
        return RdpCurve.from_function(lambda a: randomized_response_rdp(self.p, a), orders)

    def epsilon(self, delta: float) -> float:
        """Exact: ``log((p - delta) / (1 - p))`` (0 once ``delta >= 2p - 1``), rounded up."""
        d = check_delta(delta)
        if self.p - d <= 1.0 - self.p:
            return 0.0
        return max(0.0, _log_ratio_up(self.p - d, 1.0 - self.p))

    def event(self) -> Event:
        return RandomizedResponseEvent(self.p)

    @classmethod
    def calibrate(
        cls,
        *,
        epsilon: Any = None,
        delta: Any = None,
        alpha: Any = None,
        rho: Any = None,
    ) -> RandomizedResponse:
        """The largest truth probability ``p`` meeting a target (verified).

        Pure ``epsilon``: ``p = e^eps / (1 + e^eps)``; ``epsilon`` + ``delta``: the exact
        profile, ``p = (delta + e^eps) / (1 + e^eps)``; ``alpha`` + ``epsilon``: the RDP curve
        inverted numerically; ``rho``: through ``epsilon = sqrt(2 rho)`` (Bun & Steinke 2016,
        Prop. 3.3).
        """
        target = parse_target(epsilon, delta, alpha, rho)
        if target.kind == "rdp":
            a = np.array([target.alpha])

            def f(p: float) -> float:
                return float(randomized_response_rdp(p, a)[0]) - target.epsilon

            p0 = float(optimize.brentq(f, 0.5, 1.0 - 1e-16, xtol=1e-16))
            method, bound = "rdp", "Mironov 2017 Table II, inverted"
            check: Any = lambda m: float(m.rdp(a).epsilons[0])  # noqa: E731
        elif target.kind == "approx":
            e = target.epsilon
            p0 = (target.delta + math.exp(e)) / (1.0 + math.exp(e))
            p0 = min(p0, math.nextafter(1.0, 0.0))
            method, bound = "exact", "delta(eps) = max(0, p - e^eps (1 - p)), exact"
            check = lambda m: m.epsilon(target.delta)  # noqa: E731
        else:
            eps, method, bound = pure_epsilon_for(target)
            p0 = 1.0 / (1.0 + math.exp(-eps))
            target_eps = eps
            check = _pure_check(target)
            return _finish(
                cls, p0, lambda m: m.pure_epsilon <= target_eps, check, target, method, bound
            )
        return _finish(cls, p0, lambda m: check(m) <= target.epsilon, check, target, method, bound)


def _pure_check(target: Target) -> Any:
    return lambda m: pure_achieved(target, m.pure_epsilon)


def _finish(
    cls: Any, p0: float, ok: Any, check: Any, target: Target, method: str, bound: str
) -> Any:
    def valid(p: float) -> bool:
        return 0.5 < p < 1.0 and ok(cls(p))

    p = min(max(p0, math.nextafter(0.5, 1.0)), math.nextafter(1.0, 0.0))
    # move p down (towards 1/2: more private) by doubling steps until the target is verified
    step = 2.0**-54
    for _ in range(200):
        if valid(p):
            break
        p = max(math.nextafter(0.5, 1.0), p - step)
        step *= 2.0
    else:  # pragma: no cover
        raise RuntimeError("calibration could not be verified")
    mech = cls(p)
    return mech._with(Calibration(target.describe(), method, bound, check(mech), _limit(target)))


class KaryRandomizedResponse(Mechanism):
    """k-ary randomized response over categories ``0 .. k-1``; truth w.p. ``p`` in ``(1/k, 1)``.

    >>> m = KaryRandomizedResponse.calibrate(k=4, epsilon=1.0)
    >>> m.pure_epsilon <= 1.0
    True
    """

    def __init__(self, k: Any, p: Any) -> None:
        self.k = check_int("k", k, 2)
        self.p = check_range("p", p, 1.0 / self.k, 1.0, low_open=True, high_open=True)
        self._p = Fraction(self.p)
        self.q = (1.0 - self.p) / (self.k - 1)
        self.pure_epsilon = _log_ratio_up(self.p, self.q)

    def release(self, value: Any, rng: Any = None) -> Any:
        """Randomise categories (integers in ``[0, k)``, any shape; one respondent each)."""
        arr = np.asarray(value) if not isinstance(value, str | bytes) else np.asarray([value])
        if arr.dtype.kind not in "iu" or arr.size == 0:
            raise fail("value", value, f"a non-empty array of integers in [0, {self.k})")
        if arr.min() < 0 or arr.max() >= self.k:
            raise fail("value", value, f"integers in [0, {self.k})")
        src = get_source(rng)
        lie = _lie(self._p, arr.size, src).reshape(arr.shape)
        shift = 1 + src.integers_below(np.full(arr.size, self.k - 1)).reshape(arr.shape)
        out = np.where(lie, (arr.astype(np.int64) + shift) % self.k, arr.astype(np.int64))
        return int(out) if arr.ndim == 0 else out

    def _pair(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        rest = 1.0 - self.p - self.q  # the k - 2 other categories, merged (likelihood ratio 1)
        return np.array([self.p, self.q, rest]), np.array([self.q, self.p, rest])

    def rdp(self, orders: ArrayLike = DEFAULT_ORDERS) -> RdpCurve:
        """Exact Rényi divergence of the worst-case pair of output distributions."""
        p, q = self._pair()
        return RdpCurve.from_function(lambda a: renyi_divergence(p, q, a), orders)

    def epsilon(self, delta: float) -> float:
        """Exact: ``log((p - delta) / q)`` (0 once ``delta >= p - q``), rounded up."""
        d = check_delta(delta)
        if self.p - d <= self.q:
            return 0.0
        return max(0.0, _log_ratio_up(self.p - d, self.q))

    def event(self) -> Event:
        return PureDpEvent(self.pure_epsilon)

    @classmethod
    def calibrate(cls, k: Any, *, epsilon: Any = None, delta: Any = None) -> KaryRandomizedResponse:
        """The largest ``p`` for pure ``epsilon`` (``p = e^eps / (e^eps + k - 1)``) or for
        ``(epsilon, delta)`` by the exact profile; verified."""
        kk = check_int("k", k, 2)
        target = parse_target(epsilon, delta, None, None)
        e = target.epsilon
        if target.kind == "pure":
            p0 = 1.0 / (1.0 + (kk - 1) * math.exp(-e))
            ok: Any = lambda m: m.pure_epsilon <= e  # noqa: E731
            method, bound = "pure", "epsilon = log(p (k-1) / (1-p))"
        else:
            p0 = (target.delta * (kk - 1) + math.exp(e)) / (math.exp(e) + kk - 1)
            ok = lambda m: m.epsilon(target.delta) <= e  # noqa: E731
            method, bound = "exact", "delta(eps) = max(0, p - e^eps q), exact"
        p = min(p0, math.nextafter(1.0, 0.0))
        step = 2.0**-54
        for _ in range(200):
            if p > 1.0 / kk and ok(cls(kk, p)):
                break
            p -= step
            step *= 2.0
        else:  # pragma: no cover
            raise RuntimeError("calibration could not be verified")
        mech = cls(kk, p)
        achieved = mech.pure_epsilon if target.kind == "pure" else mech.epsilon(target.delta)
        return mech._with(Calibration(target.describe(), method, bound, achieved, e))
