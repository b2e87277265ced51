"""Accounting speed and tightness against the peers, in one interleaved run.

    .venv/bin/python benchmarks/accounting.py [--repeats 15] [--quick]

Setting: Abadi et al. MNIST, q = 256/60000, σ = 1.1, T = 14 100, δ = 1e-5 (plus T = 10^6
for the PLD scaling). In the RDP row σ is multiplied by (1 + 1e-12 i) on the i-th repeat of
each library, so that no repeat can be answered from a cache keyed on the arguments.
Each row is one task; every library's median wall time over ``--repeats`` interleaved runs
(so a slow moment hits everyone; the order rotates every repeat, so each library follows
each other one equally often), its ε, and the ratio peer time / our time (> 1: we are
faster). Absolute times on a shared 2-vCPU machine mean little; the ratios inside one run
are what to read.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

Q, SIGMA, STEPS, DELTA = 256 / 60000, 1.1, 14100, 1e-5
OPACUS_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
_CALLS: dict[str, int] = {}


def _sigma(who: str) -> float:
    """σ·(1 + 1e-12 i) on the i-th call of ``who``: every repeat is a cold computation (no
    library can answer from a cache keyed on the arguments), and ε moves by ~1e-12 only."""
    i = _CALLS[who] = _CALLS.get(who, -1) + 1
    return SIGMA * (1.0 + 1e-12 * i)


def _time(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def run_interleaved(
    tasks: dict[str, Callable[[], Any]], repeats: int
) -> dict[str, tuple[float, Any]]:
    times: dict[str, list[float]] = {k: [] for k in tasks}
    values: dict[str, Any] = {}
    names = list(tasks)
    for r in range(repeats):
        # Rotate the order every repeat, so each library runs after each other one equally
        # often: a call made right after another library's large NumPy work finds colder
        # caches, and a fixed order would charge that to whoever always comes next.
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn = tasks[name]
            dt, out = _time(fn)
            times[name].append(dt)
            values[name] = out
    return {k: (statistics.median(v), values[k]) for k, v in times.items()}


# ----------------------------------------------------------------------------- ours
def ours_rdp(steps: int = STEPS) -> float:
    from renyi.accountants import RdpAccountant
    from renyi.events import GaussianEvent, PoissonSampledEvent

    acc = RdpAccountant().compose(PoissonSampledEvent(Q, GaussianEvent(_sigma("ours"))), steps)
    return acc.epsilon(DELTA).epsilon


def ours_pld(steps: int = STEPS, h: float = 1e-4) -> float:
    from renyi.accountants import PldAccountant
    from renyi.events import GaussianEvent, PoissonSampledEvent

    acc = PldAccountant(value_discretization_interval=h)
    acc.compose(PoissonSampledEvent(Q, GaussianEvent(SIGMA)), steps)
    return acc.epsilon(DELTA).epsilon


def ours_calibrate(accountant: str) -> float:
    from renyi.calibration import calibrate_noise_multiplier

    return calibrate_noise_multiplier(3.0, DELTA, Q, STEPS, accountant).value


# ----------------------------------------------------------------------------- peers
def dpa_rdp(steps: int = STEPS) -> float:
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rpa

    acc = rpa.RdpAccountant()
    event = dp_accounting.GaussianDpEvent(_sigma("dp_accounting"))
    acc.compose(dp_accounting.PoissonSampledDpEvent(Q, event), steps)
    return float(acc.get_epsilon(DELTA))


def dpa_pld(steps: int = STEPS, h: float = 1e-4) -> float:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant as ppa

    acc = ppa.PLDAccountant(value_discretization_interval=h)
    acc.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA)), steps)
    return float(acc.get_epsilon(DELTA))


def opacus_rdp(steps: int = STEPS) -> float:
    from opacus.accountants.analysis import rdp

    sigma = _sigma("opacus")
    r = rdp.compute_rdp(q=Q, noise_multiplier=sigma, steps=steps, orders=OPACUS_ORDERS)
    return float(rdp.get_privacy_spent(orders=OPACUS_ORDERS, rdp=r, delta=DELTA)[0])


def opacus_prv(steps: int = STEPS) -> float:
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(SIGMA, Q, steps)]
    return float(acc.get_epsilon(DELTA))


def opacus_calibrate(accountant: str) -> float:
    from opacus.accountants.utils import get_noise_multiplier

    return float(
        get_noise_multiplier(
            target_epsilon=3.0,
            target_delta=DELTA,
            sample_rate=Q,
            steps=STEPS,
            accountant=accountant,
        )
    )


def dpa_calibrate(kind: str) -> float:
    import dp_accounting
    from dp_accounting import mechanism_calibration as mc

    def make_event(sigma: float) -> Any:
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma)), STEPS
        )

    if kind == "rdp":
        from dp_accounting.rdp import rdp_privacy_accountant as rpa

        factory = rpa.RdpAccountant
    else:
        from dp_accounting.pld import pld_privacy_accountant as ppa

        def factory() -> Any:
            return ppa.PLDAccountant(value_discretization_interval=1e-3)

    return float(
        mc.calibrate_dp_mechanism(
            factory, make_event, 3.0, DELTA, mc.LowerEndpointAndGuess(0.1, 1.0)
        )
    )


def _available(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--quick", action="store_true", help="skip the slow T = 10^6 rows")
    args = ap.parse_args()
    warnings.simplefilter("ignore")

    from renyi.accountants import ACCOUNTANTS
    from renyi.cli._output import format_table

    have_pld = "pld" in ACCOUNTANTS
    groups: list[tuple[str, dict[str, Callable[[], Any]], int]] = []
    rdp_tasks: dict[str, Callable[[], Any]] = {"renyi": ours_rdp}
    if _available("dp_accounting"):
        rdp_tasks["dp_accounting"] = dpa_rdp
    if _available("opacus"):
        rdp_tasks["opacus"] = opacus_rdp
    groups.append(("RDP ε (T=14100)", rdp_tasks, args.repeats))
    if have_pld:
        pld_tasks: dict[str, Callable[[], Any]] = {"renyi": lambda: ours_pld(h=1e-4)}
        if _available("dp_accounting"):
            pld_tasks["dp_accounting"] = lambda: dpa_pld(h=1e-4)
        if _available("opacus"):
            pld_tasks["opacus PRV"] = opacus_prv
        groups.append(("PLD ε, h=1e-4 (T=14100)", pld_tasks, max(3, args.repeats // 3)))
        if not args.quick:
            big: dict[str, Callable[[], Any]] = {
                "renyi": lambda: ours_pld(10**6, 1e-4),
            }
            if _available("opacus"):
                big["opacus PRV"] = lambda: opacus_prv(10**6)
            groups.append(("PLD ε, h=1e-4 (T=10^6)", big, 3))
    cal: dict[str, Callable[[], Any]] = {"renyi": lambda: ours_calibrate("rdp")}
    if _available("opacus"):
        cal["opacus"] = lambda: opacus_calibrate("rdp")
    if _available("dp_accounting"):
        cal["dp_accounting"] = lambda: dpa_calibrate("rdp")
    groups.append(("calibrate σ for ε=3, RDP", cal, max(3, args.repeats // 2)))
    if have_pld:
        calp: dict[str, Callable[[], Any]] = {"renyi": lambda: ours_calibrate("pld")}
        if _available("opacus"):
            calp["opacus PRV"] = lambda: opacus_calibrate("prv")
        if _available("dp_accounting") and not args.quick:
            calp["dp_accounting (h=1e-3)"] = lambda: dpa_calibrate("pld")
        groups.append(("calibrate σ for ε=3, PLD/PRV", calp, 3))

    rows = []
    for title, tasks, reps in groups:
        res = run_interleaved(tasks, reps)
        ours_t = res["renyi"][0]
        for name, (t, value) in res.items():
            rows.append(
                [
                    title,
                    name,
                    f"{value:.6f}",
                    f"{t * 1e3:.2f}",
                    "" if name == "renyi" else f"{t / ours_t:.1f}x",
                ]
            )
    print(format_table(["task", "library", "value", "median ms", "peer/ours time"], rows))
    print(f"\nq={Q:.6g} sigma={SIGMA} delta={DELTA}; value = epsilon (or sigma for calibration)")


if __name__ == "__main__":
    main()
