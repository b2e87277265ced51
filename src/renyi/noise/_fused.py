"""The float32 pass of :mod:`renyi.noise._kernel` as one compiled loop (numba), optional.

The same arithmetic, operation for operation and in the same precision, as
:func:`renyi.noise._kernel.standard_f32` followed by the release (so the error bound of
``docs/noise.md`` covers it: float32 ``log`` from the C library, IEEE ``sqrt``, ``+``, ``-``,
``*``; a fused multiply-add, if the compiler makes one, rounds once and stays within it).
Flagged values are decided exactly afterwards, so the released bytes equal those of the
numpy/torch kernels (tested). Used on the CPU for float32 and float64 inputs when numba is
installed (``pip install 'renyi[fast]'``); otherwise the array kernels run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

njit: Any
try:  # pragma: no cover - exercised when numba is installed
    from numba import njit
except ImportError:  # pragma: no cover
    njit = None

__all__ = ["available", "gaussian_chunk", "laplace_chunk"]

_F = np.float32
_OCT = _F(math.pi / 4 * 2.0**-29)
_S3, _S5, _S7, _S9 = _F(-1.0 / 6), _F(1.0 / 120), _F(-1.0 / 5040), _F(1.0 / 362880)
_C2, _C4, _C6, _C8 = _F(-0.5), _F(1.0 / 24), _F(-1.0 / 720), _F(1.0 / 40320)
_R_LO, _R_HI = _F(2.0**-6), _F(4.5)
_M29 = (1 << 29) - 1


def available() -> bool:
    return njit is not None


def _gauss(w, xs, g, inv_g, s32, thr, big, wide, out, flag):  # type: ignore[no-untyped-def]
    k = w.shape[0]
    nflag = 0
    two31 = _F(2.0**-31)
    m2 = _F(-2.0)
    one = _F(1.0)
    for p in range(k):
        word = w[p]
        c1 = word & 0x7FFFFFFF
        r = math.sqrt(math.log(_F(c1) * two31) * m2)
        bad = (r < _R_LO) or (r > _R_HI)
        h = (word >> 32) & 0xFFFFFFFF
        low = h & _M29
        if (h >> 29) & 1:
            low ^= _M29
        a = _F(low) * _OCT
        a2 = a * a
        sn = a2 * _S9 + _S7
        sn = sn * a2 + _S5
        sn = sn * a2 + _S3
        sn = sn * a2
        sn = sn * a + a
        cs = a2 * _C8 + _C6
        cs = cs * a2 + _C4
        cs = cs * a2 + _C2
        cs = cs * a2 + one
        octant = h >> 29
        swap = ((octant + 1) >> 1) & 1
        pc = sn if swap else cs
        qs = cs if swap else sn
        if ((octant + 2) >> 2) & 1:
            pc = -pc
        if octant >> 2:
            qs = -qs
        for which in range(2):
            i = 2 * p + which
            z = (pc if which == 0 else qs) * r
            xc = xs[i]
            t = xc * inv_g
            f = t - np.rint(t)
            if wide and f != f:
                f = xc * 0  # x / g overflowed: x is on the lattice
            v = z * s32
            v = v + _F(f)
            j = np.rint(v)
            d = abs(v - j)
            if bad or not d <= thr:
                flag[nflag] = i
                nflag += 1
            o = (xc - f * g) + j * g
            if o > big:
                o = big
            elif o < -big:
                o = -big
            out[i] = o + 0
    return nflag


def _laplace(w, xs, g, inv_g, s32, thr, big, wide, out, flag):  # type: ignore[no-untyped-def]
    two31 = _F(2.0**-31)
    nflag = 0
    for i in range(w.shape[0]):
        word = w[i]
        c = word & 0x7FFFFFFF
        e = -math.log(_F(c) * two31)
        z = -e if (word >> 31) & 1 else e
        xc = xs[i]
        t = xc * inv_g
        f = t - np.rint(t)
        if wide and f != f:
            f = xc * 0
        v = z * s32
        v = v + _F(f)
        j = np.rint(v)
        d = abs(v - j)
        if c < (1 << 20) or not d <= thr:
            flag[nflag] = i
            nflag += 1
        o = (xc - f * g) + j * g
        if o > big:
            o = big
        elif o < -big:
            o = -big
        out[i] = o + 0
    return nflag


if njit is not None:  # pragma: no branch
    _gauss_jit = njit(cache=True, nogil=True)(_gauss)
    _laplace_jit = njit(cache=True, nogil=True)(_laplace)


def gaussian_chunk(
    w: Any, xs: Any, g: float, s: float, thr: float, big: float, out: Any, flag: Any
) -> int:
    """One Gaussian chunk: ``w`` the pairs' 64-bit words (int64), ``xs`` the ``2 len(w)``
    values (float32 or float64, also the compute dtype); the releases go into ``out``, the
    positions of the flagged values into ``flag[:count]`` (int64); returns ``count``."""
    dt = xs.dtype.type
    count = _gauss_jit(w, xs, dt(g), dt(1.0 / g), _F(s), _F(thr), dt(big), g < 1.0, out, flag)
    return int(count)


def laplace_chunk(
    w: Any, xs: Any, g: float, s: float, thr: float, big: float, out: Any, flag: Any
) -> int:
    """One Laplace chunk: ``w`` the values' 32-bit words (int32, sign-extended)."""
    dt = xs.dtype.type
    count = _laplace_jit(w, xs, dt(g), dt(1.0 / g), _F(s), _F(thr), dt(big), g < 1.0, out, flag)
    return int(count)
