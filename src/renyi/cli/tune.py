"""``renyi tune``: private hyperparameter search whose total ε covers every run.

Draws the number of training runs K at random (Papernot & Steinke 2022; geometric by
default), trains K DP-SGD models on scikit-learn's digits with hyperparameters drawn from a
grid (learning rate × clipping norm), keeps the best by accuracy on a validation split of the
*public* held-out data, and reports the ε of the whole procedure — calibrated so that it
meets ``--epsilon`` — beside what naive composition of every configuration would cost.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from typing import Any

from renyi.cli._output import format_table, print_json

LEARNING_RATES = (0.5, 1.0, 2.0, 4.0)
CLIPPING_NORMS = (0.5, 1.0, 2.0)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "tune",
        help="private hyperparameter tuning: the total epsilon of the whole search",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--epsilon", type=float, default=3.0, help="total epsilon (default 3)")
    p.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    p.add_argument(
        "--trials-mean", type=float, default=5.0, help="mean number of runs E[K] (default 5)"
    )
    p.add_argument(
        "--shape",
        type=float,
        default=1.0,
        help="distribution of K: 1 geometric (default), 0 logarithmic, eta > 0 truncated "
        "negative binomial, inf Poisson",
    )
    p.add_argument("--epochs", type=float, default=5.0, help="epochs per run (default 5)")
    p.add_argument("--batch-size", type=int, default=64, help="expected batch size (default 64)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _selection_epsilon(
    sigma: float, q: float, steps: int, mean: float, shape: float, d: float
) -> tuple[float, Any]:
    from renyi.accountants import RdpAccountant
    from renyi.analysis.events import RepeatAndSelectEvent, SelfComposedEvent, dpsgd_event

    run = SelfComposedEvent(dpsgd_event(sigma, q), steps)
    event = RepeatAndSelectEvent(run, mean, shape)
    return RdpAccountant().compose(event).epsilon(d).epsilon, run


def run(args: argparse.Namespace) -> int:
    """Entry point of ``renyi tune``."""
    import torch

    from renyi._validation import check_int, check_positive, fail
    from renyi.accountants import RdpAccountant
    from renyi.analysis.selection import RepetitionDistribution
    from renyi.calibration import epochs_to_steps
    from renyi.cli._training import build_model
    from renyi.dpsgd.data import load_digits
    from renyi.dpsgd.privacy import make_private
    from renyi.dpsgd.trainer import Trainer, evaluate
    from renyi.errors import PrivacyParameterError
    from renyi.tuning import tune

    started = time.perf_counter()
    target = check_positive("--epsilon", args.epsilon)
    check_int("--threads", args.threads, minimum=1)
    torch.set_num_threads(args.threads)
    RepetitionDistribution(args.trials_mean, args.shape)  # validates --trials-mean/--shape
    train, test = load_digits()
    x_test, y_test = test.tensors
    half = len(x_test) // 2  # public held-out data: validation half, test half
    val = torch.utils.data.TensorDataset(x_test[:half], y_test[:half])
    final = torch.utils.data.TensorDataset(x_test[half:], y_test[half:])
    steps, q = epochs_to_steps(args.epochs, len(train), args.batch_size)

    # σ so that the whole selection meets the target (ε decreases in σ): geometric bisection
    lo, hi = 0.3, 1.0
    while _selection_epsilon(hi, q, steps, args.trials_mean, args.shape, args.delta)[0] > target:
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:
            raise PrivacyParameterError(
                f"--epsilon={target} is unreachable for the whole tuning with "
                "noise_multiplier <= 1000"
            )
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        eps_mid = _selection_epsilon(mid, q, steps, args.trials_mean, args.shape, args.delta)[0]
        lo, hi = (mid, hi) if eps_mid > target else (lo, mid)
    sigma = hi
    total, run_event = _selection_epsilon(sigma, q, steps, args.trials_mean, args.shape, args.delta)
    space = [{"lr": lr, "max_grad_norm": c} for lr in LEARNING_RATES for c in CLIPPING_NORMS]

    def train_one(config: dict[str, float]) -> tuple[float, Any]:
        model = build_model("digits", "linear")
        with warnings.catch_warnings():
            private = make_private(
                model,
                torch.optim.SGD(model.parameters(), lr=config["lr"]),
                train,
                loss_fn=torch.nn.CrossEntropyLoss(),
                noise_multiplier=sigma,
                delta=args.delta,
                steps=steps,
                batch_size=args.batch_size,
                max_grad_norm=config["max_grad_norm"],
                accountant="rdp",
            )
            Trainer(private, progress=False).fit()
        return evaluate(model, val)[1], model

    result = tune(
        train_one,
        space,
        trial_event=run_event,
        mean_trials=args.trials_mean,
        shape=args.shape,
        progress=not (args.no_progress or args.json),
    )
    if not math.isclose(result.epsilon(args.delta), total, rel_tol=1e-9):
        raise fail("epsilon", result.epsilon(args.delta), f"{total} (internal inconsistency)")
    naive = RdpAccountant().compose(run_event, count=len(space)).epsilon(args.delta).epsilon
    single = RdpAccountant().compose(run_event).epsilon(args.delta).epsilon
    best = result.best
    summary: dict[str, Any] = {
        "epsilon": total,
        "delta": args.delta,
        "epsilon_naive": naive,
        "epsilon_one_run": single,
        "configurations": len(space),
        "trials_mean": args.trials_mean,
        "shape": args.shape,
        "runs": result.runs,
        "noise_multiplier": sigma,
        "steps_per_run": steps,
        "sample_rate": q,
        "best": None if best is None else best.config,
        "validation_accuracy": None if best is None else best.score,
        "accuracy": None if best is None else evaluate(best.output, final)[1],
        "seconds": time.perf_counter() - started,
    }
    if args.json:
        print_json(summary)
        return 0
    rows: list[list[Any]] = [
        ["total epsilon (whole tuning)", f"{total:.4f} at delta {args.delta:g}"],
        ["naive composition of all configs", f"{naive:.4f} ({len(space)} runs)"],
        ["one run", f"{single:.4f}"],
        ["runs made (K)", result.runs],
        ["noise multiplier sigma", f"{sigma:.4f}"],
        ["best configuration", summary["best"]],
        [
            "test accuracy of the best",
            "-" if summary["accuracy"] is None else f"{100 * summary['accuracy']:.2f} %",
        ],
    ]
    print(format_table(["", "value"], rows, title="renyi tune: private hyperparameter search"))
    return 0
