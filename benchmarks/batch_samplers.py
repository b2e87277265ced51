"""ε of one DP-SGD run under each batch sampler, ours beside dp_accounting and jax_privacy.

Same (σ, n, b, epochs) for every sampler, δ = 1e-5. For each sampler: our RDP and PLD upper
bounds (where the event has that analysis), dp_accounting's value where it has the event
(0.6.0: Poisson and truncated Poisson by PLD, fixed-size by RDP; it has no random-allocation
or shuffling event), the proven lower bound for the one-batch-per-epoch samplers, and for
random allocation a Monte Carlo check: δ at our ε estimated from privacy-loss samples (ours,
and jax_privacy's balls-in-bins sampler of the dominating pair for 1 epoch) with a 99 %
confidence interval. A script, not a test.

    .venv/bin/python benchmarks/batch_samplers.py                  # n=60000, b=256, σ=1.1
    .venv/bin/python benchmarks/batch_samplers.py --epochs 1 --mc-samples 200000
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np

from renyi.accountants import epsilon_report
from renyi.allocation import allocation_delta_monte_carlo, one_of_t_epsilon_lower_bound
from renyi.events import SAMPLINGS, default_max_batch_size, training_event


def _dp_accounting(sampling: str, n: int, b: int, sigma: float, steps: int, delta: float):
    try:
        import dp_accounting as dpa
    except ImportError:  # pragma: no cover - optional peer
        return None
    q = b / n
    if sampling == "poisson":
        event = dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))
        acc = dpa.pld.PLDAccountant()
    elif sampling == "truncated-poisson":
        event = dpa.TruncatedSubsampledGaussianDpEvent(n, q, default_max_batch_size(b), sigma)
        acc = dpa.pld.PLDAccountant()
    elif sampling == "fixed-size":
        event = dpa.SampledWithoutReplacementDpEvent(n, b, dpa.GaussianDpEvent(sigma / 2))
        acc = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    else:
        return None
    acc.compose(dpa.SelfComposedDpEvent(event, steps))
    return float(acc.get_epsilon(delta))


def _jax_privacy_delta(t: int, sigma: float, eps: float, samples: int) -> tuple[float, float]:
    """δ(ε) of one epoch of balls in bins from jax_privacy's dominating-pair sampler."""
    try:
        from jax_privacy import batch_selection
        from jax_privacy.experimental.monte_carlo import sample_generation as sg
    except Exception:  # pragma: no cover - optional peer
        return math.nan, math.nan
    strategy = batch_selection.BallsInBinsSampling(iterations=t, cycle_length=t)
    losses = np.array(
        [
            sg.get_privacy_loss_sample(strategy, sigma, np.array([1.0]), seed=s)[0]
            for s in range(samples)
        ]
    )
    vals = -np.expm1(np.minimum(eps - losses, 0.0))
    return float(vals.mean()), float(2.576 * vals.std(ddof=1) / math.sqrt(samples))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=60_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--sigma", type=float, default=1.1)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--mc-samples", type=int, default=100_000)
    p.add_argument("--jax-samples", type=int, default=2_000)
    a = p.parse_args()
    n, b, sigma, e, delta = a.n, a.batch_size, a.sigma, a.epochs, a.delta
    print(f"n={n} b={b} sigma={sigma} epochs={e} delta={delta:g}")
    print(f"{'sampler':18} {'ours rdp':>9} {'ours pld':>9} {'dp_acc':>9} {'lower':>9}  notes")
    eps_poisson = math.nan
    for sampling in SAMPLINGS:
        per_epoch = {"random-allocation": n // b, "shuffle": -(-n // b)}.get(sampling, n / b)
        steps = math.ceil(e * per_epoch)
        event = training_event(sampling, sigma, dataset_size=n, batch_size=b, steps=steps)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = epsilon_report(event, delta=delta, accountants=["rdp", "pld"])
        ours = {r.accountant: r.epsilon for r in rep.results}
        dt = time.perf_counter() - t0
        peer = _dp_accounting(sampling, n, b, sigma, steps, delta)
        lower, notes = math.nan, f"{dt:.2f} s"
        if sampling in ("random-allocation", "shuffle"):
            t = int(per_epoch)
            shift = 2.0 if sampling == "shuffle" else 1.0
            lower = one_of_t_epsilon_lower_bound(t, sigma, delta, epochs=e, sensitivity=shift)
        if sampling == "poisson":
            eps_poisson = ours["pld"]
        if sampling == "random-allocation" and e == 1:
            eps = eps_poisson  # where is allocation's true delta at Poisson's epsilon?
            est, lo, hi = allocation_delta_monte_carlo(
                t, sigma, eps, samples=a.mc_samples, rng=np.random.default_rng(1), confidence=0.99
            )
            jd, jh = _jax_privacy_delta(t, sigma, eps, a.jax_samples)
            notes += f"; MC delta({eps:.4f}) = {est:.2e} [{lo:.2e}, {hi:.2e}]"
            notes += f"; jax_privacy MC {jd:.2e} +- {jh:.1e} ({a.jax_samples} samples)"
        fmt = lambda x: "n/a" if x is None or not math.isfinite(x) else f"{x:.4f}"  # noqa: E731
        print(
            f"{sampling:18} {fmt(ours.get('rdp')):>9} {fmt(ours.get('pld')):>9} "
            f"{fmt(peer):>9} {fmt(lower):>9}  {notes}"
        )


if __name__ == "__main__":
    main()
