"""CounterNoise: noise that is a function of a key and a counter (issue 23, item 3).

The same key and counters give the same noise; disjoint offset ranges are consistent slices
(distributed ranks); a checkpoint needs only the key; and a correlated-noise filter that keeps
no past noise, regenerating it from the counters, releases exactly what the version that
stores its past noise releases.
"""

from __future__ import annotations

import numpy as np
import pytest

from renyi import noise
from renyi.errors import PrivacyParameterError

KEY = bytes(range(7, 39))


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_same_key_and_counters_same_noise_and_slices_agree(kind):
    cn = noise.CounterNoise(KEY)
    release = getattr(cn, kind)
    x = np.linspace(-2, 2, 1001)
    whole = release(x, 0.8, stream=2, step=5)
    assert np.array_equal(whole, release(x, 0.8, stream=2, step=5))
    parts = [
        release(x[a:b], 0.8, stream=2, step=5, offset=a)
        for a, b in [(0, 1), (1, 334), (334, 335), (335, 1001)]
    ]  # odd offsets cut Gaussian pairs
    assert np.array_equal(np.concatenate(parts), whole)
    other = noise.CounterNoise.from_state_dict(cn.state_dict())
    assert np.array_equal(getattr(other, kind)(x, 0.8, stream=2, step=5), whole)
    assert not np.array_equal(release(x, 0.8, stream=2, step=6), whole)
    assert not np.array_equal(release(x, 0.8, stream=3, step=5), whole)
    assert not np.array_equal(getattr(noise.CounterNoise(), kind)(x, 0.8, stream=2, step=5), whole)


def test_standard_normal_regenerates_and_is_standard():
    cn = noise.CounterNoise(KEY)
    z = cn.standard_normal(200_000, stream=1, step=0)
    assert np.array_equal(z[7:9], cn.standard_normal(2, stream=1, step=0, offset=7))
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.01
    torch = pytest.importorskip("torch")
    t = cn.standard_normal((4, 5), stream=1, step=0, like=torch.zeros(1))
    assert t.dtype == torch.float64 and t.shape == (4, 5)
    np.testing.assert_allclose(t.reshape(-1).numpy(), z[:20], rtol=1e-14)


def test_counters_and_keys_are_checked_and_the_key_is_not_shown():
    with pytest.raises(PrivacyParameterError, match="key"):
        noise.CounterNoise(b"short")
    cn = noise.CounterNoise(KEY)
    assert KEY.hex() not in repr(cn)
    for bad in (
        {"stream": -1, "step": 0},
        {"stream": 2**24, "step": 0},
        {"stream": 0, "step": 2**64},
        {"stream": 0, "step": 0, "offset": 2**36},
    ):
        with pytest.raises(PrivacyParameterError):
            cn.gaussian(np.zeros(2), 1.0, **bad)
    with pytest.raises(PrivacyParameterError, match="state"):
        noise.CounterNoise.from_state_dict({"kind": "something else"})


def test_a_filter_without_stored_noise_releases_what_the_stored_version_releases():
    """Banded correlated noise y_t = sum_m b_m z_{t-m}: one version keeps the last bands-1
    draws, the other keeps nothing and regenerates them from the counters (memory of
    DP-SGD); both release y_t through snap: the same bytes at every step."""
    cn = noise.CounterNoise(KEY)
    b = np.array([1.0, -0.45, 0.2])
    d, steps, sigma = 257, 9, 1.3
    grads = np.random.default_rng(0).normal(size=(steps, d))
    stored: list[np.ndarray] = []
    for t in range(steps):
        z_t = cn.standard_normal(d, stream=11, step=t)
        stored = [z_t, *stored][: len(b)]
        y_kept = sum(b[m] * stored[m] for m in range(len(stored)))
        y_regen = sum(
            b[m] * cn.standard_normal(d, stream=11, step=t - m) for m in range(min(t + 1, len(b)))
        )
        a = noise.snap(grads[t], y_kept, sigma)
        c = noise.snap(grads[t], y_regen, sigma)
        assert a.tobytes() == c.tobytes()
