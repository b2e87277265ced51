"""Issue 22 item 4: the samplers' randomness is checked like the noise's.

A caller-made source that returns zeros puts every example in every Poisson batch (batches
of 100 instead of ~10) while the accountant charges q = 0.1; it must be refused, by exact
type, unless the caller opts in with ``allow_predictable_sampling=True`` (then it warns).
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from renyi.dpsgd.sampler import (  # noqa: E402
    BallsInBinsSampler,
    FixedSizeSampler,
    PoissonSampler,
    SecureRandomSource,
    SeededRandomSource,
    ShuffleSampler,
    TorchRandomSource,
    TruncatedPoissonSampler,
)
from renyi.errors import InsecureRandomnessWarning, PrivacyParameterError  # noqa: E402
from renyi.random import RandomSource  # noqa: E402


class Zeros(TorchRandomSource):
    """A liar: every uniform is (almost) 0, so every example is always sampled."""

    secure = True

    def uniform(self, n):
        return torch.full((n,), 2.0**-54, dtype=torch.float64)

    def normal(self, shape, dtype):
        return torch.zeros(shape, dtype=dtype)

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class SubclassedSecure(SecureRandomSource):
    def uniform(self, n):
        return torch.full((n,), 2.0**-54, dtype=torch.float64)


SAMPLERS = [
    lambda src, **k: PoissonSampler(100, 0.1, 3, random_source=src, **k),
    lambda src, **k: TruncatedPoissonSampler(100, 0.1, 3, random_source=src, **k),
    lambda src, **k: FixedSizeSampler(100, 10, 3, random_source=src, **k),
    lambda src, **k: BallsInBinsSampler(100, 10, 3, random_source=src, **k),
    lambda src, **k: ShuffleSampler(100, 10, 3, random_source=src, **k),
]


@pytest.mark.parametrize("make", SAMPLERS)
@pytest.mark.parametrize("liar", [Zeros(), SubclassedSecure(), object()])
def test_sampler_liars_are_refused(make, liar):
    with pytest.raises(PrivacyParameterError, match="allow_predictable_sampling"):
        make(liar)


def test_poisson_liar_is_refused_and_only_runs_when_allowed_with_a_warning():
    with pytest.raises(PrivacyParameterError, match="random_source"):
        PoissonSampler(100, 0.1, 3, random_source=Zeros())
    with pytest.warns(InsecureRandomnessWarning, match="allow_predictable_sampling"):
        s = PoissonSampler(100, 0.1, 3, random_source=Zeros(), allow_predictable_sampling=True)
    assert [len(b) for b in s] == [100, 100, 100]  # what the liar does, now the caller's call


def test_a_tampered_secure_source_is_refused_at_use():
    src = SecureRandomSource()
    sampler = PoissonSampler(100, 0.1, 3, random_source=src)

    class Words(RandomSource):
        secure = True

        def words(self, n):
            import numpy as np

            return np.zeros(n, dtype=np.uint64)

    src.source = Words()
    with pytest.raises(PrivacyParameterError, match="random_source"):
        next(iter(sampler))


def test_renyi_sources_are_accepted():
    assert isinstance(PoissonSampler(100, 0.1, 3).random_source, SecureRandomSource)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureRandomnessWarning)
        seeded = SeededRandomSource(1)
    sizes = [len(b) for b in PoissonSampler(100, 0.1, 50, random_source=seeded)]
    assert 5 < sum(sizes) / len(sizes) < 15
