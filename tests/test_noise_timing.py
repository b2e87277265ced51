"""Release time must not follow the noise drawn, nor the input (Jin et al. 2022's timing
channel; issue 22 item 3).

Every test is rank-based and robust to a loaded 2-core machine (it once failed at load
average 20 with rho = -0.097): times are compared only with times measured around them —
the noise tests divide each time by the median of its neighbours (a rolling median removes
load drifts) before the rank correlation; the input tests interleave the two inputs in a
random order and compare their time samples by rank (AUC of the Mann-Whitney statistic).
The noise tests bound the size of a leak (the median time of the largest fifth of |noise|
against the smallest: within 5 %; with 4,000 calls a fifth the null spread of that ratio is
about 0.3 %, so a false alarm needs over 15 standard deviations, p < 1e-40, at any load);
|AUC - 1/2| > 0.1 on 2 x 2,000 interleaved calls is 15 standard deviations (p < 1e-40);
|rho| > 0.12 over 1,200 vector releases (slow suite) is 4 (p < 1e-4). A real leak of the sizes found
before (the former path switch at 2**62: 11.6 vs 8.8 us; vectors of >= 4096 values: rho =
0.21) is far beyond each threshold; see ``test_the_direct_exact_sampler_does_leak_time``.
"""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest
from scipy import ndimage, stats

from renyi import noise
from renyi.mechanisms import DiscreteGaussianMechanism, DiscreteLaplaceMechanism, LaplaceMechanism
from renyi.random import get_source
from renyi.samplers import _discrete_laplace_int

CALLS = 20_000
MAX_GAP = 0.05
MAX_AUC_GAP = 0.1


def _detrended(times: np.ndarray) -> np.ndarray:
    """Each time over the median of the 101 calls around it (load drift removed)."""
    return times / ndimage.median_filter(times, size=101, mode="nearest")


def _timed(release, calls: int = CALLS) -> tuple[np.ndarray, np.ndarray]:
    release()  # warm up (imports, first pool fill)
    times = np.empty(calls)
    sizes = np.empty(calls)
    clock = time.perf_counter_ns
    for i in range(calls):
        t0 = clock()
        y = release()
        times[i] = clock() - t0
        sizes[i] = float(np.abs(np.asarray(y, dtype=np.float64)).sum())
    return _detrended(times), sizes


def _quintile_gap(times: np.ndarray, sizes: np.ndarray) -> float:
    """Median (detrended) time of the largest fifth of |noise| over that of the smallest,
    minus 1: the size of a leak, not merely its detectability (a rank correlation on 20,000
    drift-free calls flags differences of a nanosecond, e.g. CPython's cached small ints)."""
    lo, hi = np.quantile(sizes, [0.2, 0.8])
    return float(np.median(times[sizes >= hi]) / np.median(times[sizes <= lo]) - 1.0)


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
    assert abs(_quintile_gap(times, sizes)) <= MAX_GAP


def test_the_direct_exact_sampler_does_leak_time():
    """The planted bug: CKS Alg. 2 drawn per release (no pool) loops longer for larger
    |noise|; the same statistic sees it with a twentieth of the calls."""
    src = get_source(None)
    times, sizes = _timed(lambda: int(_discrete_laplace_int(1000, 1, 1, src)[0]), CALLS // 20)
    assert _quintile_gap(times, sizes) > 3 * MAX_GAP


def _auc_gap(release, a, b, calls: int = 2000) -> float:
    """|AUC - 1/2| between the time samples of ``release(a)`` and ``release(b)``, called
    interleaved in a random order (the same load hits both)."""
    release(a), release(b)
    order = np.random.default_rng(0).permutation(np.repeat([0, 1], calls))
    t = {0: [], 1: []}
    clock = time.perf_counter_ns
    for which in order:
        x = a if which == 0 else b
        t0 = clock()
        release(x)
        t[which].append(clock() - t0)
    u = stats.mannwhitneyu(t[0], t[1]).statistic
    return abs(u / calls**2 - 0.5)


@pytest.mark.parametrize(
    "mech",
    [DiscreteLaplaceMechanism(1000, 1), DiscreteGaussianMechanism(1000**2, 1)],
    ids=["discrete-laplace", "discrete-gaussian"],
)
@pytest.mark.parametrize("a, b", [(2**62 - 1, 2**62), (-(2**62), -(2**62) + 1)])
def test_integer_mechanisms_take_one_path_across_their_range(mech, a, b):
    """Neighbouring inputs at the range edges (the former int64/Python-int switch). Inputs far
    apart differ in a way that is no leak: CPython returns its cached small ints (outputs in
    [-5, 256]) a few nanoseconds faster, a function of the released value itself."""
    assert _auc_gap(mech.release, a, b) <= MAX_AUC_GAP


def test_integer_mechanisms_refuse_by_the_public_bound():
    from renyi.errors import PrivacyParameterError

    for mech in (DiscreteLaplaceMechanism(1000, 1), DiscreteGaussianMechanism(1000**2, 1)):
        with pytest.raises(PrivacyParameterError, match="2\\*\\*62"):
            mech.release(2**62 + 1)
        assert isinstance(mech.release(2**62), int)


@pytest.mark.parametrize("a, b", [(-0.01, 0.01), (0.0, 1.7976931348623157e308)])
def test_lattice_release_time_does_not_follow_the_input(a, b):
    assert _auc_gap(lambda x: noise.gaussian(x, 1.0), a, b) <= MAX_AUC_GAP


def test_vector_releases_of_any_size_are_served_from_the_pools():
    from renyi import samplers

    assert samplers._pooled(get_source(None), 10**6)  # was: only below 4096 values


@pytest.mark.slow
def test_vector_releases_do_constant_work_per_coordinate():
    """Vectors of 4100 values (above the former 4096 cut-off of the pools): rho = 0.21 then."""
    mech = DiscreteLaplaceMechanism(1000, 1, dimension=4100)
    x = np.zeros(4100, dtype=np.int64)
    times, sizes = _timed(lambda: mech.release(x), 1200)
    rho = stats.spearmanr(times, sizes).statistic
    assert abs(rho) <= 0.12, rho


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
