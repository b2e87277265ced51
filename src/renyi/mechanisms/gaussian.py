"""The Gaussian mechanism for real-valued queries, safe against floating-point attacks.

Textbook ``x + numpy.random.normal(0, sigma)`` leaks ``x`` through the low bits of the float
it returns (Mironov 2012). Here the release is on a data-independent lattice ``g Z``: the
input is rounded to the nearest multiple of ``g`` (a power of two, see
:func:`renyi.mechanisms._base.granularity`) and exact discrete Gaussian noise
``N_Z(0, (sigma/g)^2) * g`` is added (Canonne, Kamath & Steinke 2020, Alg. 3), so every
output is ``g`` times an integer whose distribution depends on ``x`` only through the
privacy-analysed shift.

Privacy (neighbouring relation: the caller's, e.g. add/remove one record; L2 sensitivity
``Delta`` over it). Rounding moves each coordinate by at most ``g/2``, so the rounded query
has sensitivity ``Delta_g = g (floor(Delta/g) + 1)`` for scalars and ``Delta + g sqrt(d)`` for
``d`` coordinates; both are at most ``Delta (1 + 2**-12)``. With that sensitivity:

* RDP ``alpha Delta_g^2 / (2 sigma^2)`` and zCDP ``rho = Delta_g^2 / (2 sigma^2)``: the discrete
  Gaussian satisfies the continuous Gaussian's bounds (CKS 2020, Thm. 4; vectors by
  composition over coordinates).
* ``epsilon(delta)``: the smaller of the zCDP conversion (Balle et al. 2020, Thm. 21) and,
  for scalars, the exact discrete profile (CKS 2020, Thm. 7) at the sampler's exact
  variance parameter.

The sampler's variance parameter is ``(sigma/g)^2`` rounded up to an integer multiple of its
proposal scale (relative increase < 2**-12): more noise than the analysis assumes, never less.

Example
-------
>>> import numpy as np
>>> from renyi.mechanisms import GaussianMechanism
>>> m = GaussianMechanism.calibrate(sensitivity=1.0, epsilon=1.0, delta=1e-5)
>>> m.calibration.method, m.epsilon(1e-5) <= 1.0
('analytic', True)
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

from renyi._validation import (
    check_delta,
    check_int,
    check_nonnegative,
    check_positive,
    fail,
)
from renyi.analysis.closed_forms import classic_gaussian_sigma, gaussian_mu, gaussian_rdp
from renyi.analysis.conversions import zcdp_max_rho
from renyi.analysis.curves import DEFAULT_ORDERS, RdpCurve, Zcdp
from renyi.analysis.events import DiscreteGaussianEvent, Event
from renyi.mechanisms._base import (
    Calibration,
    Mechanism,
    as_values,
    down,
    granularity,
    grow_until,
    lattice_sensitivity,
    parse_target,
    to_lattice,
)
from renyi.mechanisms.discrete import (
    _check_size,
    _float_up,
    scalar_gaussian_delta,
    scalar_gaussian_epsilon,
)
from renyi.random import get_source
from renyi.samplers import _default_t, noise_gaussian_frac

__all__ = ["GaussianMechanism"]

_PAD = 1.0 + 2.0**-12  # bound on the sensitivity inflation from rounding to the lattice


class GaussianMechanism(Mechanism):
    """Gaussian noise of standard deviation ``sigma`` on a lattice (L2 sensitivity).

    Args:
        sigma: noise standard deviation in the query's units (finite, > 0).
        sensitivity: the query's L2 sensitivity ``Delta`` (finite, > 0).
        dimension: number of coordinates released together (default 1); the sensitivity
            bounds the L2 norm of the change of all of them.

    Attributes:
        granularity: the lattice step ``g`` (a power of two).
        lattice_sensitivity: ``Delta_g``, the sensitivity after rounding (used in the analysis).
        noise_multiplier: ``sigma / Delta_g`` (rounded down).
        rho: ``Delta_g^2 / (2 sigma^2)`` (rounded up).

    >>> m = GaussianMechanism(sigma=4.0, sensitivity=1.0)
    >>> m.granularity == 2.0**-12
    True
    >>> round(m.rho, 6)
    0.031265
    """

    def __init__(self, sigma: Any, sensitivity: Any = 1.0, *, dimension: int = 1) -> None:
        self.sigma = check_positive("sigma", sigma)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        self.dimension = check_int("dimension", dimension, 1)
        spread = math.sqrt(self.dimension)
        g = granularity(self.sigma, self.sensitivity, spread, name="sigma")
        self.granularity = g
        eff = lattice_sensitivity(self.sensitivity, g, spread, self.dimension)
        self.lattice_sensitivity = eff
        s2 = (Fraction(self.sigma) / Fraction(g)) ** 2
        self._t = _default_t(s2)
        self._sigma2_lattice = Fraction(self._t * math.ceil(s2 / self._t))  # >= (sigma/g)^2
        self.noise_multiplier = down(self.sigma / eff)
        self.rho = _float_up(Fraction(eff) ** 2 / (2 * Fraction(self.sigma) ** 2))

    def release(self, value: Any, rng: Any = None) -> Any:
        """``value`` (a real or ``dimension`` reals, any shape) plus lattice Gaussian noise.

        Returns a float for a scalar, else a float64 array of the input's shape; every
        entry is a multiple of :attr:`granularity`.
        """
        x, scalar = as_values(value)
        _check_size(x, self.dimension)
        k = to_lattice(x, self.granularity)
        noise = noise_gaussian_frac(self._sigma2_lattice, self._t, x.size, get_source(rng))
        # k + n is rounded to float as a function of the exact integer k + n only
        # (post-processing); scaling by the power of two g is exact.
        out = (k + noise.reshape(x.shape).astype(np.float64)) * self.granularity
        return float(out) if scalar else out

    def rdp(self, orders: ArrayLike = DEFAULT_ORDERS) -> RdpCurve:
        """``alpha Delta_g^2 / (2 sigma^2)`` (Mironov 2017 Table II; CKS 2020 Thm. 4)."""
        return RdpCurve.from_function(lambda a: gaussian_rdp(self.noise_multiplier, a), orders)

    def epsilon(self, delta: float) -> float:
        """Smallest proven epsilon at ``delta``: zCDP conversion, and for scalars the exact
        discrete-Gaussian profile (CKS Thm. 7; for very wide lattice noise its cheap upper
        bound :func:`~renyi.mechanisms.discrete.discrete_gaussian_delta_bound`)."""
        d = check_delta(delta)
        eps = Zcdp(self.rho).to_dp(d).epsilon
        if self.dimension == 1:
            shift = round(self.lattice_sensitivity / self.granularity)  # an exact integer
            eps = min(eps, scalar_gaussian_epsilon(self._sigma2_lattice, shift, d))
        return eps

    def delta(self, epsilon: float) -> float:
        """Smallest proven delta at ``epsilon`` (same bounds as :meth:`epsilon`)."""
        eps = check_nonnegative("epsilon", epsilon)
        d = Zcdp(self.rho).to_delta(eps).delta
        if self.dimension == 1:
            shift = round(self.lattice_sensitivity / self.granularity)
            d = min(d, scalar_gaussian_delta(self._sigma2_lattice, shift, eps))
        return d

    def event(self) -> Event:
        """A discrete Gaussian on the lattice, in lattice units: the sampler's own sigma
        (rounded down) and the lattice sensitivity."""
        g = self.granularity
        sigma = down(math.sqrt(float(self._sigma2_lattice)))
        return DiscreteGaussianEvent(sigma=sigma, sensitivity=self.lattice_sensitivity / g)

    @classmethod
    def calibrate(
        cls,
        sensitivity: Any = 1.0,
        *,
        epsilon: Any = None,
        delta: Any = None,
        alpha: Any = None,
        rho: Any = None,
        method: str | None = None,
        dimension: int = 1,
    ) -> GaussianMechanism:
        """The Gaussian mechanism with (nearly) the least noise meeting a target.

        Targets: ``epsilon`` + ``delta``; ``alpha`` + ``epsilon`` ((alpha, eps)-RDP,
        ``sigma^2 = Delta^2 alpha / (2 eps)``); ``rho`` (zCDP, ``sigma = Delta / sqrt(2 rho)``).
        For ``(epsilon, delta)``, ``method`` is

        * ``"analytic"`` (default for scalars): Balle & Wang 2018 Thm. 8 (exact for continuous
          noise), then verified with the exact discrete profile (CKS 2020 Thm. 7);
        * ``"classic"``: Dwork & Roth 2014 Thm. A.1, ``sigma = sqrt(2 ln(1.25/delta)) Delta /
          epsilon``, valid only for ``epsilon < 1`` (refused otherwise);
        * ``"zcdp"`` (default for vectors): the largest ``rho`` whose optimal conversion meets
          the target.

        Every route uses ``Delta (1 + 2**-12)`` for the rounding, then checks the finished
        mechanism against the target (increasing sigma if a bound required it); the
        :class:`~renyi.mechanisms.Calibration` records the method and the achieved value.
        """
        target = parse_target(epsilon, delta, alpha, rho)
        sens = check_positive("sensitivity", sensitivity)
        d = check_int("dimension", dimension, 1)
        pad = sens * _PAD
        if target.kind == "pure":
            raise fail(
                "delta", None, "a delta in (0, 1): Gaussian noise cannot give pure epsilon-DP"
            )
        if target.kind == "zcdp":
            sigma, how, bound = pad / math.sqrt(2 * target.rho), "zcdp", "rho = Delta^2/(2 sigma^2)"
            check: Any = lambda m: m.rho  # noqa: E731
            limit = target.rho
        elif target.kind == "rdp":
            sigma = pad * math.sqrt(target.alpha / (2 * target.epsilon))
            how, bound = "rdp", "eps(alpha) = alpha Delta^2 / (2 sigma^2) (Mironov 2017 Table II)"
            check = lambda m: float(m.rdp([target.alpha]).epsilons[0])  # noqa: E731
            limit = target.epsilon
        else:
            how = method if method is not None else ("analytic" if d == 1 else "zcdp")
            if how == "analytic":
                if d != 1:
                    raise fail(
                        "method",
                        method,
                        "'zcdp' or 'classic' for vectors (the exact profile is proven for "
                        "scalar discrete Gaussians only)",
                    )
                sigma = pad / gaussian_mu(target.epsilon, target.delta)
                bound = "Balle & Wang 2018 Thm. 8, verified with CKS 2020 Thm. 7"
            elif how == "classic":
                # refuses epsilon >= 1, outside the theorem's validity
                sigma = classic_gaussian_sigma(target.epsilon, target.delta, pad)
                bound = "Dwork & Roth 2014 Thm. A.1 (epsilon < 1), verified"
            elif how == "zcdp":
                sigma = pad / math.sqrt(2 * zcdp_max_rho(target.epsilon, target.delta))
                bound = "zCDP -> (eps, delta), Balle et al. 2020 Thm. 21"
            else:
                raise fail("method", method, "'analytic', 'classic' or 'zcdp'")
            # one evaluation of delta(epsilon) verifies a candidate; epsilon(delta) is reported
            sigma = grow_until(
                lambda s: cls(s, sens, dimension=d).delta(target.epsilon) <= target.delta, sigma
            )
            check = lambda m: m.epsilon(target.delta)  # noqa: E731
            limit = target.epsilon
        sigma = grow_until(lambda s: check(cls(s, sens, dimension=d)) <= limit, sigma)
        mech = cls(sigma, sens, dimension=d)
        return mech._with(Calibration(target.describe(), how, bound, check(mech), limit))
