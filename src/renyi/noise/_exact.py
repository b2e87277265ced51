"""The exact lattice index of the draws that the fast float32 pass could not decide.

The ideal draw behind every released value is a real number defined by random bits (see
``docs/noise.md``): for the Gaussian, ``Z = sqrt(-2 ln U1) cos(2 pi U2)`` (or ``sin``) with
``U1 = (c1 + e1) 2**-31`` and ``U2 = (w2 + e2) 2**-32``, where ``c1`` and ``w2`` are the
31 and 32 bits of the main keystream and ``e1, e2`` in ``[0, 1)`` are read, 32 bits per level,
from the extension keystreams; for the Laplace, ``L = +-(-ln U)`` with ``U = (c + e) 2**-31``
(64 more bits per level). The released index is ``K = a + round(f + s Z)``.

A value is *decided* when the interval of ``f + s Z`` over the box of bits read so far lies
strictly inside one rounding cell ``(k - 1/2, k + 1/2)``: then every completion of the bits
gives the same ``K``. Two evaluations do this:

* :func:`decide_float64`: the box of the main bits only, evaluated in float64 with an explicit
  slop (``2**-40`` relative, ``2**-40`` absolute) that covers ``log``/``cos``/``sin`` errors of
  up to 2**10 ulp and every rounding (``docs/noise.md``, tier 2);
* :func:`decide_exact`: more levels of bits, each evaluated with mpmath's interval
  arithmetic (directed rounding) at a precision above the bits read (tier 3). After
  :data:`MAX_LEVELS` levels an undecided value takes the index of its interval's midpoint;
  that event has probability below :data:`~renyi.noise.TAIL_MASS` (``docs/noise.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["MAX_LEVELS", "decide_exact", "decide_float64"]

#: Extension levels read before a value is settled by its midpoint (32 bits per level for each
#: Gaussian uniform, 64 for the Laplace one): ``U1`` reaches ``31 + 32 * 1000`` bits, so an
#: undecided value has probability below ``2**-10000`` (docs/noise.md): 0 in any float.
MAX_LEVELS = 1000
_SLOP = 2.0**-40
_TWO_PI = 2.0 * math.pi


def _settle(vlo: NDArray[np.float64], vhi: NDArray[np.float64]) -> tuple[Any, Any]:
    """``(decided, k)``: ``k = round(midpoint)``; decided when ``k - 1/2 < vlo, vhi < k + 1/2``."""
    k = np.rint(0.5 * (vlo + vhi))
    with np.errstate(invalid="ignore"):
        ok = (vlo > k - 0.5) & (vhi < k + 0.5)
    return ok, k


def decide_float64(
    kind: str,
    f: NDArray[np.float64],
    s: float,
    w1: NDArray[np.int64],
    w2: NDArray[np.int64] | None,
    which: NDArray[np.int64] | None,
) -> tuple[NDArray[np.bool_], NDArray[np.float64]]:
    """Tier 2: ``(decided, J)`` for values whose main bits are ``w1`` (and ``w2``).

    Gaussian: ``w1`` is the radius word (its low 31 bits are used), ``w2`` the angle word,
    ``which`` 0 for the cosine value of the pair and 1 for the sine value. Laplace: ``w1`` is
    the value's word (bit 31 the sign, the low 31 bits the uniform). ``f`` are the exact
    fractional parts ``x/g - round(x/g)``, ``s = sigma/g``.
    """
    c = (w1 & 0x7FFFFFFF).astype(np.float64)
    lo = c * 2.0**-31
    hi = (c + 1.0) * 2.0**-31
    with np.errstate(divide="ignore", invalid="ignore"):
        big = -np.log(lo)  # +inf at lo = 0
        small = -np.log(hi)  # 0 at hi = 1
    if kind == "gaussian":
        assert w2 is not None and which is not None
        r_hi = np.sqrt(2.0 * big) * (1.0 + _SLOP)
        r_lo = np.sqrt(2.0 * small) * (1.0 - _SLOP)
        theta = ((w2 & 0xFFFFFFFF).astype(np.float64) + 0.5) * (_TWO_PI * 2.0**-32)
        mid = np.where(which == 0, np.cos(theta), np.sin(theta))
        half = math.pi * 2.0**-32 + _SLOP  # half the angle cell (Lipschitz 1) + slop
        c_lo, c_hi = mid - half, mid + half
        with np.errstate(invalid="ignore"):
            cands = np.stack([r_lo * c_lo, r_lo * c_hi, r_hi * c_lo, r_hi * c_hi])
            cands = np.where(np.isnan(cands), np.inf, cands)  # 0 * inf: undecided below
        z_lo = np.min(np.where(np.isinf(cands), -np.inf, cands), axis=0)
        z_hi = np.max(cands, axis=0)
    else:
        e_lo = small * (1.0 - _SLOP)
        e_hi = big * (1.0 + _SLOP)
        neg = ((w1 >> 31) & 1) == 1
        z_lo = np.where(neg, -e_hi, e_lo)
        z_hi = np.where(neg, -e_lo, e_hi)
    with np.errstate(invalid="ignore", over="ignore"):
        v_lo = f + s * z_lo
        v_hi = f + s * z_hi
        pad = _SLOP * (1.0 + np.maximum(np.abs(v_lo), np.abs(v_hi)))
        ok, k = _settle(v_lo - pad, v_hi + pad)
    ok &= np.isfinite(v_lo) & np.isfinite(v_hi)
    return ok, k


def _interval_z(
    kind: str, u1: tuple[int, int], u2: tuple[int, int] | None, which: int, sign: int, iv: Any
) -> Any:
    """The interval of the standard draw for uniforms in ``[n/2**b, (n+1)/2**b)``."""
    (n1, b1) = u1
    lo = iv.ldexp(iv.mpf(n1), -b1)
    hi = iv.ldexp(iv.mpf(n1 + 1), -b1)
    box = iv.mpf([lo.a, hi.b])
    if n1 == 0:
        return None  # U1 may be arbitrarily small: unbounded draw
    if box.b >= 1:
        box = iv.mpf([box.a, 1])
    if kind == "gaussian":
        assert u2 is not None
        (n2, b2) = u2
        ang = iv.mpf([iv.ldexp(iv.mpf(n2), -b2).a, iv.ldexp(iv.mpf(n2 + 1), -b2).b])
        ang = 2 * iv.pi * ang
        r = iv.sqrt(-2 * iv.log(box))
        trig = iv.cos(ang) if which == 0 else iv.sin(ang)
        return r * trig
    e = -iv.log(box)
    return -e if sign else e


def decide_exact(
    kind: str,
    f: Any,
    s: float,
    main: tuple[int, int],
    ext: Callable[[int], tuple[int, int]],
    which: int,
) -> float:
    """Tier 3: the exact ``J = round(f + s Z)`` for one value (interval refinement).

    ``f``: the exact fractional part (a float, or an mpmath number where ``x/g`` underflows
    a float). ``main = (w1, w2)`` are its main words (``w2`` unused for the Laplace); ``ext(level)``
    returns the two 32-bit extension words of that level (Gaussian: one for ``U1``, one for
    ``U2``; Laplace: both extend ``U``). Levels are read until the value is decided, at most
    :data:`MAX_LEVELS`.
    """
    from mpmath import iv
    from mpmath.libmp import to_rational

    w1, w2 = main
    sign = (w1 >> 31) & 1
    n1, b1 = w1 & 0x7FFFFFFF, 31
    n2, b2 = w2 & 0xFFFFFFFF, 32
    fs = iv.mpf(f)
    ss = iv.mpf(s)
    mid = 0.0
    for level in range(1, MAX_LEVELS + 1):  # almost always 1, beyond 3 with probability < 2**-60
        e1, e2 = ext(level)
        if kind == "gaussian":
            n1, b1 = (n1 << 32) | e1, b1 + 32
            n2, b2 = (n2 << 32) | e2, b2 + 32
        else:
            n1, b1 = (n1 << 64) | (e1 << 32) | e2, b1 + 64
        old = iv.prec
        try:
            iv.prec = max(b1, b2) + 64
            u1 = (n1, b1) if n1 or level < MAX_LEVELS else (1, b1)  # the cap: U1 = 2**-b1
            z = _interval_z(kind, u1, (n2, b2) if kind == "gaussian" else None, which, sign, iv)
            if z is None:
                continue
            v = fs + ss * z
            # the cell of the interval's exact midpoint: a float midpoint (rounded to the
            # nearest float, then to even) picks the wrong cell for ever when the value lies
            # within half a float ulp above or below a half-integer
            lo, hi = to_rational(v._mpi_[0]), to_rational(v._mpi_[1])
            k = math.floor((Fraction(*lo) + Fraction(*hi)) / 2 + Fraction(1, 2))
            mid = float(k)
            if Fraction(*lo) > k - Fraction(1, 2) and Fraction(*hi) < k + Fraction(1, 2):
                return float(k)
        finally:
            iv.prec = old
    return mid
