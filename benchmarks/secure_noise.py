"""Secure aggregation's noise: rounded continuous Gaussian vs distributed discrete Gaussian.

The same target ε at δ for one round and the same threat model (a server that lies about
dropouts, colluding with ``c`` clients, on the same k-regular graph with threshold ``t``):

* **rounded Gaussian** (what ``renyi.federated.secure_fedavg`` and ``renyi.federated.secagg``
  run): each client adds ``N(0, σ_η²)`` to its scaled update (norm ≤ 1/2) plus Gaussian
  pairwise terms and rounds the message to the session lattice (post-processing); the
  parties verify the star bound ``worst_case_mu(σ_η, 10 σ_η, t, c)``
  (``calibrate_secagg``). Run: ``SecAggProtocol`` in process, all clients honest.
* **distributed discrete Gaussian** (KLS 2021, ``renyi.federated.ddg``): each client rounds
  ``x/γ`` without bias and adds ``N_Z(0, σ²)``; the server may learn only sums. On the same
  graph a lying server can still isolate the sum of the smallest honest component it can
  unmask, ``t − c + 1`` survivors (each needs ``t`` shares; at most ``c`` come from the
  coalition), so the round is charged ``DistributedDiscreteGaussianEvent(σ, clients = t − c
  + 1, Δ₂ = 1/γ + 2√d, ...)``; σ is the least that meets ε (bisection on the RDP
  accountant), γ puts σ near 2**20 integer steps (64-bit words: rounding and KLS's τ are
  negligible there). Run: ``DdgClient``/``DdgServer`` in process, all clients present.

Both are compared with central DP at the same ε (std ``1/(K μ)`` on the mean). The
measured std is over the ``d`` coordinates of one release (values: random vectors of norm
0.4). Nothing is asserted; CPU: about 1 min for the default K = 10, 100.

    .venv/bin/python benchmarks/secure_noise.py [--parties 10 100] [--dimension 1000]
"""

from __future__ import annotations

import argparse
import math
import os
import time
import warnings

import numpy as np

from renyi.accountants import RdpAccountant
from renyi.analysis.closed_forms import gaussian_mu
from renyi.analysis.events import GaussianEvent
from renyi.errors import InsecureRandomnessWarning
from renyi.federated.channels import IdentityKey, Roster
from renyi.federated.ddg import (
    DdgClient,
    DdgServer,
    DistributedDiscreteGaussianEvent,
    ddg_sensitivities,
)
from renyi.federated.secagg import (
    PartyPolicy,
    SecAggParty,
    SecAggProtocol,
    SecAggServer,
    SessionProposal,
)
from renyi.federated.secagg_accounting import (
    calibrate_secagg,
    smallest_safe_threshold,
    worst_case_mu,
)

EPS, DELTA, CORRUPT = 1.0, 1e-5, 1


def _values(k: int, d: int) -> np.ndarray:
    x = np.random.default_rng(k * 1000 + d).normal(size=(k, d))
    return 0.4 * x / np.linalg.norm(x, axis=1, keepdims=True)


def rounded_gaussian(k: int, d: int) -> dict[str, float]:
    peers = min(k - 1, 8)
    t = smallest_safe_threshold(peers, CORRUPT)
    cal = calibrate_secagg(EPS, DELTA, threshold=t, corrupt=CORRUPT)
    ids = [IdentityKey(f"p{i}") for i in range(k)]
    roster = Roster.of(ids)
    quorum = (k + CORRUPT) // 2 + 1
    policy = PartyPolicy(
        epsilon=EPS, delta=DELTA, min_sigma_eta=cal.sigma_eta, min_cohort=quorum,
        min_peers=peers, max_corrupt=CORRUPT,
    )  # fmt: skip
    proposal = SessionProposal(
        session=os.urandom(16), names=tuple(i.name for i in ids), sigma_eta=cal.sigma_eta,
        sigma_delta=cal.sigma_delta, peers=peers, threshold=t, min_survivors=quorum,
        dimension=d, vector=True,
    )  # fmt: skip
    x = _values(k, d)
    parties = [
        SecAggParty(ids[i], roster, x[i], policy, budget=None, vector=True) for i in range(k)
    ]
    t0 = time.perf_counter()
    res = SecAggProtocol(parties, SecAggServer(proposal, roster)).run()
    seconds = time.perf_counter() - t0
    err = np.asarray(res.estimate) - x.mean(axis=0)
    # the same star bound converted through RDP, as DDG's bound must be (no exact profile)
    lo, hi = cal.sigma_eta, 2.0 * cal.sigma_eta
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        event = GaussianEvent(1.0 / worst_case_mu(mid, 10 * mid, t, CORRUPT))
        ok = RdpAccountant().compose(event).epsilon(DELTA).epsilon <= EPS
        lo, hi = (lo, mid) if ok else (mid, hi)
    return {
        "sigma_rdp": hi,
        "threshold": t,
        "mu": cal.mu,
        "sigma_per_client": cal.sigma_eta,
        "std_expected": cal.sigma_eta / math.sqrt(k),
        "std_measured": float(err.std()),
        "seconds": seconds,
    }


def _ddg_epsilon(sigma: float, clients: int, gamma: float, d: int) -> float:
    l2, l1 = ddg_sensitivities(0.5, gamma, d)
    event = DistributedDiscreteGaussianEvent(sigma, clients, l2, l1, d)
    return float(RdpAccountant().compose(event).epsilon(DELTA).epsilon)


def distributed_discrete_gaussian(k: int, d: int) -> dict[str, float]:
    peers = min(k - 1, 8)
    t = smallest_safe_threshold(peers, CORRUPT)
    honest = t - CORRUPT + 1  # the smallest honest sum a lying server can isolate
    # gamma puts sigma near 2**20 integer steps: find sigma in real units, then rescale
    real = calibrate_secagg(EPS, DELTA, threshold=t, corrupt=CORRUPT).sigma_eta
    gamma = 2.0 ** math.floor(math.log2(real / 2.0**20))
    lo, hi = real / gamma / 2.0, real / gamma * 4.0
    while _ddg_epsilon(hi, honest, gamma, d) > EPS:
        hi *= 2.0
    for _ in range(40):  # bisection: the least sigma (integer units) meeting EPS
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if _ddg_epsilon(mid, honest, gamma, d) <= EPS else (mid, hi)
    sigma = float(math.ceil(hi))  # an integer variance parameter: exact for the sampler
    ids = [IdentityKey(f"p{i}") for i in range(k)]
    roster = Roster.of(ids)
    x = _values(k, d)
    clients = [
        DdgClient(ids[i], roster, x[i], clip_norm=0.5, gamma=gamma, local_sigma=sigma)
        for i in range(k)
    ]
    server = DdgServer(
        [i.name for i in ids], clip_norm=0.5, gamma=gamma, local_sigma=sigma, dimension=d
    )
    t0 = time.perf_counter()
    sid = os.urandom(16)
    directory = {c.name: c.join(sid).to_bytes() for c in clients}
    masked = {c.name: c.masked(directory) for c in clients}
    est = server.aggregate(masked)
    seconds = time.perf_counter() - t0
    err = est - x.mean(axis=0)
    return {
        "honest_shares": honest,
        "gamma": gamma,
        "sigma_per_client": sigma * gamma,
        "epsilon": _ddg_epsilon(sigma, honest, gamma, d),
        "std_expected": sigma * gamma / math.sqrt(k),
        "std_measured": float(err.std()),
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--parties", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--dimension", type=int, default=1000)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", InsecureRandomnessWarning)  # seeded values only
    mu = gaussian_mu(EPS, DELTA)
    for k in args.parties:
        d = args.dimension
        g = rounded_gaussian(k, d)
        q = distributed_discrete_gaussian(k, d)
        central = 1.0 / (k * mu)
        print(
            f"K={k} d={d} eps={EPS} delta={DELTA} c={CORRUPT} t={g['threshold']}"
            f" (load {os.getloadavg()[0]:.1f}):\n"
            f"    rounded Gaussian: sigma {g['sigma_per_client']:.4f} per client, std of the"
            f" mean {g['std_measured']:.4f} measured ({g['std_expected']:.4f} expected),"
            f" {g['std_measured'] / central:.3f} x central; {g['seconds']:.1f} s (sigma"
            f" {g['sigma_rdp']:.4f} if its star bound went through RDP, as DDG's must)\n"
            f"    discrete Gaussian: sigma {q['sigma_per_client']:.4f} per client"
            f" (gamma 2^{math.log2(q['gamma']):.0f}, {q['honest_shares']} honest shares,"
            f" eps {q['epsilon']:.4f}), std {q['std_measured']:.4f} measured"
            f" ({q['std_expected']:.4f} expected), {q['std_measured'] / central:.3f} x"
            f" central; {q['seconds']:.1f} s\n"
            f"    central DP: std {central:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
