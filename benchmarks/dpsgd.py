"""DP-SGD benchmark: renyi against Opacus in the same run (interleaved, medians).

Two parts, both with ``torch.set_num_threads(1)``:

1. **Throughput and memory** (``--throughput``): the Opacus MNIST-example CNN (26k
   parameters, 1×28×28 inputs, batch 256) and an MLP 100-512-512-2 (315k parameters, batch
   512), one training step repeated on a fixed random batch. Configurations: non-private
   SGD, renyi (``DPOptimizer``, clipping engine ``mode="auto"`` = ghost where possible,
   secure noise), renyi with ``mode="vmap"``, Opacus hooks, Opacus ghost clipping. Every
   measurement runs in a fresh subprocess (so peak RSS is that configuration's own),
   configurations are interleaved round by round. Each subprocess times its steps one by one
   (after 3 warm-up steps) and reports the median step time (and the mean and the best) and
   its peak RSS; then it times its steps alternating (two by two, the second timed) with
   those of a non-private twin of the model in the same process: the ratio to non-private
   time (``×time``) is the median of those step-by-step ratios (each pair sees the same load
   of a shared machine), median over rounds. The ratios of separate processes' median (and,
   as earlier versions, mean) step times and of the fastest steps are reported too. Every
   subprocess first imports the same libraries (torch, opacus, renyi with its accountant and
   scipy, cryptography), whatever it measures, so that peak RSS differences are the training
   step's; the subprocesses are started before this process imports torch (Linux carries
   peak RSS across ``exec``), as in benchmarks/dpsgd_engine.py.
2. **Accuracy at equal ε** (``--accuracy``): each library calibrates σ to the same (ε, δ)
   with its own accountant and trains the same model with the same optimizer, epochs and
   expected batch size; mean test accuracy over ``--seeds`` seeds. On scikit-learn's digits
   (softmax regression, 15 epochs, batch 64, δ = 1e-5) and, when the files are found,
   Fashion-MNIST (tanh CNN, 5 epochs, batch 256, δ = 5.55e-6).

The CPU state (load average, CPU model, a single-thread matmul rate before and after) is
printed with the results: on shared machines compare numbers only inside one run.

    .venv/bin/python benchmarks/dpsgd.py --throughput --accuracy [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any

CONFIGS = ("non-private", "renyi", "renyi-vmap", "opacus-hooks", "opacus-ghost")
# Whole-model vmap materialises batch × parameters floats: 512 × 315k = 0.6 GB per step on
# the MLP and ~100 s per run here, so it is measured on the CNN only unless --all-configs.
SKIP = {("mlp", "renyi-vmap")}
MODELS = {"cnn": 256, "mlp": 512}
# Each child times every step separately and reports the median (robust to the other
# processes of a shared machine taking the CPU for a few ms, which the mean of a handful of
# 11 ms MLP steps is not), the mean and the best; it stops after MAX_TIMED_SECONDS once
# MIN_STEPS are timed.
WARMUP_STEPS = 3
MIN_STEPS = 3
MAX_TIMED_SECONDS = 5.0


# ---------------------------------------------------------------------------- models
def build(model: str) -> Any:
    from torch import nn

    if model == "cnn":  # Opacus examples/mnist.py SampleConvNet (26,010 parameters)
        from renyi.cli.train import build_model

        return build_model("fashion-mnist", "cnn")
    if model == "mlp":  # 100-512-512-2 (315,394 parameters)
        return nn.Sequential(
            nn.Linear(100, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2)
        )
    if model == "linear64":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    raise ValueError(model)


def batch_for(model: str, size: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    if model == "cnn":
        return torch.randn(size, 1, 28, 28, generator=g), torch.randint(0, 10, (size,), generator=g)
    return torch.randn(size, 100, generator=g), torch.randint(0, 2, (size,), generator=g)


# ---------------------------------------------------------------------------- one child run
def import_all() -> float:
    """Import every library any configuration uses; return the peak RSS (MiB) afterwards.

    Run first in every child, whatever its configuration, so that peak RSS differences are
    those of the training step, not of which libraries a configuration happens to import:
    torch, opacus, renyi's DP optimizer with its sampler and RDP accountant (scipy), and the
    secure noise source (``cryptography``'s ChaCha20).
    """
    import opacus  # noqa: F401
    import scipy.special  # noqa: F401
    import torch
    from opacus import PrivacyEngine  # noqa: F401
    from torch.utils.data import DataLoader, TensorDataset  # noqa: F401

    import renyi.accountants.rdp
    import renyi.dpsgd
    import renyi.random  # noqa: F401
    from renyi.dpsgd.optimizer import DPOptimizer  # noqa: F401
    from renyi.dpsgd.sampler import PoissonSampler  # noqa: F401

    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms  # noqa: F401
    except ImportError:  # renyi.random then uses os.urandom alone, in every configuration
        pass
    torch.set_num_threads(1)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(model_name: str, config: str, steps: int) -> dict[str, Any]:
    rss_imports = import_all()
    modules_after_imports = {m.split(".")[0] for m in sys.modules}
    import torch
    from torch import nn

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    size = MODELS[model_name]
    model = build(model_name)
    x, y = batch_for(model_name, size)
    criterion = nn.CrossEntropyLoss()
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    if config == "non-private":

        def step() -> None:
            sgd.zero_grad()
            criterion(model(x), y).backward()
            sgd.step()

    elif config.startswith("renyi"):
        from renyi.dpsgd.optimizer import DPOptimizer
        from renyi.dpsgd.sampler import PoissonSampler

        sampler = PoissonSampler(size * 100, 0.01, 10**6)  # q n = size; secure source
        opt = DPOptimizer(
            sgd,
            model=model,
            loss_fn=criterion,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            sampler=sampler,
            accountant="rdp",
            grad_mode="vmap" if config == "renyi-vmap" else "auto",
        )

        def step() -> None:
            opt.zero_grad()
            opt.accumulate(x, y)
            opt.step()

    else:
        from opacus import PrivacyEngine
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(x, y), batch_size=size)
        engine = PrivacyEngine()
        mode = "ghost" if config == "opacus-ghost" else "hooks"
        out = engine.make_private(
            module=model,
            optimizer=sgd,
            criterion=criterion,
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            poisson_sampling=False,
            grad_sample_mode=mode,
        )
        if mode == "ghost":
            pmodel, popt, pcrit, _ = out
        else:
            pmodel, popt, _ = out
            pcrit = criterion

        def step() -> None:
            popt.zero_grad()
            pcrit(pmodel(x), y).backward()
            popt.step()

    # Phase 1: this configuration alone (its time per step and its peak RSS).
    for _ in range(WARMUP_STEPS):
        step()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < steps:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if len(times) >= MIN_STEPS and time.perf_counter() - start > MAX_TIMED_SECONDS:
            break  # Opacus hooks on the MLP take ~1 s a step
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # Phase 2 (after the RSS is read): steps alternating with those of a non-private twin
    # (same model, own SGD) in this process, two at a time, the second one timed; the ratio
    # of each adjacent pair sees the same machine load, unlike two processes measured
    # seconds apart.
    torch.manual_seed(0)
    twin = build(model_name)
    twin_sgd = torch.optim.SGD(twin.parameters(), lr=0.01)

    def twin_step() -> None:
        twin_sgd.zero_grad()
        criterion(twin(x), y).backward()
        twin_sgd.step()

    for _ in range(WARMUP_STEPS):
        twin_step()
    ratios: list[float] = []
    twin_times: list[float] = []
    start = time.perf_counter()
    while len(ratios) < steps:
        pair = []
        # alternate which of the two goes first; each runs one untimed step first, so that
        # the timed one finds its own data in the caches (the previous step was the other's)
        for f in (twin_step, step) if len(ratios) % 2 == 0 else (step, twin_step):
            f()
            t0 = time.perf_counter()
            f()
            pair.append((f is step, time.perf_counter() - t0))
        mine = next(t for is_mine, t in pair if is_mine)
        theirs = next(t for is_mine, t in pair if not is_mine)
        ratios.append(mine / theirs)
        twin_times.append(theirs)
        if len(ratios) >= MIN_STEPS and time.perf_counter() - start > MAX_TIMED_SECONDS:
            break
    median_ms = 1000 * statistics.median(times)
    return {
        "samples_per_s": size / median_ms * 1000,
        "step_ms": median_ms,
        "step_ms_mean": 1000 * sum(times) / len(times),
        "step_ms_best": 1000 * min(times),
        "steps_timed": len(times),
        "paired_ratio": statistics.median(ratios),
        "paired_twin_step_ms": 1000 * statistics.median(twin_times),
        "pairs_timed": len(ratios),
        "peak_rss_mb": peak_rss,
        "rss_before_steps_mb": rss_before,
        "rss_after_imports_mb": rss_imports,
        "modules_imported_by_step": sorted(
            {m.split(".")[0] for m in sys.modules} - modules_after_imports
        ),
    }


def run_child(model: str, config: str, steps: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", model, config, str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def cpu_state_subprocess() -> dict[str, Any]:
    """``cpu_state()`` in a fresh process, so that this one has not imported torch yet.

    Linux carries a process's peak RSS across ``exec`` (``ru_maxrss`` of a child started
    from a large parent starts at the parent's size), so the measurement children must be
    started while this process is small, as in benchmarks/dpsgd_engine.py.
    """
    cmd = [sys.executable, __file__, "--cpu-state"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------------------- CPU state
def cpu_state() -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    start = time.perf_counter()
    for _ in range(50):
        a @ a
    gflops = 50 * 2 * 256**3 / (time.perf_counter() - start) / 1e9
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if "model name" in ln), "")
    except OSError:
        pass
    return {
        "loadavg": os.getloadavg(),
        "cpus": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "matmul_gflops_1thread": gflops,
        "torch": torch.__version__,
    }


# ---------------------------------------------------------------------------- accuracy
def _accuracy_renyi(model: Any, train: Any, test: Any, spec: dict[str, Any], seed: int) -> float:
    import torch

    from renyi.dpsgd.privacy import make_private
    from renyi.dpsgd.trainer import Trainer, evaluate

    private = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=spec["lr"]),
        train,
        loss_fn=torch.nn.CrossEntropyLoss(),
        target_epsilon=spec["epsilon"],
        delta=spec["delta"],
        epochs=spec["epochs"],
        batch_size=spec["batch"],
        max_grad_norm=spec["clip"],
        accountant=spec["accountant"],
        seed=seed,
    )
    Trainer(private, progress=False).fit()
    spec["renyi_sigma"] = private.noise_multiplier
    return evaluate(model, test)[1]


def _accuracy_opacus(model: Any, train: Any, test: Any, spec: dict[str, Any], seed: int) -> float:
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    from renyi.dpsgd.trainer import evaluate

    engine = PrivacyEngine()
    gen = torch.Generator().manual_seed(seed)
    pmodel, popt, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=spec["lr"]),
        data_loader=DataLoader(train, batch_size=spec["batch"], generator=gen),
        target_epsilon=spec["epsilon"],
        target_delta=spec["delta"],
        epochs=spec["epochs"],
        max_grad_norm=spec["clip"],
        noise_generator=gen,
    )
    spec["opacus_sigma"] = popt.noise_multiplier
    criterion = torch.nn.CrossEntropyLoss()
    for _ in range(spec["epochs"]):
        for x, y in loader:
            if len(y) == 0:
                continue
            popt.zero_grad()
            criterion(pmodel(x), y).backward()
            popt.step()
    return evaluate(model, test)[1]


def accuracy(
    datasets: list[str],
    seeds: int,
    fashion_dir: str | None,
    accountant: str,
    epsilons: tuple[float, ...] = (1.0, 3.0, 8.0),
) -> list[dict[str, Any]]:
    import torch

    from renyi.dpsgd.data import DatasetNotFoundError, load_digits, load_fashion_mnist

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    rows = []
    for name in datasets:
        if name == "digits":
            train, test = load_digits()
            base = {"model": "linear64", "epochs": 15, "batch": 64, "lr": 2.0, "clip": 1.0}
            base["delta"] = 1e-5
        else:
            try:
                train, test = load_fashion_mnist(fashion_dir)
            except DatasetNotFoundError as exc:
                print(f"skipping Fashion-MNIST: {exc}", file=sys.stderr)
                continue
            base = {"model": "cnn", "epochs": 5, "batch": 256, "lr": 2.0, "clip": 1.0}
            base["delta"] = 5.55e-6
        for eps in epsilons:
            spec: dict[str, Any] = {**base, "dataset": name, "epsilon": eps}
            spec["accountant"] = accountant
            accs: dict[str, list[float]] = {"renyi": [], "opacus": []}
            for seed in range(seeds):
                for lib, fn in (("renyi", _accuracy_renyi), ("opacus", _accuracy_opacus)):
                    torch.manual_seed(seed)
                    model = build(spec["model"])
                    accs[lib].append(fn(model, train, test, spec, seed))
            spec["renyi_accuracy"] = statistics.mean(accs["renyi"])
            spec["opacus_accuracy"] = statistics.mean(accs["opacus"])
            spec["renyi_runs"], spec["opacus_runs"] = accs["renyi"], accs["opacus"]
            rows.append(spec)
            print(
                f"{name} eps={eps:g}: renyi {100 * spec['renyi_accuracy']:.2f}% "
                f"(sigma {spec['renyi_sigma']:.3f}, {spec['accountant']}), opacus "
                f"{100 * spec['opacus_accuracy']:.2f}% (sigma {spec['opacus_sigma']:.3f}, prv)",
                file=sys.stderr,
            )
    return rows


# ---------------------------------------------------------------------------- main
def _median_ratio(runs: list[dict[str, Any]], base: list[dict[str, Any]], key: str) -> float:
    """Median over rounds of (this configuration / non-private of the same round)."""
    return statistics.median(r[key] / b[key] for r, b in zip(runs, base, strict=True))


def throughput(rounds: int, steps: dict[str, int], skip: set[Any]) -> list[dict[str, Any]]:
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(rounds):
        for model in MODELS:
            for config in CONFIGS:
                if (model, config) in skip:
                    continue
                res = run_child(model, config, steps[model])
                results.setdefault((model, config), []).append(res)
                extra = ",".join(res["modules_imported_by_step"])
                print(
                    f"round {r + 1}/{rounds} {model:4s} {config:13s} "
                    f"{res['samples_per_s']:9.0f} samples/s  {res['peak_rss_mb']:7.0f} MB "
                    f"(imports {res['rss_after_imports_mb']:.0f} MB; step imported: "
                    f"{extra or '-'})",
                    file=sys.stderr,
                )
    rows = []
    for model in MODELS:
        base_runs = results[(model, "non-private")]
        base_rss = statistics.median(x["peak_rss_mb"] for x in base_runs)
        for config in CONFIGS:
            if (model, config) not in results:
                continue
            runs = results[(model, config)]
            step_ms = statistics.median(x["step_ms"] for x in runs)
            rss = statistics.median(x["peak_rss_mb"] for x in runs)
            rss_imports = statistics.median(x["rss_after_imports_mb"] for x in runs)

            rows.append(
                {
                    "model": model,
                    "batch": MODELS[model],
                    "config": config,
                    "samples_per_s": MODELS[model] / step_ms * 1000,
                    "step_ms": step_ms,
                    "time_ratio_vs_non_private": statistics.median(x["paired_ratio"] for x in runs),
                    "time_ratio_separate": _median_ratio(runs, base_runs, "step_ms"),
                    "time_ratio_of_means": _median_ratio(runs, base_runs, "step_ms_mean"),
                    "best_step_ms": min(x["step_ms_best"] for x in runs),
                    "best_ratio": min(x["step_ms_best"] for x in runs)
                    / min(x["step_ms_best"] for x in base_runs),
                    "peak_rss_mb": rss,
                    "rss_ratio_vs_non_private": rss / base_rss,
                    "rss_after_imports_mb": rss_imports,
                    "step_rss_mb": rss - rss_imports,
                    "rounds": len(runs),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=3, metavar=("MODEL", "CONFIG", "STEPS"), help=argparse.SUPPRESS)
    p.add_argument("--cpu-state", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--throughput", action="store_true")
    p.add_argument("--accuracy", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cnn-steps", type=int, default=30)
    p.add_argument("--mlp-steps", type=int, default=40)
    p.add_argument("--all-configs", action="store_true", help="include vmap on the MLP")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--datasets", default="digits,fashion-mnist")
    p.add_argument("--fashion-dir")
    p.add_argument("--epsilons", default="1,3,8", help="target epsilons, comma-separated")
    p.add_argument("--accountant", default="pld", help="renyi's calibration accountant")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], int(args.child[2]))))
        return 0
    if args.cpu_state:
        print(json.dumps(cpu_state()))
        return 0
    if not (args.throughput or args.accuracy):
        args.throughput = args.accuracy = True
    # measured in a subprocess: this process must not import torch before the throughput
    # children are started (see cpu_state_subprocess)
    report: dict[str, Any] = {"cpu_before": cpu_state_subprocess()}
    if args.throughput:
        steps = {"cnn": args.cnn_steps, "mlp": args.mlp_steps}
        report["throughput"] = throughput(args.rounds, steps, set() if args.all_configs else SKIP)
        if not args.json:  # print as soon as it is known: the accuracy part is long
            _print_report({"throughput": report["throughput"]})
    if args.accuracy:
        report["accuracy"] = accuracy(
            args.datasets.split(","),
            args.seeds,
            args.fashion_dir,
            args.accountant,
            tuple(float(e) for e in args.epsilons.split(",")),
        )
    report["cpu_after"] = cpu_state()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_report({k: v for k, v in report.items() if k != "throughput"})
    return 0


def _print_report(report: dict[str, Any]) -> None:
    from renyi.cli._output import format_table

    for key in ("cpu_before", "cpu_after"):
        if key not in report:
            continue
        c = report[key]
        print(
            f"{key}: load {c['loadavg'][0]:.2f}, {c['cpus']} cpus ({c['cpu_model']}), "
            f"1-thread matmul {c['matmul_gflops_1thread']:.1f} GFLOP/s, torch {c['torch']}"
        )
    if "throughput" in report:
        rows = [
            [
                r["model"],
                r["batch"],
                r["config"],
                round(r["samples_per_s"]),
                round(r["step_ms"], 1),
                round(r["time_ratio_vs_non_private"], 2),
                round(r["time_ratio_separate"], 2),
                round(r["time_ratio_of_means"], 2),
                round(r["best_ratio"], 2),
                round(r["peak_rss_mb"]),
                round(r["rss_ratio_vs_non_private"], 2),
                round(r["step_rss_mb"]),
            ]
            for r in report["throughput"]
        ]
        print(
            format_table(
                [
                    "model",
                    "batch",
                    "config",
                    "samples/s",
                    "ms/step",
                    "×time",
                    "×sep",
                    "×sep means",
                    "×best",
                    "peak MB",
                    "×RSS",
                    "step MB",
                ],
                rows,
                title=(
                    "Throughput (torch threads = 1, medians over interleaved rounds). ×time: "
                    "median of step-by-step ratios to a non-private twin in the same process; "
                    "×sep: ratio of median step times of separate processes (×sep means: of "
                    "mean step times, as earlier versions); ×best: fastest step / fastest "
                    "non-private step"
                ),
            )
        )
        imports = {r["model"]: r["rss_after_imports_mb"] for r in report["throughput"]}
        print(
            "peak RSS after the imports alone (torch, opacus, renyi, scipy, cryptography; "
            "step MB = peak - this): " + ", ".join(f"{m} {v:.0f} MB" for m, v in imports.items())
        )
    if report.get("accuracy"):
        rows = [
            [
                r["dataset"],
                r["epsilon"],
                r["delta"],
                f"{100 * r['renyi_accuracy']:.2f}",
                f"{r['renyi_sigma']:.3f} ({r['accountant']})",
                f"{100 * r['opacus_accuracy']:.2f}",
                f"{r['opacus_sigma']:.3f} (prv)",
            ]
            for r in report["accuracy"]
        ]
        print(
            format_table(
                ["dataset", "ε", "δ", "renyi %", "renyi σ", "opacus %", "opacus σ"],
                rows,
                title="Accuracy at equal ε (mean over seeds)",
            )
        )


if __name__ == "__main__":
    sys.exit(main())
