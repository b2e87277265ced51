"""Exact lattice releases of linear combinations of counter normals (correlated noise).

A correlated-noise release adds ``sigma * scale * sum_k a_k Z_k`` to a value, where each
``Z_k`` is the ideal standard normal of one counter ``(stream, step_k, position)`` of
:class:`~renyi.noise.CounterNoise` (the real number its random bits define, docs/noise.md)
and the ``a_k`` are the exact coefficients of the strategy as implemented (a
:class:`CombinationRow`: dyadic rationals, or fixed-point numbers with a proven radius). The
released index is ``K = round(value/g + s * scale * sum_k a_k Z_k)``, decided exactly:

1. the caller's float64 combination ``y`` with a proven bound ``|y - sum_k a_k Z_k| <=
   error_bound`` gives ``v = f + s*scale*y``; the index ``round(v)`` is accepted when ``v`` is
   farther than the total error from a rounding boundary (:func:`fast_indices`);
2. the rare remaining coordinates (:func:`decide`) regenerate the bits of every ``Z_k`` at that
   position from the counters, evaluate each ``Z_k`` in mpmath's interval arithmetic and sum
   ``a_k Z_k`` exactly in integers, reading more extension levels (and asking the row for
   more coefficient bits) until the interval lies inside one rounding cell.

:func:`normals` draws the float64 normals and a proven bound on their error; the bound's
assumptions (float64 ``log``, ``log1p``, ``cos``, ``sin`` within :data:`LIBM_ULPS` ulp) are
stated and tested (``docs/noise.md``, "Correlated noise").
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from renyi._validation import fail
from renyi.noise import _chacha, _exact

__all__ = [
    "LIBM_ULPS",
    "UNIT_ROUNDOFF",
    "CombinationRow",
    "decide",
    "fast_indices",
    "fast_margin",
    "gamma",
    "normals",
]

#: float64 unit roundoff ``u = 2**-53``.
UNIT_ROUNDOFF = 2.0**-53
#: Assumed accuracy of numpy's float64 ``log``, ``log1p``, ``cos`` and ``sin`` (ulp): glibc,
#: SLEEF and numpy's SIMD routines document at most 4; ``tests/test_noise_combination.py``
#: measures them on every run and fails above 4 (a 4-fold margin).
LIBM_ULPS = 16
_U = UNIT_ROUNDOFF
_FULL = 1 << 50  # a uniform's numerator (or its complement's) is extended until >= 2**50
_EXTEND = 1 << 18  # below this, one more level keeps the numerator below 2**50 (exact)
_LOG1P = 1 << 59  # complements below 2**59 (1 - U1 < 2**-4) take log1p
_MAX_FAST_LEVELS = 30  # the float pass stops here (U1 < 2**-900: probability < 2**-900)
_TOP63 = (1 << 63) - 1
_TWO_PI_2_64 = 2.0 * math.pi * 2.0**-64
_BATCH_BLOCKS = 1 << 14  # ChaCha20 blocks per vectorised call of the exact tier


def gamma(k: int) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)``: the relative error bound of a float64 sum of
    ``k`` rounded terms (products included), in any order, fused or not."""
    return k * _U / (1.0 - k * _U)


@dataclass(frozen=True)
class CombinationRow:
    """The exact coefficients of one released combination ``sum_k a_k Z(stream, steps[k], i)``.

    Coefficient ``k`` is a real number in ``[(numerators[k] - radius) 2**-shift,
    (numerators[k] + radius) 2**-shift]`` (``radius = 0``: exactly ``numerators[k] 2**-shift``,
    e.g. a float coefficient). The release decides its index for every coefficient in these
    intervals, so a row with a radius describes the true (real) coefficients of a strategy
    whose impulse response is only known to that precision.

    >>> row = CombinationRow.from_floats([4, 3], [1.0, -0.5])
    >>> row.numerators, row.shift, row.radius
    ((2, -1), 1, 0)
    """

    steps: tuple[int, ...]
    numerators: tuple[int, ...]
    shift: int
    radius: int = 0

    def __post_init__(self) -> None:
        if len(self.steps) != len(self.numerators) or not self.steps:
            raise fail("row", "steps/numerators", "equal non-zero lengths")
        if self.radius < 0 or self.shift < -1100:
            raise fail("row", (self.shift, self.radius), "a radius >= 0")

    @classmethod
    def from_floats(cls, steps: Sequence[int], coefficients: Sequence[float]) -> CombinationRow:
        """The row of finite float coefficients, exactly (each float is a dyadic rational)."""
        coefs = [float(c) for c in coefficients]
        if not all(math.isfinite(c) for c in coefs):
            raise fail("coefficients", coefficients, "finite numbers")
        shift = 0
        fracs = []
        for c in coefs:
            num, den = c.as_integer_ratio()
            fracs.append((num, den))
            shift = max(shift, den.bit_length() - 1)
        nums = tuple(num << (shift - (den.bit_length() - 1)) for num, den in fracs)
        return cls(tuple(int(s) for s in steps), nums, shift, 0)


# ------------------------------------------------------------------------- float64 normals
def normals(bits: Any, first: int, n: int) -> tuple[NDArray[np.float64], float]:
    """``(z, err)``: ``n`` float64 standard normals, values ``first, first + 1, ...`` of the
    Gaussian bits ``bits`` (a ``_CounterBits``), and ``err >= max |z_i - Z_i|`` where ``Z_i`` is
    the ideal normal of those bits (every completion of the bits not read).

    Box-Muller with the radius uniform ``U1`` read to at least 50 significant bits from the
    end it is close to: ``ln U1 = log(U1)``, except ``log1p(-(1 - U1))`` when ``1 - U1 <
    2**-4``, with ``1 - U1`` from the complement of its numerator (so a radius near 0 keeps
    its relative precision); a numerator (or complement) below ``2**50`` (probability
    ``2**-12``) reads further extension levels, 32 bits each. Error bound (docs/noise.md):
    ``|R^ - R| <= (5.2 + 33.3 R^) u`` and ``|z - Z| <= (6 + 76 max R^) u`` with ``u =
    2**-53``, assuming float64 ``log``, ``log1p``, ``cos``, ``sin`` within :data:`LIBM_ULPS`
    ulp. ``err`` is ``inf`` when a numerator is still below ``2**50`` after 30 levels
    (probability below ``2**-900``): every value is then flagged.
    """
    u0 = first // 2
    u1 = (first + n + 1) // 2
    k = u1 - u0
    if n == 0:
        return np.zeros(0), 0.0
    main = np.frombuffer(bits.main_bytes(u0, k), dtype="<u4").astype(np.int64).reshape(k, 2)
    ext = np.frombuffer(bits._blocks_bytes(1, 8 * u0, 8 * k), dtype="<u4")
    ext = ext.astype(np.int64).reshape(k, 2)
    hi31 = main[:, 0] & 0x7FFFFFFF
    c = (hi31 << 32) | ext[:, 0]  # U1 in [c, c + 1) 2**-63; 1 - U1 in (d, d + 1] 2**-63
    # (c + 1/2) 2**-63 in float64: two roundings (relative 2.0001 u)
    low_val = (hi31.astype(np.float64) * 2.0**32 + ext[:, 0].astype(np.float64) + 0.5) * 2.0**-63
    top = np.flatnonzero(c > _TOP63 - _LOG1P)  # d < 2**59, 1 - U1 < 2**-4: log1p of 1 - U1
    up_val = np.empty(k)
    up_val[top] = ((_TOP63 - c[top]).astype(np.float64) + 0.5) * 2.0**-63  # d + 1/2
    err_scale = 1.0
    # c < 2**50 or d < 2**50, in one unsigned comparison
    need = np.flatnonzero((c - _FULL).view(np.uint64) > np.uint64(_TOP63 - 2 * _FULL))
    if need.size:
        cn = c[need]
        upper = cn >= 1 << 62
        num = np.where(upper, _TOP63 - cn, cn)
        if not _extend(bits, u0, need, num, upper, low_val, up_val):
            err_scale = math.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        ln_u = np.log(low_val)
        ln_u[top] = np.log1p(-up_val[top])
    r = np.sqrt(-2.0 * ln_u)
    theta = (main[:, 1].astype(np.float64) * 2.0**32 + ext[:, 1].astype(np.float64) + 0.5) * (
        _TWO_PI_2_64
    )
    z = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1).reshape(-1)
    start = first - 2 * u0
    r_max = float(r.max())
    err = (6.0 + 76.0 * r_max) * _U * (1.0 + 2.0**-20) * err_scale
    return np.ascontiguousarray(z[start : start + n]), err


def _extend(
    bits: Any,
    u0: int,
    idx: NDArray[np.int64],
    num: NDArray[np.int64],
    upper: NDArray[np.bool_],
    low_val: NDArray[np.float64],
    up_val: NDArray[np.float64],
) -> bool:
    """Read extension levels 2, 3, ... for the units ``u0 + idx`` whose numerator ``num``
    (``c``, or the complement ``d`` where ``upper``) is below ``2**50``, and write the float64
    ``(num + 1/2) 2**-bits`` (two roundings: ``num < 2**50`` is exact) into ``low_val`` /
    ``up_val``. False if 30 levels did not suffice."""
    nbits = np.full(idx.size, 63, dtype=np.int64)
    pending = np.arange(idx.size)
    num = num.copy()
    for level in range(2, _MAX_FAST_LEVELS + 1):
        if not pending.size:
            return True
        e1, _ = bits.ext(level, u0 + idx[pending])
        e = np.where(upper[pending], 0xFFFFFFFF - e1, e1)  # the complement's next 32 bits
        v = num[pending]
        done = v >= _EXTEND  # v 2**32 + e >= 2**50: final
        fin = pending[done]
        val = (v[done].astype(np.float64) * 2.0**32 + e[done].astype(np.float64) + 0.5) * np.ldexp(
            1.0, -(nbits[fin] + 32)
        )
        low_val[idx[fin[~upper[fin]]]] = val[~upper[fin]]
        up_val[idx[fin[upper[fin]]]] = val[upper[fin]]
        keep = pending[~done]
        num[keep] = (num[keep] << 32) | e[~done]  # exact: < 2**50
        nbits[keep] += 32
        pending = keep
    return not pending.size


# ------------------------------------------------------------------------- the fast check
def fast_margin(y_max: float, s: float, scale: float, error_bound: float) -> float:
    """Lattice units within which ``v = fl(f + fl(fl(s scale) y))`` may differ from the ideal
    ``f + s scale Y`` (``|y - Y| <= error_bound``, ``|y| <= y_max``, ``|f| <= 1/2``): ``s scale
    error_bound + 2.01 u s scale y_max + 1.01 u (1/2 + s scale y_max)``, inflated by ``2**-40``
    for its own rounding. One number per release, from the noise only: which values are
    flagged does not depend on the data beyond the flatness of ``s scale Z`` modulo 1."""
    sy = s * scale * y_max
    raw = s * scale * error_bound + 2.01 * _U * sy + 1.01 * _U * (0.5 + sy * (1 + 4 * _U))
    return raw * (1.0 + 2.0**-40) + 2.0**-60


def fast_indices(
    f: NDArray[np.float64], y: NDArray[np.float64], s: float, scale: float, error_bound: float
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``(J, flagged)``: ``J = round(f + s scale y)`` and the positions where it may differ
    from ``round(f + s scale Y)`` for some ideal ``Y`` with ``|y - Y| <= error_bound``: those
    with ``|v - J|`` (exact) not below ``1/2 -`` :func:`fast_margin`."""
    y_max = max(float(y.max()), -float(y.min())) if y.size else 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        margin = fast_margin(y_max, s, scale, error_bound)
        v = f + (s * scale) * y
        j = np.rint(v)
        flagged = ~(np.abs(v - j) < 0.5 - margin)  # NaN/inf (an infinite bound) is flagged
    return j, np.flatnonzero(flagged)


# ------------------------------------------------------------------------- the exact tier
def _nonce_words(domain: int, stream: int, steps: NDArray[np.int64]) -> NDArray[np.int64]:
    first = struct.unpack("<I", _chacha.make_nonce(domain, stream, 0)[:4])[0]
    out = np.empty((steps.size, 3), dtype=np.int64)
    out[:, 0] = first
    out[:, 1] = steps & 0xFFFFFFFF
    out[:, 2] = steps >> 32
    return out


def _words(
    key: bytes, domain: int, stream: int, steps: NDArray[np.int64], units: NDArray[np.int64]
) -> NDArray[np.int64]:
    """``(N, 2)``: the two 32-bit words of Gaussian unit ``units[i]`` in domain ``domain`` of
    step ``steps[i]`` (one vectorised ChaCha20 call for all pairs)."""
    words = _chacha.chacha20_blocks(key, _nonce_words(domain, stream, steps), units // 8, np)
    pos = 2 * (units % 8)
    rows = np.arange(units.size)
    return np.stack([words[rows, pos], words[rows, pos + 1]], axis=1)


def _floor_scaled(x: Any, q: int, up: bool) -> int:
    """``floor(x 2**q)`` (``ceil`` if ``up``) of a raw mpmath number ``(sign, man, exp, bc)``,
    exactly."""
    sign, man, exp, _ = x
    if not man:
        return 0
    m = -int(man) if sign else int(man)
    e = int(exp) + q
    if e >= 0:
        return m << e
    return -((-m) >> -e) if up else m >> -e


def _z_interval(n1: int, b1: int, n2: int, b2: int, which: int, prec: int) -> Any:
    """The standard normal ``sqrt(-2 ln U1) (cos, sin)(2 pi U2)`` over the box ``U1 in [n1,
    n1 + 1] 2**-b1``, ``U2 in [n2, n2 + 1] 2**-b2`` as a raw mpmath interval (outward rounding
    at ``prec`` bits: mpmath's interval arithmetic, without its context's conversions); None
    when ``n1 = 0`` (``U1`` may be arbitrarily small)."""
    from mpmath.libmp import from_man_exp, libmpi

    if n1 == 0:
        return None
    box = (from_man_exp(n1, -b1), from_man_exp(n1 + 1, -b1))  # exact
    radius = libmpi.mpi_sqrt(libmpi.mpi_shift(libmpi.mpi_neg(libmpi.mpi_log(box, prec)), 1), prec)
    turn = (from_man_exp(n2, 1 - b2), from_man_exp(n2 + 1, 1 - b2))  # 2 U2, exact
    cos, sin = libmpi.mpi_cos_sin(libmpi.mpi_mul(libmpi.mpi_pi(prec), turn, prec), prec)
    return libmpi.mpi_mul(radius, cos if which == 0 else sin, prec)


def decide(
    key: bytes,
    stream: int,
    positions: NDArray[np.int64],
    f: NDArray[np.float64],
    s: float,
    scale: float,
    row: Callable[[int], CombinationRow],
    max_levels: int = _exact.MAX_LEVELS,
) -> NDArray[np.float64]:
    """The exact ``J = round(f + s scale sum_k a_k Z_k)`` at each global position (tier 3).

    For each position, round ``l = 1, 2, ...`` reads extension levels ``1..l`` of every
    ``Z_k`` (regenerated from the counters: the main words and level ``1..l`` words of the
    position's Gaussian unit at ``(stream, steps[k])``; level 1 for all positions in one
    vectorised ChaCha20 call), evaluates each ``Z_k`` as an mpmath interval at ``32 l + 64``
    bits, rounds it outward to integers at ``2**-(32 l + 72)``, and sums ``a_k Z_k`` exactly
    with the coefficient intervals of ``row(32 l + 88)``; the index is decided when ``f + s
    scale sum`` lies strictly inside one rounding cell. After ``max_levels`` rounds the
    midpoint's index is taken (docs/noise.md: probability below ``2**-9000`` per value).
    """
    sc = Fraction(s) * Fraction(scale)
    out = np.empty(positions.size, dtype=np.float64)
    cache: dict[int, CombinationRow] = {}

    def row_at(bits: int) -> CombinationRow:
        if bits not in cache:
            cache[bits] = row(bits)
            if cache[bits].steps != cache[next(iter(cache))].steps:
                raise fail("row", "rows of other steps", "the same steps at every precision")
        return cache[bits]

    steps = np.asarray(row_at(120).steps, dtype=np.int64)
    k_terms = steps.size
    units = np.asarray(positions, dtype=np.int64) // 2
    batch = max(1, _BATCH_BLOCKS // k_terms)  # positions whose level-1 words are fetched at once
    main: list[Any] = []
    first: list[Any] = []
    for i, (pos, fi) in enumerate(zip(positions.tolist(), f.tolist(), strict=True)):
        if i % batch == 0:
            chunk = units[i : i + batch]
            all_steps = np.tile(steps, chunk.size)
            all_units = np.repeat(chunk, k_terms)
            main = _words(key, 0, stream, all_steps, all_units).tolist()
            first = _words(key, 1, stream, all_steps, all_units).tolist()
        unit, which = divmod(int(pos), 2)
        ff = Fraction(fi)
        block = slice((i % batch) * k_terms, (i % batch + 1) * k_terms)
        pairs = list(zip(main[block], first[block], strict=True))
        n1 = [((w[0] & 0x7FFFFFFF) << 32) | e[0] for w, e in pairs]
        n2 = [(w[1] << 32) | e[1] for w, e in pairs]
        b1, b2 = 63, 64
        k_mid = 0.0
        for level in range(1, max_levels + 1):
            if level > 1:  # rare: one more level of this position's bits
                ext = _words(key, level, stream, steps, np.full(k_terms, unit)).tolist()
                n1 = [(a << 32) | e[0] for a, e in zip(n1, ext, strict=True)]
                n2 = [(a << 32) | e[1] for a, e in zip(n2, ext, strict=True)]
                b1, b2 = b1 + 32, b2 + 32
            prec = 32 * level + 64
            total = _sum_interval(
                row_at(prec + 24), n1, b1, n2, b2, which, prec, capped=level == max_levels
            )
            if total is None:
                continue
            v_lo = ff + sc * total[0]
            v_hi = ff + sc * total[1]
            k = math.floor((v_lo + v_hi) / 2 + Fraction(1, 2))
            k_mid = float(k)
            if k - Fraction(1, 2) < v_lo and v_hi < k + Fraction(1, 2):
                break
        out[i] = k_mid
    return out


def _sum_interval(
    row: CombinationRow,
    n1: list[int],
    b1: int,
    n2: list[int],
    b2: int,
    which: int,
    prec: int,
    capped: bool,
) -> tuple[Fraction, Fraction] | None:
    """``(lo, hi)``: ``sum_k a_k Z_k`` lies in ``[lo, hi]``; None when a term is unbounded at
    these bits (a radius numerator of 0: read more levels)."""
    q = prec + 8
    lo_sum = 0
    hi_sum = 0
    mag = 0
    for num, a1, a2 in zip(row.numerators, n1, n2, strict=True):
        if num == 0 and row.radius == 0:
            continue
        z = _z_interval(a1 if a1 or not capped else 1, b1, a2, b2, which, prec)  # cap: 2**-b1
        if z is None:
            return None
        zl = _floor_scaled(z[0], q, up=False)
        zh = _floor_scaled(z[1], q, up=True)
        p, r = num * zl, num * zh
        lo_sum += min(p, r)
        hi_sum += max(p, r)
        mag += max(abs(zl), abs(zh))
    lo_sum -= row.radius * mag
    hi_sum += row.radius * mag
    e = row.shift + q  # the sums are at 2**-e
    if e >= 0:
        return Fraction(lo_sum, 1 << e), Fraction(hi_sum, 1 << e)
    return Fraction(lo_sum << -e), Fraction(hi_sum << -e)
