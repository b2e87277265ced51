"""Worst-case privacy of GOPA under double masking: the honest set the threat model allows.

Threat model (that of :mod:`renyi.federated.secagg`): a malicious server colluding with at
most ``c`` parties (chosen knowing the communication graph), every party's share threshold
``t`` with ``t > c`` and ``2t > k + c`` (``k``: a party's number of neighbours), and a
consistency round after which all honest parties agree on the survivor list ``U3``.

**Why a bound that does not depend on the graph.** The server learns honest party ``u``'s
message ``M_u = X_u + eta_u + sum_e +-Y_e`` only by rebuilding its self-mask from ``t``
shares. Shares sit with ``u``'s neighbours; an honest neighbour gives one only if it and
``u`` are in the agreed ``U3``, the corrupted ones are at most ``c``: so at least ``r = t - c``
honest neighbours ``w`` of ``u`` are in ``U3``. The pairwise term ``Y_uw`` of such an edge stays
hidden: it would need the mask key of ``u`` or ``w``, whose shares honest parties hand out
only for parties outside ``U3`` (and the ``c`` corrupted shares are fewer than ``t``). The
coalition's view of the honest released messages is therefore GOPA's Gaussian view
(:func:`renyi.federated.gopa.gopa_mu`) on an honest graph that contains, around every
released ``u``, a star of ``r`` honest edges; messages it cannot unmask are uniform (a
marginal of that view: post-processing). A subgraph has a smaller Laplacian, hence a larger
``Sigma^-1``, so the star alone bounds ``mu`` (:func:`star_mu`)::

    mu² <= (sigma_eta² + sigma_delta²) / (sigma_eta² (sigma_eta² + (r + 1) sigma_delta²))

``r = 0`` gives local DP (``1/sigma_eta``); ``sigma_delta -> inf`` gives the central value
over ``r + 1`` parties. The bound holds for every graph, coalition, dropout pattern and lie
about dropouts the model allows, so grinding the session's randomness buys nothing; it is
checked against an exhaustive search over coalitions and survivor lists at small K
(:func:`exhaustive_worst_mu`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from renyi._validation import check_int, check_nonnegative, check_positive, fail
from renyi.analysis.events import GaussianEvent, Neighbouring

__all__ = [
    "SecAggCalibration",
    "calibrate_secagg",
    "exhaustive_worst_mu",
    "harary_neighbours",
    "smallest_safe_threshold",
    "star_mu",
    "threshold_is_safe",
    "worst_case_mu",
]


def star_mu(sigma_eta: float, sigma_delta: float, honest_neighbours: int) -> float:
    """GDP ``mu`` of the centre of a star of ``honest_neighbours`` GOPA edges (closed form).

    Solving ``(sigma_eta² I + sigma_delta² L_star) x = e_centre`` by symmetry gives
    ``x_centre = (se² + sd²) / (se² (se² + (r + 1) sd²))``.

    >>> star_mu(1.0, 0.0, 5), round(star_mu(2.0, 1e9, 3) * 2 * 2, 9)
    (1.0, 1.0)
    """
    se = check_positive("sigma_eta", sigma_eta)
    sd = check_nonnegative("sigma_delta", sigma_delta, allow_inf=True)
    r = check_int("honest_neighbours", honest_neighbours, 0)
    if math.isinf(sd):
        return 1.0 / (se * math.sqrt(r + 1))
    se2, sd2 = se * se, sd * sd
    return math.sqrt((se2 + sd2) / (se2 * (se2 + (r + 1) * sd2)))


def threshold_is_safe(threshold: int, degree: int, corrupt: int) -> bool:
    """``c < t <= k`` and ``2t > k + c``: the server cannot rebuild both masks of a party."""
    t, k, c = int(threshold), int(degree), int(corrupt)
    return c < t <= k and 2 * t > k + c


def worst_case_mu(sigma_eta: float, sigma_delta: float, threshold: int, corrupt: int) -> float:
    """``star_mu`` with ``r = threshold - corrupt`` honest neighbours (module docstring)."""
    t = check_int("threshold", threshold, 1)
    c = check_int("corrupt", corrupt, 0)
    if c >= t:
        raise fail("corrupt", c, f"fewer than the threshold t = {t}")
    return star_mu(sigma_eta, sigma_delta, t - c)


def smallest_safe_threshold(degree: int, corrupt: int) -> int:
    """The least ``t`` with :func:`threshold_is_safe` (most dropouts tolerated: ``k - t``).

    >>> smallest_safe_threshold(6, 1), smallest_safe_threshold(8, 1), smallest_safe_threshold(1, 0)
    (4, 5, 1)
    """
    k = check_int("degree", degree, 1)
    c = check_int("corrupt", corrupt, 0)
    t = (k + c) // 2 + 1
    if not threshold_is_safe(t, k, c):
        raise fail("corrupt", c, f"fewer than half of a party's {k} neighbours (c < k)")
    return t


@dataclass(frozen=True)
class SecAggCalibration:
    """Noise for a worst-case target: ``worst_case_mu(sigma_eta, sigma_delta, threshold,
    corrupt) = mu <= target_mu``, the Gaussian ``mu`` of ``(epsilon, delta)``."""

    sigma_eta: float
    sigma_delta: float
    threshold: int
    corrupt: int
    mu: float
    target_mu: float

    def event(self) -> GaussianEvent:
        """One session as a Gaussian event (noise multiplier ``1/mu``, replace-one): what
        a party's budget is charged (:meth:`renyi.federated.secagg.PartyGuarantee.event`)."""
        return GaussianEvent(1.0 / self.mu, neighbouring=Neighbouring.REPLACE_ONE)


def calibrate_secagg(
    epsilon: float,
    delta: float,
    *,
    threshold: int,
    corrupt: int,
    pairwise_factor: float = 10.0,
) -> SecAggCalibration:
    """The least ``sigma_eta`` (with ``sigma_delta = pairwise_factor * sigma_eta``) whose
    worst-case guarantee (:func:`worst_case_mu`, every graph, coalition of ``corrupt``
    parties and survivor list) is ``(epsilon, delta)``-DP (analytic Gaussian, Balle & Wang
    2018, Thm 8). With ``sd = f se`` the star bound is ``mu² = (1 + f²) / (se² (1 + (r + 1)
    f²))``, ``r = threshold - corrupt``, solved for ``se`` and verified as a party verifies
    it (nudged up until the exact profile's epsilon at ``delta`` is at most ``epsilon``).

    >>> cal = calibrate_secagg(1.0, 1e-5, threshold=4, corrupt=1)
    >>> cal.mu <= cal.target_mu, round(cal.sigma_eta, 4)
    (True, 1.8723)
    """
    from renyi.analysis.closed_forms import gaussian_epsilon, gaussian_mu

    eps = check_positive("epsilon", epsilon)
    t = check_int("threshold", threshold, 1)
    c = check_int("corrupt", corrupt, 0)
    if c >= t:
        raise fail("corrupt", c, f"fewer than the threshold t = {t}")
    f = check_positive("pairwise_factor", pairwise_factor)
    target = float(gaussian_mu(eps, delta))
    r = t - c
    se = float(math.sqrt((1.0 + f * f) / (1.0 + (r + 1) * f * f)) / target)
    step = 1e-12
    for _ in range(100):  # verified as a party verifies it: epsilon of the exact profile
        mu = worst_case_mu(se, f * se, t, c)
        if mu <= target and gaussian_epsilon(mu, delta) <= eps:
            return SecAggCalibration(se, f * se, t, c, mu, target)
        se *= 1.0 + step
        step *= 2.0
    raise fail("epsilon", epsilon, "a target the calibration can verify")  # pragma: no cover


def harary_neighbours(order: Sequence[int], degree: int) -> list[list[int]]:
    """Neighbours in the Harary graph ``H(k, n)`` laid on the cyclic ``order`` of the parties:
    each party is joined to the ``k/2`` nearest on either side (all others if ``k >= n - 1``).
    ``k`` is even unless ``k >= n - 1``. Returned sorted, indexed by party."""
    n = len(order)
    k = check_int("degree", degree, 2)
    out: list[list[int]] = [[] for _ in range(n)]
    if k >= n - 1:
        return [[v for v in range(n) if v != u] for u in range(n)]
    if k % 2:
        raise fail("degree", k, "an even number of peers (or parties - 1 for the complete graph)")
    pos = {int(p): i for i, p in enumerate(order)}
    for u in range(n):
        i = pos[u]
        out[u] = sorted({int(order[(i + j) % n]) for j in range(-k // 2, k // 2 + 1) if j})
    return out


def _mu2(adj: list[list[int]], honest: list[int], u: int, se2: float, sd2: float) -> float:
    idx = {v: i for i, v in enumerate(honest)}
    n = len(honest)
    sigma = se2 * np.eye(n)
    for a in honest:
        for b in adj[a]:
            if b in idx and a < b:
                i, j = idx[a], idx[b]
                sigma[i, i] += sd2
                sigma[j, j] += sd2
                sigma[i, j] -= sd2
                sigma[j, i] -= sd2
    e = np.zeros(n)
    e[idx[u]] = 1.0
    return float(e @ np.linalg.solve(sigma, e))


def exhaustive_worst_mu(
    neighbours: Sequence[Sequence[int]],
    sigma_eta: float,
    sigma_delta: float,
    *,
    threshold: int,
    corrupt: int,
    min_survivors: int,
) -> float:
    """The exact worst ``mu`` over every coalition of ``corrupt`` parties and every survivor
    list ``U3`` (``|U3| >= min_survivors``) of a small graph (tests; K up to about 10).

    A released honest party ``u`` needs ``t`` shares of its self-mask from neighbours in
    ``U3`` or in the coalition; the coalition's view is GOPA's Gaussian view on the honest
    members of ``U3`` (edges to parties outside ``U3`` are known: their mask keys were
    rebuilt). Returns ``max_u e_uᵀ Sigma⁻¹ e_u`` over all such choices, square-rooted
    (``0`` if no honest party can ever be released).
    """
    adj = [sorted({int(v) for v in nb}) for nb in neighbours]
    n = len(adj)
    se = check_positive("sigma_eta", sigma_eta)
    sd = check_nonnegative("sigma_delta", sigma_delta)
    t = check_int("threshold", threshold, 1)
    c = check_int("corrupt", corrupt, 0)
    m = check_int("min_survivors", min_survivors, 1)
    best = 0.0
    for coalition in itertools.combinations(range(n), c):
        bad = set(coalition)
        others = [v for v in range(n) if v not in bad]
        for size in range(max(0, m - c), len(others) + 1):
            for survivors in itertools.combinations(others, size):
                u3 = set(survivors) | bad
                honest = list(survivors)
                for u in honest:
                    helpers = sum(1 for w in adj[u] if w in u3)
                    if helpers < t:
                        continue  # its self-mask cannot be rebuilt: its message stays hidden
                    best = max(best, _mu2(adj, honest, u, se * se, sd * sd))
    return math.sqrt(best)
