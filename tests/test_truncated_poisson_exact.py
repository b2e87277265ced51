"""Truncated Poisson sampling, checked exactly (issue 30, item 2).

The PLD of :class:`TruncatedPoissonSampledEvent` is a branch-revealed mixture (docs/
subsampling.md, "Truncated Poisson: the argument"): with probability ``1 - p`` the
Poisson-subsampled Gaussian with shift 1, with ``p = P[Binomial(n, q) >= B]`` the one with
shift 2, both at rate ``q``. dp_accounting and jax_privacy use the symmetrised (replace-one)
pair there and report more (6.3404 where we report 5.9128 at n = 20 000, b = cap = 200,
sigma = 1.2, T = 1000, delta = 1e-5); this file checks that ours is not optimistic.

For small datasets the mechanism's output law is enumerated exactly: every Poisson sample
``S`` of the ``n`` records (probability ``q^|S| (1-q)^(n-|S|)``), cut to each ``B``-subset with
equal probability when ``|S| > B``, gives a Gaussian ``N(sum of its gradients, sigma^2)``. Both
neighbouring datasets (``D`` and ``D + {x}``) are such mixtures on the line (1-D gradients
suffice: the extreme case, every other record at ``-C`` and ``x`` at ``+C``, moves the sum
by ``2C``), and their hockey-stick divergence in both orders is computed exactly (crossing
points by root finding, interval masses by the normal CDF). The single-step PLD bound must
be at least that for every dataset: a worst-case search over gradients in ``[-1, 1]``
(extremes, random draws and coordinate ascent on the exact divergence) would expose an
optimistic bound.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import logsumexp, ndtr

from renyi.analysis.events import GaussianEvent, TruncatedPoissonSampledEvent

H = 1e-3  # a coarser grid only loosens the (pessimistic) bound; 10x fewer points


def mixture(grads: list[float], q: float, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(means, weights) of the output law of truncated Poisson sampling on ``grads``."""
    n = len(grads)
    atoms: dict[float, float] = defaultdict(float)
    for mask in itertools.product((0, 1), repeat=n):
        k = sum(mask)
        w = q**k * (1.0 - q) ** (n - k)
        chosen = [g for g, m in zip(grads, mask, strict=True) if m]
        if k <= cap:
            atoms[round(sum(chosen), 12)] += w
            continue
        subsets = list(itertools.combinations(chosen, cap))
        for sub in subsets:
            atoms[round(sum(sub), 12)] += w / len(subsets)
    means = np.array(sorted(atoms))
    return means, np.array([atoms[m] for m in means])


def hockey_stick(p: tuple, q: tuple, sigma: float, eps: float) -> float:
    """``sup_S P(S) - e^eps Q(S)`` for two Gaussian mixtures with common ``sigma``, exactly:
    the set where ``log p - log q > eps`` is a union of intervals between crossing points."""
    (mp, wp), (mq, wq) = p, q

    def fs(y: np.ndarray) -> np.ndarray:
        lp = logsumexp(-0.5 * ((y[:, None] - mp) / sigma) ** 2, b=wp, axis=1)
        lq = logsumexp(-0.5 * ((y[:, None] - mq) / sigma) ** 2, b=wq, axis=1)
        return np.asarray(lp - lq - eps)

    def f(y: float) -> float:
        return float(fs(np.array([y]))[0])

    lo = min(mp.min(), mq.min()) - 40 * sigma
    hi = max(mp.max(), mq.max()) + 40 * sigma
    ys = np.linspace(lo, hi, 4001)
    vals = fs(ys)
    cuts = [brentq(f, ys[i], ys[i + 1], xtol=1e-14) for i in np.flatnonzero(np.diff(vals > 0))]
    edges = np.array([-np.inf, *cuts, np.inf])
    total = 0.0
    for a, b in itertools.pairwise(edges):
        mid = 0.5 * (max(a, lo) + min(b, hi))
        if f(mid) <= 0:
            continue

        def mass(m: np.ndarray, w: np.ndarray, a: float = a, b: float = b) -> float:
            return float(np.sum(w * (ndtr((b - m) / sigma) - ndtr((a - m) / sigma))))

        total += mass(mp, wp) - math.exp(eps) * mass(mq, wq)
    return max(total, 0.0)


def exact_deltas(grads, x, q, cap, sigma, eps_grid):
    """Exact delta(eps) of (M(D + x), M(D)) ("remove") and (M(D), M(D + x)) ("add")."""
    small = mixture(grads, q, cap)
    big = mixture([*grads, x], q, cap)
    rem = [hockey_stick(big, small, sigma, e) for e in eps_grid]
    add = [hockey_stick(small, big, sigma, e) for e in eps_grid]
    return np.array(rem), np.array(add)


def bound_deltas(n, q, cap, sigma, eps_grid):
    """Our single-step PLD upper bounds for a dataset of ``n`` records (``D``, the smaller
    neighbour: ``p = P[Bin(n, q) >= B]``, exact for it)."""
    ev = TruncatedPoissonSampledEvent(n, q, cap, GaussianEvent(sigma))
    rem, add = ev.pld_pair(value_discretization_interval=H, tail_mass=1e-15, max_bins=1 << 17)
    eps = np.asarray(eps_grid)
    return (
        np.asarray(rem.delta_for_epsilon(eps).upper),
        np.asarray(add.delta_for_epsilon(eps).upper),
    )


EPS = [0.0, 0.25, 0.5, 1.0, 2.0]
# the round-off of the exact computation (root finding, CDF differences): far below the
# margins by which the bound exceeds the truth in the cases below (>= 1e-3 relative)
TOL = 1e-9


def _check(grads, x, q, cap, sigma):
    ex_r, ex_a = exact_deltas(grads, x, q, cap, sigma, EPS)
    up_r, up_a = bound_deltas(len(grads), q, cap, sigma, EPS)
    assert np.all(ex_r <= up_r + TOL), (grads, x, ex_r, up_r)
    assert np.all(ex_a <= up_a + TOL), (grads, x, ex_a, up_a)
    return ex_r, ex_a, up_r, up_a


@pytest.mark.parametrize(
    ("n", "q", "cap", "sigma"),
    [(5, 0.5, 1, 1.0), (6, 0.3, 2, 0.8), (6, 0.6, 3, 1.5), (4, 0.9, 1, 0.6)],
)
def test_single_step_bound_covers_the_worst_dataset(n, q, cap, sigma):
    """Every other record at -C, the differing one at +C (a truncated batch that swaps one
    for x moves the sum by 2C), and the same-sign dataset: exact delta <= our bound, in both
    orders, at every epsilon. (The bound is loose by up to ~5x at these tiny n, where
    revealing the branch gives away much; the issue's settings have n >= 5000.)"""
    ex_r, _, up_r, _ = _check([-1.0] * n, 1.0, q, cap, sigma)
    _check([1.0] * n, 1.0, q, cap, sigma)
    assert 0.0 < ex_r[2] <= up_r[2] < 1.0


def test_single_step_bound_is_not_the_poisson_one():
    """Truncation matters: the exact worst-case delta exceeds what the plain Poisson
    analysis (shift 1 only) would claim, and our bound covers it."""
    from renyi.analysis.pld import PrivacyLossDistribution as PLD

    n, q, cap, sigma = 6, 0.6, 3, 1.5
    ex_r, ex_a = exact_deltas([-1.0] * n, 1.0, q, cap, sigma, [0.5])
    pois = max(
        PLD.subsampled_gaussian(q, sigma, direction=d, value_discretization_interval=H)
        .delta_for_epsilon(0.5)
        .upper
        for d in ("remove", "add")
    )
    assert max(ex_r[0], ex_a[0]) > 1.5 * pois  # 0.0719 against 0.0382
    up_r, up_a = bound_deltas(n, q, cap, sigma, [0.5])
    assert max(ex_r[0], ex_a[0]) <= max(up_r[0], up_a[0])


def _search(n, q, cap, sigma, rng, starts, sweeps):
    """Coordinate ascent on the exact remove/add delta at eps = 0.5 over gradients in
    [-1, 1] (and x in {-1, 1}), from the extremes and random starts: the worst ratio
    exact / bound found."""
    up_r, up_a = bound_deltas(n, q, cap, sigma, [0.5])

    def score(g, x):
        ex_r, ex_a = exact_deltas(list(g), x, q, cap, sigma, [0.5])
        return max(ex_r[0] / up_r[0], ex_a[0] / up_a[0])

    worst = 0.0
    for s in range(starts):
        g = -np.ones(n) if s == 0 else rng.uniform(-1, 1, n)
        x = 1.0 if s % 2 == 0 else -1.0
        best = score(g, x)
        for _ in range(sweeps):
            for i in range(n):
                for v in (-1.0, -0.5, 0.0, 0.5, 1.0, float(rng.uniform(-1, 1))):
                    trial = g.copy()
                    trial[i] = v
                    sc = score(trial, x)
                    if sc > best:
                        best, g = sc, trial
        worst = max(worst, best)
    return worst


def test_worst_case_search_small():
    """A short search: no dataset beats the bound (ratio <= 1)."""
    rng = np.random.default_rng(30)
    assert _search(3, 0.5, 1, 1.0, rng, starts=1, sweeps=1) <= 1.0 + 1e-7


@pytest.mark.slow
@pytest.mark.parametrize(
    ("n", "q", "cap", "sigma"),
    [(5, 0.5, 1, 1.0), (6, 0.3, 2, 0.8), (6, 0.7, 2, 1.2), (7, 0.4, 3, 0.7), (5, 0.9, 2, 2.0)],
)
def test_worst_case_search(n, q, cap, sigma):
    rng = np.random.default_rng(n * 100 + cap)
    assert _search(n, q, cap, sigma, rng, starts=4, sweeps=2) <= 1.0 + 1e-7
