"""ε of one DP-SGD run under each batch sampler, ours beside dp_accounting and jax_privacy.

Same (σ, n, b, epochs) for every sampler, δ = 1e-5. For each sampler: our RDP and PLD upper
bounds (where the event has that analysis), dp_accounting's value where it has the event
(0.6.0: Poisson and truncated Poisson by PLD, fixed-size by RDP; it has no random-allocation
or shuffling event), jax_privacy 2.0.0's DP-SGD accountant where it has the sampler (Poisson,
truncated Poisson, fixed size by its reduction to Poisson at σ/2; balls in bins only by Monte
Carlo), the proven lower bound for the one-batch-per-epoch samplers, and for
random allocation a Monte Carlo reference: privacy-loss samples of the dominating pair (the
remove direction sampled under P, the add direction under Q, so every summand of
δ(ε) = E[(1 - e^(ε - L))_+] lies in [0, 1]), giving the ε at which the estimated δ crosses
the target with a 99 % confidence interval, and δ at our ε (also from jax_privacy's
balls-in-bins sampler of the dominating pair, 1 epoch). A script, not a test.

    .venv/bin/python benchmarks/batch_samplers.py                  # n=60000, b=256, σ=1.1
    .venv/bin/python benchmarks/batch_samplers.py --epochs 1 --mc-samples 2000000
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np

from renyi.accountants import epsilon_report
from renyi.allocation import one_of_t_epsilon_lower_bound
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


def _jax_privacy_eps(sampling: str, n: int, b: int, sigma: float, steps: int, delta: float):
    """jax_privacy 2.0.0's DP-SGD accountant (PLD) where it has the sampler: Poisson,
    truncated Poisson and fixed size (its reduction: Poisson at σ/2); None elsewhere."""
    try:
        from jax_privacy.accounting import accountants, analysis
    except Exception:  # pragma: no cover - optional peer
        return None
    kwargs = {}
    if sampling == "poisson":
        pass
    elif sampling == "truncated-poisson":
        kwargs = {"truncated_batch_size": default_max_batch_size(b)}
    elif sampling == "fixed-size":
        kwargs = {"sampling_method": analysis.SamplingMethod.FIXED_BATCH_SIZE}
    else:
        return None
    params = analysis.DpParams(
        noise_multipliers=sigma, num_samples=n, delta=delta, batch_size=b, **kwargs
    )
    acc = analysis.DpsgdTrainingAccountant(accountants.PldAccountantConfig())
    return float(acc.compute_epsilon(steps, params))


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


def _allocation_losses(
    t: int, sigma: float, epochs: int, samples: int, direction: str, seed: int
) -> np.ndarray:
    """Privacy-loss samples of ``epochs`` epochs of 1-of-t allocation: remove direction
    ``log Y`` under P (the record in step 0 by symmetry), add direction ``-log Y`` under Q."""
    from scipy.special import logsumexp

    rng = np.random.default_rng(seed)
    out = np.zeros(samples)
    chunk = max(1, 4_000_000 // t)
    for start in range(0, samples, chunk):
        rows = min(chunk, samples - start)
        for _ in range(epochs):
            x = rng.normal(0.0, sigma, size=(rows, t))
            if direction == "remove":
                x[:, 0] += 1.0
            log_y = logsumexp((x - 0.5) / sigma**2, axis=1) - math.log(t)
            out[start : start + rows] += log_y if direction == "remove" else -log_y
    return out


def _mc_delta(losses: np.ndarray, eps: float, z: float = 2.576) -> tuple[float, float, float]:
    vals = -np.expm1(np.minimum(eps - losses, 0.0))
    est = float(vals.mean())
    half = z * float(vals.std(ddof=1)) / math.sqrt(losses.size)
    return est, est - half, est + half


def _mc_epsilon(losses: list[np.ndarray], delta: float) -> tuple[float, float, float]:
    """ε where the Monte Carlo δ (max over directions) crosses ``delta``: (estimate, low,
    high), the ends from the 99 % confidence limits of δ (bisection on each)."""

    def solve(which: int) -> float:
        lo, hi = 0.0, 20.0
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            d = max(_mc_delta(L, mid)[which] for L in losses)
            lo, hi = (mid, hi) if d > delta else (lo, mid)
        return hi

    return solve(0), solve(1), solve(2)


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
    head = f"{'sampler':18} {'ours rdp':>9} {'ours pld':>9} {'dp_acc':>9} {'jax_priv':>9}"
    print(f"{head} {'lower':>9}  notes")
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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jax_eps = _jax_privacy_eps(sampling, n, b, sigma, steps, delta)
        lower, notes = math.nan, f"{dt:.2f} s"
        if sampling in ("random-allocation", "shuffle"):
            t = int(per_epoch)
            shift = 2.0 if sampling == "shuffle" else 1.0
            lower = one_of_t_epsilon_lower_bound(t, sigma, delta, epochs=e, sensitivity=shift)
        if sampling == "poisson":
            eps_poisson = ours["pld"]
        if sampling == "random-allocation":
            t0 = time.perf_counter()
            losses = [
                _allocation_losses(t, sigma, e, a.mc_samples, d, seed=1 + i)
                for i, d in enumerate(("remove", "add"))
            ]
            me, mlo, mhi = _mc_epsilon(losses, delta)
            eps_ours = ours["pld"]
            d_ours = max((_mc_delta(L, eps_ours) for L in losses), key=lambda r: r[0])
            d_pois = max((_mc_delta(L, eps_poisson) for L in losses), key=lambda r: r[0])
            notes += (
                f"; MC ({a.mc_samples} samples, {time.perf_counter() - t0:.0f} s): "
                f"eps {me:.4f} [{mlo:.4f}, {mhi:.4f}] at delta {delta:g}; "
                f"MC delta({eps_ours:.4f}) = {d_ours[0]:.2e} [{d_ours[1]:.2e}, {d_ours[2]:.2e}]"
                f"; MC delta({eps_poisson:.4f}) = {d_pois[0]:.2e} "
                f"[{d_pois[1]:.2e}, {d_pois[2]:.2e}]"
            )
            if e == 1 and a.jax_samples:
                jd, jh = _jax_privacy_delta(t, sigma, eps_ours, a.jax_samples)
                notes += f"; jax_privacy MC delta({eps_ours:.4f}) {jd:.2e} +- {jh:.1e}"
                notes += f" ({a.jax_samples} samples; it has no balls-in-bins accountant)"
        fmt = lambda x: "n/a" if x is None or not math.isfinite(x) else f"{x:.4f}"  # noqa: E731
        print(
            f"{sampling:18} {fmt(ours.get('rdp')):>9} {fmt(ours.get('pld')):>9} "
            f"{fmt(peer):>9} {fmt(jax_eps):>9} {fmt(lower):>9}  {notes}"
        )


if __name__ == "__main__":
    main()
