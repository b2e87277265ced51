"""``renyi compare``: the book chapter's comparisons of composition methods.

* ``renyi compare --sigma 200 --delta 1e-5 --iterations 500 [--order 60]``: epsilon after k
  Gaussian releases under advanced composition, zCDP, RDP at a fixed order, RDP at the best
  order and the exact value (:func:`renyi.analysis.composition.compare_gaussian_composition`).
* ``renyi compare --noise-vs-queries [--epsilon 0.1] [--delta 1e-5] [--queries 100]``: noise
  needed for k queries, sequential vs vectorised
  (:func:`renyi.analysis.composition.vectorised_vs_sequential_noise`).

``--plot PATH`` writes the figure (needs matplotlib); ``--json`` prints one JSON object whose
``series`` holds every k computed: the table's k values, plus up to 400 evenly spaced ones
(every k up to 400) when a plot is drawn.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from renyi.analysis.composition import (
    GaussianCompositionComparison,
    NoiseComparison,
    compare_gaussian_composition,
    vectorised_vs_sequential_noise,
)
from renyi.cli._output import format_table, print_json

_SHORT = {
    "book_advanced": "adv(book)",
    "advanced": "adv(DRV)",
    "zcdp_bun_steinke": "zCDP(B-S)",
    "zcdp_optimal": "zCDP(opt)",
    "rdp_fixed_order": "RDP(a={order})",
    "rdp_optimal": "RDP(opt)",
    "exact": "exact",
    "laplace_sequential": "Lap seq b",
    "laplace_vectorised": "Lap vec b",
    "gaussian_advanced": "G adv var",
    "gaussian_vectorised": "G vec var",
    "gaussian_zcdp": "G zCDP var",
    "gaussian_rdp": "G RDP var",
    "gaussian_exact": "G exact var",
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="compare composition methods (book chapter: Gaussian epsilon vs iterations)",
        description=(
            "Epsilon after k Gaussian releases under advanced composition, zCDP, RDP (fixed "
            "and optimal order) and the exact analytic Gaussian; or, with --noise-vs-queries, "
            "the noise needed for k queries answered sequentially vs as one vector query."
        ),
    )
    p.add_argument("--sigma", type=float, default=200.0, help="Gaussian noise std (default 200)")
    p.add_argument("--delta", type=float, default=1e-5, help="delta, in (0, 1) (default 1e-5)")
    p.add_argument("--iterations", type=int, default=500, help="largest k (default 500)")
    p.add_argument("--order", type=float, default=60.0, help="fixed RDP order (default 60)")
    p.add_argument(
        "--noise-vs-queries",
        action="store_true",
        help="noise needed for k queries: sequential vs vectorised (Laplace and Gaussian)",
    )
    p.add_argument(
        "--epsilon", type=float, default=0.1, help="total epsilon (--noise-vs-queries; 0.1)"
    )
    p.add_argument(
        "--queries", type=int, default=100, help="largest k (--noise-vs-queries; default 100)"
    )
    p.add_argument("--plot", metavar="PATH", help="write the figure to PATH (png, pdf, svg)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run)


def _table_ks(n: int) -> list[int]:
    """A handful of k values from 1 to n (always including n)."""
    picks = {1, n // 10, n // 5, n // 2, n}
    return sorted(k for k in picks if 1 <= k <= n)


def _run(args: argparse.Namespace) -> int:
    if args.noise_vs_queries:
        return _noise(args)
    return _composition(args)


def _ks_to_compute(n: int, plot: bool) -> list[int] | int:
    """The table's k values; with a plot, also up to 400 evenly spaced ones (all if n <= 400)."""
    if n < 1:
        return n  # let the library report the bad value
    if plot:
        if n <= 400:
            return n
        grid = np.unique(np.round(np.linspace(1, n, 400)).astype(int)).tolist()
        return sorted({*grid, *_table_ks(n)})
    return _table_ks(n)


def _composition(args: argparse.Namespace) -> int:
    todo = _ks_to_compute(args.iterations, bool(args.plot))
    ks_arg: Any = np.asarray(todo, dtype=np.int64) if isinstance(todo, list) else todo
    r = compare_gaussian_composition(args.sigma, args.delta, ks_arg, order=args.order)
    ks = _table_ks(int(r.k[-1]))
    names = [n for n, _ in GaussianCompositionComparison.METHODS]
    rows = [r.row(k) for k in ks]
    plot = _plot_composition(r, args.plot) if args.plot else None
    if args.json:
        print_json(
            {
                "command": "compare",
                "mode": "gaussian_composition",
                "sigma": r.sigma,
                "delta": r.delta,
                "order": r.order,
                "iterations": int(r.k[-1]),
                "methods": dict(GaussianCompositionComparison.METHODS),
                "rows": [{"k": int(row["k"]), **{n: row[n] for n in names}} for row in rows],
                "rdp_optimal_order": {int(row["k"]): row["rdp_optimal_order"] for row in rows},
                "series": r.columns(),
                "plot": plot,
            }
        )
        return 0
    headers = ["k", *(_SHORT[n].format(order=f"{r.order:g}") for n in names), "best a"]
    table_rows = [
        [int(row["k"]), *(row[n] for n in names), row["rdp_optimal_order"]] for row in rows
    ]
    print(
        format_table(
            headers,
            table_rows,
            title=(
                f"epsilon after k Gaussian releases (sigma={r.sigma:g}, L2 sensitivity 1, "
                f"delta={r.delta:g})"
            ),
        )
    )
    print()
    for n, label in GaussianCompositionComparison.METHODS:
        print(f"  {_SHORT[n].format(order=f'{r.order:g}'):<12} {label}")
    print("  best a       the Rényi order achieving RDP(opt)")
    if plot:
        print(f"\nfigure written to {plot}")
    return 0


def _noise(args: argparse.Namespace) -> int:
    todo = _ks_to_compute(args.queries, bool(args.plot))
    ks_arg: Any = np.asarray(todo, dtype=np.int64) if isinstance(todo, list) else todo
    r = vectorised_vs_sequential_noise(ks_arg, args.epsilon, args.delta)
    ks = _table_ks(int(r.k[-1]))
    cols = r.columns()
    names = [n for n, _ in NoiseComparison.LAPLACE + NoiseComparison.GAUSSIAN]
    idx = [int(np.nonzero(r.k == k)[0][0]) for k in ks]
    plot = _plot_noise(r, args.plot) if args.plot else None
    if args.json:
        print_json(
            {
                "command": "compare",
                "mode": "noise_vs_queries",
                "epsilon": r.epsilon,
                "delta": r.delta,
                "queries": int(r.k[-1]),
                "methods": dict(NoiseComparison.LAPLACE + NoiseComparison.GAUSSIAN),
                "rows": [{"k": int(r.k[i]), **{n: float(cols[n][i]) for n in names}} for i in idx],
                "series": cols,
                "plot": plot,
            }
        )
        return 0
    headers = ["k", *(_SHORT[n] for n in names)]
    table_rows = [[int(r.k[i]), *(float(cols[n][i]) for n in names)] for i in idx]
    print(
        format_table(
            headers,
            table_rows,
            title=(
                f"noise per query for k sensitivity-1 queries (Laplace: scale b, total "
                f"eps={r.epsilon:g}; Gaussian: variance, total ({r.epsilon:g}, {r.delta:g}))"
            ),
        )
    )
    print()
    for n, label in NoiseComparison.LAPLACE:
        print(f"  {_SHORT[n]:<12} Laplace: {label}")
    for n, label in NoiseComparison.GAUSSIAN:
        print(f"  {_SHORT[n]:<12} Gaussian: {label}")
    if plot:
        print(f"\nfigure written to {plot}")
    return 0


def _plot_composition(r: GaussianCompositionComparison, path: str) -> str:
    from renyi.plots import plot_composition_comparison

    return str(plot_composition_comparison(r, path))


def _plot_noise(r: NoiseComparison, path: str) -> str:
    from renyi.plots import plot_noise_vs_queries

    return str(plot_noise_vs_queries(r, path))
