"""``renyi correlated``: prefix-sum error of correlated-noise strategies (matrix factorization).

For each number of steps T and each strategy (DP-SGD's independent noise, the online tree of
DP-FTRL, the full tree with Honaker's decoder, optimised banded Toeplitz, optimised BLT, the
optimal dense factorization), prints the sensitivity under the participation pattern and the
RMSE and max error of the running sums at σ = 1 per unit sensitivity — i.e. every strategy
at the same privacy. ``--min-sep b`` models multi-epoch training (participations at least b
steps apart, at most ``--participations`` of them; default ⌈T/b⌉). ``--json`` prints one
JSON object.

Example: ``renyi correlated --steps 256 1024 --strategy dpsgd banded blt --bands 16``
"""

from __future__ import annotations

import argparse
from typing import Any

from renyi.cli._output import format_table, print_json

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    from renyi.correlated.table import STRATEGY_NAMES

    p = sub.add_parser(
        "correlated",
        help="error table of correlated-noise strategies (DP-FTRL, banded MF, BLT)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--steps", type=int, nargs="+", default=[128, 512, 2048], help="T values")
    p.add_argument(
        "--strategy",
        nargs="+",
        choices=STRATEGY_NAMES,
        default=list(STRATEGY_NAMES),
        help="strategies (default all; honaker only for T <= 1024, dense for T <= 512)",
    )
    p.add_argument("--bands", type=int, default=8, help="bands of the banded strategy")
    p.add_argument("--buffers", type=int, default=3, help="buffers of the BLT strategy")
    p.add_argument("--min-sep", type=int, help="minimum separation b (default T: one pass)")
    p.add_argument("--participations", type=int, help="at most k participations")
    p.add_argument("--momentum", type=float, default=0.0, help="heavy-ball momentum beta")
    p.add_argument("--loss", choices=("total", "max"), default="total", help="loss optimised")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``renyi correlated``."""
    from renyi.correlated.table import error_table

    rows = error_table(
        list(args.steps),
        list(args.strategy),
        bands=args.bands,
        buffers=args.buffers,
        min_sep=args.min_sep,
        max_participations=args.participations,
        momentum=args.momentum,
        loss=args.loss,
    )
    if args.json:
        print_json(
            {
                "min_sep": args.min_sep,
                "participations": args.participations,
                "momentum": args.momentum,
                "loss": args.loss,
                "units": "noise std 1 per unit sensitivity (same Gaussian privacy)",
                "rows": [r.as_dict() for r in rows],
            }
        )
        return 0
    table = [
        [
            r.strategy,
            r.steps,
            "" if r.bands is None else r.bands,
            "" if r.buffers is None else r.buffers,
            r.sensitivity,
            "exact" if r.sensitivity_exact else "bound",
            r.rmse,
            r.max_error,
        ]
        for r in rows
    ]
    sep = "single participation" if args.min_sep is None else f"min-sep {args.min_sep}"
    print(
        format_table(
            ["strategy", "T", "bands", "buffers", "sens", "", "rmse", "max error"],
            table,
            title=f"prefix-sum error at sigma = 1 per unit sensitivity ({sep}, "
            f"momentum {args.momentum:g}, optimised for {args.loss} error)",
        )
    )
    return 0
