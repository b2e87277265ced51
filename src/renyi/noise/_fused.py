"""The float32 pass and the float64 interval tier as compiled, vectorised loops (numba), optional.

The same decision procedure as :func:`renyi.noise._kernel.standard_f32` followed by the
release and :func:`renyi.noise._exact.decide_float64`, written so that the compiler turns the
fast pass into SIMD code: per block of pairs, one loop computes the standard draws (radius and
octant polynomials) and one loop the releases of the block's values; the few flagged values
are then decided in float64 intervals in the same call, and only the values that need more
random bits come back (their positions, for :func:`renyi.noise._exact.decide_exact`).

Arithmetic (``docs/noise.md``, "Exactness"): IEEE ``+ - *``, ``sqrt`` and ``rint`` in the
precision written (``error_model="numpy"``, no ``fastmath``: no reassociation, no contraction
into fused multiply-adds); the logarithm of the radius uniform is our own (:func:`_ln_u31`,
float64, within ``2**-33`` relative, then rounded to float32: within ``1.001 u`` of the
float32 ``ln U``, below the 16 ulp the error bound assumes), so no C library function enters
the fast pass; the interval tier uses ``log``, ``sqrt``, ``cos``, ``sin`` from the C library
(float64, within its ``2**-40`` slop). A decided index is the ideal one whatever the rounding
inside the bounds, so the released bytes equal those of the numpy/torch kernels (tested).

Inputs and outputs: float32 or float64 arrays (computed in their own precision), or bfloat16
as ``uint16`` bit patterns (computed in float32, the exact widening of bfloat16; the float32
release is rounded to bfloat16 to nearest-even, saturated at bfloat16's largest finite value,
``-0`` made ``+0``: the bytes of torch's conversion of the float32 release).
Used on the CPU when numba is installed (``pip install 'renyi[fast]'``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

njit: Any
try:  # pragma: no cover - exercised when numba is installed
    from llvmlite import ir
    from numba import njit, types
    from numba.extending import intrinsic, overload
except ImportError:  # pragma: no cover
    njit = None

__all__ = ["LN_REL_ERROR", "available", "gaussian_release", "laplace_release", "ln_u31"]

#: Proven bound on the relative error of :func:`_ln_u31` (float64 arithmetic) against
#: ``ln(c 2**-31)``: the truncated series ``2**-34.2`` plus 40 float64 roundings.
LN_REL_ERROR = 2.0**-33

_F = np.float32
_OCT = _F(math.pi / 4 * 2.0**-29)
_S3, _S5, _S7, _S9 = _F(-1.0 / 6), _F(1.0 / 120), _F(-1.0 / 5040), _F(1.0 / 362880)
_C2, _C4, _C6, _C8 = _F(-0.5), _F(1.0 / 24), _F(-1.0 / 720), _F(1.0 / 40320)
_R_LO, _R_HI = _F(2.0**-6), _F(4.5)
_M29 = (1 << 29) - 1
_NAN32 = _F(np.nan)
_LN2 = math.log(2.0)
_SQRT2 = math.sqrt(2.0)
_A3, _A5, _A7, _A9, _A11 = 1.0 / 3, 1.0 / 5, 1.0 / 7, 1.0 / 9, 1.0 / 11
_MANT = (1 << 52) - 1
_ONE_BITS = 0x3FF << 52
_LAPLACE_GATE = 1 << 20
_SLOP = 2.0**-40  # tier 2's relative and absolute slop (renyi.noise._exact)
_TWO_PI_2_32 = 2.0 * math.pi * 2.0**-32
_HALF_CELL = math.pi * 2.0**-32 + _SLOP
_HUGE_G = 2.0**900  # lattice steps from which the release is summed at a smaller scale
_DOWN, _UP = 2.0**-12, 2.0**12
_BLOCK = 512  # pairs (values) per inner block: two short SIMD loops over L1-resident scratch


def available() -> bool:
    return njit is not None


_gauss_jit: Any = None
_laplace_jit: Any = None
_finish_jit: Any = None
_ln_jit: Any = None

if njit is not None:  # the compiled functions, defined only with numba

    @intrinsic
    def f64_bits(typingctx: Any, x: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.bitcast(args[0], ir.IntType(64))

        return types.int64(types.float64), codegen

    @intrinsic
    def bits_f64(typingctx: Any, x: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.bitcast(args[0], ir.DoubleType())

        return types.float64(types.int64), codegen

    @intrinsic
    def f32_bits(typingctx: Any, x: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.bitcast(args[0], ir.IntType(32))

        return types.int32(types.float32), codegen

    @intrinsic
    def bits_f32(typingctx: Any, x: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.bitcast(args[0], ir.FloatType())

        return types.float32(types.int32), codegen

    @intrinsic
    def sqrt32(typingctx: Any, x: Any) -> Any:
        """IEEE square root (correctly rounded; numba's math.sqrt calls the C library)."""

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            fn = builder.module.declare_intrinsic("llvm.sqrt", [ir.FloatType()])
            return builder.call(fn, args)

        return types.float32(types.float32), codegen

    def load(a, i):  # type: ignore[no-untyped-def]  # pragma: no cover - the overload's
        raise NotImplementedError

    def store(a, i, v):  # type: ignore[no-untyped-def]  # pragma: no cover - the overload's
        raise NotImplementedError

    def like(x, v):  # type: ignore[no-untyped-def]  # pragma: no cover - the overload's
        raise NotImplementedError

    @overload(like)
    def _like(x, v):  # type: ignore[no-untyped-def]
        """``v`` in the precision of ``x`` (float32 or float64)."""
        if x == types.float32:
            return lambda x, v: np.float32(v)
        return lambda x, v: np.float64(v)

    @overload(load)
    def _load(a, i):  # type: ignore[no-untyped-def]
        if a.dtype == types.uint16:  # bfloat16 bits: the float32 with the same top half

            def impl_bf16(a, i):  # type: ignore[no-untyped-def]
                return bits_f32(np.int32(np.uint32(a[i]) << np.uint32(16)))

            return impl_bf16

        def impl(a, i):  # type: ignore[no-untyped-def]
            return a[i]

        return impl

    @overload(store)
    def _store(a, i, v):  # type: ignore[no-untyped-def]
        if a.dtype == types.uint16:  # round the float32 release to bfloat16, saturate, no -0

            def impl_bf16(a, i, v):  # type: ignore[no-untyped-def]
                b = np.uint32(f32_bits(v))
                odd = (b >> np.uint32(16)) & np.uint32(1)  # to nearest, ties to even
                r = (b + np.uint32(0x7FFF) + odd) >> np.uint32(16)
                ovf = (r & np.uint32(0x7FFF)) == np.uint32(0x7F80)  # overflow: +-largest finite
                r = ((r & np.uint32(0x8000)) | np.uint32(0x7F7F)) if ovf else r
                a[i] = np.uint16(np.uint32(0) if r == np.uint32(0x8000) else r)

            return impl_bf16

        def impl(a, i, v):  # type: ignore[no-untyped-def]
            a[i] = v

        return impl

    @njit(error_model="numpy")
    def _ln31(c: Any) -> Any:
        """``ln(c 2**-31)`` in float64 for an integer ``c`` in ``[0, 2**31)`` (docs/noise.md):
        ``c = 2**e m`` exactly with ``m`` in ``[sqrt(2)/2, sqrt(2))``, ``ln m = 2 atanh(t)``,
        ``t = (m - 1)/(m + 1)``, ``|t| <= 0.1716``, the series to ``t**11``."""
        b: Any = f64_bits(np.float64(c))  # type: ignore[call-arg]
        e = (b >> 52) - 1023
        m = bits_f64((b & _MANT) | _ONE_BITS)
        hi = m > _SQRT2
        m = m * 0.5 if hi else m
        e = e + 1 if hi else e
        f = m - 1.0
        t = f / (2.0 + f)
        t2 = t * t
        p = t2 * _A11 + _A9
        p = p * t2 + _A7
        p = p * t2 + _A5
        p = p * t2 + _A3
        p = p * t2
        t = t + t
        return np.float64(e - 31) * _LN2 + (t + t * p)

    def flushed(x, e_min):  # type: ignore[no-untyped-def]  # pragma: no cover - overload's
        raise NotImplementedError

    def expo(x):  # type: ignore[no-untyped-def]  # pragma: no cover - the overload's
        raise NotImplementedError

    def bias_of(x):  # type: ignore[no-untyped-def]  # pragma: no cover - the overload's
        raise NotImplementedError

    @overload(bias_of)
    def _bias_of(x):  # type: ignore[no-untyped-def]
        if x == types.float32:
            return lambda x: 127
        return lambda x: 1023

    @overload(expo)
    def _expo(x):  # type: ignore[no-untyped-def]
        """The biased exponent field of ``x`` (integer operations only)."""
        if x == types.float32:
            return lambda x: (np.int64(f32_bits(x)) >> 23) & 0xFF
        return lambda x: (f64_bits(x) >> 52) & 0x7FF

    @overload(flushed)
    def _flushed(x, e_min):  # type: ignore[no-untyped-def]
        """``x``, or ``+0`` where its exponent field is below ``e_min`` (subnormals among
        them), by integer operations only: no floating-point operation sees a subnormal
        operand, whose slow path (microcode assists) would time the data."""
        if x == types.float32:

            def impl32(x, e_min):  # type: ignore[no-untyped-def]
                b = f32_bits(x)  # int32 throughout: full SIMD width
                keep = ((b >> np.int32(23)) & np.int32(0xFF)) >= np.int32(e_min)
                return bits_f32(b & (np.int32(-1) if keep else np.int32(0)))

            return impl32

        def impl64(x, e_min):  # type: ignore[no-untyped-def]
            b = f64_bits(x)
            keep = ((b >> 52) & 0x7FF) >= e_min
            return bits_f64(b & (np.int64(-1) if keep else np.int64(0)))

        return impl64

    @njit(error_model="numpy")
    def flush_limits(g: Any) -> Any:
        """``(e_min, ferr)``: values with an exponent field below ``e_min`` are taken as 0
        (``|x| < 2**-60 g``, or a subnormal), which moves ``x/g`` by less than ``ferr``."""
        e_min = max(expo(g) - 60, 1)
        low: Any = bits_f64(np.int64(e_min - bias_of(g) + 1023) << 52)  # type: ignore[call-arg]
        return e_min, low / np.float64(g)

    @njit(error_model="numpy")
    def settle(f: Any, s: Any, zlo: Any, zhi: Any, ferr: Any) -> Any:
        """``(decided, J)`` of tier 2 for the interval ``f + s [zlo, zhi]`` (``f`` within
        ``ferr`` of the exact fractional part)."""
        vlo = f + s * zlo
        vhi = f + s * zhi
        pad = _SLOP * (1.0 + max(abs(vlo), abs(vhi))) + ferr
        a = vlo - pad
        b = vhi + pad
        k = np.rint(0.5 * (a + b))
        ok = a > k - 0.5 and b < k + 0.5 and math.isfinite(vlo) and math.isfinite(vhi)
        return ok, k

    @njit(error_model="numpy")
    def tier2_gauss(word: Any, which: Any, f: Any, s: Any, ferr: Any) -> Any:
        """:func:`renyi.noise._exact.decide_float64` for one Gaussian value."""
        c = np.float64(word & 0x7FFFFFFF)
        big = -math.log(c * 2.0**-31)
        small = -math.log((c + 1.0) * 2.0**-31)
        r_hi = math.sqrt(2.0 * big) * (1.0 + _SLOP)
        r_lo = math.sqrt(2.0 * small) * (1.0 - _SLOP)
        theta = (np.float64((word >> 32) & 0xFFFFFFFF) + 0.5) * _TWO_PI_2_32
        mid = math.cos(theta) if which == 0 else math.sin(theta)
        c_lo = mid - _HALF_CELL
        c_hi = mid + _HALF_CELL
        zlo = np.inf
        zhi = -np.inf
        for r in (r_lo, r_hi):
            for t in (c_lo, c_hi):
                v = r * t
                if v != v:  # 0 * inf: undecided (as the array version)
                    v = np.inf
                zhi = max(zhi, v)
                zlo = min(zlo, -np.inf if math.isinf(v) else v)
        return settle(f, s, zlo, zhi, ferr)

    @njit(error_model="numpy")
    def tier2_laplace(word: Any, f: Any, s: Any, ferr: Any) -> Any:
        c = np.float64(word & 0x7FFFFFFF)
        big = -math.log(c * 2.0**-31)
        small = -math.log((c + 1.0) * 2.0**-31)
        e_lo = small * (1.0 - _SLOP)
        e_hi = big * (1.0 + _SLOP)
        if (word >> 31) & 1:
            return settle(f, s, -e_hi, -e_lo, ferr)
        return settle(f, s, e_lo, e_hi, ferr)

    @njit(error_model="numpy")
    def exact_f(xc: Any, inv_g64: Any) -> Any:
        """The exact fractional part ``x/g - round(x/g)`` in float64 (0 where ``x/g``
        overflows: there ``x`` is on the lattice)."""
        t = np.float64(xc) * inv_g64
        f = t - np.rint(t)
        return 0.0 if f != f else f

    def lattice_sum(xc, f, j, g):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise NotImplementedError

    @overload(lattice_sum)
    def _lattice_sum(xc, f, j, g):  # type: ignore[no-untyped-def]
        """``(x - f g) + J g`` rounded once; float32 arithmetic runs only for ``g <= 2**100``."""
        if xc == types.float32:
            return lambda xc, f, j, g: (xc - f * g) + j * g

        def impl64(xc, f, j, g):  # type: ignore[no-untyped-def]
            huge = g > _HUGE_G
            d = _DOWN if huge else 1.0
            gd = g * d
            o = (xc * d - f * gd) + j * gd
            return o * _UP if huge else o

        return impl64

    @njit(error_model="numpy")
    def release_one(xc: Any, f: Any, j: Any, g: Any, big: Any) -> Any:
        """``sat(fl(g K)) + 0`` in the compute precision: ``(x - f g) + J g`` (one rounding),
        for ``x`` as :func:`flushed` leaves it (so ``x/g`` is 0 or a normal number and
        ``f`` exact: ``x - f g`` is ``g round(x/g)``). For ``g > 2**900`` (float64, public)
        the sum is formed at ``2**-12`` scale — exact, every term a normal multiple of
        ``2**-12 g`` — so that neither ``g round(x/g)`` nor ``J g`` overflows alone."""
        o = lattice_sum(xc, f, j, g)
        o = big if o > big else o
        o = -big if o < -big else o
        return o + 0

    @njit(nogil=True, error_model="numpy", cache=True)
    def gauss(w, xs, lead, g, inv_g, s32, thr, big, wide, s64, out, flag, stats):  # type: ignore[no-untyped-def]
        """Gaussian release of ``xs`` (values ``lead, lead + 1, ...`` of the pairs ``w``)."""
        k = w.shape[0]
        nv = xs.shape[0]
        zb = np.empty(2 * _BLOCK, np.float32)
        fb = np.empty(2 * _BLOCK, np.uint8)
        m2 = _F(-2.0)
        one = _F(1.0)
        inv_g64 = 1.0 / np.float64(g)
        e_min, ferr = flush_limits(g)
        nflag = 0
        n1 = 0
        nonfinite = np.uint8(0)
        for b0 in range(0, k, _BLOCK):
            b1 = min(b0 + _BLOCK, k)
            wb = w[b0:b1]
            for q in range(b1 - b0):  # the pairs' standard draws
                word = wb[q]
                r = sqrt32(_F(_ln31(word & 0x7FFFFFFF)) * m2)
                bad = (r < _R_LO) | (r > _R_HI)
                h = (word >> 32) & 0xFFFFFFFF
                low = h & _M29
                low = (low ^ _M29) if (h >> 29) & 1 else low
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
                pc = -pc if ((octant + 2) >> 2) & 1 else pc
                qs = -qs if octant >> 2 else qs
                zb[2 * q] = _NAN32 if bad else pc * r  # NaN: flagged below
                zb[2 * q + 1] = _NAN32 if bad else qs * r
            lo = max(2 * b0 - lead, 0)
            hi = min(2 * b1 - lead, nv)
            if hi <= lo:
                continue
            xb = xs[lo:hi]
            ob = out[lo:hi]
            zs = zb[lo + lead - 2 * b0 : hi + lead - 2 * b0]
            anyf = np.uint8(0)
            for q in range(hi - lo):  # the values' releases
                xc = flushed(load(xb, q), e_min)
                t = xc * inv_g
                f = t - np.rint(t)
                if wide:
                    f = xc * 0 if f != f else f  # x / g overflowed: x is on the lattice
                v = zs[q] * s32
                v = v + _F(f)
                j = np.rint(v)
                d = abs(v - j)
                fl = np.uint8(0) if d <= thr else np.uint8(1)  # NaN (a failed gate) flags
                fb[q] = fl
                anyf |= fl
                nonfinite |= np.uint8(0) if abs(xc) <= big else np.uint8(1)
                store(ob, q, release_one(xc, f, j, g, big))
            if anyf:
                for q in range(hi - lo):
                    if fb[q]:
                        n1 += 1
                        i = lo + q
                        cv = i + lead
                        xc = flushed(load(xs, i), e_min)
                        f64 = exact_f(xc, inv_g64)
                        ok, j64 = tier2_gauss(w[cv >> 1], cv & 1, f64, s64, ferr)
                        if ok:
                            store(out, i, release_one(xc, like(xc, f64), like(xc, j64), g, big))
                        else:
                            flag[nflag] = i
                            nflag += 1
        stats[0] += n1
        if nonfinite:
            stats[1] = 1
        return nflag

    @njit(nogil=True, error_model="numpy", cache=True)
    def laplace(w, xs, lead, g, inv_g, s32, thr, big, wide, s64, out, flag, stats):  # type: ignore[no-untyped-def]
        """Laplace release of ``xs`` (values ``lead, lead + 1, ...`` of the words ``w``)."""
        k = w.shape[0]
        nv = xs.shape[0]
        zb = np.empty(_BLOCK, np.float32)
        fb = np.empty(_BLOCK, np.uint8)
        inv_g64 = 1.0 / np.float64(g)
        e_min, ferr = flush_limits(g)
        nflag = 0
        n1 = 0
        nonfinite = np.uint8(0)
        for b0 in range(0, k, _BLOCK):
            b1 = min(b0 + _BLOCK, k)
            wb = w[b0:b1]
            for q in range(b1 - b0):
                word = wb[q]
                c = word & 0x7FFFFFFF
                e = _F(_ln31(c))  # -E
                z = e if (word >> 31) & 1 else -e
                zb[q] = _NAN32 if c < _LAPLACE_GATE else z
            lo = max(b0 - lead, 0)
            hi = min(b1 - lead, nv)
            if hi <= lo:
                continue
            xb = xs[lo:hi]
            ob = out[lo:hi]
            zs = zb[lo + lead - b0 : hi + lead - b0]
            anyf = np.uint8(0)
            for q in range(hi - lo):
                xc = flushed(load(xb, q), e_min)
                t = xc * inv_g
                f = t - np.rint(t)
                if wide:
                    f = xc * 0 if f != f else f
                v = zs[q] * s32
                v = v + _F(f)
                j = np.rint(v)
                d = abs(v - j)
                fl = np.uint8(0) if d <= thr else np.uint8(1)
                fb[q] = fl
                anyf |= fl
                nonfinite |= np.uint8(0) if abs(xc) <= big else np.uint8(1)
                store(ob, q, release_one(xc, f, j, g, big))
            if anyf:
                for q in range(hi - lo):
                    if fb[q]:
                        n1 += 1
                        i = lo + q
                        xc = flushed(load(xs, i), e_min)
                        f64 = exact_f(xc, inv_g64)
                        ok, j64 = tier2_laplace(w[i + lead], f64, s64, ferr)
                        if ok:
                            store(out, i, release_one(xc, like(xc, f64), like(xc, j64), g, big))
                        else:
                            flag[nflag] = i
                            nflag += 1
        stats[0] += n1
        if nonfinite:
            stats[1] = 1
        return nflag

    @njit(nogil=True, error_model="numpy", cache=True)
    def finish(xs, idx, js, g, big, out):  # type: ignore[no-untyped-def]
        """Write the releases of the values ``idx`` with exact indices ``js`` (tier 3)."""
        inv_g64 = 1.0 / np.float64(g)
        e_min = flush_limits(g)[0]
        for p in range(idx.shape[0]):
            i = idx[p]
            xc = flushed(load(xs, i), e_min)  # the release of x is that of its flush
            f64 = exact_f(xc, inv_g64)
            store(out, i, release_one(xc, like(xc, f64), like(xc, js[p]), g, big))

    @njit(nogil=True, error_model="numpy", cache=True)
    def ln_array(c, out):  # type: ignore[no-untyped-def]
        for i in range(c.shape[0]):
            out[i] = _ln31(c[i])

    _gauss_jit, _laplace_jit, _finish_jit, _ln_jit = gauss, laplace, finish, ln_array


def ln_u31(c: Any) -> Any:
    """``ln(c 2**-31)`` (float64) as the compiled pass computes it, for integers ``c`` in
    ``[0, 2**31)`` (tests check :data:`LN_REL_ERROR`)."""
    c = np.ascontiguousarray(c, dtype=np.int64)
    out = np.empty(c.shape, dtype=np.float64)
    _ln_jit(c.reshape(-1), out.reshape(-1))
    return out


def _scalars(xs: Any, g: float, s: float, thr: float, big: float) -> tuple[Any, ...]:
    dt = np.float32 if xs.dtype == np.uint16 else xs.dtype.type
    return dt(g), dt(1.0 / g), _F(s), _F(thr), dt(big), g < 1.0, float(s)


def gaussian_release(
    w: Any, xs: Any, lead: int, g: float, s: float, thr: float, big: float, out: Any, flag: Any,
    stats: Any,
) -> int:  # fmt: skip
    """Release the values ``xs`` (float32, float64, or bfloat16 bits as uint16), which are
    values ``lead, lead + 1, ...`` of the pairs whose 64-bit words are ``w`` (int64), into
    ``out`` (same dtype); the positions of the values that need more random bits go into
    ``flag[:count]`` (int64, as large as ``xs``); ``stats[0]`` counts the values the fast
    pass flagged. Returns ``count``. ``big``: the compute dtype's largest finite value."""
    sc = _scalars(xs, g, s, thr, big)
    return int(_gauss_jit(w, xs, lead, *sc, out, flag, stats))


def laplace_release(
    w: Any, xs: Any, lead: int, g: float, s: float, thr: float, big: float, out: Any, flag: Any,
    stats: Any,
) -> int:  # fmt: skip
    """:func:`gaussian_release` for the Laplace: ``w`` the values' 32-bit words (int32)."""
    sc = _scalars(xs, g, s, thr, big)
    return int(_laplace_jit(w, xs, lead, *sc, out, flag, stats))


def write_exact(xs: Any, idx: Any, js: Any, g: float, big: float, out: Any) -> None:
    """Write the releases of the values at ``idx`` whose exact indices are ``js``."""
    dt = np.float32 if xs.dtype == np.uint16 else xs.dtype.type
    _finish_jit(xs, idx, js, dt(g), dt(big), out)
