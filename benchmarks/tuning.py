"""Private hyperparameter tuning: total ε of the whole search vs naive composition.

For one DP-SGD run (MNIST-like: q = 256/60000, σ = 1.1, T steps) and a search over 10 or 20
configurations, prints the ε at δ = 1e-5 of

* one run,
* naive composition of every configuration (what counting each run costs),
* the Papernot & Steinke selection with E[K] = 10 or 20 runs (geometric, logarithmic, η = 0.5
  truncated negative binomial, Poisson), from renyi and from dp_accounting's
  ``RepeatAndSelectDpEvent`` in the same run (a peer; same theorems),

with the median time of each accounting call.

    .venv/bin/python benchmarks/tuning.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from renyi.accountants import RdpAccountant
from renyi.events import GaussianEvent, PoissonSampledEvent, RepeatAndSelectEvent, SelfComposedEvent

Q, SIGMA, DELTA = 256 / 60000, 1.1, 1e-5


def _median_time(fn, repeats: int) -> tuple[float, float]:
    times, value = [], math.nan
    for _ in range(repeats):
        t = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t)
    return value, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2350, help="steps of one run (10 epochs)")
    args = parser.parse_args()
    try:
        import dp_accounting as dpa
    except ImportError:  # pragma: no cover - dev extra
        dpa = None
    run = SelfComposedEvent(PoissonSampledEvent(Q, GaussianEvent(SIGMA)), args.steps)
    one = RdpAccountant().compose(run).epsilon(DELTA).epsilon
    print(f"one DP-SGD run (q={Q:.5f}, σ={SIGMA}, T={args.steps}): ε = {one:.3f} at δ={DELTA:g}")
    print(
        f"{'configs':>7} {'naive':>8} | {'E[K]':>5} {'K ~':<14} {'renyi ε':>8} {'ms':>6}"
        f" {'dp_acc ε':>9} {'ms':>6}"
    )
    inner = None
    if dpa is not None:
        inner = dpa.SelfComposedDpEvent(
            dpa.PoissonSampledDpEvent(Q, dpa.GaussianDpEvent(SIGMA)), args.steps
        )
    for configs in (10, 20):
        naive = RdpAccountant().compose(run, count=configs).epsilon(DELTA).epsilon
        for shape, name in (
            (1.0, "geometric"),
            (0.0, "logarithmic"),
            (0.5, "TNB η=0.5"),
            (math.inf, "Poisson"),
        ):
            mean = float(configs)
            ours, t_ours = _median_time(
                lambda m=mean, s=shape: (
                    RdpAccountant().compose(RepeatAndSelectEvent(run, m, s)).epsilon(DELTA).epsilon
                ),
                args.repeats,
            )
            peer, t_peer = math.nan, math.nan
            if dpa is not None:

                def theirs(m: float = mean, s: float = shape) -> float:
                    acc = dpa.rdp.RdpAccountant()
                    acc.compose(dpa.dp_event.RepeatAndSelectDpEvent(inner, m, s))
                    return acc.get_epsilon(DELTA)

                peer, t_peer = _median_time(theirs, args.repeats)
            print(
                f"{configs:>7} {naive:>8.3f} | {mean:>5.0f} {name:<14} {ours:>8.3f} "
                f"{1e3 * t_ours:>6.1f} {peer:>9.3f} {1e3 * t_peer:>6.1f}"
            )


if __name__ == "__main__":
    main()
