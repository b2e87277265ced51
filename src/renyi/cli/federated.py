"""``renyi federated ...``: private aggregation without a trusted curator, network DP.

* ``aggregate``: central vs local DP vs GOPA errors for averaging K values in [0, 1];
* ``sigma``: noise of random-walk DP-SGD under local, network and central DP;
* ``walk``: the network-DP experiment (accuracy vs ε on a real task);
* ``fedavg``: client-level ε of DP-FedAvg;
* ``gopa-run``: GOPA on a real local Flower deployment (superlink + one node per party):
  by default double-masked GOPA (:mod:`renyi.federated.secagg`), in which every party
  checks the server's proposal against its own pins and the reported ε is the worst case
  each party verified itself (any graph, any ``--max-corrupt`` colluding parties, any lie
  about dropouts); ``--trust-server`` runs plain GOPA, whose ε holds only for an honest
  server and one random honest set.
"""

from __future__ import annotations

import argparse
from typing import Any

from renyi.cli._output import format_table, print_json


def register(sub: Any) -> None:
    fed = sub.add_parser("federated", help="DP without a trusted curator: GOPA, network DP")
    fsub = fed.add_subparsers(dest="federated_command", metavar="SUBCOMMAND")
    fsub.required = True

    a = fsub.add_parser("aggregate", help="central vs local vs GOPA error of a private mean")
    a.add_argument("--parties", type=int, required=True, help="number of parties K")
    a.add_argument("--epsilon", type=float, required=True)
    a.add_argument("--delta", type=float, required=True)
    a.add_argument("--honest", type=float, default=0.5, help="fraction rho of honest parties")
    a.add_argument("--peers", type=int, help="peers per party (default ceil(ln(rho K)/rho))")
    a.add_argument(
        "--calibration",
        choices=["classic", "analytic"],
        default="classic",
        help="Gaussian calibration (classic: Dwork & Roth; analytic: Balle & Wang)",
    )
    a.add_argument("--trials", type=int, default=0, help="Monte Carlo trials (0: none)")
    a.add_argument("--seed", type=int, help="seed for a reproducible (insecure) simulation")
    a.add_argument("--plot", help="save the std-vs-rho figure (rho in 1, 0.8, 0.5, 0.2) here")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.set_defaults(func=_aggregate)

    s = fsub.add_parser("sigma", help="noise of random-walk DP-SGD: local / network / central")
    s.add_argument("--parties", type=int, required=True)
    s.add_argument("--steps", type=int, required=True)
    s.add_argument("--epsilon", type=float, required=True)
    s.add_argument("--delta", type=float, required=True)
    s.add_argument("--lipschitz", type=float, default=1.0, help="sensitivity L of one step")
    s.add_argument("--convention", choices=["union", "paper"], default="union")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_sigma)

    w = fsub.add_parser("walk", help="network-DP experiment: accuracy vs epsilon")
    w.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 10.0])
    w.add_argument("--delta", type=float, default=1e-6)
    w.add_argument("--runs", type=int, default=100, help="walks averaged per point")
    w.add_argument("--steps-per-party", type=int, default=10)
    w.add_argument("--convention", choices=["union", "paper"], default="union")
    w.add_argument("--seed", type=int, help="seed for a reproducible (insecure) run")
    w.add_argument("--plot", help="save the accuracy-vs-epsilon figure here")
    w.add_argument("--json", action="store_true", help="print one JSON object")
    w.set_defaults(func=_walk)

    f = fsub.add_parser("fedavg", help="client-level epsilon of DP-FedAvg")
    f.add_argument("--noise-multiplier", type=float, required=True, help="z")
    f.add_argument("--population", type=int, required=True, help="number of clients")
    f.add_argument("--clients-per-round", type=int, required=True, help="m")
    f.add_argument("--rounds", type=int, required=True)
    f.add_argument("--delta", type=float, required=True)
    f.add_argument("--sampling", choices=["poisson", "fixed"], default="poisson")
    f.add_argument("--accountant", default="rdp", help="rdp (default), zcdp, pld, approx")
    f.add_argument(
        "--count-stddev", type=float, help="adaptive clipping: sigma_b (reports z_Delta)"
    )
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=_fedavg)

    g = fsub.add_parser(
        "gopa-run",
        help="private mean on a local Flower deployment (loopback): double-masked GOPA whose"
        " parties pin their own privacy (--trust-server: plain GOPA)",
    )
    g.add_argument("--parties", type=int, required=True, help="number of parties K (>= 2)")
    g.add_argument(
        "--epsilon", type=float, default=1.0, help="each party's per-session worst-case epsilon"
    )
    g.add_argument("--delta", type=float, default=1e-5)
    g.add_argument(
        "--max-corrupt",
        type=int,
        default=None,
        help="parties each party assumes collude with the server (default 1; 0 for K = 2)",
    )
    g.add_argument(
        "--peers", type=int, help="neighbours per party (default min(K - 1, 8); even if < K - 1)"
    )
    g.add_argument(
        "--threshold", type=int, help="shares t of k that unmask (default: the least safe t)"
    )
    g.add_argument(
        "--sessions", type=int, default=1, help="sessions run on the same nodes (default 1)"
    )
    g.add_argument(
        "--budget-epsilon",
        type=float,
        help="each party's budget across sessions at --delta (default: what --sessions cost)",
    )
    for name, what in (
        ("sigma-eta", "independent noise"),
        ("sigma-delta", "pairwise noise"),
        ("peers", "neighbours"),
        ("threshold", "threshold"),
        ("min-survivors", "least survivors"),
    ):
        g.add_argument(
            f"--server-{name}",
            type=int if name in ("peers", "threshold", "min-survivors") else float,
            help=f"play the server: propose this {what} (each party checks it against its pins)",
        )
    g.add_argument(
        "--trust-server",
        action="store_true",
        help="plain GOPA: the server chooses the noise and dropouts are revealed; its epsilon"
        " holds only for an honest server and one random honest set",
    )
    g.add_argument("--honest", type=float, help="--trust-server: fraction rho of honest parties")
    g.add_argument(
        "--reveal-budget", type=int, help="--trust-server: neighbours a party may reveal (0)"
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds for the whole command (keys, start, sessions); then a clear error",
    )
    g.add_argument("--seed", type=int, help="seed of the synthetic values (insecure)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=_gopa_run)


def _rng(seed: int | None) -> Any:
    if seed is None:
        return None
    import warnings

    import numpy as np

    from renyi.errors import InsecureRandomnessWarning

    warnings.simplefilter("ignore", InsecureRandomnessWarning)  # the user asked for a seed
    return np.random.default_rng(seed)


def _aggregate(args: argparse.Namespace) -> int:
    from renyi.accountants import RdpAccountant
    from renyi.analysis.events import GaussianEvent, Neighbouring
    from renyi.federated.aggregation import (
        compare_aggregation,
        reported_epsilon,
        simulate_aggregation,
    )
    from renyi.federated.gopa import calibrate_gopa, gopa_targeted, simulate_gopa_std

    rng = _rng(args.seed)
    cmp = compare_aggregation(args.parties, args.epsilon, args.delta, args.calibration)
    cal = calibrate_gopa(
        args.parties,
        args.honest,
        args.epsilon,
        args.delta,
        peers=args.peers,
        calibration=args.calibration,
        rng=rng,
    )
    out: dict[str, Any] = {
        "parties": args.parties,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "calibration": args.calibration,
        "central_std": cmp.central_std,
        "local_std": cmp.local_std,
        "local_over_central": cmp.ratio,
        "epsilon_reported": {
            name: reported_epsilon(args.epsilon, args.delta, args.calibration, name).epsilon
            for name in ("rdp", "zcdp")
        },
        "gopa": {
            "honest_fraction": args.honest,
            "honest_parties": cal.honest_count,
            "peers": cal.peers,
            "sigma_eta": cal.sigma_eta,
            "sigma_delta": cal.sigma_delta,
            "mu": cal.privacy.mu,
            "target_mu": cal.target_mu,
            "curator_mu": cal.privacy.curator_mu,
            "honest_graph_connected": cal.privacy.connected,
            "honest_components": len(cal.privacy.components),
            "epsilon_achieved": cal.privacy.epsilon(args.delta),
            "epsilon_reported_rdp": RdpAccountant()
            .compose(GaussianEvent(1.0 / cal.privacy.mu, neighbouring=Neighbouring.REPLACE_ONE))
            .epsilon(args.delta)
            .epsilon,
            "std": cal.output_std,
            "std_over_central": cal.ratio_to_central,
        },
    }
    # a coalition of the (1 - rho) K corrupted parties chosen around one target
    tgt = gopa_targeted(
        cal.edges,
        cal.sigma_eta,
        cal.sigma_delta,
        parties=args.parties,
        coalition_size=args.parties - cal.honest_count,
        candidates=2,
    )
    out["gopa"]["targeted"] = {
        "coalition_size": tgt.coalition_size,
        "target": tgt.target,
        "isolated": tgt.isolated,
        "mu": tgt.mu,
        "epsilon": tgt.epsilon(args.delta),
    }
    if args.trials:
        sim = simulate_aggregation(
            args.parties, args.epsilon, args.delta, trials=args.trials,
            calibration=args.calibration, rng=rng,
        )  # fmt: skip
        out["central_std_simulated"] = sim.central_std_simulated
        out["local_std_simulated"] = sim.local_std_simulated
        out["gopa"]["std_simulated"] = simulate_gopa_std(cal, trials=args.trials, rng=rng)
    if args.plot:
        rhos = [1.0, 0.8, 0.5, 0.2]
        cals = [
            calibrate_gopa(
                args.parties, r, args.epsilon, args.delta, calibration=args.calibration, rng=rng
            )
            for r in rhos
        ]
        sims = (
            [simulate_gopa_std(c, trials=args.trials, rng=rng) for c in cals]
            if args.trials
            else None
        )
        from renyi.federated.plots import aggregation_figure

        fig = aggregation_figure(
            rhos,
            [c.output_std for c in cals],
            cmp.central_std,
            cmp.local_std,
            gopa_simulated=sims,
            title=f"K={args.parties}, ε={args.epsilon:g}, δ={args.delta:g}",
        )
        fig.savefig(args.plot)
        out["plot"] = args.plot
    if args.json:
        print_json(out)
        return 0
    g = out["gopa"]
    rows = [
        ["central (trusted curator)", cmp.central_std, 1.0, out.get("central_std_simulated", "")],
        ["local", cmp.local_std, cmp.ratio, out.get("local_std_simulated", "")],
        [
            f"GOPA (rho={args.honest:g})",
            g["std"],
            g["std_over_central"],
            g.get("std_simulated", ""),
        ],
    ]
    print(
        format_table(
            ["model", "std of mean", "x central", "simulated"],
            rows,
            title=f"Private mean of K={args.parties} values in [0,1], "
            f"(ε={args.epsilon:g}, δ={args.delta:g}), {args.calibration} Gaussian",
        )
    )
    print(
        f"\nGOPA: {g['honest_parties']} honest parties, {g['peers']} peers each, "
        f"sigma_eta={g['sigma_eta']:.4g}, sigma_delta={g['sigma_delta']:.4g}; "
        f"mu={g['mu']:.6g} (target {g['target_mu']:.6g}, curator {g['curator_mu']:.6g}); "
        f"honest graph {'connected' if g['honest_graph_connected'] else 'DISCONNECTED'}."
    )
    rep = out["epsilon_reported"]
    print(
        f"epsilon reported by renyi's accountants at delta={args.delta:g}: central/local "
        f"rdp {rep['rdp']:.4g}, zcdp {rep['zcdp']:.4g}; GOPA exact {g['epsilon_achieved']:.4g},"
        f" rdp {g['epsilon_reported_rdp']:.4g}"
    )
    t = g["targeted"]
    print(
        "GOPA against a coalition of the "
        f"{t['coalition_size']} corrupted parties chosen around party {t['target']} "
        f"(worst honest party{', isolated' if t['isolated'] else ''}): mu={t['mu']:.4g}, "
        f"epsilon={t['epsilon']:.4g} (the guarantee above holds for honest sets chosen"
        " independently of the graph)"
    )
    if args.plot:
        print(f"figure saved to {args.plot}")
    return 0


def _sigma(args: argparse.Namespace) -> int:
    from renyi.federated.network import (
        central_sigma,
        contribution_cap,
        local_sigma,
        network_dp_epsilon,
        network_sigma,
    )

    kw = dict(parties=args.parties, steps=args.steps, lipschitz=args.lipschitz)
    loc = local_sigma(args.epsilon, args.delta, convention=args.convention, **kw)
    net = network_sigma(args.epsilon, args.delta, convention=args.convention, **kw)
    cen = central_sigma(args.epsilon, args.delta, **kw)
    acc = network_dp_epsilon(net, delta=args.delta, convention=args.convention, **kw)
    out = {
        "parties": args.parties,
        "steps": args.steps,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "lipschitz": args.lipschitz,
        "convention": args.convention,
        "contributions": contribution_cap(args.steps, args.parties),
        "spotted": acc.spotted,
        "sigma_local": loc,
        "sigma_network": net,
        "sigma_central": cen,
        "network_delta_total": acc.delta_total,
    }
    if args.json:
        print_json(out)
        return 0
    print(
        format_table(
            ["model", "sigma"],
            [["local DP", loc], ["network DP", net], ["central DP (Bassily et al.)", cen]],
            title=f"Random-walk DP-SGD, n={args.parties}, T={args.steps}, "
            f"(ε={args.epsilon:g}, δ={args.delta:g}), L={args.lipschitz:g}",
        )
    )
    print(
        f"\nnetwork DP: K={out['contributions']}, spotted <= {acc.spotted}, delta actually"
        f" proven {acc.delta_total:.3g} ({args.convention} convention)"
    )
    return 0


def _walk(args: argparse.Namespace) -> int:
    from renyi.federated.network import walk_experiment

    res = walk_experiment(
        args.epsilons,
        delta=args.delta,
        steps_per_party=args.steps_per_party,
        runs=args.runs,
        convention=args.convention,
        rng=_rng(args.seed),
    )
    if args.plot:
        from renyi.federated.plots import walk_figure

        fig = walk_figure(
            res["epsilons"],  # type: ignore[arg-type]
            res["accuracy"],  # type: ignore[arg-type]
            title=f"breast cancer, n={res['parties']} parties, δ={args.delta:g}",
        )
        fig.savefig(args.plot)
        res["plot"] = args.plot
    if args.json:
        print_json(res)
        return 0
    acc: dict[str, list[float]] = res["accuracy"]  # type: ignore[assignment]
    sig: dict[str, list[float]] = res["sigma"]  # type: ignore[assignment]
    eps: list[float] = res["epsilons"]  # type: ignore[assignment]
    rows = [[e, *(acc[m][i] for m in acc), *(sig[m][i] for m in sig)] for i, e in enumerate(eps)]
    print(
        format_table(
            ["epsilon", *(f"acc {m}" for m in acc), *(f"sigma {m}" for m in sig)],
            rows,
            title=f"Random-walk DP-SGD on breast cancer: n={res['parties']} parties, "
            f"T={res['steps']}, K={res['contributions']}, {res['runs']} runs per point",
        )
    )
    if args.plot:
        print(f"figure saved to {args.plot}")
    return 0


def _fedavg(args: argparse.Namespace) -> int:
    from renyi.federated.fedavg import effective_noise_multiplier, fedavg_epsilon

    r = fedavg_epsilon(
        args.noise_multiplier,
        population=args.population,
        clients_per_round=args.clients_per_round,
        rounds=args.rounds,
        delta=args.delta,
        sampling=args.sampling,
        accountant=args.accountant,
    )
    out: dict[str, Any] = {
        "epsilon": r.epsilon,
        "delta": args.delta,
        "order": r.order,
        "accountant": r.accountant,
        "noise_multiplier": args.noise_multiplier,
        "sampling": args.sampling,
        "neighbouring": "add_remove" if args.sampling == "poisson" else "replace_one",
        "sampling_rate": args.clients_per_round / args.population,
        "rounds": args.rounds,
    }
    if args.count_stddev is not None:
        out["value_noise_multiplier"] = effective_noise_multiplier(
            args.noise_multiplier, args.count_stddev
        )
    if args.json:
        print_json(out)
        return 0
    print(
        f"DP-FedAvg, client-level ({out['neighbouring']}, {args.sampling} sampling of "
        f"{args.clients_per_round}/{args.population} per round), z={args.noise_multiplier:g}, "
        f"{args.rounds} rounds: epsilon = {r.epsilon:.4g} at delta = {args.delta:g}"
    )
    if "value_noise_multiplier" in out:
        z_value = out["value_noise_multiplier"]
        print(f"adaptive clipping: value noise multiplier z_Delta = {z_value:.6g}")
    return 0


def _deadline(args: argparse.Namespace) -> Any:
    """``--timeout`` counted from the start of the command (imports included)."""
    from renyi.federated.flower_deploy import Deadline

    return Deadline(float(args.timeout), args.began + float(args.timeout))


def _gopa_run(args: argparse.Namespace) -> int:
    import os
    import time

    args.began = time.monotonic()

    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from renyi._validation import check_int, check_positive, fail
    from renyi.federated.flower_deploy import MAX_LOCAL_NODES

    if check_int("parties", args.parties, 2) > MAX_LOCAL_NODES:
        raise fail(
            "parties",
            args.parties,
            f"at most {MAX_LOCAL_NODES}: each party is a node process on this machine",
        )
    check_positive("timeout", args.timeout)
    if args.trust_server:
        return _plain_gopa_run(args)
    for dest in ("honest", "reveal_budget"):
        if getattr(args, dest) is not None:
            raise fail(dest, getattr(args, dest), "given only with --trust-server (plain GOPA)")
    return _secure_gopa_run(args)


def _secure_gopa_run(args: argparse.Namespace) -> int:
    import time

    from renyi._validation import check_delta, check_int, check_positive, fail
    from renyi.analysis.closed_forms import gaussian_epsilon
    from renyi.budget import Budget
    from renyi.federated.secagg import PartyPolicy
    from renyi.federated.secagg_accounting import (
        calibrate_secagg,
        smallest_safe_threshold,
        threshold_is_safe,
    )

    # without flwr this raises ImportError naming `pip install 'renyi[flower]'` (cli.main shows it)
    from renyi.federated.secagg_flower import run_secagg_deployment
    from renyi.random import get_source

    k = check_int("parties", args.parties, 2)
    eps = check_positive("epsilon", args.epsilon)
    delta = check_delta(args.delta)
    if args.max_corrupt is None:
        c = 1 if k > 2 else 0
    else:
        c = check_int("max_corrupt", args.max_corrupt, 0)
    peers = check_int("peers", min(k - 1, 8) if args.peers is None else args.peers, 1)
    if peers > k - 1 or (peers < k - 1 and peers % 2):
        raise fail("peers", peers, f"K - 1 = {k - 1} (complete graph) or an even number below it")
    if c >= peers:
        raise fail("max_corrupt", c, f"fewer than the {peers} neighbours of a party")
    t = smallest_safe_threshold(peers, c) if args.threshold is None else args.threshold
    t = check_int("threshold", t, 1)
    if not threshold_is_safe(t, peers, c):
        raise fail("threshold", t, f"a safe threshold: {c} < t <= {peers} and 2t > {peers + c}")
    cal = calibrate_secagg(eps, delta, threshold=t, corrupt=c)
    quorum = (k + c) // 2 + 1
    policy = PartyPolicy(
        epsilon=eps, delta=delta, min_sigma_eta=cal.sigma_eta, min_cohort=quorum,
        min_peers=peers, max_corrupt=c,
    )  # fmt: skip
    sessions = check_int("sessions", args.sessions, 1)
    budget_eps = args.budget_epsilon
    if budget_eps is None:  # what the requested sessions cost in the party's own budget
        cost = Budget(epsilon=1e9, delta=delta).quote(cal.event(), sessions)["epsilon_after"]
        budget_eps = float(cost) * (1.0 + 1e-9)
    check_positive("budget_epsilon", budget_eps)
    proposal = {
        "sigma-eta": cal.sigma_eta if args.server_sigma_eta is None else args.server_sigma_eta,
        "sigma-delta": (
            cal.sigma_delta if args.server_sigma_delta is None else args.server_sigma_delta
        ),
        "peers": peers if args.server_peers is None else args.server_peers,
        "threshold": t if args.server_threshold is None else args.server_threshold,
        "min-survivors": quorum if args.server_min_survivors is None else args.server_min_survivors,
        "sessions": sessions,
    }
    values = get_source(_rng(args.seed)).uniform(k)
    started = time.monotonic()
    (run,) = run_secagg_deployment(
        values.tolist(), policy, [proposal], budget_epsilon=float(budget_eps),
        budget_delta=delta, timeout=args.timeout, deadline=_deadline(args),
    )  # fmt: skip
    out_sessions = []
    for s in run.sessions:
        row: dict[str, Any] = {"status": s.get("status")}
        if s.get("status") == "released":
            names = [str(n) for n in s.get("included", [])]
            survivors = [int(n.split("-")[1]) for n in names]
            party_eps = [float(e) for e in s.get("party_epsilon", {}).values()]
            row.update(
                estimate=s["estimate"],
                true_mean=float(values[survivors].mean()),
                included=len(names),
                dropped=list(s.get("dropped", [])),
                party_epsilon_max=max(party_eps) if party_eps else None,
                influence_bound=s.get("influence_bound"),
            )
        else:
            row["reason"] = s.get("reason", "")
        out_sessions.append(row)
    released = [r for r in out_sessions if r["status"] == "released"]
    out: dict[str, Any] = {
        "protocol": "double-masked GOPA (renyi.federated.secagg)",
        "trusts_server": False,
        "status": out_sessions[-1]["status"] if out_sessions else "aborted",
        "parties": k,
        "epsilon_target": eps,
        "delta": delta,
        "max_corrupt": c,
        "peers": peers,
        "threshold": t,
        "min_survivors": quorum,
        "sigma_eta": cal.sigma_eta,
        "sigma_delta": cal.sigma_delta,
        "mu_worst_case": cal.mu,
        "epsilon_worst_case": float(gaussian_epsilon(cal.mu, delta)),
        "std_honest_server": cal.sigma_eta / k**0.5,
        "central_std_same_epsilon": 1.0 / (k * cal.mu),
        "server_proposal": {k_: v for k_, v in proposal.items() if k_ != "sessions"},
        "budget_epsilon": float(budget_eps),
        "sessions": out_sessions,
        "released": len(released),
        "wall_seconds": time.monotonic() - started,
        "bytes_per_party": run.bytes_per_party,
    }
    if args.json:
        print_json(out)
        return 0 if released else 1
    print(
        f"double-masked GOPA on {k} Flower nodes ({peers} peers, t = {t}, each party assumes"
        f" up to {c} colluding with the server): sigma_eta = {cal.sigma_eta:.4g}, sigma_delta"
        f" = {cal.sigma_delta:.4g}; every party verified epsilon <= {out['epsilon_worst_case']:.4g}"
        f" at delta = {delta:g} per session, for any graph, coalition and lie about dropouts"
    )
    for i, r in enumerate(out_sessions, 1):
        if r["status"] == "released":
            print(
                f"session {i}: estimate {r['estimate']:.6f} (true mean {r['true_mean']:.6f}) over"
                f" {r['included']} parties; std {out['std_honest_server']:.4g} with an honest"
                f" server (central DP at the same epsilon: {out['central_std_same_epsilon']:.4g})"
            )
        else:
            print(f"session {i}: aborted, nothing released: {r['reason']}")
    print(
        f"{out['wall_seconds']:.1f} s (SuperLink and {k} nodes started and stopped),"
        f" {run.bytes_per_party:.0f} bytes per party"
    )
    return 0 if released else 1


def _plain_gopa_run(args: argparse.Namespace) -> int:
    import os

    from renyi._validation import check_int
    from renyi.analysis.closed_forms import gaussian_epsilon
    from renyi.federated.gopa import calibrate_gopa, recommended_peers

    # without flwr this raises ImportError naming `pip install 'renyi[flower]'` (cli.main shows it)
    from renyi.federated.gopa_flower import run_local_deployment, session_graph
    from renyi.random import get_source

    k = check_int("parties", args.parties, 2)
    honest = 0.5 if args.honest is None else args.honest
    reveal = 0 if args.reveal_budget is None else check_int("reveal_budget", args.reveal_budget, 0)
    m = recommended_peers(k, honest) if args.peers is None else args.peers
    sid = os.urandom(16)
    edges = session_graph(sid, k, m)
    cal = calibrate_gopa(
        k, honest, args.epsilon, args.delta, peers=m, edges=edges, calibration="analytic"
    )
    values = get_source(_rng(args.seed)).uniform(k)
    res = run_local_deployment(
        values.tolist(),
        sigma_eta=cal.sigma_eta,
        sigma_delta=cal.sigma_delta,
        peers=m,
        session=sid,
        reveal_budget=reveal,
        timeout=args.timeout,
        deadline=_deadline(args),
    )
    survivors = [int(n.split("-")[1]) for n in res.included]
    out: dict[str, Any] = {
        "protocol": "plain GOPA (renyi.federated.gopa_flower)",
        "trusts_server": True,
        "status": res.status,
        "estimate": res.estimate,
        "true_mean": float(values[survivors].mean()) if survivors else None,
        "central_std": cal.central_std,
        "output_std": cal.output_std,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "epsilon_lying_server": (
            args.epsilon
            if reveal == 0
            else float(gaussian_epsilon(1.0 / cal.sigma_eta, args.delta))
        ),
        "parties": k,
        "included": len(res.included),
        "dropped": list(res.dropped),
        "honest_fraction": honest,
        "peers": m,
        "sigma_eta": cal.sigma_eta,
        "sigma_delta": cal.sigma_delta,
        "reveal_budget": reveal,
        "wall_seconds": res.wall_seconds,
        "bytes_per_party": res.bytes_per_party,
    }
    if res.status != "released":
        out["reason"] = res.reason
    if args.json:
        print_json(out)
    elif res.status == "released":
        print(
            f"plain GOPA (TRUSTS THE SERVER) on {k} Flower nodes (rho={honest:g}, {m} peers):"
            f" estimate {res.estimate:.6f}, true mean {out['true_mean']:.6f}, std"
            f" {cal.output_std:.4g} (central {cal.central_std:.4g}); (eps, delta) ="
            f" ({args.epsilon:g}, {args.delta:g}) only if the server is honest and the honest"
            f" parties are a random set; eps = {out['epsilon_lying_server']:.4g} if it lies about"
            f" dropouts; {res.wall_seconds:.1f} s, {res.bytes_per_party:.0f} bytes per party."
            " Without --trust-server, gopa-run runs the protocol a malicious server cannot break."
        )
    else:
        print(f"GOPA aborted, nothing released: {res.reason}")
    return 0 if res.status == "released" else 1
