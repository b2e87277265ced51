"""``renyi train --accounting individual`` and ``renyi train --user-level ELS|ULS``.

Not a command of its own: :mod:`renyi.cli.train` hands these runs over here.

* ``--accounting individual``: DP-SGD under per-record Rényi filters
  (:func:`renyi.dpsgd.individual.train_individual`); the JSON adds
  ``individual_epsilon: {min, median, p90, max}`` and ``examples_retired``.
* ``--user-level ELS|ULS --examples-per-user K``: synthetic users of K consecutive examples
  each (``examples_per_user`` of the training set's order), trained with a user-level
  guarantee (:mod:`renyi.dpsgd.user_level`); the JSON adds ``user_level``,
  ``examples_per_user`` and, for ELS, ``group_privacy_epsilon`` (what group privacy would
  claim for the same run).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from renyi.cli._output import format_table, print_json

__all__ = ["run_personalized"]


def run_personalized(args: argparse.Namespace) -> int:
    """Run ``renyi train`` with individual or user-level accounting."""
    import torch

    from renyi._validation import check_int, fail
    from renyi.cli._training import DEFAULTS, build_model, load_data
    from renyi.dpsgd.trainer import evaluate

    started = time.perf_counter()
    if args.accounting == "individual" and args.user_level is not None:
        raise fail("--accounting", "individual", "standard with --user-level")
    if args.noise != "dpsgd" or args.sampling != "poisson":
        raise fail("--noise/--sampling", f"{args.noise}/{args.sampling}", "dpsgd/poisson here")
    arch, epochs, batch, lr, clip, momentum = DEFAULTS[args.dataset]
    arch = args.model or arch
    epochs = args.epochs if args.epochs is not None else epochs
    batch = args.batch_size if args.batch_size is not None else batch
    lr = args.lr if args.lr is not None else lr
    clip = args.max_grad_norm if args.max_grad_norm is not None else clip
    torch.set_num_threads(check_int("--threads", args.threads, minimum=1))
    train, test = load_data(args)
    torch.manual_seed(0 if args.seed is None else args.seed)  # initialisation only
    model = build_model(args.dataset, arch)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    summary: dict[str, Any] = {
        "dataset": args.dataset,
        "model": arch,
        "target_epsilon": args.epsilon,
        "delta": args.delta,
        "accountant": "rdp",
    }
    if args.accounting == "individual":
        from renyi.dpsgd.individual import train_individual

        result = train_individual(
            model,
            optimizer,
            train,
            loss_fn=torch.nn.CrossEntropyLoss(),
            target_epsilon=args.epsilon,
            delta=args.delta,
            batch_size=batch,
            epochs=epochs,
            max_grad_norm=clip,
            progress=not (args.no_progress or args.json),
        )
        ind = result.summary(args.delta)
        summary.update(
            accounting="individual",
            epsilon=ind["max"],
            noise_multiplier=result.noise_multiplier,
            sample_rate=result.sample_rate,
            planned_steps=result.planned_steps,
            steps=result.steps,
            individual_epsilon={k: ind[k] for k in ("min", "median", "p90", "max")},
            examples_retired=ind["examples_retired"],
        )
    else:
        from renyi.dpsgd.user_level import group_by_user, make_private_user_level

        k = check_int("--examples-per-user", args.examples_per_user or 0, minimum=1)
        x, y = train.tensors
        data = group_by_user(x, y, torch.arange(len(x)) // k, examples_per_user=k)
        level = args.user_level
        if level == "ULS":  # batch counts users
            batch = max(1, batch // k)
        run = make_private_user_level(
            level,
            model,
            optimizer,
            data,
            target_epsilon=args.epsilon,
            delta=args.delta,
            epochs=epochs,
            batch_size=batch,
            max_grad_norm=clip,
        )
        run.fit()
        summary.update(
            accounting="user-level",
            user_level=level,
            examples_per_user=k,
            users=data.num_users,
            epsilon=run.user_epsilon(),
            noise_multiplier=run.private.noise_multiplier,
            sample_rate=run.private.sample_rate,
            steps=run.steps,
        )
        if level == "ELS":
            summary["group_privacy_epsilon"] = run.group_privacy_epsilon()
    summary["accuracy"] = evaluate(model, test)[1]
    summary["seconds"] = time.perf_counter() - started
    if args.json:
        print_json(summary)
        return 0
    rows = [[key, value] for key, value in summary.items()]
    print(format_table(["", "value"], rows, title="renyi train: personalized accounting"))
    return 0
