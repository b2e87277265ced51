"""renyi.noise: lattice, distribution, kinds/dtypes/devices, refusals and warnings."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from renyi import noise
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError
from renyi.mechanisms import GaussianMechanism, LaplaceMechanism
from renyi.random import GeneratorSource, RandomSource, SecureSource

ALPHA = 1e-6  # false-alarm rate of each statistical check


def _gof_lattice(idx: np.ndarray, cdf) -> float:
    """Chi-square goodness of fit of lattice indices against P(k) = cdf(k+1/2) - cdf(k-1/2)."""
    lo, hi = int(idx.min()), int(idx.max())
    edges = np.arange(lo, hi + 2) - 0.5
    expected = idx.size * np.diff(cdf(edges))
    observed = np.bincount(idx - lo, minlength=expected.size).astype(float)
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], idx.size - expected[keep].sum())
    return float(stats.chi2.sf(np.sum((obs - exp) ** 2 / exp), obs.size - 1))


@pytest.mark.parametrize("x0", [0.0, 0.3, -12345.678])
def test_gaussian_is_the_rounded_gaussian_mechanism(x0):
    sigma = 1.7
    g = noise.lattice_step(sigma)
    y = noise.gaussian(np.full(200_000, x0), sigma)
    idx = np.rint(y / g).astype(np.int64)
    assert np.array_equal(idx * g, y)  # on the lattice, exactly
    # ideal: round((x0 + sigma Z) / g): P(k) = Phi(((k+1/2)g - x0)/sigma) - Phi(...)
    assert _gof_lattice(idx, lambda e: stats.norm.cdf((e * g - x0) / sigma)) > ALPHA


def test_laplace_is_the_rounded_laplace_mechanism():
    b, x0 = 3.0, 0.7
    g = noise.lattice_step(b)
    y = noise.laplace(np.full(200_000, x0), b)
    idx = np.rint(y / g).astype(np.int64)
    assert np.array_equal(idx * g, y)
    assert _gof_lattice(idx, lambda e: stats.laplace.cdf((e * g - x0) / b)) > ALPHA


def test_lattice_step_depends_only_on_the_scale():
    assert noise.lattice_step(1.0) == 0.125
    assert noise.lattice_step(15.9) == 1.0 and noise.lattice_step(16.0) == 2.0
    for s in [1e-300, 1e-5, 0.3, 7.0, 1e300]:
        g = noise.lattice_step(s)
        assert (math.frexp(g)[0] == 0.5 and 8 <= s / g < 16) or g == 2.0**-970
    with pytest.raises(PrivacyParameterError, match="scale"):
        noise.lattice_step(-1.0)


def test_kinds_dtypes_and_shapes_are_kept():
    assert isinstance(noise.gaussian(1.0, 1.0), float)
    assert isinstance(noise.laplace(3, 1.0), float)  # integers give float64
    a = noise.gaussian(np.zeros((3, 4), dtype=np.float32), 1.0)
    assert a.shape == (3, 4) and a.dtype == np.float32
    z = noise.gaussian_noise((2, 5), 0.5)
    assert z.shape == (2, 5) and z.dtype == np.float64
    assert noise.gaussian(np.zeros(0), 1.0).shape == (0,)
    assert noise.gaussian(2.5, 0.0) == 2.5  # no noise: the value on the finest lattice


def test_torch_tensors_keep_dtype_and_device_and_match_numpy():
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = noise.gaussian(torch.zeros(1000, dtype=dtype), 1.0)
        assert t.dtype == dtype and t.device.type == "cpu"
    # the same words give the same release in numpy and torch
    x = np.linspace(-3, 3, 101)
    a = noise.gaussian(x, 0.7, rng=np.random.default_rng(4))
    b = noise.gaussian(torch.from_numpy(x), 0.7, rng=np.random.default_rng(4))
    assert np.array_equal(a, b.numpy())
    c = noise.laplace(x, 0.7, rng=np.random.default_rng(4))
    d = noise.laplace(torch.from_numpy(x), 0.7, rng=np.random.default_rng(4))
    assert np.array_equal(c, d.numpy())


@pytest.mark.skipif("not __import__('torch').cuda.is_available()")
def test_cuda_tensors_stay_on_the_device():
    import torch

    t = noise.gaussian(torch.zeros(10_000, device="cuda"), 1.0)
    assert t.device.type == "cuda" and t.dtype == torch.float32
    g = noise.lattice_step(1.0)
    assert bool(torch.all(torch.remainder(t, g) == 0))


@pytest.mark.parametrize(
    "bad", [np.nan, np.inf, np.array([1.0, np.nan]), "1.0", True, np.array([1j])]
)
def test_bad_values_are_refused(bad):
    with pytest.raises(PrivacyParameterError, match="value"):
        noise.gaussian(bad, 1.0)


@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf, "1"])
def test_bad_scales_are_refused(bad):
    with pytest.raises(PrivacyParameterError, match="sigma"):
        noise.gaussian(0.0, bad)


_CN = noise.CounterNoise(bytes(32))
BIG = 2**70


@pytest.mark.parametrize(
    ("call", "name", "says"),
    [
        (lambda: noise.gaussian(BIG, 1.0), "value", r"\[-2\*\*63, 2\*\*64\)"),
        (lambda: noise.laplace([1, -BIG], 1.0), "value", r"\[-2\*\*63, 2\*\*64\)"),
        (lambda: _CN.gaussian(BIG, 1.0, stream=0, step=0), "value", r"2\*\*64\)"),
        (lambda: noise.snap(0.0, BIG, 1.0), "standard_noise", r"2\*\*64\)"),
        (lambda: noise.gaussian(0.0, 2**1100), "sigma", "largest float64"),
        (lambda: noise.lattice_step(2**1100), "scale", "largest float64"),
        (lambda: noise.gaussian_noise((BIG,), 1.0), "shape", r"2\*\*63 - 1 values"),
        (lambda: noise.gaussian_noise((2**32, 2**32), 1.0), "shape", r"2\*\*63 - 1"),
        (lambda: noise.gaussian_noise((2.5,), 1.0), "shape", "integers >= 0"),
        (lambda: noise.gaussian_integers(BIG, 1.0), "shape", r"2\*\*63 - 1 values"),
        (lambda: noise.standard_normal(2**64), "n", r"\[0, 2\*\*63\)"),
        (lambda: _CN.standard_normal(BIG, stream=0, step=0), "shape", r"2\*\*36 values"),
        (lambda: _CN.standard_normal(2**37, stream=0, step=0), "shape", r"2\*\*36 values"),
        (lambda: noise.implementation_slack(2.5), "n_values", "integer"),
        (lambda: noise.implementation_slack(5, epsilon=2**1100), "epsilon", "float64"),
        (lambda: GaussianMechanism(1.0, 1.0).release([1, BIG]), "value", r"2\*\*64\)"),
        (lambda: LaplaceMechanism(1.0, 1.0).release(-BIG), "value", r"\[-2\*\*63, 2"),
    ],
)
def test_integers_beyond_the_machine_range_get_our_error(call, name, says):
    """Python ints beyond int64/uint64 (values, noise) or float64 (scales), and sizes beyond
    what an array (or a counter stream) holds: our error naming the parameter and its range,
    never numpy's OverflowError/ValueError or a message naming the wrong parameter."""
    with pytest.raises(PrivacyParameterError, match=f"^{name}=") as err:
        call()
    assert err.match(says)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "numpy"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_keyed_releases_refuse_a_non_finite_entry_anywhere(dtype, bad):
    """The compiled pass checks finiteness in its own loop for keyed bits: an entry in the
    first, a middle (another chunk) or the last position is refused, nothing released."""
    torch = pytest.importorskip("torch")
    n = 140_001  # three chunks of the compiled pass
    for pos in (0, 70_000, n - 1):
        x = np.zeros(n)
        x[pos] = bad
        v = (
            x.astype(np.float32)
            if dtype == "numpy"
            else torch.from_numpy(x).to(getattr(torch, dtype))
        )
        with pytest.raises(PrivacyParameterError, match="non-finite"):
            _CN.gaussian(v, 1.0, stream=0, step=0)


def test_huge_counts_are_slack_not_overflow():
    """``implementation_slack`` of any integer count: exact (0 here), never OverflowError."""
    assert noise.implementation_slack(2**70) == (0.0, 0.0)
    assert noise.implementation_slack(2**1100) == (0.0, 0.0)


def test_every_finite_value_is_released_whatever_its_size():
    """No refusal that depends on the value (issue 22: |x| > 2**52 g used to raise while
    x - 0.5 released): huge values come back on the lattice, saturated at the dtype's max."""
    big = np.finfo(np.float64).max
    y = noise.gaussian(np.array([0.0, 1e300, -big, 2.0**60 + 0.5]), 1.0)
    assert np.all(np.isfinite(y)) and y[2] == -big and y[1] % 0.125 == 0
    y32 = noise.gaussian(np.full(1000, 3.4e38, dtype=np.float32), 1e36)
    assert np.all(np.isfinite(y32)) and y32.max() == np.finfo(np.float32).max


class _Zeros(RandomSource):
    secure = True  # a lie

    def words(self, n):
        return np.zeros(n, dtype=np.uint64)


class _SubclassedSecure(SecureSource):
    def words(self, n):
        return np.zeros(n, dtype=np.uint64)


@pytest.mark.parametrize("liar", [_Zeros(), _SubclassedSecure(), object(), 42])
def test_sources_that_are_not_ours_are_refused(liar):
    with pytest.raises(PrivacyParameterError, match="allow_predictable_noise"):
        noise.gaussian(0.0, 1.0, rng=liar)


def test_explicitly_allowed_caller_source_warns():
    with pytest.warns(InsecureRandomnessWarning, match="allow_predictable_noise"):
        y = noise.gaussian(0.0, 1.0, rng=_Zeros(), allow_predictable_noise=True)
    assert math.isfinite(y)


def test_seeded_sources_warn_at_every_use_and_are_reproducible():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        a = noise.gaussian(np.zeros(5), 1.0, rng=np.random.default_rng(3))
        b = noise.gaussian(np.zeros(5), 1.0, rng=np.random.default_rng(3))
        noise.gaussian(0.0, 1.0, rng=GeneratorSource(np.random.default_rng(1)))
    assert np.array_equal(a, b)
    assert sum(issubclass(w.category, InsecureRandomnessWarning) for w in caught) >= 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        noise.gaussian(0.0, 1.0)  # the default: secure, silent


def test_implementation_slack():
    e, d = noise.implementation_slack(0)
    assert e == 0 and d == 0
    e, d = noise.implementation_slack(10**9, epsilon=2.0)
    assert e == 0.0 and d == 0.0  # exact index; the tail (< 2**-10000) is 0 in floats
    e, d = noise.implementation_slack(10**14)  # issue 23's target: <= 1e-6 and <= 1e-12
    assert e <= 1e-6 and d <= 1e-12
    with pytest.raises(PrivacyParameterError):
        noise.implementation_slack(-1)


def test_torch_and_numpy_kernels_release_the_same_bytes():
    """The torch ops (the CUDA path, run here on the CPU) and the numpy ops give the same
    releases from the same bits: the index is exact, the bytes canonical."""
    torch = pytest.importorskip("torch")
    from renyi.noise import _kernel

    rng = np.random.default_rng(9)
    for kind in ("gaussian", "laplace"):
        cn = noise.CounterNoise(bytes(range(32)))
        x = rng.normal(size=5001) * 3
        ref = getattr(cn, kind)(x, 0.9, stream=3, step=1)
        bits = noise._CounterBits(cn._key, kind, 3, 1)
        got = noise._release_flat(kind, x, 0.9, bits, 0, _kernel.Ops(np), np.dtype(np.float64))
        np.testing.assert_array_equal(got, ref)
        for device_path in (False, True):  # OpenSSL keystream; torch ChaCha20 (GPU path)
            bits = noise._CounterBits(cn._key, kind, 3, 1)
            t = noise._release_flat(
                kind,
                torch.from_numpy(x),
                0.9,
                bits,
                0,
                _kernel.Ops(torch),
                torch.float64,
                torch.device("cpu"),
                device_path=device_path,
            )
            np.testing.assert_array_equal(t.numpy(), ref)


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_and_array_kernels_release_the_same_bytes(kind, dtype, monkeypatch):
    """The numba pass (when installed) and the numpy/torch operations: the same bytes."""
    pytest.importorskip("numba")
    cn = noise.CounterNoise(bytes(range(32)))
    x = (np.random.default_rng(1).normal(size=70_001) * 5).astype(dtype)
    x[:8] = [0.0, -0.0, 1e-30, -1e-30, 0.0625, -0.0625, 3e38, -3e38]
    fused = getattr(cn, kind)(x, 1.1, stream=6, step=9, offset=3)
    monkeypatch.setattr(noise, "_USE_FUSED", False)
    array = getattr(cn, kind)(x, 1.1, stream=6, step=9, offset=3)
    assert fused.tobytes() == array.tobytes()


def test_threaded_release_is_the_same_bytes():
    """Large CPU releases run chunks on torch's intra-op thread count: the same bytes."""
    torch = pytest.importorskip("torch")
    cn = noise.CounterNoise(bytes(range(32)))
    x = torch.linspace(-3, 3, 300_001)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cn.gaussian(x, 0.7, stream=4, step=2, offset=5)
        torch.set_num_threads(3)
        three = cn.gaussian(x, 0.7, stream=4, step=2, offset=5)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, three)


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_precision_tensors_release_the_same_bytes_on_both_paths(kind, name, monkeypatch):
    """float16/bfloat16 CPU tensors take the float32 pass then one rounding to their dtype;
    the torch operations in the half dtype's compute path give the same bytes."""
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, name)
    cn = noise.CounterNoise(bytes(range(32)))
    x = (torch.randn(9001, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    x[:4] = torch.tensor([0.0, -0.0, float(torch.finfo(dtype).max), -0.01]).to(dtype)
    a = getattr(cn, kind)(x, 0.3, stream=1, step=1)
    monkeypatch.setattr(noise, "_USE_FUSED", False)
    b = getattr(cn, kind)(x, 0.3, stream=1, step=1)
    assert a.dtype == b.dtype == dtype
    assert a.view(torch.int16).tolist() == b.view(torch.int16).tolist()
    assert bool(torch.isfinite(a).all()) and not bool(((a == 0) & a.signbit()).any())


def test_gaussian_integers_are_the_indices_of_the_pure_noise_release():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        k, g = noise.gaussian_integers((40, 25), 2.0, rng=np.random.default_rng(3))
        y = noise.gaussian_noise((40, 25), 2.0, rng=np.random.default_rng(3))
    assert k.dtype == np.int64 and k.shape == (40, 25) and g == noise.lattice_step(2.0)
    assert np.array_equal(k * g, y)
    assert abs(float(np.std(k * g)) - 2.0) < 0.2
