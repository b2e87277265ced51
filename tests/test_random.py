"""Tests of renyi.random: the secure default, the seeded fallback and its warning, exactness.

Statistical tests use fixed seeds (deterministic) and a per-test false-alarm rate of 1e-4
(the p-value threshold), stated next to each.
"""

import os
import time
import warnings

import numpy as np
import pytest
from scipy import stats

import renyi.random as rr
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError
from renyi.random import GeneratorSource, RandomSource, SecureSource, get_source

ALPHA = 1e-4  # false-alarm rate of each statistical test


def seeded(seed: int) -> GeneratorSource:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        src = get_source(np.random.default_rng(seed))
    assert isinstance(src, GeneratorSource)
    return src


def test_default_is_the_secure_os_source_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        src = get_source(None)
    assert isinstance(src, SecureSource) and src.secure
    w = src.words(1000)
    assert w.dtype == np.uint64 and w.shape == (1000,)
    assert len(np.unique(w)) == 1000  # 64-bit words: a collision has probability ~3e-14


def test_large_requests_bypass_the_pool():
    w = get_source(None).words(100_000)
    assert w.shape == (100_000,) and len(np.unique(w)) == 100_000


def test_secure_random_bytes_paths():
    small, large = rr.secure_random_bytes(16), rr.secure_random_bytes(1 << 17)
    assert len(small) == 16 and len(large) == 1 << 17
    # bytes are uniform: chi-square over the 256 byte values (false alarm ALPHA)
    counts = np.bincount(np.frombuffer(large, dtype=np.uint8), minlength=256)
    assert stats.chisquare(counts).pvalue > ALPHA
    assert rr.secure_random_bytes(1 << 17) != large
    with pytest.raises(PrivacyParameterError, match="n="):
        rr.secure_random_bytes(-1)


def test_large_requests_are_the_rfc8439_chacha20_keystream(monkeypatch):
    # Key and nonce are read from os.urandom for each call; with them fixed to the RFC 8439
    # section 2.3.2 values, keystream block 1 is that section's serialised block.
    pytest.importorskip("cryptography")
    entropy = {32: bytes(range(32)), 12: bytes.fromhex("000000090000004a00000000")}
    monkeypatch.setattr(rr.os, "urandom", lambda n: entropy[n])
    out = rr.secure_random_bytes(1 << 16)
    assert out[64:128].hex() == (
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
    )
    w = SecureSource().words(1 << 13)  # 64 KiB: bypasses the pool, same keystream
    assert w.tobytes() == out and w.flags.writeable


def test_without_cryptography_large_requests_read_os_urandom(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cryptography.hazmat.primitives.ciphers", None)
    calls = []
    real = os.urandom
    monkeypatch.setattr(rr.os, "urandom", lambda n: calls.append(n) or real(n))
    assert len(rr.secure_random_bytes(1 << 17)) == 1 << 17
    assert calls == [1 << 17]


def test_seeded_generator_warns_for_every_object_and_is_reproducible():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = get_source(np.random.default_rng(5)).words(10)
        b = get_source(np.random.default_rng(5)).words(10)
    insecure = [w for w in caught if issubclass(w.category, InsecureRandomnessWarning)]
    assert len(insecure) == 2  # one per object that uses a seeded generator
    assert "NOT differentially private" in str(insecure[0].message)
    np.testing.assert_array_equal(a, b)
    assert not get_source(np.random.default_rng(5)).secure


def test_insecure_warning_is_not_lost_to_an_earlier_filter():
    # an earlier warning, silenced by a filter, must not silence the later ones; and the
    # default once-per-location registry must not swallow a second object's warning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        get_source(np.random.default_rng(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for seed in range(3):  # same code location three times
            get_source(np.random.default_rng(seed))
    assert sum(issubclass(w.category, InsecureRandomnessWarning) for w in caught) == 3


def test_caller_supplied_source_warns_even_if_it_claims_to_be_secure():
    class Liar(RandomSource):
        secure = True

        def words(self, n):
            return np.zeros(n, dtype=np.uint64)

    with pytest.warns(InsecureRandomnessWarning, match="caller-supplied Liar"):
        get_source(Liar())
    assert not rr.is_trusted_source(Liar()) and rr.is_trusted_source(SecureSource())


def test_fork_while_another_thread_draws_leaves_a_working_source():
    """The at-fork handler must replace the pool lock: a thread holding it at the moment of
    fork() does not exist in the child, so the inherited lock would never be released."""
    import threading

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    stop = threading.Event()

    def draw():
        while not stop.is_set():
            rr._SECURE.words(3)

    thread = threading.Thread(target=draw, daemon=True)
    thread.start()
    failures = 0
    try:
        for _ in range(40):
            pid = os.fork()
            if pid == 0:  # child: must draw promptly, from fresh bytes
                try:
                    ok = rr._SECURE.words(4).size == 4 and rr._SECURE._pos == 32
                finally:
                    os._exit(0 if ok else 1)
            deadline = time.monotonic() + 20.0
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    failures += os.waitstatus_to_exitcode(status) != 0
                    break
                if time.monotonic() > deadline:  # hung on the inherited lock
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    failures += 1
                    break
                time.sleep(0.002)
    finally:
        stop.set()
        thread.join()
    assert failures == 0


@pytest.mark.parametrize("bad", [42, np.random.RandomState(0), "secure", 1.5])
def test_rng_of_the_wrong_type_is_refused(bad):
    with pytest.raises(PrivacyParameterError, match="rng="):
        get_source(bad)


@pytest.mark.parametrize("bad", [[0], [-3], [2**63 + 1], [1.5], [True]])
def test_integers_below_refuses_bad_bounds(bad):
    arr = np.array(bad, dtype=object if bad[0] == 2**63 + 1 else None)
    with pytest.raises(PrivacyParameterError, match="bound="):
        seeded(0).integers_below(arr)


@pytest.mark.parametrize("bound", [2, 3, 6, 7, 1000, 2**32, 2**32 + 3, 3 * 2**33, 2**62 + 5])
def test_integers_below_is_uniform(bound):
    # Chi-square on 10 equal-width bins of [0, bound) (bins differ by at most 1 value, a
    # relative imbalance of < 1e-8 for the large bounds and handled exactly for small ones).
    src = seeded(bound % 1000)
    n = 60_000
    x = src.integers_below(np.full(n, bound, dtype=np.uint64 if bound >= 2**63 else np.int64))
    assert x.dtype == np.int64 and x.min() >= 0 and x.max() < bound
    k = min(bound, 10)
    edges = [bound * i // k for i in range(k + 1)]
    counts = np.histogram(x, bins=np.array(edges, dtype=np.float64))[0]
    expected = n * np.diff(np.array(edges, dtype=np.float64)) / bound
    assert stats.chisquare(counts, expected).pvalue > ALPHA


def test_integers_below_mixed_bounds_and_bound_one():
    src = seeded(1)
    bounds = np.array([1, 1, 5, 2**40, 1, 2**33 + 1] * 1000)
    x = src.integers_below(bounds)
    assert (x[bounds == 1] == 0).all() and (x < bounds).all() and (x >= 0).all()


def test_bernoulli_is_exact_rational():
    # Binomial two-sided test of P[True] = 1/3 and = 5/7 (false alarm ALPHA each).
    src = seeded(2)
    n = 200_000
    for num, den in [(1, 3), (5, 7), (2**40, 3 * 2**40 + 1)]:
        hits = int(src.bernoulli(np.full(n, num), np.full(n, den)).sum())
        assert stats.binomtest(hits, n, num / den).pvalue > ALPHA
    assert src.bernoulli(np.zeros(5, int), np.full(5, 3)).sum() == 0
    assert src.bernoulli(np.full(5, 3), np.full(5, 3)).all()


def test_bits_and_uniform_floats():
    src = seeded(3)
    bits = src.bits(100_000)
    assert stats.binomtest(int(bits.sum()), bits.size, 0.5).pvalue > ALPHA
    u = src.uniform(100_000)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert (u * 2.0**53 == np.floor(u * 2.0**53)).all()  # on the 2**-53 grid
    assert stats.kstest(u, "uniform").pvalue > ALPHA
    v = src.uniform_open(100_000)
    assert v.min() > 0.0 and v.max() < 1.0
    assert stats.kstest(v, "uniform").pvalue > ALPHA


def test_normal_is_standard_normal():
    # Kolmogorov-Smirnov against N(0, 1) (false alarm ALPHA), plus the first two moments:
    # |mean| < 5 / sqrt(n) and |var - 1| < 5 sqrt(2 / n) (5-sigma bounds, false alarm < 1e-6).
    n = 200_000
    for src in (seeded(6), get_source(None)):
        z = src.normal(n)
        assert z.dtype == np.float64 and z.shape == (n,) and np.isfinite(z).all()
        assert stats.kstest(z, "norm").pvalue > ALPHA
        assert abs(z.mean()) < 5 / np.sqrt(n)
        assert abs(z.var() - 1.0) < 5 * np.sqrt(2.0 / n)
    # the two Box-Muller branches are independent N(0, 1) as well
    z = seeded(7).normal(n)
    assert stats.kstest(z[: n // 2], "norm").pvalue > ALPHA
    assert stats.kstest(z[n // 2 :], "norm").pvalue > ALPHA
    assert abs(np.corrcoef(z[: n // 2], z[n // 2 :])[0, 1]) < 5 / np.sqrt(n // 2)


@pytest.mark.parametrize("size", [0, 1, 5, 6])
def test_normal_is_the_documented_box_muller_transform(size):
    z = seeded(8).normal(size)
    half = (size + 1) // 2
    u = seeded(8).uniform_open(2 * half)
    r = np.sqrt(-2.0 * np.log(u[:half]))
    ref = np.concatenate([r * np.cos(2 * np.pi * u[half:]), r * np.sin(2 * np.pi * u[half:])])
    np.testing.assert_array_equal(z, ref[:size])


def test_normal_shapes_and_reproducibility():
    a = seeded(9).normal((3, 4))
    assert a.shape == (3, 4) and a.dtype == np.float64
    np.testing.assert_array_equal(a.ravel(), seeded(9).normal(12))
    assert seeded(9).normal(()).shape == ()
    assert seeded(9).normal((0, 3)).shape == (0, 3)
    assert seeded(9).normal(np.int64(3)).shape == (3,)


def test_normal_float32_is_standard_normal_with_float64_radius():
    # KS against N(0, 1) (false alarm ALPHA) and the 5-sigma moment bounds of float64 above.
    n = 200_000
    for src in (seeded(10), get_source(None)):
        z = src.normal(n, np.float32)
        assert z.dtype == np.float32 and z.shape == (n,) and np.isfinite(z).all()
        assert stats.kstest(z, "norm").pvalue > ALPHA
        assert abs(z.mean()) < 5 / np.sqrt(n)
        assert abs(z.var() - 1.0) < 5 * np.sqrt(2.0 / n)
    # the float32 draw is box_muller of box_muller_uniforms: 53-bit radius, 24-bit angle
    u1, u2 = seeded(11).box_muller_uniforms(3, np.float32)
    w = seeded(11).words(3 + 2)
    np.testing.assert_array_equal(u1, ((w[:3] >> np.uint64(11)) + 0.5) * 2.0**-53)
    np.testing.assert_array_equal(u2, (w[3:].view(np.uint32)[:3] >> 8) * 2.0**-24)
    assert u1.dtype == np.float64 and u2.dtype == np.float32
    np.testing.assert_array_equal(seeded(11).normal(6, np.float32), rr.box_muller(u1, u2))


def test_box_muller_uniforms_float64_are_uniform_open():
    u1, u2 = seeded(12).box_muller_uniforms(4)
    np.testing.assert_array_equal(np.concatenate([u1, u2]), seeded(12).uniform_open(8))
    for bad in (np.float16, np.int64, "nonsense", None):
        with pytest.raises(PrivacyParameterError, match="dtype="):
            seeded(12).box_muller_uniforms(4, bad)


@pytest.mark.parametrize("bad", [-1, 2.0, True, (2, -1), (2.5,), "3", None])
def test_normal_refuses_bad_sizes(bad):
    with pytest.raises(PrivacyParameterError, match="size="):
        seeded(0).normal(bad)


def test_big_integer_below_is_uniform_in_range():
    src = seeded(4)
    bound = 10**30 + 7
    xs = [src.big_integer_below(bound) for _ in range(20_000)]
    assert min(xs) >= 0 and max(xs) < bound
    top = np.array([x * 10 // bound for x in xs])
    assert stats.chisquare(np.bincount(top, minlength=10)).pvalue > ALPHA
    with pytest.raises(PrivacyParameterError, match="bound=0"):
        src.big_integer_below(0)


def test_custom_source_subclass():
    class Counter(RandomSource):
        secure = True

        def __init__(self) -> None:
            self.i = 0

        def words(self, n: int) -> np.ndarray:
            out = np.arange(self.i, self.i + n, dtype=np.uint64)
            self.i += n
            return out

    src = Counter()
    assert get_source(src) is src
    np.testing.assert_array_equal(src.integers_below(np.array([10, 10])), [0, 0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_reuse_the_parents_pool():
    src = get_source(None)
    src.words(1)  # make sure a pool exists
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.write(w, src.words(4).tobytes())
        os._exit(0)
    os.close(w)
    child = np.frombuffer(os.read(r, 32), dtype=np.uint64)
    os.waitpid(pid, 0)
    parent = src.words(4)
    assert not np.array_equal(child, parent)


@pytest.mark.parametrize("num,den", [([1], [0]), ([-1], [3]), ([0.5], [2]), ([1], [2.0])])
def test_bernoulli_refuses_bad_fractions(num, den):
    with pytest.raises(PrivacyParameterError, match="num/den="):
        seeded(0).bernoulli(np.array(num), np.array(den))
