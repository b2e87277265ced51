"""The one noise primitive of renyi: Gaussian and Laplace releases on a fixed lattice, exact.

Every continuous-valued release of the package (DP-SGD's noisy gradient, the federated
means, DP-FedAvg, GOPA's independent noise) goes through this module:

* ``gaussian(value, sigma, *, rng=None, allow_predictable_noise=False)``
* ``laplace(value, scale, *, rng=None, allow_predictable_noise=False)``
* ``CounterNoise(key).gaussian(value, sigma, stream=, step=, offset=)``: the same release with
  noise that is a function of a secret key and a counter (regenerable, distributable).

``value`` is a Python float, a numpy array (any real dtype) or a torch tensor (CPU or CUDA,
any floating dtype); the result has the same kind, shape, dtype and device.

Construction (``docs/noise.md``): with ``g = lattice_step(sigma)`` (a power of two, ``s =
sigma / g`` in ``[8, 16)``) the release is ``g K`` with ``K = round(value / g + s Z)`` for a
standard normal (Laplace) ``Z`` defined *exactly* by random bits (Box-Muller of uniforms with
as many bits as needed). ``K`` is computed exactly: a float32 pass with a proven error bound
decides almost every value, and the rare ones near a rounding boundary are recomputed from
more random bits in interval arithmetic. So the release is a post-processing of the textbook
Gaussian (Laplace) mechanism and **every guarantee of the continuous mechanism holds**, up to
a tail of probability below 2**-10000 per value (:data:`TAIL_MASS`, 0 in floating point),
counted in delta by :func:`implementation_slack` and added by every accountant
(:func:`accounting_slack`).

Outputs are canonical: the bytes are ``sat(fl(g K)) + 0``, the correctly rounded ``g K`` in the
output dtype, saturated at the dtype's largest finite value (so float32 ``3e38`` releases
``3.4028235e38``, never ``inf``), never ``-0.0``, never NaN: a function of ``K``, ``sigma`` and the
dtype alone. Every finite value is released; NaN/inf inputs (and non-finite caller noise in
:func:`snap`) are refused before any draw.

Randomness: ``rng=None`` is a fresh 256-bit key from the OS per call (ChaCha20 keystream).
Reproducible runs pass a seeded ``numpy.random.Generator`` or one of renyi's seeded sources;
every such use warns (:class:`~renyi.errors.InsecureRandomnessWarning`). Any other object is
refused unless ``allow_predictable_noise=True`` says the caller accepts noise that renyi cannot
vouch for (it then warns too).

Example
-------
>>> import numpy as np
>>> from renyi import noise
>>> y = noise.gaussian(np.array([0.0, 1.0, 2.5]), 1.0)
>>> g = noise.lattice_step(1.0)
>>> g, bool(np.all(y / g == np.round(y / g)))
(0.125, True)
>>> cn = noise.CounterNoise(bytes(32))          # a fixed key: for the example only
>>> a = cn.gaussian(np.zeros(4), 1.0, stream=0, step=7)
>>> b = cn.gaussian(np.zeros(2), 1.0, stream=0, step=7, offset=2)
>>> bool(np.array_equal(a[2:], b))              # the same counters give the same noise
True
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray

from renyi._validation import check_int, check_nonnegative, fail
from renyi.noise import _chacha, _combination, _exact, _fused, _kernel
from renyi.noise._combination import CombinationRow
from renyi.random import (
    RandomSource,
    _warn_insecure,
    get_source,
    is_trusted_source,
)

__all__ = [
    "GRID_BITS",
    "LIBM_ULPS",
    "MAX_ACCOUNTED_VALUES",
    "ROUNDING_SLACK",
    "TAIL_MASS",
    "CombinationRow",
    "CounterNoise",
    "accounting_slack",
    "gaussian",
    "gaussian_integers",
    "gaussian_noise",
    "implementation_slack",
    "laplace",
    "lattice_step",
    "resolve_source",
    "snap",
    "standard_normal",
]

#: ``sigma / g`` is in ``[2**GRID_BITS, 2**(GRID_BITS + 1))``: the rounding to the lattice adds
#: at most ``g**2 / 12 <= sigma**2 / 768`` of variance (0.07 % of the standard deviation).
GRID_BITS = 3
#: Probability per released value that its index is not the ideal one: the uniforms' bits run
#: out (after ``_exact.MAX_LEVELS`` levels, 32,000 bits) before the value is decided. It is
#: below 2**-10000 (docs/noise.md), which is 0 in floating point.
TAIL_MASS = 0.0
#: Bound on ``|log P_impl(k) - log P_ideal(k)|`` per value: 0, the index is exact.
ROUNDING_SLACK = 0.0
#: Assumed accuracy (ulp) of float64 ``log``/``log1p``/``cos``/``sin`` in the error bound of
#: correlated-noise combinations (docs/noise.md; measured at most 4 by the tests).
LIBM_ULPS = _combination.LIBM_ULPS
#: The number of released values that :func:`accounting_slack` covers for one accountant.
MAX_ACCOUNTED_VALUES = 2**64

_USE_FUSED = True  # the compiled pass when numba is installed (tests compare both)
_SMALL = 1 << 12  # releases up to this size run numpy's kernels (less per-call overhead)
_CHUNK_UNITS = 1 << 15  # units of random bits per float32 pass on the CPU (fits in L2)
_DEVICE_CHUNK_UNITS = 1 << 22
_FUSED_CHUNK_UNITS = 1 << 15  # pairs per keystream call of the compiled pass (in L2)
_GAUSS_DOMAIN, _LAPLACE_DOMAIN = 0, 64  # nonce domains; extension level l adds l
_UNIT_BYTES = {"gaussian": 8, "laplace": 4}
_UNIT_VALUES = {"gaussian": 2, "laplace": 1}
_MAX_STREAM = 1 << 24
_MAX_VALUES = 1 << 36  # per (stream, step): 2**32 ChaCha20 blocks of 64 bytes
_MAX_LAPLACE = 1 << 35  # Laplace: 8 extension bytes per value, so 2**35 values fill 2**32 blocks
_MAX_SIZE = (1 << 63) - 1  # numpy's largest array (intp)


def lattice_step(scale: float) -> float:
    """The lattice step ``g`` for noise scale ``scale``: the largest power of two
    ``<= scale * 2**-GRID_BITS`` (at least ``2**-970``, so the multiples stay normal floats).
    ``scale = 0`` (no noise, no privacy: the value itself is returned) gives ``2**-970``.

    >>> lattice_step(1.0), lattice_step(0.3), lattice_step(1000.0)
    (0.125, 0.03125, 64.0)
    """
    return _step(_check_scale("scale", scale))


def _step(s: float) -> float:
    """:func:`lattice_step` of a checked scale (a finite float >= 0)."""
    if s == 0.0:
        return 2.0**-970
    _, e = math.frexp(s)  # s = m 2**e, m in [1/2, 1)
    return math.ldexp(1.0, max(e - 1 - GRID_BITS, -970))


def implementation_slack(n_values: int, epsilon: float = 1.0) -> tuple[float, float]:
    """``(epsilon_slack, delta_slack)`` of releasing ``n_values`` values with this module.

    The index of each value is the ideal one except with probability at most ``TAIL_MASS``
    (its random bits ran out before it was decided), so the implementation is within total
    variation ``n TAIL_MASS`` of the ideal mechanism, whose guarantee is the continuous
    mechanism's: an ideal ``(epsilon, delta)`` becomes ``(epsilon, delta + n TAIL_MASS (1 +
    e^epsilon))``. No epsilon slack: the index is exact (docs/noise.md).

    >>> e, d = implementation_slack(10**14)
    >>> e, d < 1e-20
    (0.0, True)
    """
    n = check_int("n_values", n_values, 0)
    eps = _real("epsilon", epsilon)
    nf = float(n) if n.bit_length() <= 1023 else math.inf  # any int: no OverflowError
    eps_slack = ROUNDING_SLACK * nf if ROUNDING_SLACK else 0.0
    delta_slack = nf * TAIL_MASS * (1.0 + math.exp(min(eps, 700.0))) if TAIL_MASS else 0.0
    return eps_slack, delta_slack


def accounting_slack(epsilon: float = 1.0) -> tuple[float, float]:
    """The slack every accountant adds to the ε and δ it reports:
    :func:`implementation_slack` of :data:`MAX_ACCOUNTED_VALUES` (2**64) released values.

    >>> accounting_slack(1.0)[1] < 1e-18
    True
    """
    return implementation_slack(MAX_ACCOUNTED_VALUES, epsilon)


# ------------------------------------------------------------------------- randomness
def _torch_source_words(rng: Any) -> Any:
    """A words(n) callable for renyi's own torch sources, else None (exact type checks)."""
    mod = sys.modules.get("renyi.dpsgd.sampler")
    if mod is None:
        return None
    if type(rng) is mod.SecureRandomSource:
        src = rng.source
        if not is_trusted_source(src) or not src.secure:
            raise fail("random_source", rng, "a SecureRandomSource backed by renyi's OS source")
        return src.words
    if type(rng) is mod.SeededRandomSource:
        return rng.words
    return None


def resolve_source(rng: Any = None, *, allow_predictable_noise: bool = False) -> Any:
    """``words(n)``, the 64-bit word supply for ``rng``; refuses sources renyi cannot vouch for.

    ``None``: the secure OS source. A ``numpy.random.Generator``: reproducible, warns. One of
    renyi's sources (:class:`renyi.random.SecureSource`, ``GeneratorSource``, the DP-SGD
    torch sources, the keyed ``ChaCha20Source``): accepted by exact type, so a subclass that
    merely claims ``secure = True`` (or returns zeros) is not. Anything else is refused with
    :class:`~renyi.errors.PrivacyParameterError`, unless ``allow_predictable_noise=True``: the
    caller then takes responsibility for its randomness, and a warning says so.
    """
    words = _torch_source_words(rng)
    if words is not None:
        return words
    if rng is None or isinstance(rng, np.random.Generator):
        return get_source(rng).words
    if isinstance(rng, RandomSource) and is_trusted_source(rng):
        if not rng.secure:
            _warn_insecure(f"a seeded {type(rng).__name__}")
        return rng.words
    if allow_predictable_noise and callable(getattr(rng, "words", None)):
        _warn_insecure(
            f"a caller-supplied {type(rng).__name__} (allow_predictable_noise=True)",
            "renyi cannot vouch for its randomness; pass rng=None for the secure OS source",
        )
        return rng.words
    raise fail(
        "rng",
        rng,
        "None (the secure OS source), a numpy.random.Generator (reproducible, insecure) or one "
        "of renyi's random sources; other objects need allow_predictable_noise=True",
    )


# ------------------------------------------------------------------------- random bits
_ZEROS = bytes(0)
_SCRATCH = threading.local()  # per-thread keystream buffers of the compiled pass


_ZEROS_MAX = 1 << 20  # the shared plaintext stays small; larger requests go in pieces


def _zeros(n: int) -> memoryview:
    """``n <= _ZEROS_MAX`` zero bytes (the plaintext whose encryption is the keystream),
    shared, read-only."""
    global _ZEROS
    z = _ZEROS
    if len(z) < n:
        z = _ZEROS = bytes(min(max(n, 2 * len(z)), _ZEROS_MAX))
    return memoryview(z)[:n]


class _CounterBits:
    """The bits of one release from the keyed ChaCha20 keystream (counter layout in
    docs/noise.md): main bits of unit ``u`` at bytes ``[B u, B (u+1))`` of domain ``d``'s
    keystream for ``(stream, step)``; the extension words of level ``l`` at bytes
    ``[8 u, 8 (u+1))`` of domain ``d + l``."""

    def __init__(self, key: bytes, kind: str, stream: int, step: int) -> None:
        self.key = key
        self.unit = _UNIT_BYTES[kind]
        self.domain = _GAUSS_DOMAIN if kind == "gaussian" else _LAPLACE_DOMAIN
        self.stream = stream
        self.step = step
        self._enc: Any = None
        self._next = -1
        self._buf = bytearray()

    def _nonce(self, level: int) -> bytes:
        return _chacha.make_nonce(self.domain + level, self.stream, self.step)

    def main_bytes(self, first: int, count: int, into: Any = None) -> Any:
        """The main bytes of units ``[first, first + count)`` (CPU, OpenSSL when available),
        written into ``into`` (a writable buffer of at least that many bytes) when given."""
        start = first * self.unit
        n = count * self.unit
        try:
            from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
        except ImportError:  # pragma: no cover - cryptography comes with torch/federated
            return self._blocks_bytes(0, start, n)
        if self._enc is None or self._next != start:
            block, skip = divmod(start, _chacha.BLOCK_BYTES)
            nonce = (block).to_bytes(4, "little") + self._nonce(0)
            self._enc = Cipher(algorithms.ChaCha20(self.key, nonce), mode=None).encryptor()
            if skip:
                self._enc.update(bytes(skip))
        if into is None:
            if len(self._buf) < n:
                self._buf = bytearray(n)
            into = self._buf
        buf = memoryview(into)[:n]
        for i in range(0, n, _ZEROS_MAX):  # one piece for a compiled-pass chunk
            m = min(_ZEROS_MAX, n - i)
            self._enc.update_into(_zeros(m), buf[i : i + m])
        self._next = start + n
        return buf  # valid until the next call: the caller copies it

    def main_bytes_at(self, first: int, count: int) -> bytes | bytearray:
        """:meth:`main_bytes` with a cipher context of its own (for worker threads)."""
        start = first * self.unit
        block, skip = divmod(start, _chacha.BLOCK_BYTES)
        return _chacha.keystream(self.key, self._nonce(0), block, skip + count * self.unit)[skip:]

    def _blocks_bytes(self, level: int, start: int, n: int) -> bytes:
        """``n`` contiguous keystream bytes of level ``level`` from byte ``start`` (OpenSSL)."""
        block, skip = divmod(start, _chacha.BLOCK_BYTES)
        return bytes(_chacha.keystream(self.key, self._nonce(level), block, skip + n)[skip:])

    def _blocks(self, level: int, blocks: Any, xp: Any) -> Any:
        nonce = np.frombuffer(self._nonce(level), dtype="<u4").astype(np.int64)
        if xp is np:
            nonces = np.broadcast_to(nonce, (len(blocks), 3))
        else:
            nonces = xp.as_tensor(nonce, device=blocks.device).expand(blocks.shape[0], 3)
        return _chacha.chacha20_blocks(self.key, nonces, blocks, xp)

    def main_device(self, first: int, count: int, torch: Any, device: Any) -> Any:
        """The main 32-bit words of units ``[first, first + count)`` as int64 on ``device``,
        computed there by the torch ChaCha20 (the GPU path)."""
        words_per_unit = self.unit // 4
        w0 = first * words_per_unit
        w1 = (first + count) * words_per_unit
        b0, b1 = w0 // 16, (w1 + 15) // 16
        blocks = torch.arange(b0, b1, dtype=torch.int64, device=device)
        words = self._blocks(0, blocks, torch).reshape(-1)
        return words[w0 - 16 * b0 : w1 - 16 * b0]

    def ext(self, level: int, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The two 32-bit extension words of level ``level`` for each unit in ``units``."""
        units = np.asarray(units, dtype=np.int64)
        blocks, inv = np.unique(units // 8, return_inverse=True)
        words = self._blocks(level, blocks, np)  # (nb, 16)
        pos = 2 * (units % 8)
        return words[inv, pos], words[inv, pos + 1]


class _SourceBits:
    """The bits of one release read in order from a word source (``words(n)``: 64-bit words):
    the main bits first, then extension words as they are needed (cached per unit and level,
    so both values of a Gaussian pair see the same bits)."""

    def __init__(self, words: Any, kind: str) -> None:
        self.words = words
        self.unit = _UNIT_BYTES[kind]
        self._cache: dict[tuple[int, int], tuple[int, int]] = {}

    def main_bytes(self, first: int, count: int) -> bytes:
        n = count * self.unit
        w = np.asarray(self.words((n + 7) // 8), dtype=np.uint64)
        return w.astype("<u8").tobytes()[:n]

    def ext(self, level: int, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        units = np.asarray(units, dtype=np.int64)
        todo = [u for u in dict.fromkeys(units.tolist()) if (level, u) not in self._cache]
        if todo:
            w = np.asarray(self.words(len(todo)), dtype=np.uint64)
            for u, word in zip(todo, w.tolist(), strict=True):
                self._cache[(level, u)] = (word & 0xFFFFFFFF, word >> 32)
        pairs = [self._cache[(level, u)] for u in units.tolist()]
        e1 = np.array([p[0] for p in pairs], dtype=np.int64)
        e2 = np.array([p[1] for p in pairs], dtype=np.int64)
        return e1, e2


# ------------------------------------------------------------------------- the release
def _fusable(x: Any, cd: Any, out_dtype: Any, ops: _kernel.Ops, on_device: bool) -> bool:
    """Whether the compiled pass (numba) runs this CPU release: float32 or bfloat16 in and
    out with float32 arithmetic, or float64 in and out."""
    if on_device or not _USE_FUSED or not _fused.available():
        return False
    if ops.torch:
        t = ops.xp
        return (x.dtype, cd, out_dtype) in (
            (t.float32, t.float32, t.float32),
            (t.bfloat16, t.float32, t.bfloat16),
            (t.float64, t.float64, t.float64),
        )
    return (x.dtype, cd, np.dtype(out_dtype)) in (
        (np.dtype(np.float32), np.float32, np.dtype(np.float32)),
        (np.dtype(np.float64), np.float64, np.dtype(np.float64)),
    )


def _threads() -> int:
    """Worker threads for a large CPU release: torch's intra-op thread count (which
    ``torch.set_num_threads`` and ``OMP_NUM_THREADS`` set), 1 without torch."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else 1


def _compute_dtype(dtype: Any, g: float, ops: _kernel.Ops) -> Any:
    """float32 arithmetic when it is exact for every value of ``dtype`` (a public choice)."""
    narrow = (
        (ops.xp.float16, ops.xp.float32, ops.xp.bfloat16)
        if ops.torch
        else (np.dtype(np.float16), np.dtype(np.float32))
    )
    if dtype in narrow and 2.0**-100 <= g <= 2.0**100:
        return ops.f32
    return ops.f64


def _main_words(
    bits: Any, kind: str, first: int, count: int, ops: _kernel.Ops, device: Any, on_device: bool
) -> tuple[Any, Any]:
    """``(w1, w2)``: the main words of ``count`` units on the compute device."""
    if on_device:  # the torch ChaCha20 on the tensor's device (the GPU path)
        w = bits.main_device(first, count, ops.xp, device)
        if kind == "gaussian":
            w = w.reshape(count, 2)
            hi = w[:, 1].contiguous()
            return w[:, 0].contiguous(), (hi ^ 0x80000000) - 0x80000000  # as a signed int32
        return w, None
    raw = bits.main_bytes(first, count)
    arr = np.frombuffer(raw, dtype="<i8" if kind == "gaussian" else "<i4")
    w = ops.xp.from_numpy(arr.copy()) if ops.torch else arr.copy()
    if kind == "gaussian":  # one 64-bit word per pair: w1 its low half, w2 its high half
        return w, w >> 32
    return w, None


def _release_flat(
    kind: str,
    x: Any,
    scale: float,
    bits: Any,
    offset: int,
    ops: _kernel.Ops,
    out_dtype: Any,
    device: Any = None,
    given: Any = None,
    device_path: bool | None = None,
) -> Any:
    """The release of the flat array ``x`` (numpy or torch): see the module docstring.

    ``device_path`` (default: whether ``device`` is not the CPU) draws the keystream with the
    torch ChaCha20 on ``device`` instead of OpenSSL: the GPU path, testable on the CPU."""
    if not ops.torch:  # the same operations for every value: no floating-point warnings
        with np.errstate(all="ignore"):
            return _release_flat_checked(
                kind, x, scale, bits, offset, ops, out_dtype, device, given, device_path
            )
    return _release_flat_checked(
        kind, x, scale, bits, offset, ops, out_dtype, device, given, device_path
    )


def _release_flat_checked(
    kind: str,
    x: Any,
    scale: float,
    bits: Any,
    offset: int,
    ops: _kernel.Ops,
    out_dtype: Any,
    device: Any,
    given: Any,
    device_path: bool | None,
) -> Any:
    n = int(x.numel()) if ops.torch else int(x.size)
    g = _step(scale)
    s = scale / g  # exact: g is a power of two
    big = float(ops.xp.finfo(out_dtype).max)
    if ops.torch:
        out = ops.xp.empty(n, dtype=out_dtype, device=x.device)
    else:
        out = np.empty(n, dtype=out_dtype)
    if n == 0:
        return out
    if given is not None:
        return _release_given(x, given, s, g, out_dtype, big, ops)
    cd = _compute_dtype(x.dtype, g, ops)
    margin = _kernel.GAUSS_MARGIN if kind == "gaussian" else _kernel.LAPLACE_MARGIN
    thr = np.float32(0.5 - margin)
    uv = _UNIT_VALUES[kind]
    s32 = np.float32(s)
    first_unit = offset // uv
    last_unit = (offset + n + uv - 1) // uv
    on_device = device is not None and getattr(device, "type", "cpu") != "cpu"
    if device_path is not None:
        on_device = device_path
    chunk = _DEVICE_CHUNK_UNITS if on_device else _CHUNK_UNITS
    flagged: list[tuple[Any, ...]] = []
    inv_g = 1.0 / g
    wide_g = g < 1.0  # x / g can overflow only then (a public condition)

    if _fusable(x, cd, out_dtype, ops, on_device):  # e.g. the float32 pass of a float16 tensor
        xs = x.contiguous().numpy() if ops.torch else np.ascontiguousarray(x)
        _release_fused(kind, xs, out.numpy() if ops.torch else out, g, s, bits, offset, _threads())
        return out

    def one(u0: int, own_stream: bool) -> None:
        k = min(chunk, last_unit - u0)
        if own_stream:  # a worker thread: its own cipher context, no shared state
            raw = bits.main_bytes_at(u0, k)
            arr = np.frombuffer(raw, dtype="<i8" if kind == "gaussian" else "<i4")
            w1: Any = ops.xp.from_numpy(arr.copy()) if ops.torch else arr.copy()
            w2: Any = w1 >> 32 if kind == "gaussian" else None
        else:
            w1, w2 = _main_words(bits, kind, u0, k, ops, device, on_device)
        z, bad = _kernel.standard_f32(kind, w1, w2, ops)
        v0 = max(u0 * uv, offset)  # the chunk's values (global positions) [v0, v1)
        v1 = min((u0 + k) * uv, offset + n)
        lead = v0 - u0 * uv
        xs = x[v0 - offset : v1 - offset]
        if lead or v1 != (u0 + k) * uv:  # a pair cut by the range: pad it (edges only)
            pad = ops.xp.zeros(k * uv, dtype=x.dtype, **({"device": x.device} if ops.torch else {}))
            pad[lead : lead + (v1 - v0)] = xs
            xs = pad
        xc = ops.to(xs, cd)
        t = xc * inv_g
        f = t - ops.rint(t)
        if wide_g:
            f = ops.nan0(f)  # inf - inf where x / g overflowed: there x is on the lattice, f = 0
        v = z * s32
        v += ops.to(f, ops.f32) if cd is not ops.f32 else f
        j = ops.rint(v)
        v -= j
        flag = abs(v) > thr  # NaN (a failed gate's draw) compares False: bad catches it
        res = _kernel.finish(xc, f, j, g, out_dtype, big, ops)
        out[v0 - offset : v1 - offset] = res[lead : lead + (v1 - v0)]
        flag |= bad
        flag = flag[lead : lead + (v1 - v0)]
        if on_device:
            idx = ops.xp.nonzero(flag).reshape(-1)
        else:
            idx = np.flatnonzero(flag.numpy() if ops.torch else flag)
            if ops.torch:
                idx = ops.xp.from_numpy(idx)
        if len(idx):
            units = (idx + lead) // uv
            flagged.append(
                (idx + (v0 - offset), w1[units], None if w2 is None else w2[units], (idx + v0) % uv)
            )

    starts = range(first_unit, last_unit, chunk)
    workers = _threads() if not on_device and isinstance(bits, _CounterBits) else 1
    if workers > 1 and len(starts) >= 2 * workers:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda u: one(u, True), starts))
        flagged.sort(key=lambda fl: int(fl[0][0]))  # the order of the values (deterministic)
    else:
        for u0 in starts:
            one(u0, False)
    if flagged:
        _settle_flagged(kind, x, flagged, s, g, out, out_dtype, big, bits, offset, ops)
    return out


def _release_compiled(
    kind: str, value: Any, where: str, arr: Any, scale: float, bits: Any, offset: int
) -> Any:
    """The release by the compiled pass (numba) when it applies — a CPU float32/bfloat16
    tensor or float32 array with float32 arithmetic, float64 or integers — else ``None``.
    Checks finiteness itself (keyed bits: in the same pass; nothing is released)."""
    if not _USE_FUSED or not _fused.available():
        return None
    g = _step(scale)
    s = scale / g  # exact: g is a power of two
    narrow = 2.0**-100 <= g <= 2.0**100  # float32 arithmetic is exact for the narrow dtypes
    if where == "torch":
        torch = sys.modules["torch"]
        if arr.device.type != "cpu":
            return None
        dt = arr.dtype
        flat = arr.detach().reshape(-1)
        if not flat.is_floating_point():
            flat, dt = flat.to(torch.float64), torch.float64
        if not (dt == torch.float64 or (narrow and dt in (torch.float32, torch.bfloat16))):
            return None
        flat = flat.contiguous()
        out = torch.empty(flat.shape, dtype=dt)
        if dt == torch.bfloat16:
            xs = flat.view(torch.int16).numpy().view(np.uint16)
            res = out.view(torch.int16).numpy().view(np.uint16)
        else:
            xs, res = flat.numpy(), out.numpy()
        _release_fused(kind, xs, res, g, s, bits, offset, _threads())
        return out.reshape(arr.shape)
    xs = np.ascontiguousarray(arr.reshape(-1))
    if xs.dtype.kind in "iu":
        xs = xs.astype(np.float64)
    elif not xs.flags.writeable:  # one compiled variant: a copy, not a second compilation
        xs = xs.copy()
    if not (xs.dtype == np.float64 or (narrow and xs.dtype == np.float32)):
        return None
    res = np.empty(xs.shape, dtype=xs.dtype)
    _release_fused(kind, xs, res, g, s, bits, offset, _threads())
    res = res.reshape(arr.shape)
    if arr.ndim == 0 and not isinstance(value, np.ndarray):
        return float(res)
    return res


def _release_fused(
    kind: str, xs: Any, res: Any, g: float, s: float, bits: Any, offset: int, threads: int = 1
) -> None:
    """The release of the flat numpy array ``xs`` (float32, float64, or bfloat16 bits as
    uint16) into ``res`` by the compiled pass (:mod:`renyi.noise._fused`: tiers 1 and 2 in one
    loop), then tier 3 for the rare values that need more random bits, in the order of the
    values (a word source is read in order). Non-finite values are refused: before any word is
    read from a word source, after the pass (nothing is released) for keyed bits."""
    keyed = isinstance(bits, _CounterBits)
    if not keyed and xs.dtype != np.uint16:
        _check_finite("numpy", xs)
    elif not keyed:
        _check_finite("numpy", (xs.astype(np.uint32) << 16).view(np.float32))
    if xs.dtype == np.uint16:
        big = float(np.finfo(np.float32).max)  # the float32 release saturates, then rounds
    else:
        big = float(np.finfo(xs.dtype).max)
    n = xs.shape[0]
    uv = _UNIT_VALUES[kind]
    gauss = kind == "gaussian"
    margin = _kernel.GAUSS_MARGIN if gauss else _kernel.LAPLACE_MARGIN
    thr = 0.5 - margin
    first_unit = offset // uv
    last_unit = (offset + n + uv - 1) // uv
    run = _fused.gaussian_release if gauss else _fused.laplace_release
    word_dtype = "<i8" if gauss else "<i4"
    stats = np.zeros(2, dtype=np.int64)  # [flagged by tier 1, non-finite inputs]
    pending: list[tuple[Any, Any]] = []
    chunk = _FUSED_CHUNK_UNITS

    def one(u0: int, own_stream: bool) -> None:
        k = min(chunk, last_unit - u0)
        if own_stream:  # a worker thread: its own cipher context
            raw = bits.main_bytes_at(u0, k)
        elif keyed:
            buf = getattr(_SCRATCH, "buf", None)
            if buf is None or len(buf) < k * bits.unit:
                buf = _SCRATCH.buf = bytearray(chunk * bits.unit)
            raw = bits.main_bytes(u0, k, into=buf)
        else:
            raw = bits.main_bytes(u0, k)
        w = np.frombuffer(raw, dtype=word_dtype)
        v0 = max(u0 * uv, offset)  # the chunk's values (global positions) [v0, v1)
        v1 = min((u0 + k) * uv, offset + n)
        flag = np.empty(v1 - v0, dtype=np.int64)
        lo, hi = v0 - offset, v1 - offset
        lead = v0 - u0 * uv
        count = run(w, xs[lo:hi], lead, g, s, thr, big, res[lo:hi], flag, stats)
        if count:  # values whose index needs more random bits: their words, for tier 3
            idx = flag[:count]
            pending.append((idx + lo, w[(idx + lead) // uv].astype(np.int64)))

    starts = range(first_unit, last_unit, chunk)
    workers = threads if keyed else 1
    if workers > 1 and len(starts) >= 2 * workers:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda u: one(u, True), starts))
        pending.sort(key=lambda p: int(p[0][0]))  # the order of the values (deterministic)
    else:
        for u0 in starts:
            one(u0, False)
    if stats[1]:
        raise fail(*_NON_FINITE)
    _FLAG_COUNTS[0] += int(stats[0])
    if not pending:
        return
    idx = np.concatenate([p[0] for p in pending])
    words = np.concatenate([p[1] for p in pending])
    _FLAG_COUNTS[1] += len(idx)
    xf = xs[idx]
    if xs.dtype == np.uint16:  # bfloat16 bits: the float32 with the same top half
        xf = (xf.astype(np.uint32) << 16).view(np.float32)
    f = _exact_f(xf, g)
    js = np.empty(len(idx), dtype=np.float64)
    for i in range(len(idx)):
        unit = (int(idx[i]) + offset) // uv

        def ext(level: int, unit: int = unit) -> tuple[int, int]:
            e1, e2 = bits.ext(level, np.array([unit]))
            return int(e1[0]), int(e2[0])

        word = int(words[i]) & 0xFFFFFFFFFFFFFFFF
        main = (word & 0xFFFFFFFF, word >> 32) if gauss else (word & 0xFFFFFFFF, 0)
        which = (int(idx[i]) + offset) % uv
        fi = _tier3_f(float(xf[i]), g, float(f[i]))
        js[i] = _exact.decide_exact(kind, fi, s, main, ext, which)
    _fused.write_exact(xs, idx, js, g, big, res)


#: Values flagged by the compiled pass (tier 1) and sent to tier 3, since import (for tests).
_FLAG_COUNTS = [0, 0]


def _np(a: Any) -> np.ndarray:
    if hasattr(a, "cpu"):
        a = a.detach().cpu()
        if a.is_floating_point() and a.element_size() < 4:
            a = a.float()  # exact: float16/bfloat16 are float32 values (numpy lacks bfloat16)
        return a.numpy()
    return np.asarray(a)


def _exact_f(x: Any, g: float) -> np.ndarray:
    """The exact fractional parts ``x/g - round(x/g)`` (float64; 0 where ``x/g`` overflows)."""
    with np.errstate(over="ignore", invalid="ignore"):
        t = _np(x).astype(np.float64) / g
        f = t - np.rint(t)
    return np.where(np.isnan(f), 0.0, f)


def _tier3_f(x: float, g: float, f: float) -> Any:
    """The exact fractional part for tier 3: ``f`` itself, or, where ``|x| <= g/2`` (there
    ``f = x/g``, which may have underflowed in float64: a subnormal ``x``, ``g > 1``), ``x/g``
    as an exact mpmath number."""
    if abs(x) > 0.5 * g or x == 0.0:
        return f
    import mpmath

    return mpmath.ldexp(mpmath.mpf(x), -math.frexp(g)[1] + 1)


def _settle_flagged(
    kind: str,
    x: Any,
    flagged: list[Any],
    s: float,
    g: float,
    out: Any,
    out_dtype: Any,
    big: float,
    bits: Any,
    offset: int,
    ops: _kernel.Ops,
) -> None:
    """Decide the flagged values exactly (tiers 2 and 3) and write their releases."""
    cat = ops.xp.cat if ops.torch else np.concatenate
    idx = _np(cat([fl[0] for fl in flagged])).astype(np.int64)
    w1 = _np(cat([fl[1] for fl in flagged])).astype(np.int64) & 0xFFFFFFFF
    w2 = None
    if kind == "gaussian":
        w2 = _np(cat([fl[2] for fl in flagged])).astype(np.int64) & 0xFFFFFFFF
    which = _np(cat([fl[3] for fl in flagged])).astype(np.int64)
    xs = x[ops.xp.as_tensor(idx, device=x.device)] if ops.torch else x[idx]
    f = _exact_f(xs, g)
    ok, j = _exact.decide_float64(kind, f, s, w1, w2, which)
    units = (idx + offset) // _UNIT_VALUES[kind]
    for i in np.flatnonzero(~ok):
        unit = int(units[i])

        def ext(level: int, unit: int = unit) -> tuple[int, int]:
            e1, e2 = bits.ext(level, np.array([unit]))
            return int(e1[0]), int(e2[0])

        main = (int(w1[i]), 0 if w2 is None else int(w2[i]))
        fi = _tier3_f(float(_np(xs[i : i + 1])[0]), g, float(f[i]))
        j[i] = _exact.decide_exact(kind, fi, s, main, ext, int(which[i]))
    cd = _compute_dtype(x.dtype, g, ops)
    xc = ops.to(xs, cd)
    if ops.torch:
        fj = ops.xp.as_tensor(f, device=x.device).to(cd)
        jj = ops.xp.as_tensor(j, device=x.device).to(cd)
        out[ops.xp.as_tensor(idx, device=x.device)] = _kernel.finish(
            xc, fj, jj, g, out_dtype, big, ops
        )
    else:
        out[idx] = _kernel.finish(xc, f.astype(cd), j.astype(cd), g, out_dtype, big, ops)


class _Combination:
    """What :meth:`CounterNoise.snap_combination` releases: the caller's float64 combination
    ``noise`` of counter normals, its proven error bound, the exact coefficient row and the
    counters (the exact tier regenerates the normals it needs)."""

    def __init__(
        self,
        noise: Any,
        scale: float,
        bound: float,
        row: Any,
        key: bytes,
        stream: int,
        offset: int,
    ) -> None:
        self.noise = noise
        self.scale = scale
        self.bound = bound
        self.row = row
        self.key = key
        self.stream = stream
        self.offset = offset


def _release_given(
    x: Any, given: Any, s: float, g: float, out_dtype: Any, big: float, ops: _kernel.Ops
) -> Any:
    """:func:`snap`: ``J = round(f + s z)`` exactly for the caller's float64 ``z``; with a
    :class:`_Combination`, ``J = round(f + s scale sum_k a_k Z_k)`` for the ideal normals."""
    from fractions import Fraction

    f = _exact_f(x, g)
    if isinstance(given, _Combination):
        y = _np(given.noise).astype(np.float64).reshape(-1)
        j, flagged = _combination.fast_indices(f, y, s, given.scale, given.bound)
        if flagged.size:
            j[flagged] = _combination.decide(
                given.key, given.stream, flagged + given.offset, f[flagged], s, given.scale,
                given.row,
            )  # fmt: skip
    else:
        z = _np(given).astype(np.float64).reshape(-1)
        v = f + s * z
        j = np.rint(v)
        # |fl(f + fl(s z)) - (f + s z)| <= 2 ulp(v): exact recomputation within that of a boundary
        near = np.abs(v - j) > 0.5 - 2.0**-50 * (1.0 + np.abs(v))
        for i in np.flatnonzero(near):
            exact = Fraction(float(f[i])) + Fraction(s) * Fraction(float(z[i]))
            j[i] = float(round(exact))
    cd = ops.f64
    xc = ops.to(x, cd)
    if ops.torch:
        fj = ops.xp.as_tensor(f, device=x.device)
        jj = ops.xp.as_tensor(j, device=x.device)
        return _kernel.finish(xc, fj, jj, g, out_dtype, big, ops)
    return _kernel.finish(xc, f, j, g, out_dtype, big, ops)


_NON_FINITE = ("value", "a non-finite entry", "finite values (NaN/inf are refused)")
_INT = (
    "a Python int must lie in [-2**63, 2**64) (the int64/uint64 range; integers are taken at "
    "their float64 value): pass a larger one as a float"
)
_INT_RULE = "a finite real number, array or tensor; " + _INT


def _check_value(value: Any, finite: bool = True) -> tuple[str, Any]:
    """``(kind, array)``: the value as a torch tensor or numpy array; refused if not real, and
    (``finite=True``) if an entry is not finite."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.is_complex() or value.dtype == torch.bool:
            raise fail("value", value.dtype, "a real-valued tensor")
        if value.layout != torch.strided or value.device.type == "meta":
            shown = f"a {value.layout} tensor on {value.device}"
            raise fail("value", shown, "a dense (strided) tensor holding data")
        if value.is_floating_point() and value.element_size() < 2:
            raise fail("value", value.dtype, "a tensor of 16 or more bits (cast float8 first)")
        if finite:
            _check_finite("torch", value)
        return "torch", value
    if isinstance(value, bool | np.bool_ | str | bytes):
        raise fail("value", value, "a finite real number, array or tensor")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError):
        arr = np.asarray(None)
    if arr.dtype.kind not in "iuf":
        if _has_big_int(value):  # numpy holds Python ints beyond 64 bits as objects
            raise fail("value", "a Python int outside [-2**63, 2**64)", _INT_RULE)
        raise fail("value", value, "a finite real number, array or tensor")
    if finite:
        _check_finite("numpy", arr)
    return "numpy", arr


def _has_big_int(value: Any) -> bool:
    """Whether ``value`` is (or nests, in lists/tuples) a Python int beyond int64/uint64."""
    if isinstance(value, int) and not isinstance(value, bool):
        return not -(2**63) <= value < 2**64
    if isinstance(value, list | tuple):
        return any(_has_big_int(v) for v in value)
    return False


def _check_finite(where: str, arr: Any) -> None:
    if where == "torch":
        if arr.numel():
            lo, hi = sys.modules["torch"].aminmax(arr.detach().reshape(-1))  # NaN propagates
            if not (math.isfinite(float(lo)) and math.isfinite(float(hi))):
                raise fail(*_NON_FINITE)
    elif arr.size and arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise fail(*_NON_FINITE)


def _real(name: str, value: Any, rule: str = "a finite number >= 0") -> float:
    """:func:`check_nonnegative`, with integers beyond the float64 range refused by name
    (``float(2**1100)`` would raise a bare OverflowError)."""
    try:
        return check_nonnegative(name, value)
    except OverflowError:
        shown = f"an integer of {int(value).bit_length()} bits"
        raise fail(name, shown, f"{rule} (at most the largest float64, about 1.8e308)") from None


def _check_scale(name: str, scale: Any) -> float:
    s = _real(name, scale, "a finite noise scale >= 0")
    if not math.isfinite(s):
        raise fail(name, scale, "a finite noise scale >= 0")
    return s


def _check_shape(shape: Any, limit: int = _MAX_SIZE, rule: str = "") -> tuple[tuple[int, ...], int]:
    """``(dims, number of values)`` of ``shape`` (an integer or a sequence of them, each >= 0),
    refused by name when it is anything else or holds more than ``limit`` values."""
    expected = "an integer or a tuple of integers >= 0"
    if isinstance(shape, bool | np.bool_ | str | bytes):
        raise fail("shape", shape, expected)
    dims: Any = (shape,) if isinstance(shape, numbers.Integral) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        raise fail("shape", shape, expected) from None
    for d in dims:
        if isinstance(d, bool | np.bool_) or not isinstance(d, numbers.Integral) or d < 0:
            raise fail("shape", shape, expected)
    dims = tuple(int(d) for d in dims)
    n = math.prod(dims)
    if n > limit:
        raise fail("shape", shape, rule or f"at most 2**63 - 1 values in all ({expected})")
    return dims, n


def _release(
    kind: str, value: Any, scale: Any, make_bits: Any, offset: int = 0, given: Any = None
) -> Any:
    """Checks, then the release of ``value`` (any kind) with bits from ``make_bits()``."""
    if type(scale) is float and 0.0 <= scale < math.inf:  # checked by the caller already
        s = scale
    else:
        s = _check_scale("sigma" if kind == "gaussian" else "scale", scale)
    where, arr = _check_value(value, finite=False)
    if given is not None:
        noise_in = given.noise if isinstance(given, _Combination) else given
        name = "noise" if isinstance(given, _Combination) else "standard_noise"
        n_noise = noise_in.numel() if hasattr(noise_in, "numel") else np.asarray(noise_in).size
        n_value = arr.numel() if where == "torch" else arr.size
        if n_noise != n_value:
            raise fail(name, f"{n_noise} entries", f"{n_value} entries, one per value")
        gz = _np(noise_in.detach() if hasattr(noise_in, "detach") else noise_in)
        if gz.dtype.kind not in "iuf" and _has_big_int(noise_in):
            raise fail(name, "a Python int outside [-2**63, 2**64)", "finite real noise; " + _INT)
        if gz.dtype.kind not in "iuf" or (gz.size and not np.isfinite(gz).all()):
            raise fail(name, "a non-finite or non-real entry", "finite real noise")
    bits = make_bits() if given is None else None
    n_all = arr.numel() if where == "torch" else arr.size
    if kind == "laplace" and isinstance(bits, _CounterBits) and offset + n_all > _MAX_LAPLACE:
        # the extension words of value i sit in block i/8 of their domain: past 2**35 values
        # the 32-bit block counter would wrap onto the bits of value i - 2**35
        raise fail("value", f"{n_all} entries", "at most 2**35 Laplace values per key")
    if given is None and s > 0.0:
        fast = _release_compiled(kind, value, where, arr, s, bits, offset)
        if fast is not None:
            return fast
    _check_finite(where, arr)
    if where == "torch":
        torch = sys.modules["torch"]
        out_dtype = arr.dtype if arr.is_floating_point() else torch.float64
        flat = arr.detach().reshape(-1)
        if not flat.is_floating_point():
            flat = flat.to(torch.float64)
        if s == 0.0:
            return (flat.to(out_dtype) + 0.0).reshape(arr.shape)
        if flat.device.type == "cpu" and flat.numel() <= _SMALL and flat.dtype != torch.bfloat16:
            # small CPU releases: numpy's per-operation overhead is a fraction of torch's
            got = _release_flat(
                kind,
                flat.contiguous().numpy(),
                s,
                bits,
                offset,
                _kernel.Ops(np),
                np.dtype(str(out_dtype).replace("torch.", "")),
                None,
                given,
            )
            return torch.from_numpy(got).reshape(arr.shape)
        ops = _kernel.Ops(torch)
        if (
            flat.device.type == "cpu"
            and out_dtype == torch.float16
            and given is None
            and _USE_FUSED
        ):
            # the float32 pass on the exact float32 values, then fl(g K) in the half dtype
            # (no double rounding: see docs/noise.md), saturated, never -0
            wide = _release_flat(kind, flat.float(), s, bits, offset, ops, torch.float32)
            big = float(torch.finfo(out_dtype).max)
            res = torch.nan_to_num(wide.to(out_dtype), nan=0.0, posinf=big, neginf=-big)
            return (res + 0.0).reshape(arr.shape)
        res = _release_flat(kind, flat, s, bits, offset, ops, out_dtype, flat.device, given)
        return res.reshape(arr.shape)
    out_np = arr.dtype if arr.dtype.kind == "f" else np.dtype(np.float64)
    flat_np = np.ascontiguousarray(arr.reshape(-1))
    if flat_np.dtype != out_np:
        flat_np = flat_np.astype(np.float64)
    if s == 0.0:
        res_np = flat_np.astype(out_np) + out_np.type(0.0)
    else:
        tmod = sys.modules.get("torch")
        if tmod is not None and flat_np.size > _SMALL:  # torch's CPU kernels: faster in bulk
            t = tmod.from_numpy(flat_np)
            res_np = _release_flat(
                kind,
                t,
                s,
                bits,
                offset,
                _kernel.Ops(tmod),
                getattr(tmod, str(out_np)),
                None,
                given,
            ).numpy()
        else:
            res_np = _release_flat(
                kind, flat_np, s, bits, offset, _kernel.Ops(np), out_np, None, given
            )
    res_np = res_np.reshape(arr.shape)
    if arr.ndim == 0 and not isinstance(value, np.ndarray):
        return float(res_np)
    return res_np


def _fresh_bits(kind: str, rng: Any, allow: bool) -> Any:
    """The bits for a release with ``rng``: the keyed keystream under a fresh OS key for the
    secure default, else the caller's word source (read in order)."""
    words = resolve_source(rng, allow_predictable_noise=allow)
    if rng is None or getattr(words, "__self__", None) is _secure_source():
        return lambda: _CounterBits(os.urandom(32), kind, 0, 0)
    return lambda: _SourceBits(words, kind)


def _secure_source() -> Any:
    from renyi.random import _SECURE

    return _SECURE


def gaussian(
    value: Any, sigma: float, *, rng: Any = None, allow_predictable_noise: bool = False
) -> Any:
    """``value + N(0, sigma**2)`` per entry, released on the lattice ``lattice_step(sigma) Z``.

    Same kind, shape, dtype (floats; integers give float64) and device as ``value``. Privacy:
    the Gaussian mechanism's, exactly (post-processing), up to :func:`implementation_slack`.

    >>> import numpy as np
    >>> y = gaussian(np.zeros(4, dtype=np.float32), 2.0)
    >>> y.dtype, bool(np.all(np.mod(y, 0.25) == 0))
    (dtype('float32'), True)
    """
    s = _check_scale("sigma", sigma)
    return _release("gaussian", value, s, _fresh_bits("gaussian", rng, allow_predictable_noise))


def laplace(
    value: Any, scale: float, *, rng: Any = None, allow_predictable_noise: bool = False
) -> Any:
    """``value + Laplace(scale)`` per entry, released on the lattice ``lattice_step(scale) Z``.

    Privacy: the Laplace mechanism's (``Delta_1 / scale``-DP), up to
    :func:`implementation_slack`.

    >>> laplace(0.0, 1.0) % 0.125
    0.0
    """
    s = _check_scale("scale", scale)
    return _release("laplace", value, s, _fresh_bits("laplace", rng, allow_predictable_noise))


def _raw_normals(bits: Any, first_value: int, n: int, xp: Any, device: Any = None) -> Any:
    """``n`` float64 standard normals from the Gaussian bits (main words and level-1
    extension words: 63-bit radius uniform, 64-bit angle uniform), values ``first_value`` on."""
    u0 = first_value // 2
    u1 = (first_value + n + 1) // 2
    k = u1 - u0
    if isinstance(bits, _CounterBits):
        if xp is not np and device is not None and getattr(device, "type", "cpu") != "cpu":
            main = bits.main_device(u0, k, xp, device).reshape(k, 2)
            ext_words = (
                bits._blocks(
                    1, xp.arange(u0 // 8, (u1 + 7) // 8, dtype=xp.int64, device=device), xp
                )
                .reshape(-1)[2 * (u0 % 8) : 2 * (u0 % 8) + 2 * k]
                .reshape(k, 2)
            )
        else:
            main_np = np.frombuffer(bits.main_bytes(u0, k), dtype="<u4").astype(np.int64)
            ext_np = np.frombuffer(bits._blocks_bytes(1, 8 * u0, 8 * k), dtype="<u4")
            main = main_np.reshape(k, 2)
            ext_words = ext_np.astype(np.int64).reshape(k, 2)
            if xp is not np:
                main, ext_words = xp.from_numpy(main), xp.from_numpy(ext_words)
    else:
        main_np = np.frombuffer(bits.main_bytes(u0, k), dtype="<u4").astype(np.int64)
        e1, e2 = bits.ext(1, np.arange(u0, u1))
        main = main_np.reshape(k, 2)
        ext_words = np.stack([e1, e2], axis=1)
        if xp is not np:
            main, ext_words = xp.from_numpy(main), xp.from_numpy(ext_words)

    def f64(a: Any) -> Any:
        return a.astype(np.float64) if xp is np else a.to(xp.float64)

    c1 = f64(main[:, 0] & 0x7FFFFFFF) * 2.0**32 + f64(ext_words[:, 0]) + 0.5  # to 53 bits
    a2 = f64(main[:, 1] & 0xFFFFFFFF) * 2.0**32 + f64(ext_words[:, 1]) + 0.5
    r = xp.sqrt(-2.0 * xp.log(c1 * 2.0**-63))
    theta = a2 * (2.0 * math.pi * 2.0**-64)
    z = xp.stack([r * xp.cos(theta), r * xp.sin(theta)], 1).reshape(-1)
    start = first_value - 2 * u0
    return z[start : start + n]


def standard_normal(
    n: int, *, rng: Any = None, allow_predictable_noise: bool = False, torch_kernel: bool = False
) -> Any:
    """``n`` raw standard normals (float64), from the bits :func:`gaussian` uses: NOT for release
    on their own (their low bits leak); pass them, shaped as needed, to :func:`snap`.
    ``torch_kernel=True`` returns a torch tensor (CPU).

    >>> standard_normal(3).shape
    (3,)
    """
    n = check_int("n", n, 0)
    if n > _MAX_SIZE:
        raise fail("n", n, "an integer in [0, 2**63) (numpy's largest array)")
    make = _fresh_bits("gaussian", rng, allow_predictable_noise)
    if torch_kernel:
        import torch

        return _raw_normals(make(), 0, n, torch)
    return np.asarray(_raw_normals(make(), 0, n, np), dtype=np.float64)


def snap(value: Any, standard_noise: Any, sigma: float) -> Any:
    """``value + sigma * standard_noise`` released on the lattice ``lattice_step(sigma) Z``,
    for noise the caller has shaped itself (e.g. the correlated noise rows of
    :mod:`renyi.dpsgd.correlated`, linear combinations of fresh normals).

    The index is exactly ``round(value/g + (sigma/g) z)`` for the caller's float64 ``z``
    (recomputed in rationals near a boundary), the output canonical as for :func:`gaussian`;
    the randomness and the privacy of ``z`` are the caller's. ``standard_noise`` has
    ``value``'s number of entries and must be finite.

    >>> snap(1.0, 0.3, 1.0)
    1.25
    """
    s = _check_scale("sigma", sigma)
    _check_value(value, finite=False)
    return _release("gaussian", value, s, None, given=standard_noise)


def gaussian_noise(
    shape: int | tuple[int, ...],
    sigma: float,
    *,
    rng: Any = None,
    like: Any = None,
    allow_predictable_noise: bool = False,
) -> Any:
    """A released pure-noise array: :func:`gaussian` of zeros of ``shape`` (numpy float64,
    or a tensor with ``like``'s dtype and device when ``like`` is a torch tensor).

    >>> gaussian_noise((2, 3), 1.0).shape
    (2, 3)
    """
    shp, _ = _check_shape(shape)
    _check_scale("sigma", sigma)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        zeros: Any = torch.zeros(shp, dtype=like.dtype, device=like.device)
    else:
        zeros = np.zeros(shp, dtype=np.float64)
    return gaussian(zeros, sigma, rng=rng, allow_predictable_noise=allow_predictable_noise)


def gaussian_integers(
    shape: int | tuple[int, ...],
    sigma: float,
    *,
    rng: Any = None,
    allow_predictable_noise: bool = False,
) -> tuple[NDArray[np.int64], float]:
    """``(K, g)``: the lattice indices of a released pure-noise array and the step, for
    multi-party sums on one integer lattice (``K g`` is :func:`gaussian_noise`, exactly).

    ``K`` is ``round(s Z)`` with ``s = sigma / g`` in ``[8, 16)``: integer noise whose
    release ``g K`` is the Gaussian mechanism rounded to ``g Z`` (same analysis as
    :func:`gaussian`). int64, the indices are far below ``2**53``.

    >>> k, g = gaussian_integers(4, 1.0)
    >>> k.dtype, g
    (dtype('int64'), 0.125)
    """
    g = lattice_step(_check_scale("sigma", sigma))
    y = gaussian_noise(shape, sigma, rng=rng, allow_predictable_noise=allow_predictable_noise)
    return (np.asarray(y, dtype=np.float64) / g).astype(np.int64), g


# ------------------------------------------------------------------------- counter noise
class CounterNoise:
    """Keyed, counter-based noise: the releases of :func:`gaussian` / :func:`laplace` with bits
    that are a deterministic function of a secret 256-bit key and ``(stream, step, offset)``.

    Entry ``i`` of a call uses the bits of global position ``offset + i`` of the keystream of
    ``(stream, step)`` (ChaCha20, RFC 8439; layout in ``docs/noise.md``): disjoint offset ranges
    are disjoint slices (distributed ranks draw their shares without talking), and the same
    ``(stream, step, range)`` regenerates the same noise (correlated-noise optimisers keep no
    past noise; checkpoints keep only the key). **Never release twice with the same counters**:
    the noise would repeat. ``stream`` is in ``[0, 2**24)``, ``step`` in ``[0, 2**64)``, and one
    ``(stream, step)`` holds ``2**36`` values.

    ``key=None`` draws a fresh key from the OS. :meth:`state_dict` holds the key: keep it as
    secret as the data (whoever has it can subtract the noise).

    >>> cn = CounterNoise(bytes(32))
    >>> z = cn.standard_normal((2, 3), stream=1, step=0)
    >>> z.shape, bool((cn.standard_normal(6, stream=1, step=0) == z.reshape(-1)).all())
    ((2, 3), True)
    """

    def __init__(self, key: bytes | None = None) -> None:
        if key is None:
            key = os.urandom(32)
        if not isinstance(key, bytes | bytearray) or len(key) != 32:
            raise fail("key", "a key of another kind or length", "32 bytes (256 bits)")
        self._key = bytes(key)

    def __repr__(self) -> str:
        return "CounterNoise(key=<secret>)"

    @staticmethod
    def _counters(
        stream: Any, step: Any, offset: Any, n: int, limit: int = _MAX_VALUES
    ) -> tuple[int, int, int]:
        top = f"2**{limit.bit_length() - 1}"
        if n > limit:  # the value alone is too large: name it, not the offset
            raise fail("value", f"{n} entries", f"at most {top} values per (stream, step)")
        st = check_int("stream", stream, 0)
        if st >= _MAX_STREAM:
            raise fail("stream", stream, "an integer in [0, 2**24)")
        sp = check_int("step", step, 0)
        if sp >= 1 << 64:
            raise fail("step", step, "an integer in [0, 2**64)")
        off = check_int("offset", offset, 0)
        if off + n > limit:
            raise fail("offset", offset, f"offset + number of values <= {top} per (stream, step)")
        return st, sp, off

    def _numel(self, value: Any) -> int:
        return int(value.numel()) if hasattr(value, "numel") else int(np.asarray(value).size)

    def gaussian(self, value: Any, sigma: float, *, stream: int, step: int, offset: int = 0) -> Any:
        """:func:`gaussian` with the noise of ``(stream, step)`` at ``offset, offset + 1, ...``."""
        s = _check_scale("sigma", sigma)
        _check_value(value, finite=False)
        st, sp, off = self._counters(stream, step, offset, self._numel(value))
        key = self._key
        return _release("gaussian", value, s, lambda: _CounterBits(key, "gaussian", st, sp), off)

    def laplace(self, value: Any, scale: float, *, stream: int, step: int, offset: int = 0) -> Any:
        """:func:`laplace` with the noise of ``(stream, step)`` at ``offset, offset + 1, ...``."""
        s = _check_scale("scale", scale)
        _check_value(value, finite=False)
        st, sp, off = self._counters(stream, step, offset, self._numel(value), _MAX_LAPLACE)
        key = self._key
        return _release("laplace", value, s, lambda: _CounterBits(key, "laplace", st, sp), off)

    def standard_normal(
        self,
        shape: int | tuple[int, ...],
        *,
        stream: int,
        step: int,
        offset: int = 0,
        like: Any = None,
        with_bound: bool = False,
    ) -> Any:
        """Raw float64 normals of ``shape``: entry ``i`` is a function of ``(key, stream, step,
        offset + i)`` alone (the bits :meth:`gaussian` uses with these counters; float64
        Box-Muller of the radius uniform read to 50 significant bits at the end it is close to,
        and a 64-bit angle uniform). NOT for release on their own: combine them and release with
        :meth:`snap_combination`. With a torch ``like``: a float64 tensor on ``like``'s device
        (computed on the CPU: the same numbers on every device).

        ``with_bound=True`` returns ``(z, err)``, ``err`` a proven bound on ``|z_i - Z_i|`` for
        the ideal normals ``Z_i`` of these bits (docs/noise.md: ``(6 + 76 max R) 2**-53``,
        about ``4e-14`` for a million values)."""
        shp, n = _check_shape(shape, _MAX_VALUES, "at most 2**36 values per (stream, step)")
        st, sp, off = self._counters(stream, step, offset, n)
        bits = _CounterBits(self._key, "gaussian", st, sp)
        z, err = _combination.normals(bits, off, n)
        out: Any = z.reshape(shp)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(like, torch.Tensor):
            out = torch.from_numpy(out).to(like.device)
        return (out, err) if with_bound else out

    def snap_combination(
        self,
        value: Any,
        noise: Any,
        sigma: float,
        *,
        error_bound: float,
        row: CombinationRow | Any,
        stream: int,
        offset: int = 0,
        scale: float = 1.0,
    ) -> Any:
        """``value + sigma * scale * sum_k a_k Z_k`` released exactly on ``lattice_step(sigma) Z``.

        ``Z_k`` at entry ``i`` is the ideal normal of counter ``(stream, row.steps[k], offset +
        i)`` (the one :meth:`standard_normal` approximates), ``a_k`` the coefficients of
        ``row`` (a :class:`CombinationRow`, or a callable ``row(bits)`` returning one whose
        coefficient radius is below ``2**-bits``: called only when a value needs it). ``noise``
        is the caller's float64 approximation of ``sum_k a_k Z_k`` (same number of entries as
        ``value``) and ``error_bound`` a **proven** bound on its error at every entry (e.g.
        the ``err`` of :meth:`standard_normal` carried through the caller's arithmetic with
        :func:`~renyi.noise._combination.gamma`). The index is ``round(value/g + (sigma/g)
        scale sum_k a_k Z_k)``: decided from ``noise`` where it is farther than the error from
        a rounding boundary, else recomputed from the counters in interval arithmetic
        (docs/noise.md, "Correlated noise"). The output is canonical, as for :func:`gaussian`.

        Privacy: for rows that form a lower-triangular ``R`` across steps, the releases are a
        post-processing (rounding) of ``R (C G + sigma scale Z)`` with ``C = R**-1``: the matrix
        factorization mechanism with the coefficients as given.

        >>> cn = CounterNoise(bytes(32))
        >>> z, err = cn.standard_normal(3, stream=0, step=1, with_bound=True)
        >>> row = CombinationRow.from_floats([1], [1.0])
        >>> a = cn.snap_combination(np.zeros(3), z, 1.0, error_bound=err, row=row, stream=0)
        >>> bool(np.array_equal(a, cn.gaussian_combination(np.zeros(3), 1.0, steps=[1],
        ...     coefficients=[1.0], stream=0)))
        True
        """
        s = _check_scale("sigma", sigma)
        _check_value(value, finite=False)
        sc = check_nonnegative("scale", scale)
        if not math.isfinite(sc) or sc == 0.0:
            raise fail("scale", scale, "a finite number > 0")
        bound = check_nonnegative("error_bound", error_bound, allow_inf=True)
        n = self._numel(value)
        st, _, off = self._counters(stream, 0, offset, n)
        if isinstance(row, CombinationRow):
            fixed = row

            def provider(bits: int) -> CombinationRow:
                return fixed
        elif callable(row):
            provider = row
        else:
            raise fail("row", type(row).__name__, "a CombinationRow or a callable row(bits)")
        given = _Combination(noise, sc, bound, provider, self._key, st, off)
        return _release("gaussian", value, s, None, given=given)

    def gaussian_combination(
        self,
        value: Any,
        sigma: float,
        *,
        steps: Any,
        coefficients: Any,
        stream: int,
        offset: int = 0,
        scale: float = 1.0,
    ) -> Any:
        """``value + sigma * scale * sum_k coefficients[k] Z(stream, steps[k], offset + i)``,
        released exactly (:meth:`snap_combination` with the combination computed here from
        :meth:`standard_normal`, one step at a time, and its proven error bound). The
        coefficients are floats, used exactly. Costs one draw of ``value``'s size per term.

        >>> cn = CounterNoise(bytes(32))
        >>> y = cn.gaussian_combination(np.zeros(4), 1.0, steps=[5, 4], coefficients=[1.0, -0.5],
        ...                             stream=0)
        >>> bool(np.all(y / 0.125 == np.round(y / 0.125)))
        True
        """
        st_list = [check_int("steps", t, 0) for t in np.asarray(steps).reshape(-1).tolist()]
        coefs = [float(c) for c in np.asarray(coefficients, dtype=np.float64).reshape(-1)]
        if len(st_list) != len(coefs) or not st_list:
            raise fail("coefficients", len(coefs), f"one per step ({len(st_list)}), at least one")
        row = CombinationRow.from_floats(st_list, coefs)
        n = self._numel(value)
        total = np.zeros(n)
        bound = 0.0
        g_k = _combination.gamma(len(coefs))
        for t, c in zip(st_list, coefs, strict=True):
            z, err = self.standard_normal(n, stream=stream, step=t, offset=offset, with_bound=True)
            total += c * z  # fl(total + fl(c z)): len(coefs) rounded terms, gamma_k
            bound += abs(c) * (err + g_k * (float(np.abs(z).max()) if n else 0.0))
        bound *= 1.0 + 4.0 * len(coefs) * _combination.UNIT_ROUNDOFF
        shape = value.shape if hasattr(value, "shape") else np.shape(value)
        torch = sys.modules.get("torch")
        noise_arr: Any = total.reshape(shape)
        if torch is not None and isinstance(value, torch.Tensor):
            noise_arr = torch.from_numpy(noise_arr)
        return self.snap_combination(
            value, noise_arr, sigma, error_bound=bound, row=row, stream=stream, offset=offset,
            scale=scale,
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """``{"kind": "renyi.noise.CounterNoise", "version": 1, "key": hex}``: SECRET."""
        return {"kind": "renyi.noise.CounterNoise", "version": 1, "key": self._key.hex()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> CounterNoise:
        """The generator of :meth:`state_dict` (the same key: the same noise)."""
        if (
            not isinstance(state, dict)
            or state.get("kind") != "renyi.noise.CounterNoise"
            or state.get("version") != 1
        ):
            raise fail("state", "another object", "a CounterNoise.state_dict()")
        try:
            key = bytes.fromhex(state["key"])
        except (KeyError, TypeError, ValueError):
            raise fail("state['key']", "not a hex key", "64 hex digits") from None
        return cls(key)
