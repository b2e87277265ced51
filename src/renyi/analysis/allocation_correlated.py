"""Random allocation ("balls in bins") for correlated noise: the pair, and its Monte Carlo.

The matrix factorization mechanism releases ``C G + Z`` (``Z`` i.i.d. ``N(0, s²)`` per
coordinate, ``s`` the noise standard deviation in units of the clipping norm). One record
whose participation pattern is one of ``N`` alternatives ``π_1 … π_N`` (sets of steps),
chosen uniformly at random, adds ``v_j = C 1_{π_j}`` (scalar gradients of norm 1; the
multi-dimensional, adaptive case is what the accountants' reductions cover). Its output
pair under add/remove is

    ``P = (1/N) Σ_j N(v_j, s² I)``,   ``Q = N(0, s² I)``,

and the pair is determined by the Gram matrix ``G_ij = <v_i, v_j> = 1_{π_i}ᵀ CᵀC 1_{π_j}``:
under ``Q`` the log-likelihood ratios ``ℓ_j = <v_j, z>/s² − G_jj/(2s²)`` are jointly Gaussian
with covariance ``G/s²``, and under ``P`` (alternative ``j*``) each is shifted by
``G_{j j*}/s²``. This module computes those Gram matrices (:func:`participation_gram`) and
estimates ``δ(ε)`` / ``ε(δ)`` of compositions of such pairs by Monte Carlo with a confidence
interval (:func:`mixture_delta_monte_carlo`, :func:`mixture_epsilon_monte_carlo`): the
numerical reference of Choquette-Choo et al. (2024, "Near exact privacy amplification for
matrix mechanisms") and of jax_privacy's balls-in-bins sampler, used here to place the
proven bounds of :mod:`renyi.correlated.accounting`. **Estimates, not bounds.**

Both directions are estimated from bounded quantities (values in ``[0, 1]``, so the normal
interval is honest at moderate ``δ``):

* remove, ``H_{e^ε}(P‖Q) = E_P[(1 − e^{ε − L})_+]`` (samples under ``P``);
* add, ``H_{e^ε}(Q‖P) = E_Q[(1 − e^{ε + L})_+]`` (samples under ``Q``),

with ``L = log dP/dQ`` summed over the independent blocks of the composition.

With one band (``C = I``) and ``π_j = {j}`` the Gram matrix is the identity and the pair is
exactly 1-out-of-``N`` random allocation (:mod:`renyi.analysis.allocation`).

Example:
    >>> import numpy as np
    >>> g = participation_gram(np.eye(4), [[0], [1], [2], [3]])
    >>> bool(np.array_equal(g, np.eye(4)))
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import logsumexp

from renyi._validation import check_delta, check_int, check_positive, check_range, fail

__all__ = [
    "mixture_delta_monte_carlo",
    "mixture_epsilon_monte_carlo",
    "mixture_privacy_losses",
    "participation_gram",
]

FloatArray = NDArray[np.float64]
Blocks = Sequence[tuple[ArrayLike, int]]


def participation_gram(matrix: ArrayLike, patterns: Sequence[Sequence[int]]) -> FloatArray:
    """``G_ij = 1_{π_i}ᵀ CᵀC 1_{π_j}``: the Gram matrix of the record's contributions
    ``v_j = C 1_{π_j}`` under the participation ``patterns`` (lists of 0-based steps).

    >>> participation_gram([[1.0, 0.0], [0.5, 1.0]], [[0], [1], [0, 1]]).tolist()
    [[1.25, 0.5, 1.75], [0.5, 1.0, 1.5], [1.75, 1.5, 3.25]]
    """
    c = np.asarray(matrix, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1] or not np.all(np.isfinite(c)):
        raise fail("matrix", c.shape, "a finite square strategy matrix C")
    t = c.shape[0]
    if len(patterns) == 0:
        raise fail("patterns", patterns, "at least one participation pattern")
    x = np.zeros((t, len(patterns)))
    for j, pattern in enumerate(patterns):
        steps = np.asarray(pattern, dtype=np.int64).reshape(-1)
        if steps.size == 0 or np.any(steps < 0) or np.any(steps >= t):
            raise fail(f"patterns[{j}]", pattern, f"a non-empty set of steps in [0, {t})")
        if np.unique(steps).size != steps.size:
            raise fail(f"patterns[{j}]", pattern, "distinct steps")
        x[steps, j] = 1.0
    v = c @ x
    out: FloatArray = v.T @ v
    return out


def _factor(gram: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """``(F, diag G)`` with ``F Fᵀ = G`` (symmetric PSD ``G``, from its eigenvalues)."""
    g = np.asarray(gram, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] != g.shape[1] or g.shape[0] < 1 or not np.all(np.isfinite(g)):
        raise fail("gram", getattr(g, "shape", g), "a finite square Gram matrix")
    if not np.allclose(g, g.T, rtol=1e-12, atol=1e-12 * float(np.abs(g).max(initial=1.0))):
        raise fail("gram", "not symmetric", "a symmetric Gram matrix")
    w, v = np.linalg.eigh(g)
    if w.min() < -1e-9 * max(float(w.max()), 1.0):
        raise fail("gram", f"smallest eigenvalue {w.min():.3g}", "a positive semidefinite matrix")
    f: FloatArray = v * np.sqrt(np.maximum(w, 0.0))[None, :]
    return f, np.diag(g).copy()


def mixture_privacy_losses(
    blocks: Blocks,
    noise_std: float,
    samples: int,
    *,
    under: str = "P",
    rng: np.random.Generator | None = None,
) -> FloatArray:
    """``samples`` draws of ``L = log dP/dQ`` of the composition of independent mixture
    pairs, under ``P`` or ``Q``.

    Args:
        blocks: ``(gram, count)`` pairs: ``count`` independent copies of the pair of Gram
            matrix ``gram`` (N × N, N alternatives chosen uniformly).
        noise_std: ``s``, the noise standard deviation in units of the clipping norm.
        under: ``"P"`` (the record present) or ``"Q"``.
    """
    s = check_positive("noise_std", noise_std)
    n = check_int("samples", samples, 1)
    if under not in ("P", "Q"):
        raise fail("under", under, "'P' or 'Q'")
    if rng is None:
        from renyi.random import secure_random_bytes

        rng = np.random.default_rng(int.from_bytes(secure_random_bytes(16), "little"))
    total = np.zeros(n)
    inv = 1.0 / (s * s)
    for gram, count in blocks:
        f, diag = _factor(gram)
        reps = check_int("count", count, 0)
        alts = f.shape[0]
        g = np.asarray(gram, dtype=np.float64)
        chunk = max(1, 2_000_000 // (alts * alts + alts))
        for _ in range(reps):
            for start in range(0, n, chunk):
                rows = min(chunk, n - start)
                ell = (rng.standard_normal((rows, alts)) @ f.T) * (1.0 / s) - 0.5 * diag * inv
                if under == "P":
                    ell += g[rng.integers(0, alts, size=rows)] * inv
                total[start : start + rows] += logsumexp(ell, axis=1) - math.log(alts)
    return total


def _delta_terms(losses: FloatArray, epsilon: float, direction: str) -> FloatArray:
    if direction == "remove":  # losses under P
        out: FloatArray = -np.expm1(np.minimum(epsilon - losses, 0.0))
    else:  # add: losses under Q
        out = -np.expm1(np.minimum(epsilon + losses, 0.0))
    return out


def _interval(values: FloatArray, confidence: float) -> tuple[float, float, float]:
    from scipy.stats import norm

    est = float(values.mean())
    half = float(norm.ppf(0.5 + confidence / 2.0)) * float(values.std(ddof=1))
    half /= math.sqrt(values.size)
    return est, max(est - half, 0.0), min(est + half, 1.0)


def mixture_delta_monte_carlo(
    blocks: Blocks,
    noise_std: float,
    epsilon: float,
    *,
    direction: str = "remove",
    samples: int = 100_000,
    confidence: float = 0.99,
    rng: np.random.Generator | None = None,
) -> tuple[float, float, float]:
    """Monte Carlo ``(estimate, low, high)`` of ``δ(ε)`` of the composed mixture pairs
    (module docstring), in ``direction`` ``"remove"`` (``H(P‖Q)``) or ``"add"``
    (``H(Q‖P)``); the interval is the normal one at ``confidence``. An estimate, not a
    bound.

    >>> rng = np.random.default_rng(0)
    >>> est, lo, hi = mixture_delta_monte_carlo([(np.eye(1), 1)], 1.0, 0.5, rng=rng)
    >>> lo < 0.2384 < hi  # one Gaussian, sigma = 1: delta(0.5) = 0.2384 (closed form)
    True
    """
    eps = check_range("epsilon", epsilon, 0.0, math.inf)
    if direction not in ("remove", "add"):
        raise fail("direction", direction, "'remove' or 'add'")
    conf = check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    losses = mixture_privacy_losses(
        blocks, noise_std, samples, under="P" if direction == "remove" else "Q", rng=rng
    )
    return _interval(_delta_terms(losses, eps, direction), conf)


def epsilon_interval_from_losses(
    losses_by_direction: Iterable[tuple[str, FloatArray]], delta: float, confidence: float
) -> tuple[float, float, float]:
    """``(estimate, low, high)`` of ε(δ) from sampled privacy losses of each direction
    (``"remove"``: losses under ``P``; ``"add"``: under ``Q``): ε solves ``δ_MC(ε) = δ``
    (bisection, the same samples at every ε so each curve is monotone) on the estimate and
    on both ends of :func:`_interval`; the larger direction is kept at each of the three."""
    out = np.zeros(3)
    for direction, losses in losses_by_direction:

        def at(eps: float, which: int, losses: FloatArray = losses, dr: str = direction) -> float:
            return _interval(_delta_terms(losses, eps, dr), confidence)[which]

        for which in range(3):  # estimate, low, high of delta -> estimate, low, high of eps
            if at(0.0, which) <= delta:
                continue
            lo, hi = 0.0, 1.0
            while at(hi, which) > delta:
                lo, hi = hi, 2.0 * hi
                if hi > 1e4:
                    raise fail("delta", delta, "a delta the samples resolve (too small)")
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if at(mid, which) > delta else (lo, mid)
            out[which] = max(out[which], hi)
    # delta's low end gives eps's low end: order (estimate, low, high)
    return float(out[0]), float(out[1]), float(out[2])


def mixture_epsilon_monte_carlo(
    blocks: Blocks,
    noise_std: float,
    delta: float,
    *,
    samples: int = 100_000,
    confidence: float = 0.99,
    rng: np.random.Generator | None = None,
) -> tuple[float, float, float]:
    """Monte Carlo ``(estimate, low, high)`` of ``ε(δ)``, the larger of the two directions.

    For each direction, ``ε`` solves ``δ_MC(ε) = δ`` on the estimate and on the two ends of
    the interval of :func:`mixture_delta_monte_carlo` (the same samples at every ``ε``, so
    the three curves are monotone); the result takes the larger direction at each of the
    three. An estimate with an interval at ``confidence`` per direction, not a bound.
    """
    d = check_delta(delta)
    conf = check_range("confidence", confidence, 0.0, 1.0, low_open=True, high_open=True)
    return epsilon_interval_from_losses(
        (
            (direction, mixture_privacy_losses(blocks, noise_std, samples, under=under, rng=rng))
            for direction, under in (("remove", "P"), ("add", "Q"))
        ),
        d,
        conf,
    )
