"""GOPA: private averaging without a trusted curator (Sabater, Bellet & Ramon 2022).

Protocol (Machine Learning 111, arXiv:2006.07218, Algorithm 1): each party ``u`` holds
``X_u`` (a value in ``[0, 1]`` or a vector of L2 norm <= 1/2: L2 diameter 1), draws
independent noise ``eta_u ~ N(0, sigma_eta²)``, picks ``m`` random peers and, with each,
agrees over a secure channel on ``y ~ N(0, sigma_delta²)``; one adds ``+y`` and the other
``-y``. It sends
``X_u + sum_v Delta_uv + eta_u`` to the server, which averages. The pairwise terms cancel,
so the mean has the noise of the ``eta``'s only: standard deviation ``sigma_eta / sqrt(K)``.

**Exact accounting** (:func:`gopa_mu`). Threat model: the server colludes with every
corrupted party (honest-but-curious). Neighbouring relation: **replace-one**, one honest
party's value changes (by at most 1 in L2 norm). Removing what the coalition knows, the view
of the honest set ``H`` is ``X_H + eta_H + B_H y``, a Gaussian with covariance
``Sigma = sigma_eta² I + sigma_delta² L_H`` (``L_H``: Laplacian, with multiplicities, of the
communication graph induced on ``H``). Changing ``X_u`` by a unit vector shifts the mean by
``e_u``, so the release is exactly a Gaussian mechanism with
``mu² = max_{u in H} e_uᵀ Sigma⁻¹ e_u``: it is ``mu``-GDP (Dong, Roth & Su 2022, Def. 2.6),
i.e. RDP ``epsilon(alpha) = alpha mu² / 2`` (Mironov 2017, Prop. 7 with sigma = 1/mu) and
(ε, δ)-DP with the analytic Gaussian profile of Balle & Wang 2018, Thm 8. This is the
Gaussian view analysis behind Sabater et al. (Theorem 1 and its proof), evaluated exactly for
the given graph instead of bounded.

* Complete honest graph: ``mu² = 1/(n sigma_eta²) + (1 - 1/n)/(n sigma_delta² + sigma_eta²)``.
* Connected honest graph: ``mu² -> 1/(n_H sigma_eta²)`` as ``sigma_delta -> inf`` (the trusted
  curator on the honest parties). Disconnected: each component only hides among itself;
  :class:`GopaPrivacy` reports ``connected=False`` and the component sizes.

Both paths return rigorous upper bounds. The dense one (Cholesky, iterative refinement)
adds a residual check: ``Sigma >= sigma_eta² I``, so the error of ``e_uᵀ x`` is at most
``||Sigma x - e_u|| / sigma_eta²``. The sparse one (O(n) memory per block of parties) uses
the variational form ``e_uᵀ Sigma⁻¹ e_u = min {||a||²/sigma_eta² + ||f||²/sigma_delta² :
a + B f = e_u}`` (``B``: incidence matrix): conjugate gradients give ``x``, and the feasible
pair ``f = sigma_delta² Bᵀ x``, ``a = e_u - sigma_delta² L x`` gives a bound that holds for
any ``x`` and is tight to second order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.csgraph
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_int, check_nonnegative, check_positive, check_range, fail
from renyi.analysis.closed_forms import gaussian_delta, gaussian_epsilon, gaussian_rdp
from renyi.federated.aggregation import (
    Calibration,
    check_values,
    gaussian_noise,
    gaussian_ratio,
)
from renyi.federated.channels import ChaCha20Source, IdentityKey, Roster
from renyi.federated.gopa_party import (
    FRACTION_BITS,
    GopaAggregator,
    GopaParty,
    GopaResult,
    GopaSession,
    ProtocolAbortedError,
)
from renyi.random import RandomSource, get_source

__all__ = [
    "FRACTION_BITS",
    "GopaCalibration",
    "GopaParty",
    "GopaPrivacy",
    "GopaProtocol",
    "GopaResult",
    "GopaSession",
    "ProtocolAbortedError",
    "TargetedCoalition",
    "calibrate_gopa",
    "gopa_mu",
    "gopa_mu_complete",
    "gopa_targeted",
    "random_peer_graph",
    "recommended_peers",
    "simulate_gopa_std",
]

_EPS = float(np.finfo(np.float64).eps)
_BLOCK = 512

# --------------------------------------------------------------------------- graph


def recommended_peers(parties: int, honest_fraction: float) -> int:
    """``m = ceil(ln(rho K) / rho)`` peers per party (Sabater et al. 2022, Sec. 5).

    With this many random peers the honest subgraph is connected with high probability.

    >>> recommended_peers(1000, 0.5)
    13
    """
    k = check_int("parties", parties, 2)
    rho = check_range("honest_fraction", honest_fraction, 0.0, 1.0, low_open=True)
    n_h = max(1, math.floor(rho * k))
    m = math.ceil(math.log(n_h) / rho) if n_h > 1 else 1
    return max(1, min(m, k - 1))


def random_peer_graph(
    parties: int, peers: int, rng: np.random.Generator | None = None
) -> NDArray[np.int64]:
    """Edges ``(u, v)``: every party ``u`` picks ``peers`` distinct others uniformly.

    Returns an ``(parties * peers, 2)`` integer array; a pair chosen from both sides appears
    twice (two independent pairwise noises), which the accounting counts as weight 2.
    """
    k = check_int("parties", parties, 2)
    m = check_int("peers", peers, 1)
    if m > k - 1:
        raise fail("peers", peers, f"an integer in [1, {k - 1}] (parties - 1)")
    src = get_source(rng)
    if k <= 2048 or 4 * m > k:
        # Uniform m-subset of the others: the m smallest of k random 64-bit keys per row.
        keys = src.words(k * k).reshape(k, k)
        keys[np.arange(k), np.arange(k)] = np.iinfo(np.uint64).max
        chosen = np.argsort(keys, axis=1, kind="stable")[:, :m].astype(np.int64)
    else:
        chosen = _distinct_others(k, m, src)
    u = np.repeat(np.arange(k, dtype=np.int64), m)
    return np.stack([u, chosen.reshape(-1)], axis=1)


def _distinct_others(k: int, m: int, src: RandomSource) -> NDArray[np.int64]:
    """Per row u, the first m distinct values of an iid uniform sequence on the others.

    The first m distinct draws of an iid uniform sequence form a uniform m-subset; rows
    with fewer than m distinct draws among 2m + 16 are redrawn (rare since m <= k/4).
    """
    out = np.empty((k, m), dtype=np.int64)
    todo = np.arange(k, dtype=np.int64)
    c = 2 * m + 16
    while todo.size:
        r = src.integers_below(np.full(todo.size * c, k - 1, dtype=np.int64)).reshape(-1, c)
        r = r + (r >= todo[:, None])  # skip oneself
        order = np.argsort(r, axis=1, kind="stable")
        srt = np.take_along_axis(r, order, axis=1)
        dup_sorted = np.zeros_like(srt, dtype=bool)
        dup_sorted[:, 1:] = srt[:, 1:] == srt[:, :-1]
        first = np.empty_like(dup_sorted)
        np.put_along_axis(first, order, ~dup_sorted, axis=1)
        rank = np.cumsum(first, axis=1)
        ok = rank[:, -1] >= m
        keep = first & (rank <= m)
        rows = np.flatnonzero(ok)
        out[todo[rows]] = r[rows][keep[rows]].reshape(-1, m)
        todo = todo[~ok]
    return out


def _check_edges(edges: ArrayLike, parties: int) -> NDArray[np.int64]:
    e = np.asarray(edges)
    if e.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if e.ndim != 2 or e.shape[1] != 2 or not np.issubdtype(e.dtype, np.integer):
        raise fail("edges", e.shape, "an integer array of shape (E, 2)")
    if (e < 0).any() or (e >= parties).any():
        raise fail("edges", "out-of-range endpoint", f"endpoints in [0, {parties - 1}]")
    if (e[:, 0] == e[:, 1]).any():
        raise fail("edges", "self-loop", "edges between distinct parties")
    return e.astype(np.int64)


def _honest_index(honest: ArrayLike | None, parties: int) -> NDArray[np.int64]:
    if honest is None:
        return np.arange(parties, dtype=np.int64)
    h = np.asarray(honest)
    if h.dtype == np.bool_:
        if h.shape != (parties,):
            raise fail("honest", h.shape, f"a boolean mask of shape ({parties},)")
        idx = np.flatnonzero(h)
    else:
        if h.ndim != 1 or not np.issubdtype(h.dtype, np.integer):
            raise fail("honest", h, "a boolean mask or an integer index array")
        idx = np.unique(h)
        if idx.size != h.size or (idx < 0).any() or (idx >= parties).any():
            raise fail("honest", h, f"distinct indices in [0, {parties - 1}]")
    if idx.size == 0:
        raise fail("honest", "empty set", "at least one honest party")
    return idx.astype(np.int64)


def _honest_laplacian(
    edges: NDArray[np.int64], honest: NDArray[np.int64], parties: int
) -> scipy.sparse.csr_matrix:
    pos = np.full(parties, -1, dtype=np.int64)
    pos[honest] = np.arange(honest.size)
    a, b = pos[edges[:, 0]], pos[edges[:, 1]]
    keep = (a >= 0) & (b >= 0)
    a, b = a[keep], b[keep]
    n = honest.size
    w = scipy.sparse.coo_matrix(
        (np.ones(2 * a.size), (np.concatenate([a, b]), np.concatenate([b, a]))), shape=(n, n)
    ).tocsr()
    deg = np.asarray(w.sum(axis=1)).ravel()
    return (scipy.sparse.diags(deg) - w).tocsr()


# --------------------------------------------------------------------------- accounting


@dataclass(frozen=True)
class GopaPrivacy:
    """The exact Gaussian guarantee of one GOPA release for one honest set.

    ``mu``: the release is ``mu``-GDP for every honest party under replace-one (values
    change by at most 1). ``curator_mu``: the trusted-curator value ``1/(sqrt(n_H) sigma_eta)``
    that ``mu`` approaches for a connected honest graph. ``components``: sizes of the
    connected components of the honest graph (one entry iff ``connected``).
    """

    mu: float
    worst_party: int
    honest_count: int
    connected: bool
    components: tuple[int, ...]
    curator_mu: float
    sigma_eta: float
    sigma_delta: float
    method: str

    def rdp(self, orders: ArrayLike) -> NDArray[np.float64]:
        """RDP curve ``alpha mu² / 2`` (Gaussian mechanism, Mironov 2017 Prop. 7)."""
        if math.isinf(self.mu):
            return np.full(np.atleast_1d(np.asarray(orders, dtype=np.float64)).shape, math.inf)
        return gaussian_rdp(1.0 / self.mu, orders)

    def epsilon(self, delta: float) -> float:
        """Exact ε(δ) of the mu-GDP release (Balle & Wang 2018, Thm 8; rounded up)."""
        if math.isinf(self.mu):
            return math.inf
        return gaussian_epsilon(self.mu, delta)

    def delta(self, epsilon: float) -> float:
        """Exact δ(ε) of the mu-GDP release (Balle & Wang 2018, Thm 8)."""
        if math.isinf(self.mu):
            return 1.0
        return float(gaussian_delta(self.mu, epsilon))

    @property
    def degradation(self) -> float:
        """``mu / curator_mu`` (>= 1): how far from the trusted-curator guarantee."""
        if math.isinf(self.curator_mu):
            return math.inf
        return self.mu / self.curator_mu


def gopa_mu_complete(honest_count: int, sigma_eta: float, sigma_delta: float) -> float:
    """Closed form of :func:`gopa_mu` when every pair of honest parties shares one noise.

    ``mu² = 1/(n sigma_eta²) + (1 - 1/n)/(n sigma_delta² + sigma_eta²)``: on the complete
    graph ``L = n I - 11ᵀ`` has eigenvalue 0 on ``1`` and ``n`` on its complement.

    >>> round(gopa_mu_complete(100, 1.0, 0.0), 12)  # no pairwise noise: local DP
    1.0
    """
    n = check_int("honest_count", honest_count, 1)
    se = check_positive("sigma_eta", sigma_eta)
    sd = check_nonnegative("sigma_delta", sigma_delta, allow_inf=True)
    tail = 0.0 if math.isinf(sd) else (1.0 - 1.0 / n) / (n * sd * sd + se * se)
    return math.sqrt(1.0 / (n * se * se) + tail)


def _inverse_diagonal_bound(sigma: scipy.sparse.csr_matrix, floor: float) -> NDArray[np.float64]:
    """Rigorous upper bounds on the diagonal of ``sigma⁻¹`` (``sigma >= floor I``), dense."""
    n = sigma.shape[0]
    diag = np.empty(n)
    err = np.empty(n)
    factor = scipy.linalg.cho_factor(sigma.toarray(), lower=True)
    abs_sigma = abs(sigma)
    row_nnz = float(np.diff(sigma.indptr).max(initial=1))
    for start in range(0, n, _BLOCK):  # blocks bound the memory; work is vectorised inside
        stop = min(n, start + _BLOCK)
        cols = np.arange(stop - start)
        rhs = np.zeros((n, stop - start))
        rhs[np.arange(start, stop), cols] = 1.0
        x = scipy.linalg.cho_solve(factor, rhs)
        x = x - scipy.linalg.cho_solve(factor, sigma @ x - rhs)  # iterative refinement
        resid = sigma @ x - rhs
        diag[start:stop] = x[np.arange(start, stop), cols]
        # |e_u'(x* - x)| <= ||x* - x|| <= ||r|| / floor, with x* the exact solution; the
        # computed residual is itself off by at most (row nnz + 2) eps (|sigma| |x|) per entry.
        rounding = (row_nnz + 2.0) * _EPS * (abs_sigma @ np.abs(x))
        err[start:stop] = (np.linalg.norm(resid, axis=0) + np.linalg.norm(rounding, axis=0)) / floor
    return diag + err


def _variational_bound(
    lap: scipy.sparse.csr_matrix, se2: float, sd2: float, tol: float = 1e-11, max_iter: int = 500
) -> NDArray[np.float64]:
    """Upper bounds on ``e_uᵀ Sigma⁻¹ e_u`` for every u, in O(n * block) memory.

    For ``Sigma = se2 I + sd2 B Bᵀ`` (``B``: incidence matrix, ``L = B Bᵀ``),
    ``e_uᵀ Sigma⁻¹ e_u = min { ||a||²/se2 + ||f||²/sd2 : a + B f = e_u }`` (the precision of a
    sum of independent Gaussians; the minimiser is ``a = se2 x, f = sd2 Bᵀ x`` with
    ``x = Sigma⁻¹ e_u``). Any ``x`` gives the feasible pair ``f = sd2 Bᵀ x``,
    ``a = e_u - sd2 L x`` and so an upper bound ``||a||²/se2 + sd2 xᵀ L x``, tight to second
    order in the error of ``x``. ``x`` comes from conjugate gradients (vectorised over the
    columns) on ``Sigma z = e_u - 1/n`` plus the exact ``1/(n se2)`` along the constant
    vector; the bound holds whatever CG returns, and the rounding of ``L x`` is accounted for.
    """
    n = lap.shape[0]
    if n == 1:
        return np.array([1.0 / se2])
    out = np.empty(n)
    abs_lap = abs(lap)
    row_nnz = float(np.diff(lap.indptr).max(initial=1))
    for start in range(0, n, _BLOCK):
        stop = min(n, start + _BLOCK)
        cols = np.arange(stop - start)
        e = np.zeros((n, stop - start))
        e[np.arange(start, stop), cols] = 1.0
        r = e - 1.0 / n  # orthogonal to the constant vector, on which Sigma⁻¹ = 1/se2
        z = np.zeros_like(r)
        p = r.copy()
        rs = np.einsum("ij,ij->j", r, r)
        r0 = np.sqrt(rs)
        for _ in range(max_iter):  # plain CG, one independent run per column
            ap = se2 * p + sd2 * (lap @ p)
            pap = np.einsum("ij,ij->j", p, ap)
            alpha = np.divide(rs, pap, out=np.zeros_like(rs), where=pap > 0)
            z += alpha * p
            r -= alpha * ap
            rs_new = np.einsum("ij,ij->j", r, r)
            if (np.sqrt(rs_new) <= tol * r0).all():
                break
            beta = np.divide(rs_new, rs, out=np.zeros_like(rs), where=rs > 0)
            p = r + beta * p
            rs = rs_new
        # x = z + 1/(n se2) and L 1 = 0, so L x = L z and xᵀ L x = zᵀ L z exactly
        lz = lap @ z
        a = e - sd2 * lz
        quad = sd2 * np.einsum("ij,ij->j", z, lz)
        # rounding: |fl(L z) - L z| <= (row nnz + 1) eps |L| |z| entrywise
        lz_err = (row_nnz + 1.0) * _EPS * (abs_lap @ np.abs(z))
        a_norm = np.linalg.norm(a, axis=0) + sd2 * np.linalg.norm(lz_err, axis=0)
        quad_err = sd2 * (
            np.einsum("ij,ij->j", np.abs(z), lz_err)
            + n * _EPS * np.einsum("ij,ij->j", np.abs(z), np.abs(lz))
        )
        out[start:stop] = (a_norm**2 / se2 + quad + quad_err) * (1.0 + 4.0 * n * _EPS)
    return out


def gopa_mu(
    edges: ArrayLike,
    sigma_eta: float,
    sigma_delta: float,
    *,
    parties: int,
    honest: ArrayLike | None = None,
    method: Literal["auto", "dense", "sparse"] = "auto",
) -> GopaPrivacy:
    """Exact GDP parameter of GOPA for a communication graph and an honest set.

    ``mu² = max_{u in H} e_uᵀ (sigma_eta² I + sigma_delta² L_H)⁻¹ e_u`` (module docstring),
    returned as a rigorous upper bound (residual-checked). ``edges``: ``(E, 2)`` party
    indices, one row per pairwise noise; ``honest``: mask or indices (default: everyone).
    ``method="auto"`` is dense below 2000 honest parties and the variational CG bound
    (sparse, O(n) memory per block) above.

    >>> p = gopa_mu([[0, 1], [1, 2], [0, 2]], 1.0, 10.0, parties=3)
    >>> abs(p.mu - gopa_mu_complete(3, 1.0, 10.0)) < 1e-12
    True
    """
    k = check_int("parties", parties, 1)
    se = check_nonnegative("sigma_eta", sigma_eta)
    sd = check_nonnegative("sigma_delta", sigma_delta)
    e = _check_edges(edges, k)
    idx = _honest_index(honest, k)
    if method not in ("auto", "dense", "sparse"):
        raise fail("method", method, "'auto', 'dense' or 'sparse'")
    lap = _honest_laplacian(e, idx, k)
    n = idx.size
    n_comp, labels = scipy.sparse.csgraph.connected_components(lap, directed=False)
    sizes = tuple(sorted(np.bincount(labels).tolist(), reverse=True))
    chosen = ("dense" if n < 2000 else "sparse") if method == "auto" else method
    if se == 0.0:  # no independent noise: each component's sum is revealed exactly
        return GopaPrivacy(
            mu=math.inf,
            worst_party=int(idx[0]),
            honest_count=int(n),
            connected=n_comp == 1,
            components=sizes,
            curator_mu=math.inf,
            sigma_eta=se,
            sigma_delta=sd,
            method=chosen,
        )
    if chosen == "dense":
        sigma = (se * se * scipy.sparse.identity(n, format="csr") + (sd * sd) * lap).tocsr()
        diag = _inverse_diagonal_bound(sigma, se * se)
    else:
        diag = _variational_bound(lap, se * se, sd * sd)
    worst = int(np.argmax(diag))
    return GopaPrivacy(
        mu=math.sqrt(float(diag[worst])),
        worst_party=int(idx[worst]),
        honest_count=int(n),
        connected=n_comp == 1,
        components=sizes,
        curator_mu=1.0 / (math.sqrt(n) * se),
        sigma_eta=se,
        sigma_delta=sd,
        method=chosen,
    )


@dataclass(frozen=True)
class TargetedCoalition:
    """A coalition chosen *knowing the graph* to expose one target (worst honest party).

    ``mu`` is the exact GDP parameter of ``target`` against the coalition of its
    ``coalition_size`` nearest parties (breadth-first from the target); it is attained by
    that coalition, so the worst case over all coalitions of that size is at least ``mu``
    and at most ``bound_mu = 1 / sigma_eta`` (``Sigma >= sigma_eta² I``). ``isolated``: some
    party has at most ``coalition_size`` distinct neighbours, so the coalition can cut it
    off and ``mu == bound_mu`` exactly.
    """

    mu: float
    target: int
    coalition_size: int
    isolated: bool
    bound_mu: float
    evaluated_targets: tuple[int, ...]

    def epsilon(self, delta: float) -> float:
        return math.inf if math.isinf(self.mu) else gaussian_epsilon(self.mu, delta)


def gopa_targeted(
    edges: ArrayLike,
    sigma_eta: float,
    sigma_delta: float,
    *,
    parties: int,
    coalition_size: int,
    candidates: int = 8,
) -> TargetedCoalition:
    """Worst honest party when the server and ``coalition_size`` parties target it.

    Random honest sets (:func:`calibrate_gopa`) say nothing about a coalition that picks
    the parties around one target. If some party has at most ``coalition_size`` distinct
    neighbours the coalition isolates it: ``mu = 1/sigma_eta`` exactly (the party's message
    is ``X_u + eta_u`` plus known terms). Otherwise the ``candidates`` parties with the
    fewest distinct neighbours are attacked by their breadth-first nearest coalition and
    the largest exact ``mu`` is reported (attained; the bound ``1/sigma_eta`` still holds).

    >>> e = random_peer_graph(50, 3, np.random.default_rng(0))
    >>> t = gopa_targeted(e, 1.0, 10.0, parties=50, coalition_size=40)
    >>> t.isolated and t.mu == 1.0
    True
    """
    k = check_int("parties", parties, 2)
    e = _check_edges(edges, k)
    se = check_positive("sigma_eta", sigma_eta)
    sd = check_nonnegative("sigma_delta", sigma_delta)
    c = check_int("coalition_size", coalition_size, 0)
    if c > k - 1:
        raise fail("coalition_size", c, f"at most parties - 1 = {k - 1}")
    n_cand = check_int("candidates", candidates, 1)
    adj = scipy.sparse.coo_matrix(
        (np.ones(2 * e.shape[0]), (np.r_[e[:, 0], e[:, 1]], np.r_[e[:, 1], e[:, 0]])),
        shape=(k, k),
    ).tocsr()
    adj.sum_duplicates()
    distinct = np.diff(adj.indptr)
    bound = 1.0 / se
    order = np.argsort(distinct, kind="stable")
    if distinct[order[0]] <= c:
        u = int(order[0])
        return TargetedCoalition(bound, u, c, True, bound, (u,))
    best_mu, best_u = -1.0, int(order[0])
    tried = tuple(int(u) for u in order[:n_cand])
    for u in tried:
        dist = scipy.sparse.csgraph.breadth_first_order(adj, u, directed=False)[0]
        coalition = [int(v) for v in dist[1 : c + 1]]
        honest = np.ones(k, dtype=bool)
        honest[coalition] = False
        idx = np.flatnonzero(honest)
        lap = _honest_laplacian(e, idx, k)
        sigma = (se * se * scipy.sparse.identity(idx.size, format="csr") + (sd * sd) * lap).tocsr()
        pos = int(np.searchsorted(idx, u))
        mu2 = float(_inverse_diagonal_bound(sigma, se * se)[pos])
        if mu2 > best_mu:
            best_mu, best_u = mu2, u
    return TargetedCoalition(min(math.sqrt(best_mu), bound), best_u, c, False, bound, tried)


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class GopaCalibration:
    """Noise levels of GOPA meeting a target (ε, δ) for the evaluated graph and honest set.

    ``output_std`` is the standard deviation of the released mean (``sigma_eta / sqrt(K)``);
    ``central_std`` the trusted-curator one at the same (ε, δ) over all K parties.
    """

    parties: int
    honest_count: int
    peers: int
    epsilon: float
    delta: float
    sigma_eta: float
    sigma_delta: float
    target_mu: float
    privacy: GopaPrivacy
    output_std: float
    central_std: float
    local_std: float
    edges: NDArray[np.int64] = field(repr=False)

    @property
    def ratio_to_central(self) -> float:
        """``output_std / central_std``: about ``1/sqrt(rho)`` for a connected graph."""
        return self.output_std / self.central_std


def calibrate_gopa(
    parties: int,
    honest_fraction: float,
    epsilon: float,
    delta: float,
    *,
    peers: int | None = None,
    pairwise_factor: float = 100.0,
    honest: ArrayLike | None = None,
    edges: ArrayLike | None = None,
    trials: int = 1,
    calibration: Calibration = "analytic",
    rng: np.random.Generator | None = None,
) -> GopaCalibration:
    """Choose ``sigma_eta`` and ``sigma_delta`` so GOPA is (ε, δ)-DP for the honest parties.

    ``sigma_delta² = pairwise_factor * n_H * sigma_eta² / d_H`` with ``d_H = 2 rho m`` the
    expected honest degree (for ``rho = 1/2`` this is the paper's ``100 n_H sigma_eta² / m``,
    which puts ``mu`` within about 2% of the curator limit; scaling by the honest degree keeps
    that for small ``rho``; the pairwise noise cancels, so it costs no accuracy). With
    that coupling ``mu`` is proportional to ``1/sigma_eta``, so ``sigma_eta`` follows in
    closed form from the exact :func:`gopa_mu` and is then verified (``mu <= target``).

    The guarantee is exact for the evaluated graph (``edges``, else a fresh
    :func:`random_peer_graph`) and honest set (``honest``, else ``trials`` random sets of
    ``floor(rho K)`` parties, worst one kept). For an honest set unknown in advance but
    chosen independently of the graph, Sabater et al. (2022, Thm 3) give the
    with-high-probability version; re-check the realised set with :func:`gopa_mu`.
    """
    k = check_int("parties", parties, 2)
    rho = check_range("honest_fraction", honest_fraction, 0.0, 1.0, low_open=True)
    factor = check_positive("pairwise_factor", pairwise_factor)
    trials = check_int("trials", trials, 1)
    target = gaussian_ratio(epsilon, delta, calibration)
    m = recommended_peers(k, rho) if peers is None else check_int("peers", peers, 1)
    e = random_peer_graph(k, m, rng) if edges is None else _check_edges(edges, k)
    n_h = max(1, math.floor(rho * k))
    src = get_source(rng)
    if honest is not None:
        sets = [_honest_index(honest, k)]
        n_h = sets[0].size
    else:
        sets = [
            np.sort(np.argsort(src.words(k).astype(np.float64))[:n_h]).astype(np.int64)
            for _ in range(trials)
        ]
    degree = min(2.0 * rho * m, n_h - 1.0) if n_h > 1 else 1.0  # expected honest degree
    t = factor * n_h / degree  # sigma_delta² / sigma_eta²
    # Evaluate at sigma_eta = 1; mu(sigma_eta) = mu(1) / sigma_eta under the coupling.
    unit = max(
        (gopa_mu(e, 1.0, math.sqrt(t), parties=k, honest=h) for h in sets), key=lambda p: p.mu
    )
    sigma_eta = unit.mu / target

    def evaluate(s_eta: float) -> GopaPrivacy:
        sd = s_eta * math.sqrt(t)
        return max((gopa_mu(e, s_eta, sd, parties=k, honest=h) for h in sets), key=lambda p: p.mu)

    priv = evaluate(sigma_eta)
    step = 1e-10
    while priv.mu > target:  # verification, nudged towards more noise (terminates: mu ~ 1/s)
        sigma_eta *= 1.0 + step
        step *= 2.0
        priv = evaluate(sigma_eta)
    return GopaCalibration(
        parties=k,
        honest_count=n_h,
        peers=m,
        epsilon=float(epsilon),
        delta=float(delta),
        sigma_eta=sigma_eta,
        sigma_delta=sigma_eta * math.sqrt(t),
        target_mu=target,
        privacy=priv,
        output_std=sigma_eta / math.sqrt(k),
        central_std=1.0 / (k * target),
        local_std=1.0 / (math.sqrt(k) * target),
        edges=e,
    )


def simulate_gopa_std(
    calibration: GopaCalibration, *, trials: int = 200, rng: np.random.Generator | None = None
) -> float:
    """Monte Carlo standard deviation of GOPA's released mean (pairwise noise included).

    Vectorised over trials: draws ``eta`` and one ``y`` per edge, forms every party's message
    and averages; the pairwise terms cancel up to float rounding, so this matches
    ``calibration.output_std``.
    """
    n = check_int("trials", trials, 2)
    k = calibration.parties
    e = calibration.edges
    values = get_source(rng).uniform(k)
    eta = gaussian_noise(calibration.sigma_eta, (n, k), rng)
    y = gaussian_noise(calibration.sigma_delta, (n, e.shape[0]), rng)
    inc = scipy.sparse.coo_matrix(
        (
            np.concatenate([np.ones(e.shape[0]), -np.ones(e.shape[0])]),
            (np.concatenate([e[:, 0], e[:, 1]]), np.tile(np.arange(e.shape[0]), 2)),
        ),
        shape=(k, e.shape[0]),
    ).tocsr()
    messages = values[None, :] + eta + (inc @ y.T).T
    err = messages.mean(axis=1) - values.mean()
    return float(np.sqrt(np.mean(err**2)))


# --------------------------------------------------------------------------- protocol


class GopaProtocol:
    """GOPA run in one process over the per-party API (the reference simulation).

    Every party is a :class:`~renyi.federated.gopa_party.GopaParty` holding only its own
    value and a fresh Ed25519 identity; the server is a
    :class:`~renyi.federated.gopa_party.GopaAggregator`; the "network" is the dictionaries
    :attr:`directory` (signed key advertisements) and :attr:`inboxes` (AEAD pairing
    messages), which a test may tamper with between :meth:`send_seeds` and
    :meth:`aggregate`, as a malicious relay would. The deployed version
    (:mod:`renyi.federated.gopa_flower`) exchanges exactly the same messages and releases the
    bit-identical estimate for the same values and noise keys.

    ``noise_keys``: one 32-byte key per party for its ``eta`` (``ChaCha20Source``),
    otherwise ``rng`` (``None``: OS CSPRNG) draws ``eta``, seeds and the session id.
    ``reveal_budget``: neighbours each party will drop or reveal (0: any dropout aborts).

    >>> proto = GopaProtocol([0.1, 0.5, 0.9, 0.3], sigma_eta=0.0, sigma_delta=5.0, peers=2)
    >>> res = proto.run()  # no independent noise: the mean, on the lattice 2**-32
    >>> abs(res.estimate - 0.45) <= 2**-33, bool(res.estimate == res.lattice * res.total[0] / 4)
    (True, True)
    """

    def __init__(
        self,
        values: ArrayLike,
        *,
        sigma_eta: float,
        sigma_delta: float,
        peers: int,
        edges: ArrayLike | None = None,
        rng: np.random.Generator | None = None,
        reveal_budget: int = 0,
        noise_keys: Sequence[bytes] | None = None,
    ) -> None:
        arr = check_values(values)
        if arr.shape[0] < 2:
            raise fail("values", arr.shape, "at least 2 parties")
        k = arr.shape[0]
        e = (
            random_peer_graph(k, check_int("peers", peers, 1), rng)
            if edges is None
            else _check_edges(edges, k)
        )
        if noise_keys is not None and len(noise_keys) != k:
            raise fail("noise_keys", len(noise_keys), f"one 32-byte key per party ({k})")
        vector = arr.ndim == 2
        names = tuple(f"party-{i}" for i in range(k))
        self.session = GopaSession(
            session=bytes(get_source(rng).words(2).view(np.uint8)),
            names=names,
            edges=e,
            sigma_eta=sigma_eta,
            sigma_delta=sigma_delta,
            dimension=arr.shape[1] if vector else 1,
            vector=vector,
            reveal_budget=reveal_budget,
        )
        self.edges = self.session.edges
        self.sigma_eta = self.session.sigma_eta
        self.sigma_delta = self.session.sigma_delta
        identities = [IdentityKey(n) for n in names]
        self.roster = Roster.of(identities)
        self.parties = [
            GopaParty(
                identities[i],
                self.roster,
                arr[i],
                vector=vector,
                rng=rng if noise_keys is None else ChaCha20Source(noise_keys[i]),
                seed_rng=rng,
            )
            for i in range(k)
        ]
        self.server = GopaAggregator(self.session)
        self.directory: dict[str, bytes] = {}
        self.inboxes: dict[str, dict[str, bytes]] = {}
        self.present: tuple[int, ...] = ()

    def send_seeds(self, absent: ArrayLike = ()) -> None:
        """Key advertisement and pairing; ``absent`` parties never join (no cost)."""
        k = len(self.parties)
        gone = set(np.asarray(absent, dtype=np.int64).tolist())
        if any(not 0 <= a < k for a in gone):
            raise fail("absent", sorted(gone), f"indices in [0, {k - 1}]")
        self.present = tuple(i for i in range(k) if i not in gone)
        self.directory = {
            self.parties[i].name: self.parties[i].join(self.session).to_bytes()
            for i in self.present
        }
        outboxes = {
            self.parties[i].name: self.parties[i].pair(self.directory) for i in self.present
        }
        self.inboxes = GopaAggregator.route(outboxes)

    def aggregate(
        self,
        dropouts: ArrayLike = (),
        *,
        on_dropout: Literal["recover", "abort"] = "recover",
        replace: dict[int, object] | None = None,
    ) -> GopaResult:
        """Masking and release; ``dropouts`` paired but send no masked value.

        ``replace`` substitutes what the server receives from some parties (tests: garbage
        or a corrupted party's message). ``on_dropout="abort"`` refuses to recover.
        """
        if not self.present:
            raise ProtocolAbortedError("aggregate() called before the pairing phase")
        if on_dropout not in ("recover", "abort"):
            raise fail("on_dropout", on_dropout, "'recover' or 'abort'")
        k = len(self.parties)
        drop = set(np.asarray(dropouts, dtype=np.int64).tolist())
        if any(not 0 <= d < k for d in drop):
            raise fail("dropouts", sorted(drop), f"indices in [0, {k - 1}]")
        if drop and on_dropout == "abort":
            raise ProtocolAbortedError(
                f"parties {sorted(drop)} dropped after pairing; their pairwise noise would"
                " not cancel, so nothing is released"
            )
        names = [self.parties[i].name for i in self.present]
        messages: dict[int, object] = {}
        for i in self.present:
            if i in drop:
                continue
            p = self.parties[i]
            messages[i] = p.mask(self.inboxes.get(p.name, {}), names)
        for i, m in (replace or {}).items():
            messages[i] = m

        def reveal(dropped: list[str]) -> dict[int, dict[int, NDArray[np.uint64]]]:
            if on_dropout == "abort":
                raise ProtocolAbortedError(f"messages of {dropped} rejected; not recovering")
            return {
                i: self.parties[i].reveal(dropped)
                for i in messages
                if self.parties[i].name not in dropped
            }

        return self.server.release(messages, self.present, reveal)

    def run(
        self, dropouts: ArrayLike = (), *, on_dropout: Literal["recover", "abort"] = "recover"
    ) -> GopaResult:
        """Pairing then aggregation."""
        self.send_seeds()
        return self.aggregate(dropouts, on_dropout=on_dropout)

    def privacy(self, honest: ArrayLike | None = None, dropouts: ArrayLike = ()) -> GopaPrivacy:
        """Exact guarantee of this run for ``honest`` (default everyone) after ``dropouts``.

        Dropped parties and every edge touching them are removed (their pairwise terms were
        revealed or never used); what remains is :func:`gopa_mu` on the survivors. This is
        the honest-server guarantee; under a server that lies about dropouts see
        :meth:`GopaSession.lying_server_mu`.
        """
        k = len(self.parties)
        mask = np.zeros(k, dtype=bool)
        mask[_honest_index(honest, k)] = True
        mask[np.asarray(dropouts, dtype=np.int64)] = False
        return gopa_mu(self.edges, self.sigma_eta, self.sigma_delta, parties=k, honest=mask)
