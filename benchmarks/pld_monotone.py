"""Is the PLD accountant's epsilon monotone in q, sigma and T? (issues 16 and 30)

The true epsilon(delta) of T Poisson-subsampled Gaussian steps grows with the sampling rate q
and the number of steps T and shrinks as the noise multiplier sigma grows. A reported upper
bound that breaks this order misleads calibration (a bisection on sigma or T stops short of
its target). This script draws random settings and compares each with its neighbours
q * 1.01, sigma / 1.01 and T + 1: a neighbour whose epsilon is *smaller* is a violation.

``--regime broad`` (issue 16, the held-out check): q in [1e-4, 1], sigma in [0.3, 5],
T in [1, 1e4] (log-uniform), delta in [1e-12, 1e-3].
``--regime rare`` (issue 30, rare participation at tiny delta): q in [1e-6, 1e-3],
q T in [1e-3, 2], sigma in [0.5, 1.5], delta in [1e-15, 1e-11] (log-uniform, T <= 1e6).

    python benchmarks/pld_monotone.py --settings 480 --seed 16
    python benchmarks/pld_monotone.py --regime rare --settings 300 --seed 30

Prints one line per violation and a summary (settings, comparisons, violations, worst
relative drop, run time). ``--json PATH`` writes every record.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings

import numpy as np

from renyi.accountants import PldAccountant
from renyi.events import GaussianEvent, PoissonSampledEvent


def draw(rng: np.random.Generator) -> tuple[float, float, int, float]:
    q = float(10 ** rng.uniform(-4, 0))
    sigma = float(10 ** rng.uniform(math.log10(0.3), math.log10(5.0)))
    steps = round(float(10 ** rng.uniform(0, 4)))
    delta = float(10 ** rng.uniform(-12, -3))
    return q, sigma, steps, delta


def draw_rare(rng: np.random.Generator) -> tuple[float, float, int, float]:
    """Rare participation at tiny delta (issue 30): q T <= 2, sigma <= 1.5, delta <= 1e-11."""
    q = float(10 ** rng.uniform(-6, -3))
    qt = float(10 ** rng.uniform(-3, math.log10(2.0)))
    steps = max(1, min(round(qt / q), 10**6))
    sigma = float(10 ** rng.uniform(math.log10(0.5), math.log10(1.5)))
    delta = float(10 ** rng.uniform(-15, -11))
    return q, sigma, steps, delta


DRAWS = {"broad": draw, "rare": draw_rare}


def epsilon(q: float, sigma: float, steps: int, delta: float, h: float = 1e-4) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = PldAccountant(value_discretization_interval=h)
        acc.compose(PoissonSampledEvent(q, GaussianEvent(sigma)), steps)
        return float(acc.epsilon(delta).epsilon)


def neighbours(q: float, sigma: float, steps: int) -> list[tuple[str, float, float, int]]:
    """(name, q', sigma', T') with a true epsilon at least that of (q, sigma, T)."""
    out = [("sigma/1.01", q, sigma / 1.01, steps), ("T+1", q, sigma, steps + 1)]
    if q < 1.0:
        out.insert(0, ("q*1.01", min(1.0, q * 1.01), sigma, steps))
    return out


def check(q: float, sigma: float, steps: int, delta: float) -> list[dict[str, object]]:
    base = epsilon(q, sigma, steps, delta)
    records = []
    for name, q2, s2, t2 in neighbours(q, sigma, steps):
        other = epsilon(q2, s2, t2, delta)
        records.append(
            {
                "q": q,
                "sigma": sigma,
                "steps": steps,
                "delta": delta,
                "neighbour": name,
                "epsilon": base,
                "neighbour_epsilon": other,
                "violation": bool(other < base),
            }
        )
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--regime", choices=sorted(DRAWS), default="broad")
    ap.add_argument("--settings", type=int, default=480)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--json", default=None)
    ap.add_argument("--start", type=int, default=0, help="first setting to run (for chunks)")
    ap.add_argument("--stop", type=int, default=None, help="one past the last setting")
    ap.add_argument("--progress", action="store_true", help="print every setting")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    todo = [DRAWS[args.regime](rng) for _ in range(args.settings)][args.start : args.stop]
    t0 = time.perf_counter()
    records: list[dict[str, object]] = []
    for i, setting in enumerate(todo, start=args.start):
        recs = check(*setting)
        records += recs
        if args.progress:
            print(
                f"setting {i}: "
                + " ".join(f"{r['neighbour_epsilon']:.9g}" for r in recs)
                + f" base {recs[0]['epsilon']:.9g}",
                flush=True,
            )
        for r in recs:
            if r["violation"]:
                print(
                    "violation: q={q:.4g} sigma={sigma:.4g} T={steps} delta={delta:.3g} "
                    "{neighbour}: {epsilon:.6g} -> {neighbour_epsilon:.6g}".format(**r),
                    flush=True,
                )
    bad = [r for r in records if r["violation"]]
    worst = max((1 - float(r["neighbour_epsilon"]) / float(r["epsilon"]) for r in bad), default=0.0)
    print(
        f"settings={len(todo)} comparisons={len(records)} violations={len(bad)} "
        f"settings_with_violation={len({(r['q'], r['sigma'], r['steps']) for r in bad})} "
        f"worst_relative_drop={worst:.3g} time={time.perf_counter() - t0:.0f}s"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
