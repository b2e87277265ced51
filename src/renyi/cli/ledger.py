"""``renyi ledger init|status|show|spend|fits|serve|token|tokens|revoke``: durable budgets.

``LEDGER`` is a SQLite file path or a ``postgresql://`` URL (a team ledger; ``#name`` picks
one of several budgets in a file or database). A keyed (HMAC) ledger reads its key from the
``RENYI_LEDGER_KEY`` environment variable; ``--expect-id`` refuses a ledger whose id (shown by
``show``) is not the one given, e.g. a file swapped for another. Everything answers in the
user's units: ε spent and left at the budget's δ (pure ε for pure budgets, ρ for zCDP), with
the Rényi order behind the figure as a detail; ``--json`` keeps the full per-order curves
under ``curves``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from renyi.analysis.events import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    PureDpEvent,
    from_json,
)
from renyi.budget import Budget
from renyi.cli._output import format_table, print_json
from renyi.ledger._base import describe_event

_LEDGER_HELP = "ledger: a SQLite file path or a postgresql:// URL (key: $RENYI_LEDGER_KEY)"


def register(sub: Any) -> None:
    p = sub.add_parser("ledger", help="privacy budgets with a durable, tamper-evident ledger")
    lsub = p.add_subparsers(dest="ledger_command", metavar="ACTION")
    lsub.required = True

    init = lsub.add_parser("init", help="create a ledger with a budget (or reopen the same one)")
    init.add_argument("path", metavar="LEDGER", help=_LEDGER_HELP)
    init.add_argument("--epsilon", type=float, help="pure ε budget, or (ε, δ) with --delta")
    init.add_argument("--delta", type=float, help="δ of an (ε, δ) budget, in (0, 1)")
    init.add_argument("--rho", type=float, help="zCDP budget ρ (> 0)")
    init.add_argument(
        "--period",
        choices=["day", "week", "month", "quarter", "year"],
        help="a time-bucketed budget: this budget for each period's data (disjoint data only)",
    )
    init.add_argument("--json", action="store_true", help="print one JSON object")
    init.set_defaults(func=_init)

    status = lsub.add_parser("status", help="ε spent and left (one line)")
    status.add_argument("path", metavar="LEDGER", help=_LEDGER_HELP)
    status.add_argument("--expect-id", help="the ledger id it must carry (from `show`)")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(func=_status)

    show = lsub.add_parser("show", help="ε spent and left, and the table of releases")
    show.add_argument("path", metavar="LEDGER", help=_LEDGER_HELP)
    show.add_argument("--expect-id", help="the ledger id it must carry (from `show`)")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=_show)

    spend = lsub.add_parser("spend", help="charge a release (refused if over budget)")
    spend.add_argument("path", metavar="LEDGER", help=_LEDGER_HELP)
    spend.add_argument("--expect-id", help="the ledger id it must carry (from `show`)")
    _event_flags(spend)
    spend.add_argument("--count", type=int, default=1, help="number of runs, e.g. steps (>= 1)")
    spend.add_argument("--label", help="a label recorded with the entry")
    spend.add_argument("--json", action="store_true", help="print one JSON object")
    spend.set_defaults(func=_spend)

    fits = lsub.add_parser("fits", help="how many more steps (releases) of a kind fit")
    fits.add_argument("path", metavar="LEDGER", help=_LEDGER_HELP)
    fits.add_argument("--expect-id", help="the ledger id it must carry (from `show`)")
    _event_flags(fits)
    fits.add_argument("--json", action="store_true", help="print one JSON object")
    fits.set_defaults(func=_fits)

    serve = lsub.add_parser(
        "serve", help="serve every ledger of a store to a team (JSON API and dashboard)"
    )
    serve.add_argument("path", metavar="LEDGER", help=_LEDGER_HELP)
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; plain HTTP: put a TLS proxy in front "
        "of any other address)",
    )
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any)")
    serve.set_defaults(func=_serve)

    token = lsub.add_parser(
        "token", help="create an access token of the ledger service (printed once)"
    )
    token.add_argument(
        "path",
        metavar="LEDGER",
        help="the store; LEDGER#name scopes the token to that ledger (else: every ledger)",
    )
    token.add_argument("--name", required=True, help="who holds it: a person or a job")
    token.add_argument("--role", required=True, choices=["read", "spend", "admin"])
    token.add_argument("--json", action="store_true", help="print one JSON object")
    token.set_defaults(func=_token)

    tokens = lsub.add_parser("tokens", help="list the service's tokens (ids, holders, roles)")
    tokens.add_argument("path", metavar="LEDGER", help="the store (any of its ledgers)")
    tokens.add_argument("--json", action="store_true", help="print one JSON object")
    tokens.set_defaults(func=_tokens)

    revoke = lsub.add_parser(
        "revoke", help="revoke a token: the service refuses it from its next request on"
    )
    revoke.add_argument("path", metavar="LEDGER", help="the store (any of its ledgers)")
    revoke.add_argument("token", help="the token (rlt_<id>_<secret>) or its id (`tokens`)")
    revoke.add_argument("--json", action="store_true", help="print one JSON object")
    revoke.set_defaults(func=_revoke)


def _event_flags(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--event", help="an event as JSON (renyi.analysis.events Event.to_json())")
    what.add_argument("--pure-epsilon", type=float, help="a pure ε-DP release (ε > 0)")
    what.add_argument("--laplace-scale", type=float, help="Laplace, scale / L1 sensitivity (> 0)")
    what.add_argument(
        "--noise-multiplier", type=float, help="Gaussian (DP-SGD step), σ / L2 sensitivity (> 0)"
    )
    p.add_argument(
        "--sample-rate",
        type=float,
        help="Poisson sampling rate in (0, 1] (with --noise-multiplier)",
    )


def _event(args: argparse.Namespace) -> Event:
    from renyi.cli.main import UsageError

    if args.sample_rate is not None and args.noise_multiplier is None:
        raise UsageError("--sample-rate goes with --noise-multiplier (a subsampled Gaussian step)")
    if args.event:
        return from_json(args.event)
    if args.pure_epsilon is not None:
        return PureDpEvent(args.pure_epsilon)
    if args.laplace_scale is not None:
        return LaplaceEvent(args.laplace_scale)
    event: Event = GaussianEvent(args.noise_multiplier)
    if args.sample_rate is not None:
        event = PoissonSampledEvent(args.sample_rate, event)
    return event


def _key() -> str | None:
    return os.environ.get("RENYI_LEDGER_KEY") or None


def _open(args: argparse.Namespace) -> Budget:
    return Budget.open(args.path, key=_key(), expect_id=args.expect_id)


def _num(x: float) -> str:
    return f"{x:.4g}"


def _headline(b: Budget, st: dict[str, Any]) -> str:
    """One line: what was spent and what is left, in the user's units."""
    n = st["releases"]
    releases = f"{n} release{'s' if n != 1 else ''}"
    if b.kind == "pure":
        return (
            f"ε spent {_num(st['epsilon_spent'])} of {_num(st['epsilon'])}, "
            f"{_num(st['epsilon_remaining'])} left (pure ε-DP, basic composition; {releases})"
        )
    if b.kind == "zcdp":
        return (
            f"ρ spent {_num(st['rho_spent'])} of {_num(st['rho'])}, "
            f"{_num(st['rho_remaining'])} left (zCDP; {releases})"
        )
    if b.kind == "approx":
        return (
            f"ε spent {_num(st['epsilon_spent'])} of {_num(st['epsilon'])}, "
            f"{_num(st['epsilon_remaining'])} left at δ={st['delta']:g} ({releases}; "
            f"RDP filter, Mironov's conversion at Rényi order {st['order']:g})"
        )
    return (
        f"RDP budget curve: {st['orders_within_budget']} orders within budget, best order "
        f"{st['order']:g} ({releases})"
    )


def _cost_text(b: Budget, cost: dict[str, Any]) -> str:
    if b.kind == "pure":
        return str(cost.get("epsilon", ""))
    if b.kind == "zcdp":
        return str(cost.get("rho", ""))
    value = cost.get("epsilon")
    return _num(value) if isinstance(value, float) else ""


def _entries_json(b: Budget) -> list[dict[str, Any]]:
    return [
        {
            "index": e.index,
            "time": e.time,
            "label": e.label,
            "event": e.event,
            "count": e.count,
            "cost": e.cost,
            "state_after": e.state_after,
            "metadata": e.metadata,
            "hash": e.hash,
        }
        for e in b.entries()
    ]


def _status_json(b: Budget, path: str) -> dict[str, Any]:
    st = b.status()
    budget = {k: v for k, v in b.spec.items() if k not in ("orders", "limit")}
    out: dict[str, Any] = {"ledger": path, "budget": budget, **st}
    return out


def _curves(b: Budget) -> dict[str, Any]:
    if b.kind not in ("approx", "rdp"):
        return {}
    spec = b.spec
    return {
        "orders": spec["orders"],
        "limit": spec["limit"],
        "spent": [float(x) for x in b.spent()],
    }


def _init(args: argparse.Namespace) -> int:
    b = Budget(
        epsilon=args.epsilon,
        delta=args.delta,
        rho=args.rho,
        ledger=args.path,
        key=_key(),
        period=args.period,
    )
    st = b.status()
    if args.json:
        print_json({"created": b.created, **_status_json(b, args.path)})
    elif b.created:
        print(f"created {args.path}: {b!r}")
    else:
        print(f"{args.path} already holds this budget; nothing changed: {_headline(b, st)}")
    return 0


def _status(args: argparse.Namespace) -> int:
    b = _open(args)
    if args.json:
        print_json(_status_json(b, args.path))
    else:
        print(f"{b!r}: {_headline(b, b.status())}")
    return 0


def _show(args: argparse.Namespace) -> int:
    b = _open(args)
    if args.json:
        out = _status_json(b, args.path)
        out["entries"] = _entries_json(b)
        out["curves"] = _curves(b)
        print_json(out)
        return 0
    st = b.status()
    unit = "ρ" if b.kind == "zcdp" else "ε"
    spent_key = "rho_spent" if b.kind == "zcdp" else "epsilon_spent"
    rows = []
    for e in b.entries():
        after = e.state_after.get(spent_key)
        rows.append(
            [
                e.index,
                e.time[:19],
                e.label or "",
                describe_event(e.event),
                e.count,
                _cost_text(b, e.cost),
                _num(after) if isinstance(after, float) else (after or ""),
            ]
        )
    headers = ["#", "time (UTC)", "label", "event", "count", f"{unit} cost", f"{unit} spent after"]
    print(format_table(headers, rows, f"{b!r}: {_headline(b, st)}"))
    print(f"ledger {st['name']!r}, id {st['id']}; chain head: {st['head']}")
    return 0


def _spend(args: argparse.Namespace) -> int:
    b = _open(args)
    receipt = b.spend(_event(args), args.count, label=args.label)
    st = b.status()
    if args.json:
        print_json({"index": receipt.index, "cost": receipt.cost, **_status_json(b, args.path)})
    else:
        what = f"{unit} {_cost_text(b, receipt.cost)}" if (unit := _unit(b)) else "recorded"
        print(f"recorded release #{receipt.index} ({what}): {_headline(b, st)}")
    return 0


def _unit(b: Budget) -> str:
    return {"pure": "ε", "approx": "ε", "zcdp": "ρ"}.get(b.kind, "")


def _fits(args: argparse.Namespace) -> int:
    b = _open(args)
    event = _event(args)
    steps = b.max_count(event)
    st = b.status()
    if args.json:
        print_json({"steps": steps, "event": event.to_dict(), **_status_json(b, args.path)})
    else:
        kind = "steps" if isinstance(event, PoissonSampledEvent | GaussianEvent) else "releases"
        print(f"{steps} more {kind} of {describe_event(event.to_dict())} fit: {_headline(b, st)}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from renyi.cli.main import UsageError

    try:
        from renyi.ledger.service import serve
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"the ledger service needs {exc.name}: pip install 'renyi[service]'"
        ) from None
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: expected 0..65535")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: listening on {args.host} in plain HTTP: tokens and ledgers cross the "
            "network in clear unless a TLS-terminating reverse proxy is in front",
            file=sys.stderr,
        )
    try:
        serve(args.path, host=args.host, port=args.port, key=_key(), announce=_announce)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    return 0


def _announce(line: str) -> None:
    print(line, flush=True)


def _store_and_scope(arg: str) -> tuple[Any, str]:
    """The store ``LEDGER`` names and the ledger its ``#name`` picks ("" when none)."""
    from renyi.ledger import is_postgres_url, open_store

    path, _, scope = arg.rpartition("#") if "#" in arg else (arg, "", "")
    if not is_postgres_url(path) and os.path.exists(arg):  # a file whose name holds '#'
        path, scope = arg, ""
    store = open_store(path) if is_postgres_url(path) else open_store(path, create=False)
    return store, scope


def _tokens(args: argparse.Namespace) -> int:
    from renyi.ledger.tokens import list_tokens

    rows = [
        {"id": r.id, "name": r.name, "role": r.role, "scope": r.scope, "created": r.created}
        for r in list_tokens(_store_and_scope(args.path)[0])
    ]
    if args.json:
        print_json({"tokens": rows})
    elif not rows:
        print("no tokens")
    else:
        for r in rows:
            print(f"{r['id']}  {r['role']:<5}  {r['scope']:<20}  {r['created'][:19]}  {r['name']}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from renyi.ledger.tokens import revoke_token

    r = revoke_token(_store_and_scope(args.path)[0], args.token)
    if args.json:
        print_json({"revoked": r.id, "name": r.name, "role": r.role, "scope": r.scope})
    else:
        print(f"revoked token {r.id} ({r.role} for {r.name!r}); the service refuses it now")
    return 0


def _token(args: argparse.Namespace) -> int:
    from renyi.ledger.tokens import create_token

    store, scope = _store_and_scope(args.path)
    if scope and store.named(scope).info() is None:
        _no_ledger(store, scope)
    token = create_token(store, name=args.name, role=args.role, scope=scope or "*")
    if args.json:
        print_json({"token": token, "name": args.name, "role": args.role, "scope": scope or "*"})
    else:
        print(token)
        print(
            f"(a {args.role} token for {args.name!r} on "
            f"{'ledger ' + repr(scope) if scope else 'every ledger of the store'}; it is shown "
            "only this once: the store keeps its hash)",
            file=sys.stderr,
        )
    return 0


def _no_ledger(store: Any, name: str) -> None:
    from renyi.ledger import LedgerNotFoundError

    raise LedgerNotFoundError(f"no ledger named {name!r} in {store.describe()}")
