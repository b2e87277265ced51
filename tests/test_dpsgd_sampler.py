"""Batch samplers of DP-SGD: the randomness must be exactly what the accountant analyses.

Statistical tests use a fixed seed (deterministic) and a stated false-alarm rate: the
threshold is the (1 - ALPHA) quantile of the test statistic under the null hypothesis, so a
correct sampler would fail a fresh seed with probability ALPHA.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

torch = pytest.importorskip("torch")

import renyi.random as rr  # noqa: E402
from renyi.dpsgd.sampler import (  # noqa: E402
    FixedSizeSampler,
    PoissonSampler,
    SecureRandomSource,
    SeededRandomSource,
    make_random_source,
)
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError  # noqa: E402
from renyi.events import (  # noqa: E402
    GaussianEvent,
    Neighbouring,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
)

pytestmark = pytest.mark.torch
ALPHA = 1e-4  # false-alarm rate of every statistical test below


@pytest.fixture(autouse=True)
def _quiet_insecure() -> None:
    warnings.simplefilter("ignore", InsecureRandomnessWarning)


def _seeded(seed: int = 1) -> SeededRandomSource:
    return SeededRandomSource(seed)


def _binomial_gof_pvalue(sizes: np.ndarray, n: int, q: float) -> float:
    """Chi-square goodness of fit of observed sizes to Binomial(n, q), tail bins merged."""
    support = np.arange(n + 1)
    pmf = stats.binom.pmf(support, n, q)
    counts = np.bincount(sizes, minlength=n + 1).astype(float)
    expected = pmf * len(sizes)
    # merge bins from both tails until every merged bin expects >= 5
    edges = []
    acc = 0.0
    for k in range(n + 1):
        acc += expected[k]
        if acc >= 5:
            edges.append(k)
            acc = 0.0
    edges[-1] = n
    obs_b, exp_b, start = [], [], 0
    for e in edges:
        obs_b.append(counts[start : e + 1].sum())
        exp_b.append(expected[start : e + 1].sum())
        start = e + 1
    stat = float(np.sum((np.array(obs_b) - np.array(exp_b)) ** 2 / np.array(exp_b)))
    return float(stats.chi2.sf(stat, len(obs_b) - 1))


@pytest.mark.parametrize("n,q", [(200, 0.05), (50, 0.3), (1000, 0.003)])
def test_poisson_batch_sizes_are_binomial(n: int, q: float) -> None:
    steps = 3000
    s = PoissonSampler(n, q, steps, random_source=_seeded(n))
    sizes = np.array([len(b) for b in s])
    assert len(sizes) == steps
    assert _binomial_gof_pvalue(sizes, n, q) > ALPHA


def test_poisson_batch_sizes_binomial_with_secure_source() -> None:
    # the default (secure) source is not seedable: this test is random, false alarm 1e-6
    n, q, steps = 100, 0.1, 2000
    s = PoissonSampler(n, q, steps)
    assert isinstance(s.random_source, SecureRandomSource)
    sizes = np.array([len(b) for b in s])
    assert _binomial_gof_pvalue(sizes, n, q) > 1e-6


def test_poisson_each_example_included_independently_with_rate_q() -> None:
    n, q, steps = 300, 0.1, 2000
    s = PoissonSampler(n, q, steps, random_source=_seeded(7))
    masks = np.zeros((steps, n), dtype=bool)
    for t, b in enumerate(s):
        masks[t, b] = True
    counts = masks.sum(axis=0)
    # each count ~ Binomial(steps, q); the sum of squared z-scores ~ chi2(n) (normal approx.)
    z2 = (counts - steps * q) ** 2 / (steps * q * (1 - q))
    assert stats.chi2.sf(z2.sum(), n) > ALPHA
    # pairwise independence of two fixed examples: 2x2 contingency table
    table = np.array(
        [
            [np.sum(masks[:, 0] & masks[:, 1]), np.sum(masks[:, 0] & ~masks[:, 1])],
            [np.sum(~masks[:, 0] & masks[:, 1]), np.sum(~masks[:, 0] & ~masks[:, 1])],
        ]
    )
    assert stats.chi2_contingency(table)[1] > ALPHA


def test_poisson_yields_empty_batches_and_indices_are_valid() -> None:
    s = PoissonSampler(20, 0.01, 200, random_source=_seeded(3))
    batches = list(s)
    assert len(batches) == len(s) == 200
    assert any(len(b) == 0 for b in batches)  # P(no empty batch) = (1 - 0.99^20)^200 ~ 1e-146
    for b in batches:
        assert len(set(b)) == len(b)
        assert all(0 <= i < 20 for i in b)


def test_poisson_expected_batch_size_and_event() -> None:
    s = PoissonSampler(1000, 0.0256, 10)
    assert s.expected_batch_size == pytest.approx(25.6, rel=1e-15)  # not floored
    assert s.neighbouring is Neighbouring.ADD_REMOVE
    assert s.accounting_event(1.3) == PoissonSampledEvent(0.0256, GaussianEvent(1.3))


def test_fixed_size_batches_are_uniform_subsets() -> None:
    n, b, steps = 30, 7, 3000
    s = FixedSizeSampler(n, b, steps, random_source=_seeded(11))
    counts = np.zeros(n)
    for batch in s:
        assert len(batch) == b and len(set(batch)) == b
        counts[batch] += 1
    # counts ~ multinomial-like with mean steps*b/n; chi-square with n-1 dof (exact sum)
    expected = steps * b / n
    stat = np.sum((counts - expected) ** 2 / expected) * (n - 1) / (n - b)
    # variance correction: Var(count_i) = steps*(b/n)(1-b/n); chi2 scaled accordingly
    assert stats.chi2.sf(stat, n - 1) > ALPHA


def test_fixed_size_event_is_replace_one_with_sensitivity_2c() -> None:
    s = FixedSizeSampler(100, 10, 5)
    assert s.neighbouring is Neighbouring.REPLACE_ONE
    event = s.accounting_event(2.0)
    assert event == SampledWithoutReplacementEvent(
        100, 10, GaussianEvent(1.0, neighbouring=Neighbouring.REPLACE_ONE)
    )
    # Replacing one example moves a sum of vectors of norm <= C by up to 2C: the noise
    # N(0, (sigma C)^2) is then sigma/2 times that sensitivity.
    c, sigma = 1.0, 2.0
    g_old, g_new = np.array([c, 0.0]), np.array([-c, 0.0])
    sensitivity = np.linalg.norm(g_new - g_old)
    assert event.event.noise_multiplier == pytest.approx(sigma * c / sensitivity)


def test_sampler_state_dict_resumes_the_same_sequence() -> None:
    full = PoissonSampler(50, 0.2, 12, random_source=_seeded(5))
    reference = list(full)
    first = PoissonSampler(50, 0.2, 12, random_source=_seeded(5))
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    second = PoissonSampler(50, 0.2, 12, random_source=_seeded(999))
    second.load_state_dict(state)
    tail = list(second)
    assert head + tail == reference


def test_secure_source_state_cannot_be_loaded_into_seeded() -> None:
    with pytest.raises(PrivacyParameterError, match="kind"):
        _seeded().load_state_dict(SecureRandomSource().state_dict())


def test_uniforms_are_in_open_unit_interval() -> None:
    for src in (SecureRandomSource(), _seeded()):
        u = src.uniform(100_000)
        assert u.dtype == torch.float64
        assert float(u.min()) > 0.0 and float(u.max()) < 1.0
        # mean of U(0,1): z-test, two-sided, false alarm ALPHA
        z = (float(u.mean()) - 0.5) / np.sqrt(1 / 12 / u.numel())
        assert abs(z) < stats.norm.isf(ALPHA / 2)


def test_seeded_source_warns_insecure() -> None:
    rr._reset_insecure_warning()  # one warning flag for the package: renyi.random's
    with pytest.warns(InsecureRandomnessWarning, match="torch.Generator"):
        make_random_source(seed=1)
    assert isinstance(make_random_source(None), SecureRandomSource)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_samples": 0, "sample_rate": 0.1, "steps": 1},
        {"num_samples": 10, "sample_rate": 0.0, "steps": 1},
        {"num_samples": 10, "sample_rate": 1.5, "steps": 1},
        {"num_samples": 10, "sample_rate": float("nan"), "steps": 1},
        {"num_samples": 10, "sample_rate": 0.1, "steps": 0},
        {"num_samples": 10, "sample_rate": 0.1, "steps": 2.0},
    ],
)
def test_poisson_refuses_bad_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(PrivacyParameterError):
        PoissonSampler(**kwargs)  # type: ignore[arg-type]


def test_fixed_size_refuses_batch_larger_than_data() -> None:
    with pytest.raises(PrivacyParameterError, match="batch_size"):
        FixedSizeSampler(10, 11, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_secure_normal_is_standard_normal(dtype: torch.dtype) -> None:
    # random (secure source): false alarm ALPHA per assertion
    z = SecureRandomSource().normal((200_001,), dtype)
    assert z.dtype == dtype and z.shape == (200_001,)
    x = z.double().numpy()
    assert stats.kstest(x, "norm").pvalue > ALPHA
    k = x.size
    assert stats.chi2.ppf(ALPHA / 2, k) < float(np.sum(x**2)) < stats.chi2.isf(ALPHA / 2, k)
    # tails: P(|Z| > 3) = 0.0027; binomial two-sided test on the count
    tail = int(np.sum(np.abs(x) > 3))
    assert stats.binomtest(tail, k, 2 * stats.norm.sf(3)).pvalue > ALPHA


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_secure_source_is_renyi_noise_sampler_in_torch(dtype: torch.dtype) -> None:
    # The adapter adds no transform of its own: on the same words it gives renyi.noise's
    # full-precision normals (the sampler behind every lattice release), rounded to dtype.
    from renyi import noise

    src = SecureRandomSource()
    assert isinstance(src.source, rr.SecureSource)
    src.source = rr.GeneratorSource(np.random.default_rng(4))
    z = src.normal((3, 5), dtype)
    assert z.dtype == dtype and z.shape == (3, 5)
    ref = noise.standard_normal(
        15, rng=rr.GeneratorSource(np.random.default_rng(4)), torch_kernel=True
    )
    np.testing.assert_array_equal(z.numpy(), ref.reshape(3, 5).to(dtype).numpy())
    src.source = rr.GeneratorSource(np.random.default_rng(4))
    u = src.uniform(7)
    np.testing.assert_array_equal(
        u.numpy(), rr.GeneratorSource(np.random.default_rng(4)).uniform_open(7)
    )
