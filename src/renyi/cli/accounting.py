"""``renyi epsilon`` and ``renyi calibrate``: the DP-SGD questions most users come with."""

from __future__ import annotations

import argparse
from typing import Any

from renyi.accountants import ACCOUNTANTS, EpsilonReport, epsilon_report, make_accountant
from renyi.analysis.events import SAMPLINGS, Event, training_event
from renyi.calibration import calibrate_noise_multiplier, dpsgd_event, epochs_to_steps
from renyi.cli._output import format_table, print_json


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delta", type=float, required=True, help="target delta, in (0, 1)")
    p.add_argument("--sample-rate", type=float, help="Poisson sampling rate q")
    p.add_argument("--steps", type=int, help="number of steps T")
    p.add_argument("--epochs", type=float, help="epochs (with --dataset-size, --batch-size)")
    p.add_argument("--dataset-size", type=int, help="number of records n")
    p.add_argument("--batch-size", type=int, help="expected batch size (q = batch / n)")
    p.add_argument(
        "--accountant",
        default="rdp",
        choices=[*sorted(ACCOUNTANTS), "all"],
        help="which accountant (default rdp; 'all' compares them)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(sub: Any) -> None:
    p = sub.add_parser("epsilon", help="epsilon of DP-SGD under a batch sampler")
    p.add_argument("--noise-multiplier", type=float, required=True, help="sigma / clip norm")
    _common(p)
    p.add_argument(
        "--sampling",
        choices=SAMPLINGS,
        help="batch sampler that ran (needs --dataset-size and --batch-size; default: "
        "Poisson with --sample-rate/--steps)",
    )
    p.add_argument(
        "--max-batch-size", type=int, help="truncated-poisson: the cap (default ceil(b + 4 sqrt b))"
    )
    p.add_argument(
        "--neighbouring",
        choices=("add-remove", "replace-one"),
        help="neighbouring relation (default: the sampler's own; only fixed-size has both)",
    )
    p.add_argument(
        "--tradeoff",
        action="store_true",
        help="also print the TPR bound of any membership-inference attack at FPR 1e-3, 1e-2, 0.1",
    )
    p.add_argument("--plot", metavar="PATH", help="write the trade-off curve figure to PATH")
    p.set_defaults(func=_epsilon)

    c = sub.add_parser("calibrate", help="noise multiplier for a target (epsilon, delta)")
    c.add_argument("--target-epsilon", type=float, required=True)
    _common(c)
    c.set_defaults(func=_calibrate)


def _conflict(option: str, other: str, why: str) -> SystemExit:
    return SystemExit(f"renyi: error: {option} cannot be combined with {other} ({why})")


def _refuse_ignored(args: argparse.Namespace) -> None:
    """Every option given is used, or the command stops naming it and the option that makes
    it meaningless (nothing is dropped silently)."""
    if args.steps is not None and args.epochs is not None:
        raise _conflict("--steps", "--epochs", "the number of steps comes from one of them")
    sampling = getattr(args, "sampling", None)
    cap = getattr(args, "max_batch_size", None)
    if cap is not None and sampling != "truncated-poisson":
        raise _conflict(
            "--max-batch-size",
            f"--sampling {sampling or 'poisson'}",
            "only truncated-poisson caps the batch",
        )
    shorthand = sampling is None or (
        sampling == "poisson" and args.sample_rate is not None and args.dataset_size is None
    )
    if shorthand:
        if args.epochs is not None and args.sample_rate is not None:
            raise _conflict(
                "--sample-rate",
                "--epochs",
                "with --epochs the rate is --batch-size / --dataset-size",
            )
        if args.epochs is None:
            for opt, value in (
                ("--dataset-size", args.dataset_size),
                ("--batch-size", args.batch_size),
            ):
                if value is None:
                    continue
                if args.sample_rate is not None:
                    raise _conflict(opt, "--sample-rate", "the Poisson rate is --sample-rate here")
                raise SystemExit(
                    f"renyi: error: {opt} is used with --epochs or --sampling (e.g. --sampling "
                    "poisson); with --steps alone give --sample-rate"
                )
    elif args.sample_rate is not None:
        raise _conflict(
            "--sample-rate",
            f"--sampling {sampling}",
            "the sampler's rate is --batch-size / --dataset-size",
        )


def _rate_and_steps(args: argparse.Namespace) -> tuple[float, int]:
    if args.epochs is not None:
        if args.dataset_size is None or args.batch_size is None:
            raise SystemExit("renyi: error: --epochs needs --dataset-size and --batch-size")
        steps, q = epochs_to_steps(args.epochs, args.dataset_size, args.batch_size)
        return q, steps
    if args.sample_rate is None or args.steps is None:
        raise SystemExit("renyi: error: give --sample-rate and --steps (or --epochs ...)")
    return args.sample_rate, args.steps


def _training(args: argparse.Namespace) -> tuple[Event | None, dict[str, Any]]:
    """The event to account (None: the legacy Poisson shorthand) and what describes it."""
    sampling = args.sampling
    if sampling is None or (
        sampling == "poisson" and args.sample_rate is not None and args.dataset_size is None
    ):
        if args.neighbouring not in (None, "add-remove"):
            raise SystemExit("renyi: error: --neighbouring replace-one needs --sampling fixed-size")
        q, steps = _rate_and_steps(args)
        return None, {"sampling": "poisson", "sample_rate": q, "steps": steps}
    if args.dataset_size is None or args.batch_size is None:
        raise SystemExit(
            f"renyi: error: --sampling {sampling} needs --dataset-size and --batch-size"
        )
    if args.epochs is not None and sampling in ("random-allocation", "shuffle"):
        # these samplers run in whole epochs of t batches (t = n // b, resp. ceil(n / b))
        n, b = args.dataset_size, args.batch_size
        per_epoch = n // b if sampling == "random-allocation" else -(-n // b)
        steps, _ = epochs_to_steps(args.epochs, per_epoch, 1)
    elif args.epochs is not None:
        steps, _ = epochs_to_steps(args.epochs, args.dataset_size, args.batch_size)
    elif args.steps is not None:
        steps = args.steps
    else:
        raise SystemExit("renyi: error: give --steps or --epochs")
    event = training_event(
        sampling,
        args.noise_multiplier,
        dataset_size=args.dataset_size,
        batch_size=args.batch_size,
        steps=steps,
        max_batch_size=args.max_batch_size,
        neighbouring=None if args.neighbouring is None else args.neighbouring.replace("-", "_"),
    )
    meta: dict[str, Any] = {
        "sampling": sampling,
        "sample_rate": args.batch_size / args.dataset_size,
        "steps": steps,
        "dataset_size": args.dataset_size,
        "batch_size": args.batch_size,
        "neighbouring": event.neighbouring.value,
    }
    return event, meta


def _lower_bounds(args: argparse.Namespace, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Proven lower bounds for the one-batch-per-epoch samplers (and what Poisson accounting
    of the same run would claim, for shuffling)."""
    from renyi.analysis.allocation import one_of_t_epsilon_lower_bound

    sampling = meta["sampling"]
    if sampling not in ("shuffle", "random-allocation"):
        return []
    n, b = meta["dataset_size"], meta["batch_size"]
    t = -(-n // b) if sampling == "shuffle" else n // b
    epochs = -(-meta["steps"] // t)
    eps = one_of_t_epsilon_lower_bound(
        t,
        args.noise_multiplier,
        args.delta,
        epochs=epochs,
        sensitivity=2.0 if sampling == "shuffle" else 1.0,
    )
    return [{"accountant": "max-test", "bound": "lower", "epsilon": eps}]


def _tradeoff(
    args: argparse.Namespace, event: Event | None, meta: dict[str, Any]
) -> dict[str, Any]:
    from renyi.tradeoff import DEFAULT_FPRS, gdp_mu, tradeoff_curve

    if event is None:
        event = dpsgd_event(args.noise_multiplier, meta["sample_rate"])
        count = meta["steps"]
    else:
        count = 1
    curves = []
    for name in ("pld", "rdp"):
        acc = make_accountant(name)
        if acc.supports(event):
            acc.compose(event, count)
            curves.append((acc, tradeoff_curve(acc, DEFAULT_FPRS)))
    if not curves:
        return {}
    acc, best = curves[0]
    out: dict[str, Any] = {
        "tradeoff": best.to_list(),
        "tradeoff_accountant": best.accountant,
    }
    mu = gdp_mu(acc)
    at = gdp_mu(acc, args.delta)
    out["gdp_mu"] = {
        "mu": mu.mu,
        "method": mu.method,
        "direction": mu.direction,
        "mu_at_delta": at.mu,
    }
    if args.plot:
        from renyi.plots import plot_tradeoff
        from renyi.tradeoff import tradeoff_curve as full

        figure = [full(a) for a, _ in curves]
        try:
            out["plot"] = str(plot_tradeoff(figure, args.plot, gaussian_mu=mu.mu))
        except OSError as exc:
            raise SystemExit(f"renyi: error: --plot {args.plot}: {exc.strerror or exc}") from None
    return out


def _epsilon(args: argparse.Namespace) -> int:
    if args.plot:
        from pathlib import Path

        if not Path(args.plot).expanduser().resolve().parent.is_dir():
            raise SystemExit(f"renyi: error: --plot {args.plot}: its directory does not exist")
    _refuse_ignored(args)
    event, meta = _training(args)
    names = sorted(ACCOUNTANTS) if args.accountant == "all" else [args.accountant]
    report: EpsilonReport
    if event is None:
        report = epsilon_report(
            delta=args.delta,
            noise_multiplier=args.noise_multiplier,
            sample_rate=meta["sample_rate"],
            steps=meta["steps"],
            accountants=names,
        )
    else:
        report = epsilon_report(event, delta=args.delta, accountants=names)
    q, steps = meta["sample_rate"], meta["steps"]
    rows = [
        {
            "accountant": r.accountant,
            "bound": "upper",
            "epsilon": r.epsilon,
            "delta": r.delta,
            "order": r.order,
            "epsilon_lower": r.epsilon_lower,
            "epsilon_upper": r.epsilon if r.epsilon_lower is not None else None,
        }
        for r in report.results
    ]
    lower = _lower_bounds(args, meta)
    extra = _tradeoff(args, event, meta) if (args.tradeoff or args.plot) else {}
    if not rows:
        reasons = "; ".join(f"{n}: {why}" for n, why in report.unsupported)
        raise SystemExit(f"renyi: error: no accountant applies ({reasons})")
    if args.json:
        head = rows[0] if len(rows) == 1 else {"epsilon": report.best().epsilon}
        print_json(
            {
                **head,
                "accountant": args.accountant,
                "delta": args.delta,
                "noise_multiplier": args.noise_multiplier,
                **meta,
                "results": rows + lower,
                "unsupported": dict(report.unsupported),
                **extra,
            }
        )
        return 0
    print(
        f"DP-SGD ({meta['sampling']} sampling): noise_multiplier={args.noise_multiplier:g}, "
        f"sample_rate={q:g}, steps={steps}"
    )
    print(report)
    for row in lower:
        print(
            f"  {row['accountant']}: epsilon >= {row['epsilon']:.6g} (a proven lower bound: "
            "no analysis of this sampler can report less)"
        )
    if meta["sampling"] == "shuffle":
        print(
            "  shuffle: the upper bound has no amplification (none is proven for shuffling; "
            "Poisson accounting of shuffled batches understates epsilon)"
        )
    if extra:
        print(
            f"membership inference (any attack), from the {extra['tradeoff_accountant']} profile:"
        )
        print(
            format_table(["FPR", "TPR at most"], [[d["fpr"], d["tpr"]] for d in extra["tradeoff"]])
        )
        g = extra["gdp_mu"]
        print(f"  mu-GDP: mu = {g['mu']:.6g} ({g['direction']})")
        print(f"  mu of the Gaussian with the same epsilon at delta: {g['mu_at_delta']:.6g}")
        if "plot" in extra:
            print(f"figure written to {extra['plot']}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    _refuse_ignored(args)
    q, steps = _rate_and_steps(args)
    if args.accountant == "all":
        step = dpsgd_event(1.0, q)
        names = [n for n in sorted(ACCOUNTANTS) if make_accountant(n).supports(step)]
    else:
        names = [args.accountant]
    results = [
        calibrate_noise_multiplier(args.target_epsilon, args.delta, q, steps, name)
        for name in names
    ]
    if args.json:
        rows = [
            {
                "accountant": r.accountant,
                "noise_multiplier": r.value,
                "epsilon": r.epsilon,
                "order": r.order,
                "evaluations": r.evaluations,
            }
            for r in results
        ]
        best = min(results, key=lambda r: r.value)
        print_json(
            {
                "noise_multiplier": best.value,
                "epsilon": best.epsilon,
                "target_epsilon": args.target_epsilon,
                "delta": args.delta,
                "accountant": best.accountant if len(results) == 1 else args.accountant,
                "order": best.order,
                "sample_rate": q,
                "steps": steps,
                "results": rows,
            }
        )
        return 0
    print(
        f"Calibrating for epsilon <= {args.target_epsilon:g} at delta = {args.delta:g} "
        f"(sample_rate={q:g}, steps={steps})"
    )
    print(
        format_table(
            ["accountant", "noise_multiplier", "achieved epsilon", "order"],
            [[r.accountant, r.value, r.epsilon, r.order or ""] for r in results],
        )
    )
    return 0
