"""``renyi train``: train a private classifier calibrated to a target (ε, δ), end to end.

Loads the data (scikit-learn's digits by default, or Fashion-MNIST from IDX files), calibrates
the noise multiplier with the chosen accountant (PLD where available), trains with DP-SGD
(Poisson sampling by default, per-example clipping, secure noise unless ``--seed``), trains the
same model without privacy for comparison, and prints a summary: accuracy private vs
non-private, σ, steps, and ε from each accountant for the event of the sampler that ran.
``--sampling`` picks the batch sampler: poisson and fixed-size are charged per step;
random-allocation (balls in bins: every example once per epoch of n // b batches) and shuffle
are charged one whole epoch at each epoch's first step (a partial epoch costs a full one).
``--plot out.png`` draws ε over training under each accountant. ``--json`` prints exactly one
JSON object.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from typing import Any

from renyi.cli._output import format_table, print_json
from renyi.cli._training import (
    DATASETS,
    DEFAULTS,
    MODELS,
    accountant_names,
    build_model,
    choose_accountant,
    load_data,
)

__all__ = ["DATASETS", "MODELS", "add_training_options", "build_model", "register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train a DP-SGD classifier calibrated to (epsilon, delta)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_training_options(p)
    p.add_argument("--plot", help="write a plot of epsilon over training to this file")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def add_training_options(p: argparse.ArgumentParser) -> None:
    """The options that define a training run (data, model, target, sampling, noise, ...):
    ``renyi train``'s own, and ``renyi audit train``'s, so the two accept the same runs."""
    p.add_argument("--dataset", choices=DATASETS, default="digits")
    p.add_argument("--model", choices=MODELS, help="architecture (default per dataset)")
    p.add_argument("--data-dir", help="directory of the Fashion-MNIST .gz IDX files")
    p.add_argument("--epsilon", type=float, default=3.0, help="target epsilon (default 3)")
    p.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    p.add_argument("--epochs", type=float, help="epochs (rounded up to whole steps)")
    p.add_argument("--batch-size", type=int, help="expected batch size q*n")
    p.add_argument("--lr", type=float, help="learning rate (SGD with momentum)")
    p.add_argument("--max-grad-norm", type=float, help="per-example clipping norm C")
    p.add_argument(
        "--accountant",
        default="auto",
        help="accountant that calibrates sigma (default auto: PLD, else the tightest that "
        "supports the sampling)",
    )
    p.add_argument(
        "--sampling",
        choices=("poisson", "fixed-size", "random-allocation", "shuffle"),
        default="poisson",
        help="poisson (add/remove neighbours, default); fixed-size batches drawn without "
        "replacement (replace-one); random-allocation (balls in bins: every example once per "
        "epoch of n // b batches, add/remove, charged per epoch); shuffle (a random "
        "permutation per epoch, replace-one, charged per epoch: the proven bound has no "
        "amplification)",
    )
    p.add_argument(
        "--noise",
        choices=("dpsgd", "tree", "banded", "blt", "auto"),
        default="dpsgd",
        help="dpsgd (independent noise, default) or correlated noise: tree (DP-FTRL), "
        "banded (amplified banded MF), blt, or auto (the rule of "
        "renyi.correlated.choice: DP-SGD unless correlation lowers the calibrated noise "
        "by 10%%); with --sampling poisson or random-allocation (renyi.dpsgd.correlated)",
    )
    p.add_argument(
        "--bands",
        type=int,
        help="bands (= partitions) of --noise banded (default: the b with the smallest "
        "calibrated prefix-sum error)",
    )
    p.add_argument("--buffers", type=int, default=3, help="buffers of --noise blt (default 3)")
    p.add_argument(
        "--accounting",
        choices=("standard", "individual"),
        default="standard",
        help="standard (every record charged the worst case) or individual (a Rényi filter "
        "per record, Feldman & Zrnic 2021; records with small gradients train longer)",
    )
    p.add_argument(
        "--user-level",
        choices=("ELS", "ULS"),
        help="user-level guarantee: ELS (example-level sampling) or ULS (user-level "
        "sampling, per-user clipping); users are --examples-per-user consecutive examples",
    )
    p.add_argument("--examples-per-user", type=int, help="examples per synthetic user (K)")
    p.add_argument(
        "--seed",
        type=int,
        help="seed for reproducible runs (NOT private: the noise becomes predictable)",
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: shared machines)"
    )
    p.add_argument("--limit", type=int, help="use only the first LIMIT examples of each split")
    p.add_argument("--no-baseline", action="store_true", help="skip the non-private model")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``renyi train`` (returns the exit code)."""
    with warnings.catch_warnings():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.accounting == "individual" or args.user_level is not None:
        if args.noise != "dpsgd":  # never ignore a flag silently
            from renyi._validation import fail

            raise fail("--noise", args.noise, "dpsgd with --accounting individual/--user-level")
        from renyi.cli._personalized import run_personalized

        return run_personalized(args)
    import torch

    from renyi.dpsgd.privacy import make_private
    from renyi.dpsgd.trainer import Trainer, evaluate, spent_epsilon_curve, train_non_private
    from renyi.errors import InsecureRandomnessWarning, OrderAtGridEdgeWarning

    warnings.simplefilter("ignore", OrderAtGridEdgeWarning)  # ε is still a valid bound
    started = time.perf_counter()
    arch, epochs, batch, lr, clip, momentum = DEFAULTS[args.dataset]
    arch = args.model if args.model is not None else arch
    if args.threads is not None:
        if args.threads < 1:
            from renyi._validation import fail

            raise fail("--threads", args.threads, "an integer >= 1")
        torch.set_num_threads(args.threads)
    epochs = args.epochs if args.epochs is not None else epochs
    batch = args.batch_size if args.batch_size is not None else batch
    lr = args.lr if args.lr is not None else lr
    clip = args.max_grad_norm if args.max_grad_norm is not None else clip

    train, test = load_data(args)
    sampling: str = args.sampling  # training_event's names (make_private takes them too)
    accountant = choose_accountant(args.accountant, sampling, len(train), batch)
    init_seed = 0 if args.seed is None else args.seed
    torch.manual_seed(init_seed)  # model initialisation only (public, data-independent)
    model = build_model(args.dataset, arch)
    initial_state = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        if args.json:
            warnings.simplefilter("ignore", InsecureRandomnessWarning)
        common: dict[str, Any] = dict(
            loss_fn=torch.nn.CrossEntropyLoss(),
            target_epsilon=args.epsilon,
            delta=args.delta,
            epochs=epochs,
            batch_size=batch,
            max_grad_norm=clip,
            accountant=accountant,
            seed=args.seed,
        )
        sgd = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        if args.noise == "dpsgd":
            private = make_private(model, sgd, train, sampling=sampling, **common)  # type: ignore[arg-type]
        else:
            from renyi.dpsgd.correlated import make_private_correlated

            if sampling not in ("poisson", "random-allocation"):
                from renyi._validation import fail

                raise fail("--sampling", args.sampling, "poisson or random-allocation with --noise")
            private = make_private_correlated(
                model,
                sgd,
                train,
                noise=args.noise,
                bands=args.bands,
                buffers=args.buffers,
                sampling=sampling,
                **common,
            )
    trainer = Trainer(private, eval_data=test, progress=not (args.no_progress or args.json))
    history = trainer.fit()
    private_loss, private_acc = evaluate(model, test)
    train_seconds = time.perf_counter() - started

    baseline_acc = None
    if not args.no_baseline:
        base = build_model(args.dataset, arch)
        base.load_state_dict(initial_state)
        train_non_private(
            base,
            torch.optim.SGD(base.parameters(), lr=0.1, momentum=0.9),
            train,
            epochs=max(1, math.ceil(epochs)),
            batch_size=batch,
            seed=init_seed,
        )
        baseline_acc = evaluate(base, test)[1]

    chance = _chance_accuracy(test)
    if chance is not None and private_acc <= chance + 2 * math.sqrt(
        chance * (1 - chance) / max(len(test), 1)
    ):
        from renyi.errors import RenyiWarning

        warnings.warn(
            f"the private model is no better than chance: {100 * private_acc:.2f} % accuracy vs "
            f"{100 * chance:.2f} % for always predicting the most common class; raise --epsilon "
            "or --epochs, or change --batch-size / --lr / --max-grad-norm",
            RenyiWarning,
            stacklevel=2,
        )

    # ε of the run that was trained, by each accountant (the same event, T-fold)
    steps = private.steps
    from renyi.accountants import make_accountant

    event = private.optimizer.event  # the unit charged: one step's, or one epoch's event
    plan = private.extra.get("plan")  # correlated noise: the event is charged once per round

    def charged(t: int) -> int:
        """Charges of ``event`` in the first ``t`` steps (per step, epoch or round)."""
        if plan is not None:
            return min(plan.charges, -(-t // plan.round_length))
        return int(private.sampler.charges(t))

    names = [name for name in accountant_names() if make_accountant(name).supports(event)]
    per_accountant: dict[str, float] = {}
    for name in names:
        per_accountant[name] = spent_epsilon_curve(event, [charged(steps)], args.delta, name)[0]
    curves: dict[str, list[float]] = {}
    grid = sorted({max(1, round(steps * k / 20)) for k in range(1, 21)})
    if args.plot:
        for name in names:
            curves[name] = spent_epsilon_curve(event, [charged(t) for t in grid], args.delta, name)
        _plot(args.plot, grid, curves, args, private)
    noise: dict[str, Any] = {"kind": args.noise}
    if plan is not None:
        noise.update(
            strategy=private.extra["strategy"].to_dict(),
            analysis=plan.analysis,
            partitions=plan.partitions,
            sample_rate_in_partition=plan.sample_rate,
            sampling=plan.sampling,
            chosen_by=None
            if private.extra.get("choice") is None
            else private.extra["choice"].reason,
            sensitivity=plan.sensitivity.value,
            charges=plan.charges,
        )

    summary: dict[str, Any] = {
        "dataset": args.dataset,
        "model": arch,
        "n_train": len(train),
        "n_test": len(test),
        "target_epsilon": args.epsilon,
        "delta": args.delta,
        "accountant": accountant,
        "noise_multiplier": private.noise_multiplier,
        "max_grad_norm": clip,
        "sample_rate": private.sample_rate,
        "expected_batch_size": private.sample_rate * len(train),
        "steps": steps,
        "steps_note": private.steps_note,
        "neighbouring": private.neighbouring,
        "sampling": sampling,
        "accounted_per": "epoch" if hasattr(private.sampler, "steps_per_epoch") else "step",
        "charges": charged(steps),
        "event": event.kind,
        "epsilon": per_accountant.get(accountant, min(per_accountant.values(), default=None)),
        "accuracy": private_acc,
        "noise": noise,
        "epsilon_spent": per_accountant,
        "private_accuracy": private_acc,
        "private_test_loss": private_loss,
        "non_private_accuracy": baseline_acc,
        "chance_accuracy": chance,
        "secure_randomness": args.seed is None,
        "history": history.as_dict(),
        "plot": args.plot,
        "seconds": time.perf_counter() - started,
        "train_seconds": train_seconds,
    }
    if args.json:
        print_json(summary)
        return 0
    rows: list[list[Any]] = [
        ["dataset", f"{args.dataset} ({len(train)} train, {len(test)} test), {arch} model"],
        ["accuracy, private", f"{100 * private_acc:.2f} %"],
        [
            "accuracy, non-private",
            "skipped" if baseline_acc is None else f"{100 * baseline_acc:.2f} %",
        ],
        ["target (epsilon, delta)", f"({args.epsilon:g}, {args.delta:g})"],
        ["noise multiplier sigma", f"{private.noise_multiplier:.4f} (calibrated by {accountant})"],
        ["clipping norm C", f"{clip:g}"],
        ["sample rate q, batch q*n", f"{private.sample_rate:.5f}, {batch}"],
        ["steps", steps],
        [
            "sampling",
            f"{sampling} (charged per {summary['accounted_per']}: {charged(steps)} x {event.kind})",
        ],
        ["neighbouring", private.neighbouring],
    ]
    for name, eps in per_accountant.items():
        rows.append([f"epsilon ({name})", f"{eps:.4f}"])
    rows.append(["randomness", "secure (OS CSPRNG)" if args.seed is None else "SEEDED (insecure)"])
    rows.append(["time", f"{time.perf_counter() - started:.1f} s"])
    if args.plot:
        rows.append(["plot", args.plot])
    print(format_table(["", "value"], rows, title="renyi train: DP-SGD summary"))
    print(f"steps: {private.steps_note}")
    return 0


def _plot(
    path: str,
    grid: list[int],
    curves: dict[str, list[float]],
    args: argparse.Namespace,
    private: Any,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"rdp": "RDP", "zcdp": "zCDP (no amplification)", "pld": "PLD"}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, eps in curves.items():
        finite = [(t, e) for t, e in zip(grid, eps, strict=True) if math.isfinite(e)]
        if finite:
            ax.plot(*zip(*finite, strict=True), marker="o", ms=3, label=labels.get(name, name))
    ax.axhline(args.epsilon, color="grey", ls="--", lw=1, label=f"target ε = {args.epsilon:g}")
    ax.set_yscale("log")
    ax.set_xlabel("DP-SGD step")
    ax.set_ylabel(f"ε at δ = {args.delta:g}")
    ax.set_title(
        f"{args.dataset}: σ = {private.noise_multiplier:.3f}, q = {private.sample_rate:.4f}"
    )
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)


def _chance_accuracy(test: Any) -> float | None:
    """Accuracy of always predicting the test set's most common class (None if unknown)."""
    import torch

    labels = getattr(test, "tensors", (None,))[-1]
    if not isinstance(labels, torch.Tensor) or labels.numel() == 0:
        return None
    return float(torch.bincount(labels.long().flatten()).max()) / labels.numel()
