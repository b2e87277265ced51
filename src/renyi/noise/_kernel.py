"""Tier 1 of the lattice release: the float32 pass that decides almost every value.

For each unit of random bits (a pair of Gaussian values, or one Laplace value) this computes
a float32 approximation of the ideal standard draw (``docs/noise.md``), then, per value, the
candidate index ``J = round(f + s Z)`` and whether it is *certain*: the computed ``f + s Z`` is
within :data:`GAUSS_MARGIN` (:data:`LAPLACE_MARGIN`) lattice units of the ideal one for every
completion of the bits, whenever the unit passes its gates; a value is flagged (and decided by
:mod:`renyi.noise._exact`) when it lies within that margin of a rounding boundary or its unit
fails a gate. The error bound behind the margins is proved in ``docs/noise.md`` assuming a
float32 ``log`` within 16 ulp (SLEEF, glibc and CUDA document at most 1 ulp; numpy's
SIMD float32 log was measured at 3.8 ulp); sine and cosine are
our own Taylor polynomials on an octant (IEEE ``+ - *`` only), so no other libm call enters.

The same operations run on numpy arrays and on torch tensors (CPU or CUDA): :class:`Ops` holds
the few spellings that differ.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["GAUSS_MARGIN", "LAPLACE_MARGIN", "Ops", "finish", "standard_f32"]

#: Certified error of the float32 pass, in lattice units (Gaussian; Laplace): see docs/noise.md.
GAUSS_MARGIN = 2.0**-10
LAPLACE_MARGIN = 2.0**-9
#: Gates: Gaussian units need a computed radius in [2**-6, 4.5]; Laplace units need c >= 2**20
#: (U >= 2**-11). Units outside are decided exactly.
LAPLACE_C_GATE = 1 << 20

_R_LO, _R_HI = 2.0**-6, 4.5
_R_MID, _R_HALF = (_R_HI + _R_LO) / 2, (_R_HI - _R_LO) / 2
_SIGN = -(1 << 31)  # the int32 sign bit
_OCT = math.pi / 4 * 2.0**-29  # angle of one unit of the 29-bit in-octant field
_M29 = (1 << 29) - 1
# Taylor coefficients (float32-rounded; their rounding is in the error bound)
_S3, _S5, _S7, _S9 = -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880
_C2, _C4, _C6, _C8 = -0.5, 1.0 / 24, -1.0 / 720, 1.0 / 40320


class Ops:
    """The array operations of one namespace (``numpy``, or ``torch`` on a device)."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self.torch = xp is not np
        self.f32 = xp.float32
        self.f64 = xp.float64

    def to(self, a: Any, dtype: Any) -> Any:
        return a.to(dtype) if self.torch else a.astype(dtype, copy=False)

    def rint(self, a: Any) -> Any:
        return self.xp.round(a) if self.torch else np.rint(a)

    def where(self, c: Any, a: Any, b: Any) -> Any:
        return self.xp.where(c, a, b)

    def interleave(self, a: Any, b: Any) -> Any:
        if self.torch:
            return self.xp.stack([a, b], dim=1).reshape(-1)
        return np.stack([a, b], axis=1).reshape(-1)

    def nan0(self, a: Any) -> Any:
        if self.torch:
            return self.xp.nan_to_num(a, nan=0.0)
        return np.where(np.isnan(a), 0.0, a).astype(a.dtype, copy=False)

    def clamp(self, a: Any, m: float) -> Any:
        """Saturate at +-m (the operands are never NaN where it matters: flagged values
        are recomputed)."""
        if self.torch:
            return self.xp.nan_to_num(a, nan=0.0, posinf=m, neginf=-m)
        return np.nan_to_num(a, copy=False, nan=0.0, posinf=m, neginf=-m)


def standard_f32(kind: str, w1: Any, w2: Any, ops: Ops) -> tuple[Any, Any]:
    """``(z, bad)``: float32 standard draws (two per Gaussian unit, cosine first) and a per-value
    gate failure mask, from the integer words: ``w1 & 0x7FFFFFFF`` and bit 31 of ``w1`` are
    used, ``(w2 >> 29) & 7`` and ``w2 & (2**29 - 1)`` (so ``w1`` may be the unit's 64-bit word
    and ``w2`` that word shifted right by 32).

    Only exact operations select and sign: the octant's swap of sine and cosine and the signs
    are applied to the float32 bit patterns (xor), so no rounding enters there. Every array
    is contiguous and one-dimensional (torch's CPU kernels are slow on strided or broadcast
    integer operands); the pairs are interleaved at the end through one 64-bit word per pair.
    """
    xp = ops.xp
    i32 = xp.int32
    if kind == "laplace":
        c = w1 & 0x7FFFFFFF
        e = ops.to(c, ops.f32)
        e *= np.float32(2.0**-31)
        e = xp.log(e)  # -E
        flip = ops.to(((w1 >> 31) & 1) ^ 1, i32)
        # -E has its sign bit set (E > 0): flip it unless bit 31 asks for a negative draw
        z = (e.view(i32) ^ (flip << 31)).view(ops.f32)
        return z, c < LAPLACE_C_GATE
    c1 = w1 & 0x7FFFFFFF
    r = ops.to(c1, ops.f32)
    r *= np.float32(2.0**-31)
    r = xp.log(r)
    r *= np.float32(-2.0)
    r = xp.sqrt(r)
    h = ops.to(w2, i32)  # the angle word: octant bits 31, 30, 29, then 29 bits in the octant
    low = h & _M29
    low ^= ((h << 2) >> 31) & _M29  # odd octants (bit 29): the angle from the octant's far end
    a = ops.to(low, ops.f32)
    a *= np.float32(_OCT)
    a2 = a * a
    sn = a2 * np.float32(_S9)
    sn += np.float32(_S7)
    sn *= a2
    sn += np.float32(_S5)
    sn *= a2
    sn += np.float32(_S3)
    sn *= a2
    sn *= a
    sn += a
    cs = a2 * np.float32(_C8)
    cs += np.float32(_C6)
    cs *= a2
    cs += np.float32(_C4)
    cs *= a2
    cs += np.float32(_C2)
    cs *= a2
    cs += np.float32(1.0)
    csb = cs.view(i32)
    d = csb ^ sn.view(i32)
    x = h ^ (h << 1)  # bit 31: b31 ^ b30 (cos < 0: octants 2..5); bit 30: b30 ^ b29 (swap)
    pb = (x << 1) >> 31  # all ones where the octant swaps sine and cosine (1, 2, 5, 6)
    pb &= d
    pb ^= csb  # the cosine value's |trig|: sin if swapped else cos
    qb = pb ^ d  # the sine value's: the other one
    pb ^= x & _SIGN  # cos < 0 in octants 2..5
    qb ^= h & _SIGN  # sin < 0 in octants 4..7 (bit 31)
    zc = pb.view(ops.f32)
    zc *= r
    zs = qb.view(ops.f32)
    zs *= r
    # gates on the computed radius: r <= 4.5 implies c1 >= 2**16, r >= 2**-6 a radius >= 2**-6
    # up to the pass's own error (docs/noise.md)
    bad = abs(r - np.float32(_R_MID)) > np.float32(_R_HALF)
    return _interleave32(zc, zs, ops), _interleave_bool(bad, ops)


def _interleave32(a: Any, b: Any, ops: Ops) -> Any:
    """``[a0, b0, a1, b1, ...]`` for float32 ``a, b`` via one 64-bit word per pair."""
    xp = ops.xp
    lo = ops.to(a.view(xp.int32), xp.int64) & 0xFFFFFFFF
    hi = ops.to(b.view(xp.int32), xp.int64) << 32
    hi |= lo
    return hi.view(ops.f32)


def _interleave_bool(m: Any, ops: Ops) -> Any:
    xp = ops.xp
    both = ops.to(m, xp.int16) * 257  # 0x0101: the flag in both bytes
    return both.view(xp.bool if ops.torch else np.bool_)


def finish(xc: Any, f: Any, j: Any, g: float, out_dtype: Any, big: float, ops: Ops) -> Any:
    """The canonical release ``sat(fl(g K)) + 0`` from ``x`` (in the compute dtype), its exact
    fractional part ``f`` and the index offset ``J`` (``K = round(x/g) + J``): ``x - f g`` is
    ``g round(x/g)`` exactly, one IEEE addition rounds ``g K`` once, saturation at the output
    dtype's largest finite value replaces overflow, and ``+ 0`` turns ``-0`` into ``+0``."""
    # g round(x/g) is 0 where |x| <= g/2: there x/g may have underflowed (subnormal x, g > 1)
    # and x - f g would be x's low bits, not 0. For g > 2**900 (float64, public) the sum is
    # formed at 2**-12 scale (exact), so that neither g round(x/g) nor J g overflows alone.
    d = 2.0**-12 if g > 2.0**900 else 1.0
    out = ops.to(j, xc.dtype)
    out *= g * d
    out += ops.where(abs(xc) > 0.5 * g, xc * d - f * (g * d), 0.0 * xc)
    if d != 1.0:
        out *= 2.0**12
    out = ops.to(out, out_dtype)
    out = ops.clamp(out, big)
    out += 0.0
    return out
