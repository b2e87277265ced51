"""GOPA: wall time and bytes per party, in-process vs deployed on Flower; error vs central/local.

For each K: (1) the in-process reference run (``GopaProtocol``: the same signed
advertisements, AEAD pairing messages, masked values and aggregation, parties as objects),
median over ``--repeats``; bytes per party = what it sends and receives (advertisement,
directory share, pairing ciphertexts, masked value); (2) for K in ``--deployed`` a real
loopback deployment (``flower-superlink``, K ``flower-supernode`` processes, ``flwr run``),
wall time from starting the superlink to the released estimate, bytes per party as counted
by the ServerApp in Flower message payloads (Flower's own framing not included); (3) the
standard deviation of the estimate: GOPA (calibrated for ρ = 1/2, ε = 1, δ = 1e-5,
analytic Gaussian, checked by Monte Carlo), central DP and local DP at the same (ε, δ).
This is a script, not a test: nothing is asserted.

    .venv/bin/python benchmarks/gopa.py                      # K = 10, 50, 100; deploy K = 10
    .venv/bin/python benchmarks/gopa.py --deployed 10 50 --json
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


def in_process(k: int, repeats: int) -> dict[str, float]:
    cal = calibrate_gopa(k, RHO, EPS, DELTA, calibration="analytic")
    values = np.random.default_rng(k).uniform(size=k)
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


def deployed(k: int) -> dict[str, float | str]:
    from renyi.federated.gopa_flower import run_local_deployment, session_graph

    m = recommended_peers(k, RHO)
    sid = os.urandom(16)
    cal = calibrate_gopa(
        k, RHO, EPS, DELTA, peers=m, edges=session_graph(sid, k, m), calibration="analytic"
    )
    values = np.random.default_rng(k).uniform(size=k)
    res = run_local_deployment(
        values.tolist(),
        sigma_eta=cal.sigma_eta,
        sigma_delta=cal.sigma_delta,
        peers=m,
        session=sid,
        timeout=1200,
        notify=False,
    )
    return {
        "status": res.status,
        "seconds": res.wall_seconds,
        "bytes_per_party": res.bytes_per_party,
    }


def errors(k: int, trials: int) -> dict[str, float]:
    cal = calibrate_gopa(k, RHO, EPS, DELTA, calibration="analytic")
    return {
        "gopa_std": cal.output_std,
        "gopa_std_simulated": simulate_gopa_std(cal, trials=trials, rng=np.random.default_rng(1)),
        "central_std": central_mean_std(k, EPS, DELTA, "analytic"),
        "local_std": local_mean_std(k, EPS, DELTA, "analytic"),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parties", type=int, nargs="+", default=[10, 50, 100])
    ap.add_argument("--deployed", type=int, nargs="*", default=[10])
    ap.add_argument("--repeats", type=int, default=3)
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
            row["deployed"] = deployed(k)
        rows.append(row)
        if not args.json:
            ip, er = row["in_process"], row["errors"]
            dep = row.get("deployed")
            dep_s = (
                f"deployed {dep['seconds']:.1f} s, {dep['bytes_per_party']:.0f} B/party"
                if isinstance(dep, dict)
                else "deployed: not run"
            )
            assert isinstance(ip, dict) and isinstance(er, dict)
            print(
                f"K={k:4d} m={row['peers']:2d}: in-process {ip['seconds']:.3f} s, "
                f"{ip['bytes_per_party']:.0f} B/party; {dep_s}; std GOPA {er['gopa_std']:.4g} "
                f"(MC {er['gopa_std_simulated']:.4g}), central {er['central_std']:.4g}, local "
                f"{er['local_std']:.4g} (GOPA/central {er['gopa_std'] / er['central_std']:.3f},"
                f" local/central {er['local_std'] / er['central_std']:.2f})",
                flush=True,
            )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
