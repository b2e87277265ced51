"""The interface every mechanism shares, and the helpers they have in common.

* :class:`Mechanism`: ``release(value, rng=None)``, ``rdp(orders)``, ``epsilon(delta)``,
  ``event()`` and the record of how it was calibrated (``calibration``).
* :class:`Calibration`: which target a calibrated mechanism was built for, the bound used and
  the value that bound gives at the chosen parameter (never above the target: verified).
* The lattice used by the continuous-valued mechanisms (Mironov 2012): granularity, rounding
  of the input and the resulting sensitivity (see ``docs/mechanisms.md``).
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import as_real, check_delta, check_positive, fail
from renyi.analysis.curves import DEFAULT_ORDERS, RdpCurve
from renyi.analysis.events import Event
from renyi.errors import PrivacyParameterError

__all__ = ["GRANULARITY_BITS", "Calibration", "Mechanism"]

#: The lattice step of a continuous-valued mechanism is the largest power of two at most
#: ``min(noise scale, sensitivity) * 2**-GRANULARITY_BITS / spread`` (``spread`` = sqrt(d) for
#: L2, d for L1), so rounding the input inflates the sensitivity by a factor <= 1 + 2**-12.
GRANULARITY_BITS = 12
_MIN_GRANULARITY_EXP = -1000  # lattice steps below 2**-1000 would produce subnormal outputs
_MAX_LATTICE_UNITS = 2.0**52  # noise scale and sensitivity, in lattice steps
# max / g < ratio * spread * 2**13, so ratio * spread <= 2**39 always fits
_MAX_RATIO_BITS = 52 - GRANULARITY_BITS - 1
_MAX_RATIO = 2.0**_MAX_RATIO_BITS
_MAX_LATTICE_INDEX = 2.0**1020  # |value / g| beyond this could overflow once noise is added


@dataclass(frozen=True)
class Calibration:
    """How a mechanism's noise was chosen for a target guarantee.

    Attributes:
        target: the guarantee asked for, e.g. ``"(epsilon=1, delta=1e-05)-DP"``.
        method: the calibration route (``"analytic"``, ``"classic"``, ``"zcdp"``, ``"rdp"``,
            ``"pure"``).
        bound: the theorem whose bound was inverted, with its source.
        achieved: that bound evaluated at the calibrated mechanism (``<= limit``, verified).
        limit: the target value of the constrained quantity.
    """

    target: str
    method: str
    bound: str
    achieved: float
    limit: float


class Mechanism(ABC):
    """A noise mechanism that knows its own privacy.

    Subclasses release values (:meth:`release`), report their RDP curve (:meth:`rdp`), their
    tightest available ``epsilon`` for a ``delta`` (:meth:`epsilon`) and the event an
    accountant composes (:meth:`event`). Calibrated instances keep a :class:`Calibration`.
    """

    calibration: Calibration | None = None

    @abstractmethod
    def release(self, value: Any, rng: Any = None) -> Any:
        """Release ``value`` with noise (``rng=None``: the secure OS source)."""

    @abstractmethod
    def rdp(self, orders: ArrayLike = DEFAULT_ORDERS) -> RdpCurve:
        """The RDP curve of one release on ``orders``."""

    @abstractmethod
    def epsilon(self, delta: float) -> float:
        """The tightest available ``epsilon`` such that one release is ``(epsilon, delta)``-DP."""

    @abstractmethod
    def event(self) -> Event:
        """The description of one release for :mod:`renyi.accountants`."""

    def _with(self, calibration: Calibration) -> Any:
        self.calibration = calibration
        return self


# ------------------------------------------------------------------------------ targets
@dataclass(frozen=True)
class Target:
    """A parsed calibration target: ``kind`` in ``pure``, ``approx``, ``rdp``, ``zcdp``."""

    kind: str
    epsilon: float = math.nan
    delta: float = math.nan
    alpha: float = math.nan
    rho: float = math.nan

    def describe(self) -> str:
        if self.kind == "pure":
            return f"{self.epsilon:g}-DP"
        if self.kind == "approx":
            return f"(epsilon={self.epsilon:g}, delta={self.delta:g})-DP"
        if self.kind == "rdp":
            return f"(alpha={self.alpha:g}, epsilon={self.epsilon:g})-RDP"
        return f"{self.rho:g}-zCDP"


def parse_target(epsilon: Any, delta: Any, alpha: Any, rho: Any) -> Target:
    """Validate one of: ``epsilon`` (pure), ``epsilon`` + ``delta``, ``alpha`` + ``epsilon``
    (RDP at order alpha), ``rho`` (zCDP). Infinite targets are refused: calibrating to
    ``epsilon = inf`` would mean releasing the unnoised value."""
    given = {
        k
        for k, v in {"epsilon": epsilon, "delta": delta, "alpha": alpha, "rho": rho}.items()
        if v is not None
    }
    expected = "exactly one target: epsilon; epsilon and delta; alpha and epsilon; or rho"
    if given == {"rho"}:
        return Target("zcdp", rho=check_positive("rho", rho))
    if given == {"epsilon"}:
        return Target("pure", epsilon=check_positive("epsilon", epsilon))
    if given == {"epsilon", "delta"}:
        return Target(
            "approx", epsilon=check_positive("epsilon", epsilon), delta=check_delta(delta)
        )
    if given == {"alpha", "epsilon"}:
        a = as_real("alpha", alpha)
        if not a > 1:
            raise fail("alpha", alpha, "a finite Rényi order > 1")
        return Target("rdp", epsilon=check_positive("epsilon", epsilon), alpha=a)
    raise PrivacyParameterError(
        f"targets={sorted(given)} is invalid: expected {expected} (a finite, positive target;"
        " epsilon=inf would release the unnoised value)"
    )


def grow_until(ok: Callable[[float], bool], x: float, *, up: bool = True) -> float:
    """Move ``x`` by growing relative steps (up or down) until ``ok(x)``: the final check of
    every calibration, so the returned parameter is verified against the target."""
    step = 2.0**-40
    for _ in range(200):
        if ok(x):
            return x
        x = x * (1.0 + step) if up else x * (1.0 - step)
        step = min(step * 2.0, 0.5)
    raise RuntimeError("calibration could not be verified")  # pragma: no cover


def up(x: float, ulps: int = 2) -> float:
    """``x`` moved up by ``ulps`` floating-point steps (to absorb rounding, conservatively)."""
    for _ in range(ulps):
        x = math.nextafter(x, math.inf)
    return x


def down(x: float, ulps: int = 2) -> float:
    """``x`` moved down by ``ulps`` floating-point steps."""
    for _ in range(ulps):
        x = math.nextafter(x, -math.inf)
    return x


# ------------------------------------------------------------------------------ values
def as_values(value: Any, name: str = "value") -> tuple[NDArray[np.float64], bool]:
    """A finite, non-empty real scalar or array as float64; ``(array, was_scalar)``.

    Refuses booleans, strings, objects, complex numbers, NaN, infinities and empty arrays.
    """
    expected = "a finite real number or a non-empty array of them"
    if isinstance(value, bool | np.bool_ | str | bytes):
        raise fail(name, value, expected)
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise fail(name, value, expected) from None
    if arr.dtype.kind not in "iuf":
        if arr.dtype == object and any(type(v) is int for v in arr.flat):  # beyond 64 bits
            raise fail(
                name,
                "a Python int outside [-2**63, 2**64)",
                expected + " (a Python int must lie in the int64/uint64 range: pass a larger "
                "one as a float)",
            )
        raise fail(name, value, expected)
    if arr.size == 0:
        raise fail(name, value, expected + " (got an empty array)")
    out = arr.astype(np.float64)
    if not np.isfinite(out).all():
        bad = out[~np.isfinite(out)].flat[0]
        raise fail(name, float(bad), expected + " (NaN and infinities are refused)")
    return out, arr.ndim == 0


def as_integers(value: Any, name: str = "value") -> tuple[NDArray[Any], bool]:
    """A non-empty integer scalar or array, exactly: never through float64.

    Python ints of any size, numpy integer arrays, and floats holding integral values (taken
    at their exact value) are accepted; the result is int64 when every entry is at most
    ``2**62`` in magnitude (:data:`VALUE_BOUND`), else an object array of Python ints (so
    ``2**53 + 1`` stays ``2**53 + 1``). Booleans, strings, NaN, infinities and non-integral
    floats are refused.
    """
    expected = "integers (Python ints, integer arrays, or floats with integral values)"
    if isinstance(value, bool | np.bool_ | str | bytes):
        raise fail(name, value, expected)
    scalar = isinstance(value, numbers.Integral | numbers.Real) and not isinstance(
        value, np.ndarray
    )
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise fail(name, value, expected) from None
    if arr.size == 0:
        raise fail(name, value, expected + " (got an empty array)")
    if arr.dtype.kind in "iu":
        big = arr.dtype.kind == "u" and int(arr.max()) > VALUE_BOUND
        if not big and int(np.abs(arr.astype(np.int64)).max()) <= VALUE_BOUND:
            return arr.astype(np.int64), arr.ndim == 0
        return arr.astype(object), arr.ndim == 0
    flat = arr.reshape(-1).tolist() if arr.dtype.kind in "fO" else None
    if flat is None:
        raise fail(name, value, expected)
    ints = []
    for v in flat:
        if isinstance(v, bool | np.bool_) or not isinstance(v, numbers.Real):
            raise fail(name, value, expected)
        if isinstance(v, numbers.Integral):
            ints.append(int(v))
            continue
        f = float(v)
        if not math.isfinite(f) or f != math.floor(f):
            raise fail(name, value, expected + " (NaN, infinities and fractions are refused)")
        ints.append(int(f))  # exact: a finite integral float is an integer
    flat_out = np.empty(len(ints), dtype=object)
    flat_out[:] = ints
    out: NDArray[Any] = flat_out.reshape(arr.shape)
    if max(abs(v) for v in ints) <= VALUE_BOUND:
        out = out.astype(np.int64)
    return out, arr.ndim == 0 and scalar


#: The public range of the integer mechanisms' inputs: ``|value| <= 2**62`` (int64 with room
#: for the noise). Every value in range takes the same path; values beyond are refused by
#: this bound (a public one), never handled by another code path.
VALUE_BOUND = 2**62


def in_range_integers(
    value: Any, bound: int = VALUE_BOUND, name: str = "value"
) -> tuple[NDArray[Any], bool]:
    """:func:`as_integers` restricted to the public range ``|value| <= bound``, on one path
    for every value in range: int64 when ``bound <= 2**62`` (:data:`VALUE_BOUND`), else
    Python ints (an object array) for every value. Values beyond ``bound`` are refused."""
    x, scalar = as_integers(value, name)
    shown = "2**62" if bound == VALUE_BOUND else str(bound)
    if bound <= VALUE_BOUND:
        if x.dtype == object:
            raise fail(name, "an entry beyond the range", f"integers with |value| <= {shown}")
        if bound < VALUE_BOUND and not bool((np.abs(x) <= bound).all()):
            raise fail(name, "an entry beyond the range", f"integers with |value| <= {shown}")
        return x, scalar
    big = x.astype(object)
    if not all(abs(v) <= bound for v in big.reshape(-1).tolist()):
        raise fail(name, "an entry beyond the range", f"integers with |value| <= {shown}")
    return big, scalar


def add_integers(x: NDArray[Any], noise: NDArray[np.int64]) -> NDArray[Any]:
    """``x + noise`` exactly: int64 when the sum cannot overflow, else Python ints."""
    noise = noise.reshape(x.shape)
    if x.dtype != object and noise.size:
        # numpy booleans, no Python ints: the same work whatever the magnitudes
        if bool((np.abs(x) <= VALUE_BOUND).all() & (np.abs(noise) < 2**62).all()):
            return x + noise
    out = x.astype(object) + noise.astype(object)
    return np.asarray(out, dtype=object)


# ------------------------------------------------------------------------------ lattice
def granularity(
    noise_scale: float, sensitivity: float, spread: float, name: str = "scale"
) -> float:
    """Largest power of two <= ``min(noise_scale, sensitivity) * 2**-GRANULARITY_BITS / spread``.

    ``name`` is the noise parameter's name for the error raised when the step would fall
    below 2**-1000 (outputs would then be subnormal floats, which are not a lattice).
    """
    x = min(noise_scale, sensitivity) / spread
    _, e = math.frexp(x)  # x = m 2**e with m in [1/2, 1): largest power of two <= x is 2**(e-1)
    exp = e - 1 - GRANULARITY_BITS
    if exp < _MIN_GRANULARITY_EXP:
        raise fail(
            name,
            noise_scale,
            f"a value with min({name}, sensitivity) / dimension >= 2**-988",
        )
    # The exact samplers and profiles work in integers of the lattice: the noise scale and
    # the sensitivity in lattice units must stay far inside int64 (draws of up to 2**11
    # scales, shifts summed over) -- a public bound on the parameters, never on the data.
    if math.log2(max(noise_scale, sensitivity)) - exp > math.log2(_MAX_LATTICE_UNITS):
        raise fail(
            name,
            noise_scale,
            f"a value within a factor {_MAX_RATIO:.3g} of sensitivity={sensitivity!r} (their "
            f"ratio times {'sqrt(dimension)' if name == 'sigma' else 'dimension'} at most "
            f"2**{_MAX_RATIO_BITS}: the lattice would need integers beyond int64)",
        )
    return math.ldexp(1.0, exp)


def to_lattice(values: NDArray[np.float64], g: float, name: str = "value") -> NDArray[np.float64]:
    """Round each value to the nearest multiple of ``g`` and return the multiples (k, floats).

    ``values / g`` is exact (``g`` is a power of two in the normal range), so each ``k`` is
    within 1/2 of ``value / g``: two inputs at distance ``D`` give lattice points at distance
    at most ``D / g + 1`` per coordinate.
    """
    with np.errstate(over="ignore"):
        scaled = values / g
    biggest = float(np.abs(scaled).max())
    if not biggest <= _MAX_LATTICE_INDEX:
        raise fail(
            name,
            float(values.flat[int(np.argmax(np.abs(scaled)))]),
            f"values with |x| <= 2**1020 * granularity = {_MAX_LATTICE_INDEX * g:g}",
        )
    return np.asarray(np.rint(scaled), dtype=np.float64)


def lattice_sensitivity(sensitivity: float, g: float, spread: float, dimension: int) -> float:
    """Sensitivity of the rounded query, rounded up.

    Scalar: integer lattice distance ``<= floor(Delta / g) + 1``, i.e. ``g (floor(Delta/g)+1)``.
    Vector: ``Delta + g * spread`` (``spread`` = sqrt(d) for L2, d for L1: each coordinate of
    the rounding errors' difference is below ``g``).
    """
    if dimension == 1:
        return g * (math.floor(sensitivity / g) + 1)
    return up(sensitivity + up(g * spread))
