"""Correlated noise vs DP-SGD on long runs, tuned privately, at equal ε: Fashion-MNIST and text.

For each ε, every method gets the noise multiplier σ at which **the whole private tuning**
(``renyi.tuning.tune``: K ~ geometric with mean ``--trials-mean`` runs on learning rates
drawn from a grid, the best by accuracy on a public validation half of the test split,
Papernot & Steinke 2022, priced by RDP as ``renyi tune`` does) costs ε at δ = 1e-5; then
``--seeds`` seeds of that tuning per method, with common random numbers (the same K and the
same drawn learning rates for every method of a seed). Reported: test accuracy (the other
half of the test split) of the tuned model, mean ± std over seeds.

Methods (``--engine torch``: all through ``make_private_correlated``, i.e. the user path, the
per-example clipped sums from a closed-form engine for softmax regression; ``--engine fast``,
the default: the same plans, samplers' schemes and noise filters in numpy, without the
lattice release — ~10× cheaper on this shared CPU, checked against the torch path):

* ``dpsgd`` (Poisson) and ``dpsgd-bib`` (balls in bins, ``n // B`` batches per epoch);
* ``banded`` (amplified cyclic Poisson) and ``banded-bib`` (cyclic random allocation) with
  the number of bands b ∈ {2, 4, 8, 16} chosen by the rule of
  :func:`renyi.correlated.choice.choose_strategy` at the tuned σ (score: calibrated noise in
  the iterates on the real schedule: momentum 0.9, cosine learning-rate decay);
* ``blt`` (3 buffers) and ``tree``: one random fixed partition per batch (b-min-sep);
* ``auto``: the rule's pick among DP-SGD, banded and BLT (Poisson family): the *default
  choice*; it reuses the runs of the method it picks.

Model: softmax regression on the 784 normalised pixels (7850 parameters) for Fashion-MNIST;
on byte histograms (128 features) of ``load_doc_lines`` for the text task. Momentum 0.9,
cosine decay, clip 1, batch ``--batch``.

    nice -n 10 .venv/bin/python benchmarks/correlated_fashion.py --dataset fashion \\
        --epsilons 1 3 8 --seeds 3 --epochs 30 --batch 512 --out out/fashion.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import torch

LRS = (0.2, 0.5, 1.2)
MOMENTUM = 0.9
DELTA = 1e-5
BANDS = (2, 4, 8, 16)


class SoftmaxEngine:
    """Clipped per-example gradient sums of softmax regression in closed form: the gradient
    of example i is ``(p_i − y_i) ⊗ [x_i, 1]``, of norm ``‖p_i − y_i‖ · √(‖x_i‖² + 1)``."""

    def __init__(self, model: torch.nn.Linear, max_grad_norm: float) -> None:
        self.model = model
        self.c = max_grad_norm

    def clipped_grad_sum(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            logp = torch.log_softmax(x @ self.model.weight.T + self.model.bias, dim=1)
            rows = torch.arange(len(y))
            losses = -logp[rows, y]
            p = logp.exp()
            p[rows, y] -= 1.0
            norms = p.norm(dim=1) * torch.sqrt((x * x).sum(1) + 1.0)
            pc = p * torch.clamp(self.c / (norms + 1e-12), max=1.0)[:, None]
            return {"weight": pc.T @ x, "bias": pc.sum(0)}, losses, norms


def _data(name: str) -> tuple[Any, Any, Any]:
    from torch.utils.data import TensorDataset

    if name == "fashion":
        from renyi.dpsgd.data import load_fashion_mnist

        train, test = load_fashion_mnist()
        flat = lambda d: TensorDataset(  # noqa: E731
            d.tensors[0].reshape(len(d.tensors[0]), -1).contiguous(), d.tensors[1]
        )
        train, test = flat(train), flat(test)
    else:
        from renyi.dpsgd.data import load_doc_lines

        train, test = load_doc_lines(per_class=None)

        def hist(d: Any) -> Any:  # byte histogram, a public featurisation
            tok = d.tensors[0]
            h = torch.zeros(len(tok), 128)
            h.scatter_add_(1, tok, torch.ones_like(tok, dtype=torch.float32))
            h[:, 0] = 0.0
            h = h / h.sum(1, keepdim=True).clamp_min(1.0) * 8.0
            return TensorDataset(h, d.tensors[1])

        train, test = hist(train), hist(test)
    x, y = test.tensors
    half = len(x) // 2
    return train, TensorDataset(x[:half], y[:half]), TensorDataset(x[half:], y[half:])


def _methods(
    eps: float, n: int, batch: int, steps: int, trials_mean: float
) -> dict[str, dict[str, Any]]:
    """Each method's strategy, sampler settings and the σ that makes the tuning cost ε."""
    from renyi.correlated.choice import schedule_error
    from renyi.correlated.optimize import optimize_banded, optimize_blt
    from renyi.correlated.strategies import TreeStrategy, identity
    from renyi.correlated.workload import prefix_coefs

    lr = _cosine(steps)
    work = prefix_coefs(steps, MOMENTUM)
    parts = n // batch
    blt = optimize_blt(
        steps, 3, min_sep=parts, max_participations=-(-steps // parts), workload=work
    )
    specs: dict[str, dict[str, Any]] = {
        "dpsgd": {"noise": "dpsgd", "strategy": identity(), "sampling": "poisson", "parts": 1},
        "dpsgd-bib": {
            "noise": "dpsgd", "strategy": identity(), "sampling": "random-allocation", "parts": 1,
        },
        "blt": {"noise": "blt", "strategy": blt, "sampling": "poisson", "parts": parts},
        "tree": {
            "noise": "tree", "strategy": TreeStrategy(), "sampling": "poisson", "parts": parts,
        },
    }  # fmt: skip
    if steps > 4096:  # the tree's error needs its dense noising matrix
        del specs["tree"]
    for b in BANDS:
        if b * batch <= n:
            s = optimize_banded(steps, b, workload=work)
            for sampling, name in (
                ("poisson", f"banded{b}"),
                ("random-allocation", f"banded{b}-bib"),
            ):
                specs[name] = {"noise": "banded", "strategy": s, "sampling": sampling, "parts": b}
    for spec in specs.values():
        spec["sigma"] = _tuned_sigma(eps, spec, n, batch, steps, trials_mean)
        spec["error"] = schedule_error(
            spec["strategy"], steps, momentum=MOMENTUM, learning_rates=lr
        )
        plan = _plan(spec, n, batch, steps, spec["sigma"])
        spec["plan"] = plan
        spec["score"] = plan.noise_scale * spec["error"]
    return specs


def _plan(spec: dict[str, Any], n: int, batch: int, steps: int, sigma: float) -> Any:
    from renyi.correlated.accounting import correlated_plan

    wide = spec["noise"] in ("blt", "tree")
    if spec["sampling"] == "random-allocation" and not wide:
        m = max(1, n // (spec["parts"] * batch))
        return correlated_plan(
            spec["strategy"], steps, sigma, partitions=spec["parts"],
            sampling="random-allocation", rounds_per_epoch=m,
        )  # fmt: skip
    rate = spec["parts"] * batch / n  # as make_private_correlated (min-sep ignores it)
    return correlated_plan(
        spec["strategy"], steps, sigma, partitions=spec["parts"], sample_rate=rate
    )


def _tuning_epsilon(event: Any, trials_mean: float) -> float:
    from renyi.accountants import RdpAccountant
    from renyi.analysis.events import RepeatAndSelectEvent

    return (
        RdpAccountant()
        .compose(RepeatAndSelectEvent(event, trials_mean, 1.0))
        .epsilon(DELTA)
        .epsilon
    )


def _tuned_sigma(
    eps: float, spec: dict[str, Any], n: int, batch: int, steps: int, trials_mean: float
) -> float:
    from renyi.analysis.events import SelfComposedEvent

    def cost(sigma: float) -> float:
        plan = _plan(spec, n, batch, steps, sigma)
        return _tuning_epsilon(SelfComposedEvent(plan.step_event, plan.charges), trials_mean)

    lo, hi = 0.3, 1.0
    while cost(hi) > eps:
        lo, hi = hi, 2 * hi
    while cost(lo) <= eps:
        hi, lo = lo, lo / 2
    while hi / lo > 1.002:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if cost(mid) > eps else (lo, mid)
    return hi


def _cosine(steps: int) -> np.ndarray:
    t = np.arange(steps)
    return np.maximum(0.5 * (1 + np.cos(np.pi * t / steps)), 1e-3)


def _train_once(
    spec: dict[str, Any], data: Any, lr: float, seed: int, epochs: int, batch: int
) -> tuple[float, float, float]:
    from renyi.dpsgd.correlated import make_private_correlated
    from renyi.dpsgd.trainer import evaluate

    train, val, test = data
    torch.manual_seed(seed)
    model = torch.nn.Linear(train.tensors[0].shape[1], int(train.tensors[1].max()) + 1)
    sgd = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    private = make_private_correlated(
        model, sgd, train, loss_fn=torch.nn.CrossEntropyLoss(), delta=DELTA,
        batch_size=batch, max_grad_norm=1.0, noise=spec["noise"], strategy=spec["strategy"],
        noise_multiplier=spec["sigma"], epochs=epochs, sampling=spec["sampling"], seed=seed,
        engine=SoftmaxEngine(model, 1.0),
    )  # fmt: skip
    opt, steps = private.optimizer, private.steps
    if private.extra["plan"].to_dict() != spec["plan"].to_dict():
        raise RuntimeError(f"plan mismatch: {private.extra['plan']} vs {spec['plan']}")
    decay = _cosine(steps)
    sched = torch.optim.lr_scheduler.LambdaLR(sgd, lambda t: float(decay[min(t, steps - 1)]))
    while opt.steps_taken < steps:
        for x, y in private.data_loader:
            opt.zero_grad()
            opt.accumulate(x, y)
            opt.step()
            sched.step()
            if opt.steps_taken >= steps:
                break
    return evaluate(model, val)[1], evaluate(model, test)[1], float(private.epsilon().epsilon)


def _train_fast(
    spec: dict[str, Any], data: Any, lr: float, seed: int, epochs: int, batch: int
) -> tuple[float, float, float]:
    """The same training as :func:`_train_once` in numpy (``--engine fast``): the same plan
    (σ, sensitivity, partitions, rounds), the same sampling *scheme* (cyclic Poisson / cyclic
    random allocation, drawn by a seeded numpy Generator), renyi's streaming noise filter,
    SGD with momentum and cosine decay; the noise is NOT released on renyi.noise's lattice
    (raw float64 normals): an experiment path, about 10× faster, never a private release."""
    from renyi.correlated.streaming import streaming_noise

    train, val, test = data
    x = np.concatenate([train.tensors[0].numpy(), np.ones((len(train), 1), np.float32)], 1)
    y = train.tensors[1].numpy()
    n, d = x.shape
    classes = int(y.max()) + 1
    plan = spec["plan"]
    steps = plan.steps
    rng = np.random.default_rng(seed)
    b = plan.partitions
    part = rng.integers(0, b, size=n) if b > 1 else np.zeros(n, dtype=np.int64)
    members = [np.flatnonzero(part == i) for i in range(b)]
    xnorm = np.sqrt((x.astype(np.float64) ** 2).sum(1)).astype(np.float32)
    w = np.zeros((d, classes), dtype=np.float32)
    buf = np.zeros((d, classes))
    noise = streaming_noise(spec["strategy"])
    std = plan.noise_scale  # σ · sens, clip 1
    allocation = plan.sampling == "random-allocation"
    m = plan.rounds_per_epoch
    divisor = (n / (m * b)) if allocation else plan.sample_rate * n / b
    decay = _cosine(steps)
    epoch_batches: list[np.ndarray] = []
    for t in range(steps):
        if allocation:
            j = t % (m * b)
            if j == 0:
                slot = rng.integers(0, m, size=n) * b + part
                order = np.argsort(slot, kind="stable")
                epoch_batches = np.split(order, np.cumsum(np.bincount(slot, minlength=m * b))[:-1])
            idx = epoch_batches[j]
        else:
            pool = members[t % b]
            idx = pool[rng.random(pool.size) < plan.sample_rate]
        xb = x[idx]  # float32 arithmetic for the gradient (an experiment path)
        logits = xb @ w
        logits -= logits.max(1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(1, keepdims=True)
        p[np.arange(idx.size), y[idx]] -= 1.0
        norms = np.sqrt((p * p).sum(1)) * xnorm[idx]
        p *= np.minimum(1.0, 1.0 / np.maximum(norms, 1e-12))[:, None]
        g = (xb.T @ p).astype(np.float64)
        g += std * noise.next(rng.standard_normal(d * classes)).reshape(d, classes)
        g /= divisor
        buf *= MOMENTUM
        buf += g
        w -= (lr * decay[t] * buf).astype(np.float32)

    def acc(ds: Any) -> float:
        xs = ds.tensors[0].numpy().astype(np.float64)
        pred = (xs @ w[:-1] + w[-1]).argmax(1)
        return float((pred == ds.tensors[1].numpy()).mean())

    return acc(val), acc(test), math.nan


def crossover(n: int, batch: int, epochs_list: list[int], epsilons: list[float]) -> None:
    """Best banded score / DP-SGD's (calibrated noise in the iterates, one run, RDP) against
    the run length: where correlation can pay (docs/correlated.md)."""
    from renyi.correlated.choice import choose_strategy

    for eps in epsilons:
        for epochs in epochs_list:
            steps = epochs * (n // batch)
            c = choose_strategy(
                eps, DELTA, steps, n, batch, kinds=("dpsgd", "banded"), bands=(2, 4, 8, 16, 32),
                momentum=MOMENTUM, learning_rates=_cosine(steps), accountant="rdp",
            )  # fmt: skip
            best = min((x for x in c.candidates if x.noise == "banded"), key=lambda x: x.score)
            print(json.dumps({
                "epsilon": eps, "epochs": epochs, "steps": steps, "dpsgd": c.dpsgd.score,
                "best_banded": best.score, "bands": best.plan.partitions,
                "ratio": best.score / c.dpsgd.score, "pick": c.best.noise,
            }), flush=True)  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", choices=("fashion", "text"), default="fashion")
    p.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--trials-mean", type=float, default=2.0)
    p.add_argument("--methods", nargs="+", help="run only these (default: all)")
    p.add_argument("--out", help="append one JSON line per (epsilon, seed, method)")
    p.add_argument("--plan-only", action="store_true", help="print σ and scores, no training")
    p.add_argument(
        "--engine", choices=("fast", "torch"), default="fast",
        help="fast: numpy training on the same plans (no lattice release); torch: the user "
        "path, make_private_correlated (about 10x slower)",
    )  # fmt: skip
    p.add_argument("--crossover", type=int, nargs="*", help="epochs: the score ratio only")
    p.add_argument("--table", help="print the markdown table of an --out file and exit")
    args = p.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    if args.crossover:
        crossover(60_000, args.batch, args.crossover, args.epsilons)
        return 0
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from renyi.calibration import epochs_to_steps
    from renyi.tuning import tune

    data = _data(args.dataset)
    n = len(data[0])
    steps, _ = epochs_to_steps(args.epochs, n, args.batch)
    print(f"{args.dataset}: n={n}, batch={args.batch}, epochs={args.epochs}, T={steps}", flush=True)
    for eps in args.epsilons:
        t0 = time.process_time()
        specs = _methods(eps, n, args.batch, steps, args.trials_mean)
        alias: dict[str, str] = {}
        # the rule (choose_strategy's) at the tuned σ: best banded by score, then the margin
        for family, suffix in (("poisson", ""), ("random-allocation", "-bib")):
            names = [
                k for k in specs if k.startswith("banded") and k.endswith("-bib") == bool(suffix)
            ]
            best = min(names, key=lambda k: specs[k]["score"])
            base = "dpsgd" + suffix
            pool = [base, best] + (["blt"] if family == "poisson" else [])
            pick = min(pool, key=lambda k: specs[k]["score"])
            if pick != base and specs[pick]["score"] > 0.9 * specs[base]["score"]:
                pick = base
            alias["banded" + suffix] = best
            alias["auto" + suffix] = pick
        summary = {
            k: {"sigma": v["sigma"], "score": v["score"], "error": v["error"],
                "analysis": v["plan"].analysis, "partitions": v["plan"].partitions}
            for k, v in specs.items()
        }  # fmt: skip
        summary["alias"] = alias  # type: ignore[assignment]
        print(json.dumps({"epsilon": eps, "plans": summary, "cpu_s": time.process_time() - t0}),
              flush=True)  # fmt: skip
        if args.plan_only:
            continue
        run = ["dpsgd", "dpsgd-bib", "banded", "banded-bib", "blt", "tree"]
        if args.methods:
            run = [m for m in run if m in args.methods]
        for seed in range(args.seeds):
            for method in run:
                spec = specs[alias.get(method, method)]
                started = time.process_time()
                counter = iter(range(10_000))
                trainer = _train_fast if args.engine == "fast" else _train_once
                result = tune(
                    lambda cfg, s=spec, seed=seed, counter=counter, trainer=trainer: trainer(
                        s, data, cfg["lr"], 1000 * seed + next(counter), args.epochs, args.batch
                    ),
                    [{"lr": lr} for lr in LRS],
                    trial_event=_run_event(spec),
                    mean_trials=args.trials_mean,
                    rng=np.random.default_rng(seed),
                )
                best = result.best
                row = {
                    "dataset": args.dataset, "epsilon": eps, "seed": seed, "method": method,
                    "label": alias.get(method, method), "auto": alias["auto"],
                    "auto_bib": alias["auto-bib"],
                    "sigma": spec["sigma"], "runs": result.runs,
                    "tuning_epsilon": result.epsilon(DELTA),
                    "lr": None if best is None else best.config["lr"],
                    "val": None if best is None else best.score,
                    "test": None if best is None else best.output,
                    "cpu_s": time.process_time() - started, "engine": args.engine,
                    "epochs": args.epochs, "batch": args.batch,
                }  # fmt: skip
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as fh:
                        fh.write(json.dumps(row) + "\n")
    return 0


def _run_event(spec: dict[str, Any]) -> Any:
    from renyi.analysis.events import SelfComposedEvent

    return SelfComposedEvent(spec["plan"].step_event, spec["plan"].charges)


def table(path: str) -> str:
    """The markdown table of docs/correlated.md and the README from ``--out`` lines."""
    rows = [json.loads(line) for line in open(path)]
    order = ["dpsgd", "dpsgd-bib", "banded", "banded-bib", "blt", "tree"]
    out = ["| ε | " + " | ".join(order) + " | default (`auto`) |", "|---:" * 8 + "|"]
    for eps in sorted({r["epsilon"] for r in rows}):
        cells = []
        by = {m: [r for r in rows if r["epsilon"] == eps and r["method"] == m] for m in order}
        for m in order:
            acc = [100 * r["test"] for r in by[m] if r["test"] is not None]
            if not acc:
                cells.append("—")
                continue
            sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
            tag = f" ({by[m][0]['label'].replace('banded', 'b=').replace('-bib', '')})" if (
                m.startswith("banded")) else ""  # fmt: skip
            cells.append(f"{statistics.mean(acc):.2f} ± {sd:.2f}{tag}")
        pick = by["dpsgd"][0]["auto"] if by["dpsgd"] else None
        auto = "—"
        if pick is not None:
            src = "banded" if pick.startswith("banded") else pick
            auto = f"{pick} = {cells[order.index(src)].split(' (')[0]}"
        out.append(f"| {eps:g} | " + " | ".join(cells) + f" | {auto} |")
    return "\n".join(out)


def summarise(path: str) -> list[dict[str, Any]]:
    """mean ± std of test accuracy per (dataset, epsilon, method) from ``--out`` lines."""
    rows = [json.loads(line) for line in open(path)]
    groups: dict[tuple[str, float, str], list[float]] = {}
    for r in rows:
        if r["test"] is not None:
            groups.setdefault((r["dataset"], r["epsilon"], r["method"]), []).append(r["test"])
    return [
        {"dataset": d, "epsilon": e, "method": m, "mean": statistics.mean(v),
         "std": statistics.stdev(v) if len(v) > 1 else 0.0, "seeds": len(v)}
        for (d, e, m), v in sorted(groups.items())
    ]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
