"""Release time must not follow the noise drawn (Jin et al. 2022's timing channel).

Statistical and robust to a loaded machine: each test times single releases at scale 1000
and compares the *distribution* of times across |noise| deciles (rank correlation, and the
median time per decile relative to the overall median), never absolute times. The same test
applied to the former exact samplers (whose loops run longer for larger |noise|) fails: see
``test_the_direct_exact_sampler_does_leak_time``.
"""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from renyi.mechanisms import DiscreteGaussianMechanism, DiscreteLaplaceMechanism, LaplaceMechanism
from renyi.random import get_source
from renyi.samplers import _discrete_laplace_int

CALLS = 20_000
MAX_RHO = 0.05


def _timed(release, calls: int = CALLS) -> tuple[np.ndarray, np.ndarray]:
    release()  # warm up (imports, first pool fill)
    times = np.empty(calls)
    sizes = np.empty(calls)
    clock = time.perf_counter_ns
    for i in range(calls):
        t0 = clock()
        y = release()
        times[i] = clock() - t0
        sizes[i] = abs(float(y))
    return times, sizes


def _decile_medians(times: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    edges = np.quantile(sizes, np.linspace(0, 1, 11))
    which = np.clip(np.searchsorted(edges, sizes, side="right") - 1, 0, 9)
    return np.array([np.median(times[which == d]) for d in range(10) if (which == d).any()])


@pytest.mark.parametrize(
    "mech",
    [
        DiscreteLaplaceMechanism(1000, 1),
        LaplaceMechanism(1000.0, 1.0),
        DiscreteGaussianMechanism(1000**2, 1),
    ],
    ids=["discrete-laplace", "laplace", "discrete-gaussian"],
)
def test_release_time_does_not_follow_the_noise(mech):
    times, sizes = _timed(lambda: mech.release(0))
    rho = stats.spearmanr(times, sizes).statistic
    assert abs(rho) <= MAX_RHO, rho
    med = _decile_medians(times, sizes)
    assert med.max() <= 1.25 * np.median(times) and med.min() >= 0.8 * np.median(times)


def test_the_direct_exact_sampler_does_leak_time():
    """The planted bug: CKS Alg. 2 drawn per release (no pool) loops longer for larger
    |noise|; the same statistic sees it with a twentieth of the calls."""
    src = get_source(None)
    times, sizes = _timed(lambda: int(_discrete_laplace_int(1000, 1, 1, src)[0]), CALLS // 20)
    assert stats.spearmanr(times, sizes).statistic > 3 * MAX_RHO


def test_pools_are_not_shared_with_a_forked_child():
    import os

    from renyi import samplers

    m = DiscreteLaplaceMechanism(Fraction(1000), 1)
    m.release(0)  # fills the pool
    assert samplers._POOLS._pools
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child must start without the parent's pre-drawn noise
        os.close(r)
        fresh = not samplers._POOLS._pools and not samplers._POOLS._lock.locked()
        m.release(0)
        os.write(w, b"1" if fresh else b"0")
        os._exit(0)
    os.close(w)
    answer = os.read(r, 1)
    os.waitpid(pid, 0)
    os.close(r)
    assert answer == b"1"
