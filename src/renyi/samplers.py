"""Exact samplers over the integers (Canonne, Kamath & Steinke 2020, arXiv:2004.00010).

The three samplers of that paper, with no floating point anywhere in their decisions: every
acceptance test compares a uniform random integer with an integer numerator, so the output
distribution is *exactly* the stated one (given uniform random bits, see :mod:`renyi.random`).

* :func:`bernoulli_exp` -- Bernoulli(exp(-gamma)) for a rational gamma >= 0 (Algorithm 1).
* :func:`discrete_laplace` -- P[X = x] proportional to exp(-|x| / scale), rational scale
  (Algorithm 2).
* :func:`discrete_gaussian` -- P[X = x] proportional to exp(-x**2 / (2 sigma**2)), rational
  sigma**2 (Algorithm 3).

Vectorisation: all draws of a batch advance together; every rejection loop is a loop over
*rounds* that redraws only the entries still pending (numpy integer arithmetic on int64). A
batch of 10**6 draws takes a few dozen rounds, not 10**6 Python iterations.

Range of the fast path (documented limits, checked, never silently wrong):

* parameters are converted to exact fractions (a float is its exact binary value);
  ``discrete_laplace`` needs the numerator and denominator of ``scale`` below ``2**56``;
  ``discrete_gaussian`` needs those of ``sigma_squared`` below ``2**56``; otherwise
  :class:`~renyi.errors.PrivacyParameterError` is raised (pass a simpler fraction).
* inside the discrete Gaussian's acceptance test the integers ``(b|y| - a)**2`` and
  ``2abt`` (with ``sigma**2 / t = a / b``) stay in int64 when ``b|y| + a < 2**31`` and
  ``2abt < 2**62``; draws outside that range (rare far-tail draws, or the whole batch for
  fractions with large terms such as the binary value of 0.3) are decided by the same
  algorithm on Python integers (numpy object arrays), exactly; if only ``(b|y| - a)**2``
  overflows, it is split exactly into floor and remainder and the int64 path continues.

Example
-------
>>> import numpy as np
>>> from fractions import Fraction
>>> from renyi.samplers import discrete_gaussian, discrete_laplace
>>> x = discrete_laplace(Fraction(3, 2), size=5, rng=np.random.default_rng(0))
>>> x.dtype, x.shape
(dtype('int64'), (5,))
>>> y = discrete_gaussian(4, size=(2, 3), rng=np.random.default_rng(0))
>>> y.shape
(2, 3)
"""

from __future__ import annotations

import math
import numbers
import os
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import logsumexp

from renyi._validation import check_int, fail
from renyi.random import RandomSource, get_source

__all__ = [
    "as_fraction",
    "bernoulli_exp",
    "discrete_gaussian",
    "discrete_gaussian_logpmf",
    "discrete_laplace",
    "discrete_laplace_logpmf",
]

_TERM_LIMIT = 2**56  # numerators / denominators of parameters
_SQRT_LIMIT = 2**31  # b|y| + a below this keeps (b|y| - a)**2 in int64
_DEN_LIMIT = 2**62

Size = int | tuple[int, ...]


def as_fraction(name: str, value: Any, *, allow_zero: bool = False) -> Fraction:
    """``value`` as an exact :class:`~fractions.Fraction` (> 0, or >= 0 with ``allow_zero``).

    Accepts ints, fractions and finite floats (converted exactly, no rounding); refuses
    booleans, strings, NaN and infinities with a :class:`PrivacyParameterError`.
    """
    expected = "a finite rational number >= 0" if allow_zero else "a finite rational number > 0"
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise fail(name, value, expected)
    if isinstance(value, Fraction):
        frac = value
    elif isinstance(value, numbers.Integral):
        frac = Fraction(int(value))
    else:
        x = float(value)
        if not math.isfinite(x):
            raise fail(name, value, expected)
        frac = Fraction(x)
    if frac < 0 or (frac == 0 and not allow_zero):
        raise fail(name, value, expected)
    return frac


def _shape(size: Size | None) -> tuple[int, ...]:
    if size is None:
        return ()
    if isinstance(size, tuple):
        return tuple(check_int("size", s) for s in size)
    return (check_int("size", size),)


# ---------------------------------------------------------------- Algorithm 1 (vectorised)
def _bernoulli_exp_unit(
    num: NDArray[np.int64], den: NDArray[np.int64], src: RandomSource
) -> NDArray[np.bool_]:
    """Bernoulli(exp(-num/den)) for 0 <= num <= den (CKS Algorithm 1, gamma in [0, 1]).

    K = 1; while Bernoulli(gamma / K): K += 1; return K odd. Bernoulli(gamma / K) is one
    draw of Bernoulli(num / (den K)) when ``den K <= 2**62``, else Bernoulli(num / den) AND
    Bernoulli(1 / K) (independent), so no product can overflow.
    """
    k = np.ones(num.shape, dtype=np.int64)
    active = np.flatnonzero(num > 0)
    while active.size:
        ka, da, na = k[active], den[active], num[active]
        if int(da.max()) * int(ka.max()) <= _DEN_LIMIT:  # the usual case: one draw each
            a = src.bernoulli(na, da * ka)
        else:
            fits = da <= _DEN_LIMIT // ka
            a = np.empty(active.size, dtype=np.bool_)
            a[fits] = src.bernoulli(na[fits], da[fits] * ka[fits])
            rest = ~fits
            a[rest] = src.bernoulli(na[rest], da[rest]) & src.bernoulli(1, ka[rest])
        k[active[a]] += 1
        active = active[a]
    return (k & 1).astype(np.bool_)


def _bernoulli_exp_arrays(
    num: NDArray[np.int64], den: NDArray[np.int64], src: RandomSource
) -> NDArray[np.bool_]:
    """Bernoulli(exp(-num/den)) for int64 arrays, num >= 0, 1 <= den < 2**62."""
    whole = num // den
    frac = num - whole * den
    out = np.ones(num.shape, dtype=np.bool_)
    # exp(-floor(gamma)): floor(gamma) independent Bernoulli(exp(-1)) must all succeed.
    alive = np.flatnonzero(whole > 0)
    while alive.size:
        ones = np.ones(alive.size, dtype=np.int64)
        ok = _bernoulli_exp_unit(ones, ones, src)
        out[alive[~ok]] = False
        whole[alive] -= 1
        alive = alive[ok]
        alive = alive[whole[alive] > 0]
    rest = np.flatnonzero(out)
    if rest.size:
        out[rest] = _bernoulli_exp_unit(frac[rest], den[rest], src)
    return out


def _big_below(bound: int, m: int, src: RandomSource) -> NDArray[Any]:
    """``m`` exact uniform Python integers in ``[0, bound)`` (object array), by rejection."""
    nbits = (bound - 1).bit_length()
    nwords = max(1, (nbits + 63) // 64)
    out = np.empty(m, dtype=object)
    todo = np.arange(m)
    while todo.size:
        w = src.words(todo.size * nwords).reshape(todo.size, nwords)
        x = w[:, 0].astype(object)
        for j in range(1, nwords):
            x = (x << 64) | w[:, j].astype(object)
        x = x >> (64 * nwords - nbits)  # exactly nbits uniform bits
        ok = (x < bound).astype(np.bool_)
        out[todo[ok]] = x[ok]
        todo = todo[~ok]
    return out


def _bernoulli_exp_big(num: Any, den: int, m: int, src: RandomSource) -> NDArray[np.bool_]:
    """``m`` draws of Bernoulli(exp(-num_i/den)) with terms of any size.

    ``num`` is one Python integer or an object array of ``m`` of them; ``den`` is one Python
    integer. Same Algorithm 1 as the int64 path, vectorised over the draws, with the uniform
    integers of the Bernoulli(frac/den) tests drawn as Python integers (object arrays).
    """
    nums = np.empty(m, dtype=object)
    nums[:] = num if isinstance(num, np.ndarray) else [int(num)] * m
    whole = nums // den
    frac = nums % den
    out = np.ones(m, dtype=np.bool_)
    # exp(-whole): whole Bernoulli(exp(-1)) trials, in int64-sized chunks (one chunk in practice)
    while True:
        alive = np.flatnonzero(out & (whole > 0).astype(np.bool_))
        if not alive.size:
            break
        chunk = np.minimum(whole[alive], _DEN_LIMIT - 1)
        ok = _bernoulli_exp_arrays(chunk.astype(np.int64), np.ones(alive.size, np.int64), src)
        out[alive] = ok
        whole[alive] = whole[alive] - chunk
    idx = np.flatnonzero(out & (frac > 0).astype(np.bool_))
    k = np.ones(idx.size, dtype=np.int64)
    active = np.arange(idx.size)
    while active.size:
        a = (_big_below(den, active.size, src) < frac[idx[active]]).astype(np.bool_)
        a &= src.bernoulli(1, k[active])
        k[active[a]] += 1
        active = active[a]
    out[idx] = (k & 1).astype(np.bool_)
    return out


def bernoulli_exp(gamma: Any, size: Size | None = None, rng: Any = None) -> NDArray[np.bool_]:
    """Exact Bernoulli(exp(-gamma)) draws for a rational ``gamma >= 0`` (CKS 2020, Alg. 1).

    ``gamma`` is an int, a :class:`~fractions.Fraction` or a float (taken at its exact binary
    value). Returns a boolean array of shape ``size``; ``True`` with probability exactly
    ``exp(-gamma)``.

    >>> import numpy as np
    >>> bernoulli_exp(0, size=3, rng=np.random.default_rng(1)).tolist()
    [True, True, True]
    """
    g = as_fraction("gamma", gamma, allow_zero=True)
    shape = _shape(size)
    src = get_source(rng)
    n = math.prod(shape)
    if g.numerator < _DEN_LIMIT and g.denominator < _DEN_LIMIT:
        num = np.full(n, g.numerator, dtype=np.int64)
        den = np.full(n, g.denominator, dtype=np.int64)
        return _bernoulli_exp_arrays(num, den, src).reshape(shape)
    return _bernoulli_exp_big(g.numerator, g.denominator, n, src).reshape(shape)


# ---------------------------------------------------------------- Algorithm 2 (vectorised)
def _check_terms(name: str, value: Any, frac: Fraction) -> None:
    if frac.numerator >= _TERM_LIMIT or frac.denominator >= _TERM_LIMIT:
        raise fail(
            name,
            value,
            "a rational number whose numerator and denominator are below 2**56 "
            "(pass a fractions.Fraction with smaller terms)",
        )


def _geometric_exp1(n: int, src: RandomSource) -> NDArray[np.int64]:
    """Number of successes before the first failure of Bernoulli(exp(-1)) trials."""
    v = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        ones = np.ones(active.size, dtype=np.int64)
        ok = _bernoulli_exp_unit(ones, ones, src)
        v[active[ok]] += 1
        active = active[ok]
    return v


_V_SAFE = 2**62


def _exact_overflow_guard(
    u: NDArray[np.int64], v: NDArray[np.int64], t: int, s: int
) -> NDArray[np.int64]:
    """(u + t v) // s in Python integers, for the (astronomically rare) draws where t v
    would overflow int64; a result beyond int64 cannot be represented and is an error."""
    y = (u.astype(object) + t * v.astype(object)) // s
    if any(abs(int(x)) >= 2**63 for x in y.tolist()):  # pragma: no cover - p < 1e-27
        raise OverflowError("a discrete Laplace draw exceeded the int64 range")
    return y.astype(np.int64)


def _discrete_laplace_int(t: int, s: int, n: int, src: RandomSource) -> NDArray[np.int64]:
    """``n`` draws of the discrete Laplace with scale t/s (CKS Algorithm 2), int64."""
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        m = todo.size
        t_arr = np.full(m, t, dtype=np.int64)
        u = src.integers_below(t_arr)
        keep = _bernoulli_exp_arrays(u, t_arr, src)  # accept U w.p. exp(-U/t)
        u = u[keep]
        cand = todo[keep]
        v = _geometric_exp1(u.size, src)
        if v.size and int(v.max()) > _V_SAFE // t:  # probability < e**-64 per draw
            y = _exact_overflow_guard(u, v, t, s)
        else:
            y = (u + t * v) // s
        neg = src.bits(u.size)
        good = ~(neg & (y == 0))  # reject "-0" so that 0 is not counted twice
        out[cand[good]] = np.where(neg[good], -y[good], y[good])
        done = np.zeros(m, dtype=np.bool_)
        done[np.flatnonzero(keep)[good]] = True
        todo = todo[~done]
    return out


def discrete_laplace(scale: Any, size: Size | None = None, rng: Any = None) -> NDArray[np.int64]:
    """Exact draws from the discrete Laplace distribution on the integers (CKS 2020, Alg. 2).

    ``P[X = x] = (1 - e^{-1/scale}) / (1 + e^{-1/scale}) * exp(-|x| / scale)`` for every
    integer ``x``. ``scale`` is a positive rational (int, Fraction or float, taken exactly)
    whose numerator and denominator are below ``2**56``. Adding it to an integer query of
    sensitivity ``Delta`` gives ``(Delta / scale)``-DP (the ratio of the pmfs at ``x`` and
    ``x - Delta`` is at most ``exp(Delta / scale)``).

    >>> import numpy as np
    >>> discrete_laplace(10, size=4, rng=np.random.default_rng(3)).shape
    (4,)
    """
    frac = as_fraction("scale", scale)
    _check_terms("scale", scale, frac)
    shape = _shape(size)
    src = get_source(rng)
    return noise_laplace_int(frac.numerator, frac.denominator, math.prod(shape), src).reshape(shape)


# ---------------------------------------------------------------- Algorithm 3 (vectorised)
def _discrete_gaussian_frac(
    sigma2: Fraction, t: int, n: int, src: RandomSource
) -> NDArray[np.int64]:
    """``n`` exact draws of N_Z(0, sigma2) with the Laplace proposal of integer scale ``t``.

    Accept a discrete-Laplace(t) proposal y with probability
    exp(-(|y| - sigma2/t)**2 / (2 sigma2)) (CKS Algorithm 3; valid for every integer t >= 1,
    efficient for t near sigma). With sigma2 / t = a / b that exponent is
    (b|y| - a)**2 / (2 a b t), a ratio of integers.
    """
    q = sigma2 / t
    a, b = q.numerator, q.denominator
    den = 2 * a * b * t
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        y = _discrete_laplace_int(t, 1, todo.size, src)
        ay = np.abs(y)
        accept = np.zeros(todo.size, dtype=np.bool_)
        if den < _DEN_LIMIT:
            fast = ay < (_SQRT_LIMIT - a) // b
            fi = np.flatnonzero(fast)
            if fi.size:
                num = (b * ay[fi] - a) ** 2
                den_arr = np.full(fi.size, den, dtype=np.int64)
                accept[fi] = _bernoulli_exp_arrays(num, den_arr, src)
            mi = np.flatnonzero(~fast)  # (b|y| - a)**2 overflows int64 but den does not:
            if mi.size:  # split it into floor and remainder exactly, then the int64 path
                big = (b * ay[mi].astype(object) - a) ** 2
                whole = (big // den).astype(np.int64)  # gamma < 2**62: |y| is < 2**40 sigma
                frac = (big % den).astype(np.int64)
                accept[mi] = _bernoulli_exp_arrays(
                    whole, np.ones(mi.size, dtype=np.int64), src
                ) & _bernoulli_exp_arrays(frac, np.full(mi.size, den, dtype=np.int64), src)
            fast[:] = True
        else:
            fast = np.zeros_like(accept)
        slow = np.flatnonzero(~fast)  # exact Python-integer path (object arrays)
        if slow.size:
            big = (b * ay[slow].astype(object) - a) ** 2
            accept[slow] = _bernoulli_exp_big(big, den, slow.size, src)
        out[todo[accept]] = y[accept]
        todo = todo[~accept]
    return out


def _default_t(sigma2: Fraction) -> int:
    """floor(sigma) + 1, computed exactly: floor(sqrt(x)) = isqrt(floor(x))."""
    return math.isqrt(sigma2.numerator // sigma2.denominator) + 1


def discrete_gaussian(
    sigma_squared: Any, size: Size | None = None, rng: Any = None
) -> NDArray[np.int64]:
    """Exact draws from the discrete Gaussian N_Z(0, sigma**2) (CKS 2020, Alg. 3).

    ``P[X = x] = exp(-x**2 / (2 sigma**2)) / sum_{y in Z} exp(-y**2 / (2 sigma**2))`` for every
    integer ``x``. ``sigma_squared`` is a positive rational (int, Fraction or float, taken
    exactly) whose numerator and denominator are below ``2**56``; note the parameter is the
    *variance parameter* sigma**2; the actual variance is slightly below it (CKS 2020 show this).
    Adding it to an integer query of sensitivity ``Delta`` gives
    ``Delta**2 / (2 sigma**2)``-zCDP (CKS Thm. 4).

    >>> import numpy as np
    >>> discrete_gaussian(2.25, size=3, rng=np.random.default_rng(0)).dtype
    dtype('int64')
    """
    frac = as_fraction("sigma_squared", sigma_squared)
    _check_terms("sigma_squared", sigma_squared, frac)
    shape = _shape(size)
    src = get_source(rng)
    return noise_gaussian_frac(frac, _default_t(frac), math.prod(shape), src).reshape(shape)


# ---------------------------------------------------------------- constant work per release
#: Draws made ahead per parameter set (``POOL_SIZE``) and parameter sets kept (``POOL_KEYS``).
POOL_SIZE = 4096
POOL_KEYS = 64


class _Pools:
    """Exact draws made ahead in batches, so a release's time does not follow its noise.

    The exact samplers above loop longer for larger ``|noise|`` (the proposal and the
    geometric part of CKS Alg. 2/3 are rejection loops: Jin et al. 2022 time this channel).
    Releases of any size from the secure source are served from a pool of i.i.d. exact draws
    per parameter set: serving is a copy (the same work for every value), and the pool is
    refilled *after* serving (``max(POOL_SIZE, n)`` fresh draws whenever fewer than three
    times that remain), so the work a release does draws noise for later releases, never its
    own (only a cold pool, or a request larger than every earlier one, draws before serving).
    After each refill the whole pool is put in a uniformly random order, so a later release
    takes a random mix of draws from several refills and the position of a draw says nothing
    about how long its rejection loop ran. What remains: a refill's time (a total over many
    draws) is weakly correlated with the noise of the releases that follow it. Every value is
    used once; the pools are discarded in a forked child (a child must not release its
    parent's noise) and guarded by a lock. Seeded generators draw directly (reproducible).
    """

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._pools: dict[tuple[Any, ...], NDArray[np.int64]] = {}

    def reset(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._pools = {}

    def take(self, key: tuple[Any, ...], n: int, draw: Any) -> NDArray[np.int64]:
        want = max(POOL_SIZE, n)
        with self._lock:
            pool = self._pools.pop(key, np.zeros(0, dtype=np.int64))
            if pool.size < n:  # cold, or larger than any earlier request
                pool = self._mix(pool, draw, max(want, 4 * n - pool.size))
            out = pool[:n].copy()
            pool = pool[n:]
            if pool.size < 3 * want:  # ahead of later releases: drawn now, released later
                pool = self._mix(pool, draw, want)
            self._pools[key] = pool
            while len(self._pools) > POOL_KEYS:  # forget the least recently used
                self._pools.pop(next(iter(self._pools)))
        return out

    def _mix(self, pool: NDArray[np.int64], draw: Any, m: int) -> NDArray[np.int64]:
        """``m`` fresh draws added to ``pool``, the whole pool put in a uniformly random order:
        a later release takes a random mix of fresh and older draws, so the time of the refill
        (one total over ``m`` draws) is diluted over several releases."""
        from renyi.random import _SECURE

        both = np.concatenate([pool, np.asarray(draw(m), dtype=np.int64)])
        keys = _SECURE.words(both.size)  # ties: probability below size^2 2^-65
        return both[np.argsort(keys, kind="stable")]


_POOLS = _Pools()
if hasattr(os, "register_at_fork"):  # pragma: no branch
    os.register_at_fork(after_in_child=_POOLS.reset)


def _pooled(src: RandomSource, n: int) -> bool:
    from renyi.random import _SECURE

    return src is _SECURE and n > 0


def noise_laplace_int(t: int, s: int, n: int, src: RandomSource) -> NDArray[np.int64]:
    """``n`` exact discrete Laplace(t/s) draws for a release: constant work per release
    (served from :class:`_Pools` for the secure source), else :func:`_discrete_laplace_int`."""
    if _pooled(src, n):
        return _POOLS.take(("laplace", t, s), n, lambda m: _discrete_laplace_int(t, s, m, src))
    return _discrete_laplace_int(t, s, n, src)


def noise_gaussian_frac(sigma2: Fraction, t: int, n: int, src: RandomSource) -> NDArray[np.int64]:
    """``n`` exact discrete Gaussian draws for a release (see :func:`noise_laplace_int`)."""
    if _pooled(src, n):
        return _POOLS.take(
            ("gaussian", sigma2, t), n, lambda m: _discrete_gaussian_frac(sigma2, t, m, src)
        )
    return _discrete_gaussian_frac(sigma2, t, n, src)


# ---------------------------------------------------------------- exact log-pmfs (floats)
def discrete_laplace_logpmf(x: ArrayLike, scale: float) -> NDArray[np.float64]:
    """log P[X = x] of the discrete Laplace with ``scale`` (closed-form normaliser)."""
    s = float(as_fraction("scale", scale))
    xs = np.abs(np.asarray(x, dtype=np.float64))
    log_norm = np.log(-np.expm1(-1.0 / s)) - np.log1p(np.exp(-1.0 / s))
    return np.asarray(-xs / s + log_norm, dtype=np.float64)


def discrete_gaussian_log_normaliser(sigma_squared: float) -> float:
    """log sum_{y in Z} exp(-y**2 / (2 sigma**2)).

    Direct sum for sigma**2 < 1; for sigma**2 >= 1 the Poisson-summation (Jacobi theta)
    identity sum_y e^{-y^2/(2 s^2)} = s sqrt(2 pi) sum_k e^{-2 pi^2 s^2 k^2}, whose dual series
    converges after a handful of terms.
    """
    s2 = float(as_fraction("sigma_squared", sigma_squared))
    if s2 < 1.0:
        y = np.arange(-60, 61, dtype=np.float64)
        return float(logsumexp(-(y**2) / (2 * s2)))
    k = np.arange(1, 6, dtype=np.float64)
    dual = float(np.sum(np.exp(-2 * math.pi**2 * s2 * k**2)))
    return 0.5 * math.log(2 * math.pi * s2) + math.log1p(2 * dual)


def discrete_gaussian_logpmf(x: ArrayLike, sigma_squared: float) -> NDArray[np.float64]:
    """log P[X = x] of the discrete Gaussian N_Z(0, sigma**2)."""
    s2 = float(as_fraction("sigma_squared", sigma_squared))
    xs = np.asarray(x, dtype=np.float64)
    return np.asarray(-(xs**2) / (2 * s2) - discrete_gaussian_log_normaliser(s2), np.float64)
