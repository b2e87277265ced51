"""Randomness for every noise-drawing function of renyi: secure by default.

All samplers draw their bits through one small interface, :class:`RandomSource`, with two
implementations:

* :class:`SecureSource` (the default, used whenever ``rng=None``): 64-bit words from a
  cryptographically secure generator keyed by the operating system's entropy
  (:func:`secure_random_bytes`: ``os.urandom``, i.e. ``getrandom(2)`` on Linux, expanded by
  the ChaCha20 keystream for large requests). Nobody can predict or replay its output, which
  is what the privacy proofs assume of the noise.
* :class:`GeneratorSource`: wraps a seeded :class:`numpy.random.Generator` so experiments and
  tests are reproducible. Its output is *predictable from the seed* and therefore offers no
  privacy against anyone who knows or can guess the seed; every object that uses one emits
  :class:`~renyi.errors.InsecureRandomnessWarning` (not once per process).

Every derived quantity is exact: uniform integers in ``[0, n)`` come from rejection sampling
on 64-bit words (no modulo bias), Bernoulli(num/den) draws compare such an integer with
``num``, and uniform floats are multiples of 2**-53 built from 53 random bits. Standard
normal floats (:meth:`RandomSource.normal`) are the Box–Muller transform (:func:`box_muller`)
of such uniforms: the one place floating-point Gaussian noise is generated. The PyTorch
adapters of :mod:`renyi.dpsgd.sampler` draw through the same two functions.

Example
-------
>>> import numpy as np
>>> from renyi.random import get_source
>>> src = get_source(None)                  # the OS CSPRNG
>>> bool((src.integers_below(np.array([6, 6, 6])) < 6).all())
True
"""

from __future__ import annotations

import math
import numbers
import os
import threading
import warnings
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_int, fail
from renyi.errors import InsecureRandomnessWarning

__all__ = [
    "GeneratorSource",
    "RandomSource",
    "SecureSource",
    "box_muller",
    "get_source",
    "is_trusted_source",
    "secure_random_bytes",
]

_U64 = np.uint64
_MAX_BOUND = 2**63  # bounds of integers_below must be in [1, 2**63]
_CHACHA_MIN_BYTES = 1 << 16  # requests this large use the ChaCha20 keystream
_NORMAL_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))


def _secure_buffer(n: int) -> bytearray:
    """``n`` CSPRNG bytes in a fresh, writable buffer (see :func:`secure_random_bytes`)."""
    if n < _CHACHA_MIN_BYTES:
        return bytearray(os.urandom(n))
    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
    except ImportError:  # pragma: no cover - cryptography is optional
        return bytearray(os.urandom(n))
    # The 16-byte "nonce" of the cryptography API is the RFC 8439 block: a 32-bit block
    # counter (from 0) followed by the 96-bit nonce.
    nonce = bytes(4) + os.urandom(12)
    buf = bytearray(n)  # zeros: encrypting them in place leaves the keystream
    Cipher(algorithms.ChaCha20(os.urandom(32), nonce), mode=None).encryptor().update_into(buf, buf)
    return buf


def secure_random_bytes(n: int) -> bytes:
    """``n`` bytes from a CSPRNG keyed by OS entropy: ``os.urandom``, expanded by ChaCha20.

    Below 64 KiB, or without the ``cryptography`` package: ``os.urandom`` (the kernel's
    CSPRNG, itself ChaCha20-based on Linux). From 64 KiB up, when ``cryptography`` is
    installed: the ChaCha20 keystream (RFC 8439 layout: 32-bit block counter from 0, 96-bit
    nonce) under a fresh 256-bit key and nonce read from ``os.urandom`` for this call alone
    (at most 256 GiB per call). Keys are never stored or reused, so there is no state to leak,
    to replay, or to share with a forked child: the output is as unpredictable as the OS
    entropy under the standard assumption that ChaCha20 is a pseudorandom function. It is a
    few times faster than reading megabytes from the kernel.

    Example:
        >>> len(secure_random_bytes(16)), len(secure_random_bytes(1 << 17))
        (16, 131072)
    """
    n = check_int("n", n)
    return bytes(_secure_buffer(n))


def box_muller(u1: Any, u2: Any, xp: Any = np) -> Any:
    """The Box–Muller transform (Box & Muller 1958): pairs of uniforms to standard normals.

    Returns ``sqrt(-2 ln u1) cos(2 pi u2)`` followed by ``sqrt(-2 ln u1) sin(2 pi u2)`` (both
    branches, concatenated), for equally long 1-D arrays ``u1`` in ``(0, 1)`` (so ``ln u1`` is
    finite) and ``u2`` in ``[0, 1)``. The radius is computed in ``u1``'s precision (float64
    for the tails) and rounded to the dtype of the angle ``2 pi u2``, which sets the output
    dtype. ``xp`` is the array namespace of the inputs: ``numpy`` (the default) or ``torch``;
    the same operations run in both. The uniforms come from
    :meth:`RandomSource.box_muller_uniforms`. :meth:`RandomSource.normal` evaluates this
    transform in place on its fresh uniforms (the same operations, bit for bit).

    Example:
        >>> box_muller(np.array([np.exp(-0.5)]), np.array([0.0]))
        array([1., 0.])
    """
    theta = (2.0 * math.pi) * u2
    r = xp.asarray(xp.sqrt(-2.0 * xp.log(u1)), dtype=theta.dtype)
    return xp.concatenate([r * xp.cos(theta), r * xp.sin(theta)])


def _open_unit(words: NDArray[np.uint64]) -> NDArray[np.float64]:
    """``(k + 1/2) 2**-53`` for the top 53 bits ``k`` of each word: uniform strictly inside
    ``(0, 1)``. In place on the fresh float array: the same roundings as
    ``((k + 0.5) * 2**-53)``, no temporaries."""
    u = (words >> _U64(11)).astype(np.float64)
    u += 0.5
    u *= 2.0**-53
    return u


def _box_muller_in_place(u1: NDArray[np.float64], u2: NDArray[Any]) -> NDArray[Any]:
    """:func:`box_muller` (numpy), bit for bit, overwriting its fresh inputs.

    The same operations in the same order and precision, without temporaries or the final
    concatenation (the two branches are written into the two halves of the output); about 3
    times faster than :func:`box_muller` for the 10^5-10^6 draws of a DP-SGD step.
    """
    theta = np.multiply(u2, 2.0 * math.pi, out=u2)
    r = np.log(u1, out=u1)
    r *= -2.0
    np.sqrt(r, out=r)
    radius = r.astype(theta.dtype, copy=False)
    half = theta.shape[0]
    out = np.empty(2 * half, dtype=theta.dtype)
    np.multiply(np.cos(theta, out=out[:half]), radius, out=out[:half])
    np.multiply(np.sin(theta, out=out[half:]), radius, out=out[half:])
    return out


class RandomSource(ABC):
    """A source of uniformly random 64-bit words and the exact draws built on them.

    Subclasses implement :meth:`words`; everything else is derived here, exactly.
    ``secure`` tells whether the words are unpredictable (a CSPRNG).
    """

    secure: bool = False

    @abstractmethod
    def words(self, n: int) -> NDArray[np.uint64]:
        """``n`` independent uniform 64-bit words."""

    def integers_below(self, bound: ArrayLike) -> NDArray[np.int64]:
        """One exact uniform integer in ``[0, b)`` for each entry ``b`` of ``bound``.

        ``bound`` holds integers in ``[1, 2**63]``; the result has its shape (int64).
        Entries with ``b = 1`` consume no randomness. Bounds up to ``2**32`` use 32-bit draws
        and Lemire's multiply-shift with rejection; larger bounds use 64-bit words accepted
        when ``w < 2**64 - (2**64 mod b)``. Both are exactly uniform; rejected entries are
        redrawn (one round per pass, each round rejects with probability < 1/2).
        """
        b = np.asarray(bound)
        if b.dtype == np.bool_ or not np.issubdtype(b.dtype, np.integer):
            raise fail("bound", bound, "integers in [1, 2**63]")
        if b.size and (int(b.min()) < 1 or int(b.max()) > _MAX_BOUND):
            raise fail("bound", bound, "integers in [1, 2**63]")
        return self._integers_below(b)

    def _integers_below(self, b: NDArray[Any]) -> NDArray[np.int64]:
        """:meth:`integers_below` without the argument checks (bounds already valid)."""
        shape = b.shape
        b = b.astype(_U64).ravel()
        out = np.zeros(b.size, dtype=_U64)
        todo = np.flatnonzero(b > 1)
        small = b[todo] <= _U64(2**32)
        self._below_32(b, out, todo[small])
        self._below_64(b, out, todo[~small])
        return out.astype(np.int64).reshape(shape)

    def _below_32(self, b: NDArray[np.uint64], out: NDArray[np.uint64], todo: NDArray[Any]) -> None:
        """Lemire (2019): m = w * b for a 32-bit w; accept unless (m mod 2**32) < 2**32 mod b."""
        mask = _U64(0xFFFFFFFF)
        while todo.size:
            w = self.words((todo.size + 1) // 2).view(np.uint32)[: todo.size].astype(_U64)
            bb = b[todo]
            m = w * bb
            low = m & mask
            ok = low >= bb  # (2**32 mod b) < b, so these are accepted without a modulo
            unsure = np.flatnonzero(~ok)
            if unsure.size:
                bu = bb[unsure]
                ok[unsure] = low[unsure] >= (_U64(2**32) - bu) % bu
            out[todo[ok]] = m[ok] >> _U64(32)
            todo = todo[~ok]

    def _below_64(self, b: NDArray[np.uint64], out: NDArray[np.uint64], todo: NDArray[Any]) -> None:
        """Accept a 64-bit word w when w < 2**64 - (2**64 mod b); return w mod b."""
        while todo.size:
            w = self.words(todo.size)
            bb = b[todo]
            with np.errstate(over="ignore"):
                limit = _U64(0) - (_U64(0) - bb) % bb  # 0 stands for 2**64
            ok = (limit == 0) | (w < limit)
            out[todo[ok]] = w[ok] % bb[ok]
            todo = todo[~ok]

    def bernoulli(self, num: ArrayLike, den: ArrayLike) -> NDArray[np.bool_]:
        """Exact Bernoulli(num/den) draws for integers ``0 <= num <= den``, ``1 <= den <= 2**63``.

        Broadcasts ``num`` against ``den``; ``True`` with probability exactly ``num / den``.
        """
        n, d = np.asarray(num), np.asarray(den)
        if n.shape != d.shape:
            n, d = np.broadcast_arrays(n, d)
        shape = n.shape
        n, d = n.ravel(), d.ravel()
        if n.dtype.kind not in "iu" or d.dtype.kind not in "iu":
            raise fail("num/den", (num, den), "integers with 0 <= num <= den, 1 <= den <= 2**63")
        if n.size and (int(n.min()) < 0 or int(d.min()) < 1):
            raise fail("num/den", (num, den), "integers with 0 <= num <= den, 1 <= den <= 2**63")
        out = n >= d  # certain outcomes (num = den, or num = 0) consume no randomness
        draw = np.flatnonzero((n > 0) & ~out)
        if draw.size:
            if int(d[draw].max()) > _MAX_BOUND:
                raise fail("den", den, "integers in [1, 2**63] with 0 <= num <= den")
            out[draw] = self._integers_below(d[draw]) < n[draw]
        return out.reshape(shape)

    def bits(self, size: int) -> NDArray[np.bool_]:
        """``size`` fair coin flips (each ``True`` with probability exactly 1/2)."""
        size = check_int("size", size)
        return (self.words(size) >> _U64(63)).astype(np.bool_)

    def uniform(self, size: int) -> NDArray[np.float64]:
        """``size`` floats uniform on the grid ``{k 2**-53 : 0 <= k < 2**53}`` of ``[0, 1)``."""
        size = check_int("size", size)
        return (self.words(size) >> _U64(11)).astype(np.float64) * 2.0**-53

    def uniform_open(self, size: int) -> NDArray[np.float64]:
        """``size`` floats uniform on ``{(k + 1/2) 2**-53}``: strictly inside ``(0, 1)``."""
        return _open_unit(self.words(check_int("size", size)))

    def box_muller_uniforms(
        self, half: int, dtype: Any = np.float64
    ) -> tuple[NDArray[np.float64], NDArray[np.floating[Any]]]:
        """The ``half`` radius and ``half`` angle uniforms of :func:`box_muller`.

        ``u1`` (radius): the first ``half`` of the draws, open 53-bit uniforms as from
        :meth:`uniform_open`. ``u2`` (angle), of ``dtype``: for float64, the next ``half``
        open 53-bit uniforms (so float64 draws read ``2 half`` words, exactly
        :meth:`uniform_open` of ``2 half``); for float32, 24-bit uniforms ``k 2**-24`` in
        float32, the top 24 bits of each 32-bit half of ``ceil(half / 2)`` further words (all
        the angle precision float32 holds; 3/4 of the words float64 needs).
        """
        half = check_int("half", half)
        try:
            dt = np.dtype(dtype) if dtype is not None else None
        except TypeError:
            dt = None
        if dt is None or dt not in _NORMAL_DTYPES:
            raise fail("dtype", dtype, "numpy.float64 or numpy.float32")
        if dt == np.float64:
            u = self.uniform_open(2 * half)
            return u[:half], u[half:]
        w = self.words(half + (half + 1) // 2)
        u1 = _open_unit(w[:half])
        k = np.ascontiguousarray(w[half:]).view(np.uint32)[:half] >> np.uint32(8)
        u2 = k.astype(np.float32)
        u2 *= np.float32(2.0**-24)
        return u1, u2

    def normal(self, size: int | tuple[int, ...], dtype: Any = np.float64) -> NDArray[Any]:
        """Standard normal draws of shape ``size`` (an int or a tuple of ints).

        Transform (Box & Muller 1958, :func:`box_muller`): with ``m = ceil(n / 2)`` for ``n``
        draws, ``m`` pairs of uniforms from :meth:`box_muller_uniforms`; for float64 (the
        default) these are ``2 m`` open uniforms from :meth:`uniform_open` split into ``u1``
        (the first ``m``) and ``u2`` (the last ``m``); the output is the cosine branch
        ``sqrt(-2 ln u1) cos(2 pi u2)`` followed by the sine branch
        ``sqrt(-2 ln u1) sin(2 pi u2)``, truncated to ``n`` and reshaped. The tails reach
        ``sqrt(108 ln 2)`` (about 8.65), beyond which N(0, 1) has mass below ``1e-17``.
        ``dtype=numpy.float32`` keeps the float64 radius (so the same tails) and draws the
        angle on a 2**-24 grid in float32 (faster, for float32 consumers such as DP-SGD).
        The output depends only on the source's words, so two holders of one keyed stream
        (e.g. :class:`~renyi.federated.channels.ChaCha20Source`) draw the same normals.

        Like every floating-point Gaussian sampler this is exposed to the floating-point
        attacks on low-order bits (Mironov 2012); the mechanisms of :mod:`renyi.mechanisms`
        therefore use the exact discrete samplers instead. The randomness itself is as
        secure as the source (:class:`SecureSource` for ``rng=None``).

        Example:
            >>> z = get_source(None).normal((2, 3))
            >>> z.shape, z.dtype
            ((2, 3), dtype('float64'))
        """
        if isinstance(size, numbers.Integral) and not isinstance(size, bool | np.bool_):
            shape: tuple[int, ...] = (check_int("size", size),)
        else:
            try:
                shape = tuple(check_int("size", n) for n in size)  # type: ignore[union-attr]
            except TypeError:
                raise fail("size", size, "an integer >= 0 or a tuple of them") from None
        n = int(np.prod(shape, dtype=np.int64))
        u1, u2 = self.box_muller_uniforms((n + 1) // 2, dtype)
        if type(self).box_muller_uniforms is RandomSource.box_muller_uniforms:
            z = _box_muller_in_place(u1, u2)  # fresh arrays of ours: overwrite them
        else:
            z = box_muller(u1, u2)
        return z[:n].reshape(shape)

    def big_integer_below(self, bound: int) -> int:
        """One exact uniform Python integer in ``[0, bound)`` for any ``bound >= 1``.

        Used by the samplers' fallback path for numbers that do not fit in 64 bits.
        """
        bound = check_int("bound", bound, minimum=1)
        nbits = (bound - 1).bit_length()
        nwords = max(1, (nbits + 63) // 64)
        while True:
            w = self.words(nwords)
            x = 0
            for word in w.tolist():
                x = (x << 64) | int(word)
            x >>= 64 * nwords - nbits  # keep exactly nbits random bits
            if x < bound:
                return x


class SecureSource(RandomSource):
    """Words from a CSPRNG keyed by the operating system's entropy, drawn in bulk.

    This is the default for every function taking ``rng=None``. Small requests are served
    from a pool of at most 64 KiB of ``os.urandom`` output, refilled as needed; each byte is
    handed out once. The pool is guarded by a lock and is discarded in a forked child (a
    child must never reuse its parent's bytes). Requests of 64 KiB or more bypass the pool
    and come from :func:`secure_random_bytes` (a ChaCha20 keystream under a fresh
    ``os.urandom`` key per request, which keeps no state and so is fork-safe as it is).
    """

    secure = True
    _POOL_BYTES = 1 << 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._pos = 0
        self._pid = os.getpid()

    def _discard_pool(self) -> None:
        self._pool = b""
        self._pos = 0
        self._pid = os.getpid()

    def words(self, n: int) -> NDArray[np.uint64]:
        n = check_int("n", n)
        need = 8 * n
        if need >= self._POOL_BYTES:
            return np.frombuffer(_secure_buffer(need), dtype=_U64)
        with self._lock:
            if self._pid != os.getpid():
                self._discard_pool()
            if len(self._pool) - self._pos < need:
                self._pool = os.urandom(self._POOL_BYTES)
                self._pos = 0
            chunk = self._pool[self._pos : self._pos + need]
            self._pos += need
        return np.frombuffer(chunk, dtype=_U64).copy()

    def __repr__(self) -> str:
        return "SecureSource(os.urandom + ChaCha20)"


class GeneratorSource(RandomSource):
    """Words from a (seeded) :class:`numpy.random.Generator`: reproducible, NOT secure.

    Anyone who knows the seed can recompute the noise and remove it. Use for experiments,
    tests and debugging only; an :class:`InsecureRandomnessWarning` says so for every
    object that uses one.
    """

    secure = False

    def __init__(self, generator: np.random.Generator) -> None:
        if not isinstance(generator, np.random.Generator):
            raise fail("rng", generator, "None or a numpy.random.Generator")
        self.generator = generator

    def words(self, n: int) -> NDArray[np.uint64]:
        n = check_int("n", n)
        return self.generator.integers(0, 2**64, size=n, dtype=_U64)

    def __repr__(self) -> str:
        return f"GeneratorSource({self.generator!r})"


_SECURE = SecureSource()


def _after_fork_in_child() -> None:
    """Reset the shared source in a forked child: a new lock (the parent's may have been held
    by another thread at the moment of the fork, and that thread does not exist in the
    child, so the inherited lock would never be released) and no pool (the parent's bytes
    must never be reused)."""
    _SECURE._lock = threading.Lock()
    _SECURE._discard_pool()


if hasattr(os, "register_at_fork"):  # pragma: no branch
    os.register_at_fork(after_in_child=_after_fork_in_child)

_insecure_serial = 0
_serial_lock = threading.Lock()
#: renyi's own RandomSource classes, trusted by exact type (see is_trusted_source)
_TRUSTED_TYPES: set[type] = {SecureSource, GeneratorSource}
_TRUSTED_NAMES = {("renyi.federated.channels", "ChaCha20Source")}


def is_trusted_source(source: Any) -> bool:
    """Whether ``source`` is an instance of one of renyi's own :class:`RandomSource` classes
    (exact type: a subclass that overrides ``words`` or claims ``secure = True`` is not)."""
    cls = type(source)
    return cls in _TRUSTED_TYPES or (cls.__module__, cls.__qualname__) in _TRUSTED_NAMES


def _warn_insecure(
    generator: str = "a seeded numpy Generator",
    remedy: str = "pass rng=None for the secure OS source",
    stacklevel: int = 3,
) -> None:
    """Emit :class:`InsecureRandomnessWarning` for one object that uses predictable noise.

    Called for every such object (each seeded ``GeneratorSource``, each
    :class:`renyi.dpsgd.sampler.SeededRandomSource`, each caller-supplied source), never
    only once per process: each message carries a serial number, so Python's
    once-per-location registry cannot swallow a later one because an earlier one was shown
    or filtered.
    """
    global _insecure_serial
    with _serial_lock:
        _insecure_serial += 1
        serial = _insecure_serial
    warnings.warn(
        f"noise is drawn from {generator}: reproducible but predictable, so the output is "
        f"NOT differentially private against anyone who can learn the seed; {remedy} "
        f"[insecure source #{serial}]",
        InsecureRandomnessWarning,
        stacklevel=stacklevel,
    )


# Former name (the warning was once per process); now every call warns.
_warn_insecure_once = _warn_insecure


def _reset_insecure_warning() -> None:
    """Nothing to forget any more (kept for callers of the former once-per-process flag)."""


def get_source(rng: Any = None) -> RandomSource:
    """The :class:`RandomSource` behind an ``rng`` argument.

    ``None`` gives the secure OS source; a :class:`numpy.random.Generator` is wrapped in a
    :class:`GeneratorSource` and warns (:class:`~renyi.errors.InsecureRandomnessWarning`,
    every call: each wrapped generator is a new object using predictable noise); a
    :class:`RandomSource` is returned as is, with the same warning if it is not secure or
    not one of renyi's own classes (:func:`is_trusted_source`). Anything else (an int seed,
    the legacy ``RandomState``, ...) is refused.
    """
    if rng is None:
        return _SECURE
    if isinstance(rng, RandomSource):
        if not is_trusted_source(rng):
            _warn_insecure(
                f"a caller-supplied {type(rng).__name__}",
                "renyi cannot vouch for its randomness; pass rng=None for the secure OS source",
            )
        elif not rng.secure:
            _warn_insecure()
        return rng
    if isinstance(rng, np.random.Generator):
        _warn_insecure()
        return GeneratorSource(rng)
    raise fail("rng", rng, "None (secure OS entropy) or a numpy.random.Generator")
