"""The exponential mechanism as report-noisy-max, sampled exactly.

Given utilities ``u_1..u_n`` (each of sensitivity ``Delta`` over the neighbouring relation),
report an index ``i``:

* ``noise="gumbel"``: ``argmax_i u_i + Gumbel(2 Delta / epsilon)``, which is distributed
  exactly as the exponential mechanism, ``P[i] ∝ exp(epsilon u_i / (2 Delta))`` (McSherry &
  Talwar 2007; Dwork & Roth 2014, Thm. 3.10: ``epsilon``-DP).
* ``noise="exponential"``: ``argmax_i u_i + Exponential(2 Delta / epsilon)``, which is
  distributed exactly as permute-and-flip (McKenna & Sheldon 2020, ``epsilon``-DP; the
  equivalence is Ding, Kifer, Steinke, Wang, Xiao & Zhang 2021).

With ``monotonic=True`` (utilities that can only move in one direction between neighbours)
the factor 2 is dropped for the exponential mechanism (Dwork & Roth 2014, §3.4); it is
refused for permute-and-flip, whose monotone analysis this package does not rely on.

Floating-point safety: the output is an index, but sampling continuous Gumbel/exponential
noise in floating point would still perturb the probabilities. Instead each distribution is
sampled exactly through its equivalent algorithm with rational arithmetic: utilities are
taken at their exact binary values, ``gamma_i = (max_j u_j - u_i) epsilon / (2 Delta)`` is a
fraction, and candidates are accepted with exact Bernoulli(exp(-gamma_i)) draws (Canonne,
Kamath & Steinke 2020, Alg. 1): rejection sampling from the uniform proposal for Gumbel,
a uniformly random order with one coin per candidate for permute-and-flip. Batches of
utility vectors (2-D input, one release per row) are vectorised over the rows; the
arithmetic is on Python integers in numpy object arrays (exact, slower than int64).

Example
-------
>>> import numpy as np
>>> from renyi.mechanisms import ExponentialMechanism
>>> m = ExponentialMechanism(epsilon=1.0, sensitivity=1.0)
>>> m.release([0.0, 0.0, 50.0], rng=np.random.default_rng(0))
2
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_delta, check_positive, fail
from renyi.analysis.curves import DEFAULT_ORDERS, PureDp, RdpCurve
from renyi.analysis.events import Event, PureDpEvent
from renyi.mechanisms._base import Calibration, Mechanism, as_values, parse_target
from renyi.mechanisms.discrete import _limit, pure_achieved, pure_epsilon_for
from renyi.random import RandomSource, get_source
from renyi.samplers import _bernoulli_exp_big

__all__ = ["ExponentialMechanism"]

_NOISES = ("gumbel", "exponential")


def _permutations(rows: int, k: int, src: RandomSource) -> NDArray[np.intp]:
    """``rows`` exactly uniform random permutations of ``range(k)``: sort random 64-bit keys
    and redraw the rows whose keys tie (so every order is equally likely)."""
    keys = src.words(rows * k).reshape(rows, k)
    while True:
        order = np.argsort(keys, axis=1, kind="stable")
        sorted_keys = np.take_along_axis(keys, order, axis=1)
        tied = (np.diff(sorted_keys, axis=1) == 0).any(axis=1)
        if not tied.any():
            return order
        keys[tied] = src.words(int(tied.sum()) * k).reshape(-1, k)


def _dyadic(u: NDArray[np.float64]) -> tuple[NDArray[Any], int]:
    """Exact integers ``U`` (object array) and one exponent ``E`` with ``u = U * 2**E``.

    Every finite float is a dyadic rational: ``u = m 2**e`` (``numpy.frexp``) with a 53-bit
    mantissa, so ``m 2**53`` is an exact integer.
    """
    m, e = np.frexp(u)
    mant = (m * 2.0**53).astype(np.int64)
    ex = e.astype(np.int64) - 53
    nonzero = mant != 0
    big_e = int(ex[nonzero].min()) if nonzero.any() else 0
    shift = np.where(nonzero, ex - big_e, 0)
    return mant.astype(object) << shift.astype(object), big_e


class ExponentialMechanism(Mechanism):
    """Report-noisy-max with Gumbel (= exponential mechanism) or exponential noise.

    Args:
        epsilon: the pure DP guarantee (finite, > 0).
        sensitivity: sensitivity ``Delta`` of every utility (finite, > 0).
        noise: ``"gumbel"`` (default) or ``"exponential"`` (permute-and-flip).
        monotonic: utilities move in one direction between neighbours (halves the noise).

    >>> ExponentialMechanism(0.5, noise="exponential").epsilon(1e-6)
    0.5
    """

    def __init__(
        self,
        epsilon: Any,
        sensitivity: Any = 1.0,
        *,
        noise: str = "gumbel",
        monotonic: bool = False,
    ) -> None:
        self.pure_epsilon = check_positive("epsilon", epsilon)
        self.sensitivity = check_positive("sensitivity", sensitivity)
        if noise not in _NOISES:
            raise fail("noise", noise, "'gumbel' or 'exponential'")
        if not isinstance(monotonic, bool):
            raise fail("monotonic", monotonic, "True or False")
        if monotonic and noise != "gumbel":
            raise fail(
                "monotonic",
                monotonic,
                "False with noise='exponential' (the halved noise is only claimed for the "
                "exponential mechanism, Dwork & Roth 2014 §3.4)",
            )
        self.noise = noise
        self.monotonic = monotonic
        self._rate = Fraction(self.pure_epsilon) / (
            Fraction(self.sensitivity) * (1 if monotonic else 2)
        )

    def _choose(self, u: NDArray[np.float64], src: RandomSource) -> NDArray[np.int64]:
        """One index per row of ``u`` (rows x k), exactly, vectorised over the rows.

        ``gamma[r, i] = (max_j u[r, j] - u[r, i]) * rate`` as fractions over one common
        denominator (utilities are dyadic rationals, the rate is a fraction), then
        Bernoulli(exp(-gamma)) draws decide: for ``gumbel``, rejection from uniformly drawn
        candidates (accepted with probability proportional to ``exp(rate u_i)``); for
        ``exponential``, candidates in a uniformly random order, the first accepted wins.
        """
        rows, k = u.shape
        big_u, big_e = _dyadic(u)
        top = big_u.max(axis=1)[:, None]
        p, q = self._rate.numerator, self._rate.denominator
        if big_e >= 0:
            nums, den = (top - big_u) * (p << big_e), q
        else:
            nums, den = (top - big_u) * p, q << -big_e
        out = np.empty(rows, dtype=np.int64)
        active = np.arange(rows)
        order = _permutations(rows, k, src) if self.noise == "exponential" else None
        step = 0
        while active.size:
            if order is None:
                cand = src.integers_below(np.full(active.size, k, dtype=np.int64))
            else:
                cand = order[active, step]
                step += 1
            ok = _bernoulli_exp_big(nums[active, cand], den, active.size, src)
            out[active[ok]] = cand[ok]
            active = active[~ok]
        return out

    def release(self, value: Any, rng: Any = None) -> Any:
        """The index chosen from a 1-D array of utilities (an int), or one index per row of
        a 2-D array (an int64 array)."""
        u, _ = as_values(value, "utilities")
        if u.ndim not in (1, 2):
            raise fail("utilities", value, "a non-empty 1-D array (or 2-D: one row per release)")
        src = get_source(rng)
        if u.ndim == 1:
            return int(self._choose(u[None, :], src)[0])
        return self._choose(u, src)

    def rdp(self, orders: ArrayLike = DEFAULT_ORDERS) -> RdpCurve:
        """The RDP curve implied by pure ``epsilon``-DP (randomized-response curve)."""
        return PureDp(self.pure_epsilon).to_rdp(orders)

    def epsilon(self, delta: float) -> float:
        check_delta(delta)
        return self.pure_epsilon

    def event(self) -> Event:
        return PureDpEvent(self.pure_epsilon)

    @classmethod
    def calibrate(
        cls,
        sensitivity: Any = 1.0,
        *,
        epsilon: Any = None,
        delta: Any = None,
        alpha: Any = None,
        rho: Any = None,
        noise: str = "gumbel",
        monotonic: bool = False,
    ) -> ExponentialMechanism:
        """For a pure ``epsilon`` (also with a ``delta``, unused), an ``(alpha, epsilon)``-RDP
        or a ``rho``-zCDP target (through the pure->RDP / pure->zCDP conversions)."""
        target = parse_target(epsilon, delta, alpha, rho)
        eps, method, bound = pure_epsilon_for(target)
        mech = cls(eps, sensitivity, noise=noise, monotonic=monotonic)
        achieved = pure_achieved(target, mech.pure_epsilon)
        return mech._with(Calibration(target.describe(), method, bound, achieved, _limit(target)))
