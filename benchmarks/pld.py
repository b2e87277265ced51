"""Speed and tightness of renyi.pld against dp_accounting's PLD and the PRV accountants.

    .venv/bin/python benchmarks/pld.py [--repeats 7] [--quick]

Setting: Abadi et al. MNIST, q = 256/60000, sigma = 1.1, T = 14 100, delta = 1e-5, both
add/remove directions (the reported epsilon is the larger). Rows are run interleaved (a slow
moment of the shared machine hits every library alike) and report the median wall time, the
epsilon and the ratio peer time / renyi time (> 1: renyi is faster). renyi reports a rigorous
bracket [lower, upper]; "upper" is the number comparable to dp_accounting's pessimistic
estimate. The last table shows run time against T: compositions wider than max_bins = 2^17
grid points run as a ladder of FFT powers on grids coarsened by powers of two, so time grows
like log T (column ms / ln T; "cpu" is the process time, less sensitive to other jobs on a
shared machine); "no ladder" is the same computation with max_bins = 2^22 (one FFT power on
the fine grid, window ~ sqrt(T)). "width" is (upper - lower) / upper, "grid" the
grid step and points of the composed distribution (remove direction).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

Q, SIGMA, STEPS, DELTA = 256 / 60000, 1.1, 14100, 1e-5


def ours(
    steps: int = STEPS, h: float = 1e-4, delta: float = DELTA, q: float = Q, sigma: float = SIGMA
) -> tuple[float, float, float]:
    from renyi.pld import PrivacyLossDistribution as PLD

    bounds = [
        PLD.subsampled_gaussian(q, sigma, direction=d, value_discretization_interval=h)
        .self_compose(steps)
        .epsilon_for_delta(delta)
        for d in ("remove", "add")
    ]
    return (
        max(b.lower for b in bounds),
        max(b.estimate for b in bounds),
        max(b.upper for b in bounds),
    )


def ours_scaling(steps: int, max_bins: int = 1 << 17) -> tuple[float, float, float, int]:
    """(lower, upper, grid step, grid points) of the composed PLDs (both directions)."""
    from renyi.pld import PrivacyLossDistribution as PLD

    plds = [
        PLD.subsampled_gaussian(Q, SIGMA, direction=d).self_compose(steps, max_bins=max_bins)
        for d in ("remove", "add")
    ]
    bounds = [p.epsilon_for_delta(DELTA) for p in plds]
    return (
        max(b.lower for b in bounds),
        max(b.upper for b in bounds),
        plds[0].value_discretization_interval,
        plds[0].support_size,
    )


def dp_accounting_pld(
    steps: int = STEPS, h: float = 1e-4, delta: float = DELTA, q: float = Q, sigma: float = SIGMA
) -> float:
    from dp_accounting.pld import privacy_loss_distribution as dpl

    pld = dpl.from_gaussian_mechanism(sigma, value_discretization_interval=h, sampling_prob=q)
    return float(pld.self_compose(steps).get_epsilon_for_delta(delta))


def prv_accountant(steps: int = STEPS, delta: float = DELTA) -> tuple[float, float, float]:
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

    acc = PRVAccountant(
        prvs=[PoissonSubsampledGaussianMechanism(sampling_probability=Q, noise_multiplier=SIGMA)],
        eps_error=0.01,
        delta_error=delta / 1000,
        max_self_compositions=[steps],
    )
    lo, est, up = acc.compute_epsilon(delta=delta, num_self_compositions=[steps])
    return float(lo), float(est), float(up)


def opacus_prv(steps: int = STEPS, delta: float = DELTA) -> float:
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(SIGMA, Q, steps)]
    return float(acc.get_epsilon(delta))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def interleaved(tasks: dict[str, Callable[[], Any]], repeats: int) -> dict[str, tuple[float, Any]]:
    times: dict[str, list[float]] = {k: [] for k in tasks}
    values: dict[str, Any] = {}
    for name, fn in tasks.items():  # warm-up: imports, caches
        values[name] = fn()
    for _ in range(repeats):
        for name, fn in tasks.items():
            dt, values[name] = timed(fn)
            times[name].append(dt)
    return {k: (statistics.median(v), values[k]) for k, v in times.items()}


def interleaved_cpu(
    tasks: dict[str, Callable[[], Any]], repeats: int
) -> tuple[dict[str, tuple[float, Any]], dict[str, float]]:
    """:func:`interleaved`, also returning the median process (CPU) time of each task: less
    sensitive than wall time to other jobs on a shared machine."""
    wall: dict[str, list[float]] = {k: [] for k in tasks}
    cpu: dict[str, list[float]] = {k: [] for k in tasks}
    values = {name: fn() for name, fn in tasks.items()}  # warm-up
    for _ in range(repeats):
        for name, fn in tasks.items():
            c0, t0 = time.process_time(), time.perf_counter()
            values[name] = fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return (
        {k: (statistics.median(v), values[k]) for k, v in wall.items()},
        {k: statistics.median(v) for k, v in cpu.items()},
    )


def fmt_eps(v: Any) -> str:
    if isinstance(v, tuple):
        return f"{v[2]:.6f}  [{v[0]:.4f}, {v[2]:.4f}]"
    return f"{v:.6f}"


def table(title: str, res: dict[str, tuple[float, Any]]) -> str:
    ref = res["renyi"][0]
    lines = [title, f"{'library':32s} {'time':>10s} {'ratio':>7s}  epsilon  [lower, upper]"]
    for name, (t, v) in res.items():
        lines.append(f"{name:32s} {t * 1e3:8.1f}ms {t / ref:7.2f}  {fmt_eps(v)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="skip h=1e-5 and T=10^6 peers")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")

    coarse: dict[str, Callable[[], Any]] = {
        "renyi": lambda: ours(h=1e-4),
        "dp_accounting PLD (h=1e-4)": lambda: dp_accounting_pld(h=1e-4),
        "prv_accountant (eps_error=0.01)": prv_accountant,
    }
    try:
        import opacus  # noqa: F401

        coarse["opacus PRV"] = opacus_prv
    except ImportError:  # pragma: no cover
        pass
    print(table(f"MNIST eps(delta=1e-5), h=1e-4, T={STEPS}", interleaved(coarse, args.repeats)))
    print()
    if not args.quick:
        fine = {
            "renyi": lambda: ours(h=1e-5),
            "dp_accounting PLD (h=1e-5)": lambda: dp_accounting_pld(h=1e-5),
        }
        print(table(f"MNIST eps(delta=1e-5), h=1e-5, T={STEPS}", interleaved(fine, 2)))
        print()
    tiny = {"renyi": lambda: ours(h=1e-4, delta=1e-12)}
    print(table("MNIST eps(delta=1e-12), h=1e-4", interleaved(tiny, 3)))
    print()
    # a heavy-tailed composition (tiny q, few steps) at a small delta: float64 FFT round-off
    # would set the bound, so renyi redoes the query in extended precision
    hard = dict(steps=62, q=4.9e-4, sigma=1.09, delta=2.1e-10)
    small_q = {
        "renyi": lambda: ours(h=1e-4, **hard),  # type: ignore[arg-type]
        "dp_accounting PLD (h=1e-4)": lambda: dp_accounting_pld(h=1e-4, **hard),  # type: ignore[arg-type]
    }
    print(table("q=4.9e-4, sigma=1.09, T=62, eps(delta=2.1e-10)", interleaved(small_q, 3)))
    print()
    # renyi alone first, all T interleaved (the peers' large allocations would otherwise
    # slow whichever call comes next); then the peers, each row interleaved with renyi
    counts = (10**3, 10**4, 10**5, 10**6)
    own: dict[str, Callable[[], Any]] = {}
    for steps in counts:
        own[f"renyi {steps}"] = partial(ours_scaling, steps)
        own[f"direct {steps}"] = partial(ours_scaling, steps, max_bins=1 << 22)
    mine, cpu = interleaved_cpu(own, args.repeats)
    print("run time against T (h=1e-4, both directions, both bounds; median of interleaved runs)")
    head = (
        f"{'T':>9s} {'renyi':>9s} {'ms/ln T':>7s} {'cpu':>9s} {'cpu/ln T':>8s}"
        f" {'eps lower':>10s} {'eps upper':>10s}"
        f" {'width':>7s} {'grid':>8s} {'points':>7s} {'no ladder':>10s}"
        f" {'dp_accounting':>13s} {'opacus PRV':>10s}"
    )
    print(head)
    for steps in counts:
        t, (lo, up, grid, points) = mine[f"renyi {steps}"]
        cells = [
            f"{t * 1e3:7.1f}ms",
            f"{t * 1e3 / math.log(steps):7.2f}",
            f"{cpu[f'renyi {steps}'] * 1e3:7.1f}ms",
            f"{cpu[f'renyi {steps}'] * 1e3 / math.log(steps):8.2f}",
            f"{lo:10.5f}",
            f"{up:10.5f}",
            f"{(up - lo) / up:7.4f}",
            f"{grid:8.1e}",
            f"{points:7d}",
            f"{mine[f'direct {steps}'][0] * 1e3:8.1f}ms",
        ]
        row: dict[str, Callable[[], Any]] = {}
        if not args.quick or steps <= 10**4:
            row["dpa"] = partial(dp_accounting_pld, steps=steps)
            row["prv"] = partial(opacus_prv, steps=steps)
        res = interleaved(row, 2 if steps >= 10**5 else 3) if row else {}
        for key, width in (("dpa", 11), ("prv", 8)):
            cells.append(
                f"{res[key][0] * 1e3:{width}.1f}ms" if key in res else f"{'-':>{width + 2}s}"
            )
        print(f"{steps:9d} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
