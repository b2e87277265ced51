"""``make demo``: a guided tour of renyi, end to end, in about two minutes.

Run with ``python -m renyi.demo [--out DIR] [--skip-training]``. Each section prints what
it does and the command-line equivalent, so a newcomer can rerun any step by hand.
Figures go to ``out/`` (created if needed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from renyi.cli.main import main as cli


def _section(title: str, command: list[str] | None = None) -> None:
    print()
    print("=" * 78)
    print(title)
    if command is not None:
        print("$ renyi " + " ".join(command))
    print("=" * 78, flush=True)


def _run(command: list[str]) -> None:
    code = cli(command)
    if code != 0:
        raise SystemExit(f"demo step failed: renyi {' '.join(command)} (exit {code})")


def composition_tour(out: Path) -> None:
    cmd = [
        "compare",
        "--sigma",
        "200",
        "--delta",
        "1e-5",
        "--iterations",
        "500",
        "--order",
        "60",
        "--plot",
        str(out / "composition.png"),
    ]
    _section("1. Why Rényi DP: epsilon of 500 Gaussian releases, five ways (book chapter)", cmd)
    _run(cmd)


def accounting_tour() -> None:
    cmd = [
        "epsilon",
        "--noise-multiplier",
        "1.1",
        "--sample-rate",
        "0.004267",
        "--steps",
        "14100",
        "--delta",
        "1e-5",
        "--accountant",
        "all",
    ]
    _section("2. DP-SGD accounting (Abadi et al. MNIST setting), every accountant", cmd)
    _run(cmd)
    cmd = [
        "calibrate",
        "--target-epsilon",
        "3",
        "--delta",
        "1e-5",
        "--sample-rate",
        "0.004267",
        "--steps",
        "14100",
        "--accountant",
        "all",
    ]
    _section("3. The inverse question: which noise multiplier gives epsilon = 3?", cmd)
    _run(cmd)


def budget_tour() -> None:
    from renyi.analysis.events import LaplaceEvent
    from renyi.budget import Budget
    from renyi.errors import BudgetExceededError

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "team-budget.sqlite")
        _section(
            "4. A budget that refuses, with a durable ledger",
            ["ledger", "init", path, "--epsilon", "1.0"],
        )
        _run(["ledger", "init", path, "--epsilon", "1.0"])
        budget = Budget.open(path)
        served = 0
        for i in range(12):
            try:
                budget.spend(LaplaceEvent(scale=10.0), label=f"count query {i}")  # ε = 0.1
                served += 1
            except BudgetExceededError as exc:
                print(f"query {i}: {exc}")
        print(f"served {served} Laplace(ε=0.1) queries out of 12 against ε = 1.0")
        _run(["ledger", "show", path])


def training_tour(out: Path) -> None:
    cmd = [
        "train",
        "--dataset",
        "digits",
        "--epsilon",
        "3",
        "--delta",
        "1e-5",
        "--plot",
        str(out / "dpsgd-epsilon.png"),
    ]
    _section("5. Private training: DP-SGD on scikit-learn's digits, calibrated to ε = 3", cmd)
    _run(cmd)


STEPS: list[tuple[str, Callable[[Path], None]]] = [
    ("composition", composition_tour),
    ("accounting", lambda out: accounting_tour()),
    ("budget", lambda out: budget_tour()),
    ("training", training_tour),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="out", help="directory for figures (default: out/)")
    ap.add_argument("--skip-training", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for name, step in STEPS:
        if name == "training" and args.skip_training:
            continue
        step(out)
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s; figures in {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
