"""How close honest training comes to the independence check's round-off bound (issue 29).

Runs the paths users run — ``renyi train`` (Fashion-MNIST CNN), the LSTM and LoRA-transformer
examples, and a bfloat16-autocast ``PrivacyEngine`` loop — with a spy on the check, and
prints, per run: the checks that ran, how many exceeded the float32 bound and were recomputed
in float64, the largest ratio difference / bound (first stage, and after float64), and the
largest ``difference / (u S)`` per layer (the raw round-off in units of the magnitude).

    PYTHONPATH=src OMP_NUM_THREADS=1 nice -n 10 python benchmarks/independence_margin.py \\
        fmnist --epochs 20 [--strict]

``--strict`` checks every batch (``self_check="strict"``) instead of the random schedule.
Nothing here is a test: it measures (see docs/dpsgd.md, "The independence check").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

import renyi.dpsgd.independence as ind

ROOT = Path(__file__).resolve().parents[1]
SEEN: dict[int, Any] = {}
RAW: list[float] = []


def _spy() -> None:
    run_check = ind.run_check
    compare = ind._compare

    def spy_check(engine: Any, *args: Any) -> None:
        SEEN[id(engine)] = engine
        run_check(engine, *args)

    def spy_compare(engine: Any, got: Any, want: Any, scales: Any, rhos: Any, unit: float) -> Any:
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            for name, lay in engine._layers.items():
                d = math.sqrt(
                    sum(
                        float((g[n].double().reshape(w[n].shape) - w[n].double()).pow(2).sum())
                        for n in lay.full
                    )
                )
                s = scales[name].magnitude[j]
                if s > 0 and unit > 2.0**-30:
                    RAW.append(d / (unit * s))
        return compare(engine, got, want, scales, rhos, unit)

    ind.run_check = spy_check  # type: ignore[assignment]
    ind._compare = spy_compare  # type: ignore[assignment]
    import renyi.dpsgd.clipping as clipping

    clipping.run_check = spy_check  # type: ignore[attr-defined]


def _strict() -> None:
    ind.CheckSchedule.due = lambda self: True  # type: ignore[method-assign]


def _example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_fmnist(epochs: int) -> None:
    from renyi.cli.main import main

    main(
        [
            "train",
            "--dataset",
            "fashion-mnist",
            "--epsilon",
            "3",
            "--delta",
            "1e-5",
            "--epochs",
            str(epochs),
            "--seed",
            "0",
            "--noise",
            "dpsgd",
            "--no-baseline",
            "--no-progress",
        ]
    )


def run_bf16(epochs: int) -> None:
    """The digits CNN of ``renyi train`` through PrivacyEngine under bfloat16 autocast."""
    from torch import nn
    from torch.utils.data import DataLoader

    from renyi.cli.train import build_model
    from renyi.dpsgd import PrivacyEngine
    from renyi.dpsgd.data import load_digits

    torch.manual_seed(0)
    train, _ = load_digits()
    model = build_model("digits", "cnn")
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(train, batch_size=64),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        epochs=epochs,
        seed=0,
    )
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()


def run_sensitivity() -> None:
    """How weak a mix is still refused: ``h + eps * h.sum(0)`` in a float32 MLP, 10 seeds."""
    from torch import nn

    from renyi.dpsgd.clipping import ClippedGradientEngine
    from renyi.dpsgd.independence import ExampleMixingError

    class WeakMix(nn.Module):
        def __init__(self, eps: float) -> None:
            super().__init__()
            self.a, self.b, self.eps = nn.Linear(4, 8), nn.Linear(8, 3), eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.tanh(self.a(x))
            return self.b(h + self.eps * h.sum(0, keepdim=True))

    for eps in (1e-3, 1e-4, 1e-5, 1e-6, 1e-7):
        caught = 0
        for seed in range(10):
            torch.manual_seed(seed)
            engine = ClippedGradientEngine(WeakMix(eps), nn.CrossEntropyLoss(), max_grad_norm=1)
            try:
                engine.clipped_grad_sum(torch.randn(6, 4), torch.randint(0, 3, (6,)))
            except ExampleMixingError:
                caught += 1
        print(json.dumps({"mix": eps, "refused_of_10": caught}))


def run_cost(rounds: int = 10) -> None:
    """What one check costs, in steps: the Fashion-MNIST CNN (batch 256, the engine's step)
    and the LSTM example (batch 64, a full PrivacyEngine step); check off vs every batch
    checked, interleaved, medians."""
    import statistics

    from torch import nn

    from renyi.cli.train import build_model
    from renyi.dpsgd import PrivacyEngine
    from renyi.dpsgd.clipping import ClippedGradientEngine

    torch.manual_seed(0)
    cnn = build_model("fashion-mnist", "cnn")
    x, y = torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,))
    engines = {
        c: ClippedGradientEngine(cnn, nn.CrossEntropyLoss(), max_grad_norm=1.0, self_check=c)
        for c in (False, "strict")
    }
    times: dict[Any, list[float]] = {c: [] for c in engines}
    for _ in range(rounds):
        for c, engine in engines.items():
            start = time.perf_counter()
            engine.clipped_grad_sum(x, y)
            times[c].append(time.perf_counter() - start)
    med = {c: statistics.median(v) for c, v in times.items()}
    print(
        json.dumps(
            {
                "model": "fmnist cnn, batch 256, engine step",
                "check_in_steps": (med["strict"] - med[False]) / med[False],
            }
        )
    )

    lstm = _example("lstm_digits")
    data = torch.utils.data.TensorDataset(torch.randn(640, 1, 8, 8), torch.randint(0, 10, (640,)))
    runs = {}
    for c in (False, "strict"):
        torch.manual_seed(0)
        model = lstm.RowLSTM()
        runs[c] = PrivacyEngine(accountant="rdp").make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
            data_loader=torch.utils.data.DataLoader(data, batch_size=64),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            seed=0,
            self_check=c,
        )[:2]
        runs[c][1].unlink_data_loaders()  # the timed step reuses one batch
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,))
    times = {c: [] for c in runs}
    for _ in range(rounds):
        for c, (model, opt) in runs.items():
            start = time.perf_counter()
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            times[c].append(time.perf_counter() - start)
    med = {c: statistics.median(v) for c, v in times.items()}
    print(
        json.dumps(
            {
                "model": "lstm example, batch 64, full PrivacyEngine step",
                "check_in_steps": (med["strict"] - med[False]) / med[False],
            }
        )
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    runs = ["fmnist", "lstm", "transformer", "bf16", "sensitivity", "cost"]
    parser.add_argument("run", choices=runs)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--strict", action="store_true")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if args.run in ("sensitivity", "cost"):
        torch.set_num_threads(1)
        run_sensitivity() if args.run == "sensitivity" else run_cost()
        return
    _spy()
    if args.strict:
        _strict()
    start = time.perf_counter()
    if args.run == "fmnist":
        run_fmnist(args.epochs)
    elif args.run == "lstm":
        _example("lstm_digits").main(["--epochs", str(args.epochs), "--seed", "0"])
    elif args.run == "transformer":
        _example("lora_transformer").run(["--epochs", str(args.epochs), "--seed", "0"])
    else:
        run_bf16(args.epochs)
    stats = [e.check_stats for e in SEEN.values()]
    scheds = [e.schedule for e in SEEN.values() if e.schedule.checks and e.schedule.steps]
    check_cost = [
        (s.check_time / s.checks) / (s.step_time / s.steps) for s in scheds if s.step_time > 0
    ]
    ratios = sorted(r for s in stats for r in s.ratios)
    raw = sorted(RAW)
    print(
        json.dumps(
            {
                "run": args.run,
                "epochs": args.epochs,
                "strict": args.strict,
                "seconds": round(time.perf_counter() - start, 1),
                "checks": sum(s.checks for s in stats),
                "rechecked_in_float64": sum(s.rechecks for s in stats),
                "max_ratio_first_stage": max(ratios, default=0.0),
                "median_ratio_first_stage": ratios[len(ratios) // 2] if ratios else 0.0,
                "max_ratio_after_float64": max((s.max_ratio_float64 for s in stats), default=0),
                "max_diff_over_uS": max(raw, default=0.0),
                "p99_diff_over_uS": raw[int(0.99 * (len(raw) - 1))] if raw else 0.0,
                "check_time_over_step_time": max(check_cost, default=0.0),
            }
        )
    )


if __name__ == "__main__":
    main()
