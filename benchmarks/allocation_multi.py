"""k-of-t random allocation: the whole-pair upper bound (renyi.analysis.allocation_multi;
for k >= 4 the composition of whole 2- and 3-of-m pairs over blocks) against the block
decomposition into 1-of-m allocations, the certified lower bound and Monte Carlo.

Run: ``PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/allocation_multi.py``
(about a minute of one core at load 1; Monte Carlo: 2e5 samples a direction, 99 %).
"""

from __future__ import annotations

import time

import numpy as np

from renyi.analysis.allocation import allocation_epsilon_monte_carlo
from renyi.analysis.allocation_lower import allocation_epsilon_lower_bound
from renyi.analysis.allocation_multi import whole_blocks_pld
from renyi.analysis.allocation_pld import allocation_pld
from renyi.analysis.pld import PrivacyLossDistribution

# (t, k, sigma, epochs, delta): the two (docs/correlated.md) then held-out ones
SETTINGS = [
    (5, 2, 0.9, 2, 1e-3),
    (6, 3, 1.0, 2, 1e-3),
    (4, 2, 0.8, 3, 1e-3),
    (7, 2, 1.1, 2, 1e-4),
    (10, 2, 1.3, 4, 1e-5),
    (7, 3, 1.2, 2, 1e-4),
    (12, 2, 1.0, 1, 1e-3),
    (12, 4, 1.0, 1, 1e-3),
    (20, 4, 1.0, 2, 1e-4),
    (13, 5, 1.1, 1, 1e-3),
]


def _eps(pair: tuple[PrivacyLossDistribution, PrivacyLossDistribution], e: int, d: float) -> float:
    rem, add = pair
    if e > 1:
        rem, add = rem.self_compose(e), add.self_compose(e)
    return max(float(rem.epsilon_for_delta(d).upper), float(add.epsilon_for_delta(d).upper))


def main() -> None:
    print(
        "| t, k, σ, epochs, δ | blocks | whole pair | reported | Monte Carlo (99 %) | lower | "
        "reported / MC | reported / lower | s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t, k, sigma, e, d in SETTINGS:
        t0 = time.process_time()
        whole = whole_blocks_pld(t, sigma, k)
        cpu = time.process_time() - t0
        blocks = _eps(allocation_pld(t, sigma, num_selected=k, whole_pair=False), e, d)
        w = _eps(whole, e, d) if whole is not None else float("nan")
        rep = _eps(allocation_pld(t, sigma, num_selected=k), e, d)
        est, lo_mc, hi_mc = allocation_epsilon_monte_carlo(
            t,
            sigma,
            d,
            num_selected=k,
            epochs=e,
            samples=200_000,
            rng=np.random.default_rng(t * 1000 + k),
        )
        low = allocation_epsilon_lower_bound(t, sigma, d, num_selected=k, epochs=e)
        print(
            f"| {t}, {k}, {sigma}, {e}, {d:g} | {blocks:.4f} | {w:.4f} | {rep:.4f} | "
            f"{est:.4f} ({lo_mc:.4f}, {hi_mc:.4f}) | {low:.4f} | {rep / est:.3f} | "
            f"{rep / low:.3f} | {cpu:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
