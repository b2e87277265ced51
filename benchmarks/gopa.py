"""GOPA: wall time, CPU and bytes per party, in-process vs on Flower; error vs central/local DP.

For each K in ``--parties``:

1. in-process reference run (``GopaProtocol``: the same signed advertisements, AEAD
   pairing messages, masked values and aggregation, parties as objects), median over
   ``--repeats``; bytes per party = what it sends and receives;
2. for K in ``--deployed``: a real loopback deployment (``flower-superlink`` + one
   ``renyi.federated.flower_node`` process per party, the run submitted as ``flwr run``
   does): wall time from starting the SuperLink to the released estimate, CPU seconds of all
   its processes (``LocalDeployment.cpu_seconds``, a lower bound), bytes per party counted
   by the relay (payloads; Flower's framing not included). ``--start fork exec`` compares
   nodes forked from one launcher (the default) with nodes started each as its own program,
   interleaved ``--deployed-repeats`` times. The same script on an earlier main (before the
   long-lived nodes: one ``flower-supernode`` per party, a ClientApp process per message)
   gives the older baseline;
3. for K in ``--simulated``: one session on Flower's simulation engine (Ray, one worker),
   wall time including Ray's start;
4. the error of the estimate: GOPA's calibrated standard deviation (ρ = 1/2, ε = 1,
   δ = 1e-5, analytic Gaussian; Monte Carlo check), central and local DP at the same
   (ε, δ), and each run's |estimate - true mean| in units of the central-DP std;
5. for K in ``--secagg``: one session of double-masked GOPA (``renyi.federated.secagg``, the
   protocol a malicious server cannot break) with parties pinned to its parameters:
   σ_η = 2, σ_Δ = 10, a Harary graph of ``--secagg-peers`` (6 at K = 10, 8 at K = 100),
   threshold ``t`` = the smallest safe one for c = 1, at least half the parties + 1 must
   survive; on a deployment for K <= 20, on the simulation engine above. Its error is
   compared with central DP at the worst-case ε the parties verify (std 1/(K μ)).

This is a script, not a test: nothing is asserted. Load average is printed with each row.

    .venv/bin/python benchmarks/gopa.py                    # K = 10, 100; deploy 10, simulate 100
    .venv/bin/python benchmarks/gopa.py --secagg 10 100     # and double-masked GOPA
    .venv/bin/python benchmarks/gopa.py --parties 10 --deployed 10 --simulated --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import numpy as np

from renyi.errors import InsecureRandomnessWarning
from renyi.federated.aggregation import central_mean_std, local_mean_std
from renyi.federated.gopa import (
    GopaProtocol,
    calibrate_gopa,
    recommended_peers,
    simulate_gopa_std,
)

EPS, DELTA, RHO = 1.0, 1e-5, 0.5


def _values(k: int) -> np.ndarray:
    return np.random.default_rng(k).uniform(size=k)


def in_process(k: int, repeats: int) -> dict[str, float]:
    cal = calibrate_gopa(k, RHO, EPS, DELTA, calibration="analytic")
    values = _values(k)
    times, sizes = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proto = GopaProtocol(
            values,
            sigma_eta=cal.sigma_eta,
            sigma_delta=cal.sigma_delta,
            peers=cal.peers,
            edges=cal.edges,
        )
        proto.send_seeds()
        res = proto.aggregate()
        times.append(time.perf_counter() - t0)
        per = 0
        for name, adv in proto.directory.items():
            u = proto.session.index(name)
            nbrs = proto.session.neighbours(u)
            per += len(adv) * (1 + len(nbrs))  # own advertisement + neighbours' from directory
            per += sum(len(ct) for ct in proto.inboxes.get(name, {}).values())  # received
            per += sum(len(box[name]) for box in proto.inboxes.values() if name in box)  # sent
            per += 8  # masked value
        sizes.append(per / k)
        assert res.included
    return {"seconds": statistics.median(times), "bytes_per_party": statistics.median(sizes)}


def _session(k: int) -> tuple[bytes, int, object]:
    from renyi.federated.gopa_flower import session_graph

    m = recommended_peers(k, RHO)
    sid = os.urandom(16)
    cal = calibrate_gopa(
        k, RHO, EPS, DELTA, peers=m, edges=session_graph(sid, k, m), calibration="analytic"
    )
    return sid, m, cal


def _row(res: object, values: np.ndarray, central: float) -> dict[str, object]:
    est = getattr(res, "estimate", None)
    return {
        "status": getattr(res, "status", "?"),
        "seconds": getattr(res, "wall_seconds", float("nan")),
        "cpu_seconds": getattr(res, "cpu_seconds", {}),
        "bytes_per_party": getattr(res, "bytes_per_party", float("nan")),
        "error_over_central_std": (
            abs(float(est) - float(values.mean())) / central if est is not None else None
        ),
        "load_average": os.getloadavg()[0],
    }


def deployed(k: int, node: str, start: str = "fork") -> dict[str, object]:
    from renyi.federated.gopa_flower import run_local_deployment

    sid, m, cal = _session(k)
    values = _values(k)
    load = os.getloadavg()[0]
    res = run_local_deployment(
        values.tolist(),
        sigma_eta=cal.sigma_eta,  # type: ignore[attr-defined]
        sigma_delta=cal.sigma_delta,  # type: ignore[attr-defined]
        peers=m,
        session=sid,
        timeout=1200,
        notify=False,
        node=node,  # type: ignore[arg-type]
        start=start,  # type: ignore[arg-type]
    )
    row = _row(res, values, cal.central_std)  # type: ignore[attr-defined]
    row["start"] = start
    row["load_before"] = load
    return row


def simulated(k: int) -> dict[str, object]:
    from renyi.federated.gopa_flower import run_simulated_session

    sid, m, cal = _session(k)
    values = _values(k)
    res = run_simulated_session(
        values.tolist(),
        sigma_eta=cal.sigma_eta,  # type: ignore[attr-defined]
        sigma_delta=cal.sigma_delta,  # type: ignore[attr-defined]
        peers=m,
        session=sid,
    )
    return _row(res, values, cal.central_std)  # type: ignore[attr-defined]


def secagg(k: int, start: str = "fork") -> dict[str, object]:
    from renyi.analysis.closed_forms import gaussian_epsilon
    from renyi.federated.secagg import PartyPolicy
    from renyi.federated.secagg_accounting import threshold_is_safe, worst_case_mu
    from renyi.federated.secagg_flower import run_secagg_deployment, run_secagg_simulation

    se, sd, c = 2.0, 10.0, 1
    peers = min(6 if k <= 20 else 8, k - 1)
    t = next(t for t in range(1, peers + 1) if threshold_is_safe(t, peers, c))
    survivors = (k + c) // 2 + 1
    mu = worst_case_mu(se, sd, t, c)
    eps = gaussian_epsilon(mu, DELTA)
    policy = PartyPolicy(
        epsilon=eps * 1.001, delta=DELTA, min_sigma_eta=se, min_cohort=survivors,
        min_peers=peers, max_corrupt=c,
    )  # fmt: skip
    cfg = {
        "sigma-eta": se, "sigma-delta": sd, "peers": peers, "threshold": t,
        "min-survivors": survivors,
    }  # fmt: skip
    values = _values(k)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    if k <= 20:
        (res,) = run_secagg_deployment(
            values.tolist(), policy, [cfg], budget_epsilon=10 * eps, budget_delta=DELTA,
            timeout=1200, start=start,
        )  # fmt: skip
    else:
        res = run_secagg_simulation(
            values.tolist(), policy, cfg, budget_epsilon=10 * eps, budget_delta=DELTA
        )
    (s,) = res.sessions
    central = 1.0 / (k * mu)
    est = s.get("estimate")
    return {
        "status": s.get("status"),
        "where": ("deployed, nodes " + start) if k <= 20 else "simulation engine",
        "seconds": time.monotonic() - t0,
        "cpu_seconds": res.cpu_seconds,
        "load_before": load,
        "bytes_per_party": res.bytes_per_party,
        "peers": peers,
        "threshold": t,
        "worst_case_epsilon": eps,
        "std": se / np.sqrt(k),
        "central_std_same_epsilon": central,
        "error_over_central_std": abs(est - values.mean()) / central if est is not None else None,
        "load_average": os.getloadavg()[0],
    }


def errors(k: int, trials: int) -> dict[str, float]:
    cal = calibrate_gopa(k, RHO, EPS, DELTA, calibration="analytic")
    return {
        "gopa_std": cal.output_std,
        "gopa_std_simulated": simulate_gopa_std(cal, trials=trials, rng=np.random.default_rng(1)),
        "central_std": central_mean_std(k, EPS, DELTA, "analytic"),
        "local_std": local_mean_std(k, EPS, DELTA, "analytic"),
    }


def _cpu(d: dict[str, object]) -> str:
    cpu = d.get("cpu_seconds") or {}
    if not isinstance(cpu, dict) or not cpu:
        return ""
    parts = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
    return f", CPU {sum(cpu.values()):.1f} s ({parts})"


def _fmt(name: str, d: dict[str, object]) -> str:
    err = d.get("error_over_central_std")
    err_s = f", |error| {err:.2f} central std" if isinstance(err, float) else ""
    load = f"{d['load_before']:.1f} -> " if "load_before" in d else ""
    return (
        f"{name} {d['status']} {d['seconds']:.1f} s{_cpu(d)}, {d['bytes_per_party']:.0f}"
        f" B/party{err_s} (load {load}{d['load_average']:.1f})"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--parties", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--deployed", type=int, nargs="*", default=[10])
    ap.add_argument("--simulated", type=int, nargs="*", default=[100])
    ap.add_argument("--secagg", type=int, nargs="*", default=[])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--start",
        nargs="+",
        choices=["fork", "exec"],
        default=["fork"],
        help="deployed nodes forked from one launcher and/or each its own program",
    )
    ap.add_argument(
        "--deployed-repeats", type=int, default=1, help="deployments per K and start, interleaved"
    )
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", InsecureRandomnessWarning)  # seeded values, benchmark only
    rows = []
    for k in args.parties:
        row: dict[str, object] = {"parties": k, "peers": recommended_peers(k, RHO)}
        row["in_process"] = in_process(k, args.repeats)
        row["errors"] = errors(k, args.trials)
        if k in args.deployed:
            row["deployed"] = [
                deployed(k, "renyi", start)
                for _ in range(args.deployed_repeats)
                for start in args.start
            ]
        if k in args.simulated:
            row["simulated"] = simulated(k)
        if k in args.secagg:
            row["secagg"] = [
                secagg(k, start)
                for _ in range(args.deployed_repeats if k <= 20 else 1)
                for start in (args.start if k <= 20 else ["fork"])
            ]
        rows.append(row)
        if not args.json:
            ip, er = row["in_process"], row["errors"]
            assert isinstance(ip, dict) and isinstance(er, dict)
            parts = [
                f"K={k:4d} m={row['peers']:2d}: in-process {ip['seconds']:.3f} s, "
                f"{ip['bytes_per_party']:.0f} B/party; std GOPA {er['gopa_std']:.4g} "
                f"(MC {er['gopa_std_simulated']:.4g}), central {er['central_std']:.4g}, local "
                f"{er['local_std']:.4g} (GOPA/central {er['gopa_std'] / er['central_std']:.3f},"
                f" local/central {er['local_std'] / er['central_std']:.2f})"
            ]
            for sa in row.get("secagg") or []:  # type: ignore[attr-defined]
                load = f"{sa['load_before']:.1f} -> " if "load_before" in sa else ""
                parts.append(
                    f"double-masked ({sa['where']}, {sa['peers']} peers, t={sa['threshold']}): "
                    f"{sa['status']} {sa['seconds']:.1f} s{_cpu(sa)},"
                    f" {sa['bytes_per_party']:.0f} B/party, worst-case eps"
                    f" {sa['worst_case_epsilon']:.3f}, std {sa['std']:.4g} vs central"
                    f" {sa['central_std_same_epsilon']:.4g} at that eps (load {load}"
                    f"{sa['load_average']:.1f})"
                )
            for d in row.get("deployed") or []:  # type: ignore[attr-defined]
                parts.append(_fmt(f"deployed (renyi nodes, {d['start']}):", d))
            if isinstance(row.get("simulated"), dict):
                parts.append(_fmt("simulation engine:", row["simulated"]))  # type: ignore[arg-type]
            print("\n    ".join(parts), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
