"""Individual and user-level accounting on digits: accuracy at equal ε, several seeds.

* ``--individual``: standard DP-SGD (RDP-calibrated, ``--epochs``) vs DP-SGD under
  individual Rényi filters with the same planned run (so the same per-record guarantee) and
  up to ``--max-epochs`` for records with budget left. Prints mean accuracy, per-record ε
  percentiles, retired records and wall time.
* ``--user-level``: synthetic users of ``--examples-per-user`` consecutive examples; ULS vs
  ELS at the same user-level ε, and the ε group privacy would claim for the ELS run.

    .venv/bin/python benchmarks/personalized.py --individual --user-level --seeds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from renyi.dpsgd.data import load_digits
from renyi.dpsgd.individual import train_individual
from renyi.dpsgd.privacy import make_private
from renyi.dpsgd.trainer import Trainer, evaluate
from renyi.dpsgd.user_level import group_by_user, make_private_user_level


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))


def individual(args: argparse.Namespace) -> None:
    train, test = load_digits()
    rows = []
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        model = _mlp()
        t = time.perf_counter()
        private = make_private(
            model,
            torch.optim.SGD(model.parameters(), lr=args.lr),
            train,
            loss_fn=nn.CrossEntropyLoss(),
            target_epsilon=args.epsilon,
            delta=1e-5,
            epochs=args.epochs,
            batch_size=args.batch_size,
            max_grad_norm=1.0,
            accountant="rdp",
        )
        Trainer(private, progress=False).fit()
        std_acc, std_time = evaluate(model, test)[1], time.perf_counter() - t
        torch.manual_seed(seed)
        model = _mlp()
        t = time.perf_counter()
        run = train_individual(
            model,
            torch.optim.SGD(model.parameters(), lr=args.lr),
            train,
            loss_fn=nn.CrossEntropyLoss(),
            target_epsilon=args.epsilon,
            delta=1e-5,
            batch_size=args.batch_size,
            epochs=args.epochs,
            max_epochs=args.max_epochs,
            max_grad_norm=1.0,
        )
        ind_acc, ind_time = evaluate(model, test)[1], time.perf_counter() - t
        summ = run.summary(1e-5)
        rows.append((std_acc, ind_acc, summ, run.steps, private.steps, std_time, ind_time))
        print(
            f"seed {seed}: standard {100 * std_acc:.2f} % ({private.steps} steps, "
            f"{std_time:.1f} s); individual {100 * ind_acc:.2f} % ({run.steps} steps, "
            f"{ind_time:.1f} s), ε min/median/p90/max {summ['min']:.2f}/{summ['median']:.2f}/"
            f"{summ['p90']:.2f}/{summ['max']:.2f}, retired {summ['examples_retired']}"
        )
    print(
        f"mean over {args.seeds} seeds at ε = {args.epsilon}: standard "
        f"{100 * statistics.mean(r[0] for r in rows):.2f} %, individual "
        f"{100 * statistics.mean(r[1] for r in rows):.2f} %"
    )


def user_level(args: argparse.Namespace) -> None:
    train, test = load_digits()
    x, y = train.tensors
    k = args.examples_per_user
    data = group_by_user(x, y, torch.arange(len(x)) // k, examples_per_user=k)
    acc: dict[str, list[float]] = {"ULS": [], "ELS": []}
    for seed in range(args.seeds):
        for level, batch in (("ULS", max(1, args.batch_size // k)), ("ELS", args.batch_size)):
            torch.manual_seed(seed)
            model = _mlp()
            run = make_private_user_level(
                level,
                model,
                torch.optim.SGD(model.parameters(), lr=args.lr),
                data,
                target_epsilon=args.user_epsilon,
                delta=1e-5,
                epochs=args.user_epochs,
                batch_size=batch,
                max_grad_norm=1.0,
            )
            run.fit()
            acc[level].append(evaluate(model, test)[1])
            extra = (
                f", group privacy would claim ε = {run.group_privacy_epsilon():.1f}"
                if level == "ELS"
                else ""
            )
            print(
                f"seed {seed} {level}: σ = {run.private.noise_multiplier:.3f}, "
                f"user ε = {run.user_epsilon():.3f}, accuracy {100 * acc[level][-1]:.2f} %" + extra
            )
    print(
        f"users of {k} examples ({data.num_users} users), user-level ε = {args.user_epsilon}: "
        + ", ".join(f"{lv} {100 * statistics.mean(v):.2f} %" for lv, v in acc.items())
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--individual", action="store_true")
    p.add_argument("--user-level", action="store_true")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--epochs", type=float, default=10.0)
    p.add_argument("--max-epochs", type=float, default=30.0)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--examples-per-user", type=int, default=10)
    p.add_argument("--user-epsilon", type=float, default=8.0)
    p.add_argument("--user-epochs", type=float, default=20.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.individual:
        individual(args)
    if args.user_level:
        user_level(args)


if __name__ == "__main__":
    main()
