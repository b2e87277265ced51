"""The Laplace mechanism for real-valued queries, safe against floating-point attacks.

Textbook ``x + numpy.random.laplace(0, b)`` leaks ``x`` through the low bits of its output
(Mironov 2012, "On significance of the least significant bits for differential privacy").
Here the input is rounded to a data-independent lattice ``g Z`` (``g`` a power of two, see
:func:`renyi.mechanisms._base.granularity`) and exact discrete Laplace noise of scale
``b / g`` (Canonne, Kamath & Steinke 2020, Alg. 2) times ``g`` is added: every output is
``g`` times an integer.

Privacy (neighbouring relation: the caller's; L1 sensitivity ``Delta`` over it): rounding
moves each coordinate by at most ``g/2``, so the rounded query has L1 sensitivity
``Delta_g = g (floor(Delta/g) + 1)`` for scalars and ``Delta + g d`` for ``d`` coordinates
(both ``<= Delta (1 + 2**-12)``). The discrete Laplace of scale ``b/g`` on a shift of
``Delta_g / g`` lattice steps gives pure ``epsilon = Delta_g / b`` (the pmf ratio is at most
``exp(shift / scale)``), i.e. at most ``(1 + 2**-12)`` times the textbook ``Delta / b``. For
scalars the RDP curve and ``epsilon(delta)`` are the exact ones of the discrete Laplace at the
largest lattice shift (smaller shifts are dominated: log-concave shifts are Blackwell-ordered);
for vectors, the curve implied by pure DP (the randomized-response curve).

Example
-------
>>> import numpy as np
>>> from renyi.mechanisms import LaplaceMechanism
>>> m = LaplaceMechanism.calibrate(sensitivity=1.0, epsilon=0.5)
>>> m.pure_epsilon <= 0.5, m.calibration.method
(True, 'pure')
>>> y = m.release(3.0, rng=np.random.default_rng(0))
>>> float(y / m.granularity).is_integer()
True
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from renyi._validation import check_delta, check_int, check_positive
from renyi.analysis.curves import DEFAULT_ORDERS, RdpCurve
from renyi.analysis.events import DiscreteLaplaceEvent, Event
from renyi.mechanisms._base import (
    Calibration,
    Mechanism,
    as_values,
    granularity,
    grow_until,
    lattice_sensitivity,
    parse_target,
    to_lattice,
)
from renyi.mechanisms.discrete import (
    _check_size,
    _float_up,
    _laplace_curve,
    _limit,
    discrete_laplace_epsilon,
    pure_achieved,
    pure_epsilon_for,
    smallest_scale,
)
from renyi.random import get_source
from renyi.samplers import _check_terms, noise_laplace_int

__all__ = ["LaplaceMechanism"]

_PAD = 1.0 + 2.0**-12


class LaplaceMechanism(Mechanism):
    """Laplace noise of scale ``b`` on a lattice (L1 sensitivity), pure epsilon-DP.

    Args:
        scale: the Laplace scale ``b`` in the query's units (finite, > 0).
        sensitivity: the query's L1 sensitivity ``Delta`` (finite, > 0).
        dimension: number of coordinates released together (default 1).

    Attributes:
        granularity: the lattice step ``g`` (a power of two).
        lattice_sensitivity: ``Delta_g`` (the sensitivity after rounding).
        pure_epsilon: ``Delta_g / b`` (rounded up).

    >>> m = LaplaceMechanism(scale=2.0, sensitivity=1.0)
    >>> round(m.pure_epsilon, 6)
    0.500122
    """

    def __init__(self, scale: Any, sensitivity: Any = 1.0, *, dimension: int = 1) -> None:
        self.scale = check_positive("scale", scale)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        self.dimension = check_int("dimension", dimension, 1)
        g = granularity(self.scale, self.sensitivity, float(self.dimension))
        self.granularity = g
        eff = lattice_sensitivity(self.sensitivity, g, float(self.dimension), self.dimension)
        self.lattice_sensitivity = eff
        # b / g rounded up to a multiple of 2**-8: a little more noise than analysed (relative
        # < 2**-20, since b / g >= 2**12), and small integers for the sampler
        self._scale_lattice = Fraction(math.ceil(Fraction(self.scale) / Fraction(g) * 256), 256)
        _check_terms("scale", scale, self._scale_lattice)
        self.pure_epsilon = _float_up(Fraction(eff) / Fraction(self.scale))
        # the exact curves are evaluated at the sampler's own (rounded-up) lattice scale
        self._analysed_scale = self._scale_lattice
        self._shift = round(eff / g) if self.dimension == 1 else None

    def release(self, value: Any, rng: Any = None) -> Any:
        """``value`` (a real or ``dimension`` reals, any shape) plus lattice Laplace noise.

        Returns a float for a scalar, else a float64 array of the input's shape; every entry
        is a multiple of :attr:`granularity`.
        """
        x, scalar = as_values(value)
        _check_size(x, self.dimension)
        k = to_lattice(x, self.granularity)
        t = self._scale_lattice
        noise = noise_laplace_int(t.numerator, t.denominator, x.size, get_source(rng))
        out = (k + noise.reshape(x.shape).astype(np.float64)) * self.granularity
        return float(out) if scalar else out

    def rdp(self, orders: ArrayLike = DEFAULT_ORDERS) -> RdpCurve:
        """Scalars: the exact curve of the lattice noise at the largest possible shift
        (:func:`~renyi.mechanisms.discrete.discrete_laplace_rdp`, at the sampler's exact
        lattice scale), capped by the pure-DP curve; vectors: the pure-DP curve."""
        return _laplace_curve(self.pure_epsilon, self._analysed_scale, self._shift, orders)

    def epsilon(self, delta: float) -> float:
        """Scalars: the exact discrete-Laplace profile at the largest shift; vectors:
        ``Delta_g / b`` (pure DP)."""
        d = check_delta(delta)
        if self._shift is None:
            return self.pure_epsilon
        exact = discrete_laplace_epsilon(self._analysed_scale, self._shift, d)
        return min(self.pure_epsilon, exact)

    def event(self) -> Event:
        """A discrete Laplace on the lattice: the sampler's exact scale and the sensitivity,
        both in lattice units (the lattice scale is a multiple of 2**-8, so exact in float)."""
        g = self.granularity
        return DiscreteLaplaceEvent(
            scale=float(self._scale_lattice), sensitivity=self.lattice_sensitivity / g
        )

    @classmethod
    def calibrate(
        cls,
        sensitivity: Any = 1.0,
        *,
        epsilon: Any = None,
        delta: Any = None,
        alpha: Any = None,
        rho: Any = None,
        dimension: int = 1,
    ) -> LaplaceMechanism:
        """The least Laplace scale meeting a target.

        Pure ``epsilon``: ``b = Delta (1 + 2**-12) / epsilon`` (then verified). Scalars with
        ``epsilon`` + ``delta`` or ``alpha`` + ``epsilon``: the scale is lowered below the
        pure one with the exact discrete-Laplace profile / RDP curve (method ``"exact"``);
        vectors use the pure bound (delta unused) or the pure->RDP curve. ``rho``: through
        ``epsilon^2 / 2``-zCDP. The finished mechanism is checked against the target.
        """
        target = parse_target(epsilon, delta, alpha, rho)
        sens = check_positive("sensitivity", sensitivity)
        d = check_int("dimension", dimension, 1)
        eps, method, bound = pure_epsilon_for(target)
        scale = grow_until(
            lambda b: cls(b, sens, dimension=d).pure_epsilon <= eps, sens * _PAD / eps
        )
        check: Any = None
        if d == 1 and target.kind == "approx":
            check = lambda m: m.epsilon(target.delta)  # noqa: E731
            bound = "exact discrete-Laplace profile at the largest lattice shift"
        elif d == 1 and target.kind == "rdp":
            check = lambda m: float(m.rdp([target.alpha]).epsilons[0])  # noqa: E731
            bound = "exact discrete-Laplace RDP curve at the largest lattice shift"
        if check is not None:
            method = "exact"
            scale = smallest_scale(lambda b: check(cls(b, sens)), target.epsilon, scale)
            mech = cls(scale, sens)
            return mech._with(
                Calibration(target.describe(), method, bound, check(mech), target.epsilon)
            )
        mech = cls(scale, sens, dimension=d)
        achieved = pure_achieved(target, mech.pure_epsilon)
        return mech._with(Calibration(target.describe(), method, bound, achieved, _limit(target)))
