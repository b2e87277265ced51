"""renyi.noise is exact: the keystream is RFC 8439's ChaCha20, the bits sit where docs/noise.md
says, and every released lattice index equals the ideal one recomputed independently (float64
from 127 bits of the uniforms, mpmath at 300 bits near a rounding boundary), including draws
forced to within 2**-40 of a boundary (which the fast pass must hand to the exact tiers).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from renyi import noise
from renyi.noise import _chacha, _exact

KEY = bytes(range(32))
RFC_BLOCK = (
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
)
RFC_PLAIN = (
    b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the "
    b"future, sunscreen would be it."
)
RFC_CIPHER = (
    "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0bf91b65c5524733ab8f593d"
    "abcd62b3571639d624e65152ab8f530c359f0861d807ca0dbf500d6a6156a38e088a22b65e52bc514d16cc"
    "f806818ce91ab77937365af90bbf74a35be6b40b8eedf2785e42874d"
)


def test_chacha20_block_function_rfc8439_2_3_2():
    nonce = bytes.fromhex("000000090000004a00000000")
    assert bytes(_chacha.keystream_openssl(KEY, nonce, 1, 64)).hex() == RFC_BLOCK
    words = np.frombuffer(nonce, dtype="<u4").astype(np.int64)[None]
    out = _chacha.chacha20_blocks(KEY, words, np.array([1]), np)
    assert out.astype("<u4").tobytes().hex() == RFC_BLOCK


def test_chacha20_encryption_rfc8439_2_4_2_numpy_torch_openssl():
    nonce = bytes.fromhex("000000000000004a00000000")
    ks = bytes(_chacha.keystream_openssl(KEY, nonce, 1, len(RFC_PLAIN)))
    assert bytes(a ^ b for a, b in zip(RFC_PLAIN, ks, strict=True)).hex() == RFC_CIPHER
    words = np.broadcast_to(np.frombuffer(nonce, dtype="<u4").astype(np.int64), (2, 3))
    np_ks = _chacha.chacha20_blocks(KEY, words, np.array([1, 2]), np).astype("<u4").tobytes()
    assert np_ks[: len(ks)] == ks
    torch = pytest.importorskip("torch")
    t_ks = _chacha.chacha20_blocks(
        KEY, torch.from_numpy(np.array(words)), torch.tensor([1, 2]), torch
    )
    assert t_ks.numpy().astype("<u4").tobytes() == np_ks


def test_openssl_and_array_keystreams_agree_at_counter_edges():
    nonce = _chacha.make_nonce(3, 77, 2**40 + 5)
    first = 2**32 - 4
    ks = bytes(_chacha.keystream_openssl(KEY, nonce, first, 4 * 64))
    words = np.broadcast_to(np.frombuffer(nonce, dtype="<u4").astype(np.int64), (4, 3))
    counters = np.arange(first, first + 4)
    assert _chacha.chacha20_blocks(KEY, words, counters, np).astype("<u4").tobytes() == ks
    with pytest.raises(Exception, match="counter"):
        _chacha.keystream_openssl(KEY, nonce, first, 5 * 64)  # would wrap into the nonce


# ---------------------------------------------------------------- the documented layout
def _stream(domain: int, stream: int, step: int, start: int, n: int) -> bytes:
    nonce = _chacha.make_nonce(domain, stream, step)
    block, skip = divmod(start, 64)
    return bytes(_chacha.keystream_openssl(KEY, nonce, block, skip + n))[skip:]


def _gauss_bits(stream: int, step: int, pairs: int, levels: int):
    """Main words and ``levels`` extension levels of each pair (docs/noise.md layout)."""
    main = np.frombuffer(_stream(0, stream, step, 0, 8 * pairs), dtype="<u4").reshape(-1, 2)
    ext = [
        np.frombuffer(_stream(lv, stream, step, 0, 8 * pairs), dtype="<u4").reshape(-1, 2)
        for lv in range(1, levels + 1)
    ]
    return main.astype(np.int64), [e.astype(np.int64) for e in ext]


def _reference_gauss_z(main, ext1):
    """Independent float64 Box-Muller from 63 + 64 bits (not the fast pass's polynomials)."""
    c1 = (main[:, 0] & 0x7FFFFFFF).astype(np.float64) * 2.0**32 + ext1[:, 0] + 0.5
    a2 = main[:, 1].astype(np.float64) * 2.0**32 + ext1[:, 1] + 0.5
    r = np.sqrt(-2.0 * np.log(c1 * 2.0**-63))
    th = 2.0 * math.pi * (a2 * 2.0**-64)
    return np.stack([r * np.cos(th), r * np.sin(th)], axis=1).reshape(-1)


def _mp_gauss_index(f: float, s: float, main_row, ext_rows, which: int) -> int | None:
    """round(f + s Z) from the bits of ``ext_rows`` levels at 300 bits, None if undecided."""
    import mpmath

    with mpmath.workprec(300):
        n1 = int(main_row[0]) & 0x7FFFFFFF
        n2 = int(main_row[1])
        for e in ext_rows:
            n1 = (n1 << 32) | int(e[0])
            n2 = (n2 << 32) | int(e[1])
        b1, b2 = 31 + 32 * len(ext_rows), 32 + 32 * len(ext_rows)
        u1 = mpmath.mpf(2 * n1 + 1) / mpmath.mpf(2) ** (b1 + 1)  # cell midpoints
        u2 = mpmath.mpf(2 * n2 + 1) / mpmath.mpf(2) ** (b2 + 1)
        r = mpmath.sqrt(-2 * mpmath.log(u1))
        z = r * (mpmath.cos(2 * mpmath.pi * u2) if which == 0 else mpmath.sin(2 * mpmath.pi * u2))
        v = mpmath.mpf(f) + mpmath.mpf(s) * z
        k = int(mpmath.nint(v))
        if abs(v - k) < mpmath.mpf(0.5) - mpmath.mpf(2) ** -100:
            return k
        return None


def _check_gauss(x: np.ndarray, sigma: float, stream: int, step: int) -> int:
    """Release ``x`` with CounterNoise(KEY) and compare every index with the reference;
    returns how many needed the mpmath reference."""
    cn = noise.CounterNoise(KEY)
    y = cn.gaussian(x, sigma, stream=stream, step=step)
    g = noise.lattice_step(sigma)
    s = sigma / g
    k_out = y / g
    assert np.array_equal(k_out, np.rint(k_out))
    a = np.rint(x / g)
    f = x / g - a
    pairs = (x.size + 1) // 2
    main, ext = _gauss_bits(stream, step, pairs, 3)
    z = _reference_gauss_z(main, ext[0])[: x.size]
    v = f + s * z
    j = np.rint(v)
    near = np.abs(np.abs(v - j) - 0.5) < 2.0**-30
    for i in np.flatnonzero(near):
        ref = _mp_gauss_index(float(f[i]), s, main[i // 2], [e[i // 2] for e in ext], i % 2)
        assert ref is not None
        j[i] = ref
    np.testing.assert_array_equal(k_out, a + j)
    return int(near.sum())


def test_gaussian_index_is_exact_on_a_million_draws():
    rng = np.random.default_rng(2026)
    n = 1_000_000
    sigma = 1.3
    g = noise.lattice_step(sigma)
    x = rng.uniform(-40, 40, n) * g  # every fractional part
    x[:1000] = (np.arange(1000) + 0.5) * g  # lattice midpoints (f = +-1/2)
    _check_gauss(x, sigma, stream=5, step=11)


@pytest.mark.parametrize("sigma", [1e-3, 0.7, 15.99, 3e5])
def test_gaussian_index_is_exact_across_scales(sigma):
    rng = np.random.default_rng(int(sigma * 1000) % 2**32)
    g = noise.lattice_step(sigma)
    x = rng.uniform(-1e3, 1e3, 20_000) * g
    _check_gauss(x, sigma, stream=1, step=int(sigma * 100))


@functools.lru_cache(maxsize=1)
def _forced_near_boundary(stream: int, step: int, pairs: int) -> np.ndarray:
    """Fractional parts placing each value within 2**-40..2**-20 lattice units of a rounding
    boundary (from the pair's own bits, at sigma = 1)."""
    import mpmath

    s = 1.0 / noise.lattice_step(1.0)
    main, ext = _gauss_bits(stream, step, pairs, 3)
    fs = np.empty(2 * pairs)
    rng = np.random.default_rng(7)
    with mpmath.workprec(200):
        for i in range(2 * pairs):
            n1 = (int(main[i // 2, 0]) & 0x7FFFFFFF) << 96
            n2 = int(main[i // 2, 1]) << 96
            for lv, e in enumerate(ext):
                n1 |= int(e[i // 2, 0]) << (64 - 32 * lv)
                n2 |= int(e[i // 2, 1]) << (64 - 32 * lv)
            u1 = mpmath.mpf(n1) / mpmath.mpf(2) ** 127
            u2 = mpmath.mpf(n2) / mpmath.mpf(2) ** 128
            r = mpmath.sqrt(-2 * mpmath.log(u1))
            z = r * (
                mpmath.cos(2 * mpmath.pi * u2) if i % 2 == 0 else mpmath.sin(2 * mpmath.pi * u2)
            )
            sz = s * z
            # f = k + 1/2 - frac(s z) +- tiny, inside [-1/2, 1/2]
            target = mpmath.mpf(0.5) - (sz - mpmath.floor(sz))
            tiny = mpmath.mpf(2) ** -float(rng.uniform(20, 40)) * (1 if rng.random() < 0.5 else -1)
            f = float(target + tiny)
            fs[i] = f if abs(f) <= 0.5 else f - math.copysign(1.0, f)
    return fs


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "array-kernels"])
def test_draws_forced_next_to_a_boundary_take_the_exact_path(monkeypatch, compiled):
    """Values placed within 2**-40..2**-20 lattice units of a rounding boundary (from the
    pair's own bits): the fast pass must flag them, and the exact tiers must get them right
    (the compiled pass, which decides tier 2 in the same loop, and the numpy/torch kernels)."""
    if compiled:
        pytest.importorskip("numba")
    monkeypatch.setattr(noise, "_USE_FUSED", compiled)
    stream, step, pairs = 9, 3, 300
    fs = _forced_near_boundary(stream, step, pairs)
    calls = {"float64": 0, "exact": 0}
    orig64, orig_exact = _exact.decide_float64, _exact.decide_exact

    def count64(*a, **k):
        calls["float64"] += len(a[1])
        return orig64(*a, **k)

    def count_exact(*a, **k):
        calls["exact"] += 1
        return orig_exact(*a, **k)

    monkeypatch.setattr(_exact, "decide_float64", count64)
    monkeypatch.setattr(_exact, "decide_exact", count_exact)
    flagged_before = noise._FLAG_COUNTS[0]
    _check_gauss(fs * noise.lattice_step(1.0), 1.0, stream, step)
    flagged = calls["float64"] + noise._FLAG_COUNTS[0] - flagged_before
    assert flagged == 2 * pairs  # every forced value was flagged by the fast pass
    assert calls["exact"] > 50  # most needed more bits than the main ones


def test_laplace_index_is_exact():
    rng = np.random.default_rng(5)
    n = 200_000
    b = 2.5
    g = noise.lattice_step(b)
    s = b / g
    x = rng.uniform(-40, 40, n) * g
    cn = noise.CounterNoise(KEY)
    y = cn.laplace(x, b, stream=2, step=4)
    main = np.frombuffer(_stream(64, 2, 4, 0, 4 * n), dtype="<u4").astype(np.int64)
    ext = np.frombuffer(_stream(65, 2, 4, 0, 8 * n), dtype="<u4").astype(np.int64).reshape(-1, 2)
    u = (
        (main & 0x7FFFFFFF).astype(np.float64) * 2.0**64 + ext[:, 0] * 2.0**32 + ext[:, 1] + 0.5
    ) * 2.0**-95
    e = -np.log(u)
    z = np.where((main >> 31) & 1 == 1, -e, e)
    a = np.rint(x / g)
    v = x / g - a + s * z
    j = np.rint(v)
    ok = np.abs(np.abs(v - j) - 0.5) > 2.0**-30
    np.testing.assert_array_equal((y / g)[ok], (a + j)[ok])
    assert ok.mean() > 0.999


def test_float32_log_is_within_the_assumed_accuracy():
    """The error bound of the fast pass assumes float32 log within 16 ulp; measure it (numpy's
    SIMD log reaches 3.8 ulp, torch's SLEEF 0.9): at most half the assumption."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    u = np.concatenate([rng.uniform(2.0**-16, 1.0, 200_000), 1 - rng.uniform(0, 2**-10, 20_000)])
    u32 = u.astype(np.float32)
    exact = np.log(u32.astype(np.float64))  # float64 log: far more accurate than float32's ulp
    for got in (np.log(u32), torch.log(torch.from_numpy(u32)).numpy()):
        ulp = np.spacing(np.abs(got)).astype(np.float64)
        err = np.abs(got.astype(np.float64) - exact) / ulp
        assert float(np.max(err[exact != 0])) <= 8.0


def test_mpmath_reference_settles_tier3_midpoint_rule():
    assert _exact.MAX_LEVELS * 32 + 31 >= 32_000
    assert noise.TAIL_MASS <= 2.0**-120
    e, d = noise.implementation_slack(10**14)
    assert e <= 1e-6 and d <= 1e-12


def test_compiled_log_is_within_its_proven_bound():
    """The compiled pass's own ``ln(c 2**-31)`` (no C library in the fast pass) is within
    ``LN_REL_ERROR = 2**-33`` relative of the float64 logarithm on random and edge integers
    (powers of two, around ``sqrt(2) 2**k`` where its reduction switches, next to ``2**31``),
    so its float32 rounding is within ``0.5 + 2**-9`` ulp of the logarithm: far below the 16
    ulp the fast pass's error bound assumes. The measured maximum is ``2**-34.2`` (the
    truncated series, at ``c`` near ``2**30.5``); one series term less gives ``2**-29``."""
    _fused = pytest.importorskip("renyi.noise._fused")
    if not _fused.available():
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(5)
    top = 2**31
    edges = [np.arange(1, 4096), np.arange(top - 100_000, top)]
    for k in range(1, 31):
        edges.append(np.arange(max(1, 2**k - 3), 2**k + 4))
        mid = int(math.sqrt(2.0) * 2**k)
        edges.append(np.arange(max(1, mid - 40), min(top, mid + 41)))
    c = np.concatenate([rng.integers(1, top, 300_000), *edges]).astype(np.int64)
    got = _fused.ln_u31(c)
    # float64 references, about 1 ulp (2**-52) from the real logarithm; log1p near c = 2**31
    near = c > top // 2
    ref = np.where(near, np.log1p((c - top) / top), np.log(c / top))
    rel = np.abs(got - ref) / np.abs(ref)
    assert float(rel.max()) <= _fused.LN_REL_ERROR
    ulp = np.spacing(np.abs(ref.astype(np.float32))).astype(np.float64)
    assert float(np.max(np.abs(got.astype(np.float32) - ref) / ulp)) <= 0.5 + 2.0**-8
